-- 014_own_xid.sql: a run never covers its caller's own transaction; readers never trust more
-- events than a run recorded; the gates live where no other login can name them; one set of
-- event limits for every append path (schema version 14).
--
-- The hole. A transaction's own xid is left out of its own snapshot's list of running
-- transactions, so pg_visible_in_snapshot(own xid, pg_current_snapshot()) is true: to
-- pawl.finalize called inside a transaction that had appended, that append looked committed.
-- The run covered it with the event count it had then, and a later append in the same
-- transaction (several appends per transaction are one unit, k continuing) wrote events that
-- no run covered but that the readers' join (event xid = run entry xid) mapped to indexes
-- base + k, which the next run had given to other appends: one index, two events. Now:
--
-- * pawl.finalize leaves its caller's own transaction out of the run and keeps its xid among
--   the horizon's open transactions, so the next run (in another transaction) looks at it
--   again once it has committed, with all its events. A transaction that appends, finalizes,
--   appends again and commits is one append, finalized whole by a later run.
-- * pawl_api.read and pawl_api.events map only events with k < the count the run recorded.
-- * Databases that already hold such a transaction are repaired below, once: the events past
--   the count their run recorded become a new append (this migration's transaction), with the
--   original append's ticket, and a later run gives them their indexes. Their stream sequence
--   numbers are kept; when a later append of the same stream was finalized before this repair,
--   the moved events get indexes after it (the log could not be read past the duplicate index
--   before the repair, so no reader had them).
--
-- The gates. The parser locks a table it is told to name before any privilege is checked, and
-- a function the caller put in pg_temp can run while the plan is made: so a login that could
-- name pawl.finalizer_gate could hold a lock on it that conflicts with the finalizer's (ROW
-- SHARE through SELECT ... FOR UPDATE), for as long as it liked, without any right on it. The
-- gates now live in the schema pawl_locks, on which no role but the owner has USAGE: a name
-- in a schema without USAGE fails before its table is locked. pawl.tokens_init serializes on
-- such a gate too (it took an advisory key that any login can hold), after a look that needs no
-- lock when the processor's tokens exist already.
--
-- The holder. A session that calls pawl.finalize inside a transaction holds the finalizer's
-- gate until that transaction ends. pawl.finalize sets idle_in_transaction_session_timeout
-- (locally, to 5 s, unless the session has a shorter one) so that a session left idle in such a
-- transaction is ended by the server within 5 s and its gate freed.

-- Wait for every transaction that is writing a run: one that finalized under the old function
-- and appends again has committed (and is repaired below) before this transaction reads runs.
LOCK TABLE pawl.runs IN SHARE MODE;

CREATE SCHEMA pawl_locks;
REVOKE ALL ON SCHEMA pawl_locks FROM PUBLIC;
COMMENT ON SCHEMA pawl_locks IS
    'pawl: lock objects of pawl''s own functions; no role but the owner may use this schema';
CREATE TABLE pawl_locks.finalizer ();
CREATE TABLE pawl_locks.tokens_init ();
REVOKE ALL ON pawl_locks.finalizer, pawl_locks.tokens_init FROM PUBLIC;

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
    mine    xid8;
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
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        RAISE EXCEPTION 'pawl.finalize must run with synchronous_commit on or stronger, not %',
            current_setting('synchronous_commit')
            USING ERRCODE = 'invalid_transaction_state',
                  HINT = 'SET synchronous_commit = on in the session that finalizes (and keep it '
                         'so until its COMMIT)';
    END IF;
    -- The finalizer's lock, held until this transaction ends. No xid and no WAL.
    BEGIN
        LOCK TABLE pawl_locks.finalizer IN EXCLUSIVE MODE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        RETURN QUERY SELECT -1::int8, -1::int8,
            (SELECT r.last_index FROM pawl.runs r ORDER BY r.last_index DESC LIMIT 1);
        RETURN;
    END;
    -- A caller that keeps its transaction open and idle keeps the gate: the server ends such a
    -- session after 5 s (a shorter setting of its own stays).
    IF current_setting('idle_in_transaction_session_timeout') = '0'
       OR current_setting('idle_in_transaction_session_timeout')::interval > interval '5 s' THEN
        PERFORM set_config('idle_in_transaction_session_timeout', '5s', true);
    END IF;

    SELECT * INTO prev FROM pawl.runs r ORDER BY r.last_index DESC LIMIT 1;
    -- Taken after the lock (read committed: a new snapshot per statement): the previous run's
    -- rows are visible to it and to what follows. The caller's own xid is missing from its
    -- snapshot's running list, so it looks completed: it is left out here and kept open below.
    snap := pg_current_snapshot();
    mine := pg_current_xact_id_if_assigned();

    SELECT coalesce(array_agg(u.xid ORDER BY u.ticket NULLS FIRST, u.xid), '{}'),
           coalesce(array_agg(u.n ORDER BY u.ticket NULLS FIRST, u.xid), '{}')
      INTO c_xids, c_ns
      FROM (SELECT e.xid, e.n, e.ticket FROM pawl.events e
             WHERE e.xid >= prev.scan_xmax AND e.k = 0
            UNION ALL
            SELECT e.xid, e.n, e.ticket FROM pawl.events e
             WHERE e.xid = ANY (prev.open_xids) AND e.k = 0
               AND e.xid < prev.scan_xmax) u
     WHERE pg_visible_in_snapshot(u.xid, snap)
       AND u.xid IS DISTINCT FROM mine;

    cnt := cardinality(c_xids);
    IF cnt = 0 THEN
        -- Nothing written: the previous horizon stays valid (nothing changed that it covers;
        -- the caller's own xid, if it appended, is at or above it or among its open xids).
        RETURN QUERY SELECT 0::int8, 0::int8, prev.last_index;
        RETURN;
    END IF;

    first := prev.last_index + 1;
    SELECT array_agg(s.b ORDER BY s.o), max(s.b + s.n) - first
      INTO c_bases, total
      FROM (SELECT t.o, t.n, first + sum(t.n) OVER (ORDER BY t.o) - t.n AS b
              FROM unnest(c_ns) WITH ORDINALITY AS t(n, o)) s;

    -- Everything completed at snap is now finalized, except the caller's own transaction.
    nx := pg_snapshot_xmax(snap);
    np := ARRAY(SELECT x
                  FROM (SELECT pg_snapshot_xip(snap)
                        UNION SELECT mine WHERE mine IS NOT NULL AND mine < nx) AS v(x)
                 ORDER BY x);

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

-- The session holding the finalizer's gate, or a lock on it that keeps the finalizer out (every
-- mode but ACCESS SHARE conflicts with its EXCLUSIVE), or waiting for it. Same columns as
-- before; only the gate moved.
CREATE OR REPLACE FUNCTION pawl_api.finalizer_holder()
RETURNS TABLE (pid int4, application_name text, usename name, backend_start timestamptz,
               xact_start timestamptz, held_for interval)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT l.pid, a.application_name, a.usename, a.backend_start, a.xact_start,
           clock_timestamp() - coalesce(a.xact_start, a.query_start)
      FROM pg_catalog.pg_locks l
      LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
     WHERE l.locktype = 'relation'
       AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                          WHERE d.datname = pg_catalog.current_database())
       AND l.relation = 'pawl_locks.finalizer'::regclass
       AND l.mode <> 'AccessShareLock' AND l.granted
$$;

-- The old gate: nothing takes it any more.
DROP TABLE pawl.finalizer_gate;

-- Readers: an event of an append is final only below the count its run recorded.
CREATE OR REPLACE VIEW pawl_api.events AS
SELECT a.base + e.k AS global_index, e.stream_id, e.stream_seq, e.type, e.payload, e.metadata,
       e.appended_at
  FROM pawl.runs r
 CROSS JOIN LATERAL unnest(r.xids, r.bases, r.ns) AS a(xid, base, n)
  JOIN pawl.events e ON e.xid = a.xid AND e.k < a.n
 WHERE a.base + e.k >= (SELECT pawl_api.first_index());

CREATE OR REPLACE FUNCTION pawl_api.read(after_index int8, max_events int4 DEFAULT 1000)
RETURNS TABLE (global_index int8, stream_id text, stream_seq int8, type text, payload bytea,
               metadata jsonb, appended_at timestamptz)
LANGUAGE plpgsql STABLE
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET max_parallel_workers_per_gather = 0
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    lo int8;
    hi int8;
    w  int8;
BEGIN
    IF after_index IS NULL OR after_index < 0 THEN
        RAISE EXCEPTION 'pawl_api.read: after_index must be >= 0'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_events IS NULL OR max_events < 1 OR max_events > 100000 THEN
        RAISE EXCEPTION 'pawl_api.read: max_events must be in 1..100000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    w := pawl_api.first_index();
    IF after_index < w - 1 THEN
        RAISE EXCEPTION 'pawl: the log starts at index % (retention dropped the events below '
            'it); cannot read after index %', w, after_index
            USING ERRCODE = 'PW020',
                  DETAIL = format('low_watermark=%s after_index=%s', w, after_index),
                  HINT = format('read from index %s on (after %s), or reload the archive', w,
                                w - 1);
    END IF;
    lo := after_index;
    hi := after_index + least(max_events, 9223372036854775807 - after_index); -- last wanted
    RETURN QUERY
    SELECT a.base + e.k, e.stream_id, e.stream_seq, e.type, e.payload, e.metadata,
           e.appended_at
      FROM pawl.runs r
     CROSS JOIN LATERAL unnest(r.xids, r.bases, r.ns) AS a(xid, base, n)
      JOIN pawl.events e
        ON e.xid = a.xid AND e.k >= greatest(0, lo + 1 - a.base)
       AND e.k <= least(hi - a.base, a.n - 1)
     WHERE r.last_index > lo
       AND r.last_index <= coalesce((SELECT r2.last_index FROM pawl.runs r2
                                      WHERE r2.last_index >= hi
                                      ORDER BY r2.last_index LIMIT 1),
                                    9223372036854775807)
       AND a.base <= hi
       AND a.base + a.n > lo
     ORDER BY 1;
    -- A drop that committed after the look above and before the query took its lock: the rows
    -- it dropped are missing from the result. Its watermark is visible now; fail naming it.
    IF after_index < pawl_api.first_index() - 1 THEN
        w := pawl_api.first_index();
        RAISE EXCEPTION 'pawl: the log starts at index % (retention dropped the events below '
            'it); cannot read after index %', w, after_index
            USING ERRCODE = 'PW020',
                  DETAIL = format('low_watermark=%s after_index=%s', w, after_index),
                  HINT = format('read from index %s on (after %s), or reload the archive', w,
                                w - 1);
    END IF;
END
$fn$;

-- tokens_init: no advisory key (any login can hold one); the tokens of a processor that has
-- them already are found without any lock.
CREATE OR REPLACE FUNCTION pawl.tokens_init(proc text, n int8, start_token int8) RETURNS int8
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    created int8;
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    IF proc IS NULL OR proc !~ '^[A-Za-z0-9_.:-]{1,63}$' THEN
        RAISE EXCEPTION 'processor name % is not 1..63 of [A-Za-z0-9_.:-]', proc
            USING ERRCODE = 'PW004';
    END IF;
    IF n < 1 OR n > 65536 OR (n & (n - 1)) <> 0 THEN
        RAISE EXCEPTION 'segment count % is not a power of two in 1..65536', n
            USING ERRCODE = 'PW004';
    END IF;
    IF start_token IS NULL OR start_token < 0 THEN
        RAISE EXCEPTION 'token % is negative', start_token USING ERRCODE = 'PW004';
    END IF;
    IF EXISTS (SELECT 1 FROM pawl.tokens WHERE processor = proc) THEN
        RETURN 0;
    END IF;
    -- Creators of new processors serialize here (a lock no other login can name); the look
    -- after it sees what a creator before it committed (read committed) or, at the stricter
    -- levels, fails on its insert (primary key) and is retried by the caller.
    LOCK TABLE pawl_locks.tokens_init IN EXCLUSIVE MODE;
    IF EXISTS (SELECT 1 FROM pawl.tokens WHERE processor = proc) THEN
        RETURN 0;
    END IF;
    INSERT INTO pawl.tokens (processor, segment_id, mask, token, high_water)
    SELECT proc, g, n - 1, start_token, start_token FROM generate_series(0, n - 1) AS g;
    GET DIAGNOSTICS created = ROW_COUNT;
    RETURN created;
END
$fn$;

-- One set of limits for every path, enforced by the table (the C library checks the same before
-- sending): a stream id and a type of 1..255 bytes, metadata a JSON object or NULL. Through
-- pawl.append and pawl.append_group an appender could write empty or 2,000-byte stream ids, 1 MB
-- types and non-object metadata; a parked stream whose id was longer than the processor's 255
-- bytes was not held back. NOT VALID: rows already written are not scanned (an upgrade of a
-- large log stays quick); every new row is checked.
ALTER TABLE pawl.events
    ADD CONSTRAINT events_stream_id_check CHECK (octet_length(stream_id) BETWEEN 1 AND 255)
        NOT VALID,
    ADD CONSTRAINT events_type_check CHECK (octet_length(type) BETWEEN 1 AND 255) NOT VALID,
    ADD CONSTRAINT events_metadata_check
        CHECK (metadata IS NULL OR jsonb_typeof(metadata) = 'object') NOT VALID;

-- The SQL face's own check (which names the limits in its message) said 1..200 bytes; it now
-- says what the table and the C library enforce. Otherwise as in schema 6.
CREATE OR REPLACE FUNCTION pawl_api.append_batch(stream_ids text[], types text[], payloads bytea[],
                                metadata jsonb[] DEFAULT NULL, expected_seqs int8[] DEFAULT NULL)
RETURNS TABLE (stream_id text, stream_seq int8)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_variable
DECLARE
    v_n      int4 := coalesce(cardinality(stream_ids), 0);
    v_st     text[];
    v_ex     int8[];
    v_si     int4[];
    v_rk     int4[];
    v_res    record;
    v_bad    int4;
    v_try    int4 := 0;
BEGIN
    IF v_n < 1 OR cardinality(types) IS DISTINCT FROM v_n
       OR cardinality(payloads) IS DISTINCT FROM v_n
       OR (metadata IS NOT NULL AND cardinality(metadata) <> v_n)
       OR (expected_seqs IS NOT NULL AND cardinality(expected_seqs) <> v_n) THEN
        RAISE EXCEPTION 'pawl_api.append_batch: stream_ids, types, payloads (and metadata, '
            'expected_seqs when given) need the same number (>= 1) of elements'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(stream_ids, types, payloads) AS u(s, t, p)
                WHERE u.s IS NULL OR u.s = '' OR octet_length(u.s) > 255 OR u.t IS NULL
                   OR u.t = '' OR octet_length(u.t) > 255 OR u.p IS NULL) THEN
        RAISE EXCEPTION 'pawl_api.append: every event needs a stream_id and a type of 1..255 '
            'bytes and a payload (not NULL)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF metadata IS NOT NULL AND EXISTS (SELECT 1 FROM unnest(metadata) AS m(j)
                                         WHERE m.j IS NOT NULL AND jsonb_typeof(m.j) <> 'object')
    THEN
        RAISE EXCEPTION 'pawl_api.append: metadata must be JSON objects (or NULL)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Group by stream (in order of first appearance); per stream: all ANY or consecutive.
    SELECT array_agg(g.s ORDER BY g.f), array_agg(g.q ORDER BY g.f)
      INTO v_st, v_ex
      FROM (SELECT u.s, min(u.o) AS f,
                   coalesce((array_agg(u.q ORDER BY u.o))[1], 0) AS q
              FROM unnest(stream_ids, expected_seqs) WITH ORDINALITY AS u(s, q, o)
             GROUP BY u.s) g;
    IF EXISTS (SELECT 1 FROM (SELECT u.s, u.q, u.o,
                                     lag(u.q) OVER (PARTITION BY u.s ORDER BY u.o) AS pq,
                                     count(*) OVER (PARTITION BY u.s) AS c,
                                     count(u.q) OVER (PARTITION BY u.s) AS cq
                                FROM unnest(stream_ids, expected_seqs) WITH ORDINALITY
                                     AS u(s, q, o)) w
                WHERE (w.cq <> 0 AND w.cq <> w.c) OR w.q < 1
                   OR (w.q IS NOT NULL AND w.pq IS NOT NULL AND w.q <> w.pq + 1)) THEN
        RAISE EXCEPTION 'pawl_api.append: per stream, expected_seqs must be all NULL (any) or '
            'consecutive numbers >= 1' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(w.si ORDER BY w.o), array_agg(w.rk ORDER BY w.o)
      INTO v_si, v_rk
      FROM (SELECT u.o, array_position(v_st, u.s)::int4 AS si,
                   (row_number() OVER (PARTITION BY u.s ORDER BY u.o))::int4 AS rk
              FROM unnest(stream_ids) WITH ORDINALITY AS u(s, o)) w;

    LOOP
        BEGIN
            SELECT * INTO v_res
              FROM pawl.append(v_st, v_ex, v_si, v_rk, types, payloads, metadata, true) a;
        EXCEPTION WHEN unique_violation THEN
            -- Another append took a sequence number between our look-up and our insert.
            v_try := v_try + 1;
            IF 0 < ANY (v_ex) THEN
                RAISE EXCEPTION 'pawl: a stream in this append is no longer at its expected '
                    'version (a concurrent append took its next sequence number)'
                    USING ERRCODE = 'PW001';
            END IF;
            IF current_setting('transaction_isolation') <> 'read committed' OR v_try >= 16 THEN
                RAISE EXCEPTION 'pawl_api.append: concurrent appends to the same stream; retry '
                    'the transaction' USING ERRCODE = 'serialization_failure';
            END IF;
            CONTINUE;
        END;
        EXIT;
    END LOOP;
    IF v_res.appended = 0 THEN
        SELECT min(i) INTO v_bad FROM generate_subscripts(v_st, 1) AS i
         WHERE v_ex[i] > 0 AND v_res.heads[i] <> v_ex[i] - 1;
        RAISE EXCEPTION 'pawl: stream "%" is at sequence %, expected %',
            v_st[v_bad], v_res.heads[v_bad], v_ex[v_bad] - 1
            USING ERRCODE = 'PW001',
                  DETAIL = format('stream_id=%s expected_last_seq=%s actual_last_seq=%s',
                                  v_st[v_bad], v_ex[v_bad] - 1, v_res.heads[v_bad]);
    END IF;
    RETURN QUERY
    SELECT u.s, v_res.heads[v_si[u.o]] + v_rk[u.o]
      FROM unnest(stream_ids) WITH ORDINALITY AS u(s, o)
     ORDER BY u.o;
END
$fn$;

-- Repair appends that a run covered while their transaction went on appending (the hole above).
DO $repair$
DECLARE
    b      record;
    total  int4;
    off    int4 := 0;
    tk     int8;
    fixed  int4 := 0;
BEGIN
    CREATE TEMP TABLE pawl_overcovered ON COMMIT DROP AS
    SELECT a.xid, a.n AS run_n, e.n AS all_n, e.ticket
      FROM pawl.runs r
     CROSS JOIN LATERAL unnest(r.xids, r.ns) AS a(xid, n)
      JOIN pawl.events e ON e.xid = a.xid AND e.k = 0
     WHERE e.n > a.n;
    SELECT sum(o.all_n - o.run_n), min(o.ticket) INTO total, tk FROM pawl_overcovered o;
    IF total IS NULL THEN
        RETURN;
    END IF;
    FOR b IN SELECT * FROM pawl_overcovered o ORDER BY o.ticket NULLS FIRST, o.xid LOOP
        UPDATE pawl.events e
           SET xid = pg_current_xact_id(), k = off + (e.k - b.run_n), n = total,
               ticket = CASE WHEN off + (e.k - b.run_n) = 0 THEN tk END
         WHERE e.xid = b.xid AND e.k >= b.run_n;
        off := off + (b.all_n - b.run_n);
        UPDATE pawl.events e SET n = b.run_n WHERE e.xid = b.xid AND e.k = 0;
        fixed := fixed + 1;
    END LOOP;
    RAISE WARNING 'pawl: % append(s) had events past the count their run recorded (a run that '
        'covered its caller''s own transaction); their % event(s) now wait for the next run',
        fixed, total;
END
$repair$;
