-- 011_finalize_durable.sql: pawl.finalize refuses to run where its commit would not be durable
-- (schema version 11).
--
-- A run must be durable before any reader can see it: with synchronous_commit on (or stronger)
-- PostgreSQL flushes a commit before it makes it visible. At off (or local, which skips the
-- synchronous standbys) a reader can read a run that a crash (or a failover) then loses, and
-- the indexes it read go to other events when appends committed asynchronously are lost with
-- it. pawl's own finalizer pins the setting on its session; until now a session that called
-- pawl.finalize itself (an operator's psql, a script, another client) at the database's default
-- of off wrote such runs. The function now refuses it, as it refuses isolation levels other
-- than READ COMMITTED. What it cannot see is a caller that lowers the setting later in the same
-- transaction (SET LOCAL after the call): only pawl_appender and pawl_processor logins may call
-- pawl.finalize at all, and pawl's own sessions never do that.

CREATE OR REPLACE FUNCTION pawl.finalize(max_appends int4 DEFAULT 2000)
RETURNS TABLE (appends int8, events int8, last_index int8)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_material = off
SET max_parallel_workers_per_gather = 0
SET plan_cache_mode = force_generic_plan
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
    nx      xid8;
    np      xid8[];
    lo      int4;
    hi      int4;
BEGIN
    IF max_appends IS NULL OR max_appends < 1 THEN
        RAISE EXCEPTION 'pawl.finalize: max_appends must be at least 1'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pawl.finalize must run at READ COMMITTED, not %',
            upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'invalid_transaction_state',
                  HINT = 'SET default_transaction_isolation = ''read committed'' for the '
                         'session that finalizes';
    END IF;
    -- A run must be durable before any reader can see it (PostgreSQL then makes a commit
    -- visible only after its flush); at off or local a crash can lose a run that readers saw.
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        RAISE EXCEPTION 'pawl.finalize must run with synchronous_commit on or stronger, not %',
            current_setting('synchronous_commit')
            USING ERRCODE = 'invalid_transaction_state',
                  HINT = 'SET synchronous_commit = on in the session that finalizes (and keep it '
                         'so until its COMMIT)';
    END IF;
    -- The finalizer's lock, held until this transaction ends. No xid and no WAL.
    BEGIN
        LOCK TABLE pawl.finalizer_gate IN EXCLUSIVE MODE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        RETURN QUERY SELECT -1::int8, -1::int8,
            (SELECT r.last_index FROM pawl.runs r ORDER BY r.last_index DESC LIMIT 1);
        RETURN;
    END;

    SELECT * INTO prev FROM pawl.runs r ORDER BY r.last_index DESC LIMIT 1;
    -- Taken after the lock (read committed: a new snapshot per statement): the previous run's
    -- rows are visible to it and to what follows.
    snap := pg_current_snapshot();

    SELECT coalesce(array_agg(u.xid ORDER BY u.ticket NULLS FIRST, u.xid), '{}'),
           coalesce(array_agg(u.n ORDER BY u.ticket NULLS FIRST, u.xid), '{}')
      INTO c_xids, c_ns
      FROM (SELECT e.xid, e.n, e.ticket FROM pawl.events e
             WHERE e.xid >= prev.scan_xmax AND e.k = 0
            UNION ALL
            SELECT e.xid, e.n, e.ticket FROM pawl.events e
             WHERE e.xid = ANY (prev.open_xids) AND e.k = 0
               AND e.xid < prev.scan_xmax) u
     WHERE pg_visible_in_snapshot(u.xid, snap);

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

    -- Everything completed at snap is now finalized.
    nx := pg_snapshot_xmax(snap);
    np := ARRAY(SELECT x FROM pg_snapshot_xip(snap) AS x ORDER BY x);

    -- Rows of at most max_appends appends (what a reader maps at once), contiguous.
    lo := 1;
    WHILE lo <= cnt LOOP
        hi := least(cnt, lo + max_appends - 1);
        INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids, bases, ns, open_xids)
        VALUES (c_bases[hi] + c_ns[hi] - 1, c_bases[lo], nx, c_xids[lo:hi], c_bases[lo:hi],
                c_ns[lo:hi], np);
        lo := hi + 1;
    END LOOP;

    PERFORM pg_notify('pawl_log', (first + total - 1)::text);
    RETURN QUERY SELECT cnt::int8, total, first + total - 1;
END
$fn$;
