/*
 * trigger.h — the per-segment checkpoint trigger, processor side.
 *
 * One trigger exists per claim of a segment. The segment's worker creates it when it claims the
 * segment (pawl__trigger_new, with a wake callback that submits a step to the segment's serial
 * executor), hands it to every checkpointing unit, takes pending requests when it can run a
 * commit cycle (pawl__trigger_take), and makes it inert when it releases the segment or aborts
 * (pawl__trigger_invalidate) before dropping its reference (pawl__trigger_free).
 *
 * Requests (pawl/checkpoint.h) come from any thread: they merge into one atomic word holding the
 * highest pending token (PAWL_TOKEN_LATEST, the largest value, wins over any explicit token), and
 * the first request after each take calls wake once. A request never blocks and never allocates.
 *
 * Invariants: after pawl__trigger_invalidate returns, wake is never called again and no call of it
 * is still running, so the worker may free whatever wake's argument points at. The memory of the
 * trigger itself lives until the last reference is dropped (a unit may keep a stale pointer).
 *
 * Threads: new/take/has_pending/invalidate/free on the segment's worker (one step at a time);
 * request/ref/unref/is_live anywhere.
 */
#ifndef PAWL_ENGINE_TRIGGER_H
#define PAWL_ENGINE_TRIGGER_H

#include "pawl/checkpoint.h"

#include <stdbool.h>
#include <stdint.h>

/* Called by the first request after a take; must not block (submit a task and return). */
typedef void (*pawl_trigger_wake_fn)(void *arg);

/*
 * A live trigger with one reference (the caller's, dropped with pawl__trigger_free). wake may be
 * NULL (nothing to wake: the worker polls). arg is borrowed until pawl__trigger_invalidate returns.
 * Returns NULL when out of memory.
 */
struct pawl_trigger *pawl__trigger_new(pawl_trigger_wake_fn wake, void *arg);

/* Invalidate (if still live) and drop the creator's reference. NULL is a no-op. */
void pawl__trigger_free(struct pawl_trigger *t);

/*
 * Take the pending request if the segment can honour it: with `consumed` the last token the
 * segment has consumed, a pending PAWL_TOKEN_LATEST resolves to `consumed`, and a pending token
 * <= consumed is returned as is; either way it is cleared and true is returned with *out set.
 * A pending token beyond `consumed` stays pending (false), as does nothing pending (false).
 * Re-arms the wake for the next request.
 */
bool pawl__trigger_take(struct pawl_trigger *t, int64_t consumed, int64_t *out);

/* True when a request is pending (a cheap relaxed check for the worker's fast path). */
bool pawl__trigger_has_pending(const struct pawl_trigger *t);

/* True when pawl__trigger_take(t, consumed) would take something (a relaxed check, as above). */
bool pawl__trigger_ready(const struct pawl_trigger *t, int64_t consumed);

/*
 * Make the trigger inert: later requests return PAWL_ESHUTDOWN and never wake. Waits for wake
 * calls already running (they are a task submission long), so afterwards wake's argument may go.
 * Never call it holding a lock that wake takes (it would wait for itself). Idempotent. Clears
 * anything pending.
 */
void pawl__trigger_invalidate(struct pawl_trigger *t);

#endif
