/*
 * scrape.c — see scrape.h.
 */
#include "scrape.h"

#include "progress.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int tool_scrape(int port, char **body, char *err, size_t errlen)
{
    *body = NULL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return PAWL_ESYS;
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        snprintf(err, errlen, "nothing serves metrics on 127.0.0.1:%d (%s)", port, strerror(errno));
        close(fd);
        return PAWL_ECONN;
    }
    static const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) {
        snprintf(err, errlen, "write: %s", strerror(errno));
        close(fd);
        return PAWL_ESYS;
    }
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    int rc = 0;
    while (buf) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) <= 0) {
            snprintf(err, errlen, "no answer from 127.0.0.1:%d within 5 s", port);
            rc = PAWL_ETIMEDOUT;
            break;
        }
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL)
                break;
            buf = nb;
            cap *= 2;
        }
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    if (buf == NULL) {
        snprintf(err, errlen, "out of memory");
        return PAWL_ENOMEM;
    }
    buf[len] = '\0';
    char *hdr_end = strstr(buf, "\r\n\r\n");
    if (rc == 0 &&
        (strncmp(buf, "HTTP/1.", 7) != 0 || strstr(buf, " 200 ") != buf + 8 || hdr_end == NULL)) {
        snprintf(err, errlen, "127.0.0.1:%d did not answer 200 with metrics", port);
        rc = PAWL_EINVAL;
    }
    if (rc != 0) {
        free(buf);
        return rc;
    }
    memmove(buf, hdr_end + 4, strlen(hdr_end + 4) + 1);
    *body = buf;
    return 0;
}

double tool_hist_quantile(const double *le, const double *cum, size_t n, double q)
{
    if (n == 0 || cum[n - 1] <= 0)
        return NAN;
    double rank = q * cum[n - 1];
    for (size_t i = 0; i < n; i++) {
        if (cum[i] >= rank) {
            if (isinf(le[i]))
                return i > 0 ? le[i - 1] : NAN; /* above the highest finite bound */
            double lo = i > 0 ? le[i - 1] : 0, below = i > 0 ? cum[i - 1] : 0;
            double in = cum[i] - below;
            return in > 0 ? lo + (le[i] - lo) * (rank - below) / in : le[i];
        }
    }
    return le[n - 1];
}

#define MAX_BUCKETS 64

/* A quantile in seconds as text; the body comes from another process, so any double may show
 * up here, and converting one outside int64's range would be undefined behaviour. */
static const char *fmt_quantile(double secs, char *buf, size_t len)
{
    if (isnan(secs))
        return "-";
    double ns = secs * 1e9;
    if (!(ns > -9.2e18 && ns < 9.2e18))
        return ns > 0 ? "inf" : "-inf";
    return tool_fmt_ns((int64_t)ns, buf, len);
}

static void flush_hist(FILE *f, const char *name, const double *le, const double *cum, size_t n)
{
    if (n == 0)
        return;
    char a[32], b[32], c[32];
    double p50 = tool_hist_quantile(le, cum, n, 0.5), p99 = tool_hist_quantile(le, cum, n, 0.99),
           p999 = tool_hist_quantile(le, cum, n, 0.999);
    fprintf(f, "  %-40s count %-10.0f p50 %-9s p99 %-9s p99.9 %s\n", name, cum[n - 1],
            fmt_quantile(p50, a, sizeof a), fmt_quantile(p99, b, sizeof b),
            fmt_quantile(p999, c, sizeof c));
}

void tool_scrape_summary(FILE *f, const char *text)
{
    char cur[128] = "";
    double le[MAX_BUCKETS], cum[MAX_BUCKETS];
    size_t n = 0;
    const char *p = text;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)TOOL_MIN(len, sizeof line - 1), p);
        p += len + (eol ? 1 : 0);
        if (line[0] == '#' || line[0] == '\0')
            continue;
        char *sp = strrchr(line, ' ');
        if (sp == NULL)
            continue;
        *sp = '\0';
        double v = strtod(sp + 1, NULL);
        char *bucket = strstr(line, "_bucket{le=\"");
        if (bucket) {
            *bucket = '\0';
            if (strcmp(cur, line) != 0) {
                flush_hist(f, cur, le, cum, n);
                snprintf(cur, sizeof cur, "%.*s", (int)sizeof cur - 1, line);
                n = 0;
            }
            if (n < MAX_BUCKETS) {
                const char *b = bucket + strlen("_bucket{le=\"");
                le[n] = strncmp(b, "+Inf", 4) == 0 ? INFINITY : strtod(b, NULL);
                cum[n++] = v;
            }
            continue;
        }
        size_t l = strlen(line);
        /* _sum and _count of histograms are folded into their summary line. */
        if ((l > 4 && strcmp(line + l - 4, "_sum") == 0) ||
            (l > 6 && strcmp(line + l - 6, "_count") == 0))
            continue;
        flush_hist(f, cur, le, cum, n);
        n = 0;
        cur[0] = '\0';
        fprintf(f, "  %-40s %.15g\n", line, v);
    }
    flush_hist(f, cur, le, cum, n);
}
