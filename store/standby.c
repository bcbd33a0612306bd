/*
 * standby.c — reading events from a streaming standby (see standby.h for the contract and
 * docs/design.md, "Reading from standbys", for why the guarantees hold).
 *
 * A reader's read consults it twice: pawl__standby_plan before (which pool, and the check to send
 * with the read) and pawl__standby_settle after (what the read found, and so whether the reader
 * uses it, reads again from the primary, or waits).
 *
 * State. One episode at a time per store: it opens when a read finds the standby behind the
 * announced index, unreachable or not in recovery, and closes when a read on the standby gives
 * events again (or nothing while nothing more is announced). Each opening and closing is logged
 * once. During an episode, with read_fallback = primary, reads go to the primary (once the
 * standby has been behind for read_max_lag_ms, or at once when it is unreachable or not a
 * standby), and a read every PROBE_NS tries the standby again; with read_fallback = wait,
 * readers back off (1 ms doubling to read_poll_max_ms) and read the standby again, or, when it
 * is unreachable, go through the store's outage path (retried until read_retry_timeout_ms).
 * Every field shared between readers is an atomic; the episode's fields are hints whose races
 * (two readers opening it at once) cost at most a duplicated log line, never a wrong read: where
 * a read goes never affects what it returns, only whether it is used.
 *
 * The poller (read_wake = poll) runs on its own thread: it asks the standby for its highest
 * index, 1 ms after a rise, doubling while nothing new comes up to read_poll_max_ms, and raises
 * the store's known index (only while the server is in recovery). Its request is asynchronous,
 * so that stopping never waits for an unreachable standby; the pool completes a request still
 * queued at free, before the object is released.
 */
#include "standby.h"

#include "common.h"
#include "dsn.h"
#include "pawl/log.h"
#include "timers.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define POLL_STALL_NS ((int64_t)1000000000) /* a poll unanswered this long: an outage */
#define PROBE_NS ((int64_t)1000000000)      /* during a fallback, try the standby this often */
#define MIN_BACKOFF_NS ((int64_t)1000000)
#define START_WAIT_MS 2000 /* how long opening waits to say it is reachable */

/* Whether the server is still a standby, and its replay delay (0: it has replayed everything
 * it received). Runs after the read in the same request, so "in recovery" covers the read. */
#define CHECK_COLS                                                                                 \
    "pg_is_in_recovery(),"                                                                         \
    " CASE WHEN NOT pg_is_in_recovery() THEN NULL"                                                 \
    " WHEN pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn() THEN 0"         \
    " ELSE extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp()) * 1000 END"
static const char CHECK_SQL[] = "SELECT " CHECK_COLS;
static const char POLL_SQL[] = "SELECT " CHECK_COLS ", pawl_api.last_index()";

struct pawl_standby {
    struct pawl_pgpool *pool;
    int stmt_check, stmt_poll;
    int policy, max_lag_ms, wake, poll_max_ms;
    char where[256]; /* the read DSN, redacted, for log lines */
    void (*raise)(void *ud, int64_t index);
    void *raise_ud;

    /* The episode (see above). */
    atomic_llong since;      /* pawl_now_ns() when it opened; 0: none */
    atomic_int kind;         /* its latest enum pawl_sb_outcome */
    atomic_int logged;       /* its opening was logged */
    atomic_int fallback;     /* reads go to the primary */
    atomic_llong next_probe; /* during a fallback: when a read tries the standby again */
    atomic_llong backoff_ns; /* the next wait of PAWL_SB_WAIT */

    /* Statistics. */
    atomic_llong reads, fb_reads, episodes;
    atomic_llong delay_us; /* replay delay at the last check, µs; -1 unknown */

    /* The poller. */
    struct pawl_timers *timers; /* the store's: the poller's timed waits */
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int stop;       /* under mu */
    int busy;       /* under mu: poll_req is with the pool */
    int64_t polled; /* under mu: the index of the last completed poll, -1 none */
    int poll_ok;    /* under mu */
    struct pawl_pgreq poll_req;
    struct pawl_pgstmt poll_stmt;
};

/* What the check after a read (or the poll) says: whether the server is still in recovery and
 * its replay delay. */
struct pawl_sb_check {
    int ok;          /* the check's row arrived */
    int in_recovery; /* 1: still a standby */
    double delay_ms; /* replay delay, 0 when everything received is replayed; -1 unknown */
};

static void note_check(struct pawl_standby *sb, const PGresult *res, struct pawl_sb_check *c)
{
    c->ok = 0;
    c->in_recovery = 0;
    c->delay_ms = -1;
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
        return;
    c->ok = 1;
    c->in_recovery = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
    if (!PQgetisnull(res, 0, 1))
        c->delay_ms = strtod(PQgetvalue(res, 0, 1), NULL);
    /* relaxed: a statistic. */
    atomic_store_explicit(&sb->delay_us, c->delay_ms < 0 ? -1 : (long long)(c->delay_ms * 1000),
                          memory_order_relaxed);
}

/* The check sent after a read on the standby: the read's rows are trusted only when it says the
 * server is still in recovery (so it was while the read ran: promotion is one-way). */
static void on_check(void *ud, const PGresult *res)
{
    struct pawl_sb_plan *plan = ud;
    PAWL_ASSERT(pawl__pgpool_on_io_thread(plan->_sb->pool)); /* the standby pool's completion */
    struct pawl_sb_check c;
    note_check(plan->_sb, res, &c);
    plan->trusted = c.ok && c.in_recovery;
}

struct pawl_pgpool *pawl__standby_pool(struct pawl_standby *sb)
{
    return sb->pool;
}

/* Whether the next read goes to the standby: always, but during a fallback only the one read
 * per PROBE_NS that probes it (when it has a connection). */
static int to_standby(struct pawl_standby *sb)
{
    /* relaxed throughout: hints (see the file comment). */
    if (!atomic_load_explicit(&sb->fallback, memory_order_relaxed))
        return 1;
    int64_t now = pawl_now_ns();
    long long due = atomic_load_explicit(&sb->next_probe, memory_order_relaxed);
    return now >= due && pawl__pgpool_ready(sb->pool) > 0 &&
           atomic_compare_exchange_strong_explicit(&sb->next_probe, &due, now + PROBE_NS,
                                                   memory_order_relaxed, memory_order_relaxed);
}

int pawl__standby_plan(struct pawl_standby *sb, struct pawl_sb_plan *plan, char *why, size_t whylen)
{
    PAWL_ASSERT(!plan->_open);                         /* the last read planned was settled */
    PAWL_ASSERT(plan->_sb == NULL || plan->_sb == sb); /* a plan serves one store */
    plan->pool = NULL;
    memset(&plan->check, 0, sizeof plan->check);
    plan->trusted = 1;
    plan->_sb = sb;
    plan->_open = 1;
    if (sb == NULL || plan->_primary || !to_standby(sb))
        return 0;
    plan->pool = sb->pool;
    plan->trusted = 0;
    plan->check.prepared = sb->stmt_check;
    plan->check.on_result = on_check;
    plan->check.ud = plan;
    if (pawl__pgpool_ready(sb->pool) == 0) {
        char e[256];
        pawl__pgpool_last_error(sb->pool, e, sizeof e);
        snprintf(why, whylen, "no connection to the standby: %s", e);
        return PAWL_ECONN;
    }
    return 0;
}

static const char *kind_text(int kind)
{
    switch (kind) {
    case PAWL_SB_BEHIND:
        return "is behind the index the primary announced";
    case PAWL_SB_LOST:
        return "is unreachable";
    case PAWL_SB_NOT_STANDBY:
        return "is not in recovery (promoted, or not a standby): its reads are not used";
    default:
        return "is readable";
    }
}

static int64_t next_backoff(struct pawl_standby *sb)
{
    /* relaxed: a back-off hint shared by readers. */
    long long w = atomic_load_explicit(&sb->backoff_ns, memory_order_relaxed);
    if (w < MIN_BACKOFF_NS)
        w = MIN_BACKOFF_NS;
    int64_t cap = (int64_t)sb->poll_max_ms * 1000000;
    atomic_store_explicit(&sb->backoff_ns, PAWL_MIN(w * 2, cap), memory_order_relaxed);
    return PAWL_MIN((int64_t)w, cap);
}

/* "replay delay 12.5 ms" or "replay delay unknown", for log lines. */
static void delay_text(struct pawl_standby *sb, char *out, size_t len)
{
    long long d = atomic_load_explicit(&sb->delay_us, memory_order_relaxed); /* a statistic */
    if (d < 0)
        snprintf(out, len, "replay delay unknown");
    else
        snprintf(out, len, "replay delay %.1f ms", (double)d / 1000.0);
}

static void start_fallback(struct pawl_standby *sb, int what, int64_t after, int64_t known,
                           double lag_s)
{
    /* relaxed: hints; the exchange makes one reader log the switch. */
    atomic_store_explicit(&sb->next_probe, pawl_now_ns() + PROBE_NS, memory_order_relaxed);
    if (atomic_exchange_explicit(&sb->fallback, 1, memory_order_relaxed))
        return;
    atomic_store_explicit(&sb->logged, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&sb->episodes, 1, memory_order_relaxed);
    char delay[48];
    delay_text(sb, delay, sizeof delay);
    PAWL_WARN("log",
              "read: the standby (%s) %s (for %.1f s; reading after %lld, %lld announced; "
              "%s): reading from the primary until it is readable again (read-fallback primary)",
              sb->where, kind_text(what), lag_s, (long long)after, (long long)known, delay);
}

/*
 * What a read on the standby found decides the episode and the reader's next step (see
 * pawl__standby_settle); the poller reports an outage it notices through here too.
 */
static enum pawl_sb_action decide(struct pawl_standby *sb, enum pawl_sb_outcome what, int64_t after,
                                  int64_t known, int64_t *wait_ns)
{
    PAWL_ASSERT(what != PAWL_SB_FAILED); /* not the standby's: settled without an episode */
    /* relaxed throughout: hints and statistics (see the file comment). */
    *wait_ns = 0;
    int64_t now = pawl_now_ns();
    if (what == PAWL_SB_GOT) {
        atomic_fetch_add_explicit(&sb->reads, 1, memory_order_relaxed);
        if (atomic_load_explicit(&sb->since, memory_order_relaxed) == 0)
            return PAWL_SB_USE;
        long long since = atomic_exchange_explicit(&sb->since, 0, memory_order_relaxed);
        int was_fb = atomic_exchange_explicit(&sb->fallback, 0, memory_order_relaxed);
        atomic_store_explicit(&sb->backoff_ns, 0, memory_order_relaxed);
        if (since != 0 && atomic_exchange_explicit(&sb->logged, 0, memory_order_relaxed))
            PAWL_INFO("log", "read: the standby (%s) is readable again after %.1f s: %s", sb->where,
                      (double)(now - since) / 1e9,
                      was_fb ? "reading from it again (the fallback to the primary ends)"
                             : "reading from it");
        return PAWL_SB_USE;
    }
    long long zero = 0;
    atomic_compare_exchange_strong_explicit(&sb->since, &zero, now, memory_order_relaxed,
                                            memory_order_relaxed);
    atomic_store_explicit(&sb->kind, (int)what, memory_order_relaxed);
    long long since = atomic_load_explicit(&sb->since, memory_order_relaxed);
    double lag_s = since ? (double)(now - since) / 1e9 : 0;
    if (atomic_load_explicit(&sb->fallback, memory_order_relaxed)) {
        atomic_store_explicit(&sb->next_probe, now + PROBE_NS, memory_order_relaxed);
        return PAWL_SB_AGAIN;
    }
    int late = since != 0 && now - since >= (int64_t)sb->max_lag_ms * 1000000;
    if (sb->policy == PAWL_READ_FALLBACK_PRIMARY) {
        if (what != PAWL_SB_BEHIND || late) {
            start_fallback(sb, what, after, known, lag_s);
            return PAWL_SB_AGAIN;
        }
        *wait_ns = next_backoff(sb);
        return PAWL_SB_WAIT;
    }
    /* read-fallback wait */
    if ((what != PAWL_SB_BEHIND || late) &&
        !atomic_exchange_explicit(&sb->logged, 1, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&sb->episodes, 1, memory_order_relaxed);
        char delay[48];
        delay_text(sb, delay, sizeof delay);
        PAWL_WARN("log",
                  "read: the standby (%s) %s (for %.1f s; reading after %lld, %lld announced; "
                  "%s): waiting for it (read-fallback wait)",
                  sb->where, kind_text(what), lag_s, (long long)after, (long long)known, delay);
    }
    if (what == PAWL_SB_LOST)
        return PAWL_SB_USE; /* the store's outage path reads again until read_retry_timeout_ms */
    *wait_ns = next_backoff(sb);
    return PAWL_SB_WAIT;
}

enum pawl_sb_action pawl__standby_settle(struct pawl_standby *sb, struct pawl_sb_plan *plan,
                                         enum pawl_sb_outcome what, int64_t after, int64_t known,
                                         int64_t *wait_ns)
{
    PAWL_ASSERT(plan->_open && plan->_sb == sb); /* the read this plan planned, settled once */
    plan->_open = 0;
    *wait_ns = 0;
    if (sb == NULL)
        return PAWL_SB_USE;
    if (plan->pool == NULL) {
        /* A read on the primary in the standby's stead. relaxed: a statistic. */
        atomic_fetch_add_explicit(&sb->fb_reads, 1, memory_order_relaxed);
        return PAWL_SB_USE;
    }
    PAWL_ASSERT(what != PAWL_SB_NOT_STANDBY || !plan->trusted); /* only an untrusted read */
    if (what == PAWL_SB_FAILED)
        return PAWL_SB_USE;
    enum pawl_sb_action next = decide(sb, what, after, known, wait_ns);
    if (next == PAWL_SB_AGAIN)
        plan->_primary = 1;
    return next;
}

void pawl__standby_stats(struct pawl_standby *sb, int64_t *reads, int64_t *fallback_reads,
                         int64_t *episodes, int *fallback_active, double *replay_delay_ms)
{
    /* relaxed: statistics. */
    *reads = atomic_load_explicit(&sb->reads, memory_order_relaxed);
    *fallback_reads = atomic_load_explicit(&sb->fb_reads, memory_order_relaxed);
    *episodes = atomic_load_explicit(&sb->episodes, memory_order_relaxed);
    *fallback_active = atomic_load_explicit(&sb->fallback, memory_order_relaxed);
    long long d = atomic_load_explicit(&sb->delay_us, memory_order_relaxed);
    *replay_delay_ms = d < 0 ? -1.0 : (double)d / 1000.0;
}

/* ---- the poller ------------------------------------------------------------------------------ */

static void on_poll_result(void *ud, const PGresult *res)
{
    struct pawl_standby *sb = ud;
    PAWL_ASSERT(pawl__pgpool_on_io_thread(sb->pool)); /* the standby pool's completion */
    struct pawl_sb_check c;
    note_check(sb, res, &c);
    int64_t idx = -1;
    if (c.ok && c.in_recovery && PQnfields(res) >= 3 && !PQgetisnull(res, 0, 2))
        idx = strtoll(PQgetvalue(res, 0, 2), NULL, 10);
    pthread_mutex_lock(&sb->mu);
    sb->polled = idx;
    sb->poll_ok = c.ok;
    pthread_mutex_unlock(&sb->mu);
}

static void on_poll_done(struct pawl_pgreq *req, int rc)
{
    struct pawl_standby *sb = req->ud;
    (void)rc;
    PAWL_ASSERT(pawl__pgpool_on_io_thread(sb->pool) && req == &sb->poll_req);
    pthread_mutex_lock(&sb->mu);
    PAWL_ASSERT(sb->busy); /* the poller sent it, and waits for this */
    sb->busy = 0;
    pthread_cond_broadcast(&sb->cond);
    pthread_mutex_unlock(&sb->mu);
}

/*
 * A reader that is caught up reads nothing while the standby is down, so its poll is what
 * notices the outage: say so as a read would, once per episode (a read that gets events again
 * ends it). Under read-fallback primary the reads themselves switch and say so.
 */
static void report_outage(struct pawl_standby *sb, int64_t best)
{
    if (sb->policy == PAWL_READ_FALLBACK_PRIMARY)
        return;
    int64_t unused;
    (void)decide(sb, PAWL_SB_LOST, best, best, &unused);
}

static void *poll_main(void *arg)
{
    struct pawl_standby *sb = arg;
    int64_t interval = MIN_BACKOFF_NS, cap = (int64_t)sb->poll_max_ms * 1000000, best = -1;
    int seen_ok = 0; /* a poll has succeeded: a failure now is an outage, not start-up */
    pthread_mutex_lock(&sb->mu);
    while (!sb->stop) {
        sb->busy = 1;
        sb->polled = -1;
        sb->poll_ok = 0;
        sb->poll_stmt =
            (struct pawl_pgstmt){.prepared = sb->stmt_poll, .on_result = on_poll_result, .ud = sb};
        memset(&sb->poll_req, 0, sizeof sb->poll_req);
        sb->poll_req.stmts = &sb->poll_stmt;
        sb->poll_req.nstmts = 1;
        sb->poll_req.flags = PAWL_PGREQ_READONLY;
        sb->poll_req.on_done = on_poll_done;
        sb->poll_req.ud = sb;
        if (pawl__pgpool_ready(sb->pool) == 0 || pawl__pgpool_submit(sb->pool, &sb->poll_req) != 0)
            sb->busy = 0;
        /* A poll sent just before the standby went down waits in the pool for its return:
         * one unanswered for POLL_STALL_NS counts as an outage too. */
        int64_t stall_at = pawl_now_ns() + POLL_STALL_NS;
        int stalled = 0;
        while (sb->busy && !sb->stop) {
            if (stalled || !seen_ok) {
                pthread_cond_wait(&sb->cond, &sb->mu);
                continue;
            }
            pawl__timed_wait(sb->timers, &sb->mu, &sb->cond, CLOCK_MONOTONIC,
                             stall_at - pawl_now_ns());
            if (sb->busy && pawl_now_ns() >= stall_at) {
                stalled = 1;
                pthread_mutex_unlock(&sb->mu);
                report_outage(sb, best);
                pthread_mutex_lock(&sb->mu);
            }
        }
        if (sb->stop)
            break;
        int64_t got = sb->polled;
        int ok = sb->poll_ok;
        pthread_mutex_unlock(&sb->mu);
        if (ok)
            seen_ok = 1;
        else if (seen_ok && !stalled)
            report_outage(sb, best);
        if (got > best) {
            best = got;
            sb->raise(sb->raise_ud, got);
            interval = MIN_BACKOFF_NS;
        } else {
            interval = PAWL_MIN(interval * 2, cap);
        }
        pthread_mutex_lock(&sb->mu);
        if (!sb->stop)
            pawl__timed_wait(sb->timers, &sb->mu, &sb->cond, CLOCK_MONOTONIC, interval);
    }
    pthread_mutex_unlock(&sb->mu);
    return NULL;
}

/* ---- life cycle ---------------------------------------------------------------------------- */

int pawl__standby_new(struct pawl_standby **out, const char *primary_dsn,
                      const struct pawl_store_opts *o, struct pawl_timers *timers,
                      void (*raise)(void *ud, int64_t index), void *ud, char *err, size_t errlen)
{
    *out = NULL;
    char e[512];
    if (pawl_dsn_check(o->read_dsn, e, sizeof e) != 0) {
        if (err && errlen)
            snprintf(err, errlen, "invalid read DSN: %s", e);
        return PAWL_EINVAL;
    }
    if (primary_dsn && strcmp(primary_dsn, o->read_dsn) == 0) {
        if (err && errlen)
            snprintf(err, errlen,
                     "the read DSN is the DSN itself: name a standby of it, or leave it empty");
        return PAWL_EINVAL;
    }
    struct pawl_standby *sb = pawl_calloc(1, sizeof *sb);
    if (sb == NULL)
        return PAWL_ENOMEM;
    sb->policy = o->read_fallback;
    sb->max_lag_ms = o->read_max_lag_ms;
    sb->wake = o->read_wake;
    sb->poll_max_ms = o->read_poll_max_ms;
    sb->raise = raise;
    sb->raise_ud = ud;
    sb->timers = timers;
    atomic_init(&sb->delay_us, -1);
    pthread_mutex_init(&sb->mu, NULL);
    pawl__cond_init_monotonic(&sb->cond);
    pawl_dsn_redact(o->read_dsn, sb->where, sizeof sb->where);

    static const char *const session[] = {
        "SET application_name = 'pawl standby reader'",
        "SET plan_cache_mode = force_generic_plan",
        "SET default_transaction_read_only = on",
        "SET statement_timeout = 0",
        NULL,
    };
    struct pawl_pgpool_opts po;
    pawl__pgpool_opts_defaults(&po);
    po.name = "standby";
    po.connections = o->connections;
    po.reconnect_min_ms = o->reconnect_min_ms;
    po.reconnect_max_ms = o->reconnect_max_ms;
    po.connect_timeout_ms = o->connect_timeout_ms;
    po.queue_timeout_ms = o->queue_timeout_ms;
    po.session_sql = session;
    int rc = pawl__pgpool_new(&sb->pool, o->read_dsn, &po, 0, err, errlen);
    if (rc != 0)
        goto fail;
    sb->stmt_check = pawl__pgpool_prepare(sb->pool, CHECK_SQL, 0, NULL);
    sb->stmt_poll = pawl__pgpool_prepare(sb->pool, POLL_SQL, 0, NULL);
    if (sb->stmt_check < 0 || sb->stmt_poll < 0) {
        rc = PAWL_ENOMEM;
        goto fail;
    }
    /* Reconnects within the wait count: a standby that is just starting is not reported. */
    if (pawl__pgpool_wait_ready(sb->pool, PAWL_MIN(START_WAIT_MS, o->open_timeout_ms), 0) != 0) {
        char why[256];
        pawl__pgpool_last_error(sb->pool, why, sizeof why);
        PAWL_WARN("log", "read: the standby (%s) is not reachable yet (%s): %s", sb->where,
                  why[0] ? why : "no connection",
                  sb->policy == PAWL_READ_FALLBACK_PRIMARY
                      ? "reading from the primary until it is (read-fallback primary)"
                      : "readers wait for it (read-fallback wait)");
    }
    PAWL_INFO("log", "read: reading events from the standby %s; wake-ups by %s", sb->where,
              sb->wake == PAWL_READ_WAKE_POLL ? "polling the standby" : "LISTEN on the primary");
    if (sb->wake == PAWL_READ_WAKE_POLL) {
        if (pthread_create(&sb->thread, NULL, poll_main, sb) != 0) {
            rc = PAWL_ESYS;
            goto fail;
        }
        pthread_setname_np(sb->thread, "pawl-sb-poll");
        sb->started = 1;
    }
    *out = sb;
    return 0;
fail:
    pawl__pgpool_free(sb->pool);
    pthread_cond_destroy(&sb->cond);
    pthread_mutex_destroy(&sb->mu);
    pawl_free(sb);
    return rc;
}

void pawl__standby_free(struct pawl_standby *sb)
{
    if (sb == NULL)
        return;
    if (sb->started) {
        pthread_mutex_lock(&sb->mu);
        sb->stop = 1;
        pthread_cond_broadcast(&sb->cond);
        pthread_mutex_unlock(&sb->mu);
        pthread_join(sb->thread, NULL);
    }
    /* Completes a poll still queued (on_poll_done touches sb, which is still here). */
    pawl__pgpool_free(sb->pool);
    PAWL_ASSERT(!sb->busy); /* no request of ours is left with the pool: sb may go */
    pthread_cond_destroy(&sb->cond);
    pthread_mutex_destroy(&sb->mu);
    pawl_free(sb);
}
