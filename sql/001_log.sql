-- 001_log.sql: the event log (schema version 1).
--
-- Schema 6 (006_log_guarantees.sql) replaces the per-stream order proof below with append
-- tickets, valid for any transaction, makes appends and runs go through SECURITY DEFINER
-- functions, and stops truncating runs; what follows is the version-1 design it builds on.
--
-- Design. An append is one transaction that inserts its events into pawl.events, tagged with
-- the appending transaction's id (xid8, the temporary id) and each event's position k in the
-- append. Nothing else is written per append, and no event row is ever updated.
--
-- Finalization gives committed appends their final, positive, contiguous global indexes in
-- runs. A run is serialized by an advisory try-lock that one session in the database can hold,
-- and writes exactly one row into pawl.runs: the appends it ordered (their xids, in xid order),
-- the final index of each append's first event (its base; event k has index base + k) and
-- the bookkeeping the next run starts from. The global index of an event is therefore
-- runs.bases[i] + events.k where runs.xids[i] = events.xid. The highest run row also holds the
-- next index (last_index + 1), so an aborted run changes nothing and burns no numbers.
--
-- Which appends does a run pick up? Run R takes a snapshot S after it holds the lock. Every
-- append whose transaction had completed at S and that committed is visible, and R finalizes
-- all of them that earlier runs did not (up to max_appends, in xid order). To find those
-- without scanning the log, each run records the horizon of S: scan_xmax (no xid at or above
-- it had completed at S) and open_xids (the xids still running at S). Invariant: every append
-- whose xid is below scan_xmax and not in open_xids is finalized or aborted. So the next run
-- only looks at xid >= scan_xmax or xid IN open_xids, restricted to transactions completed at
-- its own snapshot (pg_visible_in_snapshot), and then records its own horizon. Both index
-- probes are answered from the primary key (xid, k), so a run's cost is proportional to the
-- appends it finalizes plus the transactions running at the previous run, whatever the
-- planner statistics say; the function also pins its plan choices and turns JIT off.
--
-- Per-stream order. An append checks and computes stream sequences in the same statement that
-- inserts, under that statement's snapshot, and the transaction gets its xid only when the
-- first row is inserted, after the snapshot was taken. If append B builds on append A's event
-- (B saw A's row), A committed before B's snapshot, so A's xid < B's xid and A had completed
-- at any snapshot at which B had. Runs finalize in xid order and a run that can see B can see
-- A, hence final index order equals stream sequence order. This needs one append per
-- transaction, with no write before the append statement (the store guarantees it).

CREATE SCHEMA IF NOT EXISTS pawl;

CREATE TABLE pawl.events (
    xid         xid8        NOT NULL,   -- the appending transaction (temporary id)
    stream_seq  int8        NOT NULL,   -- 1-based position in its stream
    appended_at timestamptz NOT NULL DEFAULT now(),
    k           int4        NOT NULL,   -- position inside its append, 0-based
    n           int4        NOT NULL,   -- number of events in its append
    stream_id   text        NOT NULL,
    type        text        NOT NULL,
    payload     bytea       NOT NULL,
    metadata    jsonb,
    CONSTRAINT events_pkey PRIMARY KEY (xid, k),
    CONSTRAINT events_stream_key UNIQUE (stream_id, stream_seq),
    CONSTRAINT events_seq_check CHECK (stream_seq >= 1)
);

CREATE TABLE pawl.runs (
    last_index   int8        NOT NULL,  -- highest final index given by the run
    first_index  int8        NOT NULL,  -- lowest (last_index of the previous run + 1)
    scan_xmax    xid8        NOT NULL,  -- horizon for the next run, see above
    finalized_at timestamptz NOT NULL DEFAULT now(),
    xids         xid8[]      NOT NULL,  -- the appends ordered by this run, in order
    bases        int8[]      NOT NULL,  -- final index of each append's first event
    ns           int4[]      NOT NULL,  -- events per append
    open_xids    xid8[]      NOT NULL,  -- transactions running at the run's snapshot
    CONSTRAINT runs_pkey PRIMARY KEY (last_index),
    -- Two runs can never start at the same index, even if someone bypasses the lock.
    CONSTRAINT runs_first_key UNIQUE (first_index)
);

-- The origin: index 0, nothing finalized, every transaction still to be looked at.
INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids, bases, ns, open_xids)
VALUES (0, 0, '0', '{}', '{}', '{}', '{}');

-- Finalize committed appends: returns (appends, events, last_index). appends = -1 when another
-- session holds the finalizer lock (nothing done; last_index is the current highest index).
-- Notifies channel pawl_log with the new highest index (delivered when the caller commits).
CREATE FUNCTION pawl.finalize(max_appends int4 DEFAULT 2000)
RETURNS TABLE (appends int8, events int8, last_index int8)
LANGUAGE plpgsql VOLATILE
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_material = off
SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    prev    pawl.runs%ROWTYPE;
    snap    pg_snapshot;
    c_xids  xid8[];
    c_ns    int4[];
    c_bases int8[];
    cnt     int4;
    total   int8;
    first   int8;
    cut     xid8;
    nx      xid8;
    np      xid8[];
BEGIN
    IF max_appends IS NULL OR max_appends < 1 THEN
        RAISE EXCEPTION 'pawl.finalize: max_appends must be at least 1'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Key (class 'pawl', 1): the finalizer. Held until this transaction ends.
    IF NOT pg_try_advisory_xact_lock(1885435756, 1) THEN
        RETURN QUERY SELECT -1::int8, -1::int8,
            (SELECT r.last_index FROM pawl.runs r ORDER BY r.last_index DESC LIMIT 1);
        RETURN;
    END IF;

    SELECT * INTO prev FROM pawl.runs r ORDER BY r.last_index DESC LIMIT 1;
    -- Taken after the lock: the previous run's row is visible to it and to what follows.
    snap := pg_current_snapshot();

    SELECT coalesce(array_agg(c.xid ORDER BY c.xid), '{}'),
           coalesce(array_agg(c.n ORDER BY c.xid), '{}')
      INTO c_xids, c_ns
      FROM (SELECT u.xid, u.n
              FROM (SELECT e.xid, e.n FROM pawl.events e
                     WHERE e.xid >= prev.scan_xmax AND e.k = 0
                    UNION ALL
                    SELECT e.xid, e.n FROM pawl.events e
                     WHERE e.xid = ANY (prev.open_xids) AND e.k = 0
                       AND e.xid < prev.scan_xmax) u
             WHERE pg_visible_in_snapshot(u.xid, snap)
             ORDER BY u.xid
             LIMIT max_appends) c;

    cnt := cardinality(c_xids);
    IF cnt = 0 THEN
        -- Nothing written: the previous horizon stays valid (nothing changed that it covers).
        RETURN QUERY SELECT 0::int8, 0::int8, prev.last_index;
        RETURN;
    END IF;

    first := prev.last_index + 1;
    SELECT array_agg(s.b ORDER BY s.o), max(s.b + s.n) - first
      INTO c_bases, total
      FROM (SELECT t.o, t.n, first + sum(t.n) OVER (ORDER BY t.o) - t.n AS b
              FROM unnest(c_ns) WITH ORDINALITY AS t(n, o)) s;

    IF cnt < max_appends THEN
        -- Everything completed at snap is now finalized.
        nx := pg_snapshot_xmax(snap);
        np := ARRAY(SELECT x FROM pg_snapshot_xip(snap) AS x ORDER BY x);
    ELSE
        -- Truncated at cut: act as if nothing above cut had completed at snap. Keep every xid
        -- below the new horizon that may still hold unfinalized committed appends.
        cut := c_xids[cnt];
        nx := greatest(prev.scan_xmax, (cut::text::numeric + 1)::text::xid8);
        np := ARRAY(SELECT DISTINCT v.x
                      FROM (SELECT unnest(prev.open_xids) UNION ALL
                            SELECT pg_snapshot_xip(snap)) AS v(x)
                     WHERE v.x < nx AND NOT (v.x <= cut AND pg_visible_in_snapshot(v.x, snap))
                     ORDER BY v.x);
    END IF;

    INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids, bases, ns, open_xids)
    VALUES (first + total - 1, first, nx, c_xids, c_bases, c_ns, np);

    PERFORM pg_notify('pawl_log', (first + total - 1)::text);
    RETURN QUERY SELECT cnt::int8, total, first + total - 1;
END
$fn$;

-- ---------------------------------------------------------------------------------------------
-- The SQL face (schema pawl_api, interface version 1): what consumers in any language use.
-- ---------------------------------------------------------------------------------------------
CREATE SCHEMA IF NOT EXISTS pawl_api;

-- The version of this interface (bumped only on incompatible changes).
CREATE FUNCTION pawl_api.version() RETURNS int4
LANGUAGE sql IMMUTABLE AS $$ SELECT 1 $$;

-- Every finalized event. Unfinalized appends are not in it.
CREATE VIEW pawl_api.events AS
SELECT a.base + e.k AS global_index, e.stream_id, e.stream_seq, e.type, e.payload, e.metadata,
       e.appended_at
  FROM pawl.runs r
 CROSS JOIN LATERAL unnest(r.xids, r.bases) AS a(xid, base)
  JOIN pawl.events e ON e.xid = a.xid;

-- The highest final index (0 when nothing is finalized yet).
CREATE FUNCTION pawl_api.last_index() RETURNS int8
LANGUAGE sql STABLE
SET enable_seqscan = off
AS $$ SELECT r.last_index FROM pawl.runs r ORDER BY r.last_index DESC LIMIT 1 $$;

-- Up to max_events finalized events with global_index > after_index, in index order, with no
-- gaps: the result is exactly after_index + 1 .. after_index + count. Forward only: a later
-- call never returns an index at or below one an earlier call returned.
CREATE FUNCTION pawl_api.read(after_index int8, max_events int4 DEFAULT 1000)
RETURNS TABLE (global_index int8, stream_id text, stream_seq int8, type text, payload bytea,
               metadata jsonb, appended_at timestamptz)
LANGUAGE plpgsql STABLE
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET max_parallel_workers_per_gather = 0
AS $fn$
DECLARE
    lo int8;
    hi int8;
BEGIN
    IF after_index IS NULL OR after_index < 0 THEN
        RAISE EXCEPTION 'pawl_api.read: after_index must be >= 0'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_events IS NULL OR max_events < 1 OR max_events > 100000 THEN
        RAISE EXCEPTION 'pawl_api.read: max_events must be in 1..100000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    lo := after_index;
    hi := after_index + least(max_events, 9223372036854775807 - after_index); -- last wanted
    RETURN QUERY
    SELECT a.base + e.k, e.stream_id, e.stream_seq, e.type, e.payload, e.metadata,
           e.appended_at
      FROM pawl.runs r
     CROSS JOIN LATERAL unnest(r.xids, r.bases, r.ns) AS a(xid, base, n)
      JOIN pawl.events e
        ON e.xid = a.xid AND e.k >= greatest(0, lo + 1 - a.base) AND e.k <= hi - a.base
     WHERE r.last_index > lo
       AND r.last_index <= coalesce((SELECT r2.last_index FROM pawl.runs r2
                                      WHERE r2.last_index >= hi
                                      ORDER BY r2.last_index LIMIT 1),
                                    9223372036854775807)
       AND a.base <= hi
       AND a.base + a.n > lo
     ORDER BY 1;
END
$fn$;

COMMENT ON SCHEMA pawl_api IS
    'pawl event log, SQL interface v1: view events, read(after_index, max_events), '
    'last_index(); LISTEN pawl_log (payload: the new highest global index, decimal text)';
