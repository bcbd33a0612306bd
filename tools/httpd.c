/*
 * httpd.c — see httpd.h. libmicrohttpd runs one internal polling thread; each scrape takes a
 * snapshot, renders it and hands the buffer to the server, which frees it after sending.
 */
#include "httpd.h"

#include "tool.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if MHD_VERSION < 0x00097002
typedef int mhd_result;
#else
typedef enum MHD_Result mhd_result;
#endif

struct tool_httpd {
    struct MHD_Daemon *daemon;
    tool_httpd_extra_fn extra;
    void *ud;
    void *ready_ud;
    _Atomic(tool_httpd_ready_fn) ready; /* NULL: ready whenever alive; set after start */
};

void tool_httpd_set_ready(struct tool_httpd *h, tool_httpd_ready_fn fn, void *ud)
{
    h->ready_ud = ud;
    /* Release: a scrape that sees fn sees ready_ud too. */
    atomic_store_explicit(&h->ready, fn, memory_order_release);
}

size_t tool_httpd_extra_text(char *buf, size_t cap, const char *text, int n, size_t textcap)
{
    size_t len = n > 0 && (size_t)n < textcap ? (size_t)n : 0;
    if (buf && cap > len)
        memcpy(buf, text, len + 1);
    return len;
}

static char *render(struct tool_httpd *h, size_t *len)
{
    struct pawl_metrics_snapshot *s = malloc(sizeof *s);
    if (s == NULL)
        return NULL;
    pawl_metrics_snapshot(s);
    size_t need = 0;
    pawl_metrics_format_prometheus(s, NULL, 0, &need);
    size_t extra = h->extra ? h->extra(h->ud, NULL, 0) : 0;
    size_t cap = need + extra + 4096; /* room for figures that grew between the two calls */
    char *buf = malloc(cap);
    if (buf == NULL) {
        free(s);
        return NULL;
    }
    size_t n = 0;
    if (pawl_metrics_format_prometheus(s, buf, cap, &n) != 0)
        n = strlen(buf);
    if (h->extra) {
        size_t e = h->extra(h->ud, buf + n, cap - n);
        n += e < cap - n ? e : strlen(buf + n);
    }
    free(s);
    *len = n;
    return buf;
}

static mhd_result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                             const char *method, const char *version, const char *upload,
                             size_t *upload_size, void **con_cls)
{
    struct tool_httpd *h = cls;
    struct MHD_Response *resp;
    unsigned status;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        static const char msg[] = "method not allowed\n";
        resp = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
        status = MHD_HTTP_METHOD_NOT_ALLOWED;
    } else if (strcmp(url, "/metrics") == 0) {
        size_t len = 0;
        char *body = render(h, &len);
        if (body == NULL)
            return MHD_NO;
        resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
        if (resp)
            MHD_add_response_header(resp, "Content-Type",
                                    "text/plain; version=0.0.4; charset=utf-8");
        status = MHD_HTTP_OK;
    } else if (strcmp(url, "/healthz") == 0) {
        static const char msg[] = "ok\n";
        resp = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
        status = MHD_HTTP_OK;
    } else if (strcmp(url, "/readyz") == 0) {
        char why[256] = "ok";
        tool_httpd_ready_fn fn = atomic_load_explicit(&h->ready, memory_order_acquire);
        int ok = fn == NULL || fn(h->ready_ud, why, sizeof why);
        size_t n = strlen(why);
        char *body = malloc(n + 2);
        if (body == NULL)
            return MHD_NO;
        memcpy(body, why, n);
        body[n] = '\n';
        body[n + 1] = '\0';
        resp = MHD_create_response_from_buffer(n + 1, body, MHD_RESPMEM_MUST_FREE);
        status = ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE;
    } else {
        static const char msg[] = "not found: metrics are at /metrics, liveness at /healthz, "
                                  "readiness at /readyz\n";
        resp = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
        status = MHD_HTTP_NOT_FOUND;
    }
    if (resp == NULL)
        return MHD_NO;
    mhd_result r = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return r;
}

int tool_httpd_start(struct tool_httpd **out, int port, tool_httpd_extra_fn extra, void *ud,
                     char *err, size_t errlen)
{
    *out = NULL;
    struct tool_httpd *h = calloc(1, sizeof *h);
    if (h == NULL)
        return PAWL_ENOMEM;
    h->extra = extra;
    h->ud = ud;
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    h->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG,
                                 (uint16_t)port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR,
                                 (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_LIMIT, 16u,
                                 MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    if (h->daemon == NULL) {
        snprintf(err, errlen, "cannot serve metrics on 127.0.0.1:%d (port in use?)", port);
        free(h);
        return PAWL_ESYS;
    }
    *out = h;
    return 0;
}

void tool_httpd_stop(struct tool_httpd *h)
{
    if (h == NULL)
        return;
    MHD_stop_daemon(h->daemon);
    free(h);
}
