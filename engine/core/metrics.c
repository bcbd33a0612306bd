/*
 * metrics.c — the process-wide metrics registry: shards, snapshot, percentiles, Prometheus text.
 *
 * The registry is static storage (zero pages until a shard is first touched), so recording needs
 * no set-up call and works before and after any pawl object exists. Threads are spread over the
 * shards round robin on their first record; the shard a thread uses never changes, and shards are
 * never freed, so a record can never touch freed memory. Snapshot, diff and formatting may run on
 * any thread; they only read.
 */
#include "metrics.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

struct pawl_metrics_shard_ pawl__metrics_shards[PAWL_METRICS_SHARDS];
struct pawl_metrics_gauge_cell_ pawl__metrics_gauges[PAWL_G__COUNT];
_Thread_local unsigned pawl__metrics_my_shard;

static _Atomic unsigned next_shard;

unsigned pawl__metrics_pick_shard(void)
{
    /* Relaxed: only spreads threads over shards; any interleaving gives a valid shard. */
    unsigned s = atomic_fetch_add_explicit(&next_shard, 1, memory_order_relaxed);
    pawl__metrics_my_shard = s % PAWL_METRICS_SHARDS + 1;
    return pawl__metrics_my_shard;
}

void pawl__metrics_bucket_bounds(unsigned idx, uint64_t *lo, uint64_t *hi)
{
    const unsigned sub = 1u << PAWL_METRICS_SUB_BITS;
    if (idx < sub) {
        *lo = *hi = idx;
        return;
    }
    if (idx >= PAWL_METRICS_BUCKETS)
        idx = PAWL_METRICS_BUCKETS - 1;
    unsigned k = idx - sub;
    unsigned shift = k / sub;
    uint64_t low = (uint64_t)(sub + k % sub) << shift;
    *lo = low;
    *hi = low + ((uint64_t)1 << shift) - 1;
}

int pawl_metrics_snapshot(struct pawl_metrics_snapshot *out)
{
    if (out == NULL)
        return PAWL_EINVAL;
    memset(out, 0, sizeof *out);
    out->taken_ns = pawl_now_ns();
    for (unsigned s = 0; s < PAWL_METRICS_SHARDS; s++) {
        struct pawl_metrics_shard_ *sh = &pawl__metrics_shards[s];
        /* Relaxed loads throughout: each cell is an independent sum (see the file comment). */
        for (unsigned c = 0; c < PAWL_M__COUNT; c++)
            out->counters[c] += atomic_load_explicit(&sh->counters[c], memory_order_relaxed);
        for (unsigned h = 0; h < PAWL_H__COUNT; h++) {
            struct pawl_metrics_hist_cells_ *src = &sh->hists[h];
            struct pawl_metrics_hist *dst = &out->hists[h];
            uint64_t n = 0;
            for (unsigned b = 0; b < PAWL_METRICS_BUCKETS; b++) {
                uint64_t v = atomic_load_explicit(&src->buckets[b], memory_order_relaxed);
                dst->buckets[b] += v;
                n += v;
            }
            /* The count is the bucket total, so quantiles always agree with count. */
            dst->count += n;
            dst->sum_ns += atomic_load_explicit(&src->sum_ns, memory_order_relaxed);
            uint64_t m = atomic_load_explicit(&src->max_ns, memory_order_relaxed);
            if (m > dst->max_ns)
                dst->max_ns = m;
        }
    }
    for (unsigned g = 0; g < PAWL_G__COUNT; g++)
        out->gauges[g] = atomic_load_explicit(&pawl__metrics_gauges[g].value, memory_order_relaxed);
    return 0;
}

static uint64_t sub_floor(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

int pawl_metrics_diff(struct pawl_metrics_snapshot *out, const struct pawl_metrics_snapshot *now,
                      const struct pawl_metrics_snapshot *before)
{
    if (out == NULL || now == NULL || before == NULL)
        return PAWL_EINVAL;
    if (out != now)
        memcpy(out, now, sizeof *out);
    for (unsigned c = 0; c < PAWL_M__COUNT; c++)
        out->counters[c] = sub_floor(now->counters[c], before->counters[c]);
    for (unsigned h = 0; h < PAWL_H__COUNT; h++) {
        struct pawl_metrics_hist *o = &out->hists[h];
        const struct pawl_metrics_hist *b = &before->hists[h];
        uint64_t n = 0;
        for (unsigned i = 0; i < PAWL_METRICS_BUCKETS; i++) {
            o->buckets[i] = sub_floor(now->hists[h].buckets[i], b->buckets[i]);
            n += o->buckets[i];
        }
        o->count = n;
        o->sum_ns = sub_floor(now->hists[h].sum_ns, b->sum_ns);
    }
    return 0;
}

int64_t pawl_metrics_quantile_ns(const struct pawl_metrics_hist *h, double q)
{
    if (h == NULL || h->count == 0)
        return 0;
    if (q < 0)
        q = 0;
    if (q > 1)
        q = 1;
    uint64_t rank = (uint64_t)(q * (double)h->count + 0.999999);
    if (rank < 1)
        rank = 1;
    if (rank > h->count)
        rank = h->count;
    uint64_t seen = 0;
    for (unsigned i = 0; i < PAWL_METRICS_BUCKETS; i++) {
        seen += h->buckets[i];
        if (seen >= rank) {
            uint64_t lo, hi;
            pawl__metrics_bucket_bounds(i, &lo, &hi);
            uint64_t mid = lo + (hi - lo) / 2;
            if (h->max_ns && mid > h->max_ns)
                mid = h->max_ns;
            return (int64_t)mid;
        }
    }
    return (int64_t)h->max_ns;
}

/* ---- names ---- */

#define NAME_(id, name, help) [id] = name,
#define HELP_(id, name, help) [id] = help,
static const char *const counter_names[] = {PAWL_METRIC_COUNTERS(NAME_)};
static const char *const counter_helps[] = {PAWL_METRIC_COUNTERS(HELP_)};
static const char *const gauge_names[] = {PAWL_METRIC_GAUGES(NAME_)};
static const char *const gauge_helps[] = {PAWL_METRIC_GAUGES(HELP_)};
static const char *const hist_names[] = {PAWL_METRIC_HISTS(NAME_)};
static const char *const hist_helps[] = {PAWL_METRIC_HISTS(HELP_)};
#undef NAME_
#undef HELP_

const char *pawl_metrics_counter_name(enum pawl_metric_counter id)
{
    return (unsigned)id < PAWL_M__COUNT ? counter_names[id] : "?";
}
const char *pawl_metrics_counter_help(enum pawl_metric_counter id)
{
    return (unsigned)id < PAWL_M__COUNT ? counter_helps[id] : "?";
}
const char *pawl_metrics_gauge_name(enum pawl_metric_gauge id)
{
    return (unsigned)id < PAWL_G__COUNT ? gauge_names[id] : "?";
}
const char *pawl_metrics_gauge_help(enum pawl_metric_gauge id)
{
    return (unsigned)id < PAWL_G__COUNT ? gauge_helps[id] : "?";
}
const char *pawl_metrics_hist_name(enum pawl_metric_hist id)
{
    return (unsigned)id < PAWL_H__COUNT ? hist_names[id] : "?";
}
const char *pawl_metrics_hist_help(enum pawl_metric_hist id)
{
    return (unsigned)id < PAWL_H__COUNT ? hist_helps[id] : "?";
}

/* ---- Prometheus text ---- */

struct outbuf {
    char *buf;
    size_t cap;
    size_t len; /* what the full text needs so far, may exceed cap */
};

static void out_printf(struct outbuf *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void out_printf(struct outbuf *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->len < o->cap ? o->cap - o->len : 0;
    int n = vsnprintf(room ? o->buf + o->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->len += (size_t)n;
}

/* Upper bounds in nanoseconds for the exported `le` buckets, and how they print. */
static const struct {
    uint64_t ns;
    const char *text;
} le_bounds[] = {
    {10000, "1e-05"},    {25000, "2.5e-05"},  {50000, "5e-05"},    {100000, "0.0001"},
    {250000, "0.00025"}, {500000, "0.0005"},  {1000000, "0.001"},  {2500000, "0.0025"},
    {5000000, "0.005"},  {10000000, "0.01"},  {25000000, "0.025"}, {50000000, "0.05"},
    {100000000, "0.1"},  {250000000, "0.25"}, {500000000, "0.5"},  {1000000000, "1"},
    {2500000000, "2.5"}, {5000000000, "5"},   {10000000000, "10"}, {30000000000, "30"},
    {60000000000, "60"},
};

int pawl_metrics_format_prometheus(const struct pawl_metrics_snapshot *s, char *buf, size_t cap,
                                   size_t *len)
{
    if (s == NULL || (buf == NULL && cap > 0))
        return PAWL_EINVAL;
    struct outbuf o = {buf, cap, 0};
    for (unsigned c = 0; c < PAWL_M__COUNT; c++)
        out_printf(&o, "# HELP %s %s\n# TYPE %s counter\n%s %" PRIu64 "\n", counter_names[c],
                   counter_helps[c], counter_names[c], counter_names[c], s->counters[c]);
    for (unsigned g = 0; g < PAWL_G__COUNT; g++)
        out_printf(&o, "# HELP %s %s\n# TYPE %s gauge\n%s %" PRId64 "\n", gauge_names[g],
                   gauge_helps[g], gauge_names[g], gauge_names[g], s->gauges[g]);
    for (unsigned h = 0; h < PAWL_H__COUNT; h++) {
        const struct pawl_metrics_hist *hist = &s->hists[h];
        const char *name = hist_names[h];
        out_printf(&o, "# HELP %s %s\n# TYPE %s histogram\n", name, hist_helps[h], name);
        unsigned b = 0;
        uint64_t cum = 0;
        for (size_t l = 0; l < PAWL_ARRAY_LEN(le_bounds); l++) {
            for (; b < PAWL_METRICS_BUCKETS; b++) {
                uint64_t lo, hi;
                pawl__metrics_bucket_bounds(b, &lo, &hi);
                if (hi > le_bounds[l].ns)
                    break;
                cum += hist->buckets[b];
            }
            out_printf(&o, "%s_bucket{le=\"%s\"} %" PRIu64 "\n", name, le_bounds[l].text, cum);
        }
        out_printf(&o, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, hist->count);
        out_printf(&o, "%s_sum %.9f\n%s_count %" PRIu64 "\n", name, (double)hist->sum_ns / 1e9,
                   name, hist->count);
    }
    if (len)
        *len = o.len;
    if (o.len >= cap) {
        if (cap > 0)
            buf[cap - 1] = '\0';
        return PAWL_ETOOBIG;
    }
    return 0;
}

int pawl_metrics_counter_add(enum pawl_metric_counter id, uint64_t n)
{
    if ((unsigned)id >= PAWL_M__COUNT)
        return PAWL_EINVAL;
    pawl_metric_add(id, n);
    return 0;
}

int pawl_metrics_hist_observe(enum pawl_metric_hist id, int64_t ns)
{
    if ((unsigned)id >= PAWL_H__COUNT)
        return PAWL_EINVAL;
    pawl_metric_hist_record(id, ns);
    return 0;
}

void pawl_metrics_reset(void)
{
    for (unsigned s = 0; s < PAWL_METRICS_SHARDS; s++) {
        struct pawl_metrics_shard_ *sh = &pawl__metrics_shards[s];
        /* Relaxed: reset is for tests and tools, which accept racing records (see the header). */
        for (unsigned c = 0; c < PAWL_M__COUNT; c++)
            atomic_store_explicit(&sh->counters[c], 0, memory_order_relaxed);
        for (unsigned h = 0; h < PAWL_H__COUNT; h++) {
            struct pawl_metrics_hist_cells_ *hc = &sh->hists[h];
            atomic_store_explicit(&hc->sum_ns, 0, memory_order_relaxed);
            atomic_store_explicit(&hc->max_ns, 0, memory_order_relaxed);
            for (unsigned b = 0; b < PAWL_METRICS_BUCKETS; b++)
                atomic_store_explicit(&hc->buckets[b], 0, memory_order_relaxed);
        }
    }
    for (unsigned g = 0; g < PAWL_G__COUNT; g++)
        atomic_store_explicit(&pawl__metrics_gauges[g].value, 0, memory_order_relaxed);
}
