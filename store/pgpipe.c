/*
 * pgpipe.c — the pool's pipeline (see pgconn.h for the contract, pgconn_internal.h for how the
 * pool's files divide the work): each connection's send and receive cursors, on the pool's I/O
 * thread alone. Send cursor: requests move from the pool queue (or the connection's pinned
 * queue) to the connection while it is READY, has fewer than max_inflight requests outstanding,
 * and its output is drained (PQflush() returned 0); a connection in the middle of a
 * multi-request transaction (a NOSYNC request was its last) takes only pinned requests, never
 * shared ones, so no one else's statement lands in that transaction. Receive cursor: a FIFO of
 * "expected results" (session statement, prepare, request statement, Sync) matched one to one,
 * in order, with what PQgetResult returns; a statement's results end with a NULL from
 * PQgetResult, a Sync's result (PGRES_PIPELINE_SYNC) is not followed by NULL. Input is consumed
 * only when the loop reports the socket readable (pgconn.c), and results are taken only while
 * PQisBusy() is false, so the thread never blocks in libpq. Requests complete in the order they
 * were sent. When the connection is lost, pawl__pgpipe_lost judges what each request handed to
 * libpq may have done (committed, not, or in doubt) and empties both cursors.
 */
#include "pgconn_internal.h"

#include "ioloop.h"

#include <stdio.h>

/* ---- the receive FIFO -------------------------------------------------------------------- */

/* Expect one more result on c: kind, with its argument and request (NULL for the session's). 0,
 * or PAWL_ENOMEM (then the connection must be broken: libpq has the statement already). */
int pawl__pgpipe_expect(struct conn *c, enum ekind kind, int arg, struct pawl_pgreq *req)
{
    PAWL_ASSERT(pawl__pgpool_on_io_thread(c->pool)); /* the I/O thread owns the FIFO */
    /* Statements carry their request; set-up statements and Parses none; a Sync either. */
    PAWL_ASSERT(kind == E_SYNC || (kind == E_STMT) == (req != NULL));
    if (c->exp_len == c->exp_cap) {
        size_t ncap = c->exp_cap ? c->exp_cap * 2 : 256;
        struct expect *n = pawl_malloc(ncap * sizeof *n);
        if (n == NULL)
            return PAWL_ENOMEM;
        for (size_t i = 0; i < c->exp_len; i++)
            n[i] = c->exp[(c->exp_head + i) % c->exp_cap];
        pawl_free(c->exp);
        c->exp = n;
        c->exp_cap = ncap;
        c->exp_head = 0;
    }
    c->exp[(c->exp_head + c->exp_len) % c->exp_cap] = (struct expect){kind, arg, req};
    c->exp_len++;
    return 0;
}

static struct expect *exp_front(struct conn *c)
{
    return c->exp_len ? &c->exp[c->exp_head] : NULL;
}

static void exp_pop(struct conn *c)
{
    PAWL_ASSERT(c->exp_len > 0); /* a result arrived for something we sent */
    c->exp_head = (c->exp_head + 1) % c->exp_cap;
    c->exp_len--;
}

/* ---- sending ----------------------------------------------------------------------------- */

/* Append r to c's requests in flight (in libpq's hands, in the order sent). */
static void inflight_push(struct conn *c, struct pawl_pgreq *r)
{
    r->_next = NULL;
    if (c->inflight_tail)
        c->inflight_tail->_next = r;
    else
        c->inflight_head = r;
    c->inflight_tail = r;
    c->ninflight++;
}

/* Send r's statements (each prepared on this session first if it was not yet) and its Sync,
 * or a flush request for a NOSYNC request. 0, or -1 when libpq refused (nothing is undone). */
static int send_stmts(struct conn *c, struct pawl_pgreq *r)
{
    struct pawl_pgpool *p = c->pool;
    int nprep = atomic_load_explicit(&p->nprepared, memory_order_acquire); /* entries below */
    (void)nprep; /* read by the assertion only */
    for (int i = 0; i < r->nstmts; i++) {
        const struct pawl_pgstmt *s = &r->stmts[i];
        int ok;
        if (s->sql != NULL) {
            ok = PQsendQueryParams(c->pg, s->sql, s->nparams, NULL, s->values, s->lengths,
                                   s->formats, s->result_binary);
        } else {
            /* Ids were checked against the published count at submit. */
            PAWL_ASSERT(s->prepared >= 0 && s->prepared < nprep);
            const struct prepared_stmt *ps = &p->prep[s->prepared];
            if (!c->prepared[s->prepared]) {
                if (!PQsendPrepare(c->pg, ps->name, ps->sql, ps->nparams, ps->types))
                    return -1;
                if (pawl__pgpipe_expect(c, E_PREPARE, s->prepared, NULL) != 0)
                    return -1;
                c->prepared[s->prepared] = 1;
            }
            ok = PQsendQueryPrepared(c->pg, ps->name, s->nparams, s->values, s->lengths, s->formats,
                                     s->result_binary);
        }
        if (!ok || pawl__pgpipe_expect(c, E_STMT, i, r) != 0)
            return -1;
        r->_nsent++;
        if (s->flush_after && !PQsendFlushRequest(c->pg))
            return -1;
    }
    if (r->flags & PAWL_PGREQ_NOSYNC) {
        if (!PQsendFlushRequest(c->pg))
            return -1;
        c->open_txn = 1;
    } else {
        if (!PQpipelineSync(c->pg) || pawl__pgpipe_expect(c, E_SYNC, 0, r) != 0)
            return -1;
        r->_sync_sent = 1;
        c->open_txn = 0;
    }
    return 0;
}

static int can_send(const struct conn *c)
{
    return c->state == C_READY && !c->want_write && c->ninflight < c->pool->o.max_inflight;
}

/* Hand one request to libpq. Returns 0, or -1 when the connection broke (the request fails
 * with it, as one in flight: part of it may be in libpq's buffer). */
static int send_req(struct conn *c, struct pawl_pgreq *r)
{
    PAWL_ASSERT(pawl__pgpool_on_io_thread(c->pool)); /* the I/O thread owns the PGconn */
    PAWL_ASSERT(can_send(c) && r->nstmts >= 1);      /* dispatch's choice, submit's check */
    r->failed_stmt = -1;
    r->sqlstate[0] = '\0';
    r->message[0] = '\0';
    r->conn_index = c->index;
    r->_nsent = 0;
    r->_nrecv = 0;
    r->_sync_sent = 0;
    r->_ok_upto = 0;
    r->_skipped = 0;
    int rc = send_stmts(c, r);
    inflight_push(c, r);
    if (rc != 0) {
        char msg[512];
        copy_trimmed(msg, sizeof msg, PQerrorMessage(c->pg));
        pawl__pgconn_break(c, msg[0] ? msg : "send failed");
    }
    return rc;
}

/* Pop the oldest request of one of the pool's queues (a connection's pinned queue or the
 * shared one). The caller holds the pool's mutex. */
static struct pawl_pgreq *queue_pop_locked(struct pawl_pgpool *p, struct pawl_pgreq **head,
                                           struct pawl_pgreq **tail)
{
    PAWL_ASSERT(pawl_mutex_locked(&p->mu)); /* the queues are the submitters' too */
    struct pawl_pgreq *r = *head;
    if (r) {
        *head = r->_next;
        if (!*head)
            *tail = NULL;
    }
    return r;
}

static struct pawl_pgreq *queue_pop(struct pawl_pgpool *p, struct pawl_pgreq **head,
                                    struct pawl_pgreq **tail)
{
    pthread_mutex_lock(&p->mu);
    struct pawl_pgreq *r = queue_pop_locked(p, head, tail);
    pthread_mutex_unlock(&p->mu);
    return r;
}

/*
 * The send cursor of the whole pool: pinned requests go to their connection; shared ones to
 * the eligible connection with the fewest requests in flight (so a burst spreads over every
 * connection instead of filling the first). Then every connection that got work is flushed.
 */
void pawl__pgpipe_dispatch(struct pawl_pgpool *p)
{
    PAWL_ASSERT(pawl__pgpool_on_io_thread(p)); /* the I/O thread's own work */
    int got[MAX_CONNS] = {0};
    for (int i = 0; i < p->nconns; i++) {
        struct conn *c = &p->conns[i];
        while (can_send(c)) {
            struct pawl_pgreq *r = queue_pop(p, &c->pinned_head, &c->pinned_tail);
            if (r == NULL)
                break;
            if (send_req(c, r) != 0)
                break;
            got[i]++;
        }
    }
    for (;;) {
        struct conn *best = NULL;
        for (int i = 0; i < p->nconns; i++) {
            struct conn *c = &p->conns[i];
            if (can_send(c) && !c->open_txn && (!best || c->ninflight < best->ninflight))
                best = c;
        }
        if (best == NULL)
            break;
        struct pawl_pgreq *r = queue_pop(p, &p->q_head, &p->q_tail);
        if (r == NULL)
            break;
        if (send_req(best, r) == 0)
            got[best->index]++;
    }
    for (int i = 0; i < p->nconns; i++) {
        struct conn *c = &p->conns[i];
        if (c->state != C_READY)
            continue;
        if (got[i] && !c->want_write) {
            int f = PQflush(c->pg);
            if (f < 0) {
                pawl__pgconn_break(c, PQerrorMessage(c->pg));
                continue;
            }
            c->want_write = f == 1;
        }
        pawl__pgconn_watch(c, PAWL_IO_IN | (c->want_write ? PAWL_IO_OUT : 0));
    }
}

/* ---- receiving --------------------------------------------------------------------------- */

/* The request's first failure: statement stmt, with SQLSTATE and message. Later ones keep it. */
static void fail_req(struct pawl_pgreq *r, int stmt, const char *sqlstate, const char *message)
{
    PAWL_ASSERT(stmt >= 0 && stmt < r->nstmts);
    if (r->failed_stmt >= 0)
        return;
    r->failed_stmt = stmt;
    snprintf(r->sqlstate, sizeof r->sqlstate, "%s", sqlstate);
    copy_trimmed(r->message, sizeof r->message, message);
}

static void req_error(struct pawl_pgreq *r, int stmt, const PGresult *res, const char *fallback)
{
    const char *st = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    fail_req(r, stmt, st ? st : "", msg ? msg : fallback);
}

static void remove_inflight(struct conn *c, struct pawl_pgreq *r)
{
    /* Requests complete in the order they were sent, so r is the head. */
    PAWL_ASSERT(c->inflight_head == r);
    struct pawl_pgreq **pp = &c->inflight_head, *prev = NULL;
    while (*pp && *pp != r) {
        prev = *pp;
        pp = &(*pp)->_next;
    }
    if (*pp == NULL)
        return;
    *pp = r->_next;
    if (c->inflight_tail == r)
        c->inflight_tail = prev;
    PAWL_ASSERT(c->ninflight > 0);
    c->ninflight--;
}

/* r's results are all in: off the in-flight list, then its completion. */
static void finish_req(struct conn *c, struct pawl_pgreq *r)
{
    remove_inflight(c, r);
    pawl__pgpool_complete(c->pool, r, r->failed_stmt >= 0 ? PAWL_ESQL : 0);
}

/* A session statement's result (E_SETUP). */
static void on_setup_result(struct conn *c, const struct expect *e, ExecStatusType st,
                            const PGresult *res)
{
    struct pawl_pgpool *p = c->pool;
    if (st != PGRES_FATAL_ERROR)
        return;
    const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
    if (e->arg >= 0 && c->setup_error[0] == '\0') {
        /* What the session relies on is not in place: the setup fails (reported, and retried
         * after back-off, by pawl__pgconn_break). Statements after it are skipped. */
        snprintf(c->setup_error, sizeof c->setup_error,
                 "session statement \"%.120s\" failed: %.200s", p->session_sql[e->arg],
                 msg ? msg : "error");
    } else if (e->arg < 0) {
        PAWL_WARN("pgconn", "%s[%d]: ROLLBACK of a failed transaction block failed: %s", p->name,
                  c->index, msg ? msg : "error");
    }
    c->aborted = 1;
}

/* A Parse's result (E_PREPARE): failed or skipped, the statement is prepared again next time. */
static void on_prepare_result(struct conn *c, const struct expect *e, ExecStatusType st,
                              const PGresult *res)
{
    if (st == PGRES_COMMAND_OK)
        return;
    c->prepared[e->arg] = 0;
    if (st == PGRES_FATAL_ERROR) {
        c->aborted = 1;
        const char *ss = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
        snprintf(c->prep_sqlstate, sizeof c->prep_sqlstate, "%s", ss ? ss : "");
        snprintf(c->prep_message, sizeof c->prep_message, "preparing the statement: %s",
                 msg ? msg : "failed");
    }
}

/* A request statement's result (E_STMT). Returns 2 when its callback took the result. */
static int on_stmt_result(struct conn *c, const struct expect *e, ExecStatusType st, PGresult *res)
{
    struct pawl_pgreq *r = e->req;
    PAWL_ASSERT(r != NULL && e->arg >= 0 && e->arg < r->nstmts);
    if (st == PGRES_FATAL_ERROR) {
        const char *ss = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        if (ends_session(ss)) {
            c->fatal_req = r;
            c->fatal_idle = 1;
        }
    }
    if (st == PGRES_FATAL_ERROR && r->_ok_upto > e->arg) {
        /* The statement had completed; the session ended afterwards (a FATAL sent when
         * the backend was terminated). Not a failure of the statement. */
        c->aborted = 1;
        return 0;
    }
    if (st == PGRES_FATAL_ERROR) {
        req_error(r, e->arg, res, "statement failed");
        c->aborted = 1;
    } else if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK || st == PGRES_SINGLE_TUPLE) {
        r->_ok_upto = e->arg + 1;
    } else if (st == PGRES_PIPELINE_ABORTED) {
        if (c->prep_sqlstate[0] != '\0' && !ends_session(c->prep_sqlstate)) {
            /* Its own statement could not be prepared: the server refused it. */
            fail_req(r, e->arg, c->prep_sqlstate, c->prep_message);
        } else if (r->failed_stmt < 0) {
            r->_skipped = 1;
            fail_req(r, e->arg, "25P02",
                     "not run: an earlier statement in this transaction failed");
        }
        c->prep_sqlstate[0] = '\0';
    }
    if (r->stmts[e->arg].on_result) {
        r->stmts[e->arg].on_result(r->stmts[e->arg].ud, res);
        if (r->stmts[e->arg].keep_result)
            return 2; /* ownership passed: the caller must not clear it */
    }
    return 0;
}

/* A Sync's result (E_SYNC). Returns 1 when the Sync is done, 0 when its end is still to come (a
 * failed commit's error result), -1 when the protocol is out of step. */
static int on_sync_result(struct conn *c, const struct expect *e, ExecStatusType st,
                          const PGresult *res)
{
    if (st == PGRES_FATAL_ERROR && e->req) {
        const char *ss = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        if (ends_session(ss)) {
            c->fatal_req = e->req;
        } else if (ss) {
            /*
             * The implicit COMMIT at the Sync failed (a serialization failure or deadlock
             * found at commit, a deferred constraint): a definite rollback of this request
             * only. The session goes on; PGRES_PIPELINE_SYNC follows.
             */
            struct pawl_pgreq *r = e->req;
            req_error(r, r->nstmts - 1, res, "commit failed");
            c->sync_error = 1;
            return 0;
        }
    }
    if (st != PGRES_PIPELINE_SYNC)
        return -1; /* unexpected: the protocol is out of step; the connection is broken */
    c->aborted = 0;
    c->sync_error = 0;
    c->prep_sqlstate[0] = '\0';
    return 1;
}

/* Handle one non-NULL result for the front expectation. Returns 1 if the item is done, 2 if the
 * result's ownership passed to a callback, -1 if the protocol is out of step. */
static int on_result(struct conn *c, struct expect *e, PGresult *res)
{
    ExecStatusType st = PQresultStatus(res);
    if (st == PGRES_FATAL_ERROR && e->kind != E_STMT) {
        const char *ss = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        if (ends_session(ss))
            c->fatal_idle = 1; /* the server is ending the session */
    }
    switch (e->kind) {
    case E_SETUP:
        on_setup_result(c, e, st, res);
        return 0;
    case E_PREPARE:
        on_prepare_result(c, e, st, res);
        return 0;
    case E_STMT:
        return on_stmt_result(c, e, st, res);
    case E_SYNC:
        return on_sync_result(c, e, st, res);
    }
    return 0;
}

/*
 * A request that opened a transaction block (BEGIN) and failed leaves the session in an aborted
 * block, which a Sync does not end: roll it back so the connection stays usable. Requests
 * already pipelined behind it fail (25P02). 0, or -1 when the connection broke.
 */
static int rollback_failed_block(struct conn *c)
{
    if (PQtransactionStatus(c->pg) != PQTRANS_INERROR || c->open_txn)
        return 0;
    if (!PQsendQueryParams(c->pg, "ROLLBACK", 0, NULL, NULL, NULL, NULL, 0) ||
        pawl__pgpipe_expect(c, E_SETUP, -1, NULL) != 0 || !PQpipelineSync(c->pg) ||
        pawl__pgpipe_expect(c, E_SYNC, 0, NULL) != 0) {
        pawl__pgconn_break(c, PQerrorMessage(c->pg));
        return -1;
    }
    int f = PQflush(c->pg);
    c->want_write = f == 1;
    return 0;
}

/* The end of one statement's results (a NULL from PQgetResult) for the front expectation e.
 * Returns 1 to stop taking results for now (a Sync's comes next), else 0. */
static int on_end_of_results(struct conn *c, const struct expect *e)
{
    if (e->kind == E_SYNC && c->sync_error) {
        c->sync_error = 0; /* the end of the commit's error result; the Sync follows */
        return 0;
    }
    if (e->kind == E_SYNC)
        return 1; /* nothing more available yet */
    struct expect done = *e;
    exp_pop(c);
    if (done.kind == E_STMT) {
        struct pawl_pgreq *r = done.req;
        r->_nrecv++;
        /* A NOSYNC request completes with its last statement. */
        if ((r->flags & PAWL_PGREQ_NOSYNC) && r->_nrecv == r->_nsent)
            finish_req(c, r);
    }
    return 0;
}

/* The receive cursor: take every result libpq has without blocking, then the notifications.
 * Returns 0, or -1 when the connection broke. */
int pawl__pgpipe_recv(struct conn *c)
{
    PAWL_ASSERT(pawl__pgpool_on_io_thread(c->pool)); /* the I/O thread owns the PGconn */
    struct pawl_pgpool *p = c->pool;
    for (;;) {
        struct expect *e = exp_front(c);
        if (e == NULL || PQisBusy(c->pg))
            break;
        PGresult *res = PQgetResult(c->pg);
        if (res == NULL) {
            if (on_end_of_results(c, e))
                break;
            continue;
        }
        int d = on_result(c, e, res);
        if (d == 2)
            d = 0;
        else
            PQclear(res);
        if (d < 0) {
            pawl__pgconn_break(c, "protocol out of step (unexpected result)");
            return -1;
        }
        if (d == 1) {
            struct expect done = *e;
            exp_pop(c);
            if (done.req == NULL) {
                if (pawl__pgconn_setup_done(c) != 0)
                    return -1;
            } else {
                finish_req(c, done.req);
                if (rollback_failed_block(c) != 0)
                    return -1;
            }
        }
    }
    PGnotify *n;
    while ((n = PQnotifies(c->pg)) != NULL) {
        if (p->o.on_notify)
            p->o.on_notify(p->o.hook_ud, n->relname, n->extra, n->be_pid);
        PQfreemem(n);
    }
    return 0;
}

/* ---- a lost connection --------------------------------------------------------------------- */

/*
 * What a request handed to libpq may have done when its connection was lost: committed or not
 * is unknown (PAWL_EINDOUBT) unless it could not commit. after_fatal: a request after the one
 * during which the server announced the session's end; fatal_idle: the server announced it
 * while idle.
 */
static int lost_rc(const struct pawl_pgreq *r, int after_fatal, int fatal_idle)
{
    if (after_fatal || (fatal_idle && r->_ok_upto == 0 && r->failed_stmt < 0 && r->_nrecv == 0))
        return PAWL_ECONN; /* the server ended the session before it read this request */
    int session_ended = r->failed_stmt >= 0 && ends_session(r->sqlstate);
    if (session_ended && (r->flags & PAWL_PGREQ_IMPLICIT) && strncmp(r->sqlstate, "57", 2) == 0)
        return PAWL_ECONN; /* ended mid-statement: the Sync's commit never ran */
    if (session_ended && r->_sync_sent && !(r->flags & PAWL_PGREQ_READONLY) &&
        r->failed_stmt == r->nstmts - 1)
        return PAWL_EINDOUBT; /* the session ended around the final statement (a COMMIT?) */
    if (session_ended)
        return PAWL_ECONN; /* the server ended the session mid-transaction: not committed */
    if (r->_skipped && r->_ok_upto == 0)
        return PAWL_ECONN; /* never run: what preceded it failed (the session ending, say) */
    if (r->failed_stmt >= 0)
        return PAWL_ESQL; /* the server already refused it: nothing committed */
    if ((r->flags & PAWL_PGREQ_READONLY) || !r->_sync_sent)
        return PAWL_ECONN;
    return PAWL_EINDOUBT;
}

/* c's session is gone (pawl__pgconn_break, once it is closed): both cursors restart empty, and
 * every request in flight completes with what lost_rc says of it, in the order sent. */
void pawl__pgpipe_lost(struct conn *c, const char *why)
{
    PAWL_ASSERT(pawl__pgpool_on_io_thread(c->pool) && c->pg == NULL); /* closed already */
    struct pawl_pgreq *r = c->inflight_head;
    struct pawl_pgreq *fatal_req = c->fatal_req;
    int after_fatal = 0, fatal_idle = c->fatal_idle;
    c->fatal_req = NULL;
    c->fatal_idle = 0;
    c->sync_error = 0;
    c->prep_sqlstate[0] = '\0';
    c->setup_error[0] = '\0';
    c->inflight_head = c->inflight_tail = NULL;
    c->ninflight = 0;
    c->exp_len = 0;
    c->exp_head = 0;
    c->open_txn = 0;
    c->aborted = 0;
    c->want_write = 0;
    memset(c->prepared, 0, sizeof c->prepared);
    while (r) {
        struct pawl_pgreq *next = r->_next;
        int rc = lost_rc(r, after_fatal, fatal_idle);
        if (r == fatal_req)
            after_fatal = 1;
        if (rc != PAWL_ESQL) {
            snprintf(r->message, sizeof r->message, "%s: %.180s",
                     rc == PAWL_EINDOUBT ? "connection lost after the commit was sent"
                                         : "connection lost",
                     why);
        }
        pawl__pgpool_complete(c->pool, r, rc);
        r = next;
    }
}
