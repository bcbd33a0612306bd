/*
 * log_internal.h — the event store (store/log/): struct pawl_store and what its rooms share.
 * Private to the files of store/log/; tests and benchmarks see ../log_int.h, not this. Shared
 * functions carry the prefix pawl__log_ (hidden, like every symbol without PAWL_API), so none
 * can be taken for public API.
 *
 * Pieces and threads (see pawl/log.h, sql/001_log.sql and sql/006_log_guarantees.sql for the
 * data model and its proofs):
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
 *     durable synchronous_commit and no timeouts (see store.c).
 *   - listener pool (1 connection, LISTEN pawl_log): other processes' runs.
 *   - the store's timers (no pool, one thread): every timed wait's deadline, and two kinds of
 *     inline timer whose callbacks run on that thread, holding no lock of the store's when
 *     called: an append's delayed retry (append_op.c), which submits it again, and the group
 *     linger (group.c), which starts a group. Neither blocks: a submit only queues.
 * All three raise `last_index` and broadcast idx_cond, on which followers block.
 *
 * Invariants: `last_index` only grows (updated under idx_mu), except where a reader finds it
 * ahead of the log itself and lowers it to the log's word (read_gap). An append op is
 * owned by the caller until submitted, then by the pool until on_done (by the store's timers
 * while a delayed retry waits), then returns to the free list; the user callback runs before it
 * is recycled. `inflight` counts submitted ops, delayed ones included.
 *
 * The rooms, lowest first. Each file's first comment says what it owns, which lock guards it
 * and which thread may call it; a room calls the rooms before it in this list.
 *   wire.c        an append's parameters: validation, binary encoding, its result row read back
 *   stats.c       latency histograms, pawl_store_stats and the last error (err_mu)
 *   index.c       the highest known index, those who wait on it, the listener (idx_mu)
 *   finalizer.c   the finalizer's state machine, commit acks, finalize delays, and the runs
 *                 piggybacked on appends (struct fin_piggy, opaque to the rooms above it)
 *                 (fin_mu, cov_mu)
 *   append_op.c   one append: its statement, completion, retries (a delayed one is a timer on
 *                 the store's timers), in-doubt check (op_mu)
 *   group.c       group append, and its linger: a timer on the store's timers (grp_mu)
 *   append.c      the append API: async, blocking, and in the caller's transaction
 *   reader.c      reads and follows, with standby routing behind one call
 *   store.c       options and the life cycle: pawl_store_new in named steps, pawl_store_free
 * Fields of struct pawl_store belong to the room named in their group's comment.
 */
#ifndef PAWL_STORE_LOG_INTERNAL_H
#define PAWL_STORE_LOG_INTERNAL_H

#include "pawl/log.h"
#include "pawl/runtime.h"

#include "common.h"
#include "log_int.h"
#include "pgconn.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

/* How often an append (or a group) that failed with a retryable error (deadlock, serialization
 * failure, a unique violation it may cure) runs again. */
#define ANY_RETRIES 16
/* The commit acknowledgements kept for finalize delays (a power of two). */
#define ACK_RING 65536
/* A statement buffer larger than this goes back to the allocator when its append or group is
 * recycled, so that one burst of big appends does not pin its memory. */
#define BUF_KEEP_MAX (1u << 20)
/* The in-doubt check's budget (pawl__log_resolve_sql): one per "in progress" answer. */
#define RESOLVE_TRIES 100
/* A check that itself failed (its connection lost, no connection within queue_timeout_ms)
 * uses a third of the budget: at most three such failures before "unknown outcome". */
#define RESOLVE_ERROR_COST 34

/* A latency histogram, log-linear in µs (stats.c). */
#define HIST_SUB 16
#define HIST_BUCKETS (HIST_SUB + 40 * HIST_SUB)

struct hist {
    atomic_llong n[HIST_BUCKETS];
    atomic_llong count;
    atomic_llong max;
};

struct append_op;
struct append_group;

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
    /* The life cycle's (store.c): set up before any other thread runs, then read-only. */
    struct pawl_store_opts o;
    char *dsn;
    struct pawl_pgpool *main;
    struct pawl_pgpool *fin;
    struct pawl_pgpool *listen;
    struct pawl_timers *timers; /* every timed wait's deadline (pawl__timed_wait); no pool */
    int stmt_append, stmt_append_group, stmt_read, stmt_last, stmt_resolve, stmt_fin_main;
    struct pawl_standby *sb;      /* read_dsn: where reads go (standby.c); NULL: the main pool */
    int stmt_read_sb;             /* pawl__log_read_sql on the standby's pool */
    int stmt_read_f, stmt_read_s; /* the filtered and the stream read (reader.c) */
    int stmt_read_f_sb, stmt_read_s_sb; /* the same on the standby's pool */
    char fin_batch_text[16];
    pthread_mutex_t cov_mu; /* finalizer.c, record_delays: covered and the delay histogram */
    int fin_stmt;

    pthread_mutex_t err_mu; /* stats.c: the last failure's text */
    char last_err[512];

    /* append_op.c's two retry episodes, and the main pool's session settings (store.c). */
    atomic_int lock_episode; /* a lock-timeout episode was logged and has not ended */
    atomic_int lost_episode; /* a lost-connection retry episode was logged (append_retry_ms) */
    const char *main_session[10];
    char lock_sql[48];

    /* Group append: ops waiting for a group (FIFO through next_q), the groups not in flight,
     * how many are (at most grp_limit = connections), and whether the linger timer is armed.
     * All under grp_mu (group.c). The timer itself is the timers' (its callback takes grp_mu). */
    pthread_mutex_t grp_mu;
    struct append_op *grp_head, *grp_tail;
    size_t grp_queued;
    struct append_group *grp_free;
    int grp_inflight, grp_limit;
    int grp_linger_armed;
    struct pawl_timer grp_linger;
    atomic_llong groups_ok, groups_appends;

    /* Blocking appends on the caller's thread (direct.c): the connection and its state, used
     * by one caller at a time (mu). */
    struct direct {
        pthread_mutex_t mu;
        PGconn *pg;
        int fatal_idle;      /* the server ended the session while it was idle */
        int eligible;        /* blocking appends that found the store idle while pg was NULL */
        int backoff_ms;      /* the next reconnect's delay */
        int64_t retry_at_ns; /* no reconnect before */
    } direct;
    atomic_llong direct_appends; /* appends answered on it (statistic) */

    /* Async appends (append_op.c, append.c). */
    pthread_mutex_t op_mu;
    pthread_cond_t op_cond; /* signalled when inflight drops to 0 */
    struct append_op *free_ops;
    int nfree;
    atomic_int inflight;

    /* The highest known final index and those who wait for it to grow (index.c). */
    pthread_mutex_t idx_mu;
    pthread_cond_t idx_cond;
    atomic_llong last_index;
    int shutdown; /* under idx_mu */
    int waiters;  /* followers inside pawl_store_wait, under idx_mu */
    pthread_cond_t waiters_cond;

    /* Finalizer (struct fin_sm, finalizer.c); then the listener's request (index.c). */
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

    /* Readers: lost-connection retries and gaps (pawl_read, reader.c); the listener's counters
     * (index.c) and the finalizer session's pid (finalizer.c). */
    atomic_llong rd_retries, rd_reconnects, rd_gaps;
    atomic_int gap_active;       /* a gap episode is open (logged once) */
    atomic_llong gap_backoff_ns; /* the next gap back-off; 0: the first (1 ms) */
    atomic_llong notifies, index_queries, notifies_own;
    atomic_int fin_pid; /* the server process of this store's finalizer session; 0: none yet */
    atomic_llong rd_down_since; /* pawl_now_ns() when readers lost their connection; 0: up */

    /* Commit acknowledgements, for pending counts and finalize delays (finalizer.c). */
    atomic_llong acked;   /* appends acknowledged so far (also the last ack's sequence) */
    atomic_llong covered; /* acks covered by a finished finalization run */
    struct ack_slot *ring;

    /* Statistics (read by stats.c, added to by the rooms that count them). */
    atomic_llong appends_ok, events_ok, appends_failed;
    atomic_llong fin_runs, fin_idle, fin_busy, fin_errors, fin_appends, fin_events, fin_piggy;
    atomic_llong retries; /* appends re-run after a retryable error (pawl__log_op_done) */
    atomic_llong fin_skipped;
    atomic_llong lock_timeouts; /* appends rolled back by lock_timeout (55P03) */
    atomic_llong lost_retries;  /* appends with ids sent again after a lost connection */
    /* Cadence under load: append latency moving average (ns; written by whichever thread
     * finishes an append, a lost update only drops a sample) and the interval in force. */
    atomic_llong lat_avg_ns, fin_interval_ns;
    atomic_llong run_avg_ns; /* wall time of runs that finalized something: a moving average */
    struct hist delay, run, append_lat;
};

/* An append's outcome as to its ids (pawl.append's status column). */
enum id_status { ID_NONE, ID_ALREADY, ID_AGAIN, ID_USED };

/*
 * An append's encoded parameters (pawl__log_append_sql's $1..$9, then the event count as int4
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

/*
 * A finalization run piggybacked on a transaction of appends (append_finalizes): its statement's
 * parameter and result, and the acks it will cover. Embedded in an append op and in a group, but
 * finalizer.c's alone: the rooms above it hand it to pawl__log_fin_piggy_* and never read or
 * write its fields (underscored for that reason).
 */
struct fin_piggy {
    struct fin_out _out;  /* the run's row; appends -2: no row (or no run) */
    const char *_vals[1]; /* the statement's one parameter */
    long long _acked;     /* this store's acks before the request was sent */
};

struct append_op {
    struct pawl_store *s;
    struct pawl_pgreq req;
    struct pawl_pgstmt stmt[3]; /* [a retry's short lock_timeout,] the append (+ piggybacked
                                 * finalization), or the check */
    struct fin_piggy piggy;     /* the piggybacked finalization (finalizer.c's) */
    char xact_status[16];       /* pg_xact_status() when resolving an in-doubt commit */
    int resolve_tries;
    const char *resolve_vals[5];
    int resolve_lens[5];
    int resolve_fmts[5];
    struct append_enc en;
    size_t n;
    int any;
    int blocking; /* a pawl_append caller waits for it (struct sync_wait) */
    int retries;
    int64_t t_submit;
    int64_t lock_wait_start; /* first lock timeout of this append (0: none) */
    int64_t lost_start;      /* first lost connection of an append with ids (0: none) */
    int lost_backoff_ms;
    int lock_backoff_ms;
    /* A delayed retry: an inline timer on the store's timers whose callback submits the op
     * again (append_op.c). Initialised once, when the op is made: it survives recycling. */
    struct pawl_timer retry_timer;
    pawl_append_fn cb;
    void *ud;
    struct append_op *next_free; /* the free list (op_mu) */
    struct append_op *next_q;    /* the group queue (grp_mu) */
};

/* PostgreSQL binary format: big-endian integers, one-dimensional arrays. */
static inline char *put32(char *p, uint32_t v)
{
    v = __builtin_bswap32(v);
    memcpy(p, &v, 4);
    return p + 4;
}

static inline char *put64(char *p, uint64_t v)
{
    v = __builtin_bswap64(v);
    memcpy(p, &v, 8);
    return p + 8;
}

static inline char *array_header(char *p, int hasnull, uint32_t oid, size_t n)
{
    p = put32(p, 1);
    p = put32(p, (uint32_t)hasnull);
    p = put32(p, oid);
    p = put32(p, (uint32_t)n);
    return put32(p, 1);
}

static inline uint32_t get32(const char *p)
{
    const unsigned char *u = (const unsigned char *)p;
    return (uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | u[3];
}

static inline int64_t get64(const char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return (int64_t)__builtin_bswap64(v);
}

/* ---- wire.c ---------------------------------------------------------------------------- */
extern const Oid pawl__log_append_types[9];
int pawl__log_validate(const struct pawl_store_opts *o, const struct pawl_event *ev, size_t n,
                       int *any, uint32_t *ix, char *msg, size_t mlen);
int pawl__log_encode(struct append_enc *en, const struct pawl_event *ev, size_t n,
                     const uint32_t *ix);
void pawl__log_enc_result_row(struct append_enc *en, const PGresult *res, int row);
void pawl__log_enc_seqs(const struct append_enc *en, struct pawl_append_result *res);

/* ---- stats.c --------------------------------------------------------------------------- */
void pawl__log_hist_add(struct hist *h, int64_t us);
void pawl__log_set_err(struct pawl_store *s, const char *sqlstate, const char *msg);

/* ---- index.c --------------------------------------------------------------------------- */
extern const char pawl__log_last_index_sql[];
void pawl__log_index_raise(struct pawl_store *s, int64_t idx);
int pawl__log_index_lower(struct pawl_store *s, long long seen, int64_t told);
int pawl__log_index_sleep(struct pawl_store *s, int64_t ns);
int pawl__log_index_load(struct pawl_store *s, char *err, size_t errlen);
void pawl__log_index_shutdown(struct pawl_store *s);
void pawl__log_listen_hooks(struct pawl_store *s, struct pawl_pgpool_opts *po);

/* ---- finalizer.c ----------------------------------------------------------------------- */
extern const char pawl__log_finalize_sql[];
void pawl__log_fin_append_committed(struct pawl_store *s, int64_t now);
int pawl__log_fin_piggy_stmt(struct pawl_store *s, struct fin_piggy *fp, struct pawl_pgstmt *st);
void pawl__log_fin_piggy_reset(struct fin_piggy *fp);
void pawl__log_fin_piggy_done(struct pawl_store *s, const struct fin_piggy *fp);
void pawl__log_fin_hooks(struct pawl_store *s, struct pawl_pgpool_opts *po);
void pawl__log_fin_start(struct pawl_store *s);
void pawl__log_fin_stop(struct pawl_store *s);

/* ---- append_op.c ----------------------------------------------------------------------- */
extern const char pawl__log_resolve_sql[];
struct append_op *pawl__log_op_get(struct pawl_store *s);
void pawl__log_op_put(struct pawl_store *s, struct append_op *op);
void pawl__log_ops_fini(struct pawl_store *s);
int pawl__log_append_stmts(struct pawl_store *s, struct append_op *const *ops, size_t n,
                           const struct pawl_pgstmt *one, struct pawl_pgstmt *st,
                           struct fin_piggy *piggy);
int pawl__log_op_submit(struct pawl_store *s, struct append_op *op);
int pawl__log_op_submit_on(struct pawl_store *s, struct append_op *op, int conn);
void pawl__log_op_done(struct pawl_pgreq *req, int rc);
void pawl__log_op_outcome(struct append_op *op, int rc);
void pawl__log_op_finish(struct append_op *op, struct pawl_append_result *res);
void pawl__log_op_fail(struct append_op *op, int rc, const char *sqlstate, const char *msg);

/* ---- direct.c -------------------------------------------------------------------------- */
int pawl__log_direct_try(struct pawl_store *s, struct append_op *op);
void pawl__log_direct_fini(struct pawl_store *s);

/* ---- group.c --------------------------------------------------------------------------- */
extern const char pawl__log_append_group_sql[];
int pawl__log_groups_init(struct pawl_store *s);
void pawl__log_groups_fini(struct pawl_store *s);
void pawl__log_group_enqueue(struct pawl_store *s, struct append_op *op);
void pawl__log_group_linger_stop(struct pawl_store *s);

/* ---- reader.c -------------------------------------------------------------------------- */
extern const char pawl__log_read_sql[];
extern const char pawl__log_read_filtered_sql[];
extern const char pawl__log_read_stream_sql[];

#endif
