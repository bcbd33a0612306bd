/*
 * pgpool.c — the pipelined connection pool (see pgconn.h for the contract, pgconn_internal.h for
 * how its files divide the work): its API, its queues and its I/O thread. One I/O thread per
 * pool runs an event loop (engine/runtime/ioloop.h: io_uring, or epoll where io_uring is
 * refused) over the pool's sockets, the connections' deadlines and a wake-up that submitters
 * trigger; each pass hands socket events to the connections (pgconn.c), starts the reconnects
 * and times out the connects that are due, calls the owner's on_loop hook, sends what is queued
 * (pgpipe.c) and fails requests that waited too long for a connection. Submitters on any thread
 * only queue under the pool mutex (shared, or pinned to a connection) and wake the loop; every
 * completion runs on the I/O thread (pawl__pgpool_complete). Free stops the loop, fails what is
 * left, and closes every connection.
 */
#include "pgconn_internal.h"

#include "dsn.h"
#include "ioloop.h"
#include "pawl/runtime.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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
 * callbacks, or one of its guests', needs no wake-up, only a loop pass that does not sleep
 * before dispatching it. */
static _Thread_local struct pawl_pgpool *io_self;

/* Whether this is the thread that drives p (its own I/O thread, or its host's). */
static int on_thread(const struct pawl_pgpool *p)
{
    return io_self != NULL && io_self == p->driver;
}

static void wake(struct pawl_pgpool *p)
{
    if (on_thread(p))
        p->driver->self_kick = 1; /* I/O thread only */
    else
        pawl__ioloop_wake(p->loop); /* orders the queue writes made under the mutex before it */
}

/* The pool's last failure (pawl__pgpool_last_error), without trailing newlines. Any thread. */
void pawl__pgpool_set_error(struct pawl_pgpool *p, const char *fmt, ...)
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

/* Complete a request: runs its callback on the I/O thread. */
void pawl__pgpool_complete(struct pawl_pgpool *p, struct pawl_pgreq *r, int rc)
{
    PAWL_ASSERT(on_thread(p)); /* callbacks run on the I/O thread, and only there */
    /* relaxed: a statistic; completion order is carried by the callback itself. */
    atomic_fetch_sub_explicit(&p->pending, 1, memory_order_relaxed);
    r->_next = NULL;
    r->on_done(r, rc);
}

/* A connection attempt ended (READY, or failed): wake pawl__pgpool_new's wait for the first. */
void pawl__pgpool_attempt_done(struct pawl_pgpool *p)
{
    PAWL_ASSERT(on_thread(p)); /* the connections' state machines run on the I/O thread */
    pthread_mutex_lock(&p->mu);
    p->attempts_done++;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mu);
}

/* ---- the I/O thread ---------------------------------------------------------------------- */

static void expire_queue(struct pawl_pgpool *p, int64_t now)
{
    PAWL_ASSERT(on_thread(p)); /* the I/O thread's own work */
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
        pawl__pgpool_complete(p, expired, PAWL_ECONN);
        expired = next;
    }
}

static void fail_all_queued(struct pawl_pgpool *p)
{
    PAWL_ASSERT(on_thread(p)); /* the I/O thread's own work */
    pthread_mutex_lock(&p->mu);
    struct pawl_pgreq *r = p->q_head;
    p->q_head = p->q_tail = NULL;
    pthread_mutex_unlock(&p->mu);
    while (r) {
        struct pawl_pgreq *next = r->_next;
        r->failed_stmt = -1;
        snprintf(r->message, sizeof r->message, "pool shut down");
        pawl__pgpool_complete(p, r, PAWL_ESHUTDOWN);
        r = next;
    }
}

/* The loop has ended (pawl__pgpool_free): release the waiters, since nothing times their waits
 * any more, then fail everything: what each connection had in flight (in doubt when its Sync
 * was sent and it could commit) or pinned, and the shared queue; close every connection. */
static void io_shutdown(struct pawl_pgpool *p)
{
    PAWL_ASSERT(on_thread(p)); /* the I/O thread's last work */
    pthread_mutex_lock(&p->mu);
    p->io_exited = 1;
    atomic_store_explicit(&p->wake_at_ns, 0, memory_order_relaxed);
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nconns; i++) {
        struct conn *c = &p->conns[i];
        struct pawl_pgreq *r = c->inflight_head;
        c->inflight_head = c->inflight_tail = NULL;
        while (r) {
            struct pawl_pgreq *next = r->_next;
            int rc = (r->_sync_sent && !(r->flags & PAWL_PGREQ_READONLY)) ? PAWL_EINDOUBT
                                                                          : PAWL_ESHUTDOWN;
            snprintf(r->message, sizeof r->message, "pool shut down with the request in flight");
            pawl__pgpool_complete(p, r, rc);
            r = next;
        }
        pthread_mutex_lock(&p->mu);
        r = c->pinned_head;
        c->pinned_head = c->pinned_tail = NULL;
        pthread_mutex_unlock(&p->mu);
        while (r) {
            struct pawl_pgreq *next = r->_next;
            snprintf(r->message, sizeof r->message, "pool shut down");
            pawl__pgpool_complete(p, r, PAWL_ESHUTDOWN);
            r = next;
        }
        pawl__pgconn_close(c);
    }
    fail_all_queued(p);
}

/* A guest's end, on its host's thread: shut down as a pool of its own would be (its requests
 * failed, its connections closed), its slots forgotten; then pawl__pgpool_free may go on. */
static void guest_detach(struct pawl_pgpool *h, struct pawl_pgpool *g)
{
    PAWL_ASSERT(io_self == h && g->driver == h); /* the host's thread drives and lets go */
    /* release: submitters see stop (and refuse) rather than queue to a pool nothing drives. */
    atomic_store_explicit(&g->stop, 1, memory_order_release);
    io_shutdown(g);
    for (int i = 0; i < g->nconns; i++)
        h->slot_conn[g->conns[i].slot] = NULL;
    pthread_mutex_lock(&g->mu);
    g->detached = 1;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->mu);
}

/* Take the guests waiting in p's attaching list into add (MAX_GUESTS entries); how many. */
static int take_attaching(struct pawl_pgpool *p, struct pawl_pgpool **add)
{
    pthread_mutex_lock(&p->mu);
    int n = p->nattaching;
    for (int k = 0; k < n; k++)
        add[k] = p->attaching[k];
    p->nattaching = 0;
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* Adopt the guests attached since the last pass (their connections start now) and let go of
 * those being freed. Cheap when nothing changed: one atomic exchange. */
static void guests_update(struct pawl_pgpool *p)
{
    PAWL_ASSERT(io_self == p);
    /* seq_cst: pairs with the attaching or freeing thread's store, made after its own writes
     * (the attaching list under mu, the guest's stop). */
    if (p->guest_slots == 0 || !atomic_exchange(&p->guests_changed, 0))
        return;
    struct pawl_pgpool *add[MAX_GUESTS];
    int nadd = take_attaching(p, add);
    for (int k = 0; k < nadd; k++) {
        struct pawl_pgpool *g = add[k];
        PAWL_ASSERT(p->ndriven < (int)PAWL_ARRAY_LEN(p->driven)); /* counted at attach */
        p->driven[p->ndriven++] = g;
        for (int i = 0; i < g->nconns; i++)
            p->slot_conn[g->conns[i].slot] = &g->conns[i];
        /* acquire: a guest freed before it was adopted is let go below, never connected. */
        if (!atomic_load_explicit(&g->stop, memory_order_acquire))
            for (int i = 0; i < g->nconns; i++)
                pawl__pgconn_start(&g->conns[i]);
    }
    for (int d = 1; d < p->ndriven;) {
        struct pawl_pgpool *g = p->driven[d];
        /* acquire: pairs with the release in pawl__pgpool_free. */
        if (!atomic_load_explicit(&g->stop, memory_order_acquire)) {
            d++;
            continue;
        }
        guest_detach(p, g);
        for (int k = d + 1; k < p->ndriven; k++)
            p->driven[k - 1] = p->driven[k];
        p->ndriven--;
    }
}

/* The host's loop has ended: its guests end with it (nothing else would drive them), those
 * not yet adopted too. */
static void guests_shutdown(struct pawl_pgpool *p)
{
    PAWL_ASSERT(io_self == p);
    for (int d = 1; d < p->ndriven; d++)
        guest_detach(p, p->driven[d]);
    p->ndriven = 1;
    struct pawl_pgpool *left[MAX_GUESTS];
    int n = take_attaching(p, left);
    for (int k = 0; k < n; k++)
        guest_detach(p, left[k]);
}

static void *io_main(void *arg)
{
    struct pawl_pgpool *p = arg;
    io_self = p;
    for (int i = 0; i < p->nconns; i++)
        pawl__pgconn_start(&p->conns[i]);

    struct pawl_ioev evs[MAX_CONNS + MAX_GUEST_SLOTS];
    int64_t wake_at[1 + MAX_GUESTS];
    for (;;) {
        /* acquire: pairs with the release in pawl__pgpool_free. */
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            break;
        guests_update(p);
        int64_t now = pawl_now_ns();
        int64_t next = now + 1000000000LL;
        for (int d = 0; d < p->ndriven; d++) {
            struct pawl_pgpool *q = p->driven[d];
            for (int i = 0; i < q->nconns; i++) {
                struct conn *c = &q->conns[i];
                if (c->state == C_CONNECTING || c->state == C_BACKOFF)
                    next = PAWL_MIN(next, c->deadline_ns);
            }
            if (q->o.queue_timeout_ms > 0 &&
                atomic_load_explicit(&q->nready, memory_order_relaxed) == 0)
                next = PAWL_MIN(next, now + 50000000LL);
            /* relaxed: a waiter that moves it earlier wakes the loop after storing it. */
            wake_at[d] = atomic_load_explicit(&q->wake_at_ns, memory_order_relaxed);
            if (wake_at[d] > 0)
                next = PAWL_MIN(next, wake_at[d]);
            if (q->loop_due_ns > 0)
                next = PAWL_MIN(next, q->loop_due_ns);
        }
        if (p->self_kick) {
            p->self_kick = 0;
            next = now; /* poll only: what our callbacks queued goes out in this pass */
        }
        int n = pawl__ioloop_wait(p->loop, next, evs);
        if (n < 0) {
            PAWL_ERROR("pgconn", "%s: the I/O loop failed; the pool stops", p->name);
            break;
        }
        for (int i = 0; i < n; i++) {
            struct conn *c = p->slot_conn[evs[i].slot];
            if (c != NULL)
                pawl__pgconn_on_io(c, evs[i].events);
        }
        now = pawl_now_ns();
        for (int d = 0; d < p->ndriven; d++) {
            struct pawl_pgpool *q = p->driven[d];
            for (int i = 0; i < q->nconns; i++) {
                struct conn *c = &q->conns[i];
                if (c->state == C_BACKOFF && now >= c->deadline_ns)
                    pawl__pgconn_start(c);
                else if (c->state == C_CONNECTING && now >= c->deadline_ns)
                    pawl__pgconn_break(c, "connect timeout");
            }
        }
        p->self_kick = 0; /* what callbacks queued so far goes out now */
        for (int d = 0; d < p->ndriven; d++) {
            struct pawl_pgpool *q = p->driven[d];
            if (q->o.on_loop) {
                int64_t want = q->o.on_loop(q->o.hook_ud, now);
                q->loop_due_ns = want > 0 ? want : 0;
            }
        }
        for (int d = 0; d < p->ndriven; d++)
            pawl__pgpipe_dispatch(p->driven[d]);
        for (int d = 0; d < p->ndriven; d++) {
            struct pawl_pgpool *q = p->driven[d];
            expire_queue(q, now);
            if (wake_at[d] > 0 && now >= wake_at[d]) {
                pthread_mutex_lock(&q->mu);
                if (atomic_load_explicit(&q->wake_at_ns, memory_order_relaxed) <= now) {
                    /* waiters still short of their deadline set it again */
                    atomic_store_explicit(&q->wake_at_ns, 0, memory_order_relaxed);
                    pthread_cond_broadcast(&q->cond);
                }
                pthread_mutex_unlock(&q->mu);
            }
        }
    }
    io_shutdown(p);
    guests_shutdown(p);
    return NULL;
}

/* What pawl__pgpool_new made before its I/O thread (the loop, the session statements, the names,
 * the lock) and the pool itself; for a pool half made as for one whose thread has ended. */
static void pool_release(struct pawl_pgpool *p)
{
    if (p->driver == NULL || p->driver == p)
        pawl__ioloop_free(p->loop); /* a guest's is its host's */
    pawl_free(p->slot_conn);
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
}

/* Give p (its connections set up, not started) a loop and an I/O thread of its own, with
 * room for its guests; *out is p once the thread runs. */
static int start_thread(struct pawl_pgpool *p, struct pawl_pgpool **out, char *err, size_t errlen)
{
    p->driver = p;
    p->guest_slots = p->o.guest_slots;
    p->driven[0] = p;
    p->ndriven = 1;
    p->slot_conn = pawl_calloc((size_t)p->nconns + (size_t)p->guest_slots, sizeof(struct conn *));
    if (p->slot_conn == NULL)
        return PAWL_ENOMEM;
    for (int i = 0; i < p->nconns; i++)
        p->slot_conn[i] = &p->conns[i];
    struct pawl_ioloop_opts lo = {.backend = (enum pawl_timer_backend)p->o.io_backend};
    int rc = pawl__ioloop_new(&p->loop, (unsigned)(p->nconns + p->guest_slots), p->name, &lo);
    if (rc != 0) {
        if (err && errlen)
            snprintf(err, errlen, "%s: cannot start the I/O loop: %s", p->name,
                     rc == PAWL_ENOTSUP ? "io_uring is required and refused" : pawl_strerror(rc));
        return rc;
    }
    /* Published before the I/O thread starts: its hooks may read *out (thread creation
     * orders this store before them). */
    *out = p;
    if (pthread_create(&p->thread, NULL, io_main, p) != 0) {
        *out = NULL;
        return PAWL_ENOMEM;
    }
    char tname[32]; /* shown by top -H and perf; the kernel keeps 15 bytes */
    snprintf(tname, sizeof tname, "pg-%.12s", p->name);
    pthread_setname_np(p->thread, tname);
    return 0;
}

/* Make p (its connections set up, not started) a guest of h: it takes slots of h's loop and
 * waits in h's attaching list for h's thread to adopt it (guests_update); *out is p before
 * that thread can run its hooks. */
static int attach(struct pawl_pgpool *p, struct pawl_pgpool *h, struct pawl_pgpool **out, char *err,
                  size_t errlen)
{
    PAWL_ASSERT(!on_thread(h)); /* adopting takes a pass of h's loop after this returns */
    pthread_mutex_lock(&h->mu);
    /* acquire: pairs with the release in pawl__pgpool_free. */
    int room = !h->io_exited && !atomic_load_explicit(&h->stop, memory_order_acquire) &&
               h->ndriven_total < MAX_GUESTS && /* bounds attaching[] and driven[] too */
               h->slots_given + p->nconns <= h->guest_slots;
    if (room) {
        for (int i = 0; i < p->nconns; i++)
            p->conns[i].slot = h->nconns + h->slots_given + i;
        h->slots_given += p->nconns;
        h->ndriven_total++;
        p->driver = h;
        p->loop = h->loop;
        /* Before the host's thread can adopt p (it needs guests_changed, stored below, or a
         * pass of its own after this unlock): its hooks may read *out. */
        *out = p;
        h->attaching[h->nattaching++] = p;
    }
    pthread_mutex_unlock(&h->mu);
    if (!room) {
        if (err && errlen)
            snprintf(err, errlen, "%s: its host pool %s has no room for it, or has stopped",
                     p->name, h->name);
        return PAWL_EINVAL;
    }
    atomic_store(&h->guests_changed, 1); /* seq_cst: read by the host's next pass */
    pawl__ioloop_wake(h->loop);
    return 0;
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
        o->io_backend > PAWL_TIMER_BACKEND_EPOLL || o->guest_slots < 0 ||
        o->guest_slots > MAX_GUEST_SLOTS ||
        (o->host && (o->guest_slots > 0 || o->host->driver != o->host))) {
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
        p->conns[i].slot = i;
        p->conns[i].fd = -1;
        p->conns[i].state = C_DOWN;
    }
    rc_fail = o->host ? attach(p, o->host, out, err, errlen) : start_thread(p, out, err, errlen);
    if (rc_fail != 0)
        goto fail;
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
    pool_release(p);
    return rc_fail;
}

void pawl__pgpool_free(struct pawl_pgpool *p)
{
    if (p == NULL)
        return;
    /* Not from a callback of its own: it joins the I/O thread, or waits for it. */
    PAWL_ASSERT(!on_thread(p));
    if (p->driver != p) {
        /* A guest: its host's thread shuts it down and lets go of it (guests_update), or did
         * already when the host stopped first (then the host is not touched: it may be gone). */
        pthread_mutex_lock(&p->mu);
        if (!p->detached) {
            pthread_mutex_unlock(&p->mu);
            struct pawl_pgpool *h = p->driver;
            /* release: the host's thread sees stop after it sees guests_changed. */
            atomic_store_explicit(&p->stop, 1, memory_order_release);
            atomic_store(&h->guests_changed, 1); /* seq_cst */
            pawl__ioloop_wake(h->loop);
            pthread_mutex_lock(&p->mu);
            while (!p->detached)
                pthread_cond_wait(&p->cond, &p->mu);
        }
        pthread_mutex_unlock(&p->mu);
    } else {
        /* release: the I/O thread sees stop after its next wakeup. */
        atomic_store_explicit(&p->stop, 1, memory_order_release);
        pawl__ioloop_wake(p->loop);
        pthread_join(p->thread, NULL);
    }
    for (int i = 0; i < p->nconns; i++)
        pawl_free(p->conns[i].exp);
    int np = atomic_load_explicit(&p->nprepared, memory_order_acquire); /* all published */
    for (int i = 0; i < np; i++) {
        pawl_free(p->prep[i].name);
        pawl_free(p->prep[i].sql);
        pawl_free(p->prep[i].types);
    }
    pool_release(p);
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

/* Append req to one of the pool's queues (a connection's pinned queue or the shared one). The
 * caller holds the pool's mutex: the I/O thread pops from the other end. */
static void queue_push_locked(struct pawl_pgpool *p, struct pawl_pgreq **head,
                              struct pawl_pgreq **tail, struct pawl_pgreq *req)
{
    PAWL_ASSERT(pawl_mutex_locked(&p->mu));
    PAWL_ASSERT(req->_next == NULL && (*head == NULL) == (*tail == NULL));
    if (*tail)
        (*tail)->_next = req;
    else
        *head = req;
    *tail = req;
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
        queue_push_locked(p, &c->pinned_head, &c->pinned_tail, req);
    } else {
        queue_push_locked(p, &p->q_head, &p->q_tail, req);
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
    return p ? on_thread(p) : io_self != NULL;
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
    PAWL_ASSERT(p == NULL || !on_thread(p)); /* its own I/O thread would wait for itself */
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
    PAWL_ASSERT(p == NULL || !on_thread(p)); /* its own I/O thread would wait for itself */
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
