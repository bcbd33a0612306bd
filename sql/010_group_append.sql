-- 010_group_append.sql: a group of appends in one statement (schema version 10).
--
-- The client library groups the appends that queue while earlier ones are in flight into one
-- transaction. Until now a group was one pawl.append statement per append: each a plpgsql call
-- with its own validation, its own look-up of the transaction's k = 0 row, its own insert and an
-- update of that row, about 130 µs of server time per one-event append against 13 µs for a
-- plain row. pawl.append_group does the same work once per group: one validation, one head
-- look-up per distinct stream, one insert, one k = 0 row.
--
-- Semantics are exactly those of the statements it replaces (docs/design.md, "Group append"):
-- the appends are taken in order; an append whose streams are not all at their expected
-- versions writes nothing and is reported with 0 (the others go on); appends to one stream get
-- their numbers in order; the group's events are one unit of the transaction (k contiguous in
-- event order, the k = 0 row holding the count and the ticket). The ticket is taken after the
-- statement that looked the heads up, so the ticket order proof holds as for pawl.append.

-- ---------------------------------------------------------------------------------------------
-- pawl.append: as in schema 9, except that each stream's ranks must be 1, 2, ... in event order.
-- Schema 6 checked only that they were 1..count in some order, so a caller could give a stream's
-- second event k = 0 and its first k = 1: the finalizer, which numbers a transaction's events in
-- k order, then gave sequence number 2 the lower index, breaking "index order = stream order"
-- for that stream. The C library always sent ranks in order.
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
    ELSIF EXISTS (SELECT 1
                    FROM (SELECT u.s, u.r, row_number() OVER (PARTITION BY u.s ORDER BY u.o) AS rn
                            FROM unnest(si, rank) WITH ORDINALITY AS u(s, r, o)) v
                   WHERE v.s IS NULL OR v.s < 1 OR v.s > v_m OR v.r IS DISTINCT FROM v.rn) THEN
        RAISE EXCEPTION 'pawl.append: every stream''s events must have ranks 1..count, in order'
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
-- pawl.append_group: as pawl.append, for several appends. The client concatenates the appends'
-- arrays: streams and expected hold every append's streams in order (a slot per append and
-- stream), sa each slot's append (1, 1, 2, 3, 3, ...: appends numbered from 1, each a run of
-- slots); si each event's slot (1-based into streams), rank its 1-based rank among its slot's
-- events; the events of each append follow those of the one before. One row per append, in
-- order: appended (its event count, or 0 when a stream was not at its expected version), txid,
-- heads (per slot of that append, its stream's last sequence number before the append).
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION pawl.append_group(streams text[], expected int8[], sa int4[], si int4[],
                                  rank int4[], types text[], payloads bytea[], metas jsonb[],
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

REVOKE ALL ON FUNCTION pawl.append_group(text[], int8[], int4[], int4[], int4[], text[], bytea[],
                                         jsonb[], boolean) FROM PUBLIC;

-- Whoever may append one at a time may append a group (roles set up by an earlier version of
-- sql/roles/least_privilege.sql hold EXECUTE on pawl.append).
DO $grant$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT a.grantee
               FROM pg_proc p, aclexplode(p.proacl) a
              WHERE p.oid = 'pawl.append'::regproc
                AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION pawl.append_group(text[], int8[], int4[], '
                       'int4[], int4[], text[], bytea[], jsonb[], boolean) TO %s',
                       r.grantee::regrole);
    END LOOP;
END
$grant$;
