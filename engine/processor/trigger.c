/*
 * trigger.c — the per-segment checkpoint trigger (see trigger.h for the contract).
 *
 * State, each word on its own cache line because requesters on other threads hammer `pending`
 * while the worker reads it:
 *   pending  the highest requested token, or NONE (-1). Requests merge with a CAS max loop, so
 *            concurrent requests from many threads end up as the highest of them.
 *   armed    1 when the next request must wake the worker. take() re-arms before it takes, and
 *            a request that raised `pending` disarms and wakes. With both sides sequentially
 *            consistent either the take sees the request or the request sees armed = 1, so a
 *            request is never left pending with nobody woken.
 *   gate     bit 0: dead (inert); bits 1..: requests currently inside the live section. A request
 *            enters (+2), checks dead, merges, maybe wakes, leaves (-2). invalidate() sets dead
 *            and waits for the count to drain, so no wake runs after it returns.
 *   refs     the creator's reference plus one per pawl_trigger_ref.
 */
#include "trigger.h"

#include "common.h"

#include <sched.h>
#include <stdatomic.h>

#define NONE ((int64_t)-1)
#define GATE_DEAD ((uint64_t)1)
#define GATE_ONE ((uint64_t)2)

struct pawl_trigger {
    _Alignas(PAWL_CACHELINE) _Atomic int64_t pending;
    char pad0_[PAWL_CACHELINE - sizeof(int64_t)];
    _Alignas(PAWL_CACHELINE) _Atomic uint64_t gate;
    char pad1_[PAWL_CACHELINE - sizeof(uint64_t)];
    _Alignas(PAWL_CACHELINE) _Atomic int armed;
    _Atomic int refs;
    pawl_trigger_wake_fn wake;
    void *arg;
};

struct pawl_trigger *pawl__trigger_new(pawl_trigger_wake_fn wake, void *arg)
{
    struct pawl_trigger *t = pawl_malloc(sizeof *t);
    if (t == NULL)
        return NULL;
    atomic_init(&t->pending, NONE);
    atomic_init(&t->gate, 0);
    atomic_init(&t->armed, 1);
    atomic_init(&t->refs, 1);
    t->wake = wake;
    t->arg = arg;
    return t;
}

struct pawl_trigger *pawl_trigger_ref(struct pawl_trigger *t)
{
    if (t != NULL) {
        /* Relaxed: taking a reference needs no ordering, only the count (the caller has one). */
        int old = atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
        PAWL_ASSERT(old > 0);
        (void)old;
    }
    return t;
}

void pawl_trigger_unref(struct pawl_trigger *t)
{
    if (t == NULL)
        return;
    /* Release: our last uses of t happen before the free; acquire on the last one to see theirs. */
    int old = atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel);
    PAWL_ASSERT(old > 0); /* the caller held a reference */
    if (old == 1)
        pawl_free(t);
}

void pawl__trigger_free(struct pawl_trigger *t)
{
    if (t == NULL)
        return;
    pawl__trigger_invalidate(t);
    pawl_trigger_unref(t);
}

/* Merge token into pending; true when pending went up (this request is news). */
static bool merge_max(struct pawl_trigger *t, int64_t token)
{
    int64_t cur = atomic_load_explicit(&t->pending, memory_order_relaxed);
    while (cur < token) {
        /* Seq_cst: pairs with the worker's arm-then-exchange in take() (see the file comment). */
        if (atomic_compare_exchange_weak(&t->pending, &cur, token))
            return true;
    }
    return false;
}

int pawl_trigger_request(struct pawl_trigger *t, int64_t token)
{
    if (t == NULL)
        return PAWL_EINVAL;
    if (token < 0)
        return PAWL_ERANGE;
    /* Seq_cst: enter the live section before checking dead, ordered against invalidate's
     * fetch_or, so invalidate either sees us inside or we see dead. */
    uint64_t g = atomic_fetch_add(&t->gate, GATE_ONE);
    int rc = 0;
    if (g & GATE_DEAD) {
        rc = PAWL_ESHUTDOWN;
    } else if (merge_max(t, token)) {
        /* Seq_cst: after our merge; sees the re-arm of any take that missed the merge. */
        if (atomic_exchange(&t->armed, 0) && t->wake != NULL)
            t->wake(t->arg);
    }
    /* Release: our wake call and reads of t->arg happen before invalidate sees the count drop. */
    atomic_fetch_sub_explicit(&t->gate, GATE_ONE, memory_order_release);
    return rc;
}

int pawl_trigger_request_latest(struct pawl_trigger *t)
{
    return pawl_trigger_request(t, PAWL_TOKEN_LATEST);
}

int pawl_trigger_is_live(const struct pawl_trigger *t)
{
    /* Acquire: a caller who sees 0 also sees what the worker did before invalidating. */
    return t != NULL &&
           !(atomic_load_explicit(&((struct pawl_trigger *)t)->gate, memory_order_acquire) &
             GATE_DEAD);
}

bool pawl__trigger_take(struct pawl_trigger *t, int64_t consumed, int64_t *out)
{
    /* Seq_cst: re-arm before taking, so a request merged after the exchange below wakes us. */
    atomic_store(&t->armed, 1);
    /* Seq_cst: the take itself; see armed above. */
    int64_t p = atomic_exchange(&t->pending, NONE);
    if (p == NONE)
        return false;
    if (p == PAWL_TOKEN_LATEST) {
        *out = consumed;
        return true;
    }
    if (p <= consumed) {
        *out = p;
        return true;
    }
    /* Not consumed that far yet: put it back (merging with anything that arrived meanwhile). The
     * worker checks again after its next batch, so no wake is needed for it. */
    merge_max(t, p);
    return false;
}

bool pawl__trigger_has_pending(const struct pawl_trigger *t)
{
    /* Relaxed: a hint; take() does the ordered exchange. */
    return atomic_load_explicit(&((struct pawl_trigger *)t)->pending, memory_order_relaxed) != NONE;
}

bool pawl__trigger_ready(const struct pawl_trigger *t, int64_t consumed)
{
    /* Relaxed: a hint, as in has_pending. */
    int64_t p = atomic_load_explicit(&((struct pawl_trigger *)t)->pending, memory_order_relaxed);
    return p != NONE && (p == PAWL_TOKEN_LATEST || p <= consumed);
}

void pawl__trigger_invalidate(struct pawl_trigger *t)
{
    if (t == NULL)
        return;
    /* Seq_cst: pairs with request's fetch_add; requests entering after this see dead. */
    atomic_fetch_or(&t->gate, GATE_DEAD);
    /* Acquire: once the count is zero, every request that was inside (and its wake) is done. */
    while ((atomic_load_explicit(&t->gate, memory_order_acquire) & ~GATE_DEAD) != 0)
        sched_yield();
    /* Relaxed: nobody reads pending of a dead trigger in a way that matters; tidy for asserts. */
    atomic_store_explicit(&t->pending, NONE, memory_order_relaxed);
}
