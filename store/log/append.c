/*
 * append.c — the append API: pawl_append_async (checks, encoding, then the op alone or through
 * a group), the blocking pawl_append and pawl_append_seqs (on the caller's thread when the store
 * is idle, direct.c; else a futex hand-off from the I/O thread, struct sync_wait),
 * pawl_store_drain, and pawl_append_in, the same statement on the caller's connection inside
 * the caller's transaction. No lock of its own: it counts `inflight` (an atomic; op_mu and
 * op_cond only to wake pawl_store_drain) and hands each op to direct.c, append_op.c or group.c. Any
 * thread may call these; the blocking ones (pawl_append, pawl_append_seqs, pawl_store_drain) never
 * from a store's I/O thread, that is from an append's callback (pawl/log.h); pawl_append_in from
 * the thread that owns the connection.
 */
#include "log_internal.h"

#include "futex.h"

#include <stdio.h>
#include <string.h>

/*
 * Validate, encode and hand over one append: to the caller's own thread (direct, a blocking
 * call that finds nothing else in flight: direct.c), to a group, or to the pool alone. limit:
 * refuse past max_inflight_appends (PAWL_EAGAIN; async appends); blocking: the caller waits for
 * the outcome, so it may run the append itself.
 */
static int append_submit(struct pawl_store *s, const struct pawl_event *ev, size_t n,
                         pawl_append_fn cb, void *ud, int limit, int blocking)
{
    char msg[256];
    int any = 0;
    uint32_t stack[256];
    uint32_t *ix = stack;
    if (n > 256 && n <= s->o.max_append_events && (ix = pawl_malloc(n * sizeof *ix)) == NULL) {
        pawl__log_set_err(s, NULL, "out of memory");
        return PAWL_ENOMEM;
    }
    int rc = pawl__log_validate(&s->o, ev, n, &any, ix, msg, sizeof msg);
    if (rc != 0) {
        if (ix != stack)
            pawl_free(ix);
        pawl__log_set_err(s, NULL, msg);
        return rc;
    }
    /* acq_rel: pairs with the decrement in pawl__log_op_finish. A direct append takes the
     * count from 0 (nothing in flight: it cannot take a group's company) in one step. */
    int cur = 0, direct = 0;
    if (blocking && s->o.append_direct && !s->o.append_finalizes)
        direct = atomic_compare_exchange_strong_explicit(
            &s->inflight, &cur, 1, memory_order_acq_rel, memory_order_acquire);
    if (!direct)
        cur = atomic_fetch_add_explicit(&s->inflight, 1, memory_order_acq_rel);
    if (limit && cur >= s->o.max_inflight_appends) {
        atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_acq_rel);
        if (ix != stack)
            pawl_free(ix);
        return PAWL_EAGAIN;
    }
    struct append_op *op = pawl__log_op_get(s);
    rc = op ? pawl__log_encode(&op->en, ev, n, ix) : PAWL_ENOMEM;
    if (ix != stack)
        pawl_free(ix);
    if (op == NULL)
        goto undo;
    if (rc != 0) {
        pawl__log_op_put(s, op);
        goto undo;
    }
    op->n = n;
    op->lock_wait_start = 0;
    op->lost_start = 0;
    op->en.notify = 0; /* this process's finalizer is signalled instead */
    op->any = any;
    op->blocking = blocking;
    op->retries = 0;
    op->cb = cb;
    op->ud = ud;
    op->t_submit = pawl_now_ns();
    if (direct && pawl__log_direct_try(s, op) == 0)
        return 0; /* delivered, or handed to the pool for a retry or a check */
    if (s->o.append_group_max > 1) {
        pawl__log_group_enqueue(s, op);
        return 0;
    }
    rc = pawl__log_op_submit(s, op);
    if (rc != 0) {
        pawl__log_op_put(s, op);
        goto undo;
    }
    return 0;
undo:
    if (atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_acq_rel) == 1) {
        pthread_mutex_lock(&s->op_mu);
        pthread_cond_broadcast(&s->op_cond);
        pthread_mutex_unlock(&s->op_mu);
    }
    pawl__log_set_err(s, NULL, pawl_strerror(rc));
    return rc;
}

int pawl_append_async(struct pawl_store *s, const struct pawl_event *events, size_t n,
                      pawl_append_fn cb, void *ud)
{
    if (s == NULL)
        return PAWL_EINVAL;
    return append_submit(s, events, n, cb, ud, 1, 0);
}

/*
 * A blocking append's hand-off: the I/O thread stores the outcome, then publishes it through
 * one futex word; the caller sleeps on that word. One wake-up per append, no mutex for either
 * side to queue on (a condition variable signalled under its mutex could wake the caller only
 * to park it again on that mutex).
 */
enum { SYNC_PENDING = 0, SYNC_DONE = 1, SYNC_PARKED = 2 };

struct sync_wait {
    uint32_t state; /* SYNC_*: written with __atomic operations */
    struct pawl_append_result res;
    int64_t *seqs; /* the caller's array of n entries, or NULL */
    size_t n;
};

static void sync_cb(void *ud, const struct pawl_append_result *res)
{
    struct sync_wait *w = ud;
    w->res = *res;
    w->res.seqs = NULL;
    if (w->seqs != NULL && res->seqs != NULL) {
        memcpy(w->seqs, res->seqs, w->n * sizeof *w->seqs);
        w->res.seqs = w->seqs;
    }
    /* acq_rel: the result above is written before a caller that reads SYNC_DONE (acquire)
     * reads it; the caller's SYNC_PARKED is read here so that it is woken. After this store
     * the caller may return and w be gone: only its address is used below (a private futex
     * wake reads no memory), never w itself. */
    uint32_t *word = &w->state;
    if (__atomic_exchange_n(word, SYNC_DONE, __ATOMIC_ACQ_REL) == SYNC_PARKED)
        pawl__futex_wake(word, 1);
}

/* Sleep until sync_cb has published w's outcome. */
static void sync_wait_done(struct sync_wait *w)
{
    uint32_t st = SYNC_PENDING;
    /* acquire on failure: SYNC_DONE read here makes the result visible (sync_cb's release). */
    if (!__atomic_compare_exchange_n(&w->state, &st, SYNC_PARKED, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return;
    /* acquire: pairs with sync_cb's exchange; spurious wake-ups re-check. */
    while (__atomic_load_n(&w->state, __ATOMIC_ACQUIRE) != SYNC_DONE)
        pawl__futex_wait(&w->state, SYNC_PARKED, -1);
}

int pawl_append(struct pawl_store *s, const struct pawl_event *events, size_t n,
                struct pawl_append_result *res)
{
    return pawl_append_seqs(s, events, n, NULL, res);
}

int pawl_append_seqs(struct pawl_store *s, const struct pawl_event *events, size_t n, int64_t *seqs,
                     struct pawl_append_result *res)
{
    PAWL_ASSERT(!pawl__pgpool_on_io_thread(NULL)); /* blocks: never on an I/O thread */
    if (s == NULL)
        return PAWL_EINVAL;
    struct sync_wait w;
    memset(&w, 0, sizeof w);
    w.seqs = seqs;
    w.n = n;
    pawl_pool_will_block(); /* on a pool worker: do not hold queued tasks while we wait */
    int rc = append_submit(s, events, n, sync_cb, &w, 0, 1);
    if (rc == 0) {
        sync_wait_done(&w);
        rc = w.res.rc;
    } else {
        w.res.rc = rc;
        pawl_store_errmsg(s, w.res.message, sizeof w.res.message);
    }
    if (res)
        *res = w.res;
    return rc;
}

void pawl_store_drain(struct pawl_store *s)
{
    PAWL_ASSERT(!pawl__pgpool_on_io_thread(NULL)); /* blocks: never on an I/O thread */
    pthread_mutex_lock(&s->op_mu);
    /* acquire: pairs with the acq_rel decrement; callbacks' effects are visible after. */
    while (atomic_load_explicit(&s->inflight, memory_order_acquire) > 0)
        pthread_cond_wait(&s->op_cond, &s->op_mu);
    pthread_mutex_unlock(&s->op_mu);
}

/*
 * pawl_append_in: the same statement on the caller's connection, in the caller's transaction.
 * Blocking libpq calls; the connection must not be in pipeline mode or busy.
 */
int pawl_append_in(struct pg_conn *conn, const struct pawl_event *ev, size_t n,
                   struct pawl_append_result *res)
{
    return pawl_append_in_seqs(conn, ev, n, NULL, res);
}

int pawl_append_in_seqs(struct pg_conn *conn, const struct pawl_event *ev, size_t n, int64_t *seqs,
                        struct pawl_append_result *res)
{
    struct pawl_append_result local;
    if (res == NULL)
        res = &local;
    memset(res, 0, sizeof *res);
    if (conn == NULL || PQstatus(conn) != CONNECTION_OK) {
        res->rc = PAWL_ECONN;
        snprintf(res->message, sizeof res->message, "no usable connection");
        return res->rc;
    }
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    int any = 0;
    uint32_t stack[256];
    uint32_t *ix = stack;
    if (n > 256 && n <= o.max_append_events && (ix = pawl_malloc(n * sizeof *ix)) == NULL) {
        res->rc = PAWL_ENOMEM;
        snprintf(res->message, sizeof res->message, "out of memory");
        return res->rc;
    }
    int rc = pawl__log_validate(&o, ev, n, &any, ix, res->message, sizeof res->message);
    struct append_enc en;
    memset(&en, 0, sizeof en);
    en.rows = -1;
    en.head1 = -1;
    en.notify = 1; /* no finalizer of ours knows about it: wake every process's at commit */
    if (rc == 0)
        rc = pawl__log_encode(&en, ev, n, ix);
    if (ix != stack)
        pawl_free(ix);
    if (rc != 0) {
        pawl_free(en.buf);
        pawl_free(en.seqs);
        res->rc = rc;
        if (res->message[0] == '\0')
            snprintf(res->message, sizeof res->message, "%s", pawl_strerror(rc));
        return rc;
    }
    PGresult *r = PQexecParams(conn, pawl__log_append_sql, 9, pawl__log_append_types, en.values,
                               en.lengths, en.formats, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st == PGRES_TUPLES_OK) {
        if (PQntuples(r) == 1)
            pawl__log_enc_result_row(&en, r, 0);
        PQclear(r);
        if (en.status == ID_USED) {
            /* Nothing written; the transaction goes on (a row, not an error). */
            pawl_free(en.buf);
            pawl_free(en.seqs);
            res->rc = PAWL_EIDUSED;
            snprintf(res->message, sizeof res->message, "%s", en.id_msg);
            return res->rc;
        }
        if (en.rows == (int64_t)n) {
            pawl__log_enc_seqs(&en, res);
            pawl_free(en.buf);
            res->seqs = NULL;
            if (seqs != NULL && en.seqs_ok) {
                memcpy(seqs, en.seqs, n * sizeof *seqs);
                res->seqs = seqs;
            }
            pawl_free(en.seqs);
            return 0;
        }
        pawl_free(en.buf);
        pawl_free(en.seqs);
        res->rc = PAWL_ECONFLICT;
        snprintf(res->message, sizeof res->message,
                 "a stream is not at the expected version (stream_seq - 1 of its first event); "
                 "nothing was written and the transaction goes on");
        return res->rc;
    }
    pawl_free(en.buf);
    const char *ss = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    const char *cons = PQresultErrorField(r, PG_DIAG_CONSTRAINT_NAME);
    snprintf(res->sqlstate, sizeof res->sqlstate, "%s", ss ? ss : "");
    if (PQstatus(conn) != CONNECTION_OK)
        res->rc = PAWL_ECONN;
    else if (ss && strcmp(ss, "23505") == 0)
        res->rc = PAWL_ECONFLICT;
    else if (ss && (strcmp(ss, "22P02") == 0 || strcmp(ss, "22P05") == 0))
        res->rc = PAWL_EINVAL;
    else
        res->rc = PAWL_ESQL;
    int id_race = res->rc == PAWL_ECONFLICT && cons && strstr(cons, "event_id") != NULL;
    snprintf(res->message, sizeof res->message, "%s%.100s",
             id_race ? "a concurrent append wrote one of these event ids (the transaction is "
                       "aborted: retry it, and the retry reports them already appended or "
                       "names the id): "
             : res->rc == PAWL_ECONFLICT
                 ? "a concurrent append took a sequence number (the transaction is aborted: "
                   "retry it): "
                 : "",
             msg ? msg : PQerrorMessage(conn));
    PQclear(r);
    return res->rc;
}
