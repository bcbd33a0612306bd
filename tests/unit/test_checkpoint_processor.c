/*
 * test_checkpoint_processor.c — conformance scenarios of the checkpoint protocol that need a
 * running processor: the in-memory event source and token store, real worker threads, scripted
 * checkpointing units. Deterministic in outcome (the assertions hold for every interleaving);
 * timings only bound how long a test waits.
 */
#include "pawl_test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXSEG 8
#define MAXEV 2000

/* ---- a scripted unit ---- */

enum behaviour { B_COVER = 0, B_FAIL_FIRST, B_HANG_SEG0, B_TIMEOUT_FIRST, B_REPORT_PLUS };

struct unit {
    pthread_mutex_t mu;
    enum behaviour b;
    int64_t plus;
    int claim_failures_left; /* fail on_segment_claimed this many times */
    int claims, claim_failures, releases, checkpoints;
    double claim_times[32];
    int64_t asked[4096];
    int nasked;
    struct pawl_trigger *trig[MAXSEG]; /* our references, by segment id */
    struct pawl_future *hung[64];
    int nhung;
    int fail_release;
    int64_t handled;
    int handle_sleep_us;
    int saw_null_trigger;
};

static struct unit *live_units[4];

static struct unit *unit_new(enum behaviour b)
{
    struct unit *u = calloc(1, sizeof *u);
    pthread_mutex_init(&u->mu, NULL);
    u->b = b;
    for (int i = 0; i < 4; i++) {
        if (live_units[i] == NULL) {
            live_units[i] = u;
            break;
        }
    }
    return u;
}

static void unit_free(struct unit *u)
{
    for (int i = 0; i < 4; i++)
        if (live_units[i] == u)
            live_units[i] = NULL;
    for (int i = 0; i < MAXSEG; i++)
        pawl_trigger_unref(u->trig[i]);
    for (int i = 0; i < u->nhung; i++)
        pawl_future_unref(u->hung[i]);
    free(u);
}

static int u_claimed(void *self, struct pawl_segment seg, struct pawl_trigger *t)
{
    struct unit *u = self;
    pthread_mutex_lock(&u->mu);
    if (u->claims + u->claim_failures < 32)
        u->claim_times[u->claims + u->claim_failures] = pawl_test_now_ms();
    if (u->claim_failures_left > 0 && seg.id == 0) {
        u->claim_failures_left--;
        u->claim_failures++;
        pthread_mutex_unlock(&u->mu);
        return PAWL_EBUSY;
    }
    u->claims++;
    if (seg.id < MAXSEG) {
        pawl_trigger_unref(u->trig[seg.id]);
        u->trig[seg.id] = pawl_trigger_ref(t);
    }
    pthread_mutex_unlock(&u->mu);
    return 0;
}

static struct pawl_future *u_advanced(void *self, struct pawl_segment seg, int64_t requested)
{
    struct unit *u = self;
    struct pawl_future *f = pawl_future_new();
    pthread_mutex_lock(&u->mu);
    int k = u->checkpoints++;
    if (u->nasked < 4096)
        u->asked[u->nasked++] = requested;
    enum behaviour b = u->b;
    if (b == B_HANG_SEG0 && seg.id == 0) {
        u->hung[u->nhung++] = pawl_future_ref(f);
        pthread_mutex_unlock(&u->mu);
        return f;
    }
    pthread_mutex_unlock(&u->mu);
    if (b == B_FAIL_FIRST && k == 0) {
        pawl_future_fail(f, PAWL_ESYS, "first checkpoint fails");
    } else if (b == B_TIMEOUT_FIRST && k == 0) {
        pthread_mutex_lock(&u->mu);
        u->hung[u->nhung++] = pawl_future_ref(f);
        pthread_mutex_unlock(&u->mu);
        return pawl_checkpoint_or_timeout(f, 50);
    } else {
        pawl_future_complete(f, requested + (b == B_REPORT_PLUS ? u->plus : 0));
    }
    return f;
}

static struct pawl_future *u_released(void *self, struct pawl_segment seg, int64_t up_to)
{
    (void)seg;
    struct unit *u = self;
    struct pawl_future *f = pawl_future_new();
    pthread_mutex_lock(&u->mu);
    u->releases++;
    int fail = u->fail_release;
    pthread_mutex_unlock(&u->mu);
    if (fail)
        pawl_future_fail(f, PAWL_ESYS, "release fails");
    else
        pawl_future_complete(f, up_to);
    return f;
}

static const struct pawl_checkpointing unit_ckpt = {u_claimed, u_advanced, u_released, NULL};

static int u_handle(void *self, struct pawl_event_ctx *ctx)
{
    struct unit *u = self;
    if (pawl_ctx_trigger(ctx) == NULL)
        u->saw_null_trigger = 1;
    if (u->handle_sleep_us)
        usleep((useconds_t)u->handle_sleep_us);
    pthread_mutex_lock(&u->mu);
    u->handled++;
    pthread_mutex_unlock(&u->mu);
    return 0;
}

static int unit_get(struct unit *u, int *field)
{
    pthread_mutex_lock(&u->mu);
    int v = *field;
    pthread_mutex_unlock(&u->mu);
    return v;
}

static int64_t unit_handled(struct unit *u)
{
    pthread_mutex_lock(&u->mu);
    int64_t v = u->handled;
    pthread_mutex_unlock(&u->mu);
    return v;
}

static struct pawl_trigger *unit_trigger(struct unit *u, uint32_t seg)
{
    pthread_mutex_lock(&u->mu);
    struct pawl_trigger *t = pawl_trigger_ref(u->trig[seg]);
    pthread_mutex_unlock(&u->mu);
    return t;
}

/* ---- an ordinary handler writing through the batch transaction ---- */

static _Atomic int applied[MAXEV + 1];

static int ordinary_handle(void *self, struct pawl_event_ctx *ctx)
{
    (void)self;
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)pawl_ctx_event(ctx)->index);
    const char *v[1] = {buf};
    return pawl_txn_exec(pawl_ctx_txn(ctx), "apply $1", 1, v);
}

static int exec_hook(void *ud, const char *sql, int nparams, const char *const *values)
{
    (void)ud;
    (void)sql;
    if (nparams == 1) {
        long long i = atoll(values[0]);
        if (i > 0 && i <= MAXEV)
            atomic_fetch_add(&applied[i], 1);
    }
    return 0;
}

static int noop_handle(void *self, struct pawl_event_ctx *ctx)
{
    (void)self;
    (void)ctx;
    return 0;
}

/* ---- fixtures ---- */

struct world {
    struct pawl_source *src;
    struct pawl_tokens *tokens;
    struct pawl_processor *p;
    char name[32];
};

static void world_init(struct world *w, int events, int streams)
{
    memset(w, 0, sizeof *w);
    assert_int_equal(pawl_source_mem_new(&w->src), 0);
    assert_int_equal(pawl_tokens_mem_new(&w->tokens), 0);
    pawl_tokens_mem_set_exec(w->tokens, exec_hook, NULL);
    for (int i = 0; i <= MAXEV; i++)
        atomic_store(&applied[i], 0);
    int64_t seq[64] = {0};
    for (int i = 0; i < events; i++) {
        char id[16];
        snprintf(id, sizeof id, "s%d", i % streams);
        struct pawl_event e = {.stream_id = id, .stream_seq = ++seq[i % streams], .type = "t"};
        assert_int_equal(pawl_source_mem_append(w->src, &e, 1), 0);
    }
    snprintf(w->name, sizeof w->name, "ckpt-test");
}

/* claim_poll_ms also bounds how long an unstored token may wait (the time rule of "due"). */
static void world_start_poll(struct world *w, const struct pawl_handler *hs, size_t n,
                             uint32_t segs, uint32_t batch, uint32_t claim_poll_ms)
{
    struct pawl_processor_opts o;
    pawl_processor_opts_defaults(&o);
    o.name = w->name;
    o.segments = segs;
    o.batch_size = batch;
    o.threads = 2;
    o.claim_poll_ms = claim_poll_ms;
    o.backoff_min_ms = 100;
    o.backoff_max_ms = 400;
    o.idle_wait_ms = 20;
    assert_int_equal(pawl_processor_new(&w->p, &o, w->src, w->tokens, hs, n), 0);
    assert_int_equal(pawl_processor_start(w->p), 0);
}

static void world_start(struct world *w, const struct pawl_handler *hs, size_t n, uint32_t segs,
                        uint32_t batch)
{
    world_start_poll(w, hs, n, segs, batch, 20);
}

/* Stop the processor (its segments are released, their tokens stored); the store stays for
 * inspection. A never-completed future keeps its continuations alive: what the units still
 * hold is settled first, while the processor (and its pool) runs, as a unit that gives up
 * would. */
static void world_stop(struct world *w)
{
    for (int i = 0; i < 4; i++) {
        struct unit *u = live_units[i];
        if (u == NULL)
            continue;
        pthread_mutex_lock(&u->mu);
        for (int k = 0; k < u->nhung; k++)
            pawl_future_fail(u->hung[k], PAWL_ECANCELED, NULL);
        pthread_mutex_unlock(&u->mu);
        live_units[i] = NULL;
    }
    pawl_processor_free(w->p);
    w->p = NULL;
}

static void world_fini(struct world *w)
{
    if (w->p)
        world_stop(w);
    pawl_tokens_free(w->tokens);
    pawl_source_free(w->src);
}

/* The stored token of segment id (-1 if no such row), and its owner into owner (optional). */
static int64_t stored(struct world *w, uint32_t id, char *owner)
{
    struct pawl_segment_status *rows = NULL;
    size_t n = 0;
    assert_int_equal(w->tokens->ops->list(w->tokens, w->name, &rows, &n), 0);
    int64_t t = -1;
    for (size_t i = 0; i < n; i++) {
        if (rows[i].seg.id == id) {
            t = rows[i].token;
            if (owner)
                strcpy(owner, rows[i].owner);
        }
    }
    pawl_tokens_rows_free(rows);
    return t;
}

static uint64_t handled_events(struct world *w)
{
    struct pawl_processor_stats st;
    pawl_processor_stats(w->p, &st);
    return st.events;
}

#define WAIT_UNTIL(cond, ms)                                                                       \
    do {                                                                                           \
        double t0_ = pawl_test_now_ms();                                                           \
        while (!(cond) && pawl_test_now_ms() - t0_ < (ms))                                         \
            usleep(2000);                                                                          \
        assert_true(cond);                                                                         \
    } while (0)

/* ---- scenarios ---- */

static void test_auto_mode_checkpoints_every_batch(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, 100, 4);
    struct unit *u = unit_new(B_COVER);
    struct pawl_handler hs[2] = {{"plain", NULL, noop_handle, NULL},
                                 {"unit", u, u_handle, &unit_ckpt}};
    world_start(&w, hs, 2, 1, 10);
    WAIT_UNTIL(stored(&w, 0, NULL) == 100, 20000);
    /* Each batch asked the unit to cover its end, in order. A batch holds at most 10 events but
     * may hold fewer (it takes what the segment's inbox has when it starts), so the ends rise by
     * 1..10 each and the last one is the last event. Copied out first: a failed assertion must
     * not leave the unit's mutex held. */
    pthread_mutex_lock(&u->mu);
    int nasked = u->nasked;
    int64_t asked[4096];
    memcpy(asked, u->asked, sizeof asked);
    pthread_mutex_unlock(&u->mu);
    assert_true(nasked >= 10);
    int i = 0;
    for (; i < nasked && (i == 0 || asked[i - 1] < 100); i++)
        assert_in_range(asked[i] - (i ? asked[i - 1] : 0), 1, 10);
    assert_int_equal(asked[i - 1], 100);
    for (; i < nasked; i++) /* asked again at the end (an idle cycle): the same position */
        assert_int_equal(asked[i], 100);
    struct pawl_processor_stats st;
    pawl_processor_stats(w.p, &st);
    assert_int_equal(st.mode, PAWL_CKPT_AUTO);
    world_fini(&w);
    unit_free(u);
}

/* Auto mode asks the units at every batch, but a batch that wrote nothing (no statement, no
 * explicit request) commits no token on its own: like plain mode, the confirmed position is
 * stored when due (read_batch events, claim_poll_ms) or at release. A batch whose ordinary
 * handler queued a statement stores it with that statement; an explicit request is stored at
 * once. */
static void test_auto_mode_stores_when_due(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, 100, 4);
    struct unit *u = unit_new(B_COVER);
    struct pawl_handler quiet[2] = {{"plain", NULL, noop_handle, NULL},
                                    {"unit", u, u_handle, &unit_ckpt}};
    world_start_poll(&w, quiet, 2, 1, 10, 60000); /* read_batch 1000: never due while running */
    WAIT_UNTIL(unit_handled(u) == 100, 20000);
    WAIT_UNTIL(unit_get(u, &u->nasked) >= 10, 20000);
    pthread_mutex_lock(&u->mu);
    int64_t last = u->asked[u->nasked - 1];
    pthread_mutex_unlock(&u->mu);
    assert_int_equal(last, 100); /* every batch asked, up to the last event */
    usleep(100000);
    assert_int_equal(stored(&w, 0, NULL), 0); /* confirmed, not yet due: nothing committed */
    struct pawl_processor_stats st;
    pawl_processor_stats(w.p, &st);
    assert_int_equal(st.mode, PAWL_CKPT_AUTO);
    assert_true(st.batches >= 10);

    /* An explicit request is stored at once, batch or no batch. */
    struct pawl_trigger *t = unit_trigger(u, 0);
    assert_non_null(t);
    assert_int_equal(pawl_trigger_request(t, 60), 0);
    WAIT_UNTIL(stored(&w, 0, NULL) >= 60, 20000);
    pawl_trigger_unref(t);
    world_stop(&w); /* release: what the units confirm is stored */
    assert_int_equal(stored(&w, 0, NULL), 100);
    world_fini(&w);
    unit_free(u);

    /* A batch whose ordinary handler queued a statement commits the agreed token with it. */
    world_init(&w, 100, 4);
    u = unit_new(B_COVER);
    struct pawl_handler writing[2] = {{"ordinary", NULL, ordinary_handle, NULL},
                                      {"unit", u, u_handle, &unit_ckpt}};
    world_start_poll(&w, writing, 2, 1, 10, 60000);
    WAIT_UNTIL(stored(&w, 0, NULL) == 100, 20000);
    for (int i = 1; i <= 100; i++)
        assert_int_equal(atomic_load(&applied[i]), 1);
    world_fini(&w);
    unit_free(u);
}

static void test_plain_mode_stores_every_batch(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, 100, 4);
    struct pawl_handler hs[1] = {{"plain", NULL, noop_handle, NULL}};
    world_start(&w, hs, 1, 1, 10);
    WAIT_UNTIL(stored(&w, 0, NULL) == 100, 20000);
    struct pawl_processor_stats st;
    pawl_processor_stats(w.p, &st);
    assert_int_equal(st.mode, PAWL_CKPT_PLAIN);
    world_fini(&w);
}

static void test_deferred_stores_nothing_without_request_then_exactly_agreed(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, 100, 4);
    struct unit *u = unit_new(B_COVER);
    struct pawl_handler hs[1] = {{"unit", u, u_handle, &unit_ckpt}};
    world_start(&w, hs, 1, 1, 10);
    WAIT_UNTIL(handled_events(&w) == 100, 20000);
    usleep(200000); /* several claim-extension and poll periods */
    assert_int_equal(stored(&w, 0, NULL), 0);
    assert_int_equal(unit_get(u, &u->checkpoints), 0);
    struct pawl_processor_stats st;
    pawl_processor_stats(w.p, &st);
    assert_int_equal(st.mode, PAWL_CKPT_DEFERRED);

    /* A request while the segment is idle runs a commit cycle on its own. */
    struct pawl_trigger *t = unit_trigger(u, 0);
    assert_int_equal(pawl_trigger_request(t, 60), 0);
    WAIT_UNTIL(stored(&w, 0, NULL) == 60, 10000);
    usleep(100000);
    assert_int_equal(stored(&w, 0, NULL), 60); /* exactly the agreed position */

    /* The unit reports more than asked: the agreed (higher) position is stored. */
    pthread_mutex_lock(&u->mu);
    u->b = B_REPORT_PLUS;
    u->plus = 15;
    pthread_mutex_unlock(&u->mu);
    assert_int_equal(pawl_trigger_request(t, 70), 0);
    WAIT_UNTIL(stored(&w, 0, NULL) == 85, 10000);
    pawl_trigger_unref(t);
    world_fini(&w);
    unit_free(u);
}

static void test_latest_resolves_to_last_consumed_token(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, 100, 4);
    struct unit *u = unit_new(B_COVER);
    struct pawl_handler hs[1] = {{"unit", u, u_handle, &unit_ckpt}};
    world_start(&w, hs, 1, 1, 10);
    WAIT_UNTIL(handled_events(&w) == 100, 20000);
    struct pawl_trigger *t = unit_trigger(u, 0);
    assert_int_equal(pawl_trigger_request_latest(t), 0);
    WAIT_UNTIL(stored(&w, 0, NULL) == 100, 10000);
    pawl_trigger_unref(t);
    world_fini(&w);
    unit_free(u);
}

static void test_request_while_busy_is_honoured(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, 200, 4);
    struct unit *u = unit_new(B_COVER);
    u->handle_sleep_us = 2000; /* 200 events: ~0.4 s of handling */
    struct pawl_handler hs[1] = {{"unit", u, u_handle, &unit_ckpt}};
    world_start(&w, hs, 1, 1, 50);
    WAIT_UNTIL(unit_get(u, &u->claims) == 1, 10000);
    struct pawl_trigger *t = unit_trigger(u, 0);
    /* The worker is inside a batch: the request is taken after it and honoured. */
    WAIT_UNTIL(unit_handled(u) >= 10, 10000);
    assert_int_equal(pawl_trigger_request(t, 40), 0);
    WAIT_UNTIL(stored(&w, 0, NULL) >= 40, 20000);
    WAIT_UNTIL(handled_events(&w) == 200, 20000);
    /* Deferred: nothing beyond what was requested. */
    assert_int_equal(stored(&w, 0, NULL), 40);
    pawl_trigger_unref(t);
    world_fini(&w);
    unit_free(u);
}

static void test_failed_checkpoint_rolls_back_ordinary_handler(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, 100, 4);
    struct unit *u = unit_new(B_FAIL_FIRST);
    struct pawl_handler hs[2] = {{"writer", NULL, ordinary_handle, NULL},
                                 {"unit", u, u_handle, &unit_ckpt}};
    world_start(&w, hs, 2, 1, 10);
    WAIT_UNTIL(stored(&w, 0, NULL) == 100, 30000);
    struct pawl_processor_stats st;
    pawl_processor_stats(w.p, &st);
    assert_true(st.batch_failures >= 1);
    /* The failed batch's writes rolled back and were redone once: every event applied once. */
    for (int i = 1; i <= 100; i++)
        assert_int_equal(atomic_load(&applied[i]), 1);
    /* The segment was released and claimed again. */
    assert_true(unit_get(u, &u->claims) >= 2);
    world_fini(&w);
    unit_free(u);
}

static void test_never_completing_future_stalls_only_its_segment(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, 400, 32);
    struct unit *u = unit_new(B_HANG_SEG0);
    struct pawl_handler hs[2] = {{"plain", NULL, noop_handle, NULL},
                                 {"unit", u, u_handle, &unit_ckpt}};
    world_start(&w, hs, 2, 2, 10);
    /* Segment 1 goes all the way; segment 0 waits on its first checkpoint forever. */
    WAIT_UNTIL(stored(&w, 1, NULL) >= 390, 30000);
    assert_int_equal(stored(&w, 0, NULL), 0);
    WAIT_UNTIL(unit_get(u, &u->nhung) == 1, 10000);
    usleep(200000);
    assert_int_equal(unit_get(u, &u->nhung), 1);
    assert_int_equal(stored(&w, 0, NULL), 0);
    /* Complete it: the segment resumes. */
    pthread_mutex_lock(&u->mu);
    u->b = B_COVER;
    struct pawl_future *f = u->hung[0];
    pthread_mutex_unlock(&u->mu);
    pawl_future_complete(f, 10);
    WAIT_UNTIL(stored(&w, 0, NULL) >= 390, 30000);
    world_fini(&w);
    unit_free(u);
}

static void test_timeout_bounded_future_fails_checkpoint_and_segment_recovers(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, 100, 4);
    struct unit *u = unit_new(B_TIMEOUT_FIRST);
    struct pawl_handler hs[2] = {{"plain", NULL, noop_handle, NULL},
                                 {"unit", u, u_handle, &unit_ckpt}};
    world_start(&w, hs, 2, 1, 10);
    WAIT_UNTIL(stored(&w, 0, NULL) == 100, 30000);
    struct pawl_processor_stats st;
    pawl_processor_stats(w.p, &st);
    assert_true(st.batch_failures >= 1);
    assert_true(unit_get(u, &u->claims) >= 2);
    world_fini(&w);
    unit_free(u);
}

static void test_claim_error_is_retried_with_backoff_and_leaks_no_claim(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, 50, 4);
    struct unit *u = unit_new(B_COVER);
    u->claim_failures_left = 2;
    struct pawl_handler hs[2] = {{"plain", NULL, noop_handle, NULL},
                                 {"unit", u, u_handle, &unit_ckpt}};
    world_start(&w, hs, 2, 1, 10);
    WAIT_UNTIL(unit_get(u, &u->claim_failures) >= 1, 10000);
    /* The refused claim was given back: during the back-off (100 ms) the row has no owner. */
    int seen_free = 0;
    for (int i = 0; i < 50 && !seen_free && unit_get(u, &u->claims) == 0; i++) {
        char owner[PAWL_INSTANCE_MAX + 1] = "x";
        stored(&w, 0, owner);
        seen_free = owner[0] == '\0';
        if (!seen_free)
            usleep(2000);
    }
    assert_true(seen_free);
    WAIT_UNTIL(stored(&w, 0, NULL) == 50, 30000);
    pthread_mutex_lock(&u->mu);
    assert_int_equal(u->claim_failures, 2);
    /* Retries wait for the back-off (100 ms, then 200 ms; generous tolerance). */
    assert_true(u->claim_times[1] - u->claim_times[0] >= 80);
    assert_true(u->claim_times[2] - u->claim_times[1] >= 80);
    pthread_mutex_unlock(&u->mu);
    world_fini(&w);
    unit_free(u);
}

static void test_release_on_stop_stores_reconciled_position(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, 100, 4);
    struct unit *u = unit_new(B_COVER);
    struct pawl_handler hs[1] = {{"unit", u, u_handle, &unit_ckpt}};
    world_start(&w, hs, 1, 1, 10);
    WAIT_UNTIL(handled_events(&w) == 100, 20000);
    assert_int_equal(stored(&w, 0, NULL), 0);
    assert_int_equal(pawl_processor_stop(w.p), 0);
    assert_int_equal(unit_get(u, &u->releases), 1);
    char owner[PAWL_INSTANCE_MAX + 1] = "x";
    assert_int_equal(stored(&w, 0, owner), 100);
    assert_string_equal(owner, "");
    /* The trigger it kept is inert now. */
    struct pawl_trigger *t = unit_trigger(u, 0);
    assert_int_equal(pawl_trigger_request(t, 100), PAWL_ESHUTDOWN);
    pawl_trigger_unref(t);
    world_fini(&w);
    unit_free(u);
}

static void test_failing_release_future_still_releases_the_claim(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, 100, 4);
    struct unit *u = unit_new(B_COVER);
    u->fail_release = 1;
    struct pawl_handler hs[1] = {{"unit", u, u_handle, &unit_ckpt}};
    world_start(&w, hs, 1, 1, 10);
    WAIT_UNTIL(handled_events(&w) == 100, 20000);
    struct pawl_trigger *t = unit_trigger(u, 0);
    assert_int_equal(pawl_trigger_request(t, 30), 0);
    WAIT_UNTIL(stored(&w, 0, NULL) == 30, 10000);
    assert_int_equal(pawl_processor_stop(w.p), 0);
    char owner[PAWL_INSTANCE_MAX + 1] = "x";
    assert_int_equal(stored(&w, 0, owner), 30); /* nothing more confirmed */
    assert_string_equal(owner, "");             /* but the claim is free */
    pawl_trigger_unref(t);
    world_fini(&w);
    unit_free(u);
}

static void test_triggers_are_per_segment_in_a_processor(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, 200, 32);
    struct unit *u = unit_new(B_COVER);
    struct pawl_handler hs[1] = {{"unit", u, u_handle, &unit_ckpt}};
    world_start(&w, hs, 1, 2, 10);
    WAIT_UNTIL(handled_events(&w) == 200, 20000);
    struct pawl_trigger *t0 = unit_trigger(u, 0), *t1 = unit_trigger(u, 1);
    assert_ptr_not_equal(t0, t1);
    assert_int_equal(pawl_trigger_request_latest(t1), 0);
    WAIT_UNTIL(stored(&w, 1, NULL) > 0, 10000);
    usleep(100000);
    assert_int_equal(stored(&w, 0, NULL), 0); /* segment 0 was not asked */
    pawl_trigger_unref(t0);
    pawl_trigger_unref(t1);
    world_fini(&w);
    unit_free(u);
}

static void test_subscriber_never_calls_units(void **state)
{
    (void)state;
    struct unit *u = unit_new(B_COVER);
    struct pawl_handler hs[1] = {{"unit", u, u_handle, &unit_ckpt}};
    struct pawl_subscriber *s = NULL;
    assert_int_equal(pawl_subscriber_new(&s, hs, 1), 0);
    struct pawl_event ev[3] = {{.index = 1, .stream_id = "a", .stream_seq = 1, .type = "t"},
                               {.index = 2, .stream_id = "a", .stream_seq = 2, .type = "t"},
                               {.index = 3, .stream_id = "b", .stream_seq = 1, .type = "t"}};
    assert_int_equal(pawl_subscriber_publish(s, ev, 3, NULL), 0);
    pawl_subscriber_free(s);
    assert_int_equal(u->handled, 3);
    assert_int_equal(u->claims + u->claim_failures, 0);
    assert_int_equal(u->checkpoints, 0);
    assert_int_equal(u->releases, 0);
    assert_int_equal(u->saw_null_trigger, 1);
    unit_free(u);
}

int main(void)
{
    pawl_log_set_level(PAWL_LOG_ERROR);
    const struct CMUnitTest always[] = {
        cmocka_unit_test(test_subscriber_never_calls_units),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_mode_checkpoints_every_batch),
        cmocka_unit_test(test_auto_mode_stores_when_due),
        cmocka_unit_test(test_plain_mode_stores_every_batch),
        cmocka_unit_test(test_deferred_stores_nothing_without_request_then_exactly_agreed),
        cmocka_unit_test(test_latest_resolves_to_last_consumed_token),
        cmocka_unit_test(test_request_while_busy_is_honoured),
        cmocka_unit_test(test_failed_checkpoint_rolls_back_ordinary_handler),
        cmocka_unit_test(test_never_completing_future_stalls_only_its_segment),
        cmocka_unit_test(test_timeout_bounded_future_fails_checkpoint_and_segment_recovers),
        cmocka_unit_test(test_claim_error_is_retried_with_backoff_and_leaks_no_claim),
        cmocka_unit_test(test_release_on_stop_stores_reconciled_position),
        cmocka_unit_test(test_failing_release_future_still_releases_the_claim),
        cmocka_unit_test(test_triggers_are_per_segment_in_a_processor),
    };
    /* The processor runs checkpointing units: one that refuses them fails these cases (each
     * asserts that pawl_processor_new succeeds), it is not a reason to skip them. */
    int rc = cmocka_run_group_tests_name("subscriber", always, NULL, NULL);
    if (rc != 0)
        return rc;
    return cmocka_run_group_tests_name("processor", tests, NULL, NULL);
}
