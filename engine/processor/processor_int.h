/*
 * processor_int.h — the pooled streaming processor (engine/processor/): struct pawl_processor,
 * the work package (struct pkg) and what the processor's files share. Never installed.
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
 *
 * The files, lowest first; each calls only the ones before it:
 *   dead_letters.c  the dead-letter tables and their administration
 *   package.c       work packages: their steps on the segment pool, the event context
 *   coordinator.c   the coordinator thread: claim cycle, reading and dispatch, reaping and
 *                   back-off, serving split/merge requests
 *   extender.c      the claim extender thread
 *   processor.c     options, construction (pawl_processor_new in named steps), start, stop,
 *                   free, stats, split/merge requests, reset, the subscribing processor
 * Every field below says which thread may touch it and under which lock.
 */
#ifndef PAWL_ENGINE_PROCESSOR_INT_H
#define PAWL_ENGINE_PROCESSOR_INT_H

#include "common.h"
#include "reconcile.h"

#include "pawl/processor.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

enum pkg_state { PKG_RUN = 0, PKG_DONE = 1 };

/* A step's result besides 0 and the PAWL_E* codes: handle the batch again at once (an event was
 * parked, or a unit named the event it failed). */
#define PKG_RERUN 1

/* What a package is waiting for between steps (checkpoint modes only). */
enum pkg_phase {
    PH_NONE = 0,    /* handling events */
    PH_CKPT = 1,    /* a checkpoint cycle waits for futures; the batch transaction is open */
    PH_RELEASE = 2, /* a release cycle waits for futures */
    PH_RETRY = 3,   /* a dead-letter retry waits for the units to confirm the letters; its
                       transaction (rtxn) is open */
};

struct pkg {
    struct pawl_processor *p;
    struct pawl_segment seg;

    /* Worker-only (one step at a time). */
    int64_t token;      /* stored token */
    int64_t consumed;   /* everything of the segment up to here has been handled */
    int64_t high_water; /* at claim time: events at or below it are replays */
    int has_merge;
    struct pawl_segment merge_seg;
    int64_t merge_token;
    struct pawl_event_batch work;
    size_t work_pos;
    int64_t work_end; /* queued_pos when work was taken: complete up to here once drained */
    struct pawl_event_batch readbuf;
    int64_t last_store_ns;
    uint64_t unstored; /* this segment's events passed since the token was last stored */
    int had_success;

    /* Checkpoint protocol (worker-only; NULL / unused in plain mode). */
    struct pawl_trigger *trigger;
    struct pawl_reconcile rec;
    int rec_ready;          /* rec initialised and on_segment_claimed accepted */
    int phase;              /* enum pkg_phase */
    struct pawl_txn *ptxn;  /* PH_CKPT: the open batch transaction */
    size_t pn;              /* PH_CKPT: events of the parked batch (to move past on success) */
    size_t phandled;        /* PH_CKPT: of which handled (not skipped) */
    int64_t pend;           /* PH_CKPT: the parked batch's end */
    int plazy;              /* PH_CKPT: the agreed position may wait until due (see ckpt_commit) */
    int prc;                /* PH_RELEASE: the result to finish with */
    int64_t batch_start_ns; /* the current batch's first handler call */
    int64_t ckpt_start_ns;  /* the current checkpoint cycle's start */

    /* Dead letters (worker-only; unused without a policy). The streams of the segment that
     * are parked, each with its first letter's index: an event of such a stream at or after
     * that index is parked behind it. Loaded at the first step, refreshed every claim_poll_ms
     * while non-empty (retry requests, drops). */
    struct dl_stream *parked;
    size_t nparked, parked_cap;
    int dl_loaded;
    int64_t dl_checked_ns;
    size_t batch_letters;     /* letters queued in the open batch */
    size_t batch_new_streams; /* of which first letters of a stream */
    size_t batch_parked0;     /* nparked when the open batch began: later entries are its own */
    char errbuf[1024];        /* the failing handler's pawl_ctx_error text */
    char lasterr[1200];       /* the last handler failure, for the letter */
    /* A unit named an event it failed, below the policy (or without one): the next batch ends
     * just before dl_cut, then the segment fails with dl_cut_rc (release, back-off) and the
     * event is tried again. */
    int64_t dl_cut;
    int dl_cut_rc;
    /* PH_RETRY: the retry transaction and the stream's letters (rrows[0..rn), owned). */
    struct pawl_txn *rtxn;
    struct pawl_dead_letter *rrows;
    size_t rn;

    /* Shared with the coordinator, under mu. */
    pthread_mutex_t mu;
    struct pawl_event_batch inbox;
    int64_t queued_pos;
    int attached;
    int64_t full_since_ns; /* when the coordinator first found the inbox full; 0 = has room */
    int scheduled;
    int state;
    int woken; /* the reconciler's wake arrived: resume at the next step */
    /* A unit's word on the checkpoint it is failing (pawl_processor_event_failed): the event
     * that failed (0: none), its code and why. Cleared when a cycle starts, taken when one
     * fails. */
    int64_t blame_index;
    int blame_code;
    char blame_why[512];

    /* Set by other threads; read by the worker at each step. */
    _Atomic int release_req;
    _Atomic int lost;

    /* What the package is doing (enum pawl_segment_doing) and since when, for
     * pawl_processor_activity: written by its step, read by any thread under p->mu. Relaxed:
     * a report for operators; nothing is ordered by it. */
    _Atomic int doing;
    _Atomic int64_t doing_since_ns;
    _Atomic int releasing; /* its release has begun (asked, or after a failure) */
    /* Worker-only: the token store's text of the failure this step met (its errmsg is the last
     * failure of any thread, so it is taken at once), for the message that reports it. */
    char storeerr[512];

    /* Coordinator-only (read by the extender under p->mu). */
    struct pkg *next;
    uint64_t gen; /* claim generation: tells this claim from a later one of the same segment */
    int failed;
    int fail_rc;
    int kicked; /* the last dispatch gave it events or detached it: schedule it */

    /* The pool task that runs this package's next step (queued at most once: `scheduled`). */
    struct pawl_task step;
    /* Link in the processor's done list (under p->mu). */
    struct pkg *run_next;
};

/* A parked stream in a package's table. */
struct dl_stream {
    uint32_t hash;
    int64_t first; /* its first letter's index */
    char *id;
};

/* An event that failed (dead-letter policy): its attempts so far, across re-claims. */
struct dl_attempt {
    int64_t index;
    uint32_t hash; /* of its stream: the entry belongs to the segment that contains it */
    uint32_t attempts;
    int poison;
    int64_t first_us;
    char first_err[512];
    char last_err[512];
};

struct backoff {
    uint32_t seg_id;
    int64_t retry_at_ns;
    int64_t delay_ms;
    int armed; /* the package that followed had no successful batch yet */
};

enum admin_op { ADMIN_NONE = 0, ADMIN_SPLIT = 1, ADMIN_MERGE = 2 };

struct pawl_processor {
    struct pawl_processor_opts o;
    char name[PAWL_NAME_MAX + 1];
    char node[PAWL_INSTANCE_MAX + 1];
    struct pawl_source *src;
    struct pawl_tokens *tok;
    struct pawl_handler *h;
    size_t nh;
    int mode; /* enum pawl_ckpt_mode */
    int64_t extend_ms;
    /* Checkpoint modes: the units, and the runtime pool and timers their continuations and
     * time-outs run on (package steps themselves run on seg_pool below). The timers exist in
     * plain mode too (without a pool): the coordinator's and the extender's timed waits. */
    struct pawl_ckpt_unit *units;
    size_t nunits;
    struct pawl_pool *pool;
    struct pawl_timers *timers;

    pthread_mutex_t mu; /* started/stopping, pkgs list membership, done list, admin, backoffs */
    pthread_cond_t cv;  /* coordinator wake-ups (done packages, admin, room in inboxes) */
    pthread_cond_t admin_cv;
    struct pkg *pkgs; /* coordinator's list (membership changes under mu) */
    struct pkg *done; /* finished packages waiting to be reaped */
    uint64_t gen;     /* claim generations handed out */
    int started;
    int stopping;
    int stopped;
    struct backoff *backoffs;
    size_t nbackoffs, backoffs_cap;
    int admin_op;
    uint32_t admin_seg;
    uint32_t admin_sib;
    int admin_rc;
    int admin_done;
    int room; /* a package drained below half its read-ahead since the coordinator last looked */

    pthread_mutex_t dispatch_mu;
    int64_t R; /* shared reader position; -1 unset */

    /* The segment workers: package steps run as tasks of this work-stealing pool. */
    struct pawl_pool *seg_pool;
    struct pawl_pool_stats seg_final; /* its counters when it was freed (under mu) */

    pthread_t coord_thread, extend_thread;
    uintptr_t coord_tag; /* the coordinator thread's pawl_thread_tag(), for PAWL_ASSERT_COORD */
    pthread_mutex_t emu;
    pthread_cond_t ecv;

    struct pawl_event_batch readbuf; /* coordinator's */
    /* Coordinator: packages by the low bits of the stream hash, rebuilt when the list changes. */
    struct pkg **lut;
    uint32_t lut_mask;
    int lut_partial; /* some segment is finer than the table: scan when a slot misses */
    uint64_t lut_version, pkgs_version;

    _Atomic uint64_t st_events, st_batches, st_failures, st_claims, st_releases, st_lost,
        st_source_errors, st_release_failed;
    _Atomic uint32_t st_owned;

    /* Dead letters: failed events' attempts (under mu; natt read without it as a hint). */
    struct dl_attempt *att;
    size_t att_cap;
    _Atomic size_t natt;
    _Atomic uint64_t st_letters, st_dead_streams, st_retried;
    _Atomic int64_t st_parked_now;
};

/* What a handler sees (opaque in the API); on the stack of the step or of the subscriber. */
struct pawl_event_ctx {
    const struct pawl_event *ev;
    struct pawl_segment seg;
    int replay;
    struct pawl_txn *txn;
    struct pawl_trigger *trigger;
    size_t pos;
    char *errbuf; /* pawl_ctx_error's target (the package's), or NULL */
    size_t errlen;
    int dead_letter;
};

/* The calling thread is p's coordinator (the owner of the "coordinator-only" fields). */
#define PAWL_ASSERT_COORD(p) PAWL_ASSERT(pawl_thread_tag() == (p)->coord_tag)

/* How long a full inbox holds the shared reader back before its package is detached. */
#define PAWL_DETACH_AFTER_NS (50 * 1000000LL)

/* Under k->mu: the inbox is below half its read-ahead (the reader may feed it again). */
static inline int pawl_pkg_has_room(const struct pawl_processor *p, struct pkg *k)
{
    PAWL_ASSERT(pawl_mutex_locked(&k->mu));
    return k->inbox.n < p->o.read_ahead / 2 + 1 && k->inbox._used < p->o.read_ahead_bytes / 2;
}

/* Copy src into dst (size n > 0), cut to fit and always terminated. */
static inline void copy_str(char *dst, size_t n, const char *src)
{
    size_t len = strlen(src);
    if (len >= n)
        len = n - 1;
    memcpy(dst, src, len);
    dst[len] = '\0';
}

/* package.c: a package for a freshly claimed row (NULL when out of memory), and its end. */
struct pkg *pawl__pkg_new(struct pawl_processor *p, const struct pawl_segment_status *row);
void pawl__pkg_free(struct pkg *k);
/* package.c: queue k's next step unless one is queued or running. Any thread. */
void pawl__pkg_schedule(struct pkg *k);
/* package.c: pawl__pkg_schedule for a list of packages in one submission. Coordinator only. */
void pawl__pkg_schedule_list(struct pawl_processor *p, struct pkg *first, int kicked_only);

/* The package of segment seg_id in p's list, or NULL. The coordinator, or under p->mu. */
static inline struct pkg *pawl_pkg_find(struct pawl_processor *p, uint32_t seg_id)
{
    for (struct pkg *k = p->pkgs; k; k = k->next)
        if (k->seg.id == seg_id)
            return k;
    return NULL;
}

/* Ask k to release its claim, and queue its next step to do so. Any thread. */
static inline void pawl_pkg_request_release(struct pkg *k)
{
    atomic_store_explicit(&k->release_req, 1, memory_order_relaxed);
    pawl__pkg_schedule(k);
}

/* coordinator.c: the coordinator thread's body (arg: the processor), until the stop. */
void *pawl__coordinator_main(void *arg);
/* extender.c: the claim extender thread's body (arg: the processor), until p->stopped. */
void *pawl__extender_main(void *arg);

#endif
