/*
 * testctl.h — the one entry point through which tests reach into the library (after SQLite's
 * sqlite3_test_control): fault hooks and simulated environments that no embedder needs. Not in
 * the public headers and not exported from libpawl.so; tests link the static library.
 *
 * Each operation names its arguments below. Unknown operations, and arguments of the wrong kind
 * (a PostgreSQL source where the in-memory one is expected is the caller's bug, as with the
 * public functions), return PAWL_EINVAL.
 */
#ifndef PAWL_ENGINE_TESTCTL_H
#define PAWL_ENGINE_TESTCTL_H

#include <stdint.h>

#include "pawl/processor.h"

enum pawl_testctl_op {
    /* (int err): timers objects created from now on act as if io_uring setup failed with err
     * (EPERM, as a seccomp profile answers; ENOSYS); 0 turns it off. Process-wide. */
    PAWL_TESTCTL_URING_ERRNO = 1,
    /* (struct pawl_source *mem, int n): the in-memory source's next n reads fail (PAWL_ECONN). */
    PAWL_TESTCTL_SOURCE_MEM_FAIL_READS = 2,
    /* (struct pawl_tokens *mem, int nth): the in-memory token store's nth commit from now fails
     * (PAWL_ECONN, nothing applied); 0 cancels. */
    PAWL_TESTCTL_TOKENS_MEM_FAIL_COMMIT = 3,
    /* (struct pawl_tokens *mem, const char *proc, uint32_t seg_id, const char *thief): hand a
     * segment's claim to another owner. 0 or PAWL_ENOTFOUND. */
    PAWL_TESTCTL_TOKENS_MEM_STEAL = 4,
};

/* Run one test-control operation; see enum pawl_testctl_op. 0 or a PAWL_E* code. */
int pawl_test_control(int op, ...);

/* The modules' ends of the operations above; call them through pawl_test_control. */
int pawl_testctl_uring_errno(void);
void pawl_source_mem_fail_reads(struct pawl_source *s, int n);
void pawl_tokens_mem_fail_commit(struct pawl_tokens *t, int nth);
int pawl_tokens_mem_steal(struct pawl_tokens *t, const char *proc, uint32_t seg_id,
                          const char *thief);

#endif
