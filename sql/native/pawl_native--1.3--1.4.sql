-- pawl_native 1.3 to 1.4: nothing to change in a database (the extension defines nothing; 1.4
-- adds pawl_read_stream and pawl_read_filtered, the stream and filtered reads, to the library,
-- which sql/native/activate.sql declares).
\echo Use "ALTER EXTENSION pawl_native UPDATE" to load this file. \quit
