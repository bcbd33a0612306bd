-- 004_stream_collation.sql: stream ids compare byte by byte (schema version 4).
--
-- A stream id is an identifier, not text for people to sort, yet until now its column took the
-- database's default collation, and so did the unique index on (stream_id, stream_seq) that
-- every append probes once per stream (the head lookup) and inserts into once per event.
-- Two things follow from that, both fixed by the "C" collation:
--
--   * Cost. Under a linguistic collation each index comparison is a locale-aware string
--     comparison (strcoll or ICU) of copied, NUL-terminated strings instead of a memcmp. Appends
--     spread over many streams make dozens of comparisons per event.
--   * Safety. A unique index ordered by an operating-system locale is silently corrupted when
--     an OS upgrade changes that locale's sort order (glibc 2.28 did, for most locales): lookups
--     miss existing heads and duplicate (stream, sequence) pairs get in. Byte order never changes.
--
-- Equality is unchanged for every deterministic collation (PostgreSQL compares the bytes when
-- the locale calls two different strings equal), so no existing pair of events conflicts under
-- "C" that did not before. The table is not rewritten; only events_stream_key is rebuilt, under
-- an exclusive lock on pawl.events for as long as that takes (about a second per million events
-- on a small machine): run `pawl init` for this upgrade at a quiet moment. The view depends on
-- the column's type, so it is recreated unchanged; grants on it are given again by
-- sql/roles/least_privilege.sql, which is to be re-run after every upgrade anyway.

DROP VIEW pawl_api.events;

ALTER TABLE pawl.events ALTER COLUMN stream_id TYPE text COLLATE "C";

CREATE VIEW pawl_api.events AS
SELECT a.base + e.k AS global_index, e.stream_id, e.stream_seq, e.type, e.payload, e.metadata,
       e.appended_at
  FROM pawl.runs r
 CROSS JOIN LATERAL unnest(r.xids, r.bases) AS a(xid, base)
  JOIN pawl.events e ON e.xid = a.xid;
