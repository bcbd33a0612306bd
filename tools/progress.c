/*
 * progress.c — see progress.h.
 */
#include "progress.h"

#include <stdarg.h>
#include <string.h>
#include <unistd.h>

#define LIVE_PERIOD_NS (250LL * 1000 * 1000)

void tool_progress_init(struct tool_progress *p, const struct tool_config *cfg)
{
    memset(p, 0, sizeof *p);
    switch (cfg->tool.progress) {
    case 1:
        p->mode = TOOL_PROGRESS_LIVE;
        break;
    case 2:
        p->mode = TOOL_PROGRESS_PLAIN;
        break;
    case 3:
        p->mode = TOOL_PROGRESS_OFF;
        break;
    default:
        p->mode = isatty(STDERR_FILENO) ? TOOL_PROGRESS_LIVE : TOOL_PROGRESS_PLAIN;
        break;
    }
    /* With --log-format json every stderr line is a JSON object: no redrawn line. */
    if (p->mode == TOOL_PROGRESS_LIVE && pawl_log_get_format() == PAWL_LOG_JSON)
        p->mode = TOOL_PROGRESS_PLAIN;
    p->interval_ns =
        p->mode == TOOL_PROGRESS_LIVE ? LIVE_PERIOD_NS : cfg->tool.progress_ms * 1000000LL;
    p->start_ns = p->last_ns = pawl_now_ns();
}

int tool_progress_due(struct tool_progress *p)
{
    if (p->mode == TOOL_PROGRESS_OFF)
        return 0;
    int64_t now = pawl_now_ns();
    if (now - p->last_ns < p->interval_ns)
        return 0;
    p->last_ns = now;
    return 1;
}

void tool_progress_show(struct tool_progress *p, const char *fmt, ...)
{
    if (p->mode == TOOL_PROGRESS_OFF)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    char el[16];
    tool_fmt_secs((double)(pawl_now_ns() - p->start_ns) / 1e9, el, sizeof el);
    if (pawl_log_get_format() == PAWL_LOG_JSON) {
        struct tool_kv kv[] = {TOOL_KV_I("elapsed_ms", (pawl_now_ns() - p->start_ns) / 1000000),
                               TOOL_KV_S("kind", "progress")};
        tool_log(PAWL_LOG_INFO, kv, TOOL_ARRAY_LEN(kv), "%s", line);
        return;
    }
    if (p->mode == TOOL_PROGRESS_LIVE) {
        /* \r and erase-to-end-of-line redraw the same line. */
        fprintf(stderr, "\r\033[K[%s] %s", el, line);
        p->drawn = 1;
    } else {
        fprintf(stderr, "[%s] %s\n", el, line);
    }
    fflush(stderr);
}

void tool_progress_done(struct tool_progress *p)
{
    if (p->drawn) {
        fputc('\n', stderr);
        fflush(stderr);
        p->drawn = 0;
    }
}

char *tool_fmt_count(double v, char *buf, size_t len)
{
    if (v >= 1e9)
        snprintf(buf, len, "%.2fG", v / 1e9);
    else if (v >= 1e6)
        snprintf(buf, len, "%.2fM", v / 1e6);
    else if (v >= 1e4)
        snprintf(buf, len, "%.1fk", v / 1e3);
    else
        snprintf(buf, len, "%.0f", v);
    return buf;
}

char *tool_fmt_ns(int64_t ns, char *buf, size_t len)
{
    if (ns < 1000)
        snprintf(buf, len, "%lldns", (long long)ns);
    else if (ns < 1000000)
        snprintf(buf, len, "%.0fus", (double)ns / 1e3);
    else if (ns < 1000000000)
        snprintf(buf, len, "%.1fms", (double)ns / 1e6);
    else
        snprintf(buf, len, "%.2fs", (double)ns / 1e9);
    return buf;
}

char *tool_fmt_secs(double secs, char *buf, size_t len)
{
    if (secs < 0 || secs > 1e8) {
        snprintf(buf, len, "--");
        return buf;
    }
    long s = (long)(secs + 0.5);
    if (s >= 3600)
        snprintf(buf, len, "%ldh%02ldm", s / 3600, (s / 60) % 60);
    else if (s >= 60)
        snprintf(buf, len, "%ldm%02lds", s / 60, s % 60);
    else
        snprintf(buf, len, "%lds", s);
    return buf;
}
