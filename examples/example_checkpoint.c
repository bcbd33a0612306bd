/*
 * example_checkpoint.c — the two self-checkpointing workloads, runnable.
 *
 *   example_checkpoint demo
 *       In memory, no database: appends 20000 events, runs two fully deferred processors side
 *       by side — "projection" (example 1: in-memory state, asynchronous fsynced snapshots, a
 *       checkpoint request every 500 events) and "sink" (example 2: work handed to its own
 *       threads, the checkpoint a barrier, requests from those threads every 500 deliveries) —
 *       stops them (each release reconciles and stores its final position) and prints what each
 *       segment stored next to what its unit made durable.
 *
 *   example_checkpoint projection DSN DIR PROCESSOR [EVERY [DELAY_US [SEGMENTS]]]
 *       The projection alone against PostgreSQL, fully deferred, snapshots in DIR. Runs until
 *       SIGTERM/SIGINT (an orderly stop: a final snapshot per segment, then its token is stored
 *       and the claim freed) or SIGKILL (the next run resumes from the last agreed checkpoint;
 *       the snapshots make the redelivered events no-ops). DELAY_US slows each event down.
 */
#include "async_sink.h"
#include "projection.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

/* A projection that also sleeps per event, to make a run long enough to interrupt. */
struct slow {
    struct pawl_handler inner;
    int delay_us;
};

static int slow_handle(void *self, struct pawl_event_ctx *ctx)
{
    struct slow *s = self;
    if (s->delay_us > 0)
        usleep((useconds_t)s->delay_us);
    return s->inner.handle(s->inner.self, ctx);
}

/* The checkpointing callbacks receive the handler's self: forward them to the projection. */
static int f_claimed(void *self, struct pawl_segment seg, struct pawl_trigger *t)
{
    struct slow *s = self;
    return s->inner.ckpt->on_segment_claimed(s->inner.self, seg, t);
}

static struct pawl_future *f_advanced(void *self, struct pawl_segment seg, int64_t requested)
{
    struct slow *s = self;
    return s->inner.ckpt->on_checkpoint_advanced(s->inner.self, seg, requested);
}

static struct pawl_future *f_released(void *self, struct pawl_segment seg, int64_t up_to)
{
    struct slow *s = self;
    return s->inner.ckpt->on_segment_released(s->inner.self, seg, up_to);
}

static const struct pawl_checkpointing forward = {f_claimed, f_advanced, f_released, NULL};

static int run_projection(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: example_checkpoint projection DSN DIR PROCESSOR [EVERY "
                        "[DELAY_US [SEGMENTS]]]\n");
        return 2;
    }
    const char *dsn = argv[2], *dir = argv[3], *name = argv[4];
    int every = argc > 5 ? atoi(argv[5]) : 100;
    int delay = argc > 6 ? atoi(argv[6]) : 0;
    uint32_t segments = argc > 7 ? (uint32_t)atoi(argv[7]) : 4;
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);

    struct ex_projection *proj = NULL;
    struct pawl_source *src = NULL;
    struct pawl_tokens *tok = NULL;
    struct pawl_processor *p = NULL;
    if (ex_projection_new(&proj, dir, every) != 0) {
        fprintf(stderr, "example_checkpoint: cannot start the projection\n");
        return 1;
    }
    if (pawl_source_pg_new(&src, dsn) != 0 || pawl_tokens_pg_new(&tok, dsn) != 0) {
        fprintf(stderr, "example_checkpoint: cannot open the database\n");
        return 1;
    }
    struct slow slow = {ex_projection_handler(proj, "projection"), delay};
    struct pawl_handler h = {"projection", &slow, slow_handle, &forward};
    struct pawl_processor_opts o;
    pawl_processor_opts_defaults(&o);
    o.name = name;
    o.segments = segments;
    o.batch_size = 20;
    o.claim_timeout_ms = 1000;
    o.claim_poll_ms = 100;
    o.backoff_min_ms = 100;
    o.backoff_max_ms = 1000;
    o.idle_wait_ms = 100;
    int rc = pawl_processor_new(&p, &o, src, tok, &h, 1);
    if (rc == 0)
        rc = pawl_processor_start(p);
    if (rc != 0) {
        fprintf(stderr, "example_checkpoint: %s\n", pawl_strerror(rc));
        return 1;
    }
    while (!stop)
        usleep(20000);
    /* Stop first (every segment is released through the units), then stop the unit's own
     * thread (it may still be returning from completing the last future), then free. */
    pawl_processor_stop(p);
    ex_projection_free(proj);
    pawl_processor_free(p);
    pawl_tokens_free(tok);
    pawl_source_free(src);
    return 0;
}

static int run_demo(void)
{
    struct pawl_source *src = NULL;
    struct pawl_tokens *tok = NULL;
    if (pawl_source_mem_new(&src) != 0 || pawl_tokens_mem_new(&tok) != 0)
        return 1;
    enum { EVENTS = 20000 };
    for (int i = 0; i < EVENTS; i++) {
        char id[16];
        snprintf(id, sizeof id, "order-%d", i % 97);
        struct pawl_event e = {.stream_id = id, .stream_seq = i / 97 + 1, .type = "placed"};
        if (pawl_source_mem_append(src, &e, 1) != 0)
            return 1;
    }
    char dir[] = "/tmp/pawl-example-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 1;
    struct ex_projection *proj = NULL;
    struct ex_async *sink = NULL;
    struct ex_async_opts ao = {.threads = 2, .delay_us = 20, .every = 500};
    if (ex_projection_new(&proj, dir, 500) != 0 || ex_async_new(&sink, &ao) != 0)
        return 1;
    struct pawl_handler hp = ex_projection_handler(proj, "projection");
    struct pawl_handler hs = ex_async_handler(sink, "sink");
    struct pawl_processor_opts o;
    pawl_processor_opts_defaults(&o);
    o.segments = 4;
    o.claim_poll_ms = 50;
    struct pawl_processor *pp = NULL, *ps = NULL;
    o.name = "projection";
    int rc = pawl_processor_new(&pp, &o, src, tok, &hp, 1);
    o.name = "sink";
    if (rc == 0)
        rc = pawl_processor_new(&ps, &o, src, tok, &hs, 1);
    if (rc == 0)
        rc = pawl_processor_start(pp);
    if (rc == 0)
        rc = pawl_processor_start(ps);
    if (rc != 0) {
        fprintf(stderr, "example_checkpoint: %s\n", pawl_strerror(rc));
        return 1;
    }
    struct pawl_processor_stats a, b;
    for (int i = 0; i < 3000; i++) {
        pawl_processor_stats(pp, &a);
        pawl_processor_stats(ps, &b);
        if (a.events >= EVENTS && b.events >= EVENTS && ex_async_delivered(sink) >= EVENTS)
            break;
        usleep(10000);
    }
    printf("handled: projection %llu, sink %llu (delivered %lld) of %d events; mode %s\n",
           (unsigned long long)a.events, (unsigned long long)b.events,
           (long long)ex_async_delivered(sink), EVENTS, pawl_ckpt_mode_name(a.mode));
    /* Stop the processors, then the units' threads, then free the processors: a unit's
     * thread may still be inside pawl_future_complete() for the last release's future. */
    pawl_processor_stop(pp);
    pawl_processor_stop(ps);
    ex_projection_free(proj);
    ex_async_free(sink);
    proj = NULL;
    sink = NULL;
    pawl_processor_free(pp);
    pawl_processor_free(ps);

    struct pawl_segment_status *rows = NULL;
    size_t n = 0;
    int ok = 1;
    printf("\n%-10s %-8s %10s %12s %12s\n", "processor", "segment", "stored", "snapshot pos",
           "snap events");
    for (int k = 0; k < 2; k++) {
        const char *name = k == 0 ? "projection" : "sink";
        if (tok->ops->list(tok, name, &rows, &n) != 0)
            return 1;
        for (size_t i = 0; i < n; i++) {
            struct ex_proj_state st = {0};
            if (k == 0 && ex_projection_load(dir, rows[i].seg, &st) == 0) {
                printf("%-10s %u/%-6u %10lld %12lld %12lld\n", name, rows[i].seg.id,
                       rows[i].seg.mask, (long long)rows[i].token, (long long)st.pos,
                       (long long)st.count);
                /* The stored token never runs ahead of what the unit made durable. */
                ok &= rows[i].token <= st.pos;
            } else {
                printf("%-10s %u/%-6u %10lld %12s %12s\n", name, rows[i].seg.id, rows[i].seg.mask,
                       (long long)rows[i].token, "-", "-");
            }
        }
        pawl_tokens_rows_free(rows);
    }
    ex_async_free(sink);
    ex_projection_free(proj);
    pawl_tokens_free(tok);
    pawl_source_free(src);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        ok = 0;
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    pawl_log_set_level(PAWL_LOG_WARN);
    if (argc >= 2 && strcmp(argv[1], "demo") == 0)
        return run_demo();
    if (argc >= 2 && strcmp(argv[1], "projection") == 0)
        return run_projection(argc, argv);
    fprintf(stderr, "usage: example_checkpoint demo\n"
                    "       example_checkpoint projection DSN DIR PROCESSOR [EVERY [DELAY_US "
                    "[SEGMENTS]]]\n");
    return 2;
}
