/*
 * test_tokens_pg.c — node identity and the token store's guarantees of schema 7
 * (sql/007_token_isolation.sql) against the private PostgreSQL:
 *   - two processors configured with the same node id are two nodes: 500 events are handled
 *     exactly once across both (each event's count, and an exactly-once projection), and both
 *     hold segments;
 *   - a crashed process's claims still expire after the claim timeout when a process with the
 *     same node id starts again, and the dead instance does not count as a node any more; node
 *     rows silent for an hour are deleted;
 *   - claims and node times dated in the future are refused by the table (even for the owner);
 *   - the upgrade from schema 5: claims dated in the future are released, the token store then
 *     works through the new functions, and a version-5 database is refused until upgraded.
 */
#include "pawl_test.h"
#include "schema.h"

#include <libpq-fe.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define NEVENTS 500

static const char *dsn;
static struct pawl_store *store;
static void kill_children(void);

static const char *proj_sql =
    "CREATE TABLE handled (idx int8 PRIMARY KEY, owner text NOT NULL);"
    "CREATE TABLE proj (stream text PRIMARY KEY, n int8 NOT NULL, last_seq int8 NOT NULL);"
    "CREATE TABLE proj_violations (stream text, seq int8, last int8);"
    "CREATE FUNCTION proj_apply(s text, q int8) RETURNS void LANGUAGE plpgsql AS $$ "
    "DECLARE l int8; BEGIN "
    "  SELECT last_seq INTO l FROM proj WHERE stream = s FOR UPDATE; "
    "  IF NOT FOUND THEN l := 0; INSERT INTO proj VALUES (s, 0, 0); END IF; "
    "  IF q <> l + 1 THEN INSERT INTO proj_violations VALUES (s, q, l); END IF; "
    "  UPDATE proj SET n = n + 1, last_seq = q WHERE stream = s; "
    "END $$;";

static int64_t q64(const char *sql)
{
    return pawl_test_query_i64(dsn, sql);
}

/* Run sql on d; returns its SQLSTATE ("" on success) in state. */
static void exec_state(const char *d, const char *sql, char *state, size_t len)
{
    PGconn *c = PQconnectdb(d);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    PGresult *r = PQexec(c, sql);
    const char *ss = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    snprintf(state, len, "%s", ss ? ss : "");
    PQclear(r);
    PQfinish(c);
}

static void append_n(const char *tag, int n)
{
    for (int i = 0; i < n; i += 10) {
        struct pawl_event ev[10];
        char ids[10][40];
        int k = 0;
        for (; k < 10 && i + k < n; k++) {
            snprintf(ids[k], sizeof ids[k], "%s-%d", tag, (i + k) % 40);
            ev[k] = (struct pawl_event){.stream_id = ids[k],
                                        .stream_seq = PAWL_SEQ_ANY,
                                        .type = "T",
                                        .payload = "x",
                                        .payload_len = 1};
        }
        struct pawl_append_result res;
        int rc = pawl_append(store, ev, (size_t)k, &res);
        if (rc)
            fail_msg("append: %s: %s", pawl_strerror(rc), res.message);
    }
}

static int setup(void **state)
{
    (void)state;
    pawl_log_set_level(getenv("PAWL_TEST_LOG") ? PAWL_LOG_DEBUG : PAWL_LOG_ERROR);
    dsn = pawl_test_db_create("tokens");
    char err[256];
    if (pawl_schema_migrate(dsn, err, sizeof err) != 0)
        fail_msg("migrate: %s", err);
    pawl_test_exec(dsn, proj_sql);
    if (pawl_store_new(&store, dsn, NULL, err, sizeof err) != 0)
        fail_msg("store: %s", err);
    atexit(kill_children);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kill_children();
    pawl_store_free(store);
    return 0;
}

/* ---- two processors with one node id ---- */

struct counts {
    _Atomic int seen[NEVENTS + 1];
    int64_t base;
};

struct hself {
    struct counts *c;
    const char *node; /* the processor's instance id */
};

/* Counts each event here and records it in `handled` (primary key: a second commit of one event
 * would fail its batch) with the node that handled it, and applies the projection. */
static int handle(void *self, struct pawl_event_ctx *ctx)
{
    struct hself *hs = self;
    struct counts *c = hs->c;
    const struct pawl_event *e = pawl_ctx_event(ctx);
    int64_t i = e->index - c->base;
    if (i >= 1 && i <= NEVENTS)
        atomic_fetch_add(&c->seen[i], 1);
    char idx[32], seq[32];
    snprintf(idx, sizeof idx, "%lld", (long long)e->index);
    snprintf(seq, sizeof seq, "%lld", (long long)e->stream_seq);
    const char *v1[2] = {idx, hs->node};
    int rc = pawl_txn_exec(pawl_ctx_txn(ctx), "INSERT INTO handled VALUES ($1, $2)", 2, v1);
    const char *v2[2] = {e->stream_id, seq};
    return rc ? rc : pawl_txn_exec(pawl_ctx_txn(ctx), "SELECT proj_apply($1, $2)", 2, v2);
}

static void test_same_node_id_two_processes(void **state)
{
    (void)state;
    struct counts *c = calloc(1, sizeof *c);
    c->base = q64("SELECT pawl_api.last_index()");
    struct pawl_source *src[2];
    struct pawl_tokens *tok[2];
    struct pawl_processor *p[2];
    struct hself hs[2] = {{c, NULL}, {c, NULL}};
    for (int i = 0; i < 2; i++) {
        struct pawl_handler h = {"count", &hs[i], handle, NULL};
        assert_int_equal(pawl_source_pg_new(&src[i], dsn), 0);
        assert_int_equal(pawl_tokens_pg_new(&tok[i], dsn), 0);
        struct pawl_processor_opts o;
        pawl_processor_opts_defaults(&o);
        o.name = "same";
        o.node_id = "same-node"; /* both: one env file shared by a deployment */
        o.threads = 2;
        o.batch_size = 20;
        o.claim_timeout_ms = 2000;
        o.claim_poll_ms = 50;
        o.initial_token = c->base;
        assert_int_equal(pawl_processor_new(&p[i], &o, src[i], tok[i], &h, 1), 0);
        hs[i].node = pawl_processor_node_id(p[i]);
        assert_int_equal(pawl_processor_start(p[i]), 0);
    }
    const char *id0 = pawl_processor_node_id(p[0]), *id1 = pawl_processor_node_id(p[1]);
    print_message("instance ids: %s and %s\n", id0, id1);
    assert_string_not_equal(id0, id1);
    assert_int_equal(strncmp(id0, "same-node/", 10), 0);
    assert_int_equal(strlen(id0), strlen("same-node/") + PAWL_NONCE_LEN);
    /* Both hold a fair share (8 of 16) before any event arrives. */
    char sql[256];
    double t0 = pawl_test_now_ms();
    int balanced = 0;
    while (!balanced && pawl_test_now_ms() - t0 < 20000) {
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM pawl.tokens WHERE processor = 'same' AND owner = '%s'", id0);
        int64_t a = q64(sql);
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM pawl.tokens WHERE processor = 'same' AND owner = '%s'", id1);
        int64_t b = q64(sql);
        balanced = a == 8 && b == 8;
        if (!balanced)
            usleep(50000);
    }
    assert_true(balanced);
    append_n("same", NEVENTS);
    t0 = pawl_test_now_ms();
    while (q64("SELECT count(*) FROM proj_violations") == 0 &&
           q64("SELECT coalesce(sum(n), 0) FROM proj") < NEVENTS && pawl_test_now_ms() - t0 < 30000)
        usleep(50000);
    usleep(300000); /* let a duplicate delivery, if any, show */
    struct pawl_processor_stats st[2];
    for (int i = 0; i < 2; i++)
        pawl_processor_stats(p[i], &st[i]);
    for (int i = 0; i < 2; i++)
        pawl_processor_free(p[i]);
    print_message("events handled: %llu + %llu\n", (unsigned long long)st[0].events,
                  (unsigned long long)st[1].events);
    int dup = 0, missing = 0;
    for (int i = 1; i <= NEVENTS; i++) {
        dup += c->seen[i] > 1;
        missing += c->seen[i] == 0;
    }
    print_message("events seen twice or more: %d, never: %d\n", dup, missing);
    assert_int_equal(dup, 0);
    assert_int_equal(missing, 0);
    assert_int_equal(st[0].events + st[1].events, NEVENTS);
    assert_true(st[0].events > 0 && st[1].events > 0);
    assert_int_equal(q64("SELECT count(*) FROM handled"), NEVENTS);
    assert_int_equal(q64("SELECT count(DISTINCT owner) FROM handled"), 2);
    assert_int_equal(q64("SELECT count(*) FROM proj_violations"), 0);
    assert_int_equal(q64("SELECT coalesce(sum(n), 0) FROM proj"), NEVENTS);
    /* A clean stop released every claim and left the node registry. */
    assert_int_equal(q64("SELECT count(*) FROM pawl.tokens WHERE processor = 'same' AND "
                         "owner IS NOT NULL"),
                     0);
    assert_int_equal(q64("SELECT count(*) FROM pawl.processor_nodes WHERE processor = 'same'"), 0);
    for (int i = 0; i < 2; i++) {
        pawl_tokens_free(tok[i]);
        pawl_source_free(src[i]);
    }
    free(c);
}

/* ---- a crashed process with the same node id ---- */

static pid_t children[4];

/* A failed assertion leaves the test early: never leave a helper running. */
static void kill_children(void)
{
    for (int i = 0; i < 4; i++)
        if (children[i] > 0) {
            kill(children[i], SIGKILL);
            waitpid(children[i], NULL, 0);
            children[i] = 0;
        }
}

static pid_t spawn(const char *proc, const char *node, const char *timeout_ms)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/proc_helper", PAWL_BINARY_DIR);
    pid_t pid = fork();
    if (pid == 0) {
        execl(path, path, dsn, proc, node, timeout_ms, "50", (char *)NULL);
        _exit(127);
    }
    assert_true(pid > 0);
    for (int i = 0; i < 4; i++)
        if (children[i] == 0) {
            children[i] = pid;
            break;
        }
    return pid;
}

/* The one owner of every segment of proc once a single owner holds all 16 ("" on time-out). */
static void wait_sole_owner(const char *proc, const char *not_this, char *out, size_t len,
                            double ms)
{
    double t0 = pawl_test_now_ms();
    out[0] = '\0';
    while (pawl_test_now_ms() - t0 < ms) {
        PGconn *c = PQconnectdb(dsn);
        char q[512];
        snprintf(q, sizeof q,
                 "SELECT owner FROM pawl.tokens WHERE processor = '%s' AND owner IS NOT NULL "
                 "AND owner <> '%s' GROUP BY owner HAVING count(*) = 16",
                 proc, not_this);
        PGresult *r = PQexec(c, q);
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
            snprintf(out, len, "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
        PQfinish(c);
        if (out[0])
            return;
        usleep(20000);
    }
}

static void test_crashed_node_claims_expire(void **state)
{
    (void)state;
    pawl_test_exec(dsn, "TRUNCATE proj, proj_violations");
    char first[128], second[128];
    pid_t a = spawn("crash", "twin", "2000");
    wait_sole_owner("crash", "", first, sizeof first, 30000);
    assert_true(strncmp(first, "twin/", 5) == 0);
    kill(a, SIGKILL);
    double t_kill = pawl_test_now_ms();
    waitpid(a, NULL, 0);
    children[0] = 0;
    /* Started again with the same node id: a new instance, which waits out the dead one's
     * claims (taking them as soon as they are older than the claim timeout), and then holds
     * all 16: the dead instance no longer counts as a node. */
    pid_t b = spawn("crash", "twin", "2000");
    wait_sole_owner("crash", first, second, sizeof second, 30000);
    double t_over = pawl_test_now_ms() - t_kill;
    print_message("dead instance %s, new instance %s: all 16 segments after %.0f ms (claim "
                  "timeout 2000)\n",
                  first, second, t_over);
    assert_true(strncmp(second, "twin/", 5) == 0);
    assert_string_not_equal(first, second);
    /* The last extension may have come up to an extension interval (666 ms) before the kill. */
    assert_true(t_over >= 2000 - 700);
    append_n("crash", 200);
    static const char crash_sum[] =
        "SELECT coalesce(sum(n), 0) FROM proj WHERE stream LIKE 'crash-%'";
    double t0 = pawl_test_now_ms();
    while (q64(crash_sum) < 200 && pawl_test_now_ms() - t0 < 30000)
        usleep(50000);
    assert_int_equal(q64(crash_sum), 200);
    assert_int_equal(q64("SELECT count(*) FROM proj_violations"), 0);
    kill(b, SIGTERM);
    int st;
    waitpid(b, &st, 0);
    children[1] = 0;
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* The dead instance's node row stays until it is an hour old (no node counts it after its
     * claim timeout); then any node's refresh deletes it. */
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM pawl.processor_nodes WHERE processor = 'crash' AND node = '%s'",
             first);
    assert_int_equal(q64(sql), 1);
    char upd[256];
    snprintf(upd, sizeof upd,
             "UPDATE pawl.processor_nodes SET seen_at = now() - interval '61 minutes' "
             "WHERE processor = 'crash' AND node = '%s'",
             first);
    pawl_test_exec(dsn, upd);
    pawl_test_exec(dsn, "SELECT pawl.tokens_extend('crash', 'someone', '{}')");
    assert_int_equal(q64(sql), 0);
}

/* ---- the server's clock only ---- */

static void test_future_claims_refused(void **state)
{
    (void)state;
    char ss[8];
    pawl_test_exec(dsn, "SELECT pawl.tokens_init('future', 2, 0)");
    exec_state(dsn,
               "UPDATE pawl.tokens SET owner = 'x', claimed_at = now() + interval '100 years' "
               "WHERE processor = 'future'",
               ss, sizeof ss);
    assert_string_equal(ss, "23514"); /* check_violation */
    exec_state(dsn,
               "UPDATE pawl.tokens SET owner = 'x', claimed_at = now() + interval '2 minutes' "
               "WHERE processor = 'future'",
               ss, sizeof ss);
    assert_string_equal(ss, "23514");
    exec_state(dsn,
               "INSERT INTO pawl.processor_nodes VALUES ('future', 'x', "
               "now() + interval '100 years')",
               ss, sizeof ss);
    assert_string_equal(ss, "23514");
    /* Claims come from the server's clock: a claim is dated now, and it expires. */
    struct pawl_tokens *t;
    assert_int_equal(pawl_tokens_pg_new(&t, dsn), 0);
    assert_int_equal(t->ops->claim(t, "future", 0, "n1", 10000, 0, NULL), 0);
    assert_int_equal(q64("SELECT count(*) FROM pawl.tokens WHERE processor = 'future' AND "
                         "owner = 'n1' AND abs(extract(epoch FROM claimed_at - now())) < 5"),
                     1);
    assert_int_equal(t->ops->claim(t, "future", 0, "n2", 10000, 0, NULL), PAWL_EBUSY);
    usleep(120000);
    assert_int_equal(t->ops->claim(t, "future", 0, "n2", 100, 0, NULL), 0);
    pawl_tokens_free(t);
}

/* ---- the upgrade from schema 5 ---- */

static void test_upgrade_from_5(void **state)
{
    (void)state;
    char err[512], d[1024], name[160];
    snprintf(name, sizeof name, "t_tokup_%ld", (long)getpid());
    pawl_test_db_make(pawl_test_dsn(), name, NULL, d, sizeof d);
    assert_int_equal(pawl__schema_migrate_to(d, 5, err, sizeof err), 0);
    int dbv = 0;
    assert_int_equal(pawl_schema_version(d, &dbv, NULL, err, sizeof err), 0);
    assert_int_equal(dbv, 5);
    /* Version-5 rows: a processor with a live claim, a claim dated a century ahead (the attack
     * of a processor login that schema 5 allowed), a fake node from the future. */
    pawl_test_exec(d, "SELECT pawl.tokens_init('up', 4, 7)");
    pawl_test_exec(d, "UPDATE pawl.tokens SET owner = 'live', claimed_at = now(), mode = 0 "
                      "WHERE processor = 'up' AND segment_id = 0");
    pawl_test_exec(d, "UPDATE pawl.tokens SET owner = 'evil', claimed_at = now() + "
                      "interval '100 years', mode = 0 WHERE processor = 'up' AND segment_id = 1");
    pawl_test_exec(d, "INSERT INTO pawl.processor_nodes VALUES ('up', 'live', now()), "
                      "('up', 'fake', now() + interval '100 years')");
    /* This library's token store refuses the old schema (its functions are missing). */
    struct pawl_tokens *t = NULL;
    assert_int_equal(pawl_tokens_pg_new(&t, d), PAWL_ESCHEMA);

    assert_int_equal(pawl_schema_migrate(d, err, sizeof err), 0);
    assert_int_equal(pawl_schema_version(d, &dbv, NULL, err, sizeof err), 0);
    assert_int_equal(dbv, pawl__schema_lib_version());
    assert_true(dbv >= 7);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl.schema_version "
                                            "WHERE name = '007_token_isolation.sql'"),
                     1);
    /* The future claim was released, the live one kept; the fake node is gone. */
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl.tokens WHERE "
                                            "processor = 'up' AND owner = 'evil'"),
                     0);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl.tokens WHERE "
                                            "processor = 'up' AND owner = 'live'"),
                     1);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl.processor_nodes WHERE "
                                            "node = 'fake'"),
                     0);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pg_constraint WHERE conname IN "
                                            "('tokens_claimed_at_check', "
                                            "'processor_nodes_seen_at_check')"),
                     2);
    /* The token functions are the owner's, SECURITY DEFINER with a pinned search_path. */
    assert_int_equal(
        pawl_test_query_i64(d, "SELECT count(*) FROM pg_proc WHERE pronamespace = "
                               "'pawl'::regnamespace AND prosecdef AND proconfig::text LIKE "
                               "'%search_path=pg_catalog%' AND proname IN ('tokens_authorize', "
                               "'tokens_list', 'tokens_claim', 'tokens_extend', 'nodes_live', "
                               "'nodes_leave', 'tokens_release', 'tokens_init', 'store_token', "
                               "'tokens_split', 'tokens_merge', 'tokens_reset')"),
        12);
    /* And the store works through them: the rows, a claim of the freed segment, a token. */
    assert_int_equal(pawl_tokens_pg_new(&t, d), 0);
    struct pawl_segment_status *rows;
    size_t n;
    assert_int_equal(t->ops->list(t, "up", &rows, &n), 0);
    assert_int_equal(n, 4);
    assert_int_equal(rows[0].token, 7);
    assert_string_equal(rows[0].owner, "live");
    assert_string_equal(rows[1].owner, "");
    pawl_tokens_rows_free(rows);
    assert_int_equal(t->ops->claim(t, "up", 1, "n1", 10000, 0, NULL), 0);
    struct pawl_txn *x;
    assert_int_equal(t->ops->begin(t, "up", 1, "n1", &x), 0);
    assert_int_equal(x->ops->store(x, 9), 0);
    assert_int_equal(x->ops->commit(x), 0);
    assert_int_equal(pawl_test_query_i64(d, "SELECT token FROM pawl.tokens WHERE "
                                            "processor = 'up' AND segment_id = 1"),
                     9);
    pawl_tokens_free(t);
    pawl_test_db_drop(pawl_test_dsn(), name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_node_id_two_processes),
        cmocka_unit_test(test_crashed_node_claims_expire),
        cmocka_unit_test(test_future_claims_refused),
        cmocka_unit_test(test_upgrade_from_5),
    };
    if (getenv("PAWL_TEST_FILTER"))
        cmocka_set_test_filter(getenv("PAWL_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
