/*
 * test_pg_fixture.c — the private PostgreSQL fixture works: a fresh database per test process.
 */
#include "pawl_test.h"

static void test_private_database(void **state)
{
    (void)state;
    const char *dsn = pawl_test_db_create("fixture");
    pawl_test_exec(dsn, "CREATE TABLE t (x int); INSERT INTO t VALUES (1), (2)");
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT sum(x) FROM t"), 3);
    assert_int_equal(pawl_test_query_i64(dsn, "SHOW server_version_num") / 10000, 15);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_private_database)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
