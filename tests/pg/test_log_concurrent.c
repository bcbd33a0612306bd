/*
 * test_log_concurrent.c — the log's guarantees under concurrency:
 *
 *   - 4 appender threads use the store (async, many appends in flight, explicit and ANY
 *     sequences, batches of 1..20) and 6 use raw connections whose transactions sleep before
 *     and after the append with the transaction open, so commits land in random order;
 *   - 2 followers (on a second store, as another process would) read concurrently;
 *   - finalizers race: both stores' finalizer threads plus a raw session that finalizes in
 *     transactions held open for a while, which a killer thread terminates mid-way
 *     (pg_terminate_backend) now and then.
 *
 * Afterwards: every committed event was read exactly once by each follower, in strictly
 * increasing order without gaps; per stream, index order equals sequence order; indexes are
 * unique and contiguous from 1; the runs ledger is seamless.
 */
#include "pawl_test.h"

#include "log_int.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STORE_APPENDERS 4
#define RAW_APPENDERS 6
#define FOLLOWERS 2
#define RUN_MS 12000
#define MAX_EVENTS 400000

static const char *dsn;
static atomic_int stop_appending;
static atomic_llong committed_events;
static atomic_int followers_done;
static atomic_llong kills;

struct follower {
    struct pawl_store *s;
    _Atomic int64_t received;
    int64_t last;
    int ok;
    uint32_t *hash; /* per index: hash of stream id and seq */
    char fail[256];
};

static uint32_t ev_hash(const char *sid, int64_t seq)
{
    uint32_t h = 2166136261u;
    for (const char *p = sid; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    h = (h ^ (uint32_t)seq) * 16777619u;
    return h ? h : 1;
}

/* ---- store appenders --------------------------------------------------------------------- */

struct sapp {
    struct pawl_store *s;
    int id;
    atomic_llong ok_events;
    atomic_int inflight;
};

struct sapp_cb {
    struct sapp *a;
    int n;
};

static void sapp_done(void *ud, const struct pawl_append_result *r)
{
    struct sapp_cb *c = ud;
    if (r->rc == 0) {
        atomic_fetch_add(&c->a->ok_events, c->n);
        atomic_fetch_add(&committed_events, c->n);
    } else if (r->rc != PAWL_ECONFLICT) {
        fprintf(stderr, "append failed: %s %s\n", pawl_errname(r->rc), r->message);
    }
    atomic_fetch_sub(&c->a->inflight, 1);
    free(c);
}

static void *store_appender(void *arg)
{
    struct sapp *a = arg;
    unsigned seed = 1234u + (unsigned)a->id;
    int64_t own_seq = 0; /* explicit sequences on this thread's own stream */
    char own[32];
    snprintf(own, sizeof own, "own-%d", a->id);
    while (!atomic_load(&stop_appending)) {
        if (atomic_load(&a->inflight) > 64) {
            usleep(500);
            continue;
        }
        int n = 1 + rand_r(&seed) % 20;
        struct pawl_event ev[20];
        char sids[20][32];
        int explicit_own = rand_r(&seed) % 3 == 0;
        for (int k = 0; k < n; k++) {
            memset(&ev[k], 0, sizeof ev[k]);
            if (explicit_own) {
                ev[k].stream_id = own;
                ev[k].stream_seq = own_seq + 1 + k;
            } else {
                snprintf(sids[k], sizeof sids[k], "shared-%d", rand_r(&seed) % 64);
                ev[k].stream_id = sids[k];
                ev[k].stream_seq = PAWL_SEQ_ANY;
            }
            ev[k].type = "t";
            ev[k].payload = "p";
            ev[k].payload_len = 1;
        }
        if (explicit_own) {
            /* Explicit sequences need the previous append to be done: wait for it. */
            struct pawl_append_result r;
            int rc = pawl_append(a->s, ev, (size_t)n, &r);
            if (rc == 0) {
                own_seq += n;
                atomic_fetch_add(&a->ok_events, n);
                atomic_fetch_add(&committed_events, n);
            } else {
                fprintf(stderr, "explicit append failed: %s %s\n", pawl_errname(rc), r.message);
            }
            continue;
        }
        struct sapp_cb *c = malloc(sizeof *c);
        c->a = a;
        c->n = n;
        atomic_fetch_add(&a->inflight, 1);
        int rc = pawl_append_async(a->s, ev, (size_t)n, sapp_done, c);
        if (rc != 0) {
            atomic_fetch_sub(&a->inflight, 1);
            free(c);
            if (rc != PAWL_EAGAIN)
                fprintf(stderr, "append_async: %s\n", pawl_errname(rc));
            usleep(1000);
        }
    }
    while (atomic_load(&a->inflight) > 0)
        usleep(1000);
    return NULL;
}

/* ---- raw appenders: transactions held open at random ------------------------------------- */

static void *raw_appender(void *arg)
{
    int id = (int)(intptr_t)arg;
    unsigned seed = 777u + (unsigned)id;
    PGconn *c = PQconnectdb(dsn);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "raw connect: %s", PQerrorMessage(c));
        return NULL;
    }
    while (!atomic_load(&stop_appending)) {
        int n = 1 + rand_r(&seed) % 5;
        /* The statement's parameters (see pawl__log_append_sql): distinct streams with ANY
         * (0) as their expected first number; per event its stream (1-based) and its rank
         * among that stream's events here. */
        int ev_stream[5], nstreams = 0, streams[5];
        char s_arr[256] = "{", q_arr[128] = "{", si_arr[128] = "{", r_arr[128] = "{",
             t_arr[128] = "{", p_arr[256] = "{", m_arr[128] = "{", nbuf[8];
        for (int k = 0; k < n; k++) {
            int sid = rand_r(&seed) % 64, j = 0, rank = 1;
            while (j < nstreams && streams[j] != sid)
                j++;
            if (j == nstreams) {
                char one[48];
                snprintf(one, sizeof one, "%sshared-%d", nstreams ? "," : "", sid);
                strcat(s_arr, one);
                strcat(q_arr, nstreams ? ",0" : "0");
                streams[nstreams++] = sid;
            }
            for (int i = 0; i < k; i++)
                rank += ev_stream[i] == j;
            ev_stream[k] = j;
            char one[32];
            snprintf(one, sizeof one, "%s%d", k ? "," : "", j + 1);
            strcat(si_arr, one);
            snprintf(one, sizeof one, "%s%d", k ? "," : "", rank);
            strcat(r_arr, one);
            strcat(t_arr, k ? ",raw" : "raw");
            strcat(p_arr, k ? ",\"\\\\x0102\"" : "\"\\\\x0102\"");
            strcat(m_arr, k ? ",NULL" : "NULL");
        }
        strcat(s_arr, "}");
        strcat(q_arr, "}");
        strcat(si_arr, "}");
        strcat(r_arr, "}");
        strcat(t_arr, "}");
        strcat(p_arr, "}");
        strcat(m_arr, "}");
        snprintf(nbuf, sizeof nbuf, "f"); /* $8: no NOTIFY pawl_pending */
        const char *vals[8] = {s_arr, q_arr, si_arr, r_arr, t_arr, p_arr, m_arr, nbuf};
        char sleep_before[64], sleep_after[64];
        snprintf(sleep_before, sizeof sleep_before, "SELECT pg_sleep(%f)",
                 (rand_r(&seed) % 30) / 1000.0);
        snprintf(sleep_after, sizeof sleep_after, "SELECT pg_sleep(%f)",
                 (rand_r(&seed) % 60) / 1000.0);
        PQclear(PQexec(c, "BEGIN"));
        PQclear(PQexec(c, sleep_before));
        PGresult *r = PQexecParams(c, pawl__log_append_sql, 8, NULL, vals, NULL, NULL, 0);
        int ok = PQresultStatus(r) == PGRES_TUPLES_OK && atoi(PQgetvalue(r, 0, 0)) == n;
        PQclear(r);
        if (!ok) {
            PQclear(PQexec(c, "ROLLBACK"));
            continue; /* a concurrent append took the sequence numbers: nothing written */
        }
        PQclear(PQexec(c, sleep_after));
        r = PQexec(c, "COMMIT");
        if (PQresultStatus(r) == PGRES_COMMAND_OK)
            atomic_fetch_add(&committed_events, n);
        PQclear(r);
        /* Wake a finalizer the way an appending process would: the safety run or another's. */
    }
    PQfinish(c);
    return NULL;
}

/* ---- a raw finalizer whose transactions get killed ------------------------------------------ */

static void *raw_finalizer(void *arg)
{
    (void)arg;
    unsigned seed = 99;
    while (!atomic_load(&stop_appending)) {
        PGconn *c = PQconnectdb(dsn);
        if (PQstatus(c) != CONNECTION_OK) {
            PQfinish(c);
            usleep(10000);
            continue;
        }
        PQclear(PQexec(c, "SET application_name = 'victim finalizer'"));
        while (!atomic_load(&stop_appending) && PQstatus(c) == CONNECTION_OK) {
            PQclear(PQexec(c, "BEGIN"));
            PQclear(PQexec(c, "SELECT * FROM pawl.finalize(50)"));
            char sl[64];
            snprintf(sl, sizeof sl, "SELECT pg_sleep(%f)", (rand_r(&seed) % 40) / 1000.0);
            PQclear(PQexec(c, sl));
            PQclear(PQexec(c, "COMMIT"));
            usleep(5000);
        }
        PQfinish(c);
    }
    return NULL;
}

static void *killer(void *arg)
{
    (void)arg;
    PGconn *c = PQconnectdb(dsn);
    while (!atomic_load(&stop_appending)) {
        usleep(150000);
        PGresult *r = PQexec(c, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                "WHERE application_name = 'victim finalizer' "
                                "AND backend_xid IS NOT NULL AND datname = current_database()");
        if (PQresultStatus(r) == PGRES_TUPLES_OK)
            atomic_fetch_add(&kills, atoll(PQgetvalue(r, 0, 0)));
        PQclear(r);
    }
    PQfinish(c);
    return NULL;
}

/* ---- followers ----------------------------------------------------------------------------- */

static void *follower_main(void *arg)
{
    struct follower *f = arg;
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    f->ok = 1;
    int64_t pos = 0;
    for (;;) {
        int rc = pawl_follow(f->s, pos, 500, &b, 200);
        if (rc == PAWL_ETIMEDOUT) {
            if (atomic_load(&followers_done))
                break;
            continue;
        }
        if (rc != 0) {
            snprintf(f->fail, sizeof f->fail, "follow: %s", pawl_errname(rc));
            f->ok = 0;
            break;
        }
        for (size_t i = 0; i < b.count; i++) {
            const struct pawl_event *e = &b.events[i];
            if (e->index != pos + 1) {
                snprintf(f->fail, sizeof f->fail, "got index %lld after %lld", (long long)e->index,
                         (long long)pos);
                f->ok = 0;
                goto out;
            }
            pos = e->index;
            if (pos < MAX_EVENTS)
                f->hash[pos] = ev_hash(e->stream_id, e->stream_seq);
            /* relaxed: the main thread polls it to know when followers caught up. */
            atomic_fetch_add_explicit(&f->received, 1, memory_order_relaxed);
        }
    }
out:
    f->last = pos;
    pawl_read_batch_fini(&b);
    return NULL;
}

static struct pawl_store *open_store(int conns, int piggyback)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.connections = conns;
    o.append_finalizes = piggyback;
    o.finalizer_safety_interval_ms = 200;
    o.finalize_batch_max = 300; /* small: exercises truncated runs */
    struct pawl_store *s = NULL;
    char err[512];
    int rc = pawl_store_new(&s, dsn, &o, err, sizeof err);
    if (rc != 0)
        fail_msg("store: %s", err);
    return s;
}

static void test_concurrent(void **state)
{
    (void)state;
    char err[512];
    assert_int_equal(pawl_schema_migrate(dsn, err, sizeof err), 0);
    /* Store A's appends also piggyback finalization runs (the experimental mode). */
    struct pawl_store *sa = open_store(2, 1);
    struct pawl_store *sb = open_store(1, 0);

    struct follower fol[FOLLOWERS];
    pthread_t tf[FOLLOWERS], ts[STORE_APPENDERS], tr[RAW_APPENDERS], tfin, tkill;
    for (int i = 0; i < FOLLOWERS; i++) {
        memset(&fol[i], 0, sizeof fol[i]);
        fol[i].s = sb;
        fol[i].hash = calloc(MAX_EVENTS, sizeof(uint32_t));
        pthread_create(&tf[i], NULL, follower_main, &fol[i]);
    }
    static struct sapp apps[STORE_APPENDERS];
    for (int i = 0; i < STORE_APPENDERS; i++) {
        apps[i].s = sa;
        apps[i].id = i;
        pthread_create(&ts[i], NULL, store_appender, &apps[i]);
    }
    for (int i = 0; i < RAW_APPENDERS; i++)
        pthread_create(&tr[i], NULL, raw_appender, (void *)(intptr_t)i);
    pthread_create(&tfin, NULL, raw_finalizer, NULL);
    pthread_create(&tkill, NULL, killer, NULL);

    usleep(RUN_MS * 1000);
    atomic_store(&stop_appending, 1);
    for (int i = 0; i < STORE_APPENDERS; i++)
        pthread_join(ts[i], NULL);
    for (int i = 0; i < RAW_APPENDERS; i++)
        pthread_join(tr[i], NULL);
    pthread_join(tfin, NULL);
    pthread_join(tkill, NULL);

    /* Finalize what is left (raw appends do not signal a finalizer: the safety run does). */
    int64_t total = atomic_load(&committed_events);
    double t0 = pawl_test_now_ms();
    while (pawl_store_last_index(sb) < total && pawl_test_now_ms() - t0 < 30000)
        pawl_store_wait(sb, total - 1, 500);
    /* Let followers catch up, then stop them. */
    t0 = pawl_test_now_ms();
    for (int i = 0; i < FOLLOWERS; i++)
        while (atomic_load_explicit(&fol[i].received, memory_order_relaxed) < total &&
               pawl_test_now_ms() - t0 < 30000)
            usleep(10000);
    atomic_store(&followers_done, 1);
    for (int i = 0; i < FOLLOWERS; i++)
        pthread_join(tf[i], NULL);

    printf("committed events %lld, killed finalizer transactions %lld\n", (long long)total,
           (long long)atomic_load(&kills));
    /* The race this test promises happened: finalizer transactions were killed mid-way. */
    assert_true(atomic_load(&kills) > 0);
    assert_true(total > 1000);
    assert_true(total < MAX_EVENTS);
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl.events"), total);
    /* Contiguous and unique from 1. */
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl_api.events"), total);
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT count(DISTINCT global_index) FROM "
                                              "pawl_api.events"),
                     total);
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT min(global_index) FROM pawl_api.events"), 1);
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT max(global_index) FROM pawl_api.events"),
                     total);
    /* The ledger is seamless: each run starts where the previous ended. */
    assert_int_equal(
        pawl_test_query_i64(dsn, "SELECT count(*) FROM (SELECT first_index, lag(last_index) "
                                 "OVER (ORDER BY last_index) AS prev FROM pawl.runs) r "
                                 "WHERE prev IS NOT NULL AND first_index <> prev + 1"),
        0);
    /* Per stream, index order is sequence order, and sequences are 1..n without holes. */
    assert_int_equal(
        pawl_test_query_i64(dsn, "SELECT count(*) FROM (SELECT global_index, lag(global_index) "
                                 "OVER (PARTITION BY stream_id ORDER BY stream_seq) AS p "
                                 "FROM pawl_api.events) x WHERE p > global_index"),
        0);
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT count(*) FROM (SELECT stream_id, "
                                              "max(stream_seq) m, count(*) c FROM pawl.events "
                                              "GROUP BY stream_id) x WHERE m <> c"),
                     0);

    /* Every follower read exactly the log, once, in order. */
    PGconn *c = PQconnectdb(dsn);
    PGresult *r = PQexec(c, "SELECT global_index, stream_id, stream_seq FROM pawl_api.events "
                            "ORDER BY global_index");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(r), total);
    for (int i = 0; i < FOLLOWERS; i++) {
        if (!fol[i].ok)
            fail_msg("follower %d: %s", i, fol[i].fail);
        assert_int_equal(fol[i].received, total);
        assert_int_equal(fol[i].last, total);
        for (int row = 0; row < PQntuples(r); row++) {
            int64_t idx = strtoll(PQgetvalue(r, row, 0), NULL, 10);
            uint32_t h = ev_hash(PQgetvalue(r, row, 1), strtoll(PQgetvalue(r, row, 2), NULL, 10));
            if (fol[i].hash[idx] != h)
                fail_msg("follower %d: index %lld differs", i, (long long)idx);
        }
        free(fol[i].hash);
    }
    PQclear(r);
    PQfinish(c);

    struct pawl_store_stats st;
    pawl_store_stats(sa, &st, 0);
    printf("store A: %lld appends, finalize runs %lld (busy %lld), delay p50 %.2f ms p99 %.2f "
           "ms max %.2f ms\n",
           (long long)st.appends_ok, (long long)st.finalize_runs, (long long)st.finalize_busy,
           st.delay_p50_ms, st.delay_p99_ms, st.delay_max_ms);
    pawl_store_free(sa);
    pawl_store_free(sb);
}

int main(void)
{
    dsn = pawl_test_db_create("log_conc");
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_concurrent)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
