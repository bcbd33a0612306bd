-- 005_runs_inline.sql: run rows keep their arrays inline and uncompressed (schema version 5).
--
-- A finalization run writes one pawl.runs row holding three arrays with an entry per append it
-- ordered (xids, bases, ns: 20 bytes per append) plus the transactions open at its snapshot.
-- Under PostgreSQL's default storage a row over about 2 KB is compressed with pglz and, over
-- 8 KB, moved to the TOAST table: every run of more than about 100 appends paid the compression
-- in the finalizer's transaction, and every reader that maps appends to indexes through that run
-- (the C reader, pawl_api.read, pawl_api.events) paid the decompression on each read. Measured
-- on the development machine, a run of 300 one-event appends took 0.9-1.9 ms in the server with
-- compression and 0.64-1.0 ms without (loops of appends and runs in one session, alternating
-- the two settings), about 1.3 us per append; at 1-event appends under load, runs of 100-300
-- appends are the common case.
--
-- EXTERNAL storage never compresses; toast_tuple_target = 8160 (the largest allowed) keeps a
-- row inline up to a full page, so runs of up to about 400 appends are stored and read as plain
-- arrays in the heap row. Larger runs (up to finalize's max_appends, 2000 by default) have
-- their arrays moved out of line, still uncompressed. The arrays hold distinct, increasing
-- numbers, so compression saved little room next to the events themselves (about 100 bytes
-- per event at the smallest). Existing rows are not rewritten; they stay readable as they are.

ALTER TABLE pawl.runs
    ALTER COLUMN xids SET STORAGE EXTERNAL,
    ALTER COLUMN bases SET STORAGE EXTERNAL,
    ALTER COLUMN ns SET STORAGE EXTERNAL,
    ALTER COLUMN open_xids SET STORAGE EXTERNAL,
    SET (toast_tuple_target = 8160);
