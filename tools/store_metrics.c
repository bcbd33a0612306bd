/*
 * store_metrics.c — the log store's own figures for the metrics endpoint, after the library's
 * registry (pawl/metrics.h). Only what the registry does not already export: the finalizer's
 * runs, busy runs, finalized events, last index and finalize delay are registry families
 * (pawl_finalize_runs_total, pawl_finalize_lock_busy_total, pawl_events_finalized_total,
 * pawl_last_finalized_index, pawl_finalize_delay_seconds), so they are not repeated here under
 * a second name. Shared by every command that opens a store and serves metrics.
 */
#include "httpd.h"
#include "tool.h"

#include <inttypes.h>
#include <stdio.h>

size_t tool_store_metrics(void *ud, char *buf, size_t cap)
{
    struct pawl_store *s = ud;
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    char tmp[4096];
    int n = snprintf(
        tmp, sizeof tmp,
        "# HELP pawl_store_appends_pending Appends committed here and not yet finalized\n"
        "# TYPE pawl_store_appends_pending gauge\npawl_store_appends_pending %" PRId64 "\n"
        "# HELP pawl_store_finalize_errors_total Finalization runs of this process that failed\n"
        "# TYPE pawl_store_finalize_errors_total counter\n"
        "pawl_store_finalize_errors_total %" PRId64 "\n"
        "# HELP pawl_store_finalizer_interval_seconds Current interval between finalization runs\n"
        "# TYPE pawl_store_finalizer_interval_seconds gauge\n"
        "pawl_store_finalizer_interval_seconds %.6f\n"
        "# HELP pawl_store_append_retries_total Appends run again after a deadlock, a "
        "serialization failure or a race for a stream's next number\n"
        "# TYPE pawl_store_append_retries_total counter\n"
        "pawl_store_append_retries_total %" PRId64 "\n",
        st.appends_pending, st.finalize_errors, st.finalizer_interval_ms / 1e3, st.append_retries);
    if (n > 0 && (size_t)n < sizeof tmp &&
        (st.standby_reads > 0 || st.standby_episodes > 0 || st.standby_replay_delay_ms >= 0))
        n += snprintf(
            tmp + n, sizeof tmp - (size_t)n,
            "# HELP pawl_store_standby_replay_delay_seconds The standby's replay delay at its "
            "last check (0: it replayed all it received; -1: unknown)\n"
            "# TYPE pawl_store_standby_replay_delay_seconds gauge\n"
            "pawl_store_standby_replay_delay_seconds %.6f\n"
            "# HELP pawl_store_standby_reads_total Reads answered by the standby (--read-dsn)\n"
            "# TYPE pawl_store_standby_reads_total counter\n"
            "pawl_store_standby_reads_total %" PRId64 "\n"
            "# HELP pawl_store_standby_fallback_reads_total Reads the primary answered in the "
            "standby's stead\n"
            "# TYPE pawl_store_standby_fallback_reads_total counter\n"
            "pawl_store_standby_fallback_reads_total %" PRId64 "\n"
            "# HELP pawl_store_standby_episodes_total Times the standby was behind, unreachable "
            "or not in recovery\n"
            "# TYPE pawl_store_standby_episodes_total counter\n"
            "pawl_store_standby_episodes_total %" PRId64 "\n"
            "# HELP pawl_store_standby_fallback 1 while reads go to the primary instead\n"
            "# TYPE pawl_store_standby_fallback gauge\npawl_store_standby_fallback %d\n",
            st.standby_replay_delay_ms < 0 ? -1.0 : st.standby_replay_delay_ms / 1e3,
            st.standby_reads, st.standby_fallback_reads, st.standby_episodes,
            st.standby_fallback_active);
    return tool_httpd_extra_text(buf, cap, tmp, n, sizeof tmp);
}
