/*
 * test_checkpoint_pg.c — checkpoint protocol scenarios against the private PostgreSQL: the
 * PostgreSQL log and token store, an ordinary handler writing a projection through the batch
 * transaction next to a checkpointing unit.
 */
#include "pawl_test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EVENTS 600

static const char *dsn;

static int64_t q64(const char *sql)
{
    return pawl_test_query_i64(dsn, sql);
}

/* ---- a unit: fails its first checkpoint when asked to; keeps its triggers ---- */

struct unit {
    pthread_mutex_t mu;
    int fail_first;
    int checkpoints;
    int releases;
    struct pawl_trigger *trig[4];
};

static int u_claimed(void *self, struct pawl_segment seg, struct pawl_trigger *t)
{
    struct unit *u = self;
    pthread_mutex_lock(&u->mu);
    if (seg.id < 4) {
        pawl_trigger_unref(u->trig[seg.id]);
        u->trig[seg.id] = pawl_trigger_ref(t);
    }
    pthread_mutex_unlock(&u->mu);
    return 0;
}

static struct pawl_future *u_advanced(void *self, struct pawl_segment seg, int64_t requested)
{
    (void)seg;
    struct unit *u = self;
    struct pawl_future *f = pawl_future_new();
    pthread_mutex_lock(&u->mu);
    int k = u->checkpoints++;
    int fail = u->fail_first && k == 0;
    pthread_mutex_unlock(&u->mu);
    if (fail)
        pawl_future_fail(f, PAWL_ESYS, "first checkpoint fails");
    else
        pawl_future_complete(f, requested);
    return f;
}

static struct pawl_future *u_released(void *self, struct pawl_segment seg, int64_t up_to)
{
    (void)seg;
    struct unit *u = self;
    pthread_mutex_lock(&u->mu);
    u->releases++;
    pthread_mutex_unlock(&u->mu);
    struct pawl_future *f = pawl_future_new();
    pawl_future_complete(f, up_to);
    return f;
}

static const struct pawl_checkpointing ckpt = {u_claimed, u_advanced, u_released, NULL};

static int noop(void *self, struct pawl_event_ctx *ctx)
{
    (void)self;
    (void)ctx;
    return 0;
}

/* The ordinary handler: one row per event, in the batch transaction. */
static int writer(void *self, struct pawl_event_ctx *ctx)
{
    (void)self;
    char idx[32];
    snprintf(idx, sizeof idx, "%lld", (long long)pawl_ctx_event(ctx)->index);
    const char *v[1] = {idx};
    return pawl_txn_exec(pawl_ctx_txn(ctx), "INSERT INTO ckpt_applied VALUES ($1)", 1, v);
}

static void unit_fini(struct unit *u)
{
    for (int i = 0; i < 4; i++)
        pawl_trigger_unref(u->trig[i]);
}

struct world {
    struct pawl_source *src;
    struct pawl_tokens *tok;
    struct pawl_processor *p;
};

static void start(struct world *w, const char *name, const struct pawl_handler *hs, size_t n)
{
    memset(w, 0, sizeof *w);
    assert_int_equal(pawl_source_pg_new(&w->src, dsn), 0);
    assert_int_equal(pawl_tokens_pg_new(&w->tok, dsn), 0);
    struct pawl_processor_opts o;
    pawl_processor_opts_defaults(&o);
    o.name = name;
    o.segments = 2;
    o.batch_size = 25;
    o.threads = 2;
    o.claim_poll_ms = 50;
    o.backoff_min_ms = 100;
    o.backoff_max_ms = 400;
    o.idle_wait_ms = 50;
    /* Units are supported: a processor that refuses one fails here, it is not skipped. */
    int rc = pawl_processor_new(&w->p, &o, w->src, w->tok, hs, n);
    if (rc != 0)
        fail_msg("pawl_processor_new: %s", pawl_strerror(rc));
    assert_int_equal(pawl_processor_start(w->p), 0);
}

static void finish(struct world *w)
{
    pawl_processor_free(w->p);
    pawl_tokens_free(w->tok);
    pawl_source_free(w->src);
}

static int64_t token_sum(const char *proc)
{
    char sql[200];
    snprintf(sql, sizeof sql,
             "SELECT coalesce(sum(token), 0) FROM pawl.tokens WHERE processor = '%s'", proc);
    return q64(sql);
}

static int64_t head;

static int wait_for(int64_t (*fn)(const char *), const char *arg, int64_t want, double ms)
{
    double t0 = pawl_test_now_ms();
    while (pawl_test_now_ms() - t0 < ms) {
        if (fn(arg) == want)
            return 1;
        usleep(20000);
    }
    return 0;
}

static int64_t applied_rows(const char *unused)
{
    (void)unused;
    return q64("SELECT count(*) FROM ckpt_applied");
}

static void test_failed_checkpoint_rolls_back_ordinary_handler_sql(void **state)
{
    (void)state;
    pawl_test_exec(dsn, "TRUNCATE ckpt_applied");
    struct unit u = {.mu = PTHREAD_MUTEX_INITIALIZER, .fail_first = 1};
    struct pawl_handler hs[2] = {{"writer", NULL, writer, NULL}, {"unit", &u, noop, &ckpt}};
    struct world w;
    start(&w, "ck-rollback", hs, 2);
    /* Every event applied exactly once: the failed batch's rows rolled back, then redone. */
    assert_true(wait_for(applied_rows, NULL, EVENTS, 60000));
    usleep(300000);
    assert_int_equal(q64("SELECT count(*) FROM ckpt_applied"), EVENTS);
    assert_int_equal(q64("SELECT count(DISTINCT idx) FROM ckpt_applied"), EVENTS);
    struct pawl_processor_stats st;
    pawl_processor_stats(w.p, &st);
    assert_true(st.batch_failures >= 1);
    assert_int_equal(st.mode, PAWL_CKPT_AUTO);
    finish(&w);
    unit_fini(&u);
}

static void test_deferred_stores_only_agreed_positions(void **state)
{
    (void)state;
    struct unit u = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct pawl_handler hs[1] = {{"unit", &u, noop, &ckpt}};
    struct world w;
    start(&w, "ck-deferred", hs, 1);
    double t0 = pawl_test_now_ms();
    struct pawl_processor_stats st;
    do {
        usleep(20000);
        pawl_processor_stats(w.p, &st);
    } while ((int64_t)st.events < EVENTS && pawl_test_now_ms() - t0 < 60000);
    assert_int_equal(st.events, EVENTS);
    usleep(300000);
    assert_int_equal(token_sum("ck-deferred"), 0); /* no request: nothing stored */
    pthread_mutex_lock(&u.mu);
    struct pawl_trigger *t = pawl_trigger_ref(u.trig[1]);
    pthread_mutex_unlock(&u.mu);
    assert_non_null(t);
    assert_int_equal(pawl_trigger_request(t, 123), 0);
    assert_true(wait_for(token_sum, "ck-deferred", 123, 10000));
    assert_int_equal(q64("SELECT token FROM pawl.tokens WHERE processor = 'ck-deferred' AND "
                         "segment_id = 1"),
                     123);
    /* An orderly stop releases through the units: both segments store the consumed head. */
    assert_int_equal(pawl_processor_stop(w.p), 0);
    assert_int_equal(pawl_trigger_request(t, 200), PAWL_ESHUTDOWN);
    assert_int_equal(token_sum("ck-deferred"), 2 * head);
    assert_int_equal(q64("SELECT count(*) FROM pawl.tokens WHERE processor = 'ck-deferred' AND "
                         "owner IS NOT NULL AND owner <> ''"),
                     0);
    pawl_trigger_unref(t);
    finish(&w);
    unit_fini(&u);
}

static int setup(void **state)
{
    (void)state;
    pawl_log_set_level(PAWL_LOG_ERROR);
    dsn = pawl_test_db_create("ckpt");
    char err[256];
    if (pawl_schema_migrate(dsn, err, sizeof err) != 0)
        fail_msg("migrate: %s", err);
    pawl_test_exec(dsn, "CREATE TABLE ckpt_applied (idx int8 NOT NULL)");
    struct pawl_store *store = NULL;
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    if (pawl_store_new(&store, dsn, &o, err, sizeof err) != 0)
        fail_msg("store: %s", err);
    for (int i = 0; i < EVENTS; i += 50) {
        struct pawl_event ev[50];
        char ids[50][16];
        for (int k = 0; k < 50; k++) {
            snprintf(ids[k], sizeof ids[k], "c-%d", (i + k) % 31);
            ev[k] = (struct pawl_event){.stream_id = ids[k],
                                        .stream_seq = PAWL_SEQ_ANY,
                                        .type = "T",
                                        .payload = "x",
                                        .payload_len = 1};
        }
        struct pawl_append_result res;
        if (pawl_append(store, ev, 50, &res) != 0)
            fail_msg("append: %s", res.message);
    }
    for (int i = 0; i < 200 && head < EVENTS; i++) {
        pawl_finalize_now(store, NULL, NULL, &head);
        if (head < EVENTS)
            usleep(10000);
    }
    pawl_store_free(store);
    if (head != EVENTS)
        fail_msg("finalized %lld of %d", (long long)head, EVENTS);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failed_checkpoint_rolls_back_ordinary_handler_sql),
        cmocka_unit_test(test_deferred_stores_only_agreed_positions),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
