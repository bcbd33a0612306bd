/*
 * dead_letters.c — the dead-letter policy's bookkeeping (pawl/processor.h) and the
 * administration of parked streams through the token store.
 *
 * A stream is parked when one of its events fails more often than dead_letter_attempts (or is
 * poison): that event and every later event of the stream go to the token store as letters, in
 * the batch's transaction, instead of to the handlers, until an operator retries or drops the
 * stream. Two tables say what is parked and what is failing:
 *   - each package keeps the parked streams of its segment (k->parked, each with its first
 *     letter's index), owned by the package's step; the streams a batch added are dropped again
 *     if the batch rolls back (k->batch_parked0);
 *   - the processor keeps the attempts of failed events (p->att, under p->mu; p->natt is read
 *     without it as a hint), which outlive a package: a re-claimed segment counts on.
 * The package's step (package.c) decides when to consult them; the retry of a stream runs the
 * handlers, so it is a package step too and lives there. This file calls nothing in package.c
 * or the files above it (the list in processor_int.h).
 */
#include "dead_letters.h"

#include "metrics.h"
#include "segment.h"

#include "pawl/checkpoint.h"

#include <string.h>

#define MOD "processor"

/* ---------------------------------------------------------------------------------------------
 * Administration through the token store
 * ------------------------------------------------------------------------------------------ */

int pawl_dead_letters_streams(struct pawl_tokens *tokens, const char *proc,
                              struct pawl_dead_stream **rows, size_t *n)
{
    if (tokens == NULL || proc == NULL || rows == NULL || n == NULL)
        return PAWL_EINVAL;
    if (tokens->ops->dl_list == NULL)
        return PAWL_ENOTSUP;
    return tokens->ops->dl_list(tokens, proc, rows, n);
}

int pawl_dead_letters_show(struct pawl_tokens *tokens, const char *proc, const char *stream,
                           struct pawl_dead_letter **rows, size_t *n)
{
    if (tokens == NULL || proc == NULL || rows == NULL || n == NULL)
        return PAWL_EINVAL;
    if (tokens->ops->dl_show == NULL)
        return PAWL_ENOTSUP;
    return tokens->ops->dl_show(tokens, proc, stream, rows, n);
}

int pawl_dead_letters_retry(struct pawl_tokens *tokens, const char *proc, const char *stream,
                            int64_t *letters)
{
    if (tokens == NULL || proc == NULL || stream == NULL)
        return PAWL_EINVAL;
    if (tokens->ops->dl_retry == NULL)
        return PAWL_ENOTSUP;
    int64_t dummy;
    return tokens->ops->dl_retry(tokens, proc, stream, letters ? letters : &dummy);
}

int pawl_dead_letters_drop(struct pawl_tokens *tokens, const char *proc, const char *stream,
                           int64_t up_to, int64_t *dropped)
{
    if (tokens == NULL || proc == NULL || stream == NULL)
        return PAWL_EINVAL;
    if (up_to < 0)
        return PAWL_ERANGE;
    if (tokens->ops->dl_drop == NULL)
        return PAWL_ENOTSUP;
    int64_t dummy;
    return tokens->ops->dl_drop(tokens, proc, stream, up_to, dropped ? dropped : &dummy);
}

void pawl_dead_letters_free(void *rows)
{
    pawl_free(rows);
}

/* ---------------------------------------------------------------------------------------------
 * The package's parked streams and the processor's attempts
 * ------------------------------------------------------------------------------------------ */

static struct dl_stream *dl_find(struct pkg *k, const char *id, uint32_t h)
{
    for (size_t i = 0; i < k->nparked; i++)
        if (k->parked[i].hash == h && strcmp(k->parked[i].id, id) == 0)
            return &k->parked[i];
    return NULL;
}

static void dl_gauge(struct pkg *k, int64_t delta)
{
    atomic_fetch_add_explicit(&k->p->st_parked_now, delta, memory_order_relaxed);
    pawl_metric_gauge_add(PAWL_G_DEAD_STREAMS, delta);
}

void pawl__dl_clear(struct pkg *k)
{
    for (size_t i = 0; i < k->nparked; i++)
        pawl_free(k->parked[i].id);
    if (k->nparked)
        dl_gauge(k, -(int64_t)k->nparked);
    k->nparked = 0;
}

static int dl_add(struct pkg *k, const char *id, uint32_t h, int64_t first)
{
    if (k->nparked == k->parked_cap) {
        size_t cap = k->parked_cap ? k->parked_cap * 2 : 8;
        struct dl_stream *n = pawl_realloc(k->parked, cap * sizeof *n);
        if (n == NULL)
            return PAWL_ENOMEM;
        k->parked = n;
        k->parked_cap = cap;
    }
    char *copy = pawl__strdup(id);
    if (copy == NULL)
        return PAWL_ENOMEM;
    k->parked[k->nparked++] = (struct dl_stream){h, first, copy};
    dl_gauge(k, 1);
    return 0;
}

static void dl_remove(struct pkg *k, struct dl_stream *d)
{
    pawl_free(d->id);
    *d = k->parked[--k->nparked];
    dl_gauge(k, -1);
}

/* Under p->mu: the attempts entry of event index, or NULL. */
static struct dl_attempt *att_find_locked(struct pawl_processor *p, int64_t index)
{
    PAWL_ASSERT(pawl_mutex_locked(&p->mu));
    size_t n = atomic_load_explicit(&p->natt, memory_order_relaxed);
    for (size_t i = 0; i < n; i++)
        if (p->att[i].index == index)
            return &p->att[i];
    return NULL;
}

/* The batch committed through end: its letters count, and failed events it covered are done. */
void pawl__dl_batch_committed(struct pkg *k, int64_t end)
{
    struct pawl_processor *p = k->p;
    if (k->batch_letters) {
        atomic_fetch_add_explicit(&p->st_letters, k->batch_letters, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->st_dead_streams, k->batch_new_streams, memory_order_relaxed);
        pawl_metric_add(PAWL_M_DEAD_LETTERS, k->batch_letters);
    }
    k->batch_letters = 0;
    k->batch_new_streams = 0;
    if (atomic_load_explicit(&p->natt, memory_order_relaxed) == 0)
        return;
    pthread_mutex_lock(&p->mu);
    size_t n = atomic_load_explicit(&p->natt, memory_order_relaxed);
    for (size_t i = 0; i < n;) {
        if (p->att[i].index <= end && pawl_segment_contains(k->seg, p->att[i].hash))
            p->att[i] = p->att[--n];
        else
            i++;
    }
    atomic_store_explicit(&p->natt, n, memory_order_relaxed);
    pthread_mutex_unlock(&p->mu);
}

/* A handler failed on e with rc (the batch is rolled back): count the attempt. Returns
 * PKG_RERUN when e is to be parked now (handle the batch again at once), else rc. */
int pawl__dl_failed(struct pkg *k, const struct pawl_event *e, int rc)
{
    struct pawl_processor *p = k->p;
    int park = 0;
    pthread_mutex_lock(&p->mu);
    struct dl_attempt *a = att_find_locked(p, e->index);
    size_t n = atomic_load_explicit(&p->natt, memory_order_relaxed);
    if (a == NULL && n == p->att_cap) {
        size_t cap = p->att_cap ? p->att_cap * 2 : 16;
        struct dl_attempt *na = pawl_realloc(p->att, cap * sizeof *na);
        if (na) {
            p->att = na;
            p->att_cap = cap;
        }
    }
    if (a == NULL && n < p->att_cap) {
        a = &p->att[n];
        memset(a, 0, sizeof *a);
        a->index = e->index;
        a->hash = pawl_stream_hash(e->stream_id);
        a->first_us = pawl_wall_us();
        copy_str(a->first_err, sizeof a->first_err, k->lasterr);
        atomic_store_explicit(&p->natt, n + 1, memory_order_relaxed);
    }
    if (a) {
        a->attempts++;
        a->poison |= rc == PAWL_EPOISON;
        copy_str(a->last_err, sizeof a->last_err, k->lasterr);
        park = a->poison || a->attempts >= p->o.dead_letter_attempts;
    }
    pthread_mutex_unlock(&p->mu);
    return park ? PKG_RERUN : rc;
}

/*
 * Before handing e to the handlers: park it if its stream is parked (from its first letter on)
 * or if it failed past the policy. Returns 1 (parked into txn), 0 (handle it), or an error.
 */
int pawl__dl_maybe_park(struct pkg *k, struct pawl_txn *txn, const struct pawl_event *e)
{
    struct pawl_processor *p = k->p;
    struct pawl_dead_letter l;
    memset(&l, 0, sizeof l);
    l.ev = *e;
    l.seg = k->seg;
    l.first_error = "";
    l.last_error = "";
    uint32_t h = 0;
    struct dl_stream *d = NULL;
    if (k->nparked) {
        h = pawl_stream_hash(e->stream_id);
        d = dl_find(k, e->stream_id, h);
    }
    int own = 0;
    struct dl_attempt a;
    if (d && e->index > d->first) {
        l.behind = d->first;
    } else if (d && e->index == d->first) {
        own = 1; /* a replay of the letter itself: parked already, left alone by the store */
    } else if (atomic_load_explicit(&p->natt, memory_order_relaxed)) {
        pthread_mutex_lock(&p->mu);
        struct dl_attempt *f = att_find_locked(p, e->index);
        if (f)
            a = *f;
        pthread_mutex_unlock(&p->mu);
        if (f == NULL || !(a.poison || a.attempts >= p->o.dead_letter_attempts))
            return 0;
        own = 1;
        l.attempts = a.attempts;
        l.first_error = a.first_err;
        l.last_error = a.last_err;
        l.first_failed_us = a.first_us;
    } else {
        return 0;
    }
    if (d == NULL && !k->nparked)
        h = pawl_stream_hash(e->stream_id);
    int rc = txn->ops->park ? txn->ops->park(txn, &l) : PAWL_ENOTSUP;
    if (rc)
        return rc;
    k->batch_letters++;
    if (own && d == NULL) {
        rc = dl_add(k, e->stream_id, h, e->index);
        if (rc)
            return rc;
        k->batch_new_streams++;
        char sid[PAWL_PRINTABLE_SIZE(PAWL_STREAM_ID_MAX)], why[1024];
        PAWL_WARN(MOD, "%s: segment %u: stream %s parked at event %lld after %u attempt%s: %s",
                  p->name, k->seg.id, pawl_printable_str(e->stream_id, sid, sizeof sid),
                  (long long)e->index, l.attempts, l.attempts == 1 ? "" : "s",
                  pawl_printable_str(l.last_error, why, sizeof why));
    }
    for (size_t i = 0; i < p->nunits; i++)
        if (p->units[i].ckpt->on_event_parked)
            p->units[i].ckpt->on_event_parked(p->units[i].self, k->seg, e);
    return 1;
}

/* The open batch rolled back: forget the parked streams it added (their letters went with it;
 * the batch handled again parks them again, with their attempts). */
void pawl__dl_batch_rolled_back(struct pkg *k)
{
    while (k->nparked > k->batch_parked0)
        dl_remove(k, &k->parked[k->nparked - 1]);
}

int pawl__dl_load(struct pkg *k, const struct pawl_dead_stream *rows, size_t n)
{
    pawl__dl_clear(k);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = dl_add(k, rows[i].stream_id, pawl_stream_hash(rows[i].stream_id), rows[i].first_index);
    return rc;
}

void pawl__dl_unparked(struct pkg *k, const char *stream, size_t n)
{
    struct dl_stream *d = dl_find(k, stream, pawl_stream_hash(stream));
    if (d)
        dl_remove(k, d);
    atomic_fetch_add_explicit(&k->p->st_retried, n, memory_order_relaxed);
    pawl_metric_add(PAWL_M_DEAD_LETTERS_RETRIED, n);
}
