#!/usr/bin/env bash
# test_tool_dead_letters.sh — `pawl dead-letters` through the real binary against the private
# PostgreSQL: list, show, retry and drop (preview without --execute, applied with it), bad
# input refused with a clear message, and the processor name taken from the command line only
# for the changing actions. The letters are written straight into pawl.dead_letters (the
# processor side is tests/pg/test_dead_letters_pg.c). list and show --json print one object per
# stream / letter; a processor that does not exist is exit 5, named.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_tool_dl_$$
psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db" && psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" || exit 1
cleanup() {
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
export PAWL_DSN="$BASE_DSN dbname=$db"
export PAWL_LOG_LEVEL=warn
q() { psql "$PAWL_DSN" -qAtc "$1"; }

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
expect_rc() { [ "$2" -eq "$3" ]; check "$1 (exit $3, want $2)" $?; }

"$PAWL" init >/dev/null 2>&1; expect_rc "init" 0 $?
q "SELECT pawl.tokens_init('p', 4, 0)" >/dev/null
for i in 1 2 3; do
    q "INSERT INTO pawl.dead_letters (processor, stream_id, global_index, stream_hash, segment_id,
         segment_mask, stream_seq, type, payload, attempts, behind, first_error, last_error)
       VALUES ('p', 'orders-7', $((10 * i)), 5, 1, 3, $i, 'Placed', '\\x7b7d', $([ $i = 1 ] && echo 3 || echo 0),
               $([ $i = 1 ] && echo NULL || echo 10), 'bad json', 'bad json')"
done

"$PAWL" dead-letters p >"$tmp/list" 2>&1; expect_rc "list" 0 $?
grep -q 'orders-7 *3 *10 *30' "$tmp/list"; check "list shows the stream, 3 letters, 10..30" $?
grep -q 'bad json' "$tmp/list"; check "list shows the last error" $?
grep -q '^STREAM .* AGE-S ' "$tmp/list"; check "list's AGE column says its unit" $?
"$PAWL" status p >"$tmp/status" 2>&1; expect_rc "status" 0 $?
grep -q 'dead letters: 3 in 1 parked stream' "$tmp/status"; check "status has a dead-letters line" $?
"$PAWL" dead-letters p show --stream orders-7 >"$tmp/show" 2>&1; expect_rc "show" 0 $?
[ "$(grep -c '^orders-7 index' "$tmp/show")" = 3 ]; check "show prints the 3 letters" $?
grep -q 'waits behind index 10' "$tmp/show"; check "show says what a letter waits behind" $?

# --json: one object per stream (list) or letter (show), the event's id when it has one.
q "UPDATE pawl.dead_letters SET event_id = 'ev-10' WHERE global_index = 10"
"$PAWL" dead-letters p --json >"$tmp/json" 2>"$tmp/err"; expect_rc "list --json" 0 $?
[ "$(jq -s length "$tmp/json")" = 1 ] &&
    jq -e '.stream == "orders-7" and .letters == 3 and .first_index == 10 and .last_index == 30
           and .attempts == 3 and .last_error == "bad json" and .retry_requested == false
           and (.age_ms | type) == "number"' "$tmp/json" >/dev/null
check "list --json: one object with the stream's columns" $?
"$PAWL" dead-letters p show --stream orders-7 --json >"$tmp/json" 2>"$tmp/err"
expect_rc "show --json" 0 $?
[ "$(jq -s length "$tmp/json")" = 3 ] &&
    jq -se '.[0] | .stream == "orders-7" and .index == 10 and .seq == 1 and .type == "Placed"
            and .id == "ev-10" and .segment == 1 and .mask == 3 and .attempts == 3
            and .behind == null and .error == "bad json" and (.parked | test("Z$"))' \
        "$tmp/json" >/dev/null &&
    jq -se '.[1] | .index == 20 and .behind == 10 and .error == null and (has("id") | not)' \
        "$tmp/json" >/dev/null
check "show --json: one object per letter, with the event id when present" $?
"$PAWL" dead-letters p retry --stream orders-7 --json >"$tmp/out" 2>&1
expect_rc "retry --json refused" 2 $?
"$PAWL" dead-letters nosuch >"$tmp/out" 2>"$tmp/err"; expect_rc "unknown processor" 5 $?
grep -q 'no processor named nosuch' "$tmp/err" && [ ! -s "$tmp/out" ]
check "unknown processor: named on stderr, nothing on stdout" $?
"$PAWL" dead-letters nosuch show --stream orders-7 >/dev/null 2>&1
expect_rc "unknown processor (show)" 5 $?
"$PAWL" dead-letters nosuch --json >"$tmp/out" 2>/dev/null; expect_rc "unknown processor (--json)" 5 $?

"$PAWL" dead-letters p retry --stream orders-7 >"$tmp/out" 2>&1; expect_rc "retry preview" 0 $?
grep -q 'would retry 3 letters' "$tmp/out" && grep -q 'add --execute' "$tmp/out"
check "retry preview says what it would do" $?
[ "$(q "SELECT count(*) FROM pawl.dead_letters WHERE retry_requested_at IS NOT NULL")" = 0 ]
check "retry preview changed nothing" $?
"$PAWL" dead-letters p retry --stream orders-7 --execute >"$tmp/out" 2>&1; expect_rc "retry" 0 $?
[ "$(q "SELECT count(*) FROM pawl.dead_letters WHERE retry_requested_at IS NOT NULL")" = 3 ]
check "retry --execute requests the retry" $?
grep >/dev/null 'retry pending' <<<"$("$PAWL" dead-letters p)"; check "list shows the pending retry" $?

"$PAWL" dead-letters p drop --stream orders-7 --to 20 >"$tmp/out" 2>&1; expect_rc "drop preview" 0 $?
grep -q 'would drop 2 letters' "$tmp/out"; check "drop --to previews 2 letters" $?
[ "$(q "SELECT count(*) FROM pawl.dead_letters")" = 3 ]; check "drop preview changed nothing" $?
"$PAWL" dead-letters p drop --stream orders-7 --to 20 --execute >"$tmp/out" 2>&1
expect_rc "drop --to 20" 0 $?
[ "$(q "SELECT string_agg(global_index::text, ',') FROM pawl.dead_letters")" = 30 ]
check "drop --to 20 left the letter at 30" $?

"$PAWL" dead-letters p show >"$tmp/err" 2>&1; expect_rc "show without a stream" 2 $?
grep -q 'give --stream' "$tmp/err"; check "names the missing --stream" $?
"$PAWL" dead-letters p show --stream nope >"$tmp/err" 2>&1; expect_rc "unknown stream" 5 $?
grep -q 'no dead letters' "$tmp/err"; check "says the stream has no letters" $?
"$PAWL" dead-letters p drop --stream orders-7 --to x >"$tmp/err" 2>&1; expect_rc "bad --to" 2 $?
PAWL_PROCESSOR=p "$PAWL" dead-letters drop --stream orders-7 --execute >"$tmp/err" 2>&1
expect_rc "drop takes the name from the command line only" 2 $?
PAWL_PROCESSOR=p "$PAWL" dead-letters >"$tmp/out" 2>&1; expect_rc "list from PAWL_PROCESSOR" 0 $?

[ "$fails" -eq 0 ] || { echo "$fails checks failed"; exit 1; }
echo "all checks passed"
