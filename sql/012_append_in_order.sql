-- 012_append_in_order.sql: pawl.append writes an append's rows in event order (schema
-- version 12).
--
-- Until now pawl.append inserted from a join of the events with the streams' heads, and the
-- plan's hash join handed the rows to the insert last event first. The rows got the right k and
-- sequence numbers, but both unique indexes ((xid, k) and (stream_id, stream_seq)) received
-- their entries in descending order, so every leaf split left half-empty pages: after 52,000
-- events in 100-event appends the two indexes took 2.87 and 2.72 MB instead of 1.65 and
-- 1.99 MB, and an append of 100 events cost about 1.6x a plain 100-row insert of the same rows
-- in server time instead of about 1.3x. Only multi-event appends made in one pawl.append call
-- (groups of one, pawl_append_in, pawl_api.append_batch) were affected: pawl.append_group
-- already inserted from one scan of its arrays.
--
-- The function now does what pawl.append_group does: the heads in one statement (snapshot S),
-- the expected versions checked in memory, then the xid and the ticket (both after S: the
-- ticket proof of docs/design.md is unchanged), then one insert from one scan of the arrays in
-- event order (stream sequence numbers and k ascending). A one-stream append checks its ranks
-- by comparing arrays instead of a window over the events. Inputs, checks, errors and results
-- are those of schema 10, except that arrays must now be one-dimensional and start at index 1
-- (the function reads them by subscript; the library and pawl_api always sent such arrays).
--
-- Indexes that grew under earlier schemas keep their empty space; REINDEX INDEX CONCURRENTLY on
-- a partition's index (pawl.events_NNNN_pkey, pawl.events_NNNN_stream_key) gives it back
-- without blocking appends.

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
    v_bad   boolean;
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

    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        SELECT e.n INTO v_off FROM pawl.events e
         WHERE e.xid = pg_current_xact_id() AND e.k = 0;
        v_off := coalesce(v_off, 0);
    END IF;

    -- The heads, under this statement's snapshot (S); a stream continues from its highest
    -- dropped sequence number when the events it still holds are lower (or none).
    SELECT array_agg(greatest(coalesce((SELECT e.stream_seq FROM pawl.events e
                                         WHERE e.stream_id = h.s
                                         ORDER BY e.stream_seq DESC LIMIT 1), 0),
                              coalesce((SELECT f.last_seq FROM pawl.stream_floors f
                                         WHERE f.stream_id = h.s), 0)) ORDER BY h.i)
      INTO v_heads
      FROM unnest(streams) WITH ORDINALITY AS h(s, i);
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
                                 ticket)
        SELECT pg_current_xact_id(), v_heads[u.si] + u.r, v_off + (u.o - 1)::int4, v_off + v_n,
               streams[u.si], u.ty, u.p,
               CASE WHEN metas IS NULL THEN NULL ELSE metas[u.o] END,
               CASE WHEN v_off = 0 AND u.o = 1 THEN v_tk END
          FROM unnest(si, rank, types, payloads) WITH ORDINALITY AS u(si, r, ty, p, o);
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
    RETURN QUERY SELECT v_cnt, pg_current_xact_id()::text, v_heads;
END
$fn$;
