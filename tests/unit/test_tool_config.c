/*
 * test_tool_config.c — the tool's flag table: defaults, every flag from each source (API,
 * environment, argv), precedence, and each kind of bad value refused with a message naming the
 * flag, the value and what is allowed.
 */
#include "pawl_test.h"

#include "common.h"
#include "tool_config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A valid value for f that differs from its default, and how it prints back. */
static void sample_value(const struct pawl_flag *f, char *v, size_t vlen, char *printed,
                         size_t plen)
{
    switch (f->type) {
    case PAWL_FLAG_BOOL:
        snprintf(v, vlen, "%s", f->def ? "no" : "yes");
        snprintf(printed, plen, "%s", f->def ? "false" : "true");
        break;
    case PAWL_FLAG_INT: {
        int64_t x = f->max;
        if (x == f->def)
            x = f->min;
        snprintf(v, vlen, "%" PRId64, x);
        snprintf(printed, plen, "%" PRId64, x);
        break;
    }
    case PAWL_FLAG_DOUBLE:
        snprintf(v, vlen, "%g", f->dmax / 4 + 0.5);
        snprintf(printed, plen, "%g", f->dmax / 4 + 0.5);
        break;
    case PAWL_FLAG_DURATION:
        /* The maximum, written in seconds, prints back in its largest whole unit. */
        snprintf(v, vlen, "%" PRId64 "s", f->max / 1000);
        if (f->max % 3600000 == 0)
            snprintf(printed, plen, "%" PRId64 "h", f->max / 3600000);
        else if (f->max % 60000 == 0)
            snprintf(printed, plen, "%" PRId64 "m", f->max / 60000);
        else
            snprintf(printed, plen, "%" PRId64 "s", f->max / 1000);
        break;
    case PAWL_FLAG_STRING:
        snprintf(v, vlen, "sample-%s", f->name);
        snprintf(printed, plen, "sample-%s", f->name);
        break;
    case PAWL_FLAG_ENUM: {
        size_t n = 0;
        while (f->choices[n])
            n++;
        const char *c = (size_t)f->def == n - 1 ? f->choices[0] : f->choices[n - 1];
        snprintf(v, vlen, "%s", c);
        snprintf(printed, plen, "%s", c);
        break;
    }
    }
}

static void test_defaults_valid(void **state)
{
    (void)state;
    struct tool_config cfg;
    tool_config_defaults(&cfg);
    char err[512];
    assert_int_equal(tool_config_check(&cfg, err, sizeof err), 0);
    assert_true(tool_flag_count() > 10);
    for (size_t i = 0; i < tool_flag_count(); i++) {
        const struct pawl_flag *f = tool_flag_at(i);
        assert_non_null(f->help);
        assert_true(tool_flag_scope(f) != 0);
        assert_ptr_equal(tool_flag_find(f->name), f);
        /* The default is valid and prints back as something that parses to the same value. */
        char text[256], again[256];
        assert_int_equal(tool_config_get(&cfg, f->name, text, sizeof text), 0);
        struct tool_config c2;
        tool_config_defaults(&c2);
        assert_int_equal(tool_config_set(&c2, f->name, text, err, sizeof err), 0);
        assert_int_equal(tool_config_get(&c2, f->name, again, sizeof again), 0);
        assert_string_equal(text, again);
        assert_int_equal(tool_config_source_of(&cfg, f->name), PAWL_SRC_DEFAULT);
        tool_config_fini(&c2);
        /* Names never collide with each other under the _ / - folding. */
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(tool_flag_at(j)->name, f->name);
    }
    assert_null(tool_flag_at(tool_flag_count()));
    assert_int_equal(cfg.lib.log.level, PAWL_LOG_INFO);
    assert_int_equal(cfg.tool.duration_ms, 20000);
    tool_config_fini(&cfg);
    tool_config_fini(NULL);
}

static void test_every_flag_every_source(void **state)
{
    (void)state;
    char err[512];
    for (size_t i = 0; i < tool_flag_count(); i++) {
        const struct pawl_flag *f = tool_flag_at(i);
        char v[128], printed[128], got[256], env[96], envvar[256], arg[160];
        sample_value(f, v, sizeof v, printed, sizeof printed);

        /* API */
        struct tool_config cfg;
        tool_config_defaults(&cfg);
        assert_int_equal(tool_config_set(&cfg, f->name, v, err, sizeof err), 0);
        assert_int_equal(tool_config_get(&cfg, f->name, got, sizeof got), 0);
        assert_string_equal(got, printed);
        assert_int_equal(tool_config_source_of(&cfg, f->name), PAWL_SRC_API);
        tool_config_fini(&cfg);

        /* Environment */
        tool_config_defaults(&cfg);
        snprintf(envvar, sizeof envvar, "%s=%s", pawl_config_flag_env(f, env, sizeof env), v);
        char *envp[] = {"HOME=/", envvar, "PAWL_UNRELATED_THING=1", NULL};
        assert_int_equal(tool_config_load_env(&cfg, envp, err, sizeof err), 0);
        if (tool_flag_kind(f) == TOOL_FLAG_ACTION) {
            /* Actions come from the command line only: the variable is ignored, and named. */
            assert_int_equal(tool_config_source_of(&cfg, f->name), PAWL_SRC_DEFAULT);
            char listed[256];
            assert_int_equal(tool_config_env_actions(envp, listed, sizeof listed), 1);
            assert_string_equal(listed, env);
        } else {
            assert_int_equal(tool_config_get(&cfg, f->name, got, sizeof got), 0);
            assert_string_equal(got, printed);
            assert_int_equal(tool_config_source_of(&cfg, f->name), PAWL_SRC_ENV);
        }
        tool_config_fini(&cfg);

        /* argv, both spellings */
        for (int form = 0; form < 2; form++) {
            tool_config_defaults(&cfg);
            struct tool_config_args args;
            int argc;
            char *argv[2];
            if (form == 0 && f->type == PAWL_FLAG_BOOL) {
                /* A boolean is spelled bare (--name) or negated (--no-name). */
                snprintf(arg, sizeof arg, "--%s%s", strcmp(printed, "true") ? "no-" : "", f->name);
                argv[0] = arg;
                argc = 1;
            } else if (form == 0) {
                snprintf(arg, sizeof arg, "--%s", f->name);
                argv[0] = arg;
                argv[1] = v;
                argc = 2;
            } else {
                snprintf(arg, sizeof arg, "--%s=%s", f->name, v);
                argv[0] = arg;
                argc = 1;
            }
            assert_int_equal(tool_config_parse_args(&cfg, argc, argv, tool_flag_scope(f), &args,
                                                    err, sizeof err),
                             0);
            assert_int_equal(tool_config_get(&cfg, f->name, got, sizeof got), 0);
            assert_string_equal(got, printed);
            assert_int_equal(tool_config_source_of(&cfg, f->name), PAWL_SRC_FLAG);
            assert_int_equal(args.npositional, 0);
            tool_config_fini(&cfg);
        }
    }
}

static void test_precedence(void **state)
{
    (void)state;
    struct tool_config cfg;
    char err[512];
    struct tool_config_args args;
    tool_config_defaults(&cfg);
    char *envp[] = {"PAWL_RATE=100", "PAWL_APPENDERS=8", "PAWL_LOG_LEVEL=debug", NULL};
    char *argv[] = {"--rate", "300", "--log-level=error"};
    /* The tool applies defaults, then the environment, then argv: flag > env > default. */
    assert_int_equal(tool_config_load_env(&cfg, envp, err, sizeof err), 0);
    assert_int_equal(tool_config_parse_args(&cfg, 3, argv, TOOL_SCOPE_DEMO, &args, err, sizeof err),
                     0);
    assert_true(cfg.tool.rate == 300);
    assert_int_equal(tool_config_source_of(&cfg, "rate"), PAWL_SRC_FLAG);
    assert_int_equal(cfg.tool.appenders, 8);
    assert_int_equal(tool_config_source_of(&cfg, "appenders"), PAWL_SRC_ENV);
    assert_int_equal(cfg.lib.log.level, PAWL_LOG_ERROR);
    assert_int_equal(cfg.tool.events_per_append, 10);
    assert_int_equal(tool_config_source_of(&cfg, "events_per_append"), PAWL_SRC_DEFAULT);
    assert_string_equal(pawl_config_source_name(PAWL_SRC_ENV), "env");
    assert_string_equal(pawl_config_source_name(PAWL_SRC_FLAG), "flag");
    assert_string_equal(pawl_config_source_name(PAWL_SRC_DEFAULT), "default");
    tool_config_fini(&cfg);
}

/* --quiet (-q) sets the log level to warn unless the level came from as explicit a source. */
static int quiet_case(char **envp, int argc, char **argv, int *level)
{
    struct tool_config cfg;
    char err[512];
    struct tool_config_args args;
    tool_config_defaults(&cfg);
    assert_int_equal(tool_config_load_env(&cfg, envp, err, sizeof err), 0);
    assert_int_equal(
        tool_config_parse_args(&cfg, argc, argv, TOOL_SCOPE_STATUS, &args, err, sizeof err), 0);
    int quiet = tool_config_resolve_quiet(&cfg);
    *level = (int)cfg.lib.log.level;
    tool_config_fini(&cfg);
    return quiet;
}

static void test_quiet(void **state)
{
    (void)state;
    int level;
    char *none[] = {NULL};
    char *qenv[] = {"PAWL_QUIET=1", NULL};
    char *lenv[] = {"PAWL_LOG_LEVEL=debug", NULL};
    char *q[] = {"-q"}, *quiet[] = {"--quiet"}, *noquiet[] = {"--no-quiet"};
    char *q_info[] = {"--quiet", "--log-level", "info"}, *info[] = {"--log-level=info"};
    assert_int_equal(quiet_case(none, 0, NULL, &level), 0);
    assert_int_equal(level, PAWL_LOG_INFO);
    assert_int_equal(quiet_case(none, 1, q, &level), 1);
    assert_int_equal(level, PAWL_LOG_WARN);
    assert_int_equal(quiet_case(none, 1, quiet, &level), 1);
    assert_int_equal(level, PAWL_LOG_WARN);
    assert_int_equal(quiet_case(qenv, 0, NULL, &level), 1);
    assert_int_equal(level, PAWL_LOG_WARN);
    assert_int_equal(quiet_case(none, 3, q_info, &level), 0); /* an explicit --log-level wins */
    assert_int_equal(level, PAWL_LOG_INFO);
    assert_int_equal(quiet_case(qenv, 1, info, &level), 0);
    assert_int_equal(level, PAWL_LOG_INFO);
    assert_int_equal(quiet_case(lenv, 1, q, &level), 1); /* a flag over a variable */
    assert_int_equal(level, PAWL_LOG_WARN);
    assert_int_equal(quiet_case(lenv, 0, NULL, &level), 0);
    assert_int_equal(level, PAWL_LOG_DEBUG);
    assert_int_equal(quiet_case(qenv, 1, noquiet, &level), 0);
    assert_int_equal(level, PAWL_LOG_INFO);
}

struct bad {
    const char *flag;
    const char *value;
    int code;
    const char *allowed; /* expected in the message */
};

static void test_bad_values(void **state)
{
    (void)state;
    static const struct bad bad[] = {
        {"appenders", "abc", PAWL_EINVAL, "an integer in [1, 256]"},
        {"appenders", "4x", PAWL_EINVAL, "an integer in [1, 256]"},
        {"appenders", "", PAWL_EINVAL, "an integer in [1, 256]"},
        {"appenders", " 4", PAWL_EINVAL, "an integer in [1, 256]"},
        {"appenders", "0", PAWL_ERANGE, "an integer in [1, 256]"},
        {"appenders", "257", PAWL_ERANGE, "an integer in [1, 256]"},
        {"appenders", "99999999999999999999", PAWL_ERANGE, "an integer in [1, 256]"},
        {"metrics-port", "-1", PAWL_ERANGE, "[0, 65535]"},
        {"metrics-port", "65536", PAWL_ERANGE, "[0, 65535]"},
        {"rate", "fast", PAWL_EINVAL, "a number in [0, 1e+09]"},
        {"rate", "-5", PAWL_ERANGE, "a number in [0, 1e+09]"},
        {"rate", "nan", PAWL_EINVAL, "a number"},
        {"rate", "inf", PAWL_ERANGE, "a number"},
        {"rate", "1e999", PAWL_ERANGE, "a number"},
        {"duration", "ten", PAWL_EINVAL, "a duration in [0ms, 24h]"},
        {"duration", "10 s", PAWL_EINVAL, "a duration"},
        {"duration", "10d", PAWL_EINVAL, "a duration"},
        {"duration", "0.5ms", PAWL_EINVAL, "a duration"},
        {"duration", "25h", PAWL_ERANGE, "a duration in [0ms, 24h]"},
        {"duration", "-1s", PAWL_ERANGE, "a duration"},
        {"progress-interval", "50ms", PAWL_ERANGE, "[100ms, 1h]"},
        {"json", "maybe", PAWL_EINVAL, "true or false"},
        {"log-level", "verbose", PAWL_EINVAL, "one of debug, info, warn, error, off"},
        {"log-format", "xml", PAWL_EINVAL, "one of text, json"},
    };
    char err[512], before[256], after[256];
    for (size_t i = 0; i < PAWL_ARRAY_LEN(bad); i++) {
        struct tool_config cfg;
        tool_config_defaults(&cfg);
        tool_config_get(&cfg, bad[i].flag, before, sizeof before);
        int rc = tool_config_set(&cfg, bad[i].flag, bad[i].value, err, sizeof err);
        if (rc != bad[i].code)
            fail_msg("%s=%s: got %d, want %d (%s)", bad[i].flag, bad[i].value, rc, bad[i].code,
                     err);
        char want[128];
        snprintf(want, sizeof want, "\"%s\"", bad[i].value);
        if (!strstr(err, want) || !strstr(err, bad[i].flag) || !strstr(err, bad[i].allowed))
            fail_msg("message for %s=%s lacks the flag, value or range: %s", bad[i].flag,
                     bad[i].value, err);
        /* Refused values change nothing. */
        tool_config_get(&cfg, bad[i].flag, after, sizeof after);
        assert_string_equal(before, after);
        assert_int_equal(tool_config_source_of(&cfg, bad[i].flag), PAWL_SRC_DEFAULT);
        tool_config_fini(&cfg);
    }

    /* Each source names itself in the message. */
    struct tool_config cfg;
    tool_config_defaults(&cfg);
    char *envp[] = {"PAWL_APPENDERS=0", NULL};
    assert_int_equal(tool_config_load_env(&cfg, envp, err, sizeof err), PAWL_ERANGE);
    assert_non_null(strstr(err, "PAWL_APPENDERS"));
    assert_non_null(strstr(err, "\"0\""));

    /* A string over its limit. */
    char long_to[200];
    memset(long_to, 'x', sizeof long_to - 1);
    long_to[sizeof long_to - 1] = '\0';
    assert_int_equal(tool_config_set(&cfg, "to", long_to, err, sizeof err), PAWL_ERANGE);
    assert_non_null(strstr(err, "--to"));
    assert_non_null(strstr(err, "at most 64 bytes"));

    /* Unknown flags and missing values. */
    assert_int_equal(tool_config_set(&cfg, "no-such-flag", "1", err, sizeof err), PAWL_ENOTFOUND);
    assert_non_null(strstr(err, "no-such-flag"));
    assert_int_equal(tool_config_set(&cfg, "rate", NULL, err, sizeof err), PAWL_EINVAL);
    assert_int_equal(tool_config_set(&cfg, NULL, "1", err, sizeof err), PAWL_EINVAL);

    /* check() catches what an embedder assigned directly. */
    cfg.tool.appenders = 1000;
    assert_int_equal(tool_config_check(&cfg, err, sizeof err), PAWL_ERANGE);
    assert_non_null(strstr(err, "--appenders"));
    assert_non_null(strstr(err, "\"1000\""));
    cfg.tool.appenders = 4;
    cfg.lib.log.format = 7;
    assert_int_equal(tool_config_check(&cfg, err, sizeof err), PAWL_EINVAL);
    assert_non_null(strstr(err, "--log-format"));
    tool_config_fini(&cfg);
}

static void test_args_forms(void **state)
{
    (void)state;
    struct tool_config cfg;
    struct tool_config_args a;
    char err[512];
    tool_config_defaults(&cfg);
    char *argv1[] = {"myproc", "--json", "--no-metrics", "--watch", "2s", "extra", "--", "--rate"};
    assert_int_equal(tool_config_parse_args(&cfg, 8, argv1, TOOL_SCOPE_STATUS, &a, err, sizeof err),
                     0);
    assert_int_equal(cfg.tool.json, 1);
    assert_int_equal(cfg.tool.metrics, 0);
    assert_int_equal(cfg.tool.watch_ms, 2000);
    assert_int_equal(a.npositional, 3);
    assert_string_equal(a.positional[0], "myproc");
    assert_string_equal(a.positional[1], "extra");
    assert_string_equal(a.positional[2], "--rate");
    assert_int_equal(a.help, 0);

    /* A bare boolean never eats the next argument; --flag=value sets it explicitly. */
    char *argv2[] = {"--json", "false", "--json=false", "-h"};
    assert_int_equal(tool_config_parse_args(&cfg, 4, argv2, TOOL_SCOPE_STATUS, &a, err, sizeof err),
                     0);
    assert_int_equal(cfg.tool.json, 0);
    assert_int_equal(a.npositional, 1);
    assert_int_equal(a.help, 1);

    char *argv3[] = {"--rate", "5"};
    assert_int_equal(tool_config_parse_args(&cfg, 2, argv3, TOOL_SCOPE_STATUS, &a, err, sizeof err),
                     PAWL_EINVAL);
    assert_non_null(strstr(err, "--rate does not apply"));

    char *argv4[] = {"--duration"};
    assert_int_equal(tool_config_parse_args(&cfg, 1, argv4, TOOL_SCOPE_DEMO, &a, err, sizeof err),
                     PAWL_EINVAL);
    assert_non_null(strstr(err, "--duration needs a value"));

    char *argv5[] = {"--bogus=1"};
    assert_int_equal(tool_config_parse_args(&cfg, 1, argv5, TOOL_SCOPE_DEMO, &a, err, sizeof err),
                     PAWL_ENOTFOUND);
    assert_non_null(strstr(err, "unknown flag --bogus"));

    char *argv6[] = {"-x"};
    assert_int_equal(tool_config_parse_args(&cfg, 1, argv6, TOOL_SCOPE_DEMO, &a, err, sizeof err),
                     PAWL_ENOTFOUND);

    char *argv7[] = {"--appenders", "x9"};
    assert_int_equal(tool_config_parse_args(&cfg, 2, argv7, TOOL_SCOPE_DEMO, &a, err, sizeof err),
                     PAWL_EINVAL);
    assert_non_null(strstr(err, "invalid value \"x9\" for --appenders"));

    /* Durations in every unit. */
    static const struct {
        const char *text;
        int64_t ms;
    } d[] = {{"250ms", 250}, {"1m30s", 90000}, {"10s", 10000},  {"1.5s", 1500},
             {"2m", 120000}, {"2min", 120000}, {"1h", 3600000}, {"0", 0}};
    for (size_t i = 0; i < PAWL_ARRAY_LEN(d); i++) {
        assert_int_equal(tool_config_set(&cfg, "duration", d[i].text, err, sizeof err), 0);
        assert_int_equal(cfg.tool.duration_ms, d[i].ms);
    }
    /* underscore spelling and strings owned across repeated sets (ASan checks the frees) */
    assert_int_equal(tool_config_set(&cfg, "dsn", "host=/tmp dbname=a", err, sizeof err), 0);
    assert_int_equal(tool_config_set(&cfg, "DSN", "host=/tmp dbname=b", err, sizeof err), 0);
    assert_string_equal(cfg.lib.dsn, "host=/tmp dbname=b");
    assert_int_equal(tool_config_set(&cfg, "events_per_append", "10", err, sizeof err), 0);
    assert_int_equal(cfg.tool.events_per_append, 10);
    tool_config_fini(&cfg);
    assert_null(cfg.lib.dsn);
}

/* The table's defaults are the modules' own defaults: the tool and embedders agree. */
static void test_defaults_match_modules(void **state)
{
    (void)state;
    struct tool_config cfg;
    struct pawl_processor_opts po;
    tool_config_defaults(&cfg);
    pawl_processor_opts_defaults(&po);
    assert_null(cfg.lib.processor.name);
    assert_null(cfg.lib.processor.node_id);
    po.name = cfg.lib.processor.name;
    po.node_id = cfg.lib.processor.node_id;
    assert_memory_equal(&cfg.lib.processor, &po, sizeof po);
    assert_null(cfg.lib.dsn);
    struct pawl_store_opts so;
    pawl_store_opts_defaults(&so);
    assert_memory_equal(&cfg.lib.store, &so, sizeof so);
    char err[256];
    assert_int_equal(tool_config_set(&cfg, "node-id", "n1", err, sizeof err), 0);
    assert_string_equal(cfg.lib.processor.node_id, "n1");
    assert_int_equal(tool_config_set(&cfg, "node-id", "", err, sizeof err), 0);
    assert_null(cfg.lib.processor.node_id);
    tool_config_fini(&cfg);
}

static void test_apply_log(void **state)
{
    (void)state;
    struct tool_config cfg;
    char err[256];
    tool_config_defaults(&cfg);
    assert_int_equal(tool_config_set(&cfg, "log-level", "WARN", err, sizeof err), 0);
    tool_config_apply_log(&cfg);
    assert_int_equal(pawl_log_get_level(), PAWL_LOG_WARN);
    tool_config_defaults(&cfg);
    tool_config_apply_log(&cfg);
    assert_int_equal(pawl_log_get_level(), PAWL_LOG_INFO);
    char out[8];
    assert_int_equal(tool_config_get(&cfg, "progress-interval", out, 2), PAWL_ETOOBIG);
    assert_int_equal(tool_config_get(&cfg, "nope", out, sizeof out), PAWL_ENOTFOUND);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_valid), cmocka_unit_test(test_every_flag_every_source),
        cmocka_unit_test(test_precedence),     cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_args_forms),     cmocka_unit_test(test_apply_log),
        cmocka_unit_test(test_quiet),          cmocka_unit_test(test_defaults_match_modules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
