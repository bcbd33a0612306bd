/*
 * test_log_guarantees.c — the log's guarantees under real use (schema 6,
 * sql/006_log_guarantees.sql):
 *
 *   - outbox appends (pawl_append_in and pawl_api.append in the caller's transaction) after an
 *     earlier write, after a rolled-back savepoint and inside long transactions, racing library
 *     appends to the same streams, with a follower: per stream, final index order equals
 *     sequence order; indexes are contiguous from 1; every committed event is there once;
 *   - several appends in one transaction (two streams, the same stream twice) are one
 *     contiguous unit in order;
 *   - a backlog of ten times finalize_batch_max is finalized by one call, in run rows of at most
 *     finalize_batch_max appends;
 *   - databases whose default isolation is repeatable read or serializable, and whose default
 *     synchronous_commit is off: appends and finalization work and keep every property;
 *     pawl.finalize itself refuses a non-read-committed transaction with a clear error;
 *   - the upgrade from schema 5: old rows (no ticket) keep their order and come first;
 *   - a run never covers its caller's own transaction: "append, finalize, append, commit"
 *     leaves one contiguous unit finalized by a later run, and a database that met schema
 *     13's hole (two events at one index) is repaired by the upgrade (schema 14);
 *   - an upgrade behind a transaction holding the locks it needs waits in short tries: appends
 *     go on meanwhile, and it applies once the transaction ends;
 *   - a stream held by an open transaction does not slow appends to other streams (lock_timeout
 *     and retries off the pipeline); the held append goes through after the holder commits,
 *     or fails with PAWL_ETIMEDOUT naming the stream after append_lock_wait_ms.
 */
#include "pawl_test.h"
#include "schema.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NSTREAMS 4
#define RUN_MS 4000

static const char *dsn;

static struct pawl_event ev1(const char *stream, int64_t seq, const char *type, const char *payload)
{
    struct pawl_event e;
    memset(&e, 0, sizeof e);
    e.stream_id = stream;
    e.stream_seq = seq;
    e.type = type;
    e.payload = payload;
    e.payload_len = payload ? strlen(payload) : 0;
    return e;
}

static PGconn *raw(const char *d)
{
    PGconn *c = PQconnectdb(d);
    if (PQstatus(c) != CONNECTION_OK)
        fail_msg("connect: %s", PQerrorMessage(c));
    return c;
}

static int ok_cmd(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    PQclear(r);
    return ok;
}

/*
 * The whole log's properties, checked in SQL: indexes 1..N once each; per stream, sequence
 * numbers 1..n and final index order equal to sequence order; nothing committed is left
 * unfinalized (every event row is in the view). Returns the number of finalized events.
 */
static int64_t check_log(const char *d)
{
    int64_t n = pawl_test_query_i64(d, "SELECT count(*) FROM pawl_api.events");
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(DISTINCT global_index) FROM "
                                            "pawl_api.events"),
                     n);
    assert_int_equal(pawl_test_query_i64(d, "SELECT coalesce(max(global_index), 0) FROM "
                                            "pawl_api.events"),
                     n);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl.events"), n);
    assert_int_equal(pawl_test_query_i64(d, "SELECT pawl_api.last_index()"), n);
    assert_int_equal(
        pawl_test_query_i64(d, "SELECT count(*) FROM (SELECT global_index, lag(global_index)"
                               " OVER (PARTITION BY stream_id ORDER BY stream_seq) AS p,"
                               " stream_seq, row_number() OVER (PARTITION BY stream_id"
                               " ORDER BY stream_seq) AS rn FROM pawl_api.events) x"
                               " WHERE x.p >= x.global_index OR x.stream_seq <> x.rn"),
        0);
    return n;
}

/* Finalize until everything committed is final (the store's finalizer may be busy too). */
static void finalize_all(struct pawl_store *s, const char *d)
{
    for (int i = 0; i < 500; i++) {
        int64_t a = 0;
        assert_int_equal(pawl_finalize_now(s, &a, NULL, NULL), 0);
        if (a == 0 && pawl_test_query_i64(d, "SELECT count(*) FROM pawl.events WHERE k = 0 AND"
                                             " NOT EXISTS (SELECT 1 FROM pawl.runs r"
                                             " WHERE pawl.events.xid = ANY (r.xids))") == 0)
            return;
        usleep(10000);
    }
    fail_msg("appends stay unfinalized");
}

/* ---- the outbox race -------------------------------------------------------------------- */

static atomic_int stop;
static atomic_llong committed;
static atomic_int thread_bad; /* cmocka's asserts belong to the main thread */
static const char *race_dsn;
/* Library appenders append in bursts of this many ms with pauses as long (0: without pause). At
 * repeatable read and serializable an outbox transaction whose snapshot predates a library append
 * to its stream is rolled back; without pauses the faster the library appends, the closer to
 * none commit. The bursts keep the race (transactions that straddle them) and let some through. */
static int lib_burst_ms;

static const char *stream_name(unsigned r)
{
    static const char *names[NSTREAMS] = {"ox-0", "ox-1", "ox-2", "ox-3"};
    return names[r % NSTREAMS];
}

static void *lib_appender(void *arg)
{
    struct pawl_store *s = arg;
    unsigned seed = (unsigned)(uintptr_t)arg;
    while (!atomic_load(&stop)) {
        if (lib_burst_ms > 0 && (int64_t)(pawl_test_now_ms() / lib_burst_ms) % 2 == 1) {
            usleep(1000);
            continue;
        }
        struct pawl_event e = ev1(stream_name((unsigned)rand_r(&seed)), PAWL_SEQ_ANY, "lib", "l");
        struct pawl_append_result r;
        if (pawl_append(s, &e, 1, &r) == 0) {
            atomic_fetch_add(&committed, 1);
            if (r.first_seq < 1 || r.last_seq != r.first_seq)
                atomic_store(&thread_bad, 1);
        }
    }
    return NULL;
}

/* mode 0: an earlier write; 1: a rolled-back savepoint first; 2: a long transaction with two
 * appends; 3: the SQL face after an earlier write. */
static void *outbox(void *arg)
{
    int mode = (int)(intptr_t)arg;
    unsigned seed = 99u + (unsigned)mode;
    PGconn *c = PQconnectdb(race_dsn);
    if (PQstatus(c) != CONNECTION_OK) {
        atomic_store(&thread_bad, 1);
        PQfinish(c);
        return NULL;
    }
    while (!atomic_load(&stop)) {
        int64_t n = 0;
        int ok = ok_cmd(c, "BEGIN");
        struct pawl_event e = ev1(stream_name((unsigned)rand_r(&seed)), PAWL_SEQ_ANY, "ox", "o");
        struct pawl_event e2 = ev1(stream_name((unsigned)rand_r(&seed)), PAWL_SEQ_ANY, "ox", "p");
        if (mode == 0 || mode == 2 || mode == 3)
            ok = ok && ok_cmd(c, "INSERT INTO side VALUES (1)");
        if (mode == 1) {
            ok = ok && ok_cmd(c, "SAVEPOINT s");
            ok = ok && pawl_append_in(c, &e, 1, NULL) == 0;
            ok = ok && ok_cmd(c, "ROLLBACK TO SAVEPOINT s");
        }
        ok = ok && ok_cmd(c, mode == 2 ? "SELECT pg_sleep(0.05)" : "SELECT pg_sleep(0.005)");
        if (mode == 3) {
            char q[160];
            snprintf(q, sizeof q, "SELECT pawl_api.append('%s', 'sql', 'q')", e.stream_id);
            ok = ok && ok_cmd(c, q);
            n += 1;
        } else {
            ok = ok && pawl_append_in(c, &e, 1, NULL) == 0;
            n += 1;
        }
        if (mode == 2) {
            ok = ok && ok_cmd(c, "SELECT pg_sleep(0.03)");
            ok = ok && pawl_append_in(c, &e2, 1, NULL) == 0;
            n += 1;
        }
        ok = ok && ok_cmd(c, "SELECT pg_sleep(0.003)");
        if (ok && ok_cmd(c, "COMMIT"))
            atomic_fetch_add(&committed, n);
        else
            ok_cmd(c, "ROLLBACK");
    }
    PQfinish(c);
    return NULL;
}

struct follow_state {
    struct pawl_store *s;
    int64_t last_seq[NSTREAMS];
    int64_t read;
    int bad;
};

static void *follower(void *arg)
{
    struct follow_state *f = arg;
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    int64_t after = 0;
    for (;;) {
        int rc = pawl_follow(f->s, after, 1000, &b, 300);
        if (rc == PAWL_ETIMEDOUT) {
            if (atomic_load(&stop) == 2)
                break;
            continue;
        }
        if (rc != 0) {
            f->bad = 1;
            break;
        }
        for (size_t i = 0; i < b.count; i++) {
            const struct pawl_event *e = &b.events[i];
            int k = e->stream_id[3] - '0';
            if (e->index != after + 1 || k < 0 || k >= NSTREAMS ||
                e->stream_seq != f->last_seq[k] + 1)
                f->bad = 1;
            f->last_seq[k] = e->stream_seq;
            after = e->index;
            f->read++;
        }
    }
    pawl_read_batch_fini(&b);
    return NULL;
}

static void run_race(const char *d, int lib_threads, int burst_ms)
{
    race_dsn = d;
    lib_burst_ms = burst_ms;
    pawl_test_exec(d, "CREATE TABLE IF NOT EXISTS side (v int)");
    atomic_store(&thread_bad, 0);
    atomic_store(&stop, 0);
    atomic_store(&committed, 0);
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.finalize_batch_max = 3; /* several run rows per run */
    struct pawl_store *s = NULL, *fs = NULL;
    char err[512];
    assert_int_equal(pawl_store_new(&s, d, &o, err, sizeof err), 0);
    assert_int_equal(pawl_store_new(&fs, d, NULL, err, sizeof err), 0);
    struct follow_state f;
    memset(&f, 0, sizeof f);
    f.s = fs;
    pthread_t tl[4], to[4], tf;
    pthread_create(&tf, NULL, follower, &f);
    for (int i = 0; i < lib_threads; i++)
        pthread_create(&tl[i], NULL, lib_appender, s);
    for (int i = 0; i < 4; i++)
        pthread_create(&to[i], NULL, outbox, (void *)(intptr_t)i);
    usleep(RUN_MS * 1000);
    atomic_store(&stop, 1);
    for (int i = 0; i < lib_threads; i++)
        pthread_join(tl[i], NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(to[i], NULL);
    assert_int_equal(atomic_load(&thread_bad), 0);
    finalize_all(s, d);
    int64_t n = check_log(d);
    assert_int_equal(n, atomic_load(&committed));
    assert_true(n > 100);
    /* The follower reads everything in order. */
    for (int i = 0; i < 500 && f.read < n; i++)
        usleep(10000);
    atomic_store(&stop, 2);
    pthread_join(tf, NULL);
    assert_int_equal(f.bad, 0);
    assert_int_equal(f.read, n);
    /* Outbox transactions that wrote before their append really raced the library's. At
     * REPEATABLE READ and SERIALIZABLE most of them lose that race (serialization failures,
     * rolled back), the more so the faster the library appends: a few must still commit. */
    int64_t nox = pawl_test_query_i64(d, "SELECT count(*) FROM pawl_api.events WHERE type = 'ox'");
    int64_t nsql =
        pawl_test_query_i64(d, "SELECT count(*) FROM pawl_api.events WHERE type = 'sql'");
    print_message("%lld events: %lld from C outbox appends, %lld from pawl_api.append\n",
                  (long long)n, (long long)nox, (long long)nsql);
    assert_true(nox > 10);
    assert_true(nsql > 0);
    pawl_store_free(fs);
    pawl_store_free(s);
}

static void test_outbox_race(void **state)
{
    (void)state;
    char d[1024];
    pawl_test_db_make(pawl_test_dsn(), "t_log_guar_race", NULL, d, sizeof d);
    char err[512];
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    run_race(d, 3, 0);
    pawl_test_db_drop(pawl_test_dsn(), "t_log_guar_race");
}

/* ---- several appends in one transaction ---------------------------------------------------- */

static void test_one_transaction_unit(void **state)
{
    (void)state;
    char d[1024], err[512];
    pawl_test_db_make(pawl_test_dsn(), "t_log_guar_unit", NULL, d, sizeof d);
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.finalizer = 0;
    struct pawl_store *s = NULL;
    assert_int_equal(pawl_store_new(&s, d, &o, err, sizeof err), 0);
    struct pawl_event pre = ev1("u-a", PAWL_SEQ_ANY, "pre", "0");
    assert_int_equal(pawl_append(s, &pre, 1, NULL), 0);

    PGconn *c = raw(d);
    PGconn *other = raw(d);
    assert_true(ok_cmd(c, "BEGIN"));
    struct pawl_append_result r;
    struct pawl_event a[2] = {ev1("u-a", 2, "a2", "x"), ev1("u-a", 3, "a3", "x")};
    assert_int_equal(pawl_append_in(c, a, 2, &r), 0);
    assert_int_equal(r.first_seq, 2);
    assert_int_equal(r.last_seq, 3);
    /* Meanwhile another process appends and finalizes: it comes before the open unit. */
    struct pawl_event mid = ev1("u-c", PAWL_SEQ_ANY, "mid", "m");
    assert_int_equal(pawl_append(s, &mid, 1, NULL), 0);
    struct pawl_event b = ev1("u-b", PAWL_SEQ_ANY, "b1", "y");
    assert_int_equal(pawl_append_in(c, &b, 1, &r), 0);
    assert_int_equal(r.first_seq, 1);
    /* A conflict inside the transaction writes nothing and leaves it usable. */
    struct pawl_event bad = ev1("u-a", 2, "dup", "z");
    assert_int_equal(pawl_append_in(c, &bad, 1, &r), PAWL_ECONFLICT);
    assert_string_equal(r.sqlstate, "");
    struct pawl_event a4 = ev1("u-a", PAWL_SEQ_ANY, "a4", "x");
    assert_int_equal(pawl_append_in(c, &a4, 1, &r), 0);
    assert_int_equal(r.first_seq, 4);
    /* The SQL face in the same transaction; its conflicts name the stream (SQLSTATE PW001). */
    assert_true(ok_cmd(c, "SELECT pawl_api.append('u-b', 'b2', 'y', NULL, 2)"));
    assert_true(ok_cmd(c, "SAVEPOINT s"));
    PGresult *res = PQexec(c, "SELECT pawl_api.append('u-b', 'b9', 'y', NULL, 9)");
    assert_int_equal(PQresultStatus(res), PGRES_FATAL_ERROR);
    assert_string_equal(PQresultErrorField(res, PG_DIAG_SQLSTATE), "PW001");
    assert_non_null(strstr(PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY), "u-b"));
    PQclear(res);
    assert_true(ok_cmd(c, "ROLLBACK TO SAVEPOINT s"));
    /* The k = 0 row counts the unit; nobody else sees it before commit. */
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl.events WHERE "
                                            "stream_id IN ('u-b')"),
                     0);
    assert_int_equal(pawl_finalize_now(s, NULL, NULL, NULL), 0);
    assert_true(ok_cmd(c, "COMMIT"));
    int64_t apps = 0, evs = 0;
    assert_int_equal(pawl_finalize_now(s, &apps, &evs, NULL), 0);
    assert_int_equal(apps, 1);
    assert_int_equal(evs, 5);
    check_log(d);
    /* One contiguous unit, in the order appended, after what finalized before. */
    assert_int_equal(
        pawl_test_query_i64(d, "SELECT count(*) FROM pawl_api.events e JOIN (VALUES"
                               " (3, 'u-a', 2), (4, 'u-a', 3), (5, 'u-b', 1), (6, 'u-a', 4),"
                               " (7, 'u-b', 2)) v(i, s, q) ON e.global_index = v.i"
                               " AND e.stream_id = v.s AND e.stream_seq = v.q"),
        5);
    /* The same stream twice in one statement and across statements, then a rolled-back part. */
    assert_true(ok_cmd(c, "BEGIN"));
    assert_true(ok_cmd(c, "SELECT pawl_api.append_batch(ARRAY['u-d', 'u-d'], ARRAY['t', 't'],"
                          " ARRAY['1', '2']::bytea[])"));
    assert_true(ok_cmd(c, "SAVEPOINT s"));
    assert_true(ok_cmd(c, "SELECT pawl_api.append('u-d', 't', '3')"));
    assert_true(ok_cmd(c, "ROLLBACK TO SAVEPOINT s"));
    assert_true(ok_cmd(c, "SELECT pawl_api.append('u-d', 't', '3b')"));
    assert_true(ok_cmd(c, "COMMIT"));
    assert_int_equal(pawl_finalize_now(s, &apps, &evs, NULL), 0);
    assert_int_equal(evs, 3);
    check_log(d);
    assert_int_equal(
        pawl_test_query_i64(d, "SELECT count(*) FROM pawl_api.events WHERE stream_id = 'u-d'"
                               " AND global_index = 7 + stream_seq"
                               " AND payload = CASE stream_seq WHEN 3 THEN '3b' ELSE"
                               " stream_seq::text END::bytea"),
        3);
    PQfinish(other);
    PQfinish(c);
    pawl_store_free(s);
    pawl_test_db_drop(pawl_test_dsn(), "t_log_guar_unit");
}

/*
 * The outbox case in its simplest, deterministic form: a transaction writes (gets its xid), then
 * another appends to a stream and commits (a higher xid), then the first appends to the same
 * stream (building on it) and commits. Ordered by xid (schema 5) the later sequence number got
 * the lower index; ordered by ticket it cannot.
 */
static void test_outbox_deterministic(void **state)
{
    (void)state;
    char d[1024], err[512];
    pawl_test_db_make(pawl_test_dsn(), "t_log_guar_det", NULL, d, sizeof d);
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.finalizer = 0;
    struct pawl_store *s = NULL;
    assert_int_equal(pawl_store_new(&s, d, &o, err, sizeof err), 0);
    pawl_test_exec(d, "CREATE TABLE side (v int)");
    for (int sql_face = 0; sql_face < 2; sql_face++) {
        PGconn *c = raw(d);
        assert_true(ok_cmd(c, "BEGIN"));
        assert_true(ok_cmd(c, "INSERT INTO side VALUES (1)"));
        struct pawl_event first = ev1("det", PAWL_SEQ_ANY, "t", "first");
        assert_int_equal(pawl_append(s, &first, 1, NULL), 0);
        if (sql_face) {
            assert_true(ok_cmd(c, "SELECT pawl_api.append('det', 't', 'second')"));
        } else {
            struct pawl_event second = ev1("det", PAWL_SEQ_ANY, "t", "second");
            struct pawl_append_result r;
            assert_int_equal(pawl_append_in(c, &second, 1, &r), 0);
            assert_int_equal(r.first_seq, 2);
        }
        assert_true(ok_cmd(c, "COMMIT"));
        PQfinish(c);
        int64_t apps = 0;
        assert_int_equal(pawl_finalize_now(s, &apps, NULL, NULL), 0);
        assert_int_equal(apps, 2);
        check_log(d);
    }
    pawl_store_free(s);
    pawl_test_db_drop(pawl_test_dsn(), "t_log_guar_det");
}

/* ---- a backlog drains in one call ------------------------------------------------------------ */

static void test_backlog(void **state)
{
    (void)state;
    char d[1024], err[512];
    pawl_test_db_make(pawl_test_dsn(), "t_log_guar_backlog", NULL, d, sizeof d);
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.finalizer = 0;
    o.finalize_batch_max = 5;
    struct pawl_store *s = NULL;
    assert_int_equal(pawl_store_new(&s, d, &o, err, sizeof err), 0);
    for (int i = 0; i < 50; i++) {
        char sid[16];
        snprintf(sid, sizeof sid, "b-%d", i % 7);
        struct pawl_event e = ev1(sid, PAWL_SEQ_ANY, "t", "x");
        assert_int_equal(pawl_append(s, &e, 1, NULL), 0);
    }
    double t0 = pawl_test_now_ms();
    int64_t apps = 0, last = 0;
    assert_int_equal(pawl_finalize_now(s, &apps, NULL, &last), 0);
    double ms = pawl_test_now_ms() - t0;
    assert_int_equal(apps, 50);
    assert_int_equal(last, 50);
    assert_true(ms < 500);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl.runs WHERE last_index > 0"),
                     10);
    assert_int_equal(pawl_test_query_i64(d, "SELECT max(cardinality(xids)) FROM pawl.runs"), 5);
    check_log(d);
    pawl_store_free(s);
    pawl_test_db_drop(pawl_test_dsn(), "t_log_guar_backlog");
}

/* ---- database defaults: isolation and synchronous_commit ------------------------------------ */

/* A session of the database's defaults calling pawl.finalize is refused (25000), naming why. */
static void assert_finalize_refused(const char *d, const char *why)
{
    PGconn *c = raw(d);
    PGresult *r = PQexec(c, "SELECT * FROM pawl.finalize()");
    assert_int_equal(PQresultStatus(r), PGRES_FATAL_ERROR);
    assert_string_equal(PQresultErrorField(r, PG_DIAG_SQLSTATE), "25000");
    assert_non_null(strstr(PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY), why));
    PQclear(r);
    PQfinish(c);
}

static void isolation_case(const char *name, const char *level)
{
    char d[1024], err[512], q[256];
    pawl_test_db_make(pawl_test_dsn(), name, NULL, d, sizeof d);
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    snprintf(q, sizeof q, "ALTER DATABASE %s SET default_transaction_isolation = '%s'", name,
             level);
    pawl_test_exec(pawl_test_dsn(), q);
    snprintf(q, sizeof q, "ALTER DATABASE %s SET synchronous_commit = off", name);
    pawl_test_exec(pawl_test_dsn(), q);
    /* Finalizing in a transaction of that level is refused with a clear error. */
    assert_finalize_refused(d, "READ COMMITTED");
    run_race(d, 2, 20);
    pawl_test_db_drop(pawl_test_dsn(), name);
}

static void test_isolation_repeatable_read(void **state)
{
    (void)state;
    isolation_case("t_log_guar_rr", "repeatable read");
}

static void test_isolation_serializable(void **state)
{
    (void)state;
    isolation_case("t_log_guar_ser", "serializable");
}

/*
 * A database whose default is synchronous_commit = off: a manual pawl.finalize is refused (its
 * run could be read and then lost in a crash), and a store whose appends carry piggybacked runs
 * (append_finalizes) pins the setting on its append sessions, so its appends still commit and
 * their runs are durable.
 */
static void test_sync_off_piggyback(void **state)
{
    (void)state;
    char d[1024], err[512];
    pawl_test_db_make(pawl_test_dsn(), "t_log_guar_sync", NULL, d, sizeof d);
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    pawl_test_exec(pawl_test_dsn(), "ALTER DATABASE t_log_guar_sync SET synchronous_commit = off");
    assert_finalize_refused(d, "synchronous_commit");

    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.append_finalizes = 1;
    o.finalizer = 0; /* only the appends' own runs */
    struct pawl_store *s = NULL;
    assert_int_equal(pawl_store_new(&s, d, &o, err, sizeof err), 0);
    for (int i = 1; i <= 50; i++) {
        struct pawl_event e = ev1("sync", i, "t", "x");
        struct pawl_append_result res;
        assert_int_equal(pawl_append(s, &e, 1, &res), 0);
        assert_int_equal(res.first_seq, i);
    }
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    assert_true(st.finalize_piggybacked > 0);
    finalize_all(s, d);
    assert_int_equal(check_log(d), 50);
    pawl_store_free(s);
    pawl_test_db_drop(pawl_test_dsn(), "t_log_guar_sync");
}

/*
 * A database whose default statement_timeout (30 ms) is shorter than a lock wait pawl bounds
 * itself: an append that waits 150 ms for its stream (held by an open outbox append) and a
 * read that waits 150 ms for the log's lock (as behind `pawl retention`) both succeed. The
 * store's sessions pin no statement timeout: lock waits are bounded by append_lock_timeout_ms
 * and its retries, a read by its batch size, and a default meant for applications' queries
 * would fail them at random (a read that always takes longer, every time).
 */
static struct pawl_store *timeout_store;
static int timeout_rc;

static void *timeout_appender(void *arg)
{
    (void)arg;
    struct pawl_event e = ev1("stmt", PAWL_SEQ_ANY, "t", "waits");
    timeout_rc = pawl_append(timeout_store, &e, 1, NULL);
    return NULL;
}

static void *timeout_reader(void *arg)
{
    struct pawl_read_batch *b = arg;
    timeout_rc = pawl_read(timeout_store, 0, 100, b);
    return NULL;
}

static void test_statement_timeout_default(void **state)
{
    (void)state;
    char d[1024], err[512];
    pawl_test_db_make(pawl_test_dsn(), "t_log_guar_stmt", NULL, d, sizeof d);
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    pawl_test_exec(pawl_test_dsn(), "ALTER DATABASE t_log_guar_stmt SET statement_timeout = 30");
    if (pawl_store_new(&timeout_store, d, NULL, err, sizeof err) != 0)
        fail_msg("store: %s", err);
    PGconn *c = raw(d);
    assert_true(ok_cmd(c, "SET statement_timeout = 0"));
    assert_true(ok_cmd(c, "BEGIN"));
    assert_true(ok_cmd(c, "SELECT pawl_api.append('stmt', 't', 'holds')"));
    pthread_t th;
    pthread_create(&th, NULL, timeout_appender, NULL);
    usleep(150000);
    assert_true(ok_cmd(c, "COMMIT"));
    pthread_join(th, NULL);
    if (timeout_rc != 0)
        fail_msg("append: %s: %s", pawl_strerror(timeout_rc),
                 pawl_store_errmsg(timeout_store, err, sizeof err));
    assert_int_equal(pawl_store_wait(timeout_store, 1, 10000), 0);

    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    assert_true(ok_cmd(c, "BEGIN"));
    assert_true(ok_cmd(c, "LOCK TABLE pawl.runs IN ACCESS EXCLUSIVE MODE"));
    pthread_create(&th, NULL, timeout_reader, &b);
    usleep(150000);
    assert_true(ok_cmd(c, "COMMIT"));
    pthread_join(th, NULL);
    if (timeout_rc != 0)
        fail_msg("read: %s: %s", pawl_strerror(timeout_rc),
                 pawl_store_errmsg(timeout_store, err, sizeof err));
    assert_int_equal(b.count, 2);
    pawl_read_batch_fini(&b);
    PQfinish(c);
    pawl_store_free(timeout_store);
    pawl_test_exec(pawl_test_dsn(), "ALTER DATABASE t_log_guar_stmt RESET statement_timeout");
    assert_int_equal(check_log(d), 2);
    pawl_test_db_drop(pawl_test_dsn(), "t_log_guar_stmt");
}

/* ---- upgrade from schema 5 --------------------------------------------------------------------
 */

static void test_upgrade_from_5(void **state)
{
    (void)state;
    char d[1024], err[512];
    pawl_test_db_make(pawl_test_dsn(), "t_log_guar_up", NULL, d, sizeof d);
    assert_int_equal(pawl__schema_migrate_to(d, 5, err, sizeof err), 0);
    /* Appends written as version 5 wrote them; one finalized, two not yet. */
    const char *old = "INSERT INTO pawl.events (xid, stream_seq, k, n, stream_id, type, payload)"
                      " VALUES (pg_current_xact_id(), %d, 0, 1, 'up', 't', 'old')";
    char q[256];
    snprintf(q, sizeof q, old, 1);
    pawl_test_exec(d, q);
    assert_int_equal(pawl_test_query_i64(d, "SELECT appends FROM pawl.finalize()"), 1);
    snprintf(q, sizeof q, old, 2);
    pawl_test_exec(d, q);
    snprintf(q, sizeof q, old, 3);
    pawl_test_exec(d, q);
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    int dbv = 0;
    assert_int_equal(pawl_schema_version(d, &dbv, NULL, err, sizeof err), 0);
    assert_int_equal(dbv, pawl__schema_lib_version());
    assert_int_equal(
        pawl_test_query_i64(d, "SELECT count(*) FROM pawl.events WHERE ticket IS NULL"), 3);
    struct pawl_store *s = NULL;
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.finalizer = 0;
    assert_int_equal(pawl_store_new(&s, d, &o, err, sizeof err), 0);
    struct pawl_event e = ev1("up", 4, "t", "new");
    struct pawl_append_result r;
    assert_int_equal(pawl_append(s, &e, 1, &r), 0);
    assert_int_equal(r.first_seq, 4);
    int64_t apps = 0;
    assert_int_equal(pawl_finalize_now(s, &apps, NULL, NULL), 0);
    assert_int_equal(apps, 3);
    check_log(d);
    /* The schema now refuses what no append produces, even from the owner. */
    PGconn *c = raw(d);
    assert_false(ok_cmd(c, "INSERT INTO pawl.events (xid, stream_seq, k, n, stream_id, type,"
                           " payload) VALUES (pg_current_xact_id(), 9, 0, 0, 'up', 't', '')"));
    assert_false(ok_cmd(c, "INSERT INTO pawl.events (xid, stream_seq, k, n, stream_id, type,"
                           " payload) VALUES (pg_current_xact_id(), 9, 1, 1, 'up', 't', '')"));
    assert_false(ok_cmd(c,
                        "INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids,"
                        " bases, ns, open_xids) VALUES (10, 6, '0', '{1}', '{6}', '{5}', '{}')"));
    assert_false(ok_cmd(c, "INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids,"
                           " bases, ns, open_xids) VALUES (4, 4, '0', '{1}', '{4}', '{1}', '{}')"));
    assert_false(ok_cmd(c, "UPDATE pawl.runs SET last_index = last_index"));
    assert_false(ok_cmd(c, "DELETE FROM pawl.runs WHERE last_index > 0"));
    PQfinish(c);
    check_log(d);
    pawl_store_free(s);
    pawl_test_db_drop(pawl_test_dsn(), "t_log_guar_up");
}

/* ---- a run never covers its caller's own transaction (schema 14) ----------------------------
 */

/*
 * The pattern "append, finalize, append, commit" in one transaction, with another session's
 * append committed in between: the run inside the transaction must leave it alone (it used to
 * cover the first append with a count of 1 while the second continued the same append, so two
 * events got index 3). Returns nothing; leaves the three events committed.
 */
static void own_xid_pattern(const char *d)
{
    PGconn *a = raw(d), *b = raw(d);
    assert_true(ok_cmd(a, "BEGIN"));
    assert_true(ok_cmd(a, "SELECT pawl_api.append('ph', 'T', 'first')"));
    assert_true(ok_cmd(b, "SELECT pawl_api.append('other', 'T', 'o1')"));
    assert_true(ok_cmd(a, "SELECT * FROM pawl.finalize()"));
    assert_true(ok_cmd(a, "SELECT pawl_api.append('ph', 'T', 'second')"));
    assert_true(ok_cmd(a, "COMMIT"));
    PQfinish(a);
    PQfinish(b);
}

static void test_run_skips_own_xid(void **state)
{
    (void)state;
    char d[1024], err[512];
    pawl_test_db_make(pawl_test_dsn(), "t_log_guar_own", NULL, d, sizeof d);
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    pawl_test_exec(d, "SELECT pawl_api.append('ph', 'T', 'zero')");
    assert_int_equal(pawl_test_query_i64(d, "SELECT appends FROM pawl.finalize()"), 1);
    own_xid_pattern(d);
    /* The run inside the transaction finalized only "other"; the next finalizes ph's two. */
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl_api.events"), 2);
    assert_int_equal(pawl_test_query_i64(d, "SELECT appends FROM pawl.finalize()"), 1);
    assert_int_equal(check_log(d), 4);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(DISTINCT global_index) FROM "
                                            "pawl_api.read(0, 100)"),
                     4);
    /* ph's events in sequence order, one after the other (one unit). */
    assert_int_equal(pawl_test_query_i64(d, "SELECT max(global_index) - min(global_index) FROM "
                                            "pawl_api.events WHERE stream_id = 'ph' AND "
                                            "stream_seq > 1"),
                     1);
    /* Called twice in the transaction, and after its own append only: nothing of its own. */
    PGconn *a = raw(d);
    assert_true(ok_cmd(a, "BEGIN"));
    assert_true(ok_cmd(a, "SELECT pawl_api.append('ph', 'T', 'third')"));
    assert_true(ok_cmd(a, "SELECT * FROM pawl.finalize()"));
    assert_true(ok_cmd(a, "SELECT * FROM pawl.finalize()"));
    assert_true(ok_cmd(a, "SELECT pawl_api.append('ph', 'T', 'fourth')"));
    assert_true(ok_cmd(a, "COMMIT"));
    PQfinish(a);
    assert_int_equal(pawl_test_query_i64(d, "SELECT appends FROM pawl.finalize()"), 1);
    assert_int_equal(check_log(d), 6);
    pawl_test_db_drop(pawl_test_dsn(), "t_log_guar_own");
}

/*
 * A database that met the hole under schema 13 (the same pattern, on the old function: index
 * 3 twice) is repaired by the upgrade: no index twice, and the events the run missed are
 * finalized by the next run, once each.
 */
static void test_own_xid_repair(void **state)
{
    (void)state;
    char d[1024], err[512];
    pawl_test_db_make(pawl_test_dsn(), "t_log_guar_own13", NULL, d, sizeof d);
    assert_int_equal(pawl__schema_migrate_to(d, 13, err, sizeof err), 0);
    pawl_test_exec(d, "SELECT pawl_api.append('ph', 'T', 'zero')");
    assert_int_equal(pawl_test_query_i64(d, "SELECT appends FROM pawl.finalize()"), 1);
    own_xid_pattern(d);
    pawl_test_query_i64(d, "SELECT appends FROM pawl.finalize()");
    /* Schema 13's hole: one index, two events. */
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) - count(DISTINCT global_index) FROM "
                                            "pawl_api.events"),
                     1);
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) - count(DISTINCT global_index) FROM "
                                            "pawl_api.events"),
                     0);
    assert_int_equal(pawl_test_query_i64(d, "SELECT appends FROM pawl.finalize()"), 1);
    assert_int_equal(check_log(d), 4);
    pawl_test_db_drop(pawl_test_dsn(), "t_log_guar_own13");
}

/* ---- a migration behind an open transaction waits in short tries (schema 14) ----------------
 */

static const char *mig_dsn;
static int mig_rc;

static void *migrator(void *arg)
{
    (void)arg;
    char err[512];
    mig_rc = pawl_schema_migrate(mig_dsn, err, sizeof err);
    if (mig_rc != 0)
        print_message("migrate: %s\n", err);
    return NULL;
}

static void test_migration_lock_wait(void **state)
{
    (void)state;
    char d[1024], err[512];
    pawl_test_db_make(pawl_test_dsn(), "t_log_guar_mig", NULL, d, sizeof d);
    assert_int_equal(pawl__schema_migrate_to(d, 13, err, sizeof err), 0);
    /* A transaction that appended and finalized holds locks the upgrade needs. */
    PGconn *a = raw(d), *b = raw(d);
    assert_true(ok_cmd(a, "BEGIN"));
    assert_true(ok_cmd(a, "SELECT pawl_api.append('mig', 'T', 'x')"));
    assert_true(ok_cmd(a, "SELECT * FROM pawl.finalize()"));
    mig_dsn = d;
    pthread_t th;
    pthread_create(&th, NULL, migrator, NULL);
    usleep(1500 * 1000);
    /* Appends are not queued behind the waiting upgrade for more than one short try. */
    assert_true(ok_cmd(b, "SET lock_timeout = '1500ms'"));
    assert_true(ok_cmd(b, "SELECT pawl_api.append('other', 'T', 'y')"));
    int dbv = 0;
    assert_int_equal(pawl_schema_version(d, &dbv, NULL, err, sizeof err), 0);
    assert_int_equal(dbv, 13);
    assert_true(ok_cmd(a, "COMMIT"));
    pthread_join(th, NULL);
    assert_int_equal(mig_rc, 0);
    assert_int_equal(pawl_schema_version(d, &dbv, NULL, err, sizeof err), 0);
    assert_int_equal(dbv, pawl__schema_lib_version());
    PQfinish(a);
    PQfinish(b);
    pawl_test_query_i64(d, "SELECT appends FROM pawl.finalize()");
    assert_int_equal(check_log(d), 2);
    pawl_test_db_drop(pawl_test_dsn(), "t_log_guar_mig");
}

/* ---- a stream held by an open transaction does not stall the others ------------------------- */

struct rate_state {
    struct pawl_store *s;
    int id;
    atomic_llong *count;
};

static void *free_appender(void *arg)
{
    struct rate_state *r = arg;
    char sid[32];
    snprintf(sid, sizeof sid, "free-%d", r->id);
    while (!atomic_load(&stop)) {
        struct pawl_event e = ev1(sid, PAWL_SEQ_ANY, "t", "x");
        struct pawl_append_result res;
        if (pawl_append(r->s, &e, 1, &res) == 0) {
            atomic_fetch_add(r->count, 1);
        } else {
            print_message("free appender %d: %s: %s\n", r->id, pawl_strerror(res.rc), res.message);
            atomic_store(&thread_bad, 1);
        }
    }
    return NULL;
}

static int held_rc;
static struct pawl_append_result held_res;

static void *held_appender(void *arg)
{
    struct pawl_store *s = arg;
    struct pawl_event e = ev1("held", PAWL_SEQ_ANY, "t", "h");
    held_rc = pawl_append(s, &e, 1, &held_res);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int64_t measure(struct pawl_store *s, int ms)
{
    atomic_llong count = 0;
    struct rate_state rs[4];
    pthread_t t[4];
    atomic_store(&stop, 0);
    for (int i = 0; i < 4; i++) {
        rs[i] = (struct rate_state){.s = s, .id = i, .count = &count};
        pthread_create(&t[i], NULL, free_appender, &rs[i]);
    }
    usleep((useconds_t)ms * 1000);
    atomic_store(&stop, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    return atomic_load(&count);
}

static void test_held_stream(void **state)
{
    (void)state;
    char d[1024], err[512];
    pawl_test_db_make(pawl_test_dsn(), "t_log_guar_held", NULL, d, sizeof d);
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.append_lock_wait_ms = 3000;
    struct pawl_store *s = NULL;
    assert_int_equal(pawl_store_new(&s, d, &o, err, sizeof err), 0);
    atomic_store(&thread_bad, 0);
    struct pawl_event first = ev1("held", PAWL_SEQ_ANY, "t", "0");
    assert_int_equal(pawl_append(s, &first, 1, NULL), 0);
    /*
     * Rounds of 1 s alone, then 1 s while an outbox append to "held", not committed, holds the
     * stream's next number and a library append to "held" waits for it; then the holder
     * commits and the waiting append goes through. Alternating the windows keeps the machine's
     * own drift out of the comparison, and the median of the rounds' ratios keeps out a round
     * that something else on a shared machine slowed in one window only (make test runs two
     * tests at once: CI's ASan stage once saw 0.78 over the sum of three rounds, against
     * 0.96-1.03 in every run here alone). Both must hold: the median ratio at least 0.5 and the
     * sum over the rounds at least 0.8. A stall (the free streams waiting behind the held one)
     * fails both; CI's ASan stage once had a median of 0.78 with rounds from 0.47 to 6.46 and
     * a sum of 1.14, which is noise.
     */
    enum { ROUNDS = 5 };
    PGconn *c = raw(d);
    int64_t alone = 0, during = 0;
    double ratio[ROUNDS];
    for (int round = 1; round <= ROUNDS; round++) {
        int64_t a = measure(s, 1000);
        alone += a;
        assert_true(ok_cmd(c, "BEGIN"));
        assert_true(ok_cmd(c, "SELECT pawl_api.append('held', 't', 'outbox')"));
        pthread_t th;
        pthread_create(&th, NULL, held_appender, s);
        usleep(200000);
        int64_t b = measure(s, 1000);
        during += b;
        ratio[round - 1] = a > 0 ? (double)b / (double)a : 0;
        assert_int_equal(atomic_load(&thread_bad), 0);
        assert_true(ok_cmd(c, "COMMIT"));
        pthread_join(th, NULL);
        assert_int_equal(held_rc, 0);
        /* "held": 1 first, then per round the outbox append and the one that waited. */
        assert_int_equal(held_res.first_seq, 1 + 2 * round);
    }
    qsort(ratio, ROUNDS, sizeof ratio[0], cmp_double);
    print_message("free-stream appends in %d x 1 s: %lld alone, %lld with a held stream; "
                  "per-round ratios %.2f..%.2f, median %.2f\n",
                  ROUNDS, (long long)alone, (long long)during, ratio[0], ratio[ROUNDS - 1],
                  ratio[ROUNDS / 2]);
    assert_true(ratio[ROUNDS / 2] >= 0.50);
    assert_true(alone > 0 && (double)during / (double)alone >= 0.80);
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    assert_true(st.append_lock_timeouts > 0);

    /* Held past append_lock_wait_ms: a clear error naming the stream. */
    assert_true(ok_cmd(c, "BEGIN"));
    assert_true(ok_cmd(c, "SELECT pawl_api.append('held', 't', 'outbox2')"));
    struct pawl_event e = ev1("held", PAWL_SEQ_ANY, "t", "late");
    struct pawl_append_result r;
    assert_int_equal(pawl_append(s, &e, 1, &r), PAWL_ETIMEDOUT);
    assert_non_null(strstr(r.message, "\"held\""));
    assert_true(ok_cmd(c, "ROLLBACK"));
    PQfinish(c);
    finalize_all(s, d);
    check_log(d);
    pawl_store_free(s);
    pawl_test_db_drop(pawl_test_dsn(), "t_log_guar_held");
}

int main(void)
{
    dsn = pawl_test_dsn();
    (void)dsn;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_outbox_deterministic),
        cmocka_unit_test(test_one_transaction_unit),
        cmocka_unit_test(test_backlog),
        cmocka_unit_test(test_upgrade_from_5),
        cmocka_unit_test(test_run_skips_own_xid),
        cmocka_unit_test(test_own_xid_repair),
        cmocka_unit_test(test_migration_lock_wait),
        cmocka_unit_test(test_held_stream),
        cmocka_unit_test(test_outbox_race),
        cmocka_unit_test(test_isolation_repeatable_read),
        cmocka_unit_test(test_isolation_serializable),
        cmocka_unit_test(test_sync_off_piggyback),
        cmocka_unit_test(test_statement_timeout_default),
    };
    if (getenv("PAWL_TEST_FILTER"))
        cmocka_set_test_filter(getenv("PAWL_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
