#!/usr/bin/env bash
# test_retention.sh — retention under load, through the real binary: while an appender runs, a
# follower tails the log and a processor handles it, the log is rotated twice; `pawl retention`
# previews, is refused while a processor's token lies below the new start (naming it), then
# archives and drops the oldest partition: the follower and the processor above the watermark
# go on unaffected (contiguous, exactly the log), a read below it fails naming the watermark,
# indexes above it are unchanged, the partitions' disk size drops, a stream whose events were
# all dropped continues its sequence, and the archive loaded into a second database with
# `pawl append` reproduces the dropped events, every stream in order. A rotation behind a
# reader's open transaction waits in short tries (appends go on), names the holder, and goes
# through once it is gone.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 77; }
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_retention_$$
db2=t_retention_b_$$
for d in $db $db2; do
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $d" && psql "$BASE_DSN" -qAtc "CREATE DATABASE $d" || exit 1
done
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    for d in $db $db2; do psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1; done
    rm -rf "$tmp"
}
trap cleanup EXIT
DSN="$BASE_DSN dbname=$db"
DSN2="$BASE_DSN dbname=$db2"
export PAWL_DSN="$DSN"
export PAWL_LOG_LEVEL=warn

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
q() { psql "$DSN" -qAtc "$1"; }
disk() { q "SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('pawl.events')"; }
# n events over 16 streams of prefix $1, 300-byte payloads, as JSON lines.
gen() { awk -v n="$2" -v p="$1" 'BEGIN { pad = sprintf("%300s", ""); gsub(/ /, "x", pad);
        for (i = 1; i <= n; i++) printf "{\"stream\":\"%s-%d\",\"type\":\"T%d\",\"payload\":{\"i\":%d,\"pad\":\"%s\"}}\n", p, i % 16, i % 3, i, pad }'; }

"$PAWL" init >/dev/null 2>&1 || { echo "FAIL init"; exit 1; }
gen old 3000 | "$PAWL" append --wait >/dev/null
check "3000 events appended" $?

# Load: an appender, a follower from the start, a processor.
"$PAWL" append --generate --rate 400 --duration 15s --streams 50 --progress off \
    >"$tmp/gen.out" 2>"$tmp/gen.err" &
gen_pid=$!
pids+=($gen_pid)
"$PAWL" tail --from 0 --follow --json >"$tmp/follow.out" 2>"$tmp/follow.err" &
pids+=($!)
follow_pid=$!
"$PAWL" run --processor p --handler count --progress off >"$tmp/run.out" 2>"$tmp/run.err" &
pids+=($!)
run_pid=$!

sleep 2
"$PAWL" retention --rotate --execute >"$tmp/rot1.out" 2>&1
check "rotate under load" $?
grep -q "new appends go to partition events_0002" "$tmp/rot1.out"
check "rotate names the new open partition" $?
sleep 2
gen mid 500 | "$PAWL" append >/dev/null
"$PAWL" retention --rotate --execute >/dev/null 2>&1
sleep 1
# The first partition: everything before the first rotation, finalized.
w=$(q "SELECT max_index + 1 FROM pawl.retention_plan(0) WHERE relname = 'events_0001'")
[ -n "$w" ] && [ "$w" -gt 3000 ]
check "first partition ends above the preloaded events (watermark $w)" $?
q "SELECT global_index, stream_id, stream_seq FROM pawl_api.events WHERE global_index >= $w ORDER BY 1" >"$tmp/above.before"

"$PAWL" retention --before "$w" >"$tmp/preview.out" 2>&1
check "preview exits 0" $?
grep -q "would drop 1 partitions" "$tmp/preview.out"
check "preview says one partition would go" $?
[ "$(q "SELECT pawl_api.first_index()")" = 1 ]
check "preview changed nothing" $?

# A processor whose token lies below the new start refuses the drop, naming it.
q "INSERT INTO pawl.tokens (processor, segment_id, mask, token, high_water) VALUES ('slow', 0, 0, 5, 5)"
"$PAWL" retention --before "$w" --archive "$tmp/archive.jsonl" --execute >"$tmp/refused.out" 2>&1
rc=$?
[ $rc -eq 4 ] && grep -q "slow at token 5" "$tmp/refused.out" && [ ! -e "$tmp/archive.jsonl" ]
check "refused (exit $rc) while processor slow is below, nothing archived" $?
"$PAWL" delete slow --execute >/dev/null 2>&1

# The processor p must be past the watermark (it follows the head).
for i in $(seq 1 100); do
    [ "$(q "SELECT coalesce(min(token), 0) FROM pawl.tokens WHERE processor = 'p'")" -ge $((w - 1)) ] && break
    sleep 0.2
done
size_before=$(disk)
"$PAWL" retention --before "$w" --archive "$tmp/archive.jsonl" --execute >"$tmp/drop.out" 2>&1
check "retention --execute under load" $?
size_after=$(disk)
cat "$tmp/drop.out"
grep -q "dropped 1 partitions" "$tmp/drop.out"
check "one partition dropped" $?
[ "$(wc -l <"$tmp/archive.jsonl")" -eq $((w - 1)) ]
check "archive holds the $((w - 1)) dropped events" $?
[ "$(q "SELECT pawl_api.first_index()")" = "$w" ]
check "pawl_api.first_index() is the watermark" $?
echo "partitions: $size_before bytes before, $size_after after"
[ "$size_after" -lt "$size_before" ]
check "the log's disk size dropped" $?

# Reads below the watermark fail naming it; at it they work; indexes above are unchanged.
"$PAWL" tail --from 3 --count 1 >"$tmp/below.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "starts at index $w" "$tmp/below.out" &&
    grep -q "retention dropped these events (below the low-watermark)" "$tmp/below.out"
check "a read below the watermark fails naming it, PAWL_ETRUNCATED (exit $rc)" $?
psql "$DSN" -qAtc "SELECT * FROM pawl_api.read(2, 1)" >"$tmp/below_sql.out" 2>&1
grep -q "PW020\|starts at index $w" "$tmp/below_sql.out" || grep >/dev/null "starts at index $w" "$tmp/below_sql.out"
check "pawl_api.read below the watermark raises naming it" $?
[ "$("$PAWL" tail --from $((w - 1)) --count 1 --json | jq -r .index)" = "$w" ]
check "a read from the watermark starts at it" $?
q "SELECT global_index, stream_id, stream_seq FROM pawl_api.events WHERE global_index >= $w AND global_index <= $(tail -1 "$tmp/above.before" | cut -d'|' -f1) ORDER BY 1" >"$tmp/above.after"
cmp -s "$tmp/above.before" "$tmp/above.after"
check "events above the watermark keep their indexes" $?

# A stream whose events were all dropped continues its sequence.
last_old=$(jq -r 'select(.stream == "old-1") | .seq' "$tmp/archive.jsonl" | tail -1)
echo '{"stream":"old-1","type":"After","payload":{}}' | "$PAWL" append >"$tmp/cont.out" 2>&1
grep -q "old-1#$((last_old + 1))" "$tmp/cont.out"
check "stream old-1 continues at $((last_old + 1)) after its events were dropped" $?

# The load ends; the follower and the processor read everything, unaffected.
wait "$gen_pid"
check "the appender ran through (no failed appends)" $?
last=$(q "SELECT pawl_api.last_index()")
for i in $(seq 1 150); do
    [ "$(tail -1 "$tmp/follow.out" | jq -r .index)" = "$last" ] &&
        [ "$(q "SELECT min(token) FROM pawl.tokens WHERE processor = 'p'")" = "$last" ] && break
    sleep 0.2
done
jq -r .index "$tmp/follow.out" | awk 'NR != $1 { bad = 1 } END { exit bad || NR == 0 }'
check "the follower read 1..$last contiguously" $?
[ "$(wc -l <"$tmp/follow.out")" -eq "$last" ]
check "the follower read exactly the log" $?
[ "$(q "SELECT min(token) FROM pawl.tokens WHERE processor = 'p'")" = "$last" ]
check "processor p reached the head" $?
kill -0 "$run_pid" 2>/dev/null
check "processor p still running" $?
! grep -i "error\|fail" "$tmp/run.err" "$tmp/follow.err"
check "no errors from the follower or the processor" $?

# The archive loads into another log and reproduces the dropped events, streams in order.
PAWL_DSN="$DSN2" "$PAWL" init >/dev/null 2>&1
PAWL_DSN="$DSN2" "$PAWL" append --wait <"$tmp/archive.jsonl" >/dev/null
check "archive loaded into a second database" $?
PAWL_DSN="$DSN2" "$PAWL" tail --from 0 --json >"$tmp/reloaded.jsonl"
key='[.stream, .seq, .type, (.payload | tojson)] | @tsv'
diff <(jq -r "$key" "$tmp/archive.jsonl" | sort) <(jq -r "$key" "$tmp/reloaded.jsonl" | sort) >/dev/null
check "the reloaded events equal the dropped ones" $?
jq -r '[.stream, .seq] | @tsv' "$tmp/reloaded.jsonl" |
    awk -F'\t' '{ if ($1 in s && $2 != s[$1] + 1) bad = 1; s[$1] = $2 } END { exit bad }'
check "in the second log every stream is in sequence order" $?

# An append whose REPEATABLE READ snapshot predates a rotation is refused (it could not see
# the rows the rotation closed in), so no stream number is written twice across partitions.
psql "$DSN" -qAt -v ON_ERROR_STOP=0 >"$tmp/rr.out" 2>&1 <<EOF
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) FROM pawl.runs;
\! PAWL_DSN="$DSN" "$PAWL" retention --rotate --execute
SELECT pawl_api.append('rr-1', 'T', '\x00'::bytea);
ROLLBACK;
EOF
grep -q "rotated: new appends go to" "$tmp/rr.out" && grep -q "retry the transaction" "$tmp/rr.out"
check "a REPEATABLE READ append older than a rotation fails with a serialization failure" $?
[ "$(psql "$DSN" -qAtc "SELECT pawl_api.append('rr-1', 'T', '\x00'::bytea)")" = 1 ]
check "the retried append goes through" $?

# A reader's open transaction holds a lock on the log: the rotation waits politely (appends go
# on meanwhile, never queued behind it for long), names the holder, and rotates once it is gone.
(echo "BEGIN;"; echo "SELECT count(*) FROM pawl_api.events;"; sleep 4; echo "COMMIT;") |
    psql "$DSN application_name=lock-holder" -qAt >/dev/null 2>&1 &
holder=$!
pids+=($holder)
for _ in $(seq 1 50); do
    [ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lock-holder' AND state = 'idle in transaction'")" = 1 ] && break
    sleep 0.1
done
PAWL_DSN="$DSN" "$PAWL" retention --rotate --execute >"$tmp/rot.out" 2>"$tmp/rot.err" &
rot=$!
sleep 1
t0=$(date +%s.%N)
psql "$DSN" -qAtc "SET lock_timeout = '1500ms'; SELECT pawl_api.append('polite-1', 'T', '\x00'::bytea)" >/dev/null 2>&1
arc=$?
t1=$(date +%s.%N)
check "an append while the rotation waits goes through ($(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s)" $arc
wait $rot
rrc=$?
wait $holder
[ $rrc -eq 0 ] && grep -q "rotated: new appends go to" "$tmp/rot.out"
check "the rotation goes through once the reader is gone (rc $rrc)" $?
# Other sessions (autovacuum, the appender) may be named too, in any order.
grep "held by" "$tmp/rot.err" | grep -q "pid [0-9]* (user [^,]*, application lock-holder, idle in transaction"; ok=$?
check "the rotation names what blocks it ($(head -c 300 "$tmp/rot.err"))" $ok

kill -INT "$run_pid" "$follow_pid" 2>/dev/null
wait "$run_pid" "$follow_pid" 2>/dev/null
echo "$fails failures"
[ $fails -eq 0 ]
