/*
 * testctl.h — the one entry point through which tests reach into the library (after SQLite's
 * sqlite3_test_control): fault hooks and simulated environments that no embedder needs. Not in
 * the public headers and not exported from libpawl.so; tests link the static library.
 *
 * Core calls nothing above it, so the fault switches live here: a test arms a switch for an
 * object through pawl__test_control, and the module that fails asks at the point of failure
 * (pawl__fault_sim, as SQLite's modules call sqlite3FaultSim), keying the switch by the address of
 * its object. An operation that acts on a module's object itself (TOKENS_MEM_STEAL) runs a
 * handler that the module installs when it creates such an object (pawl__testctl_install).
 *
 * Each operation names its arguments below. Unknown operations, a NULL object, and an operation
 * whose module has installed no handler return PAWL_EINVAL. A switch armed for an object that
 * never asks for it (a PostgreSQL source where the in-memory one is meant) does nothing.
 * Every function here may be called from any thread.
 */
#ifndef PAWL_ENGINE_TESTCTL_H
#define PAWL_ENGINE_TESTCTL_H

#include <stdarg.h>
#include <stdbool.h>

enum pawl_testctl_op {
    /* (int err): timers objects created from now on act as if io_uring setup failed with err
     * (EPERM, as a seccomp profile answers; ENOSYS); 0 turns it off. Process-wide. */
    PAWL_TESTCTL_URING_ERRNO = 1,
    /* (struct pawl_source *mem, int n): the in-memory source's next n reads fail (PAWL_ECONN);
     * 0 cancels. */
    PAWL_TESTCTL_SOURCE_MEM_FAIL_READS = 2,
    /* (struct pawl_tokens *mem, int nth): the in-memory token store's nth commit from now fails
     * (PAWL_ECONN, nothing applied); 0 cancels. */
    PAWL_TESTCTL_TOKENS_MEM_FAIL_COMMIT = 3,
    /* (struct pawl_tokens *mem, const char *proc, uint32_t seg_id, const char *thief): hand a
     * segment's claim to another owner. 0, PAWL_ENOTFOUND, or PAWL_EINVAL for a store that is
     * not the in-memory one. */
    PAWL_TESTCTL_TOKENS_MEM_STEAL = 4,
    PAWL_TESTCTL_OP_END /* one past the last operation */
};

/* Run one test-control operation; see enum pawl_testctl_op. 0 or a PAWL_E* code. */
int pawl__test_control(int op, ...);

/* The faults modules simulate, each read by one module. */
enum pawl_fault {
    PAWL_FAULT_SOURCE_MEM_READ = 1,   /* source_mem.c: a read fails (SOURCE_MEM_FAIL_READS) */
    PAWL_FAULT_TOKENS_MEM_COMMIT = 2, /* tokens_mem.c: a commit fails (TOKENS_MEM_FAIL_COMMIT) */
};

/*
 * The failing module, at the point of failure: true if the switch armed for fault f on obj fires
 * at this call (and counts the call). One relaxed load while no switch is armed anywhere.
 */
bool pawl__fault_sim(enum pawl_fault f, const void *obj);

/* The module freeing obj: drop obj's switches, so that an object later allocated at the same
 * address starts with none. */
void pawl__fault_forget(const void *obj);

/*
 * A module's end of an operation on its own objects: called by pawl__test_control with the
 * operation's arguments (read them with va_arg); returns the operation's result. Installing the
 * same handler again is harmless; the handler stays until the process ends.
 */
typedef int (*pawl_testctl_fn)(va_list ap);
void pawl__testctl_install(int op, pawl_testctl_fn fn);

/* Timers' end of PAWL_TESTCTL_URING_ERRNO: the errno to simulate, or 0. */
int pawl__testctl_uring_errno(void);

#endif
