-- 007_token_isolation.sql: processors are isolated from each other (schema version 7).
--
-- Before this version the token store's functions ran with the caller's rights, so a role that
-- could run one processor needed INSERT/UPDATE/DELETE on pawl.tokens and pawl.processor_nodes
-- and could therefore rewrite any processor's tokens and claims, or register fake nodes that
-- shrank another processor's fair shares. Now:
--
--   * pawl.processor_grants maps processors to roles. A role may touch a processor's rows (read
--     its segments, claim, extend, release, store tokens, register nodes, reset, split, merge)
--     only if the session's login is a member of a role granted that processor (or of one
--     granted '*'), or of the role that owns the pawl schema (the one that runs `pawl init`;
--     superusers are members of every role). The owner grants with
--         SELECT pawl.grant_processor('orders', 'orders_projector');
--     and takes it back with pawl.revoke_processor(processor, role).
--   * Every read and write of the token store goes through the SECURITY DEFINER functions below
--     (search_path pinned to pg_catalog, pg_temp; every pawl object schema-qualified). Each
--     checks the grant first (pawl.tokens_authorize; SQLSTATE 42501 when refused), so roles need
--     no rights on the tables at all (sql/roles/least_privilege.sql grants EXECUTE only).
--   * The caller is identified by session_user: inside a SECURITY DEFINER function current_user
--     is the function's owner, and a value the caller passes cannot be trusted. session_user is
--     the login (or what SET SESSION AUTHORIZATION, a superuser's tool, made it); SET ROLE does
--     not change it, which loses nothing: a login can always RESET ROLE back to its own rights.
--   * Claim and liveness times are the server's now(), never the caller's; a CHECK keeps
--     claimed_at and seen_at within a minute of the clock (a claim dated in the future would
--     never expire). Rows already dated further ahead are released / dropped here first.
--   * processor_nodes rows not refreshed for an hour (the longest claim timeout: no node counts
--     them any more) are deleted by every node's refresh, so nodes that crashed, each with an
--     instance id of its own, do not pile up.
--
-- Error codes: as in 002_tokens.sql (PW001..PW004), and 42501 for a processor not granted.

-- The processor -> role map. processor '*' grants every processor (operators, monitoring).
CREATE TABLE pawl.processor_grants (
    processor  text        NOT NULL,
    role       name        NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT processor_grants_pkey PRIMARY KEY (processor, role),
    CONSTRAINT processor_grants_processor_check
        CHECK (processor = '*' OR processor ~ '^[A-Za-z0-9_.:-]{1,63}$')
);

-- Claims dated in the future never expire: release them, then forbid them.
UPDATE pawl.tokens SET owner = NULL, claimed_at = NULL, mode = NULL
 WHERE claimed_at > now() + interval '1 minute';
DELETE FROM pawl.processor_nodes WHERE seen_at > now() + interval '1 minute';
ALTER TABLE pawl.tokens ADD CONSTRAINT tokens_claimed_at_check
    CHECK (claimed_at <= now() + interval '1 minute');
ALTER TABLE pawl.processor_nodes ADD CONSTRAINT processor_nodes_seen_at_check
    CHECK (seen_at <= now() + interval '1 minute');

-- Return if the session may use proc; raise 42501 otherwise.
CREATE FUNCTION pawl.tokens_authorize(proc text) RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF pg_catalog.pg_has_role(session_user,
                              (SELECT n.nspowner FROM pg_catalog.pg_namespace n
                                WHERE n.nspname = 'pawl'),
                              'MEMBER') THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1
                 FROM pawl.processor_grants g
                 JOIN pg_catalog.pg_roles r ON r.rolname = g.role
                WHERE (g.processor = proc OR g.processor = '*')
                  AND pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER')) THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'role % may not use processor %', session_user, proc
        USING ERRCODE = '42501',
              HINT = 'the owner of the pawl schema grants it: SELECT pawl.grant_processor('''
                     || proc || ''', ''<role>'')';
END
$fn$;

-- Owner-only administration of the map (EXECUTE is revoked from PUBLIC below, and the table
-- is the owner's: these run with the caller's rights).
CREATE FUNCTION pawl.grant_processor(proc text, grantee name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = grantee) THEN
        RAISE EXCEPTION 'role % does not exist', grantee USING ERRCODE = '42704';
    END IF;
    INSERT INTO pawl.processor_grants (processor, role) VALUES (proc, grantee)
        ON CONFLICT (processor, role) DO NOTHING;
END
$fn$;

CREATE FUNCTION pawl.revoke_processor(proc text, grantee name) RETURNS int8
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    n int8;
BEGIN
    DELETE FROM pawl.processor_grants WHERE processor = proc AND role = grantee;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$fn$;

-- Every row of proc, ordered by mask then id; age_ms -1 when unowned.
CREATE FUNCTION pawl.tokens_list(proc text)
RETURNS TABLE (segment_id int8, mask int8, token int8, high_water int8, owner text,
               age_ms int8, mode int2, merge_id int8, merge_mask int8, merge_token int8)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_column
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    RETURN QUERY
    SELECT t.segment_id, t.mask, t.token, t.high_water, t.owner,
           coalesce((extract(epoch FROM now() - t.claimed_at) * 1000)::int8, -1),
           t.mode, t.merge_id, t.merge_mask, t.merge_token
      FROM pawl.tokens t
     WHERE t.processor = proc
     ORDER BY t.mask, t.segment_id;
END
$fn$;

-- Claim seg for me if it is unowned, already me's, or its claim is older than timeout_ms.
-- One row: claimed and the row after the claim, or not claimed and the row as it is (its owner
-- holds it); no row: no such segment.
CREATE FUNCTION pawl.tokens_claim(proc text, seg int8, me text, timeout_ms int8, claim_mode int2)
RETURNS TABLE (claimed bool, segment_id int8, mask int8, token int8, high_water int8,
               owner text, age_ms int8, mode int2, merge_id int8, merge_mask int8,
               merge_token int8)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_column
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    IF me IS NULL OR me = '' OR timeout_ms IS NULL OR timeout_ms < 0 THEN
        RAISE EXCEPTION 'a claim needs an owner and a timeout >= 0' USING ERRCODE = 'PW004';
    END IF;
    RETURN QUERY
    UPDATE pawl.tokens t SET owner = me, claimed_at = now(), mode = claim_mode
     WHERE t.processor = proc AND t.segment_id = seg
       AND (t.owner IS NULL OR t.owner = me
            OR t.claimed_at < now() - timeout_ms * interval '1 millisecond')
    RETURNING true, t.segment_id, t.mask, t.token, t.high_water, t.owner, 0::int8, t.mode,
              t.merge_id, t.merge_mask, t.merge_token;
    IF NOT FOUND THEN
        RETURN QUERY
        SELECT false, t.segment_id, t.mask, t.token, t.high_water, t.owner,
               coalesce((extract(epoch FROM now() - t.claimed_at) * 1000)::int8, -1),
               t.mode, t.merge_id, t.merge_mask, t.merge_token
          FROM pawl.tokens t
         WHERE t.processor = proc AND t.segment_id = seg;
    END IF;
END
$fn$;

-- Record that node me of proc is alive, forget nodes silent for an hour, and refresh me's
-- claims on segs; returns the ids among segs that me still holds.
CREATE FUNCTION pawl.tokens_extend(proc text, me text, segs int8[]) RETURNS SETOF int8
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    IF me IS NULL OR me = '' THEN
        RAISE EXCEPTION 'a node needs an id' USING ERRCODE = 'PW004';
    END IF;
    INSERT INTO pawl.processor_nodes AS n (processor, node, seen_at) VALUES (proc, me, now())
        ON CONFLICT (processor, node) DO UPDATE SET seen_at = now();
    DELETE FROM pawl.processor_nodes n
     WHERE n.processor = proc AND n.seen_at < now() - interval '1 hour';
    IF segs IS NOT NULL AND cardinality(segs) > 0 THEN
        RETURN QUERY
        UPDATE pawl.tokens t SET claimed_at = now()
         WHERE t.processor = proc AND t.owner = me AND t.segment_id = ANY (segs)
        RETURNING t.segment_id;
    END IF;
END
$fn$;

-- Nodes of proc seen within timeout_ms other than me, and how many of them sort before me
-- (byte order).
CREATE FUNCTION pawl.nodes_live(proc text, me text, timeout_ms int8,
                                OUT others int8, OUT before_me int8)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    SELECT count(*), count(*) FILTER (WHERE n.node COLLATE "C" < me COLLATE "C")
      INTO others, before_me
      FROM pawl.processor_nodes n
     WHERE n.processor = proc AND n.node <> me
       AND n.seen_at > now() - timeout_ms * interval '1 millisecond';
END
$fn$;

-- Forget node me of proc (a clean stop).
CREATE FUNCTION pawl.nodes_leave(proc text, me text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    DELETE FROM pawl.processor_nodes n WHERE n.processor = proc AND n.node = me;
END
$fn$;

-- Clear the claim on seg if me holds it (no-op otherwise).
CREATE FUNCTION pawl.tokens_release(proc text, seg int8, me text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    UPDATE pawl.tokens t SET owner = NULL, claimed_at = NULL, mode = NULL
     WHERE t.processor = proc AND t.segment_id = seg AND t.owner = me;
END
$fn$;

-- The functions of 002_tokens.sql, now SECURITY DEFINER behind the grant check (same
-- behaviour otherwise).
CREATE OR REPLACE FUNCTION pawl.tokens_init(proc text, n int8, start_token int8) RETURNS int8
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    created int8;
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    IF proc IS NULL OR proc !~ '^[A-Za-z0-9_.:-]{1,63}$' THEN
        RAISE EXCEPTION 'processor name % is not 1..63 of [A-Za-z0-9_.:-]', proc
            USING ERRCODE = 'PW004';
    END IF;
    IF n < 1 OR n > 65536 OR (n & (n - 1)) <> 0 THEN
        RAISE EXCEPTION 'segment count % is not a power of two in 1..65536', n
            USING ERRCODE = 'PW004';
    END IF;
    IF start_token IS NULL OR start_token < 0 THEN
        RAISE EXCEPTION 'token % is negative', start_token USING ERRCODE = 'PW004';
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock(hashtextextended('pawl.tokens:' || proc, 0));
    IF EXISTS (SELECT 1 FROM pawl.tokens WHERE processor = proc) THEN
        RETURN 0;
    END IF;
    INSERT INTO pawl.tokens (processor, segment_id, mask, token, high_water)
    SELECT proc, g, n - 1, start_token, start_token FROM generate_series(0, n - 1) AS g;
    GET DIAGNOSTICS created = ROW_COUNT;
    RETURN created;
END
$fn$;

CREATE OR REPLACE FUNCTION pawl.store_token(proc text, seg int8, me text, new_token int8)
RETURNS int8
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    t int8;
BEGIN
    PERFORM pawl.tokens_authorize(proc);
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

CREATE OR REPLACE FUNCTION pawl.tokens_check_free(r pawl.tokens, me text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF r.owner IS NOT NULL AND r.owner IS DISTINCT FROM me THEN
        RAISE EXCEPTION 'segment % of % is claimed by % (claim age %)', r.segment_id,
            r.processor, r.owner, now() - r.claimed_at
            USING ERRCODE = 'PW002';
    END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION pawl.tokens_split(proc text, seg int8, me text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    r pawl.tokens;
    m int8;
BEGIN
    PERFORM pawl.tokens_authorize(proc);
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

CREATE OR REPLACE FUNCTION pawl.tokens_merge(proc text, seg int8, me text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    a pawl.tokens;
    b pawl.tokens;
    sib int8;
    fast pawl.tokens;
BEGIN
    PERFORM pawl.tokens_authorize(proc);
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

CREATE OR REPLACE FUNCTION pawl.tokens_reset(proc text, new_token int8) RETURNS int8
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    owners text;
    n int8;
BEGIN
    PERFORM pawl.tokens_authorize(proc);
    IF new_token IS NULL OR new_token < 0 THEN
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

-- SECURITY DEFINER functions are callable only by those granted (sql/roles/least_privilege.sql
-- grants the token functions to pawl_processor); the owner keeps every right.
REVOKE ALL ON FUNCTION pawl.tokens_authorize(text), pawl.grant_processor(text, name),
    pawl.revoke_processor(text, name), pawl.tokens_list(text),
    pawl.tokens_claim(text, int8, text, int8, int2), pawl.tokens_extend(text, text, int8[]),
    pawl.nodes_live(text, text, int8), pawl.nodes_leave(text, text),
    pawl.tokens_release(text, int8, text), pawl.tokens_init(text, int8, int8),
    pawl.store_token(text, int8, text, int8), pawl.tokens_split(text, int8, text),
    pawl.tokens_merge(text, int8, text), pawl.tokens_reset(text, int8) FROM PUBLIC;
