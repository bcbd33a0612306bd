/*
 * tool.h — declarations shared by the files of the `pawl` command-line tool.
 *
 * The tool is the only part of pawl that reads argv and the environment. main.c parses the
 * subcommand and its flags into a struct pawl_config (defaults < PAWL_* environment < --flags),
 * then calls the command's function with it. Commands return one of the exit codes below; their
 * messages go to stderr, their results to stdout. Everything runs on the main thread except
 * what a command starts itself (appenders, the metrics server).
 */
#ifndef PAWL_TOOL_H
#define PAWL_TOOL_H

#include "common.h"
#include "pawl.h"

#include <signal.h>
#include <stdio.h>

/* Exit codes; the README's table is generated from tool_exit_codes[]. */
enum tool_exit {
    TOOL_OK = 0,       /* success */
    TOOL_FAILED = 1,   /* the operation failed (database error, I/O error) */
    TOOL_USAGE = 2,    /* unknown command or flag, a bad value, a missing argument */
    TOOL_NODB = 3,     /* cannot reach the database (or start the private one) */
    TOOL_REFUSED = 4,  /* refused: segments are claimed, or a merge is still running */
    TOOL_NOTFOUND = 5, /* no such processor or segment; no schema (run `pawl init`) */
    TOOL_BADINPUT = 6, /* append: an input line is not a valid event */
};

struct tool_exit_code {
    int code;
    const char *meaning;
};
extern const struct tool_exit_code tool_exit_codes[];

struct tool_cmd {
    const char *name;
    unsigned scope;          /* PAWL_SCOPE_* bit of this command */
    const char *synopsis;    /* after "pawl NAME " */
    const char *summary;     /* one line */
    const char *description; /* paragraphs, man style */
    int (*run)(struct pawl_config *cfg, int argc, const char *const *argv);
    int needs_db;
};

/* Set by SIGINT / SIGTERM; long-running commands poll it and finish cleanly. */
extern volatile sig_atomic_t tool_stop;

/* Print "pawl: " + message to stderr. */
void tool_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * The database to use: cfg->dsn when set; else "" (libpq's environment) when a PG* connection
 * variable is set; else the user's private PostgreSQL (via the pawl-pg script next to the
 * binary), started if it is not running; announced on stderr once. Returns a static string, or
 * NULL after printing why.
 */
const char *tool_dsn(struct pawl_config *cfg);
/* The DSN with its password hidden, for messages. Static storage. */
const char *tool_dsn_printable(const char *dsn);
/* Warn once on stderr when --dsn (argv, visible in ps) carries a password. */
void tool_dsn_warn_argv(const struct pawl_config *cfg);
/* For `pawl config`: the database the tool would use (redacted) and where that came from (--dsn,
 * PAWL_DSN, libpq's environment, the private cluster at PATH); starts nothing. json: as a
 * ",\n  \"database\": {...}" member to append to the flags' object. */
void tool_dsn_config(const struct pawl_config *cfg, FILE *out, int json);

/* Map a pawl error code to an exit code. */
int tool_exit_for(int rc);

/* Commands */
int cmd_config(struct pawl_config *cfg, int argc, const char *const *argv);
int cmd_init(struct pawl_config *cfg, int argc, const char *const *argv);
int cmd_append(struct pawl_config *cfg, int argc, const char *const *argv);
int cmd_tail(struct pawl_config *cfg, int argc, const char *const *argv);
int cmd_demo(struct pawl_config *cfg, int argc, const char *const *argv);
int cmd_bench(struct pawl_config *cfg, int argc, const char *const *argv);
int cmd_run(struct pawl_config *cfg, int argc, const char *const *argv);
int cmd_status(struct pawl_config *cfg, int argc, const char *const *argv);
int cmd_reset(struct pawl_config *cfg, int argc, const char *const *argv);
int cmd_split(struct pawl_config *cfg, int argc, const char *const *argv);
int cmd_merge(struct pawl_config *cfg, int argc, const char *const *argv);

#endif
