/*
 * pgconn.h — asynchronous, pipelined PostgreSQL connections driven by one I/O thread per pool.
 *
 * A pool owns N libpq connections and one I/O thread. Each connection is an explicit state
 * machine (DOWN -> CONNECTING -> SETUP -> READY -> BROKEN -> back-off -> CONNECTING) with
 * separate send and receive cursors: requests move from the pool's submission queue onto a
 * connection's send cursor, are written in pipeline mode without waiting for earlier results,
 * and wait on the receive cursor until their results arrive, in order. The socket is
 * non-blocking; input is consumed (PQconsumeInput) when the I/O loop (io_uring poll requests, or
 * epoll where io_uring is refused) reports it readable, results are taken only while PQisBusy()
 * is false, and a PQflush() result of 1 asks for write readiness: nothing
 * else is written to that connection until the socket drains. Shared requests go to the READY
 * connection with the fewest requests in flight.
 *
 * Requests. A request is a list of statements (text, or a statement prepared through
 * pawl__pgpool_prepare, with parameters in text or binary format) sent back to back. By default
 * a request ends with a pipeline Sync, which makes it one implicit transaction: either every
 * statement commits or none does, and an error skips the rest. Explicit BEGIN ... COMMIT inside
 * one request works too. A request flagged PAWL_PGREQ_NOSYNC does not end the transaction: the
 * next request pinned to the same connection continues it (so a transaction can be built from
 * several submissions, e.g. a processor batch whose handlers queue their own statements); its
 * results are still delivered promptly (a flush request follows it).
 *
 * Errors. A statement error fails its request with PAWL_ESQL and the SQLSTATE and server
 * message copied into the request; statements after it in the same transaction are reported as
 * failed with SQLSTATE 25P02. A request that opened a transaction block (BEGIN) and failed
 * leaves the session in an aborted block; the pool rolls it back by itself after the Sync.
 * A lost connection fails every request that was handed to libpq and not completed:
 * PAWL_EINDOUBT when the request ended a transaction that may have committed (its Sync was sent
 * but not answered), PAWL_ECONN when it cannot have committed (flagged PAWL_PGREQ_READONLY, no
 * Sync, or never executed: the server announced the end of the session before reaching it).
 * Requests not yet handed to libpq stay queued and go out on the next connection (the pool
 * reconnects with exponential back-off between reconnect_min_ms and reconnect_max_ms). A pinned
 * request whose connection is down fails with PAWL_ECONN.
 *
 * Threads. pawl__pgpool_submit*, pawl__pgpool_prepare and pawl_pgpool_stats may be called from
 * any thread at any time. Every callback (statement result, request completion, notification,
 * connect hook) runs on the pool's I/O thread, one at a time, and must not block: hand results
 * to your own executor. A callback may submit new requests (to this or another pool).
 * pawl__pgpool_free must not be called from a callback of the same pool.
 *
 * Ownership. The pool copies the DSN and the options' strings. A request and everything it
 * points to (statements, parameter values, lengths, formats) are the caller's and must stay
 * valid and unmodified from submit until its on_done callback has returned; the pool never
 * frees them. PGresult pointers handed to callbacks are borrowed for the duration of the call.
 */
#ifndef PAWL_STORE_PGCONN_H
#define PAWL_STORE_PGCONN_H

#include <libpq-fe.h>
#include <stdint.h>

struct pawl_pgpool;

/* Called for every statement result (success or error); res is borrowed. */
typedef void (*pawl_pgresult_fn)(void *ud, const PGresult *res);

struct pawl_pgstmt {
    const char *sql;            /* text of the statement, or NULL to use `prepared` */
    int prepared;               /* id returned by pawl__pgpool_prepare (when sql == NULL) */
    int nparams;                /* 0..65535 */
    const char *const *values;  /* nparams values (NULL entry = SQL NULL) */
    const int *lengths;         /* byte lengths for binary values; may be NULL if all text */
    const int *formats;         /* 0 text, 1 binary, per parameter; NULL = all text */
    int result_binary;          /* 1 to receive results in binary format */
    pawl_pgresult_fn on_result; /* may be NULL */
    void *ud;
    /*
     * 1: on_result takes ownership of the PGresult it is given (cast away const and PQclear
     * it when done with it, on any thread); 0: the pool clears it after the call.
     */
    int keep_result;
    /*
     * 1: ask the server to send this statement's result at once (a flush request follows it),
     * before later statements of the request run. Use it to learn something (an xid, say)
     * before a COMMIT that follows in the same request.
     */
    int flush_after;
};

enum pawl_pgreq_flags {
    PAWL_PGREQ_NOSYNC = 1u << 0,   /* do not end the transaction; needs a pinned connection */
    PAWL_PGREQ_READONLY = 1u << 1, /* never "in doubt": a lost connection gives PAWL_ECONN */
    /*
     * The request's transaction is the one its Sync commits (no COMMIT statement): when the
     * server ends the session (SQLSTATE class 57) with an error for one of its statements, that
     * statement had not completed, so the commit was never reached: PAWL_ECONN, not in doubt.
     */
    PAWL_PGREQ_IMPLICIT = 1u << 2,
};

struct pawl_pgreq;
/* Completion: rc is 0, PAWL_ESQL, PAWL_ECONN, PAWL_EINDOUBT or PAWL_ESHUTDOWN. */
typedef void (*pawl_pgdone_fn)(struct pawl_pgreq *req, int rc);

struct pawl_pgreq {
    /* Set by the caller before submit. */
    struct pawl_pgstmt *stmts;
    int nstmts; /* >= 1 */
    unsigned flags;
    pawl_pgdone_fn on_done; /* required; runs exactly once, on the I/O thread */
    void *ud;

    /* Filled in before on_done runs. */
    int failed_stmt;  /* index of the failing statement, or -1 */
    char sqlstate[6]; /* "" when not a server error */
    char message[256];
    int conn_index; /* connection it ran on */

    /* Private to the pool. */
    struct pawl_pgreq *_next;
    int _nsent;
    int _nrecv;
    int _sync_sent;
    int _ok_upto; /* statements 0.._ok_upto-1 returned a success result */
    int _skipped; /* its failure is the pipeline's abort: something before it failed */
    int _pinned;
    int64_t _queued_ns;
};

struct pawl_pgpool_opts {
    const char *name;       /* used in logs, e.g. "append"; default "pg" */
    int connections;        /* 1..64; default 2 */
    int reconnect_min_ms;   /* first back-off after a failure; 1..60000, default 100 */
    int reconnect_max_ms;   /* back-off doubles up to this; default 5000 */
    int connect_timeout_ms; /* give up one connection attempt after this; default 10000 */
    int max_inflight;       /* requests sent and not yet answered per connection; default 512 */
    /*
     * A request still waiting for a connection after this long (no connection READY) fails
     * with PAWL_ECONN; 0 waits forever. Default 10000.
     */
    int queue_timeout_ms;
    /*
     * Statements run (in order, one pipeline) after each (re)connect before any request,
     * e.g. "SET jit = off" or "LISTEN pawl_log". NULL-terminated array; may be NULL.
     */
    const char *const *session_sql;
    /* Called on the I/O thread after each successful (re)connect of connection i, with the
     * server process id of its new session. */
    void (*on_connect)(void *ud, int conn_index, int backend_pid);
    /* Called on the I/O thread for each NOTIFY received on any connection, with the server
     * process id of the session that sent it (set by the server: it cannot be forged). */
    void (*on_notify)(void *ud, const char *channel, const char *payload, int sender_pid);
    /*
     * Called on the I/O thread on every pass of its loop (after the socket events, completions
     * and hooks of the pass, before the pass's requests are sent), with the loop's clock
     * (pawl_now_ns). Returns the time by which it must be called again, or 0 for "only when
     * something happens" (a wake-up, a socket event, another deadline). It may submit requests
     * to this pool: they go out in the same pass. A state machine that lives on the loop (the
     * store's finalizer) is woken from other threads by pawl__pgpool_wake.
     */
    int64_t (*on_loop)(void *ud, int64_t now_ns);
    void *hook_ud;
    /*
     * The I/O loop's backend: an enum pawl_timer_backend. AUTO (default) uses io_uring unless
     * the kernel refuses it, EPOLL forces the fallback, IO_URING fails pool creation
     * (PAWL_ENOTSUP) when io_uring is refused.
     */
    int io_backend;
    /*
     * Hosting. A pool made with guest_slots > 0 keeps that many socket slots of its I/O loop
     * for the connections of guest pools (0..64; default 0). A pool made with host set is such
     * a guest: it has no I/O thread of its own; its host's thread drives it (its sockets, its
     * deadlines, its on_loop hook, its completions) in the same loop and the same system call
     * as the host's own connections, so that a completion on one can hand work to the other
     * without a cross-thread wake-up. Everything else is the guest's own: its connections,
     * queues, session statements, prepared statements, hooks and errors. A guest is freed
     * before its host; a host that stops first (or whose loop fails) shuts its guests down
     * with it. io_backend is the host's.
     */
    int guest_slots;
    struct pawl_pgpool *host;
};

void pawl__pgpool_opts_defaults(struct pawl_pgpool_opts *o);

/*
 * Create a pool and start its I/O thread (a guest: attach it to its host's); connections are opened
 * in the background (failures are retried with back-off and logged). When wait_ms > 0, waits up to
 * that long for the first connection and returns PAWL_ECONN (with the reason in err) if none came
 * up. dsn is copied.
 */
int pawl__pgpool_new(struct pawl_pgpool **out, const char *dsn, const struct pawl_pgpool_opts *o,
                     int wait_ms, char *err, size_t errlen);

/* Stop the I/O thread, fail pending requests with PAWL_ESHUTDOWN, close. NULL is a no-op. */
void pawl__pgpool_free(struct pawl_pgpool *p);

/*
 * Register a statement to be prepared lazily on each connection (and again after reconnects).
 * Returns its id (>= 0) or PAWL_ENOMEM / PAWL_EINVAL. types may be NULL (server infers).
 * At most 128 statements per pool. sql and types are copied.
 */
int pawl__pgpool_prepare(struct pawl_pgpool *p, const char *sql, int nparams, const Oid *types);

/*
 * Queue a request on the least loaded connection. Returns 0 (on_done will run) or
 * PAWL_EINVAL / PAWL_ESHUTDOWN (on_done will not run). Never blocks.
 */
int pawl__pgpool_submit(struct pawl_pgpool *p, struct pawl_pgreq *req);

/*
 * Queue a request on connection conn_index (0..connections-1), after every request already
 * pinned there. Use it for transactions spanning several requests (PAWL_PGREQ_NOSYNC).
 */
int pawl__pgpool_submit_on(struct pawl_pgpool *p, int conn_index, struct pawl_pgreq *req);

/* "io_uring" or "epoll": the backend the pool's I/O loop runs on. */
const char *pawl__pgpool_io_backend(const struct pawl_pgpool *p);

/* The I/O loop's counters (benchmarks): its waiting system calls, interest changes (epoll_ctl
 * calls, or poll requests queued), socket events and wake-ups. Read without locking: each
 * value is a relaxed snapshot. */
struct pawl_pgpool_loop_stats {
    uint64_t waits, enters, ctls, events, wakeups;
};
void pawl__pgpool_loop_stats(const struct pawl_pgpool *p, struct pawl_pgpool_loop_stats *out);

/*
 * Wait up to wait_ms for a connection to be READY: 0 when one is, PAWL_ETIMEDOUT when none came
 * up in time, PAWL_ECONN when the pool is shutting down or (first_attempts_only) every
 * connection's first attempt has failed. The deadline is carried by the pool's I/O loop, not
 * by a timed condition wait. Any thread but the pool's own.
 */
int pawl__pgpool_wait_ready(struct pawl_pgpool *p, int wait_ms, int first_attempts_only);

/*
 * Make the I/O thread run a pass of its loop (and so call on_loop) soon: at once from another
 * thread (coalesced while one is outstanding), after the current pass from one of the pool's
 * own callbacks. Any thread.
 */
void pawl__pgpool_wake(struct pawl_pgpool *p);

/* Number of connections; the number currently READY. */
int pawl__pgpool_size(const struct pawl_pgpool *p);
int pawl__pgpool_ready(const struct pawl_pgpool *p);

/*
 * The text of the last connection failure ("" if none), with the DSN redacted. Copied into buf.
 */
void pawl__pgpool_last_error(struct pawl_pgpool *p, char *buf, size_t len);

/* Requests submitted and not completed (queued + in flight), across all connections. */
int64_t pawl__pgpool_pending(const struct pawl_pgpool *p);

/*
 * Synchronous helper: submit req (on conn_index, or any connection when conn_index < 0) and
 * wait on the calling thread until it completes; returns its completion code (or the submit
 * error). req->on_done and req->ud are overwritten. Must not be called on this pool's I/O
 * thread. A request cannot be recalled once queued, so there is no timeout: the pool's
 * connect timeout and back-off bound how long a request can wait for a connection.
 */
int pawl__pgpool_exec(struct pawl_pgpool *p, int conn_index, struct pawl_pgreq *req);

/*
 * For PAWL_ASSERT: 1 when the calling thread is p's I/O thread (p NULL: the I/O thread of any
 * pool), so that "I/O thread only" and "never on an I/O thread" can be checked. Any thread.
 */
int pawl__pgpool_on_io_thread(const struct pawl_pgpool *p);

#endif
