/*
 * pgq.c — see pgq.h.
 */
#include "pgq.h"

#include <libpq-fe.h>
#include <stdlib.h>
#include <string.h>

static PGconn *connect_db(const char *dsn, char *err, size_t errlen)
{
    PGconn *c = PQconnectdb(dsn);
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
    PGresult *r = query(
        c,
        "WITH t AS (SELECT processor, token, owner, owner IS NOT NULL AND claimed_at > "
        "  now() - make_interval(secs => $1::int8 / 1000.0) AS live FROM pawl.tokens) "
        "SELECT processor, count(*), count(*) FILTER (WHERE live), "
        "  count(*) FILTER (WHERE owner IS NOT NULL AND NOT live), "
        "  coalesce(string_agg(DISTINCT owner, ', ') FILTER (WHERE live), ''), min(token), "
        "  (SELECT pawl_api.last_index()) "
        "FROM t GROUP BY processor ORDER BY processor",
        1, v, err, errlen);
    int rc = 0;
    if (r == NULL) {
        rc = PAWL_ESQL;
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

int tool_pgq_stream_version(const char *dsn, const char *stream, int64_t *version, char *err,
                            size_t errlen)
{
    *version = 0;
    PGconn *c = connect_db(dsn, err, errlen);
    if (c == NULL)
        return PAWL_ECONN;
    const char *v[1] = {stream};
    PGresult *r = query(c, "SELECT coalesce(max(stream_seq), 0) FROM pawl.events "
                           "WHERE stream_id = $1",
                        1, v, err, errlen);
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
    PGresult *r = query(c, "SELECT global_index FROM pawl_api.events WHERE stream_id = $1 "
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
