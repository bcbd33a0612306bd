/*
 * test_pool.c — the work-stealing pool: submission from many outside threads, nested submission
 * from tasks, stealing (counted), parking and prompt wake-up, and shutdown with queued work
 * (every task called exactly once, run or cancelled).
 */
#include "pawl_test.h"
#include "runtime_test.h"

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
    __atomic_fetch_add(&c->calls, 1, __ATOMIC_RELAXED);
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
    __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
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

static void test_many_producers(void **state)
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
        pthread_create(&th[i], NULL, produce, &pr[i]);
    }
    for (int i = 0; i < P; i++)
        pthread_join(th[i], NULL);
    assert_true(RT_WAIT_UNTIL(rt_load(&runs) == (uint64_t)(P * n), 60000));
    struct pawl_pool_stats st;
    pawl_pool_stats(p, &st);
    assert_true(st.executed >= (uint64_t)(P * n));
    assert_int_equal(st.injected, P * n);
    pawl_pool_free(p);
    for (int i = 0; i < P * n; i++)
        assert_int_equal(tasks[i].calls, 1);
    assert_int_equal(cancels, 0);
    free(tasks);
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
    while (!__atomic_load_n(&release_blocker, __ATOMIC_ACQUIRE))
        usleep(100);
    counted_fn(t, status);
}

static void *release_later(void *arg)
{
    usleep(50000);
    __atomic_store_n(&release_blocker, 1, __ATOMIC_RELEASE);
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
    __atomic_fetch_add(&r->calls, 1, __ATOMIC_RELAXED);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allocator_hooks),
        cmocka_unit_test(test_defaults_and_current),
        cmocka_unit_test(test_current_worker),
        cmocka_unit_test(test_many_producers),
        cmocka_unit_test(test_nested_and_stealing),
        cmocka_unit_test(test_park_and_wake),
        cmocka_unit_test(test_shutdown_with_queued_work),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
