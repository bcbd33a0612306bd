/*
 * test_log_plans.c — the finalizer's cost does not depend on planner statistics. The same load is
 * finalized in four databases: fresh statistics (ANALYZE after a preload), stale statistics
 * (ANALYZE while nothing was finalized, then load), no statistics (autovacuum off, never analyzed)
 * and dead index entries kept alive by a long-open snapshot (a REPEATABLE READ transaction on
 * another connection while aborted appends leave dead tuples). For each it prints the finalizer's
 * execution time per finalized append (the function call inside an open transaction, so the
 * commit's WAL flush is not counted), median and mean over the rounds, and asserts, loosely on a
 * shared machine, that no case's median costs more than 3x the fresh one (a plan change costs 3-10x
 * in every round).
 */
#include "pawl_test.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char base_dsn[1024];

static void make_db(const char *name, char *dsn_out, size_t len)
{
    pawl_test_db_make(base_dsn, name, NULL, dsn_out, len);
    char err[256];
    if (pawl_schema_migrate(dsn_out, err, sizeof err) != 0)
        fail_msg("migrate: %s", err);
    /* Statistics only change when the test says so. */
    /* pawl.events is partitioned (schema 9): the setting belongs to its partitions. */
    pawl_test_exec(dsn_out, "DO $$DECLARE r regclass; BEGIN FOR r IN SELECT relid FROM "
                            "pg_partition_tree('pawl.events') WHERE isleaf LOOP EXECUTE "
                            "format('ALTER TABLE %s SET (autovacuum_enabled = false)', r); "
                            "END LOOP; END$$;"
                            "ALTER TABLE pawl.runs SET (autovacuum_enabled = false)");
}

static void drop_db(const char *name)
{
    pawl_test_db_drop(base_dsn, name);
}

static struct pawl_store *open_store(const char *dsn)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.finalizer = 0; /* the test finalizes, and times it */
    o.listen = 0;
    /* One transaction per append, so that a round's run finalizes its 64 appends: grouped,
     * they were about 3 transactions a round, and the median measured a run's fixed cost,
     * not its cost per append (the stale case then drifted to 3.0-4.5x the fresh one on a
     * loaded machine, failing now and then). */
    o.append_group_max = 1;
    struct pawl_store *s = NULL;
    char err[512];
    if (pawl_store_new(&s, dsn, &o, err, sizeof err) != 0)
        fail_msg("store: %s", err);
    return s;
}

static void cb_ignore(void *ud, const struct pawl_append_result *r)
{
    (void)ud;
    (void)r;
}

/* rounds x (ones one-event appends + a few 20-event ones), async, then drained. */
static int64_t load(struct pawl_store *s, int ones, int twenties, int conflicts)
{
    static int counter;
    char sid[32][32];
    struct pawl_event ev[32];
    int64_t appends = 0;
    for (int i = 0; i < ones; i++) {
        snprintf(sid[0], sizeof sid[0], "one-%d", counter++ % 5000);
        ev[0] =
            (struct pawl_event){.stream_id = sid[0], .type = "t", .payload = "p", .payload_len = 1};
        while (pawl_append_async(s, ev, 1, cb_ignore, NULL) == PAWL_EAGAIN)
            usleep(100);
        appends++;
    }
    for (int i = 0; i < twenties; i++) {
        for (int k = 0; k < 20; k++) {
            snprintf(sid[k], sizeof sid[k], "batch-%d", (counter++) % 3000);
            ev[k] = (struct pawl_event){
                .stream_id = sid[k], .type = "t", .payload = "pp", .payload_len = 2};
        }
        while (pawl_append_async(s, ev, 20, cb_ignore, NULL) == PAWL_EAGAIN)
            usleep(100);
        appends++;
    }
    for (int i = 0; i < conflicts; i++) {
        /* Explicit sequence 1 on a stream that exists: inserted, then refused: dead tuples. */
        ev[0] = (struct pawl_event){
            .stream_id = "one-1", .stream_seq = 1, .type = "t", .payload = "p", .payload_len = 1};
        ev[1] = (struct pawl_event){.stream_id = "fresh-stream",
                                    .stream_seq = 0,
                                    .type = "t",
                                    .payload = "p",
                                    .payload_len = 1};
        pawl_append(s, ev, 2, NULL);
    }
    pawl_store_drain(s);
    return appends;
}

/* One finalization inside an open transaction; returns its execution time in µs. */
static double timed_finalize(PGconn *c, int64_t *appends)
{
    PQclear(PQexec(c, "BEGIN"));
    double t0 = pawl_test_now_ms();
    PGresult *r = PQexec(c, "SELECT appends FROM pawl.finalize(100000)");
    double t = (pawl_test_now_ms() - t0) * 1000.0;
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        fail_msg("finalize: %s", PQerrorMessage(c));
    *appends = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    PQclear(PQexec(c, "COMMIT"));
    return t;
}

/* Finalize everything, untimed. */
static void finalize_all(PGconn *c)
{
    int64_t a = 1;
    while (a != 0)
        timed_finalize(c, &a);
}

enum scenario { FRESH, STALE, NONE, DEAD };

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static const char *names[] = {"fresh statistics", "stale statistics", "no statistics",
                              "dead index entries (long-open snapshot)"};

static double measure(enum scenario sc)
{
    char dsn[1100], db[64];
    snprintf(db, sizeof db, "t_plans_%d_%ld", (int)sc, (long)getpid());
    make_db(db, dsn, sizeof dsn);
    struct pawl_store *s = open_store(dsn);
    PGconn *c = PQconnectdb(dsn);
    PGconn *holder = NULL;
    assert_int_equal(PQstatus(c), CONNECTION_OK);

    if (sc == STALE) {
        /* Analyze while nothing is finalized: the planner believes runs has one row and
         * events a handful, all of them unfinalized. */
        load(s, 20, 0, 0);
        pawl_test_exec(dsn, "ANALYZE pawl.events; ANALYZE pawl.runs");
    }
    /* Preload: 6 x 100 appends of 20 events, finalized. */
    for (int i = 0; i < 6; i++) {
        load(s, 0, 100, 0);
        finalize_all(c);
    }
    if (sc == FRESH || sc == DEAD)
        pawl_test_exec(dsn, "ANALYZE pawl.events; ANALYZE pawl.runs");
    if (sc == NONE)
        assert_int_equal(pawl_test_query_i64(dsn, "SELECT count(*) FROM pg_stats WHERE "
                                                  "schemaname = 'pawl'"),
                         0);
    if (sc == DEAD) {
        holder = PQconnectdb(dsn);
        PQclear(PQexec(holder, "BEGIN ISOLATION LEVEL REPEATABLE READ"));
        PQclear(PQexec(holder, "SELECT count(*) FROM pawl.runs"));
    }

    double total_us = 0;
    int64_t total_appends = 0;
    double worst = 0;
    enum { ROUNDS = 25 };
    double per_round[ROUNDS];
    for (int round = 0; round < ROUNDS; round++) {
        load(s, 60, 4, sc == DEAD ? 20 : 0);
        int64_t a;
        double t = timed_finalize(c, &a);
        total_us += t;
        total_appends += a;
        per_round[round] = a > 0 ? t / (double)a : t;
        if (t > worst)
            worst = t;
    }
    qsort(per_round, ROUNDS, sizeof per_round[0], cmp_double);
    /* The median per round: a plan change shifts every round, a descheduled backend on this
     * shared machine only a few. */
    double median = per_round[ROUNDS / 2];
    if (holder) {
        PQclear(PQexec(holder, "COMMIT"));
        PQfinish(holder);
    }
    double per = total_us / (double)total_appends;
    printf("finalizer cost, %-42s median %7.2f us, mean %7.2f us per finalized append "
           "(%lld appends, worst run %.0f us)\n",
           names[sc], median, per, (long long)total_appends, worst);
    PQfinish(c);
    pawl_store_free(s);
    drop_db(db);
    return median;
}

static void test_plan_stability(void **state)
{
    (void)state;
    double fresh = measure(FRESH);
    double stale = measure(STALE);
    double none = measure(NONE);
    double dead = measure(DEAD);
    printf("ratios of the medians to fresh: stale %.2f, none %.2f, dead entries %.2f (target <= "
           "1.5)\n",
           stale / fresh, none / fresh, dead / fresh);
    /* Loose: timings on a shared 2-core machine are noisy; a plan change costs 3-10x. */
    assert_true(stale < 3.0 * fresh);
    assert_true(none < 3.0 * fresh);
    assert_true(dead < 3.0 * fresh);
}

int main(void)
{
    snprintf(base_dsn, sizeof base_dsn, "%s", pawl_test_dsn());
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_plan_stability)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
