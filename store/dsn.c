/*
 * dsn.c — see dsn.h.
 */
#include "dsn.h"

#include "common.h"

#include <libpq-fe.h>
#include <stdio.h>
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
            snprintf(err, errlen, "%s", msg ? msg : "out of memory");
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
    size_t used = 0;
    for (PQconninfoOption *o = opts; o->keyword != NULL; o++) {
        if (o->val == NULL || o->val[0] == '\0')
            continue;
        /* dispchar "*" marks secret options (password); hide them whatever their name. */
        int secret = strcmp(o->keyword, "password") == 0 || (o->dispchar && o->dispchar[0] == '*');
        int n = snprintf(out + used, outlen - used, "%s%s=%s", used ? " " : "", o->keyword,
                         secret ? "***" : o->val);
        if (n < 0 || (size_t)n >= outlen - used) {
            out[outlen - 1] = '\0';
            break;
        }
        used += (size_t)n;
    }
    PQconninfoFree(opts);
    return out;
}
