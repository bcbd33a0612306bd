/*
 * position.c — see position.h.
 */
#include "position.h"

#include "tool.h"

#include <ctype.h>
#include <errno.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define US_PER_DAY (INT64_C(86400) * 1000000)

/* Days since 1970-01-01 of a proleptic Gregorian date (no time zone involved). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const unsigned yoe = (unsigned)(y - era * 400);
    const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

/* n digits at s as a number, or -1 when any of them is not a digit. */
static int digits_at(const char *s, int n)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

int tool_pos_parse_time(const char *s, int64_t *us)
{
    /* YYYY-MM-DDTHH:MM:SS, every character checked (no sscanf: it would skip spaces and take
     * signs inside the fields). */
    if (s == NULL || strlen(s) < 20 || s[4] != '-' || s[7] != '-' ||
        (s[10] != 'T' && s[10] != 't' && s[10] != ' ') || s[13] != ':' || s[16] != ':')
        return PAWL_EINVAL;
    int y = digits_at(s, 4), mo = digits_at(s + 5, 2), d = digits_at(s + 8, 2);
    int h = digits_at(s + 11, 2), mi = digits_at(s + 14, 2), sec = digits_at(s + 17, 2);
    if (y < 0 || mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 ||
        sec < 0 || sec > 60)
        return PAWL_EINVAL;
    const char *p = s + 19;
    int64_t frac = 0;
    if (*p == '.') {
        p++;
        int digits = 0;
        while (isdigit((unsigned char)*p)) {
            if (digits < 6)
                frac = frac * 10 + (*p - '0'); /* beyond the microsecond: dropped */
            if (++digits > 64)
                return PAWL_EINVAL;
            p++;
        }
        if (digits == 0)
            return PAWL_EINVAL;
        for (int k = digits; k < 6; k++)
            frac *= 10;
    }
    int64_t offset_s = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int oh = digits_at(p + 1, 2), om = oh < 0 || p[3] != ':' ? -1 : digits_at(p + 4, 2);
        if (oh < 0 || oh > 23 || om < 0 || om > 59)
            return PAWL_EINVAL;
        offset_s = ((int64_t)oh * 3600 + (int64_t)om * 60) * (*p == '-' ? -1 : 1);
        p += 6;
    } else {
        return PAWL_EINVAL; /* a time without a zone is ambiguous: refuse it */
    }
    if (*p != '\0')
        return PAWL_EINVAL;
    int64_t secs = days_from_civil(y, (unsigned)mo, (unsigned)d) * 86400 + (int64_t)h * 3600 +
                   (int64_t)mi * 60 + sec - offset_s;
    *us = secs * 1000000 + frac;
    return 0;
}

const char *tool_pos_format_time(int64_t us, char *out, size_t outlen)
{
    int64_t secs = us / 1000000, frac = us % 1000000;
    if (frac < 0) {
        frac += 1000000;
        secs--;
    }
    int64_t days = secs / 86400, rem = secs % 86400;
    if (rem < 0) {
        rem += 86400;
        days--;
    }
    /* civil_from_days, the inverse of days_from_civil */
    int64_t z = days + 719468;
    const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    const int64_t doe = z - era * 146097;
    const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const int64_t mp = (5 * doy + 2) / 153;
    const int64_t d = doy - (153 * mp + 2) / 5 + 1;
    const int64_t m = mp < 10 ? mp + 3 : mp - 9;
    const int64_t y = yoe + era * 400 + (m <= 2);
    if (frac)
        snprintf(out, outlen, "%04lld-%02lld-%02lldT%02lld:%02lld:%02lld.%06lldZ", (long long)y,
                 (long long)m, (long long)d, (long long)(rem / 3600), (long long)(rem / 60 % 60),
                 (long long)(rem % 60), (long long)frac);
    else
        snprintf(out, outlen, "%04lld-%02lld-%02lldT%02lld:%02lld:%02lldZ", (long long)y,
                 (long long)m, (long long)d, (long long)(rem / 3600), (long long)(rem / 60 % 60),
                 (long long)(rem % 60));
    return out;
}

/* Digits only, as an int64: PAWL_EINVAL when s is not all digits, PAWL_ERANGE when too big. */
static int parse_digits(const char *s, int64_t *v)
{
    if (!isdigit((unsigned char)*s))
        return PAWL_EINVAL;
    int64_t x = 0;
    for (; *s; s++) {
        if (!isdigit((unsigned char)*s))
            return PAWL_EINVAL;
        int dgt = *s - '0';
        if (x > (INT64_MAX - dgt) / 10)
            return PAWL_ERANGE;
        x = x * 10 + dgt;
    }
    *v = x;
    return 0;
}

/* A duration after the minus: [<days>d][<duration pawl_config_parse_duration takes>], in µs. */
static int parse_ago(const char *s, int64_t *us)
{
    int64_t days = 0;
    const char *p = s;
    while (isdigit((unsigned char)*p))
        p++;
    if (p > s && *p == 'd') {
        char buf[24];
        size_t n = (size_t)(p - s);
        if (n >= sizeof buf)
            return PAWL_ERANGE;
        memcpy(buf, s, n);
        buf[n] = '\0';
        int rc = parse_digits(buf, &days);
        if (rc != 0)
            return rc;
        if (days > INT64_MAX / US_PER_DAY)
            return PAWL_ERANGE;
        s = p + 1;
    } else if (*s == '\0') {
        return PAWL_EINVAL;
    }
    int64_t ms = 0;
    if (*s != '\0') {
        /* pawl_config_parse_duration takes a sign of its own: not after ours. */
        if (!isdigit((unsigned char)*s) && *s != '.')
            return PAWL_EINVAL;
        int rc = pawl_config_parse_duration(s, &ms);
        if (rc != 0)
            return rc;
        if (ms < 0)
            return PAWL_EINVAL;
        if (strcmp(s, "0") == 0)
            return PAWL_EINVAL; /* "-1d0": a bare number after the days */
        if (ms > (INT64_MAX - days * US_PER_DAY) / 1000)
            return PAWL_ERANGE;
    }
    *us = days * US_PER_DAY + ms * 1000;
    return 0;
}

int tool_pos_parse(const char *flag, const char *text, struct tool_pos *out, char *err,
                   size_t errlen)
{
    char shown[96];
    out->kind = TOOL_POS_START;
    out->value = 0;
    if (text == NULL || text[0] == '\0') {
        snprintf(err, errlen, "%s needs a position: %s", flag, TOOL_POS_FORMS);
        return PAWL_EINVAL;
    }
    tool_printable(text, shown, sizeof shown);
    if (strcmp(text, "start") == 0) {
        out->kind = TOOL_POS_START;
        return 0;
    }
    if (strcmp(text, "end") == 0) {
        out->kind = TOOL_POS_END;
        return 0;
    }
    int rc;
    if (isdigit((unsigned char)text[0]) && (rc = parse_digits(text, &out->value)) != PAWL_EINVAL) {
        if (rc == PAWL_ERANGE) {
            snprintf(err, errlen, "%s %s: index out of range (at most %lld)", flag, shown,
                     (long long)INT64_MAX);
            return rc;
        }
        out->kind = TOOL_POS_INDEX;
        return 0;
    }
    if (text[0] == '-') {
        rc = parse_digits(text + 1, &out->value);
        if (rc == 0) {
            out->kind = TOOL_POS_OFFSET;
            return 0;
        }
        if (rc == PAWL_ERANGE) {
            snprintf(err, errlen, "%s %s: offset out of range (at most -%lld)", flag, shown,
                     (long long)INT64_MAX);
            return rc;
        }
        rc = parse_ago(text + 1, &out->value);
        if (rc == 0) {
            out->kind = TOOL_POS_AGO;
            return 0;
        }
        if (rc == PAWL_ERANGE) {
            snprintf(err, errlen, "%s %s: reaches back too far", flag, shown);
            return rc;
        }
        snprintf(err, errlen,
                 "%s %s: not a position: after a minus give a number of events before the end "
                 "(-15) or a time ago with a unit: ms, s, m, h, d (-15m, -2h, -1d12h); the other "
                 "positions are start, end, an index and an RFC 3339 time (2026-12-05T10:00:00Z)",
                 flag, shown);
        return PAWL_EINVAL;
    }
    if (tool_pos_parse_time(text, &out->value) == 0) {
        out->kind = TOOL_POS_TIME;
        return 0;
    }
    snprintf(err, errlen,
             "%s %s: not a position: give %s; -15 is an offset, -15m a time; a time needs its "
             "zone (Z or +01:00)",
             flag, shown, TOOL_POS_FORMS);
    return PAWL_EINVAL;
}

int64_t tool_pos_time_us(const struct tool_pos *p, const struct tool_pos_span *span)
{
    if (p->kind == TOOL_POS_TIME)
        return p->value;
    /* p->value >= 0: the difference cannot overflow below INT64_MIN */
    return span->now_us - p->value;
}

int tool_pos_at(const struct tool_pos *p, const struct tool_pos_span *span, int64_t *pos)
{
    int64_t start = span->first - 1;
    switch (p->kind) {
    case TOOL_POS_START:
        *pos = start;
        return 0;
    case TOOL_POS_END:
        *pos = span->last;
        return 0;
    case TOOL_POS_INDEX:
        *pos = p->value;
        return 0;
    case TOOL_POS_OFFSET:
        /* last >= 0 and value >= 0: last - value cannot overflow */
        *pos = TOOL_MAX(span->last - p->value, start);
        return 0;
    case TOOL_POS_AGO:
    case TOOL_POS_TIME:
        break;
    }
    return PAWL_EINVAL;
}

int tool_pos_search(int64_t first, int64_t last, int64_t t_us,
                    int (*at)(void *arg, int64_t index, int64_t *us), void *arg, int64_t *pos,
                    int *probes)
{
    /* Invariant: the event at lo (or none, at first - 1) is before t_us; the event at hi (or
     * none, at last + 1) is at or after it. */
    int64_t lo = first - 1, hi = TOOL_MAX(last, first - 1) + 1;
    int n = 0;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2, us = 0;
        int rc = at(arg, mid, &us);
        n++;
        if (rc != 0) {
            if (probes)
                *probes = n;
            return rc;
        }
        if (us >= t_us)
            hi = mid;
        else
            lo = mid;
    }
    if (probes)
        *probes = n;
    *pos = lo;
    return 0;
}

/* ---- resolving against the database ---- */

struct probe {
    PGconn *c;
    char *err;
    size_t errlen;
    int rc;
};

/* The SQLSTATEs of a database without pawl's schema: no such schema, table or function. */
static int schema_missing(const char *state)
{
    return strcmp(state, "3F000") == 0 || strcmp(state, "42P01") == 0 ||
           strcmp(state, "42883") == 0;
}

/* Run sql with params; the result when it returned rows, else NULL with err and a PAWL_* code
 * in *rc. */
static PGresult *run_query(PGconn *c, const char *sql, int n, const char *const *v, int *rc,
                           char *err, size_t errlen)
{
    PGresult *r = PQexecParams(c, sql, n, NULL, v, NULL, NULL, 0);
    if (PQresultStatus(r) == PGRES_TUPLES_OK)
        return r;
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    const char *msg = PQresultErrorMessage(r);
    snprintf(err, errlen, "%s", msg && msg[0] ? msg : PQerrorMessage(c));
    size_t l = strlen(err);
    while (l > 0 && err[l - 1] == '\n')
        err[--l] = '\0';
    if (state == NULL || PQstatus(c) != CONNECTION_OK)
        *rc = PAWL_ECONN;
    else if (schema_missing(state))
        *rc = PAWL_ESCHEMA;
    else if (strcmp(state, "PW020") == 0)
        *rc = PAWL_ETRUNCATED;
    else if (strcmp(state, "42501") == 0)
        *rc = PAWL_EPERM;
    else
        *rc = PAWL_ESQL;
    PQclear(r);
    return NULL;
}

static int probe_at(void *arg, int64_t index, int64_t *us)
{
    struct probe *p = arg;
    char after[24];
    snprintf(after, sizeof after, "%lld", (long long)(index - 1));
    const char *v[1] = {after};
    int rc = 0;
    /* One event, read as any reader reads it; appended_at exactly, in microseconds. */
    PGresult *r = run_query(p->c,
                            "SELECT global_index, "
                            "(extract(epoch FROM appended_at) * 1000000)::int8 "
                            "FROM pawl_api.read($1::int8, 1)",
                            1, v, &rc, p->err, p->errlen);
    if (r == NULL)
        return rc;
    if (PQntuples(r) != 1 || strtoll(PQgetvalue(r, 0, 0), NULL, 10) != index) {
        snprintf(p->err, p->errlen,
                 "index %lld is not in the log (did retention move its start meanwhile?)",
                 (long long)index);
        PQclear(r);
        return PAWL_ENOTFOUND;
    }
    *us = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    PQclear(r);
    return 0;
}

int tool_pos_resolve(const char *dsn, const char *flag, const struct tool_pos *p, int64_t *pos,
                     struct tool_pos_span *span, char *err, size_t errlen)
{
    if (p->kind == TOOL_POS_INDEX && span == NULL) {
        *pos = p->value;
        return 0;
    }
    char why[512] = "";
    PGconn *c = pawl_pq_connect(dsn, 0);
    if (c == NULL || PQstatus(c) != CONNECTION_OK) {
        snprintf(err, errlen, "%s: cannot connect to find the position: %s", flag,
                 c ? PQerrorMessage(c) : "out of memory");
        PQfinish(c);
        return PAWL_ECONN;
    }
    int rc = 0;
    struct tool_pos_span s;
    PGresult *r = run_query(c,
                            "SELECT coalesce(pawl_api.first_index(), 1), pawl_api.last_index(), "
                            "(extract(epoch FROM clock_timestamp()) * 1000000)::int8",
                            0, NULL, &rc, why, sizeof why);
    if (r == NULL) {
        snprintf(err, errlen, "%s: cannot read the log's bounds: %s", flag, why);
        PQfinish(c);
        return rc;
    }
    s.first = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    s.last = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    s.now_us = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
    PQclear(r);
    if (span)
        *span = s;
    if (p->kind != TOOL_POS_AGO && p->kind != TOOL_POS_TIME) {
        PQfinish(c);
        return tool_pos_at(p, &s, pos);
    }
    struct probe pr = {.c = c, .err = why, .errlen = sizeof why};
    int64_t t = tool_pos_time_us(p, &s);
    int probes = 0;
    rc = tool_pos_search(s.first, s.last, t, probe_at, &pr, pos, &probes);
    PQfinish(c);
    if (rc != 0) {
        char when[48];
        snprintf(err, errlen, "%s: cannot find the position at %s: %s", flag,
                 tool_pos_format_time(t, when, sizeof when), why);
        return rc;
    }
    char when[48];
    pawl_log(PAWL_LOG_DEBUG, "tool",
             "%s: the position before the first event appended at or after %s is %lld "
             "(%d reads over %lld .. %lld)",
             flag, tool_pos_format_time(t, when, sizeof when), (long long)*pos, probes,
             (long long)s.first, (long long)s.last);
    return 0;
}
