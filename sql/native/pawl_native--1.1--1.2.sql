-- pawl_native 1.1 to 1.2: nothing to change in a database (the extension defines nothing; 1.2
-- adds pawl_read, the unfiltered read, to the library, which sql/native/activate.sql declares).
\echo Use "ALTER EXTENSION pawl_native UPDATE" to load this file. \quit
