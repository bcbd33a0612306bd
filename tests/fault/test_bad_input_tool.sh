#!/usr/bin/env bash
# test_bad_input_tool.sh — the bad-input survey of the `pawl` tool (the API's is
# test_bad_input.c): unknown commands and flags, malformed and invalid-UTF-8 JSON lines, oversized
# events, malformed DSNs, a schema newer than the binary, a read-only user, a database that
# refuses connections and no server at all. Each case checks the documented exit code (the
# table in `pawl help`), that stderr says why, and that nothing was written.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_bad_tool_$$ newer=t_bad_tool_newer_$$ closed=t_bad_tool_closed_$$ ro=bad_tool_ro_$$
cleanup() {
    for d in $db $newer $closed; do
        psql "$BASE_DSN" -qAtc "ALTER DATABASE $d ALLOW_CONNECTIONS true" >/dev/null 2>&1
        psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1
    done
    psql "$BASE_DSN" -qAtc "DROP ROLE IF EXISTS $ro" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
for d in $db $newer $closed; do psql "$BASE_DSN" -qAtc "CREATE DATABASE $d" || exit 1; done
DSN="$BASE_DSN dbname=$db"
export PAWL_DSN="$DSN" PAWL_LOG_LEVEL=error PAWL_PROGRESS=off PAWL_OPEN_TIMEOUT=3s PAWL_CONNECT_TIMEOUT=2s

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
expect_rc() { [ "$2" -eq "$3" ]; check "$1 (exit $3, want $2)" $?; }
events() { psql "$1" -qAtc "SELECT count(*) FROM pawl.events"; }
said() { grep -qi -- "$1" "$tmp/err"; check "  ... stderr says '$1'" $?; }

"$PAWL" init >/dev/null 2>&1; expect_rc "init" 0 $?
append() { "$PAWL" append "$@" 2>"$tmp/err"; }

# ---- usage ----------------------------------------------------------------------------------
echo '{"stream":"s","type":"T"}' | append --bogus; expect_rc "unknown flag" 2 $?; said "unknown flag --bogus"
echo '{"stream":"s","type":"T"}' | append -x; expect_rc "single-dash option" 2 $?
echo '{"stream":"s","type":"T"}' | append --connections 0; expect_rc "flag out of range" 2 $?
echo '{"stream":"s","type":"T"}' | append --connections 99999999999999999999; expect_rc "flag overflowing int64" 2 $?
echo '{"stream":"s","type":"T"}' | append --connections; expect_rc "flag without its value" 2 $?
echo '{"stream":"s","type":"T"}' | append stray-arg; expect_rc "unexpected argument" 2 $?
echo '{"stream":"s","type":"T"}' | PAWL_CONNECTIONS=lots "$PAWL" append 2>"$tmp/err"; expect_rc "bad environment value" 2 $?; said PAWL_CONNECTIONS
"$PAWL" frobnicate 2>"$tmp/err"; expect_rc "unknown command" 2 $?
"$PAWL" reset p --to 99999999999999999999 2>"$tmp/err"; expect_rc "reset to an index beyond int64" 2 $?; said "out of range"
"$PAWL" reset p --to yesterday 2>"$tmp/err"; expect_rc "reset to a word" 2 $?
[ "$(events "$DSN")" -eq 0 ]; check "usage errors wrote nothing" $?

# ---- input lines ----------------------------------------------------------------------------
printf '{"stream":"\xff\xfe","type":"T"}\n' | append; expect_rc "invalid UTF-8 in a stream id" 6 $?; said "line 1"
printf '{"stream":"a\xc0\xafb","type":"T"}\n' | append; expect_rc "overlong UTF-8 in a stream id" 6 $?
printf '{"stream":"s","type":"\xed\xa0\x80"}\n' | append; expect_rc "a surrogate in a type" 6 $?
printf '{"stream":"\\ud800","type":"T"}\n' | append; expect_rc "a lone surrogate escape" 6 $?
printf '{"stream":"a\\u0000b","type":"T"}\n' | append; expect_rc "NUL in a stream id" 6 $?
printf '{"stream":"%s","type":"T"}\n' "$(head -c 256 /dev/zero | tr '\0' s)" | append
expect_rc "a 256-byte stream id" 6 $?
printf '{"stream":"","type":"T"}\n' | append; expect_rc "an empty stream id" 6 $?
printf '{"stream":"s"}\n' | append; expect_rc "no type" 6 $?
printf '{"stream":"s","type":"T","colour":1}\n' | append; expect_rc "an unknown key" 6 $?; said colour
printf '{"stream":"s","type":"T","seq":-1}\n' | append; expect_rc "a negative seq" 6 $?
printf '{"stream":"s","type":"T","metadata":[1]}\n' | append; expect_rc "metadata not an object" 6 $?
printf '["s","T"]\n' | append; expect_rc "not an object" 6 $?
printf '{"stream":"s","type":"T"\n' | append; expect_rc "truncated JSON" 6 $?
head -c 100000 /dev/urandom | append; rc=$?; [ $rc -eq 6 ]; check "random bytes (exit $rc, want 6)" $?
[ "$(events "$DSN")" -eq 0 ]; check "bad lines wrote nothing" $?
printf '{"stream":"s","type":"T","payload":"%s"}\n' "$(head -c 2000 /dev/zero | tr '\0' p)" |
    append --max-event-bytes 1000; rc=$?
[ $rc -ne 0 ] && [ $rc -ne 2 ]; check "an event over --max-event-bytes refused (exit $rc)" $?; said "too big\|max-event-bytes\|larger"
[ "$(events "$DSN")" -eq 0 ]; check "the oversized event was not written" $?
printf '{"stream":"ok","type":"T"}\n{"stream":"ok","type":"T"}\n{"stream":"\xff","type":"T"}\n{"stream":"after","type":"T"}\n' | append
expect_rc "a bad third line" 6 $?; said "line 3"
[ "$(events "$DSN")" -eq 2 ] && [ "$(psql "$DSN" -qAtc "SELECT count(*) FROM pawl.events WHERE stream_id = 'after'")" -eq 0 ]
check "the lines before it were appended (documented), nothing after it" $?

# ---- DSNs -----------------------------------------------------------------------------------
echo '{"stream":"s","type":"T"}' | "$PAWL" append --dsn "host='unterminated" 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] || [ $rc -eq 3 ]; check "a malformed DSN (exit $rc, want 2 or 3)" $?
echo '{"stream":"s","type":"T"}' | "$PAWL" append --dsn "$BASE_DSN dbname=$db password=hunter2 bogus_key=1" 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] || [ $rc -eq 3 ]; check "an unknown DSN keyword (exit $rc)" $?
! grep -q hunter2 "$tmp/err"; check "  ... the password is not echoed" $?
[ "$(events "$DSN")" -eq 2 ]; check "bad DSNs wrote nothing" $?

# ---- a schema newer than the binary ---------------------------------------------------------
NDSN="$BASE_DSN dbname=$newer"
PAWL_DSN="$NDSN" "$PAWL" init >/dev/null 2>&1
psql "$NDSN" -qAtc "INSERT INTO pawl.schema_version VALUES (9999, '9999_future.sql')"
echo '{"stream":"s","type":"T"}' | PAWL_DSN="$NDSN" "$PAWL" append 2>"$tmp/err"; expect_rc "append, newer schema" 5 $?; said 9999
PAWL_DSN="$NDSN" "$PAWL" init 2>"$tmp/err"; rc=$?; [ $rc -ne 0 ]; check "init, newer schema, refused (exit $rc)" $?; said "newer"
PAWL_DSN="$NDSN" timeout -s KILL 30 "$PAWL" run --processor p 2>"$tmp/err"; rc=$?
[ $rc -ne 0 ] && [ $rc -ne 137 ]; check "run, newer schema, refused (exit $rc)" $?
[ "$(events "$NDSN")" -eq 0 ] && [ "$(psql "$NDSN" -qAtc 'SELECT count(*) FROM pawl.tokens')" -eq 0 ] &&
    [ "$(psql "$NDSN" -qAtc 'SELECT max(version) FROM pawl.schema_version')" -eq 9999 ]
check "newer schema: nothing written, version untouched" $?

# ---- a read-only user -------------------------------------------------------------------------
# Logins are password checks: the role's password is in a password file of this test's own.
pw=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
(umask 077 && echo "*:*:*:$ro:$pw" >"$tmp/pgpass")
psql "$DSN" -qAt -v ON_ERROR_STOP=1 -c "CREATE ROLE $ro LOGIN PASSWORD '$pw'" -c "GRANT USAGE ON SCHEMA pawl, pawl_api TO $ro" \
    -c "GRANT SELECT ON ALL TABLES IN SCHEMA pawl, pawl_api TO $ro" >/dev/null
echo '{"stream":"s","type":"T"}' | PAWL_DSN="$DSN user=$ro passfile=$tmp/pgpass" "$PAWL" append --no-finalizer 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ]; check "append as a read-only user (exit $rc, want 1)" $?; said "42501\|permission denied"
PAWL_DSN="$DSN user=$ro passfile=$tmp/pgpass" "$PAWL" tail --from 0 --count 2 --no-finalizer >/dev/null 2>&1; expect_rc "tail as a read-only user" 0 $?
[ "$(events "$DSN")" -eq 2 ]; check "read-only user wrote nothing" $?

# ---- databases that refuse connections ------------------------------------------------------
CDSN="$BASE_DSN dbname=$closed"
PAWL_DSN="$CDSN" "$PAWL" init >/dev/null 2>&1
psql "$BASE_DSN" -qAtc "ALTER DATABASE $closed ALLOW_CONNECTIONS false"
t0=$(date +%s)
echo '{"stream":"s","type":"T"}' | PAWL_DSN="$CDSN" "$PAWL" append 2>"$tmp/err"; expect_rc "append, database refusing connections" 3 $?
said "not currently accepting connections"
PAWL_DSN="$CDSN" "$PAWL" status p 2>/dev/null; expect_rc "status, database refusing connections" 3 $?
echo '{"stream":"s","type":"T"}' | PAWL_DSN="host=$tmp/no-server port=5432 dbname=x" "$PAWL" append 2>"$tmp/err"
expect_rc "append, no server" 3 $?
[ $(($(date +%s) - t0)) -lt 60 ]; check "  ... each gives up within its open timeout" $?
psql "$BASE_DSN" -qAtc "ALTER DATABASE $closed ALLOW_CONNECTIONS true"
[ "$(events "$CDSN")" -eq 0 ]; check "refused connections wrote nothing" $?

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
