-- 009_retention.sql: retention of old events, on storage partitioned by transaction id
-- (schema version 9). The proofs are in docs/design.md, "Retention".
--
-- Storage. pawl.events becomes a table partitioned by RANGE (xid): closed partitions [lo, hi)
-- and one open partition [lo, MAXVALUE) that receives every new append. An event gets its final
-- index only later, through a run row, so no column fixed at insert follows index order; the
-- xid is the key because it is already in the primary key (xid, k), the finalizer's probes
-- (xid >= scan_xmax, xid = ANY (open_xids)) and the readers' join (xid = run entry) prune on it,
-- and a partition whose range lies below every running transaction is closed for good.
--
-- Rotation (pawl.rotate) closes the open partition at U, the oldest transaction running at that
-- moment (taken under an ACCESS EXCLUSIVE lock on pawl.events, so no append is mid-way): rows
-- with xid >= U move to a new open partition [U, MAXVALUE), the old one becomes [lo, U). No
-- transaction below U is running, so the closed partition never receives a row again.
--
-- Per-stream uniqueness. PostgreSQL cannot enforce UNIQUE (stream_id, stream_seq) across
-- partitions, so each partition has its own and the rest is proved: after a rotation or a drop
-- at transaction G, an append whose snapshot does not see G is refused with serialization_failure
-- (pawl.events_guard, a statement trigger that runs under the inserting statement's snapshot);
-- an append whose snapshot sees G sees every committed row of every closed partition (their xids
-- are all below U and completed before G), so its head look-up cannot return a sequence number
-- that a closed partition already holds, and concurrent appends both land in the open
-- partition, where its unique index arbitrates as before.
--
-- Retention (pawl.retention_drop) moves the log's start, the low-watermark W: reads after an
-- index below W - 1 fail with SQLSTATE PW020 naming W; every closed partition whose events all
-- have indexes below W (and are all finalized) is dropped whole, giving its space back; each
-- stream's last dropped sequence number is kept in pawl.stream_floors so appends continue the
-- stream. Events below W in partitions that are kept stay on disk, invisible, until a later
-- drop takes their partition. Run rows are kept (about 20 bytes per append). Indexes at and
-- above W are untouched. It is refused while a processor's token is below W - 1 (PW021) unless
-- forced.
--
-- The watermark and the guard live in sequences: readers and the guard read their current value
-- whatever their snapshot (a sequence is not transactional), and a session blocked by the drop's
-- lock reads the new value when it resumes.

-- ---------------------------------------------------------------------------------------------
-- Convert the existing table: it becomes the first partition, holding every xid.
-- ---------------------------------------------------------------------------------------------
ALTER TABLE pawl.events RENAME TO events_0001;
ALTER INDEX pawl.events_pkey RENAME TO events_0001_pkey;
ALTER TABLE pawl.events_0001 RENAME CONSTRAINT events_stream_key TO events_0001_stream_key;

CREATE TABLE pawl.events (LIKE pawl.events_0001 INCLUDING DEFAULTS INCLUDING CONSTRAINTS
                          INCLUDING STORAGE)
    PARTITION BY RANGE (xid);
ALTER TABLE pawl.events ADD CONSTRAINT events_pkey PRIMARY KEY (xid, k);
ALTER TABLE pawl.events ATTACH PARTITION pawl.events_0001 FOR VALUES FROM (MINVALUE) TO (MAXVALUE);

-- The table's rights move to the parent (what sql/roles/least_privilege.sql granted); the
-- partitions keep none but the owner's, so nobody reads around the watermark or writes at all.
DO $acl$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT a.grantee, a.privilege_type
               FROM pg_class c, aclexplode(c.relacl) a
              WHERE c.oid = 'pawl.events_0001'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON pawl.events TO %s', g.privilege_type,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END);
        EXECUTE format('REVOKE %s ON pawl.events_0001 FROM %s', g.privilege_type,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END);
    END LOOP;
END
$acl$;

-- The partitions, for the retention functions (the catalog holds the same bounds as text).
CREATE TABLE pawl.event_parts (
    relname text PRIMARY KEY,
    lo      xid8,           -- NULL: MINVALUE
    hi      xid8            -- NULL: MAXVALUE (the open partition)
);
INSERT INTO pawl.event_parts VALUES ('events_0001', NULL, NULL);
CREATE SEQUENCE pawl.event_part_no AS int8 START 2;

-- Each stream's highest dropped sequence number.
CREATE TABLE pawl.stream_floors (
    stream_id text COLLATE "C" PRIMARY KEY,
    last_seq  int8 NOT NULL
);

-- The first index the log still holds (1 until retention moves it).
CREATE SEQUENCE pawl.log_start AS int8 MINVALUE 1 START 1;
SELECT setval('pawl.log_start', 1, true);
-- The xid of the last rotation or drop (see the guard). 1 is below every transaction.
CREATE SEQUENCE pawl.log_guard AS int8 MINVALUE 1 START 1;
SELECT setval('pawl.log_guard', 1, true);
REVOKE ALL ON pawl.event_parts, pawl.event_part_no, pawl.log_start, pawl.log_guard FROM PUBLIC;

-- Refuses an insert whose snapshot predates the last rotation or drop. STABLE, so it runs under
-- the inserting statement's snapshot (the one its head look-up used), not a newer one.
CREATE FUNCTION pawl.events_guard() RETURNS trigger
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
REVOKE ALL ON FUNCTION pawl.events_guard() FROM PUBLIC;

CREATE TRIGGER events_guard BEFORE INSERT ON pawl.events
FOR EACH STATEMENT EXECUTE FUNCTION pawl.events_guard();

-- ---------------------------------------------------------------------------------------------
-- The SQL face: where the log starts; reads below it fail naming it.
-- ---------------------------------------------------------------------------------------------

-- The lowest index the log holds: 1, or the low-watermark set by retention. Indexes below it
-- were dropped (pawl_api.read after an index below first_index() - 1 fails, SQLSTATE PW020).
CREATE FUNCTION pawl_api.first_index() RETURNS int8
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_sequence_last_value('pawl.log_start'::regclass) $$;

CREATE OR REPLACE VIEW pawl_api.events AS
SELECT a.base + e.k AS global_index, e.stream_id, e.stream_seq, e.type, e.payload, e.metadata,
       e.appended_at
  FROM pawl.runs r
 CROSS JOIN LATERAL unnest(r.xids, r.bases) AS a(xid, base)
  JOIN pawl.events e ON e.xid = a.xid
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
        ON e.xid = a.xid AND e.k >= greatest(0, lo + 1 - a.base) AND e.k <= hi - a.base
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

-- A stream's last sequence number, dropped events included (0: no event yet).
CREATE FUNCTION pawl_api.stream_version(stream_id text) RETURNS int8
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT greatest(coalesce((SELECT e.stream_seq FROM pawl.events e
                               WHERE e.stream_id = $1 ORDER BY e.stream_seq DESC LIMIT 1), 0),
                    coalesce((SELECT f.last_seq FROM pawl.stream_floors f
                               WHERE f.stream_id = $1), 0))
$$;

-- ---------------------------------------------------------------------------------------------
-- pawl.append: as in schema 6, with the stream's head taken from its dropped events when the
-- log holds none of them any more. Same signature, same results.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pawl.append(streams text[], expected int8[], si int4[], rank int4[],
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

    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        SELECT e.n INTO v_off FROM pawl.events e
         WHERE e.xid = pg_current_xact_id() AND e.k = 0;
        v_off := coalesce(v_off, 0);
    END IF;

    -- As in schema 6; a stream continues from its highest dropped sequence number when the
    -- events it still holds are lower (or none).
    WITH x AS MATERIALIZED (
        SELECT pg_current_xact_id() AS id
    ), t AS MATERIALIZED (
        SELECT x.id, nextval('pawl.append_ticket'::regclass) AS tk FROM x
    ), h AS MATERIALIZED (
        SELECT h.i, h.s, h.q0,
               greatest(coalesce((SELECT e.stream_seq FROM pawl.events e
                                   WHERE e.stream_id = h.s
                                   ORDER BY e.stream_seq DESC LIMIT 1), 0),
                        coalesce((SELECT f.last_seq FROM pawl.stream_floors f
                                   WHERE f.stream_id = h.s), 0)) AS cur
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
        UPDATE pawl.events e SET n = v_off + v_n, ticket = v_tk
         WHERE e.xid = pg_current_xact_id() AND e.k = 0;
    END IF;
    IF v_cnt > 0 AND notify THEN
        PERFORM pg_notify('pawl_pending', '');
    END IF;
    RETURN QUERY SELECT v_cnt, pg_current_xact_id()::text, v_heads;
END
$fn$;

-- ---------------------------------------------------------------------------------------------
-- Operator functions (the schema owner runs them through `pawl retention`; no role is granted).
-- ---------------------------------------------------------------------------------------------

-- Close the open partition at the oldest running transaction; returns the new open partition's
-- name, or NULL when nothing could be closed (the oldest running transaction is not above the
-- open partition's start). Appends and reads wait for it: it scans the closed partition once
-- (to prove its range) and moves the rows of transactions at or above the boundary.
CREATE FUNCTION pawl.rotate() RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    p      pawl.event_parts%ROWTYPE;
    u      xid8;
    nname  text;
    cols   text := 'xid, stream_seq, appended_at, k, n, stream_id, type, payload, metadata, ticket';
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

-- Per partition: its xid range, the indexes of its finalized events (NULL when none), whether
-- every event it holds is finalized, its size, and whether a drop at watermark w takes it.
CREATE FUNCTION pawl.retention_plan(w int8)
RETURNS TABLE (relname text, lo xid8, hi xid8, min_index int8, max_index int8,
               events int8, finalized boolean, bytes int8, drops boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    last pawl.runs%ROWTYPE;
    p    pawl.event_parts%ROWTYPE;
BEGIN
    SELECT * INTO last FROM pawl.runs r ORDER BY r.last_index DESC LIMIT 1;
    FOR p IN SELECT * FROM pawl.event_parts ep ORDER BY ep.lo NULLS FIRST LOOP
        relname := p.relname;
        lo := p.lo;
        hi := p.hi;
        -- Closed (no transaction below hi runs), and no committed append in it lies where the
        -- next run would look (the finalizer's own probes): every append is finalized.
        EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM pawl.%I e WHERE e.k = 0 AND '
                       '(e.xid >= $1 OR e.xid = ANY ($2)))', p.relname)
           INTO finalized USING last.scan_xmax, last.open_xids;
        finalized := finalized AND p.hi IS NOT NULL;
        SELECT min(a.base), max(a.base + a.n - 1), sum(a.n)
          INTO min_index, max_index, events
          FROM pawl.runs r CROSS JOIN LATERAL unnest(r.xids, r.bases, r.ns) AS a(x, base, n)
         WHERE (p.lo IS NULL OR a.x >= p.lo) AND (p.hi IS NULL OR a.x < p.hi)
           AND r.last_index >= pawl_api.first_index();
        bytes := pg_total_relation_size(format('pawl.%I', p.relname)::regclass);
        drops := finalized AND (max_index IS NULL OR max_index < w);
        RETURN NEXT;
    END LOOP;
END
$fn$;

-- Move the log's start to w and drop every partition that lies wholly below it. Refused
-- (PW021) while a processor's token is below w - 1, unless force. Returns the dropped
-- partitions and their sizes.
CREATE FUNCTION pawl.retention_drop(w int8, force boolean DEFAULT false)
RETURNS TABLE (relname text, bytes int8)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    cur   int8;
    top   int8;
    slow  record;
    p     record;
BEGIN
    LOCK TABLE pawl.events IN ACCESS EXCLUSIVE MODE;
    cur := pawl_api.first_index();
    top := pawl_api.last_index();
    IF w IS NULL OR w < cur OR w > top + 1 THEN
        RAISE EXCEPTION 'pawl: the low-watermark must lie in % .. % (the log starts at % and '
            'ends at %), not %', cur, top + 1, cur, top, w
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT t.processor, min(t.token) AS token INTO slow
      FROM pawl.tokens t GROUP BY t.processor HAVING min(t.token) < w - 1
     ORDER BY min(t.token) LIMIT 1;
    IF FOUND AND NOT force THEN
        RAISE EXCEPTION 'pawl: processor "%" has a segment at token %, below the low-watermark '
            '% - 1: it would lose events', slow.processor, slow.token, w
            USING ERRCODE = 'PW021',
                  HINT = 'wait for it to catch up, delete or reset it, or force';
    END IF;
    FOR p IN SELECT * FROM pawl.retention_plan(w) x WHERE x.drops LOOP
        EXECUTE format('INSERT INTO pawl.stream_floors AS f (stream_id, last_seq) '
                       'SELECT e.stream_id, max(e.stream_seq) FROM pawl.%I e GROUP BY 1 '
                       'ON CONFLICT (stream_id) DO UPDATE SET last_seq = '
                       'greatest(f.last_seq, excluded.last_seq)', p.relname);
        EXECUTE format('DROP TABLE pawl.%I', p.relname);
        DELETE FROM pawl.event_parts ep WHERE ep.relname = p.relname;
        relname := p.relname;
        bytes := p.bytes;
        RETURN NEXT;
    END LOOP;
    PERFORM setval('pawl.log_guard', pg_current_xact_id()::text::int8, true);
    PERFORM setval('pawl.log_start', w, true);
END
$fn$;

REVOKE ALL ON FUNCTION pawl.rotate(), pawl.retention_plan(int8), pawl.retention_drop(int8, boolean)
    FROM PUBLIC;

COMMENT ON SCHEMA pawl_api IS
    'pawl event log, SQL interface v1: view events, read(after_index, max_events), '
    'first_index(), last_index(), stream_version(stream_id), append(...) and append_batch(...) '
    'in the caller''s transaction (conflict: SQLSTATE PW001), finalizer_holder(); reads below '
    'first_index() raise PW020; LISTEN pawl_log (payload: the new highest global index, decimal '
    'text)';
