/*
 * dsn.h — checking and redacting PostgreSQL connection strings. Both conninfo forms are
 * accepted ("host=... dbname=..." and "postgresql://user:pass@host/db"), parsed by libpq itself
 * so that pawl accepts exactly what libpq accepts. A password never leaves this module in
 * printable form: everything that logs or reports a DSN goes through pawl_dsn_redact(), and
 * every message that may quote the DSN (libpq's parse and connection errors quote parts of it,
 * a malformed URI whole) goes through pawl_dsn_scrub().
 */
#ifndef PAWL_STORE_DSN_H
#define PAWL_STORE_DSN_H

#include <stddef.h>

/*
 * Check that dsn parses. On failure returns PAWL_EINVAL and writes libpq's reason into err,
 * scrubbed (pawl_dsn_scrub): libpq quotes the malformed part, which may be the password. err
 * may be NULL.
 */
int pawl_dsn_check(const char *dsn, char *err, size_t errlen);

/*
 * Write a printable form of dsn into out: every keyword that was set, in key=value form, with
 * the password replaced by "***". Always NUL-terminates (when outlen > 0); an unparsable dsn
 * prints as "<invalid dsn>"; the empty dsn (libpq's environment and defaults) prints as the
 * values libpq would use, password hidden. Returns out.
 */
char *pawl_dsn_redact(const char *dsn, char *out, size_t outlen);

/*
 * Copy msg into out with every secret of dsn replaced by "***": the values of password= and
 * sslpassword= (key=value form, quoted or not, as written and unescaped), and in a URI the
 * password of the userinfo part and of ?password= (as written and percent-decoded). Works on
 * DSNs libpq refuses too (found by scanning, not by libpq's parser). Always NUL-terminates;
 * a message cut short by outlen never ends in part of a secret. Returns out.
 */
char *pawl_dsn_scrub(const char *dsn, const char *msg, char *out, size_t outlen);

/* 1 when dsn carries a password (password= or sslpassword=, a URI's userinfo or query), else 0. */
int pawl_dsn_has_password(const char *dsn);

/*
 * Open a libpq connection to dsn with the settings every pawl connection fixes, whatever the DSN,
 * libpq's environment or the database's defaults say: client_encoding UTF8. Stream ids, types and
 * metadata are UTF-8 text; under another client encoding (PGCLIENTENCODING=LATIN1, say) the
 * server converts them, so a stream appended by pawl and the same stream appended in SQL would
 * be two streams, and text read back would not be UTF-8. start: begin a non-blocking connection
 * (PQconnectStartParams) instead of connecting (PQconnectdbParams). NULL only when out of memory.
 */
struct pg_conn *pawl_pq_connect(const char *dsn, int start);

#endif
