/*
 * main.c — the `pawl` command-line tool: subcommand dispatch, flag sources, generated help.
 *
 * Flags come from one table (pawl/config.h). For every invocation: defaults, then PAWL_* from
 * the environment (settings only: an action variable such as PAWL_EXECUTE is ignored, with a
 * warning), then --flags on the command line (so flag > env > default); a bad value anywhere
 * exits 2 with a message naming the flag, the value and the allowed range. Flags may stand
 * before the command too (`pawl --dsn X status`). A misspelt command or flag gets "did you
 * mean". `pawl help`, `pawl CMD --help`, `pawl help --markdown` (the reference in docs/), the
 * man page (`pawl man`) and bash completion (`pawl completion bash`) are generated from the
 * command table below and the flag table, so they cannot drift from the code.
 */
#include "tool.h"

#include "position.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static int cmd_help(struct tool_config *cfg, int argc, const char *const *argv);
static int cmd_completion(struct tool_config *cfg, int argc, const char *const *argv);
static int cmd_man(struct tool_config *cfg, int argc, const char *const *argv);
static int unknown_cmd(const char *name);

/* The position syntax, for the commands that take one (position.h says how times resolve). */
#define POSITIONS_TEXT                                                                             \
    "A position is start (before the first event), end (after the last one), an index N (after "   \
    "event N), -N (N events before the end, never before the start), a time ago with a unit "      \
    "(-30s, -15m, -2h, -1d, on the database's clock) or an RFC 3339 time (2026-12-05T10:00:00Z, "  \
    "or with an offset: +01:00): a time means just before the first event appended at or after "   \
    "it (end when there is none). -15 is an offset, -15m a time."

#define DB_NOTE                                                                                    \
    "Without --dsn or PAWL_DSN it uses libpq's PG* environment when set, else your private "       \
    "PostgreSQL, starting it if needed."

static const struct tool_cmd commands[] = {
    {"help", 0, "[COMMAND] [--markdown]", "Show help for pawl or for one command",
     "Without a command, lists the commands and the flags every command takes. With one, prints "
     "its manual. --markdown prints the whole reference (commands, flags, exit codes) as "
     "Markdown, as it appears in docs/reference.md.",
     cmd_help, 0},
    {"config", TOOL_SCOPE_CONFIG, "[--json]", "Print the effective configuration",
     "Prints every flag with its effective value and where the value came from: default, env "
     "(a PAWL_* environment variable) or flag (the command line). Flags given on this command "
     "line are checked as for any command, so `pawl config --rate 5` shows what `--rate 5` "
     "would mean.",
     cmd_config, 0},
    {"init", TOOL_SCOPE_INIT, "", "Create or upgrade the pawl schema (idempotent)",
     "Brings the database's pawl schema to this version of pawl: creates it when missing, "
     "upgrades it when older, and does nothing when it is current, so running it twice is safe. "
     "Concurrent runs serialize on an advisory lock. Refuses a schema newer than this pawl.",
     cmd_init, 1},
    {"append", TOOL_SCOPE_APPEND,
     "[--events-per-append N] [--wait] < events.jsonl | --generate [--rate X]",
     "Append events from stdin (JSON lines), or generate load",
     "Reads one event per line from stdin: {\"stream\": \"order-17\", \"type\": "
     "\"OrderPlaced\", \"payload\": {...}, \"metadata\": {...}, \"seq\": 3}. stream and type "
     "are required; payload is any JSON value (a string is taken as its bytes); metadata is an "
     "object; seq (optional) is the stream position the event must get, or the append fails "
     "with a conflict. Lines are appended in order, --events-per-append lines per transaction, "
     "and each appended event is printed on stdout as `line N  STREAM#SEQ` (control characters "
     "escaped; SEQ is ? where the log chose it and has not reported it). With --wait the "
     "command waits until the finalizer gave the events their final indexes and prints `line N "
     " STREAM#SEQ  index I` instead. The first invalid line stops the command (exit 6) with its "
     "line number and reason; so does a line longer than an event of --max-event-bytes can be "
     "as JSON (6 bytes per byte, plus 64 KiB), refused as soon as that much arrived. Lines "
     "before it are appended, nothing after it. A conflict (an explicit seq that does not follow "
     "the stream's version) exits 7 and names the stream, the expected and the actual version. "
     "Ctrl-C (or SIGTERM) stops cleanly after appending the lines already read, says what was "
     "appended (events, last line and event) and exits 130. What `pawl tail --json` prints is "
     "valid input (index and appended_at are ignored). With --generate, --appenders threads "
     "append generated events at --rate for --duration (or --count events) instead.",
     cmd_append, 1},
    {"tail", TOOL_SCOPE_TAIL, "[--from POSITION] [--follow] [--count N] [--json]",
     "Print events of the log, and follow it",
     "Prints the finalized events after the position --from (default start: the whole log) in "
     "index order, one per line (--json: as JSON lines that `pawl append` reads back). With "
     "--follow it keeps waiting for new events, woken by the finalizer's notifications, until "
     "interrupted. " POSITIONS_TEXT " So --from end prints only new events, --from -10 the last "
     "ten and then new ones, --from -1h what was appended in the last hour.",
     cmd_tail, 1},
    {"run", TOOL_SCOPE_RUN,
     "[--processor] NAME [--handler count|print] | [--processor] NAME --handler exec -- CMD [ARGS]",
     "Run one node of a processor until interrupted",
     "Runs the processor NAME (the argument, or --processor; not both with different names) "
     "against the log with the chosen handler: count (counts events), "
     "print (prints each event as a JSON line, with \"replay\": true on replays; a token is "
     "stored only once the lines are written, with --output-fsync also fsynced), exec (sends "
     "each claimed segment's events as JSON lines to its own long-lived CMD, which answers "
     "each line marked \"batch_end\": true with `ok INDEX`; a failure, an exit or no answer "
     "within --exec-ack-timeout restarts CMD and delivers the batch again; CMD does not get "
     "PGPASSWORD or any PAWL_*DSN variable unless --exec-pass-secrets). Creates the "
     "processor's segments on first use (--segments; --initial-token, a position, default "
     "start: --initial-token end handles only new events, -1h what was appended in the last "
     "hour and after). Several nodes may run the same processor; they share its segments "
     "through their claims. A progress line shows the handling rate, the segments held, how "
     "far behind the head the processor is and, while catching up, an ETA. Ctrl-C (or SIGTERM) "
     "stops cleanly: batches finish, progress is stored, claims are released, and it exits 130; "
     "while stopping it says what it waits for (an exec command's acknowledgement, a batch's "
     "commit, ...). The same signal again within a second is ignored (GNU timeout sends two); "
     "a second one later abandons the stop: it exits 8, leaving the claims it has not released "
     "to expire after --claim-timeout, and names them. So does a database that does not answer "
     "for --stop-db-wait while stopping: a node whose database is gone stops within "
     "--stop-db-wait and 2 s. A --processor or --node-id the token store would refuse (empty, "
     "over 63 bytes, a byte other than A-Z a-z 0-9 _ . : -) is refused before connecting "
     "(exit 2).",
     cmd_run, 1},
    {"status", TOOL_SCOPE_STATUS, "[[--processor] NAME] [--json] [--watch D] [--metrics]",
     "List the processors, or show one processor's segments: owner, token, lag",
     "Without a name, lists every processor: its segments, how many are claimed and by which "
     "nodes, its lowest token and its lag in events (head - lowest token). With a name, prints, "
     "per segment of the processor: id and mask, owner and claim age, stored token, the "
     "log's head, lag in events and in seconds, checkpoint mode, and notes (replaying after a "
     "reset up to the old position; a merge in progress; a claim expired: not extended for "
     "--claim-timeout, its node gone). Lag counts the events after the "
     "token that belong to the segment, by one scan of the log (up to 1,000,000 events; beyond "
     "that it shows head - token, marked <=). Lag in seconds is the age of the oldest unhandled "
     "event. Above the segments it names each session that keeps the finalizer out of its "
     "gate: holding the gate (held by), holding a lock on it in another mode that conflicts "
     "(blocked by) or waiting for one (wanted by), with pid, user, application, lock mode and "
     "how long; or says the gate is free. --json prints the same as one JSON document; --watch "
     "refreshes every interval (in place on a terminal; one JSON document per line with "
     "--json). --metrics adds totals.",
     cmd_status, 1},
    {"reset", TOOL_SCOPE_RESET, "[--processor] NAME --to POSITION [--execute]",
     "Move a stopped processor's tokens to a position",
     "Moves every segment's token to the position --to: the start of the log, its end, an "
     "index, N events before the end, or the position at a time (-15m, -1h30m, -1d; "
     "2026-11-30T06:00:00Z). " POSITIONS_TEXT " Prints what it would do, per segment, and "
     "changes nothing unless --execute is given. An index past the head of the log or before "
     "its start is refused (exit 4). Refused (exit 4, naming the "
     "owners, on stderr, with nothing on stdout) while any segment of the processor is claimed: "
     "stop its nodes first. A claim not extended for --claim-timeout (its node died) does not "
     "count: --execute "
     "releases it. After a reset backwards, handlers see the events up to each segment's previous "
     "position as replays (pawl_ctx_is_replay) until the processor passes it.",
     cmd_reset, 1},
    {"delete", TOOL_SCOPE_DELETE, "[--processor] NAME [--execute]",
     "Delete a stopped processor: its segments, tokens and node records",
     "Removes every segment row of the processor NAME (its tokens and claims) and its node "
     "records; the log is untouched, and a later `pawl run --processor NAME` starts it afresh "
     "from --initial-token. Prints what it would delete and changes nothing unless --execute is "
     "given. Refused (exit 4, naming the owners) while any segment is claimed; a claim not "
     "extended for --claim-timeout (its node died) does not count. The processor name is taken "
     "from the command line only.",
     cmd_delete, 1},
    {"retention", TOOL_SCOPE_RETENTION,
     "[--before INDEX|POSITION [--archive FILE] [--force]] [--rotate] [--execute]",
     "Drop or archive the log's oldest events, a partition at a time",
     "Without --before, lists the partitions of the log (xid range, indexes, events, bytes). "
     "--before INDEX moves the log's start (its low-watermark) to INDEX: reads after an index "
     "below INDEX - 1 then fail naming it (PAWL_ETRUNCATED), and every partition whose events "
     "all lie below it is dropped, giving its space back; indexes at and above it do not "
     "change. --before also takes the other forms of a position (start, end, -N, a time ago "
     "such as -7d, an RFC 3339 time; see pawl help tail): the log then starts just after that "
     "position, so --before -7d keeps the events appended in the last 7 days, --before -1000 "
     "the last 1000 events. With --archive FILE the events below the new start are first "
     "written to FILE (which must not exist) as JSON lines that `pawl append` loads into another "
     "log, and fsynced. Refused "
     "(exit 4) while a processor's token is below INDEX - 1, unless --force. --rotate first "
     "closes the partition that receives new appends, so that a later retention can drop it: "
     "rotate regularly (daily, say). Prints what it would do and changes nothing unless "
     "--execute is given.",
     cmd_retention, 1},
    {"dead-letters", TOOL_SCOPE_DEAD_LETTERS,
     "[--processor] NAME [list|show|retry|drop] [--stream S] [--to INDEX] [--execute] [--json]",
     "List, show, retry or drop a processor's dead letters (parked streams)",
     "A processor run with --dead-letter-attempts parks an event its handlers cannot handle, "
     "and every later event of its stream behind it, while the other streams go on. list (the "
     "default) prints each parked stream: letters, first and last index, age of the oldest, "
     "attempts and last error (AGE-S in seconds). show --stream S prints the stream's letters in "
     "order. With --json, list and show print one JSON object per line: per stream, or per "
     "letter (with the event's id when it has one). retry "
     "--stream S asks the node holding the stream's segment to hand its letters to the "
     "handlers again, in order, before any newer event of the stream: if they succeed the "
     "stream flows again, if not it stays parked with the attempt counted. drop --stream S "
     "[--to INDEX] deletes the stream's letters (up to INDEX) for good. retry and drop print "
     "what they would do and change nothing unless --execute is given. The processor name is "
     "taken from the command line only for retry and drop. A processor with no segments in "
     "the token store is exit 5.",
     cmd_dead_letters, 1},
    {"split", TOOL_SCOPE_SPLIT, "[--processor] NAME --segment ID [--execute]",
     "Split a segment in two",
     "Splits segment ID (mask m) into ID and ID+m+1 with mask 2m+1; both keep its token. "
     "Prints what it would do unless --execute. Refused (exit 4) while the segment is claimed "
     "(a claim older than --claim-timeout is released instead); a running node picks the new "
     "segments up through its claim cycle.",
     cmd_split, 1},
    {"merge", TOOL_SCOPE_MERGE, "[--processor] NAME --segment ID [--execute]",
     "Merge a segment with its sibling",
     "Merges segment ID with its sibling (the other half of its parent) into the parent. The "
     "merged segment starts from the lower of the two tokens and skips the faster half's "
     "events up to its token, so nothing is delivered twice. Prints what it would do unless "
     "--execute. Refused (exit 4) while either half is claimed (a claim older than "
     "--claim-timeout is released instead) or an earlier merge is still catching up.",
     cmd_merge, 1},
    {"demo", TOOL_SCOPE_DEMO, "[--rate X] [--duration D] [--appenders N]",
     "Append at a target rate with a follower, and show what happens",
     "Creates the schema if needed, then runs --appenders concurrent appenders at --rate events "
     "per second in total and one follower reading the log, for --duration. A live line shows "
     "appended and read events per second, appends waiting for finalization, the finalize delay "
     "(p50, p99) and the end-to-end lag from commit to follower; a summary follows at the end.",
     cmd_demo, 1},
    {"bench", TOOL_SCOPE_BENCH,
     "[--duration D] [--csv FILE] [--events-per-append N] [--appenders N]",
     "Measure the append path: rate, latency, finalize delay, lag",
     "Runs the load generator cell by cell: every combination of --events-per-append 1, 10, 100 "
     "and --appenders 1, 4 (a dimension given explicitly is held at that value), each for "
     "--duration, as fast as possible unless --rate is given, with one follower reading the "
     "log. Prints per cell the events per second, append latency (p50, p99), end-to-end lag "
     "from commit to follower, the store's finalize delay, and errors. --csv FILE writes the "
     "same as CSV and, when gnuplot is installed, a chart next to it.",
     cmd_bench, 1},
    {"completion", 0, "bash", "Print the bash completion script",
     "Prints a bash completion script for pawl, generated from the command and flag tables: "
     "`source <(pawl completion bash)`, or install it as "
     "share/bash-completion/completions/pawl (make install does).",
     cmd_completion, 0},
    {"man", 0, "", "Print the manual page (roff)",
     "Prints pawl(1) in roff, generated from the command and flag tables: `pawl man | man -l -`. "
     "make install installs it as share/man/man1/pawl.1.",
     cmd_man, 0},
};

static const struct tool_cmd *find_cmd(const char *name)
{
    for (size_t i = 0; i < TOOL_ARRAY_LEN(commands); i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

static const char *type_word(const struct pawl_flag *f)
{
    if (tool_flag_is_position(f))
        return " POSITION";
    switch (f->type) {
    case PAWL_FLAG_BOOL:
        return "";
    case PAWL_FLAG_INT:
        return " N";
    case PAWL_FLAG_DOUBLE:
        return " X";
    case PAWL_FLAG_DURATION:
        return " DURATION";
    case PAWL_FLAG_STRING:
        return " TEXT";
    case PAWL_FLAG_ENUM:
        return " WORD";
    }
    return "";
}

/* Print text wrapped at width columns, each line indented by indent spaces. */
static void print_wrapped(FILE *out, const char *text, int indent, int width)
{
    const char *p = text;
    while (*p) {
        int room = width - indent;
        int n = (int)strlen(p);
        int cut = n;
        if (n > room) {
            cut = room;
            while (cut > 0 && p[cut] != ' ')
                cut--;
            if (cut == 0)
                cut = room;
        }
        fprintf(out, "%*s%.*s\n", indent, "", cut, p);
        p += cut;
        while (*p == ' ')
            p++;
    }
}

/* What f accepts, as help shows it: a position's forms, else the table's words. */
static const char *allowed_text(const struct pawl_flag *f, char *out, size_t outlen)
{
    if (tool_flag_is_position(f)) {
        snprintf(out, outlen, "a position: %s", TOOL_POS_FORMS);
        return out;
    }
    return pawl_config_flag_allowed(f, out, outlen);
}

/* The flag's default as help shows it: "(none)" for an empty one. */
static const char *default_text(const struct pawl_flag *f, char *out, size_t outlen)
{
    pawl_config_flag_default(f, out, outlen);
    return out[0] ? out : "(none)";
}

static void print_flag_help(FILE *out, const struct pawl_flag *f)
{
    char def[64];
    char env[96], allowed[256], line[1024];
    fprintf(out, "  --%s%s\n", f->name, type_word(f));
    char where[128];
    if (tool_flag_kind(f) == TOOL_FLAG_ACTION)
        snprintf(where, sizeof where, "Command line only (an action).");
    else
        snprintf(where, sizeof where, "Env: %s.", pawl_config_flag_env(f, env, sizeof env));
    snprintf(line, sizeof line, "%s. Default: %s%s%s. Accepts %s. %s", f->help,
             default_text(f, def, sizeof def), f->unit ? " " : "", f->unit ? f->unit : "",
             allowed_text(f, allowed, sizeof allowed), where);
    print_wrapped(out, line, 6, 100);
}

static void print_exit_codes(FILE *out)
{
    fprintf(out, "EXIT STATUS\n");
    for (const struct tool_exit_code *e = tool_exit_codes; e->meaning; e++) {
        fprintf(out, "  %d\n", e->code);
        print_wrapped(out, e->meaning, 6, 100);
    }
}

static void print_cmd_help(FILE *out, const struct tool_cmd *c)
{
    fprintf(out, "NAME\n  pawl %s - %s\n\nSYNOPSIS\n  pawl %s %s\n\nDESCRIPTION\n", c->name,
            c->summary, c->name, c->synopsis);
    print_wrapped(out, c->description, 2, 100);
    if (c->needs_db)
        print_wrapped(out, DB_NOTE, 2, 100);
    fprintf(out, "\nFLAGS\n");
    int any = 0;
    for (size_t i = 0; i < tool_flag_count(); i++) {
        const struct pawl_flag *f = tool_flag_at(i);
        if (tool_flag_scope(f) & c->scope) {
            print_flag_help(out, f);
            any = 1;
        }
    }
    if (!any)
        fprintf(out, "  (none)\n");
    fprintf(out, "  -h, --help\n      Print this help.\n  -V, --version\n      Print pawl's "
                 "version.\n\n");
    print_exit_codes(out);
}

static void print_usage(FILE *out)
{
    fprintf(out, "usage: pawl COMMAND [FLAGS] [ARGS]\n\n"
                 "pawl: a forward-only event log and pooled streaming processors on PostgreSQL.\n\n"
                 "COMMANDS\n");
    for (size_t i = 0; i < TOOL_ARRAY_LEN(commands); i++)
        fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\nFLAGS ACCEPTED BY EVERY COMMAND\n");
    for (size_t i = 0; i < tool_flag_count(); i++) {
        const struct pawl_flag *f = tool_flag_at(i);
        if ((tool_flag_scope(f) & TOOL_SCOPE_ALL) == TOOL_SCOPE_ALL)
            print_flag_help(out, f);
    }
    fprintf(out, "\nFlags may also come before the command: pawl --dsn DSN status. Every setting "
                 "--name can also be\nset as PAWL_NAME in the environment; a flag on the command "
                 "line wins. Actions (--execute, --to,\n--segment, --json, --count, ...) are taken "
                 "from the command line only. Durations need a unit\n(250ms, 2s, 1m30s).\n"
                 "`pawl COMMAND --help` shows a command's manual and all its flags; `pawl config` "
                 "prints the\neffective values and their sources. -V, --version prints the "
                 "version.\n\n");
    print_exit_codes(out);
}

/* Markdown: a table cell must not contain a bare '|'. */
static void md_cell(FILE *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '|')
            fputs("\\|", out);
        else
            fputc(*s, out);
    }
}

static void print_markdown(FILE *out)
{
    fprintf(out, "### Commands\n\n");
    for (size_t i = 0; i < TOOL_ARRAY_LEN(commands); i++) {
        const struct tool_cmd *c = &commands[i];
        fprintf(out, "#### `pawl %s`\n\n```\npawl %s %s\n```\n\n%s", c->name, c->name, c->synopsis,
                c->description);
        if (c->needs_db)
            fprintf(out, " %s", DB_NOTE);
        fprintf(out, "\n\n");
        int any = 0;
        for (size_t j = 0; j < tool_flag_count(); j++) {
            const struct pawl_flag *f = tool_flag_at(j);
            if ((tool_flag_scope(f) & c->scope) &&
                (tool_flag_scope(f) & TOOL_SCOPE_ALL) != TOOL_SCOPE_ALL) {
                fprintf(out, "%s`--%s`", any ? ", " : "Flags: ", f->name);
                any = 1;
            }
        }
        if (any)
            fprintf(out, " (and the common flags).\n\n");
    }
    fprintf(out,
            "### Flags\n\nLogging, `--dsn` and the store's and processor's flags are fields of "
            "`struct pawl_config` (the others are the tool's own). Settings are also "
            "environment variables; precedence: command line > environment > default. "
            "Actions (environment: -) come from the command line only: an action variable "
            "in the environment is ignored, with a warning. Durations need a unit (250ms, "
            "2s, 1m30s, 1.5h); only 0 may be bare.\n\n"
            "| flag | environment | default | accepts | commands | meaning |\n"
            "| --- | --- | --- | --- | --- | --- |\n");
    for (size_t i = 0; i < tool_flag_count(); i++) {
        const struct pawl_flag *f = tool_flag_at(i);
        char env[96], allowed[256], def[64];
        if (tool_flag_kind(f) == TOOL_FLAG_ACTION)
            snprintf(env, sizeof env, "-");
        else
            pawl_config_flag_env(f, env, sizeof env);
        fprintf(out, "| `--%s` | %s%s%s | %s%s%s | ", f->name, env[0] == '-' ? "" : "`", env,
                env[0] == '-' ? "" : "`", default_text(f, def, sizeof def), f->unit ? " " : "",
                f->unit ? f->unit : "");
        md_cell(out, allowed_text(f, allowed, sizeof allowed));
        fprintf(out, " | ");
        if ((tool_flag_scope(f) & TOOL_SCOPE_ALL) == TOOL_SCOPE_ALL) {
            fprintf(out, "all");
        } else {
            int first = 1;
            for (size_t j = 0; j < TOOL_ARRAY_LEN(commands); j++) {
                if (commands[j].scope & tool_flag_scope(f)) {
                    fprintf(out, "%s%s", first ? "" : ", ", commands[j].name);
                    first = 0;
                }
            }
        }
        fprintf(out, " | ");
        md_cell(out, f->help);
        fprintf(out, " |\n");
    }
    fprintf(out, "\n### Exit codes\n\n| code | meaning |\n| --- | --- |\n");
    for (const struct tool_exit_code *e = tool_exit_codes; e->meaning; e++)
        fprintf(out, "| %d | %s |\n", e->code, e->meaning);
}

static int cmd_help(struct tool_config *cfg, int argc, const char *const *argv)
{
    (void)cfg;
    int markdown = 0;
    const char *topic = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--markdown") == 0)
            markdown = 1;
        else if (topic == NULL && argv[i][0] != '-')
            topic = argv[i];
        else {
            tool_err("help: unexpected argument '%s'", argv[i]);
            return TOOL_USAGE;
        }
    }
    if (markdown) {
        print_markdown(stdout);
        return TOOL_OK;
    }
    if (topic) {
        const struct tool_cmd *c = find_cmd(topic);
        if (c == NULL)
            return unknown_cmd(topic);
        print_cmd_help(stdout, c);
        return TOOL_OK;
    }
    print_usage(stdout);
    return TOOL_OK;
}

int cmd_config(struct tool_config *cfg, int argc, const char *const *argv)
{
    if (argc > 0) {
        tool_err("config: unexpected argument '%s'", argv[0]);
        return TOOL_USAGE;
    }
    char value[4200], env[96];
    if (cfg->tool.json) {
        printf("{");
        for (size_t i = 0; i < tool_flag_count(); i++) {
            const struct pawl_flag *f = tool_flag_at(i);
            tool_config_get(cfg, f->name, value, sizeof value);
            if ((strcmp(f->name, "dsn") == 0 || strcmp(f->name, "read-dsn") == 0) && value[0])
                snprintf(value, sizeof value, "%s", tool_dsn_printable(value));
            /* Values are flag text: escape only what JSON requires. */
            printf("%s\n  \"%s\": {\"value\": \"", i ? "," : "", f->name);
            for (const char *p = value; *p; p++) {
                if (*p == '"' || *p == '\\')
                    printf("\\%c", *p);
                else if ((unsigned char)*p < 0x20)
                    printf("\\u%04x", *p);
                else
                    putchar(*p);
            }
            printf("\", \"source\": \"%s\", \"env\": ",
                   pawl_config_source_name(tool_config_source_of(cfg, f->name)));
            /* An action comes from the command line only: it has no variable. */
            if (tool_flag_kind(f) == TOOL_FLAG_ACTION)
                printf("null}");
            else
                printf("\"%s\"}", pawl_config_flag_env(f, env, sizeof env));
        }
        tool_dsn_config(cfg, stdout, 1); /* the database actually used, and from where */
        printf("\n}\n");
        return TOOL_OK;
    }
    printf("%-20s %-28s %s\n", "FLAG", "VALUE", "SOURCE");
    for (size_t i = 0; i < tool_flag_count(); i++) {
        const struct pawl_flag *f = tool_flag_at(i);
        tool_config_get(cfg, f->name, value, sizeof value);
        if ((strcmp(f->name, "dsn") == 0 || strcmp(f->name, "read-dsn") == 0) && value[0])
            snprintf(value, sizeof value, "%s", tool_dsn_printable(value));
        enum pawl_config_source src = tool_config_source_of(cfg, f->name);
        printf("--%-18s %-28s %s", f->name, value[0] ? value : "(none)",
               pawl_config_source_name(src));
        if (src == PAWL_SRC_ENV)
            printf(" (%s)", pawl_config_flag_env(f, env, sizeof env));
        putchar('\n');
    }
    tool_dsn_config(cfg, stdout, 0); /* the database actually used, and from where */
    return TOOL_OK;
}

/* ---- generated completion and manual ---- */

static int cmd_completion(struct tool_config *cfg, int argc, const char *const *argv)
{
    (void)cfg;
    if (argc != 1 || strcmp(argv[0], "bash") != 0) {
        tool_err("completion: give the shell: pawl completion bash");
        return TOOL_USAGE;
    }
    printf("# bash completion for pawl, generated by `pawl completion bash` (pawl %s)\n"
           "_pawl() {\n"
           "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} cmd= w skip=\n"
           "    local valued=\"",
           PAWL_VERSION);
    /* Flags that take the next word as their value: it is not the command. */
    for (size_t j = 0; j < tool_flag_count(); j++) {
        const struct pawl_flag *f = tool_flag_at(j);
        if (f->type != PAWL_FLAG_BOOL)
            printf(" --%s", f->name);
    }
    printf(" \"\n"
           "    for w in \"${COMP_WORDS[@]:1:COMP_CWORD-1}\"; do\n"
           "        if [[ -n $skip ]]; then skip=; continue; fi\n"
           "        case $w in\n"
           "        --*=*) ;;\n"
           "        -*) [[ $valued == *\" $w \"* ]] && skip=1 ;;\n"
           "        *) cmd=$w; break ;;\n"
           "        esac\n"
           "    done\n"
           "    local flags\n"
           "    case $cmd in\n");
    for (size_t i = 0; i < TOOL_ARRAY_LEN(commands); i++) {
        const struct tool_cmd *c = &commands[i];
        printf("    %s) flags=\"--help --version", c->name);
        for (size_t j = 0; j < tool_flag_count(); j++) {
            const struct pawl_flag *f = tool_flag_at(j);
            if (tool_flag_scope(f) & c->scope)
                printf(" --%s", f->name);
        }
        printf("\" ;;\n");
    }
    printf("    *) flags=\"--help --version");
    for (size_t j = 0; j < tool_flag_count(); j++) {
        const struct pawl_flag *f = tool_flag_at(j);
        if ((tool_flag_scope(f) & TOOL_SCOPE_ALL) == TOOL_SCOPE_ALL || strcmp(f->name, "dsn") == 0)
            printf(" --%s", f->name);
    }
    printf("\" ;;\n    esac\n    case $prev in\n");
    for (size_t j = 0; j < tool_flag_count(); j++) {
        const struct pawl_flag *f = tool_flag_at(j);
        if (f->type != PAWL_FLAG_ENUM)
            continue;
        printf("    --%s) COMPREPLY=($(compgen -W \"", f->name);
        for (size_t k = 0; f->choices[k]; k++)
            printf("%s%s", k ? " " : "", f->choices[k]);
        printf("\" -- \"$cur\")); return ;;\n");
    }
    printf("    --to|--from|--initial-token|--before) COMPREPLY=($(compgen -W \"start end\" -- "
           "\"$cur\")); return ;;\n"
           "    --csv) COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n"
           "    esac\n"
           "    if [[ -z $cmd && $cur != -* ]]; then\n"
           "        COMPREPLY=($(compgen -W \"");
    for (size_t i = 0; i < TOOL_ARRAY_LEN(commands); i++)
        printf("%s%s", i ? " " : "", commands[i].name);
    printf("\" -- \"$cur\"))\n"
           "    elif [[ $cmd == completion && $cur != -* ]]; then\n"
           "        COMPREPLY=($(compgen -W \"bash\" -- \"$cur\"))\n"
           "    elif [[ $cmd == help && $cur != -* ]]; then\n"
           "        COMPREPLY=($(compgen -W \"");
    for (size_t i = 0; i < TOOL_ARRAY_LEN(commands); i++)
        printf("%s%s", i ? " " : "", commands[i].name);
    printf("\" -- \"$cur\"))\n"
           "    else\n"
           "        COMPREPLY=($(compgen -W \"$flags\" -- \"$cur\"))\n"
           "    fi\n"
           "}\n"
           "complete -F _pawl pawl\n");
    return TOOL_OK;
}

/* roff text: a leading '.' or '\'' would be a request; backslashes and '-' are escaped. */
static void roff(FILE *out, const char *s)
{
    if (*s == '.' || *s == '\'')
        fputs("\\&", out);
    for (; *s; s++) {
        if (*s == '\\')
            fputs("\\e", out);
        else if (*s == '-')
            fputs("\\-", out);
        else
            fputc(*s, out);
    }
}

static int cmd_man(struct tool_config *cfg, int argc, const char *const *argv)
{
    (void)cfg;
    if (argc > 0) {
        tool_err("man: unexpected argument '%s'", argv[0]);
        return TOOL_USAGE;
    }
    FILE *o = stdout;
    fprintf(o,
            ".TH PAWL 1 \"\" \"pawl %s\" \"User Commands\"\n.SH NAME\npawl \\- a "
            "forward\\-only event log and pooled streaming processors on PostgreSQL\n"
            ".SH SYNOPSIS\n.B pawl\n[\\fIFLAGS\\fR] \\fICOMMAND\\fR [\\fIFLAGS\\fR] "
            "[\\fIARGS\\fR]\n.SH DESCRIPTION\n",
            PAWL_VERSION);
    roff(o, "Flags may stand before or after the command. Every setting --name may also be set "
            "as PAWL_NAME in the environment; a flag on the command line wins. Actions (flags "
            "marked so below) are taken from the command line only. Durations need a unit: "
            "250ms, 2s, 1m30s, 1.5h.");
    fprintf(o, "\n.SH COMMANDS\n");
    for (size_t i = 0; i < TOOL_ARRAY_LEN(commands); i++) {
        const struct tool_cmd *c = &commands[i];
        fprintf(o, ".TP\n.B pawl %s ", c->name);
        roff(o, c->synopsis);
        fputc('\n', o);
        roff(o, c->description);
        if (c->needs_db) {
            fputc(' ', o);
            roff(o, DB_NOTE);
        }
        fputc('\n', o);
    }
    fprintf(o, ".SH FLAGS\n");
    for (size_t j = 0; j < tool_flag_count(); j++) {
        const struct pawl_flag *f = tool_flag_at(j);
        char env[96], allowed[256];
        fprintf(o, ".TP\n.B \\-\\-");
        roff(o, f->name);
        fprintf(o, "%s\n", type_word(f));
        roff(o, f->help);
        fprintf(o, ". Default: ");
        char def[64];
        roff(o, default_text(f, def, sizeof def));
        fprintf(o, ". Accepts ");
        roff(o, allowed_text(f, allowed, sizeof allowed));
        fprintf(o, ". ");
        if (tool_flag_kind(f) == TOOL_FLAG_ACTION)
            fprintf(o, "Command line only (an action).\n");
        else
            fprintf(o, "Environment: %s.\n", pawl_config_flag_env(f, env, sizeof env));
    }
    fprintf(o, ".SH EXIT STATUS\n");
    for (const struct tool_exit_code *e = tool_exit_codes; e->meaning; e++) {
        fprintf(o, ".TP\n.B %d\n", e->code);
        roff(o, e->meaning);
        fputc('\n', o);
    }
    fprintf(o, ".SH SEE ALSO\n\\fBpawl help\\fR \\fICOMMAND\\fR, \\fBpawl config\\fR\n");
    return TOOL_OK;
}

/* When the first SIGINT / SIGTERM came (CLOCK_MONOTONIC ns). A lock-free atomic, as the
 * handler writes it and the handler reads it. */
static _Atomic int64_t first_signal_ns;

static void on_signal(int sig)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* async-signal-safe */
    int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    if (!tool_stop) {
        first_signal_ns = now;
        tool_stop_signal = sig;
        tool_stop = 1;
        return;
    }
    /* Within a second of the first: the same request delivered twice (GNU timeout signals the
     * process and then its group), not a second one. */
    if (now - first_signal_ns < 1000000000)
        return;
    if (tool_abandon_here) {
        tool_abandon = sig; /* the command says what it leaves, and exits */
        return;
    }
    static const char msg[] = "pawl: interrupted again: stop abandoned\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    _exit(TOOL_ABANDONED);
}

/* The command nearest to name, or NULL. */
static const char *closest_cmd(const char *name)
{
    const char *best = NULL;
    size_t bestd = 99;
    for (size_t i = 0; i < TOOL_ARRAY_LEN(commands); i++) {
        size_t d = tool_edit_distance(name, commands[i].name);
        if (d < bestd) {
            bestd = d;
            best = commands[i].name;
        }
    }
    return bestd <= TOOL_MAX(strlen(name) / 3, (size_t)1) ? best : NULL;
}

static int unknown_cmd(const char *name)
{
    const char *near = closest_cmd(name);
    if (near)
        tool_err("unknown command '%s' (did you mean '%s'? pawl help lists them)", name, near);
    else
        tool_err("unknown command '%s' (pawl help lists them)", name);
    return TOOL_USAGE;
}

/* Commands whose Ctrl-C ends with exit 130 after their summary (run and tail keep 0: stopping
 * is how they end normally, and their owners decide). */
static int interrupt_exits_130(const struct tool_cmd *cmd)
{
    return cmd->run == cmd_append || cmd->run == cmd_demo || cmd->run == cmd_bench ||
           cmd->run == cmd_status || cmd->run == cmd_run || cmd->run == cmd_tail;
}

int main(int argc, char **argv)
{
    /* Flags before the command: kept aside and parsed with the command's own, so they are
     * checked against the command's scope like any other. */
    int i = 1;
    int npre = 0;
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (args == NULL)
        return TOOL_FAILED;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || strcmp(a, "-") == 0)
            break;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            print_usage(stdout);
            free(args);
            return TOOL_OK;
        }
        if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
            printf("pawl %s\n", PAWL_VERSION);
            free(args);
            return TOOL_OK;
        }
        args[npre++] = argv[i];
        if (strncmp(a, "--", 2) == 0 && strchr(a, '=') == NULL) {
            const struct pawl_flag *f = tool_flag_find(a + 2);
            if (f && f->type != PAWL_FLAG_BOOL && i + 1 < argc)
                args[npre++] = argv[++i];
        }
    }
    if (i >= argc) {
        if (npre > 0)
            tool_err("flags given but no command (pawl help lists them)");
        print_usage(stderr);
        free(args);
        return TOOL_USAGE;
    }
    if (strcmp(argv[i], "version") == 0) {
        printf("pawl %s\n", PAWL_VERSION);
        free(args);
        return TOOL_OK;
    }
    const struct tool_cmd *cmd = find_cmd(argv[i]);
    if (cmd == NULL) {
        free(args);
        return unknown_cmd(argv[i]);
    }
    if (cmd->scope == 0) { /* help, completion, man: no flags of the table */
        for (int k = i + 1; k < argc; k++) {
            if (strcmp(argv[k], "-h") == 0 || strcmp(argv[k], "--help") == 0) {
                print_cmd_help(stdout, cmd);
                free(args);
                return TOOL_OK;
            }
            if (strcmp(argv[k], "-V") == 0 || strcmp(argv[k], "--version") == 0) {
                printf("pawl %s\n", PAWL_VERSION);
                free(args);
                return TOOL_OK;
            }
        }
        int rc = cmd->run(NULL, argc - i - 1, (const char *const *)argv + i + 1);
        free(args);
        return rc;
    }
    int nargs = npre;
    for (int k = i + 1; k < argc; k++)
        args[nargs++] = argv[k];

    struct tool_config cfg;
    tool_config_defaults(&cfg);
    char err[512];
    int rc = tool_config_load_env(&cfg, environ, err, sizeof err);
    if (rc != 0) {
        tool_err("%s", err);
        tool_config_fini(&cfg);
        free(args);
        return TOOL_USAGE;
    }
    struct tool_config_args pargs;
    /* `pawl config` takes every flag, to show what it would mean. */
    unsigned scope = cmd->run == cmd_config ? TOOL_SCOPE_ALL : cmd->scope;
    rc = tool_config_parse_args(&cfg, nargs, args, scope, &pargs, err, sizeof err);
    if (rc == 0)
        tool_set_quiet(tool_config_resolve_quiet(&cfg));
    tool_config_apply_log(&cfg); /* so even a usage error follows --log-format */
    if (rc != 0) {
        tool_err("%s: %s (pawl %s --help lists its flags)", cmd->name, err, cmd->name);
        tool_config_fini(&cfg);
        free(args);
        return TOOL_USAGE;
    }
    if (pargs.version) {
        printf("pawl %s\n", PAWL_VERSION);
        tool_config_fini(&cfg);
        free(args);
        return TOOL_OK;
    }
    if (pargs.help) {
        print_cmd_help(stdout, cmd);
        tool_config_fini(&cfg);
        free(args);
        return TOOL_OK;
    }
    tool_dsn_warn_argv(&cfg); /* a password in argv is visible in ps */
    if (cfg.lib.log.format == PAWL_LOG_JSON)
        tool_log_json_stderr();
    char ignored[512];
    int nign = tool_config_env_actions(environ, ignored, sizeof ignored);
    if (nign > 0) {
        struct tool_kv kv[] = {TOOL_KV_S("ignored", ignored)};
        tool_log(PAWL_LOG_WARN, kv, 1,
                 "ignoring %s in the environment: actions (what a command does, or to what) are "
                 "taken from the command line only",
                 ignored);
    }
    if (cfg.lib.dsn && cfg.lib.dsn[0] && pawl_dsn_check(cfg.lib.dsn, err, sizeof err) != 0) {
        tool_err("invalid value for --dsn: %s", err);
        tool_config_fini(&cfg);
        free(args);
        return TOOL_USAGE;
    }
    pawl_log(PAWL_LOG_DEBUG, "tool", "pawl %s %s", PAWL_VERSION, cmd->name);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    cfg.dashdash = pargs.dashdash;
    rc = cmd->run(&cfg, pargs.npositional, pargs.positional);
    if (rc == TOOL_NODB)
        tool_dsn_explain_nodb(&cfg);
    if (tool_stop && rc == TOOL_OK && interrupt_exits_130(cmd))
        rc = TOOL_INTERRUPTED;
    tool_config_fini(&cfg);
    free(args);
    fflush(stderr);
    return rc;
}
