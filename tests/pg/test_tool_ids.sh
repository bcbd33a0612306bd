#!/usr/bin/env bash
# test_tool_ids.sh — event ids through the tool: `pawl append` lines with "id" written once and
# reported "already appended" when sent again (a copy of a log included), an id of another event
# refused (exit 7) naming it, a bad id refused (exit 6), ids in `tail` (JSON and text), and lines
# with ids appended exactly once while the appender's connections are terminated under it (the
# store sends lost appends again; the summary says how many).
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 77; }
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_tool_ids_$$
db2=t_tool_ids2_$$
for d in $db $db2; do
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $d" && psql "$BASE_DSN" -qAtc "CREATE DATABASE $d" || exit 1
done
cleanup() {
    [ -n "${killer:-}" ] && kill "$killer" 2>/dev/null
    for d in $db $db2; do psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1; done
    rm -rf "$tmp"
}
trap cleanup EXIT
export PAWL_DSN="$BASE_DSN dbname=$db"
unset PAWL_LOG_LEVEL
sql() { psql "$PAWL_DSN" -qAtc "$1"; }

fails=0
check() { # check NAME CONDITION-EXIT-STATUS
    if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
expect_rc() { # expect_rc NAME WANT GOT
    [ "$2" -eq "$3" ]; check "$1 (exit $3, want $2)" $?
}

"$PAWL" init >/dev/null 2>&1 || { echo "init failed"; exit 1; }
PAWL_DSN="$BASE_DSN dbname=$db2" "$PAWL" init >/dev/null 2>&1 || { echo "init failed"; exit 1; }

cat >"$tmp/in.jsonl" <<'L'
{"stream":"t-1","type":"Placed","payload":{"x":1},"id":"order-1/placed"}
{"stream":"t-1","type":"Paid","payload":{"x":2},"id":"order-1/paid"}
{"stream":"t-2","type":"Seen","payload":"z"}
L
"$PAWL" append <"$tmp/in.jsonl" >"$tmp/out1" 2>"$tmp/err1"; expect_rc "append with ids" 0 $?
"$PAWL" append <"$tmp/in.jsonl" >"$tmp/out2" 2>"$tmp/err2"; expect_rc "the same lines again" 0 $?
[ "$(grep -c 'already appended' "$tmp/out2")" -eq 2 ] && grep -q '^line 1  t-1#1  (already' "$tmp/out2" &&
    grep -q '^line 3  t-2#2$' "$tmp/out2"
check "lines with ids: already appended at their first numbers; the line without an id appended again" $?
grep -q '2 events were in the log already' "$tmp/err2"; check "the summary counts them" $?
[ "$(sql "SELECT count(*) FROM pawl.events WHERE stream_id = 't-1'")" = 2 ] &&
    [ "$(sql "SELECT count(*) FROM pawl.events WHERE stream_id = 't-2'")" = 2 ]
check "nothing written twice for the lines with ids" $?

echo '{"stream":"t-1","type":"Paid","payload":{"x":3},"id":"order-1/paid"}' |
    "$PAWL" append >/dev/null 2>"$tmp/err"; expect_rc "an id of another event" 7 $?
grep -q '"order-1/paid" is already in the log for another event' "$tmp/err"; check "the message names the id" $?
printf '{"stream":"t-1","type":"T","payload":1,"id":"a\\u001b[2Jb"}\n' |
    "$PAWL" append >/dev/null 2>"$tmp/err"; expect_rc "an id with a control character" 6 $?
grep -q '"id" must not contain control characters' "$tmp/err"; check "the message says why" $?
printf '{"stream":"t-1","type":"T","payload":1,"id":"%s"}\n' "$(printf 'x%.0s' $(seq 129))" |
    "$PAWL" append >/dev/null 2>"$tmp/err"; expect_rc "an id of 129 bytes" 6 $?
[ "$(sql "SELECT count(*) FROM pawl.events")" = 4 ]; check "refused lines wrote nothing" $?

"$PAWL" tail --json >"$tmp/tail.jsonl" 2>/dev/null; expect_rc "tail --json" 0 $?
[ "$(jq -r 'select(.seq == 1 and .stream == "t-1") | .id' "$tmp/tail.jsonl")" = "order-1/placed" ] &&
    [ "$(jq -r 'select(.stream == "t-2") | has("id")' "$tmp/tail.jsonl" | sort -u)" = false ]
check "tail --json: events with ids carry \"id\", the others none" $?
"$PAWL" tail >"$tmp/tail.txt" 2>/dev/null
grep -q 't-1#2  Paid  id=order-1/paid' "$tmp/tail.txt"; check "tail text shows the id" $?

# A copy of the log, twice: the second copy finds the events with ids already appended, and
# the first event without one conflicts on its explicit seq (tail prints "seq"), writing nothing.
PAWL_DSN="$BASE_DSN dbname=$db2" "$PAWL" append <"$tmp/tail.jsonl" >/dev/null 2>&1
expect_rc "tail | append: a copy" 0 $?
PAWL_DSN="$BASE_DSN dbname=$db2" "$PAWL" append <"$tmp/tail.jsonl" >"$tmp/copy2" 2>&1
expect_rc "the copy again stops at the first event without an id (a seq conflict)" 7 $?
[ "$(grep -c 'already appended' "$tmp/copy2")" -eq 2 ] &&
    [ "$(psql "$BASE_DSN dbname=$db2" -qAtc "SELECT count(*) FROM pawl.events WHERE event_id IS NOT NULL")" = 2 ] &&
    [ "$(psql "$BASE_DSN dbname=$db2" -qAtc "SELECT count(*) FROM pawl.events WHERE event_id IS NULL")" = 2 ]
check "tail | append twice: every event copied once" $?

# ---- lost connections: the appender's backends terminated while it appends -------------------
# Lines arrive a few at a time, so that appends are in flight all along; once the appender has
# written some (it is connected), every backend of it (its application name) that is running a
# statement is terminated every 30 ms until it ends. The killer catches a backend only while a
# statement runs, so the feed goes on past its first 400 lines until the appender has said it
# sends lost appends again (bounded: 6000 lines, about 40 s); the checks then count what was fed.
# The appends go through the log connections (--no-append-direct), whose lost-append retries
# this is about; a direct append (the default for `pawl append`) whose session ends
# mid-statement goes again through them, which the run after this one checks.
feed() {
    local i=0
    while :; do
        i=$((i + 1))
        printf '{"stream":"k-%d","type":"T","payload":{"i":%d},"id":"k-%d"}\n' $((i % 7)) "$i" "$i"
        sleep 0.005
        if [ $i -ge 400 ] && [ $((i % 10)) -eq 0 ]; then
            grep -q 'appending them again' "$tmp/k.err" && break
            [ $i -ge 6000 ] && break
        fi
    done
    echo $i >"$tmp/k.count"
}
# under_kills FEED PREFIX ARGS...: `FEED | pawl append ARGS` (output in $tmp/PREFIX.out and
# .err) while the killer runs, from the appender's 20th event with an id PREFIX-* to its end;
# its exit status in $rc.
under_kills() {
    local feed=$1 prefix=$2 app
    shift 2
    : >"$tmp/$prefix.err"
    $feed | "$PAWL" append "$@" >"$tmp/$prefix.out" 2>"$tmp/$prefix.err" &
    app=$!
    for _ in $(seq 1 200); do
        [ "$(sql "SELECT count(*) FROM pawl.events WHERE event_id LIKE '$prefix-%'")" -ge 20 ] && break
        sleep 0.05
    done
    ( while :; do psql "$BASE_DSN" -qAtc "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
          WHERE datname = '$db' AND application_name LIKE 'pawl%' AND pid <> pg_backend_pid()
            AND state = 'active'" >/dev/null 2>&1; sleep 0.03; done ) &
    killer=$!
    wait "$app"
    rc=$?
    kill "$killer" 2>/dev/null
    wait "$killer" 2>/dev/null
    killer= # the exit trap's: no killer left to stop
}
under_kills feed k --events-per-append 5 --no-append-direct
n=$(cat "$tmp/k.count" 2>/dev/null || echo 0)
echo "lines fed: $n"
expect_rc "append under terminated connections" 0 $rc
[ "$(sql "SELECT count(*) FROM pawl.events WHERE event_id LIKE 'k-%'")" = $n ] &&
    [ "$(sql "SELECT count(DISTINCT event_id) FROM pawl.events WHERE event_id LIKE 'k-%'")" = $n ]
check "every line's event is in the log exactly once ($n)" $?
[ "$(sql "SELECT count(*) FROM (SELECT stream_id FROM pawl.events WHERE stream_id LIKE 'k-%'
      GROUP BY stream_id HAVING max(stream_seq) <> count(*)) g")" = 0 ]
check "per stream, numbers gap-free" $?
resent=$(sed -n 's/.* \([0-9][0-9]*\) appends were sent again after a lost connection.*/\1/p' "$tmp/k.err")
echo "appends sent again: ${resent:-none}; terminations seen by the appender: $(grep -c 'lost their connection' "$tmp/k.err")"
[ "${resent:-0}" -gt 0 ] && grep -q 'appending them again' "$tmp/k.err"
check "the store sent lost appends again and said so" $?

# ---- the same with direct appends (the default): every line's event once -----------------------
feed_direct() {
    for i in $(seq 1 800); do
        printf '{"stream":"d-%d","type":"T","payload":{"i":%d},"id":"d-%d"}\n' $((i % 7)) "$i" "$i"
        sleep 0.005
    done
}
under_kills feed_direct d --events-per-append 5 --log-level debug
expect_rc "direct appends under terminated connections" 0 $rc
[ "$(sql "SELECT count(*) FROM pawl.events WHERE event_id LIKE 'd-%'")" = 800 ] &&
    [ "$(sql "SELECT count(DISTINCT event_id) FROM pawl.events WHERE event_id LIKE 'd-%'")" = 800 ]
check "direct appends: every line's event is in the log exactly once (800)" $?
closed=$(grep -c 'direct append connection closed' "$tmp/d.err")
echo "direct connection closed by terminations: $closed"
[ "$closed" -gt 0 ]
check "the direct connection was among the sessions terminated" $?

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
