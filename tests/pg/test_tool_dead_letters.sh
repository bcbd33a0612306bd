#!/usr/bin/env bash
# test_tool_dead_letters.sh — `pawl dead-letters` through the real binary against the private
# PostgreSQL: list, show, retry and drop (preview without --execute, applied with it), bad
# input refused with a clear message, and the processor name taken from the command line only
# for the changing actions. The letters are written straight into pawl.dead_letters (the
# processor side is tests/pg/test_dead_letters_pg.c).
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

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
"$PAWL" status p >"$tmp/status" 2>&1; expect_rc "status" 0 $?
grep -q 'dead letters: 3 in 1 parked stream' "$tmp/status"; check "status has a dead-letters line" $?
"$PAWL" dead-letters p show --stream orders-7 >"$tmp/show" 2>&1; expect_rc "show" 0 $?
[ "$(grep -c '^orders-7 index' "$tmp/show")" = 3 ]; check "show prints the 3 letters" $?
grep -q 'waits behind index 10' "$tmp/show"; check "show says what a letter waits behind" $?

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
