/*
 * pawl/config.h — the flag table: every tunable of pawl by name, as text.
 *
 * struct pawl_config aggregates the option structs of the modules (logging, store, processor)
 * and the `pawl` tool's own settings. The table (engine/config.c) has one row per flag — name,
 * type, default, allowed range, help, the tool subcommands it applies to, and where it lives in
 * struct pawl_config — in the style of nginx's command table and Redis's standardConfig. The
 * store's and the processor's rows are expanded from their tunable lists (PAWL_STORE_TUNABLES,
 * PAWL_PROCESSOR_TUNABLES), which also give those modules their defaults and range checks. From
 * the table come: the defaults (pawl_config_defaults), typed parsing with range checks
 * (pawl_config_set), printing (pawl_config_get), the tool's `--flag value` and `PAWL_FLAG`
 * environment handling, and its generated help.
 *
 * A flag named "batch-size" is also accepted as "batch_size"; its environment variable is
 * PAWL_BATCH_SIZE. The library never reads argv or the environment itself: only the tool does,
 * and embedders pass a struct pawl_config (or the module structs inside it) that they filled.
 *
 * Ownership: strings set through pawl_config_set are copied and owned by the config until
 * pawl_config_fini or the next set of the same flag; strings an embedder assigns directly stay
 * the embedder's. Defaults point at static strings. An empty string stores NULL ("not set").
 *
 * Threads: a config is plain data; use one from one thread at a time. The table is immutable.
 */
#ifndef PAWL_CONFIG_H
#define PAWL_CONFIG_H

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

/*
 * Setting or action. A setting says how pawl works (connection, tuning, logging, a node's
 * processor and handler) and may come from the environment (PAWL_NAME) as well as the command
 * line. An action says what this one invocation does or which object it changes: whether to
 * change anything (execute), where to (to, segment), what to read or generate and when to stop
 * (generate, duration, count, from, follow, wait) and the shape of the output a script parses
 * (json, watch, metrics, csv). Actions come only from the command line: a leftover
 * PAWL_EXECUTE=1 must not turn a preview into a change, nor PAWL_JSON=1 change what a script
 * reads. pawl_config_load_env skips them; the tool warns that such a variable is ignored.
 * The processor name is a setting (a deployed node finds it in PAWL_PROCESSOR), but the commands
 * that change a processor (reset, split, merge, delete) take it only from the command line.
 */
enum pawl_flag_kind {
    PAWL_FLAG_SETTING = 0,
    PAWL_FLAG_ACTION = 1,
};

/* Which `pawl` subcommands a flag applies to (a bit set). */
enum pawl_scope {
    PAWL_SCOPE_INIT = 1u << 0,
    PAWL_SCOPE_APPEND = 1u << 1,
    PAWL_SCOPE_TAIL = 1u << 2,
    PAWL_SCOPE_RUN = 1u << 3,
    PAWL_SCOPE_STATUS = 1u << 4,
    PAWL_SCOPE_RESET = 1u << 5,
    PAWL_SCOPE_SPLIT = 1u << 6,
    PAWL_SCOPE_MERGE = 1u << 7,
    PAWL_SCOPE_DEMO = 1u << 8,
    PAWL_SCOPE_BENCH = 1u << 9,
    PAWL_SCOPE_CONFIG = 1u << 10,
    PAWL_SCOPE_DELETE = 1u << 11,
    PAWL_SCOPE_RETENTION = 1u << 12,
    PAWL_SCOPE_DEAD_LETTERS = 1u << 13,
    PAWL_SCOPE_ALL = (1u << 14) - 1,
};

enum pawl_config_source {
    PAWL_SRC_DEFAULT = 0,
    PAWL_SRC_API = 1,  /* pawl_config_set by an embedder */
    PAWL_SRC_ENV = 2,  /* PAWL_FLAG in the environment (the tool) */
    PAWL_SRC_FLAG = 3, /* --flag on the command line (the tool) */
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
    unsigned scope;             /* enum pawl_scope bits */
    size_t offset;              /* of the field in struct pawl_config */
    size_t size;                /* of that field: 1, 2, 4, 8 (integers), 8 (double), pointer */
    const char *unit;           /* for help: "events/s", "ms", ... or NULL */
    enum pawl_flag_kind kind;   /* setting (default) or action: see enum pawl_flag_kind */
};

/* The `pawl` tool's own settings; embedders can ignore them. */
struct pawl_tool_opts {
    int generate;          /* append: generate load instead of reading stdin */
    double rate;           /* append/demo: target events per second in total, 0 = as fast */
    int64_t duration_ms;   /* demo/bench/append load: how long to generate */
    int appenders;         /* demo/bench/append load: concurrent appending connections */
    int events_per_append; /* demo/bench/append load: events per append call */
    int payload_bytes;     /* demo/bench/append load: payload size of generated events */
    int streams;           /* demo/bench/append load: distinct stream ids */
    int64_t count;         /* append load: stop after this many events (0 = by duration); tail */
    int64_t from;          /* tail: start after this index (-1 = from the current head) */
    int follow;            /* tail: keep following new events */
    int json;              /* status/config/tail: JSON output */
    int64_t watch_ms;      /* status: refresh every watch_ms (0 = once) */
    int metrics;           /* status: also print the metrics snapshot */
    int execute;         /* reset/split/merge/delete/retention/dead-letters: do it (else preview) */
    int wait;            /* append: wait for the final indexes and print them */
    const char *to;      /* reset target: start | end | <index> | <ISO 8601 time>;
                            dead-letters drop: the highest index to drop */
    const char *stream;  /* dead-letters show/retry/drop: the stream */
    int segment;         /* split/merge: segment id */
    int64_t before;      /* retention: the new low-watermark (0 = show the partitions) */
    const char *archive; /* retention: write the dropped events here as JSON lines */
    int rotate;          /* retention: close the open partition first */
    int force;           /* retention: even below a processor's token */
    const char *handler; /* run: built-in handler name */
    int progress;        /* 0 auto (live on a TTY), 1 live, 2 plain lines, 3 off */
    int64_t progress_ms; /* period of plain progress lines */
    const char *csv;     /* bench: write CSV here (NULL = none) */
    /* run: handlers that write outside the database */
    int output_fsync;            /* print: fsync a regular-file stdout before storing tokens */
    int64_t exec_ack_timeout_ms; /* exec: longest wait for a batch's ack / a child's exit */
};

#define PAWL_CONFIG_MAX_FLAGS 96

struct pawl_config {
    struct {
        int level;  /* enum pawl_log_level */
        int format; /* enum pawl_log_format */
    } log;
    const char *dsn;  /* NULL: the tool's embedded default */
    int metrics_port; /* loopback HTTP port for Prometheus text, 0 = off */
    struct pawl_store_opts store;
    struct pawl_processor_opts processor;
    struct pawl_tool_opts tool;

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

/* Apply cfg's logging settings (level, format) to the process-wide logger. */
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
 * The tool's sources, as functions over arrays the caller hands in (the library itself reads no
 * environment and no argv), so they can be tested and fuzzed without the tool.
 *
 * pawl_config_load_env: for each setting, a PAWL_NAME=value entry of envp (NULL-terminated, as
 * environ) sets it with source env. Actions (PAWL_FLAG_ACTION) and other entries are ignored;
 * pawl_config_env_actions lists the action variables present, so the tool can say it ignores
 * them. Stops at the first bad value.
 *
 * pawl_config_parse_args: argv[0..argc) after the subcommand. Accepts --name value, --name=value,
 * a bare --name for booleans (never consuming the next argument), --no-name to turn a boolean
 * off, -h/--help (sets out->help), -V/--version (out->version) and "--" to end the flags. Other
 * arguments are positional. An unknown flag's message suggests the closest flag ("did you mean").
 * A flag whose scope does not include any bit of scope is refused. Source: flag. Stops at the
 * first error (PAWL_ENOTFOUND for an unknown flag, PAWL_EINVAL or PAWL_ERANGE for a bad value),
 * with a message in err. The positional pointers borrow from argv.
 */
#define PAWL_CONFIG_MAX_POSITIONAL 8
struct pawl_config_args {
    int help;
    int version; /* -V or --version */
    int npositional;
    const char *positional[PAWL_CONFIG_MAX_POSITIONAL];
};
PAWL_API int pawl_config_load_env(struct pawl_config *cfg, char *const *envp, char *err,
                                  size_t errlen);
/* The action flags set in envp (PAWL_EXECUTE=...), as "PAWL_EXECUTE, PAWL_JSON" into out ("" when
 * none); returns how many. */
PAWL_API int pawl_config_env_actions(char *const *envp, char *out, size_t outlen);
PAWL_API int pawl_config_parse_args(struct pawl_config *cfg, int argc, char *const *argv,
                                    unsigned scope, struct pawl_config_args *out, char *err,
                                    size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
