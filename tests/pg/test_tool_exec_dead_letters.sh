#!/usr/bin/env bash
# test_tool_exec_dead_letters.sh — dead letters reached from the command line: `pawl run
# --handler exec --dead-letter-attempts N` with a command that answers `fail INDEX REASON` or
# `poison INDEX REASON`, through the real binary against the private PostgreSQL:
#   fail:    the event is delivered N times (its lines carry "attempt": 1, 2), then its stream is
#            parked from it on (the letters list and show it with N attempts and the command's
#            reason) while the other streams of the segment flow to the head; the events before
#            it are handled once, none of its stream after it is handed to the command, and no
#            event is handled twice;
#   poison:  the event is parked at once, after one delivery, and the command keeps running;
#   fail INDEX without a policy: the events before it are committed, the event is tried again;
#   fail REASON (no index) keeps its meaning: the batch fails, the command is restarted;
#   --dead-letter-attempts with a handler that cannot fail an event (print, count) is warned
#   about at start, naming the flag and the handler.
# Retry and drop under SIGKILL are tests/pg/test_tool_exec_dead_letters_kill.sh.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_tool_exec_dl_$$
psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db" && psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" || exit 1
bg=
cleanup() {
    [ -n "$bg" ] && kill -9 "$bg" 2>/dev/null
    [ -f "$tmp/pids" ] && xargs -r kill -9 <"$tmp/pids" 2>/dev/null
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
export PAWL_DSN="$BASE_DSN dbname=$db"
export PAWL_LOG_LEVEL=warn

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
q() { psql "$PAWL_DSN" -qAtc "$1"; }
tokens() { q "SELECT coalesce(sum(token), 0) FROM pawl.tokens WHERE processor = '$1'"; }
stop_bg() {
    kill -INT "$bg" 2>/dev/null
    for _ in $(seq 1 300); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$bg" 2>/dev/null
    wait "$bg"; local rc=$?; bg=; return $rc
}
wait_for() {
    local i
    for i in $(seq 1 $(($1 * 10))); do eval "$2" && return 0; sleep 0.1; done
    return 1
}

"$PAWL" init >/dev/null 2>&1 || { echo "init failed"; exit 1; }
# Three streams, interleaved; the 10th event of bad-1 has type Bad.
for i in $(seq 1 30); do
    t=Ok; [ "$i" -eq 10 ] && t=Bad
    printf '{"stream":"good-1","type":"Ok","payload":{"n":%d}}\n' "$i"
    printf '{"stream":"good-2","type":"Ok","payload":{"n":%d}}\n' "$i"
    printf '{"stream":"bad-1","type":"%s","payload":{"n":%d}}\n' "$t" "$i"
done | "$PAWL" append >/dev/null 2>&1 || { echo "append failed"; exit 1; }
head=$(q "SELECT pawl_api.last_index()")
bad=$(q "SELECT global_index FROM pawl_api.events WHERE type = 'Bad'")

# The command, one per segment: logs every line it reads (seen.log) and every event it handles
# (handled.log); answers `fail INDEX` (or `poison INDEX` when the file poison exists) on an
# event of type Bad and then skips the rest of that batch, as the protocol asks.
cat >"$tmp/cmd.py" <<'EOF'
#!/usr/bin/env python3
import json, os, sys
d = os.path.dirname(os.path.abspath(__file__))
proc = os.environ["PAWL_PROCESSOR"]
def log(name, text):
    with open(os.path.join(d, f"{proc}.{name}"), "a") as f:
        f.write(text + "\n")
with open(os.path.join(d, "pids"), "a") as f:
    f.write(f"{os.getpid()}\n")
skip = False
for line in iter(sys.stdin.readline, ""):
    ev = json.loads(line)
    i = ev["index"]
    log("seen.log", f'{os.getpid()} {i} {ev["stream"]} {ev["type"]} {ev.get("attempt")} {int(bool(ev.get("dead_letter")))}')
    if skip:
        skip = not ev.get("batch_end")
        continue
    if ev["type"] == "Bad":
        if os.path.exists(os.path.join(d, "plain")):
            print(f"fail cannot handle {i}", flush=True)
            continue
        verb = "poison" if os.path.exists(os.path.join(d, "poison")) else "fail"
        print(f"{verb} {i} event {i} is Bad", flush=True)
        skip = not ev.get("batch_end")
        continue
    log("handled.log", f'{os.getpid()} {i} {ev["stream"]}')
    if ev.get("batch_end"):
        print("ok", i, flush=True)
EOF
chmod +x "$tmp/cmd.py"

run_exec() { # processor, extra flags...
    local proc=$1; shift
    "$PAWL" run --processor "$proc" --handler exec --segments 1 --batch-size 7 \
        --backoff-min 300ms --claim-poll 100ms --progress off "$@" -- "$tmp/cmd.py" \
        >/dev/null 2>"$tmp/$proc.err" &
    bg=$!
}
letters() { q "SELECT count(*) FROM pawl.dead_letters WHERE processor = '$1'"; }

# ---- fail INDEX: parked after 2 attempts, the rest of the segment flows on -------------------
# Batches of 7 from index 1: the failing event (30) is the second of the batch 29..35.
run_exec dl --dead-letter-attempts 2
wait_for 60 '[ "$(tokens dl)" -eq "$head" ]'; r=$?
check "fail: the segment's token reaches the head ($(tokens dl) of $head) past the failing event $bad" $r
wait_for 10 '[ "$(letters dl)" -eq 21 ]'; r=$?
check "fail: the failing event and the 20 later events of its stream are parked ($(letters dl))" $r
stop_bg
"$PAWL" dead-letters dl >"$tmp/list" 2>&1
grep -Eq "bad-1 +21 +$bad " "$tmp/list"; check "fail: pawl dead-letters lists bad-1 from $bad" $?
"$PAWL" dead-letters dl show --stream bad-1 >"$tmp/show" 2>&1
[ "$(q "SELECT attempts FROM pawl.dead_letters WHERE processor = 'dl' AND global_index = $bad")" = 2 ] &&
    [ "$(q "SELECT count(*) FROM pawl.dead_letters WHERE processor = 'dl' AND behind = $bad")" = 20 ]
check "fail: the letter has 2 attempts and the 20 others wait behind it" $?
grep -q "event $bad is Bad" "$tmp/show"; check "fail: the letter keeps the command's reason" $?
[ "$(awk -v i=$bad '$2 == i { print $5 }' "$tmp/dl.seen.log" | tr '\n' ' ')" = "1 2 " ]
check "fail: the failing event was delivered twice, with \"attempt\": 1 then 2" $?
awk -v b=$bad '$3 == "bad-1" && $2 >= b { bad++ } END { exit bad > 0 }' "$tmp/dl.handled.log"
check "fail: no event of bad-1 from $bad on was handled" $?
want=$(q "SELECT count(*) FROM pawl_api.events WHERE NOT (stream_id = 'bad-1' AND global_index >= $bad)")
[ "$(awk '{ print $2 }' "$tmp/dl.handled.log" | sort -u | wc -l)" -eq "$want" ]
check "fail: every other event was handled ($want)" $?
[ "$(awk '{ print $2 }' "$tmp/dl.handled.log" | sort | uniq -d | wc -l)" -eq 0 ]
check "fail: no event was handled twice (the events before the failing one were acknowledged)" $?
awk '{ if (p[$3] != "" && $2 <= p[$3]) bad++; p[$3] = $2 } END { exit bad > 0 }' "$tmp/dl.handled.log"
check "fail: each stream was handled in index order" $?
grep -q "stream bad-1 parked at event $bad after 2 attempts" "$tmp/dl.err"; check "fail: the parking is logged" $?

# ---- poison INDEX: parked at once ------------------------------------------------------------
touch "$tmp/poison"
run_exec dp --dead-letter-attempts 5
wait_for 60 '[ "$(tokens dp)" -eq "$head" ] && [ "$(letters dp)" -eq 21 ]'
check "poison: parked and the segment reaches the head" $?
stop_bg
[ "$(awk -v i=$bad '$2 == i' "$tmp/dp.seen.log" | wc -l)" -eq 1 ] &&
    [ "$(q "SELECT attempts FROM pawl.dead_letters WHERE processor = 'dp' AND global_index = $bad")" = 1 ]
check "poison: the event was delivered once and parked with 1 attempt" $?
[ "$(awk '{ print $2 }' "$tmp/dp.handled.log" | sort | uniq -d | wc -l)" -eq 0 ] &&
    [ "$(awk '{ print $2 }' "$tmp/dp.handled.log" | sort -u | wc -l)" -eq "$want" ]
check "poison: every other event handled once (the batch was handled again without the event before it)" $?
[ "$(awk -v i=$bad '$2 > i && $2 <= i + 5 && $5 == 2' "$tmp/dp.seen.log" | grep -vc ' bad-1 ')" -ge 1 ]
check "poison: the other streams' events after it in the batch came again with \"attempt\": 2" $?
[ "$(awk '{ print $1 }' "$tmp/dp.seen.log" | sort -u | wc -l)" -eq 1 ]
check "poison: the command kept running (one process)" $?
rm -f "$tmp/poison"

# ---- fail INDEX without a policy: the events before it are committed, it is tried again -------
run_exec dnone
wait_for 60 '[ "$(awk -v i=$bad '"'"'$2 == i'"'"' "$tmp/dnone.seen.log" 2>/dev/null | wc -l)" -ge 3 ]'
check "no policy: the failing event is delivered again and again" $?
[ "$(letters dnone)" -eq 0 ] && [ "$(tokens dnone)" -eq $((bad - 1)) ] &&
    [ "$(awk '{ print $2 }' "$tmp/dnone.handled.log" | sort | uniq -d | wc -l)" -eq 0 ]
check "no policy: nothing parked, the token stops just before it, nothing before it handled twice" $?
stop_bg

# ---- fail REASON without an index: the batch fails, as before --------------------------------
touch "$tmp/plain"
run_exec dplain --dead-letter-attempts 2
wait_for 60 '[ "$(awk -v i=$bad '"'"'$2 == i'"'"' "$tmp/dplain.seen.log" 2>/dev/null | wc -l)" -ge 3 ]'
check "plain fail: the batch is delivered again and again" $?
[ "$(letters dplain)" -eq 0 ] && [ "$(tokens dplain)" -lt "$bad" ]
check "plain fail: nothing parked, the token stays below the event" $?
stop_bg
grep -q 'the command reported a failure: cannot handle' "$tmp/dplain.err"
check "plain fail: the reason is logged as a failure of the batch" $?
rm -f "$tmp/plain"

# ---- the flag with a handler that cannot fail an event ---------------------------------------
for h in print count; do
    "$PAWL" run --processor dw$h --handler $h --dead-letter-attempts 3 --progress off \
        >/dev/null 2>"$tmp/w$h.err" &
    bg=$!
    wait_for 30 'grep -q "running processor" "$tmp/w$h.err"'
    stop_bg
    grep -q "dead-letter-attempts.*$h" "$tmp/w$h.err" && grep -qi "warn" "$tmp/w$h.err"
    check "--dead-letter-attempts with --handler $h: a warning naming the flag and the handler" $?
done
"$PAWL" run --processor dwx --handler exec --dead-letter-attempts 3 --progress off -- "$tmp/cmd.py" \
    >/dev/null 2>"$tmp/wx.err" &
bg=$!
wait_for 30 'grep -q "running processor" "$tmp/wx.err"'
stop_bg
! grep -q "dead-letter-attempts" "$tmp/wx.err"; check "--dead-letter-attempts with exec: no warning" $?

echo "$fails failed"
[ "$fails" -eq 0 ]
