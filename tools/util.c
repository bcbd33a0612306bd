/*
 * util.c — the tool's shared bits: exit codes, its messages on stderr (text or JSON lines), the
 * escaping of untrusted text for terminals, "did you mean", the stop flag.
 *
 * Messages. Everything the tool says on stderr goes through tool_log: "pawl: message" as text,
 * or with --log-format json one JSON object per line ({"ts", "level", "msg", then the message's
 * own fields}). Code that still writes to stderr directly (and the library's logger, which
 * writes JSON itself in that format) is caught by a line filter installed on stderr in JSON
 * mode (tool_log_json_stderr): a line that is not already a JSON object becomes one, so a
 * script reading stderr never sees a bare text line.
 */
#include "tool.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

atomic_int tool_stop;
atomic_int tool_stop_signal, tool_abandon, tool_abandon_here;

const char *tool_signal_name(int sig)
{
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
}

int tool_check_name(const char *what, const char *name, size_t max, char *why, size_t whylen)
{
    char rule[64], shown[PAWL_PRINTABLE_SIZE(80)];
    snprintf(rule, sizeof rule, "1..%zu bytes of A-Z a-z 0-9 _ . : -", max);
    size_t n = name ? strlen(name) : 0;
    if (n == 0) {
        snprintf(why, whylen, "the %s is empty (it must be %s)", what, rule);
        return PAWL_EINVAL;
    }
    pawl_printable_str(name, shown, sizeof shown);
    if (n > max) {
        snprintf(why, whylen, "the %s \"%s\" is %zu bytes long (it must be %s)", what, shown, n,
                 rule);
        return PAWL_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '_' || c == '.' || c == ':' || c == '-')
            continue;
        char byte[16];
        if (c == ' ')
            snprintf(byte, sizeof byte, "a space");
        else if (c > 0x20 && c < 0x7f)
            snprintf(byte, sizeof byte, "\"%c\"", c);
        else
            snprintf(byte, sizeof byte, "the byte \\x%02x", c); /* a control, or UTF-8 */
        snprintf(why, whylen, "the %s \"%s\" has %s (byte %zu; it must be %s)", what, shown, byte,
                 i + 1, rule);
        return PAWL_EINVAL;
    }
    return 0;
}

const struct tool_exit_code tool_exit_codes[] = {
    {TOOL_OK, "success"},
    {TOOL_FAILED, "the operation failed (a database or I/O error; the message says which)"},
    {TOOL_USAGE, "usage: unknown command or flag, a value of the wrong type or out of range"},
    {TOOL_NODB, "cannot reach the database, or cannot start the private PostgreSQL"},
    {TOOL_REFUSED, "refused: segments of the processor are claimed (the message names the "
                   "owners), a merge is still in progress, or a reset target is past the head"},
    {TOOL_NOTFOUND, "not found: no such processor or segment, or no pawl schema (run pawl init)"},
    {TOOL_BADINPUT, "append: an input line is not a valid event, or longer than the event size "
                    "limit (the message names the line)"},
    {TOOL_CONFLICT, "append: a stream is not at the expected version (the message names the "
                    "stream, the expected and the actual version), or an event id is in the log "
                    "for another event (the message names the id); nothing of that append was "
                    "written"},
    {TOOL_ABANDONED, "stopped without finishing the stop: a second Ctrl-C or SIGTERM (a second "
                     "or more after the first; a repeat within a second is ignored), or, for "
                     "run, a database that did not answer for --stop-db-wait while stopping. "
                     "run: the claims it could not release are left to expire after "
                     "--claim-timeout (the message names the segments and the time)"},
    {TOOL_INTERRUPTED, "interrupted (Ctrl-C or SIGTERM) after a clean stop; the summary says what "
                       "was done"},
    {-1, NULL},
};

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

static void json_head(FILE *f, enum pawl_log_level level)
{
    char when[40];
    fprintf(f, "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":\"", tool_utc_stamp(when, sizeof when),
            level_names[level]);
}

static int json_mode(void)
{
    return pawl_log_get_format() == PAWL_LOG_JSON;
}

static int quiet_notes; /* --quiet: set once by main before any thread starts */

void tool_set_quiet(int quiet)
{
    quiet_notes = quiet;
}

void tool_logv(enum pawl_log_level level, const struct tool_kv *kv, size_t nkv, const char *fmt,
               va_list ap)
{
    /* The tool's own notes, summaries, warnings and errors are its output on stderr and always
     * shown (--log-level filters the library's log), unless --quiet hides the notes (level info);
     * only its debug lines follow the level. */
    if (level == PAWL_LOG_DEBUG && level < pawl_log_get_level())
        return;
    if (level == PAWL_LOG_INFO && quiet_notes)
        return;
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    flockfile(stderr);
    if (json_mode()) {
        json_head(stderr, level);
        tool_json_escape(stderr, msg);
        fputc('"', stderr);
        for (size_t i = 0; i < nkv; i++) {
            fputs(",\"", stderr);
            tool_json_escape(stderr, kv[i].key);
            fputs("\":", stderr);
            if (kv[i].str) {
                fputc('"', stderr);
                tool_json_escape(stderr, kv[i].str);
                fputc('"', stderr);
            } else {
                fprintf(stderr, "%lld", (long long)kv[i].num);
            }
        }
        fputs("}\n", stderr);
    } else {
        fprintf(stderr, "pawl: %s\n", msg);
    }
    funlockfile(stderr);
}

void tool_log(enum pawl_log_level level, const struct tool_kv *kv, size_t nkv, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tool_logv(level, kv, nkv, fmt, ap);
    va_end(ap);
}

void tool_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tool_logv(PAWL_LOG_ERROR, NULL, 0, fmt, ap);
    va_end(ap);
}

void tool_note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tool_logv(PAWL_LOG_INFO, NULL, 0, fmt, ap);
    va_end(ap);
}

/* ---- the JSON line filter on stderr ---- */

struct line_filter {
    FILE *real;
    char buf[4096];
    size_t n;
};

static void filter_emit(struct line_filter *lf)
{
    char *s = lf->buf;
    size_t n = lf->n;
    lf->n = 0;
    while (n > 0 && (s[n - 1] == '\r'))
        n--;
    s[n] = '\0';
    /* A live progress redraw ("\r\033[K...") keeps only its last state. */
    char *cr = strrchr(s, '\r');
    if (cr)
        s = cr + 1;
    if (strncmp(s, "\033[K", 3) == 0)
        s += 3;
    if (*s == '\0')
        return;
    if (*s == '{') {
        fprintf(lf->real, "%s\n", s);
    } else {
        enum pawl_log_level level = PAWL_LOG_INFO;
        if (strncmp(s, "pawl: ", 6) == 0)
            s += 6;
        json_head(lf->real, level);
        tool_json_escape(lf->real, s);
        fputs("\"}\n", lf->real);
    }
    fflush(lf->real);
}

static ssize_t filter_write(void *cookie, const char *data, size_t len)
{
    struct line_filter *lf = cookie;
    for (size_t i = 0; i < len; i++) {
        if (data[i] == '\n' || lf->n == sizeof lf->buf - 1) {
            filter_emit(lf);
            if (data[i] == '\n')
                continue;
        }
        lf->buf[lf->n++] = data[i];
    }
    return (ssize_t)len;
}

static int filter_close(void *cookie)
{
    struct line_filter *lf = cookie;
    if (lf->n)
        filter_emit(lf);
    return 0;
}

void tool_log_json_stderr(void)
{
    static struct line_filter lf;
    static int installed;
    if (installed)
        return;
    int fd = dup(STDERR_FILENO);
    if (fd < 0 || (lf.real = fdopen(fd, "w")) == NULL)
        return;
    setvbuf(lf.real, NULL, _IOLBF, 0);
    cookie_io_functions_t io = {.write = filter_write, .close = filter_close};
    FILE *f = fopencookie(&lf, "w", io);
    if (f == NULL)
        return;
    setvbuf(f, NULL, _IOLBF, 0);
    stderr = f;
    installed = 1;
}

void tool_assert_fail(const char *expr, const char *file, int line, const char *func)
{
    /* Straight to stderr, as the library's assertions do. */
    fprintf(stderr, "pawl: assertion failed: %s (%s:%d, %s)\n", expr, file, line, func);
    fflush(stderr);
    abort();
}

/* ---- text ---- */

char *tool_utc_stamp(char *out, size_t len)
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

void tool_json_escape(FILE *f, const char *s)
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

size_t tool_edit_distance(const char *a, const char *b)
{
    /* Optimal string alignment: insertions, deletions, substitutions and swaps of two
     * neighbours ("dns" for "dsn") cost 1 each. */
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return 99;
    size_t d[65][65];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    }
    return d[la][lb];
}

const char *tool_printable(const char *s, char *out, size_t outlen)
{
    return pawl_printable_str(s, out, outlen);
}

const char *tool_json_string(const char *s, char *out, size_t outlen)
{
    size_t n = 0;
    if (outlen < 3) {
        if (outlen)
            out[0] = '\0';
        return out;
    }
    out[n++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char tmp[8];
        size_t k;
        if (*p == '"' || *p == '\\') {
            k = (size_t)snprintf(tmp, sizeof tmp, "\\%c", *p);
        } else if (*p < 0x20 || *p == 0x7f) {
            k = (size_t)snprintf(tmp, sizeof tmp, "\\u%04x", *p);
        } else {
            tmp[0] = (char)*p;
            k = 1;
        }
        if (n + k + 2 > outlen)
            break;
        memcpy(out + n, tmp, k);
        n += k;
    }
    out[n++] = '"';
    out[n] = '\0';
    return out;
}

int tool_exit_for(int rc)
{
    switch (rc) {
    case 0:
        return TOOL_OK;
    case PAWL_EINVAL:
    case PAWL_ERANGE:
        return TOOL_USAGE;
    case PAWL_ECONN:
        return TOOL_NODB;
    case PAWL_EBUSY:
    case PAWL_ECLAIM:
        return TOOL_REFUSED;
    case PAWL_ENOTFOUND:
    case PAWL_ESCHEMA:
        return TOOL_NOTFOUND;
    case PAWL_ECONFLICT:
    case PAWL_EIDUSED:
        return TOOL_CONFLICT;
    case PAWL_EFILTER:
        return TOOL_REFUSED;
    default:
        return TOOL_FAILED;
    }
}
