-- Baseline (b): per-event renumbering, the reference design that pawl's finalizer improves on.
--
-- An append inserts its events with temporary, negative global indexes (a descending sequence,
-- so a more negative number means a later insert). One finalizer at a time, serialized across
-- every session by a transaction-scoped advisory try-lock, rewrites every committed temporary
-- row in insertion order to the next positive numbers, in one transaction, and notifies the
-- highest final index. Readers read only positive indexes, which appear in ascending order.
--
-- The positive numbers come from a one-row counter updated in the finalizer's transaction, not
-- from a sequence, so an aborted finalization burns none: final indexes are contiguous.
--
-- The cost this baseline exists to show: every event row is updated once more after its insert
-- (a non-HOT update, since the indexed column changes), which doubles the write-ahead log per
-- event and rewrites both indexes.
-- Loading this file drops and recreates the schema: it holds benchmark data only.

DROP SCHEMA IF EXISTS bl_renumber CASCADE;
CREATE SCHEMA bl_renumber;

CREATE SEQUENCE bl_renumber.temporary_index AS bigint INCREMENT BY -1 MAXVALUE -1 START WITH -1;

CREATE TABLE bl_renumber.events (
    global_index bigint PRIMARY KEY DEFAULT nextval('bl_renumber.temporary_index'),
    stream_id text NOT NULL,
    stream_seq bigint NOT NULL,
    type text NOT NULL,
    payload bytea NOT NULL,
    metadata jsonb,
    appended_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT events_stream_seq_key UNIQUE (stream_id, stream_seq)
);

-- The highest final index handed out so far.
CREATE TABLE bl_renumber.head (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    last_final bigint NOT NULL
);
INSERT INTO bl_renumber.head VALUES (true, 0);

-- Finalize everything committed so far. Returns (renumbered, last_final): (-1, -1) when another
-- session holds the lock (it may have started before this caller's rows committed: the caller
-- must try again once that run is over), (0, last_final) when there was nothing to do.
--
-- The plan is pinned, so that the run's cost cannot depend on the table's statistics: a
-- backward scan of the primary key over the negative range (already in insertion order, no
-- sort) and one primary-key probe per row to update. Plain index scans, not index-only ones:
-- only a plain scan marks the dead entries that earlier runs left in the negative range as
-- killed, so that later runs skip them instead of visiting every one (without this a run slows
-- down with every event ever finalized until vacuum catches up). Sequential and hash plans,
-- which statistics from a moment with many pending rows would choose, read the whole table on
-- every run. jit stays off: a run must never pay a compilation.
CREATE FUNCTION bl_renumber.finalize(OUT renumbered bigint, OUT last_final bigint)
LANGUAGE plpgsql
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_indexonlyscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $fn$
DECLARE
    base bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(7081990, 2) THEN
        renumbered := -1;
        last_final := -1;
        RETURN;
    END IF;
    SELECT h.last_final INTO base FROM bl_renumber.head AS h;

    -- Temporary indexes ascend towards zero in reverse insertion order: the least negative
    -- committed row was inserted first and gets base + 1.
    UPDATE bl_renumber.events AS e
       SET global_index = p.final
      FROM (SELECT t.global_index AS temporary,
                   base + row_number() OVER (ORDER BY t.global_index DESC) AS final
              FROM bl_renumber.events AS t
             WHERE t.global_index < 0) AS p
     WHERE e.global_index = p.temporary;
    GET DIAGNOSTICS renumbered = ROW_COUNT;

    last_final := base + renumbered;
    IF renumbered > 0 THEN
        UPDATE bl_renumber.head SET last_final = finalize.last_final;
        PERFORM pg_notify('bl_renumber', finalize.last_final::text);
    END IF;
END
$fn$;
