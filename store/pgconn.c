/*
 * pgconn.c — one connection of the pool (see pgconn.h for the contract, pgconn_internal.h for
 * how the pool's files divide the work): its life cycle as a state machine, driven by the pool's
 * I/O thread alone, which owns the PGconn. It connects without blocking (PQconnectPoll, at the
 * socket readiness the I/O loop reports), sends the session statements and a Sync in pipeline
 * mode, and becomes READY when that Sync's result arrives; from then on pgpipe.c's cursors use
 * it. Any failure (connecting, setting up, or a READY session lost) goes through
 * pawl__pgconn_break, which reports it, closes the session, fails what it held and schedules a
 * reconnect after a jittered, doubling back-off. The drawing is kept out of clang-format's
 * reach, which would reflow its lines:
 */
// clang-format off
/*
 *   DOWN --start--> CONNECTING --PQconnectPoll OK--> SETUP --session Sync--> READY
 *     ^                 | fail/timeout                  | error                 | socket/libpq error
 *     +---- BACKOFF <---+-------------------------------+-----------------------+
 */
// clang-format on
#include "pgconn_internal.h"

#include "dsn.h"
#include "ioloop.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- socket interest ---------------------------------------------------------------------- */

/* Watch c's socket for events (PAWL_IO_*) in the pool's I/O loop. */
void pawl__pgconn_watch(struct conn *c, uint32_t events)
{
    struct pawl_pgpool *p = c->pool;
    PAWL_ASSERT(pawl__pgpool_on_io_thread(p)); /* the I/O thread owns the connection */
    int fd = c->pg ? PQsocket(c->pg) : -1;
    if (fd == c->fd && (fd < 0 || events == c->events))
        return;
    if (pawl__ioloop_watch(p->loop, (unsigned)c->slot, fd, events) != 0) {
        PAWL_ERROR("pgconn", "%s: cannot watch connection %d's socket: %s", p->name, c->index,
                   strerror(errno));
        pawl__ioloop_watch(p->loop, (unsigned)c->slot, -1, 0);
        fd = -1;
    }
    c->fd = fd;
    c->events = fd >= 0 ? events : 0;
}

/* Stop watching c's socket and end its session (if any). */
void pawl__pgconn_close(struct conn *c)
{
    PAWL_ASSERT(pawl__pgpool_on_io_thread(c->pool)); /* the I/O thread owns the connection */
    pawl__ioloop_watch(c->pool->loop, (unsigned)c->slot, -1, 0);
    c->fd = -1;
    c->events = 0;
    if (c->pg)
        PQfinish(c->pg);
    c->pg = NULL;
}

/* ---- the state machine -------------------------------------------------------------------- */

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
    PAWL_ASSERT(pawl__pgpool_on_io_thread(p)); /* written by the I/O thread only */
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

/* ---- breaking: pawl__pgconn_break in its steps -------------------------------------------- */

/* why_in as one line without secrets: libpq's messages span lines, and a connection error may
 * quote the DSN (a host name, a malformed value). */
static void break_reason(const struct pawl_pgpool *p, const char *why_in, char *why, size_t len)
{
    pawl__dsn_scrub(p->dsn, why_in ? why_in : "", why, len);
    for (size_t n = strlen(why); n > 0 && (why[n - 1] == '\n' || why[n - 1] == ' ');)
        why[--n] = '\0';
    for (char *q = why; *q; q++)
        if (*q == '\n' || *q == '\t')
            *q = ' ';
}

/* Say so in the log: a session that was serving requests is lost (a warning each time); one
 * still being set up counts as a failed attempt to connect, so that an outage or a setup that
 * keeps failing reports like one: a warning when the attempts start failing, then one every
 * CONNECT_WARN_NS (an outage retries every reconnect_max_ms per connection), each retry at
 * debug. */
static void break_report(struct conn *c, const char *why)
{
    struct pawl_pgpool *p = c->pool;
    char dsnbuf[256];
    if (c->state == C_READY) {
        PAWL_WARN("pgconn", "%s[%d]: connection lost: %s", p->name, c->index, why);
        return;
    }
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

/* Pinned requests belong to this connection's session, which is gone: they fail. */
static void break_pinned(struct conn *c, const char *why)
{
    struct pawl_pgpool *p = c->pool;
    pthread_mutex_lock(&p->mu);
    struct pawl_pgreq *pin = c->pinned_head;
    c->pinned_head = c->pinned_tail = NULL;
    pthread_mutex_unlock(&p->mu);
    while (pin) {
        struct pawl_pgreq *next = pin->_next;
        snprintf(pin->message, sizeof pin->message, "connection lost: %.200s", why);
        pawl__pgpool_complete(p, pin, PAWL_ECONN);
        pin = next;
    }
}

/* Reconnect after the back-off: doubling from reconnect_min_ms to reconnect_max_ms, with a
 * jitter (±25%) that keeps many processes from reconnecting in lock step. */
static void break_backoff(struct conn *c)
{
    struct pawl_pgpool *p = c->pool;
    if (c->backoff_ms <= 0)
        c->backoff_ms = p->o.reconnect_min_ms;
    int64_t ms = c->backoff_ms - c->backoff_ms / 4 + (int64_t)(rand() % (c->backoff_ms / 2 + 1));
    c->deadline_ns = pawl_now_ns() + ms * 1000000;
    c->backoff_ms = PAWL_MIN(c->backoff_ms * 2, p->o.reconnect_max_ms);
    set_state(c, C_BACKOFF);
}

/*
 * The connection failed (during connect, setup or while running): say so, close, fail what was
 * in flight (pgpipe.c judges each request: in doubt or not) and what was pinned to it, and
 * schedule a reconnect after back-off.
 */
void pawl__pgconn_break(struct conn *c, const char *why_in)
{
    struct pawl_pgpool *p = c->pool;
    PAWL_ASSERT(pawl__pgpool_on_io_thread(p)); /* the I/O thread owns the connection */
    char why[512];
    break_reason(p, why_in, why, sizeof why);
    break_report(c, why);
    pawl__pgpool_set_error(p, "%s", why);
    pawl__pgconn_close(c);
    pawl__pgpipe_lost(c, why);
    break_pinned(c, why);
    break_backoff(c);
    pawl__pgpool_attempt_done(p);
}

/* ---- connecting and the session's set-up --------------------------------------------------- */

/* Open a new session, without blocking: connect_step goes on at the socket's readiness. */
void pawl__pgconn_start(struct conn *c)
{
    struct pawl_pgpool *p = c->pool;
    PAWL_ASSERT(pawl__pgpool_on_io_thread(p));       /* the I/O thread owns the connection */
    PAWL_ASSERT(c->pg == NULL && c->ninflight == 0); /* the last session was closed whole */
    c->pg = pawl_pq_connect(p->dsn, 1);
    if (c->pg == NULL) {
        pawl__pgconn_break(c, "out of memory");
        return;
    }
    if (PQstatus(c->pg) == CONNECTION_BAD) {
        char msg[512];
        copy_trimmed(msg, sizeof msg, PQerrorMessage(c->pg));
        pawl__pgconn_break(c, msg);
        return;
    }
    c->poll = PGRES_POLLING_WRITING;
    c->deadline_ns = pawl_now_ns() + (int64_t)p->o.connect_timeout_ms * 1000000;
    set_state(c, C_CONNECTING);
    pawl__pgconn_watch(c, PAWL_IO_OUT);
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
    struct pawl_pgpool *p = c->pool;
    /* A new session starts with both cursors empty (pawl__pgpipe_lost emptied them). */
    PAWL_ASSERT(c->exp_len == 0 && c->inflight_head == NULL && !c->open_txn);
    c->fatal_idle = 0;
    c->fatal_req = NULL;
    PQsetNoticeReceiver(c->pg, notice_rx, c);
    if (PQsetnonblocking(c->pg, 1) != 0 || PQenterPipelineMode(c->pg) != 1) {
        pawl__pgconn_break(c, PQerrorMessage(c->pg));
        return;
    }
    for (int i = 0; i < p->nsession; i++) {
        if (!PQsendQueryParams(c->pg, p->session_sql[i], 0, NULL, NULL, NULL, NULL, 0) ||
            pawl__pgpipe_expect(c, E_SETUP, i, NULL) != 0) {
            pawl__pgconn_break(c, PQerrorMessage(c->pg));
            return;
        }
    }
    if (!PQpipelineSync(c->pg) || pawl__pgpipe_expect(c, E_SYNC, 0, NULL) != 0) {
        pawl__pgconn_break(c, PQerrorMessage(c->pg));
        return;
    }
    set_state(c, C_SETUP);
    int f = PQflush(c->pg);
    if (f < 0) {
        pawl__pgconn_break(c, PQerrorMessage(c->pg));
        return;
    }
    c->want_write = f == 1;
    pawl__pgconn_watch(c, PAWL_IO_IN | (c->want_write ? PAWL_IO_OUT : 0));
}

static void connect_step(struct conn *c)
{
    PAWL_ASSERT(c->state == C_CONNECTING && c->pg != NULL);
    c->poll = PQconnectPoll(c->pg);
    switch (c->poll) {
    case PGRES_POLLING_READING:
        pawl__pgconn_watch(c, PAWL_IO_IN);
        break;
    case PGRES_POLLING_WRITING:
        pawl__pgconn_watch(c, PAWL_IO_OUT);
        break;
    case PGRES_POLLING_OK:
        start_setup(c);
        break;
    default: {
        char msg[512];
        copy_trimmed(msg, sizeof msg, PQerrorMessage(c->pg));
        pawl__pgconn_break(c, msg[0] ? msg : "connection failed");
        break;
    }
    }
}

/*
 * The set-up's Sync came back (the receive cursor, pgpipe.c): READY, unless a session
 * statement failed, which fails the set-up (reported, and retried after back-off). 0, or -1
 * when the connection broke.
 */
int pawl__pgconn_setup_done(struct conn *c)
{
    struct pawl_pgpool *p = c->pool;
    PAWL_ASSERT(pawl__pgpool_on_io_thread(p)); /* the I/O thread owns the connection */
    if (c->state != C_SETUP)
        return 0; /* the Sync of a failed block's ROLLBACK: the session goes on */
    if (c->setup_error[0]) {
        pawl__pgconn_break(c, c->setup_error); /* copied before it clears it */
        return -1;
    }
    c->backoff_ms = 0;
    if (c->connect_fails > 0) {
        PAWL_INFO("pgconn", "%s[%d]: connected again, after %d failed attempt(s) over %.1f s",
                  p->name, c->index, c->connect_fails,
                  (double)(pawl_now_ns() - c->fail_since) / 1e9);
        c->connect_fails = 0;
    }
    set_state(c, C_READY);
    pawl__pgpool_attempt_done(p);
    if (p->o.on_connect)
        p->o.on_connect(p->o.hook_ud, c->index, PQbackendPID(c->pg));
    return 0;
}

/* The I/O loop's events for c's socket: connecting goes a step on; a session in set-up or READY
 * flushes what waited for write readiness and takes what arrived. */
void pawl__pgconn_on_io(struct conn *c, uint32_t ev)
{
    PAWL_ASSERT(pawl__pgpool_on_io_thread(c->pool)); /* the I/O thread owns the connection */
    if (c->state == C_CONNECTING) {
        connect_step(c);
        return;
    }
    if (c->state != C_READY && c->state != C_SETUP)
        return;
    if (ev & PAWL_IO_OUT) {
        int f = PQflush(c->pg);
        if (f < 0) {
            pawl__pgconn_break(c, PQerrorMessage(c->pg));
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
            pawl__pgconn_break(c, msg[0] ? msg : "connection closed");
            return;
        }
        if (pawl__pgpipe_recv(c) != 0)
            return;
    }
    if (PQstatus(c->pg) == CONNECTION_BAD) {
        pawl__pgconn_break(c, PQerrorMessage(c->pg));
        return;
    }
}
