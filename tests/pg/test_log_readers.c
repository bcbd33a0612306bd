/*
 * test_log_readers.c — readers under faults and hostile input:
 *
 *   - a follower (pawl_follow) keeps reading while appends go on and every connection of the
 *     database's pawl stores (reads, listener, finalizer, appends) is terminated again and
 *     again: it sees every event once, in index order, contiguous, its store counts the read
 *     retries and logs the outage (once per outage, not once per retry);
 *   - a login with no grants floods channel pawl_log with huge and garbage payloads: the known
 *     highest index does not move, the follower's reads stay at their idle rate (calls of
 *     pawl_api.read counted by pg_stat_user_functions), the listener's last_index queries stay
 *     below the notifications (coalesced), and real events are still delivered afterwards;
 *   - a flood of notifications, each in its own transaction, from a login with no grants: the
 *     listener asks the log at most once per millisecond (pawl_log) and the finalizer runs at
 *     most once per 2 ms for them (pawl_pending);
 *   - a store's own finalizer runs wake its follower without a query on its listener (the
 *     sender's process id tells them from another finalizer's, whose runs are asked about);
 *   - the known highest index ahead of the log (a run row that promises events the log does
 *     not have, as after a failover that lost the log's tail): a follower backs off instead of
 *     spinning, logs the gap once, counts it, and once the log's word is back to the truth, it
 *     waits for and delivers the next real event.
 */
#include "pawl_test.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *dsn;

/* ---- log capture ---------------------------------------------------------------------------- */

static atomic_int lost_lines, gap_lines, resumed_lines;

static void sink(void *ud, enum pawl_log_level level, const char *module, const char *msg)
{
    (void)ud;
    fprintf(stderr, "log %d %s: %s\n", (int)level, module, msg);
    if (strstr(msg, "read: lost the connection"))
        atomic_fetch_add(&lost_lines, 1);
    if (strstr(msg, "but the log returned nothing after"))
        atomic_fetch_add(&gap_lines, 1);
    if (strstr(msg, "read: reading again"))
        atomic_fetch_add(&resumed_lines, 1);
}

static struct pawl_store *open_store(int finalizer)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.finalizer = finalizer;
    o.finalizer_safety_interval_ms = 100;
    o.reconnect_min_ms = 10;
    o.reconnect_max_ms = 200;
    struct pawl_store *s = NULL;
    char err[512];
    if (pawl_store_new(&s, dsn, &o, err, sizeof err) != 0)
        fail_msg("store: %s", err);
    return s;
}

static int64_t read_calls(void)
{
    /* A fresh session: its stats snapshot is taken now, after the readers' last flush. */
    return pawl_test_query_i64(dsn, "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
                                    "WHERE schemaname = 'pawl_api' AND funcname = 'read'");
}

/* ---- a follower thread ---------------------------------------------------------------------- */

struct follower {
    struct pawl_store *s;
    pthread_t th;
    atomic_int stop;
    atomic_llong after;  /* the last index delivered */
    atomic_llong events; /* events delivered */
    atomic_int bad;      /* an event out of order, a gap or a repeat */
    atomic_int error;    /* a return code other than 0 / PAWL_ETIMEDOUT */
    int timeout_ms;      /* of each pawl_follow */
};

static void *follow_main(void *arg)
{
    struct follower *f = arg;
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    int64_t after = atomic_load(&f->after);
    while (!atomic_load(&f->stop)) {
        int rc = pawl_follow(f->s, after, 50, &b, f->timeout_ms);
        if (rc == PAWL_ETIMEDOUT)
            continue;
        if (rc != 0) {
            atomic_store(&f->error, rc);
            break;
        }
        for (size_t i = 0; i < b.count; i++) {
            if (b.events[i].index != after + 1)
                atomic_store(&f->bad, 1);
            after = b.events[i].index;
        }
        atomic_fetch_add(&f->events, (long long)b.count);
        atomic_store(&f->after, after);
    }
    pawl_read_batch_fini(&b);
    return NULL;
}

static void follower_start(struct follower *f, struct pawl_store *s, int64_t after, int timeout_ms)
{
    memset(f, 0, sizeof *f);
    f->s = s;
    f->timeout_ms = timeout_ms;
    atomic_store(&f->after, after);
    assert_int_equal(pthread_create(&f->th, NULL, follow_main, f), 0);
}

static void follower_stop(struct follower *f)
{
    atomic_store(&f->stop, 1);
    pthread_join(f->th, NULL);
}

/* Wait (up to ms) until the follower has delivered up to index `upto`. */
static int follower_reaches(struct follower *f, int64_t upto, int ms)
{
    for (int i = 0; i < ms / 10; i++) {
        if (atomic_load(&f->after) >= upto)
            return 1;
        usleep(10000);
    }
    return atomic_load(&f->after) >= upto;
}

/* ---- an appender thread: appends go on whatever happens to its connections ------------------- */

struct appender {
    struct pawl_store *s;
    pthread_t th;
    atomic_int stop;
    atomic_int ok;
};

static void *append_main(void *arg)
{
    struct appender *a = arg;
    int i = 0;
    while (!atomic_load(&a->stop)) {
        char sid[32], payload[32];
        snprintf(sid, sizeof sid, "r-%d", i % 7);
        int n = snprintf(payload, sizeof payload, "%d", i++);
        struct pawl_event e[3];
        for (int k = 0; k < 3; k++)
            e[k] = (struct pawl_event){
                .stream_id = sid, .type = "t", .payload = payload, .payload_len = (size_t)n};
        if (pawl_append(a->s, e, 3, NULL) == 0)
            atomic_fetch_add(&a->ok, 1);
        else
            usleep(5000); /* refused while the connections come back: go on */
        usleep(2000);
    }
    return NULL;
}

/* ---- tests ------------------------------------------------------------------------------------
 */

static void test_follower_survives_lost_connections(void **state)
{
    (void)state;
    struct pawl_store *w = open_store(1);
    struct pawl_store *r = open_store(0); /* the reader: the writer's finalizer finalizes */
    struct follower f;
    follower_start(&f, r, pawl_test_query_i64(dsn, "SELECT pawl_api.last_index()"), 100);
    struct appender a = {.s = w};
    assert_int_equal(pthread_create(&a.th, NULL, append_main, &a), 0);

    /* Terminate every pawl connection of this database (not only idle ones: reads in flight
     * too) until the reader has had to retry a few reads, for at most 40 s. */
    struct pawl_store_stats st;
    double t0 = pawl_test_now_ms();
    int kills = 0;
    do {
        usleep(20000 + (unsigned)(kills % 5) * 15000);
        pawl_test_exec(dsn, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE application_name LIKE 'pawl%' AND pid <> pg_backend_pid() "
                            "AND datname = current_database()");
        kills++;
        pawl_store_stats(r, &st, 0);
    } while ((st.read_retries < 3 || st.read_reconnects < 2) && pawl_test_now_ms() - t0 < 40000 &&
             atomic_load(&f.error) == 0);
    usleep(300000);
    atomic_store(&a.stop, 1);
    pthread_join(a.th, NULL);
    /* Everything final is delivered, exactly once and in order. */
    assert_int_equal(pawl_finalize_now(w, NULL, NULL, NULL), 0);
    int64_t appended = pawl_test_query_i64(dsn, "SELECT pawl_api.last_index()");
    int reached = follower_reaches(&f, appended, 20000);
    follower_stop(&f);
    print_message("kills %d, appends %d, last index %lld, read retries %lld over %lld outages\n",
                  kills, atomic_load(&a.ok), (long long)appended, (long long)st.read_retries,
                  (long long)st.read_reconnects);
    assert_int_equal(atomic_load(&f.error), 0);
    assert_int_equal(atomic_load(&f.bad), 0);
    assert_true(reached);
    assert_int_equal(atomic_load(&f.after), appended);
    assert_true(atomic_load(&a.ok) > 0);
    pawl_store_stats(r, &st, 0);
    assert_true(st.read_retries >= 3);
    assert_true(st.read_reconnects >= 2);
    assert_int_equal(st.read_gaps, 0); /* no false alarm: a read sees what was known before it */
    /* One line per outage (the start), never one per retry. */
    assert_true(atomic_load(&lost_lines) >= 1);
    assert_true(atomic_load(&lost_lines) <= st.read_reconnects);
    assert_true(atomic_load(&resumed_lines) <= st.read_reconnects);
    pawl_store_free(r);
    pawl_store_free(w);
}

static void hostile_exec(const char *hdsn, const char *sql)
{
    PGconn *c = PQconnectdb(hdsn);
    if (PQstatus(c) != CONNECTION_OK)
        fail_msg("hostile login: %s", PQerrorMessage(c));
    PGresult *res = PQexec(c, sql);
    if (PQresultStatus(res) != PGRES_COMMAND_OK)
        fail_msg("%s: %s", sql, PQerrorMessage(c));
    PQclear(res);
    PQfinish(c);
}

static void test_hostile_notify_is_only_a_wakeup(void **state)
{
    (void)state;
    char role[64], sql[256], hdsn[1024];
    snprintf(role, sizeof role, "pawl_hostile_%ld", (long)getpid());
    snprintf(sql, sizeof sql, "DROP ROLE IF EXISTS %s", role);
    pawl_test_exec(dsn, sql);
    /* No grants at all; a password, since the private cluster authenticates every role but its
     * owner by SCRAM. */
    snprintf(sql, sizeof sql, "CREATE ROLE %s LOGIN PASSWORD 'hostile-secret'", role);
    pawl_test_exec(dsn, sql);
    snprintf(hdsn, sizeof hdsn, "%s user=%s password=hostile-secret", dsn, role);

    struct pawl_store *s = open_store(1);
    int64_t real = pawl_test_query_i64(dsn, "SELECT pawl_api.last_index()");
    struct follower f;
    follower_start(&f, s, real, 2000);
    usleep(1500000); /* idle, and the follower's read counts flushed */
    int64_t calls0 = read_calls();
    struct pawl_store_stats st0;
    pawl_store_stats(s, &st0, 0);

    /* 40 transactions of 50 notifications each: huge numbers, negative, garbage, empty. */
    static const char *const payloads[] = {
        "9000000000000000000",    "9223372036854775807", "-5", "garbage", "", "12abc",
        "99999999999999999999999"};
    char big[8192];
    int sent = 0;
    for (int t = 0; t < 40; t++) {
        size_t o = (size_t)snprintf(big, sizeof big, "BEGIN;");
        for (int k = 0; k < 50; k++) {
            o += (size_t)snprintf(big + o, sizeof big - o, "NOTIFY pawl_log, '%s%s%d';",
                                  payloads[k % 7], k % 7 < 2 ? "" : "-", t * 50 + k);
            sent++;
        }
        snprintf(big + o, sizeof big - o, "COMMIT;");
        hostile_exec(hdsn, big);
    }
    usleep(1500000);
    int64_t calls1 = read_calls();
    struct pawl_store_stats st1;
    pawl_store_stats(s, &st1, 0);
    print_message("notifications %lld, index queries %lld, pawl_api.read calls %lld\n",
                  (long long)(st1.notifications - st0.notifications),
                  (long long)(st1.index_queries - st0.index_queries), (long long)(calls1 - calls0));
    assert_int_equal(pawl_store_last_index(s), real);
    assert_true(st1.notifications - st0.notifications >= 40);
    /* Coalesced: at most two queries per delivery (one in flight, one after it). */
    assert_true(st1.index_queries - st0.index_queries <=
                2 * (st1.notifications - st0.notifications));
    assert_true(st1.index_queries - st0.index_queries <= 2 * 40 + 4);
    /* The follower stayed idle: a handful of reads at most (its 2 s timeouts' last looks and
     * the reads that follow them: about one a second; a spinning reader makes thousands). */
    assert_true(calls1 - calls0 < 30);
    assert_int_equal(atomic_load(&f.events), 0);

    /* Real events are still delivered. */
    struct pawl_event e = {
        .stream_id = "after-hostile", .type = "t", .payload = "x", .payload_len = 1};
    assert_int_equal(pawl_append(s, &e, 1, NULL), 0);
    assert_true(follower_reaches(&f, real + 1, 10000));
    follower_stop(&f);
    assert_int_equal(atomic_load(&f.bad), 0);
    assert_int_equal(atomic_load(&f.error), 0);
    pawl_store_free(s);
    snprintf(sql, sizeof sql, "DROP ROLE %s", role);
    pawl_test_exec(dsn, sql);
}

/*
 * A flood of notifications, each in its own transaction (so none coalesce in the server), from
 * a login with no grants: the listener asks the log at most once per millisecond (before: about
 * once per notification), and real events still arrive.
 */
static void test_notify_flood_rate_limited(void **state)
{
    (void)state;
    char role[64], sql[256], hdsn[1200];
    snprintf(role, sizeof role, "pawl_flood_%ld", (long)getpid());
    snprintf(sql, sizeof sql, "DROP ROLE IF EXISTS %s", role);
    pawl_test_exec(dsn, sql);
    snprintf(sql, sizeof sql, "CREATE ROLE %s LOGIN PASSWORD 'flood-secret'", role);
    pawl_test_exec(dsn, sql);
    snprintf(hdsn, sizeof hdsn, "%s user=%s password=flood-secret", dsn, role);

    struct pawl_store *s = open_store(1);
    int64_t real = pawl_test_query_i64(dsn, "SELECT pawl_api.last_index()");
    usleep(300000);
    struct pawl_store_stats st0, st1;
    pawl_store_stats(s, &st0, 0);
    PGconn *h = PQconnectdb(hdsn);
    assert_int_equal(PQstatus(h), CONNECTION_OK);
    int64_t t0 = pawl_now_ns();
    enum { FLOOD = 10000 };
    for (int i = 0; i < FLOOD; i++)
        PQclear(PQexec(h, "NOTIFY pawl_log"));
    int64_t ms = (pawl_now_ns() - t0) / 1000000;
    PQfinish(h);
    usleep(300000);
    pawl_store_stats(s, &st1, 0);
    long long notes = (long long)(st1.notifications - st0.notifications);
    long long queries = (long long)(st1.index_queries - st0.index_queries);
    print_message("flood: %d notifications in %lld ms, %lld received, %lld index queries\n", FLOOD,
                  (long long)ms, notes, queries);
    assert_true(notes >= FLOOD / 2);
    /* At most one per millisecond of the flood (and the 300 ms after it), with a little slack. */
    assert_true(queries <= ms + 300 + 20);
    assert_true(queries < notes / 2);
    assert_int_equal(pawl_store_last_index(s), real);

    /* pawl_pending asks every finalizer for a run: at most one per 2 ms from such wake-ups. */
    h = PQconnectdb(hdsn);
    assert_int_equal(PQstatus(h), CONNECTION_OK);
    pawl_store_stats(s, &st0, 0);
    t0 = pawl_now_ns();
    for (int i = 0; i < FLOOD; i++)
        PQclear(PQexec(h, "NOTIFY pawl_pending"));
    ms = (pawl_now_ns() - t0) / 1000000;
    PQfinish(h);
    usleep(300000);
    pawl_store_stats(s, &st1, 0);
    long long runs = (long long)(st1.finalize_runs - st0.finalize_runs + st1.finalize_idle_runs -
                                 st0.finalize_idle_runs);
    print_message("pawl_pending flood: %d notifications in %lld ms, %lld finalizer runs\n", FLOOD,
                  (long long)ms, runs);
    assert_true(runs >= 10); /* it was asked, and ran */
    assert_true(runs <= (ms + 300) / 2 + 20);

    /* Real events are still delivered, promptly. */
    struct pawl_event e = {
        .stream_id = "after-flood", .type = "t", .payload = "x", .payload_len = 1};
    assert_int_equal(pawl_append(s, &e, 1, NULL), 0);
    int64_t w0 = pawl_now_ns();
    while (pawl_store_last_index(s) <= real && pawl_now_ns() - w0 < 5000000000LL)
        usleep(1000);
    assert_true(pawl_store_last_index(s) > real);
    pawl_store_free(s);
    snprintf(sql, sizeof sql, "DROP ROLE %s", role);
    pawl_test_exec(dsn, sql);
}

/*
 * A store's own finalizer runs cost its listener no query (the run's result gave the index),
 * and its follower still wakes for each of them; runs of another store's finalizer (another
 * process, for the log) are asked about and delivered too.
 */
static void test_own_runs_need_no_query(void **state)
{
    (void)state;
    struct pawl_store *a = open_store(1);
    int64_t start = pawl_test_query_i64(dsn, "SELECT pawl_api.last_index()");
    struct follower f;
    follower_start(&f, a, start, 2000);
    usleep(300000);
    struct pawl_store_stats st0, st1, st2;
    pawl_store_stats(a, &st0, 0);
    int64_t upto = start;
    for (int i = 0; i < 30; i++) {
        struct pawl_event e = {
            .stream_id = "own-runs", .type = "t", .payload = "x", .payload_len = 1};
        struct pawl_append_result r;
        assert_int_equal(pawl_append(a, &e, 1, &r), 0);
        upto++;
        /* Each event reaches the follower promptly, woken by the run that finalized it. */
        assert_true(follower_reaches(&f, upto, 5000));
    }
    usleep(200000);
    pawl_store_stats(a, &st1, 0);
    long long notes = (long long)(st1.notifications - st0.notifications);
    long long own = (long long)(st1.own_notifications - st0.own_notifications);
    long long queries = (long long)(st1.index_queries - st0.index_queries);
    print_message("own appends: notifications %lld, of them own %lld, index queries %lld\n", notes,
                  own, queries);
    assert_true(own >= 25);    /* about one run per append, each one notification */
    assert_true(queries <= 3); /* none needed; allow a reconnect's look or two */

    /* Another finalizer's runs: asked about, delivered. (Opened only now: its safety runs could
     * have finalized some of a's appends above. a's safety runs may likewise finalize a few of
     * b's below; those are a's own, rightly without a query.) */
    struct pawl_store *b = open_store(1);
    for (int i = 0; i < 10; i++) {
        struct pawl_event e = {
            .stream_id = "other-runs", .type = "t", .payload = "y", .payload_len = 1};
        assert_int_equal(pawl_append(b, &e, 1, NULL), 0);
        upto++;
        assert_true(follower_reaches(&f, upto, 5000));
    }
    pawl_store_stats(a, &st2, 0);
    print_message("another store's appends: notifications %lld, own %lld, index queries %lld\n",
                  (long long)(st2.notifications - st1.notifications),
                  (long long)(st2.own_notifications - st1.own_notifications),
                  (long long)(st2.index_queries - st1.index_queries));
    long long foreign = (long long)((st2.notifications - st1.notifications) -
                                    (st2.own_notifications - st1.own_notifications));
    assert_true(foreign >= 5);
    assert_true(st2.index_queries - st1.index_queries >= 3);
    follower_stop(&f);
    assert_int_equal(atomic_load(&f.bad), 0);
    assert_int_equal(atomic_load(&f.error), 0);
    assert_int_equal(atomic_load(&f.events), upto - start);
    pawl_store_free(b);
    pawl_store_free(a);
}

static void test_gap_backs_off(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1);
    int64_t real = pawl_test_query_i64(dsn, "SELECT pawl_api.last_index()");
    /* A run row promising 1000 events that the log does not have: the log's own last_index()
     * and this store's finalizer now report real + 1000. The schema refuses such a row
     * (runs_guard), so the superuser forges it with triggers off. */
    char sql[640];
    snprintf(sql, sizeof sql,
             "SET session_replication_role = replica; INSERT INTO pawl.runs (last_index, "
             "first_index, scan_xmax, xids, bases, ns, "
             "open_xids) SELECT %lld, %lld, scan_xmax, '{}', '{}', '{}', '{}' FROM pawl.runs "
             "ORDER BY last_index DESC LIMIT 1",
             (long long)real + 1000, (long long)real + 1);
    pawl_test_exec(dsn, sql);
    assert_int_equal(pawl_store_wait(s, real + 999, 5000), 0);
    atomic_store(&gap_lines, 0);
    usleep(1200000);
    int64_t calls0 = read_calls();
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    double t0 = pawl_test_now_ms();
    int rc = pawl_follow(s, real, 100, &b, 2500);
    double took = pawl_test_now_ms() - t0;
    usleep(1200000);
    int64_t calls = read_calls() - calls0;
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    print_message("follow over the gap: rc %d after %.0f ms, %lld reads, gaps %lld\n", rc, took,
                  (long long)calls, (long long)st.read_gaps);
    assert_int_equal(rc, PAWL_ETIMEDOUT);
    assert_int_equal(b.count, 0);
    /* 1, 2, 4 ... ms up to 1 s: a dozen reads in 2.5 s; a spinning reader makes thousands. */
    assert_true(calls <= 30);
    assert_int_equal(st.read_gaps, 1);
    assert_int_equal(atomic_load(&gap_lines), 1);

    /* The log's word back to the truth: the known index comes down to it, the follower waits
     * (no reads) and delivers the next real event. */
    snprintf(
        sql, sizeof sql,
        "SET session_replication_role = replica; DELETE FROM pawl.runs WHERE last_index = %lld",
        (long long)real + 1000);
    pawl_test_exec(dsn, sql);
    rc = pawl_follow(s, real, 100, &b, 2500);
    assert_int_equal(rc, PAWL_ETIMEDOUT);
    assert_int_equal(pawl_store_last_index(s), real);
    struct pawl_event e = {.stream_id = "after-gap", .type = "t", .payload = "x", .payload_len = 1};
    assert_int_equal(pawl_append(s, &e, 1, NULL), 0);
    rc = pawl_follow(s, real, 100, &b, 10000);
    assert_int_equal(rc, 0);
    assert_int_equal(b.count, 1);
    assert_int_equal(b.events[0].index, real + 1);
    assert_string_equal(b.events[0].stream_id, "after-gap");
    pawl_read_batch_fini(&b);
    pawl_store_free(s);
}

int main(void)
{
    dsn = pawl_test_db_create("log_readers");
    char err[512];
    if (pawl_schema_migrate(dsn, err, sizeof err) != 0) {
        fprintf(stderr, "migrate: %s\n", err);
        return 1;
    }
    /* Count function calls (pawl_api.read) in the sessions opened from now on. */
    pawl_test_exec(dsn, "DO $$BEGIN EXECUTE format('ALTER DATABASE %I SET track_functions = "
                        "''all''', current_database()); END$$");
    pawl_log_set_sink(sink, NULL);
    pawl_log_set_level(PAWL_LOG_INFO); /* "read: reading again" is info; the default is warn */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_follower_survives_lost_connections),
        cmocka_unit_test(test_hostile_notify_is_only_a_wakeup),
        cmocka_unit_test(test_notify_flood_rate_limited),
        cmocka_unit_test(test_gap_backs_off),
        cmocka_unit_test(test_own_runs_need_no_query),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
