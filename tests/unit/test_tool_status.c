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
    assert_non_null(strstr(buf, "LAG-EVENTS")); /* a column of counts says what it counts */
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

/* A session for the finalizer-lock lines. */
static struct tool_fin_session fin_session(int pid, int granted, const char *mode, const char *user,
                                           const char *app, double held_s)
{
    struct tool_fin_session s = {.pid = pid, .granted = granted, .held_s = held_s};
    snprintf(s.mode, sizeof s.mode, "%s", mode);
    snprintf(s.user, sizeof s.user, "%s", user);
    snprintf(s.app, sizeof s.app, "%s", app);
    return s;
}

/* The finalizer-lock lines: free; the gate held in the finalizer's mode, blocked in another one,
 * wanted by a waiter, held by a prepared transaction (with and without a visible age); sessions
 * left out; a failed query; and names with control characters, quotes and backslashes, which
 * come out escaped, each line one line, and in the JSON as valid JSON. */
static void test_finalizer_lock_line(void **state)
{
    (void)state;
    char line[2048];
    struct tool_fin_lock f = {.known = 1};
    assert_int_equal(tool_status_fin_lock_lines(&f), 1);
    tool_status_fin_lock_text(&f, 0, line, sizeof line);
    assert_string_equal(line, "finalizer lock: free");

    f = (struct tool_fin_lock){.known = 1, .held = 1, .n = 4};
    f.s[0] = fin_session(4242, 1, "ExclusiveLock", "pawl",
                         "evil\nfinalizer lock: free\t'x'\\\x1b[2J\x7f", 12.4);
    f.s[1] = fin_session(4243, 1, "RowShareLock", "mal'lory\n", "psql", -1); /* age hidden */
    f.s[2] = fin_session(4244, 0, "ExclusiveLock", "pawl", "pawl finalizer", 3);
    f.s[3] = fin_session(0, 1, "RowExclusiveLock", "pawl", "", 60);
    snprintf(f.s[3].gid, sizeof f.s[3].gid, "tx'1");
    assert_int_equal(tool_status_fin_lock_lines(&f), 4);
    static const char *const want[] = {
        "finalizer lock: held by pid 4242 (user 'pawl', application "
        "'evil\\nfinalizer lock: free\\t\\'x\\'\\\\\\x1b[2J\\x7f', ExclusiveLock, for 12 s)",
        "finalizer lock: blocked by pid 4243 (user 'mal\\'lory\\n', application 'psql', "
        "RowShareLock)",
        "finalizer lock: wanted by pid 4244 (user 'pawl', application 'pawl finalizer', "
        "ExclusiveLock, waiting 3 s)",
        "finalizer lock: blocked by a prepared transaction 'tx\\'1' (user 'pawl', "
        "RowExclusiveLock, for 60 s)",
    };
    for (int i = 0; i < 4; i++) {
        tool_status_fin_lock_text(&f, i, line, sizeof line);
        assert_string_equal(line, want[i]);
        assert_null(strchr(line, '\n'));
    }
    f.more = 3;
    assert_int_equal(tool_status_fin_lock_lines(&f), 5);
    tool_status_fin_lock_text(&f, 4, line, sizeof line);
    assert_string_equal(line, "finalizer lock: and 3 more sessions");
    /* A prepared transaction pg_prepared_xacts did not name. */
    f.s[3] = fin_session(0, 1, "ShareLock", "", "", -1);
    tool_status_fin_lock_text(&f, 3, line, sizeof line);
    assert_string_equal(line, "finalizer lock: blocked by a prepared transaction (ShareLock)");

    f = (struct tool_fin_lock){.known = -1};
    snprintf(f.why, sizeof f.why, "permission denied");
    assert_int_equal(tool_status_fin_lock_lines(&f), 1);
    tool_status_fin_lock_text(&f, 0, line, sizeof line);
    assert_string_equal(line, "finalizer lock: unknown (permission denied)");

    /* JSON: held, the first session at the top, every session in sessions, names escaped by the
     * JSON encoder (or to ASCII when they are not UTF-8). */
    struct tool_status st;
    memset(&st, 0, sizeof st);
    snprintf(st.proc, sizeof st.proc, "p");
    st.fin = (struct tool_fin_lock){.known = 1, .held = 1, .n = 2};
    st.fin.s[0] = fin_session(7, 1, "ExclusiveLock", "u", "a\nb\xff", 3);
    st.fin.s[1] = fin_session(8, 0, "RowShareLock", "v", "w", -1);
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
    json_t *ss = json_object_get(fl, "sessions");
    assert_int_equal(json_array_size(ss), 2);
    json_t *s1 = json_array_get(ss, 1);
    assert_int_equal(json_integer_value(json_object_get(s1, "pid")), 8);
    assert_string_equal(json_string_value(json_object_get(s1, "user")), "v");
    assert_string_equal(json_string_value(json_object_get(s1, "mode")), "RowShareLock");
    assert_true(json_is_false(json_object_get(s1, "granted")));
    assert_true(json_is_null(json_object_get(s1, "seconds")));
    json_decref(o);
    free(buf);

    /* Free: held false and no sessions. */
    st.fin = (struct tool_fin_lock){.known = 1};
    buf = NULL;
    mf = open_memstream(&buf, &len);
    assert_int_equal(tool_status_print_json(mf, &st, 0), 0);
    fclose(mf);
    o = json_loads(buf, 0, &je);
    assert_non_null(o);
    fl = json_object_get(o, "finalizer_lock");
    assert_true(json_is_false(json_object_get(fl, "held")));
    assert_int_equal(json_array_size(json_object_get(fl, "sessions")), 0);
    assert_null(json_object_get(fl, "pid"));
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
