#!/usr/bin/env bash
# test_sync_failover.sh — a failover to a synchronous standby loses nothing that was acknowledged
# and moves no reader or processor backwards (README, "Failover").
#
# A private cluster of its own (PAWL_PG_KEY under the test's temporary folder: the failover kills
# its primary) with a synchronous standby (pawl-pg standby start --sync). Every client connects
# with one multi-host DSN naming both servers with target_session_attrs=read-write, so that libpq
# can find the new primary by itself after the failover. While they run:
#   - an appender: `pawl append` reading generated JSON lines, about 200 events/s, each payload
#     carrying a unique number k (line N of the appender started at base B is k = B + N); an
#     event counts as acknowledged when the tool printed `line N  STREAM#SEQ` for it (it prints
#     only after the append's transaction committed);
#   - a follower: `pawl tail --from 0 --follow --json`;
#   - a processor: `pawl run --handler print` (one segment, so that its one token orders every
#     event), one JSON line per handled event;
#   - a sampler of the processor's stored token, every 0.25 s, on whichever server takes writes.
# After 6 s the primary's WAL sender is stopped (SIGSTOP) for a second, as a slow network would
# hold the standby back: an asynchronous standby falls behind what the primary acknowledges, a
# synchronous one holds the primary's commits back. Then the primary crashes with appends in
# flight: the WAL sender is killed and the server stopped in immediate mode at once. Once the
# standby has replayed all it received, the processor's token there is noted (what the new
# primary holds) and the standby is promoted (pg_promote, as test_standby_reads.sh does). A
# client that exits meanwhile is started again on the same DSN (the appender with a new base,
# the follower from the last index it printed); one that keeps running switched by itself.
# Appends go on for 4 s on the new primary and stop; the follower and the processor catch up
# and are stopped. Checked on the promoted server (each check prints what violates it):
#   - acked: every acknowledged event is there with the stream and sequence the tool reported
#     (synchronous commit: none lost), and no event is there twice; the log is exactly 1..L;
#   - follower: it read exactly 1..L, each once and in increasing order, and each index holds on
#     the promoted server the event the follower read there (an index read on the old primary is
#     never given to another event; no event appeared below a position already read);
#   - processor: every index 1..L handled, each with the event the promoted server holds there,
#     in increasing order; nothing at or below the token the promoted server held at the failover
#     is handled twice. Above it the print handler may hand events over once more (its token is
#     stored after its output is written: a batch that fails at the crash is redelivered from
#     the stored token, docs/processors.md); the count is printed. Its final token on the new
#     primary is L, and no sampled token ever moved backwards, across the failover included.
# With an asynchronous standby (pawl-pg standby start without --sync) the status check fails, and
# so do the acked, follower and processor checks (the events of the paused second are lost and
# their indexes given to others), and the token check when a sample saw a token the standby
# never got. A missing prerequisite (PostgreSQL server binaries, psql, jq) exits 77 saying which.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
PG=${PAWL_PG:?run through ctest}
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 77; }
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }
pgbin=""
for d in /usr/lib/postgresql/15/bin /usr/lib/postgresql/*/bin; do
    if [ -x "$d/pg_ctl" ] && [ -x "$d/pg_basebackup" ]; then pgbin=$d; break; fi
done
[ -n "$pgbin" ] || { echo "SKIP: no PostgreSQL server binaries (pg_ctl, pg_basebackup in /usr/lib/postgresql/*/bin)"; exit 77; }

tmp=$(mktemp -d)
export PAWL_PG_KEY=$tmp/key
mkdir -p "$PAWL_PG_KEY"
pids=()
ws="" # the primary's WAL sender while it is stopped
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    if [ -n "$ws" ]; then kill -CONT "$ws" 2>/dev/null; fi
    PAWL_PG_STOP_MODE=immediate "$PG" remove >/dev/null 2>&1 || echo "could not remove the private cluster ($("$PG" dir))"
    rm -rf "$tmp"
}
trap cleanup EXIT
t0=$(date +%s.%N)
elapsed() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
fails=0
check() { # check NAME STATUS
    if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
fatal() { echo "FAIL $*"; exit 1; }
# gone PID SECONDS: wait up to SECONDS for PID to exit (status 1 if it is still running).
gone() {
    local _
    for _ in $(seq 1 $(($2 * 10))); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.1
    done
    return 1
}

"$PG" start >/dev/null || { echo "FAIL: could not start the private cluster"; exit 1; }
"$PG" standby start --sync || { echo "FAIL: could not start a synchronous standby"; exit 1; }
dir=$("$PG" dir)
P_DSN=$("$PG" dsn)
S_DSN=$("$PG" standby dsn)
if [[ $P_DSN =~ \ port=([0-9]+) ]]; then P_PORT=${BASH_REMATCH[1]}; else fatal "no port in $P_DSN"; fi
if [[ $S_DSN =~ \ port=([0-9]+) ]]; then S_PORT=${BASH_REMATCH[1]}; else fatal "no port in $S_DSN"; fi
# Both servers; libpq takes the first that accepts writes.
DSN="host=$dir/sock,$dir/sock port=$P_PORT,$S_PORT dbname=pawl user=pawl passfile=$dir/passfile target_session_attrs=read-write connect_timeout=2"
export PAWL_DSN=$DSN
unset PAWL_LOG_LEVEL PAWL_READ_DSN
echo "cluster and synchronous standby up after $(elapsed) s"

qs() { psql "$S_DSN" -qAtX -c "$1"; }
q() { psql "$DSN" -qAtX -c "$1"; }

status=$("$PG" standby status)
echo "standby: $status"
[[ $status == "running (synchronous):"* ]] && [ "$(psql "$P_DSN" -qAtX -c 'SHOW synchronous_standby_names')" = pawl_standby ]
check "pawl-pg standby status: synchronous, and the primary names it in synchronous_standby_names" $?
[ "$(psql "$P_DSN" -qAtX -c "SELECT sync_state FROM pg_stat_replication")" = sync ] || fatal "the standby is not synchronous: nothing below would prove anything"

"$PAWL" init >/dev/null 2>&1 || fatal "pawl init failed"

linebuf=(env)
if command -v stdbuf >/dev/null && ! grep libasan >/dev/null <<<"$(ldd "$PAWL" 2>/dev/null)"; then
    linebuf=(stdbuf -oL)
fi

# gen BASE: JSON lines k = BASE+1, BASE+2, ... (5 per 20 ms, about 200/s) until $tmp/stop exists.
gen() {
    local k=$1
    while [ ! -e "$tmp/stop" ]; do
        for _ in 1 2 3 4 5; do
            k=$((k + 1))
            printf '{"stream":"s%d","type":"T","payload":{"k":%d}}\n' $((k % 16)) "$k" || return 0
        done
        sleep 0.02
    done
}
appenders=() # "PID BASE FILE"
start_appender() { # start_appender BASE
    local f=$tmp/ack.$1
    gen "$1" | "$PAWL" append --events-per-append 5 --progress off >"$f" 2>"$f.err" &
    pids+=($!)
    appenders+=("$! $1 $f")
}
start_follower() { # start_follower FROM
    "${linebuf[@]}" "$PAWL" tail --from "$1" --follow --json >>"$tmp/follow.jsonl" 2>>"$tmp/follow.err" &
    follower=$!
    pids+=($!)
}
start_processor() {
    "${linebuf[@]}" "$PAWL" run --processor sf --handler print --segments 1 --batch-size 50 \
        --claim-timeout 3s --backoff-min 200ms --backoff-max 1s --progress off \
        >>"$tmp/proc.jsonl" 2>>"$tmp/proc.err" &
    processor=$!
    pids+=($!)
}
follower_restarts=0
processor_restarts=0
appender_restarts=0

start_appender 0
start_follower 0
start_processor
# The processor's stored token, sampled on whichever server accepts writes: "n token".
(
    n=0
    while :; do
        n=$((n + 1))
        psql "$DSN" -qAtX -c "SELECT $n, token FROM pawl.tokens WHERE processor = 'sf'" \
            2>/dev/null | tr '|' ' ' >>"$tmp/tokens"
        sleep 0.25
    done
) &
pids+=($!)

acked() { cat "$tmp"/ack.[0-9]* 2>/dev/null | grep -c '^line '; }
sleep 6
[ "$(acked)" -gt 0 ] || fatal "no append was acknowledged in 6 s: $(tail -3 "$tmp/ack.0.err")"
if ! kill -0 "$follower" 2>/dev/null || ! kill -0 "$processor" 2>/dev/null; then
    fatal "the follower or the processor exited before the failover: $(tail -3 "$tmp/follow.err" "$tmp/proc.err")"
fi

# The failover. First the primary's WAL sender stops (SIGSTOP) for a second, as a slow network
# would: with an asynchronous standby the primary would go on acknowledging commits the standby
# never gets; with a synchronous one those commits wait. Then the primary crashes with appends in
# flight: the sender is killed (it never sends what it held back) and the server stopped in
# immediate mode at once.
ws=$(psql "$P_DSN" -qAtX -c "SELECT pid FROM pg_stat_replication WHERE application_name = 'pawl_standby'")
[[ $ws =~ ^[0-9]+$ ]] || fatal "the primary has no WAL sender for the standby"
acked_pause=$(acked)
kill -STOP "$ws" || fatal "could not stop the WAL sender ($ws)"
sleep 1
kill -KILL "$ws"
ws=""
PAWL_PG_STOP_MODE=immediate "$PG" stop || fatal "could not stop the primary"
acked_before=$(acked)
echo "primary stopped (immediate) at $(elapsed) s; $acked_before events acknowledged, $((acked_before - acked_pause)) of them while the WAL sender was stopped"
for _ in $(seq 1 100); do
    [ "$(qs "SELECT pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()" 2>/dev/null)" = t ] && break
    sleep 0.1
done
# What the new primary will hold: nothing can write to the standby before it is promoted.
tok_fail=$(qs "SELECT token FROM pawl.tokens WHERE processor = 'sf'")
last_fail=$(qs "SELECT pawl_api.last_index()")
if ! [[ $tok_fail =~ ^[0-9]+$ && $last_fail =~ ^[0-9]+$ ]]; then fatal "could not read the standby after the crash"; fi
qs "SELECT pg_promote(true, 30)" >/dev/null
[ "$(qs "SELECT pg_is_in_recovery()")" = f ]
check "the primary stopped in immediate mode; the standby is promoted (its log's head $last_fail, the processor's token $tok_fail)" $?
[[ $("$PG" standby status) == "running (promoted: not in recovery)"* ]]
check "pawl-pg standby status says promoted" $?
echo "promoted at $(elapsed) s"

# Each client either carries on by itself on the new primary or is started again there.
sleep 3
for a in "${appenders[@]}"; do
    read -r apid abase afile <<<"$a"
    if kill -0 "$apid" 2>/dev/null; then
        echo "appender $abase carries on by itself ($(wc -l <"$afile") acknowledged)"
    else
        wait "$apid"
        echo "appender $abase exited ($?) at the failover: $(grep -m1 'error\|append: line' "$afile.err" | cut -c1-300)"
    fi
done
read -r apid abase afile <<<"${appenders[0]}"
if ! kill -0 "$apid" 2>/dev/null; then
    start_appender 1000000
    appender_restarts=$((appender_restarts + 1))
fi
if ! kill -0 "$follower" 2>/dev/null; then
    wait "$follower"
    echo "follower exited ($?) at the failover: $(tail -1 "$tmp/follow.err" | cut -c1-300); started again"
    start_follower "$(tail -1 "$tmp/follow.jsonl" | jq -r '.index // 0')"
    follower_restarts=$((follower_restarts + 1))
fi
if ! kill -0 "$processor" 2>/dev/null; then
    wait "$processor"
    echo "processor exited ($?) at the failover: $(tail -1 "$tmp/proc.err" | cut -c1-300); started again"
    start_processor
    processor_restarts=$((processor_restarts + 1))
fi

sleep 4
touch "$tmp/stop"
for a in "${appenders[@]}"; do
    read -r apid abase afile <<<"$a"
    gone "$apid" 20 || fatal "appender $abase did not end within 20 s of its input: $(tail -3 "$afile.err")"
done
acked_after=$(($(acked) - acked_before))
[ "$acked_after" -gt 0 ]
check "appends go on after the failover ($acked_after more acknowledged; appender restarted $appender_restarts times)" $?
# Everything committed gets its index: an append with --wait finalizes all before it.
printf '{"stream":"end","type":"End","payload":{"k":0}}\n' | "$PAWL" append --wait >/dev/null 2>&1 ||
    fatal "the closing append failed"
last=$(q "SELECT pawl_api.last_index()")
echo "log: $last events on the new primary"
for _ in $(seq 1 300); do
    f_last=$(tail -1 "$tmp/follow.jsonl" | jq -r '.index // 0')
    p_tok=$(q "SELECT token FROM pawl.tokens WHERE processor = 'sf'" 2>/dev/null)
    [ "$f_last" = "$last" ] && [ "$p_tok" = "$last" ] && break
    sleep 0.1
done
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
for p in "$follower" "$processor"; do
    if ! gone "$p" 20; then echo "FAIL pid $p did not stop within 20 s of SIGTERM"; fails=$((fails + 1)); fi
done
for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
wait 2>/dev/null
pids=()

# The promoted server's log: "index k stream seq".
"$PAWL" tail --from 0 --json 2>/dev/null | jq -r '[.index, .payload.k, .stream, .seq] | @tsv' >"$tmp/log.tsv"
awk -v last="$last" '$1 != NR { bad++; if (bad < 5) print "log line " NR " holds index " $1 }
                     END { exit bad > 0 || NR != last }' "$tmp/log.tsv"
check "the promoted log is exactly indexes 1..$last" $?
awk '$2 != 0 { if (seen[$2]++) { bad++; if (bad < 5) print "event k=" $2 " twice (index " $1 ")" } }
     END { exit bad > 0 }' "$tmp/log.tsv"
check "no event is in the log twice" $?

# Acknowledged: "k stream seq" from every appender's output (line N of base B is k = B + N).
for f in "$tmp"/ack.[0-9]*; do
    [[ $f == *.err ]] && continue
    b=${f##*.}
    sed -n 's/^line \([0-9]*\)  \(.*\)#\([0-9]*\)$/\1 \2 \3/p' "$f" | awk -v b="$b" '{ print b + $1, $2, $3 }'
done >"$tmp/acked"
[ "$(wc -l <"$tmp/acked")" -eq $((acked_before + acked_after)) ] || fatal "could not parse the appenders' output"
awk 'NR == FNR { at[$2] = $3 " " $4; next }
     { if (!($1 in at)) { lost++; if (lost <= 5) print "acknowledged, not on the promoted server: k=" $1 " (" $2 "#" $3 ")" }
       else if (at[$1] != $2 " " $3) { bad++; if (bad <= 5) print "k=" $1 " acknowledged as " $2 "#" $3 ", is " at[$1] } }
     END { if (lost) print lost " of " FNR " acknowledged events lost"; exit lost + bad > 0 }' "$tmp/log.tsv" "$tmp/acked"
check "every acknowledged append is on the promoted server as acknowledged ($acked_before before the crash, $acked_after after)" $?

# The follower: exactly 1..last, in order, each index the event the log holds there.
jq -r '[.index, .payload.k] | @tsv' "$tmp/follow.jsonl" >"$tmp/follow.tsv"
awk 'NR == FNR { at[$1] = $2; next }
     { if ($1 != FNR) { bad++; if (bad <= 5) print "follower line " FNR " read index " $1 " (after " prev ")" }
       else if (at[$1] != $2) { bad++; if (bad <= 5) print "follower read index " $1 " as k=" $2 "; the promoted server holds k=" at[$1] }
       prev = $1 }
     END { exit bad > 0 }' "$tmp/log.tsv" "$tmp/follow.tsv"
ok=$?
nf=$(wc -l <"$tmp/follow.tsv")
[ "$nf" -eq "$last" ] && [ $ok -eq 0 ]
check "follower: read 1..$last once each, in order, each index the event the promoted server holds ($nf lines; restarted $follower_restarts times)" $?

# The processor: every index handled with the event the log holds there; indexes increase,
# except where a redelivery from the stored token starts again, which must be above the token the
# new primary held at the failover; nothing at or below that token handled twice.
jq -r '[.index, .payload.k] | @tsv' "$tmp/proc.jsonl" >"$tmp/proc.tsv"
awk -v tok="$tok_fail" -v last="$last" 'NR == FNR { at[$1] = $2; next }
     { if (at[$1] != $2) { bad++; if (bad <= 5) print "processor handled index " $1 " as k=" $2 "; the promoted server holds k=" at[$1] }
       if (FNR > 1 && $1 <= prev) {
           back++
           if ($1 <= tok) { bad++; if (bad <= 5) print "processor: index " $1 " after " prev ", at or below its token at the failover " tok } }
       if (n[$1]++) { dup++; if ($1 <= tok) { bad++; if (bad <= 5) print "processor handled index " $1 " twice, at or below its token at the failover " tok } }
       prev = $1 }
     END { for (i = 1; i <= last; i++) if (!(i in n)) { miss++; if (miss <= 5) print "processor never handled index " i }
           print "processor: " (dup + 0) " events redelivered in " (back + 0) " redeliveries from the stored token (above " tok ")"
           exit bad + miss > 0 }' "$tmp/log.tsv" "$tmp/proc.tsv"
check "processor: 1..$last handled, each the event the promoted server holds there, in increasing order, none twice at or below its token at the failover ($tok_fail; restarted $processor_restarts times)" $?
final=$(q "SELECT token FROM pawl.tokens WHERE processor = 'sf'")
[ "$final" = "$last" ]
check "processor: its token on the new primary is $last ($final)" $?
awk -v last="$last" '{ if ($2 < tok) { bad++; print "token went back: sample " $1 ": " $2 " after " tok }
                       if ($2 > last) { bad++; print "token beyond the log: " $0 }
                       tok = $2 }
                     END { print NR " token samples"; exit bad > 0 }' "$tmp/tokens"
check "processor: no sampled token moved backwards, across the failover included" $?
! grep -h -A5 "Sanitizer\|runtime error" "$tmp"/*.err
check "no sanitizer report" $?
if [ "$fails" -ne 0 ]; then
    for f in "$tmp"/*.err; do echo "--- $(basename "$f")"; tail -8 "$f" | cut -c1-300; done
fi
echo "done in $(elapsed) s"
exit $((fails > 0))
