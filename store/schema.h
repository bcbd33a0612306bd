/*
 * schema.h — the SQL migrations embedded in the library (generated from sql/NNN_*.sql by
 * sql/embed.cmake) and the migration runner behind pawl_schema_migrate.
 *
 * Versions are the numbers the files start with; they only ever grow. A database at version V
 * has had every migration <= V applied, each in its own transaction together with the row that
 * records it in pawl.schema_version.
 */
#ifndef PAWL_STORE_SCHEMA_H
#define PAWL_STORE_SCHEMA_H

#include <stddef.h>

struct pawl_migration {
    int version;
    const char *name;
    const char *sql;
};

/* Sorted by version; terminated by an entry with version 0. */
extern const struct pawl_migration pawl_migrations[];
extern const int pawl_migrations_count;

/* sql/native/activate.sql and deactivate.sql: the native path's switches (see schema.c). */
extern const char pawl_native_activate_sql[];
extern const char pawl_native_deactivate_sql[];

/* The highest version this library knows. */
int pawl__schema_lib_version(void);

/* pawl_schema_migrate, stopping at version target (tests build older schemas with it to check
 * upgrades). A database already past target is left as it is. */
int pawl__schema_migrate_to(const char *dsn, int target, char *err, size_t errlen);

/*
 * One connection to dsn: the database's schema version into *dbv and whether it is a standby
 * (in recovery) into *standby, each only when its pointer is not NULL. PAWL_ECONN/PAWL_ESQL
 * when it cannot tell.
 */
int pawl__schema_probe(const char *dsn, int *dbv, int *standby, char *err, size_t errlen);

/* Write into err that `what` needs the primary and dsn names a standby; returns PAWL_EINVAL. */
int pawl__schema_standby_error(const char *dsn, const char *what, char *err, size_t errlen);

/*
 * 0 when the database at dsn takes writes; pawl__schema_standby_error's PAWL_EINVAL when it is a
 * standby; PAWL_ECONN/PAWL_ESQL when it cannot tell. For what cannot work on a standby
 * (migrations, finalization, claims and tokens), so that a DSN naming a standby by mistake is
 * refused at once, plainly.
 */
int pawl__schema_check_primary(const char *dsn, const char *what, char *err, size_t errlen);

#endif
