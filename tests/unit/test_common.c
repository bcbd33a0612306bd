/*
 * test_common.c — error strings, allocator hooks, the log sink and the escaping of untrusted text
 * for terminals and log lines.
 */
#include "pawl_test.h"

#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_strerror(void **state)
{
    (void)state;
    assert_string_equal(pawl_strerror(0), "success");
    assert_string_equal(pawl_strerror(PAWL_ECONFLICT), "stream sequence conflict");
    assert_string_equal(pawl_errname(PAWL_ECONFLICT), "PAWL_ECONFLICT");
    assert_string_equal(pawl_strerror(-9999), "unknown error");
    assert_string_equal(pawl_errname(-9999), "PAWL_E?");
}

static int allocs;
static void *count_malloc(size_t n)
{
    allocs++;
    return malloc(n);
}

static void test_allocator_hooks(void **state)
{
    (void)state;
    struct pawl_allocator a = {.malloc = count_malloc};
    pawl_set_allocator(&a);
    char *s = pawl__strdup("abc");
    assert_string_equal(s, "abc");
    assert_int_equal(allocs, 1);
    pawl_free(s);
    pawl_set_allocator(&(struct pawl_allocator){.malloc = malloc});
}

static char last_msg[256];
static enum pawl_log_level last_level;
static void sink(void *ud, enum pawl_log_level level, const char *module, const char *msg)
{
    (void)ud;
    last_level = level;
    snprintf(last_msg, sizeof last_msg, "%s|%s", module, msg);
}

static void test_log_sink_and_level(void **state)
{
    (void)state;
    /* The library's default: warnings and errors only, until the program asks for more. */
    assert_int_equal(pawl_log_get_level(), PAWL_LOG_WARN);
    pawl_log_set_sink(sink, NULL);
    pawl_log_set_level(PAWL_LOG_WARN);
    last_msg[0] = '\0';
    pawl_log(PAWL_LOG_INFO, "m", "hidden %d", 1);
    assert_string_equal(last_msg, "");
    pawl_log(PAWL_LOG_ERROR, "m", "shown %d", 2);
    assert_string_equal(last_msg, "m|shown 2");
    assert_int_equal(last_level, PAWL_LOG_ERROR);
    enum pawl_log_level l;
    assert_int_equal(pawl_log_level_parse("debug", &l), 0);
    assert_int_equal(l, PAWL_LOG_DEBUG);
    assert_int_equal(pawl_log_level_parse("loud", &l), PAWL_EINVAL);
    pawl_log_set_sink(NULL, NULL);
    pawl_log_set_level(PAWL_LOG_INFO);
}

static void test_printable(void **state)
{
    (void)state;
    char out[PAWL_PRINTABLE_SIZE(16)];
    /* By length: a NUL inside is shown, bytes past n are not read. */
    assert_string_equal(pawl_printable("a\0\033]0;t\007\r\\zz", 10, out, sizeof out),
                        "a\\x00\\x1b]0;t\\x07\\x0d\\\\");
    /* A C1 control (UTF-8 C2 9B) is escaped whole; a C2 cut off at n is left as it is. */
    assert_string_equal(pawl_printable("\xc2\x9b[2J\xc3\xa9", 7, out, sizeof out),
                        "\\u009b[2J\xc3\xa9");
    assert_string_equal(pawl_printable("x\xc2\x9b", 2, out, sizeof out), "x\xc2");
    assert_string_equal(pawl_printable(NULL, 3, out, sizeof out), "");
    assert_string_equal(pawl_printable_str("plain", out, sizeof out), "plain");
    /* PAWL_PRINTABLE_SIZE(n) holds n bytes of the worst kind uncut. */
    char worst[16];
    memset(worst, 0x1b, sizeof worst);
    pawl_printable(worst, sizeof worst, out, sizeof out);
    assert_int_equal(strlen(out), 4 * sizeof worst);
    assert_null(strstr(out, "..."));
    /* Cut with "..." to fit. */
    char small[8];
    assert_string_equal(pawl_printable("\033\033\033", 3, small, sizeof small), "\\x1b...");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strerror),
        cmocka_unit_test(test_allocator_hooks),
        cmocka_unit_test(test_log_sink_and_level),
        cmocka_unit_test(test_printable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
