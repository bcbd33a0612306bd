/*
 * pawl/runtime.h — the concurrency core: a work-stealing thread pool, serial executors on top of
 * it, one-shot futures of a token, and timers (io_uring, with a timerfd+epoll fallback).
 *
 * Everything here is callable from any thread unless a comment says otherwise. Nothing in this
 * header blocks except pawl_future_wait() and the *_free() functions, which join threads.
 *
 * Tasks are intrusive and owned by the caller: submitting never allocates, and a task's memory
 * must stay valid until its function has been called. Every submitted task's function is called
 * exactly once: with status 0 when it runs, or with PAWL_ECANCELED when the pool shuts down
 * before running it (then it is called on the thread inside pawl_pool_free()).
 *
 * Lifetimes, in one place: free timers before the pool they dispatch to; a serial executor and
 * every future continuation must be quiescent (nothing queued) before the pool is freed, or they
 * are cancelled by pawl_pool_free() as described there.
 */
#ifndef PAWL_RUNTIME_H
#define PAWL_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pawl/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Tasks and the pool                                                                           */
/* ------------------------------------------------------------------------------------------ */

struct pawl_task;

/*
 * A task's function. status is 0 when the task runs, PAWL_ECANCELED when the pool is shutting
 * down and the task will not run. Called exactly once per submission; the task may be
 * resubmitted (or freed) from inside its own function.
 */
typedef void (*pawl_task_fn)(struct pawl_task *t, int status);

/* Embed this in your own struct and recover it with container_of-style arithmetic. */
struct pawl_task {
    pawl_task_fn fn;
    void *_next; /* private: link in the runtime's intrusive queues */
};

struct pawl_pool;

struct pawl_pool_opts {
    int workers;        /* worker threads; 0 = online CPUs (default); at most 1024 */
    int deque_capacity; /* initial slots per worker deque (power of two); 0 = 256. Deques grow. */
    const char *name;   /* thread name prefix (at most 10 bytes used); NULL = "pawl-w" */
};

/* Fill opts with the defaults documented above. */
PAWL_API void pawl_pool_opts_defaults(struct pawl_pool_opts *opts);

/*
 * Start a pool. opts may be NULL (defaults). On success *out owns the pool (free with
 * pawl_pool_free); on failure *out is NULL and nothing is left running.
 */
PAWL_API int pawl_pool_new(struct pawl_pool **out, const struct pawl_pool_opts *opts);

/*
 * Queue t; callable from any thread. From a worker of this pool the task goes onto that worker's
 * own deque (LIFO for the owner while the deque is deep, the last few oldest first; stolen FIFO
 * by idle workers); from any other thread onto that thread's own ring for this pool (FIFO; a
 * thread's first submission to a pool registers it under a short lock and allocates it once, and
 * the pool frees it) or, when that is full or the pool has rings for 16 threads already, onto the
 * pool's lock-free injection queue; a parked worker is woken. Otherwise never blocks, never
 * allocates per task (a deque may grow, amortised; if growing fails the task takes the injection
 * queue).
 * Returns 0, or PAWL_EINVAL for a NULL task or a task without fn.
 */
PAWL_API int pawl_pool_submit(struct pawl_pool *pool, struct pawl_task *t);

/*
 * Queue tasks[0..n-1] as n calls of pawl_pool_submit in that order would, for about the cost of
 * one. From a worker of this pool they go onto its deque together: one publication, one wake-up
 * check (if the deque cannot grow, the whole batch takes the injection queue). From any other
 * thread they take consecutive slots of the pool's injection ring with one atomic CAS (or, when
 * it is full, enter the injection queue as one pre-linked chain: one atomic exchange, one atomic
 * add), with at most one futex call, and the worker it wakes wakes the next one if more than one
 * task is left; the batch is taken in array order, with no other submitter's task in between
 * (but it may overtake single tasks submitted from outside before it).
 * The array is borrowed for the call only. The tasks are the caller's as with pawl_pool_submit
 * (valid until their function has been called); none may already be queued or appear twice.
 * Never blocks, never allocates per task. Returns 0, or PAWL_EINVAL, with nothing queued, for a
 * NULL pool or array, n == 0, or a NULL task or task without fn anywhere in the array. At
 * shutdown it behaves as pawl_pool_submit (see pawl_pool_free): every task of the batch is run
 * or cancelled, exactly once.
 */
PAWL_API int pawl_pool_submit_batch(struct pawl_pool *pool, struct pawl_task *const *tasks,
                                    size_t n);

/*
 * Orderly shutdown: stop taking new work, let every running task finish, join the workers, then
 * call every task still queued with PAWL_ECANCELED, on the calling thread, exactly once —
 * including tasks that cancelled tasks submit (repeated until nothing is queued). Must not be
 * called from a worker of this pool. A thread outside the pool that is inside
 * pawl_pool_submit or pawl_pool_submit_batch (or completing a future whose continuation goes to
 * this pool) when shutdown starts is waited for, and its tasks cancelled. No thread may start a
 * submission once pawl_pool_free may have returned: stop the threads that complete futures (a
 * checkpointing unit's own I/O threads, say) before freeing the pool. NULL is a no-op.
 */
PAWL_API void pawl_pool_free(struct pawl_pool *pool);

struct pawl_pool_stats {
    uint64_t executed;  /* task functions called with status 0 */
    uint64_t cancelled; /* task functions called with PAWL_ECANCELED */
    uint64_t steals;    /* tasks taken from another worker's deque */
    uint64_t injected;  /* tasks submitted from outside the pool */
    uint64_t parks;     /* times a worker went to sleep for lack of work */
    uint64_t wakeups;   /* futex wake-ups issued (by submitters, and by workers passing one on) */
    uint64_t kept;      /* times a worker kept queued work to itself rather than wake a helper
                         * for it (too little to be worth a wake-up; see the README) */
    int workers;
};

/* A snapshot of the counters (each read relaxed; the sums are approximate while running). */
PAWL_API void pawl_pool_stats(const struct pawl_pool *pool, struct pawl_pool_stats *out);

/* Number of worker threads. */
PAWL_API int pawl_pool_workers(const struct pawl_pool *pool);

/*
 * Call from a task before a wait that may take long (I/O, SQL, a lock held elsewhere). A worker
 * that finds a small burst of short tasks runs them itself rather than wake a parked worker for
 * them (the wake-up would cost more than the work); should one of them then block, the rest
 * would wait behind it. This wakes a parked worker if any task is queued, so they do not. pawl's
 * own blocking calls (pawl_append, the store's synchronous statements) call it; tasks that block
 * in other ways should. Tasks that block without it are found out by the time they take (the
 * worker then stops keeping work), but a burst kept before that waits for the slow task.
 * Cheap when nothing is queued; a no-op outside a pool worker.
 */
PAWL_API void pawl_pool_will_block(void);

/* The calling thread's worker index in [0, workers), or -1 outside any pawl pool. */
PAWL_API int pawl_pool_current_worker(void);

/* ------------------------------------------------------------------------------------------ */
/* Serial executors                                                                             */
/* ------------------------------------------------------------------------------------------ */

/*
 * A serial executor runs the tasks submitted to it one at a time, in submission order (the order
 * in which concurrent pawl_serial_submit() calls linearise), on the pool's workers; different
 * executors run in parallel. One per segment keeps a segment's events in order. Caller-owned
 * storage (embed it); every field is private.
 */
struct pawl_mpsc_ {
    void **_head; /* producers' end (exchanged); links are the nodes' void * fields */
    char _pad0[64 - sizeof(void *)];
    void **_tail; /* the single consumer's end */
    void *_stub;  /* the permanent dummy node */
    char _pad1[64 - 2 * sizeof(void *)];
};

struct pawl_serial {
    struct pawl_mpsc_ _q; /* queued tasks, linked through pawl_task._next */
    struct pawl_pool *_pool;
    uint64_t _count;         /* tasks submitted and not yet run; 0 -> 1 schedules the drain */
    struct pawl_task _drain; /* the pool task that runs queued tasks */
    uint64_t _ran;           /* tasks run (for tests and stats) */
};

/* Bind s to pool. Never fails today; returns 0 or PAWL_EINVAL. */
PAWL_API int pawl_serial_init(struct pawl_serial *s, struct pawl_pool *pool);

/*
 * Release s. The caller guarantees nothing is queued or running on it: pawl_serial_idle(s) has
 * returned true since the last submit, or the pool has been freed. That a task's function has
 * returned is not enough: the drain that called it still touches s for a moment afterwards.
 * Does not touch the pool.
 */
PAWL_API void pawl_serial_fini(struct pawl_serial *s);

/*
 * True when no task is queued on s and no drain of s is running or scheduled (acquire load), so
 * s may be finalised and freed. Only meaningful once no thread submits to s any more.
 */
PAWL_API bool pawl_serial_idle(const struct pawl_serial *s);

/*
 * Queue t on s; lock-free (one atomic exchange plus one atomic add), callable from any thread,
 * including from a task running on s. t's function is called exactly once, on a pool worker,
 * after every task submitted to s before it has returned (or with PAWL_ECANCELED at pool
 * shutdown, still in order). Returns 0 or PAWL_EINVAL.
 */
PAWL_API int pawl_serial_submit(struct pawl_serial *s, struct pawl_task *t);

/* Tasks run so far on s (relaxed read). */
PAWL_API uint64_t pawl_serial_ran(const struct pawl_serial *s);

/* ------------------------------------------------------------------------------------------ */
/* Futures                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/*
 * A one-shot future of an int64 token or an error (code + message), heap-allocated and
 * reference-counted. It is completed at most once, from any thread: the first
 * pawl_future_complete()/pawl_future_fail() wins; later ones return PAWL_EALREADY and change
 * nothing. Completion never blocks and never runs user code on the completing thread: each
 * registered continuation is pushed (lock-free) onto its executor — a serial executor's MPSC
 * queue or the pool's deque/injection queue — and runs there.
 *
 * There is no built-in timeout: a future that is never completed stays pending forever and
 * stalls whatever waits on it (for a segment: that segment only, with its batch transaction
 * still open). Bound your own with pawl_future_or_timeout().
 */
struct pawl_future;
struct pawl_timers;

/* A new pending future with one reference, owned by the caller. NULL when out of memory. */
PAWL_API struct pawl_future *pawl_future_new(void);

/*
 * Take / drop a reference. The future is freed when the last one is dropped; unref(NULL) is a
 * no-op. A thread completing a future, or registering a continuation, must hold a reference for
 * the duration of the call. Registered continuations hold none: if every reference is dropped
 * before the future is completed, nobody can complete it any more, and its continuations are
 * discarded without being called (combinators built on it fail with PAWL_ECANCELED).
 */
PAWL_API struct pawl_future *pawl_future_ref(struct pawl_future *f);
PAWL_API void pawl_future_unref(struct pawl_future *f);

/* Complete with a token. 0, or PAWL_EALREADY if the future was already completed/failed. */
PAWL_API int pawl_future_complete(struct pawl_future *f, int64_t token);

/*
 * Fail with code (a negative PAWL_E* code; 0 or positive is turned into PAWL_EINVAL) and an
 * optional message (copied; NULL = pawl_strerror(code)). 0, or PAWL_EALREADY.
 */
PAWL_API int pawl_future_fail(struct pawl_future *f, int code, const char *msg);

/*
 * Complete or fail, and drop the caller's reference, in one call: the same result as
 * pawl_future_complete() (or _fail()) followed by pawl_future_unref(), for the common completer
 * that lets go of the future once it is done with it. Cheaper: the reference passes to the
 * continuation task queued last instead of being dropped here and taken again there; and when it
 * is the last reference, the completion itself takes no locked instruction (nobody else may be
 * using the future then: it can be freed as soon as its continuation runs). The reference is
 * consumed whatever the return value (PAWL_EALREADY included), except on PAWL_EINVAL for a NULL
 * future.
 */
PAWL_API int pawl_future_complete_unref(struct pawl_future *f, int64_t token);
PAWL_API int pawl_future_fail_unref(struct pawl_future *f, int code, const char *msg);

/*
 * Read the outcome without blocking. PAWL_EAGAIN while pending. Otherwise 0, with *code = 0 and
 * *token the token on success, or *code the error and *msg its text (borrowed: valid while you
 * hold a reference). Any out-pointer may be NULL.
 */
PAWL_API int pawl_future_poll(const struct pawl_future *f, int64_t *token, int *code,
                              const char **msg);

/* 1 once completed or failed, 0 while pending (acquire read: the outcome is visible after 1). */
PAWL_API int pawl_future_done(const struct pawl_future *f);

typedef void (*pawl_future_cb)(void *arg, struct pawl_future *f);

/*
 * Call cb(arg, f) once f is completed or failed: on the serial executor ex (in order with ex's
 * other tasks), or, when ex is NULL, as a task on pool. If f is already done the continuation is
 * queued at once — it never runs on the calling or the completing thread. Once queued, the task
 * holds a reference to f, so f is valid inside cb. If the pool shuts down before the queued task
 * runs, cb is still called (on the thread in pawl_pool_free()) so that resources are released.
 * One small allocation per call. 0, PAWL_EINVAL or PAWL_ENOMEM.
 */
PAWL_API int pawl_future_on_complete(struct pawl_future *f, struct pawl_serial *ex,
                                     struct pawl_pool *pool, pawl_future_cb cb, void *arg);

/*
 * Block the calling thread until f is done or timeout_ms passes (< 0: no limit). For threads
 * outside the pool (tests, tools, an embedder's own threads): a pool worker must never block on a
 * future, so from a worker this returns PAWL_EINVAL at once. 0 when done (read it with
 * pawl_future_poll), PAWL_ETIMEDOUT otherwise. The wait is a futex with the timeout as its
 * kernel deadline, in the caller's thread: the library itself never calls it (its own timed
 * waits run on a timers object), so it needs none.
 */
PAWL_API int pawl_future_wait(struct pawl_future *f, int64_t timeout_ms);

/*
 * All-of: a new future (owned by the caller) that fails with the first error to occur among fs
 * (its code and message), or, once every one of fs has completed, completes with the LOWEST of
 * their tokens — the position every input has reached. Read the individual tokens with
 * pawl_future_poll() on the inputs if you need them (e.g. the highest). n == 0 gives a future
 * already completed with PAWL_TOKEN_START (0). The inputs stay owned by the caller; the
 * combinator holds no reference to them (an input released uncompleted fails the result with
 * PAWL_ECANCELED). The callbacks involved are the runtime's own and run on the completing
 * thread; user continuations of the result still run on their executors. NULL on invalid
 * arguments or out of memory.
 */
PAWL_API struct pawl_future *pawl_future_all(struct pawl_future *const *fs, size_t n);

/*
 * Or-timeout: a new future (owned by the caller) that takes f's outcome if f is done within ms
 * milliseconds, and otherwise fails with PAWL_ETIMEDOUT ("timed out after N ms"). f itself is not
 * changed by the timeout (the producer may still complete it; that result is then ignored by the
 * combined future). The timer runs on tm; its pending timer is cancelled when f completes first.
 * NULL on invalid arguments or out of memory.
 */
PAWL_API struct pawl_future *pawl_future_or_timeout(struct pawl_future *f, struct pawl_timers *tm,
                                                    int64_t ms);

/* ------------------------------------------------------------------------------------------ */
/* Timers                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/*
 * A timers object owns one thread and one event source: an io_uring ring (each armed timer is one
 * IORING_OP_TIMEOUT with an absolute CLOCK_MONOTONIC deadline stored in the timer object, and
 * cancelling is IORING_OP_TIMEOUT_REMOVE), or, where io_uring is refused, a timerfd + epoll loop
 * over a deadline heap. Timer callbacks never run on that thread: each expiry is submitted to the
 * pool as a task. Which backend runs, and why, is logged once per process.
 *
 * Names follow the type a function is about, as pawl_pool_* and pawl_task do: pawl_timers_* the
 * timers object (struct pawl_timers, its thread, its options), pawl_timer_* one timer (struct
 * pawl_timer, started and cancelled on a timers object), pawl_timer_backend_* the enum.
 */
enum pawl_timer_backend {
    PAWL_TIMER_BACKEND_AUTO = 0,     /* io_uring if it works here, else epoll (default) */
    PAWL_TIMER_BACKEND_IO_URING = 1, /* io_uring only; creation fails where it is refused */
    PAWL_TIMER_BACKEND_EPOLL = 2,    /* timerfd + epoll */
};

struct pawl_timers_opts {
    enum pawl_timer_backend backend; /* default PAWL_TIMER_BACKEND_AUTO */
    int require_io_uring;  /* nonzero: fail with PAWL_ENOTSUP instead of falling back (default 0) */
    unsigned ring_entries; /* io_uring submission queue size; 0 = 256 */
};

/* Fill opts with the defaults documented above. */
PAWL_API void pawl_timers_opts_defaults(struct pawl_timers_opts *opts);

/* Parse "auto", "io_uring" (or "io-uring", "uring"), "epoll"; PAWL_EINVAL otherwise. */
PAWL_API int pawl_timer_backend_parse(const char *s, enum pawl_timer_backend *out);

struct pawl_timer;

/*
 * A timer callback, run as a pool task. status is 0 on expiry, PAWL_ECANCELED when the pool shut
 * down before the task ran (the timer did not "fire" in time; release what you must).
 */
typedef void (*pawl_timer_fn)(struct pawl_timer *t, void *arg, int status);

/*
 * A timer: caller-owned storage. All fields are private. The runtime references the timer while
 * pawl_timer_busy() is nonzero: a start or cancel is being processed, the kernel or the heap
 * holds it, or its callback is queued (and, for a periodic timer, running). Keep the memory valid
 * until then. A one-shot timer stops being busy as its callback starts, so the callback may free
 * or restart its own timer. After pawl_timers_free() returns, only a callback already handed to
 * the pool can still reference a timer.
 */
struct pawl_timer {
    struct pawl_task _task; /* the pool task that runs the callback */
    pawl_timer_fn _cb;
    void *_arg;
    void *_cmd_next;                        /* link in the timers thread's command queue */
    void (*_idle_fn)(struct pawl_timer *t); /* runtime-internal: called when busy drops to 0 */
    uint64_t _state;                        /* generation << 2 | {idle, armed, fired} */
    int64_t _delay_ns;                      /* requested first delay (atomic access) */
    int64_t _period_ns;                     /* 0 = one-shot (atomic access) */
    uint32_t _busy;        /* holds: queued command, kernel/heap op, dispatched callback */
    uint32_t _queued;      /* 1 while on the command queue */
    uint32_t _cb_inflight; /* 1: periodic callback queued or running; 2: one-shot queued */
    /* Owned by the timers thread only: */
    uint64_t _armed_gen;
    int64_t _deadline_ns;
    int64_t _ts[2];   /* io_uring: the __kernel_timespec of the armed timeout */
    int _op;          /* 0 none, 1 armed in backend, 2 removal requested */
    int _heap_idx;    /* epoll backend: position in the deadline heap, -1 if none */
    uint64_t _missed; /* periodic expiries skipped because a callback still ran */
    uint32_t _inline; /* runtime-internal: the one-shot callback runs on the timers thread */
};

/*
 * Start the timers thread. pool receives the callbacks and must outlive the timers object (NULL:
 * pawl_timer_start then fails with PAWL_EINVAL; the runtime uses such objects internally).
 * opts may be NULL (defaults). On success *out owns the object.
 * PAWL_ENOTSUP when io_uring is required (backend IO_URING or require_io_uring) and refused;
 * PAWL_ESYS / PAWL_ENOMEM when the thread or the epoll descriptors cannot be created.
 */
PAWL_API int pawl_timers_new(struct pawl_timers **out, struct pawl_pool *pool,
                             const struct pawl_timers_opts *opts);

/*
 * Stop the thread. Pending timers never fire (and are not called); callbacks already submitted
 * to the pool still run (or are cancelled by the pool's shutdown). NULL is a no-op.
 */
PAWL_API void pawl_timers_free(struct pawl_timers *tm);

/* "io_uring" or "epoll" — the backend actually running. Static string. */
PAWL_API const char *pawl_timers_backend(const struct pawl_timers *tm);

/* Why this backend runs (e.g. "io_uring refused: Operation not permitted"). Valid until free. */
PAWL_API const char *pawl_timers_backend_reason(const struct pawl_timers *tm);

/* Prepare t (idle). Call once before first use, and only while t is not busy. */
PAWL_API void pawl_timer_init(struct pawl_timer *t, pawl_timer_fn cb, void *arg);

/*
 * Arm t to fire after delay_ms (>= 0), then every period_ms if period_ms > 0 (fixed rate on
 * absolute deadlines; an expiry that finds the previous callback still queued or running is
 * skipped, so at most one callback per timer is ever in flight). Any thread, including t's own
 * one-shot callback. A one-shot timer may be restarted while the callback of its last expiry is
 * still queued; if it expires again before the pool has taken that callback, the queued callback
 * stands for both expiries (one call). 0; PAWL_EBUSY if t is armed (cancel it first) or a
 * periodic callback of an earlier start is still queued or running; PAWL_EINVAL;
 * PAWL_ESHUTDOWN.
 */
PAWL_API int pawl_timer_start(struct pawl_timers *tm, struct pawl_timer *t, int64_t delay_ms,
                              int64_t period_ms);

/*
 * Disarm t; any thread, never blocks, safe before, at and after expiry. Returns 0 if t was armed
 * and no further expiry will be dispatched; PAWL_EALREADY if t was not armed (never started,
 * already cancelled, or a one-shot that already fired — its callback has been or is being
 * dispatched and runs exactly once). A callback dispatched before cancel returned (a one-shot
 * answered PAWL_EALREADY, or a periodic expiry) may still run after it returns: a periodic
 * timer's callback has returned once pawl_timer_busy(t) reads 0; a one-shot's callback has at
 * least started then — have it signal you if you must wait for its end. t may be started again
 * right away (PAWL_EBUSY while a periodic callback is still in flight).
 */
PAWL_API int pawl_timer_cancel(struct pawl_timers *tm, struct pawl_timer *t);

/* Nonzero while the runtime still references t (see struct pawl_timer). Acquire read. */
PAWL_API int pawl_timer_busy(const struct pawl_timer *t);

/* Number of timers currently armed on tm (approximate while others start/cancel). */
PAWL_API uint64_t pawl_timers_armed(const struct pawl_timers *tm);

#ifdef __cplusplus
}
#endif
#endif
