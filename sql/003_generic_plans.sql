-- 003_generic_plans.sql: the finalizer and the SQL reader keep one plan (schema version 3).
--
-- pawl.finalize and pawl_api.read run their statements with values that change on every call
-- (the previous run's horizon, the position read after). PL/pgSQL caches those statements
-- as prepared plans, and with the default plan_cache_mode PostgreSQL re-plans them for every
-- call when it judges a custom plan cheaper. Measured on the development machine, that
-- planning was about 40% of a finalization run's server CPU (0.55 vs 0.3 ms per call for a
-- run that finalizes one append). Both functions already pin every planner choice that
-- matters (no sequential, bitmap, hash or merge plans, no JIT, no parallel workers), so the
-- generic plan is the same index plan the custom one would be; forcing it removes the
-- planning and changes nothing else. tests/pg/test_log_plans.c checks that the cost still
-- does not depend on the statistics.

ALTER FUNCTION pawl.finalize(int4) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pawl_api.read(int8, int4) SET plan_cache_mode = force_generic_plan;
