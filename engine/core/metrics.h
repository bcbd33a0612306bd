/*
 * metrics.h — the recording side of pawl's process-wide metrics (private; the read side is
 * pawl/metrics.h).
 *
 * Recording is one relaxed atomic add on a cache line that few threads share: the registry is
 * split into PAWL_METRICS_SHARDS shards, each thread picks one on its first record (round robin)
 * and keeps it. A snapshot sums the shards. Nothing here allocates, locks or logs, so every module
 * may record from any thread, hot paths included:
 *
 *     pawl_metric_inc(PAWL_M_BACKOFFS);
 *     pawl_metric_add(PAWL_M_EVENTS_APPENDED, n);
 *     pawl_metric_hist_record(PAWL_H_FINALIZE_DELAY, delay_ns);
 *     pawl_metric_gauge_add(PAWL_G_CLAIMS_HELD, +1);
 *
 * Counters and histograms are only ever added to, so relaxed ordering suffices: no other data is
 * published through them, and a snapshot only needs each cell's own value to be untorn.
 */
#ifndef PAWL_ENGINE_METRICS_H
#define PAWL_ENGINE_METRICS_H

#include "common.h"
#include "pawl/metrics.h"

#include <stdatomic.h>
#include <stdint.h>

#define PAWL_METRICS_SHARDS 16

/* No count cell: a snapshot's count is its bucket total, which keeps quantiles consistent. */
struct pawl_metrics_hist_cells_ {
    _Atomic uint64_t sum_ns;
    _Atomic uint64_t max_ns;
    _Atomic uint64_t buckets[PAWL_METRICS_BUCKETS];
};

struct pawl_metrics_shard_ {
    _Alignas(PAWL_CACHELINE) _Atomic uint64_t counters[PAWL_M__COUNT];
    _Alignas(PAWL_CACHELINE) struct pawl_metrics_hist_cells_ hists[PAWL_H__COUNT];
};

struct pawl_metrics_gauge_cell_ {
    _Alignas(PAWL_CACHELINE) _Atomic int64_t value;
};

extern struct pawl_metrics_shard_ pawl__metrics_shards[PAWL_METRICS_SHARDS];
extern struct pawl_metrics_gauge_cell_ pawl__metrics_gauges[PAWL_G__COUNT];
extern _Thread_local unsigned pawl__metrics_my_shard; /* 0: not chosen yet, else shard + 1 */

unsigned pawl__metrics_pick_shard(void);

static inline struct pawl_metrics_shard_ *pawl_metrics_shard_(void)
{
    unsigned s = pawl__metrics_my_shard;
    if (PAWL_UNLIKELY(s == 0))
        s = pawl__metrics_pick_shard();
    return &pawl__metrics_shards[s - 1];
}

/* The bucket of a value in nanoseconds (see the geometry in pawl/metrics.h). */
static inline unsigned pawl_metrics_bucket(uint64_t v)
{
    const unsigned sub = 1u << PAWL_METRICS_SUB_BITS;
    if (v < sub)
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v);
    if (e > PAWL_METRICS_MAX_EXP)
        return PAWL_METRICS_BUCKETS - 1;
    unsigned s = (unsigned)(v >> (e - PAWL_METRICS_SUB_BITS)) & (sub - 1);
    return sub + (e - PAWL_METRICS_SUB_BITS) * sub + s;
}

static inline void pawl_metric_add(enum pawl_metric_counter id, uint64_t n)
{
    /* Relaxed: a counter publishes nothing; the snapshot only needs an untorn value. */
    atomic_fetch_add_explicit(&pawl_metrics_shard_()->counters[id], n, memory_order_relaxed);
}

static inline void pawl_metric_inc(enum pawl_metric_counter id)
{
    pawl_metric_add(id, 1);
}

/* Record one value in nanoseconds; a negative value (clock skew between hosts) records as 0. */
static inline void pawl_metric_hist_record(enum pawl_metric_hist id, int64_t ns)
{
    uint64_t v = ns < 0 ? 0 : (uint64_t)ns;
    struct pawl_metrics_hist_cells_ *h = &pawl_metrics_shard_()->hists[id];
    /* Relaxed throughout: cells are independent sums; a snapshot tolerates skew between them. */
    atomic_fetch_add_explicit(&h->buckets[pawl_metrics_bucket(v)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, v, memory_order_relaxed);
    /* Relaxed: max is a monotonic figure on its own; the CAS loop only runs on a new maximum. */
    uint64_t m = atomic_load_explicit(&h->max_ns, memory_order_relaxed);
    while (v > m && !atomic_compare_exchange_weak_explicit(&h->max_ns, &m, v, memory_order_relaxed,
                                                           memory_order_relaxed)) {
    }
}

static inline void pawl_metric_gauge_add(enum pawl_metric_gauge id, int64_t delta)
{
    /* Relaxed: a gauge publishes nothing. */
    atomic_fetch_add_explicit(&pawl__metrics_gauges[id].value, delta, memory_order_relaxed);
}

static inline void pawl_metric_gauge_set(enum pawl_metric_gauge id, int64_t v)
{
    /* Relaxed: a gauge publishes nothing. */
    atomic_store_explicit(&pawl__metrics_gauges[id].value, v, memory_order_relaxed);
}

/* Raise the gauge to v if it is lower (for "highest index seen" figures). */
static inline void pawl_metric_gauge_max(enum pawl_metric_gauge id, int64_t v)
{
    _Atomic int64_t *g = &pawl__metrics_gauges[id].value;
    /* Relaxed: the gauge publishes nothing; the loop only runs while v is larger. */
    int64_t m = atomic_load_explicit(g, memory_order_relaxed);
    while (v > m && !atomic_compare_exchange_weak_explicit(g, &m, v, memory_order_relaxed,
                                                           memory_order_relaxed)) {
    }
}

/* Bucket bounds in nanoseconds, inclusive; for the snapshot side and tests. */
void pawl__metrics_bucket_bounds(unsigned idx, uint64_t *lo, uint64_t *hi);

#endif
