/*
 * filter_opt.h — the read filter as the tool takes it (--category, --stream-prefix, --types:
 * comma-separated lists) and as the token store records it (JSON), turned into a struct
 * pawl_filter (pawl/log.h).
 */
#ifndef PAWL_TOOL_FILTER_OPT_H
#define PAWL_TOOL_FILTER_OPT_H

#include "pawl/log.h"

#include <stddef.h>

struct tool_filter {
    struct pawl_filter f;
    int given;  /* 0: no filter (f is empty) */
    char *text; /* owned: the strings f points into */
    const char **ptrs;
};

/*
 * From the three flags (NULL: not given). Returns 0 (tf->given says whether any was), or
 * PAWL_EINVAL with a message naming the flag in err (an empty element, a category with '-',
 * pawl_filter_check's reasons), or PAWL_ENOMEM.
 */
int tool_filter_from_flags(const char *categories, const char *prefixes, const char *types,
                           struct tool_filter *tf, char *err, size_t errlen);

/* From the JSON the token store records ("{}": no filter). */
int tool_filter_from_json(const char *json, struct tool_filter *tf, char *err, size_t errlen);

/* A short text for people: "category acct,order; types Opened" ("" when not given). */
void tool_filter_describe(const struct tool_filter *tf, char *out, size_t len);

void tool_filter_fini(struct tool_filter *tf);

#endif
