/*
 * proc_helper.c — one processor node in its own process, for the multi-process tests.
 *
 * Usage: proc_helper DSN PROCESSOR NODE CLAIM_TIMEOUT_MS BATCH_SIZE [DEAD_LETTER_ATTEMPTS [FIXED]]
 *
 * Runs a PostgreSQL processor whose handler applies each event to an exactly-once projection
 * with SELECT proj_apply(stream, seq) queued into the batch transaction (the test creates the
 * function). With DEAD_LETTER_ATTEMPTS > 0 the processor parks dead letters, and the handler
 * refuses events of type "poison" as PAWL_EPOISON unless FIXED is 1 (or SIGUSR1 arrived).
 * Runs until SIGTERM or SIGINT (then stops, releasing its claims) or SIGKILL.
 */
#include "pawl.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static volatile sig_atomic_t fixed;

static void on_fix(int sig)
{
    (void)sig;
    fixed = 1;
}

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static int apply(void *self, struct pawl_event_ctx *ctx)
{
    (void)self;
    const struct pawl_event *e = pawl_ctx_event(ctx);
    if (!fixed && strcmp(e->type, "poison") == 0)
        return pawl_ctx_error(ctx, PAWL_EPOISON, "poison event");
    char seq[32];
    snprintf(seq, sizeof seq, "%lld", (long long)e->stream_seq);
    const char *v[2] = {e->stream_id, seq};
    return pawl_txn_exec(pawl_ctx_txn(ctx), "SELECT proj_apply($1, $2)", 2, v);
}

int main(int argc, char **argv)
{
    if (argc < 6 || argc > 8) {
        fprintf(stderr, "usage: proc_helper DSN PROCESSOR NODE CLAIM_TIMEOUT_MS BATCH_SIZE "
                        "[DEAD_LETTER_ATTEMPTS [FIXED]]\n");
        return 2;
    }
    fixed = argc > 7 && atoi(argv[7]) == 1;
    signal(SIGUSR1, on_fix);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    struct pawl_source *src = NULL;
    struct pawl_tokens *tok = NULL;
    struct pawl_processor *p = NULL;
    if (pawl_source_pg_new(&src, argv[1]) || pawl_tokens_pg_new(&tok, argv[1])) {
        fprintf(stderr, "proc_helper: cannot open the database\n");
        return 1;
    }
    struct pawl_processor_opts o;
    pawl_processor_opts_defaults(&o);
    o.name = argv[2];
    o.node_id = argv[3];
    o.claim_timeout_ms = (uint32_t)atoi(argv[4]);
    o.batch_size = (uint32_t)atoi(argv[5]);
    o.claim_poll_ms = 100;
    o.backoff_min_ms = 100;
    o.backoff_max_ms = 1000;
    o.dead_letter_attempts = argc > 6 ? (uint32_t)atoi(argv[6]) : 0;
    struct pawl_handler h = {"proj", NULL, apply, NULL};
    int rc = pawl_processor_new(&p, &o, src, tok, &h, 1);
    if (rc == 0)
        rc = pawl_processor_start(p);
    if (rc) {
        fprintf(stderr, "proc_helper: %s\n", pawl_strerror(rc));
        return 1;
    }
    while (!stop)
        usleep(20000);
    pawl_processor_free(p);
    pawl_tokens_free(tok);
    pawl_source_free(src);
    return 0;
}
