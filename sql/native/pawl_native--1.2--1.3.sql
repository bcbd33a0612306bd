-- pawl_native 1.2 to 1.3: nothing to change in a database (the extension defines nothing; 1.3
-- adds pawl_append, the append, to the library, which sql/native/activate.sql declares).
\echo Use "ALTER EXTENSION pawl_native UPDATE" to load this file. \quit
