/*
 * test_assert.c — PAWL_ASSERT: compiled into the Debug and sanitizer builds, where a broken
 * invariant aborts with the expression and its place (checked in a child process: a deque pushed
 * from a thread that is not its owner, and a timer hold dropped that nobody took), and compiled out
 * of release builds, where the condition is not even evaluated.
 */
#include "pawl_test.h"

#include "common.h"
#include "deque.h"
#include "timers.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static struct pawl_deque dq;
static struct pawl_task task;

static void *push_from_other_thread(void *arg)
{
    pawl__deque_push_owner(&dq, &task);
    return NULL;
}

static void violate_deque_owner(void)
{
    pawl__deque_init(&dq, 4);
    pawl__deque_push_owner(&dq, &task); /* this thread owns it now */
    (void)pawl__deque_pop_owner(&dq);
    pthread_t th;
    pthread_create(&th, NULL, push_from_other_thread, NULL);
    pthread_join(th, NULL);
}

static void timer_cb(struct pawl_timer *t, void *arg, int status) {}

static void violate_timer_hold(void)
{
    struct pawl_timer t;
    pawl_timer_init(&t, timer_cb, NULL);
    pawl__timer_unhold(&t); /* drops a hold nobody took */
}

/* Run fn in a child; return its stderr (static buffer) and whether it died of SIGABRT. */
static const char *run_child(void (*fn)(void), int *aborted)
{
    static char buf[4096];
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        fn();
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t k;
    while (n < sizeof buf - 1 && (k = read(fds[0], buf + n, sizeof buf - 1 - n)) > 0)
        n += (size_t)k;
    buf[n] = '\0';
    close(fds[0]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    *aborted = WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
    return buf;
}

static void test_asserts(void **state)
{
    int aborted;
    const char *err = run_child(violate_deque_owner, &aborted);
    if (PAWL_ASSERTIONS_ON) {
        print_message("deque owner violation: %s", err);
        assert_true(aborted);
        assert_non_null(strstr(err, "assertion failed"));
        assert_non_null(strstr(err, "deque.c"));
        err = run_child(violate_timer_hold, &aborted);
        print_message("timer hold violation: %s", err);
        assert_true(aborted);
        assert_non_null(strstr(err, "timers.c"));
    } else {
        assert_false(aborted); /* compiled out: the misuse goes unnoticed here */
        int evaluated = 0;
        PAWL_ASSERT(++evaluated);
        assert_int_equal(evaluated, 0);
    }
}

int main(void)
{
    print_message("PAWL_ASSERT is %s in this build\n", PAWL_ASSERTIONS_ON ? "on" : "off");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_asserts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
