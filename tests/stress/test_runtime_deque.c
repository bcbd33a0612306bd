/*
 * test_runtime_deque.c (stress) — the Chase–Lev deque under long owner/thief races with small
 * initial rings (growth while stealing), pushing one item at a time or in batches, thieves
 * stealing one at a time, in batches, or both mixed: every item taken exactly once, several
 * rounds.
 */
#include "pawl_test.h"
#include "runtime_test.h"

#include "deque.h"

#include <stdlib.h>

struct race {
    struct pawl_deque d;
    struct pawl_task *items;
    uint32_t *taken;
    uint64_t done;
    int steal_max; /* > 1: thieves steal up to this many at a time (odd thieves: one at a time) */
};

struct thief_arg {
    struct race *r;
    int index;
};

static void nop(struct pawl_task *t, int status) {}

static void *thief(void *arg)
{
    struct thief_arg *a = arg;
    struct race *r = a->r;
    while (!atomic_load_explicit(PAWL_ATOMIC_OF(&r->done), memory_order_acquire) ||
           pawl__deque_size(&r->d) > 0) {
        if (r->steal_max > 1 && a->index % 2 == 0) {
            struct pawl_task *out[64];
            int64_t k = pawl__deque_steal_batch(&r->d, out, r->steal_max);
            for (int64_t i = 0; i < k; i++)
                atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&r->taken[out[i] - r->items]), 1,
                                          memory_order_relaxed);
            continue;
        }
        struct pawl_task *t = pawl__deque_steal(&r->d);
        if (t == NULL || t == PAWL_DEQUE_ABORT)
            continue;
        atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&r->taken[t - r->items]), 1, memory_order_relaxed);
    }
    return NULL;
}

/* batch > 1: the owner pushes runs of 1..batch items with pawl__deque_push_n_owner. steal_max > 1:
 * the even-numbered thieves steal up to steal_max at a time with pawl__deque_steal_batch. */
static void round_(long n, int thieves, int pop_every, int batch, int steal_max)
{
    struct race r = {0};
    r.steal_max = steal_max;
    r.items = calloc((size_t)n, sizeof(*r.items));
    r.taken = calloc((size_t)n, sizeof(*r.taken));
    assert_int_equal(pawl__deque_init(&r.d, 2), 0);
    pthread_t th[4];
    struct thief_arg ta[4];
    for (int i = 0; i < thieves; i++) {
        ta[i] = (struct thief_arg){&r, i};
        pthread_create(&th[i], NULL, thief, &ta[i]);
    }
    unsigned seed = (unsigned)n;
    struct pawl_task *run[64];
    for (long i = 0; i < n; i++) {
        long k = batch > 1 ? 1 + rand_r(&seed) % batch : 1;
        if (k > n - i)
            k = n - i;
        for (long j = 0; j < k; j++) {
            r.items[i + j].fn = nop;
            run[j] = &r.items[i + j];
        }
        if (batch > 1)
            assert_int_equal(pawl__deque_push_n_owner(&r.d, run, k), 0);
        else
            assert_int_equal(pawl__deque_push_owner(&r.d, run[0]), 0);
        i += k - 1;
        if (i % pop_every == 0) {
            struct pawl_task *t = pawl__deque_pop_owner(&r.d);
            if (t)
                atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&r.taken[t - r.items]), 1,
                                          memory_order_relaxed);
        }
    }
    struct pawl_task *t;
    while ((t = pawl__deque_pop_owner(&r.d)) != NULL)
        atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&r.taken[t - r.items]), 1, memory_order_relaxed);
    atomic_store_explicit(PAWL_ATOMIC_OF(&r.done), 1, memory_order_release);
    for (int i = 0; i < thieves; i++)
        pthread_join(th[i], NULL);
    for (long i = 0; i < n; i++)
        if (r.taken[i] != 1)
            fail_msg("item %ld taken %u times", i, r.taken[i]);
    pawl__deque_fini(&r.d);
    free(r.items);
    free(r.taken);
}

static void test_rounds(void **state)
{
    long n = PAWL_TEST_SCALE(2000000);
    round_(n, 1, 2, 1, 1);
    round_(n, 2, 3, 1, 1);
    round_(n, 3, 1, 1, 1); /* the owner pops after every push: constant last-item races */
    round_(n, 3, 1000000000, 1, 1);
}

static void test_batch_rounds(void **state)
{
    long n = PAWL_TEST_SCALE(2000000);
    round_(n, 1, 2, 64, 1);
    round_(n, 3, 1, 8, 1); /* a pop after every short batch: last-item races and wrap-around */
    round_(n, 3, 1000000000, 64, 1);
}

/* Batch thieves (two of three; the third steals one at a time) against an owner that pops. */
static void test_batch_steal_rounds(void **state)
{
    long n = PAWL_TEST_SCALE(2000000);
    round_(n, 1, 2, 1, 32);
    round_(n, 3, 1, 1, 4);  /* a pop after every push: batches shrink to the last item */
    round_(n, 3, 3, 8, 32); /* short pushed batches, wrap-around and growth under batch steals */
    round_(n, 3, 1000000000, 64, 32);
}

/*
 * The owner's pop against chunked steals: rounds in which the owner pushes a few chunks' worth
 * and pops everything back while thieves steal in batches, so the owner's pops keep crossing the
 * depth (PAWL_DEQUE_CHUNK) below which it must go through top. A pop that took a slot without
 * CAS inside a thief's chunk would show as an item taken twice (and another never).
 */
struct drain {
    struct pawl_deque d;
    struct pawl_task *items;
    uint8_t *taken;
    uint64_t done;
};

static void *drain_thief(void *arg)
{
    struct drain *r = arg;
    struct pawl_task *out[64];
    while (!atomic_load_explicit(PAWL_ATOMIC_OF(&r->done), memory_order_acquire)) {
        int64_t k = pawl__deque_steal_batch(&r->d, out, 64);
        for (int64_t i = 0; i < k; i++)
            atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&r->taken[out[i] - r->items]), 1,
                                      memory_order_relaxed);
    }
    return NULL;
}

static void test_pop_across_chunks(void **state)
{
    enum { PER = 3 * PAWL_DEQUE_CHUNK };
    long rounds = PAWL_TEST_SCALE(200000), n = rounds * PER;
    struct drain r = {0};
    r.items = calloc((size_t)n, sizeof(*r.items));
    r.taken = calloc((size_t)n, 1);
    assert_non_null(r.items);
    assert_non_null(r.taken);
    assert_int_equal(pawl__deque_init(&r.d, 2 * PER), 0);
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&th[i], NULL, drain_thief, &r);
    long popped = 0;
    for (long round = 0; round < rounds; round++) {
        struct pawl_task *run[PER];
        for (int j = 0; j < PER; j++) {
            r.items[round * PER + j].fn = nop;
            run[j] = &r.items[round * PER + j];
        }
        assert_int_equal(pawl__deque_push_n_owner(&r.d, run, PER), 0);
        struct pawl_task *t;
        while ((t = pawl__deque_pop_owner(&r.d)) != NULL) {
            atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&r.taken[t - r.items]), 1,
                                      memory_order_relaxed);
            popped++;
        }
    }
    atomic_store_explicit(PAWL_ATOMIC_OF(&r.done), 1, memory_order_release);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    long twice = 0, never = 0;
    for (long i = 0; i < n; i++) {
        twice += r.taken[i] > 1;
        never += r.taken[i] == 0;
    }
    print_message("pop across chunks: %ld rounds of %d, %ld popped by the owner, %ld stolen\n",
                  rounds, PER, popped, n - popped);
    if (twice || never)
        fail_msg("%ld items taken twice, %ld never", twice, never);
    pawl__deque_fini(&r.d);
    free(r.items);
    free(r.taken);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rounds),
        cmocka_unit_test(test_batch_rounds),
        cmocka_unit_test(test_batch_steal_rounds),
        cmocka_unit_test(test_pop_across_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
