/*
 * ckring.h — ConcurrencyKit's single-producer, single-consumer ring (ck_ring) as the runtime uses
 * it, with the hand-off made visible to ThreadSanitizer.
 *
 * ck_ring synchronises through ck_pr, whose loads and stores are inline assembly on x86-64: TSan
 * sees neither the producer's publication of a slot nor the consumer's release of it, so every
 * hand-off of a freshly written object through a bare ck_ring is a data race in its eyes. Under
 * TSan (and only there) these wrappers tell it about the two happens-before edges the ring's
 * fences provide, with __tsan_release/__tsan_acquire on the ring's own counters:
 *   producer -> consumer: the producer writes the slot (reserved with ck_ring's reserve/commit
 *     pair), releases on p_tail and then commits; the consumer reads p_tail, sees the slot
 *     filled, acquires on p_tail and only then dequeues (reads the slot). Everything the producer
 *     did before the push happens before everything the consumer does after the pop.
 *   consumer -> producer: the consumer releases on c_head after each dequeue; the producer
 *     acquires on c_head after its reserve has read c_head. ck_ring keeps one slot empty, so a
 *     producer that saw c_head = c writes at most slot c + size - 2, which the consumer read in
 *     the dequeue before the one that stored c: that dequeue's release preceded the store the
 *     producer read, and is in the clock it acquires. The consumer's read of a slot thus happens
 *     before the producer's next write of it.
 * Outside TSan the wrappers are ck_ring_enqueue_spsc and ck_ring_dequeue_spsc, nothing added.
 * PAWL_CKRING_PLANT_RACE (tests only) drops the annotations under TSan, so that a test can show
 * TSan still reports a hand-off whose ordering it is not told about (tests/stress/ckring_race.c).
 *
 * Threads: pawl_ckring_push_sp by the ring's one producer at a time, pawl_ckring_pop_sc by its
 * one consumer at a time (either role may move to another thread through a lock or an atomic
 * with release/acquire ordering, which TSan sees); pawl_ckring_count from any thread (a
 * snapshot). A ring of size slots holds size - 1 items.
 */
#ifndef PAWL_ENGINE_CKRING_H
#define PAWL_ENGINE_CKRING_H

#include <ck_ring.h>
#include <stdbool.h>

#if defined(__SANITIZE_THREAD__)
#define PAWL_CKRING_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PAWL_CKRING_TSAN 1
#endif
#endif
#if defined(PAWL_CKRING_TSAN) && !defined(PAWL_CKRING_PLANT_RACE)
#define PAWL_CKRING_ANNOTATE 1
#include <sanitizer/tsan_interface.h>
#endif

/* The producer: queue v; false if the ring is full (nothing done). */
static inline bool pawl_ckring_push_sp(ck_ring_t *r, ck_ring_buffer_t *buf, void *v)
{
#ifdef PAWL_CKRING_ANNOTATE
    ck_ring_buffer_t *slot = ck_ring_enqueue_reserve_spsc(r, buf);
    if (slot == NULL)
        return false;
    /* The consumer's reads of this slot, one lap ago, happen before our write (see above). */
    __tsan_acquire(&r->c_head);
    slot->value = v;
    /* Our writes, the slot's included, happen before the consumer's dequeue of it. */
    __tsan_release(&r->p_tail);
    ck_ring_enqueue_commit_spsc(r);
    return true;
#else
    return ck_ring_enqueue_spsc(r, buf, v);
#endif
}

/* The consumer: take the oldest item into *out; false if the ring is empty. */
static inline bool pawl_ckring_pop_sc(ck_ring_t *r, ck_ring_buffer_t *buf, void **out)
{
#ifdef PAWL_CKRING_ANNOTATE
    /* Only we advance c_head: a tail past it means the slot at c_head is published. */
    if (ck_pr_load_uint(&r->p_tail) == r->c_head)
        return false;
    /* The producer's writes before that publication happen before our read of the slot. */
    __tsan_acquire(&r->p_tail);
    bool ok = ck_ring_dequeue_spsc(r, buf, out);
    /* Our read of the slot happens before the producer's next write of it. */
    __tsan_release(&r->c_head);
    return ok;
#else
    return ck_ring_dequeue_spsc(r, buf, out);
#endif
}

/* Items queued, as of two loads (consumer's position first): exact only when neither side
 * moves. */
static inline unsigned pawl_ckring_count(const ck_ring_t *r)
{
    return ck_ring_size(r);
}

/* The producer's position: items ever pushed, modulo 2^32. */
static inline unsigned pawl_ckring_tail(const ck_ring_t *r)
{
    return ck_pr_load_uint(&r->p_tail);
}

/* The consumer's position: items ever taken, modulo 2^32. */
static inline unsigned pawl_ckring_head(const ck_ring_t *r)
{
    return ck_pr_load_uint(&r->c_head);
}

#endif
