/*
 * pawl/event.h — the event as every layer sees it, and the token.
 *
 * A token is one int64: the global index of the last event a reader or a segment has handled.
 * 0 means "before the first event" (final indexes start at 1). Because the log's global index
 * only moves forward (a reader never finds a new event below an index it has read), a token
 * needs no gap tracking.
 */
#ifndef PAWL_EVENT_H
#define PAWL_EVENT_H

#include <stddef.h>
#include <stdint.h>

#include "pawl/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PAWL_TOKEN_START ((int64_t)0)

/* Limits checked before anything reaches the server. */
#define PAWL_STREAM_ID_MAX 255  /* bytes of UTF-8, at least 1 */
#define PAWL_EVENT_TYPE_MAX 255 /* bytes of UTF-8, at least 1 */
#define PAWL_EVENT_ID_MAX 128   /* bytes of UTF-8, at least 1, no control characters */

/*
 * One event. When the log hands an event to a reader or handler, every pointer is borrowed and
 * valid only until the callback returns (the batch buffer is reused); copy what you keep.
 * When a caller appends, the pointers are the caller's and are read during the call only.
 */
struct pawl_event {
    int64_t index;         /* final global index (>= 1); 0 in an append request */
    const char *stream_id; /* NUL-terminated UTF-8, 1..PAWL_STREAM_ID_MAX bytes */
    int64_t stream_seq;    /* 1-based position in its stream */
    const char *type;      /* NUL-terminated UTF-8, 1..PAWL_EVENT_TYPE_MAX bytes */
    const void *payload;   /* opaque bytes (bytea); may be NULL when payload_len is 0 */
    size_t payload_len;
    const char *metadata;   /* JSON object text, or NULL */
    int64_t appended_at_us; /* time the append committed (server clock), µs since the epoch */
    /*
     * The event's id, or NULL: the client's key for it (a UUID, or any string of 1..
     * PAWL_EVENT_ID_MAX bytes of UTF-8 without control characters), unique across the log for
     * as long as the event is kept. In an append every event carries one or none does; an
     * append whose ids are all in the log already, each for an event of the same stream, type
     * and payload, writes nothing and reports the numbers they got (a retry: see
     * pawl_append_result.already); one that repeats only some of them, or an id of another
     * event, fails with PAWL_EIDUSED.
     */
    const char *id;
};

#ifdef __cplusplus
}
#endif
#endif
