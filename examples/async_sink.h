/*
 * async_sink.h — example 2 of the checkpoint protocol: a truly asynchronous handler.
 *
 * The handler does not do its work on the processing thread: it hands every event to its own
 * pool of threads and returns at once, so it may fall behind the stream. The threads "deliver"
 * each event to an external system — here, a line appended to a file (optionally fdatasync'ed),
 * after a configurable delay that stands for the remote call — in whatever order they finish.
 *
 * Checkpoints are a barrier: on_checkpoint_advanced(requested) returns a future that completes
 * only once every event of the segment up to `requested` has been delivered, and reports the
 * highest position delivered without a gap (which may be past `requested` if more drained). The
 * processor waits for it before it resumes the segment, so handling is held until the
 * asynchronous work catches up.
 *
 * It keeps the trigger handed to on_segment_claimed (taking a reference) and asks for a
 * checkpoint from its own threads whenever `every` more events have been delivered — the trigger
 * is callable from any thread, and after the segment is released the requests are ignored.
 *
 * On release it does not wait: it reports the position delivered so far (the best-effort
 * semantics of on_segment_released); the rest is redelivered at the next claim. Delivery is
 * therefore at-least-once: an event may reach the sink twice, never zero times.
 *
 * Threads: callbacks on the processor's workers; `threads` threads of its own.
 */
#ifndef EX_ASYNC_SINK_H
#define EX_ASYNC_SINK_H

#include "pawl.h"

struct ex_async;

struct ex_async_opts {
    const char *path; /* the sink file (appended to); NULL: deliver nowhere (count only) */
    int threads;      /* worker threads; default 2 */
    int delay_us;     /* simulated latency per event; default 0 */
    int every;        /* request a checkpoint every `every` delivered events; 0: never */
    int sync;         /* fdatasync after each delivery */
};

int ex_async_new(struct ex_async **out, const struct ex_async_opts *opts);
/* Drains the queue, stops the threads. NULL is a no-op. */
void ex_async_free(struct ex_async *a);

struct pawl_handler ex_async_handler(struct ex_async *a, const char *name);

/* Events delivered so far (any thread). */
int64_t ex_async_delivered(struct ex_async *a);

/* Testing hooks: stall the workers (deliveries wait) until resumed; fail barriers with an error. */
void ex_async_pause(struct ex_async *a, int paused);
void ex_async_fail_barriers(struct ex_async *a, int fail);

#endif
