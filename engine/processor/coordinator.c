/*
 * coordinator.c — the processor's coordinator thread (pawl__coordinator_main, started by
 * pawl_processor_start): the claim cycle (claim up to this node's fair share, release the
 * surplus, highest segment ids first), the shared reader (read after R, dispatch each event to
 * the package of its segment, hold back or detach a package whose inbox is full), reaping
 * finished packages and their back-off, and serving split/merge requests once none of their
 * segments is held here. Everything here runs on the coordinator thread (PAWL_ASSERT_COORD), which
 * owns the package list (changed under p->mu); each function says which lock it expects.
 */
#include "processor_int.h"

#include "metrics.h"
#include "segment.h"
#include "timers.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#define MOD "processor"

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
            pawl_pkg_request_release(best);
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
        int skip = p->stopping || pawl_pkg_find(p, r->seg.id) || in_backoff(p, r->seg.id, now) ||
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
                pawl_pkg_request_release(k);
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

void *pawl__coordinator_main(void *arg)
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
                    pawl_pkg_request_release(k);
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
