/*
 * reconcile.h — the checkpoint protocol's reconciliation of several checkpointing units to one
 * token, as a non-blocking state machine driven by futures.
 *
 * A segment's worker embeds one struct pawl_reconcile (caller storage, pawl__reconcile_init once
 * per claim) and runs at most one cycle at a time on it:
 *
 *   checkpoint  ask every unit on_checkpoint_advanced(requested); when every future has
 *               completed, agreed = the highest report; ask every unit below agreed again with
 *               agreed; repeat until all cover it. A failed future, a NULL future, or a report
 *               below what was asked fails the cycle (PAWL_ECHECKPOINT, the text names the
 *               unit). A report above `limit` (the last consumed token) counts as `limit`.
 *               The result is the token to store: agreed if it is ahead of `stored`, otherwise
 *               PAWL_RECONCILE_NOTHING (the stored token never moves backwards).
 *   release     ask every unit on_segment_released(up_to) (default on_checkpoint_advanced, which
 *               must cover up_to). Valid reports lie in [stored, up_to]; a failed future or an
 *               ignored report means that unit confirmed nothing, so nothing is stored. Otherwise
 *               reconcile as above towards the highest valid report; if that fails, fall back to
 *               the lowest confirmed position. A release always yields a result (rc is only
 *               informational there): the caller stores it, if any, and frees the claim.
 *
 * Each start returns 0 when the cycle finished at once (every future was already complete: the
 * common fast path; nothing is scheduled, nothing allocated), PAWL_ECHECKPOINT when a checkpoint
 * failed at once, or PAWL_EAGAIN when it waits for futures. Then `wake(arg)` (given to init) is
 * called exactly once, from whatever thread completes the last awaited future's continuation, and
 * possibly before the start call has even returned: it must only schedule the segment's next
 * step (never run it inline). That step calls pawl__reconcile_resume(), which returns the same
 * three results (a new round may wait again, and wake again). The reconciler itself therefore
 * needs no particular executor: the continuations are tiny tasks on `pool` (or `serial`) that
 * count down and wake.
 *
 * No thread ever blocks. There is no time-out; a future that never completes keeps the cycle
 * waiting (only this segment's) and the cycle cannot be abandoned: the reconciler must stay
 * allocated until wake has been called.
 *
 * Threads: start/resume/fini on the segment's worker, one step at a time (a wake that arrives
 * during the start call must make the worker resume only after that call has returned). The
 * units' futures may be completed from any thread.
 *
 * How a work package drives it (mode from pawl__ckpt_mode_detect at processor creation):
 *   claim    t = pawl__trigger_new(wake, pkg) (wake submits the package's step to its serial);
 *            pawl__reconcile_init(&r, units, n, ...); rc = pawl__reconcile_claimed(&r, seg, t,
 *            stored): on error invalidate/free t, give the claim row back, back off.
 *   batch    handle the events (pawl_ctx_trigger returns t); then
 *              PLAIN     store(batch end), commit;
 *              AUTO      req = batch end; if pawl__trigger_take(t, consumed, &p) req = max(req, p);
 *              DEFERRED  if !pawl__trigger_take(t, consumed, &req): commit without a store;
 *            rc = pawl__reconcile_checkpoint(&r, seg, req, stored, consumed, &to_store);
 *            EAGAIN: park with the transaction open (the step ends; wake schedules a step that
 *            calls pawl__reconcile_resume, and so on); 0: if to_store != NOTHING
 *            store(to_store); commit; ECHECKPOINT: roll back, abort (release, back-off).
 *            AUTO without an explicit request, for a batch that wrote nothing: to_store is
 *            stored only when due (as plain mode's token), else the transaction is rolled back.
 *   idle     the wake step: if pawl__trigger_take(...) open a transaction and run the cycle as
 *            above with no events (deferred mode's request while idle).
 *   release  pawl__trigger_invalidate(t) first (no more requests); rc =
 *            pawl__reconcile_release(&r, seg, up_to, stored, &to_store) (wait on EAGAIN); store
 *            to_store if any, in a transaction, while the claim is held; free the claim; fini.
 *            After an abort, up_to is the last consumed position whose batch committed (the
 *            rolled-back batch must be redelivered to ordinary handlers).
 *   extend   claim extension never writes the token: in deferred mode only a reconciled
 *            checkpoint may move it.
 */
#ifndef PAWL_ENGINE_RECONCILE_H
#define PAWL_ENGINE_RECONCILE_H

#include "pawl/checkpoint.h"
#include "pawl/processor.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pawl/runtime.h"

/* "Nothing to store": the agreed token is not ahead of the stored one, or a release failed. */
#define PAWL_RECONCILE_NOTHING ((int64_t)-1)

/* One checkpointing unit on the segment; all pointers borrowed for the reconciler's life. */
struct pawl_ckpt_unit {
    const char *name; /* for error text and logs */
    void *self;       /* the handler's self */
    const struct pawl_checkpointing *ckpt;
};

/* Called when every future the cycle waits for has completed: schedule pawl__reconcile_resume. */
typedef void (*pawl_reconcile_wake_fn)(void *arg);

struct pawl_reconcile_slot; /* private */

/* Caller storage; fields are private. */
struct pawl_reconcile {
    const struct pawl_ckpt_unit *_units;
    size_t _n;
    struct pawl_reconcile_slot *_slots;
    struct pawl_serial *_serial;
    struct pawl_pool *_pool;
    struct pawl_timers *_timers;
    pawl_reconcile_wake_fn _wake;
    void *_wake_arg;
    _Atomic size_t _waiting; /* continuations not yet run, plus one while a round is asked */
    struct pawl_segment _seg;
    int _kind;
    int _round;
    bool _busy;
    int _rc;
    int64_t _stored;
    int64_t _limit;
    int64_t _agreed;
    int64_t _result;
    char _err[256];
};

/*
 * Prepare r for the units (borrowed, n >= 0). Continuations run on serial when it is not NULL,
 * else as tasks on pool (see pawl_future_on_complete). timers (may be NULL) serve
 * pawl_checkpoint_or_timeout() called from inside the units' callbacks. Returns 0 or PAWL_ENOMEM
 * / PAWL_EINVAL (a unit without on_checkpoint_advanced).
 */
int pawl__reconcile_init(struct pawl_reconcile *r, const struct pawl_ckpt_unit *units, size_t n,
                         struct pawl_serial *serial, struct pawl_pool *pool,
                         struct pawl_timers *timers, pawl_reconcile_wake_fn wake, void *arg);
void pawl__reconcile_fini(struct pawl_reconcile *r);

/*
 * Call every unit's on_segment_claimed(seg, trigger), in order, synchronously. If one fails, the
 * units that had accepted are told the claim is off (on_segment_released(seg, stored), their
 * futures dropped unawaited) and the unit's code is returned, with text naming it in
 * pawl__reconcile_error(r): the caller gives the claim back and retries after its back-off.
 */
int pawl__reconcile_claimed(struct pawl_reconcile *r, struct pawl_segment seg,
                            struct pawl_trigger *trigger, int64_t stored);
void pawl__reconcile_fini(struct pawl_reconcile *r);

/*
 * A checkpoint cycle for seg: requested (> stored to do anything; <= limit), stored = the stored
 * token, limit = the last consumed token. On 0, *to_store holds the result. PAWL_EBUSY if a cycle
 * is still waiting.
 */
int pawl__reconcile_checkpoint(struct pawl_reconcile *r, struct pawl_segment seg, int64_t requested,
                               int64_t stored, int64_t limit, int64_t *to_store);

/*
 * A release cycle for seg with up_to = the last consumed token. Returns 0, PAWL_EAGAIN, or
 * PAWL_ECHECKPOINT (informational: some unit confirmed less; the release goes on). On any result
 * but EAGAIN, *to_store is what to store before freeing the claim (or NOTHING).
 */
int pawl__reconcile_release(struct pawl_reconcile *r, struct pawl_segment seg, int64_t up_to,
                            int64_t stored, int64_t *to_store);

/* After wake: go on with the cycle. Same returns as the start that began it. */
int pawl__reconcile_resume(struct pawl_reconcile *r, int64_t *to_store);

/* The text of the last failure (names the unit); "" when none. Borrowed until the next start. */
const char *pawl__reconcile_error(const struct pawl_reconcile *r);

/* True while a cycle is under way (started, not yet finished). */
bool pawl__reconcile_busy(const struct pawl_reconcile *r);

/*
 * The processor's checkpoint mode from its handlers: PAWL_CKPT_PLAIN (no checkpointing unit),
 * PAWL_CKPT_DEFERRED (every handler is one) or PAWL_CKPT_AUTO (a mix; logs one INFO line naming
 * `processor`: the units cannot defer). PAWL_EINVAL when a unit lacks on_checkpoint_advanced.
 */
int pawl__ckpt_mode_detect(const char *processor, const struct pawl_handler *handlers, size_t n,
                           enum pawl_ckpt_mode *out);

/* The timers pawl_checkpoint_or_timeout() uses on this thread (set around unit callbacks). */
extern _Thread_local struct pawl_timers *pawl__ckpt_timers_tls;

#endif
