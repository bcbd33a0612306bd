/*
 * bench_baselines — the append workload against the two baseline designs that pawl's own
 * finalizer is compared with (the SQL files in bench/baselines/):
 *
 *   ascending  a plain identity column, no finalizer: the gap-prone design and the ceiling;
 *   renumber   the reference design: negative temporary ids, and one finalizer that rewrites
 *              every committed event row to the next positive numbers under an advisory
 *              try-lock, signalled after every committed append (as a background thread would
 *              be), with a safety run when no signal comes. --min-interval-ms gives it a
 *              cadence instead (the prototype figures in DESIGN.md used 1 ms).
 *
 * For every design x connection count x events per append it reloads the design's SQL (a fresh,
 * empty table), runs N appender threads (one blocking libpq connection each, one prepared
 * multi-row INSERT per append, autocommit) for the given time, and prints CSV rows in the
 * format the peer benchmarks use:
 *
 *   system,workload,writers,events_per_append,events,seconds,events_per_s,p50_ms,p99_ms,p999_ms,max_ms
 *
 * with workload "append" (latency = one append, send to commit acknowledgement) and, for the
 * renumbering design, "finalize-delay": the time from an append's commit acknowledgement to the
 * commit acknowledgement of the finalizer run that covered it; events/seconds of that row are
 * the events finalized and the time until the last of them was (so a finalizer that falls
 * behind shows a lower rate than the appends). After the appenders stop, the finalizer drains
 * what is left (bounded by --drain-s) before the delay is computed.
 *
 * How a delay is attributed: each append is charged to the first finalizer run *sent* after the
 * append's commit was acknowledged. That run certainly covers it (its snapshot is taken after
 * the commit). An append that committed between a run's send and its snapshot was in fact
 * covered one run earlier, so the figure is an upper bound, tight to within one run.
 *
 * Threads: the main thread parses flags, sets up each configuration and computes the figures;
 * appender threads and the finalizer thread touch only their own connection and buffers, plus
 * the signal (mutex + condition variable) and the stop flags below.
 */
#include "common.h"
#include "pawl.h"

#include <errno.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_BATCH 1000
#define STREAMS_PER_WRITER 100
#define PAYLOAD_LEN 100
#define MAX_LIST 8

enum design { D_ASCENDING, D_RENUMBER };
static const char *const design_name[] = {"ascending", "renumber"};

struct opts {
    const char *dsn;
    const char *sql_dir;
    bool design[2];
    int conns[MAX_LIST], n_conns;
    int batch[MAX_LIST], n_batch;
    double seconds;
    double drain_s;
    int safety_ms;
    int min_interval_ms;
    bool header;
};

/* A growable array of int64 (times in ns) or doubles (latencies in ms). */
struct vec {
    void *v;
    size_t n, cap, size;
};

static int vec_push(struct vec *a, const void *x)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 4096;
        void *v = realloc(a->v, cap * a->size);
        if (!v)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    memcpy((char *)a->v + a->n * a->size, x, a->size);
    a->n++;
    return 0;
}

struct fin_run {
    int64_t send_ns, end_ns;
    int64_t renumbered;
};

struct run;

struct appender {
    pthread_t thread;
    int id;
    struct run *run;
    PGconn *conn;
    struct vec lat_ms; /* double per append */
    struct vec ack_ns; /* int64 per append */
    int64_t events;
    int64_t seq[STREAMS_PER_WRITER];
};

struct run {
    const struct opts *o;
    enum design design;
    int conns, batch;
    int64_t start_ns, deadline_ns;
    pthread_barrier_t barrier;
    struct appender *app;

    /* Set by whichever thread fails first; everyone checks it between statements. */
    atomic_bool failed;
    char err[512];
    pthread_mutex_t err_lock;

    /* The finalizer's signal: appenders set `signalled` after each commit. */
    pthread_mutex_t sig_lock;
    pthread_cond_t sig_cond;
    bool signalled;
    /* Set by the main thread once every appender has returned: the finalizer drains and ends. */
    atomic_bool appenders_done;
    int64_t last_ack_ns; /* written by main before appenders_done is set */
    pthread_t fin_thread;
    PGconn *fin_conn;
    struct vec runs; /* struct fin_run */
    bool drained;
};

static void fail(struct run *r, const char *what, PGconn *c)
{
    pthread_mutex_lock(&r->err_lock);
    if (!atomic_load(&r->failed)) {
        snprintf(r->err, sizeof r->err, "%s: %s", what, c ? PQerrorMessage(c) : strerror(errno));
        /* Release: the message above is complete before anyone sees the flag. */
        atomic_store_explicit(&r->failed, true, memory_order_release);
    }
    pthread_mutex_unlock(&r->err_lock);
}

static double ms_between(int64_t a_ns, int64_t b_ns)
{
    return (double)(b_ns - a_ns) / 1e6;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        buf = malloc((size_t)n + 1);
        if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        }
        if (buf)
            buf[n] = '\0';
    }
    fclose(f);
    return buf;
}

static PGconn *connect_db(const char *dsn)
{
    PGconn *c = PQconnectdb(dsn);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "bench_baselines: cannot connect: %s", PQerrorMessage(c));
        PQfinish(c);
        return NULL;
    }
    return c;
}

static bool exec_ok(PGconn *c, const char *sql)
{
    PGresult *res = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(res);
    bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
    if (!ok)
        fprintf(stderr, "bench_baselines: %.60s...: %s", sql, PQerrorMessage(c));
    PQclear(res);
    return ok;
}

/* The multi-row INSERT for one append of `batch` events into the design's table. */
static char *insert_sql(enum design d, int batch)
{
    size_t cap = 128 + (size_t)batch * 48;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    size_t n = (size_t)snprintf(s, cap,
                                "INSERT INTO bl_%s.events (stream_id, stream_seq, type, payload) "
                                "VALUES ",
                                design_name[d]);
    for (int i = 0; i < batch; i++)
        n += (size_t)snprintf(s + n, cap - n, "%s($%d, $%d, $%d, $%d)", i ? ", " : "", 4 * i + 1,
                              4 * i + 2, 4 * i + 3, 4 * i + 4);
    return s;
}

static void signal_finalizer(struct run *r)
{
    pthread_mutex_lock(&r->sig_lock);
    r->signalled = true;
    pthread_cond_signal(&r->sig_cond);
    pthread_mutex_unlock(&r->sig_lock);
}

static void *appender_main(void *arg)
{
    struct appender *a = arg;
    struct run *r = a->run;
    const int batch = r->batch;
    char streams[STREAMS_PER_WRITER][24];
    char seqs[MAX_BATCH][24];
    unsigned char payload[PAYLOAD_LEN];
    const char *values[4 * MAX_BATCH];
    int lengths[4 * MAX_BATCH];
    int formats[4 * MAX_BATCH];

    for (int s = 0; s < STREAMS_PER_WRITER; s++)
        snprintf(streams[s], sizeof streams[s], "w%d-s%d", a->id, s);
    for (int i = 0; i < PAYLOAD_LEN; i++)
        payload[i] = (unsigned char)('a' + (i + a->id) % 26);
    for (int i = 0; i < batch; i++) {
        values[4 * i + 2] = "BenchEvent";
        values[4 * i + 3] = (const char *)payload;
        lengths[4 * i + 3] = PAYLOAD_LEN;
        formats[4 * i] = formats[4 * i + 1] = formats[4 * i + 2] = 0;
        formats[4 * i + 3] = 1; /* the payload travels as binary bytea */
        lengths[4 * i] = lengths[4 * i + 1] = lengths[4 * i + 2] = 0;
    }

    pthread_barrier_wait(&r->barrier);
    for (int64_t n = 0; !atomic_load_explicit(&r->failed, memory_order_acquire); n++) {
        int64_t t0 = pawl_now_ns();
        if (t0 >= r->deadline_ns)
            break;
        int s = (int)(n % STREAMS_PER_WRITER);
        for (int i = 0; i < batch; i++) {
            snprintf(seqs[i], sizeof seqs[i], "%lld", (long long)(a->seq[s] + 1 + i));
            values[4 * i] = streams[s];
            values[4 * i + 1] = seqs[i];
        }
        PGresult *res = PQexecPrepared(a->conn, "append", 4 * batch, values, lengths, formats, 0);
        int64_t t1 = pawl_now_ns();
        bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;
        PQclear(res);
        if (!ok) {
            fail(r, "append", a->conn);
            break;
        }
        a->seq[s] += batch;
        a->events += batch;
        double lat = ms_between(t0, t1);
        if (vec_push(&a->lat_ms, &lat) || vec_push(&a->ack_ns, &t1)) {
            fail(r, "out of memory", NULL);
            break;
        }
        if (r->design == D_RENUMBER)
            signal_finalizer(r);
    }
    return NULL;
}

/*
 * The finalizer: wait for a signal (or the safety period), run finalize() once for everything
 * pending, record when the run was sent and when its commit came back. After the appenders are
 * done it keeps going until a run sent after the last acknowledgement finds nothing left, or
 * the drain time runs out.
 */
static void *finalizer_main(void *arg)
{
    struct run *r = arg;
    int64_t drain_deadline = 0;

    while (!atomic_load_explicit(&r->failed, memory_order_acquire)) {
        bool done = atomic_load_explicit(&r->appenders_done, memory_order_acquire);
        if (!done) {
            struct timespec ts;
            pawl__timespec_in(&ts, CLOCK_REALTIME, (int64_t)r->o->safety_ms * 1000000);
            pthread_mutex_lock(&r->sig_lock);
            while (!r->signalled && !atomic_load(&r->appenders_done))
                if (pthread_cond_timedwait(&r->sig_cond, &r->sig_lock, &ts) == ETIMEDOUT)
                    break;
            r->signalled = false;
            pthread_mutex_unlock(&r->sig_lock);
        } else if (!drain_deadline) {
            drain_deadline = pawl_now_ns() + (int64_t)(r->o->drain_s * 1e9);
        }

        struct fin_run fr = {.send_ns = pawl_now_ns()};
        PGresult *res =
            PQexec(r->fin_conn, "SELECT renumbered, last_final FROM bl_renumber.finalize()");
        fr.end_ns = pawl_now_ns();
        if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
            PQclear(res);
            fail(r, "finalize", r->fin_conn);
            break;
        }
        fr.renumbered = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        PQclear(res);
        if (fr.renumbered < 0) {
            /* Someone else holds the lock; it may have started before our rows committed. */
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
            continue;
        }
        if (vec_push(&r->runs, &fr)) {
            fail(r, "out of memory", NULL);
            break;
        }
        if (r->o->min_interval_ms > 0) {
            /* A cadence: signals that arrive meanwhile are served by the next run. */
            int64_t wait_ns = fr.send_ns + (int64_t)r->o->min_interval_ms * 1000000 - pawl_now_ns();
            if (wait_ns > 0) {
                struct timespec ts = {wait_ns / 1000000000, wait_ns % 1000000000};
                nanosleep(&ts, NULL);
            }
        }
        if (done) {
            if (fr.renumbered == 0 && fr.send_ns > r->last_ack_ns) {
                r->drained = true;
                break;
            }
            if (fr.end_ns > drain_deadline)
                break;
        }
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of a sorted array. */
static double pct(const double *s, size_t n, double q)
{
    if (n == 0)
        return 0;
    size_t rank = (size_t)(q * (double)n + 0.999999999);
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return s[rank - 1];
}

static void print_row(const char *system, const char *workload, int writers, int epa,
                      int64_t events, double seconds, double *lat, size_t n)
{
    qsort(lat, n, sizeof *lat, cmp_double);
    printf("%s,%s,%d,%d,%lld,%.3f,%.1f,", system, workload, writers, epa, (long long)events,
           seconds, seconds > 0 ? (double)events / seconds : 0.0);
    if (n)
        printf("%.3f,%.3f,%.3f,%.3f\n", pct(lat, n, 0.5), pct(lat, n, 0.99), pct(lat, n, 0.999),
               lat[n - 1]);
    else
        printf(",,,\n");
    fflush(stdout);
}

static int run_one(const struct opts *o, enum design d, int conns, int batch)
{
    int rc = -1;
    struct run r = {.o = o, .design = d, .conns = conns, .batch = batch};
    char system[32];
    snprintf(system, sizeof system, "baseline-%s", design_name[d]);
    r.runs.size = sizeof(struct fin_run);
    pthread_mutex_init(&r.err_lock, NULL);
    pthread_mutex_init(&r.sig_lock, NULL);
    pthread_cond_init(&r.sig_cond, NULL);
    atomic_init(&r.failed, false);
    atomic_init(&r.appenders_done, false);
    int started = 0;
    bool fin_started = false, barrier = false;
    char *sql = NULL, *ins = NULL;
    struct vec lat = {.size = sizeof(double)}, acks = {.size = sizeof(int64_t)};
    struct vec delays = {.size = sizeof(double)};

    /* A fresh, empty schema for every configuration, and a checkpoint so that none lands in
     * the middle of the measurement (skipped where the user may not checkpoint). */
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.sql", o->sql_dir, design_name[d]);
    sql = read_file(path);
    if (!sql) {
        fprintf(stderr, "bench_baselines: cannot read %s: %s\n", path, strerror(errno));
        goto out;
    }
    PGconn *admin = connect_db(o->dsn);
    if (!admin)
        goto out;
    bool loaded = exec_ok(admin, "SET client_min_messages = warning") && exec_ok(admin, sql);
    PGresult *cp = PQexec(admin, "CHECKPOINT");
    PQclear(cp);
    PQfinish(admin);
    if (!loaded)
        goto out;

    ins = insert_sql(d, batch);
    r.app = calloc((size_t)conns, sizeof *r.app);
    if (!ins || !r.app)
        goto out;
    for (int i = 0; i < conns; i++) {
        struct appender *a = &r.app[i];
        a->id = i;
        a->run = &r;
        a->lat_ms.size = sizeof(double);
        a->ack_ns.size = sizeof(int64_t);
        if (!(a->conn = connect_db(o->dsn)))
            goto out;
        PGresult *res = PQprepare(a->conn, "append", ins, 0, NULL);
        bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;
        PQclear(res);
        if (!ok) {
            fprintf(stderr, "bench_baselines: prepare: %s", PQerrorMessage(a->conn));
            goto out;
        }
    }
    if (d == D_RENUMBER && !(r.fin_conn = connect_db(o->dsn)))
        goto out;

    pthread_barrier_init(&r.barrier, NULL, (unsigned)conns + 1);
    barrier = true;
    for (; started < conns; started++) {
        if (pthread_create(&r.app[started].thread, NULL, appender_main, &r.app[started])) {
            /* The threads already started wait at the barrier for all of them: no way back. */
            fprintf(stderr, "bench_baselines: cannot start a thread: %s\n", strerror(errno));
            exit(1);
        }
    }
    r.start_ns = pawl_now_ns();
    r.deadline_ns = r.start_ns + (int64_t)(o->seconds * 1e9);
    if (d == D_RENUMBER && !atomic_load(&r.failed)) {
        if (pthread_create(&r.fin_thread, NULL, finalizer_main, &r) == 0)
            fin_started = true;
        else
            fail(&r, "pthread_create", NULL);
    }
    /* The appenders read start and deadline only after this barrier (it orders the stores). */
    pthread_barrier_wait(&r.barrier);
    for (int i = 0; i < started; i++)
        pthread_join(r.app[i].thread, NULL);
    int64_t end_ns = pawl_now_ns();

    int64_t events = 0;
    for (int i = 0; i < conns; i++) {
        struct appender *a = &r.app[i];
        events += a->events;
        for (size_t k = 0; k < a->lat_ms.n; k++)
            if (vec_push(&lat, (double *)a->lat_ms.v + k))
                goto out;
        for (size_t k = 0; k < a->ack_ns.n; k++)
            if (vec_push(&acks, (int64_t *)a->ack_ns.v + k))
                goto out;
    }
    qsort(acks.v, acks.n, sizeof(int64_t), cmp_i64);
    r.last_ack_ns = acks.n ? ((int64_t *)acks.v)[acks.n - 1] : 0;
    /* Release: last_ack_ns is written before the finalizer can see appenders_done. */
    atomic_store_explicit(&r.appenders_done, true, memory_order_release);
    signal_finalizer(&r);
    if (fin_started) {
        pthread_join(r.fin_thread, NULL);
        fin_started = false;
    }
    if (atomic_load(&r.failed)) {
        fprintf(stderr, "bench_baselines: %s %d x %d: %s", system, conns, batch, r.err);
        goto out;
    }

    double seconds = ms_between(r.start_ns, end_ns) / 1e3;
    print_row(system, "append", conns, batch, events, seconds, lat.v, lat.n);

    if (d == D_RENUMBER) {
        const struct fin_run *runs = r.runs.v;
        size_t k = 0, uncovered = 0;
        int64_t last_end = r.start_ns, finalized = 0, busy_ns = 0;
        for (size_t j = 0; j < r.runs.n; j++) {
            finalized += runs[j].renumbered;
            busy_ns += runs[j].end_ns - runs[j].send_ns;
            if (runs[j].renumbered > 0)
                last_end = runs[j].end_ns;
        }
        for (size_t i = 0; i < acks.n; i++) {
            int64_t ack = ((int64_t *)acks.v)[i];
            while (k < r.runs.n && runs[k].send_ns <= ack)
                k++;
            double dl;
            if (k < r.runs.n) {
                dl = ms_between(ack, runs[k].end_ns);
            } else {
                uncovered++;
                dl = ms_between(ack, pawl_now_ns()); /* a lower bound: not finalized yet */
            }
            if (vec_push(&delays, &dl))
                goto out;
        }
        fprintf(stderr,
                "bench_baselines: %s %d x %d: %zu finalizer runs, %.1f rows per run, "
                "finalizer busy %.0f%% of the time, %s\n",
                system, conns, batch, r.runs.n,
                r.runs.n ? (double)finalized / (double)r.runs.n : 0.0,
                PAWL_MIN(100.0, 100.0 * (double)busy_ns / (double)(last_end - r.start_ns + 1)),
                r.drained ? "drained" : "NOT drained within --drain-s");
        if (uncovered)
            fprintf(stderr, "bench_baselines: %zu appends were not finalized in time\n", uncovered);
        print_row(system, "finalize-delay", conns, batch, finalized,
                  ms_between(r.start_ns, last_end) / 1e3, delays.v, delays.n);
    }
    rc = 0;

out:
    if (fin_started) {
        atomic_store(&r.failed, true);
        signal_finalizer(&r);
        pthread_join(r.fin_thread, NULL);
    }
    if (r.app) {
        for (int i = 0; i < conns; i++) {
            PQfinish(r.app[i].conn);
            free(r.app[i].lat_ms.v);
            free(r.app[i].ack_ns.v);
        }
        free(r.app);
    }
    if (barrier)
        pthread_barrier_destroy(&r.barrier);
    PQfinish(r.fin_conn);
    free(r.runs.v);
    free(lat.v);
    free(acks.v);
    free(delays.v);
    free(ins);
    free(sql);
    pthread_cond_destroy(&r.sig_cond);
    pthread_mutex_destroy(&r.sig_lock);
    pthread_mutex_destroy(&r.err_lock);
    return rc;
}

static int parse_list(const char *s, int *out, int max, int lo, int hi)
{
    int n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < lo || v > hi || n == max)
            return -1;
        out[n++] = (int)v;
        s = end;
        if (*s == ',')
            s++;
        else if (*s)
            return -1;
    }
    return n;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench_baselines [--dsn DSN] [--design ascending,renumber] [--conns 1,4,8]\n"
            "                       [--batch 1,100] [--seconds S] [--drain-s S] [--safety-ms MS]\n"
            "                       [--min-interval-ms MS] [--sql-dir DIR] [--quick] [--header]\n"
            "  DSN defaults to $PAWL_DSN; DIR to bench/baselines in the source tree. Each\n"
            "  configuration drops and recreates the schemas\n"
            "  bl_ascending / bl_renumber in that database. --quick: 2 s runs at 1 and 4\n"
            "  connections. The finalizer runs as soon as an append signals it, at most once\n"
            "  per --min-interval-ms (default 0: no cadence), and at least every --safety-ms.\n"
            "  Prints CSV rows on stdout, notes on stderr.\n");
}

int main(int argc, char **argv)
{
    struct opts o = {
        .dsn = getenv("PAWL_DSN"),
        .sql_dir = NULL,
        .design = {true, true},
        .conns = {1, 4, 8},
        .n_conns = 3,
        .batch = {1, 100},
        .n_batch = 2,
        .seconds = 10,
        .drain_s = 30,
        .safety_ms = 100,
    };
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = true;
        if (!strcmp(k, "--dsn") && v) {
            o.dsn = v;
        } else if (!strcmp(k, "--sql-dir") && v) {
            o.sql_dir = v;
        } else if (!strcmp(k, "--design") && v) {
            o.design[0] = strstr(v, "ascending") != NULL;
            o.design[1] = strstr(v, "renumber") != NULL;
            if (!o.design[0] && !o.design[1])
                goto bad;
        } else if (!strcmp(k, "--conns") && v) {
            if ((o.n_conns = parse_list(v, o.conns, MAX_LIST, 1, 256)) <= 0)
                goto bad;
        } else if (!strcmp(k, "--batch") && v) {
            if ((o.n_batch = parse_list(v, o.batch, MAX_LIST, 1, MAX_BATCH)) <= 0)
                goto bad;
        } else if (!strcmp(k, "--seconds") && v) {
            if ((o.seconds = atof(v)) <= 0)
                goto bad;
        } else if (!strcmp(k, "--drain-s") && v) {
            if ((o.drain_s = atof(v)) <= 0)
                goto bad;
        } else if (!strcmp(k, "--min-interval-ms") && v) {
            if ((o.min_interval_ms = atoi(v)) < 0)
                goto bad;
        } else if (!strcmp(k, "--safety-ms") && v) {
            if ((o.safety_ms = atoi(v)) <= 0)
                goto bad;
        } else {
            takes = false;
            if (!strcmp(k, "--quick")) {
                o.seconds = 2;
                o.conns[0] = 1;
                o.conns[1] = 4;
                o.n_conns = 2;
            } else if (!strcmp(k, "--header")) {
                o.header = true;
            } else if (!strcmp(k, "-h") || !strcmp(k, "--help")) {
                usage(stdout);
                return 0;
            } else {
                goto bad;
            }
        }
        if (takes)
            i++;
    }
    char sql_dir[4096];
    if (!o.sql_dir) {
        /* The SQL files sit in the source tree next to this file's folder: bench/baselines. The
         * build passes the source's full path, so __FILE__ finds them from any directory. */
        snprintf(sql_dir, sizeof sql_dir, "%s", __FILE__);
        char *slash = strrchr(sql_dir, '/');
        if (slash)
            snprintf(slash, sizeof sql_dir - (size_t)(slash - sql_dir), "/../baselines");
        else
            snprintf(sql_dir, sizeof sql_dir, "../baselines");
        o.sql_dir = sql_dir;
    }
    if (!o.dsn) {
        fprintf(stderr, "bench_baselines: no database: pass --dsn or set PAWL_DSN\n");
        return 2;
    }
    if (o.header)
        printf("system,workload,writers,events_per_append,events,seconds,events_per_s,"
               "p50_ms,p99_ms,p999_ms,max_ms\n");
    /* The designs run back to back for each configuration, so that the two rows being compared
     * saw the same machine (other work on a shared machine drifts over minutes). */
    for (int b = 0; b < o.n_batch; b++)
        for (int c = 0; c < o.n_conns; c++)
            for (int d = 0; d < 2; d++)
                if (o.design[d] && run_one(&o, (enum design)d, o.conns[c], o.batch[b]))
                    return 1;
    return 0;

bad:
    usage(stderr);
    return 2;
}
