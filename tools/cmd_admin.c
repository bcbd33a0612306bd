/*
 * cmd_admin.c — `pawl status`, `pawl reset`, `pawl split`, `pawl merge`, `pawl delete`: the
 * operator's view of the processors and their segments in the token store, and the changes made
 * to them while the processor's segments are unclaimed. Changes print what they would do unless
 * --execute is given, and are refused (exit 4, naming the owners) while any segment involved is
 * claimed: moving a claimed segment's token under a running node would race its next
 * conditional write. A refusal goes to stderr only: stdout carries a plan only when the change
 * could be made. The commands that change a processor take its name (and every action) from
 * the command line only, never from the environment.
 */
#include "filter_opt.h"
#include "pgq.h"
#include "position.h"
#include "progress.h"
#include "scrape.h"
#include "status.h"

#include <stdlib.h>

#include <inttypes.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct stores {
    struct pawl_store *log;
    struct pawl_source *src; /* over log, borrowed */
    struct pawl_tokens *tok;
};

static void stores_close(struct stores *s)
{
    pawl_tokens_free(s->tok);
    pawl_source_free(s->src);
    pawl_store_free(s->log);
    memset(s, 0, sizeof *s);
}

/*
 * Open the log (with the store flags) and the token store. A failure names the server's own
 * message where there is one; only a connection failure is "cannot reach the database" (exit 3):
 * a refusal by a reachable server (permissions, a failed statement) is a failed operation
 * (exit 1), and a missing schema is exit 5 with a hint.
 */
static int stores_open(struct tool_config *cfg, struct stores *s)
{
    memset(s, 0, sizeof *s);
    const char *dsn = tool_dsn(cfg);
    if (dsn == NULL)
        return TOOL_NODB;
    char err[512] = "";
    int rc = pawl_store_new(&s->log, dsn, &cfg->lib.store, err, sizeof err);
    if (rc == 0)
        rc = pawl_source_pg_from_store(&s->src, s->log, dsn);
    if (rc == 0 && (rc = pawl_tokens_pg_new(&s->tok, dsn)) != 0)
        snprintf(err, sizeof err, "the token store: %s (the line above has the server's reason)",
                 pawl_strerror(rc));
    if (rc != 0) {
        tool_err("cannot open the log and token store at %s: %s%s", tool_dsn_printable(dsn),
                 err[0] ? err : pawl_strerror(rc),
                 rc == PAWL_ESCHEMA && !err[0] ? " (run `pawl init` first)" : "");
        stores_close(s);
        return tool_exit_for(rc);
    }
    return TOOL_OK;
}

/* " (did you mean X?)" when an existing processor's name is one or two edits from proc. */
static void closest_processor(struct tool_config *cfg, const char *proc, char *out, size_t outlen)
{
    struct tool_proc_row *rows = NULL;
    size_t n = 0;
    char err[256];
    const char *dsn = tool_dsn(cfg);
    if (dsn == NULL || tool_pgq_processors(dsn, cfg->lib.processor.claim_timeout_ms, &rows, &n, err,
                                           sizeof err) != 0)
        return;
    size_t best = 99, bi = 0;
    for (size_t i = 0; i < n; i++) {
        size_t d = tool_edit_distance(proc, rows[i].name);
        if (d < best) {
            best = d;
            bi = i;
        }
    }
    if (n > 0 && best <= TOOL_MAX(strlen(proc) / 3, (size_t)1))
        snprintf(out, outlen, " (did you mean %s? pawl status lists them)", rows[bi].name);
    else if (n > 0)
        snprintf(out, outlen, " (pawl status lists the %zu processors)", n);
    free(rows);
}

/* Gather proc's status (tool_status_collect) with the claim timeout that marks expired claims;
 * on failure print "what: the reason" and return the exit code. */
static int status_collect(struct tool_config *cfg, struct stores *s, const char *proc,
                          int64_t scan_limit, struct tool_status *st, const char *what)
{
    char err[512];
    int rc = tool_status_collect(s->tok, s->src, proc, scan_limit, st, err, sizeof err);
    if (rc != 0) {
        char hint[128] = "";
        if (rc == PAWL_ENOTFOUND)
            closest_processor(cfg, proc, hint, sizeof hint);
        tool_err("%s: %s%s", what, err, hint);
        return tool_exit_for(rc);
    }
    st->claim_timeout_ms = cfg->lib.processor.claim_timeout_ms;
    return TOOL_OK;
}

/*
 * The processor's recorded filter (JSON into json, "{}" when none), set on s->src so that lag
 * is counted in the events the processor reads.
 */
static int status_filter(struct tool_config *cfg, struct stores *s, const char *proc, char **json)
{
    char err[512];
    int rc = tool_pgq_processor_filter(tool_dsn(cfg), proc, json, err, sizeof err);
    if (rc != 0) {
        tool_err("status: cannot read the filter of %s: %s", proc, err);
        return tool_exit_for(rc);
    }
    struct tool_filter tf;
    if (tool_filter_from_json(*json, &tf, err, sizeof err) != 0) {
        tool_err("status: processor %s: %s", proc, err);
        return TOOL_FAILED;
    }
    if (tf.given && (rc = pawl_source_pg_set_filter(s->src, &tf.f)) != 0) {
        tool_err("status: processor %s: its filter: %s", proc,
                 pawl_source_errmsg(s->src, (char[512]){0}, 512));
        tool_filter_fini(&tf);
        return TOOL_FAILED;
    }
    tool_filter_fini(&tf);
    return TOOL_OK;
}

/* The processor name: --processor, or the one positional argument. A command that changes the
 * processor (changes != 0) does not take it from PAWL_PROCESSOR. */
static const char *proc_name(struct tool_config *cfg, int argc, const char *const *argv,
                             const char *cmd, int changes)
{
    if (argc > 1) {
        tool_err("%s: unexpected argument '%s'", cmd, argv[1]);
        return NULL;
    }
    if (argc == 1) {
        if (cfg->lib.processor.name && strcmp(cfg->lib.processor.name, argv[0]) != 0) {
            tool_err("%s: two processor names given (%s and --processor %s)", cmd, argv[0],
                     cfg->lib.processor.name);
            return NULL;
        }
        return argv[0];
    }
    if (changes && cfg->lib.processor.name &&
        tool_config_source_of(cfg, "processor") != PAWL_SRC_FLAG) {
        tool_err("%s: which processor? give its name on the command line (%s changes a processor, "
                 "so PAWL_PROCESSOR from the environment is not used)",
                 cmd, cmd);
        return NULL;
    }
    if (cfg->lib.processor.name == NULL)
        tool_err("%s: which processor? give --processor NAME%s", cmd,
                 changes ? "" : " (or PAWL_PROCESSOR)");
    return cfg->lib.processor.name;
}

static void sleep_ms_interruptible(int64_t ms)
{
    while (ms > 0 && !tool_stop) {
        int64_t step = TOOL_MIN(ms, (int64_t)100);
        struct timespec ts = {0, (long)step * 1000000L};
        nanosleep(&ts, NULL);
        ms -= step;
    }
}

/* status NAME: one line about the processor's dead letters, when it has any. */
static void dead_letters_line(struct pawl_tokens *tok, const char *proc)
{
    struct pawl_dead_stream *rows = NULL;
    size_t n = 0;
    if (pawl_dead_letters_streams(tok, proc, &rows, &n) != 0 || n == 0) {
        pawl_dead_letters_free(rows);
        return;
    }
    uint64_t letters = 0;
    int64_t oldest = 0;
    for (size_t i = 0; i < n; i++) {
        letters += rows[i].letters;
        oldest = TOOL_MAX(oldest, rows[i].oldest_age_ms);
    }
    printf("\ndead letters: %" PRIu64 " in %zu parked stream%s, the oldest parked %.0f s ago "
           "(pawl dead-letters %s lists them)\n",
           letters, n, n == 1 ? "" : "s", (double)oldest / 1000.0, proc);
    pawl_dead_letters_free(rows);
}

/* status without a name: one line per processor. */
static int status_list(struct tool_config *cfg)
{
    const char *dsn = tool_dsn(cfg);
    if (dsn == NULL)
        return TOOL_NODB;
    int ex = TOOL_OK;
    int64_t shown = 0;
    for (;;) {
        struct tool_proc_row *rows = NULL;
        size_t n = 0;
        char err[512];
        int rc = tool_pgq_processors(dsn, cfg->lib.processor.claim_timeout_ms, &rows, &n, err,
                                     sizeof err);
        if (rc != 0) {
            /* By SQLSTATE, not by message text: a server's lc_messages may not be English. */
            tool_err("status: cannot list the processors: %s%s", err,
                     rc == PAWL_ESCHEMA ? " (run `pawl init` first)" : "");
            return rc == PAWL_ECONN ? TOOL_NODB : rc == PAWL_ESCHEMA ? TOOL_NOTFOUND : TOOL_FAILED;
        }
        if (cfg->tool.watch_ms > 0 && isatty(STDOUT_FILENO) && !cfg->tool.json)
            fputs("\033[H\033[2J", stdout);
        if (cfg->tool.json) {
            printf("{\"processors\": [");
            for (size_t i = 0; i < n; i++) {
                char owners[2048];
                tool_json_string(rows[i].owners, owners, sizeof owners);
                printf("%s{\"processor\": \"%s\", \"segments\": %" PRId64 ", \"claimed\": %" PRId64
                       ", \"expired_claims\": %" PRId64
                       ", \"owners\": %s, \"lowest_token\": %" PRId64 ", \"head\": %" PRId64
                       ", \"lag_events\": %" PRId64 ", \"filter\": %s}",
                       i ? ", " : "", rows[i].name, rows[i].segments, rows[i].claimed,
                       rows[i].expired, owners, rows[i].lowest_token, rows[i].head,
                       TOOL_MAX(rows[i].head - rows[i].lowest_token, (int64_t)0),
                       strcmp(rows[i].filter, "{}") == 0 ? "null" : rows[i].filter);
            }
            printf("]}\n");
        } else if (n == 0) {
            printf("no processors yet (pawl run --processor NAME creates one)\n");
        } else {
            printf("%-24s %-9s %-8s %-12s %-12s %-12s %-24s %s\n", "PROCESSOR", "SEGMENTS",
                   "CLAIMED", "LOWEST-TOKEN", "HEAD", "LAG-EVENTS", "FILTER", "OWNERS");
            for (size_t i = 0; i < n; i++) {
                char owners[4 * sizeof rows[i].owners], desc[1024] = "-", e[256];
                tool_printable(rows[i].owners, owners, sizeof owners);
                struct tool_filter tf;
                if (tool_filter_from_json(rows[i].filter, &tf, e, sizeof e) == 0 && tf.given)
                    tool_filter_describe(&tf, desc, sizeof desc);
                else if (strcmp(rows[i].filter, "{}") != 0)
                    snprintf(desc, sizeof desc, "(long: pawl status %s)", rows[i].name);
                tool_filter_fini(&tf);
                printf("%-24s %-9" PRId64 " %-8" PRId64 " %-12" PRId64 " %-12" PRId64 " %-12" PRId64
                       " %-24s %s%s\n",
                       rows[i].name, rows[i].segments, rows[i].claimed, rows[i].lowest_token,
                       rows[i].head, TOOL_MAX(rows[i].head - rows[i].lowest_token, (int64_t)0),
                       desc, owners[0] ? owners : "-",
                       rows[i].expired ? "  (expired claims: nodes gone?)" : "");
            }
            printf("\n(lag: head - lowest token, an upper bound; pawl status NAME counts it per "
                   "segment)\n");
        }
        fflush(stdout);
        free(rows);
        shown++;
        if (cfg->tool.watch_ms == 0 || tool_stop)
            break;
        sleep_ms_interruptible(cfg->tool.watch_ms);
        if (tool_stop)
            break;
    }
    if (tool_stop)
        tool_note("interrupted: stopped watching after %" PRId64 " refreshes", shown);
    return ex;
}

int cmd_status(struct tool_config *cfg, int argc, const char *const *argv)
{
    if (argc == 0 && cfg->lib.processor.name == NULL)
        return status_list(cfg);
    const char *proc = proc_name(cfg, argc, argv, "status", 0);
    if (proc == NULL)
        return TOOL_USAGE;
    struct stores s;
    int ex = stores_open(cfg, &s);
    if (ex != TOOL_OK)
        return ex;
    char *fjson = NULL;
    if ((ex = status_filter(cfg, &s, proc, &fjson)) != TOOL_OK) {
        free(fjson);
        stores_close(&s);
        return ex;
    }
    int live = cfg->tool.watch_ms > 0 && isatty(STDOUT_FILENO) && !cfg->tool.json;
    int64_t shown = 0;
    for (;;) {
        struct tool_status st;
        char err[512];
        if ((ex = status_collect(cfg, &s, proc, TOOL_STATUS_SCAN_LIMIT, &st, "status")) != TOOL_OK)
            break;
        st.filter = fjson;
        tool_status_finalizer_lock(tool_dsn(cfg), &st.fin);
        if (live)
            fputs("\033[H\033[2J", stdout); /* home and clear: redraw in place */
        if (cfg->tool.json) {
            /* Watching prints one compact document per line (JSON lines). */
            tool_status_print_json(stdout, &st, cfg->tool.watch_ms == 0);
        } else {
            tool_status_print_table(stdout, &st);
            if (st.n > 0 && !st.rows[0].lag_exact)
                printf("\n(lag past the first %d events after the lowest token is head - token, "
                       "an upper bound)\n",
                       TOOL_STATUS_SCAN_LIMIT);
            dead_letters_line(s.tok, proc);
        }
        if (cfg->tool.metrics) {
            /* With --json, stdout stays one JSON document; the summary goes to stderr. */
            FILE *mf = cfg->tool.json ? stderr : stdout;
            int64_t owned = 0;
            for (size_t i = 0; i < st.n; i++)
                owned += st.rows[i].st.owner[0] != '\0';
            fprintf(mf,
                    "\nTOTALS  head %" PRId64 "  segments %zu  claimed %" PRId64
                    "  events scanned for lag %" PRId64 "\n",
                    st.head, st.n, owned, st.scanned);
            if (cfg->metrics_port > 0) {
                char *body = NULL;
                if (tool_scrape(cfg->metrics_port, &body, err, sizeof err) == 0) {
                    fprintf(mf, "\nMETRICS of the pawl process on 127.0.0.1:%d\n",
                            cfg->metrics_port);
                    tool_scrape_summary(mf, body);
                    free(body);
                } else {
                    fprintf(mf, "\nMETRICS: %s\n", err);
                }
            } else {
                fprintf(mf, "(add --metrics-port N to read the metrics of a node serving them)\n");
            }
        }
        fflush(stdout);
        tool_status_fini(&st);
        shown++;
        if (cfg->tool.watch_ms == 0 || tool_stop)
            break;
        sleep_ms_interruptible(cfg->tool.watch_ms);
        if (tool_stop)
            break;
    }
    if (tool_stop && ex == TOOL_OK)
        tool_note("interrupted: stopped watching %s after %" PRId64 " refreshes", proc, shown);
    free(fjson);
    stores_close(&s);
    return ex;
}

/* Refuse (exit 4) when any of the rows has a live claim, naming the owners; name the expired
 * claims (tool_status_claim_expired: their nodes stopped, and any node may take them over) that
 * would be released (preview) or will be (execute). */
static int refuse_if_claimed(const struct tool_config *cfg, const struct tool_status *st,
                             const char *what)
{
    char owners[512];
    tool_status_owners(st, owners, sizeof owners);
    if (owners[0] != '\0') {
        tool_err("%s refused: segments of %s are claimed by %s; stop those nodes (or wait until "
                 "their claims are older than --claim-timeout, %.1f s) and try again; nothing "
                 "changed",
                 what, st->proc, owners, (double)st->claim_timeout_ms / 1000);
        return TOOL_REFUSED;
    }
    for (size_t i = 0; i < st->n; i++) {
        const struct pawl_segment_status *r = &st->rows[i].st;
        char shown[4 * PAWL_OWNER_MAX + 8];
        if (tool_status_claim_expired(st, r))
            printf("  segment %u: the claim of %s expired (not extended for %.1f s; claim timeout "
                   "%.1f s): %s\n",
                   r->seg.id, tool_printable(r->owner, shown, sizeof shown),
                   (double)r->claim_age_ms / 1000, (double)st->claim_timeout_ms / 1000,
                   cfg->tool.execute ? "releasing it" : "would release it");
    }
    return TOOL_OK;
}

/* Release the expired claims among the rows. A claim released here that its node then tries to
 * extend is lost to it, as when another node takes it over. */
static int release_expired(struct pawl_tokens *tok, const struct tool_status *st, const char *what)
{
    for (size_t i = 0; i < st->n; i++) {
        const struct pawl_segment_status *r = &st->rows[i].st;
        if (!tool_status_claim_expired(st, r))
            continue;
        int rc = tok->ops->release(tok, st->proc, r->seg.id, r->owner);
        if (rc != 0) {
            tool_err("%s: releasing the expired claim of %s on segment %u failed: %s (%s)", what,
                     r->owner, r->seg.id, pawl_tokens_errmsg(tok, (char[512]){0}, 512),
                     pawl_strerror(rc));
            return tool_exit_for(rc);
        }
    }
    return TOOL_OK;
}

static int reset_run(struct tool_config *cfg, const char *proc, const struct tool_pos *top,
                     const struct tool_filter *tf);

int cmd_reset(struct tool_config *cfg, int argc, const char *const *argv)
{
    const char *proc = proc_name(cfg, argc, argv, "reset", 1);
    if (proc == NULL)
        return TOOL_USAGE;
    struct tool_pos to;
    char err[512];
    if (tool_pos_parse("--to", cfg->tool.to, &to, err, sizeof err)) {
        tool_err("reset: %s", err);
        return TOOL_USAGE;
    }
    /* A new filter (or --no-filter): recorded with the tokens, in the same transaction. */
    struct tool_filter tf;
    if (tool_filter_from_flags(cfg->tool.categories, cfg->tool.stream_prefixes, cfg->tool.types,
                               &tf, err, sizeof err) != 0) {
        tool_err("reset: %s", err);
        return TOOL_USAGE;
    }
    if (tf.given && cfg->tool.no_filter) {
        tool_filter_fini(&tf);
        tool_err("reset: --no-filter drops the filter; it takes no --category, --stream-prefix "
                 "or --types");
        return TOOL_USAGE;
    }
    int ex = reset_run(cfg, proc, &to, &tf);
    tool_filter_fini(&tf);
    return ex;
}

static int reset_run(struct tool_config *cfg, const char *proc, const struct tool_pos *top,
                     const struct tool_filter *tf)
{
    struct tool_pos to = *top;
    char err[512];
    int change_filter = tf->given || cfg->tool.no_filter;
    char *new_json = NULL, *old_json = NULL;
    if (change_filter) {
        int need = tf->given ? pawl_filter_json(&tf->f, NULL, 0) : 2;
        if (need < 0 || (new_json = malloc((size_t)need + 1)) == NULL)
            return TOOL_FAILED;
        if (tf->given)
            pawl_filter_json(&tf->f, new_json, (size_t)need + 1);
        else
            snprintf(new_json, 3, "{}");
    }
    struct stores s;
    int ex = stores_open(cfg, &s);
    if (ex != TOOL_OK) {
        free(new_json);
        return ex;
    }
    /* Lag and the preview go by the filter in force now. */
    if ((ex = status_filter(cfg, &s, proc, &old_json)) != TOOL_OK) {
        free(new_json);
        free(old_json);
        stores_close(&s);
        return ex;
    }
    struct tool_status st;
    int rc;
    if ((ex = status_collect(cfg, &s, proc, 0, &st, "reset")) != TOOL_OK) {
        free(new_json);
        free(old_json);
        stores_close(&s);
        return ex;
    }
    /* The token the reset sets: the position resolved once, here (position.h). */
    int64_t target = 0;
    struct tool_pos_span span;
    if ((rc = tool_pos_resolve(tool_dsn(cfg), "--to", &to, &target, &span, err, sizeof err)) != 0) {
        tool_err("reset: %s; nothing changed", err);
        ex = tool_exit_for(rc) == TOOL_USAGE ? TOOL_FAILED : tool_exit_for(rc);
        goto out;
    }
    int64_t head = TOOL_MAX(st.head, span.last);
    if (target > head) {
        /* A token past the head would skip events that do not exist yet: whatever is appended
         * next, up to the token, would never reach the processor. Almost always a typo. */
        tool_err("reset refused: --to %s is index %" PRId64 ", past the head of the log (%" PRId64
                 "); the processor would silently skip the next %" PRId64
                 " events appended; nothing changed",
                 cfg->tool.to, target, head, target - head);
        ex = TOOL_REFUSED;
        goto out;
    }
    if (target < span.first - 1) {
        /* Below the log's start the processor could only fail to read (PAWL_ETRUNCATED). */
        tool_err("reset refused: --to %s is index %" PRId64 ", before the log's start (retention "
                 "moved it to index %" PRId64 "; --to start is %" PRId64
                 "): the processor could not read from there; nothing changed",
                 cfg->tool.to, target, span.first, span.first - 1);
        ex = TOOL_REFUSED;
        goto out;
    }
    char when[48], at_time[160] = "";
    if (to.kind == TOOL_POS_AGO || to.kind == TOOL_POS_TIME) {
        tool_pos_format_time(tool_pos_time_us(&to, &span), when, sizeof when);
        if (target < span.last)
            snprintf(at_time, sizeof at_time,
                     "; the first event appended at or after %s is index %" PRId64, when,
                     target + 1);
        else
            snprintf(at_time, sizeof at_time, "; no event was appended at or after %s", when);
    }
    ex = refuse_if_claimed(cfg, &st, "reset");
    if (ex != TOOL_OK)
        goto out;
    printf("%s %s to token %" PRId64 " (--to %s%s):\n",
           cfg->tool.execute ? "resetting" : "would reset", proc, target, cfg->tool.to, at_time);
    for (size_t i = 0; i < st.n; i++) {
        const struct pawl_segment_status *r = &st.rows[i].st;
        char shown[4 * PAWL_OWNER_MAX + 8];
        int64_t d = target - r->token;
        printf(
            "  segment %u/0x%x: token %" PRId64 " -> %" PRId64 "  (%s %" PRId64 " indexes)%s%s\n",
            r->seg.id, r->seg.mask, r->token, target, d < 0 ? "replays" : "skips", d < 0 ? -d : d,
            r->owner[0] ? "  claimed by " : "", tool_printable(r->owner, shown, sizeof shown));
    }
    if (change_filter) {
        struct tool_filter oldf;
        char od[1024] = "none (every event)", nd[1024] = "none (every event)", e[256];
        if (tool_filter_from_json(old_json, &oldf, e, sizeof e) == 0 && oldf.given)
            tool_filter_describe(&oldf, od, sizeof od);
        tool_filter_fini(&oldf);
        if (tf->given)
            tool_filter_describe(tf, nd, sizeof nd);
        printf("  filter: %s -> %s\n", od, nd);
    }
    if (!cfg->tool.execute) {
        printf("nothing changed: add --execute to apply\n");
        goto out;
    }
    if ((ex = release_expired(s.tok, &st, "reset")) != TOOL_OK)
        goto out;
    int64_t set = 0;
    if (change_filter) {
        rc = s.tok->ops->filter_reset(s.tok, proc, new_json, target);
        set = target;
    } else {
        rc = pawl_processor_reset(s.tok, s.src, proc, PAWL_RESET_INDEX, target, &set);
    }
    if (rc != 0) {
        tool_err("reset failed: %s (%s)", pawl_tokens_errmsg(s.tok, (char[512]){0}, 512),
                 pawl_strerror(rc));
        ex = tool_exit_for(rc);
        goto out;
    }
    printf("reset %s: every segment at token %" PRId64 ". Events up to each segment's previous "
           "high-water mark are delivered as replays.\n",
           proc, set);
out:
    tool_status_fini(&st);
    stores_close(&s);
    free(new_json);
    free(old_json);
    return ex;
}

static const struct tool_seg_row *find_row(const struct tool_status *st, uint32_t id)
{
    for (size_t i = 0; i < st->n; i++)
        if (st->rows[i].st.seg.id == id)
            return &st->rows[i];
    return NULL;
}

static int split_or_merge(struct tool_config *cfg, int argc, const char *const *argv, int merge)
{
    const char *what = merge ? "merge" : "split";
    const char *proc = proc_name(cfg, argc, argv, what, 1);
    if (proc == NULL)
        return TOOL_USAGE;
    if (tool_config_source_of(cfg, "segment") != PAWL_SRC_FLAG) {
        tool_err("%s: which segment? give --segment ID (pawl status %s lists them)", what, proc);
        return TOOL_USAGE;
    }
    struct stores s;
    int ex = stores_open(cfg, &s);
    if (ex != TOOL_OK)
        return ex;
    struct tool_status st;
    int rc;
    if ((ex = status_collect(cfg, &s, proc, 0, &st, what)) != TOOL_OK) {
        stores_close(&s);
        return ex;
    }
    uint32_t id = (uint32_t)cfg->tool.segment;
    const struct tool_seg_row *row = find_row(&st, id);
    const struct tool_seg_row *sib = NULL;
    struct tool_status involved = st; /* a view over the rows involved, for the owner check */
    struct tool_seg_row pair[2];
    char plan[512] = "";
    if (row == NULL) {
        tool_err("%s: %s has no segment %u", what, proc, id);
        ex = TOOL_NOTFOUND;
        goto out;
    }
    pair[0] = *row;
    involved.rows = pair;
    involved.n = 1;
    if (!merge) {
        struct pawl_segment lo, hi;
        if (pawl_segment_split(row->st.seg, &lo, &hi) != 0) {
            tool_err("split: segment %u cannot be split further", id);
            ex = TOOL_USAGE;
            goto out;
        }
        snprintf(plan, sizeof plan,
                 "%s segment %u/0x%x (token %" PRId64 ") into %u/0x%x and %u/0x%x, both at token "
                 "%" PRId64 "\n",
                 cfg->tool.execute ? "splitting" : "would split", id, row->st.seg.mask,
                 row->st.token, lo.id, lo.mask, hi.id, hi.mask, row->st.token);
    } else {
        struct pawl_segment sseg, parent;
        if (pawl_segment_sibling(row->st.seg, &sseg) != 0 ||
            pawl_segment_parent(row->st.seg, &parent) != 0) {
            tool_err("merge: segment %u is the only segment; nothing to merge", id);
            ex = TOOL_USAGE;
            goto out;
        }
        sib = find_row(&st, sseg.id);
        if (sib == NULL || sib->st.seg.mask != sseg.mask) {
            tool_err("merge: segment %u/0x%x has no sibling %u/0x%x (it was split further; merge "
                     "those halves first)",
                     id, row->st.seg.mask, sseg.id, sseg.mask);
            ex = TOOL_NOTFOUND;
            goto out;
        }
        pair[1] = *sib;
        involved.n = 2;
        if (row->st.has_merge || sib->st.has_merge) {
            tool_err("merge refused: a previous merge of these segments is still catching up");
            ex = TOOL_REFUSED;
            goto out;
        }
        snprintf(plan, sizeof plan,
                 "%s segments %u/0x%x (token %" PRId64 ") and %u/0x%x (token %" PRId64
                 ") into %u/0x%x at token %" PRId64 "; the faster half's events up to %" PRId64
                 " are not redelivered\n",
                 cfg->tool.execute ? "merging" : "would merge", row->st.seg.id, row->st.seg.mask,
                 row->st.token, sib->st.seg.id, sib->st.seg.mask, sib->st.token, parent.id,
                 parent.mask, TOOL_MIN(row->st.token, sib->st.token),
                 TOOL_MAX(row->st.token, sib->st.token));
    }
    ex = refuse_if_claimed(cfg, &involved, what);
    if (ex != TOOL_OK)
        goto out;
    fputs(plan, stdout); /* only now: a refused change prints no plan */
    if (!cfg->tool.execute) {
        printf("nothing changed: add --execute to apply\n");
        goto out;
    }
    if ((ex = release_expired(s.tok, &involved, what)) != TOOL_OK)
        goto out;
    rc =
        merge ? s.tok->ops->merge(s.tok, proc, id, NULL) : s.tok->ops->split(s.tok, proc, id, NULL);
    if (rc != 0) {
        tool_err("%s failed: %s (%s)", what, pawl_tokens_errmsg(s.tok, (char[512]){0}, 512),
                 pawl_strerror(rc));
        ex = tool_exit_for(rc);
        goto out;
    }
    printf("done\n");
out:
    tool_status_fini(&st);
    stores_close(&s);
    return ex;
}

int cmd_split(struct tool_config *cfg, int argc, const char *const *argv)
{
    return split_or_merge(cfg, argc, argv, 0);
}

int cmd_merge(struct tool_config *cfg, int argc, const char *const *argv)
{
    return split_or_merge(cfg, argc, argv, 1);
}

int cmd_delete(struct tool_config *cfg, int argc, const char *const *argv)
{
    const char *proc = proc_name(cfg, argc, argv, "delete", 1);
    if (proc == NULL)
        return TOOL_USAGE;
    struct stores s;
    int ex = stores_open(cfg, &s);
    if (ex != TOOL_OK)
        return ex;
    /* A processor whose first node recorded its filter and stopped before creating segments:
     * only the record is left, which would refuse a new start with another filter. */
    char oerr[512];
    int orphan = 0;
    if (tool_pgq_orphan_filter(tool_dsn(cfg), proc, cfg->tool.execute, &orphan, oerr,
                               sizeof oerr) == 0 &&
        orphan) {
        printf("%s the recorded filter of processor %s, which has no segments\n%s",
               cfg->tool.execute ? "deleted" : "would delete", proc,
               cfg->tool.execute ? "" : "nothing changed: add --execute to apply\n");
        stores_close(&s);
        return TOOL_OK;
    }
    struct tool_status st;
    if ((ex = status_collect(cfg, &s, proc, 0, &st, "delete")) != TOOL_OK) {
        stores_close(&s);
        return ex;
    }
    ex = refuse_if_claimed(cfg, &st, "delete");
    if (ex != TOOL_OK)
        goto out;
    int64_t lowest = INT64_MAX;
    for (size_t i = 0; i < st.n; i++)
        lowest = TOOL_MIN(lowest, st.rows[i].st.token);
    printf("%s processor %s: %zu segments (tokens from %" PRId64 ", head %" PRId64
           "), their claims and node records; the log is not touched\n",
           cfg->tool.execute ? "deleting" : "would delete", proc, st.n, lowest, st.head);
    if (!cfg->tool.execute) {
        printf("nothing changed: add --execute to apply\n");
        goto out;
    }
    /* The delete checks the claims again under row locks: a node that claimed a segment since
     * the look above makes it refuse, deleting nothing. */
    char err[512];
    int64_t deleted = 0;
    int rc = tool_pgq_delete_processor(tool_dsn(cfg), proc, cfg->lib.processor.claim_timeout_ms,
                                       &deleted, err, sizeof err);
    if (rc == PAWL_EBUSY) {
        char shown[1024];
        tool_err("delete refused: segments of %s are claimed by %s; stop those nodes and try "
                 "again; nothing changed",
                 proc, tool_printable(err, shown, sizeof shown));
        ex = TOOL_REFUSED;
        goto out;
    }
    if (rc != 0) {
        tool_err("delete failed: %s", err);
        ex = tool_exit_for(rc);
        goto out;
    }
    printf("deleted processor %s: %" PRId64 " segments\n", proc, deleted);
out:
    tool_status_fini(&st);
    stores_close(&s);
    return ex;
}

/* `pawl dead-letters NAME [list|show|retry|drop]`: the processor's parked streams. */
static void print_time_us(int64_t us, char *out, size_t len)
{
    time_t t = (time_t)(us / 1000000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* --json: a string member, or null for NULL. */
static void json_member(const char *key, const char *value, int first)
{
    printf("%s\"%s\":", first ? "" : ",", key);
    if (value == NULL) {
        fputs("null", stdout);
        return;
    }
    putchar('"');
    tool_json_escape(stdout, value);
    putchar('"');
}

/* dead-letters list --json: one object per parked stream. */
static void dead_stream_json(const struct pawl_dead_stream *d)
{
    putchar('{');
    json_member("stream", d->stream_id, 1);
    printf(",\"letters\":%" PRIu64 ",\"first_index\":%" PRId64 ",\"last_index\":%" PRId64
           ",\"age_ms\":%" PRId64 ",\"attempts\":%u",
           d->letters, d->first_index, d->last_index, d->oldest_age_ms, d->attempts);
    json_member("last_error", d->last_error, 0);
    printf(",\"retry_requested\":%s}\n", d->retry_requested ? "true" : "false");
}

/* dead-letters show|retry|drop --json: one object per letter. */
static void dead_letter_json(const struct pawl_dead_letter *l)
{
    char at[32];
    print_time_us(l->parked_us, at, sizeof at);
    putchar('{');
    json_member("stream", l->ev.stream_id, 1);
    printf(",\"index\":%" PRId64 ",\"seq\":%" PRId64, l->ev.index, l->ev.stream_seq);
    json_member("type", l->ev.type, 0);
    if (l->ev.id && l->ev.id[0])
        json_member("id", l->ev.id, 0);
    printf(",\"segment\":%u,\"mask\":%u", l->seg.id, l->seg.mask);
    json_member("parked", at, 0);
    printf(",\"attempts\":%u", l->attempts);
    if (l->behind)
        printf(",\"behind\":%" PRId64 ",\"error\":null", l->behind);
    else {
        fputs(",\"behind\":null", stdout);
        json_member("error", l->last_error, 0);
    }
    printf(",\"retry_requested\":%s}\n", l->retry_requested ? "true" : "false");
}

/* Whether proc has segments in the token store: 0 yes, else the exit code (the message said). */
static int dead_letters_proc_exists(struct pawl_tokens *tok, const char *proc)
{
    struct pawl_segment_status *rows = NULL;
    size_t n = 0;
    int rc = tok->ops->list(tok, proc, &rows, &n);
    pawl_tokens_rows_free(rows);
    if (rc != 0) {
        tool_err("dead-letters: cannot list the segments of %s: %s", proc,
                 pawl_tokens_errmsg(tok, (char[512]){0}, 512));
        return tool_exit_for(rc);
    }
    if (n == 0) {
        tool_err("dead-letters: no processor named %s (it has no segments in the token store; "
                 "pawl status lists the processors)",
                 proc);
        return TOOL_NOTFOUND;
    }
    return TOOL_OK;
}

int cmd_dead_letters(struct tool_config *cfg, int argc, const char *const *argv)
{
    const char *what = "list";
    const char *rest[1];
    int nrest = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "list") == 0 || strcmp(argv[i], "show") == 0 ||
            strcmp(argv[i], "retry") == 0 || strcmp(argv[i], "drop") == 0) {
            what = argv[i];
        } else if (nrest < 1) {
            rest[nrest++] = argv[i];
        } else {
            tool_err("dead-letters: unexpected argument '%s' (list, show, retry or drop)", argv[i]);
            return TOOL_USAGE;
        }
    }
    int changes = strcmp(what, "retry") == 0 || strcmp(what, "drop") == 0;
    const char *proc = proc_name(cfg, nrest, rest, "dead-letters", changes);
    if (proc == NULL)
        return TOOL_USAGE;
    const char *stream = cfg->tool.stream && cfg->tool.stream[0] ? cfg->tool.stream : NULL;
    if (strcmp(what, "list") != 0 && stream == NULL) {
        tool_err("dead-letters %s: which stream? give --stream S (dead-letters %s lists them)",
                 what, proc);
        return TOOL_USAGE;
    }
    int64_t up_to = INT64_MAX;
    if (cfg->tool.to && cfg->tool.to[0]) {
        char *end;
        long long v = strtoll(cfg->tool.to, &end, 10);
        if (strcmp(what, "drop") != 0 || *end != '\0' || v < 1) {
            tool_err("dead-letters: --to takes an index >= 1, and only with drop (got '%s')",
                     cfg->tool.to);
            return TOOL_USAGE;
        }
        up_to = v;
    }
    int json = cfg->tool.json;
    if (json && changes) {
        tool_err("dead-letters %s: --json applies to list and show only", what);
        return TOOL_USAGE;
    }
    struct stores s;
    int ex = stores_open(cfg, &s);
    if (ex != TOOL_OK)
        return ex;
    if ((ex = dead_letters_proc_exists(s.tok, proc)) != TOOL_OK) {
        stores_close(&s);
        return ex;
    }
    struct pawl_dead_letter *letters = NULL;
    struct pawl_dead_stream *streams = NULL;
    size_t n = 0;
    int rc;
    if (strcmp(what, "list") == 0) {
        rc = pawl_dead_letters_streams(s.tok, proc, &streams, &n);
        if (rc)
            goto fail;
        if (json) {
            for (size_t i = 0; i < n; i++)
                dead_stream_json(&streams[i]);
            goto out;
        }
        if (n == 0)
            printf("processor %s has no dead letters\n", proc);
        else
            printf("%-32s %-8s %-12s %-12s %-10s %-8s %s\n", "STREAM", "LETTERS", "FIRST", "LAST",
                   "AGE-S", "ATTEMPTS", "LAST-ERROR");
        for (size_t i = 0; i < n; i++) {
            char id[4 * PAWL_STREAM_ID_MAX + 1], err[1024];
            printf("%-32s %-8" PRIu64 " %-12" PRId64 " %-12" PRId64 " %-10.1f %-8u %s%s\n",
                   tool_printable(streams[i].stream_id, id, sizeof id), streams[i].letters,
                   streams[i].first_index, streams[i].last_index,
                   (double)streams[i].oldest_age_ms / 1000.0, streams[i].attempts,
                   tool_printable(streams[i].last_error, err, sizeof err),
                   streams[i].retry_requested ? "  (retry pending)" : "");
        }
        goto out;
    }
    rc = pawl_dead_letters_show(s.tok, proc, stream, &letters, &n);
    if (rc)
        goto fail;
    if (n == 0) {
        char id[4 * PAWL_STREAM_ID_MAX + 1];
        tool_err("dead-letters %s: stream %s of %s has no dead letters", what,
                 tool_printable(stream, id, sizeof id), proc);
        ex = TOOL_NOTFOUND;
        goto out;
    }
    if (json) {
        for (size_t i = 0; i < n; i++)
            dead_letter_json(&letters[i]);
        goto out;
    }
    size_t shown = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(what, "drop") == 0 && letters[i].ev.index > up_to)
            continue;
        char id[4 * PAWL_STREAM_ID_MAX + 1], type[4 * PAWL_EVENT_TYPE_MAX + 1], err[1024], at[32];
        print_time_us(letters[i].parked_us, at, sizeof at);
        printf("%s index %" PRId64 " seq %" PRId64 " type %s segment %u/%u parked %s "
               "attempts %u %s%s\n",
               tool_printable(letters[i].ev.stream_id, id, sizeof id), letters[i].ev.index,
               letters[i].ev.stream_seq, tool_printable(letters[i].ev.type, type, sizeof type),
               letters[i].seg.id, letters[i].seg.mask, at, letters[i].attempts,
               letters[i].behind ? "behind " : "error: ",
               letters[i].behind ? "" : tool_printable(letters[i].last_error, err, sizeof err));
        if (letters[i].behind)
            printf("    (waits behind index %" PRId64 ")\n", letters[i].behind);
        shown++;
    }
    if (strcmp(what, "show") == 0)
        goto out;
    printf("%s %zu letter%s of stream %s\n",
           cfg->tool.execute ? (changes && what[0] == 'r' ? "retrying" : "dropping")
                             : (what[0] == 'r' ? "would retry" : "would drop"),
           shown, shown == 1 ? "" : "s", stream);
    if (!cfg->tool.execute) {
        printf("nothing changed: add --execute to apply\n");
        goto out;
    }
    int64_t done = 0;
    if (what[0] == 'r') {
        rc = pawl_dead_letters_retry(s.tok, proc, stream, &done);
        if (rc)
            goto fail;
        printf("retry requested for %" PRId64 " letters: the node holding the stream's segment "
               "hands them over within its claim poll (pawl dead-letters %s shows the result)\n",
               done, proc);
    } else {
        rc = pawl_dead_letters_drop(s.tok, proc, stream, up_to, &done);
        if (rc)
            goto fail;
        printf("dropped %" PRId64 " letters\n", done);
    }
    goto out;
fail:
    tool_err("dead-letters %s: %s: %s", what, pawl_strerror(rc),
             pawl_tokens_errmsg(s.tok, (char[512]){0}, 512));
    ex = tool_exit_for(rc);
out:
    pawl_dead_letters_free(letters);
    pawl_dead_letters_free(streams);
    stores_close(&s);
    return ex;
}
