/*
 * jsonl.c — see jsonl.h. JSON is read and written with jansson: a maintained, small, Debian-
 * packaged C library with strict RFC 8259 parsing, error positions, and no dependencies.
 */
#include "jsonl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void tool_jsonl_event_fini(struct tool_jsonl_event *e)
{
    if (e == NULL)
        return;
    free(e->_stream);
    free(e->_type);
    free(e->_payload);
    free(e->_metadata);
    free(e->_id);
    memset(e, 0, sizeof *e);
}

static int is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
            return 0;
    return 1;
}

/* The keys a line may have (the allowed list in the error below names the same). */
static int known_key(const char *key)
{
    static const char *const keys[] = {
        "stream",      "type",    "payload", "metadata", "seq",         "id",       "index",
        "appended_at", "segment", "replay",  "attempt",  "dead_letter", "batch_end"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strcmp(key, keys[i]) == 0)
            return 1;
    return 0;
}

static int want_name(json_t *o, const char *key, size_t max, char **out, char *err, size_t errlen)
{
    json_t *v = json_object_get(o, key);
    if (v == NULL) {
        snprintf(err, errlen, "missing \"%s\"", key);
        return PAWL_EINVAL;
    }
    if (!json_is_string(v)) {
        snprintf(err, errlen, "\"%s\" must be a string", key);
        return PAWL_EINVAL;
    }
    size_t n = json_string_length(v);
    if (n == 0 || n > max) {
        snprintf(err, errlen, "\"%s\" must be 1 to %zu bytes long (it is %zu)", key, max, n);
        return PAWL_EINVAL;
    }
    if (memchr(json_string_value(v), '\0', n)) {
        snprintf(err, errlen, "\"%s\" must not contain NUL", key);
        return PAWL_EINVAL;
    }
    *out = strdup(json_string_value(v));
    return *out ? 0 : PAWL_ENOMEM;
}

int tool_jsonl_parse(const char *line, size_t len, struct tool_jsonl_event *out, char *err,
                     size_t errlen)
{
    if (is_blank(line, len))
        return 1;
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (o == NULL) {
        snprintf(err, errlen, "not valid JSON at column %d: %s", je.column, je.text);
        return PAWL_EINVAL;
    }
    int rc = PAWL_EINVAL;
    if (!json_is_object(o)) {
        snprintf(err, errlen, "expected a JSON object per line");
        goto fail;
    }
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v)
    {
        if (!known_key(key)) {
            snprintf(err, errlen,
                     "unknown key \"%.60s\" (allowed: stream, type, payload, metadata, seq, "
                     "id; index and appended_at are ignored)",
                     key);
            goto fail;
        }
    }
    if ((rc = want_name(o, "stream", PAWL_STREAM_ID_MAX, &out->_stream, err, errlen)) != 0)
        goto fail;
    if ((rc = want_name(o, "type", PAWL_EVENT_TYPE_MAX, &out->_type, err, errlen)) != 0)
        goto fail;
    v = json_object_get(o, "id");
    if (v && !json_is_null(v)) {
        if ((rc = want_name(o, "id", PAWL_EVENT_ID_MAX, &out->_id, err, errlen)) != 0)
            goto fail;
        rc = PAWL_EINVAL;
        for (const unsigned char *c = (const unsigned char *)out->_id; *c; c++)
            if (*c < 0x20 || *c == 0x7f) {
                snprintf(err, errlen, "\"id\" must not contain control characters");
                goto fail;
            }
    }
    rc = PAWL_EINVAL;
    v = json_object_get(o, "seq");
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
            snprintf(err, errlen, "\"seq\" must be an integer >= 1 (or 0 for the next position)");
            goto fail;
        }
        out->ev.stream_seq = json_integer_value(v);
    }
    v = json_object_get(o, "metadata");
    if (v && !json_is_null(v)) {
        if (!json_is_object(v)) {
            snprintf(err, errlen, "\"metadata\" must be a JSON object or null");
            goto fail;
        }
        out->_metadata = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (out->_metadata == NULL) {
            rc = PAWL_ENOMEM;
            goto fail;
        }
    }
    v = json_object_get(o, "payload");
    if (json_is_string(v)) { /* NULL is not a string */
        size_t n = json_string_length(v);
        out->_payload = malloc(n + 1);
        if (out->_payload == NULL) {
            rc = PAWL_ENOMEM;
            goto fail;
        }
        memcpy(out->_payload, json_string_value(v), n + 1);
        out->ev.payload_len = n;
    } else if (v && !json_is_null(v)) {
        out->_payload = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (out->_payload == NULL) {
            rc = PAWL_ENOMEM;
            goto fail;
        }
        out->ev.payload_len = strlen(out->_payload);
    }
    out->ev.stream_id = out->_stream;
    out->ev.type = out->_type;
    out->ev.payload = out->_payload;
    out->ev.metadata = out->_metadata;
    out->ev.id = out->_id;
    json_decref(o);
    return 0;
fail:
    json_decref(o);
    tool_jsonl_event_fini(out);
    return rc;
}

struct json_t *tool_jsonl_object(const struct pawl_event *ev)
{
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    json_object_set_new(o, "index", json_integer(ev->index));
    json_object_set_new(o, "stream", json_string(ev->stream_id ? ev->stream_id : ""));
    json_object_set_new(o, "seq", json_integer(ev->stream_seq));
    json_object_set_new(o, "type", json_string(ev->type ? ev->type : ""));
    /* A payload that is JSON prints as JSON; other bytes as a string (if valid UTF-8). */
    json_t *p = NULL;
    if (ev->payload_len > 0) {
        p = json_loadb(ev->payload, ev->payload_len, JSON_DECODE_ANY, NULL);
        if (p == NULL)
            p = json_stringn(ev->payload, ev->payload_len);
        if (p == NULL)
            p = json_string("<binary>");
    }
    json_object_set_new(o, "payload", p ? p : json_null());
    json_t *m = ev->metadata ? json_loads(ev->metadata, 0, NULL) : NULL;
    json_object_set_new(o, "metadata", m ? m : json_null());
    char when[40] = "";
    if (ev->appended_at_us > 0) {
        time_t t = (time_t)(ev->appended_at_us / 1000000);
        struct tm tm;
        gmtime_r(&t, &tm);
        char base[24];
        strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(when, sizeof when, "%s.%06lldZ", base, (long long)(ev->appended_at_us % 1000000));
    }
    json_object_set_new(o, "appended_at", when[0] ? json_string(when) : json_null());
    if (ev->id)
        json_object_set_new(o, "id", json_string(ev->id));
    return o;
}

int tool_jsonl_write(FILE *f, const struct pawl_event *ev)
{
    json_t *o = tool_jsonl_object(ev);
    if (o == NULL)
        return PAWL_ENOMEM;
    int rc = json_dumpf(o, f, JSON_COMPACT | JSON_PRESERVE_ORDER) == 0 ? 0 : PAWL_ESYS;
    fputc('\n', f);
    json_decref(o);
    return rc;
}
