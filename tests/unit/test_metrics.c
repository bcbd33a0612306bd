/*
 * test_metrics.c — the metrics registry: bucket geometry, percentiles, concurrent recording,
 * interval diffs and the Prometheus text.
 */
#include "pawl_test.h"

#include "metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct pawl_metrics_snapshot *snap_new(void)
{
    struct pawl_metrics_snapshot *s = calloc(1, sizeof *s);
    assert_non_null(s);
    return s;
}

static void test_bucket_geometry(void **state)
{
    (void)state;
    uint64_t prev_hi = 0;
    for (unsigned i = 0; i < PAWL_METRICS_BUCKETS; i++) {
        uint64_t lo, hi;
        pawl__metrics_bucket_bounds(i, &lo, &hi);
        if (i > 0)
            assert_int_equal(lo, prev_hi + 1); /* contiguous, no gaps or overlaps */
        assert_true(hi >= lo);
        assert_int_equal(pawl_metrics_bucket(lo), i);
        if (i + 1 < PAWL_METRICS_BUCKETS)
            assert_int_equal(pawl_metrics_bucket(hi), i);
        /* Relative width at most 1/16 above the linear range. */
        if (lo >= 16)
            assert_true((double)(hi - lo + 1) / (double)lo <= 1.0 / 16 + 1e-9);
        prev_hi = hi;
    }
    assert_int_equal(pawl_metrics_bucket(UINT64_MAX), PAWL_METRICS_BUCKETS - 1);
}

static void test_quantiles(void **state)
{
    (void)state;
    pawl_metrics_reset();
    /* 1..10000 µs uniformly: p50 ≈ 5 ms, p99 ≈ 9.9 ms. */
    for (int i = 1; i <= 10000; i++)
        pawl_metric_hist_record(PAWL_H_APPEND_LATENCY, (int64_t)i * 1000);
    pawl_metric_hist_record(PAWL_H_BATCH_TIME, -5); /* negative records as 0 */
    struct pawl_metrics_snapshot *s = snap_new();
    assert_int_equal(pawl_metrics_snapshot(s), 0);
    const struct pawl_metrics_hist *h = &s->hists[PAWL_H_APPEND_LATENCY];
    assert_int_equal(h->count, 10000);
    assert_int_equal(h->max_ns, 10000000);
    assert_int_equal(h->sum_ns, 10000ull * 10001 / 2 * 1000);
    double p50 = (double)pawl_metrics_quantile_ns(h, 0.5);
    double p99 = (double)pawl_metrics_quantile_ns(h, 0.99);
    assert_true(p50 > 5e6 * 0.93 && p50 < 5e6 * 1.07);
    assert_true(p99 > 9.9e6 * 0.93 && p99 < 9.9e6 * 1.07);
    assert_int_equal(pawl_metrics_quantile_ns(h, 1.0), 10000000);
    assert_int_equal(s->hists[PAWL_H_BATCH_TIME].count, 1);
    assert_int_equal(pawl_metrics_quantile_ns(&s->hists[PAWL_H_BATCH_TIME], 0.5), 0);
    assert_int_equal(pawl_metrics_quantile_ns(&s->hists[PAWL_H_E2E_LAG], 0.5), 0);
    free(s);
}

#define THREADS 4
#define PER_THREAD 50000

static void *recorder(void *arg)
{
    (void)arg;
    for (int i = 0; i < PER_THREAD; i++) {
        pawl_metric_inc(PAWL_M_EVENTS_HANDLED);
        pawl_metric_add(PAWL_M_EVENTS_APPENDED, 2);
        pawl_metric_hist_record(PAWL_H_E2E_LAG, i);
        pawl_metric_gauge_add(PAWL_G_CLAIMS_HELD, 1);
        pawl_metric_gauge_add(PAWL_G_CLAIMS_HELD, -1);
        pawl_metric_gauge_max(PAWL_G_LAST_FINALIZED_INDEX, i);
    }
    return NULL;
}

static void test_concurrent_recording(void **state)
{
    (void)state;
    pawl_metrics_reset();
    pthread_t t[THREADS];
    struct pawl_metrics_snapshot *mid = snap_new(), *end = snap_new(), *d = snap_new();
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, recorder, NULL), 0);
    /* A snapshot taken while recording runs is consistent with itself. */
    pawl_metrics_snapshot(mid);
    uint64_t n = 0;
    for (unsigned b = 0; b < PAWL_METRICS_BUCKETS; b++)
        n += mid->hists[PAWL_H_E2E_LAG].buckets[b];
    assert_int_equal(n, mid->hists[PAWL_H_E2E_LAG].count);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    pawl_metrics_snapshot(end);
    assert_int_equal(end->counters[PAWL_M_EVENTS_HANDLED], THREADS * PER_THREAD);
    assert_int_equal(end->counters[PAWL_M_EVENTS_APPENDED], 2 * THREADS * PER_THREAD);
    assert_int_equal(end->hists[PAWL_H_E2E_LAG].count, THREADS * PER_THREAD);
    assert_int_equal(end->hists[PAWL_H_E2E_LAG].max_ns, PER_THREAD - 1);
    assert_int_equal(end->gauges[PAWL_G_CLAIMS_HELD], 0);
    assert_int_equal(end->gauges[PAWL_G_LAST_FINALIZED_INDEX], PER_THREAD - 1);

    assert_int_equal(pawl_metrics_diff(d, end, mid), 0);
    assert_int_equal(d->counters[PAWL_M_EVENTS_HANDLED],
                     end->counters[PAWL_M_EVENTS_HANDLED] - mid->counters[PAWL_M_EVENTS_HANDLED]);
    assert_int_equal(d->hists[PAWL_H_E2E_LAG].count,
                     end->hists[PAWL_H_E2E_LAG].count - mid->hists[PAWL_H_E2E_LAG].count);
    /* Aliasing out and now works. */
    assert_int_equal(pawl_metrics_diff(end, end, end), 0);
    assert_int_equal(end->counters[PAWL_M_EVENTS_HANDLED], 0);
    assert_int_equal(pawl_metrics_diff(NULL, end, mid), PAWL_EINVAL);
    free(mid);
    free(end);
    free(d);
}

/* Parse "name{le=\"x\"} v" lines of one histogram and check cumulative, +Inf == _count. */
static void test_prometheus(void **state)
{
    (void)state;
    pawl_metrics_reset();
    pawl_metric_add(PAWL_M_APPENDS, 7);
    pawl_metric_gauge_set(PAWL_G_APPENDS_IN_FLIGHT, 3);
    pawl_metric_hist_record(PAWL_H_FINALIZE_DELAY, 3000000);                   /* 3 ms */
    pawl_metric_hist_record(PAWL_H_FINALIZE_DELAY, 200000000);                 /* 200 ms */
    pawl_metric_hist_record(PAWL_H_FINALIZE_DELAY, (int64_t)120 * 1000000000); /* 2 min */
    struct pawl_metrics_snapshot *s = snap_new();
    pawl_metrics_snapshot(s);

    size_t need = 0;
    char tiny[16];
    assert_int_equal(pawl_metrics_format_prometheus(s, tiny, sizeof tiny, &need), PAWL_ETOOBIG);
    assert_true(need > sizeof tiny);
    assert_int_equal(strlen(tiny), sizeof tiny - 1);
    char *buf = malloc(need + 1);
    size_t len = 0;
    assert_int_equal(pawl_metrics_format_prometheus(s, buf, need + 1, &len), 0);
    assert_int_equal(len, need);
    assert_int_equal(strlen(buf), len);

    assert_non_null(strstr(buf, "# TYPE pawl_appends_total counter\npawl_appends_total 7\n"));
    assert_non_null(strstr(buf, "pawl_appends_in_flight 3\n"));
    assert_non_null(strstr(buf, "# TYPE pawl_finalize_delay_seconds histogram\n"));
    /* The 3 ms value is under le=0.005 but not under le=0.0025. */
    assert_non_null(strstr(buf, "pawl_finalize_delay_seconds_bucket{le=\"0.0025\"} 0\n"));
    assert_non_null(strstr(buf, "pawl_finalize_delay_seconds_bucket{le=\"0.005\"} 1\n"));
    assert_non_null(strstr(buf, "pawl_finalize_delay_seconds_bucket{le=\"0.25\"} 2\n"));
    assert_non_null(strstr(buf, "pawl_finalize_delay_seconds_bucket{le=\"60\"} 2\n"));
    assert_non_null(strstr(buf, "pawl_finalize_delay_seconds_bucket{le=\"+Inf\"} 3\n"));
    assert_non_null(strstr(buf, "pawl_finalize_delay_seconds_count 3\n"));
    assert_non_null(strstr(buf, "pawl_finalize_delay_seconds_sum 120.203000000\n"));

    /* Every line is a comment or "name[{labels}] number", and buckets are cumulative. */
    char *save = NULL;
    uint64_t prev = 0;
    char prev_name[128] = "";
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#')
            continue;
        char *sp = strrchr(line, ' ');
        assert_non_null(sp);
        char *end = NULL;
        double v = strtod(sp + 1, &end);
        assert_true(*end == '\0');
        char *brace = strstr(line, "_bucket{");
        if (brace) {
            size_t nlen = (size_t)(brace - line);
            if (strncmp(prev_name, line, nlen) != 0 || prev_name[nlen] != '\0') {
                snprintf(prev_name, sizeof prev_name, "%.*s", (int)nlen, line);
                prev = 0;
            }
            assert_true((uint64_t)v >= prev);
            prev = (uint64_t)v;
        }
    }
    free(buf);
    free(s);
}

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(pawl_metrics_counter_name(PAWL_M_BACKOFFS), "pawl_backoffs_total");
    assert_string_equal(pawl_metrics_gauge_name(PAWL_G_CLAIMS_HELD), "pawl_claims_held");
    assert_string_equal(pawl_metrics_hist_name(PAWL_H_CHECKPOINT_WAIT),
                        "pawl_checkpoint_wait_seconds");
    assert_string_equal(pawl_metrics_counter_name((enum pawl_metric_counter)999), "?");
    assert_string_equal(pawl_metrics_hist_help((enum pawl_metric_hist) - 1), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bucket_geometry),
        cmocka_unit_test(test_quantiles),
        cmocka_unit_test(test_concurrent_recording),
        cmocka_unit_test(test_prometheus),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
