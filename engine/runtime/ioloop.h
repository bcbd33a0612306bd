/*
 * ioloop.h — the event loop of one I/O thread: readiness of a few sockets, one deadline and a
 * cross-thread wake-up, waited for together in one system call.
 *
 * Two backends behind one interface, chosen when the loop is created and logged:
 *   - io_uring: each watched socket is one one-shot IORING_OP_POLL_ADD, re-armed by the next
 *     wait (so readiness is level-triggered, like epoll's default: libpq does not always read a
 *     socket dry, and a multishot poll only reports new wake-ups); the wake-up is a read of a
 *     blocking eventfd kept in the ring; the deadline is the timeout argument of the same
 *     io_uring_enter that submits the re-armed polls (IORING_FEAT_EXT_ARG). One system call per
 *     loop iteration, whatever the number of sockets that changed.
 *   - epoll: sockets in an epoll set, the eventfd in it too, the deadline as epoll_wait's
 *     timeout (rounded up to the millisecond); epoll_ctl for every change of interest.
 * io_uring is used unless refused (setup fails, or the kernel lacks poll, read or the timeout
 * argument); PAWL_TIMER_BACKEND_EPOLL forces the fallback, PAWL_TIMER_BACKEND_IO_URING makes a
 * refusal an error.
 *
 * Threads: pawl__ioloop_wake may be called from any thread; everything else belongs to the one
 * thread that runs the loop (after creation, which may happen on another thread).
 * Slots: the caller names each socket by a small slot number (0..nslots-1); a slot watches at
 * most one descriptor at a time.
 */
#ifndef PAWL_ENGINE_IOLOOP_H
#define PAWL_ENGINE_IOLOOP_H

#include "pawl/runtime.h"

#include <stdint.h>

struct pawl_ioloop;

enum { PAWL_IO_IN = 1u, PAWL_IO_OUT = 2u, PAWL_IO_ERR = 4u /* error or hang-up */ };

struct pawl_ioev {
    unsigned slot;
    unsigned events; /* PAWL_IO_* */
};

struct pawl_ioloop_opts {
    enum pawl_timer_backend backend; /* default AUTO */
    int simulate_uring_errno;        /* tests: behave as if io_uring setup failed with this */
};

struct pawl_ioloop_stats {
    uint64_t waits;   /* calls of pawl__ioloop_wait */
    uint64_t enters;  /* system calls made by them (io_uring_enter or epoll_wait) */
    uint64_t ctls;    /* epoll_ctl calls (epoll); poll SQEs queued (io_uring) */
    uint64_t events;  /* socket events returned */
    uint64_t wakeups; /* cross-thread wake-ups consumed */
};

/*
 * Create a loop with nslots (1..1024) socket slots. name is used in the log line. Returns 0,
 * PAWL_EINVAL, PAWL_ENOMEM, PAWL_ESYS, or PAWL_ENOTSUP when io_uring is required and refused.
 */
int pawl__ioloop_new(struct pawl_ioloop **out, unsigned nslots, const char *name,
                     const struct pawl_ioloop_opts *opts);
void pawl__ioloop_free(struct pawl_ioloop *l); /* NULL is a no-op; closes the eventfd */

const char *pawl__ioloop_backend(const struct pawl_ioloop *l); /* "io_uring" or "epoll" */
const char *pawl__ioloop_reason(const struct pawl_ioloop *l);  /* why that backend */
/* Any thread: a relaxed snapshot of the counters. */
void pawl__ioloop_stats(const struct pawl_ioloop *l, struct pawl_ioloop_stats *out);

/*
 * Watch fd in slot for events (PAWL_IO_IN | PAWL_IO_OUT; errors are always reported); fd < 0
 * or events 0 stops watching. Replacing the descriptor of a slot drops the old one's interest
 * (the old descriptor may already be closed). Owner only. Returns 0 or PAWL_ESYS (epoll_ctl).
 */
int pawl__ioloop_watch(struct pawl_ioloop *l, unsigned slot, int fd, unsigned events);

/*
 * Wait until a watched socket is ready, the loop is woken, or deadline_ns (pawl_now_ns clock;
 * <= now: do not sleep) passes. Fills ev (room for at least nslots entries, one per slot at
 * most) and returns how many, 0 on a wake-up or the deadline, or PAWL_ESYS. Owner only.
 */
int pawl__ioloop_wait(struct pawl_ioloop *l, int64_t deadline_ns, struct pawl_ioev *ev);

/* Wake the loop's thread out of pawl__ioloop_wait (any thread; coalesced while outstanding). */
void pawl__ioloop_wake(struct pawl_ioloop *l);

#endif
