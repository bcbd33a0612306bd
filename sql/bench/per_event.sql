-- per_event.sql: the per-event finalization design, kept only as the benchmark baseline that
-- pawl's per-run design (sql/001_log.sql) is compared with (bench/load/bench_append.c).
--
-- Every event row is inserted with a temporary negative id (a descending sequence, so insertion
-- order is descending id order). The finalizer, serialized by an advisory try-lock, renumbers
-- every committed temporary row to the next positive indexes from a counter row updated in the
-- same transaction (an aborted run burns nothing). Each event row is therefore rewritten once,
-- with both its indexes: the cost the per-run design avoids. Not a migration; the benchmark
-- loads it into schema pawl_bench_pe, dropping what was there.

DROP SCHEMA IF EXISTS pawl_bench_pe CASCADE;
CREATE SCHEMA pawl_bench_pe;

CREATE SEQUENCE pawl_bench_pe.temp_ids INCREMENT BY -1 START WITH -1 MAXVALUE -1;

CREATE TABLE pawl_bench_pe.events (
    idx         int8        NOT NULL DEFAULT nextval('pawl_bench_pe.temp_ids') PRIMARY KEY,
    stream_seq  int8        NOT NULL,
    appended_at timestamptz NOT NULL DEFAULT now(),
    stream_id   text        NOT NULL,
    type        text        NOT NULL,
    payload     bytea       NOT NULL,
    metadata    jsonb,
    UNIQUE (stream_id, stream_seq)
);

CREATE TABLE pawl_bench_pe.counter (id int4 PRIMARY KEY, last_index int8 NOT NULL);
INSERT INTO pawl_bench_pe.counter VALUES (1, 0);

CREATE FUNCTION pawl_bench_pe.finalize()
RETURNS TABLE (events int8, last_index int8)
LANGUAGE plpgsql VOLATILE
SET jit = off
AS $fn$
DECLARE
    base int8;
    cnt  int8;
BEGIN
    IF NOT pg_try_advisory_xact_lock(1885435756, 3) THEN
        RETURN QUERY SELECT -1::int8, -1::int8;
        RETURN;
    END IF;
    SELECT c.last_index INTO base FROM pawl_bench_pe.counter c WHERE c.id = 1 FOR UPDATE;
    WITH pending AS (
        SELECT e.idx AS tmp, base + row_number() OVER (ORDER BY e.idx DESC) AS fin
          FROM pawl_bench_pe.events e
         WHERE e.idx < 0
    )
    UPDATE pawl_bench_pe.events e SET idx = p.fin FROM pending p WHERE e.idx = p.tmp;
    GET DIAGNOSTICS cnt = ROW_COUNT;
    IF cnt > 0 THEN
        UPDATE pawl_bench_pe.counter SET last_index = base + cnt WHERE id = 1;
        PERFORM pg_notify('pawl_bench_pe', (base + cnt)::text);
    END IF;
    RETURN QUERY SELECT cnt, base + cnt;
END
$fn$;
