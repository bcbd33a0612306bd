/*
 * pawl/processor.h — pooled streaming processors: segments, handlers, the event source and
 * token store interfaces, the processor object, and the subscribing processor.
 *
 * A processor hands the log's events to handlers, one segment at a time. A segment (id, mask)
 * holds the events whose stream hash h satisfies (h & mask) == id; every event of one stream
 * therefore lands in one segment and handlers see each stream in index order. Segments are
 * claimed in a token store shared by every node running the processor (one row per processor
 * and segment: mask, token, owner, claim time), so any number of processes share the work with
 * no coordinator node. A node's claimed segment is driven by a work package: it takes the
 * segment's events in batches, runs the handlers, and commits each batch in one transaction
 * together with the segment's new token and any SQL the handlers queued (exactly-once
 * projections, where the token moves with the batch: not in fully-deferred checkpoint mode,
 * see pawl/checkpoint.h). Every token write is conditional on the writer still owning the claim: a
 * node whose claim was taken over learns it at its next write, and that batch rolls back.
 *
 * Threads: pawl_processor_new/start/stop/free are called from one controlling thread (not from
 * a handler). Handlers run on the processor's worker threads, never two batches of one segment
 * at once. pawl_processor_stats, _split and _merge may be called from any thread except a
 * handler. The event source and token store implementations must be thread-safe.
 */
#ifndef PAWL_PROCESSOR_H
#define PAWL_PROCESSOR_H

#include <stddef.h>
#include <stdint.h>

#include "pawl/common.h"
#include "pawl/event.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Segments
 * ------------------------------------------------------------------------------------------ */

/* An event belongs to the segment iff (pawl_stream_hash(stream_id) & mask) == id. The mask is
 * always 2^k - 1 (k = 0..31) and id <= mask. */
struct pawl_segment {
    uint32_t id;
    uint32_t mask;
};

/*
 * The stream hash: MurmurHash3 x86_32 with seed 0 over the bytes of stream_id (without the
 * terminating NUL). Fixed forever: it must agree across processes, machines and versions, and
 * any language can recompute it. Test vectors: "" -> 0x00000000, "a" -> 0x3c2569b2,
 * "The quick brown fox jumps over the lazy dog" -> 0x2e4ff723. NULL hashes like "".
 */
PAWL_API uint32_t pawl_stream_hash(const char *stream_id);

/* Non-zero iff the stream hash h belongs to seg. */
static inline int pawl_segment_contains(struct pawl_segment seg, uint32_t h)
{
    return (h & seg.mask) == seg.id;
}

/* Non-zero iff seg is well formed (mask = 2^k - 1, id <= mask). */
PAWL_API int pawl_segment_valid(struct pawl_segment seg);

/* The i-th of n initial segments (n a power of two, 1..2^16): (i, n - 1). */
PAWL_API struct pawl_segment pawl_segment_initial(uint32_t i, uint32_t n);

/*
 * Split (id, m) into (id, 2m+1) and (id+m+1, 2m+1); both inherit the token. PAWL_ERANGE when
 * the mask is already 2^31 - 1.
 */
PAWL_API int pawl_segment_split(struct pawl_segment seg, struct pawl_segment *lo,
                                struct pawl_segment *hi);

/* The segment seg merges with: the other half of its parent. PAWL_ERANGE when mask == 0. */
PAWL_API int pawl_segment_sibling(struct pawl_segment seg, struct pawl_segment *sibling);

/* The parent of seg (the result of merging seg with its sibling). PAWL_ERANGE when mask == 0. */
PAWL_API int pawl_segment_parent(struct pawl_segment seg, struct pawl_segment *parent);

/* ---------------------------------------------------------------------------------------------
 * Handlers
 * ------------------------------------------------------------------------------------------ */

struct pawl_checkpointing; /* pawl/checkpoint.h */
struct pawl_trigger;       /* pawl/checkpoint.h */
struct pawl_event_ctx;     /* opaque; valid only during handle() */
struct pawl_txn;           /* a batch transaction; see the token store below */

/*
 * A handler. The processor borrows the struct and everything it points to until
 * pawl_processor_free (copy nothing; keep it alive). handle() runs on a worker thread, for one
 * segment's events in index order; it returns 0, or a negative code that fails the batch: the
 * batch transaction rolls back, the segment is released and re-claimed after a back-off, and
 * the events from the last stored token on are redelivered. With a dead-letter policy
 * (pawl_processor_opts.dead_letter_attempts) an event that keeps failing is parked instead:
 * PAWL_EPOISON says the event can never be handled (it is parked at once, without a back-off);
 * any other code is retryable (the event is parked once it has failed that many attempts).
 * Either way the batch is rolled back first; see "Dead letters" below. A handler that blocks in a
 * way of its own (a network call, a lock) should call pawl_pool_will_block() first, so that other
 * segments' steps queued on its worker are handed to an idle one (pawl/runtime.h).
 *
 * ckpt == NULL makes an ordinary handler; otherwise the handler is a checkpointing unit (see
 * pawl/checkpoint.h) and the processor's checkpoint mode follows: no unit -> the token is
 * stored with every batch whose handlers queued a statement (a batch that queued none writes
 * the token only when due: after read_batch of the segment's events or claim_poll_ms, and at
 * release, so a crash redelivers at most that much); every handler a unit -> fully deferred; a
 * mix -> auto (every batch asks the units; the agreed token is stored by the same rule). The
 * processor
 * waits for the units' futures without a time-out: a future that never completes stalls its
 * segment only, and keeps that batch's transaction open. (The PostgreSQL store buffers a
 * batch's statements and sends them with the token write at commit, so an open batch holds no
 * server transaction, row lock or connection while it waits.)
 */
struct pawl_handler {
    const char *name;
    void *self;
    int (*handle)(void *self, struct pawl_event_ctx *ctx);
    const struct pawl_checkpointing *ckpt;
};

/* The event being handled; borrowed, valid until handle() returns. */
PAWL_API const struct pawl_event *pawl_ctx_event(const struct pawl_event_ctx *ctx);
/* The segment the event was delivered in. */
PAWL_API struct pawl_segment pawl_ctx_segment(const struct pawl_event_ctx *ctx);
/*
 * Non-zero when this delivery is a replay: the segment's token was reset (pawl_processor_reset)
 * to a position below the highest token it ever stored, and this event lies at or below that
 * high-water mark. Redelivery after a failure is not a replay.
 */
PAWL_API int pawl_ctx_is_replay(const struct pawl_event_ctx *ctx);
/* The batch transaction, for the handler's own statements; borrowed for the call. NULL on a
 * subscribing processor called without a transaction. */
PAWL_API struct pawl_txn *pawl_ctx_txn(struct pawl_event_ctx *ctx);
/* The segment's checkpoint trigger; NULL on a subscribing processor and on a processor without
 * checkpointing units. Borrowed: valid while the segment stays claimed (see pawl/checkpoint.h
 * for its lifetime rules). */
PAWL_API struct pawl_trigger *pawl_ctx_trigger(struct pawl_event_ctx *ctx);
/* The handler's position within the batch (0-based) and the batch's size. */
PAWL_API size_t pawl_ctx_batch_pos(const struct pawl_event_ctx *ctx);

/*
 * Say why handling failed, for the dead letter the event may become: copies `why` (at most
 * 1000 bytes kept; NULL clears it) and returns `code` (PAWL_EHANDLER when code >= 0), so a
 * handler writes `return pawl_ctx_error(ctx, PAWL_EPOISON, "payload is not JSON");`. Without
 * it a letter's error is the handler's name and pawl_strerror(code).
 */
PAWL_API int pawl_ctx_error(struct pawl_event_ctx *ctx, int code, const char *why);
/* Non-zero while the event is a dead letter being retried (pawl_dead_letters_retry). */
PAWL_API int pawl_ctx_is_dead_letter(const struct pawl_event_ctx *ctx);

/*
 * Queue a statement into the batch transaction. values are text parameters ($1..$n; a NULL
 * element is SQL NULL); sql and values are copied. The statements are sent when the batch
 * commits, in order, after the claim check and token write and in the same transaction: an
 * error in any of them fails the batch (the token is not stored, every handler's writes roll
 * back). So a handler cannot read a statement's result, and must not send transaction control
 * (BEGIN, COMMIT, SAVEPOINT). In fully-deferred checkpoint mode a batch may commit its
 * statements without moving the token, so they run again when those events are redelivered
 * (pawl/checkpoint.h): make them idempotent there. The PostgreSQL store prepares each distinct
 * statement text once per connection (up to 96), so reuse a fixed text with parameters rather than
 * building SQL per event. Returns 0, or PAWL_EINVAL / PAWL_ENOMEM / PAWL_ENOTSUP (a store without
 * SQL, or a subscriber without a transaction).
 */
PAWL_API int pawl_txn_exec(struct pawl_txn *txn, const char *sql, int nparams,
                           const char *const *values);

/* ---------------------------------------------------------------------------------------------
 * Event source: where a processor reads the log. Implementations: the PostgreSQL log
 * (pawl_source_pg_new), and an in-memory log for tests and embedders (pawl_source_mem_new).
 * ------------------------------------------------------------------------------------------ */

/*
 * A batch of events with the memory they point into. Caller-owned (initialise with
 * pawl_event_batch_init, release with _fini); a source fills it and the batch reuses its
 * buffers, so reading allocates nothing once warm. Pointers inside events[] stay valid until the
 * next clear or push.
 */
struct pawl_event_batch {
    struct pawl_event *events;
    size_t n;
    size_t cap;
    char *_arena; /* private: copies of strings and payloads */
    size_t _used;
    size_t _cap;
};
PAWL_API void pawl_event_batch_init(struct pawl_event_batch *b);
PAWL_API void pawl_event_batch_fini(struct pawl_event_batch *b);
PAWL_API void pawl_event_batch_clear(struct pawl_event_batch *b);
/* Append a copy of e (its strings and payload are copied into the batch). */
PAWL_API int pawl_event_batch_push(struct pawl_event_batch *b, const struct pawl_event *e);

struct pawl_source;
struct pawl_filter; /* pawl/log.h */
struct pawl_source_ops {
    /*
     * Append to out up to max events with index > after, in index order (the log's forward-only
     * guarantee: no event with an index below one returned may appear later). Sets *last_seen to
     * the highest index examined (at least after; it may exceed the last event returned when
     * the source filters). 0 events is not an error.
     */
    int (*read)(struct pawl_source *s, int64_t after, size_t max, struct pawl_event_batch *out,
                int64_t *last_seen);
    /* Block until an event with index > after may exist (0; spurious returns are allowed) or
     * timeout_ms passes (PAWL_ETIMEDOUT). The processor waits in short slices, so a source
     * needs no cancellation. */
    int (*wait)(struct pawl_source *s, int64_t after, int64_t timeout_ms);
    /* The highest final index (0 when empty). */
    int (*head)(struct pawl_source *s, int64_t *index);
    /* The token just before the first event appended at or after time_us (µs since epoch). */
    int (*index_at)(struct pawl_source *s, int64_t time_us, int64_t *token);
    /* Text of the last failure; never NULL. */
    const char *(*errmsg)(struct pawl_source *s);
    void (*free)(struct pawl_source *s);
    /* Optional: the source's filter as pawl_filter_json gives it (pawl/log.h), or NULL (or no
     * function) when it reads every event. A processor records it with its definition. */
    const char *(*filter)(struct pawl_source *s);
};
/* Implementations embed this as their first member. */
struct pawl_source {
    const struct pawl_source_ops *ops;
};
/* Frees the source through its ops; NULL is a no-op. */
PAWL_API void pawl_source_free(struct pawl_source *s);
/* The text of the last failure on s ("" when none, or s NULL), copied into buf; returns buf. */
PAWL_API const char *pawl_source_errmsg(struct pawl_source *s, char *buf, size_t len);

/*
 * The in-memory log: appends get the next index (1, 2, ...) at once. Thread-safe.
 * pawl_source_mem_append copies the events (index is assigned; appended_at_us is set when 0).
 * pawl_source_mem_new starts one timer thread (waits' deadlines); it returns 0, PAWL_ENOMEM,
 * or why that thread could not start.
 */
PAWL_API int pawl_source_mem_new(struct pawl_source **out);
PAWL_API int pawl_source_mem_append(struct pawl_source *s, const struct pawl_event *events,
                                    size_t n);

/*
 * The PostgreSQL log at dsn (the schema must be installed). Reads run over their own
 * connections, wait() listens for the log's notifications. The dsn is copied.
 */
PAWL_API int pawl_source_pg_new(struct pawl_source **out, const char *dsn);
/*
 * Read only the events f selects (pawl/log.h, struct pawl_filter; evaluated in the server):
 * copies f, before the source is shared or read. A processor over the source handles only
 * matching events, and its tokens move past the rest. Returns 0, PAWL_EINVAL (a filter
 * pawl_filter_check refuses; the reason in pawl_source_errmsg), PAWL_ENOMEM, PAWL_ENOTSUP (not
 * a PostgreSQL source).
 */
PAWL_API int pawl_source_pg_set_filter(struct pawl_source *s, const struct pawl_filter *f);
/*
 * An event source over an open log store (pawl/log.h), borrowed: it must outlive the source.
 * dsn (copied; may be NULL) serves the administration queries of reset (END by the database's
 * head, TIME); without it, END uses the store's last known index and TIME is PAWL_ENOTSUP.
 */
struct pawl_store;
PAWL_API int pawl_source_pg_from_store(struct pawl_source **out, struct pawl_store *store,
                                       const char *dsn);

/* ---------------------------------------------------------------------------------------------
 * Token store: the claims and positions of every processor's segments. Implementations: the
 * PostgreSQL table (pawl_tokens_pg_new) and an in-memory store (pawl_tokens_mem_new).
 * ------------------------------------------------------------------------------------------ */

#define PAWL_NAME_MAX 63  /* processor name: 1..63 bytes of [A-Za-z0-9_.:-] */
#define PAWL_OWNER_MAX 63 /* configured node id (--node-id): 1..63 of [A-Za-z0-9_.:-] */
/* hex digits of the nonce a processor adds to its node id when it is created */
#define PAWL_NONCE_LEN 12
/* an owner in the token store: "<node id>/<nonce>" for a processor's claims (other owners,
 * such as an administrator's, are any text up to this long) */
#define PAWL_INSTANCE_MAX (PAWL_OWNER_MAX + 1 + PAWL_NONCE_LEN)

/* One segment row as the store holds it. */
struct pawl_segment_status {
    struct pawl_segment seg;
    int64_t token;                     /* events <= token are handled */
    char owner[PAWL_INSTANCE_MAX + 1]; /* "" when unowned */
    int64_t claim_age_ms;              /* since the claim was taken or last extended; -1 unowned */
    int mode;                          /* enum pawl_ckpt_mode (pawl/checkpoint.h) written by the
                                          owner at claim time; -1 when unowned */
    int64_t high_water;                /* highest token ever stored (replay detection) */
    /*
     * A merge in progress: events of the sub-segment merge_seg with index <= merge_token were
     * already handled by the faster half and are skipped. has_merge clears itself once the
     * token reaches merge_token.
     */
    int has_merge;
    struct pawl_segment merge_seg;
    int64_t merge_token;
};

struct pawl_tokens;

/*
 * A dead letter: a parked event (see "Dead letters" below). In a store's answer every pointer
 * points into the same allocation as the array (free it with pawl_dead_letters_free); handed
 * to a store's park(), the pointers are the caller's and are read during the call only.
 */
struct pawl_dead_letter {
    struct pawl_event ev;    /* the event, as the log had it */
    struct pawl_segment seg; /* the segment it was parked in */
    uint32_t attempts;       /* handler attempts so far (a failed retry counts one) */
    int64_t behind;          /* 0: it failed itself; else the index of the stream's letter it
                                was parked behind (the stream was parked already) */
    const char *first_error; /* "" when none */
    const char *last_error;  /* "" when none */
    int64_t first_failed_us; /* µs since the epoch; 0 when unknown */
    int64_t parked_us;       /* when it was parked (store answers only) */
    int retry_requested;     /* a retry is pending (store answers only) */
};

/* A parked stream: one row of pawl_dead_letters_streams. */
struct pawl_dead_stream {
    char stream_id[PAWL_STREAM_ID_MAX + 1];
    uint64_t letters;
    int64_t first_index; /* its first letter (the event that failed) */
    int64_t last_index;
    int64_t oldest_age_ms; /* since the first letter was parked */
    uint32_t attempts;     /* of the first letter */
    int retry_requested;
    char last_error[256]; /* of the first letter, cut to fit */
};

struct pawl_txn_ops {
    int (*exec)(struct pawl_txn *t, const char *sql, int nparams, const char *const *values);
    /* Queue the conditional token write: token = max(token, new), only if owner is still the
     * transaction's owner; otherwise commit fails with PAWL_ECLAIM. */
    int (*store)(struct pawl_txn *t, int64_t token);
    /* Commit; the txn is consumed whatever the result. PAWL_ECLAIM (claim lost), PAWL_ESQL
     * (a statement failed), PAWL_ECONN, PAWL_EINDOUBT. */
    int (*commit)(struct pawl_txn *t);
    /* Roll back; the txn is consumed. */
    void (*rollback)(struct pawl_txn *t);
    /* Optional (dead letters; NULL in a store without them). Queue parking a letter (a
     * redelivered one that is parked already is left alone), or queue un-parking the stream's
     * letters up to up_to (a retry that succeeded). Both commit with the transaction. */
    int (*park)(struct pawl_txn *t, const struct pawl_dead_letter *l);
    int (*unpark)(struct pawl_txn *t, const char *stream_id, int64_t up_to);
};
struct pawl_txn {
    const struct pawl_txn_ops *ops;
};

struct pawl_tokens_ops {
    /* Create segments 0..n-1 of mask n-1 at token if the processor has no rows yet. Concurrent
     * initialisers agree: exactly one set is created, and the others return 0. */
    int (*init)(struct pawl_tokens *t, const char *proc, uint32_t n, int64_t token);
    /* Every row of proc, ordered by mask then id; *rows is allocated with the library's
     * allocator (free with pawl_tokens_rows_free). */
    int (*list)(struct pawl_tokens *t, const char *proc, struct pawl_segment_status **rows,
                size_t *n);
    /*
     * Claim the segment for owner if it is unowned, already owner's, or its claim is older than
     * timeout_ms. On success fills *row (when non-NULL). PAWL_EBUSY: held by another node;
     * PAWL_ENOTFOUND: no such segment (split or merged away).
     */
    int (*claim)(struct pawl_tokens *t, const char *proc, uint32_t seg_id, const char *owner,
                 int64_t timeout_ms, int mode, struct pawl_segment_status *row);
    /* Refresh owner's claim time on the given segments; held[i] (optional) says whether it is
     * still owner's. */
    int (*extend)(struct pawl_tokens *t, const char *proc, const char *owner,
                  const uint32_t *seg_ids, size_t n, unsigned char *held);
    /*
     * Node liveness, for sharing segments fairly: extend() also records that owner is alive
     * (even with n = 0). live() counts the nodes of proc seen within timeout_ms (me included)
     * and gives me's 0-based rank among them in byte order of their ids. leave() forgets me.
     */
    int (*live)(struct pawl_tokens *t, const char *proc, const char *me, int64_t timeout_ms,
                uint32_t *count, uint32_t *rank);
    int (*leave)(struct pawl_tokens *t, const char *proc, const char *me);
    /* Clear the claim if owner holds it (no-op otherwise). */
    int (*release)(struct pawl_tokens *t, const char *proc, uint32_t seg_id, const char *owner);
    /* Begin a batch transaction on seg_id for owner. */
    int (*begin)(struct pawl_tokens *t, const char *proc, uint32_t seg_id, const char *owner,
                 struct pawl_txn **txn);
    /* Split / merge (seg_id with its sibling): allowed when the rows involved are unowned or
     * owned by owner (NULL: unowned only); PAWL_EBUSY otherwise, with the owners in errmsg.
     * Merge refuses (PAWL_EBUSY) while either half still has a merge in progress. */
    int (*split)(struct pawl_tokens *t, const char *proc, uint32_t seg_id, const char *owner);
    int (*merge)(struct pawl_tokens *t, const char *proc, uint32_t seg_id, const char *owner);
    /* Set every segment's token to token (high_water keeps the maximum); refused with
     * PAWL_EBUSY while any segment is claimed (errmsg names the owners). */
    int (*reset)(struct pawl_tokens *t, const char *proc, int64_t token);
    const char *(*errmsg)(struct pawl_tokens *t);
    void (*free)(struct pawl_tokens *t);

    /*
     * Optional (dead letters; all NULL in a store without them, which a processor with a
     * dead-letter policy refuses with PAWL_ENOTSUP). Rows are allocated as one block (free
     * with pawl_dead_letters_free).
     *   segment: the parked streams of seg (stream id in stream_id, first_index, letters,
     *            retry_requested; other fields zero).
     *   show:    stream's letters in index order (stream NULL: every letter of proc).
     *   list:    every parked stream of proc.
     *   retry:   ask for a retry of stream; *n = the letters it covers.
     *   drop:    delete stream's letters up to up_to (INT64_MAX: all); *n = how many.
     *   retry_failed: a node's retry failed on letter index: count an attempt, keep why,
     *            clear the request (the stream stays parked). Checks owner's claim.
     */
    int (*dl_segment)(struct pawl_tokens *t, const char *proc, struct pawl_segment seg,
                      struct pawl_dead_stream **rows, size_t *n);
    int (*dl_show)(struct pawl_tokens *t, const char *proc, const char *stream,
                   struct pawl_dead_letter **rows, size_t *n);
    int (*dl_list)(struct pawl_tokens *t, const char *proc, struct pawl_dead_stream **rows,
                   size_t *n);
    int (*dl_retry)(struct pawl_tokens *t, const char *proc, const char *stream, int64_t *n);
    int (*dl_drop)(struct pawl_tokens *t, const char *proc, const char *stream, int64_t up_to,
                   int64_t *n);
    int (*dl_retry_failed)(struct pawl_tokens *t, const char *proc, uint32_t seg_id,
                           const char *owner, const char *stream, int64_t index, const char *why);

    /*
     * Optional (NULL: the store keeps no filters, and a processor with a filtered source
     * refuses it with PAWL_ENOTSUP). Record filter_json (pawl_filter_json's form, "{}" for
     * none) as proc's filter if proc has none recorded yet (a processor whose segments exist
     * without one was created unfiltered: "{}"), and copy the recorded one into recorded.
     * Returns 0 when the recorded filter is filter_json, PAWL_EFILTER when it is another.
     */
    int (*filter)(struct pawl_tokens *t, const char *proc, const char *filter_json, char *recorded,
                  size_t len);
    /* Optional: change proc's filter and set every segment's token to token at once (as
     * reset; refused with PAWL_EBUSY while any segment is claimed). */
    int (*filter_reset)(struct pawl_tokens *t, const char *proc, const char *filter_json,
                        int64_t token);
};
/* Implementations embed this as their first member. */
struct pawl_tokens {
    const struct pawl_tokens_ops *ops;
};
PAWL_API void pawl_tokens_free(struct pawl_tokens *t); /* NULL is a no-op */
/* The text of the last failure on t ("" when none, or t NULL), copied into buf; returns buf. */
PAWL_API const char *pawl_tokens_errmsg(struct pawl_tokens *t, char *buf, size_t len);
PAWL_API void pawl_tokens_rows_free(struct pawl_segment_status *rows);

/*
 * The in-memory token store. Its transactions apply the handlers' statements through an
 * optional exec hook called at commit, under the store's lock, before the token is written
 * (return non-zero to fail the commit, which then applies nothing else); without a hook,
 * pawl_txn_exec returns PAWL_ENOTSUP.
 */
typedef int (*pawl_tokens_mem_exec_fn)(void *ud, const char *sql, int nparams,
                                       const char *const *values);
PAWL_API int pawl_tokens_mem_new(struct pawl_tokens **out);
PAWL_API void pawl_tokens_mem_set_exec(struct pawl_tokens *t, pawl_tokens_mem_exec_fn fn, void *ud);

/*
 * The PostgreSQL token store (table pawl.tokens; the schema must be installed: PAWL_ESCHEMA
 * otherwise). One connection serves claims, extensions and administration, so claims never
 * wait behind batches; `connections` (1..64; 2 for pawl_tokens_pg_new) pipelined connections
 * carry the batch transactions of every work package. dsn is copied.
 */
PAWL_API int pawl_tokens_pg_new(struct pawl_tokens **out, const char *dsn);
PAWL_API int pawl_tokens_pg_new_ex(struct pawl_tokens **out, const char *dsn, int connections);

/* ---------------------------------------------------------------------------------------------
 * The processor
 * ------------------------------------------------------------------------------------------ */

/*
 * Options. Call pawl_processor_opts_defaults first, then set what you need; pawl_processor_new
 * checks them (PAWL_ERANGE, PAWL_EINVAL for a bad name). Each field's default, range and flag
 * are declared once, in PAWL_PROCESSOR_TUNABLES below; the comments here say what a field means.
 */
struct pawl_processor_opts {
    const char *name;                  /* required; [A-Za-z0-9_.:-]; copied */
    const char *node_id;               /* this node's id; NULL: "<host>:<pid>". The owner in
                                          the token store is "<node id>/<nonce>", the nonce
                                          (PAWL_NONCE_LEN random hex digits) new for every
                                          processor object: processes sharing one id are
                                          distinct nodes, each with its own fair share, and
                                          never own a claim together */
    uint32_t segments;                 /* initial segments, a power of two. Used only when the
                                          processor has no segments yet; later changes go
                                          through split and merge */
    uint32_t batch_size;               /* events per batch transaction */
    uint32_t max_segments_per_node;    /* 0: no limit */
    uint32_t threads;                  /* segment workers: threads of the processor's
                                          work-stealing pool; 0: one per online CPU */
    uint32_t claim_timeout_ms;         /* a claim older than this may be taken */
    uint32_t claim_extend_interval_ms; /* 0: claim_timeout_ms / 3; else at most half of it */
    uint32_t claim_poll_ms;            /* claim / rebalance cycle */
    uint32_t backoff_min_ms;           /* first re-claim delay after a failure */
    uint32_t backoff_max_ms;           /* doubling stops here; >= backoff_min_ms */
    uint32_t read_ahead;               /* events buffered per segment */
    uint64_t read_ahead_bytes;         /* and at most this much of their data (ids, payloads,
                                          metadata) */
    uint32_t read_batch;               /* events per source read */
    uint32_t idle_wait_ms;             /* longest source wait before re-checking */
    int64_t initial_token;             /* token of newly initialised segments (0: the start) */
    int timer_backend;                 /* enum pawl_timer_backend of the timers that bound
                                          checkpoint futures */
    int require_io_uring;              /* nonzero: fail instead of falling back to epoll */
    uint32_t dead_letter_attempts;     /* 0: no dead letters, a failing event is retried
                                          forever; else park an event once it has failed this
                                          many attempts (PAWL_EPOISON parks at once). Needs a
                                          store with dead letters (PostgreSQL) */
};
/*
 * Every tunable of a processor, one line each: the only place its default, its range and its
 * flag are declared (the format is PAWL_STORE_TUNABLES's, pawl/log.h). pawl_processor_opts_defaults
 * applies the defaults and pawl_processor_new checks each numeric field against [min, max];
 * the rules no single range states are checked besides: the name and the node id are 1..max
 * characters of [A-Za-z0-9_.:-], segments is a power of two, claim_extend_interval_ms is 0 or
 * 10..claim_timeout_ms / 2, backoff_max_ms is at least backoff_min_ms.
 */
#define PAWL_PROCESSOR_TUNABLES(X)                                                                 \
    X(STRING, name, "processor", NULL, 0, PAWL_NAME_MAX, NULL,                                     \
      "Processor name (1-63 of A-Z a-z 0-9 _ . : -)", NULL)                                        \
    X(STRING, node_id, "node-id", NULL, 0, PAWL_OWNER_MAX, NULL,                                   \
      "This node's id; claims are owned as <id>/<random nonce per process>; empty: "               \
      "host:pid",                                                                                  \
      NULL)                                                                                        \
    X(INT, segments, "segments", 16, 1, 65536, NULL,                                               \
      "Initial segments of a new processor (a power of two)", NULL)                                \
    X(INT, batch_size, "batch-size", 100, 1, 100000, "events", "Events per batch transaction",     \
      NULL)                                                                                        \
    X(INT, max_segments_per_node, "max-segments-per-node", 0, 0, 65536, NULL,                      \
      "Most segments this node claims; 0: no limit", NULL)                                         \
    X(INT, threads, "threads", 0, 0, 256, NULL,                                                    \
      "Segment workers: threads of the processor's work-stealing pool; 0: one per online "         \
      "CPU. Handlers that block on I/O want more",                                                 \
      NULL)                                                                                        \
    X(ENUM, timer_backend, "timer-backend", PAWL_TIMER_BACKEND_AUTO, 0, 2, NULL,                   \
      "Timers that bound checkpoint futures: io_uring, or timerfd + epoll where io_uring "         \
      "is refused (auto tries io_uring first and logs a refusal at info, the choice at debug)",    \
      PAWL_CHOICES("auto", "io_uring", "epoll"))                                                   \
    X(BOOL, require_io_uring, "require-io-uring", 0, 0, 1, NULL,                                   \
      "Fail instead of falling back to timerfd + epoll when io_uring is refused", NULL)            \
    X(DURATION, claim_timeout_ms, "claim-timeout", 10000, 100, 3600000, NULL,                      \
      "A claim not extended for this long may be taken by another node; status marks such "        \
      "claims expired, and reset, split and merge release them",                                   \
      NULL)                                                                                        \
    X(DURATION, claim_extend_interval_ms, "claim-extend-interval", 0, 0, 1800000, NULL,            \
      "How often claims are extended; 0: claim-timeout / 3", NULL)                                 \
    X(DURATION, claim_poll_ms, "claim-poll", 1000, 10, 600000, NULL,                               \
      "Period of the claim and rebalance cycle; also the longest a plain batch that queued "       \
      "no SQL leaves its token unwritten",                                                         \
      NULL)                                                                                        \
    X(DURATION, backoff_min_ms, "backoff-min", 1000, 1, 3600000, NULL,                             \
      "First re-claim delay after a segment failed", NULL)                                         \
    X(DURATION, backoff_max_ms, "backoff-max", 60000, 1, 3600000, NULL,                            \
      "Longest re-claim delay (the delay doubles up to it)", NULL)                                 \
    X(INT, dead_letter_attempts, "dead-letter-attempts", 0, 0, 1000, NULL,                         \
      "Park an event as a dead letter (with every later event of its stream) once it has "         \
      "failed this many attempts, or at once when a handler calls it poison; 0: retry it "         \
      "forever (pawl dead-letters works the parked streams)",                                      \
      NULL)                                                                                        \
    X(INT, read_ahead, "read-ahead", 1000, 1, 1000000, "events", "Events buffered per segment",    \
      NULL)                                                                                        \
    X(INT, read_ahead_bytes, "read-ahead-bytes", 16777216, 4096, 1099511627776, "bytes",           \
      "And at most this much event data (ids, payloads, metadata) buffered per segment", NULL)     \
    X(INT, read_batch, "read-batch", 1000, 1, 100000, "events",                                    \
      "Events per read from the log; also how many of a segment's events plain batches that "      \
      "queued no SQL may handle before its token is written",                                      \
      NULL)                                                                                        \
    X(DURATION, idle_wait_ms, "idle-wait", 1000, 10, 60000, NULL,                                  \
      "Longest wait for new events before re-checking", NULL)                                      \
    X(INT, initial_token, "initial-token", PAWL_TOKEN_START, 0, INT64_MAX, NULL,                   \
      "Token of a new processor's segments (0: from the start of the log)", NULL)
PAWL_API void pawl_processor_opts_defaults(struct pawl_processor_opts *o);

struct pawl_processor;

/*
 * Create a processor reading source and claiming in tokens (both borrowed: they must outlive
 * the processor; several processors may share them). handlers (n >= 1) is copied as an array,
 * but each handler's pointers are borrowed until pawl_processor_free. Initialises the
 * processor's segments in the store if it has none. Nothing runs until start.
 */
PAWL_API int pawl_processor_new(struct pawl_processor **out, const struct pawl_processor_opts *opts,
                                struct pawl_source *source, struct pawl_tokens *tokens,
                                const struct pawl_handler *handlers, size_t n);
/* Start the worker threads, the coordinator and the claim extender. PAWL_EALREADY if started. */
PAWL_API int pawl_processor_start(struct pawl_processor *p);
/*
 * Stop: every work package finishes its current batch, stores its progress (with checkpointing
 * units: reconciles their release reports first), and releases its claim; then the threads
 * exit. Blocks until done; there is no time-out, so a unit's future that never completes blocks
 * stop (bound such futures with pawl_checkpoint_or_timeout). A second stop is a no-op.
 */
PAWL_API int pawl_processor_stop(struct pawl_processor *p);
/* Stops if needed, then frees. NULL is a no-op. */
PAWL_API void pawl_processor_free(struct pawl_processor *p);

struct pawl_processor_stats {
    uint64_t events;          /* handled and committed */
    uint64_t batches;         /* committed */
    uint64_t batch_failures;  /* rolled back (handler error, lost claim, store error) */
    uint64_t claims;          /* segments claimed */
    uint64_t releases;        /* segments released */
    uint64_t claims_lost;     /* commits refused because another node took the claim */
    uint64_t source_errors;   /* failed reads */
    uint32_t segments_owned;  /* right now */
    int mode;                 /* enum pawl_ckpt_mode */
    uint64_t steps;           /* package steps run by the segment workers (the pool's tasks) */
    uint64_t steps_stolen;    /* of those, taken from another worker's deque */
    uint64_t steps_kept;      /* times a worker kept a burst of queued steps to itself rather
                               * than wake a parked worker for it (the pool's pass-on rule) */
    uint64_t letters_parked;  /* events this processor parked as dead letters (committed) */
    uint64_t streams_parked;  /* streams it parked (their first letter) */
    uint64_t letters_retried; /* letters handled by a retry that committed */
    uint32_t parked_streams;  /* right now, in the segments this node holds */
    uint64_t releases_failed; /* releases the token store did not confirm (a lost connection):
                               * those claims stay until they expire (claim_timeout_ms) */
};
PAWL_API void pawl_processor_stats(struct pawl_processor *p, struct pawl_processor_stats *out);

/*
 * What the segments this node holds are doing, one row each, for an operator: while
 * pawl_processor_stop runs, they are what the stop waits for. Fills out[0..max) and returns how
 * many segments the node holds (claimed and not yet released; more than max when out is short).
 * A snapshot: it may be out of date by the time it is read. Any thread except a handler.
 */
enum pawl_segment_doing {
    PAWL_SEG_IDLE = 0,     /* between steps: waiting for events, or for a worker */
    PAWL_SEG_READING = 1,  /* reading the log on its own (catching up after falling behind) */
    PAWL_SEG_HANDLING = 2, /* the handlers have a batch */
    PAWL_SEG_STORE = 3,    /* waiting for the token store: a batch's commit, a token write, the
                              claim's release, a read of its dead letters */
    PAWL_SEG_UNITS = 4,    /* waiting for the checkpointing units to confirm a checkpoint, a
                              retry or the release (pawl/checkpoint.h) */
};
struct pawl_segment_activity {
    struct pawl_segment seg;
    enum pawl_segment_doing doing;
    int64_t since_ns; /* pawl_now_ns() when it started doing it */
    int releasing;    /* releasing the segment, or asked to (a stop, rebalancing, split or
                         merge, a failed batch) */
};
PAWL_API size_t pawl_processor_activity(struct pawl_processor *p, struct pawl_segment_activity *out,
                                        size_t max);

/* This node's owner id in the store, "<node id>/<nonce>" (borrowed, valid until free). */
PAWL_API const char *pawl_processor_node_id(const struct pawl_processor *p);

/*
 * Split or merge a segment of a running (or stopped) processor: if this node holds the
 * segment(s), their work packages store their progress and release first; the store operation
 * then runs as this node, and the new segment(s) are claimed again by the normal claim cycle.
 * PAWL_EBUSY when another node holds a segment involved (retry, or run it there).
 */
PAWL_API int pawl_processor_split(struct pawl_processor *p, uint32_t seg_id);
PAWL_API int pawl_processor_merge(struct pawl_processor *p, uint32_t seg_id);

/* ---------------------------------------------------------------------------------------------
 * Administration (the tool's status / reset / split / merge). Work on a stopped or running
 * processor through the store alone.
 * ------------------------------------------------------------------------------------------ */

enum pawl_reset_kind {
    PAWL_RESET_START = 0, /* token 0: replay everything */
    PAWL_RESET_END = 1,   /* the log's head: skip everything so far */
    PAWL_RESET_INDEX = 2, /* token = value (events > value are delivered) */
    PAWL_RESET_TIME = 3,  /* value = µs since epoch: events appended at or after it */
};
/*
 * Move every segment of proc to the target. Refused with PAWL_EBUSY while any segment is
 * claimed (pawl_tokens errmsg names the owners). source is needed for END and TIME (NULL
 * otherwise allowed). *token_out (optional) receives the token set.
 */
PAWL_API int pawl_processor_reset(struct pawl_tokens *tokens, struct pawl_source *source,
                                  const char *proc, enum pawl_reset_kind kind, int64_t value,
                                  int64_t *token_out);

/* ---------------------------------------------------------------------------------------------
 * Dead letters (schema 8). With pawl_processor_opts.dead_letter_attempts > 0, an event whose
 * handler returned PAWL_EPOISON, or that failed that many attempts, is parked: copied into the
 * store's dead letters with its processor, segment, stream, index, attempts, first and last
 * error and time, in the batch transaction that moves the segment's token past it, so a crash
 * or a re-claim neither loses a letter nor parks one twice. The batch that failed is rolled
 * back and handled again at once with the event parked (a retryable error first goes through
 * the usual release and back-off for each attempt but the last). Every later event of the same
 * stream is parked behind it, in order, so handlers never see a stream out of order; the other
 * streams of the segment go on. Attempts are counted by the node (a node that crashes starts
 * counting again).
 *
 * A retry is a request stored with the letters: the node holding the stream's segment (within
 * claim_poll_ms, or at its next claim) hands the stream's letters to every handler in index
 * order (pawl_ctx_is_dead_letter says so) in one transaction that also un-parks them, before
 * any newer event of the stream. If that commits, the stream flows again from its next live
 * event: no gap, no duplicate. If a handler fails, the transaction rolls back, the failing
 * letter's attempt and error are recorded, and the stream stays parked. The token does not move
 * in a retry (the letters lie behind it); with checkpointing units the transaction commits only
 * once every unit has confirmed a checkpoint cycle at the segment's consumed position (which may
 * be the stored token itself), covering everything it was handed, the letters included, so a
 * letter is gone only when the units have it too. A unit that fails that cycle fails the retry
 * as a handler would (pawl_processor_event_failed below names the letter).
 * Dropping deletes letters for good; the stream's later events flow once the holding node
 * notices (within claim_poll_ms).
 *
 * A reset or replay does not touch dead letters: replayed events of a parked stream from its
 * first letter on are parked behind it again (already parked: left alone), earlier ones are
 * handled. Retry or drop the stream to let it flow.
 *
 * These calls run through the token store alone, on a running or stopped processor.
 * PAWL_ENOTSUP for a store without dead letters; PAWL_EPERM when the store's login is not
 * granted proc.
 * ------------------------------------------------------------------------------------------ */

/*
 * For a checkpointing unit (pawl/checkpoint.h) that hands events on and learns only later that
 * one of them failed (`pawl run --handler exec`): name the event before failing the checkpoint
 * future that covers it. Call it from any thread, then fail that future. When the checkpoint
 * fails and event `index` belongs to the batch being checkpointed, the failure is that event's
 * attempt under the dead-letter policy, as if a handler had returned `code` for it through
 * pawl_ctx_error(ctx, code, why) (PAWL_EPOISON: park it at once): past the policy the batch is
 * rolled back and handled again at once with the event parked (and its stream behind it); below
 * it, or without a policy, the batch's events before the event are handled again and committed,
 * and then the segment is released and tried again after the back-off, from the event on. Either
 * way the units see the batch's events before `index` again in the same claim: the unit has made
 * them durable, so it skips them (the exec handler does). A retry of dead letters whose
 * checkpoint fails records the attempt on letter `index`. For an event outside the batch the
 * checkpoint failure is an ordinary one. code: PAWL_EPOISON or any other (retryable); why is
 * copied (at most 511 bytes), NULL is "". Returns 0, PAWL_EINVAL, or PAWL_ENOTFOUND when this
 * node does not hold seg.
 */
PAWL_API int pawl_processor_event_failed(struct pawl_processor *p, struct pawl_segment seg,
                                         int64_t index, int code, const char *why);

/* Every parked stream of proc, oldest first. *rows: free with pawl_dead_letters_free. */
PAWL_API int pawl_dead_letters_streams(struct pawl_tokens *tokens, const char *proc,
                                       struct pawl_dead_stream **rows, size_t *n);
/* The letters of stream (NULL: all of proc) in index order. *rows: pawl_dead_letters_free. */
PAWL_API int pawl_dead_letters_show(struct pawl_tokens *tokens, const char *proc,
                                    const char *stream, struct pawl_dead_letter **rows, size_t *n);
/* Ask for a retry of stream; *letters (optional) = how many it covers (0: none parked). */
PAWL_API int pawl_dead_letters_retry(struct pawl_tokens *tokens, const char *proc,
                                     const char *stream, int64_t *letters);
/* Drop stream's letters with index <= up_to (INT64_MAX: all); *dropped (optional). */
PAWL_API int pawl_dead_letters_drop(struct pawl_tokens *tokens, const char *proc,
                                    const char *stream, int64_t up_to, int64_t *dropped);
/* Free rows returned above; NULL is a no-op. */
PAWL_API void pawl_dead_letters_free(void *rows);

/* ---------------------------------------------------------------------------------------------
 * Subscribing processor: handlers run in the appending thread, right after (or inside) the
 * append's transaction. No segments, no tokens, no checkpoint callbacks, no trigger.
 * ------------------------------------------------------------------------------------------ */
struct pawl_subscriber;
/* handlers are borrowed as for pawl_processor_new. */
PAWL_API int pawl_subscriber_new(struct pawl_subscriber **out, const struct pawl_handler *handlers,
                                 size_t n);
PAWL_API void pawl_subscriber_free(struct pawl_subscriber *s);
/*
 * Hand events to every handler in order, on the calling thread. txn is the append's
 * transaction when called inside it (handlers may queue statements), or NULL after commit.
 * Stops at the first handler error and returns it.
 */
PAWL_API int pawl_subscriber_publish(struct pawl_subscriber *s, const struct pawl_event *events,
                                     size_t n, struct pawl_txn *txn);

#ifdef __cplusplus
}
#endif
#endif
