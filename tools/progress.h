/*
 * progress.h — the progress display of long operations (demo, bench, append, catch-up in run).
 *
 * On a terminal (or with --progress live) one line on stderr is redrawn in place a few times a
 * second; otherwise (--progress plain, or stderr is a file or a pipe) a plain line is printed
 * every --progress-interval, so logs of CI runs stay readable. --progress off prints nothing but
 * the final summary the command prints itself. Used from the main thread only.
 */
#ifndef PAWL_TOOL_PROGRESS_H
#define PAWL_TOOL_PROGRESS_H

#include "tool.h"

#include <stdint.h>

enum tool_progress_mode { TOOL_PROGRESS_LIVE, TOOL_PROGRESS_PLAIN, TOOL_PROGRESS_OFF };

struct tool_progress {
    enum tool_progress_mode mode;
    int64_t interval_ns;
    int64_t start_ns;
    int64_t last_ns;
    int drawn; /* a live line is on screen */
};

/* Resolve the mode from cfg (--progress, --progress-interval) and whether stderr is a TTY. */
void tool_progress_init(struct tool_progress *p, const struct tool_config *cfg);

/* Non-zero when a line is due now (callers build the text only then). */
int tool_progress_due(struct tool_progress *p);

/* Show a line (the text without a newline); call after tool_progress_due() said so. */
void tool_progress_show(struct tool_progress *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* End the live line (so the summary starts on a fresh line). */
void tool_progress_done(struct tool_progress *p);

/* "12.3k" style for rates and counts; returns buf. */
char *tool_fmt_count(double v, char *buf, size_t len);
/* "850us", "12.4ms", "1.20s"; returns buf. */
char *tool_fmt_ns(int64_t ns, char *buf, size_t len);
/* "1m05s" / "--" when unknown (secs < 0); returns buf. */
char *tool_fmt_secs(double secs, char *buf, size_t len);

#endif
