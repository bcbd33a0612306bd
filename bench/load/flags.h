/*
 * flags.h — parsing of the load benchmarks' numeric flags (header only).
 */
#ifndef PAWL_BENCH_FLAGS_H
#define PAWL_BENCH_FLAGS_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* A whole decimal number in [lo, hi] for flag `name`, or a message and -1. */
static inline int int_arg(const char *name, const char *arg, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (end == arg || *end != '\0' || errno != 0 || v < lo || v > hi) {
        fprintf(stderr, "%s must be a whole number from %ld to %ld, not '%s'\n", name, lo, hi, arg);
        return -1;
    }
    *out = (int)v;
    return 0;
}

#endif
