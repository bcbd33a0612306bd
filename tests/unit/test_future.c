/*
 * test_future.c — futures: outcome and double completion, error propagation, continuations on
 * the pool and on serial executors (never on the completing thread), completion from foreign
 * threads racing with blocking waits and with registration, two completers racing on one
 * future, sleepers woken by one completion, completing and handing over the reference in one
 * call (complete_unref, fail_unref), the object cache (reuse, objects handed back at
 * thread exit, the depot's cap, custom allocator hooks bypassing it), all-of (success, one failure,
 * empty), or-timeout firing and not firing, and continuations at pool shutdown.
 */
#include "future.h"
#include "pawl_test.h"
#include "runtime_test.h"

#include <stdlib.h>
#include <string.h>

static struct pawl_pool *pool;
static struct pawl_timers *timers;
static _Thread_local int completing; /* set while this thread is inside complete/fail */

static int setup(void **state)
{
    struct pawl_pool_opts o = {.workers = 2};
    if (pawl_pool_new(&pool, &o) != 0)
        return -1;
    return pawl_timers_new(&timers, pool, NULL);
}

static int teardown(void **state)
{
    pawl_timers_free(timers);
    pawl_pool_free(pool);
    return 0;
}

static void test_outcome_and_double_completion(void **state)
{
    struct pawl_future *f = pawl_future_new();
    int64_t tok = -1;
    int code = 1;
    const char *msg = "x";
    assert_int_equal(pawl_future_poll(f, &tok, &code, &msg), PAWL_EAGAIN);
    assert_int_equal(pawl_future_done(f), 0);
    assert_int_equal(pawl_future_complete(f, 42), 0);
    assert_int_equal(pawl_future_complete(f, 43), PAWL_EALREADY);
    assert_int_equal(pawl_future_fail(f, PAWL_ECHECKPOINT, "late"), PAWL_EALREADY);
    assert_int_equal(pawl_future_poll(f, &tok, &code, &msg), 0);
    assert_int_equal(tok, 42);
    assert_int_equal(code, 0);
    assert_null(msg);
    assert_int_equal(pawl_future_wait(f, 0), 0);
    pawl_future_unref(f);

    f = pawl_future_new();
    assert_int_equal(pawl_future_fail(f, PAWL_ECHECKPOINT, "snapshot write failed"), 0);
    assert_int_equal(pawl_future_complete(f, 1), PAWL_EALREADY);
    assert_int_equal(pawl_future_poll(f, &tok, &code, &msg), 0);
    assert_int_equal(code, PAWL_ECHECKPOINT);
    assert_string_equal(msg, "snapshot write failed");
    pawl_future_unref(f);

    f = pawl_future_new();
    assert_int_equal(pawl_future_fail(f, 5, NULL), 0); /* not a PAWL_E code: EINVAL */
    assert_int_equal(pawl_future_poll(f, NULL, &code, &msg), 0);
    assert_int_equal(code, PAWL_EINVAL);
    assert_string_equal(msg, pawl_strerror(PAWL_EINVAL));
    assert_int_equal(pawl_future_wait(f, 10), 0);
    pawl_future_unref(f);
    pawl_future_unref(NULL);

    f = pawl_future_new();
    assert_int_equal(pawl_future_wait(f, 20), PAWL_ETIMEDOUT);
    pawl_future_unref(f);
}

/* Two completers race on every future (one completes, one fails): exactly one wins each. */
struct duel {
    struct pawl_future **fs;
    uint8_t *won;
    int n;
    int fails;
};

static void *duel_complete(void *arg)
{
    struct duel *d = arg;
    for (int i = 0; i < d->n; i++) {
        int rc = d->fails ? pawl_future_fail(d->fs[i], PAWL_EHANDLER, NULL)
                          : pawl_future_complete(d->fs[i], i);
        d->won[i] = rc == 0;
        if (rc != 0)
            assert_int_equal(rc, PAWL_EALREADY);
    }
    return NULL;
}

static void test_double_completion_race(void **state)
{
    int n = PAWL_TEST_SCALE(20000);
    struct pawl_future **fs = calloc((size_t)n, sizeof(*fs));
    uint8_t *won_a = calloc((size_t)n, 1), *won_b = calloc((size_t)n, 1);
    for (int i = 0; i < n; i++)
        fs[i] = pawl_future_new();
    struct duel a = {fs, won_a, n, 0}, b = {fs, won_b, n, 1};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, duel_complete, &a);
    pthread_create(&tb, NULL, duel_complete, &b);
    for (int i = 0; i < n; i++)
        assert_int_equal(pawl_future_wait(fs[i], 30000), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    for (int i = 0; i < n; i++) {
        assert_int_equal(won_a[i] + won_b[i], 1);
        int64_t tok;
        int code;
        assert_int_equal(pawl_future_poll(fs[i], &tok, &code, NULL), 0);
        assert_int_equal(code, won_a[i] ? 0 : PAWL_EHANDLER);
        if (won_a[i])
            assert_int_equal(tok, i);
        pawl_future_unref(fs[i]);
    }
    free(won_b);
    free(won_a);
    free(fs);
}

/* Several threads asleep in pawl_future_wait are all woken by one completion. */
static void *wait_forever(void *arg)
{
    return (void *)(intptr_t)pawl_future_wait(arg, -1);
}

static void test_sleepers_woken(void **state)
{
    struct pawl_future *f = pawl_future_new();
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&th[i], NULL, wait_forever, f);
    usleep(30000); /* let them go to sleep (not required for correctness) */
    assert_int_equal(pawl_future_done(f), 0);
    assert_int_equal(pawl_future_complete(f, 5), 0);
    for (int i = 0; i < 3; i++) {
        void *rc;
        pthread_join(th[i], &rc);
        assert_int_equal((intptr_t)rc, 0);
    }
    assert_int_equal(pawl_future_complete(f, 6), PAWL_EALREADY);
    int64_t tok;
    assert_int_equal(pawl_future_poll(f, &tok, NULL, NULL), 0);
    assert_int_equal(tok, 5);
    pawl_future_unref(f);
}

/* ---- the object cache (skipped where it is compiled out: ASan builds) ---- */

static struct pawl__future_cache_stats cache_stats(void)
{
    struct pawl__future_cache_stats st;
    pawl__future_cache_stats(&st);
    return st;
}

static void skip_without_cache(void)
{
    if (!cache_stats().enabled) {
        print_message("the future cache is compiled out in this build\n");
        skip();
    }
}

/* A freed future is the next one this thread gets, and it comes back pristine. */
static void test_cache_reuses_objects(void **state)
{
    skip_without_cache();
    struct pawl_future *f = pawl_future_new();
    assert_int_equal(pawl_future_fail(f, PAWL_EHANDLER, "a message to free"), 0);
    pawl_future_unref(f);
    struct pawl_future *g = pawl_future_new();
    assert_ptr_equal(g, f);
    assert_int_equal(pawl_future_done(g), 0);
    assert_int_equal(pawl_future_poll(g, NULL, NULL, NULL), PAWL_EAGAIN);
    assert_int_equal(pawl_future_wait(g, 0), PAWL_ETIMEDOUT);
    assert_int_equal(pawl_future_complete(g, 9), 0);
    int64_t tok;
    int code;
    const char *msg = "x";
    assert_int_equal(pawl_future_poll(g, &tok, &code, &msg), 0);
    assert_int_equal(tok, 9);
    assert_int_equal(code, 0);
    assert_null(msg);
    pawl_future_unref(g);
}

struct churn {
    int n;
    struct pawl__future_cache_stats end; /* the thread's view just before it exits */
};

/* Create n futures, then drop them all: this thread ends up holding some of them. */
static void *churn_and_exit(void *arg)
{
    struct churn *c = arg;
    struct pawl_future **fs = calloc((size_t)c->n, sizeof(*fs));
    for (int i = 0; i < c->n; i++)
        fs[i] = pawl_future_new();
    for (int i = 0; i < c->n; i++)
        pawl_future_unref(fs[i]);
    free(fs);
    c->end = cache_stats();
    return NULL;
}

/* A thread's cached objects go to the depot when it exits. */
static void test_cache_thread_exit(void **state)
{
    skip_without_cache();
    struct churn c = {.n = 100};
    pthread_t th;
    pthread_create(&th, NULL, churn_and_exit, &c);
    pthread_join(th, NULL);
    /* It freed 100, so it holds some (it may also hold what it took from the depot). */
    assert_true(c.end.thread_objs > 0 && c.end.thread_objs <= 2 * c.end.magazine);
    assert_true(c.end.depot_objs + c.end.thread_objs <= c.end.depot_max); /* room for them */
    assert_int_equal(cache_stats().depot_objs, c.end.depot_objs + c.end.thread_objs);
}

/* However many objects are freed, the depot holds at most depot_max, a thread 2 magazines. */
static void test_cache_cap(void **state)
{
    skip_without_cache();
    struct churn c = {.n = (int)(3 * cache_stats().depot_max)};
    pthread_t th;
    pthread_create(&th, NULL, churn_and_exit, &c);
    pthread_join(th, NULL);
    assert_true(c.end.thread_objs <= 2 * c.end.magazine);
    assert_true(c.end.depot_objs <= c.end.depot_max);
    assert_true(c.end.depot_objs + c.end.magazine > c.end.depot_max); /* it did fill up */
    assert_true(cache_stats().depot_objs <= c.end.depot_max);
}

static uint64_t hook_allocs, hook_frees;

static void *hook_calloc(size_t n, size_t size)
{
    hook_allocs++;
    return calloc(n, size);
}

static void *hook_malloc(size_t size)
{
    hook_allocs++;
    return malloc(size);
}

static void hook_free(void *p)
{
    if (p)
        hook_frees++;
    free(p);
}

/* Custom allocator hooks see every future; what was cached before goes back to free(). */
static void test_cache_honours_allocator(void **state)
{
    struct pawl_future *warm = pawl_future_new(); /* leave something cached */
    pawl_future_unref(warm);
    hook_allocs = hook_frees = 0;
    pawl_set_allocator(&(struct pawl_allocator){.calloc = hook_calloc, .free = hook_free});
    assert_int_equal(cache_stats().enabled, 0);
    for (int i = 0; i < 10; i++) {
        struct pawl_future *f = pawl_future_new();
        assert_non_null(f);
        pawl_future_complete(f, i);
        pawl_future_unref(f);
    }
    assert_int_equal(hook_allocs, 10);
    assert_int_equal(hook_frees, 10);
    assert_int_equal(cache_stats().thread_objs, 0);
    assert_int_equal(cache_stats().depot_objs, 0);
    pawl_set_allocator(&(struct pawl_allocator){.calloc = calloc, .free = free});
}

/* What complete_unref frees and when, counted through allocator hooks (the cache is off while
 * they are set): with no continuation the future is freed inside the call; with a reference
 * still held elsewhere, only at that reference's unref; with only an inline record (an all-of's),
 * inside the call too, after the record ran. */
static void test_complete_unref_frees(void **state)
{
    pawl_set_allocator(
        &(struct pawl_allocator){.malloc = hook_malloc, .calloc = hook_calloc, .free = hook_free});
    hook_allocs = hook_frees = 0;
    struct pawl_future *f = pawl_future_new();
    assert_int_equal(pawl_future_complete_unref(f, 1), 0);
    assert_true(hook_allocs >= 1);
    assert_int_equal(hook_frees, hook_allocs);

    hook_allocs = hook_frees = 0;
    f = pawl_future_new();
    pawl_future_ref(f);
    assert_int_equal(pawl_future_fail_unref(f, PAWL_EHANDLER, NULL), 0);
    assert_int_equal(hook_frees, 0); /* ours is still held */
    assert_int_equal(pawl_future_complete_unref(f, 2), PAWL_EALREADY);
    assert_true(hook_allocs >= 1);
    assert_int_equal(hook_frees, hook_allocs); /* the future and its message */

    hook_allocs = hook_frees = 0;
    f = pawl_future_new();
    struct pawl_future *all = pawl_future_all(&f, 1);
    uint64_t allocs = hook_allocs;
    assert_int_equal(pawl_future_complete_unref(f, 9), 0);
    int64_t tok;
    assert_int_equal(pawl_future_poll(all, &tok, NULL, NULL), 0);
    assert_int_equal(tok, 9);
    pawl_future_unref(all);
    assert_int_equal(hook_frees, allocs); /* everything: f, the combinator's state, all */
    pawl_set_allocator(&(struct pawl_allocator){.malloc = malloc, .calloc = calloc, .free = free});
}

struct cont_rec {
    uint64_t calls;
    uint64_t inline_calls;
    int worker;
    int64_t token;
    int code;
    int64_t seq[64];
    int nseq;
};

static void cont_cb(void *arg, struct pawl_future *f)
{
    struct cont_rec *r = arg;
    if (completing)
        rt_inc(&r->inline_calls);
    r->worker = pawl_pool_current_worker();
    pawl_future_poll(f, &r->token, &r->code, NULL);
    rt_inc(&r->calls);
}

static void test_continuation_on_pool(void **state)
{
    struct cont_rec before = {0}, after = {0};
    struct pawl_future *f = pawl_future_new();
    assert_int_equal(pawl_future_on_complete(f, NULL, pool, cont_cb, &before), 0);
    completing = 1;
    pawl_future_complete(f, 7);
    completing = 0;
    /* Registered after completion: still queued, not run inline. */
    completing = 1;
    assert_int_equal(pawl_future_on_complete(f, NULL, pool, cont_cb, &after), 0);
    completing = 0;
    pawl_future_unref(f); /* continuations keep their own references */
    assert_true(RT_WAIT_UNTIL(rt_load(&before.calls) == 1 && rt_load(&after.calls) == 1, 10000));
    assert_int_equal(before.inline_calls + after.inline_calls, 0);
    assert_true(before.worker >= 0 && after.worker >= 0);
    assert_int_equal(before.token, 7);
    assert_int_equal(after.token, 7);
    assert_int_equal(pawl_future_on_complete(NULL, NULL, pool, cont_cb, &after), PAWL_EINVAL);
}

/* complete_unref / fail_unref: the outcome reaches every continuation (pool, serial, and an
 * all-of's inline record registered last, which takes no reference); a second completion is
 * refused and still consumes the reference; NULL is refused. What is freed when is checked by
 * the hook-counting test below and, for use after free and leaks, by the ASan build. */
static void test_complete_unref(void **state)
{
    struct pawl_serial s;
    pawl_serial_init(&s, pool);
    struct cont_rec a = {0}, b = {0}, c = {0};
    struct pawl_future *f = pawl_future_new();
    assert_int_equal(pawl_future_on_complete(f, NULL, pool, cont_cb, &a), 0);
    assert_int_equal(pawl_future_on_complete(f, &s, NULL, cont_cb, &b), 0);
    assert_int_equal(pawl_future_on_complete(f, NULL, pool, cont_cb, &c), 0); /* the heir */
    completing = 1;
    assert_int_equal(pawl_future_complete_unref(f, 41), 0); /* f may be gone from here on */
    completing = 0;
    assert_true(RT_WAIT_UNTIL(
        rt_load(&a.calls) == 1 && rt_load(&b.calls) == 1 && rt_load(&c.calls) == 1, 10000));
    assert_int_equal(a.inline_calls + b.inline_calls + c.inline_calls, 0);
    assert_int_equal(a.token, 41);
    assert_int_equal(b.token, 41);
    assert_int_equal(c.token, 41);

    /* The newest record is inline (an all-of): the reference is dropped at the end instead. */
    struct cont_rec d = {0};
    f = pawl_future_new();
    assert_int_equal(pawl_future_on_complete(f, NULL, pool, cont_cb, &d), 0);
    struct pawl_future *all = pawl_future_all(&f, 1);
    assert_non_null(all);
    assert_int_equal(pawl_future_fail_unref(f, PAWL_ECHECKPOINT, "handed over"), 0);
    int64_t tok;
    int code;
    const char *msg;
    assert_int_equal(pawl_future_poll(all, &tok, &code, &msg), 0);
    assert_int_equal(code, PAWL_ECHECKPOINT);
    assert_string_equal(msg, "handed over");
    assert_true(RT_WAIT_UNTIL(rt_load(&d.calls) == 1, 10000));
    assert_int_equal(d.code, PAWL_ECHECKPOINT);
    pawl_future_unref(all);

    /* The last owner completes a future whose blocking waiter gave up: WAITERS is still set in
     * its state word when complete_unref takes the last owner's path (no locked operation);
     * the continuation still runs, with the outcome. */
    struct cont_rec e = {0};
    f = pawl_future_new();
    assert_int_equal(pawl_future_wait(f, 1), PAWL_ETIMEDOUT);
    assert_int_equal(pawl_future_on_complete(f, NULL, pool, cont_cb, &e), 0);
    assert_int_equal(pawl_future_complete_unref(f, 77), 0);
    assert_true(RT_WAIT_UNTIL(rt_load(&e.calls) == 1, 10000));
    assert_int_equal(e.token, 77);

    /* Already completed: refused, nothing changes, and the caller's reference is consumed. */
    f = pawl_future_new();
    pawl_future_ref(f); /* two references: ours to keep, one to hand over */
    assert_int_equal(pawl_future_complete(f, 5), 0);
    assert_int_equal(pawl_future_complete_unref(f, 6), PAWL_EALREADY);
    pawl_future_ref(f);
    assert_int_equal(pawl_future_fail_unref(f, PAWL_EHANDLER, "late"), PAWL_EALREADY);
    assert_int_equal(pawl_future_poll(f, &tok, &code, NULL), 0);
    assert_int_equal(code, 0);
    assert_int_equal(tok, 5);
    pawl_future_unref(f);

    assert_int_equal(pawl_future_complete_unref(NULL, 1), PAWL_EINVAL);
    assert_int_equal(pawl_future_fail_unref(NULL, PAWL_EHANDLER, NULL), PAWL_EINVAL);
    assert_true(RT_WAIT_UNTIL(pawl_serial_ran(&s) == 1, 10000));
    assert_true(RT_WAIT_UNTIL(pawl_serial_idle(&s), 10000));
    pawl_serial_fini(&s);
}

/* Continuations on one serial executor run in registration order, never concurrently. */
struct ordered {
    struct cont_rec *rec;
    int64_t id;
};

static void ordered_cb(void *arg, struct pawl_future *f)
{
    struct ordered *o = arg;
    o->rec->seq[o->rec->nseq++] = o->id;
    rt_inc(&o->rec->calls);
}

static void test_continuation_on_serial(void **state)
{
    struct pawl_serial s;
    pawl_serial_init(&s, pool);
    struct cont_rec rec = {0};
    struct ordered o[32];
    struct pawl_future *fs[32];
    for (int i = 0; i < 32; i++) {
        fs[i] = pawl_future_new();
        o[i] = (struct ordered){&rec, i};
    }
    /* Complete in order from this thread: continuations land on s in completion order. */
    for (int i = 0; i < 32; i++)
        assert_int_equal(pawl_future_on_complete(fs[i], &s, NULL, ordered_cb, &o[i]), 0);
    for (int i = 0; i < 32; i++)
        pawl_future_complete(fs[i], i);
    assert_true(RT_WAIT_UNTIL(rt_load(&rec.calls) == 32, 10000));
    for (int i = 0; i < 32; i++) {
        assert_int_equal(rec.seq[i], i);
        pawl_future_unref(fs[i]);
    }
    assert_true(RT_WAIT_UNTIL(pawl_serial_ran(&s) == 32, 10000));
    assert_true(RT_WAIT_UNTIL(pawl_serial_idle(&s), 10000));
    pawl_serial_fini(&s);
}

/* Foreign completion racing with a blocking waiter and with registration. */
struct racer {
    struct pawl_future **fs;
    int n;
    int fail_every;
};

static void *complete_all(void *arg)
{
    struct racer *r = arg;
    for (int i = 0; i < r->n; i++) {
        completing = 1;
        if (r->fail_every && i % r->fail_every == 0)
            pawl_future_fail(r->fs[i], PAWL_EHANDLER, "boom");
        else
            pawl_future_complete(r->fs[i], i);
        completing = 0;
    }
    return NULL;
}

static void test_foreign_completion_races_wait(void **state)
{
    int n = PAWL_TEST_SCALE(20000);
    struct pawl_future **fs = calloc((size_t)n, sizeof(*fs));
    for (int i = 0; i < n; i++)
        fs[i] = pawl_future_new();
    struct racer r = {fs, n, 7};
    pthread_t th;
    pthread_create(&th, NULL, complete_all, &r);
    for (int i = 0; i < n; i++) {
        assert_int_equal(pawl_future_wait(fs[i], 30000), 0);
        int64_t tok;
        int code;
        pawl_future_poll(fs[i], &tok, &code, NULL);
        if (i % 7 == 0)
            assert_int_equal(code, PAWL_EHANDLER);
        else
            assert_int_equal(tok, i);
    }
    pthread_join(th, NULL);
    for (int i = 0; i < n; i++)
        pawl_future_unref(fs[i]);
    free(fs);
}

static uint64_t counted_calls;
static uint64_t counted_inline;

static void count_cb(void *arg, struct pawl_future *f)
{
    if (completing)
        rt_inc(&counted_inline);
    assert_true(pawl_future_done(f));
    rt_inc(&counted_calls);
}

/* No lost wake-ups: many futures, registration racing with completion on another thread. */
void future_storm(int n)
{
    struct pawl_future **fs = calloc((size_t)n, sizeof(*fs));
    for (int i = 0; i < n; i++)
        fs[i] = pawl_future_new();
    counted_calls = 0;
    counted_inline = 0;
    struct racer r = {fs, n, 0};
    pthread_t th;
    pthread_create(&th, NULL, complete_all, &r);
    for (int i = 0; i < n; i++)
        assert_int_equal(pawl_future_on_complete(fs[i], NULL, pool, count_cb, NULL), 0);
    pthread_join(th, NULL);
    for (int i = 0; i < n; i++)
        pawl_future_unref(fs[i]);
    assert_true(RT_WAIT_UNTIL(rt_load(&counted_calls) == (uint64_t)n, 120000));
    assert_int_equal(counted_inline, 0);
    free(fs);
}

static void test_no_lost_wakeups(void **state)
{
    future_storm(PAWL_TEST_SCALE(100000));
}

static void test_all_of(void **state)
{
    struct pawl_future *in[3];
    for (int i = 0; i < 3; i++)
        in[i] = pawl_future_new();
    struct pawl_future *all = pawl_future_all(in, 3);
    assert_non_null(all);
    pawl_future_complete(in[1], 30);
    pawl_future_complete(in[0], 10);
    assert_int_equal(pawl_future_poll(all, NULL, NULL, NULL), PAWL_EAGAIN);
    pawl_future_complete(in[2], 20);
    int64_t tok;
    int code;
    assert_int_equal(pawl_future_wait(all, 5000), 0);
    assert_int_equal(pawl_future_poll(all, &tok, &code, NULL), 0);
    assert_int_equal(code, 0);
    assert_int_equal(tok, 10); /* the lowest */
    pawl_future_unref(all);
    for (int i = 0; i < 3; i++)
        pawl_future_unref(in[i]);

    /* One failure: the combined future fails at once with it. */
    for (int i = 0; i < 3; i++)
        in[i] = pawl_future_new();
    all = pawl_future_all(in, 3);
    pawl_future_complete(in[0], 5);
    pawl_future_fail(in[2], PAWL_ECHECKPOINT, "unit 2 failed");
    const char *msg;
    assert_int_equal(pawl_future_poll(all, &tok, &code, &msg), 0);
    assert_int_equal(code, PAWL_ECHECKPOINT);
    assert_string_equal(msg, "unit 2 failed");
    pawl_future_fail(in[1], PAWL_EHANDLER, "later");
    assert_int_equal(pawl_future_poll(all, &tok, &code, &msg), 0);
    assert_int_equal(code, PAWL_ECHECKPOINT); /* the first error stays */
    for (int i = 0; i < 3; i++)
        pawl_future_unref(in[i]);
    pawl_future_unref(all);

    /* Inputs already done, and the empty set. */
    in[0] = pawl_future_new();
    pawl_future_complete(in[0], 99);
    all = pawl_future_all(in, 1);
    assert_int_equal(pawl_future_poll(all, &tok, &code, NULL), 0);
    assert_int_equal(tok, 99);
    pawl_future_unref(all);
    pawl_future_unref(in[0]);
    all = pawl_future_all(NULL, 0);
    assert_int_equal(pawl_future_poll(all, &tok, &code, NULL), 0);
    assert_int_equal(tok, PAWL_TOKEN_START);
    pawl_future_unref(all);
    assert_null(pawl_future_all(NULL, 2));
}

static void test_or_timeout_fires(void **state)
{
    struct pawl_future *f = pawl_future_new();
    int64_t t0 = rt_now_ms();
    struct pawl_future *g = pawl_future_or_timeout(f, timers, 50);
    assert_non_null(g);
    assert_int_equal(pawl_future_wait(g, 10000), 0);
    int64_t took = rt_now_ms() - t0;
    int code;
    const char *msg;
    assert_int_equal(pawl_future_poll(g, NULL, &code, &msg), 0);
    assert_int_equal(code, PAWL_ETIMEDOUT);
    assert_string_equal(msg, "timed out after 50 ms");
    assert_true(took >= 49 && took < 2000);
    print_message("or-timeout of 50 ms fired after %lld ms\n", (long long)took);
    assert_int_equal(pawl_future_done(f), 0); /* the input is untouched */
    /* The producer completes later: ignored by g, accepted by f. */
    assert_int_equal(pawl_future_complete(f, 3), 0);
    assert_int_equal(pawl_future_poll(g, NULL, &code, NULL), 0);
    assert_int_equal(code, PAWL_ETIMEDOUT);
    pawl_future_unref(g);
    pawl_future_unref(f);
}

static void test_or_timeout_does_not_fire(void **state)
{
    struct pawl_future *f = pawl_future_new();
    struct pawl_future *g = pawl_future_or_timeout(f, timers, 5000);
    usleep(10000);
    pawl_future_complete(f, 77);
    assert_int_equal(pawl_future_wait(g, 1000), 0);
    int64_t tok;
    int code;
    assert_int_equal(pawl_future_poll(g, &tok, &code, NULL), 0);
    assert_int_equal(code, 0);
    assert_int_equal(tok, 77);
    pawl_future_unref(g);
    pawl_future_unref(f);
    /* Errors pass through too; an input already done completes g at once. */
    f = pawl_future_new();
    pawl_future_fail(f, PAWL_EHANDLER, "inner");
    g = pawl_future_or_timeout(f, timers, 5000);
    assert_int_equal(pawl_future_poll(g, NULL, &code, NULL), 0);
    assert_int_equal(code, PAWL_EHANDLER);
    pawl_future_unref(g);
    pawl_future_unref(f);
    /* The cancelled timers are released (leak checkers see it) without waiting 5 s. */
    assert_true(RT_WAIT_UNTIL(pawl_timers_armed(timers) == 0, 5000));
}

/* Many or-timeouts racing their inputs around the deadline: each settles exactly once. */
static void test_or_timeout_race(void **state)
{
    int n = PAWL_TEST_SCALE(2000);
    struct pawl_future **f = calloc((size_t)n, sizeof(*f)), **g = calloc((size_t)n, sizeof(*g));
    for (int i = 0; i < n; i++) {
        f[i] = pawl_future_new();
        g[i] = pawl_future_or_timeout(f[i], timers, i % 5);
    }
    for (int i = 0; i < n; i += 2)
        pawl_future_complete(f[i], i);
    usleep(20000); /* the odd ones' timeouts (0..4 ms) expire first */
    for (int i = 1; i < n; i += 2)
        pawl_future_complete(f[i], i);
    int timed = 0;
    for (int i = 0; i < n; i++) {
        assert_int_equal(pawl_future_wait(g[i], 10000), 0);
        int64_t tok;
        int code;
        pawl_future_poll(g[i], &tok, &code, NULL);
        if (code == PAWL_ETIMEDOUT)
            timed++;
        else
            assert_int_equal(tok, i);
        pawl_future_unref(g[i]);
        pawl_future_unref(f[i]);
    }
    print_message("or-timeout race: %d of %d timed out\n", timed, n);
    free(f);
    free(g);
}

/* Continuations still queued at pool shutdown are called (to release), exactly once. */
static void test_continuation_at_shutdown(void **state)
{
    struct pawl_pool *p;
    struct pawl_pool_opts o = {.workers = 1};
    assert_int_equal(pawl_pool_new(&p, &o), 0);
    struct pawl_future *f = pawl_future_new();
    struct cont_rec rec = {0};
    struct cont_rec rec2 = {0};
    /* A blocker keeps the only worker busy so the continuation stays queued. */
    struct pawl_future *g = pawl_future_new();
    pawl_future_on_complete(g, NULL, p, cont_cb, &rec2);
    pawl_future_on_complete(f, NULL, p, cont_cb, &rec);
    pawl_future_unref(f); /* dropped uncompleted: its continuation is discarded, not called */
    pawl_future_complete(g, 5);
    pawl_future_unref(g);
    pawl_pool_free(p); /* g's continuation ran or was cancelled: called exactly once either way */
    assert_int_equal(rec.calls, 0);
    assert_int_equal(rec2.calls, 1);
    assert_int_equal(rec2.token, 5);

    /* Combinators fail with PAWL_ECANCELED when an input is abandoned. */
    struct pawl_future *in = pawl_future_new();
    struct pawl_future *all = pawl_future_all(&in, 1);
    struct pawl_future *ot = pawl_future_or_timeout(in, timers, 60000);
    pawl_future_unref(in);
    int code;
    assert_int_equal(pawl_future_poll(all, NULL, &code, NULL), 0);
    assert_int_equal(code, PAWL_ECANCELED);
    assert_int_equal(pawl_future_poll(ot, NULL, &code, NULL), 0);
    assert_int_equal(code, PAWL_ECANCELED);
    pawl_future_unref(all);
    pawl_future_unref(ot);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_outcome_and_double_completion),
        cmocka_unit_test(test_continuation_on_pool),
        cmocka_unit_test(test_continuation_on_serial),
        cmocka_unit_test(test_complete_unref),
        cmocka_unit_test(test_foreign_completion_races_wait),
        cmocka_unit_test(test_no_lost_wakeups),
        cmocka_unit_test(test_double_completion_race),
        cmocka_unit_test(test_sleepers_woken),
        cmocka_unit_test(test_all_of),
        cmocka_unit_test(test_or_timeout_fires),
        cmocka_unit_test(test_or_timeout_does_not_fire),
        cmocka_unit_test(test_or_timeout_race),
        cmocka_unit_test(test_continuation_at_shutdown),
    };
    /* The cache's tests run with no pool (so no other thread frees futures meanwhile, and the
     * allocator hooks may change: the pool's workers have been joined). */
    const struct CMUnitTest cache_tests[] = {
        cmocka_unit_test(test_cache_reuses_objects),
        cmocka_unit_test(test_cache_thread_exit),
        cmocka_unit_test(test_cache_cap),
        cmocka_unit_test(test_cache_honours_allocator),
        cmocka_unit_test(test_complete_unref_frees),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed + cmocka_run_group_tests(cache_tests, NULL, NULL);
}
