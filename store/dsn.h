/*
 * dsn.h — checking and redacting PostgreSQL connection strings. Both conninfo forms are
 * accepted ("host=... dbname=..." and "postgresql://user:pass@host/db"), parsed by libpq itself
 * so that pawl accepts exactly what libpq accepts. A password never leaves this module in
 * printable form: everything that logs or reports a DSN goes through pawl_dsn_redact(), and
 * every message that may quote the DSN (libpq's parse and connection errors quote parts of it,
 * a malformed URI whole) goes through pawl__dsn_scrub(). Checking, redacting and connecting are
 * public (pawl/log.h); scrubbing is the library's own.
 */
#ifndef PAWL_STORE_DSN_H
#define PAWL_STORE_DSN_H

#include "pawl/log.h" /* pawl_dsn_check, pawl_dsn_redact, pawl_dsn_has_password, pawl_pq_connect */

#include <stddef.h>

/*
 * Copy msg into out with every secret of dsn replaced by "***": the values of password= and
 * sslpassword= (key=value form, quoted or not, as written and unescaped), and in a URI the
 * password of the userinfo part and of ?password= (as written and percent-decoded). Works on
 * DSNs libpq refuses too (found by scanning, not by libpq's parser). Always NUL-terminates;
 * a message cut short by outlen never ends in part of a secret. Returns out.
 */
char *pawl__dsn_scrub(const char *dsn, const char *msg, char *out, size_t outlen);

#endif
