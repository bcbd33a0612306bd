#!/usr/bin/env bash
# test_standby_reads.sh — processors reading from a real streaming standby of the private cluster
# (pawl-pg standby) while events are appended on the primary, through a standby that lags
# (replay paused) and restarts:
#
#   - the standby's replay is paused for 3 s while appends go on, and resumed; then the standby
#     is stopped immediately (a crash) and started again under appends;
#   - processor pa: --read-fallback primary --read-max-lag 1s, LISTEN wake-ups. While replay
#     is paused it logs the fallback once, reads from the primary and gets ahead of what the
#     standby has; when the standby has caught up it logs that it reads from it again; the
#     restart sends it to the primary and back.
#   - processor pb: --read-fallback wait --read-wake poll. While replay is paused none of its
#     stored tokens passes the standby's highest index (it waits, and says so once).
#   - then the standby is promoted and takes an event of its own: `pawl tail --read-dsn` on it
#     reads the primary's events instead (read-fallback primary) or nothing (wait), never its
#     event, and says that the server is not in recovery;
#   - both: every appended event is handed over exactly once (the print handler's output holds
#     each index 1..N once), each stream's events in sequence order, and no stored token ever
#     moves backwards or beyond the log (sampled every 0.25 s throughout).
# It runs a cluster of its own (PAWL_PG_KEY under its temporary folder) with a standby it makes,
# so the promotion always runs: it never depends on, or touches, a standby a developer keeps
# running on the checkout's cluster. A missing prerequisite exits 77 saying which.
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
db=t_standby_$$
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    PAWL_PG_STOP_MODE=immediate "$PG" remove >/dev/null 2>&1 || echo "could not remove the private cluster ($("$PG" dir))"
    rm -rf "$tmp"
}
trap cleanup EXIT

t0=$(date +%s.%N)
"$PG" start >/dev/null || { echo "FAIL: could not start the private cluster"; exit 1; }
BASE_DSN=$("$PG" dsn)
"$PG" standby start || { echo "FAIL: could not start the standby"; exit 1; }
SB_BASE="$("$PG" standby dsn)"
echo "standby up after $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s: $SB_BASE"

psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db" && psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" || exit 1
export PAWL_DSN="$BASE_DSN dbname=$db"
SB="$SB_BASE dbname=$db"
unset PAWL_LOG_LEVEL PAWL_READ_DSN
"$PAWL" init >/dev/null 2>&1 || { echo "pawl init failed"; exit 1; }
q() { psql "$PAWL_DSN" -qAtX -c "$1"; }
qs() { psql "$SB" -qAtX -c "$1"; }
for i in $(seq 1 100); do
    [ "$(qs "SELECT pawl_api.last_index()" 2>/dev/null)" = 0 ] && break
    sleep 0.1
done
[ "$(qs "SELECT pawl_api.last_index()" 2>/dev/null)" = 0 ] || { echo "FAIL: the schema did not reach the standby"; exit 1; }

fails=0
check() { # check NAME STATUS
    if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}

linebuf=(env)
# (ldd's output is taken whole, not piped: grep stops at its first match when writing to
# /dev/null, ldd could die of SIGPIPE and pipefail would call ASan absent.)
if command -v stdbuf >/dev/null && ! grep libasan >/dev/null <<<"$(ldd "$PAWL" 2>/dev/null)"; then
    linebuf=(stdbuf -oL)
fi
run_proc() { # run_proc NAME FLAGS...
    local name=$1
    shift
    "${linebuf[@]}" "$PAWL" run --processor "$name" --handler print --segments 8 --batch-size 50 \
        --read-dsn "$SB" --progress off "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    pids+=($!)
}
run_proc pa --read-fallback primary --read-max-lag 1s
run_proc pb --read-fallback wait --read-wake poll --read-poll-max 50ms

# Tokens sampled throughout: "sample processor segment token".
(
    n=0
    while :; do
        n=$((n + 1))
        q "SELECT $n, processor, segment_id, token FROM pawl.tokens WHERE processor IN ('pa','pb')" \
            2>/dev/null | tr '|' ' ' >>"$tmp/tokens"
        sleep 0.25
    done
) &
pids+=($!)

"$PAWL" append --generate --rate 400 --duration 12s --streams 40 --progress off \
    >/dev/null 2>"$tmp/append.err" &
app=$!

sleep 2
# Lag: the standby stops replaying; readers see it fall behind what the primary announces.
qs "SELECT pg_wal_replay_pause()" >/dev/null || echo "could not pause replay"
sleep 3
sb_last=$(qs "SELECT pawl_api.last_index()")
pa_max=$(q "SELECT max(token) FROM pawl.tokens WHERE processor = 'pa'")
pb_max=$(q "SELECT max(token) FROM pawl.tokens WHERE processor = 'pb'")
primary_last=$(q "SELECT pawl_api.last_index()")
echo "replay paused: standby at $sb_last, primary at $primary_last; pa's highest token $pa_max, pb's $pb_max"
[ "$pb_max" -le "$sb_last" ]
check "wait: no token of pb passes the paused standby ($pb_max <= $sb_last)" $?
[ "$pa_max" -gt "$sb_last" ]
check "primary fallback: pa got ahead of the paused standby ($pa_max > $sb_last)" $?
qs "SELECT pg_wal_replay_resume()" >/dev/null
# A restart (an immediate stop: a crash of the standby) while appends go on: both lose their
# standby connections for a while.
PAWL_PG_STOP_MODE=immediate "$PG" standby restart >/dev/null || { echo "FAIL: standby restart"; exit 1; }
echo "standby restarted"
wait "$app"
check "appender finished" $?
last=$(q "SELECT pawl_api.last_index()")
echo "appended: $last events"

for name in pa pb; do
    for i in $(seq 1 300); do
        [ "$(wc -l <"$tmp/$name.out")" -ge "$last" ] && break
        sleep 0.1
    done
done
sleep 1 # tokens of the last batches
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
wait 2>/dev/null
pids=()

for name in pa pb; do
    n=$(wc -l <"$tmp/$name.out")
    uniq=$(jq -r .index "$tmp/$name.out" | sort -n | uniq | wc -l)
    dups=$(jq -r .index "$tmp/$name.out" | sort -n | uniq -d | wc -l)
    range=$(jq -r .index "$tmp/$name.out" | sort -n | sed -n '1p;$p' | tr '\n' ' ')
    [ "$n" -eq "$last" ] && [ "$uniq" -eq "$last" ] && [ "$dups" -eq 0 ] && [ "$range" = "1 $last " ]
    check "$name: exactly once: $n lines, $uniq distinct indexes ($range), $dups duplicated, of $last" $?
    jq -r '"\(.stream) \(.seq)"' "$tmp/$name.out" |
        awk '{ if ($2 != last[$1] + 1) { bad++; print "out of order: " $0 " after " last[$1] } last[$1] = $2 }
             END { exit bad > 0 }' | head -5
    check "$name: each stream's events in sequence order" "${PIPESTATUS[1]}"
done
awk -v last="$last" '{ k = $2 " " $3; if (k in tok && $4 < tok[k]) { bad++; print "regressed: " $0 " after " tok[k] }
                       if ($4 > last) { bad++; print "beyond the log: " $0 }
                       tok[k] = $4 }
                     END { print NR " token rows sampled"; exit bad > 0 }' "$tmp/tokens"
check "no stored token moved backwards or beyond the log" $?
final=$(q "SELECT count(*) FROM pawl.tokens WHERE processor IN ('pa','pb') AND token = $last")
[ "$final" -eq 16 ]
check "every segment's token reached $last ($final of 16)" $?

grep -q "reading from the primary until it is readable again" "$tmp/pa.err"
check "pa logged its fallback to the primary" $?
grep -q "is readable again after" "$tmp/pa.err"
check "pa logged its return to the standby" $?
grep -q "waiting for it (read-fallback wait)" "$tmp/pb.err"
check "pb logged that it waits for the standby" $?
# A standby given where the primary is needed (appends, init, a processor) is refused at once,
# saying it is a standby; reading from it with the finalizer off still works.
printf '{"stream":"x","type":"t","payload":1}\n' | PAWL_DSN="$SB" "$PAWL" append >/dev/null 2>"$tmp/sb.err"
rc=$?
[ $rc -ne 0 ] && grep -q "is a standby (in recovery)" "$tmp/sb.err"
check "append with the standby as --dsn: refused, naming it a standby (exit $rc)" $?
PAWL_DSN="$SB" "$PAWL" init >/dev/null 2>"$tmp/sb.err"
rc=$?
[ $rc -ne 0 ] && grep -q "is a standby (in recovery)" "$tmp/sb.err"
check "init with the standby as --dsn: refused, naming it a standby (exit $rc)" $?
PAWL_DSN="$SB" timeout 20 "$PAWL" run --processor psb >/dev/null 2>"$tmp/sb.err"
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "is a standby (in recovery)" "$tmp/sb.err"
check "run with the standby as --dsn: refused at once, naming it a standby (exit $rc)" $?
[ "$(PAWL_DSN="$SB" "$PAWL" tail --from 0 --count 3 --no-finalizer 2>/dev/null | wc -l)" -eq 3 ]
check "tail with the standby as --dsn and no finalizer reads" $?
# A standby cannot LISTEN: a store opened on it has no listener (it says so) and a follower
# finds new events when it looks again, instead of failing to open or waiting for ever.
PAWL_DSN="$SB" timeout 20 "$PAWL" tail --from "$last" --follow --count 1 --no-finalizer --json \
    >"$tmp/sbf.out" 2>"$tmp/sbf.err" &
fpid=$!
sleep 1
printf '{"stream":"after-follow","type":"t","payload":1}\n' | "$PAWL" append --wait >/dev/null 2>&1
wait "$fpid"
rc=$?
last=$((last + 1))
[ $rc -eq 0 ] && [ "$(jq -r .index "$tmp/sbf.out")" = "$last" ] &&
    grep -q "is a standby (in recovery), which cannot LISTEN" "$tmp/sbf.err"
check "tail --follow with the standby as --dsn: no listener (says why), sees a later event (exit $rc)" $?

# Promotion: a standby that leaves recovery is never read from. The standby is this test's own
# (its private cluster's), so this always runs.
qs "SELECT pg_promote(true, 30)" >/dev/null
[ "$(qs "SELECT pg_is_in_recovery()")" = f ]
check "the standby is promoted" $?
# It takes writes of its own now: an event that the primary never had.
printf '{"stream":"only-on-the-promoted","type":"t","payload":1}\n' |
    PAWL_DSN="$SB" "$PAWL" append --wait >/dev/null 2>&1
check "the promoted standby takes an append" $?
"$PAWL" tail --from 0 --read-dsn "$SB" >"$tmp/tail_p.out" 2>"$tmp/tail_p.err"
[ "$(wc -l <"$tmp/tail_p.out")" -eq "$last" ] && ! grep -q only-on-the-promoted "$tmp/tail_p.out" &&
    grep -q "is not in recovery" "$tmp/tail_p.err"
check "promoted: tail reads the primary's $last events instead, and says why" $?
timeout 3 "$PAWL" tail --from 0 --read-dsn "$SB" --read-fallback wait >"$tmp/tail_w.out" \
    2>"$tmp/tail_w.err"
[ ! -s "$tmp/tail_w.out" ] && grep -q "is not in recovery.*waiting for it" "$tmp/tail_w.err"
check "promoted, read-fallback wait: nothing read from it, and says why" $?
! grep -h -A5 "Sanitizer\|runtime error" "$tmp"/*.err
check "no sanitizer report" $?
for name in pa pb; do echo "--- $name: the standby's episodes"; grep "log: read" "$tmp/$name.err" | cut -c1-260; done
if [ "$fails" -ne 0 ]; then
    echo "--- pa log"; grep -v "^.\{24\}info  \(checkpoint\|timers\)" "$tmp/pa.err" | tail -20
    echo "--- pb log"; tail -20 "$tmp/pb.err"
    echo "--- append log"; tail -5 "$tmp/append.err"
fi
echo "done in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
exit $((fails > 0))
