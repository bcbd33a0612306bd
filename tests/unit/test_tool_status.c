/*
 * test_tool_status.c — `pawl status` figures on the in-memory log and token store: per-segment
 * lag counted exactly, the upper bound when the scan is cut short, owners, the table and the
 * JSON document; and the parsing of reset targets.
 */
#include "pawl_test.h"

#include "metrics.h"
#include "scrape.h"
#include "status.h"

#include <math.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

struct fixture {
    struct pawl_source *src;
    struct pawl_tokens *tok;
    int64_t expect_lag[4];
};

static void setup(struct fixture *f)
{
    memset(f, 0, sizeof *f);
    assert_int_equal(pawl_source_mem_new(&f->src), 0);
    assert_int_equal(pawl_tokens_mem_new(&f->tok), 0);
    char ids[40][16];
    struct pawl_event ev[40];
    for (int i = 0; i < 40; i++) {
        snprintf(ids[i], sizeof ids[i], "s-%d", i % 13);
        ev[i] =
            (struct pawl_event){.stream_id = ids[i], .type = "T", .payload = "x", .payload_len = 1};
    }
    assert_int_equal(pawl_source_mem_append(f->src, ev, 40), 0);
    assert_int_equal(f->tok->ops->init(f->tok, "proc", 4, 0), 0);
    /* Segment 1 is claimed by node-a and has handled up to index 25. */
    struct pawl_segment_status row;
    assert_int_equal(f->tok->ops->claim(f->tok, "proc", 1, "node-a", 10000, PAWL_CKPT_PLAIN, &row),
                     0);
    struct pawl_txn *txn;
    assert_int_equal(f->tok->ops->begin(f->tok, "proc", 1, "node-a", &txn), 0);
    assert_int_equal(txn->ops->store(txn, 25), 0);
    assert_int_equal(txn->ops->commit(txn), 0);
    for (int i = 0; i < 40; i++) {
        uint32_t seg = pawl_stream_hash(ids[i]) & 3;
        if (seg != 1 || i + 1 > 25)
            f->expect_lag[seg]++;
    }
}

static void teardown(struct fixture *f)
{
    pawl_tokens_free(f->tok);
    pawl_source_free(f->src);
}

static void test_collect_exact(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f);
    struct tool_status st;
    char err[256];
    assert_int_equal(tool_status_collect(f.tok, f.src, "proc", 1000000, &st, err, sizeof err), 0);
    assert_int_equal(st.n, 4);
    assert_int_equal(st.head, 40);
    int64_t total = 0;
    for (size_t i = 0; i < st.n; i++) {
        const struct tool_seg_row *r = &st.rows[i];
        assert_int_equal(r->lag_events, f.expect_lag[r->st.seg.id]);
        assert_true(r->lag_exact);
        assert_true(r->lag_events == 0 || r->oldest_us > 0);
        assert_true(r->lag_seconds >= 0 && r->lag_seconds < 60);
        total += r->lag_events;
        if (r->st.seg.id == 1) {
            assert_string_equal(r->st.owner, "node-a");
            assert_int_equal(r->st.token, 25);
        } else {
            assert_string_equal(r->st.owner, "");
        }
    }
    char owners[128];
    tool_status_owners(&st, owners, sizeof owners);
    assert_string_equal(owners, "node-a");

    /* The table and the JSON document. */
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    tool_status_print_table(m, &st);
    fclose(m);
    assert_non_null(strstr(buf, "PROCESSOR proc"));
    assert_non_null(strstr(buf, "node-a"));
    assert_non_null(strstr(buf, "CLAIM-AGE"));
    free(buf);
    m = open_memstream(&buf, &len);
    assert_int_equal(tool_status_print_json(m, &st, 0), 0);
    fclose(m);
    json_error_t je;
    json_t *doc = json_loads(buf, 0, &je);
    assert_non_null(doc);
    assert_string_equal(json_string_value(json_object_get(doc, "processor")), "proc");
    assert_int_equal(json_integer_value(json_object_get(doc, "head")), 40);
    assert_int_equal(json_integer_value(json_object_get(doc, "lag_events")), total);
    json_t *segs = json_object_get(doc, "segments");
    assert_int_equal(json_array_size(segs), 4);
    json_t *s1 = json_array_get(segs, 1);
    assert_int_equal(json_integer_value(json_object_get(s1, "segment")), 1);
    assert_string_equal(json_string_value(json_object_get(s1, "owner")), "node-a");
    assert_string_equal(json_string_value(json_object_get(s1, "mode")), "plain");
    assert_true(json_is_null(json_object_get(json_array_get(segs, 0), "owner")));
    json_decref(doc);
    free(buf);
    tool_status_fini(&st);
    teardown(&f);
}

static void test_collect_cut_short(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f);
    struct tool_status st;
    char err[256];
    assert_int_equal(tool_status_collect(f.tok, f.src, "proc", 5, &st, err, sizeof err), 0);
    for (size_t i = 0; i < st.n; i++) {
        assert_false(st.rows[i].lag_exact);
        assert_int_equal(st.rows[i].lag_events, 40 - st.rows[i].st.token);
    }
    tool_status_fini(&st);
    assert_int_equal(tool_status_collect(f.tok, f.src, "nope", 100, &st, err, sizeof err),
                     PAWL_ENOTFOUND);
    assert_non_null(strstr(err, "no processor named nope"));
    teardown(&f);
}

static void test_reset_targets(void **state)
{
    (void)state;
    enum pawl_reset_kind k;
    int64_t v;
    char err[256];
    const int64_t now = 1764486000000000LL; /* 2025-11-30T07:00:00Z */
    assert_int_equal(tool_parse_reset_target("start", now, &k, &v, err, sizeof err), 0);
    assert_int_equal(k, PAWL_RESET_START);
    assert_int_equal(tool_parse_reset_target("end", now, &k, &v, err, sizeof err), 0);
    assert_int_equal(k, PAWL_RESET_END);
    assert_int_equal(tool_parse_reset_target("1234", now, &k, &v, err, sizeof err), 0);
    assert_int_equal(k, PAWL_RESET_INDEX);
    assert_int_equal(v, 1234);
    assert_int_equal(tool_parse_reset_target("2025-11-30T07:00:00Z", now, &k, &v, err, sizeof err),
                     0);
    assert_int_equal(k, PAWL_RESET_TIME);
    assert_int_equal(v, now);
    assert_int_equal(
        tool_parse_reset_target("2025-11-30T08:00:00.5+01:00", now, &k, &v, err, sizeof err), 0);
    assert_int_equal(v, now + 500000);
    assert_int_equal(tool_parse_reset_target("-15m", now, &k, &v, err, sizeof err), 0);
    assert_int_equal(k, PAWL_RESET_TIME);
    assert_int_equal(v, now - 15 * 60 * 1000000LL);
    static const char *const bad[] = {"",
                                      "begin",
                                      "12x",
                                      "2025-11-30T07:00:00",
                                      "2025-13-01T00:00:00Z",
                                      "-soon",
                                      "2025-11-30T07:00:00Zjunk"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (tool_parse_reset_target(bad[i], now, &k, &v, err, sizeof err) == 0)
            fail_msg("'%s' was accepted", bad[i]);
        assert_true(strlen(err) > 0);
    }
}

/* status --metrics: quantiles from cumulative buckets, and the summary of real Prometheus text. */
static void test_scrape_summary(void **state)
{
    (void)state;
    const double le[] = {0.1, 0.2, INFINITY}, cum[] = {10, 20, 20};
    assert_true(fabs(tool_hist_quantile(le, cum, 3, 0.5) - 0.1) < 1e-9);
    assert_true(fabs(tool_hist_quantile(le, cum, 3, 0.75) - 0.15) < 1e-9);
    const double empty[] = {0, 0, 0};
    assert_true(isnan(tool_hist_quantile(le, empty, 3, 0.5)));

    pawl_metrics_reset();
    pawl_metric_add(PAWL_M_BATCHES, 3);
    for (int i = 0; i < 100; i++)
        pawl_metric_hist_record(PAWL_H_BATCH_TIME, 2000000); /* 2 ms */
    struct pawl_metrics_snapshot *snap = calloc(1, sizeof *snap);
    pawl_metrics_snapshot(snap);
    size_t need = 0;
    pawl_metrics_format_prometheus(snap, NULL, 0, &need);
    char *text = malloc(need + 1);
    assert_int_equal(pawl_metrics_format_prometheus(snap, text, need + 1, NULL), 0);
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    tool_scrape_summary(f, text);
    fclose(f);
    assert_non_null(strstr(out, "pawl_batches_total"));
    char *line = strstr(out, "pawl_batch_seconds");
    assert_non_null(line);
    assert_non_null(strstr(line, "count 100"));
    /* 2 ms sits in the (1 ms, 2.5 ms] bucket; interpolation gives a value inside it. */
    assert_non_null(strstr(line, "p50 1.8ms"));
    assert_null(strstr(out, "_bucket"));
    free(out);
    free(text);
    free(snap);
}

/* The finalizer-lock line: free, held (with and without a visible age), a failed query, and an
 * application name with control characters, quotes and backslashes, which come out escaped on
 * the one line, and in the JSON as valid JSON. */
static void test_finalizer_lock_line(void **state)
{
    (void)state;
    char line[768];
    struct tool_fin_lock f = {.known = 1};
    tool_status_fin_lock_text(&f, line, sizeof line);
    assert_string_equal(line, "finalizer lock: free");
    f = (struct tool_fin_lock){.known = 1, .held = 1, .pid = 4242, .held_s = 12.4};
    snprintf(f.app, sizeof f.app, "evil\nfinalizer lock: free\t'x'\\\x1b[2J\x7f");
    tool_status_fin_lock_text(&f, line, sizeof line);
    assert_string_equal(line, "finalizer lock: held by pid 4242 (application "
                              "'evil\\nfinalizer lock: free\\t\\'x\\'\\\\\\x1b[2J\\x7f', "
                              "for 12 s)");
    assert_null(strchr(line, '\n'));
    f.held_s = -1; /* hidden from this login */
    snprintf(f.app, sizeof f.app, "pawl finalizer");
    tool_status_fin_lock_text(&f, line, sizeof line);
    assert_string_equal(line, "finalizer lock: held by pid 4242 (application 'pawl finalizer')");
    f = (struct tool_fin_lock){.known = -1};
    snprintf(f.why, sizeof f.why, "permission denied");
    tool_status_fin_lock_text(&f, line, sizeof line);
    assert_string_equal(line, "finalizer lock: unknown (permission denied)");

    /* JSON: the field, with the name escaped by the JSON encoder (or to ASCII when it is not
     * UTF-8). */
    struct tool_status st;
    memset(&st, 0, sizeof st);
    snprintf(st.proc, sizeof st.proc, "p");
    st.fin = (struct tool_fin_lock){.known = 1, .held = 1, .pid = 7, .held_s = 3};
    snprintf(st.fin.app, sizeof st.fin.app, "a\nb\xff");
    char *buf = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&buf, &len);
    assert_int_equal(tool_status_print_json(mf, &st, 0), 0);
    fclose(mf);
    json_error_t je;
    json_t *o = json_loads(buf, 0, &je);
    assert_non_null(o);
    json_t *fl = json_object_get(o, "finalizer_lock");
    assert_true(json_is_true(json_object_get(fl, "held")));
    assert_int_equal(json_integer_value(json_object_get(fl, "pid")), 7);
    assert_string_equal(json_string_value(json_object_get(fl, "application")), "a\\nb\\xff");
    json_decref(o);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scrape_summary),      cmocka_unit_test(test_collect_exact),
        cmocka_unit_test(test_collect_cut_short),   cmocka_unit_test(test_reset_targets),
        cmocka_unit_test(test_finalizer_lock_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
