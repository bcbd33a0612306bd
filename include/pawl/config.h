/*
 * pawl/config.h — pawl's tunables by name, as text: a flag table and its typed parser.
 *
 * struct pawl_config aggregates the option structs of the library (logging, the DSN, the store,
 * the processor). The table (store/config.c) has one row per flag: name, type, default, allowed
 * range, help, and where it lives in struct pawl_config, in the style of nginx's command table
 * and Redis's standardConfig. The store's and the processor's rows are expanded from their
 * tunable lists (PAWL_STORE_TUNABLES in pawl/log.h, PAWL_PROCESSOR_TUNABLES in
 * pawl/processor.h), which also give those modules their defaults and range checks. From the
 * table come the defaults (pawl_config_defaults), typed parsing with range checks
 * (pawl_config_set), printing (pawl_config_get) and PAWL_FLAG environment handling
 * (pawl_config_load_env). The pawl_flag_* functions apply one row to any struct, so a program
 * can keep a table of its own settings next to pawl's (the `pawl` tool does).
 *
 * A flag named "batch-size" is also accepted as "batch_size"; its environment variable is
 * PAWL_BATCH_SIZE. The library never reads argv or the environment itself: embedders pass a
 * struct pawl_config (or the module structs inside it) that they filled.
 *
 * Ownership: strings set through pawl_config_set are copied and owned by the config until
 * pawl_config_fini or the next set of the same flag; strings an embedder assigns directly stay
 * the embedder's. Defaults point at static strings. An empty string stores NULL ("not set").
 *
 * Threads: a config is plain data; use one from one thread at a time. The table is immutable.
 */
#ifndef PAWL_CONFIG_H
#define PAWL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pawl/common.h"
#include "pawl/log.h"
#include "pawl/processor.h"

#ifdef __cplusplus
extern "C" {
#endif

enum pawl_flag_type {
    PAWL_FLAG_BOOL,     /* true/false, yes/no, on/off, 1/0 */
    PAWL_FLAG_INT,      /* decimal integer within [min, max] */
    PAWL_FLAG_DOUBLE,   /* decimal number within [dmin, dmax] */
    PAWL_FLAG_DURATION, /* milliseconds, always with a unit: "250ms", "10s", "1.5s", "2m",
                           "1h", "1m30s"; a bare number other than 0 is refused */
    PAWL_FLAG_STRING,   /* any text (max bytes in max, 0 = unlimited) */
    PAWL_FLAG_ENUM,     /* one of choices[] */
};

enum pawl_config_source {
    PAWL_SRC_DEFAULT = 0,
    PAWL_SRC_API = 1,  /* pawl_config_set by an embedder */
    PAWL_SRC_ENV = 2,  /* PAWL_FLAG in the environment */
    PAWL_SRC_FLAG = 3, /* --flag on a command line */
};

/* One entry of the table. Static and immutable; pointers stay valid for the process. */
struct pawl_flag {
    const char *name; /* "batch-size" */
    enum pawl_flag_type type;
    int64_t def;                /* the default: BOOL (0, 1), INT, DURATION (ms), ENUM (index) */
    double ddef;                /* DOUBLE's default */
    const char *sdef;           /* STRING's default; NULL: not set */
    int64_t min, max;           /* INT and DURATION (ms) range; STRING: max length (0: none) */
    double dmin, dmax;          /* DOUBLE range */
    const char *const *choices; /* ENUM: NULL-terminated names; value = index */
    const char *help;           /* one line */
    size_t offset;              /* of the field in struct pawl_config (or the caller's struct) */
    size_t size;                /* of that field: 1, 2, 4, 8 (integers), 8 (double), pointer */
    const char *unit;           /* for help: "events/s", "ms", ... or NULL */
};

#define PAWL_CONFIG_MAX_FLAGS 96

struct pawl_config {
    struct {
        int level;  /* enum pawl_log_level */
        int format; /* enum pawl_log_format */
    } log;
    const char *dsn; /* the store's connection string; NULL: not set */
    struct pawl_store_opts store;
    struct pawl_processor_opts processor;

    /* private: where each flag's value came from, and which strings the config owns */
    unsigned char _source[PAWL_CONFIG_MAX_FLAGS];
    unsigned char _owned[PAWL_CONFIG_MAX_FLAGS];
};

/* Fill cfg with every flag's default (source: default). Never fails. */
PAWL_API void pawl_config_defaults(struct pawl_config *cfg);

/* Free the strings cfg owns; cfg must be filled again before reuse. NULL is a no-op. */
PAWL_API void pawl_config_fini(struct pawl_config *cfg);

/*
 * Parse value for the flag name and store it (source: API). On a wrong name, type or range,
 * returns PAWL_ENOTFOUND (unknown flag), PAWL_EINVAL (does not parse) or PAWL_ERANGE, leaves cfg
 * unchanged and writes a message naming the flag, the value and what is allowed into err
 * (may be NULL). value NULL is PAWL_EINVAL.
 */
PAWL_API int pawl_config_set(struct pawl_config *cfg, const char *name, const char *value,
                             char *err, size_t errlen);

/* pawl_config_set recording where the value came from. */
PAWL_API int pawl_config_set_from(struct pawl_config *cfg, const char *name, const char *value,
                                  enum pawl_config_source source, char *err, size_t errlen);

/*
 * Print the current value of a flag into out as text pawl_config_set accepts (durations as
 * "<n>ms", strings verbatim, NULL strings as ""). PAWL_ENOTFOUND for an unknown name;
 * PAWL_ETOOBIG if out is too small (out holds a truncated value).
 */
PAWL_API int pawl_config_get(const struct pawl_config *cfg, const char *name, char *out,
                             size_t outlen);

/* Where the flag's value came from; PAWL_SRC_DEFAULT for an unknown name. */
PAWL_API enum pawl_config_source pawl_config_source_of(const struct pawl_config *cfg,
                                                       const char *name);
PAWL_API const char *pawl_config_source_name(enum pawl_config_source s); /* "default", "env", ... */

/*
 * Check every field against the table (for values an embedder assigned directly). Returns 0 or
 * the first failure's code with its message in err.
 */
PAWL_API int pawl_config_check(const struct pawl_config *cfg, char *err, size_t errlen);

/* Apply cfg's logging settings (level, format) to the process-wide logger. cfg's log-level
 * defaults to info, the pawl tool's level; the logger's own default, without this call, is warn. */
PAWL_API void pawl_config_apply_log(const struct pawl_config *cfg);

/*
 * Parse a duration as the table does: one or more <number><unit> parts, units ms, s, m (or min),
 * h, e.g. "250ms", "10s", "1.5s", "2m", "1h", "1m30s", "1h2m3.5s"; the total must be a whole
 * number of milliseconds. "0" alone needs no unit; any other bare number is PAWL_EINVAL (a bare
 * number used to mean milliseconds, which surprised everyone). A leading '-' negates the whole.
 * PAWL_EINVAL or PAWL_ERANGE on failure.
 */
PAWL_API int pawl_config_parse_duration(const char *text, int64_t *ms);

/* The table: iterate with i from 0 to pawl_config_flag_count() - 1. */
PAWL_API size_t pawl_config_flag_count(void);
PAWL_API const struct pawl_flag *pawl_config_flag_at(size_t i);
/* By name ("batch-size" or "batch_size"); NULL if there is none. */
PAWL_API const struct pawl_flag *pawl_config_flag_find(const char *name);
/* Its environment variable ("PAWL_BATCH_SIZE") into out; returns out. */
PAWL_API char *pawl_config_flag_env(const struct pawl_flag *f, char *out, size_t outlen);
/* Its default as text pawl_config_set accepts ("1s", "true", "" for no string); returns out. */
PAWL_API char *pawl_config_flag_default(const struct pawl_flag *f, char *out, size_t outlen);
/* A readable description of what the flag accepts ("an integer in [1, 100000]"); returns out. */
PAWL_API char *pawl_config_flag_allowed(const struct pawl_flag *f, char *out, size_t outlen);

/*
 * For each flag, a PAWL_NAME=value entry of envp (NULL-terminated, as environ) sets it with
 * source env; other entries are ignored. Stops at the first bad value, with a message naming
 * the variable and the flag in err.
 */
PAWL_API int pawl_config_load_env(struct pawl_config *cfg, char *const *envp, char *err,
                                  size_t errlen);

/*
 * One row applied to any struct: base is the struct f->offset is relative to. pawl_flag_set
 * parses and range-checks value as pawl_config_set does (source labels the message: env names
 * the variable) and stores it; a string is copied unless source is PAWL_SRC_DEFAULT, *owned
 * says whether the field holds such a copy (start at 0; freed by the next set or
 * pawl_flag_fini). pawl_flag_set_default stores the row's default; pawl_flag_get prints as
 * pawl_config_get; pawl_flag_check checks the field's current value as pawl_config_check.
 */
PAWL_API int pawl_flag_set(const struct pawl_flag *f, void *base, const char *value,
                           enum pawl_config_source source, unsigned char *owned, char *err,
                           size_t errlen);
PAWL_API void pawl_flag_set_default(const struct pawl_flag *f, void *base, unsigned char *owned);
PAWL_API void pawl_flag_fini(const struct pawl_flag *f, void *base, unsigned char *owned);
PAWL_API int pawl_flag_get(const struct pawl_flag *f, const void *base, char *out, size_t outlen);
PAWL_API int pawl_flag_check(const struct pawl_flag *f, const void *base, char *err, size_t errlen);
/* Whether name names f: '_' stands for '-', any case ("batch_size", "BATCH-SIZE"). */
PAWL_API bool pawl_flag_named(const struct pawl_flag *f, const char *name);

#ifdef __cplusplus
}
#endif
#endif
