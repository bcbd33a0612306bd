/*
 * config.c — the library's flag table (pawl/config.h) and its typed parser.
 *
 * The table holds one row per flag of struct pawl_config: name, type, default, range, unit,
 * help and the field. The store's and the processor's rows are not written here: they are
 * expanded from the modules' tunable lists (PAWL_STORE_TUNABLES in pawl/log.h,
 * PAWL_PROCESSOR_TUNABLES in pawl/processor.h), the same lines from which the modules take their
 * defaults and range checks. Only logging and the DSN are declared here. The table lives in the
 * store's layer because it composes the store's options with the engine's; the engine knows
 * neither it nor the store. The `pawl` tool adds its commands' scopes and its own flags
 * (tools/tool_config.c); test_config_drift holds the modules, this table and the generated
 * reference to the lists.
 *
 * A value is parsed completely and checked against its range before anything is stored: a
 * refused value leaves the config unchanged. The table is immutable static data, safe to read
 * from any thread (its index by name and the defaults are built from it once, under
 * pthread_once); a struct pawl_config is plain data owned by its caller.
 */
#include "pawl/config.h"
#include "common.h"
#include "pawl/runtime.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define AT(field)                                                                                  \
    .offset = offsetof(struct pawl_config, field), .size = sizeof(((struct pawl_config *)0)->field)

static const char *const log_levels[] = {"debug", "info", "warn", "error", "off", NULL};
static const char *const log_formats[] = {"text", "json", NULL};
#define HOUR_MS ((int64_t)3600 * 1000)

/* The rows of the modules' tunables, expanded from their lists. */
#define ROW_NUM_(ftype, flag, d, lo, hi, unit_, help_, choices_, at)                               \
    {.name = flag,                                                                                 \
     .type = ftype,                                                                                \
     .def = d,                                                                                     \
     .min = lo,                                                                                    \
     .max = hi,                                                                                    \
     .choices = choices_,                                                                          \
     .help = help_,                                                                                \
     .unit = unit_,                                                                                \
     AT(at)},
#define ROW_INT(...) ROW_NUM_(PAWL_FLAG_INT, __VA_ARGS__)
#define ROW_BOOL(...) ROW_NUM_(PAWL_FLAG_BOOL, __VA_ARGS__)
#define ROW_DURATION(...) ROW_NUM_(PAWL_FLAG_DURATION, __VA_ARGS__)
#define ROW_ENUM(...) ROW_NUM_(PAWL_FLAG_ENUM, __VA_ARGS__)
#define ROW_BOOL_NOFLAG(...) /* no flag */
#define ROW_STRING(flag, d, lo, hi, unit_, help_, choices_, at)                                    \
    {.name = flag,                                                                                 \
     .type = PAWL_FLAG_STRING,                                                                     \
     .sdef = d,                                                                                    \
     .max = hi,                                                                                    \
     .help = help_,                                                                                \
     .unit = unit_,                                                                                \
     AT(at)},
#define STORE_ROW(type, field, flag, d, lo, hi, unit, help, choices)                               \
    ROW_##type(flag, d, lo, hi, unit, help, choices, store.field)
#define PROCESSOR_ROW(type, field, flag, d, lo, hi, unit, help, choices)                           \
    ROW_##type(flag, d, lo, hi, unit, help, choices, processor.field)

static const struct pawl_flag flags[] = {
    /* ---- logging ---- */
    {.name = "log-level",
     .type = PAWL_FLAG_ENUM,
     .def = PAWL_LOG_INFO,
     .choices = log_levels,
     .help = "Lowest level of log messages written: warn for a quiet command (its results "
             "and summary lines still print), debug for start-up detail (I/O backends, "
             "migrations, the database chosen)",
     AT(log.level)},
    {.name = "log-format",
     .type = PAWL_FLAG_ENUM,
     .def = PAWL_LOG_TEXT,
     .choices = log_formats,
     .help = "Log lines as text or as JSON objects",
     AT(log.format)},

    /* ---- database ---- */
    {.name = "dsn",
     .type = PAWL_FLAG_STRING,
     .sdef = NULL,
     .max = 4096,
     .help = "PostgreSQL connection string; empty: libpq's PG* environment if set, else your "
             "private PostgreSQL (pawl-pg), started if needed",
     AT(dsn)},

    /* ---- the event log and the processor: their tunable lists ---- */
    PAWL_STORE_TUNABLES(STORE_ROW)
    /* (the processor's rows follow the store's) */
    PAWL_PROCESSOR_TUNABLES(PROCESSOR_ROW)};

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
bool pawl_flag_named(const struct pawl_flag *f, const char *name)
{
    if (f == NULL || name == NULL)
        return false;
    const char *flag = f->name;
    for (; *flag && *name; flag++, name++) {
        char c = *name == '_' ? '-' : (char)tolower((unsigned char)*name);
        if (c != *flag)
            return false;
    }
    return *flag == '\0' && *name == '\0';
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

/* The table's indexes in name order, for lookups by name (a binary search: set, get and
 * source_of run one per call, and a program can call them for every flag). Sorted once under
 * pthread_once, read-only after. */
static unsigned char by_name[PAWL_ARRAY_LEN(flags)];
_Static_assert(PAWL_ARRAY_LEN(flags) <= 256, "by_name holds indexes as unsigned char");
static pthread_once_t by_name_once = PTHREAD_ONCE_INIT;

static int by_name_order(const void *a, const void *b)
{
    return strcmp(flags[*(const unsigned char *)a].name, flags[*(const unsigned char *)b].name);
}

static void by_name_sort(void)
{
    for (size_t i = 0; i < PAWL_ARRAY_LEN(flags); i++) {
        PAWL_ASSERT(name_cmp(flags[i].name, flags[i].name) == 0); /* stored folded */
        by_name[i] = (unsigned char)i;
    }
    qsort(by_name, PAWL_ARRAY_LEN(flags), sizeof by_name[0], by_name_order);
}

static int flag_index(const char *name)
{
    if (name == NULL)
        return -1;
    pthread_once(&by_name_once, by_name_sort);
    size_t lo = 0, hi = PAWL_ARRAY_LEN(flags);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = name_cmp(name, flags[by_name[mid]].name);
        if (c == 0)
            return by_name[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
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

/* How a message names the flag: "--batch-size", or "PAWL_BATCH_SIZE (--batch-size)" for a value
 * from the environment. Formatted only when a message is written. */
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

/* Parse and range-check value for f; on failure write the message (naming the flag as src
 * gave it) and return the code. */
static int parse_value(const struct pawl_flag *f, const char *value, enum pawl_config_source src,
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
        char allowed[256], label[160];
        pawl_config_flag_allowed(f, allowed, sizeof allowed);
        label_for(f, src, label, sizeof label);
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

int pawl_flag_set(const struct pawl_flag *f, void *base, const char *value,
                  enum pawl_config_source src, unsigned char *owned, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    char label[160];
    if (value == NULL) {
        if (err && errlen) {
            label_for(f, src, label, sizeof label);
            snprintf(err, errlen, "%s needs a value", label);
        }
        return PAWL_EINVAL;
    }
    struct parsed p = {0};
    int rc = parse_value(f, value, src, &p, err, errlen);
    if (rc != 0)
        return rc;
    char *field = (char *)base + f->offset;
    switch (f->type) {
    case PAWL_FLAG_DOUBLE:
        memcpy(field, &p.d, sizeof p.d);
        break;
    case PAWL_FLAG_STRING: {
        /* An empty string means "not set": modules take NULL as their default. */
        const char *s = p.s[0] ? p.s : NULL;
        bool copied = false;
        if (s && src != PAWL_SRC_DEFAULT) {
            char *copy = pawl__strdup(p.s);
            if (copy == NULL) {
                if (err && errlen) {
                    label_for(f, src, label, sizeof label);
                    snprintf(err, errlen, "%s: out of memory", label);
                }
                return PAWL_ENOMEM;
            }
            s = copy;
            copied = true;
        }
        if (*owned) {
            char *old;
            memcpy(&old, field, sizeof old);
            pawl_free(old);
        }
        memcpy(field, &s, sizeof s);
        *owned = copied;
        break;
    }
    default:
        store_int(field, f->size, p.i);
        break;
    }
    return 0;
}

void pawl_flag_set_default(const struct pawl_flag *f, void *base, unsigned char *owned)
{
    /* The default is stored as the row holds it, not printed and parsed again: the unit tests
     * check that every default passes pawl_flag_check and prints back as itself. A string
     * default is static and stored as it is (never copied); "" stores NULL, as a set does. */
    char *field = (char *)base + f->offset;
    switch (f->type) {
    case PAWL_FLAG_DOUBLE:
        memcpy(field, &f->ddef, sizeof f->ddef);
        break;
    case PAWL_FLAG_STRING: {
        const char *s = f->sdef && f->sdef[0] ? f->sdef : NULL;
        if (*owned) {
            char *old;
            memcpy(&old, field, sizeof old);
            pawl_free(old);
        }
        memcpy(field, &s, sizeof s);
        *owned = 0;
        break;
    }
    default: /* BOOL, INT, DURATION, ENUM (the choice's index) */
        store_int(field, f->size, f->def);
        break;
    }
}

void pawl_flag_fini(const struct pawl_flag *f, void *base, unsigned char *owned)
{
    if (!*owned)
        return;
    char *s;
    memcpy(&s, (char *)base + f->offset, sizeof s);
    pawl_free(s);
    memcpy((char *)base + f->offset, &f->sdef, sizeof f->sdef);
    *owned = 0;
}

static int set_index(struct pawl_config *cfg, int idx, const char *value,
                     enum pawl_config_source src, char *err, size_t errlen)
{
    int rc = pawl_flag_set(&flags[idx], cfg, value, src, &cfg->_owned[idx], err, errlen);
    if (rc == 0)
        cfg->_source[idx] = (unsigned char)src;
    return rc;
}

/* Every flag's default, filled once under pthread_once and copied by each call (a default owns
 * no string, so a copy is a config of its own). */
static struct pawl_config defaults;
static pthread_once_t defaults_once = PTHREAD_ONCE_INIT;

static void defaults_fill(void)
{
    for (size_t i = 0; i < PAWL_ARRAY_LEN(flags); i++)
        pawl_flag_set_default(&flags[i], &defaults, &defaults._owned[i]);
}

void pawl_config_defaults(struct pawl_config *cfg)
{
    pthread_once(&defaults_once, defaults_fill);
    memcpy(cfg, &defaults, sizeof *cfg);
}

void pawl_config_fini(struct pawl_config *cfg)
{
    if (cfg == NULL)
        return;
    for (size_t i = 0; i < PAWL_ARRAY_LEN(flags); i++)
        pawl_flag_fini(&flags[i], cfg, &cfg->_owned[i]);
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

int pawl_flag_get(const struct pawl_flag *f, const void *base, char *out, size_t outlen)
{
    if (outlen == 0)
        return PAWL_ETOOBIG;
    const char *field = (const char *)base + f->offset;
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
    return pawl_flag_get(&flags[idx], cfg, out, outlen);
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

int pawl_flag_check(const struct pawl_flag *f, const void *base, char *err, size_t errlen)
{
    char text[4200];
    int rc = pawl_flag_get(f, base, text, sizeof text);
    if (rc == PAWL_ETOOBIG && f->type == PAWL_FLAG_STRING) {
        if (err && errlen)
            snprintf(err, errlen, "--%s: value longer than %" PRId64 " bytes", f->name, f->max);
        return PAWL_ERANGE;
    }
    /* An enum field holding a number outside its choices prints as that number. */
    struct parsed p;
    return parse_value(f, text, PAWL_SRC_API, &p, err, errlen);
}

int pawl_config_check(const struct pawl_config *cfg, char *err, size_t errlen)
{
    if (cfg == NULL)
        return PAWL_EINVAL;
    for (size_t i = 0; i < PAWL_ARRAY_LEN(flags); i++) {
        int rc = pawl_flag_check(&flags[i], cfg, err, errlen);
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

/* ---- the environment (handed in by the caller; never read here) ---- */

int pawl_config_load_env(struct pawl_config *cfg, char *const *envp, char *err, size_t errlen)
{
    if (cfg == NULL)
        return PAWL_EINVAL;
    if (envp == NULL)
        return 0;
    for (size_t i = 0; i < PAWL_ARRAY_LEN(flags); i++) {
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
