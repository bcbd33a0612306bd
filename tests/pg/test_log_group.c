/*
 * test_log_group.c — group append (concurrent appends combined into one transaction):
 *
 *   - order: a burst of async appends on one connection, grouped: appends to one stream get
 *     their numbers in submission order (explicit and ANY versions), an append whose stream is
 *     not at its expected version fails alone (the others of its group commit), and a group
 *     is one transaction of contiguous final indexes;
 *   - concurrent conflicts: many blocking callers on overlapping streams, explicit and ANY
 *     versions: every successful append present exactly once with the numbers it was told,
 *     every conflict absent and told to its caller only, streams gap-free, per-stream index
 *     order = sequence order after finalization;
 *   - server kills mid-group: connections terminated while groups are in flight: no
 *     duplicate, no partial append, every caller told committed or not committed (never
 *     unknown outcome: the server stays reachable, so every fate can be learned), and the
 *     store appends again afterwards;
 *   - shapes: one group statement carries appends of one to four events over one to three
 *     streams, with and without metadata: every event lands with the sequence number its caller
 *     was told, its own type, payload and metadata;
 *   - linger: with --append-group-linger-us an append waits for company, bounded.
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

static struct pawl_store *open_store(int conns)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.connections = conns;
    o.reconnect_min_ms = 20;
    o.reconnect_max_ms = 200;
    o.max_inflight_appends = 100000;
    struct pawl_store *s = NULL;
    char err[512];
    if (pawl_store_new(&s, dsn, &o, err, sizeof err) != 0)
        fail_msg("store: %s", err);
    return s;
}

struct outcome {
    atomic_int done;
    int rc;
    int64_t first_seq;
};

static void on_done(void *ud, const struct pawl_append_result *r)
{
    struct outcome *o = ud;
    o->rc = r->rc;
    o->first_seq = r->first_seq;
    atomic_store_explicit(&o->done, 1, memory_order_release);
}

/* Count of rows a query returns as one int64. */
static int64_t q(const char *sql)
{
    return pawl_test_query_i64(dsn, sql);
}

#define N_ORD 300

static void test_group_order(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1);
    static struct outcome out[N_ORD];
    int64_t seq_explicit = 0, n_any = 0, n_z = 0;
    for (int i = 0; i < N_ORD; i++) {
        struct pawl_event e = {.type = "t", .payload = "p", .payload_len = 1};
        char sid[32];
        if (i % 10 == 7) {
            /* Not at its expected version: fails alone. */
            snprintf(sid, sizeof sid, "ord-bad-%d", i);
            e.stream_seq = 5;
        } else if (i % 2 == 0) {
            snprintf(sid, sizeof sid, "ord-x");
            e.stream_seq = ++seq_explicit;
        } else {
            snprintf(sid, sizeof sid, "ord-any");
            n_any++;
        }
        e.stream_id = sid;
        /* Some appends also write a second stream (the group keeps submission order then). */
        struct pawl_event two[2] = {
            e, {.stream_id = "ord-z", .type = "t", .payload = "p", .payload_len = 1}};
        if (i % 10 == 3)
            n_z++;
        assert_int_equal(pawl_append_async(s, two, i % 10 == 3 ? 2 : 1, on_done, &out[i]), 0);
    }
    pawl_store_drain(s);
    int64_t want_x = 0, want_any = 0;
    for (int i = 0; i < N_ORD; i++) {
        assert_int_equal(atomic_load_explicit(&out[i].done, memory_order_acquire), 1);
        if (i % 10 == 7) {
            assert_int_equal(out[i].rc, PAWL_ECONFLICT);
        } else {
            assert_int_equal(out[i].rc, 0);
            /* Submission order: the i-th append to a stream got number i. */
            assert_int_equal(out[i].first_seq, i % 2 == 0 ? ++want_x : ++want_any);
        }
    }
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    print_message("order: %lld appends in %lld groups\n", (long long)st.append_groups_appends,
                  (long long)st.append_groups);
    assert_true(st.append_groups_appends >= N_ORD);
    assert_true(st.append_groups < st.append_groups_appends / 2); /* they were grouped */
    assert_int_equal(q("SELECT count(*) FROM pawl.events WHERE stream_id LIKE 'ord-bad-%'"), 0);
    assert_int_equal(q("SELECT count(*) FROM pawl.events WHERE stream_id = 'ord-x'"), want_x);
    assert_int_equal(q("SELECT count(*) FROM pawl.events WHERE stream_id = 'ord-any'"), n_any);
    assert_int_equal(q("SELECT count(*) FROM pawl.events WHERE stream_id = 'ord-z'"), n_z);
    /* Final: one transaction per group, contiguous indexes, per-stream order = index order. */
    int64_t total = q("SELECT count(*) FROM pawl.events");
    assert_int_equal(pawl_store_wait(s, total - 1, 10000), 0);
    assert_int_equal(q("SELECT count(*) FROM pawl_api.events"), total);
    assert_int_equal(q("SELECT max(global_index) - min(global_index) + 1 FROM pawl_api.events"),
                     total);
    assert_int_equal(q("SELECT count(*) FROM (SELECT stream_seq, lag(stream_seq) OVER "
                       "(PARTITION BY stream_id ORDER BY global_index) AS p FROM "
                       "pawl_api.events) x WHERE p IS NOT NULL AND stream_seq <> p + 1"),
                     0);
    pawl_store_free(s);
}

/* Every stream named LIKE pattern is gap-free from 1; once everything appended is final, per
 * stream index order = sequence order, and the log's indexes are contiguous. */
static void assert_streams_final(struct pawl_store *s, const char *pattern)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM (SELECT stream_id FROM pawl.events WHERE stream_id LIKE '%s' "
             "GROUP BY stream_id HAVING count(*) <> max(stream_seq) OR min(stream_seq) <> 1) x",
             pattern);
    assert_int_equal(q(sql), 0);
    int64_t total = q("SELECT count(*) FROM pawl.events");
    assert_int_equal(pawl_store_wait(s, total - 1, 10000), 0);
    assert_int_equal(q("SELECT count(*) FROM (SELECT stream_seq, lag(stream_seq) OVER "
                       "(PARTITION BY stream_id ORDER BY global_index) AS p FROM "
                       "pawl_api.events) x WHERE p IS NOT NULL AND stream_seq <> p + 1"),
                     0);
    assert_int_equal(q("SELECT max(global_index) - min(global_index) + 1 FROM pawl_api.events"),
                     total);
}

#define N_SH 240
#define SH_MAX 4

static struct sh_out {
    atomic_int done;
    int rc;
    int n;
    int64_t seqs[SH_MAX];
} sh_out[N_SH];

static void sh_done(void *ud, const struct pawl_append_result *r)
{
    struct sh_out *o = ud;
    o->rc = r->rc;
    for (int k = 0; k < o->n && r->rc == 0; k++)
        o->seqs[k] = r->seqs != NULL ? r->seqs[k] : -1;
    atomic_store_explicit(&o->done, 1, memory_order_release);
}

static void test_group_shapes(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1);
    static char sid[N_SH][SH_MAX][16], pay[N_SH][SH_MAX][24], meta[N_SH][SH_MAX][40];
    for (int i = 0; i < N_SH; i++) {
        struct pawl_event ev[SH_MAX];
        int n = 1 + i % SH_MAX, streams = 1 + (i / SH_MAX) % 3;
        for (int k = 0; k < n; k++) {
            /* Streams interleaved within the append: event k writes stream k % streams. */
            snprintf(sid[i][k], sizeof sid[i][k], "sh-%d", (i + k % streams) % 7);
            snprintf(pay[i][k], sizeof pay[i][k], "p%d-%d", i, k);
            snprintf(meta[i][k], sizeof meta[i][k], "{\"i\": %d, \"k\": %d}", i, k);
            ev[k] = (struct pawl_event){.stream_id = sid[i][k],
                                        .type = (i + k) % 2 ? "odd" : "even",
                                        .payload = pay[i][k],
                                        .payload_len = strlen(pay[i][k]),
                                        .metadata = (i + k) % 3 == 0 ? NULL : meta[i][k]};
        }
        sh_out[i].n = n;
        assert_int_equal(pawl_append_async(s, ev, (size_t)n, sh_done, &sh_out[i]), 0);
    }
    pawl_store_drain(s);
    PGconn *c = PQconnectdb(dsn);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    for (int i = 0; i < N_SH; i++) {
        assert_int_equal(atomic_load_explicit(&sh_out[i].done, memory_order_acquire), 1);
        assert_int_equal(sh_out[i].rc, 0);
        for (int k = 0; k < sh_out[i].n; k++) {
            char seq[24];
            snprintf(seq, sizeof seq, "%lld", (long long)sh_out[i].seqs[k]);
            const char *vals[2] = {sid[i][k], seq};
            PGresult *r = PQexecParams(c,
                                       "SELECT type, convert_from(payload, 'UTF8'), "
                                       "coalesce(metadata::text, 'none') FROM pawl.events "
                                       "WHERE stream_id = $1 AND stream_seq = $2::int8",
                                       2, NULL, vals, NULL, NULL, 0);
            assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
            assert_int_equal(PQntuples(r), 1);
            assert_string_equal(PQgetvalue(r, 0, 0), (i + k) % 2 ? "odd" : "even");
            assert_string_equal(PQgetvalue(r, 0, 1), pay[i][k]);
            assert_string_equal(PQgetvalue(r, 0, 2), (i + k) % 3 == 0 ? "none" : meta[i][k]);
            PQclear(r);
        }
    }
    PQfinish(c);
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    print_message("shapes: %lld appends in %lld groups\n", (long long)st.append_groups_appends,
                  (long long)st.append_groups);
    assert_true(st.append_groups < st.append_groups_appends / 2);
    assert_streams_final(s, "sh-%");
    pawl_store_free(s);
}

#define CC_THREADS 32
#define CC_EACH 120
#define CC_STREAMS 8

static struct pawl_store *cc_store;
static atomic_llong cc_head[CC_STREAMS]; /* a caller's (possibly stale) idea of each head */
static struct cc_rec {
    int rc;
    int stream, nev;
    int64_t first_seq;
} cc_out[CC_THREADS][CC_EACH];

static void *cc_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    unsigned seed = 7919u * (unsigned)t + 1;
    for (int i = 0; i < CC_EACH; i++) {
        int st = rand_r(&seed) % CC_STREAMS, nev = 1 + rand_r(&seed) % 3;
        int explicit_v = rand_r(&seed) % 2;
        char sid[32], pay[3][32];
        snprintf(sid, sizeof sid, "cc-%d", st);
        int64_t base = explicit_v ? atomic_load(&cc_head[st]) + 1 : 0;
        struct pawl_event ev[3];
        for (int k = 0; k < nev; k++) {
            snprintf(pay[k], sizeof pay[k], "t%d-%d-%d", t, i, k);
            ev[k] = (struct pawl_event){.stream_id = sid,
                                        .type = "t",
                                        .payload = pay[k],
                                        .payload_len = strlen(pay[k]),
                                        .stream_seq = explicit_v ? base + k : PAWL_SEQ_ANY};
        }
        struct pawl_append_result r;
        int rc = pawl_append(cc_store, ev, (size_t)nev, &r);
        cc_out[t][i] = (struct cc_rec){.rc = rc, .stream = st, .nev = nev, .first_seq = -1};
        if (rc == 0) {
            cc_out[t][i].first_seq = r.first_seq;
            long long h = atomic_load(&cc_head[st]);
            while (r.last_seq > h && !atomic_compare_exchange_weak(&cc_head[st], &h, r.last_seq))
                ;
        }
    }
    return NULL;
}

static void test_group_concurrent_conflicts(void **state)
{
    (void)state;
    cc_store = open_store(4);
    pthread_t th[CC_THREADS];
    for (int t = 0; t < CC_THREADS; t++)
        assert_int_equal(pthread_create(&th[t], NULL, cc_main, (void *)(intptr_t)t), 0);
    for (int t = 0; t < CC_THREADS; t++)
        pthread_join(th[t], NULL);

    /* Every event by payload: "t<thread>-<i>-<k>" -> its stream and number. */
    PGconn *c = PQconnectdb(dsn);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    PGresult *res = PQexec(c, "SELECT convert_from(payload, 'UTF8'), substr(stream_id, 4)::int,"
                              " stream_seq FROM pawl.events WHERE stream_id LIKE 'cc-%'");
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    static int seen[CC_THREADS][CC_EACH][3];
    static int64_t seen_seq[CC_THREADS][CC_EACH][3];
    static int seen_stream[CC_THREADS][CC_EACH][3];
    memset(seen, 0, sizeof seen);
    for (int r = 0; r < PQntuples(res); r++) {
        int t, i, k;
        assert_int_equal(sscanf(PQgetvalue(res, r, 0), "t%d-%d-%d", &t, &i, &k), 3);
        seen[t][i][k]++;
        seen_stream[t][i][k] = atoi(PQgetvalue(res, r, 1));
        seen_seq[t][i][k] = strtoll(PQgetvalue(res, r, 2), NULL, 10);
    }
    PQclear(res);
    PQfinish(c);
    int ok = 0, conflicts = 0;
    for (int t = 0; t < CC_THREADS; t++)
        for (int i = 0; i < CC_EACH; i++) {
            struct cc_rec *o = &cc_out[t][i];
            if (o->rc == 0) {
                ok++;
                for (int k = 0; k < o->nev; k++) {
                    assert_int_equal(seen[t][i][k], 1); /* present exactly once */
                    assert_int_equal(seen_stream[t][i][k], o->stream);
                    assert_int_equal(seen_seq[t][i][k], o->first_seq + k); /* as told */
                }
            } else {
                if (o->rc != PAWL_ECONFLICT)
                    fail_msg("append %d/%d: %s", t, i, pawl_errname(o->rc));
                conflicts++;
                for (int k = 0; k < o->nev; k++)
                    assert_int_equal(seen[t][i][k], 0); /* nothing written */
            }
        }
    struct pawl_store_stats st;
    pawl_store_stats(cc_store, &st, 0);
    print_message("concurrent: %d committed, %d conflicts; %lld appends in %lld groups, "
                  "%lld group retries\n",
                  ok, conflicts, (long long)st.append_groups_appends, (long long)st.append_groups,
                  (long long)st.append_retries);
    assert_true(ok > CC_THREADS * CC_EACH / 4);
    assert_true(conflicts > 0);
    assert_true(st.append_groups < st.append_groups_appends); /* some were grouped */
    assert_streams_final(cc_store, "cc-%");
    pawl_store_free(cc_store);
}

#define KILL_THREADS 16
#define KILL_MAX 4000

static struct pawl_store *k_store;
static atomic_int k_stop;
static struct k_rec {
    int rc;
    char msg[256];
} k_out[KILL_THREADS][KILL_MAX];
static int k_count[KILL_THREADS];

static void *kill_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    int i = 0;
    while (!atomic_load(&k_stop) && i < KILL_MAX) {
        char sid[32], pay[3][32];
        snprintf(sid, sizeof sid, "kill-%d", (t + i) % 4);
        struct pawl_event ev[3];
        for (int k = 0; k < 3; k++) {
            snprintf(pay[k], sizeof pay[k], "k%d-%d", t, i);
            ev[k] = (struct pawl_event){
                .stream_id = sid, .type = "t", .payload = pay[k], .payload_len = strlen(pay[k])};
        }
        struct pawl_append_result r;
        k_out[t][i].rc = pawl_append(k_store, ev, 3, &r);
        snprintf(k_out[t][i].msg, sizeof k_out[t][i].msg, "%s", r.message);
        i++;
    }
    k_count[t] = i;
    return NULL;
}

static void test_group_server_kill(void **state)
{
    (void)state;
    k_store = open_store(2);
    pthread_t th[KILL_THREADS];
    for (int t = 0; t < KILL_THREADS; t++)
        assert_int_equal(pthread_create(&th[t], NULL, kill_main, (void *)(intptr_t)t), 0);
    for (int round = 0; round < 4; round++) {
        usleep(400000);
        pawl_test_exec(dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE application_name = 'pawl' AND pid <> pg_backend_pid() "
                            "AND datname = current_database()");
    }
    usleep(400000);
    atomic_store(&k_stop, 1);
    for (int t = 0; t < KILL_THREADS; t++)
        pthread_join(th[t], NULL);

    PGconn *c = PQconnectdb(dsn);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    PGresult *res = PQexec(c, "SELECT convert_from(payload, 'UTF8'), count(*) FROM pawl.events "
                              "WHERE stream_id LIKE 'kill-%' GROUP BY 1");
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    static int present[KILL_THREADS][KILL_MAX];
    memset(present, 0, sizeof present);
    for (int r = 0; r < PQntuples(res); r++) {
        int t, i;
        assert_int_equal(sscanf(PQgetvalue(res, r, 0), "k%d-%d", &t, &i), 2);
        present[t][i] = atoi(PQgetvalue(res, r, 1));
    }
    PQclear(res);
    PQfinish(c);
    int ok = 0, lost = 0, doubt = 0;
    for (int t = 0; t < KILL_THREADS; t++)
        for (int i = 0; i < k_count[t]; i++) {
            int rc = k_out[t][i].rc, p = present[t][i];
            /* All three events or none: never a partial append, never a duplicate. */
            if (p != 0 && p != 3)
                fail_msg("append k%d-%d: %d events present", t, i, p);
            if (rc == 0) {
                ok++;
                assert_int_equal(p, 3);
            } else if (rc == PAWL_ECONN) {
                lost++;
                if (p != 0)
                    fail_msg("append k%d-%d reported not committed, present: %s", t, i,
                             k_out[t][i].msg);
            } else if (rc == PAWL_EINDOUBT) {
                doubt++;
                print_message("unknown outcome (present: %d): %s\n", p, k_out[t][i].msg);
            } else {
                fail_msg("append k%d-%d: %s: %s", t, i, pawl_errname(rc), k_out[t][i].msg);
            }
        }
    struct pawl_store_stats st;
    pawl_store_stats(k_store, &st, 0);
    print_message("kills: %d committed, %d not committed, %d unknown outcome; %lld appends in "
                  "%lld groups\n",
                  ok, lost, doubt, (long long)st.append_groups_appends,
                  (long long)st.append_groups);
    assert_true(ok > 0);
    /* The kills hit groups in flight (else this test proves nothing), and the server stayed
     * reachable: the store learned every cut-off commit's fate on a new connection, so none is
     * in doubt (README: PAWL_EINDOUBT only when the fate could not be learned). */
    assert_true(lost + doubt > 0);
    assert_int_equal(doubt, 0);
    assert_true(st.append_groups < st.append_groups_appends);
    /* Streams still gap-free; the store appends again and everything becomes final. */
    assert_int_equal(q("SELECT count(*) FROM (SELECT stream_id FROM pawl.events WHERE stream_id "
                       "LIKE 'kill-%' GROUP BY stream_id HAVING count(*) <> max(stream_seq)) x"),
                     0);
    struct pawl_event e = {
        .stream_id = "kill-after", .type = "t", .payload = "y", .payload_len = 1};
    assert_int_equal(pawl_append(k_store, &e, 1, NULL), 0);
    int64_t total = q("SELECT count(*) FROM pawl.events");
    assert_int_equal(pawl_store_wait(k_store, total - 1, 10000), 0);
    assert_int_equal(q("SELECT count(*) FROM pawl_api.events"), total);
    pawl_store_free(k_store);
}

/* --append-group-linger-us: an append that finds a connection free waits (at most that long)
 * for company; what arrives meanwhile joins its group. */
static void test_group_linger(void **state)
{
    (void)state;
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.connections = 1;
    o.append_group_linger_us = 50000;
    struct pawl_store *s = NULL;
    char err[512];
    if (pawl_store_new(&s, dsn, &o, err, sizeof err) != 0)
        fail_msg("store: %s", err);
    static struct outcome out[20];
    double t0 = pawl_test_now_ms();
    for (int i = 0; i < 20; i++) {
        struct pawl_event e = {
            .stream_id = "linger", .type = "t", .payload = "p", .payload_len = 1};
        assert_int_equal(pawl_append_async(s, &e, 1, on_done, &out[i]), 0);
    }
    pawl_store_drain(s);
    double took = pawl_test_now_ms() - t0;
    for (int i = 0; i < 20; i++) {
        assert_int_equal(out[i].rc, 0);
        assert_int_equal(out[i].first_seq, i + 1);
    }
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    print_message("linger: 20 appends in %lld groups, %.1f ms\n", (long long)st.append_groups,
                  took);
    assert_true(took >= 45.0);          /* the first append waited for company */
    assert_true(st.append_groups <= 2); /* and the others joined it */
    pawl_store_free(s);

    /* Out of range: refused, naming the option. */
    o.append_group_linger_us = 100001;
    assert_int_equal(pawl_store_new(&s, dsn, &o, err, sizeof err), PAWL_ERANGE);
    assert_non_null(strstr(err, "append_group_linger_us"));
    pawl_store_opts_defaults(&o);
    o.append_group_max = 0;
    assert_int_equal(pawl_store_new(&s, dsn, &o, err, sizeof err), PAWL_ERANGE);
    assert_non_null(strstr(err, "append_group_max"));
}

int main(void)
{
    dsn = pawl_test_db_create("log_group");
    char err[256];
    if (pawl_schema_migrate(dsn, err, sizeof err) != 0) {
        fprintf(stderr, "migrate: %s\n", err);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_order),       cmocka_unit_test(test_group_concurrent_conflicts),
        cmocka_unit_test(test_group_server_kill), cmocka_unit_test(test_group_shapes),
        cmocka_unit_test(test_group_linger),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
