/*
 * test_processor_stress.c — three nodes share an in-memory log and token store for a while
 * under chaos: claims stolen by a node that never extends, commits failing as if the
 * connection dropped, reads failing, handlers failing at random, segments split and merged,
 * nodes stopped and started again. Afterwards the exactly-once projection (applied in the batch
 * transaction, checked for order at every apply) must equal the log, stream by stream.
 *
 * Duration: PAWL_STRESS_SECONDS (default 8).
 */
#include "pawl_test.h"
#include "testctl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NSTREAMS 97
#define NODES 3

struct proj {
    pthread_mutex_t mu;
    int64_t count[NSTREAMS];
    int64_t last[NSTREAMS];
    int violations;
};

static struct proj proj = {.mu = PTHREAD_MUTEX_INITIALIZER};
static int64_t seqs[NSTREAMS];
static struct pawl_source *src;
static struct pawl_tokens *tok;
static _Atomic int stop_all;
static _Atomic int handler_fail_permille;

static int proj_exec(void *ud, const char *sql, int n, const char *const *v)
{
    (void)ud;
    (void)sql;
    (void)n;
    int s = atoi(v[0] + 2);
    int64_t seq = atoll(v[1]);
    pthread_mutex_lock(&proj.mu);
    if (seq != proj.last[s] + 1)
        proj.violations++;
    proj.last[s] = seq;
    proj.count[s]++;
    pthread_mutex_unlock(&proj.mu);
    return 0;
}

static int handle(void *self, struct pawl_event_ctx *ctx)
{
    (void)self;
    const struct pawl_event *e = pawl_ctx_event(ctx);
    /* A cheap thread-local generator: failures at random, rarely. */
    static _Thread_local uint64_t x = 0x9e3779b97f4a7c15u;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    if ((int)(x % 1000) < atomic_load(&handler_fail_permille))
        return PAWL_EHANDLER;
    char seq[32];
    snprintf(seq, sizeof seq, "%lld", (long long)e->stream_seq);
    const char *vals[2] = {e->stream_id, seq};
    return pawl_txn_exec(pawl_ctx_txn(ctx), "apply", 2, vals);
}

static void *load_main(void *arg)
{
    (void)arg;
    int rr = 0;
    while (!atomic_load(&stop_all)) {
        for (int i = 0; i < 20; i++) {
            int s = rr++ % NSTREAMS;
            char id[16];
            snprintf(id, sizeof id, "s-%d", s);
            struct pawl_event e = {.stream_id = id, .stream_seq = ++seqs[s], .type = "T"};
            assert_int_equal(pawl_source_mem_append(src, &e, 1), 0);
        }
        usleep(1000);
    }
    return NULL;
}

static struct pawl_processor *start_node(int i)
{
    static const char *names[NODES] = {"n0", "n1", "n2"};
    struct pawl_handler h = {"proj", NULL, handle, NULL};
    struct pawl_processor_opts o;
    pawl_processor_opts_defaults(&o);
    o.name = "stress";
    o.node_id = names[i];
    o.segments = 8;
    o.threads = 2;
    o.batch_size = 16;
    o.claim_timeout_ms = 400;
    o.claim_poll_ms = 20;
    o.backoff_min_ms = 20;
    o.backoff_max_ms = 160;
    o.read_ahead = 64;
    o.read_batch = 128;
    struct pawl_processor *p;
    assert_int_equal(pawl_processor_new(&p, &o, src, tok, &h, 1), 0);
    assert_int_equal(pawl_processor_start(p), 0);
    return p;
}

static int64_t total(void)
{
    int64_t t = 0;
    pthread_mutex_lock(&proj.mu);
    for (int s = 0; s < NSTREAMS; s++)
        t += proj.count[s];
    pthread_mutex_unlock(&proj.mu);
    return t;
}

static void test_chaos(void **state)
{
    (void)state;
    assert_int_equal(pawl_source_mem_new(&src), 0);
    assert_int_equal(pawl_tokens_mem_new(&tok), 0);
    pawl_tokens_mem_set_exec(tok, proj_exec, NULL);
    int seconds = getenv("PAWL_STRESS_SECONDS") ? atoi(getenv("PAWL_STRESS_SECONDS")) : 8;
    struct pawl_processor *nodes[NODES];
    for (int i = 0; i < NODES; i++)
        nodes[i] = start_node(i);
    pthread_t loader;
    pthread_create(&loader, NULL, load_main, NULL);
    atomic_store(&handler_fail_permille, 2);
    unsigned seed = 12345;
    int counts[8] = {0};
    double t0 = pawl_test_now_ms();
    while (pawl_test_now_ms() - t0 < seconds * 1000.0) {
        usleep(50000);
        int what = (int)(rand_r(&seed) % 8);
        struct pawl_segment_status *rows;
        size_t n;
        assert_int_equal(tok->ops->list(tok, "stress", &rows, &n), 0);
        uint32_t id = n ? rows[rand_r(&seed) % n].seg.id : 0;
        pawl_tokens_rows_free(rows);
        int node = (int)(rand_r(&seed) % NODES);
        switch (what) {
        case 0: /* a node that never extends takes a claim */
            pawl__test_control(PAWL_TESTCTL_TOKENS_MEM_STEAL, tok, "stress", id, "ghost");
            break;
        case 1: /* a commit fails as if the connection dropped */
            pawl__test_control(PAWL_TESTCTL_TOKENS_MEM_FAIL_COMMIT, tok,
                               1 + (int)(rand_r(&seed) % 5));
            break;
        case 2: /* reads fail */
            pawl__test_control(PAWL_TESTCTL_SOURCE_MEM_FAIL_READS, src,
                               1 + (int)(rand_r(&seed) % 3));
            break;
        case 3: /* split (refused or not found is fine) */
            if (n < 32)
                pawl_processor_split(nodes[node], id);
            break;
        case 4: /* merge */
            pawl_processor_merge(nodes[node], id);
            break;
        case 5: /* a node restarts */
            pawl_processor_free(nodes[node]);
            nodes[node] = start_node(node);
            break;
        default: /* calm */
            break;
        }
        counts[what]++;
    }
    atomic_store(&handler_fail_permille, 0);
    atomic_store(&stop_all, 1);
    pthread_join(loader, NULL);
    int64_t want = 0;
    for (int s = 0; s < NSTREAMS; s++)
        want += seqs[s];
    double t1 = pawl_test_now_ms();
    while (total() < want && pawl_test_now_ms() - t1 < 30000)
        usleep(10000);
    print_message("chaos: %d steals, %d commit faults, %d read faults, %d splits, %d merges, "
                  "%d restarts; %lld events\n",
                  counts[0], counts[1], counts[2], counts[3], counts[4], counts[5],
                  (long long)want);
    for (int i = 0; i < NODES; i++) {
        struct pawl_processor_stats st;
        pawl_processor_stats(nodes[i], &st);
        print_message("node %d: %llu events, %llu batches, %llu failures, %llu lost claims\n", i,
                      (unsigned long long)st.events, (unsigned long long)st.batches,
                      (unsigned long long)st.batch_failures, (unsigned long long)st.claims_lost);
        pawl_processor_free(nodes[i]);
    }
    pthread_mutex_lock(&proj.mu);
    for (int s = 0; s < NSTREAMS; s++)
        assert_int_equal(proj.count[s], seqs[s]);
    assert_int_equal(proj.violations, 0);
    pthread_mutex_unlock(&proj.mu);
    pawl_tokens_free(tok);
    pawl_source_free(src);
}

int main(void)
{
    pawl_log_set_level(PAWL_LOG_OFF);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_chaos)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
