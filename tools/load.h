/*
 * load.h — the generated append load of `pawl demo`, `pawl bench` and `pawl append --generate`:
 * --appenders threads, each appending --events-per-append events per transaction (asynchronous,
 * pipelined appends: many in flight, up to --max-inflight-appends; latency is measured from
 * submission to the acknowledged commit), paced
 * together to --rate events per second, spread over --streams stream ids in turn (appends in
 * flight together use distinct streams, so they never wait for each other's locks), for
 * --duration or until --count events or an interrupt. Start and stop from one thread; the
 * counters may be read from any thread.
 */
#ifndef PAWL_TOOL_LOAD_H
#define PAWL_TOOL_LOAD_H

#include "tool.h"

#include <pthread.h>
#include <stdatomic.h>

struct thread_arg;

struct tool_load {
    struct pawl_store *store;
    const struct tool_config *cfg;
    int nthreads;
    pthread_t *threads;
    struct thread_arg *args;
    _Atomic int stop;
    _Atomic int64_t events;       /* appended (committed) */
    _Atomic int64_t reserved;     /* handed to appends (for --count) */
    _Atomic uint64_t next_stream; /* the next stream id to use, round robin over --streams */
    _Atomic int64_t appends;
    _Atomic int64_t errors;
    _Atomic int running; /* threads still appending */
    pthread_mutex_t err_mu;
    char first_error[320];
    int64_t start_ns;
};

int tool_load_start(struct tool_load *l, struct pawl_store *store, const struct tool_config *cfg);
/* Non-zero once every thread has finished (duration or count reached, or an error stop). */
int tool_load_done(struct tool_load *l);
/* Ask the threads to stop, join them, and wait for their appends in flight. */
void tool_load_stop(struct tool_load *l);

#endif
