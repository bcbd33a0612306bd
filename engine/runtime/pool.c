/*
 * pool.c — the pool's life cycle: pawl_pool_new (options, the cache-line aligned allocations,
 * the workers' deques and threads), pawl_pool_free (stop, wake and join the workers, then cancel
 * whatever is still queued until every task counted in has been taken out, waiting for
 * submitters still inside), pawl_pool_stats and the small accessors. pawl_pool_new,
 * pawl_pool_stats and pawl_pool_workers may be called from any thread; pawl_pool_free from a
 * thread outside the pool, once no thread will start a submission to it any more (see
 * pool_internal.h for the design, and the threads each file serves).
 */
#include "pool_internal.h"

#include <errno.h>
#include <linux/membarrier.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_WORKERS 1024

static uint64_t pool_ids; /* the last id given to a pool */

#ifdef PAWL_TSAN_FENCES
unsigned long pawl__fence_word;
#endif

void pawl_pool_opts_defaults(struct pawl_pool_opts *opts)
{
    memset(opts, 0, sizeof(*opts));
}

int pawl_pool_workers(const struct pawl_pool *pool)
{
    return pool->nworkers;
}

/*
 * Register the process for expedited private membarriers (see notify_own in pool_submit.c): 1 when
 * that worked. Registration belongs to the address space, so it is repeated for every pool (cheap,
 * and right in a child that forked after an earlier pool was made). One log line per process when
 * it is refused.
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
    pawl__pool_clock_init();
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
        if (pawl__pool_worker_init(&pool->workers[i], pool, i,
                                   o.deque_capacity ? o.deque_capacity : 256) != 0)
            goto fail;
    }
    for (int i = 0; i < n; i++) {
        struct worker *w = &pool->workers[i];
        if (pthread_create(&w->thread, NULL, pawl__pool_worker_main, w) != 0) {
            rc = PAWL_ESYS;
            goto fail;
        }
        w->started = 1;
        char name[32]; /* the kernel keeps 15 bytes: prefix (<= 10) + index (< 1024) */
        snprintf(name, sizeof name, "%.10s%d", prefix, i);
        name[15] = '\0';
        pthread_setname_np(w->thread, name);
    }
    pawl__pool_live_add(pool);
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
    if (pawl__pool_current() == pool) {
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
        while (pawl__pool_ring_take_sc(pool, &t, 1) == 1) {
            cancel(pool, t);
            more = 1;
        }
        struct pawl_task *ts[INJECT_BATCH];
        int64_t k;
        while ((k = pawl__pool_spsc_take_any(pool, ts, INJECT_BATCH)) > 0) {
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
             pawl__pool_spsc_in_flight(pool))) {
            sched_yield();
            more = 1;
        }
    }
    /* Unlinked before the rings are freed: a thread that exits later leaves them alone (and never
     * submits to this pool again: that would be a use after free). */
    pawl__pool_live_remove(pool);
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
