/*
 * runtime_test.h — small helpers for the runtime's tests: iteration scaling under sanitizers
 * (ThreadSanitizer runs such loops ~10x slower), polling waits, and thread helpers.
 */
#ifndef PAWL_RUNTIME_TEST_H
#define PAWL_RUNTIME_TEST_H

#include "common.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define PAWL_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define PAWL_TEST_SANITIZED 1
#endif
#endif
#ifndef PAWL_TEST_SANITIZED
#define PAWL_TEST_SANITIZED 0
#endif

/* n, divided by 10 under a sanitizer (at least 1). */
#define PAWL_TEST_SCALE(n) (PAWL_TEST_SANITIZED ? ((n) / 10 > 0 ? (n) / 10 : 1) : (n))

static inline int64_t rt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Poll cond (an expression) every millisecond until true or timeout_ms; evaluates to cond. */
#define RT_WAIT_UNTIL(cond, timeout_ms)                                                            \
    ({                                                                                             \
        int64_t rt_deadline_ = rt_now_ms() + (timeout_ms);                                         \
        while (!(cond) && rt_now_ms() < rt_deadline_)                                              \
            usleep(1000);                                                                          \
        (cond);                                                                                    \
    })

static inline uint64_t rt_load(const uint64_t *p)
{
    return atomic_load_explicit(PAWL_ATOMIC_OF(p), memory_order_acquire);
}

static inline void rt_inc(uint64_t *p)
{
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(p), 1, memory_order_acq_rel);
}

#endif
