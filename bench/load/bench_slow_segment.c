/*
 * bench_slow_segment.c — does one slow segment lower the throughput of the others?
 *
 * Appends N events over 256 streams (16 segments), then runs a processor over them: with every
 * handler fast (baseline), and with the handler sleeping sleep_us per event of one segment (the
 * segment of stream 0). Each run is a fresh processor from the same start. After one warm-up
 * run, baseline and slow runs alternate `repeat` times (the machine is shared: alternating
 * spreads the noise over both). Reports the throughput of the other 15 segments (events handled
 * per second until the last of them is handled): every run, the medians, and their ratio. The
 * design goal is a ratio within 10% of 1: the slow segment is detached from the shared reader and
 * occupies at most one worker thread; nothing it does may hold the others back.
 *
 * Each event's handler queues one projection statement into the batch transaction (as a real
 * projection would) unless --no-sql. Runs against PostgreSQL (--dsn, or PAWL_DSN) or in memory
 * (--mem). Prints one CSV line per run: mode,run,events_others,seconds,events_per_s.
 *
 * Usage: bench_slow_segment [--dsn DSN | --mem] [--events N] [--threads T] [--batch B]
 *                           [--sleep-us U] [--no-sql] [--repeat R]
 */
#include "pawl.h"

#include <libpq-fe.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NSTREAMS 256

struct bench {
    uint32_t slow_seg;
    int sleep_us;
    int sql;
    _Atomic int64_t others_done;
    int64_t others_total;
    int64_t t_first_ns;
};

static int handle(void *self, struct pawl_event_ctx *ctx)
{
    struct bench *b = self;
    const struct pawl_event *e = pawl_ctx_event(ctx);
    struct pawl_segment seg = pawl_ctx_segment(ctx);
    if (seg.id == b->slow_seg) {
        if (b->sleep_us)
            usleep((useconds_t)b->sleep_us);
    } else {
        atomic_fetch_add_explicit(&b->others_done, 1, memory_order_relaxed);
    }
    if (b->sql && pawl_ctx_txn(ctx)) {
        const char *v[1] = {e->stream_id};
        int rc = pawl_txn_exec(pawl_ctx_txn(ctx),
                               "INSERT INTO bench_proj (stream, n) VALUES ($1, 1) ON CONFLICT "
                               "(stream) DO UPDATE SET n = bench_proj.n + 1",
                               1, v);
        if (rc && rc != PAWL_ENOTSUP)
            return rc;
    }
    return 0;
}

static int mem_exec(void *ud, const char *sql, int n, const char *const *v)
{
    (void)ud;
    (void)sql;
    (void)n;
    (void)v;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    const char *dsn = getenv("PAWL_DSN");
    int mem = 0, events = 20000, threads = 4, batch = 100, sleep_us = 1000, sql = 1, repeat = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dsn") && i + 1 < argc)
            dsn = argv[++i];
        else if (!strcmp(argv[i], "--mem"))
            mem = 1;
        else if (!strcmp(argv[i], "--events") && i + 1 < argc)
            events = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sleep-us") && i + 1 < argc)
            sleep_us = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-sql"))
            sql = 0;
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [--dsn DSN | --mem] [--events N] [--threads T] "
                    "[--batch B] [--sleep-us U] [--no-sql] [--repeat R]\n",
                    argv[0]);
            return 2;
        }
    }
    if (!mem && dsn == NULL) {
        fprintf(stderr, "bench_slow_segment: give --dsn (or PAWL_DSN), or --mem\n");
        return 2;
    }
    pawl_log_set_level(PAWL_LOG_WARN);
    char run_id[32];
    snprintf(run_id, sizeof run_id, "%ld", (long)getpid());

    struct pawl_source *src = NULL;
    struct pawl_tokens *tok = NULL;
    struct pawl_store *store = NULL;
    char err[256];
    if (mem) {
        if (pawl_source_mem_new(&src) || pawl_tokens_mem_new(&tok))
            return 1;
        pawl_tokens_mem_set_exec(tok, mem_exec, NULL);
    } else {
        if (pawl_schema_migrate(dsn, err, sizeof err)) {
            fprintf(stderr, "migrate: %s\n", err);
            return 1;
        }
        struct pawl_store_opts so;
        pawl_store_opts_defaults(&so);
        if (pawl_store_new(&store, dsn, &so, err, sizeof err)) {
            fprintf(stderr, "store: %s\n", err);
            return 1;
        }
        if (pawl_source_pg_new(&src, dsn) || pawl_tokens_pg_new(&tok, dsn))
            return 1;
        if (sql) {
            /* The benchmark's scratch projection table. */
            PGconn *c = PQconnectdb(dsn);
            PGresult *r = PQexec(c, "CREATE UNLOGGED TABLE IF NOT EXISTS bench_proj (stream text "
                                    "PRIMARY KEY, n int8 NOT NULL)");
            if (PQresultStatus(r) != PGRES_COMMAND_OK)
                fprintf(stderr, "setup: %s", PQerrorMessage(c));
            PQclear(r);
            PQfinish(c);
        }
    }

    /* Append the events; note where they start. */
    int64_t start = 0;
    src->ops->head(src, &start);
    char id0[48];
    snprintf(id0, sizeof id0, "bs-%s-0", run_id);
    uint32_t slow_seg = pawl_stream_hash(id0) & 15;
    int64_t others = 0;
    double t0 = now_s();
    for (int i = 0; i < events; i += 100) {
        struct pawl_event ev[100];
        char ids[100][48];
        int k = 0;
        for (; k < 100 && i + k < events; k++) {
            int s = (i + k) % NSTREAMS;
            snprintf(ids[k], sizeof ids[k], "bs-%s-%d", run_id, s);
            if ((pawl_stream_hash(ids[k]) & 15) != slow_seg)
                others++;
            ev[k] = (struct pawl_event){
                .stream_id = ids[k], .type = "T", .payload = "{}", .payload_len = 2};
        }
        int rc = mem ? pawl_source_mem_append(src, ev, (size_t)k)
                     : pawl_append(store, ev, (size_t)k, NULL);
        if (rc) {
            fprintf(stderr, "append: %s\n", pawl_strerror(rc));
            return 1;
        }
    }
    if (!mem) {
        /* Wait until every appended event is final (readable). */
        int64_t head = 0;
        while (head < start + events) {
            src->ops->head(src, &head);
            if (head < start + events)
                usleep(10000);
        }
    }
    fprintf(stderr, "appended %d events (%lld in the 15 fast segments) in %.2f s\n", events,
            (long long)others, now_s() - t0);

    if (repeat < 1 || repeat > 50)
        repeat = 3;
    double rates[2][50];
    int nrates[2] = {0, 0};
    printf("mode,run,events_others,seconds,events_per_s\n");
    for (int i = -1; i < 2 * repeat; i++) {
        int slow = i >= 0 && i % 2 == 1; /* -1: warm-up (baseline, not counted) */
        struct bench b = {.slow_seg = slow_seg,
                          .sleep_us = slow ? sleep_us : 0,
                          .sql = sql,
                          .others_total = others};
        struct pawl_handler h = {"bench", &b, handle, NULL};
        struct pawl_processor_opts o;
        pawl_processor_opts_defaults(&o);
        char name[64];
        snprintf(name, sizeof name, "bench-slow-%s-%d", run_id, i + 1);
        o.name = name;
        o.threads = (uint32_t)threads;
        o.batch_size = (uint32_t)batch;
        o.initial_token = start;
        o.claim_poll_ms = 100;
        struct pawl_processor *p;
        if (pawl_processor_new(&p, &o, src, tok, &h, 1) || pawl_processor_start(p))
            return 1;
        double ts = now_s();
        while (atomic_load(&b.others_done) < others && now_s() - ts < 600)
            usleep(1000);
        double dt = now_s() - ts;
        printf("%s,%s,%lld,%.3f,%.0f\n", mem ? "mem" : "pg",
               i < 0  ? "warmup"
               : slow ? "slow"
                      : "baseline",
               (long long)others, dt, others / dt);
        fflush(stdout);
        if (i >= 0)
            rates[slow][nrates[slow]++] = others / dt;
        pawl_processor_free(p);
    }
    double med[2];
    for (int k = 0; k < 2; k++) {
        for (int a = 0; a < nrates[k]; a++)
            for (int c = a + 1; c < nrates[k]; c++)
                if (rates[k][c] < rates[k][a]) {
                    double t = rates[k][a];
                    rates[k][a] = rates[k][c];
                    rates[k][c] = t;
                }
        med[k] = rates[k][nrates[k] / 2];
    }
    fprintf(stderr,
            "fast segments, median of %d: %.0f ev/s with one slow segment (%d us/event), "
            "%.0f ev/s without: ratio %.3f\n",
            repeat, med[1], sleep_us, med[0], med[0] > 0 ? med[1] / med[0] : 0);
    pawl_tokens_free(tok);
    pawl_source_free(src);
    pawl_store_free(store);
    return 0;
}
