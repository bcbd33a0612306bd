/*
 * test_dsn.c — DSN checking and password redaction.
 */
#include "pawl_test.h"

#include "dsn.h"

#include <string.h>

static void test_redact_keyword_form(void **state)
{
    (void)state;
    char out[256];
    pawl_dsn_redact("host=/tmp/x dbname=pawl user=u password=s3cret", out, sizeof out);
    assert_null(strstr(out, "s3cret"));
    assert_non_null(strstr(out, "password=***"));
    assert_non_null(strstr(out, "dbname=pawl"));
}

static void test_redact_uri_form(void **state)
{
    (void)state;
    char out[256];
    pawl_dsn_redact("postgresql://alice:hunter2@localhost:5433/db", out, sizeof out);
    assert_null(strstr(out, "hunter2"));
    assert_non_null(strstr(out, "user=alice"));
    assert_non_null(strstr(out, "port=5433"));
}

static void test_invalid(void **state)
{
    (void)state;
    char err[256], out[64];
    assert_int_equal(pawl_dsn_check("host=x nonsense_key=1", err, sizeof err), PAWL_EINVAL);
    assert_non_null(strstr(err, "nonsense_key"));
    assert_int_equal(pawl_dsn_check("dbname='unterminated", err, sizeof err), PAWL_EINVAL);
    assert_int_equal(pawl_dsn_check(NULL, err, sizeof err), PAWL_EINVAL);
    assert_int_equal(pawl_dsn_check("host=/tmp dbname=x", NULL, 0), 0);
    assert_string_equal(pawl_dsn_redact("password='oops", out, sizeof out), "<invalid dsn>");
    /* Truncation still terminates and never cuts into a half-printed password. */
    char tiny[8];
    pawl_dsn_redact("host=averyveryverylonghostname password=x", tiny, sizeof tiny);
    assert_true(strlen(tiny) < sizeof tiny);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_redact_keyword_form),
        cmocka_unit_test(test_redact_uri_form),
        cmocka_unit_test(test_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
