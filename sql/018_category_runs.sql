-- 018_category_runs.sql: the category index holds one entry per run of events of one category
-- in an append, not one per event (schema version 18).
--
-- The category index of schema 16 had an entry for every event: one more btree insert per
-- event, which made a 100-event native append cost about 1.3x one without the index (a
-- category's events arrive together: an append of one aggregate's events is all one stream).
-- Now a row can stand for the rows after it:
--
-- * cat_run IS NULL: the row stands alone in the index (every row written before this version,
--   and every row of a writer that does not group rows: the PL/pgSQL appends write NULL).
-- * cat_run = m >= 1: the row heads a run: it and the m - 1 rows of its transaction after it
--   (k + 1 .. k + m - 1) have its category, and those have cat_run = 0. (m = 1 is a row alone,
--   as NULL is; the native append writes NULL then, which takes no space in the row.)
-- * cat_run = 0: the row is in the run of a head of its transaction at a lower k, and has no
--   index entry of its own.
--
-- The index is partial (WHERE cat_run IS DISTINCT FROM 0): heads and lone rows. A reader of a
-- category takes each entry and, for a head, its run's other rows through the primary key
-- (xid, k); a follower counts only with cat_run = 0, so a run and the rows it names cannot
-- disagree into a row read twice. The native append (pawl_native 1.6) writes runs: consecutive
-- rows of one statement, k following k, of one category. Rows move between partitions only
-- with their whole transaction (pawl.rotate), so a run never straddles two partitions.
--
-- Building the new index reads the whole log under a lock that stops appends (about a second
-- per million events on a small machine), as schema 16's did: upgrade at a quiet moment.

ALTER TABLE pawl.events ADD COLUMN cat_run int4;
ALTER TABLE pawl.events
    ADD CONSTRAINT events_cat_run_check CHECK (cat_run >= 0) NOT VALID;

DROP INDEX pawl.events_category_idx;
CREATE INDEX events_category_idx ON pawl.events (pawl.category(stream_id), xid)
    WHERE cat_run IS DISTINCT FROM 0;

-- Rotation copies the run with the other columns. Otherwise as in schema 15.
CREATE OR REPLACE FUNCTION pawl.rotate() RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    p      pawl.event_parts%ROWTYPE;
    u      xid8;
    nname  text;
    cols   text := 'xid, stream_seq, appended_at, k, n, stream_id, type, payload, metadata, '
                   'ticket, event_id, cat_run';
BEGIN
    LOCK TABLE pawl.events IN ACCESS EXCLUSIVE MODE;
    SELECT * INTO STRICT p FROM pawl.event_parts WHERE hi IS NULL;
    -- The oldest transaction running now (ours has no xid yet, or one at or above it).
    u := pg_snapshot_xmin(pg_current_snapshot());
    IF p.lo IS NOT NULL AND u <= p.lo THEN
        RETURN NULL;
    END IF;
    nname := format('events_%s', lpad(nextval('pawl.event_part_no')::text, 4, '0'));
    EXECUTE format('ALTER TABLE pawl.events DETACH PARTITION pawl.%I', p.relname);
    EXECUTE format('CREATE TABLE pawl.%I (LIKE pawl.events INCLUDING DEFAULTS INCLUDING '
                   'CONSTRAINTS INCLUDING STORAGE, CONSTRAINT %I UNIQUE (stream_id, stream_seq))',
                   nname, nname || '_stream_key');
    EXECUTE format('CREATE UNIQUE INDEX %I ON pawl.%I (event_id) WHERE event_id IS NOT NULL',
                   nname || '_event_id_key', nname);
    EXECUTE format('ALTER TABLE pawl.events ATTACH PARTITION pawl.%I FOR VALUES FROM (%L) TO '
                   '(MAXVALUE)', nname, u);
    EXECUTE format('INSERT INTO pawl.events (%s) SELECT %s FROM pawl.%I WHERE xid >= %L',
                   cols, cols, p.relname, u);
    EXECUTE format('DELETE FROM pawl.%I WHERE xid >= %L', p.relname, u);
    EXECUTE format('ALTER TABLE pawl.%I ADD CONSTRAINT %I CHECK (%s xid < %L)', p.relname,
                   p.relname || '_range',
                   CASE WHEN p.lo IS NULL THEN '' ELSE format('xid >= %L AND', p.lo) END, u);
    EXECUTE format('ALTER TABLE pawl.events ATTACH PARTITION pawl.%I FOR VALUES FROM (%s) TO (%L)',
                   p.relname, coalesce(quote_literal(p.lo), 'MINVALUE'), u);
    UPDATE pawl.event_parts SET hi = u WHERE relname = p.relname;
    INSERT INTO pawl.event_parts VALUES (nname, u, NULL);
    PERFORM setval('pawl.log_guard', pg_current_xact_id()::text::int8, true);
    RETURN nname;
END
$fn$;

-- pawl_api.read_filtered as in schema 17, reading runs: each category's index entries in the
-- window are heads or lone rows, and a head brings the rows of its run. The discovery of the
-- categories under a short prefix names the index's predicate so that it can use the index.
-- Where read_filtered is the C function (pawl_native), this migration leaves it: the C one of
-- pawl_native 1.6 reads runs, and sql/native/deactivate.sql declares this text when the
-- database goes back to the SQL path. CREATE OR REPLACE keeps the owner and grants.
DO $migrate$
BEGIN
    IF (SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
         WHERE p.oid = 'pawl_api.read_filtered(int8, int4, text[], text[], text[])'::regprocedure)
       <> 'c' THEN
        EXECUTE $def$
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
$def$;
    END IF;
END
$migrate$;
