/*
 * filter_opt.c — see filter_opt.h. JSON is read with jansson.
 */
#include "filter_opt.h"

#include "pawl/common.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const FLAG[3] = {"--category", "--stream-prefix", "--types"};
static const char *const KEY[3] = {"categories", "stream_prefixes", "types"};

void tool_filter_fini(struct tool_filter *tf)
{
    if (tf == NULL)
        return;
    free(tf->text);
    free(tf->ptrs);
    memset(tf, 0, sizeof *tf);
}

static void assign(struct tool_filter *tf, const char **lists[3], const size_t n[3])
{
    tf->f.categories = lists[0];
    tf->f.n_categories = n[0];
    tf->f.stream_prefixes = lists[1];
    tf->f.n_stream_prefixes = n[1];
    tf->f.types = lists[2];
    tf->f.n_types = n[2];
    tf->given = n[0] + n[1] + n[2] > 0;
}

int tool_filter_from_flags(const char *categories, const char *prefixes, const char *types,
                           struct tool_filter *tf, char *err, size_t errlen)
{
    memset(tf, 0, sizeof *tf);
    const char *in[3] = {categories, prefixes, types};
    size_t total = 0, elems = 0;
    for (int k = 0; k < 3; k++) {
        if (in[k] == NULL)
            continue;
        total += strlen(in[k]) + 1;
        elems += 1;
        for (const char *c = in[k]; *c; c++)
            elems += *c == ',';
    }
    if (elems == 0)
        return 0;
    tf->text = malloc(total);
    tf->ptrs = malloc(elems * sizeof *tf->ptrs);
    if (tf->text == NULL || tf->ptrs == NULL) {
        tool_filter_fini(tf);
        return PAWL_ENOMEM;
    }
    const char **lists[3] = {NULL, NULL, NULL};
    size_t n[3] = {0, 0, 0}, used = 0;
    char *at = tf->text;
    for (int k = 0; k < 3; k++) {
        if (in[k] == NULL)
            continue;
        size_t len = strlen(in[k]);
        memcpy(at, in[k], len + 1);
        lists[k] = &tf->ptrs[used];
        /* Split on ',' keeping empty pieces, so that "a,,b" or a trailing ',' is an error. */
        char *p = at;
        for (;;) {
            char *comma = strchr(p, ',');
            if (comma)
                *comma = '\0';
            if (*p == '\0') {
                snprintf(err, errlen, "%s: an empty name in \"%s\" (names are separated by ',')",
                         FLAG[k], in[k]);
                tool_filter_fini(tf);
                return PAWL_EINVAL;
            }
            tf->ptrs[used++] = p;
            n[k]++;
            if (comma == NULL)
                break;
            p = comma + 1;
        }
        at += len + 1;
    }
    assign(tf, lists, n);
    char why[300];
    if (pawl_filter_check(&tf->f, why, sizeof why) != 0) {
        snprintf(err, errlen, "the filter: %s", why);
        tool_filter_fini(tf);
        return PAWL_EINVAL;
    }
    return 0;
}

int tool_filter_from_json(const char *json, struct tool_filter *tf, char *err, size_t errlen)
{
    memset(tf, 0, sizeof *tf);
    json_error_t je;
    json_t *o = json_loads(json, 0, &je);
    if (o == NULL || !json_is_object(o)) {
        snprintf(err, errlen, "the recorded filter is not a JSON object: %s", json);
        json_decref(o);
        return PAWL_EINVAL;
    }
    size_t total = 0, elems = 0;
    for (int k = 0; k < 3; k++) {
        json_t *a = json_object_get(o, KEY[k]);
        size_t i;
        json_t *v;
        if (a == NULL)
            continue;
        if (!json_is_array(a)) {
            snprintf(err, errlen, "the recorded filter's %s is not a list", KEY[k]);
            json_decref(o);
            return PAWL_EINVAL;
        }
        json_array_foreach(a, i, v)
        {
            if (!json_is_string(v)) {
                snprintf(err, errlen, "the recorded filter's %s holds a non-string", KEY[k]);
                json_decref(o);
                return PAWL_EINVAL;
            }
            total += strlen(json_string_value(v)) + 1;
            elems++;
        }
    }
    if (elems == 0) {
        json_decref(o);
        return 0;
    }
    tf->text = malloc(total);
    tf->ptrs = malloc(elems * sizeof *tf->ptrs);
    if (tf->text == NULL || tf->ptrs == NULL) {
        json_decref(o);
        tool_filter_fini(tf);
        return PAWL_ENOMEM;
    }
    const char **lists[3] = {NULL, NULL, NULL};
    size_t n[3] = {0, 0, 0}, used = 0;
    char *at = tf->text;
    for (int k = 0; k < 3; k++) {
        json_t *a = json_object_get(o, KEY[k]);
        size_t i;
        json_t *v;
        if (a == NULL)
            continue;
        lists[k] = &tf->ptrs[used];
        json_array_foreach(a, i, v)
        {
            size_t len = strlen(json_string_value(v));
            memcpy(at, json_string_value(v), len + 1);
            tf->ptrs[used++] = at;
            n[k]++;
            at += len + 1;
        }
    }
    json_decref(o);
    assign(tf, lists, n);
    char why[300];
    if (pawl_filter_check(&tf->f, why, sizeof why) != 0) {
        snprintf(err, errlen, "the recorded filter: %s", why);
        tool_filter_fini(tf);
        return PAWL_EINVAL;
    }
    return 0;
}

void tool_filter_describe(const struct tool_filter *tf, char *out, size_t len)
{
    static const char *const WHAT[3] = {"category", "stream prefix", "types"};
    size_t used = 0;
    out[0] = '\0';
    if (!tf->given)
        return;
    const char *const *lists[3] = {tf->f.categories, tf->f.stream_prefixes, tf->f.types};
    size_t n[3] = {tf->f.n_categories, tf->f.n_stream_prefixes, tf->f.n_types};
    for (int k = 0; k < 3; k++) {
        if (n[k] == 0)
            continue;
        int w = snprintf(out + used, len - used, "%s%s ", used ? "; " : "", WHAT[k]);
        if (w < 0 || (size_t)w >= len - used)
            return;
        used += (size_t)w;
        for (size_t i = 0; i < n[k]; i++) {
            w = snprintf(out + used, len - used, "%s%s", i ? "," : "", lists[k][i]);
            if (w < 0 || (size_t)w >= len - used)
                return;
            /* Names are anyone's bytes: no control character reaches the terminal. */
            for (size_t c = used; c < used + (size_t)w; c++)
                if ((unsigned char)out[c] < 0x20 || out[c] == 0x7f)
                    out[c] = '?';
            used += (size_t)w;
        }
    }
}
