/*
 * future.h — private hooks of futures for the runtime's own combinators: an "inline"
 * continuation runs on the completing thread. Only runtime-internal code that is short, never
 * blocks and runs no user code may use it (it completes other futures, counts, cancels a timer).
 */
#ifndef PAWL_ENGINE_FUTURE_H
#define PAWL_ENGINE_FUTURE_H

#include "pawl/runtime.h"

/* Like pawl_future_on_complete, but cb runs on the completing thread (or on the calling thread
 * if f is already done). 0 or PAWL_ENOMEM. */
int pawl__future_on_complete_inline(struct pawl_future *f, pawl_future_cb cb, void *arg);

/*
 * The future object cache (future.c), for tests: whether it is in use (compiled in and the
 * allocator hooks are libc's), the objects the calling thread holds, the objects in the shared
 * depot, and the constants. All zero when the cache is compiled out (under ASan).
 */
struct pawl__future_cache_stats {
    int enabled;
    uint32_t thread_objs;
    uint32_t depot_objs;
    uint32_t depot_max;
    uint32_t magazine;
};
void pawl__future_cache_stats(struct pawl__future_cache_stats *st);

#endif
