/*
 * pawl/metrics.h — process-wide counters, gauges and latency histograms, read as a snapshot.
 *
 * Every pawl module records into one process-wide registry (the modules' recording calls are
 * private; a program adds its own reads with pawl_metrics_counter_add and
 * pawl_metrics_hist_observe). An embedder reads it with pawl_metrics_snapshot(), derives
 * interval figures with pawl_metrics_diff(), percentiles with pawl_metrics_quantile_ns(), and
 * renders the Prometheus text exposition format with pawl_metrics_format_prometheus(). Two pawl
 * stores in one process add into the same figures.
 *
 * Histograms are log-linear: 16 buckets per power of two of nanoseconds, so any percentile read
 * from a snapshot is within 1/16 (6.25 %) of a value actually recorded; values from 0 ns to about
 * 36 minutes are kept exactly in that sense, larger ones land in the last bucket (max_ns is exact).
 *
 * Threads: recording is lock-free and allocation-free from any thread. A snapshot may be taken
 * from any thread at any time; it reads each cell atomically but not all cells at one instant, so
 * a figure may run one or two records ahead of another (a histogram's count and sum, say).
 */
#ifndef PAWL_METRICS_H
#define PAWL_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "pawl/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Counters (monotonic): X(id, prometheus name, help). */
#define PAWL_METRIC_COUNTERS(X)                                                                    \
    X(PAWL_M_APPENDS, "pawl_appends_total", "Append calls committed")                              \
    X(PAWL_M_EVENTS_APPENDED, "pawl_events_appended_total", "Events in committed appends")         \
    X(PAWL_M_APPEND_ERRORS, "pawl_append_errors_total", "Append calls that failed")                \
    X(PAWL_M_FINALIZE_RUNS, "pawl_finalize_runs_total", "Finalizer runs that committed")           \
    X(PAWL_M_EVENTS_FINALIZED, "pawl_events_finalized_total", "Events given their final index")    \
    X(PAWL_M_FINALIZE_LOCK_BUSY, "pawl_finalize_lock_busy_total",                                  \
      "Finalizer runs that found the lock held elsewhere")                                         \
    X(PAWL_M_EVENTS_READ, "pawl_events_read_total", "Events read by readers and processors")       \
    X(PAWL_M_READ_RETRIES, "pawl_read_retries_total",                                              \
      "Reads run again after their connection was lost")                                           \
    X(PAWL_M_READ_GAPS, "pawl_read_gaps_total",                                                    \
      "Episodes of a known highest index ahead of what the log returned")                          \
    X(PAWL_M_EVENTS_HANDLED, "pawl_events_handled_total", "Events handed to handlers")             \
    X(PAWL_M_BATCHES, "pawl_batches_total", "Processor batches committed")                         \
    X(PAWL_M_BATCH_ROLLBACKS, "pawl_batch_rollbacks_total", "Processor batches rolled back")       \
    X(PAWL_M_CHECKPOINTS, "pawl_checkpoints_stored_total", "Segment tokens stored")                \
    X(PAWL_M_CLAIMS_ACQUIRED, "pawl_claims_acquired_total", "Segment claims acquired")             \
    X(PAWL_M_CLAIMS_RELEASED, "pawl_claims_released_total", "Segment claims released")             \
    X(PAWL_M_CLAIMS_LOST, "pawl_claims_lost_total", "Segment claims lost to another node")         \
    X(PAWL_M_BACKOFFS, "pawl_backoffs_total", "Segment back-offs after a failure")                 \
    X(PAWL_M_HANDLER_ERRORS, "pawl_handler_errors_total", "Handler or checkpoint failures")        \
    X(PAWL_M_DEAD_LETTERS, "pawl_dead_letters_parked_total",                                       \
      "Events parked as dead letters (committed)")                                                 \
    X(PAWL_M_DEAD_LETTERS_RETRIED, "pawl_dead_letters_retried_total",                              \
      "Dead letters handled by a retry that committed")

/* Gauges (go up and down, or are set): X(id, prometheus name, help). */
#define PAWL_METRIC_GAUGES(X)                                                                      \
    X(PAWL_G_CLAIMS_HELD, "pawl_claims_held", "Segments this process holds a claim on")            \
    X(PAWL_G_APPENDS_IN_FLIGHT, "pawl_appends_in_flight", "Appends sent and not yet answered")     \
    X(PAWL_G_LAST_FINALIZED_INDEX, "pawl_last_finalized_index",                                    \
      "Highest final index this process has seen finalized")                                       \
    X(PAWL_G_DEAD_STREAMS, "pawl_dead_letter_streams",                                             \
      "Parked streams in the segments this process holds")

/* Latency histograms, all in nanoseconds: X(id, prometheus name, help). */
#define PAWL_METRIC_HISTS(X)                                                                       \
    X(PAWL_H_APPEND_LATENCY, "pawl_append_latency_seconds", "Append call to commit acknowledged")  \
    X(PAWL_H_FINALIZE_DELAY, "pawl_finalize_delay_seconds",                                        \
      "Append commit to the event's final index committed")                                        \
    X(PAWL_H_FINALIZE_RUN, "pawl_finalize_run_seconds", "Duration of one finalizer run")           \
    X(PAWL_H_E2E_LAG, "pawl_end_to_end_lag_seconds", "Append commit to the handler receiving it")  \
    X(PAWL_H_BATCH_TIME, "pawl_batch_seconds", "One processor batch, first event to commit")       \
    X(PAWL_H_CHECKPOINT_WAIT, "pawl_checkpoint_wait_seconds",                                      \
      "Commit cycle: checkpoint request to all units agreeing")

enum pawl_metric_counter {
#define PAWL_METRIC_ENUM_(id, name, help) id,
    PAWL_METRIC_COUNTERS(PAWL_METRIC_ENUM_) PAWL_M__COUNT
};
enum pawl_metric_gauge { PAWL_METRIC_GAUGES(PAWL_METRIC_ENUM_) PAWL_G__COUNT };
enum pawl_metric_hist {
    PAWL_METRIC_HISTS(PAWL_METRIC_ENUM_) PAWL_H__COUNT
#undef PAWL_METRIC_ENUM_
};

/* Histogram geometry: 16 linear buckets below 16 ns, then 16 per power of two up to 2^42 ns. */
#define PAWL_METRICS_SUB_BITS 4
#define PAWL_METRICS_MAX_EXP 41
#define PAWL_METRICS_BUCKETS                                                                       \
    ((1 << PAWL_METRICS_SUB_BITS) * (PAWL_METRICS_MAX_EXP - PAWL_METRICS_SUB_BITS + 2))

struct pawl_metrics_hist {
    uint64_t count;
    uint64_t sum_ns;
    uint64_t max_ns; /* the largest value recorded since start (not reduced by a diff) */
    uint64_t buckets[PAWL_METRICS_BUCKETS];
};

/* Caller storage (about 30 KiB: allocate it, do not put it on a small stack). */
struct pawl_metrics_snapshot {
    int64_t taken_ns; /* pawl_now_ns() when the snapshot was taken */
    uint64_t counters[PAWL_M__COUNT];
    int64_t gauges[PAWL_G__COUNT];
    struct pawl_metrics_hist hists[PAWL_H__COUNT];
};

/* Fill out with the current figures. PAWL_EINVAL if out is NULL. */
PAWL_API int pawl_metrics_snapshot(struct pawl_metrics_snapshot *out);

/*
 * out = now - before, for rates and percentiles over an interval. Gauges and max_ns are taken
 * from now. out may alias now. PAWL_EINVAL on NULL arguments.
 */
PAWL_API int pawl_metrics_diff(struct pawl_metrics_snapshot *out,
                               const struct pawl_metrics_snapshot *now,
                               const struct pawl_metrics_snapshot *before);

/*
 * The q-quantile (0 <= q <= 1) of h in nanoseconds: the midpoint of the bucket holding it,
 * clamped to max_ns; 0 when h is empty.
 */
PAWL_API int64_t pawl_metrics_quantile_ns(const struct pawl_metrics_hist *h, double q);

/* Names and help texts; static strings, "?" for an id out of range. */
PAWL_API const char *pawl_metrics_counter_name(enum pawl_metric_counter id);
PAWL_API const char *pawl_metrics_gauge_name(enum pawl_metric_gauge id);
PAWL_API const char *pawl_metrics_hist_name(enum pawl_metric_hist id);
PAWL_API const char *pawl_metrics_counter_help(enum pawl_metric_counter id);
PAWL_API const char *pawl_metrics_gauge_help(enum pawl_metric_gauge id);
PAWL_API const char *pawl_metrics_hist_help(enum pawl_metric_hist id);

/*
 * Render s in the Prometheus text exposition format (version 0.0.4) into buf. Histograms are
 * exported with fixed `le` bounds from 10 µs to 60 s (each fine bucket counted under the first
 * bound at or above its upper edge, so a bound may undercount by at most one fine bucket width).
 * *len receives the length the full text needs, without the NUL. Returns 0, or PAWL_ETOOBIG when
 * cap is too small (buf then holds a NUL-terminated prefix; call again with *len + 1 bytes).
 */
PAWL_API int pawl_metrics_format_prometheus(const struct pawl_metrics_snapshot *s, char *buf,
                                            size_t cap, size_t *len);

/* Zero every figure. For tests and tools; records racing with it may be lost or kept. */
PAWL_API void pawl_metrics_reset(void);

/*
 * Add to the figures from outside the library: a program that reads events itself (pawl_read,
 * pawl_follow) rather than through a processor counts them as processors do, so the registry
 * says the same whichever way it reads. pawl_metrics_counter_add adds n to a counter;
 * pawl_metrics_hist_observe records one value in nanoseconds (a negative value, clock skew
 * between hosts, records as 0). Lock-free and allocation-free, any thread. PAWL_EINVAL for an id
 * out of range (nothing recorded).
 */
PAWL_API int pawl_metrics_counter_add(enum pawl_metric_counter id, uint64_t n);
PAWL_API int pawl_metrics_hist_observe(enum pawl_metric_hist id, int64_t ns);

#ifdef __cplusplus
}
#endif
#endif
