/*
 * test_runtime_pool.c (stress) — the pool and serial executors under load: many outside
 * producers at once with nested fan-out, repeated create/shutdown cycles with work still queued
 * (every task called exactly once), both with single and with batched submission, serial
 * executors that feed each other, checking order and mutual exclusion throughout, wake-ups
 * from a full park through outside threads' own rings, and a busy task's child taken by a worker
 * that was on its way to sleep.
 */
#include "pawl_test.h"
#include "runtime_test.h"

#include <stdlib.h>
#include <string.h>

struct node {
    struct pawl_task task;
    struct pawl_pool *pool;
    int fan;
    int batch; /* submit the children as one batch */
    int status;
    uint32_t calls;
    uint64_t *ran, *cancelled;
    struct node *kids;
};

static void node_fn(struct pawl_task *t, int status)
{
    struct node *n = (struct node *)t;
    /* Read what we need of n before counting it: once the count is complete the test frees the
     * nodes (a node's children are counted only after we submitted them, so the children
     * array stays valid until our last submission). */
    struct pawl_pool *pool = n->pool;
    struct node *kids = n->kids;
    int fan = n->fan, batch = n->batch;
    uint64_t *ran = n->ran, *cancelled = n->cancelled;
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&n->calls), 1, memory_order_relaxed);
    n->status = status;
    if (status != 0) {
        rt_inc(cancelled);
        return;
    }
    rt_inc(ran);
    if (batch && fan > 0) {
        struct pawl_task *arr[8];
        for (int i = 0; i < fan; i++)
            arr[i] = &kids[i].task;
        assert_int_equal(pawl_pool_submit_batch(pool, arr, (size_t)fan), 0);
        return;
    }
    for (int i = 0; i < fan; i++)
        pawl_pool_submit(pool, &kids[i].task);
}

struct prod {
    struct node *nodes;
    int n;
    int batch; /* > 1: submit runs of up to this many roots at once */
};

static void *produce(void *arg)
{
    struct prod *p = arg;
    struct pawl_task *arr[64];
    unsigned seed = (unsigned)(uintptr_t)p;
    for (int i = 0; i < p->n;) {
        int k = p->batch > 1 ? 1 + rand_r(&seed) % p->batch : 1;
        if (k > p->n - i)
            k = p->n - i;
        if (p->batch <= 1 || (k == 1 && rand_r(&seed) % 2)) {
            pawl_pool_submit(p->nodes[i].pool, &p->nodes[i].task);
        } else {
            for (int j = 0; j < k; j++)
                arr[j] = &p->nodes[i + j].task;
            assert_int_equal(pawl_pool_submit_batch(p->nodes[i].pool, arr, (size_t)k), 0);
        }
        i += k;
    }
    return NULL;
}

/* Each outside task fans out FAN children from a worker; n producers at once. batch > 1: the
 * producers submit runs of roots as batches and the roots their children as one batch. */
static void run_load(struct pawl_pool *pool, int producers, int per, int batch, uint64_t *ran,
                     uint64_t *cancelled, int wait_all)
{
    enum { FAN = 4 };
    int total = producers * per;
    struct node *roots = calloc((size_t)total, sizeof(*roots));
    struct node *kids = calloc((size_t)total * FAN, sizeof(*kids));
    for (int i = 0; i < total; i++) {
        roots[i] = (struct node){{node_fn, NULL}, pool,          FAN, batch > 1, 0, 0, ran,
                                 cancelled,       kids + i * FAN};
        for (int k = 0; k < FAN; k++)
            kids[i * FAN + k] =
                (struct node){{node_fn, NULL}, pool, 0, 0, 0, 0, ran, cancelled, NULL};
    }
    pthread_t th[8];
    struct prod pr[8];
    for (int i = 0; i < producers; i++) {
        pr[i] = (struct prod){roots + i * per, per, batch};
        pthread_create(&th[i], NULL, produce, &pr[i]);
    }
    for (int i = 0; i < producers; i++)
        pthread_join(th[i], NULL);
    if (wait_all) {
        assert_true(RT_WAIT_UNTIL(rt_load(ran) == (uint64_t)total * (FAN + 1), 120000));
    } else {
        pawl_pool_free(pool); /* with work still queued */
        uint64_t calls = 0;
        for (int i = 0; i < total; i++) {
            assert_int_equal(roots[i].calls, 1);
            /* A root that ran submitted its children: each is then run or cancelled once. */
            for (int k = 0; k < FAN; k++) {
                assert_int_equal(kids[i * FAN + k].calls, roots[i].status == 0 ? 1 : 0);
                calls += kids[i * FAN + k].calls;
            }
        }
        assert_int_equal(*ran + *cancelled, (uint64_t)total + calls);
    }
    free(roots);
    free(kids);
}

static void producers_and_fanout(int batch)
{
    struct pawl_pool_opts o = {.workers = 4};
    struct pawl_pool *pool;
    assert_int_equal(pawl_pool_new(&pool, &o), 0);
    uint64_t ran = 0, cancelled = 0;
    run_load(pool, 4, PAWL_TEST_SCALE(100000), batch, &ran, &cancelled, 1);
    struct pawl_pool_stats st;
    pawl_pool_stats(pool, &st);
    print_message("batch %d: executed %llu, steals %llu, parks %llu, wakeups %llu\n", batch,
                  (unsigned long long)st.executed, (unsigned long long)st.steals,
                  (unsigned long long)st.parks, (unsigned long long)st.wakeups);
    assert_true(st.steals > 0);
    pawl_pool_free(pool);
}

static void test_producers_and_fanout(void **state)
{
    producers_and_fanout(1);
}

static void test_batch_producers_and_fanout(void **state)
{
    producers_and_fanout(64);
}

static void shutdown_cycles(int batch)
{
    int cycles = PAWL_TEST_SCALE(200);
    for (int c = 0; c < cycles; c++) {
        struct pawl_pool_opts o = {.workers = 1 + c % 3};
        struct pawl_pool *pool;
        assert_int_equal(pawl_pool_new(&pool, &o), 0);
        uint64_t ran = 0, cancelled = 0;
        run_load(pool, 2, 500, batch, &ran, &cancelled, 0);
    }
}

static void test_shutdown_cycles(void **state)
{
    shutdown_cycles(1);
}

static void test_batch_shutdown_cycles(void **state)
{
    shutdown_cycles(16);
}

/* Serial executors feeding each other: a task on executor i submits its follow-up to executor
 * (i + 1) % E; each executor checks that per-origin sequence numbers arrive in order. */
enum { E = 16, ORIGINS = 4 };

struct sx {
    struct pawl_serial s;
    uint32_t inside;
    int64_t last[ORIGINS];
    uint64_t bad;
};

static struct sx execs[E];
static uint64_t hops_done;

struct msg {
    struct pawl_task task;
    int origin;
    int at;
    int64_t seq;
    int hops;
};

static void msg_fn(struct pawl_task *t, int status)
{
    struct msg *m = (struct msg *)t;
    struct sx *x = &execs[m->at];
    if (atomic_exchange_explicit(PAWL_ATOMIC_OF(&x->inside), 1, memory_order_acq_rel))
        rt_inc(&x->bad);
    /* Messages of one origin reach executor `at` in the order they were sent, hop by hop. */
    if (m->seq <= x->last[m->origin])
        rt_inc(&x->bad);
    x->last[m->origin] = m->seq;
    atomic_store_explicit(PAWL_ATOMIC_OF(&x->inside), 0, memory_order_release);
    if (status == 0 && --m->hops > 0) {
        m->at = (m->at + 1) % E;
        pawl_serial_submit(&execs[m->at].s, &m->task);
    } else {
        rt_inc(&hops_done);
    }
}

static void test_serial_ring(void **state)
{
    struct pawl_pool_opts o = {.workers = 3};
    struct pawl_pool *pool;
    assert_int_equal(pawl_pool_new(&pool, &o), 0);
    memset(execs, 0, sizeof execs);
    for (int i = 0; i < E; i++) {
        pawl_serial_init(&execs[i].s, pool);
        for (int k = 0; k < ORIGINS; k++)
            execs[i].last[k] = 0;
    }
    int per = PAWL_TEST_SCALE(20000);
    struct msg *ms = calloc((size_t)per * ORIGINS, sizeof(*ms));
    hops_done = 0;
    /* Origin k injects all its messages at executor k, in sequence order. */
    for (int i = 0; i < per; i++)
        for (int k = 0; k < ORIGINS; k++) {
            struct msg *m = &ms[i * ORIGINS + k];
            *m = (struct msg){{msg_fn, NULL}, k, k, i + 1, 8};
            pawl_serial_submit(&execs[k].s, &m->task);
        }
    assert_true(RT_WAIT_UNTIL(rt_load(&hops_done) == (uint64_t)per * ORIGINS, 120000));
    for (int i = 0; i < E; i++) {
        assert_int_equal(execs[i].bad, 0);
        /* The drain that ran an executor's last task still subtracts its batch afterwards. */
        assert_true(RT_WAIT_UNTIL(pawl_serial_idle(&execs[i].s), 10000));
        pawl_serial_fini(&execs[i].s);
    }
    pawl_pool_free(pool);
    free(ms);
}

/* Lost wake-up hunt: submitters hand single tasks to a pool whose workers keep parking; each
 * task must run promptly (a lost wake-up leaves it queued with every worker asleep). */
struct ping {
    struct pawl_task task;
    uint64_t ran;
};

static void ping_fn(struct pawl_task *t, int status)
{
    rt_inc(&((struct ping *)t)->ran);
}

struct pinger {
    struct pawl_pool *pool;
    int n;
    int64_t worst_ms;
};

static void *pinger_main(void *arg)
{
    struct pinger *p = arg;
    struct ping pg = {{ping_fn, NULL}, 0};
    unsigned seed = (unsigned)(uintptr_t)p;
    for (int i = 0; i < p->n; i++) {
        int64_t t0 = rt_now_ms();
        pawl_pool_submit(p->pool, &pg.task);
        while (rt_load(&pg.ran) != (uint64_t)i + 1) {
            if (rt_now_ms() - t0 > 10000)
                return (void *)1; /* lost */
            sched_yield();
        }
        if (rt_now_ms() - t0 > p->worst_ms)
            p->worst_ms = rt_now_ms() - t0;
        if (rand_r(&seed) % 8 == 0)
            usleep(rand_r(&seed) % 200); /* let workers park now and then */
    }
    return NULL;
}

/* Three pingers running `ping_main` against a pool of `workers`; none may lose a wake-up. */
static void run_pingers(int workers, void *(*ping_main)(void *), const char *what)
{
    struct pawl_pool_opts o = {.workers = workers};
    struct pawl_pool *pool;
    assert_int_equal(pawl_pool_new(&pool, &o), 0);
    struct pinger pr[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        pr[i] = (struct pinger){pool, PAWL_TEST_SCALE(30000), 0};
        pthread_create(&th[i], NULL, ping_main, &pr[i]);
    }
    for (int i = 0; i < 3; i++) {
        void *lost;
        pthread_join(th[i], &lost);
        assert_null(lost);
        print_message("%s %d: worst round trip %lld ms\n", what, i, (long long)pr[i].worst_ms);
    }
    struct pawl_pool_stats st;
    pawl_pool_stats(pool, &st);
    print_message("parks %llu, wakeups %llu\n", (unsigned long long)st.parks,
                  (unsigned long long)st.wakeups);
    pawl_pool_free(pool);
}

static void test_no_lost_wakeups(void **state)
{
    run_pingers(3, pinger_main, "pinger");
}

/* The same with batches: each round submits 1..8 tasks at once and waits for all of them. */
static void *batch_pinger_main(void *arg)
{
    struct pinger *p = arg;
    struct ping pg[8];
    struct pawl_task *arr[8];
    uint64_t want[8] = {0};
    for (int k = 0; k < 8; k++) {
        pg[k] = (struct ping){{ping_fn, NULL}, 0};
        arr[k] = &pg[k].task;
    }
    unsigned seed = (unsigned)(uintptr_t)p;
    for (int i = 0; i < p->n; i++) {
        int k = 1 + rand_r(&seed) % 8;
        int64_t t0 = rt_now_ms();
        for (int j = 0; j < k; j++)
            want[j]++;
        pawl_pool_submit_batch(p->pool, arr, (size_t)k);
        for (int j = 0; j < k; j++) {
            while (rt_load(&pg[j].ran) != want[j]) {
                if (rt_now_ms() - t0 > 10000)
                    return (void *)1; /* lost */
                sched_yield();
            }
        }
        if (rt_now_ms() - t0 > p->worst_ms)
            p->worst_ms = rt_now_ms() - t0;
        if (rand_r(&seed) % 8 == 0)
            usleep(rand_r(&seed) % 200); /* let workers park now and then */
    }
    return NULL;
}

static void test_no_lost_wakeups_batches(void **state)
{
    run_pingers(2, batch_pinger_main, "batch pinger");
}

/*
 * Wake-up from a full park, through the outside threads' own rings (whose submission publishes
 * with a plain store and a fence rather than a read-modify-write): each round waits until the
 * worker that ran the last task has gone to sleep again (the park count grew; the other one was
 * not woken, or parked too), so that both are in or entering futex_wait, and then submits one
 * task; a lost wake-up leaves it queued with every worker asleep, and the round times out. Two
 * submitters take turns, each through its own ring.
 */
struct full_park {
    struct pawl_pool *pool;
    int rounds;
    int id;
    uint32_t *turn;
    uint64_t *parks; /* the park count when the last round began (shared: they take turns) */
    int64_t worst_ms;
    int lost;
};

static void *full_park_main(void *arg)
{
    struct full_park *f = arg;
    struct ping pg = {{ping_fn, NULL}, 0};
    for (int i = 0; i < f->rounds; i++) {
        while (atomic_load_explicit(PAWL_ATOMIC_OF(f->turn), memory_order_acquire) % 2 !=
               (uint32_t)f->id)
            sched_yield();
        /* The last task's worker asleep again (up to 200 ms: the first round's may have parked
         * before we looked; then submit anyway). */
        struct pawl_pool_stats st;
        RT_WAIT_UNTIL((pawl_pool_stats(f->pool, &st), st.parks > *f->parks), 200);
        *f->parks = st.parks;
        int64_t t0 = rt_now_ms();
        pawl_pool_submit(f->pool, &pg.task);
        while (rt_load(&pg.ran) != (uint64_t)i + 1) {
            if (rt_now_ms() - t0 > 5000) {
                f->lost = 1;
                atomic_fetch_add_explicit(PAWL_ATOMIC_OF(f->turn), 1, memory_order_acq_rel);
                return NULL;
            }
            usleep(50);
        }
        if (rt_now_ms() - t0 > f->worst_ms)
            f->worst_ms = rt_now_ms() - t0;
        atomic_fetch_add_explicit(PAWL_ATOMIC_OF(f->turn), 1, memory_order_acq_rel);
    }
    return NULL;
}

static void test_wake_from_full_park(void **state)
{
    struct pawl_pool_opts o = {.workers = 2};
    struct pawl_pool *pool;
    assert_int_equal(pawl_pool_new(&pool, &o), 0);
    uint32_t turn = 0;
    uint64_t parks = 0;
    struct full_park f[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        f[i] = (struct full_park){pool, PAWL_TEST_SCALE(2000), i, &turn, &parks, 0, 0};
        pthread_create(&th[i], NULL, full_park_main, &f[i]);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        print_message("full park %d: worst round trip %lld ms\n", i, (long long)f[i].worst_ms);
    }
    struct pawl_pool_stats st;
    pawl_pool_stats(pool, &st);
    print_message("parks %llu, wakeups %llu\n", (unsigned long long)st.parks,
                  (unsigned long long)st.wakeups);
    for (int i = 0; i < 2; i++)
        assert_int_equal(f[i].lost, 0);
    pawl_pool_free(pool);
}

/*
 * A task that pushes a child onto its own deque and then stays busy until another worker has
 * taken it (steal latency, in bench_runtime, is this shape). The other worker keeps parking
 * between rounds, and a random delay before the push lands it anywhere in that worker's way to
 * sleep, including between its announcement and its re-check of the queues. A wake-up missed
 * there leaves the child in the busy worker's deque, with the only other worker asleep, for as
 * long as the parent runs: here, until the parent gives up after 2 s and the round fails.
 */
struct busy_parent {
    struct pawl_task task;
    struct pawl_task child;
    struct pawl_pool *pool;
    unsigned seed;
    uint64_t round;     /* set by the submitter before each round */
    uint64_t child_ran; /* the round whose child ran (on another worker) */
    uint64_t done;      /* the round whose parent returned */
    uint64_t stranded;  /* rounds whose child no other worker took within 2 s */
    int64_t worst_us;   /* longest wait for the child */
};

static void busy_child_fn(struct pawl_task *t, int status)
{
    struct busy_parent *p = (struct busy_parent *)((char *)t - offsetof(struct busy_parent, child));
    if (status == 0)
        atomic_store_explicit(PAWL_ATOMIC_OF(&p->child_ran), p->round, memory_order_release);
}

static void busy_parent_fn(struct pawl_task *t, int status)
{
    struct busy_parent *p = (struct busy_parent *)t;
    if (status != 0)
        return;
    uint64_t round = p->round;
    /* 0..20 us of spinning before the push: a different point of the other worker's way to
     * sleep each round. */
    int64_t until = pawl_now_ns() + rand_r(&p->seed) % 21 * 1000;
    while (pawl_now_ns() < until)
        ;
    int64_t t0 = pawl_now_ns();
    assert_int_equal(pawl_pool_submit(p->pool, &p->child), 0);
    while (atomic_load_explicit(PAWL_ATOMIC_OF(&p->child_ran), memory_order_acquire) != round) {
        if (pawl_now_ns() - t0 > 2000000000) {
            p->stranded++; /* we return: our worker then runs the child itself */
            break;
        }
    }
    int64_t waited_us = (pawl_now_ns() - t0) / 1000;
    if (waited_us > p->worst_us)
        p->worst_us = waited_us;
    atomic_store_explicit(PAWL_ATOMIC_OF(&p->done), round, memory_order_release);
}

static void test_busy_parent_child_taken(void **state)
{
    struct pawl_pool_opts o = {.workers = 2};
    struct pawl_pool *pool;
    assert_int_equal(pawl_pool_new(&pool, &o), 0);
    struct busy_parent p = {.task = {busy_parent_fn, NULL},
                            .child = {busy_child_fn, NULL},
                            .pool = pool,
                            .seed = 12345};
    int rounds = PAWL_TEST_SCALE(100000);
    unsigned seed = 777;
    int done = 0;
    for (int i = 1; i <= rounds && p.stranded == 0; i++, done++) {
        p.round = (uint64_t)i;
        assert_int_equal(pawl_pool_submit(pool, &p.task), 0);
        /* Wait for the parent and for its child (which may run after the parent returned,
         * when it was stranded). */
        while (atomic_load_explicit(PAWL_ATOMIC_OF(&p.done), memory_order_acquire) != (uint64_t)i ||
               atomic_load_explicit(PAWL_ATOMIC_OF(&p.child_ran), memory_order_acquire) !=
                   (uint64_t)i)
            sched_yield();
        if (rand_r(&seed) % 16 == 0)
            usleep(rand_r(&seed) % 100); /* let both workers park now and then */
    }
    struct pawl_pool_stats st;
    pawl_pool_stats(pool, &st);
    print_message("busy parent: %d rounds, worst wait for the child %lld us, parks %llu, "
                  "wakeups %llu\n",
                  done, (long long)p.worst_us, (unsigned long long)st.parks,
                  (unsigned long long)st.wakeups);
    pawl_pool_free(pool);
    assert_int_equal(p.stranded, 0);
}

/* Bursts from outside, each waited for before the next: the workers drain the injection queue
 * while it is being filled (the consumer keeps meeting producers at the queue's end) and park
 * between bursts. A burst whose last task is not found leaves every worker asleep. */
static uint64_t burst_ran;

static void burst_fn(struct pawl_task *t, int status)
{
    rt_inc(&burst_ran);
}

static void bursts(int batch)
{
    enum { N = 10000 };
    struct pawl_pool_opts o = {.workers = 2};
    struct pawl_pool *pool;
    assert_int_equal(pawl_pool_new(&pool, &o), 0);
    struct pawl_task *tasks = calloc(N, sizeof(*tasks));
    struct pawl_task **arr = calloc(N, sizeof(*arr));
    for (int i = 0; i < N; i++) {
        tasks[i].fn = burst_fn;
        arr[i] = &tasks[i];
    }
    burst_ran = 0;
    int rounds = PAWL_TEST_SCALE(500);
    for (int r = 0; r < rounds; r++) {
        if (batch > 1)
            for (int i = 0; i < N; i += batch)
                pawl_pool_submit_batch(pool, arr + i, (size_t)(N - i < batch ? N - i : batch));
        else
            for (int i = 0; i < N; i++)
                pawl_pool_submit(pool, arr[i]);
        uint64_t want = (uint64_t)(r + 1) * N;
        int64_t t0 = rt_now_ms();
        while (rt_load(&burst_ran) != want) {
            if (rt_now_ms() - t0 > 10000)
                fail_msg("round %d: %llu of %llu tasks ran", r,
                         (unsigned long long)rt_load(&burst_ran), (unsigned long long)want);
            sched_yield();
        }
    }
    pawl_pool_free(pool);
    free(arr);
    free(tasks);
}

static void test_bursts(void **state)
{
    bursts(1);
}

static void test_batch_bursts(void **state)
{
    bursts(64);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_producers_and_fanout),
        cmocka_unit_test(test_batch_producers_and_fanout),
        cmocka_unit_test(test_shutdown_cycles),
        cmocka_unit_test(test_batch_shutdown_cycles),
        cmocka_unit_test(test_serial_ring),
        cmocka_unit_test(test_no_lost_wakeups),
        cmocka_unit_test(test_no_lost_wakeups_batches),
        cmocka_unit_test(test_wake_from_full_park),
        cmocka_unit_test(test_busy_parent_child_taken),
        cmocka_unit_test(test_bursts),
        cmocka_unit_test(test_batch_bursts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
