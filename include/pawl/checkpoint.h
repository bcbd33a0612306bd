/*
 * pawl/checkpoint.h — self-checkpointing handlers: units that decide themselves when a segment's
 * stored token may advance.
 *
 * A handler (struct pawl_handler in pawl/processor.h) becomes a *checkpointing unit* by pointing
 * its `ckpt` field at a struct pawl_checkpointing. The processor then stores a segment's token
 * only once every unit on the segment has confirmed, through a future, that its work is durable
 * up to that token. The processor's mode follows from its handlers:
 *
 *   - no checkpointing unit       PAWL_CKPT_PLAIN     the token is stored with every batch
 *                                                      that queued SQL (else when due, see
 *                                                      pawl/processor.h);
 *   - every handler is a unit     PAWL_CKPT_DEFERRED  the token moves only when a unit asks,
 *                                                      through its trigger;
 *   - some are, some are not      PAWL_CKPT_AUTO      every batch asks the units to cover the
 *                                                      batch end (the units cannot defer; the
 *                                                      processor logs this once at start).
 * `pawl status` shows each processor's mode (the owner writes it to the token store).
 *
 * The commit cycle, run on the segment's worker while the batch transaction is still open:
 * `requested` is the pending trigger request (deferred) or max(pending, batch end) (auto). Every
 * unit is asked on_checkpoint_advanced(requested); once every future has completed, `agreed` is
 * the highest report; every unit that reported less is asked again with `agreed`, until all
 * cover it. Then `agreed` is stored (a value at or behind the stored token is ignored: the stored
 * token never moves backwards) and the batch transaction commits. No pool thread ever blocks on
 * a future: a segment waiting for its units is parked state. In auto mode, a batch whose
 * handlers queued no statement and that answers no explicit request writes `agreed` as plain
 * mode writes its token: only when due (after read_batch of the segment's events or
 * claim_poll_ms, and at release). The units have confirmed it, so the stored token lagging it
 * only means that a crash redelivers those events; the batches skip a commit each.
 *
 * A checkpoint fails when a future completes with an error or reports a token that does not
 * cover what it was asked. Then nothing is stored, the batch transaction rolls back (undoing the
 * work of every handler in the batch, ordinary handlers included), the segment's worker aborts
 * and releases the segment, the segment is claimed again after a back-off, and the events after
 * the stored token are delivered again. Nothing is lost; the price is redelivery. Isolate a unit
 * in a processor of its own (fully deferred) to keep that coupling away from other handlers.
 *
 * Dead letters (pawl/processor.h). A unit's own failure — a future that fails, a report that
 * does not cover the request, a refused claim — is a checkpoint failure as above, never a dead
 * letter: dead letters are for events a handler cannot handle. A parked event counts as handled
 * for this protocol: the batch that parks it may store a token past it, and units are told
 * through on_event_parked so that an asynchronous unit does not wait for work it will never
 * get.
 *
 * Exactly-once projections hold only where the token moves with the batch: in plain and auto
 * mode, the handlers' statements (pawl_txn_exec) commit with the token. In fully-deferred mode a
 * batch whose units were not asked commits its statements without moving the token, so after a
 * crash or a failed checkpoint those events are delivered again and their statements run again:
 * write them idempotently there.
 *
 * There is no built-in time-out. A future that never completes stalls its segment — only its
 * segment; the others keep going — and keeps that batch's transaction open for as long as it
 * waits; a release waits for it too (so a processor's stop does). Bound a future that might hang
 * with pawl_checkpoint_or_timeout().
 *
 * Tokens are global log indexes. A unit never sees a request beyond what its segment has
 * consumed; a report above the consumed token counts as the consumed token (a unit cannot be
 * durable past what it was handed). Every unit on the segment must confirm a position before it
 * is stored: at release, a unit whose future fails (or whose report is ignored) has confirmed
 * nothing beyond the stored token, so the token does not move.
 *
 * A subscribing processor (handlers run in the appending thread) has no segments and no stored
 * token: it never calls any of these callbacks and no trigger exists there. A unit registered on
 * one simply handles events.
 *
 * Threads: the three callbacks run on the segment's worker (a pool thread, one segment step at a
 * time); the futures they return may be completed from any thread. The trigger functions may be
 * called from any thread and never block.
 *
 * Shutdown order: pawl_processor_stop() (every segment is released through the units and every
 * future has completed), then stop the threads that complete your futures (one may still be
 * returning from pawl_future_complete), then pawl_processor_free().
 */
#ifndef PAWL_CHECKPOINT_H
#define PAWL_CHECKPOINT_H

#include <stdint.h>

#include "pawl/common.h"

#ifdef __cplusplus
extern "C" {
#endif

struct pawl_segment; /* pawl/processor.h: { uint32_t id; uint32_t mask; } */
struct pawl_future;  /* pawl/runtime.h: a one-shot future carrying an int64 or an error */
struct pawl_trigger; /* opaque, below */
struct pawl_event;   /* pawl/event.h */

/* A request for the last token the segment has consumed, resolved when the request is taken. */
#define PAWL_TOKEN_LATEST INT64_MAX

/*
 * The callbacks of a checkpointing unit. `self` is the owning pawl_handler's `self`. The struct
 * is borrowed by the processor for its whole life (usually a static const).
 */
struct pawl_checkpointing {
    /*
     * Optional (NULL: nothing to do). Called synchronously while the segment is being claimed,
     * before any of its events is handled, with the segment's trigger. The trigger pointer is
     * borrowed: valid until on_segment_released for this claim has returned. A unit that keeps
     * it longer (a thread of its own calling it later) takes a reference with pawl_trigger_ref()
     * and drops it with pawl_trigger_unref(). A unit that does not keep the trigger can reach it
     * while handling an event through pawl_ctx_trigger(ctx).
     *
     * Return 0 to accept the claim. A negative PAWL_E* code fails the claim: the segment is not
     * claimed (the claim row is given back), and the coordinator tries again after its back-off.
     * Fail only when the unit genuinely cannot take the segment, not for transient conditions a
     * later trigger request would handle. The units are asked in handler order: when a later
     * unit refuses, every earlier unit that accepted is told on_segment_released(seg, stored
     * token) (or its default), and the futures those calls return are dropped without being
     * awaited — their reports cannot matter, nothing is stored — so a unit must not rely on
     * that future's completion being observed; it must still complete it (or let it go).
     */
    int (*on_segment_claimed)(void *self, struct pawl_segment seg, struct pawl_trigger *trigger);

    /*
     * Required. Called on the segment's worker when a checkpoint must cover `requested` (the
     * highest pending trigger request, or the batch end in auto mode, or — when reconciling —
     * the token another unit reached). Make your work durable at least up to `requested`, then
     * complete the returned future with the highest token now durable: it must be >= requested
     * and may be higher when more work has drained (never above what the segment has consumed;
     * a higher value is treated as the consumed token).
     *
     * Ownership: the processor takes over one reference of the returned future (create it with
     * pawl_future_new(), keep your own reference with pawl_future_ref() if you complete it from
     * another thread, and drop that one after completing it).
     *
     * Failure: complete the future with an error (pawl_future_fail) when `requested` cannot be
     * reached; a value below `requested`, or returning NULL, counts the same. The checkpoint then
     * fails: nothing is stored, the batch transaction rolls back, the segment is released and
     * claimed again after a back-off, and the events after the stored token are redelivered.
     *
     * No time-out: the processor waits as long as the future takes, holding the batch
     * transaction open and stalling this segment (only this one). Wrap a future that might hang
     * in pawl_checkpoint_or_timeout().
     *
     * Every request lies above the stored token (a cycle asks only for positions beyond it), so
     * a report at or behind the stored token does not cover the request: it fails the
     * checkpoint like any report below `requested` (rollback, release, back-off, redelivery).
     */
    struct pawl_future *(*on_checkpoint_advanced)(void *self, struct pawl_segment seg,
                                                  int64_t requested);

    /*
     * Optional (NULL: on_checkpoint_advanced(seg, up_to), which must cover up_to or fail).
     * Called when the segment is being released (shutdown, rebalancing, split or merge, abort)
     * with up_to = the last token the segment consumed. Flush what you can, drop the segment's
     * local state, and complete the future with the highest token durable now, which must lie in
     * [stored token, up_to]; a report outside that range is ignored. Reporting less than up_to
     * is normal for asynchronous work: the tail is redelivered at the next claim.
     *
     * The reports of all units are reconciled as for a checkpoint (a unit below the highest valid
     * report is asked on_checkpoint_advanced with it); if that fails, the lowest valid report is
     * stored instead. A unit whose future fails (or whose report is ignored) has confirmed
     * nothing, so the stored token does not move. So after a release the stored token is only a
     * lower bound: a unit that reported more than the lowest report (or more than was stored)
     * stays durably ahead of the stored token, and the next claim redelivers, to every unit,
     * the events between the stored token and that unit's own durable position. Units are not
     * told the stored token; a unit that keeps its own durable position must tolerate that
     * redelivery (skip events at or below what it has made durable, or apply them idempotently).
     * The token is stored while the claim is still held; then the claim is freed. A failed future
     * never stops the release, but the release does wait for every future: the no-time-out rule
     * above applies here too.
     *
     * After this call the trigger is inert.
     */
    struct pawl_future *(*on_segment_released)(void *self, struct pawl_segment seg, int64_t up_to);

    /*
     * Optional (NULL: nothing to do). Called on the segment's worker when an event of the
     * segment is parked as a dead letter (pawl/processor.h, "Dead letters"), in the batch
     * that parks it: for the checkpoint protocol a parked event counts as handled, so a unit
     * that tracks events in flight (a barrier) must stop waiting for it. ev is borrowed for
     * the call. A batch that rolls back is handled again, so a unit may hear of the same event
     * more than once; the stored token never covers a parked event before that batch commits.
     */
    void (*on_event_parked)(void *self, struct pawl_segment seg, const struct pawl_event *ev);
};

/*
 * Ask for a checkpoint of the trigger's segment at `token` (>= 0; PAWL_TOKEN_LATEST asks for the
 * last consumed token). Any thread; never blocks; requests merge to the highest one pending. An
 * idle segment wakes up and runs a commit cycle on its own; a busy one runs it after its current
 * batch. A request beyond what the segment has consumed waits until the segment gets there.
 * In auto mode every batch asks the units anyway; a request makes the agreed token be stored at
 * once (not only when due) and can make it reach further.
 *
 * Returns 0, PAWL_ERANGE for a negative token, or PAWL_ESHUTDOWN when the trigger is inert (its
 * segment was released or its worker aborted): the request is ignored. A new claim of the same
 * segment comes with a new trigger.
 */
PAWL_API int pawl_trigger_request(struct pawl_trigger *t, int64_t token);
PAWL_API int pawl_trigger_request_latest(struct pawl_trigger *t);

/* 1 while the trigger's segment is still claimed by the worker that handed it out, 0 after. */
PAWL_API int pawl_trigger_is_live(const struct pawl_trigger *t);

/*
 * Reference counting for units that keep the trigger past on_segment_released (a thread of their
 * own that may still call it): ref returns t; unref drops one reference and frees the trigger
 * with the last one. Both accept NULL and may be called from any thread.
 */
PAWL_API struct pawl_trigger *pawl_trigger_ref(struct pawl_trigger *t);
PAWL_API void pawl_trigger_unref(struct pawl_trigger *t);

/*
 * Bound a unit's future with a time-out of `ms` milliseconds on the processor's timers (io_uring,
 * or the timerfd fallback). Returns a new future that completes like `f` or, if `f` has not
 * completed within `ms`, fails with PAWL_ETIMEDOUT — which fails the checkpoint (rollback,
 * release, redelivery) instead of stalling the segment forever. Takes over the caller's
 * reference of `f` and returns one reference of the result, so it wraps the return value:
 *
 *     return pawl_checkpoint_or_timeout(flush_to_store(requested), 30000);
 *
 * Call it inside on_checkpoint_advanced / on_segment_released / on_segment_claimed (the timers
 * are the calling processor's, found through the calling thread). Anywhere else, or when no timer
 * can be armed, the result is a future that has already failed (PAWL_EINVAL / PAWL_ENOMEM)
 * rather than an unbounded one. f == NULL gives NULL (which fails the checkpoint).
 *
 * The unit should still complete or fail `f` itself eventually: a future that is never completed
 * keeps what waits on it (the time-out's continuation) allocated.
 */
PAWL_API struct pawl_future *pawl_checkpoint_or_timeout(struct pawl_future *f, int64_t ms);

/* How a processor checkpoints; see the top of this file. */
enum pawl_ckpt_mode {
    PAWL_CKPT_PLAIN = 0,
    PAWL_CKPT_AUTO = 1,
    PAWL_CKPT_DEFERRED = 2,
};

/* "plain", "auto", "deferred" ("?" for anything else). Static string. */
PAWL_API const char *pawl_ckpt_mode_name(enum pawl_ckpt_mode mode);

#ifdef __cplusplus
}
#endif
#endif
