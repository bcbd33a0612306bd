/*
 * log.c — the event store: appends, the finalizer, readers and followers (see pawl/log.h,
 * sql/001_log.sql and sql/006_log_guarantees.sql for the data model and its proofs).
 *
 * Pieces and threads:
 *   - main pool (pgconn): appends and reads, pipelined over `connections` connections; its I/O
 *     thread runs append completions and user callbacks. Every append is one call of
 *     pawl.append (the one append path: it stamps xid, k, n and the append ticket), in its own
 *     implicit transaction; pawl_append_in runs the same statement on the caller's connection.
 *   - finalizer pool (1 connection, LISTEN pawl_pending) and the finalizer, a state machine
 *     on that pool's I/O thread (struct fin_sm; no thread of its own): waits for a
 *     signal (set by every committed append of this process, and by pawl_pending from appends
 *     made in callers' own transactions anywhere), drains all signals, runs pawl.finalize once
 *     for everything completed (runs are never cut), goes again at once for signals that came
 *     during the run, retries with a bounded back-off when another session holds the lock
 *     (naming the holder after a while), runs every finalizer_safety_interval_ms regardless
 *     (appends of processes that died), and at pawl_store_free keeps going, for a bounded time,
 *     until this process's appends are final.
 *   - Sessions pin read committed and writable transactions; the finalizer's also pins a
 *     durable synchronous_commit and no timeouts (see pawl_store_new).
 *   - listener pool (1 connection, LISTEN pawl_log): other processes' runs.
 * All three raise `last_index` and broadcast idx_cond, on which followers block.
 *
 * Invariants: `last_index` only grows (updated under idx_mu), except where a reader finds it
 * ahead of the log itself and lowers it to the log's word (read_gap). An append op is
 * owned by the caller until submitted, then by the pool until on_done, then returns to the
 * free list; the user callback runs before it is recycled. `inflight` counts submitted ops.
 */
#include "pawl/log.h"
#include "pawl/runtime.h"

#include "common.h"
#include "dsn.h"
#include "filter.h"
#include "futex.h"
#include "log_int.h"
#include "metrics.h"
#include "pgconn.h"
#include "schema.h"
#include "standby.h"
#include "timers.h"

#include <assert.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OID_BOOL 16
#define OID_INT4 23
#define OID_INT4_ARRAY 1007
#define OID_TEXT_ARRAY 1009
#define OID_INT8_ARRAY 1016
#define OID_BYTEA_ARRAY 1001
#define OID_JSONB_ARRAY 3807
#define OID_TEXT 25
#define OID_INT8 20
#define OID_BYTEA 17
#define OID_JSONB 3802

#define PG_EPOCH_OFFSET_US 946684800000000LL /* 2000-01-01 - 1970-01-01 in µs */
#define ANY_RETRIES 16
#define ACK_RING 65536
/* A statement buffer larger than this goes back to the allocator when its append or group is
 * recycled, so that one burst of big appends does not pin its memory. */
#define BUF_KEEP_MAX (1u << 20)

/*
 * The append statement: pawl.append (sql/006_log_guarantees.sql), the one append path of every
 * client. The client groups the events by stream: $1 the distinct streams (the first event's
 * stream first), $2 each stream's expected first sequence number (0 = ANY), and per event $3 its
 * stream (1-based into $1), $4 its rank among that stream's events in this append (1-based), $5
 * type, $6 payload, $7 metadata; $8 whether to NOTIFY pawl_pending at commit. It returns the
 * number of events written (n, or 0 when a stream is not at its expected version), the
 * transaction's xid and each stream's last sequence number before the append. A stream
 * expected to be new whose number 1 a concurrent append takes gets the unique index's 23505,
 * reported as the same conflict. Grouping on the client spares the server a window sort and a
 * hash aggregate per append, and sends each stream id once. $9 is every event's id, or NULL
 * (sql/015_event_ids.sql): the row's status then says 'already' (a retry of a committed
 * append: seqs holds the numbers its events got) or 'id' (msg: which id, and why).
 */
const char pawl_log_append_sql[] =
    "SELECT appended, txid, heads, status, seqs, msg FROM pawl.append($1::text[], $2::int8[],"
    " $3::int4[], $4::int4[], $5::text[], $6::bytea[], $7::jsonb[], $8::bool, $9::text[])";

/*
 * A group's statement: pawl.append_group (sql/010_group_append.sql), every append's arrays
 * concatenated, with $3 each stream slot's append (1-based) and $4 each event's slot counted
 * across the group, $10 the events' ids (NULL elements for appends without). One row per
 * append, in order, as pawl.append's; status 'again' (an id shared with an earlier append of the
 * group) means: run it alone once this transaction has ended.
 */
static const char APPEND_GROUP_SQL[] =
    "SELECT appended, txid, heads, status, seqs, msg FROM pawl.append_group($1::text[],"
    " $2::int8[], $3::int4[], $4::int4[], $5::int4[], $6::text[], $7::bytea[], $8::jsonb[],"
    " $9::bool, $10::text[])";

/*
 * The outcome of an in-doubt append: pg_xact_status of its transaction, waiting a little
 * server-side while the dying session's transaction is still "in progress". A "committed"
 * status alone does not prove the append committed: after an immediate shutdown (a crash), a
 * transaction id that never reached the WAL on disk is handed out again, and the status is then
 * the new transaction's. So "committed" also needs the append's own first event (same xid, k 0,
 * event count, stream, type and payload) in the table; without it the answer is "reused" (the
 * append is gone: not committed). $2..$5 are the append's own parameters.
 */
static const char RESOLVE_SQL[] =
    "SELECT CASE WHEN x.st = 'committed' AND NOT EXISTS (SELECT 1 FROM pawl.events e"
    "  WHERE e.xid = $1::xid8 AND e.k = 0 AND e.n = $5 AND e.stream_id = ($2::text[])[1]"
    "    AND e.type = ($3::text[])[1] AND e.payload = ($4::bytea[])[1])"
    " THEN 'reused' ELSE x.st END,"
    " pg_sleep(CASE WHEN x.st = 'in progress' THEN 0.02 ELSE 0 END)"
    " FROM (SELECT pg_xact_status($1::xid8) AS st) x";
#define RESOLVE_TRIES 100
/* A check that itself failed (its connection lost, no connection within queue_timeout_ms)
 * uses a third of the budget: at most three such failures before "unknown outcome". */
#define RESOLVE_ERROR_COST 34

static const char READ_SQL[] =
    "SELECT global_index, stream_id, stream_seq, type, payload, metadata, appended_at, event_id"
    "  FROM pawl_api.read($1::int8, $2::int4)";
/* Its rows, then one position row (stream_id NULL, global_index the position looked up to). */
static const char READ_FILTERED_SQL[] =
    "SELECT global_index, stream_id, stream_seq, type, payload, metadata, appended_at, event_id"
    "  FROM pawl_api.read_filtered($1::int8, $2::int4, $3::text[], $4::text[], $5::text[])";
static const char READ_STREAM_SQL[] =
    "SELECT global_index, stream_id, stream_seq, type, payload, metadata, appended_at, event_id"
    "  FROM pawl_api.read_stream($3::text, $1::int8, $2::int4)";

static const char FINALIZE_SQL[] =
    "SELECT appends, events, last_index FROM pawl.finalize($1::int4)";

/* A retried append's lock wait: set_config(..., true) lasts until the request's Sync. */
static const char RETRY_LOCK_TIMEOUT_SQL[] = "SELECT set_config('lock_timeout', '5ms', true)";

static const char LAST_INDEX_SQL[] = "SELECT pawl_api.last_index()";

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

/* ---- latency histogram (log-linear, µs) ------------------------------------------------- */

#define HIST_SUB 16
#define HIST_BUCKETS (HIST_SUB + 40 * HIST_SUB)

struct hist {
    atomic_llong n[HIST_BUCKETS];
    atomic_llong count;
    atomic_llong max;
};

static int hist_bucket(int64_t us)
{
    if (us < HIST_SUB)
        return us < 0 ? 0 : (int)us;
    int e = 63 - __builtin_clzll((unsigned long long)us); /* >= 4 */
    int sub = (int)((us >> (e - 4)) & (HIST_SUB - 1));
    int b = HIST_SUB + (e - 4) * HIST_SUB + sub;
    return b < HIST_BUCKETS ? b : HIST_BUCKETS - 1;
}

static int64_t hist_value(int b)
{
    if (b < HIST_SUB)
        return b;
    int e = (b - HIST_SUB) / HIST_SUB + 4;
    int sub = (b - HIST_SUB) % HIST_SUB;
    int64_t lo = ((int64_t)(HIST_SUB + sub)) << (e - 4);
    int64_t w = (int64_t)1 << (e - 4);
    return lo + w / 2;
}

static void hist_add(struct hist *h, int64_t us)
{
    /* relaxed: statistics; readers tolerate a torn view across buckets. */
    atomic_fetch_add_explicit(&h->n[hist_bucket(us)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    long long m = atomic_load_explicit(&h->max, memory_order_relaxed);
    while (us > m && !atomic_compare_exchange_weak_explicit(&h->max, &m, us, memory_order_relaxed,
                                                            memory_order_relaxed))
        ;
}

static void hist_read(struct hist *h, int64_t *count, double *p50, double *p99, double *max,
                      int reset)
{
    long long c[HIST_BUCKETS];
    long long total = 0;
    for (int i = 0; i < HIST_BUCKETS; i++) {
        /* relaxed: statistics. */
        c[i] = reset ? atomic_exchange_explicit(&h->n[i], 0, memory_order_relaxed)
                     : atomic_load_explicit(&h->n[i], memory_order_relaxed);
        total += c[i];
    }
    long long mx = reset ? atomic_exchange_explicit(&h->max, 0, memory_order_relaxed)
                         : atomic_load_explicit(&h->max, memory_order_relaxed);
    if (reset)
        atomic_store_explicit(&h->count, 0, memory_order_relaxed);
    *count = total;
    *p50 = *p99 = 0;
    *max = (double)mx / 1000.0;
    if (total == 0)
        return;
    long long r50 = (total + 1) / 2, r99 = (total * 99 + 99) / 100, acc = 0;
    int got50 = 0;
    for (int i = 0; i < HIST_BUCKETS; i++) {
        acc += c[i];
        if (!got50 && acc >= r50) {
            *p50 = (double)hist_value(i) / 1000.0;
            got50 = 1;
        }
        if (acc >= r99) {
            *p99 = (double)hist_value(i) / 1000.0;
            break;
        }
    }
    if (*p99 > *max && mx > 0)
        *p99 = *max;
    if (*p50 > *max && mx > 0)
        *p50 = *max;
}

/* ---- the store ----------------------------------------------------------------------------- */

struct append_op;

struct ack_slot {
    atomic_llong seq; /* which ack this slot holds (release after t is written) */
    atomic_llong t_ns;
};

struct fin_out {
    int64_t appends, events, last;
};

/* What a holder query (pawl_api.finalizer_holder) is for: a warning, or the last word on stop. */
struct fin_holder {
    struct pawl_pgreq req;
    struct pawl_pgstmt st;
    char who[256];
    int64_t held_ns; /* how long the lock has been busy when it was asked */
};

/*
 * The finalizer: a state machine that lives on the finalizer pool's I/O thread (fin_loop is the
 * pool's on_loop hook; fin_run_done and fin_holder_done are completions on the same thread), so
 * a run costs no hand-off between threads: a signal wakes the loop, which sends pawl.finalize on
 * its one connection and takes the result when the socket says so. Every field is that thread's
 * alone.
 */
enum fin_state {
    FIN_IDLE,   /* waiting: a signal, the cadence, a back-off or the safety interval */
    FIN_RUN,    /* a run is in flight */
    FIN_NAMING, /* stopping past the deadline: asking who holds the lock, for the last word */
    FIN_DONE    /* stopped (fin_done is set) */
};

struct fin_sm {
    enum fin_state state;
    int rerun;            /* run again without waiting for a signal (back-off, stop, error) */
    int foreign;          /* the run in flight drained a pawl_pending signal */
    long long acked;      /* this process's acks counted before the run in flight was sent */
    int64_t next_safety;  /* run by then whatever happens */
    int64_t last_start;   /* the cadence: runs start at least fin_interval_ns apart */
    int64_t foreign_next; /* a run only other sessions asked for starts no sooner */
    int64_t not_before;   /* back-off after an error or a busy lock: nothing before it */
    int64_t stop_deadline;
    int64_t busy_since; /* the lock has been busy since (0: it is not) */
    int err_backoff_ms, busy_ms;
    int holder_named;                /* the holder was named in this busy episode */
    int failures;                    /* failed runs since the last one that succeeded */
    int64_t fail_since, fail_warned; /* the first failure of the episode; its last warning */
    struct fin_out out;
    const char *vals[1];
    struct pawl_pgstmt st;
    struct pawl_pgreq req;
    struct fin_holder warn, last; /* separate: a warning may be in flight when stop asks */
};

struct pawl_store {
    struct pawl_store_opts o;
    char *dsn;
    struct pawl_pgpool *main;
    struct pawl_pgpool *fin;
    struct pawl_pgpool *listen;
    struct pawl_timers *timers; /* every timed wait's deadline (pawl_timed_wait); no pool */
    int stmt_append, stmt_append_group, stmt_read, stmt_last, stmt_resolve, stmt_fin_main;
    struct pawl_standby *sb;      /* read_dsn: where reads go (standby.c); NULL: the main pool */
    int stmt_read_sb;             /* READ_SQL on the standby's pool */
    int stmt_read_f, stmt_read_s; /* READ_FILTERED_SQL, READ_STREAM_SQL */
    int stmt_read_f_sb, stmt_read_s_sb; /* the same on the standby's pool */
    char fin_batch_text[16];
    pthread_mutex_t cov_mu; /* record_delays: covered and the delay histogram */
    int fin_stmt;

    pthread_mutex_t err_mu;
    char last_err[512];

    /* Appends that hit lock_timeout, waiting for their retry (retry thread). */
    pthread_mutex_t retry_mu;
    pthread_cond_t retry_cond;
    struct append_op *delayed; /* under retry_mu, unsorted */
    int retry_stop;            /* under retry_mu */
    pthread_t retry_thread;
    int retry_started;
    atomic_int lock_episode; /* a lock-timeout episode was logged and has not ended */
    atomic_int lost_episode; /* a lost-connection retry episode was logged (append_retry_ms) */
    const char *main_session[8];
    char lock_sql[48];

    /* Group append: ops waiting for a group (FIFO through next_q), the groups not in flight,
     * and how many are (at most grp_limit = connections). All under grp_mu. */
    pthread_mutex_t grp_mu;
    struct append_op *grp_head, *grp_tail;
    size_t grp_queued;
    struct append_group *grp_free;
    int grp_inflight, grp_limit;
    atomic_llong grp_linger_due; /* linger: when the retry thread starts a group (0: none) */
    atomic_llong groups_ok, groups_appends;

    /* Async appends. */
    pthread_mutex_t op_mu;
    pthread_cond_t op_cond; /* signalled when inflight drops to 0 */
    struct append_op *free_ops;
    int nfree;
    atomic_int inflight;

    /* The highest known final index and those who wait for it to grow. */
    pthread_mutex_t idx_mu;
    pthread_cond_t idx_cond;
    atomic_llong last_index;
    int shutdown; /* under idx_mu */
    int waiters;  /* followers inside pawl_store_wait, under idx_mu */
    pthread_cond_t waiters_cond;

    /* Finalizer (struct fin_sm). */
    int fin_started;        /* this store runs a finalizer (the state machine is on) */
    atomic_int fin_on;      /* fin_loop may act: the store is built (release/acquire) */
    atomic_int fin_signal;  /* set by each committed append */
    atomic_int fin_foreign; /* pawl_pending arrived (an append of a process without finalizer)
                             * or the finalizer's connection was re-established */
    atomic_int fin_waiting; /* fin_loop sleeps until a signal: the first signal wakes the loop */
    atomic_int fin_stop;
    pthread_mutex_t fin_mu;
    pthread_cond_t fin_cond; /* fin_done became 1 */
    int fin_done;            /* under fin_mu: the state machine has stopped */
    struct fin_sm fm;
    struct pawl_pgreq listen_req;
    struct pawl_pgstmt listen_stmt;
    atomic_int listen_req_busy;
    atomic_int listen_again; /* a wake-up came while the last_index query was in flight */
    int64_t listen_next_ns;  /* listener's I/O thread only: no query starts before it */

    /* Readers: lost-connection retries and gaps (pawl_read). */
    atomic_llong rd_retries, rd_reconnects, rd_gaps;
    atomic_int gap_active;       /* a gap episode is open (logged once) */
    atomic_llong gap_backoff_ns; /* the next gap back-off; 0: the first (1 ms) */
    atomic_llong notifies, index_queries, notifies_own;
    atomic_int fin_pid; /* the server process of this store's finalizer session; 0: none yet */
    atomic_llong rd_down_since; /* pawl_now_ns() when readers lost their connection; 0: up */

    /* Commit acknowledgements, for pending counts and finalize delays. */
    atomic_llong acked;   /* appends acknowledged so far (also the last ack's sequence) */
    atomic_llong covered; /* acks covered by a finished finalization run */
    struct ack_slot *ring;

    /* Statistics. */
    atomic_llong appends_ok, events_ok, appends_failed;
    atomic_llong fin_runs, fin_idle, fin_busy, fin_errors, fin_appends, fin_events, fin_piggy;
    atomic_llong retries; /* appends re-run after a retryable error (op_done) */
    atomic_llong fin_skipped;
    atomic_llong lock_timeouts; /* appends rolled back by lock_timeout (55P03) */
    atomic_llong lost_retries;  /* appends with ids sent again after a lost connection */
    /* Cadence under load: append latency moving average (ns; written by whichever thread
     * finishes an append, a lost update only drops a sample) and the interval in force. */
    atomic_llong lat_avg_ns, fin_interval_ns;
    atomic_llong run_avg_ns; /* wall time of runs that finalized something: a moving average */
    struct hist delay, run, append_lat;
};

static void set_err(struct pawl_store *s, const char *sqlstate, const char *msg)
{
    pthread_mutex_lock(&s->err_mu);
    if (sqlstate && sqlstate[0])
        snprintf(s->last_err, sizeof s->last_err, "%s: %.490s", sqlstate, msg ? msg : "");
    else
        snprintf(s->last_err, sizeof s->last_err, "%.500s", msg ? msg : "");
    pthread_mutex_unlock(&s->err_mu);
}

const char *pawl_store_errmsg(struct pawl_store *s, char *buf, size_t len)
{
    if (len == 0)
        return buf;
    if (s == NULL) {
        buf[0] = '\0';
        return buf;
    }
    pthread_mutex_lock(&s->err_mu);
    snprintf(buf, len, "%s", s->last_err);
    pthread_mutex_unlock(&s->err_mu);
    return buf;
}

void pawl_store_last_error(struct pawl_store *s, char *buf, size_t len)
{
    pawl_store_errmsg(s, buf, len);
}

/* Raise the known highest index and wake followers (any thread). */
static void raise_index(struct pawl_store *s, int64_t idx)
{
    /* relaxed: the mutex below orders the update with the waiters' checks. */
    long long cur = atomic_load_explicit(&s->last_index, memory_order_relaxed);
    if (idx <= cur)
        return;
    pthread_mutex_lock(&s->idx_mu);
    cur = atomic_load_explicit(&s->last_index, memory_order_relaxed);
    if (idx > cur) {
        atomic_store_explicit(&s->last_index, idx, memory_order_relaxed);
        pthread_cond_broadcast(&s->idx_cond);
    }
    pthread_mutex_unlock(&s->idx_mu);
}

static void raise_index_cb(void *ud, int64_t idx)
{
    raise_index(ud, idx);
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
        pawl_timed_wait(s->timers, &s->idx_mu, &s->idx_cond, CLOCK_MONOTONIC, left);
    }
    if (--s->waiters == 0 && s->shutdown)
        pthread_cond_broadcast(&s->waiters_cond);
    pthread_mutex_unlock(&s->idx_mu);
    return rc;
}

/* ---- options ------------------------------------------------------------------------------- */

void pawl_store_opts_defaults(struct pawl_store_opts *o)
{
    memset(o, 0, sizeof *o);
#define DEFAULT(type, field, flag, def, lo, hi, unit, help, choices) o->field = def;
    PAWL_STORE_TUNABLES(DEFAULT)
#undef DEFAULT
}

/*
 * The ranges of PAWL_STORE_TUNABLES, then the rule no single range states. Writes the first
 * failure into msg and returns PAWL_ERANGE (the rule in pawl/common.h: every check here is a
 * range, some bounded by another option), or returns 0.
 */
static int check_opts(const struct pawl_store_opts *o, char *msg, size_t mlen)
{
#define RANGE(field, lo, hi)                                                                       \
    if ((long long)o->field < (long long)(lo) || (long long)o->field > (long long)(hi)) {          \
        snprintf(msg, mlen, #field " = %lld is out of range [%lld, %lld]", (long long)o->field,    \
                 (long long)(lo), (long long)(hi));                                                \
        return PAWL_ERANGE;                                                                        \
    }
#define CHECK_INT(field, lo, hi) RANGE(field, lo, hi)
#define CHECK_BOOL(field, lo, hi) RANGE(field, lo, hi)
#define CHECK_BOOL_NOFLAG(field, lo, hi) RANGE(field, lo, hi)
#define CHECK_DURATION(field, lo, hi) RANGE(field, lo, hi)
#define CHECK_ENUM(field, lo, hi) RANGE(field, lo, hi)
#define CHECK_STRING(field, lo, hi) /* any length: the server judges a DSN */
#define CHECK(type, field, flag, def, lo, hi, unit, help, choices) CHECK_##type(field, lo, hi)
    PAWL_STORE_TUNABLES(CHECK)
#undef CHECK
#undef CHECK_STRING
#undef CHECK_ENUM
#undef CHECK_DURATION
#undef CHECK_BOOL_NOFLAG
#undef CHECK_BOOL
#undef CHECK_INT
#undef RANGE
    if (o->reconnect_max_ms < o->reconnect_min_ms) {
        snprintf(msg, mlen, "reconnect_max_ms is below reconnect_min_ms");
        return PAWL_ERANGE;
    }
    return 0;
}

/* ---- validation ---------------------------------------------------------------------------- */

static int utf8_valid(const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x80) {
            if (c == 0)
                return 0;
            i++;
            continue;
        }
        size_t len;
        unsigned min;
        if ((c & 0xE0) == 0xC0) {
            len = 2;
            min = 0x80;
            c &= 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            min = 0x800;
            c &= 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            min = 0x10000;
            c &= 0x07;
        } else {
            return 0;
        }
        if (i + len > n)
            return 0;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80)
                return 0;
            c = (c << 6) | (p[i + k] & 0x3F);
        }
        if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

/*
 * Metadata must be one JSON object, checked with jansson before anything reaches the server
 * (so that the asynchronous path refuses it at the call, and the error names the event and the
 * place). Integers are read as doubles so that no integer is refused for its size; a number
 * beyond a double's range is refused, which PostgreSQL's jsonb would have stored (RFC 8259
 * warns such numbers do not interoperate). The server's jsonb input still judges the text it
 * stores: its refusal (22P02, 22P05) comes back as PAWL_EINVAL too.
 */
static int json_object_check(const char *s, size_t n, char *why, size_t wlen)
{
    json_error_t jerr;
    json_t *v = json_loadb(s, n, JSON_DECODE_INT_AS_REAL, &jerr);
    if (v == NULL) {
        snprintf(why, wlen, "%s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
        return 0;
    }
    int ok = json_is_object(v);
    if (!ok)
        snprintf(why, wlen, "a JSON %s, not an object",
                 json_is_array(v)    ? "array"
                 : json_is_string(v) ? "string"
                                     : "value");
    json_decref(v);
    return ok;
}

static int cmp_id(const void *a, const void *b, void *arg)
{
    const struct pawl_event *ev = arg;
    return strcmp(ev[*(const uint32_t *)a].id, ev[*(const uint32_t *)b].id);
}

/* An event id: 1..PAWL_EVENT_ID_MAX bytes of UTF-8, no control characters (the table's check). */
static int id_valid(const char *id)
{
    size_t l = strlen(id);
    if (l == 0 || l > PAWL_EVENT_ID_MAX || !utf8_valid((const unsigned char *)id, l))
        return 0;
    for (size_t i = 0; i < l; i++)
        if ((unsigned char)id[i] < 0x20 || id[i] == 0x7f)
            return 0;
    return 1;
}

static int cmp_stream_pos(const void *a, const void *b, void *arg)
{
    const struct pawl_event *ev = arg;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    int c = strcmp(ev[x].stream_id, ev[y].stream_id);
    if (c)
        return c;
    return x < y ? -1 : x > y;
}

/*
 * Check events before anything reaches the server. Writes the reason into msg. Returns 0,
 * PAWL_EINVAL or PAWL_ETOOBIG; *any is set when some stream uses PAWL_SEQ_ANY. On success ix
 * (room for n) holds the event positions sorted by stream, then by position: what encode()
 * groups the streams by.
 */
static int validate(const struct pawl_store_opts *o, const struct pawl_event *ev, size_t n,
                    int *any, uint32_t *ix, char *msg, size_t mlen)
{
    *any = 0;
    if (ev == NULL || n == 0) {
        snprintf(msg, mlen, "an append needs at least one event");
        return PAWL_EINVAL;
    }
    if (n > o->max_append_events) {
        snprintf(msg, mlen, "%zu events in one append, more than max_append_events (%zu)", n,
                 o->max_append_events);
        return PAWL_ETOOBIG;
    }
    for (size_t i = 0; i < n; i++) {
        const struct pawl_event *e = &ev[i];
        if (e->stream_id == NULL || e->type == NULL) {
            snprintf(msg, mlen, "event %zu: stream_id and type are required", i);
            return PAWL_EINVAL;
        }
        size_t ls = strlen(e->stream_id), lt = strlen(e->type);
        size_t lm = e->metadata ? strlen(e->metadata) : 0;
        if (ls == 0 || ls > PAWL_STREAM_ID_MAX) {
            snprintf(msg, mlen, "event %zu: stream_id must have 1..%d bytes (has %zu)", i,
                     PAWL_STREAM_ID_MAX, ls);
            return PAWL_EINVAL;
        }
        if (lt == 0 || lt > PAWL_EVENT_TYPE_MAX) {
            snprintf(msg, mlen, "event %zu: type must have 1..%d bytes (has %zu)", i,
                     PAWL_EVENT_TYPE_MAX, lt);
            return PAWL_EINVAL;
        }
        if (e->payload == NULL && e->payload_len > 0) {
            snprintf(msg, mlen, "event %zu: payload is NULL with payload_len %zu", i,
                     e->payload_len);
            return PAWL_EINVAL;
        }
        if (e->payload_len > o->max_event_bytes ||
            ls + lt + lm + e->payload_len > o->max_event_bytes) {
            snprintf(msg, mlen, "event %zu: %zu bytes, more than max_event_bytes (%zu)", i,
                     ls + lt + lm + e->payload_len, o->max_event_bytes);
            return PAWL_ETOOBIG;
        }
        if (!utf8_valid((const unsigned char *)e->stream_id, ls) ||
            !utf8_valid((const unsigned char *)e->type, lt)) {
            snprintf(msg, mlen, "event %zu: stream_id or type is not valid UTF-8", i);
            return PAWL_EINVAL;
        }
        char why[200];
        if (e->metadata && !json_object_check(e->metadata, lm, why, sizeof why)) {
            snprintf(msg, mlen, "event %zu: metadata is not a JSON object: %.150s", i, why);
            return PAWL_EINVAL;
        }
        if (e->stream_seq < 0) {
            snprintf(msg, mlen, "event %zu: stream_seq %lld is negative", i,
                     (long long)e->stream_seq);
            return PAWL_EINVAL;
        }
        if (e->stream_seq == PAWL_SEQ_ANY)
            *any = 1;
        if ((e->id != NULL) != (ev[0].id != NULL)) {
            snprintf(msg, mlen, "event %zu: every event of an append carries an id, or none does",
                     i);
            return PAWL_EINVAL;
        }
        if (e->id != NULL && !id_valid(e->id)) {
            char shown[PAWL_PRINTABLE_SIZE(64)];
            snprintf(msg, mlen,
                     "event %zu: id \"%s\" must have 1..%d bytes of UTF-8 and no control "
                     "characters",
                     i, pawl_printable_str(e->id, shown, sizeof shown), PAWL_EVENT_ID_MAX);
            return PAWL_EINVAL;
        }
    }
    if (ev[0].id != NULL && n > 1) {
        /* Distinct ids: sorted by id, neighbours differ. */
        for (size_t i = 0; i < n; i++)
            ix[i] = (uint32_t)i;
        qsort_r(ix, n, sizeof *ix, cmp_id, (void *)ev);
        for (size_t i = 1; i < n; i++)
            if (strcmp(ev[ix[i - 1]].id, ev[ix[i]].id) == 0) {
                char shown[PAWL_PRINTABLE_SIZE(64)];
                snprintf(msg, mlen, "events %u and %u: id \"%s\" appears twice in one append",
                         PAWL_MIN(ix[i - 1], ix[i]), PAWL_MAX(ix[i - 1], ix[i]),
                         pawl_printable_str(ev[ix[i]].id, shown, sizeof shown));
                return PAWL_EINVAL;
            }
    }
    for (size_t i = 0; i < n; i++)
        ix[i] = (uint32_t)i;
    if (n == 1)
        return 0;
    /* Per stream: all ANY or all explicit and consecutive, in batch order. */
    qsort_r(ix, n, sizeof *ix, cmp_stream_pos, (void *)ev);
    for (size_t i = 1; i < n; i++) {
        const struct pawl_event *a = &ev[ix[i - 1]], *b = &ev[ix[i]];
        if (strcmp(a->stream_id, b->stream_id) != 0)
            continue;
        int bad = (a->stream_seq == 0) != (b->stream_seq == 0) ||
                  (a->stream_seq != 0 && b->stream_seq != a->stream_seq + 1);
        if (bad) {
            snprintf(msg, mlen,
                     "stream \"%.64s\": events %u and %u must both be ANY or consecutive "
                     "sequence numbers (%lld, %lld)",
                     a->stream_id, ix[i - 1], ix[i], (long long)a->stream_seq,
                     (long long)b->stream_seq);
            return PAWL_EINVAL;
        }
    }
    return 0;
}

/* ---- encoding: PostgreSQL binary arrays ------------------------------------------------ */

static char *put32(char *p, uint32_t v)
{
    v = __builtin_bswap32(v);
    memcpy(p, &v, 4);
    return p + 4;
}

static char *put64(char *p, uint64_t v)
{
    v = __builtin_bswap64(v);
    memcpy(p, &v, 8);
    return p + 8;
}

static char *array_header(char *p, int hasnull, uint32_t oid, size_t n)
{
    p = put32(p, 1);
    p = put32(p, (uint32_t)hasnull);
    p = put32(p, oid);
    p = put32(p, (uint32_t)n);
    return put32(p, 1);
}

/* ---- append operations --------------------------------------------------------------------- */

/* An append's outcome as to its ids (pawl.append's status column). */
enum id_status { ID_NONE, ID_ALREADY, ID_AGAIN, ID_USED };

/*
 * An append's encoded parameters (pawl_log_append_sql's $1..$9, then the event count as int4
 * for the in-doubt check) and, once its result arrived, what the server assigned.
 */
struct append_enc {
    char *buf;
    size_t cap;
    const char *values[10];
    int lengths[10];
    int formats[10];
    int has_ids;           /* $9 holds the events' ids (else it is NULL) */
    enum id_status status; /* once the result arrived */
    char id_msg[256];      /* with ID_USED: the server's reason */
    size_t n;              /* events */
    size_t first_count;    /* events of events[0]'s stream (stream 1 of the statement) */
    char notify;           /* $8: 1 = NOTIFY pawl_pending at commit */
    char n_be[4];          /* the event count, big-endian */
    int64_t rows;          /* events written (-1 before the result arrived) */
    int64_t head1;         /* stream 1's last sequence number before the append (-1: unknown) */
    char xid[24];          /* the append's transaction, "" until its result arrived */
    size_t si_off; /* offsets in buf of $3's and $4's bodies (each event's stream and rank) */
    size_t rk_off;
    int64_t *seqs; /* every event's assigned sequence number, once the result arrived */
    size_t seqs_cap;
    int seqs_ok; /* seqs[0..n) are valid */
};

static void on_fin_result(void *ud, const PGresult *res);

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
static void record_delays(struct pawl_store *s, long long upto, int64_t t_end);

struct append_op {
    struct pawl_store *s;
    struct pawl_pgreq req;
    struct pawl_pgstmt stmt[3]; /* [a retry's short lock_timeout,] the append (+ piggybacked
                                 * finalization), or the check */
    struct fin_out fin;         /* the piggybacked finalization's result */
    const char *fin_vals[1];
    long long acked_at_submit; /* this store's acks before the request was sent */
    char xact_status[16];      /* pg_xact_status() when resolving an in-doubt commit */
    int resolve_tries;
    const char *resolve_vals[5];
    int resolve_lens[5];
    int resolve_fmts[5];
    struct append_enc en;
    size_t n;
    int any;
    int retries;
    int64_t t_submit;
    int64_t lock_wait_start; /* first lock timeout of this append (0: none) */
    int64_t lost_start;      /* first lost connection of an append with ids (0: none) */
    int lost_backoff_ms;
    int64_t due_ns; /* delayed retry: when to submit again */
    int lock_backoff_ms;
    pawl_append_fn cb;
    void *ud;
    struct append_op *next_free; /* also the delayed-retry list */
    struct append_op *next_q;    /* the group queue (grp_mu) */
};

static struct append_op *op_get(struct pawl_store *s)
{
    pthread_mutex_lock(&s->op_mu);
    struct append_op *op = s->free_ops;
    if (op) {
        s->free_ops = op->next_free;
        s->nfree--;
    }
    pthread_mutex_unlock(&s->op_mu);
    if (op == NULL) {
        op = pawl_calloc(1, sizeof *op);
        if (op == NULL)
            return NULL;
        op->s = s;
    }
    return op;
}

static void op_put(struct pawl_store *s, struct append_op *op)
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
    pthread_mutex_lock(&s->op_mu);
    if (s->nfree < 1024) {
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

/*
 * Encode an append's parameters (see pawl_log_append_sql) as binary arrays. ix is validate()'s
 * order: positions sorted by stream, then position, so each stream's events are a run in it.
 */
static int encode(struct append_enc *en, const struct pawl_event *ev, size_t n, const uint32_t *ix)
{
    /* Streams: m runs in ix; the run holding event 0 goes first (the in-doubt check reads the
     * first event's stream as ($1)[1]). */
    size_t m = 0, first_run = 0, sz_s = 20;
    for (size_t j = 0; j < n; j++) {
        if (j > 0 && strcmp(ev[ix[j]].stream_id, ev[ix[j - 1]].stream_id) == 0)
            continue;
        if (strcmp(ev[ix[j]].stream_id, ev[0].stream_id) == 0)
            first_run = j;
        m++;
        sz_s += 4 + strlen(ev[ix[j]].stream_id);
    }
    size_t sz_q = 20 + m * 12, sz_si = 20 + n * 8, sz_r = 20 + n * 8;
    size_t sz_t = 20, sz_p = 20, sz_m = 20, sz_id = 0;
    int mnull = 0;
    en->has_ids = ev[0].id != NULL; /* validate(): all or none */
    if (en->has_ids)
        sz_id = 20;
    for (size_t i = 0; i < n; i++) {
        if (en->has_ids)
            sz_id += 4 + strlen(ev[i].id);
        sz_t += 4 + strlen(ev[i].type);
        sz_p += 4 + ev[i].payload_len;
        if (ev[i].metadata)
            sz_m += 5 + strlen(ev[i].metadata);
        else {
            sz_m += 4;
            mnull = 1;
        }
    }
    size_t total = sz_s + sz_q + sz_si + sz_r + sz_t + sz_p + sz_m + sz_id;
    if (total > INT32_MAX)
        return PAWL_ETOOBIG;
    if (en->cap < total) {
        char *nb = pawl_malloc(total);
        if (nb == NULL)
            return PAWL_ENOMEM;
        pawl_free(en->buf);
        en->buf = nb;
        en->cap = total;
    }
    char *p = en->buf;
    char *start[7];

    /* $1 streams and $2 their expected first numbers; $3/$4 filled per run. */
    start[0] = p;
    char *q = p + sz_s;    /* $2 */
    char *si = q + sz_q;   /* $3 */
    char *rk = si + sz_si; /* $4 */
    start[1] = q;
    start[2] = si;
    start[3] = rk;
    p = array_header(p, 0, OID_TEXT, m);
    q = array_header(q, 0, OID_INT8, m);
    char *si_body = array_header(si, 0, OID_INT4, n);
    char *rk_body = array_header(rk, 0, OID_INT4, n);
    en->si_off = (size_t)(si_body - en->buf);
    en->rk_off = (size_t)(rk_body - en->buf);
    en->seqs_ok = 0;
    uint32_t stream_no = 0;
    for (int pass = 0; pass < 2; pass++) {
        /* Pass 0 writes the run of event 0's stream, pass 1 every other run. */
        for (size_t j = 0; j < n;) {
            size_t e = j + 1;
            while (e < n && strcmp(ev[ix[e]].stream_id, ev[ix[j]].stream_id) == 0)
                e++;
            if ((j == first_run) == (pass == 0)) {
                if (pass == 0)
                    en->first_count = e - j;
                stream_no++;
                size_t l = strlen(ev[ix[j]].stream_id);
                p = put32(p, (uint32_t)l);
                memcpy(p, ev[ix[j]].stream_id, l);
                p += l;
                q = put32(q, 8);
                q = put64(q, (uint64_t)ev[ix[j]].stream_seq);
                for (size_t r = j; r < e; r++) {
                    put64(si_body + (size_t)ix[r] * 8, ((uint64_t)4 << 32) | stream_no);
                    put64(rk_body + (size_t)ix[r] * 8, ((uint64_t)4 << 32) | (r - j + 1));
                }
            }
            j = e;
        }
    }
    char *s_end = p;
    p = rk_body + n * 8;
    start[4] = p;
    p = array_header(p, 0, OID_TEXT, n);
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(ev[i].type);
        p = put32(p, (uint32_t)l);
        memcpy(p, ev[i].type, l);
        p += l;
    }
    start[5] = p;
    p = array_header(p, 0, OID_BYTEA, n);
    for (size_t i = 0; i < n; i++) {
        p = put32(p, (uint32_t)ev[i].payload_len);
        if (ev[i].payload_len)
            memcpy(p, ev[i].payload, ev[i].payload_len);
        p += ev[i].payload_len;
    }
    start[6] = p;
    p = array_header(p, mnull, OID_JSONB, n);
    for (size_t i = 0; i < n; i++) {
        if (ev[i].metadata == NULL) {
            p = put32(p, (uint32_t)-1);
            continue;
        }
        size_t l = strlen(ev[i].metadata);
        p = put32(p, (uint32_t)(l + 1));
        *p++ = 1; /* jsonb binary format version */
        memcpy(p, ev[i].metadata, l);
        p += l;
    }
    const char *end[7] = {s_end, q, si_body + n * 8, rk_body + n * 8, start[5], start[6], p};
    for (int i = 0; i < 7; i++) {
        en->values[i] = start[i];
        en->lengths[i] = (int)(end[i] - start[i]);
        en->formats[i] = 1;
    }
    en->values[7] = &en->notify;
    en->lengths[7] = 1;
    en->formats[7] = 1;
    /* $9 the ids, or NULL. */
    en->values[8] = NULL;
    en->lengths[8] = 0;
    en->formats[8] = 1;
    if (en->has_ids) {
        char *ids = p;
        p = array_header(p, 0, OID_TEXT, n);
        for (size_t i = 0; i < n; i++) {
            size_t l = strlen(ev[i].id);
            p = put32(p, (uint32_t)l);
            memcpy(p, ev[i].id, l);
            p += l;
        }
        en->values[8] = ids;
        en->lengths[8] = (int)(p - ids);
    }
    put32(en->n_be, (uint32_t)n);
    en->values[9] = en->n_be;
    en->lengths[9] = 4;
    en->formats[9] = 1;
    en->n = n;
    return 0;
}

static uint32_t get32(const char *p)
{
    const unsigned char *u = (const unsigned char *)p;
    return (uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | u[3];
}

/*
 * Every event's sequence number from the heads the server returned (text "{h1,...,hm}", each
 * stream's last number before the append, in $1's order): event i got heads[its stream] + its
 * rank, both read back from the encoded $3/$4 (each element: 4-byte length, 4-byte value).
 * Leaves seqs_ok 0 when memory or the text does not allow it.
 */
static void enc_all_seqs(struct append_enc *en, const char *h)
{
    size_t n = en->n;
    if (en->seqs_cap < 2 * n) {
        int64_t *ns = pawl_malloc(2 * n * sizeof *ns);
        if (ns == NULL)
            return;
        pawl_free(en->seqs);
        en->seqs = ns;
        en->seqs_cap = 2 * n;
    }
    int64_t *heads = en->seqs + n; /* at most n streams */
    size_t m = 0;
    const char *p = h + 1;
    while (*p != '}' && *p != '\0' && m < n) {
        char *end;
        heads[m++] = strtoll(p, &end, 10);
        if (end == p)
            return;
        p = *end == ',' ? end + 1 : end;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t sno = get32(en->buf + en->si_off + i * 8 + 4);
        uint32_t rank = get32(en->buf + en->rk_off + i * 8 + 4);
        if (sno == 0 || sno > m)
            return;
        en->seqs[i] = heads[sno - 1] + (int64_t)rank;
    }
    en->seqs_ok = 1;
}

/*
 * A retried append's numbers, every event's in event order (text "{s1,s2,...}"), into seqs; head1
 * from the first. Leaves seqs_ok 0 when memory or the text does not allow it.
 */
static void enc_already_seqs(struct append_enc *en, const char *t)
{
    size_t n = en->n;
    if (en->seqs_cap < 2 * n) {
        int64_t *ns = pawl_malloc(2 * n * sizeof *ns);
        if (ns == NULL)
            return;
        pawl_free(en->seqs);
        en->seqs = ns;
        en->seqs_cap = 2 * n;
    }
    const char *p = t + (*t == '{');
    for (size_t i = 0; i < n; i++) {
        char *end;
        en->seqs[i] = strtoll(p, &end, 10);
        if (end == p || en->seqs[i] < 1)
            return;
        p = *end == ',' ? end + 1 : end;
    }
    en->head1 = en->seqs[0] - 1;
    en->seqs_ok = 1;
}

/* pawl.append's row (text format), or row `row` of pawl.append_group's: appended, txid, heads
 * ("{h1,h2,...}"), status, seqs, msg. */
static void enc_result_row(struct append_enc *en, const PGresult *res, int row)
{
    if (PQgetisnull(res, row, 0))
        return;
    en->status = ID_NONE;
    if (PQnfields(res) >= 6 && !PQgetisnull(res, row, 3)) {
        const char *st = PQgetvalue(res, row, 3);
        en->status = strcmp(st, "already") == 0 ? ID_ALREADY
                     : strcmp(st, "again") == 0 ? ID_AGAIN
                                                : ID_USED;
        if (en->status == ID_USED)
            snprintf(en->id_msg, sizeof en->id_msg, "%s",
                     PQgetisnull(res, row, 5) ? st : PQgetvalue(res, row, 5));
        if (en->status == ID_ALREADY && !PQgetisnull(res, row, 4))
            enc_already_seqs(en, PQgetvalue(res, row, 4));
        en->rows = en->status == ID_ALREADY ? (int64_t)en->n : 0;
        return;
    }
    en->rows = strtoll(PQgetvalue(res, row, 0), NULL, 10);
    if (!PQgetisnull(res, row, 1))
        snprintf(en->xid, sizeof en->xid, "%s", PQgetvalue(res, row, 1));
    if (!PQgetisnull(res, row, 2)) {
        const char *h = PQgetvalue(res, row, 2);
        if (*h == '{')
            en->head1 = strtoll(h + 1, NULL, 10);
        if (en->rows == (int64_t)en->n)
            enc_all_seqs(en, h);
    }
}

static void on_insert_result(void *ud, const PGresult *res)
{
    struct append_op *op = ud;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
        enc_result_row(&op->en, res, 0);
}

/* The stream sequence numbers of events[0]'s stream that a successful append was given. */
static void enc_seqs(const struct append_enc *en, struct pawl_append_result *res)
{
    if (en->head1 >= 0) {
        res->first_seq = en->head1 + 1;
        res->last_seq = en->head1 + (int64_t)en->first_count;
    }
    res->seqs = en->seqs_ok ? en->seqs : NULL;
    res->already = en->status == ID_ALREADY;
    if (res->already && en->seqs_ok) {
        /* The numbers the retried events got then: events[0]'s stream's highest. */
        res->last_seq = res->first_seq;
        for (size_t i = 0; i < en->n; i++)
            if (get32(en->buf + en->si_off + i * 8 + 4) == 1 && en->seqs[i] > res->last_seq)
                res->last_seq = en->seqs[i];
    }
}

static void on_resolve_result(void *ud, const PGresult *res)
{
    struct append_op *op = ud;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
        snprintf(op->xact_status, sizeof op->xact_status, "%s", PQgetvalue(res, 0, 0));
}

static void signal_finalizer(struct pawl_store *s)
{
    /* seq_cst pair with fin_waiting (Dekker, see fin_loop): either we see the finalizer
     * waiting and wake its loop (the first signaller only), or it sees our signal before it
     * sleeps. A finalizer busy with a run or spacing runs needs no wake-up: it looks at the
     * signal when the run completes or the interval ends. */
    atomic_store(&s->fin_signal, 1);
    if (atomic_load(&s->fin_waiting) && atomic_exchange(&s->fin_waiting, 0))
        pawl_pgpool_wake(s->fin);
}

/* Another session asked for a run (pawl_pending, or a reconnect that may have missed one): as
 * signal_finalizer, with its own flag, so that the finalizer can space such runs out. */
static void signal_foreign(struct pawl_store *s)
{
    atomic_store(&s->fin_foreign, 1); /* seq_cst: the Dekker pair with fin_waiting */
    if (atomic_load(&s->fin_waiting) && atomic_exchange(&s->fin_waiting, 0))
        pawl_pgpool_wake(s->fin);
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

static int submit_op(struct pawl_store *s, struct append_op *op);
static void resolve_done(struct pawl_pgreq *req, int rc);

static void delay_op(struct pawl_store *s, struct append_op *op, int64_t due_ns);

/*
 * An append with ids whose connection was lost: append it again later (append_retry_ms), from
 * the retry thread once the pool has reconnected. Its ids make that safe: if the first try
 * committed, the retry writes nothing and reports already. 1 when it was queued.
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
    delay_op(s, op, now + (int64_t)op->lost_backoff_ms * 1000000);
    op->lost_backoff_ms = PAWL_MIN(op->lost_backoff_ms * 2, 1000);
    return 1;
}

/* Deliver the outcome: statistics, finalizer signal, the user's callback, recycling. */
static void op_finish(struct append_op *op, struct pawl_append_result *res)
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
        hist_add(&s->append_lat, (now - op->t_submit) / 1000);
        /* relaxed: a moving average (1/16 weight) only the finalizer's cadence reads. */
        long long avg = atomic_load_explicit(&s->lat_avg_ns, memory_order_relaxed);
        atomic_store_explicit(&s->lat_avg_ns, avg + (now - op->t_submit - avg) / 16,
                              memory_order_relaxed);
        pawl_metric_inc(PAWL_M_APPENDS);
        pawl_metric_add(PAWL_M_EVENTS_APPENDED, (uint64_t)op->n);
        pawl_metric_hist_record(PAWL_H_APPEND_LATENCY, now - op->t_submit);
        record_ack(s, now);
        signal_finalizer(s);
    } else {
        atomic_fetch_add_explicit(&s->appends_failed, 1, memory_order_relaxed); /* statistic */
        pawl_metric_inc(PAWL_M_APPEND_ERRORS);
        set_err(s, res->sqlstate, res->message);
    }
    pawl_append_fn cb = op->cb;
    void *ud = op->ud;
    op_put(s, op);
    if (cb)
        cb(ud, res);
    /* acq_rel: the callback's effects happen before a drainer sees the count drop. */
    if (atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_acq_rel) == 1) {
        pthread_mutex_lock(&s->op_mu);
        pthread_cond_broadcast(&s->op_cond);
        pthread_mutex_unlock(&s->op_mu);
    }
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
    return pawl_pgpool_submit(s->main, &op->req);
}

static void resolve_done(struct pawl_pgreq *req, int rc)
{
    struct append_op *op = req->ud;
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
        enc_seqs(&op->en, &res);
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
    op_finish(op, &res);
}

/* The first stream of an append, from its encoded $1 (for messages). */
static void first_stream(const struct append_op *op, char *out, size_t len)
{
    const unsigned char *p = (const unsigned char *)op->en.values[0] + 20;
    uint32_t l = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
    snprintf(out, len, "%.*s", (int)(l < 200 ? l : 200), (const char *)p + 4);
}

/* Queue op for a retry at due_ns on the retry thread (never on the I/O thread). */
static void delay_op(struct pawl_store *s, struct append_op *op, int64_t due_ns)
{
    op->due_ns = due_ns;
    pthread_mutex_lock(&s->retry_mu);
    op->next_free = s->delayed;
    s->delayed = op;
    pthread_cond_signal(&s->retry_cond);
    pthread_mutex_unlock(&s->retry_mu);
}

static void op_done(struct pawl_pgreq *req, int rc)
{
    struct append_op *op = req->ud;
    struct pawl_store *s = op->s;
    struct pawl_append_result res;
    memset(&res, 0, sizeof res);

    if (rc == PAWL_ESQL && strcmp(req->sqlstate, "55P03") == 0) {
        /*
         * lock_timeout: a transaction holds one of its streams (an outbox append not yet
         * committed). The server rolled this append back; retry it later from the retry
         * thread, off this connection's pipeline, until append_lock_wait_ms has passed.
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
            delay_op(s, op, now + (int64_t)op->lock_backoff_ms * 1000000);
            op->lock_backoff_ms = PAWL_MIN(op->lock_backoff_ms * 2, 500);
            return;
        }
        res.rc = PAWL_ETIMEDOUT;
        snprintf(res.sqlstate, sizeof res.sqlstate, "55P03");
        snprintf(res.message, sizeof res.message,
                 "stream \"%.64s\" stayed locked by another transaction for %d ms "
                 "(append_lock_wait_ms): not appended",
                 stream, s->o.append_lock_wait_ms);
        op_finish(op, &res);
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
            if (submit_op(s, op) == 0)
                return;
        }
    }
    if (rc == 0 && op->fin.appends >= 0) {
        /* The piggybacked run committed with this transaction. */
        int64_t now = pawl_now_ns();
        if (op->fin.appends > 0) {
            /* relaxed: statistics. */
            atomic_fetch_add_explicit(&s->fin_piggy, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&s->fin_appends, op->fin.appends, memory_order_relaxed);
            atomic_fetch_add_explicit(&s->fin_events, op->fin.events, memory_order_relaxed);
        }
        if (op->fin.last > 0)
            raise_index(s, op->fin.last);
        record_delays(s, op->acked_at_submit, now);
    }
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
        enc_seqs(&op->en, &res);
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
    op_finish(op, &res);
}

/*
 * The statements of one transaction of appends (one alone, or a group): each op's pawl.append in
 * the order given, then, with append_finalizes, the piggybacked finalization. Resets each op's
 * result fields; records in *acked_at_submit the acks this request's finalization will cover.
 * Returns the number of statements written to st (n + 1 at most).
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
static int append_stmts(struct pawl_store *s, struct append_op *const *ops, size_t n,
                        const struct pawl_pgstmt *one, struct pawl_pgstmt *st, struct fin_out *fin,
                        const char **fin_vals, long long *acked_at_submit)
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
    struct pawl_pgstmt fs = fin_stmt(s, s->stmt_fin_main, fin_vals, fin); /* resets fin too */
    if (s->o.append_finalizes)
        st[k++] = fs;
    /* relaxed: a lower bound; every ack counted here precedes the request's snapshot. */
    *acked_at_submit = atomic_load_explicit(&s->acked, memory_order_relaxed);
    return k;
}

static int submit_op_on(struct pawl_store *s, struct append_op *op, int conn);

static int submit_op(struct pawl_store *s, struct append_op *op)
{
    return submit_op_on(s, op, -1);
}

/* Submit op as its own transaction, on connection conn (< 0: the least loaded one). */
static int submit_op_on(struct pawl_store *s, struct append_op *op, int conn)
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
    k += append_stmts(s, &op, 1, NULL, op->stmt + k, &op->fin, op->fin_vals, &op->acked_at_submit);
    memset(&op->req, 0, sizeof op->req);
    op->req.stmts = op->stmt;
    op->req.nstmts = k;
    op->req.flags = PAWL_PGREQ_IMPLICIT;
    op->req.on_done = op_done;
    op->req.ud = op;
    return conn < 0 ? pawl_pgpool_submit(s->main, &op->req)
                    : pawl_pgpool_submit_on(s->main, conn, &op->req);
}

/* ---- group append -------------------------------------------------------------------------- */

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
    struct fin_out fin; /* the piggybacked finalization's result (append_finalizes) */
    const char *fin_vals[1];
    long long acked_at_submit;
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
    assert(n >= 1 && s->grp_inflight <= s->grp_limit);
    return g;
}

/* Give g back and take the next group from what queued meanwhile (NULL: none). */
static struct append_group *group_release(struct pawl_store *s, struct append_group *g)
{
    if (g->cap > BUF_KEEP_MAX) { /* as op_put does */
        pawl_free(g->buf);
        g->buf = NULL;
        g->cap = 0;
    }
    pthread_mutex_lock(&s->grp_mu);
    assert(s->grp_inflight > 0);
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
        enc_result_row(&g->ops[i]->en, res, (int)i);
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
    int k = append_stmts(s, g->ops, g->n, g->one ? &one : NULL, g->stmts, &g->fin, g->fin_vals,
                         &g->acked_at_submit);
    memset(&g->req, 0, sizeof g->req);
    g->req.stmts = g->stmts;
    g->req.nstmts = k;
    g->req.flags = PAWL_PGREQ_IMPLICIT;
    g->req.on_done = group_done;
    g->req.ud = g;
    return pawl_pgpool_submit(s->main, &g->req);
}

static void op_fail(struct append_op *op, int rc, const char *sqlstate, const char *msg)
{
    struct pawl_append_result res;
    memset(&res, 0, sizeof res);
    res.rc = rc;
    snprintf(res.sqlstate, sizeof res.sqlstate, "%s", sqlstate ? sqlstate : "");
    snprintf(res.message, sizeof res.message, "%s", msg);
    op_finish(op, &res);
}

/* Submit g; if the pool refuses (closing), fail its appends and go on with the next group. */
static void group_run(struct pawl_store *s, struct append_group *g)
{
    while (g != NULL) {
        group_start(s, g);
        if (group_send(g) == 0)
            return;
        for (size_t i = 0; i < g->n; i++)
            op_fail(g->ops[i], PAWL_ESHUTDOWN, "", "not appended: store closing");
        g = group_release(s, g);
    }
}

static void group_enqueue(struct pawl_store *s, struct append_op *op)
{
    struct append_group *g = NULL;
    int arm = 0;
    op->next_q = NULL;
    pthread_mutex_lock(&s->grp_mu);
    if (s->grp_tail != NULL)
        s->grp_tail->next_q = op;
    else
        s->grp_head = op;
    s->grp_tail = op;
    s->grp_queued++;
    if (s->o.append_group_linger_us == 0 || s->grp_queued >= (size_t)s->o.append_group_max)
        g = group_take_locked(s);
    /* relaxed: grp_linger_due is only set under grp_mu; the retry thread re-reads it under
     * retry_mu after the signal below. */
    else if (s->grp_inflight < s->grp_limit &&
             atomic_load_explicit(&s->grp_linger_due, memory_order_relaxed) == 0) {
        atomic_store_explicit(&s->grp_linger_due,
                              pawl_now_ns() + (int64_t)s->o.append_group_linger_us * 1000,
                              memory_order_relaxed);
        arm = 1;
    }
    pthread_mutex_unlock(&s->grp_mu);
    if (arm) {
        pthread_mutex_lock(&s->retry_mu);
        pthread_cond_signal(&s->retry_cond);
        pthread_mutex_unlock(&s->retry_mu);
    }
    group_run(s, g);
}

/* Linger expired (retry thread): start a group with what queued, if a group is free. */
static void group_linger_fire(struct pawl_store *s)
{
    pthread_mutex_lock(&s->grp_mu);
    atomic_store_explicit(&s->grp_linger_due, 0, memory_order_relaxed); /* under grp_mu */
    struct append_group *g = group_take_locked(s);
    pthread_mutex_unlock(&s->grp_mu);
    group_run(s, g);
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
        if (submit_op(op->s, op) != 0)
            op_fail(op, PAWL_ESHUTDOWN, "", "not appended: store closing");
        return;
    }
    if (op->en.status == ID_USED) {
        op_fail(op, PAWL_EIDUSED, "", op->en.id_msg);
        return;
    }
    if (op->en.rows == (int64_t)op->n) {
        res.rc = 0;
        enc_seqs(&op->en, &res);
    } else if (op->en.rows == 0) {
        res.rc = PAWL_ECONFLICT;
        snprintf(res.message, sizeof res.message,
                 "a stream is not at the expected version (stream_seq - 1 of its first event)");
    } else {
        res.rc = PAWL_ESQL;
        snprintf(res.message, sizeof res.message, "pawl.append returned %lld rows for %zu events",
                 (long long)op->en.rows, op->n);
    }
    op_finish(op, &res);
}

/* Hand op the group's failure as if it had run alone: op_done's retries, lock waits and
 * messages. Only for failures that say the same about every append of the group. */
static void op_as_single(struct append_op *op, const struct pawl_pgreq *greq, int rc)
{
    memset(&op->req, 0, sizeof op->req);
    op->req.ud = op;
    op->req.failed_stmt = greq->failed_stmt;
    op->req.conn_index = greq->conn_index;
    memcpy(op->req.sqlstate, greq->sqlstate, sizeof op->req.sqlstate);
    memcpy(op->req.message, greq->message, sizeof op->req.message);
    op->fin.appends = -2; /* no piggybacked run of its own */
    op_done(&op->req, rc);
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
 * transaction committed: RESOLVE_SQL with the group's xid, its first writing append's first
 * event (which holds k = 0) and the events the group wrote (that row's n). When only some
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
    return pawl_pgpool_submit(s->main, &g->req);
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
                op_fail(op, PAWL_EINDOUBT, "", msg);
            }
        } else if (status != NULL &&
                   (strcmp(status, "aborted") == 0 || strcmp(status, "reused") == 0)) {
            snprintf(msg, sizeof msg,
                     "connection lost during commit; the server reports the group's transaction "
                     "%s %s: not committed",
                     g->xid, strcmp(status, "aborted") == 0 ? "aborted" : "gone (restarted)");
            op_fail(op, PAWL_ECONN, "", msg);
        } else if (op->en.rows == 0) {
            /* It wrote nothing, whatever became of the others. */
            op_fail(op, PAWL_ECONN, "",
                    "connection lost during commit of a group; this append wrote nothing: not "
                    "committed");
        } else {
            snprintf(msg, sizeof msg,
                     "connection lost during commit of a group of %zu appends (transaction "
                     "%s); its outcome could not be checked (%s): unknown outcome",
                     g->n, g->xid[0] ? g->xid : "unknown", why);
            op_fail(op, PAWL_EINDOUBT, "", msg);
        }
    }
}

static void group_resolve_done(struct pawl_pgreq *req, int rc)
{
    struct append_group *g = req->ud;
    struct pawl_store *s = g->s;
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
    g->conn = req->conn_index;
    if (rc == 0) {
        if (g->fin.appends >= 0) {
            /* The piggybacked run committed with this transaction. */
            if (g->fin.appends > 0) {
                /* relaxed: statistics. */
                atomic_fetch_add_explicit(&s->fin_piggy, 1, memory_order_relaxed);
                atomic_fetch_add_explicit(&s->fin_appends, g->fin.appends, memory_order_relaxed);
                atomic_fetch_add_explicit(&s->fin_events, g->fin.events, memory_order_relaxed);
            }
            if (g->fin.last > 0)
                raise_index(s, g->fin.last);
            record_delays(s, g->acked_at_submit, pawl_now_ns());
        }
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
                op_fail(g->ops[i], PAWL_ESHUTDOWN, "", "not appended: store closing");
        } else {
            for (size_t i = 0; i < g->n; i++) {
                struct append_op *op = g->ops[i];
                op->lock_wait_start = 0;
                if (submit_op_on(s, op, g->conn) != 0)
                    op_fail(op, PAWL_ESHUTDOWN, "", "not appended: store closing");
            }
        }
    } else {
        assert(rc == PAWL_EINDOUBT);
        g->resolve_tries = 0;
        if (group_resolve_start(g) == 0)
            return; /* group_resolve_done finishes it, holding its slot meanwhile */
        group_in_doubt_finish(g, NULL, "not every append's result arrived before the loss");
    }
    group_run(s, group_release(s, g));
}

static int append_submit(struct pawl_store *s, const struct pawl_event *ev, size_t n,
                         pawl_append_fn cb, void *ud, int limit)
{
    char msg[256];
    int any = 0;
    uint32_t stack[256];
    uint32_t *ix = stack;
    if (n > 256 && n <= s->o.max_append_events && (ix = pawl_malloc(n * sizeof *ix)) == NULL) {
        set_err(s, NULL, "out of memory");
        return PAWL_ENOMEM;
    }
    int rc = validate(&s->o, ev, n, &any, ix, msg, sizeof msg);
    if (rc != 0) {
        if (ix != stack)
            pawl_free(ix);
        set_err(s, NULL, msg);
        return rc;
    }
    /* acq_rel: pairs with the decrement in op_done. */
    int cur = atomic_fetch_add_explicit(&s->inflight, 1, memory_order_acq_rel);
    if (limit && cur >= s->o.max_inflight_appends) {
        atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_acq_rel);
        if (ix != stack)
            pawl_free(ix);
        return PAWL_EAGAIN;
    }
    struct append_op *op = op_get(s);
    rc = op ? encode(&op->en, ev, n, ix) : PAWL_ENOMEM;
    if (ix != stack)
        pawl_free(ix);
    if (op == NULL)
        goto undo;
    if (rc != 0) {
        op_put(s, op);
        goto undo;
    }
    op->n = n;
    op->lock_wait_start = 0;
    op->lost_start = 0;
    op->en.notify = 0; /* this process's finalizer is signalled instead */
    op->any = any;
    op->retries = 0;
    op->cb = cb;
    op->ud = ud;
    op->t_submit = pawl_now_ns();
    if (s->o.append_group_max > 1) {
        group_enqueue(s, op);
        return 0;
    }
    rc = submit_op(s, op);
    if (rc != 0) {
        op_put(s, op);
        goto undo;
    }
    return 0;
undo:
    if (atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_acq_rel) == 1) {
        pthread_mutex_lock(&s->op_mu);
        pthread_cond_broadcast(&s->op_cond);
        pthread_mutex_unlock(&s->op_mu);
    }
    set_err(s, NULL, pawl_strerror(rc));
    return rc;
}

int pawl_append_async(struct pawl_store *s, const struct pawl_event *events, size_t n,
                      pawl_append_fn cb, void *ud)
{
    if (s == NULL)
        return PAWL_EINVAL;
    return append_submit(s, events, n, cb, ud, 1);
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
        pawl_futex_wake(word, 1);
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
        pawl_futex_wait(&w->state, SYNC_PARKED, -1);
}

int pawl_append(struct pawl_store *s, const struct pawl_event *events, size_t n,
                struct pawl_append_result *res)
{
    return pawl_append_seqs(s, events, n, NULL, res);
}

int pawl_append_seqs(struct pawl_store *s, const struct pawl_event *events, size_t n, int64_t *seqs,
                     struct pawl_append_result *res)
{
    if (s == NULL)
        return PAWL_EINVAL;
    struct sync_wait w;
    memset(&w, 0, sizeof w);
    w.seqs = seqs;
    w.n = n;
    int rc = append_submit(s, events, n, sync_cb, &w, 0);
    if (rc == 0) {
        pawl_pool_will_block(); /* on a pool worker: do not hold queued tasks while we wait */
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
    int rc = validate(&o, ev, n, &any, ix, res->message, sizeof res->message);
    struct append_enc en;
    memset(&en, 0, sizeof en);
    en.rows = -1;
    en.head1 = -1;
    en.notify = 1; /* no finalizer of ours knows about it: wake every process's at commit */
    if (rc == 0)
        rc = encode(&en, ev, n, ix);
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
    static const Oid types[9] = {OID_TEXT_ARRAY,  OID_INT8_ARRAY, OID_INT4_ARRAY,
                                 OID_INT4_ARRAY,  OID_TEXT_ARRAY, OID_BYTEA_ARRAY,
                                 OID_JSONB_ARRAY, OID_BOOL,       OID_TEXT_ARRAY};
    PGresult *r =
        PQexecParams(conn, pawl_log_append_sql, 9, types, en.values, en.lengths, en.formats, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st == PGRES_TUPLES_OK) {
        if (PQntuples(r) == 1)
            enc_result_row(&en, r, 0);
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
            enc_seqs(&en, res);
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

/* ---- the finalizer ------------------------------------------------------------------------- */

static void on_fin_result(void *ud, const PGresult *res)
{
    struct fin_out *o = ud;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1) {
        o->appends = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        o->events = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
        o->last = strtoll(PQgetvalue(res, 0, 2), NULL, 10);
    }
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
    hist_add(&s->run, run_ns / 1000);
    pawl_metric_hist_record(PAWL_H_FINALIZE_RUN, run_ns);
    if (out->last > 0) {
        raise_index(s, out->last);
        pawl_metric_gauge_max(PAWL_G_LAST_FINALIZED_INDEX, out->last);
    }
}

static int finalize_once(struct pawl_store *s, struct fin_out *out)
{
    const char *vals[1];
    struct pawl_pgstmt st = fin_stmt(s, s->fin_stmt, vals, out);
    struct pawl_pgreq req = {.stmts = &st, .nstmts = 1};
    int64_t t0 = pawl_now_ns();
    int rc = pawl_pgpool_exec(s->fin, 0, &req);
    if (rc != 0) {
        set_err(s, req.sqlstate, req.message);
        return rc;
    }
    if (out->appends == -2) {
        set_err(s, NULL, "pawl.finalize returned no row");
        return PAWL_ESQL;
    }
    fin_account(s, out, pawl_now_ns() - t0);
    return 0;
}

int pawl_finalize_now(struct pawl_store *s, int64_t *appends, int64_t *events, int64_t *last)
{
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
            hist_add(&s->delay, (t_end - t) / 1000);
            pawl_metric_hist_record(PAWL_H_FINALIZE_DELAY, t_end - t);
        }
        atomic_store_explicit(&s->covered, upto, memory_order_relaxed);
    }
    pthread_mutex_unlock(&s->cov_mu);
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
    s->fm.state = FIN_DONE;
    pthread_mutex_lock(&s->fin_mu);
    s->fin_done = 1;
    pthread_cond_broadcast(&s->fin_cond);
    pthread_mutex_unlock(&s->fin_mu);
}

static void fin_holder_done(struct pawl_pgreq *req, int rc)
{
    struct pawl_store *s = req->ud;
    struct fin_sm *m = &s->fm;
    (void)rc; /* who stays "unknown" when the query failed */
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
    return pawl_pgpool_submit(s->fin, &h->req);
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
    set_err(s, sqlstate, why);
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
    m->state = FIN_IDLE;
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
    /* acquire: pairs with the release in pawl_store_new (the statements and options). */
    if (!atomic_load_explicit(&s->fin_on, memory_order_acquire) || m->state != FIN_IDLE)
        return 0; /* a run or a query in flight: its completion comes with a pass */
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
                m->state = FIN_NAMING;
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
        int rc = pawl_pgpool_submit_on(s->fin, 0, &m->req);
        if (rc == 0) {
            m->state = FIN_RUN;
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
    if (strcmp(channel, "pawl_pending") != 0)
        return;
    signal_foreign(s);
}

static void on_fin_connect(void *ud, int conn_index, int backend_pid)
{
    struct pawl_store *s = ud;
    (void)conn_index;
    /* relaxed: on_notify compares against it on another I/O thread; a stale value only costs
     * one needless query. */
    atomic_store_explicit(&s->fin_pid, backend_pid, memory_order_relaxed);
    /* Notifications sent while the connection was down are lost: look once. */
    signal_foreign(s);
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
    /* relaxed: every access is on the listener pool's I/O thread; the atomics only keep
     * pawl_store_stats and the sanitizers happy. The loop hook runs after this pass's hooks. */
    atomic_store_explicit(&s->listen_again, 1, memory_order_relaxed);
}

/* The listener pool's on_loop hook: send the query that wake-ups asked for, when it may go. */
static int64_t listen_loop(void *ud, int64_t now)
{
    struct pawl_store *s = ud;
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
        (struct pawl_pgstmt){.sql = LAST_INDEX_SQL, .on_result = on_last_result, .ud = s};
    memset(&s->listen_req, 0, sizeof s->listen_req);
    s->listen_req.stmts = &s->listen_stmt;
    s->listen_req.nstmts = 1;
    s->listen_req.flags = PAWL_PGREQ_READONLY;
    s->listen_req.on_done = listen_req_done;
    s->listen_req.ud = s;
    atomic_fetch_add_explicit(&s->index_queries, 1, memory_order_relaxed);
    /* Not pinned: while the connection is down the query waits for the next one, which runs
     * LISTEN first, so nothing committed before the query is missed. */
    if (pawl_pgpool_submit(s->listen, &s->listen_req) != 0) {
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
        raise_index(s, strtoll(PQgetvalue(res, 0, 0), NULL, 10));
}

static void listen_req_done(struct pawl_pgreq *req, int rc)
{
    struct pawl_store *s = req->ud;
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

/* ---- reading ------------------------------------------------------------------------------- */
/*
 * Readers survive lost connections: a read that lost its connection runs again from the same
 * position once the pool has reconnected (pawl_read_until), so a caller never sees an outage
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

static int64_t get64(const char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return (int64_t)__builtin_bswap64(v);
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
 * One read, no retry: after is an index (READ_STREAM: a stream sequence number). On failure the
 * store's error is set and the server's SQLSTATE (or "") copied to sqlstate.
 */
static int read_once(struct pawl_store *s, struct read_q *q, int64_t after, size_t max,
                     struct pawl_read_batch *b, char sqlstate[6], int on_standby, int *not_standby)
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
    struct pawl_sb_check check = {0};
    if (on_standby)
        pawl_standby_check_stmt(s->sb, &st[1], &check);
    struct pawl_pgreq req = {
        .stmts = st, .nstmts = on_standby ? 2 : 1, .flags = PAWL_PGREQ_READONLY};
    int rc = pawl_pgpool_exec(on_standby ? pawl_standby_pool(s->sb) : s->main, -1, &req);
    if (rc == 0 && on_standby && !(check.ok && check.in_recovery)) {
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
        set_err(s, req.sqlstate, req.message[0] ? req.message : "read failed");
        if (res)
            PQclear(res);
        return rc;
    }
    size_t n = (size_t)PQntuples(res);
    if (q->kind == READ_FILTERED) {
        /* The last row is the position row. */
        if (n == 0 || !PQgetisnull(res, (int)n - 1, 1)) {
            set_err(s, NULL, "the filtered read returned no position row");
            PQclear(res);
            return PAWL_ESQL;
        }
        n--;
        q->position = get64(PQgetvalue(res, (int)n, 0));
        if (q->position < after) {
            set_err(s, NULL, "the filtered read went backwards");
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
            set_err(s, NULL, broken);
            PQclear(res);
            b->count = 0;
            return PAWL_ESQL;
        }
    }
    b->count = n;
    b->_res = res;
    if (q->kind == READ_FILTERED)
        raise_index(s, q->position);
    else if (n > 0)
        raise_index(s, b->events[n - 1].index);
    return 0;
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

/*
 * Sleep up to ns as a waiter on idx_cond (so that pawl_store_free wakes us and waits for us).
 * Returns PAWL_ESHUTDOWN when the store is being freed, else 0.
 */
static int reader_sleep(struct pawl_store *s, int64_t ns)
{
    int64_t until = pawl_now_ns() + ns;
    int rc = 0;
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
        pawl_timed_wait(s->timers, &s->idx_mu, &s->idx_cond, CLOCK_MONOTONIC, left);
    }
    if (--s->waiters == 0 && s->shutdown)
        pthread_cond_broadcast(&s->waiters_cond);
    pthread_mutex_unlock(&s->idx_mu);
    return rc;
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
    int rc = pawl_pgpool_exec(s->main, -1, &req);
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
    int rc = reader_sleep(s, wait);
    if (rc != 0)
        return rc;
    long long cur = atomic_load_explicit(&s->last_index, memory_order_relaxed);
    int64_t told;
    if (log_last_index(s, &told) != 0)
        return 0; /* the next read retries (or reports) whatever went wrong */
    if (told > after)
        return 0; /* the log has them: the next read should find them */
    pthread_mutex_lock(&s->idx_mu);
    int lowered = atomic_load_explicit(&s->last_index, memory_order_relaxed) == cur;
    if (lowered)
        atomic_store_explicit(&s->last_index, told, memory_order_relaxed);
    pthread_mutex_unlock(&s->idx_mu);
    int64_t again;
    if (log_last_index(s, &again) == 0)
        raise_index(s, again);
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

int pawl_read_until(struct pawl_store *s, int64_t after, size_t max, struct pawl_read_batch *b,
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

static int read_loop(struct pawl_store *s, struct read_q *q, int64_t after, size_t max,
                     struct pawl_read_batch *b, int64_t deadline_ns)
{
    int64_t pause = 10000000; /* 10 ms, doubling to 1 s between retries of this call */
    int primary = 0;          /* this call reads from the primary in the standby's stead */
    for (;;) {
        /* relaxed: a snapshot; the read below is sent after it. */
        int64_t known = atomic_load_explicit(&s->last_index, memory_order_relaxed);
        char ss[6];
        int rc, on_sb = s->sb && !primary && pawl_standby_route(s->sb) == PAWL_SB_STANDBY;
        if (on_sb) {
            int not_sb = 0;
            if (pawl_pgpool_ready(pawl_standby_pool(s->sb)) == 0) {
                char why[256], m[300];
                pawl_pgpool_last_error(pawl_standby_pool(s->sb), why, sizeof why);
                snprintf(m, sizeof m, "no connection to the standby: %s", why);
                set_err(s, NULL, m);
                ss[0] = '\0';
                rc = PAWL_ECONN;
            } else {
                rc = read_once(s, q, after, max, b, ss, 1, &not_sb);
            }
            enum pawl_sb_outcome what;
            if (rc == 0)
                what = not_sb                                             ? PAWL_SB_NOT_STANDBY
                       : read_found_nothing(q, after, b) && known > after ? PAWL_SB_BEHIND
                                                                          : PAWL_SB_GOT;
            else if (read_lost(rc, ss))
                what = PAWL_SB_LOST;
            else
                return rc;
            int64_t wait;
            switch (pawl_standby_outcome(s->sb, what, after, known, &wait)) {
            case PAWL_SB_USE:
                break;
            case PAWL_SB_PRIMARY:
                primary = 1;
                continue;
            case PAWL_SB_WAIT:
                b->count = 0;
                if (deadline_ns > 0)
                    wait = PAWL_MIN(wait, PAWL_MAX(deadline_ns - pawl_now_ns(), 0));
                return reader_sleep(s, wait);
            case PAWL_SB_OUTAGE:
                break;
            }
        } else {
            int not_sb;
            if (s->sb)
                pawl_standby_note_primary_read(s->sb);
            rc = read_once(s, q, after, max, b, ss, 0, &not_sb);
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
            set_err(s, NULL, msg);
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
        rc = reader_sleep(s, nap);
        if (rc != 0)
            return rc;
    }
}

int pawl_read(struct pawl_store *s, int64_t after, size_t max, struct pawl_read_batch *b)
{
    return pawl_read_until(s, after, max, b, 0);
}

int pawl_follow(struct pawl_store *s, int64_t after, size_t max, struct pawl_read_batch *b,
                int timeout_ms)
{
    int64_t deadline = timeout_ms >= 0 ? pawl_now_ns() + (int64_t)timeout_ms * 1000000 : 0;
    for (;;) {
        int rc = pawl_read_until(s, after, max, b, deadline);
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
            rc = pawl_read_until(s, after, max, b, deadline);
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
        set_err(s, NULL, m);
        return PAWL_EINVAL;
    }
    const char *const *v[3] = {f->categories, f->stream_prefixes, f->types};
    size_t n[3] = {f->n_categories, f->n_stream_prefixes, f->n_types};
    for (int i = 0; i < 3; i++) {
        if (n[i] == 0)
            continue;
        char *lit = pawl_filter_array_literal(v[i], n[i]);
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

int pawl_read_filtered_until(struct pawl_store *s, int64_t after, size_t max,
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
        set_err(s, NULL,
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

/* ---- statistics ---------------------------------------------------------------------------- */

void pawl_store_stats(struct pawl_store *s, struct pawl_store_stats *st, int reset)
{
    memset(st, 0, sizeof *st);
    /* relaxed: statistics. */
#define LD(x) atomic_load_explicit(&s->x, memory_order_relaxed)
    st->appends_ok = LD(appends_ok);
    st->events_ok = LD(events_ok);
    st->appends_failed = LD(appends_failed);
    st->append_retries = LD(retries);
    st->append_lock_timeouts = LD(lock_timeouts);
    st->append_lost_retries = LD(lost_retries);
    st->appends_pending = LD(acked) - LD(covered);
    st->inflight = LD(inflight);
    st->finalize_runs = LD(fin_runs);
    st->finalize_piggybacked = LD(fin_piggy);
    st->finalize_skipped = LD(fin_skipped);
    st->finalize_idle_runs = LD(fin_idle);
    st->finalize_busy = LD(fin_busy);
    st->finalize_errors = LD(fin_errors);
    st->appends_finalized = LD(fin_appends);
    st->events_finalized = LD(fin_events);
    st->last_index = LD(last_index);
    hist_read(&s->delay, &st->delay_count, &st->delay_p50_ms, &st->delay_p99_ms, &st->delay_max_ms,
              reset);
    hist_read(&s->run, &st->run_count, &st->run_p50_ms, &st->run_p99_ms, &st->run_max_ms, reset);
    int64_t c;
    hist_read(&s->append_lat, &c, &st->append_p50_ms, &st->append_p99_ms, &st->append_max_ms,
              reset);
    st->finalizer_interval_ms = (double)LD(fin_interval_ns) / 1e6;
    st->finalizer_run_avg_ms = (double)LD(run_avg_ns) / 1e6;
    st->append_latency_avg_ms = (double)LD(lat_avg_ns) / 1e6;
    st->read_retries = LD(rd_retries);
    st->read_reconnects = LD(rd_reconnects);
    st->read_gaps = LD(rd_gaps);
    st->notifications = LD(notifies);
    st->index_queries = LD(index_queries);
    st->own_notifications = LD(notifies_own);
    st->standby_replay_delay_ms = -1;
    if (s->sb)
        pawl_standby_stats(s->sb, &st->standby_reads, &st->standby_fallback_reads,
                           &st->standby_episodes, &st->standby_fallback_active,
                           &st->standby_replay_delay_ms);
    st->append_groups = LD(groups_ok);
    st->append_groups_appends = LD(groups_appends);
#undef LD
}

/* ---- delayed retries ------------------------------------------------------------------------- */

static void *retry_main(void *arg)
{
    struct pawl_store *s = arg;
    pthread_mutex_lock(&s->retry_mu);
    for (;;) {
        int64_t now = pawl_now_ns(), next = 0;
        struct append_op *due = NULL, **pp = &s->delayed;
        while (*pp) {
            struct append_op *op = *pp;
            if (op->due_ns <= now) {
                *pp = op->next_free;
                op->next_free = due;
                due = op;
            } else {
                if (next == 0 || op->due_ns < next)
                    next = op->due_ns;
                pp = &op->next_free;
            }
        }
        if (due) {
            pthread_mutex_unlock(&s->retry_mu);
            while (due) {
                struct append_op *op = due;
                due = op->next_free;
                op->next_free = NULL;
                if (submit_op(s, op) != 0) {
                    struct pawl_append_result res;
                    memset(&res, 0, sizeof res);
                    res.rc = PAWL_ESHUTDOWN;
                    snprintf(res.message, sizeof res.message, "not appended: store closing");
                    op_finish(op, &res);
                }
            }
            pthread_mutex_lock(&s->retry_mu);
            continue;
        }
        /* relaxed: set under grp_mu and signalled under retry_mu, which we hold. */
        int64_t ldue = atomic_load_explicit(&s->grp_linger_due, memory_order_relaxed);
        if (ldue != 0 && ldue <= now) {
            pthread_mutex_unlock(&s->retry_mu);
            group_linger_fire(s);
            pthread_mutex_lock(&s->retry_mu);
            continue;
        }
        if (ldue != 0 && (next == 0 || ldue < next))
            next = ldue;
        if (s->retry_stop)
            break;
        if (next == 0) {
            pthread_cond_wait(&s->retry_cond, &s->retry_mu);
        } else {
            pawl_timed_wait(s->timers, &s->retry_mu, &s->retry_cond, CLOCK_MONOTONIC, next - now);
        }
    }
    pthread_mutex_unlock(&s->retry_mu);
    return NULL;
}

/* ---- life cycle ---------------------------------------------------------------------------- */

static int new_pool(struct pawl_store *s, struct pawl_pgpool **out, const char *name, int conns,
                    const char *const *session, int hooks, char *err, size_t errlen)
{
    struct pawl_pgpool_opts po;
    pawl_pgpool_opts_defaults(&po);
    po.name = name;
    po.connections = conns;
    po.reconnect_min_ms = s->o.reconnect_min_ms;
    po.reconnect_max_ms = s->o.reconnect_max_ms;
    po.connect_timeout_ms = s->o.connect_timeout_ms;
    po.queue_timeout_ms = s->o.queue_timeout_ms;
    po.session_sql = session;
    po.io_backend = s->o.io_backend;
    if (hooks == 1) {
        po.on_notify = on_notify;
        po.on_connect = on_listen_connect;
        po.on_loop = listen_loop;
        po.hook_ud = s;
    } else if (hooks == 2) {
        po.on_notify = on_fin_notify;
        po.on_connect = on_fin_connect;
        po.on_loop = s->o.finalizer ? fin_loop : NULL;
        po.hook_ud = s;
    }
    return pawl_pgpool_new(out, s->dsn, &po, s->o.open_timeout_ms, err, errlen);
}

static void stop_retry(struct pawl_store *s)
{
    if (!s->retry_started)
        return;
    pthread_mutex_lock(&s->retry_mu);
    s->retry_stop = 1;
    pthread_cond_signal(&s->retry_cond);
    pthread_mutex_unlock(&s->retry_mu);
    pthread_join(s->retry_thread, NULL);
    s->retry_started = 0;
}

int pawl_store_new(struct pawl_store **out, const char *dsn, const struct pawl_store_opts *o,
                   char *err, size_t errlen)
{
    struct pawl_store_opts def;
    if (o == NULL) {
        pawl_store_opts_defaults(&def);
        o = &def;
    }
    if (err && errlen)
        err[0] = '\0';
    if (out == NULL)
        return PAWL_EINVAL;
    *out = NULL;
    char bad[160];
    int rc = check_opts(o, bad, sizeof bad);
    if (rc != 0) {
        if (err && errlen)
            snprintf(err, errlen, "%s", bad);
        return rc;
    }
    char e[512];
    if (pawl_dsn_check(dsn, e, sizeof e) != 0) {
        if (err && errlen)
            snprintf(err, errlen, "invalid DSN: %s", e);
        return PAWL_EINVAL;
    }
    if (o->migrate) {
        rc = pawl_schema_migrate(dsn, err, errlen);
        if (rc != 0)
            return rc;
    }
    /* One connection for the version and, when this store finalizes, whether it is a standby. */
    int dbv = 0, libv = pawl_schema_lib_version(), standby = 0;
    rc = pawl_schema_probe(dsn, &dbv, &standby, err, errlen);
    if (rc != 0)
        return rc;
    if (dbv != libv) {
        if (err && errlen) {
            if (dbv > libv)
                snprintf(err, errlen,
                         "the database schema is version %d, newer than this pawl (which knows "
                         "up to version %d): upgrade pawl",
                         dbv, libv);
            else
                snprintf(err, errlen,
                         "the database schema is version %d and this pawl needs version %d: "
                         "run `pawl init` (or set migrate)",
                         dbv, libv);
        }
        return PAWL_ESCHEMA;
    }
    if (standby && o->finalizer)
        return pawl_schema_standby_error(dsn, "finalization (the store's finalizer)", err, errlen);

    struct pawl_store *s = pawl_calloc(1, sizeof *s);
    if (s == NULL)
        return PAWL_ENOMEM;
    s->o = *o;
    pthread_mutex_init(&s->err_mu, NULL);
    pthread_mutex_init(&s->cov_mu, NULL);
    pthread_mutex_init(&s->op_mu, NULL);
    pthread_cond_init(&s->op_cond, NULL);
    pthread_mutex_init(&s->idx_mu, NULL);
    pawl_cond_init_monotonic(&s->idx_cond);
    pthread_cond_init(&s->waiters_cond, NULL);
    pthread_mutex_init(&s->fin_mu, NULL);
    pawl_cond_init_monotonic(&s->fin_cond);
    pthread_mutex_init(&s->retry_mu, NULL);
    pawl_cond_init_monotonic(&s->retry_cond);
    pthread_mutex_init(&s->grp_mu, NULL);
    rc = PAWL_ENOMEM;
    s->grp_limit = o->connections;
    for (int i = 0; i < s->grp_limit; i++) {
        struct append_group *g = group_new(s);
        if (g == NULL)
            goto fail;
        g->next_free = s->grp_free;
        s->grp_free = g;
    }
    s->dsn = pawl_strdup(dsn);
    s->ring = pawl_calloc(ACK_RING, sizeof *s->ring);
    if (s->dsn == NULL || s->ring == NULL)
        goto fail;
    struct pawl_timers_opts to;
    pawl_timers_opts_defaults(&to);
    to.backend = (enum pawl_timer_backend)o->io_backend;
    rc = pawl_timers_new(&s->timers, NULL, &to);
    if (rc != 0) {
        if (err && errlen)
            snprintf(err, errlen, "cannot start the store's timers: %s",
                     rc == PAWL_ENOTSUP ? "io_uring is required and refused" : pawl_strerror(rc));
        goto fail;
    }

    /*
     * What pawl relies on, pinned whatever the database or role defaults say: read committed
     * (finalize's snapshot must follow its lock; appends retry their own conflicts), writable
     * sessions, and for the finalizer a durable commit (a run is flushed, or replicated when
     * so configured, before any reader can see it: a stronger setting stays) and no timeouts
     * (its work is bounded by the backlog). The append and read sessions pin no statement
     * timeout either: their lock waits are bounded by lock_timeout below, a read by its batch
     * size, and a default meant for applications' queries would fail them at random. LISTEN
     * pawl_pending: appends made in other processes' own transactions (pawl_api.append,
     * pawl_append_in).
     */
    static const char fin_sync_sql[] =
        "SELECT set_config('synchronous_commit', 'on', false)"
        " WHERE current_setting('synchronous_commit') IN ('off', 'local')";
    const char *const fin_session[] = {"SET application_name = 'pawl finalizer'",
                                       "SET default_transaction_isolation = 'read committed'",
                                       "SET default_transaction_read_only = off",
                                       fin_sync_sql,
                                       "SET statement_timeout = 0",
                                       "SET idle_in_transaction_session_timeout = 0",
                                       o->finalizer ? "LISTEN pawl_pending" : NULL,
                                       NULL};
    /* Generic plans for the append statement (and the rest: reads, in-doubt checks): with
     * the default plan_cache_mode PostgreSQL re-plans the append on every call (docs/log.md
     * has the cost); the generic plan is the custom one (a hash join of the arrays, one index
     * probe per stream). */
    /* lock_timeout: an append that waits for a stream held by an open transaction is rolled
     * back after append_lock_timeout_ms and retried off the pipeline (see op_done), so one
     * stuck stream does not stall the appends queued behind it to other streams. */
    snprintf(s->lock_sql, sizeof s->lock_sql, "SET lock_timeout = %d", o->append_lock_timeout_ms);
    {
        /* Appends keep the database's synchronous_commit (the user's durability choice), unless
         * they carry piggybacked finalization runs: pawl.finalize refuses a non-durable commit. */
        const char *ms[] = {"SET application_name = 'pawl'",
                            "SET plan_cache_mode = force_generic_plan",
                            "SET default_transaction_isolation = 'read committed'",
                            "SET default_transaction_read_only = off",
                            "SET statement_timeout = 0",
                            s->lock_sql,
                            o->append_finalizes ? fin_sync_sql : NULL,
                            NULL};
        memcpy(s->main_session, ms, sizeof ms);
    }
    static const char *const listen_session[] = {"SET application_name = 'pawl listener'",
                                                 "LISTEN pawl_log", NULL};
    rc = new_pool(s, &s->main, "log", o->connections, s->main_session, 0, err, errlen);
    if (rc != 0)
        goto fail;
    rc = new_pool(s, &s->fin, "finalizer", 1, fin_session, 2, err, errlen);
    if (rc != 0)
        goto fail;
    s->o.read_dsn = NULL; /* the caller's: the standby's pool keeps its own copy */
    if (o->read_dsn && o->read_dsn[0]) {
        static const Oid rd_types[2] = {OID_INT8, OID_INT4};
        rc = pawl_standby_new(&s->sb, dsn, o, s->timers, raise_index_cb, s, err, errlen);
        if (rc != 0)
            goto fail;
        static const Oid rdf_types[5] = {OID_INT8, OID_INT4, OID_TEXT_ARRAY, OID_TEXT_ARRAY,
                                         OID_TEXT_ARRAY};
        static const Oid rds_types[3] = {OID_INT8, OID_INT4, OID_TEXT};
        struct pawl_pgpool *sbp = pawl_standby_pool(s->sb);
        s->stmt_read_sb = pawl_pgpool_prepare(sbp, READ_SQL, 2, rd_types);
        s->stmt_read_f_sb = pawl_pgpool_prepare(sbp, READ_FILTERED_SQL, 5, rdf_types);
        s->stmt_read_s_sb = pawl_pgpool_prepare(sbp, READ_STREAM_SQL, 3, rds_types);
        if (s->stmt_read_sb < 0 || s->stmt_read_f_sb < 0 || s->stmt_read_s_sb < 0) {
            rc = PAWL_ENOMEM;
            goto fail;
        }
    }
    /* Followers wake by LISTEN on the primary, unless the standby is polled instead. A
     * standby refuses LISTEN (and NOTIFY is not replicated): a store opened on one (it does
     * not finalize) has no listener, and its followers find new events when they read again
     * (pawl_follow at its timeout). */
    if (o->listen && standby) {
        char d[256];
        PAWL_INFO("log",
                  "the database at %s is a standby (in recovery), which cannot LISTEN: followers "
                  "see new events when they look again, not at once (to be woken, give the "
                  "primary as the DSN and the standby as the read DSN)",
                  pawl_dsn_redact(dsn, d, sizeof d));
    }
    if (o->listen && !standby && !(s->sb && o->read_wake == PAWL_READ_WAKE_POLL)) {
        rc = new_pool(s, &s->listen, "listener", 1, listen_session, 1, err, errlen);
        if (rc != 0)
            goto fail;
    }
    static const Oid append_types[9] = {OID_TEXT_ARRAY,  OID_INT8_ARRAY, OID_INT4_ARRAY,
                                        OID_INT4_ARRAY,  OID_TEXT_ARRAY, OID_BYTEA_ARRAY,
                                        OID_JSONB_ARRAY, OID_BOOL,       OID_TEXT_ARRAY};
    static const Oid read_types[2] = {OID_INT8, OID_INT4};
    s->stmt_append = pawl_pgpool_prepare(s->main, pawl_log_append_sql, 9, append_types);
    static const Oid group_types[10] = {
        OID_TEXT_ARRAY, OID_INT8_ARRAY,  OID_INT4_ARRAY,  OID_INT4_ARRAY, OID_INT4_ARRAY,
        OID_TEXT_ARRAY, OID_BYTEA_ARRAY, OID_JSONB_ARRAY, OID_BOOL,       OID_TEXT_ARRAY};
    s->stmt_append_group = pawl_pgpool_prepare(s->main, APPEND_GROUP_SQL, 10, group_types);
    s->stmt_read = pawl_pgpool_prepare(s->main, READ_SQL, 2, read_types);
    static const Oid readf_types[5] = {OID_INT8, OID_INT4, OID_TEXT_ARRAY, OID_TEXT_ARRAY,
                                       OID_TEXT_ARRAY};
    static const Oid reads_types[3] = {OID_INT8, OID_INT4, OID_TEXT};
    s->stmt_read_f = pawl_pgpool_prepare(s->main, READ_FILTERED_SQL, 5, readf_types);
    s->stmt_read_s = pawl_pgpool_prepare(s->main, READ_STREAM_SQL, 3, reads_types);
    s->stmt_last = pawl_pgpool_prepare(s->main, LAST_INDEX_SQL, 0, NULL);
    static const Oid resolve_types[5] = {0, OID_TEXT_ARRAY, OID_TEXT_ARRAY, OID_BYTEA_ARRAY,
                                         OID_INT4};
    s->stmt_resolve = pawl_pgpool_prepare(s->main, RESOLVE_SQL, 5, resolve_types);
    s->stmt_fin_main = pawl_pgpool_prepare(s->main, FINALIZE_SQL, 1, NULL);
    snprintf(s->fin_batch_text, sizeof s->fin_batch_text, "%d", o->finalize_batch_max);
    s->fin_stmt = pawl_pgpool_prepare(s->fin, FINALIZE_SQL, 1, NULL);
    if (s->stmt_append < 0 || s->stmt_append_group < 0 || s->stmt_read < 0 || s->stmt_last < 0 ||
        s->stmt_read_f < 0 || s->stmt_read_s < 0 || s->fin_stmt < 0 || s->stmt_resolve < 0 ||
        s->stmt_fin_main < 0) {
        rc = PAWL_ENOMEM;
        goto fail;
    }
    {
        int64_t last = 0;
        struct pawl_pgstmt st = {.prepared = s->stmt_last, .on_result = on_last_result, .ud = s};
        struct pawl_pgreq req = {.stmts = &st, .nstmts = 1, .flags = PAWL_PGREQ_READONLY};
        (void)last;
        rc = pawl_pgpool_exec(s->main, -1, &req);
        if (rc != 0) {
            if (err && errlen)
                snprintf(err, errlen, "%s%s%s", req.sqlstate, req.sqlstate[0] ? ": " : "",
                         req.message);
            goto fail;
        }
    }
    if (pthread_create(&s->retry_thread, NULL, retry_main, s) != 0) {
        rc = PAWL_ESYS;
        goto fail;
    }
    pthread_setname_np(s->retry_thread, "pawl-retry");
    s->retry_started = 1;
    if (o->finalizer) {
        struct fin_sm *m = &s->fm;
        m->state = FIN_IDLE;
        m->rerun = 1; /* a first run at once: appends committed while no finalizer ran */
        m->next_safety = pawl_now_ns() + (int64_t)s->o.finalizer_safety_interval_ms * 1000000;
        m->err_backoff_ms = 10;
        m->busy_ms = s->o.finalizer_retry_ms;
        s->fin_started = 1;
        /* release: the loop's thread sees the state machine and the statements whole. */
        atomic_store_explicit(&s->fin_on, 1, memory_order_release);
        pawl_pgpool_wake(s->fin);
    }
    *out = s;
    return 0;

fail:
    stop_retry(s);
    pawl_standby_free(s->sb);
    pawl_pgpool_free(s->listen);
    pawl_pgpool_free(s->fin);
    pawl_pgpool_free(s->main);
    pawl_timers_free(s->timers); /* nothing waits on them any more */
    pawl_free(s->ring);
    pawl_free(s->dsn);
    pthread_cond_destroy(&s->fin_cond);
    pthread_mutex_destroy(&s->fin_mu);
    while (s->grp_free) {
        struct append_group *g = s->grp_free;
        s->grp_free = g->next_free;
        group_free(g);
    }
    pthread_mutex_destroy(&s->grp_mu);
    pthread_cond_destroy(&s->retry_cond);
    pthread_mutex_destroy(&s->retry_mu);
    pthread_cond_destroy(&s->waiters_cond);
    pthread_cond_destroy(&s->idx_cond);
    pthread_mutex_destroy(&s->idx_mu);
    pthread_cond_destroy(&s->op_cond);
    pthread_mutex_destroy(&s->op_mu);
    pthread_mutex_destroy(&s->err_mu);
    pthread_mutex_destroy(&s->cov_mu);
    pawl_free(s);
    return rc;
}

void pawl_store_free(struct pawl_store *s)
{
    if (s == NULL)
        return;
    pawl_store_drain(s);
    stop_retry(s);
    if (s->fin_started) {
        atomic_store(&s->fin_stop, 1); /* seq_cst: read by fin_loop after the wake-up */
        pawl_pgpool_wake(s->fin);
        /* The state machine ends by itself within STOP_DEADLINE_NS plus one holder query (which
         * waits for a connection at most queue_timeout_ms); past that its loop is gone or the
         * server hangs, and the pool's shutdown fails what is in flight. */
        int64_t bound = STOP_DEADLINE_NS + (int64_t)s->o.queue_timeout_ms * 1000000 +
                        (int64_t)s->o.connect_timeout_ms * 1000000 + 5000000000LL;
        int64_t until = pawl_now_ns() + bound, left;
        pthread_mutex_lock(&s->fin_mu);
        while (!s->fin_done && (left = until - pawl_now_ns()) > 0)
            pawl_timed_wait(s->timers, &s->fin_mu, &s->fin_cond, CLOCK_MONOTONIC, left);
        int done = s->fin_done;
        pthread_mutex_unlock(&s->fin_mu);
        if (!done)
            PAWL_WARN("finalizer", "the finalizer did not stop within %lld s; closing anyway",
                      (long long)(bound / 1000000000));
    }
    pthread_mutex_lock(&s->idx_mu);
    s->shutdown = 1;
    pthread_cond_broadcast(&s->idx_cond);
    while (s->waiters > 0)
        pthread_cond_wait(&s->waiters_cond, &s->idx_mu);
    pthread_mutex_unlock(&s->idx_mu);
    pawl_standby_free(s->sb);
    pawl_pgpool_free(s->listen);
    pawl_pgpool_free(s->fin);
    pawl_pgpool_free(s->main);
    while (s->free_ops) {
        struct append_op *op = s->free_ops;
        s->free_ops = op->next_free;
        pawl_free(op->en.buf);
        pawl_free(op->en.seqs);
        pawl_free(op);
    }
    pawl_timers_free(s->timers); /* nothing waits on them any more */
    pawl_free(s->ring);
    pawl_free(s->dsn);
    pthread_cond_destroy(&s->fin_cond);
    pthread_mutex_destroy(&s->fin_mu);
    while (s->grp_free) {
        struct append_group *g = s->grp_free;
        s->grp_free = g->next_free;
        group_free(g);
    }
    pthread_mutex_destroy(&s->grp_mu);
    pthread_cond_destroy(&s->retry_cond);
    pthread_mutex_destroy(&s->retry_mu);
    pthread_cond_destroy(&s->waiters_cond);
    pthread_cond_destroy(&s->idx_cond);
    pthread_mutex_destroy(&s->idx_mu);
    pthread_cond_destroy(&s->op_cond);
    pthread_mutex_destroy(&s->op_mu);
    pthread_mutex_destroy(&s->err_mu);
    pthread_mutex_destroy(&s->cov_mu);
    pawl_free(s);
}
