/*
 * fault_alloc.h — SQLite-style allocation-failure sweeps through pawl's allocator hooks.
 *
 * fault_alloc_install() routes the library's allocations through counting wrappers of the C
 * library's allocator. fault_alloc_sweep() then builds an object again and again, failing the
 * 1st, 2nd, 3rd ... allocation the constructor makes on the calling thread, until it succeeds
 * without the failure having been hit. (Threads the constructor starts allocate on their own
 * schedule and are not failed: their failures are the runtime's to handle, not the
 * constructor's; the live count covers their allocations all the same.) Each failed
 * construction must return PAWL_ENOMEM, leave its out-pointer NULL and give back every
 * allocation it made (the live count returns to where it was; under ASan LeakSanitizer checks the
 * same at exit). Allocations made by libpq, liburing or the C library itself do not pass through
 * the hooks and are not counted.
 */
#ifndef PAWL_FAULT_ALLOC_H
#define PAWL_FAULT_ALLOC_H

#include <stddef.h>

/* Install the counting allocator (once per process, before creating any pawl object). */
void fault_alloc_install(void);

/* Fail the calling thread's nth allocation from now (1-based); 0 disarms. Only one fails. */
void fault_alloc_arm(long nth);

/* 1 once the armed allocation has been failed. */
int fault_alloc_fired(void);

/* Allocations through the hooks not yet freed (relative: compare two readings). */
long fault_alloc_live(void);

/* Construct into *obj (return 0 or a PAWL_E* code) and destroy an object. */
typedef int (*fault_alloc_make_fn)(void *ctx, void **obj);
typedef void (*fault_alloc_free_fn)(void *ctx, void *obj);

/*
 * The sweep described above; fails the cmocka test on the first violation, naming the
 * allocation. Returns how many constructions failed (the allocations the constructor makes).
 */
long fault_alloc_sweep(const char *what, fault_alloc_make_fn make, fault_alloc_free_fn destroy,
                       void *ctx);

#endif
