/*
 * futex.c — thin wrappers over futex(2) FUTEX_WAIT_PRIVATE / FUTEX_WAKE_PRIVATE.
 */
#include "futex.h"

#include "common.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int pawl__futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns)
{
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000);
        ts.tv_nsec = (long)(timeout_ns % 1000000000);
        tsp = &ts;
    }
    long rc = syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, tsp, NULL, 0);
    if (rc == -1 && errno == ETIMEDOUT)
        return PAWL_ETIMEDOUT;
    return 0;
}

int pawl__futex_wake(uint32_t *word, int n)
{
    long rc = syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
    return rc > 0 ? (int)rc : 0;
}
