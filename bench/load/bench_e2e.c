/*
 * bench_e2e.c — the whole system against PostgreSQL, as users judge it: end-to-end latency,
 * processing throughput against the table's read ceiling, and cost as the log grows.
 *
 * One program, five commands (bench/run.sh runs them in order on one database per run):
 *
 *   fill     --to N      grow the log to at least N finalized events. The rows are the ones an
 *                        append writes (one transaction per 100-event append, 1000-way stream
 *                        spread, 56-byte payload), inserted by a server-side loop on --conns
 *                        connections (inserts at synchronous_commit off) and finalized by
 *                        pawl.finalize() (each run its own transaction at synchronous_commit
 *                        on, as the server requires), because the API's append rate on a small
 *                        machine would take most of the time budget to reach millions of
 *                        events. The rate is reported (kind fill).
 *   latency  --rates 1000,10000,50000
 *                        per rate: an open-loop appender (10-event appends on 4 connections,
 *                        finalizer on) and a processor of the default shape (16 segments,
 *                        default threads and batch size) reading through a second store that
 *                        does not finalize and wakes on the log's notifications, as a consumer
 *                        process would. Latency = handler call - the append's commit
 *                        acknowledgement, both on this process's monotonic clock; the finalize
 *                        delay alone comes from the appending store's statistics. --threads N
 *                        sets the processor's workers (default: its default). --split adds
 *                        the processor's part: from the moment the reading store knew the
 *                        event's index was final to the handler call. --read-dsn DSN makes
 *                        the reading store read from that standby of --dsn (--read-wake
 *                        listen: wake-ups by LISTEN on --dsn; poll: by polling the standby).
 *   catchup  --segments 1,4,16 --workers 1,2
 *                        per cell: a fresh processor from token 0 over the filled log with a
 *                        no-op handler or a handler writing one projection row per event into
 *                        the batch transaction (pawl_txn_exec), for --seconds or until the
 *                        head. Around the cells: the ceiling, a plain
 *                        `SELECT ... ORDER BY <primary key> LIMIT 1000` keyset loop over the same
 *                        table on one connection, and the C reader (pawl_read, 1000 per call).
 *   growth               at the log's current size: append rate (closed loop, 4 connections x
 *                        64 in flight, 10-event appends), its finalize delay, and the read rate
 *                        (pawl_read, 1000 per call, sequential from the middle of the log).
 *   append   --workers 1,8 --rates 1,100
 *                        the peers' append workload: W writers, each blocking in pawl_append
 *                        with E-event appends to its own 100 streams (--rates gives E here).
 *
 * Every command appends CSV rows (header written when the file is new) to --csv:
 *   kind,log_events,cell,param1,param2,events,seconds,events_per_s,
 *   p50_ms,p99_ms,p999_ms,max_ms,extra
 * and prints progress to stderr. The database must be a scratch database (the schema is
 * installed if missing; tables pawl_bench.* are created).
 *
 * Single-threaded control; handlers run on the processor's workers, append callbacks on the
 * store's I/O thread (they only store into preallocated arrays, through atomics).
 */
#include "pawl.h"

#include <getopt.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *dsn;
static const char *csv_path;
static double seconds = 10;
static int64_t fill_to;
static int conns = 2;
static char rates_arg[128] = "1000,10000,50000";
static char segs_arg[64] = "1,4,16";
static char workers_arg[64] = "1,2";
static char batches_arg[64] = "100,1000";
static int per_append = 10;
static double warmup_s = 1.5;
static int split_latency;    /* --split: also time the processor's part (see latency_cell) */
static int lat_threads = -1; /* latency --threads: the processor's workers (-1: its default) */
static int lat_share = -1;   /* --latency-share: the finalizer's latency share (-1: default) */
static int fin_own_thread;   /* --finalizer-own-thread: the finalizer on a thread of its own */
static int min_iv_us = -1; /* --min-interval-us: the finalizer's run spacing floor (-1: default) */
static const char *read_dsn; /* latency --read-dsn: the reading store reads from this standby */
static int read_wake = PAWL_READ_WAKE_LISTEN; /* latency --read-wake listen|poll */

static void usage(void);

static void db_exec(PGconn *c, const char *sql);

static void die(const char *what, const char *why)
{
    fprintf(stderr, "bench_e2e: %s: %s\n", what, why);
    exit(1);
}

static double now_s(void)
{
    return (double)pawl_now_ns() / 1e9;
}

static void sleep_ns(int64_t ns)
{
    struct timespec ts = {ns / 1000000000, ns % 1000000000};
    nanosleep(&ts, NULL);
}

/* ---- SQL helpers ------------------------------------------------------------------------- */

static PGconn *db_connect(void)
{
    PGconn *c = PQconnectdb(dsn);
    if (PQstatus(c) != CONNECTION_OK)
        die("connect", PQerrorMessage(c));
    db_exec(c, "SET client_min_messages = warning");
    return c;
}

static void db_exec(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
        die(sql, PQerrorMessage(c));
    PQclear(r);
}

static int64_t db_int(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) < 1)
        die(sql, PQerrorMessage(c));
    int64_t v = PQgetisnull(r, 0, 0) ? 0 : atoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    return v;
}

static int64_t log_head(PGconn *c)
{
    return db_int(c, "SELECT pawl_api.last_index()");
}

/* Finalize until nothing is left (untimed housekeeping between measurements). */
static void finalize_all(PGconn *c)
{
    for (int i = 0; i < 100000; i++) {
        int64_t a = db_int(c, "SELECT appends FROM pawl.finalize(2000)");
        if (a == 0)
            return;
        if (a < 0)
            usleep(2000);
    }
}

/* ---- CSV --------------------------------------------------------------------------------- */

static void csv_row(const char *kind, int64_t log_events, const char *cell, const char *p1,
                    const char *p2, int64_t events, double secs, double p50, double p99,
                    double p999, double max, const char *extra)
{
    double rate = secs > 0 ? (double)events / secs : 0;
    fprintf(stderr,
            "  %s %s %s %s: %lld events in %.2f s = %.0f ev/s  p50 %.2f p99 %.2f p999 %.2f "
            "max %.2f ms  %s\n",
            kind, cell, p1, p2, (long long)events, secs, rate, p50, p99, p999, max, extra);
    if (csv_path == NULL)
        return;
    /* The free-text field must not split the row. */
    char note[256];
    snprintf(note, sizeof note, "%s", extra);
    for (char *q = note; *q; q++)
        if (*q == ',' || *q == '\n')
            *q = ';';
    int fresh = access(csv_path, F_OK) != 0;
    FILE *f = fopen(csv_path, "a");
    if (f == NULL)
        die(csv_path, "cannot open");
    if (fresh)
        fprintf(f, "kind,log_events,cell,param1,param2,events,seconds,events_per_s,p50_ms,p99_ms,"
                   "p999_ms,max_ms,extra\n");
    fprintf(f, "%s,%lld,%s,%s,%s,%lld,%.3f,%.1f,%.3f,%.3f,%.3f,%.3f,%s\n", kind,
            (long long)log_events, cell, p1, p2, (long long)events, secs, rate, p50, p99, p999, max,
            note);
    fclose(f);
}

/* ---- fill -------------------------------------------------------------------------------- */

/*
 * The fill loop, server-side: per filler, appends of 100 events with consecutive global
 * numbers g; stream "f<filler>-<g mod 1000>" at sequence g / 1000 + 1 (unique, in order).
 * Each append is its own transaction (so its own xid, as the store's appends); every 50
 * appends the loop finalizes what is committed (the lock is a try-lock: a busy finalizer is
 * simply skipped, and the caller drains at the end).
 *
 * The inserts commit at synchronous_commit = off (set-up writes: no wait for each flush); the
 * finalizations do not. pawl.finalize refuses to run below synchronous_commit = on (a run it
 * reported final must survive a crash), so each finalization is its own transaction with
 * synchronous_commit on for that transaction only (set_config(..., true) lasts until its
 * COMMIT), and the drain at the end runs on a session at on: the fill's rate includes every
 * finalization's flush, as a real log's finalizer pays it.
 */
static const char *fill_sql =
    "CREATE SCHEMA IF NOT EXISTS pawl_bench;"
    "CREATE TABLE IF NOT EXISTS pawl_bench.fill_state (filler int PRIMARY KEY, next_g int8);"
    "CREATE OR REPLACE PROCEDURE pawl_bench.fill(filler int, appends int) LANGUAGE plpgsql AS $$"
    "DECLARE g int8; BEGIN"
    "  INSERT INTO pawl_bench.fill_state VALUES (filler, 0) ON CONFLICT DO NOTHING;"
    "  SELECT next_g INTO g FROM pawl_bench.fill_state s WHERE s.filler = fill.filler;"
    "  COMMIT;"
    "  FOR a IN 1..appends LOOP"
    "    INSERT INTO pawl.events (xid, stream_seq, k, n, stream_id, type, payload)"
    "    SELECT pg_current_xact_id(), (g + i) / 1000 + 1, i, 100,"
    "           'f' || filler || '-' || ((g + i) % 1000), 'bench',"
    "           convert_to('{\"amount\": 42, \"currency\": \"EUR\", \"note\": \"bench-fill\"}',"
    "                      'UTF8')"
    "      FROM generate_series(0, 99) AS i;"
    "    g := g + 100;"
    "    UPDATE pawl_bench.fill_state s SET next_g = g WHERE s.filler = fill.filler;"
    "    COMMIT;"
    "    IF a % 50 = 0 THEN"
    "      PERFORM set_config('synchronous_commit', 'on', true);"
    "      PERFORM pawl.finalize(2000);"
    "      COMMIT;"
    "    END IF;"
    "  END LOOP;"
    "END $$;";

static void cmd_fill(void)
{
    PGconn *c = db_connect();
    db_exec(c, fill_sql);
    int64_t head0 = log_head(c);
    if (head0 >= fill_to) {
        fprintf(stderr, "bench_e2e: log already holds %lld events\n", (long long)head0);
        PQfinish(c);
        return;
    }
    int64_t appends = (fill_to - head0 + 99) / 100;
    int64_t each = (appends + conns - 1) / conns;
    PGconn *cs[16];
    int n = conns > 16 ? 16 : conns;
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        cs[i] = db_connect();
        /* Untimed set-up writes: no need to wait for each commit's flush. */
        db_exec(cs[i], "SET synchronous_commit = off");
        char sql[128];
        snprintf(sql, sizeof sql, "CALL pawl_bench.fill(%d, %lld)", i, (long long)each);
        if (!PQsendQuery(cs[i], sql))
            die("fill", PQerrorMessage(cs[i]));
    }
    for (int i = 0; i < n; i++) {
        PGresult *r;
        while ((r = PQgetResult(cs[i])) != NULL) {
            if (PQresultStatus(r) != PGRES_COMMAND_OK)
                die("fill", PQerrorMessage(cs[i]));
            PQclear(r);
        }
        PQfinish(cs[i]);
    }
    db_exec(c, "SET synchronous_commit = on");
    finalize_all(c);
    double dt = now_s() - t0;
    db_exec(c, "VACUUM ANALYZE pawl.events");
    db_exec(c, "VACUUM ANALYZE pawl.runs");
    int64_t head = log_head(c);
    char extra[128];
    snprintf(extra, sizeof extra,
             "server-side loop; %d connections; inserts at synchronous_commit off, finalize at on",
             n);
    csv_row("fill", head, "sql-fill", "100", "", head - head0, dt, 0, 0, 0, 0, extra);
    PQfinish(c);
}

/* ---- latency ----------------------------------------------------------------------------- */

struct lat {
    _Atomic int64_t *commit_ns; /* per append number: commit acknowledged (0: not yet) */
    int64_t nappends;           /* capacity */
    double *lat_ms;             /* per delivered event in the window */
    _Atomic int64_t nlat;
    int64_t cap;
    _Atomic int64_t first_measured; /* append numbers below it are warm-up */
    _Atomic int64_t delivered;
    _Atomic int64_t early; /* handler ran before the commit callback recorded the time */
    _Atomic int64_t inflight;
    _Atomic int64_t errors;
    int64_t cell; /* tags this cell's events */
    /* --split: when the reading store learned that each index is final (0: not yet), indexed by
     * global index - known_base - 1, and per measured event the time from then to its handler. */
    _Atomic int64_t *known_ns;
    int64_t known_base, known_cap;
    double *proc_ms;
    _Atomic int64_t nproc;
    struct pawl_store *rd;
    _Atomic int stop;
};

/*
 * --split: a thread that follows what the reading store knows (the same wake-up the processor's
 * coordinator waits on) and stamps every index with the time it became known, so that the
 * handler can tell the processor's part (read, dispatch, scheduling, handler call) from the
 * finalization and notification before it. Off by default: it is one more thread woken per
 * finalization run.
 */
static void *known_main(void *arg)
{
    struct lat *L = arg;
    int64_t seen = L->known_base;
    while (!atomic_load_explicit(&L->stop, memory_order_relaxed)) {
        if (pawl_store_wait(L->rd, seen, 50) != 0)
            continue;
        int64_t idx = pawl_store_last_index(L->rd), t = pawl_now_ns();
        for (int64_t i = seen + 1; i <= idx && i - L->known_base - 1 < L->known_cap; i++)
            /* Release: the handler's acquire load sees the stamp once non-zero. */
            atomic_store_explicit(&L->known_ns[i - L->known_base - 1], t, memory_order_release);
        seen = idx;
    }
    return NULL;
}

/* The payload of a latency event: which cell appended it, and its append number. */
struct tag {
    int64_t append_no;
    int64_t cell;
    char pad[40];
};

struct lat_cb {
    struct lat *L;
    int64_t no;
};

/* The callback context of each append lives in a preallocated array: no allocation per append. */
static struct lat_cb *cb_slots;

static void on_lat_done(void *ud, const struct pawl_append_result *r)
{
    struct lat_cb *cb = ud;
    struct lat *L = cb->L;
    if (r->rc == 0)
        /* Release: the handler's acquire load sees the time once it sees non-zero. */
        atomic_store_explicit(&L->commit_ns[cb->no], r->committed_ns, memory_order_release);
    else
        atomic_fetch_add_explicit(&L->errors, 1, memory_order_relaxed);
    /* Relaxed: a counter for the driver's flow control only. */
    atomic_fetch_sub_explicit(&L->inflight, 1, memory_order_relaxed);
}

static int lat_handle(void *self, struct pawl_event_ctx *ctx)
{
    struct lat *L = self;
    int64_t t = pawl_now_ns();
    const struct pawl_event *e = pawl_ctx_event(ctx);
    struct tag tg;
    if (e->payload_len != sizeof tg)
        return 0;
    memcpy(&tg, e->payload, sizeof tg);
    int64_t no = tg.append_no;
    /* Events of an earlier cell that were finalized after this processor's start are not ours. */
    if (tg.cell != L->cell || no < 0 || no >= L->nappends)
        return 0;
    /* Relaxed: counters, read after the processor stops. */
    atomic_fetch_add_explicit(&L->delivered, 1, memory_order_relaxed);
    if (no < atomic_load_explicit(&L->first_measured, memory_order_relaxed))
        return 0;
    /* Acquire: pairs with the commit callback's release store. */
    int64_t c = atomic_load_explicit(&L->commit_ns[no], memory_order_acquire);
    double ms = 0;
    if (L->known_ns) {
        int64_t k = e->index - L->known_base - 1, kt = 0;
        if (k >= 0 && k < L->known_cap)
            kt = atomic_load_explicit(&L->known_ns[k], memory_order_acquire);
        /* Relaxed: each slot is written once; read after the processor stops. */
        int64_t j = kt ? atomic_fetch_add_explicit(&L->nproc, 1, memory_order_relaxed) : -1;
        if (j >= 0 && j < L->cap)
            L->proc_ms[j] = (double)(t - kt) / 1e6;
    }
    if (c == 0)
        atomic_fetch_add_explicit(&L->early, 1, memory_order_relaxed);
    else
        ms = (double)(t - c) / 1e6;
    /* Relaxed: each slot is written by one handler call; read after the processor stops. */
    int64_t i = atomic_fetch_add_explicit(&L->nlat, 1, memory_order_relaxed);
    if (i < L->cap)
        L->lat_ms[i] = ms;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *v, int64_t n, double q)
{
    if (n <= 0)
        return 0;
    int64_t i = (int64_t)(q * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

/* latency: the appending store's connections (written into each row, for the report). */
enum { LAT_APPEND_CONNS = 4 };

static struct pawl_store *open_store(int nconn, int finalizer, int listen)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.connections = nconn;
    o.finalizer = finalizer;
    o.listen = listen;
    o.max_inflight_appends = 100000;
    if (lat_share >= 0)
        o.finalizer_latency_share_pct = lat_share;
    if (min_iv_us >= 0)
        o.finalizer_min_interval_us = min_iv_us;
    o.finalizer_own_thread = fin_own_thread;
    if (!finalizer && read_dsn) {
        o.read_dsn = read_dsn;
        o.read_wake = read_wake;
    }
    struct pawl_store *s = NULL;
    char err[512];
    if (pawl_store_new(&s, dsn, &o, err, sizeof err) != 0)
        die("store", err);
    return s;
}

static void latency_cell(int rate, int run)
{
    PGconn *c = db_connect();
    finalize_all(c);
    int64_t head = log_head(c);
    struct pawl_store *app = open_store(LAT_APPEND_CONNS, 1, 0);
    struct pawl_store *rd = open_store(2, 0, 1);
    struct pawl_source *src = NULL;
    struct pawl_tokens *tok = NULL;
    if (pawl_source_pg_from_store(&src, rd, dsn) != 0 || pawl_tokens_pg_new(&tok, dsn) != 0)
        die("latency", "source / token store");

    double warm = warmup_s;
    int64_t nappends = (int64_t)((seconds + warm + 1) * rate / per_append) + 16;
    struct lat L = {0};
    L.nappends = nappends;
    L.commit_ns = calloc((size_t)nappends, sizeof *L.commit_ns);
    L.cap = nappends * per_append;
    L.lat_ms = calloc((size_t)L.cap, sizeof *L.lat_ms);
    cb_slots = calloc((size_t)nappends, sizeof *cb_slots);
    if (!L.commit_ns || !L.lat_ms || !cb_slots)
        die("latency", "out of memory");
    atomic_store(&L.first_measured, INT64_MAX);
    L.cell = (int64_t)getpid() * 1000 + run;
    pthread_t known_th;
    if (split_latency) {
        L.known_base = head;
        L.known_cap = L.cap * 2 + 1024; /* room for other cells' late events too */
        L.known_ns = calloc((size_t)L.known_cap, sizeof *L.known_ns);
        L.proc_ms = calloc((size_t)L.cap, sizeof *L.proc_ms);
        if (!L.known_ns || !L.proc_ms)
            die("latency", "out of memory");
        L.rd = rd;
        if (pthread_create(&known_th, NULL, known_main, &L) != 0)
            die("latency", "cannot start the --split thread");
    }

    char name[64];
    snprintf(name, sizeof name, "e2e-%d-%d-%d", rate, run, (int)getpid());
    struct pawl_processor_opts po;
    pawl_processor_opts_defaults(&po);
    po.name = name;
    po.initial_token = head;
    if (lat_threads >= 0)
        po.threads = (uint32_t)lat_threads;
    struct pawl_handler h = {"latency", &L, lat_handle, NULL};
    struct pawl_processor *p = NULL;
    if (pawl_processor_new(&p, &po, src, tok, &h, 1) != 0 || pawl_processor_start(p) != 0)
        die("latency", "processor");
    /* Let the processor claim its segments before the load starts. */
    for (int i = 0; i < 200; i++) {
        struct pawl_processor_stats st;
        pawl_processor_stats(p, &st);
        if (st.segments_owned >= po.segments)
            break;
        usleep(10000);
    }

    struct pawl_event ev[100];
    char sids[100][24];
    struct tag tags;
    memset(&tags, 0, sizeof tags);
    unsigned seed = (unsigned)rate;
    int64_t interval = (int64_t)(1e9 * per_append / rate);
    int64_t t0 = pawl_now_ns();
    int64_t t_measure = t0 + (int64_t)(warm * 1e9);
    int64_t t_end = t_measure + (int64_t)(seconds * 1e9);
    int64_t next = t0, no = 0, dropped = 0, measured_from = -1;
    struct pawl_store_stats st0;
    while (no < nappends) {
        int64_t now = pawl_now_ns();
        if (measured_from < 0 && now >= t_measure) {
            measured_from = no;
            atomic_store_explicit(&L.first_measured, no, memory_order_relaxed);
            pawl_store_stats(app, &st0, 1);
        }
        if (now >= t_end)
            break;
        if (now < next) {
            sleep_ns(next - now < 200000 ? next - now : 200000);
            continue;
        }
        next += interval;
        tags.append_no = no;
        tags.cell = L.cell;
        for (int k = 0; k < per_append; k++) {
            snprintf(sids[k], sizeof sids[k], "l-%u", rand_r(&seed) % 100000);
            ev[k] = (struct pawl_event){.stream_id = sids[k],
                                        .stream_seq = PAWL_SEQ_ANY,
                                        .type = "bench",
                                        .payload = &tags,
                                        .payload_len = sizeof tags};
        }
        cb_slots[no] = (struct lat_cb){&L, no};
        atomic_fetch_add_explicit(&L.inflight, 1, memory_order_relaxed);
        if (pawl_append_async(app, ev, (size_t)per_append, on_lat_done, &cb_slots[no]) != 0) {
            atomic_fetch_sub_explicit(&L.inflight, 1, memory_order_relaxed);
            dropped++;
        }
        no++;
    }
    double offered_s = (double)(pawl_now_ns() - t_measure) / 1e9;
    int64_t sent = (no - measured_from) * per_append;
    pawl_store_drain(app);
    /* Wait (bounded) for the processor to deliver what was appended. */
    int64_t want = no * per_append - dropped * per_append;
    for (int i = 0; i < 1000 && atomic_load(&L.delivered) < want; i++)
        usleep(10000);
    struct pawl_store_stats st;
    pawl_store_stats(app, &st, 0);
    pawl_processor_stop(p);
    pawl_processor_free(p);
    char split[160] = "";
    if (split_latency) {
        atomic_store_explicit(&L.stop, 1, memory_order_relaxed);
        pthread_join(known_th, NULL);
        int64_t m = atomic_load(&L.nproc);
        if (m > L.cap)
            m = L.cap;
        qsort(L.proc_ms, (size_t)m, sizeof(double), cmp_double);
        snprintf(split, sizeof split,
                 "; after the reader knew the index: p50 %.2f p99 %.2f p999 %.2f max %.2f ms",
                 pct(L.proc_ms, m, 0.5), pct(L.proc_ms, m, 0.99), pct(L.proc_ms, m, 0.999),
                 m ? L.proc_ms[m - 1] : 0);
        free(L.known_ns);
        free(L.proc_ms);
    }

    int64_t n = atomic_load(&L.nlat);
    if (n > L.cap)
        n = L.cap;
    qsort(L.lat_ms, (size_t)n, sizeof(double), cmp_double);
    char p1[32], extra[448];
    snprintf(p1, sizeof p1, "%d", rate);
    snprintf(extra, sizeof extra,
             "achieved %.0f ev/s; missing %lld; early %lld; errors %lld; dropped %lld; %d "
             "appender connections%s",
             (double)sent / offered_s, (long long)(want - atomic_load(&L.delivered)),
             (long long)atomic_load(&L.early), (long long)atomic_load(&L.errors),
             (long long)dropped, LAT_APPEND_CONNS, split);
    char p2[16];
    snprintf(p2, sizeof p2, "%d", per_append);
    csv_row("latency", head,
            !read_dsn                          ? "append-to-handler"
            : read_wake == PAWL_READ_WAKE_POLL ? "append-to-handler-standby-poll"
                                               : "append-to-handler-standby-listen",
            p1, p2, n, offered_s, pct(L.lat_ms, n, 0.5), pct(L.lat_ms, n, 0.99),
            pct(L.lat_ms, n, 0.999), n ? L.lat_ms[n - 1] : 0, extra);
    snprintf(extra, sizeof extra, "samples are appends; p999 n/a; %lld finalize runs",
             (long long)(st.finalize_runs - st0.finalize_runs));
    csv_row("latency", head, "finalize-delay", p1, p2, st.delay_count, offered_s, st.delay_p50_ms,
            st.delay_p99_ms, 0, st.delay_max_ms, extra);

    pawl_tokens_free(tok);
    pawl_source_free(src);
    pawl_store_free(rd);
    pawl_store_free(app);
    free(L.commit_ns);
    free(L.lat_ms);
    free(cb_slots);
    cb_slots = NULL;
    PQfinish(c);
}

static void cmd_latency(void)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", rates_arg);
    int run = 0;
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ","))
        latency_cell(atoi(t), run++);
}

/* ---- reading: ceiling and reader --------------------------------------------------------- */

/* The ceiling: a plain keyset loop over the events table's primary key, 1000 rows a query. */
static double ceiling_rate(double secs, int64_t *rows_out)
{
    PGconn *c = db_connect();
    const char *sql = "SELECT xid, k, stream_id, stream_seq, type, payload, metadata, appended_at"
                      "  FROM pawl.events WHERE (xid, k) > ($1::xid8, $2::int4)"
                      " ORDER BY xid, k LIMIT 1000";
    PGresult *r = PQprepare(c, "ceil", sql, 2, NULL);
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        die("ceiling", PQerrorMessage(c));
    PQclear(r);
    char x[32] = "0", k[16] = "-1";
    int64_t rows = 0;
    double t0 = now_s(), dt = 0;
    while ((dt = now_s() - t0) < secs) {
        const char *v[2] = {x, k};
        r = PQexecPrepared(c, "ceil", 2, v, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK)
            die("ceiling", PQerrorMessage(c));
        int n = PQntuples(r);
        rows += n;
        if (n < 1000) {
            snprintf(x, sizeof x, "0");
            snprintf(k, sizeof k, "-1");
        } else {
            snprintf(x, sizeof x, "%s", PQgetvalue(r, n - 1, 0));
            snprintf(k, sizeof k, "%s", PQgetvalue(r, n - 1, 1));
        }
        PQclear(r);
    }
    PQfinish(c);
    *rows_out = rows;
    return dt;
}

/* The C reader: pawl_read of 1000 from `from`, sequentially, for secs. */
static double reader_rate(struct pawl_store *s, int64_t from, int64_t head, double secs,
                          int64_t *rows_out)
{
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    int64_t pos = from, rows = 0;
    double t0 = now_s(), dt = 0;
    while ((dt = now_s() - t0) < secs) {
        if (pawl_read(s, pos, 1000, &b) != 0)
            die("read", "pawl_read failed");
        rows += (int64_t)b.count;
        pos = b.count ? b.events[b.count - 1].index : 0;
        if (pos >= head)
            pos = 0;
    }
    pawl_read_batch_fini(&b);
    *rows_out = rows;
    return dt;
}

/* ---- catch-up ---------------------------------------------------------------------------- */

static int noop_handle(void *self, struct pawl_event_ctx *ctx)
{
    (void)self;
    (void)ctx;
    return 0;
}

static int proj_handle(void *self, struct pawl_event_ctx *ctx)
{
    (void)self;
    const struct pawl_event *e = pawl_ctx_event(ctx);
    char idx[24], seq[24];
    snprintf(idx, sizeof idx, "%lld", (long long)e->index);
    snprintf(seq, sizeof seq, "%lld", (long long)e->stream_seq);
    const char *v[3] = {idx, e->stream_id, seq};
    return pawl_txn_exec(pawl_ctx_txn(ctx),
                         "INSERT INTO pawl_bench.projection (global_index, stream_id, stream_seq)"
                         " VALUES ($1, $2, $3) ON CONFLICT (global_index) DO NOTHING",
                         3, v);
}

static void catchup_cell(const char *handler, uint32_t batch, uint32_t segs, uint32_t workers,
                         int64_t head, struct pawl_source *src, struct pawl_tokens *tok, int run)
{
    char name[64];
    snprintf(name, sizeof name, "cu-%s-%u-%u-%u-%d-%d", handler, batch, segs, workers, run,
             (int)getpid());
    struct pawl_processor_opts po;
    pawl_processor_opts_defaults(&po);
    po.name = name;
    po.segments = segs;
    po.threads = workers;
    po.batch_size = batch;
    po.claim_poll_ms = 50;
    int proj = strcmp(handler, "projection") == 0;
    struct pawl_handler h = {handler, NULL, proj ? proj_handle : noop_handle, NULL};
    struct pawl_processor *p = NULL;
    if (pawl_processor_new(&p, &po, src, tok, &h, 1) != 0)
        die("catchup", "processor");
    double t0 = now_s();
    if (pawl_processor_start(p) != 0)
        die("catchup", "start");
    struct pawl_processor_stats st;
    /* Measure from the first committed batch (claims and the first read are start-up). */
    double tm = 0, t_end = t0 + seconds + 30;
    uint64_t e0 = 0;
    for (;;) {
        usleep(5000);
        pawl_processor_stats(p, &st);
        double t = now_s();
        if (tm == 0 && st.events > 0) {
            tm = t;
            e0 = st.events;
            t_end = t + seconds;
        }
        if ((int64_t)st.events >= head || t >= t_end)
            break;
    }
    double t1 = now_s();
    pawl_processor_stats(p, &st);
    uint64_t e1 = st.events;
    pawl_processor_stop(p);
    pawl_processor_free(p);
    char p1[16], p2[16], extra[160], cell[48];
    snprintf(cell, sizeof cell, "%s-b%u", handler, batch);
    snprintf(p1, sizeof p1, "%u", segs);
    snprintf(p2, sizeof p2, "%u", workers);
    snprintf(extra, sizeof extra,
             "batch %u; read_batch %u; start-up %.2f s; %llu batches; "
             "%llu failures",
             po.batch_size, po.read_batch, tm > 0 ? tm - t0 : 0, (unsigned long long)st.batches,
             (unsigned long long)st.batch_failures);
    csv_row("catchup", head, cell, p1, p2, tm > 0 ? (int64_t)(e1 - e0) : 0, tm > 0 ? t1 - tm : 0, 0,
            0, 0, 0, extra);
}

static void cmd_catchup(void)
{
    PGconn *c = db_connect();
    db_exec(c,
            "CREATE SCHEMA IF NOT EXISTS pawl_bench;"
            "CREATE TABLE IF NOT EXISTS pawl_bench.projection"
            " (global_index int8 PRIMARY KEY, stream_id text NOT NULL, stream_seq int8 NOT NULL)");
    int64_t head = log_head(c);
    struct pawl_store *rd = open_store(2, 0, 1);
    struct pawl_source *src = NULL;
    struct pawl_tokens *tok = NULL;
    if (pawl_source_pg_from_store(&src, rd, dsn) != 0 || pawl_tokens_pg_new(&tok, dsn) != 0)
        die("catchup", "source / token store");

    int64_t rows;
    double dt = ceiling_rate(seconds, &rows);
    csv_row("catchup", head, "ceiling-select", "", "", rows, dt, 0, 0, 0, 0,
            "keyset loop over the primary key; 1000 per query; 1 connection");
    dt = reader_rate(rd, 0, head, seconds, &rows);
    csv_row("catchup", head, "pawl-read", "", "", rows, dt, 0, 0, 0, 0,
            "pawl_read from 0; 1000 per call");

    char sb[64], wb[64], bb[64];
    const char *handlers[2] = {"noop", "projection"};
    int run = 0;
    snprintf(bb, sizeof bb, "%s", batches_arg);
    char *bp = NULL;
    for (char *b = strtok_r(bb, ",", &bp); b; b = strtok_r(NULL, ",", &bp))
        for (int hi = 0; hi < 2; hi++) {
            snprintf(sb, sizeof sb, "%s", segs_arg);
            char *sp = NULL;
            for (char *s = strtok_r(sb, ",", &sp); s; s = strtok_r(NULL, ",", &sp)) {
                snprintf(wb, sizeof wb, "%s", workers_arg);
                char *wp = NULL;
                for (char *w = strtok_r(wb, ",", &wp); w; w = strtok_r(NULL, ",", &wp)) {
                    catchup_cell(handlers[hi], (uint32_t)atoi(b), (uint32_t)atoi(s),
                                 (uint32_t)atoi(w), head, src, tok, run++);
                    if (hi == 1)
                        db_exec(c, "TRUNCATE pawl_bench.projection");
                }
            }
        }
    /* The ceiling again after the cells: the machine drifts, so the table shows both. */
    dt = ceiling_rate(seconds, &rows);
    csv_row("catchup", head, "ceiling-select", "after", "", rows, dt, 0, 0, 0, 0,
            "keyset loop over the primary key; 1000 per query; 1 connection");
    pawl_tokens_free(tok);
    pawl_source_free(src);
    pawl_store_free(rd);
    PQfinish(c);
}

/* ---- growth ------------------------------------------------------------------------------ */

struct closed {
    _Atomic int64_t done;
    _Atomic int64_t inflight;
    _Atomic int64_t errors;
};

static void on_closed_done(void *ud, const struct pawl_append_result *r)
{
    struct closed *d = ud;
    /* Relaxed: counters for flow control and the final tally. */
    if (r->rc == 0)
        atomic_fetch_add_explicit(&d->done, per_append, memory_order_relaxed);
    else
        atomic_fetch_add_explicit(&d->errors, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&d->inflight, 1, memory_order_relaxed);
}

static void cmd_growth(void)
{
    PGconn *c = db_connect();
    finalize_all(c);
    int64_t head = log_head(c);
    int64_t bytes = db_int(c, "SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::int8 FROM "
                              "pg_partition_tree('pawl.events')");
    struct pawl_store *s = open_store(4, 1, 0);
    struct closed d = {0};
    struct pawl_event ev[100];
    char sids[100][24];
    static const char payload[] = "{\"amount\": 42, \"currency\": \"EUR\", \"note\": \"bench\"}";
    unsigned seed = (unsigned)head;
    double warm = 1.0;
    int64_t t0 = pawl_now_ns(), tm = t0 + (int64_t)(warm * 1e9);
    int64_t t_end = tm + (int64_t)(seconds * 1e9), e0 = -1;
    int measuring = 0;
    struct pawl_store_stats st0, st;
    for (;;) {
        int64_t now = pawl_now_ns();
        if (!measuring && now >= tm) {
            e0 = atomic_load(&d.done);
            pawl_store_stats(s, &st0, 1);
            tm = now;
            measuring = 1;
        }
        if (now >= t_end)
            break;
        if (atomic_load_explicit(&d.inflight, memory_order_relaxed) >= 4 * 64) {
            sleep_ns(50000);
            continue;
        }
        for (int k = 0; k < per_append; k++) {
            snprintf(sids[k], sizeof sids[k], "g-%u", rand_r(&seed) % 100000);
            ev[k] = (struct pawl_event){.stream_id = sids[k],
                                        .stream_seq = PAWL_SEQ_ANY,
                                        .type = "bench",
                                        .payload = payload,
                                        .payload_len = sizeof payload - 1};
        }
        atomic_fetch_add_explicit(&d.inflight, 1, memory_order_relaxed);
        if (pawl_append_async(s, ev, (size_t)per_append, on_closed_done, &d) != 0) {
            atomic_fetch_sub_explicit(&d.inflight, 1, memory_order_relaxed);
            sleep_ns(100000);
        }
    }
    int64_t e1 = atomic_load(&d.done);
    double dt = (double)(pawl_now_ns() - tm) / 1e9;
    pawl_store_drain(s);
    usleep(100000);
    pawl_store_stats(s, &st, 0);
    char extra[160];
    snprintf(extra, sizeof extra,
             "closed loop 4 conns x 64 in flight; %d-event appends; table %.0f MB", per_append,
             (double)bytes / 1048576.0);
    csv_row("growth", head, "append", "", "", e1 - e0, dt, st.append_p50_ms, st.append_p99_ms, 0,
            st.append_max_ms, extra);
    csv_row("growth", head, "finalize-delay", "", "", st.delay_count, dt, st.delay_p50_ms,
            st.delay_p99_ms, 0, st.delay_max_ms, "samples are appends; p999 n/a");
    pawl_store_free(s);
    finalize_all(c);
    int64_t head2 = log_head(c);
    struct pawl_store *rd = open_store(2, 0, 0);
    int64_t rows;
    dt = reader_rate(rd, head2 / 2, head2, seconds, &rows);
    csv_row("growth", head, "read", "", "", rows, dt, 0, 0, 0, 0,
            "pawl_read 1000 per call, sequential from the middle");
    pawl_store_free(rd);
    PQfinish(c);
}

/* ---- append: blocking writers, the peers' workload ---------------------------------------- */

struct writer {
    struct pawl_store *s;
    int id, batch;
    double t_end;
    int64_t events;
    double *lat;
    int64_t nlat, cap;
};

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    struct pawl_event ev[100];
    char sids[100][24];
    static const char payload[] = "{\"amount\": 42, \"currency\": \"EUR\", \"note\": \"bench\"}";
    int64_t n = 0;
    while (now_s() < w->t_end) {
        /* Like the peer drivers: each writer appends to its own 100 streams, in turn. */
        for (int k = 0; k < w->batch; k++) {
            snprintf(sids[k], sizeof sids[k], "w%d-%d-%lld", w->id, (int)getpid(),
                     (long long)((n + k) % 100));
            ev[k] = (struct pawl_event){.stream_id = sids[k],
                                        .stream_seq = PAWL_SEQ_ANY,
                                        .type = "bench",
                                        .payload = payload,
                                        .payload_len = sizeof payload - 1};
        }
        double t = now_s();
        struct pawl_append_result res;
        if (pawl_append(w->s, ev, (size_t)w->batch, &res) != 0)
            die("append", res.message);
        if (w->nlat < w->cap)
            w->lat[w->nlat++] = (now_s() - t) * 1e3;
        n += w->batch;
    }
    w->events = n;
    return NULL;
}

static void cmd_append(void)
{
    char wb[64], bb[128];
    snprintf(wb, sizeof wb, "%s", workers_arg);
    char *wp = NULL;
    for (char *ws = strtok_r(wb, ",", &wp); ws; ws = strtok_r(NULL, ",", &wp)) {
        snprintf(bb, sizeof bb, "%s", rates_arg);
        char *bp = NULL;
        for (char *bs = strtok_r(bb, ",", &bp); bs; bs = strtok_r(NULL, ",", &bp)) {
            int nw = atoi(ws), batch = atoi(bs);
            if (nw < 1 || nw > 64 || batch < 1 || batch > 100)
                usage();
            struct pawl_store *s = open_store(nw, 1, 0);
            struct writer w[64];
            pthread_t th[64];
            double t0 = now_s();
            for (int i = 0; i < nw; i++) {
                w[i] = (struct writer){.s = s, .id = i, .batch = batch, .t_end = t0 + seconds};
                w[i].cap = 2000000;
                w[i].lat = malloc(sizeof(double) * (size_t)w[i].cap);
                if (w[i].lat == NULL)
                    die("append", "out of memory");
                pthread_create(&th[i], NULL, writer_main, &w[i]);
            }
            int64_t events = 0, nlat = 0;
            for (int i = 0; i < nw; i++) {
                pthread_join(th[i], NULL);
                events += w[i].events;
                nlat += w[i].nlat;
            }
            double dt = now_s() - t0;
            double *all = malloc(sizeof(double) * (size_t)(nlat ? nlat : 1));
            int64_t j = 0;
            for (int i = 0; i < nw; i++) {
                memcpy(all + j, w[i].lat, sizeof(double) * (size_t)w[i].nlat);
                j += w[i].nlat;
                free(w[i].lat);
            }
            qsort(all, (size_t)nlat, sizeof(double), cmp_double);
            struct pawl_store_stats st;
            pawl_store_stats(s, &st, 0);
            pawl_store_free(s);
            char extra[128];
            snprintf(extra, sizeof extra, "blocking pawl_append; finalize delay p99 %.2f ms",
                     st.delay_p99_ms);
            csv_row("append", 0, "pawl", ws, bs, events, dt, pct(all, nlat, 0.5),
                    pct(all, nlat, 0.99), pct(all, nlat, 0.999), nlat ? all[nlat - 1] : 0, extra);
            free(all);
        }
    }
}

/* ---- main -------------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_e2e fill|latency|catchup|growth --dsn DSN [--csv FILE]\n"
            "  [--seconds S] [--to N] [--conns N] [--rates a,b] [--segments a,b]\n"
            "  [--workers a,b] [--per-append N] [--batches a,b] [--warmup S] [--split]\n"
            "  latency: [--threads N] (the processor's workers; default: its default)\n"
            "  latency: [--read-dsn STANDBY] [--read-wake listen|poll] (read from a "
            "standby)\n"
            "  append: --workers = writer counts, --rates = events per append\n"
            "  [--latency-share PCT] [--min-interval-us N] (the appending store's finalizer "
            "cadence)\n"
            "  [--finalizer-own-thread] (the appending store's finalizer on a thread of its own, "
            "not on its log connections' loop)\n");
    exit(2);
}

/* optarg as an integer in [lo, hi], or exit 2 saying "FLAG must be LOW to hi". */
static int int_arg(const char *flag, const char *low, int lo, int hi)
{
    int v = atoi(optarg);
    if (v < lo || v > hi) {
        fprintf(stderr, "%s must be %s to %d\n", flag, low, hi);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage();
    const char *cmd = argv[1];
    static const struct option opts[] = {{"dsn", required_argument, NULL, 'd'},
                                         {"csv", required_argument, NULL, 'c'},
                                         {"seconds", required_argument, NULL, 's'},
                                         {"to", required_argument, NULL, 't'},
                                         {"conns", required_argument, NULL, 'n'},
                                         {"rates", required_argument, NULL, 'r'},
                                         {"segments", required_argument, NULL, 'g'},
                                         {"workers", required_argument, NULL, 'w'},
                                         {"per-append", required_argument, NULL, 'p'},
                                         {"batches", required_argument, NULL, 'b'},
                                         {"warmup", required_argument, NULL, 'u'},
                                         {"split", no_argument, NULL, 'S'},
                                         {"threads", required_argument, NULL, 'T'},
                                         {"read-dsn", required_argument, NULL, 'R'},
                                         {"read-wake", required_argument, NULL, 'W'},
                                         {"latency-share", required_argument, NULL, 'L'},
                                         {"min-interval-us", required_argument, NULL, 'I'},
                                         {"finalizer-own-thread", no_argument, NULL, 'F'},
                                         {NULL, 0, NULL, 0}};
    int ch;
    optind = 2;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'd':
            dsn = optarg;
            break;
        case 'c':
            csv_path = optarg;
            break;
        case 's':
            seconds = atof(optarg);
            break;
        case 't':
            fill_to = atoll(optarg);
            break;
        case 'n':
            conns = atoi(optarg);
            break;
        case 'r':
            snprintf(rates_arg, sizeof rates_arg, "%s", optarg);
            break;
        case 'g':
            snprintf(segs_arg, sizeof segs_arg, "%s", optarg);
            break;
        case 'w':
            snprintf(workers_arg, sizeof workers_arg, "%s", optarg);
            break;
        case 'S':
            split_latency = 1;
            break;
        case 'R':
            read_dsn = optarg;
            break;
        case 'W':
            if (strcmp(optarg, "listen") != 0 && strcmp(optarg, "poll") != 0) {
                fprintf(stderr, "--read-wake is listen or poll\n");
                exit(2);
            }
            read_wake = strcmp(optarg, "poll") == 0 ? PAWL_READ_WAKE_POLL : PAWL_READ_WAKE_LISTEN;
            break;
        case 'L':
            lat_share = int_arg("--latency-share", "0", 0, 100);
            break;
        case 'I':
            min_iv_us = int_arg("--min-interval-us", "0", 0, 1000000);
            break;
        case 'F':
            fin_own_thread = 1;
            break;
        case 'T':
            lat_threads = int_arg("--threads", "0 (one per CPU)", 0, 256);
            break;
        case 'p':
            per_append = atoi(optarg);
            break;
        case 'u':
            warmup_s = atof(optarg);
            break;
        case 'b':
            snprintf(batches_arg, sizeof batches_arg, "%s", optarg);
            break;
        default:
            usage();
        }
    }
    if (dsn == NULL || seconds <= 0 || per_append < 1 || per_append > 100)
        usage();
    pawl_log_set_level(PAWL_LOG_WARN);
    char err[512];
    if (pawl_schema_migrate(dsn, err, sizeof err) != 0)
        die("schema", err);
    if (strcmp(cmd, "fill") == 0)
        cmd_fill();
    else if (strcmp(cmd, "latency") == 0)
        cmd_latency();
    else if (strcmp(cmd, "catchup") == 0)
        cmd_catchup();
    else if (strcmp(cmd, "growth") == 0)
        cmd_growth();
    else if (strcmp(cmd, "append") == 0)
        cmd_append();
    else
        usage();
    return 0;
}
