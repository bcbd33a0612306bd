/*
 * test_runtime_future.c (stress) — futures at volume: a million futures whose continuations are
 * registered while another thread completes them (no lost wake-up: every continuation runs
 * exactly once), the same with the completer handing its reference over (complete_unref), blocking
 * waits racing completion, all-of groups with random failures, and two completers racing each other
 * on every future while a third thread registers a continuation and blocks in a wait on it (exactly
 * one completion wins; the outcome is the winner's; every continuation runs once; no waiter sleeps
 * through the completion), and the object cache under churn: short-lived threads create futures
 * whose last reference is dropped on pool workers, so objects keep moving between threads through
 * the depot while threads exit and hand theirs in (every new future must be pristine, every
 * continuation must see its own future's outcome).
 */
#include "pawl_test.h"
#include "runtime_test.h"

#include <stdatomic.h>
#include <stdlib.h>

static struct pawl_pool *pool;
static uint64_t calls;

static void count_cb(void *arg, struct pawl_future *f)
{
    rt_inc(&calls);
}

struct completer {
    struct pawl_future **fs;
    int n;
};

static void *complete_all(void *arg)
{
    struct completer *c = arg;
    for (int i = 0; i < c->n; i++)
        pawl_future_complete(c->fs[i], i);
    return NULL;
}

static void test_million(void **state)
{
    struct pawl_pool_opts o = {.workers = 2};
    assert_int_equal(pawl_pool_new(&pool, &o), 0);
    int total = PAWL_TEST_SCALE(1000000), chunk = 50000;
    struct pawl_future **fs = calloc((size_t)chunk, sizeof(*fs));
    calls = 0;
    for (int done = 0; done < total; done += chunk) {
        int n = total - done < chunk ? total - done : chunk;
        for (int i = 0; i < n; i++)
            fs[i] = pawl_future_new();
        struct completer c = {fs, n};
        pthread_t th;
        pthread_create(&th, NULL, complete_all, &c);
        for (int i = 0; i < n; i++)
            pawl_future_on_complete(fs[i], NULL, pool, count_cb, NULL);
        pthread_join(th, NULL);
        for (int i = 0; i < n; i++)
            pawl_future_unref(fs[i]);
    }
    assert_true(RT_WAIT_UNTIL(rt_load(&calls) == (uint64_t)total, 120000));
    free(fs);
    pawl_pool_free(pool);
}

/* complete_unref at volume: the completer holds its own reference to every future and hands it
 * over as it completes (every third fails instead), while this thread registers one or two
 * continuations on the pool or a serial executor, blocks in a wait on some, and drops its own
 * reference, often before the completion. Every continuation runs once and sees its future's own
 * outcome; use after free and leaks are the ASan build's to find. */
static uint64_t handover_bad;

static void handover_cb(void *arg, struct pawl_future *f)
{
    intptr_t i = (intptr_t)arg;
    int64_t tok;
    int code;
    if (pawl_future_poll(f, &tok, &code, NULL) != 0 ||
        (i % 3 == 2 ? code != PAWL_EHANDLER : code != 0 || tok != i))
        rt_inc(&handover_bad);
    rt_inc(&calls);
}

static void *complete_unref_all(void *arg)
{
    struct completer *c = arg;
    for (int i = 0; i < c->n; i++) {
        int rc = i % 3 == 2 ? pawl_future_fail_unref(c->fs[i], PAWL_EHANDLER, "handed over")
                            : pawl_future_complete_unref(c->fs[i], i);
        if (rc != 0)
            rt_inc(&handover_bad);
    }
    return NULL;
}

static void test_million_handover(void **state)
{
    struct pawl_pool_opts o = {.workers = 2};
    assert_int_equal(pawl_pool_new(&pool, &o), 0);
    struct pawl_serial s;
    pawl_serial_init(&s, pool);
    int total = PAWL_TEST_SCALE(1000000), chunk = 50000;
    struct pawl_future **fs = calloc((size_t)chunk, sizeof(*fs));
    calls = handover_bad = 0;
    uint64_t want = 0;
    for (int done = 0; done < total; done += chunk) {
        int n = total - done < chunk ? total - done : chunk;
        for (int i = 0; i < n; i++)
            fs[i] = pawl_future_ref(pawl_future_new()); /* this thread's and the completer's */
        struct completer c = {fs, n};
        pthread_t th;
        pthread_create(&th, NULL, complete_unref_all, &c);
        for (int i = 0; i < n; i++) {
            void *arg = (void *)(intptr_t)i;
            assert_int_equal(
                pawl_future_on_complete(fs[i], i % 4 == 1 ? &s : NULL, pool, handover_cb, arg), 0);
            want++;
            if (i % 4 == 3) {
                assert_int_equal(pawl_future_on_complete(fs[i], NULL, pool, handover_cb, arg), 0);
                want++;
            }
            if (i % 8 == 0)
                assert_int_equal(pawl_future_wait(fs[i], 60000), 0);
            pawl_future_unref(fs[i]);
        }
        pthread_join(th, NULL);
    }
    assert_true(RT_WAIT_UNTIL(rt_load(&calls) == want, 120000));
    assert_int_equal(rt_load(&handover_bad), 0);
    free(fs);
    assert_true(RT_WAIT_UNTIL(pawl_serial_idle(&s), 60000));
    pawl_serial_fini(&s);
    pawl_pool_free(pool);
}

static void test_wait_races(void **state)
{
    int n = PAWL_TEST_SCALE(200000);
    struct pawl_future **fs = calloc((size_t)n, sizeof(*fs));
    for (int i = 0; i < n; i++)
        fs[i] = pawl_future_new();
    struct completer c = {fs, n};
    pthread_t th;
    pthread_create(&th, NULL, complete_all, &c);
    for (int i = 0; i < n; i++) {
        assert_int_equal(pawl_future_wait(fs[i], 60000), 0);
        int64_t tok;
        pawl_future_poll(fs[i], &tok, NULL, NULL);
        assert_int_equal(tok, i);
    }
    pthread_join(th, NULL);
    for (int i = 0; i < n; i++)
        pawl_future_unref(fs[i]);
    free(fs);
}

struct duel {
    struct pawl_future **fs;
    _Atomic uint32_t *wins; /* completions that returned 0, per future */
    uint8_t *won;           /* 1 where this completer won (its own array) */
    int n;
    int fails; /* this completer fails its futures instead of completing them */
};

static void *duel_complete(void *arg)
{
    struct duel *d = arg;
    for (int i = 0; i < d->n; i++) {
        int rc = d->fails ? pawl_future_fail(d->fs[i], PAWL_EHANDLER, "the failing side")
                          : pawl_future_complete(d->fs[i], i);
        if (rc == 0) {
            d->won[i] = 1;
            /* Relaxed: totalled after the join. */
            atomic_fetch_add_explicit(&d->wins[i], 1, memory_order_relaxed);
        } else {
            assert_int_equal(rc, PAWL_EALREADY);
        }
    }
    return NULL;
}

static void test_completers_race(void **state)
{
    struct pawl_pool_opts o = {.workers = 2};
    assert_int_equal(pawl_pool_new(&pool, &o), 0);
    int n = PAWL_TEST_SCALE(200000);
    struct pawl_future **fs = calloc((size_t)n, sizeof(*fs));
    _Atomic uint32_t *wins = calloc((size_t)n, sizeof(*wins));
    uint8_t *won_a = calloc((size_t)n, 1), *won_b = calloc((size_t)n, 1);
    for (int i = 0; i < n; i++)
        fs[i] = pawl_future_new();
    calls = 0;
    struct duel a = {fs, wins, won_a, n, 0}, b = {fs, wins, won_b, n, 1};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, duel_complete, &a);
    pthread_create(&tb, NULL, duel_complete, &b);
    for (int i = 0; i < n; i++) {
        assert_int_equal(pawl_future_on_complete(fs[i], NULL, pool, count_cb, NULL), 0);
        if (i % 2 == 0)
            assert_int_equal(pawl_future_wait(fs[i], 60000), 0);
    }
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    for (int i = 0; i < n; i++) {
        assert_int_equal(wins[i], 1);
        assert_int_equal(won_a[i] + won_b[i], 1);
        int64_t tok;
        int code;
        assert_int_equal(pawl_future_poll(fs[i], &tok, &code, NULL), 0);
        if (won_a[i]) {
            assert_int_equal(code, 0);
            assert_int_equal(tok, i);
        } else {
            assert_int_equal(code, PAWL_EHANDLER);
        }
        pawl_future_unref(fs[i]);
    }
    assert_true(RT_WAIT_UNTIL(rt_load(&calls) == (uint64_t)n, 120000));
    free(won_b);
    free(won_a);
    free(wins);
    free(fs);
    pawl_pool_free(pool);
}

#define CHURN_N 3000

static uint64_t churn_bad, churn_regs;

static void churn_check(void *arg, struct pawl_future *f)
{
    int64_t tok = -1;
    if (pawl_future_poll(f, &tok, NULL, NULL) != 0 || tok != (int64_t)(intptr_t)arg)
        rt_inc(&churn_bad);
    rt_inc(&calls);
}

static void *churn_thread(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    struct pawl_future *fs[64];
    for (int done = 0; done < CHURN_N;) {
        int n = 1 + rand_r(&seed) % 64;
        for (int i = 0; i < n; i++) {
            fs[i] = pawl_future_new();
            if (pawl_future_done(fs[i]) || pawl_future_poll(fs[i], NULL, NULL, NULL) != PAWL_EAGAIN)
                rt_inc(&churn_bad); /* a recycled object that was not reset, or still in use */
            int64_t tok = (int64_t)(seed % 1000000);
            for (int k = 0; k < (i % 3 == 0 ? 2 : 1); k++) {
                assert_int_equal(
                    pawl_future_on_complete(fs[i], NULL, pool, churn_check, (void *)(intptr_t)tok),
                    0);
                rt_inc(&churn_regs);
            }
            pawl_future_complete(fs[i], tok);
        }
        for (int i = 0; i < n; i++)
            pawl_future_unref(fs[i]);
        done += n;
    }
    return NULL;
}

static void test_cache_churn(void **state)
{
    struct pawl_pool_opts o = {.workers = 2};
    assert_int_equal(pawl_pool_new(&pool, &o), 0);
    calls = 0;
    churn_bad = 0;
    churn_regs = 0;
    int rounds = PAWL_TEST_SCALE(200);
    for (int r = 0; r < rounds; r++) {
        pthread_t th[3];
        for (int t = 0; t < 3; t++)
            pthread_create(&th[t], NULL, churn_thread, (void *)(uintptr_t)(r * 3 + t + 1));
        for (int t = 0; t < 3; t++)
            pthread_join(th[t], NULL);
    }
    assert_true(rt_load(&churn_regs) > (uint64_t)rounds * 3 * CHURN_N);
    assert_true(RT_WAIT_UNTIL(rt_load(&calls) == rt_load(&churn_regs), 120000));
    pawl_pool_free(pool);
    assert_int_equal(calls, churn_regs); /* none ran twice */
    assert_int_equal(churn_bad, 0);
}

static void test_all_of_random(void **state)
{
    int groups = PAWL_TEST_SCALE(50000);
    unsigned seed = 3;
    for (int g = 0; g < groups; g++) {
        int n = 1 + rand_r(&seed) % 6, fail_at = rand_r(&seed) % 8; /* >= n: no failure */
        struct pawl_future *in[6];
        for (int i = 0; i < n; i++)
            in[i] = pawl_future_new();
        struct pawl_future *all = pawl_future_all(in, (size_t)n);
        int64_t lowest = INT64_MAX;
        for (int i = n - 1; i >= 0; i--) {
            if (i == fail_at) {
                pawl_future_fail(in[i], PAWL_ECHECKPOINT, "x");
            } else {
                int64_t tok = rand_r(&seed) % 1000;
                lowest = tok < lowest ? tok : lowest;
                pawl_future_complete(in[i], tok);
            }
        }
        int64_t tok;
        int code;
        assert_int_equal(pawl_future_poll(all, &tok, &code, NULL), 0);
        if (fail_at < n)
            assert_int_equal(code, PAWL_ECHECKPOINT);
        else
            assert_int_equal(tok, lowest);
        pawl_future_unref(all);
        for (int i = 0; i < n; i++)
            pawl_future_unref(in[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_million),       cmocka_unit_test(test_wait_races),
        cmocka_unit_test(test_all_of_random), cmocka_unit_test(test_completers_race),
        cmocka_unit_test(test_cache_churn),   cmocka_unit_test(test_million_handover),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
