-- 006_log_guarantees.sql: the log's guarantees under real use (schema version 6).
--
-- Contracts this version establishes (the proofs are in docs/design.md, "Append tickets"):
--
-- * Only pawl's functions write the log. Appends go through pawl.append (the C library) or
--   pawl_api.append (SQL, in the caller's transaction); runs through pawl.finalize. All three are
--   SECURITY DEFINER with search_path pinned to pg_catalog, pg_temp, and stamp what the caller
--   must not choose: the transaction id, each event's position k, the event count n and the
--   append ticket. sql/roles/least_privilege.sql grants no INSERT, UPDATE or DELETE on
--   pawl.events or pawl.runs to any role; the schema refuses rows no correct append or run
--   produces (n >= 1, 0 <= k < n, runs contiguous from the origin), even from the owner.
--
-- * Per-stream order for any transaction. Every append statement first makes sure the
--   transaction has an xid, then takes a ticket from pawl.append_ticket (CACHE 1: values are
--   handed out in real-time order), both after the statement's snapshot. A transaction's
--   ordering key is the ticket of its last append statement, kept on its k = 0 row. If append B
--   builds on append A (B's head lookup saw A's row), A committed before B's snapshot, so
--   key(A) < key(B), at every isolation level. A run orders the appends it finalizes by
--   (ticket NULLS FIRST, xid); NULL tickets belong to rows written before this version (the
--   ALTER TABLE below waited for every open appender, so none of them builds on a ticketed
--   append), and they keep the old xid order among themselves.
--
-- * Several appends in one transaction are one unit: k continues across the statements, and a
--   later statement updates the transaction's own (uncommitted, invisible to others) k = 0 row
--   with the total count so far and its new ticket. Every other row keeps an n > its k.
--
-- * A run finalizes everything completed at its snapshot, with no truncation: it writes one or
--   more pawl.runs rows of at most max_appends entries each, contiguous, in one transaction; each
--   row carries the run's horizon. Truncating by xid prefix is unsound once a transaction may
--   write before its append (a low xid can build on a higher one), and it made a backlog drain
--   one truncated run per wake-up.
--
-- * pawl.finalize refuses to run at an isolation level other than READ COMMITTED (its snapshot
--   must be taken after its lock). Its lock is an EXCLUSIVE lock on the empty table
--   pawl.finalizer_gate, which needs UPDATE/DELETE/TRUNCATE rights on it that no login gets (an
--   advisory key could be taken by anyone). pawl_api.finalizer_holder() names the session
--   holding it.
--
-- * pawl_api.append notifies channel pawl_pending (delivered at the caller's commit) so that
--   every process's finalizer runs at once. Conflicts on an explicit expected sequence raise
--   SQLSTATE PW001 naming the stream, the expected and the actual last sequence.

-- The ALTER TABLE takes an ACCESS EXCLUSIVE lock: it waits for every transaction that wrote
-- events before it, so rows with a NULL ticket all committed before any ticket was taken.
CREATE SEQUENCE pawl.append_ticket AS int8 CACHE 1 NO CYCLE;

ALTER TABLE pawl.events ADD COLUMN ticket int8;
-- An insert that does not go through pawl.append (an older library still connected while the
-- upgrade ran, a restore script) still gets a ticket taken after its statement's snapshot.
ALTER TABLE pawl.events ALTER COLUMN ticket SET DEFAULT nextval('pawl.append_ticket'::regclass);
ALTER TABLE pawl.events
    ADD CONSTRAINT events_n_check CHECK (n >= 1),
    ADD CONSTRAINT events_k_check CHECK (0 <= k AND k < n);

-- The finalizer's lock: never holds a row.
CREATE TABLE pawl.finalizer_gate ();
REVOKE ALL ON pawl.finalizer_gate FROM PUBLIC;

-- Runs are contiguous from the origin and never change. A trigger (not only finalize) so that a
-- direct insert by the owner that overlaps or skips indexes fails too.
CREATE FUNCTION pawl.runs_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    prev int8;
    c    int4;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION 'pawl.runs: rows are never updated or deleted'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    SELECT r.last_index INTO prev FROM pawl.runs r ORDER BY r.last_index DESC LIMIT 1;
    c := cardinality(NEW.xids);
    IF prev IS NULL THEN
        IF NEW.first_index <> 0 OR NEW.last_index <> 0 OR c <> 0 THEN
            RAISE EXCEPTION 'pawl.runs: the first row must be the origin (0, 0, no appends)'
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.first_index <> prev + 1 THEN
        RAISE EXCEPTION 'pawl.runs: a run must start at % (the last index + 1), not at %',
            prev + 1, NEW.first_index USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF c < 1 OR cardinality(NEW.bases) <> c OR cardinality(NEW.ns) <> c
       OR NEW.bases[1] <> NEW.first_index
       OR NEW.ns[c] < 1
       OR NEW.last_index <> NEW.bases[c] + NEW.ns[c] - 1 THEN
        RAISE EXCEPTION 'pawl.runs: run % .. % is not a contiguous list of appends',
            NEW.first_index, NEW.last_index USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END
$fn$;

CREATE TRIGGER runs_guard BEFORE INSERT OR UPDATE OR DELETE ON pawl.runs
FOR EACH ROW EXECUTE FUNCTION pawl.runs_guard();

-- ---------------------------------------------------------------------------------------------
-- pawl.append: the one append path (the C library calls it; pawl_api.append wraps it).
--
-- The client groups the events by stream: streams the distinct streams, expected each stream's
-- expected first sequence number (0 = ANY), and per event si its stream (1-based into streams),
-- rank its 1-based rank among that stream's events in this call, type, payload, metadata
-- (NULL = no metadata for any event). Returns appended (the number of events written: all of
-- them, or 0 when a stream is not at its expected version), txid (the transaction's xid, text)
-- and heads (each stream's last sequence number before this call: its events got head + rank).
-- notify: send pawl_pending at commit (appends whose process runs no finalizer of its own).
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION pawl.append(streams text[], expected int8[], si int4[], rank int4[],
                            types text[], payloads bytea[], metas jsonb[],
                            notify boolean DEFAULT false)
RETURNS TABLE (appended int4, txid text, heads int8[])
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $fn$
#variable_conflict use_column
DECLARE
    v_n     int4 := coalesce(cardinality(types), 0);
    v_m     int4 := coalesce(cardinality(streams), 0);
    v_off   int4 := 0;
    v_cnt   int4;
    v_tk    int8;
    v_heads int8[];
BEGIN
    IF v_n < 1 OR v_m < 1 OR v_m > v_n
       OR cardinality(expected) IS DISTINCT FROM v_m
       OR cardinality(si) IS DISTINCT FROM v_n
       OR cardinality(rank) IS DISTINCT FROM v_n
       OR cardinality(payloads) IS DISTINCT FROM v_n
       OR (metas IS NOT NULL AND cardinality(metas) <> v_n) THEN
        RAISE EXCEPTION 'pawl.append: array lengths do not match (% events, % streams)', v_n, v_m
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(expected, NULL) IS NOT NULL OR 0 > ANY (expected) THEN
        RAISE EXCEPTION 'pawl.append: expected sequence numbers must be >= 0 (0 = any)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Each stream's ranks must be exactly 1..its event count (the unique index refuses
    -- duplicates; this refuses gaps and events pointing at no stream).
    IF v_n = 1 THEN
        IF si[1] IS DISTINCT FROM 1 OR rank[1] IS DISTINCT FROM 1 THEN
            RAISE EXCEPTION 'pawl.append: the only event must be rank 1 of stream 1'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    ELSIF EXISTS (SELECT 1 FROM unnest(si, rank) AS u(s, r)
                   GROUP BY u.s
                  HAVING u.s IS NULL OR u.s < 1 OR u.s > v_m OR bool_or(u.r IS NULL)
                      OR min(u.r) <> 1 OR max(u.r) <> count(*)) THEN
        RAISE EXCEPTION 'pawl.append: every stream''s events must have ranks 1..count'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Events this transaction appended already (a later append in one transaction continues
    -- its k). No lookup when the transaction has no xid: then it wrote nothing yet.
    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        SELECT e.n INTO v_off FROM pawl.events e
         WHERE e.xid = pg_current_xact_id() AND e.k = 0;
        v_off := coalesce(v_off, 0);
    END IF;

    -- One statement, one snapshot: the heads are looked up under it, and the xid then the
    -- ticket are taken while it runs (x is read by t, so x is evaluated first), after it.
    WITH x AS MATERIALIZED (
        SELECT pg_current_xact_id() AS id
    ), t AS MATERIALIZED (
        SELECT x.id, nextval('pawl.append_ticket'::regclass) AS tk FROM x
    ), h AS MATERIALIZED (
        SELECT h.i, h.s, h.q0,
               coalesce((SELECT e.stream_seq FROM pawl.events e WHERE e.stream_id = h.s
                          ORDER BY e.stream_seq DESC LIMIT 1), 0) AS cur
          FROM unnest(streams, expected) WITH ORDINALITY AS h(s, q0, i)
    ), ins AS (
        INSERT INTO pawl.events (xid, stream_seq, k, n, stream_id, type, payload, metadata,
                                 ticket)
        SELECT t.id, h.cur + u.r, v_off + (u.o - 1)::int4, v_off + v_n, h.s, u.ty, u.p,
               CASE WHEN metas IS NULL THEN NULL ELSE metas[u.o] END,
               CASE WHEN v_off = 0 AND u.o = 1 THEN t.tk END
          FROM unnest(si, rank, types, payloads) WITH ORDINALITY AS u(si, r, ty, p, o)
          JOIN h ON h.i = u.si
         CROSS JOIN t
         WHERE NOT EXISTS (SELECT 1 FROM h WHERE h.q0 > 0 AND h.cur <> h.q0 - 1)
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM ins), (SELECT t.tk FROM t),
           (SELECT array_agg(h.cur ORDER BY h.i) FROM h)
      INTO v_cnt, v_tk, v_heads;

    IF v_cnt <> 0 AND v_cnt <> v_n THEN
        RAISE EXCEPTION 'pawl.append: wrote % of % events', v_cnt, v_n
            USING ERRCODE = 'internal_error';
    END IF;
    IF v_cnt > 0 AND v_off > 0 THEN
        -- The transaction's unit grows: its k = 0 row holds the total and the latest ticket.
        UPDATE pawl.events e SET n = v_off + v_n, ticket = v_tk
         WHERE e.xid = pg_current_xact_id() AND e.k = 0;
    END IF;
    IF v_cnt > 0 AND notify THEN
        PERFORM pg_notify('pawl_pending', '');
    END IF;
    RETURN QUERY SELECT v_cnt, pg_current_xact_id()::text, v_heads;
END
$fn$;

REVOKE ALL ON FUNCTION pawl.append(text[], int8[], int4[], int4[], text[], bytea[], jsonb[],
                                   boolean) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- pawl.finalize: as in version 1 (see 001_log.sql for the horizon), with the changes above.
-- ---------------------------------------------------------------------------------------------
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

-- ---------------------------------------------------------------------------------------------
-- The SQL face: additions only, so pawl_api.version() stays 1.
-- ---------------------------------------------------------------------------------------------

-- Append events in the caller's transaction; returns each event's stream sequence number, in
-- the order given. Per stream, expected_seqs are all NULL (ANY: append at the end) or the
-- consecutive numbers the events must get (the stream must end at the first one - 1). A stream
-- not at its expected version raises SQLSTATE PW001 naming it; an ANY append racing another
-- append to the same stream is retried at READ COMMITTED and raises serialization_failure
-- (40001, retry the transaction) at the other levels. Works at any isolation level, after other
-- writes, and several times in one transaction (the transaction's events are one unit). The
-- process finalizers are told at commit (NOTIFY pawl_pending).
CREATE FUNCTION pawl_api.append_batch(stream_ids text[], types text[], payloads bytea[],
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
                WHERE u.s IS NULL OR u.s = '' OR octet_length(u.s) > 200 OR u.t IS NULL
                   OR u.t = '' OR octet_length(u.t) > 200 OR u.p IS NULL) THEN
        RAISE EXCEPTION 'pawl_api.append: every event needs a stream_id and a type of 1..200 '
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

-- One event: returns its stream sequence number. expected_seq NULL = ANY.
CREATE FUNCTION pawl_api.append(stream_id text, type text, payload bytea,
                                metadata jsonb DEFAULT NULL, expected_seq int8 DEFAULT NULL)
RETURNS int8
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT a.stream_seq
      FROM pawl_api.append_batch(ARRAY[stream_id], ARRAY[type], ARRAY[payload], ARRAY[metadata],
                           ARRAY[expected_seq]) a
$$;

-- The session holding the finalizer's lock now (no row when none does). The columns
-- pg_stat_activity hides from the schema owner (without pg_read_all_stats) are NULL.
CREATE FUNCTION pawl_api.finalizer_holder()
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
       AND l.relation = 'pawl.finalizer_gate'::regclass
       AND l.mode = 'ExclusiveLock' AND l.granted
$$;

REVOKE ALL ON FUNCTION pawl.finalize(int4) FROM PUBLIC;
REVOKE ALL ON FUNCTION pawl_api.append_batch(text[], text[], bytea[], jsonb[], int8[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pawl_api.append(text, text, bytea, jsonb, int8) FROM PUBLIC;
REVOKE ALL ON FUNCTION pawl_api.finalizer_holder() FROM PUBLIC;

COMMENT ON SCHEMA pawl_api IS
    'pawl event log, SQL interface v1: view events, read(after_index, max_events), '
    'last_index(), append(...) and append_batch(...) in the caller''s transaction '
    '(conflict: SQLSTATE PW001), '
    'finalizer_holder(); LISTEN pawl_log (payload: the new highest global index, decimal text)';
