/*
 * test_deque.c — the Chase–Lev deque: single-thread semantics (LIFO pop, FIFO steal, growth),
 * batched pushes (order, growth by several doublings at once, nothing queued when growing
 * fails), batch steals (at most half, rounded up, oldest first) and an owner racing several
 * thieves, pushing one at a time or in batches, the thieves stealing one at a time or in batches:
 * every item is taken exactly once.
 */
#include "pawl_test.h"
#include "runtime_test.h"

#include "deque.h"

#include <stdlib.h>

static struct pawl_task *items;

static void nop(struct pawl_task *t, int status)
{
    (void)t;
    (void)status;
}

static void test_single_thread(void **state)
{
    struct pawl_deque d;
    struct pawl_task t[100];
    assert_int_equal(pawl__deque_init(&d, 4), 0);
    assert_null(pawl__deque_pop_owner(&d));
    assert_null(pawl__deque_steal(&d));
    for (int i = 0; i < 100; i++) { /* grows 4 -> 128 */
        t[i].fn = nop;
        assert_int_equal(pawl__deque_push_owner(&d, &t[i]), 0);
    }
    assert_int_equal(pawl__deque_size(&d), 100);
    assert_ptr_equal(pawl__deque_pop_owner(&d), &t[99]); /* owner: LIFO */
    assert_ptr_equal(pawl__deque_steal(&d), &t[0]);      /* thief: FIFO */
    assert_ptr_equal(pawl__deque_steal(&d), &t[1]);
    /* LIFO while more than a chunk lies between top and the slot popped; then oldest first. */
    for (int i = 98; i >= 2 + PAWL_DEQUE_CHUNK; i--)
        assert_ptr_equal(pawl__deque_pop_owner(&d), &t[i]);
    for (int i = 2; i < 2 + PAWL_DEQUE_CHUNK; i++)
        assert_ptr_equal(pawl__deque_pop_owner(&d), &t[i]);
    assert_null(pawl__deque_pop_owner(&d));
    assert_null(pawl__deque_steal(&d));
    /* Reuse after empty, interleaved. */
    assert_int_equal(pawl__deque_push_owner(&d, &t[0]), 0);
    assert_ptr_equal(pawl__deque_steal(&d), &t[0]);
    assert_null(pawl__deque_pop_owner(&d));
    assert_int_equal(pawl__deque_push_owner(&d, &t[1]), 0);
    assert_ptr_equal(pawl__deque_pop_owner(&d), &t[1]);
    assert_null(pawl__deque_steal(&d));
    pawl__deque_fini(&d);
}

static void test_push_n(void **state)
{
    struct pawl_deque d;
    struct pawl_task t[300];
    struct pawl_task *p[300];
    for (int i = 0; i < 300; i++) {
        t[i].fn = nop;
        p[i] = &t[i];
    }
    assert_int_equal(pawl__deque_init(&d, 4), 0);
    assert_int_equal(pawl__deque_push_n_owner(&d, p, 3), 0);       /* fits */
    assert_int_equal(pawl__deque_push_n_owner(&d, p + 3, 197), 0); /* grows 4 -> 256 in one call */
    assert_int_equal(pawl__deque_size(&d), 200);
    assert_ptr_equal(pawl__deque_steal(&d), &t[0]);       /* thieves: array order */
    assert_ptr_equal(pawl__deque_pop_owner(&d), &t[199]); /* owner: last first */
    assert_int_equal(pawl__deque_push_owner(&d, &t[200]), 0);
    assert_ptr_equal(pawl__deque_pop_owner(&d), &t[200]);
    for (int i = 198; i >= 1 + PAWL_DEQUE_CHUNK; i--)
        assert_ptr_equal(pawl__deque_pop_owner(&d), &t[i]);
    for (int i = 1; i < 1 + PAWL_DEQUE_CHUNK; i++) /* the last chunk: oldest first */
        assert_ptr_equal(pawl__deque_pop_owner(&d), &t[i]);
    assert_null(pawl__deque_pop_owner(&d));
    assert_null(pawl__deque_steal(&d));
    /* Wrapping around the ring after it emptied. */
    for (int r = 0; r < 10; r++) {
        assert_int_equal(pawl__deque_push_n_owner(&d, p + 200, 100), 0);
        for (int i = 0; i < 50; i++)
            assert_ptr_equal(pawl__deque_steal(&d), &t[200 + i]);
        for (int i = 99; i >= 50 + PAWL_DEQUE_CHUNK; i--)
            assert_ptr_equal(pawl__deque_pop_owner(&d), &t[200 + i]);
        for (int i = 50; i < 50 + PAWL_DEQUE_CHUNK; i++)
            assert_ptr_equal(pawl__deque_pop_owner(&d), &t[200 + i]);
        assert_null(pawl__deque_pop_owner(&d));
    }
    pawl__deque_fini(&d);
}

static void test_steal_batch(void **state)
{
    struct pawl_deque d;
    struct pawl_task t[100];
    struct pawl_task *out[64];
    assert_int_equal(pawl__deque_init(&d, 4), 0);
    assert_int_equal(pawl__deque_steal_batch(&d, out, 8), 0); /* empty */
    for (int i = 0; i < 100; i++) {
        t[i].fn = nop;
        assert_int_equal(pawl__deque_push_owner(&d, &t[i]), 0);
    }
    assert_int_equal(pawl__deque_steal_batch(&d, out, 8), 8); /* capped by max */
    for (int i = 0; i < 8; i++)
        assert_ptr_equal(out[i], &t[i]);                        /* oldest first */
    assert_int_equal(pawl__deque_steal_batch(&d, out, 64), 46); /* half of 92 */
    for (int i = 0; i < 46; i++)
        assert_ptr_equal(out[i], &t[8 + i]);
    assert_int_equal(pawl__deque_size(&d), 46);
    assert_ptr_equal(pawl__deque_pop_owner(&d), &t[99]); /* the owner still pops its newest */
    assert_int_equal(pawl__deque_steal_batch(&d, out, 64), 23); /* half of 45, rounded up */
    assert_ptr_equal(out[0], &t[54]);
    for (int i = 98; i >= 77 + PAWL_DEQUE_CHUNK; i--)
        assert_ptr_equal(pawl__deque_pop_owner(&d), &t[i]);
    for (int i = 77; i < 77 + PAWL_DEQUE_CHUNK; i++) /* the last chunk: oldest first */
        assert_ptr_equal(pawl__deque_pop_owner(&d), &t[i]);
    assert_int_equal(pawl__deque_steal_batch(&d, out, 64), 0);
    assert_int_equal(pawl__deque_push_owner(&d, &t[0]), 0);
    assert_int_equal(pawl__deque_steal_batch(&d, out, 64), 1); /* one left: a thief takes it */
    assert_ptr_equal(out[0], &t[0]);
    assert_null(pawl__deque_pop_owner(&d));
    pawl__deque_fini(&d);
}

/* Growth that fails queues nothing: the allocator refuses once the deque exists. */
static int refuse_alloc;

static void *maybe_malloc(size_t n)
{
    return refuse_alloc ? NULL : malloc(n);
}

static void *maybe_calloc(size_t n, size_t size)
{
    return refuse_alloc ? NULL : calloc(n, size);
}

static void *maybe_realloc(void *p, size_t n)
{
    return refuse_alloc ? NULL : realloc(p, n);
}

static void test_push_n_enomem(void **state)
{
    struct pawl_allocator a = {maybe_malloc, maybe_calloc, maybe_realloc, free};
    pawl_set_allocator(&a);
    struct pawl_deque d;
    struct pawl_task t[20];
    struct pawl_task *p[20];
    for (int i = 0; i < 20; i++) {
        t[i].fn = nop;
        p[i] = &t[i];
    }
    assert_int_equal(pawl__deque_init(&d, 8), 0);
    refuse_alloc = 1;
    assert_int_equal(pawl__deque_push_n_owner(&d, p, 5), 0);
    assert_int_equal(pawl__deque_push_n_owner(&d, p + 5, 4), PAWL_ENOMEM); /* 9 > 8 */
    assert_int_equal(pawl__deque_size(&d), 5);
    assert_int_equal(pawl__deque_push_n_owner(&d, p + 5, 3), 0); /* exactly full */
    assert_int_equal(pawl__deque_push_owner(&d, &t[8]), PAWL_ENOMEM);
    for (int i = 7; i >= PAWL_DEQUE_CHUNK; i--)
        assert_ptr_equal(pawl__deque_pop_owner(&d), &t[i]);
    for (int i = 0; i < 8 && i < PAWL_DEQUE_CHUNK; i++) /* within a chunk: oldest first */
        assert_ptr_equal(pawl__deque_pop_owner(&d), &t[i]);
    assert_null(pawl__deque_pop_owner(&d));
    refuse_alloc = 0;
    pawl__deque_fini(&d);
    struct pawl_allocator libc = {malloc, calloc, realloc, free};
    pawl_set_allocator(&libc);
}

struct race {
    struct pawl_deque d;
    long n;
    uint32_t *taken;
    uint64_t done;
    uint64_t stolen;
    int steal_max; /* > 1: thieves use pawl__deque_steal_batch with this max */
};

static void take(struct race *r, struct pawl_task *t)
{
    long i = t - items;
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&r->taken[i]), 1, memory_order_relaxed);
}

static void *thief(void *arg)
{
    struct race *r = arg;
    uint64_t mine = 0;
    while (!atomic_load_explicit(PAWL_ATOMIC_OF(&r->done), memory_order_acquire) ||
           pawl__deque_size(&r->d) > 0) {
        if (r->steal_max > 1) {
            struct pawl_task *out[64];
            int64_t k = pawl__deque_steal_batch(&r->d, out, r->steal_max);
            if (k <= 0) {
                sched_yield();
                continue;
            }
            for (int64_t i = 0; i < k; i++)
                take(r, out[i]);
            mine += (uint64_t)k;
            continue;
        }
        struct pawl_task *t = pawl__deque_steal(&r->d);
        if (t == NULL || t == PAWL_DEQUE_ABORT) {
            sched_yield();
            continue;
        }
        take(r, t);
        mine++;
    }
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&r->stolen), mine, memory_order_relaxed);
    return NULL;
}

/* batch > 1: the owner pushes runs of 1..batch items with pawl__deque_push_n_owner; steal_max > 1:
 * the thieves take up to steal_max at a time with pawl__deque_steal_batch. */
static void deque_race(long n, int thieves, int batch, int steal_max)
{
    struct race r = {0};
    r.steal_max = steal_max;
    items = calloc((size_t)n, sizeof(*items));
    r.taken = calloc((size_t)n, sizeof(uint32_t));
    r.n = n;
    assert_non_null(items);
    assert_int_equal(pawl__deque_init(&r.d, 8), 0); /* small: exercise growth under steals */
    pthread_t th[8];
    for (int i = 0; i < thieves; i++)
        pthread_create(&th[i], NULL, thief, &r);
    unsigned seed = 1;
    struct pawl_task *run[64];
    for (long i = 0; i < n; i++) {
        if (batch > 1) {
            long k = 1 + rand_r(&seed) % batch;
            if (k > n - i)
                k = n - i;
            for (long j = 0; j < k; j++) {
                items[i + j].fn = nop;
                run[j] = &items[i + j];
            }
            assert_int_equal(pawl__deque_push_n_owner(&r.d, run, k), 0);
            i += k - 1;
        } else {
            items[i].fn = nop;
            assert_int_equal(pawl__deque_push_owner(&r.d, &items[i]), 0);
        }
        if (rand_r(&seed) % 3 == 0) {
            struct pawl_task *t = pawl__deque_pop_owner(&r.d);
            if (t)
                take(&r, t);
        }
    }
    struct pawl_task *t;
    while ((t = pawl__deque_pop_owner(&r.d)) != NULL)
        take(&r, t);
    atomic_store_explicit(PAWL_ATOMIC_OF(&r.done), 1, memory_order_release);
    for (int i = 0; i < thieves; i++)
        pthread_join(th[i], NULL);
    for (long i = 0; i < n; i++)
        if (r.taken[i] != 1)
            fail_msg("item %ld taken %u times", i, r.taken[i]);
    print_message("deque race: %ld items (batches up to %d), %llu stolen by %d thieves (up to %d "
                  "at a time)\n",
                  n, batch, (unsigned long long)r.stolen, thieves, steal_max > 1 ? steal_max : 1);
    pawl__deque_fini(&r.d);
    free(r.taken);
    free(items);
}

static void test_owner_and_thieves(void **state)
{
    deque_race(PAWL_TEST_SCALE(1000000), 3, 1, 1);
}

static void test_owner_batches_and_thieves(void **state)
{
    deque_race(PAWL_TEST_SCALE(1000000), 3, 64, 1);
}

static void test_owner_and_batch_thieves(void **state)
{
    deque_race(PAWL_TEST_SCALE(1000000), 3, 1, 8);
    deque_race(PAWL_TEST_SCALE(1000000), 3, 64, 32);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_thread),
        cmocka_unit_test(test_push_n),
        cmocka_unit_test(test_steal_batch),
        cmocka_unit_test(test_push_n_enomem),
        cmocka_unit_test(test_owner_and_thieves),
        cmocka_unit_test(test_owner_batches_and_thieves),
        cmocka_unit_test(test_owner_and_batch_thieves),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
