/*
 * tool_config.h — the `pawl` tool's flags: pawl's flag table (pawl/config.h) plus the tool's own
 * settings and actions, each with the subcommands it applies to.
 *
 * struct tool_config holds the library's struct pawl_config (logging, the DSN, the store, the
 * processor) and the tool's own settings. The tool_config_* functions behave as their
 * pawl_config_* namesakes over all of the tool's flags; the order of tool_flag_at is the order
 * of the generated help. Precedence: defaults < PAWL_* environment < --flags.
 */
#ifndef PAWL_TOOL_CONFIG_H
#define PAWL_TOOL_CONFIG_H

#include "pawl.h"

#include <stddef.h>
#include <stdint.h>

/*
 * Setting or action. A setting says how pawl works (connection, tuning, logging, a node's
 * processor and handler) and may come from the environment (PAWL_NAME) as well as the command
 * line. An action says what this one invocation does or which object it changes: whether to
 * change anything (execute), where to (to, segment), what to read or generate and when to stop
 * (generate, duration, count, from, follow, wait) and the shape of the output a script parses
 * (json, watch, metrics, csv). Actions come only from the command line: a leftover
 * PAWL_EXECUTE=1 must not turn a preview into a change, nor PAWL_JSON=1 change what a script
 * reads. tool_config_load_env skips them; the tool warns that such a variable is ignored.
 * The processor name is a setting (a deployed node finds it in PAWL_PROCESSOR), but the commands
 * that change a processor (reset, split, merge, delete) take it only from the command line.
 */
enum tool_flag_kind {
    TOOL_FLAG_SETTING = 0,
    TOOL_FLAG_ACTION = 1,
};

/* Which `pawl` subcommands a flag applies to (a bit set). */
enum tool_scope {
    TOOL_SCOPE_INIT = 1u << 0,
    TOOL_SCOPE_APPEND = 1u << 1,
    TOOL_SCOPE_TAIL = 1u << 2,
    TOOL_SCOPE_RUN = 1u << 3,
    TOOL_SCOPE_STATUS = 1u << 4,
    TOOL_SCOPE_RESET = 1u << 5,
    TOOL_SCOPE_SPLIT = 1u << 6,
    TOOL_SCOPE_MERGE = 1u << 7,
    TOOL_SCOPE_DEMO = 1u << 8,
    TOOL_SCOPE_BENCH = 1u << 9,
    TOOL_SCOPE_CONFIG = 1u << 10,
    TOOL_SCOPE_DELETE = 1u << 11,
    TOOL_SCOPE_RETENTION = 1u << 12,
    TOOL_SCOPE_DEAD_LETTERS = 1u << 13,
    TOOL_SCOPE_ALL = (1u << 14) - 1,
};

/* The tool's own settings and actions. */
struct tool_opts {
    int quiet;             /* every command: as --log-level warn, unless --log-level is given */
    int generate;          /* append: generate load instead of reading stdin */
    double rate;           /* append/demo: target events per second in total, 0 = as fast */
    int64_t duration_ms;   /* demo/bench/append load: how long to generate */
    int appenders;         /* demo/bench/append load: concurrent appending connections */
    int events_per_append; /* demo/bench/append load: events per append call */
    int payload_bytes;     /* demo/bench/append load: payload size of generated events */
    int streams;           /* demo/bench/append load: distinct stream ids */
    int64_t count;         /* append load: stop after this many events (0 = by duration); tail */
    const char *from;      /* tail: the position to print after (position.h) */
    int follow;            /* tail: keep following new events */
    int json;              /* status/config/tail: JSON output */
    int64_t watch_ms;      /* status: refresh every watch_ms (0 = once) */
    int metrics;           /* status: also print the metrics snapshot */
    int execute;        /* reset/split/merge/delete/retention/dead-letters: do it (else preview) */
    int wait;           /* append: wait for the final indexes and print them */
    const char *to;     /* reset target: start | end | <index> | <ISO 8601 time>;
                           dead-letters drop: the highest index to drop */
    const char *stream; /* dead-letters show/retry/drop: the stream; tail: the stream to read */
    const char *categories; /* tail/run/reset: the filter's lists, comma-separated */
    const char *stream_prefixes;
    const char *types;
    int no_filter;       /* reset: drop the processor's filter */
    int segment;         /* split/merge: segment id */
    const char *before;  /* retention: the new low-watermark, an index or a position (NULL or
                            "0": show the partitions) */
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
    int exec_pass_secrets;       /* exec: leave PGPASSWORD and PAWL_*DSN in the command's env */
    int64_t stop_db_wait_ms;     /* run: while stopping, the longest wait for an absent database */
    int server_path;             /* init: an enum pawl_server_path (0 auto, 1 native, 2 sql) */
    const char *initial_token;   /* run: where a new processor starts, a position (position.h);
                                    resolved into lib.processor.initial_token */
};

#define TOOL_MAX_FLAGS 96

struct tool_config {
    struct pawl_config lib; /* the library's flags */
    int metrics_port;       /* loopback HTTP port for Prometheus text, 0 = off */
    struct tool_opts tool;
    /* Not a flag: set by main from tool_config_args.dashdash, how many of the command's
     * positional arguments came before "--" (-1: there was no "--"). run takes its processor
     * name before it and the exec command after it. */
    int dashdash;

    /* private: for the tool's own flags, where each value came from and which strings the
     * config owns (by index in the tool's table) */
    unsigned char _source[TOOL_MAX_FLAGS];
    unsigned char _owned[TOOL_MAX_FLAGS];
};

void tool_config_defaults(struct tool_config *cfg);
void tool_config_fini(struct tool_config *cfg);
int tool_config_set(struct tool_config *cfg, const char *name, const char *value, char *err,
                    size_t errlen);
int tool_config_set_from(struct tool_config *cfg, const char *name, const char *value,
                         enum pawl_config_source source, char *err, size_t errlen);
int tool_config_get(const struct tool_config *cfg, const char *name, char *out, size_t outlen);
enum pawl_config_source tool_config_source_of(const struct tool_config *cfg, const char *name);
int tool_config_check(const struct tool_config *cfg, char *err, size_t errlen);
void tool_config_apply_log(const struct tool_config *cfg);
/* --quiet (-q): sets the log level to warn, with --quiet's source, unless the log level came from
 * a source as explicit (an environment variable against PAWL_QUIET, a flag against --quiet).
 * Returns 1 when it did: the tool's info-level notes are then not shown either. */
int tool_config_resolve_quiet(struct tool_config *cfg);

/* The table: every flag of the tool, library flags and the tool's own, in help order. */
size_t tool_flag_count(void);
const struct pawl_flag *tool_flag_at(size_t i);
const struct pawl_flag *tool_flag_find(const char *name); /* "batch-size" or "batch_size" */
unsigned tool_flag_scope(const struct pawl_flag *f);      /* enum tool_scope bits; 0: not ours */
enum tool_flag_kind tool_flag_kind(const struct pawl_flag *f);
/* Whether f takes a position in the log (position.h): tail --from, run --initial-token, reset
 * --to, retention --before. Kept as text; each command parses and resolves it. */
int tool_flag_is_position(const struct pawl_flag *f);

/*
 * The tool's sources, as functions over arrays main hands in, so they can be tested and fuzzed
 * without main.
 *
 * tool_config_load_env: for each setting, a PAWL_NAME=value entry of envp (NULL-terminated, as
 * environ) sets it with source env. Actions (TOOL_FLAG_ACTION) and other entries are ignored;
 * tool_config_env_actions lists the action variables present, so the tool can say it ignores
 * them. Stops at the first bad value.
 *
 * tool_config_parse_args: argv[0..argc) after the subcommand. Accepts --name value, --name=value,
 * a bare --name for booleans (never consuming the next argument), --no-name to turn a boolean
 * off, -h/--help (sets out->help), -V/--version (out->version), -q (--quiet) and "--" to end the
 * flags. Other
 * arguments are positional. An unknown flag's message suggests the closest flag ("did you mean").
 * A flag whose scope does not include any bit of scope is refused. Source: flag. Stops at the
 * first error (PAWL_ENOTFOUND for an unknown flag, PAWL_EINVAL or PAWL_ERANGE for a bad value),
 * with a message in err. The positional pointers borrow from argv.
 */
#define TOOL_MAX_POSITIONAL 8
struct tool_config_args {
    int help;
    int version;  /* -V or --version */
    int dashdash; /* how many positional arguments came before "--"; -1: no "--" */
    int npositional;
    const char *positional[TOOL_MAX_POSITIONAL];
};
int tool_config_load_env(struct tool_config *cfg, char *const *envp, char *err, size_t errlen);
/* The action flags set in envp (PAWL_EXECUTE=...), as "PAWL_EXECUTE, PAWL_JSON" into out ("" when
 * none); returns how many. */
int tool_config_env_actions(char *const *envp, char *out, size_t outlen);
int tool_config_parse_args(struct tool_config *cfg, int argc, char *const *argv, unsigned scope,
                           struct tool_config_args *out, char *err, size_t errlen);

#endif
