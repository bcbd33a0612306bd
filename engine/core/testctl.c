/*
 * testctl.c — pawl_test_control: the single door for tests into fault hooks (see testctl.h).
 */
#include "testctl.h"

#include <stdarg.h>
#include <stdatomic.h>

#include "common.h"

/* Relaxed: a test sets it before creating the timers object that reads it, on the same thread. */
static atomic_int uring_errno;

int pawl_testctl_uring_errno(void)
{
    return atomic_load_explicit(&uring_errno, memory_order_relaxed);
}

int pawl_test_control(int op, ...)
{
    va_list ap;
    int rc = 0;
    va_start(ap, op);
    switch (op) {
    case PAWL_TESTCTL_URING_ERRNO:
        atomic_store_explicit(&uring_errno, va_arg(ap, int), memory_order_relaxed);
        break;
    case PAWL_TESTCTL_SOURCE_MEM_FAIL_READS: {
        struct pawl_source *s = va_arg(ap, struct pawl_source *);
        int n = va_arg(ap, int);
        if (s == NULL)
            rc = PAWL_EINVAL;
        else
            pawl_source_mem_fail_reads(s, n);
        break;
    }
    case PAWL_TESTCTL_TOKENS_MEM_FAIL_COMMIT: {
        struct pawl_tokens *t = va_arg(ap, struct pawl_tokens *);
        int nth = va_arg(ap, int);
        if (t == NULL)
            rc = PAWL_EINVAL;
        else
            pawl_tokens_mem_fail_commit(t, nth);
        break;
    }
    case PAWL_TESTCTL_TOKENS_MEM_STEAL: {
        struct pawl_tokens *t = va_arg(ap, struct pawl_tokens *);
        const char *proc = va_arg(ap, const char *);
        uint32_t seg_id = va_arg(ap, uint32_t);
        const char *thief = va_arg(ap, const char *);
        rc = t && proc && thief ? pawl_tokens_mem_steal(t, proc, seg_id, thief) : PAWL_EINVAL;
        break;
    }
    default:
        rc = PAWL_EINVAL;
        break;
    }
    va_end(ap);
    return rc;
}
