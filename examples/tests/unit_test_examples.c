/*
 * unit_test_examples.c — the two example checkpointing units on their own: events are fed
 * through a subscribing processor (which calls handle() on this thread) and the checkpoint
 * callbacks are called the way the work package calls them, so each contract rule of the
 * examples is checked without a running processor.
 */
#include "pawl_test.h"

#include "async_sink.h"
#include "projection.h"
#include "trigger.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SEG0 ((struct pawl_segment){0, 0})

static char dir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/pawl-ex-%d-XXXXXX", (int)getpid());
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Feed events first..last (indexes) to h's handle() through a subscriber. */
static void feed(const struct pawl_handler *h, int64_t first, int64_t last)
{
    struct pawl_subscriber *s = NULL;
    assert_int_equal(pawl_subscriber_new(&s, h, 1), 0);
    for (int64_t i = first; i <= last; i++) {
        char id[16];
        snprintf(id, sizeof id, "s%lld", (long long)(i % 7));
        struct pawl_event e = {.index = i, .stream_id = id, .stream_seq = i, .type = "t"};
        assert_int_equal(pawl_subscriber_publish(s, &e, 1, NULL), 0);
    }
    pawl_subscriber_free(s);
}

/* Wait for f and return its token (or the negated error code); drops the reference. */
static int64_t await(struct pawl_future *f, int ms)
{
    assert_non_null(f);
    assert_int_equal(pawl_future_wait(f, ms), 0);
    int64_t tok = 0;
    int code = 0;
    assert_int_equal(pawl_future_poll(f, &tok, &code, NULL), 0);
    pawl_future_unref(f);
    return code ? code : tok;
}

static void test_projection_snapshots_asynchronously(void **state)
{
    (void)state;
    struct ex_projection *p = NULL;
    assert_int_equal(ex_projection_new(&p, dir, 0), 0);
    struct pawl_handler h = ex_projection_handler(p, "projection");
    const struct pawl_checkpointing *c = h.ckpt;
    assert_int_equal(c->on_segment_claimed(h.self, SEG0, NULL), 0);
    feed(&h, 1, 100);
    struct ex_proj_state st, want = {0}, disk;
    for (int64_t i = 1; i <= 100; i++)
        ex_proj_apply(&want, i);
    assert_int_equal(ex_projection_get(p, SEG0, &st), 0);
    assert_int_equal(st.count, 100);
    assert_int_equal(st.hash, want.hash);
    /* Nothing is durable until a checkpoint. */
    assert_int_equal(ex_projection_load(dir, SEG0, &disk), PAWL_ENOTFOUND);
    /* Checkpoint at 120 (events 101..120 belonged to other segments): the snapshot covers it. */
    assert_int_equal(await(c->on_checkpoint_advanced(h.self, SEG0, 120), 5000), 120);
    assert_int_equal(ex_projection_load(dir, SEG0, &disk), 0);
    assert_int_equal(disk.pos, 120);
    assert_int_equal(disk.count, 100);
    assert_int_equal(disk.hash, want.hash);
    /* A snapshot that cannot be written fails the future (and so the checkpoint). */
    ex_projection_fail_snapshots(p, 1);
    assert_int_equal(await(c->on_checkpoint_advanced(h.self, SEG0, 120), 5000), PAWL_ESYS);
    /* Release: a final snapshot at up_to, and the segment's state is dropped. */
    feed(&h, 121, 130);
    assert_int_equal(await(c->on_segment_released(h.self, SEG0, 135), 5000), 135);
    assert_int_equal(ex_projection_get(p, SEG0, &st), PAWL_ENOTFOUND);
    for (int64_t i = 121; i <= 130; i++)
        ex_proj_apply(&want, i);
    assert_int_equal(ex_projection_load(dir, SEG0, &disk), 0);
    assert_int_equal(disk.count, 110);
    assert_int_equal(disk.hash, want.hash);
    ex_projection_free(p);
}

static void test_projection_skips_what_its_snapshot_holds(void **state)
{
    (void)state;
    /* Continues from the previous test's snapshot (pos 135, 110 events). A redelivery from an
     * older stored token (say 100) must not apply 101..135 twice. */
    struct ex_projection *p = NULL;
    assert_int_equal(ex_projection_new(&p, dir, 0), 0);
    struct pawl_handler h = ex_projection_handler(p, "projection");
    assert_int_equal(h.ckpt->on_segment_claimed(h.self, SEG0, NULL), 0);
    feed(&h, 101, 150);
    struct ex_proj_state st, want = {0};
    for (int64_t i = 1; i <= 100; i++) /* the first test fed 1..100 and 121..130 */
        ex_proj_apply(&want, i);
    for (int64_t i = 121; i <= 130; i++)
        ex_proj_apply(&want, i);
    for (int64_t i = 136; i <= 150; i++)
        ex_proj_apply(&want, i);
    assert_int_equal(ex_projection_get(p, SEG0, &st), 0);
    assert_int_equal(st.count, 125);
    assert_int_equal(st.hash, want.hash);
    ex_projection_free(p);
}

static void count_wake(void *arg)
{
    (void)arg;
}

static void test_async_checkpoint_is_a_barrier(void **state)
{
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/sink", dir);
    struct ex_async_opts o = {.path = path, .threads = 3, .delay_us = 100, .every = 10};
    struct ex_async *a = NULL;
    assert_int_equal(ex_async_new(&a, &o), 0);
    struct pawl_handler h = ex_async_handler(a, "async");
    const struct pawl_checkpointing *c = h.ckpt;
    struct pawl_trigger *t = pawl__trigger_new(count_wake, NULL);
    assert_int_equal(c->on_segment_claimed(h.self, SEG0, t), 0);

    ex_async_pause(a, 1);
    feed(&h, 1, 100); /* handle() returns at once: the work is queued, not done */
    struct pawl_future *f = c->on_checkpoint_advanced(h.self, SEG0, 100);
    usleep(50000);
    assert_int_equal(pawl_future_done(f), 0); /* the barrier holds while work is in flight */
    ex_async_pause(a, 0);
    int64_t rep = await(f, 10000);
    assert_true(rep >= 100);
    assert_int_equal(ex_async_delivered(a), 100);
    /* Its own threads asked for checkpoints as deliveries drained (any thread may). */
    int64_t got;
    assert_true(pawl__trigger_take(t, 100, &got));
    assert_true(got > 0 && got <= 100);

    /* Nothing in flight: a checkpoint completes at once. */
    assert_int_equal(await(c->on_checkpoint_advanced(h.self, SEG0, 100), 1000), 100);

    /* Release with work in flight reports what is delivered without a gap, without waiting. */
    ex_async_pause(a, 1);
    feed(&h, 101, 120);
    int64_t rel = await(c->on_segment_released(h.self, SEG0, 120), 1000);
    assert_int_equal(rel, 100);
    pawl__trigger_invalidate(t); /* what the worker does after the release */
    ex_async_pause(a, 0);
    ex_async_free(a); /* drains: in-flight deliveries complete; their requests are ignored */
    pawl__trigger_free(t);

    /* At least once: every index reached the sink. */
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    int seen[121] = {0};
    unsigned sid;
    long long idx;
    while (fscanf(fp, "%u %lld", &sid, &idx) == 2)
        if (idx >= 1 && idx <= 120)
            seen[idx]++;
    fclose(fp);
    for (int i = 1; i <= 120; i++)
        assert_true(seen[i] >= 1);
}

static void test_async_failing_barrier_fails_the_future(void **state)
{
    (void)state;
    struct ex_async_opts o = {.threads = 1};
    struct ex_async *a = NULL;
    assert_int_equal(ex_async_new(&a, &o), 0);
    struct pawl_handler h = ex_async_handler(a, "async");
    struct pawl_trigger *t = pawl__trigger_new(NULL, NULL);
    assert_int_equal(h.ckpt->on_segment_claimed(h.self, SEG0, t), 0);
    feed(&h, 1, 10);
    ex_async_fail_barriers(a, 1);
    assert_int_equal(await(h.ckpt->on_checkpoint_advanced(h.self, SEG0, 10), 1000), PAWL_EHANDLER);
    ex_async_free(a);
    pawl__trigger_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_projection_snapshots_asynchronously),
        cmocka_unit_test(test_projection_skips_what_its_snapshot_holds),
        cmocka_unit_test(test_async_checkpoint_is_a_barrier),
        cmocka_unit_test(test_async_failing_barrier_fails_the_future),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
