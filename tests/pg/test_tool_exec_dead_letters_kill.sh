#!/usr/bin/env bash
# test_tool_exec_dead_letters_kill.sh — `pawl dead-letters NAME retry` and `drop` with the node
# killed (SIGKILL) in the middle, through `pawl run --handler exec` and the real binary against
# the private PostgreSQL:
#   retry: the command is handed the first letter and hangs; the node is killed. The letters are
#          all still there (none was acknowledged); newer events of the stream are appended; a
#          new node retries again and the letters are gone only once the command has handled
#          every one of them (checked the moment they disappear), in index order, before any
#          newer event of the stream, which then flows; nothing is parked again;
#   drop:  the letters are dropped and the node killed at once; a new node hands the stream's
#          newer events to the command in order and never a dropped one; nothing is parked;
#          a partial drop (--to) leaves the stream parked behind the letters that remain.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_tool_exec_dlk_$$
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
letters() { q "SELECT count(*) FROM pawl.dead_letters WHERE processor = '$1'"; }
stop_bg() {
    kill -INT "$bg" 2>/dev/null
    for _ in $(seq 1 300); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$bg" 2>/dev/null
    wait "$bg"; local rc=$?; bg=; return $rc
}
kill_bg() { kill -9 "$bg" 2>/dev/null; wait "$bg" 2>/dev/null; bg=; }
wait_for() {
    local i
    for i in $(seq 1 $(($1 * 10))); do eval "$2" && return 0; sleep 0.1; done
    return 1
}
append() { # stream, count: Ok events
    for _ in $(seq 1 "$2"); do printf '{"stream":"%s","type":"Ok","payload":{}}\n' "$1"; done |
        "$PAWL" append >/dev/null 2>&1
}

"$PAWL" init >/dev/null 2>&1 || { echo "init failed"; exit 1; }
for i in $(seq 1 30); do
    t=Ok; [ "$i" -eq 10 ] && t=Bad
    printf '{"stream":"good-1","type":"Ok","payload":{"n":%d}}\n' "$i"
    printf '{"stream":"bad-1","type":"%s","payload":{"n":%d}}\n' "$t" "$i"
done | "$PAWL" append >/dev/null 2>&1 || { echo "append failed"; exit 1; }
bad=$(q "SELECT global_index FROM pawl_api.events WHERE type = 'Bad'")

# The command: poisons events of type Bad unless the file accept-bad exists; logs every line it
# reads (seen.log) and every event it handles, before acknowledging it (handled.log: pid index
# stream dead_letter); with the file hang-dl, hangs on the first dead letter it is handed.
cat >"$tmp/cmd.py" <<'EOF'
#!/usr/bin/env python3
import json, os, sys, time
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
    i, dl = ev["index"], int(bool(ev.get("dead_letter")))
    log("seen.log", f'{os.getpid()} {i} {ev["stream"]} {ev["attempt"]} {dl}')
    if skip:
        skip = not ev.get("batch_end")
        continue
    if dl and os.path.exists(os.path.join(d, "hang-dl")):
        os.remove(os.path.join(d, "hang-dl"))
        with open(os.path.join(d, "hang.pid"), "w") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(600)
    if ev["type"] == "Bad" and not os.path.exists(os.path.join(d, "accept-bad")):
        print(f"poison {i} event {i} is Bad", flush=True)
        skip = not ev.get("batch_end")
        continue
    log("handled.log", f'{os.getpid()} {i} {ev["stream"]} {dl}')
    if ev.get("batch_end"):
        print("ok", i, flush=True)
EOF
chmod +x "$tmp/cmd.py"
run_exec() { # processor
    "$PAWL" run --processor "$1" --handler exec --segments 1 --batch-size 5 --dead-letter-attempts 3 \
        --backoff-min 300ms --claim-poll 100ms --claim-timeout 1s --progress off -- "$tmp/cmd.py" \
        >/dev/null 2>>"$tmp/$1.err" &
    bg=$!
}
head_now() { q "SELECT pawl_api.last_index()"; }

# ---- retry, killed while the command holds the first letter ----------------------------------
run_exec dk
wait_for 60 '[ "$(tokens dk)" -eq "$(head_now)" ] && [ "$(letters dk)" -eq 21 ]'
check "retry: bad-1 is parked from $bad (21 letters) and the segment reached the head" $?
parked=$(q "SELECT string_agg(global_index::text, ' ' ORDER BY global_index) FROM pawl.dead_letters WHERE processor = 'dk'")
touch "$tmp/accept-bad" "$tmp/hang-dl"
"$PAWL" dead-letters dk retry --stream bad-1 --execute >/dev/null 2>&1
wait_for 60 '[ -s "$tmp/hang.pid" ]'
check "retry: the command was handed the first letter" $?
kill_bg
kill -9 "$(cat "$tmp/hang.pid")" 2>/dev/null
[ "$(letters dk)" -eq 21 ] && [ "$(q "SELECT count(*) FROM pawl.dead_letters WHERE processor = 'dk' AND retry_requested_at IS NOT NULL")" -eq 21 ]
check "retry: after the kill every letter is still there, retry still requested (none was acknowledged)" $?
append bad-1 3; append good-1 2
newer=$(q "SELECT string_agg(global_index::text, ' ' ORDER BY global_index) FROM pawl_api.events WHERE stream_id = 'bad-1' AND global_index > $(echo "$parked" | awk '{ print $NF }')")
: >"$tmp/dk.handled.log.2"
mark=$(wc -l <"$tmp/dk.handled.log")
run_exec dk
# The moment the letters are gone, every one of them must have been handled by the command.
gone_handled=1
for _ in $(seq 1 600); do
    if [ "$(letters dk)" -eq 0 ]; then
        tail -n +$((mark + 1)) "$tmp/dk.handled.log" >"$tmp/dk.handled.log.2"
        gone_handled=0
        for i in $parked; do
            awk -v i=$i '$2 == i && $4 == 1 { f = 1 } END { exit !f }' "$tmp/dk.handled.log.2" || gone_handled=1
        done
        break
    fi
    sleep 0.1
done
check "retry: the letters are gone, and each was handled (as a dead letter) when they went" $gone_handled
wait_for 60 '[ "$(tokens dk)" -eq "$(head_now)" ]'
check "retry: the segment reaches the head again" $?
stop_bg
tail -n +$((mark + 1)) "$tmp/dk.handled.log" >"$tmp/dk.handled.log.2"
[ "$(awk '$4 == 1 { printf "%s ", $2 }' "$tmp/dk.handled.log.2" | sed 's/ $//')" = "$parked" ]
check "retry: the new node handed the letters once each, in index order" $?
first_newer=$(echo "$newer" | awk '{ print $1 }')
awk -v n=$first_newer '$2 == n { exit } $4 == 1 { c++ } END { exit c != 21 }' "$tmp/dk.handled.log.2"
check "retry: every letter was handled before the stream's newer events ($newer)" $?
[ "$(awk '$3 == "bad-1" && $4 == 0 { printf "%s ", $2 }' "$tmp/dk.handled.log.2" | sed 's/ $//')" = "$newer" ]
check "retry: the newer events of bad-1 flowed, in order, after the letters" $?
[ "$(letters dk)" -eq 0 ]; check "retry: nothing was parked again" $?
rm -f "$tmp/accept-bad"

# ---- drop, the node killed at once ---------------------------------------------------------
run_exec dd
wait_for 60 '[ "$(tokens dd)" -eq "$(head_now)" ] && [ "$(letters dd)" -gt 0 ]'
check "drop: bad-1 is parked and the segment reached the head" $?
dropped=$(q "SELECT string_agg(global_index::text, ' ' ORDER BY global_index) FROM pawl.dead_letters WHERE processor = 'dd'")
"$PAWL" dead-letters dd drop --stream bad-1 --execute >/dev/null 2>&1
kill_bg
[ "$(letters dd)" -eq 0 ]; check "drop: the letters are gone" $?
append bad-1 3
newer=$(q "SELECT string_agg(global_index::text, ' ' ORDER BY global_index) FROM pawl_api.events WHERE stream_id = 'bad-1' AND global_index > $(echo "$dropped" | awk '{ print $NF }')")
mark=$(wc -l <"$tmp/dd.seen.log")
run_exec dd
wait_for 60 '[ "$(tokens dd)" -eq "$(head_now)" ]'
check "drop: a new node reaches the head" $?
stop_bg
tail -n +$((mark + 1)) "$tmp/dd.seen.log" >"$tmp/dd.seen.log.2"
# The poisoned event was delivered once (before the drop); no dropped event after it.
[ "$(awk -v b=$bad '$2 == b' "$tmp/dd.seen.log" | wc -l)" -eq 1 ] &&
    ! awk -v d="$dropped" 'BEGIN { split(d, a, " "); for (k in a) x[a[k]] = 1 } ($2 in x) { f = 1 } END { exit !f }' "$tmp/dd.seen.log.2"
check "drop: no dropped event was handed to the command again" $?
[ "$(awk '$3 == "bad-1" { printf "%s ", $2 }' "$tmp/dd.seen.log.2" | sed 's/ $//')" = "$newer" ]
check "drop: the stream's newer events ($newer) flowed to the command, in order" $?
[ "$(letters dd)" -eq 0 ]; check "drop: nothing was parked again" $?

# ---- a partial drop leaves the stream parked behind what remains ------------------------------
run_exec dp
wait_for 60 '[ "$(tokens dp)" -eq "$(head_now)" ] && [ "$(letters dp)" -gt 1 ]'
n_dp=$(letters dp)
"$PAWL" dead-letters dp drop --stream bad-1 --to "$bad" --execute >/dev/null 2>&1
kill_bg
append bad-1 1
run_exec dp
wait_for 60 '[ "$(tokens dp)" -eq "$(head_now)" ]'
check "partial drop: a new node reaches the head" $?
stop_bg
[ "$(letters dp)" -eq "$n_dp" ] && [ "$(q "SELECT min(global_index) > $bad FROM pawl.dead_letters WHERE processor = 'dp'")" = t ]
check "partial drop: the letter at $bad is gone, the others stay and the newer event is parked behind them" $?

echo "$fails failed"
[ "$fails" -eq 0 ]
