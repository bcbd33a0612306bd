/*
 * embed.c — a program embedding pawl, built against the installed library only:
 *
 *     cc embed.c $(pkg-config --cflags --libs pawl)
 *
 * It shows the pieces an embedding service uses first: the config struct and its flag table
 * (values checked the way the pawl tool checks them), routing pawl's logs into the service's
 * own logger, an event log (the in-memory one here, so the example needs no database), and the
 * metrics snapshot in Prometheus text format.
 */
#include <pawl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The service's own logger: pawl's messages arrive here, on whichever thread logged. */
static void my_logger(void *ud, enum pawl_log_level level, const char *module, const char *msg)
{
    static const char *names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    fprintf((FILE *)ud, "[embed %s] %s: %s\n", names[level], module, msg);
}

int main(void)
{
    pawl_log_set_sink(my_logger, stdout);

    /* Configuration: the same table, names and ranges as the pawl tool's flags. */
    struct pawl_config cfg;
    char err[256];
    pawl_config_defaults(&cfg);
    if (pawl_config_set(&cfg, "batch-size", "250", err, sizeof err) != 0 ||
        pawl_config_set(&cfg, "log-level", "info", err, sizeof err) != 0) {
        fprintf(stderr, "embed: %s\n", err);
        return 1;
    }
    if (pawl_config_set(&cfg, "batch-size", "0", err, sizeof err) != PAWL_ERANGE) {
        fprintf(stderr, "embed: batch-size 0 should be refused\n");
        return 1;
    }
    printf("refused as expected: %s\n", err);
    pawl_config_apply_log(&cfg);
    printf("batch size %u, claim timeout %u ms\n", cfg.processor.batch_size,
           cfg.processor.claim_timeout_ms);
    pawl_log(PAWL_LOG_INFO, "embed", "configured (%zu flags in the table)",
             pawl_config_flag_count());

    /* An event log: the in-memory one; a service uses the PostgreSQL log the same way. */
    struct pawl_source *log = NULL;
    int rc = pawl_source_mem_new(&log);
    if (rc != 0) {
        fprintf(stderr, "embed: %s\n", pawl_strerror(rc));
        return 1;
    }
    struct pawl_event evs[3] = {
        {.stream_id = "order-1", .type = "Placed", .payload = "{}", .payload_len = 2},
        {.stream_id = "order-1", .type = "Paid", .payload = "{}", .payload_len = 2},
        {.stream_id = "order-2", .type = "Placed", .payload = "{}", .payload_len = 2},
    };
    rc = pawl_source_mem_append(log, evs, 3);
    struct pawl_event_batch batch;
    pawl_event_batch_init(&batch);
    int64_t seen = 0;
    if (rc == 0)
        rc = log->ops->read(log, PAWL_TOKEN_START, 100, &batch, &seen);
    if (rc != 0 || batch.n != 3) {
        fprintf(stderr, "embed: read %zu events: %s\n", batch.n, pawl_strerror(rc));
        return 1;
    }
    for (size_t i = 0; i < batch.n; i++)
        printf("event %lld %s %s\n", (long long)batch.events[i].index, batch.events[i].stream_id,
               batch.events[i].type);
    pawl_event_batch_fini(&batch);
    pawl_source_free(log);

    /* Metrics: a snapshot, rendered as Prometheus text. */
    struct pawl_metrics_snapshot *snap = malloc(sizeof *snap);
    size_t need = 0;
    if (snap == NULL || pawl_metrics_snapshot(snap) != 0)
        return 1;
    pawl_metrics_format_prometheus(snap, NULL, 0, &need);
    char *text = malloc(need + 1);
    if (text == NULL || pawl_metrics_format_prometheus(snap, text, need + 1, NULL) != 0)
        return 1;
    printf("metrics: %zu bytes of Prometheus text, first line: %.*s\n", need,
           (int)strcspn(text, "\n"), text);
    free(text);
    free(snap);
    pawl_config_fini(&cfg);
    printf("embed: ok\n");
    return 0;
}
