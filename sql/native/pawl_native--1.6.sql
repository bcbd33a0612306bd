-- pawl_native 1.6: defines nothing. The library is used by pawl's own functions once
-- sql/native/activate.sql has replaced them (CREATE OR REPLACE keeps their owner and grants);
-- sql/native/deactivate.sql puts the SQL versions back.
\echo Use "CREATE EXTENSION pawl_native" to load this file. \quit
