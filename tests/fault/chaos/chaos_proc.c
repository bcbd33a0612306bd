/*
 * chaos_proc.c — one processor process of the chaos run (tests/fault/chaos/chaos.sh).
 *
 * Usage: chaos_proc DSN MODE WORKDIR [NODE-ID]
 *
 *   sql       processor "chaos_sql": an ordinary handler that upserts per-stream count and sum
 *             into table chaos_proj through the batch transaction (pawl_txn_exec), so the
 *             projection and the stored token commit or roll back together: exactly once.
 *   snapshot  processor "chaos_snap": the in-memory projection example (a checkpointing unit)
 *             snapshotting into WORKDIR/snap, a checkpoint every 200 events per segment.
 *   async     processor "chaos_async": the asynchronous sink example (a checkpointing unit)
 *             delivering "segment index" lines to WORKDIR/sink (fdatasync'ed), a barrier
 *             checkpoint every 200 deliveries.
 *
 * Four segments, a 3 s claim timeout (so a restarted process wins its segments back soon after
 * a SIGKILL), batches of 50. Runs until SIGTERM/SIGINT, then stops cleanly; the chaos driver
 * mostly SIGKILLs it instead. Opening the source and the token store is retried while the
 * database is down.
 */
#include "async_sink.h"
#include "pawl.h"
#include "projection.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static const char UPSERT[] =
    "INSERT INTO chaos_proj (stream, n, total) VALUES ($1, 1, $2::int8) "
    "ON CONFLICT (stream) DO UPDATE SET n = chaos_proj.n + 1, total = chaos_proj.total + "
    "excluded.total";

static int sql_handle(void *self, struct pawl_event_ctx *ctx)
{
    (void)self;
    const struct pawl_event *e = pawl_ctx_event(ctx);
    char val[32];
    size_t n = e->payload_len < sizeof val - 1 ? e->payload_len : sizeof val - 1;
    memcpy(val, e->payload, n);
    val[n] = '\0';
    const char *v[2] = {e->stream_id, val};
    return pawl_txn_exec(pawl_ctx_txn(ctx), UPSERT, 2, v);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: chaos_proc DSN sql|snapshot|async WORKDIR [NODE-ID]\n");
        return 2;
    }
    const char *dsn = argv[1], *mode = argv[2], *dir = argv[3];
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    struct pawl_source *src = NULL;
    struct pawl_tokens *tok = NULL;
    while (!stop && (pawl_source_pg_new(&src, dsn) != 0 || pawl_tokens_pg_new(&tok, dsn) != 0)) {
        pawl_source_free(src);
        src = NULL;
        fprintf(stderr, "chaos_proc %s: database not reachable; retrying\n", mode);
        sleep(1);
    }
    if (stop)
        return 0;

    struct pawl_processor_opts po;
    pawl_processor_opts_defaults(&po);
    po.segments = 4;
    po.batch_size = 50;
    po.threads = 2;
    po.claim_timeout_ms = 3000;
    po.claim_poll_ms = 200;
    po.backoff_min_ms = 200;
    po.backoff_max_ms = 2000;
    po.idle_wait_ms = 200;
    if (argc > 4)
        po.node_id = argv[4];

    struct pawl_handler h;
    struct ex_projection *proj = NULL;
    struct ex_async *sink = NULL;
    char path[4096];
    if (strcmp(mode, "sql") == 0) {
        po.name = "chaos_sql";
        h = (struct pawl_handler){.name = "sql", .handle = sql_handle};
    } else if (strcmp(mode, "snapshot") == 0) {
        po.name = "chaos_snap";
        snprintf(path, sizeof path, "%s/snap", dir);
        mkdir(path, 0755);
        if (ex_projection_new(&proj, path, 200) != 0)
            return 1;
        h = ex_projection_handler(proj, "snapshot");
    } else if (strcmp(mode, "async") == 0) {
        po.name = "chaos_async";
        snprintf(path, sizeof path, "%s/sink", dir);
        struct ex_async_opts ao = {.path = path, .threads = 2, .every = 200, .sync = 1};
        if (ex_async_new(&sink, &ao) != 0)
            return 1;
        h = ex_async_handler(sink, "async");
    } else {
        fprintf(stderr, "chaos_proc: unknown mode %s\n", mode);
        return 2;
    }

    struct pawl_processor *p = NULL;
    int rc;
    while ((rc = pawl_processor_new(&p, &po, src, tok, &h, 1)) != 0 && !stop) {
        fprintf(stderr, "chaos_proc %s: processor: %s; retrying\n", mode, pawl_strerror(rc));
        sleep(1);
    }
    if (p && (rc = pawl_processor_start(p)) != 0)
        fprintf(stderr, "chaos_proc %s: start: %s\n", mode, pawl_strerror(rc));
    while (!stop)
        usleep(100000);
    struct pawl_processor_stats st = {0};
    if (p) {
        pawl_processor_stop(p);
        pawl_processor_stats(p, &st);
    }
    ex_projection_free(proj);
    ex_async_free(sink);
    pawl_processor_free(p);
    pawl_tokens_free(tok);
    pawl_source_free(src);
    fprintf(stderr,
            "chaos_proc %s: %llu events in %llu batches, %llu failed batches, %llu claims lost\n",
            mode, (unsigned long long)st.events, (unsigned long long)st.batches,
            (unsigned long long)st.batch_failures, (unsigned long long)st.claims_lost);
    return 0;
}
