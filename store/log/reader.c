/*
 * reader.c — reads and follows: pawl_read (and its bounded pawl__log_read_until), pawl_follow, the
 * filtered and the per-stream reads. Each call is one read at a time on the caller's thread,
 * blocking (never on a store's I/O thread): read_routed sends it where it should go (the main
 * pool, or the standby's with a read_dsn: standby.c decides), read_loop runs it again across
 * lost connections and backs off across gaps (read_gap). No lock of its own: the reader state
 * shared by a store's readers (the outage's start rd_down_since, the gap episode gap_active and
 * its back-off, the counters) is relaxed atomics, and sleeping or moving the known index goes
 * through index.c (idx_mu). A read batch belongs to its caller.
 */
#include "log_internal.h"

#include "filter.h"
#include "metrics.h"
#include "standby.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The reads (store.c prepares them on the main pool and, with a read_dsn, the standby's). */
const char pawl__log_read_sql[] =
    "SELECT global_index, stream_id, stream_seq, type, payload, metadata, appended_at, event_id"
    "  FROM pawl_api.read($1::int8, $2::int4)";
/* Its rows, then one position row (stream_id NULL, global_index the position looked up to). */
const char pawl__log_read_filtered_sql[] =
    "SELECT global_index, stream_id, stream_seq, type, payload, metadata, appended_at, event_id"
    "  FROM pawl_api.read_filtered($1::int8, $2::int4, $3::text[], $4::text[], $5::text[])";
const char pawl__log_read_stream_sql[] =
    "SELECT global_index, stream_id, stream_seq, type, payload, metadata, appended_at, event_id"
    "  FROM pawl_api.read_stream($3::text, $1::int8, $2::int4)";

#define PG_EPOCH_OFFSET_US 946684800000000LL /* 2000-01-01 - 1970-01-01 in µs */

/*
 * Readers survive lost connections: a read that lost its connection runs again from the same
 * position once the pool has reconnected (pawl__log_read_until), so a caller never sees an outage
 * other than as a delay, and never an event twice or a skipped one. And a reader never spins:
 * a read that finds nothing where the known highest index promised events backs off and
 * re-learns that index from the log (read_gap).
 */

void pawl_read_batch_init(struct pawl_read_batch *b)
{
    memset(b, 0, sizeof *b);
}

void pawl_read_batch_fini(struct pawl_read_batch *b)
{
    if (b == NULL)
        return;
    if (b->_res)
        PQclear(b->_res);
    pawl_free(b->events);
    memset(b, 0, sizeof *b);
}

static void keep_result(void *ud, const PGresult *res)
{
    *(PGresult **)ud = (PGresult *)res;
}

/* What a read asks for: the log (pawl_read), the log through a filter, or one stream. */
enum read_kind { READ_LOG, READ_FILTERED, READ_STREAM };
struct read_q {
    enum read_kind kind;
    const char *arr[3]; /* READ_FILTERED: the text[] literals of categories, prefixes, types */
    const char *stream; /* READ_STREAM */
    int64_t position;   /* READ_FILTERED, out: the position the read looked up to */
};

/*
 * Send one read where plan says and wait for its result (pawl__log_read_sql, or the filtered or
 * stream read, on the main pool or the standby's). 0 with *resp holding the rows; 0 with
 * *not_standby set (and no rows) when the standby turned out not to be one any more; or the
 * failure, with the store's error set and the server's SQLSTATE (or "") in sqlstate.
 */
static int read_exec(struct pawl_store *s, const struct read_q *q, int64_t after, size_t max,
                     PGresult **resp, char sqlstate[6], struct pawl_sb_plan *plan, int *not_standby)
{
    int on_standby = plan->pool != NULL;
    char after_be[8], max_be[4];
    put64(after_be, (uint64_t)after);
    put32(max_be, (uint32_t)max);
    const char *vals[5] = {after_be, max_be, NULL, NULL, NULL};
    int lens[5] = {8, 4, 0, 0, 0}, fmts[5] = {1, 1, 0, 0, 0};
    int nparams = 2, stmt;
    if (q->kind == READ_FILTERED) {
        for (int i = 0; i < 3; i++)
            vals[2 + i] = q->arr[i];
        nparams = 5;
        stmt = on_standby ? s->stmt_read_f_sb : s->stmt_read_f;
    } else if (q->kind == READ_STREAM) {
        vals[2] = q->stream;
        nparams = 3;
        stmt = on_standby ? s->stmt_read_s_sb : s->stmt_read_s;
    } else {
        stmt = on_standby ? s->stmt_read_sb : s->stmt_read;
    }
    PGresult *res = NULL;
    struct pawl_pgstmt st[2] = {{.prepared = stmt,
                                 .nparams = nparams,
                                 .values = vals,
                                 .lengths = lens,
                                 .formats = fmts,
                                 .result_binary = 1,
                                 .on_result = keep_result,
                                 .ud = &res,
                                 .keep_result = 1}};
    /* On a standby, the read is followed in the same request by the check that the server is
     * still in recovery (so it was while the read ran: promotion is one-way). */
    if (on_standby)
        st[1] = plan->check;
    struct pawl_pgreq req = {
        .stmts = st, .nstmts = on_standby ? 2 : 1, .flags = PAWL_PGREQ_READONLY};
    int rc = pawl__pgpool_exec(on_standby ? plan->pool : s->main, -1, &req);
    if (rc == 0 && !plan->trusted) {
        if (res)
            PQclear(res);
        *not_standby = 1;
        return 0;
    }
    if (rc != 0 || res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK) {
        if (rc == 0)
            rc = PAWL_ESQL;
        /* PW020: retention dropped the events after this position; the message names the
         * log's start (its low-watermark). */
        if (rc == PAWL_ESQL && strcmp(req.sqlstate, "PW020") == 0)
            rc = PAWL_ETRUNCATED;
        /* 22023: the server refused an argument (a filter the checks here let through). */
        if (rc == PAWL_ESQL && strcmp(req.sqlstate, "22023") == 0)
            rc = PAWL_EINVAL;
        memcpy(sqlstate, req.sqlstate, 6);
        sqlstate[5] = '\0';
        pawl__log_set_err(s, req.sqlstate, req.message[0] ? req.message : "read failed");
        if (res)
            PQclear(res);
        return rc;
    }
    *resp = res;
    return 0;
}

/*
 * The rows of a read (res, which b keeps on success and which is cleared on failure) as b's
 * events, checked against what the read promised: index order, no gap, the stream's sequence.
 * Raises the known index to what the read saw.
 */
static int read_rows(struct pawl_store *s, struct read_q *q, int64_t after,
                     struct pawl_read_batch *b, PGresult *res)
{
    size_t n = (size_t)PQntuples(res);
    if (q->kind == READ_FILTERED) {
        /* The last row is the position row. */
        if (n == 0 || !PQgetisnull(res, (int)n - 1, 1)) {
            pawl__log_set_err(s, NULL, "the filtered read returned no position row");
            PQclear(res);
            return PAWL_ESQL;
        }
        n--;
        q->position = get64(PQgetvalue(res, (int)n, 0));
        if (q->position < after) {
            pawl__log_set_err(s, NULL, "the filtered read went backwards");
            PQclear(res);
            return PAWL_ESQL;
        }
    }
    if (n > b->_cap) {
        struct pawl_event *ne = pawl_malloc(n * sizeof *ne);
        if (ne == NULL) {
            PQclear(res);
            return PAWL_ENOMEM;
        }
        pawl_free(b->events);
        b->events = ne;
        b->_cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        struct pawl_event *e = &b->events[i];
        int r = (int)i;
        e->index = get64(PQgetvalue(res, r, 0));
        e->stream_id = PQgetvalue(res, r, 1);
        e->stream_seq = get64(PQgetvalue(res, r, 2));
        e->type = PQgetvalue(res, r, 3);
        e->payload = PQgetvalue(res, r, 4);
        e->payload_len = (size_t)PQgetlength(res, r, 4);
        if (PQgetisnull(res, r, 5) || PQgetlength(res, r, 5) < 1)
            e->metadata = NULL;
        else
            e->metadata = PQgetvalue(res, r, 5) + 1; /* skip the jsonb version byte */
        e->appended_at_us = get64(PQgetvalue(res, r, 6)) + PG_EPOCH_OFFSET_US;
        e->id = PQgetisnull(res, r, 7) ? NULL : PQgetvalue(res, r, 7);
        const char *broken = NULL;
        if (q->kind == READ_LOG && e->index != after + 1 + (int64_t)i)
            broken = "the log returned a gap: index order broken";
        else if (q->kind == READ_FILTERED &&
                 (e->index <= (i ? e[-1].index : after) || e->index > q->position))
            broken = "the filtered read returned events out of index order";
        else if (q->kind == READ_STREAM &&
                 (e->stream_seq != after + 1 + (int64_t)i || strcmp(e->stream_id, q->stream) != 0 ||
                  (i > 0 && e->index <= e[-1].index)))
            broken = "the stream read returned events out of sequence order";
        if (broken) {
            pawl__log_set_err(s, NULL, broken);
            PQclear(res);
            b->count = 0;
            return PAWL_ESQL;
        }
    }
    b->count = n;
    b->_res = res;
    if (q->kind == READ_FILTERED)
        pawl__log_index_raise(s, q->position);
    else if (n > 0)
        pawl__log_index_raise(s, b->events[n - 1].index);
    return 0;
}

/*
 * One read, no retry, where plan says: after is an index (READ_STREAM: a stream sequence
 * number). On failure the store's error is set and the server's SQLSTATE (or "") copied to
 * sqlstate.
 */
static int read_once(struct pawl_store *s, struct read_q *q, int64_t after, size_t max,
                     struct pawl_read_batch *b, char sqlstate[6], struct pawl_sb_plan *plan,
                     int *not_standby)
{
    *not_standby = 0;
    sqlstate[0] = '\0';
    if (b->_res) {
        PQclear(b->_res);
        b->_res = NULL;
    }
    b->count = 0;
    q->position = after;
    /* Nothing can lie beyond INT64_MAX: ask only for what fits, so the last index wanted
     * (after + max) cannot overflow in the query. */
    if ((uint64_t)(INT64_MAX - after) < max)
        max = (size_t)(INT64_MAX - after);
    if (max == 0)
        return 0;
    PGresult *res = NULL;
    int rc = read_exec(s, q, after, max, &res, sqlstate, plan, not_standby);
    if (rc != 0 || *not_standby)
        return rc;
    return read_rows(s, q, after, b, res);
}

/*
 * Whether a failed read lost its connection, or met a failure of the moment that running it
 * again cures, rather than a real error. Reads are read-only, so running one again is always
 * safe: ECONN (the pool's lost connection or no connection within its queue timeout), the
 * server ending the session (57P01 terminated, 57P02 crash, 57P03 starting up or shutting
 * down, class 08), on a hot standby a conflict with recovery (40001), 55P03 (the session's
 * lock_timeout expired while `pawl retention` held the log's lock to rotate or drop a
 * partition), and 25P02: a read is one
 * statement in a transaction of its own, so "not run: an earlier statement failed" means it
 * was pipelined behind a request whose session the server was ending, and never ran.
 */
static int read_lost(int rc, const char *sqlstate)
{
    if (rc == PAWL_ECONN || rc == PAWL_EINDOUBT)
        return 1;
    if (rc != PAWL_ESQL)
        return 0;
    return strncmp(sqlstate, "08", 2) == 0 || strcmp(sqlstate, "57P01") == 0 ||
           strcmp(sqlstate, "57P02") == 0 || strcmp(sqlstate, "57P03") == 0 ||
           strcmp(sqlstate, "40001") == 0 || strcmp(sqlstate, "25P02") == 0 ||
           strcmp(sqlstate, "55P03") == 0;
}

static void on_index_value(void *ud, const PGresult *res)
{
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
        *(int64_t *)ud = PQgetisnull(res, 0, 0) ? 0 : strtoll(PQgetvalue(res, 0, 0), NULL, 10);
}

/* The log's own highest index, through the main pool. */
static int log_last_index(struct pawl_store *s, int64_t *out)
{
    int64_t v = -1;
    struct pawl_pgstmt st = {.prepared = s->stmt_last, .on_result = on_index_value, .ud = &v};
    struct pawl_pgreq req = {.stmts = &st, .nstmts = 1, .flags = PAWL_PGREQ_READONLY};
    int rc = pawl__pgpool_exec(s->main, -1, &req);
    if (rc == 0 && v < 0)
        rc = PAWL_ESQL;
    *out = v;
    return rc;
}

/*
 * The known highest index promised events after `after` (it was known before the read was
 * sent, so the read's snapshot had to see them) and the log returned none: the known index is
 * ahead of the log (a failover that lost the log's tail, say). Back off (1 ms doubling to 1 s
 * across consecutive gaps, so a caller that loops on it never spins), log the episode once,
 * and learn the highest index from the log. When the log says nothing lies after `after`, the
 * known index comes down to the log's word (only if nothing raised it meanwhile), and is asked
 * once more at once: a run that committed between the question and the lowering raises it
 * again, so no follower sleeps through it. Returns 0 or PAWL_ESHUTDOWN.
 */
static int read_gap(struct pawl_store *s, int64_t after, int64_t known)
{
    /* relaxed: statistics and a back-off hint shared by the store's readers. */
    if (!atomic_exchange_explicit(&s->gap_active, 1, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&s->rd_gaps, 1, memory_order_relaxed);
        pawl_metric_inc(PAWL_M_READ_GAPS);
        PAWL_WARN("log",
                  "read: the highest index known here is %lld, but the log returned nothing "
                  "after %lld: backing off and asking the log for its highest index",
                  (long long)known, (long long)after);
    }
    int64_t wait = atomic_load_explicit(&s->gap_backoff_ns, memory_order_relaxed);
    if (wait <= 0)
        wait = 1000000;
    atomic_store_explicit(&s->gap_backoff_ns, PAWL_MIN(wait * 2, (int64_t)1000000000),
                          memory_order_relaxed);
    int rc = pawl__log_index_sleep(s, wait);
    if (rc != 0)
        return rc;
    long long cur = atomic_load_explicit(&s->last_index, memory_order_relaxed);
    int64_t told;
    if (log_last_index(s, &told) != 0)
        return 0; /* the next read retries (or reports) whatever went wrong */
    if (told > after)
        return 0; /* the log has them: the next read should find them */
    int lowered = pawl__log_index_lower(s, cur, told);
    int64_t again;
    if (log_last_index(s, &again) == 0)
        pawl__log_index_raise(s, again);
    if (lowered && atomic_exchange_explicit(&s->gap_active, 0, memory_order_relaxed)) {
        atomic_store_explicit(&s->gap_backoff_ns, 0, memory_order_relaxed);
        PAWL_WARN("log",
                  "read: the log's highest index is %lld (the %lld known here was ahead of it): "
                  "waiting for new events",
                  (long long)told, (long long)cur);
    }
    return 0;
}

/*
 * pawl_read with the retries of lost connections. deadline_ns (monotonic; 0: none) bounds this
 * call: when it passes while the connection is still lost, the call returns PAWL_ETIMEDOUT with
 * count 0 and the outage goes on (the next call continues it: the episode, its one log line and
 * its long deadline belong to the store, not to one call).
 */
static int read_loop(struct pawl_store *s, struct read_q *q, int64_t after, size_t max,
                     struct pawl_read_batch *b, int64_t deadline_ns);

int pawl__log_read_until(struct pawl_store *s, int64_t after, size_t max, struct pawl_read_batch *b,
                         int64_t deadline_ns)
{
    if (s == NULL || b == NULL)
        return PAWL_EINVAL;
    if (after < 0 || max < 1 || max > 100000)
        return PAWL_ERANGE;
    struct read_q q = {.kind = READ_LOG};
    return read_loop(s, &q, after, max, b, deadline_ns);
}

/*
 * Whether a read that succeeded found nothing where the known highest index promised
 * something: no event after `after` (READ_LOG), no position beyond it (READ_FILTERED: the read
 * looks up to the head of its snapshot). A stream read has no such promise.
 */
static int read_found_nothing(const struct read_q *q, int64_t after,
                              const struct pawl_read_batch *b)
{
    switch (q->kind) {
    case READ_LOG:
        return b->count == 0;
    case READ_FILTERED:
        return q->position <= after;
    case READ_STREAM:
        break;
    }
    return 0;
}

/* What read_routed tells read_loop to do next. */
enum read_route {
    ROUTE_READ,   /* a read ran (where it should): its rc and sqlstate say how it went */
    ROUTE_RETURN, /* return rc to the caller */
    ROUTE_AGAIN   /* the read goes to the primary in the standby's stead: read again there */
};

/*
 * Where does this read go: one read, sent where the standby's plan says (standby.c: the main
 * pool, or with a read_dsn the standby's), and what it found settled with the standby. plan is
 * read_loop's, shared by the call's reads; known the highest index known before the read. The
 * read's outcome goes to *rc and ss (the server's SQLSTATE).
 */
static enum read_route read_routed(struct pawl_store *s, struct read_q *q, int64_t after,
                                   size_t max, struct pawl_read_batch *b, int64_t known,
                                   int64_t deadline_ns, struct pawl_sb_plan *plan, char ss[6],
                                   int *rc)
{
    char why[300];
    int not_sb = 0;
    if (pawl__standby_plan(s->sb, plan, why, sizeof why) != 0) {
        pawl__log_set_err(s, NULL, why);
        ss[0] = '\0';
        *rc = PAWL_ECONN;
    } else {
        *rc = read_once(s, q, after, max, b, ss, plan, &not_sb);
    }
    enum pawl_sb_outcome what;
    if (*rc == 0)
        what = not_sb                                             ? PAWL_SB_NOT_STANDBY
               : read_found_nothing(q, after, b) && known > after ? PAWL_SB_BEHIND
                                                                  : PAWL_SB_GOT;
    else
        what = read_lost(*rc, ss) ? PAWL_SB_LOST : PAWL_SB_FAILED;
    int64_t wait;
    switch (pawl__standby_settle(s->sb, plan, what, after, known, &wait)) {
    case PAWL_SB_USE:
        break;
    case PAWL_SB_AGAIN:
        return ROUTE_AGAIN;
    case PAWL_SB_WAIT:
        b->count = 0;
        if (deadline_ns > 0)
            wait = PAWL_MIN(wait, PAWL_MAX(deadline_ns - pawl_now_ns(), 0));
        *rc = pawl__log_index_sleep(s, wait);
        return ROUTE_RETURN;
    }
    return ROUTE_READ;
}

static int read_loop(struct pawl_store *s, struct read_q *q, int64_t after, size_t max,
                     struct pawl_read_batch *b, int64_t deadline_ns)
{
    PAWL_ASSERT(!pawl__pgpool_on_io_thread(NULL)); /* blocks: never on an I/O thread */
    int64_t pause = 10000000;       /* 10 ms, doubling to 1 s between retries of this call */
    struct pawl_sb_plan plan = {0}; /* where this call's reads go (standby.c) */
    for (;;) {
        /* relaxed: a snapshot; the read below is sent after it. */
        int64_t known = atomic_load_explicit(&s->last_index, memory_order_relaxed);
        char ss[6];
        int rc;
        switch (read_routed(s, q, after, max, b, known, deadline_ns, &plan, ss, &rc)) {
        case ROUTE_AGAIN:
            continue;
        case ROUTE_RETURN:
            return rc;
        case ROUTE_READ:
            break;
        }
        if (rc == 0) {
            int64_t since = 0;
            if (atomic_load_explicit(&s->rd_down_since, memory_order_relaxed) != 0 &&
                (since = atomic_exchange_explicit(&s->rd_down_since, 0, memory_order_relaxed)) != 0)
                PAWL_INFO("log", "read: reading again after index %lld (the outage lasted %.1f s)",
                          (long long)after, (double)(pawl_now_ns() - since) / 1e9);
            int nothing = read_found_nothing(q, after, b);
            if (nothing && known > after)
                return read_gap(s, after, known);
            if (!nothing && q->kind != READ_STREAM &&
                atomic_load_explicit(&s->gap_active, memory_order_relaxed) &&
                atomic_exchange_explicit(&s->gap_active, 0, memory_order_relaxed)) {
                atomic_store_explicit(&s->gap_backoff_ns, 0, memory_order_relaxed);
                PAWL_WARN("log", "read: the log has events after %lld again", (long long)after);
            }
            return 0;
        }
        if (!read_lost(rc, ss))
            return rc;
        int64_t now = pawl_now_ns();
        long long since = 0; /* the type of rd_down_since (atomic_llong) */
        /* relaxed: the episode's start is a statistic and a deadline; readers agree on it
         * through the CAS alone. */
        if (atomic_compare_exchange_strong_explicit(&s->rd_down_since, &since, now,
                                                    memory_order_relaxed, memory_order_relaxed)) {
            since = now;
            atomic_fetch_add_explicit(&s->rd_reconnects, 1, memory_order_relaxed);
            char e[512];
            pawl_store_errmsg(s, e, sizeof e);
            if (strcmp(ss, "55P03") == 0)
                PAWL_WARN("log",
                          "read: the log's lock was held too long while reading after index "
                          "%lld (%s; `pawl retention` rotating or dropping a partition): "
                          "reading again",
                          (long long)after, e);
            else
                PAWL_WARN("log",
                          "read: lost the connection while reading after index %lld (%s): "
                          "reading again once the pool has reconnected",
                          (long long)after, e);
        }
        int limit = s->o.read_retry_timeout_ms;
        if (limit > 0 && now - since >= (int64_t)limit * 1000000) {
            char e[512], msg[600];
            pawl_store_errmsg(s, e, sizeof e);
            snprintf(msg, sizeof msg,
                     "no connection to read from for %.1f s (read_retry_timeout_ms %d): %s",
                     (double)(now - since) / 1e9, limit, e);
            pawl__log_set_err(s, NULL, msg);
            return PAWL_ECONN;
        }
        /* Run again: here, or by the caller's next call when this one's deadline is due. */
        atomic_fetch_add_explicit(&s->rd_retries, 1, memory_order_relaxed);
        pawl_metric_inc(PAWL_M_READ_RETRIES);
        if (deadline_ns > 0 && now >= deadline_ns)
            return PAWL_ETIMEDOUT;
        int64_t nap = pause;
        if (deadline_ns > 0)
            nap = PAWL_MIN(nap, deadline_ns - now);
        pause = PAWL_MIN(pause * 2, (int64_t)1000000000);
        rc = pawl__log_index_sleep(s, nap);
        if (rc != 0)
            return rc;
    }
}

int pawl_read(struct pawl_store *s, int64_t after, size_t max, struct pawl_read_batch *b)
{
    return pawl__log_read_until(s, after, max, b, 0);
}

int pawl_follow(struct pawl_store *s, int64_t after, size_t max, struct pawl_read_batch *b,
                int timeout_ms)
{
    int64_t deadline = timeout_ms >= 0 ? pawl_now_ns() + (int64_t)timeout_ms * 1000000 : 0;
    for (;;) {
        int rc = pawl__log_read_until(s, after, max, b, deadline);
        if (rc != 0 || b->count > 0)
            return rc;
        int left = -1;
        if (timeout_ms >= 0) {
            int64_t l = deadline - pawl_now_ns();
            if (l <= 0)
                return PAWL_ETIMEDOUT;
            left = (int)((l + 999999) / 1000000);
        }
        rc = pawl_store_wait(s, after, left);
        if (rc == PAWL_ESHUTDOWN)
            return rc;
        if (rc == PAWL_ETIMEDOUT) {
            /* One last look: without a listener, notifications from others never arrive. */
            rc = pawl__log_read_until(s, after, max, b, deadline);
            if (rc != 0 || b->count > 0)
                return rc;
            return PAWL_ETIMEDOUT;
        }
    }
}

/* Fill q for f (its literals allocated; free with filter_q_fini). */
static int filter_q_init(struct pawl_store *s, struct read_q *q, const struct pawl_filter *f)
{
    memset(q, 0, sizeof *q);
    q->kind = READ_FILTERED;
    char why[300];
    if (pawl_filter_check(f, why, sizeof why) != 0) {
        char m[340];
        snprintf(m, sizeof m, "read filter: %s", why);
        pawl__log_set_err(s, NULL, m);
        return PAWL_EINVAL;
    }
    const char *const *v[3] = {f->categories, f->stream_prefixes, f->types};
    size_t n[3] = {f->n_categories, f->n_stream_prefixes, f->n_types};
    for (int i = 0; i < 3; i++) {
        if (n[i] == 0)
            continue;
        char *lit = pawl__filter_array_literal(v[i], n[i]);
        if (lit == NULL) {
            for (int j = 0; j < i; j++)
                pawl_free((char *)q->arr[j]);
            return PAWL_ENOMEM;
        }
        q->arr[i] = lit;
    }
    return 0;
}

static void filter_q_fini(struct read_q *q)
{
    for (int i = 0; i < 3; i++)
        pawl_free((char *)q->arr[i]);
}

static int read_filtered_until(struct pawl_store *s, int64_t after, size_t max,
                               const struct pawl_filter *f, struct pawl_read_batch *b,
                               int64_t *position, int64_t deadline_ns)
{
    if (s == NULL || b == NULL || position == NULL)
        return PAWL_EINVAL;
    *position = after;
    b->count = 0;
    if (after < 0 || max < 1 || max > 100000)
        return PAWL_ERANGE;
    struct read_q q;
    int rc = filter_q_init(s, &q, f);
    if (rc != 0)
        return rc;
    rc = read_loop(s, &q, after, max, b, deadline_ns);
    if (rc == 0)
        *position = q.position;
    filter_q_fini(&q);
    return rc;
}

int pawl_read_filtered(struct pawl_store *s, int64_t after, size_t max, const struct pawl_filter *f,
                       struct pawl_read_batch *b, int64_t *position)
{
    return read_filtered_until(s, after, max, f, b, position, 0);
}

int pawl__log_read_filtered_until(struct pawl_store *s, int64_t after, size_t max,
                                  const struct pawl_filter *f, struct pawl_read_batch *b,
                                  int64_t *position, int64_t deadline_ns)
{
    return read_filtered_until(s, after, max, f, b, position, deadline_ns);
}

int pawl_follow_filtered(struct pawl_store *s, int64_t after, size_t max,
                         const struct pawl_filter *f, struct pawl_read_batch *b, int64_t *position,
                         int timeout_ms)
{
    if (position == NULL)
        return PAWL_EINVAL;
    *position = after;
    int64_t deadline = timeout_ms >= 0 ? pawl_now_ns() + (int64_t)timeout_ms * 1000000 : 0;
    int64_t at = after;
    for (;;) {
        int64_t pos = at;
        int rc = read_filtered_until(s, at, max, f, b, &pos, deadline);
        if (rc == 0)
            *position = at = PAWL_MAX(pos, at);
        if (rc != 0 && rc != PAWL_ETIMEDOUT)
            return rc;
        if (rc == 0 && b->count > 0)
            return 0;
        /* Nothing matched up to the position: look on from there once the log moves past it
         * (at once when the read stopped short of the known head). */
        int left = -1;
        if (timeout_ms >= 0) {
            int64_t l = deadline - pawl_now_ns();
            if (l <= 0)
                return PAWL_ETIMEDOUT;
            left = (int)((l + 999999) / 1000000);
        }
        rc = pawl_store_wait(s, at, left);
        if (rc == PAWL_ESHUTDOWN)
            return rc;
        if (rc == PAWL_ETIMEDOUT) {
            rc = read_filtered_until(s, at, max, f, b, &pos, deadline);
            if (rc == 0)
                *position = PAWL_MAX(pos, at);
            if (rc != 0 || b->count > 0)
                return rc;
            return PAWL_ETIMEDOUT;
        }
    }
}

int pawl_read_stream(struct pawl_store *s, const char *stream_id, int64_t after_seq, size_t max,
                     struct pawl_read_batch *b)
{
    if (s == NULL || b == NULL)
        return PAWL_EINVAL;
    b->count = 0;
    size_t len = stream_id ? strlen(stream_id) : 0;
    if (len == 0 || len > PAWL_STREAM_ID_MAX) {
        pawl__log_set_err(s, NULL,
                          stream_id == NULL ? "read_stream: no stream id"
                          : len == 0        ? "read_stream: an empty stream id"
                                            : "read_stream: the stream id is over 255 bytes");
        return PAWL_EINVAL;
    }
    if (after_seq < 0 || max < 1 || max > 100000)
        return PAWL_ERANGE;
    struct read_q q = {.kind = READ_STREAM, .stream = stream_id};
    return read_loop(s, &q, after_seq, max, b, 0);
}
