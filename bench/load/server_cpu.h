/*
 * server_cpu.h — a benchmark cell's server CPU, read from the backends that served it, and
 * latency histograms that pool over rounds (header only; for the load benchmarks).
 *
 * Server CPU. A cell names its backends (PQbackendPID of every connection it opened, or every
 * client backend of its own scratch database in pg_stat_activity) and reads each one's CPU time
 * just before and just after its measured window: the first field of /proc/PID/schedstat, the
 * nanoseconds the scheduler ran the task (perf's task-clock), or, on a kernel without it,
 * utime + stime of /proc/PID/stat in clock ticks. The cell's server CPU is the sum of the
 * differences over all its backends, divided by the events of the window. Summing per backend
 * counts every connection the cell used however the work was spread over them (4 or 64 INSERT
 * clients, pawl's pool and its finalizer), and leaves out the work of other databases on a
 * shared server, which a cluster-wide figure would count. Not counted: the server's background
 * processes (WAL writer, checkpointer, autovacuum) and a backend that exits inside the window
 * (reported as lost). The figures exist only when the server runs on this machine: a backend
 * PID that is not a local `postgres` process gives none.
 *
 * Histograms use pawl's own geometry (pawl/metrics.h: 16 buckets per power of two of
 * nanoseconds, a percentile within 6.25 %), so a baseline's latencies recorded here and pawl's
 * recorded by the library read with the same precision, and rounds pool by adding buckets.
 *
 * Threads: a struct srv_cpu and a histogram belong to one thread at a time (the benchmark's main
 * thread, or the client thread that records into its own histogram).
 */
#ifndef PAWL_BENCH_SERVER_CPU_H
#define PAWL_BENCH_SERVER_CPU_H

#include "pawl/metrics.h"

#include <libpq-fe.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define SRV_CPU_MAX 256

struct srv_cpu {
    int n;
    pid_t pid[SRV_CPU_MAX];
    unsigned char fin[SRV_CPU_MAX]; /* 1: the finalizer's backend (its share is reported too) */
    int64_t t0[SRV_CPU_MAX];        /* -1: unreadable at the start */
};

struct srv_cpu_result {
    int local;      /* 0: the backends are not on this machine; no figures */
    int backends;   /* backends summed */
    int finalizers; /* of them, finalizer backends */
    int lost;       /* backends unreadable at the end (exited inside the window) */
    int64_t ns;     /* CPU of every backend summed */
    int64_t fin_ns; /* of ns, the finalizer backends' */
};

/* A backend's CPU time in ns so far, or -1 when pid is not a local postgres process. */
static inline int64_t srv_cpu_task_ns(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *open = strchr(buf, '('), *close = strrchr(buf, ')');
    if (open == NULL || close == NULL || close - open - 1 != 8 || strncmp(open + 1, "postgres", 8))
        return -1;
    snprintf(path, sizeof path, "/proc/%d/schedstat", (int)pid);
    f = fopen(path, "r");
    if (f != NULL) {
        long long ns = -1;
        int ok = fscanf(f, "%lld", &ns) == 1;
        fclose(f);
        if (ok && ns >= 0)
            return ns;
    }
    long long ut, st;
    if (sscanf(close + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lld %lld", &ut, &st) != 2)
        return -1;
    return (ut + st) * (1000000000LL / sysconf(_SC_CLK_TCK));
}

/* Which clock srv_cpu_task_ns reads here, for the output's header. */
static inline const char *srv_cpu_clock_name(void)
{
    return access("/proc/self/schedstat", R_OK) == 0
               ? "/proc/PID/schedstat run time (task clock, ns)"
               : "/proc/PID/stat utime+stime (clock ticks)";
}

static inline void srv_cpu_add(struct srv_cpu *c, pid_t pid, int fin)
{
    if (pid <= 0 || c->n == SRV_CPU_MAX)
        return;
    c->pid[c->n] = pid;
    c->fin[c->n] = (unsigned char)(fin != 0);
    c->n++;
}

/* Every client backend of admin's database but admin's own, a finalizer's by its
 * application_name ('pawl finalizer', or any ending in "finalizer"): the cell's backends when
 * the database is its own. */
static inline int srv_cpu_add_db_backends(struct srv_cpu *c, PGconn *admin)
{
    PGresult *r = PQexec(admin, "SELECT pid, application_name LIKE '%finalizer'"
                                " FROM pg_stat_activity WHERE datname = current_database()"
                                " AND backend_type = 'client backend' AND pid <> pg_backend_pid()");
    int added = 0;
    if (PQresultStatus(r) == PGRES_TUPLES_OK)
        for (int i = 0; i < PQntuples(r); i++, added++)
            srv_cpu_add(c, (pid_t)atoi(PQgetvalue(r, i, 0)), PQgetvalue(r, i, 1)[0] == 't');
    PQclear(r);
    return added;
}

static inline void srv_cpu_start(struct srv_cpu *c)
{
    for (int i = 0; i < c->n; i++)
        c->t0[i] = srv_cpu_task_ns(c->pid[i]);
}

static inline void srv_cpu_stop(const struct srv_cpu *c, struct srv_cpu_result *r)
{
    memset(r, 0, sizeof *r);
    for (int i = 0; i < c->n; i++) {
        if (c->t0[i] < 0)
            continue;
        r->local = 1;
        int64_t t1 = srv_cpu_task_ns(c->pid[i]);
        if (t1 < 0) {
            r->lost++;
            continue;
        }
        r->backends++;
        r->ns += t1 - c->t0[i];
        if (c->fin[i]) {
            r->finalizers++;
            r->fin_ns += t1 - c->t0[i];
        }
    }
}

/* ---- histograms in pawl/metrics.h's geometry ------------------------------------------------ */

static inline unsigned bench_hist_bucket(uint64_t v)
{
    const unsigned sub = 1u << PAWL_METRICS_SUB_BITS;
    if (v < sub)
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v);
    if (e > PAWL_METRICS_MAX_EXP)
        return PAWL_METRICS_BUCKETS - 1;
    unsigned s = (unsigned)(v >> (e - PAWL_METRICS_SUB_BITS)) & (sub - 1);
    return sub + (e - PAWL_METRICS_SUB_BITS) * sub + s;
}

static inline void bench_hist_add(struct pawl_metrics_hist *h, int64_t ns)
{
    uint64_t v = ns < 0 ? 0 : (uint64_t)ns;
    h->buckets[bench_hist_bucket(v)]++;
    h->count++;
    h->sum_ns += v;
    if (v > h->max_ns)
        h->max_ns = v;
}

/* dst += src (max_ns: the larger). */
static inline void bench_hist_merge(struct pawl_metrics_hist *dst,
                                    const struct pawl_metrics_hist *src)
{
    for (unsigned i = 0; i < PAWL_METRICS_BUCKETS; i++)
        dst->buckets[i] += src->buckets[i];
    dst->count += src->count;
    dst->sum_ns += src->sum_ns;
    if (src->max_ns > dst->max_ns)
        dst->max_ns = src->max_ns;
}

static inline double bench_hist_ms(const struct pawl_metrics_hist *h, double q)
{
    return (double)pawl_metrics_quantile_ns(h, q) / 1e6;
}

#endif
