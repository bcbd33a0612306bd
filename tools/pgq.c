/*
 * pgq.c — see pgq.h.
 */
#include "pgq.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static PGconn *connect_db(const char *dsn, char *err, size_t errlen)
{
    PGconn *c = pawl_pq_connect(dsn, 0);
    if (c == NULL || PQstatus(c) != CONNECTION_OK) {
        snprintf(err, errlen, "cannot connect: %s", c ? PQerrorMessage(c) : "out of memory");
        PQfinish(c);
        return NULL;
    }
    return c;
}

/* Run sql; NULL (and err) unless it returned tuples or a command status. */
static PGresult *query(PGconn *c, const char *sql, int n, const char *const *v, char *err,
                       size_t errlen)
{
    PGresult *r = PQexecParams(c, sql, n, NULL, v, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
        const char *msg = PQresultErrorMessage(r);
        snprintf(err, errlen, "%s", msg && msg[0] ? msg : PQerrorMessage(c));
        size_t l = strlen(err);
        while (l > 0 && err[l - 1] == '\n')
            err[--l] = '\0';
        PQclear(r);
        return NULL;
    }
    return r;
}

static PGresult *query_st(PGconn *c, const char *sql, int n, const char *const *v, char *state,
                          char *err, size_t errlen);

/* The SQLSTATEs of a database without pawl's schema: no such schema, table or function. */
static int schema_missing(const char *state)
{
    return strcmp(state, "3F000") == 0 || strcmp(state, "42P01") == 0 ||
           strcmp(state, "42883") == 0;
}

static int64_t int_at(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

int tool_pgq_processors(const char *dsn, int64_t claim_timeout_ms, struct tool_proc_row **rows,
                        size_t *n, char *err, size_t errlen)
{
    *rows = NULL;
    *n = 0;
    PGconn *c = connect_db(dsn, err, errlen);
    if (c == NULL)
        return PAWL_ECONN;
    char ms[24];
    snprintf(ms, sizeof ms, "%lld", (long long)claim_timeout_ms);
    const char *v[1] = {ms};
    char state[6];
    PGresult *r =
        query_st(c,
                 "WITH t AS (SELECT processor, token, owner, owner IS NOT NULL AND claimed_at > "
                 "  now() - make_interval(secs => $1::int8 / 1000.0) AS live FROM pawl.tokens) "
                 "SELECT processor, count(*), count(*) FILTER (WHERE live), "
                 "  count(*) FILTER (WHERE owner IS NOT NULL AND NOT live), "
                 "  coalesce(string_agg(DISTINCT owner, ', ') FILTER (WHERE live), ''), "
                 "  min(token), (SELECT pawl_api.last_index()), "
                 "  (SELECT CASE WHEN length(f.filter::text) < 1000 THEN f.filter::text "
                 "               ELSE '{\"too_long\": true}' END "
                 "     FROM pawl.processor_filters f WHERE f.processor = t.processor) "
                 "FROM t GROUP BY processor ORDER BY processor",
                 1, v, state, err, errlen);
    int rc = 0;
    if (r == NULL) {
        rc = schema_missing(state) ? PAWL_ESCHEMA : PAWL_ESQL;
    } else {
        int nt = PQntuples(r);
        *rows = calloc(nt > 0 ? (size_t)nt : 1, sizeof **rows);
        if (*rows == NULL) {
            rc = PAWL_ENOMEM;
        } else {
            for (int i = 0; i < nt; i++) {
                struct tool_proc_row *p = &(*rows)[i];
                snprintf(p->name, sizeof p->name, "%s", PQgetvalue(r, i, 0));
                p->segments = int_at(r, i, 1);
                p->claimed = int_at(r, i, 2);
                p->expired = int_at(r, i, 3);
                snprintf(p->owners, sizeof p->owners, "%s", PQgetvalue(r, i, 4));
                p->lowest_token = int_at(r, i, 5);
                p->head = int_at(r, i, 6);
                snprintf(p->filter, sizeof p->filter, "%s",
                         PQgetisnull(r, i, 7) ? "{}" : PQgetvalue(r, i, 7));
            }
            *n = (size_t)nt;
        }
        PQclear(r);
    }
    PQfinish(c);
    return rc;
}

int tool_pgq_delete_processor(const char *dsn, const char *proc, int64_t claim_timeout_ms,
                              int64_t *deleted, char *err, size_t errlen)
{
    *deleted = 0;
    PGconn *c = connect_db(dsn, err, errlen);
    if (c == NULL)
        return PAWL_ECONN;
    char ms[24];
    snprintf(ms, sizeof ms, "%lld", (long long)claim_timeout_ms);
    const char *v[2] = {proc, ms};
    int rc = PAWL_ESQL;
    PGresult *r = query(c, "BEGIN", 0, NULL, err, errlen);
    if (r == NULL)
        goto out;
    PQclear(r);
    /* Lock the rows, then look at the claims: a node cannot claim while we decide. */
    r = query(c,
              "SELECT coalesce(string_agg(DISTINCT owner, ', ') FILTER (WHERE owner IS NOT NULL "
              "AND claimed_at > now() - make_interval(secs => $2::int8 / 1000.0)), ''), count(*) "
              "FROM (SELECT owner, claimed_at FROM pawl.tokens WHERE processor = $1 FOR UPDATE) t",
              2, v, err, errlen);
    if (r == NULL)
        goto rollback;
    if (PQgetvalue(r, 0, 0)[0] != '\0') {
        snprintf(err, errlen, "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
        rc = PAWL_EBUSY;
        goto rollback;
    }
    if (int_at(r, 0, 1) == 0) {
        PQclear(r);
        snprintf(err, errlen, "no processor named %s", proc);
        rc = PAWL_ENOTFOUND;
        goto rollback;
    }
    PQclear(r);
    r = query(c, "DELETE FROM pawl.tokens WHERE processor = $1", 1, v, err, errlen);
    if (r == NULL)
        goto rollback;
    *deleted = strtoll(PQcmdTuples(r), NULL, 10);
    PQclear(r);
    r = query(c, "DELETE FROM pawl.processor_nodes WHERE processor = $1", 1, v, err, errlen);
    if (r == NULL)
        goto rollback;
    PQclear(r);
    r = query(c, "DELETE FROM pawl.processor_filters WHERE processor = $1", 1, v, err, errlen);
    if (r == NULL)
        goto rollback;
    PQclear(r);
    r = query(c, "COMMIT", 0, NULL, err, errlen);
    if (r == NULL)
        goto out;
    PQclear(r);
    rc = 0;
    goto out;
rollback:
    PQclear(PQexec(c, "ROLLBACK"));
    if (rc == 0)
        rc = PAWL_ESQL;
out:
    PQfinish(c);
    if (rc != 0)
        *deleted = 0;
    return rc;
}

int tool_pgq_orphan_filter(const char *dsn, const char *proc, int execute, int *found, char *err,
                           size_t errlen)
{
    *found = 0;
    PGconn *c = connect_db(dsn, err, errlen);
    if (c == NULL)
        return PAWL_ECONN;
    const char *v[1] = {proc};
    PGresult *r = query(c,
                        execute ? "WITH d AS (DELETE FROM pawl.processor_filters f "
                                  "  WHERE f.processor = $1 AND NOT EXISTS (SELECT 1 FROM "
                                  "  pawl.tokens t WHERE t.processor = $1) RETURNING 1) "
                                  "SELECT count(*) FROM d"
                                : "SELECT count(*) FROM pawl.processor_filters f "
                                  "  WHERE f.processor = $1 AND NOT EXISTS (SELECT 1 FROM "
                                  "  pawl.tokens t WHERE t.processor = $1)",
                        1, v, err, errlen);
    int rc = r == NULL ? PAWL_ESQL : 0;
    if (r)
        *found = int_at(r, 0, 0) > 0;
    PQclear(r);
    PQfinish(c);
    return rc;
}

int tool_pgq_processor_filter(const char *dsn, const char *proc, char **json, char *err,
                              size_t errlen)
{
    *json = NULL;
    PGconn *c = connect_db(dsn, err, errlen);
    if (c == NULL)
        return PAWL_ECONN;
    const char *v[1] = {proc};
    PGresult *r =
        query(c, "SELECT coalesce(pawl.processor_filter_show($1)::text, '{}')", 1, v, err, errlen);
    int rc = r == NULL ? PAWL_ESQL : 0;
    if (r && (*json = strdup(PQgetvalue(r, 0, 0))) == NULL)
        rc = PAWL_ENOMEM;
    PQclear(r);
    PQfinish(c);
    return rc;
}

int tool_pgq_stream_version(const char *dsn, const char *stream, int64_t *version, char *err,
                            size_t errlen)
{
    *version = 0;
    PGconn *c = connect_db(dsn, err, errlen);
    if (c == NULL)
        return PAWL_ECONN;
    const char *v[1] = {stream};
    /* Its dropped events count too (retention keeps each stream's last dropped number). */
    PGresult *r = query(c, "SELECT pawl_api.stream_version($1)", 1, v, err, errlen);
    int rc = PAWL_ESQL;
    if (r) {
        *version = int_at(r, 0, 0);
        PQclear(r);
        rc = 0;
    }
    PQfinish(c);
    return rc;
}

int tool_pgq_event_index(const char *dsn, const char *stream, int64_t seq, int64_t *index,
                         char *err, size_t errlen)
{
    *index = 0;
    PGconn *c = connect_db(dsn, err, errlen);
    if (c == NULL)
        return PAWL_ECONN;
    char sq[24];
    snprintf(sq, sizeof sq, "%lld", (long long)seq);
    const char *v[2] = {stream, sq};
    PGresult *r = query(c,
                        "SELECT global_index FROM pawl_api.events WHERE stream_id = $1 "
                        "AND stream_seq = $2::int8",
                        2, v, err, errlen);
    int rc = PAWL_ESQL;
    if (r) {
        if (PQntuples(r) > 0)
            *index = int_at(r, 0, 0);
        PQclear(r);
        rc = 0;
    }
    PQfinish(c);
    return rc;
}

/* Like query, with the SQLSTATE of a failure in state (6 bytes). */
static PGresult *query_st(PGconn *c, const char *sql, int n, const char *const *v, char *state,
                          char *err, size_t errlen)
{
    PGresult *r = PQexecParams(c, sql, n, NULL, v, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
        const char *ss = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        snprintf(state, 6, "%s", ss ? ss : "");
        const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
        snprintf(err, errlen, "%s", msg && msg[0] ? msg : PQerrorMessage(c));
        size_t l = strlen(err);
        while (l > 0 && err[l - 1] == '\n')
            err[--l] = '\0';
        PQclear(r);
        return NULL;
    }
    state[0] = '\0';
    return r;
}

int tool_pgq_retention_plan(const char *dsn, int64_t w, struct tool_part_row **rows, size_t *n,
                            int64_t *first, int64_t *last, char *slow, size_t slowlen, char *err,
                            size_t errlen)
{
    *rows = NULL;
    *n = 0;
    if (slow && slowlen)
        slow[0] = '\0';
    PGconn *c = connect_db(dsn, err, errlen);
    if (c == NULL)
        return PAWL_ECONN;
    char ws[24];
    snprintf(ws, sizeof ws, "%lld", (long long)w);
    const char *v[1] = {ws};
    int rc = PAWL_ESQL;
    PGresult *r = query(c,
                        "SELECT relname, coalesce(lo::text, ''), coalesce(hi::text, ''), "
                        "min_index, max_index, coalesce(events, 0), bytes, finalized, drops "
                        "FROM pawl.retention_plan($1::int8)",
                        1, v, err, errlen);
    if (r == NULL)
        goto out;
    size_t m = (size_t)PQntuples(r);
    struct tool_part_row *out = calloc(m ? m : 1, sizeof *out);
    if (out == NULL) {
        PQclear(r);
        rc = PAWL_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < m; i++) {
        int row = (int)i;
        snprintf(out[i].name, sizeof out[i].name, "%s", PQgetvalue(r, row, 0));
        snprintf(out[i].lo, sizeof out[i].lo, "%s", PQgetvalue(r, row, 1));
        snprintf(out[i].hi, sizeof out[i].hi, "%s", PQgetvalue(r, row, 2));
        out[i].min_index = int_at(r, row, 3);
        out[i].max_index = int_at(r, row, 4);
        out[i].events = int_at(r, row, 5);
        out[i].bytes = int_at(r, row, 6);
        out[i].finalized = PQgetvalue(r, row, 7)[0] == 't';
        out[i].drops = PQgetvalue(r, row, 8)[0] == 't';
    }
    PQclear(r);
    *rows = out;
    *n = m;
    r = query(c, "SELECT pawl_api.first_index(), pawl_api.last_index()", 0, NULL, err, errlen);
    if (r == NULL)
        goto out;
    *first = int_at(r, 0, 0);
    *last = int_at(r, 0, 1);
    PQclear(r);
    if (slow && slowlen && w > 0) {
        r = query(c,
                  "SELECT coalesce(string_agg(format('%s at token %s', processor, t), ', ' "
                  "ORDER BY processor), '') FROM (SELECT processor, min(token) AS t "
                  "FROM pawl.tokens GROUP BY 1 HAVING min(token) < $1::int8 - 1) s",
                  1, v, err, errlen);
        if (r == NULL)
            goto out;
        snprintf(slow, slowlen, "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
    }
    rc = 0;
out:
    if (rc != 0) {
        free(*rows);
        *rows = NULL;
        *n = 0;
    }
    PQfinish(c);
    return rc;
}

/*
 * Rotation and drops take an ACCESS EXCLUSIVE lock on pawl.events. Waiting for it queues every
 * append, read and run behind the wait, so a reader's open transaction would stall the log for
 * as long as it stays open. Instead each try waits at most LOCK_TRY_MS for the lock, then backs
 * off for LOCK_PAUSE_MS (the queued sessions go on meanwhile), for up to LOCK_BUDGET_S seconds,
 * and the first refusal names the sessions holding locks on the log.
 */
#define LOCK_TRY_MS "200ms"
#define LOCK_PAUSE_MS 800
#define LOCK_BUDGET_S 30

/* The sessions other than ours holding locks on pawl.events or its partitions, described. */
static void log_holders(PGconn *c, char *out, size_t outlen)
{
    out[0] = '\0';
    PGresult *r = PQexec(
        c,
        "SELECT string_agg(DISTINCT format('pid %s (user %s, application %s, %s for %s s)', "
        "a.pid, a.usename, coalesce(nullif(a.application_name, ''), '-'), a.state, "
        "floor(extract(epoch FROM clock_timestamp() - coalesce(a.xact_start, a.query_start)))), "
        "'; ') FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.granted AND l.pid <> pg_backend_pid() AND l.locktype = 'relation' "
        "AND l.relation IN (SELECT 'pawl.events'::regclass UNION ALL "
        "SELECT inhrelid FROM pg_catalog.pg_inherits WHERE inhparent = 'pawl.events'::regclass)");
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
        snprintf(out, outlen, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
}

/*
 * Run sql (which locks the log) with the bounded lock wait above. Returns the result, or NULL
 * with err (and state) set; a lock never had in time fails with state 55P03 and a message that
 * names the holders.
 */
static PGresult *query_locking(PGconn *c, const char *what, const char *sql, int n,
                               const char *const *v, char *state, char *err, size_t errlen)
{
    char holders[1024] = "";
    PQclear(PQexec(c, "SET lock_timeout = '" LOCK_TRY_MS "'"));
    for (int waited_ms = 0;; waited_ms += LOCK_PAUSE_MS + 200) {
        PGresult *r = query_st(c, sql, n, v, state, err, errlen);
        if (r != NULL || strcmp(state, "55P03") != 0)
            return r;
        log_holders(c, holders, sizeof holders);
        if (waited_ms == 0)
            fprintf(stderr,
                    "pawl: %s waits for the log's lock, held by %s; appends and reads go on "
                    "meanwhile (trying for up to %d s)\n",
                    what, holders[0] ? holders : "a session that has ended", LOCK_BUDGET_S);
        if (waited_ms >= LOCK_BUDGET_S * 1000) {
            snprintf(err, errlen,
                     "could not take the log's lock within %d s: held by %s (end or commit "
                     "those transactions, then run it again)",
                     LOCK_BUDGET_S, holders[0] ? holders : "sessions that have ended");
            return NULL;
        }
        struct timespec ts = {0, LOCK_PAUSE_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
}

int tool_pgq_rotate(const char *dsn, char *part, size_t partlen, char *err, size_t errlen)
{
    part[0] = '\0';
    PGconn *c = connect_db(dsn, err, errlen);
    if (c == NULL)
        return PAWL_ECONN;
    int rc = PAWL_ESQL;
    char state[6];
    PGresult *r = query_locking(c, "rotation", "SELECT coalesce(pawl.rotate(), '')", 0, NULL, state,
                                err, errlen);
    if (r) {
        snprintf(part, partlen, "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
        rc = 0;
    } else if (strcmp(state, "55P03") == 0) {
        rc = PAWL_EBUSY;
    }
    PQfinish(c);
    return rc;
}

int tool_pgq_retention_drop(const char *dsn, int64_t w, int force, int64_t *parts, int64_t *bytes,
                            char *err, size_t errlen)
{
    *parts = 0;
    *bytes = 0;
    PGconn *c = connect_db(dsn, err, errlen);
    if (c == NULL)
        return PAWL_ECONN;
    char ws[24], state[6];
    snprintf(ws, sizeof ws, "%lld", (long long)w);
    const char *v[2] = {ws, force ? "true" : "false"};
    int rc = PAWL_ESQL;
    PGresult *r = query_locking(c, "the drop",
                                "SELECT count(*), coalesce(sum(bytes), 0) "
                                "FROM pawl.retention_drop($1::int8, $2::boolean)",
                                2, v, state, err, errlen);
    if (r) {
        *parts = int_at(r, 0, 0);
        *bytes = int_at(r, 0, 1);
        PQclear(r);
        rc = 0;
    } else if (strcmp(state, "PW021") == 0) {
        rc = PAWL_EBUSY;
    } else if (strcmp(state, "22023") == 0) {
        rc = PAWL_EINVAL;
    } else if (PQstatus(c) != CONNECTION_OK) {
        rc = PAWL_ECONN;
    }
    PQfinish(c);
    return rc;
}
