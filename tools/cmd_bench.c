/*
 * cmd_bench.c — `pawl bench`: the append path under load, cell by cell. Each cell runs the load
 * generator (tools/load.c) for --duration with one follower reading the log, and reports the
 * achieved append rate, append latency, finalize delay and end-to-end lag. The cells are the
 * product of --events-per-append {1, 10, 100} and --appenders {1, 4}; a dimension given
 * explicitly (flag or environment) is held at that value. --rate left at its default means "as
 * fast as possible" here. --csv FILE also writes the results as CSV, and a bar chart next to it
 * (FILE with .png) when gnuplot is installed.
 */
#include "load.h"
#include "progress.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct cell_result {
    int epa, appenders;
    double secs, events_per_s;
    int64_t events, errors;
    int64_t lat_p50, lat_p99, e2e_p50, e2e_p99;
    double fin_p50_ms, fin_p99_ms;
};

struct bench_follower {
    struct pawl_store *s;
    pthread_t th;
    _Atomic int stop;
    int64_t after;
};

static void *bench_follow(void *arg)
{
    struct bench_follower *f = arg;
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    /* Relaxed: a stop request. */
    while (!atomic_load_explicit(&f->stop, memory_order_relaxed)) {
        if (pawl_follow(f->s, f->after, 1000, &b, 100) != 0)
            continue;
        int64_t now_us = pawl_wall_us();
        for (size_t i = 0; i < b.count; i++)
            pawl_metrics_hist_observe(PAWL_H_E2E_LAG, (now_us - b.events[i].appended_at_us) * 1000);
        if (b.count)
            f->after = b.events[b.count - 1].index;
    }
    pawl_read_batch_fini(&b);
    return NULL;
}

static int run_cell(struct tool_config *cfg, struct pawl_store *s, struct cell_result *r)
{
    struct pawl_metrics_snapshot *snap = calloc(1, sizeof *snap);
    if (snap == NULL)
        return PAWL_ENOMEM;
    struct bench_follower f = {.s = s};
    pawl_finalize_now(s, NULL, NULL, &f.after);
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 1); /* start the latency figures over */
    pawl_metrics_reset();
    if (pthread_create(&f.th, NULL, bench_follow, &f) != 0) {
        free(snap);
        return PAWL_ESYS;
    }
    struct tool_load load;
    int rc = tool_load_start(&load, s, cfg);
    if (rc == 0) {
        struct tool_progress prog;
        tool_progress_init(&prog, cfg);
        while (!tool_stop && !tool_load_done(&load)) {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
            if (tool_progress_due(&prog)) {
                double el = (double)(pawl_now_ns() - load.start_ns) / 1e9;
                char a[32];
                tool_progress_show(
                    &prog, "cell %d x %d: %s events/s so far", r->epa, r->appenders,
                    tool_fmt_count((double)atomic_load(&load.events) / el, a, sizeof a));
            }
        }
        tool_load_stop(&load);
        tool_progress_done(&prog);
        r->secs = (double)(pawl_now_ns() - load.start_ns) / 1e9;
        r->events = atomic_load(&load.events);
        r->errors = atomic_load(&load.errors);
        r->events_per_s = (double)r->events / (r->secs > 0 ? r->secs : 1);
    }
    /* Give the follower a moment to read the tail of the run. */
    struct timespec ts = {0, 300 * 1000000L};
    nanosleep(&ts, NULL);
    atomic_store(&f.stop, 1);
    pthread_join(f.th, NULL);
    pawl_metrics_snapshot(snap);
    pawl_store_stats(s, &st, 0);
    r->lat_p50 = pawl_metrics_quantile_ns(&snap->hists[PAWL_H_APPEND_LATENCY], 0.5);
    r->lat_p99 = pawl_metrics_quantile_ns(&snap->hists[PAWL_H_APPEND_LATENCY], 0.99);
    r->e2e_p50 = pawl_metrics_quantile_ns(&snap->hists[PAWL_H_E2E_LAG], 0.5);
    r->e2e_p99 = pawl_metrics_quantile_ns(&snap->hists[PAWL_H_E2E_LAG], 0.99);
    r->fin_p50_ms = st.delay_p50_ms;
    r->fin_p99_ms = st.delay_p99_ms;
    free(snap);
    return rc;
}

static void write_plot(const char *csv)
{
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        fprintf(stderr, "pawl: gnuplot is not installed; no chart\n");
        return;
    }
    char png[4200], script[9000];
    snprintf(png, sizeof png, "%s", csv);
    char *dot = strrchr(png, '.');
    if (dot && strchr(dot, '/') == NULL)
        *dot = '\0';
    strncat(png, ".png", sizeof png - strlen(png) - 1);
    snprintf(
        script, sizeof script,
        "set terminal png size 900,500; set output '%s'; set datafile separator ',';"
        "set style data histogram; set style fill solid 0.8; set boxwidth 0.8;"
        "set ylabel 'events/s'; set y2label 'p99 ms'; set y2tics; set xtics rotate by -30;"
        "set key top left autotitle columnhead; set title 'pawl bench: append rate and latency';"
        "plot '%s' using 5:xtic(stringcolumn(1).'x'.stringcolumn(2)) title 'events/s',"
        " '' using 0:($8/1e6) axes x1y2 with linespoints title 'append p99 (ms)'",
        png, csv);
    pid_t pid = fork();
    if (pid == 0) {
        execlp("gnuplot", "gnuplot", "-e", script, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        fprintf(stderr, "pawl: chart written to %s\n", png);
    else
        fprintf(stderr, "pawl: gnuplot failed; no chart\n");
}

int cmd_bench(struct tool_config *cfg, int argc, const char *const *argv)
{
    if (argc > 0) {
        tool_err("bench: unexpected argument '%s'", argv[0]);
        return TOOL_USAGE;
    }
    if (cfg->metrics_port > 0) {
        /* Each cell resets the metrics registry: counters would go backwards under a scraper. */
        tool_err("bench: --metrics-port is not served by bench (it resets the metrics between "
                 "its cells); serve them from `pawl append --generate` or `pawl demo` instead");
        return TOOL_USAGE;
    }
    int epas[] = {1, 10, 100}, apps[] = {1, 4};
    int nepa = 3, napp = 2;
    if (tool_config_source_of(cfg, "events-per-append") != PAWL_SRC_DEFAULT) {
        epas[0] = cfg->tool.events_per_append;
        nepa = 1;
    }
    if (tool_config_source_of(cfg, "appenders") != PAWL_SRC_DEFAULT) {
        apps[0] = cfg->tool.appenders;
        napp = 1;
    }
    if (tool_config_source_of(cfg, "rate") == PAWL_SRC_DEFAULT)
        cfg->tool.rate = 0;
    const char *dsn = tool_dsn(cfg);
    if (dsn == NULL)
        return TOOL_NODB;
    char err[512] = "";
    if (pawl_schema_migrate(dsn, err, sizeof err) != 0) {
        tool_err("bench: cannot set up the schema: %s", err);
        return TOOL_NODB;
    }
    struct pawl_store *s = NULL;
    int rc = pawl_store_new(&s, dsn, &cfg->lib.store, err, sizeof err);
    if (rc != 0) {
        tool_err("bench: cannot open the event log: %s", err);
        return tool_exit_for(rc) == TOOL_USAGE ? TOOL_USAGE : TOOL_NODB;
    }
    FILE *csv = NULL;
    if (cfg->tool.csv) {
        csv = fopen(cfg->tool.csv, "w");
        if (csv == NULL) {
            tool_err("bench: cannot write %s", cfg->tool.csv);
            pawl_store_free(s);
            return TOOL_FAILED;
        }
        fprintf(csv, "events_per_append,appenders,seconds,events,events_per_s,errors,"
                     "append_p50_ns,append_p99_ns,e2e_p50_ns,e2e_p99_ns,finalize_p50_ms,"
                     "finalize_p99_ms\n");
    }
    char rate[32], dur[32];
    fprintf(stderr, "pawl bench: %d cell(s) of %s each, rate %s, %d-byte payloads\n", nepa * napp,
            tool_fmt_secs((double)cfg->tool.duration_ms / 1e3, dur, sizeof dur),
            cfg->tool.rate > 0 ? tool_fmt_count(cfg->tool.rate, rate, sizeof rate) : "max",
            cfg->tool.payload_bytes);
    printf("%-10s %-9s %-12s %-11s %-11s %-11s %-11s %-12s %-12s %s\n", "EV/APPEND", "APPENDERS",
           "EVENTS/S", "APPEND-P50", "APPEND-P99", "E2E-P50", "E2E-P99", "FINAL-P50", "FINAL-P99",
           "ERRORS");
    int ex = TOOL_OK;
    for (int i = 0; i < nepa && !tool_stop; i++) {
        for (int j = 0; j < napp && !tool_stop; j++) {
            struct cell_result r = {.epa = epas[i], .appenders = apps[j]};
            cfg->tool.events_per_append = epas[i];
            cfg->tool.appenders = apps[j];
            if (run_cell(cfg, s, &r) != 0) {
                tool_err("bench: cell %d x %d failed to start", epas[i], apps[j]);
                ex = TOOL_FAILED;
                continue;
            }
            char a[32], b[32], c[32], d[32], e[32];
            printf("%-10d %-9d %-12s %-11s %-11s %-11s %-11s %-12.1f %-12.1f %" PRId64 "\n", r.epa,
                   r.appenders, tool_fmt_count(r.events_per_s, a, sizeof a),
                   tool_fmt_ns(r.lat_p50, b, sizeof b), tool_fmt_ns(r.lat_p99, c, sizeof c),
                   tool_fmt_ns(r.e2e_p50, d, sizeof d), tool_fmt_ns(r.e2e_p99, e, sizeof e),
                   r.fin_p50_ms, r.fin_p99_ms, r.errors);
            fflush(stdout);
            if (csv)
                fprintf(csv,
                        "%d,%d,%.3f,%" PRId64 ",%.1f,%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64
                        ",%" PRId64 ",%.3f,%.3f\n",
                        r.epa, r.appenders, r.secs, r.events, r.events_per_s, r.errors, r.lat_p50,
                        r.lat_p99, r.e2e_p50, r.e2e_p99, r.fin_p50_ms, r.fin_p99_ms);
            if (r.errors > 0)
                ex = TOOL_FAILED;
        }
    }
    if (csv) {
        fclose(csv);
        write_plot(cfg->tool.csv);
    }
    pawl_store_free(s);
    return ex;
}
