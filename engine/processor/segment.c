/*
 * segment.c — segments and the stream hash.
 *
 * The hash is MurmurHash3 x86_32, seed 0, over the stream id's bytes: every process, machine
 * and version must put a stream in the same segment, so this function never changes. Segment
 * arithmetic keeps the invariant mask = 2^k - 1, id <= mask; split doubles the mask and merge
 * halves it, so a set of segments produced from the initial ones by splits and merges always
 * partitions the hash space exactly.
 *
 * The event batch is a growable array of events plus one arena holding their strings and
 * payloads; when the arena moves, the pointers already handed out are rebased, so a batch
 * stays consistent. Pure functions and caller-owned storage: any thread.
 */
#include "segment.h"

#include "common.h"

#include <string.h>

static inline uint32_t rotl32(uint32_t x, int r)
{
    return (x << r) | (x >> (32 - r));
}

uint32_t pawl__murmur3_32(const void *data, size_t len, uint32_t seed)
{
    const uint8_t *p = data;
    const size_t nblocks = len / 4;
    const uint32_t c1 = 0xcc9e2d51u, c2 = 0x1b873593u;
    uint32_t h = seed;

    for (size_t i = 0; i < nblocks; i++) {
        uint32_t k;
        /* Little-endian block read regardless of the host's byte order. */
        k = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
            (uint32_t)p[4 * i + 3] << 24;
        k *= c1;
        k = rotl32(k, 15);
        k *= c2;
        h ^= k;
        h = rotl32(h, 13);
        h = h * 5 + 0xe6546b64u;
    }
    const uint8_t *tail = p + nblocks * 4;
    uint32_t k = 0;
    switch (len & 3) {
    case 3:
        k ^= (uint32_t)tail[2] << 16;
        /* fall through */
    case 2:
        k ^= (uint32_t)tail[1] << 8;
        /* fall through */
    case 1:
        k ^= tail[0];
        k *= c1;
        k = rotl32(k, 15);
        k *= c2;
        h ^= k;
    }
    h ^= (uint32_t)len;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

uint32_t pawl_stream_hash(const char *stream_id)
{
    if (stream_id == NULL)
        return pawl__murmur3_32("", 0, 0);
    return pawl__murmur3_32(stream_id, strlen(stream_id), 0);
}

static int mask_valid(uint32_t mask)
{
    return (mask & (mask + 1)) == 0; /* 2^k - 1, including 0 and 0xffffffff */
}

int pawl_segment_valid(struct pawl_segment seg)
{
    return mask_valid(seg.mask) && seg.mask != UINT32_MAX && seg.id <= seg.mask;
}

int pawl__segment_count_valid(uint32_t n)
{
    return n >= 1 && n <= 65536 && (n & (n - 1)) == 0;
}

struct pawl_segment pawl_segment_initial(uint32_t i, uint32_t n)
{
    struct pawl_segment s = {i, n - 1};
    return s;
}

int pawl_segment_split(struct pawl_segment seg, struct pawl_segment *lo, struct pawl_segment *hi)
{
    if (!pawl_segment_valid(seg))
        return PAWL_EINVAL;
    if (seg.mask >= 0x3fffffffu)
        return PAWL_ERANGE;
    uint32_t m = seg.mask * 2 + 1;
    if (lo) {
        lo->id = seg.id;
        lo->mask = m;
    }
    if (hi) {
        hi->id = seg.id + seg.mask + 1;
        hi->mask = m;
        PAWL_ASSERT(pawl_segment_valid(*hi)); /* the invariant survives a split */
    }
    return 0;
}

int pawl_segment_sibling(struct pawl_segment seg, struct pawl_segment *sibling)
{
    if (!pawl_segment_valid(seg))
        return PAWL_EINVAL;
    if (seg.mask == 0)
        return PAWL_ERANGE;
    uint32_t top = (seg.mask >> 1) + 1;
    sibling->id = seg.id ^ top;
    sibling->mask = seg.mask;
    PAWL_ASSERT(pawl_segment_valid(*sibling));
    return 0;
}

int pawl_segment_parent(struct pawl_segment seg, struct pawl_segment *parent)
{
    if (!pawl_segment_valid(seg))
        return PAWL_EINVAL;
    if (seg.mask == 0)
        return PAWL_ERANGE;
    parent->mask = seg.mask >> 1;
    parent->id = seg.id & parent->mask;
    PAWL_ASSERT(pawl_segment_valid(*parent)); /* and a merge */
    return 0;
}

/* ---- event batch ---- */

void pawl_event_batch_init(struct pawl_event_batch *b)
{
    memset(b, 0, sizeof *b);
}

void pawl_event_batch_fini(struct pawl_event_batch *b)
{
    if (b == NULL)
        return;
    pawl_free(b->events);
    pawl_free(b->_arena);
    memset(b, 0, sizeof *b);
}

void pawl_event_batch_clear(struct pawl_event_batch *b)
{
    b->n = 0;
    b->_used = 0;
}

/* Grow the arena to hold need more bytes, rebasing every pointer already handed out. */
static int arena_reserve(struct pawl_event_batch *b, size_t need)
{
    if (b->_used + need <= b->_cap)
        return 0;
    size_t cap = b->_cap ? b->_cap : 4096;
    while (cap < b->_used + need)
        cap *= 2;
    char *old = b->_arena;
    char *a = pawl_realloc(old, cap);
    if (a == NULL)
        return PAWL_ENOMEM;
    if (old != NULL && a != old) {
        for (size_t i = 0; i < b->n; i++) {
            struct pawl_event *e = &b->events[i];
#define REBASE_(f)                                                                                 \
    if (e->f)                                                                                      \
        e->f = a + ((const char *)e->f - old);
            REBASE_(stream_id)
            REBASE_(type)
            REBASE_(payload)
            REBASE_(metadata)
            REBASE_(id)
#undef REBASE_
        }
    }
    b->_arena = a;
    b->_cap = cap;
    return 0;
}

static const char *arena_copy(struct pawl_event_batch *b, const void *src, size_t len, int nul)
{
    char *d = b->_arena + b->_used;
    if (len)
        memcpy(d, src, len);
    if (nul)
        d[len++] = '\0';
    b->_used += (len + 7) & ~(size_t)7;
    return d;
}

int pawl_event_batch_push(struct pawl_event_batch *b, const struct pawl_event *e)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        struct pawl_event *ev = pawl_realloc(b->events, cap * sizeof *ev);
        if (ev == NULL)
            return PAWL_ENOMEM;
        b->events = ev;
        b->cap = cap;
    }
    size_t ls = e->stream_id ? strlen(e->stream_id) : 0;
    size_t lt = e->type ? strlen(e->type) : 0;
    size_t lm = e->metadata ? strlen(e->metadata) : 0;
    size_t li = e->id ? strlen(e->id) : 0;
    size_t need = ((ls + 8) & ~(size_t)7) + ((lt + 8) & ~(size_t)7) +
                  ((e->payload_len + 7) & ~(size_t)7) + ((lm + 8) & ~(size_t)7) +
                  (e->id ? ((li + 8) & ~(size_t)7) : 0);
    int rc = arena_reserve(b, need);
    if (rc)
        return rc;
    struct pawl_event *d = &b->events[b->n];
    *d = *e;
    d->stream_id = arena_copy(b, e->stream_id ? e->stream_id : "", ls, 1);
    d->type = arena_copy(b, e->type ? e->type : "", lt, 1);
    d->payload = e->payload_len ? arena_copy(b, e->payload, e->payload_len, 0) : NULL;
    d->metadata = e->metadata ? arena_copy(b, e->metadata, lm, 1) : NULL;
    d->id = e->id ? arena_copy(b, e->id, li, 1) : NULL;
    b->n++;
    return 0;
}
