-- sql/native/deactivate.sql: put the SQL versions back (the portable path) in a database where
-- activate.sql made pawl's functions native: pawl.finalize and pawl.runs_guard as
-- sql/017_finalize_fixes.sql defines them, pawl_api.read_filtered as
-- sql/018_category_runs.sql does, pawl.events_guard as
-- sql/009_retention.sql does, pawl_api.read as sql/015_event_ids.sql does and
-- pawl_api.read_stream as sql/016_filtered_reads.sql does, copied exactly
-- (pg_test_server_path and pg_test_native_read compare the result with a database that never
-- left the SQL path: a migration that changes any of them must change this file too).
-- CREATE OR REPLACE keeps owners and grants.
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
    lo      int8;
    hi      int8;
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

    -- Rows of at most max_appends appends (what a reader maps at once), contiguous. In int8:
    -- lo + max_appends - 1 passes int4's range when max_appends is near its top.
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

-- A native run whose commit is visible but not yet flushed (pawl_native.c, durable runs) holds
-- the finalizer's gate until its flush. With pawl.finalize SQL again (above: at once when this
-- file runs statement by statement; at the commit when pawl runs it in one transaction, which
-- then holds the gate to its end), taking the gate waits for such a run, so that the SQL reads
-- put back below, which do not flush, see only durable runs.
DO $$ BEGIN LOCK TABLE pawl_locks.finalizer IN EXCLUSIVE MODE; END $$;

CREATE OR REPLACE FUNCTION pawl.runs_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    prev int8;
    c    int4;
    bad  text;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION 'pawl.runs: rows are never updated or deleted'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    -- The readers subscript the arrays from 1 and unnest them side by side: each is empty or
    -- one-dimensional from subscript 1, without NULL elements (a NULL array is left to the NOT
    -- NULL constraints). Shapes first: array_position refuses arrays of more than one dimension.
    bad := CASE WHEN array_ndims(NEW.xids) > 1 OR array_lower(NEW.xids, 1) <> 1 THEN 'xids'
                WHEN array_ndims(NEW.bases) > 1 OR array_lower(NEW.bases, 1) <> 1 THEN 'bases'
                WHEN array_ndims(NEW.ns) > 1 OR array_lower(NEW.ns, 1) <> 1 THEN 'ns'
                WHEN array_ndims(NEW.open_xids) > 1 OR array_lower(NEW.open_xids, 1) <> 1
                    THEN 'open_xids' END;
    IF bad IS NULL THEN
        bad := CASE WHEN array_position(NEW.xids, NULL) IS NOT NULL THEN 'xids'
                    WHEN array_position(NEW.bases, NULL) IS NOT NULL THEN 'bases'
                    WHEN array_position(NEW.ns, NULL) IS NOT NULL THEN 'ns'
                    WHEN array_position(NEW.open_xids, NULL) IS NOT NULL THEN 'open_xids' END;
    END IF;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'pawl.runs: run % .. %: % must be a one-dimensional array from '
            'subscript 1 without NULL elements', NEW.first_index, NEW.last_index, bad
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

-- pawl.events_guard as sql/009_retention.sql defines it.
CREATE OR REPLACE FUNCTION pawl.events_guard() RETURNS trigger
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    g int8 := pg_sequence_last_value('pawl.log_guard'::regclass);
BEGIN
    IF g > 1 AND NOT pg_visible_in_snapshot(g::text::xid8, pg_current_snapshot()) THEN
        RAISE EXCEPTION 'pawl: the event log was rotated or truncated (transaction %) after this '
            'transaction''s snapshot was taken; retry the transaction', g
            USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN NULL;
END
$fn$;

-- pawl_api.read as sql/015_event_ids.sql defines it (CREATE OR REPLACE keeps its grants).
CREATE OR REPLACE FUNCTION pawl_api.read(after_index int8, max_events int4 DEFAULT 1000)
RETURNS TABLE (global_index int8, stream_id text, stream_seq int8, type text, payload bytea,
               metadata jsonb, appended_at timestamptz, event_id text)
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
           e.appended_at, e.event_id
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

-- pawl_api.read_filtered as sql/018_category_runs.sql defines it.
CREATE OR REPLACE FUNCTION pawl_api.read_filtered(after_index int8,
                                                  max_events int4 DEFAULT 1000,
                                                  categories text[] DEFAULT NULL,
                                                  stream_prefixes text[] DEFAULT NULL,
                                                  types text[] DEFAULT NULL)
RETURNS TABLE (global_index int8, stream_id text, stream_seq int8, type text, payload bytea,
               metadata jsonb, appended_at timestamptz, event_id text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET max_parallel_workers_per_gather = 0
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    lo     int8;          -- everything matching up to here was returned
    head   int8;          -- the highest final index at this read's snapshot
    wend   int8;          -- the window's end (a run's last index)
    xlo    xid8;
    xhi    xid8;
    late   xid8[];
    span   int8;
    looked int8 := 0;
    got    int4 := 0;
    cats   text[];        -- categories to range-scan (NULL: scan by type)
    pre    text[];        -- prefixes longer than a category
    rf     record;
    ev     record;
BEGIN
    IF after_index IS NULL OR after_index < 0 THEN
        RAISE EXCEPTION 'pawl_api.read_filtered: after_index must be >= 0'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_events IS NULL OR max_events < 1 OR max_events > 100000 THEN
        RAISE EXCEPTION 'pawl_api.read_filtered: max_events must be in 1..100000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- An empty list is a list not given, as in the C API.
    IF cardinality(categories) = 0 THEN
        categories := NULL;
    END IF;
    IF cardinality(stream_prefixes) = 0 THEN
        stream_prefixes := NULL;
    END IF;
    IF cardinality(types) = 0 THEN
        types := NULL;
    END IF;
    PERFORM pawl.filter_check('pawl_api.read_filtered', 'categories', categories);
    PERFORM pawl.filter_check('pawl_api.read_filtered', 'stream_prefixes', stream_prefixes);
    PERFORM pawl.filter_check('pawl_api.read_filtered', 'types', types);
    IF coalesce(cardinality(categories), 0) + coalesce(cardinality(stream_prefixes), 0)
       + coalesce(cardinality(types), 0) = 0 THEN
        RAISE EXCEPTION 'pawl_api.read_filtered: no filter (give categories, stream_prefixes '
            'or types; pawl_api.read reads the whole log)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pawl.refuse_below_watermark(after_index);

    -- What to range-scan: the categories, each prefix's category when the prefix reaches past
    -- it, and the categories a shorter prefix begins (found by skipping through the index).
    IF categories IS NOT NULL OR stream_prefixes IS NOT NULL THEN
        cats := coalesce(categories, '{}');
        pre := '{}';
        FOR ev IN SELECT DISTINCT v FROM unnest(stream_prefixes) v LOOP
            IF strpos(ev.v, '-') > 0 THEN
                cats := cats || split_part(ev.v, '-', 1);
                pre := pre || ev.v;
            ELSE
                cats := cats || ARRAY(
                    WITH RECURSIVE c(cat) AS (
                        SELECT (SELECT min(pawl.category(e.stream_id)) FROM pawl.events e
                                 WHERE pawl.category(e.stream_id) >= ev.v
                                   AND e.cat_run IS DISTINCT FROM 0)
                        UNION ALL
                        SELECT (SELECT min(pawl.category(e.stream_id)) FROM pawl.events e
                                 WHERE pawl.category(e.stream_id) > c.cat
                                   AND e.cat_run IS DISTINCT FROM 0)
                          FROM c
                         WHERE c.cat IS NOT NULL AND left(c.cat, length(ev.v)) = ev.v)
                    SELECT c.cat FROM c
                     WHERE c.cat IS NOT NULL AND left(c.cat, length(ev.v)) = ev.v);
            END IF;
        END LOOP;
        cats := ARRAY(SELECT DISTINCT v FROM unnest(cats) v);
    END IF;

    head := (SELECT r.last_index FROM pawl.runs r ORDER BY r.last_index DESC LIMIT 1);
    lo := after_index;
    span := greatest(4 * max_events::int8, 4096);
    -- Windows of runs, growing while they find little, until max_events are found, the head
    -- is reached, or 4 million indexes were looked at (the position row lets the caller go on).
    WHILE got < max_events AND lo < head AND looked < 4194304 LOOP
        SELECT r.first_index, r.scan_xmax INTO rf
          FROM pawl.runs r WHERE r.last_index > lo ORDER BY r.last_index LIMIT 1;
        SELECT r.last_index, r.scan_xmax INTO wend, xhi
          FROM pawl.runs r WHERE r.last_index >= least(lo + span, head)
         ORDER BY r.last_index LIMIT 1;
        SELECT r.scan_xmax, r.open_xids INTO xlo, late
          FROM pawl.runs r
         WHERE r.last_index < rf.first_index AND r.scan_xmax < rf.scan_xmax
         ORDER BY r.last_index DESC LIMIT 1;
        IF NOT FOUND THEN
            xlo := '0';
            late := '{}';
        END IF;
        FOR ev IN
            SELECT m.idx, e.stream_id, e.stream_seq, e.type, e.payload, e.metadata,
                   e.appended_at, e.event_id
              FROM (SELECT e.* FROM pawl.events h
                      JOIN pawl.events e
                        ON e.xid = h.xid AND e.k >= h.k AND e.k < h.k + coalesce(h.cat_run, 1)
                     WHERE cats IS NOT NULL AND pawl.category(h.stream_id) = ANY (cats)
                       AND h.cat_run IS DISTINCT FROM 0
                       AND h.xid >= xlo AND h.xid < xhi
                       AND (e.k = h.k OR e.cat_run = 0)
                    UNION ALL
                    SELECT e.* FROM pawl.events e
                     WHERE cats IS NULL AND e.xid >= xlo AND e.xid < xhi
                       AND e.type = ANY (types)
                    UNION ALL
                    SELECT e.* FROM pawl.events e
                     WHERE e.xid = ANY (late) AND e.xid < xlo) e
             CROSS JOIN LATERAL (SELECT r.bases[p.p] + e.k AS idx
                                  FROM pawl.runs r
                                 CROSS JOIN LATERAL array_position(r.xids, e.xid) AS p(p)
                                 WHERE r.scan_xmax > e.xid AND r.last_index <= wend
                                   AND p.p IS NOT NULL AND e.k < r.ns[p.p]
                                 ORDER BY r.scan_xmax, r.last_index
                                 LIMIT 1) m
             WHERE m.idx > lo AND m.idx <= wend
               AND (cats IS NULL
                    OR pawl.category(e.stream_id) = ANY (categories)
                    OR EXISTS (SELECT 1 FROM unnest(stream_prefixes) p(p)
                                WHERE left(e.stream_id, length(p.p)) = p.p))
               AND (types IS NULL OR e.type = ANY (types))
             ORDER BY m.idx
             LIMIT max_events - got
        LOOP
            global_index := ev.idx;
            stream_id := ev.stream_id;
            stream_seq := ev.stream_seq;
            type := ev.type;
            payload := ev.payload;
            metadata := ev.metadata;
            appended_at := ev.appended_at;
            event_id := ev.event_id;
            RETURN NEXT;
            got := got + 1;
            IF got = max_events THEN
                wend := ev.idx; -- the rest of the window is for the next read
            END IF;
        END LOOP;
        looked := looked + (wend - lo);
        lo := wend;
        IF got < max_events / 2 THEN
            span := least(span * 2, 1048576);
        END IF;
    END LOOP;
    -- A drop that committed after the look above: as in pawl_api.read.
    PERFORM pawl.refuse_below_watermark(after_index);
    -- The position row.
    global_index := lo;
    stream_id := NULL;
    stream_seq := NULL;
    type := NULL;
    payload := NULL;
    metadata := NULL;
    appended_at := NULL;
    event_id := NULL;
    RETURN NEXT;
END
$fn$;

-- pawl_api.read_stream as sql/016_filtered_reads.sql defines it.
CREATE OR REPLACE FUNCTION pawl_api.read_stream(stream text, after_seq int8 DEFAULT 0,
                                                max_events int4 DEFAULT 1000)
RETURNS TABLE (global_index int8, stream_id text, stream_seq int8, type text, payload bytea,
               metadata jsonb, appended_at timestamptz, event_id text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET max_parallel_workers_per_gather = 0
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_variable
DECLARE
    s    text COLLATE "C" := stream;
    fl   int8;
    head int8;
BEGIN
    IF s IS NULL OR s = '' THEN
        RAISE EXCEPTION 'pawl_api.read_stream: stream_id must not be NULL or empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF after_seq IS NULL OR after_seq < 0 THEN
        RAISE EXCEPTION 'pawl_api.read_stream: after_seq must be >= 0'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_events IS NULL OR max_events < 1 OR max_events > 100000 THEN
        RAISE EXCEPTION 'pawl_api.read_stream: max_events must be in 1..100000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT f.last_seq INTO fl FROM pawl.stream_floors f WHERE f.stream_id = s;
    IF fl IS NOT NULL AND after_seq < fl THEN
        RAISE EXCEPTION 'pawl: stream "%" starts at sequence number % (retention dropped the '
            'events below it); cannot read after %', s, fl + 1, after_seq
            USING ERRCODE = 'PW020',
                  DETAIL = format('stream_floor=%s after_seq=%s', fl, after_seq),
                  HINT = format('read the stream after %s, or reload the archive', fl);
    END IF;
    head := (SELECT r.last_index FROM pawl.runs r ORDER BY r.last_index DESC LIMIT 1);
    RETURN QUERY
    SELECT m.idx, e.stream_id::text, e.stream_seq, e.type, e.payload, e.metadata,
           e.appended_at, e.event_id::text
      FROM (SELECT e.* FROM pawl.events e
             WHERE e.stream_id = s AND e.stream_seq > after_seq
             ORDER BY e.stream_seq LIMIT max_events) e
     CROSS JOIN LATERAL (SELECT r.bases[p.p] + e.k AS idx
                                  FROM pawl.runs r
                                 CROSS JOIN LATERAL array_position(r.xids, e.xid) AS p(p)
                                 WHERE r.scan_xmax > e.xid AND r.last_index <= head
                                   AND p.p IS NOT NULL AND e.k < r.ns[p.p]
                                 ORDER BY r.scan_xmax, r.last_index
                                 LIMIT 1) m
     ORDER BY e.stream_seq;
END
$fn$;

-- pawl.append and pawl.append_group: activate.sql kept the PL/pgSQL functions as
-- pawl.append_sql and pawl.append_group_sql; they take their names back (their owner, grants,
-- settings and bodies never changed) and the C functions go.
DO $append$
DECLARE
    f     record;
    cur   regprocedure;
    kept  regprocedure;
BEGIN
    FOR f IN SELECT * FROM (VALUES
        ('append', '(text[], int8[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[])'),
        ('append_group',
         '(text[], int8[], int4[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[])'))
        AS v(name, sig)
    LOOP
        cur := to_regprocedure('pawl.' || f.name || f.sig);
        kept := to_regprocedure('pawl.' || f.name || '_sql' || f.sig);
        CONTINUE WHEN kept IS NULL;
        IF cur IS NOT NULL AND (SELECT l.lanname = 'c' FROM pg_catalog.pg_proc p
                                  JOIN pg_catalog.pg_language l ON l.oid = p.prolang
                                 WHERE p.oid = cur) THEN
            EXECUTE format('DROP FUNCTION pawl.%I%s', f.name, f.sig);
            cur := NULL;
        END IF;
        IF cur IS NULL THEN
            EXECUTE format('ALTER FUNCTION pawl.%I%s RENAME TO %I', f.name || '_sql', f.sig,
                           f.name);
        ELSE
            -- A migration redefined the function in SQL while native: that one is current.
            EXECUTE format('DROP FUNCTION pawl.%I%s', f.name || '_sql', f.sig);
        END IF;
    END LOOP;
END
$append$;

-- The SQL that returns indexes without the native flush: last_index as sql/001_log.sql defines
-- it, the events view as sql/015_event_ids.sql does; pawl_api.runs_durable() goes.
CREATE OR REPLACE FUNCTION pawl_api.last_index() RETURNS int8
LANGUAGE sql STABLE
SET enable_seqscan = off
AS $$ SELECT r.last_index FROM pawl.runs r ORDER BY r.last_index DESC LIMIT 1 $$;

CREATE OR REPLACE VIEW pawl_api.events AS
SELECT a.base + e.k AS global_index, e.stream_id, e.stream_seq, e.type, e.payload, e.metadata,
       e.appended_at, e.event_id
  FROM pawl.runs r
 CROSS JOIN LATERAL unnest(r.xids, r.bases, r.ns) AS a(xid, base, n)
  JOIN pawl.events e ON e.xid = a.xid AND e.k < a.n
 WHERE a.base + e.k >= (SELECT pawl_api.first_index());

DROP FUNCTION IF EXISTS pawl_api.runs_durable();
