/*
 * pawl/log.h — the forward-only event log on PostgreSQL: schema set-up, appends, the
 * finalizer, readers and followers.
 *
 * Model. An append writes one or more events as one transaction. It becomes readable only once
 * a finalization run has given it final global indexes: positive, unique and contiguous from 1,
 * in the order the appends were inserted. Finalization runs are serialized across every process
 * that uses the database; each run commits atomically and notifies channel "pawl_log". Hence a
 * reader that has read index N never later finds a new event at or below N, and a token (the
 * last index handled) needs no gap tracking. Per stream, final index order equals stream
 * sequence order, whatever else the appending transactions did (earlier writes, savepoints,
 * several appends in one transaction, any isolation level): see docs/design.md. The events of
 * one transaction are one unit with contiguous final indexes. Only pawl's SQL functions write
 * the log's tables; the finalizer's lock cannot be taken by roles outside pawl's.
 *
 * Objects. A store (pawl_store_new) owns a small set of pipelined connections for appends and
 * reads, one connection for its finalizer and, unless disabled, one listening connection. All
 * functions on a store are thread-safe. Appends may be in flight in large numbers (async);
 * each is its own transaction.
 *
 * Threads. Async append callbacks run on the store's I/O thread: keep them short, never block,
 * never call a blocking pawl function (pawl_append, pawl_read, pawl_follow) from them. The
 * finalizer runs on its own thread. Blocking calls (pawl_append, pawl_read, pawl_follow,
 * pawl_store_wait) may be called from any other thread.
 *
 * Errors. Functions return 0 or a negative PAWL_E* code. The text of the last failure on a
 * store (with the server's SQLSTATE when there is one) is read with pawl_store_errmsg; an
 * append's own outcome is also reported in its struct pawl_append_result (the rule for error
 * text is in pawl/common.h).
 */
#ifndef PAWL_LOG_H
#define PAWL_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "pawl/common.h"
#include "pawl/event.h"

#ifdef __cplusplus
extern "C" {
#endif

struct pawl_store;

/*
 * Options of a store. Get the defaults with pawl_store_opts_defaults, then change fields. Each
 * field's default, range and flag are declared once, in PAWL_STORE_TUNABLES below; the comments
 * here say what a field means.
 */
struct pawl_store_opts {
    /* Connections for appends and reads, pipelined. */
    int connections;
    /* Largest event: payload + metadata + stream id + type, in bytes. Larger events
     * are refused with PAWL_ETOOBIG before reaching the server. */
    size_t max_event_bytes;
    /* Most events in one append (PAWL_ETOOBIG beyond). */
    size_t max_append_events;
    /* Async appends submitted and not completed; beyond it pawl_append_async returns
     * PAWL_EAGAIN. */
    int max_inflight_appends;
    /* 1: run a finalizer in this process (signalled by each committed append); 0: do not
     * (another process finalizes). */
    int finalizer;
    /* Safety run period: finalize even without a signal, for appends of processes that died
     * before finalizing. */
    int finalizer_safety_interval_ms;
    /* The most appends in one run row (what a reader maps at once). A run finalizes everything
     * completed at its snapshot, as several contiguous rows when needed. */
    int finalize_batch_max;
    /* When another session holds the finalizer lock, retry after this long, doubling up to 8x
     * while it stays held (never a busy loop). */
    int finalizer_retry_ms;
    /* Cadence: a run starts at least this long after the previous one started, so that one
     * run (one commit) covers the appends that committed meanwhile; it bounds the finalize
     * delay from below. */
    int finalizer_min_interval_us;
    /* Under load the cadence stretches: a run also starts no sooner than this share of the
     * recent append latency (submit to acknowledged commit, a moving average over this
     * process's appends) after the previous one, up to finalizer_max_interval_us. When
     * appends queue, their latency grows, and one run then covers many more of them: the
     * finalizer's cost per event falls, and the delay it adds stays within what a writer
     * already waits for its acknowledgment (at the default, 100). Unloaded, append latency is
     * about a commit and the minimum interval rules. 0 turns it off. */
    int finalizer_latency_share_pct;
    /* The longest interval the latency share and the busy share may stretch the cadence to
     * (never below finalizer_min_interval_us). */
    int finalizer_max_interval_us;
    /* Under load the cadence also stretches so that runs take at most this share of the
     * finalizer's time: a run starts no sooner than its recent runs' duration (a moving
     * average of the wall time of runs that finalized something) times 100 / this share after
     * the previous one started, up to finalizer_max_interval_us. A run's wall time is about
     * its server work on an idle server and grows when the server's CPUs are saturated, which
     * is when fewer, larger runs cost the appends least. It trades finalize delay for CPU;
     * 0 (the default) turns it off. */
    int finalizer_busy_share_pct;
    /* 0 (default): the finalizer runs on the log connections' I/O thread, beside the appends,
     * with a connection of its own: an append's commit hands it the run in the same pass of
     * that loop, and the run's result comes back through the same wait, with no thread of its
     * own to wake. 1: it runs on an I/O thread of its own (as before 2026-12-06), so that a log
     * loop kept busy by reads and completions never delays a run (and the reverse). */
    int finalizer_own_thread;
    /* Experimental. 1: each append's transaction also runs a finalization (after its
     * insert, under the same try-lock) for what others committed before it, so that run's
     * commit shares the append's WAL flush; the background finalizer then mostly finds the
     * work done. Off by default: appends then hold the lock through their commits, which
     * raises finalize delays (docs/design.md). */
    int append_finalizes;
    /* An append waiting this long for a lock (its stream's head held by another open
     * transaction, e.g. an outbox append not yet committed) is rolled back by the server
     * (lock_timeout) and retried after a short back-off, off its connection's pipeline, so
     * appends to other streams keep flowing. 0 waits without limit (PostgreSQL's default). */
    int append_lock_timeout_ms;
    /* Such retries stop after this long in total: the append fails with PAWL_ETIMEDOUT (sqlstate
     * 55P03) and a message naming the stream. */
    int append_lock_wait_ms;
    /* An append whose events carry ids (pawl_event.id) is safe to repeat: when its connection
     * is lost (PAWL_EINDOUBT, or PAWL_ECONN before the commit) the store appends it again once
     * it has reconnected, with back-off, for up to this long in total, and reports the retry's
     * outcome (already = 1 when the first try had committed). 0: report the loss at once.
     * Appends without ids are never repeated. */
    int append_retry_ms;
    /* Group append: appends submitted while earlier ones are in flight are combined into one
     * transaction (one commit, one WAL flush), at most this many appends per group; each
     * append keeps its own expected versions (a conflict fails that append alone) and appends
     * to one stream keep their submission order within a group. At most `connections` groups
     * are in flight; a group takes what queued meanwhile, so an append alone never waits for
     * company. 1: no grouping (each append its own transaction, pipelined). */
    int append_group_max;
    /* The longest an append waits for others to join its group when a connection is free
     * (an upper bound: a group that reaches append_group_max goes at once). 0: no linger,
     * group only what queued while the previous group was in flight. */
    int append_group_linger_us;
    /* 1 (default): a blocking append (pawl_append, pawl_append_seqs) that finds no other append
     * of the store in flight runs on the caller's thread, over a connection of its own that the
     * store opens at the second such append: one round trip, as a plain INSERT, instead of two
     * hand-offs to the I/O thread and back. Same statement, outcomes, retries and in-doubt
     * checks; an append that finds others in flight joins them (group append). 0: every append
     * goes through the log connections. */
    int append_direct;
    /* 1: LISTEN for other processes' finalizations (wakes followers). */
    int listen;
    /* Reconnect back-off: first delay and cap (the cap at least the first delay). */
    int reconnect_min_ms;
    int reconnect_max_ms;
    /* One connection attempt. */
    int connect_timeout_ms;
    /* How long pawl_store_new waits for the first connection. */
    int open_timeout_ms;
    /* A request waiting this long for a connection fails with PAWL_ECONN; 0: forever. */
    int queue_timeout_ms;
    /* 1: create or upgrade the schema when opening (pawl_schema_migrate); 0: require it. */
    int migrate;
    /* Readers (pawl_read, pawl_follow) retry a read whose connection was lost (reads are
     * read-only: always safe to retry) until the pool has reconnected, for at most this long
     * per outage; then the read fails with PAWL_ECONN. 0 retries forever. */
    int read_retry_timeout_ms;

    /*
     * Reading from standbys. read_dsn (NULL or "": read from dsn) names a streaming standby of
     * dsn's server (libpq syntax; several hosts with target_session_attrs=standby); it is
     * copied. Events are read from it; appends, the finalizer, and everything else stay on dsn.
     * Each read on the standby also checks that the server is still in recovery: a server that
     * is not (promoted, or never a standby) is not read from. read_fallback says what a reader
     * does when the standby is behind the index the primary announced for longer than
     * read_max_lag_ms, or is unreachable or not a standby: PAWL_READ_FALLBACK_PRIMARY reads
     * from dsn meanwhile (trying the standby again every second), PAWL_READ_FALLBACK_WAIT waits
     * for the standby (polling it with back-off up to read_poll_max_ms). Each episode is logged
     * once, and its end. read_wake: PAWL_READ_WAKE_LISTEN wakes followers by LISTEN on dsn (as
     * without a standby); PAWL_READ_WAKE_POLL polls the standby's highest index instead,
     * 1 ms after a new one, doubling while nothing comes, up to read_poll_max_ms (no listener
     * on dsn).
     */
    const char *read_dsn;
    int read_fallback;
    int read_max_lag_ms;
    int read_wake;
    int read_poll_max_ms;
    /* The connection pools' I/O loop: an enum pawl_timer_backend. AUTO runs on
     * io_uring unless the kernel refuses it, then on epoll (logged); EPOLL forces the fallback;
     * IO_URING makes a refusal fail pawl_store_new with PAWL_ENOTSUP. */
    int io_backend;
};

enum { PAWL_READ_FALLBACK_PRIMARY = 0, PAWL_READ_FALLBACK_WAIT = 1 };
enum { PAWL_READ_WAKE_LISTEN = 0, PAWL_READ_WAKE_POLL = 1 };

/*
 * Every tunable of a store, one line each: the only place its default, its range and its flag
 * are declared. pawl_store_opts_defaults applies the defaults, pawl_store_new checks each
 * numeric field against [min, max] (besides the rule that reconnect_max_ms is at least
 * reconnect_min_ms), and the pawl tool derives its flags, environment variables (PAWL_ plus the
 * flag in capitals, '-' as '_') and help from the same lines.
 *
 *   X(type, field, flag, default, min, max, unit, help, choices)
 *
 * type: INT, BOOL (0 or 1), DURATION (milliseconds), ENUM (an index into choices), STRING (max is
 * the longest length in bytes; the default NULL means "not set"), or BOOL_NOFLAG (a boolean the
 * tool does not offer). unit and choices are NULL when they do not apply; choices is
 * PAWL_CHOICES("a", "b", ...) in the order of the field's values.
 */
#define PAWL_STORE_TUNABLES(X)                                                                     \
    X(INT, connections, "connections", 2, 1, 64, NULL,                                             \
      "Pipelined connections for appends and reads", NULL)                                         \
    X(INT, max_event_bytes, "max-event-bytes", 1048576, 1, 268435456, "bytes",                     \
      "Largest event (payload, metadata, stream id, type); larger ones are refused", NULL)         \
    X(INT, max_append_events, "max-append-events", 10000, 1, 100000, NULL,                         \
      "Most events in one append", NULL)                                                           \
    X(INT, max_inflight_appends, "max-inflight-appends", 8192, 1, 1000000, NULL,                   \
      "Asynchronous appends outstanding before appending would block", NULL)                       \
    X(BOOL, finalizer, "finalizer", 1, 0, 1, NULL,                                                 \
      "Run a finalizer in this process (--no-finalizer: another process finalizes)", NULL)         \
    X(DURATION, finalizer_safety_interval_ms, "finalizer-safety-interval", 1000, 10, 3600000,      \
      NULL, "Finalize at least this often, for appends of processes that died", NULL)              \
    X(INT, finalize_batch_max, "finalize-batch-max", 2000, 1, 100000, NULL,                        \
      "Largest run row: a run finalizes everything pending, in rows of at most this many "         \
      "appends",                                                                                   \
      NULL)                                                                                        \
    X(DURATION, finalizer_retry_ms, "finalizer-retry", 2, 1, 1000, NULL,                           \
      "Retry delay when another session holds the finalizer lock", NULL)                           \
    X(INT, finalizer_min_interval_us, "finalizer-min-interval-us", 500, 0, 1000000, "us",          \
      "Finalizer cadence: a run starts at least this long after the previous one, so one "         \
      "run covers many appends under load",                                                        \
      NULL)                                                                                        \
    X(INT, finalizer_latency_share_pct, "finalizer-latency-share", 100, 0, 100, "%",               \
      "Under load, space finalizer runs by this share of the recent append latency (0: "           \
      "fixed cadence)",                                                                            \
      NULL)                                                                                        \
    X(INT, finalizer_max_interval_us, "finalizer-max-interval-us", 20000, 0, 1000000, "us",        \
      "Longest interval the latency and busy shares may space finalizer runs by", NULL)            \
    X(INT, finalizer_busy_share_pct, "finalizer-busy-share", 0, 0, 100, "%",                       \
      "Under load, space finalizer runs so that they take at most this share of the time "         \
      "(0: off)",                                                                                  \
      NULL)                                                                                        \
    X(BOOL, finalizer_own_thread, "finalizer-own-thread", 0, 0, 1, NULL,                           \
      "Run the finalizer on an I/O thread of its own, not on the log connections' (which "         \
      "saves its thread's wake-ups: a run per commit on a lone writer)",                           \
      NULL)                                                                                        \
    X(BOOL_NOFLAG, append_finalizes, "append-finalizes", 0, 0, 1, NULL,                            \
      "Each append's transaction also finalizes what others committed (experimental)", NULL)       \
    X(DURATION, append_lock_timeout_ms, "append-lock-timeout", 100, 0, 600000, NULL,               \
      "An append waiting this long for a stream held by another transaction is rolled "            \
      "back and retried later, so other streams keep flowing; 0: wait without limit",              \
      NULL)                                                                                        \
    X(DURATION, append_lock_wait_ms, "append-lock-wait", 30000, 0, 3600000, NULL,                  \
      "Give up on an append whose stream stays held this long in total (error names it)", NULL)    \
    X(DURATION, append_retry_ms, "append-retry", 0, 0, 3600000, NULL,                              \
      "Append again, for up to this long, an append with event ids whose connection was lost "     \
      "(in doubt or not committed; the ids make it safe); 0: report the loss at once",             \
      NULL)                                                                                        \
    X(INT, append_group_max, "append-group-max", 256, 1, 10000, NULL,                              \
      "Most appends combined into one transaction (group append: one commit for the "              \
      "appends that queued while earlier ones were in flight); 1: no grouping",                    \
      NULL)                                                                                        \
    X(INT, append_group_linger_us, "append-group-linger-us", 0, 0, 100000, "us",                   \
      "Longest an append waits for others to join its group while a connection is free "           \
      "(0: never; a group forms only from appends queued behind one in flight)",                   \
      NULL)                                                                                        \
    X(BOOL, append_direct, "append-direct", 1, 0, 1, NULL,                                         \
      "A blocking append with nothing else in flight runs on the caller's thread over a "          \
      "connection of its own (one round trip; --no-append-direct: through the log "                \
      "connections)",                                                                              \
      NULL)                                                                                        \
    X(DURATION, read_retry_timeout_ms, "read-retry-timeout", 600000, 0, 86400000, NULL,            \
      "A reader whose connection stays lost this long gives up (0: never); until then "            \
      "it reads again from its position once the pool has reconnected",                            \
      NULL)                                                                                        \
    X(STRING, read_dsn, "read-dsn", NULL, 0, 4096, NULL,                                           \
      "Read events from this streaming standby of --dsn (a connection string; several "            \
      "hosts with target_session_attrs=standby); appends, claims, tokens and handler SQL "         \
      "stay on --dsn; empty: read from --dsn",                                                     \
      NULL)                                                                                        \
    X(ENUM, read_fallback, "read-fallback", PAWL_READ_FALLBACK_PRIMARY, 0, 1, NULL,                \
      "When the standby is behind for --read-max-lag, unreachable or not in recovery: "            \
      "read from --dsn meanwhile (primary) or wait for it (wait); logged once per episode",        \
      PAWL_CHOICES("primary", "wait"))                                                             \
    X(DURATION, read_max_lag_ms, "read-max-lag", 5000, 0, 3600000, NULL,                           \
      "How long the standby may stay behind the index the primary announced before "               \
      "--read-fallback applies",                                                                   \
      NULL)                                                                                        \
    X(ENUM, read_wake, "read-wake", PAWL_READ_WAKE_LISTEN, 0, 1, NULL,                             \
      "With --read-dsn, wake followers by LISTEN on --dsn (listen) or by polling the "             \
      "standby's highest index with back-off up to --read-poll-max (poll)",                        \
      PAWL_CHOICES("listen", "poll"))                                                              \
    X(DURATION, read_poll_max_ms, "read-poll-max", 100, 1, 60000, NULL,                            \
      "Longest back-off between polls of a standby (--read-wake poll) and between reads "          \
      "of a standby that is behind",                                                               \
      NULL)                                                                                        \
    X(ENUM, io_backend, "io-backend", PAWL_TIMER_BACKEND_AUTO, 0, 2, NULL,                         \
      "Event loop of the database connections: io_uring, or epoll where io_uring is "              \
      "refused (auto tries io_uring first and logs a refusal at info, the choice at debug; "       \
      "epoll forces the fallback)",                                                                \
      PAWL_CHOICES("auto", "io_uring", "epoll"))                                                   \
    X(BOOL, listen, "listen", 1, 0, 1, NULL,                                                       \
      "LISTEN for other processes' finalizations (wakes followers)", NULL)                         \
    X(DURATION, reconnect_min_ms, "reconnect-min", 100, 1, 60000, NULL, "First reconnect delay",   \
      NULL)                                                                                        \
    X(DURATION, reconnect_max_ms, "reconnect-max", 5000, 1, 60000, NULL,                           \
      "Longest reconnect delay", NULL)                                                             \
    X(DURATION, connect_timeout_ms, "connect-timeout", 10000, 1, 600000, NULL,                     \
      "One connection attempt", NULL)                                                              \
    X(DURATION, open_timeout_ms, "open-timeout", 10000, 1, 600000, NULL,                           \
      "How long opening the store waits for its first connection", NULL)                           \
    X(DURATION, queue_timeout_ms, "queue-timeout", 10000, 0, 3600000, NULL,                        \
      "A request waiting this long for a connection fails; 0: wait forever", NULL)                 \
    X(BOOL, migrate, "migrate", 0, 0, 1, NULL,                                                     \
      "Create or upgrade the schema when opening the store (as pawl init does)", NULL)

PAWL_API void pawl_store_opts_defaults(struct pawl_store_opts *o);

/*
 * Bring the schema in the database named by dsn to this library's version, idempotently;
 * concurrent callers serialize on an advisory lock and agree. Returns 0, PAWL_ECONN,
 * PAWL_ESQL, or PAWL_ESCHEMA when the database's schema is newer than this library (the text,
 * naming both versions, goes to err). err may be NULL.
 */
PAWL_API int pawl_schema_migrate(const char *dsn, char *err, size_t errlen);

/*
 * pawl_schema_migrate, then the server path `want` (an enum pawl_server_path, below) instead of
 * AUTO, in one session: a database created with want = SQL never runs the native functions even
 * for a moment. *active (may be NULL) gets the path now active. Returns pawl_schema_migrate's
 * errors and pawl_schema_server_path's (PAWL_ENOTSUP: NATIVE asked and not available), and
 * PAWL_EINVAL for a want that is not a path.
 */
PAWL_API int pawl_schema_migrate_path(const char *dsn, int want, int *active, char *err,
                                      size_t errlen);

/*
 * Which implementation of pawl's server functions a database runs. The SQL functions (PL/pgSQL)
 * work on any PostgreSQL; the native ones come from the server extension pawl_native (built
 * from sql/native and installed into the server's library folder), with the same contract
 * (signatures, results, errors, privileges, guarantees) at a fraction of the server's work.
 * Today the finalization run (pawl.finalize) has a native version.
 */
enum pawl_server_path {
    PAWL_SERVER_AUTO = 0,   /* native when the server offers pawl_native, else SQL */
    PAWL_SERVER_NATIVE = 1, /* native, or fail saying why not */
    PAWL_SERVER_SQL = 2,    /* the portable SQL functions */
};

/*
 * Switch the database named by dsn to `want` (an enum pawl_server_path; online: a run in
 * progress finishes with the version it started with) and write the path now active into
 * *active (may be NULL). AUTO first honours the setting pawl.server_path ('sql', 'native' or
 * 'auto'; for example ALTER DATABASE app SET pawl.server_path = 'sql'), then takes native when
 * the server has pawl_native at this library's version and the caller may declare C functions
 * (a superuser), else SQL. Needs the schema at this library's version. Returns 0, PAWL_ENOTSUP
 * (NATIVE asked and not available: err says why), PAWL_ESCHEMA, PAWL_ECONN or PAWL_ESQL.
 * pawl_schema_migrate applies AUTO after its migrations.
 */
PAWL_API int pawl_schema_server_path(const char *dsn, int want, int *active, char *err,
                                     size_t errlen);

/* "auto", "native", "sql" (or "?") for an enum pawl_server_path. */
PAWL_API const char *pawl_server_path_name(int path);

/*
 * The schema version in the database (0 when there is none) and the one this library
 * brings. Returns 0 or PAWL_ECONN / PAWL_ESQL (text in err).
 */
PAWL_API int pawl_schema_version(const char *dsn, int *db_version, int *lib_version, char *err,
                                 size_t errlen);

/*
 * Open a store. dsn is copied; o may be NULL (defaults). Fails with PAWL_ERANGE (an option out
 * of range), PAWL_EINVAL (a bad DSN), PAWL_ECONN (no connection within open_timeout_ms),
 * PAWL_ESCHEMA (schema missing, older or newer; run pawl_schema_migrate or `pawl init`), with
 * the reason in err (may be NULL).
 */
PAWL_API int pawl_store_new(struct pawl_store **out, const char *dsn,
                            const struct pawl_store_opts *o, char *err, size_t errlen);

/*
 * Close: completes outstanding async appends (their callbacks run; an append in flight when
 * the connections close reports PAWL_EINDOUBT or PAWL_ESHUTDOWN), then lets the finalizer run
 * until every append of this process is final, for at most 5 s (while another session holds
 * the lock it retries with back-off, then logs what is left and the holder), wakes blocked
 * followers with PAWL_ESHUTDOWN. Must not run concurrently with other
 * calls on s, nor from a callback. NULL is a no-op.
 */
PAWL_API void pawl_store_free(struct pawl_store *s);

/*
 * The last failure on s: "SQLSTATE: message" or a plain message; "" if none (and for s NULL).
 * Copied into buf (cut to len, NUL-terminated when len > 0); returns buf.
 */
PAWL_API const char *pawl_store_errmsg(struct pawl_store *s, char *buf, size_t len);
/* Deprecated name of pawl_store_errmsg. */
PAWL_API void pawl_store_last_error(struct pawl_store *s, char *buf, size_t len)
    __attribute__((deprecated("use pawl_store_errmsg")));

/* ---- appending -------------------------------------------------------------------------- */

/*
 * Optimistic concurrency, per event's stream_seq:
 *   > 0  explicit: the stream must currently end at stream_seq - 1 (for the first event of that
 *        stream in this append), and a stream's events in one append must be consecutive.
 *        Otherwise the append fails with PAWL_ECONFLICT and writes nothing.
 *   0    PAWL_SEQ_ANY: append at the stream's end, whatever it is (concurrent appends to the
 *        same stream are retried internally, never interleaved within one append).
 * One append may mix streams; a stream's events are all explicit or all ANY.
 */
#define PAWL_SEQ_ANY ((int64_t)0)

struct pawl_append_result {
    int rc;               /* 0, or PAWL_ECONFLICT, PAWL_ETOOBIG, PAWL_EINVAL, PAWL_ECONN (did not
                           * commit), PAWL_EINDOUBT (connection lost during commit: it may or may
                           * not have committed; with ids, appending again is safe),
                           * PAWL_EIDUSED (an id names other events, or only some ids are in
                           * the log: nothing written), PAWL_ESQL, PAWL_ESHUTDOWN */
    char sqlstate[6];     /* server SQLSTATE, "" if none */
    char message[256];    /* human-readable reason, "" on success */
    int64_t committed_ns; /* pawl_now_ns() when the commit was acknowledged (rc == 0) */
    /*
     * On success: the stream sequence numbers given to the events of events[0]'s stream, the
     * first and the last (events[0] got first_seq; that stream's other events in this append
     * follow in order). The events of another stream s got consecutive numbers ending at its
     * new head. 0 when rc != 0.
     */
    int64_t first_seq, last_seq;
    /*
     * On success, every event's number, whatever its stream: seqs[i] is the stream sequence
     * number events[i] got (n entries). In an async callback it is the store's, borrowed for
     * the call; after pawl_append_seqs / pawl_append_in_seqs it is the caller's array; NULL
     * after pawl_append / pawl_append_in, on failure, and if the numbers could not be kept
     * (out of memory: the append itself succeeded).
     */
    const int64_t *seqs;
    /*
     * 1 when every event carried an id that was in the log already, each for an event of the
     * same stream, type and payload: the append is a retry of one that committed (its first
     * try ended in doubt, say). Nothing was written; rc is 0 and first_seq, last_seq and seqs
     * are the numbers the events got when they were appended. 0 otherwise.
     */
    int already;
};

/*
 * Called once per async append, on the store's I/O thread; res is borrowed for the call.
 */
typedef void (*pawl_append_fn)(void *ud, const struct pawl_append_result *res);

/*
 * Append n events (1..max_append_events) as one transaction and wait for the outcome. The
 * events (and what they point to) are read during the call only. res may be NULL. Returns
 * res->rc. Events are validated first (PAWL_EINVAL for empty/invalid UTF-8 ids or types,
 * metadata that is not a JSON object, inconsistent sequences; PAWL_ETOOBIG for oversized
 * events or batches): nothing reaches the server then.
 */
PAWL_API int pawl_append(struct pawl_store *s, const struct pawl_event *events, size_t n,
                         struct pawl_append_result *res);

/*
 * pawl_append, and on success seqs[i] (an array of n entries the caller provides) is the stream
 * sequence number events[i] got, for every stream of the append; seqs is not written on
 * failure. seqs may be NULL (then it is pawl_append).
 */
PAWL_API int pawl_append_seqs(struct pawl_store *s, const struct pawl_event *events, size_t n,
                              int64_t *seqs, struct pawl_append_result *res);

/*
 * Asynchronous append: validates and encodes the events (copied; the caller's memory is free
 * on return), queues the transaction and returns 0; cb runs later with the outcome. Returns
 * PAWL_EAGAIN when max_inflight_appends are outstanding (nothing queued, cb will not run), or
 * a validation error (cb will not run).
 */
PAWL_API int pawl_append_async(struct pawl_store *s, const struct pawl_event *events, size_t n,
                               pawl_append_fn cb, void *ud);

/* Block until every async append submitted before the call has completed. */
PAWL_API void pawl_store_drain(struct pawl_store *s);

/* libpq's connection (PGconn); declared here so that this header does not need libpq-fe.h. */
struct pg_conn;

/*
 * Append n events on the caller's own libpq connection, inside whatever transaction the caller
 * has open there (the outbox pattern: the events commit or roll back with the caller's other
 * writes). It does not commit: with no transaction open the statement is its own transaction.
 * Any isolation level; after other writes; several times per transaction (the transaction's
 * events are one unit: contiguous final indexes, in the order appended). Validation and
 * results are pawl_append's with the default store options' limits; res may be NULL; returns
 * res->rc. PAWL_ECONFLICT with sqlstate "" means a stream was not at its expected version:
 * nothing was written and the transaction is still usable; with sqlstate 23505 a concurrent
 * append took a sequence number first and the transaction is aborted (retry it). At commit the
 * finalizers of every pawl process are woken (NOTIFY pawl_pending); with none running, the
 * events stay unfinalized until one runs. Blocking; the connection must not be in pipeline
 * mode nor have a query in progress. The caller's role needs pawl_appender's rights.
 */
PAWL_API int pawl_append_in(struct pg_conn *conn, const struct pawl_event *events, size_t n,
                            struct pawl_append_result *res);

/* pawl_append_in, and on success seqs[i] (n entries, the caller's) is events[i]'s number. */
PAWL_API int pawl_append_in_seqs(struct pg_conn *conn, const struct pawl_event *events, size_t n,
                                 int64_t *seqs, struct pawl_append_result *res);

/* ---- connection strings ----------------------------------------------------------------- */

/*
 * A DSN is a libpq connection string in either form ("host=... dbname=..." or
 * "postgresql://user:pass@host/db"), parsed by libpq itself, so pawl accepts exactly what libpq
 * accepts. These are the library's own checks and printable form, for programs that handle the
 * same strings (a command line, a settings page): a password never appears in their output.
 * Any thread; they keep no state.
 */

/*
 * Check that dsn parses. On failure (NULL included) returns PAWL_EINVAL and writes libpq's
 * reason into err (errlen bytes, the caller's; err may be NULL) with every password in it
 * replaced by "***": libpq quotes the malformed part, which may be the password.
 */
PAWL_API int pawl_dsn_check(const char *dsn, char *err, size_t errlen);

/*
 * Write a printable form of dsn into out (outlen bytes, the caller's): every keyword that was
 * set, in key=value form, with the password replaced by "***". Always NUL-terminates (when
 * outlen > 0), never cuts an option in half; an unparsable dsn prints as "<invalid dsn>"; the
 * empty dsn (libpq's environment and defaults) prints as what the PG* variables set and the user
 * name libpq would use, password hidden. Returns out.
 */
PAWL_API char *pawl_dsn_redact(const char *dsn, char *out, size_t outlen);

/* 1 when dsn carries a password (password= or sslpassword=, a URI's userinfo or query), else 0;
 * for a program that warns when a secret was given where others can read it (argv). */
PAWL_API int pawl_dsn_has_password(const char *dsn);

/*
 * Open a libpq connection to dsn with the settings every pawl connection fixes, whatever the DSN,
 * libpq's environment or the database's defaults say: client_encoding UTF8. Stream ids, types
 * and metadata are UTF-8 text; under another client encoding (PGCLIENTENCODING=LATIN1, say) the
 * server converts them, so a stream appended by pawl and the same stream appended in SQL would be
 * two streams, and text read back would not be UTF-8. For pawl_append_in and for a program's own
 * SQL on pawl's tables. start = 0 connects (PQconnectdbParams); start = 1 begins a non-blocking
 * connection (PQconnectStartParams) for the caller to drive with PQconnectPoll. The connection
 * is the caller's (PQfinish); check PQstatus. NULL only when out of memory.
 */
PAWL_API struct pg_conn *pawl_pq_connect(const char *dsn, int start);

/* ---- reading ---------------------------------------------------------------------------- */

/*
 * A reusable read buffer for pawl_read. events[0..count) are valid until the next read into the
 * batch or pawl_read_batch_fini; every pointer in them points into the batch, which holds the
 * database's result rather than copies. Embed it (caller storage). Not to be confused with
 * struct pawl_event_batch (pawl/processor.h), which owns copies and is what a source fills.
 */
struct pawl_read_batch {
    struct pawl_event *events;
    size_t count;
    /* private */
    size_t _cap;
    void *_res;
};

PAWL_API void pawl_read_batch_init(struct pawl_read_batch *b);
PAWL_API void pawl_read_batch_fini(struct pawl_read_batch *b);

/*
 * Read up to max (1..100000) finalized events with index > after, in index order and without
 * gaps (events[i].index == after + 1 + i). Returns 0 (count may be 0) or an error (PAWL_ERANGE
 * for a negative after or a max outside 1..100000).
 *
 * A read whose connection is lost (the backend terminated, a server restart, a failover) is run
 * again once the pool has reconnected, from the same position, so no event is skipped or
 * delivered twice; the store logs one warning when such an outage starts and one line when
 * reading resumes, and counts the retries (read_retries, read_reconnects). It gives up with
 * PAWL_ECONN after read_retry_timeout_ms, with PAWL_ESHUTDOWN when the store is freed, and at
 * once on any other error. When the known highest index promised events after `after` and the
 * log returned none, the read backs off (1 ms doubling to 1 s across such reads), learns the
 * highest index from the log again (lowering the known one if the log says less, e.g. after a
 * failover lost its tail), logs the anomaly once per episode (read_gaps) and returns count 0.
 */
PAWL_API int pawl_read(struct pawl_store *s, int64_t after, size_t max, struct pawl_read_batch *b);

/*
 * Follow the log: like pawl_read, but when nothing is available after `after`, block (no
 * polling) until this process's finalizer or another process's notification reports a higher
 * index, then read. Returns 0 with count >= 1, PAWL_ETIMEDOUT (count 0) after timeout_ms
 * (< 0: wait forever; also while a lost connection is being retried: call again), PAWL_ESHUTDOWN
 * when the store is being freed, or pawl_read's errors (PAWL_ECONN once the connection has been
 * lost for read_retry_timeout_ms).
 */
PAWL_API int pawl_follow(struct pawl_store *s, int64_t after, size_t max, struct pawl_read_batch *b,
                         int timeout_ms);

/*
 * A filter evaluated in the server, with index support (schema 16). An event matches when its
 * stream matches and, if types are given, its type is one of them. A stream matches when no
 * categories or prefixes are given, or its category (message-db's convention: the stream id up
 * to its first '-', the whole id without one) is one of categories, or its id starts with one
 * of stream_prefixes. Every string is 1..PAWL_STREAM_ID_MAX bytes; a category has no '-'; at
 * most PAWL_FILTER_MAX of each; at least one string in all. The arrays are the caller's.
 */
#define PAWL_FILTER_MAX 1000
struct pawl_filter {
    const char *const *categories;
    size_t n_categories;
    const char *const *stream_prefixes;
    size_t n_stream_prefixes;
    const char *const *types;
    size_t n_types;
};

/*
 * Check f: 0, or PAWL_EINVAL with why in err (NULL f, no string at all, a NULL, empty or too
 * long string, a category with '-', more than PAWL_FILTER_MAX of one kind).
 */
PAWL_API int pawl_filter_check(const struct pawl_filter *f, char *err, size_t errlen);

/*
 * f as canonical JSON (each list sorted and without duplicates, empty lists left out), as the
 * token store records it as part of a processor's definition: {"categories":[...],
 * "stream_prefixes":[...],"types":[...]}; "{}" for NULL. Returns the length it needs (like
 * snprintf), or a negative PAWL_E* code (PAWL_EINVAL for a filter pawl_filter_check refuses,
 * PAWL_ENOMEM).
 */
PAWL_API int pawl_filter_json(const struct pawl_filter *f, char *buf, size_t len);

/*
 * Read the matching finalized events with index > after: up to max (1..100000), in index
 * order, and *position, the index up to which the read looked: every matching event with an
 * index in (after, *position] is in the batch, so the next read starts after *position (not
 * after the last event: an idle filter's position follows the log's head). Returns 0 (count may
 * be 0 while *position moved), or pawl_read's errors; PAWL_EINVAL for a filter
 * pawl_filter_check refuses. A read looks at up to about 4 million indexes; when it stops there
 * it returns what it found and its position, and the next read goes on. Lost connections are
 * retried as pawl_read retries them.
 */
PAWL_API int pawl_read_filtered(struct pawl_store *s, int64_t after, size_t max,
                                const struct pawl_filter *f, struct pawl_read_batch *b,
                                int64_t *position);

/*
 * Follow with a filter: like pawl_read_filtered, but when no matching event is available after
 * `after`, wait (as pawl_follow does) and look again. Returns 0 with count >= 1, or
 * PAWL_ETIMEDOUT after timeout_ms with count 0 and *position where the looking stopped (store
 * it: nothing up to there matched), or pawl_follow's errors.
 */
PAWL_API int pawl_follow_filtered(struct pawl_store *s, int64_t after, size_t max,
                                  const struct pawl_filter *f, struct pawl_read_batch *b,
                                  int64_t *position, int timeout_ms);

/*
 * Read one stream: up to max (1..100000) finalized events of stream_id with stream_seq >
 * after_seq, in sequence order and consecutive (events[i].stream_seq == after_seq + 1 + i),
 * each with its final index. The finalized events of a stream are a prefix of it, so a later
 * read never returns a sequence number at or below one an earlier read returned. Returns 0
 * (count may be 0), PAWL_EINVAL (a NULL, empty or too long stream id), PAWL_ERANGE (negative
 * after_seq, max outside 1..100000), PAWL_ETRUNCATED (retention dropped the stream's events
 * after after_seq; the message names where the stream now starts), or pawl_read's errors.
 */
PAWL_API int pawl_read_stream(struct pawl_store *s, const char *stream_id, int64_t after_seq,
                              size_t max, struct pawl_read_batch *b);

/* The highest final index this process knows of: from the local finalizer's runs, events read,
 * and the log's own answer to `SELECT pawl_api.last_index()`, which the listener asks after
 * (re)connecting and when notifications arrive (at most once per millisecond). A notification is
 * only a wake-up: its payload is never trusted (any login may NOTIFY the channel). */
PAWL_API int64_t pawl_store_last_index(struct pawl_store *s);

/*
 * Block until the known highest index exceeds after (returns 0), timeout_ms passes
 * (PAWL_ETIMEDOUT; < 0 waits forever) or the store is freed (PAWL_ESHUTDOWN).
 */
PAWL_API int pawl_store_wait(struct pawl_store *s, int64_t after, int timeout_ms);

/* ---- finalizer ---------------------------------------------------------------------------- */

/*
 * Run one finalization now, on the calling thread, through the finalizer's connection (works
 * with the finalizer disabled too). Reports the appends and events it finalized (-1, -1 when
 * the lock was held elsewhere) and the highest final index; any pointer may be NULL.
 */
PAWL_API int pawl_finalize_now(struct pawl_store *s, int64_t *appends, int64_t *events,
                               int64_t *last_index);

/* Counters and latency figures of a store (pawl_store_stats). */
struct pawl_store_stats {
    int64_t appends_ok;           /* appends committed through this store */
    int64_t events_ok;            /* their events */
    int64_t appends_failed;       /* appends that reported an error */
    int64_t append_lock_timeouts; /* appends rolled back by append_lock_timeout_ms (retried) */
    int64_t append_lost_retries;  /* appends with ids appended again after a lost connection */
    int64_t append_retries;       /* re-runs of appends after a retryable error: a deadlock, a
                                   * serialization failure, or (ANY sequences) another append
                                   * to one of the same streams committing first */
    int64_t appends_pending;      /* committed here and not yet covered by a finalization run */
    int64_t inflight;             /* async appends submitted and not completed */
    int64_t appends_direct;       /* blocking appends answered on the caller's thread
                                   * (append_direct) */
    int64_t finalize_runs;        /* runs of this process's finalizer that did work */
    int64_t finalize_piggybacked; /* runs inside this process's append transactions */
    int64_t finalize_skipped;     /* wake-ups with nothing left (piggybacked runs covered it) */
    int64_t finalize_idle_runs;   /* runs that found nothing to finalize */
    int64_t finalize_busy;        /* runs that found the lock held elsewhere */
    int64_t finalize_errors;
    int64_t appends_finalized; /* by this process's finalizer (any process's appends) */
    int64_t events_finalized;
    int64_t last_index; /* highest final index known here */
    /*
     * Finalize delay: from the acknowledged commit of an append made here to the end of the
     * first finalization run that started after it (an upper bound on commit -> final index).
     * Over the appends since the last reset.
     */
    int64_t delay_count;
    double delay_p50_ms, delay_p99_ms, delay_max_ms;
    /* Duration of this process's finalization runs (request to result), since the last reset. */
    int64_t run_count;
    double run_p50_ms, run_p99_ms, run_max_ms;
    /* Append latency (submit to acknowledged commit), since the last reset. */
    double append_p50_ms, append_p99_ms, append_max_ms;
    /* The finalizer's current cadence (interval between run starts) and the moving averages it
     * derives from: append latency and the wall time of runs that finalized something, in ms. */
    double finalizer_interval_ms, append_latency_avg_ms, finalizer_run_avg_ms;
    /* Readers: reads run again after a lost connection, the outages they went through, and
     * episodes where the known highest index was ahead of what the log returned (gaps). */
    int64_t read_retries, read_reconnects, read_gaps;
    /* Listener: "pawl_log" notifications received (wake-ups) and the last_index queries they
     * and reconnects caused (one query at a time, at most one per millisecond: a flood of
     * notifications from any login costs a process at most 1,000 queries a second, and a
     * wake-up waits at most 1 ms behind the previous query). */
    int64_t notifications, index_queries;
    /* Reading from a standby (read_dsn): reads answered by the standby and by the primary in
     * its stead (fallback), episodes logged (behind past read_max_lag_ms, unreachable or not
     * a standby; the few-millisecond lag of ordinary replication is not one), whether
     * reads go to the primary now, and the standby's replay delay at its last check (0 when it
     * has replayed everything it received; -1 when unknown or no standby). */
    int64_t standby_reads, standby_fallback_reads, standby_episodes;
    int standby_fallback_active;
    double standby_replay_delay_ms;
    /* Group append: transactions that committed appends of this store (a group is one), and
     * the appends they carried (append_groups_appends / append_groups: the mean group size). */
    int64_t append_groups, append_groups_appends;
    /* Of the notifications, those sent by this store's own finalizer runs: they cost no query
     * (the run's result gave the index already). */
    int64_t own_notifications;
};

/* Fill st; when reset != 0, the latency figures start over afterwards (counters never do). */
PAWL_API void pawl_store_stats(struct pawl_store *s, struct pawl_store_stats *st, int reset);

#ifdef __cplusplus
}
#endif
#endif
