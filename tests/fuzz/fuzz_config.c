/*
 * fuzz_config.c — libFuzzer target for the flag and config parser: the tool's argv
 * (tool_config_parse_args), its environment (tool_config_load_env), single values
 * (tool_config_set / tool_config_get round trip) and durations (pawl_config_parse_duration).
 *
 * Input: the first byte picks the scope bits, the rest is split at NUL bytes and newlines into
 * up to 64 words. The same words are fed as argv and as environment entries (a word without
 * '=' is an environment entry that matches nothing). Invariants checked: no crash or sanitizer
 * report; a refused value leaves an error message; every value that was accepted prints back
 * (tool_config_get) as text that tool_config_set accepts again and that prints the same.
 */
#include "pawl.h"
#include "tool_config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_WORDS 64

static void check_roundtrip(const struct tool_config *cfg)
{
    char a[8192], b[8192], err[256];
    struct tool_config copy;
    tool_config_defaults(&copy);
    for (size_t i = 0; i < tool_flag_count(); i++) {
        const struct pawl_flag *f = tool_flag_at(i);
        if (tool_config_get(cfg, f->name, a, sizeof a) != 0)
            continue;
        if (tool_config_set(&copy, f->name, a, err, sizeof err) != 0) {
            fprintf(stderr, "--%s: printed value \"%s\" is refused: %s\n", f->name, a, err);
            abort();
        }
        if (tool_config_get(&copy, f->name, b, sizeof b) != 0 || strcmp(a, b) != 0) {
            fprintf(stderr, "--%s: \"%s\" prints back as \"%s\"\n", f->name, a, b);
            abort();
        }
    }
    tool_config_fini(&copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned scope = data[0] == 0xff ? TOOL_SCOPE_ALL : (1u << (data[0] % 11));
    char *buf = malloc(size); /* words, NUL-terminated in place */
    if (buf == NULL)
        return 0;
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';
    char *words[MAX_WORDS + 1];
    int n = 0;
    char *w = buf;
    for (size_t i = 0; i < size - 1 && n < MAX_WORDS; i++) {
        if (buf[i] == '\0' || buf[i] == '\n') {
            buf[i] = '\0';
            words[n++] = w;
            w = buf + i + 1;
        }
    }
    if (n < MAX_WORDS && w < buf + size - 1)
        words[n++] = w;
    words[n] = NULL;

    char err[256] = "";
    struct tool_config cfg;
    tool_config_defaults(&cfg);
    struct tool_config_args args;
    int rc = tool_config_parse_args(&cfg, n, words, scope, &args, err, sizeof err);
    if (rc != 0 && err[0] == '\0') {
        fprintf(stderr, "parse_args failed (%d) without a message\n", rc);
        abort();
    }
    if (rc == 0) {
        check_roundtrip(&cfg);
        char cerr[256];
        (void)tool_config_check(&cfg, cerr, sizeof cerr);
    }
    tool_config_fini(&cfg);

    tool_config_defaults(&cfg);
    err[0] = '\0';
    rc = tool_config_load_env(&cfg, words, err, sizeof err);
    if (rc == 0)
        check_roundtrip(&cfg);
    tool_config_fini(&cfg);

    /* Each word alone as a duration, and as the value of every flag type. */
    static const char *const one_of_each[] = {"dsn",  "connections", "finalizer", "claim-timeout",
                                              "rate", "log-level",   "to"};
    tool_config_defaults(&cfg);
    for (int i = 0; i < n && i < 8; i++) {
        int64_t ms;
        (void)pawl_config_parse_duration(words[i], &ms);
        for (size_t k = 0; k < sizeof one_of_each / sizeof one_of_each[0]; k++)
            (void)tool_config_set(&cfg, one_of_each[k], words[i], err, sizeof err);
    }
    check_roundtrip(&cfg);
    tool_config_fini(&cfg);
    free(buf);
    return 0;
}
