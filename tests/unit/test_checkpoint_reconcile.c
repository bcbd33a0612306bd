/*
 * test_checkpoint_reconcile.c — conformance scenarios of the checkpoint protocol's reconciler,
 * deterministic and in memory: several scripted units on one segment, futures completed at once
 * or later from the test thread, cycles run on a real serial executor of a real pool.
 */
#include "pawl_test.h"

#include "reconcile.h"
#include "trigger.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- scripted units ---- */

enum act { ACT_COVER = 0, ACT_REPORT, ACT_PLUS, ACT_FAIL, ACT_PENDING, ACT_NULL, ACT_HANG_TIMEOUT };

struct step {
    enum act act;
    int64_t v;
};

#define MAXCALLS 32
#define PAWL_EIO_TEST PAWL_ESYS

struct fake {
    const char *name;
    pthread_mutex_t mu;
    struct step script[MAXCALLS]; /* per on_checkpoint_advanced call; then ACT_COVER */
    struct step rel;              /* on_segment_released's answer */
    int claim_rc;
    int calls, rel_calls, claims;
    int64_t asked[MAXCALLS];
    int64_t rel_asked;
    struct pawl_trigger *trigger;
    struct pawl_future *pending[MAXCALLS];
    int npending;
    struct pawl_future *hung; /* the never-completing future behind a time-out */
};

static struct pawl_future *answer(struct fake *u, struct step st, int64_t requested)
{
    struct pawl_future *f;
    switch (st.act) {
    case ACT_NULL:
        return NULL;
    case ACT_HANG_TIMEOUT:
        u->hung = pawl_future_new();
        return pawl_checkpoint_or_timeout(pawl_future_ref(u->hung), st.v);
    default:
        break;
    }
    f = pawl_future_new();
    assert_non_null(f);
    switch (st.act) {
    case ACT_COVER:
        pawl_future_complete(f, requested);
        break;
    case ACT_REPORT:
        pawl_future_complete(f, st.v);
        break;
    case ACT_PLUS:
        pawl_future_complete(f, requested + st.v);
        break;
    case ACT_FAIL:
        pawl_future_fail(f, PAWL_ESYS, "disk on fire");
        break;
    case ACT_PENDING:
        u->pending[u->npending++] = pawl_future_ref(f);
        break;
    default:
        break;
    }
    return f;
}

static struct pawl_future *fake_advanced(void *self, struct pawl_segment seg, int64_t requested)
{
    (void)seg;
    struct fake *u = self;
    pthread_mutex_lock(&u->mu);
    int k = u->calls++;
    u->asked[k] = requested;
    struct pawl_future *f = answer(u, u->script[k], requested);
    pthread_mutex_unlock(&u->mu);
    return f;
}

static struct pawl_future *fake_released(void *self, struct pawl_segment seg, int64_t up_to)
{
    (void)seg;
    struct fake *u = self;
    pthread_mutex_lock(&u->mu);
    u->rel_calls++;
    u->rel_asked = up_to;
    struct pawl_future *f = answer(u, u->rel, up_to);
    pthread_mutex_unlock(&u->mu);
    return f;
}

static int fake_claimed(void *self, struct pawl_segment seg, struct pawl_trigger *t)
{
    (void)seg;
    struct fake *u = self;
    u->claims++;
    if (u->claim_rc == 0)
        u->trigger = t;
    return u->claim_rc;
}

static const struct pawl_checkpointing with_release = {fake_claimed, fake_advanced, fake_released,
                                                       NULL};
static const struct pawl_checkpointing default_release = {fake_claimed, fake_advanced, NULL, NULL};

static int fake_calls(struct fake *u)
{
    pthread_mutex_lock(&u->mu);
    int n = u->calls;
    pthread_mutex_unlock(&u->mu);
    return n;
}

static int fake_npending(struct fake *u)
{
    pthread_mutex_lock(&u->mu);
    int n = u->npending;
    pthread_mutex_unlock(&u->mu);
    return n;
}

/* Complete the k-th pending future of u once the unit has handed it out. */
static void complete_pending(struct fake *u, int k, int64_t token)
{
    for (int i = 0; i < 5000 && fake_npending(u) <= k; i++)
        usleep(1000);
    assert_true(fake_npending(u) > k);
    pthread_mutex_lock(&u->mu);
    struct pawl_future *f = u->pending[k];
    pthread_mutex_unlock(&u->mu);
    if (token < 0)
        assert_int_equal(pawl_future_fail(f, PAWL_EIO_TEST, "late failure"), 0);
    else
        assert_int_equal(pawl_future_complete(f, token), 0);
}

/* ---- harness: a pool, one serial executor per segment, results through a condition ---- */

#define SEG ((struct pawl_segment){3, 15})

static struct pawl_pool *pool;
static struct pawl_timers *timers;

struct seg_h {
    struct pawl_serial serial;
    struct pawl_reconcile r;
    struct pawl_ckpt_unit units[4];
    struct fake fakes[4];
    size_t n;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int finished;
    int rc;
    int64_t to_store;
    int ncycles;
    /* the request being run */
    struct pawl_task task;
    struct pawl_task resume_task;
    int kind;
    int64_t a, b, c;
    struct seg_h *next_dead;
};

/* Segments are freed after the pool: a serial executor's storage must outlive its last drain. */
static struct seg_h *dead;

static void record(struct seg_h *h, int rc, int64_t to_store)
{
    pthread_mutex_lock(&h->mu);
    h->finished = 1;
    h->rc = rc;
    h->to_store = to_store;
    h->ncycles++;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static void resume_task(struct pawl_task *t, int status)
{
    struct seg_h *h = (struct seg_h *)((char *)t - offsetof(struct seg_h, resume_task));
    assert_int_equal(status, 0);
    int64_t to_store = -99;
    int rc = pawl__reconcile_resume(&h->r, &to_store);
    if (rc != PAWL_EAGAIN)
        record(h, rc, to_store);
}

/* The wake: schedule the segment's next step on its serial executor (never run it inline). */
static void on_wake(void *arg)
{
    struct seg_h *h = arg;
    h->resume_task.fn = resume_task;
    assert_int_equal(pawl_serial_submit(&h->serial, &h->resume_task), 0);
}

static void run_task(struct pawl_task *t, int status)
{
    struct seg_h *h = (struct seg_h *)((char *)t - offsetof(struct seg_h, task));
    assert_int_equal(status, 0);
    int64_t to_store = -99;
    int rc;
    if (h->kind == 1)
        rc = pawl__reconcile_checkpoint(&h->r, SEG, h->a, h->b, h->c, &to_store);
    else
        rc = pawl__reconcile_release(&h->r, SEG, h->a, h->b, &to_store);
    if (rc != PAWL_EAGAIN)
        record(h, rc, to_store);
}

static struct seg_h *seg_new(size_t n, const struct pawl_checkpointing *ckpt)
{
    struct seg_h *h = calloc(1, sizeof *h);
    assert_non_null(h);
    h->n = n;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    static const char *names[] = {"alpha", "beta", "gamma", "delta"};
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_init(&h->fakes[i].mu, NULL);
        h->fakes[i].name = names[i];
        h->units[i] = (struct pawl_ckpt_unit){names[i], &h->fakes[i], ckpt};
    }
    assert_int_equal(pawl_serial_init(&h->serial, pool), 0);
    assert_int_equal(pawl__reconcile_init(&h->r, h->units, n, NULL, pool, timers, on_wake, h), 0);
    return h;
}

static void seg_free(struct seg_h *h)
{
    pawl__reconcile_fini(&h->r);
    for (size_t i = 0; i < h->n; i++) {
        pthread_mutex_lock(&h->fakes[i].mu);
        for (int k = 0; k < h->fakes[i].npending; k++)
            pawl_future_unref(h->fakes[i].pending[k]);
        h->fakes[i].npending = 0;
        /* A never-completed future keeps its continuations (and what they hold) alive: settle
         * it while the pool still runs, as a unit would when it gives up. */
        if (h->fakes[i].hung != NULL)
            pawl_future_fail(h->fakes[i].hung, PAWL_ECANCELED, NULL);
        pthread_mutex_unlock(&h->fakes[i].mu);
    }
    h->next_dead = dead;
    dead = h;
}

static void seg_reap(void)
{
    while (dead != NULL) {
        struct seg_h *h = dead;
        dead = h->next_dead;
        pawl_serial_fini(&h->serial);
        for (size_t i = 0; i < h->n; i++)
            pawl_future_unref(h->fakes[i].hung);
        free(h);
    }
}

static void submit(struct seg_h *h, int kind, int64_t a, int64_t b, int64_t c)
{
    pthread_mutex_lock(&h->mu);
    h->finished = 0;
    pthread_mutex_unlock(&h->mu);
    h->kind = kind;
    h->a = a;
    h->b = b;
    h->c = c;
    h->task.fn = run_task;
    assert_int_equal(pawl_serial_submit(&h->serial, &h->task), 0);
}

/* Wait for the cycle's result; returns 0 when it finished within ms. */
static int wait_result(struct seg_h *h, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&h->mu);
    int rc = 0;
    while (!h->finished && rc == 0)
        rc = pthread_cond_timedwait(&h->cv, &h->mu, &ts);
    int fin = h->finished;
    pthread_mutex_unlock(&h->mu);
    return fin ? 0 : -1;
}

/* checkpoint(requested, stored, limit) to completion */
static void checkpoint(struct seg_h *h, int64_t requested, int64_t stored, int64_t limit)
{
    submit(h, 1, requested, stored, limit);
    assert_int_equal(wait_result(h, 10000), 0);
}

static void release(struct seg_h *h, int64_t up_to, int64_t stored)
{
    submit(h, 2, up_to, stored, 0);
    assert_int_equal(wait_result(h, 10000), 0);
}

static int setup(void **state)
{
    (void)state;
    struct pawl_pool_opts o;
    pawl_pool_opts_defaults(&o);
    o.workers = 2;
    if (pawl_pool_new(&pool, &o) != 0)
        return -1;
    if (pawl_timers_new(&timers, pool, NULL) != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pawl_timers_free(timers);
    pawl_pool_free(pool);
    seg_reap();
    return 0;
}

/* ---- scenarios ---- */

static void test_single_unit_covering_is_stored(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(1, &with_release);
    checkpoint(h, 100, 0, 100);
    assert_int_equal(h->rc, 0);
    assert_int_equal(h->to_store, 100);
    assert_int_equal(h->fakes[0].calls, 1);
    seg_free(h);
}

static void test_laggard_is_reasked_up_to_leader(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(3, &with_release);
    /* alpha covers exactly; beta drained further (150); gamma covers exactly. */
    h->fakes[1].script[0] = (struct step){ACT_REPORT, 150};
    checkpoint(h, 100, 0, 200);
    assert_int_equal(h->rc, 0);
    assert_int_equal(h->to_store, 150);
    assert_int_equal(h->fakes[0].calls, 2);
    assert_int_equal(h->fakes[0].asked[0], 100);
    assert_int_equal(h->fakes[0].asked[1], 150);
    assert_int_equal(h->fakes[1].calls, 1); /* the leader is not asked again */
    assert_int_equal(h->fakes[2].calls, 2);
    assert_int_equal(h->fakes[2].asked[1], 150);
    seg_free(h);
}

static void test_laggard_overtakes_leader(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(2, &with_release);
    /* beta leads with 150; alpha, re-asked with 150, reaches 180; beta is re-asked with 180. */
    h->fakes[1].script[0] = (struct step){ACT_REPORT, 150};
    h->fakes[0].script[1] = (struct step){ACT_REPORT, 180};
    checkpoint(h, 100, 0, 200);
    assert_int_equal(h->rc, 0);
    assert_int_equal(h->to_store, 180);
    assert_int_equal(h->fakes[0].calls, 2);
    assert_int_equal(h->fakes[1].calls, 2);
    assert_int_equal(h->fakes[1].asked[1], 180);
    seg_free(h);
}

static void test_report_beyond_consumed_counts_as_consumed(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(1, &with_release);
    h->fakes[0].script[0] = (struct step){ACT_REPORT, 10000};
    checkpoint(h, 100, 0, 120);
    assert_int_equal(h->rc, 0);
    assert_int_equal(h->to_store, 120);
    seg_free(h);
}

static void test_async_futures_are_awaited_without_blocking(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(2, &with_release);
    h->fakes[0].script[0] = (struct step){ACT_PENDING, 0};
    h->fakes[1].script[0] = (struct step){ACT_PENDING, 0};
    h->fakes[1].script[1] = (struct step){ACT_PENDING, 0};
    submit(h, 1, 100, 0, 300);
    complete_pending(&h->fakes[0], 0, 130);
    assert_int_equal(wait_result(h, 50), -1); /* still waiting for beta */
    complete_pending(&h->fakes[1], 0, 100);
    /* beta is behind alpha's 130: asked again, answers later */
    complete_pending(&h->fakes[1], 1, 130);
    assert_int_equal(wait_result(h, 10000), 0);
    assert_int_equal(h->rc, 0);
    assert_int_equal(h->to_store, 130);
    assert_int_equal(h->fakes[1].asked[1], 130);
    seg_free(h);
}

static void test_failed_future_fails_the_checkpoint(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(2, &with_release);
    h->fakes[1].script[0] = (struct step){ACT_FAIL, 0};
    checkpoint(h, 100, 0, 100);
    assert_int_equal(h->rc, PAWL_ECHECKPOINT);
    assert_int_equal(h->to_store, PAWL_RECONCILE_NOTHING);
    assert_non_null(strstr(pawl__reconcile_error(&h->r), "'beta'"));
    assert_non_null(strstr(pawl__reconcile_error(&h->r), "disk on fire"));
    seg_free(h);
}

static void test_late_failure_fails_the_checkpoint(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(1, &with_release);
    h->fakes[0].script[0] = (struct step){ACT_PENDING, 0};
    submit(h, 1, 100, 0, 100);
    complete_pending(&h->fakes[0], 0, -1);
    assert_int_equal(wait_result(h, 10000), 0);
    assert_int_equal(h->rc, PAWL_ECHECKPOINT);
    assert_int_equal(h->to_store, PAWL_RECONCILE_NOTHING);
    seg_free(h);
}

static void test_report_not_covering_fails_the_checkpoint(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(2, &with_release);
    h->fakes[0].script[0] = (struct step){ACT_REPORT, 99};
    checkpoint(h, 100, 0, 100);
    assert_int_equal(h->rc, PAWL_ECHECKPOINT);
    assert_int_equal(h->to_store, PAWL_RECONCILE_NOTHING);
    assert_non_null(strstr(pawl__reconcile_error(&h->r), "'alpha' reported 99"));
    /* A laggard that cannot reach the leader fails the checkpoint too. */
    memset(h->fakes[0].script, 0, sizeof h->fakes[0].script);
    h->fakes[0].calls = h->fakes[1].calls = 0;
    h->fakes[1].script[0] = (struct step){ACT_REPORT, 150};
    h->fakes[0].script[1] = (struct step){ACT_REPORT, 140};
    checkpoint(h, 100, 0, 200);
    assert_int_equal(h->rc, PAWL_ECHECKPOINT);
    seg_free(h);
}

static void test_null_future_fails_the_checkpoint(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(1, &with_release);
    h->fakes[0].script[0] = (struct step){ACT_NULL, 0};
    checkpoint(h, 100, 0, 100);
    assert_int_equal(h->rc, PAWL_ECHECKPOINT);
    seg_free(h);
}

static void test_report_behind_stored_is_ignored(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(1, &with_release);
    /* A request at or behind the stored token asks nobody and stores nothing. */
    checkpoint(h, 80, 100, 120);
    assert_int_equal(h->rc, 0);
    assert_int_equal(h->to_store, PAWL_RECONCILE_NOTHING);
    assert_int_equal(h->fakes[0].calls, 0);
    /* On release, a report behind the stored token is ignored: nothing is stored. */
    h->fakes[0].rel = (struct step){ACT_REPORT, 50};
    release(h, 120, 100);
    assert_int_equal(h->to_store, PAWL_RECONCILE_NOTHING);
    assert_non_null(strstr(pawl__reconcile_error(&h->r), "outside [100, 120]"));
    seg_free(h);
}

static void test_release_reports_within_range_are_reconciled(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(2, &with_release);
    /* alpha lags at 140, beta flushed everything (200); alpha is asked to cover 200. */
    h->fakes[0].rel = (struct step){ACT_REPORT, 140};
    h->fakes[1].rel = (struct step){ACT_COVER, 0};
    release(h, 200, 100);
    assert_int_equal(h->rc, 0);
    assert_int_equal(h->to_store, 200);
    assert_int_equal(h->fakes[0].rel_asked, 200);
    assert_int_equal(h->fakes[0].calls, 1);
    assert_int_equal(h->fakes[0].asked[0], 200);
    seg_free(h);
}

static void test_release_falls_back_to_lowest_report(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(3, &with_release);
    h->fakes[0].rel = (struct step){ACT_REPORT, 140};
    h->fakes[1].rel = (struct step){ACT_REPORT, 180};
    h->fakes[2].rel = (struct step){ACT_REPORT, 160};
    /* Asked to reach 180, alpha cannot; gamma can. The lowest confirmed is alpha's 140. */
    h->fakes[0].script[0] = (struct step){ACT_FAIL, 0};
    release(h, 200, 100);
    assert_int_equal(h->rc, PAWL_ECHECKPOINT); /* informational: the release goes on */
    assert_int_equal(h->to_store, 140);
    seg_free(h);
}

static void test_release_report_above_up_to_is_ignored(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(1, &with_release);
    h->fakes[0].rel = (struct step){ACT_REPORT, 250};
    release(h, 200, 100);
    assert_int_equal(h->to_store, PAWL_RECONCILE_NOTHING);
    seg_free(h);
}

static void test_failing_release_future_still_yields_a_result(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(2, &with_release);
    h->fakes[0].rel = (struct step){ACT_PENDING, 0};
    h->fakes[1].rel = (struct step){ACT_COVER, 0};
    submit(h, 2, 200, 100, 0);
    complete_pending(&h->fakes[0], 0, -1);
    assert_int_equal(wait_result(h, 10000), 0);
    /* The cycle finished (the caller frees the claim) and stored nothing for the failed unit. */
    assert_int_equal(h->to_store, PAWL_RECONCILE_NOTHING);
    assert_non_null(strstr(pawl__reconcile_error(&h->r), "'alpha' failed the release"));
    seg_free(h);
}

static void test_release_defaults_to_checkpoint_advanced(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(1, &default_release);
    release(h, 200, 100);
    assert_int_equal(h->rc, 0);
    assert_int_equal(h->to_store, 200);
    assert_int_equal(h->fakes[0].calls, 1);
    assert_int_equal(h->fakes[0].asked[0], 200);
    /* The default delegate must cover up_to: a lower report stores nothing. */
    h->fakes[0].script[1] = (struct step){ACT_REPORT, 150};
    release(h, 300, 200);
    assert_int_equal(h->to_store, PAWL_RECONCILE_NOTHING);
    seg_free(h);
}

static void test_timeout_bounded_future_fails_the_checkpoint(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(1, &with_release);
    h->fakes[0].script[0] = (struct step){ACT_HANG_TIMEOUT, 50};
    double t0 = pawl_test_now_ms();
    checkpoint(h, 100, 0, 100);
    assert_int_equal(h->rc, PAWL_ECHECKPOINT);
    assert_int_equal(h->to_store, PAWL_RECONCILE_NOTHING);
    assert_true(pawl_test_now_ms() - t0 >= 40);
    assert_non_null(strstr(pawl__reconcile_error(&h->r), "timed out"));
    /* The segment recovers: the next cycle (after re-claim) checkpoints normally. */
    checkpoint(h, 100, 0, 100);
    assert_int_equal(h->rc, 0);
    assert_int_equal(h->to_store, 100);
    seg_free(h);
}

static void test_or_timeout_outside_callback_fails(void **state)
{
    (void)state;
    struct pawl_future *f = pawl_checkpoint_or_timeout(pawl_future_new(), 10);
    assert_non_null(f);
    int64_t tok;
    int code = 0;
    assert_int_equal(pawl_future_poll(f, &tok, &code, NULL), 0);
    assert_int_equal(code, PAWL_EINVAL);
    pawl_future_unref(f);
    assert_null(pawl_checkpoint_or_timeout(NULL, 10));
}

static void test_never_completing_future_stalls_only_its_segment(void **state)
{
    (void)state;
    struct seg_h *stuck = seg_new(1, &with_release);
    struct seg_h *other = seg_new(1, &with_release);
    stuck->fakes[0].script[0] = (struct step){ACT_PENDING, 0};
    submit(stuck, 1, 100, 0, 100);
    while (fake_calls(&stuck->fakes[0]) == 0)
        usleep(1000);
    for (int i = 0; i < 20; i++) {
        other->fakes[0].calls = 0;
        checkpoint(other, 100 * (i + 1), 100 * i, 100 * (i + 1));
        assert_int_equal(other->rc, 0);
        assert_int_equal(other->to_store, 100 * (i + 1));
    }
    assert_int_equal(wait_result(stuck, 100), -1);
    assert_true(pawl__reconcile_busy(&stuck->r));
    /* Let it go so that the test can tidy up. */
    complete_pending(&stuck->fakes[0], 0, 100);
    assert_int_equal(wait_result(stuck, 10000), 0);
    assert_int_equal(stuck->to_store, 100);
    seg_free(stuck);
    seg_free(other);
}

static void test_claim_error_is_reported_and_unwound(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(3, &with_release);
    h->fakes[1].claim_rc = PAWL_EBUSY;
    struct pawl_trigger *t = pawl__trigger_new(NULL, NULL);
    assert_int_equal(pawl__reconcile_claimed(&h->r, SEG, t, 42), PAWL_EBUSY);
    assert_non_null(strstr(pawl__reconcile_error(&h->r), "'beta' refused the claim"));
    assert_int_equal(h->fakes[0].claims, 1);
    assert_int_equal(h->fakes[2].claims, 0);
    /* alpha, which had accepted, is told the claim is off. */
    assert_int_equal(h->fakes[0].rel_calls, 1);
    assert_int_equal(h->fakes[0].rel_asked, 42);
    assert_int_equal(h->fakes[2].rel_calls, 0);
    /* A later attempt succeeds and every unit gets the trigger. */
    h->fakes[1].claim_rc = 0;
    assert_int_equal(pawl__reconcile_claimed(&h->r, SEG, t, 42), 0);
    assert_ptr_equal(h->fakes[2].trigger, t);
    pawl__trigger_free(t);
    seg_free(h);
}

static void test_busy_reconciler_refuses_a_second_cycle(void **state)
{
    (void)state;
    struct seg_h *h = seg_new(1, &with_release);
    h->fakes[0].script[0] = (struct step){ACT_PENDING, 0};
    submit(h, 1, 100, 0, 100);
    while (fake_calls(&h->fakes[0]) == 0)
        usleep(1000);
    int64_t x;
    /* Only from the serial executor in real use; here the state is quiet while it waits. */
    assert_int_equal(pawl__reconcile_checkpoint(&h->r, SEG, 200, 0, 200, &x), PAWL_EBUSY);
    complete_pending(&h->fakes[0], 0, 100);
    assert_int_equal(wait_result(h, 10000), 0);
    seg_free(h);
}

static void test_mode_detection(void **state)
{
    (void)state;
    struct pawl_handler hs[3] = {
        {"a", NULL, NULL, NULL}, {"b", NULL, NULL, &with_release}, {"c", NULL, NULL, NULL}};
    enum pawl_ckpt_mode m;
    assert_int_equal(pawl__ckpt_mode_detect("p", hs, 1, &m), 0);
    assert_int_equal(m, PAWL_CKPT_PLAIN);
    assert_int_equal(pawl__ckpt_mode_detect("p", hs + 1, 1, &m), 0);
    assert_int_equal(m, PAWL_CKPT_DEFERRED);
    assert_int_equal(pawl__ckpt_mode_detect("p", hs, 3, &m), 0);
    assert_int_equal(m, PAWL_CKPT_AUTO);
    static const struct pawl_checkpointing broken = {NULL, NULL, NULL, NULL};
    hs[2].ckpt = &broken;
    assert_int_equal(pawl__ckpt_mode_detect("p", hs, 3, &m), PAWL_EINVAL);
}

static int log_auto;
static void sink(void *ud, enum pawl_log_level level, const char *module, const char *msg)
{
    (void)ud;
    (void)module;
    if (level == PAWL_LOG_DEBUG && strstr(msg, "auto mode") && strstr(msg, "'orders'"))
        log_auto++;
}

static void test_auto_mode_is_logged(void **state)
{
    (void)state;
    pawl_log_set_sink(sink, NULL);
    struct pawl_handler hs[2] = {{"a", NULL, NULL, NULL}, {"b", NULL, NULL, &with_release}};
    enum pawl_ckpt_mode m;
    /* At debug only: at the default level (warn) and at info nothing is said. */
    assert_int_equal(pawl__ckpt_mode_detect("orders", hs, 2, &m), 0);
    pawl_log_set_level(PAWL_LOG_INFO);
    assert_int_equal(pawl__ckpt_mode_detect("orders", hs, 2, &m), 0);
    assert_int_equal(log_auto, 0);
    pawl_log_set_level(PAWL_LOG_DEBUG);
    assert_int_equal(pawl__ckpt_mode_detect("orders", hs, 2, &m), 0);
    pawl_log_set_level(PAWL_LOG_WARN);
    pawl_log_set_sink(NULL, NULL);
    assert_int_equal(log_auto, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_unit_covering_is_stored),
        cmocka_unit_test(test_laggard_is_reasked_up_to_leader),
        cmocka_unit_test(test_laggard_overtakes_leader),
        cmocka_unit_test(test_report_beyond_consumed_counts_as_consumed),
        cmocka_unit_test(test_async_futures_are_awaited_without_blocking),
        cmocka_unit_test(test_failed_future_fails_the_checkpoint),
        cmocka_unit_test(test_late_failure_fails_the_checkpoint),
        cmocka_unit_test(test_report_not_covering_fails_the_checkpoint),
        cmocka_unit_test(test_null_future_fails_the_checkpoint),
        cmocka_unit_test(test_report_behind_stored_is_ignored),
        cmocka_unit_test(test_release_reports_within_range_are_reconciled),
        cmocka_unit_test(test_release_falls_back_to_lowest_report),
        cmocka_unit_test(test_release_report_above_up_to_is_ignored),
        cmocka_unit_test(test_failing_release_future_still_yields_a_result),
        cmocka_unit_test(test_release_defaults_to_checkpoint_advanced),
        cmocka_unit_test(test_timeout_bounded_future_fails_the_checkpoint),
        cmocka_unit_test(test_or_timeout_outside_callback_fails),
        cmocka_unit_test(test_never_completing_future_stalls_only_its_segment),
        cmocka_unit_test(test_claim_error_is_reported_and_unwound),
        cmocka_unit_test(test_busy_reconciler_refuses_a_second_cycle),
        cmocka_unit_test(test_mode_detection),
        cmocka_unit_test(test_auto_mode_is_logged),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
