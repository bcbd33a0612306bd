/*
 * test_ioloop.c — the I/O threads' event loop on both backends (io_uring, and the epoll
 * fallback): level-triggered readiness, write readiness, hang-up, deadlines that are honoured
 * (never early), a wake-up from another thread, a slot moved to another descriptor (the old
 * one's readiness is not reported), and the choice of backend when io_uring is refused.
 *
 * Two halves, chosen by PAWL_TEST_IO_BACKEND (tests/CMakeLists.txt registers one ctest entry
 * each): "epoll" runs the epoll cases and the choice of backend; "io_uring" runs the io_uring
 * cases, and is skipped (exit 77, with the kernel's answer) only where the kernel refuses
 * io_uring (uring_probe.h): any other failure to set up the io_uring loop fails. Unset: both.
 * `--probe-io-uring` only prints whether the kernel allows io_uring (exit 0) or not (77).
 */
#include "pawl_test.h"
#include "uring_probe.h"

#include "ioloop.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static struct pawl_ioloop *new_loop(enum pawl_timer_backend b, unsigned nslots)
{
    struct pawl_ioloop *l = NULL;
    struct pawl_ioloop_opts o = {.backend = b};
    /* The io_uring half runs only where the kernel allows io_uring: a refusal here is a bug. */
    int rc = pawl__ioloop_new(&l, nslots, "test", &o);
    if (rc != 0)
        fail_msg("pawl__ioloop_new(%s): %s", b == PAWL_TIMER_BACKEND_EPOLL ? "epoll" : "io_uring",
                 pawl_strerror(rc));
    assert_string_equal(pawl__ioloop_backend(l),
                        b == PAWL_TIMER_BACKEND_EPOLL ? "epoll" : "io_uring");
    return l;
}

static void pair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
}

static void readiness(enum pawl_timer_backend b)
{
    struct pawl_ioloop *l = new_loop(b, 2);
    int sv[2];
    pair(sv);
    struct pawl_ioev ev[2];
    assert_int_equal(pawl__ioloop_watch(l, 1, sv[0], PAWL_IO_IN), 0);
    /* Nothing to read: the wait ends at its deadline, not before it. */
    int64_t t0 = pawl_now_ns();
    assert_int_equal(pawl__ioloop_wait(l, t0 + 20000000, ev), 0);
    assert_true(pawl_now_ns() - t0 >= 20000000);
    assert_int_equal(write(sv[1], "abc", 3), 3);
    assert_int_equal(pawl__ioloop_wait(l, pawl_now_ns() + 2000000000LL, ev), 1);
    assert_int_equal(ev[0].slot, 1);
    assert_true(ev[0].events & PAWL_IO_IN);
    /* Not read: reported again (level-triggered), at once. */
    t0 = pawl_now_ns();
    assert_int_equal(pawl__ioloop_wait(l, t0 + 2000000000LL, ev), 1);
    assert_true(ev[0].events & PAWL_IO_IN);
    assert_true(pawl_now_ns() - t0 < 1000000000LL);
    char buf[8];
    assert_int_equal(read(sv[0], buf, sizeof buf), 3);
    assert_int_equal(pawl__ioloop_wait(l, pawl_now_ns() + 5000000, ev), 0);
    /* Write interest: a socket with room is writable at once. */
    assert_int_equal(pawl__ioloop_watch(l, 1, sv[0], PAWL_IO_IN | PAWL_IO_OUT), 0);
    assert_int_equal(pawl__ioloop_wait(l, pawl_now_ns() + 2000000000LL, ev), 1);
    assert_true(ev[0].events & PAWL_IO_OUT);
    assert_false(ev[0].events & PAWL_IO_IN);
    /* Back to read interest only: no event. */
    assert_int_equal(pawl__ioloop_watch(l, 1, sv[0], PAWL_IO_IN), 0);
    assert_int_equal(pawl__ioloop_wait(l, pawl_now_ns() + 5000000, ev), 0);
    /* The peer hangs up: reported. */
    close(sv[1]);
    assert_int_equal(pawl__ioloop_wait(l, pawl_now_ns() + 2000000000LL, ev), 1);
    assert_true(ev[0].events & (PAWL_IO_IN | PAWL_IO_ERR));
    struct pawl_ioloop_stats st;
    pawl__ioloop_stats(l, &st);
    assert_int_equal(st.events, 4);
    assert_true(st.enters >= 1 && st.enters <= st.waits + 2);
    assert_int_equal(pawl__ioloop_watch(l, 1, -1, 0), 0);
    assert_int_equal(pawl__ioloop_watch(l, 2, sv[0], PAWL_IO_IN), PAWL_EINVAL);
    close(sv[0]);
    pawl__ioloop_free(l);
}

static void test_readiness_uring(void **state)
{
    (void)state;
    readiness(PAWL_TIMER_BACKEND_IO_URING);
}

static void test_readiness_epoll(void **state)
{
    (void)state;
    readiness(PAWL_TIMER_BACKEND_EPOLL);
}

/* A slot moved to another descriptor reports the new one's readiness only. */
static void move_slot(enum pawl_timer_backend b)
{
    struct pawl_ioloop *l = new_loop(b, 1);
    int a[2], c[2];
    pair(a);
    pair(c);
    struct pawl_ioev ev[1];
    assert_int_equal(pawl__ioloop_watch(l, 0, a[0], PAWL_IO_IN), 0);
    assert_int_equal(pawl__ioloop_wait(l, pawl_now_ns() + 1000000, ev), 0); /* armed on a */
    assert_int_equal(pawl__ioloop_watch(l, 0, c[0], PAWL_IO_IN), 0);
    assert_int_equal(write(a[1], "x", 1), 1);
    assert_int_equal(pawl__ioloop_wait(l, pawl_now_ns() + 20000000, ev), 0);
    assert_int_equal(pawl__ioloop_wait(l, pawl_now_ns() + 5000000, ev), 0);
    assert_int_equal(write(c[1], "y", 1), 1);
    assert_int_equal(pawl__ioloop_wait(l, pawl_now_ns() + 2000000000LL, ev), 1);
    assert_int_equal(ev[0].slot, 0);
    char ch;
    assert_int_equal(read(c[0], &ch, 1), 1);
    assert_int_equal(ch, 'y');
    /* The old descriptor closed while watched, then the slot watches nothing. */
    assert_int_equal(pawl__ioloop_watch(l, 0, a[0], PAWL_IO_IN), 0);
    close(a[0]);
    assert_int_equal(pawl__ioloop_watch(l, 0, -1, 0), 0);
    assert_int_equal(pawl__ioloop_wait(l, pawl_now_ns() + 5000000, ev), 0);
    close(a[1]);
    close(c[0]);
    close(c[1]);
    pawl__ioloop_free(l);
}

static void test_move_slot_uring(void **state)
{
    (void)state;
    move_slot(PAWL_TIMER_BACKEND_IO_URING);
}

static void test_move_slot_epoll(void **state)
{
    (void)state;
    move_slot(PAWL_TIMER_BACKEND_EPOLL);
}

struct waker {
    struct pawl_ioloop *l;
    int delay_ms;
};

static void *waker_main(void *arg)
{
    struct waker *w = arg;
    usleep((useconds_t)w->delay_ms * 1000);
    pawl__ioloop_wake(w->l);
    pawl__ioloop_wake(w->l); /* coalesced with the first */
    return NULL;
}

/* Another thread's wake-up ends a long wait early; wake-ups before a wait are not lost. */
static void wakeup(enum pawl_timer_backend b)
{
    struct pawl_ioloop *l = new_loop(b, 1);
    struct pawl_ioev ev[1];
    for (int round = 0; round < 20; round++) {
        struct waker w = {l, round % 2 ? 0 : 10};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, waker_main, &w), 0);
        int64_t t0 = pawl_now_ns();
        if (round % 2) /* the wake-up may well come before the wait */
            usleep(2000);
        int64_t until = t0 + 10000000000LL;
        while (pawl_now_ns() < until) {
            struct pawl_ioloop_stats st;
            pawl__ioloop_stats(l, &st);
            uint64_t before = st.wakeups;
            assert_int_equal(pawl__ioloop_wait(l, until, ev), 0);
            pawl__ioloop_stats(l, &st);
            if (st.wakeups > before)
                break;
        }
        assert_true(pawl_now_ns() - t0 < 5000000000LL);
        pthread_join(th, NULL);
    }
    pawl__ioloop_free(l);
}

static void test_wakeup_uring(void **state)
{
    (void)state;
    wakeup(PAWL_TIMER_BACKEND_IO_URING);
}

static void test_wakeup_epoll(void **state)
{
    (void)state;
    wakeup(PAWL_TIMER_BACKEND_EPOLL);
}

/* io_uring refused: auto falls back to epoll and says why; a requirement fails. */
static void test_refused(void **state)
{
    (void)state;
    struct pawl_ioloop *l = NULL;
    struct pawl_ioloop_opts o = {.backend = PAWL_TIMER_BACKEND_AUTO, .simulate_uring_errno = EPERM};
    assert_int_equal(pawl__ioloop_new(&l, 4, "test", &o), 0);
    assert_string_equal(pawl__ioloop_backend(l), "epoll");
    assert_non_null(strstr(pawl__ioloop_reason(l), "refused"));
    assert_non_null(strstr(pawl__ioloop_reason(l), "simulated"));
    pawl__ioloop_free(l);
    o.backend = PAWL_TIMER_BACKEND_IO_URING;
    l = NULL;
    assert_int_equal(pawl__ioloop_new(&l, 4, "test", &o), PAWL_ENOTSUP);
    assert_null(l);
    o.backend = PAWL_TIMER_BACKEND_EPOLL;
    o.simulate_uring_errno = 0;
    assert_int_equal(pawl__ioloop_new(&l, 0, "test", &o), PAWL_EINVAL);
    assert_int_equal(pawl__ioloop_new(&l, 4, "test", &o), 0);
    assert_non_null(strstr(pawl__ioloop_reason(l), "option"));
    pawl__ioloop_free(l);
    pawl__ioloop_free(NULL);
}

/* Auto takes io_uring exactly where the kernel allows it, and says why; where the kernel
 * refuses it, requiring it is PAWL_ENOTSUP (not another error). */
static void test_auto_follows_kernel(void **state)
{
    (void)state;
    char why[256];
    int refused = pawl_test_uring_refused(why, sizeof why);
    struct pawl_ioloop *l = NULL;
    struct pawl_ioloop_opts o = {.backend = PAWL_TIMER_BACKEND_AUTO};
    assert_int_equal(pawl__ioloop_new(&l, 4, "test", &o), 0);
    print_message("kernel: %s; auto: %s (%s)\n", why, pawl__ioloop_backend(l),
                  pawl__ioloop_reason(l));
    assert_string_equal(pawl__ioloop_backend(l), refused ? "epoll" : "io_uring");
    assert_non_null(strstr(pawl__ioloop_reason(l), refused ? "refused" : "available"));
    pawl__ioloop_free(l);
    if (refused) {
        o.backend = PAWL_TIMER_BACKEND_IO_URING;
        l = NULL;
        assert_int_equal(pawl__ioloop_new(&l, 4, "test", &o), PAWL_ENOTSUP);
        assert_null(l);
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--probe-io-uring") == 0)
        return pawl_test_uring_probe_main();
    const struct CMUnitTest epoll_tests[] = {
        cmocka_unit_test(test_readiness_epoll),     cmocka_unit_test(test_move_slot_epoll),
        cmocka_unit_test(test_wakeup_epoll),        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_auto_follows_kernel),
    };
    const struct CMUnitTest uring_tests[] = {
        cmocka_unit_test(test_readiness_uring),
        cmocka_unit_test(test_move_slot_uring),
        cmocka_unit_test(test_wakeup_uring),
    };
    enum pawl_timer_backend b = (enum pawl_timer_backend)pawl_test_io_backend();
    if (b != PAWL_TIMER_BACKEND_IO_URING) {
        int rc = cmocka_run_group_tests_name("ioloop_epoll", epoll_tests, NULL, NULL);
        if (rc != 0 || b == PAWL_TIMER_BACKEND_EPOLL)
            return rc;
    }
    pawl_test_uring_half("the I/O loop's io_uring cases");
    return cmocka_run_group_tests_name("ioloop_io_uring", uring_tests, NULL, NULL);
}
