/*
 * test_log_ids.c — event ids and appends that can be retried (schema 15):
 *
 *   - a retried append (every id in the log, same events) writes nothing and reports the numbers
 *     the events got, marked already; reads (C and SQL) return the ids;
 *   - the rule's failures write nothing and name the id: only some ids known, an id of another
 *     event (PAWL_EIDUSED); ids mixed with id-less events, one id twice, bad ids (PAWL_EINVAL,
 *     before anything reaches the server);
 *   - racing duplicates: the same ids from several threads (group append on and off) and from
 *     several processes at once are written once, every caller told success;
 *   - the same ids twice in one group: the second append runs after the first and is already;
 *   - the outbox (pawl_append_in) inside the caller's transaction: a retry is already, an id
 *     of another event fails with the transaction still usable;
 *   - rotation keeps the ids and their uniqueness across partitions;
 *   - the SQL face: pawl_api.append / append_batch with ids, errors PW030;
 *   - the upgrade from schema 14 with the least-privilege roles set up: the new and re-created
 *     functions keep the rights the roles had, events written before have no id, and an
 *     appender login appends with ids through the SQL face.
 */
#include "pawl_test.h"
#include "schema.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *dsn;

static struct pawl_store *open_store(int group_max)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.connections = 2;
    o.append_group_max = group_max;
    struct pawl_store *s = NULL;
    char err[512];
    if (pawl_store_new(&s, dsn, &o, err, sizeof err) != 0)
        fail_msg("store: %s", err);
    return s;
}

static int64_t q(const char *sql)
{
    return pawl_test_query_i64(dsn, sql);
}

static int64_t count_id(const char *id)
{
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM pawl.events WHERE event_id = '%s'", id);
    return q(sql);
}

static void test_retry_is_already(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1);
    struct pawl_event ev[3] = {
        {.stream_id = "order-1", .type = "Placed", .payload = "a", .payload_len = 1, .id = "r1-a"},
        {.stream_id = "order-1", .type = "Paid", .payload = "b", .payload_len = 1, .id = "r1-b"},
        {.stream_id = "cust-9", .type = "Seen", .payload = "c", .payload_len = 1, .id = "r1-c"},
    };
    int64_t seqs[3], again[3];
    struct pawl_append_result r;
    assert_int_equal(pawl_append_seqs(s, ev, 3, seqs, &r), 0);
    assert_int_equal(r.already, 0);
    int64_t before = q("SELECT count(*) FROM pawl.events");
    /* The retry: nothing written, the same numbers, marked already. */
    assert_int_equal(pawl_append_seqs(s, ev, 3, again, &r), 0);
    assert_int_equal(r.already, 1);
    assert_memory_equal(seqs, again, sizeof seqs);
    assert_int_equal(r.first_seq, seqs[0]);
    assert_int_equal(r.last_seq, seqs[1]);
    assert_int_equal(q("SELECT count(*) FROM pawl.events"), before);
    /* Explicit versions are not checked on a retry: the events are there. */
    struct pawl_event ex = ev[0];
    ex.stream_seq = 1;
    struct pawl_event pair[2] = {ex, ev[1]};
    pair[1].stream_seq = 2;
    assert_int_equal(pawl_append(s, pair, 2, &r), 0);
    assert_int_equal(r.already, 1);

    /* Reads return the ids. */
    pawl_test_exec(dsn, "SELECT pawl.finalize()");
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    assert_int_equal(pawl_read(s, 0, 1000, &b), 0);
    int seen = 0;
    for (size_t i = 0; i < b.count; i++)
        if (b.events[i].id && strncmp(b.events[i].id, "r1-", 3) == 0) {
            seen++;
            size_t k = (size_t)(b.events[i].id[3] - 'a');
            assert_string_equal(b.events[i].type, ev[k].type);
            assert_int_equal(b.events[i].stream_seq, seqs[k]);
        }
    assert_int_equal(seen, 3);
    pawl_read_batch_fini(&b);
    assert_int_equal(q("SELECT count(*) FROM pawl_api.read(0, 1000) WHERE event_id LIKE 'r1-%'"),
                     3);
    assert_int_equal(q("SELECT count(*) FROM pawl_api.events WHERE event_id LIKE 'r1-%'"), 3);
    pawl_store_free(s);
}

static void test_rule_failures(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1);
    struct pawl_event a = {
        .stream_id = "f-1", .type = "T", .payload = "x", .payload_len = 1, .id = "f-known"};
    struct pawl_append_result r;
    assert_int_equal(pawl_append(s, &a, 1, &r), 0);
    int64_t before = q("SELECT count(*) FROM pawl.events");

    /* Some known, some not. */
    struct pawl_event two[2] = {a, a};
    two[1].id = "f-new";
    assert_int_equal(pawl_append(s, two, 2, &r), PAWL_EIDUSED);
    assert_non_null(strstr(r.message, "f-known"));
    assert_non_null(strstr(r.message, "f-new"));
    /* The id of another event (another payload, another stream). */
    struct pawl_event other = a;
    other.payload = "y";
    assert_int_equal(pawl_append(s, &other, 1, &r), PAWL_EIDUSED);
    assert_non_null(strstr(r.message, "\"f-known\""));
    assert_non_null(strstr(r.message, "another event"));
    other = a;
    other.stream_id = "f-2";
    assert_int_equal(pawl_append(s, &other, 1, &r), PAWL_EIDUSED);
    assert_int_equal(count_id("f-new"), 0);
    assert_int_equal(q("SELECT count(*) FROM pawl.events"), before);

    /* Refused before the server: mixed, twice, too long, control characters, bad UTF-8. */
    struct pawl_event mix[2] = {a, a};
    mix[1].id = NULL;
    assert_int_equal(pawl_append(s, mix, 2, &r), PAWL_EINVAL);
    assert_non_null(strstr(r.message, "every event of an append carries an id"));
    struct pawl_event dup[2] = {a, a};
    dup[0].id = dup[1].id = "same";
    assert_int_equal(pawl_append(s, dup, 2, &r), PAWL_EINVAL);
    assert_non_null(strstr(r.message, "appears twice"));
    char longid[PAWL_EVENT_ID_MAX + 2];
    memset(longid, 'x', sizeof longid - 1);
    longid[sizeof longid - 1] = '\0';
    struct pawl_event bad = a;
    bad.id = longid;
    assert_int_equal(pawl_append(s, &bad, 1, &r), PAWL_EINVAL);
    assert_non_null(strstr(r.message, "1..128 bytes"));
    longid[PAWL_EVENT_ID_MAX] = '\0'; /* exactly the limit: accepted */
    assert_int_equal(pawl_append(s, &bad, 1, &r), 0);
    bad.id = "a\033[2Jb";
    assert_int_equal(pawl_append(s, &bad, 1, &r), PAWL_EINVAL);
    assert_null(strchr(r.message, '\033'));
    bad.id = "";
    assert_int_equal(pawl_append(s, &bad, 1, &r), PAWL_EINVAL);
    bad.id = "\xff\xfe";
    assert_int_equal(pawl_append(s, &bad, 1, &r), PAWL_EINVAL);
    /* Asynchronous appends are refused at the call too. */
    bad.id = "a\nb";
    assert_int_equal(pawl_append_async(s, &bad, 1, NULL, NULL), PAWL_EINVAL);
    /* The table refuses what the library would have (a caller of pawl.append with its own
     * arrays). */
    PGconn *c = PQconnectdb(dsn);
    PGresult *res = PQexec(c, "SELECT * FROM pawl.append(ARRAY['f-3'], ARRAY[0::int8], "
                              "ARRAY[1], ARRAY[1], ARRAY['T'], ARRAY['\\x01'::bytea], "
                              "ARRAY[NULL::jsonb], false, ARRAY[E'a\\x01b'])");
    assert_int_equal(PQresultStatus(res), PGRES_FATAL_ERROR);
    assert_non_null(strstr(PQresultErrorMessage(res), "events_event_id_check"));
    PQclear(res);
    PQfinish(c);
    pawl_store_free(s);
}

/* ---- racing duplicates ---------------------------------------------------------------------- */

#define RACERS 8
#define RACE_APPENDS 60

struct racer {
    int group_max;
    int tag;
    int ok, already, failed;
    pthread_barrier_t *start;
};

static void race_ids(char *buf, size_t len, int tag, int i, int k)
{
    snprintf(buf, len, "race-%d-%d-%d", tag, i, k);
}

static void *racer_main(void *arg)
{
    struct racer *rc = arg;
    struct pawl_store *s = open_store(rc->group_max);
    pthread_barrier_wait(rc->start);
    for (int i = 0; i < RACE_APPENDS; i++) {
        char id0[48], id1[48], sid[32];
        race_ids(id0, sizeof id0, rc->tag, i, 0);
        race_ids(id1, sizeof id1, rc->tag, i, 1);
        snprintf(sid, sizeof sid, "race-%d-%d", rc->tag, i % 5);
        struct pawl_event ev[2] = {
            {.stream_id = sid, .type = "T", .payload = id0, .payload_len = strlen(id0), .id = id0},
            {.stream_id = sid, .type = "T", .payload = id1, .payload_len = strlen(id1), .id = id1},
        };
        struct pawl_append_result r;
        if (pawl_append(s, ev, 2, &r) != 0) {
            fprintf(stderr, "racer: append %d: %s\n", i, r.message);
            rc->failed++;
        } else if (r.already) {
            rc->already++;
        } else {
            rc->ok++;
        }
    }
    pawl_store_free(s);
    return NULL;
}

static void check_race(int tag)
{
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM pawl.events WHERE event_id LIKE 'race-%d-%%'",
             tag);
    assert_int_equal(q(sql), RACE_APPENDS * 2);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM (SELECT event_id FROM pawl.events WHERE event_id LIKE "
             "'race-%d-%%' GROUP BY event_id HAVING count(*) > 1) d",
             tag);
    assert_int_equal(q(sql), 0);
    /* Per stream the numbers are gap-free: nothing half-written. */
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM (SELECT stream_id FROM pawl.events WHERE stream_id LIKE "
             "'race-%d-%%' GROUP BY stream_id HAVING max(stream_seq) <> count(*)) g",
             tag);
    assert_int_equal(q(sql), 0);
}

static void race_threads(int group_max, int tag)
{
    pthread_t t[RACERS];
    struct racer rc[RACERS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, RACERS);
    for (int i = 0; i < RACERS; i++) {
        rc[i] = (struct racer){.group_max = group_max, .tag = tag, .start = &start};
        pthread_create(&t[i], NULL, racer_main, &rc[i]);
    }
    int ok = 0, already = 0, failed = 0;
    for (int i = 0; i < RACERS; i++) {
        pthread_join(t[i], NULL);
        ok += rc[i].ok;
        already += rc[i].already;
        failed += rc[i].failed;
    }
    pthread_barrier_destroy(&start);
    assert_int_equal(failed, 0);
    assert_int_equal(ok, RACE_APPENDS);
    assert_int_equal(already, RACE_APPENDS * (RACERS - 1));
    check_race(tag);
}

static void test_race_threads(void **state)
{
    (void)state;
    race_threads(1, 1);   /* one append per transaction */
    race_threads(256, 2); /* group append */
}

static void test_race_processes(void **state)
{
    (void)state;
    pid_t pid[4];
    int fds[4][2];
    for (int p = 0; p < 4; p++) {
        assert_int_equal(pipe(fds[p]), 0);
        pid[p] = fork();
        assert_true(pid[p] >= 0);
        if (pid[p] == 0) {
            /* Each process appends every id, in its own order of streams. */
            struct pawl_store *s = open_store(p % 2 ? 256 : 1);
            int ok = 0, already = 0, failed = 0;
            for (int i = 0; i < RACE_APPENDS; i++) {
                int j = (i + p * 7) % RACE_APPENDS;
                char id0[48], id1[48], sid[32];
                race_ids(id0, sizeof id0, 3, j, 0);
                race_ids(id1, sizeof id1, 3, j, 1);
                snprintf(sid, sizeof sid, "race-3-%d", j % 5);
                struct pawl_event ev[2] = {
                    {.stream_id = sid, .type = "T", .payload = "p", .payload_len = 1, .id = id0},
                    {.stream_id = sid, .type = "T", .payload = "p", .payload_len = 1, .id = id1},
                };
                struct pawl_append_result r;
                if (pawl_append(s, ev, 2, &r) != 0)
                    failed++;
                else if (r.already)
                    already++;
                else
                    ok++;
            }
            pawl_store_free(s);
            char line[64];
            int l = snprintf(line, sizeof line, "%d %d %d\n", ok, already, failed);
            if (write(fds[p][1], line, (size_t)l) != l)
                _exit(2);
            _exit(0);
        }
        close(fds[p][1]);
    }
    int ok = 0, already = 0, failed = 0;
    for (int p = 0; p < 4; p++) {
        char line[64] = "";
        ssize_t l = read(fds[p][0], line, sizeof line - 1);
        close(fds[p][0]);
        int st = 0;
        waitpid(pid[p], &st, 0);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        assert_true(l > 0);
        int a, b, c;
        assert_int_equal(sscanf(line, "%d %d %d", &a, &b, &c), 3);
        ok += a;
        already += b;
        failed += c;
    }
    assert_int_equal(failed, 0);
    assert_int_equal(ok, RACE_APPENDS);
    assert_int_equal(already, RACE_APPENDS * 3);
    check_race(3);
}

/* ---- one group, the same ids twice ---------------------------------------------------------- */

struct outcome {
    atomic_int done;
    int rc, already;
    int64_t first_seq;
};

static void on_done(void *ud, const struct pawl_append_result *r)
{
    struct outcome *o = ud;
    o->rc = r->rc;
    o->already = r->already;
    o->first_seq = r->first_seq;
    atomic_store_explicit(&o->done, 1, memory_order_release);
}

static void test_group_same_ids(void **state)
{
    (void)state;
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.connections = 1;
    o.append_group_linger_us = 20000; /* gather the burst into one group */
    struct pawl_store *s = NULL;
    char err[512];
    assert_int_equal(pawl_store_new(&s, dsn, &o, err, sizeof err), 0);
    enum { N = 40 };
    static struct outcome out[N];
    for (int i = 0; i < N; i++) {
        char id[32];
        /* Appends i and i + N/2 carry the same id and event; every fourth one gets an id of
         * another event (its payload differs) instead. */
        snprintf(id, sizeof id, "grp-%d", i % (N / 2));
        struct pawl_event e = {.stream_id = "grp",
                               .type = "T",
                               .payload = i >= N / 2 && i % 4 == 3 ? "other" : "same",
                               .payload_len = i >= N / 2 && i % 4 == 3 ? 5 : 4,
                               .id = id};
        assert_int_equal(pawl_append_async(s, &e, 1, on_done, &out[i]), 0);
    }
    pawl_store_drain(s);
    for (int i = 0; i < N; i++) {
        assert_true(atomic_load_explicit(&out[i].done, memory_order_acquire));
        if (i < N / 2) {
            assert_int_equal(out[i].rc, 0);
            assert_int_equal(out[i].already, 0);
        } else if (i % 4 == 3) {
            assert_int_equal(out[i].rc, PAWL_EIDUSED);
        } else {
            assert_int_equal(out[i].rc, 0);
            assert_int_equal(out[i].already, 1);
            assert_int_equal(out[i].first_seq, out[i - N / 2].first_seq);
        }
    }
    assert_int_equal(q("SELECT count(*) FROM pawl.events WHERE stream_id = 'grp'"), N / 2);
    assert_true(q("SELECT count(*) FROM pawl.events WHERE stream_id = 'grp' AND payload = "
                  "'\\x6f74686572'") == 0);
    pawl_store_free(s);
}

/* ---- the outbox ----------------------------------------------------------------------------- */

static void test_outbox(void **state)
{
    (void)state;
    PGconn *c = PQconnectdb(dsn);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    PQclear(PQexec(c, "BEGIN"));
    struct pawl_event e = {
        .stream_id = "ob-1", .type = "T", .payload = "p", .payload_len = 1, .id = "ob-a"};
    struct pawl_append_result r;
    assert_int_equal(pawl_append_in(c, &e, 1, &r), 0);
    assert_int_equal(r.already, 0);
    /* The same id again in the same transaction: already (its own earlier append). */
    assert_int_equal(pawl_append_in(c, &e, 1, &r), 0);
    assert_int_equal(r.already, 1);
    assert_int_equal(r.first_seq, 1);
    /* An id of another event: refused, and the transaction goes on. */
    struct pawl_event other = e;
    other.payload = "q";
    assert_int_equal(pawl_append_in(c, &other, 1, &r), PAWL_EIDUSED);
    assert_string_equal(r.sqlstate, "");
    PGresult *res = PQexec(c, "SELECT 1");
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    PQclear(res);
    PQclear(PQexec(c, "COMMIT"));
    assert_int_equal(count_id("ob-a"), 1);
    /* After the commit, from another transaction: already. */
    assert_int_equal(pawl_append_in(c, &e, 1, &r), 0);
    assert_int_equal(r.already, 1);
    PQfinish(c);
}

/* ---- rotation ------------------------------------------------------------------------------- */

static void test_rotation_keeps_ids(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1);
    struct pawl_event e = {
        .stream_id = "rot-1", .type = "T", .payload = "p", .payload_len = 1, .id = "rot-a"};
    struct pawl_append_result r;
    assert_int_equal(pawl_append(s, &e, 1, &r), 0);
    /* A transaction still open keeps rot-a's partition the open one; close it first. */
    pawl_test_exec(dsn, "SELECT pawl.rotate()");
    assert_int_equal(q("SELECT count(*) FROM pawl.event_parts"), 2);
    assert_int_equal(count_id("rot-a"), 1);
    /* The id is found in the closed partition: already, not a second copy in the new one. */
    assert_int_equal(pawl_append(s, &e, 1, &r), 0);
    assert_int_equal(r.already, 1);
    struct pawl_event other = e;
    other.payload = "q";
    assert_int_equal(pawl_append(s, &other, 1, &r), PAWL_EIDUSED);
    assert_int_equal(count_id("rot-a"), 1);
    /* New ids go to the new partition, with its own unique index. */
    e.id = "rot-b";
    assert_int_equal(pawl_append(s, &e, 1, &r), 0);
    assert_int_equal(q("SELECT count(*) FROM pg_indexes WHERE schemaname = 'pawl' AND indexname "
                       "LIKE 'events_%_event_id_key'"),
                     2);
    pawl_store_free(s);
}

/* ---- the SQL face --------------------------------------------------------------------------- */

static void test_sql_face(void **state)
{
    (void)state;
    assert_int_equal(q("SELECT pawl_api.append('sql-1', 'T', '\\x01', NULL, NULL, 'sql-a')"), 1);
    assert_int_equal(q("SELECT pawl_api.append('sql-1', 'T', '\\x01', NULL, NULL, 'sql-a')"), 1);
    assert_int_equal(q("SELECT count(*) FROM pawl.events WHERE stream_id = 'sql-1'"), 1);
    assert_int_equal(q("SELECT count(*) FILTER (WHERE already) FROM pawl_api.append_batch("
                       "ARRAY['sql-1', 'sql-2'], ARRAY['T', 'T'], ARRAY['\\x01', '\\x02']::bytea[],"
                       " NULL, NULL, ARRAY['sql-b', 'sql-c'])"),
                     0);
    assert_int_equal(q("SELECT count(*) FILTER (WHERE already) FROM pawl_api.append_batch("
                       "ARRAY['sql-1', 'sql-2'], ARRAY['T', 'T'], ARRAY['\\x01', '\\x02']::bytea[],"
                       " NULL, NULL, ARRAY['sql-b', 'sql-c'])"),
                     2);
    PGconn *c = PQconnectdb(dsn);
    PGresult *res = PQexec(c, "SELECT pawl_api.append('sql-1', 'T', '\\x09', NULL, NULL, 'sql-a')");
    assert_int_equal(PQresultStatus(res), PGRES_FATAL_ERROR);
    assert_string_equal(PQresultErrorField(res, PG_DIAG_SQLSTATE), "PW030");
    PQclear(res);
    res = PQexec(c, "SELECT pawl_api.append('sql-1', 'T', '\\x09', NULL, NULL, repeat('x', 129))");
    assert_int_equal(PQresultStatus(res), PGRES_FATAL_ERROR);
    assert_string_equal(PQresultErrorField(res, PG_DIAG_SQLSTATE), "22023");
    PQclear(res);
    PQfinish(c);
}

/* ---- the upgrade ---------------------------------------------------------------------------- */

/* sql/roles/least_privilege.sql as one query string (its psql lines left out). */
static char *roles_sql(void)
{
    FILE *f = fopen(PAWL_SOURCE_DIR "/sql/roles/least_privilege.sql", "r");
    assert_non_null(f);
    static char buf[65536];
    size_t len = 0;
    char line[1024];
    while (fgets(line, sizeof line, f))
        if (line[0] != '\\') {
            size_t l = strlen(line);
            assert_true(len + l < sizeof buf);
            memcpy(buf + len, line, l);
            len += l;
        }
    buf[len] = '\0';
    fclose(f);
    return buf;
}

static void test_upgrade_keeps_rights(void **state)
{
    (void)state;
    char d[1024], err[512];
    pawl_test_db_make(pawl_test_dsn(), "t_log_ids_up14", NULL, d, sizeof d);
    assert_int_equal(pawl__schema_migrate_to(d, 14, err, sizeof err), 0);
    pawl_test_exec(d, roles_sql());
    pawl_test_exec(d, "SELECT pawl_api.append('up-1', 'T', '\\x01')");
    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    int dbv = 0, libv = 0;
    assert_int_equal(pawl_schema_version(d, &dbv, &libv, err, sizeof err), 0);
    assert_true(libv >= 15);
    assert_int_equal(pawl_test_query_i64(d, "SELECT max(version) FROM pawl.schema_version"), libv);
    static const struct {
        const char *role, *fn;
        int want;
    } rights[] = {
        {"pawl_appender",
         "pawl.append(text[], int8[], int4[], int4[], text[], bytea[], jsonb[], "
         "boolean, text[])",
         1},
        {"pawl_appender",
         "pawl.append_group(text[], int8[], int4[], int4[], int4[], text[], "
         "bytea[], jsonb[], boolean, text[])",
         1},
        {"pawl_appender", "pawl_api.append(text, text, bytea, jsonb, int8, text)", 1},
        {"pawl_appender", "pawl_api.append_batch(text[], text[], bytea[], jsonb[], int8[], text[])",
         1},
        {"pawl_reader", "pawl_api.read(int8, int4)", 1},
        {"pawl_processor", "pawl_api.read(int8, int4)", 1},
        {"pawl_processor", "pawl.dead_letters_show(text, text)", 1},
        {"pawl_processor", "pawl_api.append(text, text, bytea, jsonb, int8, text)", 0},
        {"pawl_reader", "pawl_api.append_batch(text[], text[], bytea[], jsonb[], int8[], text[])",
         0},
        {"pawl_reader",
         "pawl.append(text[], int8[], int4[], int4[], text[], bytea[], jsonb[], "
         "boolean, text[])",
         0},
        {"pawl_appender", "pawl.ids_check(text[], int4[], text[], text[], bytea[])", 0},
        {"public", "pawl_api.append(text, text, bytea, jsonb, int8, text)", 0},
    };
    for (size_t i = 0; i < sizeof rights / sizeof rights[0]; i++) {
        char sql[512];
        snprintf(sql, sizeof sql, "SELECT has_function_privilege('%s', '%s', 'EXECUTE')::int",
                 rights[i].role, rights[i].fn);
        if (pawl_test_query_i64(d, sql) != rights[i].want)
            fail_msg("%s on %s: want %d", rights[i].role, rights[i].fn, rights[i].want);
    }
    /* An appender login, through the SQL face, with an id, twice. */
    pawl_test_exec(d, "DROP ROLE IF EXISTS pawl_ids_app");
    pawl_test_exec(d, "CREATE ROLE pawl_ids_app LOGIN IN ROLE pawl_appender");
    pawl_test_exec(d, "SET ROLE pawl_ids_app; SELECT pawl_api.append('up-1', 'T', '\\x02', NULL, "
                      "NULL, 'up-id'); SELECT pawl_api.append('up-1', 'T', '\\x02', NULL, NULL, "
                      "'up-id'); RESET ROLE");
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl.events WHERE stream_id = "
                                            "'up-1'"),
                     2);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(event_id) FROM pawl.events"), 1);
    pawl_test_exec(d, "DROP OWNED BY pawl_ids_app; DROP ROLE pawl_ids_app");
    pawl_test_db_drop(pawl_test_dsn(), "t_log_ids_up14");
}

int main(void)
{
    dsn = pawl_test_db_create("log_ids");
    char err[256];
    if (pawl_schema_migrate(dsn, err, sizeof err) != 0) {
        fprintf(stderr, "migrate: %s\n", err);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_retry_is_already),
        cmocka_unit_test(test_rule_failures),
        cmocka_unit_test(test_race_threads),
        cmocka_unit_test(test_race_processes),
        cmocka_unit_test(test_group_same_ids),
        cmocka_unit_test(test_outbox),
        cmocka_unit_test(test_sql_face),
        cmocka_unit_test(test_rotation_keeps_ids),
        cmocka_unit_test(test_upgrade_keeps_rights),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
