/*
 * test_log_basic.c — the event log end to end on one store: schema migration (idempotent,
 * concurrent, newer-schema error), appends (one, batch, several streams, ANY), the documented
 * errors (conflict, oversized, malformed, bad DSN), reading and following, and the SQL face
 * returning exactly what the C reader returns.
 */
#include "pawl_test.h"
#include "schema.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *dsn;

static struct pawl_store *open_store_with(const struct pawl_store_opts *o)
{
    struct pawl_store *s = NULL;
    char err[512];
    int rc = pawl_store_new(&s, dsn, o, err, sizeof err);
    if (rc != 0)
        fail_msg("store: %s: %s", pawl_strerror(rc), err);
    return s;
}

static struct pawl_store *open_store(int finalizer)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.finalizer = finalizer;
    o.max_event_bytes = 4096;
    return open_store_with(&o);
}

static struct pawl_event ev(const char *stream, int64_t seq, const char *type, const char *payload)
{
    struct pawl_event e = {0};
    e.stream_id = stream;
    e.stream_seq = seq;
    e.type = type;
    e.payload = payload;
    e.payload_len = payload ? strlen(payload) : 0;
    return e;
}

static void *migrate_thread(void *arg)
{
    char err[256];
    intptr_t rc = pawl_schema_migrate((const char *)arg, err, sizeof err);
    return (void *)rc;
}

static void test_schema(void **state)
{
    (void)state;
    char err[512];
    int dbv = -1, libv = -1;
    assert_int_equal(pawl_schema_version(dsn, &dbv, &libv, err, sizeof err), 0);
    assert_int_equal(dbv, 0);
    assert_true(libv >= 1);
    /* A store refuses a database without the schema. */
    struct pawl_store *s = NULL;
    assert_int_equal(pawl_store_new(&s, dsn, NULL, err, sizeof err), PAWL_ESCHEMA);
    assert_non_null(strstr(err, "pawl init"));
    /* Four concurrent migrators agree; running it again is harmless. */
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, migrate_thread, (void *)dsn);
    for (int i = 0; i < 4; i++) {
        void *rc;
        pthread_join(t[i], &rc);
        assert_int_equal((intptr_t)rc, 0);
    }
    assert_int_equal(pawl_schema_migrate(dsn, err, sizeof err), 0);
    assert_int_equal(pawl_schema_version(dsn, &dbv, NULL, err, sizeof err), 0);
    assert_int_equal(dbv, libv);
    /* Each migration recorded once (versions may have gaps: their count, not the last one). */
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl.schema_version"),
                     pawl_migrations_count);
}

/* A second database for one test, t_log_basic_<suffix>_<pid>, created with `with` (SQL after
 * CREATE DATABASE name, may be NULL); its DSN goes to out and its name to name. */
static void other_db(const char *suffix, const char *with, char *out, size_t outlen, char *name,
                     size_t namelen)
{
    snprintf(name, namelen, "t_log_basic_%s_%d", suffix, (int)getpid());
    pawl_test_db_make(pawl_test_dsn(), name, with, out, outlen);
}

static void test_newer_schema(void **state)
{
    (void)state;
    char err[512], d2[1024], name[160];
    /* A second database whose schema claims a future version. */
    other_db("f", NULL, d2, sizeof d2, name, sizeof name);
    assert_int_equal(pawl_schema_migrate(d2, err, sizeof err), 0);
    pawl_test_exec(d2, "INSERT INTO pawl.schema_version VALUES (999, '999_future.sql')");
    assert_int_equal(pawl_schema_migrate(d2, err, sizeof err), PAWL_ESCHEMA);
    assert_non_null(strstr(err, "999"));
    struct pawl_store *s = NULL;
    assert_int_equal(pawl_store_new(&s, d2, NULL, err, sizeof err), PAWL_ESCHEMA);
    assert_non_null(strstr(err, "999"));
    pawl_test_db_drop(pawl_test_dsn(), name);
}

/*
 * Schema 4 gives stream ids the "C" collation (sql/004_stream_collation.sql). A version-3 log in
 * a database whose default collation is linguistic (ICU en-US: "a" < "b" < "B") is upgraded:
 * every event stays, readable by the store and the SQL face; the (stream, sequence) index now
 * orders by bytes ("B" < "a"); appends after the upgrade find the old heads.
 */
static void test_upgrade_stream_collation(void **state)
{
    (void)state;
    char err[512], d3[1024], name[160];
    other_db("u", "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'", d3, sizeof d3, name,
             sizeof name);
    assert_int_equal(pawl__schema_migrate_to(d3, 3, err, sizeof err), 0);
    int dbv = 0;
    assert_int_equal(pawl_schema_version(d3, &dbv, NULL, err, sizeof err), 0);
    assert_int_equal(dbv, 3);
    static const char is_c[] =
        "SELECT count(*) FROM pg_attribute WHERE attrelid = 'pawl.events'::regclass"
        " AND attname = 'stream_id' AND attcollation = 'pg_catalog.\"C\"'::regcollation";
    assert_int_equal(pawl_test_query_i64(d3, is_c), 0);
    /* Two appends written the way the version-3 append statement writes them, finalized. */
    pawl_test_exec(d3, "INSERT INTO pawl.events (xid, stream_seq, k, n, stream_id, type, payload)"
                       " VALUES (pg_current_xact_id(), 1, 0, 2, 'a', 't', 'a1'),"
                       "        (pg_current_xact_id(), 1, 1, 2, 'B', 't', 'B1')");
    pawl_test_exec(d3, "INSERT INTO pawl.events (xid, stream_seq, k, n, stream_id, type, payload)"
                       " VALUES (pg_current_xact_id(), 1, 0, 2, 'b', 't', 'b1'),"
                       "        (pg_current_xact_id(), 2, 1, 2, 'b', 't', 'b2')");
    assert_int_equal(pawl_test_query_i64(d3, "SELECT last_index FROM pawl.finalize()"), 4);
    static const char first[] =
        "SELECT ((SELECT stream_id FROM pawl.events ORDER BY stream_id LIMIT 1) = 'B')::int";
    assert_int_equal(pawl_test_query_i64(d3, first), 0); /* linguistic: "a" first */
    /* A version-3 database is refused by a store of this version until it is upgraded. */
    struct pawl_store *s = NULL;
    assert_int_equal(pawl_store_new(&s, d3, NULL, err, sizeof err), PAWL_ESCHEMA);

    assert_int_equal(pawl_schema_migrate(d3, err, sizeof err), 0);
    assert_int_equal(pawl_schema_version(d3, &dbv, NULL, err, sizeof err), 0);
    assert_int_equal(dbv, pawl__schema_lib_version());
    assert_int_equal(pawl_test_query_i64(d3, is_c), 1);
    assert_int_equal(pawl_test_query_i64(d3, first), 1); /* bytes: "B" first */
    /* The index serves that order (and the head lookups) by itself. */
    pawl_test_exec(d3, "SET enable_seqscan = off");
    assert_int_equal(pawl_test_query_i64(d3, "SELECT count(*) FROM pawl_api.events"), 4);
    assert_int_equal(pawl_test_query_i64(d3, "SELECT count(*) FROM pawl_api.read(0, 10)"
                                             " WHERE stream_id = 'b'"),
                     2);

    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.migrate = 0;
    assert_int_equal(pawl_store_new(&s, d3, &o, err, sizeof err), 0);
    struct pawl_append_result r;
    struct pawl_event next[2] = {ev("b", 3, "t", "b3"), ev("a", PAWL_SEQ_ANY, "t", "a2")};
    assert_int_equal(pawl_append(s, next, 2, &r), 0);
    struct pawl_event dup = ev("B", 1, "t", "again");
    assert_int_equal(pawl_append(s, &dup, 1, &r), PAWL_ECONFLICT);
    struct pawl_read_batch bt;
    pawl_read_batch_init(&bt);
    int64_t pos = 0;
    while (pos < 6) {
        assert_int_equal(pawl_follow(s, pos, 100, &bt, 5000), 0);
        for (size_t i = 0; i < bt.count; i++) {
            assert_int_equal(bt.events[i].index, pos + 1);
            pos = bt.events[i].index;
        }
    }
    assert_int_equal(pawl_read(s, 0, 10, &bt), 0);
    assert_int_equal(bt.count, 6);
    static const char *want[6][2] = {{"a", "1"}, {"B", "1"}, {"b", "1"},
                                     {"b", "2"}, {"b", "3"}, {"a", "2"}};
    for (int i = 0; i < 6; i++) {
        assert_string_equal(bt.events[i].stream_id, want[i][0]);
        assert_int_equal(bt.events[i].stream_seq, atoi(want[i][1]));
    }
    pawl_read_batch_fini(&bt);
    pawl_store_free(s);
    pawl_test_db_drop(pawl_test_dsn(), name);
}

/*
 * Schema 5 stores the run rows' arrays uncompressed (sql/005_runs_inline.sql): a run of 300
 * one-event appends is compressed under schema 4; after the upgrade the old run stays readable,
 * a new run of 300 stays inline and uncompressed (no new TOAST chunk), a run of 1200 goes out of
 * line uncompressed, and the store and the SQL face read all of it, 1..N.
 */
static void appends_in_own_txns(const char *d, int n, const char *tag)
{
    char q[512];
    snprintf(q, sizeof q,
             "DO $$ BEGIN FOR i IN 1..%d LOOP"
             " INSERT INTO pawl.events (xid, stream_seq, k, n, stream_id, type, payload)"
             " VALUES (pg_current_xact_id(), 1, 0, 1, '%s-' || i, 't', '\\x00'); COMMIT;"
             " END LOOP; END $$",
             n, tag);
    pawl_test_exec(d, q);
}

static void test_runs_inline(void **state)
{
    (void)state;
    char err[512], d[1024], name[160];
    other_db("r", NULL, d, sizeof d, name, sizeof name);
    assert_int_equal(pawl__schema_migrate_to(d, 4, err, sizeof err), 0);
    static const char last_compressed[] =
        "SELECT (pg_column_compression(xids) IS NOT NULL)::int FROM pawl.runs"
        " ORDER BY last_index DESC LIMIT 1";
    char toast_rows[128]; /* chunks in pawl.runs' TOAST table (named after the table's oid) */
    snprintf(toast_rows, sizeof toast_rows, "SELECT count(*) FROM pg_toast.pg_toast_%lld",
             (long long)pawl_test_query_i64(d, "SELECT 'pawl.runs'::regclass::oid::int8"));
    appends_in_own_txns(d, 300, "v4");
    assert_int_equal(pawl_test_query_i64(d, "SELECT appends FROM pawl.finalize()"), 300);
    assert_int_equal(pawl_test_query_i64(d, last_compressed), 1); /* the old storage */

    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    int64_t chunks = pawl_test_query_i64(d, toast_rows);
    appends_in_own_txns(d, 300, "v5a");
    assert_int_equal(pawl_test_query_i64(d, "SELECT appends FROM pawl.finalize()"), 300);
    assert_int_equal(pawl_test_query_i64(d, last_compressed), 0);
    assert_int_equal(pawl_test_query_i64(d, toast_rows), chunks); /* inline */
    appends_in_own_txns(d, 1200, "v5b");
    assert_int_equal(pawl_test_query_i64(d, "SELECT appends FROM pawl.finalize()"), 1200);
    assert_int_equal(pawl_test_query_i64(d, last_compressed), 0);
    assert_true(pawl_test_query_i64(d, toast_rows) > chunks); /* out of line, uncompressed */

    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.finalizer = 0;
    struct pawl_store *s = NULL;
    assert_int_equal(pawl_store_new(&s, d, &o, err, sizeof err), 0);
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    int64_t pos = 0;
    while (pos < 1800) {
        assert_int_equal(pawl_read(s, pos, 777, &b), 0);
        assert_true(b.count > 0);
        for (size_t i = 0; i < b.count; i++)
            assert_int_equal(b.events[i].index, pos + 1 + (int64_t)i);
        pos += (int64_t)b.count;
    }
    assert_int_equal(pawl_read(s, pos, 10, &b), 0);
    assert_int_equal(b.count, 0);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl_api.read(0, 100000)"), 1800);
    assert_int_equal(pawl_test_query_i64(d, "SELECT max(global_index) - min(global_index) + 1"
                                            " FROM pawl_api.events"),
                     1800);
    pawl_read_batch_fini(&b);
    pawl_store_free(s);
    pawl_test_db_drop(pawl_test_dsn(), name);
}

/* Async append callback for test_append_seqs: copies what the store reported. */
struct seqs_seen {
    int rc;
    int had_seqs;
    int64_t seqs[8];
};

static void seqs_cb(void *ud, const struct pawl_append_result *r)
{
    struct seqs_seen *w = ud;
    w->rc = r->rc;
    w->had_seqs = r->seqs != NULL;
    if (r->seqs)
        memcpy(w->seqs, r->seqs, 5 * sizeof *r->seqs);
}

/*
 * Every event's assigned number is reported, whatever its stream, through the blocking, the
 * async and the caller's-transaction appends; explicit numbers come back as asked.
 */
static void test_append_seqs(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1);
    struct pawl_append_result r;
    int64_t seqs[8];
    struct pawl_event pre[3] = {ev("sq-a", 0, "t", ""), ev("sq-a", 0, "t", ""),
                                ev("sq-b", 0, "t", "")};
    assert_int_equal(pawl_append_seqs(s, pre, 3, seqs, &r), 0);
    assert_ptr_equal(r.seqs, seqs);
    assert_int_equal(seqs[0], 1);
    assert_int_equal(seqs[1], 2);
    assert_int_equal(seqs[2], 1);
    /* Mixed streams, "next position", interleaved: a at 2, b at 1, c new. */
    struct pawl_event mix[5] = {ev("sq-a", 0, "t", ""), ev("sq-b", 0, "t", ""),
                                ev("sq-c", 0, "t", ""), ev("sq-a", 0, "t", ""),
                                ev("sq-b", 0, "t", "")};
    assert_int_equal(pawl_append_seqs(s, mix, 5, seqs, &r), 0);
    int64_t want1[5] = {3, 2, 1, 4, 3};
    for (int i = 0; i < 5; i++)
        assert_int_equal(seqs[i], want1[i]);
    assert_int_equal(r.first_seq, 3);
    assert_int_equal(r.last_seq, 4);
    /* pawl_append keeps no numbers of its own. */
    assert_int_equal(pawl_append(s, mix, 1, &r), 0);
    assert_null(r.seqs);
    assert_int_equal(r.first_seq, 5);
    /* Async: borrowed during the callback. Explicit numbers mixed with "next position". */
    struct pawl_event amix[5] = {ev("sq-c", 2, "t", ""), ev("sq-a", 0, "t", ""),
                                 ev("sq-c", 3, "t", ""), ev("sq-d", 0, "t", ""),
                                 ev("sq-a", 0, "t", "")};
    struct seqs_seen w = {.rc = -1};
    assert_int_equal(pawl_append_async(s, amix, 5, seqs_cb, &w), 0);
    pawl_store_drain(s);
    assert_int_equal(w.rc, 0);
    assert_true(w.had_seqs);
    int64_t want2[5] = {2, 6, 3, 1, 7};
    for (int i = 0; i < 5; i++)
        assert_int_equal(w.seqs[i], want2[i]);
    /* A conflict writes nothing into seqs. */
    memset(seqs, 0x5a, sizeof seqs);
    struct pawl_event stale[2] = {ev("sq-b", 0, "t", ""), ev("sq-a", 3, "t", "")};
    assert_int_equal(pawl_append_seqs(s, stale, 2, seqs, &r), PAWL_ECONFLICT);
    assert_null(r.seqs);
    assert_int_equal(seqs[0], 0x5a5a5a5a5a5a5a5aLL);
    /* In the caller's transaction. */
    PGconn *c = PQconnectdb(dsn);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    PQclear(PQexec(c, "BEGIN"));
    struct pawl_event out[3] = {ev("sq-d", 0, "t", ""), ev("sq-b", 0, "t", ""),
                                ev("sq-d", 0, "t", "")};
    assert_int_equal(pawl_append_in_seqs(c, out, 3, seqs, &r), 0);
    assert_ptr_equal(r.seqs, seqs);
    PQclear(PQexec(c, "COMMIT"));
    PQfinish(c);
    int64_t want3[3] = {2, 4, 3};
    for (int i = 0; i < 3; i++)
        assert_int_equal(seqs[i], want3[i]);
    /* And what was reported is what the log holds. */
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT max(stream_seq) FROM pawl.events"
                                              " WHERE stream_id = 'sq-a'"),
                     7);
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT max(stream_seq) FROM pawl.events"
                                              " WHERE stream_id = 'sq-d'"),
                     3);
    pawl_store_free(s);
}

static void test_append_read(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1);
    struct pawl_append_result r;
    struct pawl_event one = ev("order-1", 1, "created", "{\"n\":1}");
    one.metadata = "{\"who\": \"test\", \"n\": [1, 2.5e3, true, null]}";
    assert_int_equal(pawl_append(s, &one, 1, &r), 0);
    assert_int_equal(r.rc, 0);
    /* A batch over two streams, explicit and ANY. */
    struct pawl_event b[4] = {ev("order-1", 2, "paid", "x"), ev("order-2", 0, "created", ""),
                              ev("order-1", 3, "shipped", NULL), ev("order-2", 0, "paid", "yy")};
    assert_int_equal(pawl_append(s, b, 4, &r), 0);
    /* The sequence numbers given to events[0]'s stream are reported. */
    assert_int_equal(r.first_seq, 2);
    assert_int_equal(r.last_seq, 3);
    /* Conflicts write nothing. */
    struct pawl_event dup = ev("order-1", 3, "again", "z");
    assert_int_equal(pawl_append(s, &dup, 1, &r), PAWL_ECONFLICT);
    assert_int_equal(r.rc, PAWL_ECONFLICT);
    struct pawl_event gap = ev("order-1", 9, "gap", "z");
    assert_int_equal(pawl_append(s, &gap, 1, &r), PAWL_ECONFLICT);
    struct pawl_event mixed[2] = {ev("order-3", 1, "a", ""), ev("order-1", 5, "b", "")};
    assert_int_equal(pawl_append(s, mixed, 2, &r), PAWL_ECONFLICT);
    /* Expected new (1) but the stream exists: found by the head lookup, so an append in the
     * caller's own transaction (pawl_append_in) is refused without aborting it. */
    struct pawl_event renew = ev("order-1", 1, "again", "z");
    assert_int_equal(pawl_append(s, &renew, 1, &r), PAWL_ECONFLICT);
    assert_string_equal(r.sqlstate, "");
    struct pawl_event renew2[3] = {ev("order-4", 1, "a", ""), ev("order-2", 1, "b", ""),
                                   ev("order-4", 2, "c", "")};
    assert_int_equal(pawl_append(s, renew2, 3, &r), PAWL_ECONFLICT);
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl.events WHERE "
                                              "stream_id IN ('order-3', 'order-4')"),
                     0);
    /* Refused before the server: oversized, malformed. */
    char big[5000];
    memset(big, 'x', sizeof big);
    struct pawl_event huge = ev("order-9", 0, "big", NULL);
    huge.payload = big;
    huge.payload_len = sizeof big;
    assert_int_equal(pawl_append(s, &huge, 1, &r), PAWL_ETOOBIG);
    struct pawl_event badmeta = ev("order-9", 0, "t", "");
    badmeta.metadata = "{\"a\": }";
    assert_int_equal(pawl_append(s, &badmeta, 1, &r), PAWL_EINVAL);
    assert_non_null(strstr(r.message, "event 0: metadata is not a JSON object"));
    assert_non_null(strstr(r.message, "column")); /* where the parser stopped */
    badmeta.metadata = "{\"a\": \"\\u0000\"}";
    assert_int_equal(pawl_append(s, &badmeta, 1, &r), PAWL_EINVAL);
    badmeta.metadata = "[1]";
    assert_int_equal(pawl_append(s, &badmeta, 1, &r), PAWL_EINVAL);
    struct pawl_event badutf = ev("order-\xff", 0, "t", "");
    assert_int_equal(pawl_append(s, &badutf, 1, &r), PAWL_EINVAL);
    struct pawl_event empty = ev("", 0, "t", "");
    assert_int_equal(pawl_append(s, &empty, 1, &r), PAWL_EINVAL);
    struct pawl_event noncons[2] = {ev("order-4", 1, "a", ""), ev("order-4", 3, "b", "")};
    assert_int_equal(pawl_append(s, noncons, 2, &r), PAWL_EINVAL);
    assert_int_equal(pawl_append(s, NULL, 0, &r), PAWL_EINVAL);

    /* Exactly the committed events are in the log. */
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl.events"), 5);
    /* Follow until all 5 are final. */
    struct pawl_read_batch bt;
    pawl_read_batch_init(&bt);
    int64_t pos = 0;
    int64_t seen = 0;
    while (seen < 5) {
        int rc = pawl_follow(s, pos, 100, &bt, 5000);
        assert_int_equal(rc, 0);
        for (size_t i = 0; i < bt.count; i++) {
            assert_int_equal(bt.events[i].index, pos + 1);
            pos = bt.events[i].index;
            seen++;
        }
    }
    assert_int_equal(pos, 5);
    assert_int_equal(pawl_read(s, 0, 10, &bt), 0);
    assert_int_equal(bt.count, 5);
    assert_string_equal(bt.events[0].stream_id, "order-1");
    assert_int_equal(bt.events[0].stream_seq, 1);
    assert_string_equal(bt.events[0].type, "created");
    assert_int_equal(bt.events[0].payload_len, 7);
    assert_memory_equal(bt.events[0].payload, "{\"n\":1}", 7);
    assert_non_null(bt.events[0].metadata);
    assert_non_null(strstr(bt.events[0].metadata, "\"who\""));
    assert_true(bt.events[0].appended_at_us > 1600000000000000LL);
    assert_string_equal(bt.events[2].stream_id, "order-2");
    assert_int_equal(bt.events[2].stream_seq, 1);
    assert_int_equal(bt.events[4].stream_seq, 2);
    assert_null(bt.events[3].metadata);
    assert_int_equal(bt.events[3].payload_len, 0);
    /* A timeout when nothing new comes. */
    double t0 = pawl_test_now_ms();
    assert_int_equal(pawl_follow(s, 5, 10, &bt, 200), PAWL_ETIMEDOUT);
    assert_true(pawl_test_now_ms() - t0 >= 150);
    pawl_read_batch_fini(&bt);

    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    assert_int_equal(st.appends_ok, 2);
    assert_int_equal(st.events_ok, 5);
    assert_true(st.last_index >= 5);
    pawl_store_free(s);
}

/* Issue test 6: the C reader and the SQL face agree, for every position and batch size. */
static void test_sql_face_equal(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1);
    /* Appends of mixed sizes so batches cross append and run boundaries. */
    for (int i = 0; i < 40; i++) {
        struct pawl_event e[7];
        char sid[32];
        snprintf(sid, sizeof sid, "face-%d", i % 5);
        int n = 1 + i % 7;
        for (int k = 0; k < n; k++)
            e[k] = ev(sid, 0, k % 2 ? "odd" : "even", "payload\x01\x02");
        e[0].metadata = "{\"i\": 1}";
        assert_int_equal(pawl_append(s, e, (size_t)n, NULL), 0);
        if (i % 9 == 0)
            pawl_finalize_now(s, NULL, NULL, NULL);
    }
    int64_t a, evs, last = 0;
    while (pawl_store_last_index(s) < pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl.events"))
        assert_int_equal(pawl_finalize_now(s, &a, &evs, &last), 0);
    int64_t total = pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl.events");
    assert_int_equal(pawl_store_last_index(s), total);
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl_api.events"), total);

    PGconn *c = PQconnectdb(dsn);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    int sizes[] = {1, 3, 10, 1000};
    for (int si = 0; si < 4; si++) {
        for (int64_t after = 0; after <= total; after += (si == 3 ? 17 : 1)) {
            assert_int_equal(pawl_read(s, after, (size_t)sizes[si], &b), 0);
            char q[256];
            snprintf(q, sizeof q,
                     "SELECT global_index, stream_id, stream_seq, type, encode(payload, 'hex'), "
                     "metadata::text, (extract(epoch from appended_at) * 1000000)::int8 "
                     "FROM pawl_api.read(%lld, %d)",
                     (long long)after, sizes[si]);
            PGresult *r = PQexec(c, q);
            assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
            assert_int_equal((size_t)PQntuples(r), b.count);
            for (size_t i = 0; i < b.count; i++) {
                const struct pawl_event *e = &b.events[i];
                assert_int_equal(e->index, strtoll(PQgetvalue(r, (int)i, 0), NULL, 10));
                assert_string_equal(e->stream_id, PQgetvalue(r, (int)i, 1));
                assert_int_equal(e->stream_seq, strtoll(PQgetvalue(r, (int)i, 2), NULL, 10));
                assert_string_equal(e->type, PQgetvalue(r, (int)i, 3));
                char hex[64] = {0};
                for (size_t k = 0; k < e->payload_len && k < 31; k++)
                    sprintf(hex + 2 * k, "%02x", ((const unsigned char *)e->payload)[k]);
                assert_string_equal(hex, PQgetvalue(r, (int)i, 4));
                if (PQgetisnull(r, (int)i, 5))
                    assert_null(e->metadata);
                else
                    assert_string_equal(e->metadata, PQgetvalue(r, (int)i, 5));
                assert_int_equal(e->appended_at_us, strtoll(PQgetvalue(r, (int)i, 6), NULL, 10));
            }
            PQclear(r);
            /* And the view holds the same rows for that range. */
            snprintf(q, sizeof q,
                     "SELECT count(*) FROM pawl_api.events WHERE global_index > %lld AND "
                     "global_index <= %lld",
                     (long long)after, (long long)(after + sizes[si]));
            r = PQexec(c, q);
            assert_int_equal(strtoll(PQgetvalue(r, 0, 0), NULL, 10), (long long)b.count);
            PQclear(r);
        }
    }
    pawl_read_batch_fini(&b);
    PQfinish(c);
    pawl_store_free(s);
}

/* Total size of the unique indexes of pawl.events' partitions, in bytes. */
static int64_t events_index_bytes(const char *d)
{
    return pawl_test_query_i64(d,
                               "SELECT sum(pg_relation_size(i.indexrelid))::int8 FROM pg_index i "
                               "WHERE i.indrelid IN (SELECT relid FROM "
                               "pg_partition_tree('pawl.events') WHERE isleaf)");
}

/*
 * An append's rows are written in event order (schema 12): k and each stream's sequence numbers
 * ascending, so the unique indexes take their entries in ascending order and stay as compact as
 * when rebuilt. Schema 11 wrote a multi-event append last event first; its indexes grew to about
 * 1.7x their rebuilt size. Checked for the library's append (a group of one), an append in the
 * caller's transaction after an earlier one (k continues), and the SQL face's batch over two
 * interleaved streams.
 */
static void test_append_row_order(void **state)
{
    (void)state;
    char d[1024], name[160], err[512];
    other_db("order", NULL, d, sizeof d, name, sizeof name);
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.finalizer = 0;
    struct pawl_store *s = NULL;
    assert_int_equal(pawl_store_new(&s, d, &o, err, sizeof err), 0);
    struct pawl_event e[100];
    for (int i = 0; i < 200; i++) {
        char sid[32];
        snprintf(sid, sizeof sid, "order-%d", i % 7);
        for (int k = 0; k < 100; k++)
            e[k] = ev(sid, 0, "t", "{\"amount\": 42, \"currency\": \"EUR\"}");
        assert_int_equal(pawl_append(s, e, 100, NULL), 0);
    }
    pawl_store_free(s);

    PGconn *c = PQconnectdb(d);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    PQclear(PQexec(c, "BEGIN"));
    for (int round = 0; round < 2; round++) {
        for (int k = 0; k < 20; k++)
            e[k] = ev("order-in", 0, "t", "x");
        assert_int_equal(pawl_append_in(c, e, 20, NULL), 0);
    }
    PGresult *r = PQexec(c, "COMMIT");
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
    PQfinish(c);
    pawl_test_exec(d, "SELECT count(*) FROM pawl_api.append_batch("
                      "ARRAY(SELECT CASE WHEN g % 2 = 0 THEN 'sql-a' ELSE 'sql-b' END "
                      "FROM generate_series(1, 50) g), array_fill('t'::text, ARRAY[50]), "
                      "array_fill('x'::bytea, ARRAY[50]))");

    /* Within every transaction, physical order is k order (but for the k = 0 row, which a later
     * append in the same transaction updates: its new version comes last). */
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM (SELECT ctid, lag(ctid) OVER "
                                            "(PARTITION BY xid ORDER BY k) AS prev FROM "
                                            "pawl.events WHERE k > 0) x WHERE x.prev > x.ctid"),
                     0);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl.events"), 20090);
    assert_int_equal(pawl_test_query_i64(d, "SELECT max(k) FROM pawl.events "
                                            "WHERE stream_id = 'order-in'"),
                     39);
    /* The indexes are about as compact as rebuilt ones. */
    int64_t grown = events_index_bytes(d);
    pawl_test_exec(d, "REINDEX TABLE pawl.events");
    int64_t rebuilt = events_index_bytes(d);
    print_message("unique indexes of pawl.events: %lld bytes as grown, %lld rebuilt\n",
                  (long long)grown, (long long)rebuilt);
    assert_true(grown * 4 <= rebuilt * 5);
    pawl_test_db_drop(pawl_test_dsn(), name);
}

static void test_bad_dsn(void **state)
{
    (void)state;
    struct pawl_store *s = NULL;
    char err[512];
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.open_timeout_ms = 2000;
    int rc = pawl_store_new(&s, "host=/nonexistent dbname=x user=u password=hunter2", &o, err,
                            sizeof err);
    assert_int_equal(rc, PAWL_ECONN);
    assert_null(strstr(err, "hunter2"));
    rc = pawl_store_new(&s, "not a = = dsn", &o, err, sizeof err);
    assert_int_equal(rc, PAWL_EINVAL);
    o.connections = 0;
    rc = pawl_store_new(&s, dsn, &o, err, sizeof err);
    assert_int_equal(rc, PAWL_ERANGE);
    assert_non_null(strstr(err, "connections"));
}

/*
 * An ANY append that loses a race for a stream's next number is run again, and counted: a raw
 * transaction holds stream retry-1's number 2 uncommitted, the store's ANY append computes the
 * same number and waits on the unique index; once the raw one commits, the append fails with
 * 23505 inside the store, is re-run and lands at 3. An explicit sequence that conflicts is the
 * caller's error and is not re-run.
 */
struct retry_wait {
    atomic_int done;
    int rc;
};

static void on_retry_done(void *ud, const struct pawl_append_result *res)
{
    struct retry_wait *w = ud;
    w->rc = res->rc;
    atomic_store_explicit(&w->done, 1, memory_order_release);
}

static void test_any_append_rerun(void **state)
{
    (void)state;
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.finalizer = 0;
    o.max_event_bytes = 4096;
    /* The append below must wait out the raw transaction, not time out on its lock (a lock
     * time-out is a different retry, counted elsewhere): on a loaded machine the COMMIT that
     * ends the wait can come later than the default 100 ms. */
    o.append_lock_timeout_ms = 10000;
    struct pawl_store *s = open_store_with(&o);
    struct pawl_event first = ev("retry-1", 0, "a", "");
    assert_int_equal(pawl_append(s, &first, 1, NULL), 0);
    struct pawl_event dup = ev("retry-1", 1, "again", "");
    assert_int_equal(pawl_append(s, &dup, 1, NULL), PAWL_ECONFLICT);
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    assert_int_equal(st.append_retries, 0);

    PGconn *raw = PQconnectdb(dsn);
    assert_int_equal(PQstatus(raw), CONNECTION_OK);
    PGresult *r = PQexec(raw, "BEGIN; INSERT INTO pawl.events (xid, stream_seq, k, n, "
                              "stream_id, type, payload) VALUES (pg_current_xact_id(), 2, 0, "
                              "1, 'retry-1', 'raw', '')");
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
    struct retry_wait w = {0};
    struct pawl_event any = ev("retry-1", 0, "b", "");
    assert_int_equal(pawl_append_async(s, &any, 1, on_retry_done, &w), 0);
    /* Until the append waits for the raw transaction's number 2. */
    double t0 = pawl_test_now_ms();
    while (pawl_test_query_i64(dsn, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                    "current_database() AND wait_event_type = 'Lock'") == 0) {
        assert_true(pawl_test_now_ms() - t0 < 10000);
        usleep(2000);
    }
    r = PQexec(raw, "COMMIT");
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
    PQfinish(raw);
    t0 = pawl_test_now_ms();
    while (!atomic_load_explicit(&w.done, memory_order_acquire)) {
        assert_true(pawl_test_now_ms() - t0 < 10000);
        usleep(1000);
    }
    assert_int_equal(w.rc, 0);
    pawl_store_stats(s, &st, 0);
    assert_int_equal(st.append_retries, 1);
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT stream_seq FROM pawl.events WHERE "
                                              "stream_id = 'retry-1' AND type = 'b'"),
                     3);
    assert_int_equal(pawl_test_query_i64(dsn, "SELECT count(*) FROM pawl.events WHERE "
                                              "stream_id = 'retry-1'"),
                     3);
    pawl_store_free(s);
}

/*
 * The finalizer's cadence stretches with the append latency under load and comes back when the
 * load goes: a burst of queued appends (latency in the tens of ms) spaces runs by
 * finalizer_latency_share_pct of it, capped; sequential appends (latency about a commit) bring
 * the minimum interval back. With the share at 0 the cadence never moves.
 */
static void on_burst_done(void *ud, const struct pawl_append_result *res)
{
    if (res->rc != 0)
        atomic_fetch_add_explicit((atomic_int *)ud, 1, memory_order_relaxed);
}

static void burst_then_calm(int share_pct, struct pawl_store_stats *loaded,
                            struct pawl_store_stats *calm)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.connections = 1;
    o.finalizer_min_interval_us = 1000;
    o.finalizer_latency_share_pct = share_pct;
    o.finalizer_max_interval_us = 20000;
    /* One transaction per append: the queue of 3000 commits is the load this measures (group
     * append would commit them in a few dozen transactions). */
    o.append_group_max = 1;
    struct pawl_store *s = open_store_with(&o);
    atomic_int errors = 0;
    char sid[32];
    for (int i = 0; i < 3000; i++) {
        snprintf(sid, sizeof sid, "cadence-%d-%d", share_pct, i % 50);
        struct pawl_event e = ev(sid, 0, "burst", "x");
        assert_int_equal(pawl_append_async(s, &e, 1, on_burst_done, &errors), 0);
    }
    pawl_store_drain(s);
    assert_int_equal(errors, 0);
    usleep(30000); /* the finalizer's last wake-up computed the interval */
    pawl_store_stats(s, loaded, 0);
    for (int i = 0; i < 150; i++) {
        struct pawl_event e = ev("cadence-calm", 0, "calm", "x");
        assert_int_equal(pawl_append(s, &e, 1, NULL), 0);
    }
    usleep(30000);
    pawl_store_stats(s, calm, 0);
    pawl_store_free(s);
}

static void test_adaptive_cadence(void **state)
{
    (void)state;
    struct pawl_store_stats loaded, calm;
    burst_then_calm(10, &loaded, &calm);
    print_message(
        "cadence: burst latency avg %.1f ms -> interval %.2f ms; calm %.2f ms -> %.2f ms\n",
        loaded.append_latency_avg_ms, loaded.finalizer_interval_ms, calm.append_latency_avg_ms,
        calm.finalizer_interval_ms);
    /* 3000 appends queued on one connection wait for each other: far above a commit. */
    assert_true(loaded.append_latency_avg_ms > 30.0);
    assert_true(loaded.finalizer_interval_ms > 2.9);
    assert_true(loaded.finalizer_interval_ms <= 20.0);
    double want = loaded.append_latency_avg_ms * 0.10;
    if (want < 20.0)
        assert_true(loaded.finalizer_interval_ms > want * 0.5 &&
                    loaded.finalizer_interval_ms < want * 1.5);
    /* Calm again: the interval follows the calm latency back down (10% of it, at least the
     * 1 ms minimum) — 1 ms wherever a commit takes under 10 ms, a little more on a loaded
     * machine, and far below the burst's. */
    double calm_want = calm.append_latency_avg_ms * 0.10;
    if (calm_want < 1.0)
        calm_want = 1.0;
    assert_true(calm.finalizer_interval_ms > 0.999);
    assert_true(calm.finalizer_interval_ms < calm_want * 1.5 + 0.001);
    assert_true(calm.finalizer_interval_ms < loaded.finalizer_interval_ms);

    burst_then_calm(0, &loaded, &calm);
    assert_true(loaded.append_latency_avg_ms > 30.0);
    assert_true(loaded.finalizer_interval_ms > 0.999 && loaded.finalizer_interval_ms < 1.001);

    /* The busy share: runs spaced by their own recent wall time x 100 / share (here 10: ten
     * times it), whatever the append latency; off, the minimum interval rules. */
    for (int share = 10; share >= 0; share -= 10) {
        struct pawl_store_opts bo;
        pawl_store_opts_defaults(&bo);
        bo.finalizer_min_interval_us = 100;
        bo.finalizer_latency_share_pct = 0;
        bo.finalizer_busy_share_pct = share;
        bo.finalizer_max_interval_us = 200000;
        struct pawl_store *bs = open_store_with(&bo);
        for (int i = 0; i < 200; i++) {
            struct pawl_event e = ev("cadence-busy", 0, "busy", "x");
            assert_int_equal(pawl_append(bs, &e, 1, NULL), 0);
        }
        usleep(30000);
        struct pawl_store_stats bst;
        pawl_store_stats(bs, &bst, 0);
        print_message("busy share %d%%: runs %.2f ms on average -> interval %.2f ms\n", share,
                      bst.finalizer_run_avg_ms, bst.finalizer_interval_ms);
        assert_true(bst.finalizer_run_avg_ms > 0.0);
        if (share > 0) {
            double want = bst.finalizer_run_avg_ms * 100 / share;
            assert_true(bst.finalizer_interval_ms > want * 0.5 &&
                        bst.finalizer_interval_ms < want * 1.5 + 0.001);
        } else {
            assert_true(bst.finalizer_interval_ms > 0.099 && bst.finalizer_interval_ms < 0.101);
        }
        pawl_store_free(bs);
    }

    /* Out of range: refused, naming the option. */
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.finalizer_busy_share_pct = -1;
    struct pawl_store *s = NULL;
    char err[512];
    assert_int_equal(pawl_store_new(&s, dsn, &o, err, sizeof err), PAWL_ERANGE);
    assert_non_null(strstr(err, "finalizer_busy_share_pct"));
    pawl_store_opts_defaults(&o);
    o.finalizer_latency_share_pct = 101;
    assert_int_equal(pawl_store_new(&s, dsn, &o, err, sizeof err), PAWL_ERANGE);
    assert_non_null(strstr(err, "finalizer_latency_share_pct"));
    pawl_store_opts_defaults(&o);
    o.finalizer_max_interval_us = -1;
    assert_int_equal(pawl_store_new(&s, dsn, &o, err, sizeof err), PAWL_ERANGE);
    assert_non_null(strstr(err, "finalizer_max_interval_us"));
}

int main(void)
{
    dsn = pawl_test_db_create("log_basic");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema),           cmocka_unit_test(test_newer_schema),
        cmocka_unit_test(test_append_read),      cmocka_unit_test(test_append_seqs),
        cmocka_unit_test(test_sql_face_equal),   cmocka_unit_test(test_bad_dsn),
        cmocka_unit_test(test_adaptive_cadence), cmocka_unit_test(test_upgrade_stream_collation),
        cmocka_unit_test(test_runs_inline),      cmocka_unit_test(test_any_append_rerun),
        cmocka_unit_test(test_append_row_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
