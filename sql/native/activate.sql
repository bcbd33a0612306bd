-- sql/native/activate.sql: point pawl.finalize, the functions of the runs_guard and
-- events_guard triggers and pawl_api.read at the native implementations (pawl_native.c) in a
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
