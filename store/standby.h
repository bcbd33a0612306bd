/*
 * standby.h — reading events from a streaming standby (pawl_store_opts.read_dsn). Private to
 * store/: the log store owns one (store/log/store.c opens and frees it) and its reader
 * (store/log/reader.c) consults it once before each read and once after.
 *
 * What the module owns: the standby's read pool and the check statement prepared on it; where
 * each read goes (the standby, or the primary in its stead); the episode a standby that is
 * behind, unreachable or promoted opens, with its fallback, back-off and log lines; the
 * standby's statistics; and, with PAWL_READ_WAKE_POLL, the poller thread that wakes followers
 * from the standby's highest index. The reader's part is the read itself and what it found.
 *
 * Threads. pawl__standby_new and pawl__standby_free run on the thread that opens and closes the
 * store. pawl__standby_plan and pawl__standby_settle run on a reader's thread (the caller of
 * pawl_read and its kin, never a pool's I/O thread), any number at once: the state they share
 * is atomics (see standby.c). A plan belongs to one read call on one thread. The check's result
 * is written into the plan on the standby pool's I/O thread, before that read's request
 * completes. pawl__standby_stats may run on any thread.
 *
 * Why reading from a standby keeps the log's guarantees is argued in docs/design.md ("Reading
 * from standbys"): a run row visible on a standby implies every event it maps is visible there,
 * and runs become visible there in index order, so a standby's reads are a prefix of the
 * primary's log that only grows while the server stays in recovery. Each read on the standby
 * therefore carries, after the read in the same request, a check that the server is still in
 * recovery.
 */
#ifndef PAWL_STORE_STANDBY_H
#define PAWL_STORE_STANDBY_H

#include "pgconn.h"

#include <stddef.h>
#include <stdint.h>

struct pawl_store_opts;
struct pawl_standby;

/* What came of a read, as the reader reports it to pawl__standby_settle. */
enum pawl_sb_outcome {
    PAWL_SB_GOT,         /* events, or nothing while the standby is as far as anyone knows */
    PAWL_SB_BEHIND,      /* nothing, though the primary announced events after the position */
    PAWL_SB_LOST,        /* no connection (down, restarting), or a read cut short by it */
    PAWL_SB_NOT_STANDBY, /* the check said the server is not in recovery: rows not used */
    PAWL_SB_FAILED,      /* an error of the read itself (SQL, broken rows): not the standby's */
};

/* What the reader does next. */
enum pawl_sb_action {
    PAWL_SB_USE,   /* go on with the read's result (a lost read: the store's outage path) */
    PAWL_SB_AGAIN, /* read again at once, where the plan now says: the primary */
    PAWL_SB_WAIT,  /* sleep *wait_ns, then report nothing read (the caller reads again) */
};

/*
 * Where one read goes, and what is sent with it. A read call's reads share one plan, zeroed
 * before the first: once a read falls back to the primary, the rest of the call reads there.
 * The plan must stay where it is from pawl__standby_plan until the read's request completes
 * (the check's result is written into it).
 */
struct pawl_sb_plan {
    /* Filled by pawl__standby_plan for each read. */
    struct pawl_pgpool *pool; /* the standby's pool; NULL: the primary (the caller's own pool) */
    struct pawl_pgstmt check; /* with pool: send it after the read, in the same request */
    int trusted; /* 1 once the check has said the server was in recovery through the read (a
                  * read on the primary: 1 from the start); use the read's rows only then */

    /* Private to standby.c. */
    struct pawl_standby *_sb;
    int _primary; /* this call reads from the primary in the standby's stead */
    int _open;    /* planned and not yet settled */
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

/* The read pool, for the store to prepare its read statements on at open. */
struct pawl_pgpool *pawl__standby_pool(struct pawl_standby *sb);

/*
 * Before each read: where does it go. Fills plan (see struct pawl_sb_plan): plan->pool NULL
 * sends the read to the primary, as always with sb NULL (no read_dsn); otherwise send the read
 * on plan->pool with plan->check after it in the same request. Returns 0, or PAWL_ECONN when
 * the read goes to the standby and the standby has no connection: then send nothing, put the
 * reason (why, whylen) in the store's error, and settle the read as PAWL_SB_LOST.
 */
int pawl__standby_plan(struct pawl_standby *sb, struct pawl_sb_plan *plan, char *why,
                       size_t whylen);

/*
 * After each planned read: what came of it, read after `after` with `known` the highest index
 * announced before it was sent (by the primary's runs or notifications). Returns what the
 * reader does next. A read on the primary is counted as one in the standby's stead (with a
 * standby) and used. On the standby, a read that got something ends an episode; one that was
 * behind, lost or not trusted opens or continues one, and falls back to the primary
 * (PAWL_SB_AGAIN: the plan now says so), waits (PAWL_SB_WAIT, *wait_ns the back-off: 1 ms
 * doubling to read_poll_max_ms while the episode lasts) or goes through the store's outage
 * path (PAWL_SB_USE with a lost read), as read_fallback says; one that failed for its own
 * reasons (PAWL_SB_FAILED) changes nothing. Logs the start and the end of each episode once.
 * sb NULL: PAWL_SB_USE.
 */
enum pawl_sb_action pawl__standby_settle(struct pawl_standby *sb, struct pawl_sb_plan *plan,
                                         enum pawl_sb_outcome what, int64_t after, int64_t known,
                                         int64_t *wait_ns);

/* Statistics (see struct pawl_store_stats). */
void pawl__standby_stats(struct pawl_standby *sb, int64_t *reads, int64_t *fallback_reads,
                         int64_t *episodes, int *fallback_active, double *replay_delay_ms);

#endif
