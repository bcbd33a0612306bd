/*
 * test_checkpoint_trigger.c — conformance scenarios of the checkpoint trigger on its own:
 * concurrent requests merging to the highest, LATEST, per-segment triggers, inertness after
 * release, the wake protocol, and references held past release.
 */
#include "pawl_test.h"

#include "trigger.h"

#include <pthread.h>
#include <stdatomic.h>

static _Atomic int wakes;
static void count_wake(void *arg)
{
    (void)arg;
    atomic_fetch_add(&wakes, 1);
}

enum { THREADS = 4, PER_THREAD = 20000 };

struct req_arg {
    struct pawl_trigger *t;
    int k;
};

static void *requester(void *p)
{
    struct req_arg *a = p;
    /* Thread k requests k, k + THREADS, ...: the overall highest is THREADS * PER_THREAD - 1. */
    for (int i = 0; i < PER_THREAD; i++)
        assert_int_equal(pawl_trigger_request(a->t, (int64_t)i * THREADS + a->k), 0);
    return NULL;
}

static void test_concurrent_requests_merge_to_highest(void **state)
{
    (void)state;
    atomic_store(&wakes, 0);
    struct pawl_trigger *t = pawl__trigger_new(count_wake, NULL);
    assert_non_null(t);
    pthread_t th[THREADS];
    struct req_arg args[THREADS];
    for (int k = 0; k < THREADS; k++) {
        args[k] = (struct req_arg){t, k};
        assert_int_equal(pthread_create(&th[k], NULL, requester, &args[k]), 0);
    }
    for (int k = 0; k < THREADS; k++)
        pthread_join(th[k], NULL);
    int64_t got = -1;
    assert_true(pawl__trigger_take(t, INT64_MAX - 1, &got));
    assert_int_equal(got, (int64_t)THREADS * PER_THREAD - 1);
    /* Nothing pending was re-armed in between: the many requests woke the worker once. */
    assert_int_equal(atomic_load(&wakes), 1);
    assert_false(pawl__trigger_take(t, INT64_MAX - 1, &got));
    pawl__trigger_free(t);
}

static void test_lower_request_does_not_lower_pending(void **state)
{
    (void)state;
    struct pawl_trigger *t = pawl__trigger_new(NULL, NULL);
    assert_int_equal(pawl_trigger_request(t, 50), 0);
    assert_int_equal(pawl_trigger_request(t, 20), 0);
    int64_t got;
    assert_true(pawl__trigger_take(t, 100, &got));
    assert_int_equal(got, 50);
    assert_int_equal(pawl_trigger_request(t, -5), PAWL_ERANGE);
    assert_false(pawl__trigger_has_pending(t));
    pawl__trigger_free(t);
}

static void test_latest_resolves_to_last_consumed(void **state)
{
    (void)state;
    struct pawl_trigger *t = pawl__trigger_new(NULL, NULL);
    assert_int_equal(pawl_trigger_request(t, 10), 0);
    assert_int_equal(pawl_trigger_request_latest(t), 0);
    int64_t got;
    /* LATEST wins over any explicit token and resolves when taken, not when requested. */
    assert_true(pawl__trigger_take(t, 77, &got));
    assert_int_equal(got, 77);
    pawl__trigger_free(t);
}

static void test_request_beyond_consumed_waits(void **state)
{
    (void)state;
    struct pawl_trigger *t = pawl__trigger_new(NULL, NULL);
    assert_int_equal(pawl_trigger_request(t, 500), 0);
    int64_t got = -1;
    assert_false(pawl__trigger_ready(t, 300));
    assert_true(pawl__trigger_ready(t, 500));
    assert_false(pawl__trigger_take(t, 300, &got));
    assert_true(pawl__trigger_has_pending(t));
    assert_false(pawl__trigger_take(t, 499, &got));
    assert_true(pawl__trigger_take(t, 500, &got));
    assert_int_equal(got, 500);
    pawl__trigger_free(t);
}

static void test_wake_once_per_take(void **state)
{
    (void)state;
    atomic_store(&wakes, 0);
    struct pawl_trigger *t = pawl__trigger_new(count_wake, NULL);
    pawl_trigger_request(t, 1);
    pawl_trigger_request(t, 2);
    assert_int_equal(atomic_load(&wakes), 1);
    int64_t got;
    assert_true(pawl__trigger_take(t, 10, &got));
    pawl_trigger_request(t, 3);
    assert_int_equal(atomic_load(&wakes), 2);
    /* A request that does not raise pending is not news and does not wake. */
    assert_true(pawl__trigger_take(t, 10, &got));
    pawl_trigger_request(t, 3);
    pawl_trigger_request(t, 2);
    assert_int_equal(atomic_load(&wakes), 3);
    pawl__trigger_free(t);
}

static void test_triggers_are_per_segment(void **state)
{
    (void)state;
    struct pawl_trigger *a = pawl__trigger_new(NULL, NULL);
    struct pawl_trigger *b = pawl__trigger_new(NULL, NULL);
    assert_int_equal(pawl_trigger_request(a, 40), 0);
    int64_t got;
    assert_false(pawl__trigger_take(b, 100, &got));
    assert_false(pawl__trigger_has_pending(b));
    assert_int_equal(pawl_trigger_request(b, 7), 0);
    assert_true(pawl__trigger_take(a, 100, &got));
    assert_int_equal(got, 40);
    assert_true(pawl__trigger_take(b, 100, &got));
    assert_int_equal(got, 7);
    /* Releasing one segment leaves the other's trigger live. */
    pawl__trigger_invalidate(a);
    assert_int_equal(pawl_trigger_request(a, 50), PAWL_ESHUTDOWN);
    assert_int_equal(pawl_trigger_request(b, 50), 0);
    pawl__trigger_free(a);
    pawl__trigger_free(b);
}

static void test_request_after_release_is_ignored(void **state)
{
    (void)state;
    atomic_store(&wakes, 0);
    struct pawl_trigger *t = pawl__trigger_new(count_wake, NULL);
    /* A unit keeps the trigger past the release (its own thread may still call it). */
    struct pawl_trigger *kept = pawl_trigger_ref(t);
    assert_int_equal(pawl_trigger_is_live(kept), 1);
    pawl_trigger_request(t, 5);
    pawl__trigger_free(t); /* the worker releases the segment and drops its reference */
    assert_int_equal(pawl_trigger_is_live(kept), 0);
    assert_int_equal(pawl_trigger_request(kept, 9), PAWL_ESHUTDOWN);
    assert_int_equal(pawl_trigger_request_latest(kept), PAWL_ESHUTDOWN);
    assert_int_equal(atomic_load(&wakes), 1);
    pawl_trigger_unref(kept); /* the last reference frees it (ASan checks) */
    pawl_trigger_unref(NULL);
    pawl__trigger_free(NULL);
}

/* Requests race with invalidate: no wake may run after invalidate returns. */
static _Atomic int after_invalidate;
static _Atomic int invalidated;
static void check_wake(void *arg)
{
    (void)arg;
    if (atomic_load(&invalidated))
        atomic_fetch_add(&after_invalidate, 1);
}

struct race_arg {
    struct pawl_trigger *t;
    int k;
};

static void *racer(void *p)
{
    struct race_arg *a = p;
    for (int i = 0; i < 100000; i++) {
        if (pawl_trigger_request(a->t, i) == PAWL_ESHUTDOWN)
            break;
    }
    return NULL;
}

static void test_invalidate_waits_for_running_wakes(void **state)
{
    (void)state;
    for (int round = 0; round < 20; round++) {
        atomic_store(&invalidated, 0);
        struct pawl_trigger *t = pawl__trigger_new(check_wake, NULL);
        pthread_t th[2];
        struct race_arg args[2] = {{pawl_trigger_ref(t), 0}, {pawl_trigger_ref(t), 1}};
        for (int k = 0; k < 2; k++)
            pthread_create(&th[k], NULL, racer, &args[k]);
        int64_t got;
        for (int i = 0; i < 200; i++)
            pawl__trigger_take(t, INT64_MAX - 1, &got); /* re-arm so requests keep waking */
        pawl__trigger_invalidate(t);
        atomic_store(&invalidated, 1);
        for (int k = 0; k < 2; k++) {
            pthread_join(th[k], NULL);
            pawl_trigger_unref(args[k].t);
        }
        pawl__trigger_free(t);
    }
    assert_int_equal(atomic_load(&after_invalidate), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_requests_merge_to_highest),
        cmocka_unit_test(test_lower_request_does_not_lower_pending),
        cmocka_unit_test(test_latest_resolves_to_last_consumed),
        cmocka_unit_test(test_request_beyond_consumed_waits),
        cmocka_unit_test(test_wake_once_per_take),
        cmocka_unit_test(test_triggers_are_per_segment),
        cmocka_unit_test(test_request_after_release_is_ignored),
        cmocka_unit_test(test_invalidate_waits_for_running_wakes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
