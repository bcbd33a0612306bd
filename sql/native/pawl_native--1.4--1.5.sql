-- pawl_native 1.4 to 1.5: nothing to change in a database (the extension defines nothing; 1.5
-- adds durable runs, pawl_runs_durable and the flush before a read returns, to the library,
-- which sql/native/activate.sql declares).
\echo Use "ALTER EXTENSION pawl_native UPDATE" to load this file. \quit
