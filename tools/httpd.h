/*
 * httpd.h — the optional metrics endpoint: Prometheus text on http://127.0.0.1:PORT/metrics,
 * liveness on /healthz and readiness on /readyz,
 * served by libmicrohttpd from its own thread. Bound to loopback only: exposing it further is a
 * deployment decision (a reverse proxy or a sidecar), not something a flag should do silently.
 * Start and stop from the main thread.
 */
#ifndef PAWL_TOOL_HTTPD_H
#define PAWL_TOOL_HTTPD_H

#include <stddef.h>

struct tool_httpd;

/*
 * Serve on 127.0.0.1:port. extra (optional) appends text after the library's metrics on each
 * scrape (called on the server's thread; it must be thread-safe): it writes at most cap bytes
 * into buf and returns the length it needed.
 */
typedef size_t (*tool_httpd_extra_fn)(void *ud, char *buf, size_t cap);

/* For an extra function: hand over text, which snprintf reported as n characters (n < 0 or a
 * text cut short by its buffer of size textcap counts as nothing, never half a figure). */
size_t tool_httpd_extra_text(char *buf, size_t cap, const char *text, int n, size_t textcap);
/* An extra function over a struct pawl_store (ud): the store's figures the library's registry
 * does not export (tools/store_metrics.c). */
size_t tool_store_metrics(void *store, char *buf, size_t cap);
int tool_httpd_start(struct tool_httpd **out, int port, tool_httpd_extra_fn extra, void *ud,
                     char *err, size_t errlen);
void tool_httpd_stop(struct tool_httpd *h); /* NULL is a no-op */

/*
 * /healthz answers 200 while the process serves at all; /readyz asks fn (on the server's
 * thread; thread-safe): nonzero means ready (200), 0 not ready (503), with a one-line reason
 * written into why. Without fn, /readyz answers like /healthz.
 */
typedef int (*tool_httpd_ready_fn)(void *ud, char *why, size_t whylen);
void tool_httpd_set_ready(struct tool_httpd *h, tool_httpd_ready_fn fn, void *ud);

#endif
