/*
 * pgconn_internal.h — the connection pool's layout and the calls between its three files,
 * private to them (pgconn.h has the contract the rest of the store sees):
 *   pgpool.c   the pool: its API (new, free, prepare, submit, the waits), the shared and pinned
 *              queues, and the I/O thread's loop, which drives the other two
 *   pgconn.c   one connection's life cycle: the state machine (drawn there) from connecting
 *              through the session's set-up to READY, and a failure's report and back-off
 *   pgpipe.c   the pipeline of a connection: the send cursor (requests handed to libpq) and the
 *              receive cursor (results matched, in order, to what was sent)
 *
 * Locking: the pool mutex (mu) protects the shared queue, the pinned queues, the connection state
 * that other threads read, last_error, attempts_done, io_exited and wake_at_ns's writes. The I/O
 * thread owns every PGconn, the receive FIFOs and the fields marked "I/O thread only"; every
 * function declared here except pawl__pgpool_set_error runs on it alone, which each asserts
 * (pawl__pgpool_on_io_thread), and none takes mu for longer than a queue operation.
 */
#ifndef PAWL_STORE_PGCONN_INTERNAL_H
#define PAWL_STORE_PGCONN_INTERNAL_H

#include "pgconn.h"

#include "common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define MAX_PREPARED 128
#define MAX_CONNS 64
/* Guest pools one host drives at most, and the slots it may keep for them. */
#define MAX_GUESTS 4
#define MAX_GUEST_SLOTS 64
/* While connection attempts keep failing, a warning this often (each retry is at debug). */
#define CONNECT_WARN_NS (10 * 1000000000LL)

enum cstate { C_DOWN, C_CONNECTING, C_SETUP, C_READY, C_BACKOFF };

/* What the receive cursor expects next: a session statement's result (arg: its index, or -1
 * for the ROLLBACK of a failed block), a Parse's, a request statement's (arg: its index), or a
 * Sync's (req NULL: the session set-up's). */
enum ekind { E_SETUP, E_PREPARE, E_STMT, E_SYNC };

struct expect {
    enum ekind kind;
    int arg; /* statement index (E_STMT, E_SETUP), prepared id (E_PREPARE) */
    struct pawl_pgreq *req;
};

struct conn {
    struct pawl_pgpool *pool;
    int index;
    int slot; /* its socket's slot in the I/O loop (index, after a host's own) */
    PGconn *pg;
    int fd;            /* watched by the I/O loop, or -1 */
    uint32_t events;   /* currently watched PAWL_IO_* events */
    enum cstate state; /* written by the I/O thread; read by others under the pool mutex */
    PostgresPollingStatusType poll;
    int64_t deadline_ns; /* connect timeout or end of back-off */
    int backoff_ms;
    /* A run of failed connection attempts: how many, since when, when last reported (one
     * warning when it starts, one every CONNECT_WARN_NS while it lasts). */
    int connect_fails;
    int64_t fail_since, fail_warned;
    int want_write; /* PQflush() returned 1: wait for PAWL_IO_OUT before writing more */
    int open_txn;   /* last request sent was NOSYNC: only pinned requests may follow */
    int ninflight;  /* requests handed to libpq, not completed */
    struct pawl_pgreq *inflight_head, *inflight_tail;
    struct pawl_pgreq *pinned_head, *pinned_tail; /* under the pool mutex */
    struct expect *exp;                           /* ring of expected results */
    size_t exp_cap, exp_head, exp_len;
    uint8_t prepared[MAX_PREPARED];
    int aborted; /* an error occurred in the current transaction segment */
    /* The request during which the server announced the end of the session (FATAL, class
     * 57 or 08): nothing after it was executed. */
    struct pawl_pgreq *fatal_req;
    /* The server announced the end of the session (a FATAL notice or result): a request
     * that got no result at all was never executed. */
    int fatal_idle;
    int sync_error; /* a commit error result was taken for the front Sync */
    /* A session statement failed: the setup fails with this, instead of going READY. */
    char setup_error[384];
    /* A Parse this segment sent failed: the request whose statement it prepared is told why
     * (its statement comes back only as skipped by the pipeline's abort). */
    char prep_sqlstate[6];
    char prep_message[256];
};

struct prepared_stmt {
    char *name;
    char *sql;
    int nparams;
    Oid *types;
};

struct pawl_pgpool {
    struct pawl_pgpool_opts o;
    char *name;
    char *dsn;
    char **session_sql;
    int nsession;

    pthread_t thread;
    struct pawl_ioloop *loop; /* sockets, deadlines and wake-ups; owned by the I/O thread */
    /* Hosting (pawl_pgpool_opts.host, .guest_slots). driver: the pool whose I/O thread runs
     * this one, itself or its host; a guest shares its host's loop. A host's fields below
     * marked "mu" are under the host's mutex; "I/O thread" its thread's alone. */
    struct pawl_pgpool *driver;
    int guest_slots;   /* a host: slots kept for guests */
    int slots_given;   /* a host, mu: slots handed to guests so far */
    int ndriven_total; /* a host, mu: guests ever attached (at most MAX_GUESTS) */
    struct pawl_pgpool *attaching[MAX_GUESTS]; /* a host, mu: guests not yet adopted */
    int nattaching;                            /* a host, mu */
    atomic_int guests_changed; /* a host: a guest attached or is stopping; seq_cst */
    struct pawl_pgpool *driven[1 + MAX_GUESTS]; /* a host, I/O thread: itself, then guests */
    int ndriven;                                /* a host, I/O thread */
    struct conn **slot_conn; /* a host, I/O thread: each slot's connection, or NULL */
    int detached;            /* a guest, under its own mu: its host let it go; nothing drives it */
    int self_kick;           /* I/O thread only: its callbacks queued requests */
    int64_t loop_due_ns;     /* I/O thread only: when on_loop asked to be called again; 0 */
    atomic_int stop;         /* set by free(); read by the I/O thread after each wakeup */
    atomic_int nready;       /* connections READY; relaxed, informational */
    atomic_llong pending;    /* requests submitted and not completed */

    pthread_mutex_t mu;
    pthread_cond_t cond; /* signalled when a connection becomes READY or fails (for new) */
    struct pawl_pgreq *q_head, *q_tail; /* shared queue */
    char last_error[512];
    int attempts_done; /* connection attempts finished (ok or failed), for pawl__pgpool_new */
    /* The earliest deadline of a pawl__pgpool_wait_ready caller, 0 none; written under mu, read
     * by the I/O thread's every pass without it. The loop carries it (io_uring timeout or epoll
     * timeout: no timed condition wait) and broadcasts cond when it passes; waiters re-check
     * their own deadlines. */
    _Atomic int64_t wake_at_ns;
    int io_exited; /* under mu: the I/O thread has left its loop; nothing times waits any more */

    /* Prepared statements: entries are immutable once published through nprepared. */
    struct prepared_stmt prep[MAX_PREPARED];
    atomic_int nprepared; /* release on publish, acquire on read */

    int nconns;
    struct conn conns[];
};

/* Copy src into dst (truncating to len - 1 bytes) without its trailing newlines and spaces. */
static inline void copy_trimmed(char *dst, size_t len, const char *src)
{
    if (len == 0)
        return;
    size_t n = src ? strnlen(src, len - 1) : 0;
    memcpy(dst, src ? src : "", n);
    dst[n] = '\0';
    while (n > 0 && (dst[n - 1] == '\n' || dst[n - 1] == ' '))
        dst[--n] = '\0';
}

/* SQLSTATE classes 57 (operator intervention) and 08 (connection exception): the server is
 * ending the session. */
static inline int ends_session(const char *sqlstate)
{
    return sqlstate && (strncmp(sqlstate, "57", 2) == 0 || strncmp(sqlstate, "08", 2) == 0);
}

/* ---- pgpool.c ------------------------------------------------------------------------------ */
void pawl__pgpool_complete(struct pawl_pgpool *p, struct pawl_pgreq *r, int rc);
void pawl__pgpool_set_error(struct pawl_pgpool *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void pawl__pgpool_attempt_done(struct pawl_pgpool *p);

/* ---- pgconn.c ------------------------------------------------------------------------------ */
void pawl__pgconn_start(struct conn *c);
void pawl__pgconn_break(struct conn *c, const char *why);
int pawl__pgconn_setup_done(struct conn *c);
void pawl__pgconn_on_io(struct conn *c, uint32_t ev);
void pawl__pgconn_watch(struct conn *c, uint32_t events);
void pawl__pgconn_close(struct conn *c);

/* ---- pgpipe.c ------------------------------------------------------------------------------ */
int pawl__pgpipe_expect(struct conn *c, enum ekind kind, int arg, struct pawl_pgreq *req);
void pawl__pgpipe_dispatch(struct pawl_pgpool *p);
int pawl__pgpipe_recv(struct conn *c);
void pawl__pgpipe_lost(struct conn *c, const char *why);

#endif
