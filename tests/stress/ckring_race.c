/*
 * ckring_race.c — a two-thread hand-off through the runtime's ck_ring wrapper (ckring.h), run by
 * tests/stress/ckring_race.sh under ThreadSanitizer.
 *
 * The producer allocates each item, writes its fields and pushes it; the consumer pops it, checks
 * the fields and frees it. The ring has 8 slots, so every slot is reused many times and both of
 * the wrapper's edges are exercised: the producer's writes before the consumer's reads (the item
 * and the slot), and the consumer's read of a slot before the producer's next write of it.
 * Built twice: as is, TSan must find nothing; with PAWL_CKRING_PLANT_RACE the wrapper publishes
 * without telling TSan, as a bare ck_ring does, and TSan must report the data race (the script
 * checks both). Exit 0 when every item arrived intact and in order, 1 otherwise.
 */
#include "ckring.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define SLOTS 8
#define ITEMS 200000

struct item {
    uint64_t seq;
    uint64_t check;
};

static ck_ring_t ring;
static ck_ring_buffer_t slots[SLOTS];

static uint64_t check_of(uint64_t seq)
{
    return seq * 0x9E3779B97F4A7C15ull;
}

static void *produce(void *arg)
{
    (void)arg;
    for (uint64_t i = 0; i < ITEMS; i++) {
        struct item *it = malloc(sizeof *it);
        if (it == NULL)
            abort();
        it->seq = i;
        it->check = check_of(i);
        while (!pawl_ckring_push_sp(&ring, slots, it))
            sched_yield();
    }
    return NULL;
}

static void *consume(void *arg)
{
    int *bad = arg;
    for (uint64_t i = 0; i < ITEMS; i++) {
        void *v;
        while (!pawl_ckring_pop_sc(&ring, slots, &v))
            sched_yield();
        struct item *it = v;
        if (it->seq != i || it->check != check_of(i)) {
            fprintf(stderr, "item %llu arrived as %llu\n", (unsigned long long)i,
                    (unsigned long long)it->seq);
            *bad = 1;
        }
        free(it);
    }
    return NULL;
}

int main(void)
{
    int bad = 0;
    pthread_t p, c;
    ck_ring_init(&ring, SLOTS);
    if (pthread_create(&c, NULL, consume, &bad) != 0 ||
        pthread_create(&p, NULL, produce, NULL) != 0) {
        fprintf(stderr, "pthread_create failed\n");
        return 1;
    }
    pthread_join(p, NULL);
    pthread_join(c, NULL);
    if (pawl_ckring_count(&ring) != 0) {
        fprintf(stderr, "%u items left on the ring\n", pawl_ckring_count(&ring));
        bad = 1;
    }
    printf("%d items handed over%s\n", ITEMS, bad ? ", some damaged" : "");
    return bad;
}
