/*
 * log_int.h — private pieces of the event store shared with tests and benchmarks: the append
 * statement's text, so that tests can run the exact append inside transactions they control
 * (sleeping with the transaction open, say).
 *
 * Parameters: $1 text[] stream ids, $2 int8[] stream sequences (0 = any), $3 text[] types,
 * $4 bytea[] payloads, $5 jsonb[] metadata, $6 int4 number of events. It returns one row:
 * the number of events inserted (n on success, 0 when an expected stream version did not
 * match) and the transaction's xid (text; NULL when nothing was inserted), which lets a client
 * whose connection died during COMMIT ask pg_xact_status() whether the append committed.
 */
#ifndef PAWL_STORE_LOG_INT_H
#define PAWL_STORE_LOG_INT_H

#include <stddef.h>
#include <stdint.h>

extern const char pawl_log_append_sql[];

/*
 * pawl_read, bounded: when deadline_ns (pawl_now_ns() time; 0: none) passes while the read's
 * connection is lost and being retried, it returns PAWL_ETIMEDOUT with count 0 (the outage and
 * its log line go on in the next call). The processors' event source reads through it so that
 * a processor stays responsive (to stop, say) during an outage.
 */
struct pawl_batch;
struct pawl_store;
int pawl_read_until(struct pawl_store *s, int64_t after, size_t max, struct pawl_batch *b,
                    int64_t deadline_ns);

#endif
