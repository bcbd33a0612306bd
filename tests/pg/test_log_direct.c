/*
 * test_log_direct.c — blocking appends on the caller's thread (append_direct):
 *
 *   - taken from a store's second blocking append that finds nothing else in flight
 *     (appends_direct counts them; the connection is the session "pawl direct"), never with
 *     append_direct = 0, never by an append that finds another in flight;
 *   - the same outcomes as through the log connections (each case run on both, compared field
 *     by field, and counted as direct on the first): a conflict, an id of another event, a
 *     retry of appended ids (already), a stream held by an open transaction past
 *     append_lock_wait_ms (lock timeouts retried, then PAWL_ETIMEDOUT naming the stream);
 *   - its session ended by the server while idle: the next append goes through the log
 *     connections and succeeds, and a later one reopens the connection after the back-off;
 *   - its session ended while the append waits for a held stream (mid-statement: nothing
 *     committed): the append goes again through the log connections, succeeds once the
 *     stream is released, and is in the log once;
 *   - sessions ended again and again while one thread appends: every append succeeds or fails
 *     with PAWL_ECONN (never in doubt: the server stays up, so a cut-off commit's fate is
 *     learned), every success is in the log once and no failure is.
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

static struct pawl_store *open_store(int direct, int lock_wait_ms)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.append_direct = direct;
    o.reconnect_min_ms = 20;
    o.reconnect_max_ms = 200;
    if (lock_wait_ms > 0)
        o.append_lock_wait_ms = lock_wait_ms;
    o.io_backend = pawl_test_io_backend();
    struct pawl_store *s = NULL;
    char err[512];
    int rc = pawl_store_new(&s, dsn, &o, err, sizeof err);
    if (rc != 0)
        fail_msg("store: %s: %s", pawl_strerror(rc), err);
    return s;
}

static struct pawl_event ev(const char *stream, int64_t seq, const char *payload, const char *id)
{
    struct pawl_event e = {0};
    e.stream_id = stream;
    e.stream_seq = seq;
    e.type = "t";
    e.payload = payload;
    e.payload_len = strlen(payload);
    e.id = id;
    return e;
}

static int64_t direct_count(struct pawl_store *s)
{
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    return st.appends_direct;
}

/* Two blocking appends to a stream of its own: the second opens the direct connection. */
static void warm(struct pawl_store *s, const char *tag)
{
    char sid[64];
    snprintf(sid, sizeof sid, "warm-%s-%lld", tag, (long long)pawl_now_ns());
    for (int i = 0; i < 2; i++) {
        struct pawl_event e = ev(sid, PAWL_SEQ_ANY, "w", NULL);
        assert_int_equal(pawl_append(s, &e, 1, NULL), 0);
    }
}

/* A session whose open transaction holds stream's next number (an outbox append not yet
 * committed); the caller ends it with COMMIT or ROLLBACK, then PQfinish. */
static PGconn *hold_stream(const char *stream)
{
    PGconn *c = PQconnectdb(dsn);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    PQclear(PQexec(c, "BEGIN"));
    char sql[200];
    snprintf(sql, sizeof sql, "SELECT pawl_api.append('%s', 't', 'outbox')", stream);
    PGresult *r = PQexec(c, sql);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    PQclear(r);
    return c;
}

static int64_t direct_sessions(void)
{
    return pawl_test_query_i64(dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name "
                                    "= 'pawl direct' AND datname = current_database()");
}

struct async_box {
    atomic_int done;
    int rc;
};

static void on_done(void *ud, const struct pawl_append_result *res)
{
    struct async_box *b = ud;
    b->rc = res->rc;
    atomic_store(&b->done, 1);
}

static void test_taken(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1, 0);
    struct pawl_event e = ev("taken", PAWL_SEQ_ANY, "1", NULL);
    assert_int_equal(pawl_append(s, &e, 1, NULL), 0);
    assert_int_equal(direct_count(s), 0); /* a process's first: no connection for it */
    assert_int_equal(direct_sessions(), 0);
    for (int i = 0; i < 10; i++)
        assert_int_equal(pawl_append(s, &e, 1, NULL), 0);
    assert_int_equal(direct_count(s), 10);
    assert_int_equal(direct_sessions(), 1);
    pawl_store_free(s);
    assert_int_equal(direct_sessions(), 0); /* closed with the store */

    s = open_store(0, 0);
    for (int i = 0; i < 10; i++)
        assert_int_equal(pawl_append(s, &e, 1, NULL), 0);
    assert_int_equal(direct_count(s), 0);
    assert_int_equal(direct_sessions(), 0);
    pawl_store_free(s);

    /* An append that finds another in flight joins the log connections: the held one. */
    s = open_store(1, 0);
    warm(s, "busy");
    int64_t d0 = direct_count(s);
    PGconn *c = hold_stream("busy-held");
    struct async_box box = {.rc = -1};
    struct pawl_event held = ev("busy-held", PAWL_SEQ_ANY, "lib", NULL);
    assert_int_equal(pawl_append_async(s, &held, 1, on_done, &box), 0);
    usleep(50000);
    struct pawl_event other = ev("busy-other", PAWL_SEQ_ANY, "x", NULL);
    assert_int_equal(pawl_append(s, &other, 1, NULL), 0);
    assert_int_equal(direct_count(s), d0); /* not direct: the held append was in flight */
    PQclear(PQexec(c, "COMMIT"));
    PQfinish(c);
    pawl_store_drain(s);
    assert_int_equal(atomic_load(&box.done), 1);
    assert_int_equal(box.rc, 0);
    pawl_store_free(s);
}

/* ---- the same outcomes on both paths --------------------------------------------------- */

struct outcome {
    int rc, already;
    int64_t first_seq, last_seq;
    char sqlstate[6], message[256];
};

static struct outcome append_one(struct pawl_store *s, const struct pawl_event *e, size_t n)
{
    struct pawl_append_result res;
    struct outcome o = {0};
    o.rc = pawl_append(s, e, n, &res);
    assert_int_equal(o.rc, res.rc);
    o.already = res.already;
    o.first_seq = res.first_seq;
    o.last_seq = res.last_seq;
    snprintf(o.sqlstate, sizeof o.sqlstate, "%s", res.sqlstate);
    snprintf(o.message, sizeof o.message, "%s", res.message);
    return o;
}

/* The two paths' names in streams and ids: as long as each other. */
#define DIRECT_TAG "direct"
#define LOOP_TAG "loopio"

/* Run case k on store s, its streams and ids named by tag (each path gets its own). */
static struct outcome run_case(struct pawl_store *s, int k, const char *tag)
{
    char a[64], id1[64], id2[64];
    snprintf(a, sizeof a, "case%d-%s", k, tag);
    snprintf(id1, sizeof id1, "id1-%d-%s", k, tag);
    snprintf(id2, sizeof id2, "id2-%d-%s", k, tag);
    struct pawl_event first = ev(a, 1, "one", id1);
    assert_int_equal(pawl_append(s, &first, 1, NULL), 0);
    switch (k) {
    case 0: { /* a conflict: the stream is at 1, the append expects 4 */
        struct pawl_event e = ev(a, 5, "five", NULL);
        return append_one(s, &e, 1);
    }
    case 1: { /* an id of another event */
        struct pawl_event e[2] = {ev(a, PAWL_SEQ_ANY, "other", id2), ev(a, PAWL_SEQ_ANY, "x", id1)};
        return append_one(s, e, 2);
    }
    case 2: { /* a retry of an appended id: already, with its number */
        return append_one(s, &first, 1);
    }
    default: { /* a stream held by an open transaction past append_lock_wait_ms */
        PGconn *c = hold_stream(a);
        struct pawl_event e = ev(a, PAWL_SEQ_ANY, "waits", NULL);
        struct outcome o = append_one(s, &e, 1);
        PQclear(PQexec(c, "ROLLBACK"));
        PQfinish(c);
        return o;
    }
    }
}

static void test_same_outcomes(void **state)
{
    (void)state;
    struct pawl_store *sd = open_store(1, 400), *sl = open_store(0, 400);
    warm(sd, "same");
    for (int k = 0; k < 4; k++) {
        int64_t d0 = direct_count(sd);
        struct pawl_store_stats st0, st1;
        pawl_store_stats(sd, &st0, 0);
        struct outcome od = run_case(sd, k, DIRECT_TAG), ol = run_case(sl, k, LOOP_TAG);
        pawl_store_stats(sd, &st1, 0);
        print_message("case %d: direct rc %d (%s) \"%s\"; loop rc %d \"%s\"\n", k, od.rc,
                      od.sqlstate, od.message, ol.rc, ol.message);
        /* Both appends of the case went direct (the case's first, then the case itself). */
        assert_int_equal(direct_count(sd) - d0, 2);
        assert_int_equal(od.rc, ol.rc);
        assert_int_equal(od.already, ol.already);
        assert_int_equal(od.first_seq, ol.first_seq);
        assert_int_equal(od.last_seq, ol.last_seq);
        assert_string_equal(od.sqlstate, ol.sqlstate);
        /* Messages name the case's own stream and ids: compared with the tags swapped. */
        char want[256];
        snprintf(want, sizeof want, "%s", ol.message);
        for (char *p = strstr(want, LOOP_TAG); p; p = strstr(p, LOOP_TAG))
            memcpy(p, DIRECT_TAG, strlen(DIRECT_TAG));
        assert_string_equal(od.message, want);
        if (k == 3) {
            assert_int_equal(od.rc, PAWL_ETIMEDOUT);
            assert_true(st1.append_lock_timeouts > st0.append_lock_timeouts);
        }
    }
    pawl_store_free(sd);
    pawl_store_free(sl);
}

/* ---- sessions ended by the server ---------------------------------------------------------- */

static int64_t terminate(const char *app, const char *extra)
{
    char sql[400];
    snprintf(sql, sizeof sql,
             "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
             "datname = current_database() AND application_name = '%s' AND pid <> "
             "pg_backend_pid() %s",
             app, extra ? extra : "");
    return pawl_test_query_i64(dsn, sql);
}

static void test_ended_idle(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1, 0);
    warm(s, "idle");
    assert_int_equal(direct_sessions(), 1);
    assert_int_equal(terminate("pawl direct", NULL), 1);
    usleep(100000); /* its FATAL notice and the close have arrived */
    int64_t d0 = direct_count(s);
    struct pawl_event e = ev("idle", PAWL_SEQ_ANY, "after", NULL);
    struct pawl_append_result res;
    assert_int_equal(pawl_append(s, &e, 1, &res), 0); /* through the log connections */
    assert_int_equal(direct_count(s), d0);
    usleep(50000);                                    /* the back-off (20 ms) */
    assert_int_equal(pawl_append(s, &e, 1, &res), 0); /* reopens it */
    assert_int_equal(direct_count(s), d0 + 1);
    assert_int_equal(direct_sessions(), 1);
    /* Every session of the store ended while idle, the log connections' too. */
    assert_true(terminate("pawl direct", NULL) + terminate("pawl", NULL) >= 2);
    usleep(100000);
    assert_int_equal(pawl_append(s, &e, 1, &res), 0);
    pawl_store_free(s);
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl.events WHERE stream_id "
                                              "= 'idle'"),
                     3);
}

struct wait_arg {
    struct pawl_store *s;
    int rc;
    char message[256];
};

static void *held_append(void *arg)
{
    struct wait_arg *w = arg;
    struct pawl_event e = ev("mid", PAWL_SEQ_ANY, "lib", NULL);
    struct pawl_append_result res;
    w->rc = pawl_append(w->s, &e, 1, &res);
    snprintf(w->message, sizeof w->message, "%s", res.message);
    return NULL;
}

static void test_ended_mid_statement(void **state)
{
    (void)state;
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.append_lock_timeout_ms = 0; /* wait for the held stream inside the statement */
    o.reconnect_min_ms = 20;
    o.io_backend = pawl_test_io_backend();
    struct pawl_store *s = NULL;
    char err[512];
    assert_int_equal(pawl_store_new(&s, dsn, &o, err, sizeof err), 0);
    warm(s, "mid");
    PGconn *c = hold_stream("mid");
    int64_t d0 = direct_count(s);
    struct wait_arg w = {.s = s, .rc = -1};
    pthread_t th;
    pthread_create(&th, NULL, held_append, &w);
    /* The direct session waits for the stream's lock: end it there. */
    double t0 = pawl_test_now_ms();
    while (pawl_test_query_i64(dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name "
                                    "= 'pawl direct' AND wait_event_type = 'Lock' AND datname = "
                                    "current_database()") == 0) {
        assert_true(pawl_test_now_ms() - t0 < 10000);
        usleep(5000);
    }
    assert_int_equal(terminate("pawl direct", NULL), 1);
    /* Now on a log connection, waiting for the same lock. */
    t0 = pawl_test_now_ms();
    while (pawl_test_query_i64(dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name "
                                    "= 'pawl' AND wait_event_type = 'Lock' AND datname = "
                                    "current_database()") == 0) {
        assert_true(pawl_test_now_ms() - t0 < 10000);
        usleep(5000);
    }
    PQclear(PQexec(c, "COMMIT"));
    PQfinish(c);
    pthread_join(th, NULL);
    print_message("append whose direct session ended mid-statement: rc %d %s\n", w.rc, w.message);
    assert_int_equal(w.rc, 0);
    assert_int_equal(direct_count(s), d0); /* answered by the log connections */
    pawl_store_free(s);
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl.events WHERE stream_id "
                                              "= 'mid' AND payload = 'lib'"),
                     1);
}

#define N_KILL 600

static atomic_int kill_stop;
static atomic_llong kills_active;

static void *killer(void *arg)
{
    (void)arg;
    while (!atomic_load(&kill_stop)) {
        usleep(15000 + (useconds_t)(rand() % 20000));
        atomic_fetch_add(&kills_active, terminate("pawl direct", "AND state = 'active'") +
                                            terminate("pawl", "AND state = 'active'"));
        if (rand() % 4 == 0)
            terminate("pawl direct", NULL);
    }
    return NULL;
}

static void test_ended_again_and_again(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1, 0);
    warm(s, "kills");
    static int rcs[N_KILL];
    atomic_store(&kill_stop, 0);
    pthread_t th;
    pthread_create(&th, NULL, killer, NULL);
    int ok = 0, lost = 0;
    for (int i = 0; i < N_KILL; i++) {
        char payload[16];
        snprintf(payload, sizeof payload, "%d", i);
        struct pawl_event e = ev("kills", PAWL_SEQ_ANY, payload, NULL);
        struct pawl_append_result res;
        rcs[i] = pawl_append(s, &e, 1, &res);
        if (rcs[i] == 0)
            ok++;
        else if (rcs[i] == PAWL_ECONN)
            lost++;
        else
            fail_msg("append %d: %s: %s", i, pawl_strerror(rcs[i]), res.message);
    }
    atomic_store(&kill_stop, 1);
    pthread_join(th, NULL);
    int64_t direct = direct_count(s);
    pawl_store_free(s);
    print_message("%d appends: %d ok, %d not committed; %lld answered direct; %lld sessions ended "
                  "mid-statement\n",
                  N_KILL, ok, lost, (long long)direct, (long long)atomic_load(&kills_active));
    assert_true(direct > N_KILL / 4);
    assert_true(atomic_load(&kills_active) > 0);
    PGconn *c = PQconnectdb(dsn);
    PGresult *r = PQexec(c, "SELECT convert_from(payload, 'UTF8')::int, count(*) FROM pawl.events "
                            "WHERE stream_id = 'kills' GROUP BY 1");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    static int in_log[N_KILL];
    for (int i = 0; i < PQntuples(r); i++) {
        int k = atoi(PQgetvalue(r, i, 0));
        assert_true(k >= 0 && k < N_KILL);
        in_log[k] = atoi(PQgetvalue(r, i, 1));
    }
    PQclear(r);
    PQfinish(c);
    for (int i = 0; i < N_KILL; i++) {
        if (in_log[i] != (rcs[i] == 0 ? 1 : 0))
            fail_msg("append %d: rc %d, %d times in the log", i, rcs[i], in_log[i]);
    }
}

int main(void)
{
    dsn = pawl_test_db_create("log_direct");
    char err[512];
    if (pawl_schema_migrate(dsn, err, sizeof err) != 0) {
        fprintf(stderr, "migrate: %s\n", err);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_taken),
        cmocka_unit_test(test_same_outcomes),
        cmocka_unit_test(test_ended_idle),
        cmocka_unit_test(test_ended_mid_statement),
        cmocka_unit_test(test_ended_again_and_again),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
