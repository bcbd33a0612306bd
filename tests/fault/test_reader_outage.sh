#!/usr/bin/env bash
# test_reader_outage.sh — readers through lost connections and server restarts, end to end.
#
# On a cluster of this test's own (so restarting it disturbs no other test), appends go on in
# a loop while two readers run: `pawl tail --follow --json` (pawl_follow) and `pawl run
# --handler print` (a processor on the log's event source, one segment, so in index order).
# Every pawl connection (application_name 'pawl...': the readers', their listeners' and
# finalizers', the appenders') is terminated again and again, the server is restarted once in
# fast mode and once in immediate mode (a crash), and the kills go on. Checked:
#   - both restarts happened: `pawl-pg restart` succeeded and the server then answered as a new
#     postmaster (pg_postmaster_start_time changed);
#   - both readers are still running and deliver every final event exactly once, in index
#     order, contiguous (the processor's replays after a failed batch are marked and left out);
#   - tail logged the outage ("read: lost the connection") and its summary counts the retries;
#     the processor never saw a read fail (the store retried it). Besides the blind kills, reads
#     are ended while they run (a loop in the server watching pg_stat_activity), so that this
#     does not depend on a kill landing in a read's millisecond.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
PG=${PAWL_PG:?run through ctest}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 77; }

work=$(mktemp -d /tmp/pawl-outage.XXXXXX)
chmod 755 "$work"
export PAWL_PG_KEY=$work
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    "$PG" remove >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT
"$PG" start || { echo "cannot start a cluster of this test's own"; exit 1; }
export PAWL_DSN="$("$PG" dsn)"
unset PAWL_LOG_LEVEL
q() { psql "$PAWL_DSN" -qAtX -c "$1" 2>/dev/null; }

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
# The stores retry connections quickly, so that the test's outages are short.
common=(--reconnect-min 20ms --reconnect-max 300ms)

"$PAWL" tail --follow --json --from 0 "${common[@]}" >"$work/tail.out" 2>"$work/tail.err" &
tail_pid=$!
pids+=("$tail_pid")
"${linebuf[@]}" "$PAWL" run --processor outage --segments 1 --handler print --progress off "${common[@]}" \
    >"$work/run.out" 2>"$work/run.err" &
run_pid=$!
pids+=("$run_pid")

# The appender: 10 events per `pawl append`, a new process each time; one refused while the
# server is away is simply not in the log (the readers are checked against the log itself).
(
    i=0
    while [ ! -f "$work/stop" ]; do
        for k in 0 1 2 3 4 5 6 7 8 9; do
            printf '{"stream":"o-%d","type":"t","payload":"%d-%d"}\n' $((k % 3)) "$i" "$k"
        done | "$PAWL" append "${common[@]}" >/dev/null 2>&1
        i=$((i + 1))
        sleep 0.05
    done
) &
pids+=($!)

kill_all() {
    q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
        WHERE application_name LIKE 'pawl%' AND pid <> pg_backend_pid()" >/dev/null
}
# pg_restart MODE: restart the server with that shutdown mode; succeeds only when the restart
# command did and the server then answers as a new postmaster (its start time changed).
pg_restart() {
    local before after rc
    before=$(q "SELECT pg_postmaster_start_time()")
    PAWL_PG_STOP_MODE=$1 "$PG" restart >"$work/pg-restart-$1.log" 2>&1; rc=$?
    after=$(q "SELECT pg_postmaster_start_time()")
    echo "$1 restart: pawl-pg exited $rc; postmaster started ${before:-?} -> ${after:-unreachable}"
    [ $rc -eq 0 ] && [ -n "$after" ] && [ "$after" != "$before" ] && return 0
    tail -n 5 "$work/pg-restart-$1.log"
    return 1
}
sleep 1
restart_fast=1 restart_immediate=1
for round in $(seq 1 40); do
    kill_all
    sleep 0.$((RANDOM % 3 + 1))
    if [ "$round" -eq 15 ]; then
        pg_restart fast; restart_fast=$?
    fi
    if [ "$round" -eq 30 ]; then
        pg_restart immediate; restart_immediate=$?
    fi
done
# Kills land mid-read only by chance (a read takes a millisecond or two, ~20 a second): also
# end readers' sessions while a read is running. A loop inside the server looks at
# pg_stat_activity every millisecond and ends the session of one running pawl_api.read (either
# reader's: tail must log it, the processor's store must retry it unseen); again until tail has
# logged one, for at most 20 reads.
for i in $(seq 1 20); do
    grep -q 'read: lost the connection' "$work/tail.err" && break
    q "DO \$\$ DECLARE n int := 0; t0 timestamptz := clock_timestamp(); BEGIN
         WHILE n < 1 AND clock_timestamp() < t0 + interval '5 s' LOOP
           PERFORM pg_stat_clear_snapshot();
           n := n + (SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                      WHERE application_name = 'pawl' AND state = 'active'
                        AND query LIKE '%pawl_api.read(%' AND pid <> pg_backend_pid());
           PERFORM pg_sleep(0.001);
         END LOOP;
       END \$\$" >/dev/null
    sleep 0.3
done
touch "$work/stop"
sleep 1

# Wait until every appended event is final (the readers' finalizers' safety runs pick up the
# appends of processes that died before finalizing), then until both readers have it all.
final=0
for i in $(seq 1 100); do
    total=$(q "SELECT count(*) FROM pawl.events")
    final=$(q "SELECT pawl_api.last_index()")
    [ -n "$total" ] && [ "$total" = "$final" ] && break
    sleep 0.2
done
echo "events in the log: $final (of ${total:-?} appended)"
check "PostgreSQL restarted in fast mode" $restart_fast
check "PostgreSQL restarted in immediate mode (crash recovery)" $restart_immediate
[ "${final:-0}" -gt 100 ]; check "appends went on through the outages ($final events)" $?
for i in $(seq 1 150); do
    t=$(wc -l <"$work/tail.out")
    if [ "${linebuf[0]}" = env ]; then # its output comes at exit: ask its token instead
        r=$(q "SELECT coalesce(min(token), 0) FROM pawl.tokens WHERE processor = 'outage'")
    else
        r=$(grep -vc '^(replay)' "$work/run.out")
    fi
    [ "$t" -ge "$final" ] && [ "${r:-0}" -ge "$final" ] && break
    sleep 0.2
done

kill -0 "$tail_pid" 2>/dev/null; check "tail --follow is still running" $?
kill -0 "$run_pid" 2>/dev/null; check "pawl run is still running" $?
kill -INT "$tail_pid" "$run_pid" 2>/dev/null
wait "$tail_pid"; trc=$?
wait "$run_pid"; rrc=$?
[ "$trc" -eq 130 ]; check "tail exits 130 on SIGINT (exit $trc)" $?
[ "$rrc" -eq 130 ]; check "pawl run exits 130 on SIGINT (exit $rrc)" $?

seq 1 "$final" >"$work/want"
jq -r .index "$work/tail.out" >"$work/tail.idx"
cmp -s "$work/want" "$work/tail.idx"; st=$?
check "tail delivered 1..$final exactly once, in order ($(wc -l <"$work/tail.idx") lines)" $st
grep -v '^(replay)' "$work/run.out" | jq -r .index >"$work/run.idx"
cmp -s "$work/want" "$work/run.idx"; st=$?
replays=$(grep -c '^(replay)' "$work/run.out")
check "the processor handled 1..$final exactly once, in order, replays aside ($(wc -l <"$work/run.idx") lines, $replays replays)" $st
# The contents too: tail's events are the log's.
q "SELECT stream_id || ' ' || stream_seq FROM pawl_api.read(0, 100000) ORDER BY global_index" \
    >"$work/log.events"
jq -r '"\(.stream) \(.seq)"' "$work/tail.out" >"$work/tail.events"
cmp -s "$work/log.events" "$work/tail.events"; check "tail's events are the log's" $?

grep -q 'read: lost the connection' "$work/tail.err"; check "tail logged the outage" $?
# The processor's event source retries inside the store: its reads never failed (before, the
# processor logged each failed read and backed off for up to seconds at a time).
! grep -q 'reading the log failed' "$work/run.err"; check "the processor never saw a read fail" $?
retries=$(sed -n 's/.*read retries \([0-9]*\) over \([0-9]*\) lost connections.*/\1/p' "$work/tail.err" | tail -1)
[ "${retries:-0}" -gt 0 ]; check "tail's summary counts the read retries (${retries:-none})" $?
lines=$(grep -c 'read: lost the connection' "$work/tail.err")
outages=$(sed -n 's/.*over \([0-9]*\) lost connections.*/\1/p' "$work/tail.err" | tail -1)
[ "$lines" -le "${outages:-0}" ]; check "one line per outage, not per retry ($lines lines, $outages outages)" $?

if [ "$fails" -ne 0 ]; then
    echo "--- run: first differences from 1..$final"; diff "$work/want" "$work/run.idx" | head -10
    head -3 "$work/run.out"
    echo "--- tail stderr (last 20)"; tail -20 "$work/tail.err"
    echo "--- run stderr (last 20)"; tail -20 "$work/run.err"
fi
[ "$fails" -eq 0 ] && echo "all passed" || echo "$fails failed"
exit $((fails > 0))
