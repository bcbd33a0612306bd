/*
 * test_log_faults.c — faults around appends:
 *
 *   - an appender process is SIGKILLed after its commits were acknowledged and before any
 *     finalization: another process's safety run finalizes them, none is lost;
 *   - the server drops the store's connections while appends are in flight: each append
 *     reports success or PAWL_ECONN (did not commit), never PAWL_EINDOUBT (the server stays
 *     reachable, so every cut-off commit's fate can be learned), at least one is cut off, and
 *     the log holds exactly the committed ones (every success present, no PAWL_ECONN one
 *     present); the store reconnects and appends again;
 *   - the same with event ids and append_retry_ms: every cut-off append is appended again (its
 *     delayed retry, a timer on the store's timers, fires once the store reconnected), so every
 *     append succeeds and the log holds each exactly once; one of them waits for a stream an
 *     outbox transaction holds, so that the kill surely finds an append in flight;
 *   - the store's own finalizer session is terminated again and again while appends flow (in a
 *     run, between runs): the finalizer reports the failures, reconnects, and within a safety
 *     interval of the last kill every committed append is final; none is lost or doubled;
 *   - the finalizer cannot reach the server for 3 s (the database refuses connections): one
 *     warning when it starts failing, not one per retry, and one line when it works again.
 */
#include "pawl_test.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *dsn;

static struct pawl_store *open_store(int finalizer, int safety_ms)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.finalizer = finalizer;
    o.append_finalizes = 0; /* the victim must not finalize anything itself */
    o.finalizer_safety_interval_ms = safety_ms;
    o.reconnect_min_ms = 20;
    o.reconnect_max_ms = 200;
    struct pawl_store *s = NULL;
    char err[512];
    int rc = pawl_store_new(&s, dsn, &o, err, sizeof err);
    if (rc != 0)
        fail_msg("store: %s", err);
    return s;
}

static void test_killed_appender(void **state)
{
    (void)state;
    int64_t before = pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl.events");
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* The appender: no finalizer of its own, so nothing of its appends is final. */
        close(fds[0]);
        struct pawl_store *s = open_store(0, 1000);
        for (int i = 0; i < 50; i++) {
            char sid[32];
            snprintf(sid, sizeof sid, "victim-%d", i % 5);
            struct pawl_event e = {.stream_id = sid, .type = "t", .payload = "x", .payload_len = 1};
            if (pawl_append(s, &e, 1, NULL) != 0)
                _exit(3);
        }
        if (write(fds[1], "c", 1) != 1)
            _exit(4);
        pause(); /* killed here, its store still open */
        _exit(0);
    }
    close(fds[1]);
    char c;
    assert_int_equal(read(fds[0], &c, 1), 1);
    close(fds[0]);
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFSIGNALED(status));

    assert_int_equal(pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl.events") - before, 50);
    int64_t final_before = pawl_test_query_i64(dsn, "SELECT pawl_api.last_index()");
    assert_int_equal(final_before, before); /* nothing of the victim's is final yet */

    /* Another process (a store that appends nothing) picks them up with its safety run. */
    struct pawl_store *s = open_store(1, 100);
    assert_int_equal(pawl_store_wait(s, before + 49, 10000), 0);
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    assert_int_equal(pawl_read(s, before, 100, &b), 0);
    assert_int_equal(b.count, 50);
    for (size_t i = 0; i < b.count; i++)
        assert_int_equal(strncmp(b.events[i].stream_id, "victim-", 7), 0);
    pawl_read_batch_fini(&b);
    pawl_store_free(s);
}

#define N_APPENDS 2000

struct outcome {
    atomic_int rc;
    atomic_int done;
    char msg[256];
};

static struct outcome outcomes[N_APPENDS];

static void on_done(void *ud, const struct pawl_append_result *r)
{
    struct outcome *o = ud;
    snprintf(o->msg, sizeof o->msg, "%s", r->message);
    atomic_store(&o->rc, r->rc);
    atomic_store(&o->done, 1);
}

/* How often each append's number (what sql selects, one int per row) is in the log: counts[n]. */
static void count_in_log(const char *conninfo, const char *sql, char counts[N_APPENDS])
{
    PGconn *c = PQconnectdb(conninfo);
    PGresult *res = PQexec(c, sql);
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    for (int r = 0; r < PQntuples(res); r++)
        counts[atoi(PQgetvalue(res, r, 0))]++;
    PQclear(res);
    PQfinish(c);
}

static void test_server_goes_away(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1, 200);
    char sid[N_APPENDS][24];
    int submitted = 0;
    for (int i = 0; i < N_APPENDS; i++) {
        snprintf(sid[i], sizeof sid[i], "away-%d", i);
        struct pawl_event e = {
            .stream_id = sid[i], .stream_seq = 1, .type = "t", .payload = "x", .payload_len = 1};
        if (i == N_APPENDS / 4) {
            /* Drop every connection of this store while appends are in flight. */
            pawl_test_exec(dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE application_name = 'pawl' AND pid <> pg_backend_pid() "
                                "AND datname = current_database()");
        }
        int rc;
        while ((rc = pawl_append_async(s, &e, 1, on_done, &outcomes[i])) == PAWL_EAGAIN)
            usleep(1000);
        assert_int_equal(rc, 0);
        submitted++;
    }
    pawl_store_drain(s);
    int ok = 0, lost = 0, doubt = 0, other = 0;
    static char present_map[N_APPENDS];
    count_in_log(dsn,
                 "SELECT substr(stream_id, 6)::int FROM pawl.events "
                 "WHERE stream_id LIKE 'away-%' AND stream_id <> 'away-after'",
                 present_map);
    for (int i = 0; i < submitted; i++) {
        assert_int_equal(atomic_load(&outcomes[i].done), 1);
        int rc = atomic_load(&outcomes[i].rc);
        int64_t present = present_map[i];
        if (rc == 0) {
            ok++;
            assert_int_equal(present, 1);
        } else if (rc == PAWL_ECONN) {
            lost++;
            assert_int_equal(present, 0);
        } else if (rc == PAWL_EINDOUBT) {
            doubt++;
            if (doubt <= 3)
                printf("in doubt (present: %d): %s\n", (int)present, outcomes[i].msg);
        } else {
            other++;
            fprintf(stderr, "append %d: %s (%s)\n", i, pawl_errname(rc), outcomes[i].msg);
        }
    }
    printf("after the connections dropped: %d committed, %d not committed, %d in doubt\n", ok, lost,
           doubt);
    assert_int_equal(other, 0);
    assert_true(ok > 0);
    /* The kill hit appends in flight (else this test proves nothing), and the server stayed
     * reachable: the store learned every cut-off commit's fate on a new connection, so none is
     * in doubt (README: PAWL_EINDOUBT only when the fate could not be learned). */
    assert_true(lost + doubt > 0);
    assert_int_equal(doubt, 0);
    char err[256];
    pawl_store_errmsg(s, err, sizeof err);
    /* The store reconnected: a new append works and everything committed becomes final. */
    struct pawl_event e = {
        .stream_id = "away-after", .type = "t", .payload = "y", .payload_len = 1};
    assert_int_equal(pawl_append(s, &e, 1, NULL), 0);
    int64_t total = pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl.events");
    assert_int_equal(pawl_store_wait(s, total - 1, 10000), 0);
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl_api.events"), total);
    pawl_store_free(s);
}

static void test_lost_appends_repeated(void **state)
{
    (void)state;
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.append_finalizes = 0;
    o.reconnect_min_ms = 20;
    o.reconnect_max_ms = 200;
    o.append_retry_ms = 30000;
    o.append_lock_timeout_ms = 0; /* the held append below waits inside its statement */
    struct pawl_store *s = NULL;
    char err[512];
    if (pawl_store_new(&s, dsn, &o, err, sizeof err) != 0)
        fail_msg("store: %s", err);
    static char sid[N_APPENDS][24], id[N_APPENDS][24];
    memset(outcomes, 0, sizeof outcomes);
    /* One append is surely in flight when the sessions are ended: it waits for a stream that
     * an outbox transaction holds (without it, a kill that found every append answered
     * already tested nothing; the holder rolls back after the kill). */
    PGconn *holder = PQconnectdb(dsn);
    assert_int_equal(PQstatus(holder), CONNECTION_OK);
    PQclear(PQexec(holder, "BEGIN"));
    PGresult *hr = PQexec(holder, "SELECT pawl_api.append('held-again', 't', 'outbox')");
    assert_int_equal(PQresultStatus(hr), PGRES_TUPLES_OK);
    PQclear(hr);
    static struct outcome held_outcome;
    memset(&held_outcome, 0, sizeof held_outcome);
    for (int i = 0; i < N_APPENDS; i++) {
        snprintf(sid[i], sizeof sid[i], "again-%d", i);
        snprintf(id[i], sizeof id[i], "again-id-%d", i);
        struct pawl_event e = {.stream_id = sid[i],
                               .stream_seq = 1,
                               .type = "t",
                               .payload = "x",
                               .payload_len = 1,
                               .id = id[i]};
        if (i == N_APPENDS / 4) {
            struct pawl_event h = {.stream_id = "held-again",
                                   .stream_seq = 1,
                                   .type = "t",
                                   .payload = "x",
                                   .payload_len = 1,
                                   .id = "held-again-id"};
            assert_int_equal(pawl_append_async(s, &h, 1, on_done, &held_outcome), 0);
            double t0 = pawl_test_now_ms();
            while (pawl_test_query_i64(dsn, "SELECT count(*) FROM pg_stat_activity WHERE "
                                            "application_name = 'pawl' AND wait_event_type = "
                                            "'Lock' AND datname = current_database()") == 0) {
                assert_true(pawl_test_now_ms() - t0 < 10000);
                usleep(2000);
            }
            pawl_test_exec(dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE application_name = 'pawl' AND pid <> pg_backend_pid() "
                                "AND datname = current_database()");
            PQclear(PQexec(holder, "ROLLBACK"));
            PQfinish(holder);
        }
        int rc;
        while ((rc = pawl_append_async(s, &e, 1, on_done, &outcomes[i])) == PAWL_EAGAIN)
            usleep(1000);
        assert_int_equal(rc, 0);
    }
    pawl_store_drain(s); /* the delayed retries included: they count as in flight */
    static char present[N_APPENDS];
    count_in_log(dsn,
                 "SELECT substr(stream_id, 7)::int FROM pawl.events "
                 "WHERE stream_id LIKE 'again-%'",
                 present);
    for (int i = 0; i < N_APPENDS; i++) {
        assert_int_equal(atomic_load(&outcomes[i].done), 1);
        int rc = atomic_load(&outcomes[i].rc);
        if (rc != 0 || present[i] != 1)
            fail_msg("append %d: %s (%s), %d in the log", i, pawl_errname(rc), outcomes[i].msg,
                     present[i]);
    }
    assert_int_equal(atomic_load(&held_outcome.done), 1);
    if (atomic_load(&held_outcome.rc) != 0)
        fail_msg("the held append: %s (%s)", pawl_errname(atomic_load(&held_outcome.rc)),
                 held_outcome.msg);
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl.events WHERE stream_id "
                                              "= 'held-again'"),
                     1);
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    printf("after the connections dropped: %lld appends repeated, all %d in the log once\n",
           (long long)st.append_lost_retries, N_APPENDS);
    assert_true(st.append_lost_retries > 0); /* the kill hit appends in flight */
    pawl_store_free(s);
}

static atomic_int fk_stop;

static void *fk_appender(void *arg)
{
    struct pawl_store *s = arg;
    long n = 0;
    while (!atomic_load(&fk_stop)) {
        char sid[32];
        snprintf(sid, sizeof sid, "fk-%ld", n % 11);
        struct pawl_event e = {.stream_id = sid, .type = "t", .payload = "z", .payload_len = 1};
        int rc = pawl_append(s, &e, 1, NULL);
        /* Only the finalizer's session is killed: every append commits. */
        if (rc != 0)
            fail_msg("append %ld: %s", n, pawl_errname(rc));
        n++;
    }
    return (void *)n;
}

static void test_finalizer_session_killed(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1, 300);
    int64_t before = pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl.events");
    atomic_store(&fk_stop, 0);
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, fk_appender, s), 0);
    int64_t kills = 0;
    for (int k = 0; k < 25; k++) {
        usleep(40000 + (useconds_t)(k % 5) * 15000);
        kills += pawl_test_query_i64(dsn, "SELECT count(pg_terminate_backend(pid)) FROM "
                                          "pg_stat_activity WHERE application_name = "
                                          "'pawl finalizer' AND datname = current_database()");
    }
    atomic_store(&fk_stop, 1);
    long appended = 0;
    for (int i = 0; i < 3; i++) {
        void *n;
        pthread_join(th[i], &n);
        appended += (long)n;
    }
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    printf("%ld appends, %lld finalizer sessions terminated, %lld failed runs, %lld runs\n",
           appended, (long long)kills, (long long)st.finalize_errors, (long long)st.finalize_runs);
    assert_true(kills >= 10);
    assert_true(appended > 0);
    /* Within a few safety intervals of the last kill, everything is final, exactly once. */
    int64_t total = pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl.events");
    assert_int_equal(total - before, appended);
    assert_int_equal(pawl_store_wait(s, total - 1, 10000), 0); /* an index above total - 1 */
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl_api.events"), total);
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT pawl_api.last_index()"), total);
    pawl_store_stats(s, &st, 0);
    assert_int_equal(st.appends_pending, 0);
    pawl_store_free(s);
}

static atomic_int fin_warns, fin_again;
/* The finalizer connection's attempts to reconnect (pool "finalizer"): warnings, retries at
 * debug, and the line when it is back. */
static atomic_int conn_warns, conn_retries, conn_again;

static void count_sink(void *ud, enum pawl_log_level level, const char *module, const char *msg)
{
    (void)ud;
    fprintf(stderr, "log %d %s: %s\n", (int)level, module, msg);
    if (strcmp(module, "finalizer") == 0 && level == PAWL_LOG_WARN)
        atomic_fetch_add(&fin_warns, 1);
    if (strcmp(module, "finalizer") == 0 && strstr(msg, "works again"))
        atomic_fetch_add(&fin_again, 1);
    if (strcmp(module, "pgconn") == 0 && strncmp(msg, "finalizer[", 10) == 0) {
        if (level == PAWL_LOG_WARN && strstr(msg, "cannot connect"))
            atomic_fetch_add(&conn_warns, 1);
        if (level == PAWL_LOG_DEBUG && strstr(msg, "cannot connect"))
            atomic_fetch_add(&conn_retries, 1);
        if (strstr(msg, "connected again"))
            atomic_fetch_add(&conn_again, 1);
    }
}

static void ctl_exec(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQerrorMessage(c));
    PQclear(r);
}

static void test_finalizer_outage_logged_once(void **state)
{
    (void)state;
    /* The control session sits in another database: the test's own will refuse connections. */
    PGconn *ctl = PQconnectdb(getenv("PAWL_TEST_DSN"));
    assert_int_equal(PQstatus(ctl), CONNECTION_OK);
    PGconn *own = PQconnectdb(dsn);
    PGresult *r = PQexec(own, "SELECT current_database()");
    char db[128];
    snprintf(db, sizeof db, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    PQfinish(own);
    char sql[512];

    struct pawl_store *s = open_store(1, 300);
    atomic_store(&fin_warns, 0);
    atomic_store(&fin_again, 0);
    enum pawl_log_level level = pawl_log_get_level();
    pawl_log_set_level(PAWL_LOG_DEBUG);
    pawl_log_set_sink(count_sink, NULL);
    snprintf(sql, sizeof sql, "ALTER DATABASE \"%s\" ALLOW_CONNECTIONS false", db);
    ctl_exec(ctl, sql);
    snprintf(sql, sizeof sql,
             "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = "
             "'pawl finalizer' AND datname = '%s'",
             db);
    ctl_exec(ctl, sql);
    /* Appends go on over the log's connections, which stay up; each signals the finalizer. */
    for (int i = 0; i < 30; i++) {
        struct pawl_event e = {
            .stream_id = "outage", .type = "t", .payload = "o", .payload_len = 1};
        assert_int_equal(pawl_append(s, &e, 1, NULL), 0);
        usleep(100000);
    }
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    int warns = atomic_load(&fin_warns);
    printf("3 s without a finalizer connection: %lld failed runs, %d warning(s)\n",
           (long long)st.finalize_errors, warns);
    assert_true(st.finalize_errors >= 4);
    assert_int_equal(warns, 1);
    /* Its connection: one warning when reconnecting starts failing, each retry after it at
     * debug (the back-off, 100 ms doubling, makes about four in 3 s). */
    printf("its connection: %d warning(s), %d more failed attempt(s) at debug\n",
           atomic_load(&conn_warns), atomic_load(&conn_retries));
    assert_int_equal(atomic_load(&conn_warns), 1);
    assert_true(atomic_load(&conn_retries) >= 2);
    snprintf(sql, sizeof sql, "ALTER DATABASE \"%s\" ALLOW_CONNECTIONS true", db);
    ctl_exec(ctl, sql);
    PQfinish(ctl);
    int64_t total = pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl.events");
    assert_int_equal(pawl_store_wait(s, total - 1, 10000), 0);
    assert_int_equal(atomic_load(&fin_again), 1);
    assert_int_equal(atomic_load(&fin_warns), 1);
    assert_int_equal(atomic_load(&conn_again), 1);
    assert_int_equal(atomic_load(&conn_warns), 1);
    pawl_log_set_sink(NULL, NULL);
    pawl_log_set_level(level);
    pawl_store_free(s);
}

int main(void)
{
    dsn = pawl_test_db_create("log_faults");
    char err[256];
    if (pawl_schema_migrate(dsn, err, sizeof err) != 0) {
        fprintf(stderr, "migrate: %s\n", err);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_appender),
        cmocka_unit_test(test_server_goes_away),
        cmocka_unit_test(test_lost_appends_repeated),
        cmocka_unit_test(test_finalizer_session_killed),
        cmocka_unit_test(test_finalizer_outage_logged_once), /* last: it closes the database */
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
