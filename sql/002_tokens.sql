-- 002_tokens.sql: the processors' token store (schema version 2).
--
-- One row per (processor, segment): the segment's mask, its token (every event of the segment
-- up to this global index is handled), the highest token ever stored (a reset below it makes
-- the redelivered events replays), and the claim: owner (a node id) and claim time. A node may
-- claim a segment that is unowned, already its own, or whose claim is older than the claim
-- timeout; claims are extended on a timer. Claim times use the server's clock, so nodes on
-- different machines agree on ages.
--
-- Every token write goes through pawl.store_token, which is conditional on the writer still
-- owning the claim and raises SQLSTATE PW001 otherwise. A processor batch runs that call first
-- in the batch transaction, so a node whose claim was taken over has its whole batch (the
-- handlers' own statements included) rolled back, and the row lock it takes keeps anyone from
-- taking the claim until the batch has committed or rolled back.
--
-- A merge in progress keeps both positions: the merged row's token is the slower half's, and
-- (merge_id, merge_mask, merge_token) record that the faster half already handled its events up
-- to merge_token. Those are skipped, and the record clears itself once the token passes it.
--
-- Error codes raised here: PW001 claim lost, PW002 busy (claimed by another node; the message
-- names it), PW003 no such segment, PW004 invalid argument.

CREATE TABLE pawl.tokens (
    processor   text        NOT NULL,
    segment_id  int8        NOT NULL,
    mask        int8        NOT NULL,
    token       int8        NOT NULL,
    high_water  int8        NOT NULL,
    owner       text,
    claimed_at  timestamptz,
    mode        int2,
    merge_id    int8,
    merge_mask  int8,
    merge_token int8,
    CONSTRAINT tokens_pkey PRIMARY KEY (processor, segment_id),
    CONSTRAINT tokens_mask_check CHECK (mask >= 0 AND mask < 2147483648 AND (mask & (mask + 1)) = 0),
    CONSTRAINT tokens_id_check CHECK (segment_id >= 0 AND segment_id <= mask),
    CONSTRAINT tokens_token_check CHECK (token >= 0 AND high_water >= token),
    CONSTRAINT tokens_claim_check CHECK ((owner IS NULL) = (claimed_at IS NULL))
);

-- Nodes running a processor, for sharing segments fairly (a node that holds nothing yet still
-- counts). Refreshed with every claim extension.
CREATE TABLE pawl.processor_nodes (
    processor text        NOT NULL,
    node      text        NOT NULL,
    seen_at   timestamptz NOT NULL,
    CONSTRAINT processor_nodes_pkey PRIMARY KEY (processor, node)
);

-- Create n segments at token for proc unless it has segments already. Concurrent callers
-- serialize on a transaction advisory lock keyed by the processor, so exactly one set exists.
CREATE FUNCTION pawl.tokens_init(proc text, n int8, start_token int8) RETURNS int8
LANGUAGE plpgsql AS $fn$
DECLARE
    created int8;
BEGIN
    IF n < 1 OR n > 65536 OR (n & (n - 1)) <> 0 THEN
        RAISE EXCEPTION 'segment count % is not a power of two in 1..65536', n
            USING ERRCODE = 'PW004';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('pawl.tokens:' || proc, 0));
    IF EXISTS (SELECT 1 FROM pawl.tokens WHERE processor = proc) THEN
        RETURN 0;
    END IF;
    INSERT INTO pawl.tokens (processor, segment_id, mask, token, high_water)
    SELECT proc, g, n - 1, start_token, start_token FROM generate_series(0, n - 1) AS g;
    GET DIAGNOSTICS created = ROW_COUNT;
    RETURN created;
END
$fn$;

-- The conditional token write of a batch: token = max(token, new) if owner still holds the
-- claim, else PW001. new_token NULL only checks (and locks) the claim.
CREATE FUNCTION pawl.store_token(proc text, seg int8, me text, new_token int8) RETURNS int8
LANGUAGE plpgsql AS $fn$
DECLARE
    t int8;
BEGIN
    UPDATE pawl.tokens
       SET token = greatest(token, coalesce(new_token, token)),
           high_water = greatest(high_water, coalesce(new_token, token)),
           merge_id = CASE WHEN merge_token <= greatest(token, coalesce(new_token, token))
                           THEN NULL ELSE merge_id END,
           merge_mask = CASE WHEN merge_token <= greatest(token, coalesce(new_token, token))
                             THEN NULL ELSE merge_mask END,
           merge_token = CASE WHEN merge_token <= greatest(token, coalesce(new_token, token))
                              THEN NULL ELSE merge_token END
     WHERE processor = proc AND segment_id = seg AND owner = me
    RETURNING token INTO t;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'segment % of % is no longer claimed by %', seg, proc, me
            USING ERRCODE = 'PW001';
    END IF;
    RETURN t;
END
$fn$;

-- Raise PW002 unless the row is unowned or owned by me (me NULL: unowned only).
CREATE FUNCTION pawl.tokens_check_free(r pawl.tokens, me text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    IF r.owner IS NOT NULL AND r.owner IS DISTINCT FROM me THEN
        RAISE EXCEPTION 'segment % of % is claimed by % (claim age %)', r.segment_id,
            r.processor, r.owner, now() - r.claimed_at
            USING ERRCODE = 'PW002';
    END IF;
END
$fn$;

-- Split (id, m) into (id, 2m+1) and (id+m+1, 2m+1), both at the token. A pending merge ends:
-- the half that was ahead starts at its own position.
CREATE FUNCTION pawl.tokens_split(proc text, seg int8, me text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    r pawl.tokens;
    m int8;
BEGIN
    SELECT * INTO r FROM pawl.tokens WHERE processor = proc AND segment_id = seg FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no segment % in %', seg, proc USING ERRCODE = 'PW003';
    END IF;
    PERFORM pawl.tokens_check_free(r, me);
    IF r.mask >= 1073741823 THEN
        RAISE EXCEPTION 'segment % cannot be split further', seg USING ERRCODE = 'PW004';
    END IF;
    m := r.mask * 2 + 1;
    DELETE FROM pawl.tokens WHERE processor = proc AND segment_id = seg;
    INSERT INTO pawl.tokens (processor, segment_id, mask, token, high_water)
    VALUES (proc, seg, m,
            CASE WHEN r.merge_id = seg AND r.merge_mask = m THEN r.merge_token ELSE r.token END,
            greatest(r.high_water, coalesce(r.merge_token, 0))),
           (proc, seg + r.mask + 1, m,
            CASE WHEN r.merge_id = seg + r.mask + 1 AND r.merge_mask = m THEN r.merge_token
                 ELSE r.token END,
            greatest(r.high_water, coalesce(r.merge_token, 0)));
END
$fn$;

-- Merge seg with its sibling into their parent. The parent starts at the lower token and
-- remembers the faster half's position (nothing is redelivered). Refused while either half has
-- a merge of its own still catching up.
CREATE FUNCTION pawl.tokens_merge(proc text, seg int8, me text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    a pawl.tokens;
    b pawl.tokens;
    sib int8;
    fast pawl.tokens;
BEGIN
    SELECT * INTO a FROM pawl.tokens WHERE processor = proc AND segment_id = seg FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no segment % in %', seg, proc USING ERRCODE = 'PW003';
    END IF;
    IF a.mask = 0 THEN
        RAISE EXCEPTION 'segment % covers everything; nothing to merge with', seg
            USING ERRCODE = 'PW004';
    END IF;
    sib := seg # ((a.mask >> 1) + 1);
    SELECT * INTO b FROM pawl.tokens WHERE processor = proc AND segment_id = sib FOR UPDATE;
    IF NOT FOUND OR b.mask <> a.mask THEN
        RAISE EXCEPTION 'segment % has no sibling % of mask % (split further?)', seg, sib, a.mask
            USING ERRCODE = 'PW003';
    END IF;
    PERFORM pawl.tokens_check_free(a, me);
    PERFORM pawl.tokens_check_free(b, me);
    IF a.merge_token IS NOT NULL OR b.merge_token IS NOT NULL THEN
        RAISE EXCEPTION 'a merge into segment % or % is still catching up', seg, sib
            USING ERRCODE = 'PW002';
    END IF;
    fast := CASE WHEN a.token >= b.token THEN a ELSE b END;
    DELETE FROM pawl.tokens WHERE processor = proc AND segment_id IN (seg, sib);
    INSERT INTO pawl.tokens (processor, segment_id, mask, token, high_water, merge_id,
                             merge_mask, merge_token)
    VALUES (proc, seg & (a.mask >> 1), a.mask >> 1, least(a.token, b.token),
            greatest(a.high_water, b.high_water),
            CASE WHEN a.token <> b.token THEN fast.segment_id END,
            CASE WHEN a.token <> b.token THEN fast.mask END,
            CASE WHEN a.token <> b.token THEN fast.token END);
END
$fn$;

-- Move every segment of proc to new_token; refused (PW002, naming the owners) while any
-- segment is claimed.
CREATE FUNCTION pawl.tokens_reset(proc text, new_token int8) RETURNS int8
LANGUAGE plpgsql AS $fn$
DECLARE
    owners text;
    n int8;
BEGIN
    IF new_token < 0 THEN
        RAISE EXCEPTION 'token % is negative', new_token USING ERRCODE = 'PW004';
    END IF;
    PERFORM 1 FROM pawl.tokens WHERE processor = proc FOR UPDATE;
    SELECT string_agg(format('%s by %s (claim age %s)', segment_id, owner, now() - claimed_at),
                      ', ' ORDER BY segment_id)
      INTO owners FROM pawl.tokens WHERE processor = proc AND owner IS NOT NULL;
    IF owners IS NOT NULL THEN
        RAISE EXCEPTION 'processor % is running; claimed: %', proc, owners
            USING ERRCODE = 'PW002';
    END IF;
    UPDATE pawl.tokens
       SET token = new_token, high_water = greatest(high_water, new_token),
           merge_id = NULL, merge_mask = NULL, merge_token = NULL
     WHERE processor = proc;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$fn$;
