/*
 * append_op.c — one append in flight (struct append_op): its statement (pawl.append, alone in an
 * implicit transaction, with a piggybacked run when append_finalizes), its completion
 * (pawl__log_op_done: retries of deadlocks and of stream lock timeouts, conflicts, errors), the
 * in-doubt check after a connection lost during COMMIT (start_resolve), the lost-connection
 * retries of appends with ids, and the delivery of the outcome (pawl__log_op_finish:
 * statistics, the finalizer's signal, the user's callback, recycling). op_mu guards the free
 * list (free_ops, nfree) and op_cond, on which pawl_store_drain waits for `inflight` to reach 0.
 * An op belongs to one thread at a time: the caller until it is submitted, then the main
 * pool's I/O thread (every completion here runs there), the store's timers while it waits for a
 * delayed retry (its retry_timer: the callback, on the timers thread and holding no lock,
 * submits it again, as the I/O thread must not sleep), and the group that holds it (group.c);
 * nothing in an op is shared. A delayed op still counts in `inflight`, so pawl_store_drain
 * waits for its retry to fire and complete: no timer of an op is armed once the store drained.
 */
#include "log_internal.h"

#include "metrics.h"
#include "timers.h"

#include <stdio.h>
#include <string.h>

/*
 * The outcome of an in-doubt append: pg_xact_status of its transaction, waiting a little
 * server-side while the dying session's transaction is still "in progress". A "committed"
 * status alone does not prove the append committed: after an immediate shutdown (a crash), a
 * transaction id that never reached the WAL on disk is handed out again, and the status is then
 * the new transaction's. So "committed" also needs the append's own first event (same xid, k 0,
 * event count, stream, type and payload) in the table; without it the answer is "reused" (the
 * append is gone: not committed). $2..$5 are the append's own parameters. A group's check
 * (group.c) asks the same with its first writing append's.
 */
const char pawl__log_resolve_sql[] =
    "SELECT CASE WHEN x.st = 'committed' AND NOT EXISTS (SELECT 1 FROM pawl.events e"
    "  WHERE e.xid = $1::xid8 AND e.k = 0 AND e.n = $5 AND e.stream_id = ($2::text[])[1]"
    "    AND e.type = ($3::text[])[1] AND e.payload = ($4::bytea[])[1])"
    " THEN 'reused' ELSE x.st END,"
    " pg_sleep(CASE WHEN x.st = 'in progress' THEN 0.02 ELSE 0 END)"
    " FROM (SELECT pg_xact_status($1::xid8) AS st) x";

/* A retried append's lock wait: set_config(..., true) lasts until the request's Sync. */
static const char RETRY_LOCK_TIMEOUT_SQL[] = "SELECT set_config('lock_timeout', '5ms', true)";

static void retry_fire(struct pawl_timer *t, void *arg, int status);

/* An op from the free list, or a new one (NULL: out of memory). Any thread (op_mu). */
struct append_op *pawl__log_op_get(struct pawl_store *s)
{
    pthread_mutex_lock(&s->op_mu);
    struct append_op *op = s->free_ops;
    if (op) {
        PAWL_ASSERT(s->nfree > 0 && op->s == s);
        s->free_ops = op->next_free;
        s->nfree--;
    }
    pthread_mutex_unlock(&s->op_mu);
    if (op == NULL) {
        op = pawl_calloc(1, sizeof *op);
        if (op == NULL)
            return NULL;
        op->s = s;
        pawl__timer_init_inline(&op->retry_timer, retry_fire, op);
    }
    return op;
}

/*
 * Recycle op: back to the free list (op_mu), or freed when the list is full. An op whose retry
 * timer the timers thread still holds (its retry fired, was sent and has completed before that
 * thread let go) stays on the list whatever its length: pawl__log_ops_fini frees it once the
 * timers are gone.
 */
void pawl__log_op_put(struct pawl_store *s, struct append_op *op)
{
    /* Keep small buffers for reuse; large ones go back to the allocator. */
    if (op->en.cap > BUF_KEEP_MAX) {
        pawl_free(op->en.buf);
        op->en.buf = NULL;
        op->en.cap = 0;
    }
    if (op->en.seqs_cap > 4096) {
        pawl_free(op->en.seqs);
        op->en.seqs = NULL;
        op->en.seqs_cap = 0;
    }
    PAWL_ASSERT(op->s == s);
    PAWL_ASSERT(op->next_q == NULL); /* out of the group queue before it completes */
    int held = pawl_timer_busy(&op->retry_timer);
    pthread_mutex_lock(&s->op_mu);
    if (s->nfree < 1024 || held) {
        op->next_free = s->free_ops;
        s->free_ops = op;
        s->nfree++;
        op = NULL;
    }
    pthread_mutex_unlock(&s->op_mu);
    if (op) {
        pawl_free(op->en.buf);
        pawl_free(op->en.seqs);
        pawl_free(op);
    }
}

static void on_insert_result(void *ud, const PGresult *res)
{
    struct append_op *op = ud;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
        pawl__log_enc_result_row(&op->en, res, 0);
}

static void on_resolve_result(void *ud, const PGresult *res)
{
    struct append_op *op = ud;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
        snprintf(op->xact_status, sizeof op->xact_status, "%s", PQgetvalue(res, 0, 0));
}

static void resolve_done(struct pawl_pgreq *req, int rc);

/* Submit op again now (its delayed retry is due); a refusal means the store is closing. */
static void retry_submit(struct append_op *op)
{
    if (pawl__log_op_submit(op->s, op) != 0)
        pawl__log_op_fail(op, PAWL_ESHUTDOWN, "", "not appended: store closing");
    /* op may be complete and recycled by now: not touched again. */
}

/* A delayed retry is due: on the store's timers thread, which holds no lock of the store's. */
static void retry_fire(struct pawl_timer *t, void *arg, int status)
{
    struct append_op *op = arg;
    (void)status;
    PAWL_ASSERT(t == &op->retry_timer && !pawl__pgpool_on_io_thread(NULL));
    retry_submit(op);
}

/*
 * Submit op again after delay_ns, from the store's timers: the I/O thread that completed it
 * must not sleep, and the op must leave that connection's pipeline meanwhile. The timer cannot
 * be armed (an op waits for one retry at a time) and the timers run until the store drained;
 * should it be refused all the same, the op goes again at once rather than never.
 */
static void retry_later(struct append_op *op, int64_t delay_ns)
{
    int rc = pawl__timer_start_ns(op->s->timers, &op->retry_timer, delay_ns);
    PAWL_ASSERT(rc == 0);
    if (rc != 0)
        retry_submit(op);
}

/*
 * An append with ids whose connection was lost: append it again later (append_retry_ms), from
 * a timer, once the pool has reconnected. Its ids make that safe: if the first try committed,
 * the retry writes nothing and reports already. 1 when it was queued.
 */
static int retry_lost(struct append_op *op, const struct pawl_append_result *res, int64_t now)
{
    struct pawl_store *s = op->s;
    if ((res->rc != PAWL_EINDOUBT && res->rc != PAWL_ECONN) || !op->en.has_ids ||
        s->o.append_retry_ms <= 0)
        return 0;
    if (op->lost_start == 0) {
        op->lost_start = now;
        op->lost_backoff_ms = 50;
    }
    if (now - op->lost_start >= (int64_t)s->o.append_retry_ms * 1000000)
        return 0;
    if (!atomic_exchange(&s->lost_episode, 1))
        PAWL_WARN("log",
                  "appends with event ids lost their connection (%s: %.120s); appending them "
                  "again for up to %d ms (append_retry_ms; their ids make that safe)",
                  pawl_strerror(res->rc), res->message, s->o.append_retry_ms);
    atomic_fetch_add_explicit(&s->lost_retries, 1, memory_order_relaxed); /* statistic */
    int64_t delay_ns = (int64_t)op->lost_backoff_ms * 1000000;
    op->lost_backoff_ms = PAWL_MIN(op->lost_backoff_ms * 2, 1000);
    retry_later(op, delay_ns); /* the op is the timers' from here */
    return 1;
}

/* An append is no longer in flight: a drainer waiting for the last one is woken. */
static void op_left(struct pawl_store *s)
{
    /* acq_rel: what preceded it (an async callback's effects) happens before a drainer sees
     * the count drop. */
    if (atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_acq_rel) == 1) {
        pthread_mutex_lock(&s->op_mu);
        pthread_cond_broadcast(&s->op_cond);
        pthread_mutex_unlock(&s->op_mu);
    }
}

/* Deliver the outcome: statistics, finalizer signal, the user's callback, recycling. */
void pawl__log_op_finish(struct append_op *op, struct pawl_append_result *res)
{
    struct pawl_store *s = op->s;
    int64_t now = pawl_now_ns();
    if (retry_lost(op, res, now))
        return;
    if (op->lost_start != 0 && res->rc == 0 && atomic_exchange(&s->lost_episode, 0))
        PAWL_INFO("log", "appends with event ids go through again after a lost connection");
    if (res->rc == 0) {
        res->committed_ns = now;
        /* relaxed: statistics. */
        atomic_fetch_add_explicit(&s->appends_ok, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->events_ok, (long long)op->n, memory_order_relaxed);
        pawl__log_hist_add(&s->append_lat, (now - op->t_submit) / 1000);
        /* relaxed: a moving average (1/16 weight) only the finalizer's cadence reads. */
        long long avg = atomic_load_explicit(&s->lat_avg_ns, memory_order_relaxed);
        atomic_store_explicit(&s->lat_avg_ns, avg + (now - op->t_submit - avg) / 16,
                              memory_order_relaxed);
        pawl_metric_inc(PAWL_M_APPENDS);
        pawl_metric_add(PAWL_M_EVENTS_APPENDED, (uint64_t)op->n);
        pawl_metric_hist_record(PAWL_H_APPEND_LATENCY, now - op->t_submit);
        pawl__log_fin_append_committed(s, now);
    } else {
        atomic_fetch_add_explicit(&s->appends_failed, 1, memory_order_relaxed); /* statistic */
        pawl_metric_inc(PAWL_M_APPEND_ERRORS);
        pawl__log_set_err(s, res->sqlstate, res->message);
    }
    pawl_append_fn cb = op->cb;
    void *ud = op->ud;
    /* A blocking caller's append leaves the count before its caller is woken: the caller's
     * next append then finds the store idle (direct.c) rather than its own last one still
     * counted. Its callback only wakes the caller, so a drainer needs nothing from it. */
    int blocking = op->blocking;
    pawl__log_op_put(s, op);
    if (blocking)
        op_left(s);
    if (cb)
        cb(ud, res);
    if (!blocking)
        op_left(s);
}

/*
 * The connection died after COMMIT was sent. If the append's xid arrived (its result is
 * flushed before COMMIT runs), ask the server, on a fresh connection, whether it committed.
 */
static int start_resolve(struct append_op *op)
{
    struct pawl_store *s = op->s;
    op->xact_status[0] = '\0';
    /* The xid as text; the append's streams, types, payloads and count as it sent them. */
    static const int from[5] = {-1, 0, 4, 5, 9};
    for (int i = 0; i < 5; i++) {
        op->resolve_vals[i] = i == 0 ? op->en.xid : op->en.values[from[i]];
        op->resolve_lens[i] = i == 0 ? 0 : op->en.lengths[from[i]];
        op->resolve_fmts[i] = i == 0 ? 0 : op->en.formats[from[i]];
    }
    op->stmt[0] = (struct pawl_pgstmt){.prepared = s->stmt_resolve,
                                       .nparams = 5,
                                       .values = op->resolve_vals,
                                       .lengths = op->resolve_lens,
                                       .formats = op->resolve_fmts,
                                       .on_result = on_resolve_result,
                                       .ud = op};
    memset(&op->req, 0, sizeof op->req);
    op->req.stmts = op->stmt;
    op->req.nstmts = 1;
    op->req.flags = PAWL_PGREQ_READONLY;
    op->req.on_done = resolve_done;
    op->req.ud = op;
    return pawl__pgpool_submit(s->main, &op->req);
}

static void resolve_done(struct pawl_pgreq *req, int rc)
{
    struct append_op *op = req->ud;
    PAWL_ASSERT(pawl__pgpool_on_io_thread(op->s->main)); /* a completion of the main pool */
    struct pawl_append_result res;
    memset(&res, 0, sizeof res);
    /* Still running, or the check's own connection was lost (it is read-only: ask again). */
    if (((rc == 0 && strcmp(op->xact_status, "in progress") == 0) ||
         (rc != 0 && rc != PAWL_ESHUTDOWN)) &&
        (op->resolve_tries += rc == 0 ? 1 : RESOLVE_ERROR_COST) < RESOLVE_TRIES &&
        start_resolve(op) == 0)
        return;
    if (rc == 0 && strcmp(op->xact_status, "committed") == 0) {
        res.rc = 0;
        pawl__log_enc_seqs(&op->en, &res);
    } else if (rc == 0 && strcmp(op->xact_status, "reused") == 0) {
        res.rc = PAWL_ECONN;
        snprintf(res.message, sizeof res.message,
                 "connection lost during commit; the server restarted and its transaction %s "
                 "is another one, this append's rows are not there: not committed",
                 op->en.xid);
    } else if (rc == 0 && strcmp(op->xact_status, "aborted") == 0) {
        res.rc = PAWL_ECONN;
        snprintf(res.message, sizeof res.message,
                 "connection lost during commit; the server reports the transaction aborted: "
                 "not committed");
    } else {
        res.rc = PAWL_EINDOUBT;
        snprintf(res.message, sizeof res.message,
                 "connection lost during commit of transaction %s; its outcome could not be "
                 "checked (%s)",
                 op->en.xid, rc == 0 ? op->xact_status : pawl_strerror(rc));
    }
    pawl__log_op_finish(op, &res);
}

/* The first stream of an append, from its encoded $1 (for messages). */
static void first_stream(const struct append_op *op, char *out, size_t len)
{
    const unsigned char *p = (const unsigned char *)op->en.values[0] + 20;
    uint32_t l = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
    snprintf(out, len, "%.*s", (int)(l < 200 ? l : 200), (const char *)p + 4);
}

void pawl__log_op_done(struct pawl_pgreq *req, int rc)
{
    struct append_op *op = req->ud;
    /* A completion of the main pool (its own, or its group's through op_as_single). */
    PAWL_ASSERT(pawl__pgpool_on_io_thread(op->s->main) && req == &op->req);
    pawl__log_op_outcome(op, rc);
}

/*
 * What an append's try came to (rc, with op->req's sqlstate and message): a retry (at once or
 * from a timer), an in-doubt check, or the outcome delivered. On the main pool's I/O thread, or
 * on the caller's after a direct append (direct.c), which carries no piggybacked run.
 */
void pawl__log_op_outcome(struct append_op *op, int rc)
{
    struct pawl_store *s = op->s;
    struct pawl_pgreq *req = &op->req;
    struct pawl_append_result res;
    memset(&res, 0, sizeof res);

    /* pawl cancels no statement of its own; PostgreSQL reports a lock timeout that fired as a
     * lock was granted, ahead of a second wait in the same statement, as a cancel "due to user
     * request" (57014): the same case. */
    if (rc == PAWL_ESQL &&
        (strcmp(req->sqlstate, "55P03") == 0 || strcmp(req->sqlstate, "57014") == 0)) {
        /*
         * lock_timeout: a transaction holds one of its streams (an outbox append not yet
         * committed). The server rolled this append back; retry it later from a timer,
         * off this connection's pipeline, until append_lock_wait_ms has passed.
         */
        int64_t now = pawl_now_ns();
        atomic_fetch_add_explicit(&s->lock_timeouts, 1, memory_order_relaxed); /* statistic */
        if (op->lock_wait_start == 0) {
            op->lock_wait_start = now;
            op->lock_backoff_ms = 10;
        }
        char stream[256];
        first_stream(op, stream, sizeof stream);
        if (now - op->lock_wait_start < (int64_t)s->o.append_lock_wait_ms * 1000000) {
            char shown[PAWL_PRINTABLE_SIZE(PAWL_STREAM_ID_MAX)];
            if (!atomic_exchange(&s->lock_episode, 1))
                PAWL_WARN("log",
                          "an append to stream \"%s\" waits for a lock held by another "
                          "transaction (lock_timeout %d ms); retrying it for up to %d ms",
                          pawl_printable_str(stream, shown, sizeof shown),
                          s->o.append_lock_timeout_ms, s->o.append_lock_wait_ms);
            int64_t delay_ns = (int64_t)op->lock_backoff_ms * 1000000;
            op->lock_backoff_ms = PAWL_MIN(op->lock_backoff_ms * 2, 500);
            retry_later(op, delay_ns); /* the op is the timers' from here */
            return;
        }
        res.rc = PAWL_ETIMEDOUT;
        snprintf(res.sqlstate, sizeof res.sqlstate, "55P03");
        snprintf(res.message, sizeof res.message,
                 "stream \"%.64s\" stayed locked by another transaction for %d ms "
                 "(append_lock_wait_ms): not appended",
                 stream, s->o.append_lock_wait_ms);
        pawl__log_op_finish(op, &res);
        return;
    }
    if (op->lock_wait_start != 0 && rc == 0 && atomic_exchange(&s->lock_episode, 0))
        PAWL_INFO("log", "appends waiting for a stream's lock go through again");

    if (rc == PAWL_ESQL) {
        int retryable = strcmp(req->sqlstate, "40P01") == 0 ||
                        strcmp(req->sqlstate, "40001") == 0 ||
                        ((op->any || op->en.has_ids) && strcmp(req->sqlstate, "23505") == 0);
        /* With ids, a unique violation may be a racing append of the same ids: the next try
         * finds them (already appended) or a conflict. */
        if (retryable && op->retries < ANY_RETRIES) {
            op->retries++;
            /* relaxed: statistics. */
            atomic_fetch_add_explicit(&s->retries, 1, memory_order_relaxed);
            /* Lost the race again and again (transactions holding the stream's next number
             * keep committing first): from the fourth try, after a short, growing pause. */
            if (op->retries > 3) {
                retry_later(op, (int64_t)(op->retries - 3) * 1000000);
                return;
            }
            if (pawl__log_op_submit(s, op) == 0)
                return;
        }
    }
    if (rc == 0) /* a piggybacked run committed with this transaction */
        pawl__log_fin_piggy_done(s, &op->piggy);
    if (rc == PAWL_EINDOUBT && op->en.xid[0] != '\0' && op->en.rows == (int64_t)op->n) {
        op->resolve_tries = 0;
        if (start_resolve(op) == 0)
            return;
    }
    if (rc == PAWL_EINDOUBT && op->en.rows == 0) {
        /* The append's result arrived and it wrote nothing (a conflict). */
        rc = 0;
    }
    if (rc == PAWL_EINDOUBT && op->en.status == ID_ALREADY)
        rc = 0; /* a retry that wrote nothing: its outcome is known whatever the commit did */
    if (rc == 0 && op->en.status == ID_USED) {
        res.rc = PAWL_EIDUSED;
        snprintf(res.message, sizeof res.message, "%s", op->en.id_msg);
    } else if (rc == 0 && op->en.rows == (int64_t)op->n) {
        res.rc = 0;
        pawl__log_enc_seqs(&op->en, &res);
    } else if (rc == 0) {
        res.rc = PAWL_ECONFLICT;
        snprintf(res.message, sizeof res.message,
                 "a stream is not at the expected version (stream_seq - 1 of its first event)");
    } else if (rc == PAWL_ESQL &&
               (strcmp(req->sqlstate, "22P02") == 0 || strcmp(req->sqlstate, "22P05") == 0)) {
        /* The only text the server parses is the metadata (see json_object_check). */
        res.rc = PAWL_EINVAL;
        snprintf(res.sqlstate, sizeof res.sqlstate, "%s", req->sqlstate);
        snprintf(res.message, sizeof res.message, "metadata is not valid JSON: %.200s",
                 req->message);
    } else if (rc == PAWL_ESQL && strcmp(req->sqlstate, "23505") == 0) {
        res.rc = PAWL_ECONFLICT;
        snprintf(res.sqlstate, sizeof res.sqlstate, "%s", req->sqlstate);
        snprintf(res.message, sizeof res.message, "a stream sequence number is taken: %.200s",
                 req->message);
    } else {
        res.rc = rc;
        snprintf(res.sqlstate, sizeof res.sqlstate, "%s", req->sqlstate);
        snprintf(res.message, sizeof res.message, "%s", req->message);
        if (rc == PAWL_ECONN && res.message[0] == '\0')
            snprintf(res.message, sizeof res.message, "not committed: no connection");
    }
    pawl__log_op_finish(op, &res);
}

/*
 * The statements of one transaction of appends (one alone, or a group): each op's pawl.append in
 * the order given, then, with append_finalizes, the piggybacked finalization (piggy, the
 * finalizer's: pawl__log_fin_piggy_stmt). Resets each op's result fields. Returns the number of
 * statements written to st (n + 1 at most).
 *
 * The first and the last append's results are flushed before the Sync commits: the client has
 * every append's outcome (and the xid) before the commit can be in doubt, and a connection lost
 * mid-group still leaves the xid to check.
 *
 * Piggybacked finalization: in the same transaction, after the inserts, finalize what others
 * committed before (not these appends: a run never covers its caller's own transaction). Its
 * commit then shares the appends' WAL flush instead of costing one of its own; when another
 * session holds the lock it returns at once (docs/design.md has the cost model).
 */
int pawl__log_append_stmts(struct pawl_store *s, struct append_op *const *ops, size_t n,
                           const struct pawl_pgstmt *one, struct pawl_pgstmt *st,
                           struct fin_piggy *piggy)
{
    int k = 0;
    if (one != NULL)
        st[k++] = *one; /* a group's one pawl.append_group statement, instead of these */
    for (size_t i = 0; i < n; i++) {
        struct append_op *op = ops[i];
        op->en.rows = -1;
        op->en.head1 = -1;
        op->en.xid[0] = '\0';
        op->en.seqs_ok = 0;
        op->en.status = ID_NONE;
        if (one != NULL)
            continue;
        st[k++] = (struct pawl_pgstmt){.prepared = s->stmt_append,
                                       .nparams = 9,
                                       .values = op->en.values,
                                       .lengths = op->en.lengths,
                                       .formats = op->en.formats,
                                       .on_result = on_insert_result,
                                       .ud = op,
                                       .flush_after = i == 0 || i + 1 == n};
    }
    k += pawl__log_fin_piggy_stmt(s, piggy, &st[k]);
    PAWL_ASSERT(k >= 1 && (size_t)k <= n + 1); /* the caller's st holds n + 1 */
    return k;
}

/* Submit op as its own transaction, on the least loaded connection. */
int pawl__log_op_submit(struct pawl_store *s, struct append_op *op)
{
    return pawl__log_op_submit_on(s, op, -1);
}

/* Submit op as its own transaction, on connection conn (< 0: the least loaded one). */
int pawl__log_op_submit_on(struct pawl_store *s, struct append_op *op, int conn)
{
    /* One statement, an implicit transaction committed at the pipeline Sync; its result
     * (with the xid) is flushed before the Sync runs the commit. */
    int k = 0;
    /*
     * A retry of an append whose stream was found locked waits only briefly this time (for
     * this transaction only): every attempt holds up the requests pipelined behind it on its
     * connection, so probing a held stream must cost the other streams little.
     */
    if (op->lock_wait_start != 0)
        op->stmt[k++] = (struct pawl_pgstmt){.sql = RETRY_LOCK_TIMEOUT_SQL};
    k += pawl__log_append_stmts(s, &op, 1, NULL, op->stmt + k, &op->piggy);
    PAWL_ASSERT(k <= (int)PAWL_ARRAY_LEN(op->stmt));
    memset(&op->req, 0, sizeof op->req);
    op->req.stmts = op->stmt;
    op->req.nstmts = k;
    op->req.flags = PAWL_PGREQ_IMPLICIT;
    op->req.on_done = pawl__log_op_done;
    op->req.ud = op;
    return conn < 0 ? pawl__pgpool_submit(s->main, &op->req)
                    : pawl__pgpool_submit_on(s->main, conn, &op->req);
}

/* Deliver a failure that no statement reported (rc, and the message msg). */
void pawl__log_op_fail(struct append_op *op, int rc, const char *sqlstate, const char *msg)
{
    struct pawl_append_result res;
    memset(&res, 0, sizeof res);
    res.rc = rc;
    snprintf(res.sqlstate, sizeof res.sqlstate, "%s", sqlstate ? sqlstate : "");
    snprintf(res.message, sizeof res.message, "%s", msg);
    pawl__log_op_finish(op, &res);
}

/* Free the recycled ops (pawl_store_free, once nothing is in flight and the timers are gone). */
void pawl__log_ops_fini(struct pawl_store *s)
{
    PAWL_ASSERT(atomic_load(&s->inflight) == 0);
    while (s->free_ops) {
        struct append_op *op = s->free_ops;
        PAWL_ASSERT(!pawl_timer_busy(&op->retry_timer)); /* the timers let go of every op */
        s->free_ops = op->next_free;
        pawl_free(op->en.buf);
        pawl_free(op->en.seqs);
        pawl_free(op);
    }
}
