/*
 * bench_reconcile.c — micro-benchmarks of the checkpoint protocol's pieces, the twins of
 * tests/unit/test_checkpoint_trigger.c and test_checkpoint_reconcile.c:
 *
 *   trigger/request_take   one request and one take (the per-cycle cost on an idle trigger)
 *   trigger/request_merged a request that does not raise the pending token (a CAS-free load)
 *   reconcile/1_unit       one checkpoint cycle, one unit whose future is already complete
 *   reconcile/3_units      one cycle, three units, one of which lags and is asked again
 *
 * Futures that are complete when returned settle without any task, so no pool is needed here.
 */
#include "gbench_shim.h"

#include "reconcile.h"
#include "trigger.h"

#include "pawl.h"

static void bench_request_take(pawl_bench_state *st, void *arg)
{
    (void)arg;
    struct pawl_trigger *t = pawl__trigger_new(NULL, NULL);
    int64_t tok = 0, got;
    while (pawl_bench_keep_running(st)) {
        pawl_trigger_request(t, ++tok);
        pawl__trigger_take(t, tok, &got);
    }
    pawl_bench_set_items_processed(st, pawl_bench_iterations(st));
    pawl__trigger_free(t);
}

static void bench_request_merged(pawl_bench_state *st, void *arg)
{
    (void)arg;
    struct pawl_trigger *t = pawl__trigger_new(NULL, NULL);
    pawl_trigger_request(t, 1000000);
    while (pawl_bench_keep_running(st))
        pawl_trigger_request(t, 5);
    pawl_bench_set_items_processed(st, pawl_bench_iterations(st));
    pawl__trigger_free(t);
}

static struct pawl_future *immediate(void *self, struct pawl_segment seg, int64_t requested)
{
    (void)seg;
    struct pawl_future *f = pawl_future_new();
    int64_t extra = self != NULL ? 10 : 0; /* the "leader" drained a little further */
    pawl_future_complete(f, requested + extra);
    return f;
}

static const struct pawl_checkpointing unit = {NULL, immediate, NULL, NULL};

static void bench_reconcile(pawl_bench_state *st, void *arg)
{
    size_t n = (size_t)(intptr_t)arg;
    static int leader;
    struct pawl_ckpt_unit units[3] = {
        {"a", NULL, &unit}, {"b", &leader, &unit}, {"c", NULL, &unit}};
    struct pawl_reconcile r;
    /* With one unit: "a" alone. With three: "b" reports 10 past the request, so "a" and "c"
     * are asked again with b's position (the re-ask round). */
    pawl__reconcile_init(&r, units, n, NULL, NULL, NULL, NULL, NULL);
    int64_t stored = 0, to_store;
    struct pawl_segment seg = {0, 15};
    while (pawl_bench_keep_running(st)) {
        int64_t req = stored + 100;
        if (pawl__reconcile_checkpoint(&r, seg, req, stored, req + 1000, &to_store) != 0) {
            pawl_bench_skip_with_error(st, "checkpoint failed");
            break;
        }
        stored = to_store;
    }
    pawl_bench_set_items_processed(st, pawl_bench_iterations(st));
    pawl__reconcile_fini(&r);
}

int main(int argc, char **argv)
{
    pawl_log_set_level(PAWL_LOG_WARN);
    pawl_bench_unit_ns(pawl_bench_register("trigger/request_take", bench_request_take, NULL));
    pawl_bench_unit_ns(pawl_bench_register("trigger/request_merged", bench_request_merged, NULL));
    pawl_bench_unit_ns(pawl_bench_register("reconcile/1_unit", bench_reconcile, (void *)1));
    pawl_bench_unit_ns(pawl_bench_register("reconcile/3_units", bench_reconcile, (void *)3));
    return pawl_bench_main(argc, argv);
}
