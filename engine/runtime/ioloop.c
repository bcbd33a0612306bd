/*
 * ioloop.c — one I/O thread's event loop over io_uring, or epoll where io_uring is refused (see
 * ioloop.h for the contract).
 *
 * io_uring state per slot: the descriptor and interest the owner wants (fd, want) and the poll
 * request the kernel holds (armed, with the generation gen in its user_data). A change of fd or
 * interest removes the armed poll (its completion, stale by generation, is dropped); every wait
 * arms a poll for each slot that wants one and has none, in the same io_uring_enter that waits.
 * A poll is one-shot: after its completion the slot is unarmed until the next wait re-arms it,
 * which checks readiness afresh (level-triggered), so input libpq left in the socket is reported
 * again. user_data layout: kind in bits 0-7, slot in 8-31, generation in 32-63.
 */
#include "ioloop.h"

#include "common.h"

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

enum { BACKEND_URING = 1, BACKEND_EPOLL = 2 };
enum { UD_WAKE = 1, UD_POLL = 2, UD_REMOVE = 3 };

#define UD(kind, slot, gen) ((uint64_t)(kind) | (uint64_t)(slot) << 8 | (uint64_t)(gen) << 32)
#define EPOLL_WAKE_TAG UINT64_MAX
/* Counters: written by the owner only, read by anyone. Relaxed load and store (no locked
 * instruction): a reader wants an approximate snapshot, not an ordering. */
#define STAT_ADD(l, f, n)                                                                          \
    atomic_store_explicit(PAWL_ATOMIC_OF(&(l)->st.f),                                              \
                          atomic_load_explicit(PAWL_ATOMIC_OF(&(l)->st.f), memory_order_relaxed) + \
                              (n),                                                                 \
                          memory_order_relaxed)

struct slot {
    int fd;        /* wanted descriptor, or -1 */
    unsigned want; /* wanted PAWL_IO_* interest */
    /* io_uring */
    int armed; /* a poll with generation gen is in the kernel */
    uint32_t gen;
    /* epoll */
    int reg_fd;   /* descriptor registered in the epoll set, or -1 */
    unsigned reg; /* its registered interest */
};

struct pawl_ioloop {
    int backend;
    int efd;
    /* Set by wake() until the owner consumed the wake-up: coalesces the eventfd writes. Padded:
     * written by submitters on other cores. */
    _Alignas(PAWL_CACHELINE) uint32_t woken;
    char pad_[PAWL_CACHELINE - sizeof(uint32_t)];
    /* Owner-only from here. */
    struct io_uring ring;
    int ring_ok;
    int wake_armed;
    uint64_t efd_buf;
    int epfd;
    unsigned nslots;
    struct pawl_ioloop_stats st;
    char reason[160];
    struct slot *slots;
};

static int logged_fallback; /* a refused io_uring: once per process at INFO */

const char *pawl__ioloop_backend(const struct pawl_ioloop *l)
{
    return l->backend == BACKEND_URING ? "io_uring" : "epoll";
}

const char *pawl__ioloop_reason(const struct pawl_ioloop *l)
{
    return l->reason;
}

void pawl__ioloop_stats(const struct pawl_ioloop *l, struct pawl_ioloop_stats *out)
{
    /* Relaxed: counters the owner bumps; another thread reads an approximate snapshot. */
    out->waits = atomic_load_explicit(PAWL_ATOMIC_OF(&l->st.waits), memory_order_relaxed);
    out->enters = atomic_load_explicit(PAWL_ATOMIC_OF(&l->st.enters), memory_order_relaxed);
    out->ctls = atomic_load_explicit(PAWL_ATOMIC_OF(&l->st.ctls), memory_order_relaxed);
    out->events = atomic_load_explicit(PAWL_ATOMIC_OF(&l->st.events), memory_order_relaxed);
    out->wakeups = atomic_load_explicit(PAWL_ATOMIC_OF(&l->st.wakeups), memory_order_relaxed);
}

/* ---- wake-up ---- */

void pawl__ioloop_wake(struct pawl_ioloop *l)
{
    /* Acq_rel: what the caller published before (a queued request) is ordered before the flag;
     * the owner's clearing exchange acquires it before it looks at its queues. */
    if (atomic_exchange_explicit(PAWL_ATOMIC_OF(&l->woken), 1, memory_order_acq_rel) == 0) {
        uint64_t one = 1;
        ssize_t n = write(l->efd, &one, sizeof one);
        (void)n; /* the counter cannot overflow: the owner resets it on each wake-up */
    }
}

static void consume_wake(struct pawl_ioloop *l)
{
    STAT_ADD(l, wakeups, 1);
    /* Acq_rel: cleared after the eventfd was drained and before the caller looks at its queues,
     * so a producer that found the flag set published before this exchange, and one that finds
     * it clear writes the eventfd again. */
    atomic_exchange_explicit(PAWL_ATOMIC_OF(&l->woken), 0, memory_order_acq_rel);
}

/* ---- io_uring ---- */

static struct io_uring_sqe *get_sqe(struct pawl_ioloop *l)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);
    while (sqe == NULL) {
        io_uring_submit(&l->ring); /* the SQ is full: hand it to the kernel and retry */
        STAT_ADD(l, enters, 1);
        sqe = io_uring_get_sqe(&l->ring);
    }
    return sqe;
}

static unsigned to_poll(unsigned ev)
{
    return (ev & PAWL_IO_IN ? POLLIN : 0) | (ev & PAWL_IO_OUT ? POLLOUT : 0);
}

static unsigned from_poll(unsigned ev)
{
    return (ev & POLLIN ? PAWL_IO_IN : 0) | (ev & POLLOUT ? PAWL_IO_OUT : 0) |
           (ev & (POLLERR | POLLHUP | POLLNVAL) ? PAWL_IO_ERR : 0);
}

static void uring_disarm(struct pawl_ioloop *l, unsigned i)
{
    struct slot *s = &l->slots[i];
    if (!s->armed)
        return;
    struct io_uring_sqe *sqe = get_sqe(l);
    io_uring_prep_poll_remove(sqe, UD(UD_POLL, i, s->gen));
    io_uring_sqe_set_data64(sqe, UD(UD_REMOVE, i, 0));
    s->armed = 0;
    s->gen++; /* the removed poll's completion is stale from here */
}

static int uring_wait(struct pawl_ioloop *l, int64_t deadline_ns, struct pawl_ioev *ev)
{
    if (!l->wake_armed) {
        struct io_uring_sqe *sqe = get_sqe(l);
        io_uring_prep_read(sqe, l->efd, &l->efd_buf, sizeof l->efd_buf, 0);
        io_uring_sqe_set_data64(sqe, UD(UD_WAKE, 0, 0));
        l->wake_armed = 1;
    }
    for (unsigned i = 0; i < l->nslots; i++) {
        struct slot *s = &l->slots[i];
        if (s->armed || s->fd < 0 || s->want == 0)
            continue;
        struct io_uring_sqe *sqe = get_sqe(l);
        io_uring_prep_poll_add(sqe, s->fd, to_poll(s->want));
        io_uring_sqe_set_data64(sqe, UD(UD_POLL, i, s->gen));
        s->armed = 1;
        STAT_ADD(l, ctls, 1);
    }
    /* Completions already in the CQ need no system call, unless requests are waiting to go. */
    if (io_uring_cq_ready(&l->ring) == 0 || io_uring_sq_ready(&l->ring) > 0) {
        int64_t left = deadline_ns - pawl_now_ns();
        struct __kernel_timespec ts = {.tv_sec = 0, .tv_nsec = 0};
        if (left > 0) {
            ts.tv_sec = left / 1000000000;
            ts.tv_nsec = left % 1000000000;
        }
        struct io_uring_cqe *cqe;
        unsigned nr = left > 0 && io_uring_cq_ready(&l->ring) == 0 ? 1 : 0;
        STAT_ADD(l, enters, 1);
        int rc = nr ? io_uring_submit_and_wait_timeout(&l->ring, &cqe, 1, &ts, NULL)
                    : io_uring_submit(&l->ring);
        if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            PAWL_ERROR("ioloop", "io_uring_enter: %s", strerror(-rc));
            return PAWL_ESYS;
        }
    }
    int n = 0;
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&l->ring, head, cqe)
    {
        seen++;
        uint64_t ud = cqe->user_data;
        unsigned kind = (unsigned)(ud & 0xff), i = (unsigned)(ud >> 8 & 0xffffff);
        uint32_t gen = (uint32_t)(ud >> 32);
        if (kind == UD_WAKE) {
            l->wake_armed = 0;
            consume_wake(l);
        } else if (kind == UD_POLL && i < l->nslots && l->slots[i].armed &&
                   l->slots[i].gen == gen) {
            struct slot *s = &l->slots[i];
            s->armed = 0;
            s->gen++;
            unsigned e = cqe->res >= 0 ? from_poll((unsigned)cqe->res) : PAWL_IO_ERR;
            if (e) {
                ev[n].slot = i;
                ev[n].events = e;
                n++;
            }
        }
    }
    io_uring_cq_advance(&l->ring, seen);
    STAT_ADD(l, events, (uint64_t)n);
    return n;
}

/* Try io_uring: a ring, and the operations and features the loop relies on. 0 or -errno. */
static int uring_setup(struct pawl_ioloop *l, int simulate)
{
    if (simulate)
        return -simulate;
    unsigned entries = 2 * l->nslots + 8;
    int rc = io_uring_queue_init(entries < 16 ? 16 : entries, &l->ring, 0);
    if (rc < 0)
        return rc;
    l->ring_ok = 1;
    if (!(l->ring.features & IORING_FEAT_EXT_ARG))
        return -EOPNOTSUPP; /* no timeout argument to io_uring_enter (kernel < 5.11) */
    struct io_uring_probe *probe = io_uring_get_probe_ring(&l->ring);
    if (probe == NULL)
        return -EOPNOTSUPP;
    int ok = io_uring_opcode_supported(probe, IORING_OP_POLL_ADD) &&
             io_uring_opcode_supported(probe, IORING_OP_POLL_REMOVE) &&
             io_uring_opcode_supported(probe, IORING_OP_READ);
    io_uring_free_probe(probe);
    return ok ? 0 : -EOPNOTSUPP;
}

/* ---- epoll ---- */

static int epoll_apply(struct pawl_ioloop *l, unsigned i)
{
    struct slot *s = &l->slots[i];
    int fd = s->want ? s->fd : -1;
    unsigned want = fd >= 0 ? s->want : 0;
    if (fd == s->reg_fd && want == s->reg)
        return 0;
    struct epoll_event e = {.events = (want & PAWL_IO_IN ? EPOLLIN : 0) |
                                      (want & PAWL_IO_OUT ? EPOLLOUT : 0),
                            .data.u64 = i};
    if (fd != s->reg_fd) {
        if (s->reg_fd >= 0) {
            STAT_ADD(l, ctls, 1);
            epoll_ctl(l->epfd, EPOLL_CTL_DEL, s->reg_fd, NULL); /* may be closed: ignore */
        }
        s->reg_fd = -1;
        s->reg = 0;
        if (fd < 0)
            return 0;
        STAT_ADD(l, ctls, 1);
        if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &e) != 0)
            return PAWL_ESYS;
    } else {
        STAT_ADD(l, ctls, 1);
        if (epoll_ctl(l->epfd, EPOLL_CTL_MOD, fd, &e) != 0)
            return PAWL_ESYS;
    }
    s->reg_fd = fd;
    s->reg = want;
    return 0;
}

static int epoll_wait_loop(struct pawl_ioloop *l, int64_t deadline_ns, struct pawl_ioev *ev)
{
    struct epoll_event evs[64];
    int k;
    for (;;) {
        int64_t left = deadline_ns - pawl_now_ns();
        int timeout = left > 0 ? (int)PAWL_MIN((left + 999999) / 1000000, 3600000) : 0;
        STAT_ADD(l, enters, 1);
        k = epoll_wait(l->epfd, evs, (int)PAWL_MIN(l->nslots + 1, 64u), timeout);
        if (k < 0 && errno != EINTR) {
            PAWL_ERROR("ioloop", "epoll_wait: %s", strerror(errno));
            return PAWL_ESYS;
        }
        /* A signal, or a timeout the kernel rounded short: the deadline has not come yet. */
        if (k > 0 || pawl_now_ns() >= deadline_ns)
            break;
    }
    int n = 0;
    for (int j = 0; j < k; j++) {
        if (evs[j].data.u64 == EPOLL_WAKE_TAG) {
            uint64_t v;
            ssize_t r = read(l->efd, &v, sizeof v);
            (void)r; /* EAGAIN: already drained */
            consume_wake(l);
            continue;
        }
        uint32_t e = evs[j].events;
        ev[n].slot = (unsigned)evs[j].data.u64;
        ev[n].events = (e & EPOLLIN ? PAWL_IO_IN : 0) | (e & EPOLLOUT ? PAWL_IO_OUT : 0) |
                       (e & (EPOLLERR | EPOLLHUP) ? PAWL_IO_ERR : 0);
        n++;
    }
    STAT_ADD(l, events, (uint64_t)n);
    return n;
}

/* ---- the interface ---- */

int pawl__ioloop_watch(struct pawl_ioloop *l, unsigned slot, int fd, unsigned events)
{
    if (slot >= l->nslots)
        return PAWL_EINVAL;
    struct slot *s = &l->slots[slot];
    events &= PAWL_IO_IN | PAWL_IO_OUT;
    if (fd < 0)
        events = 0;
    if (l->backend == BACKEND_URING) {
        if (s->armed && (fd != s->fd || events != s->want))
            uring_disarm(l, slot);
        s->fd = fd;
        s->want = events;
        return 0;
    }
    s->fd = fd;
    s->want = events;
    return epoll_apply(l, slot);
}

int pawl__ioloop_wait(struct pawl_ioloop *l, int64_t deadline_ns, struct pawl_ioev *ev)
{
    STAT_ADD(l, waits, 1);
    return l->backend == BACKEND_URING ? uring_wait(l, deadline_ns, ev)
                                       : epoll_wait_loop(l, deadline_ns, ev);
}

int pawl__ioloop_new(struct pawl_ioloop **out, unsigned nslots, const char *name,
                     const struct pawl_ioloop_opts *opts)
{
    struct pawl_ioloop_opts o = {.backend = PAWL_TIMER_BACKEND_AUTO};
    if (opts)
        o = *opts;
    if (out == NULL || nslots < 1 || nslots > 1024 || o.backend < PAWL_TIMER_BACKEND_AUTO ||
        o.backend > PAWL_TIMER_BACKEND_EPOLL)
        return PAWL_EINVAL;
    *out = NULL;
    int rc = PAWL_ENOMEM;
    struct pawl_ioloop *l = pawl_calloc(1, sizeof *l);
    if (l == NULL)
        return PAWL_ENOMEM;
    l->efd = l->epfd = -1;
    l->nslots = nslots;
    l->slots = pawl_calloc(nslots, sizeof *l->slots);
    if (l->slots == NULL)
        goto fail;
    for (unsigned i = 0; i < nslots; i++)
        l->slots[i].fd = l->slots[i].reg_fd = -1;
    if (o.backend != PAWL_TIMER_BACKEND_EPOLL) {
        int e = uring_setup(l, o.simulate_uring_errno);
        if (e == 0) {
            l->backend = BACKEND_URING;
            snprintf(l->reason, sizeof l->reason, "io_uring available");
        } else {
            if (l->ring_ok)
                io_uring_queue_exit(&l->ring);
            l->ring_ok = 0;
            snprintf(l->reason, sizeof l->reason, "io_uring refused (%s%s)", strerror(-e),
                     o.simulate_uring_errno ? ", simulated" : "");
            if (o.backend == PAWL_TIMER_BACKEND_IO_URING) {
                PAWL_ERROR("ioloop", "%s: %s and io_uring is required", name ? name : "",
                           l->reason);
                rc = PAWL_ENOTSUP;
                goto fail;
            }
        }
    } else {
        snprintf(l->reason, sizeof l->reason, "epoll selected by option");
    }
    rc = PAWL_ESYS;
    if (l->backend == BACKEND_URING) {
        /* Blocking: the ring's read of it waits in the kernel (a non-blocking one would
         * complete at once with -EAGAIN). Writers never block: the owner resets the counter. */
        l->efd = eventfd(0, EFD_CLOEXEC);
        if (l->efd < 0)
            goto fail;
    } else {
        l->backend = BACKEND_EPOLL;
        l->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        l->epfd = epoll_create1(EPOLL_CLOEXEC);
        if (l->efd < 0 || l->epfd < 0)
            goto fail;
        struct epoll_event e = {.events = EPOLLIN, .data.u64 = EPOLL_WAKE_TAG};
        if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->efd, &e) != 0)
            goto fail;
    }
    /* The usual choice (io_uring, or epoll as asked) is start-up detail: debug. A refused
     * io_uring is worth one line at info per process: it says why the fallback runs.
     * Relaxed: only decides whether this creation logs at INFO; a duplicate line is harmless. */
    if (l->backend == BACKEND_EPOLL && o.backend != PAWL_TIMER_BACKEND_EPOLL &&
        atomic_exchange_explicit(PAWL_ATOMIC_OF(&logged_fallback), 1, memory_order_relaxed) == 0)
        PAWL_INFO("ioloop", "%s: I/O loop backend: %s (%s)", name ? name : "",
                  pawl__ioloop_backend(l), l->reason);
    else
        PAWL_DEBUG("ioloop", "%s: I/O loop backend: %s (%s)", name ? name : "",
                   pawl__ioloop_backend(l), l->reason);
    *out = l;
    return 0;
fail:
    if (l->ring_ok)
        io_uring_queue_exit(&l->ring);
    if (l->epfd >= 0)
        close(l->epfd);
    if (l->efd >= 0)
        close(l->efd);
    pawl_free(l->slots);
    pawl_free(l);
    return rc;
}

void pawl__ioloop_free(struct pawl_ioloop *l)
{
    if (l == NULL)
        return;
    if (l->ring_ok)
        io_uring_queue_exit(&l->ring); /* cancels the polls and the eventfd read */
    if (l->epfd >= 0)
        close(l->epfd);
    close(l->efd);
    pawl_free(l->slots);
    pawl_free(l);
}
