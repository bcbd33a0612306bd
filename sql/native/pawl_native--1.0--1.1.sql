-- pawl_native 1.0 to 1.1: nothing to change in a database (the extension defines nothing; 1.1
-- adds pawl_events_guard to the library, which sql/native/activate.sql declares).
\echo Use "ALTER EXTENSION pawl_native UPDATE" to load this file. \quit
