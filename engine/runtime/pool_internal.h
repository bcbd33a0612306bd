/*
 * pool_internal.h — what the files of the work-stealing pool share: the layout of the pool and
 * of a worker, the constants their queues are sized by, and the submitter's half of the parking
 * hand-shake (wake_one, notify) and the list push, which both submitters and workers use. Private
 * to engine/runtime/pool*.c; the rest of the runtime sees pool.h. Shared functions carry the
 * prefix pawl__pool_ (hidden, like every symbol without PAWL_API).
 *
 * Each worker owns a Chase–Lev deque (deque.c): tasks a worker submits go to the bottom of its
 * own deque and it pops them LIFO (cache-warm) while its deque is deep, oldest first for the last
 * few; idle workers steal FIFO from the top of another worker's deque, starting at a random
 * victim, and take up to half of it (at most STEAL_BATCH, one CAS per PAWL_DEQUE_CHUNK tasks):
 * the thief runs the oldest and keeps the rest in its own deque, so a fan-out is split in a few
 * steals instead of one steal per task on the victim's cache lines. Threads outside the pool
 * submit single tasks through a ring of their own (a single-producer ring per outside thread and
 * pool: ConcurrencyKit's ck_ring, see spsc_push_sp), batches through the injection ring (an array
 * of task pointers, one CAS per batch; see ring_push_mp), and both through a lock-free MPSC list
 * (mpsc.c) when their ring is full or missing: producers never wait; the consumer role over all of
 * them is taken by one worker at a time with a try-lock, and a worker that gets it moves a small
 * batch into its own deque (one publication for the batch) so that others can steal from there.
 * Every 61st task a worker looks at the injection queue first, so outside work is not starved by a
 * worker feeding itself.
 *
 * A batch (pawl_pool_submit_batch) costs what one task costs: from a worker, its tasks are
 * written into the deque and published with one store of bottom; from outside, they
 * reserve their slots in the injection ring with one CAS (or, when it is full, are linked into a
 * chain that enters the list with one exchange and is counted with one add). Either way one
 * wake-up check follows.
 *
 * Parking is an eventcount on one futex word (epoch) with a sleeper count:
 *   worker:    e = epoch; sleepers++; [seq_cst fence]; re-check every queue; futex_wait(epoch, e)
 *   submitter: publish task; [seq_cst fence]; if sleepers > 0 { epoch++; futex_wake(1) }
 * (futex_wake only when a sleeper has passed its re-check and counted itself in `blocked`,
 * just before its futex_wait: see wake_one.)
 * (An outside submitter's publication is the release store of its own ring's tail, followed by
 * the fence; or, for a batch or the list, the seq_cst CAS of ring_tail or add to inject_in, a
 * read-modify-write that orders it before the seq_cst load of sleepers by itself: no fence on
 * that path.)
 * The two fences make this a Dekker pattern: either the submitter sees the sleeper and bumps the
 * epoch (the wait then returns at once or is woken), or the worker's re-check sees the task. No
 * wake-up is lost. A worker that pushes onto its own deque skips its fence where the kernel has
 * membarrier(2): a worker that parks while another worker may be running then pays for both
 * sides with one expedited membarrier, which runs a full barrier on every CPU that runs one of
 * our threads (an asymmetric Dekker pattern; see notify_own and park). Only one wake-up is in
 * flight at a time (`waking`, see notify()): a burst of submissions costs one futex call, and
 * the woken worker, once it has found work, wakes the next if more is waiting and worth a wake-up
 * (the pass-on rule, see worth_waking) — so sleepers are woken in a chain, as fast as they find
 * work, but not for work the woken one finishes sooner.
 *
 * Shutdown (pawl_pool_free): set stop, wake everybody, join; workers finish the task they are
 * running and leave the rest. Then the freeing thread cancels what is queued (deques, injection
 * ring, producer rings and list) until nothing is left — a cancelled task may submit more, which
 * lands in the injection queue and is cancelled in a later round.
 *
 * Threads: pawl_pool_submit and pawl_pool_submit_batch from anywhere; pawl_pool_free from a thread
 * outside the pool.
 *
 * The files, lowest first; each calls only the ones before it (and this header's inline
 * functions):
 *   pool_worker.c  the worker threads: finding work (own deque, the injection queue's consumer
 *                  role, stealing), the pass-on rule, parking
 *   pool_submit.c  pawl_pool_submit, pawl_pool_submit_batch, pawl__pool_yield and the producer
 *                  side of the queues they feed: producer rings, injection ring, list
 *   pool.c         the life cycle: pawl_pool_new, pawl_pool_free (and its draining), stats
 * Fields of struct pawl_pool say who writes them.
 */
#ifndef PAWL_ENGINE_POOL_INTERNAL_H
#define PAWL_ENGINE_POOL_INTERNAL_H

#include "pool.h"

#include "ckring.h"
#include "common.h"
#include "deque.h"
#include "futex.h"
#include "mpsc.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define INJECT_BATCH 32
#ifndef PAWL_POOL_RING
#define PAWL_POOL_RING 16384 /* slots of the injection ring (a power of two; -D for tests) */
#endif
#define RING_SIZE PAWL_POOL_RING
#ifndef PAWL_POOL_SPSC
/* Slots of an outside thread's own ring (a power of two; it holds one task fewer): as many as the
 * shared ring, since a full ring sends each further submission to the list (1024 slots cost a
 * fifth of the single-task submit_run/inject throughput, where the submitter runs ahead of the
 * workers by thousands of tasks). 128 KiB per outside thread and pool. */
#define PAWL_POOL_SPSC 16384
#endif
#define SPSC_SIZE PAWL_POOL_SPSC
#define SPSC_MAX 16 /* producer rings per pool; more outside threads share the list */

struct worker {
    struct pawl_deque dq;
    struct pawl_pool *pool;
    pthread_t thread;
    int index;
    int started;
    uint32_t tick;
    uint64_t rng;
    /* The pass-on rule (see worth_waking in pool_worker.c), all private to the worker: its estimate
     * of the time one task takes, the span being measured for it, and when it last kept queued work
     * to itself (0: it holds none it chose not to share). */
    int64_t cost;
    int64_t span_t0;
    uint32_t span_n;
    int64_t kept_since;
    int64_t kept_size;
    uint32_t kept_n;
    /* Counters written only by this worker (relaxed atomic stores), read by pawl_pool_stats. */
    uint64_t executed;
    uint64_t steals;
    uint64_t injected;
    uint64_t parks;
    uint64_t kept;
} __attribute__((aligned(PAWL_CACHELINE)));

/*
 * An outside thread's own ring of single tasks for one pool (see spsc_push_sp in pool_submit.c for
 * the protocol). It belongs to the pool (registered in pool->spsc, taken from only under the
 * consumer role, drained and freed by pawl_pool_free) and is lent to one thread at a time (owned).
 * A thread that exits while its ring still holds tasks gives it back to the pool (see spsc_let_go);
 * a thread whose ring's pool was freed never touches the ring again. Lines by writer: ck_ring's own
 * three (the consumer's c_head, the producer's p_tail, and size and mask, which nothing writes
 * after registration; owned and raw share that one, written only on a hand-over), the producer's
 * private one (done), then the slots.
 */
struct spsc_ring {
    ck_ring_t ck;   /* SPSC_SIZE slots; see ckring.h for who may call what */
    uint32_t owned; /* 1 while a thread submits through it; 0: free for another thread to adopt */
    void *raw;      /* what to free */
    /* A line only the owner writes while the pool runs: done is stored after the fence, and on
     * p_tail's line, which the workers keep reading, that store would miss and hold up the next
     * submission's fence. */
    _Alignas(PAWL_CACHELINE) unsigned done; /* p_tail whose wake-up check has finished (read by
                                               pawl_pool_free) */
    _Alignas(PAWL_CACHELINE) ck_ring_buffer_t slot[SPSC_SIZE];
};
_Static_assert((SPSC_SIZE & (SPSC_SIZE - 1)) == 0, "a producer ring's size is a power of two");

/*
 * Cache lines by who writes them, so that each writer keeps its line: the injection count
 * (written by submitters, polled by idle workers), the consumer role's lock and count of tasks
 * taken, the parking words, and the fields every worker reads on every search (nworkers,
 * workers), which nothing writes after start. The tasks queued on the injection queue are at
 * most inject_in - inject_out: counted in before the push, out after the pop. Two counters rather
 * than one that both sides write: a submission then leaves the line the consumer writes alone.
 * The ring's tail (reserved by submitters) and head (taken by the consumer) are the same pair for
 * the ring, on the same two lines' pattern.
 */
struct pawl_pool {            /* NOLINT(clang-analyzer-optin.performance.Padding): by writer */
    struct pawl_mpsc_ inject; /* tasks from outside (and yields); cache-line padded inside */
    int64_t inject_in;        /* tasks ever counted in by submitters (before their push) */
    char pad0[PAWL_CACHELINE - sizeof(int64_t)];
    int64_t inject_out;   /* tasks ever taken out (after the pop); by the consumer role only */
    int64_t ring_head;    /* next ring slot to take; by the consumer role only */
    uint32_t inject_lock; /* 1 while a worker holds the consumer role of inject and the ring */
    uint32_t list_turn;   /* consumer role only: takes since the list last went first */
    uint32_t spsc_next;   /* consumer role only: the producer ring to look at first */
    char pad1[PAWL_CACHELINE - 2 * sizeof(int64_t) - 3 * sizeof(uint32_t)];
    int64_t ring_tail; /* next ring slot to reserve; advanced by submitters' CAS */
    char pad3[PAWL_CACHELINE - sizeof(int64_t)];
    uint32_t epoch;   /* futex word of the eventcount */
    int32_t sleepers; /* workers between "announce" and "wake" in park() */
    uint32_t waking;  /* 1 while a wake-up is on its way (at most one at a time) */
    uint32_t stop;    /* set once by pawl_pool_free */
    int32_t blocked;  /* sleepers past their re-check, in or entering futex_wait (see wake_one) */
    uint64_t wakeups; /* futex wake-ups issued (statistics; written only when waking) */
    char pad2[PAWL_CACHELINE - 5 * sizeof(uint32_t) - sizeof(uint64_t)];
    int nworkers;
    uint32_t asym;           /* 1: own-deque pushes skip their fence, park() membarriers */
    uint64_t id;             /* unique in the process, never 0 (see ring_seen) */
    struct pawl_task **ring; /* RING_SIZE slots, tagged with their lap (see ring_push_mp) */
    void *ring_raw;          /* what to free for ring */
    struct worker *workers;
    void *workers_raw;  /* what to free for workers (see calloc_lines) */
    void *raw;          /* what to free for the pool itself */
    uint64_t cancelled; /* written only by pawl_pool_free */
    uint32_t nspsc;     /* producer rings registered (release: spsc[0..nspsc) are set) */
    struct spsc_ring *spsc[SPSC_MAX];        /* written under spsc_lock, before nspsc covers them */
    pthread_mutex_t spsc_lock;               /* registration of producer rings (once per thread) */
    struct pawl_pool *live_prev, *live_next; /* the list of live pools, under live_lock */
} __attribute__((aligned(PAWL_CACHELINE)));

/* The worker the calling thread is (of whichever pool), or NULL; set by pawl__pool_worker_main. */
extern _Thread_local struct worker *pawl__pool_tls_worker;

/*
 * size zeroed bytes at a cache-line boundary, as the padding above and in struct worker assumes
 * (the allocator hooks promise only malloc's alignment); *raw is what to pass to pawl_free.
 */
static inline void *calloc_lines(size_t size, void **raw)
{
    char *p = pawl_calloc(1, size + PAWL_CACHELINE - 1);
    *raw = p;
    if (p == NULL)
        return NULL;
    return p + (-(uintptr_t)p & (PAWL_CACHELINE - 1));
}

/*
 * The injection ring's slots (see ring_push_mp in pool_submit.c for the protocol): slot i holds
 * its task with lap(i) in the low bit of its address.
 */
_Static_assert(_Alignof(struct pawl_task) >= 2, "the ring keeps a lap bit in a task's address");
_Static_assert((RING_SIZE & (RING_SIZE - 1)) == 0, "the ring's size is a power of two");

/* lap(i): the low bit that slot i's value carries in this lap (see above). */
static inline uintptr_t ring_lap(int64_t i)
{
    return (uintptr_t)((i & RING_SIZE) != 0);
}

/* Slot i's value for task x: x with lap(i) in its low bit. */
static inline struct pawl_task *ring_tag(struct pawl_task *x, int64_t i)
{
    return (struct pawl_task *)((uintptr_t)x | ring_lap(i)); /* NOLINT(performance-no-int-to-ptr) */
}

/*
 * The submitter's half of the parking hand-shake (wake_one, notify) and the list push
 * (inject_chain, inject_push), for pool_submit.c and pool_worker.c. Plain static functions, not
 * static inline: GCC then inlines each caller's fast path (the load of sleepers) and keeps the
 * rare futex wake-up out of line, as it did when the pool was one file, where `inline` would make
 * it copy the whole of wake_one into every caller. Marked unused for pool.c, which calls none.
 */

/*
 * Wake one parked worker if there is one and no wake-up is already on its way. Called after
 * publishing work. Skipping the wake-up while `waking` is set loses nothing: the worker it
 * announces clears the flag on its way out of park() and then searches every queue (after a
 * fence), so it finds the work we published before reading the flag; finding work, it wakes the
 * next worker if more is left and worth it, and otherwise runs it itself (worth_waking). This
 * keeps a burst of submissions from issuing one futex call each while the first woken worker is
 * still being scheduled.
 */
static __attribute__((unused)) void wake_one(struct pawl_pool *pool)
{
    /* Seq_cst load of sleepers: after the caller's seq_cst fence (notify) or seq_cst
     * read-modify-write that published the work (inject_chain), the submitter half of the
     * Dekker pattern with park(). Relaxed for waking: the exchange decides who wakes. */
    if (atomic_load_explicit(PAWL_ATOMIC_OF(&pool->sleepers), memory_order_seq_cst) > 0 &&
        atomic_load_explicit(PAWL_ATOMIC_OF(&pool->waking), memory_order_relaxed) == 0 &&
        atomic_exchange_explicit(PAWL_ATOMIC_OF(&pool->waking), 1, memory_order_acq_rel) == 0) {
        /* Seq_cst: a worker that sees the new epoch also sees the task, and the bump comes
         * before our read of `blocked` (a second Dekker pair, with park()'s increment of
         * `blocked` before its futex_wait). A sleeper that has not re-checked yet needs
         * nothing more: its re-check finds the task, or its futex_wait finds the new epoch and
         * returns at once. Only a worker counted in `blocked` may be asleep in the kernel, so
         * the futex call is made only then. Without this test, every submission made while a
         * worker was between its announcement and its wait (which includes park()'s
         * membarrier, a few microseconds) made a futex call that woke nobody: 40-60 calls per
         * 2000 futures completed from an outside thread, in the slow runs of bench_runtime's
         * future throughput shape. */
        atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&pool->epoch), 1, memory_order_seq_cst);
        if (atomic_load_explicit(PAWL_ATOMIC_OF(&pool->blocked), memory_order_seq_cst) > 0) {
            /* Relaxed: statistics. */
            atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&pool->wakeups), 1, memory_order_relaxed);
            if (pawl__futex_wake(&pool->epoch, 1) > 0)
                return; /* the woken worker clears `waking` on its way out of park() */
        }
        /* Nobody was asleep in the kernel: no worker will leave park() to clear the flag on
         * our behalf (a sleeper still on its way in sees the new epoch and leaves at once,
         * clearing it too). Clear it ourselves so later submitters can wake. */
        atomic_store_explicit(PAWL_ATOMIC_OF(&pool->waking), 0, memory_order_release);
    }
}

static __attribute__((unused)) void notify(struct pawl_pool *pool)
{
    /* Seq_cst fence: orders the publication of the task before the reads of sleepers and
     * waking (the submitter half of the Dekker pattern with park()). */
    pawl_fence_seq_cst();
    wake_one(pool);
}

/*
 * Queue the pre-linked chain first .. last of n tasks on the injection queue and wake: count,
 * wake, push, in that order. The push is the submitter's last access to the pool, so that
 * pawl_pool_free, which frees the pool only once it has taken out every task counted in, cannot
 * free it under a submitter still inside: it reaches our tasks only through the link that the
 * push stores last (release; its pop acquires), so everything we did to the pool happens before
 * the free. (Waking before the push costs nothing: a worker woken early sees the count, finds
 * the queue empty for the few instructions until the push, and keeps searching.)
 */
static __attribute__((unused)) void inject_chain(struct pawl_pool *pool, struct pawl_task *first,
                                                 struct pawl_task *last, int64_t n)
{
    /* Count before pushing, so the count never falls below what is queued (a consumer may pop
     * a task as soon as it is linked): one add for the whole chain. (The count, not the
     * queue's head, is what parking workers check: a consumer re-pushing the stub can leave
     * the head at the stub while a producer's node is still being linked in front of it.)
     * Seq_cst: this add is the publication parking workers look for, and as a seq_cst
     * read-modify-write it is ordered before wake_one()'s seq_cst load of sleepers, so no
     * separate fence is needed (on x86 the locked add is the fence). A worker that sees the
     * count before the node is linked finds the queue busy and keeps searching: has_work()
     * keeps it from sleeping. */
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&pool->inject_in), n, memory_order_seq_cst);
    /* One wake-up however many tasks: the worker it wakes takes a share of them and, if more
     * are left, wakes the next (take_injected). Waking two at once would be no faster and
     * worse: the first to leave park() clears `waking` while the second may not have run yet,
     * and every submission until then would issue a futex call that wakes nobody. */
    wake_one(pool);
    pawl__mpsc_push_chain_mp(&pool->inject, &first->_next, &last->_next);
}

static __attribute__((unused)) void inject_push(struct pawl_pool *pool, struct pawl_task *t)
{
    inject_chain(pool, t, t, 1);
}

/* pool_worker.c: calibrate the pass-on rule's clock, once per process, before any worker runs. */
void pawl__pool_clock_init(void);
/* pool_worker.c: set up worker w, index `index` of pool, with an empty deque of deque_capacity
 * slots (before its thread starts); 0 or a PAWL_E* code (its deque could not be allocated). */
int pawl__pool_worker_init(struct worker *w, struct pawl_pool *pool, int index,
                           int64_t deque_capacity);
/* pool_worker.c: a worker thread's body (arg: its struct worker), until the pool stops. */
void *pawl__pool_worker_main(void *arg);
/* pool_worker.c, consumer role only (a worker holding inject_lock, or pawl_pool_free once the
 * workers are joined): take up to want tasks, oldest first, from the injection ring, or from the
 * producer rings. */
int64_t pawl__pool_ring_take_sc(struct pawl_pool *pool, struct pawl_task **out, int64_t want);
int64_t pawl__pool_spsc_take_any(struct pawl_pool *pool, struct pawl_task **out, int64_t want);

/* pool_submit.c: link pool into, or unlink it from, the process's list of live pools (which a
 * thread giving its producer ring back consults). Any thread; once each per pool. */
void pawl__pool_live_add(struct pawl_pool *pool);
void pawl__pool_live_remove(struct pawl_pool *pool);
/* pool_submit.c, for pawl_pool_free once the workers are joined: is a submitter still
 * publishing on one of the producer rings, or checking for sleepers after doing so? */
bool pawl__pool_spsc_in_flight(struct pawl_pool *pool);

#endif
