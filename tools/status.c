/*
 * status.c — see status.h. JSON goes out through jansson.
 */
#include "status.h"

#include "filter_opt.h"
#include "position.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void tool_status_fini(struct tool_status *st)
{
    if (st == NULL)
        return;
    free(st->rows);
    memset(st, 0, sizeof *st);
}

/* The event belongs to the row's unhandled events. */
static int pending_in(const struct tool_seg_row *r, uint32_t h, int64_t index)
{
    if (!pawl_segment_contains(r->st.seg, h) || index <= r->st.token)
        return 0;
    /* During a merge, the faster half's events up to merge_token are handled already. */
    if (r->st.has_merge && pawl_segment_contains(r->st.merge_seg, h) && index <= r->st.merge_token)
        return 0;
    return 1;
}

int tool_status_collect(struct pawl_tokens *tokens, struct pawl_source *source, const char *proc,
                        int64_t scan_limit, struct tool_status *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    snprintf(out->proc, sizeof out->proc, "%s", proc);
    struct pawl_segment_status *rows = NULL;
    size_t n = 0;
    int rc = tokens->ops->list(tokens, proc, &rows, &n);
    if (rc != 0) {
        snprintf(err, errlen, "cannot list the segments of %s: %s", proc,
                 pawl_tokens_errmsg(tokens, (char[512]){0}, 512));
        return rc;
    }
    if (n == 0) {
        pawl_tokens_rows_free(rows);
        snprintf(err, errlen, "no processor named %s (it has no segments in the token store)",
                 proc);
        return PAWL_ENOTFOUND;
    }
    out->rows = calloc(n, sizeof *out->rows);
    if (out->rows == NULL) {
        pawl_tokens_rows_free(rows);
        return PAWL_ENOMEM;
    }
    out->n = n;
    int64_t low = INT64_MAX;
    for (size_t i = 0; i < n; i++) {
        out->rows[i].st = rows[i];
        if (rows[i].token < low)
            low = rows[i].token;
    }
    pawl_tokens_rows_free(rows);

    rc = source->ops->head(source, &out->head);
    if (rc != 0) {
        snprintf(err, errlen, "cannot read the log's head: %s",
                 pawl_source_errmsg(source, (char[512]){0}, 512));
        tool_status_fini(out);
        return rc;
    }
    out->now_us = pawl_wall_us();

    /* One scan from the lowest token, bucketing events into the segments they belong to. */
    struct pawl_event_batch b;
    pawl_event_batch_init(&b);
    int64_t after = low;
    int complete = 1;
    while (after < out->head) {
        if (out->scanned >= scan_limit) {
            complete = 0;
            break;
        }
        pawl_event_batch_clear(&b);
        int64_t seen = after;
        size_t want = (size_t)TOOL_MIN((int64_t)1000, scan_limit - out->scanned);
        rc = source->ops->read(source, after, want, &b, &seen);
        if (rc != 0) {
            snprintf(err, errlen, "cannot read the log: %s",
                     pawl_source_errmsg(source, (char[512]){0}, 512));
            pawl_event_batch_fini(&b);
            tool_status_fini(out);
            return rc;
        }
        for (size_t e = 0; e < b.n; e++) {
            const struct pawl_event *ev = &b.events[e];
            uint32_t h = pawl_stream_hash(ev->stream_id);
            for (size_t i = 0; i < out->n; i++) {
                struct tool_seg_row *r = &out->rows[i];
                if (!pending_in(r, h, ev->index))
                    continue;
                if (r->lag_events++ == 0)
                    r->oldest_us = ev->appended_at_us;
            }
        }
        out->scanned += (int64_t)b.n;
        if (seen <= after)
            break; /* nothing more readable (events not finalized yet) */
        after = seen;
    }
    pawl_event_batch_fini(&b);
    for (size_t i = 0; i < out->n; i++) {
        struct tool_seg_row *r = &out->rows[i];
        /* A segment is exact when the scan passed its token and reached the head. */
        r->lag_exact = complete;
        if (!complete && r->lag_events == 0)
            r->lag_events = out->head > r->st.token ? out->head - r->st.token : 0;
        else if (!complete)
            r->lag_events = TOOL_MAX(r->lag_events, out->head - r->st.token);
        if (r->oldest_us > 0 && r->lag_events > 0)
            r->lag_seconds = TOOL_MAX(0.0, (double)(out->now_us - r->oldest_us) / 1e6);
    }
    return 0;
}

void tool_status_owners(const struct tool_status *st, char *out, size_t outlen)
{
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < st->n; i++) {
        const char *o = st->rows[i].st.owner;
        if (o[0] == '\0' || tool_status_claim_expired(st, &st->rows[i].st))
            continue;
        int dup = 0;
        for (size_t j = 0; j < i; j++)
            if (strcmp(st->rows[j].st.owner, o) == 0)
                dup = 1;
        if (dup)
            continue;
        char shown[4 * PAWL_OWNER_MAX + 8];
        int k = snprintf(out + used, outlen - used, "%s%s", used ? ", " : "",
                         tool_printable(o, shown, sizeof shown));
        if (k < 0 || (size_t)k >= outlen - used)
            break;
        used += (size_t)k;
    }
}

/* The checkpoint mode the owner wrote; unowned rows have none. */
static const char *mode_text(int mode)
{
    return mode < 0 ? "-" : pawl_ckpt_mode_name((enum pawl_ckpt_mode)mode);
}

static void fmt_age_ms(int64_t ms, char *buf, size_t len)
{
    if (ms < 0)
        snprintf(buf, len, "-");
    else if (ms < 10000)
        snprintf(buf, len, "%.1fs", (double)ms / 1000);
    else
        snprintf(buf, len, "%" PRId64 "s", ms / 1000);
}

int tool_status_claim_expired(const struct tool_status *st, const struct pawl_segment_status *r)
{
    return st->claim_timeout_ms > 0 && r->owner[0] != '\0' &&
           r->claim_age_ms >= st->claim_timeout_ms;
}

/*
 * The sessions with a lock on the finalizer's gate in a mode that conflicts with its EXCLUSIVE
 * (every mode but ACCESS SHARE), granted or waiting, in this database. The gate is found through
 * the catalogs, not by name (to_regclass): a login without USAGE on pawl_locks cannot name it,
 * and the query works whichever of the two gates the schema has. A prepared transaction holds
 * its locks without a backend (pid NULL); its gid, owner and age come from pg_prepared_xacts
 * where its virtual transaction reads -1/xid, and stay unknown otherwise. How long: a holder
 * since its transaction began, a waiter since it asked (waitstart), a prepared transaction since
 * it was prepared; NULL where pg_stat_activity hides another login's session.
 */
static const char FIN_LOCK_SQL[] =
    "SELECT coalesce(l.pid, 0), l.granted, l.mode,"
    "       coalesce(a.usename::text, p.owner::text, ''), coalesce(a.application_name, ''),"
    "       coalesce(p.gid, ''),"
    "       extract(epoch FROM clock_timestamp() - CASE WHEN NOT l.granted THEN l.waitstart"
    "                                                   WHEN l.pid IS NULL THEN p.prepared"
    "                                                   ELSE a.xact_start END)::float8"
    "  FROM pg_catalog.pg_locks l"
    "  JOIN pg_catalog.pg_class c ON c.oid = l.relation"
    "  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    "  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid"
    "  LEFT JOIN pg_catalog.pg_prepared_xacts p"
    "         ON l.pid IS NULL AND l.virtualtransaction = '-1/' || p.transaction::text"
    " WHERE l.locktype = 'relation' AND l.mode <> 'AccessShareLock'"
    "   AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d"
    "                      WHERE d.datname = pg_catalog.current_database())"
    "   AND ((n.nspname = 'pawl_locks' AND c.relname = 'finalizer')"
    "        OR (n.nspname = 'pawl' AND c.relname = 'finalizer_gate'))"
    " ORDER BY l.granted DESC, 7 DESC NULLS LAST, 1";

void tool_status_finalizer_lock(const char *dsn, struct tool_fin_lock *out)
{
    memset(out, 0, sizeof *out);
    PGconn *c = pawl_pq_connect(dsn, 0);
    if (PQstatus(c) != CONNECTION_OK) {
        out->known = -1;
        snprintf(out->why, sizeof out->why, "%s", PQerrorMessage(c));
        PQfinish(c);
        return;
    }
    PGresult *r = PQexec(c, FIN_LOCK_SQL);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        out->known = -1;
        snprintf(out->why, sizeof out->why, "%s", PQerrorMessage(c));
    } else {
        out->known = 1;
        int rows = PQntuples(r);
        for (int i = 0; i < rows; i++) {
            if (out->n == TOOL_FIN_SESSIONS_MAX) {
                out->more = rows - i;
                break;
            }
            struct tool_fin_session *f = &out->s[out->n++];
            f->pid = (int)strtol(PQgetvalue(r, i, 0), NULL, 10);
            f->granted = PQgetvalue(r, i, 1)[0] == 't';
            out->held |= f->granted;
            snprintf(f->mode, sizeof f->mode, "%s", PQgetvalue(r, i, 2));
            snprintf(f->user, sizeof f->user, "%s", PQgetvalue(r, i, 3));
            snprintf(f->app, sizeof f->app, "%s", PQgetvalue(r, i, 4));
            snprintf(f->gid, sizeof f->gid, "%s", PQgetvalue(r, i, 5));
            f->held_s = PQgetisnull(r, i, 6) ? -1 : strtod(PQgetvalue(r, i, 6), NULL);
        }
    }
    /* one line: libpq's messages end with a newline */
    size_t n = strlen(out->why);
    while (n > 0 && (out->why[n - 1] == '\n' || out->why[n - 1] == '\r'))
        out->why[--n] = '\0';
    PQclear(r);
    PQfinish(c);
}

/*
 * Text any client chose (an application or login name, a gid): control characters, quotes and
 * backslashes come out escaped (\\n, \\t, \\', \\\\, \\xNN), so that it can neither forge nor
 * break a line; with ascii_only, bytes from 0x80 up too (for JSON, which needs valid UTF-8).
 */
static void escape_app(const char *in, char *out, size_t len, int ascii_only)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p && o + 5 < len; p++) {
        if (*p == '\n')
            o += (size_t)snprintf(out + o, len - o, "\\n");
        else if (*p == '\t')
            o += (size_t)snprintf(out + o, len - o, "\\t");
        else if (*p == '\'' || *p == '\\')
            o += (size_t)snprintf(out + o, len - o, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f || (ascii_only && *p >= 0x80))
            o += (size_t)snprintf(out + o, len - o, "\\x%02x", *p);
        else
            out[o++] = (char)*p;
    }
    out[o] = '\0';
}

/* Text a client chose as a JSON string: jansson escapes control characters itself; text that is
 * not valid UTF-8 (which jansson refuses) goes out escaped to ASCII. */
static json_t *json_text(const char *s)
{
    json_t *j = json_string(s);
    if (j == NULL) {
        char esc[4 * 256 + 1];
        escape_app(s, esc, sizeof esc, 1);
        j = json_string(esc);
    }
    return j;
}

int tool_status_fin_lock_lines(const struct tool_fin_lock *f)
{
    if (f->known < 0 || f->n == 0)
        return 1;
    return f->n + (f->more > 0);
}

void tool_status_fin_lock_text(const struct tool_fin_lock *f, int i, char *buf, size_t len)
{
    if (f->known < 0) {
        snprintf(buf, len, "finalizer lock: unknown (%s)", f->why);
        return;
    }
    if (f->n == 0) {
        snprintf(buf, len, "finalizer lock: free");
        return;
    }
    if (i >= f->n) {
        snprintf(buf, len, "finalizer lock: and %d more session%s", f->more,
                 f->more == 1 ? "" : "s");
        return;
    }
    const struct tool_fin_session *s = &f->s[i];
    /* The finalizer's own mode holds the gate; any other granted mode keeps the finalizer out. */
    const char *what = !s->granted                             ? "wanted"
                       : strcmp(s->mode, "ExclusiveLock") == 0 ? "held"
                                                               : "blocked";
    char user[4 * sizeof s->user + 1], app[4 * sizeof s->app + 1];
    char who[4 * (sizeof s->user + sizeof s->app + sizeof s->gid) + 64];
    escape_app(s->user, user, sizeof user, 0);
    escape_app(s->app, app, sizeof app, 0);
    if (s->pid != 0) {
        snprintf(who, sizeof who, "pid %d (user '%s', application '%s', ", s->pid, user, app);
    } else {
        /* Its gid and owner when pg_prepared_xacts named it. */
        char gid[4 * sizeof s->gid + 1];
        escape_app(s->gid, gid, sizeof gid, 0);
        snprintf(who, sizeof who, "a prepared transaction%s%s%s (%s%s%s", s->gid[0] ? " '" : "",
                 gid, s->gid[0] ? "'" : "", s->user[0] ? "user '" : "", user,
                 s->user[0] ? "', " : "");
    }
    char dur[48] = "";
    if (s->held_s >= 0)
        snprintf(dur, sizeof dur, ", %s %.0f s", s->granted ? "for" : "waiting", s->held_s);
    snprintf(buf, len, "finalizer lock: %s by %s%s%s)", what, who, s->mode, dur);
}

void tool_status_print_table(FILE *f, const struct tool_status *st)
{
    int64_t total = 0;
    int exact = 1;
    for (size_t i = 0; i < st->n; i++) {
        total += st->rows[i].lag_events;
        exact &= st->rows[i].lag_exact;
    }
    /* Processor names are checked ([A-Za-z0-9_.:-]); owners are any printable text, escaped. */
    fprintf(f, "PROCESSOR %s   HEAD %" PRId64 "   SEGMENTS %zu   LAG %s%" PRId64 " events\n\n",
            st->proc, st->head, st->n, exact ? "" : "<= ", total);
    if (st->filter && strcmp(st->filter, "{}") != 0) {
        struct tool_filter tf;
        char desc[1024] = "", e[256];
        if (tool_filter_from_json(st->filter, &tf, e, sizeof e) == 0)
            tool_filter_describe(&tf, desc, sizeof desc);
        tool_filter_fini(&tf);
        fprintf(f, "filter: %s (lag counts the events it selects)\n\n", desc[0] ? desc : "?");
    }
    if (st->fin.known != 0) {
        char line[2048];
        for (int i = 0; i < tool_status_fin_lock_lines(&st->fin); i++) {
            tool_status_fin_lock_text(&st->fin, i, line, sizeof line);
            fprintf(f, "%s\n", line);
        }
        fputc('\n', f);
    }
    fprintf(f, "%-8s %-10s %-24s %-9s %-12s %-12s %-11s %-9s %-8s %s\n", "SEGMENT", "MASK", "OWNER",
            "CLAIM-AGE", "TOKEN", "HEAD", "LAG-EVENTS", "LAG-SEC", "MODE", "NOTE");
    for (size_t i = 0; i < st->n; i++) {
        const struct tool_seg_row *r = &st->rows[i];
        char age[32], lag[32], lagsec[32], note[96] = "", owner[4 * PAWL_OWNER_MAX + 8];
        fmt_age_ms(r->st.claim_age_ms, age, sizeof age);
        snprintf(lag, sizeof lag, "%s%" PRId64, r->lag_exact ? "" : "<=", r->lag_events);
        snprintf(lagsec, sizeof lagsec, "%.1f", r->lag_seconds);
        if (r->st.high_water > r->st.token)
            snprintf(note, sizeof note, "replaying to %" PRId64, r->st.high_water);
        if (r->st.has_merge)
            snprintf(note + strlen(note), sizeof note - strlen(note), "%smerging %u/%u to %" PRId64,
                     note[0] ? "; " : "", r->st.merge_seg.id, r->st.merge_seg.mask,
                     r->st.merge_token);
        if (tool_status_claim_expired(st, &r->st))
            snprintf(note + strlen(note), sizeof note - strlen(note),
                     "%sclaim expired (node gone?)", note[0] ? "; " : "");
        fprintf(f, "%-8u 0x%-8x %-24s %-9s %-12" PRId64 " %-12" PRId64 " %-11s %-9s %-8s %s\n",
                r->st.seg.id, r->st.seg.mask,
                r->st.owner[0] ? tool_printable(r->st.owner, owner, sizeof owner) : "-", age,
                r->st.token, st->head, lag, lagsec, mode_text(r->st.mode), note);
    }
}

int tool_status_print_json(FILE *f, const struct tool_status *st, int pretty)
{
    json_t *o = json_object();
    json_t *segs = json_array();
    if (o == NULL || segs == NULL) {
        json_decref(o);
        json_decref(segs);
        return PAWL_ENOMEM;
    }
    int64_t total = 0;
    int exact = 1;
    for (size_t i = 0; i < st->n; i++) {
        const struct tool_seg_row *r = &st->rows[i];
        total += r->lag_events;
        exact &= r->lag_exact;
        json_t *s = json_object();
        json_object_set_new(s, "segment", json_integer(r->st.seg.id));
        json_object_set_new(s, "mask", json_integer(r->st.seg.mask));
        json_object_set_new(s, "owner", r->st.owner[0] ? json_string(r->st.owner) : json_null());
        json_object_set_new(s, "claim_age_ms",
                            r->st.claim_age_ms >= 0 ? json_integer(r->st.claim_age_ms)
                                                    : json_null());
        json_object_set_new(s, "claim_expired",
                            json_boolean(tool_status_claim_expired(st, &r->st)));
        json_object_set_new(s, "token", json_integer(r->st.token));
        json_object_set_new(s, "head", json_integer(st->head));
        json_object_set_new(s, "lag_events", json_integer(r->lag_events));
        json_object_set_new(s, "lag_exact", json_boolean(r->lag_exact));
        json_object_set_new(s, "lag_seconds", json_real(r->lag_seconds));
        json_object_set_new(s, "mode",
                            r->st.mode < 0 ? json_null() : json_string(mode_text(r->st.mode)));
        json_object_set_new(s, "high_water", json_integer(r->st.high_water));
        json_object_set_new(s, "replaying", json_boolean(r->st.high_water > r->st.token));
        if (r->st.has_merge) {
            json_t *m = json_object();
            json_object_set_new(m, "segment", json_integer(r->st.merge_seg.id));
            json_object_set_new(m, "mask", json_integer(r->st.merge_seg.mask));
            json_object_set_new(m, "token", json_integer(r->st.merge_token));
            json_object_set_new(s, "merge", m);
        } else {
            json_object_set_new(s, "merge", json_null());
        }
        json_array_append_new(segs, s);
    }
    json_object_set_new(o, "processor", json_string(st->proc));
    json_object_set_new(o, "head", json_integer(st->head));
    json_object_set_new(o, "lag_events", json_integer(total));
    json_object_set_new(o, "lag_exact", json_boolean(exact));
    json_t *fj =
        st->filter && strcmp(st->filter, "{}") != 0 ? json_loads(st->filter, 0, NULL) : NULL;
    json_object_set_new(o, "filter", fj ? fj : json_null());
    json_object_set_new(o, "time_us", json_integer(st->now_us));
    if (st->fin.known > 0) {
        /* held, and the first session's pid, application and seconds at the top as before;
         * every session (up to TOOL_FIN_SESSIONS_MAX, then "more") in sessions. */
        json_t *fl = json_object();
        json_object_set_new(fl, "held", json_boolean(st->fin.held));
        json_t *sessions = json_array();
        for (int i = 0; i < st->fin.n; i++) {
            const struct tool_fin_session *fs = &st->fin.s[i];
            json_t *js = json_object();
            json_object_set_new(js, "pid", fs->pid ? json_integer(fs->pid) : json_null());
            if (fs->pid == 0)
                json_object_set_new(js, "prepared", json_text(fs->gid));
            json_object_set_new(js, "user", json_text(fs->user));
            json_object_set_new(js, "application", json_text(fs->app));
            json_object_set_new(js, "mode", json_string(fs->mode));
            json_object_set_new(js, "granted", json_boolean(fs->granted));
            json_object_set_new(js, "seconds",
                                fs->held_s >= 0 ? json_real(fs->held_s) : json_null());
            if (i == 0) {
                json_object_set(fl, "pid", json_object_get(js, "pid"));
                json_object_set(fl, "application", json_object_get(js, "application"));
                json_object_set(fl, "seconds", json_object_get(js, "seconds"));
            }
            json_array_append_new(sessions, js);
        }
        json_object_set_new(fl, "sessions", sessions);
        if (st->fin.more > 0)
            json_object_set_new(fl, "more", json_integer(st->fin.more));
        json_object_set_new(o, "finalizer_lock", fl);
    } else if (st->fin.known < 0) {
        json_object_set_new(o, "finalizer_lock", json_null());
    }
    json_object_set_new(o, "segments", segs);
    int rc = json_dumpf(o, f, (pretty ? JSON_INDENT(2) : JSON_COMPACT) | JSON_PRESERVE_ORDER);
    fputc('\n', f);
    json_decref(o);
    return rc == 0 ? 0 : PAWL_ESYS;
}

/* Over tool_pos_parse (position.h), for the library's reset kinds: a time ago is taken from
 * now_us; an offset (-N) has no reset kind (reset resolves positions itself). */
int tool_parse_reset_target(const char *to, int64_t now_us, enum pawl_reset_kind *kind,
                            int64_t *value, char *err, size_t errlen)
{
    struct tool_pos p;
    *value = 0;
    int rc = tool_pos_parse("--to", to, &p, err, errlen);
    if (rc != 0)
        return rc;
    switch (p.kind) {
    case TOOL_POS_START:
        *kind = PAWL_RESET_START;
        return 0;
    case TOOL_POS_END:
        *kind = PAWL_RESET_END;
        return 0;
    case TOOL_POS_INDEX:
        *kind = PAWL_RESET_INDEX;
        *value = p.value;
        return 0;
    case TOOL_POS_OFFSET:
        snprintf(err, errlen, "--to %.40s: an offset from the end needs the log to resolve it", to);
        return PAWL_EINVAL;
    case TOOL_POS_AGO:
        if (p.value > now_us) {
            snprintf(err, errlen, "--to %.40s: reaches back before 1970", to);
            return PAWL_ERANGE;
        }
        *kind = PAWL_RESET_TIME;
        *value = now_us - p.value;
        return 0;
    case TOOL_POS_TIME:
        *kind = PAWL_RESET_TIME;
        *value = p.value;
        return 0;
    }
    snprintf(err, errlen, "--to %.40s: not a reset target", to);
    return PAWL_EINVAL;
}
