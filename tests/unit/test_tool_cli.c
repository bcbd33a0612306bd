/*
 * test_tool_cli.c — the command line's safety rules at the level of their parsers: durations
 * need a unit (accepted and refused forms, with the hint for a bare number), action flags are
 * never taken from the environment (and are named so the tool can warn), "did you mean" for a
 * misspelt flag, -V/--version, and the escaping of control characters for terminals and JSON.
 */
#include "pawl_test.h"

#include "tool.h"

#include <string.h>

static void test_duration_forms(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int64_t ms;
    } ok[] = {
        {"0", 0},          {"250ms", 250},   {"2s", 2000},
        {"1.5s", 1500},    {"2m", 120000},   {"2min", 120000},
        {"1h", 3600000},   {"1m30s", 90000}, {"1h2m3s", 3723000},
        {"1s500ms", 1500}, {"0.5m", 30000},  {"-15m", -900000},
        {"0s", 0},         {".5s", 500},     {"1h30m", 5400000},
        {"10ms", 10},
    };
    for (size_t i = 0; i < TOOL_ARRAY_LEN(ok); i++) {
        int64_t ms = -1;
        assert_int_equal(pawl_config_parse_duration(ok[i].text, &ms), 0);
        assert_int_equal(ms, ok[i].ms);
    }
    static const char *const bad[] = {
        "2",   "10",    "-5",   "1.5",    "",     "s",    "ms",    "1 s",  " 1s",
        "1s ", "1d",    "1sm",  "1s1s",   "1s1m", "1m1h", "0.5ms", "1e3s", "0x10s",
        "+1s", "1..5s", "--1s", "1.2.3s", "5S",   "1mss", "1s-2s", ".s",
    };
    for (size_t i = 0; i < TOOL_ARRAY_LEN(bad); i++) {
        int64_t ms = 7;
        int rc = pawl_config_parse_duration(bad[i], &ms);
        if (rc == 0)
            fail_msg("duration \"%s\" was accepted as %lld ms", bad[i], (long long)ms);
        assert_int_equal(ms, 7); /* nothing stored on failure */
    }
}

static void test_bare_number_message(void **state)
{
    (void)state;
    struct tool_config cfg;
    tool_config_defaults(&cfg);
    char err[512];
    assert_int_equal(tool_config_set(&cfg, "watch", "2", err, sizeof err), PAWL_EINVAL);
    assert_non_null(strstr(err, "--watch"));
    assert_non_null(strstr(err, "needs a unit"));
    assert_non_null(strstr(err, "2s"));
    assert_non_null(strstr(err, "2000ms"));
    assert_int_equal(cfg.tool.watch_ms, 0);
    /* Flags with units keep working, from every source. */
    char *envp[] = {"PAWL_CLAIM_TIMEOUT=1m30s", NULL};
    assert_int_equal(tool_config_load_env(&cfg, envp, err, sizeof err), 0);
    assert_int_equal(cfg.lib.processor.claim_timeout_ms, 90000);
    char *envbad[] = {"PAWL_CLAIM_TIMEOUT=5000", NULL};
    assert_int_equal(tool_config_load_env(&cfg, envbad, err, sizeof err), PAWL_EINVAL);
    assert_non_null(strstr(err, "PAWL_CLAIM_TIMEOUT"));
    tool_config_fini(&cfg);
}

static void test_env_actions_ignored(void **state)
{
    (void)state;
    struct tool_config cfg;
    tool_config_defaults(&cfg);
    char err[512], listed[512];
    char *envp[] = {
        "PAWL_EXECUTE=1", "PAWL_JSON=true", "PAWL_FOLLOW=1", "PAWL_COUNT=5",     "PAWL_TO=start",
        "PAWL_SEGMENT=3", "PAWL_WAIT=1",    "PAWL_RATE=5",   "PAWL_PROCESSOR=p", NULL};
    assert_int_equal(tool_config_load_env(&cfg, envp, err, sizeof err), 0);
    assert_int_equal(cfg.tool.execute, 0);
    assert_int_equal(cfg.tool.json, 0);
    assert_int_equal(cfg.tool.follow, 0);
    assert_int_equal(cfg.tool.count, 0);
    assert_null(cfg.tool.to);
    assert_int_equal(cfg.tool.segment, 0);
    assert_int_equal(cfg.tool.wait, 0);
    /* Settings still come from the environment. */
    assert_true(cfg.tool.rate == 5.0);
    assert_string_equal(cfg.lib.processor.name, "p");
    assert_int_equal(tool_config_env_actions(envp, listed, sizeof listed), 7);
    assert_non_null(strstr(listed, "PAWL_EXECUTE"));
    assert_non_null(strstr(listed, "PAWL_SEGMENT"));
    assert_null(strstr(listed, "PAWL_RATE"));
    /* Every action is marked in the table, and the ones named in the rule are actions. */
    static const char *const actions[] = {"execute", "to",   "segment", "count", "follow",
                                          "json",    "from", "wait",    "watch", "generate"};
    for (size_t i = 0; i < TOOL_ARRAY_LEN(actions); i++)
        assert_int_equal(tool_flag_kind(tool_flag_find(actions[i])), TOOL_FLAG_ACTION);
    assert_int_equal(tool_flag_kind(tool_flag_find("dsn")), TOOL_FLAG_SETTING);
    tool_config_fini(&cfg);
}

static void test_did_you_mean_and_version(void **state)
{
    (void)state;
    struct tool_config cfg;
    struct tool_config_args a;
    char err[512];
    tool_config_defaults(&cfg);
    char *argv1[] = {"--dns", "x"};
    assert_int_equal(tool_config_parse_args(&cfg, 2, argv1, TOOL_SCOPE_STATUS, &a, err, sizeof err),
                     PAWL_ENOTFOUND);
    assert_non_null(strstr(err, "did you mean --dsn?"));
    char *argv2[] = {"--exectue"};
    assert_int_equal(tool_config_parse_args(&cfg, 1, argv2, TOOL_SCOPE_RESET, &a, err, sizeof err),
                     PAWL_ENOTFOUND);
    assert_non_null(strstr(err, "did you mean --execute?"));
    char *argv3[] = {"--zzzzzz"};
    assert_int_equal(tool_config_parse_args(&cfg, 1, argv3, TOOL_SCOPE_RESET, &a, err, sizeof err),
                     PAWL_ENOTFOUND);
    assert_null(strstr(err, "did you mean"));
    char *argv4[] = {"-V"};
    assert_int_equal(tool_config_parse_args(&cfg, 1, argv4, TOOL_SCOPE_RESET, &a, err, sizeof err),
                     0);
    assert_int_equal(a.version, 1);
    assert_int_equal(tool_edit_distance("stauts", "status"), 1);
    assert_int_equal(tool_edit_distance("", "abc"), 3);
    tool_config_fini(&cfg);
}

static void test_printable(void **state)
{
    (void)state;
    char out[64];
    assert_string_equal(tool_printable("order-17", out, sizeof out), "order-17");
    assert_string_equal(tool_printable("a\033[2Jb\n\x7f\\", out, sizeof out),
                        "a\\x1b[2Jb\\x0a\\x7f\\\\");
    assert_string_equal(tool_printable("x\xc2\x9b"
                                       "31m\xc3\xa9",
                                       out, sizeof out),
                        "x\\u009b31m\xc3\xa9");
    char small[8];
    tool_printable("abcdefghijkl", small, sizeof small);
    assert_string_equal(small, "abcd...");
    assert_string_equal(tool_json_string("a\"b\n\x01", out, sizeof out),
                        "\"a\\\"b\\u000a\\u0001\"");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duration_forms),      cmocka_unit_test(test_bare_number_message),
        cmocka_unit_test(test_env_actions_ignored), cmocka_unit_test(test_did_you_mean_and_version),
        cmocka_unit_test(test_printable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
