/*
 * projection.c — example 1: an in-memory projection with asynchronous snapshots (see
 * projection.h for the design).
 *
 * Locks: p->mu guards the list of segments and the writer's queue; each segment's own mutex
 * guards its state (the worker applies events under it, ex_projection_get reads under it). The
 * writer thread takes jobs off the queue in order, so a segment's snapshots are written in the
 * order they were taken and a later one never gets overwritten by an earlier one.
 */
#include "projection.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct seg_state {
    struct pawl_segment seg;
    pthread_mutex_t mu;
    struct ex_proj_state st;
    int since; /* events applied since the last request */
    struct seg_state *next;
};

struct job {
    struct pawl_segment seg;
    struct ex_proj_state st;
    struct pawl_future *f; /* the writer's reference */
    struct job *next;
};

struct ex_projection {
    char *dir;
    int every;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct seg_state *segs;
    struct job *head, *tail;
    bool stop;
    pthread_t writer;
    _Atomic int fail_snapshots;
};

void ex_proj_apply(struct ex_proj_state *s, int64_t index)
{
    s->count++;
    s->sum += (uint64_t)index;
    s->hash = (s->hash ^ (uint64_t)index) * 1099511628211ull; /* FNV-1a step: order matters */
    s->pos = index;
}

static void snap_path(char *buf, size_t n, const char *dir, struct pawl_segment seg, bool tmp)
{
    snprintf(buf, n, "%s/proj-%u-%u.snap%s", dir, seg.id, seg.mask, tmp ? ".tmp" : "");
}

int ex_projection_load(const char *dir, struct pawl_segment seg, struct ex_proj_state *out)
{
    char path[4096];
    snap_path(path, sizeof path, dir, seg, false);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return errno == ENOENT ? PAWL_ENOTFOUND : PAWL_ESYS;
    int n = fscanf(f, "%" SCNd64 " %" SCNd64 " %" SCNu64 " %" SCNu64, &out->pos, &out->count,
                   &out->sum, &out->hash);
    fclose(f);
    return n == 4 ? 0 : PAWL_ESYS;
}

/* Write st durably: temporary file, fsync, rename over the old snapshot, fsync the folder. */
static int write_snapshot(const char *dir, struct pawl_segment seg, const struct ex_proj_state *st)
{
    char tmp[4096], path[4096];
    snap_path(tmp, sizeof tmp, dir, seg, true);
    snap_path(path, sizeof path, dir, seg, false);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return PAWL_ESYS;
    char line[128];
    int len = snprintf(line, sizeof line, "%" PRId64 " %" PRId64 " %" PRIu64 " %" PRIu64 "\n",
                       st->pos, st->count, st->sum, st->hash);
    int rc = 0;
    if (write(fd, line, (size_t)len) != len || fsync(fd) != 0)
        rc = PAWL_ESYS;
    close(fd);
    if (rc == 0 && rename(tmp, path) != 0)
        rc = PAWL_ESYS;
    if (rc == 0) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    return rc;
}

static void *writer_main(void *arg)
{
    struct ex_projection *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->head == NULL && !p->stop)
            pthread_cond_wait(&p->cv, &p->mu);
        struct job *j = p->head;
        if (j == NULL)
            break; /* stopping and drained */
        p->head = j->next;
        if (p->head == NULL)
            p->tail = NULL;
        pthread_mutex_unlock(&p->mu);

        int rc = write_snapshot(p->dir, j->seg, &j->st);
        int fail = atomic_load(&p->fail_snapshots);
        /* Test hook: consume one injected failure if there is one. */
        while (fail > 0 && !atomic_compare_exchange_weak(&p->fail_snapshots, &fail, fail - 1))
            ;
        if (rc == 0 && fail > 0)
            rc = PAWL_ESYS;
        if (rc == 0)
            pawl_future_complete_unref(j->f, j->st.pos);
        else
            pawl_future_fail_unref(j->f, rc, "cannot write the projection's snapshot");
        free(j);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static struct seg_state *find(struct ex_projection *p, struct pawl_segment seg)
{
    pthread_mutex_lock(&p->mu);
    struct seg_state *s = p->segs;
    while (s != NULL && (s->seg.id != seg.id || s->seg.mask != seg.mask))
        s = s->next;
    pthread_mutex_unlock(&p->mu);
    return s;
}

/* Queue a snapshot of s at pos; returns the processor's future (NULL when out of memory). */
static struct pawl_future *snapshot(struct ex_projection *p, struct seg_state *s, int64_t pos)
{
    struct job *j = calloc(1, sizeof *j);
    struct pawl_future *f = pawl_future_new();
    if (j == NULL || f == NULL) {
        free(j);
        pawl_future_unref(f);
        return NULL;
    }
    pthread_mutex_lock(&s->mu);
    /* Every event of this segment up to pos has been applied (the processor checkpoints only
     * what it has handed us), so the state is complete up to pos. */
    if (pos > s->st.pos)
        s->st.pos = pos;
    j->st = s->st;
    pthread_mutex_unlock(&s->mu);
    j->seg = s->seg;
    j->f = pawl_future_ref(f);
    pthread_mutex_lock(&p->mu);
    if (p->tail)
        p->tail->next = j;
    else
        p->head = j;
    p->tail = j;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return f;
}

static int on_claimed(void *self, struct pawl_segment seg, struct pawl_trigger *trigger)
{
    (void)trigger; /* this unit reaches its trigger through the handler's context instead */
    struct ex_projection *p = self;
    struct seg_state *s = calloc(1, sizeof *s);
    if (s == NULL)
        return PAWL_ENOMEM;
    s->seg = seg;
    pthread_mutex_init(&s->mu, NULL);
    int rc = ex_projection_load(p->dir, seg, &s->st);
    if (rc == PAWL_ENOTFOUND) {
        memset(&s->st, 0, sizeof s->st);
    } else if (rc != 0) {
        /* A snapshot we cannot read: refuse the claim rather than start from nothing. */
        pthread_mutex_destroy(&s->mu);
        free(s);
        return rc;
    }
    pthread_mutex_lock(&p->mu);
    s->next = p->segs;
    p->segs = s;
    pthread_mutex_unlock(&p->mu);
    return 0;
}

static struct pawl_future *on_advanced(void *self, struct pawl_segment seg, int64_t requested)
{
    struct ex_projection *p = self;
    struct seg_state *s = find(p, seg);
    return s ? snapshot(p, s, requested) : NULL;
}

static struct pawl_future *on_released(void *self, struct pawl_segment seg, int64_t up_to)
{
    struct ex_projection *p = self;
    struct seg_state *s = find(p, seg);
    if (s == NULL)
        return NULL;
    /* A final snapshot of everything handed to us (normally reporting up_to), then forget the
     * segment: the next claim, here or elsewhere, starts from the snapshot. */
    struct pawl_future *f = snapshot(p, s, up_to);
    pthread_mutex_lock(&p->mu);
    struct seg_state **pp = &p->segs;
    while (*pp != s)
        pp = &(*pp)->next;
    *pp = s->next;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return f;
}

static int handle(void *self, struct pawl_event_ctx *ctx)
{
    struct ex_projection *p = self;
    const struct pawl_event *ev = pawl_ctx_event(ctx);
    struct seg_state *s = find(p, pawl_ctx_segment(ctx));
    if (s == NULL)
        return PAWL_EHANDLER;
    pthread_mutex_lock(&s->mu);
    bool request = false;
    if (ev->index > s->st.pos) { /* at or below pos: already in the snapshot we started from */
        ex_proj_apply(&s->st, ev->index);
        if (p->every > 0 && ++s->since >= p->every) {
            s->since = 0;
            request = true;
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (request)
        pawl_trigger_request(pawl_ctx_trigger(ctx), ev->index);
    return 0;
}

static const struct pawl_checkpointing projection_ckpt = {
    .on_segment_claimed = on_claimed,
    .on_checkpoint_advanced = on_advanced,
    .on_segment_released = on_released,
};

struct pawl_handler ex_projection_handler(struct ex_projection *p, const char *name)
{
    return (struct pawl_handler){name, p, handle, &projection_ckpt};
}

int ex_projection_get(struct ex_projection *p, struct pawl_segment seg, struct ex_proj_state *out)
{
    pthread_mutex_lock(&p->mu);
    struct seg_state *s = p->segs;
    while (s != NULL && (s->seg.id != seg.id || s->seg.mask != seg.mask))
        s = s->next;
    if (s != NULL) {
        pthread_mutex_lock(&s->mu);
        *out = s->st;
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return s ? 0 : PAWL_ENOTFOUND;
}

void ex_projection_fail_snapshots(struct ex_projection *p, int n)
{
    atomic_store(&p->fail_snapshots, n);
}

int ex_projection_new(struct ex_projection **out, const char *dir, int every)
{
    struct ex_projection *p = calloc(1, sizeof *p);
    if (p == NULL)
        goto fail;
    p->dir = strdup(dir);
    if (p->dir == NULL)
        goto fail;
    p->every = every;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->writer, NULL, writer_main, p) != 0)
        goto fail_sync;
    *out = p;
    return 0;
fail_sync:
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
fail:
    if (p)
        free(p->dir);
    free(p);
    *out = NULL;
    return PAWL_ENOMEM;
}

void ex_projection_free(struct ex_projection *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->writer, NULL);
    while (p->segs) {
        struct seg_state *s = p->segs;
        p->segs = s->next;
        pthread_mutex_destroy(&s->mu);
        free(s);
    }
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->dir);
    free(p);
}
