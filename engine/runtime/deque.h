/*
 * deque.h — the Chase–Lev work-stealing deque of pawl_task pointers, in the C11 formulation of
 * Lê, Pop, Cohen and Zappa Nardelli ("Correct and Efficient Work-Stealing for Weak Memory
 * Models", PPoPP 2013), on C11 atomics.
 *
 * The owner pushes and pops at the bottom (LIFO); any number of thieves steal at the top (FIFO).
 * Two departures from the paper, both so that a thief moves top by several tasks in one CAS:
 * a thief takes at most PAWL_DEQUE_CHUNK tasks per CAS, and the owner pops at the bottom
 * without a CAS only while at least that many lie between top and the slot it takes; with
 * fewer queued it takes the oldest through top, as a thief does (so the last PAWL_DEQUE_CHUNK
 * tasks of a deque run oldest first). deque.c has the proof.
 * The ring grows by doubling when full; a replaced ring is kept on a retired list until
 * pawl__deque_fini because a thief may still be reading it (no epoch reclamation needed: at most
 * log2(max/initial) rings are ever retired). If growing fails, push returns PAWL_ENOMEM and the
 * caller routes the task elsewhere (the pool's injection queue).
 *
 * The owner keeps the last value of top it read (top_seen). top never decreases, so bottom -
 * top_seen bounds the size from above: a push that fits under that bound and a pop that finds
 * bottom <= top_seen (empty) need not read top, which thieves keep writing.
 *
 * Threads, in the names (ConcurrencyKit style): the _owner functions (push, push_n, pop) only
 * from the owning thread; the thieves' pawl__deque_steal / pawl__deque_steal_batch and
 * pawl__deque_size from any thread.
 */
#ifndef PAWL_ENGINE_DEQUE_H
#define PAWL_ENGINE_DEQUE_H

#include "common.h"
#include "pawl/runtime.h"

struct pawl_deque_ring {
    int64_t mask; /* capacity - 1 */
    struct pawl_deque_ring *retired_next;
    struct pawl_task *slot[]; /* accessed atomically (relaxed): thieves race with the owner */
};

struct pawl_deque {
    int64_t top; /* next index to steal; advanced by CAS (thieves and the owner's last pop) */
    char pad0[PAWL_CACHELINE - sizeof(int64_t)];
    int64_t bottom;                  /* next index to push; written by the owner only */
    int64_t top_seen;                /* owner-only: a value of top the owner read (acquire) */
    struct pawl_deque_ring *ring;    /* current ring; replaced by the owner on growth */
    struct pawl_deque_ring *retired; /* owner-only list of old rings */
    uintptr_t owner; /* assertion builds: pawl_thread_tag() of the owner, bound at first use */
    char pad1[PAWL_CACHELINE - 2 * sizeof(int64_t) - 2 * sizeof(void *) - sizeof(uintptr_t)];
};

/* Tasks a thief takes per CAS on top, and the depth below which the owner pops through top. */
#ifndef PAWL_DEQUE_CHUNK
#define PAWL_DEQUE_CHUNK 8
#endif

#define PAWL_DEQUE_ABORT ((struct pawl_task *)1) /* steal lost a race; retry or move on */

/* capacity is rounded up to a power of two (minimum 2). 0 or PAWL_ENOMEM. */
int pawl__deque_init(struct pawl_deque *d, int64_t capacity);
void pawl__deque_fini(struct pawl_deque *d);

/* Make the calling thread the owner: once the previous owner has been joined (a pool's freeing
 * thread cancelling what its workers left). Ownership is asserted in assertion builds only. */
void pawl__deque_adopt(struct pawl_deque *d);

/* Owner only. 0, or PAWL_ENOMEM when full and growing failed (t was not queued). */
int pawl__deque_push_owner(struct pawl_deque *d, struct pawl_task *t);

/*
 * Owner only. Push ts[0..n-1] (n >= 1) in that order, published together with one store of
 * bottom (thieves steal ts[0] first; the owner pops ts[n-1] first). 0, or PAWL_ENOMEM when
 * growing failed (then none of them was queued).
 */
int pawl__deque_push_n_owner(struct pawl_deque *d, struct pawl_task *const *ts, int64_t n);

/* Owner only. The most recently pushed task while more than PAWL_DEQUE_CHUNK are queued, else
 * the oldest; NULL when empty. */
struct pawl_task *pawl__deque_pop_owner(struct pawl_deque *d);

/* Any thread. The oldest task, NULL when empty, or PAWL_DEQUE_ABORT after losing a race. */
struct pawl_task *pawl__deque_steal(struct pawl_deque *d);

/*
 * Any thread. Take up to max (>= 1) of the oldest tasks, and at most half of those queued
 * (rounded up), into out[0..] oldest first. The number taken; 0 when empty; -1 when it lost the
 * race for the first one (retry or move on). One CAS on top per PAWL_DEQUE_CHUNK tasks.
 */
int64_t pawl__deque_steal_batch(struct pawl_deque *d, struct pawl_task **out, int64_t max);

/* Any thread. bottom - top, a racy estimate (may be off by the operations in flight). */
int64_t pawl__deque_size(const struct pawl_deque *d);

#endif
