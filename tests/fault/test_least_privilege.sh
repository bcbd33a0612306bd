#!/usr/bin/env bash
# test_least_privilege.sh — the role setup of sql/roles/least_privilege.sql, exercised through
# the real `pawl` binary logged in as members of each group: the appender appends and reads but
# cannot touch tokens nor run a processor; the processor runs, claims and stores tokens, resets,
# but cannot append, update or delete events, nor touch a processor it is not granted; neither
# can migrate the schema; a role outside the groups can do nothing. Every refusal is checked to
# have written nothing.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
SRC=${PAWL_SOURCE_DIR:?run through ctest}
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 77; }
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_least_priv_$$
app=lp_app_$$ proc=lp_proc_$$ other=lp_other_$$
bg=
cleanup() {
    [ -n "$bg" ] && kill -9 "$bg" 2>/dev/null
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    for r in $app $proc $other; do psql "$BASE_DSN" -qAtc "DROP ROLE IF EXISTS $r" >/dev/null 2>&1; done
    rm -rf "$tmp"
}
trap cleanup EXIT
psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" || exit 1
OWNER="$BASE_DSN dbname=$db"
export PAWL_LOG_LEVEL=error PAWL_PROGRESS=off

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
expect_rc() { [ "$2" -eq "$3" ]; check "$1 (exit $3, want $2)" $?; }
q() { psql "$OWNER" -qAtc "$1"; }
# Run SQL as a role; prints the outcome (errors included) and always succeeds, for grep.
as() { local who=$1; shift; psql "$OWNER user=$who passfile=$tmp/pgpass" -qAt -v ON_ERROR_STOP=1 -c "$1" 2>&1 || true; }

PAWL_DSN="$OWNER" "$PAWL" init >/dev/null 2>&1; expect_rc "init as the owner" 0 $?
psql "$OWNER" -q -v ON_ERROR_STOP=1 -f "$SRC/sql/roles/least_privilege.sql" >"$tmp/roles.out" 2>&1
expect_rc "role setup applies" 0 $?
psql "$OWNER" -q -v ON_ERROR_STOP=1 -f "$SRC/sql/roles/least_privilege.sql" >/dev/null 2>&1
expect_rc "role setup is idempotent" 0 $?
# Every login is a password check (no trust in the private cluster): the roles get a random
# password each, in a password file of this test's own.
pw=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
(umask 077 && for r in $app $proc $other; do echo "*:*:*:$r:$pw"; done >"$tmp/pgpass")
psql "$BASE_DSN" -qAt -v ON_ERROR_STOP=1 -c "CREATE ROLE $app LOGIN PASSWORD '$pw' IN ROLE pawl_appender" \
    -c "CREATE ROLE $proc LOGIN PASSWORD '$pw' IN ROLE pawl_processor" -c "CREATE ROLE $other LOGIN PASSWORD '$pw'" >/dev/null
expect_rc "login roles" 0 $?
q "SELECT pawl.grant_processor('pp', '$proc')" >/dev/null; expect_rc "processor pp granted to the processor's login" 0 $?

# ---- the appender ---------------------------------------------------------------------------
export PAWL_DSN="$OWNER user=$app passfile=$tmp/pgpass"
printf '%s\n' '{"stream":"a-1","type":"T","payload":{"v":1}}' '{"stream":"a-2","type":"T"}' |
    "$PAWL" append 2>"$tmp/err"
expect_rc "appender: pawl append" 0 $?
"$PAWL" append --generate --count 200 --duration 0 --rate 0 --streams 20 2>>"$tmp/err"
expect_rc "appender: pawl append --generate" 0 $?
[ "$(q 'SELECT count(*) FROM pawl_api.events')" -eq 202 ]; check "appender: 202 events finalized" $?
"$PAWL" tail --from 0 --count 202 --json >"$tmp/tail" 2>/dev/null
[ "$(wc -l <"$tmp/tail")" -eq 202 ]; check "appender: pawl tail reads them" $?
timeout -s KILL 20 "$PAWL" run --processor pa --handler count >/dev/null 2>"$tmp/err"
rc=$?; [ $rc -ne 0 ]; check "appender: pawl run refused (exit $rc)" $?
[ "$(q "SELECT count(*) FROM pawl.tokens")" -eq 0 ]; check "appender: no token row written" $?
grep >/dev/null 'permission denied' <<<"$(as $app "UPDATE pawl.tokens SET token = 0")"
check "appender: UPDATE pawl.tokens denied" $?
grep >/dev/null 'permission denied' <<<"$(as $app "SELECT pawl.store_token('p', 0, 'me', 5)")"
check "appender: store_token denied" $?
grep >/dev/null 'permission denied' <<<"$(as $app "DELETE FROM pawl.events")"; check "appender: DELETE events denied" $?
grep >/dev/null 'permission denied' <<<"$(as $app "UPDATE pawl.events SET type = 'x'")"; check "appender: UPDATE events denied" $?
"$PAWL" init >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -ne 0 ]; check "appender: pawl init refused (exit $rc)" $?

# ---- the processor --------------------------------------------------------------------------
export PAWL_DSN="$OWNER user=$proc passfile=$tmp/pgpass"
"$PAWL" run --processor pp --handler count --segments 4 --claim-poll 100ms >"$tmp/run.out" 2>"$tmp/run.err" &
bg=$!
ok=1
for _ in $(seq 1 150); do
    [ "$(q "SELECT count(*) FROM pawl.tokens WHERE processor = 'pp' AND token = 202")" = 4 ] && { ok=0; break; }
    sleep 0.2
done
check "processor: pawl run claims 4 segments and stores token 202 in each" $ok
kill -INT "$bg"; for _ in $(seq 1 100); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
wait "$bg"; rc=$?; bg=; expect_rc "processor: pawl run stops cleanly" 130 $rc
grep -qi 'permission denied\|42501' "$tmp/run.err"; [ $? -ne 0 ]; check "processor: no permission errors while running" $?
"$PAWL" status pp --json >"$tmp/st.json" 2>/dev/null; expect_rc "processor: pawl status" 0 $?
"$PAWL" reset pp --to start --execute >/dev/null 2>&1; expect_rc "processor: pawl reset --execute" 0 $?
[ "$(q "SELECT max(token) FROM pawl.tokens WHERE processor = 'pp'")" -eq 0 ]; check "processor: tokens reset to 0" $?
"$PAWL" split pp --segment 1 --execute >/dev/null 2>&1; expect_rc "processor: pawl split --execute" 0 $?
before=$(q 'SELECT count(*) FROM pawl.events')
echo '{"stream":"p-1","type":"T"}' | "$PAWL" append 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ]; check "processor: pawl append refused (exit $rc, want 1: a refusal, not an unreachable database)" $?
grep -q '42501\|permission denied' "$tmp/err"; check "processor: the message says permission denied" $?
[ "$(q 'SELECT count(*) FROM pawl.events')" -eq "$before" ]; check "processor: nothing appended" $?
as $proc "INSERT INTO pawl.events (xid, stream_seq, k, n, stream_id, type, payload) VALUES (pg_current_xact_id(), 1, 0, 1, 'x', 'T', '')" |
    grep -q 'permission denied'; check "processor: INSERT events denied" $?
grep >/dev/null 'permission denied' <<<"$(as $proc "DELETE FROM pawl.events")"; check "processor: DELETE events denied" $?
grep >/dev/null 'permission denied' <<<"$(as $proc "UPDATE pawl.tokens SET token = 0")"; check "processor: no direct UPDATE on pawl.tokens (functions only)" $?
grep >/dev/null 'may not use processor not_granted' <<<"$(as $proc "SELECT pawl.tokens_init('not_granted', 4, 0)")"
check "processor: a processor not granted is refused" $?
[ "$(q "SELECT count(*) FROM pawl.tokens WHERE processor = 'not_granted'")" -eq 0 ]; check "processor: nothing created for it" $?
"$PAWL" init >/dev/null 2>&1; rc=$?; [ $rc -ne 0 ]; check "processor: pawl init refused (exit $rc)" $?

# ---- a role in no group ---------------------------------------------------------------------
export PAWL_DSN="$OWNER user=$other passfile=$tmp/pgpass"
echo '{"stream":"o-1","type":"T"}' | "$PAWL" append >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ]; check "other: pawl append refused (exit $rc, want 1: a refusal, not an unreachable database)" $?
grep -q '42501\|permission denied' "$tmp/err"; check "other: the append's message says permission denied" $?
"$PAWL" status pp >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ]; check "other: pawl status refused (exit $rc, want 1)" $?
grep -q '42501\|permission denied' "$tmp/err"; check "other: the status message says permission denied" $?
grep >/dev/null 'permission denied' <<<"$(as $other "SELECT pawl.finalize(10)")"; check "other: finalize denied" $?
grep >/dev/null 'permission denied' <<<"$(as $other "SELECT count(*) FROM pawl.tokens")"; check "other: tokens unreadable" $?
[ "$(q 'SELECT count(*) FROM pawl.events')" -eq "$before" ]; check "other: nothing appended" $?

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
