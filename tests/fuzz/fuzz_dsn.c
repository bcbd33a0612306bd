/*
 * fuzz_dsn.c — libFuzzer target for DSN handling (store/dsn.c): pawl_dsn_check and
 * pawl_dsn_redact over both conninfo forms. Invariants checked: the redacted text is always
 * NUL-terminated within every buffer size; a DSN that sets a password never shows it (the
 * password's value does not appear in the redacted text unless it also appears as another
 * option's value); a DSN that fails the check redacts as "<invalid dsn>".
 */
#include "dsn.h"

#include <libpq-fe.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int appears_elsewhere(PQconninfoOption *opts, const char *pw)
{
    for (PQconninfoOption *o = opts; o->keyword; o++)
        if (o->val && strcmp(o->keyword, "password") != 0 && strstr(o->val, pw))
            return 1;
    return strstr("password", pw) != NULL || strstr("***", pw) != NULL;
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
            if (strcmp(o->keyword, "password") == 0 && o->val && strlen(o->val) >= 4 &&
                strstr(out, o->val) && !appears_elsewhere(opts, o->val)) {
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
