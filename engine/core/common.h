/*
 * common.h — private helpers every pawl module may use: allocation through the embedder's
 * hooks, cache-line padding, branch hints and small logging shortcuts. Never installed.
 *
 * Names: a global function or variable that include/pawl/ does not declare is private to the
 * library and is named pawl__<module>_<name> (double underscore: pawl__log_op_submit,
 * pawl__pgpool_new; core's general helpers, pawl__strdup), so that no private name reads as the
 * public API's pawl_<module>_<verb>. Hidden visibility keeps them out of libpawl.so;
 * tests/unit/test_abi.sh checks both.
 */
#ifndef PAWL_ENGINE_COMMON_H
#define PAWL_ENGINE_COMMON_H

#include "pawl/common.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define PAWL_CACHELINE 64
#define PAWL_LIKELY(x) __builtin_expect(!!(x), 1)
#define PAWL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define PAWL_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define PAWL_MIN(a, b) ((a) < (b) ? (a) : (b))
#define PAWL_MAX(a, b) ((a) > (b) ? (a) : (b))

/*
 * Atomics are C11 <stdatomic.h> operations with an explicit memory order. The runtime's shared
 * words are declared with their plain types, because the public structs that hold some of them
 * (pawl_task, pawl_serial, pawl_timer) must stay usable from C++, and because accesses that need
 * no atomicity (initialisation, an owner's reads of a word only it writes) stay plain accesses.
 * PAWL_ATOMIC_OF(p) is *p seen as the _Atomic object of the same type that the atomic
 * operations take: _Atomic is a qualifier (C11 6.7.3), and the lock-free scalar and pointer
 * types used this way have the same size and alignment atomic or not (asserted below).
 */
#define PAWL_ATOMIC_OF(p) ((_Atomic __typeof__(*(p)) *)(p))
/* NOLINTBEGIN(misc-redundant-expression): equal here; the check is for targets where not. */
_Static_assert(sizeof(_Atomic uint32_t) == sizeof(uint32_t) &&
                   _Alignof(_Atomic uint32_t) == _Alignof(uint32_t) &&
                   sizeof(_Atomic uint64_t) == sizeof(uint64_t) &&
                   _Alignof(_Atomic uint64_t) == _Alignof(uint64_t) &&
                   sizeof(void *_Atomic) == sizeof(void *) &&
                   _Alignof(void *_Atomic) == _Alignof(void *) && ATOMIC_LLONG_LOCK_FREE == 2 &&
                   ATOMIC_POINTER_LOCK_FREE == 2,
               "PAWL_ATOMIC_OF needs lock-free atomics laid out as their plain types");
/* NOLINTEND(misc-redundant-expression) */

/*
 * Start fetching the cache line at p for writing. __builtin_prefetch(p, 1) becomes a plain read
 * prefetch (prefetcht0) on x86-64 unless the build targets PRFCHW: the line then arrives shared
 * and the write still waits for the other cores' copies to be invalidated, which is the whole
 * cost when the line was last written on another core. PREFETCHW asks for it exclusive. x86-64
 * processors without PRFCHW (Intel before Broadwell) execute the opcode as a no-op.
 */
static inline void pawl_prefetch_w(const void *p)
{
#if defined(__x86_64__)
    __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 1);
#endif
}

/*
 * PAWL_ASSERT(cond): an invariant the code relies on ("owner only", "lock held", a state
 * machine's legal transition, a range). Compiled in when PAWL_ASSERTIONS is defined (the
 * Debug, sanitizer and fuzz builds; CMake decides): a false condition logs the expression and
 * its place and aborts. Otherwise the condition is not evaluated (only type-checked), so it may
 * be as expensive as clarity needs, and must have no side effect.
 */
#ifdef PAWL_ASSERTIONS
#define PAWL_ASSERT(cond)                                                                          \
    (PAWL_LIKELY(cond) ? (void)0 : pawl__assert_fail(#cond, __FILE__, __LINE__, __func__))
#define PAWL_ASSERTIONS_ON 1
#else
#define PAWL_ASSERT(cond) ((void)(0 && (cond)))
#define PAWL_ASSERTIONS_ON 0
#endif
void pawl__assert_fail(const char *expr, const char *file, int line, const char *func)
    __attribute__((noreturn, cold));

/*
 * A number that identifies the calling thread while it lives (for owner checks in asserts): the
 * address of one thread-local byte, defined once in common.c so that every file gets the same
 * number on the same thread.
 */
extern _Thread_local char pawl__thread_tag;
static inline uintptr_t pawl_thread_tag(void)
{
    return (uintptr_t)&pawl__thread_tag;
}

/*
 * For PAWL_ASSERT(pawl_mutex_locked(&mu)), "mu held": 1 when mu is locked. A default mutex
 * cannot say by whom, so this catches a caller that holds nothing while no other thread holds mu
 * either (the usual case in tests). A caller that does hold mu only sees trylock fail, so the
 * check adds no synchronisation a race detector could mistake for the real locking.
 */
static inline int pawl_mutex_locked(pthread_mutex_t *mu)
{
    int rc = pthread_mutex_trylock(mu);
    if (rc == 0) {
        pthread_mutex_unlock(mu);
        return 0;
    }
    return rc == EBUSY;
}

extern struct pawl_allocator pawl__alloc;

static inline void *pawl_malloc(size_t n)
{
    return pawl__alloc.malloc(n);
}
static inline void *pawl_calloc(size_t n, size_t size)
{
    return pawl__alloc.calloc(n, size);
}
static inline void *pawl_realloc(void *p, size_t n)
{
    return pawl__alloc.realloc(p, n);
}
static inline void pawl_free(void *p)
{
    pawl__alloc.free(p);
}
char *pawl__strdup(const char *s);

/* *ts = the time on `clock` plus ns (>= 0): an absolute deadline for timed waits. */
void pawl__timespec_in(struct timespec *ts, clockid_t clock, int64_t ns);

/* A condition variable timed on CLOCK_MONOTONIC (a wall-clock step neither cuts nor stretches
 * its waits); what pawl__timed_wait's fallback expects when given CLOCK_MONOTONIC. */
void pawl__cond_init_monotonic(pthread_cond_t *c);

/* The wall-clock time now as log lines show it ("2026-12-02T17:28:29.612Z"); returns out. */
char *pawl__utc_stamp(char *out, size_t len);
/* Write s as a JSON string body (without quotes), escaping what JSON requires. */
void pawl__json_escape(FILE *f, const char *s);
/* pawl_log_stderr (the default sink) and pawl_printable (untrusted text for terminals) are
 * public: pawl/common.h. */

#define PAWL_DEBUG(mod, ...) pawl_log(PAWL_LOG_DEBUG, mod, __VA_ARGS__)
#define PAWL_INFO(mod, ...) pawl_log(PAWL_LOG_INFO, mod, __VA_ARGS__)
#define PAWL_WARN(mod, ...) pawl_log(PAWL_LOG_WARN, mod, __VA_ARGS__)
#define PAWL_ERROR(mod, ...) pawl_log(PAWL_LOG_ERROR, mod, __VA_ARGS__)

#endif
