/*
 * async_sink.c — example 2: a truly asynchronous handler whose checkpoint is a barrier (see
 * async_sink.h for the design).
 *
 * One mutex (a->mu) guards the job queue and every segment's bookkeeping: it is held only for a
 * few instructions per event. A segment records each event it dispatches in a ring, in dispatch
 * (= index) order, with a done flag; workers finish in any order and set the flag; the ring's
 * head advances over finished entries. The lowest unfinished entry bounds what is delivered
 * without a gap: everything below it is. Futures are completed outside the lock.
 *
 * A released segment's bookkeeping stays allocated until ex_async_free, because jobs still
 * queued or running point at it; they finish normally and their trigger requests are ignored.
 */
#include "async_sink.h"

#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct entry {
    int64_t index;
    bool done;
};

struct waiter {
    int64_t requested;
    struct pawl_future *f;
    struct waiter *next;
};

struct aseg {
    struct pawl_segment seg;
    struct pawl_trigger *trigger; /* our reference, taken at claim */
    bool live;
    struct entry *ring;
    uint64_t cap, base, next; /* entries [base, next) are in flight, at ring[k % cap] */
    int64_t last_dispatched;
    struct waiter *waiters;
    int since;
    struct aseg *link;
};

struct job {
    struct aseg *s;
    uint64_t seq;
    int64_t index;
    struct job *next;
};

struct ex_async {
    struct ex_async_opts o;
    int fd;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* jobs queued, stop, or resume */
    struct job *head, *tail;
    bool stop;
    bool paused;
    bool fail_barriers;
    struct aseg *segs; /* live and released */
    pthread_t *threads;
    int nthreads;
    _Atomic int64_t delivered;
};

static struct aseg *find_live(struct ex_async *a, struct pawl_segment seg)
{
    for (struct aseg *s = a->segs; s != NULL; s = s->link)
        if (s->live && s->seg.id == seg.id && s->seg.mask == seg.mask)
            return s;
    return NULL;
}

/* The position delivered without a gap, given what was asked to cover (locked). */
static bool covered(const struct aseg *s, int64_t requested, int64_t *report)
{
    if (s->base == s->next) {
        *report = requested > s->last_dispatched ? requested : s->last_dispatched;
        return true;
    }
    int64_t lowest = s->ring[s->base % s->cap].index;
    if (lowest <= requested)
        return false;
    *report = lowest - 1;
    return true;
}

static void *worker_main(void *arg)
{
    struct ex_async *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while ((a->head == NULL || a->paused) && !(a->stop && a->head == NULL))
            pthread_cond_wait(&a->cv, &a->mu);
        struct job *j = a->head;
        if (j == NULL)
            break;
        a->head = j->next;
        if (a->head == NULL)
            a->tail = NULL;
        pthread_mutex_unlock(&a->mu);

        /* The asynchronous work: the remote call, then the delivery. */
        if (a->o.delay_us > 0)
            usleep((useconds_t)a->o.delay_us);
        if (a->fd >= 0) {
            char line[64];
            int len = snprintf(line, sizeof line, "%u %" PRId64 "\n", j->s->seg.id, j->index);
            if (write(a->fd, line, (size_t)len) != len)
                perror("async sink: write");
            if (a->o.sync)
                fdatasync(a->fd);
        }
        atomic_fetch_add(&a->delivered, 1);

        pthread_mutex_lock(&a->mu);
        struct aseg *s = j->s;
        s->ring[j->seq % s->cap].done = true;
        while (s->base < s->next && s->ring[s->base % s->cap].done)
            s->base++;
        /* Barriers this delivery satisfied, and maybe a request of our own. */
        struct waiter *ready = NULL, **pw = &s->waiters;
        while (*pw != NULL) {
            int64_t rep;
            if (covered(s, (*pw)->requested, &rep)) {
                struct waiter *w = *pw;
                *pw = w->next;
                w->requested = rep;
                w->next = ready;
                ready = w;
            } else {
                pw = &(*pw)->next;
            }
        }
        int64_t request = -1;
        if (a->o.every > 0 && ++s->since >= a->o.every) {
            s->since = 0;
            covered(s, -1, &request);
        }
        struct pawl_trigger *t = s->live ? pawl_trigger_ref(s->trigger) : NULL;
        pthread_mutex_unlock(&a->mu);
        free(j);
        while (ready != NULL) {
            struct waiter *w = ready;
            ready = w->next;
            pawl_future_complete_unref(w->f, w->requested);
            free(w);
        }
        if (t != NULL && request > 0)
            pawl_trigger_request(t, request); /* any thread; ignored once released */
        pawl_trigger_unref(t);
        pthread_mutex_lock(&a->mu);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static int handle(void *self, struct pawl_event_ctx *ctx)
{
    struct ex_async *a = self;
    const struct pawl_event *ev = pawl_ctx_event(ctx);
    struct job *j = malloc(sizeof *j);
    if (j == NULL)
        return PAWL_ENOMEM;
    pthread_mutex_lock(&a->mu);
    struct aseg *s = find_live(a, pawl_ctx_segment(ctx));
    if (s == NULL) {
        pthread_mutex_unlock(&a->mu);
        free(j);
        return PAWL_EHANDLER;
    }
    if (s->next - s->base == s->cap) {
        uint64_t ncap = s->cap * 2;
        struct entry *r = malloc(ncap * sizeof *r);
        if (r == NULL) {
            pthread_mutex_unlock(&a->mu);
            free(j);
            return PAWL_ENOMEM;
        }
        for (uint64_t k = s->base; k < s->next; k++)
            r[k % ncap] = s->ring[k % s->cap];
        free(s->ring);
        s->ring = r;
        s->cap = ncap;
    }
    uint64_t seq = s->next++;
    s->ring[seq % s->cap] = (struct entry){ev->index, false};
    s->last_dispatched = ev->index;
    *j = (struct job){s, seq, ev->index, NULL};
    if (a->tail)
        a->tail->next = j;
    else
        a->head = j;
    a->tail = j;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    return 0;
}

static int on_claimed(void *self, struct pawl_segment seg, struct pawl_trigger *trigger)
{
    struct ex_async *a = self;
    struct aseg *s = calloc(1, sizeof *s);
    if (s == NULL)
        return PAWL_ENOMEM;
    s->cap = 256;
    s->ring = malloc(s->cap * sizeof *s->ring);
    if (s->ring == NULL) {
        free(s);
        return PAWL_ENOMEM;
    }
    s->seg = seg;
    s->live = true;
    /* Kept past this call (our threads request checkpoints): take a reference. */
    s->trigger = pawl_trigger_ref(trigger);
    pthread_mutex_lock(&a->mu);
    s->link = a->segs;
    a->segs = s;
    pthread_mutex_unlock(&a->mu);
    return 0;
}

static struct pawl_future *on_advanced(void *self, struct pawl_segment seg, int64_t requested)
{
    struct ex_async *a = self;
    struct pawl_future *f = pawl_future_new();
    if (f == NULL)
        return NULL;
    pthread_mutex_lock(&a->mu);
    struct aseg *s = find_live(a, seg);
    int64_t rep;
    if (a->fail_barriers || s == NULL) {
        pthread_mutex_unlock(&a->mu);
        pawl_future_fail(f, PAWL_EHANDLER, "async sink cannot confirm its deliveries");
        return f;
    }
    if (covered(s, requested, &rep)) {
        pthread_mutex_unlock(&a->mu);
        pawl_future_complete(f, rep); /* nothing in flight below requested: no wait */
        return f;
    }
    struct waiter *w = malloc(sizeof *w);
    if (w == NULL) {
        pthread_mutex_unlock(&a->mu);
        pawl_future_fail(f, PAWL_ENOMEM, NULL);
        return f;
    }
    /* The barrier: a worker completes the future once deliveries cover requested. */
    *w = (struct waiter){requested, pawl_future_ref(f), s->waiters};
    s->waiters = w;
    pthread_mutex_unlock(&a->mu);
    return f;
}

static struct pawl_future *on_released(void *self, struct pawl_segment seg, int64_t up_to)
{
    struct ex_async *a = self;
    struct pawl_future *f = pawl_future_new();
    if (f == NULL)
        return NULL;
    pthread_mutex_lock(&a->mu);
    struct aseg *s = find_live(a, seg);
    int64_t rep = -1;
    if (s != NULL) {
        /* Best effort, no waiting: what is delivered now. Jobs still in flight finish later and
         * are delivered again after the next claim (at-least-once). */
        rep = s->base == s->next ? up_to : s->ring[s->base % s->cap].index - 1;
        s->live = false;
    }
    pthread_mutex_unlock(&a->mu);
    if (s == NULL)
        pawl_future_fail(f, PAWL_ENOTFOUND, "segment not claimed here");
    else
        pawl_future_complete(f, rep);
    return f;
}

static const struct pawl_checkpointing async_ckpt = {
    .on_segment_claimed = on_claimed,
    .on_checkpoint_advanced = on_advanced,
    .on_segment_released = on_released,
};

struct pawl_handler ex_async_handler(struct ex_async *a, const char *name)
{
    return (struct pawl_handler){name, a, handle, &async_ckpt};
}

int64_t ex_async_delivered(struct ex_async *a)
{
    return atomic_load(&a->delivered);
}

void ex_async_pause(struct ex_async *a, int paused)
{
    pthread_mutex_lock(&a->mu);
    a->paused = paused != 0;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

void ex_async_fail_barriers(struct ex_async *a, int fail)
{
    pthread_mutex_lock(&a->mu);
    a->fail_barriers = fail != 0;
    pthread_mutex_unlock(&a->mu);
}

int ex_async_new(struct ex_async **out, const struct ex_async_opts *opts)
{
    *out = NULL;
    struct ex_async *a = calloc(1, sizeof *a);
    if (a == NULL)
        return PAWL_ENOMEM;
    if (opts)
        a->o = *opts;
    if (a->o.threads <= 0)
        a->o.threads = 2;
    a->fd = -1;
    if (a->o.path != NULL) {
        a->fd = open(a->o.path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (a->fd < 0)
            goto fail;
        a->o.path = NULL; /* not kept */
    }
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    a->threads = calloc((size_t)a->o.threads, sizeof *a->threads);
    if (a->threads == NULL)
        goto fail;
    for (int i = 0; i < a->o.threads; i++) {
        if (pthread_create(&a->threads[i], NULL, worker_main, a) != 0)
            goto fail;
        a->nthreads++;
    }
    *out = a;
    return 0;
fail:
    ex_async_free(a);
    return PAWL_ESYS;
}

void ex_async_free(struct ex_async *a)
{
    if (a == NULL)
        return;
    if (a->threads != NULL) {
        pthread_mutex_lock(&a->mu);
        a->stop = true;
        a->paused = false;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        for (int i = 0; i < a->nthreads; i++)
            pthread_join(a->threads[i], NULL);
        free(a->threads);
        pthread_cond_destroy(&a->cv);
        pthread_mutex_destroy(&a->mu);
    }
    while (a->segs != NULL) {
        struct aseg *s = a->segs;
        a->segs = s->link;
        while (s->waiters != NULL) {
            struct waiter *w = s->waiters;
            s->waiters = w->next;
            pawl_future_fail_unref(w->f, PAWL_ESHUTDOWN, NULL);
            free(w);
        }
        pawl_trigger_unref(s->trigger);
        free(s->ring);
        free(s);
    }
    if (a->fd >= 0)
        close(a->fd);
    free(a);
}
