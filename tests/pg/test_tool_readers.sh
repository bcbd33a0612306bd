#!/usr/bin/env bash
# test_tool_readers.sh — the readers of the `pawl` tool against hostile notifications, and
# `pawl status` naming the sessions that keep the finalizer out of its gate.
#
#   - `pawl tail --follow` and `pawl run` wait on an idle log while a login with no grants at
#     all sends channel pawl_log huge numbers ('9000000000000000000') and garbage, many times:
#     the readers' query rate stays idle (calls of pawl_api.read, counted by
#     pg_stat_user_functions with track_functions = 'all' for this test's database), tail's
#     listener asks the log for its highest index at most twice per notifying transaction, and
#     both readers still deliver the real events appended afterwards;
#   - the finalizer's gate is a table it locks EXCLUSIVE, NOWAIT (pawl_locks.finalizer;
#     pawl.finalizer_gate before schema 14). A psql session holding the old advisory key
#     (1885435756, 1), which any login can take, is not named: the lock is free. A session in
#     pawl.finalize's transaction holds the gate: `pawl status` names its pid, user, application,
#     mode and age, in the table and in the JSON. A session asking for ROW SHARE meanwhile waits,
#     and is named as waiting; once the holder is gone it holds ROW SHARE, which keeps the
#     finalizer out as well, and is named as blocking. Free again, status says so.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 77; }
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_tool_readers_$$
role=pawl_nogrants_$$
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    psql "$BASE_DSN" -qAtc "DROP ROLE IF EXISTS $role" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db" && psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" || exit 1
psql "$BASE_DSN" -qAtc "ALTER DATABASE $db SET track_functions = 'all'" || exit 1
# The private cluster authenticates every role but its owner by password (SCRAM).
export PGPASSWORD=pawl-test-secret
psql "$BASE_DSN" -qAtc "DROP ROLE IF EXISTS $role" &&
    psql "$BASE_DSN" -qAtc "CREATE ROLE $role LOGIN PASSWORD '$PGPASSWORD'" || exit 1
export PAWL_DSN="$BASE_DSN dbname=$db"
unset PAWL_LOG_LEVEL
q() { psql "$PAWL_DSN" -qAtX -c "$1"; }
read_calls() {
    q "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions
        WHERE schemaname = 'pawl_api' AND funcname = 'read'"
}

# The processor prints through stdio: line-buffer it where stdbuf can (not under ASan, whose
# runtime must come first in the process, before stdbuf's preload). Without it, its output is
# complete once it has stopped, and the checks below look at it then.
linebuf=(env)
# (ldd's output is taken whole, not piped: grep stops at its first match when writing to
# /dev/null, ldd could die of SIGPIPE and pipefail would call ASan absent.)
if command -v stdbuf >/dev/null && ! grep libasan >/dev/null <<<"$(ldd "$PAWL" 2>/dev/null)"; then
    linebuf=(stdbuf -oL)
fi
fails=0
check() { # check NAME STATUS
    if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}

"$PAWL" init >/dev/null 2>&1 || { echo "pawl init failed"; exit 1; }
printf '{"stream":"a","type":"t","payload":1}\n{"stream":"b","type":"t","payload":2}\n' |
    "$PAWL" append 2>/dev/null || { echo "append failed"; exit 1; }

"$PAWL" tail --follow --json --from 0 >"$tmp/tail.out" 2>"$tmp/tail.err" &
tail_pid=$!
pids+=("$tail_pid")
"${linebuf[@]}" "$PAWL" run --processor hostile --segments 1 --handler print --progress off \
    >"$tmp/run.out" 2>"$tmp/run.err" &
run_pid=$!
pids+=("$run_pid")
for i in $(seq 1 100); do
    [ "$(wc -l <"$tmp/tail.out")" -ge 2 ] && { [ "${linebuf[0]}" = env ] || [ "$(wc -l <"$tmp/run.out")" -ge 2 ]; } && break
    sleep 0.1
done
[ "$(wc -l <"$tmp/tail.out")" -eq 2 ]; check "tail delivered the first two events" $?

# ---- hostile notifications ----------------------------------------------------------------------
# The idle rate first (tail's 500 ms follow timeouts and the processor's idle waits read a few
# times a second), then about as long with the flood going on (60 transactions 50 ms apart).
sleep 2
b0=$(read_calls)
sleep 6
b1=$(read_calls)
idle=$((b1 - b0))
notify_sql="BEGIN;"
for k in $(seq 1 25); do
    notify_sql+="NOTIFY pawl_log, '9000000000000000000';NOTIFY pawl_log, '9223372036854775807';"
    notify_sql+="NOTIFY pawl_log, 'garbage $k';NOTIFY pawl_log, '-$k';NOTIFY pawl_log, '99999999999999999999$k';"
done
notify_sql+="COMMIT;"
txns=60
for t in $(seq 1 $txns); do echo "$notify_sql SELECT pg_sleep(0.05);"; done >"$tmp/flood.sql"
f0=$(read_calls)
psql "$PAWL_DSN user=$role" -qAtX -v ON_ERROR_STOP=1 -f "$tmp/flood.sql" >/dev/null 2>"$tmp/notify.err"
[ $? -eq 0 ] && [ ! -s "$tmp/notify.err" ]
check "a login with no grants may NOTIFY ($txns transactions of 125 notifications)" $?
sleep 2
f1=$(read_calls)
flood=$((f1 - f0))
echo "pawl_api.read calls in 6 s: idle $idle, with the flood $flood"
# A reader that trusted the payload spins at thousands of reads a second.
[ "$flood" -le $((2 * idle + 30)) ]; check "the readers' read rate stayed at its idle level ($flood vs $idle)" $?

# Real events still arrive.
printf '{"stream":"c","type":"t","payload":3}\n{"stream":"d","type":"t","payload":4}\n' |
    "$PAWL" append 2>/dev/null
for i in $(seq 1 100); do
    [ "$(wc -l <"$tmp/tail.out")" -ge 4 ] && { [ "${linebuf[0]}" = env ] || [ "$(wc -l <"$tmp/run.out")" -ge 4 ]; } && break
    sleep 0.1
done
[ "$(jq -r .index "$tmp/tail.out" | tr '\n' ' ')" = "1 2 3 4 " ]; check "tail delivered the real events after the flood" $?

# ---- who keeps the finalizer out ---------------------------------------------------------------
# The readers' own finalizers hold the gate for a millisecond now and then: ask up to 3 times.
status_free() {
    for try in 1 2 3; do
        "$PAWL" status hostile >"$tmp/status.txt" 2>&1
        grep -q '^finalizer lock: free$' "$tmp/status.txt" && return 0
        sleep 0.3
    done
    return 1
}
json_free() {
    for try in 1 2 3; do
        "$PAWL" status hostile --json >"$tmp/status.json" 2>/dev/null
        [ "$(jq -c .finalizer_lock "$tmp/status.json")" = '{"held":false,"sessions":[]}' ] && return 0
        sleep 0.3
    done
    return 1
}
# session NAME SQL: a psql session (application NAME) runs SQL in a transaction, then stays in it
# busy (pg_sleep: an idle one would be ended by pawl.finalize's idle_in_transaction timeout);
# session_pid NAME STATE waits until it sleeps (STATE sleeping) or waits for a lock (STATE lock).
session() {
    printf 'BEGIN;\n%s\nSELECT pg_sleep(120);\nCOMMIT;\n' "$2" |
        psql "$PAWL_DSN application_name=$1" -qAtX -v ON_ERROR_STOP=1 >/dev/null 2>&1 &
    pids+=("$!")
}
session_pid() {
    local cond="query LIKE '%pg_sleep(120)%'" pid=
    [ "$2" = lock ] && cond="wait_event_type = 'Lock'"
    for i in $(seq 1 100); do
        pid=$(q "SELECT pid FROM pg_stat_activity WHERE application_name = '$1' AND $cond")
        [ -n "$pid" ] && break
        sleep 0.1
    done
    echo "$pid"
}
ends() { q "SELECT pg_terminate_backend($1)" >/dev/null; }
user=$(q "SELECT current_user")
gate=$(q "SELECT CASE WHEN to_regclass('pawl_locks.finalizer') IS NOT NULL
                      THEN 'pawl_locks.finalizer' ELSE 'pawl.finalizer_gate' END")

status_free; check "status: finalizer lock free" $?
json_free; check "status --json: free" $?

# The old advisory key: anyone may hold it, and it keeps no finalizer out.
session adv-holder "SELECT pg_advisory_xact_lock(1885435756, 1);"
apid=$(session_pid adv-holder sleeping)
[ -n "$apid" ]; check "a session holds the old advisory key (pid ${apid:-?})" $?
status_free; check "status: free while only the old advisory key is held" $?
json_free; check "status --json: free while only the old advisory key is held" $?
[ -n "$apid" ] && ends "$apid"

# The gate, held the way pawl.finalize holds it: in its caller's transaction, until it ends
# (finalize answers -1 while a reader's finalizer has the gate: ask again).
session gate-holder "DO \$\$ BEGIN
    WHILE (SELECT appends FROM pawl.finalize()) < 0 LOOP PERFORM pg_sleep(0.01); END LOOP;
END \$\$;"
hpid=$(session_pid gate-holder sleeping)
sleep 1.2
"$PAWL" status hostile >"$tmp/status.txt" 2>&1
grep -Eq "^finalizer lock: held by pid $hpid \(user '$user', application 'gate-holder', ExclusiveLock, for [0-9]+ s\)$" "$tmp/status.txt"
check "status names the gate's holder (pid ${hpid:-?}, user, application, mode, age)" $?
"$PAWL" status hostile --json >"$tmp/status.json" 2>/dev/null
[ "$(jq -r '.finalizer_lock | "\(.held) \(.pid) \(.application) \(.seconds >= 1) \(.sessions[0].user) \(.sessions[0].mode) \(.sessions[0].granted)"' "$tmp/status.json")" = "true $hpid gate-holder true $user ExclusiveLock true" ]
check "status --json names the gate's holder" $?

# A lock in a mode that conflicts with the finalizer's: while the gate is held, its request
# waits; once the holder is gone, it holds ROW SHARE, and the finalizer cannot take the gate.
session row-share "LOCK TABLE $gate IN ROW SHARE MODE;"
wpid=$(session_pid row-share lock)
"$PAWL" status hostile >"$tmp/status.txt" 2>&1
grep -Eq "^finalizer lock: held by pid $hpid \(" "$tmp/status.txt" &&
    grep -Eq "^finalizer lock: wanted by pid $wpid \(user '$user', application 'row-share', RowShareLock, waiting [0-9]+ s\)$" "$tmp/status.txt"
check "status names the holder and the session waiting for the gate (pid ${wpid:-?})" $?
[ -n "$hpid" ] && ends "$hpid"
bpid=$(session_pid row-share sleeping)
"$PAWL" status hostile >"$tmp/status.txt" 2>&1
grep -Eq "^finalizer lock: blocked by pid $bpid \(user '$user', application 'row-share', RowShareLock, for [0-9]+ s\)$" "$tmp/status.txt" &&
    [ "$(grep -c '^finalizer lock: ' "$tmp/status.txt")" -eq 1 ]
check "status names the session holding ROW SHARE on the gate (pid ${bpid:-?})" $?
"$PAWL" status hostile --json >"$tmp/status.json" 2>/dev/null
[ "$(jq -r '.finalizer_lock | "\(.held) \(.pid) \(.sessions | length) \(.sessions[0].mode)"' "$tmp/status.json")" = "true $bpid 1 RowShareLock" ]
check "status --json names the session holding ROW SHARE" $?
[ -n "$bpid" ] && ends "$bpid"
status_free; check "status: free again" $?

kill -INT "$tail_pid" "$run_pid"
wait "$tail_pid"; trc=$?
wait "$run_pid"; rrc=$?
[ "$trc" -eq 130 ] && [ "$rrc" -eq 130 ]; check "tail and run stop cleanly (exits $trc, $rrc)" $?
[ "$(jq -r .index "$tmp/run.out" | tr '\n' ' ')" = "1 2 3 4 " ]
check "the processor handled the first events and the real ones after the flood" $?
summary=$(grep 'tail: read ' "$tmp/tail.err" | tail -1)
echo "tail's summary: $summary"
nq=$(sed -n 's/.*(index queries \([0-9]*\)).*/\1/p' <<<"$summary")
[ -n "$nq" ] && [ "$nq" -le $((2 * txns + 20)) ]
check "tail's listener coalesced the notifications into few queries (${nq:-?})" $?

if [ "$fails" -ne 0 ]; then
    echo "--- tail stderr"; tail -20 "$tmp/tail.err"
    echo "--- status"; cat "$tmp/status.txt"
fi
[ "$fails" -eq 0 ] && echo "all passed" || echo "$fails failed"
exit $((fails > 0))
