/*
 * test_tool_positions.c — the tool's one syntax for a position in the log (tools/position.h)
 * without a database: every accepted form and what it parses to, refusals with their messages
 * (naming the flag, -15 an offset and -15m a time), start / end / -N against a log's bounds
 * (also after retention), the binary search behind a time over fake logs (empty, one event,
 * all before, all after, equal times, a time between two events), the RFC 3339 parser and
 * printer, the flags that take positions, and `pawl run`'s positional name around "--".
 */
#include "pawl_test.h"

#include "position.h"
#include "status.h"
#include "tool.h"

#include <string.h>

#define MIN_US (INT64_C(60) * 1000000)
#define HOUR_US (60 * MIN_US)
#define DAY_US (24 * HOUR_US)
/* 2026-12-05T10:00:00Z */
#define T0 (INT64_C(1796464800) * 1000000)

static void test_forms(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        enum tool_pos_kind kind;
        int64_t value;
    } ok[] = {
        {"start", TOOL_POS_START, 0},
        {"end", TOOL_POS_END, 0},
        {"0", TOOL_POS_INDEX, 0},
        {"42", TOOL_POS_INDEX, 42},
        {"007", TOOL_POS_INDEX, 7},
        {"9223372036854775807", TOOL_POS_INDEX, INT64_MAX},
        {"-15", TOOL_POS_OFFSET, 15},
        {"-0", TOOL_POS_OFFSET, 0},
        {"-9223372036854775807", TOOL_POS_OFFSET, INT64_MAX},
        {"-15m", TOOL_POS_AGO, 15 * MIN_US},
        {"-2h", TOOL_POS_AGO, 2 * HOUR_US},
        {"-30s", TOOL_POS_AGO, 30 * INT64_C(1000000)},
        {"-500ms", TOOL_POS_AGO, 500 * INT64_C(1000)},
        {"-1d", TOOL_POS_AGO, DAY_US},
        {"-7d", TOOL_POS_AGO, 7 * DAY_US},
        {"-1d12h", TOOL_POS_AGO, DAY_US + 12 * HOUR_US},
        {"-1h30m", TOOL_POS_AGO, HOUR_US + 30 * MIN_US},
        {"-1.5h", TOOL_POS_AGO, HOUR_US + 30 * MIN_US},
        {"-0d", TOOL_POS_AGO, 0},
        {"2026-12-05T10:00:00Z", TOOL_POS_TIME, T0},
        {"2026-12-05t10:00:00z", TOOL_POS_TIME, T0},
        {"2026-12-05 10:00:00Z", TOOL_POS_TIME, T0},
        {"2026-12-05T11:30:00+01:30", TOOL_POS_TIME, T0},
        {"2026-12-05T05:00:00-05:00", TOOL_POS_TIME, T0},
        {"2026-12-05T10:00:00.25Z", TOOL_POS_TIME, T0 + 250000},
        {"2026-12-05T10:00:00.000001Z", TOOL_POS_TIME, T0 + 1},
        {"2026-12-05T10:00:00.1234569Z", TOOL_POS_TIME, T0 + 123456}, /* to the microsecond */
        {"1970-01-01T00:00:00Z", TOOL_POS_TIME, 0},
        {"2024-02-29T00:00:00Z", TOOL_POS_TIME, INT64_C(1709164800) * 1000000},
    };
    char err[512];
    for (size_t i = 0; i < TOOL_ARRAY_LEN(ok); i++) {
        struct tool_pos p;
        err[0] = '\0';
        int rc = tool_pos_parse("--from", ok[i].text, &p, err, sizeof err);
        if (rc != 0)
            fail_msg("'%s' refused: %s", ok[i].text, err);
        if (p.kind != ok[i].kind || p.value != ok[i].value)
            fail_msg("'%s': kind %d value %lld, want kind %d value %lld", ok[i].text, p.kind,
                     (long long)p.value, ok[i].kind, (long long)ok[i].value);
    }
}

static void test_refusals(void **state)
{
    (void)state;
    static const char *const bad[] = {
        NULL,
        "",
        "Start",
        "END",
        "junk",
        "begin",
        "+5",
        " 5",
        "5 ",
        "1e3",
        "0x10",
        "12x",
        "-",
        "--5",
        "-15x",
        "-1d0",
        "-d",
        "-12h1d",
        "- 5",
        "-5 ",
        "-1.5d",
        "9223372036854775808",
        "99999999999999999999",
        "-9223372036854775808",
        "-99999999999999999999d",
        "2026-12-05T10:00:00",
        "2026-12-05",
        "2026-12-05T10:00Z",
        "2026-12-05T10:00:00+1:00",
        "2026-12-05T10:00:00+01",
        "2026-12-05T10:00:00+01:00x",
        "2026-12-05T10:00:00.Z",
        "2026-12-05T10:00:00ZZ",
        "2026-13-05T10:00:00Z",
        "2026-12-32T10:00:00Z",
        "2026-12-05T24:00:00Z",
        "2026-12-05T10:60:00Z",
        "2026-12- 5T10:00:00Z",
        "2026-+1-05T10:00:00Z",
        "2026/12/05T10:00:00Z",
        "2026-12-05X10:00:00Z",
    };
    char err[512];
    for (size_t i = 0; i < TOOL_ARRAY_LEN(bad); i++) {
        struct tool_pos p;
        err[0] = '\0';
        int rc = tool_pos_parse("--from", bad[i], &p, err, sizeof err);
        if (rc == 0)
            fail_msg("'%s' was accepted (kind %d, value %lld)", bad[i] ? bad[i] : "(null)", p.kind,
                     (long long)p.value);
        assert_true(rc == PAWL_EINVAL || rc == PAWL_ERANGE);
        if (strstr(err, "--from") == NULL)
            fail_msg("'%s': the message does not name the flag: %s", bad[i], err);
    }
    struct tool_pos p;
    assert_int_equal(tool_pos_parse("--from", "junk", &p, err, sizeof err), PAWL_EINVAL);
    assert_non_null(strstr(err, "start, end, an index N, -N"));
    assert_non_null(strstr(err, "RFC 3339"));
    assert_non_null(strstr(err, "-15 is an offset, -15m a time"));
    assert_int_equal(tool_pos_parse("--to", "-15x", &p, err, sizeof err), PAWL_EINVAL);
    assert_non_null(strstr(err, "--to -15x"));
    assert_non_null(strstr(err, "unit"));
    assert_int_equal(tool_pos_parse("--to", NULL, &p, err, sizeof err), PAWL_EINVAL);
    assert_non_null(strstr(err, "--to needs a position"));
    assert_int_equal(tool_pos_parse("--from", "99999999999999999999", &p, err, sizeof err),
                     PAWL_ERANGE);
    assert_non_null(strstr(err, "index out of range"));
    /* A value's control characters are escaped in the message. */
    assert_int_equal(tool_pos_parse("--from", "\x1b[2Jx", &p, err, sizeof err), PAWL_EINVAL);
    assert_null(strchr(err, '\x1b'));
}

static void test_bounds(void **state)
{
    (void)state;
    const struct tool_pos_span fresh = {.first = 1, .last = 20, .now_us = T0};
    const struct tool_pos_span retained = {.first = 16, .last = 21, .now_us = T0};
    const struct tool_pos_span empty = {.first = 1, .last = 0, .now_us = T0};
    static const struct {
        enum tool_pos_kind kind;
        int64_t value;
        int64_t fresh, retained, empty;
    } cases[] = {
        {TOOL_POS_START, 0, 0, 15, 0},     {TOOL_POS_END, 0, 20, 21, 0},
        {TOOL_POS_INDEX, 7, 7, 7, 7},      {TOOL_POS_OFFSET, 3, 17, 18, 0},
        {TOOL_POS_OFFSET, 0, 20, 21, 0},   {TOOL_POS_OFFSET, 20, 0, 15, 0},
        {TOOL_POS_OFFSET, 1000, 0, 15, 0}, {TOOL_POS_OFFSET, INT64_MAX, 0, 15, 0},
    };
    for (size_t i = 0; i < TOOL_ARRAY_LEN(cases); i++) {
        struct tool_pos p = {.kind = cases[i].kind, .value = cases[i].value};
        int64_t pos = -99;
        assert_int_equal(tool_pos_at(&p, &fresh, &pos), 0);
        assert_int_equal(pos, cases[i].fresh);
        assert_int_equal(tool_pos_at(&p, &retained, &pos), 0);
        assert_int_equal(pos, cases[i].retained);
        assert_int_equal(tool_pos_at(&p, &empty, &pos), 0);
        assert_int_equal(pos, cases[i].empty);
    }
    struct tool_pos t = {.kind = TOOL_POS_TIME, .value = T0};
    int64_t pos;
    assert_int_equal(tool_pos_at(&t, &fresh, &pos), PAWL_EINVAL);
    assert_int_equal(tool_pos_time_us(&t, &fresh), T0);
    struct tool_pos ago = {.kind = TOOL_POS_AGO, .value = 15 * MIN_US};
    assert_int_equal(tool_pos_time_us(&ago, &fresh), T0 - 15 * MIN_US);
}

/* A fake log: times[i] is the appended_at of index first + i. */
struct fake {
    const int64_t *times;
    int64_t first, last;
    int fail_at; /* an index whose read fails (0: none) */
};

static int fake_at(void *arg, int64_t index, int64_t *us)
{
    struct fake *f = arg;
    assert_true(index >= f->first && index <= f->last); /* never outside the log */
    if (index == f->fail_at)
        return PAWL_ECONN;
    *us = f->times[index - f->first];
    return 0;
}

static int64_t search(struct fake *f, int64_t t, int *probes)
{
    int64_t pos = -99;
    assert_int_equal(tool_pos_search(f->first, f->last, t, fake_at, f, &pos, probes), 0);
    return pos;
}

static void test_search(void **state)
{
    (void)state;
    /* indexes 1..10 at minutes 1, 2, 3, 3, 3, 6, 7, 8, 9, 10 */
    static const int64_t m[] = {1, 2, 3, 3, 3, 6, 7, 8, 9, 10};
    int64_t times[10];
    for (int i = 0; i < 10; i++)
        times[i] = T0 + m[i] * MIN_US;
    struct fake f = {.times = times, .first = 1, .last = 10};
    int probes = 0;
    assert_int_equal(search(&f, T0, &probes), 0);                    /* before all: start */
    assert_int_equal(search(&f, T0 + MIN_US, &probes), 0);           /* at the first */
    assert_int_equal(search(&f, T0 + MIN_US + 1, &probes), 1);       /* just after the first */
    assert_int_equal(search(&f, T0 + 3 * MIN_US, &probes), 2);       /* the first of equal times */
    assert_int_equal(search(&f, T0 + 4 * MIN_US, &probes), 5);       /* between two events */
    assert_int_equal(search(&f, T0 + 10 * MIN_US, &probes), 9);      /* at the last */
    assert_int_equal(search(&f, T0 + 10 * MIN_US + 1, &probes), 10); /* after all: end */
    assert_true(probes <= 4);                                        /* log2(10) + 1 reads */

    /* The same after retention moved the start to 4: indexes 4..10. */
    struct fake r = {.times = times + 3, .first = 4, .last = 10};
    assert_int_equal(search(&r, T0, NULL), 3);
    assert_int_equal(search(&r, T0 + 3 * MIN_US, NULL), 3);
    assert_int_equal(search(&r, T0 + 5 * MIN_US, NULL), 5);
    assert_int_equal(search(&r, T0 + 99 * MIN_US, NULL), 10);

    /* An empty log, and one event. */
    struct fake e = {.times = times, .first = 1, .last = 0};
    assert_int_equal(search(&e, T0, &probes), 0);
    assert_int_equal(probes, 0);
    struct fake one = {.times = times, .first = 1, .last = 1};
    assert_int_equal(search(&one, T0, NULL), 0);
    assert_int_equal(search(&one, T0 + 2 * MIN_US, NULL), 1);
    /* An empty log after retention dropped everything: start = end = 7. */
    struct fake gone = {.times = times, .first = 8, .last = 7};
    assert_int_equal(search(&gone, T0, NULL), 7);

    /* A million events: about 20 reads. */
    static int64_t big[1000000];
    for (int i = 0; i < 1000000; i++)
        big[i] = T0 + (int64_t)i * 1000;
    struct fake b = {.times = big, .first = 1, .last = 1000000};
    assert_int_equal(search(&b, T0 + 500000 * 1000 + 1, &probes), 500001);
    assert_true(probes <= 21);

    /* A failed read is returned as it is. */
    f.fail_at = 5;
    int64_t pos = -99;
    assert_int_equal(tool_pos_search(f.first, f.last, T0 + 4 * MIN_US, fake_at, &f, &pos, NULL),
                     PAWL_ECONN);
}

static void test_time_text(void **state)
{
    (void)state;
    char buf[48];
    assert_string_equal(tool_pos_format_time(T0, buf, sizeof buf), "2026-12-05T10:00:00Z");
    assert_string_equal(tool_pos_format_time(T0 + 250000, buf, sizeof buf),
                        "2026-12-05T10:00:00.250000Z");
    assert_string_equal(tool_pos_format_time(0, buf, sizeof buf), "1970-01-01T00:00:00Z");
    assert_string_equal(tool_pos_format_time(-1, buf, sizeof buf), "1969-12-31T23:59:59.999999Z");
    /* Printed times parse back to themselves, over four centuries of dates. */
    for (int64_t us = -INT64_C(2208988800) * 1000000; us < INT64_C(32503680000) * 1000000;
         us += INT64_C(86399123457)) {
        int64_t back = 0;
        tool_pos_format_time(us, buf, sizeof buf);
        assert_int_equal(tool_pos_parse_time(buf, &back), 0);
        assert_int_equal(back, us);
    }
}

static void test_flags(void **state)
{
    (void)state;
    static const char *const positions[] = {"from", "initial-token", "to", "before"};
    for (size_t i = 0; i < TOOL_ARRAY_LEN(positions); i++) {
        const struct pawl_flag *f = tool_flag_find(positions[i]);
        assert_non_null(f);
        assert_true(tool_flag_is_position(f));
        assert_int_equal(f->type, PAWL_FLAG_STRING);
    }
    assert_false(tool_flag_is_position(tool_flag_find("count")));
    /* --initial-token stays a setting (PAWL_INITIAL_TOKEN) and run's; --from an action. */
    assert_int_equal(tool_flag_kind(tool_flag_find("initial-token")), TOOL_FLAG_SETTING);
    assert_true(tool_flag_scope(tool_flag_find("initial-token")) & TOOL_SCOPE_RUN);
    assert_int_equal(tool_flag_kind(tool_flag_find("from")), TOOL_FLAG_ACTION);

    struct tool_config cfg;
    tool_config_defaults(&cfg);
    assert_string_equal(cfg.tool.from, "start");
    assert_string_equal(cfg.tool.initial_token, "start");
    assert_null(cfg.tool.before);
    char err[512];
    char *env[] = {"PAWL_INITIAL_TOKEN=-1h", NULL};
    assert_int_equal(tool_config_load_env(&cfg, env, err, sizeof err), 0);
    assert_string_equal(cfg.tool.initial_token, "-1h");
    /* Numbers keep working, negative ones as values of their flag. */
    struct tool_config_args a;
    char *argv[] = {"--from", "-10", "--initial-token", "40"};
    assert_int_equal(tool_config_parse_args(&cfg, 4, argv, TOOL_SCOPE_TAIL | TOOL_SCOPE_RUN, &a,
                                            err, sizeof err),
                     0);
    assert_string_equal(cfg.tool.from, "-10");
    assert_string_equal(cfg.tool.initial_token, "40");
    assert_int_equal(a.npositional, 0);
    assert_int_equal(a.dashdash, -1);
    tool_config_fini(&cfg);
}

static void test_dashdash(void **state)
{
    (void)state;
    struct tool_config cfg;
    struct tool_config_args a;
    char err[512];
    tool_config_defaults(&cfg);
    assert_int_equal(cfg.dashdash, -1);
    char *argv1[] = {"orders", "--handler", "exec", "--", "cat", "-n"};
    assert_int_equal(tool_config_parse_args(&cfg, 6, argv1, TOOL_SCOPE_RUN, &a, err, sizeof err),
                     0);
    assert_int_equal(a.npositional, 3);
    assert_int_equal(a.dashdash, 1); /* orders | cat -n */
    assert_string_equal(a.positional[0], "orders");
    assert_string_equal(a.positional[1], "cat");
    char *argv2[] = {"--", "cat"};
    assert_int_equal(tool_config_parse_args(&cfg, 2, argv2, TOOL_SCOPE_RUN, &a, err, sizeof err),
                     0);
    assert_int_equal(a.dashdash, 0);
    tool_config_fini(&cfg);
}

/* The reset target of the library's kinds still parses the same (fuzzed by fuzz_token). */
static void test_reset_target_wrapper(void **state)
{
    (void)state;
    enum pawl_reset_kind k;
    int64_t v;
    char err[512];
    assert_int_equal(tool_parse_reset_target("-1d", T0, &k, &v, err, sizeof err), 0);
    assert_int_equal(k, PAWL_RESET_TIME);
    assert_int_equal(v, T0 - DAY_US);
    assert_int_equal(tool_parse_reset_target("-15", T0, &k, &v, err, sizeof err), PAWL_EINVAL);
    assert_non_null(strstr(err, "offset"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forms),     cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_bounds),    cmocka_unit_test(test_search),
        cmocka_unit_test(test_time_text), cmocka_unit_test(test_flags),
        cmocka_unit_test(test_dashdash),  cmocka_unit_test(test_reset_target_wrapper),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
