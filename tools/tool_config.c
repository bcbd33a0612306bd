/*
 * tool_config.c — the tool's flags: pawl's flag table (pawl/config.h) plus the tool's own
 * settings and actions, each with the commands it applies to.
 *
 * The library's flags (logging, the DSN, the store's and the processor's tunables, whose rows
 * pawl expands from the modules' tunable lists) are referred to by name here and parsed by the
 * library into cfg->lib; only their scope (which commands take them) is declared here. The
 * tool's own flags (struct tool_opts, the metrics port) are rows of this table, parsed by the
 * same typed parser (pawl_flag_set). The order of the table is the order of the generated help.
 *
 * Settings may come from the environment (PAWL_NAME) as well as the command line; actions only
 * from the command line (see enum tool_flag_kind).
 */
#include "tool_config.h"

#include "tool.h"

#include <ctype.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AT(field)                                                                                  \
    .offset = offsetof(struct tool_config, field), .size = sizeof(((struct tool_config *)0)->field)

static const char *const progress_modes[] = {"auto", "live", "plain", "off", NULL};
/* In the order of enum pawl_server_path. */
static const char *const server_paths[] = {"auto", "native", "sql", NULL};

#define S_PROC TOOL_SCOPE_RUN
#define S_STORE                                                                                    \
    (TOOL_SCOPE_APPEND | TOOL_SCOPE_TAIL | TOOL_SCOPE_DEMO | TOOL_SCOPE_BENCH | TOOL_SCOPE_RUN)
#define S_NAMED                                                                                    \
    (TOOL_SCOPE_RUN | TOOL_SCOPE_STATUS | TOOL_SCOPE_RESET | TOOL_SCOPE_SPLIT | TOOL_SCOPE_MERGE | \
     TOOL_SCOPE_DELETE | TOOL_SCOPE_DEAD_LETTERS)
#define S_LOAD (TOOL_SCOPE_DEMO | TOOL_SCOPE_BENCH | TOOL_SCOPE_APPEND)
#define S_DB (TOOL_SCOPE_ALL & ~TOOL_SCOPE_CONFIG)
#define HOUR_MS ((int64_t)3600 * 1000)

/*
 * A library flag, by name, with its scope. A store flag applies to the commands that open a
 * store, a processor flag to run; SCOPE_<field> widens that for one field (SCOPE_OF yields it
 * when it is defined, the module's scope otherwise).
 */
#define LIB(flag, sc)                                                                              \
    {                                                                                              \
        .lib = flag, .scope = sc, .kind = TOOL_FLAG_SETTING                                        \
    }
#define SCOPE_name ~, S_NAMED
#define SCOPE_claim_timeout_ms                                                                     \
    ~, S_PROC | TOOL_SCOPE_STATUS | TOOL_SCOPE_RESET | TOOL_SCOPE_SPLIT | TOOL_SCOPE_MERGE |       \
           TOOL_SCOPE_DELETE
#define SECOND_(a, b, ...) b
#define SECOND(...) SECOND_(__VA_ARGS__)
#define SCOPE_OF(field, dflt) SECOND(SCOPE_##field, dflt, ~)
#define LIB_INT(flag, sc) LIB(flag, sc),
#define LIB_BOOL(flag, sc) LIB(flag, sc),
#define LIB_DURATION(flag, sc) LIB(flag, sc),
#define LIB_ENUM(flag, sc) LIB(flag, sc),
#define LIB_STRING(flag, sc) LIB(flag, sc),
#define LIB_BOOL_NOFLAG(flag, sc) /* no flag */
#define STORE_FLAG(type, field, flag, d, lo, hi, unit, help, choices)                              \
    LIB_##type(flag, SCOPE_OF(field, S_STORE))
/*
 * A processor flag the tool declares itself, in the library row's place (same name, same place
 * in the table, so help and the environment variable stay where they were): OWN_<field> names
 * the macro that makes its row. --initial-token is a position (position.h) here, resolved
 * against the log by `pawl run` into the library's integer field.
 */
#define OWN_initial_token ~, OWN_POSITION_ROW
#define PICK_(a, b, ...) b
#define PICK(...) PICK_(__VA_ARGS__)
#define ROW_MACRO(field, type) PICK(OWN_##field, LIB_##type, ~)
#define PROCESSOR_FLAG(type, field, flag, d, lo, hi, unit, help, choices)                          \
    ROW_MACRO(field, type)(flag, SCOPE_OF(field, S_PROC))
#define OWN_POSITION_ROW(flag_, sc)                                                                \
    {.row = {.name = flag_,                                                                        \
             .type = PAWL_FLAG_STRING,                                                             \
             .sdef = "start",                                                                      \
             .max = 64,                                                                            \
             .help = "run: where a new processor's segments start (end: only new events; -1h: "    \
                     "those appended in the last hour); a processor that exists keeps its tokens " \
                     "(pawl reset moves them)",                                                    \
             AT(tool.initial_token)},                                                              \
     .scope = sc,                                                                                  \
     .kind = TOOL_FLAG_SETTING,                                                                    \
     .position = 1},

struct tool_flag {
    const char *lib;      /* a flag of pawl's table, by name; NULL: row is the tool's own */
    struct pawl_flag row; /* the tool's own flag: a field of struct tool_config */
    unsigned scope;       /* enum tool_scope bits */
    enum tool_flag_kind kind;
    int position; /* a position in the log (position.h), kept as the text given */
};

static const struct tool_flag tflags[] = {
    LIB("log-level", TOOL_SCOPE_ALL),
    LIB("log-format", TOOL_SCOPE_ALL),
    {.row = {.name = "quiet",
             .type = PAWL_FLAG_BOOL,
             .def = 0,
             .help = "Print only results, warnings and errors: no info-level notes of the tool or "
                     "the library (as --log-level warn; an explicit --log-level wins); also -q",
             AT(tool.quiet)},
     .scope = TOOL_SCOPE_ALL,
     .kind = TOOL_FLAG_SETTING},
    LIB("dsn", S_DB),
    PAWL_STORE_TUNABLES(STORE_FLAG)

    /* ---- metrics ---- */
    {.row = {.name = "metrics-port",
             .type = PAWL_FLAG_INT,
             .def = 0,
             .min = 0,
             .max = 65535,
             .help =
                 "Serve Prometheus metrics on http://127.0.0.1:PORT/metrics (0: off); with status "
                 "--metrics, read them from the pawl process serving on that port",
             AT(metrics_port)},
     .scope = TOOL_SCOPE_RUN | TOOL_SCOPE_DEMO | TOOL_SCOPE_BENCH | TOOL_SCOPE_APPEND |
              TOOL_SCOPE_TAIL | TOOL_SCOPE_STATUS,
     .kind = TOOL_FLAG_SETTING},

    PAWL_PROCESSOR_TUNABLES(PROCESSOR_FLAG)

    /* ---- generated load (demo, bench, append --generate) ---- */
    {.row = {.name = "generate",
             .type = PAWL_FLAG_BOOL,
             .def = 0,
             .help = "append: generate events instead of reading JSON lines from stdin",
             AT(tool.generate)},
     .scope = TOOL_SCOPE_APPEND,
     .kind = TOOL_FLAG_ACTION},
    {.row = {.name = "rate",
             .type = PAWL_FLAG_DOUBLE,
             .ddef = 2000,
             .dmin = 0,
             .dmax = 1e9,
             .unit = "events/s",
             .help = "Target append rate of all appenders together; 0: as fast as "
                     "possible",
             AT(tool.rate)},
     .scope = S_LOAD,
     .kind = TOOL_FLAG_SETTING},
    {.row = {.name = "duration",
             .type = PAWL_FLAG_DURATION,
             .def = 20000,
             .min = 0,
             .max = 24 * HOUR_MS,
             .help = "How long to generate load; 0: until --count events or interrupted",
             AT(tool.duration_ms)},
     .scope = S_LOAD,
     .kind = TOOL_FLAG_ACTION},
    {.row = {.name = "appenders",
             .type = PAWL_FLAG_INT,
             .def = 4,
             .min = 1,
             .max = 256,
             .help = "Concurrent appending connections",
             AT(tool.appenders)},
     .scope = S_LOAD,
     .kind = TOOL_FLAG_SETTING},
    {.row =
         {.name = "events-per-append",
          .type = PAWL_FLAG_INT,
          .def = 10,
          .min = 1,
          .max = 10000,
          .help =
              "Events per append transaction (generated load; stdin lines are grouped up to this, "
              "and a partial group is appended as soon as the input pauses)",
          AT(tool.events_per_append)},
     .scope = S_LOAD,
     .kind = TOOL_FLAG_SETTING},
    {.row = {.name = "payload-bytes",
             .type = PAWL_FLAG_INT,
             .def = 100,
             .min = 0,
             .max = 1 << 20,
             .unit = "bytes",
             .help = "Payload size of generated events",
             AT(tool.payload_bytes)},
     .scope = S_LOAD,
     .kind = TOOL_FLAG_SETTING},
    {.row = {.name = "streams",
             .type = PAWL_FLAG_INT,
             .def = 1000,
             .min = 1,
             .max = 10000000,
             .help = "Distinct stream ids the generated events are spread over",
             AT(tool.streams)},
     .scope = S_LOAD,
     .kind = TOOL_FLAG_SETTING},
    {.row = {.name = "count",
             .type = PAWL_FLAG_INT,
             .def = 0,
             .min = 0,
             .max = INT64_MAX,
             .help = "Stop after this many events; 0: no limit",
             AT(tool.count)},
     .scope = TOOL_SCOPE_APPEND | TOOL_SCOPE_TAIL,
     .kind = TOOL_FLAG_ACTION},
    {.row =
         {.name = "wait",
          .type = PAWL_FLAG_BOOL,
          .def = 0,
          .help =
              "append: wait until the finalizer gave the appended events their final indexes, and "
              "print them",
          AT(tool.wait)},
     .scope = TOOL_SCOPE_APPEND,
     .kind = TOOL_FLAG_ACTION},

    /* ---- reading ---- */
    {.row = {.name = "from",
             .type = PAWL_FLAG_STRING,
             .sdef = "start",
             .max = 64,
             .help = "tail: print the events after this position (end: only new events; -10: the "
                     "last 10; -15m: those appended in the last 15 minutes); -15 is an offset, "
                     "-15m a time",
             AT(tool.from)},
     .scope = TOOL_SCOPE_TAIL,
     .kind = TOOL_FLAG_ACTION,
     .position = 1},
    {.row = {.name = "follow",
             .type = PAWL_FLAG_BOOL,
             .def = 0,
             .help = "tail: keep waiting for new events",
             AT(tool.follow)},
     .scope = TOOL_SCOPE_TAIL,
     .kind = TOOL_FLAG_ACTION},

    /* ---- output ---- */
    {.row = {.name = "json",
             .type = PAWL_FLAG_BOOL,
             .def = 0,
             .help = "Print JSON instead of a table",
             AT(tool.json)},
     .scope = TOOL_SCOPE_STATUS | TOOL_SCOPE_CONFIG | TOOL_SCOPE_TAIL | TOOL_SCOPE_DEAD_LETTERS,
     .kind = TOOL_FLAG_ACTION},
    {.row = {.name = "watch",
             .type = PAWL_FLAG_DURATION,
             .def = 0,
             .min = 0,
             .max = HOUR_MS,
             .help = "status: refresh in place at this interval; 0: print once",
             AT(tool.watch_ms)},
     .scope = TOOL_SCOPE_STATUS,
     .kind = TOOL_FLAG_ACTION},
    {.row = {.name = "metrics",
             .type = PAWL_FLAG_BOOL,
             .def = 0,
             .help = "status: also print totals, and with --metrics-port the metrics of the pawl "
                     "process serving there (counters, gauges, p50/p99/p99.9 of each histogram)",
             AT(tool.metrics)},
     .scope = TOOL_SCOPE_STATUS,
     .kind = TOOL_FLAG_ACTION},
    {.row = {.name = "progress",
             .type = PAWL_FLAG_ENUM,
             .def = 0, /* auto */
             .choices = progress_modes,
             .help =
                 "Progress display: auto (live line on a terminal, plain lines otherwise), live, "
                 "plain, off",
             AT(tool.progress)},
     .scope = TOOL_SCOPE_DEMO | TOOL_SCOPE_BENCH | TOOL_SCOPE_APPEND | TOOL_SCOPE_RUN,
     .kind = TOOL_FLAG_SETTING},
    {.row = {.name = "progress-interval",
             .type = PAWL_FLAG_DURATION,
             .def = 5000,
             .min = 100,
             .max = HOUR_MS,
             .help = "Period of plain (non-terminal) progress lines",
             AT(tool.progress_ms)},
     .scope = TOOL_SCOPE_DEMO | TOOL_SCOPE_BENCH | TOOL_SCOPE_APPEND | TOOL_SCOPE_RUN,
     .kind = TOOL_FLAG_SETTING},

    /* ---- administration ---- */
    {.row = {.name = "execute",
             .type = PAWL_FLAG_BOOL,
             .def = 0,
             .help =
                 "Do it; without this flag reset, split, merge, delete, retention and dead-letters "
                 "retry/drop only print what they would do",
             AT(tool.execute)},
     .scope = TOOL_SCOPE_RESET | TOOL_SCOPE_SPLIT | TOOL_SCOPE_MERGE | TOOL_SCOPE_DELETE |
              TOOL_SCOPE_RETENTION | TOOL_SCOPE_DEAD_LETTERS,
     .kind = TOOL_FLAG_ACTION},
    {.row = {.name = "before",
             .type = PAWL_FLAG_STRING,
             .sdef = NULL,
             .max = 64,
             .help = "retention: the new low-watermark: an index N (the log will start at N, "
                     "dropping the events below it; 0: only show the log's partitions), or another "
                     "position, just after which the log will start (-1000: keep the last 1000 "
                     "events; -7d: those appended in the last 7 days; end: none)",
             AT(tool.before)},
     .scope = TOOL_SCOPE_RETENTION,
     .kind = TOOL_FLAG_ACTION,
     .position = 1},
    {.row = {.name = "archive",
             .type = PAWL_FLAG_STRING,
             .sdef = NULL,
             .max = 4096,
             .help =
                 "retention: first write the events to be dropped to this file (JSON lines that "
                 "`pawl append` loads; it must not exist)",
             AT(tool.archive)},
     .scope = TOOL_SCOPE_RETENTION,
     .kind = TOOL_FLAG_ACTION},
    {.row = {.name = "rotate",
             .type = PAWL_FLAG_BOOL,
             .def = 0,
             .help = "retention: close the partition that receives new appends, so that its events "
                     "can be dropped by a later retention",
             AT(tool.rotate)},
     .scope = TOOL_SCOPE_RETENTION,
     .kind = TOOL_FLAG_ACTION},
    {.row = {.name = "force",
             .type = PAWL_FLAG_BOOL,
             .def = 0,
             .help =
                 "retention: drop even though a processor's token is below the new low-watermark "
                 "(it will fail to read until reset)",
             AT(tool.force)},
     .scope = TOOL_SCOPE_RETENTION,
     .kind = TOOL_FLAG_ACTION},
    {.row = {.name = "to",
             .type = PAWL_FLAG_STRING,
             .sdef = NULL,
             .max = 64,
             .help = "reset: the position to move the tokens to (start: replay everything; end: "
                     "skip everything so far; -1h: replay what was appended in the last hour); "
                     "dead-letters drop: drop the letters up to this index (an index only)",
             AT(tool.to)},
     .scope = TOOL_SCOPE_RESET | TOOL_SCOPE_DEAD_LETTERS,
     .kind = TOOL_FLAG_ACTION,
     .position = 1},
    {.row = {.name = "stream",
             .type = PAWL_FLAG_STRING,
             .sdef = NULL,
             .max = PAWL_STREAM_ID_MAX,
             .help = "dead-letters show, retry, drop: the stream; tail: print this stream's "
                     "events only (--from is then a sequence number of the stream)",
             AT(tool.stream)},
     .scope = TOOL_SCOPE_DEAD_LETTERS | TOOL_SCOPE_TAIL,
     .kind = TOOL_FLAG_ACTION},
    {.row = {.name = "category",
             .type = PAWL_FLAG_STRING,
             .sdef = NULL,
             .max = 65536,
             .help = "Only events of streams in these categories (comma-separated; a stream's "
                     "category is its id up to the first '-'), filtered in the server. run: part "
                     "of a new processor's definition; reset: changes it",
             AT(tool.categories)},
     .scope = TOOL_SCOPE_TAIL | TOOL_SCOPE_RUN | TOOL_SCOPE_RESET,
     .kind = TOOL_FLAG_ACTION},
    {.row = {.name = "stream-prefix",
             .type = PAWL_FLAG_STRING,
             .sdef = NULL,
             .max = 65536,
             .help = "Only events of streams whose id starts with one of these (comma-separated); "
                     "with --category, a stream matching either is read",
             AT(tool.stream_prefixes)},
     .scope = TOOL_SCOPE_TAIL | TOOL_SCOPE_RUN | TOOL_SCOPE_RESET,
     .kind = TOOL_FLAG_ACTION},
    {.row = {.name = "types",
             .type = PAWL_FLAG_STRING,
             .sdef = NULL,
             .max = 65536,
             .help = "Only events of these types (comma-separated), of the streams the other "
                     "filters select",
             AT(tool.types)},
     .scope = TOOL_SCOPE_TAIL | TOOL_SCOPE_RUN | TOOL_SCOPE_RESET,
     .kind = TOOL_FLAG_ACTION},
    {.row = {.name = "no-filter",
             .type = PAWL_FLAG_BOOL,
             .def = 0,
             .help = "reset: the processor reads every event from now on (drops its filter)",
             AT(tool.no_filter)},
     .scope = TOOL_SCOPE_RESET,
     .kind = TOOL_FLAG_ACTION},
    {.row = {.name = "segment",
             .type = PAWL_FLAG_INT,
             .def = 0,
             .min = 0,
             .max = INT32_MAX,
             .help = "split, merge: the segment id",
             AT(tool.segment)},
     .scope = TOOL_SCOPE_SPLIT | TOOL_SCOPE_MERGE,
     .kind = TOOL_FLAG_ACTION},
    {.row = {.name = "handler",
             .type = PAWL_FLAG_STRING,
             .sdef = "count",
             .max = 64,
             .help =
                 "run: the handler: count, print (JSON lines on stdout), exec (JSON lines to the "
                 "command after --)",
             AT(tool.handler)},
     .scope = TOOL_SCOPE_RUN,
     .kind = TOOL_FLAG_SETTING},

    /* ---- run: handlers that write outside the database (tools/handler_sink.c) ---- */
    {.row = {.name = "output-fsync",
             .type = PAWL_FLAG_BOOL,
             .def = 0,
             .help =
                 "run --handler print: fsync stdout (when it is a regular file) before a token is "
                 "stored, so a machine crash cannot lose printed events the token covers",
             AT(tool.output_fsync)},
     .scope = TOOL_SCOPE_RUN,
     .kind = TOOL_FLAG_SETTING},
    {.row = {.name = "exec-ack-timeout",
             .type = PAWL_FLAG_DURATION,
             .def = 30000,
             .min = 10,
             .max = HOUR_MS,
             .help =
                 "run --handler exec: a batch the command has not acknowledged in this time fails "
                 "(the command is killed, the batch delivered again); also how long a command may "
                 "take to exit once its input ends",
             AT(tool.exec_ack_timeout_ms)},
     .scope = TOOL_SCOPE_RUN,
     .kind = TOOL_FLAG_SETTING},
    {.row = {.name = "stop-db-wait",
             .type = PAWL_FLAG_DURATION,
             .def = 3000,
             .min = 0,
             .max = HOUR_MS,
             .help = "run: while stopping, how long to wait for a database that does not answer "
                     "before giving the stop up (exit 8): the claims not released by then are "
                     "left to expire after --claim-timeout",
             AT(tool.stop_db_wait_ms)},
     .scope = TOOL_SCOPE_RUN,
     .kind = TOOL_FLAG_SETTING},
    {.row = {.name = "server-path",
             .type = PAWL_FLAG_ENUM,
             .def = 0, /* auto */
             .choices = server_paths,
             .help = "init: the server functions to use: native (the pawl_native extension, "
                     "which `make native` builds and installs), sql (the portable PL/pgSQL "
                     "functions), or auto (native when the server has it and the login is a "
                     "superuser, unless the database's pawl.server_path setting says otherwise)",
             AT(tool.server_path)},
     .scope = TOOL_SCOPE_INIT,
     .kind = TOOL_FLAG_SETTING},
    {.row = {.name = "exec-pass-secrets",
             .type = PAWL_FLAG_BOOL,
             .def = 0,
             .help = "run --handler exec: leave the connection secrets (PGPASSWORD and every "
                     "PAWL_*DSN variable, such as PAWL_DSN and PAWL_READ_DSN) in the command's "
                     "environment; without it the command does not get them",
             AT(tool.exec_pass_secrets)},
     .scope = TOOL_SCOPE_RUN,
     .kind = TOOL_FLAG_SETTING},
    {.row = {.name = "csv",
             .type = PAWL_FLAG_STRING,
             .sdef = NULL,
             .max = 4096,
             .help = "bench: also write the results as CSV to this file",
             AT(tool.csv)},
     .scope = TOOL_SCOPE_BENCH,
     .kind = TOOL_FLAG_ACTION},
};

_Static_assert(TOOL_ARRAY_LEN(tflags) <= TOOL_MAX_FLAGS, "raise TOOL_MAX_FLAGS");

size_t tool_flag_count(void)
{
    return TOOL_ARRAY_LEN(tflags);
}

/*
 * The row of each entry of tflags, a library flag's looked up once (tool_flag_at runs inside the
 * loops over the table: looking the name up there would make them quadratic), and the entries
 * in name order for lookups by name (a binary search). Written once under pthread_once,
 * read-only after.
 */
static const struct pawl_flag *rows[TOOL_ARRAY_LEN(tflags)];
static unsigned char by_name[TOOL_ARRAY_LEN(tflags)];
static pthread_once_t rows_once = PTHREAD_ONCE_INIT;
_Static_assert(TOOL_ARRAY_LEN(tflags) <= 256, "by_name holds indexes as unsigned char");

static int by_name_order(const void *a, const void *b)
{
    return strcmp(rows[*(const unsigned char *)a]->name, rows[*(const unsigned char *)b]->name);
}

static void rows_resolve(void)
{
    for (size_t i = 0; i < TOOL_ARRAY_LEN(tflags); i++) {
        rows[i] = tflags[i].lib ? pawl_config_flag_find(tflags[i].lib) : &tflags[i].row;
        TOOL_ASSERT(rows[i] != NULL); /* every LIB() name is a row of pawl's table */
        TOOL_ASSERT(pawl_flag_named(rows[i], rows[i]->name)); /* stored folded */
        by_name[i] = (unsigned char)i;
    }
    qsort(by_name, TOOL_ARRAY_LEN(tflags), sizeof by_name[0], by_name_order);
}

const struct pawl_flag *tool_flag_at(size_t i)
{
    if (i >= TOOL_ARRAY_LEN(tflags))
        return NULL;
    pthread_once(&rows_once, rows_resolve);
    return rows[i];
}

/* name against a table name (lower case, '-'), name folded as pawl_flag_named folds it: 0 when
 * name names it, else the order of strcmp on the folded name. */
static int name_cmp(const char *name, const char *flag)
{
    if (name == flag)
        return 0; /* a row's own name, as the loops over the table pass it */
    for (;; name++, flag++) {
        unsigned char c = *name == '_' ? '-' : (unsigned char)tolower((unsigned char)*name);
        if (c != (unsigned char)*flag || c == '\0')
            return (int)c - (int)(unsigned char)*flag;
    }
}

static int flag_index(const char *name)
{
    if (name == NULL)
        return -1;
    pthread_once(&rows_once, rows_resolve);
    size_t lo = 0, hi = TOOL_ARRAY_LEN(tflags);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = name_cmp(name, rows[by_name[mid]]->name);
        if (c == 0)
            return by_name[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return -1;
}

static int index_of(const struct pawl_flag *f)
{
    for (size_t i = 0; i < TOOL_ARRAY_LEN(tflags); i++)
        if (tool_flag_at(i) == f)
            return (int)i;
    return -1;
}

const struct pawl_flag *tool_flag_find(const char *name)
{
    int i = flag_index(name);
    return i < 0 ? NULL : tool_flag_at((size_t)i);
}

unsigned tool_flag_scope(const struct pawl_flag *f)
{
    int i = index_of(f);
    return i < 0 ? 0 : tflags[i].scope;
}

enum tool_flag_kind tool_flag_kind(const struct pawl_flag *f)
{
    int i = index_of(f);
    return i < 0 ? TOOL_FLAG_SETTING : tflags[i].kind;
}

int tool_flag_is_position(const struct pawl_flag *f)
{
    int i = index_of(f);
    return i < 0 ? 0 : tflags[i].position;
}

/* Every flag's default, filled once under pthread_once and copied by each call (a default owns
 * no string). */
static struct tool_config defaults;
static pthread_once_t defaults_once = PTHREAD_ONCE_INIT;

static void defaults_fill(void)
{
    pawl_config_defaults(&defaults.lib);
    defaults.dashdash = -1;
    for (size_t i = 0; i < TOOL_ARRAY_LEN(tflags); i++)
        if (tflags[i].lib == NULL)
            pawl_flag_set_default(&tflags[i].row, &defaults, &defaults._owned[i]);
}

void tool_config_defaults(struct tool_config *cfg)
{
    pthread_once(&defaults_once, defaults_fill);
    memcpy(cfg, &defaults, sizeof *cfg);
}

void tool_config_fini(struct tool_config *cfg)
{
    if (cfg == NULL)
        return;
    pawl_config_fini(&cfg->lib);
    for (size_t i = 0; i < TOOL_ARRAY_LEN(tflags); i++)
        if (tflags[i].lib == NULL)
            pawl_flag_fini(&tflags[i].row, cfg, &cfg->_owned[i]);
}

static int set_index(struct tool_config *cfg, int idx, const char *value,
                     enum pawl_config_source src, char *err, size_t errlen)
{
    const struct tool_flag *t = &tflags[idx];
    if (t->lib) /* the row's own name: the library's lookup ends at the same pointer */
        return pawl_config_set_from(&cfg->lib, rows[idx]->name, value, src, err, errlen);
    int rc = pawl_flag_set(&t->row, cfg, value, src, &cfg->_owned[idx], err, errlen);
    if (rc == 0)
        cfg->_source[idx] = (unsigned char)src;
    return rc;
}

int tool_config_set_from(struct tool_config *cfg, const char *name, const char *value,
                         enum pawl_config_source source, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (cfg == NULL || name == NULL) {
        if (err && errlen)
            snprintf(err, errlen, "no config or flag name given");
        return PAWL_EINVAL;
    }
    int idx = flag_index(name);
    if (idx < 0) {
        if (err && errlen)
            snprintf(err, errlen, "unknown flag --%.100s", name);
        return PAWL_ENOTFOUND;
    }
    if (value == NULL) {
        if (err && errlen)
            snprintf(err, errlen, "--%s needs a value", tool_flag_at((size_t)idx)->name);
        return PAWL_EINVAL;
    }
    return set_index(cfg, idx, value, source, err, errlen);
}

int tool_config_set(struct tool_config *cfg, const char *name, const char *value, char *err,
                    size_t errlen)
{
    return tool_config_set_from(cfg, name, value, PAWL_SRC_API, err, errlen);
}

int tool_config_get(const struct tool_config *cfg, const char *name, char *out, size_t outlen)
{
    if (cfg == NULL || out == NULL || outlen == 0)
        return PAWL_EINVAL;
    int idx = flag_index(name);
    if (idx < 0) {
        out[0] = '\0';
        return PAWL_ENOTFOUND;
    }
    if (tflags[idx].lib) /* a library row applies to cfg->lib as pawl_config_get does */
        return pawl_flag_get(rows[idx], &cfg->lib, out, outlen);
    return pawl_flag_get(&tflags[idx].row, cfg, out, outlen);
}

enum pawl_config_source tool_config_source_of(const struct tool_config *cfg, const char *name)
{
    int idx = flag_index(name);
    if (cfg == NULL || idx < 0)
        return PAWL_SRC_DEFAULT;
    if (tflags[idx].lib)
        return pawl_config_source_of(&cfg->lib, rows[idx]->name);
    return (enum pawl_config_source)cfg->_source[idx];
}

int tool_config_check(const struct tool_config *cfg, char *err, size_t errlen)
{
    if (cfg == NULL)
        return PAWL_EINVAL;
    int rc = pawl_config_check(&cfg->lib, err, errlen);
    for (size_t i = 0; rc == 0 && i < TOOL_ARRAY_LEN(tflags); i++)
        if (tflags[i].lib == NULL)
            rc = pawl_flag_check(&tflags[i].row, cfg, err, errlen);
    return rc;
}

void tool_config_apply_log(const struct tool_config *cfg)
{
    pawl_config_apply_log(cfg ? &cfg->lib : NULL);
}

int tool_config_resolve_quiet(struct tool_config *cfg)
{
    if (cfg == NULL || !cfg->tool.quiet)
        return 0;
    enum pawl_config_source qsrc = tool_config_source_of(cfg, "quiet");
    if (tool_config_source_of(cfg, "log-level") >= qsrc && qsrc != PAWL_SRC_DEFAULT)
        return 0; /* --log-level given as explicitly as --quiet: it wins */
    if (tool_config_set_from(cfg, "log-level", "warn", qsrc, NULL, 0) != 0)
        return 0;
    return 1;
}

int tool_config_load_env(struct tool_config *cfg, char *const *envp, char *err, size_t errlen)
{
    if (cfg == NULL)
        return PAWL_EINVAL;
    if (envp == NULL)
        return 0;
    /* One pass over the environment: each PAWL_NAME=value entry whose name is exactly a flag's
     * variable gives that flag its value (the last one wins, like getenv's usual behaviour).
     * The values are then set in the table's order, as they always were. */
    const char *value[TOOL_ARRAY_LEN(tflags)] = {0};
    for (char *const *e = envp; *e; e++) {
        if (strncmp(*e, "PAWL_", 5) != 0)
            continue;
        const char *eq = strchr(*e, '=');
        char name[96], env[96];
        size_t n = eq ? (size_t)(eq - *e) : 0;
        if (n <= 5 || n >= sizeof name)
            continue;
        memcpy(name, *e, n);
        name[n] = '\0';
        int i = flag_index(name + 5); /* folded: finds the flag of PAWL_Batch_Size too */
        if (i >= 0 &&
            strcmp(pawl_config_flag_env(tool_flag_at((size_t)i), env, sizeof env), name) == 0)
            value[i] = eq + 1;
    }
    for (size_t i = 0; i < TOOL_ARRAY_LEN(tflags); i++) {
        if (value[i] == NULL || tflags[i].kind == TOOL_FLAG_ACTION)
            continue; /* actions come only from the command line */
        int rc = set_index(cfg, (int)i, value[i], PAWL_SRC_ENV, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* The flag of scope nearest to name (at most a third of its letters wrong), or NULL. */
static const char *closest_flag(const char *name, unsigned scope)
{
    const char *best = NULL;
    size_t len = strlen(name);
    size_t allowed = TOOL_MAX(len / 3, (size_t)1);
    size_t bestd = allowed + 1;
    int letters[256] = {0}; /* of name */
    for (const char *p = name; *p; p++)
        letters[(unsigned char)*p]++;
    for (size_t i = 0; i < TOOL_ARRAY_LEN(tflags); i++) {
        if ((tflags[i].scope & scope) == 0)
            continue;
        /* Every edit adds or removes at most one letter on each side (a swap none), so the
         * distance is at least the letters one name has that the other has not. Most names
         * are that far apart: they are skipped without filling the distance matrix. */
        const char *cand = tool_flag_at(i)->name;
        size_t clen = 0, extra = 0; /* extra: letters of cand that name has not */
        for (const char *p = cand; *p; p++, clen++)
            extra += letters[(unsigned char)*p]-- <= 0;
        for (const char *p = cand; *p; p++)
            letters[(unsigned char)*p]++;
        size_t missing = len - (clen - extra); /* letters of name that cand has not */
        if (TOOL_MAX(extra, missing) >= bestd)
            continue;
        size_t d = tool_edit_distance(name, cand);
        if (d < bestd) {
            bestd = d;
            best = cand;
        }
    }
    return best;
}

int tool_config_env_actions(char *const *envp, char *out, size_t outlen)
{
    int count = 0;
    size_t used = 0;
    if (out && outlen)
        out[0] = '\0';
    for (size_t i = 0; envp && i < TOOL_ARRAY_LEN(tflags); i++) {
        if (tflags[i].kind != TOOL_FLAG_ACTION)
            continue;
        char env[96];
        pawl_config_flag_env(tool_flag_at(i), env, sizeof env);
        size_t n = strlen(env);
        for (char *const *e = envp; *e; e++) {
            if (strncmp(*e, env, n) == 0 && (*e)[n] == '=') {
                if (out && used < outlen) {
                    int w = snprintf(out + used, outlen - used, "%s%s", count ? ", " : "", env);
                    used += w > 0 ? (size_t)w : 0;
                }
                count++;
                break;
            }
        }
    }
    return count;
}

int tool_config_parse_args(struct tool_config *cfg, int argc, char *const *argv, unsigned scope,
                           struct tool_config_args *out, char *err, size_t errlen)
{
    if (cfg == NULL || out == NULL || (argc > 0 && argv == NULL))
        return PAWL_EINVAL;
    memset(out, 0, sizeof *out);
    out->dashdash = -1;
    bool flags_done = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (flags_done || a[0] != '-' || strcmp(a, "-") == 0) {
            if (out->npositional >= TOOL_MAX_POSITIONAL) {
                if (err && errlen)
                    snprintf(err, errlen, "too many arguments (\"%.80s\")", a);
                return PAWL_EINVAL;
            }
            out->positional[out->npositional++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            flags_done = true;
            out->dashdash = out->npositional;
            continue;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            out->help = 1;
            continue;
        }
        if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
            out->version = 1;
            continue;
        }
        if (strcmp(a, "-q") == 0) {
            if ((tflags[flag_index("quiet")].scope & scope) == 0) {
                if (err && errlen)
                    snprintf(err, errlen, "-q does not apply to this command");
                return PAWL_EINVAL;
            }
            int rc = set_index(cfg, flag_index("quiet"), "true", PAWL_SRC_FLAG, err, errlen);
            if (rc != 0)
                return rc;
            continue;
        }
        if (a[1] != '-') {
            if (err && errlen)
                snprintf(err, errlen, "unknown option %.80s (flags are spelled --name)", a);
            return PAWL_ENOTFOUND;
        }
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        char namebuf[96];
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        if (nlen >= sizeof namebuf)
            nlen = sizeof namebuf - 1;
        memcpy(namebuf, name, nlen);
        namebuf[nlen] = '\0';
        const char *value = eq ? eq + 1 : NULL;

        int idx = flag_index(namebuf);
        /* --no-NAME turns a boolean flag off. */
        if (idx < 0 && strncmp(namebuf, "no-", 3) == 0 && value == NULL) {
            int b = flag_index(namebuf + 3);
            if (b >= 0 && tool_flag_at((size_t)b)->type == PAWL_FLAG_BOOL) {
                idx = b;
                value = "false";
            }
        }
        if (idx < 0) {
            const char *near = closest_flag(namebuf, scope);
            if (err && errlen)
                snprintf(err, errlen, "unknown flag --%s%s%s%s", namebuf,
                         near ? " (did you mean --" : "", near ? near : "", near ? "?)" : "");
            return PAWL_ENOTFOUND;
        }
        if ((tflags[idx].scope & scope) == 0) {
            if (err && errlen)
                snprintf(err, errlen, "--%s does not apply to this command",
                         tool_flag_at((size_t)idx)->name);
            return PAWL_EINVAL;
        }
        if (value == NULL) {
            if (tool_flag_at((size_t)idx)->type == PAWL_FLAG_BOOL) {
                value = "true"; /* a bare boolean flag never takes the next argument */
            } else if (i + 1 < argc) {
                value = argv[++i];
            } else {
                if (err && errlen)
                    snprintf(err, errlen, "--%s needs a value (%s)",
                             tool_flag_at((size_t)idx)->name,
                             pawl_config_flag_allowed(tool_flag_at((size_t)idx), namebuf,
                                                      sizeof namebuf));
                return PAWL_EINVAL;
            }
        }
        int rc = set_index(cfg, idx, value, PAWL_SRC_FLAG, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}
