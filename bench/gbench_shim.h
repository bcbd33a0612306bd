/*
 * gbench_shim.h — a C API over Google Benchmark, so that micro-benchmarks are plain C. The only
 * C++ is gbench_shim.cc. The state is opaque; a benchmark function runs its timed loop as
 *
 *     while (pawl_bench_keep_running(st)) { ...one iteration... }
 *
 * and may pause/resume timing around set-up inside the loop, report items processed (Google
 * Benchmark then prints items/s) and named counters. Register functions before calling
 * pawl_bench_main(), which parses the usual --benchmark_* flags.
 *
 * Threads: registration and pawl_bench_main from the main thread; the state functions from the
 * thread running the benchmark function.
 */
#ifndef PAWL_GBENCH_SHIM_H
#define PAWL_GBENCH_SHIM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pawl_bench_state pawl_bench_state; /* borrowed during the benchmark function */
typedef struct pawl_bench pawl_bench;             /* a registration; owned by the library */
typedef void (*pawl_bench_fn)(pawl_bench_state *st, void *arg);

/* Register fn(arg) under name (copied). Returns a handle for the setters below. */
pawl_bench *pawl_bench_register(const char *name, pawl_bench_fn fn, void *arg);
pawl_bench *pawl_bench_arg(pawl_bench *b, int64_t value); /* adds one run with range(0) = value */
pawl_bench *pawl_bench_use_real_time(pawl_bench *b);      /* wall clock, not this thread's CPU */
pawl_bench *pawl_bench_min_time(pawl_bench *b, double seconds);
pawl_bench *pawl_bench_unit_ns(pawl_bench *b);
pawl_bench *pawl_bench_unit_us(pawl_bench *b);

/* Nonzero while the benchmark wants another iteration. */
int pawl_bench_keep_running(pawl_bench_state *st);
void pawl_bench_pause(pawl_bench_state *st);
void pawl_bench_resume(pawl_bench_state *st);
int64_t pawl_bench_range(pawl_bench_state *st, int index);
int64_t pawl_bench_iterations(pawl_bench_state *st);
void pawl_bench_set_items_processed(pawl_bench_state *st, int64_t items);
void pawl_bench_skip_with_error(pawl_bench_state *st, const char *msg);

enum pawl_bench_counter_kind {
    PAWL_BENCH_COUNTER_PLAIN = 0, /* printed as given */
    PAWL_BENCH_COUNTER_RATE = 1,  /* divided by the elapsed time */
    PAWL_BENCH_COUNTER_AVG = 2,   /* divided by the number of iterations */
};
void pawl_bench_counter(pawl_bench_state *st, const char *name, double value,
                        enum pawl_bench_counter_kind kind);

/* Initialise from argv (--benchmark_filter, --benchmark_format, ...), run, shut down. */
int pawl_bench_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
