/*
 * pgq.h — the few queries the tool makes itself, over one plain libpq connection: the list of
 * processors (status without a name), deleting a processor, a stream's current version (the
 * conflict message of append), the final index of an appended event (append --wait) and the
 * retention functions (retention). The
 * library has no API for these operator questions, and they are not on any hot path. Main
 * thread only; each call opens and closes its connection.
 */
#ifndef PAWL_TOOL_PGQ_H
#define PAWL_TOOL_PGQ_H

#include "tool.h"

#include <stdint.h>

struct tool_proc_row {
    char name[PAWL_NAME_MAX + 1];
    int64_t segments;
    int64_t claimed;  /* segments with a live claim (younger than the claim timeout) */
    int64_t expired;  /* segments whose claim is older than the claim timeout */
    char owners[512]; /* the live owners, comma-separated (raw: escape for printing) */
    int64_t lowest_token;
    int64_t head;
    char filter[1024]; /* the recorded filter as JSON ("{}": none; raw: escape for printing) */
};

/* A filter recorded for proc, which has no segments (its first node stopped between recording
 * the filter and creating them): *found says whether there is one; execute deletes it. */
int tool_pgq_orphan_filter(const char *dsn, const char *proc, int execute, int *found, char *err,
                           size_t errlen);

/* proc's recorded filter as JSON in *json, malloc'ed ("{}" when none is recorded). */
int tool_pgq_processor_filter(const char *dsn, const char *proc, char **json, char *err,
                              size_t errlen);

/* Every processor in pawl.tokens, by name; *rows is malloc'ed (free it). PAWL_* code, with the
 * server's message in err: PAWL_ESCHEMA when the database has no pawl schema (by SQLSTATE). */
int tool_pgq_processors(const char *dsn, int64_t claim_timeout_ms, struct tool_proc_row **rows,
                        size_t *n, char *err, size_t errlen);

/*
 * Delete proc's segments and node records in one transaction, unless a segment has a live
 * claim (younger than claim_timeout_ms): PAWL_EBUSY then, deleting nothing, with the owners in
 * err. *deleted gets the number of segment rows removed (0: no such processor, PAWL_ENOTFOUND).
 */
int tool_pgq_delete_processor(const char *dsn, const char *proc, int64_t claim_timeout_ms,
                              int64_t *deleted, char *err, size_t errlen);

/* The highest stream_seq of stream (0 when the stream is empty). */
int tool_pgq_stream_version(const char *dsn, const char *stream, int64_t *version, char *err,
                            size_t errlen);

/* The final index of stream#seq, if it is finalized (0 otherwise). */
int tool_pgq_event_index(const char *dsn, const char *stream, int64_t seq, int64_t *index,
                         char *err, size_t errlen);

/* One partition of pawl.events, as pawl.retention_plan reports it for a low-watermark. */
struct tool_part_row {
    char name[64];
    char lo[24], hi[24];                  /* its xid range; "" = unbounded */
    int64_t min_index, max_index, events; /* of its finalized events; events 0: none */
    int64_t bytes;
    int finalized; /* closed, and every event in it has its index */
    int drops;     /* a drop at the watermark asked for takes it whole */
};

/*
 * The log's partitions and what moving its start to w (0: nowhere) would do; *rows is
 * malloc'ed (free it). *first, *last: the log's first and last index; slow (when not NULL,
 * slowlen bytes) gets "name at token T, ..." for the processors with a token below w - 1.
 */
int tool_pgq_retention_plan(const char *dsn, int64_t w, struct tool_part_row **rows, size_t *n,
                            int64_t *first, int64_t *last, char *slow, size_t slowlen, char *err,
                            size_t errlen);

/* Close the open partition (pawl.rotate); part gets the new open partition, "" when none. */
int tool_pgq_rotate(const char *dsn, char *part, size_t partlen, char *err, size_t errlen);

/*
 * Move the log's start to w and drop the partitions wholly below it (pawl.retention_drop).
 * PAWL_EBUSY when a processor's token is below w - 1 and not force (err names it), PAWL_EINVAL
 * for a watermark outside the log. *parts and *bytes: what was dropped.
 */
int tool_pgq_retention_drop(const char *dsn, int64_t w, int force, int64_t *parts, int64_t *bytes,
                            char *err, size_t errlen);

#endif
