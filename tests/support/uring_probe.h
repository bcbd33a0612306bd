/*
 * uring_probe.h — what this machine's kernel answers to io_uring, asked directly through
 * liburing rather than through the library under test, so that the io_uring half of a test can
 * tell the kernel's refusal (reported as skipped) from a set-up bug in pawl (a failure).
 *
 * A refusal is what pawl's backends may meet on a healthy machine: io_uring_setup failing with
 * ENOSYS (not built into the kernel, or a seccomp profile), EPERM (kernel.io_uring_disabled, a
 * container's seccomp profile) or EACCES (a security module), or a kernel older than what the
 * backends need (IORING_FEAT_EXT_ARG; poll add and remove, read, timeout and timeout removal).
 * Any other failure of the probe is not a refusal: it fails the test.
 *
 * PAWL_REQUIRE_IO_URING set to a true value (1, true, yes, on) turns a refusal into a failure:
 * `make test` sets it when the kernel allows io_uring, so that no io_uring case can be skipped
 * there for a reason other than the kernel's.
 */
#ifndef PAWL_TEST_URING_PROBE_H
#define PAWL_TEST_URING_PROBE_H

#include <stddef.h>

/*
 * 0 when the kernel allows io_uring, 1 when it refuses it (why, if not NULL, says how). A probe
 * failure that is not a refusal prints it and exits 1. The answer is computed once per process.
 */
int pawl_test_uring_refused(char *why, size_t len);

/* Whether PAWL_REQUIRE_IO_URING asks for io_uring: 1 for a true value, 0 unset, empty or false;
 * any other value prints why and exits 1 (the tool refuses it too). */
int pawl_test_uring_required(void);

/*
 * Enter the io_uring half of a test (what names it in the messages): returns when the kernel
 * allows io_uring; otherwise prints the reason and exits 77 (skipped), or exits 1 (failed)
 * when PAWL_REQUIRE_IO_URING is set.
 */
void pawl_test_uring_half(const char *what);

/*
 * The `--probe-io-uring` argument of the test programs that have one: prints the answer and
 * returns the exit status: 0 the kernel allows io_uring, 77 it refuses it (1 when the probe
 * itself fails, by exiting).
 */
int pawl_test_uring_probe_main(void);

#endif
