-- 013_group_array_shape.sql: pawl.append_group refuses arrays that are not one-dimensional
-- from index 1 (schema version 13).
--
-- pawl.append_group (schema 10) reads its streams, expected versions and slots by subscript
-- from 1. An array with other bounds slipped past it: an expected version passed as
-- '[2:2]={7}' read as NULL at index 1 and was not checked, so an append to a stream at
-- version 1 that expected version 7 was written instead of failing as a conflict. (The library
-- and pawl_api always send arrays from index 1; only direct SQL callers with the appender's
-- rights could send others.) pawl.append refuses such arrays since schema 12; the group
-- statement now does the same, with the same error (SQLSTATE 22023). Nothing else changes:
-- the body below is schema 10's with that one check added, and the function keeps its
-- privileges (CREATE OR REPLACE).

CREATE OR REPLACE FUNCTION pawl.append_group(streams text[], expected int8[], sa int4[],
                                             si int4[], rank int4[], types text[],
                                             payloads bytea[], metas jsonb[],
                                             notify boolean DEFAULT false)
RETURNS TABLE (appended int4, txid text, heads int8[])
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
    v_kd  int4[];        -- per append: its event with ordinal o gets k = v_kd + o
    v_s0  int4[];        -- per append: its first and last slot
    v_s1  int4[];
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
        v_ok := true;
        v_ne := 0;
        FOR i IN j..e LOOP
            v_hd[i] := v_cur[v_d[i]];
            v_ne := v_ne + v_c[i];
            IF expected[i] > 0 AND v_hd[i] <> expected[i] - 1 THEN
                v_ok := false;
            END IF;
        END LOOP;
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
                                 ticket)
        SELECT pg_current_xact_id(), v_hd[u.s] + u.r, v_kd[sa[u.s]] + u.o::int4, v_off + v_tot,
               streams[u.s], u.ty, u.p, u.mt,
               CASE WHEN v_kd[sa[u.s]] + u.o = 0 THEN v_tk END
          FROM unnest(si, rank, types, payloads, metas) WITH ORDINALITY AS u(s, r, ty, p, mt, o)
         WHERE v_w[sa[u.s]] > 0;
        IF v_off > 0 THEN
            UPDATE pawl.events e SET n = v_off + v_tot, ticket = v_tk
             WHERE e.xid = pg_current_xact_id() AND e.k = 0;
        END IF;
        IF notify THEN
            PERFORM pg_notify('pawl_pending', '');
        END IF;
    END IF;
    RETURN QUERY SELECT v_w[g.a], pg_current_xact_id()::text, v_hd[v_s0[g.a]:v_s1[g.a]]
                   FROM generate_series(1, v_a) AS g(a);
END
$fn$;
