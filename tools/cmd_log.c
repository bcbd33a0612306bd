/*
 * cmd_log.c — the event-log commands: `pawl init` (schema), `pawl append` (JSON lines from stdin,
 * or generated load), `pawl tail` (read and follow), `pawl demo` (appenders + a follower with a
 * live view). Each opens one store (pawl/log.h) with the options from the flag table.
 *
 * append from stdin is made for scripts: every appended event is echoed on stdout (line, stream,
 * sequence; with --wait its final index, found by reading the log back), a conflict has its own
 * exit code and a message built from the stream's actual version (the server's unique-key text
 * is never shown), input lines are bounded by what an event of --max-event-bytes can take as
 * JSON (so a stream of bytes without newlines is refused at once, in bounded memory), and
 * Ctrl-C ends it cleanly with a summary of what was appended.
 */
#include "filter_opt.h"
#include "httpd.h"
#include "jsonl.h"
#include "load.h"
#include "pgq.h"
#include "position.h"
#include "progress.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Open a store; a missing schema is exit 5 with a hint. Returns an exit code. */
static int open_store(struct tool_config *cfg, const char *dsn, struct pawl_store **out)
{
    char err[512] = "";
    int rc = pawl_store_new(out, dsn, &cfg->lib.store, err, sizeof err);
    if (rc == 0)
        return TOOL_OK;
    if (rc == PAWL_ESCHEMA) {
        tool_err("%s (run `pawl init` first)", err);
        return TOOL_NOTFOUND;
    }
    tool_err("cannot open the event log at %s: %s", tool_dsn_printable(dsn),
             err[0] ? err : pawl_strerror(rc));
    /* Only a connection failure is "cannot reach the database"; a refusal by the server
     * (permissions, a failed statement) is a failed operation. */
    return rc == PAWL_EINVAL ? TOOL_USAGE : rc == PAWL_ECONN ? TOOL_NODB : TOOL_FAILED;
}

static int start_httpd(struct tool_config *cfg, struct pawl_store *s, struct tool_httpd **h)
{
    *h = NULL;
    if (cfg->metrics_port <= 0)
        return TOOL_OK;
    char err[256];
    if (tool_httpd_start(h, cfg->metrics_port, tool_store_metrics, s, err, sizeof err) != 0) {
        tool_err("%s", err);
        return TOOL_FAILED;
    }
    tool_note("metrics at http://127.0.0.1:%d/metrics", cfg->metrics_port);
    return TOOL_OK;
}

/* ---- init ---- */

int cmd_init(struct tool_config *cfg, int argc, const char *const *argv)
{
    if (argc > 0) {
        tool_err("init: unexpected argument '%s'", argv[0]);
        return TOOL_USAGE;
    }
    const char *dsn = tool_dsn(cfg);
    if (dsn == NULL)
        return TOOL_NODB;
    char err[512] = "";
    int before = 0, lib = 0;
    int active = 0;
    int rc = pawl_schema_version(dsn, &before, &lib, err, sizeof err);
    if (rc == 0) /* the migrations, then the path asked for (online), in one go */
        rc = pawl_schema_migrate_path(dsn, cfg->tool.server_path, &active, err, sizeof err);
    if (rc != 0) {
        tool_err("init: %s", err[0] ? err : pawl_strerror(rc));
        return rc == PAWL_ECONN ? TOOL_NODB : TOOL_FAILED;
    }
    int after = 0;
    pawl_schema_version(dsn, &after, &lib, err, sizeof err);
    if (before == after)
        printf("schema is up to date (version %d) at %s\n", after, tool_dsn_printable(dsn));
    else
        printf("schema %s version %d (was %d) at %s\n", before ? "upgraded to" : "created at",
               after, before, tool_dsn_printable(dsn));
    printf("server functions: %s\n",
           active == PAWL_SERVER_NATIVE ? "native (pawl_native)" : "SQL (portable)");
    return TOOL_OK;
}

/* ---- append ---- */

static int append_generated(struct tool_config *cfg, struct pawl_store *s)
{
    struct tool_load load;
    if (tool_load_start(&load, s, cfg) != 0) {
        tool_err("append: cannot start the appender threads");
        return TOOL_FAILED;
    }
    struct tool_progress prog;
    tool_progress_init(&prog, cfg);
    int64_t last = 0, last_ns = pawl_now_ns();
    while (!tool_stop && !tool_load_done(&load)) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
        if (!tool_progress_due(&prog))
            continue;
        int64_t ev = atomic_load(&load.events), now = pawl_now_ns();
        double rate = (double)(ev - last) * 1e9 / (double)TOOL_MAX(now - last_ns, 1);
        last = ev;
        last_ns = now;
        double remaining =
            cfg->tool.duration_ms > 0
                ? (double)(load.start_ns + cfg->tool.duration_ms * 1000000 - now) / 1e9
                : (cfg->tool.count > 0 && rate > 0 ? (double)(cfg->tool.count - ev) / rate : -1);
        char r[32], d[32], eta[32];
        tool_progress_show(&prog, "%s events/s  appended %s  errors %" PRId64 "  ETA %s",
                           tool_fmt_count(rate, r, sizeof r),
                           tool_fmt_count((double)ev, d, sizeof d), atomic_load(&load.errors),
                           tool_fmt_secs(remaining, eta, sizeof eta));
    }
    tool_load_stop(&load);
    tool_progress_done(&prog);
    double secs = (double)(pawl_now_ns() - load.start_ns) / 1e9;
    int64_t ev = atomic_load(&load.events), errs = atomic_load(&load.errors);
    tool_note("%sappended %" PRId64 " events in %" PRId64 " appends in %.1fs (%.0f/s), %" PRId64
              " failed appends%s%s",
              tool_stop ? "interrupted: " : "", ev, atomic_load(&load.appends), secs,
              (double)ev / TOOL_MAX(secs, 1e-9), errs, errs ? "; first: " : "",
              errs ? load.first_error : "");
    return errs ? TOOL_FAILED : TOOL_OK;
}

/* Lines of stdin collected into one append transaction. */
struct group {
    struct tool_jsonl_event *ev;
    long *line; /* input line of each event */
    size_t n, cap;
};

/* What became of one appended event: printed at once, or with --wait once its index is known. */
struct appended {
    long line;
    char *stream; /* malloc'ed */
    int64_t seq;  /* 0: not known (see assigned_seq) */
    int64_t index;
    uint64_t hash; /* of type and payload, to recognise the event when reading it back */
    int already;   /* its id was in the log: this line wrote nothing */
};

struct append_ctx {
    struct tool_config *cfg;
    struct pawl_store *s;
    const char *dsn;
    int64_t appended;      /* events */
    int64_t appends;       /* transactions */
    int64_t already;       /* events whose ids were in the log already (nothing written) */
    long last_line;        /* last line appended */
    char last_ev[160];     /* "stream#seq" of the last event appended (printable) */
    struct appended *done; /* --wait: every appended event, in order */
    size_t ndone, capdone;
};

static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static uint64_t event_hash(const struct pawl_event *e)
{
    uint64_t h = fnv1a(14695981039346656037ULL, e->type, strlen(e->type) + 1);
    return fnv1a(h, e->payload ? e->payload : "", e->payload_len);
}

/*
 * The stream sequence the log gave event i of an append: what the store reported for it (every
 * stream's numbers, pawl_append_seqs), else an explicit seq is what it asked for; 0 (printed as
 * "#?") only when the store could not keep the numbers (out of memory).
 */
static int64_t assigned_seq(const struct pawl_append_result *res, const struct pawl_event *evs,
                            size_t i)
{
    if (res->seqs != NULL)
        return res->seqs[i];
    return evs[i].stream_seq > 0 ? evs[i].stream_seq : 0;
}

static void print_appended(const struct appended *a, int with_index)
{
    char shown[512];
    tool_printable(a->stream, shown, sizeof shown);
    if (a->seq > 0)
        printf("line %ld  %s#%" PRId64, a->line, shown, a->seq);
    else
        printf("line %ld  %s#?", a->line, shown);
    if (with_index)
        printf("  index %" PRId64, a->index);
    if (a->already)
        printf("  (already appended: its id is in the log)");
    putchar('\n');
}

/*
 * An event may join the group unless the log would refuse the mix: within one append, a stream's
 * events are all "next position" (seq 0) or all explicit and consecutive.
 */
static int group_accepts(const struct group *g, const struct pawl_event *e)
{
    /* Ids: every event of an append carries one or none does, and no id twice (a repeated line
     * goes in the next append, which then finds it already appended). */
    if (g->n > 0 && (g->ev[0].ev.id != NULL) != (e->id != NULL))
        return 0;
    for (size_t i = 0; e->id != NULL && i < g->n; i++)
        if (strcmp(g->ev[i].ev.id, e->id) == 0)
            return 0;
    for (size_t i = g->n; i-- > 0;) {
        const struct pawl_event *o = &g->ev[i].ev;
        if (strcmp(o->stream_id, e->stream_id) != 0)
            continue;
        if ((o->stream_seq == 0) != (e->stream_seq == 0))
            return 0;
        return e->stream_seq == 0 || e->stream_seq == o->stream_seq + 1;
    }
    return 1;
}

/*
 * A conflict, said precisely: the first stream of the group whose explicit sequence does not
 * follow the stream's current version (read after the failure; a concurrent append may have
 * moved it again, which the message cannot know). The server's unique-key text never reaches
 * the user.
 */
static void report_conflict(struct append_ctx *c, const struct group *g)
{
    for (size_t i = 0; i < g->n; i++) {
        const struct pawl_event *e = &g->ev[i].ev;
        if (e->stream_seq <= 0)
            continue;
        int first = 1;
        for (size_t j = 0; j < i; j++)
            if (strcmp(g->ev[j].ev.stream_id, e->stream_id) == 0)
                first = 0;
        if (!first)
            continue;
        int64_t actual = 0;
        char err[256], shown[512];
        if (tool_pgq_stream_version(c->dsn, e->stream_id, &actual, err, sizeof err) != 0)
            continue;
        if (actual == e->stream_seq - 1)
            continue;
        struct tool_kv kv[] = {TOOL_KV_S("stream", e->stream_id), TOOL_KV_I("line", g->line[i]),
                               TOOL_KV_I("expected_version", e->stream_seq - 1),
                               TOOL_KV_I("actual_version", actual)};
        tool_log(PAWL_LOG_ERROR, kv, TOOL_ARRAY_LEN(kv),
                 "append: line %ld: conflict on stream %s: expected version %" PRId64
                 " (the event's seq %" PRId64 " follows it), but the stream is at version %" PRId64
                 "; nothing of this append (lines %ld-%ld) was written",
                 g->line[i], tool_printable(e->stream_id, shown, sizeof shown), e->stream_seq - 1,
                 e->stream_seq, actual, g->line[0], g->line[g->n - 1]);
        return;
    }
    struct tool_kv kv[] = {TOOL_KV_I("line", g->line[0])};
    tool_log(PAWL_LOG_ERROR, kv, 1,
             "append: lines %ld-%ld: conflict: a stream is not at the expected version (it moved "
             "again since); nothing of this append was written",
             g->line[0], g->line[g->n - 1]);
}

/* Append the group as one transaction; the error names its lines. Empties the group. */
static int group_flush(struct append_ctx *c, struct group *g)
{
    if (g->n == 0)
        return 0;
    struct pawl_event *evs = malloc(g->n * sizeof *evs);
    int64_t *seqs = malloc(g->n * sizeof *seqs);
    int rc = PAWL_ENOMEM;
    struct pawl_append_result res = {.message = "out of memory"};
    if (evs && seqs) {
        for (size_t i = 0; i < g->n; i++)
            evs[i] = g->ev[i].ev;
        rc = pawl_append_seqs(c->s, evs, g->n, seqs, &res);
    }
    if (rc == PAWL_ECONFLICT) {
        report_conflict(c, g);
    } else if (rc != 0) {
        if (g->n == 1)
            tool_err("append: line %ld: %s: %s", g->line[0], pawl_strerror(rc), res.message);
        else
            tool_err("append: lines %ld-%ld (one transaction): %s: %s", g->line[0],
                     g->line[g->n - 1], pawl_strerror(rc), res.message);
    } else {
        if (res.already) {
            c->already += (int64_t)g->n;
        } else {
            c->appended += (int64_t)g->n;
            c->appends++;
        }
        for (size_t i = 0; i < g->n; i++) {
            const struct pawl_event *e = &g->ev[i].ev;
            struct appended a = {.line = g->line[i],
                                 .stream = (char *)e->stream_id,
                                 .seq = assigned_seq(&res, evs, i),
                                 .hash = event_hash(e),
                                 .already = res.already};
            c->last_line = g->line[i];
            char shown[128];
            tool_printable(e->stream_id, shown, sizeof shown);
            if (a.seq > 0)
                snprintf(c->last_ev, sizeof c->last_ev, "%s#%" PRId64, shown, a.seq);
            else
                snprintf(c->last_ev, sizeof c->last_ev, "%s", shown);
            if (!c->cfg->tool.wait || a.already) {
                print_appended(&a, 0); /* an already appended event is below --wait's start */
                continue;
            }
            if (c->ndone == c->capdone) {
                size_t ncap = c->capdone ? c->capdone * 2 : 256;
                struct appended *nd = realloc(c->done, ncap * sizeof *nd);
                if (nd == NULL) {
                    rc = PAWL_ENOMEM;
                    break;
                }
                c->done = nd;
                c->capdone = ncap;
            }
            a.stream = strdup(e->stream_id);
            if (a.stream == NULL) {
                rc = PAWL_ENOMEM;
                break;
            }
            c->done[c->ndone++] = a;
        }
        fflush(stdout);
    }
    free(evs);
    free(seqs);
    for (size_t i = 0; i < g->n; i++)
        tool_jsonl_event_fini(&g->ev[i]);
    g->n = 0;
    return rc;
}

/*
 * --wait: read the log from the head seen before the first append until every appended event is
 * found (same stream, type and payload, and seq when known, in input order: our appends
 * committed one after another, so their final indexes ascend), then print them with their final
 * indexes and sequences. Bounded by --open-timeout per quiet period and by Ctrl-C.
 */
static int wait_final(struct append_ctx *c, int64_t after)
{
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    size_t next = 0;
    int64_t quiet_since = pawl_now_ns();
    int64_t limit_ns =
        TOOL_MAX((int64_t)c->cfg->lib.store.open_timeout_ms, (int64_t)1000) * 1000000;
    int rc = 0;
    while (next < c->ndone && !tool_stop) {
        rc = pawl_read(c->s, after, 1000, &b);
        if (rc != 0)
            break;
        if (b.count == 0) {
            if (pawl_now_ns() - quiet_since > limit_ns) {
                rc = PAWL_ETIMEDOUT;
                break;
            }
            int64_t last = 0;
            pawl_finalize_now(c->s, NULL, NULL, &last);
            if (last <= after)
                pawl_store_wait(c->s, after, 200);
            continue;
        }
        quiet_since = pawl_now_ns();
        for (size_t i = 0; i < b.count && next < c->ndone; i++) {
            const struct pawl_event *e = &b.events[i];
            struct appended *a = &c->done[next];
            if (strcmp(e->stream_id, a->stream) == 0 && event_hash(e) == a->hash &&
                (a->seq == 0 || a->seq == e->stream_seq)) {
                a->seq = e->stream_seq;
                a->index = e->index;
                next++;
            }
        }
        after = b.events[b.count - 1].index;
    }
    pawl_read_batch_fini(&b);
    for (size_t i = 0; i < next; i++)
        print_appended(&c->done[i], 1);
    fflush(stdout);
    if (next < c->ndone) {
        char why[256] = "interrupted";
        if (rc == PAWL_ETIMEDOUT)
            snprintf(why, sizeof why, "no new final index for --open-timeout (%d ms)",
                     (int)c->cfg->lib.store.open_timeout_ms);
        else if (rc != 0)
            pawl_store_errmsg(c->s, why, sizeof why);
        tool_err("append --wait: %zu of %zu appended events have no final index yet (%s); they "
                 "are committed and will get one",
                 c->ndone - next, c->ndone, why);
        return tool_stop ? TOOL_OK : TOOL_FAILED;
    }
    return TOOL_OK;
}

/*
 * A line reader over a file descriptor that can say whether more input is available without
 * blocking, so a partly filled group of lines is appended as soon as the input pauses (a
 * `tail -f | pawl append` pipeline must not wait for a full group). Lines are bounded: one
 * longer than max_line is refused as soon as that many bytes arrived without a newline, so
 * `pawl append < /dev/zero` fails at once instead of filling the memory.
 */
struct line_reader {
    int fd;
    char *buf;
    size_t cap, start, end;
    size_t max_line;
    int eof;
};

/* Next line (without its newline) into line and len; 1 on success, 0 at end of input or on a
 * stop request, -1 on a read error, -2 for a line longer than max_line. The line is valid until
 * the next call. */
static int next_line(struct line_reader *r, const char **line, size_t *len)
{
    for (;;) {
        char *nl = r->end > r->start ? memchr(r->buf + r->start, '\n', r->end - r->start) : NULL;
        if (nl || (r->eof && r->end > r->start)) {
            size_t n = nl ? (size_t)(nl - (r->buf + r->start)) : r->end - r->start;
            if (n > r->max_line)
                return -2;
            *line = r->buf + r->start;
            *len = n;
            r->start += n + (nl ? 1 : 0);
            return 1;
        }
        if (r->eof || tool_stop)
            return 0;
        if (r->end - r->start > r->max_line)
            return -2;
        if (r->start > 0) {
            memmove(r->buf, r->buf + r->start, r->end - r->start);
            r->end -= r->start;
            r->start = 0;
        }
        if (r->end == r->cap) {
            size_t ncap = r->cap ? r->cap * 2 : 65536;
            ncap = TOOL_MIN(ncap, r->max_line + 2); /* a line, its newline, and one byte more */
            char *nb = realloc(r->buf, ncap);
            if (nb == NULL)
                return -1;
            r->buf = nb;
            r->cap = ncap;
        }
        ssize_t got = read(r->fd, r->buf + r->end, r->cap - r->end);
        if (got < 0 && errno == EINTR)
            continue; /* tool_stop is looked at above */
        if (got < 0)
            return -1;
        if (got == 0)
            r->eof = 1;
        r->end += (size_t)got;
    }
}

/* Non-zero when the next line can be had without waiting. */
static int line_ready(struct line_reader *r)
{
    if (r->eof || (r->end > r->start && memchr(r->buf + r->start, '\n', r->end - r->start)))
        return 1;
    struct pollfd p = {.fd = r->fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

/*
 * The longest input line an event within --max-event-bytes can take: its bytes written as JSON
 * (a string escapes a byte as at most 6 characters, \u00XX) plus room for the field names,
 * seq, and whitespace.
 */
static size_t max_line_for(const struct tool_config *cfg)
{
    return (size_t)cfg->lib.store.max_event_bytes * 6 + 65536;
}

static int append_stdin(struct tool_config *cfg, struct pawl_store *s, const char *dsn)
{
    struct group g = {.cap = (size_t)cfg->tool.events_per_append};
    g.ev = calloc(g.cap, sizeof *g.ev);
    g.line = calloc(g.cap, sizeof *g.line);
    if (g.ev == NULL || g.line == NULL) {
        free(g.ev);
        free(g.line);
        return TOOL_FAILED;
    }
    struct append_ctx c = {.cfg = cfg, .s = s, .dsn = dsn};
    int64_t head0 = 0;
    if (cfg->tool.wait)
        pawl_finalize_now(s, NULL, NULL, &head0);
    struct stat sb;
    int64_t total_bytes = fstat(STDIN_FILENO, &sb) == 0 && S_ISREG(sb.st_mode) ? sb.st_size : -1;
    struct tool_progress prog;
    tool_progress_init(&prog, cfg);
    if (isatty(STDIN_FILENO))
        tool_note("reading JSON lines from the terminal; end with Ctrl-D");
    struct line_reader rd = {.fd = STDIN_FILENO, .max_line = max_line_for(cfg)};
    const char *line = NULL;
    size_t len = 0;
    long lineno = 0;
    int64_t bytes = 0;
    int ex = TOOL_OK, got = 0, rc = 0;
    while (!tool_stop && (got = next_line(&rd, &line, &len)) == 1) {
        lineno++;
        bytes += (int64_t)len + 1;
        char err[320];
        struct tool_jsonl_event cur;
        int prc = tool_jsonl_parse(line, len, &cur, err, sizeof err);
        if (prc < 0) {
            tool_err("append: line %ld: %s", lineno, err);
            ex = TOOL_BADINPUT;
            break;
        }
        if (prc == 0) {
            if (g.n == g.cap || !group_accepts(&g, &cur.ev)) {
                if ((rc = group_flush(&c, &g)) != 0) {
                    tool_jsonl_event_fini(&cur);
                    break;
                }
            }
            g.ev[g.n] = cur;
            g.line[g.n++] = lineno;
        }
        if (cfg->tool.count > 0 && c.appended + (int64_t)g.n >= cfg->tool.count)
            break;
        /* A full group goes at once; a partial one as soon as the input pauses. */
        if ((g.n == g.cap || (g.n > 0 && !line_ready(&rd))) && (rc = group_flush(&c, &g)) != 0)
            break;
        if (tool_progress_due(&prog)) {
            double secs = (double)(pawl_now_ns() - prog.start_ns) / 1e9;
            double rate = (double)c.appended / TOOL_MAX(secs, 1e-3);
            char r[32], eta[32];
            double left = total_bytes > 0 && bytes > 0
                              ? secs * (double)(total_bytes - bytes) / (double)bytes
                              : -1;
            tool_progress_show(&prog, "%s events/s  appended %" PRId64 "  line %ld  ETA %s",
                               tool_fmt_count(rate, r, sizeof r), c.appended, lineno,
                               tool_fmt_secs(left, eta, sizeof eta));
        }
    }
    if (got == -2) {
        tool_err("append: line %ld is longer than %zu bytes, the most an event of "
                 "--max-event-bytes %zu can take as a JSON line; refused before reading the rest "
                 "of it",
                 lineno + 1, rd.max_line, (size_t)cfg->lib.store.max_event_bytes);
        ex = TOOL_BADINPUT;
    }
    /* Lines before a bad one are appended too (the documented contract), and so are the lines
     * read before an interrupt. */
    if (rc == 0)
        rc = group_flush(&c, &g);
    if (rc != 0)
        ex = rc == PAWL_ECONFLICT || rc == PAWL_EIDUSED ? TOOL_CONFLICT
             : tool_exit_for(rc) == TOOL_NODB           ? TOOL_NODB
                                                        : TOOL_FAILED;
    for (size_t i = 0; i < g.n; i++)
        tool_jsonl_event_fini(&g.ev[i]);
    free(g.ev);
    free(g.line);
    free(rd.buf);
    if (ex == TOOL_OK && got == -1) {
        tool_err("append: reading stdin: %s", strerror(errno));
        ex = TOOL_FAILED;
    }
    tool_progress_done(&prog);
    if (cfg->tool.wait && c.ndone > 0) {
        int wex = wait_final(&c, head0);
        if (ex == TOOL_OK)
            ex = wex;
    }
    for (size_t i = 0; i < c.ndone; i++)
        free(c.done[i].stream);
    free(c.done);
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    char extra[160] = "";
    if (c.already > 0 || st.append_lost_retries > 0)
        snprintf(extra, sizeof extra,
                 "; %" PRId64 " events were in the log already (their ids), %" PRId64
                 " appends were sent again after a lost connection",
                 c.already, st.append_lost_retries);
    struct tool_kv kv[] = {TOOL_KV_I("events", c.appended),
                           TOOL_KV_I("already", c.already),
                           TOOL_KV_I("resent", st.append_lost_retries),
                           TOOL_KV_I("appends", c.appends),
                           TOOL_KV_I("lines", lineno),
                           TOOL_KV_I("last_line", c.last_line),
                           TOOL_KV_S("last_event", c.last_ev),
                           TOOL_KV_S("stopped_by", tool_stop ? "signal"
                                                   : ex      ? "failure"
                                                             : "")};
    char last[256] = "";
    if (c.last_line)
        snprintf(last, sizeof last, " (last: line %ld, %s)", c.last_line, c.last_ev);
    tool_log(ex == TOOL_OK ? PAWL_LOG_INFO : PAWL_LOG_WARN, kv, TOOL_ARRAY_LEN(kv),
             "%sappended %" PRId64 " events in %" PRId64 " appends from %ld lines%s%s%s",
             tool_stop ? "interrupted: " : "", c.appended, c.appends, lineno, extra, last,
             ex == TOOL_OK ? "" : "; stopped at the first failure (nothing after it was appended)");
    return ex;
}

int cmd_append(struct tool_config *cfg, int argc, const char *const *argv)
{
    if (argc > 0) {
        tool_err("append: unexpected argument '%s' (events come from stdin, or use --generate)",
                 argv[0]);
        return TOOL_USAGE;
    }
    const char *dsn = tool_dsn(cfg);
    if (dsn == NULL)
        return TOOL_NODB;
    /* Lines with ids are safe to send again: after a lost connection the store does so for up
     * to a minute unless --append-retry says otherwise. */
    if (tool_config_source_of(cfg, "append-retry") == PAWL_SRC_DEFAULT)
        cfg->lib.store.append_retry_ms = 60000;
    struct pawl_store *s = NULL;
    int ex = open_store(cfg, dsn, &s);
    if (ex != TOOL_OK)
        return ex;
    struct tool_httpd *h = NULL;
    ex = start_httpd(cfg, s, &h);
    if (ex == TOOL_OK)
        ex = cfg->tool.generate ? append_generated(cfg, s) : append_stdin(cfg, s, dsn);
    tool_httpd_stop(h);
    pawl_store_free(s);
    return ex;
}

/* ---- tail ---- */

static void print_event(const struct tool_config *cfg, const struct pawl_event *e);

/*
 * `pawl tail --stream S`: the stream's finalized events after --from, a sequence number of the
 * stream (start: 0; end: its last; -N: its last N), in order; --follow waits for more.
 */
static int tail_stream(struct tool_config *cfg)
{
    const char *stream = cfg->tool.stream;
    const char *f = cfg->tool.from ? cfg->tool.from : "start";
    const char *dsn = tool_dsn(cfg);
    if (dsn == NULL)
        return TOOL_NODB;
    int64_t after = 0;
    int rel = 0; /* 1: end, 2: -N */
    char *endp = NULL;
    if (strcmp(f, "start") == 0) {
        after = 0;
    } else if (strcmp(f, "end") == 0) {
        rel = 1;
    } else {
        errno = 0;
        long long v = strtoll(f, &endp, 10);
        if (errno || endp == f || *endp != '\0') {
            tool_err("tail: --from %s: with --stream, a position is a sequence number of the "
                     "stream (N, start, end, or -N for its last N events)",
                     f);
            return TOOL_USAGE;
        }
        if (v < 0) {
            rel = 2;
            after = -(int64_t)v;
        } else {
            after = (int64_t)v;
        }
    }
    if (rel) {
        char err[512];
        int64_t version = 0;
        int rc = tool_pgq_stream_version(dsn, stream, &version, err, sizeof err);
        if (rc != 0) {
            tool_err("tail: %s", err);
            return tool_exit_for(rc) == TOOL_USAGE ? TOOL_FAILED : tool_exit_for(rc);
        }
        after = rel == 1 ? version : TOOL_MAX((int64_t)0, version - after);
    }
    struct pawl_store *s = NULL;
    int ex = open_store(cfg, dsn, &s);
    if (ex != TOOL_OK)
        return ex;
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    int64_t printed = 0;
    while (!tool_stop) {
        size_t want = 1000;
        if (cfg->tool.count > 0)
            want = (size_t)TOOL_MIN((int64_t)want, cfg->tool.count - printed);
        if (want == 0)
            break;
        int64_t known = pawl_store_last_index(s);
        int rc = pawl_read_stream(s, stream, after, want, &b);
        if (rc != 0) {
            char err[256];
            pawl_store_errmsg(s, err, sizeof err);
            tool_err("tail: %s (%s)", pawl_strerror(rc), err);
            ex = tool_exit_for(rc) == TOOL_NODB ? TOOL_NODB : TOOL_FAILED;
            break;
        }
        if (b.count == 0) {
            if (!cfg->tool.follow)
                break;
            /* Look again once the log moves (the stream's next event is finalized then). */
            pawl_store_wait(s, known, 500);
            continue;
        }
        for (size_t i = 0; i < b.count; i++) {
            print_event(cfg, &b.events[i]);
            after = b.events[i].stream_seq;
        }
        printed += (int64_t)b.count;
        fflush(stdout);
    }
    pawl_read_batch_fini(&b);
    pawl_store_free(s);
    return ex;
}

static void print_event(const struct tool_config *cfg, const struct pawl_event *e)
{
    if (cfg->tool.json) {
        tool_jsonl_write(stdout, e);
        return;
    }
    char when[32] = "-";
    if (e->appended_at_us > 0) {
        time_t t = (time_t)(e->appended_at_us / 1000000);
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    }
    /* Ids, types and payloads are anyone's bytes: escaped, so that none can move the cursor,
     * retitle the terminal or forge a line of this output. */
    size_t shown = TOOL_MIN(e->payload_len, (size_t)120);
    char sid[PAWL_PRINTABLE_SIZE(PAWL_STREAM_ID_MAX)];
    char type[PAWL_PRINTABLE_SIZE(PAWL_EVENT_TYPE_MAX)];
    char payload[PAWL_PRINTABLE_SIZE(120)];
    char id[PAWL_PRINTABLE_SIZE(PAWL_EVENT_ID_MAX) + 8] = "";
    if (e->id != NULL) {
        char shown_id[PAWL_PRINTABLE_SIZE(PAWL_EVENT_ID_MAX)];
        snprintf(id, sizeof id, "  id=%s", pawl_printable_str(e->id, shown_id, sizeof shown_id));
    }
    printf("%-10" PRId64 " %s  %s#%" PRId64 "  %s%s  %s%s\n", e->index, when,
           pawl_printable_str(e->stream_id, sid, sizeof sid), e->stream_seq,
           pawl_printable_str(e->type, type, sizeof type), id,
           pawl_printable(e->payload, shown, payload, sizeof payload),
           e->payload_len > shown ? "..." : "");
}

static int tail_log(struct tool_config *cfg, const struct tool_filter *tfp);

int cmd_tail(struct tool_config *cfg, int argc, const char *const *argv)
{
    if (argc > 0) {
        tool_err("tail: unexpected argument '%s'", argv[0]);
        return TOOL_USAGE;
    }
    if (cfg->metrics_port > 0 && !cfg->tool.follow) {
        tool_err("tail: --metrics-port needs --follow (without it tail ends once it has printed "
                 "the log, before anything could scrape it)");
        return TOOL_USAGE;
    }
    struct tool_filter tf;
    char perr[512];
    if (tool_filter_from_flags(cfg->tool.categories, cfg->tool.stream_prefixes, cfg->tool.types,
                               &tf, perr, sizeof perr) != 0) {
        tool_err("tail: %s", perr);
        return TOOL_USAGE;
    }
    if (cfg->tool.stream) {
        if (tf.given) {
            tool_filter_fini(&tf);
            tool_err("tail: --stream reads one stream; it takes no --category, --stream-prefix "
                     "or --types");
            return TOOL_USAGE;
        }
        return tail_stream(cfg);
    }
    int ex = tail_log(cfg, &tf);
    tool_filter_fini(&tf);
    return ex;
}

/* `pawl tail` of the log, or through a filter (tf->given). */
static int tail_log(struct tool_config *cfg, const struct tool_filter *tfp)
{
    const struct tool_filter tf = *tfp;
    char perr[512];
    struct tool_pos from;
    if (tool_pos_parse("--from", cfg->tool.from ? cfg->tool.from : "start", &from, perr,
                       sizeof perr) != 0) {
        tool_err("tail: %s", perr);
        return TOOL_USAGE;
    }
    const char *dsn = tool_dsn(cfg);
    if (dsn == NULL)
        return TOOL_NODB;
    struct pawl_store *s = NULL;
    int ex = open_store(cfg, dsn, &s);
    if (ex != TOOL_OK)
        return ex;
    struct tool_httpd *h = NULL;
    if ((ex = start_httpd(cfg, s, &h)) != TOOL_OK) {
        pawl_store_free(s);
        return ex;
    }
    int64_t after = 0;
    if (from.kind != TOOL_POS_START && from.kind != TOOL_POS_INDEX)
        pawl_finalize_now(s, NULL, NULL, NULL); /* the end is after what is committed now */
    int rc0 = tool_pos_resolve(dsn, "--from", &from, &after, NULL, perr, sizeof perr);
    if (rc0 != 0) {
        tool_err("tail: %s%s", perr, rc0 == PAWL_ESCHEMA ? " (run `pawl init` first)" : "");
        tool_httpd_stop(h);
        pawl_store_free(s);
        return tool_exit_for(rc0) == TOOL_USAGE ? TOOL_FAILED : tool_exit_for(rc0);
    }
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    int64_t printed = 0;
    while (!tool_stop) {
        size_t want = 1000;
        if (cfg->tool.count > 0)
            want = (size_t)TOOL_MIN((int64_t)want, cfg->tool.count - printed);
        if (want == 0)
            break;
        int64_t pos = after;
        int rc;
        if (tf.given)
            rc = cfg->tool.follow ? pawl_follow_filtered(s, after, want, &tf.f, &b, &pos, 500)
                                  : pawl_read_filtered(s, after, want, &tf.f, &b, &pos);
        else
            rc = cfg->tool.follow ? pawl_follow(s, after, want, &b, 500)
                                  : pawl_read(s, after, want, &b);
        if (rc == PAWL_ETIMEDOUT) {
            if (tf.given)
                after = TOOL_MAX(after, pos);
            continue;
        }
        if (rc != 0) {
            char err[256];
            pawl_store_errmsg(s, err, sizeof err);
            tool_err("tail: %s (%s)", pawl_strerror(rc), err);
            ex = tool_exit_for(rc) == TOOL_NODB ? TOOL_NODB : TOOL_FAILED;
            break;
        }
        /* Unfiltered, an empty read is the end; filtered, a read that looked no further is. */
        if (b.count == 0 && !cfg->tool.follow && (!tf.given || pos <= after))
            break;
        for (size_t i = 0; i < b.count; i++) {
            print_event(cfg, &b.events[i]);
            pawl_metrics_hist_observe(PAWL_H_E2E_LAG,
                                      (pawl_wall_us() - b.events[i].appended_at_us) * 1000);
            after = b.events[i].index;
        }
        if (tf.given)
            after = TOOL_MAX(after, pos);
        pawl_metrics_counter_add(PAWL_M_EVENTS_READ, b.count);
        printed += (int64_t)b.count;
        fflush(stdout);
    }
    pawl_read_batch_fini(&b);
    /* The reader's own account: what it printed, and what it went through to get it. */
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    if (cfg->tool.follow || st.read_retries > 0 || st.read_gaps > 0)
        pawl_log(PAWL_LOG_INFO, "tail",
                 "read %" PRId64 " events up to index %" PRId64 "; read retries %" PRId64
                 " over %" PRId64 " lost connections, gaps %" PRId64 ", notifications %" PRId64
                 " (index queries %" PRId64 ")",
                 printed, after, st.read_retries, st.read_reconnects, st.read_gaps,
                 st.notifications, st.index_queries);
    if (cfg->lib.store.read_dsn)
        pawl_log(PAWL_LOG_INFO, "tail",
                 "standby: %" PRId64 " reads from it, %" PRId64 " from the primary in its stead, "
                 "%" PRId64 " episodes behind or away; replay delay %.1f ms at the last check",
                 st.standby_reads, st.standby_fallback_reads, st.standby_episodes,
                 st.standby_replay_delay_ms);
    tool_httpd_stop(h);
    pawl_store_free(s);
    return ex;
}

/* ---- demo ---- */

struct follower {
    struct pawl_store *s;
    pthread_t th;
    _Atomic int stop;
    _Atomic int64_t read;
    _Atomic int64_t last_index;
    int64_t start_after;
};

static void *follow_main(void *arg)
{
    struct follower *f = arg;
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    int64_t after = f->start_after;
    /* Relaxed: the stop flag is a request; counters are statistics. */
    while (!atomic_load_explicit(&f->stop, memory_order_relaxed)) {
        int rc = pawl_follow(f->s, after, 1000, &b, 200);
        if (rc == PAWL_ETIMEDOUT)
            continue;
        if (rc != 0)
            break;
        int64_t now_us = pawl_wall_us();
        for (size_t i = 0; i < b.count; i++)
            pawl_metrics_hist_observe(PAWL_H_E2E_LAG, (now_us - b.events[i].appended_at_us) * 1000);
        pawl_metrics_counter_add(PAWL_M_EVENTS_READ, b.count);
        if (b.count) {
            after = b.events[b.count - 1].index;
            atomic_fetch_add_explicit(&f->read, (int64_t)b.count, memory_order_relaxed);
            atomic_store_explicit(&f->last_index, after, memory_order_relaxed);
        }
    }
    pawl_read_batch_fini(&b);
    return NULL;
}

int cmd_demo(struct tool_config *cfg, int argc, const char *const *argv)
{
    if (argc > 0) {
        tool_err("demo: unexpected argument '%s'", argv[0]);
        return TOOL_USAGE;
    }
    const char *dsn = tool_dsn(cfg);
    if (dsn == NULL)
        return TOOL_NODB;
    char err[512] = "";
    if (pawl_schema_migrate(dsn, err, sizeof err) != 0) {
        tool_err("demo: cannot set up the schema: %s", err);
        return TOOL_NODB;
    }
    struct pawl_store *s = NULL;
    int ex = open_store(cfg, dsn, &s);
    if (ex != TOOL_OK)
        return ex;
    struct tool_httpd *h = NULL;
    if ((ex = start_httpd(cfg, s, &h)) != TOOL_OK) {
        pawl_store_free(s);
        return ex;
    }
    pawl_metrics_reset();
    struct pawl_metrics_snapshot *prev = calloc(1, sizeof *prev), *now = calloc(1, sizeof *now),
                                 *d = calloc(1, sizeof *d);
    struct follower f;
    memset(&f, 0, sizeof f);
    f.s = s;
    pawl_finalize_now(s, NULL, NULL, &f.start_after);
    char rate_text[32], dur_text[32];
    fprintf(stderr,
            "pawl demo: %d appenders at %s events/s (%d per append, %d-byte payloads, %d streams) "
            "for %s, one follower; from index %" PRId64 "\n",
            cfg->tool.appenders,
            cfg->tool.rate > 0 ? tool_fmt_count(cfg->tool.rate, rate_text, sizeof rate_text)
                               : "max",
            cfg->tool.events_per_append, cfg->tool.payload_bytes, cfg->tool.streams,
            tool_fmt_secs((double)cfg->tool.duration_ms / 1e3, dur_text, sizeof dur_text),
            f.start_after);
    struct tool_load load;
    if (prev == NULL || now == NULL || d == NULL ||
        pthread_create(&f.th, NULL, follow_main, &f) != 0) {
        tool_err("demo: out of memory or threads");
        ex = TOOL_FAILED;
        goto out;
    }
    if (tool_load_start(&load, s, cfg) != 0) {
        tool_err("demo: cannot start the appender threads");
        atomic_store(&f.stop, 1);
        pthread_join(f.th, NULL);
        ex = TOOL_FAILED;
        goto out;
    }
    struct tool_progress prog;
    tool_progress_init(&prog, cfg);
    pawl_metrics_snapshot(prev);
    int64_t prev_read = 0;
    double worst_fin_p99 = 0;
    while (!tool_stop && !tool_load_done(&load)) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
        if (!tool_progress_due(&prog))
            continue;
        pawl_metrics_snapshot(now);
        pawl_metrics_diff(d, now, prev);
        double secs = (double)(now->taken_ns - prev->taken_ns) / 1e9;
        int64_t read = atomic_load(&f.read);
        struct pawl_store_stats st;
        pawl_store_stats(s, &st, 1);
        worst_fin_p99 = TOOL_MAX(worst_fin_p99, st.delay_p99_ms);
        char a[32], r[32], p50[32], p99[32], eta[32];
        double left =
            (double)(load.start_ns + cfg->tool.duration_ms * 1000000 - pawl_now_ns()) / 1e9;
        tool_progress_show(
            &prog,
            "appended %s/s  finalized+read %s/s  pending %" PRId64
            "  finalize delay p50 %.1fms p99 %.1fms  e2e p50 %s p99 %s  errors %" PRId64
            "  left %s",
            tool_fmt_count((double)d->counters[PAWL_M_EVENTS_APPENDED] / secs, a, sizeof a),
            tool_fmt_count((double)(read - prev_read) / secs, r, sizeof r), st.appends_pending,
            st.delay_p50_ms, st.delay_p99_ms,
            tool_fmt_ns(pawl_metrics_quantile_ns(&d->hists[PAWL_H_E2E_LAG], 0.5), p50, sizeof p50),
            tool_fmt_ns(pawl_metrics_quantile_ns(&d->hists[PAWL_H_E2E_LAG], 0.99), p99, sizeof p99),
            atomic_load(&load.errors),
            tool_fmt_secs(cfg->tool.duration_ms ? left : -1, eta, sizeof eta));
        prev_read = read;
        struct pawl_metrics_snapshot *t = prev;
        prev = now;
        now = t;
    }
    tool_load_stop(&load);
    double secs = (double)(pawl_now_ns() - load.start_ns) / 1e9;
    /* Let the follower read what was appended (bounded: 10 s; also after a Ctrl-C, a second
     * one exits at once). */
    int64_t last = 0;
    pawl_finalize_now(s, NULL, NULL, &last);
    int64_t wait_until = pawl_now_ns() + 10 * 1000000000LL;
    while (atomic_load(&f.last_index) < last && pawl_now_ns() < wait_until) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    atomic_store(&f.stop, 1);
    pthread_join(f.th, NULL);
    tool_progress_done(&prog);

    pawl_metrics_snapshot(now);
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    worst_fin_p99 = TOOL_MAX(worst_fin_p99, st.delay_p99_ms);
    int64_t ev = atomic_load(&load.events), errs = atomic_load(&load.errors);
    const struct pawl_metrics_hist *al = &now->hists[PAWL_H_APPEND_LATENCY];
    const struct pawl_metrics_hist *e2e = &now->hists[PAWL_H_E2E_LAG];
    char b0[32], b1[32], b2[32], b3[32], b4[32], b5[32], b6[32];
    printf(
        "\npawl demo summary\n"
        "  appended        %" PRId64 " events in %" PRId64 " appends over %.1fs: %.0f events/s "
        "(target %s)\n"
        "  read back       %" PRId64 " events by the follower, up to index %" PRId64 "%s\n"
        "  append latency  p50 %s  p99 %s  max %s\n"
        "  end-to-end lag  p50 %s  p99 %s  max %s  (commit to follower)\n"
        "  finalize delay  worst 1-interval p99 %.1fms  (runs every %.1fms at the end)\n"
        "  re-runs         %" PRId64 "  (appends run again after racing another for a stream)\n"
        "  errors          %" PRId64 "%s%s\n",
        ev, atomic_load(&load.appends), secs, (double)ev / TOOL_MAX(secs, 1e-9),
        cfg->tool.rate > 0 ? tool_fmt_count(cfg->tool.rate, b0, sizeof b0) : "max",
        atomic_load(&f.read), atomic_load(&f.last_index),
        atomic_load(&f.read) >= ev ? "" : " (fewer: the follower was stopped before it caught up)",
        tool_fmt_ns(pawl_metrics_quantile_ns(al, 0.5), b1, sizeof b1),
        tool_fmt_ns(pawl_metrics_quantile_ns(al, 0.99), b2, sizeof b2),
        tool_fmt_ns((int64_t)al->max_ns, b3, sizeof b3),
        tool_fmt_ns(pawl_metrics_quantile_ns(e2e, 0.5), b4, sizeof b4),
        tool_fmt_ns(pawl_metrics_quantile_ns(e2e, 0.99), b5, sizeof b5),
        tool_fmt_ns((int64_t)e2e->max_ns, b6, sizeof b6), worst_fin_p99, st.finalizer_interval_ms,
        st.append_retries, errs, errs ? "; first: " : "", errs ? load.first_error : "");
    ex = errs && ev == 0 ? TOOL_FAILED : TOOL_OK;
out:
    free(prev);
    free(now);
    free(d);
    tool_httpd_stop(h);
    pawl_store_free(s);
    return ex;
}
