/*
 * source_mem.c — the in-memory event log: an event source for tests and for embedders that keep
 * their log in process.
 *
 * Appends take the next index (1, 2, ...) under one mutex and become readable at once, so the
 * forward-only guarantee holds trivially: indexes are assigned and published in order. Events
 * are stored in chunks that never move, so readers copy out under the lock without the arena
 * rebasing that a single growing buffer would need. wait() sleeps on a condition variable that
 * every append broadcasts, its deadline kept by the source's own timers (io_uring, or the
 * timerfd fallback) like every timed wait of the library. Every entry point is thread-safe.
 */
#include "common.h"
#include "segment.h"
#include "testctl.h"
#include "timers.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define CHUNK_EVENTS 4096

struct source_mem {
    struct pawl_source base;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct pawl_timers *timers;      /* wait()'s deadlines */
    struct pawl_event_batch *chunks; /* chunk k holds indexes k*CHUNK_EVENTS+1 .. */
    size_t nchunks;
    size_t chunks_cap;
    int64_t head;
    char err[128];
};

static struct source_mem *from(struct pawl_source *s)
{
    return (struct source_mem *)s;
}

static int mem_read(struct pawl_source *s, int64_t after, size_t max, struct pawl_event_batch *out,
                    int64_t *last_seen)
{
    struct source_mem *m = from(s);
    int rc = 0;
    pthread_mutex_lock(&m->mu);
    if (pawl__fault_sim(PAWL_FAULT_SOURCE_MEM_READ, s)) { /* tests: SOURCE_MEM_FAIL_READS */
        snprintf(m->err, sizeof m->err, "injected read failure");
        pthread_mutex_unlock(&m->mu);
        return PAWL_ECONN;
    }
    int64_t i = after < 0 ? 0 : after;
    size_t got = 0;
    while (i < m->head && got < max) {
        const struct pawl_event_batch *c = &m->chunks[i / CHUNK_EVENTS];
        rc = pawl_event_batch_push(out, &c->events[i % CHUNK_EVENTS]);
        if (rc)
            break;
        i++;
        got++;
    }
    if (last_seen)
        *last_seen = i > after ? i : after;
    pthread_mutex_unlock(&m->mu);
    return rc;
}

static int mem_wait(struct pawl_source *s, int64_t after, int64_t timeout_ms)
{
    struct source_mem *m = from(s);
    int64_t until = pawl_now_ns() + PAWL_MAX(timeout_ms, 0) * 1000000;
    int rc = 0;
    pthread_mutex_lock(&m->mu);
    while (m->head <= after) {
        int64_t left = until - pawl_now_ns();
        if (left <= 0) {
            rc = PAWL_ETIMEDOUT;
            break;
        }
        pawl__timed_wait(m->timers, &m->mu, &m->cv, CLOCK_MONOTONIC, left);
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

static int mem_head(struct pawl_source *s, int64_t *index)
{
    struct source_mem *m = from(s);
    pthread_mutex_lock(&m->mu);
    *index = m->head;
    pthread_mutex_unlock(&m->mu);
    return 0;
}

static int mem_index_at(struct pawl_source *s, int64_t time_us, int64_t *token)
{
    struct source_mem *m = from(s);
    pthread_mutex_lock(&m->mu);
    /* Append times are non-decreasing here (assigned under the lock), so bisect. */
    int64_t lo = 0, hi = m->head;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const struct pawl_event *e = &m->chunks[mid / CHUNK_EVENTS].events[mid % CHUNK_EVENTS];
        if (e->appended_at_us < time_us)
            lo = mid + 1;
        else
            hi = mid;
    }
    *token = lo;
    pthread_mutex_unlock(&m->mu);
    return 0;
}

static const char *mem_errmsg(struct pawl_source *s)
{
    return from(s)->err;
}

static void mem_free(struct pawl_source *s)
{
    struct source_mem *m = from(s);
    pawl__fault_forget(s);
    pawl_timers_free(m->timers); /* nobody waits any more */
    for (size_t i = 0; i < m->nchunks; i++)
        pawl_event_batch_fini(&m->chunks[i]);
    pawl_free(m->chunks);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    pawl_free(m);
}

static const struct pawl_source_ops mem_ops = {
    .read = mem_read,
    .wait = mem_wait,
    .head = mem_head,
    .index_at = mem_index_at,
    .errmsg = mem_errmsg,
    .free = mem_free,
};

int pawl_source_mem_new(struct pawl_source **out)
{
    struct source_mem *m = pawl_calloc(1, sizeof *m);
    if (m == NULL)
        return PAWL_ENOMEM;
    m->base.ops = &mem_ops;
    int rc = pawl_timers_new(&m->timers, NULL, NULL);
    if (rc != 0) {
        pawl_free(m);
        return rc;
    }
    pthread_mutex_init(&m->mu, NULL);
    pawl__cond_init_monotonic(&m->cv);
    *out = &m->base;
    return 0;
}

int pawl_source_mem_append(struct pawl_source *s, const struct pawl_event *events, size_t n)
{
    struct source_mem *m = from(s);
    int rc = 0;
    pthread_mutex_lock(&m->mu);
    int64_t now = pawl_wall_us();
    for (size_t i = 0; i < n && rc == 0; i++) {
        size_t k = (size_t)(m->head / CHUNK_EVENTS);
        if (k == m->nchunks) {
            if (m->nchunks == m->chunks_cap) {
                size_t cap = m->chunks_cap ? m->chunks_cap * 2 : 16;
                struct pawl_event_batch *c = pawl_realloc(m->chunks, cap * sizeof *c);
                if (c == NULL) {
                    rc = PAWL_ENOMEM;
                    break;
                }
                m->chunks = c;
                m->chunks_cap = cap;
            }
            pawl_event_batch_init(&m->chunks[m->nchunks++]);
        }
        struct pawl_event e = events[i];
        e.index = m->head + 1;
        if (e.appended_at_us == 0)
            e.appended_at_us = now;
        rc = pawl_event_batch_push(&m->chunks[k], &e);
        if (rc == 0)
            m->head++;
    }
    /* Wake every waiter: they re-check the head under the mutex. */
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return rc;
}

void pawl_source_free(struct pawl_source *s)
{
    if (s)
        s->ops->free(s);
}

const char *pawl_source_errmsg(struct pawl_source *s, char *buf, size_t len)
{
    if (len > 0)
        snprintf(buf, len, "%s", s ? s->ops->errmsg(s) : "");
    return buf;
}
