/*
 * pawl_test.c — see pawl_test.h.
 */
#include "pawl_test.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void pawl_test_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "SKIP: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(PAWL_TEST_SKIP);
}

const char *pawl_test_dsn(void)
{
    const char *dsn = getenv("PAWL_TEST_DSN");
    if (dsn == NULL || *dsn == '\0')
        pawl_test_skip("PAWL_TEST_DSN is not set (run through ctest, which starts PostgreSQL)");
    return dsn;
}

static char created_db[128];
static char created_dsn[1024];

static void drop_created_db(void)
{
    if (created_db[0] == '\0')
        return;
    char sql[256];
    snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s WITH (FORCE)", created_db);
    PGconn *c = PQconnectdb(pawl_test_dsn());
    if (PQstatus(c) == CONNECTION_OK)
        PQclear(PQexec(c, sql));
    PQfinish(c);
    created_db[0] = '\0';
}

const char *pawl_test_db_create(const char *tag)
{
    const char *base = pawl_test_dsn();
    drop_created_db();
    snprintf(created_db, sizeof created_db, "t_%s_%ld", tag, (long)getpid());
    pawl_test_db_make(base, created_db, NULL, created_dsn, sizeof created_dsn);
    static int registered;
    if (!registered) {
        atexit(drop_created_db);
        registered = 1;
    }
    return created_dsn;
}

void pawl_test_db_make(const char *base_dsn, const char *name, const char *with, char *dsn_out,
                       size_t len)
{
    pawl_test_db_drop(base_dsn, name);
    char sql[512];
    snprintf(sql, sizeof sql, "CREATE DATABASE %s %s", name, with ? with : "");
    pawl_test_exec(base_dsn, sql);
    int n = snprintf(dsn_out, len, "%s dbname=%s", base_dsn, name);
    if (n < 0 || (size_t)n >= len)
        fail_msg("the DSN of database %s does not fit in %zu bytes", name, len);
}

void pawl_test_db_drop(const char *base_dsn, const char *name)
{
    char sql[256];
    snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s WITH (FORCE)", name);
    pawl_test_exec(base_dsn, sql);
}

void pawl_test_exec(const char *dsn, const char *sql)
{
    PGconn *c = PQconnectdb(dsn);
    if (PQstatus(c) != CONNECTION_OK) {
        fail_msg("connect failed: %s", PQerrorMessage(c));
    }
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        fail_msg("%s failed: %s", sql, PQerrorMessage(c));
    }
    PQclear(r);
    PQfinish(c);
}

int64_t pawl_test_query_i64(const char *dsn, const char *sql)
{
    PGconn *c = PQconnectdb(dsn);
    if (PQstatus(c) != CONNECTION_OK)
        fail_msg("connect failed: %s", PQerrorMessage(c));
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) < 1)
        fail_msg("%s failed: %s", sql, PQerrorMessage(c));
    int64_t v = PQgetisnull(r, 0, 0) ? 0 : strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    PQfinish(c);
    return v;
}

double pawl_test_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int pawl_test_io_backend(void)
{
    const char *v = getenv("PAWL_TEST_IO_BACKEND");
    enum pawl_timer_backend b = PAWL_TIMER_BACKEND_AUTO;
    if (v && v[0] && pawl_timer_backend_parse(v, &b) != 0)
        fail_msg("PAWL_TEST_IO_BACKEND=%s: expected auto, io_uring or epoll", v);
    return (int)b;
}
