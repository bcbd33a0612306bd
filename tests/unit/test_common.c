/*
 * test_common.c — error strings, allocator hooks and the log sink.
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
    char *s = pawl_strdup("abc");
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strerror),
        cmocka_unit_test(test_allocator_hooks),
        cmocka_unit_test(test_log_sink_and_level),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
