/*
 * fuzz_dsn.c — libFuzzer target for DSN handling (store/dsn.c): pawl_dsn_check and
 * pawl_dsn_redact over both conninfo forms. Invariants checked: the redacted text is always
 * NUL-terminated within every buffer size; a DSN that sets a password never shows it (the
 * password's value does not appear in the redacted text, once its "password=***" is taken out,
 * unless it also occurs in the other options' keyword=value text); a DSN that fails the check
 * redacts as "<invalid dsn>".
 */
#include "dsn.h"

#include <libpq-fe.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Non-zero when pw occurs in what the redacted text may legitimately show: the other options
 * as keyword=value, space-separated, in libpq's order. */
static int appears_elsewhere(PQconninfoOption *opts, const char *pw)
{
    size_t cap = 16, n = 0;
    for (PQconninfoOption *o = opts; o->keyword; o++)
        cap += strlen(o->keyword) + (o->val ? strlen(o->val) : 0) + 2;
    char *all = malloc(cap);
    if (all == NULL)
        return 1;
    all[0] = '\0';
    for (PQconninfoOption *o = opts; o->keyword; o++)
        if (o->val && o->val[0] && strcmp(o->keyword, "password") != 0)
            n += (size_t)snprintf(all + n, cap - n, "%s%s=%s", n ? " " : "", o->keyword, o->val);
    int found = strstr(all, pw) != NULL;
    free(all);
    return found;
}

/* Remove the first "password=***" token (and one adjacent space) from out, in place. */
/* Remove every masked secret ("password=***", "sslpassword=***", ...): a password made of '*'
 * would otherwise be found inside the mask itself. */
static void drop_mask(char *out)
{
    char *m;
    while ((m = strstr(out, "=***")) != NULL) {
        char *start = m;
        while (start > out && start[-1] != ' ')
            start--;
        char *end = m + strlen("=***");
        if (*end == ' ')
            end++;
        else if (start > out && start[-1] == ' ')
            start--;
        memmove(start, end, strlen(end) + 1);
    }
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
    static const size_t sizes[] = {1, 2, 7, 16, 64, 4096};
    char *out = malloc(4096);
    for (size_t k = 0; out && k < sizeof sizes / sizeof sizes[0]; k++) {
        memset(out, 'x', 4096);
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
        pawl_dsn_redact(dsn, out, 4096);
        PQconninfoOption *opts = PQconninfoParse(dsn, NULL);
        for (PQconninfoOption *o = opts; o && o->keyword; o++) {
            if (strcmp(o->keyword, "password") != 0 || o->val == NULL || o->val[0] == '\0')
                continue;
            /* A password of fewer than 4 bytes, or one containing the mask character, is found
             * by chance in keywords, other values or the mask itself: no evidence of a leak. */
            if (strlen(o->val) < 4 || strchr(o->val, '*') != NULL)
                continue;
            drop_mask(out);
            if (strstr(out, o->val) && !appears_elsewhere(opts, o->val)) {
                fprintf(stderr, "redact: the password shows in \"%s\"\n", out);
                abort();
            }
        }
        PQconninfoFree(opts);
    }
    free(out);
    free(dsn);
    return 0;
}
