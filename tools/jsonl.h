/*
 * jsonl.h — events as JSON lines, the input of `pawl append` and the output of `pawl tail`.
 *
 * One event per line:
 *   {"stream": "order-17", "type": "OrderPlaced", "payload": {...}, "metadata": {...}, "seq": 3,
 *    "id": "9f1c..."}
 * stream and type are required non-empty strings (at most 255 bytes); payload is any JSON value
 * (a string is taken as its bytes, anything else as its compact JSON text; absent means empty);
 * metadata is an object or null; seq (optional, >= 1) is the stream position the event must get
 * (an append conflicts if the stream has moved on), 0 or absent means "next"; id (optional:
 * 1..128 bytes, no control characters) is the event's id, which makes the line's append safe to
 * repeat. "index" and "appended_at" (what `pawl tail` prints) and "segment", "replay", "attempt",
 * "dead_letter" and "batch_end" (what `pawl run --handler print|exec` adds) are accepted and
 * ignored, so `pawl tail | pawl append` copies a log (a second copy with ids writes nothing).
 * Output has "id" only for events that carry one. Other keys are refused: a misspelt key is an
 * error, not silently dropped data.
 *
 * The parser is independent of the tool's main so a fuzz target can call it directly. Not
 * thread-safe per object; separate objects may be used on separate threads.
 */
#ifndef PAWL_TOOL_JSONL_H
#define PAWL_TOOL_JSONL_H

#include "pawl.h"

#include <stddef.h>
#include <stdio.h>

/* A parsed event: ev's pointers point into the owned buffers below. */
struct tool_jsonl_event {
    struct pawl_event ev;
    char *_stream, *_type, *_payload, *_metadata, *_id; /* owned (malloc) */
};

/*
 * Parse one line (len bytes, no NUL needed). Returns 0 and fills out; 1 for a blank line (out
 * untouched); PAWL_EINVAL with the reason (and the column when JSON is malformed) in err.
 * Call tool_jsonl_event_fini on out after a 0 return.
 */
int tool_jsonl_parse(const char *line, size_t len, struct tool_jsonl_event *out, char *err,
                     size_t errlen);
void tool_jsonl_event_fini(struct tool_jsonl_event *e);

/* ev as a JSON object (jansson's json_t: index, stream, seq, type, payload, metadata,
 * appended_at), for callers that add fields; NULL when out of memory. Caller decrefs. */
struct json_t *tool_jsonl_object(const struct pawl_event *ev);

/* Write ev as one JSON line (with its index and time) to f. */
int tool_jsonl_write(FILE *f, const struct pawl_event *ev);

#endif
