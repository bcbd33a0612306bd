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
 *
 * Only the fields an input changed are printed back: whether a value prints back depends on the
 * value alone, and the defaults are printed back once, before the first input (test_tool_config
 * checks them too). Going over the whole table by name three times an input would cost more
 * than everything else together.
 */
#include "pawl.h"
#include "tool_config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_WORDS 64

/* The library's rows are placed relative to struct pawl_config, the tool's to struct
 * tool_config: with lib first, both are offsets into struct tool_config. */
_Static_assert(offsetof(struct tool_config, lib) == 0, "rows are offsets into tool_config");

/* Whether a field (an integer, a double or a pointer: 1, 2, 4 or 8 bytes) differs: compared as
 * a number of its size, as memcmp would be one more call per flag into the sanitizers' and the
 * fuzzer's hooks. */
static bool field_differs(const void *a, const void *b, size_t size)
{
    switch (size) {
    case 1:
        return *(const uint8_t *)a != *(const uint8_t *)b;
    case 2: {
        uint16_t x, y;
        memcpy(&x, a, 2);
        memcpy(&y, b, 2);
        return x != y;
    }
    case 4: {
        uint32_t x, y;
        memcpy(&x, a, 4);
        memcpy(&y, b, 4);
        return x != y;
    }
    case 8: {
        uint64_t x, y;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        return x != y;
    }
    default:
        abort();
    }
}

static struct tool_config defaults; /* owns no string: never finished */

/* Each flag whose field in cfg differs from the default's (every flag: all) prints back. */
static void check_roundtrip(const struct tool_config *cfg, bool all)
{
    char a[8192], b[8192], err[256];
    struct tool_config copy;
    bool have_copy = false;
    for (size_t i = 0; i < tool_flag_count(); i++) {
        const struct pawl_flag *f = tool_flag_at(i);
        if (!all && !field_differs((const char *)cfg + f->offset,
                                   (const char *)&defaults + f->offset, f->size))
            continue;
        if (tool_config_get(cfg, f->name, a, sizeof a) != 0)
            continue;
        if (!have_copy) {
            tool_config_defaults(&copy);
            have_copy = true;
        }
        if (tool_config_set(&copy, f->name, a, err, sizeof err) != 0) {
            fprintf(stderr, "--%s: printed value \"%s\" is refused: %s\n", f->name, a, err);
            abort();
        }
        if (tool_config_get(&copy, f->name, b, sizeof b) != 0 || strcmp(a, b) != 0) {
            fprintf(stderr, "--%s: \"%s\" prints back as \"%s\"\n", f->name, a, b);
            abort();
        }
    }
    if (have_copy)
        tool_config_fini(&copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const one_of_each[] = {"dsn",  "connections", "finalizer", "claim-timeout",
                                              "rate", "log-level",   "to"};
    /* The rows' own names: a lookup ends at the same pointer (these are not what is fuzzed). */
    static const char *row_name[sizeof one_of_each / sizeof one_of_each[0]];
    static bool started;
    if (!started) {
        tool_config_defaults(&defaults);
        check_roundtrip(&defaults, true);
        for (size_t k = 0; k < sizeof one_of_each / sizeof one_of_each[0]; k++)
            row_name[k] = tool_flag_find(one_of_each[k])->name;
        started = true;
    }
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
        check_roundtrip(&cfg, false);
        char cerr[256];
        (void)tool_config_check(&cfg, cerr, sizeof cerr);
    }
    tool_config_fini(&cfg);

    tool_config_defaults(&cfg);
    err[0] = '\0';
    rc = tool_config_load_env(&cfg, words, err, sizeof err);
    if (rc == 0)
        check_roundtrip(&cfg, false);
    tool_config_fini(&cfg);

    /* Each word alone as a duration, and as the value of every flag type. Most are refused:
     * without an error buffer, as the messages (checked above, for argv and the environment)
     * would cost more than the rest of the input together. */
    tool_config_defaults(&cfg);
    for (int i = 0; i < n && i < 8; i++) {
        int64_t ms;
        (void)pawl_config_parse_duration(words[i], &ms);
        for (size_t k = 0; k < sizeof one_of_each / sizeof one_of_each[0]; k++)
            (void)tool_config_set(&cfg, row_name[k], words[i], NULL, 0);
    }
    check_roundtrip(&cfg, false);
    tool_config_fini(&cfg);
    free(buf);
    return 0;
}
