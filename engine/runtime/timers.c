/*
 * timers.c — one-shot and periodic timers driven by one thread per pawl_timers object, with two
 * backends behind one state machine:
 *   - io_uring: each armed timer is one IORING_OP_TIMEOUT with an absolute CLOCK_MONOTONIC
 *     deadline whose timespec lives in the timer (t->_ts), user_data = the timer; cancelling
 *     submits IORING_OP_TIMEOUT_REMOVE and the timeout then completes with -ECANCELED (or -ETIME
 *     if it won the race). Command wake-ups arrive as a read on an eventfd kept in the ring.
 *   - epoll: a binary min-heap of deadlines, one timerfd set to the earliest, and the eventfd,
 *     both in one epoll set (one descriptor per object, however many timers).
 * The backend is chosen at creation: io_uring unless refused (setup fails, or a probe timeout
 * does not complete with -ETIME), then epoll, logged at debug (a refusal once per process at
 * info, with its reason); require_io_uring turns the refusal into an error.
 *
 * Threads and ownership. Any thread calls start/cancel; they change the timer's state word with
 * a CAS and queue the timer on a lock-free MPSC command queue (one entry at a time: _queued),
 * then wake the timers thread. Only the timers thread touches the backend and the fields marked
 * owner-only; it reconciles each queued timer's wanted state (state word) with what the backend
 * holds (_op, _armed_gen). The state word is generation << 2 | {IDLE, ARMED, FIRED}: start bumps
 * the generation, so a backend expiry left over from an earlier start is recognised and dropped.
 * The expiry of a one-shot timer is a CAS ARMED -> FIRED on the timers thread, and cancel is a
 * CAS ARMED -> IDLE: whichever wins decides whether the callback runs, exactly once.
 *
 * Busy count: every party that may still touch a timer holds it (a queued command, an armed
 * backend op, a dispatched callback). Holds are always taken before the previous one is dropped,
 * so the count reaches zero only when the runtime is done with the timer. For a one-shot expiry
 * the timers thread takes the callback's hold, drops its own, and submits the task as its very
 * last access, so the callback may free the timer.
 */
#include "timers.h"

#include "common.h"
#include "mpsc.h"
#include "pool.h"
#include "testctl.h"

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

enum { ST_IDLE = 0, ST_ARMED = 1, ST_FIRED = 2 };
/* _cb_inflight: a periodic callback queued or running; a one-shot callback queued (the pool has
 * not yet dequeued its task). */
enum { CB_NONE = 0, CB_PERIODIC = 1, CB_ONESHOT = 2 };
/* OP_DUE: io_uring only — the deadline had passed when it was armed, so no kernel timeout was
 * submitted (expired timeouts cost tens of microseconds each in the kernel); the timer waits on
 * the owner's due list and is expired at the end of the current loop iteration. */
enum { OP_NONE = 0, OP_ARMED = 1, OP_REMOVING = 2, OP_DUE = 3 };
enum { BACKEND_URING = 1, BACKEND_EPOLL = 2 };

#define UD_REMOVE 1ull /* user_data of TIMEOUT_REMOVE requests */
#define UD_WAKE 2ull   /* user_data of the eventfd read */

struct pawl_timers {
    struct pawl_mpsc_ cmdq; /* timers whose wanted state changed (linked via _cmd_next) */
    uint32_t wake_pending;  /* 1 while a wake-up write to efd is outstanding */
    uint32_t stop;
    uint64_t armed;
    struct pawl_pool *pool;
    int backend;
    char reason[200];
    pthread_t thread;
    int efd;
    /* Owner-only from here. */
    uintptr_t owner_tag;     /* assertion builds: pawl_thread_tag() of the timers thread */
    struct pawl_timer **set; /* timers the backend holds; a min-heap by deadline for epoll */
    size_t set_len, set_cap;
    struct io_uring ring;
    int ring_ok;
    struct pawl_timer **due; /* io_uring: timers armed with a deadline already past */
    size_t due_len, due_cap;
    uint64_t efd_buf;
    int efd_armed;
    int epfd, tfd;
    int64_t tfd_deadline;
};

static int logged_fallback; /* a refused io_uring: once per process at INFO */

void pawl_timers_opts_defaults(struct pawl_timers_opts *opts)
{
    memset(opts, 0, sizeof(*opts));
}

int pawl_timer_backend_parse(const char *s, enum pawl_timer_backend *out)
{
    if (s == NULL || out == NULL)
        return PAWL_EINVAL;
    if (strcmp(s, "auto") == 0)
        *out = PAWL_TIMER_BACKEND_AUTO;
    else if (strcmp(s, "io_uring") == 0 || strcmp(s, "io-uring") == 0 || strcmp(s, "uring") == 0)
        *out = PAWL_TIMER_BACKEND_IO_URING;
    else if (strcmp(s, "epoll") == 0)
        *out = PAWL_TIMER_BACKEND_EPOLL;
    else
        return PAWL_EINVAL;
    return 0;
}

const char *pawl_timers_backend(const struct pawl_timers *tm)
{
    return tm->backend == BACKEND_URING ? "io_uring" : "epoll";
}

const char *pawl_timers_backend_reason(const struct pawl_timers *tm)
{
    return tm->reason;
}

uint64_t pawl_timers_armed(const struct pawl_timers *tm)
{
    /* Relaxed: statistics. */
    return atomic_load_explicit(PAWL_ATOMIC_OF(&tm->armed), memory_order_relaxed);
}

/* ---- busy holds ---- */

void pawl__timer_hold(struct pawl_timer *t)
{
    /* Relaxed: the caller already holds the timer (or owns it outright); no data is handed
     * over by the increment itself. */
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&t->_busy), 1, memory_order_relaxed);
}

void pawl__timer_unhold(struct pawl_timer *t)
{
    void (*idle)(struct pawl_timer *) = t->_idle_fn; /* read before t may be freed */
    PAWL_ASSERT(atomic_load_explicit(PAWL_ATOMIC_OF(&t->_busy), memory_order_relaxed) >
                0); /* a hold to drop */
    /* Acq_rel: release our accesses to t; the thread that sees zero acquires everybody's. */
    if ((atomic_fetch_sub_explicit(PAWL_ATOMIC_OF(&t->_busy), 1, memory_order_acq_rel) - 1) == 0 &&
        idle)
        idle(t);
}

int pawl_timer_busy(const struct pawl_timer *t)
{
    /* Acquire: pairs with the release in unhold; after 0 the runtime's accesses are visible. */
    return atomic_load_explicit(PAWL_ATOMIC_OF(&t->_busy), memory_order_acquire) != 0;
}

/* ---- callbacks as pool tasks ---- */

static void timer_task(struct pawl_task *task, int status)
{
    struct pawl_timer *t = PAWL_CONTAINER_OF(task, struct pawl_timer, _task);
    pawl_timer_fn cb = t->_cb;
    void *arg = t->_arg;
    /* Acquire: pairs with the timers thread's exchange or store that set it at dispatch. */
    uint32_t inflight =
        atomic_load_explicit(PAWL_ATOMIC_OF(&t->_cb_inflight), memory_order_acquire);
    if (inflight == CB_ONESHOT) {
        /* The pool has dequeued the task: from here a restart may queue it again (even from
         * the callback). Seq_cst: pairs with pawl_timer_start's load. */
        atomic_store_explicit(PAWL_ATOMIC_OF(&t->_cb_inflight), 0, memory_order_seq_cst);
        pawl__timer_unhold(t); /* the callback may free or restart t */
        cb(t, arg, status);
    } else if (inflight == CB_PERIODIC) {
        cb(t, arg, status);
        /* Release: the next periodic dispatch (and a restart) see the callback finished. */
        atomic_store_explicit(PAWL_ATOMIC_OF(&t->_cb_inflight), 0, memory_order_seq_cst);
        pawl__timer_unhold(t);
    } else if (t->_idle_fn) {
        cb(t, arg, status); /* runtime-internal owner: its idle hook frees t after this */
        pawl__timer_unhold(t);
    } else {
        pawl__timer_unhold(t); /* runtime-internal one-shot without an idle hook */
        cb(t, arg, status);
    }
}

void pawl_timer_init(struct pawl_timer *t, pawl_timer_fn cb, void *arg)
{
    memset(t, 0, sizeof(*t));
    t->_task.fn = timer_task;
    t->_cb = cb;
    t->_arg = arg;
    t->_heap_idx = -1;
}

/* ---- the command queue ---- */

static void wake(struct pawl_timers *tm)
{
    /* Acq_rel: our push happened before; the owner's clearing exchange acquires it. */
    if (atomic_exchange_explicit(PAWL_ATOMIC_OF(&tm->wake_pending), 1, memory_order_acq_rel) == 0) {
        uint64_t one = 1;
        ssize_t n = write(tm->efd, &one, sizeof one);
        (void)n; /* EAGAIN means the counter is already non-zero: the owner wakes anyway */
    }
}

/* Queue t for the owner. The caller holds t; this takes a hold for the queue entry. */
static void enqueue(struct pawl_timers *tm, struct pawl_timer *t)
{
    pawl__timer_hold(t);
    /* Acq_rel: orders our state change before the owner's clearing exchange sees the flag. */
    if (atomic_exchange_explicit(PAWL_ATOMIC_OF(&t->_queued), 1, memory_order_acq_rel) == 0) {
        pawl__mpsc_push_mp(&tm->cmdq, &t->_cmd_next);
        wake(tm);
    } else {
        pawl__timer_unhold(t); /* already queued: that entry will see our change */
    }
}

static int start_ns(struct pawl_timers *tm, struct pawl_timer *t, int64_t delay_ns,
                    int64_t period_ns)
{
    if (tm == NULL || t == NULL || delay_ns < 0 || period_ns < 0 || t->_task.fn != timer_task)
        return PAWL_EINVAL;
    if (t->_inline ? period_ns != 0 : tm->pool == NULL)
        return PAWL_EINVAL; /* inline timers are one-shot; others need the pool */
    /* Acquire: pairs with pawl_timers_free. */
    if (atomic_load_explicit(PAWL_ATOMIC_OF(&tm->stop), memory_order_acquire))
        return PAWL_ESHUTDOWN;
    /* Seq_cst: with the timers thread's exchange-then-load in dispatch_periodic, either we see
     * the callback in flight, or it sees our new generation and withdraws its dispatch. */
    if (atomic_load_explicit(PAWL_ATOMIC_OF(&t->_cb_inflight), memory_order_seq_cst) == CB_PERIODIC)
        return PAWL_EBUSY;
    pawl__timer_hold(t); /* keeps the count above zero until the command is queued */
    uint64_t s = atomic_load_explicit(PAWL_ATOMIC_OF(&t->_state), memory_order_acquire);
    for (;;) {
        if ((s & 3) == ST_ARMED) {
            pawl__timer_unhold(t);
            return PAWL_EBUSY;
        }
        /* Relaxed: published by the release CAS on the state word below. */
        atomic_store_explicit(PAWL_ATOMIC_OF(&t->_delay_ns), delay_ns, memory_order_relaxed);
        atomic_store_explicit(PAWL_ATOMIC_OF(&t->_period_ns), period_ns, memory_order_relaxed);
        uint64_t ns = (((s >> 2) + 1) << 2) | ST_ARMED;
        /* Seq_cst: see the _cb_inflight comment; also releases delay and period. */
        if (atomic_compare_exchange_strong_explicit(PAWL_ATOMIC_OF(&t->_state), &s, ns,
                                                    memory_order_seq_cst, memory_order_acquire))
            break;
    }
    /* Relaxed: statistics. */
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&tm->armed), 1, memory_order_relaxed);
    enqueue(tm, t);
    pawl__timer_unhold(t);
    return 0;
}

int pawl_timer_start(struct pawl_timers *tm, struct pawl_timer *t, int64_t delay_ms,
                     int64_t period_ms)
{
    if (delay_ms < 0 || period_ms < 0 || delay_ms > INT64_MAX / 1000000 ||
        period_ms > INT64_MAX / 1000000)
        return PAWL_EINVAL;
    return start_ns(tm, t, delay_ms * 1000000, period_ms * 1000000);
}

int pawl_timer_cancel(struct pawl_timers *tm, struct pawl_timer *t)
{
    if (tm == NULL || t == NULL)
        return PAWL_EINVAL;
    /* Acquire: a state we read as not armed also shows what led to it. */
    uint64_t s = atomic_load_explicit(PAWL_ATOMIC_OF(&t->_state), memory_order_acquire);
    if ((s & 3) != ST_ARMED)
        return PAWL_EALREADY;
    pawl__timer_hold(t);
    for (;;) {
        if ((s & 3) != ST_ARMED) {
            pawl__timer_unhold(t);
            return PAWL_EALREADY;
        }
        uint64_t ns = (s & ~(uint64_t)3) | ST_IDLE;
        /* Seq_cst: races with the timers thread's ARMED -> FIRED CAS; one of them wins. */
        if (atomic_compare_exchange_strong_explicit(PAWL_ATOMIC_OF(&t->_state), &s, ns,
                                                    memory_order_seq_cst, memory_order_acquire))
            break;
    }
    /* Relaxed: statistics. */
    atomic_fetch_sub_explicit(PAWL_ATOMIC_OF(&tm->armed), 1, memory_order_relaxed);
    enqueue(tm, t);
    pawl__timer_unhold(t);
    return 0;
}

void pawl__timer_init_inline(struct pawl_timer *t, pawl_timer_fn cb, void *arg)
{
    pawl_timer_init(t, cb, arg);
    t->_inline = 1;
}

int pawl__timer_start_ns(struct pawl_timers *tm, struct pawl_timer *t, int64_t delay_ns)
{
    PAWL_ASSERT(t == NULL || t->_inline); /* pool timers start through pawl_timer_start */
    return start_ns(tm, t, delay_ns, 0);
}

/* ---- the owner's set of timers held by the backend ---- */

static int set_reserve(struct pawl_timers *tm)
{
    if (tm->set_len < tm->set_cap)
        return 0;
    size_t cap = tm->set_cap ? tm->set_cap * 2 : 64;
    /* NOLINTBEGIN(bugprone-sizeof-expression) */
    struct pawl_timer **n = pawl_realloc(tm->set, cap * sizeof(*n));
    /* NOLINTEND(bugprone-sizeof-expression) */
    if (n == NULL)
        return PAWL_ENOMEM;
    tm->set = n;
    tm->set_cap = cap;
    return 0;
}

static void heap_swap(struct pawl_timers *tm, size_t a, size_t b)
{
    struct pawl_timer *x = tm->set[a];
    tm->set[a] = tm->set[b];
    tm->set[b] = x;
    tm->set[a]->_heap_idx = (int)a;
    tm->set[b]->_heap_idx = (int)b;
}

static void heap_up(struct pawl_timers *tm, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (tm->set[p]->_deadline_ns <= tm->set[i]->_deadline_ns)
            break;
        heap_swap(tm, i, p);
        i = p;
    }
}

static void heap_down(struct pawl_timers *tm, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < tm->set_len && tm->set[l]->_deadline_ns < tm->set[m]->_deadline_ns)
            m = l;
        if (r < tm->set_len && tm->set[r]->_deadline_ns < tm->set[m]->_deadline_ns)
            m = r;
        if (m == i)
            return;
        heap_swap(tm, i, m);
        i = m;
    }
}

static void set_add(struct pawl_timers *tm, struct pawl_timer *t)
{
    t->_heap_idx = (int)tm->set_len;
    tm->set[tm->set_len++] = t;
    if (tm->backend == BACKEND_EPOLL)
        heap_up(tm, tm->set_len - 1);
}

static void set_del(struct pawl_timers *tm, struct pawl_timer *t)
{
    size_t i = (size_t)t->_heap_idx, last = tm->set_len - 1;
    t->_heap_idx = -1;
    if (i != last) {
        tm->set[i] = tm->set[last];
        tm->set[i]->_heap_idx = (int)i;
    }
    tm->set_len--;
    if (i != last && tm->backend == BACKEND_EPOLL) {
        heap_down(tm, i);
        heap_up(tm, i);
    }
}

/* ---- backend operations (owner only) ---- */

static struct io_uring_sqe *get_sqe(struct pawl_timers *tm)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&tm->ring);
    while (sqe == NULL) {
        io_uring_submit(&tm->ring); /* the SQ is full: hand it to the kernel and retry */
        sqe = io_uring_get_sqe(&tm->ring);
    }
    return sqe;
}

/* Arm t in the backend for its current _deadline_ns. The caller took the op's hold. */
static int backend_arm(struct pawl_timers *tm, struct pawl_timer *t)
{
    if (set_reserve(tm) != 0)
        return PAWL_ENOMEM;
    if (tm->backend == BACKEND_URING && t->_deadline_ns <= pawl_now_ns()) {
        if (tm->due_len == tm->due_cap) {
            size_t cap = tm->due_cap ? tm->due_cap * 2 : 64;
            /* NOLINTBEGIN(bugprone-sizeof-expression) */
            struct pawl_timer **n = pawl_realloc(tm->due, cap * sizeof(*n));
            /* NOLINTEND(bugprone-sizeof-expression) */
            if (n == NULL)
                goto submit; /* let the kernel expire it after all */
            tm->due = n;
            tm->due_cap = cap;
        }
        set_add(tm, t);
        t->_op = OP_DUE;
        tm->due[tm->due_len++] = t;
        return 0;
    }
submit:
    set_add(tm, t);
    t->_op = OP_ARMED;
    if (tm->backend == BACKEND_URING) {
        struct __kernel_timespec *ts = (struct __kernel_timespec *)(void *)t->_ts;
        ts->tv_sec = t->_deadline_ns / 1000000000;
        ts->tv_nsec = t->_deadline_ns % 1000000000;
        struct io_uring_sqe *sqe = get_sqe(tm);
        io_uring_prep_timeout(sqe, ts, 0, IORING_TIMEOUT_ABS);
        io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)t);
    }
    return 0;
}

/* Ask the backend to drop t. io_uring: asynchronous (the timeout's CQE follows); epoll: done
 * here, and the op's hold is dropped (the caller still holds t). */
static void backend_remove(struct pawl_timers *tm, struct pawl_timer *t)
{
    if (tm->backend == BACKEND_URING) {
        struct io_uring_sqe *sqe = get_sqe(tm);
        io_uring_prep_timeout_remove(sqe, (uint64_t)(uintptr_t)t, 0);
        io_uring_sqe_set_data64(sqe, UD_REMOVE);
        t->_op = OP_REMOVING;
    } else {
        set_del(tm, t);
        t->_op = OP_NONE;
        pawl__timer_unhold(t);
    }
}

/* The timers thread only (the owner-only fields of tm and of its timers): the first caller of
 * reconcile or op_done is that thread. */
static inline void assert_timers_thread(struct pawl_timers *tm)
{
#if PAWL_ASSERTIONS_ON
    if (tm->owner_tag == 0)
        tm->owner_tag = pawl_thread_tag();
    PAWL_ASSERT(tm->owner_tag == pawl_thread_tag() && "timer state touched off the timers thread");
#else
    (void)tm;
#endif
}

/* Bring the backend in line with t's wanted state. The caller holds t. */
static void reconcile(struct pawl_timers *tm, struct pawl_timer *t)
{
    assert_timers_thread(tm);
    PAWL_ASSERT(atomic_load_explicit(PAWL_ATOMIC_OF(&t->_busy), memory_order_relaxed) >
                0); /* the caller holds t */
    for (;;) {
        /* Acquire: pairs with start's CAS; delay and period of this generation are visible. */
        uint64_t s = atomic_load_explicit(PAWL_ATOMIC_OF(&t->_state), memory_order_acquire);
        uint64_t gen = s >> 2;
        if ((s & 3) == ST_ARMED) {
            if (t->_op == OP_NONE) {
                t->_armed_gen = gen;
                t->_deadline_ns =
                    pawl_now_ns() +
                    atomic_load_explicit(PAWL_ATOMIC_OF(&t->_delay_ns), memory_order_relaxed);
                pawl__timer_hold(t); /* the op's hold */
                if (backend_arm(tm, t) != 0) {
                    pawl__timer_unhold(t);
                    PAWL_ERROR("timers", "out of memory arming a timer; retrying");
                    enqueue(tm, t); /* try again on the next pass */
                }
                return;
            }
            if (t->_armed_gen == gen || t->_op == OP_REMOVING || t->_op == OP_DUE)
                return; /* armed for this generation, or the old op's end will re-run us */
            backend_remove(tm, t);
            continue; /* epoll removed synchronously: arm the new generation now */
        }
        if (t->_op == OP_ARMED)
            backend_remove(tm, t); /* (an OP_DUE timer is settled by expire_due shortly) */
        return;
    }
}

/* The backend's op for t has ended: it expired (fired) or was removed. The op's hold is still
 * held and is dropped here, as the last access (or handed to the callback). */
static void op_done(struct pawl_timers *tm, struct pawl_timer *t, int expired)
{
    assert_timers_thread(tm);
    /* Only an op the backend holds can end (OP_NONE -> ARMED|DUE -> [REMOVING ->] NONE). */
    PAWL_ASSERT(t->_op == OP_ARMED || t->_op == OP_DUE || t->_op == OP_REMOVING);
    t->_op = OP_NONE;
    if (expired) {
        uint64_t s = atomic_load_explicit(PAWL_ATOMIC_OF(&t->_state), memory_order_seq_cst);
        uint64_t want = (t->_armed_gen << 2) | ST_ARMED;
        int64_t period = atomic_load_explicit(PAWL_ATOMIC_OF(&t->_period_ns), memory_order_relaxed);
        if (s == want && period == 0) {
            /* Seq_cst: races with cancel's ARMED -> IDLE CAS; the winner decides. */
            if (atomic_compare_exchange_strong_explicit(
                    PAWL_ATOMIC_OF(&t->_state), &s, (t->_armed_gen << 2) | ST_FIRED,
                    memory_order_seq_cst, memory_order_relaxed)) {
                /* Relaxed: statistics. */
                atomic_fetch_sub_explicit(PAWL_ATOMIC_OF(&tm->armed), 1, memory_order_relaxed);
                if (t->_inline) {
                    /* Runtime-internal: the callback runs here, on the timers thread, and is
                     * short (it wakes a waiter); the op's hold covers it. */
                    t->_cb(t, t->_arg, 0);
                    pawl__timer_unhold(t);
                    return;
                }
                /* A restart may expire again before the pool has dequeued the callback of
                 * this one: queueing the same task twice would corrupt the queue. The flag
                 * says "queued, not yet dequeued" (timer_task clears it first thing); an
                 * expiry that finds it set is covered by the callback already queued. Runtime-
                 * internal timers with an idle hook are never restarted and keep 0. Seq_cst:
                 * with timer_task's clearing store, either we see the task dequeued (0) and
                 * queue it again, or it is still queued and runs the callback after us. */
                if (t->_idle_fn == NULL &&
                    atomic_exchange_explicit(PAWL_ATOMIC_OF(&t->_cb_inflight), CB_ONESHOT,
                                             memory_order_seq_cst) == CB_ONESHOT) {
                    t->_missed++;
                    pawl__timer_unhold(t); /* the op's hold: the queued callback keeps its own */
                    return;
                }
                /* Hand our hold to the callback and submit it: our last access to t. */
                pawl_pool_submit(tm->pool, &t->_task);
                return;
            }
        } else if (s == want) {
            /* Periodic: dispatch unless the previous callback is still in flight, then re-arm
             * on the absolute schedule, skipping expiries that are already past. */
            /* Seq_cst: see pawl_timer_start. */
            if (atomic_exchange_explicit(PAWL_ATOMIC_OF(&t->_cb_inflight), CB_PERIODIC,
                                         memory_order_seq_cst) == 0) {
                if (atomic_load_explicit(PAWL_ATOMIC_OF(&t->_state), memory_order_seq_cst) ==
                    want) {
                    pawl__timer_hold(t); /* the callback's hold */
                    pawl_pool_submit(tm->pool, &t->_task);
                } else {
                    /* Seq_cst: withdrawn; a restart may proceed. */
                    atomic_store_explicit(PAWL_ATOMIC_OF(&t->_cb_inflight), 0,
                                          memory_order_seq_cst);
                }
            } else {
                t->_missed++;
            }
            int64_t next = t->_deadline_ns + period, now = pawl_now_ns();
            if (next <= now) {
                int64_t skip = (now - next) / period + 1;
                t->_missed += (uint64_t)skip;
                next += skip * period;
            }
            t->_deadline_ns = next;
            if (backend_arm(tm, t) == 0)
                return; /* the op's hold carries over to the new op */
            PAWL_ERROR("timers", "out of memory re-arming a periodic timer; retrying");
            enqueue(tm, t);
        }
    }
    reconcile(tm, t);
    pawl__timer_unhold(t);
}

static void process_commands(struct pawl_timers *tm)
{
    /* Acq_rel: clear before draining, so a producer that sets it after this point also writes
     * the eventfd; acquire sees the pushes of producers that found it set. */
    atomic_exchange_explicit(PAWL_ATOMIC_OF(&tm->wake_pending), 0, memory_order_acq_rel);
    for (;;) {
        void **link = pawl__mpsc_pop_sc(&tm->cmdq);
        if (link == NULL)
            return;
        if (link == PAWL_MPSC_BUSY) {
            sched_yield(); /* a producer is between its two stores */
            continue;
        }
        struct pawl_timer *t = PAWL_CONTAINER_OF(link, struct pawl_timer, _cmd_next);
        /* Acq_rel: after this, a new change to t queues it again; acquire sees the state
         * written before the producer's flag exchange. */
        atomic_exchange_explicit(PAWL_ATOMIC_OF(&t->_queued), 0, memory_order_acq_rel);
        reconcile(tm, t);
        pawl__timer_unhold(t); /* the queue entry's hold */
    }
}

/* io_uring: expire the timers whose deadline had passed when armed (see OP_DUE). op_done may
 * append more (a restarted timer), which this loop picks up too. */
static void expire_due(struct pawl_timers *tm)
{
    for (size_t i = 0; i < tm->due_len; i++) {
        struct pawl_timer *t = tm->due[i];
        set_del(tm, t);
        op_done(tm, t, 1);
    }
    tm->due_len = 0;
}

/* ---- the io_uring loop ---- */

static void *uring_main(void *arg)
{
    struct pawl_timers *tm = arg;
    /* Acquire: pairs with pawl_timers_free's release store. */
    while (!atomic_load_explicit(PAWL_ATOMIC_OF(&tm->stop), memory_order_acquire)) {
        if (!tm->efd_armed) {
            struct io_uring_sqe *sqe = get_sqe(tm);
            io_uring_prep_read(sqe, tm->efd, &tm->efd_buf, sizeof tm->efd_buf, 0);
            io_uring_sqe_set_data64(sqe, UD_WAKE);
            tm->efd_armed = 1;
        }
        int rc = io_uring_submit_and_wait(&tm->ring, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            PAWL_ERROR("timers", "io_uring_submit_and_wait: %s", strerror(-rc));
            usleep(1000);
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&tm->ring, head, cqe)
        {
            uint64_t ud = cqe->user_data;
            int res = cqe->res;
            seen++;
            if (ud == UD_WAKE)
                tm->efd_armed = 0;
            else if (ud != UD_REMOVE) {
                /* NOLINTBEGIN(performance-no-int-to-ptr) */
                struct pawl_timer *t = (struct pawl_timer *)(uintptr_t)ud;
                /* NOLINTEND(performance-no-int-to-ptr) */
                set_del(tm, t);
                op_done(tm, t, res == -ETIME);
            }
        }
        io_uring_cq_advance(&tm->ring, seen);
        process_commands(tm);
        expire_due(tm);
    }
    return NULL;
}

/* ---- the epoll loop ---- */

static void epoll_set_deadline(struct pawl_timers *tm)
{
    int64_t d = tm->set_len ? tm->set[0]->_deadline_ns : 0;
    if (d == tm->tfd_deadline)
        return;
    struct itimerspec its = {0};
    if (d > 0) {
        its.it_value.tv_sec = d / 1000000000;
        its.it_value.tv_nsec = d % 1000000000;
        if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
            its.it_value.tv_nsec = 1;
    }
    timerfd_settime(tm->tfd, TFD_TIMER_ABSTIME, &its, NULL);
    tm->tfd_deadline = d;
}

static void *epoll_main(void *arg)
{
    struct pawl_timers *tm = arg;
    /* Acquire: pairs with pawl_timers_free's release store. */
    while (!atomic_load_explicit(PAWL_ATOMIC_OF(&tm->stop), memory_order_acquire)) {
        epoll_set_deadline(tm);
        struct epoll_event ev[4];
        int n = epoll_wait(tm->epfd, ev, 4, -1);
        for (int i = 0; i < n; i++) {
            uint64_t buf;
            ssize_t r = read(ev[i].data.fd, &buf, sizeof buf);
            (void)r; /* drained; EAGAIN is fine */
            if (ev[i].data.fd == tm->tfd)
                tm->tfd_deadline = 0; /* expired: must be set again */
        }
        int64_t now = pawl_now_ns();
        while (tm->set_len && tm->set[0]->_deadline_ns <= now) {
            struct pawl_timer *t = tm->set[0];
            set_del(tm, t);
            op_done(tm, t, 1);
        }
        process_commands(tm);
    }
    return NULL;
}

/* ---- creation ---- */

/* Try io_uring: set up a ring and check that an absolute timeout completes with -ETIME.
 * Returns 0, or a negative errno describing the refusal. */
static int uring_probe(struct pawl_timers *tm, unsigned entries, int simulate)
{
    if (simulate)
        return -simulate;
    /* A large completion queue: thousands of timers may expire together, and an overflowing
     * CQ pushes completions onto the kernel's slower overflow list. */
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_CQSIZE;
    p.cq_entries = entries * 16 > 4096 ? entries * 16 : 4096;
    int rc = io_uring_queue_init_params(entries, &tm->ring, &p);
    if (rc < 0)
        return rc;
    tm->ring_ok = 1;
    struct __kernel_timespec ts;
    int64_t now = pawl_now_ns();
    ts.tv_sec = now / 1000000000;
    ts.tv_nsec = now % 1000000000;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&tm->ring);
    io_uring_prep_timeout(sqe, &ts, 0, IORING_TIMEOUT_ABS);
    io_uring_sqe_set_data64(sqe, 0);
    rc = io_uring_submit(&tm->ring);
    if (rc < 0)
        return rc;
    struct io_uring_cqe *cqe;
    rc = io_uring_wait_cqe(&tm->ring, &cqe);
    if (rc < 0)
        return rc;
    int res = cqe->res;
    io_uring_cqe_seen(&tm->ring, cqe);
    return res == -ETIME ? 0 : (res < 0 ? res : -EINVAL);
}

static int epoll_setup(struct pawl_timers *tm)
{
    tm->epfd = epoll_create1(EPOLL_CLOEXEC);
    tm->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (tm->epfd < 0 || tm->tfd < 0)
        return PAWL_ESYS;
    struct epoll_event ev = {.events = EPOLLIN};
    ev.data.fd = tm->tfd;
    if (epoll_ctl(tm->epfd, EPOLL_CTL_ADD, tm->tfd, &ev) != 0)
        return PAWL_ESYS;
    ev.data.fd = tm->efd;
    if (epoll_ctl(tm->epfd, EPOLL_CTL_ADD, tm->efd, &ev) != 0)
        return PAWL_ESYS;
    return 0;
}

int pawl_timers_new(struct pawl_timers **out, struct pawl_pool *pool,
                    const struct pawl_timers_opts *opts)
{
    /* pool may be NULL: then only runtime-internal inline timers (pawl_timed_cond) run here. */
    struct pawl_timers_opts o;
    if (opts)
        o = *opts;
    else
        pawl_timers_opts_defaults(&o);
    if (out == NULL || o.backend < PAWL_TIMER_BACKEND_AUTO || o.backend > PAWL_TIMER_BACKEND_EPOLL)
        return PAWL_EINVAL;
    *out = NULL;
    int need_uring = o.require_io_uring || o.backend == PAWL_TIMER_BACKEND_IO_URING;
    if (need_uring && o.backend == PAWL_TIMER_BACKEND_EPOLL)
        return PAWL_EINVAL;
    int rc = PAWL_ENOMEM;
    struct pawl_timers *tm = pawl_calloc(1, sizeof(*tm));
    if (tm == NULL)
        goto fail;
    pawl__mpsc_init(&tm->cmdq);
    tm->pool = pool;
    tm->epfd = tm->tfd = -1;
    tm->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    rc = PAWL_ESYS;
    if (tm->efd < 0)
        goto fail;
    int simulated = pawl__testctl_uring_errno(); /* tests only: see testctl.h */
    if (o.backend != PAWL_TIMER_BACKEND_EPOLL) {
        int e = uring_probe(tm, o.ring_entries ? o.ring_entries : 256, simulated);
        if (e == 0) {
            tm->backend = BACKEND_URING;
            snprintf(tm->reason, sizeof tm->reason, "io_uring available");
        } else {
            if (tm->ring_ok) {
                io_uring_queue_exit(&tm->ring);
                tm->ring_ok = 0;
            }
            snprintf(tm->reason, sizeof tm->reason, "io_uring refused (%s%s)", strerror(-e),
                     simulated ? ", simulated" : "");
            if (need_uring) {
                PAWL_ERROR("timers", "%s and io_uring is required", tm->reason);
                rc = PAWL_ENOTSUP;
                goto fail;
            }
        }
    } else {
        snprintf(tm->reason, sizeof tm->reason, "epoll selected by option");
    }
    if (tm->backend == 0) {
        tm->backend = BACKEND_EPOLL;
        if (epoll_setup(tm) != 0)
            goto fail;
    }
    void *(*fn)(void *) = tm->backend == BACKEND_URING ? uring_main : epoll_main;
    if (pthread_create(&tm->thread, NULL, fn, tm) != 0)
        goto fail;
    pthread_setname_np(tm->thread, "pawl-timers");
    /* io_uring (or epoll as asked) at debug; a refused io_uring once per process at info.
     * Relaxed: only decides whether this creation logs; a duplicate line is harmless. */
    if (tm->backend == BACKEND_EPOLL && o.backend != PAWL_TIMER_BACKEND_EPOLL &&
        atomic_exchange_explicit(PAWL_ATOMIC_OF(&logged_fallback), 1, memory_order_relaxed) == 0)
        PAWL_INFO("timers", "timer backend: %s (%s)", pawl_timers_backend(tm), tm->reason);
    else
        PAWL_DEBUG("timers", "timer backend: %s (%s)", pawl_timers_backend(tm), tm->reason);
    *out = tm;
    return 0;
fail:
    if (tm) {
        if (tm->ring_ok)
            io_uring_queue_exit(&tm->ring);
        if (tm->tfd >= 0)
            close(tm->tfd);
        if (tm->epfd >= 0)
            close(tm->epfd);
        if (tm->efd >= 0)
            close(tm->efd);
        pawl_free(tm);
    }
    return rc;
}

/* Drop a timer the backend still held at shutdown: it will never fire. A later cancel must not
 * touch the (freed) timers object, so an armed state becomes idle. */
static void abandon(struct pawl_timer *t)
{
    uint64_t s = atomic_load_explicit(PAWL_ATOMIC_OF(&t->_state), memory_order_acquire);
    while ((s & 3) == ST_ARMED && !atomic_compare_exchange_strong_explicit(
                                      PAWL_ATOMIC_OF(&t->_state), &s, (s & ~(uint64_t)3) | ST_IDLE,
                                      memory_order_seq_cst, memory_order_acquire))
        ;
}

void pawl_timers_free(struct pawl_timers *tm)
{
    if (tm == NULL)
        return;
    /* Release: the thread's acquire load sees it; start() refuses new timers from here on. */
    atomic_store_explicit(PAWL_ATOMIC_OF(&tm->stop), 1, memory_order_release);
    uint64_t one = 1;
    ssize_t n = write(tm->efd, &one, sizeof one);
    (void)n;
    pthread_join(tm->thread, NULL);
    /* The thread is gone: we are the owner now. Commands first (they may name timers that are
     * also in the set), then whatever the backend still holds. */
    for (;;) {
        void **link = pawl__mpsc_pop_sc(&tm->cmdq);
        if (link == NULL)
            break;
        if (link == PAWL_MPSC_BUSY) {
            sched_yield();
            continue;
        }
        struct pawl_timer *t = PAWL_CONTAINER_OF(link, struct pawl_timer, _cmd_next);
        atomic_exchange_explicit(PAWL_ATOMIC_OF(&t->_queued), 0, memory_order_acq_rel);
        abandon(t);
        pawl__timer_unhold(t);
    }
    while (tm->set_len) {
        struct pawl_timer *t = tm->set[tm->set_len - 1];
        set_del(tm, t);
        t->_op = OP_NONE;
        abandon(t);
        pawl__timer_unhold(t);
    }
    if (tm->ring_ok)
        io_uring_queue_exit(&tm->ring); /* the kernel drops the timeouts still pending */
    if (tm->tfd >= 0)
        close(tm->tfd);
    if (tm->epfd >= 0)
        close(tm->epfd);
    close(tm->efd);
    pawl_free(tm->due);
    pawl_free(tm->set);
    pawl_free(tm);
}

/* ---- timed condition-variable waits on the timers ---- */

struct timed_wait {
    struct pawl_timer t;
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    int fired; /* under *mu: the callback is done with mu and cv */
};

static void timed_wait_fire(struct pawl_timer *t, void *arg, int status)
{
    (void)t;
    (void)status;
    struct timed_wait *w = arg;
    pthread_mutex_lock(w->mu);
    w->fired = 1;
    pthread_cond_broadcast(w->cv);
    pthread_mutex_unlock(w->mu); /* our last access to mu and cv: the waiter may destroy them */
}

static void timed_wait_idle(struct pawl_timer *t)
{
    pawl_free(PAWL_CONTAINER_OF(t, struct timed_wait, t)); /* nobody references it any more */
}

void pawl__timed_wait(struct pawl_timers *tm, pthread_mutex_t *mu, pthread_cond_t *cv,
                      clockid_t clock, int64_t delay_ns)
{
    if (delay_ns < 0)
        delay_ns = 0;
    /* On the heap: the timers thread may still hold it after we return (a removal in flight);
     * the last hold frees it. */
    struct timed_wait *w = tm ? pawl_malloc(sizeof *w) : NULL;
    if (w) {
        pawl_timer_init(&w->t, timed_wait_fire, w);
        w->t._inline = 1;
        w->t._idle_fn = timed_wait_idle;
        w->mu = mu;
        w->cv = cv;
        w->fired = 0;
        pawl__timer_hold(&w->t); /* ours, until we are done with it */
        if (start_ns(tm, &w->t, delay_ns, 0) == 0) {
            pthread_cond_wait(cv, mu); /* the timer's callback broadcasts at the deadline */
            /* Woken by someone else: take the timer back. If it has fired, its callback is
             * running or about to (it needs mu, which we hold): wait for it to be done with
             * mu and cv, so that the caller may destroy them as soon as we return. */
            if (pawl_timer_cancel(tm, &w->t) == PAWL_EALREADY)
                while (!w->fired)
                    pthread_cond_wait(cv, mu);
            pawl__timer_unhold(&w->t);
            return;
        }
        pawl__timer_unhold(&w->t); /* frees it */
    }
    /* No timers (shut down, or out of memory): a plain timed wait keeps the caller going. */
    struct timespec ts;
    pawl__timespec_in(&ts, clock, delay_ns);
    pthread_cond_timedwait(cv, mu, &ts);
}
