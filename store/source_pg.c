/*
 * source_pg.c — the event source over the PostgreSQL log (pawl/log.h).
 *
 * Reads go through the log store's pipelined connections (pawl__log_read_until, thread-safe, so
 * the coordinator and detached work packages read at once); a read that lost its connection is
 * run again by the store from the same position, and during a longer outage a read reports
 * nothing after a second, so the processor waits and reads again instead of failing. wait()
 * sleeps on the store's knowledge of the highest final index, which its LISTEN connection and
 * finalizer keep current. A read copies the store's batch into the caller's pawl_event_batch; the
 * per-thread pawl_read_batch is reused, so steady reading does not allocate. head() and index_at()
 * are administration queries (reset) on a short-lived connection of their own.
 *
 * The source owns the store when it created it (pawl_source_pg_new) and borrows it otherwise
 * (pawl_source_pg_from_store). Every entry point may be called from any thread.
 */
#include "common.h"
#include "dsn.h"
#include "log_int.h"

#include "pawl/log.h"
#include "pawl/processor.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PG_READ_PATIENCE_NS ((int64_t)1000000000)

struct source_pg {
    struct pawl_source base;
    struct pawl_store *store;
    int owns_store;
    char *dsn;
    pthread_mutex_t mu;
    char err[512];
    /* The filter (pawl_source_pg_set_filter): its copy, in one allocation, and its JSON. */
    int filtered;
    struct pawl_filter f;
    void *f_mem;
    char *f_json;
};

static struct source_pg *from(struct pawl_source *s)
{
    return (struct source_pg *)s;
}

static void set_err(struct source_pg *s, const char *msg)
{
    pthread_mutex_lock(&s->mu);
    snprintf(s->err, sizeof s->err, "%s", msg);
    pthread_mutex_unlock(&s->mu);
}

/* One reusable read buffer per thread that reads (pawl_read_batch keeps its result between reads).
 */
struct tls_batch {
    struct pawl_read_batch b;
    int init;
};
static _Thread_local struct tls_batch tls;
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

static void tls_dtor(void *p)
{
    struct tls_batch *t = p;
    if (t && t->init) {
        pawl_read_batch_fini(&t->b);
        t->init = 0;
    }
}

static void tls_make_key(void)
{
    pthread_key_create(&tls_key, tls_dtor);
}

static int pg_read(struct pawl_source *src, int64_t after, size_t max, struct pawl_event_batch *out,
                   int64_t *last_seen)
{
    struct source_pg *s = from(src);
    pthread_once(&tls_once, tls_make_key);
    if (!tls.init) {
        pawl_read_batch_init(&tls.b);
        tls.init = 1;
        pthread_setspecific(tls_key, &tls); /* frees the batch when the thread exits */
    }
    if (max > 100000)
        max = 100000;
    /* A lost connection is retried inside the store; after PG_READ_PATIENCE_NS of it this read
     * reports "nothing yet" (the processor waits and reads again, and the outage's retries go
     * on), so that a processor stays responsive to stop requests while the database is away. */
    int64_t position = after;
    int rc = s->filtered
                 ? pawl__log_read_filtered_until(s->store, after, max, &s->f, &tls.b, &position,
                                                 pawl_now_ns() + PG_READ_PATIENCE_NS)
                 : pawl__log_read_until(s->store, after, max, &tls.b,
                                        pawl_now_ns() + PG_READ_PATIENCE_NS);
    if (rc == PAWL_ETIMEDOUT) {
        if (last_seen)
            *last_seen = after;
        return 0;
    }
    if (rc) {
        char e[512];
        pawl_store_errmsg(s->store, e, sizeof e);
        set_err(s, e);
        return rc;
    }
    int64_t last = after;
    for (size_t i = 0; i < tls.b.count && rc == 0; i++) {
        rc = pawl_event_batch_push(out, &tls.b.events[i]);
        last = tls.b.events[i].index;
    }
    /* A filtered read looked further than its last event: nothing up to its position matched. */
    if (s->filtered && rc == 0 && position > last)
        last = position;
    if (last_seen)
        *last_seen = last;
    return rc;
}

static int pg_wait(struct pawl_source *src, int64_t after, int64_t timeout_ms)
{
    struct source_pg *s = from(src);
    int rc = pawl_store_wait(s->store, after, (int)timeout_ms);
    return rc == 0 ? 0 : rc == PAWL_ESHUTDOWN ? rc : PAWL_ETIMEDOUT;
}

static int admin_i64(struct source_pg *s, const char *sql, const char *param, int64_t *out)
{
    PGconn *c = pawl_pq_connect(s->dsn, 0);
    int rc = 0;
    if (PQstatus(c) != CONNECTION_OK) {
        char m[512];
        set_err(s, pawl__dsn_scrub(s->dsn, PQerrorMessage(c), m, sizeof m));
        PQfinish(c);
        return PAWL_ECONN;
    }
    const char *v[1] = {param};
    PGresult *r = PQexecParams(c, sql, param ? 1 : 0, NULL, v, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        set_err(s, PQerrorMessage(c));
        rc = PAWL_ESQL;
    } else {
        *out = PQgetisnull(r, 0, 0) ? 0 : strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    }
    PQclear(r);
    PQfinish(c);
    return rc;
}

static int pg_head(struct pawl_source *src, int64_t *index)
{
    struct source_pg *s = from(src);
    if (s->dsn == NULL) {
        *index = pawl_store_last_index(s->store);
        return 0;
    }
    return admin_i64(s, "SELECT pawl_api.last_index()", NULL, index);
}

/*
 * Events appended at or after time_us: the log records when each finalization run committed,
 * and an event is finalized after its append commits, so starting after the last run that
 * finished before time_us covers every such event (and possibly a few appended just before).
 * last_index() is never below that run's index: it is there because on the native path it makes
 * the runs it sees durable first (a run may be visible before its commit is flushed).
 */
static int pg_index_at(struct pawl_source *src, int64_t time_us, int64_t *token)
{
    struct source_pg *s = from(src);
    if (s->dsn == NULL) {
        set_err(s, "index_at needs a source opened with a DSN");
        return PAWL_ENOTSUP;
    }
    char t[32];
    snprintf(t, sizeof t, "%lld", (long long)time_us);
    return admin_i64(s,
                     "SELECT least(coalesce(max(last_index), 0), pawl_api.last_index()) "
                     "FROM pawl.runs WHERE finalized_at < to_timestamp($1::int8 / 1e6)",
                     t, token);
}

static const char *pg_errmsg(struct pawl_source *src)
{
    static _Thread_local char copy[512];
    struct source_pg *s = from(src);
    pthread_mutex_lock(&s->mu);
    memcpy(copy, s->err, sizeof copy);
    pthread_mutex_unlock(&s->mu);
    return copy;
}

static const char *pg_filter(struct pawl_source *src)
{
    struct source_pg *s = from(src);
    return s->filtered ? s->f_json : NULL;
}

/* Copies of n strings of v, packed after *at in mem (sized by the caller), the pointer array
 * first, aligned for pointers. */
static const char *const *copy_strings(const char *const *v, size_t n, char **at)
{
    if (n == 0)
        return NULL;
    size_t mis = (uintptr_t)*at % _Alignof(const char *);
    if (mis)
        *at += _Alignof(const char *) - mis;
    const char **out = (const char **)(void *)*at;
    *at += n * sizeof(char *);
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(v[i]) + 1;
        memcpy(*at, v[i], len);
        out[i] = *at;
        *at += len;
    }
    return out;
}

int pawl_source_pg_set_filter(struct pawl_source *src, const struct pawl_filter *f)
{
    if (src == NULL || src->ops->read != pg_read)
        return PAWL_ENOTSUP;
    struct source_pg *s = from(src);
    char why[300];
    if (pawl_filter_check(f, why, sizeof why) != 0) {
        set_err(s, why);
        return PAWL_EINVAL;
    }
    const char *const *v[3] = {f->categories, f->stream_prefixes, f->types};
    size_t n[3] = {f->n_categories, f->n_stream_prefixes, f->n_types};
    size_t need = 0;
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < n[k]; i++)
            need += sizeof(char *) + strlen(v[k][i]) + 1;
    int jl = pawl_filter_json(f, NULL, 0);
    if (jl < 0)
        return jl;
    need += 3 * _Alignof(const char *); /* each pointer array's alignment */
    char *mem = pawl_malloc(need + 1), *json = pawl_malloc((size_t)jl + 1);
    if (mem == NULL || json == NULL) {
        pawl_free(mem);
        pawl_free(json);
        return PAWL_ENOMEM;
    }
    pawl_filter_json(f, json, (size_t)jl + 1);
    char *at = mem;
    struct pawl_filter c = {0};
    c.categories = copy_strings(v[0], n[0], &at);
    c.n_categories = n[0];
    c.stream_prefixes = copy_strings(v[1], n[1], &at);
    c.n_stream_prefixes = n[1];
    c.types = copy_strings(v[2], n[2], &at);
    c.n_types = n[2];
    pawl_free(s->f_mem);
    pawl_free(s->f_json);
    s->f = c;
    s->f_mem = mem;
    s->f_json = json;
    s->filtered = 1;
    return 0;
}

static void pg_free(struct pawl_source *src)
{
    struct source_pg *s = from(src);
    pawl_free(s->f_mem);
    pawl_free(s->f_json);
    if (s->owns_store)
        pawl_store_free(s->store);
    pawl_free(s->dsn);
    pthread_mutex_destroy(&s->mu);
    pawl_free(s);
}

static const struct pawl_source_ops pg_ops = {
    .read = pg_read,
    .wait = pg_wait,
    .head = pg_head,
    .index_at = pg_index_at,
    .errmsg = pg_errmsg,
    .free = pg_free,
    .filter = pg_filter,
};

static struct source_pg *alloc_source(void)
{
    struct source_pg *s = pawl_calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->base.ops = &pg_ops;
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

int pawl_source_pg_new(struct pawl_source **out, const char *dsn)
{
    *out = NULL;
    if (dsn == NULL)
        return PAWL_EINVAL;
    struct source_pg *s = alloc_source();
    if (s == NULL)
        return PAWL_ENOMEM;
    int rc = PAWL_ENOMEM;
    s->dsn = pawl__strdup(dsn);
    if (s->dsn == NULL)
        goto fail;
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    char err[256];
    rc = pawl_store_new(&s->store, dsn, &o, err, sizeof err);
    if (rc) {
        PAWL_ERROR("source", "cannot open the log: %s", err);
        goto fail;
    }
    s->owns_store = 1;
    *out = &s->base;
    return 0;
fail:
    pawl_free(s->dsn);
    pthread_mutex_destroy(&s->mu);
    pawl_free(s);
    return rc;
}

int pawl_source_pg_from_store(struct pawl_source **out, struct pawl_store *store, const char *dsn)
{
    *out = NULL;
    if (store == NULL)
        return PAWL_EINVAL;
    struct source_pg *s = alloc_source();
    if (s == NULL)
        return PAWL_ENOMEM;
    s->store = store;
    if (dsn && (s->dsn = pawl__strdup(dsn)) == NULL) {
        pthread_mutex_destroy(&s->mu);
        pawl_free(s);
        return PAWL_ENOMEM;
    }
    *out = &s->base;
    return 0;
}
