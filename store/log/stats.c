/*
 * stats.c — what the store says about itself: the latency histograms (struct hist: append
 * latency, finalize delay, run time), pawl_store_stats, and the text of the last failure
 * (pawl_store_errmsg). The histograms and counters are relaxed atomics that any thread adds to
 * and any thread reads (a torn view across buckets is fine for statistics); the last error is
 * guarded by err_mu, held only to copy the text in or out. Every function here may be called
 * from any thread, the I/O threads included (nothing blocks but err_mu).
 */
#include "log_internal.h"

#include "standby.h"

#include <stdio.h>
#include <string.h>

static int hist_bucket(int64_t us)
{
    if (us < HIST_SUB)
        return us < 0 ? 0 : (int)us;
    int e = 63 - __builtin_clzll((unsigned long long)us); /* >= 4 */
    int sub = (int)((us >> (e - 4)) & (HIST_SUB - 1));
    int b = HIST_SUB + (e - 4) * HIST_SUB + sub;
    return b < HIST_BUCKETS ? b : HIST_BUCKETS - 1;
}

static int64_t hist_value(int b)
{
    if (b < HIST_SUB)
        return b;
    int e = (b - HIST_SUB) / HIST_SUB + 4;
    int sub = (b - HIST_SUB) % HIST_SUB;
    int64_t lo = ((int64_t)(HIST_SUB + sub)) << (e - 4);
    int64_t w = (int64_t)1 << (e - 4);
    return lo + w / 2;
}

/* Count one sample of us microseconds (any thread). */
void pawl__log_hist_add(struct hist *h, int64_t us)
{
    /* relaxed: statistics; readers tolerate a torn view across buckets. */
    atomic_fetch_add_explicit(&h->n[hist_bucket(us)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    long long m = atomic_load_explicit(&h->max, memory_order_relaxed);
    while (us > m && !atomic_compare_exchange_weak_explicit(&h->max, &m, us, memory_order_relaxed,
                                                            memory_order_relaxed))
        ;
}

static void hist_read(struct hist *h, int64_t *count, double *p50, double *p99, double *max,
                      int reset)
{
    long long c[HIST_BUCKETS];
    long long total = 0;
    for (int i = 0; i < HIST_BUCKETS; i++) {
        /* relaxed: statistics. */
        c[i] = reset ? atomic_exchange_explicit(&h->n[i], 0, memory_order_relaxed)
                     : atomic_load_explicit(&h->n[i], memory_order_relaxed);
        total += c[i];
    }
    long long mx = reset ? atomic_exchange_explicit(&h->max, 0, memory_order_relaxed)
                         : atomic_load_explicit(&h->max, memory_order_relaxed);
    if (reset)
        atomic_store_explicit(&h->count, 0, memory_order_relaxed);
    *count = total;
    *p50 = *p99 = 0;
    *max = (double)mx / 1000.0;
    if (total == 0)
        return;
    long long r50 = (total + 1) / 2, r99 = (total * 99 + 99) / 100, acc = 0;
    int got50 = 0;
    for (int i = 0; i < HIST_BUCKETS; i++) {
        acc += c[i];
        if (!got50 && acc >= r50) {
            *p50 = (double)hist_value(i) / 1000.0;
            got50 = 1;
        }
        if (acc >= r99) {
            *p99 = (double)hist_value(i) / 1000.0;
            break;
        }
    }
    if (*p99 > *max && mx > 0)
        *p99 = *max;
    if (*p50 > *max && mx > 0)
        *p50 = *max;
}

/* Keep the text of the last failure (any thread; err_mu). */
void pawl__log_set_err(struct pawl_store *s, const char *sqlstate, const char *msg)
{
    pthread_mutex_lock(&s->err_mu);
    if (sqlstate && sqlstate[0])
        snprintf(s->last_err, sizeof s->last_err, "%s: %.490s", sqlstate, msg ? msg : "");
    else
        snprintf(s->last_err, sizeof s->last_err, "%.500s", msg ? msg : "");
    pthread_mutex_unlock(&s->err_mu);
}

const char *pawl_store_errmsg(struct pawl_store *s, char *buf, size_t len)
{
    if (len == 0)
        return buf;
    if (s == NULL) {
        buf[0] = '\0';
        return buf;
    }
    pthread_mutex_lock(&s->err_mu);
    snprintf(buf, len, "%s", s->last_err);
    pthread_mutex_unlock(&s->err_mu);
    return buf;
}

void pawl_store_last_error(struct pawl_store *s, char *buf, size_t len)
{
    pawl_store_errmsg(s, buf, len);
}

void pawl_store_stats(struct pawl_store *s, struct pawl_store_stats *st, int reset)
{
    memset(st, 0, sizeof *st);
    /* relaxed: statistics. */
#define LD(x) atomic_load_explicit(&s->x, memory_order_relaxed)
    st->appends_ok = LD(appends_ok);
    st->events_ok = LD(events_ok);
    st->appends_failed = LD(appends_failed);
    st->append_retries = LD(retries);
    st->appends_direct = LD(direct_appends);
    st->append_lock_timeouts = LD(lock_timeouts);
    st->append_lost_retries = LD(lost_retries);
    st->appends_pending = LD(acked) - LD(covered);
    st->inflight = LD(inflight);
    st->finalize_runs = LD(fin_runs);
    st->finalize_piggybacked = LD(fin_piggy);
    st->finalize_skipped = LD(fin_skipped);
    st->finalize_idle_runs = LD(fin_idle);
    st->finalize_busy = LD(fin_busy);
    st->finalize_errors = LD(fin_errors);
    st->appends_finalized = LD(fin_appends);
    st->events_finalized = LD(fin_events);
    st->last_index = LD(last_index);
    hist_read(&s->delay, &st->delay_count, &st->delay_p50_ms, &st->delay_p99_ms, &st->delay_max_ms,
              reset);
    hist_read(&s->run, &st->run_count, &st->run_p50_ms, &st->run_p99_ms, &st->run_max_ms, reset);
    int64_t c;
    hist_read(&s->append_lat, &c, &st->append_p50_ms, &st->append_p99_ms, &st->append_max_ms,
              reset);
    st->finalizer_interval_ms = (double)LD(fin_interval_ns) / 1e6;
    st->finalizer_run_avg_ms = (double)LD(run_avg_ns) / 1e6;
    st->append_latency_avg_ms = (double)LD(lat_avg_ns) / 1e6;
    st->read_retries = LD(rd_retries);
    st->read_reconnects = LD(rd_reconnects);
    st->read_gaps = LD(rd_gaps);
    st->notifications = LD(notifies);
    st->index_queries = LD(index_queries);
    st->own_notifications = LD(notifies_own);
    st->standby_replay_delay_ms = -1;
    if (s->sb)
        pawl__standby_stats(s->sb, &st->standby_reads, &st->standby_fallback_reads,
                            &st->standby_episodes, &st->standby_fallback_active,
                            &st->standby_replay_delay_ms);
    st->append_groups = LD(groups_ok);
    st->append_groups_appends = LD(groups_appends);
#undef LD
}
