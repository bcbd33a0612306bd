#!/usr/bin/env bash
# test_tool_metrics.sh — the metrics endpoint of the long-running commands, through the real
# binary against the private PostgreSQL: `run --metrics-port` serves the library's, the store's
# and per-segment families (token, lag in events and seconds, labelled by processor and
# segment), /healthz and /readyz; `tail --follow --metrics-port` serves too; tail without
# --follow and bench refuse the flag clearly; every family is declared once, counters end in
# _total, and the store's old duplicates of registry families are gone.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_tool_metrics_$$
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
stop_bg() {
    kill -INT "$bg" 2>/dev/null
    for _ in $(seq 1 150); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$bg" 2>/dev/null
    wait "$bg"; local rc=$?; bg=; return $rc
}
# GET $2 on port $1: the status code on the first line of $3, the body after the headers.
get() {
    exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
    printf 'GET %s HTTP/1.0\r\n\r\n' "$2" >&3
    cat <&3 | tr -d '\r' >"$3.raw"
    exec 3<&-
    awk 'NR == 1 { print $2 } ' "$3.raw" >"$3"
    awk 'body { print } /^$/ { body = 1 }' "$3.raw" >>"$3"
}
wait_get() { # wait (up to 60 s) until GET succeeds with status $4
    for _ in $(seq 1 300); do
        get "$1" "$2" "$3" 2>/dev/null && [ "$(head -1 "$3")" = "$4" ] && return 0
        sleep 0.2
    done
    return 1
}
# Every family declared once; counters end in _total; units in the names of time families.
families_ok() {
    awk '/^# TYPE / { n[$3]++; if ($4 == "counter" && $3 !~ /_total$/) bad = bad " " $3 }
         END { for (f in n) if (n[f] > 1) bad = bad " dup:" f; if (bad) print bad; exit bad != "" }' "$1"
}

"$PAWL" init >/dev/null 2>&1 || { echo "init failed"; exit 1; }
"$PAWL" append --generate --count 200 --duration 0 --rate 0 --streams 20 --progress off 2>/dev/null

# ---- run ------------------------------------------------------------------------------------
port=$((20000 + RANDOM % 20000))
"$PAWL" run --processor m --segments 4 --claim-poll 100ms --metrics-port $port --progress off \
    2>"$tmp/run.err" &
bg=$!
wait_get $port /readyz "$tmp/ready" 200
check "run: /readyz answers 200 once the node holds its segments" $?
grep -q '^ready: holds [1-9]' "$tmp/ready"; check "run: /readyz says what it holds" $?
get $port /healthz "$tmp/health"; [ "$(head -1 "$tmp/health")" = 200 ] && grep -q '^ok$' "$tmp/health"
check "run: /healthz answers 200" $?
# Wait for a sample showing the caught-up segments.
for _ in $(seq 1 100); do
    get $port /metrics "$tmp/m" && grep -q '^pawl_processor_segment_lag_events{processor="m",segment="3",mask="3"} 0$' "$tmp/m" && break
    sleep 0.2
done
[ "$(grep -c '^pawl_processor_segment_lag_events{processor="m",segment="[0-3]",mask="3"} 0$' "$tmp/m")" -eq 4 ]
check "run: lag in events per segment, labelled by processor, segment and mask" $?
[ "$(grep -c '^pawl_processor_segment_lag_seconds{processor="m",segment="[0-3]",mask="3"} 0.000$' "$tmp/m")" -eq 4 ]
check "run: lag in seconds per segment" $?
[ "$(grep -c '^pawl_processor_segment_token{processor="m",segment="[0-3]",mask="3"} 200$' "$tmp/m")" -eq 4 ] &&
    [ "$(grep -c '^pawl_processor_segment_held_here{processor="m",segment="[0-3]",mask="3"} 1$' "$tmp/m")" -eq 4 ]
check "run: token and held-here per segment" $?
grep -q '^pawl_store_appends_pending ' "$tmp/m" && grep -q '^pawl_store_finalizer_interval_seconds ' "$tmp/m" &&
    grep -q '^pawl_store_append_retries_total ' "$tmp/m"
check "run: the store's families are served" $?
grep -q '^pawl_events_handled_total 200$' "$tmp/m" && grep -q '^pawl_processor_steps_total{processor="m"} ' "$tmp/m"
check "run: the registry's and the processor's families" $?
families_ok "$tmp/m"; check "run: each family declared once, counters end in _total" $?
! grep -Eq '^pawl_store_(finalize_runs_total|finalize_busy_total|events_finalized_total|last_index|finalize_delay_seconds)' "$tmp/m"
check "run: no store duplicates of registry families" $?
get $port /nowhere "$tmp/nf"; [ "$(head -1 "$tmp/nf")" = 404 ]; check "run: other paths are 404" $?

# A second node: it takes a fair share (ready) or, holding nothing, says why (503).
port2=$((port + 1))
"$PAWL" run --processor m --claim-poll 100ms --metrics-port $port2 --progress off --node-id standby \
    2>/dev/null &
bg2=$!
sleep 3
get $port2 /readyz "$tmp/ready2"
code=$(head -1 "$tmp/ready2")
# It either took its fair share (ready) or holds nothing with every segment held elsewhere (503).
{ [ "$code" = 200 ] && grep -q '^ready: holds [1-9]' "$tmp/ready2"; } ||
    { [ "$code" = 503 ] && grep -q 'holds no segment' "$tmp/ready2"; }
rc=$?
check "run: a second node's /readyz is consistent ($code: $(sed -n 2p "$tmp/ready2"))" $rc
kill -INT $bg2; wait $bg2
stop_bg; [ $? -eq 130 ]; check "run stops cleanly (exit 130 after Ctrl-C)" $?

# ---- tail --follow ---------------------------------------------------------------------------
"$PAWL" tail --follow --metrics-port $port >/dev/null 2>"$tmp/tail.err" &
bg=$!
wait_get $port /metrics "$tmp/tm" 200
check "tail --follow: /metrics answers" $?
grep -q '^pawl_events_read_total ' "$tmp/tm" && grep -q '^pawl_store_appends_pending ' "$tmp/tm"
check "tail --follow: registry and store families" $?
families_ok "$tmp/tm"; check "tail --follow: each family declared once" $?
get $port /healthz "$tmp/th"; [ "$(head -1 "$tmp/th")" = 200 ]; check "tail --follow: /healthz" $?
stop_bg

"$PAWL" tail --metrics-port $port >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q 'needs --follow' "$tmp/err"; check "tail without --follow refuses --metrics-port clearly" $?
"$PAWL" bench --metrics-port $port --duration 1s 2>"$tmp/err" >/dev/null
[ $? -eq 2 ] && grep -q 'not served by bench' "$tmp/err"; check "bench refuses --metrics-port clearly" $?

echo "$fails failed"
[ "$fails" -eq 0 ]
