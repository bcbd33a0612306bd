/*
 * deque.c — Chase–Lev deque. The memory orderings follow Lê et al. (2013), except that the two
 * seq_cst fences of the paper (in pop between the bottom store and the top load, in steal between
 * the top load and the bottom load) are expressed as seq_cst accesses to those four locations
 * instead: the single total order over seq_cst operations gives the same guarantee, it costs the
 * same on x86 (the pop store becomes one xchg instead of mov + mfence), and ThreadSanitizer
 * understands it (it does not model stand-alone fences). Likewise push publishes with a release
 * store to bottom rather than a release fence and a relaxed store.
 *
 * Why each ordering is needed is written next to it. The key races:
 *   - owner pop vs thieves. A thief reads top (t), then bottom (b), both seq_cst, and takes
 *     t .. t+k-1 with one seq_cst CAS of top from t to t+k, where k <= PAWL_DEQUE_CHUNK (C) and
 *     k <= b - t. The owner pops slot b' without CAS only after storing bottom = b' and then
 *     reading top = t' (both seq_cst) with b' - t' >= C; otherwise it gives the claim back and
 *     takes the oldest task through top by CAS, as a thief would (and when it believes C or fewer
 *     are queued it goes that way at once). Why a thief's successful CAS never covers a slot b'
 *     the owner took without CAS: top equals t from the thief's read until its CAS. If the
 *     owner's read of top comes after the thief's CAS, t' >= t + k, so b' >= t' + C > t + k. If it
 *     comes between the thief's read of top and its CAS, t' = t and b' >= t + C >= t + k. If it
 *     comes before the thief's read of top, then in the seq_cst total order the owner's store of
 *     b' precedes the thief's read of bottom, which therefore sees b' (then t + k <= b') or a
 *     later bottom; a later bottom above b' means the owner pushed at b' again, and the slot the
 *     thief then reads (after that acquire) holds the new task, not the one the owner took.
 *     The paper's algorithm is the case C = 1. Moving top by more than C in one CAS would not be
 *     safe: the owner could take a slot inside the thief's range without noticing.
 *   - owner through top vs thieves, and thief vs thief: the CAS on top decides.
 *   - batch steal (pawl__deque_steal_batch): up to half of what the thief saw, in chunks of C per
 *     CAS, bottom re-read (seq_cst) between chunks. The chunk is what makes a fan-out cheap to
 *     split: without it a thief pays one CAS (and one transfer of top's cache line to the
 *     owner's next pop) per task.
 *   - growth: the owner copies live slots into a new ring and publishes it with release; a thief
 *     that read the old ring still reads correct values there (the owner never overwrites slots
 *     in [top, bottom) of the old ring once it has switched) and the old ring is not freed.
 */
#include "deque.h"

#include <stdbool.h>
#include <string.h>

static struct pawl_deque_ring *ring_new(int64_t cap)
{
    struct pawl_deque_ring *r = pawl_malloc(sizeof(*r) + (size_t)cap * sizeof(struct pawl_task *));
    if (r == NULL)
        return NULL;
    r->mask = cap - 1;
    r->retired_next = NULL;
    memset(r->slot, 0, (size_t)cap * sizeof(struct pawl_task *));
    return r;
}

int pawl__deque_init(struct pawl_deque *d, int64_t capacity)
{
    int64_t cap = 2;
    while (cap < capacity)
        cap <<= 1;
    memset(d, 0, sizeof(*d));
    d->ring = ring_new(cap);
    return d->ring ? 0 : PAWL_ENOMEM;
}

void pawl__deque_fini(struct pawl_deque *d)
{
    pawl_free(d->ring);
    for (struct pawl_deque_ring *r = d->retired, *n; r; r = n) {
        n = r->retired_next;
        pawl_free(r);
    }
    d->ring = NULL;
    d->retired = NULL;
}

void pawl__deque_adopt(struct pawl_deque *d)
{
    /* Relaxed: the handover itself is ordered by the join that ended the previous owner. */
    atomic_store_explicit(PAWL_ATOMIC_OF(&d->owner), pawl_thread_tag(), memory_order_relaxed);
}

/* Owner only (deque.h): the first thread to push or pop owns the deque until it is adopted. */
static inline void assert_owner(struct pawl_deque *d)
{
#if PAWL_ASSERTIONS_ON
    uintptr_t owner = 0, me = pawl_thread_tag();
    /* Relaxed: only the owner writes it after binding; a thief never reads it. */
    if (!atomic_compare_exchange_strong_explicit(PAWL_ATOMIC_OF(&d->owner), &owner, me,
                                                 memory_order_relaxed, memory_order_relaxed))
        PAWL_ASSERT(owner == me && "pawl_deque push/pop from a thread that is not the owner");
#else
    (void)d;
#endif
}

static struct pawl_deque_ring *grow(struct pawl_deque *d, struct pawl_deque_ring *old, int64_t t,
                                    int64_t b)
{
    struct pawl_deque_ring *r = ring_new((old->mask + 1) * 2);
    if (r == NULL)
        return NULL;
    for (int64_t i = t; i < b; i++) {
        /* Relaxed: only the owner writes slots, and this is the owner. */
        struct pawl_task *x =
            atomic_load_explicit(PAWL_ATOMIC_OF(&old->slot[i & old->mask]), memory_order_relaxed);
        atomic_store_explicit(PAWL_ATOMIC_OF(&r->slot[i & r->mask]), x, memory_order_relaxed);
    }
    old->retired_next = d->retired;
    d->retired = old;
    /* Release: a thief that acquires the new ring sees the slots copied into it. */
    atomic_store_explicit(PAWL_ATOMIC_OF(&d->ring), r, memory_order_release);
    return r;
}

/*
 * Owner only: make room for n more tasks from index b, growing the ring if needed; the ring, or
 * NULL when growing failed. Called when b + n - top_seen exceeds the capacity. A slot may be
 * overwritten once the task it held (index i - capacity) has been taken, i.e. once
 * top > i - capacity. top_seen is a value of top read with acquire (here or in pop), so the
 * thief's CAS that took that task, and its read of the slot before the CAS, happen before our
 * overwrite; and top >= top_seen, so the fast check against top_seen (in the pushes) is
 * conservative. Only when it fails do we come here and read top again.
 */
static struct pawl_deque_ring *make_room(struct pawl_deque *d, struct pawl_deque_ring *r, int64_t b,
                                         int64_t n)
{
    /* Acquire: a thief's CAS on top released the slot it took; we may now overwrite it. */
    int64_t t = atomic_load_explicit(PAWL_ATOMIC_OF(&d->top), memory_order_acquire);
    d->top_seen = t;
    while (b + n - t > r->mask + 1) {
        r = grow(d, r, t, b);
        if (r == NULL)
            return NULL;
    }
    return r;
}

int pawl__deque_push_n_owner(struct pawl_deque *d, struct pawl_task *const *ts, int64_t n)
{
    assert_owner(d);
    PAWL_ASSERT(n >= 1);
    /* Relaxed: bottom and the ring pointer are written only by this (the owner) thread. */
    int64_t b = atomic_load_explicit(PAWL_ATOMIC_OF(&d->bottom), memory_order_relaxed);
    struct pawl_deque_ring *r =
        atomic_load_explicit(PAWL_ATOMIC_OF(&d->ring), memory_order_relaxed);
    if (b + n - d->top_seen > r->mask + 1 && (r = make_room(d, r, b, n)) == NULL)
        return PAWL_ENOMEM;
    for (int64_t i = 0; i < n; i++) {
        /* Relaxed: published by the release store to bottom below. */
        atomic_store_explicit(PAWL_ATOMIC_OF(&r->slot[(b + i) & r->mask]), ts[i],
                              memory_order_relaxed);
    }
    /* Release: a thief that reads the new bottom (acquire) sees every slot up to it and the
     * tasks' fields. */
    atomic_store_explicit(PAWL_ATOMIC_OF(&d->bottom), b + n, memory_order_release);
    return 0;
}

/* push when the fast check fails: out of line, so that the common push needs no stack frame. */
static __attribute__((noinline)) int push_slow(struct pawl_deque *d, struct pawl_task *x)
{
    return pawl__deque_push_n_owner(d, &x, 1);
}

int pawl__deque_push_owner(struct pawl_deque *d, struct pawl_task *x)
{
    assert_owner(d);
    PAWL_ASSERT(x != NULL);
    /* Relaxed: bottom and the ring pointer are written only by this (the owner) thread. */
    int64_t b = atomic_load_explicit(PAWL_ATOMIC_OF(&d->bottom), memory_order_relaxed);
    struct pawl_deque_ring *r =
        atomic_load_explicit(PAWL_ATOMIC_OF(&d->ring), memory_order_relaxed);
    if (PAWL_UNLIKELY(b + 1 - d->top_seen > r->mask + 1))
        return push_slow(d, x);
    /* Relaxed: published by the release store to bottom below. */
    atomic_store_explicit(PAWL_ATOMIC_OF(&r->slot[b & r->mask]), x, memory_order_relaxed);
    /* Release: a thief that reads the new bottom (acquire) sees the slot and the task's fields. */
    atomic_store_explicit(PAWL_ATOMIC_OF(&d->bottom), b + 1, memory_order_release);
    return 0;
}

/*
 * The small-deque path of pop, and the tail of the large one when thieves came close: take the
 * oldest task the way a thief does, through a CAS on top, without touching bottom. t is a value
 * of top read by the owner (a hint: the CAS validates it). Loops while thieves keep winning.
 */
static struct pawl_task *pop_top(struct pawl_deque *d, struct pawl_deque_ring *r, int64_t b,
                                 int64_t t)
{
    while (t < b) {
        /* Relaxed: the owner wrote this slot itself; the CAS below says whether it is ours. */
        struct pawl_task *x =
            atomic_load_explicit(PAWL_ATOMIC_OF(&r->slot[t & r->mask]), memory_order_relaxed);
        /* Seq_cst CAS, as a thief's: against thieves' CAS on top the first one wins; on
         * failure t is the new top (acquire: a valid top_seen, see make_room). */
        if (atomic_compare_exchange_strong_explicit(PAWL_ATOMIC_OF(&d->top), &t, t + 1,
                                                    memory_order_seq_cst, memory_order_acquire)) {
            d->top_seen = t + 1;
            return x;
        }
    }
    d->top_seen = t;
    return NULL;
}

struct pawl_task *pawl__deque_pop_owner(struct pawl_deque *d)
{
    assert_owner(d);
    /* Relaxed: owner-only field. */
    int64_t b = atomic_load_explicit(PAWL_ATOMIC_OF(&d->bottom), memory_order_relaxed);
    /* top only grows and never passes bottom (a claim given back restores it). */
    PAWL_ASSERT(d->top_seen <= b);
    /* Empty for sure: top >= top_seen >= b, and only we add tasks. No claim, no fence. */
    if (b <= d->top_seen)
        return NULL;
    struct pawl_deque_ring *r =
        atomic_load_explicit(PAWL_ATOMIC_OF(&d->ring), memory_order_relaxed);
    /* Few tasks (as far as we know; top only grows): take the oldest through top. Acquire:
     * a valid top_seen if the CAS fails on the first try and we return (see pop_top). */
    if (b - d->top_seen <= PAWL_DEQUE_CHUNK)
        return pop_top(d, r, b,
                       atomic_load_explicit(PAWL_ATOMIC_OF(&d->top), memory_order_acquire));
    b--;
    /* Seq_cst store then seq_cst load of top: our claim on slot b and a thief's reading of
     * bottom must fall in one total order with its read of top (the paper's fence): either the
     * thief sees our claim and leaves slot b alone, or we see its top. Also a release, so a
     * thief acquiring this value synchronises with the pushes before it. */
    atomic_store_explicit(PAWL_ATOMIC_OF(&d->bottom), b, memory_order_seq_cst);
    int64_t t = atomic_load_explicit(PAWL_ATOMIC_OF(&d->top), memory_order_seq_cst);
    d->top_seen = t; /* a seq_cst load is an acquire: a valid bound (see make_room) */
    if (PAWL_LIKELY(b - t >= PAWL_DEQUE_CHUNK)) {
        /* At least a chunk lies between top and slot b, and a thief moves top by at most a
         * chunk per CAS, within what it saw: slot b is ours (the proof is in the file's
         * comment). Relaxed: the owner wrote this slot itself. */
        return atomic_load_explicit(PAWL_ATOMIC_OF(&r->slot[b & r->mask]), memory_order_relaxed);
    }
    /* Thieves came close: give the claim back (release, as above) and take the oldest task
     * through top instead. */
    atomic_store_explicit(PAWL_ATOMIC_OF(&d->bottom), b + 1, memory_order_release);
    return pop_top(d, r, b + 1, t);
}

struct pawl_task *pawl__deque_steal(struct pawl_deque *d)
{
    struct pawl_task *x;
    int64_t k = pawl__deque_steal_batch(d, &x, 1);
    return k > 0 ? x : k < 0 ? PAWL_DEQUE_ABORT : NULL;
}

int64_t pawl__deque_steal_batch(struct pawl_deque *d, struct pawl_task **out, int64_t max)
{
    /* Seq_cst loads of top then bottom: pair with pop's seq_cst store of bottom and load of top
     * (see there). The bottom load also acquires push's release: slots and tasks are visible. */
    int64_t t = atomic_load_explicit(PAWL_ATOMIC_OF(&d->top), memory_order_seq_cst);
    int64_t b = atomic_load_explicit(PAWL_ATOMIC_OF(&d->bottom), memory_order_seq_cst);
    if (t >= b)
        return 0;
    /* Half of what we saw, rounded up: the owner keeps the rest. */
    int64_t want = PAWL_MIN(max, (b - t + 1) / 2);
    int64_t n = 0;
    for (;;) {
        /* One chunk: at most PAWL_DEQUE_CHUNK, and only tasks below the bottom we just read. */
        int64_t k = PAWL_MIN(PAWL_MIN(want - n, PAWL_DEQUE_CHUNK), b - t);
        if (k <= 0)
            return n;
        /* Acquire: pairs with the release publication of a grown ring (re-read each time: the
         * bottom we just read may cover slots pushed into a newer ring). */
        struct pawl_deque_ring *r =
            atomic_load_explicit(PAWL_ATOMIC_OF(&d->ring), memory_order_acquire);
        for (int64_t i = 0; i < k; i++) {
            /* Relaxed: published by bottom; the CAS below validates that they were still
             * queued (the owner overwrites a slot only after top has passed it). */
            out[n + i] = atomic_load_explicit(PAWL_ATOMIC_OF(&r->slot[(t + i) & r->mask]),
                                              memory_order_relaxed);
        }
        /* Seq_cst CAS: take indexes t .. t+k-1; fails if the owner or another thief moved top
         * first. A loss after the first chunk ends the batch; a loss on the first reports the
         * race. */
        if (!atomic_compare_exchange_strong_explicit(PAWL_ATOMIC_OF(&d->top), &t, t + k,
                                                     memory_order_seq_cst, memory_order_relaxed))
            return n > 0 ? n : -1;
        n += k;
        t += k;
        if (n == want)
            return n;
        /* Seq_cst load of bottom after our seq_cst CAS of top: the same pair as the loads at
         * the top of this function (the CAS reads top). */
        b = atomic_load_explicit(PAWL_ATOMIC_OF(&d->bottom), memory_order_seq_cst);
    }
}

int64_t pawl__deque_size(const struct pawl_deque *d)
{
    /* Relaxed: an estimate for parking decisions; callers fence before relying on it. */
    int64_t b = atomic_load_explicit(PAWL_ATOMIC_OF(&d->bottom), memory_order_relaxed);
    int64_t t = atomic_load_explicit(PAWL_ATOMIC_OF(&d->top), memory_order_relaxed);
    return b - t;
}
