/*
 * bench_append.c — append throughput with the finalizer on and off, side by side in one run,
 * and the finalize delay (acknowledged commit -> end of the finalization run that covers it).
 *
 * Cells: connections {1, 4} x events per append {1, 100} x finalizer {off, on}, each a closed
 * loop keeping `inflight` async appends outstanding per connection for --seconds, after a short
 * warm-up. Then a rate-limited cell (--rate events/s in --rate-batch-event appends, default
 * 10000 events/s as 1000 appends of 10, 4 connections, finalizer on) for the delay at a steady
 * load. With --baseline, the same closed-loop cells
 * also run against the per-event design (bench/baselines/renumber.sql: every event row renumbered
 * by the finalizer), which is what the per-run design is measured against.
 *
 * Each cell starts with a CHECKPOINT (see checkpoint()), and after each cell everything
 * appended is finalized (untimed), so each cell starts clean. Per cell: the whole system's CPU
 * per event and, of it, the finalizer's own (its server process and the store's threads that
 * serve it; see fin_cpu_ns_now()); and the server CPU per event of the cell's own backends
 * (every client backend of the database but the run's admin connection: the store's or the
 * pool's connections and the finalizer's, each one's task clock summed over the measured
 * window, see server_cpu.h), which other work on a shared server does not inflate.
 * Each off/on pair runs --rounds times, the two cells of a round next to each other; besides the
 * means over rounds, the geometric mean of the rounds' own on/off ratios is reported with its
 * 95% interval, which says whether a difference of a few percent is the finalizer or the machine.
 * Output: CSV (stdout, or --csv FILE) and a markdown table on stderr.
 * The finalize delay's p50 and p99 are percentiles of every round's delays pooled: a per-run
 * cell's delays come from the library's process-wide histogram (pawl/metrics.h,
 * PAWL_H_FINALIZE_DELAY, the figure behind pawl_store_stats' delay percentiles) read around the
 * cell, a per-event cell's from this program's own measurements in the same geometry (within
 * 6.25 %), and the rounds' histograms are added. The max is the largest of any round. The CSV's
 * delay_percentiles column says "one round" or "pooled over N rounds".
 *
 * Usage: bench_append --dsn DSN [--seconds 10] [--rounds 3] [--rate 10000] [--inflight 64]
 *                     [--csv FILE] [--baseline] [--quick] [--min-interval-us N] [--streams N]
 *                     [--stream-space N] [--latency-share PCT] [--busy-share PCT] [--rate-only]
 * (--quick: only the 4-connection cells; --rate-only: only the rate-limited cell;
 * --min-interval-us: the finalizer cadence; --streams: how many streams one append's events go
 * to, 0 = a random one per event, the default; --stream-space: how many streams they are picked
 * from, default 100 000; --latency-share, --busy-share: the finalizer's
 * finalizer_latency_share_pct, finalizer_busy_share_pct.)
 */
#include "pawl.h"

#include "common.h"
#include "flags.h"
#include "log_int.h"
#include "pgconn.h"
#include "server_cpu.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <libpq-fe.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *dsn;
static int seconds = 10;
static int warmup_ms = 1500;
static int rate = 10000;
static int inflight_per_conn = 64;
static int baseline;
static int min_interval_us = -1;
static int latency_share = -1; /* --latency-share: the store's default when < 0 */
static int busy_share = -1;    /* --busy-share: the store's default when < 0 */
static int rounds = 3;
static int rate_batch = 10;
static int piggyback = -1;

struct cell {
    const char *design; /* "per-run" or "per-event" */
    int conns;
    int batch;
    int finalizer;
    int target_rate; /* 0 = closed loop */
    double ev_s;
    double cpu_us_ev; /* CPU per event: the server's processes and this one; 0 = unknown */
    double p50, p99, max;
    int64_t delay_count;
    double fin_runs_s;
    double retries;       /* re-runs per append (conflicts on shared streams; per-run cells only) */
    double fin_cpu_us_ev; /* of cpu_us_ev, the finalizer's own: its backend and its threads */
    double srv_us_ev;     /* the cell's backends' CPU per event (server_cpu.h); 0 = unknown */
    double srv_fin_us_ev; /* of srv_us_ev, the finalizer backend's */
    int srv_known;        /* 1: the backends were read (a local server) */
    struct pawl_metrics_hist delay; /* the finalize delays (pooled over rounds in main) */
    /* On an "on" cell of an off/on pair: the on/off ratios of each round's two cells (run next
     * to each other), as a geometric mean and its 95% interval; n = 0 when not computed. */
    struct ratio_ci {
        int n;
        double mean, lo, hi;
    } thr_ratio, cpu_ratio;
};

/* Two-sided 95% Student t quantiles for 1..10 degrees of freedom (then ~2.09 to 20, ~2.0). */
static double t95(int df)
{
    static const double t[] = {12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23};
    return df <= 10 ? t[df - 1] : df <= 20 ? 2.09 : 2.0;
}

/*
 * The geometric mean of n ratios and its 95% interval (on their logarithms). The two cells of a
 * round run seconds apart, so their ratio cancels most of what a shared machine does to both;
 * the spread of those ratios says how far the mean can be trusted.
 */
static struct ratio_ci ratio_ci_of(const double *r, int n)
{
    struct ratio_ci c = {0};
    int k = 0;
    double sum = 0, sq = 0;
    for (int i = 0; i < n; i++)
        if (r[i] > 0) {
            sum += log(r[i]);
            k++;
        }
    if (k == 0)
        return c;
    double m = sum / k;
    for (int i = 0; i < n; i++)
        if (r[i] > 0)
            sq += (log(r[i]) - m) * (log(r[i]) - m);
    double half = k > 1 ? t95(k - 1) * sqrt(sq / (k - 1) / k) : 0;
    c = (struct ratio_ci){.n = k, .mean = exp(m), .lo = exp(m - half), .hi = exp(m + half)};
    return c;
}

/* ---- CPU accounting ------------------------------------------------------------------------- */

/*
 * Throughput on a shared 2-core machine scatters by ±20% between runs; the CPU a cell burns per
 * event does not depend on who else gets the cores. When the server runs on this machine, a
 * cell's CPU is that of every process of the PostgreSQL cluster (the postmaster's children,
 * alive, plus the ones that exited, which the kernel adds to the postmaster's children times)
 * and of this process (the store's threads, the finalizer's included).
 */
static pid_t postmaster; /* 0: the server is not local, no CPU figures */

/* From a stat file: utime + stime (+ cutime + cstime when children) in ticks, and the parent. */
static int stat_cpu(const char *path, int children, pid_t *ppid, int64_t *ticks)
{
    char buf[1024];
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    long long v[15];
    int pp;
    if (p == NULL || sscanf(p + 2, "%*c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lld %lld %lld %lld",
                            &pp, &v[0], &v[1], &v[2], &v[3]) != 5)
        return -1;
    *ppid = pp;
    *ticks = v[0] + v[1] + (children ? v[2] + v[3] : 0);
    return 0;
}

/* utime + stime (+ cutime + cstime when children) and the parent of a process, in ticks. */
static int proc_cpu(pid_t pid, int children, pid_t *ppid, int64_t *ticks)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    return stat_cpu(path, children, ppid, ticks);
}

static int64_t ticks_ns(int64_t ticks)
{
    return ticks * (1000000000 / sysconf(_SC_CLK_TCK));
}

/*
 * The sum of one(dir/entry) over the numeric entries of dir (processes in /proc, threads in
 * /proc/self/task), in ticks; one returns 0 for an entry that does not count.
 */
static int64_t sum_entries(const char *dir, int64_t (*one)(const char *path))
{
    int64_t total = 0;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        if (de->d_name[0] < '1' || de->d_name[0] > '9')
            continue;
        char path[320];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        total += one(path);
    }
    if (d)
        closedir(d);
    return total;
}

/* A process's own ticks if the postmaster is its parent. */
static int64_t server_child_ticks(const char *path)
{
    char stat[340];
    snprintf(stat, sizeof stat, "%s/stat", path);
    pid_t pp;
    int64_t t;
    return stat_cpu(stat, 0, &pp, &t) == 0 && pp == postmaster ? t : 0;
}

static int64_t cpu_ns_now(void)
{
    if (postmaster == 0)
        return 0;
    pid_t pp;
    int64_t own = 0, t;
    if (proc_cpu(postmaster, 1, &pp, &t) == 0)
        own += t;
    if (proc_cpu(getpid(), 0, &pp, &t) == 0)
        own += t;
    return ticks_ns(own + sum_entries("/proc", server_child_ticks));
}

/* One connection for the run's own queries between and around the cells (the checkpoints, the
 * WAL counters), opened by prepare_server; NULL or broken: those figures are left out. */
static PGconn *admin;

/* admin's result for sql, or NULL (nothing to clear) when there is no usable connection. */
static PGresult *admin_exec(const char *sql)
{
    return PQstatus(admin) == CONNECTION_OK ? PQexec(admin, sql) : NULL;
}

/*
 * A CHECKPOINT before every cell (untimed): the pages earlier cells (or an earlier run, or a
 * dropped database) left dirty are written and synced before the cell starts, not by the
 * kernel's writeback in the middle of it. Without it the rate-limited cell, which follows the
 * heaviest cells, met the writeback of their data about 30 s later (the kernel's dirty expiry)
 * as commit flushes of 100-200 ms. The checkpoint needs superuser or pg_checkpoint; without it
 * the run goes on and says so once.
 */
static int checkpoints = 1;

static void checkpoint(void)
{
    if (!checkpoints)
        return;
    PGresult *r = admin_exec("CHECKPOINT");
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        fprintf(stderr, "note: no CHECKPOINT between the cells: %s", PQerrorMessage(admin));
        checkpoints = 0;
    }
    PQclear(r);
}

/*
 * The cluster's WAL counters (pg_stat_wal: flushes to disk and bytes written), read around a
 * cell's measured part to show what a design costs in commits. Cluster-wide: meaningful while
 * nothing else writes. 0 when they cannot be read.
 */
struct wal_mark {
    double syncs, bytes;
};

static struct wal_mark wal_now(void)
{
    struct wal_mark m = {0, 0};
    PGresult *r = admin_exec("SELECT wal_sync, wal_bytes FROM pg_stat_wal");
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
        m.syncs = atof(PQgetvalue(r, 0, 0));
        m.bytes = atof(PQgetvalue(r, 0, 1));
    }
    PQclear(r);
    return m;
}

/* Before the cells: open admin, and find the server's postmaster when it runs here (the parent
 * of admin's backend). */
static void prepare_server(void)
{
    admin = PQconnectdb(dsn);
    PGresult *r = admin_exec("SELECT pg_backend_pid()");
    pid_t pp;
    int64_t t;
    if (PQresultStatus(r) == PGRES_TUPLES_OK &&
        proc_cpu((pid_t)atoi(PQgetvalue(r, 0, 0)), 0, &pp, &t) == 0)
        postmaster = pp;
    PQclear(r);
    if (postmaster == 0)
        fprintf(stderr, "the server is not on this machine: no CPU figures\n");
}

/* A thread's ticks if it is the store's finalizer thread (by its name: with finalizer_own_thread
 * the finalizer runs on its connection's own I/O thread, pg-finalizer; by default it shares the
 * log connections' thread, pg-log, and its client CPU cannot be told from the appends'). */
static int64_t finalizer_thread_ticks(const char *path)
{
    char file[340], comm[32] = "";
    snprintf(file, sizeof file, "%s/comm", path);
    FILE *f = fopen(file, "r");
    if (f == NULL)
        return 0;
    int named = fgets(comm, sizeof comm, f) != NULL && strcmp(comm, "pg-finalizer\n") == 0;
    fclose(f);
    snprintf(file, sizeof file, "%s/stat", path);
    pid_t pp;
    int64_t t;
    return named && stat_cpu(file, 0, &pp, &t) == 0 ? t : 0;
}

/*
 * The finalizer's own CPU, to tell what it costs directly (its backend's statements and commits,
 * and the I/O thread of its connection when it has one of its own) from what it costs the
 * appends around it. backend: the finalizer connection's server process (0: none).
 */
static int64_t fin_cpu_ns_now(pid_t backend)
{
    if (postmaster == 0 || backend == 0)
        return 0;
    pid_t pp;
    int64_t t;
    int64_t own = proc_cpu(backend, 0, &pp, &t) == 0 ? t : 0;
    return ticks_ns(own + sum_entries("/proc/self/task", finalizer_thread_ticks));
}

/* The server process of this database's finalizer connection, or 0. */
static pid_t fin_backend(void)
{
    PGresult *r = admin_exec("SELECT pid FROM pg_stat_activity WHERE application_name = "
                             "'pawl finalizer' AND datname = current_database()");
    pid_t pid = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1
                    ? (pid_t)atoi(PQgetvalue(r, 0, 0))
                    : 0;
    PQclear(r);
    return pid;
}

static double cpu_us_per_event(int64_t cpu0, int64_t cpu1, int64_t events)
{
    return postmaster && events > 0 ? (double)(cpu1 - cpu0) / 1e3 / (double)events : 0;
}

/* The cell's backends (every client backend of this database but admin's), read at the start
 * of the measured window. */
static void srv_cells_start(struct srv_cpu *sc)
{
    sc->n = 0;
    if (PQstatus(admin) == CONNECTION_OK)
        srv_cpu_add_db_backends(sc, admin);
    srv_cpu_start(sc);
}

/* ... and at its end: their CPU per event into c. */
static void srv_cells_stop(const struct srv_cpu *sc, struct cell *c, int64_t events)
{
    struct srv_cpu_result r;
    srv_cpu_stop(sc, &r);
    c->srv_known = r.local && events > 0;
    c->srv_us_ev = c->srv_known ? (double)r.ns / 1e3 / (double)events : 0;
    c->srv_fin_us_ev = c->srv_known ? (double)r.fin_ns / 1e3 / (double)events : 0;
    if (c->srv_known)
        fprintf(stderr,
                "  the cell's %d backends: %.1f µs of CPU per event, the finalizer's %.1f\n",
                r.backends, c->srv_us_ev, c->srv_fin_us_ev);
    if (r.lost)
        fprintf(stderr, "  (%d backend%s exited inside the window: not counted)\n", r.lost,
                r.lost == 1 ? "" : "s");
}

/* ---- closed-loop admission ----------------------------------------------------------------- */

/*
 * The closed loop keeps `inflight` appends outstanding. The driver sleeps until a completion
 * frees a slot instead of polling, so its own CPU does not grow as throughput falls (the CPU
 * figures above divide by events). Seq_cst on inflight and waiting (Dekker): a completion that
 * does not see the driver waiting is seen by the driver's re-check before it sleeps.
 */
struct gate {
    atomic_int inflight;
    atomic_int waiting;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void gate_init(struct gate *g)
{
    atomic_init(&g->inflight, 0);
    atomic_init(&g->waiting, 0);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
}

static void gate_fini(struct gate *g)
{
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
}

static void gate_release(struct gate *g)
{
    atomic_fetch_sub(&g->inflight, 1);
    if (atomic_load(&g->waiting)) {
        pthread_mutex_lock(&g->mu);
        pthread_cond_signal(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
}

/* Wait (at most 1 ms at a time, so the caller's clock stays checked) for a free slot. */
static int gate_full(struct gate *g, int max)
{
    if (atomic_load(&g->inflight) < max)
        return 0;
    pthread_mutex_lock(&g->mu);
    atomic_store(&g->waiting, 1);
    if (atomic_load(&g->inflight) >= max) {
        struct timespec ts;
        pawl__timespec_in(&ts, CLOCK_REALTIME, 1000000);
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    atomic_store(&g->waiting, 0);
    pthread_mutex_unlock(&g->mu);
    return 1;
}

/* ---- closed/open loop driver over the store ---------------------------------------------- */

struct driver {
    struct pawl_store *s;
    atomic_llong done_events;
    struct gate g;
    int batch;
    atomic_int stop;
    atomic_llong errors;
};

struct cbctx {
    struct driver *d;
};

static void on_done(void *ud, const struct pawl_append_result *r)
{
    struct driver *d = ud;
    if (r->rc == 0)
        atomic_fetch_add_explicit(&d->done_events, d->batch, memory_order_relaxed);
    else
        atomic_fetch_add_explicit(&d->errors, 1, memory_order_relaxed);
    gate_release(&d->g);
}

static void sleep_ns(int64_t ns)
{
    struct timespec ts = {ns / 1000000000, ns % 1000000000};
    nanosleep(&ts, NULL);
}

/*
 * The stream of event k of an append: with --streams 0 (the default) every event picks one of
 * 100 000 streams at random; with --streams N the append picks N random streams and deals its
 * events over them in turn (N = 1: the usual event-sourcing append, one aggregate's events).
 */
static int streams_per_append;
static unsigned stream_space = 100000; /* --stream-space: how many streams there are */

static void stream_name(char *out, size_t len, int k, unsigned *seed, unsigned *picked)
{
    unsigned id;
    if (streams_per_append <= 0)
        id = (unsigned)rand_r(seed) % stream_space;
    else if (k < streams_per_append)
        id = picked[k] = (unsigned)rand_r(seed) % stream_space;
    else
        id = picked[k % streams_per_append];
    snprintf(out, len, "s-%u", id);
}

/* Fill events with batch events (ANY sequences), streams as stream_name() picks them. */
static void make_events(struct pawl_event *ev, int n, unsigned *seed, char (*sids)[32],
                        const char *payload, size_t plen)
{
    unsigned picked[100];
    for (int k = 0; k < n; k++) {
        stream_name(sids[k], 32, k, seed, picked);
        memset(&ev[k], 0, sizeof ev[k]);
        ev[k].stream_id = sids[k];
        ev[k].stream_seq = PAWL_SEQ_ANY;
        ev[k].type = "bench";
        ev[k].payload = payload;
        ev[k].payload_len = plen;
    }
}

static int64_t now_ns(void)
{
    return pawl_now_ns();
}

static void run_store_cell(struct cell *c)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.connections = c->conns;
    o.finalizer = c->finalizer;
    o.listen = 0;
    o.max_inflight_appends = 100000;
    if (min_interval_us >= 0)
        o.finalizer_min_interval_us = min_interval_us;
    if (latency_share >= 0)
        o.finalizer_latency_share_pct = latency_share;
    if (busy_share >= 0)
        o.finalizer_busy_share_pct = busy_share;
    if (piggyback >= 0)
        o.append_finalizes = c->finalizer ? piggyback : 0;
    else if (!c->finalizer)
        o.append_finalizes = 0; /* "off" means no finalization at all */
    struct pawl_store *s = NULL;
    char err[512];
    int rc = pawl_store_new(&s, dsn, &o, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "store: %s\n", err);
        exit(1);
    }
    struct driver d = {.s = s, .batch = c->batch};
    gate_init(&d.g);
    struct pawl_event ev[100];
    char sids[100][32];
    static const char payload[] = "{\"amount\": 42, \"currency\": \"EUR\", \"note\": \"bench\"}";
    unsigned seed = 42;
    int max_inflight = inflight_per_conn * c->conns;
    int64_t t0 = now_ns();
    int64_t t_measure = t0 + (int64_t)warmup_ms * 1000000;
    int64_t t_end = t_measure + (int64_t)seconds * 1000000000;
    int64_t ev0 = -1;
    int measuring = 0;
    int64_t interval = c->target_rate ? (int64_t)(1e9 * c->batch / c->target_rate) : 0;
    int64_t next = t0;
    struct pawl_store_stats st0;
    int64_t cpu0 = 0;
    struct wal_mark w0 = {0, 0};
    pid_t fin_pid = c->finalizer ? fin_backend() : 0;
    int64_t fin_cpu0 = 0;
    struct srv_cpu sc = {0};
    struct pawl_metrics_snapshot *m0 = calloc(2, sizeof *m0), *m1 = m0 ? m0 + 1 : NULL;
    if (m0 == NULL) {
        fprintf(stderr, "bench_append: out of memory\n");
        exit(1);
    }
    while (1) {
        int64_t now = now_ns();
        if (!measuring && now >= t_measure) {
            w0 = wal_now();
            cpu0 = cpu_ns_now();
            fin_cpu0 = fin_cpu_ns_now(fin_pid);
            srv_cells_start(&sc);
            ev0 = atomic_load(&d.done_events);
            pawl_store_stats(s, &st0, 1); /* reset the delay histogram */
            pawl_metrics_snapshot(m0);    /* and the pooled one's start */
            measuring = 1;
            t_measure = now;
        }
        if (now >= t_end)
            break;
        if (c->target_rate) {
            if (now < next) {
                sleep_ns(PAWL_MIN(next - now, 200000));
                continue;
            }
            next += interval;
        } else if (gate_full(&d.g, max_inflight)) {
            continue;
        }
        make_events(ev, c->batch, &seed, sids, payload, sizeof payload - 1);
        atomic_fetch_add(&d.g.inflight, 1);
        if (pawl_append_async(s, ev, (size_t)c->batch, on_done, &d) != 0) {
            gate_release(&d.g);
            sleep_ns(100000);
        }
    }
    int64_t ev1 = atomic_load(&d.done_events);
    int64_t t1 = now_ns();
    c->cpu_us_ev = cpu_us_per_event(cpu0, cpu_ns_now(), ev1 - ev0);
    c->fin_cpu_us_ev = cpu_us_per_event(fin_cpu0, fin_cpu_ns_now(fin_pid), ev1 - ev0);
    srv_cells_stop(&sc, c, ev1 - ev0);
    struct wal_mark w1 = wal_now();
    double secs = (double)(t1 - t_measure) / 1e9, appends = (double)(ev1 - ev0) / c->batch;
    if (fin_pid)
        fprintf(stderr, "  CPU per event %.1f µs, of which the finalizer's own %.1f µs\n",
                c->cpu_us_ev, c->fin_cpu_us_ev);
    if (w1.syncs > 0 && appends > 0)
        fprintf(stderr, "  WAL: %.0f flushes/s (%.2f per append), %.0f bytes per event\n",
                (w1.syncs - w0.syncs) / secs, (w1.syncs - w0.syncs) / appends,
                (w1.bytes - w0.bytes) / (double)(ev1 - ev0));
    struct pawl_store_stats st;
    /* Let the last finalization finish so the delay histogram includes the tail. */
    pawl_store_drain(s);
    if (c->finalizer)
        usleep(100000);
    pawl_store_stats(s, &st, 0);
    pawl_metrics_snapshot(m1);
    pawl_metrics_diff(m1, m1, m0);
    c->delay = m1->hists[PAWL_H_FINALIZE_DELAY];
    free(m0);
    c->ev_s = (double)(ev1 - ev0) / ((double)(t1 - t_measure) / 1e9);
    c->p50 = st.delay_p50_ms;
    c->p99 = st.delay_p99_ms;
    c->max = st.delay_max_ms;
    c->delay_count = st.delay_count;
    c->fin_runs_s = (double)(st.finalize_runs - st0.finalize_runs) / ((t1 - t_measure) / 1e9);
    c->retries = ev1 > ev0 ? (double)(st.append_retries - st0.append_retries) /
                                 ((double)(ev1 - ev0) / c->batch)
                           : 0;
    fprintf(stderr, "  appends re-run after a conflict: %.3f per append\n", c->retries);
    if (c->finalizer)
        fprintf(stderr,
                "  finalizer interval %.2f ms (append latency average %.2f ms, p50 %.2f, p99 "
                "%.2f); runs p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
                st.finalizer_interval_ms, st.append_latency_avg_ms, st.append_p50_ms,
                st.append_p99_ms, st.run_p50_ms, st.run_p99_ms, st.run_max_ms);
    if (atomic_load(&d.errors))
        fprintf(stderr, "  (%lld append errors)\n", (long long)atomic_load(&d.errors));
    /* Untimed: finalize everything left so the next cell starts clean. */
    int64_t a = 1;
    while (a != 0) {
        if (pawl_finalize_now(s, &a, NULL, NULL) != 0)
            break;
        if (a < 0)
            usleep(1000);
    }
    pawl_store_free(s);
    gate_fini(&d.g);
}

/* ---- the per-event baseline -------------------------------------------------------------- */

struct pe {
    struct pawl_pgpool *pool;
    int stmt;
    atomic_llong done_events;
    struct gate g;
    int batch;
    atomic_int signal;
    atomic_int stop;
    atomic_llong acked;
    /* ack times ring for the delay */
    atomic_llong ring_seq[65536];
    atomic_llong ring_t[65536];
    int64_t *delays;
    size_t ndelays, cap;
    int64_t runs;
};

/* The same 52-byte payload as the per-run cells, as a bytea array element. */
static char pe_payload_literal[160];

static void init_pe_payload(void)
{
    static const char payload[] = "{\"amount\": 42, \"currency\": \"EUR\", \"note\": \"bench\"}";
    char *p = pe_payload_literal;
    p += sprintf(p, "\"\\\\x");
    for (size_t i = 0; i < sizeof payload - 1; i++)
        p += sprintf(p, "%02x", (unsigned char)payload[i]);
    sprintf(p, "\"");
}

struct pe_op {
    struct pe *pe;
    struct pawl_pgreq req;
    struct pawl_pgstmt st;
    const char *vals[5];
    char a[3][16384];
};

static void pe_done(struct pawl_pgreq *r, int rc)
{
    struct pe_op *op = r->ud;
    struct pe *pe = op->pe;
    if (rc == 0) {
        atomic_fetch_add(&pe->done_events, pe->batch);
        long long q = atomic_fetch_add(&pe->acked, 1) + 1;
        atomic_store(&pe->ring_t[q & 65535], now_ns());
        atomic_store(&pe->ring_seq[q & 65535], q);
        atomic_store(&pe->signal, 1);
    }
    gate_release(&pe->g);
    free(op);
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

struct pe_fin {
    struct pe *pe;
    int on;
};

static void *pe_finalizer(void *arg)
{
    struct pe *pe = arg;
    PGconn *c = PQconnectdb(dsn);
    /* Named so that the cell's server CPU shows its share (srv_cpu_add_db_backends). */
    PQclear(PQexec(c, "SET application_name = 'per-event finalizer'"));
    long long covered = 0;
    while (!atomic_load(&pe->stop)) {
        if (!atomic_exchange(&pe->signal, 0)) {
            usleep(200);
            continue;
        }
        long long upto = atomic_load(&pe->acked);
        PGresult *r = PQexec(c, "SELECT * FROM bl_renumber.finalize()");
        PQclear(r);
        pe->runs++;
        int64_t t = now_ns();
        for (long long q = covered + 1; q <= upto; q++) {
            if (atomic_load(&pe->ring_seq[q & 65535]) != q)
                continue;
            if (pe->ndelays == pe->cap) {
                pe->cap = pe->cap ? pe->cap * 2 : 65536;
                pe->delays = realloc(pe->delays, pe->cap * sizeof(int64_t));
            }
            pe->delays[pe->ndelays++] = t - atomic_load(&pe->ring_t[q & 65535]);
        }
        covered = upto;
    }
    PQfinish(c);
    return NULL;
}

static void run_pe_cell(struct cell *c)
{
    struct pawl_pgpool_opts po;
    pawl__pgpool_opts_defaults(&po);
    po.connections = c->conns;
    po.name = "per-event";
    struct pe *pe = calloc(1, sizeof *pe);
    gate_init(&pe->g);
    char err[512];
    if (pawl__pgpool_new(&pe->pool, dsn, &po, 10000, err, sizeof err) != 0) {
        fprintf(stderr, "pool: %s\n", err);
        exit(1);
    }
    pe->batch = c->batch;
    pe->stmt = pawl__pgpool_prepare(
        pe->pool,
        "INSERT INTO bl_renumber.events (stream_id, stream_seq, type, payload, metadata) "
        "SELECT u.s, coalesce((SELECT e.stream_seq FROM bl_renumber.events e "
        "WHERE e.stream_id = u.s ORDER BY e.stream_seq DESC LIMIT 1), 0) "
        "+ row_number() OVER (PARTITION BY u.s ORDER BY u.o), u.t, u.p, NULL "
        "FROM unnest($1::text[], $2::text[], $3::bytea[]) WITH ORDINALITY AS u(s, t, p, o)",
        3, NULL);
    pthread_t fin;
    if (c->finalizer)
        pthread_create(&fin, NULL, pe_finalizer, pe);
    unsigned seed = 7;
    int64_t t0 = now_ns();
    int64_t t_measure = t0 + (int64_t)warmup_ms * 1000000;
    int64_t t_end = t_measure + (int64_t)seconds * 1000000000;
    int64_t ev0 = -1;
    int max_inflight = inflight_per_conn * c->conns;
    int64_t cpu0 = 0;
    struct srv_cpu sc = {0};
    while (1) {
        int64_t now = now_ns();
        if (ev0 < 0 && now >= t_measure) {
            cpu0 = cpu_ns_now();
            srv_cells_start(&sc);
            ev0 = atomic_load(&pe->done_events);
            t_measure = now;
            pe->ndelays = 0;
        }
        if (now >= t_end)
            break;
        if (gate_full(&pe->g, max_inflight))
            continue;
        struct pe_op *op = calloc(1, sizeof *op);
        op->pe = pe;
        /* Text arrays; the streams as for the per-run cells. */
        char *sa = op->a[0], *ta = op->a[1], *pa = op->a[2];
        unsigned picked[100];
        strcpy(sa, "{");
        strcpy(ta, "{");
        strcpy(pa, "{");
        for (int k = 0; k < c->batch; k++) {
            char one[32];
            strcat(sa, k ? "," : "");
            stream_name(one, sizeof one, k, &seed, picked);
            strcat(sa, one);
            strcat(ta, k ? ",bench" : "bench");
            strcat(pa, k ? "," : "");
            strcat(pa, pe_payload_literal);
        }
        strcat(sa, "}");
        strcat(ta, "}");
        strcat(pa, "}");
        op->vals[0] = sa;
        op->vals[1] = ta;
        op->vals[2] = pa;
        op->st = (struct pawl_pgstmt){.prepared = pe->stmt, .nparams = 3, .values = op->vals};
        op->req = (struct pawl_pgreq){.stmts = &op->st, .nstmts = 1, .on_done = pe_done, .ud = op};
        atomic_fetch_add(&pe->g.inflight, 1);
        if (pawl__pgpool_submit(pe->pool, &op->req) != 0) {
            gate_release(&pe->g);
            free(op);
        }
    }
    int64_t ev1 = atomic_load(&pe->done_events);
    int64_t t1 = now_ns();
    c->cpu_us_ev = cpu_us_per_event(cpu0, cpu_ns_now(), ev1 - ev0);
    srv_cells_stop(&sc, c, ev1 - ev0);
    while (atomic_load(&pe->g.inflight) > 0)
        usleep(1000);
    usleep(100000);
    atomic_store(&pe->stop, 1);
    if (c->finalizer)
        pthread_join(fin, NULL);
    c->ev_s = (double)(ev1 - ev0) / ((double)(t1 - t_measure) / 1e9);
    if (pe->ndelays) {
        qsort(pe->delays, pe->ndelays, sizeof(int64_t), cmp64);
        c->p50 = pe->delays[pe->ndelays / 2] / 1e6;
        c->p99 = pe->delays[(pe->ndelays * 99) / 100] / 1e6;
        c->max = pe->delays[pe->ndelays - 1] / 1e6;
        c->delay_count = (int64_t)pe->ndelays;
        for (size_t k = 0; k < pe->ndelays; k++)
            bench_hist_add(&c->delay, pe->delays[k]);
    }
    c->fin_runs_s = pe->runs / ((t1 - t0) / 1e9);
    pawl__pgpool_free(pe->pool);
    /* Clean: renumber what is left, untimed. */
    PGconn *pc = PQconnectdb(dsn);
    PQclear(PQexec(pc, "SELECT * FROM bl_renumber.finalize()"));
    PQfinish(pc);
    free(pe->delays);
    gate_fini(&pe->g);
    free(pe);
}

static void setup_baseline(void)
{
    FILE *f = fopen(PAWL_BENCH_SQL_DIR "/renumber.sql", "r");
    if (f == NULL) {
        fprintf(stderr, "cannot open renumber.sql\n");
        exit(1);
    }
    static char sql[65536];
    size_t n = fread(sql, 1, sizeof sql - 1, f);
    sql[n] = '\0';
    fclose(f);
    PGconn *c = PQconnectdb(dsn);
    PQclear(PQexec(c, "SET client_min_messages = warning"));
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        fprintf(stderr, "renumber.sql: %s", PQerrorMessage(c));
        exit(1);
    }
    PQclear(r);
    PQfinish(c);
}

int main(int argc, char **argv)
{
    const char *csv_path = NULL;
    int quick = 0, rate_only = 0;
    dsn = getenv("PAWL_DSN");
    static const struct option lo[] = {{"dsn", required_argument, 0, 'd'},
                                       {"seconds", required_argument, 0, 's'},
                                       {"rate", required_argument, 0, 'r'},
                                       {"inflight", required_argument, 0, 'i'},
                                       {"csv", required_argument, 0, 'c'},
                                       {"baseline", no_argument, 0, 'b'},
                                       {"quick", no_argument, 0, 'q'},
                                       {"min-interval-us", required_argument, 0, 'm'},
                                       {"rounds", required_argument, 0, 'R'},
                                       {"rate-batch", required_argument, 0, 'B'},
                                       {"piggyback", required_argument, 0, 'P'},
                                       {"streams", required_argument, 0, 'S'},
                                       {"rate-only", no_argument, 0, 'O'},
                                       {"stream-space", required_argument, 0, 'N'},
                                       {"latency-share", required_argument, 0, 'L'},
                                       {"busy-share", required_argument, 0, 'U'},
                                       {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "d:s:r:i:c:bqm:R:B:P:S:ON:L:U:", lo, NULL)) != -1) {
        switch (ch) {
        case 'd':
            dsn = optarg;
            break;
        case 's':
            seconds = atoi(optarg);
            break;
        case 'r':
            rate = atoi(optarg);
            break;
        case 'i':
            inflight_per_conn = atoi(optarg);
            break;
        case 'c':
            csv_path = optarg;
            break;
        case 'b':
            baseline = 1;
            break;
        case 'O':
            rate_only = 1;
            break;
        case 'q':
            quick = 1;
            break;
        case 'm':
            min_interval_us = atoi(optarg);
            break;
        case 'P':
            piggyback = atoi(optarg) ? 1 : 0;
            break;
        case 'B':
            rate_batch = atoi(optarg) >= 1 && atoi(optarg) <= 100 ? atoi(optarg) : 10;
            break;
        case 'R':
            rounds = atoi(optarg) > 0 ? atoi(optarg) : 1;
            break;
        case 'S':
            streams_per_append = atoi(optarg);
            if (streams_per_append < 0 || streams_per_append > 100) {
                fprintf(stderr, "--streams must be 0 (a random stream per event) to 100\n");
                return 2;
            }
            break;
        case 'L':
            if (int_arg("--latency-share", optarg, 0, 100, &latency_share) != 0)
                return 2;
            break;
        case 'U':
            if (int_arg("--busy-share", optarg, 0, 100, &busy_share) != 0)
                return 2;
            break;
        case 'N': {
            int v;
            if (int_arg("--stream-space", optarg, 1, 1000000000, &v) != 0)
                return 2;
            stream_space = (unsigned)v;
            break;
        }
        default:
            fprintf(stderr,
                    "usage: %s --dsn DSN [--seconds N] [--rate EV_PER_S] [--inflight N] "
                    "[--csv FILE] [--baseline] [--quick] [--rounds N] [--streams N] "
                    "[--stream-space N] [--latency-share PCT] [--rate-only]\n",
                    argv[0]);
            return 2;
        }
    }
    if (dsn == NULL) {
        fprintf(stderr, "no database: pass --dsn or set PAWL_DSN\n");
        return 2;
    }
    pawl_log_set_level(PAWL_LOG_WARN);
    prepare_server();
    char err[512];
    if (pawl_schema_migrate(dsn, err, sizeof err) != 0) {
        fprintf(stderr, "migrate: %s\n", err);
        return 1;
    }
    if (baseline) {
        setup_baseline();
        init_pe_payload();
    }

    struct cell cells[32];
    int nc = 0;
    int conns[2] = {1, 4}, batches[2] = {1, 100};
    for (int ci = 0; ci < 2 && !rate_only; ci++)
        for (int bi = 0; bi < 2; bi++) {
            if (quick && ci == 0)
                continue;
            for (int f = 0; f < 2; f++)
                cells[nc++] = (struct cell){
                    .design = "per-run", .conns = conns[ci], .batch = batches[bi], .finalizer = f};
        }
    cells[nc++] = (struct cell){
        .design = "per-run", .conns = 4, .batch = rate_batch, .finalizer = 1, .target_rate = rate};
    if (baseline && !rate_only)
        for (int ci = 0; ci < 2; ci++)
            for (int bi = 0; bi < 2; bi++) {
                if (quick && ci == 0)
                    continue;
                for (int f = 0; f < 2; f++)
                    cells[nc++] = (struct cell){.design = "per-event",
                                                .conns = conns[ci],
                                                .batch = batches[bi],
                                                .finalizer = f};
            }

    /* How the delay percentiles of a cell were formed (see the first comment). */
    char pct_how[48];
    if (rounds > 1)
        snprintf(pct_how, sizeof pct_how, "pooled over %d rounds", rounds);
    else
        snprintf(pct_how, sizeof pct_how, "one round");
    FILE *csv = csv_path ? fopen(csv_path, "w") : stdout;
    fprintf(csv, "design,connections,events_per_append,finalizer,target_rate,events_per_s,"
                 "finalize_delay_p50_ms,finalize_delay_p99_ms,finalize_delay_max_ms,"
                 "delay_samples,finalize_runs_per_s,streams_per_append,cpu_us_per_event,"
                 "reruns_per_append,finalizer_cpu_us_per_event,round_ratio_events_per_s,"
                 "round_ratio_events_per_s_lo95,round_ratio_events_per_s_hi95,round_ratio_cpu,"
                 "round_ratio_cpu_lo95,round_ratio_cpu_hi95,delay_percentiles,"
                 "server_backends_cpu_us_per_event,server_finalizer_backend_cpu_us_per_event\n");
    /*
     * The machine is shared and noisy: each off/on pair runs `rounds` times, interleaved, and
     * the figures are the means over rounds (max: the maximum). The order alternates, off, on,
     * on, off, off, on, ...: every cell appends to the same tables, which grow through the run,
     * and a cell on a bigger table is slower (bigger indexes). In a fixed off-on order the
     * finalizer's cells always ran second; with an even number of rounds both sides see the
     * same table sizes on average.
     */
    for (int i = 0; i < nc; i++) {
        int pair = i + 1 < nc && !cells[i].finalizer && cells[i + 1].finalizer &&
                   cells[i].conns == cells[i + 1].conns && cells[i].batch == cells[i + 1].batch &&
                   !cells[i + 1].target_rate && !strcmp(cells[i].design, cells[i + 1].design);
        int width = pair ? 2 : 1;
        struct cell acc[2];
        memset(acc, 0, sizeof acc);
        double *thr_r = calloc((size_t)rounds, sizeof *thr_r);
        double *cpu_r = calloc((size_t)rounds, sizeof *cpu_r);
        if (!thr_r || !cpu_r) {
            fprintf(stderr, "bench_append: out of memory\n");
            return 1;
        }
        for (int r = 0; r < rounds; r++) {
            struct cell got[2];
            for (int k = 0; k < width; k++) {
                int w = r % 2 ? width - 1 - k : k;
                struct cell one = cells[i + w];
                checkpoint();
                fprintf(stderr, "round %d/%d: %s conns=%d batch=%d finalizer=%s%s ...\n", r + 1,
                        rounds, one.design, one.conns, one.batch, one.finalizer ? "on" : "off",
                        one.target_rate ? " (rate-limited)" : "");
                if (strcmp(one.design, "per-run") == 0)
                    run_store_cell(&one);
                else
                    run_pe_cell(&one);
                acc[w].ev_s += one.ev_s / rounds;
                acc[w].cpu_us_ev += one.cpu_us_ev / rounds;
                bench_hist_merge(&acc[w].delay, &one.delay);
                acc[w].srv_us_ev += one.srv_us_ev / rounds;
                acc[w].srv_fin_us_ev += one.srv_fin_us_ev / rounds;
                acc[w].srv_known |= one.srv_known;
                acc[w].max = one.max > acc[w].max ? one.max : acc[w].max;
                acc[w].delay_count += one.delay_count;
                acc[w].fin_runs_s += one.fin_runs_s / rounds;
                acc[w].retries += one.retries / rounds;
                acc[w].fin_cpu_us_ev += one.fin_cpu_us_ev / rounds;
                got[w] = one;
                fprintf(stderr, "  %.0f events/s\n", one.ev_s);
            }
            if (pair) {
                thr_r[r] = got[0].ev_s > 0 ? got[1].ev_s / got[0].ev_s : 0;
                cpu_r[r] = got[0].cpu_us_ev > 0 ? got[1].cpu_us_ev / got[0].cpu_us_ev : 0;
                fprintf(stderr, "  this round's on/off: %.3f events/s, %.3f CPU per event\n",
                        thr_r[r], cpu_r[r]);
            }
        }
        if (pair) {
            cells[i + 1].thr_ratio = ratio_ci_of(thr_r, rounds);
            cells[i + 1].cpu_ratio = ratio_ci_of(cpu_r, rounds);
        }
        free(thr_r);
        free(cpu_r);
        for (int w = 0; w < width; w++) {
            struct cell *c = &cells[i + w];
            c->ev_s = acc[w].ev_s;
            c->cpu_us_ev = acc[w].cpu_us_ev;
            /* Percentiles of every round's delays pooled (the first comment). */
            c->p50 = bench_hist_ms(&acc[w].delay, 0.50);
            c->p99 = bench_hist_ms(&acc[w].delay, 0.99);
            c->max = acc[w].max;
            c->srv_us_ev = acc[w].srv_us_ev;
            c->srv_fin_us_ev = acc[w].srv_fin_us_ev;
            c->srv_known = acc[w].srv_known;
            c->delay_count = acc[w].delay_count;
            c->fin_runs_s = acc[w].fin_runs_s;
            c->retries = acc[w].retries;
            c->fin_cpu_us_ev = acc[w].fin_cpu_us_ev;
            fprintf(csv, "%s,%d,%d,%s,%d,%.0f,%.2f,%.2f,%.2f,%lld,%.0f,%d,%.2f,%.3f,%.2f",
                    c->design, c->conns, c->batch, c->finalizer ? "on" : "off", c->target_rate,
                    c->ev_s, c->p50, c->p99, c->max, (long long)c->delay_count, c->fin_runs_s,
                    streams_per_append ? streams_per_append : c->batch, c->cpu_us_ev, c->retries,
                    c->fin_cpu_us_ev);
            if (c->thr_ratio.n > 0)
                fprintf(csv, ",%.3f,%.3f,%.3f,%.3f,%.3f,%.3f", c->thr_ratio.mean, c->thr_ratio.lo,
                        c->thr_ratio.hi, c->cpu_ratio.mean, c->cpu_ratio.lo, c->cpu_ratio.hi);
            else
                fputs(",,,,,,", csv);
            fprintf(csv, ",%s", pct_how);
            if (c->srv_known)
                fprintf(csv, ",%.2f,%.2f\n", c->srv_us_ev, c->srv_fin_us_ev);
            else
                fputs(",,\n", csv);
            fflush(csv);
        }
        i += width - 1;
    }
    if (csv != stdout)
        fclose(csv);

    fprintf(stderr, "\n| design | conns | events/append | off ev/s | on ev/s | on/off | CPU/event "
                    "off | on | on/off | finalizer's own | backends' CPU/event off | on | of it "
                    "finalizer's | delay p50 | p99 | max |\n"
                    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    int with_ci = 0;
    for (int i = 0; i + 1 < nc; i++) {
        struct cell *off = &cells[i], *on = &cells[i + 1];
        if (off->finalizer || !on->finalizer || off->conns != on->conns ||
            off->batch != on->batch || strcmp(off->design, on->design) || on->target_rate)
            continue;
        fprintf(
            stderr,
            "| %s | %d | %d | %.0f | %.0f | %.3f | %.1f µs | %.1f µs | %.3f | %.1f µs | %.1f µs "
            "| %.1f µs | %.1f µs | %.2f ms | %.2f ms | %.2f ms |\n",
            on->design, on->conns, on->batch, off->ev_s, on->ev_s, on->ev_s / off->ev_s,
            off->cpu_us_ev, on->cpu_us_ev,
            off->cpu_us_ev > 0 ? on->cpu_us_ev / off->cpu_us_ev : 0.0, on->fin_cpu_us_ev,
            off->srv_us_ev, on->srv_us_ev, on->srv_fin_us_ev, on->p50, on->p99, on->max);
        with_ci |= on->thr_ratio.n > 1;
    }
    fprintf(stderr,
            "\nCPU/event: every process of the cluster and this one (the whole machine's share "
            "of the cell); backends' CPU/event: the cell's own backends summed (its connections' "
            "and the finalizer's; %s over the window), which other databases' work does not "
            "inflate.\ndelay p50 and p99: %s (histograms within 6.25%%); max: the largest of "
            "any round\n",
            srv_cpu_clock_name(),
            rounds > 1 ? "percentiles of every round's delays pooled" : "one round");
    /* The same pairs judged round by round: the geometric mean of each round's on/off and its
     * 95% interval (the means above are ratios of means over rounds). */
    if (with_ci) {
        fprintf(stderr, "\nper round, on/off (geometric mean [95%% interval], %d rounds):\n",
                rounds);
        for (int i = 0; i < nc; i++) {
            struct cell *on = &cells[i];
            if (on->thr_ratio.n < 2)
                continue;
            fprintf(stderr, "  %s %d x %d: events/s %.3f [%.3f, %.3f]", on->design, on->conns,
                    on->batch, on->thr_ratio.mean, on->thr_ratio.lo, on->thr_ratio.hi);
            if (on->cpu_ratio.n > 1)
                fprintf(stderr, ", CPU per event %.3f [%.3f, %.3f]", on->cpu_ratio.mean,
                        on->cpu_ratio.lo, on->cpu_ratio.hi);
            fputc('\n', stderr);
        }
    }
    for (int i = 0; i < nc; i++)
        if (cells[i].target_rate)
            fprintf(stderr,
                    "\nrate-limited %d ev/s (%d-event appends, 4 conns, finalizer on): %.0f ev/s, "
                    "delay p50 %.2f ms, p99 %.2f ms (%s), max %.2f ms\n",
                    cells[i].target_rate, cells[i].batch, cells[i].ev_s, cells[i].p50, cells[i].p99,
                    pct_how, cells[i].max);
    PQfinish(admin);
    return 0;
}
