/*
 * fault_alloc.c — the counting, failing allocator behind fault_alloc.h.
 */
#include "fault_alloc.h"

#include "pawl_test.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

/* Relaxed throughout: the counters are read by the sweeping thread after the constructor (and
 * any thread it started and joined) has returned; the join orders them. */
static atomic_long live;
static atomic_long countdown; /* > 0: the allocation that takes it to 0 fails */
static atomic_int fired;
/* Only the thread that armed the fault counts and fails allocations: the constructor's own,
 * in a fixed order. Threads it starts (a pool's workers, a connection pool's I/O thread) run on
 * their own schedule; their allocation failures are runtime faults, not the constructor's. */
static _Thread_local int armed_here;

/* 1 when this allocation is the one to fail. */
static int should_fail(void)
{
    if (!armed_here || atomic_load_explicit(&countdown, memory_order_relaxed) <= 0)
        return 0;
    if (atomic_fetch_sub_explicit(&countdown, 1, memory_order_relaxed) == 1) {
        atomic_store_explicit(&fired, 1, memory_order_relaxed);
        return 1;
    }
    return 0;
}

static void *f_malloc(size_t n)
{
    if (should_fail())
        return NULL;
    void *p = malloc(n);
    if (p)
        atomic_fetch_add_explicit(&live, 1, memory_order_relaxed);
    return p;
}

static void *f_calloc(size_t n, size_t size)
{
    if (should_fail())
        return NULL;
    void *p = calloc(n, size);
    if (p)
        atomic_fetch_add_explicit(&live, 1, memory_order_relaxed);
    return p;
}

static void *f_realloc(void *old, size_t n)
{
    if (should_fail())
        return NULL;
    void *p = realloc(old, n);
    if (old == NULL && p != NULL)
        atomic_fetch_add_explicit(&live, 1, memory_order_relaxed);
    return p;
}

static void f_free(void *p)
{
    if (p)
        atomic_fetch_sub_explicit(&live, 1, memory_order_relaxed);
    free(p);
}

void fault_alloc_install(void)
{
    struct pawl_allocator a = {f_malloc, f_calloc, f_realloc, f_free};
    pawl_set_allocator(&a);
}

void fault_alloc_arm(long nth)
{
    armed_here = nth > 0;
    atomic_store(&fired, 0);
    atomic_store(&countdown, nth);
}

int fault_alloc_fired(void)
{
    return atomic_load(&fired);
}

long fault_alloc_live(void)
{
    return atomic_load(&live);
}

long fault_alloc_sweep(const char *what, fault_alloc_make_fn make, fault_alloc_free_fn destroy,
                       void *ctx)
{
    enum pawl_log_level level = pawl_log_get_level();
    pawl_log_set_level(PAWL_LOG_OFF); /* every failure logs; the sweep checks results instead */
    long n;
    for (n = 1; n < 100000; n++) {
        long base = fault_alloc_live();
        void *obj = (void *)&obj; /* must come back NULL on failure */
        fault_alloc_arm(n);
        int rc = make(ctx, &obj);
        int hit = fault_alloc_fired();
        fault_alloc_arm(0);
        if (rc == 0) {
            destroy(ctx, obj);
            if (fault_alloc_live() != base)
                fail_msg("%s: %ld allocations leaked after a successful construction with "
                         "allocation %ld failed",
                         what, fault_alloc_live() - base, n);
            if (!hit)
                break; /* the constructor made fewer than n allocations: done */
            continue;  /* the failed allocation was tolerated (a cache, a retry) */
        }
        if (!hit)
            fail_msg("%s: failed with %s (%d) although no allocation failed", what,
                     pawl_errname(rc), rc);
        if (rc != PAWL_ENOMEM)
            fail_msg("%s: allocation %ld failed, and the constructor returned %s, not "
                     "PAWL_ENOMEM",
                     what, n, pawl_errname(rc));
        if (obj != NULL)
            fail_msg("%s: allocation %ld failed, and the out-pointer was not set to NULL", what, n);
        if (fault_alloc_live() != base)
            fail_msg("%s: allocation %ld failed, and %ld allocations were not freed", what, n,
                     fault_alloc_live() - base);
    }
    pawl_log_set_level(level);
    print_message("%s: %ld allocations, each failure handled\n", what, n - 1);
    return n - 1;
}
