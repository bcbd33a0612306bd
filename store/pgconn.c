/*
 * pgconn.c — the pipelined connection pool (see pgconn.h for the contract).
 *
 * One I/O thread runs an event loop (engine/runtime/ioloop.h: io_uring, or epoll where io_uring
 * is refused) over the pool's sockets, the connections' deadlines and a wake-up that submitters
 * trigger. Each connection is a state machine (the drawing is kept out of clang-format's reach,
 * which would reflow its lines):
 */
// clang-format off
/*
 *   DOWN --start--> CONNECTING --PQconnectPoll OK--> SETUP --session Sync--> READY
 *     ^                 | fail/timeout                  | error                 | socket/libpq error
 *     +---- BACKOFF <---+-------------------------------+-----------------------+
 */
// clang-format on
/*
 * Send cursor: requests move from the pool queue (or the connection's pinned queue) to the
 * connection while it is READY, has fewer than max_inflight requests outstanding, and its
 * output is drained (PQflush() returned 0). Receive cursor: a FIFO of "expected results"
 * (session statement, prepare, request statement, Sync) matched one to one, in order, with what
 * PQgetResult returns. A statement's results end with a NULL from PQgetResult; a Sync's result
 * (PGRES_PIPELINE_SYNC) is not followed by NULL.
 *
 * Input is consumed when the loop reports the socket readable (PQconsumeInput), and results are
 * taken only while PQisBusy() is false, so the thread never blocks in libpq. A connection in
 * the middle of a multi-request transaction (a NOSYNC request was its last) takes only pinned
 * requests, never shared ones, so no one else's statement lands in that transaction.
 *
 * Locking: the pool mutex protects the shared queue, the pinned queues and the connection
 * state flags read by other threads. The I/O thread owns every PGconn and the receive FIFOs.
 */
#include "pgconn.h"

#include "common.h"
#include "dsn.h"
#include "ioloop.h"
#include "pawl/runtime.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_PREPARED 128
#define MAX_CONNS 64
/* While connection attempts keep failing, a warning this often (each retry is at debug). */
#define CONNECT_WARN_NS (10 * 1000000000LL)

enum cstate { C_DOWN, C_CONNECTING, C_SETUP, C_READY, C_BACKOFF };

enum ekind { E_SETUP, E_PREPARE, E_STMT, E_SYNC };

struct expect {
    enum ekind kind;
    int arg; /* statement index (E_STMT), prepared id (E_PREPARE) */
    struct pawl_pgreq *req;
};

struct conn {
    struct pawl_pgpool *pool;
    int index;
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
    int self_kick;            /* I/O thread only: its callbacks queued requests */
    int64_t loop_due_ns;      /* I/O thread only: when on_loop asked to be called again; 0 */
    atomic_int stop;          /* set by free(); read by the I/O thread after each wakeup */
    atomic_int nready;        /* connections READY; relaxed, informational */
    atomic_llong pending;     /* requests submitted and not completed */

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

/* ---------------------------------------------------------------------------------------- */

void pawl__pgpool_opts_defaults(struct pawl_pgpool_opts *o)
{
    memset(o, 0, sizeof *o);
    o->name = "pg";
    o->connections = 2;
    o->reconnect_min_ms = 100;
    o->reconnect_max_ms = 5000;
    o->connect_timeout_ms = 10000;
    o->max_inflight = 512;
    o->queue_timeout_ms = 10000;
}

/* The pool whose I/O thread this is (NULL elsewhere): a request submitted from one of its own
 * callbacks needs no wake-up, only a loop pass that does not sleep before dispatching it. */
static _Thread_local struct pawl_pgpool *io_self;

static void wake(struct pawl_pgpool *p)
{
    if (io_self == p)
        p->self_kick = 1;
    else
        pawl__ioloop_wake(p->loop); /* orders the queue writes made under the mutex before it */
}

static void set_error(struct pawl_pgpool *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_error(struct pawl_pgpool *p, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&p->mu);
    va_start(ap, fmt);
    vsnprintf(p->last_error, sizeof p->last_error, fmt, ap);
    va_end(ap);
    size_t n = strlen(p->last_error);
    while (n > 0 && (p->last_error[n - 1] == '\n' || p->last_error[n - 1] == ' '))
        p->last_error[--n] = '\0';
    pthread_mutex_unlock(&p->mu);
}

/* Copy src into dst (truncating to len - 1 bytes) without its trailing newlines and spaces. */
static void copy_trimmed(char *dst, size_t len, const char *src)
{
    if (len == 0)
        return;
    size_t n = src ? strnlen(src, len - 1) : 0;
    memcpy(dst, src ? src : "", n);
    dst[n] = '\0';
    while (n > 0 && (dst[n - 1] == '\n' || dst[n - 1] == ' '))
        dst[--n] = '\0';
}

/* Complete a request: runs its callback on the I/O thread. */
/* SQLSTATE classes 57 (operator intervention) and 08 (connection exception): the server is
 * ending the session. */
static int ends_session(const char *sqlstate)
{
    return sqlstate && (strncmp(sqlstate, "57", 2) == 0 || strncmp(sqlstate, "08", 2) == 0);
}

static void complete(struct pawl_pgpool *p, struct pawl_pgreq *r, int rc)
{
    PAWL_ASSERT(io_self == p); /* callbacks run on the I/O thread, and only there */
    /* relaxed: a statistic; completion order is carried by the callback itself. */
    atomic_fetch_sub_explicit(&p->pending, 1, memory_order_relaxed);
    r->_next = NULL;
    r->on_done(r, rc);
}

/* ---- the receive FIFO -------------------------------------------------------------------- */

static int exp_push(struct conn *c, enum ekind kind, int arg, struct pawl_pgreq *req)
{
    PAWL_ASSERT(io_self == c->pool); /* the I/O thread owns the PGconn and the FIFO */
    if (c->exp_len == c->exp_cap) {
        size_t ncap = c->exp_cap ? c->exp_cap * 2 : 256;
        struct expect *n = pawl_malloc(ncap * sizeof *n);
        if (n == NULL)
            return PAWL_ENOMEM;
        for (size_t i = 0; i < c->exp_len; i++)
            n[i] = c->exp[(c->exp_head + i) % c->exp_cap];
        pawl_free(c->exp);
        c->exp = n;
        c->exp_cap = ncap;
        c->exp_head = 0;
    }
    c->exp[(c->exp_head + c->exp_len) % c->exp_cap] = (struct expect){kind, arg, req};
    c->exp_len++;
    return 0;
}

static struct expect *exp_front(struct conn *c)
{
    return c->exp_len ? &c->exp[c->exp_head] : NULL;
}

static void exp_pop(struct conn *c)
{
    PAWL_ASSERT(io_self == c->pool); /* the I/O thread owns the PGconn and the FIFO */
    PAWL_ASSERT(c->exp_len > 0);     /* a result arrived for something we sent */
    c->exp_head = (c->exp_head + 1) % c->exp_cap;
    c->exp_len--;
}

/* ---- socket interest ---------------------------------------------------------------------- */

static void reg(struct conn *c, uint32_t events)
{
    PAWL_ASSERT(io_self == c->pool); /* the I/O thread owns the connection */
    struct pawl_pgpool *p = c->pool;
    int fd = c->pg ? PQsocket(c->pg) : -1;
    if (fd == c->fd && (fd < 0 || events == c->events))
        return;
    if (pawl__ioloop_watch(p->loop, (unsigned)c->index, fd, events) != 0) {
        PAWL_ERROR("pgconn", "%s: cannot watch connection %d's socket: %s", p->name, c->index,
                   strerror(errno));
        pawl__ioloop_watch(p->loop, (unsigned)c->index, -1, 0);
        fd = -1;
    }
    c->fd = fd;
    c->events = fd >= 0 ? events : 0;
}

static void unreg(struct conn *c)
{
    PAWL_ASSERT(io_self == c->pool); /* the I/O thread owns the connection */
    pawl__ioloop_watch(c->pool->loop, (unsigned)c->index, -1, 0);
    c->fd = -1;
    c->events = 0;
}

/* ---- connection life cycle --------------------------------------------------------------- */

/* The connection's legal transitions: DOWN or BACKOFF -> CONNECTING -> SETUP -> READY, and any
 * state -> BACKOFF on a failure. */
#define CBIT(s) (1u << (s))
static const unsigned legal_from[] = {
    [C_CONNECTING] = CBIT(C_DOWN) | CBIT(C_BACKOFF),
    [C_SETUP] = CBIT(C_CONNECTING),
    [C_READY] = CBIT(C_SETUP),
    [C_BACKOFF] =
        CBIT(C_DOWN) | CBIT(C_CONNECTING) | CBIT(C_SETUP) | CBIT(C_READY) | CBIT(C_BACKOFF),
};

static void set_state(struct conn *c, enum cstate s)
{
    struct pawl_pgpool *p = c->pool;
    PAWL_ASSERT(io_self == p); /* written by the I/O thread only */
    PAWL_ASSERT(s < PAWL_ARRAY_LEN(legal_from) && (legal_from[s] & CBIT(c->state)));
    pthread_mutex_lock(&p->mu);
    if (c->state == C_READY && s != C_READY)
        atomic_fetch_sub_explicit(&p->nready, 1, memory_order_relaxed); /* statistic */
    if (c->state != C_READY && s == C_READY)
        atomic_fetch_add_explicit(&p->nready, 1, memory_order_relaxed); /* statistic */
    c->state = s;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mu);
}

static void start_connect(struct conn *c);

/*
 * The connection failed (during connect, setup or while running): fail what was in flight,
 * close, and schedule a reconnect after back-off.
 */
static void conn_break(struct conn *c, const char *why_in)
{
    PAWL_ASSERT(io_self == c->pool); /* the I/O thread owns the connection */
    struct pawl_pgpool *p = c->pool;
    char dsnbuf[256];
    /* libpq's messages span lines; logs and request messages want one. */
    char why[512];
    /* A connection error may quote the DSN (a host name, a malformed value): never a secret. */
    pawl__dsn_scrub(p->dsn, why_in ? why_in : "", why, sizeof why);
    for (size_t n = strlen(why); n > 0 && (why[n - 1] == '\n' || why[n - 1] == ' ');)
        why[--n] = '\0';
    for (char *q = why; *q; q++)
        if (*q == '\n' || *q == '\t')
            *q = ' ';
    /* A session that was serving requests is lost; one still being set up counts as a failed
     * attempt to connect (an outage or a setup that keeps failing reports like one). */
    int was_ready = c->state == C_READY;
    if (was_ready) {
        PAWL_WARN("pgconn", "%s[%d]: connection lost: %s", p->name, c->index, why);
    } else {
        /* An outage retries every reconnect_max_ms per connection: one warning when the
         * attempts start failing, then one every CONNECT_WARN_NS, each retry at debug. */
        int64_t now = pawl_now_ns();
        if (c->connect_fails++ == 0) {
            c->fail_since = c->fail_warned = now;
            PAWL_WARN("pgconn", "%s[%d]: cannot connect to %s: %s", p->name, c->index,
                      pawl_dsn_redact(p->dsn, dsnbuf, sizeof dsnbuf), why);
        } else if (now - c->fail_warned >= CONNECT_WARN_NS) {
            c->fail_warned = now;
            PAWL_WARN("pgconn",
                      "%s[%d]: still cannot connect to %s: %d attempts over %lld s, the last: %s",
                      p->name, c->index, pawl_dsn_redact(p->dsn, dsnbuf, sizeof dsnbuf),
                      c->connect_fails, (long long)((now - c->fail_since) / 1000000000), why);
        } else {
            PAWL_DEBUG("pgconn", "%s[%d]: cannot connect (attempt %d): %s", p->name, c->index,
                       c->connect_fails, why);
        }
    }
    set_error(p, "%s", why);

    unreg(c);
    if (c->pg)
        PQfinish(c->pg);
    c->pg = NULL;

    /* Requests handed to libpq: committed or not is unknown unless they could not commit. */
    struct pawl_pgreq *r = c->inflight_head;
    struct pawl_pgreq *fatal_req = c->fatal_req;
    int after_fatal = 0, fatal_idle = c->fatal_idle;
    c->fatal_req = NULL;
    c->fatal_idle = 0;
    c->sync_error = 0;
    c->prep_sqlstate[0] = '\0';
    c->setup_error[0] = '\0';
    c->inflight_head = c->inflight_tail = NULL;
    c->ninflight = 0;
    c->exp_len = 0;
    c->exp_head = 0;
    c->open_txn = 0;
    c->aborted = 0;
    c->want_write = 0;
    memset(c->prepared, 0, sizeof c->prepared);
    while (r) {
        struct pawl_pgreq *next = r->_next;
        int rc;
        int session_ended = r->failed_stmt >= 0 && ends_session(r->sqlstate);
        if (session_ended && (r->flags & PAWL_PGREQ_IMPLICIT) && strncmp(r->sqlstate, "57", 2) == 0)
            rc = PAWL_ECONN; /* ended mid-statement: the Sync's commit never ran */
        else if (session_ended && r->_sync_sent && !(r->flags & PAWL_PGREQ_READONLY) &&
                 r->failed_stmt == r->nstmts - 1)
            rc = PAWL_EINDOUBT; /* the session ended around the final statement (a COMMIT?) */
        else if (session_ended)
            rc = PAWL_ECONN; /* the server ended the session mid-transaction: not committed */
        else if (r->_skipped && r->_ok_upto == 0)
            rc = PAWL_ECONN; /* never run: what preceded it failed (the session ending, say) */
        else if (r->failed_stmt >= 0)
            rc = PAWL_ESQL; /* the server already refused it: nothing committed */
        else if ((r->flags & PAWL_PGREQ_READONLY) || !r->_sync_sent)
            rc = PAWL_ECONN;
        else
            rc = PAWL_EINDOUBT;
        if (after_fatal ||
            (fatal_idle && r->_ok_upto == 0 && r->failed_stmt < 0 && r->_nrecv == 0)) {
            /* The server ended the session before it read this request. */
            rc = PAWL_ECONN;
        }
        if (r == fatal_req)
            after_fatal = 1;
        if (rc != PAWL_ESQL) {
            snprintf(r->message, sizeof r->message, "%s: %.180s",
                     rc == PAWL_EINDOUBT ? "connection lost after the commit was sent"
                                         : "connection lost",
                     why);
        }
        complete(p, r, rc);
        r = next;
    }

    /* Pinned requests belong to this connection's session, which is gone. */
    pthread_mutex_lock(&p->mu);
    struct pawl_pgreq *pin = c->pinned_head;
    c->pinned_head = c->pinned_tail = NULL;
    pthread_mutex_unlock(&p->mu);
    while (pin) {
        struct pawl_pgreq *next = pin->_next;
        snprintf(pin->message, sizeof pin->message, "connection lost: %.200s", why);
        complete(p, pin, PAWL_ECONN);
        pin = next;
    }

    if (c->backoff_ms <= 0)
        c->backoff_ms = p->o.reconnect_min_ms;
    /* Jitter (±25%) keeps many processes from reconnecting in lock step. */
    int64_t ms = c->backoff_ms - c->backoff_ms / 4 + (int64_t)(rand() % (c->backoff_ms / 2 + 1));
    c->deadline_ns = pawl_now_ns() + ms * 1000000;
    c->backoff_ms = PAWL_MIN(c->backoff_ms * 2, p->o.reconnect_max_ms);
    set_state(c, C_BACKOFF);

    pthread_mutex_lock(&p->mu);
    p->attempts_done++;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mu);
}

static void start_connect(struct conn *c)
{
    PAWL_ASSERT(io_self == c->pool); /* the I/O thread owns the connection */
    struct pawl_pgpool *p = c->pool;
    c->pg = pawl_pq_connect(p->dsn, 1);
    if (c->pg == NULL) {
        conn_break(c, "out of memory");
        return;
    }
    if (PQstatus(c->pg) == CONNECTION_BAD) {
        char msg[512];
        copy_trimmed(msg, sizeof msg, PQerrorMessage(c->pg));
        conn_break(c, msg);
        return;
    }
    c->poll = PGRES_POLLING_WRITING;
    c->deadline_ns = pawl_now_ns() + (int64_t)p->o.connect_timeout_ms * 1000000;
    set_state(c, C_CONNECTING);
    reg(c, PAWL_IO_OUT);
}

/*
 * Notices: the server's messages outside a statement's result. A FATAL one (class 57 or 08)
 * means the server is ending the session while it was idle, which tells us that nothing still
 * unanswered was executed. Others are logged at debug level instead of printed on stderr.
 */
static void notice_rx(void *arg, const PGresult *res)
{
    struct conn *c = arg;
    const char *sev = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
    const char *ss = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    if (sev && strcmp(sev, "FATAL") == 0 && ends_session(ss))
        c->fatal_idle = 1;
    PAWL_DEBUG("pgconn", "%s[%d]: server says: %s", c->pool->name, c->index,
               PQresultErrorMessage(res));
}

/* Send the session statements, then a Sync; the Sync's result makes the connection READY. */
static void start_setup(struct conn *c)
{
    PAWL_ASSERT(io_self == c->pool); /* the I/O thread owns the connection */
    struct pawl_pgpool *p = c->pool;
    c->fatal_idle = 0;
    c->fatal_req = NULL;
    PQsetNoticeReceiver(c->pg, notice_rx, c);
    if (PQsetnonblocking(c->pg, 1) != 0 || PQenterPipelineMode(c->pg) != 1) {
        conn_break(c, PQerrorMessage(c->pg));
        return;
    }
    for (int i = 0; i < p->nsession; i++) {
        if (!PQsendQueryParams(c->pg, p->session_sql[i], 0, NULL, NULL, NULL, NULL, 0) ||
            exp_push(c, E_SETUP, i, NULL) != 0) {
            conn_break(c, PQerrorMessage(c->pg));
            return;
        }
    }
    if (!PQpipelineSync(c->pg) || exp_push(c, E_SYNC, 0, NULL) != 0) {
        conn_break(c, PQerrorMessage(c->pg));
        return;
    }
    set_state(c, C_SETUP);
    int f = PQflush(c->pg);
    if (f < 0) {
        conn_break(c, PQerrorMessage(c->pg));
        return;
    }
    c->want_write = f == 1;
    reg(c, PAWL_IO_IN | (c->want_write ? PAWL_IO_OUT : 0));
}

static void connect_step(struct conn *c)
{
    PAWL_ASSERT(io_self == c->pool); /* the I/O thread owns the connection */
    c->poll = PQconnectPoll(c->pg);
    switch (c->poll) {
    case PGRES_POLLING_READING:
        reg(c, PAWL_IO_IN);
        break;
    case PGRES_POLLING_WRITING:
        reg(c, PAWL_IO_OUT);
        break;
    case PGRES_POLLING_OK:
        start_setup(c);
        break;
    default: {
        char msg[512];
        copy_trimmed(msg, sizeof msg, PQerrorMessage(c->pg));
        conn_break(c, msg[0] ? msg : "connection failed");
        break;
    }
    }
}

/* ---- sending ----------------------------------------------------------------------------- */

/* Hand one request to libpq. Returns 0, or -1 when the connection broke (request re-queued). */
static int send_req(struct conn *c, struct pawl_pgreq *r)
{
    PAWL_ASSERT(io_self == c->pool); /* the I/O thread owns the PGconn and the FIFO */
    struct pawl_pgpool *p = c->pool;
    int nprep = atomic_load_explicit(&p->nprepared, memory_order_acquire); /* entries below */
    r->failed_stmt = -1;
    r->sqlstate[0] = '\0';
    r->message[0] = '\0';
    r->conn_index = c->index;
    r->_nsent = 0;
    r->_nrecv = 0;
    r->_sync_sent = 0;
    r->_ok_upto = 0;
    r->_skipped = 0;
    for (int i = 0; i < r->nstmts; i++) {
        const struct pawl_pgstmt *s = &r->stmts[i];
        int ok;
        if (s->sql != NULL) {
            ok = PQsendQueryParams(c->pg, s->sql, s->nparams, NULL, s->values, s->lengths,
                                   s->formats, s->result_binary);
        } else {
            (void)nprep; /* ids were checked against it at submit */
            const struct prepared_stmt *ps = &p->prep[s->prepared];
            if (!c->prepared[s->prepared]) {
                if (!PQsendPrepare(c->pg, ps->name, ps->sql, ps->nparams, ps->types))
                    goto broken;
                if (exp_push(c, E_PREPARE, s->prepared, NULL) != 0)
                    goto broken;
                c->prepared[s->prepared] = 1;
            }
            ok = PQsendQueryPrepared(c->pg, ps->name, s->nparams, s->values, s->lengths, s->formats,
                                     s->result_binary);
        }
        if (!ok || exp_push(c, E_STMT, i, r) != 0)
            goto broken;
        r->_nsent++;
        if (s->flush_after && !PQsendFlushRequest(c->pg))
            goto broken;
    }
    if (r->flags & PAWL_PGREQ_NOSYNC) {
        if (!PQsendFlushRequest(c->pg))
            goto broken;
        c->open_txn = 1;
    } else {
        if (!PQpipelineSync(c->pg) || exp_push(c, E_SYNC, 0, r) != 0)
            goto broken;
        r->_sync_sent = 1;
        c->open_txn = 0;
    }
    r->_next = NULL;
    if (c->inflight_tail)
        c->inflight_tail->_next = r;
    else
        c->inflight_head = r;
    c->inflight_tail = r;
    c->ninflight++;
    return 0;

broken:
    /* Part of it may be in libpq's buffer: account it as in flight so it fails as such. */
    r->_next = NULL;
    if (c->inflight_tail)
        c->inflight_tail->_next = r;
    else
        c->inflight_head = r;
    c->inflight_tail = r;
    c->ninflight++;
    {
        char msg[512];
        copy_trimmed(msg, sizeof msg, PQerrorMessage(c->pg));
        conn_break(c, msg[0] ? msg : "send failed");
    }
    return -1;
}

/* Pop the oldest request of one of the pool's queues (a connection's pinned queue or the
 * shared one), under the pool's mutex. */
static struct pawl_pgreq *pop_locked(struct pawl_pgpool *p, struct pawl_pgreq **head,
                                     struct pawl_pgreq **tail)
{
    pthread_mutex_lock(&p->mu);
    struct pawl_pgreq *r = *head;
    if (r) {
        *head = r->_next;
        if (!*head)
            *tail = NULL;
    }
    pthread_mutex_unlock(&p->mu);
    return r;
}

static int can_send(const struct conn *c)
{
    return c->state == C_READY && !c->want_write && c->ninflight < c->pool->o.max_inflight;
}

/*
 * The send cursor of the whole pool: pinned requests go to their connection; shared ones to
 * the eligible connection with the fewest requests in flight (so a burst spreads over every
 * connection instead of filling the first). Then every connection that got work is flushed.
 */
static void dispatch(struct pawl_pgpool *p)
{
    PAWL_ASSERT(io_self == p); /* the I/O thread's own work */
    int got[MAX_CONNS] = {0};
    for (int i = 0; i < p->nconns; i++) {
        struct conn *c = &p->conns[i];
        while (can_send(c)) {
            struct pawl_pgreq *r = pop_locked(p, &c->pinned_head, &c->pinned_tail);
            if (r == NULL)
                break;
            if (send_req(c, r) != 0)
                break;
            got[i]++;
        }
    }
    for (;;) {
        struct conn *best = NULL;
        for (int i = 0; i < p->nconns; i++) {
            struct conn *c = &p->conns[i];
            if (can_send(c) && !c->open_txn && (!best || c->ninflight < best->ninflight))
                best = c;
        }
        if (best == NULL)
            break;
        struct pawl_pgreq *r = pop_locked(p, &p->q_head, &p->q_tail);
        if (r == NULL)
            break;
        if (send_req(best, r) == 0)
            got[best->index]++;
    }
    for (int i = 0; i < p->nconns; i++) {
        struct conn *c = &p->conns[i];
        if (c->state != C_READY)
            continue;
        if (got[i] && !c->want_write) {
            int f = PQflush(c->pg);
            if (f < 0) {
                conn_break(c, PQerrorMessage(c->pg));
                continue;
            }
            c->want_write = f == 1;
        }
        reg(c, PAWL_IO_IN | (c->want_write ? PAWL_IO_OUT : 0));
    }
}

/* ---- receiving --------------------------------------------------------------------------- */

/* The request's first failure: statement stmt, with SQLSTATE and message. Later ones keep it. */
static void fail_req(struct pawl_pgreq *r, int stmt, const char *sqlstate, const char *message)
{
    if (r->failed_stmt >= 0)
        return;
    r->failed_stmt = stmt;
    snprintf(r->sqlstate, sizeof r->sqlstate, "%s", sqlstate);
    copy_trimmed(r->message, sizeof r->message, message);
}

static void req_error(struct pawl_pgreq *r, int stmt, const PGresult *res, const char *fallback)
{
    const char *st = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    fail_req(r, stmt, st ? st : "", msg ? msg : fallback);
}

static void remove_inflight(struct conn *c, struct pawl_pgreq *r)
{
    PAWL_ASSERT(io_self == c->pool); /* the I/O thread owns the connection */
    /* Requests complete in order, so r is the head. */
    struct pawl_pgreq **pp = &c->inflight_head, *prev = NULL;
    while (*pp && *pp != r) {
        prev = *pp;
        pp = &(*pp)->_next;
    }
    if (*pp == NULL)
        return;
    *pp = r->_next;
    if (c->inflight_tail == r)
        c->inflight_tail = prev;
    PAWL_ASSERT(c->ninflight > 0);
    c->ninflight--;
}

static void finish_req(struct conn *c, struct pawl_pgreq *r)
{
    remove_inflight(c, r);
    complete(c->pool, r, r->failed_stmt >= 0 ? PAWL_ESQL : 0);
}

/* Handle one non-NULL result for the front expectation. Returns 1 if the item is done. */
static int on_result(struct conn *c, struct expect *e, PGresult *res)
{
    struct pawl_pgpool *p = c->pool;
    ExecStatusType st = PQresultStatus(res);
    if (st == PGRES_FATAL_ERROR && e->kind != E_STMT) {
        const char *ss = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        if (ends_session(ss))
            c->fatal_idle = 1; /* the server is ending the session */
    }
    switch (e->kind) {
    case E_SETUP:
        if (st == PGRES_FATAL_ERROR) {
            const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
            if (e->arg >= 0 && c->setup_error[0] == '\0') {
                /* What the session relies on is not in place: the setup fails (reported, and
                 * retried after back-off, by conn_break). Statements after it are skipped. */
                snprintf(c->setup_error, sizeof c->setup_error,
                         "session statement \"%.120s\" failed: %.200s", p->session_sql[e->arg],
                         msg ? msg : "error");
            } else if (e->arg < 0) {
                PAWL_WARN("pgconn", "%s[%d]: ROLLBACK of a failed transaction block failed: %s",
                          p->name, c->index, msg ? msg : "error");
            }
            c->aborted = 1;
        }
        return 0;
    case E_PREPARE:
        if (st != PGRES_COMMAND_OK) {
            c->prepared[e->arg] = 0; /* failed or skipped: prepare again next time */
            if (st == PGRES_FATAL_ERROR) {
                c->aborted = 1;
                const char *ss = PQresultErrorField(res, PG_DIAG_SQLSTATE);
                const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
                snprintf(c->prep_sqlstate, sizeof c->prep_sqlstate, "%s", ss ? ss : "");
                snprintf(c->prep_message, sizeof c->prep_message, "preparing the statement: %s",
                         msg ? msg : "failed");
            }
        }
        return 0;
    case E_STMT: {
        struct pawl_pgreq *r = e->req;
        if (st == PGRES_FATAL_ERROR) {
            const char *ss = PQresultErrorField(res, PG_DIAG_SQLSTATE);
            if (ends_session(ss)) {
                c->fatal_req = r;
                c->fatal_idle = 1;
            }
        }
        if (st == PGRES_FATAL_ERROR && r->_ok_upto > e->arg) {
            /* The statement had completed; the session ended afterwards (a FATAL sent when
             * the backend was terminated). Not a failure of the statement. */
            c->aborted = 1;
            return 0;
        }
        if (st == PGRES_FATAL_ERROR) {
            req_error(r, e->arg, res, "statement failed");
            c->aborted = 1;
        } else if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK || st == PGRES_SINGLE_TUPLE) {
            r->_ok_upto = e->arg + 1;
        } else if (st == PGRES_PIPELINE_ABORTED) {
            if (c->prep_sqlstate[0] != '\0' && !ends_session(c->prep_sqlstate)) {
                /* Its own statement could not be prepared: the server refused it. */
                fail_req(r, e->arg, c->prep_sqlstate, c->prep_message);
            } else if (r->failed_stmt < 0) {
                r->_skipped = 1;
                fail_req(r, e->arg, "25P02",
                         "not run: an earlier statement in this transaction failed");
            }
            c->prep_sqlstate[0] = '\0';
        }
        if (r->stmts[e->arg].on_result) {
            r->stmts[e->arg].on_result(r->stmts[e->arg].ud, res);
            if (r->stmts[e->arg].keep_result)
                return 2; /* ownership passed: the caller must not clear it */
        }
        return 0;
    }
    case E_SYNC:
        if (st == PGRES_FATAL_ERROR && e->req) {
            const char *ss = PQresultErrorField(res, PG_DIAG_SQLSTATE);
            if (ends_session(ss)) {
                c->fatal_req = e->req;
            } else if (ss) {
                /*
                 * The implicit COMMIT at the Sync failed (a serialization failure or deadlock
                 * found at commit, a deferred constraint): a definite rollback of this request
                 * only. The session goes on; PGRES_PIPELINE_SYNC follows.
                 */
                struct pawl_pgreq *r = e->req;
                req_error(r, r->nstmts - 1, res, "commit failed");
                c->sync_error = 1;
                return 0;
            }
        }
        if (st != PGRES_PIPELINE_SYNC) {
            /* Unexpected: the protocol is out of step; treat as a broken connection. */
            return -1;
        }
        c->aborted = 0;
        c->sync_error = 0;
        c->prep_sqlstate[0] = '\0';
        return 1;
    }
    return 0;
}

/* Returns 0, or -1 when the connection broke. */
static int pump_recv(struct conn *c)
{
    PAWL_ASSERT(io_self == c->pool); /* the I/O thread owns the PGconn and the FIFO */
    struct pawl_pgpool *p = c->pool;
    for (;;) {
        struct expect *e = exp_front(c);
        if (e == NULL)
            break;
        if (PQisBusy(c->pg))
            break;
        PGresult *res = PQgetResult(c->pg);
        if (res == NULL) {
            /* End of one statement's results. */
            struct expect done = *e;
            if (done.kind == E_SYNC && c->sync_error) {
                c->sync_error = 0; /* the end of the commit's error result; the Sync follows */
                continue;
            }
            if (done.kind == E_SYNC)
                break; /* nothing more available yet */
            exp_pop(c);
            if (done.kind == E_STMT) {
                struct pawl_pgreq *r = done.req;
                r->_nrecv++;
                /* A NOSYNC request completes with its last statement. */
                if ((r->flags & PAWL_PGREQ_NOSYNC) && r->_nrecv == r->_nsent)
                    finish_req(c, r);
            }
            continue;
        }
        int d = on_result(c, e, res);
        if (d == 2)
            d = 0;
        else
            PQclear(res);
        if (d < 0) {
            conn_break(c, "protocol out of step (unexpected result)");
            return -1;
        }
        if (d == 1) {
            struct expect done = *e;
            exp_pop(c);
            if (done.req == NULL) {
                /* The session setup finished. */
                if (c->state == C_SETUP && c->setup_error[0]) {
                    conn_break(c, c->setup_error); /* copied before it clears it */
                    return -1;
                }
                if (c->state == C_SETUP) {
                    c->backoff_ms = 0;
                    if (c->connect_fails > 0) {
                        PAWL_INFO("pgconn",
                                  "%s[%d]: connected again, after %d failed attempt(s) over %.1f s",
                                  p->name, c->index, c->connect_fails,
                                  (double)(pawl_now_ns() - c->fail_since) / 1e9);
                        c->connect_fails = 0;
                    }
                    set_state(c, C_READY);
                    pthread_mutex_lock(&p->mu);
                    p->attempts_done++;
                    pthread_cond_broadcast(&p->cond);
                    pthread_mutex_unlock(&p->mu);
                    if (p->o.on_connect)
                        p->o.on_connect(p->o.hook_ud, c->index, PQbackendPID(c->pg));
                }
            } else {
                struct pawl_pgreq *r = done.req;
                finish_req(c, r);
                /*
                 * A request that opened a transaction block (BEGIN) and failed leaves the
                 * session in an aborted block, which a Sync does not end: roll it back so the
                 * connection stays usable. Requests already pipelined behind it fail (25P02).
                 */
                if (PQtransactionStatus(c->pg) == PQTRANS_INERROR && !c->open_txn) {
                    if (!PQsendQueryParams(c->pg, "ROLLBACK", 0, NULL, NULL, NULL, NULL, 0) ||
                        exp_push(c, E_SETUP, -1, NULL) != 0 || !PQpipelineSync(c->pg) ||
                        exp_push(c, E_SYNC, 0, NULL) != 0) {
                        conn_break(c, PQerrorMessage(c->pg));
                        return -1;
                    }
                    int f = PQflush(c->pg);
                    c->want_write = f == 1;
                }
            }
        }
    }
    PGnotify *n;
    while ((n = PQnotifies(c->pg)) != NULL) {
        if (p->o.on_notify)
            p->o.on_notify(p->o.hook_ud, n->relname, n->extra, n->be_pid);
        PQfreemem(n);
    }
    return 0;
}

static void on_io(struct conn *c, uint32_t ev)
{
    PAWL_ASSERT(io_self == c->pool); /* the I/O thread owns the PGconn and the FIFO */
    if (c->state == C_CONNECTING) {
        connect_step(c);
        return;
    }
    if (c->state != C_READY && c->state != C_SETUP)
        return;
    if (ev & PAWL_IO_OUT) {
        int f = PQflush(c->pg);
        if (f < 0) {
            conn_break(c, PQerrorMessage(c->pg));
            return;
        }
        c->want_write = f == 1;
    }
    /*
     * One read per wakeup, then the results it completed. A hang-up often arrives with the
     * server's last message (a FATAL error saying why the session ends, and so whether the
     * statement in flight had completed): libpq hands back that data from this read and reports
     * the end of the stream only on the next one, so the message is parsed before the
     * connection is dropped. The loop is level-triggered; the hang-up wakes it again.
     */
    if (ev & (PAWL_IO_IN | PAWL_IO_ERR)) {
        if (!PQconsumeInput(c->pg)) {
            char msg[512];
            copy_trimmed(msg, sizeof msg, PQerrorMessage(c->pg));
            conn_break(c, msg[0] ? msg : "connection closed");
            return;
        }
        if (pump_recv(c) != 0)
            return;
    }
    if (PQstatus(c->pg) == CONNECTION_BAD) {
        conn_break(c, PQerrorMessage(c->pg));
        return;
    }
}

/* ---- the I/O thread ---------------------------------------------------------------------- */

static void expire_queue(struct pawl_pgpool *p, int64_t now)
{
    PAWL_ASSERT(io_self == p); /* the I/O thread's own work */
    if (p->o.queue_timeout_ms <= 0 || atomic_load_explicit(&p->nready, memory_order_relaxed) > 0)
        return;
    int64_t limit = now - (int64_t)p->o.queue_timeout_ms * 1000000;
    struct pawl_pgreq *expired = NULL, **tail = &expired;
    pthread_mutex_lock(&p->mu);
    while (p->q_head && p->q_head->_queued_ns <= limit) {
        struct pawl_pgreq *r = p->q_head;
        p->q_head = r->_next;
        r->_next = NULL;
        *tail = r;
        tail = &r->_next;
    }
    if (!p->q_head)
        p->q_tail = NULL;
    for (int i = 0; i < p->nconns; i++) {
        struct conn *c = &p->conns[i];
        while (c->state != C_READY && c->pinned_head && c->pinned_head->_queued_ns <= limit) {
            struct pawl_pgreq *r = c->pinned_head;
            c->pinned_head = r->_next;
            if (!c->pinned_head)
                c->pinned_tail = NULL;
            r->_next = NULL;
            *tail = r;
            tail = &r->_next;
        }
    }
    char err[160];
    copy_trimmed(err, sizeof err, p->last_error);
    pthread_mutex_unlock(&p->mu);
    while (expired) {
        struct pawl_pgreq *next = expired->_next;
        expired->failed_stmt = -1;
        expired->sqlstate[0] = '\0';
        char msg[256];
        snprintf(msg, sizeof msg, "no database connection within %d ms: %s", p->o.queue_timeout_ms,
                 err[0] ? err : "still connecting");
        copy_trimmed(expired->message, sizeof expired->message, msg);
        complete(p, expired, PAWL_ECONN);
        expired = next;
    }
}

static void fail_all_queued(struct pawl_pgpool *p)
{
    PAWL_ASSERT(io_self == p); /* the I/O thread's own work */
    pthread_mutex_lock(&p->mu);
    struct pawl_pgreq *r = p->q_head;
    p->q_head = p->q_tail = NULL;
    pthread_mutex_unlock(&p->mu);
    while (r) {
        struct pawl_pgreq *next = r->_next;
        r->failed_stmt = -1;
        snprintf(r->message, sizeof r->message, "pool shut down");
        complete(p, r, PAWL_ESHUTDOWN);
        r = next;
    }
}

static void *io_main(void *arg)
{
    struct pawl_pgpool *p = arg;
    io_self = p;
    for (int i = 0; i < p->nconns; i++)
        start_connect(&p->conns[i]);

    struct pawl_ioev evs[MAX_CONNS];
    for (;;) {
        /* acquire: pairs with the release in pawl__pgpool_free. */
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            break;
        int64_t now = pawl_now_ns();
        int64_t next = now + 1000000000LL;
        for (int i = 0; i < p->nconns; i++) {
            struct conn *c = &p->conns[i];
            if (c->state == C_CONNECTING || c->state == C_BACKOFF)
                next = PAWL_MIN(next, c->deadline_ns);
        }
        if (p->o.queue_timeout_ms > 0 &&
            atomic_load_explicit(&p->nready, memory_order_relaxed) == 0)
            next = PAWL_MIN(next, now + 50000000LL);
        /* relaxed: a waiter that moves it earlier wakes the loop after storing it. */
        int64_t wake_at = atomic_load_explicit(&p->wake_at_ns, memory_order_relaxed);
        if (wake_at > 0)
            next = PAWL_MIN(next, wake_at);
        if (p->loop_due_ns > 0)
            next = PAWL_MIN(next, p->loop_due_ns);
        if (p->self_kick) {
            p->self_kick = 0;
            next = now; /* poll only: what our callbacks queued goes out in this pass */
        }
        int n = pawl__ioloop_wait(p->loop, next, evs);
        if (n < 0) {
            PAWL_ERROR("pgconn", "%s: the I/O loop failed; the pool stops", p->name);
            break;
        }
        for (int i = 0; i < n; i++)
            on_io(&p->conns[evs[i].slot], evs[i].events);
        now = pawl_now_ns();
        for (int i = 0; i < p->nconns; i++) {
            struct conn *c = &p->conns[i];
            if (c->state == C_BACKOFF && now >= c->deadline_ns)
                start_connect(c);
            else if (c->state == C_CONNECTING && now >= c->deadline_ns)
                conn_break(c, "connect timeout");
        }
        p->self_kick = 0; /* what callbacks queued so far goes out now */
        if (p->o.on_loop) {
            int64_t want = p->o.on_loop(p->o.hook_ud, now);
            p->loop_due_ns = want > 0 ? want : 0;
        }
        dispatch(p);
        expire_queue(p, now);
        if (wake_at > 0 && now >= wake_at) {
            pthread_mutex_lock(&p->mu);
            if (atomic_load_explicit(&p->wake_at_ns, memory_order_relaxed) <= now) {
                /* waiters still short of their deadline set it again */
                atomic_store_explicit(&p->wake_at_ns, 0, memory_order_relaxed);
                pthread_cond_broadcast(&p->cond);
            }
            pthread_mutex_unlock(&p->mu);
        }
    }
    /* Nothing times waits from here on: release the waiters. */
    pthread_mutex_lock(&p->mu);
    p->io_exited = 1;
    atomic_store_explicit(&p->wake_at_ns, 0, memory_order_relaxed);
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mu);

    /* Shutdown: fail everything. */
    for (int i = 0; i < p->nconns; i++) {
        struct conn *c = &p->conns[i];
        struct pawl_pgreq *r = c->inflight_head;
        c->inflight_head = c->inflight_tail = NULL;
        while (r) {
            struct pawl_pgreq *next = r->_next;
            int rc = (r->_sync_sent && !(r->flags & PAWL_PGREQ_READONLY)) ? PAWL_EINDOUBT
                                                                          : PAWL_ESHUTDOWN;
            snprintf(r->message, sizeof r->message, "pool shut down with the request in flight");
            complete(p, r, rc);
            r = next;
        }
        pthread_mutex_lock(&p->mu);
        r = c->pinned_head;
        c->pinned_head = c->pinned_tail = NULL;
        pthread_mutex_unlock(&p->mu);
        while (r) {
            struct pawl_pgreq *next = r->_next;
            snprintf(r->message, sizeof r->message, "pool shut down");
            complete(p, r, PAWL_ESHUTDOWN);
            r = next;
        }
        unreg(c);
        if (c->pg)
            PQfinish(c->pg);
        c->pg = NULL;
    }
    fail_all_queued(p);
    return NULL;
}

/* ---- public API -------------------------------------------------------------------------- */

int pawl__pgpool_new(struct pawl_pgpool **out, const char *dsn, const struct pawl_pgpool_opts *o,
                     int wait_ms, char *err, size_t errlen)
{
    struct pawl_pgpool_opts def;
    if (o == NULL) {
        pawl__pgpool_opts_defaults(&def);
        o = &def;
    }
    if (err && errlen)
        err[0] = '\0';
    if (out == NULL || o->connections < 1 || o->connections > MAX_CONNS ||
        o->reconnect_min_ms < 1 || o->reconnect_max_ms < o->reconnect_min_ms ||
        o->max_inflight < 1 || o->connect_timeout_ms < 1 || o->io_backend < 0 ||
        o->io_backend > PAWL_TIMER_BACKEND_EPOLL) {
        if (err && errlen)
            snprintf(err, errlen, "invalid connection pool options");
        return PAWL_EINVAL;
    }
    if (pawl_dsn_check(dsn, err, errlen) != 0)
        return PAWL_EINVAL;

    struct pawl_pgpool *p =
        pawl_calloc(1, sizeof *p + (size_t)o->connections * sizeof(struct conn));
    if (p == NULL)
        return PAWL_ENOMEM;
    int rc_fail = PAWL_ENOMEM;
    p->o = *o;
    p->nconns = o->connections;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cond, NULL);
    p->name = pawl__strdup(o->name ? o->name : "pg");
    p->dsn = pawl__strdup(dsn);
    if (p->name == NULL || p->dsn == NULL)
        goto fail;
    if (o->session_sql) {
        while (o->session_sql[p->nsession])
            p->nsession++;
        p->session_sql = pawl_calloc((size_t)p->nsession + 1, sizeof(char *));
        if (p->session_sql == NULL)
            goto fail;
        for (int i = 0; i < p->nsession; i++)
            if ((p->session_sql[i] = pawl__strdup(o->session_sql[i])) == NULL)
                goto fail;
    }
    p->o.name = p->name;
    p->o.session_sql = NULL;
    for (int i = 0; i < p->nconns; i++) {
        p->conns[i].pool = p;
        p->conns[i].index = i;
        p->conns[i].fd = -1;
        p->conns[i].state = C_DOWN;
    }
    struct pawl_ioloop_opts lo = {.backend = (enum pawl_timer_backend)o->io_backend};
    int lrc = pawl__ioloop_new(&p->loop, (unsigned)p->nconns, p->name, &lo);
    if (lrc != 0) {
        if (err && errlen)
            snprintf(err, errlen, "%s: cannot start the I/O loop: %s", p->name,
                     lrc == PAWL_ENOTSUP ? "io_uring is required and refused" : pawl_strerror(lrc));
        rc_fail = lrc;
        goto fail;
    }
    /* Published before the I/O thread starts: its hooks may read *out (thread creation
     * orders this store before them). */
    *out = p;
    if (pthread_create(&p->thread, NULL, io_main, p) != 0) {
        *out = NULL;
        goto fail;
    }
    char tname[32]; /* shown by top -H and perf; the kernel keeps 15 bytes */
    snprintf(tname, sizeof tname, "pg-%.12s", p->name);
    pthread_setname_np(p->thread, tname);

    if (wait_ms > 0) {
        int rc = pawl__pgpool_wait_ready(p, wait_ms, 1) == 0 ? 0 : PAWL_ECONN;
        pthread_mutex_lock(&p->mu);
        if (rc != 0 && err && errlen) {
            char d[256];
            snprintf(err, errlen, "cannot connect to %s: %s", pawl_dsn_redact(dsn, d, sizeof d),
                     p->last_error[0] ? p->last_error : "timed out");
        }
        pthread_mutex_unlock(&p->mu);
        if (rc != 0) {
            pawl__pgpool_free(p);
            *out = NULL;
            return rc;
        }
    }
    return 0;

fail:
    pawl__ioloop_free(p->loop);
    if (p->session_sql) {
        for (int i = 0; i < p->nsession; i++)
            pawl_free(p->session_sql[i]);
        pawl_free(p->session_sql);
    }
    pawl_free(p->dsn);
    pawl_free(p->name);
    pthread_cond_destroy(&p->cond);
    pthread_mutex_destroy(&p->mu);
    pawl_free(p);
    return rc_fail;
}

void pawl__pgpool_free(struct pawl_pgpool *p)
{
    if (p == NULL)
        return;
    /* release: the I/O thread sees stop after its next wakeup. */
    atomic_store_explicit(&p->stop, 1, memory_order_release);
    pawl__ioloop_wake(p->loop);
    pthread_join(p->thread, NULL);
    pawl__ioloop_free(p->loop);
    for (int i = 0; i < p->nconns; i++)
        pawl_free(p->conns[i].exp);
    int np = atomic_load_explicit(&p->nprepared, memory_order_acquire); /* all published */
    for (int i = 0; i < np; i++) {
        pawl_free(p->prep[i].name);
        pawl_free(p->prep[i].sql);
        pawl_free(p->prep[i].types);
    }
    for (int i = 0; i < p->nsession; i++)
        pawl_free(p->session_sql[i]);
    pawl_free(p->session_sql);
    pawl_free(p->dsn);
    pawl_free(p->name);
    pthread_cond_destroy(&p->cond);
    pthread_mutex_destroy(&p->mu);
    pawl_free(p);
}

int pawl__pgpool_prepare(struct pawl_pgpool *p, const char *sql, int nparams, const Oid *types)
{
    if (p == NULL || sql == NULL || nparams < 0)
        return PAWL_EINVAL;
    pthread_mutex_lock(&p->mu);
    int id = atomic_load_explicit(&p->nprepared, memory_order_relaxed);
    if (id >= MAX_PREPARED) {
        pthread_mutex_unlock(&p->mu);
        return PAWL_ENOMEM;
    }
    struct prepared_stmt *ps = &p->prep[id];
    char name[32];
    snprintf(name, sizeof name, "pawl_%d", id);
    ps->name = pawl__strdup(name);
    ps->sql = pawl__strdup(sql);
    ps->nparams = nparams;
    ps->types = NULL;
    if (types && nparams > 0) {
        ps->types = pawl_malloc((size_t)nparams * sizeof(Oid));
        if (ps->types)
            memcpy(ps->types, types, (size_t)nparams * sizeof(Oid));
    }
    if (ps->name == NULL || ps->sql == NULL || (types && nparams > 0 && ps->types == NULL)) {
        pawl_free(ps->name);
        pawl_free(ps->sql);
        pawl_free(ps->types);
        pthread_mutex_unlock(&p->mu);
        return PAWL_ENOMEM;
    }
    /* release: the entry's fields are visible before an I/O thread sees the new count. */
    atomic_store_explicit(&p->nprepared, id + 1, memory_order_release);
    pthread_mutex_unlock(&p->mu);
    return id;
}

static int submit(struct pawl_pgpool *p, int conn_index, struct pawl_pgreq *req)
{
    if (p == NULL || req == NULL || req->on_done == NULL || req->nstmts < 1 || req->stmts == NULL)
        return PAWL_EINVAL;
    if (conn_index >= p->nconns)
        return PAWL_EINVAL;
    if ((req->flags & PAWL_PGREQ_NOSYNC) && conn_index < 0)
        return PAWL_EINVAL;
    int nprep = atomic_load_explicit(&p->nprepared, memory_order_acquire); /* published ids */
    for (int i = 0; i < req->nstmts; i++)
        if (req->stmts[i].sql == NULL &&
            (req->stmts[i].prepared < 0 || req->stmts[i].prepared >= nprep))
            return PAWL_EINVAL;
    /* acquire: pairs with the release in pawl__pgpool_free. */
    if (atomic_load_explicit(&p->stop, memory_order_acquire))
        return PAWL_ESHUTDOWN;
    req->_next = NULL;
    req->failed_stmt = -1;
    req->sqlstate[0] = '\0';
    req->message[0] = '\0';
    req->conn_index = conn_index;
    req->_pinned = conn_index >= 0;
    req->_queued_ns = pawl_now_ns();
    /* relaxed: a statistic. */
    atomic_fetch_add_explicit(&p->pending, 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    if (conn_index >= 0) {
        struct conn *c = &p->conns[conn_index];
        if (c->pinned_tail)
            c->pinned_tail->_next = req;
        else
            c->pinned_head = req;
        c->pinned_tail = req;
    } else {
        if (p->q_tail)
            p->q_tail->_next = req;
        else
            p->q_head = req;
        p->q_tail = req;
    }
    pthread_mutex_unlock(&p->mu);
    wake(p);
    return 0;
}

int pawl__pgpool_submit(struct pawl_pgpool *p, struct pawl_pgreq *req)
{
    return submit(p, -1, req);
}

int pawl__pgpool_submit_on(struct pawl_pgpool *p, int conn_index, struct pawl_pgreq *req)
{
    if (conn_index < 0)
        return PAWL_EINVAL;
    return submit(p, conn_index, req);
}

int pawl__pgpool_on_io_thread(const struct pawl_pgpool *p)
{
    return p ? io_self == p : io_self != NULL;
}

void pawl__pgpool_wake(struct pawl_pgpool *p)
{
    wake(p);
}

const char *pawl__pgpool_io_backend(const struct pawl_pgpool *p)
{
    return pawl__ioloop_backend(p->loop);
}

void pawl__pgpool_loop_stats(const struct pawl_pgpool *p, struct pawl_pgpool_loop_stats *out)
{
    struct pawl_ioloop_stats st;
    pawl__ioloop_stats(p->loop, &st);
    *out = (struct pawl_pgpool_loop_stats){st.waits, st.enters, st.ctls, st.events, st.wakeups};
}

int pawl__pgpool_size(const struct pawl_pgpool *p)
{
    return p->nconns;
}

int pawl__pgpool_wait_ready(struct pawl_pgpool *p, int wait_ms, int first_attempts_only)
{
    PAWL_ASSERT(io_self != p || p == NULL); /* its own I/O thread would wait for itself */
    int64_t until = pawl_now_ns() + (int64_t)PAWL_MAX(wait_ms, 0) * 1000000;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->nready, memory_order_relaxed) == 0) {
        if ((first_attempts_only && p->attempts_done >= p->nconns) || p->io_exited ||
            atomic_load_explicit(&p->stop, memory_order_acquire)) {
            rc = PAWL_ECONN;
            break;
        }
        if (pawl_now_ns() >= until) {
            rc = PAWL_ETIMEDOUT;
            break;
        }
        /* The I/O thread times the wait: it broadcasts cond at the earliest waiter's deadline
         * (and on every connection's state change). */
        int64_t at = atomic_load_explicit(&p->wake_at_ns, memory_order_relaxed);
        if (at == 0 || until < at) {
            atomic_store_explicit(&p->wake_at_ns, until, memory_order_relaxed);
            pawl__ioloop_wake(p->loop);
        }
        pthread_cond_wait(&p->cond, &p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int pawl__pgpool_ready(const struct pawl_pgpool *p)
{
    /* relaxed: informational. */
    return atomic_load_explicit(&((struct pawl_pgpool *)p)->nready, memory_order_relaxed);
}

void pawl__pgpool_last_error(struct pawl_pgpool *p, char *buf, size_t len)
{
    pthread_mutex_lock(&p->mu);
    snprintf(buf, len, "%s", p->last_error);
    pthread_mutex_unlock(&p->mu);
}

int64_t pawl__pgpool_pending(const struct pawl_pgpool *p)
{
    /* relaxed: informational. */
    return atomic_load_explicit(&((struct pawl_pgpool *)p)->pending, memory_order_relaxed);
}

struct exec_wait {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int done;
    int rc;
};

static void exec_done(struct pawl_pgreq *req, int rc)
{
    struct exec_wait *w = req->ud;
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    w->rc = rc;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->mu);
}

int pawl__pgpool_exec(struct pawl_pgpool *p, int conn_index, struct pawl_pgreq *req)
{
    PAWL_ASSERT(io_self != p || p == NULL); /* its own I/O thread would wait for itself */
    struct exec_wait w = {.done = 0, .rc = 0};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cond, NULL);
    req->on_done = exec_done;
    req->ud = &w;
    int rc = submit(p, conn_index, req);
    if (rc == 0) {
        pawl_pool_will_block(); /* on a pool worker: do not hold queued tasks while we wait */
        pthread_mutex_lock(&w.mu);
        while (!w.done)
            pthread_cond_wait(&w.cond, &w.mu);
        pthread_mutex_unlock(&w.mu);
        rc = w.rc;
    }
    /* The request has completed: do not leave it pointing at this frame. */
    req->ud = NULL;
    pthread_cond_destroy(&w.cond);
    pthread_mutex_destroy(&w.mu);
    return rc;
}
