/*
 * bench_group.c — group append beside plain-INSERT baselines (and, at one writer, message-db's
 * write_message), side by side in one run.
 *
 * Cells. Each round runs, next to each other: the cell's INSERT baselines (a plain table of
 * pawl.events' row shape and indexes, bench_ceiling.events, one INSERT of one append's rows per
 * transaction with a client-chosen sequence, the rows' types and payloads sent as binary arrays
 * as pawl sends its events, one blocking client per connection), at one writer message-db's
 * write_message, then pawl with group append (the default), pawl without it (append_group_max
 * 1), and pawl grouped with its finalizer off. pawl's callers are blocking pawl_append calls,
 * one thread each. In one64 and ten64 a fifth variant, "async", keeps as many appends in flight
 * from one thread with pawl_append_async (grouped, finalizer on): what the appends cost without
 * a thread per caller, as an event-loop service submits them; its client CPU is the library's
 * own. Cells of more than one event per append also report "insert_server_rows_4clients": the
 * same INSERT sending one payload and making its rows in the server (generate_series), which no
 * client with distinct rows can do; it is not one of the baselines the ratios are taken against.
 *
 *   one64    1-event appends, random streams of 100 000, 64 callers, 4 connections
 *            | 1-row INSERT, 4 clients and 64 clients
 *   one1     one writer, blocking 1-event appends, 1 connection | 1-row INSERT, 1 client;
 *            message-db's write_message, 1 client
 *   ten64    10-event appends (one random stream each), 64 callers, 4 connections
 *            | 10-row INSERT, 4 clients and 64 clients
 *   hundred  100-event appends, one stream per caller, explicit versions, 4 callers, 4
 *            connections | 100-row INSERT, 4 clients
 *   half     one64 at half of the grouped rate measured in the same round (paced callers):
 *            the append latency p99 there
 *
 * No baseline is called a ceiling: 4 INSERT clients against 64 pawl callers is not the same
 * concurrency, and 64 INSERT clients are not faster on a small machine. Every ratio is taken
 * against the better (more events/s) of the cell's INSERT baselines in the same round.
 *
 * Per variant: events/s, the ratio to the better INSERT (and at one writer to write_message),
 * append p50/p99, WAL flushes per event (pg_stat_wal.wal_sync), mean group size, this process's
 * CPU and context switches per event (getrusage: the pawl library and the callers, every thread;
 * on a small VM a context switch costs several µs of CPU, so at one event per append the
 * switches are most of it), and the server's CPU per event: the sum over the variant's backends
 * (every connection it opened; pawl's pool and its finalizer's) of each backend's task clock
 * across the measured window (server_cpu.h says how), with the finalizer backend's share apart.
 * Latency: blocking calls are timed by the caller around the call (pawl and baselines alike);
 * the async variant's come from the library's append-latency histogram (submit to acknowledged
 * commit). Rows per round, then a summary: means over --rounds with the min..max of the
 * per-round ratios, and p50/p99 of every round's samples pooled.
 *
 * Usage: bench_group --dsn DSN [--seconds 5] [--rounds 3] [--csv FILE] [--cells a,b,...]
 *                    [--latency-share PCT] [--min-interval-us N] [--busy-share PCT]
 *                    [--piggyback 0|1] [--own-thread-variant] [--loop-variant]
 *                    [--messagedb DSN|none]
 * (--latency-share, --min-interval-us, --busy-share: the finalizer's cadence, the store options
 * of those names; --piggyback: append_finalizes; --own-thread-variant: every cell also runs
 * "grouped_own_thread", grouped with the finalizer on an I/O thread of its own
 * (finalizer_own_thread) rather than on the log connections' loop; --loop-variant: every cell
 * also runs "grouped_via_loop", grouped with append_direct off (a blocking append alone goes
 * through the log connections' I/O thread, not the caller's own connection); --messagedb: where
 * message-db's schema is, default the --dsn server's database pawl_peer_messagedb as
 * bench/peers/setup.sh installs it; when that has no write_message, the variant is left out with a
 * note.) DSN names a scratch database whose log is empty: every cell starts with the tables empty.
 */
#include "pawl.h"
#include "pawl/metrics.h"

#include "common.h"
#include "flags.h"
#include "server_cpu.h"

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
static const char *messagedb; /* --messagedb: NULL = the default database, "none" = off */
static int seconds = 5;
static int warmup_ms = 1000;
static int rounds = 3;
static int latency_share = -1;   /* --latency-share: finalizer_latency_share_pct (< 0: default) */
static int min_interval_us = -1; /* --min-interval-us: finalizer_min_interval_us (< 0: default) */
static int busy_share = -1;      /* --busy-share: finalizer_busy_share_pct (< 0: default) */
static int piggyback = -1;       /* --piggyback: append_finalizes (< 0: default) */
static int own_thread_variant;   /* --own-thread-variant: also grouped_own_thread */
static int own_thread_now;       /* the variant running sets finalizer_own_thread */
static int loop_variant;         /* --loop-variant: also grouped_via_loop */
static int no_direct_now;        /* the variant running sets append_direct = 0 */

static const char PAYLOAD[] = "{\"amount\": 42, \"currency\": \"EUR\", \"note\": \"bench\"}";
static const char MESSAGEDB_DB[] = "pawl_peer_messagedb";

/* The run's own connection to the scratch database: WAL counters, resets, finding backends. */
static PGconn *admin;

static PGconn *connect_or_die(void)
{
    PGconn *c = PQconnectdb(dsn);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "connect: %s", PQerrorMessage(c));
        exit(1);
    }
    return c;
}

/* message-db's database: --messagedb, or the --dsn server with dbname pawl_peer_messagedb. */
static PGconn *connect_messagedb(void)
{
    if (messagedb != NULL)
        return PQconnectdb(messagedb);
    const char *keys[] = {"dbname", "dbname", NULL};
    const char *vals[] = {dsn, MESSAGEDB_DB, NULL};
    return PQconnectdbParams(keys, vals, 1); /* the second dbname overrides the DSN's */
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
    return q_double(admin, "SELECT wal_sync FROM pg_stat_wal");
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
 * against an INSERT table emptied per cell would measure the table's size, not the append path
 * (an append on a 12.6-million-row log measured 0.8 ms in pgbench against 0.45 ms on an empty
 * one). Hence a scratch database (main() checks the log is empty before the first cell).
 */
static void reset_tables(void)
{
    exec_or_die(admin, "CREATE SCHEMA IF NOT EXISTS bench_ceiling");
    exec_or_die(admin, "CREATE TABLE IF NOT EXISTS bench_ceiling.events (LIKE pawl.events "
                       "INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)");
    /* pawl.events is partitioned: LIKE copies only the parent's (xid, k) key, and its
     * (stream_id, stream_seq) key lives on the partitions. The baseline needs both to do the
     * same index work per row; its rows take no ticket (pawl takes one per append, not per
     * row). */
    exec_or_die(admin, "CREATE UNIQUE INDEX IF NOT EXISTS events_stream_key ON"
                       " bench_ceiling.events (stream_id, stream_seq)");
    exec_or_die(admin, "ALTER TABLE bench_ceiling.events ALTER COLUMN ticket DROP DEFAULT");
    exec_or_die(admin, "TRUNCATE bench_ceiling.events");
    exec_or_die(admin, "CHECKPOINT");
}

/* Empty pawl's log (every append finalized first, see settle) before a pawl variant. */
static void reset_log(void)
{
    exec_or_die(admin, "TRUNCATE pawl.events");
    exec_or_die(admin, "CHECKPOINT");
}

/* The log must start empty: bench_group empties it between cells. */
static int log_is_empty(void)
{
    PGresult *r = PQexec(admin, "SELECT EXISTS (SELECT 1 FROM pawl.events)");
    int empty = PQresultStatus(r) == PGRES_TUPLES_OK && strcmp(PQgetvalue(r, 0, 0), "f") == 0;
    PQclear(r);
    return empty;
}

/*
 * Whether message-db is installed where --messagedb points, and if so empty its store; as the
 * DSN's own user (TRUNCATE needs the table's owner or a superuser). 0: ready; -1: not usable,
 * with the reason in why.
 */
static int messagedb_reset(char *why, size_t len)
{
    PGconn *c = connect_messagedb();
    int rc = -1;
    if (PQstatus(c) != CONNECTION_OK) {
        snprintf(why, len, "%s", PQerrorMessage(c));
        goto out;
    }
    PGresult *r = PQexec(c, "SELECT to_regproc('message_store.write_message') IS NOT NULL");
    int there = PQresultStatus(r) == PGRES_TUPLES_OK && PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    if (!there) {
        snprintf(why, len, "no message_store.write_message in database %s",
                 PQdb(c) ? PQdb(c) : "?");
        goto out;
    }
    r = PQexec(c, "TRUNCATE message_store.messages RESTART IDENTITY");
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        snprintf(why, len, "%s", PQerrorMessage(c));
    else
        rc = 0;
    PQclear(r);
    if (rc == 0)
        exec_or_die(admin, "CHECKPOINT");
out:
    PQfinish(c);
    return rc;
}

struct cell_def {
    const char *name;
    int batch, callers, conns, explicit_v;
    int insert_clients[2]; /* the INSERT baselines' client counts (0: none) */
    int write_message;     /* 1: message-db's write_message beside it, one client */
};

static const struct cell_def CELLS[] = {
    {"one64", 1, 64, 4, 0, {4, 64}, 0},
    {"one1", 1, 1, 1, 0, {1, 0}, 1},
    {"ten64", 10, 64, 4, 0, {4, 64}, 0},
    {"hundred", 100, 4, 4, 1, {4, 0}, 0},
};
#define NCELLS (sizeof CELLS / sizeof CELLS[0])
#define MAX_CLIENTS 64

/* What one variant measured in one round. */
struct result {
    int pawl;          /* 1: a pawl variant (group size and the finalizer's runs apply) */
    double secs, ev_s; /* the measured window, and events per second over it */
    double flushes_ev, group_size, cpu_us_ev, csw_ev;
    double runs_s, run_ms; /* the finalizer's runs per second and their mean wall time */
    struct srv_cpu_result srv;
    double srv_us_ev, fin_us_ev;  /* server CPU per event, and of it the finalizer backend's */
    struct pawl_metrics_hist lat; /* append latency samples of the window */
};

/* ---- the measured window, shared by every variant ------------------------------------------ */

/*
 * Measure one variant for --seconds: the WAL counter, this process's CPU and switches, and the
 * server CPU of the backends in sc, read around the window in which *measuring is raised (the
 * clients count events and latencies only then).
 */
static void measure(struct srv_cpu *sc, atomic_int *measuring, const atomic_llong *events,
                    struct result *res)
{
    double w0 = wal_syncs();
    long x0 = csw_self();
    int64_t c0 = cpu_ns_self();
    srv_cpu_start(sc);
    int64_t t0 = pawl_now_ns();
    atomic_store(measuring, 1);
    usleep((useconds_t)seconds * 1000000);
    atomic_store(measuring, 0);
    int64_t t1 = pawl_now_ns();
    srv_cpu_stop(sc, &res->srv);
    int64_t c1 = cpu_ns_self();
    long x1 = csw_self();
    double w1 = wal_syncs();
    double ev = (double)atomic_load(events);
    res->secs = (double)(t1 - t0) / 1e9;
    res->ev_s = ev / res->secs;
    res->flushes_ev = ev > 0 ? (w1 - w0) / ev : 0;
    res->cpu_us_ev = ev > 0 ? (double)(c1 - c0) / 1000.0 / ev : 0;
    res->csw_ev = ev > 0 ? (double)(x1 - x0) / ev : 0;
    res->srv_us_ev = ev > 0 ? (double)res->srv.ns / 1000.0 / ev : 0;
    res->fin_us_ev = ev > 0 ? (double)res->srv.fin_ns / 1000.0 / ev : 0;
}

/* ---- the baselines: plain INSERTs, message-db's write_message -------------------------------- */

enum base_kind { B_INSERT, B_INSERT_SERVER_ROWS, B_WRITE_MESSAGE };

struct base_arg {
    int id, batch;
    enum base_kind kind;
    atomic_int *stop, *measuring, *ready;
    atomic_llong *events;
    pid_t backend;                /* written before *ready is raised */
    struct pawl_metrics_hist lat; /* this client's latencies while measuring */
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

static void prepare_or_die(PGconn *c, const char *sql, int nparams)
{
    PGresult *r = PQprepare(c, "ins", sql, nparams, NULL);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        fprintf(stderr, "prepare: %s", PQerrorMessage(c));
        exit(1);
    }
    PQclear(r);
}

static void *base_main(void *arg)
{
    struct base_arg *a = arg;
    PGconn *c = a->kind == B_WRITE_MESSAGE ? connect_messagedb() : connect_or_die();
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "connect: %s", PQerrorMessage(c));
        exit(1);
    }
    /*
     * INSERT: the row shape of pawl.events, a client-chosen sequence; n rows of one stream. As a
     * client inserting rows sends them, the types and payloads go as binary arrays (as pawl
     * sends its events), one element per row. The server-rows form sends one payload and makes
     * the rows in the server: less than any client with distinct rows can do.
     * write_message: message-db's own call, as its clients make it (the function's body names
     * its tables and helpers unqualified: message_store must be on the search path).
     */
    if (a->kind == B_WRITE_MESSAGE) {
        exec_or_die(c, "SET search_path = message_store, public");
        prepare_or_die(c, "SELECT message_store.write_message($1, $2, $3, $4::jsonb)", 4);
    } else if (a->kind == B_INSERT_SERVER_ROWS) {
        prepare_or_die(c,
                       "INSERT INTO bench_ceiling.events (xid, stream_seq, k, n, stream_id,"
                       " type, payload) SELECT pg_current_xact_id(), $1::int8 + g, g::int4,"
                       " $2::int4, $3, 'OrderPlaced', $4::bytea"
                       " FROM generate_series(0, $2::int4 - 1) g",
                       4);
    } else {
        prepare_or_die(c,
                       "INSERT INTO bench_ceiling.events (xid, stream_seq, k, n, stream_id,"
                       " type, payload) SELECT pg_current_xact_id(), $1::int8 + u.o - 1,"
                       " (u.o - 1)::int4, $2::int4, $3, u.t, u.p"
                       " FROM unnest($4::text[], $5::bytea[]) WITH ORDINALITY AS u(t, p, o)",
                       5);
    }
    a->backend = PQbackendPID(c);
    atomic_fetch_add(a->ready, 1); /* seq_cst: backend is written before main reads it */
    static const char TYPE[] = "OrderPlaced";
    size_t cap = 20 + (size_t)a->batch * (4 + sizeof PAYLOAD);
    char *types = malloc(cap), *payloads = malloc(cap);
    int types_len = (int)binary_array(types, 25, a->batch, TYPE, sizeof TYPE - 1);
    int payloads_len = (int)binary_array(payloads, 17, a->batch, PAYLOAD, sizeof PAYLOAD - 1);
    char sid[48], seq[24], n[16], uuid[40];
    snprintf(n, sizeof n, "%d", a->batch);
    int64_t next = 1;
    unsigned streams = 0, seed = 2654435761u * (unsigned)(a->id + 1);
    /* message ids: unique within the run (the store is emptied before each variant). */
    unsigned long long id_hi = ((unsigned long long)time(NULL) << 16) ^ (unsigned)getpid(),
                       id_n = 0;
    snprintf(sid, sizeof sid, "ceil-%d-%u-%ld", a->id, streams++, (long)time(NULL));
    while (!atomic_load(a->stop)) {
        PGresult *r;
        int64_t t0;
        if (a->kind == B_WRITE_MESSAGE) {
            /* One category (bench), random streams of 100 000, as pawl's one1 callers. */
            unsigned long long lo = ++id_n;
            snprintf(uuid, sizeof uuid, "%08llx-%04llx-4%03llx-8%03llx-%012llx",
                     (id_hi >> 32) & 0xffffffffULL, (id_hi >> 16) & 0xffffULL, id_hi & 0xfffULL,
                     (lo >> 48) & 0xfffULL, lo & 0xffffffffffffULL);
            snprintf(sid, sizeof sid, "bench-%u", (unsigned)rand_r(&seed) % 100000u);
            const char *vals[4] = {uuid, sid, TYPE, PAYLOAD};
            t0 = pawl_now_ns();
            r = PQexecPrepared(c, "ins", 4, vals, NULL, NULL, 0);
        } else {
            if (a->batch == 1 || next > 100000) {
                /* One-event rows spread over many streams, as pawl's random ones. */
                snprintf(sid, sizeof sid, "ceil-%d-%u-%ld", a->id, streams++, (long)time(NULL));
                next = 1;
            }
            snprintf(seq, sizeof seq, "%lld", (long long)next);
            const char *vals[5] = {seq, n, sid, types, payloads};
            int lens[5] = {0, 0, 0, types_len, payloads_len};
            int fmts[5] = {0, 0, 0, 1, 1};
            t0 = pawl_now_ns();
            if (a->kind == B_INSERT_SERVER_ROWS) {
                vals[3] = PAYLOAD; /* $4: the one payload, as text */
                r = PQexecPrepared(c, "ins", 4, vals, NULL, NULL, 0);
            } else {
                r = PQexecPrepared(c, "ins", 5, vals, lens, fmts, 0);
            }
        }
        int64_t t1 = pawl_now_ns();
        if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
            fprintf(stderr, "%s: %s", a->kind == B_WRITE_MESSAGE ? "write_message" : "insert",
                    PQerrorMessage(c));
            exit(1);
        }
        PQclear(r);
        next += a->batch;
        if (atomic_load(a->measuring)) {
            atomic_fetch_add(a->events, a->batch);
            bench_hist_add(&a->lat, t1 - t0);
        }
    }
    free(types);
    free(payloads);
    PQfinish(c);
    return NULL;
}

static void run_base(const struct cell_def *d, enum base_kind kind, int clients, struct result *res)
{
    atomic_int stop = 0, measuring = 0, ready = 0;
    atomic_llong events = 0;
    pthread_t th[MAX_CLIENTS];
    struct base_arg *args = calloc((size_t)clients, sizeof *args);
    if (args == NULL) {
        fprintf(stderr, "bench_group: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < clients; i++) {
        args[i] = (struct base_arg){.id = i,
                                    .batch = d->batch,
                                    .kind = kind,
                                    .stop = &stop,
                                    .measuring = &measuring,
                                    .ready = &ready,
                                    .events = &events};
        pthread_create(&th[i], NULL, base_main, &args[i]);
    }
    while (atomic_load(&ready) < clients) /* every client connected: its backend is known */
        usleep(1000);
    usleep((useconds_t)warmup_ms * 1000);
    struct srv_cpu sc = {0};
    for (int i = 0; i < clients; i++)
        srv_cpu_add(&sc, args[i].backend, 0);
    memset(res, 0, sizeof *res);
    measure(&sc, &measuring, &events, res);
    atomic_store(&stop, 1);
    for (int i = 0; i < clients; i++) {
        pthread_join(th[i], NULL);
        bench_hist_merge(&res->lat, &args[i].lat);
    }
    free(args);
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
    struct pawl_metrics_hist lat; /* this caller's append latencies while measuring */
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
        int64_t t0 = pawl_now_ns();
        int rc = pawl_append(a->s, ev, (size_t)a->batch, &r);
        int64_t t1 = pawl_now_ns();
        if (rc == 0) {
            seq += a->batch;
            if (atomic_load(a->measuring)) {
                atomic_fetch_add(a->events, a->batch);
                bench_hist_add(&a->lat, t1 - t0);
            }
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
    if (piggyback >= 0)
        o.append_finalizes = finalizer ? piggyback : 0;
    o.finalizer_own_thread = own_thread_now;
    o.append_direct = !no_direct_now;
    struct pawl_store *s = NULL;
    char err[512];
    if (pawl_store_new(&s, dsn, &o, err, sizeof err) != 0) {
        fprintf(stderr, "store: %s\n", err);
        exit(1);
    }
    atomic_int stop = 0, measuring = 0;
    atomic_llong events = 0, errors = 0;
    pthread_t th[MAX_CLIENTS];
    struct caller_arg *args = calloc(MAX_CLIENTS, sizeof *args);
    struct pawl_metrics_snapshot *m0 = calloc(2, sizeof *m0), *m1 = m0 ? m0 + 1 : NULL;
    if (args == NULL || m0 == NULL) {
        fprintf(stderr, "bench_group: out of memory\n");
        exit(1);
    }
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
            args[i] = (struct caller_arg){.s = s,
                                          .id = i,
                                          .batch = d->batch,
                                          .explicit_v = d->explicit_v,
                                          .pace_ns = pace,
                                          .stop = &stop,
                                          .events = &events,
                                          .errors = &errors,
                                          .measuring = &measuring};
            pthread_create(&th[i], NULL, caller_main, &args[i]);
        }
    }
    usleep((useconds_t)warmup_ms * 1000);
    /* The store's backends: every client backend of the scratch database but admin's. */
    struct srv_cpu sc = {0};
    srv_cpu_add_db_backends(&sc, admin);
    struct pawl_store_stats st0, st1;
    pawl_store_stats(s, &st0, 1);
    memset(res, 0, sizeof *res);
    res->pawl = 1;
    pawl_metrics_snapshot(m0);
    measure(&sc, &measuring, &events, res);
    pawl_metrics_snapshot(m1);
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
    if (async) {
        pawl_metrics_diff(m1, m1, m0);
        res->lat = m1->hists[PAWL_H_APPEND_LATENCY];
    } else {
        for (int i = 0; i < nthreads; i++)
            bench_hist_merge(&res->lat, &args[i].lat);
    }
    double g = (double)(st1.append_groups - st0.append_groups);
    res->group_size =
        g > 0 ? (double)(st1.append_groups_appends - st0.append_groups_appends) / g : 1.0;
    res->runs_s = (double)(st1.finalize_runs - st0.finalize_runs) / res->secs;
    res->run_ms = st1.finalizer_run_avg_ms;
    if (atomic_load(&errors))
        fprintf(stderr, "  (%lld append errors)\n", (long long)atomic_load(&errors));
    free(args);
    free(m0);
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

/* ---- output ------------------------------------------------------------------------------ */

static FILE *csv;

/* The summary's accumulators: one per cell and variant, over the rounds. */
struct agg {
    char cell[16], variant[40];
    int pawl, n, nwm;
    double ev_s, ratio, ratio_lo, ratio_hi, wm, wm_lo, wm_hi;
    double srv_us_ev, fin_us_ev, cpu_us_ev, csw_ev, flushes_ev, group_size;
    int srv_local;
    struct pawl_metrics_hist lat; /* every round's samples */
};
static struct agg aggs[64];
static int naggs;

static struct agg *agg_of(const char *cell, const char *variant)
{
    for (int i = 0; i < naggs; i++)
        if (!strcmp(aggs[i].cell, cell) && !strcmp(aggs[i].variant, variant))
            return &aggs[i];
    if (naggs == (int)(sizeof aggs / sizeof aggs[0]))
        return NULL;
    struct agg *a = &aggs[naggs++];
    snprintf(a->cell, sizeof a->cell, "%s", cell);
    snprintf(a->variant, sizeof a->variant, "%s", variant);
    return a;
}

/* A number for the CSV, or nothing when it does not apply. */
static const char *opt(char *buf, size_t len, int has, const char *fmt, double v)
{
    if (!has)
        return "";
    snprintf(buf, len, fmt, v);
    return buf;
}

/*
 * One row: best is the better INSERT baseline's events/s in this cell and round, wm
 * write_message's (0: not run).
 */
static void report(int round, const char *cell, const char *variant, const struct result *r,
                   double best, double wm)
{
    double ratio = best > 0 ? r->ev_s / best : 0;
    double wm_ratio = wm > 0 ? r->ev_s / wm : 0;
    double p50 = bench_hist_ms(&r->lat, 0.50), p99 = bench_hist_ms(&r->lat, 0.99);
    char wmtxt[48] = "", srvtxt[128] = "server CPU: the server is not on this machine";
    char grptxt[80] = "";
    if (wm > 0)
        snprintf(wmtxt, sizeof wmtxt, "  %5.2fx write_message", wm_ratio);
    if (r->srv.local) {
        int n = snprintf(srvtxt, sizeof srvtxt, "server CPU %.1f us/ev", r->srv_us_ev);
        if (r->srv.finalizers && n > 0 && (size_t)n < sizeof srvtxt)
            n += snprintf(srvtxt + n, sizeof srvtxt - (size_t)n, " (finalizer %.1f)", r->fin_us_ev);
        if (n > 0 && (size_t)n < sizeof srvtxt)
            snprintf(srvtxt + n, sizeof srvtxt - (size_t)n, " over %d backend%s%s", r->srv.backends,
                     r->srv.backends == 1 ? "" : "s",
                     r->srv.lost ? ", some exited inside the window" : "");
    }
    if (r->pawl)
        snprintf(grptxt, sizeof grptxt, "  group %.1f  runs %.0f/s of %.2f ms", r->group_size,
                 r->runs_s, r->run_ms);
    fprintf(stderr,
            "  %-8s %-27s %9.0f ev/s  %5.2fx best INSERT%s  p50 %6.2f ms p99 %6.2f ms  %s"
            "  client CPU %.2f us/ev  %.2f csw/ev  %.3f flushes/ev%s\n",
            cell, variant, r->ev_s, ratio, wmtxt, p50, p99, srvtxt, r->cpu_us_ev, r->csw_ev,
            r->flushes_ev, grptxt);
    char b[6][32];
    fprintf(csv, "%d,%s,%s,%.1f,%.4f,%s,%.3f,%.3f,%.4f,%s,%.3f,%.2f,%s,%s,%s\n", round, cell,
            variant, r->ev_s, ratio, opt(b[0], sizeof b[0], wm > 0, "%.4f", wm_ratio), p50, p99,
            r->flushes_ev, opt(b[1], sizeof b[1], r->pawl, "%.2f", r->group_size), r->cpu_us_ev,
            r->csw_ev, opt(b[2], sizeof b[2], r->srv.local, "%.2f", r->srv_us_ev),
            opt(b[3], sizeof b[3], r->srv.local && r->srv.finalizers, "%.2f", r->fin_us_ev),
            opt(b[4], sizeof b[4], r->srv.local, "%.0f", r->srv.backends));
    fflush(csv);
    struct agg *a = agg_of(cell, variant);
    if (a == NULL)
        return;
    if (a->n == 0 || ratio < a->ratio_lo)
        a->ratio_lo = ratio;
    if (a->n == 0 || ratio > a->ratio_hi)
        a->ratio_hi = ratio;
    if (wm > 0) {
        if (a->nwm == 0 || wm_ratio < a->wm_lo)
            a->wm_lo = wm_ratio;
        if (a->nwm == 0 || wm_ratio > a->wm_hi)
            a->wm_hi = wm_ratio;
        a->wm += wm_ratio;
        a->nwm++;
    }
    a->pawl = r->pawl;
    a->n++;
    a->ev_s += r->ev_s;
    a->ratio += ratio;
    a->srv_us_ev += r->srv_us_ev;
    a->fin_us_ev += r->fin_us_ev;
    a->srv_local |= r->srv.local;
    a->cpu_us_ev += r->cpu_us_ev;
    a->csw_ev += r->csw_ev;
    a->flushes_ev += r->flushes_ev;
    a->group_size += r->group_size;
    bench_hist_merge(&a->lat, &r->lat);
}

static void print_header(int with_wm)
{
    fprintf(stderr,
            "bench_group: pawl beside plain INSERT baselines in one run (none is a ceiling).\n"
            "  insert_Nclients: N blocking clients, one INSERT of one append's rows per "
            "transaction into bench_ceiling.events (pawl.events' row shape and indexes);\n"
            "  'x best INSERT' is against the better of the cell's insert_Nclients rows in the "
            "same round (insert_server_rows_* is not a baseline: no client makes rows that "
            "way).\n"
            "%s"
            "  p50/p99: blocking calls timed by the caller around the call; async: the "
            "library's append-latency histogram (submit to acknowledged commit).\n"
            "  server CPU: the sum over the variant's backends (every connection it opened; "
            "pawl: its pool and its finalizer's, whose share is shown apart) of\n"
            "    %s from just before to just after the measured window, divided by "
            "its events; background processes (WAL writer, checkpointer, autovacuum) "
            "not counted.\n"
            "  client CPU: this process, every thread (getrusage).\n",
            with_wm ? "  write_message_1client (one1): message-db's message_store.write_message, "
                      "one blocking call per transaction, in its own database on the same "
                      "server.\n"
                    : "",
            srv_cpu_clock_name());
}

static void print_summary(void)
{
    fprintf(stderr,
            "\nsummary, %d round%s: means over the rounds (min-max of the per-round ratios); "
            "append p50/p99 of every round's samples pooled\n\n"
            "| cell | variant | events/s | x best INSERT | x write_message | append p50 / p99 ms "
            "| server CPU us/event | of it finalizer | client CPU us/event | WAL flushes/event "
            "| mean group |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
            rounds, rounds == 1 ? "" : "s");
    for (int i = 0; i < naggs; i++) {
        struct agg *a = &aggs[i];
        double n = a->n;
        char wm[48] = "", srv[24] = "", fin[24] = "", grp[16] = "";
        if (a->nwm)
            snprintf(wm, sizeof wm, "%.2f (%.2f-%.2f)", a->wm / a->nwm, a->wm_lo, a->wm_hi);
        if (a->srv_local)
            snprintf(srv, sizeof srv, "%.1f", a->srv_us_ev / n);
        if (a->srv_local && a->fin_us_ev > 0)
            snprintf(fin, sizeof fin, "%.1f", a->fin_us_ev / n);
        if (a->pawl)
            snprintf(grp, sizeof grp, "%.1f", a->group_size / n);
        fprintf(stderr,
                "| %s | %s | %.0f | %.2f (%.2f-%.2f) | %s | %.2f / %.2f | %s | %s | %.2f | %.3f "
                "| %s |\n",
                a->cell, a->variant, a->ev_s / n, a->ratio / n, a->ratio_lo, a->ratio_hi, wm,
                bench_hist_ms(&a->lat, 0.50), bench_hist_ms(&a->lat, 0.99), srv, fin,
                a->cpu_us_ev / n, a->flushes_ev / n, grp);
    }
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
                                       {"messagedb", required_argument, 0, 'M'},
                                       {"piggyback", required_argument, 0, 'P'},
                                       {"own-thread-variant", no_argument, 0, 'O'},
                                       {"loop-variant", no_argument, 0, 'V'},
                                       {0, 0, 0, 0}};
    const char *csv_path = NULL, *cells = "one64,one1,ten64,hundred,half";
    int ch;
    while ((ch = getopt_long(argc, argv, "d:s:R:c:C:L:I:B:M:P:O", lo, NULL)) != -1) {
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
        case 'M':
            messagedb = optarg;
            break;
        case 'P':
            if (int_arg("--piggyback", optarg, 0, 1, &piggyback) != 0)
                return 2;
            break;
        case 'O':
            own_thread_variant = 1;
            break;
        case 'V':
            loop_variant = 1;
            break;
        default:
            fprintf(stderr, "usage: bench_group --dsn DSN [--seconds 5] [--rounds 3] [--csv FILE] "
                            "[--cells one64,one1,ten64,hundred,half] [--latency-share PCT] "
                            "[--min-interval-us N] [--busy-share PCT] [--piggyback 0|1] "
                            "[--own-thread-variant] [--loop-variant] [--messagedb DSN|none]\n");
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
    admin = connect_or_die();
    exec_or_die(admin, "SET client_min_messages = warning"); /* not "already exists, skipping" */
    if (!log_is_empty()) {
        fprintf(stderr, "bench_group: the log is not empty; use a scratch database (the benchmark "
                        "empties pawl.events between cells)\n");
        return 1;
    }
    /* message-db: an explicit --messagedb must work; the default database may be missing. */
    int with_wm = strstr(cells, "one1") != NULL && !(messagedb && !strcmp(messagedb, "none"));
    if (with_wm && messagedb_reset(err, sizeof err) != 0) {
        fprintf(stderr, "bench_group: write_message %s: %s%s", messagedb ? "unusable" : "left out",
                err, strchr(err, '\n') ? "" : "\n");
        if (messagedb)
            return 1;
        fprintf(stderr, "  (bench/peers/setup.sh installs message-db into %s)\n", MESSAGEDB_DB);
        with_wm = 0;
    }
    print_header(with_wm);
    fprintf(csv, "round,cell,variant,events_per_s,ratio_to_best_insert,ratio_to_write_message,"
                 "append_p50_ms,append_p99_ms,wal_flushes_per_event,mean_group_size,"
                 "client_cpu_us_per_event,context_switches_per_event,server_cpu_us_per_event,"
                 "finalizer_cpu_us_per_event,server_backends\n");
    for (int round = 1; round <= rounds; round++) {
        fprintf(stderr, "round %d\n", round);
        double one64_grouped = 0, one64_best = 0;
        for (size_t i = 0; i < NCELLS; i++) {
            const struct cell_def *d = &CELLS[i];
            if (strstr(cells, d->name) == NULL && !(i == 0 && strstr(cells, "half")))
                continue;
            /* The baselines first, reported once the better INSERT is known. */
            static struct result base[2], r;
            char name[40];
            double best = 0, wm = 0;
            int nb = 0;
            for (int k = 0; k < 2 && d->insert_clients[k]; k++, nb++) {
                reset_tables();
                run_base(d, B_INSERT, d->insert_clients[k], &base[k]);
                best = base[k].ev_s > best ? base[k].ev_s : best;
            }
            for (int k = 0; k < nb; k++) {
                snprintf(name, sizeof name, "insert_%dclient%s", d->insert_clients[k],
                         d->insert_clients[k] == 1 ? "" : "s");
                report(round, d->name, name, &base[k], best, 0);
            }
            if (d->batch > 1) {
                reset_tables();
                run_base(d, B_INSERT_SERVER_ROWS, 4, &r);
                report(round, d->name, "insert_server_rows_4clients", &r, best, 0);
            }
            if (d->write_message && with_wm) {
                if (messagedb_reset(err, sizeof err) != 0) {
                    fprintf(stderr, "write_message: %s", err);
                    return 1;
                }
                run_base(d, B_WRITE_MESSAGE, 1, &r);
                wm = r.ev_s;
                report(round, d->name, "write_message_1client", &r, best, 0);
            }
            settle();
            /* grouped, and with --own-thread-variant and --loop-variant its placements beside
             * it, in an order that rotates every round (the later of two may find the machine
             * in another state). */
            const char *alts[3];
            int nalt = 0;
            alts[nalt++] = "grouped";
            if (own_thread_variant)
                alts[nalt++] = "grouped_own_thread";
            if (loop_variant)
                alts[nalt++] = "grouped_via_loop";
            for (int k = 0; k < nalt; k++) {
                const char *v = alts[(k + round) % nalt];
                own_thread_now = !strcmp(v, "grouped_own_thread");
                no_direct_now = !strcmp(v, "grouped_via_loop");
                reset_log();
                run_pawl(d, 256, 1, 0, 0, &r);
                report(round, d->name, v, &r, best, wm);
                if (i == 0 && !strcmp(v, "grouped")) {
                    one64_grouped = r.ev_s;
                    one64_best = best;
                }
                own_thread_now = no_direct_now = 0;
                settle();
            }
            reset_log();
            run_pawl(d, 1, 1, 0, 0, &r);
            report(round, d->name, "ungrouped", &r, best, wm);
            settle();
            reset_log();
            run_pawl(d, 256, 0, 0, 0, &r);
            report(round, d->name, "grouped_fin_off", &r, best, wm);
            settle();
            if (d->callers > 1 && d->batch < 100) {
                reset_log();
                run_pawl(d, 256, 1, 0, 1, &r);
                report(round, d->name, "async", &r, best, wm);
                settle();
            }
        }
        if (strstr(cells, "half") && one64_grouped > 0) {
            static struct result r;
            reset_log();
            run_pawl(&CELLS[0], 256, 1, one64_grouped / 2, 0, &r);
            report(round, "half", "grouped", &r, one64_best, 0);
            settle();
        }
    }
    print_summary();
    if (csv != stdout)
        fclose(csv);
    PQfinish(admin);
    return 0;
}
