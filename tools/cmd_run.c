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
 *
 * Stopping. pawl_processor_stop runs on a thread of its own while the main thread watches it:
 * now and then it says what the stop waits for (pawl_processor_activity, and the exec sink's
 * commands with their deadlines), and it gives the stop up (exit TOOL_ABANDONED, saying which
 * claims are left to expire after --claim-timeout, the exec commands sent SIGTERM) on a second
 * signal (main.c ignores a repeat within a second) or when the database has not answered for
 * --stop-db-wait: a probe connection tells, as the stop's own calls would wait out the store's
 * queue time-out each. While stopping, the store's reports of reconnects and retries are left
 * out of the log (run_log_sink): the stop's report says whether the database answers.
 */
#include "filter_opt.h"
#include "position.h"
#include "progress.h"

#include <errno.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <poll.h>
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
        low = TOOL_MIN(low, rows[i].token);
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
    char *seg_text;                   /* owned, under mu */
    int64_t last_ok_ns;               /* when the token store last answered; under mu */
    int claimable;                    /* some segment is unowned or its claim expired; under mu */
    char last_err[160];               /* under mu */
    const struct tool_filter *filter; /* the processor's filter (given 0: none) */
};

/* A filter list as a Prometheus label value ("a,b"; backslash, quote and newline escaped). */
static void label_list(const char *const *v, size_t n, char *out, size_t len)
{
    size_t at = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        for (const char *c = i ? "," : ""; *c && at + 1 < len; c++)
            out[at++] = *c;
        for (const char *c = v[i]; *c && at + 2 < len; c++) {
            if (*c == '\\' || *c == '"' || *c == '\n') {
                out[at++] = '\\';
                out[at++] = *c == '\n' ? 'n' : *c;
            } else {
                out[at++] = *c;
            }
        }
        out[at] = '\0';
    }
}

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
    if (v->filter && v->filter->given) {
        char c[600], sp[600], ty[600];
        label_list(v->filter->f.categories, v->filter->f.n_categories, c, sizeof c);
        label_list(v->filter->f.stream_prefixes, v->filter->f.n_stream_prefixes, sp, sizeof sp);
        label_list(v->filter->f.types, v->filter->f.n_types, ty, sizeof ty);
        n = snprintf(tmp, sizeof tmp,
                     "# HELP pawl_processor_filter_info The processor's filter (it handles only "
                     "the events it selects)\n"
                     "# TYPE pawl_processor_filter_info gauge\n"
                     "pawl_processor_filter_info{processor=\"%s\",categories=\"%s\","
                     "stream_prefixes=\"%s\",types=\"%s\"} 1\n",
                     v->proc, c, sp, ty);
        used += tool_httpd_extra_text(buf ? buf + used : NULL, cap > used ? cap - used : 0, tmp, n,
                                      sizeof tmp);
    }
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

/* ---------------------------------------------------------------------------------------------
 * Stopping
 * ------------------------------------------------------------------------------------------ */

/* Set once the node is stopping (relaxed: a switch for the log filter below). */
static atomic_int run_stopping;

/* The library's log, as its own sink writes it, except, while stopping, the store's reports of
 * its reconnects and retries (modules pgconn, finalizer, log: a connection lost, still failing,
 * connected again; reads and finalizer runs retried). The stop says itself whether the
 * database answers and what that leaves; errors still go through. Installed before the store
 * exists and removed after it is freed, so no other thread logs while the sink changes. */
static void run_log_sink(void *ud, enum pawl_log_level level, const char *module, const char *msg)
{
    (void)ud;
    if (atomic_load_explicit(&run_stopping, memory_order_relaxed) && level < PAWL_LOG_ERROR &&
        (strcmp(module, "pgconn") == 0 || strcmp(module, "finalizer") == 0 ||
         strcmp(module, "log") == 0))
        return;
    pawl_log_stderr(level, module, msg);
}

/*
 * Does the database answer? One non-blocking libpq connection at a time, driven from the main
 * thread's loop (no thread to join when the stop ends), given PROBE_TIMEOUT_NS to connect. A
 * server that accepts a session answers; anything else (refused, no such socket, shutting down,
 * no answer in time) does not, and down_since_ns keeps when the first such attempt began.
 */
#define PROBE_TIMEOUT_NS (2 * 1000000000LL)
struct db_probe {
    const char *dsn;
    PGconn *c;
    PostgresPollingStatusType want;
    int64_t started_ns, next_ns;
    int64_t down_since_ns; /* 0: answered at its last attempt (or not asked yet) */
    char err[256];         /* why the last attempt failed (escaped, one line) */
};

static void probe_done(struct db_probe *pr, int64_t now, int ok, const char *why)
{
    if (ok) {
        pr->down_since_ns = 0;
        pr->err[0] = '\0';
    } else {
        if (pr->down_since_ns == 0)
            pr->down_since_ns = pr->started_ns;
        char line[256];
        snprintf(line, sizeof line, "%s", why && why[0] ? why : "no answer");
        line[strcspn(line, "\n")] = '\0';
        pawl_printable_str(line, pr->err, sizeof pr->err);
    }
    PQfinish(pr->c);
    pr->c = NULL;
    pr->next_ns = now + (ok ? 1000000000LL : 250000000LL);
}

static void probe_step(struct db_probe *pr, int64_t now)
{
    if (pr->c == NULL) {
        if (now < pr->next_ns)
            return;
        /* The DSN as given (expanded: it may be a URI or key=value text), then ours. */
        const char *const kw[] = {"dbname", "application_name", NULL};
        const char *const val[] = {pr->dsn, "pawl-stop-probe", NULL};
        pr->started_ns = now;
        pr->c = PQconnectStartParams(kw, val, 1);
        pr->want = PGRES_POLLING_WRITING;
        if (pr->c == NULL || PQstatus(pr->c) == CONNECTION_BAD) {
            probe_done(pr, now, 0, pr->c ? PQerrorMessage(pr->c) : "out of memory");
            return;
        }
    }
    struct pollfd pf = {.fd = PQsocket(pr->c),
                        .events = pr->want == PGRES_POLLING_READING ? POLLIN : POLLOUT};
    if (pf.fd >= 0 && poll(&pf, 1, 0) > 0)
        pr->want = PQconnectPoll(pr->c);
    if (pr->want == PGRES_POLLING_OK)
        probe_done(pr, now, 1, NULL);
    else if (pr->want == PGRES_POLLING_FAILED || pf.fd < 0)
        probe_done(pr, now, 0, PQerrorMessage(pr->c));
    else if (now - pr->started_ns >= PROBE_TIMEOUT_NS)
        probe_done(pr, now, 0, "no answer within 2 s");
}

struct run_stop {
    struct pawl_processor *p;
    struct tool_sink *sink;
    struct tool_config *cfg;
    int64_t start_ns;
    _Atomic int done; /* pawl_processor_stop has returned */
    struct db_probe probe;
};

static void *stop_main(void *arg)
{
    struct run_stop *st = arg;
    pawl_processor_stop(st->p);
    /* Release: the main thread reads the processor's final state after seeing it. */
    atomic_store_explicit(&st->done, 1, memory_order_release);
    return NULL;
}

static void secs(int64_t ns, char *buf, size_t len)
{
    snprintf(buf, len, "%.*f s", ns < 10000000000LL ? 1 : 0, (double)TOOL_MAX(ns, 0) / 1e9);
}

static int by_segment(const void *a, const void *b)
{
    const struct pawl_segment_activity *x = a, *y = b;
    return x->seg.id < y->seg.id ? -1 : x->seg.id > y->seg.id;
}

/* The segments this node still holds, by segment id (NULL when none or out of memory; *n says
 * how many). */
static struct pawl_segment_activity *held_rows(struct pawl_processor *p, size_t *n)
{
    size_t want = pawl_processor_activity(p, NULL, 0);
    struct pawl_segment_activity *rows = want ? calloc(want, sizeof *rows) : NULL;
    *n = rows ? TOOL_MIN(pawl_processor_activity(p, rows, want), want) : 0;
    if (*n > 1)
        qsort(rows, *n, sizeof *rows, by_segment);
    return rows;
}

/*
 * What the stop waits for, as a phrase after "waiting " ("up to 27 s for segment 0's command
 * (pid 1234) to acknowledge events up to 4711, for segment 3's batch commit (the database)");
 * key gets the same without the clock's figures, to tell a change from time passing.
 */
static void describe_waits(struct run_stop *st, int64_t now, char *out, size_t len, char *key,
                           size_t keylen)
{
    size_t n = 0, uo = 0, uk = 0, shown = 0;
    int acktimeout = 0; /* the flag is named once */
    struct pawl_segment_activity *rows = held_rows(st->p, &n);
    struct tool_sink_wait kids[64];
    size_t nk =
        TOOL_MIN(tool_sink_waits(st->sink, kids, TOOL_ARRAY_LEN(kids)), TOOL_ARRAY_LEN(kids));
    out[0] = key[0] = '\0';
    /* The longest waits first: commands with a deadline, the database, the handlers. */
    static const int order[] = {PAWL_SEG_UNITS, PAWL_SEG_STORE, PAWL_SEG_HANDLING, PAWL_SEG_READING,
                                PAWL_SEG_IDLE};
    for (size_t o = 0; o < TOOL_ARRAY_LEN(order); o++) {
        for (size_t i = 0; i < n; i++) {
            const struct pawl_segment_activity *r = &rows[i];
            if ((int)r->doing != order[o])
                continue;
            if (shown == 3) {
                shown++;
                continue;
            }
            if (shown > 3)
                continue;
            const struct tool_sink_wait *w = NULL;
            for (size_t j = 0; j < nk; j++)
                if (kids[j].seg.id == r->seg.id && kids[j].seg.mask == r->seg.mask)
                    w = &kids[j];
            char item[256], ikey[160], left[32], took[32];
            uint32_t id = r->seg.id;
            secs(now - r->since_ns, took, sizeof took);
            switch (r->doing) {
            case PAWL_SEG_UNITS:
                if (w && w->deadline_ns > 0) {
                    secs(w->deadline_ns - now, left, sizeof left);
                    char what[64];
                    if (w->closing)
                        snprintf(what, sizeof what, "exit after its input ended");
                    else
                        snprintf(what, sizeof what, "acknowledge events up to %" PRId64, w->upto);
                    snprintf(item, sizeof item,
                             "up to %s for segment %u's command (pid %d) to %s%s", left, id, w->pid,
                             what, acktimeout ? "" : " (--exec-ack-timeout)");
                    acktimeout = 1;
                    snprintf(ikey, sizeof ikey, "cmd %u %d %d %" PRId64, id, w->pid, w->closing,
                             w->upto);
                } else if (w) {
                    snprintf(item, sizeof item, "for segment %u's command (pid %d)", id, w->pid);
                    snprintf(ikey, sizeof ikey, "cmd %u %d", id, w->pid);
                } else {
                    snprintf(item, sizeof item, "for segment %u's %s (%s so far)", id,
                             st->sink ? "output to be written or acknowledged"
                                      : "handlers to confirm their checkpoint",
                             took);
                    snprintf(ikey, sizeof ikey, "units %u", id);
                }
                break;
            case PAWL_SEG_STORE:
                snprintf(item, sizeof item, "for segment %u's %s (the database, %s so far)", id,
                         r->releasing ? "token and claim release" : "batch commit", took);
                snprintf(ikey, sizeof ikey, "store %u %d", id, r->releasing);
                break;
            case PAWL_SEG_HANDLING:
                snprintf(item, sizeof item, "for segment %u's handlers (a batch, %s so far)", id,
                         took);
                snprintf(ikey, sizeof ikey, "handling %u", id);
                break;
            case PAWL_SEG_READING:
                snprintf(item, sizeof item, "for segment %u's read of the log (the database)", id);
                snprintf(ikey, sizeof ikey, "reading %u", id);
                break;
            default:
                snprintf(item, sizeof item, "for segment %u's %s", id,
                         r->releasing ? "release (its turn on a worker)"
                                      : "release (not asked yet: the processor's coordinator is "
                                        "in a read or a claim cycle)");
                snprintf(ikey, sizeof ikey, "idle %u %d", id, r->releasing);
                break;
            }
            if (uo < len)
                uo += (size_t)snprintf(out + uo, len - uo, "%s%s", shown ? ", " : "", item);
            if (uk < keylen)
                uk += (size_t)snprintf(key + uk, keylen - uk, "%s;", ikey);
            shown++;
        }
    }
    if (n > 3 && uo < len)
        snprintf(out + uo, len - uo, " and for %zu more segment%s", n - 3, n - 3 == 1 ? "" : "s");
    if (n == 0) {
        /* Every segment released: the claim extender's last call, then this node's leaving. */
        snprintf(out, len, "for the token store to record that this node has left");
        snprintf(key, keylen, "leaving");
    }
    free(rows);
}

/* Give the stop up: say what is left (the claims, to expire; the commands, sent SIGTERM) and
 * exit with TOOL_ABANDONED at once, whatever the stop's thread is waiting for. */
static _Noreturn void run_abandon(struct run_stop *st, const char *why)
{
    size_t n = 0, used = 0;
    struct pawl_segment_activity *rows = held_rows(st->p, &n);
    char ids[400] = "", pids[400] = "", ct[32], killed[460] = "", released[160] = "";
    for (size_t i = 0; i < n && used < sizeof ids; i++)
        used +=
            (size_t)snprintf(ids + used, sizeof ids - used, "%s%u", i ? ", " : "", rows[i].seg.id);
    free(rows);
    struct pawl_processor_stats ps;
    pawl_processor_stats(st->p, &ps);
    tool_config_get(st->cfg, "claim-timeout", ct, sizeof ct);
    size_t nk = tool_sink_abandon(st->sink, pids, sizeof pids);
    if (nk)
        snprintf(killed, sizeof killed, "; sent SIGTERM to the exec command%s still running: %s",
                 nk == 1 ? "" : "s", pids);
    if (ps.releases_failed)
        snprintf(released, sizeof released,
                 " (and %" PRIu64 " claim%s whose release the database did not confirm)",
                 ps.releases_failed, ps.releases_failed == 1 ? "" : "s");
    struct tool_kv kv[] = {TOOL_KV_I("segments_left", n), TOOL_KV_S("claim_timeout", ct),
                           TOOL_KV_I("exit", TOOL_ABANDONED)};
    if (n == 0 && ps.releases_failed == 0)
        tool_log(PAWL_LOG_WARN, kv, TOOL_ARRAY_LEN(kv),
                 "stop abandoned (%s): every claim was released already%s", why, killed);
    else
        tool_log(PAWL_LOG_WARN, kv, TOOL_ARRAY_LEN(kv),
                 "stop abandoned (%s): %zu segment%s still claimed by this node%s%s%s%s %s left "
                 "to expire after --claim-timeout %s; then another node takes %s over from %s "
                 "stored token%s (events handled since are delivered again)%s",
                 why, n, n == 1 ? "" : "s", n ? " (" : "", ids, n ? ")" : "", released,
                 n + ps.releases_failed == 1 ? "is" : "are", ct,
                 n + ps.releases_failed == 1 ? "it" : "them",
                 n + ps.releases_failed == 1 ? "its" : "their",
                 n + ps.releases_failed == 1 ? "" : "s", killed);
    fflush(stdout);
    fflush(stderr);
    _exit(TOOL_ABANDONED);
}

/*
 * Stop p, watching: report what the stop waits for, give it up on a second signal or a
 * database absent for --stop-db-wait (run_abandon does not return). Returns when the stop is
 * done.
 */
static void run_stop(struct pawl_processor *p, struct tool_sink *sink, struct tool_config *cfg,
                     const char *dsn)
{
    struct run_stop st = {.p = p, .sink = sink, .cfg = cfg, .start_ns = pawl_now_ns()};
    st.probe.dsn = dsn;
    st.probe.next_ns = st.start_ns + 300000000LL; /* most stops are over by then */
    atomic_store_explicit(&run_stopping, 1, memory_order_relaxed);
    tool_sink_stopping(sink);
    fprintf(stderr,
            "pawl: stopping (%s: finishing batches, storing progress, releasing claims; Ctrl-C "
            "again to abandon)\n",
            tool_signal_name(tool_stop_signal));
    pthread_t thr;
    if (pthread_create(&thr, NULL, stop_main, &st) != 0) {
        pawl_processor_stop(p); /* no thread: stop here, unwatched */
        return;
    }
    int64_t wait_ns = cfg->tool.stop_db_wait_ms * 1000000;
    int64_t last_report_ns = 0;
    char last_key[1024] = "";
    while (!atomic_load_explicit(&st.done, memory_order_acquire)) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
        if (atomic_load_explicit(&st.done, memory_order_acquire))
            break;
        int64_t now = pawl_now_ns();
        int sig = tool_abandon;
        if (sig) {
            char why[96], t[32];
            secs(now - st.start_ns, t, sizeof t);
            snprintf(why, sizeof why, "a second %s, %s into the stop", tool_signal_name(sig), t);
            run_abandon(&st, why);
        }
        probe_step(&st.probe, now);
        int64_t down = st.probe.down_since_ns ? now - st.probe.down_since_ns : 0;
        if (st.probe.down_since_ns && down >= wait_ns) {
            char why[400], t[32], w[32];
            secs(down, t, sizeof t);
            tool_config_get(cfg, "stop-db-wait", w, sizeof w);
            snprintf(why, sizeof why, "the database has not answered for %s, --stop-db-wait %s: %s",
                     t, w, st.probe.err);
            run_abandon(&st, why);
        }
        if (now - st.start_ns < 300000000LL)
            continue;
        char what[1024], key[1024], db[400] = "";
        describe_waits(&st, now, what, sizeof what, key, sizeof key);
        if (st.probe.down_since_ns) {
            char t[32], left[32];
            secs(down, t, sizeof t);
            secs(wait_ns - down, left, sizeof left);
            snprintf(db, sizeof db,
                     "the database does not answer (%.180s; for %s now): waiting at most %s more "
                     "for it (--stop-db-wait), then the claims not released are left to expire; ",
                     st.probe.err, t, left);
            strncat(key, " db-down", sizeof key - strlen(key) - 1);
        }
        int changed = strcmp(key, last_key) != 0;
        if ((changed && now - last_report_ns >= 1000000000LL) ||
            now - last_report_ns >= 5000000000LL) {
            tool_log(PAWL_LOG_INFO, NULL, 0, "stopping: %swaiting %s; Ctrl-C again to abandon", db,
                     what);
            snprintf(last_key, sizeof last_key, "%s", key);
            last_report_ns = now;
        }
    }
    pthread_join(thr, NULL);
    if (st.probe.c)
        PQfinish(st.probe.c);
}

/*
 * The positional arguments: the processor's name (as status takes it), then, for --handler
 * exec, the command after "--". Without "--", `--processor NAME --handler exec CMD` still takes
 * every argument as the command. A name given both ways must be the same; the argument wins
 * over PAWL_PROCESSOR. Returns how many arguments were the name, or -1 after saying why not.
 */
static int run_name_arg(struct tool_config *cfg, int argc, const char *const *argv, int exec)
{
    enum pawl_config_source src = tool_config_source_of(cfg, "processor");
    int nname = cfg->dashdash >= 0 ? cfg->dashdash : argc;
    if (cfg->dashdash < 0 && exec)
        nname = src != PAWL_SRC_DEFAULT || argc == 0 ? 0 : 1;
    if (nname > 1) {
        tool_err("run: unexpected argument '%s' (the processor's name is one argument; a command "
                 "after -- is for --handler exec)",
                 argv[1]);
        return -1;
    }
    if (nname == 0)
        return 0;
    if (src == PAWL_SRC_FLAG && cfg->lib.processor.name &&
        strcmp(cfg->lib.processor.name, argv[0]) != 0) {
        tool_err("run: two processor names given (%s and --processor %s)", argv[0],
                 cfg->lib.processor.name);
        return -1;
    }
    char err[512];
    if (tool_config_set_from(cfg, "processor", argv[0], PAWL_SRC_FLAG, err, sizeof err) != 0) {
        tool_err("run: %s", err);
        return -1;
    }
    return 1;
}

/*
 * --initial-token for a new processor: resolved against the log (position.h) into the
 * library's integer. A processor that has segments keeps its tokens; when the flag was given
 * for one on the command line, say that it is not used (a node deployed with
 * PAWL_INITIAL_TOKEN is not told so at every start).
 */
static int run_initial_token(struct tool_config *cfg, const char *dsn, struct pawl_tokens *tok,
                             const struct tool_pos *init, const char *label)
{
    int64_t low = lowest_token(tok, cfg->lib.processor.name);
    if (low >= 0) {
        if (tool_config_source_of(cfg, "initial-token") == PAWL_SRC_FLAG)
            tool_note("processor %s exists (lowest token %" PRId64 "): %s %s is for a new "
                      "processor and is not used (pawl reset moves its tokens)",
                      cfg->lib.processor.name, low, label, cfg->tool.initial_token);
        return TOOL_OK;
    }
    char err[640];
    int64_t token = 0;
    int rc = tool_pos_resolve(dsn, label, init, &token, NULL, err, sizeof err);
    if (rc != 0) {
        tool_err("run: %s%s", err, rc == PAWL_ESCHEMA ? " (run `pawl init` first)" : "");
        return tool_exit_for(rc) == TOOL_USAGE ? TOOL_FAILED : tool_exit_for(rc);
    }
    cfg->lib.processor.initial_token = token;
    tool_note("new processor %s: its segments start at token %" PRId64 " (%s %s)",
              cfg->lib.processor.name, token, label,
              cfg->tool.initial_token ? cfg->tool.initial_token : "start");
    return TOOL_OK;
}

int cmd_run(struct tool_config *cfg, int argc, const char *const *argv)
{
    const char *hname0 = cfg->tool.handler ? cfg->tool.handler : "count";
    int nname = run_name_arg(cfg, argc, argv, strcmp(hname0, "exec") == 0);
    if (nname < 0)
        return TOOL_USAGE;
    argc -= nname;
    argv += nname;
    if (argc > 0 && strcmp(hname0, "exec") != 0) {
        tool_err("run: unexpected argument '%s' (a command after -- is for --handler exec)",
                 argv[0]);
        return TOOL_USAGE;
    }
    /* --initial-token is checked now, and resolved once the log is open. */
    char label[96], perr[640];
    struct tool_pos init;
    snprintf(label, sizeof label, "%s",
             tool_config_source_of(cfg, "initial-token") == PAWL_SRC_ENV
                 ? "PAWL_INITIAL_TOKEN (--initial-token)"
                 : "--initial-token");
    if (tool_pos_parse(label, cfg->tool.initial_token ? cfg->tool.initial_token : "start", &init,
                       perr, sizeof perr) != 0) {
        tool_err("run: %s", perr);
        return TOOL_USAGE;
    }
    char why[320];
    if (cfg->lib.processor.name == NULL) {
        /* An empty value reads as "not set"; given empty, it is a bad name. */
        if (tool_config_source_of(cfg, "processor") != PAWL_SRC_DEFAULT) {
            tool_check_name("processor name", "", PAWL_NAME_MAX, why, sizeof why);
            tool_err("run: %s", why);
        } else {
            tool_err("run: which processor? give its name: pawl run NAME (or --processor NAME, "
                     "or PAWL_PROCESSOR)");
        }
        return TOOL_USAGE;
    }
    /* Names the token store would refuse are refused here, before anything connects. */
    if (tool_check_name("processor name", cfg->lib.processor.name, PAWL_NAME_MAX, why,
                        sizeof why) ||
        (cfg->lib.processor.node_id &&
         tool_check_name("node id", cfg->lib.processor.node_id, PAWL_OWNER_MAX, why, sizeof why))) {
        tool_err("run: %s", why);
        return TOOL_USAGE;
    }
    /* The filter: part of the processor's definition, checked before anything connects. */
    struct tool_filter tf;
    if (tool_filter_from_flags(cfg->tool.categories, cfg->tool.stream_prefixes, cfg->tool.types,
                               &tf, perr, sizeof perr) != 0) {
        tool_err("run: %s", perr);
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
    /* Before any of the library's threads exist (removed at the end, after they are gone). */
    pawl_log_set_sink(run_log_sink, NULL);
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
    if (tf.given && (rc = pawl_source_pg_set_filter(src, &tf.f)) != 0) {
        tool_err("run: the filter: %s", pawl_source_errmsg(src, (char[512]){0}, 512));
        ex = TOOL_USAGE;
        goto out;
    }
    if ((ex = run_initial_token(cfg, dsn, tok, &init, label)) != TOOL_OK)
        goto out;
    if ((rc = pawl_processor_new(&p, &cfg->lib.processor, src, tok, hs, nh)) != 0) {
        char tmsg[512];
        pawl_tokens_errmsg(tok, tmsg, sizeof tmsg);
        if (rc == PAWL_EFILTER) {
            tool_err("run: refused: %s. A processor's filter is part of its definition: to "
                     "change it, stop its nodes and run `pawl reset %s --to POSITION` with the "
                     "new filter flags (or --no-filter), or give the new filter to a new "
                     "processor name",
                     tmsg, cfg->lib.processor.name);
        } else {
            tool_err("run: cannot create processor %s: %s%s%s", cfg->lib.processor.name,
                     pawl_strerror(rc), tmsg[0] ? ": " : "", tmsg);
        }
        ex = tool_exit_for(rc);
        goto out;
    }
    if (sink) {
        tool_sink_set_node(sink, pawl_processor_node_id(p));
        tool_sink_set_processor(sink, p);
    }
    view.p = p;
    view.filter = &tf;
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
    tool_abandon_here = 1; /* from here a second signal is run_stop's to report */

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
        double rate = (double)(ps.events - last_events) * 1e9 / (double)TOOL_MAX(now - last_ns, 1);
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
    run_stop(p, sink, cfg, dsn);
    struct pawl_processor_stats ps;
    pawl_processor_stats(p, &ps);
    fprintf(stderr,
            "pawl: stopped: %" PRIu64 " events in %" PRIu64 " batches, %" PRIu64
            " failed batches, %" PRId64 " replayed events\n",
            ps.events, ps.batches, ps.batch_failures,
            atomic_load_explicit(&b.replays, memory_order_relaxed));
    if (ps.releases_failed) {
        char ct[32];
        tool_config_get(cfg, "claim-timeout", ct, sizeof ct);
        tool_log(PAWL_LOG_WARN, NULL, 0,
                 "%" PRIu64 " claim%s not released (the database did not confirm the release): "
                 "left to expire after --claim-timeout %s",
                 ps.releases_failed, ps.releases_failed == 1 ? "" : "s", ct);
        ex = TOOL_ABANDONED;
    }
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
    pawl_log_set_sink(NULL, NULL);
    tool_abandon_here = 0;
    tool_filter_fini(&tf);
    return ex;
}
