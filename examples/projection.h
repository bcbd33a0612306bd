/*
 * projection.h — example 1 of the checkpoint protocol: an in-memory projection that snapshots
 * asynchronously.
 *
 * The projection applies every event to in-memory state on the processing thread (so ordering
 * comes for free) and persists nothing per event. Every `every` applied events it asks for a
 * checkpoint through the trigger reachable from the handler's context. When the processor takes
 * the checkpoint, the projection copies the segment's state and hands the copy to its own writer
 * thread, which writes it to a file, fsyncs it and renames it into place, then completes the
 * checkpoint future with the snapshotted position. Event handling resumes as soon as the future
 * completes; the future only gates storing the token on the snapshot being durable.
 *
 * State per segment (id, mask): the number of events applied, the sum and an order-sensitive
 * hash of their indexes, and `pos`, the position the state is complete up to. On claim the
 * segment's snapshot is loaded; events at or below its position are skipped. That makes the
 * projection exactly-once even though the snapshot may be durable ahead of the stored token
 * (a crash between the snapshot and the token's commit): the redelivered events are already in
 * the snapshot and are not applied twice.
 *
 * Threads: the handler and checkpoint callbacks run on the processor's workers (one segment step
 * at a time); the writer thread is the projection's own. ex_projection_get may be called from any
 * thread.
 */
#ifndef EX_PROJECTION_H
#define EX_PROJECTION_H

#include "pawl.h"

struct ex_projection;

struct ex_proj_state {
    int64_t pos;   /* complete up to this token */
    int64_t count; /* events applied */
    uint64_t sum;  /* sum of applied indexes */
    uint64_t hash; /* order-sensitive hash of applied indexes */
};

/*
 * A projection snapshotting into dir (borrowed path, copied), asking for a checkpoint every
 * `every` events (0: never; then only auto mode or another unit's request checkpoints it).
 */
int ex_projection_new(struct ex_projection **out, const char *dir, int every);
/* Stops the writer after it has written what is queued. NULL is a no-op. */
void ex_projection_free(struct ex_projection *p);

/* A handler for pawl_processor_new; p must outlive the processor. */
struct pawl_handler ex_projection_handler(struct ex_projection *p, const char *name);

/* The in-memory state of a claimed segment (0) or PAWL_ENOTFOUND. */
int ex_projection_get(struct ex_projection *p, struct pawl_segment seg, struct ex_proj_state *out);

/* The durable snapshot of seg in dir (0), PAWL_ENOTFOUND, or PAWL_ESYS. */
int ex_projection_load(const char *dir, struct pawl_segment seg, struct ex_proj_state *out);

/* Fold one index into a state (what the projection does per event; for checking). */
void ex_proj_apply(struct ex_proj_state *s, int64_t index);

/* Testing hook: the next n snapshots fail (the future completes with an error). */
void ex_projection_fail_snapshots(struct ex_projection *p, int n);

#endif
