#!/usr/bin/env bash
# test_tool_proc.sh — the processor side of the `pawl` tool through its real binary against the
# private PostgreSQL: run (count and print handlers, metrics endpoint), status as a table and as
# JSON (parsed and checked), reset preview vs execute and refused while claimed (naming the
# owner), a dead node's expired claim released by reset, replays after a reset, split and merge
# (preview, refused while claimed, executed).
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 77; }
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_tool_proc_$$
psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db" && psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" || exit 1
bg=
cleanup() {
    [ -n "$bg" ] && kill -9 "$bg" 2>/dev/null
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
export PAWL_DSN="$BASE_DSN dbname=$db"
export PAWL_LOG_LEVEL=warn

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
expect_rc() { [ "$2" -eq "$3" ]; check "$1 (exit $3, want $2)" $?; }
status_json() { "$PAWL" status p --json >"$tmp/st.json" 2>"$tmp/st.err"; }
# Wait (up to $1 s) until the jq condition $2 holds on the status document.
wait_status() {
    local i
    for i in $(seq 1 $(($1 * 5))); do
        status_json && [ "$(jq -r "$2" "$tmp/st.json")" = true ] && return 0
        sleep 0.2
    done
    return 1
}
stop_bg() { # interrupt the background node and wait for its clean exit (bounded)
    kill -INT "$bg" 2>/dev/null
    for _ in $(seq 1 150); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$bg" 2>/dev/null
    wait "$bg"; local rc=$?; bg=; return $rc
}

timeout 30 "$PAWL" run --processor p 2>"$tmp/err"; expect_rc "run before init: no schema" 5 $?
grep -q 'pawl init' "$tmp/err"; check "hint to run pawl init" $?
"$PAWL" status 2>"$tmp/err"; expect_rc "status before init: no schema" 5 $?
grep -q 'run `pawl init` first' "$tmp/err"; check "status: hint to run pawl init" $?
"$PAWL" init >/dev/null 2>&1; expect_rc "init" 0 $?
"$PAWL" append --generate --count 300 --duration 0 --rate 0 --streams 50 --progress off 2>/dev/null
expect_rc "append 300 events" 0 $?

"$PAWL" status p 2>"$tmp/err"; expect_rc "status of an unknown processor" 5 $?
grep -q 'no processor named p' "$tmp/err"; check "names the processor" $?
"$PAWL" status >"$tmp/list.txt" 2>/dev/null; expect_rc "status without a processor lists them" 0 $?
grep -q '^no processors yet' "$tmp/list.txt"; check "no processors yet" $?

# ---- run a node; status while it holds the claims -------------------------------------------
port=$((20000 + RANDOM % 20000))
"$PAWL" run --processor p --segments 4 --claim-poll 100ms --metrics-port $port --progress plain \
    --progress-interval 500ms >"$tmp/run1.out" 2>"$tmp/run1.err" &
bg=$!
wait_status 60 '.lag_events == 0 and .head == 300 and all(.segments[]; .owner != null and .token == 300)'
check "the node claims all 4 segments and catches up to the head" $?
[ "$(jq '.segments | length' "$tmp/st.json")" -eq 4 ] &&
    [ "$(jq '[.segments[].mask] | unique == [3]' "$tmp/st.json")" = true ] &&
    [ "$(jq '[.segments[].segment] == [0,1,2,3]' "$tmp/st.json")" = true ] &&
    [ "$(jq 'all(.segments[]; .claim_age_ms >= 0 and .mode == "plain" and .lag_seconds == 0)' "$tmp/st.json")" = true ]
check "status JSON: segments, masks, claim ages, mode" $?
owner=$(jq -r '.segments[0].owner' "$tmp/st.json")
"$PAWL" status p >"$tmp/st.txt"; expect_rc "status table" 0 $?
grep -q '^SEGMENT  MASK' "$tmp/st.txt" && [ "$(grep -c " $owner " "$tmp/st.txt")" -eq 4 ]
check "status table lists the owner on every segment" $?

exec 3<>"/dev/tcp/127.0.0.1/$port" && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && cat <&3 >"$tmp/metrics" && exec 3<&-
awk '$1 == "pawl_events_handled_total" && $2 >= 300 { a = 1 } $1 == "pawl_claims_held" && $2 == 4 { b = 1 }
     END { exit !(a && b) }' "$tmp/metrics"
check "metrics endpoint of run: events handled, claims held" $?
awk '$1 == "pawl_processor_steps_total{processor=\"p\"}" && $2 >= 1 { a = 1 }
     $1 == "pawl_processor_steps_stolen_total{processor=\"p\"}" { b = 1 }
     $1 == "pawl_processor_steps_kept_total{processor=\"p\"}" && $2 ~ /^[0-9]+$/ { c = 1 } END { exit !(a && b && c) }' "$tmp/metrics"
check "metrics endpoint of run: the segment workers' steps, steals and keeps" $?
"$PAWL" status p --metrics --metrics-port $port >"$tmp/stm.txt"; expect_rc "status --metrics" 0 $?
grep -q '^METRICS of the pawl process' "$tmp/stm.txt" && grep -Eq 'pawl_events_handled_total +[0-9]' "$tmp/stm.txt" &&
    grep -Eq 'pawl_batch_seconds +count [1-9]' "$tmp/stm.txt"
check "status --metrics reads the node's metrics" $?

"$PAWL" reset p --to start 2>"$tmp/err"; expect_rc "reset refused while claimed" 4 $?
grep -q "claimed by $owner" "$tmp/err"; check "the refusal names the owner" $?
"$PAWL" split p --segment 1 --execute 2>"$tmp/err"; expect_rc "split refused while claimed" 4 $?
status_json; [ "$(jq '.segments | length' "$tmp/st.json")" -eq 4 ]; check "nothing was split" $?

stop_bg; expect_rc "run stops cleanly on SIGINT" 130 $?
grep -q 'stopped: 300 events' "$tmp/run1.err"; check "run summary counts 300 events" $?
grep -q 'events/s' "$tmp/run1.err"; check "run shows progress lines" $?
status_json; [ "$(jq 'all(.segments[]; .owner == null and .token == 300)' "$tmp/st.json")" = true ]
check "claims released, progress stored" $?

# ---- reset: preview, bad target, execute -----------------------------------------------------
"$PAWL" reset p --to start >"$tmp/out"; expect_rc "reset preview" 0 $?
grep -q 'nothing changed' "$tmp/out" && grep -q 'token 300 -> 0' "$tmp/out"; check "preview says what it would do" $?
status_json; [ "$(jq 'all(.segments[]; .token == 300)' "$tmp/st.json")" = true ]; check "preview changed nothing" $?
"$PAWL" reset p --to yesterday 2>/dev/null; expect_rc "bad reset target" 2 $?
"$PAWL" reset p --to start --execute >"$tmp/out"; expect_rc "reset --execute" 0 $?
status_json
[ "$(jq 'all(.segments[]; .token == 0 and .replaying and .high_water == 300) and .lag_events == 300' "$tmp/st.json")" = true ]
check "tokens at 0, lag 300, replaying up to 300" $?

# ---- a dead node's claim: refused while fresh, released once older than --claim-timeout ------
claim() { psql "$PAWL_DSN" -qAtc "UPDATE pawl.tokens SET owner = 'dead-node', mode = 0, claimed_at = now() - interval '$1' WHERE processor = 'p' AND segment_id = 2"; }
claim "2 seconds"
"$PAWL" reset p --to start --claim-timeout 1m 2>"$tmp/err"; expect_rc "reset refused: a fresh claim" 4 $?
grep -q 'claimed by dead-node' "$tmp/err" && grep -q 'claim-timeout, 60.0 s' "$tmp/err"; check "the refusal names the owner and the timeout" $?
"$PAWL" reset p --to start >"$tmp/out" 2>"$tmp/err"; expect_rc "reset refused under the default 10 s timeout: the claim is 2 s old" 4 $?
status_json; [ "$(jq '[.segments[] | select(.claim_expired)] | length' "$tmp/st.json")" -eq 0 ]; check "status: a 2 s old claim is not expired" $?
claim "50 minutes"
status_json; [ "$(jq -c '[.segments[] | select(.claim_expired) | .segment]' "$tmp/st.json")" = "[2]" ]; check "status JSON marks the 50 minutes old claim expired" $?
"$PAWL" status p >"$tmp/st.txt"; grep -q '^2 .*dead-node.*claim expired' "$tmp/st.txt"; check "status table notes the expired claim" $?
"$PAWL" status p --json --claim-timeout 1h >"$tmp/st.json"; [ "$(jq '[.segments[] | select(.claim_expired)] | length' "$tmp/st.json")" -eq 0 ]; check "status honours --claim-timeout" $?
"$PAWL" reset p --to start >"$tmp/out"; expect_rc "reset preview with an expired claim" 0 $?
grep -q 'segment 2: the claim of dead-node expired .*would release it' "$tmp/out"; check "preview names the expired claim" $?
status_json; [ "$(jq '[.segments[] | select(.owner == "dead-node")] | length' "$tmp/st.json")" -eq 1 ]; check "preview released nothing" $?
"$PAWL" reset p --to start --execute >"$tmp/out"; expect_rc "reset --execute releases the expired claim" 0 $?
grep -q 'releasing it' "$tmp/out"; check "execute says it releases the claim" $?
status_json
[ "$(jq 'all(.segments[]; .owner == null and .token == 0)' "$tmp/st.json")" = true ]; check "claim released, every token at 0" $?

# ---- replays are visible to handlers ---------------------------------------------------------
"$PAWL" run --processor p --handler print --claim-poll 100ms --progress off >"$tmp/print.out" 2>/dev/null &
bg=$!
wait_status 60 '.lag_events == 0 and all(.segments[]; .token == 300)'
check "the processor replays up to the head" $?
stop_bg
[ "$(jq -c 'select(.replay == true)' "$tmp/print.out" | wc -l)" -eq 300 ]; check "all 300 events delivered as replays (valid JSON lines with \"replay\": true)" $?
echo '{"stream":"live","type":"New"}' | "$PAWL" append 2>/dev/null
"$PAWL" run --processor p --handler print --claim-poll 100ms --progress off >"$tmp/print2.out" 2>/dev/null &
bg=$!
wait_status 60 '.lag_events == 0 and .head == 301'
stop_bg
[ "$(jq -c 'select(.stream == "live" and .replay == null)' "$tmp/print2.out" | wc -l)" -eq 1 ]
check "a new event after the old position is live, not a replay" $?

# ---- split and merge -------------------------------------------------------------------------
"$PAWL" split p --segment 1 >"$tmp/out"; expect_rc "split preview" 0 $?
grep -q 'into 1/0x7 and 5/0x7' "$tmp/out"; check "split preview names the halves" $?
"$PAWL" split p --segment 1 --execute >/dev/null; expect_rc "split" 0 $?
status_json
[ "$(jq '[.segments[] | "\(.segment)/\(.mask)"] | sort == ["0/3","1/7","2/3","3/3","5/7"]' "$tmp/st.json")" = true ] &&
    [ "$(jq 'all(.segments[]; .token == 301)' "$tmp/st.json")" = true ]
check "two halves inherit the token" $?
"$PAWL" merge p --segment 9 2>/dev/null; expect_rc "merge of a missing segment" 5 $?
"$PAWL" merge p --segment 5 --execute >/dev/null; expect_rc "merge" 0 $?
status_json
[ "$(jq '[.segments[] | "\(.segment)/\(.mask)"] | sort == ["0/3","1/3","2/3","3/3"]' "$tmp/st.json")" = true ]
check "merged back into 1/0x3" $?

# ---- status --watch --json: one document per refresh -------------------------------------
# Until two documents came (bounded: 15 s; a loaded machine is slow to the first one).
"$PAWL" status p --json --watch 200ms >"$tmp/watch.jsonl" 2>/dev/null &
bg=$!
for _ in $(seq 1 150); do
    [ "$(wc -l <"$tmp/watch.jsonl")" -ge 2 ] && break
    sleep 0.1
done
sleep 0.3
stop_bg
n=$(wc -l <"$tmp/watch.jsonl")
[ "$n" -ge 2 ] && jq -e -s 'all(.[]; .processor == "p")' "$tmp/watch.jsonl" >/dev/null
check "status --watch --json refreshes ($n documents)" $?

# ---- a database whose transactions are read-only by default ---------------------------------
# pawl's sessions pin read-write: appends did already; claims, batches and tokens do too.
psql "$BASE_DSN" -qAtc "ALTER DATABASE $db SET default_transaction_read_only = on" || exit 1
echo '{"stream":"ro","type":"New"}' | "$PAWL" append 2>/dev/null
expect_rc "append with read-only transactions by default" 0 $?
"$PAWL" run --processor p --claim-poll 100ms --progress off >/dev/null 2>"$tmp/ro.err" &
bg=$!
wait_status 30 '.lag_events == 0 and .head == 302 and all(.segments[]; .token == 302)'
check "a node claims, handles and stores its tokens there" $?
stop_bg
! grep -q '25006' "$tmp/ro.err"; check "no read-only transaction errors" $?
psql "$BASE_DSN" -qAtc "ALTER DATABASE $db RESET default_transaction_read_only"

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
