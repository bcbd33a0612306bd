/*
 * test_bad_input.c — the bad-input survey of the public API, against the private PostgreSQL:
 * one test per kind of bad input (NULL pointers, zero and huge sizes, invalid UTF-8 and
 * oversized names, malformed metadata and sequences, a schema newer than the library, a
 * read-only database user, databases that refuse connections). Each asserts the documented
 * error code, that a reason is readable (err or pawl_store_errmsg), and that nothing was
 * written: the events table keeps exactly the rows the valid appends made, and no schema
 * object appears where the caller had no right to create one.
 *
 * The tool's side of the survey (unknown flags, bad JSON lines, the same databases through
 * `pawl`) is tests/fault/test_bad_input_tool.sh.
 */
#include "pawl_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *dsn;
static char base_dsn[1024]; /* the test database as its owner */
static int64_t written;     /* events the valid appends of this file committed */

static struct pawl_store *open_store(const char *d, size_t max_event_bytes, size_t max_events)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.finalizer = 0; /* only the test decides what gets finalized */
    o.listen = 0;
    if (max_event_bytes)
        o.max_event_bytes = max_event_bytes;
    if (max_events)
        o.max_append_events = max_events;
    struct pawl_store *s = NULL;
    char err[512];
    int rc = pawl_store_new(&s, d, &o, err, sizeof err);
    if (rc != 0)
        fail_msg("pawl_store_new: %s (%s)", pawl_strerror(rc), err);
    return s;
}

static int64_t rows(void)
{
    return pawl_test_query_i64(base_dsn, "SELECT count(*) FROM pawl.events");
}

/* Append events and expect want; check a reason was given and the table did not change. */
static void expect_refused(struct pawl_store *s, const struct pawl_event *ev, size_t n, int want,
                           const char *what)
{
    struct pawl_append_result r;
    memset(&r, 0, sizeof r);
    int rc = pawl_append(s, ev, n, &r);
    if (rc != want)
        fail_msg("%s: got %s (%d), want %s: %s", what, pawl_strerror(rc), rc, pawl_strerror(want),
                 r.message);
    assert_int_equal(r.rc, want);
    if (r.message[0] == '\0')
        fail_msg("%s: refused without a message", what);
    /* The asynchronous path refuses the same input before queueing (the callback never runs). */
    if (want == PAWL_EINVAL || want == PAWL_ETOOBIG) {
        int rc2 = pawl_append_async(s, ev, n, NULL, NULL);
        if (rc2 != want)
            fail_msg("%s (async): got %s, want %s", what, pawl_strerror(rc2), pawl_strerror(want));
    }
    assert_int_equal(rows(), written);
}

static struct pawl_event event(const char *stream, const char *type)
{
    struct pawl_event e;
    memset(&e, 0, sizeof e);
    e.stream_id = stream;
    e.type = type;
    e.payload = "p";
    e.payload_len = 1;
    return e;
}

static void append_ok(struct pawl_store *s, const struct pawl_event *ev, size_t n)
{
    struct pawl_append_result r;
    int rc = pawl_append(s, ev, n, &r);
    if (rc != 0)
        fail_msg("valid append refused: %s: %s", pawl_strerror(rc), r.message);
    written += (int64_t)n;
    assert_int_equal(rows(), written);
}

static void test_nulls(void **state)
{
    (void)state;
    char err[512];
    struct pawl_store *s = NULL;
    assert_int_equal(pawl_store_new(NULL, dsn, NULL, err, sizeof err), PAWL_EINVAL);
    assert_int_equal(pawl_store_new(&s, NULL, NULL, err, sizeof err), PAWL_EINVAL);
    assert_null(s);
    assert_int_equal(pawl_schema_migrate(NULL, err, sizeof err), PAWL_EINVAL);
    pawl_store_free(NULL); /* a no-op */

    s = open_store(dsn, 0, 0);
    struct pawl_event e = event("nulls", "T");
    assert_int_equal(pawl_append(NULL, &e, 1, NULL), PAWL_EINVAL);
    expect_refused(s, NULL, 1, PAWL_EINVAL, "NULL events");
    e.stream_id = NULL;
    expect_refused(s, &e, 1, PAWL_EINVAL, "NULL stream id");
    e = event("nulls", NULL);
    expect_refused(s, &e, 1, PAWL_EINVAL, "NULL type");
    e = event("nulls", "T");
    e.payload = NULL;
    e.payload_len = 5;
    expect_refused(s, &e, 1, PAWL_EINVAL, "NULL payload with a length");
    e.payload_len = 0;
    append_ok(s, &e, 1); /* NULL payload of length 0 is an empty payload */

    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    assert_int_equal(pawl_read(NULL, 0, 10, &b), PAWL_EINVAL);
    assert_int_equal(pawl_read(s, 0, 10, NULL), PAWL_EINVAL);
    pawl_read_batch_fini(&b);

    /* Processors: a name and at least one handler are required. */
    struct pawl_processor_opts po;
    pawl_processor_opts_defaults(&po);
    struct pawl_processor *p = NULL;
    struct pawl_source *src = NULL;
    struct pawl_tokens *tk = NULL;
    assert_int_equal(pawl_source_mem_new(&src), 0);
    assert_int_equal(pawl_tokens_mem_new(&tk), 0);
    assert_int_not_equal(pawl_processor_new(&p, &po, src, tk, NULL, 0), 0); /* no name */
    po.name = "bad input";                                                  /* a space */
    struct pawl_handler h;
    memset(&h, 0, sizeof h);
    assert_int_not_equal(pawl_processor_new(&p, &po, src, tk, &h, 1), 0);
    po.name = "ok";
    assert_int_not_equal(pawl_processor_new(&p, &po, src, tk, NULL, 0), 0); /* no handler */
    assert_int_not_equal(pawl_processor_new(&p, NULL, src, tk, &h, 1), 0);
    assert_int_not_equal(pawl_processor_new(&p, &po, NULL, tk, &h, 1), 0);
    assert_null(p);
    pawl_processor_free(NULL);
    pawl_tokens_free(tk);
    pawl_source_free(src);
    pawl_store_free(s);
}

static void test_sizes(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(dsn, 1024, 3);
    struct pawl_event ev[4] = {event("sz", "T"), event("sz", "T"), event("sz", "T"),
                               event("sz", "T")};
    expect_refused(s, ev, 0, PAWL_EINVAL, "zero events");
    expect_refused(s, ev, 4, PAWL_ETOOBIG, "more events than max_append_events");
    expect_refused(s, ev, (size_t)-1, PAWL_ETOOBIG, "SIZE_MAX events");
    static char big[1025];
    memset(big, 'x', sizeof big);
    ev[0].payload = big;
    ev[0].payload_len = sizeof big;
    expect_refused(s, ev, 1, PAWL_ETOOBIG, "payload over max_event_bytes");
    /* A huge length over a tiny buffer must be refused before anything reads it. */
    ev[0].payload = "x";
    ev[0].payload_len = (size_t)-1;
    expect_refused(s, ev, 1, PAWL_ETOOBIG, "SIZE_MAX payload length");
    ev[0].payload_len = SIZE_MAX / 2 + 7;
    expect_refused(s, ev, 1, PAWL_ETOOBIG, "payload length near SIZE_MAX/2");
    /* Stream id and type: 1..255 bytes. */
    static char longname[PAWL_STREAM_ID_MAX + 2];
    memset(longname, 's', PAWL_STREAM_ID_MAX + 1);
    ev[0] = event(longname, "T");
    expect_refused(s, ev, 1, PAWL_EINVAL, "256-byte stream id");
    ev[0] = event("sz", longname);
    expect_refused(s, ev, 1, PAWL_EINVAL, "256-byte type");
    ev[0] = event("", "T");
    expect_refused(s, ev, 1, PAWL_EINVAL, "empty stream id");
    ev[0] = event("sz", "");
    expect_refused(s, ev, 1, PAWL_EINVAL, "empty type");
    longname[PAWL_STREAM_ID_MAX] = '\0';
    ev[0] = event(longname, "T");
    append_ok(s, ev, 1); /* exactly 255 bytes is allowed */
    /* A batch is refused whole when one of its events is bad. */
    ev[0] = event("sz", "T");
    ev[2].payload = big;
    ev[2].payload_len = sizeof big;
    expect_refused(s, ev, 3, PAWL_ETOOBIG, "third event too big");
    /* Reads: 1..100000 events after a non-negative position. */
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    assert_int_equal(pawl_read(s, 0, 0, &b), PAWL_ERANGE);
    assert_int_equal(pawl_read(s, 0, 100001, &b), PAWL_ERANGE);
    assert_int_equal(pawl_read(s, -1, 10, &b), PAWL_ERANGE);
    assert_int_equal(pawl_read(s, INT64_MAX, 10, &b), 0);
    assert_int_equal(b.count, 0);
    pawl_read_batch_fini(&b);
    /* Options out of range are refused when the store opens. */
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.max_event_bytes = 0;
    struct pawl_store *s2 = NULL;
    char err[512];
    assert_int_equal(pawl_store_new(&s2, dsn, &o, err, sizeof err), PAWL_ERANGE);
    pawl_store_opts_defaults(&o);
    o.max_append_events = 100001;
    assert_int_equal(pawl_store_new(&s2, dsn, &o, err, sizeof err), PAWL_ERANGE);
    assert_null(s2);
    pawl_store_free(s);
}

static void test_invalid_utf8(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(dsn, 0, 0);
    static const char *const bad[] = {
        "\xff",             /* never valid */
        "ab\xfe",           /* never valid */
        "\xc0\xaf",         /* overlong '/' */
        "\xe0\x80\xaf",     /* overlong, three bytes */
        "\xed\xa0\x80",     /* a UTF-16 surrogate */
        "\xf4\x90\x80\x80", /* beyond U+10FFFF */
        "\xe2\x82",         /* truncated */
        "a\x80z",           /* a lone continuation byte */
        "\xf8\x88\x80\x80\x80",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char what[64];
        struct pawl_event e = event(bad[i], "T");
        snprintf(what, sizeof what, "invalid UTF-8 stream id #%zu", i);
        expect_refused(s, &e, 1, PAWL_EINVAL, what);
        e = event("utf8", bad[i]);
        snprintf(what, sizeof what, "invalid UTF-8 type #%zu", i);
        expect_refused(s, &e, 1, PAWL_EINVAL, what);
    }
    /* Valid multi-byte names are fine, and read back byte for byte. */
    struct pawl_event e = event("caf\xc3\xa9-\xf0\x9f\x98\x80", "\xe6\x97\xa5");
    append_ok(s, &e, 1);
    assert_int_equal(pawl_test_query_i64(base_dsn, "SELECT count(*) FROM pawl.events WHERE "
                                                   "stream_id = 'café-😀' AND type = '日'"),
                     1);
    /* Metadata must be a JSON object; no integer is refused for its size. */
    e = event("meta", "T");
    e.metadata = "{\"big\": 123456789012345678901234567890, \"x\": [1e300, -0.5, null]}";
    append_ok(s, &e, 1);
    static const char *const bad_meta[] = {"{",        "[1]",        "42",          "\"s\"",
                                           "{\"a\":}", "{\"a\":1}x", "{\"\xff\":1}"};
    for (size_t i = 0; i < sizeof bad_meta / sizeof bad_meta[0]; i++) {
        char what[64];
        e = event("meta", "T");
        e.metadata = bad_meta[i];
        snprintf(what, sizeof what, "metadata #%zu", i);
        expect_refused(s, &e, 1, PAWL_EINVAL, what);
    }
    pawl_store_free(s);
}

static void test_sequences(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(dsn, 0, 0);
    struct pawl_event ev[2] = {event("seq", "T"), event("seq", "T")};
    ev[0].stream_seq = -3;
    expect_refused(s, ev, 1, PAWL_EINVAL, "negative stream_seq");
    ev[0].stream_seq = 1;
    ev[1].stream_seq = 3; /* not consecutive */
    expect_refused(s, ev, 2, PAWL_EINVAL, "gap inside one append");
    ev[1].stream_seq = 0; /* explicit and ANY mixed on one stream */
    expect_refused(s, ev, 2, PAWL_EINVAL, "explicit and ANY mixed");
    ev[0].stream_seq = 5; /* the stream is empty: 5 conflicts */
    expect_refused(s, ev, 1, PAWL_ECONFLICT, "sequence conflict");
    pawl_store_free(s);
}

/* A second database, created by the owner; returns its DSN (static). */
static const char *other_db(const char *suffix, char *name, size_t nlen)
{
    static char d[1100];
    snprintf(name, nlen, "bad_input_%s_%d", suffix, (int)getpid());
    pawl_test_db_make(base_dsn, name, NULL, d, sizeof d); /* fails on a truncated DSN */
    return d;
}

static void drop_db(const char *name)
{
    pawl_test_db_drop(base_dsn, name);
}

static void test_newer_schema(void **state)
{
    (void)state;
    char name[128], err[512];
    const char *d = other_db("newer", name, sizeof name);
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    pawl_test_exec(d, "INSERT INTO pawl.schema_version VALUES (9999, '9999_future.sql')");
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), PAWL_ESCHEMA);
    assert_non_null(strstr(err, "9999"));
    struct pawl_store *s = NULL;
    assert_int_equal(pawl_store_new(&s, d, NULL, err, sizeof err), PAWL_ESCHEMA);
    assert_null(s);
    struct pawl_tokens *tk = NULL;
    assert_int_not_equal(pawl_tokens_pg_new(&tk, d), 0);
    assert_null(tk);
    /* Nothing was changed: the future version is still the newest, no events, no tokens. */
    assert_int_equal(pawl_test_query_i64(d, "SELECT max(version) FROM pawl.schema_version"), 9999);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl.events"), 0);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl.tokens"), 0);
    drop_db(name);
}

static void test_read_only_user(void **state)
{
    (void)state;
    char role[64], sql[512], rodsn[1200], err[512];
    snprintf(role, sizeof role, "pawl_ro_%d", (int)getpid());
    snprintf(sql, sizeof sql,
             "DROP ROLE IF EXISTS %s; CREATE ROLE %s LOGIN PASSWORD 'ro-secret'; "
             "GRANT USAGE ON SCHEMA pawl, pawl_api TO %s; "
             "GRANT SELECT ON ALL TABLES IN SCHEMA pawl, pawl_api TO %s",
             role, role, role, role);
    pawl_test_exec(base_dsn, sql);
    /* The private cluster takes passwords (SCRAM) from every role but its owner. */
    snprintf(rodsn, sizeof rodsn, "%s user=%s password=ro-secret", dsn, role);

    /* It can open a store and read, but an append is refused by the server and writes nothing. */
    struct pawl_store *s = open_store(rodsn, 0, 0);
    struct pawl_event e = event("ro", "T");
    struct pawl_append_result r;
    int rc = pawl_append(s, &e, 1, &r);
    assert_int_equal(rc, PAWL_ESQL);
    assert_string_equal(r.sqlstate, "42501"); /* insufficient_privilege */
    assert_int_equal(rows(), written);
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    assert_int_equal(pawl_read(s, 0, 10, &b), 0);
    pawl_read_batch_fini(&b);
    /* The finalizer needs write access too: refused, and no run row appears. */
    int64_t runs = pawl_test_query_i64(base_dsn, "SELECT count(*) FROM pawl.runs");
    rc = pawl_finalize_now(s, NULL, NULL, NULL);
    assert_int_equal(rc, PAWL_ESQL);
    assert_ptr_equal(pawl_store_errmsg(s, err, sizeof err), err);
    assert_non_null(strstr(err, "42501"));
    char old[512];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    pawl_store_last_error(s, old, sizeof old); /* the deprecated name reads the same text */
#pragma GCC diagnostic pop
    assert_string_equal(old, err);
    assert_int_equal(pawl_test_query_i64(base_dsn, "SELECT count(*) FROM pawl.runs"), runs);
    pawl_store_free(s);

    /* Schema set-up as that user, on a database without pawl: refused, nothing created. */
    char name[128];
    const char *d = other_db("ro", name, sizeof name);
    char d_ro[1300];
    snprintf(d_ro, sizeof d_ro, "%s user=%s password=ro-secret", d, role);
    snprintf(sql, sizeof sql, "REVOKE CREATE ON SCHEMA public FROM PUBLIC");
    pawl_test_exec(d, sql);
    rc = pawl_schema_migrate(d_ro, err, sizeof err);
    assert_int_equal(rc, PAWL_ESQL);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pg_namespace WHERE nspname "
                                            "IN ('pawl', 'pawl_api')"),
                     0);
    drop_db(name);
    snprintf(sql, sizeof sql, "DROP OWNED BY %s; DROP ROLE %s", role, role);
    pawl_test_exec(base_dsn, sql);
}

static void test_refused_connections(void **state)
{
    (void)state;
    char err[512];
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.open_timeout_ms = 1500;
    o.connect_timeout_ms = 1000;
    o.finalizer = 0;
    struct pawl_store *s = NULL;

    /* No server at all behind the socket directory. */
    double t0 = pawl_test_now_ms();
    assert_int_equal(
        pawl_store_new(&s, "host=/nonexistent-dir port=5432 dbname=x", &o, err, sizeof err),
        PAWL_ECONN);
    assert_true(err[0] != '\0');
    assert_true(pawl_test_now_ms() - t0 < 30000);

    /* A database that does not accept connections. */
    char name[128], sql[256];
    const char *d = other_db("closed", name, sizeof name);
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    snprintf(sql, sizeof sql, "ALTER DATABASE %s ALLOW_CONNECTIONS false", name);
    pawl_test_exec(base_dsn, sql);
    assert_int_equal(pawl_store_new(&s, d, &o, err, sizeof err), PAWL_ECONN);
    assert_null(s);
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), PAWL_ECONN);
    struct pawl_tokens *tk = NULL;
    assert_int_not_equal(pawl_tokens_pg_new(&tk, d), 0);
    assert_null(tk);

    /* A role at its connection limit. */
    char role[64], rdsn[1200];
    snprintf(role, sizeof role, "pawl_nolimit_%d", (int)getpid());
    snprintf(sql, sizeof sql,
             "DROP ROLE IF EXISTS %s; CREATE ROLE %s LOGIN CONNECTION LIMIT 0 PASSWORD 'nl-secret'",
             role, role);
    pawl_test_exec(base_dsn, sql);
    snprintf(rdsn, sizeof rdsn, "%s user=%s password=nl-secret", dsn, role);
    assert_int_equal(pawl_store_new(&s, rdsn, &o, err, sizeof err), PAWL_ECONN);
    assert_null(s);

    /* A database that does not exist. */
    char nodb[1200];
    snprintf(nodb, sizeof nodb, "%s dbname=no_such_db_%d", base_dsn, (int)getpid());
    assert_int_equal(pawl_store_new(&s, nodb, &o, err, sizeof err), PAWL_ECONN);
    assert_null(s);

    snprintf(sql, sizeof sql, "ALTER DATABASE %s ALLOW_CONNECTIONS true", name);
    pawl_test_exec(base_dsn, sql);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl.events"), 0);
    drop_db(name);
    snprintf(sql, sizeof sql, "DROP ROLE %s", role);
    pawl_test_exec(base_dsn, sql);
    assert_int_equal(rows(), written);
}

int main(void)
{
    dsn = pawl_test_db_create("bad_input");
    snprintf(base_dsn, sizeof base_dsn, "%s", dsn);
    char err[512];
    if (pawl_schema_migrate(dsn, err, sizeof err) != 0) {
        fprintf(stderr, "migrate: %s\n", err);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nulls),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_sequences),
        cmocka_unit_test(test_newer_schema),
        cmocka_unit_test(test_read_only_user),
        cmocka_unit_test(test_refused_connections),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
