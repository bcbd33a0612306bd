/*
 * schema.c — pawl_schema_migrate and pawl_schema_version (see pawl/log.h, schema.h).
 *
 * Migration is a one-off administrative step, so it uses a plain blocking libpq connection.
 * Concurrent migrators serialize on a session advisory lock (class 'pawl', key 2) taken before
 * reading the version, so they agree: the first applies what is missing, the others find
 * nothing left to do. A database newer than this library is never touched.
 */
#include "schema.h"

#include "common.h"
#include "dsn.h"
#include "pawl/log.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIGRATE_LOCK "SELECT pg_advisory_lock(1885435756, 2)"
#define MIGRATE_UNLOCK "SELECT pg_advisory_unlock(1885435756, 2)"

int pawl__schema_lib_version(void)
{
    int v = 0;
    for (int i = 0; i < pawl_migrations_count; i++)
        if (pawl_migrations[i].version > v)
            v = pawl_migrations[i].version;
    return v;
}

static void put_err(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void put_err(char *err, size_t len, const char *fmt, ...)
{
    if (err == NULL || len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    size_t n = strlen(err);
    while (n > 0 && (err[n - 1] == '\n' || err[n - 1] == ' '))
        err[--n] = '\0';
}

static int open_conn(const char *dsn, PGconn **out, char *err, size_t errlen)
{
    char e[256];
    if (pawl_dsn_check(dsn, e, sizeof e) != 0) {
        put_err(err, errlen, "invalid DSN: %s", e);
        return PAWL_EINVAL;
    }
    PGconn *c = pawl_pq_connect(dsn, 0);
    if (PQstatus(c) != CONNECTION_OK) {
        char d[256], m[512];
        put_err(err, errlen, "cannot connect to %s: %s", pawl_dsn_redact(dsn, d, sizeof d),
                pawl__dsn_scrub(dsn, PQerrorMessage(c), m, sizeof m));
        PQfinish(c);
        return PAWL_ECONN;
    }
    *out = c;
    return 0;
}

/* Run sql; on failure write "SQLSTATE: message" into err and return PAWL_ESQL/PAWL_ECONN. */
static int run(PGconn *c, const char *sql, PGresult **keep, char *err, size_t errlen)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        const char *ss = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        put_err(err, errlen, "%s%s%s", ss ? ss : "", ss ? ": " : "", PQerrorMessage(c));
        PQclear(r);
        return PQstatus(c) == CONNECTION_OK ? PAWL_ESQL : PAWL_ECONN;
    }
    if (keep)
        *keep = r;
    else
        PQclear(r);
    return 0;
}

/* The first value of sql's first row, copied into out. */
static int first_value(PGconn *c, const char *sql, char *out, size_t outlen, char *err,
                       size_t errlen)
{
    PGresult *r = NULL;
    int rc = run(c, sql, &r, err, errlen);
    if (rc != 0)
        return rc;
    snprintf(out, outlen, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return 0;
}

/* 1 in *standby when c's server is in recovery. */
static int in_recovery(PGconn *c, int *standby, char *err, size_t errlen)
{
    char v[8];
    int rc = first_value(c, "SELECT pg_is_in_recovery()", v, sizeof v, err, errlen);
    *standby = rc == 0 && v[0] == 't';
    return rc;
}

int pawl__schema_standby_error(const char *dsn, const char *what, char *err, size_t errlen)
{
    char d[256];
    put_err(err, errlen,
            "%s needs the primary, and the database at %s is a standby (in recovery): give the "
            "primary as the DSN, and a standby as the read DSN (read_dsn, --read-dsn) to read "
            "from it",
            what, pawl_dsn_redact(dsn, d, sizeof d));
    return PAWL_EINVAL;
}

/* The database's version, 0 when pawl.schema_version does not exist. */
static int db_version(PGconn *c, int *v, char *err, size_t errlen)
{
    char out[24];
    int rc = first_value(c, "SELECT to_regclass('pawl.schema_version') IS NOT NULL", out,
                         sizeof out, err, errlen);
    if (rc != 0)
        return rc;
    *v = 0;
    if (out[0] != 't')
        return 0;
    rc = first_value(c, "SELECT coalesce(max(version), 0) FROM pawl.schema_version", out,
                     sizeof out, err, errlen);
    if (rc == 0)
        *v = (int)strtol(out, NULL, 10);
    return rc;
}

int pawl__schema_probe(const char *dsn, int *dbv, int *standby, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    PGconn *c = NULL;
    int rc = open_conn(dsn, &c, err, errlen);
    if (rc != 0)
        return rc;
    if (dbv)
        rc = db_version(c, dbv, err, errlen);
    if (rc == 0 && standby)
        rc = in_recovery(c, standby, err, errlen);
    PQfinish(c);
    return rc;
}

int pawl__schema_check_primary(const char *dsn, const char *what, char *err, size_t errlen)
{
    int standby = 0;
    int rc = pawl__schema_probe(dsn, NULL, &standby, err, errlen);
    if (rc == 0 && standby)
        rc = pawl__schema_standby_error(dsn, what, err, errlen);
    return rc;
}

int pawl_schema_version(const char *dsn, int *dbv, int *libv, char *err, size_t errlen)
{
    int v = 0;
    int rc = pawl__schema_probe(dsn, &v, NULL, err, errlen);
    if (rc == 0) {
        if (dbv)
            *dbv = v;
        if (libv)
            *libv = pawl__schema_lib_version();
    }
    return rc;
}

/* ---- the server path: native functions (pawl_native) or the portable SQL ones ---------------
 *
 * The native path is a server extension: its library in the server's folder, pawl's functions
 * declared LANGUAGE c on it by pawl_native_activate_sql (CREATE OR REPLACE keeps their owner and
 * grants; declaring a C function needs a superuser). pawl_native_deactivate_sql declares the SQL
 * versions of this library's schema again. Which one runs is read from the catalog (the languages
 * of the functions activate.sql declares), so it is never out of step with what runs. The
 * extension's version names the contract it implements: NATIVE_VERSION for this library's schema.
 */
#define NATIVE_VERSION "1.6"
/* The functions activate.sql declares in C, as active_path lists them. */
#define NATIVE_FUNCTIONS 9

const char *pawl_server_path_name(int path)
{
    switch (path) {
    case PAWL_SERVER_AUTO:
        return "auto";
    case PAWL_SERVER_NATIVE:
        return "native";
    case PAWL_SERVER_SQL:
        return "sql";
    default:
        return "?";
    }
}

/*
 * The path pawl's server functions run now: NATIVE when every function activate.sql declares is
 * the C one, SQL when none is, AUTO (neither: a database that went native before a pawl_native
 * version that has more functions, or whose switch was cut short) when some are; a switch to
 * either path then runs, as it would from the other path.
 */
static int active_path(PGconn *c, int *active, char *err, size_t errlen)
{
    char v[64];
    int rc = first_value(c,
                         "SELECT count(*) FILTER (WHERE l.lanname = 'c') || ' ' || count(*) "
                         "FROM pg_catalog.pg_proc p "
                         "JOIN pg_catalog.pg_language l ON l.oid = p.prolang "
                         "WHERE p.oid IN (pg_catalog.to_regprocedure('pawl.finalize(int4)'), "
                         "pg_catalog.to_regprocedure('pawl.runs_guard()'), "
                         "pg_catalog.to_regprocedure('pawl.events_guard()'), "
                         "pg_catalog.to_regprocedure('pawl_api.read(int8, int4)'), "
                         "pg_catalog.to_regprocedure('pawl_api.read_stream(text, int8, int4)'), "
                         "pg_catalog.to_regprocedure('pawl_api.read_filtered(int8, int4, text[], "
                         "text[], text[])'), "
                         "pg_catalog.to_regprocedure('pawl.append(text[], int8[], int4[], "
                         "int4[], text[], bytea[], jsonb[], boolean, text[])'), "
                         "pg_catalog.to_regprocedure('pawl.append_group(text[], int8[], int4[], "
                         "int4[], int4[], text[], bytea[], jsonb[], boolean, text[])'), "
                         "pg_catalog.to_regprocedure('pawl_api.runs_durable()'))",
                         v, sizeof v, err, errlen);
    if (rc != 0)
        return rc;
    char *end = NULL;
    long native = strtol(v, &end, 10);
    long found = end != v ? strtol(end, NULL, 10) : 0;
    if (found <= 0) {
        put_err(err, errlen, "the database has no pawl schema: run pawl init");
        return PAWL_ESCHEMA;
    }
    /* Native only when all NATIVE_FUNCTIONS are the C ones: a database activated by an older
     * pawl_native (pawl_api.runs_durable missing) is AUTO, and a switch brings it up to date. */
    *active = native == 0                  ? PAWL_SERVER_SQL
              : native == NATIVE_FUNCTIONS ? PAWL_SERVER_NATIVE
                                           : PAWL_SERVER_AUTO;
    return 0;
}

/* Whether native can be had here; when not, why (in why). */
static int native_available(PGconn *c, char *why, size_t whylen, char *err, size_t errlen)
{
    char v[64];
    int rc = first_value(c,
                         "SELECT coalesce((SELECT default_version FROM "
                         "pg_catalog.pg_available_extensions WHERE name = 'pawl_native'), '')",
                         v, sizeof v, err, errlen);
    if (rc != 0)
        return rc;
    if (v[0] == '\0') {
        put_err(why, whylen,
                "the server has no pawl_native extension (build and install it with `make "
                "native` as root, from sql/native)");
        return 1;
    }
    if (strcmp(v, NATIVE_VERSION) != 0) {
        put_err(why, whylen,
                "the server's pawl_native is version %s, and this pawl needs %s (install the "
                "pawl_native of this pawl)",
                v, NATIVE_VERSION);
        return 1;
    }
    rc = first_value(c, "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user", v,
                     sizeof v, err, errlen);
    if (rc != 0)
        return rc;
    if (v[0] != 't') {
        put_err(why, whylen,
                "declaring pawl's functions in C needs a superuser (run pawl init as one, once)");
        return 1;
    }
    return 0;
}

/* Switch c's database to want (AUTO resolved here); *active gets what runs afterwards. Runs
 * under the migration lock (the caller holds it). */
static int server_path_locked(PGconn *c, int want, int *active, char *err, size_t errlen)
{
    char set[32], why[256] = "";
    int rc = first_value(c, "SELECT coalesce(current_setting('pawl.server_path', true), '')", set,
                         sizeof set, err, errlen);
    if (rc != 0)
        return rc;
    int from_setting = 0;
    if (want == PAWL_SERVER_AUTO && set[0] != '\0' && strcmp(set, "auto") != 0) {
        if (strcmp(set, "sql") == 0)
            want = PAWL_SERVER_SQL;
        else if (strcmp(set, "native") == 0)
            want = PAWL_SERVER_NATIVE;
        else {
            put_err(err, errlen, "pawl.server_path is '%.20s': it must be auto, native or sql",
                    set);
            return PAWL_EINVAL;
        }
        from_setting = 1;
    }
    int now = 0;
    if ((rc = active_path(c, &now, err, errlen)) != 0)
        return rc;
    int target = want;
    if (want != PAWL_SERVER_SQL) {
        rc = native_available(c, why, sizeof why, err, errlen);
        if (rc < 0)
            return rc;
        if (rc == 1 && want == PAWL_SERVER_NATIVE) {
            put_err(err, errlen, "the native server path is not available%s: %s",
                    from_setting ? " (pawl.server_path is 'native')" : "", why);
            return PAWL_ENOTSUP;
        }
        target = rc == 1 ? PAWL_SERVER_SQL : PAWL_SERVER_NATIVE;
    }
    if (target != now) {
        char e[512];
        if ((rc = run(c, "BEGIN", NULL, err, errlen)) != 0)
            return rc;
        rc = target == PAWL_SERVER_NATIVE
                 ? run(c, "CREATE EXTENSION IF NOT EXISTS pawl_native", NULL, e, sizeof e)
                 : 0;
        if (rc == 0)
            rc = run(c,
                     target == PAWL_SERVER_NATIVE ? pawl_native_activate_sql
                                                  : pawl_native_deactivate_sql,
                     NULL, e, sizeof e);
        if (rc == 0)
            rc = run(c, "COMMIT", NULL, e, sizeof e);
        if (rc != 0) {
            PQclear(PQexec(c, "ROLLBACK"));
            if (want == PAWL_SERVER_AUTO && target == PAWL_SERVER_NATIVE) {
                PAWL_WARN("schema",
                          "server functions: could not switch to native (%s); the SQL "
                          "functions stay",
                          e);
                target = now;
            } else {
                put_err(err, errlen, "switching the server functions to %s failed: %s",
                        pawl_server_path_name(target), e);
                return rc;
            }
        }
    }
    if ((rc = active_path(c, active, err, errlen)) != 0)
        return rc;
    /* Native, the path pawl prefers, at debug; SQL once per process at info with the reason the
     * native path was not taken (pawl init prints the choice itself on stdout).
     * Relaxed: only decides whether this call logs at INFO; a duplicate line is harmless. */
    static int logged_sql;
    if (*active == PAWL_SERVER_NATIVE)
        PAWL_DEBUG("schema", "server functions: native (pawl_native %s)", NATIVE_VERSION);
    else if (*active == PAWL_SERVER_AUTO)
        PAWL_WARN("schema",
                  "server functions: partly native, partly SQL (a switch did not complete: %s); "
                  "run pawl init --server-path sql or native",
                  why[0] ? why : "see above");
    else if (why[0] &&
             atomic_exchange_explicit(PAWL_ATOMIC_OF(&logged_sql), 1, memory_order_relaxed) == 0)
        PAWL_INFO("schema", "server functions: SQL (%s)", why);
    else
        PAWL_DEBUG("schema", "server functions: SQL%s%s%s", why[0] ? " (" : "", why,
                   why[0] ? ")" : "");
    return 0;
}

int pawl_schema_server_path(const char *dsn, int want, int *active, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    int dummy = 0;
    if (active == NULL)
        active = &dummy;
    if (want != PAWL_SERVER_AUTO && want != PAWL_SERVER_NATIVE && want != PAWL_SERVER_SQL) {
        put_err(err, errlen, "server path %d: not auto, native or sql", want);
        return PAWL_EINVAL;
    }
    PGconn *c = NULL;
    int rc = open_conn(dsn, &c, err, errlen);
    if (rc != 0)
        return rc;
    int standby = 0, v = 0;
    rc = in_recovery(c, &standby, err, errlen);
    if (rc == 0 && standby)
        rc = pawl__schema_standby_error(dsn, "choosing the server functions", err, errlen);
    if (rc == 0 && (rc = run(c, MIGRATE_LOCK, NULL, err, errlen)) == 0) {
        rc = db_version(c, &v, err, errlen);
        if (rc == 0 && v != pawl__schema_lib_version()) {
            put_err(err, errlen,
                    "the database schema is version %d and this pawl's is %d: run pawl init first",
                    v, pawl__schema_lib_version());
            rc = PAWL_ESCHEMA;
        }
        if (rc == 0)
            rc = server_path_locked(c, want, active, err, errlen);
        PQclear(PQexec(c, MIGRATE_UNLOCK));
    }
    PQfinish(c);
    return rc;
}

/*
 * A migration's DDL needs strong locks on tables that appends, reads and runs use. Waiting for
 * one behind a long transaction would queue all of those behind the wait, so each try waits at
 * most MIGRATE_LOCK_TRY for a lock, rolls back and pauses for a second (the queued sessions go on
 * meanwhile), for up to MIGRATE_LOCK_BUDGET_S; the first refusal is logged with the sessions
 * holding locks on pawl's tables.
 */
#define MIGRATE_LOCK_TRY "'500ms'"
#define MIGRATE_LOCK_BUDGET_S 60

static void lock_holders(PGconn *c, char *out, size_t outlen)
{
    out[0] = '\0';
    PGresult *r = PQexec(
        c, "SELECT string_agg(DISTINCT format('pid %s (user %s, application %s, %s for %s s)', "
           "a.pid, a.usename, coalesce(nullif(a.application_name, ''), '-'), a.state, "
           "floor(extract(epoch FROM clock_timestamp() - coalesce(a.xact_start, a.query_start)))), "
           "'; ') FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid "
           "JOIN pg_catalog.pg_class k ON k.oid = l.relation "
           "WHERE l.granted AND l.pid <> pg_backend_pid() AND l.locktype = 'relation' "
           "AND k.relnamespace IN (SELECT n.oid FROM pg_catalog.pg_namespace n "
           "WHERE n.nspname IN ('pawl', 'pawl_api', 'pawl_locks'))");
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
        snprintf(out, outlen, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
}

/*
 * BEGIN, then the migration's SQL, with the bounded lock wait above. Returns 0 with the
 * transaction open, 1 when the locks could not be had in time (err names the holders; nothing
 * applied), or PAWL_ESQL / PAWL_ECONN (err set; the transaction rolled back).
 */
static int migrate_one_locking(PGconn *c, const struct pawl_migration *m, char *err, size_t errlen)
{
    char holders[1024] = "";
    PQclear(PQexec(c, "SET lock_timeout = " MIGRATE_LOCK_TRY));
    for (int tries = 0;; tries++) {
        int rc = run(c, "BEGIN", NULL, err, errlen);
        if (rc != 0)
            return rc;
        rc = run(c, m->sql, NULL, err, errlen);
        if (rc == 0 || strncmp(err, "55P03", 5) != 0) {
            if (rc != 0)
                PQclear(PQexec(c, "ROLLBACK"));
            PQclear(PQexec(c, "RESET lock_timeout"));
            return rc;
        }
        PQclear(PQexec(c, "ROLLBACK"));
        lock_holders(c, holders, sizeof holders);
        if (tries == 0)
            PAWL_WARN("schema",
                      "migration %s waits for locks on pawl's tables, held by %s; appends and "
                      "reads go on meanwhile (trying for up to %d s)",
                      m->name, holders[0] ? holders : "a session that has ended",
                      MIGRATE_LOCK_BUDGET_S);
        if (tries >= MIGRATE_LOCK_BUDGET_S) {
            PQclear(PQexec(c, "RESET lock_timeout"));
            put_err(err, errlen,
                    "could not take its locks within %d s: held by %s (end or commit those "
                    "transactions, then run it again)",
                    MIGRATE_LOCK_BUDGET_S, holders[0] ? holders : "sessions that have ended");
            return 1;
        }
        struct timespec ts = {0, 500 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static int migrate(const char *dsn, int target, int want, int *active, char *err, size_t errlen);

int pawl_schema_migrate(const char *dsn, char *err, size_t errlen)
{
    return migrate(dsn, pawl__schema_lib_version(), PAWL_SERVER_AUTO, NULL, err, errlen);
}

int pawl_schema_migrate_path(const char *dsn, int want, int *active, char *err, size_t errlen)
{
    if (want != PAWL_SERVER_AUTO && want != PAWL_SERVER_NATIVE && want != PAWL_SERVER_SQL) {
        put_err(err, errlen, "server path %d is not auto, native or sql", want);
        return PAWL_EINVAL;
    }
    return migrate(dsn, pawl__schema_lib_version(), want, active, err, errlen);
}

int pawl__schema_migrate_to(const char *dsn, int target, char *err, size_t errlen)
{
    return migrate(dsn, target, PAWL_SERVER_AUTO, NULL, err, errlen);
}

/* The migrations up to target; at this library's version, then the server path want (the
 * path now active in *active, when not NULL). */
static int migrate(const char *dsn, int target, int want, int *active, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    PGconn *c = NULL;
    int rc = open_conn(dsn, &c, err, errlen);
    if (rc != 0)
        return rc;
    int standby = 0;
    rc = in_recovery(c, &standby, err, errlen);
    if (rc == 0 && standby)
        rc = pawl__schema_standby_error(dsn, "creating or upgrading the schema", err, errlen);
    if (rc != 0)
        goto out;
    /* Quiet NOTICEs from IF NOT EXISTS. */
    PQclear(PQexec(c, "SET client_min_messages = warning"));
    rc = run(c, MIGRATE_LOCK, NULL, err, errlen);
    if (rc != 0)
        goto out;
    rc = run(c,
             "CREATE SCHEMA IF NOT EXISTS pawl; "
             "CREATE TABLE IF NOT EXISTS pawl.schema_version ("
             " version int4 PRIMARY KEY, name text NOT NULL,"
             " applied_at timestamptz NOT NULL DEFAULT now())",
             NULL, err, errlen);
    if (rc != 0)
        goto unlock;
    int v = 0;
    rc = db_version(c, &v, err, errlen);
    if (rc != 0)
        goto unlock;
    int lib = pawl__schema_lib_version();
    if (v > lib) {
        put_err(err, errlen,
                "the database schema is version %d, newer than this pawl (which knows up to "
                "version %d): upgrade pawl",
                v, lib);
        rc = PAWL_ESCHEMA;
        goto unlock;
    }
    for (int i = 0; i < pawl_migrations_count; i++) {
        const struct pawl_migration *m = &pawl_migrations[i];
        if (m->version <= v || m->version > target)
            continue;
        char e[512];
        rc = migrate_one_locking(c, m, e, sizeof e);
        if (rc == 1) {
            put_err(err, errlen, "migration %s failed: %s", m->name, e);
            rc = PAWL_EBUSY;
            goto unlock;
        }
        if (rc == 0) {
            const char *vals[2];
            char vb[16];
            snprintf(vb, sizeof vb, "%d", m->version);
            vals[0] = vb;
            vals[1] = m->name;
            PGresult *r = PQexecParams(c,
                                       "INSERT INTO pawl.schema_version (version, name) "
                                       "VALUES ($1::int4, $2)",
                                       2, NULL, vals, NULL, NULL, 0);
            if (PQresultStatus(r) != PGRES_COMMAND_OK) {
                snprintf(e, sizeof e, "%s", PQerrorMessage(c));
                rc = PAWL_ESQL;
            }
            PQclear(r);
        }
        if (rc != 0) {
            PQclear(PQexec(c, "ROLLBACK"));
            put_err(err, errlen, "migration %s failed: %s", m->name, e);
            goto unlock;
        }
        if ((rc = run(c, "COMMIT", NULL, err, errlen)) != 0)
            goto unlock;
        PAWL_DEBUG("schema", "applied migration %s", m->name); /* pawl init sums them up */
    }
    rc = 0;
    if (target >= pawl__schema_lib_version()) {
        int now = 0;
        rc = server_path_locked(c, want, &now, err, errlen);
        if (active)
            *active = now;
    }
unlock:
    PQclear(PQexec(c, MIGRATE_UNLOCK));
out:
    PQfinish(c);
    return rc;
}
