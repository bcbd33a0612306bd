/*
 * httpd.c — see httpd.h. libmicrohttpd runs one internal polling thread (epoll or poll: no
 * FD_SETSIZE ceiling); each scrape takes a snapshot, renders it and hands the buffer to the
 * server, which frees it after sending.
 *
 * Slow and many clients must not starve scrapes. libmicrohttpd's own timeout is an idle timeout
 * (a client trickling a byte a second never reaches it) and its connection limit refuses new
 * connections once reached, so a handful of slow clients would lock scrapers out. Here:
 *   - every connection is tracked from accept (MHD_OPTION_NOTIFY_CONNECTION) to close, with
 *     a deadline: HEADER_DEADLINE_MS to deliver a request's headers (counted from accept, or
 *     from the end of the previous response on a kept-alive connection), then
 *     RESPONSE_DEADLINE_MS to take the response;
 *   - a reaper thread shuts the socket down (shutdown(2); the server then closes it on its own
 *     thread) of every connection past its deadline;
 *   - at SOFT_LIMIT tracked connections, a new connection evicts the oldest one still waiting
 *     for its headers, so a flood of idle connections cannot keep a scraper out; the server's
 *     hard limit (HARD_LIMIT) sits above, for the moment between accept and eviction;
 *   - libmicrohttpd's idle timeout stays as a backstop for a stalled reader.
 */
#include "httpd.h"

#include "tool.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define HEADER_DEADLINE_MS 2000
#define RESPONSE_DEADLINE_MS 10000
#define IDLE_TIMEOUT_S 5u
#define SOFT_LIMIT 64
#define HARD_LIMIT 128u
#define REAP_EVERY_MS 100

#if MHD_VERSION < 0x00097002
typedef int mhd_result;
#else
typedef enum MHD_Result mhd_result;
#endif

/* One accepted connection (its socket context), on the list while it is open. */
struct hconn {
    struct hconn *prev, *next;
    int fd;
    int in_request; /* headers received, response not yet complete */
    int shut;       /* shut down by us already */
    int64_t deadline_ns;
};

struct tool_httpd {
    struct MHD_Daemon *daemon;
    tool_httpd_extra_fn extra;
    void *ud;
    pthread_mutex_t mu; /* guards the list, stop */
    pthread_cond_t cond;
    struct hconn head; /* sentinel: head.next is the oldest */
    int nconns;
    int stop;
    pthread_t reaper;
    int reaper_started;
    unsigned long evicted, expired; /* connections dropped, logged (debug) at stop */
    void *ready_ud;
    _Atomic(tool_httpd_ready_fn) ready; /* NULL: ready whenever alive; set after start */
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Under mu: end c's connection (the server sees EOF and closes it on its own thread). */
static void shut(struct hconn *c)
{
    if (!c->shut) {
        c->shut = 1;
        shutdown(c->fd, SHUT_RDWR);
    }
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct tool_httpd *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        struct hconn *c = calloc(1, sizeof *c);
        *socket_context = c;
        if (c == NULL || ci == NULL) {
            /* Cannot track it: do not serve it either (an untracked connection has no deadline). */
            if (ci)
                shutdown(ci->connect_fd, SHUT_RDWR);
            return;
        }
        c->fd = ci->connect_fd;
        c->deadline_ns = now_ns() + (int64_t)HEADER_DEADLINE_MS * 1000000;
        pthread_mutex_lock(&h->mu);
        if (h->nconns >= SOFT_LIMIT) {
            for (struct hconn *o = h->head.next; o != &h->head; o = o->next) {
                if (!o->in_request && !o->shut) {
                    shut(o);
                    h->evicted++;
                    break;
                }
            }
        }
        c->prev = h->head.prev;
        c->next = &h->head;
        h->head.prev->next = c;
        h->head.prev = c;
        h->nconns++;
        pthread_mutex_unlock(&h->mu);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        struct hconn *c = *socket_context;
        if (c == NULL)
            return;
        pthread_mutex_lock(&h->mu);
        c->prev->next = c->next;
        c->next->prev = c->prev;
        h->nconns--;
        pthread_mutex_unlock(&h->mu);
        free(c);
        *socket_context = NULL;
    }
}

static struct hconn *conn_state(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* A response went out (or the request was abandoned): the next request's headers are due. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)con_cls;
    (void)toe;
    struct tool_httpd *h = cls;
    struct hconn *c = conn_state(conn);
    if (c == NULL)
        return;
    pthread_mutex_lock(&h->mu);
    c->in_request = 0;
    c->deadline_ns = now_ns() + (int64_t)HEADER_DEADLINE_MS * 1000000;
    pthread_mutex_unlock(&h->mu);
}

static void *reaper_main(void *arg)
{
    struct tool_httpd *h = arg;
    pthread_setname_np(pthread_self(), "httpd-reaper");
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        int64_t now = now_ns();
        for (struct hconn *c = h->head.next; c != &h->head; c = c->next) {
            if (!c->shut && now >= c->deadline_ns) {
                shut(c);
                h->expired++;
            }
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)REAP_EVERY_MS * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&h->cond, &h->mu, &ts);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

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

/* libmicrohttpd's MHD_AccessHandlerCallback: the signature is the library's. */
static mhd_result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                             const char *method, const char *version, const char *upload,
                             size_t *upload_size, // NOLINT(readability-non-const-parameter)
                             void **con_cls)
{
    struct tool_httpd *h = cls;
    struct MHD_Response *resp;
    unsigned status;
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)con_cls;
    struct hconn *c = conn_state(conn);
    if (c) {
        /* Headers are in: the response's deadline replaces the headers' one. */
        pthread_mutex_lock(&h->mu);
        if (!c->in_request) {
            c->in_request = 1;
            c->deadline_ns = now_ns() + (int64_t)RESPONSE_DEADLINE_MS * 1000000;
        }
        pthread_mutex_unlock(&h->mu);
    }
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
    h->head.next = h->head.prev = &h->head;
    pthread_mutex_init(&h->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_cond_init(&h->cond, &ca);
    pthread_condattr_destroy(&ca);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    h->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG,
                                 (uint16_t)port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR,
                                 (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_LIMIT, HARD_LIMIT,
                                 MHD_OPTION_CONNECTION_TIMEOUT, IDLE_TIMEOUT_S,
                                 MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_END);
    if (h->daemon == NULL) {
        snprintf(err, errlen, "cannot serve metrics on 127.0.0.1:%d (port in use?)", port);
        goto fail;
    }
    if (pthread_create(&h->reaper, NULL, reaper_main, h) != 0) {
        snprintf(err, errlen, "cannot start the metrics server's reaper thread");
        MHD_stop_daemon(h->daemon);
        goto fail;
    }
    h->reaper_started = 1;
    *out = h;
    return 0;
fail:
    pthread_cond_destroy(&h->cond);
    pthread_mutex_destroy(&h->mu);
    free(h);
    return PAWL_ESYS;
}

void tool_httpd_stop(struct tool_httpd *h)
{
    if (h == NULL)
        return;
    if (h->reaper_started) {
        pthread_mutex_lock(&h->mu);
        h->stop = 1;
        pthread_cond_broadcast(&h->cond);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->reaper, NULL);
    }
    pawl_log(PAWL_LOG_DEBUG, "httpd", "slow clients dropped: %lu past their deadline, %lu evicted",
             h->expired, h->evicted);
    /* Closes what is still open; on_connection(CLOSED) unlinks and frees each. */
    MHD_stop_daemon(h->daemon);
    pthread_cond_destroy(&h->cond);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
