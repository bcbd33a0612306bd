/*
 * pawl_test.h — helpers shared by the test executables: cmocka includes, skipping (exit 77),
 * and private databases on the test PostgreSQL so that tests running in parallel never share
 * tables.
 */
#ifndef PAWL_TEST_H
#define PAWL_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* After the headers above: cmocka.h uses their types without including them. */
#include <cmocka.h>

#include "pawl.h"

#define PAWL_TEST_SKIP 77

/* Print why and exit 77 (CTest reports the test as skipped). */
void pawl_test_skip(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* The DSN of the private test PostgreSQL (env PAWL_TEST_DSN); skips the test when unset. */
const char *pawl_test_dsn(void);

/*
 * Create a fresh database named after tag and this process, and return its DSN (static
 * storage, valid until the next call). The database is dropped when the process exits normally.
 */
const char *pawl_test_db_create(const char *tag);

/*
 * Create database name (dropping a leftover of that name first) through base_dsn, with `with`
 * appended to CREATE DATABASE (NULL: nothing), and write its DSN, base_dsn + " dbname=name", to
 * dsn_out (the test fails if it does not fit). The caller drops it with pawl_test_db_drop.
 */
void pawl_test_db_make(const char *base_dsn, const char *name, const char *with, char *dsn_out,
                       size_t len);

/* Drop database name, if it exists, through base_dsn. */
void pawl_test_db_drop(const char *base_dsn, const char *name);

/* Run sql on dsn with a plain blocking libpq connection; fails the test on error. */
void pawl_test_exec(const char *dsn, const char *sql);

/* Run a query returning one int64 (the first column of the first row); fails on error. */
int64_t pawl_test_query_i64(const char *dsn, const char *sql);

/*
 * The I/O loop backend the test run asks for (env PAWL_TEST_IO_BACKEND: "auto", "io_uring" or
 * "epoll"; unset: auto), as an enum pawl_timer_backend. make test runs some store tests a second
 * time with the epoll fallback forced. An unknown value fails the test.
 */
int pawl_test_io_backend(void);

/* Milliseconds of monotonic time, for tests that time things. */
double pawl_test_now_ms(void);

#endif
