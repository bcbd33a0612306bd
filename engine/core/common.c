/*
 * common.c — error strings, allocator hooks, logging and clocks.
 *
 * The allocator table and the log sink are plain globals written before any pawl object exists
 * (documented in pawl/common.h); the log level is an atomic because tools change it at run time
 * (a flag re-read, say) while workers log.
 */
#include "common.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *pawl_strerror(int code)
{
    switch (code) {
#define PAWL_ERROR_TEXT_(name, value, text)                                                        \
    case value:                                                                                    \
        return text;
        PAWL_ERRORS(PAWL_ERROR_TEXT_)
#undef PAWL_ERROR_TEXT_
    default:
        return "unknown error";
    }
}

const char *pawl_errname(int code)
{
    switch (code) {
#define PAWL_ERROR_NAME_(name, value, text)                                                        \
    case value:                                                                                    \
        return #name;
        PAWL_ERRORS(PAWL_ERROR_NAME_)
#undef PAWL_ERROR_NAME_
    default:
        return "PAWL_E?";
    }
}

/* ---- allocation ---- */

struct pawl_allocator pawl__alloc = {malloc, calloc, realloc, free};

_Thread_local char pawl__thread_tag; /* see pawl_thread_tag() */

void pawl__assert_fail(const char *expr, const char *file, int line, const char *func)
{
    /* Straight to stderr: the log sink may be what is broken. */
    fprintf(stderr, "pawl: assertion failed: %s (%s:%d, %s)\n", expr, file, line, func);
    fflush(stderr);
    abort();
}

void pawl_set_allocator(const struct pawl_allocator *a)
{
    if (a == NULL)
        return;
    if (a->malloc)
        pawl__alloc.malloc = a->malloc;
    if (a->calloc)
        pawl__alloc.calloc = a->calloc;
    if (a->realloc)
        pawl__alloc.realloc = a->realloc;
    if (a->free)
        pawl__alloc.free = a->free;
}

char *pawl__strdup(const char *s)
{
    if (s == NULL)
        return NULL;
    size_t n = strlen(s) + 1;
    char *d = pawl_malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* ---- clocks ---- */

int64_t pawl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void pawl__timespec_in(struct timespec *ts, clockid_t clock, int64_t ns)
{
    clock_gettime(clock, ts);
    int64_t nsec = ts->tv_nsec + ns % 1000000000;
    ts->tv_sec += ns / 1000000000 + nsec / 1000000000;
    ts->tv_nsec = nsec % 1000000000;
}

void pawl__cond_init_monotonic(pthread_cond_t *c)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

int64_t pawl_wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- logging ---- */

/* Warn until the program says otherwise: a library embedded in a service is quiet about its
 * routine work unless asked (pawl_log_set_level, pawl_config_apply_log; the tool sets info). */
static _Atomic int log_level = PAWL_LOG_WARN;
static enum pawl_log_format log_format = PAWL_LOG_TEXT;
static pawl_log_fn log_sink;
static void *log_sink_ud;

static const char *level_names[] = {"debug", "info", "warn", "error", "off"};

void pawl_log_set_sink(pawl_log_fn fn, void *ud)
{
    log_sink = fn;
    log_sink_ud = ud;
}

void pawl_log_set_level(enum pawl_log_level level)
{
    /* Relaxed: the level gates only whether a message is formatted; no data hangs on it. */
    atomic_store_explicit(&log_level, (int)level, memory_order_relaxed);
}

enum pawl_log_level pawl_log_get_level(void)
{
    return (enum pawl_log_level)atomic_load_explicit(&log_level, memory_order_relaxed);
}

void pawl_log_set_format(enum pawl_log_format format)
{
    log_format = format;
}

enum pawl_log_format pawl_log_get_format(void)
{
    return log_format;
}

int pawl_log_level_parse(const char *s, enum pawl_log_level *out)
{
    if (s == NULL || out == NULL)
        return PAWL_EINVAL;
    for (int i = 0; i <= PAWL_LOG_OFF; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (enum pawl_log_level)i;
            return 0;
        }
    }
    if (strcmp(s, "warning") == 0) {
        *out = PAWL_LOG_WARN;
        return 0;
    }
    return PAWL_EINVAL;
}

void pawl__json_escape(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
}

const char *pawl_printable(const void *s, size_t n, char *out, size_t outlen)
{
    size_t used = 0;
    if (outlen == 0)
        return out;
    const unsigned char *p = s;
    if (p == NULL)
        n = 0;
    for (size_t i = 0; i < n; i++) {
        char tmp[8];
        size_t k;
        if (p[i] < 0x20 || p[i] == 0x7f) {
            k = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", p[i]);
        } else if (p[i] == 0xc2 && i + 1 < n && p[i + 1] >= 0x80 && p[i + 1] <= 0x9f) {
            /* A C1 control (U+0080..U+009F, e.g. U+009B, a one-character CSI). */
            k = (size_t)snprintf(tmp, sizeof tmp, "\\u%04x", p[i + 1]);
            i++;
        } else if (p[i] == '\\') {
            k = 2;
            tmp[0] = tmp[1] = '\\';
        } else {
            tmp[0] = (char)p[i];
            k = 1;
        }
        if (used + k + 4 > outlen) { /* keep room for "..." and the terminator */
            if (used + 4 <= outlen) {
                memcpy(out + used, "...", 3);
                used += 3;
            }
            break;
        }
        memcpy(out + used, tmp, k);
        used += k;
    }
    out[used < outlen ? used : outlen - 1] = '\0';
    return out;
}

const char *pawl_printable_str(const char *s, char *out, size_t outlen)
{
    return pawl_printable(s, s ? strlen(s) : 0, out, outlen);
}

char *pawl__utc_stamp(char *out, size_t len)
{
    struct timespec ts;
    struct tm tm;
    char when[32];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, len, "%s.%03dZ", when, (int)(ts.tv_nsec / 1000000) % 1000);
    return out;
}

void pawl_log_stderr(enum pawl_log_level level, const char *module, const char *msg)
{
    char when[40];
    pawl__utc_stamp(when, sizeof when);
    flockfile(stderr);
    if (log_format == PAWL_LOG_JSON) {
        fprintf(stderr, "{\"ts\":\"%s\",\"level\":\"%s\",\"module\":\"", when, level_names[level]);
        pawl__json_escape(stderr, module);
        fputs("\",\"msg\":\"", stderr);
        pawl__json_escape(stderr, msg);
        fputs("\"}\n", stderr);
    } else {
        fprintf(stderr, "%s %-5s %s: %s\n", when, level_names[level], module, msg);
    }
    funlockfile(stderr);
}

void pawl_logv(enum pawl_log_level level, const char *module, const char *fmt, va_list ap)
{
    if ((int)level < atomic_load_explicit(&log_level, memory_order_relaxed) ||
        level >= PAWL_LOG_OFF)
        return;
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    if (module == NULL)
        module = "pawl";
    if (log_sink)
        log_sink(log_sink_ud, level, module, buf);
    else
        pawl_log_stderr(level, module, buf);
}

void pawl_log(enum pawl_log_level level, const char *module, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pawl_logv(level, module, fmt, ap);
    va_end(ap);
}
