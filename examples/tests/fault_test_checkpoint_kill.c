/*
 * fault_test_checkpoint_kill.c — kill -9 of a fully deferred processor, and restart.
 *
 * A child process runs the in-memory projection (example 1) as the only handler of a processor
 * against the private PostgreSQL (example_checkpoint projection ...). It is SIGKILLed while it
 * handles the log, after it has stored some checkpoints. At that instant, for every segment, the
 * stored token must not be ahead of the projection's durable snapshot (a token is stored only
 * once the unit confirmed its snapshot) and the snapshot must hold exactly the segment's events
 * up to its position. A second run resumes from the stored tokens; the events redelivered after
 * them are already in the snapshots and must not be applied twice. After an orderly stop, every
 * segment's snapshot holds every one of its events exactly once, in index order, and the stored
 * token equals the snapshot's position.
 */
#include "pawl_test.h"

#include "projection.h"

#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define EVENTS 3000
#define SEGMENTS 4
#define PROC "ckptkill"

static const char *dsn;
static pid_t child = -1; /* killed at exit if a failed assertion leaves it running */
static char dir[256];
static int64_t idx[EVENTS + 1];
static uint32_t segof[EVENTS + 1];
static int nev;

static pid_t spawn(void)
{
    char bin[512];
    snprintf(bin, sizeof bin, "%s/example_checkpoint", getenv("PAWL_BIN"));
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a test killed by its time-out */
        /* every 50 events a request; 300 µs per event: the run takes about a second */
        execl(bin, bin, "projection", dsn, dir, PROC, "50", "300", "4", (char *)NULL);
        _exit(127);
    }
    assert_true(pid > 0);
    child = pid;
    return pid;
}

static int64_t q64(const char *sql)
{
    return pawl_test_query_i64(dsn, sql);
}

static int64_t stored(uint32_t seg)
{
    char sql[200];
    snprintf(sql, sizeof sql,
             "SELECT coalesce(max(token), -1) FROM pawl.tokens WHERE processor = '%s' AND "
             "segment_id = %u",
             PROC, seg);
    return q64(sql);
}

/* The fold of seg's events with index <= pos, in index order. */
static struct ex_proj_state expected(uint32_t seg, int64_t pos)
{
    struct ex_proj_state s = {0};
    for (int i = 0; i < nev; i++)
        if (segof[i] == seg && idx[i] <= pos)
            ex_proj_apply(&s, idx[i]);
    return s;
}

/* Every segment: token <= snapshot position, snapshot == exactly its events up to there. */
static void check_consistent(int final)
{
    for (uint32_t seg = 0; seg < SEGMENTS; seg++) {
        struct pawl_segment sg = {seg, SEGMENTS - 1};
        int64_t tok = stored(seg);
        struct ex_proj_state snap;
        int rc = ex_projection_load(dir, sg, &snap);
        if (rc == PAWL_ENOTFOUND) {
            assert_int_equal(tok, 0); /* nothing durable, nothing stored */
            assert_false(final);
            continue;
        }
        assert_int_equal(rc, 0);
        assert_true(tok <= snap.pos);
        struct ex_proj_state want = expected(seg, snap.pos);
        assert_int_equal(snap.count, want.count);
        assert_int_equal(snap.sum, want.sum);
        assert_int_equal(snap.hash, want.hash);
        if (final) {
            struct ex_proj_state all = expected(seg, INT64_MAX);
            assert_int_equal(snap.count, all.count);
            assert_int_equal(snap.hash, all.hash);
            assert_int_equal(tok, snap.pos);
        }
    }
}

static void test_kill9_in_deferred_mode_resumes_from_last_agreed_checkpoint(void **state)
{
    (void)state;
    pid_t pid = spawn();
    /* Wait until some checkpoints are stored, but not all events are handled. */
    double t0 = pawl_test_now_ms();
    int64_t sum = 0;
    char sql[200];
    snprintf(sql, sizeof sql,
             "SELECT coalesce(sum(token), 0) FROM pawl.tokens WHERE processor = '%s'", PROC);
    while (pawl_test_now_ms() - t0 < 60000) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            child = -1;
            fail_msg("the processor exited early (status %d)", status);
        }
        sum = q64(sql);
        if (sum > 0)
            break;
        usleep(5000);
    }
    assert_true(sum > 0);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    child = -1;
    check_consistent(0);
    int64_t at_kill = q64(sql);

    /* Restart (the dead node's claims expire after the 1 s claim timeout), finish, stop. */
    pid = spawn();
    /* The projection asks for a checkpoint every 50 events of a segment: once every segment's
     * snapshot is within 50 events of the end, the rest is a few milliseconds of handling; the
     * orderly stop then snapshots it (on_segment_released). */
    t0 = pawl_test_now_ms();
    int done = 0;
    while (!done && pawl_test_now_ms() - t0 < 120000) {
        done = 1;
        for (uint32_t seg = 0; seg < SEGMENTS && done; seg++) {
            struct ex_proj_state snap, all = expected(seg, INT64_MAX);
            struct pawl_segment sg = {seg, SEGMENTS - 1};
            if (ex_projection_load(dir, sg, &snap) == 0)
                done = snap.count + 50 > all.count;
            else
                done = all.count < 50;
        }
        if (!done)
            usleep(20000);
    }
    assert_true(done);
    usleep(1000000);
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    child = -1;
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    check_consistent(1);
    assert_true(q64(sql) >= at_kill);
}

static int setup(void **state)
{
    (void)state;
    if (getenv("PAWL_BIN") == NULL)
        pawl_test_skip("PAWL_BIN is not set");
    pawl_log_set_level(PAWL_LOG_ERROR);
    dsn = pawl_test_db_create("ckptkill");
    char err[256];
    if (pawl_schema_migrate(dsn, err, sizeof err) != 0)
        fail_msg("migrate: %s", err);
    snprintf(dir, sizeof dir, "/tmp/pawl-ckptkill-%d-XXXXXX", (int)getpid());
    if (mkdtemp(dir) == NULL)
        return -1;
    struct pawl_store *store = NULL;
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    if (pawl_store_new(&store, dsn, &o, err, sizeof err) != 0)
        fail_msg("store: %s", err);
    for (int i = 0; i < EVENTS; i += 100) {
        struct pawl_event ev[100];
        char ids[100][16];
        for (int k = 0; k < 100; k++) {
            snprintf(ids[k], sizeof ids[k], "acct-%d", (i + k) % 53);
            ev[k] = (struct pawl_event){.stream_id = ids[k],
                                        .stream_seq = PAWL_SEQ_ANY,
                                        .type = "T",
                                        .payload = "x",
                                        .payload_len = 1};
        }
        struct pawl_append_result res;
        if (pawl_append(store, ev, 100, &res) != 0)
            fail_msg("append: %s", res.message);
    }
    int64_t fin = 0, apps = 0;
    for (int i = 0; i < 100 && q64("SELECT count(*) FROM pawl_api.events") < EVENTS; i++) {
        pawl_finalize_now(store, &apps, &fin, NULL);
        usleep(20000);
    }
    pawl_store_free(store);
    /* The events and their segments, as the test's oracle. */
    PGconn *c = PQconnectdb(dsn);
    PGresult *r = PQexec(c, "SELECT global_index, stream_id FROM pawl_api.events "
                            "ORDER BY global_index");
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        fail_msg("query: %s", PQerrorMessage(c));
    nev = PQntuples(r);
    if (nev != EVENTS)
        fail_msg("%d events finalized of %d", nev, EVENTS);
    for (int i = 0; i < nev; i++) {
        idx[i] = atoll(PQgetvalue(r, i, 0));
        segof[i] = pawl_stream_hash(PQgetvalue(r, i, 1)) & (SEGMENTS - 1);
    }
    PQclear(r);
    PQfinish(c);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (child > 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill9_in_deferred_mode_resumes_from_last_agreed_checkpoint),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
