/*
 * segment.h — private helpers around segments and the stream hash (the public part is in
 * pawl/processor.h): MurmurHash3 x86_32 over arbitrary bytes, and the event batch arena.
 * Pure functions; any thread.
 */
#ifndef PAWL_ENGINE_SEGMENT_H
#define PAWL_ENGINE_SEGMENT_H

#include "pawl/processor.h"

#include <stddef.h>
#include <stdint.h>

/* MurmurHash3 x86_32 of len bytes at data with seed. */
uint32_t pawl__murmur3_32(const void *data, size_t len, uint32_t seed);

/* Non-zero iff s is a power of two in 1..2^16 (an acceptable initial segment count). */
int pawl__segment_count_valid(uint32_t n);

#endif
