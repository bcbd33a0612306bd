/*
 * direct.c — a blocking append on the caller's own thread (append_direct). When pawl_append or
 * pawl_append_seqs finds the store idle (no other append in flight), the caller sends the
 * append itself, over a connection of the store's that no I/O thread drives, and waits for the
 * answer in its own recv: the hand-offs to the log loop and back (two thread wake-ups per
 * append, most of a lone writer's client CPU) are gone, and the append is one round trip as a
 * plain INSERT's is. Everything after the answer is the pool path's: the outcome goes to
 * pawl__log_op_outcome (retries, in-doubt checks, statistics, the finalizer's signal, the
 * caller's result), and what the direct connection cannot do goes to the log connections.
 *
 * The connection (struct direct, in the store; the session "pawl direct") is opened by the
 * second such append (a process that appends once pays no extra connection), with the log
 * connections' session statements, and only while they are up; it is not watched between appends,
 * so each append first reads what the server sent meanwhile (an idle session ended by the server, a
 * restart): a dead connection is closed and the append goes through the log connections, and the
 * next attempt to reconnect waits out a back-off (reconnect_min_ms doubling to reconnect_max_ms).
 *
 * The statement is the pool's: pawl.append alone in an implicit transaction, its result flushed
 * before the Sync commits (the xid is known before the commit can be in doubt). Outcomes:
 *   - answered and committed, or refused by the server (an SQL error, rolled back): as the pool
 *     path (pawl__log_op_outcome);
 *   - the connection lost before the Sync was sent, or the session ended by the server while
 *     the statement ran (its error of class 57 or 08 instead of its result: the commit never
 *     ran): nothing committed, so the append goes again through the log connections;
 *   - the session ended (class 57 or 08) after the statement's result: not committed, as the
 *     pool path reports it (PAWL_ECONN), and not sent again;
 *   - lost after the Sync was sent: in doubt, checked as the pool path checks (the xid arrived
 *     with the result), or reported in doubt.
 * Thread safety: struct direct is used by one caller at a time (mu, taken with trylock by a
 * caller that found the store idle; a busy one goes through the pool). Never on an I/O thread.
 */
#include "log_internal.h"

#include "dsn.h"

#include <poll.h>
#include <stdio.h>
#include <string.h>

/* The name of the append statement on the direct connection. */
static const char DIRECT_STMT[] = "pawl_direct_append";

/* The server ended the session while it was idle (a FATAL notice of class 57 or 08). */
static void notice_rx(void *arg, const PGresult *res)
{
    struct pawl_store *s = arg;
    const char *sev = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
    const char *ss = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    if (sev && strcmp(sev, "FATAL") == 0 && ss &&
        (strncmp(ss, "57", 2) == 0 || strncmp(ss, "08", 2) == 0))
        s->direct.fatal_idle = 1;
    PAWL_DEBUG("log", "direct append connection: server says: %s", PQresultErrorMessage(res));
}

/* Copy src into dst (truncating) without its trailing newlines and spaces. */
static void copy_msg(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "");
    size_t n = strlen(dst);
    while (n > 0 && (dst[n - 1] == '\n' || dst[n - 1] == ' '))
        dst[--n] = '\0';
}

static void direct_close(struct pawl_store *s, const char *why)
{
    struct direct *d = &s->direct;
    if (d->pg == NULL)
        return;
    PAWL_DEBUG("log", "direct append connection closed: %s", why);
    PQfinish(d->pg);
    d->pg = NULL;
    int64_t now = pawl_now_ns();
    d->retry_at_ns = now + (int64_t)d->backoff_ms * 1000000;
    d->backoff_ms = PAWL_MIN(d->backoff_ms * 2, s->o.reconnect_max_ms);
}

/* Wait (poll) until the connection attempt can go on, or the deadline passes: 0, or -1. */
static int connect_wait(PGconn *pg, PostgresPollingStatusType st, int64_t deadline_ns)
{
    int64_t left = deadline_ns - pawl_now_ns();
    if (left <= 0)
        return -1;
    struct pollfd pfd = {.fd = PQsocket(pg),
                         .events = st == PGRES_POLLING_READING ? POLLIN : POLLOUT};
    int ms = (int)PAWL_MIN(left / 1000000 + 1, 1000);
    return poll(&pfd, 1, ms) < 0 ? -1 : 0;
}

/* One statement of the session's set-up, or the PREPARE: 0, or -1 with the reason in why. */
static int setup_ok(PGresult *r, char *why, size_t len)
{
    ExecStatusType st = PQresultStatus(r);
    int ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
    if (!ok)
        snprintf(why, len, "%s", r ? PQresultErrorMessage(r) : "out of memory");
    PQclear(r);
    return ok ? 0 : -1;
}

/* Open the direct connection on the caller's thread, within DIRECT_CONNECT_MS (or
 * connect_timeout_ms if shorter): the log connections are up, so a server slow to take a new
 * session costs this append that long at most, and it then goes through them. 0, or -1. */
#define DIRECT_CONNECT_MS 1000
static int direct_open(struct pawl_store *s)
{
    struct direct *d = &s->direct;
    char why[256] = "";
    int64_t deadline =
        pawl_now_ns() + (int64_t)PAWL_MIN(s->o.connect_timeout_ms, DIRECT_CONNECT_MS) * 1000000;
    PGconn *pg = pawl_pq_connect(s->dsn, 1);
    if (pg == NULL) { /* out of memory: not again before the back-off */
        d->retry_at_ns = pawl_now_ns() + (int64_t)d->backoff_ms * 1000000;
        return -1;
    }
    PostgresPollingStatusType st = PGRES_POLLING_WRITING;
    while (PQstatus(pg) != CONNECTION_BAD && st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED) {
        if (connect_wait(pg, st, deadline) != 0) {
            snprintf(why, sizeof why, "connection attempt timed out");
            break;
        }
        st = PQconnectPoll(pg);
    }
    int rc = st == PGRES_POLLING_OK && PQstatus(pg) == CONNECTION_OK ? 0 : -1;
    if (rc != 0 && why[0] == '\0')
        snprintf(why, sizeof why, "%s", PQerrorMessage(pg));
    d->pg = pg;
    d->fatal_idle = 0;
    if (rc == 0)
        PQsetNoticeReceiver(pg, notice_rx, s);
    if (rc == 0) {
        /* The log connections' settings, under a name of its own: one round trip (several
         * statements in one simple query). */
        char sql[1024];
        size_t len = 0;
        for (int i = 0; s->main_session[i] != NULL && len < sizeof sql; i++)
            len += (size_t)snprintf(sql + len, sizeof sql - len, "%s; ", s->main_session[i]);
        if (len < sizeof sql)
            snprintf(sql + len, sizeof sql - len, "SET application_name = 'pawl direct'");
        rc = len < sizeof sql ? setup_ok(PQexec(pg, sql), why, sizeof why) : -1;
        if (len >= sizeof sql)
            snprintf(why, sizeof why, "session statements too long");
    }
    if (rc == 0)
        rc = setup_ok(PQprepare(pg, DIRECT_STMT, pawl__log_append_sql, 9, pawl__log_append_types),
                      why, sizeof why);
    if (rc == 0 && PQenterPipelineMode(pg) != 1) {
        snprintf(why, sizeof why, "%s", PQerrorMessage(pg));
        rc = -1;
    }
    if (rc != 0) {
        char clean[256];
        direct_close(s, pawl__dsn_scrub(s->dsn, why, clean, sizeof clean));
        return -1;
    }
    d->backoff_ms = s->o.reconnect_min_ms;
    PAWL_DEBUG("log", "direct append connection open (backend pid %d)", PQbackendPID(pg));
    return 0;
}

/* Whether the direct connection can take an append now: open (opening it when due) and, by
 * what the server sent since the last append, still alive. */
static int direct_usable(struct pawl_store *s)
{
    struct direct *d = &s->direct;
    if (d->pg != NULL) {
        /* An idle session the server ended (terminated, restarted, idle_session_timeout) has
         * sent its FATAL notice and closed: read it now rather than fail the append. */
        if (PQconsumeInput(d->pg) == 0 || PQstatus(d->pg) != CONNECTION_OK || d->fatal_idle) {
            direct_close(s, "the server ended the session");
            return 0;
        }
        return 1;
    }
    /* Not for a process's first blocking append (a one-off append would pay a connection for
     * nothing), not while the log connections are down, not before the back-off ends. */
    if (d->eligible < 2)
        d->eligible++;
    if (d->eligible < 2 || pawl__pgpool_ready(s->main) == 0 || pawl_now_ns() < d->retry_at_ns)
        return 0;
    return direct_open(s) == 0;
}

/* The session is gone (PQstatus BAD) during an append: what it may have done, as pgpipe.c's
 * lost_rc says of a request (sync_sent: the Sync went out; err_sqlstate: the statement's
 * error, if it returned one). */
static int lost_rc(int sync_sent, const char *err_sqlstate)
{
    if (err_sqlstate[0] != '\0' &&
        (strncmp(err_sqlstate, "57", 2) == 0 || strncmp(err_sqlstate, "08", 2) == 0))
        return PAWL_ECONN; /* ended mid-statement: the Sync's commit never ran */
    if (err_sqlstate[0] != '\0')
        return PAWL_ESQL; /* refused before the session ended: nothing committed */
    return sync_sent ? PAWL_EINDOUBT : PAWL_ECONN;
}

/*
 * Run op on the direct connection (d->mu held). Returns the outcome for pawl__log_op_outcome
 * (with op->req's sqlstate and message filled in), or PAWL_EAGAIN: nothing committed, send it
 * through the log connections.
 */
static int direct_exec(struct pawl_store *s, struct append_op *op)
{
    PGconn *pg = s->direct.pg;
    struct pawl_pgreq *req = &op->req;
    char err_sqlstate[6] = "";
    int got_ok = 0, got_err = 0, sync_seen = 0, sync_sent = 0;
    if (!PQsendQueryPrepared(pg, DIRECT_STMT, 9, op->en.values, op->en.lengths, op->en.formats,
                             0) ||
        !PQsendFlushRequest(pg)) {
        direct_close(s, PQerrorMessage(pg));
        return PAWL_EAGAIN;
    }
    sync_sent = PQpipelineSync(pg) == 1;
    /* The statement's result (flushed before the Sync runs), its end, then the Sync's. A
     * failed commit shows as an error after the statement's end. */
    for (int guard = 0; sync_sent && !sync_seen && guard < 8; guard++) {
        PGresult *r = PQgetResult(pg);
        if (r == NULL) {
            if (PQstatus(pg) != CONNECTION_OK)
                break;
            continue; /* the end of the statement's results */
        }
        ExecStatusType st = PQresultStatus(r);
        if (st == PGRES_PIPELINE_SYNC) {
            sync_seen = 1;
        } else if (st == PGRES_TUPLES_OK) {
            if (PQntuples(r) == 1)
                pawl__log_enc_result_row(&op->en, r, 0);
            got_ok = 1;
        } else if (!got_err && st != PGRES_PIPELINE_ABORTED) {
            /* The server's error (with its SQLSTATE: rolled back at the Sync), or libpq's own
             * (none: what the server did is not known). */
            const char *ss = PQresultErrorField(r, PG_DIAG_SQLSTATE);
            const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
            got_err = 1;
            snprintf(err_sqlstate, sizeof err_sqlstate, "%s", ss ? ss : "");
            req->failed_stmt = 0;
            snprintf(req->sqlstate, sizeof req->sqlstate, "%s", ss ? ss : "");
            copy_msg(req->message, sizeof req->message, msg ? msg : PQresultErrorMessage(r));
        }
        PQclear(r);
        if (PQstatus(pg) != CONNECTION_OK)
            break;
    }
    if (sync_seen && PQstatus(pg) == CONNECTION_OK && err_sqlstate[0] != '\0')
        return PAWL_ESQL; /* refused by the server: rolled back */
    if (sync_seen && PQstatus(pg) == CONNECTION_OK && got_ok && !got_err)
        return 0;
    if (sync_seen && PQstatus(pg) == CONNECTION_OK) {
        /* The Sync ran (a commit, if the statement had succeeded) but its result was not read:
         * not known. The connection is not reused. */
        char why[200];
        copy_msg(why, sizeof why, got_err ? req->message : "no result");
        direct_close(s, why);
        req->sqlstate[0] = '\0';
        snprintf(req->message, sizeof req->message, "the append's result was lost: %s", why);
        return PAWL_EINDOUBT;
    }
    /* The session is gone, the Sync could not be sent, or the server answered out of order
     * (the connection is closed: never reused). */
    char why[200];
    copy_msg(why, sizeof why, PQerrorMessage(pg));
    int rc = !sync_sent                      ? PAWL_ECONN
             : PQstatus(pg) == CONNECTION_OK ? PAWL_EINDOUBT
                                             : lost_rc(sync_sent, err_sqlstate);
    if (got_ok && rc == PAWL_ESQL)
        rc = PAWL_EINDOUBT; /* the statement ran; its commit's error ended the session */
    direct_close(s, why);
    if (rc == PAWL_ECONN && !got_ok)
        return PAWL_EAGAIN; /* the statement never completed: the log connections take it */
    if (rc == PAWL_ECONN) {
        req->sqlstate[0] = '\0';
        snprintf(req->message, sizeof req->message, "connection lost: %s", why);
    }
    if (rc == PAWL_EINDOUBT) {
        req->sqlstate[0] = '\0';
        snprintf(req->message, sizeof req->message, "connection lost after the commit was sent: %s",
                 why);
    }
    return rc;
}

int pawl__log_direct_try(struct pawl_store *s, struct append_op *op)
{
    struct direct *d = &s->direct;
    if (pthread_mutex_trylock(&d->mu) != 0)
        return PAWL_EAGAIN;
    int rc = PAWL_EAGAIN;
    if (direct_usable(s)) {
        memset(&op->req, 0, sizeof op->req);
        op->req.failed_stmt = -1;
        op->req.ud = op;
        op->req.conn_index = -1;
        pawl__log_append_stmts(s, &op, 1, NULL, op->stmt, &op->piggy); /* resets the results */
        pawl__log_fin_piggy_reset(&op->piggy);
        rc = direct_exec(s, op);
        if (rc != PAWL_EAGAIN)
            atomic_fetch_add_explicit(&s->direct_appends, 1, memory_order_relaxed); /* stat */
    }
    pthread_mutex_unlock(&d->mu);
    if (rc == PAWL_EAGAIN)
        return PAWL_EAGAIN;
    pawl__log_op_outcome(op, rc); /* the op is delivered, or retried through the pool */
    return 0;
}

void pawl__log_direct_fini(struct pawl_store *s)
{
    if (s->direct.pg != NULL) {
        PQfinish(s->direct.pg);
        s->direct.pg = NULL;
    }
    pthread_mutex_destroy(&s->direct.mu);
}
