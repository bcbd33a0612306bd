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

extern const char pawl_log_append_sql[];

#endif
