/*
 * group.c — group append: appends that queue while every group is in flight go to the server
 * together, in one transaction (struct append_group below says how, group_done what happens on
 * failure). grp_mu guards the queue (grp_head, grp_tail, grp_queued, linked through next_q), the
 * free groups (grp_free), grp_inflight and grp_linger_armed. The linger is an inline timer on
 * the store's timers (grp_linger), armed by an enqueue that leaves appends waiting; its callback
 * (linger_fire) runs on the timers thread, takes grp_mu and starts a group with what queued.
 * A group, and the ops in it, belong to one thread at a time: the one that took it from the
 * queue (an appender, the timers thread, or the main pool's I/O thread finishing the previous
 * group), then the main pool's I/O thread, where every completion here runs.
 * pawl__log_group_enqueue may be called from any thread, and may submit a group on it;
 * pawl__log_group_linger_stop belongs to pawl_store_free.
 */
#include "log_internal.h"

#include "timers.h"

#include <stdio.h>
#include <string.h>

/*
 * A group's statement: pawl.append_group (sql/010_group_append.sql), every append's arrays
 * concatenated, with $3 each stream slot's append (1-based) and $4 each event's slot counted
 * across the group, $10 the events' ids (NULL elements for appends without). One row per
 * append, in order, as pawl.append's; status 'again' (an id shared with an earlier append of the
 * group) means: run it alone once this transaction has ended.
 */
const char pawl__log_append_group_sql[] =
    "SELECT appended, txid, heads, status, seqs, msg FROM pawl.append_group($1::text[],"
    " $2::int8[], $3::int4[], $4::int4[], $5::int4[], $6::text[], $7::bytea[], $8::jsonb[],"
    " $9::bool, $10::text[])";

/*
 * A group: the appends that queued while earlier groups were in flight, sent as one request in
 * one implicit transaction (one commit, one WAL flush): one pawl.append_group statement with
 * every append's arrays concatenated (group_encode). It does what one pawl.append per append
 * did, back to back (sql/010_group_append.sql): the appends are taken in queue order, an append
 * whose stream is not at its expected version writes nothing and is reported with 0 while the
 * others go on (a conflict fails that append alone), appends to one stream get their numbers in
 * submission order, and the group's events are one unit with contiguous indexes in the order
 * appended; the finalizer and readers see nothing new. A group of one is a plain pawl.append;
 * a group that cannot be encoded as one message is sent as one pawl.append per append.
 *
 * At most grp_limit (= connections) groups are in flight. An append that finds a group free
 * goes at once, alone (no added latency at low load); appends that arrive while every group is
 * in flight queue, and the next group to finish takes up to append_group_max of them. Errors:
 * see group_done. A group is owned by the store (grp_free) when idle, by the pool from submit
 * to group_done, then by group_done (and its in-doubt check) until group_release.
 */
struct append_group {
    struct pawl_store *s;
    struct pawl_pgreq req;
    struct fin_piggy piggy; /* the piggybacked finalization (finalizer.c's) */
    int retries;
    int conn; /* the connection the last attempt ran on */
    size_t n; /* ops */
    char xid[24];
    char xact_status[16];
    int resolve_tries;
    int partial; /* the check runs without every append's result: only "aborted" is conclusive */
    char n_be[4];
    const char *resolve_vals[5];
    int resolve_lens[5];
    int resolve_fmts[5];
    struct append_group *next_free;
    struct pawl_pgstmt *stmts; /* [append_group_max + 1] */
    struct append_op **ops;    /* [append_group_max], in queue (submission) order */
    /* The one-statement form (group_encode): pawl.append_group's $1..$9, in buf. */
    int one;
    char notify;
    char *buf;
    size_t cap;
    const char *values[10];
    int lengths[10];
    int formats[10];
};

static void group_free(struct append_group *g)
{
    pawl_free(g->buf);
    pawl_free(g);
}

static struct append_group *group_new(struct pawl_store *s)
{
    size_t m = (size_t)s->o.append_group_max;
    struct append_group *g = pawl_calloc(1, sizeof *g + (m + 1) * sizeof(struct pawl_pgstmt) +
                                                m * sizeof(struct append_op *));
    if (g == NULL)
        return NULL;
    g->s = s;
    g->stmts = (struct pawl_pgstmt *)(g + 1);
    g->ops = (struct append_op **)(g->stmts + m + 1);
    return g;
}

static void linger_fire(struct pawl_timer *t, void *arg, int status);

/* The store's grp_limit groups, all free, and the linger timer (pawl_store_new, before the
 * timers start). 0, or PAWL_ENOMEM (those made so far are on grp_free, for
 * pawl__log_groups_fini). */
int pawl__log_groups_init(struct pawl_store *s)
{
    pawl__timer_init_inline(&s->grp_linger, linger_fire, s);
    for (int i = 0; i < s->grp_limit; i++) {
        struct append_group *g = group_new(s);
        if (g == NULL)
            return PAWL_ENOMEM;
        g->next_free = s->grp_free;
        s->grp_free = g;
    }
    return 0;
}

/* Free the groups (pawl_store_free, once none is in flight; or a failed pawl_store_new). */
void pawl__log_groups_fini(struct pawl_store *s)
{
    PAWL_ASSERT(s->grp_inflight == 0 && s->grp_head == NULL);
    while (s->grp_free) {
        struct append_group *g = s->grp_free;
        s->grp_free = g->next_free;
        group_free(g);
    }
}

/* Move up to append_group_max queued ops, oldest first, into a free group. grp_mu held. NULL
 * when nothing is queued or every group is in flight. */
static struct append_group *group_take_locked(struct pawl_store *s)
{
    PAWL_ASSERT(pawl_mutex_locked(&s->grp_mu));
    if (s->grp_head == NULL || s->grp_inflight >= s->grp_limit || s->grp_free == NULL)
        return NULL;
    struct append_group *g = s->grp_free;
    s->grp_free = g->next_free;
    s->grp_inflight++;
    size_t n = 0, max = (size_t)s->o.append_group_max;
    while (s->grp_head != NULL && n < max) {
        struct append_op *op = s->grp_head;
        s->grp_head = op->next_q;
        op->next_q = NULL;
        g->ops[n++] = op;
    }
    if (s->grp_head == NULL)
        s->grp_tail = NULL;
    s->grp_queued -= n;
    g->n = n;
    g->retries = 0;
    PAWL_ASSERT(n >= 1 && s->grp_inflight <= s->grp_limit);
    return g;
}

/* Give g back and take the next group from what queued meanwhile (NULL: none). */
static struct append_group *group_release(struct pawl_store *s, struct append_group *g)
{
    if (g->cap > BUF_KEEP_MAX) { /* as pawl__log_op_put does */
        pawl_free(g->buf);
        g->buf = NULL;
        g->cap = 0;
    }
    pthread_mutex_lock(&s->grp_mu);
    PAWL_ASSERT(s->grp_inflight > 0);
    g->next_free = s->grp_free;
    s->grp_free = g;
    s->grp_inflight--;
    struct append_group *next = group_take_locked(s);
    pthread_mutex_unlock(&s->grp_mu);
    return next;
}

static void group_done(struct pawl_pgreq *req, int rc);

/* An op's first stream (the encoded $1's first element), for ordering a group. */
static const char *op_stream(const struct append_op *op, uint32_t *len)
{
    const unsigned char *p = (const unsigned char *)op->en.values[0] + 20;
    *len = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
    return (const char *)p + 4;
}

static int op_stream_before(const struct append_op *a, const struct append_op *b)
{
    uint32_t la, lb;
    const char *sa = op_stream(a, &la), *sb = op_stream(b, &lb);
    int c = memcmp(sa, sb, la < lb ? la : lb);
    return c < 0 || (c == 0 && la < lb);
}

/*
 * Order a group of single-stream appends by stream, keeping submission order among appends to
 * the same stream (a stable insertion sort). Concurrent groups then take their streams' index
 * entries in one order, so two groups sharing streams wait for one another's commit instead of
 * deadlocking (which lock_timeout would break up at 100 ms a time). Order across different
 * streams within a transaction is no promise: what holds is per-stream order and one unit.
 */
static void group_sort(struct append_group *g)
{
    /* An append to several streams could be moved past a later append to one of its other
     * streams: such groups keep submission order. ($1's element count: bytes 12..15.) */
    for (size_t i = 0; i < g->n; i++) {
        const unsigned char *h = (const unsigned char *)g->ops[i]->en.values[0] + 12;
        if (h[0] != 0 || h[1] != 0 || h[2] != 0 || h[3] != 1)
            return;
    }
    for (size_t i = 1; i < g->n; i++) {
        struct append_op *op = g->ops[i];
        size_t j = i;
        while (j > 0 && op_stream_before(op, g->ops[j - 1])) {
            g->ops[j] = g->ops[j - 1];
            j--;
        }
        g->ops[j] = op;
    }
}

static int group_send(struct append_group *g);

/* Bytes 12..15 of an encoded one-dimensional array: its element count. */
static uint32_t array_count(const char *a)
{
    return get32(a + 12);
}

/*
 * The group's appends as pawl.append_group's parameters: each op's encoded arrays (pawl.append's
 * $1..$7) concatenated in group order, element bodies copied as they are, except $3 (each
 * event's stream, which becomes its slot across the group: offset by the slots of the ops
 * before it); sa, each slot's op (1-based), is new. 0, or an error code (then the group is
 * sent as one pawl.append statement per op).
 */
static int group_encode(struct append_group *g)
{
    /* Out parameter i comes from the ops' parameter from[i] (-1: sa; the ids, $10, from their
     * $9, NULL elements for an op without ids). */
    static const int from[9] = {0, 1, -1, 2, 3, 4, 5, 6, 8};
    static const uint32_t oid[9] = {OID_TEXT, OID_INT8,  OID_INT4,  OID_INT4, OID_INT4,
                                    OID_TEXT, OID_BYTEA, OID_JSONB, OID_TEXT};
    size_t slots = 0, events = 0, total = (size_t)9 * 20;
    int mnull = 0, ids = 0, idnull = 0;
    g->notify = 0;
    for (size_t i = 0; i < g->n; i++) {
        const struct append_enc *en = &g->ops[i]->en;
        for (int p = 0; p < 7; p++)
            total += (size_t)en->lengths[p] - 20;
        if (en->has_ids)
            total += (size_t)en->lengths[8] - 20;
        else
            total += 4 * en->n;
        ids |= en->has_ids;
        idnull |= !en->has_ids;
        slots += array_count(en->values[0]);
        events += en->n;
        mnull |= get32(en->values[6] + 4) != 0;
        g->notify |= en->notify;
    }
    total += slots * 8;
    if (total > INT32_MAX || slots > INT32_MAX || events > INT32_MAX)
        return PAWL_ETOOBIG;
    if (g->cap < total) {
        char *nb = pawl_malloc(total);
        if (nb == NULL)
            return PAWL_ENOMEM;
        pawl_free(g->buf);
        g->buf = nb;
        g->cap = total;
    }
    char *p = g->buf;
    for (int out = 0; out < 9; out++) {
        int src = from[out];
        int slot_array = out <= 2;
        char *start = p;
        if (out == 8 && !ids) {
            g->values[9] = NULL; /* no append of the group has ids */
            g->lengths[9] = 0;
            g->formats[9] = 1;
            continue;
        }
        p = array_header(p,
                         out == 7   ? mnull
                         : out == 8 ? idnull
                                    : 0,
                         oid[out], slot_array ? slots : events);
        uint32_t base = 0; /* slots of the ops before this one */
        for (size_t i = 0; i < g->n; i++) {
            const struct append_enc *en = &g->ops[i]->en;
            uint32_t m = array_count(en->values[0]);
            if (src == -1) {
                for (uint32_t j = 0; j < m; j++) {
                    p = put32(p, 4);
                    p = put32(p, (uint32_t)(i + 1));
                }
            } else if (out == 3) {
                const char *e = en->values[2] + 20;
                for (size_t j = 0; j < en->n; j++, e += 8) {
                    p = put32(p, 4);
                    p = put32(p, base + get32(e + 4));
                }
            } else if (out == 8 && !en->has_ids) {
                for (size_t j = 0; j < en->n; j++)
                    p = put32(p, (uint32_t)-1);
            } else {
                size_t len = (size_t)en->lengths[src] - 20;
                memcpy(p, en->values[src] + 20, len);
                p += len;
            }
            base += m;
        }
        int at = out == 8 ? 9 : out; /* $9 is notify, $10 the ids */
        g->values[at] = start;
        g->lengths[at] = (int)(p - start);
        g->formats[at] = 1;
    }
    g->values[8] = &g->notify;
    g->lengths[8] = 1;
    g->formats[8] = 1;
    return 0;
}

/* pawl.append_group's rows: one per op, in group order. */
static void on_group_result(void *ud, const PGresult *res)
{
    struct append_group *g = ud;
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != (int)g->n)
        return;
    for (size_t i = 0; i < g->n; i++)
        pawl__log_enc_result_row(&g->ops[i]->en, res, (int)i);
}

static void group_start(struct pawl_store *s, struct append_group *g)
{
    (void)s;
    group_sort(g);
    /* A group of one is the append alone; otherwise one statement, unless it cannot be
     * encoded (too big for one message, out of memory): then a statement per append. */
    g->one = g->n > 1 && group_encode(g) == 0;
}

static int group_send(struct append_group *g)
{
    struct pawl_store *s = g->s;
    struct pawl_pgstmt one = {.prepared = s->stmt_append_group,
                              .nparams = 10,
                              .values = g->values,
                              .lengths = g->lengths,
                              .formats = g->formats,
                              .on_result = on_group_result,
                              .ud = g,
                              .flush_after = 1};
    int k = pawl__log_append_stmts(s, g->ops, g->n, g->one ? &one : NULL, g->stmts, &g->piggy);
    memset(&g->req, 0, sizeof g->req);
    g->req.stmts = g->stmts;
    g->req.nstmts = k;
    g->req.flags = PAWL_PGREQ_IMPLICIT;
    g->req.on_done = group_done;
    g->req.ud = g;
    return pawl__pgpool_submit(s->main, &g->req);
}

/* Submit g; if the pool refuses (closing), fail its appends and go on with the next group. */
static void group_run(struct pawl_store *s, struct append_group *g)
{
    while (g != NULL) {
        group_start(s, g);
        if (group_send(g) == 0)
            return;
        for (size_t i = 0; i < g->n; i++)
            pawl__log_op_fail(g->ops[i], PAWL_ESHUTDOWN, "", "not appended: store closing");
        g = group_release(s, g);
    }
}

/*
 * Queue op for a group: at once when linger is off or a group's worth has queued; otherwise the
 * linger timer (armed by the first op to wait) starts the group when it fires, unless a group
 * that finishes first takes the queue. Any thread.
 */
void pawl__log_group_enqueue(struct pawl_store *s, struct append_op *op)
{
    struct append_group *g = NULL;
    PAWL_ASSERT(op->s == s && op->next_q == NULL); /* in no queue yet */
    pthread_mutex_lock(&s->grp_mu);
    if (s->grp_tail != NULL)
        s->grp_tail->next_q = op;
    else
        s->grp_head = op;
    s->grp_tail = op;
    s->grp_queued++;
    PAWL_ASSERT(s->grp_inflight >= 0 && s->grp_inflight <= s->grp_limit);
    if (s->o.append_group_linger_us == 0 || s->grp_queued >= (size_t)s->o.append_group_max) {
        g = group_take_locked(s);
    } else if (s->grp_inflight < s->grp_limit && !s->grp_linger_armed) {
        /* Starting a timer only queues it for the timers thread: fine under grp_mu. It cannot
         * be armed (grp_linger_armed says so), and the timers run until the store is freed;
         * should it be refused all the same, the group starts now rather than never. */
        if (pawl__timer_start_ns(s->timers, &s->grp_linger,
                                 (int64_t)s->o.append_group_linger_us * 1000) == 0)
            s->grp_linger_armed = 1;
        else
            g = group_take_locked(s);
    }
    pthread_mutex_unlock(&s->grp_mu);
    group_run(s, g);
}

/* The linger expired (the store's timers thread, holding no lock of the store's): start a group
 * with what queued meanwhile, if a group is free (if not, the next to finish takes them). */
static void linger_fire(struct pawl_timer *t, void *arg, int status)
{
    struct pawl_store *s = arg;
    (void)status;
    PAWL_ASSERT(t == &s->grp_linger && !pawl__pgpool_on_io_thread(NULL));
    pthread_mutex_lock(&s->grp_mu);
    PAWL_ASSERT(s->grp_linger_armed); /* armed under grp_mu; only this clears it, or a cancel */
    s->grp_linger_armed = 0;
    struct append_group *g = group_take_locked(s);
    pthread_mutex_unlock(&s->grp_mu);
    group_run(s, g);
}

/*
 * pawl_store_free, after pawl_store_drain: nothing is queued any more, but the linger may still
 * be armed (a group that finished first took what it was armed for). Cancel it, as stopping the
 * old retry thread dropped it; a callback that won the race finds the queue empty and touches
 * grp_mu only, which outlives the timers (pawl_timers_free joins their thread first).
 */
void pawl__log_group_linger_stop(struct pawl_store *s)
{
    pthread_mutex_lock(&s->grp_mu);
    PAWL_ASSERT(s->grp_head == NULL && s->grp_queued == 0); /* drained */
    if (s->grp_linger_armed && pawl_timer_cancel(s->timers, &s->grp_linger) == 0)
        s->grp_linger_armed = 0;
    pthread_mutex_unlock(&s->grp_mu);
}

/* A committed group's append: its statement's result says what it did. */
static void op_deliver(struct append_op *op)
{
    struct pawl_append_result res;
    memset(&res, 0, sizeof res);
    if (op->en.status == ID_AGAIN) {
        /* It shares an id with an earlier append of its group, whose transaction has ended:
         * alone now, it finds that append's ids (already appended) or fails naming one. */
        op->en.status = ID_NONE;
        op->lock_wait_start = 0;
        if (pawl__log_op_submit(op->s, op) != 0)
            pawl__log_op_fail(op, PAWL_ESHUTDOWN, "", "not appended: store closing");
        return;
    }
    if (op->en.status == ID_USED) {
        pawl__log_op_fail(op, PAWL_EIDUSED, "", op->en.id_msg);
        return;
    }
    if (op->en.rows == (int64_t)op->n) {
        res.rc = 0;
        pawl__log_enc_seqs(&op->en, &res);
    } else if (op->en.rows == 0) {
        res.rc = PAWL_ECONFLICT;
        snprintf(res.message, sizeof res.message,
                 "a stream is not at the expected version (stream_seq - 1 of its first event)");
    } else {
        res.rc = PAWL_ESQL;
        snprintf(res.message, sizeof res.message, "pawl.append returned %lld rows for %zu events",
                 (long long)op->en.rows, op->n);
    }
    pawl__log_op_finish(op, &res);
}

/* Hand op the group's failure as if it had run alone: pawl__log_op_done's retries, lock waits and
 * messages. Only for failures that say the same about every append of the group. */
static void op_as_single(struct append_op *op, const struct pawl_pgreq *greq, int rc)
{
    memset(&op->req, 0, sizeof op->req);
    op->req.ud = op;
    op->req.failed_stmt = greq->failed_stmt;
    op->req.conn_index = greq->conn_index;
    memcpy(op->req.sqlstate, greq->sqlstate, sizeof op->req.sqlstate);
    memcpy(op->req.message, greq->message, sizeof op->req.message);
    pawl__log_fin_piggy_reset(&op->piggy); /* no piggybacked run of its own */
    pawl__log_op_done(&op->req, rc);
}

static void on_group_resolve_result(void *ud, const PGresult *res)
{
    struct append_group *g = ud;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
        snprintf(g->xact_status, sizeof g->xact_status, "%s", PQgetvalue(res, 0, 0));
}

static void group_resolve_done(struct pawl_pgreq *req, int rc);

/*
 * The connection died after the group's COMMIT was sent. When every append's result arrived
 * (the last one is flushed before the commit), ask on a fresh connection whether the
 * transaction committed: pawl__log_resolve_sql with the group's xid, its first writing append's
 * first event (which holds k = 0) and the events the group wrote (that row's n). When only some
 * results arrived (the xid is in the first), ask anyway: "aborted" still settles every append
 * (partial). -1: nothing to ask.
 */
static int group_resolve_start(struct append_group *g)
{
    struct pawl_store *s = g->s;
    struct append_op *first = NULL;
    int64_t written = 0;
    g->xid[0] = '\0';
    g->partial = 0;
    for (size_t i = 0; i < g->n; i++) {
        struct append_op *op = g->ops[i];
        if (op->en.rows < 0)
            g->partial = 1;
        if (g->xid[0] == '\0' && op->en.xid[0] != '\0')
            memcpy(g->xid, op->en.xid, sizeof g->xid);
        if (op->en.rows == (int64_t)op->n && op->en.status == ID_NONE) {
            written += op->en.rows;
            if (first == NULL)
                first = op;
        }
    }
    if (g->partial) {
        first = g->ops[0];
        written = 0; /* matches no k = 0 row: a "committed" answer stays unverified */
    }
    if (first == NULL || g->xid[0] == '\0' || written > INT32_MAX)
        return -1;
    put32(g->n_be, (uint32_t)written);
    static const int from[5] = {-1, 0, 4, 5, -1};
    for (int i = 0; i < 5; i++) {
        g->resolve_vals[i] = i == 0 ? g->xid : i == 4 ? g->n_be : first->en.values[from[i]];
        g->resolve_lens[i] = i == 0 ? 0 : i == 4 ? 4 : first->en.lengths[from[i]];
        g->resolve_fmts[i] = i == 0 ? 0 : 1;
    }
    g->xact_status[0] = '\0';
    g->stmts[0] = (struct pawl_pgstmt){.prepared = s->stmt_resolve,
                                       .nparams = 5,
                                       .values = g->resolve_vals,
                                       .lengths = g->resolve_lens,
                                       .formats = g->resolve_fmts,
                                       .on_result = on_group_resolve_result,
                                       .ud = g};
    memset(&g->req, 0, sizeof g->req);
    g->req.stmts = g->stmts;
    g->req.nstmts = 1;
    g->req.flags = PAWL_PGREQ_READONLY;
    g->req.on_done = group_resolve_done;
    g->req.ud = g;
    return pawl__pgpool_submit(s->main, &g->req);
}

/*
 * Tell every append of an in-doubt group its outcome. status: the transaction's, as checked
 * ("committed", "aborted", "reused"), or NULL when unknown (why: the reason).
 */
static void group_in_doubt_finish(struct append_group *g, const char *status, const char *why)
{
    int all_none = 1; /* every append's result arrived and none wrote: nothing can be lost */
    for (size_t i = 0; i < g->n; i++)
        if (g->ops[i]->en.rows != 0 && g->ops[i]->en.status != ID_ALREADY)
            all_none = 0;
    for (size_t i = 0; i < g->n; i++) {
        struct append_op *op = g->ops[i];
        char msg[256];
        if (op->en.status == ID_ALREADY || op->en.status == ID_USED) {
            op_deliver(op); /* it wrote nothing: its outcome does not depend on the commit */
        } else if (all_none) {
            op_deliver(op); /* conflicts against committed rows: real ones */
        } else if (status != NULL && strcmp(status, "committed") == 0) {
            if (op->en.rows >= 0) {
                op_deliver(op);
            } else {
                snprintf(msg, sizeof msg,
                         "connection lost during commit of a group; its transaction %s "
                         "committed but this append's result did not arrive: unknown outcome",
                         g->xid);
                pawl__log_op_fail(op, PAWL_EINDOUBT, "", msg);
            }
        } else if (status != NULL &&
                   (strcmp(status, "aborted") == 0 || strcmp(status, "reused") == 0)) {
            snprintf(msg, sizeof msg,
                     "connection lost during commit; the server reports the group's transaction "
                     "%s %s: not committed",
                     g->xid, strcmp(status, "aborted") == 0 ? "aborted" : "gone (restarted)");
            pawl__log_op_fail(op, PAWL_ECONN, "", msg);
        } else if (op->en.rows == 0) {
            /* It wrote nothing, whatever became of the others. */
            pawl__log_op_fail(
                op, PAWL_ECONN, "",
                "connection lost during commit of a group; this append wrote nothing: not "
                "committed");
        } else {
            snprintf(msg, sizeof msg,
                     "connection lost during commit of a group of %zu appends (transaction "
                     "%s); its outcome could not be checked (%s): unknown outcome",
                     g->n, g->xid[0] ? g->xid : "unknown", why);
            pawl__log_op_fail(op, PAWL_EINDOUBT, "", msg);
        }
    }
}

static void group_resolve_done(struct pawl_pgreq *req, int rc)
{
    struct append_group *g = req->ud;
    struct pawl_store *s = g->s;
    PAWL_ASSERT(pawl__pgpool_on_io_thread(s->main)); /* a completion of the main pool */
    /* Still running, or the check itself failed (its connection was lost, say): it is
     * read-only, so ask again, a bounded number of times. */
    if (((rc == 0 && strcmp(g->xact_status, "in progress") == 0) ||
         (rc != 0 && rc != PAWL_ESHUTDOWN)) &&
        (g->resolve_tries += rc == 0 ? 1 : RESOLVE_ERROR_COST) < RESOLVE_TRIES &&
        group_resolve_start(g) == 0)
        return;
    if (rc == 0 && g->partial && strcmp(g->xact_status, "aborted") != 0)
        group_in_doubt_finish(g, NULL, "the transaction's state could not be verified");
    else if (rc == 0 &&
             (strcmp(g->xact_status, "committed") == 0 || strcmp(g->xact_status, "aborted") == 0 ||
              strcmp(g->xact_status, "reused") == 0))
        group_in_doubt_finish(g, g->xact_status, NULL);
    else
        group_in_doubt_finish(g, NULL, rc == 0 ? g->xact_status : pawl_strerror(rc));
    group_run(s, group_release(s, g));
}

/*
 * A group's request finished. Committed: each append gets its statement's outcome (written, or
 * a conflict that wrote nothing). A group of one: exactly a single append's handling. Otherwise
 * the transaction rolled back as a whole (nothing half-written), and:
 *   - lock_timeout, a lost connection before the commit, shutdown: each append is handled as
 *     if it had failed alone (lock waits retry it alone, off the pipeline);
 *   - a deadlock, a serialization failure, or a unique violation (another transaction took a
 *     sequence number first): the whole group runs again, up to ANY_RETRIES times (an append
 *     with explicit versions then finds the new head and fails alone as a conflict);
 *   - any other error (one append's bad metadata, say): every append runs again alone, in
 *     order, pinned to one connection, so that only the culprit fails and the others keep
 *     their order;
 *   - in doubt (the connection died after the commit was sent): the transaction's fate is
 *     checked (group_resolve_start); nothing is run again, so nothing is appended twice, and
 *     an append whose fate cannot be learned is told PAWL_EINDOUBT ("unknown outcome").
 */
static void group_done(struct pawl_pgreq *req, int rc)
{
    struct append_group *g = req->ud;
    struct pawl_store *s = g->s;
    PAWL_ASSERT(pawl__pgpool_on_io_thread(s->main) && g->n >= 1); /* the main pool's completion */
    g->conn = req->conn_index;
    if (rc == 0) {
        pawl__log_fin_piggy_done(s, &g->piggy); /* a piggybacked run committed with it */
        /* relaxed: statistics. */
        atomic_fetch_add_explicit(&s->groups_ok, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->groups_appends, (long long)g->n, memory_order_relaxed);
        for (size_t i = 0; i < g->n; i++)
            op_deliver(g->ops[i]);
    } else if (g->n == 1 || rc == PAWL_ECONN || rc == PAWL_ESHUTDOWN ||
               (rc == PAWL_ESQL && strcmp(req->sqlstate, "55P03") == 0)) {
        for (size_t i = 0; i < g->n; i++)
            op_as_single(g->ops[i], req, rc);
    } else if (rc == PAWL_ESQL) {
        int retryable = strcmp(req->sqlstate, "40P01") == 0 ||
                        strcmp(req->sqlstate, "40001") == 0 || strcmp(req->sqlstate, "23505") == 0;
        if (retryable && g->retries < ANY_RETRIES) {
            g->retries++;
            /* relaxed: statistics. */
            atomic_fetch_add_explicit(&s->retries, 1, memory_order_relaxed);
            if (group_send(g) == 0)
                return;
            for (size_t i = 0; i < g->n; i++)
                pawl__log_op_fail(g->ops[i], PAWL_ESHUTDOWN, "", "not appended: store closing");
        } else {
            for (size_t i = 0; i < g->n; i++) {
                struct append_op *op = g->ops[i];
                op->lock_wait_start = 0;
                if (pawl__log_op_submit_on(s, op, g->conn) != 0)
                    pawl__log_op_fail(op, PAWL_ESHUTDOWN, "", "not appended: store closing");
            }
        }
    } else {
        PAWL_ASSERT(rc == PAWL_EINDOUBT);
        g->resolve_tries = 0;
        if (group_resolve_start(g) == 0)
            return; /* group_resolve_done finishes it, holding its slot meanwhile */
        group_in_doubt_finish(g, NULL, "not every append's result arrived before the loss");
    }
    group_run(s, group_release(s, g));
}
