-- Baseline (a): a plain ascending identity column and nothing else.
--
-- This is the design most event stores start from, and the one pawl exists to replace: the
-- index comes from a sequence at insert time, so it is handed out in insert order but becomes
-- visible in commit order. A reader that has passed index N can later find a new event below N
-- (a slower transaction committing), and a rolled-back insert leaves a permanent gap. It has no
-- finalizer, so its append rate is the ceiling the finalizing designs are measured against.
--
-- The table has the same columns and indexes as the other designs: the global index (primary
-- key) and a unique (stream_id, stream_seq) that enforces per-stream order.
-- Loading this file drops and recreates the schema: it holds benchmark data only.

DROP SCHEMA IF EXISTS bl_ascending CASCADE;
CREATE SCHEMA bl_ascending;

CREATE TABLE bl_ascending.events (
    global_index bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream_id text NOT NULL,
    stream_seq bigint NOT NULL,
    type text NOT NULL,
    payload bytea NOT NULL,
    metadata jsonb,
    appended_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT events_stream_seq_key UNIQUE (stream_id, stream_seq)
);
