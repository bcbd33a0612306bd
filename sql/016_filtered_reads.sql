-- 016_filtered_reads.sql: reading what you need (schema version 16): one stream's events, and
-- the log filtered by stream category, stream-id prefix and event type, evaluated in the server
-- with index support.
--
-- The final index of an event is not stored in its row (the finalizer writes one run row per
-- batch of appends, never the events): it is its append's base, found in the run that ordered
-- its transaction, plus its place in the append. An unfiltered read walks the runs in index
-- order and joins each append's rows. A filtered or stream read starts from the events instead
-- (through an index on what the filter selects) and finds each one's run:
--
-- * Which run holds transaction x. A run orders transactions that were complete at its
--   snapshot, and only those below the snapshot's xmax, kept as the run's scan_xmax; scan_xmax
--   never decreases from run to run. So the run holding x has scan_xmax > x, and it is the
--   first run in index order that does and lists x: walking the runs with scan_xmax > x in
--   order (index runs_scan_xmax_idx) usually stops at the first (x was new at that run) and
--   otherwise walks over the runs during which x was still running.
-- * Which events a window of runs can hold. For the runs with indexes in (lo, wend]: let P be
--   the last earlier run whose scan_xmax is below the window's first run's (the previous
--   finalization call: the rows of one call share scan_xmax and open_xids). Every transaction
--   the window orders is either at or above P's scan_xmax and below the window's last
--   scan_xmax (it was new), or was running at P's snapshot, so it is in P's open_xids (it was
--   late). A filtered read therefore range-scans (filter key, xid) over
--   [P.scan_xmax, last scan_xmax) and probes P's open_xids, then keeps the events whose final
--   index lies in the window. Transactions in the range that were not finalized in the window
--   (still running at its last snapshot, or ordered later) find no run in the window and are
--   dropped.
--
-- Both readers run as the schema's owner (SECURITY DEFINER, with a fixed search_path), so a
-- reader needs no right on pawl's helper functions; who may call them is decided by their own
-- rights, copied from pawl_api.read's at the end of this file.
--
-- A filtered read returns, after its events, one position row: stream_id NULL and
-- global_index the position up to which it looked. Every matching event with an index in
-- (after_index, position] was returned; the next read starts after the position. So a reader
-- of an idle category moves with the log's head, and a restart rescans nothing.
--
-- Stream reads follow the stream's sequence numbers. The final index order of a stream's events
-- is their sequence order (001_log.sql), so the finalized ones are a prefix of the stream: the
-- read stops at the first event not finalized yet.

-- A stream's category, message-db's convention: the stream id up to its first '-' (the whole
-- id when it has none). Immutable, so an index can hold it.
CREATE FUNCTION pawl.category(stream_id text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN pg_catalog.split_part(stream_id, '-', 1);

CREATE FUNCTION pawl_api.category(stream_id text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN pg_catalog.split_part(stream_id, '-', 1);

-- The category index leads with the category, then the transaction, so that a window of runs
-- is one range of it per category. It is what filters need on the write side: one more index
-- entry per event (measured in bench/results/filtered.txt). Event types have no index of their
-- own: a filter of types alone reads the window's events in the server (through events_pkey)
-- and sends only the matching ones; with categories or prefixes, types narrow the category
-- index's rows. The partitions get the index (rotation creates new partitions with the
-- parent's indexes). It is built under a lock that stops appends for as long as building takes
-- (about a second per million events on a small machine): upgrade at a quiet moment.
CREATE INDEX events_category_idx ON pawl.events (pawl.category(stream_id), xid);
CREATE INDEX runs_scan_xmax_idx ON pawl.runs (scan_xmax, last_index);

-- Checks the filter's arrays: NULL or non-empty elements (NULL elements and empty strings
-- select nothing and are refused), at most 1000 of each.
CREATE FUNCTION pawl.filter_check(fn text, what text, a text[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF a IS NULL THEN
        RETURN;
    END IF;
    IF array_ndims(a) > 1 OR cardinality(a) > 1000 THEN
        RAISE EXCEPTION '%: % must be a one-dimensional array of at most 1000 elements', fn, what
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(a) v WHERE v IS NULL OR v = '') THEN
        RAISE EXCEPTION '%: % may not contain NULL or empty strings', fn, what
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF what = 'categories' AND EXISTS (SELECT 1 FROM unnest(a) v WHERE strpos(v, '-') > 0) THEN
        RAISE EXCEPTION '%: category "%" contains ''-'' (a category is a stream id up to its '
            'first ''-''; use stream_prefixes for longer prefixes)', fn,
            (SELECT v FROM unnest(a) v WHERE strpos(v, '-') > 0 LIMIT 1)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

CREATE FUNCTION pawl_api.read_filtered(after_index int8, max_events int4 DEFAULT 1000,
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
    w      int8;
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
    w := pg_sequence_last_value('pawl.log_start'::regclass);
    IF after_index < w - 1 THEN
        RAISE EXCEPTION 'pawl: the log starts at index % (retention dropped the events below '
            'it); cannot read after index %', w, after_index
            USING ERRCODE = 'PW020',
                  DETAIL = format('low_watermark=%s after_index=%s', w, after_index),
                  HINT = format('read from index %s on (after %s), or reload the archive', w,
                                w - 1);
    END IF;

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
                                 WHERE pawl.category(e.stream_id) >= ev.v)
                        UNION ALL
                        SELECT (SELECT min(pawl.category(e.stream_id)) FROM pawl.events e
                                 WHERE pawl.category(e.stream_id) > c.cat)
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
              FROM (SELECT e.* FROM pawl.events e
                     WHERE cats IS NOT NULL AND pawl.category(e.stream_id) = ANY (cats)
                       AND e.xid >= xlo AND e.xid < xhi
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
    IF after_index < pg_sequence_last_value('pawl.log_start'::regclass) - 1 THEN
        w := pg_sequence_last_value('pawl.log_start'::regclass);
        RAISE EXCEPTION 'pawl: the log starts at index % (retention dropped the events below '
            'it); cannot read after index %', w, after_index
            USING ERRCODE = 'PW020',
                  DETAIL = format('low_watermark=%s after_index=%s', w, after_index),
                  HINT = format('read from index %s on (after %s), or reload the archive', w,
                                w - 1);
    END IF;
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

-- Up to max_events finalized events of one stream with stream_seq > after_seq, in order, with
-- their final indexes. The finalized events of a stream are a prefix of it, so the result is
-- consecutive (after_seq + 1, after_seq + 2, ...) and a later call never returns a sequence
-- number at or below one an earlier call returned.
CREATE FUNCTION pawl_api.read_stream(stream text, after_seq int8 DEFAULT 0,
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

-- ---------------------------------------------------------------------------------------------
-- A processor's filter is part of its definition: recorded when the processor is created, and
-- compared when a node starts it. Changing it is a reset (pawl.processor_filter_reset), since
-- positions reached under one filter say nothing about events only the other one selects.
-- ---------------------------------------------------------------------------------------------
CREATE TABLE pawl.processor_filters (
    processor  text COLLATE "C" PRIMARY KEY,
    filter     jsonb NOT NULL CHECK (jsonb_typeof(filter) = 'object'),
    defined_at timestamptz NOT NULL DEFAULT now()
);

-- Record proc's filter if it has none yet, and return the recorded one (the caller compares).
-- A processor whose segments exist without a recorded filter was created unfiltered (before
-- this version, or by a node without a filter that has not recorded it yet): '{}' is recorded
-- for it. f: the filter as canonical JSON ('{}': none).
CREATE FUNCTION pawl.processor_filter(proc text, f jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    r jsonb;
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    IF f IS NULL OR jsonb_typeof(f) <> 'object' THEN
        RAISE EXCEPTION 'pawl.processor_filter: the filter must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pawl.processor_filters AS p (processor, filter)
    VALUES (proc, CASE WHEN EXISTS (SELECT 1 FROM pawl.tokens t WHERE t.processor = proc)
                       THEN '{}'::jsonb ELSE f END)
    ON CONFLICT (processor) DO NOTHING;
    SELECT p.filter INTO r FROM pawl.processor_filters p WHERE p.processor = proc;
    RETURN r;
END
$fn$;

-- Change proc's filter and move its tokens to new_token in one transaction: refused while any
-- segment is claimed, as pawl.tokens_reset refuses. Returns the segments reset.
CREATE FUNCTION pawl.processor_filter_reset(proc text, f jsonb, new_token int8) RETURNS int8
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    n int8;
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    IF f IS NULL OR jsonb_typeof(f) <> 'object' THEN
        RAISE EXCEPTION 'pawl.processor_filter_reset: the filter must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    n := pawl.tokens_reset(proc, new_token);
    INSERT INTO pawl.processor_filters AS p (processor, filter) VALUES (proc, f)
    ON CONFLICT (processor) DO UPDATE SET filter = excluded.filter, defined_at = now();
    RETURN n;
END
$fn$;

-- proc's recorded filter (NULL: none recorded yet).
CREATE FUNCTION pawl.processor_filter_show(proc text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    RETURN (SELECT p.filter FROM pawl.processor_filters p WHERE p.processor = proc);
END
$fn$;

-- Whoever may run processors may call these (each checks pawl.tokens_authorize).
DO $acl$
DECLARE
    r record;
BEGIN
    REVOKE ALL ON FUNCTION pawl.processor_filter(text, jsonb) FROM PUBLIC;
    REVOKE ALL ON FUNCTION pawl.processor_filter_reset(text, jsonb, int8) FROM PUBLIC;
    REVOKE ALL ON FUNCTION pawl.processor_filter_show(text) FROM PUBLIC;
    FOR r IN SELECT a.grantee
               FROM pg_proc p, aclexplode(p.proacl) a
              WHERE p.oid = 'pawl.tokens_reset(text, int8)'::regprocedure
                AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION pawl.processor_filter(text, jsonb), '
                       'pawl.processor_filter_reset(text, jsonb, int8), '
                       'pawl.processor_filter_show(text) TO %s',
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE r.grantee::regrole::text END);
    END LOOP;
END
$acl$;

-- The new readers take pawl_api.read's rights: whoever may read the log may read it filtered.
DO $acl$
DECLARE
    r record;
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['pawl_api.read_filtered(int8, int4, text[], text[], text[])',
                             'pawl_api.read_stream(text, int8, int4)'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_proc p, aclexplode(coalesce(p.proacl,
                                                                    acldefault('f', p.proowner))) a
                        WHERE p.oid = 'pawl_api.read(int8, int4)'::regprocedure
                          AND a.grantee = 0 AND a.privilege_type = 'EXECUTE') THEN
            EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
        END IF;
        FOR r IN SELECT a.grantee
                   FROM pg_proc p, aclexplode(p.proacl) a
                  WHERE p.oid = 'pawl_api.read(int8, int4)'::regprocedure
                    AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
                    AND a.grantee <> 0 LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', f, r.grantee::regrole::text);
        END LOOP;
    END LOOP;
END
$acl$;
