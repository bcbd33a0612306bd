/*
 * test_dead_letters_pg.c — dead letters per stream against the private PostgreSQL.
 *
 *   - poison: one poison event among 1,000 streams under load parks its stream (the event and
 *     every later one, in order) while the other 999 streams finish with no back-off; a
 *     retryable error parks after the policy's attempts (one back-off); live events of the
 *     parked stream are parked behind; the letters carry segment, attempts and error;
 *   - retry: once the handler is fixed, a retry hands the letters to the handler exactly once,
 *     in order, un-parks the stream, and live events follow with no gap and no duplicate; a
 *     retry that fails keeps the stream parked and counts an attempt; drop lets it flow;
 *   - replay: a reset to the start re-handles the streams that are not parked and the parked
 *     stream's events before its first letter, and parks nothing twice;
 *   - crashes: processes sharing the segments are killed with SIGKILL while they park and while
 *     they retry; nothing is lost or doubled (every event is applied once or parked once).
 *   - log lines: the handler's failure, the parking and the retry name the stream with its
 *     control characters escaped (an id or a handler's message cannot retitle or rewrite the
 *     operator's terminal), and no line of the processor carries a raw control byte.
 *
 * The projection is exactly-once: SELECT proj_apply(stream, seq) records a violation when a
 * sequence number does not follow the last one applied (a redelivery or a reordering).
 */
#include "pawl_test.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *dsn;
static struct pawl_store *store;

static const char *proj_sql =
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

static int setup(void **state)
{
    (void)state;
    pawl_log_set_level(getenv("PAWL_TEST_LOG") ? PAWL_LOG_DEBUG : PAWL_LOG_ERROR);
    dsn = pawl_test_db_create("dl");
    char err[256];
    if (pawl_schema_migrate(dsn, err, sizeof err) != 0)
        fail_msg("migrate: %s", err);
    pawl_test_exec(dsn, proj_sql);
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    if (pawl_store_new(&store, dsn, &o, err, sizeof err) != 0)
        fail_msg("store: %s", err);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pawl_store_free(store);
    return 0;
}

/* Append one event of type to stream. */
static void append1(const char *stream, const char *type)
{
    static int n; /* event ids: a dead letter keeps its event's id */
    char id[32];
    snprintf(id, sizeof id, "one-%d", ++n);
    struct pawl_event ev = {.stream_id = stream,
                            .stream_seq = PAWL_SEQ_ANY,
                            .type = type,
                            .payload = "{\"v\":1}",
                            .payload_len = 7,
                            .id = id};
    struct pawl_append_result res;
    int rc = pawl_append(store, &ev, 1, &res);
    if (rc)
        fail_msg("append: %s: %s", pawl_strerror(rc), res.message);
}

/* Append rounds x nstreams events ("<prefix>-<i>"), 100 per append; type "poison" for stream
 * poison_stream at round poison_round (-1: none), "flaky" likewise for flaky_stream. */
static void append_load(const char *prefix, int nstreams, int rounds, int poison_stream,
                        int poison_round, int flaky_stream, int flaky_round)
{
    struct pawl_event ev[100];
    char ids[100][48];
    int k = 0;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < nstreams; i++) {
            snprintf(ids[k], sizeof ids[k], "%s-%d", prefix, i);
            const char *type = "T";
            if (i == poison_stream && r == poison_round)
                type = "poison";
            if (i == flaky_stream && r == flaky_round)
                type = "flaky";
            ev[k] = (struct pawl_event){.stream_id = ids[k],
                                        .stream_seq = PAWL_SEQ_ANY,
                                        .type = type,
                                        .payload = "x",
                                        .payload_len = 1};
            if (++k == 100) {
                struct pawl_append_result res;
                int rc = pawl_append(store, ev, (size_t)k, &res);
                if (rc)
                    fail_msg("append: %s: %s", pawl_strerror(rc), res.message);
                k = 0;
            }
        }
    }
    if (k) {
        struct pawl_append_result res;
        int rc = pawl_append(store, ev, (size_t)k, &res);
        if (rc)
            fail_msg("append: %s: %s", pawl_strerror(rc), res.message);
    }
}

/* ---- the in-process handler: poison / flaky until fixed ---- */

static atomic_int fixed;
static atomic_llong handled_letters;

static int apply(void *self, struct pawl_event_ctx *ctx)
{
    (void)self;
    const struct pawl_event *e = pawl_ctx_event(ctx);
    if (!atomic_load(&fixed) && strcmp(e->type, "poison") == 0)
        return pawl_ctx_error(ctx, PAWL_EPOISON, "cannot parse the payload");
    if (!atomic_load(&fixed) && strcmp(e->type, "flaky") == 0)
        return pawl_ctx_error(ctx, PAWL_ECONN, "downstream unavailable");
    if (pawl_ctx_is_dead_letter(ctx))
        atomic_fetch_add(&handled_letters, 1);
    char seq[32];
    snprintf(seq, sizeof seq, "%lld", (long long)e->stream_seq);
    const char *v[2] = {e->stream_id, seq};
    return pawl_txn_exec(pawl_ctx_txn(ctx), "SELECT proj_apply($1, $2)", 2, v);
}

/* The log's head: each scenario's processor starts there, so it sees only its own events. */
static int64_t head(void)
{
    return q64("SELECT coalesce(max(global_index), 0) FROM pawl_api.events");
}

static int64_t start_at;

static struct pawl_processor *start_proc(const char *name, struct pawl_source *src,
                                         struct pawl_tokens *tok, uint32_t attempts)
{
    struct pawl_processor_opts o;
    pawl_processor_opts_defaults(&o);
    o.name = name;
    o.segments = 4;
    o.threads = 2;
    o.batch_size = 100;
    o.claim_poll_ms = 100;
    o.backoff_min_ms = 400;
    o.backoff_max_ms = 2000;
    o.dead_letter_attempts = attempts;
    o.initial_token = start_at;
    struct pawl_handler h = {"proj", NULL, apply, NULL};
    struct pawl_processor *p = NULL;
    assert_int_equal(pawl_processor_new(&p, &o, src, tok, &h, 1), 0);
    assert_int_equal(pawl_processor_start(p), 0);
    return p;
}

/* Wait until sql returns want; 1 when it did. */
static int wait_eq(const char *sql, int64_t want, double ms)
{
    double t0 = pawl_test_now_ms();
    int64_t got = -1;
    while (pawl_test_now_ms() - t0 < ms) {
        got = q64(sql);
        if (got == want)
            return 1;
        usleep(20000);
    }
    print_message("%s: %lld, want %lld\n", sql, (long long)got, (long long)want);
    return 0;
}

static void assert_no_violation(void)
{
    assert_int_equal(q64("SELECT count(*) FROM proj_violations"), 0);
    assert_int_equal(q64("SELECT count(*) FROM proj WHERE n <> last_seq"), 0);
}

/* Every event of streams LIKE pattern is applied once or parked once, never both: applied
 * 1..n in order (no violation), letters n+1..length with unique, contiguous sequences. */
static void assert_applied_or_parked(const char *proc, const char *pattern)
{
    char sql[1024];
    assert_no_violation();
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM (SELECT stream_id, max(stream_seq) AS len "
             "FROM pawl_api.events WHERE stream_id LIKE '%s' GROUP BY stream_id) e "
             "LEFT JOIN proj p ON p.stream = e.stream_id "
             "LEFT JOIN (SELECT stream_id, count(*) AS c, min(stream_seq) AS lo, "
             "max(stream_seq) AS hi FROM pawl.dead_letters WHERE processor = '%s' "
             "GROUP BY stream_id) d ON d.stream_id = e.stream_id "
             "WHERE coalesce(p.n, 0) + coalesce(d.c, 0) <> e.len "
             "OR (d.c IS NOT NULL AND (d.lo <> coalesce(p.n, 0) + 1 OR d.hi <> e.len))",
             pattern, proc);
    assert_int_equal(q64(sql), 0);
}

/* ---- poison among 1,000 streams, retryable errors, live events, retry, drop ---- */

static void test_poison_and_retry(void **state)
{
    (void)state;
    struct pawl_source *src;
    struct pawl_tokens *tok;
    assert_int_equal(pawl_source_pg_new(&src, dsn), 0);
    assert_int_equal(pawl_tokens_pg_new(&tok, dsn), 0);
    atomic_store(&fixed, 0);
    start_at = head();

    /* 1,000 streams x 6 events; stream 500 is poisoned at its 2nd event (seq 2), stream 700
     * fails retryably at its 4th. */
    append_load("a", 1000, 6, 500, 1, 700, 3);
    double t0 = pawl_test_now_ms();
    struct pawl_processor *p = start_proc("dl", src, tok, 2);
    /* Every other stream finishes: 998 x 6 events, plus stream 500's first and 700's three. */
    assert_true(wait_eq("SELECT coalesce(sum(n), 0) FROM proj WHERE stream LIKE 'a-%'",
                        998 * 6 + 1 + 3, 30000));
    double took = pawl_test_now_ms() - t0;
    print_message("999 streams finished in %.0f ms (one back-off is 400 ms)\n", took);
    /* No more than one back-off beyond the work itself: a poison event parks without one. */
    assert_true(took < 15000);

    /* The letters: stream 500 from seq 2 on (5 letters), stream 700 from seq 4 (3 letters). */
    assert_true(wait_eq("SELECT count(*) FROM pawl.dead_letters WHERE processor = 'dl'", 8, 5000));
    assert_int_equal(q64("SELECT count(*) FROM pawl.dead_letters WHERE stream_id = 'a-500' "
                         "AND stream_seq BETWEEN 2 AND 6"),
                     5);
    assert_int_equal(q64("SELECT count(*) FROM pawl.dead_letters WHERE stream_id = 'a-500' "
                         "AND behind IS NULL AND stream_seq = 2 AND attempts = 1 "
                         "AND last_error LIKE '%cannot parse%' AND type = 'poison'"),
                     1);
    assert_int_equal(q64("SELECT count(*) FROM pawl.dead_letters d WHERE stream_id = 'a-500' "
                         "AND behind = (SELECT global_index FROM pawl.dead_letters "
                         "WHERE stream_id = 'a-500' AND stream_seq = 2)"),
                     4);
    assert_int_equal(q64("SELECT count(*) FROM pawl.dead_letters WHERE stream_id = 'a-700' "
                         "AND behind IS NULL AND stream_seq = 4 AND attempts = 2 "
                         "AND last_error LIKE '%downstream unavailable%'"),
                     1);
    assert_int_equal(q64("SELECT count(*) FROM pawl.dead_letters WHERE stream_id = 'a-700'"), 3);
    /* The segment it was parked in contains the stream. */
    assert_int_equal(q64("SELECT count(*) FROM pawl.dead_letters "
                         "WHERE (stream_hash & segment_mask) <> segment_id"),
                     0);
    assert_applied_or_parked("dl", "a-%");

    /* Live events of a parked stream are parked behind it, in order. */
    append1("a-500", "T");
    append1("a-500", "T");
    append1("a-1", "T");
    assert_true(wait_eq("SELECT n FROM proj WHERE stream = 'a-1'", 7, 10000));
    assert_true(
        wait_eq("SELECT count(*) FROM pawl.dead_letters WHERE stream_id = 'a-500'", 7, 10000));
    assert_int_equal(q64("SELECT n FROM proj WHERE stream = 'a-500'"), 1);

    /* The C API lists and shows them. */
    struct pawl_dead_stream *ds = NULL;
    size_t nds = 0;
    assert_int_equal(pawl_dead_letters_streams(tok, "dl", &ds, &nds), 0);
    assert_int_equal(nds, 2);
    assert_string_equal(ds[0].stream_id, "a-500"); /* oldest first letter */
    assert_int_equal(ds[0].letters, 7);
    assert_non_null(strstr(ds[0].last_error, "cannot parse"));
    pawl_dead_letters_free(ds);
    struct pawl_dead_letter *dl = NULL;
    size_t ndl = 0;
    assert_int_equal(pawl_dead_letters_show(tok, "dl", "a-500", &dl, &ndl), 0);
    assert_int_equal(ndl, 7);
    for (size_t i = 0; i < ndl; i++) {
        assert_int_equal(dl[i].ev.stream_seq, (int64_t)i + 2);
        /* The first five came with the load ("x"), the two live ones from append1. */
        assert_int_equal(dl[i].ev.payload_len, i < 5 ? 1 : 7);
        assert_memory_equal(dl[i].ev.payload, i < 5 ? "x" : "{\"v\":1}", dl[i].ev.payload_len);
        /* The load's events have no id; append1's keep theirs in the letter. */
        if (i < 5)
            assert_null(dl[i].ev.id);
        else
            assert_true(dl[i].ev.id != NULL && strncmp(dl[i].ev.id, "one-", 4) == 0);
        if (i > 0)
            assert_true(dl[i].ev.index > dl[i - 1].ev.index);
    }
    pawl_dead_letters_free(dl);
    struct pawl_processor_stats st;
    pawl_processor_stats(p, &st);
    assert_int_equal(st.letters_parked, 10);
    assert_int_equal(st.streams_parked, 2);
    assert_int_equal(st.parked_streams, 2);

    /* A retry while still broken fails: the stream stays parked, the attempt is counted. */
    int64_t cnt = 0;
    assert_int_equal(pawl_dead_letters_retry(tok, "dl", "a-500", &cnt), 0);
    assert_int_equal(cnt, 7);
    assert_true(wait_eq("SELECT count(*) FROM pawl.dead_letters WHERE stream_id = 'a-500' "
                        "AND retry_requested_at IS NULL AND attempts = 2 AND behind IS NULL",
                        1, 10000));
    assert_int_equal(q64("SELECT count(*) FROM pawl.dead_letters WHERE stream_id = 'a-500'"), 7);

    /* Fixed: the retry hands the 7 letters over exactly once, in order; then live events. */
    atomic_store(&fixed, 1);
    assert_int_equal(pawl_dead_letters_retry(tok, "dl", "a-500", NULL), 0);
    assert_true(
        wait_eq("SELECT count(*) FROM pawl.dead_letters WHERE stream_id = 'a-500'", 0, 10000));
    assert_true(wait_eq("SELECT n FROM proj WHERE stream = 'a-500'", 8, 5000));
    assert_int_equal(atomic_load(&handled_letters), 7);
    append1("a-500", "T");
    assert_true(wait_eq("SELECT n FROM proj WHERE stream = 'a-500'", 9, 10000));
    assert_no_violation();

    /* Drop: a-700's letters are gone for good; its later events flow again. */
    int64_t dropped = 0;
    assert_int_equal(pawl_dead_letters_drop(tok, "dl", "a-700", INT64_MAX, &dropped), 0);
    assert_int_equal(dropped, 3);
    /* The holding node notices within claim_poll_ms (100 ms); until then a new event of the
     * stream would still be parked behind the dropped letters. */
    usleep(400000);
    append1("a-700", "T");
    /* proj_apply sees seq 7 after 3: one violation, the gap the drop made on purpose. */
    assert_true(wait_eq("SELECT n FROM proj WHERE stream = 'a-700'", 4, 10000));
    assert_int_equal(q64("SELECT count(*) FROM pawl.dead_letters WHERE processor = 'dl'"), 0);
    pawl_processor_stats(p, &st);
    assert_int_equal(st.letters_retried, 7);
    pawl_processor_free(p);
    pawl_test_exec(dsn, "DELETE FROM proj_violations WHERE stream = 'a-700'");
    pawl_test_exec(dsn, "UPDATE proj SET last_seq = n WHERE stream = 'a-700'");
    assert_no_violation();

    /* Bad input is refused with a clear code; a store without dead letters refuses a
     * processor with a dead-letter policy. */
    assert_int_equal(pawl_dead_letters_retry(tok, "dl", NULL, NULL), PAWL_EINVAL);
    assert_int_equal(pawl_dead_letters_drop(tok, "dl", "x", -1, NULL), PAWL_ERANGE);
    struct pawl_tokens *mem;
    assert_int_equal(pawl_tokens_mem_new(&mem), 0);
    struct pawl_processor_opts o;
    pawl_processor_opts_defaults(&o);
    o.name = "m";
    o.dead_letter_attempts = 3;
    struct pawl_handler h = {"proj", NULL, apply, NULL};
    assert_int_equal(pawl_processor_new(&p, &o, src, mem, &h, 1), PAWL_ENOTSUP);
    o.dead_letter_attempts = 1001;
    assert_int_equal(pawl_processor_new(&p, &o, src, mem, &h, 1), PAWL_ERANGE);
    assert_int_equal(pawl_dead_letters_retry(mem, "m", "x", NULL), PAWL_ENOTSUP);
    pawl_tokens_free(mem);
    pawl_tokens_free(tok);
    pawl_source_free(src);
}

/* ---- a reset re-handles what is not parked and parks nothing twice ---- */

static void test_replay(void **state)
{
    (void)state;
    struct pawl_source *src;
    struct pawl_tokens *tok;
    assert_int_equal(pawl_source_pg_new(&src, dsn), 0);
    assert_int_equal(pawl_tokens_pg_new(&tok, dsn), 0);
    atomic_store(&fixed, 0);
    start_at = head();
    append_load("r", 50, 4, 7, 2, -1, -1);
    struct pawl_processor *p = start_proc("rp", src, tok, 1);
    assert_true(
        wait_eq("SELECT coalesce(sum(n), 0) FROM proj WHERE stream LIKE 'r-%'", 49 * 4 + 2, 20000));
    assert_true(wait_eq("SELECT count(*) FROM pawl.dead_letters WHERE processor = 'rp'", 2, 5000));
    pawl_processor_free(p);
    int64_t parked_before = q64("SELECT sum(extract(epoch FROM parked_at))::int8 "
                                "FROM pawl.dead_letters WHERE processor = 'rp'");
    /* Replay from the scenario's start into an empty projection. */
    pawl_test_exec(dsn, "DELETE FROM proj WHERE stream LIKE 'r-%'");
    assert_int_equal(pawl_processor_reset(tok, src, "rp", PAWL_RESET_INDEX, start_at, NULL), 0);
    p = start_proc("rp", src, tok, 1);
    assert_true(
        wait_eq("SELECT coalesce(sum(n), 0) FROM proj WHERE stream LIKE 'r-%'", 49 * 4 + 2, 20000));
    assert_true(wait_eq("SELECT min(token) FROM pawl.tokens WHERE processor = 'rp'",
                        q64("SELECT max(global_index) FROM pawl_api.events"), 10000));
    pawl_processor_free(p);
    /* The parked stream's events before its first letter were handled again; its letters are
     * the same two rows, not parked a second time. */
    assert_int_equal(q64("SELECT n FROM proj WHERE stream = 'r-7'"), 2);
    assert_int_equal(q64("SELECT count(*) FROM pawl.dead_letters WHERE processor = 'rp'"), 2);
    assert_int_equal(q64("SELECT sum(extract(epoch FROM parked_at))::int8 "
                         "FROM pawl.dead_letters WHERE processor = 'rp'"),
                     parked_before);
    assert_applied_or_parked("rp", "r-%");
    pawl_tokens_free(tok);
    pawl_source_free(src);
}

/* ---- the processor's log lines show stream ids and handler messages escaped ---- */

/* The processor's lines, captured by a log sink (called from the workers). */
static pthread_mutex_t logged_mu = PTHREAD_MUTEX_INITIALIZER;
static char logged[32][1024];
static int nlogged;

static void capture(void *ud, enum pawl_log_level level, const char *module, const char *msg)
{
    (void)ud;
    (void)level;
    pthread_mutex_lock(&logged_mu);
    if (strcmp(module, "processor") == 0 && nlogged < (int)(sizeof logged / sizeof logged[0]))
        snprintf(logged[nlogged++], sizeof logged[0], "%s", msg);
    pthread_mutex_unlock(&logged_mu);
}

/* The first captured line containing part, or NULL. */
static const char *logged_line(const char *part)
{
    const char *found = NULL;
    pthread_mutex_lock(&logged_mu);
    for (int i = 0; i < nlogged && !found; i++)
        if (strstr(logged[i], part))
            found = logged[i];
    pthread_mutex_unlock(&logged_mu);
    return found;
}

static atomic_int evil_fixed;

/* Fails with a message that quotes the event's stream id until fixed. */
static int apply_evil(void *self, struct pawl_event_ctx *ctx)
{
    (void)self;
    const struct pawl_event *e = pawl_ctx_event(ctx);
    if (atomic_load(&evil_fixed))
        return 0;
    char why[512];
    snprintf(why, sizeof why, "cannot parse %s\033[1A\r", e->stream_id);
    return pawl_ctx_error(ctx, PAWL_EPOISON, why);
}

static void test_log_lines_escaped(void **state)
{
    (void)state;
    /* ESC, an OSC window title, CR and a CSI that erases the line: in a raw log line they
     * retitle the operator's terminal and overwrite the line with a forged one. */
    static const char evil[] = "e\033]0;pwned\007\r\033[2Kforged";
    static const char shown[] = "e\\x1b]0;pwned\\x07\\x0d\\x1b[2Kforged";
    struct pawl_source *src;
    struct pawl_tokens *tok;
    assert_int_equal(pawl_source_pg_new(&src, dsn), 0);
    assert_int_equal(pawl_tokens_pg_new(&tok, dsn), 0);
    atomic_store(&evil_fixed, 0);
    start_at = head();
    append1(evil, "T");
    nlogged = 0;
    pawl_log_set_sink(capture, NULL);
    pawl_log_set_level(PAWL_LOG_INFO);

    struct pawl_processor_opts o;
    pawl_processor_opts_defaults(&o);
    o.name = "esc";
    o.segments = 1;
    o.claim_poll_ms = 100;
    o.dead_letter_attempts = 1;
    o.initial_token = start_at;
    struct pawl_handler h = {"evil", NULL, apply_evil, NULL};
    struct pawl_processor *p = NULL;
    assert_int_equal(pawl_processor_new(&p, &o, src, tok, &h, 1), 0);
    assert_int_equal(pawl_processor_start(p), 0);
    assert_true(
        wait_eq("SELECT count(*) FROM pawl.dead_letters WHERE processor = 'esc'", 1, 10000));
    atomic_store(&evil_fixed, 1);
    assert_int_equal(pawl_dead_letters_retry(tok, "esc", evil, NULL), 0);
    assert_true(
        wait_eq("SELECT count(*) FROM pawl.dead_letters WHERE processor = 'esc'", 0, 10000));
    for (int i = 0; i < 100 && logged_line("retried") == NULL; i++)
        usleep(20000);
    pawl_processor_free(p);
    pawl_log_set_sink(NULL, NULL);
    pawl_log_set_level(getenv("PAWL_TEST_LOG") ? PAWL_LOG_DEBUG : PAWL_LOG_ERROR);

    /* The handler's failure, the parking and the retry, each naming the stream escaped. */
    const char *lines[3] = {logged_line("failed on event"), logged_line("parked at event"),
                            logged_line("retried")};
    for (int i = 0; i < 3; i++) {
        assert_non_null(lines[i]);
        assert_non_null(strstr(lines[i], shown));
    }
    assert_non_null(strstr(lines[0], "cannot parse e\\x1b]0;pwned"));
    assert_non_null(strstr(lines[0], "forged\\x1b[1A\\x0d"));
    /* No line of the processor carries a raw control byte. */
    for (int i = 0; i < nlogged; i++)
        for (const unsigned char *c = (const unsigned char *)logged[i]; *c; c++)
            if (*c < 0x20 || *c == 0x7f)
                fail_msg("raw control byte 0x%02x in the log line \"%s\"", *c, logged[i]);
    pawl_tokens_free(tok);
    pawl_source_free(src);
}

/* ---- processes sharing the segments, killed while parking and while retrying ---- */

static pid_t spawn(const char *proc, const char *node, const char *fixed_arg)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/proc_helper", PAWL_BINARY_DIR);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a test that failed or timed out */
        execl(path, path, dsn, proc, node, "1000", "20", "3", fixed_arg, (char *)NULL);
        _exit(127);
    }
    assert_true(pid > 0);
    return pid;
}

static void reap(pid_t pid, int sig)
{
    kill(pid, sig);
    int st;
    waitpid(pid, &st, 0);
}

static void test_kill_during_parking_and_retry(void **state)
{
    (void)state;
    const char *nodes[2] = {"ka", "kb"};
    struct pawl_tokens *tok;
    assert_int_equal(pawl_tokens_pg_new(&tok, dsn), 0);
    assert_int_equal(tok->ops->init(tok, "kp", 16, head()), 0);
    pawl_tokens_free(tok);
    pid_t pid[2] = {spawn("kp", nodes[0], "0"), spawn("kp", nodes[1], "0")};
    /* 200 streams x 30 rounds, 10 of them poisoned at different rounds; one process is killed
     * and restarted every 300 ms while the events are handled and parked. */
    int kills = 0;
    for (int r = 0; r < 30; r++) {
        char pre[16];
        snprintf(pre, sizeof pre, "k");
        struct pawl_event ev[100];
        char ids[100][32];
        int k = 0;
        for (int i = 0; i < 200; i++) {
            snprintf(ids[k], sizeof ids[k], "%s-%d", pre, i);
            int poison = i % 20 == 3 && r == (i % 7) + 5;
            ev[k] = (struct pawl_event){.stream_id = ids[k],
                                        .stream_seq = PAWL_SEQ_ANY,
                                        .type = poison ? "poison" : "T",
                                        .payload = "x",
                                        .payload_len = 1};
            if (++k == 100) {
                struct pawl_append_result res;
                assert_int_equal(pawl_append(store, ev, (size_t)k, &res), 0);
                k = 0;
            }
        }
        usleep(30000);
        if (r % 10 == 9) {
            int victim = kills++ % 2;
            reap(pid[victim], SIGKILL);
            pid[victim] = spawn("kp", nodes[victim], "0");
        }
    }
    /* Everything is applied or parked once the segments settle. */
    if (!wait_eq("SELECT count(DISTINCT stream_id) FROM pawl.dead_letters "
                 "WHERE processor = 'kp'",
                 10, 30000)) {
        PGconn *c = PQconnectdb(dsn);
        PGresult *r = PQexec(c, "SELECT stream_id, min(stream_seq), count(*), "
                                "string_agg(DISTINCT type, ','), min(global_index), "
                                "string_agg(coalesce(behind::text, 'own'), ',') "
                                "FROM pawl.dead_letters GROUP BY 1 ORDER BY 1");
        for (int i = 0; i < PQntuples(r); i++)
            print_message("%s from seq %s: %s letters, types %s, first %s, behind %s\n",
                          PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), PQgetvalue(r, i, 2),
                          PQgetvalue(r, i, 3), PQgetvalue(r, i, 4), PQgetvalue(r, i, 5));
        PQclear(r);
        PQfinish(c);
    }
    assert_true(wait_eq("SELECT count(DISTINCT stream_id) FROM pawl.dead_letters "
                        "WHERE processor = 'kp'",
                        10, 30000));
    const char *settled = "SELECT (SELECT coalesce(sum(n), 0) FROM proj WHERE stream LIKE 'k-%') "
                          "+ (SELECT count(*) FROM pawl.dead_letters WHERE processor = 'kp')";
    assert_true(wait_eq(settled, 200 * 30, 30000));
    assert_applied_or_parked("kp", "k-%");

    /* Retry every parked stream with fixed handlers, killing a process in the middle. */
    for (int i = 0; i < 2; i++) {
        reap(pid[i], SIGTERM);
        pid[i] = spawn("kp", nodes[i], "1");
    }
    pawl_test_exec(dsn, "SELECT pawl.dead_letters_retry('kp', s) FROM "
                        "(SELECT DISTINCT stream_id AS s FROM pawl.dead_letters "
                        "WHERE processor = 'kp') x");
    usleep(150000);
    reap(pid[0], SIGKILL);
    pid[0] = spawn("kp", nodes[0], "1");
    assert_true(wait_eq("SELECT count(*) FROM pawl.dead_letters WHERE processor = 'kp'", 0, 30000));
    assert_true(
        wait_eq("SELECT coalesce(sum(n), 0) FROM proj WHERE stream LIKE 'k-%'", 200 * 30, 20000));
    assert_applied_or_parked("kp", "k-%");
    print_message("killed %d processes while parking, 1 while retrying\n", kills);
    for (int i = 0; i < 2; i++)
        reap(pid[i], SIGTERM);
}

int main(void)
{
    pawl_test_dsn();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_poison_and_retry),
        cmocka_unit_test(test_replay),
        cmocka_unit_test(test_log_lines_escaped),
        cmocka_unit_test(test_kill_during_parking_and_retry),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
