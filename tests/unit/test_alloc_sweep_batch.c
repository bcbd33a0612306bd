/*
 * test_alloc_sweep_batch.c — allocation failure inside one processor batch over the in-memory
 * source and token store: the batch is run with its 1st, 2nd, ... allocation failed until it runs
 * without reaching the failure (tests/support/fault_alloc.h has the counting allocator; the loop
 * is here because an operation, unlike a constructor, leaves an object that must go on working).
 *
 * The batch is what the worker that runs it allocates from the token store's begin to the
 * return of its commit or rollback: the handlers' calls, pawl_txn_exec's copies, the token
 * write and the commit. The test interposes on begin, commit and rollback by swapping the ops
 * tables of the token store and of its transactions (both interfaces are public, and each object
 * starts with its ops pointer): begin arms the fault on the worker, the end of the transaction
 * disarms it and notes whether it fired. Whatever allocation fails, the processor must recover
 * and apply every event exactly once (the store's exec hook counts what commits), store the
 * final token, and, once everything is freed, have given back every allocation (under ASan,
 * LeakSanitizer checks what the hooks do not see).
 */
#include "fault_alloc.h"
#include "pawl_test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EVENTS 12
#define STREAMS 3

static const struct pawl_tokens_ops *mem_tok_ops;
static const struct pawl_txn_ops *mem_txn_ops;
static struct pawl_tokens_ops sweep_tok_ops;
static struct pawl_txn_ops sweep_txn_ops;

/* One construction's state, shared with the worker through the hooks. */
static struct {
    pthread_mutex_t mu;
    long arm;                /* > 0: the next begin arms this allocation (then 0) */
    struct pawl_txn *txn;    /* the armed transaction, until it ends */
    int ended;               /* the armed transaction has ended (or its begin failed) */
    int fired;               /* ... and the armed allocation failed in it */
    int execs;               /* statements the armed transaction queued */
    int applied[EVENTS + 1]; /* commits of each event's statement, by index */
} sw = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Under sw.mu: the armed transaction is over (on the worker that armed it). */
static void disarm_locked(void)
{
    sw.fired = fault_alloc_fired();
    fault_alloc_arm(0);
    sw.txn = NULL;
    sw.ended = 1;
}

static int sweep_exec(struct pawl_txn *t, const char *sql, int nparams, const char *const *values)
{
    pthread_mutex_lock(&sw.mu);
    sw.execs++;
    pthread_mutex_unlock(&sw.mu);
    return mem_txn_ops->exec(t, sql, nparams, values);
}

static int sweep_commit(struct pawl_txn *t)
{
    int rc = mem_txn_ops->commit(t);
    pthread_mutex_lock(&sw.mu);
    disarm_locked();
    pthread_mutex_unlock(&sw.mu);
    return rc;
}

static void sweep_rollback(struct pawl_txn *t)
{
    mem_txn_ops->rollback(t);
    pthread_mutex_lock(&sw.mu);
    disarm_locked();
    pthread_mutex_unlock(&sw.mu);
}

static int sweep_begin(struct pawl_tokens *t, const char *proc, uint32_t seg_id, const char *owner,
                       struct pawl_txn **txn)
{
    pthread_mutex_lock(&sw.mu);
    long n = sw.arm;
    sw.arm = 0;
    pthread_mutex_unlock(&sw.mu);
    if (n > 0)
        fault_alloc_arm(n); /* this thread's allocations from here on */
    int rc = mem_tok_ops->begin(t, proc, seg_id, owner, txn);
    if (n > 0) {
        pthread_mutex_lock(&sw.mu);
        if (rc == 0) {
            mem_txn_ops = (*txn)->ops;
            sweep_txn_ops = *mem_txn_ops;
            sweep_txn_ops.exec = sweep_exec;
            sweep_txn_ops.commit = sweep_commit;
            sweep_txn_ops.rollback = sweep_rollback;
            (*txn)->ops = &sweep_txn_ops;
            sw.txn = *txn;
        } else {
            disarm_locked();
        }
        pthread_mutex_unlock(&sw.mu);
    }
    return rc;
}

/* The store's exec hook, at commit under its lock: the statement's parameter is the index. */
static int apply(void *ud, const char *sql, int nparams, const char *const *values)
{
    long i = nparams == 1 && values[0] ? strtol(values[0], NULL, 10) : 0;
    if (i < 1 || i > EVENTS)
        return -1;
    pthread_mutex_lock(&sw.mu);
    sw.applied[i]++;
    pthread_mutex_unlock(&sw.mu);
    return 0;
}

static int handle(void *self, struct pawl_event_ctx *ctx)
{
    char idx[24];
    snprintf(idx, sizeof idx, "%lld", (long long)pawl_ctx_event(ctx)->index);
    const char *v[1] = {idx};
    return pawl_txn_exec(pawl_ctx_txn(ctx), "INSERT INTO seen VALUES ($1)", 1, v);
}

/* The processor's stored token, or -1. */
static int64_t stored_token(struct pawl_tokens *tok)
{
    struct pawl_segment_status *rows;
    size_t n;
    if (tok->ops->list(tok, "sweep", &rows, &n) != 0)
        return -1;
    int64_t token = n == 1 ? rows[0].token : -1;
    pawl_tokens_rows_free(rows);
    return token;
}

/* The processor's one segment is claimed. */
static int claimed(struct pawl_tokens *tok)
{
    struct pawl_segment_status *rows;
    size_t n;
    if (tok->ops->list(tok, "sweep", &rows, &n) != 0)
        return 0;
    int held = n == 1 && rows[0].owner[0] != '\0';
    pawl_tokens_rows_free(rows);
    return held;
}

/* One run with allocation n of the batch failed; returns 1 if it failed (0: the batch made
 * fewer than n allocations), and the statements the armed batch queued in *statements. Fails
 * the test if the processor does not recover. */
static int run_once(long n, int *statements)
{
    struct pawl_source *src;
    struct pawl_tokens *tok;
    struct pawl_processor *p;
    assert_int_equal(pawl_source_mem_new(&src), 0);
    assert_int_equal(pawl_tokens_mem_new(&tok), 0);
    pawl_tokens_mem_set_exec(tok, apply, NULL);
    mem_tok_ops = tok->ops;
    sweep_tok_ops = *tok->ops;
    sweep_tok_ops.begin = sweep_begin;
    tok->ops = &sweep_tok_ops;

    struct pawl_event ev[EVENTS];
    char sid[STREAMS][16];
    for (int s = 0; s < STREAMS; s++)
        snprintf(sid[s], sizeof sid[s], "sweep-%d", s);
    for (int i = 0; i < EVENTS; i++) {
        memset(&ev[i], 0, sizeof ev[i]);
        ev[i].stream_id = sid[i % STREAMS];
        ev[i].stream_seq = i / STREAMS + 1;
        ev[i].type = "Swept";
        ev[i].payload = "{\"k\":1}";
        ev[i].payload_len = 7;
        ev[i].metadata = "{\"m\":2}";
    }
    struct pawl_processor_opts o;
    pawl_processor_opts_defaults(&o);
    o.name = "sweep";
    o.node_id = "n1";
    o.threads = 1;
    o.segments = 1;
    o.batch_size = EVENTS; /* one batch may take every event */
    o.read_batch = 1000;
    o.read_ahead = 1000;
    o.claim_poll_ms = 20;
    o.claim_timeout_ms = 600;
    o.backoff_min_ms = 5;
    o.backoff_max_ms = 20;
    const struct pawl_handler h = {"seen", NULL, handle, NULL};
    assert_int_equal(pawl_processor_new(&p, &o, src, tok, &h, 1), 0);
    assert_int_equal(pawl_processor_start(p), 0);
    /* The events arrive in one append once the processor holds its segment and waits, so that
     * the read-ahead hands them on together and one batch takes them all. */
    double t0 = pawl_test_now_ms();
    while (!claimed(tok) && pawl_test_now_ms() - t0 < 10000)
        usleep(1000);
    assert_true(claimed(tok));
    pthread_mutex_lock(&sw.mu);
    memset(sw.applied, 0, sizeof sw.applied);
    sw.arm = n;
    sw.txn = NULL;
    sw.ended = sw.fired = sw.execs = 0;
    pthread_mutex_unlock(&sw.mu);
    assert_int_equal(pawl_source_mem_append(src, ev, EVENTS), 0);

    t0 = pawl_test_now_ms();
    int done = 0;
    while (!done && pawl_test_now_ms() - t0 < 20000) {
        usleep(2000);
        pthread_mutex_lock(&sw.mu);
        done = sw.ended;
        for (int i = 1; i <= EVENTS; i++)
            done = done && sw.applied[i] > 0;
        pthread_mutex_unlock(&sw.mu);
        done = done && stored_token(tok) == EVENTS;
    }
    pawl_processor_stop(p);
    pawl_processor_free(p);

    int64_t token = stored_token(tok); /* before sw.mu: the store's hook takes it under its lock */
    pthread_mutex_lock(&sw.mu);
    int fired = sw.fired, ended = sw.ended, execs = sw.execs;
    for (int i = 1; i <= EVENTS; i++)
        if (sw.applied[i] != 1)
            fail_msg("allocation %ld of the batch failed, and event %d was applied %d times "
                     "(token %lld)",
                     n, i, sw.applied[i], (long long)token);
    pthread_mutex_unlock(&sw.mu);
    if (!ended)
        fail_msg("allocation %ld: the armed batch never ended", n);
    if (token != EVENTS)
        fail_msg("allocation %ld of the batch failed, and the token stayed at %lld", n,
                 (long long)token);
    /* The armed transaction is a batch: its handlers queued a statement per event (the
     * processor may split the events over two batches, as the read-ahead hands them on). */
    if (!fired && execs < 1)
        fail_msg("the armed transaction queued no statement: it was not a batch");
    *statements = execs;
    pawl_tokens_free(tok);
    pawl_source_free(src);
    return fired;
}

static void test_batch(void **state)
{
    enum pawl_log_level level = pawl_log_get_level();
    pawl_log_set_level(PAWL_LOG_OFF); /* every failure logs; the test checks outcomes */
    long n;
    int statements = 0;
    for (n = 1; n < 10000; n++) {
        long base = fault_alloc_live();
        int fired = run_once(n, &statements);
        if (fault_alloc_live() != base)
            fail_msg("allocation %ld of the batch failed, and %ld allocations were not freed", n,
                     fault_alloc_live() - base);
        if (!fired)
            break;
    }
    pawl_log_set_level(level);
    print_message("processor batch of %d events: %ld allocations, each failure handled\n",
                  statements, n - 1);
    assert_true(n - 1 >= statements); /* at least a statement copy per event */
}

int main(void)
{
    fault_alloc_install();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
