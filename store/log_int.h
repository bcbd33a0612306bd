/*
 * log_int.h — private pieces of the event store shared with tests and benchmarks: the append
 * statement's text, so that tests can run the exact append inside transactions they control
 * (sleeping with the transaction open, say).
 *
 * Parameters (binary or text): $1 text[] the distinct streams, $2 int8[] each stream's expected
 * first sequence (0 = any), $3 int4[] per event its stream (1-based into $1), $4 int4[] its rank
 * in that stream (1-based), $5 text[] types, $6 bytea[] payloads, $7 jsonb[] metadata, $8 bool
 * NOTIFY pawl_pending at commit. It returns one row: the number of events inserted (n on
 * success, 0 when an expected stream version did not match), the transaction's xid (text),
 * which lets a client whose connection died during COMMIT ask pg_xact_status() whether the
 * append committed, and each stream's last sequence number before the append (int8[]).
 */
#ifndef PAWL_STORE_LOG_INT_H
#define PAWL_STORE_LOG_INT_H

#include <stddef.h>
#include <stdint.h>

extern const char pawl__log_append_sql[];

/*
 * pawl_read, bounded: when deadline_ns (pawl_now_ns() time; 0: none) passes while the read's
 * connection is lost and being retried, it returns PAWL_ETIMEDOUT with count 0 (the outage and
 * its log line go on in the next call). The processors' event source reads through it so that
 * a processor stays responsive (to stop, say) during an outage.
 */
struct pawl_read_batch;
struct pawl_store;
int pawl__log_read_until(struct pawl_store *s, int64_t after, size_t max, struct pawl_read_batch *b,
                         int64_t deadline_ns);
/* pawl_read_filtered, bounded the same way. */
struct pawl_filter;
int pawl__log_read_filtered_until(struct pawl_store *s, int64_t after, size_t max,
                                  const struct pawl_filter *f, struct pawl_read_batch *b,
                                  int64_t *position, int64_t deadline_ns);

#endif
