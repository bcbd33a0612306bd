#!/usr/bin/env bash
# test_filtered_processors.sh — filtered processors through the tool, on a cluster of the test's
# own, while appenders write and everything is hit:
#   - three exec processors over a partition of the streams (--category a; --category b,c;
#     --stream-prefix d-) with library appenders (`pawl append`) and SQL appends inside the
#     caller's transaction (pawl_api.append, the outbox path) writing to all of them;
#   - each processor's node is SIGKILLed twice and started again, and the server is restarted once;
#   - afterwards every processor has handled exactly the events its filter selects (at least
#     once each, none other), per stream in sequence order within each command, and the three
#     together handled the whole log, no event by two;
#   - a processor of a category nobody writes follows the head: its tokens equal the head and its
#     lag reads 0 within a second of new events elsewhere;
#   - a node asking for another filter than the processor's definition is refused (exit 4),
#     naming both; `pawl reset --category` changes it, and the processor then handles exactly
#     the new filter's events; `pawl status` shows the filter;
#   - a filter recorded by a first node that died before creating the segments is removed by
#     `pawl delete`;
#   - `pawl tail --stream` prints exactly the stream's events (pawl_api.events), for streams
#     written by several appenders and by the SQL path, and --category tails exactly its events.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
PG=${PAWL_PG:?run through ctest}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 77; }

work=$(mktemp -d /tmp/pawl-filtered.XXXXXX)
chmod 755 "$work"
export PAWL_PG_KEY=$work
pids=()
cleanup() {
    touch "$work/stop"
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    "$PG" remove >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT
"$PG" start >/dev/null || { echo "cannot start a cluster of this test's own"; exit 1; }
export PAWL_DSN="$("$PG" dsn)"
unset PAWL_LOG_LEVEL
q() { psql "$PAWL_DSN" -qAtX -c "$1" 2>/dev/null; }
fails=0
check() { # check NAME STATUS
    if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
wait_for() { # wait_for SECONDS CONDITION
    local end=$((SECONDS + $1))
    while [ $SECONDS -lt $end ]; do eval "$2" && return 0; sleep 0.1; done
    return 1
}
"$PAWL" init -q >/dev/null 2>&1 || { echo "pawl init failed"; exit 1; }
common=(--reconnect-min 20ms --reconnect-max 300ms)
head() { q "SELECT pawl_api.last_index()"; }
tokens_at_head() { # NAME: every segment's token at the head
    [ "$(q "SELECT count(*) FILTER (WHERE token <> (SELECT pawl_api.last_index())) || ' ' || count(*) FROM pawl.tokens WHERE processor = '$1'")" = "0 $2" ]
}

# The command: records "pid index stream seq" of each line, acknowledges each batch.
cat >"$work/cmd.sh" <<'EOF'
#!/usr/bin/env bash
out=$1
while IFS= read -r line; do
    [[ $line =~ ^\{\"index\":([0-9]+), ]] && idx=${BASH_REMATCH[1]} || idx=?
    [[ $line =~ \"stream\":\"([^\"]*)\" ]] && st=${BASH_REMATCH[1]} || st=?
    [[ $line =~ \"seq\":([0-9]+) ]] && seq=${BASH_REMATCH[1]} || seq=?
    echo "$$ $idx $st $seq" >>"$out"
    if [[ $line == *'"batch_end":true}' ]]; then echo "ok $idx"; fi
done
EOF
chmod +x "$work/cmd.sh"

declare -A filt=([fa]="--category a" [fbc]="--category b,c" [fd]="--stream-prefix d-")
declare -A node
start_node() { # NAME: (re)start its node in the background
    local n=$1
    # shellcheck disable=SC2086
    "$PAWL" run "$n" ${filt[$n]} --handler exec --segments 2 --batch-size 20 --claim-poll 100ms \
        --claim-timeout 1s --backoff-min 100ms --backoff-max 500ms --progress off "${common[@]}" \
        -- "$work/cmd.sh" "$work/$n.seen" >/dev/null 2>>"$work/$n.err" &
    node[$n]=$!
    pids+=("${node[$n]}")
}
"$PAWL" run fz --category zzz --handler count --segments 2 --claim-poll 100ms --progress off \
    "${common[@]}" >/dev/null 2>"$work/fz.err" &
fz=$!
pids+=("$fz")
for n in fa fbc fd; do : >"$work/$n.seen"; start_node $n; done

# Appenders: the library (a `pawl append` per batch of lines) and SQL inside a transaction.
(
    i=0
    while [ ! -f "$work/stop" ]; do
        for k in 1 2 3 4 5 6 7 8; do
            c=$(printf 'a\nb\nc\nd\n' | sed -n "$(( (i + k) % 4 + 1 ))p")
            echo "{\"stream\":\"$c-$(( (i + k) % 5 ))\",\"type\":\"T$((k % 3))\",\"payload\":{\"i\":$i}}"
        done | "$PAWL" append -q "${common[@]}" >/dev/null 2>&1
        i=$((i + 1))
        sleep 0.02
    done
) &
pids+=($!)
(
    i=0
    while [ ! -f "$work/stop" ]; do
        c=$(printf 'a\nb\nc\nd\n' | sed -n "$(( i % 4 + 1 ))p")
        psql "$PAWL_DSN" -qAtX -c "BEGIN; CREATE TEMP TABLE IF NOT EXISTS o(x int); INSERT INTO o VALUES ($i); SELECT pawl_api.append('$c-$((i % 5))', 'Sql', '{}'::bytea); COMMIT;" >/dev/null 2>&1
        i=$((i + 1))
        sleep 0.03
    done
) &
pids+=($!)

sleep 3
for round in 1 2; do
    for n in fa fbc fd; do kill -9 "${node[$n]}" 2>/dev/null; done
    sleep 1.5
    for n in fa fbc fd; do start_node $n; done
    sleep 2
    if [ $round = 1 ]; then
        "$PG" restart >/dev/null 2>&1; check "the server restarted" $?
        sleep 2
    fi
done
sleep 2
touch "$work/stop"
sleep 1
# Finalize what the appenders left, then let every processor reach the head.
"$PAWL" append -q </dev/null >/dev/null 2>&1
wait_for 20 '[ "$(q "SELECT count(*) FROM pawl.events")" = "$(head)" ]'
_rc=$?; check "every appended event is finalized ($(head))" $_rc
for n in fa fbc fd; do
    wait_for 60 "tokens_at_head $n 2"; check "$n: its tokens reach the head after the kills and the restart" $?
done
H=$(head)
[ "$H" -gt 100 ]; check "the appenders wrote a log to test on ($H events)" $?

# ---- exactly the selected events, each at least once ------------------------------------------
declare -A where=([fa]="split_part(stream_id, '-', 1) = 'a'" [fbc]="split_part(stream_id, '-', 1) IN ('b', 'c')" [fd]="left(stream_id, 2) = 'd-'")
for n in fa fbc fd; do
    q "SELECT global_index FROM pawl_api.events WHERE ${where[$n]} ORDER BY 1" >"$work/$n.want"
    awk '{ print $2 }' "$work/$n.seen" | sort -n -u >"$work/$n.got"
    cmp -s "$work/$n.want" "$work/$n.got"
    _rc=$?; check "$n: handled exactly the $(wc -l <"$work/$n.want") events of its filter (handled $(wc -l <"$work/$n.got") distinct)" $_rc
    awk '{ k = $1 " " $3; if (k in last && $4 <= last[k]) bad++; last[k] = $4 } END { exit bad > 0 }' "$work/$n.seen"
    check "$n: each command saw each stream's events in sequence order" $?
done
cat "$work/fa.got" "$work/fbc.got" "$work/fd.got" | sort -n >"$work/union"
q "SELECT global_index FROM pawl_api.events ORDER BY 1" >"$work/all"
cmp -s "$work/union" "$work/all"; check "the three filters together handled the whole log, no event twice" $?
[ "$(q "SELECT count(*) FROM pawl_api.events WHERE type = 'Sql'")" -gt 10 ]
check "SQL appends (the outbox path) are among them" $?

# ---- an idle category follows the head ---------------------------------------------------------
wait_for 5 "tokens_at_head fz 2"; check "fz (a category nobody writes): its tokens are at the head" $?
for i in 1 2 3; do echo "{\"stream\":\"a-9\",\"type\":\"T\",\"payload\":$i}"; done | "$PAWL" append -q >/dev/null 2>&1
t0=$(date +%s%N)
wait_for 5 "tokens_at_head fz 2"; rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc -eq 0 ] && [ $ms -le 1000 ]; check "fz: its tokens follow new events elsewhere within a second (${ms} ms)" $?
"$PAWL" status fz --json >"$work/fz.json" 2>/dev/null
[ "$(jq -r .lag_events "$work/fz.json")" = 0 ] && [ "$(jq -c .filter "$work/fz.json")" = '{"categories":["zzz"]}' ]
check "fz: status shows lag 0 and its filter" $?

# ---- the filter is part of the definition ------------------------------------------------------
for n in fa fbc fd; do kill -INT "${node[$n]}" 2>/dev/null; done
kill -INT "$fz" 2>/dev/null
wait 2>/dev/null
timeout 20 "$PAWL" run fa --category b --handler count --progress off >/dev/null 2>"$work/refuse.err"
rc=$?
[ $rc -eq 4 ] && grep -q 'created with filter {"categories": \["a"\]}' "$work/refuse.err" &&
    grep -q 'pawl reset fa' "$work/refuse.err"
check "fa started with another filter: refused (exit $rc, want 4), naming both and the way to change it" $?
timeout 20 "$PAWL" run fa --handler count --progress off >/dev/null 2>"$work/refuse2.err"
[ $? -eq 4 ]; check "fa started without a filter: refused too" $?
"$PAWL" status >"$work/list" 2>&1
grep -Eq '^fbc .* category b,c ' "$work/list"; check "status lists each processor's filter" $?
"$PAWL" reset fz --to start --category d --types T1 --execute >"$work/reset.out" 2>&1
grep -q 'filter: category zzz -> category d; types T1' "$work/reset.out"
check "reset --category --types changes fz's filter (and says so)" $?
port=$((20000 + $$ % 20000))
"$PAWL" run fz --category d --types T1 --handler count --progress off --claim-poll 100ms \
    --metrics-port $port >/dev/null 2>"$work/fz2.err" &
fz2=$!
pids+=("$fz2")
got_metric=1
for _ in $(seq 1 50); do
    if exec 3<>"/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
        printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
        cat <&3 | tr -d '\r' >"$work/metrics"
        exec 3<&-
        grep -qx 'pawl_processor_filter_info{processor="fz",categories="d",stream_prefixes="",types="T1"} 1' "$work/metrics" &&
            { got_metric=0; break; }
    fi
    sleep 0.2
done
check "fz: its metrics name its filter (pawl_processor_filter_info)" $got_metric
sleep 4
kill -INT $fz2
wait $fz2
want=$(q "SELECT count(*) FROM pawl_api.events WHERE split_part(stream_id, '-', 1) = 'd' AND type = 'T1'")
grep -q "stopped: $want events in" "$work/fz2.err" && tokens_at_head fz 2
check "fz after the reset handles exactly the $want events of its new filter" $?

# A first node that recorded its filter and died before creating the segments leaves only the
# record: another filter is refused, and `pawl delete` removes the record.
q "SELECT pawl.processor_filter('ghost', '{\"categories\": [\"a\"]}')" >/dev/null
timeout 20 "$PAWL" run ghost --category b --handler count --progress off >/dev/null 2>&1; rc=$?
"$PAWL" delete ghost --execute >"$work/ghost.out" 2>&1
grep -q 'deleted the recorded filter of processor ghost' "$work/ghost.out" &&
    timeout --preserve-status -s INT 4 "$PAWL" run ghost --category b --handler count --progress off >/dev/null 2>&1
rc2=$?
[ $rc -eq 4 ] && [ $rc2 -eq 130 ]
check "a filter recorded without segments: refused (exit $rc), deleted by pawl delete, then a new filter runs (exit $rc2)" $?

# ---- tail: one stream, one category -------------------------------------------------------------
for s in a-1 d-3; do
    "$PAWL" tail --stream $s --json -q >"$work/tail.$s" 2>/dev/null
    jq -r '"\(.index) \(.seq)"' "$work/tail.$s" >"$work/tail.$s.got"
    q "SELECT global_index || ' ' || stream_seq FROM pawl_api.events WHERE stream_id = '$s' ORDER BY stream_seq" >"$work/tail.$s.want"
    cmp -s "$work/tail.$s.want" "$work/tail.$s.got"
    _rc=$?; check "tail --stream $s prints exactly its $(wc -l <"$work/tail.$s.want") events" $_rc
done
# A stream with at least three events (the log is random: a-1 may hold one): --from -2 prints its
# last two, in order.
s=$(q "SELECT stream_id FROM pawl_api.events GROUP BY stream_id HAVING count(*) >= 3 ORDER BY count(*) DESC, stream_id LIMIT 1")
"$PAWL" tail --stream "$s" --from -2 --json -q 2>/dev/null | jq -r .seq >"$work/tail.last2"
q "SELECT stream_seq FROM (SELECT stream_seq FROM pawl_api.events WHERE stream_id = '$s' ORDER BY stream_seq DESC LIMIT 2) t ORDER BY 1" >"$work/tail.last2.want"
[ -n "$s" ] && cmp -s "$work/tail.last2.want" "$work/tail.last2"
check "tail --stream $s --from -2: its last two events" $?
"$PAWL" tail --category c --json -q | jq -r .index >"$work/tailc.got"
q "SELECT global_index FROM pawl_api.events WHERE split_part(stream_id, '-', 1) = 'c' ORDER BY 1" >"$work/tailc.want"
cmp -s "$work/tailc.want" "$work/tailc.got"; check "tail --category c prints exactly its events" $?
"$PAWL" tail --category c-1 >/dev/null 2>"$work/bad.err"; rc=$?
[ $rc -eq 2 ] && grep -q "contains '-'" "$work/bad.err"; check "tail --category with a '-' is refused (exit $rc, want 2)" $?
"$PAWL" tail --stream a-1 --category a >/dev/null 2>&1; [ $? -eq 2 ]
check "tail --stream with a filter is refused (exit 2)" $?

echo "$fails check(s) failed"
[ $fails -eq 0 ]
