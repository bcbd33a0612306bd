/*
 * dsn.h — checking and redacting PostgreSQL connection strings. Both conninfo forms are
 * accepted ("host=... dbname=..." and "postgresql://user:pass@host/db"), parsed by libpq itself
 * so that pawl accepts exactly what libpq accepts. A password never leaves this module in
 * printable form: everything that logs or reports a DSN goes through pawl_dsn_redact().
 */
#ifndef PAWL_STORE_DSN_H
#define PAWL_STORE_DSN_H

#include <stddef.h>

/*
 * Check that dsn parses. On failure returns PAWL_EINVAL and writes libpq's reason (which never
 * echoes a password) into err. err may be NULL.
 */
int pawl_dsn_check(const char *dsn, char *err, size_t errlen);

/*
 * Write a printable form of dsn into out: every keyword that was set, in key=value form, with
 * the password replaced by "***". Always NUL-terminates (when outlen > 0); an unparsable dsn
 * prints as "<invalid dsn>". Returns out.
 */
char *pawl_dsn_redact(const char *dsn, char *out, size_t outlen);

#endif
