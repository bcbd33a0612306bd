#!/usr/bin/env bash
# test_tool_cli.sh — an operator cannot hurt themselves with `pawl`, through the real binary
# against the private PostgreSQL: action variables in the environment change nothing (the
# database is checked), a bare-number duration is refused, status without a name lists the
# processors, run announces a processor it creates, delete (preview, refused while claimed,
# executed), split/merge need --segment, a refused reset prints nothing on stdout, a reset past
# the head is refused, "did you mean", flags before the command, --log-format json on stderr,
# control characters escaped, the conflict exit code and message, append --wait's final indexes.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 77; }
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_tool_cli_$$
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
sql() { psql "$PAWL_DSN" -qAtc "$1"; }
tokens() { sql "SELECT string_agg(segment_id || ':' || token, ',' ORDER BY segment_id) FROM pawl.tokens WHERE processor = '$1'"; }

"$PAWL" init >/dev/null 2>&1; expect_rc "init" 0 $?
"$PAWL" append --generate --count 100 --duration 0s --rate 0 --streams 20 --progress off >/dev/null 2>&1
expect_rc "append 100 events" 0 $?

# ---- run announces the processor it creates ------------------------------------------------
# Run a node of p in the background until every segment's token is at $1, then stop it cleanly.
run_p_until() {
    PAWL_LOG_LEVEL=info "$PAWL" run --processor p --segments 4 --claim-poll 100ms --progress off \
        >/dev/null 2>"$2" &
    bg=$!
    # Ctrl-C only once the node says it is running: before main() installs its handler, a
    # background job of a non-interactive shell ignores SIGINT (on a second run the tokens are
    # already at $1, so the token wait alone would interrupt the node while it starts).
    for _ in $(seq 1 300); do
        [ "$(tokens p)" = "0:$1,1:$1,2:$1,3:$1" ] && grep -q 'Ctrl-C stops' "$2" && break
        sleep 0.1
    done
    kill -INT "$bg"
    for _ in $(seq 1 150); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$bg" 2>/dev/null; then
        # Say what the node was doing: a node that ignores Ctrl-C for 15 s is a bug to chase.
        echo "run_p_until $1: the node did not stop within 15 s of SIGINT; tokens $(tokens p); its log:"
        tail -n 30 "$2"
        # Whether SIGINT is pending, blocked, ignored or caught, and where each thread waits.
        grep -E '^(State|SigQ|SigPnd|ShdPnd|SigBlk|SigIgn|SigCgt)' "/proc/$bg/status"
        for t in /proc/"$bg"/task/*; do
            echo "thread ${t##*/} $(cat "$t/comm" 2>/dev/null) $(grep -E '^(State|SigBlk)' "$t/status" 2>/dev/null | tr '\n\t' '  ') wchan $(cat "$t/wchan" 2>/dev/null)"
        done
        kill -9 "$bg" 2>/dev/null
    fi
    wait "$bg"; bg=
    for _ in $(seq 1 50); do [ "$(sql "SELECT count(owner) FROM pawl.tokens WHERE processor = 'p'")" = 0 ] && break; sleep 0.1; done
}
run_p_until 100 "$tmp/run.err"
grep -q 'creating processor p with 4 segments at token 0' "$tmp/run.err"; check "run announces the processor it creates" $?
run_p_until 100 "$tmp/run2.err"
! grep -q 'creating processor' "$tmp/run2.err"; check "an existing processor is not announced as created" $?
[ "$(tokens p)" = "0:100,1:100,2:100,3:100" ]; check "the node handled every event and stopped" $?

# ---- 1. actions never come from the environment ----------------------------------------------
before=$(tokens p)
PAWL_EXECUTE=1 "$PAWL" reset p --to start >"$tmp/out" 2>"$tmp/err"; expect_rc "PAWL_EXECUTE=1 reset: a preview" 0 $?
[ "$(tokens p)" = "$before" ]; check "PAWL_EXECUTE=1: tokens unchanged in the database" $?
grep -q 'nothing changed' "$tmp/out"; check "PAWL_EXECUTE=1: the preview says nothing changed" $?
grep -q 'ignoring PAWL_EXECUTE in the environment' "$tmp/err"; check "PAWL_EXECUTE=1: warned that it is ignored" $?
PAWL_TO=start "$PAWL" reset p --execute >/dev/null 2>"$tmp/err"; expect_rc "PAWL_TO=start: --to is still required" 2 $?
[ "$(tokens p)" = "$before" ]; check "PAWL_TO: tokens unchanged" $?
PAWL_SEGMENT=1 "$PAWL" split p --execute >/dev/null 2>"$tmp/err"; expect_rc "PAWL_SEGMENT=1: split needs --segment" 2 $?
[ "$(sql "SELECT count(*) FROM pawl.tokens WHERE processor = 'p'")" = 4 ]; check "PAWL_SEGMENT: nothing split" $?
PAWL_PROCESSOR=p "$PAWL" reset --to start --execute >/dev/null 2>"$tmp/err"; expect_rc "PAWL_PROCESSOR: reset needs the name on the command line" 2 $?
[ "$(tokens p)" = "$before" ]; check "PAWL_PROCESSOR: tokens unchanged" $?
PAWL_PROCESSOR=p PAWL_EXECUTE=1 "$PAWL" delete >/dev/null 2>&1; expect_rc "PAWL_PROCESSOR + PAWL_EXECUTE: delete refuses" 2 $?
[ "$(tokens p)" = "$before" ]; check "delete from the environment: nothing deleted" $?
PAWL_JSON=1 "$PAWL" status p >"$tmp/out" 2>/dev/null; expect_rc "PAWL_JSON=1 status" 0 $?
grep -q '^PROCESSOR p' "$tmp/out" && ! jq -e . "$tmp/out" >/dev/null 2>&1; check "PAWL_JSON=1: a table, not JSON" $?
[ "$(PAWL_COUNT=1 "$PAWL" tail --json 2>/dev/null | wc -l)" -eq 100 ]; check "PAWL_COUNT=1: tail prints every event" $?
timeout 20 env PAWL_FOLLOW=1 "$PAWL" tail --from 99 >/dev/null 2>&1; expect_rc "PAWL_FOLLOW=1: tail ends" 0 $?
echo '{"stream":"w","type":"T"}' | PAWL_WAIT=1 "$PAWL" append >"$tmp/out" 2>/dev/null
! grep -q 'index' "$tmp/out"; check "PAWL_WAIT=1: append does not wait" $?

# ---- 2. append: bounded lines, a clean Ctrl-C -------------------------------------------------------
start=$(date +%s%N)
if [ -x /usr/bin/time ]; then
    head -c 50M /dev/zero | /usr/bin/time -f '%M' -o "$tmp/rss" "$PAWL" append >/dev/null 2>"$tmp/err"; rc=$?
else
    head -c 50M /dev/zero | "$PAWL" append >/dev/null 2>"$tmp/err"; rc=$?
fi
ms=$(( ($(date +%s%N) - start) / 1000000 ))
expect_rc "a 50 MB line of zeros is refused" 6 $rc
grep -q 'line 1 is longer than 6356992 bytes' "$tmp/err" && grep -q -- '--max-event-bytes 1048576' "$tmp/err"
check "the refusal names the line and the limit" $?
[ "$ms" -lt 10000 ]; check "refused fast (${ms} ms)" $?
if [ -s "$tmp/rss" ]; then
    rss=$(tail -1 "$tmp/rss"); [ "$rss" -lt 100000 ]; check "memory stays small (max RSS ${rss} KB)" $?
fi
head -c 100 /dev/zero | "$PAWL" append --max-event-bytes 10 >/dev/null 2>"$tmp/err"; expect_rc "the limit follows --max-event-bytes" 6 $?

mkfifo "$tmp/in"
"$PAWL" append <"$tmp/in" >"$tmp/ctrlc.out" 2>"$tmp/ctrlc.err" &
bg=$!
exec 3>"$tmp/in"
printf '{"stream":"c1","type":"T"}\n{"stream":"c1","type":"T"}\n{"stream":"c2","type":"T","seq":1}\n' >&3
for _ in $(seq 1 100); do [ "$(wc -l <"$tmp/ctrlc.out")" -ge 3 ] && break; sleep 0.1; done
kill -INT "$bg"
for _ in $(seq 1 100); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
kill -9 "$bg" 2>/dev/null
wait "$bg"; rc=$?; bg=
exec 3>&-
expect_rc "Ctrl-C during a long append" 130 $rc
grep -q 'interrupted: appended 3 events in .* from 3 lines (last: line 3, c2#1)' "$tmp/ctrlc.err"
check "the summary says what was appended" $?
[ "$(sql "SELECT count(*) FROM pawl.events WHERE stream_id IN ('c1', 'c2')")" = 3 ]; check "the 3 events are in the log" $?

# ---- 3. durations need a unit -------------------------------------------------------------------
timeout 20 "$PAWL" status p --watch 2 >/dev/null 2>"$tmp/err"; expect_rc "--watch 2 refused" 2 $?
grep -q -- '--watch' "$tmp/err" && grep -q '2s' "$tmp/err" && grep -q '2000ms' "$tmp/err"; check "the refusal names the flag and suggests 2s/2000ms" $?
PAWL_CLAIM_TIMEOUT=5000 "$PAWL" status p >/dev/null 2>"$tmp/err"; expect_rc "PAWL_CLAIM_TIMEOUT=5000 refused" 2 $?
"$PAWL" reset p --to -5x >/dev/null 2>"$tmp/err"; expect_rc "reset --to -5x refused (no such unit)" 2 $?
grep -q 'unit' "$tmp/err"; check "the refusal asks for a unit" $?
# -5 is not a duration without its unit but a position: five events before the end.
"$PAWL" reset p --to -5 >"$tmp/out" 2>"$tmp/err"; expect_rc "reset --to -5: an offset (preview)" 0 $?
grep -q "to token $(($(sql "SELECT pawl_api.last_index()") - 5)) " "$tmp/out"; check "reset --to -5 is five events before the end" $?
timeout 20 "$PAWL" status p --watch 1m30s --help >/dev/null; expect_rc "compound durations accepted" 0 $?

# ---- 4. processors as objects -------------------------------------------------------------------
"$PAWL" run --processor q --segments 2 --initial-token 40 --progress off >/dev/null 2>&1 &
bg=$!
for _ in $(seq 1 100); do [ "$(sql "SELECT count(*) FROM pawl.tokens WHERE processor = 'q' AND owner IS NOT NULL")" = 2 ] && break; sleep 0.1; done
"$PAWL" status >"$tmp/list.txt" 2>"$tmp/err"; expect_rc "status without a name" 0 $?
head=$(sql "SELECT pawl_api.last_index()")
grep -Eq "^p +4 +0 +100 +$head +$((head - 100)) +- +-\$" "$tmp/list.txt"; rc=$?
check "lists p: 4 segments, none claimed, token 100, lag head - 100" $rc
[ $rc = 0 ] || { echo "head $head; the listing:"; cat "$tmp/list.txt"; }
grep -Eq '^q +2 +2 ' "$tmp/list.txt"; check "lists q with its 2 claimed segments" $?
"$PAWL" status --json >"$tmp/list.json"; expect_rc "status --json without a name" 0 $?
[ "$(jq -c '[.processors[] | {processor, segments}]' "$tmp/list.json")" = '[{"processor":"p","segments":4},{"processor":"q","segments":2}]' ] &&
    [ "$(jq ".processors[0].lag_events == $((head - 100)) and .processors[0].lowest_token == 100 and .processors[1].claimed == 2" "$tmp/list.json")" = true ]
check "status --json lists both processors with their lag" $?

"$PAWL" reset q --to start >"$tmp/out" 2>"$tmp/err"; expect_rc "reset refused while claimed" 4 $?
[ ! -s "$tmp/out" ]; check "a refused reset prints nothing on stdout" $?
grep -q 'refused' "$tmp/err"; check "the refusal is on stderr" $?
"$PAWL" delete q --execute >"$tmp/out" 2>"$tmp/err"; expect_rc "delete refused while claimed" 4 $?
[ ! -s "$tmp/out" ] && [ "$(sql "SELECT count(*) FROM pawl.tokens WHERE processor = 'q'")" = 2 ]
check "refused delete: nothing on stdout, nothing deleted" $?
kill -INT "$bg"; wait "$bg"; bg=

"$PAWL" split p --execute >/dev/null 2>"$tmp/err"; expect_rc "split without --segment" 2 $?
grep -q -- '--segment' "$tmp/err"; check "names --segment" $?
"$PAWL" merge p >/dev/null 2>&1; expect_rc "merge without --segment" 2 $?
"$PAWL" reset p --to 5000 --execute >"$tmp/out" 2>"$tmp/err"; expect_rc "reset past the head refused" 4 $?
[ ! -s "$tmp/out" ] && grep -q 'past the head' "$tmp/err" && [ "$(tokens p)" = "0:100,1:100,2:100,3:100" ]
check "past the head: nothing printed as done, tokens unchanged" $?
"$PAWL" reset p --to 100 >/dev/null 2>&1; expect_rc "reset to the head itself is fine" 0 $?

"$PAWL" delete q >"$tmp/out"; expect_rc "delete preview" 0 $?
grep -q 'would delete processor q: 2 segments' "$tmp/out" && grep -q 'nothing changed' "$tmp/out" &&
    [ "$(sql "SELECT count(*) FROM pawl.tokens WHERE processor = 'q'")" = 2 ]
check "delete preview deletes nothing" $?
"$PAWL" delete q --execute >"$tmp/out"; expect_rc "delete --execute" 0 $?
[ "$(sql "SELECT count(*) FROM pawl.tokens WHERE processor = 'q'")" = 0 ] &&
    [ "$(sql "SELECT count(*) FROM pawl.processor_nodes WHERE processor = 'q'")" = 0 ] &&
    [ "$(sql "SELECT count(*) FROM pawl.tokens WHERE processor = 'p'")" = 4 ]
check "q's rows are gone, p's are kept" $?
"$PAWL" delete q >/dev/null 2>&1; expect_rc "delete of a missing processor" 5 $?

# ---- 5. conventions -------------------------------------------------------------------------------
"$PAWL" stauts 2>"$tmp/err"; expect_rc "misspelt command" 2 $?
grep -q "did you mean 'status'" "$tmp/err"; check "did you mean the command" $?
"$PAWL" status pp 2>"$tmp/err"; expect_rc "misspelt processor" 5 $?
grep -q 'did you mean p?' "$tmp/err"; check "did you mean the processor" $?
"$PAWL" reset p --to start --exectue 2>"$tmp/err"; expect_rc "misspelt flag" 2 $?
grep -q 'did you mean --execute' "$tmp/err"; check "did you mean the flag" $?
env -u PAWL_DSN "$PAWL" --dsn "$PAWL_DSN" --log-level error status p --json >"$tmp/out"; expect_rc "flags before the command" 0 $?
jq -e '.processor == "p"' "$tmp/out" >/dev/null; check "global --dsn used" $?
"$PAWL" --segment 1 status 2>/dev/null; expect_rc "a global flag the command does not take" 2 $?
for c in status reset append delete completion; do
    "$PAWL" $c -h >"$tmp/h" && grep -q '^NAME' "$tmp/h" && "$PAWL" $c -V >"$tmp/v" &&
        grep -q '^pawl ' "$tmp/v" && "$PAWL" $c --version >/dev/null
    check "$c: -h and -V" $?
done
"$PAWL" status --watch 200ms >"$tmp/watch.out" 2>"$tmp/watch.err" &
bg=$!
for _ in $(seq 1 100); do [ "$(grep -c '^PROCESSOR' "$tmp/watch.out")" -ge 2 ] && break; sleep 0.1; done
kill -INT "$bg"
for _ in $(seq 1 100); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
kill -9 "$bg" 2>/dev/null
wait "$bg"; rc=$?; bg=
expect_rc "Ctrl-C ends status --watch" 130 $rc
grep -q 'interrupted: stopped watching after [0-9]* refreshes' "$tmp/watch.err"; check "with a summary" $?
"$PAWL" --help >"$tmp/h"; grep -q '130' "$tmp/h"; check "pawl --help lists the exit codes" $?

printf '{"stream":"j","type":"T","seq":1}\n{"stream":"j","type":"T","seq":1}\n' |
    "$PAWL" --log-format json --log-level info append --events-per-append 1 >/dev/null 2>"$tmp/err.json"
expect_rc "conflict with --log-format json" 7 $?
[ -s "$tmp/err.json" ] && jq -e -s 'all(.[]; (.level | type) == "string" and (.ts | type) == "string" and (.msg | type) == "string")' "$tmp/err.json" >/dev/null
check "every stderr line is a JSON object with level, ts, msg" $?
jq -e -s 'any(.[]; .stream == "j" and .expected_version == 0 and .actual_version == 1 and .line == 2)' "$tmp/err.json" >/dev/null
check "the conflict has structured fields" $?
env -u PAWL_DSN PAWL_PG_KEY="$tmp/none" "$PAWL" --log-format json status --dsn "host=$tmp/nosock dbname=x" 2>"$tmp/err2.json" >/dev/null
jq -e -s 'length >= 1' "$tmp/err2.json" >/dev/null; check "a connection failure's lines are JSON too" $?

printf '{"stream":"e\\u001b[2Jx","type":"T"}\n' | "$PAWL" append >"$tmp/out" 2>/dev/null; expect_rc "append a stream id with ESC" 0 $?
grep -qF 'e\x1b[2Jx#' "$tmp/out" && ! grep -q $'\033' "$tmp/out"; check "append echo escapes the control character" $?
sql "UPDATE pawl.tokens SET owner = E'evil\\033[31mnode', claimed_at = now() - interval '2 hours', mode = 0 WHERE processor = 'p' AND segment_id = 1"
"$PAWL" status p >"$tmp/out"; ! grep -q $'\033' "$tmp/out" && grep -qF 'evil\x1b[31mnode' "$tmp/out"
check "status table escapes the owner" $?
"$PAWL" status >"$tmp/out"; ! grep -q $'\033' "$tmp/out"; check "processor list has no raw control character" $?

# ---- 6. appends that scripts can handle ----------------------------------------------------------
echo '{"stream":"order-1","type":"Placed","seq":1}' | "$PAWL" append >/dev/null 2>&1
echo '{"stream":"order-1","type":"Placed","seq":2}' | "$PAWL" append >/dev/null 2>&1
echo '{"stream":"order-1","type":"Placed","seq":2}' | "$PAWL" append >"$tmp/out" 2>"$tmp/err"; expect_rc "conflict exit code" 7 $?
grep -q 'stream order-1' "$tmp/err" && grep -q 'expected version 1' "$tmp/err" && grep -q 'at version 2' "$tmp/err"
check "the message names the stream, expected and actual version" $?
! grep -Eqi 'duplicate|unique|23505|events_stream_key' "$tmp/err"; check "no unique-key text reaches the user" $?
[ ! -s "$tmp/out" ]; check "nothing printed as appended" $?

printf '{"stream":"order-2","type":"A"}\n{"stream":"order-2","type":"B"}\n{"stream":"order-3","type":"A","seq":1}\n' |
    "$PAWL" append --wait --events-per-append 2 >"$tmp/out" 2>"$tmp/err"; expect_rc "append --wait" 0 $?
"$PAWL" tail --json >"$tmp/all.jsonl"
want=$(jq -r 'select(.stream == "order-2" or .stream == "order-3") | "\(.stream)#\(.seq)  index \(.index)"' "$tmp/all.jsonl")
got=$(sed -E 's/^line [0-9]+  //' "$tmp/out")
[ "$got" = "$want" ] && [ "$(wc -l <"$tmp/out")" -eq 3 ]; rc=$?
check "--wait prints each event's final index and sequence (got: $(echo $got))" $rc

# One transaction over three streams, each at "next position": every line's number is printed.
printf '{"stream":"order-2","type":"C"}\n{"stream":"order-4","type":"A"}\n{"stream":"order-3","type":"B"}\n{"stream":"order-4","type":"B"}\n' |
    "$PAWL" append --events-per-append 4 >"$tmp/out" 2>"$tmp/err"; expect_rc "mixed append" 0 $?
printf 'line 1  order-2#3\nline 2  order-4#1\nline 3  order-3#2\nline 4  order-4#2\n' >"$tmp/want"
cmp -s "$tmp/out" "$tmp/want"; rc=$?
check "a mixed append echoes every stream's number (got: $(tr '\n' ';' <"$tmp/out"))" $rc

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
