/*
 * filter.c — server-side read filters (pawl/log.h, struct pawl_filter): their checks, their
 * canonical JSON (what the token store records as part of a processor's definition), and the
 * array literals the filtered read sends (sql/016_filtered_reads.sql). No state; any thread.
 */
#include "filter.h"
#include "common.h"

#include "pawl/event.h"
#include "pawl/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const KIND_NAME[3] = {"category", "stream prefix", "type"};
static const char *const KIND_KEY[3] = {"categories", "stream_prefixes", "types"};

static void lists(const struct pawl_filter *f, const char *const *v[3], size_t n[3])
{
    v[0] = f->categories;
    n[0] = f->n_categories;
    v[1] = f->stream_prefixes;
    n[1] = f->n_stream_prefixes;
    v[2] = f->types;
    n[2] = f->n_types;
}

int pawl_filter_check(const struct pawl_filter *f, char *err, size_t errlen)
{
    char dummy[1];
    if (err == NULL || errlen == 0) {
        err = dummy;
        errlen = sizeof dummy;
    }
    if (f == NULL) {
        snprintf(err, errlen, "no filter");
        return PAWL_EINVAL;
    }
    const char *const *v[3];
    size_t n[3];
    lists(f, v, n);
    if (n[0] + n[1] + n[2] == 0) {
        snprintf(err, errlen, "an empty filter: give categories, stream prefixes or types");
        return PAWL_EINVAL;
    }
    for (int k = 0; k < 3; k++) {
        if (n[k] > PAWL_FILTER_MAX) {
            snprintf(err, errlen, "%zu %s filters: at most %d", n[k], KIND_NAME[k],
                     PAWL_FILTER_MAX);
            return PAWL_EINVAL;
        }
        if (n[k] > 0 && v[k] == NULL) {
            snprintf(err, errlen, "%zu %s filters but no array", n[k], KIND_NAME[k]);
            return PAWL_EINVAL;
        }
        for (size_t i = 0; i < n[k]; i++) {
            const char *s = v[k][i];
            size_t len = s ? strlen(s) : 0;
            size_t max = k == 2 ? PAWL_EVENT_TYPE_MAX : PAWL_STREAM_ID_MAX;
            if (len == 0 || len > max) {
                snprintf(err, errlen, "%s filter %zu is %s (1..%zu bytes)", KIND_NAME[k], i + 1,
                         s == NULL  ? "NULL"
                         : len == 0 ? "empty"
                                    : "too long",
                         max);
                return PAWL_EINVAL;
            }
            if (k == 0 && strchr(s, '-')) {
                snprintf(err, errlen,
                         "category \"%.64s\" contains '-' (a category is a stream id up to its "
                         "first '-': filter by stream prefix for longer prefixes)",
                         s);
                return PAWL_EINVAL;
            }
        }
    }
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* v[0..n) sorted and without duplicates, as a new array of borrowed pointers (*out; NULL when
 * n is 0). Returns the number kept or -1 (no memory). */
static long sorted_unique(const char *const *v, size_t n, const char ***out)
{
    *out = NULL;
    if (n == 0)
        return 0;
    const char **a = pawl_malloc(n * sizeof *a);
    if (a == NULL)
        return -1;
    memcpy(a, v, n * sizeof *a);
    qsort(a, n, sizeof *a, cmp_str);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (m == 0 || strcmp(a[m - 1], a[i]) != 0)
            a[m++] = a[i];
    *out = a;
    return (long)m;
}

/* JSON string body of s into buf at *at (bounded by len; *at counts what was needed). */
static void put_json_string(char *buf, size_t len, size_t *at, const char *s)
{
    char tmp[8];
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        const char *piece = tmp;
        if (*p == '"')
            piece = "\\\"";
        else if (*p == '\\')
            piece = "\\\\";
        else if (*p < 0x20)
            snprintf(tmp, sizeof tmp, "\\u%04x", *p);
        else {
            tmp[0] = (char)*p;
            tmp[1] = '\0';
        }
        for (const char *c = piece; *c; c++) {
            if (*at + 1 < len)
                buf[*at] = *c;
            (*at)++;
        }
    }
}

static void put_raw(char *buf, size_t len, size_t *at, const char *s)
{
    for (; *s; s++) {
        if (*at + 1 < len)
            buf[*at] = *s;
        (*at)++;
    }
}

int pawl_filter_json(const struct pawl_filter *f, char *buf, size_t len)
{
    size_t at = 0;
    if (f == NULL) {
        put_raw(buf, len, &at, "{}");
    } else {
        if (pawl_filter_check(f, NULL, 0) != 0)
            return PAWL_EINVAL;
        const char *const *v[3];
        size_t n[3];
        lists(f, v, n);
        put_raw(buf, len, &at, "{");
        int first = 1;
        for (int k = 0; k < 3; k++) {
            const char **u;
            long m = sorted_unique(v[k], n[k], &u);
            if (m < 0)
                return PAWL_ENOMEM;
            if (m == 0)
                continue;
            put_raw(buf, len, &at, first ? "\"" : ", \"");
            first = 0;
            put_raw(buf, len, &at, KIND_KEY[k]);
            put_raw(buf, len, &at, "\": [");
            for (long i = 0; i < m; i++) {
                put_raw(buf, len, &at, i ? ", \"" : "\"");
                put_json_string(buf, len, &at, u[i]);
                put_raw(buf, len, &at, "\"");
            }
            put_raw(buf, len, &at, "]");
            pawl_free(u);
        }
        put_raw(buf, len, &at, "}");
    }
    if (len > 0)
        buf[at < len ? at : len - 1] = '\0';
    return at > (size_t)0x7fffffff ? PAWL_ENOMEM : (int)at;
}

char *pawl__filter_array_literal(const char *const *v, size_t n)
{
    if (n == 0)
        return NULL;
    size_t need = 3;
    for (size_t i = 0; i < n; i++)
        need += 3 + 2 * strlen(v[i]);
    char *out = pawl_malloc(need);
    if (out == NULL)
        return NULL;
    char *p = out;
    *p++ = '{';
    for (size_t i = 0; i < n; i++) {
        if (i)
            *p++ = ',';
        *p++ = '"';
        for (const char *c = v[i]; *c; c++) {
            if (*c == '"' || *c == '\\')
                *p++ = '\\';
            *p++ = *c;
        }
        *p++ = '"';
    }
    *p++ = '}';
    *p = '\0';
    return out;
}
