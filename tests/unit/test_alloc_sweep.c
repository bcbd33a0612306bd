/*
 * test_alloc_sweep.c — allocation failure in the runtime's and the processor's constructors:
 * pawl_pool_new, pawl_timers_new and pawl_processor_new are run with their 1st, 2nd, ...
 * allocation failed until they succeed (tests/support/fault_alloc.h); each failure must return
 * PAWL_ENOMEM, leave nothing allocated and nothing running. Under ASan LeakSanitizer also checks
 * the memory the hooks do not see. pawl_store_new has its own sweep in tests/pg.
 */
#include "fault_alloc.h"
#include "pawl_test.h"

#include <stdint.h>
#include <stdlib.h>

static int make_pool(void *ctx, void **obj)
{
    struct pawl_pool_opts o;
    pawl_pool_opts_defaults(&o);
    o.workers = 3;
    return pawl_pool_new((struct pawl_pool **)obj, &o);
}

static void free_pool(void *ctx, void *obj)
{
    pawl_pool_free(obj);
}

static void test_pool_new(void **state)
{
    assert_true(fault_alloc_sweep("pawl_pool_new", make_pool, free_pool, NULL) >= 3);
}

struct timers_ctx {
    struct pawl_pool *pool;
    enum pawl_timer_backend backend;
};

static int make_timers(void *ctx, void **obj)
{
    struct timers_ctx *c = ctx;
    struct pawl_timers_opts o;
    pawl_timers_opts_defaults(&o);
    o.backend = c->backend;
    return pawl_timers_new((struct pawl_timers **)obj, c->pool, &o);
}

static void free_timers(void *ctx, void *obj)
{
    pawl_timers_free(obj);
}

static void test_timers_new(void **state)
{
    struct timers_ctx c = {NULL, PAWL_TIMER_BACKEND_EPOLL};
    assert_int_equal(pawl_pool_new(&c.pool, NULL), 0);
    assert_true(fault_alloc_sweep("pawl_timers_new (epoll)", make_timers, free_timers, &c) >= 1);
    /* io_uring where the kernel allows it (the sweep then covers the ring's set-up path). */
    c.backend = PAWL_TIMER_BACKEND_AUTO;
    fault_alloc_sweep("pawl_timers_new (auto)", make_timers, free_timers, &c);
    pawl_pool_free(c.pool);
}

static int handle_none(void *self, struct pawl_event_ctx *ctx)
{
    return 0;
}

/* A fresh in-memory world per construction (the token store keeps the rows that a processor's
 * construction adds, so one shared store would count them as a leak): the sweep also covers
 * pawl_source_mem_new and pawl_tokens_mem_new. Its own struct comes from malloc, not the
 * hooks, so only the library's allocations are counted. */
struct world {
    struct pawl_source *src;
    struct pawl_tokens *tok;
    struct pawl_processor *p;
};

static void free_world(void *ctx, void *obj)
{
    struct world *w = obj;
    pawl_processor_free(w->p);
    pawl_tokens_free(w->tok);
    pawl_source_free(w->src);
    free(w);
}

static int claimed_none(void *self, struct pawl_segment seg, struct pawl_trigger *trigger)
{
    return 0;
}

static struct pawl_future *advanced_none(void *self, struct pawl_segment seg, int64_t token)
{
    return NULL;
}

/* A checkpointing unit makes the processor start its own pool and timers. */
static const struct pawl_checkpointing ckpt = {.on_segment_claimed = claimed_none,
                                               .on_checkpoint_advanced = advanced_none};

static int make_processor(void *ctx, void **obj)
{
    uintptr_t segments = (uintptr_t)ctx & 0xffff;
    const struct pawl_checkpointing *unit = (uintptr_t)ctx >> 16 ? &ckpt : NULL;
    const struct pawl_handler h[2] = {{"a", NULL, handle_none, NULL},
                                      {"b", NULL, handle_none, unit}};
    struct world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    *obj = NULL;
    int rc = pawl_source_mem_new(&w->src);
    if (rc == 0)
        rc = pawl_tokens_mem_new(&w->tok);
    if (rc == 0) {
        struct pawl_processor_opts o;
        pawl_processor_opts_defaults(&o);
        o.name = "sweep";
        o.node_id = "n1";
        o.threads = 2;
        o.segments = (uint32_t)segments;
        rc = pawl_processor_new(&w->p, &o, w->src, w->tok, h, 2);
        if (rc == 0) {
            *obj = w;
            return 0;
        }
        assert_null(w->p);
    }
    free_world(NULL, w);
    return rc;
}

static void test_processor_new(void **state)
{
    assert_true(fault_alloc_sweep("pawl_processor_new", make_processor, free_world,
                                  (void *)(uintptr_t)4) >= 3);
    /* More segments than the token store's first allocation holds. */
    fault_alloc_sweep("pawl_processor_new (64 segments)", make_processor, free_world,
                      (void *)(uintptr_t)64);
    fault_alloc_sweep("pawl_processor_new (checkpointing)", make_processor, free_world,
                      (void *)(uintptr_t)(1 << 16 | 4));
}

int main(void)
{
    fault_alloc_install();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_new),
        cmocka_unit_test(test_timers_new),
        cmocka_unit_test(test_processor_new),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
