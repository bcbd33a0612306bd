/*
 * cmd_run.c — `pawl run`: one node of a processor against the PostgreSQL log and token store,
 * with a built-in handler (count, print) or one of the checkpoint examples (projection, async).
 * Runs until interrupted (SIGINT/SIGTERM), then stops cleanly: every work package stores its
 * progress and releases its claim. While it runs, a progress line shows the handling rate, the
 * segments held and how far the processor is behind the head (with an ETA while catching up).
 */
#include "progress.h"

#include "async_sink.h"
#include "projection.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "httpd.h"
#include "jsonl.h"

struct builtin {
    _Atomic int64_t handled;
    _Atomic int64_t replays;
    pthread_mutex_t out_mu; /* one printed line at a time */
};

static int handle_count(void *self, struct pawl_event_ctx *ctx)
{
    struct builtin *b = self;
    /* Relaxed: a statistic read by the progress line only. */
    atomic_fetch_add_explicit(&b->handled, 1, memory_order_relaxed);
    if (pawl_ctx_is_replay(ctx))
        atomic_fetch_add_explicit(&b->replays, 1, memory_order_relaxed);
    return 0;
}

static int handle_print(void *self, struct pawl_event_ctx *ctx)
{
    struct builtin *b = self;
    handle_count(self, ctx);
    pthread_mutex_lock(&b->out_mu);
    if (pawl_ctx_is_replay(ctx))
        fputs("(replay) ", stdout);
    int rc = tool_jsonl_write(stdout, pawl_ctx_event(ctx));
    pthread_mutex_unlock(&b->out_mu);
    return rc;
}

/* Lowest token among the processor's segments, for "behind the head". */
static int64_t lowest_token(struct pawl_tokens *tok, const char *proc)
{
    struct pawl_segment_status *rows = NULL;
    size_t n = 0;
    if (tok->ops->list(tok, proc, &rows, &n) != 0 || n == 0) {
        pawl_tokens_rows_free(rows);
        return -1;
    }
    int64_t low = rows[0].token;
    for (size_t i = 1; i < n; i++)
        low = PAWL_MIN(low, rows[i].token);
    pawl_tokens_rows_free(rows);
    return low;
}

/* The metrics endpoint's figures beyond the library's counters: the segment workers' pool. */
static size_t run_metrics(void *ud, char *buf, size_t cap)
{
    struct pawl_processor_stats ps;
    pawl_processor_stats(ud, &ps);
    char tmp[1024];
    int n = snprintf(
        tmp, sizeof tmp,
        "# HELP pawl_processor_steps_total Package steps run by the segment workers\n"
        "# TYPE pawl_processor_steps_total counter\npawl_processor_steps_total %" PRIu64 "\n"
        "# HELP pawl_processor_steps_stolen_total Steps taken from another worker's queue\n"
        "# TYPE pawl_processor_steps_stolen_total counter\n"
        "pawl_processor_steps_stolen_total %" PRIu64 "\n"
        "# HELP pawl_processor_steps_kept_total Bursts of steps a worker kept to itself rather "
        "than wake a parked worker\n"
        "# TYPE pawl_processor_steps_kept_total counter\n"
        "pawl_processor_steps_kept_total %" PRIu64 "\n",
        ps.steps, ps.steps_stolen, ps.steps_kept);
    return tool_httpd_extra_text(buf, cap, tmp, n, sizeof tmp);
}

int cmd_run(struct pawl_config *cfg, int argc, const char *const *argv)
{
    if (argc > 0) {
        tool_err("run: unexpected argument '%s'", argv[0]);
        return TOOL_USAGE;
    }
    if (cfg->processor.name == NULL) {
        tool_err("run: which processor? give --processor NAME (or PAWL_PROCESSOR)");
        return TOOL_USAGE;
    }
    const char *hname = cfg->tool.handler ? cfg->tool.handler : "count";
    struct builtin b;
    memset(&b, 0, sizeof b);
    pthread_mutex_init(&b.out_mu, NULL);
    struct pawl_handler h = {.name = hname, .self = &b, .handle = handle_count};
    struct ex_projection *proj = NULL;
    struct ex_async *async = NULL;
    int ex = TOOL_OK;
    if (strcmp(hname, "count") == 0) {
        /* the default above */
    } else if (strcmp(hname, "print") == 0) {
        h.handle = handle_print;
    } else if (strcmp(hname, "projection") == 0) {
        char dir[128];
        snprintf(dir, sizeof dir, "pawl-projection-%s", cfg->processor.name);
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            tool_err("run: cannot create %s: %s", dir, strerror(errno));
            return TOOL_FAILED;
        }
        if (ex_projection_new(&proj, dir, 1000) != 0) {
            tool_err("run: cannot start the projection example");
            return TOOL_FAILED;
        }
        h = ex_projection_handler(proj, "projection");
        fprintf(stderr, "pawl: projection snapshots go to ./%s\n", dir);
    } else if (strcmp(hname, "async") == 0) {
        struct ex_async_opts ao = {.path = NULL, .threads = 2, .every = 1000};
        if (ex_async_new(&async, &ao) != 0) {
            tool_err("run: cannot start the asynchronous sink example");
            return TOOL_FAILED;
        }
        h = ex_async_handler(async, "async");
    } else {
        tool_err("run: unknown handler '%s' (count, print, projection, async)", hname);
        return TOOL_USAGE;
    }

    const char *dsn = tool_dsn(cfg);
    struct pawl_store *store = NULL;
    struct pawl_source *src = NULL;
    struct pawl_tokens *tok = NULL;
    struct pawl_processor *p = NULL;
    struct tool_httpd *httpd = NULL;
    char err[256];
    int rc;
    if (dsn == NULL) {
        ex = TOOL_NODB;
        goto out;
    }
    /* The log store with the store flags (--finalizer 0 for a role that may not finalize,
     * --connections, ...), read through a source over it. */
    char serr[512] = "";
    if ((rc = pawl_store_new(&store, dsn, &cfg->store, serr, sizeof serr)) != 0 ||
        (rc = pawl_source_pg_from_store(&src, store, dsn)) != 0 ||
        (rc = pawl_tokens_pg_new(&tok, dsn)) != 0) {
        tool_err("run: cannot open the log and token store at %s: %s%s%s%s",
                 tool_dsn_printable(dsn), pawl_strerror(rc), serr[0] ? ": " : "", serr,
                 rc == PAWL_ESCHEMA ? " (run `pawl init` first)" : "");
        ex = rc == PAWL_ESCHEMA ? TOOL_NOTFOUND : rc == PAWL_ECONN ? TOOL_NODB : TOOL_FAILED;
        goto out;
    }
    if ((rc = pawl_processor_new(&p, &cfg->processor, src, tok, &h, 1)) != 0) {
        tool_err("run: cannot create processor %s: %s (%s)", cfg->processor.name, pawl_strerror(rc),
                 tok->ops->errmsg(tok));
        ex = tool_exit_for(rc);
        goto out;
    }
    if (cfg->metrics_port > 0 &&
        tool_httpd_start(&httpd, cfg->metrics_port, run_metrics, p, err, sizeof err) != 0) {
        tool_err("run: %s", err);
        ex = TOOL_FAILED;
        goto out;
    }
    if ((rc = pawl_processor_start(p)) != 0) {
        tool_err("run: cannot start: %s", pawl_strerror(rc));
        ex = tool_exit_for(rc);
        goto out;
    }
    fprintf(stderr, "pawl: running processor %s as node %s with handler %s (Ctrl-C stops)\n",
            cfg->processor.name, pawl_processor_node_id(p), hname);

    struct tool_progress prog;
    tool_progress_init(&prog, cfg);
    uint64_t last_events = 0;
    int64_t last_ns = pawl_now_ns();
    while (!tool_stop) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
        if (!tool_progress_due(&prog))
            continue;
        struct pawl_processor_stats ps;
        pawl_processor_stats(p, &ps);
        int64_t now = pawl_now_ns();
        double rate = (double)(ps.events - last_events) * 1e9 / (double)PAWL_MAX(now - last_ns, 1);
        last_events = ps.events;
        last_ns = now;
        int64_t head = 0, low = lowest_token(tok, cfg->processor.name);
        src->ops->head(src, &head);
        int64_t behind = low >= 0 && head > low ? head - low : 0;
        char r[32], done[32], eta[32];
        tool_fmt_secs(rate > 0 && behind > 0 ? (double)behind / rate : (behind ? -1 : 0), eta,
                      sizeof eta);
        tool_progress_show(&prog,
                           "%s events/s  handled %s  segments %u  head %" PRId64
                           "  behind <= %" PRId64 "  ETA %s  failures %" PRIu64,
                           tool_fmt_count(rate, r, sizeof r),
                           tool_fmt_count((double)ps.events, done, sizeof done), ps.segments_owned,
                           head, behind, eta, ps.batch_failures);
    }
    tool_progress_done(&prog);
    fprintf(stderr, "pawl: stopping (finishing batches, storing progress, releasing claims)\n");
    pawl_processor_stop(p);
    struct pawl_processor_stats ps;
    pawl_processor_stats(p, &ps);
    fprintf(stderr,
            "pawl: stopped: %" PRIu64 " events in %" PRIu64 " batches, %" PRIu64
            " failed batches, %" PRId64 " replayed events\n",
            ps.events, ps.batches, ps.batch_failures,
            atomic_load_explicit(&b.replays, memory_order_relaxed));
out:
    tool_httpd_stop(httpd);
    pawl_processor_free(p);
    pawl_tokens_free(tok);
    pawl_source_free(src);
    pawl_store_free(store);
    ex_projection_free(proj);
    ex_async_free(async);
    pthread_mutex_destroy(&b.out_mu);
    return ex;
}
