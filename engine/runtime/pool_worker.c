/*
 * pool_worker.c — the pool's worker threads: the loop that finds a task and runs it (own deque
 * first, the injection queue every 61st task and when the deque is empty, then stealing), the
 * injection queue's consumer role (take_injected, one worker at a time by try-lock), stealing
 * (steal_any), the pass-on rule that decides whether queued work is worth waking a parked worker
 * for, and parking (park, the sleeper's half of the eventcount whose other half is wake_one in
 * pool_internal.h). Everything here runs on one of the pool's worker threads, with these
 * exceptions: pawl_pool_will_block and pawl_pool_current_worker may be called from any thread
 * (outside the pool they do nothing, or say -1); pawl__pool_clock_init and
 * pawl__pool_worker_init run in pawl_pool_new before the workers start; the two takes run under
 * the consumer role, which pawl_pool_free holds once the workers are joined.
 */
#include "pool_internal.h"

#include <linux/membarrier.h>
#include <sched.h>
#include <sys/syscall.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif
#include <unistd.h>

#define LIST_TURN 4 /* the consumer looks at the list first on every LIST_TURN-th take */
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

void pawl__pool_clock_init(void)
{
    pthread_once(&clock_once, clock_calibrate);
}

_Thread_local struct worker *pawl__pool_tls_worker;

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

int pawl_pool_current_worker(void)
{
    return pawl__pool_tls_worker ? pawl__pool_tls_worker->index : -1;
}

struct pawl_pool *pawl__pool_current(void)
{
    return pawl__pool_tls_worker ? pawl__pool_tls_worker->pool : NULL;
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

/* The pass-on rule applied by a worker that sees `left` tasks besides the one it is about to run:
 * wake a helper if they are worth it, else keep them (see worth_waking). */
static void pass_on(struct worker *w, int64_t left)
{
    if (worth_waking(w, left))
        notify(w->pool);
    else if (left > 0)
        keep(w);
}

/* Consumer role only: take up to want tasks from the ring, oldest first. */
int64_t pawl__pool_ring_take_sc(struct pawl_pool *pool, struct pawl_task **out, int64_t want)
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

/* Consumer role only: take up to want tasks from the producer rings, starting at a different
 * ring each time so that a busy one cannot starve the others. */
int64_t pawl__pool_spsc_take_any(struct pawl_pool *pool, struct pawl_task **out, int64_t want)
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
            got += pawl__pool_ring_take_sc(pool, batch + got, want - got);
        } else if (order[pass] == 1) {
            got += pawl__pool_spsc_take_any(pool, batch + got, want - got);
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
    struct worker *w = pawl__pool_tls_worker;
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
    /* Relaxed for asym: see notify_own (pool_submit.c). When every other worker is counted as
     * asleep, none of them can be pushing onto its own deque unseen: a worker leaves park() by
     * decrementing sleepers, after our increment in its order, so its later reads of sleepers in
     * notify_own see us and wake. Otherwise a running worker may have pushed without a fence: make
     * it pass a barrier before we look (see notify_own). */
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

void *pawl__pool_worker_main(void *arg)
{
    struct worker *w = arg;
    struct pawl_pool *pool = w->pool;
    pawl__pool_tls_worker = w;
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
    pawl__pool_tls_worker = NULL;
    return NULL;
}

int pawl__pool_worker_init(struct worker *w, struct pawl_pool *pool, int index,
                           int64_t deque_capacity)
{
    w->pool = pool;
    w->index = index;
    w->rng = 0x9e3779b97f4a7c15ull * (uint64_t)(index + 1);
    w->cost = pass_on_ticks;
    return pawl__deque_init(&w->dq, deque_capacity);
}
