/*
 * bench_dead_letters.c — what do poison events cost a processor with a dead-letter policy?
 *
 * Appends N events over S streams, one in every 1000 (0.1%) of type "poison", then runs a
 * processor over them from the same start: clean (the handler ignores the type) and poisoned
 * (the handler returns PAWL_EPOISON for them, so each is parked with its stream's later events:
 * the batch is rolled back and handled again with the letter). Runs alternate, `repeat` times
 * each after a warm-up. Each handled event queues one statement into the batch transaction, as
 * a projection would. Reports events per second until every event is handled or parked, per
 * run (CSV: mode,run,events,seconds,events_per_s), the medians and their ratio (goal >= 0.9).
 *
 * Usage: bench_dead_letters [--dsn DSN] [--events N] [--streams S] [--batch B] [--repeat R]
 */
#include "pawl.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int poison_on;

static int handle(void *self, struct pawl_event_ctx *ctx)
{
    (void)self;
    const struct pawl_event *e = pawl_ctx_event(ctx);
    if (poison_on && strcmp(e->type, "poison") == 0)
        return pawl_ctx_error(ctx, PAWL_EPOISON, "poison");
    char v[24];
    snprintf(v, sizeof v, "%lld", (long long)e->index);
    const char *vals[1] = {v};
    return pawl_txn_exec(pawl_ctx_txn(ctx), "SELECT $1::int8", 1, vals);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *dsn = getenv("PAWL_DSN");
    long events = 50000, streams = 10000, batch = 100, repeat = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--dsn") == 0)
            dsn = argv[i + 1];
        else if (strcmp(argv[i], "--events") == 0)
            events = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--streams") == 0)
            streams = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--batch") == 0)
            batch = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--repeat") == 0)
            repeat = atol(argv[i + 1]);
        else {
            fprintf(stderr, "bench_dead_letters: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (dsn == NULL || events < 1000 || streams < 1 || batch < 1 || repeat < 1 || repeat > 20) {
        fprintf(stderr, "usage: bench_dead_letters --dsn DSN [--events N>=1000] [--streams S] "
                        "[--batch B] [--repeat R<=20]\n");
        return 2;
    }
    pawl_log_set_level(PAWL_LOG_ERROR);
    char err[512];
    if (pawl_schema_migrate(dsn, err, sizeof err)) {
        fprintf(stderr, "migrate: %s\n", err);
        return 1;
    }
    struct pawl_store *store;
    struct pawl_store_opts so;
    pawl_store_opts_defaults(&so);
    if (pawl_store_new(&store, dsn, &so, err, sizeof err)) {
        fprintf(stderr, "store: %s\n", err);
        return 1;
    }
    struct pawl_source *src;
    struct pawl_tokens *tok;
    if (pawl_source_pg_from_store(&src, store, dsn) || pawl_tokens_pg_new(&tok, dsn)) {
        fprintf(stderr, "cannot open the source or the token store\n");
        return 1;
    }
    int64_t start = 0;
    src->ops->head(src, &start);
    struct pawl_event ev[100];
    char ids[100][32];
    long poisons = 0;
    for (long i = 0; i < events; i += 100) {
        int k = 0;
        for (; k < 100 && i + k < events; k++) {
            long n = i + k;
            snprintf(ids[k], sizeof ids[k], "bdl-%lld-%ld", (long long)start, n % streams);
            int poison = n % 1000 == 500;
            poisons += poison;
            ev[k] = (struct pawl_event){.stream_id = ids[k],
                                        .stream_seq = PAWL_SEQ_ANY,
                                        .type = poison ? "poison" : "T",
                                        .payload = "{}",
                                        .payload_len = 2};
        }
        struct pawl_append_result res;
        if (pawl_append(store, ev, (size_t)k, &res)) {
            fprintf(stderr, "append: %s\n", res.message);
            return 1;
        }
    }
    int64_t end = 0;
    for (int i = 0; i < 500 && end < start + events; i++) {
        src->ops->head(src, &end);
        usleep(10000);
    }
    printf("mode,run,events,seconds,events_per_s\n");
    double rate[2][20];
    for (long r = -1; r < repeat; r++) {
        for (int mode = 0; mode < 2; mode++) {
            poison_on = mode;
            char name[64];
            snprintf(name, sizeof name, "bdl-%lld-%d-%ld", (long long)start, mode, r + 1);
            struct pawl_processor_opts o;
            pawl_processor_opts_defaults(&o);
            o.name = name;
            o.batch_size = (uint32_t)batch;
            o.initial_token = start;
            o.claim_poll_ms = 100;
            o.dead_letter_attempts = 3;
            struct pawl_handler h = {"proj", NULL, handle, NULL};
            struct pawl_processor *p;
            if (pawl_processor_new(&p, &o, src, tok, &h, 1) || pawl_processor_start(p)) {
                fprintf(stderr, "processor failed\n");
                return 1;
            }
            double t0 = now_s(), t = 0;
            for (;;) {
                struct pawl_processor_stats st;
                pawl_processor_stats(p, &st);
                if ((long)(st.events + st.letters_parked) >= events) {
                    t = now_s() - t0;
                    break;
                }
                if (now_s() - t0 > 300) {
                    fprintf(stderr, "timed out\n");
                    return 1;
                }
                usleep(2000);
            }
            pawl_processor_free(p);
            if (r >= 0) {
                rate[mode][r] = events / t;
                printf("%s,%ld,%ld,%.3f,%.0f\n", mode ? "poison" : "clean", r + 1, events, t,
                       events / t);
            }
        }
    }
    qsort(rate[0], (size_t)repeat, sizeof(double), cmp_d);
    qsort(rate[1], (size_t)repeat, sizeof(double), cmp_d);
    double c = rate[0][repeat / 2], q = rate[1][repeat / 2];
    printf("# %ld events, %ld poison (0.1%%), %ld streams, batch %ld: median clean %.0f ev/s, "
           "poisoned %.0f ev/s, ratio %.2f (goal >= 0.90)\n",
           events, poisons, streams, batch, c, q, q / c);
    pawl_tokens_free(tok);
    pawl_source_free(src);
    pawl_store_free(store);
    return 0;
}
