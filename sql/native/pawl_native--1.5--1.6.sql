-- pawl_native 1.5 to 1.6: nothing to change in a database (the extension defines nothing; 1.6
-- writes and reads the category runs of schema 18, sql/018_category_runs.sql: the native append
-- fills pawl.events.cat_run and the filtered read walks each head's run).
\echo Use "ALTER EXTENSION pawl_native UPDATE" to load this file. \quit
