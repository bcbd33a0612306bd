/*
 * dsn.c — see dsn.h.
 *
 * Scrubbing does not trust libpq's parser: the DSNs whose messages quote them are exactly the
 * ones it refuses. The secrets are found by scanning the text for the two places a password can
 * be written (a password=/sslpassword= keyword, in either form, and a URI's userinfo), taking
 * every plausible reading of a malformed string, then every occurrence of each is replaced in
 * the message before it is cut to the caller's buffer.
 */
#include "dsn.h"

#include "common.h"

#include <ctype.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pawl_dsn_check(const char *dsn, char *err, size_t errlen)
{
    if (dsn == NULL) {
        if (err && errlen)
            snprintf(err, errlen, "no DSN given");
        return PAWL_EINVAL;
    }
    char *msg = NULL;
    PQconninfoOption *opts = PQconninfoParse(dsn, &msg);
    if (opts == NULL) {
        if (err && errlen) {
            pawl__dsn_scrub(dsn, msg ? msg : "out of memory", err, errlen);
            /* libpq's messages end with a newline; error strings here do not. */
            size_t n = strlen(err);
            while (n > 0 && (err[n - 1] == '\n' || err[n - 1] == ' '))
                err[--n] = '\0';
        }
        PQfreemem(msg);
        return PAWL_EINVAL;
    }
    PQconninfoFree(opts);
    return 0;
}

/* Print opts as key=value into out (from used), secrets masked; envonly: only the options libpq
 * took from the environment, and the user name. Returns the new length. */
static size_t print_opts(const PQconninfoOption *opts, int envonly, char *out, size_t outlen,
                         size_t used)
{
    for (const PQconninfoOption *o = opts; o->keyword != NULL; o++) {
        if (o->val == NULL || o->val[0] == '\0')
            continue;
        /* Debug options ("D") are noise in a printed DSN. */
        if (o->dispchar && o->dispchar[0] == 'D')
            continue;
        const char *env = envonly && o->envvar ? getenv(o->envvar) : NULL;
        if (envonly && strcmp(o->keyword, "user") != 0 && !(env && env[0]))
            continue;
        /* dispchar "*" marks secret options (password); hide them whatever their name. */
        int secret = strcmp(o->keyword, "password") == 0 ||
                     strcmp(o->keyword, "sslpassword") == 0 ||
                     (o->dispchar && o->dispchar[0] == '*');
        int n = snprintf(out + used, outlen - used, "%s%s=%s", used ? " " : "", o->keyword,
                         secret ? "***" : o->val);
        if (n < 0 || (size_t)n >= outlen - used) {
            out[used] = '\0'; /* never half an option: a cut value could be misread */
            break;
        }
        used += (size_t)n;
    }
    return used;
}

char *pawl_dsn_redact(const char *dsn, char *out, size_t outlen)
{
    if (outlen == 0)
        return out;
    out[0] = '\0';
    PQconninfoOption *opts = dsn ? PQconninfoParse(dsn, NULL) : NULL;
    if (opts == NULL) {
        snprintf(out, outlen, "<invalid dsn>");
        return out;
    }
    int any = 0;
    for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
        any |= o->val != NULL && o->val[0] != '\0';
    if (any)
        print_opts(opts, 0, out, outlen, 0);
    PQconninfoFree(opts);
    if (!any) {
        /* Nothing set (the empty DSN): libpq's environment and defaults decide; show what the
         * environment set. */
        PQconninfoOption *defs = PQconndefaults();
        if (defs) {
            print_opts(defs, 1, out, outlen, 0);
            PQconninfoFree(defs);
        }
    }
    return out;
}

/* ---- finding the secrets ------------------------------------------------------------------ */

#define MAX_SECRETS 64

struct secrets {
    int n;
    char *s[MAX_SECRETS];
    size_t len[MAX_SECRETS]; /* strlen(s[i]) */
};

static void add_secret(struct secrets *S, const char *p, size_t len)
{
    /* A percent-decoded "%00" puts a NUL inside: a message (a C string) can only hold what
     * comes before it, and an empty secret would match everywhere. */
    if (S->n >= MAX_SECRETS)
        return;
    len = strnlen(p, len);
    if (len == 0)
        return;
    for (int i = 0; i < S->n; i++)
        if (S->len[i] == len && memcmp(S->s[i], p, len) == 0)
            return;
    char *c = malloc(len + 1);
    if (c == NULL)
        return;
    memcpy(c, p, len);
    c[len] = '\0';
    S->len[S->n] = len;
    S->s[S->n++] = c;
}

static int hexval(int c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* The characters at which libpq's URI parser may stop ("/?@:&#=[]"). */
static int uri_delimiter(char c)
{
    switch (c) {
    case '/':
    case '?':
    case '@':
    case ':':
    case '&':
    case '#':
    case '=':
    case '[':
    case ']':
        return 1;
    default:
        return 0;
    }
}

/* A URI piece: as written, percent-decoded, and (for a malformed URI, whose parser may stop at
 * any delimiter and quote what came before) each run between delimiters. */
static void add_uri_secret(struct secrets *S, const char *p, size_t len)
{
    if (S->n >= MAX_SECRETS)
        return; /* full: each piece below would be dropped, after a pass over len bytes */
    add_secret(S, p, len);
    char *d = memchr(p, '%', len) ? malloc(len + 1) : NULL; /* without '%': decoded is p */
    if (d != NULL) {
        size_t n = 0, i = 0;
        while (i < len) {
            /* The bytes up to the next '%' as they are, then the escape. */
            const char *pct = memchr(p + i, '%', len - i);
            size_t span = pct ? (size_t)(pct - (p + i)) : len - i;
            memcpy(d + n, p + i, span);
            n += span;
            i += span;
            if (i == len)
                break;
            int h, l;
            if (i + 2 < len && (h = hexval((unsigned char)p[i + 1])) >= 0 &&
                (l = hexval((unsigned char)p[i + 2])) >= 0) {
                d[n++] = (char)(h * 16 + l);
                i += 3;
            } else {
                d[n++] = p[i++];
            }
        }
        add_secret(S, d, n);
        free(d);
    }
    size_t start = 0;
    for (size_t i = 0; i <= len && S->n < MAX_SECRETS; i++) {
        if (i == len || uri_delimiter(p[i])) {
            if (i - start >= 2 && !(start == 0 && i == len))
                add_secret(S, p + start, i - start);
            start = i + 1;
        }
    }
}

/*
 * Whether dsn may be meant as a URI: libpq accepts only "postgresql://" and "postgres://" at the
 * very start, but a string with leading white space or another spelling of the scheme
 * ("POSTGRESQL://") is one it refuses while quoting it whole, password included. Any
 * scheme-like prefix after white space counts: a wrong guess only scrubs more.
 */
static int is_uri(const char *dsn)
{
    const char *p = dsn;
    while (isspace((unsigned char)*p))
        p++;
    const char *q = p;
    while (isalnum((unsigned char)*q) || *q == '+' || *q == '-' || *q == '.')
        q++;
    return q > p && strncmp(q, "://", 3) == 0;
}

static void collect_uri_userinfo(const char *dsn, struct secrets *S)
{
    const char *p = strstr(dsn, "://") + 3;
    const char *q = p;
    /* libpq's reading: userinfo ends at the first '@' unless a '/' comes first. */
    while (*q && *q != '@' && *q != '/')
        q++;
    const char *ends[2] = {*q == '@' ? q : NULL, NULL};
    /* Another reading of a malformed URI: everything up to the last '@' before the query. */
    const char *query = strchr(p, '?');
    for (const char *r = p; *r && (query == NULL || r < query); r++)
        if (*r == '@')
            ends[1] = r;
    for (int k = 0; k < 2; k++) {
        if (ends[k] == NULL)
            continue;
        const char *colon = memchr(p, ':', (size_t)(ends[k] - p));
        if (colon)
            add_uri_secret(S, colon + 1, (size_t)(ends[k] - colon - 1));
    }
}

/* password=VALUE / sslpassword=VALUE anywhere (the key=value form and a URI's query). The
 * searches are bounded by the string's end, found once, rather than each finding it again. */
static void collect_keywords(const char *dsn, struct secrets *S, int uri)
{
    const char *end = dsn + strlen(dsn);
    const char *value_end = NULL; /* where the last unquoted value ended */
    for (const char *k = memmem(dsn, (size_t)(end - dsn), "password", 8); k;
         k = memmem(k + 1, (size_t)(end - k - 1), "password", 8)) {
        /* Full: nothing more would be kept, and each value can run to the end of the string
         * ("password=password=..."): going on would make the scan quadratic in its length. */
        if (S->n >= MAX_SECRETS)
            break;
        const char *p = k + 8;
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\f' || *p == '\v')
            p++;
        if (*p != '=')
            continue;
        p++;
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\f' || *p == '\v')
            p++;
        if (*p == '\'' && !uri) {
            value_end = NULL;
            const char *v = ++p;
            size_t cap = (size_t)(end - v) + 1, n = 0;
            char *un = malloc(cap);
            while (*p && *p != '\'') {
                if (*p == '\\' && p[1])
                    p++;
                if (un)
                    un[n++] = *p;
                p++;
            }
            add_secret(S, v, (size_t)(p - v));
            if (un)
                add_secret(S, un, n);
            free(un);
        } else {
            const char *v = p;
            /* A value that starts inside the previous one ("password=password=...") ends where
             * that one ended: no character between can end it. Not scanned again, the values
             * cost one pass over the string. */
            if (value_end != NULL && v < value_end)
                p = value_end;
            while (*p && !isspace((unsigned char)*p) && !(uri && (*p == '&' || *p == '#')))
                p++;
            value_end = p;
            if (uri)
                add_uri_secret(S, v, (size_t)(p - v));
            else
                add_secret(S, v, (size_t)(p - v));
        }
    }
}

static void collect(const char *dsn, struct secrets *S)
{
    S->n = 0;
    if (dsn == NULL)
        return;
    int uri = is_uri(dsn);
    if (uri)
        collect_uri_userinfo(dsn, S);
    collect_keywords(dsn, S, uri);
}

static void free_secrets(struct secrets *S)
{
    for (int i = 0; i < S->n; i++)
        free(S->s[i]);
    S->n = 0;
}

int pawl_dsn_has_password(const char *dsn)
{
    struct secrets S;
    collect(dsn, &S);
    int has = S.n > 0;
    free_secrets(&S);
    return has;
}

/* Replace every occurrence of secret (sl bytes) in *buf (heap, *len bytes before its NUL,
 * reallocated) by "***". The searches are bounded by the known lengths. */
static void replace_all(char **buf, size_t *len, const char *secret, size_t sl)
{
    size_t count = 0;
    if (sl == 0)
        return; /* matches at every position: nothing to hide, and no end to the loops */
    const char *end = *buf + *len;
    for (const char *p = memmem(*buf, *len, secret, sl); p;
         p = memmem(p + sl, (size_t)(end - p) - sl, secret, sl))
        count++;
    if (count == 0)
        return;
    size_t nl = *len - count * sl + count * 3;
    char *o = malloc(nl + 1);
    if (o == NULL) {
        /* No memory to rewrite it: hide the whole message rather than print a secret. */
        snprintf(*buf, *len + 1, "%s", *len >= 3 ? "***" : "");
        *len = strlen(*buf);
        return;
    }
    char *w = o;
    const char *r = *buf;
    for (const char *p = memmem(r, (size_t)(end - r), secret, sl); p;
         p = memmem(r, (size_t)(end - r), secret, sl)) {
        memcpy(w, r, (size_t)(p - r));
        w += p - r;
        memcpy(w, "***", 3);
        w += 3;
        r = p + sl;
    }
    memcpy(w, r, (size_t)(end - r));
    w[end - r] = '\0';
    free(*buf);
    *buf = o;
    *len = nl;
}

char *pawl__dsn_scrub(const char *dsn, const char *msg, char *out, size_t outlen)
{
    if (outlen == 0)
        return out;
    out[0] = '\0';
    if (msg == NULL)
        return out;
    struct secrets S;
    collect(dsn, &S);
    if (S.n >= MAX_SECRETS) {
        /* Full: values past the first MAX_SECRETS were not collected, so no copy of the message
         * is known to be free of them. */
        snprintf(out, outlen,
                 "(message hidden: its connection string holds %d or more password values)",
                 MAX_SECRETS);
        free_secrets(&S);
        return out;
    }
    char *buf = pawl__strdup(msg);
    if (buf == NULL) {
        if (S.n == 0)
            snprintf(out, outlen, "%s", msg);
        free_secrets(&S);
        return out;
    }
    /* Longest first, so that a secret containing another is replaced whole. */
    for (int i = 0; i < S.n; i++)
        for (int j = i + 1; j < S.n; j++)
            if (S.len[j] > S.len[i]) {
                char *t = S.s[i];
                size_t tl = S.len[i];
                S.s[i] = S.s[j];
                S.len[i] = S.len[j];
                S.s[j] = t;
                S.len[j] = tl;
            }
    size_t len = strlen(buf);
    for (int i = 0; i < S.n; i++)
        replace_all(&buf, &len, S.s[i], S.len[i]);
    snprintf(out, outlen, "%s", buf);
    pawl_free(buf);
    free_secrets(&S);
    return out;
}

struct pg_conn *pawl_pq_connect(const char *dsn, int start)
{
    /* expand_dbname: dsn is parsed in place of dbname; a later keyword overrides what it set. */
    static const char *const keys[] = {"dbname", "client_encoding", NULL};
    const char *const vals[] = {dsn ? dsn : "", "UTF8", NULL};
    return start ? PQconnectStartParams(keys, vals, 1) : PQconnectdbParams(keys, vals, 1);
}
