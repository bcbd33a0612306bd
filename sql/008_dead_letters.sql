-- 008_dead_letters.sql: dead letters per stream for processors (schema version 8).
--
-- A processor with a dead-letter policy parks an event its handlers cannot handle (a handler
-- said it is poison, or it failed the policy's number of attempts) instead of retrying it
-- forever, and parks every later event of the same stream behind it, in order, while the other
-- streams of the segment flow on. A letter is a copy of the event (so letters outlive the log's
-- retention) with why and when it was parked.
--
--   * Parking is queued into the segment's batch transaction, behind pawl.store_token (which
--     checks the claim and locks the token row): the letters and the token that moves past them
--     commit together or not at all. A redelivered event is parked at most once (the primary key
--     and ON CONFLICT DO NOTHING), so a crash or a re-claim neither loses nor doubles a letter.
--   * Retrying a stream is a request (retry_requested_at); the node holding the stream's segment
--     hands the letters to its handlers in index order, in one transaction with
--     pawl.dead_letters_unpark, before any newer event of the stream. A failed retry counts an
--     attempt on the letter that failed (pawl.dead_letters_retry_failed) and keeps the stream
--     parked.
--   * Privileges follow 007_token_isolation.sql: every function is SECURITY DEFINER, checks
--     pawl.tokens_authorize(processor) first (42501 when the session's login is not granted
--     the processor), and the role pawl_processor gets EXECUTE only (sql/roles/). The functions
--     that a running node calls also check that the node holds the segment's claim (PW001).
--
-- stream_hash is pawl_stream_hash(stream_id) (MurmurHash3 x86_32, seed 0) as an unsigned
-- number, written by the processor: a segment (id, mask) owns the letters whose
-- (stream_hash & mask) = id, whatever splits and merges happened since they were parked.

CREATE TABLE pawl.dead_letters (
    processor       text        NOT NULL,
    stream_id       text        COLLATE "C" NOT NULL,
    global_index    int8        NOT NULL,
    stream_hash     int8        NOT NULL,
    segment_id      int8        NOT NULL,   -- the segment it was parked in (id, mask)
    segment_mask    int8        NOT NULL,
    stream_seq      int8        NOT NULL,
    type            text        NOT NULL,
    payload         bytea       NOT NULL,
    metadata        jsonb,
    appended_at     timestamptz,
    attempts        int4        NOT NULL,   -- handler attempts so far (retries count too)
    behind          int8,                   -- NULL: it failed itself; else the index of the
                                            -- stream's letter it was parked behind
    first_error     text,
    last_error      text,
    first_failed_at timestamptz,
    parked_at       timestamptz NOT NULL DEFAULT now(),
    retry_requested_at timestamptz,
    CONSTRAINT dead_letters_pkey PRIMARY KEY (processor, stream_id, global_index),
    CONSTRAINT dead_letters_hash_check CHECK (stream_hash BETWEEN 0 AND 4294967295),
    CONSTRAINT dead_letters_index_check CHECK (global_index >= 1)
);

-- The claim check of the node-side functions (the batch's store_token already holds the row
-- lock, so this costs one index probe).
CREATE FUNCTION pawl.dead_letters_check_claim(proc text, seg int8, me text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pawl.tokens t
                    WHERE t.processor = proc AND t.segment_id = seg AND t.owner = me) THEN
        RAISE EXCEPTION 'segment % of % is no longer claimed by %', seg, proc, me
            USING ERRCODE = 'PW001';
    END IF;
END
$fn$;

-- Park one event (a node, inside its batch transaction). Returns 1 when parked, 0 when it was
-- parked already (a redelivery).
CREATE FUNCTION pawl.dead_letters_park(proc text, seg int8, me text, stream text, idx int8,
                                       hash int8, seq int8, ev_type text, ev_payload bytea,
                                       ev_metadata jsonb, appended_us int8, n_attempts int4,
                                       behind_idx int8, first_err text, last_err text,
                                       first_failed_us int8)
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
         first_failed_at)
    VALUES (proc, stream, idx, hash, seg, m, seq, ev_type, coalesce(ev_payload, '\x'::bytea),
            ev_metadata,
            CASE WHEN appended_us > 0
                 THEN 'epoch'::timestamptz + appended_us * interval '1 microsecond' END,
            greatest(coalesce(n_attempts, 0), 0), behind_idx, left(first_err, 2000),
            left(last_err, 2000),
            CASE WHEN first_failed_us > 0
                 THEN 'epoch'::timestamptz + first_failed_us * interval '1 microsecond' END)
    ON CONFLICT (processor, stream_id, global_index) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$fn$;

-- The parked streams of segment (seg, mask): the first letter's index, the number of letters
-- and whether a retry was asked for.
CREATE FUNCTION pawl.dead_letters_segment(proc text, seg int8, seg_mask int8)
RETURNS TABLE (stream_id text, first_index int8, letters int8, retry bool)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_column
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    RETURN QUERY
    SELECT d.stream_id::text, min(d.global_index), count(*),
           bool_or(d.retry_requested_at IS NOT NULL)
      FROM pawl.dead_letters d
     WHERE d.processor = proc AND (d.stream_hash & seg_mask) = seg
     GROUP BY d.stream_id
     ORDER BY min(d.global_index);
END
$fn$;

-- A stream's letters in index order (stream NULL: every letter of proc), with the event.
CREATE FUNCTION pawl.dead_letters_show(proc text, stream text)
RETURNS TABLE (stream_id text, global_index int8, stream_seq int8, type text, payload bytea,
               metadata jsonb, appended_us int8, segment_id int8, segment_mask int8,
               attempts int4, behind int8, first_error text, last_error text,
               first_failed_us int8, parked_us int8, retry bool)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_column
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    RETURN QUERY
    SELECT d.stream_id::text, d.global_index, d.stream_seq, d.type, d.payload, d.metadata,
           (extract(epoch FROM d.appended_at) * 1000000)::int8, d.segment_id, d.segment_mask,
           d.attempts, d.behind, d.first_error, d.last_error,
           (extract(epoch FROM d.first_failed_at) * 1000000)::int8,
           (extract(epoch FROM d.parked_at) * 1000000)::int8, d.retry_requested_at IS NOT NULL
      FROM pawl.dead_letters d
     WHERE d.processor = proc AND (stream IS NULL OR d.stream_id = stream)
     ORDER BY d.stream_id, d.global_index;
END
$fn$;

-- Parked streams of proc: letters, first and last index, age of the oldest letter, the first
-- letter's attempts and last error, whether a retry is pending.
CREATE FUNCTION pawl.dead_letters_list(proc text)
RETURNS TABLE (stream_id text, letters int8, first_index int8, last_index int8, age_ms int8,
               attempts int4, last_error text, retry bool)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_column
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    RETURN QUERY
    SELECT d.stream_id::text, count(*), min(d.global_index), max(d.global_index),
           (extract(epoch FROM now() - min(d.parked_at)) * 1000)::int8,
           (array_agg(d.attempts ORDER BY d.global_index))[1],
           (array_agg(d.last_error ORDER BY d.global_index))[1],
           bool_or(d.retry_requested_at IS NOT NULL)
      FROM pawl.dead_letters d
     WHERE d.processor = proc
     GROUP BY d.stream_id
     ORDER BY min(d.global_index);
END
$fn$;

-- Totals of proc: letters, streams, age of the oldest letter in ms (-1 when none).
CREATE FUNCTION pawl.dead_letters_stats(proc text, OUT letters int8, OUT streams int8,
                                        OUT oldest_ms int8)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    SELECT count(*), count(DISTINCT d.stream_id),
           coalesce((extract(epoch FROM now() - min(d.parked_at)) * 1000)::int8, -1)
      INTO letters, streams, oldest_ms
      FROM pawl.dead_letters d
     WHERE d.processor = proc;
END
$fn$;

-- Ask for a retry of stream's letters; returns how many letters it covers (0: none parked).
CREATE FUNCTION pawl.dead_letters_retry(proc text, stream text) RETURNS int8
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    n int8;
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    UPDATE pawl.dead_letters d SET retry_requested_at = now()
     WHERE d.processor = proc AND d.stream_id = stream;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$fn$;

-- Drop stream's letters up to index up_to (NULL: all of them); returns how many. The events
-- are gone for this processor; later events of the stream are handled again once the node
-- holding its segment refreshes its parked streams (within claim_poll_ms).
CREATE FUNCTION pawl.dead_letters_drop(proc text, stream text, up_to int8) RETURNS int8
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    n int8;
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    IF stream IS NULL THEN
        RAISE EXCEPTION 'dropping dead letters needs a stream' USING ERRCODE = 'PW004';
    END IF;
    DELETE FROM pawl.dead_letters d
     WHERE d.processor = proc AND d.stream_id = stream
       AND (up_to IS NULL OR d.global_index <= up_to);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$fn$;

-- A retry succeeded (a node, in the transaction that handled the letters): un-park them.
CREATE FUNCTION pawl.dead_letters_unpark(proc text, seg int8, me text, stream text, up_to int8)
RETURNS int8
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    n int8;
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    PERFORM pawl.dead_letters_check_claim(proc, seg, me);
    DELETE FROM pawl.dead_letters d
     WHERE d.processor = proc AND d.stream_id = stream AND d.global_index <= up_to;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$fn$;

-- A retry failed on letter idx (a node): count the attempt, keep the error, clear the request.
CREATE FUNCTION pawl.dead_letters_retry_failed(proc text, seg int8, me text, stream text,
                                               idx int8, err text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    PERFORM pawl.dead_letters_check_claim(proc, seg, me);
    UPDATE pawl.dead_letters d
       SET attempts = d.attempts + CASE WHEN d.global_index = idx THEN 1 ELSE 0 END,
           last_error = CASE WHEN d.global_index = idx THEN left(err, 2000) ELSE d.last_error END,
           retry_requested_at = NULL
     WHERE d.processor = proc AND d.stream_id = stream;
END
$fn$;

REVOKE ALL ON pawl.dead_letters FROM PUBLIC;
REVOKE ALL ON FUNCTION pawl.dead_letters_check_claim(text, int8, text),
    pawl.dead_letters_park(text, int8, text, text, int8, int8, int8, text, bytea, jsonb, int8,
                           int4, int8, text, text, int8),
    pawl.dead_letters_segment(text, int8, int8), pawl.dead_letters_show(text, text),
    pawl.dead_letters_list(text), pawl.dead_letters_stats(text),
    pawl.dead_letters_retry(text, text), pawl.dead_letters_drop(text, text, int8),
    pawl.dead_letters_unpark(text, int8, text, text, int8),
    pawl.dead_letters_retry_failed(text, int8, text, text, int8, text) FROM PUBLIC;
