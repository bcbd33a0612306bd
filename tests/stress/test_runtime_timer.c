/*
 * test_runtime_timer.c (stress) — timers under churn on both backends: tens of thousands of
 * timers, cancels from several threads racing the expiries (each timer fires at most once, and
 * exactly once when cancel says it was too late), periodic timers stopped and restarted, and
 * or-timeouts racing their inputs.
 */
#include "pawl_test.h"
#include "runtime_test.h"
#include "uring_probe.h"

#include <stdlib.h>
#include <string.h>

static struct pawl_pool *pool;

struct rec {
    struct pawl_timer t;
    uint64_t fired;
    int cancel_rc;
};

static void rec_cb(struct pawl_timer *t, void *arg, int status)
{
    rt_inc(&((struct rec *)arg)->fired);
}

struct canceller {
    struct pawl_timers *tm;
    struct rec *r;
    int from, n, step;
};

static void *cancel_some(void *arg)
{
    struct canceller *c = arg;
    for (int i = c->from; i < c->n; i += c->step) {
        usleep((unsigned)(i % 3) * 100);
        c->r[i].cancel_rc = pawl_timer_cancel(c->tm, &c->r[i].t);
    }
    return NULL;
}

static void churn(enum pawl_timer_backend b)
{
    struct pawl_timers_opts o;
    pawl_timers_opts_defaults(&o);
    o.backend = b;
    struct pawl_timers *tm;
    if (pawl_timers_new(&tm, pool, &o) != 0) {
        /* Only the kernel's refusal of io_uring excuses this half (and not under
         * PAWL_REQUIRE_IO_URING); anything else is a set-up bug. */
        char why[256] = "";
        if (b == PAWL_TIMER_BACKEND_IO_URING && pawl_test_uring_refused(why, sizeof why) &&
            !pawl_test_uring_required()) {
            print_message("io_uring round not run: the kernel refuses io_uring (%s); the epoll "
                          "round runs\n",
                          why);
            return;
        }
        fail_msg("pawl_timers_new(%s) failed where the kernel allows it",
                 b == PAWL_TIMER_BACKEND_IO_URING ? "io_uring" : "epoll");
    }
    int n = PAWL_TEST_SCALE(20000);
    struct rec *r = calloc((size_t)n, sizeof(*r));
    for (int i = 0; i < n; i++) {
        pawl_timer_init(&r[i].t, rec_cb, &r[i]);
        r[i].cancel_rc = 1; /* not cancelled */
        assert_int_equal(pawl_timer_start(tm, &r[i].t, i % 50, 0), 0);
    }
    pthread_t th[3];
    struct canceller c[3];
    for (int k = 0; k < 3; k++) {
        c[k] = (struct canceller){tm, r, k, n, 5}; /* 3 of every 5 timers get a cancel */
        pthread_create(&th[k], NULL, cancel_some, &c[k]);
    }
    for (int k = 0; k < 3; k++)
        pthread_join(th[k], NULL);
    for (int i = 0; i < n; i++) {
        assert_true(RT_WAIT_UNTIL(!pawl_timer_busy(&r[i].t), 30000));
        if (r[i].cancel_rc == 0) {
            assert_int_equal(rt_load(&r[i].fired), 0);
        } else {
            assert_true(RT_WAIT_UNTIL(rt_load(&r[i].fired) == 1, 30000));
        }
    }
    usleep(60000);
    for (int i = 0; i < n; i++)
        assert_true(rt_load(&r[i].fired) <= 1);
    /* Periodic churn: start, let it tick, stop, restart. */
    for (int round = 0; round < PAWL_TEST_SCALE(50); round++) {
        struct rec p = {0};
        pawl_timer_init(&p.t, rec_cb, &p);
        assert_int_equal(pawl_timer_start(tm, &p.t, 0, 1), 0);
        usleep(3000);
        assert_int_equal(pawl_timer_cancel(tm, &p.t), 0);
        assert_true(RT_WAIT_UNTIL(!pawl_timer_busy(&p.t), 10000));
        uint64_t f = rt_load(&p.fired);
        usleep(3000);
        assert_int_equal(rt_load(&p.fired), f);
    }
    /* or-timeout racing its input. */
    for (int i = 0; i < PAWL_TEST_SCALE(5000); i++) {
        struct pawl_future *f = pawl_future_new();
        struct pawl_future *g = pawl_future_or_timeout(f, tm, i % 3);
        if (i % 2)
            usleep(500);
        pawl_future_complete(f, i);
        assert_int_equal(pawl_future_wait(g, 10000), 0);
        pawl_future_unref(g);
        pawl_future_unref(f);
    }
    assert_true(RT_WAIT_UNTIL(pawl_timers_armed(tm) == 0, 10000));
    print_message("%s: %d timers with concurrent cancels settled\n", pawl_timers_backend(tm), n);
    pawl_timers_free(tm);
    free(r);
}

static void test_churn_both_backends(void **state)
{
    struct pawl_pool_opts o = {.workers = 2};
    assert_int_equal(pawl_pool_new(&pool, &o), 0);
    churn(PAWL_TIMER_BACKEND_IO_URING);
    churn(PAWL_TIMER_BACKEND_EPOLL);
    pawl_pool_free(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_churn_both_backends)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
