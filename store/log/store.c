/*
 * store.c — the store's life cycle: options (defaults and ranges), pawl_store_new in named
 * steps (arguments, the database, the store and its locks, timers, pools, statements, the
 * index, the finalizer) and pawl_store_free, which stops the rooms in order (appends drained,
 * with every delayed retry fired; the group linger cancelled; the finalizer; the waiters)
 * before it frees them, the timers before the ops whose retry timers they held. No lock
 * of its own: pawl_store_new runs before any other thread can see the store, pawl_store_free
 * after the caller's last call on it (any thread that may block, never a store's I/O thread);
 * pawl_store_opts_defaults is a pure function.
 */
#include "log_internal.h"

#include "dsn.h"
#include "schema.h"
#include "standby.h"
#include "timers.h"

#include <stdio.h>
#include <string.h>

void pawl_store_opts_defaults(struct pawl_store_opts *o)
{
    memset(o, 0, sizeof *o);
#define DEFAULT(type, field, flag, def, lo, hi, unit, help, choices) o->field = def;
    PAWL_STORE_TUNABLES(DEFAULT)
#undef DEFAULT
}

/*
 * The ranges of PAWL_STORE_TUNABLES, then the rule no single range states. Writes the first
 * failure into msg and returns PAWL_ERANGE (the rule in pawl/common.h: every check here is a
 * range, some bounded by another option), or returns 0.
 */
static int check_opts(const struct pawl_store_opts *o, char *msg, size_t mlen)
{
#define RANGE(field, lo, hi)                                                                       \
    if ((long long)o->field < (long long)(lo) || (long long)o->field > (long long)(hi)) {          \
        snprintf(msg, mlen, #field " = %lld is out of range [%lld, %lld]", (long long)o->field,    \
                 (long long)(lo), (long long)(hi));                                                \
        return PAWL_ERANGE;                                                                        \
    }
#define CHECK_INT(field, lo, hi) RANGE(field, lo, hi)
#define CHECK_BOOL(field, lo, hi) RANGE(field, lo, hi)
#define CHECK_BOOL_NOFLAG(field, lo, hi) RANGE(field, lo, hi)
#define CHECK_DURATION(field, lo, hi) RANGE(field, lo, hi)
#define CHECK_ENUM(field, lo, hi) RANGE(field, lo, hi)
#define CHECK_STRING(field, lo, hi) /* any length: the server judges a DSN */
#define CHECK(type, field, flag, def, lo, hi, unit, help, choices) CHECK_##type(field, lo, hi)
    PAWL_STORE_TUNABLES(CHECK)
#undef CHECK
#undef CHECK_STRING
#undef CHECK_ENUM
#undef CHECK_DURATION
#undef CHECK_BOOL_NOFLAG
#undef CHECK_BOOL
#undef CHECK_INT
#undef RANGE
    if (o->reconnect_max_ms < o->reconnect_min_ms) {
        snprintf(msg, mlen, "reconnect_max_ms is below reconnect_min_ms");
        return PAWL_ERANGE;
    }
    return 0;
}

/* A pool of the store's (hooks: 0 none, 1 the listener's, 2 the finalizer's). */
static int new_pool(struct pawl_store *s, struct pawl_pgpool **out, const char *name, int conns,
                    const char *const *session, int hooks, struct pawl_pgpool *host,
                    int guest_slots, char *err, size_t errlen)
{
    struct pawl_pgpool_opts po;
    pawl__pgpool_opts_defaults(&po);
    po.name = name;
    po.connections = conns;
    po.reconnect_min_ms = s->o.reconnect_min_ms;
    po.reconnect_max_ms = s->o.reconnect_max_ms;
    po.connect_timeout_ms = s->o.connect_timeout_ms;
    po.queue_timeout_ms = s->o.queue_timeout_ms;
    po.session_sql = session;
    po.io_backend = s->o.io_backend;
    po.host = host;
    po.guest_slots = guest_slots;
    if (hooks == 1)
        pawl__log_listen_hooks(s, &po);
    else if (hooks == 2)
        pawl__log_fin_hooks(s, &po);
    return pawl__pgpool_new(out, s->dsn, &po, s->o.open_timeout_ms, err, errlen);
}

static void raise_index_cb(void *ud, int64_t idx)
{
    pawl__log_index_raise(ud, idx);
}

/* The options' ranges and the DSN's syntax, before anything connects. */
static int check_args(const char *dsn, const struct pawl_store_opts *o, char *err, size_t errlen)
{
    char bad[160];
    int rc = check_opts(o, bad, sizeof bad);
    if (rc != 0) {
        if (err && errlen)
            snprintf(err, errlen, "%s", bad);
        return rc;
    }
    char e[512];
    if (pawl_dsn_check(dsn, e, sizeof e) != 0) {
        if (err && errlen)
            snprintf(err, errlen, "invalid DSN: %s", e);
        return PAWL_EINVAL;
    }
    return 0;
}

/*
 * The database: migrated when asked, at the schema version of this library, and, when this
 * store finalizes, not a standby. *standby says whether it is one.
 */
static int check_database(const char *dsn, const struct pawl_store_opts *o, int *standby, char *err,
                          size_t errlen)
{
    int rc;
    if (o->migrate) {
        rc = pawl_schema_migrate(dsn, err, errlen);
        if (rc != 0)
            return rc;
    }
    /* One connection for the version and, when this store finalizes, whether it is a standby. */
    int dbv = 0, libv = pawl__schema_lib_version();
    rc = pawl__schema_probe(dsn, &dbv, standby, err, errlen);
    if (rc != 0)
        return rc;
    if (dbv != libv) {
        if (err && errlen) {
            if (dbv > libv)
                snprintf(err, errlen,
                         "the database schema is version %d, newer than this pawl (which knows "
                         "up to version %d): upgrade pawl",
                         dbv, libv);
            else
                snprintf(err, errlen,
                         "the database schema is version %d and this pawl needs version %d: "
                         "run `pawl init` (or set migrate)",
                         dbv, libv);
        }
        return PAWL_ESCHEMA;
    }
    if (*standby && o->finalizer)
        return pawl__schema_standby_error(dsn, "finalization (the store's finalizer)", err, errlen);
    return 0;
}

/* The store with its options and every lock and condition variable initialised; NULL when out
 * of memory. */
static struct pawl_store *store_alloc(const struct pawl_store_opts *o)
{
    struct pawl_store *s = pawl_calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->o = *o;
    pthread_mutex_init(&s->err_mu, NULL);
    pthread_mutex_init(&s->cov_mu, NULL);
    pthread_mutex_init(&s->op_mu, NULL);
    pthread_cond_init(&s->op_cond, NULL);
    pthread_mutex_init(&s->idx_mu, NULL);
    pawl__cond_init_monotonic(&s->idx_cond);
    pthread_cond_init(&s->waiters_cond, NULL);
    pthread_mutex_init(&s->fin_mu, NULL);
    pawl__cond_init_monotonic(&s->fin_cond);
    pthread_mutex_init(&s->grp_mu, NULL);
    pthread_mutex_init(&s->direct.mu, NULL);
    s->direct.backoff_ms = o->reconnect_min_ms;
    return s;
}

/* The timers object every timed wait of the store uses (pawl__timed_wait), and the delayed
 * retries' and the group linger's inline timers: no pool, their callbacks run on its thread. */
static int start_timers(struct pawl_store *s, const struct pawl_store_opts *o, char *err,
                        size_t errlen)
{
    struct pawl_timers_opts to;
    pawl_timers_opts_defaults(&to);
    to.backend = (enum pawl_timer_backend)o->io_backend;
    int rc = pawl_timers_new(&s->timers, NULL, &to);
    if (rc != 0) {
        if (err && errlen)
            snprintf(err, errlen, "cannot start the store's timers: %s",
                     rc == PAWL_ENOTSUP ? "io_uring is required and refused" : pawl_strerror(rc));
    }
    return rc;
}

/* The standby's pool (read_dsn, standby.c) and the reads prepared on it. */
static int open_standby(struct pawl_store *s, const char *dsn, const struct pawl_store_opts *o,
                        char *err, size_t errlen)
{
    static const Oid rd_types[2] = {OID_INT8, OID_INT4};
    int rc = pawl__standby_new(&s->sb, dsn, o, s->timers, raise_index_cb, s, err, errlen);
    if (rc != 0)
        return rc;
    static const Oid rdf_types[5] = {OID_INT8, OID_INT4, OID_TEXT_ARRAY, OID_TEXT_ARRAY,
                                     OID_TEXT_ARRAY};
    static const Oid rds_types[3] = {OID_INT8, OID_INT4, OID_TEXT};
    struct pawl_pgpool *sbp = pawl__standby_pool(s->sb);
    s->stmt_read_sb = pawl__pgpool_prepare(sbp, pawl__log_read_sql, 2, rd_types);
    s->stmt_read_f_sb = pawl__pgpool_prepare(sbp, pawl__log_read_filtered_sql, 5, rdf_types);
    s->stmt_read_s_sb = pawl__pgpool_prepare(sbp, pawl__log_read_stream_sql, 3, rds_types);
    if (s->stmt_read_sb < 0 || s->stmt_read_f_sb < 0 || s->stmt_read_s_sb < 0)
        return PAWL_ENOMEM;
    return 0;
}

/*
 * The pools: main (appends and reads), the finalizer's, the standby's (with a read_dsn) and the
 * listener's (unless there is nothing to listen to), each with its pinned session settings.
 */
static int open_pools(struct pawl_store *s, const char *dsn, const struct pawl_store_opts *o,
                      int standby, char *err, size_t errlen)
{
    /*
     * What pawl relies on, pinned whatever the database or role defaults say: read committed
     * (finalize's snapshot must follow its lock; appends retry their own conflicts), writable
     * sessions, and for the finalizer a durable commit (a run is flushed, or replicated when
     * so configured, before any reader can see it: a stronger setting stays) and no timeouts
     * (its work is bounded by the backlog). The append and read sessions pin no statement
     * timeout either: their lock waits are bounded by lock_timeout below, a read by its batch
     * size, and a default meant for applications' queries would fail them at random. LISTEN
     * pawl_pending: appends made in other processes' own transactions (pawl_api.append,
     * pawl_append_in).
     */
    static const char fin_sync_sql[] =
        "SELECT set_config('synchronous_commit', 'on', false)"
        " WHERE current_setting('synchronous_commit') IN ('off', 'local')";
    const char *const fin_session[] = {"SET application_name = 'pawl finalizer'",
                                       "SET default_transaction_isolation = 'read committed'",
                                       "SET default_transaction_read_only = off",
                                       fin_sync_sql,
                                       "SET statement_timeout = 0",
                                       "SET idle_in_transaction_session_timeout = 0",
                                       o->finalizer ? "LISTEN pawl_pending" : NULL,
                                       NULL};
    /* Generic plans for the append statement (and the rest: reads, in-doubt checks): with
     * the default plan_cache_mode PostgreSQL re-plans the append on every call (docs/log.md
     * has the cost); the generic plan is the custom one (a hash join of the arrays, one index
     * probe per stream). */
    /* lock_timeout: an append that waits for a stream held by an open transaction is rolled
     * back after append_lock_timeout_ms and retried off the pipeline (see pawl__log_op_done), so
     * one stuck stream does not stall the appends queued behind it to other streams. */
    snprintf(s->lock_sql, sizeof s->lock_sql, "SET lock_timeout = %d", o->append_lock_timeout_ms);
    {
        /* Appends keep the database's synchronous_commit (the user's durability choice), unless
         * they carry piggybacked finalization runs: pawl.finalize refuses a non-durable commit.
         * A piggybacked run's commit is the appends' own: on the native path it flushes at once
         * rather than wait for another session's flush (pawl.run_commit_wait). */
        const char *ms[] = {"SET application_name = 'pawl'",
                            "SET plan_cache_mode = force_generic_plan",
                            "SET default_transaction_isolation = 'read committed'",
                            "SET default_transaction_read_only = off",
                            "SET statement_timeout = 0",
                            s->lock_sql,
                            o->append_finalizes ? fin_sync_sql : NULL,
                            o->append_finalizes ? "SET pawl.run_commit_wait = 0" : NULL,
                            NULL};
        _Static_assert(sizeof ms <= sizeof s->main_session, "main_session holds the list");
        memcpy(s->main_session, ms, sizeof ms);
    }
    static const char *const listen_session[] = {"SET application_name = 'pawl listener'",
                                                 "LISTEN pawl_log", NULL};
    /* The finalizer's connection is driven by the log connections' I/O thread (a guest of
     * their pool) unless it is to have a thread of its own. */
    int hosted = o->finalizer && !o->finalizer_own_thread;
    int rc =
        new_pool(s, &s->main, "log", o->connections, s->main_session, 0, NULL, hosted, err, errlen);
    if (rc != 0)
        return rc;
    rc = new_pool(s, &s->fin, "finalizer", 1, fin_session, 2, hosted ? s->main : NULL, 0, err,
                  errlen);
    if (rc != 0)
        return rc;
    s->o.read_dsn = NULL; /* the caller's: the standby's pool keeps its own copy */
    if (o->read_dsn && o->read_dsn[0]) {
        rc = open_standby(s, dsn, o, err, errlen);
        if (rc != 0)
            return rc;
    }
    /* Followers wake by LISTEN on the primary, unless the standby is polled instead. A
     * standby refuses LISTEN (and NOTIFY is not replicated): a store opened on one (it does
     * not finalize) has no listener, and its followers find new events when they read again
     * (pawl_follow at its timeout). */
    if (o->listen && standby) {
        char d[256];
        PAWL_INFO("log",
                  "the database at %s is a standby (in recovery), which cannot LISTEN: followers "
                  "see new events when they look again, not at once (to be woken, give the "
                  "primary as the DSN and the standby as the read DSN)",
                  pawl_dsn_redact(dsn, d, sizeof d));
    }
    if (o->listen && !standby && !(s->sb && o->read_wake == PAWL_READ_WAKE_POLL)) {
        rc = new_pool(s, &s->listen, "listener", 1, listen_session, 1, NULL, 0, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Every statement of the main and the finalizer's pools, prepared (registered with the pool,
 * which prepares them on each connection). 0, or PAWL_ENOMEM. */
static int prepare_statements(struct pawl_store *s, const struct pawl_store_opts *o)
{
    static const Oid read_types[2] = {OID_INT8, OID_INT4};
    s->stmt_append = pawl__pgpool_prepare(s->main, pawl__log_append_sql, 9, pawl__log_append_types);
    static const Oid group_types[10] = {
        OID_TEXT_ARRAY, OID_INT8_ARRAY,  OID_INT4_ARRAY,  OID_INT4_ARRAY, OID_INT4_ARRAY,
        OID_TEXT_ARRAY, OID_BYTEA_ARRAY, OID_JSONB_ARRAY, OID_BOOL,       OID_TEXT_ARRAY};
    s->stmt_append_group =
        pawl__pgpool_prepare(s->main, pawl__log_append_group_sql, 10, group_types);
    s->stmt_read = pawl__pgpool_prepare(s->main, pawl__log_read_sql, 2, read_types);
    static const Oid readf_types[5] = {OID_INT8, OID_INT4, OID_TEXT_ARRAY, OID_TEXT_ARRAY,
                                       OID_TEXT_ARRAY};
    static const Oid reads_types[3] = {OID_INT8, OID_INT4, OID_TEXT};
    s->stmt_read_f = pawl__pgpool_prepare(s->main, pawl__log_read_filtered_sql, 5, readf_types);
    s->stmt_read_s = pawl__pgpool_prepare(s->main, pawl__log_read_stream_sql, 3, reads_types);
    s->stmt_last = pawl__pgpool_prepare(s->main, pawl__log_last_index_sql, 0, NULL);
    static const Oid resolve_types[5] = {0, OID_TEXT_ARRAY, OID_TEXT_ARRAY, OID_BYTEA_ARRAY,
                                         OID_INT4};
    s->stmt_resolve = pawl__pgpool_prepare(s->main, pawl__log_resolve_sql, 5, resolve_types);
    s->stmt_fin_main = pawl__pgpool_prepare(s->main, pawl__log_finalize_sql, 1, NULL);
    snprintf(s->fin_batch_text, sizeof s->fin_batch_text, "%d", o->finalize_batch_max);
    s->fin_stmt = pawl__pgpool_prepare(s->fin, pawl__log_finalize_sql, 1, NULL);
    if (s->stmt_append < 0 || s->stmt_append_group < 0 || s->stmt_read < 0 || s->stmt_last < 0 ||
        s->stmt_read_f < 0 || s->stmt_read_s < 0 || s->fin_stmt < 0 || s->stmt_resolve < 0 ||
        s->stmt_fin_main < 0)
        return PAWL_ENOMEM;
    return 0;
}

/* Free what the store holds, the pools first (their threads run callbacks on the store), then
 * the rest in reverse order of store_alloc. Every other thread of the store has stopped, or
 * never started. */
static void store_release(struct pawl_store *s)
{
    pawl__standby_free(s->sb);
    pawl__pgpool_free(s->listen);
    pawl__pgpool_free(s->fin);
    pawl__pgpool_free(s->main);
    pawl__log_direct_fini(s);
    pawl_timers_free(s->timers); /* nothing waits on them any more; their thread is joined */
    pawl__log_ops_fini(s);       /* after the timers: they may have held an op's retry timer */
    pawl_free(s->ring);
    pawl_free(s->dsn);
    pthread_cond_destroy(&s->fin_cond);
    pthread_mutex_destroy(&s->fin_mu);
    pawl__log_groups_fini(s);
    pthread_mutex_destroy(&s->grp_mu);
    pthread_cond_destroy(&s->waiters_cond);
    pthread_cond_destroy(&s->idx_cond);
    pthread_mutex_destroy(&s->idx_mu);
    pthread_cond_destroy(&s->op_cond);
    pthread_mutex_destroy(&s->op_mu);
    pthread_mutex_destroy(&s->err_mu);
    pthread_mutex_destroy(&s->cov_mu);
    pawl_free(s);
}

int pawl_store_new(struct pawl_store **out, const char *dsn, const struct pawl_store_opts *o,
                   char *err, size_t errlen)
{
    struct pawl_store_opts def;
    if (o == NULL) {
        pawl_store_opts_defaults(&def);
        o = &def;
    }
    if (err && errlen)
        err[0] = '\0';
    if (out == NULL)
        return PAWL_EINVAL;
    *out = NULL;
    int rc = check_args(dsn, o, err, errlen);
    if (rc != 0)
        return rc;
    int standby = 0;
    rc = check_database(dsn, o, &standby, err, errlen);
    if (rc != 0)
        return rc;

    struct pawl_store *s = store_alloc(o);
    if (s == NULL)
        return PAWL_ENOMEM;
    rc = PAWL_ENOMEM;
    s->grp_limit = o->connections;
    if (pawl__log_groups_init(s) != 0)
        goto fail;
    s->dsn = pawl__strdup(dsn);
    s->ring = pawl_calloc(ACK_RING, sizeof *s->ring);
    if (s->dsn == NULL || s->ring == NULL)
        goto fail;
    rc = start_timers(s, o, err, errlen);
    if (rc != 0)
        goto fail;
    rc = open_pools(s, dsn, o, standby, err, errlen);
    if (rc != 0)
        goto fail;
    rc = prepare_statements(s, o);
    if (rc != 0)
        goto fail;
    rc = pawl__log_index_load(s, err, errlen);
    if (rc != 0)
        goto fail;
    if (o->finalizer)
        pawl__log_fin_start(s);
    *out = s;
    return 0;

fail:
    store_release(s);
    return rc;
}

void pawl_store_free(struct pawl_store *s)
{
    if (s == NULL)
        return;
    PAWL_ASSERT(!pawl__pgpool_on_io_thread(NULL)); /* blocks: never on an I/O thread */
    /* Drained: every delayed retry has fired and completed (each counts in `inflight`). */
    pawl_store_drain(s);
    pawl__log_group_linger_stop(s);
    pawl__log_fin_stop(s);
    pawl__log_index_shutdown(s);
    store_release(s);
}
