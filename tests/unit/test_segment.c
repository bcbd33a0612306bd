/*
 * test_segment.c — the stream hash (fixed forever: known MurmurHash3 vectors), segment
 * arithmetic (split/merge partition the hash space), and the event batch arena.
 */
#include "pawl_test.h"

#include "segment.h"

#include <stdio.h>
#include <string.h>

static void test_hash_vectors(void **state)
{
    (void)state;
    assert_int_equal(pawl_stream_hash(""), 0x00000000u);
    assert_int_equal(pawl_stream_hash(NULL), 0x00000000u);
    assert_int_equal(pawl_stream_hash("a"), 0x3c2569b2u);
    assert_int_equal(pawl_stream_hash("The quick brown fox jumps over the lazy dog"), 0x2e4ff723u);
    assert_int_equal(pawl__murmur3_32("", 0, 1), 0x514e28b7u);
    assert_int_equal(pawl__murmur3_32("Hello, world!", 13, 1234), 0xfaf6cdb3u);
    assert_int_equal(pawl__murmur3_32("\xff\xff\xff\xff", 4, 0), 0x76293b50u);
}

static void test_initial_partition(void **state)
{
    (void)state;
    uint32_t n = 16;
    int counts[16] = {0};
    for (int i = 0; i < 16000; i++) {
        char s[32];
        snprintf(s, sizeof s, "stream-%d", i);
        uint32_t h = pawl_stream_hash(s);
        int hits = 0;
        for (uint32_t k = 0; k < n; k++) {
            if (pawl_segment_contains(pawl_segment_initial(k, n), h)) {
                hits++;
                counts[k]++;
            }
        }
        assert_int_equal(hits, 1);
    }
    /* A fair hash spreads 16000 streams within a few percent of 1000 per segment. */
    for (int k = 0; k < 16; k++)
        assert_true(counts[k] > 850 && counts[k] < 1150);
}

static void test_split_merge(void **state)
{
    (void)state;
    struct pawl_segment s = {3, 7}, lo, hi, sib, par;
    assert_int_equal(pawl_segment_split(s, &lo, &hi), 0);
    assert_int_equal(lo.id, 3);
    assert_int_equal(lo.mask, 15);
    assert_int_equal(hi.id, 11);
    assert_int_equal(hi.mask, 15);
    assert_int_equal(pawl_segment_sibling(lo, &sib), 0);
    assert_int_equal(sib.id, hi.id);
    assert_int_equal(pawl_segment_sibling(hi, &sib), 0);
    assert_int_equal(sib.id, lo.id);
    assert_int_equal(pawl_segment_parent(hi, &par), 0);
    assert_int_equal(par.id, 3);
    assert_int_equal(par.mask, 7);
    /* The halves partition the parent. */
    for (uint32_t h = 0; h < 4096; h++) {
        int in = pawl_segment_contains(s, h);
        assert_int_equal(in, pawl_segment_contains(lo, h) + pawl_segment_contains(hi, h));
    }
    struct pawl_segment root = {0, 0};
    assert_int_equal(pawl_segment_sibling(root, &sib), PAWL_ERANGE);
    assert_true(pawl_segment_valid(root));
    struct pawl_segment bad = {8, 7};
    assert_false(pawl_segment_valid(bad));
    struct pawl_segment bad2 = {0, 6};
    assert_false(pawl_segment_valid(bad2));
    assert_true(pawl__segment_count_valid(16));
    assert_false(pawl__segment_count_valid(12));
    assert_false(pawl__segment_count_valid(0));
}

static void test_batch_arena(void **state)
{
    (void)state;
    struct pawl_event_batch b;
    pawl_event_batch_init(&b);
    char big[3000];
    memset(big, 'x', sizeof big);
    for (int round = 0; round < 2; round++) {
        pawl_event_batch_clear(&b);
        for (int i = 0; i < 500; i++) {
            char s[32];
            snprintf(s, sizeof s, "s-%d", i);
            struct pawl_event e = {.index = i + 1,
                                   .stream_id = s,
                                   .stream_seq = 1,
                                   .type = "T",
                                   .payload = big,
                                   .payload_len = (size_t)(i % 7) * 400,
                                   .metadata = i % 2 ? "{}" : NULL,
                                   .id = i % 3 ? s : NULL};
            assert_int_equal(pawl_event_batch_push(&b, &e), 0);
        }
        assert_int_equal(b.n, 500);
        for (int i = 0; i < 500; i++) {
            char s[32];
            snprintf(s, sizeof s, "s-%d", i);
            assert_string_equal(b.events[i].stream_id, s);
            assert_string_equal(b.events[i].type, "T");
            assert_int_equal(b.events[i].payload_len, (size_t)(i % 7) * 400);
            if (b.events[i].payload_len)
                assert_memory_equal(b.events[i].payload, big, b.events[i].payload_len);
            if (i % 2)
                assert_string_equal(b.events[i].metadata, "{}");
            else
                assert_null(b.events[i].metadata);
            /* Event ids are copied, and rebased when the arena moves, like every string. */
            if (i % 3)
                assert_string_equal(b.events[i].id, s);
            else
                assert_null(b.events[i].id);
        }
    }
    pawl_event_batch_fini(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash_vectors),
        cmocka_unit_test(test_initial_partition),
        cmocka_unit_test(test_split_merge),
        cmocka_unit_test(test_batch_arena),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
