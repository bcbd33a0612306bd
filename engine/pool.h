/*
 * pool.h — private entry points of the work-stealing pool for the other runtime modules.
 */
#ifndef PAWL_ENGINE_POOL_H
#define PAWL_ENGINE_POOL_H

#include "pawl/runtime.h"

/*
 * Queue t at the back of the pool's shared FIFO (the injection queue) even from a worker, so
 * that it runs after work that is already waiting: serial executors use it to yield after a
 * batch, which keeps one busy executor from starving the others on the same worker.
 */
int pawl_pool_yield(struct pawl_pool *pool, struct pawl_task *t);

/* The pool whose worker the calling thread is, or NULL. */
struct pawl_pool *pawl_pool_current(void);

/* CPU relaxation hint for short spins. */
static inline void pawl_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif
