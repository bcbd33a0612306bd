/*
 * bench_group.c — group append against the plain-INSERT ceiling, side by side in one run.
 *
 * Cells. Each round runs, next to each other: the ceiling (a plain
 * table of pawl.events' row shape and indexes, bench_ceiling.events, one INSERT per
 * transaction with a client-chosen sequence, the rows' types and payloads sent as binary
 * arrays as pawl sends its events, one blocking client per connection), pawl with
 * group append (the default), pawl without it (append_group_max 1), and pawl grouped with its
 * finalizer off. pawl's callers are blocking pawl_append calls, one thread each. In one64 and
 * ten64 a fifth variant, "async", keeps as many appends in flight from one thread with
 * pawl_append_async (grouped, finalizer on): what the appends cost without a thread per caller,
 * as an event-loop service submits them; its client CPU is the library's own. Cells of more
 * than one event per append also report "ceiling_server_rows": the same INSERT sending one
 * payload and making its rows in the server (generate_series), which no client with distinct
 * rows can do; until 2026-12-03 it was the ceiling.
 *
 *   one64    1-event appends, random streams of 100 000, 64 callers, 4 connections
 *            | ceiling: 1-row INSERT, 4 clients
 *   one1     one writer, blocking 1-event appends, 1 connection | 1-row INSERT, 1 client
 *   ten64    10-event appends (one random stream each), 64 callers, 4 connections
 *            | 10-row INSERT, 4 clients
 *   hundred  100-event appends, one stream per caller, explicit versions, 4 callers, 4
 *            connections | 100-row INSERT, 4 clients
 *   half     one64 at half of the grouped rate measured in the same round (paced callers):
 *            the append latency p99 there
 *
 * Per cell: events/s, the ratio to the ceiling, append p50/p99 (submit to acknowledged
 * commit), WAL flushes per event (pg_stat_wal.wal_sync), mean group size, and this process's
 * CPU per event and context switches per event (getrusage: the pawl library and the callers,
 * every thread, not the server; on a small VM a context switch costs several µs of CPU, so
 * at one event per append the switches are most of the CPU). Means over
 * --rounds with the min..max of the per-round ratios.
 *
 * Usage: bench_group --dsn DSN [--seconds 5] [--rounds 3] [--csv FILE] [--cells a,b,...]
 *                    [--latency-share PCT] [--min-interval-us N] [--busy-share PCT]
 *                    (the finalizer's cadence: the store options of those names)
 * DSN names a scratch database whose log is empty: every cell starts with both tables empty.
 */
#include "pawl.h"

#include "common.h"
#include "flags.h"

#include <arpa/inet.h>
#include <getopt.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static const char *dsn;
static int seconds = 5;
static int warmup_ms = 1000;
static int rounds = 3;
static int latency_share = -1;   /* --latency-share: finalizer_latency_share_pct (< 0: default) */
static int min_interval_us = -1; /* --min-interval-us: finalizer_min_interval_us (< 0: default) */
static int busy_share = -1;      /* --busy-share: finalizer_busy_share_pct (< 0: default) */

static const char PAYLOAD[] = "{\"amount\": 42, \"currency\": \"EUR\", \"note\": \"bench\"}";

static PGconn *connect_or_die(void)
{
    PGconn *c = PQconnectdb(dsn);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "connect: %s", PQerrorMessage(c));
        exit(1);
    }
    return c;
}

static void exec_or_die(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
        fprintf(stderr, "%s: %s", sql, PQerrorMessage(c));
        exit(1);
    }
    PQclear(r);
}

static double q_double(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    double v = 0;
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
        v = strtod(PQgetvalue(r, 0, 0), NULL);
    PQclear(r);
    return v;
}

static double wal_syncs(void)
{
    PGconn *c = connect_or_die();
    double v = q_double(c, "SELECT wal_sync FROM pg_stat_wal");
    PQfinish(c);
    return v;
}

/* Context switches of this process (every thread), voluntary and not. */
static long csw_self(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_nvcsw + ru.ru_nivcsw;
}

static int64_t cpu_ns_self(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ((int64_t)ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000LL +
           ((int64_t)ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000LL;
}

/*
 * Start clean: no leftovers, a checkpoint, so cells do not pay for each other's dirt. Both logs
 * start every cell empty: a pawl log that grew by millions of rows over earlier cells (or runs)
 * against a ceiling table emptied per cell would measure the table's size, not the append path
 * (an append on a 12.6-million-row log measured 0.8 ms in pgbench against 0.45 ms on an empty
 * one). Hence a scratch database (main() checks the log is empty before the first cell).
 */
static void reset_tables(void)
{
    PGconn *c = connect_or_die();
    exec_or_die(c, "CREATE SCHEMA IF NOT EXISTS bench_ceiling");
    exec_or_die(c, "CREATE TABLE IF NOT EXISTS bench_ceiling.events (LIKE pawl.events "
                   "INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)");
    /* pawl.events is partitioned: LIKE copies only the parent's (xid, k) key, and its
     * (stream_id, stream_seq) key lives on the partitions. The ceiling needs both to do the same
     * index work per row; its rows take no ticket (pawl takes one per append, not per row). */
    exec_or_die(c, "CREATE UNIQUE INDEX IF NOT EXISTS events_stream_key ON bench_ceiling.events"
                   " (stream_id, stream_seq)");
    exec_or_die(c, "ALTER TABLE bench_ceiling.events ALTER COLUMN ticket DROP DEFAULT");
    exec_or_die(c, "TRUNCATE bench_ceiling.events");
    exec_or_die(c, "CHECKPOINT");
    PQfinish(c);
}

/* Empty pawl's log (every append finalized first, see settle) before a pawl variant. */
static void reset_log(void)
{
    PGconn *c = connect_or_die();
    exec_or_die(c, "TRUNCATE pawl.events");
    exec_or_die(c, "CHECKPOINT");
    PQfinish(c);
}

/* The log must start empty: bench_group empties it between cells. */
static int log_is_empty(void)
{
    PGconn *c = connect_or_die();
    PGresult *r = PQexec(c, "SELECT EXISTS (SELECT 1 FROM pawl.events)");
    int empty = PQresultStatus(r) == PGRES_TUPLES_OK && strcmp(PQgetvalue(r, 0, 0), "f") == 0;
    PQclear(r);
    PQfinish(c);
    return empty;
}

struct cell_def {
    const char *name;
    int batch, callers, conns, explicit_v, ceil_clients;
};

static const struct cell_def CELLS[] = {
    {"one64", 1, 64, 4, 0, 4},
    {"one1", 1, 1, 1, 0, 1},
    {"ten64", 10, 64, 4, 0, 4},
    {"hundred", 100, 4, 4, 1, 4},
};
#define NCELLS (sizeof CELLS / sizeof CELLS[0])

/* ---- the ceiling: plain INSERTs ------------------------------------------------------------ */

struct ceil_arg {
    int id, batch;
    int server_rows; /* 1: one payload sent, the rows made in the server (generate_series) */
    atomic_int *stop;
    atomic_llong *events;
    atomic_int *measuring;
};

/* A one-dimensional binary array (PostgreSQL's array_send format) of n copies of v. */
static size_t binary_array(char *out, uint32_t elem_oid, int n, const char *v, size_t len)
{
    uint32_t hdr[5] = {htonl(1), htonl(0), htonl(elem_oid), htonl((uint32_t)n), htonl(1)};
    memcpy(out, hdr, sizeof hdr);
    size_t off = sizeof hdr;
    for (int i = 0; i < n; i++) {
        uint32_t l = htonl((uint32_t)len);
        memcpy(out + off, &l, 4);
        memcpy(out + off + 4, v, len);
        off += 4 + len;
    }
    return off;
}

static void *ceil_main(void *arg)
{
    struct ceil_arg *a = arg;
    PGconn *c = connect_or_die();
    /*
     * The row shape of pawl.events, a client-chosen sequence; n rows of one stream. As a client
     * inserting rows sends them, the types and payloads go as binary arrays (as pawl sends its
     * events), one element per row. The server_rows form sends one payload and makes the rows
     * in the server: less than any client with distinct rows can do, reported for reference.
     */
    PGresult *r =
        a->server_rows
            ? PQprepare(c, "ins",
                        "INSERT INTO bench_ceiling.events (xid, stream_seq, k, n, stream_id,"
                        " type, payload) SELECT pg_current_xact_id(), $1::int8 + g, g::int4,"
                        " $2::int4, $3, 'OrderPlaced', $4::bytea"
                        " FROM generate_series(0, $2::int4 - 1) g",
                        4, NULL)
            : PQprepare(c, "ins",
                        "INSERT INTO bench_ceiling.events (xid, stream_seq, k, n, stream_id,"
                        " type, payload) SELECT pg_current_xact_id(), $1::int8 + u.o - 1,"
                        " (u.o - 1)::int4, $2::int4, $3, u.t, u.p"
                        " FROM unnest($4::text[], $5::bytea[]) WITH ORDINALITY AS u(t, p, o)",
                        5, NULL);
    PQclear(r);
    static const char TYPE[] = "OrderPlaced";
    size_t cap = 20 + (size_t)a->batch * (4 + sizeof PAYLOAD);
    char *types = malloc(cap), *payloads = malloc(cap);
    int types_len = (int)binary_array(types, 25, a->batch, TYPE, sizeof TYPE - 1);
    int payloads_len = (int)binary_array(payloads, 17, a->batch, PAYLOAD, sizeof PAYLOAD - 1);
    char sid[48], seq[24], n[16];
    snprintf(n, sizeof n, "%d", a->batch);
    int64_t next = 1;
    unsigned streams = 0;
    snprintf(sid, sizeof sid, "ceil-%d-%u-%ld", a->id, streams++, (long)time(NULL));
    while (!atomic_load(a->stop)) {
        if (a->batch == 1 || next > 100000) {
            /* One-event rows spread over many streams, as pawl's random ones. */
            snprintf(sid, sizeof sid, "ceil-%d-%u-%ld", a->id, streams++, (long)time(NULL));
            next = 1;
        }
        snprintf(seq, sizeof seq, "%lld", (long long)next);
        if (a->server_rows) {
            const char *vals[4] = {seq, n, sid, PAYLOAD};
            r = PQexecPrepared(c, "ins", 4, vals, NULL, NULL, 0);
        } else {
            const char *vals[5] = {seq, n, sid, types, payloads};
            int lens[5] = {0, 0, 0, types_len, payloads_len};
            int fmts[5] = {0, 0, 0, 1, 1};
            r = PQexecPrepared(c, "ins", 5, vals, lens, fmts, 0);
        }
        if (PQresultStatus(r) != PGRES_COMMAND_OK) {
            fprintf(stderr, "ceiling insert: %s", PQerrorMessage(c));
            exit(1);
        }
        PQclear(r);
        next += a->batch;
        if (atomic_load(a->measuring))
            atomic_fetch_add(a->events, a->batch);
    }
    free(types);
    free(payloads);
    PQfinish(c);
    return NULL;
}

struct result {
    double ev_s, p50, p99, flushes_ev, group_size, cpu_us_ev, csw_ev;
    double runs_s, run_ms; /* the finalizer's runs per second and their mean wall time */
};

static void run_ceiling(const struct cell_def *d, int server_rows, struct result *res)
{
    atomic_int stop = 0, measuring = 0;
    atomic_llong events = 0;
    pthread_t th[64];
    struct ceil_arg args[64];
    for (int i = 0; i < d->ceil_clients; i++) {
        args[i] = (struct ceil_arg){i, d->batch, server_rows, &stop, &events, &measuring};
        pthread_create(&th[i], NULL, ceil_main, &args[i]);
    }
    usleep((useconds_t)warmup_ms * 1000);
    double w0 = wal_syncs();
    int64_t t0 = pawl_now_ns();
    atomic_store(&measuring, 1);
    usleep((useconds_t)seconds * 1000000);
    atomic_store(&measuring, 0);
    int64_t t1 = pawl_now_ns();
    double w1 = wal_syncs();
    atomic_store(&stop, 1);
    for (int i = 0; i < d->ceil_clients; i++)
        pthread_join(th[i], NULL);
    memset(res, 0, sizeof *res);
    double ev = (double)atomic_load(&events);
    res->ev_s = ev / ((double)(t1 - t0) / 1e9);
    res->flushes_ev = ev > 0 ? (w1 - w0) / ev : 0;
}

/* ---- pawl ------------------------------------------------------------------------------------ */

struct caller_arg {
    struct pawl_store *s;
    int id, batch, explicit_v;
    int64_t pace_ns; /* 0: closed loop */
    atomic_int *stop;
    atomic_llong *events;
    atomic_llong *errors;
    atomic_int *measuring;
};

static void *caller_main(void *arg)
{
    struct caller_arg *a = arg;
    unsigned seed = 2654435761u * (unsigned)(a->id + 1);
    struct pawl_event ev[100];
    char sid[48];
    int64_t seq = 0;
    snprintf(sid, sizeof sid, "grp-%d-%ld-%d", a->id, (long)time(NULL), rand_r(&seed));
    int64_t next = pawl_now_ns();
    while (!atomic_load(a->stop)) {
        if (a->pace_ns) {
            int64_t now = pawl_now_ns();
            if (now < next) {
                struct timespec ts = {0, (long)(next - now)};
                nanosleep(&ts, NULL);
            }
            next += a->pace_ns;
        }
        if (!a->explicit_v)
            snprintf(sid, sizeof sid, "s-%u", (unsigned)rand_r(&seed) % 100000u);
        for (int k = 0; k < a->batch; k++)
            ev[k] = (struct pawl_event){.stream_id = sid,
                                        .type = "OrderPlaced",
                                        .payload = PAYLOAD,
                                        .payload_len = sizeof PAYLOAD - 1,
                                        .stream_seq = a->explicit_v ? seq + 1 + k : 0};
        struct pawl_append_result r;
        int rc = pawl_append(a->s, ev, (size_t)a->batch, &r);
        if (rc == 0) {
            seq += a->batch;
            if (atomic_load(a->measuring))
                atomic_fetch_add(a->events, a->batch);
        } else {
            atomic_fetch_add(a->errors, 1);
            if (a->explicit_v && rc == PAWL_ECONFLICT)
                seq = -1; /* cannot happen: one caller per stream */
        }
    }
    return NULL;
}

/* The async variant: one thread keeps up to `window` appends in flight. */
struct async_arg {
    struct pawl_store *s;
    int batch, window;
    atomic_int *stop;
    atomic_llong *events;
    atomic_llong *errors;
    atomic_int *measuring;
    atomic_int inflight;
    atomic_int waiting;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void async_done(void *ud, const struct pawl_append_result *res)
{
    struct async_arg *a = ud;
    if (res->rc == 0) {
        if (atomic_load(a->measuring))
            atomic_fetch_add(a->events, a->batch);
    } else {
        atomic_fetch_add(a->errors, 1);
    }
    /* The submitter, once the window is full, waits for a quarter of it to free up (one
     * wake-up per few groups rather than one per append). */
    if (atomic_fetch_sub(&a->inflight, 1) - 1 == a->window * 3 / 4 && atomic_load(&a->waiting)) {
        pthread_mutex_lock(&a->mu);
        pthread_cond_signal(&a->cv);
        pthread_mutex_unlock(&a->mu);
    }
}

static void *async_main(void *arg)
{
    struct async_arg *a = arg;
    unsigned seed = 40503u;
    struct pawl_event ev[100];
    char sid[48];
    while (!atomic_load(a->stop)) {
        if (atomic_load(&a->inflight) >= a->window) {
            pthread_mutex_lock(&a->mu);
            atomic_store(&a->waiting, 1);
            while (atomic_load(&a->inflight) > a->window * 3 / 4 && !atomic_load(a->stop))
                pthread_cond_wait(&a->cv, &a->mu);
            atomic_store(&a->waiting, 0);
            pthread_mutex_unlock(&a->mu);
            continue;
        }
        snprintf(sid, sizeof sid, "s-%u", (unsigned)rand_r(&seed) % 100000u);
        for (int k = 0; k < a->batch; k++)
            ev[k] = (struct pawl_event){.stream_id = sid,
                                        .type = "OrderPlaced",
                                        .payload = PAYLOAD,
                                        .payload_len = sizeof PAYLOAD - 1};
        atomic_fetch_add(&a->inflight, 1);
        int rc = pawl_append_async(a->s, ev, (size_t)a->batch, async_done, a);
        if (rc != 0) {
            atomic_fetch_sub(&a->inflight, 1);
            atomic_fetch_add(a->errors, 1);
            usleep(1000);
        }
    }
    pawl_store_drain(a->s);
    return NULL;
}

static void run_pawl(const struct cell_def *d, int group_max, int finalizer, double rate, int async,
                     struct result *res)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.connections = d->conns;
    o.finalizer = finalizer;
    o.listen = 0;
    o.append_group_max = group_max;
    if (latency_share >= 0)
        o.finalizer_latency_share_pct = latency_share;
    if (min_interval_us >= 0)
        o.finalizer_min_interval_us = min_interval_us;
    if (busy_share >= 0)
        o.finalizer_busy_share_pct = busy_share;
    struct pawl_store *s = NULL;
    char err[512];
    if (pawl_store_new(&s, dsn, &o, err, sizeof err) != 0) {
        fprintf(stderr, "store: %s\n", err);
        exit(1);
    }
    atomic_int stop = 0, measuring = 0;
    atomic_llong events = 0, errors = 0;
    pthread_t th[64];
    struct caller_arg args[64];
    struct async_arg aa = {.s = s,
                           .batch = d->batch,
                           .window = d->callers,
                           .stop = &stop,
                           .events = &events,
                           .errors = &errors,
                           .measuring = &measuring};
    int nthreads = async ? 1 : d->callers;
    int64_t pace = rate > 0 ? (int64_t)(1e9 * d->callers * d->batch / rate) : 0;
    pthread_mutex_init(&aa.mu, NULL);
    pthread_cond_init(&aa.cv, NULL);
    if (async) {
        pthread_create(&th[0], NULL, async_main, &aa);
    } else {
        for (int i = 0; i < nthreads; i++) {
            args[i] = (struct caller_arg){s,     i,       d->batch, d->explicit_v, pace,
                                          &stop, &events, &errors,  &measuring};
            pthread_create(&th[i], NULL, caller_main, &args[i]);
        }
    }
    usleep((useconds_t)warmup_ms * 1000);
    struct pawl_log_stats st0, st1;
    pawl_store_stats(s, &st0, 1);
    double w0 = wal_syncs();
    long x0 = csw_self();
    int64_t c0 = cpu_ns_self();
    int64_t t0 = pawl_now_ns();
    atomic_store(&measuring, 1);
    usleep((useconds_t)seconds * 1000000);
    atomic_store(&measuring, 0);
    int64_t t1 = pawl_now_ns();
    int64_t c1 = cpu_ns_self();
    long x1 = csw_self();
    double w1 = wal_syncs();
    pawl_store_stats(s, &st1, 0);
    atomic_store(&stop, 1);
    pthread_mutex_lock(&aa.mu);
    pthread_cond_broadcast(&aa.cv); /* a waiting async submitter sees stop */
    pthread_mutex_unlock(&aa.mu);
    for (int i = 0; i < nthreads; i++)
        pthread_join(th[i], NULL);
    pawl_store_free(s);
    pthread_mutex_destroy(&aa.mu);
    pthread_cond_destroy(&aa.cv);
    memset(res, 0, sizeof *res);
    double ev = (double)atomic_load(&events);
    res->ev_s = ev / ((double)(t1 - t0) / 1e9);
    res->p50 = st1.append_p50_ms;
    res->p99 = st1.append_p99_ms;
    res->flushes_ev = ev > 0 ? (w1 - w0) / ev : 0;
    double g = (double)(st1.append_groups - st0.append_groups);
    res->group_size =
        g > 0 ? (double)(st1.append_groups_appends - st0.append_groups_appends) / g : 1.0;
    res->cpu_us_ev = ev > 0 ? (double)(c1 - c0) / 1000.0 / ev : 0;
    res->csw_ev = ev > 0 ? (double)(x1 - x0) / ev : 0;
    res->runs_s = (double)(st1.finalize_runs - st0.finalize_runs) / ((double)(t1 - t0) / 1e9);
    res->run_ms = st1.finalizer_run_avg_ms;
    if (atomic_load(&errors))
        fprintf(stderr, "  (%lld append errors)\n", (long long)atomic_load(&errors));
}

/* Finalize what the cell appended (untimed), so the next one starts clean. */
static void settle(void)
{
    struct pawl_store *s = NULL;
    char err[256];
    if (pawl_store_new(&s, dsn, NULL, err, sizeof err) != 0)
        return;
    int64_t a = 1;
    while (a != 0 && pawl_finalize_now(s, &a, NULL, NULL) == 0)
        ;
    pawl_store_free(s);
}

static FILE *csv;

static void report(int round, const char *cell, const char *variant, const struct result *r,
                   double ceiling)
{
    double ratio = ceiling > 0 ? r->ev_s / ceiling : 0;
    fprintf(stderr,
            "  %-8s %-14s %9.0f ev/s  %5.2fx ceiling  p50 %6.2f ms p99 %6.2f ms  %.3f flushes/ev"
            "  group %.1f  client CPU %.2f us/ev  %.2f csw/ev  runs %.0f/s of %.2f ms\n",
            cell, variant, r->ev_s, ratio, r->p50, r->p99, r->flushes_ev, r->group_size,
            r->cpu_us_ev, r->csw_ev, r->runs_s, r->run_ms);
    fprintf(csv, "%d,%s,%s,%.1f,%.4f,%.3f,%.3f,%.4f,%.2f,%.3f,%.2f\n", round, cell, variant,
            r->ev_s, ratio, r->p50, r->p99, r->flushes_ev, r->group_size, r->cpu_us_ev, r->csw_ev);
    fflush(csv);
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"dsn", required_argument, 0, 'd'},
                                       {"seconds", required_argument, 0, 's'},
                                       {"rounds", required_argument, 0, 'R'},
                                       {"csv", required_argument, 0, 'c'},
                                       {"cells", required_argument, 0, 'C'},
                                       {"latency-share", required_argument, 0, 'L'},
                                       {"min-interval-us", required_argument, 0, 'I'},
                                       {"busy-share", required_argument, 0, 'B'},
                                       {0, 0, 0, 0}};
    const char *csv_path = NULL, *cells = "one64,one1,ten64,hundred,half";
    int ch;
    while ((ch = getopt_long(argc, argv, "d:s:R:c:C:L:I:B:", lo, NULL)) != -1) {
        switch (ch) {
        case 'd':
            dsn = optarg;
            break;
        case 's':
            seconds = atoi(optarg);
            break;
        case 'R':
            rounds = atoi(optarg);
            break;
        case 'c':
            csv_path = optarg;
            break;
        case 'C':
            cells = optarg;
            break;
        case 'L':
            if (int_arg("--latency-share", optarg, 0, 100, &latency_share) != 0)
                return 2;
            break;
        case 'I':
            if (int_arg("--min-interval-us", optarg, 0, 1000000, &min_interval_us) != 0)
                return 2;
            break;
        case 'B':
            if (int_arg("--busy-share", optarg, 0, 100, &busy_share) != 0)
                return 2;
            break;
        default:
            fprintf(stderr, "usage: bench_group --dsn DSN [--seconds 5] [--rounds 3] [--csv FILE] "
                            "[--cells one64,one1,ten64,hundred,half] [--latency-share PCT] "
                            "[--min-interval-us N] [--busy-share PCT]\n");
            return 2;
        }
    }
    if (dsn == NULL)
        dsn = getenv("PAWL_DSN");
    if (dsn == NULL || seconds < 1 || rounds < 1) {
        fprintf(stderr, "bench_group: --dsn (or PAWL_DSN), --seconds >= 1, --rounds >= 1\n");
        return 2;
    }
    csv = csv_path ? fopen(csv_path, "w") : stdout;
    if (csv == NULL) {
        perror(csv_path);
        return 1;
    }
    char err[256];
    if (pawl_schema_migrate(dsn, err, sizeof err) != 0) {
        fprintf(stderr, "migrate: %s\n", err);
        return 1;
    }
    if (!log_is_empty()) {
        fprintf(stderr, "bench_group: the log is not empty; use a scratch database (the benchmark "
                        "empties pawl.events between cells)\n");
        return 1;
    }
    fprintf(csv, "round,cell,variant,events_per_s,ratio_to_ceiling,append_p50_ms,append_p99_ms,"
                 "wal_flushes_per_event,mean_group_size,client_cpu_us_per_event,"
                 "context_switches_per_event\n");
    for (int round = 1; round <= rounds; round++) {
        fprintf(stderr, "round %d\n", round);
        double one64_grouped = 0, one64_ceiling = 0;
        for (size_t i = 0; i < NCELLS; i++) {
            const struct cell_def *d = &CELLS[i];
            if (strstr(cells, d->name) == NULL && !(i == 0 && strstr(cells, "half")))
                continue;
            struct result ceil, r;
            reset_tables();
            run_ceiling(d, 0, &ceil);
            report(round, d->name, "ceiling", &ceil, ceil.ev_s);
            if (d->batch > 1) {
                reset_tables();
                run_ceiling(d, 1, &r);
                report(round, d->name, "ceiling_server_rows", &r, ceil.ev_s);
            }
            settle();
            reset_log();
            run_pawl(d, 256, 1, 0, 0, &r);
            report(round, d->name, "grouped", &r, ceil.ev_s);
            if (i == 0) {
                one64_grouped = r.ev_s;
                one64_ceiling = ceil.ev_s;
            }
            settle();
            reset_log();
            run_pawl(d, 1, 1, 0, 0, &r);
            report(round, d->name, "ungrouped", &r, ceil.ev_s);
            settle();
            reset_log();
            run_pawl(d, 256, 0, 0, 0, &r);
            report(round, d->name, "grouped_fin_off", &r, ceil.ev_s);
            settle();
            if (d->callers > 1 && d->batch < 100) {
                reset_log();
                run_pawl(d, 256, 1, 0, 1, &r);
                report(round, d->name, "async", &r, ceil.ev_s);
                settle();
            }
        }
        if (strstr(cells, "half") && one64_grouped > 0) {
            struct result r;
            reset_log();
            run_pawl(&CELLS[0], 256, 1, one64_grouped / 2, 0, &r);
            report(round, "half", "grouped", &r, one64_ceiling);
            settle();
        }
    }
    if (csv != stdout)
        fclose(csv);
    return 0;
}
