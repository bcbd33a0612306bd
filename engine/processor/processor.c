/*
 * processor.c — the pooled streaming processor: coordinator, claims, claim extension, back-off
 * and rebalancing, life cycle and administration. The work packages live in package.c, the
 * dead-letter tables and their administration in dead_letters.c; the structures they share, in
 * processor_int.h.
 *
 * Threads and who owns what:
 *   - The coordinator thread owns the list of work packages. It runs the claim cycle (claim up
 *     to this node's fair share, release the surplus), reads the log through the shared reader
 *     and dispatches each event to the package of its segment, reaps finished packages and
 *     applies their back-off, and serves split/merge requests.
 *   - The extender thread refreshes this node's claims every claim_extend_interval_ms on its
 *     own, so a pool busy with slow handlers never lets a claim expire; a claim it finds taken
 *     marks the package lost.
 *   - The segment workers are a runtime work-stealing pool of opts.threads workers ("pawl-seg").
 *     A package step is a pool task. One step handles one batch in one transaction; a package
 *     is queued at most once at a time and after each batch re-submits itself through the
 *     pool's injection queue (pawl__pool_yield), not onto its worker's own deque: the deque's
 *     owner end is LIFO, so a busy segment re-pushed there would run again before the segments
 *     queued behind it. Through the injection queue a segment's batches never overlap, its
 *     events stay in index order, every segment with work gets its turn, and a worker that
 *     takes a run of queued steps leaves them in its deque where an idle worker steals them.
 *     Checkpoint futures' continuations and timers run on a second, one-worker pool, so they
 *     never wait behind long steps.
 *   - Claim extension has its own thread rather than a runtime timer: timer callbacks run as
 *     pool tasks, and an extension must not wait for a free worker.
 *
 * Reading. The shared reader keeps position R: every attached package has received all of its
 * events up to R. A package's inbox holds at most read_ahead events (and read_ahead_bytes of
 * their data); when the reader finds it
 * full it detaches the package instead of waiting, so the slowest segment never stalls the
 * others. A detached package reads the log on its own (its own reads, filtered to its segment)
 * until it reaches R, and re-attaches between two dispatches (both under dispatch_mu, so no
 * dispatched batch is half-seen). queued_pos is the package's "complete up to" mark; the reader
 * skips events at or below it, so catching up past R never duplicates an event.
 *
 * Tokens. Each batch commits the handlers' statements and the segment's new token in one
 * transaction, conditional on this node still owning the claim. Any failure (handler error,
 * lost claim, store error, source error) rolls the batch back, aborts the package, releases the
 * claim and keeps the segment away from this node for a back-off that starts at backoff_min_ms,
 * doubles up to backoff_max_ms and resets after the next successful batch.
 *
 * Checkpoint protocol (pawl/checkpoint.h). The mode follows from the handlers. In auto and
 * deferred mode each claim gets a trigger and a reconciler (reconcile.h); the commit
 * cycle asks the units, and while their futures are pending the package is parked with its
 * batch transaction open (no thread waits; the reconciler's wake queues the next step). A
 * release (stop, rebalancing, split/merge, abort) makes the trigger inert, reconciles the
 * units' release reports and stores the result while the claim is still held. Claim extension
 * never writes a token, so a deferred token only moves on a reconciled request.
 *
 * Lock order: p->mu (coordinator state, done list), then dispatch_mu, then pkg->mu. The package
 * list changes only on the coordinator thread, under p->mu; the coordinator reads it without the
 * lock, other threads under p->mu.
 */
#include "processor_int.h"

#include "metrics.h"
#include "segment.h"
#include "timers.h"
#include "trigger.h"

#include "pawl/checkpoint.h"
#include "pawl/runtime.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define MOD "processor"

/* ---------------------------------------------------------------------------------------------
 * Options
 * ------------------------------------------------------------------------------------------ */

void pawl_processor_opts_defaults(struct pawl_processor_opts *o)
{
    memset(o, 0, sizeof *o);
#define DEFAULT(type, field, flag, def, lo, hi, unit, help, choices) o->field = def;
    PAWL_PROCESSOR_TUNABLES(DEFAULT)
#undef DEFAULT
}

static int name_ok(const char *s, size_t max)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > max)
        return 0;
    for (const char *c = s; *c; c++) {
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '.' || *c == ':' || *c == '-'))
            return 0;
    }
    return 1;
}

/* The ranges of PAWL_PROCESSOR_TUNABLES, then the rules no single range states. */
static int check_opts(const struct pawl_processor_opts *o)
{
#define RANGE_(f, lo, hi)                                                                          \
    if ((int64_t)o->f < (int64_t)(lo) || (int64_t)o->f > (int64_t)(hi)) {                          \
        PAWL_ERROR(MOD, #f " = %lld is out of range [%lld, %lld]", (long long)o->f,                \
                   (long long)(lo), (long long)(hi));                                              \
        return PAWL_ERANGE;                                                                        \
    }
#define CHECK_INT(field, lo, hi) RANGE_(field, lo, hi)
#define CHECK_BOOL(field, lo, hi) /* any nonzero value is true */
#define CHECK_DURATION(field, lo, hi) RANGE_(field, lo, hi)
#define CHECK_ENUM(field, lo, hi) RANGE_(field, lo, hi)
#define CHECK_STRING(field, lo, hi) /* name_ok below */
#define CHECK(type, field, flag, def, lo, hi, unit, help, choices) CHECK_##type(field, lo, hi)
    PAWL_PROCESSOR_TUNABLES(CHECK)
#undef CHECK
#undef CHECK_STRING
#undef CHECK_ENUM
#undef CHECK_DURATION
#undef CHECK_BOOL
#undef CHECK_INT
    if (!name_ok(o->name, PAWL_NAME_MAX)) {
        PAWL_ERROR(MOD, "processor name must be 1..%d characters of [A-Za-z0-9_.:-]",
                   PAWL_NAME_MAX);
        return PAWL_EINVAL;
    }
    if (o->node_id && !name_ok(o->node_id, PAWL_OWNER_MAX)) {
        PAWL_ERROR(MOD, "node id must be 1..%d characters of [A-Za-z0-9_.:-]", PAWL_OWNER_MAX);
        return PAWL_EINVAL;
    }
    if (!pawl__segment_count_valid(o->segments)) {
        PAWL_ERROR(MOD, "segments = %u must be a power of two in 1..65536", o->segments);
        return PAWL_ERANGE;
    }
    if (o->claim_extend_interval_ms != 0)
        RANGE_(claim_extend_interval_ms, 10, o->claim_timeout_ms / 2)
    if (o->backoff_max_ms < o->backoff_min_ms) {
        PAWL_ERROR(MOD, "backoff_max_ms = %u is below backoff_min_ms = %u", o->backoff_max_ms,
                   o->backoff_min_ms);
        return PAWL_ERANGE;
    }
#undef RANGE_
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Coordinator
 * ------------------------------------------------------------------------------------------ */

static struct backoff *backoff_find(struct pawl_processor *p, uint32_t seg_id)
{
    for (size_t i = 0; i < p->nbackoffs; i++)
        if (p->backoffs[i].seg_id == seg_id)
            return &p->backoffs[i];
    return NULL;
}

/* Coordinator, under p->mu. */
static void backoff_fail(struct pawl_processor *p, uint32_t seg_id, int had_success)
{
    PAWL_ASSERT_COORD(p);
    PAWL_ASSERT(pawl_mutex_locked(&p->mu));
    struct backoff *b = backoff_find(p, seg_id);
    if (b == NULL) {
        if (p->nbackoffs == p->backoffs_cap) {
            size_t cap = p->backoffs_cap ? p->backoffs_cap * 2 : 16;
            struct backoff *nb = pawl_realloc(p->backoffs, cap * sizeof *nb);
            if (nb == NULL)
                return; /* no back-off memory: the next claim cycle simply retries */
            p->backoffs = nb;
            p->backoffs_cap = cap;
        }
        b = &p->backoffs[p->nbackoffs++];
        b->seg_id = seg_id;
        b->delay_ms = 0;
    }
    if (had_success || b->delay_ms == 0)
        b->delay_ms = p->o.backoff_min_ms;
    else
        b->delay_ms = PAWL_MIN(b->delay_ms * 2, (int64_t)p->o.backoff_max_ms);
    b->retry_at_ns = pawl_now_ns() + b->delay_ms * 1000000;
    pawl_metric_inc(PAWL_M_BACKOFFS);
    PAWL_INFO(MOD, "%s: segment %u: retrying in %lld ms", p->name, seg_id, (long long)b->delay_ms);
}

static int in_backoff(struct pawl_processor *p, uint32_t seg_id, int64_t now)
{
    struct backoff *b = backoff_find(p, seg_id);
    return b && b->retry_at_ns > now;
}

/* Unlink finished packages; apply back-off. Coordinator, under p->mu. */
static void reap_locked(struct pawl_processor *p)
{
    PAWL_ASSERT_COORD(p);
    PAWL_ASSERT(pawl_mutex_locked(&p->mu));
    while (p->done) {
        struct pkg *k = p->done;
        p->done = k->run_next;
        for (struct pkg **pp = &p->pkgs; *pp; pp = &(*pp)->next) {
            if (*pp == k) {
                *pp = k->next;
                break;
            }
        }
        p->pkgs_version++;
        atomic_fetch_add_explicit(&p->st_releases, 1, memory_order_relaxed);
        atomic_fetch_sub_explicit(&p->st_owned, 1, memory_order_relaxed);
        pawl_metric_inc(PAWL_M_CLAIMS_RELEASED);
        pawl_metric_gauge_add(PAWL_G_CLAIMS_HELD, -1);
        /* A stopping processor claims nothing again: no back-off (nor its "retrying" line). */
        if (k->failed && !p->stopping)
            backoff_fail(p, k->seg.id, k->had_success);
        pawl__pkg_free(k);
    }
}

/* Coordinator: rebuild the lookup table (segments are disjoint, so a slot has one owner). */
static void lut_rebuild(struct pawl_processor *p)
{
    PAWL_ASSERT_COORD(p);
    uint32_t maxmask = 0;
    for (struct pkg *k = p->pkgs; k; k = k->next)
        maxmask = PAWL_MAX(maxmask, k->seg.mask);
    uint32_t tmask = PAWL_MIN(maxmask, 0xffffu);
    if (p->lut == NULL || tmask != p->lut_mask) {
        /* An array of pointers: sizeof *t is a pointer's size, as meant. */
        // NOLINTNEXTLINE(bugprone-sizeof-expression)
        struct pkg **t = pawl_realloc(p->lut, ((size_t)tmask + 1) * sizeof *t);
        if (t == NULL) {
            pawl_free(p->lut);
            p->lut = NULL; /* lookups scan instead */
            p->lut_version = p->pkgs_version;
            return;
        }
        p->lut = t;
        p->lut_mask = tmask;
    }
    // NOLINTNEXTLINE(bugprone-sizeof-expression): pointers, as above
    memset(p->lut, 0, ((size_t)tmask + 1) * sizeof *p->lut);
    p->lut_partial = 0;
    for (struct pkg *k = p->pkgs; k; k = k->next) {
        if (k->seg.mask > tmask) {
            p->lut_partial = 1;
            continue;
        }
        for (uint64_t j = k->seg.id; j <= tmask; j += (uint64_t)k->seg.mask + 1)
            p->lut[j] = k;
    }
    p->lut_version = p->pkgs_version;
}

/* Coordinator, under dispatch_mu: the package whose segment holds stream hash h, or NULL. */
static struct pkg *lookup(struct pawl_processor *p, uint32_t h)
{
    PAWL_ASSERT_COORD(p);
    PAWL_ASSERT(pawl_mutex_locked(&p->dispatch_mu));
    if (p->lut_version != p->pkgs_version)
        lut_rebuild(p);
    if (p->lut) {
        struct pkg *k = p->lut[h & p->lut_mask];
        if (k && pawl_segment_contains(k->seg, h))
            return k;
        if (!p->lut_partial)
            return NULL;
    }
    for (struct pkg *k = p->pkgs; k; k = k->next)
        if (pawl_segment_contains(k->seg, h))
            return k;
    return NULL;
}

static struct pkg *find_pkg(struct pawl_processor *p, uint32_t seg_id)
{
    for (struct pkg *k = p->pkgs; k; k = k->next)
        if (k->seg.id == seg_id)
            return k;
    return NULL;
}

static void request_release(struct pkg *k)
{
    atomic_store_explicit(&k->release_req, 1, memory_order_relaxed);
    pawl__pkg_schedule(k);
}

static int admin_involves(struct pawl_processor *p, uint32_t seg_id)
{
    return p->admin_op != ADMIN_NONE && !p->admin_done &&
           (seg_id == p->admin_seg || (p->admin_op == ADMIN_MERGE && seg_id == p->admin_sib));
}

/* A new package for a claimed row: attach it to the shared reader if it is not behind it.
 * Coordinator, under p->mu (lock order: p->mu, dispatch_mu, each package's mu). */
static void pkg_start(struct pawl_processor *p, struct pkg *k)
{
    PAWL_ASSERT_COORD(p);
    PAWL_ASSERT(pawl_mutex_locked(&p->mu));
    pthread_mutex_lock(&p->dispatch_mu);
    int any_attached = 0;
    for (struct pkg *o = p->pkgs; o; o = o->next) {
        if (o == k)
            continue;
        pthread_mutex_lock(&o->mu);
        any_attached |= o->attached && o->state == PKG_RUN;
        pthread_mutex_unlock(&o->mu);
    }
    if (!any_attached || p->R < 0)
        p->R = k->token;
    pthread_mutex_lock(&k->mu);
    k->attached = k->queued_pos >= p->R;
    pthread_mutex_unlock(&k->mu);
    pthread_mutex_unlock(&p->dispatch_mu);
    pawl__pkg_schedule(k);
}

static void claim_cycle(struct pawl_processor *p)
{
    PAWL_ASSERT_COORD(p);
    struct pawl_tokens *t = p->tok;
    struct pawl_segment_status *rows = NULL;
    size_t nrows = 0;
    uint32_t nodes = 1, rank = 0;
    int rc = t->ops->live(t, p->name, p->node, p->o.claim_timeout_ms, &nodes, &rank);
    if (rc == 0)
        rc = t->ops->list(t, p->name, &rows, &nrows);
    if (rc) {
        PAWL_WARN(MOD, "%s: claim cycle failed: %s", p->name, t->ops->errmsg(t));
        return;
    }
    if (nodes == 0)
        nodes = 1;
    uint32_t share = (uint32_t)(nrows / nodes) + (rank < nrows % nodes ? 1 : 0);
    if (p->o.max_segments_per_node && share > p->o.max_segments_per_node)
        share = p->o.max_segments_per_node;

    pthread_mutex_lock(&p->mu);
    uint32_t mine = 0;
    for (struct pkg *k = p->pkgs; k; k = k->next)
        if (!atomic_load_explicit(&k->release_req, memory_order_relaxed))
            mine++;
    if (mine > share) {
        /* Give back the surplus, highest segment ids first, so nodes converge on a layout. */
        uint32_t extra = mine - share;
        while (extra > 0) {
            struct pkg *best = NULL;
            for (struct pkg *k = p->pkgs; k; k = k->next)
                if (!atomic_load_explicit(&k->release_req, memory_order_relaxed) &&
                    (best == NULL || k->seg.id > best->seg.id))
                    best = k;
            if (best == NULL)
                break;
            PAWL_INFO(MOD, "%s: releasing segment %u to rebalance (%u nodes, share %u)", p->name,
                      best->seg.id, nodes, share);
            request_release(best);
            extra--;
        }
    }
    pthread_mutex_unlock(&p->mu);
    int64_t now = pawl_now_ns();
    /* Start at a rank-dependent row so nodes starting together do not contend for the same.
     * The store calls run without p->mu: workers finishing a package must not wait on them. */
    for (size_t j = 0; j < nrows && mine < share; j++) {
        struct pawl_segment_status *r = &rows[(j + (size_t)rank * (nrows / nodes)) % nrows];
        pthread_mutex_lock(&p->mu);
        int skip = p->stopping || find_pkg(p, r->seg.id) || in_backoff(p, r->seg.id, now) ||
                   admin_involves(p, r->seg.id);
        pthread_mutex_unlock(&p->mu);
        int claimable = r->owner[0] == '\0' || strcmp(r->owner, p->node) == 0 ||
                        r->claim_age_ms >= (int64_t)p->o.claim_timeout_ms;
        if (skip || !claimable)
            continue;
        struct pawl_segment_status row;
        rc = t->ops->claim(t, p->name, r->seg.id, p->node, p->o.claim_timeout_ms, p->mode, &row);
        if (rc == PAWL_EBUSY || rc == PAWL_ENOTFOUND)
            continue;
        if (rc) {
            PAWL_WARN(MOD, "%s: claiming segment %u failed: %s", p->name, r->seg.id,
                      t->ops->errmsg(t));
            break;
        }
        struct pkg *k = pawl__pkg_new(p, &row);
        if (k == NULL) {
            t->ops->release(t, p->name, row.seg.id, p->node);
            break;
        }
        pthread_mutex_lock(&p->mu);
        k->gen = ++p->gen;
        k->next = p->pkgs;
        p->pkgs = k;
        p->pkgs_version++;
        mine++;
        atomic_fetch_add_explicit(&p->st_claims, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->st_owned, 1, memory_order_relaxed);
        pawl_metric_inc(PAWL_M_CLAIMS_ACQUIRED);
        pawl_metric_gauge_add(PAWL_G_CLAIMS_HELD, 1);
        PAWL_DEBUG(MOD, "%s: claimed segment %u/%u at %lld", p->name, row.seg.id, row.seg.mask,
                   (long long)row.token);
        pkg_start(p, k);
        pthread_mutex_unlock(&p->mu);
    }
    pawl_tokens_rows_free(rows);
}

/* Serve a split/merge request once this node holds none of its segments. Coordinator, under
 * p->mu. */
static void admin_serve_locked(struct pawl_processor *p)
{
    PAWL_ASSERT_COORD(p);
    PAWL_ASSERT(pawl_mutex_locked(&p->mu));
    if (p->admin_op == ADMIN_NONE || p->admin_done)
        return;
    int waiting = 0;
    for (struct pkg *k = p->pkgs; k; k = k->next) {
        if (admin_involves(p, k->seg.id)) {
            waiting = 1;
            if (!atomic_load_explicit(&k->release_req, memory_order_relaxed))
                request_release(k);
        }
    }
    if (waiting)
        return;
    struct pawl_tokens *t = p->tok;
    p->admin_rc = p->admin_op == ADMIN_SPLIT ? t->ops->split(t, p->name, p->admin_seg, p->node)
                                             : t->ops->merge(t, p->name, p->admin_seg, p->node);
    p->admin_done = 1;
    pthread_cond_broadcast(&p->admin_cv);
}

/*
 * Read one batch after R and dispatch it. Returns 1 when it read events, 0 when there is
 * nothing to read (or no package wants events), negative on a source error. *held is set when
 * the read was held back by a full inbox (see below).
 */
static int coord_read(struct pawl_processor *p, int *held)
{
    PAWL_ASSERT_COORD(p);
    /* Under dispatch_mu the attached set is stable; membership is the coordinator's. */
    pthread_mutex_lock(&p->dispatch_mu);
    int64_t low = INT64_MAX, now = pawl_now_ns();
    int want = 0, hold = 0;
    for (struct pkg *k = p->pkgs; k; k = k->next) {
        pthread_mutex_lock(&k->mu);
        if (k->attached && k->state == PKG_RUN) {
            low = PAWL_MIN(low, k->queued_pos);
            if (pawl_pkg_has_room(p, k)) {
                want = 1;
                k->full_since_ns = 0;
            } else if (k->full_since_ns == 0) {
                k->full_since_ns = now;
                hold = 1;
            } else if (now - k->full_since_ns < PAWL_DETACH_AFTER_NS) {
                hold = 1;
            }
        }
        pthread_mutex_unlock(&k->mu);
    }
    /* A full inbox holds the reader back for a while (its worker is usually about to drain
     * it), so that a catch-up where every segment is busy does not detach them all and
     * multiply the reads; a package still full after PAWL_DETACH_AFTER_NS is detached by the
     * dispatch below and catches up on its own reads, so a slow segment stalls the others for
     * at most that long. */
    *held = hold;
    if (hold) {
        pthread_mutex_unlock(&p->dispatch_mu);
        return 0;
    }
    /* Nobody attached needs anything below the lowest attached position. */
    if (low != INT64_MAX && low > p->R)
        p->R = low;
    int64_t from = p->R;
    pthread_mutex_unlock(&p->dispatch_mu);
    if (low == INT64_MAX || !want)
        return 0;

    int64_t last = from;
    pawl_event_batch_clear(&p->readbuf);
    int rc = p->src->ops->read(p->src, from, p->o.read_batch, &p->readbuf, &last);
    if (rc)
        return rc;
    pawl_metric_add(PAWL_M_EVENTS_READ, p->readbuf.n);
    if (last <= from)
        return 0;

    pthread_mutex_lock(&p->dispatch_mu);
    for (size_t i = 0; i < p->readbuf.n; i++) {
        const struct pawl_event *e = &p->readbuf.events[i];
        struct pkg *k = lookup(p, pawl_stream_hash(e->stream_id));
        if (k == NULL)
            continue; /* a segment nobody here holds */
        pthread_mutex_lock(&k->mu);
        if (k->attached && k->state == PKG_RUN && e->index > k->queued_pos) {
            k->kicked = 1;
            if (k->inbox.n >= p->o.read_ahead || k->inbox._used >= p->o.read_ahead_bytes) {
                /* Full: this package catches up on its own reads from here. */
                k->attached = 0;
                k->queued_pos = e->index - 1;
            } else if (pawl_event_batch_push(&k->inbox, e) != 0) {
                k->attached = 0;
                k->queued_pos = e->index - 1;
            }
        }
        pthread_mutex_unlock(&k->mu);
    }
    for (struct pkg *k = p->pkgs; k; k = k->next) {
        pthread_mutex_lock(&k->mu);
        if (k->attached && k->queued_pos < last)
            k->queued_pos = last;
        pthread_mutex_unlock(&k->mu);
    }
    p->R = last;
    pthread_mutex_unlock(&p->dispatch_mu);
    /* Wake the packages that got events (or were detached), with one submission. In plain mode
     * the others only learnt that they are complete up to `last`, which their token needs no
     * sooner than the claim cycle's nudge brings them; a step each would cost a wake-up per
     * package per read. In the checkpoint modes every package is woken, as a trigger may now be
     * ready at the new position. */
    pawl__pkg_schedule_list(p, p->pkgs, p->mode == PAWL_CKPT_PLAIN);
    return 1;
}

static void *coord_main(void *arg)
{
    struct pawl_processor *p = arg;
    p->coord_tag = pawl_thread_tag(); /* read only by this thread's own asserts */
    int64_t next_claim = 0;
    int64_t read_backoff_ms = 0, next_read = 0;
    int released_all = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        reap_locked(p);
        if (p->stopping && p->pkgs == NULL) {
            if (p->admin_op != ADMIN_NONE && !p->admin_done) {
                p->admin_rc = PAWL_ESHUTDOWN;
                p->admin_done = 1;
                pthread_cond_broadcast(&p->admin_cv);
            }
            pthread_mutex_unlock(&p->mu);
            break;
        }
        if (p->stopping) {
            if (!released_all) {
                for (struct pkg *k = p->pkgs; k; k = k->next)
                    request_release(k);
                released_all = 1;
            }
            if (p->done == NULL)
                pawl__timed_wait(p->timers, &p->mu, &p->cv, CLOCK_REALTIME, 50 * 1000000LL);
            pthread_mutex_unlock(&p->mu);
            continue;
        }
        admin_serve_locked(p);
        pthread_mutex_unlock(&p->mu);

        int64_t now = pawl_now_ns();
        if (now >= next_claim) {
            claim_cycle(p);
            /* Claim cycles also nudge idle packages, so they advance their stored token. */
            pthread_mutex_lock(&p->mu);
            pawl__pkg_schedule_list(p, p->pkgs, 0);
            pthread_mutex_unlock(&p->mu);
            next_claim = now + (int64_t)p->o.claim_poll_ms * 1000000;
        }

        int got = 0, held = 0;
        if (now >= next_read) {
            got = coord_read(p, &held);
            if (got < 0) {
                atomic_fetch_add_explicit(&p->st_source_errors, 1, memory_order_relaxed);
                read_backoff_ms = read_backoff_ms
                                      ? PAWL_MIN(read_backoff_ms * 2, (int64_t)p->o.backoff_max_ms)
                                      : (int64_t)p->o.backoff_min_ms;
                PAWL_WARN(MOD, "%s: reading the log failed (%s); retrying in %lld ms", p->name,
                          p->src->ops->errmsg(p->src), (long long)read_backoff_ms);
                next_read = pawl_now_ns() + read_backoff_ms * 1000000;
                got = 0;
            } else if (got > 0) {
                read_backoff_ms = 0;
            }
        }
        if (got > 0)
            continue;

        /* Nothing read: sleep until the log moves, a package needs us, or a timer is due. */
        now = pawl_now_ns();
        int64_t wait_ns = PAWL_MIN((int64_t)100 * 1000000, (int64_t)p->o.idle_wait_ms * 1000000);
        wait_ns = PAWL_MIN(wait_ns, next_claim - now);
        if (next_read > now)
            wait_ns = PAWL_MIN(wait_ns, next_read - now);
        pthread_mutex_lock(&p->mu);
        for (size_t i = 0; i < p->nbackoffs; i++)
            if (p->backoffs[i].retry_at_ns > now)
                wait_ns = PAWL_MIN(wait_ns, p->backoffs[i].retry_at_ns - now);
        if (wait_ns < 1000000)
            wait_ns = 1000000;
        int attached = 0, room = 0;
        pthread_mutex_unlock(&p->mu);
        pthread_mutex_lock(&p->dispatch_mu);
        for (struct pkg *k = p->pkgs; k; k = k->next) {
            pthread_mutex_lock(&k->mu);
            if (k->attached) {
                attached = 1;
                if (pawl_pkg_has_room(p, k))
                    room = 1;
            }
            pthread_mutex_unlock(&k->mu);
        }
        int64_t R = p->R;
        pthread_mutex_unlock(&p->dispatch_mu);
        if (held)
            wait_ns = PAWL_MIN(wait_ns, (int64_t)5 * 1000000);
        if (attached && room && next_read <= now && !held) {
            p->src->ops->wait(p->src, R, wait_ns / 1000000);
        } else {
            pthread_mutex_lock(&p->mu);
            if (p->done == NULL && !p->stopping && !p->room &&
                (p->admin_op == ADMIN_NONE || p->admin_done)) {
                pawl__timed_wait(p->timers, &p->mu, &p->cv, CLOCK_REALTIME, wait_ns);
            }
            p->room = 0;
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Claim extension: its own thread, so slow handlers never starve it.
 * ------------------------------------------------------------------------------------------ */

static void *extend_main(void *arg)
{
    struct pawl_processor *p = arg;
    uint32_t *ids = NULL;
    uint64_t *gens = NULL;
    unsigned char *held = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&p->emu);
    while (!p->stopped) {
        pthread_mutex_unlock(&p->emu);
        /* Snapshot (segment, claim generation) under p->mu; the store call runs without it. */
        pthread_mutex_lock(&p->mu);
        size_t n = 0;
        for (struct pkg *k = p->pkgs; k; k = k->next)
            n++;
        if (n > cap) {
            size_t c = n * 2;
            uint32_t *ni = pawl_realloc(ids, c * sizeof *ni);
            if (ni)
                ids = ni;
            uint64_t *ng = pawl_realloc(gens, c * sizeof *ng);
            if (ng)
                gens = ng;
            unsigned char *nh = pawl_realloc(held, c);
            if (nh)
                held = nh;
            if (ni && ng && nh)
                cap = c;
        }
        n = 0;
        for (struct pkg *k = p->pkgs; k && n < cap; k = k->next) {
            ids[n] = k->seg.id;
            gens[n++] = k->gen;
        }
        pthread_mutex_unlock(&p->mu);

        int rc = p->tok->ops->extend(p->tok, p->name, p->node, ids, n, held);
        if (rc == 0) {
            pthread_mutex_lock(&p->mu);
            for (size_t i = 0; i < n; i++) {
                if (held[i])
                    continue;
                /* Only the claim we asked about: a newer package of the same id is not lost. */
                struct pkg *k = find_pkg(p, ids[i]);
                if (k && k->gen == gens[i] &&
                    !atomic_load_explicit(&k->release_req, memory_order_relaxed) &&
                    !atomic_exchange_explicit(&k->lost, 1, memory_order_relaxed)) {
                    PAWL_WARN(MOD, "%s: segment %u: claim taken over by another node", p->name,
                              k->seg.id);
                    pawl__pkg_schedule(k);
                }
            }
            pthread_mutex_unlock(&p->mu);
        } else {
            /* While stopping, a failed extension is retried until the stop ends; the stop's
             * own report says what it waits for, so this is no warning then. */
            pthread_mutex_lock(&p->mu);
            int stopping = p->stopping;
            pthread_mutex_unlock(&p->mu);
            pawl_log(stopping ? PAWL_LOG_DEBUG : PAWL_LOG_WARN, MOD,
                     "%s: extending claims failed: %s", p->name, p->tok->ops->errmsg(p->tok));
        }

        pthread_mutex_lock(&p->emu);
        if (p->stopped)
            break;
        pawl__timed_wait(p->timers, &p->emu, &p->ecv, CLOCK_REALTIME,
                         (int64_t)p->extend_ms * 1000000);
    }
    pthread_mutex_unlock(&p->emu);
    pawl_free(ids);
    pawl_free(gens);
    pawl_free(held);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Life cycle
 * ------------------------------------------------------------------------------------------ */

/*
 * This processor object's owner id in the token store: "<node id>/<nonce>" (node id: the
 * configured one, or "<host>:<pid>"). The nonce is PAWL_NONCE_LEN hex digits of getrandom, new
 * for every processor, so two processes started with the same --node-id (one environment file
 * shared by a deployment) are two nodes, each with its own claims and fair share: a claim is
 * "already ours" only for the object that took it. '/' never occurs in a node id, so the
 * configured part is everything before the last '/'. The cost: a restarted process is a new
 * node, and its predecessor's claims wait for the claim timeout like any dead node's.
 */
static void node_identity(char *out, size_t len, const char *node_id)
{
    char base[PAWL_OWNER_MAX + 1];
    if (node_id) {
        snprintf(base, sizeof base, "%s", node_id);
    } else {
        char host[40] = "host";
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = '\0';
        for (char *c = host; *c; c++)
            if (!name_ok((char[]){*c, 0}, 1))
                *c = '_';
        snprintf(base, sizeof base, "%.40s:%ld", host, (long)getpid());
    }
    unsigned char r[PAWL_NONCE_LEN / 2];
    size_t got = 0;
    while (got < sizeof r) {
        ssize_t k = getrandom(r + got, sizeof r - got, 0);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    if (got < sizeof r) {
        /* No getrandom (an old kernel, a seccomp filter): mix the clock, pid and address. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                     ((uint64_t)getpid() << 16) ^ (uint64_t)(uintptr_t)out;
        for (size_t i = 0; i < sizeof r; i++) {
            x ^= x >> 33;
            x *= 0xff51afd7ed558ccdULL;
            x ^= x >> 29;
            r[i] = (unsigned char)x;
        }
    }
    char hex[PAWL_NONCE_LEN + 1];
    for (size_t i = 0; i < sizeof r; i++)
        snprintf(hex + 2 * i, 3, "%02x", r[i]);
    snprintf(out, len, "%s/%s", base, hex);
}

/* Everything pawl_processor_new acquires, in reverse: its unwind and pawl_processor_free (after
 * the stop) in one place. Works on a processor whose construction stopped half-way (the fields
 * not reached are NULL). Nothing waits on the timers any more when it runs. */
static void release(struct pawl_processor *p)
{
    pawl_free(p->backoffs);
    pawl_free(p->att);
    pawl_free(p->lut);
    pawl_event_batch_fini(&p->readbuf);
    pawl_timers_free(p->timers);
    pthread_cond_destroy(&p->ecv);
    pthread_mutex_destroy(&p->emu);
    pthread_mutex_destroy(&p->dispatch_mu);
    pthread_cond_destroy(&p->admin_cv);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    pawl_pool_free(p->pool);
    pawl_free(p->units);
    pawl_free(p->h);
    pawl_free(p);
}

int pawl_processor_new(struct pawl_processor **out, const struct pawl_processor_opts *opts,
                       struct pawl_source *source, struct pawl_tokens *tokens,
                       const struct pawl_handler *handlers, size_t n)
{
    *out = NULL;
    if (opts == NULL || source == NULL || tokens == NULL || handlers == NULL || n == 0)
        return PAWL_EINVAL;
    int rc = check_opts(opts);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++)
        if (handlers[i].handle == NULL)
            return PAWL_EINVAL;
    if (opts->dead_letter_attempts > 0 &&
        (tokens->ops->dl_segment == NULL || tokens->ops->dl_show == NULL ||
         tokens->ops->dl_retry_failed == NULL)) {
        PAWL_ERROR(MOD,
                   "%s: dead_letter_attempts = %u needs a token store with dead letters "
                   "(PostgreSQL)",
                   opts->name, opts->dead_letter_attempts);
        return PAWL_ENOTSUP;
    }
    struct pawl_processor *p = pawl_calloc(1, sizeof *p);
    if (p == NULL)
        return PAWL_ENOMEM;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_cond_init(&p->admin_cv, NULL);
    pthread_mutex_init(&p->dispatch_mu, NULL);
    pthread_mutex_init(&p->emu, NULL);
    pthread_cond_init(&p->ecv, NULL);
    pawl_event_batch_init(&p->readbuf);
    p->o = *opts;
    snprintf(p->name, sizeof p->name, "%s", opts->name);
    p->o.name = p->name;
    node_identity(p->node, sizeof p->node, opts->node_id);
    p->o.node_id = p->node;
    p->extend_ms = opts->claim_extend_interval_ms ? opts->claim_extend_interval_ms
                                                  : opts->claim_timeout_ms / 3;
    p->src = source;
    p->tok = tokens;
    p->R = -1;
    p->h = pawl_malloc(n * sizeof *p->h);
    if (p->h == NULL) {
        rc = PAWL_ENOMEM;
        goto fail;
    }
    memcpy(p->h, handlers, n * sizeof *p->h);
    p->nh = n;
    enum pawl_ckpt_mode mode;
    rc = pawl__ckpt_mode_detect(p->name, handlers, n, &mode);
    if (rc) {
        PAWL_ERROR(MOD, "%s: a checkpointing unit lacks on_checkpoint_advanced", p->name);
        goto fail;
    }
    p->mode = (int)mode;
    if (mode != PAWL_CKPT_PLAIN) {
        p->units = pawl_calloc(n, sizeof *p->units);
        if (p->units == NULL) {
            rc = PAWL_ENOMEM;
            goto fail;
        }
        for (size_t i = 0; i < n; i++) {
            if (handlers[i].ckpt == NULL)
                continue;
            p->units[p->nunits].name = handlers[i].name ? handlers[i].name : "?";
            p->units[p->nunits].self = handlers[i].self;
            p->units[p->nunits].ckpt = handlers[i].ckpt;
            p->nunits++;
        }
        /* The units' future continuations are tiny tasks; timers bound their futures. */
        struct pawl_pool_opts po;
        pawl_pool_opts_defaults(&po);
        po.workers = 1;
        po.name = "pawl-ckpt";
        rc = pawl_pool_new(&p->pool, &po);
        if (rc)
            goto fail;
        struct pawl_timers_opts to;
        pawl_timers_opts_defaults(&to);
        to.backend = (enum pawl_timer_backend)opts->timer_backend;
        to.require_io_uring = opts->require_io_uring;
        rc = pawl_timers_new(&p->timers, p->pool, &to);
        if (rc)
            goto fail;
    }
    if (p->timers == NULL) {
        /* Plain mode: timers only for the coordinator's and the extender's timed waits. */
        struct pawl_timers_opts to;
        pawl_timers_opts_defaults(&to);
        to.backend = (enum pawl_timer_backend)opts->timer_backend;
        to.require_io_uring = opts->require_io_uring;
        rc = pawl_timers_new(&p->timers, NULL, &to);
        if (rc)
            goto fail;
    }
    /* The filter is part of the processor's definition: recorded by the first node, and the
     * same for every node after it (before the segments exist, so that two first nodes with
     * different filters cannot both create it). */
    const char *fj = source->ops->filter ? source->ops->filter(source) : NULL;
    if (tokens->ops->filter) {
        char recorded[4096];
        rc = tokens->ops->filter(tokens, p->name, fj ? fj : "{}", recorded, sizeof recorded);
        if (rc && rc != PAWL_EFILTER) {
            PAWL_ERROR(MOD, "%s: recording its filter failed: %s", p->name,
                       tokens->ops->errmsg(tokens));
            goto fail;
        }
        if (rc == PAWL_EFILTER) {
            PAWL_DEBUG(MOD,
                       "%s was created with filter %s; refusing to run it with filter %s (to "
                       "change a processor's filter, reset it with the new filter: pawl reset "
                       "%s --to POSITION plus the filter flags, or use a new processor name)",
                       p->name, strcmp(recorded, "{}") == 0 ? "none (every event)" : recorded,
                       fj ? fj : "none (every event)", p->name);
            goto fail;
        }
    } else if (fj) {
        PAWL_ERROR(MOD, "%s: the token store cannot record a filter, and the source has one",
                   p->name);
        rc = PAWL_ENOTSUP;
        goto fail;
    }
    rc = tokens->ops->init(tokens, p->name, opts->segments, opts->initial_token);
    if (rc) {
        PAWL_ERROR(MOD, "%s: initialising segments failed: %s", p->name,
                   tokens->ops->errmsg(tokens));
        goto fail;
    }
    *out = p;
    return 0;

fail:
    release(p);
    return rc;
}

int pawl_processor_start(struct pawl_processor *p)
{
    pthread_mutex_lock(&p->mu);
    if (p->started) {
        pthread_mutex_unlock(&p->mu);
        return PAWL_EALREADY;
    }
    p->started = 1;
    pthread_mutex_unlock(&p->mu);
    struct pawl_pool_opts po;
    pawl_pool_opts_defaults(&po);
    po.workers = (int)p->o.threads;
    po.name = "pawl-seg";
    if (pawl_pool_new(&p->seg_pool, &po) != 0)
        goto fail;
    /* Announce ourselves before the first claim cycle, so fair shares count this node. */
    p->tok->ops->extend(p->tok, p->name, p->node, NULL, 0, NULL);
    if (pthread_create(&p->extend_thread, NULL, extend_main, p) != 0)
        goto fail;
    if (pthread_create(&p->coord_thread, NULL, coord_main, p) != 0) {
        pthread_mutex_lock(&p->emu);
        p->stopped = 1;
        pthread_cond_broadcast(&p->ecv);
        pthread_mutex_unlock(&p->emu);
        pthread_join(p->extend_thread, NULL);
        goto fail;
    }
    PAWL_INFO(MOD, "%s: started as %s (%d threads, batch %u)", p->name, p->node,
              pawl_pool_workers(p->seg_pool), p->o.batch_size);
    return 0;
fail:
    pawl_pool_free(p->seg_pool);
    p->seg_pool = NULL;
    p->stopped = 1;
    return PAWL_ESYS;
}

int pawl_processor_stop(struct pawl_processor *p)
{
    pthread_mutex_lock(&p->mu);
    if (!p->started || p->stopping) {
        pthread_mutex_unlock(&p->mu);
        return 0;
    }
    p->stopping = 1;
    /* Every package releases from now on, not from when the coordinator notices: it may be in
     * a read or a claim cycle, which waits out an absent database (the coordinator asks again,
     * and asks the packages it claims before it notices). */
    for (struct pkg *k = p->pkgs; k; k = k->next)
        request_release(k);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->stopped) /* start failed half-way */
        return 0;
    pthread_join(p->coord_thread, NULL);
    pthread_mutex_lock(&p->emu);
    p->stopped = 1;
    pthread_cond_broadcast(&p->ecv);
    pthread_mutex_unlock(&p->emu);
    pthread_join(p->extend_thread, NULL);
    /* Every package has finished (the coordinator waited for their release cycles), so no
     * step is queued: this joins idle workers. Its counters are kept for pawl_processor_stats. */
    pthread_mutex_lock(&p->mu);
    struct pawl_pool *sp = p->seg_pool;
    pawl_pool_stats(sp, &p->seg_final);
    p->seg_pool = NULL;
    pthread_mutex_unlock(&p->mu);
    pawl_pool_free(sp);
    p->tok->ops->leave(p->tok, p->name, p->node);
    uint64_t failed = atomic_load_explicit(&p->st_release_failed, memory_order_relaxed);
    if (failed == 0)
        PAWL_INFO(MOD, "%s: stopped; every claim released", p->name);
    else
        PAWL_WARN(MOD,
                  "%s: stopped; %llu release%s not confirmed by the token store: those claims "
                  "stay until they expire (claim_timeout_ms = %u)",
                  p->name, (unsigned long long)failed, failed == 1 ? " was" : "s were",
                  p->o.claim_timeout_ms);
    return 0;
}

void pawl_processor_free(struct pawl_processor *p)
{
    if (p == NULL)
        return;
    pawl_processor_stop(p);
    /* Every package is done (stop waited for their release cycles): nothing is queued. */
    release(p);
}

void pawl_processor_stats(struct pawl_processor *p, struct pawl_processor_stats *s)
{
    memset(s, 0, sizeof *s);
    /* Relaxed reads: each counter is independent and approximate while running. */
    s->events = atomic_load_explicit(&p->st_events, memory_order_relaxed);
    s->batches = atomic_load_explicit(&p->st_batches, memory_order_relaxed);
    s->batch_failures = atomic_load_explicit(&p->st_failures, memory_order_relaxed);
    s->claims = atomic_load_explicit(&p->st_claims, memory_order_relaxed);
    s->releases = atomic_load_explicit(&p->st_releases, memory_order_relaxed);
    s->claims_lost = atomic_load_explicit(&p->st_lost, memory_order_relaxed);
    s->source_errors = atomic_load_explicit(&p->st_source_errors, memory_order_relaxed);
    s->segments_owned = atomic_load_explicit(&p->st_owned, memory_order_relaxed);
    s->mode = p->mode;
    struct pawl_pool_stats ps;
    pthread_mutex_lock(&p->mu);
    if (p->seg_pool)
        pawl_pool_stats(p->seg_pool, &ps);
    else
        ps = p->seg_final;
    pthread_mutex_unlock(&p->mu);
    s->steps = ps.executed;
    s->steps_stolen = ps.steals;
    s->steps_kept = ps.kept;
    s->letters_parked = atomic_load_explicit(&p->st_letters, memory_order_relaxed);
    s->streams_parked = atomic_load_explicit(&p->st_dead_streams, memory_order_relaxed);
    s->letters_retried = atomic_load_explicit(&p->st_retried, memory_order_relaxed);
    int64_t now = atomic_load_explicit(&p->st_parked_now, memory_order_relaxed);
    s->parked_streams = now > 0 ? (uint32_t)now : 0;
    s->releases_failed = atomic_load_explicit(&p->st_release_failed, memory_order_relaxed);
}

size_t pawl_processor_activity(struct pawl_processor *p, struct pawl_segment_activity *out,
                               size_t max)
{
    size_t n = 0;
    /* Under p->mu the package list is stable (the coordinator changes it under the lock, and
     * frees a package only after unlinking it). */
    pthread_mutex_lock(&p->mu);
    for (struct pkg *k = p->pkgs; k; k = k->next) {
        pthread_mutex_lock(&k->mu);
        int held = k->state == PKG_RUN;
        pthread_mutex_unlock(&k->mu);
        if (!held)
            continue;
        if (n < max) {
            /* Relaxed: a report (see processor_int.h). */
            out[n].seg = k->seg;
            out[n].doing =
                (enum pawl_segment_doing)atomic_load_explicit(&k->doing, memory_order_relaxed);
            out[n].since_ns = atomic_load_explicit(&k->doing_since_ns, memory_order_relaxed);
            out[n].releasing = atomic_load_explicit(&k->release_req, memory_order_relaxed) ||
                               atomic_load_explicit(&k->releasing, memory_order_relaxed);
        }
        n++;
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

const char *pawl_processor_node_id(const struct pawl_processor *p)
{
    return p->node;
}

static int admin(struct pawl_processor *p, int op, uint32_t seg_id)
{
    struct pawl_tokens *t = p->tok;
    pthread_mutex_lock(&p->mu);
    if (!p->started || p->stopping) {
        pthread_mutex_unlock(&p->mu);
        return op == ADMIN_SPLIT ? t->ops->split(t, p->name, seg_id, p->node)
                                 : t->ops->merge(t, p->name, seg_id, p->node);
    }
    while (p->admin_op != ADMIN_NONE)
        pthread_cond_wait(&p->admin_cv, &p->mu);
    p->admin_op = op;
    p->admin_seg = seg_id;
    p->admin_sib = seg_id;
    p->admin_done = 0;
    if (op == ADMIN_MERGE) {
        /* Find the sibling's id from the store's view of the segment. */
        struct pawl_segment_status *rows = NULL;
        size_t n = 0;
        if (t->ops->list(t, p->name, &rows, &n) == 0) {
            for (size_t i = 0; i < n; i++) {
                struct pawl_segment sib;
                if (rows[i].seg.id == seg_id && pawl_segment_sibling(rows[i].seg, &sib) == 0)
                    p->admin_sib = sib.id;
            }
            pawl_tokens_rows_free(rows);
        }
    }
    pthread_cond_broadcast(&p->cv);
    while (!p->admin_done)
        pthread_cond_wait(&p->admin_cv, &p->mu);
    int rc = p->admin_rc;
    p->admin_op = ADMIN_NONE;
    pthread_cond_broadcast(&p->admin_cv);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int pawl_processor_split(struct pawl_processor *p, uint32_t seg_id)
{
    return admin(p, ADMIN_SPLIT, seg_id);
}

int pawl_processor_merge(struct pawl_processor *p, uint32_t seg_id)
{
    return admin(p, ADMIN_MERGE, seg_id);
}

/* ---------------------------------------------------------------------------------------------
 * Administration and the subscribing processor
 * ------------------------------------------------------------------------------------------ */

int pawl_processor_reset(struct pawl_tokens *tokens, struct pawl_source *source, const char *proc,
                         enum pawl_reset_kind kind, int64_t value, int64_t *token_out)
{
    if (tokens == NULL || !name_ok(proc, PAWL_NAME_MAX))
        return PAWL_EINVAL;
    int64_t token = 0;
    int rc = 0;
    switch (kind) {
    case PAWL_RESET_START:
        token = PAWL_TOKEN_START;
        break;
    case PAWL_RESET_END:
        if (source == NULL)
            return PAWL_EINVAL;
        rc = source->ops->head(source, &token);
        break;
    case PAWL_RESET_INDEX:
        if (value < 0)
            return PAWL_ERANGE;
        token = value;
        break;
    case PAWL_RESET_TIME:
        if (source == NULL)
            return PAWL_EINVAL;
        rc = source->ops->index_at(source, value, &token);
        break;
    default:
        return PAWL_EINVAL;
    }
    if (rc)
        return rc;
    rc = tokens->ops->reset(tokens, proc, token);
    if (rc == 0 && token_out)
        *token_out = token;
    return rc;
}

struct pawl_subscriber {
    struct pawl_handler *h;
    size_t n;
};

int pawl_subscriber_new(struct pawl_subscriber **out, const struct pawl_handler *handlers, size_t n)
{
    *out = NULL;
    if (handlers == NULL || n == 0)
        return PAWL_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (handlers[i].handle == NULL)
            return PAWL_EINVAL;
    struct pawl_subscriber *s = pawl_calloc(1, sizeof *s);
    if (s == NULL)
        return PAWL_ENOMEM;
    s->h = pawl_malloc(n * sizeof *s->h);
    if (s->h == NULL) {
        pawl_free(s);
        return PAWL_ENOMEM;
    }
    memcpy(s->h, handlers, n * sizeof *s->h);
    s->n = n;
    *out = s;
    return 0;
}

void pawl_subscriber_free(struct pawl_subscriber *s)
{
    if (s == NULL)
        return;
    pawl_free(s->h);
    pawl_free(s);
}

int pawl_subscriber_publish(struct pawl_subscriber *s, const struct pawl_event *events, size_t n,
                            struct pawl_txn *txn)
{
    for (size_t i = 0; i < n; i++) {
        /* No segments here: the whole hash space is one segment (0, 0). */
        struct pawl_event_ctx ctx = {
            .ev = &events[i], .seg = {0, 0}, .replay = 0, .txn = txn, .trigger = NULL, .pos = i};
        for (size_t k = 0; k < s->n; k++) {
            int rc = s->h[k].handle(s->h[k].self, &ctx);
            if (rc)
                return rc < 0 ? rc : PAWL_EHANDLER;
        }
    }
    return 0;
}
