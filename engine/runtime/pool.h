/*
 * pool.h — private entry points of the work-stealing pool for the other runtime modules.
 */
#ifndef PAWL_ENGINE_POOL_H
#define PAWL_ENGINE_POOL_H

#include "common.h"
#include "pawl/runtime.h"

/*
 * Queue t at the back of the pool's shared FIFO (the injection queue) even from a worker, so
 * that it runs after work that is already waiting: serial executors use it to yield after a
 * batch, which keeps one busy executor from starving the others on the same worker.
 */
int pawl__pool_yield(struct pawl_pool *pool, struct pawl_task *t);

/* The pool whose worker the calling thread is, or NULL. */
struct pawl_pool *pawl__pool_current(void);

/*
 * A full (seq_cst) fence between a store and a later load, for the Dekker-style hand-shakes of
 * parking. ThreadSanitizer does not model stand-alone fences, so under it the fence becomes a
 * seq_cst read-modify-write of one shared word: both sides of a hand-shake then synchronise
 * through that word, which TSan does understand (slower, and only in sanitizer builds).
 */
#if defined(__SANITIZE_THREAD__)
#define PAWL_TSAN_FENCES 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PAWL_TSAN_FENCES 1
#endif
#endif
#ifdef PAWL_TSAN_FENCES
extern unsigned long pawl__fence_word;
static inline void pawl_fence_seq_cst(void)
{
    /* Seq_cst RMW: totally ordered with every other fence of this kind. */
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&pawl__fence_word), 1, memory_order_seq_cst);
}
#else
static inline void pawl_fence_seq_cst(void)
{
    /* Seq_cst fence: orders the caller's earlier stores before its later loads. */
    atomic_thread_fence(memory_order_seq_cst);
}
#endif

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
