/*
 * bench_ioloop.c — the connection pool's I/O loop on io_uring and on the epoll fallback, under
 * the same insert load: K requests kept in flight on one pool (each an INSERT into an unlogged
 * table, its own implicit transaction, resubmitted from its completion callback, so every
 * system call of the run after start-up is the I/O thread's), for S seconds per backend,
 * alternating backends R times. Prints per run: requests per second, process CPU per request,
 * request latency p50/p99, and the loop's own counts per request (its waiting system calls:
 * io_uring_enter or epoll_wait; epoll_ctl calls or poll requests; wake-ups). Run it under
 * `perf stat -e raw_syscalls:sys_enter` or `strace -c -f` for the libpq sends and receives too.
 *
 * Usage: bench_ioloop [DSN] [--seconds S] [--inflight K] [--rounds R] [--backend io_uring|epoll]
 * DSN: argument or PAWL_DSN.
 */
#include "common.h"
#include "pgconn.h"

#include "pawl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MAXK 256
#define MAXLAT (1 << 22)

struct slot {
    struct pawl_pgreq req;
    struct pawl_pgstmt stmt;
    const char *vals[1];
    int64_t t0;
};

static struct pawl_pgpool *pool;
static int running;
static int64_t *lat;
static size_t nlat;
static int64_t done_n, failed_n;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t cpu_ns(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ((int64_t)ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000 +
           ((int64_t)ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000;
}

static void on_done(struct pawl_pgreq *r, int rc)
{
    struct slot *s = r->ud;
    int64_t t = now_ns();
    /* All callbacks run on the one I/O thread: plain counters. */
    if (rc == 0) {
        done_n++;
        if (nlat < MAXLAT)
            lat[nlat++] = t - s->t0;
    } else {
        failed_n++;
    }
    if (atomic_load_explicit(PAWL_ATOMIC_OF(&running), memory_order_acquire)) {
        s->t0 = t;
        pawl__pgpool_submit(pool, &s->req);
    }
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static void run(const char *dsn, int backend, int secs, int k)
{
    struct pawl_pgpool_opts o;
    pawl__pgpool_opts_defaults(&o);
    o.name = "bench";
    o.connections = 1;
    o.io_backend = backend;
    char err[512];
    if (pawl__pgpool_new(&pool, dsn, &o, 10000, err, sizeof err) != 0) {
        fprintf(stderr, "bench_ioloop: %s\n", err);
        exit(1);
    }
    int id = pawl__pgpool_prepare(pool, "INSERT INTO pawl_bench_ioloop VALUES ($1::int)", 1, NULL);
    static struct slot slots[MAXK];
    struct pawl_pgstmt st = {.sql =
                                 "CREATE UNLOGGED TABLE IF NOT EXISTS pawl_bench_ioloop (x int)"};
    struct pawl_pgreq cr = {.stmts = &st, .nstmts = 1};
    pawl__pgpool_exec(pool, -1, &cr);
    struct pawl_pgstmt tr = {.sql = "TRUNCATE pawl_bench_ioloop"};
    struct pawl_pgreq trr = {.stmts = &tr, .nstmts = 1};
    pawl__pgpool_exec(pool, -1, &trr);
    done_n = failed_n = 0;
    nlat = 0;
    atomic_store_explicit(PAWL_ATOMIC_OF(&running), 1, memory_order_release);
    struct pawl_pgpool_loop_stats s0, s1;
    pawl__pgpool_loop_stats(pool, &s0);
    int64_t c0 = cpu_ns(), t0 = now_ns();
    for (int i = 0; i < k; i++) {
        struct slot *s = &slots[i];
        memset(s, 0, sizeof *s);
        s->vals[0] = "1";
        s->stmt.prepared = id;
        s->stmt.nparams = 1;
        s->stmt.values = s->vals;
        s->req.stmts = &s->stmt;
        s->req.nstmts = 1;
        s->req.on_done = on_done;
        s->req.ud = s;
        s->t0 = now_ns();
        pawl__pgpool_submit(pool, &s->req);
    }
    sleep((unsigned)secs);
    atomic_store_explicit(PAWL_ATOMIC_OF(&running), 0, memory_order_release);
    int64_t t1 = now_ns(), c1 = cpu_ns();
    pawl__pgpool_loop_stats(pool, &s1);
    while (pawl__pgpool_pending(pool) > 0)
        usleep(1000);
    int64_t n = atomic_load_explicit(PAWL_ATOMIC_OF(&done_n), memory_order_acquire);
    qsort(lat, nlat, sizeof *lat, cmp64);
    double p50 = nlat ? (double)lat[nlat / 2] / 1e6 : 0,
           p99 = nlat ? (double)lat[nlat * 99 / 100] / 1e6 : 0;
    double per = n ? (double)n : 1;
    printf("%-9s %3d %9.0f %11.1f %8.3f %8.3f %9.2f %9.2f %9.2f %6lld\n",
           pawl__pgpool_io_backend(pool), k, (double)n / ((double)(t1 - t0) / 1e9),
           (double)(c1 - c0) / 1000.0 / per, p50, p99, (double)(s1.enters - s0.enters) / per,
           (double)(s1.ctls - s0.ctls) / per, (double)(s1.wakeups - s0.wakeups) / per,
           (long long)failed_n);
    fflush(stdout);
    pawl__pgpool_free(pool);
    pool = NULL;
}

int main(int argc, char **argv)
{
    const char *dsn = getenv("PAWL_DSN");
    int secs = 5, k = 8, rounds = 2, only = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            secs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--inflight") == 0 && i + 1 < argc)
            k = atoi(argv[++i]);
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc)
            only = strcmp(argv[++i], "epoll") == 0 ? PAWL_TIMER_BACKEND_EPOLL
                                                   : PAWL_TIMER_BACKEND_IO_URING;
        else
            dsn = argv[i];
    }
    if (dsn == NULL || secs < 1 || k < 1 || k > MAXK || rounds < 1) {
        fprintf(stderr,
                "usage: bench_ioloop [DSN] [--seconds S] [--inflight K (1..%d)] "
                "[--rounds R] [--backend io_uring|epoll]\n",
                MAXK);
        return 2;
    }
    lat = malloc(MAXLAT * sizeof *lat);
    printf("%-9s %3s %9s %11s %8s %8s %9s %9s %9s %6s\n", "backend", "k", "req/s", "cpu_us/req",
           "p50_ms", "p99_ms", "waits/req", "ctls/req", "wake/req", "failed");
    for (int r = 0; r < rounds; r++)
        for (int b = 0; b < 2; b++) {
            int be = b ? PAWL_TIMER_BACKEND_EPOLL : PAWL_TIMER_BACKEND_IO_URING;
            if (only < 0 || only == be)
                run(dsn, be, secs, k);
        }
    free(lat);
    return 0;
}
