-- 015_event_ids.sql: an optional event id on every event, and appends that can be retried
-- (schema version 15).
--
-- An id is a client's string of 1..128 bytes without control characters (a UUID, or any key
-- the client derives from its own request). Every event of an append carries one, or none
-- does. The rule, the same on every path (pawl.append, pawl.append_group, pawl_api.*):
--
-- * No id of the append is in the log: the append runs as before, and the ids are stored.
-- * Every id is in the log, each for an event of the same stream, type and payload: the append
--   is a retry of one that committed. Nothing is written, no version is checked, and the
--   append returns the sequence numbers the events got then ("already appended").
-- * Otherwise (some ids there and some not, or an id there for another event) the append
--   fails naming the id, and writes nothing. A retry is of the whole append; writing the
--   missing part of a half-known append would split what the caller sent as one transaction.
--
-- Uniqueness. A unique index on a partitioned table must contain the partition key (xid), so
-- each partition has its own unique index on event_id (partial: rows without an id cost
-- nothing). Only the newest partition takes inserts: pawl.rotate closes a partition at the
-- oldest running transaction, so every transaction that wrote to a closed partition has
-- ended, and an id there is visible to every later append's look-up. Two appends racing with
-- the same id meet in the newest partition's index: the second waits for the first and gets
-- 23505, and the library runs it again, when it finds the ids (already appended). Ids live as
-- long as their events: once retention drops a partition, its ids may be appended again.

ALTER TABLE pawl.events ADD COLUMN event_id text COLLATE "C";
ALTER TABLE pawl.events
    ADD CONSTRAINT events_event_id_check
        CHECK (event_id IS NULL OR (octet_length(event_id) BETWEEN 1 AND 128
                                    AND event_id !~ '[\x01-\x1f\x7f]')) NOT VALID;

DO $idx$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT relname FROM pawl.event_parts LOOP
        EXECUTE format('CREATE UNIQUE INDEX %I ON pawl.%I (event_id) WHERE event_id IS NOT NULL',
                       p.relname || '_event_id_key', p.relname);
    END LOOP;
END
$idx$;

-- Rotation copies the id with the other columns and gives the new partition its id index.
-- Otherwise as in schema 9.
CREATE OR REPLACE FUNCTION pawl.rotate() RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    p      pawl.event_parts%ROWTYPE;
    u      xid8;
    nname  text;
    cols   text := 'xid, stream_seq, appended_at, k, n, stream_id, type, payload, metadata, '
                   'ticket, event_id';
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

-- The ids of one or several appends against the log: per append (numbered by `ap`, one entry
-- per event, in event order) its status: NULL (no id is in the log: write it), 'already' (a
-- committed retry: seqs are its events' numbers, in event order), 'again' (an id of it is also
-- in an earlier append of the same statement: run it again after this one commits) or 'id'
-- (msg says which id, and why it fails). Ids are checked for shape here too (a caller of
-- pawl.append is trusted with its arrays, not with the log's uniqueness).
CREATE FUNCTION pawl.ids_check(ids text[], ap int4[], streams text[], types text[],
                               payloads bytea[])
RETURNS TABLE (a int4, status text, seqs int8[], msg text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH u AS MATERIALIZED (
        SELECT t.o, t.id, ap[t.o] AS a,
               count(*) OVER (PARTITION BY t.id, ap[t.o]) AS dups,
               min(ap[t.o]) OVER (PARTITION BY t.id) AS first_a
          FROM unnest(ids) WITH ORDINALITY AS t(id, o)
         WHERE t.id IS NOT NULL
    ), f AS (
        SELECT u.o, u.a, u.id, u.dups, u.first_a, e.stream_id, e.stream_seq, e.type,
               e.stream_id IS NOT NULL AS found,
               e.stream_id = streams[u.o] AND e.type = types[u.o]
                   AND e.payload = payloads[u.o] AS same
          FROM u
          LEFT JOIN LATERAL (SELECT e.stream_id, e.stream_seq, e.type, e.payload
                               FROM pawl.events e WHERE e.event_id = u.id LIMIT 1) e ON true
    )
    SELECT f.a,
           CASE WHEN bool_or(f.first_a < f.a) THEN 'again'
                WHEN bool_or(f.dups > 1) THEN 'id'
                WHEN bool_and(f.found) AND bool_and(f.same) THEN 'already'
                WHEN bool_or(f.found) THEN 'id' END,
           CASE WHEN NOT bool_or(f.first_a < f.a) AND NOT bool_or(f.dups > 1)
                     AND bool_and(f.found) AND bool_and(f.same)
                THEN array_agg(f.stream_seq ORDER BY f.o) END,
           CASE WHEN bool_or(f.first_a < f.a) OR NOT (bool_or(f.found) OR bool_or(f.dups > 1))
                THEN NULL
                WHEN bool_or(f.dups > 1) THEN
                    format('event id "%s" appears twice in one append',
                           (array_agg(f.id ORDER BY f.o) FILTER (WHERE f.dups > 1))[1])
                WHEN bool_or(f.found AND NOT f.same) THEN
                    (array_agg(format('event id "%s" is already in the log for another event '
                                      '(stream "%s", sequence %s, type "%s"): ids are unique '
                                      'across the log', f.id, f.stream_id, f.stream_seq, f.type)
                               ORDER BY f.o) FILTER (WHERE f.found AND NOT f.same))[1]
                ELSE format('event id "%s" is already in the log (stream "%s", sequence %s) but '
                            'event id "%s" of the same append is not: an append with ids is '
                            'retried whole, never in part',
                            (array_agg(f.id ORDER BY f.o) FILTER (WHERE f.found))[1],
                            (array_agg(f.stream_id ORDER BY f.o) FILTER (WHERE f.found))[1],
                            (array_agg(f.stream_seq ORDER BY f.o) FILTER (WHERE f.found))[1],
                            (array_agg(f.id ORDER BY f.o) FILTER (WHERE NOT f.found))[1])
           END
      FROM f
     GROUP BY f.a;
END
$fn$;
REVOKE ALL ON FUNCTION pawl.ids_check(text[], int4[], text[], text[], bytea[]) FROM PUBLIC;

-- The shape of an ids array: one element per event, 1..128 bytes, no control characters; NULL
-- elements only where nulls_ok (a group's appends without ids). Raises naming the first bad id.
CREATE FUNCTION pawl.ids_shape(fn text, ids text[], n int4, nulls_ok boolean) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    bad text;
BEGIN
    IF cardinality(ids) IS DISTINCT FROM n OR array_ndims(ids) <> 1
       OR array_lower(ids, 1) <> 1 THEN
        RAISE EXCEPTION '%: event ids need one element per event (% events, % ids)', fn, n,
            coalesce(cardinality(ids), 0) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT nulls_ok AND array_position(ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION '%: every event of an append carries an id, or none does', fn
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT t.i INTO bad FROM unnest(ids) AS t(i)
     WHERE octet_length(t.i) NOT BETWEEN 1 AND 128 OR t.i ~ '[\x01-\x1f\x7f]'
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '%: event id "%" must have 1..128 bytes and no control characters', fn,
            left(regexp_replace(bad, '[\x01-\x1f\x7f]', '?', 'g'), 140)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT nulls_ok THEN
        SELECT t.i INTO bad FROM unnest(ids) AS t(i) GROUP BY t.i HAVING count(*) > 1 LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION '%: event id "%" appears twice in one append', fn, bad
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
END
$fn$;
REVOKE ALL ON FUNCTION pawl.ids_shape(text, text[], int4, boolean) FROM PUBLIC;

-- The append with ids: pawl.append of schema 12 with $9 ids (NULL: no ids), and three more
-- columns: status (NULL, 'already' or 'id', see pawl.ids_check), seqs (for 'already': every
-- event's number, in event order) and msg (for 'id'). An 'id' outcome is a row, not an
-- exception, so that a caller's own transaction (the outbox) stays usable, as after a
-- version conflict.
CREATE FUNCTION pawl.append(streams text[], expected int8[], si int4[], rank int4[],
                            types text[], payloads bytea[], metas jsonb[], notify boolean,
                            ids text[])
RETURNS TABLE (appended int4, txid text, heads int8[], status text, seqs int8[], msg text)
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
    v_bad   boolean;
    v_ist   text;
    v_isq   int8[];
    v_imsg  text;
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
    -- The arrays are read by subscript below: each must be one-dimensional and start at 1.
    IF array_ndims(streams) <> 1 OR array_lower(streams, 1) <> 1
       OR array_ndims(expected) <> 1 OR array_lower(expected, 1) <> 1
       OR array_ndims(si) <> 1 OR array_lower(si, 1) <> 1
       OR array_ndims(rank) <> 1 OR array_lower(rank, 1) <> 1
       OR array_ndims(types) <> 1 OR array_lower(types, 1) <> 1
       OR array_ndims(payloads) <> 1 OR array_lower(payloads, 1) <> 1
       OR array_ndims(metas) <> 1 OR array_lower(metas, 1) <> 1 THEN
        RAISE EXCEPTION 'pawl.append: arrays must be one-dimensional, starting at index 1'
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
    ELSIF v_m = 1 THEN
        -- One stream (the common case): every event is of slot 1 and the ranks are 1, 2, ...
        IF si <> array_fill(1, ARRAY[v_n])
           OR rank IS DISTINCT FROM ARRAY(SELECT generate_series(1, v_n)) THEN
            RAISE EXCEPTION 'pawl.append: every stream''s events must have ranks 1..count, in order'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    ELSIF EXISTS (SELECT 1
                    FROM (SELECT u.s, u.r, row_number() OVER (PARTITION BY u.s ORDER BY u.o) AS rn
                            FROM unnest(si, rank) WITH ORDINALITY AS u(s, r, o)) v
                   WHERE v.s IS NULL OR v.s < 1 OR v.s > v_m OR v.r IS DISTINCT FROM v.rn) THEN
        RAISE EXCEPTION 'pawl.append: every stream''s events must have ranks 1..count, in order'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Ids: in the common case (new ids) one look-up in the heads' statement below (the index
    -- of each partition); their shape is the table's check, an id twice in one append its
    -- unique index's (the library checks both first). Only ids found take the slow path that
    -- says which rule they meet.
    IF ids IS NOT NULL THEN
        IF cardinality(ids) IS DISTINCT FROM v_n OR array_position(ids, NULL) IS NOT NULL
           OR array_ndims(ids) <> 1 OR array_lower(ids, 1) <> 1 THEN
            PERFORM pawl.ids_shape('pawl.append', ids, v_n, false);
        END IF;
    END IF;

    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        SELECT e.n INTO v_off FROM pawl.events e
         WHERE e.xid = pg_current_xact_id() AND e.k = 0;
        v_off := coalesce(v_off, 0);
    END IF;

    -- The heads, under this statement's snapshot (S); a stream continues from its highest
    -- dropped sequence number when the events it still holds are lower (or none). With ids,
    -- whether any is in the log, under the same snapshot.
    SELECT (SELECT array_agg(greatest(coalesce((SELECT e.stream_seq FROM pawl.events e
                                                 WHERE e.stream_id = h.s
                                                 ORDER BY e.stream_seq DESC LIMIT 1), 0),
                                      coalesce((SELECT f.last_seq FROM pawl.stream_floors f
                                                 WHERE f.stream_id = h.s), 0)) ORDER BY h.i)
              FROM unnest(streams) WITH ORDINALITY AS h(s, i)),
           ids IS NOT NULL AND EXISTS (SELECT 1 FROM pawl.events e WHERE e.event_id = ANY (ids))
      INTO v_heads, v_bad;
    IF v_bad THEN
        PERFORM pawl.ids_shape('pawl.append', ids, v_n, false);
        SELECT c.status, c.seqs, c.msg INTO v_ist, v_isq, v_imsg
          FROM pawl.ids_check(ids, array_fill(1, ARRAY[v_n]),
                              ARRAY(SELECT streams[t.s] FROM unnest(si) WITH ORDINALITY AS t(s, o)
                                     ORDER BY t.o),
                              types, payloads) c;
        IF v_ist = 'already' THEN
            RETURN QUERY SELECT v_n, NULL::text, NULL::int8[], v_ist, v_isq, NULL::text;
            RETURN;
        ELSIF v_ist IS NOT NULL THEN
            RETURN QUERY SELECT 0, NULL::text, NULL::int8[], 'id'::text, NULL::int8[], v_imsg;
            RETURN;
        END IF;
        -- Not found a moment later (a racing append's ids rolled back): write them.
    END IF;
    v_cnt := 0;
    v_bad := false;
    FOR i IN 1..v_m LOOP
        IF expected[i] > 0 AND v_heads[i] <> expected[i] - 1 THEN
            v_bad := true;
        END IF;
    END LOOP;
    IF NOT v_bad THEN
        -- The xid, then the ticket: both after the heads' snapshot (the ticket proof).
        PERFORM pg_current_xact_id();
        v_tk := nextval('pawl.append_ticket'::regclass);
        -- One scan of the arrays, in event order: index entries go in ascending order.
        INSERT INTO pawl.events (xid, stream_seq, k, n, stream_id, type, payload, metadata,
                                 ticket, event_id)
        SELECT pg_current_xact_id(), v_heads[u.si] + u.r, v_off + (u.o - 1)::int4, v_off + v_n,
               streams[u.si], u.ty, u.p,
               CASE WHEN metas IS NULL THEN NULL ELSE metas[u.o] END,
               CASE WHEN v_off = 0 AND u.o = 1 THEN v_tk END, u.id
          FROM unnest(si, rank, types, payloads, ids) WITH ORDINALITY AS u(si, r, ty, p, id, o);
        GET DIAGNOSTICS v_cnt = ROW_COUNT;
    END IF;

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
    RETURN QUERY SELECT v_cnt, pg_current_xact_id()::text, v_heads, NULL::text, NULL::int8[],
                        NULL::text;
END
$fn$;
REVOKE ALL ON FUNCTION pawl.append(text[], int8[], int4[], int4[], text[], bytea[], jsonb[],
                                   boolean, text[]) FROM PUBLIC;

-- The schema-12 signature, for processes of the previous version still running: the same
-- function without ids.
CREATE OR REPLACE FUNCTION pawl.append(streams text[], expected int8[], si int4[], rank int4[],
                                       types text[], payloads bytea[], metas jsonb[],
                                       notify boolean DEFAULT false)
RETURNS TABLE (appended int4, txid text, heads int8[])
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT a.appended, a.txid, a.heads
      FROM pawl.append(streams, expected, si, rank, types, payloads, metas, notify, NULL) a
$fn$;

-- The group with ids: pawl.append_group of schema 13 with $10 ids (one per event; NULL for the
-- events of appends without ids, or NULL for none) and pawl.append's three more columns. An
-- append whose ids are all in the log is 'already' (its row: its event count, the numbers),
-- one that fails the id rule is 'id' (its row: 0, the message), one that shares an id with an
-- earlier append of the group is 'again' (its row: 0; the caller runs it alone after this
-- statement's transaction has ended). None of them is written or moves a head.
CREATE FUNCTION pawl.append_group(streams text[], expected int8[], sa int4[], si int4[],
                                  rank int4[], types text[], payloads bytea[], metas jsonb[],
                                  notify boolean, ids text[])
RETURNS TABLE (appended int4, txid text, heads int8[], status text, seqs int8[], msg text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $fn$
#variable_conflict use_column
DECLARE
    v_n   int4 := coalesce(cardinality(types), 0);   -- events
    v_m   int4 := coalesce(cardinality(streams), 0); -- slots
    v_a   int4;                                      -- appends
    v_off int4 := 0;     -- events the transaction appended before this statement
    v_bad boolean;
    v_c   int4[];        -- per slot: its events
    v_d   int4[];        -- per slot: its distinct stream
    v_cur int8[];        -- per distinct stream: its head, as the appends are taken in order
    v_hd  int8[];        -- per slot: its stream's head before its append
    v_w   int4[];        -- per append: events written (0: a conflict)
    v_na  int4[];        -- per append: its events
    v_kd  int4[];        -- per append: its event with ordinal o gets k = v_kd + o
    v_s0  int4[];        -- per append: its first and last slot
    v_s1  int4[];
    v_ist text[];        -- per append: its id status (pawl.ids_check), NULL: none
    v_isq text[];        -- per append: for 'already', its events' numbers
    v_imsg text[];       -- per append: for 'id', why
    v_tot int4 := 0;     -- events written
    v_o1  int4 := 1;     -- the ordinal of the current append's first event
    v_ne  int4;
    v_ok  boolean;
    v_tk  int8;
    j     int4 := 1;
    e     int4;
BEGIN
    IF v_n < 1 OR v_m < 1 OR v_m > v_n
       OR cardinality(expected) IS DISTINCT FROM v_m
       OR cardinality(sa) IS DISTINCT FROM v_m
       OR cardinality(si) IS DISTINCT FROM v_n
       OR cardinality(rank) IS DISTINCT FROM v_n
       OR cardinality(payloads) IS DISTINCT FROM v_n
       OR (metas IS NOT NULL AND cardinality(metas) <> v_n) THEN
        RAISE EXCEPTION 'pawl.append_group: array lengths do not match (% events, % slots)',
            v_n, v_m USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Several arrays are read by subscript below: each must be one-dimensional and start at 1.
    IF array_ndims(streams) <> 1 OR array_lower(streams, 1) <> 1
       OR array_ndims(expected) <> 1 OR array_lower(expected, 1) <> 1
       OR array_ndims(sa) <> 1 OR array_lower(sa, 1) <> 1
       OR array_ndims(si) <> 1 OR array_lower(si, 1) <> 1
       OR array_ndims(rank) <> 1 OR array_lower(rank, 1) <> 1
       OR array_ndims(types) <> 1 OR array_lower(types, 1) <> 1
       OR array_ndims(payloads) <> 1 OR array_lower(payloads, 1) <> 1
       OR array_ndims(metas) <> 1 OR array_lower(metas, 1) <> 1 THEN
        RAISE EXCEPTION 'pawl.append_group: arrays must be one-dimensional, starting at index 1'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(expected, NULL) IS NOT NULL OR 0 > ANY (expected) THEN
        RAISE EXCEPTION 'pawl.append_group: expected sequence numbers must be >= 0 (0 = any)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Appends numbered 1.. in slot order, each a run of slots.
    IF sa[1] IS DISTINCT FROM 1
       OR EXISTS (SELECT 1 FROM unnest(sa) WITH ORDINALITY AS t(a, j)
                   WHERE t.j > 1 AND (t.a IS NULL OR t.a - sa[t.j - 1] NOT IN (0, 1))) THEN
        RAISE EXCEPTION 'pawl.append_group: slots must belong to appends 1, 2, ... in order'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_a := sa[v_m];
    -- Every event points at a slot; a slot's ranks are 1, 2, ... in event order (so a stream's
    -- sequence numbers grow with k); an append's events follow the previous append's.
    SELECT bool_or(v.s IS NULL OR v.s < 1 OR v.s > v_m OR v.r IS DISTINCT FROM v.rn),
           bool_or(sa[v.s] < v.pa)
      INTO v_bad, v_ok
      FROM (SELECT u.s, u.r, row_number() OVER (PARTITION BY u.s ORDER BY u.o) AS rn,
                   lag(sa[u.s]) OVER (ORDER BY u.o) AS pa
              FROM unnest(si, rank) WITH ORDINALITY AS u(s, r, o)) v;
    IF v_bad THEN
        RAISE EXCEPTION 'pawl.append_group: every slot''s events must have ranks 1..count, in '
            'order' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_ok THEN
        RAISE EXCEPTION 'pawl.append_group: each append''s events must follow the previous '
            'append''s' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(c.n ORDER BY c.s) INTO v_c
      FROM (SELECT u.s, count(*)::int4 AS n FROM unnest(si) AS u(s) GROUP BY u.s) c;
    IF cardinality(v_c) <> v_m THEN
        RAISE EXCEPTION 'pawl.append_group: every slot must have an event'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Ids: as in pawl.append, one statement in the common case (new ids, none twice in the
    -- group); the slow path checks their shape and says what each append meets.
    IF ids IS NOT NULL AND cardinality(ids) IS DISTINCT FROM v_n THEN
        PERFORM pawl.ids_shape('pawl.append_group', ids, v_n, true);
    END IF;
    IF ids IS NOT NULL
       AND (EXISTS (SELECT 1 FROM pawl.events e WHERE e.event_id = ANY (ids))
            OR (SELECT count(DISTINCT t.i) <> count(t.i) FROM unnest(ids) AS t(i))) THEN
        PERFORM pawl.ids_shape('pawl.append_group', ids, v_n, true);
        IF EXISTS (SELECT 1 FROM unnest(si, ids) AS u(s, id) GROUP BY sa[u.s]
                   HAVING count(u.id) NOT IN (0, count(*))) THEN
            RAISE EXCEPTION 'pawl.append_group: every event of an append carries an id, or '
                'none does' USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT array_agg(c.status ORDER BY g.a), array_agg(c.seqs::text ORDER BY g.a),
               array_agg(c.msg ORDER BY g.a)
          INTO v_ist, v_isq, v_imsg
          FROM generate_series(1, v_a) AS g(a)
          LEFT JOIN pawl.ids_check(ids,
                                   ARRAY(SELECT sa[t.s] FROM unnest(si) WITH ORDINALITY AS t(s, o)
                                          ORDER BY t.o),
                                   ARRAY(SELECT streams[t.s]
                                           FROM unnest(si) WITH ORDINALITY AS t(s, o)
                                          ORDER BY t.o),
                                   types, payloads) c ON c.a = g.a;
    END IF;

    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        SELECT e.n INTO v_off FROM pawl.events e
         WHERE e.xid = pg_current_xact_id() AND e.k = 0;
        v_off := coalesce(v_off, 0);
    END IF;

    -- Each distinct stream's head, under this statement's snapshot (as pawl.append's).
    WITH sl AS MATERIALIZED (
        SELECT t.j, t.s, dense_rank() OVER (ORDER BY t.s COLLATE "C") AS dn
          FROM unnest(streams) WITH ORDINALITY AS t(s, j)
    )
    SELECT (SELECT array_agg(sl.dn::int4 ORDER BY sl.j) FROM sl),
           (SELECT array_agg(greatest(coalesce((SELECT e.stream_seq FROM pawl.events e
                                                 WHERE e.stream_id = d.s
                                                 ORDER BY e.stream_seq DESC LIMIT 1), 0),
                                      coalesce((SELECT f.last_seq FROM pawl.stream_floors f
                                                 WHERE f.stream_id = d.s), 0))
                             ORDER BY d.dn)
              FROM (SELECT DISTINCT ON (sl.dn) sl.dn, sl.s FROM sl ORDER BY sl.dn) d)
      INTO v_d, v_cur;

    -- The appends in order: each checks its expected versions against the heads the appends
    -- before it left, and moves them on when it is written.
    v_hd := array_fill(0::int8, ARRAY[v_m]);
    v_w := array_fill(0, ARRAY[v_a]);
    v_na := array_fill(0, ARRAY[v_a]);
    v_kd := array_fill(0, ARRAY[v_a]);
    v_s0 := array_fill(0, ARRAY[v_a]);
    v_s1 := array_fill(0, ARRAY[v_a]);
    FOR a IN 1..v_a LOOP
        e := j;
        WHILE e < v_m AND sa[e + 1] = a LOOP
            e := e + 1;
        END LOOP;
        v_s0[a] := j;
        v_s1[a] := e;
        v_ok := v_ist IS NULL OR v_ist[a] IS NULL;
        v_ne := 0;
        FOR i IN j..e LOOP
            v_hd[i] := v_cur[v_d[i]];
            v_ne := v_ne + v_c[i];
            IF expected[i] > 0 AND v_hd[i] <> expected[i] - 1 THEN
                v_ok := false;
            END IF;
        END LOOP;
        v_na[a] := v_ne;
        IF v_ok THEN
            FOR i IN j..e LOOP
                v_cur[v_d[i]] := v_cur[v_d[i]] + v_c[i];
            END LOOP;
            v_w[a] := v_ne;
            v_kd[a] := v_off + v_tot - v_o1;
            v_tot := v_tot + v_ne;
        END IF;
        v_o1 := v_o1 + v_ne;
        j := e + 1;
    END LOOP;

    IF v_tot > 0 THEN
        -- The xid, then the ticket: both after the heads' snapshot (the ticket proof).
        PERFORM pg_current_xact_id();
        v_tk := nextval('pawl.append_ticket'::regclass);
        INSERT INTO pawl.events (xid, stream_seq, k, n, stream_id, type, payload, metadata,
                                 ticket, event_id)
        SELECT pg_current_xact_id(), v_hd[u.s] + u.r, v_kd[sa[u.s]] + u.o::int4, v_off + v_tot,
               streams[u.s], u.ty, u.p, u.mt,
               CASE WHEN v_kd[sa[u.s]] + u.o = 0 THEN v_tk END, u.id
          FROM unnest(si, rank, types, payloads, metas, ids) WITH ORDINALITY
               AS u(s, r, ty, p, mt, id, o)
         WHERE v_w[sa[u.s]] > 0;
        IF v_off > 0 THEN
            UPDATE pawl.events e SET n = v_off + v_tot, ticket = v_tk
             WHERE e.xid = pg_current_xact_id() AND e.k = 0;
        END IF;
        IF notify THEN
            PERFORM pg_notify('pawl_pending', '');
        END IF;
    END IF;
    RETURN QUERY SELECT CASE WHEN v_ist[g.a] = 'already' THEN v_na[g.a] ELSE v_w[g.a] END,
                        pg_current_xact_id()::text, v_hd[v_s0[g.a]:v_s1[g.a]], v_ist[g.a],
                        v_isq[g.a]::int8[], v_imsg[g.a]
                   FROM generate_series(1, v_a) AS g(a);
END
$fn$;
REVOKE ALL ON FUNCTION pawl.append_group(text[], int8[], int4[], int4[], int4[], text[], bytea[],
                                         jsonb[], boolean, text[]) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pawl.append_group(streams text[], expected int8[], sa int4[],
                                             si int4[], rank int4[], types text[],
                                             payloads bytea[], metas jsonb[],
                                             notify boolean DEFAULT false)
RETURNS TABLE (appended int4, txid text, heads int8[])
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT a.appended, a.txid, a.heads
      FROM pawl.append_group(streams, expected, sa, si, rank, types, payloads, metas, notify,
                             NULL) a
$fn$;

-- Whoever may append (EXECUTE on the schema-12 pawl.append) may append with ids.
DO $grant$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT a.grantee
               FROM pg_proc p, aclexplode(p.proacl) a
              WHERE p.oid = 'pawl.append(text[], int8[], int4[], int4[], text[], bytea[], '
                            'jsonb[], boolean)'::regprocedure
                AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION pawl.append(text[], int8[], int4[], int4[], '
                       'text[], bytea[], jsonb[], boolean, text[]), pawl.append_group(text[], '
                       'int8[], int4[], int4[], int4[], text[], bytea[], jsonb[], boolean, '
                       'text[]) TO %s', r.grantee::regrole);
    END LOOP;
END
$grant$;

-- The SQL face gains the ids: pawl_api.append and append_batch take them (last, optional),
-- append_batch says which events were already appended, pawl_api.read and pawl_api.events
-- return them. A new column or argument needs a new function: the rights on the old ones are
-- given to the new ones as they were.
CREATE TEMP TABLE pawl_api_acl ON COMMIT DROP AS
SELECT p.proname::text AS fn, p.proacl IS NULL AS dflt, a.grantee
  FROM pg_proc p
  LEFT JOIN LATERAL aclexplode(p.proacl) a ON a.privilege_type = 'EXECUTE'
                                          AND a.grantee <> p.proowner
 WHERE p.pronamespace = 'pawl_api'::regnamespace
   AND p.proname IN ('append', 'append_batch', 'read');

DROP FUNCTION pawl_api.append(text, text, bytea, jsonb, int8);
DROP FUNCTION pawl_api.append_batch(text[], text[], bytea[], jsonb[], int8[]);
DROP FUNCTION pawl_api.read(int8, int4);

CREATE FUNCTION pawl_api.append_batch(stream_ids text[], types text[], payloads bytea[],
                                      metadata jsonb[] DEFAULT NULL,
                                      expected_seqs int8[] DEFAULT NULL,
                                      event_ids text[] DEFAULT NULL)
RETURNS TABLE (stream_id text, stream_seq int8, already boolean)
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
            'expected_seqs, event_ids when given) need the same number (>= 1) of elements'
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
    IF event_ids IS NOT NULL THEN
        PERFORM pawl.ids_shape('pawl_api.append', event_ids, v_n, false);
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
              FROM pawl.append(v_st, v_ex, v_si, v_rk, types, payloads, metadata, true,
                               event_ids) a;
        EXCEPTION WHEN unique_violation THEN
            -- Another append took a sequence number (or, with ids, one of our ids) between our
            -- look-up and our insert. With ids, the next look-up tells which.
            v_try := v_try + 1;
            IF 0 < ANY (v_ex) AND event_ids IS NULL THEN
                RAISE EXCEPTION 'pawl: a stream in this append is no longer at its expected '
                    'version (a concurrent append took its next sequence number)'
                    USING ERRCODE = 'PW001';
            END IF;
            IF current_setting('transaction_isolation') <> 'read committed' OR v_try >= 16 THEN
                RAISE EXCEPTION 'pawl_api.append: concurrent appends to the same stream (or with '
                    'the same event ids); retry the transaction'
                    USING ERRCODE = 'serialization_failure';
            END IF;
            CONTINUE;
        END;
        EXIT;
    END LOOP;
    IF v_res.status = 'id' THEN
        RAISE EXCEPTION 'pawl: %', v_res.msg USING ERRCODE = 'PW030';
    END IF;
    IF v_res.status = 'already' THEN
        RETURN QUERY
        SELECT u.s, v_res.seqs[u.o], true
          FROM unnest(stream_ids) WITH ORDINALITY AS u(s, o)
         ORDER BY u.o;
        RETURN;
    END IF;
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
    SELECT u.s, v_res.heads[v_si[u.o]] + v_rk[u.o], false
      FROM unnest(stream_ids) WITH ORDINALITY AS u(s, o)
     ORDER BY u.o;
END
$fn$;

CREATE FUNCTION pawl_api.append(stream_id text, type text, payload bytea,
                                metadata jsonb DEFAULT NULL, expected_seq int8 DEFAULT NULL,
                                event_id text DEFAULT NULL)
RETURNS int8
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT a.stream_seq
      FROM pawl_api.append_batch(ARRAY[stream_id], ARRAY[type], ARRAY[payload], ARRAY[metadata],
                                 ARRAY[expected_seq],
                                 CASE WHEN event_id IS NULL THEN NULL ELSE ARRAY[event_id] END) a
$fn$;

-- Readers: as in schema 14, with each event's id last.
CREATE OR REPLACE VIEW pawl_api.events AS
SELECT a.base + e.k AS global_index, e.stream_id, e.stream_seq, e.type, e.payload, e.metadata,
       e.appended_at, e.event_id
  FROM pawl.runs r
 CROSS JOIN LATERAL unnest(r.xids, r.bases, r.ns) AS a(xid, base, n)
  JOIN pawl.events e ON e.xid = a.xid AND e.k < a.n
 WHERE a.base + e.k >= (SELECT pawl_api.first_index());

CREATE FUNCTION pawl_api.read(after_index int8, max_events int4 DEFAULT 1000)
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

DO $acl$
DECLARE
    r record;
    sig text;
BEGIN
    FOR r IN SELECT DISTINCT t.fn, t.dflt FROM pawl_api_acl t LOOP
        sig := CASE r.fn
                   WHEN 'append' THEN 'pawl_api.append(text, text, bytea, jsonb, int8, text)'
                   WHEN 'append_batch'
                       THEN 'pawl_api.append_batch(text[], text[], bytea[], jsonb[], int8[], text[])'
                   ELSE 'pawl_api.read(int8, int4)' END;
        IF NOT r.dflt THEN
            EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', sig);
        END IF;
    END LOOP;
    FOR r IN SELECT t.fn, t.grantee FROM pawl_api_acl t WHERE t.grantee IS NOT NULL LOOP
        sig := CASE r.fn
                   WHEN 'append' THEN 'pawl_api.append(text, text, bytea, jsonb, int8, text)'
                   WHEN 'append_batch'
                       THEN 'pawl_api.append_batch(text[], text[], bytea[], jsonb[], int8[], text[])'
                   ELSE 'pawl_api.read(int8, int4)' END;
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', sig,
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE r.grantee::regrole::text END);
    END LOOP;
END
$acl$;

-- Dead letters keep their event's id: the park looks it up by the event's stream position (the
-- caller's arguments are unchanged, so processors of the previous version park as before), and
-- pawl.dead_letters_show returns it last. Otherwise as in schema 8.
ALTER TABLE pawl.dead_letters ADD COLUMN event_id text COLLATE "C";

CREATE OR REPLACE FUNCTION pawl.dead_letters_park(proc text, seg int8, me text, stream text,
                                                  idx int8, hash int8, seq int8, ev_type text,
                                                  ev_payload bytea, ev_metadata jsonb,
                                                  appended_us int8, n_attempts int4,
                                                  behind_idx int8, first_err text,
                                                  last_err text, first_failed_us int8)
RETURNS int4
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    n int4;
    m int8;
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    PERFORM pawl.dead_letters_check_claim(proc, seg, me);
    SELECT t.mask INTO m FROM pawl.tokens t WHERE t.processor = proc AND t.segment_id = seg;
    IF stream IS NULL OR idx IS NULL OR idx < 1 OR hash IS NULL OR hash < 0
       OR hash > 4294967295 OR (hash & m) <> seg THEN
        RAISE EXCEPTION 'dead letter % of stream % does not belong to segment % of %', idx,
            stream, seg, proc USING ERRCODE = 'PW004';
    END IF;
    INSERT INTO pawl.dead_letters AS d
        (processor, stream_id, global_index, stream_hash, segment_id, segment_mask, stream_seq,
         type, payload, metadata, appended_at, attempts, behind, first_error, last_error,
         first_failed_at, event_id)
    VALUES (proc, stream, idx, hash, seg, m, seq, ev_type, coalesce(ev_payload, '\x'::bytea),
            ev_metadata,
            CASE WHEN appended_us > 0
                 THEN 'epoch'::timestamptz + appended_us * interval '1 microsecond' END,
            greatest(coalesce(n_attempts, 0), 0), behind_idx, left(first_err, 2000),
            left(last_err, 2000),
            CASE WHEN first_failed_us > 0
                 THEN 'epoch'::timestamptz + first_failed_us * interval '1 microsecond' END,
            (SELECT e.event_id FROM pawl.events e WHERE e.stream_id = stream
                AND e.stream_seq = seq))
    ON CONFLICT (processor, stream_id, global_index) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$fn$;

CREATE TEMP TABLE pawl_dl_acl ON COMMIT DROP AS
SELECT a.grantee
  FROM pg_proc p, aclexplode(p.proacl) a
 WHERE p.oid = 'pawl.dead_letters_show(text, text)'::regprocedure
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner;
DROP FUNCTION pawl.dead_letters_show(text, text);
CREATE FUNCTION pawl.dead_letters_show(proc text, stream text)
RETURNS TABLE (stream_id text, global_index int8, stream_seq int8, type text, payload bytea,
               metadata jsonb, appended_us int8, segment_id int8, segment_mask int8,
               attempts int4, behind int8, first_error text, last_error text,
               first_failed_us int8, parked_us int8, retry bool, event_id text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_column
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    RETURN QUERY
    SELECT d.stream_id::text, d.global_index, d.stream_seq, d.type, d.payload, d.metadata,
           (extract(epoch FROM d.appended_at) * 1000000)::int8, d.segment_id, d.segment_mask,
           d.attempts, d.behind, d.first_error, d.last_error,
           (extract(epoch FROM d.first_failed_at) * 1000000)::int8,
           (extract(epoch FROM d.parked_at) * 1000000)::int8, d.retry_requested_at IS NOT NULL,
           d.event_id::text
      FROM pawl.dead_letters d
     WHERE d.processor = proc AND (stream IS NULL OR d.stream_id = stream)
     ORDER BY d.stream_id, d.global_index;
END
$fn$;
REVOKE ALL ON FUNCTION pawl.dead_letters_show(text, text) FROM PUBLIC;
DO $dlacl$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT t.grantee FROM pawl_dl_acl t LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION pawl.dead_letters_show(text, text) TO %s',
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE r.grantee::regrole::text END);
    END LOOP;
END
$dlacl$;
