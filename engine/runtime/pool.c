/*
 * pool.c — the work-stealing pool.
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
 */
#include "pool.h"

#include "ckring.h"
#include "common.h"
#include "deque.h"
#include "futex.h"
#include "mpsc.h"

#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MAX_WORKERS 1024
#define INJECT_BATCH 32
#ifndef PAWL_POOL_RING
#define PAWL_POOL_RING 16384 /* slots of the injection ring (a power of two; -D for tests) */
#endif
#define RING_SIZE PAWL_POOL_RING
#define LIST_TURN 4 /* the consumer looks at the list first on every LIST_TURN-th take */
#ifndef PAWL_POOL_SPSC
/* Slots of an outside thread's own ring (a power of two; it holds one task fewer): as many as the
 * shared ring, since a full ring sends each further submission to the list (1024 slots cost a
 * fifth of the single-task submit_run/inject throughput, where the submitter runs ahead of the
 * workers by thousands of tasks). 128 KiB per outside thread and pool. */
#define PAWL_POOL_SPSC 16384
#endif
#define SPSC_SIZE PAWL_POOL_SPSC
#define SPSC_MAX 16 /* producer rings per pool; more outside threads share the list */
#define SPSC_TLS 4  /* pools a thread keeps its rings of at hand (more: see spsc_mine) */
#define STEAL_BATCH 32
#define SPIN_ROUNDS 64
#define YIELD_ROUNDS 8
/* Work worth waking a parked worker for: about what the wake-up costs before the helper runs
 * (the futex call, the wakee's scheduling, its search), in nanoseconds of tasks. */
#define PASS_ON_NS 50000
/* Tasks per sample of a worker's time per task while it stays busy; while it keeps work, it
 * reads the clock after the first task and then after every KEPT_CLOCK-th (a clock read costs
 * about as much as a short task: reading it after each one cost a fifth of the time of a burst
 * of empty tasks). */
#define COST_SAMPLE 64
#define KEPT_CLOCK 4

/*
 * The pass-on rule's clock: the time-stamp counter where there is one (a read costs a third of
 * the vDSO's clock_gettime here, which cost a tenth of the time of a burst of empty tasks even
 * when read every fourth task), calibrated once per process against CLOCK_MONOTONIC; elsewhere
 * CLOCK_MONOTONIC itself. Only durations of tens of microseconds are compared, so a coarse
 * calibration (200 µs) is plenty; a counter that looks wrong (out of 0.01..100 ticks per ns)
 * falls back to the monotonic clock. pass_on_ticks is PASS_ON_NS in the clock's ticks; both are
 * written once under pthread_once, before any pool starts its workers.
 */
static int64_t pass_on_ticks = PASS_ON_NS;
static int use_tsc;
static pthread_once_t clock_once = PTHREAD_ONCE_INIT;

static void clock_calibrate(void)
{
#if defined(__x86_64__)
    int64_t t0 = pawl_now_ns(), t1;
    uint64_t c0 = __rdtsc();
    do
        t1 = pawl_now_ns();
    while (t1 - t0 < 200000);
    double per_ns = (double)(__rdtsc() - c0) / (double)(t1 - t0);
    if (per_ns > 0.01 && per_ns < 100) {
        use_tsc = 1;
        pass_on_ticks = (int64_t)(PASS_ON_NS * per_ns);
    }
#endif
}

static inline int64_t ticks(void)
{
#if defined(__x86_64__)
    if (use_tsc)
        return (int64_t)__rdtsc();
#endif
    return pawl_now_ns();
}

struct worker {
    struct pawl_deque dq;
    struct pawl_pool *pool;
    pthread_t thread;
    int index;
    int started;
    uint32_t tick;
    uint64_t rng;
    /* The pass-on rule (see worth_waking), all private to the worker: its estimate of the time
     * one task takes, the span being measured for it, and when it last kept queued work to
     * itself (0: it holds none it chose not to share). */
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
 * An outside thread's own ring of single tasks for one pool (see spsc_push_sp for the protocol). It
 * belongs to the pool (registered in pool->spsc, taken from only under the consumer role, drained
 * and freed by pawl_pool_free) and is lent to one thread at a time (owned). A thread that exits
 * while its ring still holds tasks gives it back to the pool (see spsc_let_go); a thread whose
 * ring's pool was freed never touches the ring again. Lines by writer: ck_ring's own three (the
 * consumer's c_head, the producer's p_tail, and size and mask, which nothing writes after
 * registration; owned and raw share that one, written only on a hand-over), the producer's
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

/*
 * size zeroed bytes at a cache-line boundary, as the padding above and in struct worker assumes
 * (the allocator hooks promise only malloc's alignment); *raw is what to pass to pawl_free.
 */
static void *calloc_lines(size_t size, void **raw)
{
    char *p = pawl_calloc(1, size + PAWL_CACHELINE - 1);
    *raw = p;
    if (p == NULL)
        return NULL;
    return p + (-(uintptr_t)p & (PAWL_CACHELINE - 1));
}

/* max(n, 0), evaluating n once (PAWL_MAX would read the racing counters twice). */
static inline int64_t nonneg(int64_t n)
{
    return n > 0 ? n : 0;
}

/* Tasks queued on the producer rings (an upper bound, read as injected_estimate explains). */
static inline int64_t spsc_estimate(struct pawl_pool *pool)
{
    /* Acquire: spsc[0..n) were stored before nspsc was published. */
    uint32_t n = atomic_load_explicit(PAWL_ATOMIC_OF(&pool->nspsc), memory_order_acquire);
    int64_t sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        /* ck_pr loads, head first (head only grows, so the count can only be larger); ordered by
         * the caller's fence where it matters (park), a hint elsewhere. */
        sum += pawl_ckring_count(&pool->spsc[i]->ck);
    }
    return sum;
}

/*
 * An upper bound of the tasks on the injection queue (<= 0: none). Out is read first (acquire,
 * so the read of in comes after it): out only grows, so an older out can only make the result
 * larger, never hide a task. Callers that decide to sleep on it fence (seq_cst) before calling.
 */
static inline int64_t injected_estimate(struct pawl_pool *pool)
{
    /* Acquire: orders the loads of inject_in and ring_tail after these (see above; the ring's
     * head and tail are the same pair of counters). */
    int64_t out = atomic_load_explicit(PAWL_ATOMIC_OF(&pool->inject_out), memory_order_acquire);
    int64_t head = atomic_load_explicit(PAWL_ATOMIC_OF(&pool->ring_head), memory_order_acquire);
    /* Relaxed: ordered by the caller's fence where it matters (park), a hint elsewhere. */
    return atomic_load_explicit(PAWL_ATOMIC_OF(&pool->inject_in), memory_order_relaxed) - out +
           atomic_load_explicit(PAWL_ATOMIC_OF(&pool->ring_tail), memory_order_relaxed) - head +
           spsc_estimate(pool);
}

static _Thread_local struct worker *tls_worker;

#ifdef PAWL_TSAN_FENCES
unsigned long pawl__fence_word;
#endif

void pawl_pool_opts_defaults(struct pawl_pool_opts *opts)
{
    memset(opts, 0, sizeof(*opts));
}

int pawl_pool_current_worker(void)
{
    return tls_worker ? tls_worker->index : -1;
}

struct pawl_pool *pawl__pool_current(void)
{
    return tls_worker ? tls_worker->pool : NULL;
}

int pawl_pool_workers(const struct pawl_pool *pool)
{
    return pool->nworkers;
}

static inline void count(uint64_t *c) /* NOLINT(readability-non-const-parameter): written */
{
    /* Relaxed: a statistics counter with a single writer; readers want an approximate value. */
    atomic_store_explicit(PAWL_ATOMIC_OF(c), *c + 1, memory_order_relaxed);
}

/*
 * The pass-on rule. Waking a parked worker whenever more work is seen cascades: the woken
 * worker wakes the next, and a burst of a few short tasks wakes every worker of the pool, each
 * wake-up a futex call, a context switch and a search that finds nothing left, on the CPUs the
 * rest of the process and the server need (docs/runtime.md has the latencies this cost). So a
 * worker passes the wake-up on only when the work it sees left is worth it: left tasks times
 * its running estimate of the time per task at least PASS_ON_NS.
 * Otherwise it keeps the work (it takes a whole small injected batch rather than its share) and
 * runs it itself.
 *
 * Nothing is lost by keeping: the tasks are in our own deque (we pop them next) or on the
 * injection queue (we look there once our deque is empty), and a worker that is awake still
 * steals them. What keeping risks is waiting: behind a task slower than the estimate, or behind
 * tasks that make more tasks (a count of queued tasks does not show those). So while it holds
 * kept work the worker looks after each task: once its deque is empty the keeping ends; if the
 * deque did not shrink (the tasks are making more) or the kept work has waited PASS_ON_NS (the
 * clock is read after the first kept task and every KEPT_CLOCK-th), it wakes a helper after all.
 * Only the task running at that moment can delay the rest longer, and tasks that are about to block
 * say so (pawl_pool_will_block), which shares the work at once. The estimate starts at PASS_ON_NS
 * (any work left is worth a helper: the eager rule) and follows measured spans with a weight of
 * 1/4, so it learns within a few bursts; a span is a run of tasks between parks, sampled every
 * COST_SAMPLE tasks while the worker stays busy, so the clock is read twice per span (and every few
 * tasks while work is kept). Slow tasks make the estimate large and the rule eager again.
 */
static int worth_waking(const struct worker *w, int64_t left)
{
    /* At most 1e6 tasks' worth is looked at, so the product cannot overflow. */
    return left > 0 && PAWL_MIN(left, (int64_t)1000000) * w->cost >= pass_on_ticks;
}

static void cost_sample(struct worker *w, int64_t now)
{
    if (w->span_n == 0)
        return;
    int64_t per = (now - w->span_t0) / (int64_t)w->span_n;
    per = PAWL_MIN(PAWL_MAX(per, 1), pass_on_ticks * 20000); /* at most about a second */
    w->cost += (per - w->cost) / 4;
    w->span_n = 0;
    w->span_t0 = now;
}

/* We hold work we did not share: remember since when (see the rule above). */
static void keep(struct worker *w)
{
    if (w->kept_since == 0) {
        w->kept_since = ticks();
        w->kept_n = 0;
        count(&w->kept);
    }
    /* What we hold: the deque and the task in hand, which we are about to run. After each
     * task the deque must be smaller than at the last look, or the tasks are making tasks. */
    w->kept_size = pawl__deque_size(&w->dq) + 1;
}

/*
 * Wake one parked worker if there is one and no wake-up is already on its way. Called after
 * publishing work. Skipping the wake-up while `waking` is set loses nothing: the worker it
 * announces clears the flag on its way out of park() and then searches every queue (after a
 * fence), so it finds the work we published before reading the flag; finding work, it wakes the
 * next worker if more is left and worth it, and otherwise runs it itself (worth_waking). This
 * keeps a burst of submissions from issuing one futex call each while the first woken worker is
 * still being scheduled.
 */
static void wake_one(struct pawl_pool *pool)
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

static void notify(struct pawl_pool *pool)
{
    /* Seq_cst fence: orders the publication of the task before the reads of sleepers and
     * waking (the submitter half of the Dekker pattern with park()). */
    pawl_fence_seq_cst();
    wake_one(pool);
}

/*
 * A worker has pushed onto its own deque. The full check (notify: a fence, then the read of
 * sleepers) is dear on this path: the fence waits for the push's stores, and thieves keep reading
 * the deque's bottom, so the store of bottom misses on a line another core holds (most of
 * submit's time in a fan-out). Where the pool registered for membarrier(2)
 * (pool->asym), the fence moves to the rare side of the hand-shake: a worker that parks while
 * another worker may be running issues MEMBARRIER_CMD_PRIVATE_EXPEDITED after announcing itself,
 * which makes every running thread of the process pass a full barrier before the parker
 * re-checks the queues. So either our push came before that barrier in our program order, and
 * the re-check sees it, or our read of sleepers came after it, and sees the sleeper (whose
 * increment preceded the membarrier call). Only the compiler must keep the store before the load.
 * Without membarrier (an old kernel, a seccomp profile that refuses it) we fence as every other
 * submitter does.
 *
 * (Skipping the fence when nothing is on the parking side loses wake-ups: a
 * worker announcing its sleep at the instant of our push re-checks without seeing it and sleeps,
 * and the child waits for as long as our task runs: for ever, if our task waits for the child;
 * test_busy_parent_child_taken.)
 */
static void notify_own(struct worker *w)
{
    struct pawl_pool *pool = w->pool;
    /* Relaxed: written once, before the workers start (pawl_pool_new). */
    if (!atomic_load_explicit(PAWL_ATOMIC_OF(&pool->asym), memory_order_relaxed)) {
        notify(pool);
        return;
    }
    /* Compiler barrier only: the push's stores stay before the load below in program order;
     * park()'s membarrier supplies the hardware barrier when it matters (see above). */
    atomic_signal_fence(memory_order_seq_cst);
    /* Relaxed: ordered against park() by its membarrier, as explained above. */
    if (atomic_load_explicit(PAWL_ATOMIC_OF(&pool->sleepers), memory_order_relaxed) > 0)
        wake_one(pool);
}

/* The pass-on rule applied by a worker that sees `left` tasks besides the one it is about to run:
 * wake a helper if they are worth it, else keep them (see worth_waking). */
static void pass_on(struct worker *w, int64_t left)
{
    if (worth_waking(w, left))
        notify(w->pool);
    else if (left > 0)
        keep(w);
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
static void inject_chain(struct pawl_pool *pool, struct pawl_task *first, struct pawl_task *last,
                         int64_t n)
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

static void inject_push(struct pawl_pool *pool, struct pawl_task *t)
{
    inject_chain(pool, t, t, 1);
}

/*
 * The injection ring: RING_SIZE task pointers, reserved by submitters with one CAS on ring_tail
 * and taken in order by the consumer role (ring_head). It carries outside batches while it has
 * room; the linked queue above takes what does not fit, and single tasks. For a batch it saves
 * the submitter a write to every task (the links) and the consumer a dependent cache miss per
 * task: it reads pointers from consecutive slots (eight per line) instead of following a link
 * stored in each task (batches of 64 from outside: about +40% in alternating runs). Single
 * tasks measured no better or worse through it (one submission at a time, the consumer keeps
 * pace and each submission moves the tail's and a slot's line, as the list moves the count's
 * and a link's), so they stay on the list. The slot protocol:
 *   - slot i holds the task of index i with lap(i) = (i / RING_SIZE) & 1 in its low bit (a task
 *     is at least 8-byte aligned), so the consumer tells a task written this lap from the one
 *     left there a lap ago (or the NULL of a slot never used) without anyone clearing slots: the
 *     consumer only reads them, and a submitter's next store to the line does not have to take
 *     it back from the consumer's write. A submitter reserves slots [t, t + n) only if
 *     t + n - head <= RING_SIZE for a head it read with acquire: the consumer read every slot
 *     below head before publishing head (release), so the reserved slots are free and no one
 *     else writes them. head only grows, so an old head only makes the check stricter.
 *   - the submitter then wakes (the CAS, a seq_cst read-modify-write, is the publication that
 *     parking workers look for, as the add to inject_in is for the list) and stores the
 *     pointers (release), its last access to the pool: pawl_pool_free frees only after taking
 *     every reserved slot, which it can only do once the pointer is there.
 *   - the consumer reads a slot with acquire (the task's fields are visible) and publishes its
 *     new head with release. A reserved slot that still holds last lap's value (its submitter is
 *     between the CAS and the store) stops the consumer there; the count still says work is
 *     queued, so no worker parks on it.
 * Order: the ring and the list are each FIFO; between them a task may overtake another, which
 * the pool never promised. The consumer looks at the list first every LIST_TURN-th time, so a
 * busy ring cannot starve it.
 */
/* A head of the pool with that id this thread read (acquire): a lower bound of its head, which
 * spares a submission the read of the consumer's line while the ring has room. By id, not
 * address: a new pool may be allocated where a freed one was. */
static _Thread_local struct {
    uint64_t id;
    int64_t head;
} ring_seen;
static uint64_t pool_ids; /* the last id given to a pool */

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

static bool ring_push_mp(struct pawl_pool *pool, struct pawl_task *const *ts, int64_t n)
{
    /* Relaxed: a first guess; the CAS validates it. */
    int64_t t = atomic_load_explicit(PAWL_ATOMIC_OF(&pool->ring_tail), memory_order_relaxed);
    for (;;) {
        int64_t h = ring_seen.id == pool->id ? ring_seen.head : INT64_MIN / 2;
        if (t + n - h > RING_SIZE) {
            /* Acquire: the consumer's reads of the slots below head are done (see above). */
            h = atomic_load_explicit(PAWL_ATOMIC_OF(&pool->ring_head), memory_order_acquire);
            ring_seen.id = pool->id;
            ring_seen.head = h;
            if (t + n - h > RING_SIZE)
                return false;
        }
        /* Seq_cst: the publication, ordered before wake_one()'s load of sleepers. On failure t
         * is the current tail; the room is checked again. */
        if (atomic_compare_exchange_weak_explicit(PAWL_ATOMIC_OF(&pool->ring_tail), &t, t + n,
                                                  memory_order_seq_cst, memory_order_relaxed))
            break;
    }
    wake_one(pool);
    for (int64_t i = 0; i < n; i++) {
        /* Release: the consumer that reads the pointer (acquire) sees the task's fields. */
        atomic_store_explicit(PAWL_ATOMIC_OF(&pool->ring[(t + i) & (RING_SIZE - 1)]),
                              ring_tag(ts[i], t + i), memory_order_release);
    }
    return true;
}

/* Consumer role only: take up to want tasks from the ring, oldest first. */
static int64_t ring_take_sc(struct pawl_pool *pool, struct pawl_task **out, int64_t want)
{
    /* Consumer role only: a worker holding inject_lock, or the freeing thread once stop is set
     * and the workers are joined. Relaxed: a check of our own state. */
    PAWL_ASSERT(atomic_load_explicit(PAWL_ATOMIC_OF(&pool->inject_lock), memory_order_relaxed) ==
                    1 ||
                atomic_load_explicit(PAWL_ATOMIC_OF(&pool->stop), memory_order_relaxed));
    /* Relaxed: written only under the consumer role, whose acquisition acquired it. */
    int64_t h = atomic_load_explicit(PAWL_ATOMIC_OF(&pool->ring_head), memory_order_relaxed);
    /* Acquire: a hint of how far to look; the slots themselves say what is there. */
    int64_t avail =
        atomic_load_explicit(PAWL_ATOMIC_OF(&pool->ring_tail), memory_order_acquire) - h;
    int64_t got = 0;
    while (got < want && got < avail) {
        int64_t i = h + got;
        /* Acquire: pairs with the submitter's release store of the pointer. */
        struct pawl_task *x = atomic_load_explicit(PAWL_ATOMIC_OF(&pool->ring[i & (RING_SIZE - 1)]),
                                                   memory_order_acquire);
        if (((uintptr_t)x & 1) != ring_lap(i) || ((uintptr_t)x & ~(uintptr_t)1) == 0)
            break; /* reserved, not written yet: last lap's value, or never used */
        /* NOLINTBEGIN(performance-no-int-to-ptr) */
        out[got++] = (struct pawl_task *)((uintptr_t)x & ~(uintptr_t)1);
        /* NOLINTEND(performance-no-int-to-ptr) */
    }
    /* Release: submitters that read the new head (acquire) may reuse the slots we read. */
    if (got > 0)
        atomic_store_explicit(PAWL_ATOMIC_OF(&pool->ring_head), h + got, memory_order_release);
    return got;
}

/* Queue tasks from outside the pool (or a deque that cannot take them): the ring if they fit,
 * else one chain on the list. */
static void inject_tasks(struct pawl_pool *pool, struct pawl_task *const *ts, int64_t n)
{
    if (ring_push_mp(pool, ts, n))
        return;
    for (int64_t i = 0; i + 1 < n; i++) {
        /* Relaxed: the chain is published by pawl__mpsc_push_chain_mp's release operations. */
        atomic_store_explicit(PAWL_ATOMIC_OF(&ts[i]->_next), (void *)&ts[i + 1]->_next,
                              memory_order_relaxed);
    }
    inject_chain(pool, ts[0], ts[n - 1], n);
}

/*
 * Producer rings: each thread outside the pool that submits single tasks gets a ring of its own
 * (registered with the pool on its first submission), so that a submission writes only lines of
 * its own and the consumer reads task pointers from consecutive slots, up to INJECT_BATCH at
 * once, prefetching the tasks, instead of following one link per task through the list (each a
 * miss on a line the submitter just wrote, one after the other). The ring is ConcurrencyKit's
 * ck_ring (through ckring.h, which tells ThreadSanitizer about its hand-off). The protocol:
 *   - the owning thread pushes with ck_ring_enqueue_spsc: it writes the slot, then p_tail after
 *     a store fence; no read-modify-write. It reads the consumer's c_head on each push (the full
 *     check) and writes a slot only after the consumer stored a c_head past it.
 *   - then a seq_cst fence and wake_one(): the submitter half of the Dekker pattern with park(),
 *     whose re-check reads every ring's p_tail (spsc_estimate). The fence is what the seq_cst
 *     read-modify-write on inject_in gave the list's submitters.
 *   - then a release store of done = p_tail, the submitter's last access to the pool's state:
 *     pawl_pool_free waits until done == p_tail on every ring, so it cannot free the pool under
 *     a submitter still checking for sleepers.
 *   - the consumer role pops with ck_ring_dequeue_spsc: it reads p_tail, then (after a load
 *     fence) the slot, then stores c_head after a store fence.
 * A full ring, or no ring (the registry is full, or this thread cannot register a thread-exit
 * hook), sends the task to the list. The ring is the pool's (drained and freed by pawl_pool_free)
 * and lent to the thread: a thread that exits (or keeps rings of more than SPSC_TLS pools) gives
 * its ring back if the pool is still alive (owned = 0, release: its pushes happen before) and
 * another outside thread adopts it with whatever it still holds.
 * FIFO holds per ring, as on the list; a task that takes the list may overtake one on a ring.
 */
static _Thread_local struct spsc_tls {
    struct {
        struct pawl_pool *pool; /* compared by address and id: a freed pool's address is reused */
        uint64_t id;
        struct spsc_ring *ring; /* NULL: no ring for this pool (registry full); use the list */
    } e[SPSC_TLS];
    uint32_t evict; /* the entry to give up next when all are used */
    int keyed;      /* the thread-exit hook is registered */
} spsc_tls;
static pthread_key_t spsc_key;
static int spsc_key_ok;
static pthread_once_t spsc_key_once = PTHREAD_ONCE_INIT;

/*
 * The pools alive in the process, so that a thread giving its ring back (at exit, when the pool
 * may already be gone) touches the ring only while its pool is alive: pawl_pool_free unlinks the
 * pool under the same lock before it frees the rings. Taken once per thread and pool at most.
 */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pawl_pool *live_pools;

/* The owning thread gives its ring r of the pool at that address and with that id back, if the
 * pool is still alive: another thread may adopt it (see spsc_register). */
static void spsc_let_go(struct pawl_pool *pool, uint64_t id, struct spsc_ring *r)
{
    pthread_mutex_lock(&live_lock);
    for (struct pawl_pool *p = live_pools; p != NULL; p = p->live_next) {
        if (p == pool && p->id == id) {
            /* Release: our slots, p_tail and done happen before the adopter's acquire. */
            atomic_store_explicit(PAWL_ATOMIC_OF(&r->owned), 0, memory_order_release);
            break;
        }
    }
    pthread_mutex_unlock(&live_lock);
}

/* Thread exit: give back every ring this thread holds. */
static void spsc_thread_exit(void *arg)
{
    struct spsc_tls *tls = arg;
    for (int i = 0; i < SPSC_TLS; i++) {
        if (tls->e[i].ring != NULL)
            spsc_let_go(tls->e[i].pool, tls->e[i].id, tls->e[i].ring);
        tls->e[i].pool = NULL;
        tls->e[i].ring = NULL;
    }
    /* Another key's destructor may still submit: register the hook again then (glibc runs the
     * destructors of values set meanwhile once more). */
    tls->keyed = 0;
}

static void spsc_key_create(void)
{
    spsc_key_ok = pthread_key_create(&spsc_key, spsc_thread_exit) == 0;
}

/* Registration, once per thread and pool: adopt a ring given back, or add one; NULL if the
 * registry is full or memory is short (the list takes the tasks). Under spsc_lock. */
static struct spsc_ring *spsc_register(struct pawl_pool *pool)
{
    struct spsc_ring *r = NULL;
    pthread_mutex_lock(&pool->spsc_lock);
    uint32_t n = pool->nspsc; /* only written under the lock */
    for (uint32_t i = 0; i < n && r == NULL; i++) {
        /* Acquire: pairs with spsc_let_go; the former owner's producer state is ours now. */
        if (atomic_load_explicit(PAWL_ATOMIC_OF(&pool->spsc[i]->owned), memory_order_acquire) ==
            0) {
            r = pool->spsc[i];
            /* Relaxed: adopters are serialised by the lock. */
            atomic_store_explicit(PAWL_ATOMIC_OF(&r->owned), 1, memory_order_relaxed);
        }
    }
    if (r == NULL && n < SPSC_MAX) {
        void *raw;
        r = calloc_lines(sizeof(*r), &raw);
        if (r != NULL) {
            ck_ring_init(&r->ck, SPSC_SIZE);
            r->raw = raw;
            r->owned = 1;
            pool->spsc[n] = r;
            /* Release: workers that read the new count (acquire) see the ring's fields. */
            atomic_store_explicit(PAWL_ATOMIC_OF(&pool->nspsc), n + 1, memory_order_release);
        }
    }
    pthread_mutex_unlock(&pool->spsc_lock);
    return r;
}

/* The calling thread's ring for pool, registering one on first use; NULL: use the list. */
static struct spsc_ring *spsc_mine(struct pawl_pool *pool)
{
    struct spsc_tls *tls = &spsc_tls;
    for (int i = 0; i < SPSC_TLS; i++)
        if (tls->e[i].pool == pool && tls->e[i].id == pool->id)
            return tls->e[i].ring;
    if (!tls->keyed) {
        pthread_once(&spsc_key_once, spsc_key_create);
        /* Without the exit hook our ring could never be given back: stay on the list. */
        if (!spsc_key_ok || pthread_setspecific(spsc_key, tls) != 0)
            return NULL;
        tls->keyed = 1;
    }
    /* A free entry, else the next in turn (its ring is given back; its pool may be gone, and
     * if it is alive another thread, or we later, adopt the ring). */
    int slot = -1;
    for (int i = 0; i < SPSC_TLS && slot < 0; i++)
        if (tls->e[i].pool == NULL)
            slot = i;
    if (slot < 0) {
        slot = (int)(tls->evict++ % SPSC_TLS);
        if (tls->e[slot].ring != NULL)
            spsc_let_go(tls->e[slot].pool, tls->e[slot].id, tls->e[slot].ring);
    }
    tls->e[slot].pool = pool;
    tls->e[slot].id = pool->id;
    tls->e[slot].ring = spsc_register(pool);
    return tls->e[slot].ring;
}

/* The owning thread: queue t on its ring r of pool and wake a worker if one sleeps; false if
 * the ring is full (nothing done). */
static bool spsc_push_sp(struct pawl_pool *pool, struct spsc_ring *r, struct pawl_task *t)
{
    /* ck_ring's store fence orders the slot (and the task) before its store of p_tail. */
    if (!pawl_ckring_push_sp(&r->ck, r->slot, t))
        return false;
    /* Seq_cst fence: orders the p_tail store before wake_one()'s load of sleepers (the
     * submitter half of the Dekker pattern with park(), whose re-check reads our p_tail). */
    pawl_fence_seq_cst();
    wake_one(pool);
    /* Release: everything we did to the pool happens before pawl_pool_free's acquire of done.
     * Only we write p_tail, so the plain ck_pr load reads our own push. */
    atomic_store_explicit(PAWL_ATOMIC_OF(&r->done), pawl_ckring_tail(&r->ck), memory_order_release);
    return true;
}

/* Consumer role only: take up to want tasks from ring r, oldest first, prefetching each. */
static int64_t spsc_take_sc(struct spsc_ring *r, struct pawl_task **out, int64_t want)
{
    int64_t n = 0;
    void *v;
    /* Each pop stores c_head (after ck_ring's store fence), so the owner may reuse the slot. */
    while (n < want && pawl_ckring_pop_sc(&r->ck, r->slot, &v)) {
        out[n] = v;
        /* The task's line will be written when it runs (and often read sooner): start its miss
         * now, so that the misses of the batch overlap instead of queueing one behind the
         * other. */
        pawl_prefetch_w(out[n]);
        n++;
    }
    return n;
}

/* pawl_pool_free, once the workers are gone: is a submitter still publishing on (tasks not taken
 * yet) or checking for sleepers after publishing on one of the producer rings? */
static bool spsc_in_flight(struct pawl_pool *pool)
{
    /* Acquire: as in spsc_estimate. */
    uint32_t n = atomic_load_explicit(PAWL_ATOMIC_OF(&pool->nspsc), memory_order_acquire);
    for (uint32_t i = 0; i < n; i++) {
        struct spsc_ring *r = pool->spsc[i];
        /* Acquire: pairs with the release store of done; what the submitter did to the pool
         * before it happens before our free. Then p_tail and c_head (ck_pr loads; c_head is
         * ours now). */
        unsigned done = atomic_load_explicit(PAWL_ATOMIC_OF(&r->done), memory_order_acquire);
        unsigned tail = pawl_ckring_tail(&r->ck);
        if (done != tail || tail != pawl_ckring_head(&r->ck))
            return true;
    }
    return false;
}

/* Consumer role only: take up to want tasks from the producer rings, starting at a different
 * ring each time so that a busy one cannot starve the others. */
static int64_t spsc_take_any(struct pawl_pool *pool, struct pawl_task **out, int64_t want)
{
    /* Consumer role only: a worker holding inject_lock, or the freeing thread once stop is set
     * and the workers are joined. Relaxed: a check of our own state. */
    PAWL_ASSERT(atomic_load_explicit(PAWL_ATOMIC_OF(&pool->inject_lock), memory_order_relaxed) ==
                    1 ||
                atomic_load_explicit(PAWL_ATOMIC_OF(&pool->stop), memory_order_relaxed));
    /* Acquire: spsc[0..n) were stored before nspsc was published. */
    uint32_t n = atomic_load_explicit(PAWL_ATOMIC_OF(&pool->nspsc), memory_order_acquire);
    if (n == 0)
        return 0;
    uint32_t start = pool->spsc_next % n;
    pool->spsc_next = start + 1;
    int64_t got = 0;
    for (uint32_t k = 0; k < n && got < want; k++)
        got += spsc_take_sc(pool->spsc[(start + k) % n], out + got, want - got);
    return got;
}

int pawl_pool_submit(struct pawl_pool *pool, struct pawl_task *t)
{
    if (PAWL_UNLIKELY(pool == NULL || t == NULL || t->fn == NULL))
        return PAWL_EINVAL;
    struct worker *w = tls_worker;
    if (w != NULL && w->pool == pool) {
        if (pawl__deque_push_owner(&w->dq, t) == 0)
            notify_own(w);
        else
            inject_push(pool, t); /* our deque is full and cannot grow */
        return 0;
    }
    struct spsc_ring *r = spsc_mine(pool);
    if (r == NULL || !spsc_push_sp(pool, r, t))
        inject_push(pool, t); /* no ring, or it is full: the list */
    return 0;
}

int pawl_pool_submit_batch(struct pawl_pool *pool, struct pawl_task *const *tasks, size_t n)
{
    if (PAWL_UNLIKELY(pool == NULL || tasks == NULL || n == 0 || n > (size_t)INT64_MAX))
        return PAWL_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (PAWL_UNLIKELY(tasks[i] == NULL || tasks[i]->fn == NULL))
            return PAWL_EINVAL;
    struct worker *w = tls_worker;
    if (w != NULL && w->pool == pool && pawl__deque_push_n_owner(&w->dq, tasks, (int64_t)n) == 0) {
        /* One wake-up check for all of them: a worker we wake finds more left after its
         * first steal and wakes the next (worker_main, steal_any). */
        notify_own(w);
        return 0;
    }
    inject_tasks(pool, tasks, (int64_t)n);
    return 0;
}

int pawl__pool_yield(struct pawl_pool *pool, struct pawl_task *t)
{
    inject_push(pool, t);
    return 0;
}

/* Take the injection queue's consumer role and return its oldest task, moving a few more into
 * w's deque. NULL if it is empty, busy, or another worker holds the role. */
static struct pawl_task *take_injected(struct worker *w)
{
    struct pawl_pool *pool = w->pool;
    /* A hint; the pop below is what synchronises with producers. */
    if (injected_estimate(pool) <= 0)
        return NULL;
    /* Acquire: pairs with the release in the unlock below; the previous holder's queue state
     * (the consumer-side tail) is visible to us. */
    if (atomic_exchange_explicit(PAWL_ATOMIC_OF(&pool->inject_lock), 1, memory_order_acquire) != 0)
        return NULL;
    struct pawl_task *batch[INJECT_BATCH];
    int64_t n = injected_estimate(pool);
    /* Our share if the rest is worth a helper, else as much as we may take (the pass-on rule). */
    int64_t want = PAWL_MIN(INJECT_BATCH, worth_waking(w, n - 1) ? n / pool->nworkers + 1 : n);
    /* The rings first (the shared one and the producers' in turn), then the list; the list
     * first every LIST_TURN-th time (see ring_push_mp). */
    uint32_t turn = ++pool->list_turn;
    static const uint8_t orders[3][3] = {{0, 1, 2}, {1, 0, 2}, {2, 1, 0}};
    const uint8_t *order = orders[turn % LIST_TURN == 0 ? 2 : turn & 1];
    int64_t got = 0, from_list = 0;
    int first_from_list = 0;
    for (int pass = 0; pass < 3 && got < want; pass++) {
        if (order[pass] == 0) {
            got += ring_take_sc(pool, batch + got, want - got);
        } else if (order[pass] == 1) {
            got += spsc_take_any(pool, batch + got, want - got);
        } else {
            first_from_list = got == 0;
            while (got < want) {
                void **link = pawl__mpsc_pop_sc(&pool->inject);
                if (link == NULL || link == PAWL_MPSC_BUSY)
                    break;
                batch[got++] = PAWL_CONTAINER_OF(link, struct pawl_task, _next);
                from_list++;
            }
            first_from_list = first_from_list && from_list > 0;
        }
    }
    /* All but the first go into our deque with one publication (others may steal them). */
    if (got > 1 && pawl__deque_push_n_owner(&w->dq, batch + 1, got - 1) != 0) {
        /* Our deque is full and cannot grow: back onto the list, counted in there (what came
         * off the list is simply not counted out). */
        /* Relaxed: counted in before the push, as submitters do; we hold the consumer role and
         * stay awake to take them again. */
        atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&pool->inject_in),
                                  (got - 1) - (from_list - first_from_list), memory_order_relaxed);
        for (int64_t i = 1; i < got; i++)
            pawl__mpsc_push_mp(&pool->inject, &batch[i]->_next);
        from_list = first_from_list;
        got = 1;
    }
    struct pawl_task *first = got > 0 ? batch[0] : NULL;
    /* Relaxed load (we are its only writer) and release store: a reader that sees the new count
     * also sees our pops (it reads inject_out with acquire). */
    atomic_store_explicit(
        PAWL_ATOMIC_OF(&pool->inject_out),
        atomic_load_explicit(PAWL_ATOMIC_OF(&pool->inject_out), memory_order_relaxed) + from_list,
        memory_order_release);
    /* Release: hand the consumer-side state to the next holder. */
    atomic_store_explicit(PAWL_ATOMIC_OF(&pool->inject_lock), 0, memory_order_release);
    /* Relaxed: a statistics counter with a single writer (see count()). */
    atomic_store_explicit(PAWL_ATOMIC_OF(&w->injected), w->injected + (uint64_t)got,
                          memory_order_relaxed);
    /* More work than the task we return (in our deque or still injected): pass the wake-up on
     * if it is worth it, else keep it. */
    if (got == 0)
        return NULL; /* a producer is still linking what it counted: we retry, awake */
    int64_t left = got - 1 + nonneg(injected_estimate(pool));
    pass_on(w, left);
    return first;
}

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static struct pawl_task *steal_any(struct worker *w)
{
    struct pawl_pool *pool = w->pool;
    int n = pool->nworkers;
    if (n < 2)
        return NULL;
    for (int round = 0; round < 2; round++) {
        int start = (int)(xorshift(&w->rng) % (uint64_t)n);
        for (int i = 0; i < n; i++) {
            struct worker *v = &pool->workers[(start + i) % n];
            if (v == w)
                continue;
            /* Take up to half of the victim's tasks: we run the oldest and keep the rest in
             * our own deque, so the next ones cost us a local pop instead of another search
             * and steal on the victim's lines (and others can steal them from us). */
            struct pawl_task *got[STEAL_BATCH];
            int64_t k = pawl__deque_steal_batch(&v->dq, got, STEAL_BATCH);
            if (k < 0)
                k = pawl__deque_steal_batch(&v->dq, got, STEAL_BATCH);
            if (k > 0) {
                /* Relaxed: a statistics counter with a single writer (see count()). */
                atomic_store_explicit(PAWL_ATOMIC_OF(&w->steals), w->steals + (uint64_t)k,
                                      memory_order_relaxed);
                if (k > 1 && pawl__deque_push_n_owner(&w->dq, got + 1, k - 1) != 0) {
                    /* Our deque is full and cannot grow: the shared queue takes them. */
                    for (int64_t j = 1; j < k; j++)
                        inject_push(pool, got[j]);
                }
                /* More left there or here: a third worker, if parked, may help. Never the
                 * victim: a worker parks only after seeing its own deque empty, and only it
                 * pushes there, so a deque we could steal from has an owner that is awake.
                 * With two workers there is nobody else, so the fence in notify() would be
                 * wasted. */
                if (n > 2)
                    pass_on(w, k - 1 + nonneg(pawl__deque_size(&v->dq)));
                return got[0];
            }
        }
    }
    return NULL;
}

static struct pawl_task *find_task(struct worker *w)
{
    struct pawl_task *t;
    if (++w->tick % 61 == 0 && (t = take_injected(w)) != NULL)
        return t;
    if ((t = pawl__deque_pop_owner(&w->dq)) != NULL)
        return t;
    if ((t = take_injected(w)) != NULL)
        return t;
    return steal_any(w);
}

/* How many tasks are queued anywhere (an estimate: relaxed loads, racing with everybody; a
 * caller deciding to sleep on it fenced (seq_cst) after announcing itself as a sleeper). */
static int64_t work_estimate(struct pawl_pool *pool)
{
    int64_t n = nonneg(injected_estimate(pool));
    for (int i = 0; i < pool->nworkers; i++)
        n += nonneg(pawl__deque_size(&pool->workers[i].dq));
    return n;
}

static int has_work(struct pawl_pool *pool)
{
    return work_estimate(pool) > 0;
}

void pawl_pool_will_block(void)
{
    struct worker *w = tls_worker;
    if (w == NULL)
        return;
    /* Whatever is queued, ours or not, would otherwise wait for a worker that may be parked
     * while we are blocked: wake one if any sleeps (notify() checks). */
    w->kept_since = 0;
    if (work_estimate(w->pool) > 0)
        notify(w->pool);
}

static void park(struct worker *w)
{
    struct pawl_pool *pool = w->pool;
    for (int i = 0; i < SPIN_ROUNDS; i++) {
        if (has_work(pool) ||
            atomic_load_explicit(PAWL_ATOMIC_OF(&pool->stop), memory_order_relaxed))
            return;
        pawl_cpu_relax();
    }
    /* Then a few rounds that give the CPU away instead of burning it. When the pool shares its
     * CPUs with the threads that feed it (an outside submitter, a completing I/O thread), the
     * yield lets that thread run, and the work it produces meanwhile is found here and taken in
     * one batch rather than with a futex wake-up per park; on an idle CPU the yield returns at
     * once and only slows the polling of the submitters' cache lines. */
    for (int i = 0; i < YIELD_ROUNDS; i++) {
        if (has_work(pool) ||
            atomic_load_explicit(PAWL_ATOMIC_OF(&pool->stop), memory_order_relaxed))
            return;
        sched_yield();
    }
    /* Acquire: the epoch we will sleep on; any later bump makes futex_wait return at once. */
    uint32_t e = atomic_load_explicit(PAWL_ATOMIC_OF(&pool->epoch), memory_order_acquire);
    /* Seq_cst: announce the sleeper before re-checking the queues (worker half of Dekker). */
    int32_t before =
        atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&pool->sleepers), 1, memory_order_seq_cst);
    pawl_fence_seq_cst();
    int64_t timeout_ns = -1;
    /* Relaxed for asym: see notify_own. When every other worker is counted as asleep, none of
     * them can be pushing onto its own deque unseen: a worker leaves park() by decrementing
     * sleepers, after our increment in its order, so its later reads of sleepers in notify_own
     * see us and wake. Otherwise a running worker may have pushed without a fence: make it pass
     * a barrier before we look (see notify_own). */
    if (before + 1 < pool->nworkers &&
        atomic_load_explicit(PAWL_ATOMIC_OF(&pool->asym), memory_order_relaxed) &&
        syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0) {
        /* Cannot happen once registered; should it, our re-check may miss a push made without a
         * fence: sleep at most a millisecond before looking again. */
        timeout_ns = 1000000;
    }
    if (!has_work(pool) &&
        !atomic_load_explicit(PAWL_ATOMIC_OF(&pool->stop), memory_order_seq_cst)) {
        count(&w->parks);
        /* Seq_cst: before the kernel reads epoch (see wake_one): a submitter that reads 0
         * here bumped the epoch first, and the wait returns at once. */
        atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&pool->blocked), 1, memory_order_seq_cst);
        pawl__futex_wait(&pool->epoch, e, timeout_ns);
        /* Relaxed: only gates submitters' futex calls; a stale count costs one call. */
        atomic_fetch_sub_explicit(PAWL_ATOMIC_OF(&pool->blocked), 1, memory_order_relaxed);
    }
    /* Relaxed: the count only gates whether submitters issue a wake-up. */
    atomic_fetch_sub_explicit(PAWL_ATOMIC_OF(&pool->sleepers), 1, memory_order_relaxed);
    /* Whoever leaves park() (woken or not) ends the wake-up in flight, then searches: the
     * store is ordered before that search by a seq_cst fence (worker half of notify()'s
     * hand-shake). Clearing it when another worker was the one woken only allows an extra
     * wake-up, never a lost one. */
    if (atomic_load_explicit(PAWL_ATOMIC_OF(&pool->waking), memory_order_relaxed))
        atomic_store_explicit(PAWL_ATOMIC_OF(&pool->waking), 0, memory_order_release);
    pawl_fence_seq_cst();
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct pawl_pool *pool = w->pool;
    tls_worker = w;
    int woke = 0;
    w->span_t0 = ticks();
    for (;;) {
        /* Acquire: pairs with the store in pawl_pool_free; stop is checked between tasks. */
        if (atomic_load_explicit(PAWL_ATOMIC_OF(&pool->stop), memory_order_acquire))
            break;
        struct pawl_task *t = find_task(w);
        if (t != NULL) {
            if (woke) {
                /* Fresh out of park() with work in hand: if more is waiting anywhere, pass
                 * the wake-up on if it is worth it (submitters skipped theirs while ours was
                 * in flight); a new span of busy time starts. */
                pass_on(w, work_estimate(pool));
                w->span_t0 = ticks();
                w->span_n = 0;
                woke = 0;
            }
            t->fn(t, 0);
            count(&w->executed);
            if (++w->span_n == COST_SAMPLE)
                cost_sample(w, ticks());
            if (w->kept_since != 0) {
                /* Kept work waited long enough: share it after all (see worth_waking). */
                int64_t size = pawl__deque_size(&w->dq);
                if (size <= 0) {
                    w->kept_since = 0;
                } else if (size >= w->kept_size || (++w->kept_n % KEPT_CLOCK == 1 &&
                                                    ticks() - w->kept_since >= pass_on_ticks)) {
                    w->kept_since = 0;
                    notify(pool);
                } else {
                    w->kept_size = size;
                }
            }
            continue;
        }
        /* Out of work: the span ends here (the search and the park are not task time). */
        cost_sample(w, ticks());
        w->kept_since = 0;
        park(w);
        woke = 1;
    }
    tls_worker = NULL;
    return NULL;
}

/*
 * Register the process for expedited private membarriers (see notify_own): 1 when that worked.
 * Registration belongs to the address space, so it is repeated for every pool (cheap, and
 * right in a child that forked after an earlier pool was made). One log line per process when it
 * is refused.
 */
static uint32_t membarrier_ready(void)
{
    static int said;
    long q = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (q >= 0 && (q & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
        syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0)
        return 1;
    /* Relaxed: a log line said once or, in a race, twice. */
    if (atomic_exchange_explicit(PAWL_ATOMIC_OF(&said), 1, memory_order_relaxed) == 0)
        PAWL_INFO("pool", "membarrier(2) unavailable (%s): workers fence every push",
                  q < 0 ? strerror(errno) : "no private expedited command");
    return 0;
}

int pawl_pool_new(struct pawl_pool **out, const struct pawl_pool_opts *opts)
{
    struct pawl_pool_opts o;
    if (opts)
        o = *opts;
    else
        pawl_pool_opts_defaults(&o);
    if (out == NULL || o.workers < 0 || o.workers > MAX_WORKERS || o.deque_capacity < 0)
        return PAWL_EINVAL;
    *out = NULL;
    pthread_once(&clock_once, clock_calibrate);
    int n = o.workers;
    if (n == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (int)PAWL_MIN(c, MAX_WORKERS) : 1;
    }
    const char *prefix = o.name ? o.name : "pawl-w";
    int rc = PAWL_ENOMEM;
    void *raw;
    struct pawl_pool *pool = calloc_lines(sizeof(*pool), &raw);
    if (pool == NULL)
        goto fail;
    pool->raw = raw;
    pawl__mpsc_init(&pool->inject);
    if (pthread_mutex_init(&pool->spsc_lock, NULL) != 0) {
        pawl_free(raw);
        pool = NULL;
        goto fail;
    }
    pool->ring = calloc_lines(RING_SIZE * sizeof(struct pawl_task *), &pool->ring_raw);
    if (pool->ring == NULL)
        goto fail;
    pool->nworkers = n;
    pool->asym = membarrier_ready();
    /* Relaxed: only uniqueness matters. */
    pool->id = (atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&pool_ids), 1, memory_order_relaxed) + 1);
    pool->workers = calloc_lines((size_t)n * sizeof(struct worker), &pool->workers_raw);
    if (pool->workers == NULL)
        goto fail;
    for (int i = 0; i < n; i++) {
        struct worker *w = &pool->workers[i];
        w->pool = pool;
        w->index = i;
        w->rng = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
        w->cost = pass_on_ticks;
        if (pawl__deque_init(&w->dq, o.deque_capacity ? o.deque_capacity : 256) != 0)
            goto fail;
    }
    for (int i = 0; i < n; i++) {
        struct worker *w = &pool->workers[i];
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            rc = PAWL_ESYS;
            goto fail;
        }
        w->started = 1;
        char name[32]; /* the kernel keeps 15 bytes: prefix (<= 10) + index (< 1024) */
        snprintf(name, sizeof name, "%.10s%d", prefix, i);
        name[15] = '\0';
        pthread_setname_np(w->thread, name);
    }
    pthread_mutex_lock(&live_lock);
    pool->live_next = live_pools;
    if (live_pools != NULL)
        live_pools->live_prev = pool;
    live_pools = pool;
    pthread_mutex_unlock(&live_lock);
    *out = pool;
    return 0;
fail:
    if (pool) {
        if (pool->workers) {
            /* Seq_cst: as in pawl_pool_free. */
            atomic_store_explicit(PAWL_ATOMIC_OF(&pool->stop), 1, memory_order_seq_cst);
            atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&pool->epoch), 1, memory_order_seq_cst);
            pawl__futex_wake(&pool->epoch, n);
            for (int i = 0; i < n; i++) {
                if (pool->workers[i].started)
                    pthread_join(pool->workers[i].thread, NULL);
                if (pool->workers[i].dq.ring)
                    pawl__deque_fini(&pool->workers[i].dq);
            }
            pawl_free(pool->workers_raw);
        }
        pthread_mutex_destroy(&pool->spsc_lock); /* no ring yet: nobody could submit */
        pawl_free(pool->ring_raw);
        pawl_free(pool->raw);
    }
    PAWL_ERROR("pool", "cannot start a pool of %d workers: %s", n, pawl_strerror(rc));
    return rc;
}

static void cancel(struct pawl_pool *pool, struct pawl_task *t)
{
    pool->cancelled++;
    t->fn(t, PAWL_ECANCELED);
}

void pawl_pool_free(struct pawl_pool *pool)
{
    if (pool == NULL)
        return;
    if (tls_worker != NULL && tls_worker->pool == pool) {
        PAWL_ERROR("pool", "pawl_pool_free called from one of its own workers; ignored");
        return;
    }
    /* Seq_cst: the workers' park() re-check must see stop, or see the epoch bump below. */
    atomic_store_explicit(PAWL_ATOMIC_OF(&pool->stop), 1, memory_order_seq_cst);
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&pool->epoch), 1, memory_order_seq_cst);
    pawl__futex_wake(&pool->epoch, pool->nworkers);
    for (int i = 0; i < pool->nworkers; i++)
        pthread_join(pool->workers[i].thread, NULL);

    /* Single-threaded from here, except for foreign submitters racing with free: one already
     * inside pawl_pool_submit or pawl_pool_submit_batch (it has counted its tasks in) is waited
     * for and its tasks cancelled. Submitting after pawl_pool_free has returned is a use after
     * free (the caller stops its threads first). Cancel until nothing is left and every task
     * counted in has been taken out (see inject_chain). */
    for (int more = 1; more;) {
        more = 0;
        for (int i = 0; i < pool->nworkers; i++) {
            struct pawl_task *t;
            pawl__deque_adopt(&pool->workers[i].dq); /* its worker has been joined */
            while ((t = pawl__deque_pop_owner(&pool->workers[i].dq)) != NULL) {
                cancel(pool, t);
                more = 1;
            }
        }
        for (;;) {
            void **link = pawl__mpsc_pop_sc(&pool->inject);
            if (link == NULL)
                break;
            if (link == PAWL_MPSC_BUSY) {
                sched_yield(); /* a producer is between its two stores */
                continue;
            }
            /* Relaxed: the workers are gone; this thread is the consumer. */
            atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&pool->inject_out), 1, memory_order_relaxed);
            cancel(pool, PAWL_CONTAINER_OF(link, struct pawl_task, _next));
            more = 1;
        }
        struct pawl_task *t;
        while (ring_take_sc(pool, &t, 1) == 1) {
            cancel(pool, t);
            more = 1;
        }
        struct pawl_task *ts[INJECT_BATCH];
        int64_t k;
        while ((k = spsc_take_any(pool, ts, INJECT_BATCH)) > 0) {
            for (int64_t i = 0; i < k; i++)
                cancel(pool, ts[i]);
            more = 1;
        }
        /* A foreign submitter that counted its tasks in (or reserved ring slots, or published
         * on its own ring) may still be waking or pushing: wait for its tasks (cancelled on the
         * next pass). Seq_cst: the latest counts we can read. */
        if (!more &&
            (atomic_load_explicit(PAWL_ATOMIC_OF(&pool->inject_in), memory_order_seq_cst) !=
                 atomic_load_explicit(PAWL_ATOMIC_OF(&pool->inject_out), memory_order_relaxed) ||
             atomic_load_explicit(PAWL_ATOMIC_OF(&pool->ring_tail), memory_order_seq_cst) !=
                 atomic_load_explicit(PAWL_ATOMIC_OF(&pool->ring_head), memory_order_relaxed) ||
             spsc_in_flight(pool))) {
            sched_yield();
            more = 1;
        }
    }
    /* Unlinked before the rings are freed: a thread that exits later leaves them alone (and never
     * submits to this pool again: that would be a use after free). */
    pthread_mutex_lock(&live_lock);
    if (pool->live_prev != NULL)
        pool->live_prev->live_next = pool->live_next;
    else
        live_pools = pool->live_next;
    if (pool->live_next != NULL)
        pool->live_next->live_prev = pool->live_prev;
    pthread_mutex_unlock(&live_lock);
    for (uint32_t i = 0; i < pool->nspsc; i++)
        pawl_free(pool->spsc[i]->raw);
    pthread_mutex_destroy(&pool->spsc_lock);
    if (pool->cancelled)
        PAWL_DEBUG("pool", "shut down; %llu queued tasks cancelled",
                   (unsigned long long)pool->cancelled);
    for (int i = 0; i < pool->nworkers; i++)
        pawl__deque_fini(&pool->workers[i].dq);
    pawl_free(pool->workers_raw);
    pawl_free(pool->ring_raw);
    pawl_free(pool->raw);
}

void pawl_pool_stats(const struct pawl_pool *pool, struct pawl_pool_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->workers = pool->nworkers;
    for (int i = 0; i < pool->nworkers; i++) {
        const struct worker *w = &pool->workers[i];
        /* Relaxed: statistics snapshot. */
        out->executed += atomic_load_explicit(PAWL_ATOMIC_OF(&w->executed), memory_order_relaxed);
        out->steals += atomic_load_explicit(PAWL_ATOMIC_OF(&w->steals), memory_order_relaxed);
        out->injected += atomic_load_explicit(PAWL_ATOMIC_OF(&w->injected), memory_order_relaxed);
        out->parks += atomic_load_explicit(PAWL_ATOMIC_OF(&w->parks), memory_order_relaxed);
        out->kept += atomic_load_explicit(PAWL_ATOMIC_OF(&w->kept), memory_order_relaxed);
    }
    out->wakeups = atomic_load_explicit(PAWL_ATOMIC_OF(&pool->wakeups), memory_order_relaxed);
    out->cancelled = atomic_load_explicit(PAWL_ATOMIC_OF(&pool->cancelled), memory_order_relaxed);
}
