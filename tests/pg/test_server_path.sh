#!/usr/bin/env bash
# test_server_path.sh — the server functions' two paths, chosen at `pawl init`:
#   - with pawl_native installed (make test installs it), `pawl init` takes the native path and
#     says so; `--server-path sql|native` switches either way, online: an appender and a
#     follower running through two switches see every event final once, contiguous, in order;
#   - the SQL version put back is exactly the migrations' (no drift between sql/native's
#     deactivate.sql and sql/0*.sql);
#   - the database setting pawl.server_path keeps a choice across later `pawl init`s (and a
#     session's, as the suite's *_sql tests set it through PGOPTIONS); a bad value is refused
#     naming it;
#   - a login that is not a superuser cannot declare C functions: auto stays on SQL, and
#     --server-path native fails saying why.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_spath_$$
db2=t_spath_b_$$
owner=sp_owner_$$
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    for d in $db $db2; do psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1; done
    psql "$BASE_DSN" -qAtc "DROP ROLE IF EXISTS $owner" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
for d in $db $db2; do psql "$BASE_DSN" -qAtc "CREATE DATABASE $d" || exit 1; done
DSN="$BASE_DSN dbname=$db"
DSN2="$BASE_DSN dbname=$db2"
export PAWL_LOG_LEVEL=warn PAWL_PROGRESS=off

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
q() { psql "$DSN" -qAtc "$1"; }
lang() { psql "$1" -qAtc "SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.oid = 'pawl.finalize(int4)'::regprocedure"; }

[ "$(q "SELECT count(*) FROM pg_available_extensions WHERE name = 'pawl_native'")" = 1 ]
check "the server has pawl_native (make native installs it)" $?

out=$(PAWL_DSN="$DSN" "$PAWL" init 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q 'server functions: native' <<<"$out"; check "init takes the native path and says so (exit $rc)" $?
[ "$(lang "$DSN")" = c ]; check "pawl.finalize is the C function" $?
[ "$(psql "$DSN" -qAtc "SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.oid = 'pawl.events_guard()'::regprocedure")" = c ]
check "events_guard is the C function" $?
APPEND_SIG="(text[], int8[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[])"
GROUP_SIG="(text[], int8[], int4[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[])"
[ "$(q "SELECT string_agg(p.proname || ':' || l.lanname || ':' || p.prosecdef, ' ' ORDER BY p.proname) FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.pronamespace = 'pawl'::regnamespace AND p.proname IN ('append', 'append_group', 'append_sql', 'append_group_sql') AND l.lanname <> 'sql'")" = "append:c:true append_group:c:true append_group_sql:plpgsql:true append_sql:plpgsql:true" ]
check "pawl.append and pawl.append_group are the C functions (definer), the SQL ones kept as *_sql" $?

# A second database that never leaves the SQL path (the setting holds from its first init):
# the migrations' own definitions, the reference for what switching back must restore.
PGOPTIONS="-c pawl.server_path=sql" PAWL_DSN="$DSN2" "$PAWL" init >/dev/null 2>&1
[ "$(lang "$DSN2")" = plpgsql ]; check "pawl.server_path=sql from the first init gives the PL/pgSQL function" $?
# --server-path sql on a new database: the native functions never run there, not even between
# the migrations and the switch (the extension is created only by a switch to native).
db3=${db}_3
psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db3" && psql "$BASE_DSN" -qAtc "CREATE DATABASE $db3"
PAWL_DSN="$BASE_DSN dbname=$db3" "$PAWL" init --server-path sql >/dev/null 2>&1
[ "$(lang "$BASE_DSN dbname=$db3")" = plpgsql ] &&
    [ "$(psql "$BASE_DSN dbname=$db3" -qAtc "SELECT count(*) FROM pg_extension WHERE extname = 'pawl_native'")" = 0 ]
check "init --server-path sql on a new database never switches to native on the way" $?
psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db3 WITH (FORCE)" >/dev/null

# Switch both ways while an appender appends and a follower reads.
PAWL_DSN="$DSN" "$PAWL" tail --from 0 --follow --json >"$tmp/tail" 2>"$tmp/tail.err" &
tail_pid=$!
pids+=($tail_pid)
PAWL_DSN="$DSN" "$PAWL" append --generate --rate 2000 --duration 6s --streams 20 >/dev/null 2>"$tmp/app.err" &
app_pid=$!
pids+=($app_pid)
sleep 1.5
PAWL_DSN="$DSN" "$PAWL" init --server-path sql 2>&1 | grep -q 'server functions: SQL'
check "switched to SQL while appending" $?
[ "$(lang "$DSN")" = plpgsql ]; check "pawl.finalize is the PL/pgSQL function now" $?
sleep 2
PAWL_DSN="$DSN" "$PAWL" init --server-path native 2>&1 | grep -q 'server functions: native'
check "switched back to native while appending" $?
wait $app_pid; rc=$?
check "the appender finished (exit $rc)" $rc
n=$(q "SELECT count(*) FROM pawl.events")
for _ in $(seq 1 100); do [ "$(wc -l <"$tmp/tail")" -ge "$n" ] && break; sleep 0.1; done
kill -INT $tail_pid 2>/dev/null; wait $tail_pid 2>/dev/null
[ "$n" -gt 1000 ]; check "$n events appended" $?
[ "$(q "SELECT count(*) - count(DISTINCT global_index) FROM pawl_api.events")" = 0 ] &&
    [ "$(q "SELECT count(*) FROM pawl_api.events")" = "$n" ] &&
    [ "$(q "SELECT max(global_index) FROM pawl_api.events")" = "$n" ]
check "every event final once, indexes 1..$n" $?
[ "$(q "SELECT count(*) FROM (SELECT global_index, lag(global_index) OVER (PARTITION BY stream_id ORDER BY stream_seq) p FROM pawl_api.events) x WHERE x.p > x.global_index")" = 0 ]
check "per stream, index order is sequence order" $?
got=$(jq -r '.index' "$tmp/tail" 2>/dev/null | awk 'NR != $1 { bad++ } END { print NR, bad + 0 }')
[ "$got" = "$n 0" ]; check "the follower read 1..$n in order across the switches ($got)" $?

# The SQL version put back is the migrations' own.
PAWL_DSN="$DSN" "$PAWL" init --server-path sql >/dev/null 2>&1
def() { psql "$1" -qAtc "SELECT md5(pg_get_functiondef('pawl.finalize(int4)'::regprocedure) || pg_get_functiondef('pawl.runs_guard()'::regprocedure) || pg_get_functiondef('pawl.events_guard()'::regprocedure) || pg_get_functiondef('pawl.append$APPEND_SIG'::regprocedure) || pg_get_functiondef('pawl.append_group$GROUP_SIG'::regprocedure) || coalesce((SELECT string_agg(p.proname || coalesce(p.proacl::text, '-'), ',' ORDER BY p.proname, p.oid) FROM pg_proc p WHERE p.pronamespace = 'pawl'::regnamespace AND p.proname LIKE 'append%'), ''))"; }
[ "$(def "$DSN")" = "$(def "$DSN2")" ]; check "switching back to SQL restores the migrations' definitions and grants exactly (finalize, runs_guard, events_guard, append, append_group; no *_sql left)" $?
[ "$(psql "$DSN" -qAtc "SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.oid = 'pawl.runs_guard()'::regprocedure")" = plpgsql ]
check "runs_guard is PL/pgSQL again" $?
[ "$(psql "$DSN" -qAtc "SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.oid = 'pawl.events_guard()'::regprocedure")" = plpgsql ]
check "events_guard is PL/pgSQL again" $?

# The database setting keeps a choice; a bad value is refused naming it.
psql "$BASE_DSN" -qAtc "ALTER DATABASE $db SET pawl.server_path = 'sql'"
PAWL_DSN="$DSN" "$PAWL" init >/dev/null 2>&1
[ "$(lang "$DSN")" = plpgsql ]; check "pawl.server_path = 'sql': a later pawl init keeps SQL" $?
psql "$BASE_DSN" -qAtc "ALTER DATABASE $db SET pawl.server_path = 'fast'"
out=$(PAWL_DSN="$DSN" "$PAWL" init 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "pawl.server_path is 'fast'" <<<"$out"; check "a bad pawl.server_path is refused naming it (exit $rc)" $?
psql "$BASE_DSN" -qAtc "ALTER DATABASE $db RESET pawl.server_path"

# The setting in a session's options (what the suite's *_sql tests use: PGOPTIONS) counts too.
PGOPTIONS="-c pawl.server_path=sql" PAWL_DSN="$DSN" "$PAWL" init >/dev/null 2>&1
[ "$(lang "$DSN")" = plpgsql ]; check "PGOPTIONS='-c pawl.server_path=sql': pawl init takes SQL" $?
PAWL_DSN="$DSN" "$PAWL" init >/dev/null 2>&1
[ "$(lang "$DSN")" = c ]; check "without it, native again" $?

# A schema owner that is not a superuser: auto stays SQL, native is refused saying why.
export PGPASSWORD=sp-owner-secret
psql "$BASE_DSN" -qAtc "CREATE ROLE $owner LOGIN PASSWORD '$PGPASSWORD'" -c "ALTER DATABASE $db2 OWNER TO $owner" >/dev/null
psql "$BASE_DSN" -qAtc "DROP DATABASE $db2" -c "CREATE DATABASE $db2 OWNER $owner" >/dev/null
out=$(PAWL_DSN="$DSN2 user=$owner" "$PAWL" init 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q 'server functions: SQL' <<<"$out"; check "not a superuser: auto stays on SQL (exit $rc)" $?
out=$(PAWL_DSN="$DSN2 user=$owner" "$PAWL" init --server-path native 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q 'needs a superuser' <<<"$out"; check "not a superuser: --server-path native refused saying why (exit $rc)" $?

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
