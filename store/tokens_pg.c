/*
 * tokens_pg.c — the PostgreSQL token store (table pawl.tokens, sql/002_tokens.sql).
 *
 * Every read and write goes through pawl's token functions (sql/007_token_isolation.sql:
 * tokens_list, tokens_claim, tokens_extend, nodes_live, nodes_leave, tokens_release,
 * store_token, tokens_init/split/merge/reset), never through the tables: they run with the
 * owner's rights after checking that the session's login is granted the processor, so a role
 * that runs one processor can neither read nor move another's rows (42501 -> PAWL_EPERM).
 *
 * Every operation is one request on a small pipelined connection pool (store/pgconn.h): the
 * statements of a request are sent back to back and end with a Sync, which makes them one
 * implicit transaction. Callers block on pawl__pgpool_exec while the pool's I/O thread drives
 * the connections, so the batch commits of many work packages share a few connections in
 * pipeline mode instead of holding one each.
 *
 * A batch transaction buffers the handlers' statements (copies) and sends them at commit,
 * behind `SELECT pawl.store_token(...)`: that call checks the claim, takes the row lock and
 * writes the token (never backwards). If the claim was lost it raises PW001, the rest of the
 * request is skipped and the whole transaction rolls back: PAWL_ECLAIM. A lost connection
 * during the commit reports PAWL_EINDOUBT; since token and handler writes commit atomically,
 * the processor's answer (abort, re-claim, redeliver from the stored token) is right either way.
 *
 * Threads: every entry point may be called from any thread at once. The text of the last
 * failure is kept on the object under a mutex; errmsg returns a copy in thread-local storage.
 */
#include "common.h"
#include "pgconn.h"
#include "schema.h"

#include "pawl/processor.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The schema version that brought the token functions this store calls (007_token_isolation). */
#define TOKENS_SCHEMA_MIN 7

/* Batch statements kept prepared (the pool allows 128 in all); others go as text. */
#define PREP_MAX 96

struct tokens_pg {
    struct pawl_tokens base;
    struct pawl_pgpool *pool;   /* claims, extensions, listing, administration */
    struct pawl_pgpool *txpool; /* batch transactions */
    pthread_mutex_t mu;
    char err[512];
    /* Statements of batch transactions prepared on txpool, by text (handlers reuse a few). */
    pthread_mutex_t pmu;
    struct {
        char *sql;
        int nparams;
        int id;
    } prep[PREP_MAX];
    int nprep;
    int store_id;             /* pawl.store_token, prepared */
    struct txn_pg *free_txns; /* under pmu */
    int nfree;
};

static struct tokens_pg *from(struct pawl_tokens *t)
{
    return (struct tokens_pg *)t;
}

static void set_err(struct tokens_pg *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_err(struct tokens_pg *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&t->mu);
    vsnprintf(t->err, sizeof t->err, fmt, ap);
    pthread_mutex_unlock(&t->mu);
    va_end(ap);
}

/* The prepared id of sql on the batch pool, preparing it on first use; -1: send as text. */
static int prepared_id(struct tokens_pg *t, const char *sql, int nparams)
{
    int id = -1;
    pthread_mutex_lock(&t->pmu);
    for (int i = 0; i < t->nprep; i++) {
        if (t->prep[i].nparams == nparams && strcmp(t->prep[i].sql, sql) == 0) {
            id = t->prep[i].id;
            break;
        }
    }
    if (id < 0 && t->nprep < PREP_MAX) {
        char *copy = pawl__strdup(sql);
        int pid = copy ? pawl__pgpool_prepare(t->txpool, sql, nparams, NULL) : PAWL_ENOMEM;
        if (pid >= 0) {
            t->prep[t->nprep].sql = copy;
            t->prep[t->nprep].nparams = nparams;
            t->prep[t->nprep].id = pid;
            t->nprep++;
            id = pid;
        } else {
            pawl_free(copy);
        }
    }
    pthread_mutex_unlock(&t->pmu);
    return id;
}

static const char *pg_errmsg(struct pawl_tokens *tk)
{
    static _Thread_local char copy[512];
    struct tokens_pg *t = from(tk);
    pthread_mutex_lock(&t->mu);
    memcpy(copy, t->err, sizeof copy);
    pthread_mutex_unlock(&t->mu);
    return copy;
}

/* Run a request synchronously on pool and map the server's pawl error codes. */
static int run_on(struct tokens_pg *t, struct pawl_pgpool *pool, struct pawl_pgstmt *stmts, int n)
{
    /* Blocks until the pool's I/O thread completes it: never on an I/O thread (a callback). */
    PAWL_ASSERT(!pawl__pgpool_on_io_thread(NULL));
    struct pawl_pgreq req;
    memset(&req, 0, sizeof req);
    req.stmts = stmts;
    req.nstmts = n;
    int rc = pawl__pgpool_exec(pool, -1, &req);
    if (rc == 0)
        return 0;
    if (rc == PAWL_ESQL) {
        set_err(t, "%s: %s", req.sqlstate, req.message);
        if (strcmp(req.sqlstate, "PW001") == 0)
            return PAWL_ECLAIM;
        if (strcmp(req.sqlstate, "PW002") == 0)
            return PAWL_EBUSY;
        if (strcmp(req.sqlstate, "PW003") == 0)
            return PAWL_ENOTFOUND;
        if (strcmp(req.sqlstate, "PW004") == 0)
            return PAWL_EINVAL;
        if (strcmp(req.sqlstate, "42501") == 0)
            return PAWL_EPERM; /* not granted the processor, or no rights on pawl at all */
        if (strcmp(req.sqlstate, "42P01") == 0 || strcmp(req.sqlstate, "42883") == 0)
            return PAWL_ESCHEMA;
        return PAWL_ESQL;
    }
    if (req.message[0])
        set_err(t, "%s", req.message);
    else
        set_err(t, "%s", pawl_strerror(rc));
    return rc;
}

static int run(struct tokens_pg *t, struct pawl_pgstmt *stmts, int n)
{
    return run_on(t, t->pool, stmts, n);
}

/* ---- result capture (callbacks run on the pool's I/O thread while the caller waits) ---- */

struct rows_cap {
    struct pawl_segment_status *rows;
    size_t n, cap;
    int oom;
    int skip;       /* leading columns before the row's own (tokens_claim: 1, "claimed") */
    int first_flag; /* skip = 1: the first row's leading boolean */
};

static int64_t geti(const PGresult *r, int row, int col, int64_t dflt)
{
    return PQgetisnull(r, row, col) ? dflt : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

/* Columns (after c->skip leading ones), as pawl.tokens_list returns them: segment_id, mask,
 * token, high_water, owner, age_ms, mode, merge_id, merge_mask, merge_token. */
static void on_rows(void *ud, const PGresult *r)
{
    struct rows_cap *c = ud;
    PAWL_ASSERT(pawl__pgpool_on_io_thread(NULL)); /* while its caller waits in run_on */
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQnfields(r) < c->skip + 10)
        return;
    int nt = PQntuples(r);
    int o = c->skip;
    for (int i = 0; i < nt; i++) {
        if (c->n == c->cap) {
            size_t cap = c->cap ? c->cap * 2 : 32;
            struct pawl_segment_status *nr = pawl_realloc(c->rows, cap * sizeof *nr);
            if (nr == NULL) {
                c->oom = 1;
                return;
            }
            c->rows = nr;
            c->cap = cap;
        }
        if (c->n == 0 && o > 0)
            c->first_flag = PQgetvalue(r, i, 0)[0] == 't';
        struct pawl_segment_status *s = &c->rows[c->n++];
        memset(s, 0, sizeof *s);
        s->seg.id = (uint32_t)geti(r, i, o + 0, 0);
        s->seg.mask = (uint32_t)geti(r, i, o + 1, 0);
        s->token = geti(r, i, o + 2, 0);
        s->high_water = geti(r, i, o + 3, 0);
        snprintf(s->owner, sizeof s->owner, "%s", PQgetvalue(r, i, o + 4));
        s->claim_age_ms = s->owner[0] ? geti(r, i, o + 5, -1) : -1;
        s->mode = (int)geti(r, i, o + 6, -1);
        s->has_merge = !PQgetisnull(r, i, o + 9);
        if (s->has_merge) {
            s->merge_seg.id = (uint32_t)geti(r, i, o + 7, 0);
            s->merge_seg.mask = (uint32_t)geti(r, i, o + 8, 0);
            s->merge_token = geti(r, i, o + 9, 0);
        }
    }
}

struct ints_cap {
    int64_t v[2];
    int64_t *list;
    size_t n, cap;
    int got;
};

static void on_ints(void *ud, const PGresult *r)
{
    struct ints_cap *c = ud;
    PAWL_ASSERT(pawl__pgpool_on_io_thread(NULL)); /* while its caller waits in run_on */
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) < 1)
        return;
    c->got = 1;
    for (int k = 0; k < 2 && k < PQnfields(r); k++)
        c->v[k] = geti(r, 0, k, 0);
    int nt = PQntuples(r);
    for (int i = 0; i < nt; i++) {
        if (c->n == c->cap) {
            size_t cap = c->cap ? c->cap * 2 : 32;
            int64_t *nl = pawl_realloc(c->list, cap * sizeof *nl);
            if (nl == NULL)
                return;
            c->list = nl;
            c->cap = cap;
        }
        c->list[c->n++] = geti(r, i, 0, 0);
    }
}

#define I64(buf, v) (snprintf(buf, sizeof buf, "%lld", (long long)(v)), buf)

/* ---- operations ---- */

static int pg_init(struct pawl_tokens *tk, const char *proc, uint32_t n, int64_t token)
{
    char a[24], b[24];
    const char *v[3] = {proc, I64(a, n), I64(b, token)};
    struct ints_cap c = {0};
    struct pawl_pgstmt s = {.sql = "SELECT pawl.tokens_init($1, $2, $3)",
                            .nparams = 3,
                            .values = v,
                            .on_result = on_ints,
                            .ud = &c};
    int rc = run(from(tk), &s, 1);
    /* A processor that did not exist is created here: say so, so a misspelt name does not
     * silently start a second processor from the start of the log. */
    if (rc == 0 && c.got && c.v[0] > 0)
        PAWL_INFO("tokens", "creating processor %s with %u segments at token %lld", proc, n,
                  (long long)token);
    pawl_free(c.list);
    return rc;
}

static int pg_list(struct pawl_tokens *tk, const char *proc, struct pawl_segment_status **rows,
                   size_t *n)
{
    struct rows_cap c = {0};
    const char *v[1] = {proc};
    struct pawl_pgstmt s = {.sql = "SELECT * FROM pawl.tokens_list($1)",
                            .nparams = 1,
                            .values = v,
                            .on_result = on_rows,
                            .ud = &c};
    int rc = run(from(tk), &s, 1);
    if (rc == 0 && c.oom)
        rc = PAWL_ENOMEM;
    if (rc) {
        pawl_free(c.rows);
        return rc;
    }
    if (c.rows == NULL && (c.rows = pawl_malloc(sizeof *c.rows)) == NULL)
        return PAWL_ENOMEM;
    *rows = c.rows;
    *n = c.n;
    return 0;
}

static int pg_claim(struct pawl_tokens *tk, const char *proc, uint32_t seg_id, const char *owner,
                    int64_t timeout_ms, int mode, struct pawl_segment_status *out)
{
    struct tokens_pg *t = from(tk);
    char a[24], b[24], m[24];
    const char *v[5] = {proc, I64(a, seg_id), owner, I64(b, timeout_ms), I64(m, mode)};
    /* One row: (claimed, the row's columns); none: no such segment. */
    struct rows_cap c = {.skip = 1};
    struct pawl_pgstmt s = {.sql = "SELECT * FROM pawl.tokens_claim($1, $2, $3, $4, $5)",
                            .nparams = 5,
                            .values = v,
                            .on_result = on_rows,
                            .ud = &c};
    int rc = run(t, &s, 1);
    if (rc == 0 && c.oom)
        rc = PAWL_ENOMEM;
    if (rc == 0 && c.n == 0) {
        set_err(t, "no segment %u in %s", seg_id, proc);
        rc = PAWL_ENOTFOUND;
    } else if (rc == 0 && !c.first_flag) {
        set_err(t, "segment %u of %s is held by %s", seg_id, proc, c.rows[0].owner);
        rc = PAWL_EBUSY;
    }
    if (rc == 0 && out)
        *out = c.rows[0];
    pawl_free(c.rows);
    return rc;
}

static int pg_extend(struct pawl_tokens *tk, const char *proc, const char *owner,
                     const uint32_t *ids, size_t n, unsigned char *held)
{
    struct tokens_pg *t = from(tk);
    size_t cap = 4 + n * 11;
    char *arr = pawl_malloc(cap);
    if (arr == NULL)
        return PAWL_ENOMEM;
    size_t off = 0;
    arr[off++] = '{';
    for (size_t i = 0; i < n; i++)
        off += (size_t)snprintf(arr + off, cap - off, "%s%u", i ? "," : "", ids[i]);
    arr[off++] = '}';
    arr[off] = '\0';
    const char *v[3] = {proc, owner, arr};
    struct ints_cap c = {0};
    /* Registers the node (even with n = 0) and refreshes its claims, in one call. */
    struct pawl_pgstmt s = {.sql = "SELECT * FROM pawl.tokens_extend($1, $2, $3::int8[])",
                            .nparams = 3,
                            .values = v,
                            .on_result = on_ints,
                            .ud = &c};
    int rc = run(t, &s, 1);
    if (rc == 0 && held) {
        for (size_t i = 0; i < n; i++) {
            held[i] = 0;
            for (size_t k = 0; k < c.n; k++)
                if (c.list[k] == ids[i])
                    held[i] = 1;
        }
    }
    pawl_free(c.list);
    pawl_free(arr);
    return rc;
}

static int pg_live(struct pawl_tokens *tk, const char *proc, const char *me, int64_t timeout_ms,
                   uint32_t *count, uint32_t *rank)
{
    char a[24];
    const char *v[3] = {proc, me, I64(a, timeout_ms)};
    struct ints_cap c = {0};
    struct pawl_pgstmt s = {.sql = "SELECT others, before_me FROM pawl.nodes_live($1, $2, $3)",
                            .nparams = 3,
                            .values = v,
                            .on_result = on_ints,
                            .ud = &c};
    int rc = run(from(tk), &s, 1);
    pawl_free(c.list);
    if (rc)
        return rc;
    *count = (uint32_t)c.v[0] + 1;
    *rank = (uint32_t)c.v[1];
    return 0;
}

static int pg_leave(struct pawl_tokens *tk, const char *proc, const char *me)
{
    const char *v[2] = {proc, me};
    struct pawl_pgstmt s = {.sql = "SELECT pawl.nodes_leave($1, $2)", .nparams = 2, .values = v};
    return run(from(tk), &s, 1);
}

static int pg_release(struct pawl_tokens *tk, const char *proc, uint32_t seg_id, const char *owner)
{
    char a[24];
    const char *v[3] = {proc, I64(a, seg_id), owner};
    struct pawl_pgstmt s = {
        .sql = "SELECT pawl.tokens_release($1, $2, $3)", .nparams = 3, .values = v};
    return run(from(tk), &s, 1);
}

static int admin_call(struct pawl_tokens *tk, const char *sql, const char *proc, uint32_t seg_id,
                      const char *owner)
{
    char a[24];
    const char *v[3] = {proc, I64(a, seg_id), owner};
    struct pawl_pgstmt s = {.sql = sql, .nparams = 3, .values = v};
    return run(from(tk), &s, 1);
}

static int pg_split(struct pawl_tokens *tk, const char *proc, uint32_t seg_id, const char *owner)
{
    return admin_call(tk, "SELECT pawl.tokens_split($1, $2, $3)", proc, seg_id, owner);
}

static int pg_merge(struct pawl_tokens *tk, const char *proc, uint32_t seg_id, const char *owner)
{
    return admin_call(tk, "SELECT pawl.tokens_merge($1, $2, $3)", proc, seg_id, owner);
}

static int pg_reset(struct pawl_tokens *tk, const char *proc, int64_t token)
{
    char a[24];
    const char *v[2] = {proc, I64(a, token)};
    struct pawl_pgstmt s = {.sql = "SELECT pawl.tokens_reset($1, $2)", .nparams = 2, .values = v};
    return run(from(tk), &s, 1);
}

struct filter_cap {
    char *recorded;
    size_t len;
    int same, got;
};

static void on_filter(void *ud, const PGresult *r)
{
    struct filter_cap *c = ud;
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1 || PQnfields(r) != 2)
        return;
    c->got = 1;
    snprintf(c->recorded, c->len, "%s", PQgetvalue(r, 0, 0));
    c->same = PQgetvalue(r, 0, 1)[0] == 't';
}

static int pg_filter(struct pawl_tokens *tk, const char *proc, const char *filter_json,
                     char *recorded, size_t len)
{
    const char *v[2] = {proc, filter_json};
    struct filter_cap c = {.recorded = recorded, .len = len};
    if (len > 0)
        recorded[0] = '\0';
    struct pawl_pgstmt s = {.sql = "SELECT f::text, f = $2::jsonb"
                                   "  FROM pawl.processor_filter($1, $2::jsonb) f",
                            .nparams = 2,
                            .values = v,
                            .on_result = on_filter,
                            .ud = &c};
    int rc = run(from(tk), &s, 1);
    if (rc == 0 && !c.got) {
        set_err(from(tk), "pawl.processor_filter returned no row");
        rc = PAWL_ESQL;
    }
    if (rc == 0 && !c.same) {
        set_err(from(tk), "processor %s was created with filter %s, not %s", proc,
                strcmp(recorded, "{}") == 0 ? "none (it reads every event)" : recorded,
                strcmp(filter_json, "{}") == 0 ? "none" : filter_json);
        rc = PAWL_EFILTER;
    }
    return rc;
}

static int pg_filter_reset(struct pawl_tokens *tk, const char *proc, const char *filter_json,
                           int64_t token)
{
    char a[24];
    const char *v[3] = {proc, filter_json, I64(a, token)};
    struct pawl_pgstmt s = {
        .sql = "SELECT pawl.processor_filter_reset($1, $2::jsonb, $3)", .nparams = 3, .values = v};
    return run(from(tk), &s, 1);
}

/* ---- batch transactions ----
 *
 * A transaction object is reused (a free list on the store), and its statements live in one
 * arena: queuing a statement copies its parameters (and its text, unless it is prepared) into
 * buffers that only grow, so a warm processor allocates nothing per event. */

#define NO_VALUE SIZE_MAX

struct stmt {
    int prepared; /* prepared id, or -1: the text is at sql_off */
    size_t sql_off;
    int nparams;
    size_t voff; /* index of the first parameter in value_offs */
};

struct txn_pg {
    struct pawl_txn base;
    struct tokens_pg *t;
    struct txn_pg *next_free;
    char proc[PAWL_NAME_MAX + 1];
    char owner[PAWL_INSTANCE_MAX + 1];
    uint32_t seg_id;
    int has_store;
    int64_t token;
    int failed;
    struct stmt *stmts;
    size_t n, cap;
    char *arena;
    size_t used, arena_cap;
    size_t *value_offs; /* arena offsets of parameter values; NO_VALUE for SQL NULL */
    size_t nvalues, values_cap;
    /* Built at commit, reused. */
    struct pawl_pgstmt *ps;
    const char **vptrs;
    size_t ps_cap, vptrs_cap;
};

static void txn_destroy(struct txn_pg *x)
{
    pawl_free(x->stmts);
    pawl_free(x->arena);
    pawl_free(x->value_offs);
    pawl_free(x->ps);
    pawl_free(x->vptrs);
    pawl_free(x);
}

/* Give x back to the store's free list (or free it when the list is long). */
static void txn_clear(struct txn_pg *x)
{
    struct tokens_pg *t = x->t;
    x->n = 0;
    x->used = 0;
    x->nvalues = 0;
    x->failed = 0;
    x->has_store = 0;
    pthread_mutex_lock(&t->pmu);
    if (t->nfree < 64) {
        x->next_free = t->free_txns;
        t->free_txns = x;
        t->nfree++;
        x = NULL;
    }
    pthread_mutex_unlock(&t->pmu);
    if (x)
        txn_destroy(x);
}

static int grow(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = pawl_realloc(*p, c * size);
    if (q == NULL)
        return PAWL_ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

/* Copy s (with its NUL) into the arena; its offset in *off. */
static int arena_put(struct txn_pg *x, const char *s, size_t *off)
{
    size_t len = strlen(s) + 1;
    if (grow((void **)&x->arena, &x->arena_cap, x->used + len, 1))
        return PAWL_ENOMEM;
    memcpy(x->arena + x->used, s, len);
    *off = x->used;
    x->used += len;
    return 0;
}

static int txn_exec(struct pawl_txn *tx, const char *sql, int nparams, const char *const *values)
{
    struct txn_pg *x = (struct txn_pg *)tx;
    if (sql == NULL || nparams < 0 || nparams > 65535 || (nparams > 0 && values == NULL))
        return PAWL_EINVAL;
    if (grow((void **)&x->stmts, &x->cap, x->n + 1, sizeof *x->stmts) ||
        grow((void **)&x->value_offs, &x->values_cap, x->nvalues + (size_t)nparams,
             sizeof *x->value_offs)) {
        x->failed = 1;
        return PAWL_ENOMEM;
    }
    struct stmt *s = &x->stmts[x->n];
    s->prepared = prepared_id(x->t, sql, nparams);
    s->nparams = nparams;
    s->voff = x->nvalues;
    if (s->prepared < 0 && arena_put(x, sql, &s->sql_off)) {
        x->failed = 1;
        return PAWL_ENOMEM;
    }
    for (int k = 0; k < nparams; k++) {
        size_t off = NO_VALUE;
        if (values[k] && arena_put(x, values[k], &off)) {
            x->failed = 1;
            return PAWL_ENOMEM;
        }
        x->value_offs[x->nvalues + (size_t)k] = off;
    }
    x->nvalues += (size_t)nparams;
    x->n++;
    return 0;
}

static int txn_store(struct pawl_txn *tx, int64_t token)
{
    struct txn_pg *x = (struct txn_pg *)tx;
    if (!x->has_store || token > x->token)
        x->token = token;
    x->has_store = 1;
    return 0;
}

static int txn_commit(struct pawl_txn *tx)
{
    struct txn_pg *x = (struct txn_pg *)tx;
    struct tokens_pg *t = x->t;
    if (x->failed) {
        set_err(t, "a statement could not be queued (out of memory)");
        txn_clear(x);
        return PAWL_ENOMEM;
    }
    if (!x->has_store && x->n == 0) {
        /* Nothing to write (a deferred-mode batch with no checkpoint request, say): no round
         * trip. The claim is still guarded: the extender learns of a lost claim at its next
         * extension, and the next batch that writes anything checks it again. */
        txn_clear(x);
        return 0;
    }
    if (grow((void **)&x->ps, &x->ps_cap, x->n + 1, sizeof *x->ps) ||
        grow((void **)&x->vptrs, &x->vptrs_cap, x->nvalues + 1, sizeof *x->vptrs)) {
        txn_clear(x);
        return PAWL_ENOMEM;
    }
    /* The arena no longer moves: turn offsets into pointers. */
    for (size_t i = 0; i < x->nvalues; i++)
        x->vptrs[i] = x->value_offs[i] == NO_VALUE ? NULL : x->arena + x->value_offs[i];
    char a[24], b[24];
    const char *v[4] = {x->proc, I64(a, x->seg_id), x->owner,
                        x->has_store ? I64(b, x->token) : NULL};
    struct pawl_pgstmt *s = x->ps;
    memset(s, 0, (x->n + 1) * sizeof *s);
    /* The claim check goes first: a lost claim skips the handlers' statements altogether. */
    s[0].sql = t->store_id >= 0 ? NULL : "SELECT pawl.store_token($1, $2, $3, $4)";
    s[0].prepared = t->store_id;
    s[0].nparams = 4;
    s[0].values = v;
    for (size_t i = 0; i < x->n; i++) {
        const struct stmt *st = &x->stmts[i];
        s[i + 1].sql = st->prepared >= 0 ? NULL : x->arena + st->sql_off;
        s[i + 1].prepared = st->prepared;
        s[i + 1].nparams = st->nparams;
        s[i + 1].values = x->vptrs + st->voff;
    }
    int rc = run_on(t, t->txpool, s, (int)(x->n + 1));
    txn_clear(x);
    return rc;
}

static void txn_rollback(struct pawl_txn *tx)
{
    /* Nothing reached the server: the statements are only sent at commit. */
    txn_clear((struct txn_pg *)tx);
}

/* Dead letters (sql/008_dead_letters.sql): parking and un-parking are statements of the batch,
 * sent after store_token like the handlers' own, so they commit with the token. */
#define PARK_SQL                                                                                   \
    "SELECT pawl.dead_letters_park($1, $2, $3, $4, $5, $6, $7, $8, $9::bytea, $10::jsonb, $11, "   \
    "$12, $13, $14, $15, $16)"
#define UNPARK_SQL "SELECT pawl.dead_letters_unpark($1, $2, $3, $4, $5)"

static int txn_park(struct pawl_txn *tx, const struct pawl_dead_letter *l)
{
    struct txn_pg *x = (struct txn_pg *)tx;
    static const char hexd[] = "0123456789abcdef";
    const unsigned char *pl = l->ev.payload;
    size_t plen = pl ? l->ev.payload_len : 0;
    char *hex = pawl_malloc(3 + 2 * plen);
    if (hex == NULL) {
        x->failed = 1;
        return PAWL_ENOMEM;
    }
    hex[0] = '\\';
    hex[1] = 'x';
    for (size_t i = 0; i < plen; i++) {
        hex[2 + 2 * i] = hexd[pl[i] >> 4];
        hex[3 + 2 * i] = hexd[pl[i] & 15];
    }
    hex[2 + 2 * plen] = '\0';
    char seg[24], idx[24], hash[24], seq[24], app[24], att[24], beh[24], ff[24];
    const char *v[16] = {x->proc,
                         I64(seg, x->seg_id),
                         x->owner,
                         l->ev.stream_id,
                         I64(idx, l->ev.index),
                         I64(hash, pawl_stream_hash(l->ev.stream_id)),
                         I64(seq, l->ev.stream_seq),
                         l->ev.type ? l->ev.type : "",
                         hex,
                         l->ev.metadata,
                         I64(app, l->ev.appended_at_us),
                         I64(att, l->attempts),
                         l->behind > 0 ? I64(beh, l->behind) : NULL,
                         l->first_error,
                         l->last_error,
                         I64(ff, l->first_failed_us)};
    int rc = txn_exec(tx, PARK_SQL, 16, v);
    pawl_free(hex);
    return rc;
}

static int txn_unpark(struct pawl_txn *tx, const char *stream, int64_t up_to)
{
    struct txn_pg *x = (struct txn_pg *)tx;
    char seg[24], up[24];
    const char *v[5] = {x->proc, I64(seg, x->seg_id), x->owner, stream, I64(up, up_to)};
    return txn_exec(tx, UNPARK_SQL, 5, v);
}

static const struct pawl_txn_ops txn_ops = {
    .exec = txn_exec,
    .store = txn_store,
    .commit = txn_commit,
    .rollback = txn_rollback,
    .park = txn_park,
    .unpark = txn_unpark,
};

static int pg_begin(struct pawl_tokens *tk, const char *proc, uint32_t seg_id, const char *owner,
                    struct pawl_txn **out)
{
    struct tokens_pg *t = from(tk);
    pthread_mutex_lock(&t->pmu);
    struct txn_pg *x = t->free_txns;
    if (x) {
        t->free_txns = x->next_free;
        t->nfree--;
    }
    pthread_mutex_unlock(&t->pmu);
    if (x == NULL && (x = pawl_calloc(1, sizeof *x)) == NULL)
        return PAWL_ENOMEM;
    x->base.ops = &txn_ops;
    x->t = t;
    snprintf(x->proc, sizeof x->proc, "%s", proc);
    snprintf(x->owner, sizeof x->owner, "%s", owner);
    x->seg_id = seg_id;
    *out = &x->base;
    return 0;
}

/* ---- dead letters (administration and the nodes' refresh; one request each) ---- */

struct streams_cap {
    struct pawl_dead_stream *rows;
    size_t n;
    int oom;
    int full; /* pawl.dead_letters_list's columns; else pawl.dead_letters_segment's */
};

static void on_streams(void *ud, const PGresult *r)
{
    struct streams_cap *c = ud;
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        return;
    int nt = PQntuples(r);
    c->rows = pawl_calloc((size_t)nt + 1, sizeof *c->rows);
    if (c->rows == NULL) {
        c->oom = 1;
        return;
    }
    for (int i = 0; i < nt; i++) {
        struct pawl_dead_stream *d = &c->rows[i];
        snprintf(d->stream_id, sizeof d->stream_id, "%s", PQgetvalue(r, i, 0));
        if (c->full) {
            /* stream_id, letters, first_index, last_index, age_ms, attempts, last_error, retry */
            d->letters = (uint64_t)geti(r, i, 1, 0);
            d->first_index = geti(r, i, 2, 0);
            d->last_index = geti(r, i, 3, 0);
            d->oldest_age_ms = geti(r, i, 4, 0);
            d->attempts = (uint32_t)geti(r, i, 5, 0);
            snprintf(d->last_error, sizeof d->last_error, "%s", PQgetvalue(r, i, 6));
            d->retry_requested = PQgetvalue(r, i, 7)[0] == 't';
        } else {
            /* stream_id, first_index, letters, retry */
            d->first_index = geti(r, i, 1, 0);
            d->letters = (uint64_t)geti(r, i, 2, 0);
            d->retry_requested = PQgetvalue(r, i, 3)[0] == 't';
        }
    }
    c->n = (size_t)nt;
}

static int streams_call(struct pawl_tokens *tk, struct pawl_pgstmt *s, struct streams_cap *c,
                        struct pawl_dead_stream **rows, size_t *n)
{
    s->on_result = on_streams;
    s->ud = c;
    int rc = run(from(tk), s, 1);
    if (rc == 0 && (c->oom || c->rows == NULL))
        rc = PAWL_ENOMEM;
    if (rc) {
        pawl_free(c->rows);
        return rc;
    }
    *rows = c->rows;
    *n = c->n;
    return 0;
}

static int pg_dl_segment(struct pawl_tokens *tk, const char *proc, struct pawl_segment seg,
                         struct pawl_dead_stream **rows, size_t *n)
{
    char a[24], b[24];
    const char *v[3] = {proc, I64(a, seg.id), I64(b, seg.mask)};
    struct pawl_pgstmt s = {
        .sql = "SELECT * FROM pawl.dead_letters_segment($1, $2, $3)", .nparams = 3, .values = v};
    struct streams_cap c = {0};
    return streams_call(tk, &s, &c, rows, n);
}

static int pg_dl_list(struct pawl_tokens *tk, const char *proc, struct pawl_dead_stream **rows,
                      size_t *n)
{
    const char *v[1] = {proc};
    struct pawl_pgstmt s = {
        .sql = "SELECT * FROM pawl.dead_letters_list($1)", .nparams = 1, .values = v};
    struct streams_cap c = {.full = 1};
    return streams_call(tk, &s, &c, rows, n);
}

struct letters_cap {
    struct pawl_dead_letter *rows;
    size_t n;
    int oom;
};

/* Columns of pawl.dead_letters_show: stream_id 0, global_index 1, stream_seq 2, type 3,
 * payload 4, metadata 5, appended_us 6, segment_id 7, segment_mask 8, attempts 9, behind 10,
 * first_error 11, last_error 12, first_failed_us 13, parked_us 14, retry 15, event_id 16 (schema
 * 15). One allocation: the array, then every string and payload. */
static void on_letters(void *ud, const PGresult *r)
{
    struct letters_cap *c = ud;
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQnfields(r) < 17)
        return;
    size_t nt = (size_t)PQntuples(r);
    unsigned char **pl = pawl_calloc(nt + 1, sizeof *pl);
    size_t *pll = pawl_calloc(nt + 1, sizeof *pll);
    static const int strs[] = {0, 3, 5, 11, 12, 16};
    size_t total = (nt + 1) * sizeof(struct pawl_dead_letter);
    int ok = pl != NULL && pll != NULL;
    for (size_t i = 0; ok && i < nt; i++) {
        pl[i] = PQunescapeBytea((const unsigned char *)PQgetvalue(r, (int)i, 4), &pll[i]);
        if (pl[i] == NULL)
            ok = 0;
        total += pll[i] + 1;
        for (size_t k = 0; k < sizeof strs / sizeof strs[0]; k++)
            total += (size_t)PQgetlength(r, (int)i, strs[k]) + 1;
    }
    char *mem = ok ? pawl_calloc(1, total) : NULL;
    if (mem == NULL) {
        c->oom = 1;
    } else {
        struct pawl_dead_letter *rows = (struct pawl_dead_letter *)mem;
        char *at = mem + (nt + 1) * sizeof *rows;
        for (size_t i = 0; i < nt; i++) {
            int ri = (int)i;
            const char *sv[6];
            for (size_t k = 0; k < 6; k++) {
                size_t len = (size_t)PQgetlength(r, ri, strs[k]);
                memcpy(at, PQgetvalue(r, ri, strs[k]), len);
                at[len] = '\0';
                sv[k] = at;
                at += len + 1;
            }
            struct pawl_dead_letter *d = &rows[i];
            memcpy(at, pl[i], pll[i]);
            d->ev.payload = at;
            d->ev.payload_len = pll[i];
            at += pll[i] + 1;
            d->ev.stream_id = sv[0];
            d->ev.index = geti(r, ri, 1, 0);
            d->ev.stream_seq = geti(r, ri, 2, 0);
            d->ev.type = sv[1];
            d->ev.metadata = PQgetisnull(r, ri, 5) ? NULL : sv[2];
            d->ev.appended_at_us = geti(r, ri, 6, 0);
            d->ev.id = PQgetisnull(r, ri, 16) ? NULL : sv[5];
            d->seg.id = (uint32_t)geti(r, ri, 7, 0);
            d->seg.mask = (uint32_t)geti(r, ri, 8, 0);
            d->attempts = (uint32_t)geti(r, ri, 9, 0);
            d->behind = geti(r, ri, 10, 0);
            d->first_error = sv[3];
            d->last_error = sv[4];
            d->first_failed_us = geti(r, ri, 13, 0);
            d->parked_us = geti(r, ri, 14, 0);
            d->retry_requested = PQgetvalue(r, ri, 15)[0] == 't';
        }
        c->rows = rows;
        c->n = nt;
    }
    for (size_t i = 0; pl && i < nt; i++)
        if (pl[i])
            PQfreemem(pl[i]);
    pawl_free(pl);
    pawl_free(pll);
}

static int pg_dl_show(struct pawl_tokens *tk, const char *proc, const char *stream,
                      struct pawl_dead_letter **rows, size_t *n)
{
    const char *v[2] = {proc, stream};
    struct letters_cap c = {0};
    struct pawl_pgstmt s = {.sql = "SELECT * FROM pawl.dead_letters_show($1, $2)",
                            .nparams = 2,
                            .values = v,
                            .on_result = on_letters,
                            .ud = &c};
    int rc = run(from(tk), &s, 1);
    if (rc == 0 && (c.oom || c.rows == NULL))
        rc = PAWL_ENOMEM;
    if (rc) {
        pawl_free(c.rows);
        return rc;
    }
    *rows = c.rows;
    *n = c.n;
    return 0;
}

static int count_call(struct pawl_tokens *tk, const char *sql, int nparams, const char *const *v,
                      int64_t *n)
{
    struct ints_cap c = {0};
    struct pawl_pgstmt s = {
        .sql = sql, .nparams = nparams, .values = v, .on_result = on_ints, .ud = &c};
    int rc = run(from(tk), &s, 1);
    pawl_free(c.list);
    if (rc == 0 && n)
        *n = c.v[0];
    return rc;
}

static int pg_dl_retry(struct pawl_tokens *tk, const char *proc, const char *stream, int64_t *n)
{
    const char *v[2] = {proc, stream};
    return count_call(tk, "SELECT pawl.dead_letters_retry($1, $2)", 2, v, n);
}

static int pg_dl_drop(struct pawl_tokens *tk, const char *proc, const char *stream, int64_t up_to,
                      int64_t *n)
{
    char a[24];
    const char *v[3] = {proc, stream, up_to == INT64_MAX ? NULL : I64(a, up_to)};
    return count_call(tk, "SELECT pawl.dead_letters_drop($1, $2, $3)", 3, v, n);
}

static int pg_dl_retry_failed(struct pawl_tokens *tk, const char *proc, uint32_t seg_id,
                              const char *owner, const char *stream, int64_t index, const char *why)
{
    char a[24], b[24];
    const char *v[6] = {proc, I64(a, seg_id), owner, stream, I64(b, index), why};
    return count_call(tk, "SELECT pawl.dead_letters_retry_failed($1, $2, $3, $4, $5, $6)", 6, v,
                      NULL);
}

static void pg_free(struct pawl_tokens *tk)
{
    struct tokens_pg *t = from(tk);
    pawl__pgpool_free(t->txpool);
    pawl__pgpool_free(t->pool);
    for (int i = 0; i < t->nprep; i++)
        pawl_free(t->prep[i].sql);
    while (t->free_txns) {
        struct txn_pg *x = t->free_txns;
        t->free_txns = x->next_free;
        txn_destroy(x);
    }
    pthread_mutex_destroy(&t->pmu);
    pthread_mutex_destroy(&t->mu);
    pawl_free(t);
}

static const struct pawl_tokens_ops pg_ops = {
    .init = pg_init,
    .list = pg_list,
    .claim = pg_claim,
    .extend = pg_extend,
    .live = pg_live,
    .leave = pg_leave,
    .release = pg_release,
    .begin = pg_begin,
    .split = pg_split,
    .merge = pg_merge,
    .reset = pg_reset,
    .errmsg = pg_errmsg,
    .free = pg_free,
    .dl_segment = pg_dl_segment,
    .dl_show = pg_dl_show,
    .dl_list = pg_dl_list,
    .dl_retry = pg_dl_retry,
    .dl_drop = pg_dl_drop,
    .dl_retry_failed = pg_dl_retry_failed,
    .filter = pg_filter,
    .filter_reset = pg_filter_reset,
};

int pawl_tokens_pg_new(struct pawl_tokens **out, const char *dsn)
{
    return pawl_tokens_pg_new_ex(out, dsn, 2);
}

int pawl_tokens_pg_new_ex(struct pawl_tokens **out, const char *dsn, int connections)
{
    *out = NULL;
    if (dsn == NULL)
        return PAWL_EINVAL;
    if (connections < 1 || connections > 64)
        return PAWL_ERANGE;
    char why[512];
    int rc0 =
        pawl__schema_check_primary(dsn, "the token store (claims and tokens)", why, sizeof why);
    if (rc0 == PAWL_EINVAL) {
        PAWL_ERROR("tokens", "%s", why);
        return rc0;
    }
    struct tokens_pg *t = pawl_calloc(1, sizeof *t);
    if (t == NULL)
        return PAWL_ENOMEM;
    t->base.ops = &pg_ops;
    pthread_mutex_init(&t->mu, NULL);
    pthread_mutex_init(&t->pmu, NULL);
    struct pawl_pgpool_opts o;
    pawl__pgpool_opts_defaults(&o);
    o.name = "tokens";
    o.connections = 1;
    /* Claims, batches and tokens write whatever the database's default says (as the log's
     * sessions do): a default of read-only transactions would fail every claim, for ever. The
     * isolation level and the timeouts stay the database's: batches run the handlers' own
     * statements, and claims retry serialization failures. */
    static const char *const session[] = {"SET jit = off",
                                          "SET default_transaction_read_only = off", NULL};
    o.session_sql = session;
    char err[256];
    /* Claims get a connection of their own, so an extension never queues behind batch
     * commits (a claim must not expire because handlers keep the batch connections busy). */
    int rc = pawl__pgpool_new(&t->pool, dsn, &o, 10000, err, sizeof err);
    if (rc) {
        PAWL_ERROR("tokens", "cannot connect: %s", err);
        goto fail;
    }
    o.name = "batches";
    o.connections = connections;
    rc = pawl__pgpool_new(&t->txpool, dsn, &o, 10000, err, sizeof err);
    if (rc) {
        PAWL_ERROR("tokens", "cannot connect: %s", err);
        goto fail_pool;
    }
    t->store_id =
        pawl__pgpool_prepare(t->txpool, "SELECT pawl.store_token($1, $2, $3, $4)", 4, NULL);
    struct ints_cap c = {0};
    /* 0: no token table; 2: a schema newer than this library (refused, like pawl_store_new:
     * its token functions may mean something else); 3: older than the token functions this
     * store calls; 1: usable. */
    char check[320];
    snprintf(check, sizeof check,
             "SELECT CASE WHEN to_regclass('pawl.tokens') IS NULL THEN 0 "
             "WHEN (SELECT max(version) FROM pawl.schema_version) > %d THEN 2 "
             "WHEN (SELECT max(version) FROM pawl.schema_version) < %d THEN 3 ELSE 1 END",
             pawl__schema_lib_version(), TOKENS_SCHEMA_MIN);
    struct pawl_pgstmt s = {.sql = check, .on_result = on_ints, .ud = &c};
    rc = run(t, &s, 1);
    pawl_free(c.list);
    if (rc == 0 && c.v[0] == 0) {
        PAWL_ERROR("tokens", "table pawl.tokens is missing: migrate the schema first");
        rc = PAWL_ESCHEMA;
    } else if (rc == 0 && c.v[0] == 2) {
        PAWL_ERROR("tokens",
                   "the database's schema is newer than this pawl (version %d): "
                   "upgrade pawl",
                   pawl__schema_lib_version());
        rc = PAWL_ESCHEMA;
    } else if (rc == 0 && c.v[0] == 3) {
        PAWL_ERROR("tokens",
                   "the database's schema is older than version %d, which this "
                   "token store needs: migrate it (pawl init)",
                   TOKENS_SCHEMA_MIN);
        rc = PAWL_ESCHEMA;
    }
    if (rc)
        goto fail_pool;
    *out = &t->base;
    return 0;

fail_pool:
    pawl__pgpool_free(t->txpool);
    pawl__pgpool_free(t->pool);
fail:
    pthread_mutex_destroy(&t->pmu);
    pthread_mutex_destroy(&t->mu);
    pawl_free(t);
    return rc;
}
