/*
 * bench_checkpoint.c — what the checkpoint protocol costs: processing throughput of a no-op
 * handler in three modes, side by side in one run, on the in-memory event source and token store
 * (so that the protocol, not the database, is what is measured):
 *
 *   plain x1  one ordinary no-op handler; a batch that queued no SQL commits nothing, the token
 *             is written when due (every read_batch events of a segment, or claim_poll_ms);
 *   plain x2  two ordinary no-op handlers (the baseline for auto, which needs two handlers);
 *   auto      a no-op handler plus one checkpointing unit whose future completes at once; every
 *             batch asks the unit, and the confirmed token is stored when due, as plain mode's
 *             (no statement was queued), so against plain x2 it pays the asking;
 *   deferred  one checkpointing unit alone, requesting a checkpoint every 1000 events of a
 *             segment (through the trigger in its handler context); compare with plain x1.
 *
 * Each round appends nothing: the log is filled once, and every mode runs a fresh processor (a
 * new name, so new segments at token 0) over the same events until every event is committed.
 * Rounds alternate the modes to spread the machine's noise; the table reports the median.
 *
 * Usage: bench_checkpoint [events (default 1000000)] [rounds (default 3)] [csv path] [dsn]
 *
 * With a DSN (or PAWL_BENCH_DSN), the same runs use the PostgreSQL log and token store instead
 * (the schema is installed, the events appended and finalized first; use a scratch database).
 * CPU time then counts this process only, not the server's.
 */
#include "pawl.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EVERY 1000

static int noop(void *self, struct pawl_event_ctx *ctx)
{
    (void)self;
    (void)ctx;
    return 0;
}

/* ---- the unit: completes every checkpoint at once ---- */

struct unit {
    _Atomic int64_t checkpoints;
};

static struct pawl_future *advanced(void *self, struct pawl_segment seg, int64_t requested)
{
    (void)seg;
    struct unit *u = self;
    atomic_fetch_add_explicit(&u->checkpoints, 1, memory_order_relaxed);
    struct pawl_future *f = pawl_future_new();
    if (f != NULL)
        pawl_future_complete(f, requested);
    return f;
}

static const struct pawl_checkpointing unit_ckpt = {NULL, advanced, NULL, NULL};

/* Deferred: count events per segment in a thread-local slot keyed by segment id. */
#define MAXSEG 1024
static _Thread_local uint32_t since[MAXSEG];

static int deferred_handle(void *self, struct pawl_event_ctx *ctx)
{
    (void)self;
    struct pawl_segment seg = pawl_ctx_segment(ctx);
    /* One segment runs on one worker at a time, but may move between workers: a per-thread
     * counter is an approximation of "every 1000 events", good enough for a benchmark. */
    if (++since[seg.id % MAXSEG] >= EVERY) {
        since[seg.id % MAXSEG] = 0;
        pawl_trigger_request(pawl_ctx_trigger(ctx), pawl_ctx_event(ctx)->index);
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU time of the whole process: on a machine shared with other work, the cost per event in
 * CPU time is steadier than wall-clock throughput. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

enum mode { PLAIN, PLAIN2, AUTO, DEFERRED, NMODES };
static const char *mode_names[] = {"plain x1 (1 no-op handler)", "plain x2 (2 no-op handlers)",
                                   "auto (no-op + 1 unit, immediate)",
                                   "deferred (1 unit, request every 1000)"};
/* What each mode is compared with. */
static const enum mode baseline[] = {PLAIN, PLAIN, PLAIN2, PLAIN};

static double run(enum mode m, int round, struct pawl_source *src, struct pawl_tokens *tokens,
                  int64_t events, int64_t *checkpoints, double *cpu_ns_per_event)
{
    struct unit u = {0};
    struct pawl_handler hs[2];
    size_t n = 0;
    if (m == PLAIN || m == PLAIN2 || m == AUTO)
        hs[n++] = (struct pawl_handler){"noop", NULL, noop, NULL};
    if (m == PLAIN2)
        hs[n++] = (struct pawl_handler){"noop2", NULL, noop, NULL};
    if (m == AUTO)
        hs[n++] = (struct pawl_handler){"unit", &u, noop, &unit_ckpt};
    if (m == DEFERRED)
        hs[n++] = (struct pawl_handler){"unit", &u, deferred_handle, &unit_ckpt};

    char name[64];
    snprintf(name, sizeof name, "bench-%d-%d", (int)m, round);
    struct pawl_processor_opts o;
    pawl_processor_opts_defaults(&o);
    o.name = name;
    o.batch_size = 100;
    o.threads = 2;
    o.claim_poll_ms = 20;
    struct pawl_processor *p = NULL;
    int rc = pawl_processor_new(&p, &o, src, tokens, hs, n);
    if (rc == PAWL_ENOTSUP) {
        *checkpoints = 0;
        *cpu_ns_per_event = 0;
        return 0; /* this processor build does not run checkpointing units */
    }
    if (rc != 0) {
        fprintf(stderr, "processor: %s\n", pawl_strerror(rc));
        exit(1);
    }
    double t0 = now_s(), c0 = cpu_s();
    pawl_processor_start(p);
    struct pawl_processor_stats st;
    for (;;) {
        pawl_processor_stats(p, &st);
        if ((int64_t)st.events >= events)
            break;
        usleep(2000);
    }
    double dt = now_s() - t0;
    *cpu_ns_per_event = (cpu_s() - c0) * 1e9 / (double)events;
    pawl_processor_stop(p);
    pawl_processor_free(p);
    *checkpoints = atomic_load(&u.checkpoints);
    return (double)events / dt;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int64_t events = argc > 1 ? atoll(argv[1]) : 1000000;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    const char *csv = argc > 3 && argv[3][0] ? argv[3] : NULL;
    const char *dsn = argc > 4 ? argv[4] : getenv("PAWL_BENCH_DSN");
    if (events <= 0 || rounds <= 0 || rounds > 50)
        return 2;
    pawl_log_set_level(PAWL_LOG_WARN);

    struct pawl_source *src = NULL;
    struct pawl_tokens *tokens = NULL;
    struct pawl_store *store = NULL;
    if (dsn != NULL) {
        char err[256];
        struct pawl_store_opts so;
        pawl_store_opts_defaults(&so);
        if (pawl_schema_migrate(dsn, err, sizeof err) != 0 ||
            pawl_store_new(&store, dsn, &so, err, sizeof err) != 0) {
            fprintf(stderr, "bench_checkpoint: %s\n", err);
            return 1;
        }
        if (pawl_source_pg_new(&src, dsn) != 0 || pawl_tokens_pg_new(&tokens, dsn) != 0)
            return 1;
        int64_t head = 0;
        if (src->ops->head(src, &head) == 0 && head > 0) {
            fprintf(stderr, "bench_checkpoint: the log is not empty; use a scratch database\n");
            return 1;
        }
    } else if (pawl_source_mem_new(&src) != 0 || pawl_tokens_mem_new(&tokens) != 0) {
        return 1;
    }
    /* 1000 streams, so every segment gets a share of the events. */
    enum { CHUNK = 100 };
    struct pawl_event ev[CHUNK];
    char ids[CHUNK][16];
    static int64_t seqs[1000];
    for (int64_t i = 0; i < events;) {
        size_t k = 0;
        for (; k < CHUNK && i < events; k++, i++) {
            int s = (int)(i % 1000);
            snprintf(ids[k], sizeof ids[k], "s-%d", s);
            ev[k] = (struct pawl_event){.stream_id = ids[k],
                                        .stream_seq = ++seqs[s],
                                        .type = "t",
                                        .payload = "x",
                                        .payload_len = 1};
        }
        if (store != NULL) {
            struct pawl_append_result res;
            if (pawl_append(store, ev, k, &res) != 0) {
                fprintf(stderr, "bench_checkpoint: append: %s\n", res.message);
                return 1;
            }
        } else if (pawl_source_mem_append(src, ev, k) != 0) {
            return 1;
        }
    }
    if (store != NULL) {
        int64_t head = 0;
        for (int i = 0; i < 1000 && head < events; i++) {
            pawl_finalize_now(store, NULL, NULL, NULL);
            src->ops->head(src, &head);
            if (head < events)
                usleep(10000);
        }
        pawl_store_free(store);
    }

    double rate[NMODES][50], cpu[NMODES][50];
    int64_t cps[NMODES] = {0};
    for (int r = 0; r < rounds; r++)
        for (int m = 0; m < NMODES; m++)
            rate[m][r] = run((enum mode)m, r, src, tokens, events, &cps[m], &cpu[m][r]);

    double med[NMODES], cmed[NMODES];
    for (int m = 0; m < NMODES; m++) {
        qsort(rate[m], (size_t)rounds, sizeof(double), cmp);
        qsort(cpu[m], (size_t)rounds, sizeof(double), cmp);
        med[m] = rate[m][rounds / 2];
        cmed[m] = cpu[m][rounds / 2];
    }
    printf("checkpoint protocol cost: %lld events, no-op handler, batch 100, 16 segments, "
           "2 threads, %s, median of %d rounds\n\n",
           (long long)events,
           dsn ? "PostgreSQL log and token store" : "in-memory source and token store", rounds);
    printf("| mode | events/s (median) | min | max | vs baseline | CPU ns/event | vs baseline "
           "| checkpoints (last round) |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int m = 0; m < NMODES; m++) {
        enum mode b = baseline[m];
        if (med[m] == 0) {
            printf("| %s | not supported by this processor build | | | | | | |\n", mode_names[m]);
            continue;
        }
        printf("| %s | %.0f | %.0f | %.0f | %+.1f%% | %.0f | %+.1f%% | %lld |\n", mode_names[m],
               med[m], rate[m][0], rate[m][rounds - 1], 100.0 * (med[m] / med[b] - 1.0), cmed[m],
               100.0 * (cmed[m] / cmed[b] - 1.0), (long long)cps[m]);
    }
    if (csv != NULL) {
        FILE *f = fopen(csv, "w");
        if (f != NULL) {
            fprintf(f, "mode,events_per_s,vs_baseline_pct,cpu_ns_per_event,cpu_vs_baseline_pct\n");
            for (int m = 0; m < NMODES; m++)
                fprintf(f, "%s,%.0f,%.2f,%.1f,%.2f\n", mode_names[m], med[m],
                        100.0 * (med[m] / med[baseline[m]] - 1.0), cmed[m],
                        100.0 * (cmed[m] / cmed[baseline[m]] - 1.0));
            fclose(f);
        }
    }
    pawl_tokens_free(tokens);
    pawl_source_free(src);
    return 0;
}
