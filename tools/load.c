/*
 * load.c — see load.h. Pacing is by schedule, not by sleeping a fixed gap: append k of a thread
 * is due at start + k * gap, so slow appends do not lower the achieved rate while the database
 * keeps up; a thread that falls more than a second behind drops the backlog instead of
 * bursting. Append latency and counts reach the metrics registry through the store, which
 * records them itself.
 */
#include "load.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void sleep_until(int64_t t_ns)
{
    int64_t now = pawl_now_ns();
    if (t_ns <= now)
        return;
    struct timespec ts = {(time_t)((t_ns - now) / 1000000000), (long)((t_ns - now) % 1000000000)};
    nanosleep(&ts, NULL);
}

/* Appends one generator thread keeps in flight at most: enough to fill the pipelines, few
 * enough that a target rate above what the database sustains shows as a lower achieved rate
 * rather than as an ever longer queue (and ever longer latency). */
#define INFLIGHT_PER_THREAD 32

struct thread_arg {
    struct tool_load *l;
    int id;
    _Atomic int inflight;
};

struct inflight {
    struct thread_arg *ta;
    int64_t t0;
    int n;
};

static void record_error(struct tool_load *l, int rc, const char *msg)
{
    /* Relaxed: a statistic; the mutex orders the message itself. */
    if (atomic_fetch_add_explicit(&l->errors, 1, memory_order_relaxed) == 0) {
        pthread_mutex_lock(&l->err_mu);
        snprintf(l->first_error, sizeof l->first_error, "%s: %s", pawl_strerror(rc), msg);
        pthread_mutex_unlock(&l->err_mu);
    }
}

/* On the store's I/O thread: short, no blocking. */
static void on_appended(void *ud, const struct pawl_append_result *res)
{
    struct inflight *ifl = ud;
    struct tool_load *l = ifl->ta->l;
    if (res->rc == 0) {
        /* Relaxed: statistics. */
        atomic_fetch_add_explicit(&l->appends, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&l->events, ifl->n, memory_order_relaxed);
    } else {
        record_error(l, res->rc, res->message);
    }
    /* Release: the appender thread's acquire load sees this append as finished. */
    atomic_fetch_sub_explicit(&ifl->ta->inflight, 1, memory_order_release);
    free(ifl);
}

static void *appender(void *arg)
{
    struct thread_arg *ta = arg;
    struct tool_load *l = ta->l;
    const struct tool_opts *t = &l->cfg->tool;
    int n = t->events_per_append;
    struct pawl_event *evs = calloc((size_t)n, sizeof *evs);
    char(*ids)[32] = calloc((size_t)n, sizeof *ids);
    char *payload = malloc((size_t)t->payload_bytes + 1);
    if (evs == NULL || ids == NULL || payload == NULL) {
        atomic_fetch_add(&l->errors, 1);
        goto out;
    }
    memset(payload, 'x', (size_t)t->payload_bytes);
    payload[t->payload_bytes] = '\0';
    /* Each thread paces its share of the rate. */
    double per_thread = t->rate / l->nthreads;
    int64_t gap_ns = per_thread > 0 ? (int64_t)(1e9 * n / per_thread) : 0;
    int64_t deadline = t->duration_ms > 0 ? l->start_ns + t->duration_ms * 1000000 : INT64_MAX;
    int64_t next = l->start_ns + (gap_ns * ta->id) / l->nthreads; /* stagger the threads */
    /* Relaxed on the stop flag and counters: statistics and a best-effort stop request. */
    while (!atomic_load_explicit(&l->stop, memory_order_relaxed) && !tool_stop) {
        if (gap_ns > 0) {
            int64_t now = pawl_now_ns();
            if (now - next > 1000000000)
                next = now; /* more than 1 s behind: drop the backlog */
            sleep_until(next);
            next += gap_ns;
        }
        if (pawl_now_ns() >= deadline)
            break;
        int take = n;
        if (t->count > 0) {
            /* Reserve events before sending them, so appends in flight never overshoot. */
            int64_t before = atomic_fetch_add_explicit(&l->reserved, n, memory_order_relaxed);
            if (before >= t->count)
                break;
            take = (int)TOOL_MIN((int64_t)n, t->count - before);
        }
        /* Streams in turn, shared by every thread: appends in flight together touch distinct
         * streams (until more than --streams events are in flight), so the generator's own
         * appends never wait for each other's stream locks. Random streams did: two
         * connections' transactions met on a stream about once per ten appends, and under load
         * such a wait outlasted --append-lock-timeout and warned. Relaxed: a counter. */
        uint64_t first =
            atomic_fetch_add_explicit(&l->next_stream, (uint64_t)take, memory_order_relaxed);
        for (int i = 0; i < take; i++) {
            snprintf(ids[i], sizeof ids[i], "load-%" PRIu64,
                     (first + (uint64_t)i) % (uint64_t)t->streams);
            evs[i] = (struct pawl_event){.stream_id = ids[i],
                                         .stream_seq = PAWL_SEQ_ANY,
                                         .type = "LoadEvent",
                                         .payload = payload,
                                         .payload_len = (size_t)t->payload_bytes};
        }
        /* Acquire: pairs with the callback's release decrement. */
        while (atomic_load_explicit(&ta->inflight, memory_order_acquire) >= INFLIGHT_PER_THREAD &&
               !atomic_load_explicit(&l->stop, memory_order_relaxed) && !tool_stop)
            sleep_until(pawl_now_ns() + 200000);
        struct inflight *ifl = malloc(sizeof *ifl);
        if (ifl == NULL)
            break;
        *ifl = (struct inflight){.ta = ta, .t0 = pawl_now_ns(), .n = take};
        atomic_fetch_add_explicit(&ta->inflight, 1, memory_order_relaxed);
        int rc;
        /* Back-pressure: when the store has max-inflight-appends outstanding, wait briefly. */
        while ((rc = pawl_append_async(l->store, evs, (size_t)take, on_appended, ifl)) ==
                   PAWL_EAGAIN &&
               !atomic_load_explicit(&l->stop, memory_order_relaxed) && !tool_stop)
            sleep_until(pawl_now_ns() + 200000);
        if (rc != 0) {
            atomic_fetch_sub_explicit(&ta->inflight, 1, memory_order_relaxed);
            free(ifl);
            record_error(l, rc, "not queued");
            if (rc != PAWL_EAGAIN)
                break;
        }
    }
out:
    free(evs);
    free(ids);
    free(payload);
    /* Release: the finished count is read by the controlling thread's done check. */
    atomic_fetch_sub_explicit(&l->running, 1, memory_order_release);
    return NULL; /* ta is freed by tool_load_stop, after the store has drained the callbacks */
}

int tool_load_start(struct tool_load *l, struct pawl_store *store, const struct tool_config *cfg)
{
    memset(l, 0, sizeof *l);
    l->store = store;
    l->cfg = cfg;
    l->nthreads = cfg->tool.appenders;
    pthread_mutex_init(&l->err_mu, NULL);
    l->threads = calloc((size_t)l->nthreads, sizeof *l->threads);
    l->args = calloc((size_t)l->nthreads, sizeof *l->args);
    if (l->threads == NULL || l->args == NULL) {
        free(l->threads);
        free(l->args);
        l->threads = NULL;
        return PAWL_ENOMEM;
    }
    l->start_ns = pawl_now_ns();
    atomic_store(&l->running, l->nthreads);
    for (int i = 0; i < l->nthreads; i++) {
        struct thread_arg *ta = &l->args[i];
        ta->l = l;
        ta->id = i;
        if (pthread_create(&l->threads[i], NULL, appender, ta) != 0) {
            atomic_store(&l->stop, 1);
            atomic_fetch_sub(&l->running, l->nthreads - i);
            for (int j = 0; j < i; j++)
                pthread_join(l->threads[j], NULL);
            pawl_store_drain(l->store);
            free(l->threads);
            free(l->args);
            l->threads = NULL;
            return PAWL_ESYS;
        }
    }
    return 0;
}

int tool_load_done(struct tool_load *l)
{
    /* Acquire: pairs with each thread's release decrement. */
    return atomic_load_explicit(&l->running, memory_order_acquire) == 0;
}

void tool_load_stop(struct tool_load *l)
{
    if (l->threads == NULL)
        return;
    atomic_store(&l->stop, 1);
    for (int i = 0; i < l->nthreads; i++)
        pthread_join(l->threads[i], NULL);
    pawl_store_drain(l->store); /* every callback has run when this returns */
    free(l->threads);
    free(l->args);
    l->threads = NULL;
    pthread_mutex_destroy(&l->err_mu);
}
