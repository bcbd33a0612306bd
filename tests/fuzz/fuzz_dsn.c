/*
 * fuzz_dsn.c — libFuzzer target for DSN handling (store/dsn.c): pawl_dsn_check and
 * pawl_dsn_redact over both conninfo forms. Invariants checked: the redacted text is always
 * NUL-terminated within every buffer size; the redacted text does not depend on any secret
 * (it is the same when every secret option is given another value: a differential oracle, since
 * searching the output for the password's bytes finds them by chance in the mask and in other
 * values); a DSN that fails the check redacts as "<invalid dsn>".
 *
 * Each redaction parses the DSN again (libpq): an input is redacted into a buffer of 1 to 64
 * bytes (chosen by the input's length, so the corpus covers each size) and into one of 4096
 * bytes, whose text the differential check reuses. Each buffer is allocated at exactly its size,
 * so that ASan reports a write past it.
 */
#include "dsn.h"

#include <libpq-fe.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The options of opts as a keyword/value conninfo string, every value quoted ('\\' and '\''
 * escaped), each secret option (password, or dispchar "*") with its value replaced by fill.
 * Empty values are left out, as redaction leaves them out. Caller frees. */
static char *rebuild(const PQconninfoOption *opts, const char *fill)
{
    size_t cap = 1;
    for (const PQconninfoOption *o = opts; o->keyword; o++)
        cap += strlen(o->keyword) + 4 + 2 * (o->val ? strlen(o->val) : 0) + strlen(fill);
    char *s = malloc(cap), *p = s;
    if (s == NULL)
        return NULL;
    for (const PQconninfoOption *o = opts; o->keyword; o++) {
        if (o->val == NULL || o->val[0] == '\0')
            continue;
        int secret = strcmp(o->keyword, "password") == 0 || (o->dispchar && o->dispchar[0] == '*');
        const char *v = secret ? fill : o->val;
        p += sprintf(p, "%s%s='", p == s ? "" : " ", o->keyword);
        for (; *v; v++) {
            if (*v == '\\' || *v == '\'')
                *p++ = '\\';
            *p++ = *v;
        }
        *p++ = '\'';
        *p = '\0';
    }
    *p = '\0';
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *dsn = malloc(size + 1);
    if (dsn == NULL)
        return 0;
    memcpy(dsn, data, size);
    dsn[size] = '\0';

    char err[512] = "";
    int ok = pawl_dsn_check(dsn, err, sizeof err) == 0;
    if (!ok && err[0] == '\0') {
        fprintf(stderr, "refused without a reason\n");
        abort();
    }
    const size_t sizes[] = {1 + size % 64, 4096}; /* 4096 last: out keeps its text */
    char *out = NULL;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        free(out);
        out = malloc(sizes[k]);
        if (out == NULL)
            break;
        memset(out, 'x', sizes[k]);
        pawl_dsn_redact(dsn, out, sizes[k]);
        if (memchr(out, '\0', sizes[k]) == NULL) {
            fprintf(stderr, "redact: no NUL within %zu bytes\n", sizes[k]);
            abort();
        }
        if (!ok && sizes[k] == 4096 && strcmp(out, "<invalid dsn>") != 0) {
            fprintf(stderr, "redact: an invalid DSN printed as \"%s\"\n", out);
            abort();
        }
    }
    if (ok && out) {
        /* Differential: the redacted text of the DSN equals that of the same options with every
         * secret replaced by another value, so no byte of a secret can reach it. */
        PQconninfoOption *opts = PQconninfoParse(dsn, NULL);
        char *alt = opts ? rebuild(opts, "Zz9") : NULL;
        char *other = malloc(4096);
        if (alt && other) {
            pawl_dsn_redact(alt, other, 4096);
            if (strcmp(out, other) != 0) {
                fprintf(stderr, "redact: the text depends on a secret:\n  \"%s\"\n  \"%s\"\n", out,
                        other);
                abort();
            }
        }
        free(other);
        free(alt);
        PQconninfoFree(opts);
    }
    free(out);
    free(dsn);
    return 0;
}
