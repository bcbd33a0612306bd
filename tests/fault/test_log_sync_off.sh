#!/usr/bin/env bash
# test_log_sync_off.sh — a run that readers saw survives a crash even when the database's
# default synchronous_commit is off: the finalizer pins synchronous_commit = on for its session
# (a run is flushed before anyone can read it), so after immediate shutdowns (crash recovery)
# no index ever read with one event later holds another, and none disappears. A session of its
# own that calls pawl.finalize at off (the database's default here) or local is refused, naming
# the setting: its run could be read and then lost in a crash.
#
# It runs its own PostgreSQL cluster (pawl-pg keyed by a temporary directory), because it
# restarts the server; the cluster is removed at the end.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
SRC=${PAWL_SOURCE_DIR:?run through ctest}
PG=$SRC/tools/pawl-pg
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
export PAWL_PG_KEY=$tmp/key
mkdir -p "$PAWL_PG_KEY"
bgs=()
cleanup() {
    for p in "${bgs[@]}"; do kill -9 "$p" 2>/dev/null; done
    "$PG" remove >/dev/null 2>&1 || "$PG" stop >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
"$PG" start >/dev/null 2>&1 || { echo "SKIP: cannot start a private PostgreSQL"; exit 77; }
DSN=$("$PG" dsn)
export PAWL_DSN=$DSN PAWL_LOG_LEVEL=error PAWL_PROGRESS=off
"$PAWL" init >/dev/null || exit 1
db=$(psql "$DSN" -qAtc "SELECT current_database()")
psql "$DSN" -qAtc "ALTER DATABASE $db SET synchronous_commit = off" || exit 1
# Keep asynchronous commits in WAL buffers for seconds (not the default 200 ms), so that an
# immediate shutdown surely loses the last ones: only a commit that flushes makes them durable.
psql "$DSN" -qAt -c "ALTER SYSTEM SET wal_writer_delay = '10s'" \
    -c "ALTER SYSTEM SET wal_writer_flush_after = '64MB'" -c "SELECT pg_reload_conf()" >/dev/null || exit 1

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }

# A manual run at a non-durable setting is refused (nothing is written); at on it goes.
psql "$DSN" -qAtc "SELECT pawl.append(ARRAY['m'], ARRAY[0::int8], ARRAY[1], ARRAY[1], ARRAY['T'],
                   ARRAY['p'::bytea], NULL, false)" >/dev/null || exit 1
for level in off local; do
    out=$(psql "$DSN" -qAt -c "SET synchronous_commit = $level" -c "SELECT appends FROM pawl.finalize()" 2>&1)
    grep -q "must run with synchronous_commit on or stronger, not $level" <<<"$out"
    check "a manual pawl.finalize at synchronous_commit = $level is refused" $?
done
[ "$(psql "$DSN" -qAtc "SELECT count(*) FROM pawl.runs WHERE first_index > 0")" = 0 ]
check "the refused runs wrote nothing" $?
[ "$(psql "$DSN" -qAt -c "SET synchronous_commit = on" -c "SELECT appends FROM pawl.finalize()")" = 1 ]
check "at synchronous_commit = on it finalizes" $?

# Appenders: short runs in a loop, so that a restart only costs the current one.
(
    end=$((SECONDS + 24))
    while [ $SECONDS -lt $end ]; do
        "$PAWL" append --generate --rate 400 --duration 2s --streams 9 --appenders 2 >/dev/null 2>&1
    done
) &
bgs+=($!)
# Reader: every index it sees, with the event it held, as "index stream seq".
(
    last=0
    end=$((SECONDS + 26))
    while [ $SECONDS -lt $end ]; do
        out=$(psql "$DSN" -qAt -F ' ' -c "SELECT global_index, stream_id, stream_seq
              FROM pawl_api.read($last, 5000)" 2>/dev/null) || { sleep 0.1; continue; }
        if [ -n "$out" ]; then
            printf '%s\n' "$out" >>"$tmp/seen"
            last=$(printf '%s\n' "$out" | tail -1 | cut -d' ' -f1)
        fi
        sleep 0.05
    done
) &
reader=$!
bgs+=($reader)
for at in 5 11 17; do
    sleep 6
    PAWL_PG_STOP_MODE=immediate "$PG" restart >/dev/null 2>&1
    check "immediate restart at ~${at}s" $?
done
wait "$reader"
wait
# What is there now (a last run finalizes what the appenders left).
psql "$DSN" -qAt -c "SET synchronous_commit = on" -c "SELECT appends FROM pawl.finalize()" >/dev/null
psql "$DSN" -qAt -F ' ' -c "SELECT global_index, stream_id, stream_seq FROM pawl_api.events
                           ORDER BY global_index" >"$tmp/final"
seen=$(sort -u "$tmp/seen" | wc -l)
[ "$seen" -gt 500 ]; check "the reader saw $seen indexes" $?
missing=$(sort -u "$tmp/seen" | comm -23 - <(sort "$tmp/final") | wc -l)
[ "$missing" -eq 0 ]; check "every index read still holds the same event ($missing differ)" $?
dups=$(cut -d' ' -f1 "$tmp/seen" | sort | uniq -d | wc -l)
[ "$dups" -eq 0 ]; check "no index was read twice ($dups)" $?
n=$(wc -l <"$tmp/final")
[ "$(psql "$DSN" -qAtc "SELECT pawl_api.last_index()")" -eq "$n" ]; check "indexes 1..$n are contiguous" $?
[ "$(psql "$DSN" -qAtc "SELECT count(*) FROM (SELECT global_index, lag(global_index) OVER
      (PARTITION BY stream_id ORDER BY stream_seq) AS p FROM pawl_api.events) x
      WHERE x.p >= x.global_index")" -eq 0 ]
check "per stream, index order equals sequence order" $?

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
