-- least_privilege.sql: roles for running pawl with only the rights each part needs.
--
-- Not a migration (it lives outside sql/*.sql, so `pawl init` never applies it). Run it once per
-- database, after `pawl init`, as the role that owns the pawl schema (the one that ran init):
--
--   psql "$OWNER_DSN" -v ON_ERROR_STOP=1 -f sql/roles/least_privilege.sql
--   CREATE ROLE orders_api LOGIN PASSWORD '...' IN ROLE pawl_appender;
--   CREATE ROLE orders_projector LOGIN PASSWORD '...' IN ROLE pawl_processor;
--   SELECT pawl.grant_processor('orders', 'orders_projector');   -- as the owner, per processor
--
-- and run it again after each `pawl init` that upgrades the schema (new tables and functions
-- get their grants here, not from defaults). It is idempotent.
--
-- Three group roles (NOLOGIN; services log in as members):
--
--   owner (not created here) runs `pawl init` / migrations and owns every pawl object. Nothing
--       else needs DDL rights; keep its credentials out of the services.
--   pawl_appender: append and read the log (`pawl append`, `pawl tail`, pawl_append,
--       pawl_api.append). It executes pawl.append / pawl_api.append / pawl_api.append_batch and
--       pawl.finalize (the appending process runs the finalizer); those functions run with the
--       owner's rights and stamp every row themselves, so the role has no INSERT, UPDATE or
--       DELETE on pawl.events or pawl.runs: it cannot forge, change or remove events or runs.
--       It cannot read or write tokens: an appender can never move a processor's checkpoint.
--   pawl_processor: run processors (`pawl run`, pawl_processor_*), read the log, and use the
--       token store through pawl's token functions only (tokens_list, tokens_claim,
--       tokens_extend, nodes_live, nodes_leave, tokens_release, store_token, and tokens_init /
--       _reset / _split / _merge of `pawl reset|split|merge`, and the dead_letters_* functions of
--       `pawl dead-letters`, schema 8). It has no rights on the token
--       tables themselves, and the functions (SECURITY DEFINER, sql/007_token_isolation.sql)
--       serve only the processors granted to the session's login, so processors are isolated
--       from each other: a login granted `orders` can neither read nor move the tokens, claims
--       or nodes of `billing`. Grant each processor to the role (a login, or a group of them)
--       that runs it, as the owner:
--
--         SELECT pawl.grant_processor('orders', 'orders_projector');
--         SELECT pawl.revoke_processor('orders', 'orders_projector');   -- take it back
--
--       ('*' grants every processor, for an operator's role.) The owner, and superusers, need
--       no grant. Upgrading from a schema before version 7, where every processor login could
--       touch every processor: its processors stop with "may not use processor" until granted;
--       `SELECT pawl.grant_processor('*', 'pawl_processor')` restores the old sharing at once,
--       while you grant processors one by one. It cannot append events: no append function. It
--       may execute pawl.finalize: the processor's log source runs a finalizer so that appends
--       of a crashed appender still become readable; finalizing only orders appends that were
--       already committed, it cannot create events. Projection tables a processor's
--       handlers write belong to the service: grant those yourself.
--
-- EXECUTE on pawl's functions is revoked from PUBLIC so that a role outside these groups cannot
-- even call them. Read-only consumers in other languages need only the SQL face: GRANT
-- pawl_reader (USAGE on pawl_api, SELECT on the view, EXECUTE on its functions; those read
-- pawl.events and pawl.runs, so SELECT on both as well).

\set ON_ERROR_STOP 1

DO $roles$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pawl_appender') THEN
        CREATE ROLE pawl_appender NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pawl_processor') THEN
        CREATE ROLE pawl_processor NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pawl_reader') THEN
        CREATE ROLE pawl_reader NOLOGIN;
    END IF;
EXCEPTION WHEN unique_violation OR duplicate_object THEN
    NULL; -- another session created them at the same time (roles are cluster-wide)
END
$roles$;

-- Nobody but the owner and these groups may call pawl's functions.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pawl FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pawl_api FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA pawl FROM PUBLIC;

-- Every group: the schemas, the schema version (checked when opening), the SQL face.
GRANT USAGE ON SCHEMA pawl, pawl_api TO pawl_appender, pawl_processor, pawl_reader;
GRANT SELECT ON pawl.schema_version TO pawl_appender, pawl_processor, pawl_reader;
GRANT SELECT ON pawl.events, pawl.runs TO pawl_appender, pawl_processor, pawl_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA pawl_api TO pawl_appender, pawl_processor, pawl_reader;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pawl_api TO pawl_appender, pawl_processor, pawl_reader;

-- Nobody writes the log's tables directly: only pawl's SECURITY DEFINER functions do (earlier
-- versions of this file granted INSERT; take it back).
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON pawl.events, pawl.runs
    FROM pawl_appender, pawl_processor, pawl_reader;
REVOKE ALL ON pawl.append_ticket FROM PUBLIC, pawl_appender, pawl_processor, pawl_reader;
-- The gates of pawl's own functions: no role may even name them (schema 14; before it, the
-- finalizer's gate was pawl.finalizer_gate).
DO $gates$
BEGIN
    IF to_regnamespace('pawl_locks') IS NOT NULL THEN
        REVOKE ALL ON SCHEMA pawl_locks FROM PUBLIC, pawl_appender, pawl_processor, pawl_reader;
        REVOKE ALL ON ALL TABLES IN SCHEMA pawl_locks
            FROM PUBLIC, pawl_appender, pawl_processor, pawl_reader;
    END IF;
    IF to_regclass('pawl.finalizer_gate') IS NOT NULL THEN
        REVOKE ALL ON pawl.finalizer_gate FROM PUBLIC, pawl_appender, pawl_processor, pawl_reader;
    END IF;
END
$gates$;
-- Appending is for appenders only (the grant on every pawl_api function above included it).
-- (Schema 15 gave both an event id argument; the signatures before it are revoked as well.)
DO $api$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['pawl_api.append(text, text, bytea, jsonb, int8)',
                             'pawl_api.append_batch(text[], text[], bytea[], jsonb[], int8[])',
                             'pawl_api.append(text, text, bytea, jsonb, int8, text)',
                             'pawl_api.append_batch(text[], text[], bytea[], jsonb[], int8[], '
                             'text[])'] LOOP
        IF to_regprocedure(f) IS NOT NULL THEN
            EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM pawl_processor, pawl_reader', f);
        END IF;
    END LOOP;
END
$api$;

-- Appenders: append, finalize.
GRANT EXECUTE ON FUNCTION pawl.append(text[], int8[], int4[], int4[], text[], bytea[], jsonb[],
                                      boolean) TO pawl_appender;
DO $group$
BEGIN
    IF to_regprocedure('pawl.append_group(text[], int8[], int4[], int4[], int4[], text[], '
                       'bytea[], jsonb[], boolean)') IS NOT NULL THEN
        GRANT EXECUTE ON FUNCTION pawl.append_group(text[], int8[], int4[], int4[], int4[],
                                                    text[], bytea[], jsonb[], boolean)
            TO pawl_appender;
    END IF;
END
$group$;
DO $ids$
BEGIN
    IF to_regprocedure('pawl.append(text[], int8[], int4[], int4[], text[], bytea[], jsonb[], '
                       'boolean, text[])') IS NOT NULL THEN
        GRANT EXECUTE ON FUNCTION
            pawl.append(text[], int8[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[]),
            pawl.append_group(text[], int8[], int4[], int4[], int4[], text[], bytea[], jsonb[],
                              boolean, text[])
            TO pawl_appender;
    END IF;
END
$ids$;
GRANT EXECUTE ON FUNCTION pawl.finalize(int4) TO pawl_appender;

-- Processors: the token functions (which check the processor grants) and nothing on the token
-- tables (rights a role setup before schema 7 granted are taken back); finalize (see above);
-- never events.
REVOKE ALL ON pawl.tokens, pawl.processor_nodes, pawl.processor_grants FROM pawl_processor;
DO $dl$
BEGIN
    IF to_regclass('pawl.dead_letters') IS NOT NULL THEN
        REVOKE ALL ON pawl.dead_letters FROM pawl_processor;
    END IF;
    IF to_regclass('pawl.processor_filters') IS NOT NULL THEN
        REVOKE ALL ON pawl.processor_filters FROM pawl_processor;
    END IF;
END
$dl$;
GRANT EXECUTE ON FUNCTION pawl.finalize(int4) TO pawl_processor;
DO $fns$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.pronamespace = 'pawl'::regnamespace
                AND p.proname IN ('tokens_list', 'tokens_claim', 'tokens_extend', 'nodes_live',
                                  'nodes_leave', 'tokens_release', 'store_token', 'tokens_init',
                                  'tokens_reset', 'tokens_split', 'tokens_merge',
                                  'dead_letters_park', 'dead_letters_segment',
                                  'dead_letters_show', 'dead_letters_list',
                                  'dead_letters_stats', 'dead_letters_retry',
                                  'dead_letters_drop', 'dead_letters_unpark',
                                  'dead_letters_retry_failed', 'processor_filter',
                                  'processor_filter_reset', 'processor_filter_show')
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO pawl_processor', f);
    END LOOP;
END
$fns$;
