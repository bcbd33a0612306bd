/*
 * fuzz_jsonl.c — libFuzzer target for the JSON-lines event input of `pawl append`.
 *
 * The input is split into lines as `pawl append` reads them; each line goes through
 * tool_jsonl_parse. Invariants checked: a parsed event has a stream id and a type within their
 * documented limits and without NUL, a non-negative seq, a payload pointer whenever its length
 * is non-zero; a refused line leaves a message; writing a parsed event back (tool_jsonl_write,
 * as `pawl tail` does) and parsing that line again gives the same stream, type and seq.
 */
#include "jsonl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_event(const struct tool_jsonl_event *e)
{
    const struct pawl_event *ev = &e->ev;
    size_t sn = ev->stream_id ? strlen(ev->stream_id) : 0;
    size_t tn = ev->type ? strlen(ev->type) : 0;
    if (sn == 0 || sn > PAWL_STREAM_ID_MAX || tn == 0 || tn > PAWL_EVENT_TYPE_MAX ||
        ev->stream_seq < 0 || (ev->payload_len > 0 && ev->payload == NULL)) {
        fprintf(stderr, "accepted an event outside the documented limits\n");
        abort();
    }
}

static void roundtrip(const struct tool_jsonl_event *e)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == NULL)
        return;
    int rc = tool_jsonl_write(f, &e->ev);
    fclose(f);
    if (rc != 0) {
        free(text);
        return;
    }
    struct tool_jsonl_event again;
    char err[256] = "";
    /* A stream id or type that is not valid UTF-8 cannot be printed as JSON; the writer may
     * then print something else, which must still be one parsable line or refused cleanly. */
    rc = tool_jsonl_parse(text, len, &again, err, sizeof err);
    if (rc == 0) {
        check_event(&again);
        if (strcmp(again.ev.stream_id, e->ev.stream_id) == 0 &&
            strcmp(again.ev.type, e->ev.type) == 0 && again.ev.stream_seq != e->ev.stream_seq) {
            fprintf(stderr, "seq changed in the round trip\n");
            abort();
        }
        tool_jsonl_event_fini(&again);
    }
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    const char *end = p + size;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        struct tool_jsonl_event e;
        char err[256] = "";
        int rc = tool_jsonl_parse(p, len, &e, err, sizeof err);
        if (rc == 0) {
            check_event(&e);
            roundtrip(&e);
            tool_jsonl_event_fini(&e);
        } else if (rc < 0 && err[0] == '\0') {
            fprintf(stderr, "refused a line without a message\n");
            abort();
        }
        p += len + (nl ? 1 : 0);
    }
    return 0;
}
