/*
 * standby.h — reading events from a streaming standby (pawl_store_opts.read_dsn): the read
 * connections, where each read goes (the standby, or the primary in its stead), what a reader
 * does when the standby is behind, unreachable or promoted, and the optional poller that wakes
 * followers from the standby's highest index. Private to store/: the log store owns one
 * (store/log/store.c) and its reader (store/log/reader.c) asks it before and after each read;
 * every function is thread-safe.
 *
 * Why reading from a standby keeps the log's guarantees is argued in docs/design.md ("Reading
 * from standbys"): a run row visible on a standby implies every event it maps is visible there,
 * and runs become visible there in index order, so a standby's reads are a prefix of the
 * primary's log that only grows while the server stays in recovery. Each read therefore also
 * checks, after the read in the same request, that the server is still in recovery.
 */
#ifndef PAWL_STORE_STANDBY_H
#define PAWL_STORE_STANDBY_H

#include "pgconn.h"

#include <stddef.h>
#include <stdint.h>

struct pawl_store_opts;
struct pawl_standby;

/* Where a read goes. */
enum { PAWL_SB_ROUTE_PRIMARY = 0, PAWL_SB_STANDBY = 1 };

/* What came of a read on the standby. */
enum pawl_sb_outcome {
    PAWL_SB_GOT,         /* events, or nothing while the standby is as far as anyone knows */
    PAWL_SB_BEHIND,      /* nothing, though the primary announced events after the position */
    PAWL_SB_LOST,        /* no connection (down, restarting), or a read cut short by it */
    PAWL_SB_NOT_STANDBY, /* the server is not in recovery: its reads are not trusted */
};

/* What the reader does next. */
enum pawl_sb_action {
    PAWL_SB_USE,     /* return the result */
    PAWL_SB_PRIMARY, /* read from the primary now */
    PAWL_SB_WAIT,    /* sleep *wait_ns, then report nothing read (the caller reads again) */
    PAWL_SB_OUTAGE,  /* handle as a lost connection (retried until read_retry_timeout_ms) */
};

/* The check run after each read, in the same request: whether the server is still in
 * recovery and its replay delay. Filled by its statement's result. */
struct pawl_sb_check {
    int ok;                   /* the check's row arrived */
    int in_recovery;          /* 1: still a standby */
    double delay_ms;          /* replay delay, 0 when everything received is replayed; -1 unknown */
    struct pawl_standby *_sb; /* private */
};

/*
 * Open the read pool on o->read_dsn (connections: o->connections) and, with PAWL_READ_WAKE_POLL,
 * the poller, which calls raise(ud, index) on its own thread with every higher index the
 * standby reports. An unreachable standby is not an error (logged; reads fall back or wait as
 * configured); a read_dsn that does not parse is (PAWL_EINVAL, the reason in err). timers (the
 * store's; NULL falls back to plain timed waits) time the poller's waits and outlive sb.
 */
struct pawl_timers;
int pawl__standby_new(struct pawl_standby **out, const char *primary_dsn,
                      const struct pawl_store_opts *o, struct pawl_timers *timers,
                      void (*raise)(void *ud, int64_t index), void *ud, char *err, size_t errlen);
/* Stop the poller, close the pool. NULL is a no-op. */
void pawl__standby_free(struct pawl_standby *sb);

/* The read pool and its prepared read statement (store/log/reader.c's, prepared by the caller). */
struct pawl_pgpool *pawl__standby_pool(struct pawl_standby *sb);

/* The check statement to send after the read in the same request; out receives its result. */
void pawl__standby_check_stmt(struct pawl_standby *sb, struct pawl_pgstmt *st,
                              struct pawl_sb_check *out);

/* Where the next read goes (PAWL_SB_STANDBY or PAWL_SB_PRIMARY). */
int pawl__standby_route(struct pawl_standby *sb);

/*
 * Report what a read on the standby gave, after `after` with `known` the highest index
 * announced (by the primary's runs or notifications); returns what to do. For PAWL_SB_WAIT,
 * *wait_ns is the back-off (1 ms doubling to read_poll_max_ms while the episode lasts).
 * Logs the start and the end of each episode once.
 */
enum pawl_sb_action pawl__standby_outcome(struct pawl_standby *sb, enum pawl_sb_outcome what,
                                          int64_t after, int64_t known, int64_t *wait_ns);

/* A read went to the primary in the standby's stead (statistics). */
void pawl__standby_note_primary_read(struct pawl_standby *sb);

/* Statistics (see struct pawl_store_stats). */
void pawl__standby_stats(struct pawl_standby *sb, int64_t *reads, int64_t *fallback_reads,
                         int64_t *episodes, int *fallback_active, double *replay_delay_ms);

#endif
