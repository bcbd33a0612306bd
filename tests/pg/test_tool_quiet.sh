#!/usr/bin/env bash
# test_tool_quiet.sh — `pawl --quiet` (-q, PAWL_QUIET) through the real binary against the private
# PostgreSQL: the tool's info-level notes (append's summary) and the library's info lines (tail's
# account) are not printed, results (stdout) and errors still are; an explicit --log-level wins
# over --quiet, a flag over an environment variable.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_tool_quiet_$$
psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db" && psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" || exit 1
cleanup() {
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
export PAWL_DSN="$BASE_DSN dbname=$db"
unset PAWL_LOG_LEVEL PAWL_QUIET

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
expect_rc() { [ "$2" -eq "$3" ]; check "$1 (exit $3, want $2)" $?; }

"$PAWL" init -q >"$tmp/out" 2>"$tmp/err"; expect_rc "init -q" 0 $?
[ ! -s "$tmp/err" ]; check "init -q: nothing on stderr" $?
grep -q 'schema' "$tmp/out"; check "init -q: its result still on stdout" $?

ev='{"stream":"s-1","type":"T","payload":{}}'
# append's summary is a note: shown by default, not with --quiet.
echo "$ev" | "$PAWL" append >/dev/null 2>"$tmp/err"; expect_rc "append" 0 $?
grep -q 'appended 1 events' "$tmp/err"; check "append: summary by default" $?
echo "$ev" | "$PAWL" append --quiet >/dev/null 2>"$tmp/err"; expect_rc "append --quiet" 0 $?
[ ! -s "$tmp/err" ]; check "append --quiet: no summary" $?
echo "$ev" | "$PAWL" append -q >/dev/null 2>"$tmp/err"; expect_rc "append -q" 0 $?
[ ! -s "$tmp/err" ]; check "append -q: no summary" $?
echo "$ev" | PAWL_QUIET=1 "$PAWL" append >/dev/null 2>"$tmp/err"; expect_rc "PAWL_QUIET=1" 0 $?
[ ! -s "$tmp/err" ]; check "PAWL_QUIET=1: no summary" $?
echo "$ev" | "$PAWL" append --quiet --log-level info >/dev/null 2>"$tmp/err"
expect_rc "append --quiet --log-level info" 0 $?
grep -q 'appended 1 events' "$tmp/err"; check "an explicit --log-level wins over --quiet" $?
echo "$ev" | PAWL_QUIET=1 "$PAWL" append --log-level info >/dev/null 2>"$tmp/err"
grep -q 'appended 1 events' "$tmp/err"; check "--log-level wins over PAWL_QUIET" $?
echo "$ev" | PAWL_LOG_LEVEL=info "$PAWL" append -q >/dev/null 2>"$tmp/err"
[ ! -s "$tmp/err" ]; check "-q wins over PAWL_LOG_LEVEL" $?
echo "$ev" | PAWL_QUIET=1 "$PAWL" append --no-quiet >/dev/null 2>"$tmp/err"
grep -q 'appended 1 events' "$tmp/err"; check "--no-quiet turns PAWL_QUIET off" $?

# The library's info lines: tail --follow gives its account at info when it ends.
"$PAWL" tail --follow --count 2 >"$tmp/out" 2>"$tmp/err"; expect_rc "tail --follow" 0 $?
grep -q 'read 2 events' "$tmp/err"; check "tail: the library's info line by default" $?
"$PAWL" tail --follow --count 2 -q >"$tmp/out" 2>"$tmp/err"; expect_rc "tail -q" 0 $?
[ "$(grep -c 's-1#' "$tmp/out")" = 2 ]; check "tail -q: the events on stdout" $?
[ ! -s "$tmp/err" ]; check "tail -q: no info line" $?

# Errors and warnings still show.
"$PAWL" status nosuch -q >"$tmp/out" 2>"$tmp/err"; expect_rc "status of no processor, -q" 5 $?
grep -q 'nosuch' "$tmp/err"; check "-q: the error is still printed" $?
"$PAWL" config -q --json >"$tmp/out" 2>/dev/null; expect_rc "config -q --json" 0 $?
grep -q '"quiet": {"value": "true", "source": "flag"' "$tmp/out" &&
    grep -q '"log-level": {"value": "warn", "source": "flag"' "$tmp/out"
check "config shows --quiet and the log level it set" $?

[ "$fails" -eq 0 ] || { echo "$fails checks failed"; exit 1; }
echo "all checks passed"
