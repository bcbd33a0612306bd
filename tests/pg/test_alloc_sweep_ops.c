/*
 * test_alloc_sweep_ops.c — allocation failure in the store's operations: one pawl_append and one
 * pawl_read are run with their 1st, 2nd, ... allocation failed until they run without reaching
 * the failure; the loop is here because an operation, unlike a constructor, leaves a store that
 * must go on working. Each operation is the first of a store just opened: a warm store recycles
 * its append ops and buffers and allocates nothing per append, so the sweep covers what the
 * first use allocates and keeps.
 *
 * Unlike tests/support/fault_alloc.c, whose sweeps fail only the calling thread's allocations,
 * the allocator here fails the nth allocation of any thread while the operation runs, so that
 * what the store's I/O thread allocates for it is swept too. The store runs without finalizer
 * and listener, so little else allocates meanwhile; what does is failed the same way and must
 * be tolerated just as well.
 *
 * A failed append must return PAWL_ENOMEM and write nothing, or PAWL_EINDOUBT (a failure after
 * it was sent) and have written all of it or nothing: after the sweep every append that
 * returned 0 is in the log whole, every PAWL_ENOMEM one is absent, and every PAWL_EINDOUBT one
 * is whole or absent; after each round, failed or not, the same store appends again (no fault
 * armed), and that append is in the log exactly once. A failed read must return PAWL_ENOMEM and
 * leave its batch fit to free; a read that succeeds returns every event as appended, and after a
 * failed one the store reads everything again. Once the store is freed, every allocation since it
 * was opened has been given back (under ASan, LeakSanitizer checks what the hooks do not see).
 */
#include "pawl_test.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The any-thread failing allocator. Relaxed throughout: the sweeping thread reads the counters
 * after the operation returned, and the operation's hand-offs to and from the I/O thread order
 * what matters; a background allocation racing with the arming is failed or not, either is
 * allowed. */
static atomic_long live;
static atomic_long countdown; /* > 0: the allocation that takes it to 0 fails */
static atomic_int fired;

static int should_fail(void)
{
    if (atomic_load_explicit(&countdown, memory_order_relaxed) <= 0)
        return 0;
    if (atomic_fetch_sub_explicit(&countdown, 1, memory_order_relaxed) == 1) {
        atomic_store_explicit(&fired, 1, memory_order_relaxed);
        return 1;
    }
    return 0;
}

static void *f_malloc(size_t n)
{
    void *p = should_fail() ? NULL : malloc(n);
    if (p)
        atomic_fetch_add_explicit(&live, 1, memory_order_relaxed);
    return p;
}

static void *f_calloc(size_t n, size_t size)
{
    void *p = should_fail() ? NULL : calloc(n, size);
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

/* Fail the nth allocation from now, on any thread; 0 disarms (and clears fired). */
static void fault_arm(long nth)
{
    atomic_store(&countdown, 0);
    atomic_store(&fired, 0);
    atomic_store(&countdown, nth);
}

static int fault_fired(void)
{
    return atomic_load(&fired);
}

static long fault_live(void)
{
    return atomic_load(&live);
}

#define MAX_SWEEP 2000
#define READ_EVENTS 40

static const char *dsn;
static struct pawl_store *store;

/* Open the store (no fault armed); returns the live count before it was opened. */
static long open_store(void)
{
    long before = fault_live();
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.connections = 2;
    o.finalizer = 0; /* finalized by pawl_finalize_now, with no fault armed */
    o.listen = 0;
    char err[512] = "";
    int rc = pawl_store_new(&store, dsn, &o, err, sizeof err);
    if (rc)
        fail_msg("pawl_store_new: %s: %s", pawl_errname(rc), err);
    return before;
}

/* Free the store; every allocation since open_store must have been given back. */
static void close_store(long before, const char *what, long n)
{
    pawl_store_free(store);
    store = NULL;
    if (fault_live() != before)
        fail_msg("%s: allocation %ld failed, and %ld allocations were not freed with the store",
                 what, n, fault_live() - before);
}

static int setup(void **state)
{
    assert_int_equal(pawl_schema_migrate(dsn, NULL, 0), 0);
    return 0;
}

/* The append of round n: two events of stream a-n and one of b-n, with ids and metadata; then
 * the store's next append, one event of stream c-n. */
struct round {
    char a[32], b[32], c[32], ids[3][48];
    struct pawl_event ev[3], next;
};

static void round_init(struct round *r, long n)
{
    memset(r, 0, sizeof *r);
    snprintf(r->a, sizeof r->a, "sweep-a-%ld", n);
    snprintf(r->b, sizeof r->b, "sweep-b-%ld", n);
    snprintf(r->c, sizeof r->c, "sweep-c-%ld", n);
    r->next.stream_id = r->c;
    r->next.stream_seq = 1;
    r->next.type = "Swept";
    r->next.payload = "{\"n\":2}";
    r->next.payload_len = 7;
    for (int i = 0; i < 3; i++) {
        snprintf(r->ids[i], sizeof r->ids[i], "sweep-id-%ld-%d", n, i);
        r->ev[i].stream_id = i < 2 ? r->a : r->b;
        r->ev[i].stream_seq = i < 2 ? i + 1 : 1;
        r->ev[i].type = "Swept";
        r->ev[i].payload = "{\"n\":1}";
        r->ev[i].payload_len = 7;
        r->ev[i].metadata = "{\"by\":\"sweep\"}";
        r->ev[i].id = r->ids[i];
    }
}

/* Events of stream finalized in the log (all of them: 0, 1 or 2 here). */
static size_t stream_count(const char *stream)
{
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    assert_int_equal(pawl_read_stream(store, stream, 0, 10, &b), 0);
    size_t n = b.count;
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(b.events[i].type, "Swept");
        assert_int_equal(b.events[i].stream_seq, (int64_t)i + 1);
    }
    pawl_read_batch_fini(&b);
    return n;
}

enum outcome { FAILED = 1, APPENDED, IN_DOUBT };

static void test_append(void **state)
{
    enum pawl_log_level level = pawl_log_get_level();
    pawl_log_set_level(PAWL_LOG_OFF); /* every failure logs; the test checks results */
    static char ok[MAX_SWEEP];        /* enum outcome of each round */
    struct round r;
    long n;
    for (n = 1; n < MAX_SWEEP; n++) {
        long before = open_store();
        round_init(&r, n);
        struct pawl_append_result res;
        fault_arm(n);
        int rc = pawl_append(store, r.ev, 3, &res);
        int hit = fault_fired();
        fault_arm(0);
        if (rc == 0) {
            ok[n] = APPENDED;
            assert_int_equal(res.rc, 0);
            assert_true(res.first_seq >= 1);
        } else {
            if (!hit)
                fail_msg("pawl_append failed with %s although no allocation failed",
                         pawl_errname(rc));
            if (rc != PAWL_ENOMEM && rc != PAWL_EINDOUBT)
                fail_msg("pawl_append: allocation %ld failed, and it returned %s, not "
                         "PAWL_ENOMEM or PAWL_EINDOUBT",
                         n, pawl_errname(rc));
            ok[n] = rc == PAWL_EINDOUBT ? IN_DOUBT : FAILED;
        }
        /* The store goes on after the failure: its next append (no fault armed) succeeds. */
        int next_rc = pawl_append(store, &r.next, 1, &res);
        if (next_rc != 0)
            fail_msg("after allocation %ld failed, the next append returned %s: %s", n,
                     pawl_errname(next_rc), res.message);
        close_store(before, "pawl_append", n);
        if (rc == 0 && !hit)
            break; /* the append made fewer than n allocations: done */
    }
    pawl_log_set_level(level);
    print_message("pawl_append: %ld allocations, each failure handled\n", n - 1);
    assert_true(n - 1 >= 1);
    /* What the log holds: every append that returned 0 whole, nothing of a PAWL_ENOMEM one,
     * all or nothing of one in doubt. */
    long before = open_store();
    assert_int_equal(pawl_finalize_now(store, NULL, NULL, NULL), 0);
    for (long i = 1; i <= n; i++) {
        round_init(&r, i);
        size_t a = stream_count(r.a), b = stream_count(r.b);
        int whole = a == 2 && b == 1, none = a == 0 && b == 0;
        if (stream_count(r.c) != 1)
            fail_msg("round %ld: the append after it is not in the log once", i);
        if (ok[i] == APPENDED ? !whole : ok[i] == FAILED ? !none : !whole && !none)
            fail_msg("round %ld (%s): the log holds %zu events of %s and %zu of %s", i,
                     ok[i] == APPENDED ? "appended"
                     : ok[i] == FAILED ? "failed"
                                       : "in doubt",
                     a, r.a, b, r.b);
    }
    close_store(before, "the check", 0);
}

static void test_read(void **state)
{
    /* READ_EVENTS events after whatever the log holds, finalized, with no fault armed. */
    long before = open_store();
    int64_t after = 0;
    assert_int_equal(pawl_finalize_now(store, NULL, NULL, &after), 0);
    struct pawl_event ev[READ_EVENTS];
    char payload[READ_EVENTS][16];
    for (int i = 0; i < READ_EVENTS; i++) {
        memset(&ev[i], 0, sizeof ev[i]);
        snprintf(payload[i], sizeof payload[i], "{\"i\":%d}", i);
        ev[i].stream_id = i % 2 ? "sweep-read-odd" : "sweep-read-even";
        ev[i].stream_seq = PAWL_SEQ_ANY;
        ev[i].type = "Read";
        ev[i].payload = payload[i];
        ev[i].payload_len = strlen(payload[i]);
        ev[i].metadata = "{\"r\":1}";
    }
    assert_int_equal(pawl_append(store, ev, READ_EVENTS, NULL), 0);
    int64_t last = 0;
    assert_int_equal(pawl_finalize_now(store, NULL, NULL, &last), 0);
    assert_int_equal(last, after + READ_EVENTS);
    close_store(before, "the set-up", 0);

    enum pawl_log_level level = pawl_log_get_level();
    pawl_log_set_level(PAWL_LOG_OFF);
    long n;
    for (n = 1; n < MAX_SWEEP; n++) {
        before = open_store();
        struct pawl_read_batch b; /* a fresh batch: its first growth is part of the read */
        pawl_read_batch_init(&b);
        fault_arm(n);
        int rc = pawl_read(store, after, READ_EVENTS, &b);
        int hit = fault_fired();
        fault_arm(0);
        if (rc == 0) {
            assert_int_equal(b.count, READ_EVENTS);
            for (int i = 0; i < READ_EVENTS; i++) {
                const struct pawl_event *e = &b.events[i];
                assert_int_equal(e->index, after + 1 + i);
                assert_string_equal(e->stream_id, ev[i].stream_id);
                assert_string_equal(e->type, "Read");
                assert_int_equal(e->payload_len, ev[i].payload_len);
                assert_memory_equal(e->payload, ev[i].payload, ev[i].payload_len);
            }
        } else {
            if (!hit)
                fail_msg("pawl_read failed with %s although no allocation failed",
                         pawl_errname(rc));
            if (rc != PAWL_ENOMEM)
                fail_msg("pawl_read: allocation %ld failed, and it returned %s, not PAWL_ENOMEM", n,
                         pawl_errname(rc));
        }
        /* The store keeps going after a failed read: the next one (no fault) reads it all. */
        pawl_read_batch_fini(&b);
        pawl_read_batch_init(&b);
        assert_int_equal(pawl_read(store, after, READ_EVENTS, &b), 0);
        assert_int_equal(b.count, READ_EVENTS);
        pawl_read_batch_fini(&b);
        close_store(before, "pawl_read", n);
        if (rc == 0 && !hit)
            break;
    }
    pawl_log_set_level(level);
    print_message("pawl_read: %ld allocations, each failure handled\n", n - 1);
    assert_true(n - 1 >= 1); /* at least the batch's array of events */
}

int main(void)
{
    dsn = pawl_test_db_create("alloc_sweep_ops");
    struct pawl_allocator a = {f_malloc, f_calloc, f_realloc, f_free};
    pawl_set_allocator(&a);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append),
        cmocka_unit_test(test_read),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
