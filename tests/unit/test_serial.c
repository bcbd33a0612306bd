/*
 * test_serial.c — serial executors: submission order per producer, mutual exclusion under
 * several producers, submission from inside a running task, parallelism between executors, and
 * cancellation in order at pool shutdown.
 */
#include "pawl_test.h"
#include "runtime_test.h"

#include <stdlib.h>
#include <string.h>

enum { EXECS = 8, PRODUCERS = 4 };

struct exec {
    struct pawl_serial s;
    uint32_t inside;         /* 1 while a task of this executor runs */
    int64_t last[PRODUCERS]; /* last sequence number seen from each producer */
    uint64_t ran;
    uint64_t violations;
};

struct item {
    struct pawl_task task;
    struct exec *ex;
    int producer;
    int64_t seq;
};

static void item_fn(struct pawl_task *t, int status)
{
    struct item *it = (struct item *)t;
    struct exec *ex = it->ex;
    /* Acq_rel: detects two tasks of one executor running at once. */
    if (atomic_exchange_explicit(PAWL_ATOMIC_OF(&ex->inside), 1, memory_order_acq_rel) != 0)
        atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&ex->violations), 1, memory_order_relaxed);
    if (it->seq != ex->last[it->producer] + 1)
        atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&ex->violations), 1, memory_order_relaxed);
    ex->last[it->producer] = it->seq;
    if (it->seq % 64 == 0)
        sched_yield(); /* widen the window for overlap */
    atomic_store_explicit(PAWL_ATOMIC_OF(&ex->inside), 0, memory_order_release);
    rt_inc(&ex->ran);
}

struct producer {
    struct exec *ex;
    struct item *items;
    int id, n;
};

static void *produce(void *arg)
{
    struct producer *pr = arg;
    for (int i = 0; i < pr->n; i++) {
        struct item *it = &pr->items[i];
        it->task.fn = item_fn;
        it->ex = &pr->ex[i % EXECS];
        it->producer = pr->id;
        it->seq = i / EXECS + 1;
        assert_int_equal(pawl_serial_submit(&it->ex->s, &it->task), 0);
    }
    return NULL;
}

void serial_order_run(int per_producer, int workers)
{
    struct pawl_pool_opts o = {.workers = workers};
    struct pawl_pool *p;
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    struct exec *ex = calloc(EXECS, sizeof(*ex));
    for (int i = 0; i < EXECS; i++)
        assert_int_equal(pawl_serial_init(&ex[i].s, p), 0);
    struct producer pr[PRODUCERS];
    pthread_t th[PRODUCERS];
    for (int i = 0; i < PRODUCERS; i++) {
        pr[i] = (struct producer){ex, calloc((size_t)per_producer, sizeof(struct item)), i,
                                  per_producer};
        pthread_create(&th[i], NULL, produce, &pr[i]);
    }
    for (int i = 0; i < PRODUCERS; i++)
        pthread_join(th[i], NULL);
    uint64_t total = (uint64_t)PRODUCERS * (uint64_t)per_producer;
    uint64_t sum = 0;
    int64_t deadline = rt_now_ms() + 20000;
    do {
        sum = 0;
        for (int i = 0; i < EXECS; i++)
            sum += rt_load(&ex[i].ran);
        if (sum < total)
            usleep(1000);
    } while (sum < total && rt_now_ms() < deadline);
    if (sum != total) {
        for (int i = 0; i < EXECS; i++)
            print_message("exec %d: ran %llu count %llu head==stub %d\n", i,
                          (unsigned long long)ex[i].ran, (unsigned long long)ex[i].s._count,
                          ex[i].s._q._head == &ex[i].s._q._stub);
        struct pawl_pool_stats st;
        pawl_pool_stats(p, &st);
        print_message("executed %llu parks %llu injected %llu\n", (unsigned long long)st.executed,
                      (unsigned long long)st.parks, (unsigned long long)st.injected);
    }
    assert_int_equal(sum, total);
    for (int i = 0; i < EXECS; i++) {
        assert_int_equal(ex[i].violations, 0);
        assert_int_equal(pawl_serial_ran(&ex[i].s), ex[i].ran);
        assert_true(RT_WAIT_UNTIL(pawl_serial_idle(&ex[i].s), 10000));
        pawl_serial_fini(&ex[i].s);
    }
    pawl_pool_free(p);
    for (int i = 0; i < PRODUCERS; i++)
        free(pr[i].items);
    free(ex);
}

static void test_order_and_exclusion(void **state)
{
    serial_order_run(PAWL_TEST_SCALE(40000), 3);
}

/* A task that submits its successor to its own executor: the chain runs in order. */
struct chain {
    struct pawl_task task;
    struct pawl_serial *s;
    int remaining;
    uint64_t done;
};

static void chain_fn(struct pawl_task *t, int status)
{
    struct chain *c = (struct chain *)t;
    if (--c->remaining > 0)
        pawl_serial_submit(c->s, &c->task);
    else
        atomic_store_explicit(PAWL_ATOMIC_OF(&c->done), 1, memory_order_release);
}

static void test_submit_from_inside(void **state)
{
    struct pawl_pool *p;
    struct pawl_pool_opts o = {.workers = 2};
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    struct pawl_serial s;
    pawl_serial_init(&s, p);
    struct chain c = {.task.fn = chain_fn, .s = &s, .remaining = 10000};
    pawl_serial_submit(&s, &c.task);
    assert_true(RT_WAIT_UNTIL(rt_load(&c.done), 30000));
    assert_int_equal(pawl_serial_ran(&s), 10000);
    assert_true(RT_WAIT_UNTIL(pawl_serial_idle(&s), 10000));
    pawl_serial_fini(&s);
    pawl_pool_free(p);
}

/* Two executors run in parallel: each task waits (bounded) to see the other executor inside. */
static uint32_t inside_count;
static uint64_t overlap_seen;

struct par {
    struct pawl_task task;
};

static void par_fn(struct pawl_task *t, int status)
{
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&inside_count), 1, memory_order_acq_rel);
    int64_t until = rt_now_ms() + 2000;
    while (rt_now_ms() < until) {
        if (atomic_load_explicit(PAWL_ATOMIC_OF(&inside_count), memory_order_acquire) >= 2) {
            rt_inc(&overlap_seen);
            break;
        }
        sched_yield();
    }
    usleep(20000); /* stay inside so that the other one sees us too */
    atomic_fetch_sub_explicit(PAWL_ATOMIC_OF(&inside_count), 1, memory_order_acq_rel);
}

static void test_executors_run_in_parallel(void **state)
{
    struct pawl_pool *p;
    struct pawl_pool_opts o = {.workers = 2};
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    struct pawl_serial a, b;
    pawl_serial_init(&a, p);
    pawl_serial_init(&b, p);
    struct par ta = {{par_fn, NULL}}, tb = {{par_fn, NULL}};
    overlap_seen = 0;
    pawl_serial_submit(&a, &ta.task);
    pawl_serial_submit(&b, &tb.task);
    assert_true(RT_WAIT_UNTIL(pawl_serial_ran(&a) == 1 && pawl_serial_ran(&b) == 1, 10000));
    assert_true(RT_WAIT_UNTIL(
        atomic_load_explicit(PAWL_ATOMIC_OF(&inside_count), memory_order_acquire) == 0, 10000));
    assert_true(rt_load(&overlap_seen) >= 1);
    assert_true(RT_WAIT_UNTIL(pawl_serial_idle(&a) && pawl_serial_idle(&b), 10000));
    pawl_serial_fini(&a);
    pawl_serial_fini(&b);
    pawl_pool_free(p);
}

/* Shutdown: queued serial tasks are cancelled, each exactly once, still in order. */
static uint64_t blocker_release;
static uint64_t blocker_started;
static int order_log[200];
static int order_n;

struct logged {
    struct pawl_task task;
    int id;
    int status;
    uint32_t calls;
};

static void logged_fn(struct pawl_task *t, int status)
{
    struct logged *l = (struct logged *)t;
    if (l->id == 0 && status == 0)
        atomic_store_explicit(PAWL_ATOMIC_OF(&blocker_started), 1, memory_order_release);
    if (l->id == 0)
        while (!atomic_load_explicit(PAWL_ATOMIC_OF(&blocker_release), memory_order_acquire))
            usleep(100);
    l->status = status;
    l->calls++;
    order_log[order_n++] = l->id;
}

static void *release_later(void *arg)
{
    usleep(30000);
    atomic_store_explicit(PAWL_ATOMIC_OF(&blocker_release), 1, memory_order_release);
    return NULL;
}

static void test_shutdown_cancels_in_order(void **state)
{
    struct pawl_pool *p;
    struct pawl_pool_opts o = {.workers = 1};
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    struct pawl_serial s;
    pawl_serial_init(&s, p);
    struct logged l[200];
    for (int i = 0; i < 200; i++) {
        l[i] = (struct logged){.task.fn = logged_fn, .id = i, .status = 1};
        pawl_serial_submit(&s, &l[i].task);
    }
    assert_true(RT_WAIT_UNTIL(rt_load(&blocker_started), 10000));
    pthread_t th;
    pthread_create(&th, NULL, release_later, NULL);
    pawl_pool_free(p);
    pthread_join(th, NULL);
    assert_int_equal(order_n, 200);
    int cancelled = 0;
    for (int i = 0; i < 200; i++) {
        assert_int_equal(order_log[i], i);
        assert_int_equal(l[i].calls, 1);
        cancelled += l[i].status == PAWL_ECANCELED;
    }
    assert_int_equal(l[0].status, 0);
    assert_true(cancelled > 0);
    pawl_serial_fini(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_and_exclusion),
        cmocka_unit_test(test_submit_from_inside),
        cmocka_unit_test(test_executors_run_in_parallel),
        cmocka_unit_test(test_shutdown_cancels_in_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
