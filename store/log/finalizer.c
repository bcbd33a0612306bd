/*
 * finalizer.c — the finalizer: the state machine that gives committed appends their final
 * indexes (struct fin_sm; its design paragraph is above fin_finish), the acks of this process's
 * commits (the ring, acked, covered) and the finalize delays measured from them. The state
 * machine lives on the finalizer pool's I/O thread (fin_loop, its completions and its
 * notification hooks): by default the log pool's, which hosts the finalizer's pool (a commit
 * seen there signals the state machine on the same thread, and the run goes out in the same
 * pass), or, with finalizer_own_thread, one of its own. Every field of s->fm is that thread's
 * alone; others reach it only
 * through the seq_cst signal words (fin_signal, fin_foreign, fin_waiting, fin_stop) and a pool
 * wake-up. fin_mu guards fin_done, on which pawl_store_free waits; cov_mu guards covered and
 * the delay histogram, which the state machine and the piggybacked runs' accounting both
 * update. The runs piggybacked on appends (struct fin_piggy) are built and accounted here:
 * append_op.c and group.c embed one per request and hand it to pawl__log_fin_piggy_stmt when
 * they build the request (the thread that submits it) and to pawl__log_fin_piggy_done when it
 * committed; they never read it. pawl__log_fin_piggy_done is called from the main pool's I/O
 * thread (append completions), pawl__log_fin_append_committed from there or from a direct
 * append's caller; pawl_finalize_now from any thread that may block.
 */
#include "log_internal.h"

#include "metrics.h"
#include "timers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One finalization run (sql/006_log_guarantees.sql), on the finalizer's pool and, piggybacked,
 * after the appends of a transaction on the main pool (store.c prepares it on both). */
const char pawl__log_finalize_sql[] =
    "SELECT appends, events, last_index FROM pawl.finalize($1::int4)";

static const char HOLDER_SQL[] =
    "SELECT format('pid %s (application \"%s\", user %s, transaction started %s, held %s)',"
    " h.pid, h.application_name, h.usename, h.xact_start, date_trunc('second', h.held_for))"
    " FROM pawl_api.finalizer_holder() h";

/* How long the finalizer's lock may stay busy before the holder is named in the log, and how
 * long pawl_store_free tries to finalize this process's appends. */
#define HOLDER_WARN_NS (5 * 1000000000LL)
#define STOP_DEADLINE_NS (5 * 1000000000LL)
/* While the finalizer's runs keep failing, how often it says so at warn level. */
#define FAIL_WARN_NS (10 * 1000000000LL)

static void on_fin_result(void *ud, const PGresult *res)
{
    struct fin_out *o = ud;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1) {
        o->appends = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        o->events = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
        o->last = strtoll(PQgetvalue(res, 0, 2), NULL, 10);
    }
}

/* The statement pawl.finalize(finalize_batch_max), prepared as `prepared` on its pool, whose row
 * goes to *out (reset to -2: no row yet). vals is the caller's one-element parameter array and
 * must live until the request completes. */
static struct pawl_pgstmt fin_stmt(struct pawl_store *s, int prepared, const char **vals,
                                   struct fin_out *out)
{
    vals[0] = s->fin_batch_text;
    out->appends = out->events = out->last = -2;
    return (struct pawl_pgstmt){
        .prepared = prepared, .nparams = 1, .values = vals, .on_result = on_fin_result, .ud = out};
}

static void signal_finalizer(struct pawl_store *s)
{
    /* seq_cst pair with fin_waiting (Dekker, see fin_loop): either we see the finalizer
     * waiting and wake its loop (the first signaller only), or it sees our signal before it
     * sleeps. A finalizer busy with a run or spacing runs needs no wake-up: it looks at the
     * signal when the run completes or the interval ends. */
    atomic_store(&s->fin_signal, 1);
    if (atomic_load(&s->fin_waiting) && atomic_exchange(&s->fin_waiting, 0))
        pawl__pgpool_wake(s->fin);
}

/* Another session asked for a run (pawl_pending, or a reconnect that may have missed one): as
 * signal_finalizer, with its own flag, so that the finalizer can space such runs out. */
static void signal_foreign(struct pawl_store *s)
{
    atomic_store(&s->fin_foreign, 1); /* seq_cst: the Dekker pair with fin_waiting */
    if (atomic_load(&s->fin_waiting) && atomic_exchange(&s->fin_waiting, 0))
        pawl__pgpool_wake(s->fin);
}

static void record_ack(struct pawl_store *s, int64_t now)
{
    /* relaxed: the sequence only needs to be unique; the slot publishes below. */
    long long seq = atomic_fetch_add_explicit(&s->acked, 1, memory_order_relaxed) + 1;
    struct ack_slot *sl = &s->ring[seq & (ACK_RING - 1)];
    atomic_store_explicit(&sl->t_ns, now, memory_order_relaxed);
    /* release: t_ns is written before a reader that sees this seq reads it. */
    atomic_store_explicit(&sl->seq, seq, memory_order_release);
}

/* An append of this process committed (the main pool's I/O thread, in its completion, or the
 * caller's thread after a direct append): count its ack for the finalize delays and signal the
 * finalizer (lock-free both, from any thread). */
void pawl__log_fin_append_committed(struct pawl_store *s, int64_t now)
{
    record_ack(s, now);
    signal_finalizer(s);
}

/* A run's result: its duration in the cadence's average and the histograms, the index it
 * reached raised. Any thread (pawl_finalize_now's caller or the finalizer's loop). */
static void fin_account(struct pawl_store *s, const struct fin_out *out, int64_t run_ns)
{
    if (out->appends > 0) {
        /* relaxed: a statistic for the cadence (see fin_interval_ns); one writer at a time in
         * practice, and a lost update only delays the average by a run. */
        long long avg = atomic_load_explicit(&s->run_avg_ns, memory_order_relaxed);
        atomic_store_explicit(&s->run_avg_ns, avg + (run_ns - avg) / 8, memory_order_relaxed);
    }
    pawl__log_hist_add(&s->run, run_ns / 1000);
    pawl_metric_hist_record(PAWL_H_FINALIZE_RUN, run_ns);
    if (out->last > 0) {
        pawl__log_index_raise(s, out->last);
        pawl_metric_gauge_max(PAWL_G_LAST_FINALIZED_INDEX, out->last);
    }
}

static int finalize_once(struct pawl_store *s, struct fin_out *out)
{
    const char *vals[1];
    struct pawl_pgstmt st = fin_stmt(s, s->fin_stmt, vals, out);
    struct pawl_pgreq req = {.stmts = &st, .nstmts = 1};
    int64_t t0 = pawl_now_ns();
    int rc = pawl__pgpool_exec(s->fin, 0, &req);
    if (rc != 0) {
        pawl__log_set_err(s, req.sqlstate, req.message);
        return rc;
    }
    if (out->appends == -2) {
        pawl__log_set_err(s, NULL, "pawl.finalize returned no row");
        return PAWL_ESQL;
    }
    fin_account(s, out, pawl_now_ns() - t0);
    return 0;
}

int pawl_finalize_now(struct pawl_store *s, int64_t *appends, int64_t *events, int64_t *last)
{
    PAWL_ASSERT(!pawl__pgpool_on_io_thread(NULL)); /* blocks: never on an I/O thread */
    struct fin_out o;
    int rc = finalize_once(s, &o);
    if (rc == 0) {
        if (appends)
            *appends = o.appends;
        if (events)
            *events = o.events;
        if (last)
            *last = o.last;
    }
    return rc;
}

/*
 * Acks (covered, upto] are final as of t_end: record their finalize delays and advance
 * covered. Called by the finalizer (on its pool's I/O thread) and, for piggybacked runs, the
 * main pool's I/O thread.
 */
static void record_delays(struct pawl_store *s, long long upto, int64_t t_end)
{
    /* A run covers acks counted before it was sent: never more than there are. */
    PAWL_ASSERT(upto <= atomic_load_explicit(&s->acked, memory_order_relaxed));
    pthread_mutex_lock(&s->cov_mu);
    /* relaxed: covered is written under cov_mu; other readers only want a recent value. */
    long long from = atomic_load_explicit(&s->covered, memory_order_relaxed);
    if (upto > from) {
        long long first = upto - from > ACK_RING ? upto - ACK_RING : from;
        for (long long q = first + 1; q <= upto; q++) {
            struct ack_slot *sl = &s->ring[q & (ACK_RING - 1)];
            /* acquire: pairs with the release in record_ack; t_ns belongs to seq q. */
            if (atomic_load_explicit(&sl->seq, memory_order_acquire) != q)
                continue;
            int64_t t = atomic_load_explicit(&sl->t_ns, memory_order_relaxed);
            pawl__log_hist_add(&s->delay, (t_end - t) / 1000);
            pawl_metric_hist_record(PAWL_H_FINALIZE_DELAY, t_end - t);
        }
        atomic_store_explicit(&s->covered, upto, memory_order_relaxed);
    }
    pthread_mutex_unlock(&s->cov_mu);
}

/*
 * The piggybacked run of a request of appends about to be sent (append_finalizes): writes its
 * statement to *st and returns 1, or returns 0 (nothing written) when appends do not finalize.
 * Resets fp either way, and records the acks the run will cover: those counted before the
 * request's snapshot. fp and its statement must stay put until the request completes.
 */
int pawl__log_fin_piggy_stmt(struct pawl_store *s, struct fin_piggy *fp, struct pawl_pgstmt *st)
{
    struct pawl_pgstmt fs = fin_stmt(s, s->stmt_fin_main, fp->_vals, &fp->_out); /* resets */
    /* relaxed: a lower bound; every ack counted here precedes the request's snapshot. */
    fp->_acked = atomic_load_explicit(&s->acked, memory_order_relaxed);
    if (!s->o.append_finalizes)
        return 0;
    *st = fs;
    return 1;
}

/* No piggybacked run (a group's append handed the group's failure): done is then a no-op. */
void pawl__log_fin_piggy_reset(struct fin_piggy *fp)
{
    fp->_out.appends = fp->_out.events = fp->_out.last = -2;
}

/*
 * The transaction that carried fp committed (the main pool's I/O thread, in its completion): when
 * its run returned a row (appends >= 0), the run's statistics, the index it reached, and the
 * finalize delays of the acks it covered (those counted before the request was sent).
 */
void pawl__log_fin_piggy_done(struct pawl_store *s, const struct fin_piggy *fp)
{
    const struct fin_out *fin = &fp->_out;
    if (fin->appends < 0)
        return;
    /* A row only comes back on the main pool, whose I/O thread completes its request. */
    PAWL_ASSERT(pawl__pgpool_on_io_thread(s->main));
    if (fin->appends > 0) {
        /* relaxed: statistics. */
        atomic_fetch_add_explicit(&s->fin_piggy, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->fin_appends, fin->appends, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->fin_events, fin->events, memory_order_relaxed);
    }
    if (fin->last > 0)
        pawl__log_index_raise(s, fin->last);
    record_delays(s, fp->_acked, pawl_now_ns());
}

/*
 * The interval between finalization run starts: finalizer_min_interval_us, stretched under load
 * to finalizer_latency_share_pct of the append latency average and to the recent runs' duration
 * times 100 / finalizer_busy_share_pct, up to finalizer_max_interval_us.
 */
static int64_t fin_interval_ns(struct pawl_store *s)
{
    int64_t iv = (int64_t)s->o.finalizer_min_interval_us * 1000;
    int64_t cap = (int64_t)s->o.finalizer_max_interval_us * 1000;
    /* relaxed: see lat_avg_ns and run_avg_ns. */
    int64_t lat = atomic_load_explicit(&s->lat_avg_ns, memory_order_relaxed);
    int64_t run = atomic_load_explicit(&s->run_avg_ns, memory_order_relaxed);
    int64_t want = iv;
    if (s->o.finalizer_latency_share_pct > 0)
        want = PAWL_MAX(want, lat / 100 * s->o.finalizer_latency_share_pct);
    if (s->o.finalizer_busy_share_pct > 0)
        want = PAWL_MAX(want, run / s->o.finalizer_busy_share_pct * 100);
    if (want > iv && cap > iv)
        iv = PAWL_MIN(want, cap);
    atomic_store_explicit(&s->fin_interval_ns, iv, memory_order_relaxed); /* statistic */
    return iv;
}

static void on_text_result(void *ud, const PGresult *res)
{
    char *out = ud; /* 256 bytes */
    /* The holder's application name is any login's text: escaped for the log line. */
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) >= 1 && !PQgetisnull(res, 0, 0))
        pawl_printable_str(PQgetvalue(res, 0, 0), out, 256);
}

/* The state machine's legal transitions (a bit per state it may come from): IDLE -> RUN ->
 * IDLE, IDLE -> NAMING -> DONE when stopping past the deadline, IDLE -> DONE when stopping with
 * everything covered (or when the holder query could not be sent). */
#define FBIT(st) (1u << (st))
static const unsigned fin_legal_from[] = {
    [FIN_IDLE] = FBIT(FIN_IDLE) | FBIT(FIN_RUN),
    [FIN_RUN] = FBIT(FIN_IDLE),
    [FIN_NAMING] = FBIT(FIN_IDLE),
    [FIN_DONE] = FBIT(FIN_IDLE) | FBIT(FIN_NAMING),
};

static void fin_set_state(struct pawl_store *s, enum fin_state st)
{
    PAWL_ASSERT(pawl__pgpool_on_io_thread(s->fin)); /* the finalizer pool's I/O thread only */
    PAWL_ASSERT(st < PAWL_ARRAY_LEN(fin_legal_from) && (fin_legal_from[st] & FBIT(s->fm.state)));
    s->fm.state = st;
}

/*
 * The finalizer: fin_loop runs on every pass of the finalizer pool's I/O loop. It sleeps until
 * an append of this process commits (fin_signal), a pawl_pending notification arrives
 * (fin_foreign: another process's append in its own transaction) or the safety interval
 * passes; then sends pawl.finalize, which finalizes everything completed at its snapshot (no
 * truncation). Signals that arrive during a run make the next run start at once (after the
 * cadence interval). When another session holds the lock it retries with a doubling back-off
 * (finalizer_retry_ms up to 8x), never faster, until a run of its own succeeds; after
 * HOLDER_WARN_NS of that it names the holder in the log, once per episode. On stop it keeps
 * going until every append of this process is covered, for at most STOP_DEADLINE_NS, then says
 * what is left and who holds the lock.
 */
static void fin_finish(struct pawl_store *s)
{
    fin_set_state(s, FIN_DONE);
    pthread_mutex_lock(&s->fin_mu);
    s->fin_done = 1;
    pthread_cond_broadcast(&s->fin_cond);
    pthread_mutex_unlock(&s->fin_mu);
}

static void fin_holder_done(struct pawl_pgreq *req, int rc)
{
    struct pawl_store *s = req->ud;
    struct fin_sm *m = &s->fm;
    /* The finalizer pool's I/O thread only; who stays "unknown" when the query failed (rc). */
    PAWL_ASSERT(pawl__pgpool_on_io_thread(s->fin));
    (void)rc;
    if (req == &m->warn.req) {
        PAWL_WARN("finalizer", "the finalizer's lock has been held elsewhere for %lld s: %s",
                  (long long)(m->warn.held_ns / 1000000000), m->warn.who);
        return;
    }
    PAWL_WARN("finalizer",
              "stopping with %lld append(s) of this process not yet finalized (another "
              "finalizer will order them); the finalizer's lock is held by %s",
              /* relaxed: statistics */
              atomic_load_explicit(&s->acked, memory_order_relaxed) -
                  atomic_load_explicit(&s->covered, memory_order_relaxed),
              m->last.who);
    fin_finish(s);
}

/* Ask who holds the finalizer's lock; fin_holder_done logs the answer. 0, or submit's error. */
static int fin_ask_holder(struct pawl_store *s, struct fin_holder *h, int64_t held_ns)
{
    snprintf(h->who, sizeof h->who, "unknown (no session holds it now, or it cannot be seen)");
    h->held_ns = held_ns;
    h->st = (struct pawl_pgstmt){.sql = HOLDER_SQL, .on_result = on_text_result, .ud = h->who};
    h->req = (struct pawl_pgreq){.stmts = &h->st,
                                 .nstmts = 1,
                                 .flags = PAWL_PGREQ_READONLY,
                                 .on_done = fin_holder_done,
                                 .ud = s};
    return pawl__pgpool_submit(s->fin, &h->req);
}

/* Run again, not before `ms` from now whatever arrives meanwhile, with the pawl_pending signal
 * the last run drained set again (seq_cst; a newer signal stays set). */
static void fin_retry_in(struct pawl_store *s, int ms, int64_t now)
{
    struct fin_sm *m = &s->fm;
    m->not_before = now + (int64_t)ms * 1000000;
    if (m->foreign)
        atomic_store(&s->fin_foreign, 1);
    m->rerun = 1;
}

/* A run failed (rc, with the reason): back off (10 ms doubling to 1 s), then run again. */
static void fin_run_failed(struct pawl_store *s, int rc, const char *sqlstate, const char *why,
                           int64_t now)
{
    struct fin_sm *m = &s->fm;
    atomic_fetch_add_explicit(&s->fin_errors, 1, memory_order_relaxed); /* statistic */
    pawl__log_set_err(s, sqlstate, why);
    /* One warning when an episode starts, then one every FAIL_WARN_NS while it lasts (the
     * back-off tops out at a retry a second: an outage would otherwise log a line a second). */
    if (m->failures++ == 0) {
        m->fail_since = m->fail_warned = now;
        PAWL_WARN("finalizer", "finalization failed (%s): %s; retrying in %d ms", pawl_strerror(rc),
                  why, m->err_backoff_ms);
    } else if (now - m->fail_warned >= FAIL_WARN_NS) {
        m->fail_warned = now;
        PAWL_WARN("finalizer",
                  "finalization still failing: %d attempts over %lld s, the last (%s): %s; "
                  "retrying in %d ms",
                  m->failures, (long long)((now - m->fail_since) / 1000000000), pawl_strerror(rc),
                  why, m->err_backoff_ms);
    } else {
        PAWL_DEBUG("finalizer", "finalization failed again (%s): %s; retrying in %d ms",
                   pawl_strerror(rc), why, m->err_backoff_ms);
    }
    fin_retry_in(s, m->err_backoff_ms, now);
    m->err_backoff_ms = PAWL_MIN(m->err_backoff_ms * 2, 1000);
}

static void fin_run_done(struct pawl_pgreq *req, int rc)
{
    struct pawl_store *s = req->ud;
    struct fin_sm *m = &s->fm;
    int64_t now = pawl_now_ns();
    PAWL_ASSERT(req == &m->req && m->state == FIN_RUN); /* the run fin_loop sent */
    fin_set_state(s, FIN_IDLE);
    m->next_safety = now + (int64_t)s->o.finalizer_safety_interval_ms * 1000000;
    if (rc == 0 && m->out.appends == -2) {
        rc = PAWL_ESQL;
        snprintf(req->message, sizeof req->message, "pawl.finalize returned no row");
    }
    if (rc != 0) {
        fin_run_failed(s, rc, req->sqlstate, req->message, now);
        return;
    }
    m->err_backoff_ms = 10;
    if (m->failures > 0) {
        PAWL_INFO("finalizer", "finalization works again, after %d failed attempt(s) over %.1f s",
                  m->failures, (double)(now - m->fail_since) / 1e9);
        m->failures = 0;
    }
    fin_account(s, &m->out, now - m->last_start);
    if (m->out.appends < 0) {
        /* Another session holds the lock; its run may have started before our rows
         * committed, so only a run of our own proves ours are final. Retry with back-off
         * (never faster than finalizer_retry_ms, up to 8x that), not woken by new signals:
         * they cannot make the lock free sooner. */
        atomic_fetch_add_explicit(&s->fin_busy, 1, memory_order_relaxed); /* statistic */
        pawl_metric_inc(PAWL_M_FINALIZE_LOCK_BUSY);
        if (m->busy_since == 0)
            m->busy_since = now;
        if (!m->holder_named && now - m->busy_since >= HOLDER_WARN_NS)
            m->holder_named = fin_ask_holder(s, &m->warn, now - m->busy_since) == 0;
        fin_retry_in(s, m->busy_ms, now);
        m->busy_ms = PAWL_MIN(m->busy_ms * 2, s->o.finalizer_retry_ms * 8);
        return;
    }
    m->busy_ms = s->o.finalizer_retry_ms;
    if (m->holder_named)
        PAWL_INFO("finalizer", "the finalizer's lock is free again");
    m->busy_since = 0;
    m->holder_named = 0;
    /* relaxed: statistics. */
    if (m->out.appends == 0) {
        atomic_fetch_add_explicit(&s->fin_idle, 1, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&s->fin_runs, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->fin_appends, m->out.appends, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->fin_events, m->out.events, memory_order_relaxed);
        pawl_metric_inc(PAWL_M_FINALIZE_RUNS);
        pawl_metric_add(PAWL_M_EVENTS_FINALIZED, (uint64_t)m->out.events);
    }
    record_delays(s, m->acked, now);
    if (atomic_load(&s->fin_stop))
        m->rerun = 1; /* fin_loop ends it once everything is covered */
}

#define FOREIGN_MIN_INTERVAL_NS 2000000

/* The pool's on_loop hook: decide, send, or say when to look again (0: when woken). */
static int64_t fin_loop(void *ud, int64_t now)
{
    struct pawl_store *s = ud;
    struct fin_sm *m = &s->fm;
    /* acquire: pairs with the release in pawl__log_fin_start (the statements, options). */
    if (!atomic_load_explicit(&s->fin_on, memory_order_acquire) || m->state != FIN_IDLE)
        return 0; /* a run or a query in flight: its completion comes with a pass */
    PAWL_ASSERT(pawl__pgpool_on_io_thread(s->fin)); /* the finalizer pool's I/O thread only */
    for (;;) {
        int stopping = atomic_load(&s->fin_stop);
        if (stopping && m->stop_deadline == 0)
            m->stop_deadline = now + STOP_DEADLINE_NS;
        if (now < m->not_before)
            return m->not_before; /* back-off: whatever arrives meanwhile */
        if (!m->rerun && !stopping && now < m->next_safety) {
            /* seq_cst pair with signal_finalizer and signal_foreign (Dekker): set waiting, then
             * look for a signal; a signaller that came after the look sees waiting and wakes
             * the loop. */
            if (!atomic_load(&s->fin_signal) && !atomic_load(&s->fin_foreign)) {
                atomic_store(&s->fin_waiting, 1);
                if (!atomic_load(&s->fin_signal) && !atomic_load(&s->fin_foreign))
                    return m->next_safety;
            }
        }
        /* Not asleep any more (a signal, the safety interval or a rerun): signallers need not
         * wake the loop until the next wait. relaxed load: only this thread sets it to 1. */
        if (atomic_load_explicit(&s->fin_waiting, memory_order_relaxed))
            atomic_store(&s->fin_waiting, 0);
        /* Cadence: one run per interval at most, so that under load one run (one commit, one
         * WAL flush) covers many appends (see fin_interval_ns). Signals meanwhile wake nobody. */
        int64_t interval_ns = stopping ? 0 : fin_interval_ns(s);
        if (interval_ns > 0 && now < m->last_start + interval_ns)
            return m->last_start + interval_ns;
        /* A run that only other sessions asked for (pawl_pending, which any login may send)
         * starts at most once per FOREIGN_MIN_INTERVAL_NS, so a flood of notifications costs a
         * process at most 500 runs a second, and an outbox append waits at most 2 ms more.
         * Waiting, signals of this process's own appends still wake the loop (Dekker as above:
         * set waiting, then look). */
        if (!stopping && !m->rerun && now < m->next_safety && now < m->foreign_next &&
            !atomic_load(&s->fin_signal)) {
            atomic_store(&s->fin_waiting, 1);
            if (!atomic_load(&s->fin_signal))
                return m->foreign_next;
            atomic_store(&s->fin_waiting, 0);
        }
        /* Drain every signal: one run covers all appends acknowledged before it starts. */
        atomic_exchange(&s->fin_signal, 0);
        int foreign = atomic_exchange(&s->fin_foreign, 0);
        /* relaxed: acks counted before the request is sent; the request's snapshot is later. */
        long long acked = atomic_load_explicit(&s->acked, memory_order_relaxed);
        int all_covered = acked <= atomic_load_explicit(&s->covered, memory_order_relaxed);
        if (foreign)
            m->foreign_next = now + FOREIGN_MIN_INTERVAL_NS;
        if (stopping && all_covered) {
            fin_finish(s);
            return 0;
        }
        if (stopping && now >= m->stop_deadline) {
            if (fin_ask_holder(s, &m->last, 0) == 0)
                fin_set_state(s, FIN_NAMING);
            else
                fin_holder_done(&m->last.req, PAWL_ESHUTDOWN);
            return 0;
        }
        if (!stopping && all_covered && !foreign && now < m->next_safety) {
            /* Later appends' piggybacked runs finalized ours already: no run needed. */
            atomic_fetch_add_explicit(&s->fin_skipped, 1, memory_order_relaxed); /* stat */
            m->rerun = 0;
            continue;
        }
        m->rerun = 0;
        m->foreign = foreign;
        m->acked = acked;
        m->last_start = now;
        m->st = fin_stmt(s, s->fin_stmt, m->vals, &m->out);
        m->req =
            (struct pawl_pgreq){.stmts = &m->st, .nstmts = 1, .on_done = fin_run_done, .ud = s};
        int rc = pawl__pgpool_submit_on(s->fin, 0, &m->req);
        if (rc == 0) {
            fin_set_state(s, FIN_RUN);
            return 0;
        }
        fin_run_failed(s, rc, NULL, "the finalizer's pool refused the run", now);
    }
}

/* A pawl_pending notification (or a re-established connection) on the finalizer's connection:
 * some process committed appends that no finalizer was told about. */
static void on_fin_notify(void *ud, const char *channel, const char *payload, int sender_pid)
{
    struct pawl_store *s = ud;
    (void)payload;
    (void)sender_pid;
    PAWL_ASSERT(pawl__pgpool_on_io_thread(s->fin)); /* the finalizer pool's I/O thread only */
    if (strcmp(channel, "pawl_pending") != 0)
        return;
    signal_foreign(s);
}

static void on_fin_connect(void *ud, int conn_index, int backend_pid)
{
    struct pawl_store *s = ud;
    (void)conn_index;
    PAWL_ASSERT(pawl__pgpool_on_io_thread(s->fin)); /* the finalizer pool's I/O thread only */
    /* relaxed: on_notify compares against it on another I/O thread; a stale value only costs
     * one needless query. */
    atomic_store_explicit(&s->fin_pid, backend_pid, memory_order_relaxed);
    /* Notifications sent while the connection was down are lost: look once. */
    signal_foreign(s);
}

/* The finalizer pool's hooks (pawl_store_new, before the pool starts): its loop only when this
 * store finalizes. */
void pawl__log_fin_hooks(struct pawl_store *s, struct pawl_pgpool_opts *po)
{
    po->on_notify = on_fin_notify;
    po->on_connect = on_fin_connect;
    po->on_loop = s->o.finalizer ? fin_loop : NULL;
    po->hook_ud = s;
}

/* Turn the state machine on (pawl_store_new, once the store is built and its pools run). */
void pawl__log_fin_start(struct pawl_store *s)
{
    struct fin_sm *m = &s->fm;
    PAWL_ASSERT(m->state == FIN_IDLE && !s->fin_started); /* once, before the loop may act */
    m->rerun = 1; /* a first run at once: appends committed while no finalizer ran */
    m->next_safety = pawl_now_ns() + (int64_t)s->o.finalizer_safety_interval_ms * 1000000;
    m->err_backoff_ms = 10;
    m->busy_ms = s->o.finalizer_retry_ms;
    s->fin_started = 1;
    /* release: the loop's thread sees the state machine and the statements whole. */
    atomic_store_explicit(&s->fin_on, 1, memory_order_release);
    pawl__pgpool_wake(s->fin);
}

/*
 * Stop the state machine (pawl_store_free, once every append has completed): it finalizes what
 * this process appended, for a bounded time, and ends by itself; wait for that (fin_mu).
 */
void pawl__log_fin_stop(struct pawl_store *s)
{
    if (!s->fin_started)
        return;
    atomic_store(&s->fin_stop, 1); /* seq_cst: read by fin_loop after the wake-up */
    pawl__pgpool_wake(s->fin);
    /* The state machine ends by itself within STOP_DEADLINE_NS plus one holder query (which
     * waits for a connection at most queue_timeout_ms); past that its loop is gone or the
     * server hangs, and the pool's shutdown fails what is in flight. */
    int64_t bound = STOP_DEADLINE_NS + (int64_t)s->o.queue_timeout_ms * 1000000 +
                    (int64_t)s->o.connect_timeout_ms * 1000000 + 5000000000LL;
    int64_t until = pawl_now_ns() + bound, left;
    pthread_mutex_lock(&s->fin_mu);
    while (!s->fin_done && (left = until - pawl_now_ns()) > 0)
        pawl__timed_wait(s->timers, &s->fin_mu, &s->fin_cond, CLOCK_MONOTONIC, left);
    int done = s->fin_done;
    pthread_mutex_unlock(&s->fin_mu);
    if (!done)
        PAWL_WARN("finalizer", "the finalizer did not stop within %lld s; closing anyway",
                  (long long)(bound / 1000000000));
}
