/*
 * cmd_run.c — `pawl run`: one node of a processor against the PostgreSQL log and token store,
 * with a built-in handler (count; print and exec, which write outside the database and store a
 * token only once their output is out: tools/handler_sink.h). With --metrics-port it serves
 * the library's metrics, the store's, and
 * per-segment figures (token, lag in events and seconds, held here) sampled by the main loop
 * about once a second, plus /healthz and /readyz (ready: the token store answered within the
 * last 10 s and this node holds a segment or some segment is free to claim).
 * Runs until interrupted (SIGINT/SIGTERM), then stops cleanly: every work package stores its
 * progress and releases its claim. While it runs, a progress line shows the handling rate, the
 * segments held and how far the processor is behind the head (with an ETA while catching up).
 */
#include "progress.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "handler_sink.h"
#include "httpd.h"
#include "status.h"

struct builtin {
    _Atomic int64_t handled;
    _Atomic int64_t replays;
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

/*
 * What the metrics endpoint shows beyond the library's registry. The per-segment part is
 * rendered by the main loop (it needs the token store and a scan of the log) into seg_text; a
 * scrape copies it under mu.
 */
struct run_view {
    struct pawl_processor *p;
    struct pawl_store *store;
    struct tool_sink *sink;
    const char *proc;
    pthread_mutex_t mu;
    char *seg_text;     /* owned, under mu */
    int64_t last_ok_ns; /* when the token store last answered; under mu */
    int claimable;      /* some segment is unowned or its claim expired; under mu */
    char last_err[160]; /* under mu */
};

static size_t run_metrics(void *ud, char *buf, size_t cap)
{
    struct run_view *v = ud;
    struct pawl_processor_stats ps;
    pawl_processor_stats(v->p, &ps);
    size_t used = tool_store_metrics(v->store, buf, cap);
    char tmp[2048];
    int n = snprintf(
        tmp, sizeof tmp,
        "# HELP pawl_processor_steps_total Package steps run by the segment workers\n"
        "# TYPE pawl_processor_steps_total counter\n"
        "pawl_processor_steps_total{processor=\"%s\"} %" PRIu64 "\n"
        "# HELP pawl_processor_steps_stolen_total Steps taken from another worker's queue\n"
        "# TYPE pawl_processor_steps_stolen_total counter\n"
        "pawl_processor_steps_stolen_total{processor=\"%s\"} %" PRIu64 "\n"
        "# HELP pawl_processor_steps_kept_total Bursts of steps a worker kept to itself rather "
        "than wake a parked worker\n"
        "# TYPE pawl_processor_steps_kept_total counter\n"
        "pawl_processor_steps_kept_total{processor=\"%s\"} %" PRIu64 "\n",
        v->proc, ps.steps, v->proc, ps.steps_stolen, v->proc, ps.steps_kept);
    size_t add = tool_httpd_extra_text(buf ? buf + used : NULL, cap > used ? cap - used : 0, tmp, n,
                                       sizeof tmp);
    used += add;
    if (v->sink) {
        struct tool_sink_stats ss;
        tool_sink_stats(v->sink, &ss);
        n = snprintf(tmp, sizeof tmp,
                     "# HELP pawl_handler_output_lines_total Event lines the print or exec "
                     "handler wrote out\n"
                     "# TYPE pawl_handler_output_lines_total counter\n"
                     "pawl_handler_output_lines_total{processor=\"%s\"} %" PRIu64 "\n"
                     "# HELP pawl_handler_output_failures_total Batches whose output failed "
                     "(write error; exec: exit, negative or malformed ack, time-out)\n"
                     "# TYPE pawl_handler_output_failures_total counter\n"
                     "pawl_handler_output_failures_total{processor=\"%s\"} %" PRIu64 "\n"
                     "# HELP pawl_handler_exec_starts_total Commands the exec handler started\n"
                     "# TYPE pawl_handler_exec_starts_total counter\n"
                     "pawl_handler_exec_starts_total{processor=\"%s\"} %" PRIu64 "\n",
                     v->proc, ss.lines_out, v->proc, ss.failures, v->proc, ss.starts);
        used += tool_httpd_extra_text(buf ? buf + used : NULL, cap > used ? cap - used : 0, tmp, n,
                                      sizeof tmp);
    }
    pthread_mutex_lock(&v->mu);
    if (v->seg_text) {
        size_t len = strlen(v->seg_text);
        if (buf && cap > used + len)
            memcpy(buf + used, v->seg_text, len + 1);
        used += len;
    }
    pthread_mutex_unlock(&v->mu);
    return used;
}

static int run_ready(void *ud, char *why, size_t whylen)
{
    struct run_view *v = ud;
    struct pawl_processor_stats ps;
    pawl_processor_stats(v->p, &ps);
    pthread_mutex_lock(&v->mu);
    int64_t age_ms = v->last_ok_ns ? (pawl_now_ns() - v->last_ok_ns) / 1000000 : -1;
    int claimable = v->claimable;
    char err[sizeof v->last_err];
    memcpy(err, v->last_err, sizeof err);
    pthread_mutex_unlock(&v->mu);
    if (age_ms < 0 || age_ms > 10000) {
        snprintf(why, whylen, "not ready: the token store has not answered %s%s%s",
                 age_ms < 0 ? "yet" : "for over 10 s", err[0] ? ": " : "", err);
        return 0;
    }
    if (ps.segments_owned == 0 && !claimable) {
        snprintf(why, whylen,
                 "not ready: holds no segment and every segment is held by another "
                 "node");
        return 0;
    }
    snprintf(why, whylen, "ready: holds %u segment%s", ps.segments_owned,
             ps.segments_owned == 1 ? "" : "s");
    return 1;
}

/* Sample the segments (tokens, lag) for the endpoint; main thread. */
static void run_sample(struct run_view *v, struct pawl_tokens *tok, struct pawl_source *src,
                       int64_t claim_timeout_ms)
{
    struct tool_status st;
    char err[256] = "";
    int rc = tool_status_collect(tok, src, v->proc, 100000, &st, err, sizeof err);
    if (rc != 0) {
        pthread_mutex_lock(&v->mu);
        snprintf(v->last_err, sizeof v->last_err, "%.150s", err[0] ? err : pawl_strerror(rc));
        pthread_mutex_unlock(&v->mu);
        return;
    }
    st.claim_timeout_ms = claim_timeout_ms;
    const char *me = pawl_processor_node_id(v->p);
    size_t cap = 1024 + st.n * 4 * 160, len = 0;
    char *t = malloc(cap);
    int claimable = 0;
    if (t) {
        len += (size_t)snprintf(
            t + len, cap - len,
            "# HELP pawl_processor_segment_token Stored token of the segment (events up to it "
            "are handled)\n# TYPE pawl_processor_segment_token gauge\n");
        for (size_t i = 0; i < st.n; i++)
            len += (size_t)snprintf(t + len, cap - len,
                                    "pawl_processor_segment_token{processor=\"%s\",segment=\"%u\","
                                    "mask=\"%u\"} %" PRId64 "\n",
                                    v->proc, st.rows[i].st.seg.id, st.rows[i].st.seg.mask,
                                    st.rows[i].st.token);
        len += (size_t)snprintf(
            t + len, cap - len,
            "# HELP pawl_processor_segment_lag_events Events of the segment after its token (an "
            "upper bound, head - token, beyond a scan of 100000 events)\n"
            "# TYPE pawl_processor_segment_lag_events gauge\n");
        for (size_t i = 0; i < st.n; i++)
            len += (size_t)snprintf(t + len, cap - len,
                                    "pawl_processor_segment_lag_events{processor=\"%s\",segment="
                                    "\"%u\",mask=\"%u\"} %" PRId64 "\n",
                                    v->proc, st.rows[i].st.seg.id, st.rows[i].st.seg.mask,
                                    st.rows[i].lag_events);
        len += (size_t)snprintf(
            t + len, cap - len,
            "# HELP pawl_processor_segment_lag_seconds Age of the segment's oldest unhandled "
            "event (0 when caught up)\n# TYPE pawl_processor_segment_lag_seconds gauge\n");
        for (size_t i = 0; i < st.n; i++)
            len += (size_t)snprintf(t + len, cap - len,
                                    "pawl_processor_segment_lag_seconds{processor=\"%s\",segment="
                                    "\"%u\",mask=\"%u\"} %.3f\n",
                                    v->proc, st.rows[i].st.seg.id, st.rows[i].st.seg.mask,
                                    st.rows[i].lag_seconds);
        len += (size_t)snprintf(t + len, cap - len,
                                "# HELP pawl_processor_segment_held_here 1 while this node holds "
                                "the segment's claim\n"
                                "# TYPE pawl_processor_segment_held_here gauge\n");
        for (size_t i = 0; i < st.n; i++)
            len += (size_t)snprintf(t + len, cap - len,
                                    "pawl_processor_segment_held_here{processor=\"%s\",segment="
                                    "\"%u\",mask=\"%u\"} %d\n",
                                    v->proc, st.rows[i].st.seg.id, st.rows[i].st.seg.mask,
                                    strcmp(st.rows[i].st.owner, me) == 0);
    }
    for (size_t i = 0; i < st.n; i++)
        if (st.rows[i].st.owner[0] == '\0' || tool_status_claim_expired(&st, &st.rows[i].st))
            claimable = 1;
    tool_status_fini(&st);
    pthread_mutex_lock(&v->mu);
    if (t) {
        free(v->seg_text);
        v->seg_text = t;
    }
    v->last_ok_ns = pawl_now_ns();
    v->claimable = claimable;
    v->last_err[0] = '\0';
    pthread_mutex_unlock(&v->mu);
}

int cmd_run(struct tool_config *cfg, int argc, const char *const *argv)
{
    const char *hname0 = cfg->tool.handler ? cfg->tool.handler : "count";
    if (argc > 0 && strcmp(hname0, "exec") != 0) {
        tool_err("run: unexpected argument '%s' (a command after -- is for --handler exec)",
                 argv[0]);
        return TOOL_USAGE;
    }
    if (cfg->lib.processor.name == NULL) {
        tool_err("run: which processor? give --processor NAME (or PAWL_PROCESSOR)");
        return TOOL_USAGE;
    }
    const char *hname = cfg->tool.handler ? cfg->tool.handler : "count";
    struct builtin b;
    memset(&b, 0, sizeof b);
    struct pawl_handler h = {.name = hname, .self = &b, .handle = handle_count};
    /* print and exec: the counting handler, then the sink's unit (auto mode). */
    struct pawl_handler hs[2] = {h, h};
    size_t nh = 1;
    struct tool_sink *sink = NULL;
    const char **xargv = NULL;
    struct pawl_store *store = NULL;
    struct pawl_source *src = NULL;
    struct pawl_tokens *tok = NULL;
    struct pawl_processor *p = NULL;
    struct tool_httpd *httpd = NULL;
    struct run_view view = {.proc = cfg->lib.processor.name};
    pthread_mutex_init(&view.mu, NULL);
    int ex = TOOL_OK;
    if (strcmp(hname, "count") == 0) {
        /* the default above */
    } else if (strcmp(hname, "print") == 0 || strcmp(hname, "exec") == 0) {
        int exec = strcmp(hname, "exec") == 0;
        if (exec && argc == 0) {
            tool_err("run: --handler exec needs a command: pawl run --processor NAME --handler "
                     "exec -- CMD [ARGS...]");
            ex = TOOL_USAGE;
            goto out;
        }
        xargv = calloc((size_t)argc + 1, sizeof *xargv);
        if (xargv == NULL) {
            ex = TOOL_FAILED;
            goto out;
        }
        for (int i = 0; i < argc; i++)
            xargv[i] = argv[i];
        struct tool_sink_opts so = {
            .kind = exec ? TOOL_SINK_EXEC : TOOL_SINK_PRINT,
            .fd = STDOUT_FILENO,
            .fsync = cfg->tool.output_fsync,
            .argv = xargv,
            .ack_timeout_ms = cfg->tool.exec_ack_timeout_ms,
            .processor = cfg->lib.processor.name,
            .pass_secrets = cfg->tool.exec_pass_secrets,
        };
        char serr0[256] = "";
        if (tool_sink_new(&sink, &so, serr0, sizeof serr0) != 0) {
            tool_err("run: %s", serr0);
            ex = TOOL_FAILED;
            goto out;
        }
        fflush(stdout); /* the sink writes to the descriptor directly */
        hs[1] = tool_sink_handler(sink, hname);
        nh = 2;
    } else {
        tool_err("run: unknown handler '%s' (count, print, exec)", hname);
        ex = TOOL_USAGE;
        goto out;
    }

    if (nh == 1)
        hs[0] = h;
    if (cfg->lib.processor.dead_letter_attempts > 0 && strcmp(hname, "exec") != 0) {
        /* count and print never fail an event, so nothing could ever be parked. */
        tool_log(PAWL_LOG_WARN, NULL, 0,
                 "warning: --dead-letter-attempts %u has no effect with --handler %s, which "
                 "never fails an event (only --handler exec can: its command answers `fail "
                 "INDEX REASON` or `poison INDEX REASON`)",
                 cfg->lib.processor.dead_letter_attempts, hname);
    }
    const char *dsn = tool_dsn(cfg);
    char err[256];
    int rc;
    if (dsn == NULL) {
        ex = TOOL_NODB;
        goto out;
    }
    /* The log store with the store flags (--finalizer 0 for a role that may not finalize,
     * --connections, ...), read through a source over it. */
    char serr[512] = "";
    if ((rc = pawl_store_new(&store, dsn, &cfg->lib.store, serr, sizeof serr)) != 0 ||
        (rc = pawl_source_pg_from_store(&src, store, dsn)) != 0 ||
        (rc = pawl_tokens_pg_new(&tok, dsn)) != 0) {
        tool_err("run: cannot open the log and token store at %s: %s%s%s%s",
                 tool_dsn_printable(dsn), pawl_strerror(rc), serr[0] ? ": " : "", serr,
                 rc == PAWL_ESCHEMA ? " (run `pawl init` first)" : "");
        ex = rc == PAWL_ESCHEMA ? TOOL_NOTFOUND : rc == PAWL_ECONN ? TOOL_NODB : TOOL_FAILED;
        goto out;
    }
    if ((rc = pawl_processor_new(&p, &cfg->lib.processor, src, tok, hs, nh)) != 0) {
        tool_err("run: cannot create processor %s: %s (%s)", cfg->lib.processor.name,
                 pawl_strerror(rc), pawl_tokens_errmsg(tok, (char[512]){0}, 512));
        ex = tool_exit_for(rc);
        goto out;
    }
    if (sink) {
        tool_sink_set_node(sink, pawl_processor_node_id(p));
        tool_sink_set_processor(sink, p);
    }
    view.p = p;
    view.store = store;
    view.sink = sink;
    if (cfg->metrics_port > 0) {
        if (tool_httpd_start(&httpd, cfg->metrics_port, run_metrics, &view, err, sizeof err) != 0) {
            tool_err("run: %s", err);
            ex = TOOL_FAILED;
            goto out;
        }
        tool_httpd_set_ready(httpd, run_ready, &view);
        fprintf(stderr, "pawl: metrics at http://127.0.0.1:%d/metrics\n", cfg->metrics_port);
    }
    if ((rc = pawl_processor_start(p)) != 0) {
        tool_err("run: cannot start: %s", pawl_strerror(rc));
        ex = tool_exit_for(rc);
        goto out;
    }
    fprintf(stderr, "pawl: running processor %s as node %s with handler %s (Ctrl-C stops)\n",
            cfg->lib.processor.name, pawl_processor_node_id(p), hname);

    struct tool_progress prog;
    tool_progress_init(&prog, cfg);
    uint64_t last_events = 0;
    int64_t last_ns = pawl_now_ns();
    int64_t next_sample_ns = 0;
    while (!tool_stop) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
        if (httpd && pawl_now_ns() >= next_sample_ns) {
            run_sample(&view, tok, src, cfg->lib.processor.claim_timeout_ms);
            next_sample_ns = pawl_now_ns() + 1000000000LL;
        }
        if (!tool_progress_due(&prog))
            continue;
        struct pawl_processor_stats ps;
        pawl_processor_stats(p, &ps);
        int64_t now = pawl_now_ns();
        double rate = (double)(ps.events - last_events) * 1e9 / (double)PAWL_MAX(now - last_ns, 1);
        last_events = ps.events;
        last_ns = now;
        int64_t head = 0, low = lowest_token(tok, cfg->lib.processor.name);
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
    /* The sink's thread completes checkpoint futures: it stops after the processor (every
     * segment released) and before the processor's pool is freed (pawl/checkpoint.h). */
    tool_sink_free(sink);
    pawl_processor_free(p);
    free(xargv);
    free(view.seg_text);
    pthread_mutex_destroy(&view.mu);
    pawl_tokens_free(tok);
    pawl_source_free(src);
    pawl_store_free(store);
    return ex;
}
