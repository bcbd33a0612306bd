/*
 * package.c — work packages: the worker of one claimed segment, the scheduling of their steps
 * on the processor's work-stealing pool, and the event context handlers see.
 *
 * A step is one unit of a package's work: the first step of a claim calls the checkpointing
 * units' on_segment_claimed; then each step handles one batch in one transaction, or advances
 * an idle segment's token, or releases the segment. A package is queued at most once at a time
 * (k->scheduled, under k->mu) and re-queues itself at the back after each step, so a segment's
 * steps never overlap, its events stay in index order, and every segment with work gets its
 * turn. In a checkpoint mode a batch's commit cycle may wait for the units' futures: the step
 * then parks the package with its batch transaction open (phase PH_CKPT) and ends; the
 * reconciler's wake queues the next step, which resumes the cycle. No worker thread ever waits
 * on a future.
 *
 * Threads: steps run on the workers of the processor's pool; pawl__pkg_schedule and the wakes may
 * be called from any thread. The coordinator (coordinator.c) creates packages, feeds their inboxes
 * under k->mu and frees them once they are on the done list.
 */
#include "processor_int.h"

#include "dead_letters.h"

#include "metrics.h"
#include "mpsc.h"
#include "pool.h"
#include "segment.h"
#include "trigger.h"

#include "pawl/checkpoint.h"

#include <stdio.h>
#include <string.h>

#define MOD "processor"

/* ---------------------------------------------------------------------------------------------
 * Event context and the handlers' transaction
 * ------------------------------------------------------------------------------------------ */

const struct pawl_event *pawl_ctx_event(const struct pawl_event_ctx *ctx)
{
    return ctx->ev;
}

struct pawl_segment pawl_ctx_segment(const struct pawl_event_ctx *ctx)
{
    return ctx->seg;
}

int pawl_ctx_is_replay(const struct pawl_event_ctx *ctx)
{
    return ctx->replay;
}

struct pawl_txn *pawl_ctx_txn(struct pawl_event_ctx *ctx)
{
    return ctx->txn;
}

struct pawl_trigger *pawl_ctx_trigger(struct pawl_event_ctx *ctx)
{
    return ctx->trigger;
}

size_t pawl_ctx_batch_pos(const struct pawl_event_ctx *ctx)
{
    return ctx->pos;
}

int pawl_ctx_error(struct pawl_event_ctx *ctx, int code, const char *why)
{
    if (ctx && ctx->errbuf && ctx->errlen > 0)
        snprintf(ctx->errbuf, ctx->errlen, "%s", why ? why : "");
    return code < 0 ? code : PAWL_EHANDLER;
}

int pawl_ctx_is_dead_letter(const struct pawl_event_ctx *ctx)
{
    return ctx->dead_letter;
}

int pawl_txn_exec(struct pawl_txn *txn, const char *sql, int nparams, const char *const *values)
{
    if (txn == NULL)
        return PAWL_ENOTSUP;
    if (sql == NULL || nparams < 0 || (nparams > 0 && values == NULL))
        return PAWL_EINVAL;
    return txn->ops->exec(txn, sql, nparams, values);
}

/* ---------------------------------------------------------------------------------------------
 * Scheduling: each package step is a task of the processor's work-stealing pool (seg_pool),
 * always submitted through the pool's injection queue, so that a package re-queued after its
 * batch goes behind the packages already waiting (see processor_int.h).
 * ------------------------------------------------------------------------------------------ */

static void pkg_step(struct pkg *k);

static void step_task(struct pawl_task *t, int status)
{
    struct pkg *k = PAWL_CONTAINER_OF(t, struct pkg, step);
    if (status != 0) {
        /* The pool only cancels what is still queued when it is freed, and the processor frees
         * it after every package has finished; should it happen, the step is simply not run. */
        pthread_mutex_lock(&k->mu);
        k->scheduled = 0;
        pthread_mutex_unlock(&k->mu);
        return;
    }
    pkg_step(k);
}

static void enqueue(struct pawl_processor *p, struct pkg *k)
{
    pawl__pool_yield(p->seg_pool, &k->step);
}

/* Mark k queued unless a step is already queued or running; 1 if the caller must queue it. */
static int claim_schedule(struct pkg *k)
{
    pthread_mutex_lock(&k->mu);
    int go = !k->scheduled && k->state == PKG_RUN;
    if (go)
        k->scheduled = 1;
    pthread_mutex_unlock(&k->mu);
    return go;
}

/* Queue k unless a step is already queued or running. */
void pawl__pkg_schedule(struct pkg *k)
{
    if (claim_schedule(k))
        enqueue(k->p, k);
}

/* pawl__pkg_schedule for every package of the list from first on (kicked_only: only those the
 * coordinator marked `kicked`; the marks are cleared), with one submission per 64 packages: the
 * coordinator dispatches a read to many packages at once, and one submission is one wake-up (the
 * woken worker passes it on if there is more), where one per package could wake a worker for
 * each. Called from outside the pool, so the steps go through the pool's injection ring (a batch)
 * while enqueue()'s single steps take its FIFO list; the consumer serves the list first on every
 * fourth take, so neither waits behind the other for long. */
void pawl__pkg_schedule_list(struct pawl_processor *p, struct pkg *first, int kicked_only)
{
    PAWL_ASSERT_COORD(p);
    struct pawl_task *batch[64];
    size_t n = 0;
    for (struct pkg *k = first; k; k = k->next) {
        int kicked = k->kicked;
        k->kicked = 0;
        if ((kicked_only && !kicked) || !claim_schedule(k))
            continue;
        batch[n++] = &k->step;
        if (n == sizeof batch / sizeof batch[0]) {
            pawl_pool_submit_batch(p->seg_pool, batch, n);
            n = 0;
        }
    }
    if (n > 0)
        pawl_pool_submit_batch(p->seg_pool, batch, n);
}

/* ---------------------------------------------------------------------------------------------
 * Work packages
 * ------------------------------------------------------------------------------------------ */

struct pkg *pawl__pkg_new(struct pawl_processor *p, const struct pawl_segment_status *row)
{
    struct pkg *k = pawl_calloc(1, sizeof *k);
    if (k == NULL)
        return NULL;
    k->p = p;
    k->seg = row->seg;
    k->token = row->token;
    k->consumed = row->token;
    k->high_water = row->high_water;
    k->has_merge = row->has_merge;
    k->merge_seg = row->merge_seg;
    k->merge_token = row->merge_token;
    k->queued_pos = row->token;
    k->work_end = row->token;
    k->last_store_ns = pawl_now_ns();
    atomic_store_explicit(&k->doing_since_ns, k->last_store_ns, memory_order_relaxed);
    k->step.fn = step_task; /* the one task of the package, queued at most once (scheduled) */
    pawl_event_batch_init(&k->work);
    pawl_event_batch_init(&k->readbuf);
    pawl_event_batch_init(&k->inbox);
    pthread_mutex_init(&k->mu, NULL);
    return k;
}

void pawl__pkg_free(struct pkg *k)
{
    PAWL_ASSERT(k->rtxn == NULL); /* a retry ends before its package can finish */
    pawl_dead_letters_free(k->rrows);
    pawl__dl_clear(k);
    pawl_free(k->parked);
    pawl_event_batch_fini(&k->work);
    pawl_event_batch_fini(&k->readbuf);
    pawl_event_batch_fini(&k->inbox);
    pthread_mutex_destroy(&k->mu);
    pawl_free(k);
}

/* Record what k's step is doing now (enum pawl_segment_doing), for pawl_processor_activity.
 * Relaxed: a report; the time moves only when the activity changes. */
static void set_doing(struct pkg *k, int doing)
{
    if (atomic_load_explicit(&k->doing, memory_order_relaxed) == doing)
        return;
    atomic_store_explicit(&k->doing_since_ns, pawl_now_ns(), memory_order_relaxed);
    atomic_store_explicit(&k->doing, doing, memory_order_relaxed);
}

/* A call on the token store failed with rc: keep the store's text of it for the message that
 * reports the failure (the store's errmsg is the last failure of any thread). Returns rc. */
static int store_failed(struct pkg *k, int rc)
{
    if (rc != 0 && rc != PAWL_EAGAIN) {
        const char *msg = k->p->tok->ops->errmsg(k->p->tok);
        snprintf(k->storeerr, sizeof k->storeerr, "%s", msg ? msg : "");
    }
    return rc;
}

/* The trigger's wake (a request arrived): schedule a step (never run it here). */
static void pkg_trigger_wake(void *arg)
{
    pawl__pkg_schedule(arg);
}

/* The reconciler's wake (every awaited future completed): resume at the next step. */
static void pkg_wake(void *arg)
{
    struct pkg *k = arg;
    pthread_mutex_lock(&k->mu);
    k->woken = 1;
    int go = !k->scheduled && k->state == PKG_RUN;
    if (go)
        k->scheduled = 1;
    pthread_mutex_unlock(&k->mu);
    if (go)
        enqueue(k->p, k);
}

/* Hand the package to the coordinator as finished (rc 0: orderly release). */
static void pkg_finish(struct pkg *k, int rc)
{
    struct pawl_processor *p = k->p;
    if (k->trigger) {
        /* Inert first: after this no wake can reach k. */
        pawl__trigger_invalidate(k->trigger);
        pawl__trigger_free(k->trigger);
        k->trigger = NULL;
    }
    if (k->rec_ready) {
        pawl__reconcile_fini(&k->rec);
        k->rec_ready = 0;
    }
    set_doing(k, PAWL_SEG_STORE);
    int rrc = store_failed(k, p->tok->ops->release(p->tok, p->name, k->seg.id, p->node));
    if (rrc) {
        atomic_fetch_add_explicit(&p->st_release_failed, 1, memory_order_relaxed);
        PAWL_WARN(MOD,
                  "%s: segment %u: releasing the claim failed (%s%s%s); it stays claimed until "
                  "it expires (claim_timeout_ms = %u)",
                  p->name, k->seg.id, pawl_strerror(rrc), k->storeerr[0] ? ": " : "", k->storeerr,
                  p->o.claim_timeout_ms);
        k->storeerr[0] = '\0';
    }
    pthread_mutex_lock(&k->mu);
    PAWL_ASSERT(k->state == PKG_RUN && k->scheduled); /* finished once, by its own step */
    k->state = PKG_DONE;
    k->scheduled = 0;
    pawl_event_batch_clear(&k->inbox);
    pthread_mutex_unlock(&k->mu);
    pthread_mutex_lock(&p->mu);
    k->failed = rc != 0;
    k->fail_rc = rc;
    /* Membership of p->pkgs is the coordinator's; it unlinks k when it reaps the done list. */
    k->run_next = p->done;
    p->done = k;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* First step of a claim: the units accept the segment (or the claim fails). */
static int pkg_claimed(struct pkg *k)
{
    struct pawl_processor *p = k->p;
    k->trigger = pawl__trigger_new(pkg_trigger_wake, k);
    if (k->trigger == NULL)
        return PAWL_ENOMEM;
    int rc =
        pawl__reconcile_init(&k->rec, p->units, p->nunits, NULL, p->pool, p->timers, pkg_wake, k);
    if (rc)
        return rc;
    rc = pawl__reconcile_claimed(&k->rec, k->seg, k->trigger, k->token);
    if (rc) {
        PAWL_WARN(MOD, "%s: segment %u: claim refused: %s", p->name, k->seg.id,
                  pawl__reconcile_error(&k->rec));
        pawl__reconcile_fini(&k->rec);
        return rc;
    }
    k->rec_ready = 1;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * A unit's blame, and the dead-letter steps: loading the segment's parked streams, retrying a
 * stream, a named event's attempt. The tables they consult are in dead_letters.c.
 * ------------------------------------------------------------------------------------------ */

/* Take the units' blame (under k->mu): the event index (0: none), its code and why. */
static int64_t blame_take(struct pkg *k, int *code, char *why, size_t whylen)
{
    pthread_mutex_lock(&k->mu);
    int64_t index = k->blame_index;
    *code = k->blame_code;
    copy_str(why, whylen, k->blame_why);
    k->blame_index = 0;
    k->blame_why[0] = '\0';
    pthread_mutex_unlock(&k->mu);
    return index;
}

/* A checkpoint cycle starts: a blame left from an earlier one cannot be about it. */
static void blame_clear(struct pkg *k)
{
    int code;
    char why[1];
    (void)blame_take(k, &code, why, sizeof why);
}

int pawl_processor_event_failed(struct pawl_processor *p, struct pawl_segment seg, int64_t index,
                                int code, const char *why)
{
    if (p == NULL || index < 1)
        return PAWL_EINVAL;
    int rc = PAWL_ENOTFOUND;
    pthread_mutex_lock(&p->mu);
    for (struct pkg *k = p->pkgs; k; k = k->next) {
        if (k->seg.id != seg.id || k->seg.mask != seg.mask)
            continue;
        pthread_mutex_lock(&k->mu);
        if (k->state == PKG_RUN) {
            k->blame_index = index;
            k->blame_code = code < 0 ? code : PAWL_EHANDLER;
            copy_str(k->blame_why, sizeof k->blame_why, why ? why : "");
            rc = 0;
        }
        pthread_mutex_unlock(&k->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/*
 * The units failed the checkpoint of the batch of n events at work_pos (rolled back already).
 * When a unit named one of them (pawl_processor_event_failed), the events before it are handled:
 * with a policy, count the event's attempt, and past the policy handle the batch again at once
 * with the event parked; otherwise handle the batch again up to just before the event (dl_cut)
 * and then fail the segment with a back-off. Both return PKG_RERUN. Without a named event of the
 * batch, PAWL_ECHECKPOINT: the ordinary failure.
 */
static int dl_blamed(struct pkg *k, size_t n)
{
    struct pawl_processor *p = k->p;
    int code;
    char why[sizeof k->blame_why];
    int64_t index = blame_take(k, &code, why, sizeof why);
    if (index == 0)
        return PAWL_ECHECKPOINT;
    const struct pawl_event *e = NULL;
    for (size_t i = 0; i < n && k->work_pos + i < k->work.n; i++)
        if (k->work.events[k->work_pos + i].index == index)
            e = &k->work.events[k->work_pos + i];
    if (e == NULL) {
        PAWL_WARN(MOD, "%s: segment %u: a unit named event %lld, which is not in the batch",
                  p->name, k->seg.id, (long long)index);
        return PAWL_ECHECKPOINT;
    }
    pawl__dl_batch_rolled_back(k);
    char sid[PAWL_PRINTABLE_SIZE(PAWL_STREAM_ID_MAX)], shown[1024];
    PAWL_WARN(MOD, "%s: segment %u: event %lld (%s) failed: %s%s%s", p->name, k->seg.id,
              (long long)index, pawl_printable_str(e->stream_id, sid, sizeof sid),
              pawl_strerror(code), why[0] ? ": " : "",
              pawl_printable_str(why, shown, sizeof shown));
    copy_str(k->lasterr, sizeof k->lasterr, why[0] ? why : pawl_strerror(code));
    if (p->o.dead_letter_attempts && pawl__dl_failed(k, e, code) == PKG_RERUN)
        return PKG_RERUN;
    k->dl_cut = index;
    k->dl_cut_rc = code;
    return PKG_RERUN;
}

static int run_handlers(struct pkg *k, struct pawl_txn *txn, const struct pawl_event *e, size_t pos,
                        int dead_letter);
static int dl_retry_end(struct pkg *k, int rc);

/*
 * Retry stream's letters: hand them to the handlers in one transaction with the un-park. With
 * checkpointing units, the units must first confirm what they were handed (a handler that passes
 * the letters on, such as exec, has them durable only then): a checkpoint cycle at the consumed
 * position, with the transaction open (PAWL_EAGAIN: PH_RETRY, resumed by pkg_resume). 0 (done,
 * or the retry failed and was recorded: the stream stays parked), PAWL_EAGAIN, or a store error.
 */
static int dl_retry_stream(struct pkg *k, const char *stream)
{
    struct pawl_processor *p = k->p;
    struct pawl_tokens *t = p->tok;
    struct pawl_dead_letter *rows = NULL;
    size_t n = 0;
    set_doing(k, PAWL_SEG_STORE);
    int rc = t->ops->dl_show(t, p->name, stream, &rows, &n);
    char sid[PAWL_PRINTABLE_SIZE(PAWL_STREAM_ID_MAX)];
    pawl_printable_str(stream, sid, sizeof sid);
    if (rc) {
        PAWL_WARN(MOD, "%s: segment %u: reading the letters of %s failed: %s", p->name, k->seg.id,
                  sid, t->ops->errmsg(t));
        return rc;
    }
    if (n == 0) {
        pawl_dead_letters_free(rows);
        return 0;
    }
    struct pawl_txn *txn;
    rc = store_failed(k, t->ops->begin(t, p->name, k->seg.id, p->node, &txn));
    if (rc) {
        pawl_dead_letters_free(rows);
        return rc;
    }
    set_doing(k, PAWL_SEG_HANDLING);
    size_t i = 0;
    for (; i < n; i++) {
        rc = run_handlers(k, txn, &rows[i].ev, i, 1);
        if (rc)
            break;
    }
    if (rc) {
        txn->ops->rollback(txn);
        PAWL_WARN(MOD, "%s: segment %u: retry of stream %s failed at event %lld; it stays parked",
                  p->name, k->seg.id, sid, (long long)rows[i].ev.index);
        set_doing(k, PAWL_SEG_STORE);
        rc = store_failed(k, t->ops->dl_retry_failed(t, p->name, k->seg.id, p->node, stream,
                                                     rows[i].ev.index, k->lasterr));
        pawl_dead_letters_free(rows);
        return rc;
    }
    k->rtxn = txn;
    k->rrows = rows;
    k->rn = n;
    if (!k->rec_ready)
        return dl_retry_end(k, 0);
    /* A cycle at the consumed position (its "stored" one below, so that the units are asked even
     * when the token is there already): the units cover everything handed to them, the letters
     * included. Its result is not stored: a retry leaves the token alone. */
    blame_clear(k);
    int64_t ignored = PAWL_RECONCILE_NOTHING;
    rc = pawl__reconcile_checkpoint(&k->rec, k->seg, k->consumed, k->consumed - 1, k->consumed,
                                    &ignored);
    if (rc == PAWL_EAGAIN) {
        PAWL_ASSERT(k->phase == PH_NONE); /* PH_NONE -> PH_RETRY */
        k->phase = PH_RETRY;
        set_doing(k, PAWL_SEG_UNITS);
        return PAWL_EAGAIN;
    }
    return dl_retry_end(k, rc);
}

/* The end of a retry whose letters the handlers took (rc: what the units said, 0 or a failed
 * checkpoint): commit the un-park, or record the failed attempt. 0 or a store error. */
static int dl_retry_end(struct pkg *k, int rc)
{
    struct pawl_processor *p = k->p;
    struct pawl_tokens *t = p->tok;
    struct pawl_txn *txn = k->rtxn;
    struct pawl_dead_letter *rows = k->rrows;
    size_t n = k->rn;
    k->rtxn = NULL;
    k->rrows = NULL;
    k->rn = 0;
    const char *stream = rows[0].ev.stream_id;
    char sid[PAWL_PRINTABLE_SIZE(PAWL_STREAM_ID_MAX)];
    pawl_printable_str(stream, sid, sizeof sid);
    if (rc) {
        /* The letter a unit named, else the first: the letters before it may be handled, but
         * nothing commits, so all of them come again with the next retry. */
        int code;
        char why[sizeof k->blame_why];
        int64_t index = blame_take(k, &code, why, sizeof why);
        size_t at = 0;
        for (size_t i = 0; i < n; i++)
            if (rows[i].ev.index == index)
                at = i;
        if (index != 0 && rows[at].ev.index == index)
            copy_str(k->lasterr, sizeof k->lasterr, why[0] ? why : pawl_strerror(code));
        else
            copy_str(k->lasterr, sizeof k->lasterr, pawl__reconcile_error(&k->rec));
        txn->ops->rollback(txn);
        char shown[1024];
        PAWL_WARN(MOD,
                  "%s: segment %u: retry of stream %s failed at event %lld (%s); it stays parked",
                  p->name, k->seg.id, sid, (long long)rows[at].ev.index,
                  pawl_printable_str(k->lasterr, shown, sizeof shown));
        set_doing(k, PAWL_SEG_STORE);
        rc = store_failed(k, t->ops->dl_retry_failed(t, p->name, k->seg.id, p->node, stream,
                                                     rows[at].ev.index, k->lasterr));
        pawl_dead_letters_free(rows);
        return rc;
    }
    rc = txn->ops->unpark(txn, stream, rows[n - 1].ev.index);
    if (rc) {
        txn->ops->rollback(txn);
        pawl_dead_letters_free(rows);
        return rc;
    }
    set_doing(k, PAWL_SEG_STORE);
    rc = store_failed(k, txn->ops->commit(txn));
    if (rc == 0) {
        pawl__dl_unparked(k, stream, n);
        PAWL_INFO(MOD, "%s: segment %u: stream %s retried: %zu letter%s handled, it flows again",
                  p->name, k->seg.id, sid, n, n == 1 ? "" : "s");
    }
    pawl_dead_letters_free(rows);
    /* Read the parked streams again at the next step: more retries may be waiting. */
    k->dl_checked_ns = 0;
    return rc;
}

/* Load the segment's parked streams (first step; then every claim_poll_ms while any) and serve
 * retry requests. 0, PAWL_EAGAIN (a retry waits for the units: PH_RETRY; the others are served
 * at a later step), or a store error. */
static int dl_service(struct pkg *k)
{
    struct pawl_processor *p = k->p;
    int64_t now = pawl_now_ns();
    if (k->dl_loaded &&
        (k->nparked == 0 || now - k->dl_checked_ns < (int64_t)p->o.claim_poll_ms * 1000000))
        return 0;
    struct pawl_tokens *t = p->tok;
    struct pawl_dead_stream *rows = NULL;
    size_t n = 0;
    set_doing(k, PAWL_SEG_STORE);
    int rc = t->ops->dl_segment(t, p->name, k->seg, &rows, &n);
    if (rc) {
        PAWL_WARN(MOD, "%s: segment %u: reading its parked streams failed: %s", p->name, k->seg.id,
                  t->ops->errmsg(t));
        return rc;
    }
    rc = pawl__dl_load(k, rows, n);
    k->dl_loaded = rc == 0;
    k->dl_checked_ns = now;
    for (size_t i = 0; i < n && rc == 0; i++)
        if (rows[i].retry_requested)
            rc = dl_retry_stream(k, rows[i].stream_id);
    pawl_dead_letters_free(rows);
    if (rc != 0 && rc != PAWL_EAGAIN)
        k->dl_loaded = 0;
    return rc;
}

/* A batch (n events of work, handled of them delivered) committed at end, storing stored. */
static void batch_done(struct pkg *k, int64_t end, int64_t stored, size_t n, size_t handled)
{
    struct pawl_processor *p = k->p;
    if (stored > k->token) {
        k->token = stored;
        if (k->has_merge && k->token >= k->merge_token)
            k->has_merge = 0;
        k->last_store_ns = pawl_now_ns();
        k->unstored = 0;
        pawl_metric_inc(PAWL_M_CHECKPOINTS);
    } else {
        k->unstored += n;
    }
    k->work_pos += n;
    if (end > k->consumed)
        k->consumed = end;
    if (p->o.dead_letter_attempts)
        pawl__dl_batch_committed(k, end);
    if (n > 0) {
        k->had_success = 1;
        atomic_fetch_add_explicit(&p->st_events, handled, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->st_batches, 1, memory_order_relaxed);
        pawl_metric_inc(PAWL_M_BATCHES);
        pawl_metric_hist_record(PAWL_H_BATCH_TIME, pawl_now_ns() - k->batch_start_ns);
    }
}

/* Whether a token that is all a transaction would commit should be written now, after a batch
 * of n events (0: none, an idle step) that wrote nothing else: once read_batch of this
 * segment's events have passed since the last write, or claim_poll_ms (and on release). Events,
 * not index distance: with S segments the index moves about S times faster than one segment's
 * events, and counting it made every segment write (a synchronous commit on a worker) S times as
 * often as documented. */
static int token_due(const struct pkg *k, size_t n)
{
    const struct pawl_processor *p = k->p;
    return k->unstored + n >= p->o.read_batch ||
           pawl_now_ns() - k->last_store_ns >= (int64_t)p->o.claim_poll_ms * 1000000;
}

/* The end of a checkpoint cycle: store what the units agreed on (if anything) and commit. With
 * lazy (a batch that wrote nothing, and in auto mode no explicit request either), a position
 * that is not yet due is left unstored: the transaction would commit the token alone, a round
 * trip and a WAL flush per batch, for a position that only bounds redelivery (the handlers
 * queued nothing; the units confirmed it). A crash in between redelivers at most that much;
 * the next due cycle (a batch, an idle cycle after claim_poll_ms, the release) stores it. */
static int ckpt_commit(struct pkg *k, struct pawl_txn *txn, int64_t to_store, int64_t end, size_t n,
                       size_t handled, int lazy)
{
    int rc = 0;
    if (lazy && to_store != PAWL_RECONCILE_NOTHING && to_store > k->token && !token_due(k, n)) {
        txn->ops->rollback(txn);
        batch_done(k, end, k->token, n, handled);
        return 0;
    }
    if (to_store != PAWL_RECONCILE_NOTHING && to_store > k->token)
        rc = store_failed(k, txn->ops->store(txn, to_store));
    if (rc) {
        txn->ops->rollback(txn);
        return rc;
    }
    set_doing(k, PAWL_SEG_STORE);
    rc = store_failed(k, txn->ops->commit(txn));
    if (rc == 0)
        batch_done(k, end, to_store == PAWL_RECONCILE_NOTHING ? k->token : to_store, n, handled);
    return rc;
}

/*
 * The commit cycle, batch transaction open, for a batch of n events (handled delivered) that
 * ends at end. Plain mode stores end. Auto mode asks the units to cover max(end, pending
 * request); deferred mode asks only when a request is pending (else commits without moving
 * the token). Returns 0 (committed), PAWL_EAGAIN (parked: the cycle waits for futures, the
 * transaction stays open), or an error (rolled back).
 */
static int commit_cycle(struct pkg *k, struct pawl_txn *txn, int64_t end, size_t n, size_t handled,
                        size_t stmts)
{
    struct pawl_processor *p = k->p;
    if (p->mode == PAWL_CKPT_PLAIN)
        return ckpt_commit(k, txn, end > k->token ? end : PAWL_RECONCILE_NOTHING, end, n, handled,
                           stmts == 0);
    int64_t req = PAWL_RECONCILE_NOTHING, pending;
    int asked = pawl__trigger_take(k->trigger, end, &pending);
    if (asked)
        req = pending;
    if (p->mode == PAWL_CKPT_AUTO && end > req)
        req = end;
    /* Auto mode's own per-batch request need not be stored at once; an explicit one is. */
    int lazy = p->mode == PAWL_CKPT_AUTO && stmts == 0 && !asked;
    if (req == PAWL_RECONCILE_NOTHING || req <= k->token)
        return ckpt_commit(k, txn, PAWL_RECONCILE_NOTHING, end, n, handled, 0);
    int64_t to_store = PAWL_RECONCILE_NOTHING;
    k->ckpt_start_ns = pawl_now_ns();
    blame_clear(k);
    int rc = pawl__reconcile_checkpoint(&k->rec, k->seg, req, k->token, end, &to_store);
    if (rc != PAWL_EAGAIN)
        pawl_metric_hist_record(PAWL_H_CHECKPOINT_WAIT, pawl_now_ns() - k->ckpt_start_ns);
    if (rc == PAWL_EAGAIN) {
        PAWL_ASSERT(k->phase == PH_NONE); /* PH_NONE -> PH_CKPT: one cycle at a time */
        k->phase = PH_CKPT;
        set_doing(k, PAWL_SEG_UNITS);
        k->ptxn = txn;
        k->pend = end;
        k->pn = n;
        k->phandled = handled;
        k->plazy = lazy;
        return PAWL_EAGAIN;
    }
    if (rc) {
        PAWL_WARN(MOD, "%s: segment %u: checkpoint failed: %s", p->name, k->seg.id,
                  pawl__reconcile_error(&k->rec));
        txn->ops->rollback(txn);
        return dl_blamed(k, n); /* PKG_RERUN or PAWL_ECHECKPOINT */
    }
    return ckpt_commit(k, txn, to_store, end, n, handled, lazy);
}

/* Store `token` while the claim is held (release, idle advance in plain mode). */
static int store_now(struct pkg *k, int64_t token)
{
    struct pawl_processor *p = k->p;
    if (token <= k->token)
        return 0;
    struct pawl_txn *txn;
    int rc = store_failed(k, p->tok->ops->begin(p->tok, p->name, k->seg.id, p->node, &txn));
    if (rc)
        return rc;
    return ckpt_commit(k, txn, token, token, 0, 0, 0);
}

/* The last part of a release: store what the units confirmed, then free the claim. */
static void release_store_finish(struct pkg *k, int64_t to_store, int rc_final)
{
    struct pawl_processor *p = k->p;
    if (to_store != PAWL_RECONCILE_NOTHING) {
        int rc = store_now(k, to_store);
        if (rc) {
            PAWL_WARN(MOD, "%s: segment %u: storing progress at release failed (%s%s%s)", p->name,
                      k->seg.id, pawl_strerror(rc), k->storeerr[0] ? ": " : "", k->storeerr);
            k->storeerr[0] = '\0';
        }
    }
    pkg_finish(k, rc_final);
}

/*
 * Release the segment (rc_final 0: orderly; else the failure that aborted the package, whose
 * batch is already rolled back). Plain mode stores the consumed position; checkpoint modes run
 * the release reconciliation first. Returns PAWL_EAGAIN when parked on the units' futures.
 */
static int pkg_release(struct pkg *k, int rc_final)
{
    atomic_store_explicit(&k->releasing, 1, memory_order_relaxed); /* a report, as `doing` */
    if (rc_final == 0) {
        /* Nothing left to handle: everything up to queued_pos is consumed. */
        pthread_mutex_lock(&k->mu);
        if (k->work_pos == k->work.n && k->inbox.n == 0 && k->queued_pos > k->consumed)
            k->consumed = k->queued_pos;
        pthread_mutex_unlock(&k->mu);
    }
    if (!k->rec_ready) {
        int64_t up =
            k->p->mode == PAWL_CKPT_PLAIN && rc_final == 0 ? k->consumed : PAWL_RECONCILE_NOTHING;
        release_store_finish(k, up, rc_final);
        return 0;
    }
    /* No further requests: the trigger goes inert before the units are asked. */
    pawl__trigger_invalidate(k->trigger);
    int64_t to_store = PAWL_RECONCILE_NOTHING;
    int rc = pawl__reconcile_release(&k->rec, k->seg, k->consumed, k->token, &to_store);
    if (rc == PAWL_EAGAIN) {
        PAWL_ASSERT(k->phase == PH_NONE); /* PH_NONE -> PH_RELEASE */
        k->phase = PH_RELEASE;
        k->prc = rc_final;
        set_doing(k, PAWL_SEG_UNITS);
        return PAWL_EAGAIN;
    }
    if (rc)
        PAWL_INFO(MOD, "%s: segment %u: release: %s", k->p->name, k->seg.id,
                  pawl__reconcile_error(&k->rec));
    release_store_finish(k, to_store, rc_final);
    return 0;
}

/*
 * Make work hold unhandled events: take the inbox, or read the log ourselves when detached.
 * Returns 0 (work may still be empty when there is nothing to do), or a source error.
 */
static int pkg_fill(struct pkg *k)
{
    struct pawl_processor *p = k->p;
    if (k->work_pos < k->work.n)
        return 0;
    for (int round = 0; round < 2; round++) {
        pthread_mutex_lock(&k->mu);
        struct pawl_event_batch t = k->work;
        k->work = k->inbox;
        k->inbox = t;
        pawl_event_batch_clear(&k->inbox);
        k->work_pos = 0;
        k->work_end = k->queued_pos;
        int attached = k->attached;
        int64_t from = k->queued_pos;
        pthread_mutex_unlock(&k->mu);
        if (k->work.n > 0 || attached || round == 1)
            return 0;

        /* Detached and drained: catch up on our own read. */
        set_doing(k, PAWL_SEG_READING);
        int64_t last = from;
        pawl_event_batch_clear(&k->readbuf);
        int rc = p->src->ops->read(p->src, from, p->o.read_batch, &k->readbuf, &last);
        if (rc) {
            atomic_fetch_add_explicit(&p->st_source_errors, 1, memory_order_relaxed);
            PAWL_WARN(MOD, "%s: segment %u: read after %lld failed: %s", p->name, k->seg.id,
                      (long long)from, p->src->ops->errmsg(p->src));
            return rc;
        }
        pawl_metric_add(PAWL_M_EVENTS_READ, k->readbuf.n);
        pthread_mutex_lock(&k->mu);
        for (size_t i = 0; i < k->readbuf.n && rc == 0; i++) {
            const struct pawl_event *e = &k->readbuf.events[i];
            if (e->index > k->queued_pos &&
                pawl_segment_contains(k->seg, pawl_stream_hash(e->stream_id)))
                rc = pawl_event_batch_push(&k->inbox, e);
        }
        if (rc == 0 && last > k->queued_pos)
            k->queued_pos = last;
        pthread_mutex_unlock(&k->mu);
        if (rc)
            return rc;
        /* Re-attach between two dispatches once we have reached the shared reader. */
        pthread_mutex_lock(&p->dispatch_mu);
        pthread_mutex_lock(&k->mu);
        if (p->R >= 0 && k->queued_pos >= p->R)
            k->attached = 1;
        pthread_mutex_unlock(&k->mu);
        pthread_mutex_unlock(&p->dispatch_mu);
    }
    return 0;
}

static int run_handlers(struct pkg *k, struct pawl_txn *txn, const struct pawl_event *e, size_t pos,
                        int dead_letter)
{
    struct pawl_processor *p = k->p;
    struct pawl_event_ctx ctx = {
        .ev = e,
        .seg = k->seg,
        .replay = !dead_letter && e->index <= k->high_water,
        .txn = txn,
        .trigger = k->trigger,
        .pos = pos,
        .errbuf = k->errbuf,
        .errlen = sizeof k->errbuf,
        .dead_letter = dead_letter,
    };
    k->errbuf[0] = '\0';
    if (e->appended_at_us > 0 && !dead_letter) {
        int64_t lag_us = pawl_wall_us() - e->appended_at_us;
        if (lag_us >= 0)
            pawl_metric_hist_record(PAWL_H_E2E_LAG, lag_us * 1000);
    }
    for (size_t i = 0; i < p->nh; i++) {
        int rc = p->h[i].handle(p->h[i].self, &ctx);
        if (rc) {
            pawl_metric_inc(PAWL_M_HANDLER_ERRORS);
            const char *hn = p->h[i].name ? p->h[i].name : "?";
            char sid[PAWL_PRINTABLE_SIZE(PAWL_STREAM_ID_MAX)], why[1024];
            PAWL_WARN(MOD, "%s: segment %u: handler %s failed on event %lld (%s): %s%s%s", p->name,
                      k->seg.id, hn, (long long)e->index,
                      pawl_printable_str(e->stream_id, sid, sizeof sid), pawl_strerror(rc),
                      k->errbuf[0] ? ": " : "", pawl_printable_str(k->errbuf, why, sizeof why));
            snprintf(k->lasterr, sizeof k->lasterr, "%s: %s", hn,
                     k->errbuf[0] ? k->errbuf : pawl_strerror(rc));
            return rc < 0 ? rc : PAWL_EHANDLER;
        }
    }
    return 0;
}

/* Handle up to batch_size events of work in one transaction. 0, PAWL_EAGAIN (parked), error. */
/* The transaction handlers see in a batch: counts their statements, forwards everything. */
struct counted_txn {
    struct pawl_txn base;
    struct pawl_txn *inner;
    size_t stmts;
};

static int counted_exec(struct pawl_txn *t, const char *sql, int nparams, const char *const *values)
{
    struct counted_txn *c = PAWL_CONTAINER_OF(t, struct counted_txn, base);
    c->stmts++;
    return c->inner->ops->exec(c->inner, sql, nparams, values);
}

static int counted_store(struct pawl_txn *t, int64_t token)
{
    (void)t;
    (void)token;
    return PAWL_ENOTSUP; /* the processor owns the token write */
}

static int counted_commit(struct pawl_txn *t)
{
    (void)t;
    return PAWL_ENOTSUP; /* the processor commits the batch */
}

static void counted_rollback(struct pawl_txn *t)
{
    (void)t; /* the processor rolls the batch back when a handler fails */
}

static const struct pawl_txn_ops counted_ops = {counted_exec,     counted_store, counted_commit,
                                                counted_rollback, NULL,          NULL};

static int pkg_batch(struct pkg *k)
{
    struct pawl_processor *p = k->p;
    size_t n = PAWL_MIN((size_t)p->o.batch_size, k->work.n - k->work_pos);
    const struct pawl_event *ev = k->work.events + k->work_pos;
    if (k->dl_cut) {
        /* A unit failed event dl_cut (below the policy, or without one): handle what lies
         * before it (the unit has it), then give the segment up for the back-off. */
        size_t m = 0;
        while (m < n && ev[m].index < k->dl_cut)
            m++;
        if (m == 0) {
            k->dl_cut = 0;
            return k->dl_cut_rc;
        }
        n = m;
    }
    /* The batch covers through its last event; when it drains work, also through work_end
     * (the package had everything up to there). work_end can lag the last event when the
     * inbox was taken in the middle of a dispatch, hence the max: a token below an event
     * already handled would redeliver it after a re-claim. */
    int64_t end = ev[n - 1].index;
    if (k->work_pos + n == k->work.n && k->work_end > end)
        end = k->work_end;

    struct pawl_txn *txn;
    k->batch_start_ns = pawl_now_ns();
    int rc = store_failed(k, p->tok->ops->begin(p->tok, p->name, k->seg.id, p->node, &txn));
    if (rc)
        return rc;
    set_doing(k, PAWL_SEG_HANDLING);
    /* Handlers get a counting front of the transaction: a batch that queued no statements may
     * skip its token write (commit_cycle). */
    struct counted_txn ct = {{&counted_ops}, txn, 0};
    size_t handled = 0;
    int dl = p->o.dead_letter_attempts > 0;
    k->batch_letters = 0;
    k->batch_new_streams = 0;
    k->batch_parked0 = k->nparked;
    for (size_t i = 0; i < n; i++) {
        const struct pawl_event *e = &ev[i];
        /* After a merge, the faster half's events up to its old token were handled already. */
        if (k->has_merge && e->index <= k->merge_token &&
            pawl_segment_contains(k->merge_seg, pawl_stream_hash(e->stream_id)))
            continue;
        if (dl) {
            /* A parked stream's later events, and an event past the policy, are parked. */
            rc = pawl__dl_maybe_park(k, txn, e);
            if (rc < 0) {
                txn->ops->rollback(txn);
                pawl__dl_batch_rolled_back(k);
                return rc;
            }
            if (rc == 1)
                continue;
        }
        rc = run_handlers(k, &ct.base, e, i, 0);
        if (rc) {
            txn->ops->rollback(txn);
            pawl__dl_batch_rolled_back(k);
            /* With a dead-letter policy: count the attempt; past it, handle the batch again
             * at once with the event parked (PKG_RERUN), else fail as usual. */
            return dl ? pawl__dl_failed(k, e, rc) : rc;
        }
        handled++;
    }
    pawl_metric_add(PAWL_M_EVENTS_HANDLED, handled);
    if (atomic_load_explicit(&k->lost, memory_order_relaxed)) {
        txn->ops->rollback(txn);
        return PAWL_ECLAIM;
    }
    /* Letters count as statements: they must commit with the token that moves past them. */
    return commit_cycle(k, txn, end, n, handled, ct.stmts + k->batch_letters);
}

/* An empty commit cycle at the consumed position (idle segment). 0, PAWL_EAGAIN or error. */
static int pkg_idle_cycle(struct pkg *k)
{
    struct pawl_processor *p = k->p;
    struct pawl_txn *txn;
    int rc = store_failed(k, p->tok->ops->begin(p->tok, p->name, k->seg.id, p->node, &txn));
    if (rc)
        return rc;
    return commit_cycle(k, txn, k->consumed, 0, 0, 0);
}

/* Abort after a failure: the batch is rolled back; release (reconciling what units confirm). */
static int pkg_fail(struct pkg *k, int rc)
{
    struct pawl_processor *p = k->p;
    atomic_fetch_add_explicit(&p->st_failures, 1, memory_order_relaxed);
    pawl_metric_inc(PAWL_M_BATCH_ROLLBACKS);
    if (rc == PAWL_ECHECKPOINT)
        pawl_metric_inc(PAWL_M_HANDLER_ERRORS);
    if (rc == PAWL_ECLAIM) {
        atomic_fetch_add_explicit(&p->st_lost, 1, memory_order_relaxed);
        pawl_metric_inc(PAWL_M_CLAIMS_LOST);
    }
    /* The token store's own words when it failed (the server's SQLSTATE and message, or the
     * lost connection), whatever the code; a handler's or a unit's were logged already. */
    const char *why = k->storeerr;
    PAWL_WARN(MOD, "%s: segment %u: batch rolled back (%s%s%s); releasing it", p->name, k->seg.id,
              pawl_strerror(rc), why[0] ? ": " : "", why);
    k->storeerr[0] = '\0';
    return pkg_release(k, rc);
}

/* Under k->mu: does the package have something to do at its next step? */
static int pkg_more_locked(struct pkg *k)
{
    PAWL_ASSERT(pawl_mutex_locked(&k->mu));
    return k->woken || k->work_pos < k->work.n || k->inbox.n > 0 || !k->attached ||
           atomic_load_explicit(&k->release_req, memory_order_relaxed) ||
           atomic_load_explicit(&k->lost, memory_order_relaxed) ||
           (k->trigger && k->phase == PH_NONE && pawl__trigger_ready(k->trigger, k->consumed));
}

/* End a step: queue the next one if there is work, else go idle. */
static void pkg_end_step(struct pkg *k, int parked)
{
    struct pawl_processor *p = k->p;
    /* Before `scheduled` is cleared: from then on another step may own k (and finish it). */
    if (!parked)
        set_doing(k, PAWL_SEG_IDLE);
    pthread_mutex_lock(&k->mu);
    /* A parked package only wakes for its reconciler (or to be told to give up, which it
     * handles once the cycle is over). */
    int more = parked ? k->woken : pkg_more_locked(k);
    int room = pawl_pkg_has_room(p, k);
    if (!more)
        k->scheduled = 0;
    pthread_mutex_unlock(&k->mu);
    if (room && !parked) {
        pthread_mutex_lock(&p->mu);
        if (!p->room) {
            p->room = 1;
            pthread_cond_broadcast(&p->cv);
        }
        pthread_mutex_unlock(&p->mu);
    }
    if (more)
        enqueue(p, k);
}

/* A parked package's step: resume its cycle once the reconciler has woken it. */
static void pkg_resume(struct pkg *k)
{
    PAWL_ASSERT(k->phase == PH_CKPT || k->phase == PH_RELEASE || k->phase == PH_RETRY);
    pthread_mutex_lock(&k->mu);
    int woken = k->woken;
    k->woken = 0;
    pthread_mutex_unlock(&k->mu);
    if (!woken) {
        pkg_end_step(k, 1);
        return;
    }
    int64_t to_store = PAWL_RECONCILE_NOTHING;
    int rc = pawl__reconcile_resume(&k->rec, &to_store);
    if (rc == PAWL_EAGAIN) {
        pkg_end_step(k, 1);
        return;
    }
    if (k->phase == PH_RELEASE) {
        k->phase = PH_NONE;
        if (rc)
            PAWL_INFO(MOD, "%s: segment %u: release: %s", k->p->name, k->seg.id,
                      pawl__reconcile_error(&k->rec));
        release_store_finish(k, to_store, k->prc);
        return;
    }
    if (k->phase == PH_RETRY) {
        k->phase = PH_NONE;
        rc = dl_retry_end(k, rc);
        if (rc) {
            if (pkg_fail(k, rc) == PAWL_EAGAIN)
                pkg_end_step(k, 1);
            return;
        }
        pkg_end_step(k, 0);
        return;
    }
    /* PH_CKPT */
    pawl_metric_hist_record(PAWL_H_CHECKPOINT_WAIT, pawl_now_ns() - k->ckpt_start_ns);
    struct pawl_txn *txn = k->ptxn;
    k->ptxn = NULL;
    k->phase = PH_NONE;
    if (rc) {
        PAWL_WARN(MOD, "%s: segment %u: checkpoint failed: %s", k->p->name, k->seg.id,
                  pawl__reconcile_error(&k->rec));
        txn->ops->rollback(txn);
        rc = dl_blamed(k, k->pn);
    } else {
        rc = ckpt_commit(k, txn, to_store, k->pend, k->pn, k->phandled, k->plazy);
    }
    if (rc == PKG_RERUN) {
        pkg_end_step(k, 0); /* the batch is handled again at the next step */
        return;
    }
    if (rc) {
        if (pkg_fail(k, rc) == PAWL_EAGAIN)
            pkg_end_step(k, 1);
        return;
    }
    pkg_end_step(k, 0);
}

/* Worker-only fields are touched by one step at a time: the step that holds `scheduled`. */
static int step_owned(struct pkg *k)
{
    pthread_mutex_lock(&k->mu);
    int ok = k->scheduled && k->state == PKG_RUN;
    pthread_mutex_unlock(&k->mu);
    return ok;
}

static void pkg_step(struct pkg *k)
{
    struct pawl_processor *p = k->p;
    int rc;
    PAWL_ASSERT(step_owned(k));
    k->storeerr[0] = '\0'; /* a failure's text is reported within the step that met it */
    if (k->phase != PH_NONE) {
        pkg_resume(k);
        return;
    }
    pthread_mutex_lock(&k->mu);
    k->woken = 0;
    pthread_mutex_unlock(&k->mu);
    if (p->mode != PAWL_CKPT_PLAIN && !k->rec_ready) {
        rc = pkg_claimed(k);
        if (rc) {
            if (k->trigger) {
                pawl__trigger_invalidate(k->trigger);
                pawl__trigger_free(k->trigger);
                k->trigger = NULL;
            }
            atomic_fetch_add_explicit(&p->st_failures, 1, memory_order_relaxed);
            pkg_finish(k, rc);
            return;
        }
    }
    if (atomic_load_explicit(&k->lost, memory_order_relaxed)) {
        if (pkg_fail(k, PAWL_ECLAIM) == PAWL_EAGAIN)
            pkg_end_step(k, 1);
        return;
    }
    if (atomic_load_explicit(&k->release_req, memory_order_relaxed)) {
        if (pkg_release(k, 0) == PAWL_EAGAIN)
            pkg_end_step(k, 1);
        return;
    }
    rc = p->o.dead_letter_attempts ? dl_service(k) : 0;
    if (rc == 0)
        rc = pkg_fill(k);
    if (rc == 0 && k->work_pos < k->work.n) {
        rc = pkg_batch(k);
        if (rc == PKG_RERUN)
            rc = 0; /* the batch is handled again at the next step, parking the event */
    } else if (rc == 0) {
        /* No events of ours: move the token along now and then (plain and auto), and honour a
         * trigger request (deferred and auto) — never an unconfirmed position in deferred. */
        k->consumed = PAWL_MAX(k->consumed, k->work_end);
        int due = k->consumed > k->token && token_due(k, 0);
        if (p->mode == PAWL_CKPT_PLAIN) {
            if (due)
                rc = store_now(k, k->consumed);
        } else if ((due && p->mode == PAWL_CKPT_AUTO) ||
                   pawl__trigger_ready(k->trigger, k->consumed)) {
            rc = pkg_idle_cycle(k);
        }
    }
    if (rc == PAWL_EAGAIN) {
        pkg_end_step(k, 1);
        return;
    }
    if (rc) {
        if (pkg_fail(k, rc) == PAWL_EAGAIN)
            pkg_end_step(k, 1);
        return;
    }
    pkg_end_step(k, 0);
}
