/*
 * index.c — the highest known final index (last_index) and those who wait for it to grow, and
 * the listener that learns of other processes' runs. last_index is written under idx_mu only
 * (raised by anyone who learns a higher index: the finalizer, the listener, a reader, the
 * standby's poller; lowered only by a reader that finds it ahead of the log), and read relaxed
 * by anyone; idx_mu also guards `shutdown` and `waiters`, and idx_cond wakes followers
 * (pawl_store_wait) and sleeping readers (pawl__log_index_sleep). Those two block and run on
 * callers' threads, never on an I/O thread; raising and lowering may run on any thread. The
 * listener's hooks and completions run on the listener pool's I/O thread alone.
 */
#include "log_internal.h"

#include "timers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The log's highest final index (also prepared on the main pool, for readers: store.c). */
const char pawl__log_last_index_sql[] = "SELECT pawl_api.last_index()";

/* Raise the known highest index and wake followers (any thread). */
void pawl__log_index_raise(struct pawl_store *s, int64_t idx)
{
    /* relaxed: the mutex below orders the update with the waiters' checks. */
    long long cur = atomic_load_explicit(&s->last_index, memory_order_relaxed);
    if (idx <= cur)
        return;
    pthread_mutex_lock(&s->idx_mu);
    cur = atomic_load_explicit(&s->last_index, memory_order_relaxed);
    if (idx > cur) {
        PAWL_ASSERT(pawl_mutex_locked(&s->idx_mu)); /* last_index is written under idx_mu */
        atomic_store_explicit(&s->last_index, idx, memory_order_relaxed);
        pthread_cond_broadcast(&s->idx_cond);
    }
    pthread_mutex_unlock(&s->idx_mu);
}

int64_t pawl_store_last_index(struct pawl_store *s)
{
    /* relaxed: a snapshot value; pawl_store_wait gives the ordering guarantees. */
    return atomic_load_explicit(&s->last_index, memory_order_relaxed);
}

int pawl_store_wait(struct pawl_store *s, int64_t after, int timeout_ms)
{
    int64_t deadline = timeout_ms >= 0 ? pawl_now_ns() + (int64_t)timeout_ms * 1000000 : 0;
    int rc = 0;
    PAWL_ASSERT(!pawl__pgpool_on_io_thread(NULL)); /* blocks: never on an I/O thread */
    pthread_mutex_lock(&s->idx_mu);
    s->waiters++;
    while (atomic_load_explicit(&s->last_index, memory_order_relaxed) <= after) {
        if (s->shutdown) {
            rc = PAWL_ESHUTDOWN;
            break;
        }
        if (timeout_ms < 0) {
            pthread_cond_wait(&s->idx_cond, &s->idx_mu);
            continue;
        }
        int64_t left = deadline - pawl_now_ns();
        if (left <= 0) {
            rc = PAWL_ETIMEDOUT;
            break;
        }
        pawl__timed_wait(s->timers, &s->idx_mu, &s->idx_cond, CLOCK_MONOTONIC, left);
    }
    PAWL_ASSERT(s->waiters > 0);
    if (--s->waiters == 0 && s->shutdown)
        pthread_cond_broadcast(&s->waiters_cond);
    pthread_mutex_unlock(&s->idx_mu);
    return rc;
}

/*
 * Sleep up to ns as a waiter on idx_cond (so that pawl_store_free wakes us and waits for us).
 * Returns PAWL_ESHUTDOWN when the store is being freed, else 0.
 */
int pawl__log_index_sleep(struct pawl_store *s, int64_t ns)
{
    int64_t until = pawl_now_ns() + ns;
    int rc = 0;
    PAWL_ASSERT(!pawl__pgpool_on_io_thread(NULL)); /* blocks: never on an I/O thread */
    pthread_mutex_lock(&s->idx_mu);
    s->waiters++;
    for (;;) {
        if (s->shutdown) {
            rc = PAWL_ESHUTDOWN;
            break;
        }
        int64_t left = until - pawl_now_ns();
        if (left <= 0)
            break;
        pawl__timed_wait(s->timers, &s->idx_mu, &s->idx_cond, CLOCK_MONOTONIC, left);
    }
    PAWL_ASSERT(s->waiters > 0);
    if (--s->waiters == 0 && s->shutdown)
        pthread_cond_broadcast(&s->waiters_cond);
    pthread_mutex_unlock(&s->idx_mu);
    return rc;
}

/*
 * A reader found the known index ahead of the log (reader.c, read_gap): bring it down to the
 * log's word `told`, only if nothing raised it since the reader saw `seen`. 1 when lowered.
 */
int pawl__log_index_lower(struct pawl_store *s, long long seen, int64_t told)
{
    pthread_mutex_lock(&s->idx_mu);
    int lowered = atomic_load_explicit(&s->last_index, memory_order_relaxed) == seen;
    if (lowered)
        atomic_store_explicit(&s->last_index, told, memory_order_relaxed);
    pthread_mutex_unlock(&s->idx_mu);
    return lowered;
}

/* Shutdown (pawl_store_free): wake every waiter with PAWL_ESHUTDOWN and wait until none is
 * left inside pawl_store_wait or pawl__log_index_sleep. */
void pawl__log_index_shutdown(struct pawl_store *s)
{
    pthread_mutex_lock(&s->idx_mu);
    PAWL_ASSERT(!s->shutdown); /* once, from pawl_store_free */
    s->shutdown = 1;
    pthread_cond_broadcast(&s->idx_cond);
    while (s->waiters > 0)
        pthread_cond_wait(&s->waiters_cond, &s->idx_mu);
    pthread_mutex_unlock(&s->idx_mu);
}

/* ---- the listener -------------------------------------------------------------------------- */

/*
 * Ask the log for its highest index on the listener's connection: after each (re)connect (the
 * notifications missed meanwhile) and on each notification. A notification is only a wake-up:
 * its payload is never read, since any login may NOTIFY the channel with any text. Wake-ups only
 * set listen_again; the pool's loop hook (listen_loop) sends the query when none is in flight
 * and at least LISTEN_MIN_INTERVAL_NS after the previous one started, so a flood of
 * notifications from any login costs each process at most one query per interval (1,000 a
 * second), and a wake-up waits at most that long behind the previous query. Every caller runs
 * on the listener pool's I/O thread (notify, connect, completion and loop hooks).
 */
#define LISTEN_MIN_INTERVAL_NS 1000000

static void on_last_result(void *ud, const PGresult *res);
static void listen_req_done(struct pawl_pgreq *req, int rc);

static void listen_query(struct pawl_store *s)
{
    PAWL_ASSERT(pawl__pgpool_on_io_thread(s->listen)); /* the listener's I/O thread only */
    /* relaxed: every access is on the listener pool's I/O thread; the atomics only keep
     * pawl_store_stats and the sanitizers happy. The loop hook runs after this pass's hooks. */
    atomic_store_explicit(&s->listen_again, 1, memory_order_relaxed);
}

/* The listener pool's on_loop hook: send the query that wake-ups asked for, when it may go. */
static int64_t listen_loop(void *ud, int64_t now)
{
    struct pawl_store *s = ud;
    PAWL_ASSERT(pawl__pgpool_on_io_thread(s->listen)); /* the listener's I/O thread only */
    if (!atomic_load_explicit(&s->listen_again, memory_order_relaxed))
        return 0;
    if (atomic_load_explicit(&s->listen_req_busy, memory_order_relaxed))
        return 0; /* listen_req_done's pass calls this hook again */
    if (now < s->listen_next_ns)
        return s->listen_next_ns;
    atomic_store_explicit(&s->listen_req_busy, 1, memory_order_relaxed);
    atomic_store_explicit(&s->listen_again, 0, memory_order_relaxed);
    s->listen_next_ns = now + LISTEN_MIN_INTERVAL_NS;
    s->listen_stmt =
        (struct pawl_pgstmt){.sql = pawl__log_last_index_sql, .on_result = on_last_result, .ud = s};
    memset(&s->listen_req, 0, sizeof s->listen_req);
    s->listen_req.stmts = &s->listen_stmt;
    s->listen_req.nstmts = 1;
    s->listen_req.flags = PAWL_PGREQ_READONLY;
    s->listen_req.on_done = listen_req_done;
    s->listen_req.ud = s;
    atomic_fetch_add_explicit(&s->index_queries, 1, memory_order_relaxed);
    /* Not pinned: while the connection is down the query waits for the next one, which runs
     * LISTEN first, so nothing committed before the query is missed. */
    if (pawl__pgpool_submit(s->listen, &s->listen_req) != 0) {
        atomic_store_explicit(&s->listen_req_busy, 0, memory_order_release);
        return 0;
    }
    return 0;
}

/*
 * A run of this store's own finalizer needs no query: the finalizer raises the known index from
 * the run's result (and, if that result is lost with its connection, from the run that follows
 * the reconnect). The sender's process id comes from the server, so no other login can pass for
 * it; one of another session (another process's finalizer, or anyone's NOTIFY) asks the log.
 */
static void on_notify(void *ud, const char *channel, const char *payload, int sender_pid)
{
    struct pawl_store *s = ud;
    (void)payload; /* untrusted: a wake-up only */
    if (strcmp(channel, "pawl_log") != 0)
        return;
    atomic_fetch_add_explicit(&s->notifies, 1, memory_order_relaxed); /* relaxed: a statistic */
    if (sender_pid != 0 && sender_pid == atomic_load_explicit(&s->fin_pid, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&s->notifies_own, 1, memory_order_relaxed); /* statistic */
        return;
    }
    listen_query(s);
}

static void on_last_result(void *ud, const PGresult *res)
{
    struct pawl_store *s = ud;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
        pawl__log_index_raise(s, strtoll(PQgetvalue(res, 0, 0), NULL, 10));
}

static void listen_req_done(struct pawl_pgreq *req, int rc)
{
    struct pawl_store *s = req->ud;
    PAWL_ASSERT(pawl__pgpool_on_io_thread(s->listen)); /* the listener's I/O thread only */
    PAWL_ASSERT(req == &s->listen_req && atomic_load(&s->listen_req_busy));
    /* A wake-up that came meanwhile is sent by the loop hook after this pass; on a shutdown
     * (PAWL_ESHUTDOWN) nothing more is asked. */
    if (rc == PAWL_ESHUTDOWN)
        atomic_store_explicit(&s->listen_again, 0, memory_order_relaxed);
    /* release: the request struct may be reused after this store. */
    atomic_store_explicit(&s->listen_req_busy, 0, memory_order_release);
}

/* After (re)connecting, catch up with notifications missed while disconnected. */
static void on_listen_connect(void *ud, int conn_index, int backend_pid)
{
    (void)conn_index;
    (void)backend_pid;
    listen_query(ud);
}

/*
 * The highest index the log has now, learned once on the main pool when the store opens
 * (pawl_store_new, which waits for the answer; nobody waits on the index yet). 0, or the
 * failure with the server's text in err.
 */
int pawl__log_index_load(struct pawl_store *s, char *err, size_t errlen)
{
    struct pawl_pgstmt st = {.prepared = s->stmt_last, .on_result = on_last_result, .ud = s};
    struct pawl_pgreq req = {.stmts = &st, .nstmts = 1, .flags = PAWL_PGREQ_READONLY};
    int rc = pawl__pgpool_exec(s->main, -1, &req);
    if (rc != 0) {
        if (err && errlen)
            snprintf(err, errlen, "%s%s%s", req.sqlstate, req.sqlstate[0] ? ": " : "", req.message);
    }
    return rc;
}

/* The listener pool's hooks (pawl_store_new, before the pool starts). */
void pawl__log_listen_hooks(struct pawl_store *s, struct pawl_pgpool_opts *po)
{
    po->on_notify = on_notify;
    po->on_connect = on_listen_connect;
    po->on_loop = listen_loop;
    po->hook_ud = s;
}
