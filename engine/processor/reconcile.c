/*
 * reconcile.c — the checkpoint and release reconciliation state machines (contract in
 * reconcile.h), the mode detection, and the public helpers of pawl/checkpoint.h.
 *
 * A cycle proceeds in rounds. A round asks some units (all of them in round 0, the laggards
 * afterwards). Futures already complete when a unit returns them are settled on the spot (no
 * task, no allocation: the common case of a unit that answers at once); each other one gets a
 * continuation that only counts down `_waiting` and, at zero, calls wake. The worker then
 * resumes: it settles the futures it kept (pawl_future_poll), and evaluate() decides to finish or
 * to ask the next round. Only the counter is shared with other threads; every other field is the
 * worker's. `_waiting` holds one extra count while a round is being asked, so a continuation that
 * runs before the asking is over cannot reach zero and wake too early.
 *
 * Termination: every round after the first asks with a strictly higher `agreed`, reports are
 * clamped to `limit` (checkpoint) or up_to (release), so the number of rounds is bounded by the
 * number of distinct reports.
 */
#include "reconcile.h"

#include "common.h"

#include <stdio.h>
#include <string.h>

#define MOD "checkpoint"

enum { KIND_CHECKPOINT = 1, KIND_RELEASE = 2 };

struct pawl_reconcile_slot {
    struct pawl_reconcile *r;
    size_t i;
    struct pawl_future *f; /* our reference while a continuation waits, else NULL */
    int64_t asked;         /* what this unit was last asked to cover */
    int64_t best;          /* highest valid report of this cycle, or NOTHING */
    bool asked_now;        /* asked in the current round */
    bool released_cb;      /* round 0 of a release used the unit's own on_segment_released */
    bool bad;              /* failed, or reported something that does not count, this round */
};

_Thread_local struct pawl_timers *pawl__ckpt_timers_tls;

static void settle(struct pawl_reconcile *r, struct pawl_reconcile_slot *s, struct pawl_future *f);
static void on_done(void *arg, struct pawl_future *f);

int pawl__reconcile_init(struct pawl_reconcile *r, const struct pawl_ckpt_unit *units, size_t n,
                         struct pawl_serial *serial, struct pawl_pool *pool,
                         struct pawl_timers *timers, pawl_reconcile_wake_fn wake, void *arg)
{
    memset(r, 0, sizeof *r);
    atomic_init(&r->_waiting, 0);
    if (n > 0 && units == NULL)
        return PAWL_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (units[i].ckpt == NULL || units[i].ckpt->on_checkpoint_advanced == NULL)
            return PAWL_EINVAL;
    if (n > 0) {
        r->_slots = pawl_calloc(n, sizeof *r->_slots);
        if (r->_slots == NULL)
            return PAWL_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        r->_slots[i].r = r;
        r->_slots[i].i = i;
    }
    r->_units = units;
    r->_n = n;
    r->_serial = serial;
    r->_pool = pool;
    r->_timers = timers;
    r->_wake = wake;
    r->_wake_arg = arg;
    return 0;
}

void pawl__reconcile_fini(struct pawl_reconcile *r)
{
    if (r == NULL)
        return;
    if (r->_busy)
        PAWL_ERROR(MOD, "reconciler finished while a cycle is under way (segment %u/%u)",
                   r->_seg.id, r->_seg.mask);
    pawl_free(r->_slots);
    r->_slots = NULL;
    r->_n = 0;
}

const char *pawl__reconcile_error(const struct pawl_reconcile *r)
{
    return r->_err;
}

bool pawl__reconcile_busy(const struct pawl_reconcile *r)
{
    return r->_busy;
}

static const char *unit_name(const struct pawl_reconcile *r, size_t i)
{
    return r->_units[i].name ? r->_units[i].name : "(unnamed)";
}

/* Keep the first failure's text: it names the unit that caused the rest. */
static void set_err(struct pawl_reconcile *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_err(struct pawl_reconcile *r, const char *fmt, ...)
{
    if (r->_err[0] != '\0')
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->_err, sizeof r->_err, fmt, ap);
    va_end(ap);
}

/* Ask unit i to cover token; settles at once or leaves a continuation pending. */
static void ask(struct pawl_reconcile *r, size_t i, int64_t token, bool release_round)
{
    struct pawl_reconcile_slot *s = &r->_slots[i];
    const struct pawl_ckpt_unit *u = &r->_units[i];
    s->asked = token;
    s->asked_now = true;
    s->bad = false;
    s->released_cb = release_round && u->ckpt->on_segment_released != NULL;
    struct pawl_timers *saved = pawl__ckpt_timers_tls;
    pawl__ckpt_timers_tls = r->_timers;
    struct pawl_future *f = s->released_cb
                                ? u->ckpt->on_segment_released(u->self, r->_seg, token)
                                : u->ckpt->on_checkpoint_advanced(u->self, r->_seg, token);
    pawl__ckpt_timers_tls = saved;
    if (f == NULL) {
        s->bad = true;
        set_err(r, "unit '%s' returned no future for segment %u/%u at %lld", unit_name(r, i),
                r->_seg.id, r->_seg.mask, (long long)token);
        return;
    }
    if (pawl_future_done(f)) {
        settle(r, s, f);
        pawl_future_unref(f);
        return;
    }
    s->f = f;
    /* Relaxed: only a count; the continuation's registration below publishes the rest. */
    atomic_fetch_add_explicit(&r->_waiting, 1, memory_order_relaxed);
    int rc = pawl_future_on_complete(f, r->_serial, r->_pool, on_done, s);
    if (rc != 0) {
        atomic_fetch_sub_explicit(&r->_waiting, 1, memory_order_relaxed);
        s->f = NULL;
        pawl_future_unref(f);
        s->bad = true;
        set_err(r, "cannot wait for unit '%s': %s", unit_name(r, i), pawl_strerror(rc));
    }
}

/* Record the outcome of unit s's future f for the current round. */
static void settle(struct pawl_reconcile *r, struct pawl_reconcile_slot *s, struct pawl_future *f)
{
    int64_t token = 0;
    int code = 0;
    const char *msg = NULL;
    const char *name = unit_name(r, s->i);
    if (pawl_future_poll(f, &token, &code, &msg) != 0) {
        /* Only when the pool shut down before the future completed. */
        code = PAWL_ECANCELED;
        msg = "the pool shut down while waiting";
    }
    if (code != 0) {
        s->bad = true;
        set_err(r, "unit '%s' failed %s of segment %u/%u at %lld: %s", name,
                r->_kind == KIND_RELEASE && r->_round == 0 ? "the release" : "the checkpoint",
                r->_seg.id, r->_seg.mask, (long long)s->asked, msg ? msg : pawl_strerror(code));
        return;
    }
    if (r->_kind == KIND_RELEASE && r->_round == 0) {
        /* Contract: a release report lies in [stored, up_to]; the default delegate must cover
         * up_to itself. Anything else is ignored: that unit confirmed nothing. */
        int64_t lo = s->released_cb ? r->_stored : r->_limit;
        if (token < lo || token > r->_limit) {
            s->bad = true;
            set_err(r, "unit '%s' reported %lld on release of segment %u/%u, outside [%lld, %lld]",
                    name, (long long)token, r->_seg.id, r->_seg.mask, (long long)lo,
                    (long long)r->_limit);
            return;
        }
    } else {
        if (token < s->asked) {
            s->bad = true;
            set_err(r,
                    "unit '%s' reported %lld for segment %u/%u, which does not cover the "
                    "requested %lld",
                    name, (long long)token, r->_seg.id, r->_seg.mask, (long long)s->asked);
            return;
        }
        if (token > r->_limit) {
            PAWL_DEBUG(MOD, "unit '%s' reported %lld beyond the consumed %lld; counted as %lld",
                       name, (long long)token, (long long)r->_limit, (long long)r->_limit);
            token = r->_limit;
        }
    }
    if (token > s->best)
        s->best = token;
}

/*
 * A unit's future completed: runs as a task on the pool (or serial), on any thread. Touches
 * nothing but the counter: after the decrement the worker may already be resuming.
 */
static void on_done(void *arg, struct pawl_future *f)
{
    (void)f;
    struct pawl_reconcile_slot *s = arg;
    struct pawl_reconcile *r = s->r;
    pawl_reconcile_wake_fn wake = r->_wake;
    void *wake_arg = r->_wake_arg;
    /* Acq_rel: the last one to count down sees every other continuation's completion, and the
     * worker woken by it sees the futures' outcomes (pawl_future_poll acquires them too). */
    if (atomic_fetch_sub_explicit(&r->_waiting, 1, memory_order_acq_rel) == 1 && wake != NULL)
        wake(wake_arg);
}

static void finish(struct pawl_reconcile *r, int rc, int64_t agreed)
{
    r->_busy = false;
    r->_rc = rc;
    r->_result = agreed > r->_stored ? agreed : PAWL_RECONCILE_NOTHING;
}

/* A round is over: finish (true) or ask the next round (false). */
static bool evaluate(struct pawl_reconcile *r)
{
    bool any_bad = false;
    int64_t agreed = r->_agreed, lowest = INT64_MAX;
    for (size_t i = 0; i < r->_n; i++) {
        struct pawl_reconcile_slot *s = &r->_slots[i];
        if (s->asked_now && s->bad)
            any_bad = true;
        if (s->best > agreed)
            agreed = s->best;
        if (s->best < lowest)
            lowest = s->best;
        s->asked_now = false;
    }
    if (r->_kind == KIND_CHECKPOINT && any_bad) {
        finish(r, PAWL_ECHECKPOINT, PAWL_RECONCILE_NOTHING);
        return true;
    }
    if (r->_kind == KIND_RELEASE && any_bad) {
        if (r->_round == 0) {
            /* A unit confirmed nothing: the stored token cannot move for it. */
            finish(r, PAWL_ECHECKPOINT, PAWL_RECONCILE_NOTHING);
        } else {
            /* Reconciling failed: every unit is durable at least at its own best report. */
            PAWL_INFO(MOD, "release of segment %u/%u: %s; storing the lowest confirmed %lld",
                      r->_seg.id, r->_seg.mask, r->_err, (long long)lowest);
            finish(r, PAWL_ECHECKPOINT, lowest);
        }
        return true;
    }
    r->_agreed = agreed;
    r->_round++;
    size_t asked = 0;
    for (size_t i = 0; i < r->_n; i++) {
        if (r->_slots[i].best < agreed) {
            ask(r, i, agreed, false);
            asked++;
        }
    }
    if (asked == 0) {
        finish(r, 0, agreed);
        return true;
    }
    return false;
}

/* Settle the futures the last round left waiting (their continuations have all run). */
static void collect(struct pawl_reconcile *r)
{
    for (size_t i = 0; i < r->_n; i++) {
        struct pawl_reconcile_slot *s = &r->_slots[i];
        if (s->f != NULL) {
            settle(r, s, s->f);
            pawl_future_unref(s->f);
            s->f = NULL;
        }
    }
}

/*
 * The asking of a round is over: drop its guard count. Then, while rounds settle at once,
 * evaluate and ask on. Returns the result, or EAGAIN when a continuation will wake us.
 */
static int drive(struct pawl_reconcile *r, int64_t *to_store)
{
    for (;;) {
        /* Acq_rel: pairs with the continuations' decrements (see on_done). */
        if (atomic_fetch_sub_explicit(&r->_waiting, 1, memory_order_acq_rel) != 1)
            return PAWL_EAGAIN;
        collect(r);
        /* Relaxed: nothing is waiting now; this is the guard of the next round's asking. */
        atomic_store_explicit(&r->_waiting, 1, memory_order_relaxed);
        if (evaluate(r)) {
            atomic_store_explicit(&r->_waiting, 0, memory_order_relaxed);
            *to_store = r->_result;
            return r->_rc;
        }
    }
}

static int start(struct pawl_reconcile *r, int kind, struct pawl_segment seg, int64_t asked,
                 int64_t stored, int64_t limit, int64_t *to_store)
{
    r->_kind = kind;
    r->_seg = seg;
    r->_stored = stored;
    r->_limit = limit;
    r->_round = 0;
    r->_rc = 0;
    r->_err[0] = '\0';
    r->_busy = true;
    /* Relaxed: no continuation exists yet; this is the guard of round 0's asking. */
    atomic_store_explicit(&r->_waiting, 1, memory_order_relaxed);
    for (size_t i = 0; i < r->_n; i++) {
        r->_slots[i].best = PAWL_RECONCILE_NOTHING;
        r->_slots[i].asked_now = false;
        r->_slots[i].f = NULL;
    }
    r->_agreed = kind == KIND_CHECKPOINT || r->_n == 0 ? asked : PAWL_RECONCILE_NOTHING;
    for (size_t i = 0; i < r->_n; i++)
        ask(r, i, asked, kind == KIND_RELEASE);
    return drive(r, to_store);
}

int pawl__reconcile_resume(struct pawl_reconcile *r, int64_t *to_store)
{
    if (r == NULL || to_store == NULL || !r->_busy)
        return PAWL_EINVAL;
    /* Woken, so the count is 0: take the guard back so that drive() can drop it. */
    atomic_store_explicit(&r->_waiting, 1, memory_order_relaxed);
    return drive(r, to_store);
}

int pawl__reconcile_checkpoint(struct pawl_reconcile *r, struct pawl_segment seg, int64_t requested,
                               int64_t stored, int64_t limit, int64_t *to_store)
{
    if (r == NULL || to_store == NULL || requested < 0 || limit < requested)
        return PAWL_EINVAL;
    if (r->_busy)
        return PAWL_EBUSY;
    if (requested <= stored) {
        /* Nothing a checkpoint could store: skip asking the units at all. */
        r->_err[0] = '\0';
        *to_store = PAWL_RECONCILE_NOTHING;
        return 0;
    }
    return start(r, KIND_CHECKPOINT, seg, requested, stored, limit, to_store);
}

int pawl__reconcile_release(struct pawl_reconcile *r, struct pawl_segment seg, int64_t up_to,
                            int64_t stored, int64_t *to_store)
{
    if (r == NULL || to_store == NULL || up_to < 0)
        return PAWL_EINVAL;
    if (r->_busy)
        return PAWL_EBUSY;
    if (up_to < stored)
        up_to = stored; /* nothing consumed since the store */
    return start(r, KIND_RELEASE, seg, up_to, stored, up_to, to_store);
}

int pawl__reconcile_claimed(struct pawl_reconcile *r, struct pawl_segment seg,
                            struct pawl_trigger *trigger, int64_t stored)
{
    r->_err[0] = '\0';
    for (size_t i = 0; i < r->_n; i++) {
        const struct pawl_ckpt_unit *u = &r->_units[i];
        if (u->ckpt->on_segment_claimed == NULL)
            continue;
        struct pawl_timers *saved = pawl__ckpt_timers_tls;
        pawl__ckpt_timers_tls = r->_timers;
        int rc = u->ckpt->on_segment_claimed(u->self, seg, trigger);
        pawl__ckpt_timers_tls = saved;
        if (rc == 0)
            continue;
        if (rc > 0)
            rc = PAWL_EHANDLER;
        set_err(r, "unit '%s' refused the claim of segment %u/%u: %s", unit_name(r, i), seg.id,
                seg.mask, pawl_strerror(rc));
        /* The units before it accepted: tell them the claim is off. Nothing was consumed, so
         * their reports cannot matter; their futures are dropped unawaited. */
        for (size_t j = 0; j < i; j++) {
            const struct pawl_ckpt_unit *v = &r->_units[j];
            if (v->ckpt->on_segment_claimed == NULL)
                continue;
            struct pawl_future *f = v->ckpt->on_segment_released
                                        ? v->ckpt->on_segment_released(v->self, seg, stored)
                                        : v->ckpt->on_checkpoint_advanced(v->self, seg, stored);
            pawl_future_unref(f);
        }
        return rc;
    }
    return 0;
}

/* ---- mode detection and the time-out helper ---- */

const char *pawl_ckpt_mode_name(enum pawl_ckpt_mode mode)
{
    switch (mode) {
    case PAWL_CKPT_PLAIN:
        return "plain";
    case PAWL_CKPT_AUTO:
        return "auto";
    case PAWL_CKPT_DEFERRED:
        return "deferred";
    }
    return "?";
}

int pawl__ckpt_mode_detect(const char *processor, const struct pawl_handler *handlers, size_t n,
                           enum pawl_ckpt_mode *out)
{
    if (out == NULL || (n > 0 && handlers == NULL))
        return PAWL_EINVAL;
    size_t units = 0;
    for (size_t i = 0; i < n; i++) {
        if (handlers[i].ckpt == NULL)
            continue;
        if (handlers[i].ckpt->on_checkpoint_advanced == NULL)
            return PAWL_EINVAL;
        units++;
    }
    if (units == 0) {
        *out = PAWL_CKPT_PLAIN;
    } else if (units == n) {
        *out = PAWL_CKPT_DEFERRED;
    } else {
        *out = PAWL_CKPT_AUTO;
        /* Debug: how the handlers' checkpoints combine is the processor's business, and a
         * print or count handler beside a unit (pawl run) is auto mode without anyone asking. */
        PAWL_DEBUG(MOD,
                   "processor '%s': %zu of %zu handlers are checkpointing units and %zu are not: "
                   "auto mode, every batch asks the units to cover its end (they cannot defer; "
                   "give them a processor of their own to defer)",
                   processor ? processor : "?", units, n, n - units);
    }
    return 0;
}

struct pawl_future *pawl_checkpoint_or_timeout(struct pawl_future *f, int64_t ms)
{
    if (f == NULL)
        return NULL;
    struct pawl_timers *tm = pawl__ckpt_timers_tls;
    struct pawl_future *g = NULL;
    if (tm != NULL && ms >= 0)
        g = pawl_future_or_timeout(f, tm, ms);
    if (g == NULL) {
        /* No timers here (called outside a unit callback) or no memory: fail rather than leave
         * the future unbounded, which is what the caller asked to avoid. */
        g = pawl_future_new();
        if (g != NULL)
            pawl_future_fail(g, tm == NULL ? PAWL_EINVAL : PAWL_ENOMEM,
                             tm == NULL ? "pawl_checkpoint_or_timeout called outside a "
                                          "checkpointing callback (no timers on this thread)"
                                        : "cannot arm the checkpoint time-out");
    }
    pawl_future_unref(f);
    return g;
}
