/*
 * tool.h — declarations shared by the files of the `pawl` command-line tool.
 *
 * The tool is the only part of pawl that reads argv and the environment. main.c parses the
 * subcommand and its flags into a struct tool_config (defaults < PAWL_* environment < --flags),
 * then calls the command's function with it. Commands return one of the exit codes below; their
 * messages go to stderr, their results to stdout. Everything runs on the main thread except
 * what a command starts itself (appenders, the metrics server).
 */
#ifndef PAWL_TOOL_H
#define PAWL_TOOL_H

#include "pawl.h"
#include "tool_config.h"

#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

/* The tool is a client of the public API (pawl.h) and nothing more: these are its own. */
#define TOOL_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TOOL_MAX(a, b) ((a) > (b) ? (a) : (b))
#define TOOL_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/*
 * TOOL_ASSERT(cond): an invariant of the tool's own tables, checked where the library checks its
 * PAWL_ASSERTs (builds with PAWL_ASSERTIONS defined: Debug, sanitizer, fuzz), else not evaluated.
 */
#ifdef PAWL_ASSERTIONS
#define TOOL_ASSERT(cond) ((cond) ? (void)0 : tool_assert_fail(#cond, __FILE__, __LINE__, __func__))
#else
#define TOOL_ASSERT(cond) ((void)(0 && (cond)))
#endif
void tool_assert_fail(const char *expr, const char *file, int line, const char *func)
    __attribute__((noreturn, cold));

/* Exit codes; the README's table is generated from tool_exit_codes[]. */
enum tool_exit {
    TOOL_OK = 0,            /* success */
    TOOL_FAILED = 1,        /* the operation failed (database error, I/O error) */
    TOOL_USAGE = 2,         /* unknown command or flag, a bad value, a missing argument */
    TOOL_NODB = 3,          /* cannot reach the database (or start the private one) */
    TOOL_REFUSED = 4,       /* refused: segments are claimed, a merge is still running, or
                               (run) the processor was created with another filter */
    TOOL_NOTFOUND = 5,      /* no such processor or segment; no schema (run `pawl init`) */
    TOOL_BADINPUT = 6,      /* append: an input line is not a valid event (or too long) */
    TOOL_CONFLICT = 7,      /* append: a stream is not at the expected version */
    TOOL_ABANDONED = 8,     /* a stop left unfinished: a second SIGINT / SIGTERM, or (run) a
                               database that stopped answering; run: claims left to expire */
    TOOL_INTERRUPTED = 130, /* stopped by SIGINT / SIGTERM after a clean stop (128 + SIGINT) */
};

struct tool_exit_code {
    int code;
    const char *meaning;
};
extern const struct tool_exit_code tool_exit_codes[];

struct tool_cmd {
    const char *name;
    unsigned scope;          /* TOOL_SCOPE_* bit of this command */
    const char *synopsis;    /* after "pawl NAME " */
    const char *summary;     /* one line */
    const char *description; /* paragraphs, man style */
    int (*run)(struct tool_config *cfg, int argc, const char *const *argv);
    int needs_db;
};

/*
 * Set by SIGINT / SIGTERM; long-running commands poll it and finish cleanly. An atomic, not a
 * volatile sig_atomic_t: appender and reader threads read it too (a lock-free atomic_int is
 * as safe in the handler and is not a data race across threads).
 */
extern atomic_int tool_stop;
/*
 * The signals after the first. The first SIGINT / SIGTERM sets tool_stop (and tool_stop_signal
 * to its number). Another within a second of it is the same request delivered twice (GNU
 * `timeout` signals the process, then its process group) and is ignored. A later one abandons
 * the stop: a command that says itself what it leaves sets tool_abandon_here first, and then
 * finds the signal's number in tool_abandon; for any other command the process exits at once
 * with TOOL_ABANDONED.
 */
extern atomic_int tool_stop_signal, tool_abandon, tool_abandon_here;
/* "SIGINT", "SIGTERM" (else "a signal"): for messages about the two above. */
const char *tool_signal_name(int sig);

/* Check a name as the token store takes processor names and node ids: 1..max bytes of
 * [A-Za-z0-9_.:-]. what names it in why ("processor name", "node id"). 0 when it is; else
 * PAWL_EINVAL with why (the name escaped for a terminal). Commands check before they connect. */
int tool_check_name(const char *what, const char *name, size_t max, char *why, size_t whylen);

/*
 * Messages on stderr: "pawl: message" as text; with --log-format json one JSON object per line,
 * {"ts", "level", "msg"} and the message's fields (kv: a string when str is set, else num).
 * Always shown (they are the tool's output on stderr), except debug lines below --log-level.
 */
struct tool_kv {
    const char *key;
    const char *str;
    int64_t num;
};
#define TOOL_KV_S(k, v) ((struct tool_kv){.key = (k), .str = tool_kv_str(v)})
static inline const char *tool_kv_str(const char *s)
{
    return s ? s : "";
}
#define TOOL_KV_I(k, v) ((struct tool_kv){.key = (k), .num = (int64_t)(v)})
void tool_log(enum pawl_log_level level, const struct tool_kv *kv, size_t nkv, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void tool_logv(enum pawl_log_level level, const struct tool_kv *kv, size_t nkv, const char *fmt,
               va_list ap);
/* An error (level error) / a note (level info). */
void tool_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void tool_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* --quiet: the tool's info-level lines (notes) are not shown from now on. */
void tool_set_quiet(int quiet);
/* With --log-format json: turn every other line written to stderr into a JSON object too. */
void tool_log_json_stderr(void);

/* s with control characters escaped (C0 and DEL as \xNN, C1 as \u00NN, a backslash doubled), for
 * terminals and tables: an id or an owner cannot move the cursor or fake a line. Cut with "..."
 * to fit; returns out. The library's pawl_printable (pawl/common.h) over strlen(s); use that one
 * directly for bytes that need not end in a NUL (payloads). */
const char *tool_printable(const char *s, char *out, size_t outlen);
/* s as a quoted JSON string (cut to fit); returns out. */
const char *tool_json_string(const char *s, char *out, size_t outlen);
/* Write s as a JSON string body (without quotes), escaping what JSON requires, as the library's
 * JSON log lines do. */
void tool_json_escape(FILE *f, const char *s);
/* The wall-clock time now as the library's log lines show it ("2026-12-02T17:28:29.612Z");
 * returns out. */
char *tool_utc_stamp(char *out, size_t len);
/* Edit distance between two short names (over 64 bytes: 99), for "did you mean": insertions,
 * deletions, substitutions and swaps of two neighbours cost 1 each. */
size_t tool_edit_distance(const char *a, const char *b);

/*
 * The database to use: cfg->lib.dsn when set; else "" (libpq's environment) when a PG* connection
 * variable is set; else the user's private PostgreSQL (via the pawl-pg script next to the
 * binary), started if it is not running; announced on stderr once. Returns a static string, or
 * NULL after printing why.
 */
const char *tool_dsn(struct tool_config *cfg);
/* The DSN with its password hidden, for messages. Static storage. */
const char *tool_dsn_printable(const char *dsn);
/* Warn once on stderr when --dsn (argv, visible in ps) carries a password. */
void tool_dsn_warn_argv(const struct tool_config *cfg);
/* After a command could not reach the database (exit 3): when libpq's PG* variables chose it
 * (no --dsn or PAWL_DSN), say so, naming the variables set. */
void tool_dsn_explain_nodb(const struct tool_config *cfg);
/* For `pawl config`: the database the tool would use (redacted) and where that came from (--dsn,
 * PAWL_DSN, libpq's environment, the private cluster at PATH); starts nothing. json: as a
 * ",\n  \"database\": {...}" member to append to the flags' object. */
void tool_dsn_config(const struct tool_config *cfg, FILE *out, int json);

/* Map a pawl error code to an exit code. */
int tool_exit_for(int rc);

/* Commands */
int cmd_config(struct tool_config *cfg, int argc, const char *const *argv);
int cmd_init(struct tool_config *cfg, int argc, const char *const *argv);
int cmd_append(struct tool_config *cfg, int argc, const char *const *argv);
int cmd_tail(struct tool_config *cfg, int argc, const char *const *argv);
int cmd_demo(struct tool_config *cfg, int argc, const char *const *argv);
int cmd_bench(struct tool_config *cfg, int argc, const char *const *argv);
int cmd_run(struct tool_config *cfg, int argc, const char *const *argv);
int cmd_status(struct tool_config *cfg, int argc, const char *const *argv);
int cmd_reset(struct tool_config *cfg, int argc, const char *const *argv);
int cmd_split(struct tool_config *cfg, int argc, const char *const *argv);
int cmd_merge(struct tool_config *cfg, int argc, const char *const *argv);
int cmd_delete(struct tool_config *cfg, int argc, const char *const *argv);
int cmd_retention(struct tool_config *cfg, int argc, const char *const *argv);
int cmd_dead_letters(struct tool_config *cfg, int argc, const char *const *argv);

#endif
