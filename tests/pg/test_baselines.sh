#!/usr/bin/env bash
# The baseline designs and their driver (bench/baselines/*.sql, bench_baselines): a short run of
# every design prints well-formed rows, and the per-event renumbering design leaves a log whose
# final indexes are exactly 1..N with no temporary id left, each stream in sequence order.
set -euo pipefail
src=${PAWL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${PAWL_BIN:?}/bench_baselines
[ -x "$bin" ] || { echo "bench_baselines not built (benchmarks off in this build): skipped"; exit 77; }
[ -n "${PAWL_TEST_DSN:-}" ] || { echo "no PAWL_TEST_DSN: skipped"; exit 77; }

db=pawl_test_baselines_$$
psql "$PAWL_TEST_DSN" -qAtc "create database $db"
trap 'psql "$PAWL_TEST_DSN" -qAtc "drop database if exists $db with (force)" || true' EXIT
dsn="$PAWL_TEST_DSN dbname=$db"
q() { psql "$dsn" -qAt -F ' ' -c "$1"; }

out=$("$bin" --dsn "$dsn" --sql-dir "$src/bench/baselines" --header --conns 1,3 --batch 1,10 \
      --seconds 1 --drain-s 20)
echo "$out"
[ "$(echo "$out" | head -1)" = \
  "system,workload,writers,events_per_append,events,seconds,events_per_s,p50_ms,p99_ms,p999_ms,max_ms" ]
# 2 batch sizes x 2 connection counts: one row for ascending, two for renumber.
[ "$(echo "$out" | tail -n +2 | wc -l)" -eq 12 ]
echo "$out" | tail -n +2 | awk -F, '
    NF != 11 { print "bad field count: " $0; bad = 1 }
    $5 <= 0 || $7 <= 0 || $8 == "" || $11 < $8 { print "bad figures: " $0; bad = 1 }
    END { exit bad }'

# The last configuration was renumber, 3 connections, 10 events per append.
events=$(echo "$out" | awk -F, '$1 == "baseline-renumber" && $2 == "append" && $3 == 3 && $4 == 10 { print $5 }')
finalized=$(echo "$out" | awk -F, '$1 == "baseline-renumber" && $2 == "finalize-delay" && $3 == 3 && $4 == 10 { print $5 }')
[ "$events" = "$finalized" ]
[ "$(q 'select count(*) from bl_renumber.events')" = "$events" ]
[ "$(q 'select count(*) from bl_renumber.events where global_index < 0')" = 0 ]
[ "$(q 'select min(global_index), max(global_index) from bl_renumber.events')" = "1 $events" ]
[ "$(q 'select last_final from bl_renumber.head')" = "$events" ]
# Within every stream, index order is sequence order.
[ "$(q 'select count(*) from (select stream_seq - lag(stream_seq) over (partition by stream_id order by global_index) as d from bl_renumber.events) s where d is not null and d <> 1')" = 0 ]

# A finalizer that finds the lock taken reports (-1, -1) and changes nothing; once the holder
# is gone, the next run picks the rows up.
q "insert into bl_renumber.events (stream_id, stream_seq, type, payload) values ('lock-test', 1, 't', '\\x00')"
psql "$dsn" -qAtc "select pg_advisory_lock(7081990, 2), pg_sleep(4)" >/dev/null &
holder=$!
for _ in $(seq 1 50); do
    [ "$(q "select count(*) from pg_locks where locktype = 'advisory' and granted")" = 1 ] && break
    sleep 0.1
done
[ "$(q 'select renumbered, last_final from bl_renumber.finalize()')" = "-1 -1" ]
[ "$(q 'select count(*) from bl_renumber.events where global_index < 0')" = 1 ]
wait $holder
[ "$(q 'select renumbered, last_final from bl_renumber.finalize()')" = "1 $((events + 1))" ]
echo "ok"
