/*
 * test_log_retention.c — schema 9 from the C API: a log written at schema 7 (with a role's
 * grant on pawl.events) is converted with its data (the same events, indexes and grants, the
 * partitions granting nothing), rotated and truncated; pawl_read below the low-watermark fails
 * with PAWL_ETRUNCATED and a message naming it, from it reads on unchanged, and a stream whose
 * events were all dropped continues its sequence through pawl_append. And the log's guard: an
 * append whose snapshot predates a rotation is refused (serialization failure, retry), on the
 * server path this run has (C or PL/pgSQL; the *_sql rerun takes the other).
 */
#include "pawl_test.h"
#include "schema.h"

#include <libpq-fe.h>
#include <pawl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char events_digest[] =
    "SELECT ('x' || left(md5(string_agg(global_index || ' ' || stream_id || '#' || stream_seq "
    "|| ' ' || type || ' ' || encode(payload, 'hex'), ',' ORDER BY global_index)), 15))::bit(60)"
    "::int8 FROM pawl_api.events";

static void test_convert_rotate_drop(void **state)
{
    (void)state;
    char err[512], d[1024], name[160];
    snprintf(name, sizeof name, "t_log_retention_%d", (int)getpid());
    pawl_test_db_make(pawl_test_dsn(), name, NULL, d, sizeof d);
    assert_int_equal(pawl__schema_migrate_to(d, 7, err, sizeof err), 0);
    pawl_test_exec(d, "DO $$BEGIN CREATE ROLE pawl_retention_test NOLOGIN; "
                      "EXCEPTION WHEN duplicate_object THEN NULL; END$$;"
                      "GRANT SELECT ON pawl.events TO pawl_retention_test");
    /* 200 events in 20 transactions, on 7 streams (s6 only here). */
    for (int i = 0; i < 20; i++) {
        char q[200];
        snprintf(q, sizeof q,
                 "SELECT pawl_api.append('s' || j %% 7, 'T', int4send(j)) FROM "
                 "generate_series(%d, %d) j",
                 i * 10, i * 10 + 9);
        pawl_test_exec(d, q);
    }
    assert_int_equal(pawl_test_query_i64(d, "SELECT events FROM pawl.finalize()"), 200);
    int64_t before = pawl_test_query_i64(d, events_digest);

    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    assert_int_equal(pawl_test_query_i64(d, events_digest), before);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pg_partition_tree("
                                            "'pawl.events') WHERE isleaf"),
                     1);
    assert_int_equal(pawl_test_query_i64(d, "SELECT has_table_privilege('pawl_retention_test',"
                                            " 'pawl.events', 'SELECT')::int"),
                     1);
    assert_int_equal(pawl_test_query_i64(d, "SELECT has_table_privilege('pawl_retention_test',"
                                            " 'pawl.events_0001', 'SELECT')::int"),
                     0);

    struct pawl_store *s = NULL;
    assert_int_equal(pawl_store_new(&s, d, NULL, err, sizeof err), 0);
    /* A rotation closes the partition at the cluster's oldest running transaction, in any
     * database: while another test's transaction older than these events runs, some of them
     * would move to the new partition. Wait until every such transaction has ended. */
    for (int i = 0; i < 600 && pawl_test_query_i64(d, "SELECT (pg_snapshot_xmin("
                                                      "pg_current_snapshot()) > (SELECT max(xid) "
                                                      "FROM pawl.events))::int") == 0;
         i++)
        usleep(100000);
    assert_true(pawl_test_query_i64(d, "SELECT length(pawl.rotate())") > 0);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl.events_0001"), 200);
    struct pawl_event e[3];
    for (int i = 0; i < 3; i++)
        e[i] = (struct pawl_event){.stream_id = "s1",
                                   .type = "After",
                                   .payload = "{}",
                                   .payload_len = 2,
                                   .stream_seq = PAWL_SEQ_ANY};
    assert_int_equal(pawl_append(s, e, 3, NULL), 0);
    int64_t last = 0;
    assert_int_equal(pawl_finalize_now(s, NULL, NULL, &last), 0);
    assert_int_equal(last, 203);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl.retention_drop(201)"), 1);
    assert_int_equal(pawl_test_query_i64(d, "SELECT pawl_api.first_index()"), 201);

    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    assert_int_equal(pawl_read(s, 0, 10, &b), PAWL_ETRUNCATED);
    pawl_store_errmsg(s, err, sizeof err);
    assert_non_null(strstr(err, "starts at index 201"));
    assert_int_equal(pawl_read(s, 199, 10, &b), PAWL_ETRUNCATED);
    assert_int_equal(pawl_read(s, 200, 10, &b), 0);
    assert_int_equal(b.count, 3);
    assert_int_equal(b.events[0].index, 201);
    assert_string_equal(b.events[0].stream_id, "s1");

    /* s6 lived only in the dropped partition (28 events: i = 6, 13, ..., 195). */
    struct pawl_event again = {.stream_id = "s6",
                               .type = "Again",
                               .payload = "{}",
                               .payload_len = 2,
                               .stream_seq = PAWL_SEQ_ANY};
    struct pawl_append_result r;
    if (pawl_append(s, &again, 1, &r) != 0)
        fail_msg("append to s6: %s (%s)", r.message, r.sqlstate);
    assert_int_equal(pawl_test_query_i64(d, "SELECT max(stream_seq) FROM pawl.events WHERE "
                                            "stream_id = 's6'"),
                     29);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl.events WHERE "
                                            "stream_id = 's6'"),
                     1);
    assert_int_equal(pawl_test_query_i64(d, "SELECT pawl_api.stream_version('s6')"), 29);
    pawl_read_batch_fini(&b);
    pawl_store_free(s);
    pawl_test_db_drop(pawl_test_dsn(), name);
}

static void test_guard_refuses_stale_snapshot(void **state)
{
    (void)state;
    char err[512], d[1024], name[160];
    snprintf(name, sizeof name, "t_log_guard_%d", (int)getpid());
    pawl_test_db_make(pawl_test_dsn(), name, NULL, d, sizeof d);
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    pawl_test_exec(d, "SELECT pawl_api.append('g-1', 'T', '\\x01')");
    PGconn *a = PQconnectdb(d);
    assert_int_equal(PQstatus(a), CONNECTION_OK);
    /* A's snapshot, taken before the rotation commits. */
    PQclear(PQexec(a, "BEGIN ISOLATION LEVEL REPEATABLE READ"));
    PQclear(PQexec(a, "SELECT 1"));
    assert_int_equal(pawl_test_query_i64(d, "SELECT (pawl.rotate() IS NOT NULL)::int"), 1);
    PGresult *r = PQexec(a, "SELECT pawl_api.append('g-1', 'T', '\\x02')");
    assert_int_equal(PQresultStatus(r), PGRES_FATAL_ERROR);
    assert_string_equal(PQresultErrorField(r, PG_DIAG_SQLSTATE), "40001");
    assert_non_null(strstr(PQresultErrorMessage(r), "rotated or truncated"));
    PQclear(r);
    PQclear(PQexec(a, "ROLLBACK"));
    /* A new transaction appends. */
    r = PQexec(a, "SELECT pawl_api.append('g-1', 'T', '\\x02')");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_string_equal(PQgetvalue(r, 0, 0), "2");
    PQclear(r);
    PQfinish(a);
    print_message("the guard is %s\n",
                  pawl_test_query_i64(d, "SELECT (l.lanname = 'c')::int FROM pg_proc p JOIN "
                                         "pg_language l ON l.oid = p.prolang WHERE p.oid = "
                                         "'pawl.events_guard()'::regprocedure")
                      ? "the C function"
                      : "the PL/pgSQL function");
    pawl_test_db_drop(pawl_test_dsn(), name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_convert_rotate_drop),
        cmocka_unit_test(test_guard_refuses_stale_snapshot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
