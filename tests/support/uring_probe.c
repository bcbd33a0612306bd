/*
 * uring_probe.c — see uring_probe.h. Not thread-safe: call it from the test's main thread.
 */
#include "uring_probe.h"

#include "pawl_test.h"

#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int probed;       /* 0: not yet; 1: done */
static int refused;      /* the answer */
static char reason[256]; /* why it was refused, or what the kernel offers */

static void probe_fail(const char *fmt, const char *arg)
{
    fprintf(stderr, "FAIL: io_uring probe: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (not a refusal the tests may skip: a broken ring set-up)\n");
    exit(1);
}

static void probe(void)
{
    if (probed)
        return;
    probed = 1;
    struct io_uring ring;
    int rc = io_uring_queue_init(8, &ring, 0);
    if (rc == -ENOSYS || rc == -EPERM || rc == -EACCES) {
        refused = 1;
        snprintf(reason, sizeof reason, "the kernel refuses io_uring (io_uring_setup: %s)",
                 strerror(-rc));
        return;
    }
    if (rc < 0)
        probe_fail("io_uring_setup: %s", strerror(-rc));
    struct io_uring_probe *p = io_uring_get_probe_ring(&ring);
    if (p == NULL) {
        io_uring_queue_exit(&ring);
        refused = 1; /* IORING_REGISTER_PROBE came with 5.6 */
        snprintf(reason, sizeof reason,
                 "the kernel is too old for io_uring here (no opcode probe)");
        return;
    }
    static const struct {
        int op;
        const char *name;
    } ops[] = {{IORING_OP_POLL_ADD, "poll add"},
               {IORING_OP_POLL_REMOVE, "poll remove"},
               {IORING_OP_READ, "read"},
               {IORING_OP_TIMEOUT, "timeout"},
               {IORING_OP_TIMEOUT_REMOVE, "timeout removal"}};
    const char *missing = NULL;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0] && missing == NULL; i++)
        if (!io_uring_opcode_supported(p, ops[i].op))
            missing = ops[i].name;
    io_uring_free_probe(p);
    unsigned features = ring.features;
    io_uring_queue_exit(&ring);
    if (!(features & IORING_FEAT_EXT_ARG))
        missing = "the timeout argument of io_uring_enter (IORING_FEAT_EXT_ARG, 5.11)";
    if (missing) {
        refused = 1;
        snprintf(reason, sizeof reason, "the kernel is too old for io_uring here (no %s)", missing);
        return;
    }
    snprintf(reason, sizeof reason, "the kernel allows io_uring");
}

int pawl_test_uring_refused(char *why, size_t len)
{
    probe();
    if (why && len)
        snprintf(why, len, "%s", reason);
    return refused;
}

int pawl_test_uring_required(void)
{
    /* The values the tool takes for the same variable (its --require-io-uring setting). */
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    const char *v = getenv("PAWL_REQUIRE_IO_URING");
    if (v == NULL || v[0] == '\0')
        return 0;
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (strcasecmp(v, yes[i]) == 0)
            return 1;
        if (strcasecmp(v, no[i]) == 0)
            return 0;
    }
    fprintf(stderr,
            "FAIL: PAWL_REQUIRE_IO_URING=%s: expected true or false (1, yes, on; 0, no, off)\n", v);
    exit(1);
}

void pawl_test_uring_half(const char *what)
{
    probe();
    if (!refused)
        return;
    if (pawl_test_uring_required()) {
        fprintf(stderr, "FAIL: %s: %s, and PAWL_REQUIRE_IO_URING is set\n", what, reason);
        exit(1);
    }
    fprintf(stderr, "SKIP: %s: %s\n", what, reason);
    exit(PAWL_TEST_SKIP);
}

int pawl_test_uring_probe_main(void)
{
    probe();
    printf("%s\n", reason);
    return refused ? PAWL_TEST_SKIP : 0;
}
