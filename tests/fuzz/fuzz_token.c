/*
 * fuzz_token.c — libFuzzer target for token and segment strings: the reset target of
 * `pawl reset --to` (start, end, an index, an ISO 8601 time, a relative time) and the segment
 * and token flags (--segment, --initial-token, --from) through the config parser, plus the
 * segment arithmetic a parsed segment id feeds (split, sibling, parent).
 *
 * Invariants checked: an accepted index is exactly the number written (never negative, never
 * clamped on overflow); a refused string leaves a message; a segment derived from a valid one is
 * valid.
 */
#include "pawl.h"
#include "status.h"
#include "tool_config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (s == NULL)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';

    enum pawl_reset_kind kind;
    int64_t value = 0;
    char err[512] = "";
    const int64_t now_us = INT64_C(1796000000) * 1000000; /* a fixed "now": reproducible */
    int rc = tool_parse_reset_target(s, now_us, &kind, &value, err, sizeof err);
    if (rc == 0 && kind == PAWL_RESET_INDEX) {
        /* An accepted index is exactly the digits given: never negative, never clamped. */
        const char *digits = s;
        while (digits[0] == '0' && digits[1] != '\0')
            digits++;
        char back[32];
        snprintf(back, sizeof back, "%lld", (long long)value);
        if (value < 0 || strcmp(back, digits) != 0) {
            fprintf(stderr, "index %lld accepted from \"%s\"\n", (long long)value, s);
            abort();
        }
    }
    if (rc != 0 && err[0] == '\0') {
        fprintf(stderr, "refused without a message\n");
        abort();
    }

    struct tool_config cfg;
    tool_config_defaults(&cfg);
    static const char *const names[] = {"segment", "initial-token", "from", "segments", "to"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        (void)tool_config_set(&cfg, names[i], s, err, sizeof err);
    tool_config_fini(&cfg);

    if (size >= 8) {
        struct pawl_segment seg, a, b;
        memcpy(&seg.id, data, 4);
        memcpy(&seg.mask, data + 4, 4);
        if (pawl_segment_valid(seg)) {
            if (pawl_segment_split(seg, &a, &b) == 0 &&
                (!pawl_segment_valid(a) || !pawl_segment_valid(b))) {
                fprintf(stderr, "split of a valid segment is invalid\n");
                abort();
            }
            if (pawl_segment_sibling(seg, &a) == 0 && !pawl_segment_valid(a)) {
                fprintf(stderr, "sibling of a valid segment is invalid\n");
                abort();
            }
            if (pawl_segment_parent(seg, &a) == 0 && !pawl_segment_valid(a)) {
                fprintf(stderr, "parent of a valid segment is invalid\n");
                abort();
            }
        }
    }
    free(s);
    return 0;
}
