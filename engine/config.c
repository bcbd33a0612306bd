/*
 * config.c — the flag table and its typed parser.
 *
 * The table holds one row per flag: name, type, default, range, help, the tool's commands it
 * applies to and its field in struct pawl_config. The rows of the modules' tunables are not
 * written here: they are expanded from the modules' lists (PAWL_STORE_TUNABLES in pawl/log.h,
 * PAWL_PROCESSOR_TUNABLES in pawl/processor.h), the same lines from which the modules take their
 * defaults and range checks; only the scope (which commands take a flag) is added here. The
 * remaining rows (logging, the DSN, the metrics port, the tool's own settings and actions) are
 * declared here once. From the table come the defaults, parsing with range checks, printing,
 * environment variables and the generated help; test_config_drift holds the modules, the table
 * and the generated reference to the lists.
 *
 * A value is parsed completely and checked against its range before anything is stored: a
 * refused value leaves the config unchanged. The table is immutable static data, safe to read
 * from any thread; a struct pawl_config is plain data owned by its caller.
 */
#include "pawl/config.h"
#include "common.h"
#include "pawl/runtime.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define AT(field)                                                                                  \
    .offset = offsetof(struct pawl_config, field), .size = sizeof(((struct pawl_config *)0)->field)

static const char *const log_levels[] = {"debug", "info", "warn", "error", "off", NULL};
static const char *const log_formats[] = {"text", "json", NULL};
static const char *const progress_modes[] = {"auto", "live", "plain", "off", NULL};

#define S_PROC PAWL_SCOPE_RUN
#define S_STORE                                                                                    \
    (PAWL_SCOPE_APPEND | PAWL_SCOPE_TAIL | PAWL_SCOPE_DEMO | PAWL_SCOPE_BENCH | PAWL_SCOPE_RUN)
#define S_NAMED                                                                                    \
    (PAWL_SCOPE_RUN | PAWL_SCOPE_STATUS | PAWL_SCOPE_RESET | PAWL_SCOPE_SPLIT | PAWL_SCOPE_MERGE | \
     PAWL_SCOPE_DELETE | PAWL_SCOPE_DEAD_LETTERS)
#define S_LOAD (PAWL_SCOPE_DEMO | PAWL_SCOPE_BENCH | PAWL_SCOPE_APPEND)
#define S_DB (PAWL_SCOPE_ALL & ~PAWL_SCOPE_CONFIG)
#define HOUR_MS ((int64_t)3600 * 1000)

/*
 * The rows of the modules' tunables, expanded from their lists. A store flag applies to the
 * commands that open a store, a processor flag to run; SCOPE_<field> widens that for a field
 * (SCOPE_OF yields it when it is defined, the module's scope otherwise).
 */
#define SCOPE_name ~, S_NAMED
#define SCOPE_claim_timeout_ms                                                                     \
    ~, S_PROC | PAWL_SCOPE_STATUS | PAWL_SCOPE_RESET | PAWL_SCOPE_SPLIT | PAWL_SCOPE_MERGE |       \
           PAWL_SCOPE_DELETE
#define SECOND_(a, b, ...) b
#define SECOND(...) SECOND_(__VA_ARGS__)
#define SCOPE_OF(field, dflt) SECOND(SCOPE_##field, dflt, ~)

#define ROW_NUM_(ftype, flag, d, lo, hi, unit_, help_, choices_, sc, at)                           \
    {.name = flag,                                                                                 \
     .type = ftype,                                                                                \
     .def = d,                                                                                     \
     .min = lo,                                                                                    \
     .max = hi,                                                                                    \
     .choices = choices_,                                                                          \
     .help = help_,                                                                                \
     .scope = sc,                                                                                  \
     .unit = unit_,                                                                                \
     AT(at)},
#define ROW_INT(...) ROW_NUM_(PAWL_FLAG_INT, __VA_ARGS__)
#define ROW_BOOL(...) ROW_NUM_(PAWL_FLAG_BOOL, __VA_ARGS__)
#define ROW_DURATION(...) ROW_NUM_(PAWL_FLAG_DURATION, __VA_ARGS__)
#define ROW_ENUM(...) ROW_NUM_(PAWL_FLAG_ENUM, __VA_ARGS__)
#define ROW_BOOL_NOFLAG(...) /* not offered by the tool */
#define ROW_STRING(flag, d, lo, hi, unit_, help_, choices_, sc, at)                                \
    {.name = flag,                                                                                 \
     .type = PAWL_FLAG_STRING,                                                                     \
     .sdef = d,                                                                                    \
     .max = hi,                                                                                    \
     .help = help_,                                                                                \
     .scope = sc,                                                                                  \
     .unit = unit_,                                                                                \
     AT(at)},
#define STORE_ROW(type, field, flag, d, lo, hi, unit, help, choices)                               \
    ROW_##type(flag, d, lo, hi, unit, help, choices, SCOPE_OF(field, S_STORE), store.field)
#define PROCESSOR_ROW(type, field, flag, d, lo, hi, unit, help, choices)                           \
    ROW_##type(flag, d, lo, hi, unit, help, choices, SCOPE_OF(field, S_PROC), processor.field)

static const struct pawl_flag flags[] = {
    /* ---- logging ---- */
    {.name = "log-level",
     .type = PAWL_FLAG_ENUM,
     .def = 1, /* info */
     .choices = log_levels,
     .help = "Lowest level of log messages written",
     .scope = PAWL_SCOPE_ALL,
     AT(log.level)},
    {.name = "log-format",
     .type = PAWL_FLAG_ENUM,
     .def = 0, /* text */
     .choices = log_formats,
     .help = "Log lines as text or as JSON objects",
     .scope = PAWL_SCOPE_ALL,
     AT(log.format)},

    /* ---- database ---- */
    {.name = "dsn",
     .type = PAWL_FLAG_STRING,
     .sdef = NULL,
     .max = 4096,
     .help = "PostgreSQL connection string; empty: libpq's PG* environment if set, else your "
             "private PostgreSQL (pawl-pg), started if needed",
     .scope = S_DB,
     AT(dsn)},

    /* ---- the event log: PAWL_STORE_TUNABLES (pawl/log.h) ---- */
    PAWL_STORE_TUNABLES(STORE_ROW)

    /* ---- metrics ---- */
    {.name = "metrics-port",
     .type = PAWL_FLAG_INT,
     .def = 0,
     .min = 0,
     .max = 65535,
     .help = "Serve Prometheus metrics on http://127.0.0.1:PORT/metrics (0: off); with status "
             "--metrics, read them from the pawl process serving on that port",
     .scope = PAWL_SCOPE_RUN | PAWL_SCOPE_DEMO | PAWL_SCOPE_BENCH | PAWL_SCOPE_APPEND |
              PAWL_SCOPE_TAIL | PAWL_SCOPE_STATUS,
     AT(metrics_port)},

    /* ---- processor: PAWL_PROCESSOR_TUNABLES (pawl/processor.h) ---- */
    PAWL_PROCESSOR_TUNABLES(PROCESSOR_ROW)

    /* ---- generated load (demo, bench, append --generate) ---- */
    {.name = "generate",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_BOOL,
     .def = 0,
     .help = "append: generate events instead of reading JSON lines from stdin",
     .scope = PAWL_SCOPE_APPEND,
     AT(tool.generate)},
    {.name = "rate",
     .type = PAWL_FLAG_DOUBLE,
     .ddef = 2000,
     .dmin = 0,
     .dmax = 1e9,
     .unit = "events/s",
     .help = "Target append rate of all appenders together; 0: as fast as "
             "possible",
     .scope = S_LOAD,
     AT(tool.rate)},
    {.name = "duration",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_DURATION,
     .def = 20000,
     .min = 0,
     .max = 24 * HOUR_MS,
     .help = "How long to generate load; 0: until --count events or interrupted",
     .scope = S_LOAD,
     AT(tool.duration_ms)},
    {.name = "appenders",
     .type = PAWL_FLAG_INT,
     .def = 4,
     .min = 1,
     .max = 256,
     .help = "Concurrent appending connections",
     .scope = S_LOAD,
     AT(tool.appenders)},
    {.name = "events-per-append",
     .type = PAWL_FLAG_INT,
     .def = 10,
     .min = 1,
     .max = 10000,
     .help = "Events per append transaction (generated load; stdin lines are grouped up to this, "
             "and a partial group is appended as soon as the input pauses)",
     .scope = S_LOAD,
     AT(tool.events_per_append)},
    {.name = "payload-bytes",
     .type = PAWL_FLAG_INT,
     .def = 100,
     .min = 0,
     .max = 1 << 20,
     .unit = "bytes",
     .help = "Payload size of generated events",
     .scope = S_LOAD,
     AT(tool.payload_bytes)},
    {.name = "streams",
     .type = PAWL_FLAG_INT,
     .def = 1000,
     .min = 1,
     .max = 10000000,
     .help = "Distinct stream ids the generated events are spread over",
     .scope = S_LOAD,
     AT(tool.streams)},
    {.name = "count",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_INT,
     .def = 0,
     .min = 0,
     .max = INT64_MAX,
     .help = "Stop after this many events; 0: no limit",
     .scope = PAWL_SCOPE_APPEND | PAWL_SCOPE_TAIL,
     AT(tool.count)},
    {.name = "wait",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_BOOL,
     .def = 0,
     .help = "append: wait until the finalizer gave the appended events their final indexes, and "
             "print them",
     .scope = PAWL_SCOPE_APPEND,
     AT(tool.wait)},

    /* ---- reading ---- */
    {.name = "from",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_INT,
     .def = 0,
     .min = -1,
     .max = INT64_MAX,
     .help = "tail: print events after this index; -1: only events finalized from now on",
     .scope = PAWL_SCOPE_TAIL,
     AT(tool.from)},
    {.name = "follow",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_BOOL,
     .def = 0,
     .help = "tail: keep waiting for new events",
     .scope = PAWL_SCOPE_TAIL,
     AT(tool.follow)},

    /* ---- output ---- */
    {.name = "json",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_BOOL,
     .def = 0,
     .help = "Print JSON instead of a table",
     .scope = PAWL_SCOPE_STATUS | PAWL_SCOPE_CONFIG | PAWL_SCOPE_TAIL,
     AT(tool.json)},
    {.name = "watch",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_DURATION,
     .def = 0,
     .min = 0,
     .max = HOUR_MS,
     .help = "status: refresh in place at this interval; 0: print once",
     .scope = PAWL_SCOPE_STATUS,
     AT(tool.watch_ms)},
    {.name = "metrics",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_BOOL,
     .def = 0,
     .help = "status: also print totals, and with --metrics-port the metrics of the pawl "
             "process serving there (counters, gauges, p50/p99/p99.9 of each histogram)",
     .scope = PAWL_SCOPE_STATUS,
     AT(tool.metrics)},
    {.name = "progress",
     .type = PAWL_FLAG_ENUM,
     .def = 0, /* auto */
     .choices = progress_modes,
     .help = "Progress display: auto (live line on a terminal, plain lines otherwise), live, "
             "plain, off",
     .scope = PAWL_SCOPE_DEMO | PAWL_SCOPE_BENCH | PAWL_SCOPE_APPEND | PAWL_SCOPE_RUN,
     AT(tool.progress)},
    {.name = "progress-interval",
     .type = PAWL_FLAG_DURATION,
     .def = 5000,
     .min = 100,
     .max = HOUR_MS,
     .help = "Period of plain (non-terminal) progress lines",
     .scope = PAWL_SCOPE_DEMO | PAWL_SCOPE_BENCH | PAWL_SCOPE_APPEND | PAWL_SCOPE_RUN,
     AT(tool.progress_ms)},

    /* ---- administration ---- */
    {.name = "execute",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_BOOL,
     .def = 0,
     .help = "Do it; without this flag reset, split, merge, delete, retention and dead-letters "
             "retry/drop only print what they would do",
     .scope = PAWL_SCOPE_RESET | PAWL_SCOPE_SPLIT | PAWL_SCOPE_MERGE | PAWL_SCOPE_DELETE |
              PAWL_SCOPE_RETENTION | PAWL_SCOPE_DEAD_LETTERS,
     AT(tool.execute)},
    {.name = "before",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_INT,
     .def = 0,
     .min = 0,
     .max = INT64_MAX,
     .help = "retention: the new low-watermark: the log will start at this index (events "
             "below it are dropped); 0: only show the log's partitions",
     .scope = PAWL_SCOPE_RETENTION,
     AT(tool.before)},
    {.name = "archive",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_STRING,
     .sdef = NULL,
     .max = 4096,
     .help = "retention: first write the events to be dropped to this file (JSON lines that "
             "`pawl append` loads; it must not exist)",
     .scope = PAWL_SCOPE_RETENTION,
     AT(tool.archive)},
    {.name = "rotate",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_BOOL,
     .def = 0,
     .help = "retention: close the partition that receives new appends, so that its events "
             "can be dropped by a later retention",
     .scope = PAWL_SCOPE_RETENTION,
     AT(tool.rotate)},
    {.name = "force",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_BOOL,
     .def = 0,
     .help = "retention: drop even though a processor's token is below the new low-watermark "
             "(it will fail to read until reset)",
     .scope = PAWL_SCOPE_RETENTION,
     AT(tool.force)},
    {.name = "to",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_STRING,
     .sdef = NULL,
     .max = 64,
     .help = "reset target: start, end, an index, or a time (ISO 8601, e.g. "
             "2026-11-30T06:00:00Z); dead-letters drop: drop the letters up to this index",
     .scope = PAWL_SCOPE_RESET | PAWL_SCOPE_DEAD_LETTERS,
     AT(tool.to)},
    {.name = "stream",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_STRING,
     .sdef = NULL,
     .max = PAWL_STREAM_ID_MAX,
     .help = "dead-letters show, retry, drop: the stream",
     .scope = PAWL_SCOPE_DEAD_LETTERS,
     AT(tool.stream)},
    {.name = "segment",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_INT,
     .def = 0,
     .min = 0,
     .max = INT32_MAX,
     .help = "split, merge: the segment id",
     .scope = PAWL_SCOPE_SPLIT | PAWL_SCOPE_MERGE,
     AT(tool.segment)},
    {.name = "handler",
     .type = PAWL_FLAG_STRING,
     .sdef = "count",
     .max = 64,
     .help = "run: the handler: count, print (JSON lines on stdout), exec (JSON lines to the "
             "command after --), projection (the snapshotting projection example), async (the "
             "asynchronous sink example)",
     .scope = PAWL_SCOPE_RUN,
     AT(tool.handler)},

    /* ---- run: handlers that write outside the database (tools/handler_sink.c) ---- */
    {.name = "output-fsync",
     .type = PAWL_FLAG_BOOL,
     .def = 0,
     .help = "run --handler print: fsync stdout (when it is a regular file) before a token is "
             "stored, so a machine crash cannot lose printed events the token covers",
     .scope = PAWL_SCOPE_RUN,
     AT(tool.output_fsync)},
    {.name = "exec-ack-timeout",
     .type = PAWL_FLAG_DURATION,
     .def = 30000,
     .min = 10,
     .max = HOUR_MS,
     .help = "run --handler exec: a batch the command has not acknowledged in this time fails "
             "(the command is killed, the batch delivered again); also how long a command may "
             "take to exit once its input ends",
     .scope = PAWL_SCOPE_RUN,
     AT(tool.exec_ack_timeout_ms)},
    {.name = "csv",
     .kind = PAWL_FLAG_ACTION,
     .type = PAWL_FLAG_STRING,
     .sdef = NULL,
     .max = 4096,
     .help = "bench: also write the results as CSV to this file",
     .scope = PAWL_SCOPE_BENCH,
     AT(tool.csv)},
};

_Static_assert(PAWL_ARRAY_LEN(flags) <= PAWL_CONFIG_MAX_FLAGS, "raise PAWL_CONFIG_MAX_FLAGS");

size_t pawl_config_flag_count(void)
{
    return PAWL_ARRAY_LEN(flags);
}

const struct pawl_flag *pawl_config_flag_at(size_t i)
{
    return i < PAWL_ARRAY_LEN(flags) ? &flags[i] : NULL;
}

/* "batch_size" and "BATCH-SIZE" name the flag "batch-size". */
static bool name_matches(const char *flag, const char *name)
{
    for (; *flag && *name; flag++, name++) {
        char c = *name == '_' ? '-' : (char)tolower((unsigned char)*name);
        if (c != *flag)
            return false;
    }
    return *flag == '\0' && *name == '\0';
}

static int flag_index(const char *name)
{
    if (name == NULL)
        return -1;
    for (size_t i = 0; i < PAWL_ARRAY_LEN(flags); i++)
        if (name_matches(flags[i].name, name))
            return (int)i;
    return -1;
}

const struct pawl_flag *pawl_config_flag_find(const char *name)
{
    int i = flag_index(name);
    return i < 0 ? NULL : &flags[i];
}

char *pawl_config_flag_env(const struct pawl_flag *f, char *out, size_t outlen)
{
    if (outlen == 0)
        return out;
    size_t n = (size_t)snprintf(out, outlen, "PAWL_");
    for (const char *p = f->name; *p && n + 1 < outlen; p++)
        out[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    out[n < outlen ? n : outlen - 1] = '\0';
    return out;
}

/* Print a millisecond count in the largest unit that divides it. */
static void format_ms(int64_t ms, char *out, size_t outlen)
{
    if (ms != 0 && ms % HOUR_MS == 0)
        snprintf(out, outlen, "%" PRId64 "h", ms / HOUR_MS);
    else if (ms != 0 && ms % 60000 == 0)
        snprintf(out, outlen, "%" PRId64 "m", ms / 60000);
    else if (ms != 0 && ms % 1000 == 0)
        snprintf(out, outlen, "%" PRId64 "s", ms / 1000);
    else
        snprintf(out, outlen, "%" PRId64 "ms", ms);
}

char *pawl_config_flag_default(const struct pawl_flag *f, char *out, size_t outlen)
{
    switch (f->type) {
    case PAWL_FLAG_BOOL:
        snprintf(out, outlen, "%s", f->def ? "true" : "false");
        break;
    case PAWL_FLAG_INT:
        snprintf(out, outlen, "%" PRId64, f->def);
        break;
    case PAWL_FLAG_DOUBLE:
        snprintf(out, outlen, "%g", f->ddef);
        break;
    case PAWL_FLAG_DURATION:
        if (f->def == 0)
            snprintf(out, outlen, "0");
        else
            format_ms(f->def, out, outlen);
        break;
    case PAWL_FLAG_STRING:
        snprintf(out, outlen, "%s", f->sdef ? f->sdef : "");
        break;
    case PAWL_FLAG_ENUM:
        snprintf(out, outlen, "%s", f->choices[f->def]);
        break;
    }
    return out;
}

char *pawl_config_flag_allowed(const struct pawl_flag *f, char *out, size_t outlen)
{
    char a[32], b[32];
    switch (f->type) {
    case PAWL_FLAG_BOOL:
        snprintf(out, outlen, "true or false");
        break;
    case PAWL_FLAG_INT:
        snprintf(out, outlen, "an integer in [%" PRId64 ", %" PRId64 "]", f->min, f->max);
        break;
    case PAWL_FLAG_DOUBLE:
        snprintf(out, outlen, "a number in [%g, %g]", f->dmin, f->dmax);
        break;
    case PAWL_FLAG_DURATION:
        format_ms(f->min, a, sizeof a);
        format_ms(f->max, b, sizeof b);
        snprintf(out, outlen, "a duration in [%s, %s] with a unit: ms, s, m, h (1m30s, 1.5s)", a,
                 b);
        break;
    case PAWL_FLAG_STRING:
        if (f->max > 0)
            snprintf(out, outlen, "text of at most %" PRId64 " bytes", f->max);
        else
            snprintf(out, outlen, "text");
        break;
    case PAWL_FLAG_ENUM: {
        size_t n = (size_t)snprintf(out, outlen, "one of");
        for (size_t i = 0; f->choices[i] && n < outlen; i++)
            n += (size_t)snprintf(out + n, outlen - n, "%s%s", i ? ", " : " ", f->choices[i]);
        break;
    }
    }
    return out;
}

/* ---- parsing ---- */

struct parsed {
    int64_t i;
    double d;
    const char *s;
};

static int parse_int(const char *v, int64_t *out)
{
    if (*v == '\0' || isspace((unsigned char)*v))
        return PAWL_EINVAL;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*end != '\0')
        return PAWL_EINVAL;
    if (errno == ERANGE)
        return PAWL_ERANGE;
    *out = x;
    return 0;
}

static int parse_double(const char *v, double *out)
{
    if (*v == '\0' || isspace((unsigned char)*v))
        return PAWL_EINVAL;
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (*end != '\0' || isnan(x))
        return PAWL_EINVAL;
    if (errno == ERANGE || isinf(x))
        return PAWL_ERANGE;
    *out = x;
    return 0;
}

/*
 * <number><unit> parts ("1m30s", "1.5s"); see pawl_config_parse_duration. Each part's number is
 * plain decimal (no sign, exponent or hex: strtod's extras would let "1e3s" or "0x10s" through).
 */
static int parse_duration(const char *v, int64_t *out)
{
    bool neg = false;
    if (*v == '-') {
        neg = true;
        v++;
    }
    if (!isdigit((unsigned char)*v) && *v != '.')
        return PAWL_EINVAL;
    if (strcmp(v, "0") == 0) {
        *out = 0;
        return 0;
    }
    double total = 0;
    int last_rank = 99; /* units must come in decreasing order, each once */
    while (*v) {
        const char *num = v;
        while (isdigit((unsigned char)*v) || *v == '.')
            v++;
        if (v == num)
            return PAWL_EINVAL;
        char buf[64];
        size_t n = (size_t)(v - num);
        if (n >= sizeof buf || (n == 1 && *num == '.'))
            return PAWL_EINVAL;
        memcpy(buf, num, n);
        buf[n] = '\0';
        char *end = NULL;
        double x = strtod(buf, &end);
        if (*end != '\0' || strchr(buf, '.') != strrchr(buf, '.'))
            return PAWL_EINVAL;
        double mult;
        int rank;
        if (strncmp(v, "ms", 2) == 0) {
            mult = 1, rank = 0, v += 2;
        } else if (strncmp(v, "min", 3) == 0) {
            mult = 60000, rank = 2, v += 3;
        } else if (*v == 's') {
            mult = 1000, rank = 1, v += 1;
        } else if (*v == 'm') {
            mult = 60000, rank = 2, v += 1;
        } else if (*v == 'h') {
            mult = 3600000, rank = 3, v += 1;
        } else {
            return PAWL_EINVAL; /* a bare number, or an unknown unit */
        }
        if (rank >= last_rank)
            return PAWL_EINVAL;
        last_rank = rank;
        total += x * mult;
        if (!(total < 9.2e18))
            return PAWL_ERANGE;
    }
    /* Parts in decimal fractions of ms sum exactly when they are whole ms: 0.1s + 0.2s. */
    double r = floor(total + 0.5);
    if (fabs(total - r) > 1e-6 * PAWL_MAX(1.0, total))
        return PAWL_EINVAL; /* below a millisecond */
    *out = neg ? -(int64_t)r : (int64_t)r;
    return 0;
}

/* True when text is a bare number (the old milliseconds), for the error's hint. */
static bool bare_number(const char *v)
{
    if (*v == '-')
        v++;
    if (*v == '\0')
        return false;
    char *end = NULL;
    (void)strtod(v, &end);
    return end != v && *end == '\0' && isdigit((unsigned char)*v);
}

int pawl_config_parse_duration(const char *text, int64_t *ms)
{
    if (text == NULL || ms == NULL)
        return PAWL_EINVAL;
    return parse_duration(text, ms);
}

static int parse_bool(const char *v, int64_t *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < PAWL_ARRAY_LEN(yes); i++) {
        if (strcasecmp(v, yes[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcasecmp(v, no[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    return PAWL_EINVAL;
}

/* Parse and range-check value for f; on failure write the message and return the code. */
static int parse_value(const struct pawl_flag *f, const char *value, const char *label,
                       struct parsed *p, char *err, size_t errlen)
{
    int rc = 0;
    const char *what = NULL;
    switch (f->type) {
    case PAWL_FLAG_BOOL:
        rc = parse_bool(value, &p->i);
        what = "not true or false";
        break;
    case PAWL_FLAG_INT:
        rc = parse_int(value, &p->i);
        what = "not an integer";
        if (rc == 0 && (p->i < f->min || p->i > f->max))
            rc = PAWL_ERANGE;
        break;
    case PAWL_FLAG_DOUBLE:
        rc = parse_double(value, &p->d);
        what = "not a number";
        if (rc == 0 && (p->d < f->dmin || p->d > f->dmax))
            rc = PAWL_ERANGE;
        break;
    case PAWL_FLAG_DURATION:
        rc = parse_duration(value, &p->i);
        what = bare_number(value) ? "a duration needs a unit (e.g. 2s or 2000ms; bare numbers are "
                                    "not taken as milliseconds)"
                                  : "not a duration";
        if (rc == 0 && (p->i < f->min || p->i > f->max))
            rc = PAWL_ERANGE;
        break;
    case PAWL_FLAG_STRING:
        p->s = value;
        if (f->max > 0 && (int64_t)strlen(value) > f->max)
            rc = PAWL_ERANGE;
        break;
    case PAWL_FLAG_ENUM:
        rc = PAWL_EINVAL;
        what = "not a known choice";
        for (size_t i = 0; f->choices[i]; i++) {
            if (strcasecmp(value, f->choices[i]) == 0) {
                p->i = (int64_t)i;
                rc = 0;
                break;
            }
        }
        break;
    }
    if (rc != 0 && err && errlen) {
        char allowed[256];
        pawl_config_flag_allowed(f, allowed, sizeof allowed);
        /* Long strings are cut in the message; the flag's name and the limit say enough. A
         * DSN is never quoted: it may carry a password. */
        if (strcmp(f->name, "dsn") == 0 || strcmp(f->name, "read-dsn") == 0)
            snprintf(err, errlen, "invalid value (%zu bytes, not shown) for %s: %s; expected %s",
                     strlen(value), label, rc == PAWL_ERANGE ? "out of range" : what, allowed);
        else
            snprintf(err, errlen, "invalid value \"%.80s%s\" for %s: %s; expected %s", value,
                     strlen(value) > 80 ? "..." : "", label,
                     rc == PAWL_ERANGE ? "out of range" : what, allowed);
    }
    return rc;
}

static void store_int(void *field, size_t size, int64_t v)
{
    switch (size) {
    case 1: {
        int8_t x = (int8_t)v;
        memcpy(field, &x, 1);
        break;
    }
    case 2: {
        int16_t x = (int16_t)v;
        memcpy(field, &x, 2);
        break;
    }
    case 4: {
        int32_t x = (int32_t)v;
        memcpy(field, &x, 4);
        break;
    }
    default:
        memcpy(field, &v, 8);
        break;
    }
}

static int64_t load_int(const void *field, size_t size)
{
    switch (size) {
    case 1: {
        int8_t x;
        memcpy(&x, field, 1);
        return x;
    }
    case 2: {
        int16_t x;
        memcpy(&x, field, 2);
        return x;
    }
    case 4: {
        int32_t x;
        memcpy(&x, field, 4);
        return x;
    }
    default: {
        int64_t x;
        memcpy(&x, field, 8);
        return x;
    }
    }
}

static void label_for(const struct pawl_flag *f, enum pawl_config_source src, char *out,
                      size_t outlen)
{
    if (src == PAWL_SRC_ENV) {
        char env[96];
        snprintf(out, outlen, "%s (--%s)", pawl_config_flag_env(f, env, sizeof env), f->name);
    } else {
        snprintf(out, outlen, "--%s", f->name);
    }
}

static int set_index(struct pawl_config *cfg, int idx, const char *value,
                     enum pawl_config_source src, char *err, size_t errlen)
{
    const struct pawl_flag *f = &flags[idx];
    char label[160];
    label_for(f, src, label, sizeof label);
    struct parsed p = {0};
    int rc = parse_value(f, value, label, &p, err, errlen);
    if (rc != 0)
        return rc;
    char *field = (char *)cfg + f->offset;
    switch (f->type) {
    case PAWL_FLAG_DOUBLE:
        memcpy(field, &p.d, sizeof p.d);
        break;
    case PAWL_FLAG_STRING: {
        /* An empty string means "not set": modules take NULL as their default. */
        const char *s = p.s[0] ? p.s : NULL;
        bool owned = false;
        if (s && src != PAWL_SRC_DEFAULT) {
            char *copy = pawl_strdup(p.s);
            if (copy == NULL) {
                if (err && errlen)
                    snprintf(err, errlen, "%s: out of memory", label);
                return PAWL_ENOMEM;
            }
            s = copy;
            owned = true;
        }
        if (cfg->_owned[idx]) {
            char *old;
            memcpy(&old, field, sizeof old);
            pawl_free(old);
        }
        memcpy(field, &s, sizeof s);
        cfg->_owned[idx] = owned;
        break;
    }
    default:
        store_int(field, f->size, p.i);
        break;
    }
    cfg->_source[idx] = (unsigned char)src;
    return 0;
}

void pawl_config_defaults(struct pawl_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < PAWL_ARRAY_LEN(flags); i++) {
        /* Defaults are checked by the unit test; a bad one would leave the zero value. A
         * string default is static and stored as it is (a default is never copied). */
        char text[64];
        const char *def = flags[i].type == PAWL_FLAG_STRING
                              ? (flags[i].sdef ? flags[i].sdef : "")
                              : pawl_config_flag_default(&flags[i], text, sizeof text);
        (void)set_index(cfg, (int)i, def, PAWL_SRC_DEFAULT, NULL, 0);
    }
}

void pawl_config_fini(struct pawl_config *cfg)
{
    if (cfg == NULL)
        return;
    for (size_t i = 0; i < PAWL_ARRAY_LEN(flags); i++) {
        if (!cfg->_owned[i])
            continue;
        char *s;
        memcpy(&s, (char *)cfg + flags[i].offset, sizeof s);
        pawl_free(s);
        const char *def = flags[i].sdef;
        memcpy((char *)cfg + flags[i].offset, &def, sizeof def);
        cfg->_owned[i] = 0;
    }
}

int pawl_config_set_from(struct pawl_config *cfg, const char *name, const char *value,
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
            snprintf(err, errlen, "--%s needs a value", flags[idx].name);
        return PAWL_EINVAL;
    }
    return set_index(cfg, idx, value, source, err, errlen);
}

int pawl_config_set(struct pawl_config *cfg, const char *name, const char *value, char *err,
                    size_t errlen)
{
    return pawl_config_set_from(cfg, name, value, PAWL_SRC_API, err, errlen);
}

static int get_index(const struct pawl_config *cfg, int idx, char *out, size_t outlen)
{
    const struct pawl_flag *f = &flags[idx];
    const char *field = (const char *)cfg + f->offset;
    int n = 0;
    switch (f->type) {
    case PAWL_FLAG_BOOL:
        n = snprintf(out, outlen, "%s", load_int(field, f->size) ? "true" : "false");
        break;
    case PAWL_FLAG_INT:
        n = snprintf(out, outlen, "%" PRId64, load_int(field, f->size));
        break;
    case PAWL_FLAG_DOUBLE: {
        double d;
        memcpy(&d, field, sizeof d);
        n = snprintf(out, outlen, "%.17g", d);
        /* Prefer the short form when it reads back as the same number. */
        char shortv[64];
        snprintf(shortv, sizeof shortv, "%g", d);
        if (strtod(shortv, NULL) == d)
            n = snprintf(out, outlen, "%s", shortv);
        break;
    }
    case PAWL_FLAG_DURATION: {
        char tmp[48];
        format_ms(load_int(field, f->size), tmp, sizeof tmp);
        n = snprintf(out, outlen, "%s", tmp);
        break;
    }
    case PAWL_FLAG_STRING: {
        const char *s;
        memcpy(&s, field, sizeof s);
        n = snprintf(out, outlen, "%s", s ? s : "");
        break;
    }
    case PAWL_FLAG_ENUM: {
        int64_t v = load_int(field, f->size);
        size_t nchoices = 0;
        while (f->choices[nchoices])
            nchoices++;
        if (v >= 0 && (size_t)v < nchoices)
            n = snprintf(out, outlen, "%s", f->choices[v]);
        else
            n = snprintf(out, outlen, "%" PRId64, v);
        break;
    }
    }
    return (n < 0 || (size_t)n >= outlen) ? PAWL_ETOOBIG : 0;
}

int pawl_config_get(const struct pawl_config *cfg, const char *name, char *out, size_t outlen)
{
    if (cfg == NULL || out == NULL || outlen == 0)
        return PAWL_EINVAL;
    int idx = flag_index(name);
    if (idx < 0) {
        out[0] = '\0';
        return PAWL_ENOTFOUND;
    }
    return get_index(cfg, idx, out, outlen);
}

enum pawl_config_source pawl_config_source_of(const struct pawl_config *cfg, const char *name)
{
    int idx = flag_index(name);
    return (cfg == NULL || idx < 0) ? PAWL_SRC_DEFAULT : (enum pawl_config_source)cfg->_source[idx];
}

const char *pawl_config_source_name(enum pawl_config_source s)
{
    switch (s) {
    case PAWL_SRC_DEFAULT:
        return "default";
    case PAWL_SRC_API:
        return "api";
    case PAWL_SRC_ENV:
        return "env";
    case PAWL_SRC_FLAG:
        return "flag";
    }
    return "?";
}

int pawl_config_check(const struct pawl_config *cfg, char *err, size_t errlen)
{
    if (cfg == NULL)
        return PAWL_EINVAL;
    for (size_t i = 0; i < PAWL_ARRAY_LEN(flags); i++) {
        char text[4200];
        int rc = get_index(cfg, (int)i, text, sizeof text);
        if (rc == PAWL_ETOOBIG && flags[i].type == PAWL_FLAG_STRING) {
            if (err && errlen)
                snprintf(err, errlen, "--%s: value longer than %" PRId64 " bytes", flags[i].name,
                         flags[i].max);
            return PAWL_ERANGE;
        }
        /* An enum field holding a number outside its choices prints as that number. */
        struct parsed p;
        char label[160];
        label_for(&flags[i], PAWL_SRC_API, label, sizeof label);
        rc = parse_value(&flags[i], text, label, &p, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

void pawl_config_apply_log(const struct pawl_config *cfg)
{
    if (cfg == NULL)
        return;
    pawl_log_set_level((enum pawl_log_level)cfg->log.level);
    pawl_log_set_format((enum pawl_log_format)cfg->log.format);
}

/* ---- environment and argument vectors (handed in by the tool; never read here) ---- */

int pawl_config_load_env(struct pawl_config *cfg, char *const *envp, char *err, size_t errlen)
{
    if (cfg == NULL)
        return PAWL_EINVAL;
    if (envp == NULL)
        return 0;
    for (size_t i = 0; i < PAWL_ARRAY_LEN(flags); i++) {
        if (flags[i].kind == PAWL_FLAG_ACTION)
            continue; /* actions come only from the command line */
        char env[96];
        pawl_config_flag_env(&flags[i], env, sizeof env);
        size_t n = strlen(env);
        const char *value = NULL;
        for (char *const *e = envp; *e; e++)
            if (strncmp(*e, env, n) == 0 && (*e)[n] == '=')
                value = *e + n + 1; /* the last one wins, like getenv's usual behaviour */
        if (value == NULL)
            continue;
        int rc = set_index(cfg, (int)i, value, PAWL_SRC_ENV, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* The flag of scope nearest to name (at most a third of its letters wrong), or NULL. */
static const char *closest_flag(const char *name, unsigned scope)
{
    const char *best = NULL;
    size_t bestd = 99;
    for (size_t i = 0; i < PAWL_ARRAY_LEN(flags); i++) {
        if ((flags[i].scope & scope) == 0)
            continue;
        size_t d = pawl_edit_distance(name, flags[i].name);
        if (d < bestd) {
            bestd = d;
            best = flags[i].name;
        }
    }
    size_t allowed = PAWL_MAX(strlen(name) / 3, (size_t)1);
    return bestd <= allowed ? best : NULL;
}

int pawl_config_env_actions(char *const *envp, char *out, size_t outlen)
{
    int count = 0;
    size_t used = 0;
    if (out && outlen)
        out[0] = '\0';
    for (size_t i = 0; envp && i < PAWL_ARRAY_LEN(flags); i++) {
        if (flags[i].kind != PAWL_FLAG_ACTION)
            continue;
        char env[96];
        pawl_config_flag_env(&flags[i], env, sizeof env);
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

int pawl_config_parse_args(struct pawl_config *cfg, int argc, char *const *argv, unsigned scope,
                           struct pawl_config_args *out, char *err, size_t errlen)
{
    if (cfg == NULL || out == NULL || (argc > 0 && argv == NULL))
        return PAWL_EINVAL;
    memset(out, 0, sizeof *out);
    bool flags_done = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (flags_done || a[0] != '-' || strcmp(a, "-") == 0) {
            if (out->npositional >= PAWL_CONFIG_MAX_POSITIONAL) {
                if (err && errlen)
                    snprintf(err, errlen, "too many arguments (\"%.80s\")", a);
                return PAWL_EINVAL;
            }
            out->positional[out->npositional++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            flags_done = true;
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
            if (b >= 0 && flags[b].type == PAWL_FLAG_BOOL) {
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
        if ((flags[idx].scope & scope) == 0) {
            if (err && errlen)
                snprintf(err, errlen, "--%s does not apply to this command", flags[idx].name);
            return PAWL_EINVAL;
        }
        if (value == NULL) {
            if (flags[idx].type == PAWL_FLAG_BOOL) {
                value = "true"; /* a bare boolean flag never takes the next argument */
            } else if (i + 1 < argc) {
                value = argv[++i];
            } else {
                if (err && errlen)
                    snprintf(err, errlen, "--%s needs a value (%s)", flags[idx].name,
                             pawl_config_flag_allowed(&flags[idx], namebuf, sizeof namebuf));
                return PAWL_EINVAL;
            }
        }
        int rc = set_index(cfg, idx, value, PAWL_SRC_FLAG, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}
