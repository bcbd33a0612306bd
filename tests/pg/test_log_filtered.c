/*
 * test_log_filtered.c — filtered and stream reads (schema 16, issue 45), each checked against
 * pawl_api.events:
 *
 *   - exactness: a log written at once by library appenders (single and group appends, sync and
 *     async), outbox transactions (pawl_api.append and pawl_append_in after an earlier write,
 *     held open across finalization runs) and a long stretch of one category; pawl_read_filtered
 *     in small pages returns, for filters of categories, stream prefixes (with and without '-'),
 *     types and their mixes, exactly the rows of the same predicate on pawl_api.events, each
 *     once, in index order, with positions that never go back and end at the head;
 *   - a partition of the categories, read one category at a time, is the whole log, once;
 *   - an idle filter: the position follows the head with no event; pawl_follow_filtered times
 *     out with the position at the head, and wakes for a matching event;
 *   - stream reads in pages equal pawl_api.events of the stream, and stop at the finalized
 *     prefix (a store without finalizer, an outbox transaction held open);
 *   - bad input: pawl_filter_check, pawl_read_filtered, pawl_read_stream and the SQL face;
 *   - pawl_filter_json is canonical;
 *   - a processor's filter is part of its definition (PAWL_EFILTER for another one), and a
 *     filtered processor handles exactly the matching events, once, in stream order, while its
 *     tokens reach the head past events it does not select;
 *   - category runs (schema 18): an upgraded database's old rows stand alone, the native append
 *     writes sound runs (one index entry for an append of one stream), and reads on both server
 *     paths, also after a rotation, equal pawl_api.events.
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
static PGconn *db; /* the test's own connection, for the expected results */

/* Streams of six categories (acct, acctx, order, ship, solo, ac), besides bulk-N. */
static const char *const STREAMS[] = {"acct-1",  "acct-2",  "acct-10", "acctx-3",
                                      "acctx-4", "order-7", "order-8", "ship-1-a",
                                      "ship-2",  "solo",    "ac-9"};
#define NSTREAMS (sizeof STREAMS / sizeof STREAMS[0])
static const char *const TYPES[] = {"Opened", "Moved", "Closed"};

static int64_t q64(const char *sql)
{
    return pawl_test_query_i64(dsn, sql);
}

static int64_t head_now(void)
{
    return q64("SELECT pawl_api.last_index()");
}

static struct pawl_store *open_store(int group_max, int finalizer)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.connections = 2;
    o.append_group_max = group_max;
    o.finalizer = finalizer;
    o.finalize_batch_max = 3; /* several run rows per finalization call */
    struct pawl_store *s = NULL;
    char err[512];
    if (pawl_store_new(&s, dsn, &o, err, sizeof err) != 0)
        fail_msg("store: %s", err);
    return s;
}

/* Finalize until every committed append is final (another store's finalizer may be busy). */
static void finalize_all(struct pawl_store *s)
{
    for (int i = 0; i < 1000; i++) {
        int64_t a = 0;
        assert_int_equal(pawl_finalize_now(s, &a, NULL, NULL), 0);
        if (a == 0 && q64("SELECT count(*) FROM pawl.events e WHERE e.k = 0 AND NOT EXISTS "
                          "(SELECT 1 FROM pawl.runs r WHERE e.xid = ANY (r.xids))") == 0)
            return;
        usleep(10000);
    }
    fail_msg("appends stay unfinalized");
}

/* ---- expected and read rows ------------------------------------------------------------- */

struct row {
    int64_t idx, seq;
    char stream[64];
    char type[32];
};
struct rows {
    struct row *v;
    size_t n, cap;
};

static void rows_push(struct rows *r, int64_t idx, int64_t seq, const char *stream,
                      const char *type)
{
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 256;
        r->v = realloc(r->v, r->cap * sizeof *r->v);
        assert_non_null(r->v);
    }
    struct row *w = &r->v[r->n++];
    w->idx = idx;
    w->seq = seq;
    snprintf(w->stream, sizeof w->stream, "%s", stream);
    snprintf(w->type, sizeof w->type, "%s", type);
}

static void rows_free(struct rows *r)
{
    free(r->v);
    memset(r, 0, sizeof *r);
}

/* pawl_api.events WHERE where AND global_index > after, in index order (or stream order). */
static void fetch(struct rows *out, const char *where, int64_t after, const char *order)
{
    char sql[2048];
    snprintf(sql, sizeof sql,
             "SELECT global_index, stream_seq, stream_id, type FROM pawl_api.events "
             "WHERE (%s) AND global_index > %lld ORDER BY %s",
             where, (long long)after, order);
    PGresult *r = PQexec(db, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQresultErrorMessage(r));
    memset(out, 0, sizeof *out);
    for (int i = 0; i < PQntuples(r); i++)
        rows_push(out, strtoll(PQgetvalue(r, i, 0), NULL, 10),
                  strtoll(PQgetvalue(r, i, 1), NULL, 10), PQgetvalue(r, i, 2), PQgetvalue(r, i, 3));
    PQclear(r);
}

static void assert_rows_equal(const struct rows *got, const struct rows *want, const char *what)
{
    size_t n = got->n < want->n ? got->n : want->n;
    for (size_t i = 0; i < n; i++) {
        const struct row *g = &got->v[i], *w = &want->v[i];
        if (g->idx != w->idx || g->seq != w->seq || strcmp(g->stream, w->stream) != 0 ||
            strcmp(g->type, w->type) != 0)
            fail_msg("%s: row %zu: read %lld %s/%lld %s, pawl_api.events has %lld %s/%lld %s", what,
                     i, (long long)g->idx, g->stream, (long long)g->seq, g->type, (long long)w->idx,
                     w->stream, (long long)w->seq, w->type);
    }
    if (got->n != want->n)
        fail_msg("%s: read %zu events, pawl_api.events has %zu", what, got->n, want->n);
}

/*
 * Read f from after to head in pages of max: every event once, in index order, within
 * (after, position]; positions never go back, and the last one is head.
 */
static void read_filtered_all(struct pawl_store *s, const struct pawl_filter *f, size_t max,
                              int64_t after, int64_t head, struct rows *out, const char *what)
{
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    memset(out, 0, sizeof *out);
    int64_t at = after, last = after;
    int stalls = 0;
    while (at < head) {
        int64_t pos = -7;
        int rc = pawl_read_filtered(s, at, max, f, &b, &pos);
        if (rc != 0) {
            char e[512];
            fail_msg("%s: read after %lld: %s (%s)", what, (long long)at, pawl_strerror(rc),
                     pawl_store_errmsg(s, e, sizeof e));
        }
        if (pos < at || pos > head)
            fail_msg("%s: read after %lld returned position %lld (head %lld)", what, (long long)at,
                     (long long)pos, (long long)head);
        assert_true(b.count <= max);
        for (size_t i = 0; i < b.count; i++) {
            const struct pawl_event *e = &b.events[i];
            if (e->index <= last || e->index > pos)
                fail_msg("%s: read after %lld (position %lld) returned index %lld after %lld", what,
                         (long long)at, (long long)pos, (long long)e->index, (long long)last);
            last = e->index;
            rows_push(out, e->index, e->stream_seq, e->stream_id, e->type);
        }
        /* A read that found fewer than max looked as far as it could: to the head here, or
         * about 4 million indexes. One that found nothing moved its position. */
        if (pos == at && ++stalls > 3)
            fail_msg("%s: no progress after %lld", what, (long long)at);
        at = pos;
    }
    assert_int_equal(at, head);
    pawl_read_batch_fini(&b);
}

/* ---- writing the log ------------------------------------------------------------------------ */

struct writer {
    struct pawl_store *s;
    unsigned seed;
    int appends;
    int bulk_every; /* every n-th append is 50 events of bulk-N (0: none) */
    int async;
    int64_t events;
    atomic_int bad;
};

static void on_async(void *ud, const struct pawl_append_result *res)
{
    struct writer *w = ud;
    if (res->rc != 0)
        atomic_store(&w->bad, 1);
}

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    char ids[64][24];
    struct pawl_event ev[64];
    for (int i = 0; i < w->appends; i++) {
        int n;
        if (w->bulk_every && i % w->bulk_every == w->bulk_every - 1) {
            n = 50;
            for (int k = 0; k < n; k++) {
                snprintf(ids[k], sizeof ids[k], "bulk-%u", rand_r(&w->seed) % 8);
                ev[k] = (struct pawl_event){.stream_id = ids[k],
                                            .type = TYPES[rand_r(&w->seed) % 3],
                                            .payload = "b",
                                            .payload_len = 1};
            }
        } else {
            n = 1 + (int)(rand_r(&w->seed) % 3);
            for (int k = 0; k < n; k++)
                ev[k] = (struct pawl_event){.stream_id = STREAMS[rand_r(&w->seed) % NSTREAMS],
                                            .type = TYPES[rand_r(&w->seed) % 3],
                                            .payload = "e",
                                            .payload_len = 1};
        }
        if (w->async) {
            int rc;
            while ((rc = pawl_append_async(w->s, ev, (size_t)n, on_async, w)) == PAWL_EAGAIN)
                usleep(1000);
            if (rc != 0)
                atomic_store(&w->bad, 1);
        } else {
            struct pawl_append_result r;
            if (pawl_append(w->s, ev, (size_t)n, &r) != 0) {
                fprintf(stderr, "writer: %s\n", r.message);
                atomic_store(&w->bad, 1);
            }
        }
        w->events += n;
    }
    if (w->async)
        pawl_store_drain(w->s);
    return NULL;
}

struct outbox {
    unsigned seed;
    int txns;
    int64_t events;
    int retries;
    atomic_int bad;
};

/* A transaction that lost a race (a sequence number taken first, a deadlock with an append to
 * the same streams in another order, a serialization failure) is run again. */
static int retryable(const char *state)
{
    return strcmp(state, "23505") == 0 || strcmp(state, "40P01") == 0 ||
           strcmp(state, "40001") == 0;
}

/* Run sql; 1 on success. A failure's SQLSTATE goes to state (may be NULL). */
static int ok_cmd_st(PGconn *c, const char *sql, int n, const char *const *v, char state[6])
{
    PGresult *r = PQexecParams(c, sql, n, NULL, v, NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok && state) {
        const char *st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        snprintf(state, 6, "%s", st ? st : "");
    }
    if (!ok && (state == NULL || !retryable(state)))
        fprintf(stderr, "%s: %s", sql, PQresultErrorMessage(r));
    PQclear(r);
    return ok;
}

static int ok_cmd(PGconn *c, const char *sql, int n, const char *const *v)
{
    return ok_cmd_st(c, sql, n, v, NULL);
}

/*
 * Transactions that write first (their xid predates the appends), stay open across
 * finalization runs, and append through the SQL face and pawl_append_in to several streams;
 * one that lost a race is run again (retryable above).
 */
static void *outbox_main(void *arg)
{
    struct outbox *o = arg;
    PGconn *c = PQconnectdb(dsn);
    if (PQstatus(c) != CONNECTION_OK) {
        atomic_store(&o->bad, 1);
        PQfinish(c);
        return NULL;
    }
    for (int i = 0; i < o->txns; i++) {
        const char *v[2] = {STREAMS[rand_r(&o->seed) % NSTREAMS], TYPES[rand_r(&o->seed) % 3]};
        struct pawl_event ev[2] = {
            {.stream_id = STREAMS[rand_r(&o->seed) % NSTREAMS],
             .type = TYPES[rand_r(&o->seed) % 3],
             .payload = "p",
             .payload_len = 1},
            {.stream_id = STREAMS[rand_r(&o->seed) % NSTREAMS],
             .type = TYPES[rand_r(&o->seed) % 3],
             .payload = "q",
             .payload_len = 1},
        };
        for (int attempt = 0;; attempt++) {
            if (attempt == 50) {
                atomic_store(&o->bad, 1);
                break;
            }
            char st[6] = "";
            int64_t n = 0;
            int ok =
                ok_cmd(c, "BEGIN", 0, NULL) && ok_cmd(c, "INSERT INTO side VALUES (1)", 0, NULL);
            ok = ok && ok_cmd(c, "SELECT pg_sleep(0.004)", 0, NULL);
            ok = ok && ok_cmd_st(c, "SELECT pawl_api.append($1, $2, '\\x6f'::bytea)", 2, v, st);
            n++;
            if (ok && i % 2 == 0) {
                ok = ok_cmd(c, "SELECT pg_sleep(0.003)", 0, NULL);
                struct pawl_append_result r;
                if (ok && pawl_append_in(c, ev, 2, &r) != 0) {
                    ok = 0;
                    snprintf(st, sizeof st, "%s", r.sqlstate);
                    if (!retryable(st))
                        fprintf(stderr, "pawl_append_in: %s\n", r.message);
                }
                n += 2;
            }
            if (ok && ok_cmd_st(c, "COMMIT", 0, NULL, st)) {
                o->events += n;
                break;
            }
            ok_cmd(c, "ROLLBACK", 0, NULL);
            if (!retryable(st)) {
                atomic_store(&o->bad, 1);
                break;
            }
            o->retries++;
        }
    }
    PQfinish(c);
    return NULL;
}

/* Several appenders at once; returns the events they committed. */
static int64_t write_mixed(int appends, int bulk_every, int txns, unsigned seed)
{
    struct pawl_store *a = open_store(1, 1), *g = open_store(16, 1);
    struct writer w[5];
    struct outbox ob[2];
    pthread_t tw[5], to[2];
    for (int i = 0; i < 5; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].s = i < 2 ? a : g; /* two without grouping, three on the grouping store */
        w[i].seed = seed * 31u + (unsigned)i;
        w[i].appends = appends;
        w[i].bulk_every = bulk_every;
        w[i].async = i == 4;
        pthread_create(&tw[i], NULL, writer_main, &w[i]);
    }
    for (int i = 0; i < 2; i++) {
        memset(&ob[i], 0, sizeof ob[i]);
        ob[i].seed = seed * 77u + (unsigned)i;
        ob[i].txns = txns;
        pthread_create(&to[i], NULL, outbox_main, &ob[i]);
    }
    int64_t total = 0;
    for (int i = 0; i < 5; i++) {
        pthread_join(tw[i], NULL);
        assert_int_equal(atomic_load(&w[i].bad), 0);
        total += w[i].events;
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(to[i], NULL);
        assert_int_equal(atomic_load(&ob[i].bad), 0);
        total += ob[i].events;
    }
    finalize_all(a);
    pawl_store_free(g);
    pawl_store_free(a);
    return total;
}

/* A long stretch of bulk events only: sparse filters cross several windows of runs. */
static int64_t write_stretch(int appends)
{
    struct pawl_store *s = open_store(1, 1);
    char ids[100][24];
    struct pawl_event ev[100];
    for (int i = 0; i < appends; i++) {
        for (int k = 0; k < 100; k++) {
            snprintf(ids[k], sizeof ids[k], "bulk-%d", (i + k) % 8);
            ev[k] = (struct pawl_event){
                .stream_id = ids[k], .type = "Moved", .payload = "s", .payload_len = 1};
        }
        struct pawl_append_result r;
        if (pawl_append(s, ev, 100, &r) != 0)
            fail_msg("stretch: %s", r.message);
    }
    finalize_all(s);
    pawl_store_free(s);
    return (int64_t)appends * 100;
}

static int setup(void **state)
{
    (void)state;
    pawl_log_set_level(getenv("PAWL_TEST_LOG") ? PAWL_LOG_DEBUG : PAWL_LOG_ERROR);
    dsn = pawl_test_db_create("filtered");
    char err[512];
    if (pawl_schema_migrate(dsn, err, sizeof err) != 0)
        fail_msg("migrate: %s", err);
    pawl_test_exec(dsn, "CREATE TABLE side (v int)");
    db = PQconnectdb(dsn);
    if (PQstatus(db) != CONNECTION_OK)
        fail_msg("connect: %s", PQerrorMessage(db));
    /* The log: mixed, a stretch of one category, mixed again. */
    int64_t n = write_mixed(120, 8, 60, 1);
    n += write_stretch(100);
    n += write_mixed(30, 0, 15, 2);
    assert_int_equal(q64("SELECT count(*) FROM pawl_api.events"), n);
    assert_int_equal(head_now(), n);
    print_message("log: %lld events, %lld run rows\n", (long long)n,
                  (long long)q64("SELECT count(*) FROM pawl.runs"));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    PQfinish(db);
    return 0;
}

/* ---- 1. exactness --------------------------------------------------------------------------- */

#define ARR(...) ((const char *const[]){__VA_ARGS__})
#define NARR(...) (sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *))
#define CATS(...) .categories = ARR(__VA_ARGS__), .n_categories = NARR(__VA_ARGS__)
#define PREFIXES(...) .stream_prefixes = ARR(__VA_ARGS__), .n_stream_prefixes = NARR(__VA_ARGS__)
#define TYPES_(...) .types = ARR(__VA_ARGS__), .n_types = NARR(__VA_ARGS__)

struct fcase {
    const char *name;
    struct pawl_filter f;
    const char *pred; /* the same selection on pawl_api.events */
};

static const struct fcase CASES[] = {
    {"one category", {CATS("order")}, "split_part(stream_id, '-', 1) IN ('order')"},
    {"two categories", {CATS("ship", "acct")}, "split_part(stream_id, '-', 1) IN ('acct', 'ship')"},
    {"prefix with '-'", {PREFIXES("acct-1")}, "starts_with(stream_id, 'acct-1')"},
    {"prefix without '-'", {PREFIXES("acc")}, "starts_with(stream_id, 'acc')"},
    {"two prefixes",
     {PREFIXES("ac", "ship-1")},
     "starts_with(stream_id, 'ac') OR starts_with(stream_id, 'ship-1')"},
    {"types only", {TYPES_("Closed")}, "type IN ('Closed')"},
    {"category and types",
     {CATS("solo"), TYPES_("Opened", "Moved")},
     "split_part(stream_id, '-', 1) IN ('solo') AND type IN ('Opened', 'Moved')"},
    {"categories, prefix and a type",
     {CATS("order", "solo"), PREFIXES("acct-1"), TYPES_("Moved")},
     "(split_part(stream_id, '-', 1) IN ('order', 'solo') OR starts_with(stream_id, 'acct-1')) "
     "AND type = 'Moved'"},
};

static void test_exact(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1, 1);
    int64_t head = head_now();
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        const struct fcase *fc = &CASES[c];
        int64_t froms[2] = {0, head / 3};
        for (int k = 0; k < 2; k++) {
            char what[160];
            snprintf(what, sizeof what, "%s, after %lld", fc->name, (long long)froms[k]);
            struct rows want, got;
            fetch(&want, fc->pred, froms[k], "global_index");
            if (want.n == 0)
                fail_msg("%s: the log holds no matching event (the test's data is wrong)", what);
            double t0 = pawl_test_now_ms();
            read_filtered_all(s, &fc->f, 7, froms[k], head, &got, what);
            print_message("%s: %zu events, %.0f ms\n", what, got.n, pawl_test_now_ms() - t0);
            assert_rows_equal(&got, &want, what);
            rows_free(&want);
            rows_free(&got);
        }
    }
    /* The data has what the prefixes are about: "acc" selects both acct and acctx, not ac;
     * "acct-1" selects acct-10 too. */
    assert_true(q64("SELECT count(*) FROM pawl_api.events WHERE stream_id LIKE 'acctx-%'") > 0);
    assert_true(q64("SELECT count(*) FROM pawl_api.events WHERE stream_id = 'ac-9'") > 0);
    assert_true(q64("SELECT count(*) FROM pawl_api.events WHERE stream_id = 'acct-10'") > 0);
    /* The outbox transactions reached the log, some of them finalized after later xids. */
    assert_int_equal(q64("SELECT count(*) FROM pawl_api.events WHERE payload = '\\x6f'"), 150);
    pawl_store_free(s);
}

/* A larger page size: fewer, fuller reads, the same events. */
static void test_exact_large_pages(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1, 1);
    int64_t head = head_now();
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        struct rows want, got;
        fetch(&want, CASES[c].pred, 0, "global_index");
        read_filtered_all(s, &CASES[c].f, 1000, 0, head, &got, CASES[c].name);
        assert_rows_equal(&got, &want, CASES[c].name);
        rows_free(&want);
        rows_free(&got);
    }
    pawl_store_free(s);
}

/* ---- 2. partition ---------------------------------------------------------------------------- */

static void test_partition(void **state)
{
    (void)state;
    static const char *const cats[] = {"acct", "acctx", "order", "ship", "solo", "ac", "bulk"};
    size_t ncat = sizeof cats / sizeof cats[0];
    /* These are all the log's categories. */
    assert_int_equal(q64("SELECT count(DISTINCT split_part(stream_id, '-', 1)) FROM "
                         "pawl_api.events"),
                     (int64_t)ncat);
    struct pawl_store *s = open_store(1, 1);
    int64_t head = head_now();
    unsigned char *seen = calloc((size_t)head + 1, 1);
    assert_non_null(seen);
    int64_t total = 0;
    for (size_t c = 0; c < ncat; c++) {
        struct pawl_filter f = {.categories = &cats[c], .n_categories = 1};
        struct rows got, want;
        char pred[128];
        snprintf(pred, sizeof pred, "split_part(stream_id, '-', 1) = '%s'", cats[c]);
        read_filtered_all(s, &f, strcmp(cats[c], "bulk") == 0 ? 500 : 7, 0, head, &got, cats[c]);
        fetch(&want, pred, 0, "global_index");
        assert_rows_equal(&got, &want, cats[c]);
        for (size_t i = 0; i < got.n; i++) {
            assert_true(got.v[i].idx >= 1 && got.v[i].idx <= head);
            if (seen[got.v[i].idx]++)
                fail_msg("index %lld read under two categories", (long long)got.v[i].idx);
        }
        total += (int64_t)got.n;
        rows_free(&got);
        rows_free(&want);
    }
    assert_int_equal(total, head);
    for (int64_t i = 1; i <= head; i++)
        if (seen[i] != 1)
            fail_msg("index %lld read %d times", (long long)i, seen[i]);
    free(seen);
    pawl_store_free(s);
}

/* ---- 3. idle filters ----------------------------------------------------------------------- */

struct follow_arg {
    struct pawl_store *s;
    const struct pawl_filter *f;
    int64_t after;
    int timeout_ms;
    int rc;
    int64_t pos;
    size_t count;
    int64_t index;
    char stream[64];
};

static void *follow_main(void *arg)
{
    struct follow_arg *a = arg;
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    a->pos = -7;
    a->rc = pawl_follow_filtered(a->s, a->after, 7, a->f, &b, &a->pos, a->timeout_ms);
    a->count = b.count;
    if (b.count > 0) {
        a->index = b.events[0].index;
        snprintf(a->stream, sizeof a->stream, "%s", b.events[0].stream_id);
    }
    pawl_read_batch_fini(&b);
    return NULL;
}

static void append1(struct pawl_store *s, const char *stream, const char *type)
{
    struct pawl_event e = {.stream_id = stream, .type = type, .payload = "i", .payload_len = 1};
    struct pawl_append_result r;
    if (pawl_append(s, &e, 1, &r) != 0)
        fail_msg("append %s: %s", stream, r.message);
}

static void test_idle(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1, 1);
    /* The log's last event is not of category ac (used below). */
    append1(s, "order-8", "Opened");
    finalize_all(s);
    int64_t head = head_now();
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    const struct pawl_filter idle = {CATS("idle")};
    /* No event: the position moves to the head in one read, from the start and from anywhere. */
    int64_t pos = -7;
    assert_int_equal(pawl_read_filtered(s, 0, 7, &idle, &b, &pos), 0);
    assert_int_equal(b.count, 0);
    assert_int_equal(pos, head);
    assert_int_equal(pawl_read_filtered(s, head / 2, 7, &idle, &b, &pos), 0);
    assert_int_equal(b.count, 0);
    assert_int_equal(pos, head);
    assert_int_equal(pawl_read_filtered(s, head, 7, &idle, &b, &pos), 0);
    assert_int_equal(b.count, 0);
    assert_int_equal(pos, head);
    /* A category whose last event lies well before the head: its one event, then the head. */
    const struct pawl_filter ac = {CATS("ac")};
    int64_t last_ac = q64("SELECT max(global_index) FROM pawl_api.events WHERE stream_id = 'ac-9'");
    assert_true(last_ac < head);
    assert_int_equal(pawl_read_filtered(s, last_ac - 1, 7, &ac, &b, &pos), 0);
    assert_int_equal(b.count, 1);
    assert_int_equal(b.events[0].index, last_ac);
    assert_int_equal(pos, head);

    /* Follow: a time-out with the position at the head. */
    double t0 = pawl_test_now_ms();
    b.count = 99;
    pos = -7;
    assert_int_equal(pawl_follow_filtered(s, 0, 7, &idle, &b, &pos, 200), PAWL_ETIMEDOUT);
    assert_int_equal(b.count, 0);
    assert_int_equal(pos, head);
    assert_true(pawl_test_now_ms() - t0 >= 150);
    assert_int_equal(pawl_follow_filtered(s, head, 7, &idle, &b, &pos, 100), PAWL_ETIMEDOUT);
    assert_int_equal(pos, head);

    /* Other categories move on while a follower waits: its position follows them. */
    struct follow_arg fa = {.s = s, .f = &idle, .after = head, .timeout_ms = 3000};
    pthread_t t;
    pthread_create(&t, NULL, follow_main, &fa);
    usleep(200000);
    append1(s, "order-7", "Moved");
    append1(s, "solo", "Closed");
    pthread_join(t, NULL);
    finalize_all(s);
    int64_t head2 = head_now();
    assert_int_equal(head2, head + 2);
    assert_int_equal(fa.rc, PAWL_ETIMEDOUT);
    assert_int_equal(fa.count, 0);
    assert_int_equal(fa.pos, head2);

    /* A matching event wakes it. */
    struct follow_arg fb = {.s = s, .f = &idle, .after = head2, .timeout_ms = 10000};
    pthread_create(&t, NULL, follow_main, &fb);
    usleep(200000);
    append1(s, "solo", "Moved");
    append1(s, "idle-1", "Opened");
    pthread_join(t, NULL);
    assert_int_equal(fb.rc, 0);
    assert_int_equal(fb.count, 1);
    assert_string_equal(fb.stream, "idle-1");
    assert_int_equal(fb.index, head2 + 2);
    assert_int_equal(fb.pos, head2 + 2);
    pawl_read_batch_fini(&b);
    pawl_store_free(s);
}

/* ---- 4. stream reads ---------------------------------------------------------------------- */

/* Read stream in pages of max from after_seq: consecutive numbers, rising indexes. */
static void read_stream_all(struct pawl_store *s, const char *stream, int64_t after_seq, size_t max,
                            struct rows *out)
{
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    memset(out, 0, sizeof *out);
    int64_t seq = after_seq, last_idx = 0;
    for (int guard = 0;; guard++) {
        assert_true(guard < 100000);
        int rc = pawl_read_stream(s, stream, seq, max, &b);
        if (rc != 0) {
            char e[512];
            fail_msg("read_stream %s after %lld: %s (%s)", stream, (long long)seq,
                     pawl_strerror(rc), pawl_store_errmsg(s, e, sizeof e));
        }
        assert_true(b.count <= max);
        if (b.count == 0)
            break;
        for (size_t i = 0; i < b.count; i++) {
            const struct pawl_event *e = &b.events[i];
            assert_string_equal(e->stream_id, stream);
            assert_int_equal(e->stream_seq, seq + 1);
            assert_true(e->index > last_idx);
            seq = e->stream_seq;
            last_idx = e->index;
            rows_push(out, e->index, e->stream_seq, e->stream_id, e->type);
        }
    }
    pawl_read_batch_fini(&b);
}

static void check_stream(struct pawl_store *s, const char *stream, int64_t after_seq)
{
    char pred[160], what[160];
    snprintf(pred, sizeof pred, "stream_id = '%s' AND stream_seq > %lld", stream,
             (long long)after_seq);
    snprintf(what, sizeof what, "stream %s after %lld", stream, (long long)after_seq);
    struct rows want, got;
    fetch(&want, pred, 0, "stream_seq");
    read_stream_all(s, stream, after_seq, 3, &got);
    assert_rows_equal(&got, &want, what);
    rows_free(&want);
    rows_free(&got);
}

static void test_stream(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1, 1);
    for (size_t i = 0; i < NSTREAMS; i++) {
        /* Written by several appenders and by the outbox. */
        char sql[256];
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM pawl_api.events WHERE stream_id = '%s' AND payload = "
                 "'\\x6f'",
                 STREAMS[i]);
        assert_true(q64(sql) > 0);
        check_stream(s, STREAMS[i], 0);
        check_stream(s, STREAMS[i], 5);
    }
    check_stream(s, "bulk-3", 0);
    check_stream(s, "bulk-3", 1000);
    /* Only that stream: none of the ids it is a prefix of, none that differ in case. */
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    const char *none[] = {"acct", "acct-", "ACCT-1", "acct-1 ", "order", "nowhere-1"};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        assert_int_equal(pawl_read_stream(s, none[i], 0, 100, &b), 0);
        assert_int_equal(b.count, 0);
    }
    /* Past the stream's end: nothing. */
    int64_t n = q64("SELECT max(stream_seq) FROM pawl_api.events WHERE stream_id = 'solo'");
    assert_int_equal(pawl_read_stream(s, "solo", n, 100, &b), 0);
    assert_int_equal(b.count, 0);
    assert_int_equal(pawl_read_stream(s, "solo", n - 1, 100, &b), 0);
    assert_int_equal(b.count, 1);
    assert_int_equal(b.events[0].stream_seq, n);
    /* The SQL face agrees. */
    assert_int_equal(q64("SELECT count(*) FROM pawl_api.read_stream('solo', 0, 100000)"), n);
    pawl_read_batch_fini(&b);
    pawl_store_free(s);
}

/* Only the finalized prefix of a stream is read: appends of a store without finalizer and an
 * outbox transaction held open stay out until a run finalizes them. */
static void test_stream_tail(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1, 0); /* no store with a finalizer is open now */
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    for (int i = 0; i < 4; i++)
        append1(s, "tail-1", TYPES[i % 3]);
    finalize_all(s);
    int64_t head = head_now();
    for (int i = 0; i < 3; i++)
        append1(s, "tail-1", "Moved");
    /* An outbox transaction appends to it and stays open. */
    PGconn *c = PQconnectdb(dsn);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    assert_true(ok_cmd(c, "BEGIN", 0, NULL));
    struct pawl_event e = {
        .stream_id = "tail-1", .type = "Closed", .payload = "h", .payload_len = 1};
    int64_t held_seq = 0;
    assert_int_equal(pawl_append_in_seqs(c, &e, 1, &held_seq, NULL), 0);
    assert_int_equal(held_seq, 8);

    assert_int_equal(q64("SELECT count(*) FROM pawl.events WHERE stream_id = 'tail-1'"), 7);
    assert_int_equal(pawl_read_stream(s, "tail-1", 0, 3, &b), 0);
    assert_int_equal(b.count, 3);
    assert_int_equal(pawl_read_stream(s, "tail-1", 3, 3, &b), 0);
    assert_int_equal(b.count, 1);
    assert_int_equal(b.events[0].stream_seq, 4);
    assert_true(b.events[0].index <= head);
    assert_int_equal(pawl_read_stream(s, "tail-1", 4, 3, &b), 0);
    assert_int_equal(b.count, 0);
    assert_int_equal(q64("SELECT count(*) FROM pawl_api.read_stream('tail-1', 0, 1000)"), 4);
    /* A filtered read stops at the finalized head too. */
    const struct pawl_filter tail = {CATS("tail")};
    int64_t pos = -7;
    assert_int_equal(pawl_read_filtered(s, 0, 7, &tail, &b, &pos), 0);
    assert_int_equal(b.count, 4);
    assert_int_equal(pos, head);

    /* Finalized: the rest appears, the held transaction's event still not. */
    finalize_all(s);
    check_stream(s, "tail-1", 0);
    assert_int_equal(pawl_read_stream(s, "tail-1", 4, 3, &b), 0);
    assert_int_equal(b.count, 3);
    assert_int_equal(b.events[0].stream_seq, 5);
    assert_int_equal(b.events[2].stream_seq, 7);
    assert_int_equal(pawl_read_stream(s, "tail-1", 7, 3, &b), 0);
    assert_int_equal(b.count, 0);
    /* Committed but not finalized: still not read. Then finalized: read. */
    assert_true(ok_cmd(c, "COMMIT", 0, NULL));
    PQfinish(c);
    assert_int_equal(pawl_read_stream(s, "tail-1", 7, 3, &b), 0);
    assert_int_equal(b.count, 0);
    finalize_all(s);
    assert_int_equal(pawl_read_stream(s, "tail-1", 7, 3, &b), 0);
    assert_int_equal(b.count, 1);
    assert_int_equal(b.events[0].stream_seq, 8);
    assert_int_equal(b.events[0].index, head_now());
    check_stream(s, "tail-1", 0);
    pawl_read_batch_fini(&b);
    pawl_store_free(s);
}

/* ---- 5. bad input ---------------------------------------------------------------------------- */

static void sql_refused(const char *sql, const char *sqlstate)
{
    PGresult *r = PQexec(db, sql);
    const char *st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    if (PQresultStatus(r) != PGRES_FATAL_ERROR || st == NULL || strcmp(st, sqlstate) != 0)
        fail_msg("%s: expected SQLSTATE %s, got status %s, sqlstate %s", sql, sqlstate,
                 PQresStatus(PQresultStatus(r)), st ? st : "(none)");
    PQclear(r);
}

static void test_bad_input(void **state)
{
    (void)state;
    char err[300];
    static const char *one[1] = {"c"};
    static const char *null1[1] = {NULL};
    static const char *empty1[1] = {""};
    static const char *dash1[1] = {"a-b"};
    static const char *many[PAWL_FILTER_MAX + 1];
    for (int i = 0; i <= PAWL_FILTER_MAX; i++)
        many[i] = "c";
    char longs[PAWL_STREAM_ID_MAX + 2];
    memset(longs, 'x', sizeof longs - 1);
    longs[sizeof longs - 1] = '\0';
    const char *long1[1] = {longs};

    const struct pawl_filter bad[] = {
        {0},
        {.categories = null1, .n_categories = 1},
        {.categories = empty1, .n_categories = 1},
        {.categories = dash1, .n_categories = 1},
        {.categories = many, .n_categories = PAWL_FILTER_MAX + 1},
        {.stream_prefixes = empty1, .n_stream_prefixes = 1},
        {.stream_prefixes = null1, .n_stream_prefixes = 1},
        {.stream_prefixes = many, .n_stream_prefixes = PAWL_FILTER_MAX + 1},
        {.stream_prefixes = long1, .n_stream_prefixes = 1},
        {.types = empty1, .n_types = 1},
        {.types = null1, .n_types = 1},
        {.types = many, .n_types = PAWL_FILTER_MAX + 1},
        {.types = long1, .n_types = 1},
        {.categories = NULL, .n_categories = 1},
        {.categories = one, .n_categories = 1, .types = empty1, .n_types = 1},
    };
    size_t nbad = sizeof bad / sizeof bad[0];
    assert_int_equal(pawl_filter_check(NULL, err, sizeof err), PAWL_EINVAL);
    assert_true(err[0] != '\0');
    for (size_t i = 0; i < nbad; i++) {
        err[0] = '\0';
        if (pawl_filter_check(&bad[i], err, sizeof err) != PAWL_EINVAL)
            fail_msg("bad filter %zu accepted", i);
        assert_true(err[0] != '\0');
        assert_int_equal(pawl_filter_check(&bad[i], NULL, 0), PAWL_EINVAL);
    }
    /* The limits themselves are fine, and a '-' in a prefix. */
    longs[PAWL_STREAM_ID_MAX] = '\0';
    const struct pawl_filter good[] = {
        {.categories = many, .n_categories = PAWL_FILTER_MAX},
        {.stream_prefixes = long1, .n_stream_prefixes = 1},
        {.types = long1, .n_types = 1},
        {.stream_prefixes = dash1, .n_stream_prefixes = 1},
        {.categories = one, .n_categories = 1, .types = one, .n_types = 1},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        if (pawl_filter_check(&good[i], err, sizeof err) != 0)
            fail_msg("good filter %zu refused: %s", i, err);
    longs[PAWL_STREAM_ID_MAX] = 'x';

    struct pawl_store *s = open_store(1, 1);
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    int64_t pos;
    for (size_t i = 0; i < nbad; i++) {
        pos = -7;
        if (pawl_read_filtered(s, 3, 7, &bad[i], &b, &pos) != PAWL_EINVAL)
            fail_msg("pawl_read_filtered took bad filter %zu", i);
        assert_int_equal(b.count, 0);
        assert_int_equal(pos, 3);
        if (pawl_follow_filtered(s, 3, 7, &bad[i], &b, &pos, 100) != PAWL_EINVAL)
            fail_msg("pawl_follow_filtered took bad filter %zu", i);
    }
    assert_int_equal(pawl_read_filtered(s, 0, 7, NULL, &b, &pos), PAWL_EINVAL);
    const struct pawl_filter ok = {CATS("order")};
    assert_int_equal(pawl_read_filtered(s, 0, 0, &ok, &b, &pos), PAWL_ERANGE);
    assert_int_equal(pawl_read_filtered(s, 0, 100001, &ok, &b, &pos), PAWL_ERANGE);
    assert_int_equal(pawl_read_filtered(s, -1, 7, &ok, &b, &pos), PAWL_ERANGE);
    assert_int_equal(pawl_read_filtered(s, 0, 7, &ok, &b, NULL), PAWL_EINVAL);
    assert_int_equal(pawl_read_filtered(s, 0, 100000, &ok, &b, &pos), 0);

    /* The server takes what the checks here take: 1000 categories, the longest strings. */
    static const char *cats1000[PAWL_FILTER_MAX];
    static char names[PAWL_FILTER_MAX][16];
    for (int i = 0; i < PAWL_FILTER_MAX; i++) {
        snprintf(names[i], sizeof names[i], "z%d", i);
        cats1000[i] = names[i];
    }
    cats1000[PAWL_FILTER_MAX / 2] = "order";
    const struct pawl_filter wide = {.categories = cats1000, .n_categories = PAWL_FILTER_MAX};
    int64_t head = head_now();
    struct rows got, want;
    read_filtered_all(s, &wide, 500, 0, head, &got, "1000 categories");
    fetch(&want, "split_part(stream_id, '-', 1) = 'order'", 0, "global_index");
    assert_rows_equal(&got, &want, "1000 categories");
    rows_free(&got);
    rows_free(&want);
    longs[PAWL_STREAM_ID_MAX] = '\0';
    for (size_t i = 1; i < 3; i++) {
        assert_int_equal(pawl_read_filtered(s, 0, 7, &good[i], &b, &pos), 0);
        assert_int_equal(b.count, 0);
        assert_int_equal(pos, head);
    }

    /* Stream reads. */
    assert_int_equal(pawl_read_stream(s, NULL, 0, 3, &b), PAWL_EINVAL);
    assert_int_equal(pawl_read_stream(s, "", 0, 3, &b), PAWL_EINVAL);
    longs[PAWL_STREAM_ID_MAX] = 'x'; /* 256 bytes */
    assert_int_equal(pawl_read_stream(s, longs, 0, 3, &b), PAWL_EINVAL);
    longs[PAWL_STREAM_ID_MAX] = '\0'; /* 255: a valid id, no such stream */
    assert_int_equal(pawl_read_stream(s, longs, 0, 3, &b), 0);
    assert_int_equal(b.count, 0);
    assert_int_equal(pawl_read_stream(s, "solo", -1, 3, &b), PAWL_ERANGE);
    assert_int_equal(pawl_read_stream(s, "solo", 0, 0, &b), PAWL_ERANGE);
    assert_int_equal(pawl_read_stream(s, "solo", 0, 100001, &b), PAWL_ERANGE);
    pawl_read_batch_fini(&b);
    pawl_store_free(s);

    /* The SQL face: 22023 for every refusal. */
    static const char *const refused[] = {
        "SELECT * FROM pawl_api.read_filtered(0, 10, ARRAY[NULL]::text[])",
        "SELECT * FROM pawl_api.read_filtered(0, 10, ARRAY['order', NULL])",
        "SELECT * FROM pawl_api.read_filtered(0, 10, ARRAY[''])",
        "SELECT * FROM pawl_api.read_filtered(0, 10, NULL, ARRAY[NULL]::text[])",
        "SELECT * FROM pawl_api.read_filtered(0, 10, NULL, ARRAY[''])",
        "SELECT * FROM pawl_api.read_filtered(0, 10, NULL, NULL, ARRAY[NULL]::text[])",
        "SELECT * FROM pawl_api.read_filtered(0, 10, NULL, NULL, ARRAY[''])",
        "SELECT * FROM pawl_api.read_filtered(0, 10, ARRAY['a-b'])",
        "SELECT * FROM pawl_api.read_filtered(0, 10)",
        "SELECT * FROM pawl_api.read_filtered(0, 10, NULL, NULL, NULL)",
        "SELECT * FROM pawl_api.read_filtered(0, 10, ARRAY[['a'], ['b']])",
        "SELECT * FROM pawl_api.read_filtered(0, 10, array_fill('c'::text, ARRAY[1001]))",
        "SELECT * FROM pawl_api.read_filtered(-1, 10, ARRAY['order'])",
        "SELECT * FROM pawl_api.read_filtered(NULL, 10, ARRAY['order'])",
        "SELECT * FROM pawl_api.read_filtered(0, 0, ARRAY['order'])",
        "SELECT * FROM pawl_api.read_filtered(0, 100001, ARRAY['order'])",
        "SELECT * FROM pawl_api.read_stream(NULL, 0, 10)",
        "SELECT * FROM pawl_api.read_stream('', 0, 10)",
        "SELECT * FROM pawl_api.read_stream('solo', -1, 10)",
        "SELECT * FROM pawl_api.read_stream('solo', 0, 0)",
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        sql_refused(refused[i], "22023");
    /* And 1000 of them is fine. */
    assert_int_equal(q64("SELECT count(*) FROM pawl_api.read_filtered(0, 10, "
                         "ARRAY(SELECT 'c' || g FROM generate_series(1, 1000) g)) "
                         "WHERE stream_id IS NULL"),
                     1);
}

/* ---- 6. canonical JSON ------------------------------------------------------------------- */

static void test_filter_json(void **state)
{
    (void)state;
    char a[512], b[512];
    assert_int_equal(pawl_filter_json(NULL, a, sizeof a), 2);
    assert_string_equal(a, "{}");

    const struct pawl_filter f1 = {CATS("order", "acct"), TYPES_("Moved", "Closed")};
    const struct pawl_filter f2 = {CATS("acct", "order", "acct", "order"),
                                   TYPES_("Closed", "Moved", "Closed")};
    int n1 = pawl_filter_json(&f1, a, sizeof a);
    int n2 = pawl_filter_json(&f2, b, sizeof b);
    assert_true(n1 > 0);
    assert_int_equal(n1, (int)strlen(a));
    assert_int_equal(n1, n2);
    assert_string_equal(a, b);
    /* Empty lists are left out. */
    assert_null(strstr(a, "stream_prefixes"));
    /* Sorted, without duplicates: the server reads it as the expected object. */
    char sql[1024];
    snprintf(sql, sizeof sql,
             "SELECT ('%s'::jsonb = '{\"categories\": [\"acct\", \"order\"], "
             "\"types\": [\"Closed\", \"Moved\"]}'::jsonb)::int",
             a);
    assert_int_equal(q64(sql), 1);

    /* Byte order, every kind, and characters JSON must escape. */
    const struct pawl_filter f3 = {CATS("b", "B", "a"), PREFIXES("x-\"q\\", "x-"),
                                   TYPES_("T\n", "T")};
    const struct pawl_filter f4 = {CATS("a", "b", "B"), PREFIXES("x-", "x-\"q\\", "x-"),
                                   TYPES_("T", "T\n")};
    n1 = pawl_filter_json(&f3, a, sizeof a);
    n2 = pawl_filter_json(&f4, b, sizeof b);
    assert_true(n1 > 0);
    assert_int_equal(n1, n2);
    assert_string_equal(a, b);
    const char *v[1] = {a};
    PGresult *r = PQexecParams(
        db,
        "SELECT ($1::jsonb = jsonb_build_object('categories', jsonb_build_array('B', 'a', 'b'), "
        "'stream_prefixes', jsonb_build_array('x-', E'x-\"q\\\\'), 'types', "
        "jsonb_build_array('T', E'T\\n')))::int",
        1, NULL, v, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        fail_msg("%s: %s", a, PQresultErrorMessage(r));
    if (strcmp(PQgetvalue(r, 0, 0), "1") != 0)
        fail_msg("not the filter: %s", a);
    PQclear(r);

    /* Like snprintf: the length needed, whatever fits, NUL-terminated. */
    int need = pawl_filter_json(&f1, NULL, 0);
    char full[512], small[8];
    assert_int_equal(pawl_filter_json(&f1, full, sizeof full), need);
    assert_int_equal(need, (int)strlen(full));
    memset(small, '#', sizeof small);
    assert_int_equal(pawl_filter_json(&f1, small, sizeof small), need);
    assert_int_equal(small[sizeof small - 1], '\0');
    assert_memory_equal(small, full, sizeof small - 1);
    /* A filter pawl_filter_check refuses. */
    const struct pawl_filter badf = {CATS("a-b")};
    assert_int_equal(pawl_filter_json(&badf, a, sizeof a), PAWL_EINVAL);
    const struct pawl_filter emptyf = {0};
    assert_int_equal(pawl_filter_json(&emptyf, a, sizeof a), PAWL_EINVAL);
}

/* ---- 7. processors -------------------------------------------------------------------------- */

struct counter {
    pthread_mutex_t mu;
    unsigned char *seen;
    int64_t cap;
    int64_t handled, dup, beyond, order_bad;
    char streams[64][64];
    int64_t last_seq[64];
    int nstreams;
};

static int count_handle(void *self, struct pawl_event_ctx *ctx)
{
    struct counter *c = self;
    const struct pawl_event *e = pawl_ctx_event(ctx);
    pthread_mutex_lock(&c->mu);
    c->handled++;
    if (e->index < 1 || e->index >= c->cap)
        c->beyond++;
    else if (c->seen[e->index]++)
        c->dup++;
    int k = 0;
    while (k < c->nstreams && strcmp(c->streams[k], e->stream_id) != 0)
        k++;
    if (k == c->nstreams && k < 64) {
        snprintf(c->streams[k], sizeof c->streams[k], "%s", e->stream_id);
        c->last_seq[k] = 0;
        c->nstreams++;
    }
    if (k < 64) {
        if (e->stream_seq <= c->last_seq[k])
            c->order_bad++;
        c->last_seq[k] = e->stream_seq;
    }
    pthread_mutex_unlock(&c->mu);
    return 0;
}

static int64_t handled(struct counter *c)
{
    pthread_mutex_lock(&c->mu);
    int64_t n = c->handled;
    pthread_mutex_unlock(&c->mu);
    return n;
}

static void proc_opts(struct pawl_processor_opts *o, const char *name)
{
    pawl_processor_opts_defaults(o);
    o->name = name;
    o->node_id = "local";
    o->threads = 2;
    o->segments = 4;
    o->batch_size = 20;
    o->read_batch = 16;
    o->claim_timeout_ms = 2000;
    o->claim_poll_ms = 50;
    o->idle_wait_ms = 50;
}

static struct pawl_source *filtered_source(struct pawl_store *s, const struct pawl_filter *f)
{
    struct pawl_source *src = NULL;
    assert_int_equal(pawl_source_pg_from_store(&src, s, dsn), 0);
    if (f)
        assert_int_equal(pawl_source_pg_set_filter(src, f), 0);
    return src;
}

/* Whether every segment of proc has token head (waits up to ms). */
static int tokens_at(const char *proc, int64_t head, double ms)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FILTER (WHERE token <> %lld) + (count(*) = 0)::int "
             "FROM pawl.tokens WHERE processor = '%s'",
             (long long)head, proc);
    double t0 = pawl_test_now_ms();
    while (pawl_test_now_ms() - t0 < ms) {
        if (q64(sql) == 0)
            return 1;
        usleep(20000);
    }
    snprintf(sql, sizeof sql, "SELECT min(token) FROM pawl.tokens WHERE processor = '%s'", proc);
    print_message("%s: lowest token %lld, head %lld\n", proc, (long long)q64(sql), (long long)head);
    return 0;
}

static int wait_handled(struct counter *c, int64_t want, double ms)
{
    double t0 = pawl_test_now_ms();
    while (pawl_test_now_ms() - t0 < ms) {
        if (handled(c) >= want)
            return 1;
        usleep(20000);
    }
    print_message("handled %lld of %lld\n", (long long)handled(c), (long long)want);
    return 0;
}

/* Exactly want's indexes were handled, each once, in stream order. */
static void assert_handled_exactly(struct counter *c, const struct rows *want)
{
    pthread_mutex_lock(&c->mu);
    assert_int_equal(c->dup, 0);
    assert_int_equal(c->beyond, 0);
    assert_int_equal(c->order_bad, 0);
    assert_int_equal(c->handled, (int64_t)want->n);
    for (size_t i = 0; i < want->n; i++)
        if (c->seen[want->v[i].idx] != 1)
            fail_msg("event %lld (%s/%lld %s) handled %d times", (long long)want->v[i].idx,
                     want->v[i].stream, (long long)want->v[i].seq, want->v[i].type,
                     c->seen[want->v[i].idx]);
    pthread_mutex_unlock(&c->mu);
}

static void test_processor(void **state)
{
    (void)state;
    struct pawl_store *s = open_store(1, 1);
    struct pawl_tokens *tok = NULL;
    assert_int_equal(pawl_tokens_pg_new(&tok, dsn), 0);
    struct counter *c = calloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    c->cap = head_now() + 10000;
    c->seen = calloc((size_t)c->cap, 1);
    struct pawl_handler h = {"count", c, count_handle, NULL};

    const struct pawl_filter f = {CATS("order"), TYPES_("Closed", "Opened")};
    const struct pawl_filter f_same = {CATS("order", "order"),
                                       TYPES_("Opened", "Closed", "Opened")};
    const struct pawl_filter f_other = {CATS("order"), TYPES_("Closed")};
    const char *pred = "split_part(stream_id, '-', 1) = 'order' AND type IN ('Closed', 'Opened')";

    /* The filter is recorded with the definition. */
    struct pawl_processor_opts o;
    proc_opts(&o, "pf");
    struct pawl_source *src = filtered_source(s, &f);
    struct pawl_processor *p = NULL;
    assert_int_equal(pawl_processor_new(&p, &o, src, tok, &h, 1), 0);
    assert_int_equal(q64("SELECT (filter = '{\"categories\": [\"order\"], \"types\": [\"Closed\", "
                         "\"Opened\"]}'::jsonb)::int FROM pawl.processor_filters "
                         "WHERE processor = 'pf'"),
                     1);
    /* Another filter, or none, is refused; the same one listed otherwise is not. */
    struct pawl_source *s_other = filtered_source(s, &f_other);
    struct pawl_source *s_none = filtered_source(s, NULL);
    struct pawl_source *s_same = filtered_source(s, &f_same);
    struct pawl_processor *p2 = NULL;
    assert_int_equal(pawl_processor_new(&p2, &o, s_other, tok, &h, 1), PAWL_EFILTER);
    assert_null(p2);
    char e[512];
    assert_non_null(strstr(pawl_tokens_errmsg(tok, e, sizeof e), "created with filter"));
    assert_int_equal(pawl_processor_new(&p2, &o, s_none, tok, &h, 1), PAWL_EFILTER);
    assert_null(p2);
    assert_int_equal(pawl_processor_new(&p2, &o, s_same, tok, &h, 1), 0);
    pawl_processor_free(p2);
    p2 = NULL;
    /* An unfiltered processor records none, and a filter is refused for it afterwards. */
    struct pawl_processor_opts ou;
    proc_opts(&ou, "pu");
    assert_int_equal(pawl_processor_new(&p2, &ou, s_none, tok, &h, 1), 0);
    pawl_processor_free(p2);
    p2 = NULL;
    assert_int_equal(q64("SELECT (filter = '{}'::jsonb)::int FROM pawl.processor_filters "
                         "WHERE processor = 'pu'"),
                     1);
    assert_int_equal(pawl_processor_new(&p2, &ou, src, tok, &h, 1), PAWL_EFILTER);
    assert_null(p2);
    /* The recorded filter did not change. */
    assert_int_equal(q64("SELECT (filter = '{\"categories\": [\"order\"], \"types\": [\"Closed\", "
                         "\"Opened\"]}'::jsonb)::int FROM pawl.processor_filters "
                         "WHERE processor = 'pf'"),
                     1);
    /* Bad filters and other sources. */
    const struct pawl_filter dash = {CATS("order-7")};
    assert_int_equal(pawl_source_pg_set_filter(s_other, &dash), PAWL_EINVAL);
    assert_int_equal(pawl_source_pg_set_filter(s_other, NULL), PAWL_EINVAL);
    struct pawl_source *mem = NULL;
    assert_int_equal(pawl_source_mem_new(&mem), 0);
    assert_int_equal(pawl_source_pg_set_filter(mem, &f), PAWL_ENOTSUP);
    pawl_source_free(mem);

    /* Handles exactly the matching events, once, in stream order. */
    struct rows want;
    fetch(&want, pred, 0, "global_index");
    assert_true(want.n > 10);
    int64_t head = head_now();
    /* The log's last events do not match. */
    assert_int_equal(q64("SELECT count(*) FROM pawl_api.events WHERE global_index > "
                         "(SELECT max(global_index) FROM pawl_api.events WHERE "
                         "split_part(stream_id, '-', 1) = 'order' AND type IN ('Closed', "
                         "'Opened'))") > 0,
                     1);
    assert_int_equal(pawl_processor_start(p), 0);
    assert_true(wait_handled(c, (int64_t)want.n, 60000));
    assert_true(tokens_at("pf", head, 30000));
    usleep(200000);
    assert_handled_exactly(c, &want);

    /* Events it does not select move its tokens to the new head, handling nothing. */
    for (int i = 0; i < 20; i++)
        append1(s, i % 2 ? "order-8" : "acct-2", "Moved");
    finalize_all(s);
    int64_t head2 = head_now();
    assert_int_equal(head2, head + 20);
    assert_true(tokens_at("pf", head2, 30000));
    assert_int_equal(handled(c), (int64_t)want.n);
    pawl_processor_free(p);
    p = NULL;

    /* A restart (the same filter, listed otherwise) rescans nothing and handles what comes. */
    assert_int_equal(pawl_processor_new(&p, &o, s_same, tok, &h, 1), 0);
    assert_int_equal(pawl_processor_start(p), 0);
    usleep(500000);
    assert_int_equal(handled(c), (int64_t)want.n);
    append1(s, "order-8", "Closed");
    append1(s, "solo", "Closed");
    append1(s, "order-7", "Opened");
    append1(s, "order-7", "Moved");
    finalize_all(s);
    int64_t head3 = head_now();
    rows_free(&want);
    fetch(&want, pred, 0, "global_index");
    assert_true(wait_handled(c, (int64_t)want.n, 30000));
    assert_true(tokens_at("pf", head3, 30000));
    usleep(200000);
    assert_handled_exactly(c, &want);
    struct pawl_processor_stats st;
    pawl_processor_stats(p, &st);
    assert_int_equal(st.source_errors, 0);
    pawl_processor_free(p);

    rows_free(&want);
    pawl_source_free(s_other);
    pawl_source_free(s_none);
    pawl_source_free(s_same);
    pawl_source_free(src);
    pawl_tokens_free(tok);
    free(c->seen);
    pthread_mutex_destroy(&c->mu);
    free(c);
    pawl_store_free(s);
}

/* ---- 5. category runs (schema 18) ----------------------------------------------------------- */

/* Every follower (cat_run 0) lies in exactly the run of one head of its transaction, of its
 * category; every head's run is whole (its m - 1 rows after it, followers of its category). */
static void assert_runs_sound(const char *d, const char *what)
{
    int64_t orphans = pawl_test_query_i64(
        d, "SELECT count(*) FROM pawl.events f WHERE f.cat_run = 0 AND (SELECT count(*) "
           "FROM pawl.events h WHERE h.xid = f.xid AND h.cat_run >= 1 AND f.k > h.k "
           "AND f.k < h.k + h.cat_run AND pawl.category(h.stream_id) = "
           "pawl.category(f.stream_id)) <> 1");
    int64_t broken = pawl_test_query_i64(
        d, "SELECT count(*) FROM pawl.events h WHERE h.cat_run > 1 AND (SELECT count(*) "
           "FROM pawl.events f WHERE f.xid = h.xid AND f.k > h.k AND f.k < h.k + h.cat_run "
           "AND f.cat_run = 0 AND pawl.category(f.stream_id) = pawl.category(h.stream_id)) "
           "<> h.cat_run - 1");
    if (orphans != 0 || broken != 0)
        fail_msg("%s: %lld followers outside one run of their category, %lld broken runs", what,
                 (long long)orphans, (long long)broken);
}

static const struct fcase RUN_CASES[] = {
    {"runs: one category", {CATS("run")}, "split_part(stream_id, '-', 1) IN ('run')"},
    {"runs: two categories",
     {CATS("run", "mix")},
     "split_part(stream_id, '-', 1) IN ('run', 'mix')"},
    {"runs: prefix with '-'", {PREFIXES("run-1")}, "starts_with(stream_id, 'run-1')"},
    {"runs: prefix without '-'", {PREFIXES("r")}, "starts_with(stream_id, 'r')"},
    {"runs: category and type",
     {CATS("run"), TYPES_("Moved")},
     "split_part(stream_id, '-', 1) IN ('run') AND type IN ('Moved')"},
    {"runs: old rows", {CATS("old")}, "split_part(stream_id, '-', 1) IN ('old')"},
};

/* Each of RUN_CASES read in pages of 7 and of 1000 through s equals pawl_api.events. */
static void runs_read_all(struct pawl_store *s, const char *path)
{
    int64_t head = head_now();
    for (size_t c = 0; c < sizeof RUN_CASES / sizeof RUN_CASES[0]; c++)
        for (int big = 0; big < 2; big++) {
            char what[160];
            snprintf(what, sizeof what, "%s path, %s, pages of %d", path, RUN_CASES[c].name,
                     big ? 1000 : 7);
            struct rows want, got;
            fetch(&want, RUN_CASES[c].pred, 0, "global_index");
            if (want.n == 0)
                fail_msg("%s: the log holds no matching event (the test's data is wrong)", what);
            read_filtered_all(s, &RUN_CASES[c].f, big ? 1000 : 7, 0, head, &got, what);
            assert_rows_equal(&got, &want, what);
            rows_free(&want);
            rows_free(&got);
        }
}

/*
 * The category index of schema 18 holds a row per run of one category in an append: a database
 * written at schema 17 is upgraded (its rows stand alone), then appends of every shape (one
 * stream, categories interleaved, groups of appends in one transaction, an outbox transaction
 * that appends twice) write runs on the native path; the runs are sound, a 40-event append of
 * one stream is one index entry there, and every filtered read, on the native path and on the
 * SQL one, returns exactly the rows of pawl_api.events, also after a rotation.
 */
static void test_category_runs(void **state)
{
    (void)state;
    char d[1024], err[512];
    pawl_test_db_make(pawl_test_dsn(), "t_log_filtered_runs", NULL, d, sizeof d);
    assert_int_equal(pawl__schema_migrate_to(d, 17, err, sizeof err), 0);
    pawl_test_exec(d, "SELECT count(*) FROM pawl_api.append_batch(ARRAY['old-1', 'old-1', "
                      "'run-old', 'old-2'], ARRAY['Opened', 'Moved', 'Moved', 'Closed'], "
                      "ARRAY['\\x01', '\\x02', '\\x03', '\\x04']::bytea[])");
    if (pawl_schema_migrate(d, err, sizeof err) != 0)
        fail_msg("migrate to 18: %s", err);
    assert_int_equal(pawl_test_query_i64(d, "SELECT max(version) FROM pawl.schema_version"), 18);
    assert_int_equal(pawl_test_query_i64(d, "SELECT count(*) FROM pawl.events WHERE cat_run IS "
                                            "NULL"),
                     4);
    int native = (int)pawl_test_query_i64(
        d, "SELECT (l.lanname = 'c')::int FROM pg_proc p JOIN pg_language l ON l.oid = "
           "p.prolang WHERE p.oid = 'pawl.append(text[], int8[], int4[], int4[], text[], "
           "bytea[], jsonb[], boolean, text[])'::regprocedure");
    print_message("server path after the upgrade: %s\n", native ? "native" : "SQL");

    /* The file's helpers read this database. */
    const char *dsn0 = dsn;
    PGconn *db0 = db;
    dsn = d;
    db = PQconnectdb(d);
    assert_int_equal(PQstatus(db), CONNECTION_OK);

    struct pawl_store *s = open_store(1, 1);
    struct pawl_event ev[40];
    char sid[40][32];
    struct pawl_append_result r;
    for (int a = 0; a < 20; a++) { /* one stream: one run of 40 */
        for (int k = 0; k < 40; k++) {
            snprintf(sid[k], sizeof sid[k], "run-%d", a);
            ev[k] = (struct pawl_event){
                .stream_id = sid[k], .type = TYPES[k % 3], .payload = "r", .payload_len = 1};
        }
        if (pawl_append(s, ev, 40, &r) != 0)
            fail_msg("run append: %s", r.message);
    }
    static const char *const mixed[] = {"run-m1", "run-m2", "mix-1",  "mix-2",  "run-m1",
                                        "mix",    "mix-3",  "run-m3", "run-m3", "mix-1"};
    for (int a = 0; a < 10; a++) { /* categories interleaved: heads at each change */
        for (int k = 0; k < 10; k++)
            ev[k] = (struct pawl_event){.stream_id = mixed[(k + a) % 10],
                                        .type = TYPES[k % 3],
                                        .payload = "m",
                                        .payload_len = 1};
        if (pawl_append(s, ev, 10, &r) != 0)
            fail_msg("mixed append: %s", r.message);
    }
    pawl_store_free(s);
    struct writer gw = {.s = open_store(8, 0), .seed = 7, .appends = 200, .async = 1};
    writer_main(&gw); /* groups of appends, one transaction each */
    assert_int_equal(atomic_load(&gw.bad), 0);
    pawl_store_free(gw.s);
    PGconn *ob = PQconnectdb(d); /* an outbox transaction that appends twice */
    assert_int_equal(PQstatus(ob), CONNECTION_OK);
    PQclear(PQexec(ob, "BEGIN"));
    for (int t = 0; t < 2; t++) {
        for (int k = 0; k < 3; k++)
            ev[k] = (struct pawl_event){
                .stream_id = "run-ob", .type = "Moved", .payload = "o", .payload_len = 1};
        if (pawl_append_in(ob, ev, 3, &r) != 0)
            fail_msg("outbox append: %s", r.message);
    }
    PGresult *cr = PQexec(ob, "COMMIT");
    assert_int_equal(PQresultStatus(cr), PGRES_COMMAND_OK);
    PQclear(cr);
    PQfinish(ob);
    s = open_store(1, 1);
    finalize_all(s);

    assert_runs_sound(d, "after the appends");
    int64_t rows = q64("SELECT count(*) FROM pawl.events");
    int64_t entries = q64("SELECT count(*) FROM pawl.events WHERE cat_run IS DISTINCT FROM 0");
    print_message("%lld rows, %lld category index entries\n", (long long)rows, (long long)entries);
    if (native) {
        /* Each 40-event append of one stream is one entry; the interleaved appends have a head
         * at their first row and at each change of category (64 of their 100 rows). */
        assert_int_equal(q64("SELECT count(*) FROM pawl.events WHERE stream_id ~ '^run-[0-9]+$' "
                             "AND cat_run IS DISTINCT FROM 0"),
                         20);
        assert_int_equal(q64("SELECT count(*) FROM pawl.events WHERE stream_id ~ '^run-[0-9]+$' "
                             "AND cat_run = 40"),
                         20);
        assert_int_equal(q64("SELECT count(*) FROM pawl.events e WHERE e.n = 10 AND e.stream_id "
                             "IN ('run-m1', 'run-m2', 'run-m3', 'mix', 'mix-1', 'mix-2', "
                             "'mix-3') AND e.cat_run IS DISTINCT FROM 0"),
                         64);
        assert_true(entries * 2 < rows);
    } else {
        print_message("not native: every row stands alone (no runs written)\n");
        assert_int_equal(entries, rows);
    }
    runs_read_all(s, native ? "native" : "SQL");
    if (native) {
        int active = 0;
        assert_int_equal(pawl_schema_server_path(d, PAWL_SERVER_SQL, &active, err, sizeof err), 0);
        assert_int_equal(active, PAWL_SERVER_SQL);
        runs_read_all(s, "SQL (native runs)");
        assert_int_equal(pawl_schema_server_path(d, PAWL_SERVER_NATIVE, &active, err, sizeof err),
                         0);
    }
    /* A rotation: the runs stay in their partition, new ones go to the next. */
    pawl_test_exec(d, "SELECT pawl.rotate()");
    for (int k = 0; k < 40; k++) {
        snprintf(sid[k], sizeof sid[k], "run-1%d", k % 2);
        ev[k] = (struct pawl_event){
            .stream_id = sid[k], .type = "Moved", .payload = "t", .payload_len = 1};
    }
    if (pawl_append(s, ev, 40, &r) != 0)
        fail_msg("append after the rotation: %s", r.message);
    finalize_all(s);
    assert_true(q64("SELECT count(*) FROM pawl.event_parts") >= 2);
    assert_runs_sound(d, "after the rotation");
    runs_read_all(s, native ? "native, rotated" : "SQL, rotated");
    pawl_store_free(s);

    PQfinish(db);
    db = db0;
    dsn = dsn0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact),       cmocka_unit_test(test_exact_large_pages),
        cmocka_unit_test(test_partition),   cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_filter_json), cmocka_unit_test(test_stream),
        cmocka_unit_test(test_idle),        cmocka_unit_test(test_stream_tail),
        cmocka_unit_test(test_processor),   cmocka_unit_test(test_category_runs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
