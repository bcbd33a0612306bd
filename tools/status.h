/*
 * status.h — what `pawl status` shows (in the spirit of `kafka-consumer-groups --describe`), and
 * the parsing of reset targets. Independent of the tool's main, so tests drive it with the
 * in-memory token store and log.
 *
 * Lag: for every segment, the events after its token that belong to it (stream hash & mask ==
 * id), counted by one scan of the log from the lowest token to the head. The scan stops after
 * scan_limit events; segments it could not finish show head - token instead, an upper bound,
 * marked as not exact. Lag in seconds is the age of the segment's oldest unhandled event (0 when
 * caught up). Used from one thread.
 */
#ifndef PAWL_TOOL_STATUS_H
#define PAWL_TOOL_STATUS_H

#include "tool.h"

#include <stdint.h>
#include <stdio.h>

struct tool_seg_row {
    struct pawl_segment_status st;
    int64_t lag_events;
    int lag_exact;      /* 0: lag_events is head - token (an upper bound) */
    double lag_seconds; /* age of the oldest unhandled event; 0 when none */
    int64_t oldest_us;  /* its append time (0: none found) */
};

/* A session with a lock on the finalizer's gate that keeps the finalizer out, or waiting for
 * one. Text fields as the server reports them (raw: any bytes a client chose). */
struct tool_fin_session {
    int pid;       /* its backend's pid; 0: a prepared transaction (gid) */
    int granted;   /* 1: holds the lock, 0: waits for it */
    char mode[32]; /* as pg_locks names it: "ExclusiveLock" (the finalizer's), "RowShareLock"... */
    char user[64]; /* its login */
    char app[128]; /* its application_name */
    char gid[200]; /* a prepared transaction's gid (pid 0) */
    double held_s; /* seconds since its transaction began (granted), since it asked (waiting) or
                      since it was prepared; < 0: not visible to this login */
};

#define TOOL_FIN_SESSIONS_MAX 8

/* Who keeps the finalizer's lock (tool_status_finalizer_lock). */
struct tool_fin_lock {
    int known; /* 0: not asked (nothing shown), -1: the query failed (why), 1: below */
    int held;  /* 1: some session holds a lock on the gate that keeps the finalizer out */
    int n;     /* sessions in s: holders first, then waiters, the longest first */
    int more;  /* sessions left out past TOOL_FIN_SESSIONS_MAX */
    struct tool_fin_session s[TOOL_FIN_SESSIONS_MAX];
    char why[256]; /* when known == -1 */
};

struct tool_status {
    char proc[PAWL_NAME_MAX + 1];
    int64_t head;
    int64_t now_us;
    int64_t scanned;          /* events read to compute lag */
    int64_t claim_timeout_ms; /* claims at least this old are shown as expired (0: not shown) */
    size_t n;
    struct tool_seg_row *rows; /* owned */
    struct tool_fin_lock fin;  /* filled by tool_status_finalizer_lock; known 0 otherwise */
    const char *filter;        /* the processor's recorded filter as JSON (NULL or "{}": none;
                                  the caller's); the source given to tool_status_collect must
                                  read with it */
};

#define TOOL_STATUS_SCAN_LIMIT 1000000

/*
 * Gather the status of proc. PAWL_ENOTFOUND when the processor has no segments. On failure err
 * holds the store's or the log's message.
 */
int tool_status_collect(struct pawl_tokens *tokens, struct pawl_source *source, const char *proc,
                        int64_t scan_limit, struct tool_status *out, char *err, size_t errlen);
void tool_status_fini(struct tool_status *st);

/*
 * Ask the database at dsn, from pg_locks joined with pg_stat_activity, which sessions keep the
 * finalizer out of its gate: the finalizer takes an EXCLUSIVE lock (NOWAIT) on the gate table,
 * pawl_locks.finalizer (pawl.finalizer_gate before schema 14; whichever exists), so every session
 * that holds a lock on it in any mode but ACCESS SHARE keeps it out, and so does one waiting for
 * such a lock (a new request queues behind it). An advisory key proves nothing: any login can take
 * one. Fills *out (known 1 or -1 with why).
 */
void tool_status_finalizer_lock(const char *dsn, struct tool_fin_lock *out);
/*
 * The lines `pawl status` prints about it (tool_status_fin_lock_lines of them; line i into buf):
 * "finalizer lock: free", or per session "finalizer lock: held by pid N (user 'U', application
 * 'X', ExclusiveLock, for 12 s)" ("blocked by" for another mode that keeps the finalizer out,
 * "wanted by ... waiting 3 s" for a waiter, "a prepared transaction 'GID'" for pid 0), then
 * "finalizer lock: and N more sessions" when some were left out. U and X come out escaped (\n,
 * \', \xNN): each line stays one line.
 */
int tool_status_fin_lock_lines(const struct tool_fin_lock *f);
void tool_status_fin_lock_text(const struct tool_fin_lock *f, int i, char *buf, size_t len);
/* Whether r's claim has not been extended for st->claim_timeout_ms (0: never): its node stopped,
 * and any node may take the segment over. status notes it; reset, split and merge release it. */
int tool_status_claim_expired(const struct tool_status *st, const struct pawl_segment_status *r);

void tool_status_print_table(FILE *f, const struct tool_status *st);
int tool_status_print_json(FILE *f, const struct tool_status *st, int pretty);

/* Owners holding a live (not expired) claim on any segment, comma-separated, into out ("" when
 * none). */
void tool_status_owners(const struct tool_status *st, char *out, size_t outlen);

/*
 * A position (position.h) as the library's reset kinds: "start" (PAWL_RESET_START, token 0),
 * "end", an index, an RFC 3339 time, or a time ago ("-15m", "-1d"; now_us is "now"). An offset
 * (-N) is refused: it needs the log. `pawl reset` itself resolves positions with
 * tool_pos_resolve, so that start is the log's start after retention and -N works.
 */
int tool_parse_reset_target(const char *to, int64_t now_us, enum pawl_reset_kind *kind,
                            int64_t *value, char *err, size_t errlen);

#endif
