-- sql/native/activate.sql: point pawl.finalize, the functions of the runs_guard and
-- events_guard triggers, pawl_api.read, pawl_api.read_stream, pawl_api.read_filtered and
-- pawl.append at the native implementations (pawl_native.c, read_filtered.c, append.c) in a
-- database that has the pawl schema. Run as a superuser (a C function can only be declared by
-- one) after `make -C sql/native install`. CREATE OR REPLACE
-- keeps each function's owner and grants, and the trigger on pawl.runs keeps firing (only its
-- function's body changes). pawl.finalize stays SECURITY DEFINER with search_path pinned and needs
-- none of the SQL version's planner settings (it plans nothing); runs_guard needs no pinned
-- search_path (it names pawl.runs with its schema and evaluates nothing by name).
-- sql/native/deactivate.sql puts the SQL versions back. Both are online: a run in progress
-- finishes with the version it started with.
CREATE OR REPLACE FUNCTION pawl.finalize(max_appends int4 DEFAULT 2000)
RETURNS TABLE (appends int8, events int8, last_index int8)
LANGUAGE c VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS '$libdir/pawl_native', 'pawl_finalize';

CREATE OR REPLACE FUNCTION pawl.runs_guard() RETURNS trigger
LANGUAGE c
AS '$libdir/pawl_native', 'pawl_runs_guard';

-- pawl.events_guard, the statement trigger before every insert into pawl.events: the same check
-- in C (sql/009_retention.sql has the PL/pgSQL one). SECURITY DEFINER as before (it reads
-- pawl.log_guard with the owner's rights whoever inserts); no pinned search_path (it names the
-- sequence with its schema and evaluates nothing by name).
CREATE OR REPLACE FUNCTION pawl.events_guard() RETURNS trigger
LANGUAGE c STABLE SECURITY DEFINER
AS '$libdir/pawl_native', 'pawl_events_guard';

-- pawl_api.read, the unfiltered read: the same signature, rows, errors and rights. Not SECURITY
-- DEFINER, as before (the caller needs SELECT on pawl.events and pawl.runs); no SET clauses (it
-- plans nothing and looks nothing up through search_path), so CREATE OR REPLACE drops the SQL
-- version's planner settings and keeps its owner and grants.
CREATE OR REPLACE FUNCTION pawl_api.read(after_index int8, max_events int4 DEFAULT 1000)
RETURNS TABLE (global_index int8, stream_id text, stream_seq int8, type text, payload bytea,
               metadata jsonb, appended_at timestamptz, event_id text)
LANGUAGE c STABLE
AS '$libdir/pawl_native', 'pawl_read';

-- pawl_api.read_stream and pawl_api.read_filtered, the stream and filtered reads
-- (read_filtered.c): the same signatures, defaults, rows, errors and rights. SECURITY DEFINER as
-- before (a reader needs EXECUTE only: the reads are the owner's); no pinned search_path, as for
-- events_guard (they name every relation with its schema and evaluate nothing by name, so the
-- caller's search_path reaches nothing; the clause's save and restore was 7% of a 100-event
-- stream read). CREATE OR REPLACE drops the SQL versions' SET clauses and keeps their owner and
-- grants.
CREATE OR REPLACE FUNCTION pawl_api.read_stream(stream text, after_seq int8 DEFAULT 0,
                                                max_events int4 DEFAULT 1000)
RETURNS TABLE (global_index int8, stream_id text, stream_seq int8, type text, payload bytea,
               metadata jsonb, appended_at timestamptz, event_id text)
LANGUAGE c STABLE SECURITY DEFINER
AS '$libdir/pawl_native', 'pawl_read_stream';

CREATE OR REPLACE FUNCTION pawl_api.read_filtered(after_index int8, max_events int4 DEFAULT 1000,
                                                  categories text[] DEFAULT NULL,
                                                  stream_prefixes text[] DEFAULT NULL,
                                                  types text[] DEFAULT NULL)
RETURNS TABLE (global_index int8, stream_id text, stream_seq int8, type text, payload bytea,
               metadata jsonb, appended_at timestamptz, event_id text)
LANGUAGE c STABLE SECURITY DEFINER
AS '$libdir/pawl_native', 'pawl_read_filtered';

-- pawl.append and pawl.append_group, the appends: the C functions do the common appends
-- (sql/native/append.c) and hand every other call to the PL/pgSQL functions, which this block
-- keeps as pawl.append_sql and pawl.append_group_sql (renamed: their owner, grants, settings and
-- bodies stay as they are; deactivate.sql renames them back). A function that is not C (the SQL
-- one, or one a migration redefined while native) becomes the new *_sql; the C function gets
-- the owner and the EXECUTE grants the *_sql one has, and no more.
DO $append$
DECLARE
    f     record;
    cur   regprocedure;
    kept  regprocedure;
    r     record;
BEGIN
    FOR f IN SELECT * FROM (VALUES
        ('append', 'pawl_append',
         '(streams text[], expected int8[], si int4[], rank int4[], types text[], '
         'payloads bytea[], metas jsonb[], notify boolean, ids text[])',
         '(text[], int8[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[])'),
        ('append_group', 'pawl_append_group',
         '(streams text[], expected int8[], sa int4[], si int4[], rank int4[], types text[], '
         'payloads bytea[], metas jsonb[], notify boolean, ids text[])',
         '(text[], int8[], int4[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[])'))
        AS v(name, sym, params, sig)
    LOOP
        cur := to_regprocedure('pawl.' || f.name || f.sig);
        kept := to_regprocedure('pawl.' || f.name || '_sql' || f.sig);
        IF cur IS NULL THEN
            RAISE EXCEPTION 'pawl_native: the pawl schema has no pawl.%', f.name || f.sig
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        CONTINUE WHEN (SELECT l.lanname = 'c' FROM pg_catalog.pg_proc p
                         JOIN pg_catalog.pg_language l ON l.oid = p.prolang WHERE p.oid = cur);
        IF kept IS NOT NULL THEN
            EXECUTE format('DROP FUNCTION pawl.%I%s', f.name || '_sql', f.sig);
        END IF;
        EXECUTE format('ALTER FUNCTION pawl.%I%s RENAME TO %I', f.name, f.sig, f.name || '_sql');
        kept := to_regprocedure('pawl.' || f.name || '_sql' || f.sig);
        EXECUTE format('CREATE FUNCTION pawl.%I%s RETURNS TABLE (appended int4, txid text, '
                       'heads int8[], status text, seqs int8[], msg text) LANGUAGE c VOLATILE '
                       'SECURITY DEFINER SET search_path = pg_catalog, pg_temp '
                       'AS %L, %L', f.name, f.params, '$libdir/pawl_native', f.sym);
        EXECUTE format('ALTER FUNCTION pawl.%I%s OWNER TO %s', f.name, f.sig,
                       (SELECT p.proowner::regrole FROM pg_catalog.pg_proc p WHERE p.oid = kept));
        EXECUTE format('REVOKE ALL ON FUNCTION pawl.%I%s FROM PUBLIC', f.name, f.sig);
        FOR r IN SELECT a.grantee
                   FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
                  WHERE p.oid = kept AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
        LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION pawl.%I%s TO %s', f.name, f.sig,
                           CASE WHEN r.grantee = 0 THEN 'PUBLIC'
                                ELSE quote_ident(r.grantee::regrole::text) END);
        END LOOP;
    END LOOP;
END
$append$;

-- Durable runs (pawl_native.c): a run commits without a WAL flush of its own and is flushed at
-- its commit, within pawl.run_commit_wait, before its session goes on; meanwhile others may see
-- it, so whatever returns what runs assigned flushes the newest run it sees first. The C reads do
-- it themselves; pawl_api.runs_durable() does it for the SQL that returns indexes: last_index and
-- the events view (a condition without columns: evaluated once, before any row). It is in
-- pawl_api, whose functions whoever reads may execute (sql/roles/least_privilege.sql grants
-- them; a new function is executable by PUBLIC until that script says otherwise); it returns
-- true and shows nothing.
CREATE OR REPLACE FUNCTION pawl_api.runs_durable() RETURNS bool
LANGUAGE c STABLE PARALLEL RESTRICTED
AS '$libdir/pawl_native', 'pawl_runs_durable';

CREATE OR REPLACE FUNCTION pawl_api.last_index() RETURNS int8
LANGUAGE sql STABLE
SET enable_seqscan = off
AS $$ SELECT r.last_index FROM pawl.runs r WHERE pawl_api.runs_durable()
       ORDER BY r.last_index DESC LIMIT 1 $$;

CREATE OR REPLACE VIEW pawl_api.events AS
SELECT a.base + e.k AS global_index, e.stream_id, e.stream_seq, e.type, e.payload, e.metadata,
       e.appended_at, e.event_id
  FROM pawl.runs r
 CROSS JOIN LATERAL unnest(r.xids, r.bases, r.ns) AS a(xid, base, n)
  JOIN pawl.events e ON e.xid = a.xid AND e.k < a.n
 WHERE a.base + e.k >= (SELECT pawl_api.first_index()) AND pawl_api.runs_durable();
