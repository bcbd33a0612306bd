/*
 * processor.c — the processor's construction and administration: its options (defaults and
 * checks), pawl_processor_new in named steps and release(), which unwinds it; start (the segment
 * pool, then the extender and coordinator threads), stop and free; the stats and activity
 * reports; split and merge requests (served by the coordinator); pawl_processor_reset; and the
 * subscribing processor. Threads, as pawl/processor.h says: new, start, stop and free from one
 * controlling thread (never a handler); stats, activity, split and merge from any thread except
 * a handler; reset and the subscriber from any thread. The processor's design, its threads and
 * its lock order are described in processor_int.h.
 */
#include "processor_int.h"

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

/*
 * pawl_processor_new's steps, in order. Each returns 0 or the PAWL_E* code the constructor
 * returns; what a step acquired before failing is left on p for release().
 */

/* The arguments and the options, before anything is allocated. */
static int args_check(const struct pawl_processor_opts *opts, struct pawl_source *source,
                      struct pawl_tokens *tokens, const struct pawl_handler *handlers, size_t n)
{
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
    return 0;
}

/* The processor object with its locks, its copy of the options, its name and its node
 * identity; NULL when out of memory. */
static struct pawl_processor *processor_alloc(const struct pawl_processor_opts *opts,
                                              struct pawl_source *source,
                                              struct pawl_tokens *tokens)
{
    struct pawl_processor *p = pawl_calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
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
    return p;
}

/* Copy the handlers, find the checkpoint mode they ask for and, in a checkpoint mode, list the
 * units (the handlers with checkpoint callbacks). */
static int handlers_copy(struct pawl_processor *p, const struct pawl_handler *handlers, size_t n)
{
    p->h = pawl_malloc(n * sizeof *p->h);
    if (p->h == NULL)
        return PAWL_ENOMEM;
    memcpy(p->h, handlers, n * sizeof *p->h);
    p->nh = n;
    enum pawl_ckpt_mode mode;
    int rc = pawl__ckpt_mode_detect(p->name, handlers, n, &mode);
    if (rc) {
        PAWL_ERROR(MOD, "%s: a checkpointing unit lacks on_checkpoint_advanced", p->name);
        return rc;
    }
    p->mode = (int)mode;
    if (mode == PAWL_CKPT_PLAIN)
        return 0;
    p->units = pawl_calloc(n, sizeof *p->units);
    if (p->units == NULL)
        return PAWL_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        if (handlers[i].ckpt == NULL)
            continue;
        p->units[p->nunits].name = handlers[i].name ? handlers[i].name : "?";
        p->units[p->nunits].self = handlers[i].self;
        p->units[p->nunits].ckpt = handlers[i].ckpt;
        p->nunits++;
    }
    return 0;
}

/* The timers. In a checkpoint mode they run on a one-worker pool of their own, with the units'
 * future continuations (tiny tasks; timers bound their futures); in plain mode they have no
 * pool and serve only the coordinator's and the extender's timed waits. */
static int timers_start(struct pawl_processor *p)
{
    if (p->mode != PAWL_CKPT_PLAIN) {
        struct pawl_pool_opts po;
        pawl_pool_opts_defaults(&po);
        po.workers = 1;
        po.name = "pawl-ckpt";
        int rc = pawl_pool_new(&p->pool, &po);
        if (rc)
            return rc;
    }
    struct pawl_timers_opts to;
    pawl_timers_opts_defaults(&to);
    to.backend = (enum pawl_timer_backend)p->o.timer_backend;
    to.require_io_uring = p->o.require_io_uring;
    return pawl_timers_new(&p->timers, p->pool, &to);
}

/* The filter is part of the processor's definition: recorded by the first node, and the same
 * for every node after it (before the segments exist, so that two first nodes with different
 * filters cannot both create it). */
static int filter_record(struct pawl_processor *p)
{
    struct pawl_source *source = p->src;
    struct pawl_tokens *tokens = p->tok;
    const char *fj = source->ops->filter ? source->ops->filter(source) : NULL;
    if (tokens->ops->filter) {
        char recorded[4096];
        int rc = tokens->ops->filter(tokens, p->name, fj ? fj : "{}", recorded, sizeof recorded);
        if (rc && rc != PAWL_EFILTER) {
            PAWL_ERROR(MOD, "%s: recording its filter failed: %s", p->name,
                       tokens->ops->errmsg(tokens));
            return rc;
        }
        if (rc == PAWL_EFILTER) {
            PAWL_DEBUG(MOD,
                       "%s was created with filter %s; refusing to run it with filter %s (to "
                       "change a processor's filter, reset it with the new filter: pawl reset "
                       "%s --to POSITION plus the filter flags, or use a new processor name)",
                       p->name, strcmp(recorded, "{}") == 0 ? "none (every event)" : recorded,
                       fj ? fj : "none (every event)", p->name);
            return rc;
        }
    } else if (fj) {
        PAWL_ERROR(MOD, "%s: the token store cannot record a filter, and the source has one",
                   p->name);
        return PAWL_ENOTSUP;
    }
    return 0;
}

/* The processor's segments in the token store (created by the first node). */
static int segments_init(struct pawl_processor *p)
{
    int rc = p->tok->ops->init(p->tok, p->name, p->o.segments, p->o.initial_token);
    if (rc)
        PAWL_ERROR(MOD, "%s: initialising segments failed: %s", p->name,
                   p->tok->ops->errmsg(p->tok));
    return rc;
}

int pawl_processor_new(struct pawl_processor **out, const struct pawl_processor_opts *opts,
                       struct pawl_source *source, struct pawl_tokens *tokens,
                       const struct pawl_handler *handlers, size_t n)
{
    *out = NULL;
    int rc = args_check(opts, source, tokens, handlers, n);
    if (rc)
        return rc;
    struct pawl_processor *p = processor_alloc(opts, source, tokens);
    if (p == NULL)
        return PAWL_ENOMEM;
    rc = handlers_copy(p, handlers, n);
    if (rc)
        goto fail;
    rc = timers_start(p);
    if (rc)
        goto fail;
    rc = filter_record(p);
    if (rc)
        goto fail;
    rc = segments_init(p);
    if (rc)
        goto fail;
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
    if (pthread_create(&p->extend_thread, NULL, pawl__extender_main, p) != 0)
        goto fail;
    if (pthread_create(&p->coord_thread, NULL, pawl__coordinator_main, p) != 0) {
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
        pawl_pkg_request_release(k);
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
