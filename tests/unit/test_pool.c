/*
 * test_pool.c — the work-stealing pool: submission from many outside threads, nested submission
 * from tasks, stealing (counted; a busy owner's children all taken by thieves in batches, each
 * exactly once, also when a thief's batch is stolen again from it), parking and prompt wake-up, and
 * shutdown with queued work (every task called exactly once, run or cancelled); the same for
 * batched submission, plus its argument checks, the injection queue's chain push (order and
 * contiguity under contention), outside threads' own rings (more threads than rings, threads
 * that exit with tasks queued, one thread and several pools, pools freed under a thread that
 * holds their rings), and the pass-on rule (short bursts are not spread by waking
 * parked workers; tasks that block get their queued neighbours shared).
 */
#include "pawl_test.h"
#include "runtime_test.h"

#include "mpsc.h"
#include "pool.h"

#include <stdlib.h>
#include <string.h>

struct counted {
    struct pawl_task task;
    uint64_t *runs;
    uint64_t *cancels;
    uint32_t calls;
};

static void counted_fn(struct pawl_task *t, int status)
{
    struct counted *c = (struct counted *)t;
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&c->calls), 1, memory_order_relaxed);
    if (status == 0)
        rt_inc(c->runs);
    else
        rt_inc(c->cancels);
}

static void test_defaults_and_current(void **state)
{
    struct pawl_pool_opts o;
    pawl_pool_opts_defaults(&o);
    assert_int_equal(o.workers, 0);
    struct pawl_pool *p;
    assert_int_equal(pawl_pool_new(&p, NULL), 0);
    assert_int_equal(pawl_pool_workers(p), (int)sysconf(_SC_NPROCESSORS_ONLN));
    assert_int_equal(pawl_pool_current_worker(), -1);
    assert_int_equal(pawl_pool_submit(p, NULL), PAWL_EINVAL);
    pawl_pool_free(p);
    pawl_pool_free(NULL);
    o.workers = -1;
    assert_int_equal(pawl_pool_new(&p, &o), PAWL_EINVAL);
}

struct whoami {
    struct pawl_task task;
    int worker;
    uint64_t done;
};

static void whoami_fn(struct pawl_task *t, int status)
{
    struct whoami *w = (struct whoami *)t;
    w->worker = pawl_pool_current_worker();
    atomic_store_explicit(PAWL_ATOMIC_OF(&w->done), 1, memory_order_release);
}

static void test_current_worker(void **state)
{
    struct pawl_pool_opts o = {.workers = 3};
    struct pawl_pool *p;
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    struct whoami w = {.task.fn = whoami_fn, .worker = -5};
    pawl_pool_submit(p, &w.task);
    assert_true(RT_WAIT_UNTIL(rt_load(&w.done), 10000));
    assert_true(w.worker >= 0 && w.worker < 3);
    pawl_pool_free(p);
}

struct producer {
    struct pawl_pool *pool;
    struct counted *tasks;
    int n;
};

static void *produce(void *arg)
{
    struct producer *pr = arg;
    for (int i = 0; i < pr->n; i++)
        assert_int_equal(pawl_pool_submit(pr->pool, &pr->tasks[i].task), 0);
    return NULL;
}

/*
 * P threads each submit n counted tasks from outside the pool through `produce_fn` (one by
 * one, or in batches); every task runs exactly once, all through the injection queue.
 */
static void run_producers(void *(*produce_fn)(void *), const char *what)
{
    enum { P = 4 };
    int n = PAWL_TEST_SCALE(50000);
    uint64_t runs = 0, cancels = 0;
    struct pawl_pool_opts o = {.workers = 2};
    struct pawl_pool *p;
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    struct counted *tasks = calloc((size_t)(P * n), sizeof(*tasks));
    for (int i = 0; i < P * n; i++)
        tasks[i] = (struct counted){.task.fn = counted_fn, .runs = &runs, .cancels = &cancels};
    pthread_t th[P];
    struct producer pr[P];
    for (int i = 0; i < P; i++) {
        pr[i] = (struct producer){p, tasks + i * n, n};
        pthread_create(&th[i], NULL, produce_fn, &pr[i]);
    }
    for (int i = 0; i < P; i++)
        pthread_join(th[i], NULL);
    assert_true(RT_WAIT_UNTIL(rt_load(&runs) == (uint64_t)(P * n), 60000));
    /* A worker counts a task as executed after its function returns, so the last count may
     * come a moment after the last run. */
    struct pawl_pool_stats st;
    assert_true(RT_WAIT_UNTIL((pawl_pool_stats(p, &st), st.executed >= (uint64_t)(P * n)), 10000));
    assert_int_equal(st.injected, P * n);
    print_message("%s: %d tasks, wakeups %llu, parks %llu\n", what, P * n,
                  (unsigned long long)st.wakeups, (unsigned long long)st.parks);
    pawl_pool_free(p);
    for (int i = 0; i < P * n; i++)
        assert_int_equal(tasks[i].calls, 1);
    assert_int_equal(cancels, 0);
    free(tasks);
}

static void test_many_producers(void **state)
{
    run_producers(produce, "outside, one by one");
}

/* Nested submission: each node submits two children until depth 0 (a binary tree). */
struct tree {
    struct pawl_task task;
    struct pawl_pool *pool;
    int depth;
    uint64_t *leaves;
    uint64_t *nodes;
};

static void tree_fn(struct pawl_task *t, int status)
{
    struct tree *n = (struct tree *)t;
    rt_inc(n->nodes);
    if (status == 0 && n->depth > 0) {
        for (int i = 0; i < 2; i++) {
            struct tree *c = malloc(sizeof(*c));
            *c = *n;
            c->depth = n->depth - 1;
            /* A little work, so that stealing pays off and actually happens. */
            pawl_pool_submit(n->pool, &c->task);
        }
    } else if (n->depth == 0) {
        volatile int spin = 0;
        for (int i = 0; i < 2000; i++)
            spin += i;
        rt_inc(n->leaves);
    }
    free(n);
}

static void test_nested_and_stealing(void **state)
{
    int depth = PAWL_TEST_SANITIZED ? 12 : 16;
    uint64_t leaves = 0, nodes = 0;
    struct pawl_pool_opts o = {.workers = 4};
    struct pawl_pool *p;
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    struct tree *root = malloc(sizeof(*root));
    *root = (struct tree){{tree_fn, NULL}, p, depth, &leaves, &nodes};
    pawl_pool_submit(p, &root->task);
    assert_true(RT_WAIT_UNTIL(rt_load(&leaves) == (1ull << depth), 60000));
    assert_true(RT_WAIT_UNTIL(rt_load(&nodes) == (2ull << depth) - 1, 10000));
    struct pawl_pool_stats st;
    pawl_pool_stats(p, &st);
    print_message("tree of %llu tasks: steals %llu, parks %llu, wakeups %llu\n",
                  (unsigned long long)nodes, (unsigned long long)st.steals,
                  (unsigned long long)st.parks, (unsigned long long)st.wakeups);
    assert_true(st.steals > 0);
    pawl_pool_free(p);
}

/*
 * A parent pushes n children into its own deque and stays busy until every child has run, so
 * thieves must take all of them: they steal in batches (into their own deques, where a third
 * worker may steal them again). Each child runs exactly once, never on the parent's worker.
 */
struct busy_parent {
    struct pawl_task task;
    struct pawl_pool *pool;
    struct whoami *kids;
    int n;
    int worker;
    uint64_t done;
};

static void busy_parent_fn(struct pawl_task *t, int status)
{
    struct busy_parent *b = (struct busy_parent *)t;
    b->worker = pawl_pool_current_worker();
    for (int i = 0; i < b->n; i++)
        pawl_pool_submit(b->pool, &b->kids[i].task);
    for (int i = 0; i < b->n; i++)
        while (!atomic_load_explicit(PAWL_ATOMIC_OF(&b->kids[i].done), memory_order_acquire))
            sched_yield();
    atomic_store_explicit(PAWL_ATOMIC_OF(&b->done), 1, memory_order_release);
}

static void busy_owner_round(int workers, int n)
{
    struct pawl_pool_opts o = {.workers = workers};
    struct pawl_pool *p;
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    struct whoami *kids = calloc((size_t)n, sizeof(*kids));
    for (int i = 0; i < n; i++)
        kids[i] = (struct whoami){{whoami_fn, NULL}, -1, 0};
    struct busy_parent b = {{busy_parent_fn, NULL}, p, kids, n, -1, 0};
    pawl_pool_submit(p, &b.task);
    assert_true(RT_WAIT_UNTIL(rt_load(&b.done) == 1, 60000));
    int per_worker[8] = {0};
    for (int i = 0; i < n; i++) {
        assert_true(kids[i].worker >= 0 && kids[i].worker < workers);
        assert_int_not_equal(kids[i].worker, b.worker);
        per_worker[kids[i].worker]++;
    }
    struct pawl_pool_stats st;
    pawl_pool_stats(p, &st);
    print_message("%d workers, %d children of a busy owner: steals %llu, per worker %d %d %d %d\n",
                  workers, n, (unsigned long long)st.steals, per_worker[0], per_worker[1],
                  per_worker[2], per_worker[3]);
    assert_true(st.steals >= (uint64_t)n);
    pawl_pool_free(p);
    free(kids);
}

static void test_busy_owner_batch_steals(void **state)
{
    int n = PAWL_TEST_SANITIZED ? 2000 : 20000;
    for (int round = 0; round < 5; round++) {
        busy_owner_round(2, n);
        busy_owner_round(4, n);
    }
}

/* Parking and prompt wake-up: after the pool has gone idle, one submission runs quickly. */
static void test_park_and_wake(void **state)
{
    uint64_t runs = 0, cancels = 0;
    struct pawl_pool_opts o = {.workers = 2};
    struct pawl_pool *p;
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    struct counted c = {.task.fn = counted_fn, .runs = &runs, .cancels = &cancels};
    int64_t worst = 0;
    for (int round = 0; round < 20; round++) {
        usleep(5000); /* let the workers park */
        int64_t t0 = rt_now_ms();
        c.calls = 0;
        pawl_pool_submit(p, &c.task);
        assert_true(RT_WAIT_UNTIL(rt_load(&runs) == (uint64_t)round + 1, 10000));
        if (rt_now_ms() - t0 > worst)
            worst = rt_now_ms() - t0;
    }
    struct pawl_pool_stats st;
    pawl_pool_stats(p, &st);
    print_message("20 wake-ups: worst %lld ms, parks %llu\n", (long long)worst,
                  (unsigned long long)st.parks);
    assert_true(st.parks > 0);
    assert_true(worst < 1000); /* generous: the machine is shared */
    pawl_pool_free(p);
}

/* Shutdown with queued work: a blocker holds the only worker while 1000 tasks queue up. */
static uint64_t release_blocker;

static void blocker_fn(struct pawl_task *t, int status)
{
    while (!atomic_load_explicit(PAWL_ATOMIC_OF(&release_blocker), memory_order_acquire))
        usleep(100);
    counted_fn(t, status);
}

static void *release_later(void *arg)
{
    usleep(50000);
    atomic_store_explicit(PAWL_ATOMIC_OF(&release_blocker), 1, memory_order_release);
    return NULL;
}

struct resubmitter {
    struct pawl_task task;
    struct pawl_pool *pool;
    struct counted *child;
    uint32_t calls;
};

static void resubmit_fn(struct pawl_task *t, int status)
{
    struct resubmitter *r = (struct resubmitter *)t;
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&r->calls), 1, memory_order_relaxed);
    assert_int_equal(status, PAWL_ECANCELED);
    pawl_pool_submit(r->pool, &r->child->task); /* submitted during shutdown: also cancelled */
}

static void test_shutdown_with_queued_work(void **state)
{
    enum { N = 1000 };
    uint64_t runs = 0, cancels = 0;
    struct pawl_pool_opts o = {.workers = 1};
    struct pawl_pool *p;
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    release_blocker = 0;
    struct counted blocker = {.task.fn = blocker_fn, .runs = &runs, .cancels = &cancels};
    pawl_pool_submit(p, &blocker.task);
    usleep(10000);
    struct counted *tasks = calloc(N, sizeof(*tasks));
    for (int i = 0; i < N; i++) {
        tasks[i] = (struct counted){.task.fn = counted_fn, .runs = &runs, .cancels = &cancels};
        pawl_pool_submit(p, &tasks[i].task);
    }
    struct counted child = {.task.fn = counted_fn, .runs = &runs, .cancels = &cancels};
    struct resubmitter rs = {.task.fn = resubmit_fn, .pool = p, .child = &child};
    pawl_pool_submit(p, &rs.task);
    pthread_t th;
    pthread_create(&th, NULL, release_later, NULL);
    pawl_pool_free(p); /* waits for the blocker, cancels the rest */
    pthread_join(th, NULL);
    assert_int_equal(blocker.calls, 1);
    for (int i = 0; i < N; i++)
        assert_int_equal(tasks[i].calls, 1);
    assert_int_equal(rs.calls, 1);
    assert_int_equal(child.calls, 1);
    assert_int_equal(runs + cancels, N + 2);
    print_message("shutdown: %llu ran, %llu cancelled\n", (unsigned long long)runs,
                  (unsigned long long)cancels);
    free(tasks);
}

/* ---- batched submission ---- */

/* The injection queue's chain push: producers push chains of 1..16 nodes at once while one
 * consumer pops; each producer's nodes arrive in order and a chain's nodes arrive together. */
struct cnode {
    void *link;
    int producer;
    int seq;
    int left; /* nodes of the same chain after this one */
};

struct chain_producer {
    struct pawl_mpsc_ *q;
    struct cnode *nodes;
    int id;
    int n;
};

static void *push_chains(void *arg)
{
    struct chain_producer *pr = arg;
    unsigned seed = (unsigned)pr->id + 1;
    for (int i = 0; i < pr->n;) {
        int k = 1 + rand_r(&seed) % 16;
        if (k > pr->n - i)
            k = pr->n - i;
        for (int j = 0; j < k; j++) {
            struct cnode *c = &pr->nodes[i + j];
            c->producer = pr->id;
            c->seq = i + j;
            c->left = k - 1 - j;
            if (j + 1 < k)
                atomic_store_explicit(PAWL_ATOMIC_OF(&c->link), (void *)&pr->nodes[i + j + 1].link,
                                      memory_order_relaxed);
        }
        pawl__mpsc_push_chain_mp(pr->q, &pr->nodes[i].link, &pr->nodes[i + k - 1].link);
        i += k;
    }
    return NULL;
}

static void test_mpsc_chains(void **state)
{
    enum { P = 4 };
    int n = PAWL_TEST_SCALE(200000);
    struct pawl_mpsc_ q;
    pawl__mpsc_init(&q);
    struct cnode *nodes = calloc((size_t)(P * n), sizeof(*nodes));
    struct chain_producer pr[P];
    pthread_t th[P];
    for (int i = 0; i < P; i++) {
        pr[i] = (struct chain_producer){&q, nodes + i * n, i, n};
        pthread_create(&th[i], NULL, push_chains, &pr[i]);
    }
    int next[P] = {0};
    int in_chain = -1; /* producer whose chain is being taken, or -1 */
    for (long got = 0; got < (long)P * n;) {
        void **link = pawl__mpsc_pop_sc(&q);
        if (link == NULL || link == PAWL_MPSC_BUSY) {
            sched_yield();
            continue;
        }
        struct cnode *c = PAWL_CONTAINER_OF(link, struct cnode, link);
        if (in_chain >= 0 && c->producer != in_chain)
            fail_msg("producer %d's node inside a chain of producer %d", c->producer, in_chain);
        if (c->seq != next[c->producer])
            fail_msg("producer %d: node %d after %d", c->producer, c->seq, next[c->producer] - 1);
        next[c->producer]++;
        in_chain = c->left > 0 ? c->producer : -1;
        got++;
    }
    for (int i = 0; i < P; i++)
        pthread_join(th[i], NULL);
    assert_null(pawl__mpsc_pop_sc(&q));
    free(nodes);
}

/* Every invalid call returns PAWL_EINVAL and queues nothing, from outside and from a worker. */
struct bad_batch {
    struct pawl_task task;
    struct pawl_pool *pool;
    struct counted *good;
    int rc[5];
    uint64_t done;
};

static void try_bad_batches(struct pawl_pool *p, struct counted *good, int rc[5])
{
    struct pawl_task *ok[2] = {&good[0].task, &good[1].task};
    struct pawl_task *with_null[3] = {&good[0].task, NULL, &good[1].task};
    struct pawl_task nofn = {NULL, NULL};
    struct pawl_task *with_nofn[3] = {&good[0].task, &good[1].task, &nofn};
    rc[0] = pawl_pool_submit_batch(NULL, ok, 2);
    rc[1] = pawl_pool_submit_batch(p, NULL, 2);
    rc[2] = pawl_pool_submit_batch(p, ok, 0);
    rc[3] = pawl_pool_submit_batch(p, with_null, 3);
    rc[4] = pawl_pool_submit_batch(p, with_nofn, 3);
}

static void bad_batch_fn(struct pawl_task *t, int status)
{
    struct bad_batch *b = (struct bad_batch *)t;
    try_bad_batches(b->pool, b->good, b->rc);
    atomic_store_explicit(PAWL_ATOMIC_OF(&b->done), 1, memory_order_release);
}

static void test_batch_invalid_arguments(void **state)
{
    uint64_t runs = 0, cancels = 0;
    struct pawl_pool_opts o = {.workers = 2};
    struct pawl_pool *p;
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    struct counted good[2];
    for (int i = 0; i < 2; i++)
        good[i] = (struct counted){.task.fn = counted_fn, .runs = &runs, .cancels = &cancels};
    int rc[5];
    try_bad_batches(p, good, rc);
    for (int i = 0; i < 5; i++)
        assert_int_equal(rc[i], PAWL_EINVAL);
    struct bad_batch b = {.task.fn = bad_batch_fn, .pool = p, .good = good};
    assert_int_equal(pawl_pool_submit(p, &b.task), 0);
    assert_true(RT_WAIT_UNTIL(rt_load(&b.done), 10000));
    for (int i = 0; i < 5; i++)
        assert_int_equal(b.rc[i], PAWL_EINVAL);
    usleep(20000);
    pawl_pool_free(p);
    /* Nothing was queued: neither run nor cancelled. */
    assert_int_equal(good[0].calls, 0);
    assert_int_equal(good[1].calls, 0);
    assert_int_equal(runs + cancels, 0);
}

/* Batches of every size from 1 to 67 from several outside threads: each task runs once. */
static void *produce_batches(void *arg)
{
    struct producer *pr = arg;
    struct pawl_task *arr[67];
    int size = 1;
    for (int i = 0; i < pr->n;) {
        int k = size < pr->n - i ? size : pr->n - i;
        for (int j = 0; j < k; j++)
            arr[j] = &pr->tasks[i + j].task;
        assert_int_equal(pawl_pool_submit_batch(pr->pool, arr, (size_t)k), 0);
        i += k;
        size = size % 67 + 1;
    }
    return NULL;
}

static void test_batch_from_outside(void **state)
{
    run_producers(produce_batches, "outside batches");
}

/*
 * More outside submissions than the injection ring holds (16384 slots) while every worker is
 * blocked: the rest goes to the linked list, and both are drained, in a run and in a shutdown.
 * Two threads submit, one task at a time and in batches of 1..67.
 */
enum { OVERFLOW_N = 3 * 16384 + 7 };

/* Occupy both workers of p with blocker_fn tasks (until release_blocker is set), so that every
 * later task waits in the ring or the list. */
static void block_workers(struct pawl_pool *p, struct counted blockers[2], uint64_t *runs,
                          uint64_t *cancels)
{
    release_blocker = 0;
    for (int i = 0; i < 2; i++) {
        blockers[i] = (struct counted){.task.fn = blocker_fn, .runs = runs, .cancels = cancels};
        pawl_pool_submit(p, &blockers[i].task);
    }
    usleep(20000); /* both blockers taken */
}

/* A two-worker pool whose workers are both blocked, and n counted tasks not yet submitted. */
struct blocked {
    uint64_t runs, cancels;
    struct pawl_pool *p;
    struct counted blockers[2];
    struct counted *tasks;
    int n;
};

static void blocked_pool(struct blocked *b, int n)
{
    struct pawl_pool_opts o = {.workers = 2};
    b->runs = b->cancels = 0;
    b->n = n;
    assert_int_equal(pawl_pool_new(&b->p, &o), 0);
    block_workers(b->p, b->blockers, &b->runs, &b->cancels);
    b->tasks = calloc((size_t)n, sizeof(*b->tasks));
    assert_non_null(b->tasks);
    for (int i = 0; i < n; i++)
        b->tasks[i] =
            (struct counted){.task.fn = counted_fn, .runs = &b->runs, .cancels = &b->cancels};
}

/*
 * Let the blocked workers go (release_later), let everything run (or, with shutdown, free the
 * pool at once), and check that each task was called exactly once, run or cancelled, besides
 * the two blockers. Frees the pool and the tasks.
 */
static void release_and_check(struct blocked *b, int shutdown, const char *what)
{
    pthread_t rel;
    pthread_create(&rel, NULL, release_later, NULL);
    if (!shutdown)
        assert_true(RT_WAIT_UNTIL(rt_load(&b->runs) == (uint64_t)b->n + 2, 30000));
    pawl_pool_free(b->p);
    pthread_join(rel, NULL);
    for (int i = 0; i < b->n; i++)
        if (b->tasks[i].calls != 1)
            fail_msg("task %d called %u times", i, b->tasks[i].calls);
    assert_int_equal(b->runs + b->cancels, b->n + 2);
    if (!shutdown)
        assert_int_equal(b->cancels, 0);
    print_message("%s%s: %llu ran, %llu cancelled\n", what, shutdown ? " (shutdown)" : "",
                  (unsigned long long)b->runs, (unsigned long long)b->cancels);
    free(b->tasks);
}

static void injection_overflow(int shutdown)
{
    struct blocked b;
    blocked_pool(&b, OVERFLOW_N);
    struct producer pr[2] = {{b.p, b.tasks, OVERFLOW_N / 2},
                             {b.p, b.tasks + OVERFLOW_N / 2, OVERFLOW_N - OVERFLOW_N / 2}};
    pthread_t th[2];
    pthread_create(&th[0], NULL, produce, &pr[0]);
    pthread_create(&th[1], NULL, produce_batches, &pr[1]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    release_and_check(&b, shutdown, "injection overflow");
}

static void test_injection_overflow(void **state)
{
    injection_overflow(0);
    injection_overflow(1);
}

/*
 * A submitter remembers how far the consumer of a pool's ring has got; a pool created after
 * another (often at the same address) must not inherit that. This thread first puts batches
 * through one pool's ring while its workers run them, then through a new pool's while both of
 * its workers are blocked: the new ring fills at once and the rest must take the list, so a
 * remembered position from the first pool would overwrite queued tasks. Every task runs once.
 */
static void ring_batches(struct pawl_pool *p, struct counted *tasks, int n, uint64_t *runs,
                         uint64_t *cancels)
{
    enum { B = 50 };
    for (int i = 0; i < n; i++)
        tasks[i] = (struct counted){.task.fn = counted_fn, .runs = runs, .cancels = cancels};
    for (int i = 0; i < n; i += B) {
        struct pawl_task *arr[B];
        int k = n - i < B ? n - i : B;
        for (int j = 0; j < k; j++)
            arr[j] = &tasks[i + j].task;
        assert_int_equal(pawl_pool_submit_batch(p, arr, (size_t)k), 0);
    }
}

static void test_ring_across_pools(void **state)
{
    struct counted *tasks = calloc(OVERFLOW_N, sizeof(*tasks));
    uint64_t runs = 0, cancels = 0;
    struct pawl_pool_opts o = {.workers = 2};
    struct pawl_pool *p;
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    ring_batches(p, tasks, OVERFLOW_N, &runs, &cancels);
    assert_true(RT_WAIT_UNTIL(rt_load(&runs) == OVERFLOW_N, 20000));
    pawl_pool_free(p);
    runs = 0;
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    struct counted blockers[2];
    block_workers(p, blockers, &runs, &cancels);
    ring_batches(p, tasks, OVERFLOW_N, &runs, &cancels);
    atomic_store_explicit(PAWL_ATOMIC_OF(&release_blocker), 1, memory_order_release);
    assert_true(RT_WAIT_UNTIL(rt_load(&runs) == OVERFLOW_N + 2, 20000));
    pawl_pool_free(p);
    for (int i = 0; i < OVERFLOW_N; i++)
        if (tasks[i].calls != 1)
            fail_msg("task %d called %u times", i, tasks[i].calls);
    assert_int_equal(cancels, 0);
    free(tasks);
}

/* ---- producer rings: one per outside thread and pool (pool_submit.c, spsc_push_sp) ---- */

/* More outside threads than a pool has rings for (16), one in six submitting more tasks than a
 * ring holds (16384), one at a time; every thread of each wave exits with its tasks still queued
 * (every worker is blocked), so that the next wave adopts rings that are not empty. */
enum { RING_THREADS = 24, RING_SOME = 1500, RING_MANY = 16384 + 700 };
enum { RING_WAVE = RING_THREADS / 6 * RING_MANY + (RING_THREADS - RING_THREADS / 6) * RING_SOME };

static void rings_wave(struct pawl_pool *p, struct counted *tasks)
{
    pthread_t th[RING_THREADS];
    struct producer pr[RING_THREADS];
    for (int i = 0, at = 0; i < RING_THREADS; i++) {
        int n = i % 6 == 0 ? RING_MANY : RING_SOME;
        pr[i] = (struct producer){p, tasks + at, n};
        at += n;
        pthread_create(&th[i], NULL, produce, &pr[i]);
    }
    for (int i = 0; i < RING_THREADS; i++)
        pthread_join(th[i], NULL);
}

static void rings_threads(int shutdown)
{
    enum { WAVES = 2, N = WAVES * RING_WAVE };
    struct blocked b;
    blocked_pool(&b, N);
    for (int w = 0; w < WAVES; w++)
        rings_wave(b.p, b.tasks + w * RING_WAVE);
    assert_int_equal(rt_load(&b.runs), 0);
    release_and_check(&b, shutdown, "rings, threads exiting with queued tasks");
}

static void test_rings_threads_exit_with_queued_tasks(void **state)
{
    rings_threads(0);
    rings_threads(1);
}

/* A task that must run on a worker of one particular pool. */
struct placed {
    struct pawl_task task;
    struct pawl_pool *pool;
    uint32_t calls;
    uint32_t wrong;
    uint64_t *runs;
};

static void placed_fn(struct pawl_task *t, int status)
{
    struct placed *x = (struct placed *)t;
    if (status == 0 && pawl__pool_current() != x->pool)
        atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&x->wrong), 1, memory_order_relaxed);
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&x->calls), 1, memory_order_relaxed);
    rt_inc(x->runs);
}

/* Submit n placed tasks round-robin to pools[0..np) from this thread; wait until all ran. */
static void placed_round(struct pawl_pool **pools, int np, struct placed *xs, int n, uint64_t *runs)
{
    uint64_t want = rt_load(runs) + (uint64_t)n;
    for (int i = 0; i < n; i++) {
        xs[i] = (struct placed){.task.fn = placed_fn, .pool = pools[i % np], .runs = runs};
        assert_int_equal(pawl_pool_submit(xs[i].pool, &xs[i].task), 0);
    }
    assert_true(RT_WAIT_UNTIL(rt_load(runs) >= want, 20000));
    for (int i = 0; i < n; i++) {
        if (xs[i].calls != 1 || xs[i].wrong != 0)
            fail_msg("task %d: called %u times, %u on the wrong pool", i, xs[i].calls, xs[i].wrong);
    }
}

struct pools_user {
    struct pawl_pool **pools;
    int np;
    struct placed *xs;
    int n;
    uint64_t *runs;
    uint32_t go_on; /* set by the test: submit the second round, then exit */
};

static void *pools_user_main(void *arg)
{
    struct pools_user *u = arg;
    placed_round(u->pools, u->np, u->xs, u->n, u->runs);
    while (!atomic_load_explicit(PAWL_ATOMIC_OF(&u->go_on), memory_order_acquire))
        usleep(1000);
    placed_round(u->pools + u->np, u->np, u->xs, u->n, u->runs);
    return NULL; /* exits holding rings of pools freed meanwhile and of live ones */
}

/*
 * One outside thread submitting to several pools: two, then six (more than the four whose rings
 * a thread keeps at hand, so rings are given back and adopted again as it goes round). Then the
 * pools are freed and new ones made (often at the same addresses) while a second thread still
 * holds rings of the freed ones: its submissions must reach the new pools, through new rings,
 * and its exit must leave the freed rings alone (ASan checks). Each task runs once, on its pool.
 */
static void test_rings_several_pools(void **state)
{
    enum { NP = 6, N = 6000 };
    struct pawl_pool_opts o = {.workers = 1};
    struct pawl_pool *pools[2 * NP];
    for (int i = 0; i < NP; i++)
        assert_int_equal(pawl_pool_new(&pools[i], &o), 0);
    struct placed *xs = calloc(N, sizeof(*xs));
    uint64_t runs = 0;
    placed_round(pools, 2, xs, N, &runs);
    placed_round(pools, NP, xs, N, &runs);
    struct placed *ys = calloc(N, sizeof(*ys));
    uint64_t yruns = 0;
    struct pools_user u = {pools, NP, ys, N, &yruns, 0};
    pthread_t th;
    pthread_create(&th, NULL, pools_user_main, &u);
    assert_true(RT_WAIT_UNTIL(rt_load(&yruns) == N, 20000));
    for (int i = 0; i < NP; i++)
        pawl_pool_free(pools[i]);
    for (int i = 0; i < NP; i++)
        assert_int_equal(pawl_pool_new(&pools[NP + i], &o), 0);
    atomic_store_explicit(PAWL_ATOMIC_OF(&u.go_on), 1, memory_order_release);
    placed_round(pools + NP, NP, xs, N, &runs);
    pthread_join(th, NULL);
    assert_int_equal(yruns, 2 * N);
    for (int i = 0; i < NP; i++)
        pawl_pool_free(pools[NP + i]);
    free(xs);
    free(ys);
}

/* From a worker: a task submits its children as one batch (large enough to grow a deque that
 * starts with 2 slots), and each child fans out a small batch of its own. */
struct bnode {
    struct pawl_task task;
    struct pawl_pool *pool;
    struct bnode *kids;
    int nkids;
    int status;
    uint32_t calls;
    uint64_t *ran, *cancelled;
};

static void bnode_fn(struct pawl_task *t, int status)
{
    struct bnode *b = (struct bnode *)t;
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&b->calls), 1, memory_order_relaxed);
    b->status = status;
    /* Read what we need of b before counting it: once the count is complete the test frees
     * the tree (the children cannot have run before we submit them, so their count waits). */
    struct bnode *kids = b->kids;
    int nkids = b->nkids;
    struct pawl_pool *pool = b->pool;
    rt_inc(status == 0 ? b->ran : b->cancelled);
    if (status != 0 || nkids == 0)
        return;
    struct pawl_task **arr = malloc((size_t)nkids * sizeof(*arr));
    for (int i = 0; i < nkids; i++)
        arr[i] = &kids[i].task;
    assert_int_equal(pawl_pool_submit_batch(pool, arr, (size_t)nkids), 0);
    free(arr); /* borrowed for the call only */
}

/* A root with `fan` children, each with `fan2` grandchildren; returns the node count. */
static int bnode_tree(struct bnode **out, struct pawl_pool *p, int fan, int fan2, uint64_t *ran,
                      uint64_t *cancelled)
{
    int total = 1 + fan + fan * fan2;
    struct bnode *all = calloc((size_t)total, sizeof(*all));
    for (int i = 0; i < total; i++)
        all[i] = (struct bnode){.task.fn = bnode_fn, .pool = p, .ran = ran, .cancelled = cancelled};
    all[0].kids = &all[1];
    all[0].nkids = fan;
    for (int i = 0; i < fan; i++) {
        all[1 + i].kids = &all[1 + fan + i * fan2];
        all[1 + i].nkids = fan2;
    }
    *out = all;
    return total;
}

static void test_batch_from_inside(void **state)
{
    uint64_t ran = 0, cancelled = 0;
    struct pawl_pool_opts o = {.workers = 3, .deque_capacity = 2};
    struct pawl_pool *p;
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    int rounds = PAWL_TEST_SANITIZED ? 3 : 20;
    for (int r = 0; r < rounds; r++) {
        struct bnode *all;
        int total = bnode_tree(&all, p, 5000, 3, &ran, &cancelled);
        uint64_t base = rt_load(&ran);
        assert_int_equal(pawl_pool_submit(p, &all[0].task), 0);
        assert_true(RT_WAIT_UNTIL(rt_load(&ran) == base + (uint64_t)total, 60000));
        for (int i = 0; i < total; i++)
            assert_int_equal(all[i].calls, 1);
        free(all);
    }
    struct pawl_pool_stats st;
    pawl_pool_stats(p, &st);
    print_message("inside batches: steals %llu, wakeups %llu\n", (unsigned long long)st.steals,
                  (unsigned long long)st.wakeups);
    assert_int_equal(st.injected, rounds); /* only the roots came from outside */
    pawl_pool_free(p);
    assert_int_equal(cancelled, 0);
}

/* With one worker a batch from inside runs in the order the same submissions one by one would
 * (the owner pops its deque LIFO). */
struct ordered {
    struct pawl_task task;
    int id;
    int *log;
    uint64_t *n;
};

static void ordered_fn(struct pawl_task *t, int status)
{
    struct ordered *o = (struct ordered *)t;
    o->log[rt_load(o->n)] = o->id; /* one worker: no race */
    rt_inc(o->n);
}

struct order_root {
    struct pawl_task task;
    struct pawl_pool *pool;
    struct ordered *kids;
    int batch;
};

static void order_root_fn(struct pawl_task *t, int status)
{
    struct order_root *r = (struct order_root *)t;
    struct pawl_task *arr[8];
    for (int i = 0; i < 8; i++)
        arr[i] = &r->kids[i].task;
    if (r->batch)
        pawl_pool_submit_batch(r->pool, arr, 8);
    else
        for (int i = 0; i < 8; i++)
            pawl_pool_submit(r->pool, arr[i]);
}

static void test_batch_inside_order(void **state)
{
    struct pawl_pool_opts o = {.workers = 1};
    struct pawl_pool *p;
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    int log[2][8];
    for (int b = 0; b < 2; b++) {
        uint64_t n = 0;
        struct ordered kids[8];
        for (int i = 0; i < 8; i++)
            kids[i] = (struct ordered){{ordered_fn, NULL}, i, log[b], &n};
        struct order_root root = {{order_root_fn, NULL}, p, kids, b};
        pawl_pool_submit(p, &root.task);
        assert_true(RT_WAIT_UNTIL(rt_load(&n) == 8, 10000));
    }
    assert_memory_equal(log[0], log[1], sizeof log[0]);
    pawl_pool_free(p);
}

/* Shutdown with batches queued from outside, a batch submitted from inside by a task that is
 * still running when shutdown starts, and batches submitted by cancelled tasks: each task is
 * called exactly once. */
struct batch_blocker {
    struct pawl_task task;
    struct pawl_pool *pool;
    struct counted *kids;
    uint32_t calls;
};

static void batch_blocker_fn(struct pawl_task *t, int status)
{
    struct batch_blocker *b = (struct batch_blocker *)t;
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&b->calls), 1, memory_order_relaxed);
    while (!atomic_load_explicit(PAWL_ATOMIC_OF(&release_blocker), memory_order_acquire))
        usleep(100);
    /* From inside, after shutdown began: onto our deque, cancelled by pawl_pool_free. */
    struct pawl_task *arr[10];
    for (int i = 0; i < 10; i++)
        arr[i] = &b->kids[i].task;
    assert_int_equal(pawl_pool_submit_batch(b->pool, arr, 10), 0);
}

struct batch_resubmitter {
    struct pawl_task task;
    struct pawl_pool *pool;
    struct counted *kids;
    uint32_t calls;
};

static void batch_resubmit_fn(struct pawl_task *t, int status)
{
    struct batch_resubmitter *r = (struct batch_resubmitter *)t;
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&r->calls), 1, memory_order_relaxed);
    assert_int_equal(status, PAWL_ECANCELED);
    struct pawl_task *arr[5];
    for (int i = 0; i < 5; i++)
        arr[i] = &r->kids[i].task;
    /* On the thread in pawl_pool_free: queued, then cancelled in a later round. */
    assert_int_equal(pawl_pool_submit_batch(r->pool, arr, 5), 0);
}

static void test_batch_shutdown(void **state)
{
    enum { N = 1000, B = 100 };
    uint64_t runs = 0, cancels = 0;
    struct pawl_pool_opts o = {.workers = 1};
    struct pawl_pool *p;
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    release_blocker = 0;
    struct counted inner[10];
    for (int i = 0; i < 10; i++)
        inner[i] = (struct counted){.task.fn = counted_fn, .runs = &runs, .cancels = &cancels};
    struct batch_blocker blocker = {.task.fn = batch_blocker_fn, .pool = p, .kids = inner};
    pawl_pool_submit(p, &blocker.task);
    usleep(10000);
    struct counted *tasks = calloc(N, sizeof(*tasks));
    struct pawl_task *arr[B];
    for (int i = 0; i < N; i++) {
        tasks[i] = (struct counted){.task.fn = counted_fn, .runs = &runs, .cancels = &cancels};
        arr[i % B] = &tasks[i].task;
        if (i % B == B - 1)
            assert_int_equal(pawl_pool_submit_batch(p, arr, B), 0);
    }
    struct counted later[5];
    for (int i = 0; i < 5; i++)
        later[i] = (struct counted){.task.fn = counted_fn, .runs = &runs, .cancels = &cancels};
    struct batch_resubmitter rs = {.task.fn = batch_resubmit_fn, .pool = p, .kids = later};
    pawl_pool_submit(p, &rs.task);
    pthread_t th;
    pthread_create(&th, NULL, release_later, NULL);
    pawl_pool_free(p); /* waits for the blocker, cancels the rest */
    pthread_join(th, NULL);
    assert_int_equal(blocker.calls, 1);
    assert_int_equal(rs.calls, 1);
    for (int i = 0; i < N; i++)
        assert_int_equal(tasks[i].calls, 1);
    for (int i = 0; i < 10; i++)
        assert_int_equal(inner[i].calls, 1);
    for (int i = 0; i < 5; i++)
        assert_int_equal(later[i].calls, 1);
    assert_int_equal(runs + cancels, N + 15);
    print_message("batch shutdown: %llu ran, %llu cancelled\n", (unsigned long long)runs,
                  (unsigned long long)cancels);
    free(tasks);
}

/* Allocator hooks: everything the runtime allocates goes through them and is given back. */
static uint64_t n_alloc, n_free;

static void *count_malloc(size_t n)
{
    rt_inc(&n_alloc);
    return malloc(n);
}

static void *count_calloc(size_t n, size_t size)
{
    rt_inc(&n_alloc);
    return calloc(n, size);
}

static void *count_realloc(void *p, size_t n)
{
    if (p == NULL)
        rt_inc(&n_alloc);
    return realloc(p, n);
}

static void count_free(void *p)
{
    if (p)
        rt_inc(&n_free);
    free(p);
}

static void note_cb(void *arg, struct pawl_future *f)
{
    rt_inc(arg);
}

static void test_allocator_hooks(void **state)
{
    struct pawl_allocator a = {count_malloc, count_calloc, count_realloc, count_free};
    pawl_set_allocator(&a);
    struct pawl_pool *p;
    struct pawl_pool_opts o = {.workers = 2};
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    struct pawl_timers *tm;
    assert_int_equal(pawl_timers_new(&tm, p, NULL), 0);
    uint64_t ran = 0;
    for (int i = 0; i < 100; i++) {
        struct pawl_future *f = pawl_future_new();
        struct pawl_future *g = pawl_future_or_timeout(f, tm, i % 2 ? 0 : 1000);
        pawl_future_on_complete(g, NULL, p, note_cb, &ran);
        pawl_future_on_complete(g, NULL, p, note_cb, &ran); /* second record: allocated */
        pawl_future_fail(f, PAWL_EHANDLER, "with a message");
        pawl_future_unref(f);
        pawl_future_unref(g);
    }
    assert_true(RT_WAIT_UNTIL(rt_load(&ran) == 200, 10000));
    assert_true(RT_WAIT_UNTIL(pawl_timers_armed(tm) == 0, 10000));
    pawl_timers_free(tm);
    pawl_pool_free(p);
    struct pawl_allocator libc = {malloc, calloc, realloc, free};
    pawl_set_allocator(&libc);
    print_message("allocations %llu, frees %llu\n", (unsigned long long)n_alloc,
                  (unsigned long long)n_free);
    assert_true(n_alloc > 300);
    assert_int_equal(n_alloc, n_free);
}

/*
 * The pass-on rule (pool_worker.c, worth_waking): a burst of a few short tasks submitted from
 * outside is run by the worker it wakes, which does not wake a second worker for the rest; tasks
 * that block, by saying so (pawl_pool_will_block) or by being slow, get their queued neighbours
 * shared with a parked worker.
 */
static uint32_t meet_in;
static uint32_t meet_ok;

/* Both tasks of a pair must be running at once: each waits (up to 3 s) for the other. */
static void meet_wait(void)
{
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&meet_in), 1, memory_order_acq_rel);
    int64_t deadline = rt_now_ms() + 3000;
    while (atomic_load_explicit(PAWL_ATOMIC_OF(&meet_in), memory_order_acquire) < 2 &&
           rt_now_ms() < deadline)
        usleep(200);
    if (atomic_load_explicit(PAWL_ATOMIC_OF(&meet_in), memory_order_acquire) >= 2)
        atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&meet_ok), 1, memory_order_acq_rel);
}

static void meet_hinted_fn(struct pawl_task *t, int status)
{
    pawl_pool_will_block(); /* about to wait: share what is queued */
    meet_wait();
    counted_fn(t, status);
}

static void meet_silent_fn(struct pawl_task *t, int status)
{
    meet_wait();
    counted_fn(t, status);
}

static void slow_fn(struct pawl_task *t, int status)
{
    usleep(20000); /* slow, and it does not say so */
    counted_fn(t, status);
}

/* Submit n counted tasks from outside in one batch and wait until they ran. */
static void burst(struct pawl_pool *p, struct counted *c, int n, uint64_t *runs)
{
    struct pawl_task *ts[8];
    uint64_t want = rt_load(runs) + (uint64_t)n;
    for (int i = 0; i < n; i++)
        ts[i] = &c[i].task;
    assert_int_equal(pawl_pool_submit_batch(p, ts, (size_t)n), 0);
    assert_true(RT_WAIT_UNTIL(rt_load(runs) >= want, 10000));
}

static void test_pass_on_rule(void **state)
{
    uint64_t runs = 0, cancels = 0;
    struct pawl_pool_opts o = {.workers = 2};
    struct pawl_pool *p;
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    struct counted c[4];
    for (int i = 0; i < 4; i++)
        c[i] = (struct counted){.task.fn = counted_fn, .runs = &runs, .cancels = &cancels};

    /* The workers learn that these tasks are short (they start out eager). */
    for (int i = 0; i < 60; i++) {
        usleep(2000); /* the workers park between bursts */
        burst(p, c, 4, &runs);
    }
    struct pawl_pool_stats a, b;
    pawl_pool_stats(p, &a);
    const int bursts = 40;
    for (int i = 0; i < bursts; i++) {
        usleep(2000);
        burst(p, c, 4, &runs);
    }
    pawl_pool_stats(p, &b);
    uint64_t wakeups = b.wakeups - a.wakeups, kept = b.kept - a.kept;
    print_message("%d bursts of 4 short tasks: %llu wake-ups, kept %llu times\n", bursts,
                  (unsigned long long)wakeups, (unsigned long long)kept);
    /* One wake-up per burst (the submitter's), where passing on would be two; slack for a
     * burst preempted past the keeping limit on a busy machine. */
    assert_true(wakeups <= (uint64_t)bursts * 3 / 2);
    assert_true(kept >= (uint64_t)bursts / 2);

    /* Two tasks of one burst that wait for each other, saying so: the one that runs first
     * shares the other before it waits. */
    c[0].task.fn = meet_hinted_fn;
    c[1].task.fn = meet_hinted_fn;
    meet_in = meet_ok = 0;
    usleep(2000);
    burst(p, c, 2, &runs);
    assert_int_equal(atomic_load_explicit(PAWL_ATOMIC_OF(&meet_ok), memory_order_acquire), 2);

    /* Silent waiters behind a slow task: the worker that kept them sees its queue not
     * shrinking once the slow task is done and wakes a helper, so they still meet. */
    for (int i = 0; i < 60; i++) { /* short again */
        c[0].task.fn = c[1].task.fn = counted_fn;
        usleep(2000);
        burst(p, c, 4, &runs);
    }
    c[0].task.fn = slow_fn;
    c[1].task.fn = meet_silent_fn;
    c[2].task.fn = meet_silent_fn;
    meet_in = meet_ok = 0;
    usleep(2000);
    burst(p, c, 3, &runs);
    assert_int_equal(atomic_load_explicit(PAWL_ATOMIC_OF(&meet_ok), memory_order_acquire), 2);
    pawl_pool_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allocator_hooks),
        cmocka_unit_test(test_defaults_and_current),
        cmocka_unit_test(test_current_worker),
        cmocka_unit_test(test_many_producers),
        cmocka_unit_test(test_nested_and_stealing),
        cmocka_unit_test(test_busy_owner_batch_steals),
        cmocka_unit_test(test_park_and_wake),
        cmocka_unit_test(test_shutdown_with_queued_work),
        cmocka_unit_test(test_injection_overflow),
        cmocka_unit_test(test_ring_across_pools),
        cmocka_unit_test(test_rings_threads_exit_with_queued_tasks),
        cmocka_unit_test(test_rings_several_pools),
        cmocka_unit_test(test_mpsc_chains),
        cmocka_unit_test(test_batch_invalid_arguments),
        cmocka_unit_test(test_batch_from_outside),
        cmocka_unit_test(test_batch_from_inside),
        cmocka_unit_test(test_batch_inside_order),
        cmocka_unit_test(test_batch_shutdown),
        cmocka_unit_test(test_pass_on_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
