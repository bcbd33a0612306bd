#!/usr/bin/env bash
# test_tool_handlers.sh — the handlers of `pawl run` that write outside the database, through the
# real binary against the private PostgreSQL:
#   print: killed with SIGKILL right after a token moves, every event up to the stored token is
#          in its output file, as valid JSON lines; replays carry "replay": true;
#   exec:  a command that fails on an event (exit 3) and one killed mid-batch are restarted and
#          the batch delivered again after the back-off, the token never passing an event the
#          command did not acknowledge; every event acknowledged, each segment in index order;
#          the command sees segment, replay and index (and PAWL_SEGMENT, PAWL_PROCESSOR), and a
#          batch delivered again says so ("attempt": 2 on the failed and the killed event); a
#          negative ack, a malformed ack and a missing ack (--exec-ack-timeout) fail the batch
#          (the command's reason logged with its control characters escaped);
#          the command's environment lacks the connection secrets (PGPASSWORD, PAWL_DSN and every
#          other PAWL_*DSN) unless --exec-pass-secrets, and keeps everything else.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 77; }
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_tool_handlers_$$
psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db" && psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" || exit 1
bg=
cleanup() {
    [ -n "$bg" ] && kill -9 "$bg" 2>/dev/null
    # Commands a killed node left behind (they log their pids).
    [ -f "$tmp/seen.log" ] && awk '{ print $1 }' "$tmp/seen.log" | sort -u | xargs -r kill -9 2>/dev/null
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
# Wait up to $1 s for the shell condition $2.
wait_for() {
    local i
    for i in $(seq 1 $(($1 * 10))); do eval "$2" && return 0; sleep 0.1; done
    return 1
}

"$PAWL" init >/dev/null 2>&1 || { echo "init failed"; exit 1; }
"$PAWL" append --generate --count 4000 --duration 0 --rate 0 --streams 40 --events-per-append 100 \
    --progress off 2>/dev/null || { echo "append failed"; exit 1; }
head=$(q "SELECT pawl_api.last_index()")

# ---- print: a SIGKILL right after the token moves loses nothing the token covers -------------
for round in 1 2 3; do
    proc=pd$round
    "$PAWL" run --processor $proc --handler print --segments 1 --batch-size 20 --output-fsync \
        --claim-poll 100ms --progress off >"$tmp/print$round.out" 2>"$tmp/print$round.err" &
    bg=$!
    wait_for 60 '[ "$(tokens $proc)" -gt 0 ]'
    kill -9 "$bg"; wait "$bg" 2>/dev/null; bg=
    tok=$(tokens $proc)
    # Only complete lines count (the kill may cut the last one); all of them must be JSON.
    n=$(wc -l <"$tmp/print$round.out")
    head -n "$n" "$tmp/print$round.out" >"$tmp/print$round.lines"
    jq -e . "$tmp/print$round.lines" >/dev/null 2>&1
    check "print round $round: the output is valid JSON lines ($n lines)" $?
    missing=$(jq -r '.index' "$tmp/print$round.lines" | sort -n | uniq |
              awk -v t="$tok" '$1 <= t { c++ } END { print t - c }')
    [ "$tok" -gt 0 ] && [ "$missing" -eq 0 ]
    check "print round $round: every event up to the stored token ($tok) is in the file (missing $missing)" $?
done

# Replays: reset the first processor to the start; its events up to the old position are replays.
"$PAWL" run --processor pr --handler print --segments 2 --claim-poll 100ms --progress off \
    >"$tmp/pr1.out" 2>/dev/null &
bg=$!
wait_for 60 '[ "$(tokens pr)" -eq $((2 * head)) ]'
stop_bg
"$PAWL" reset pr --to start --execute >/dev/null 2>&1
"$PAWL" run --processor pr --handler print --claim-poll 100ms --progress off \
    >"$tmp/pr2.out" 2>/dev/null &
bg=$!
wait_for 60 '[ "$(tokens pr)" -eq $((2 * head)) ]'
stop_bg
[ "$(jq -c 'select(.replay == true)' "$tmp/pr2.out" | wc -l)" -eq "$head" ] &&
    [ "$(jq -c 'select(.replay != true)' "$tmp/pr1.out" | wc -l)" -eq "$head" ]
check "print: replays after a reset carry \"replay\": true, live events do not" $?

# ---- exec ----------------------------------------------------------------------------------
# The command: logs what it sees (pid, env segment, and the line's index, segment, replay) and
# acknowledges each batch. Behaviour is chosen by files in $tmp, so a restarted command behaves
# normally: fail-at (exit 3 once at that index), hang-at (sleep once at that index, to be killed),
# nack-at, badack-at, noack-at.
cat >"$tmp/cmd.sh" <<'EOF'
#!/usr/bin/env bash
# Pure bash (a process per line is too slow on a busy machine): the fields by pattern.
dir=$(dirname "$0")
declare -A at
for what in fail hang nack badack noack; do at[$what]=$(cat "$dir/$what-at" 2>/dev/null); done
while IFS= read -r line; do
    [[ $line =~ ^\{\"index\":([0-9]+), ]] && idx=${BASH_REMATCH[1]} || idx=?
    [[ $line =~ \"segment\":([0-9]+), ]] && seg=${BASH_REMATCH[1]} || seg=?
    [[ $line =~ \"replay\":(true|false) ]] && rep=${BASH_REMATCH[1]} || rep=?
    [[ $line =~ \"attempt\":([0-9]+) ]] && att=${BASH_REMATCH[1]} || att=?
    echo "$$ $PAWL_PROCESSOR $PAWL_SEGMENT $idx $seg $rep $att" >>"$dir/seen.log"
    for what in fail hang nack badack noack; do
        if [ "${at[$what]}" = "$idx" ] && [ -f "$dir/$what-at" ]; then
            rm -f "$dir/$what-at"; touch "$dir/$what-done"
            case $what in
                fail) exit 3 ;;
                hang) echo $$ >"$dir/hang.pid"; exec sleep 600 ;;
                nack) printf 'fail cannot handle %s \033]0;pwned\007\rforged\n' "$idx"; continue 2 ;;
                badack) echo "okay $idx"; continue 2 ;;
                noack) exec sleep 600 ;;
            esac
        fi
    done
    if [[ $line == *'"batch_end":true}' ]]; then echo "$$ $idx" >>"$dir/acked.log"; echo "ok $idx"; fi
done
EOF
chmod +x "$tmp/cmd.sh"
: >"$tmp/seen.log"; : >"$tmp/acked.log"
# Fewer events for exec (jq per line is slow): a processor that starts near the head.
start=$((head - 400))
fail_at=$((start + 150))
hang_at=$((start + 300))
echo $fail_at >"$tmp/fail-at"
echo $hang_at >"$tmp/hang-at"
"$PAWL" run --processor px --handler exec --segments 2 --initial-token $start --batch-size 50 \
    --backoff-min 2s --claim-poll 100ms --progress off -- "$tmp/cmd.sh" >/dev/null 2>"$tmp/px.err" &
bg=$!
wait_for 120 '[ -f "$tmp/fail-done" ]'
check "exec: the command failed on index $fail_at" $?
sleep 0.5
seg_of_fail=$(awk -v i=$fail_at '$4 == i { print $5; exit }' "$tmp/seen.log")
tok_fail=$(q "SELECT token FROM pawl.tokens WHERE processor = 'px' AND segment_id = ${seg_of_fail:-0}")
[ -n "$seg_of_fail" ] && [ "$tok_fail" -lt "$fail_at" ]
check "exec: the failed segment's token ($tok_fail) stays below the failed event ($fail_at) during the back-off" $?
wait_for 120 '[ -f "$tmp/hang.pid" ]'
check "exec: the command hangs on index $hang_at" $?
kill -9 "$(cat "$tmp/hang.pid")" 2>/dev/null
wait_for 120 '[ "$(tokens px)" -eq $((2 * head)) ]'
check "exec: after the failure and the kill, both segments reach the head" $?
stop_bg; [ $? -eq 130 ]; check "exec: run stops cleanly (exit 130 after Ctrl-C)" $?
grep -q 'the command (pid [0-9]*) exited with status 3' "$tmp/px.err"; check "exec: the exit status is logged" $?
grep -q "the command (pid $(cat "$tmp/hang.pid")) was killed by signal 9 (SIGKILL)" "$tmp/px.err" &&
    ! grep -q '(pid 0)' "$tmp/px.err"
check "exec: the killed command is logged with the signal's name and its real pid" $?
# At least once as the command sees it, and in index order per segment within each process.
all=$(q "SELECT string_agg(global_index::text, ' ' ORDER BY global_index) FROM pawl_api.events WHERE global_index > $start")
seen_missing=0
for i in $all; do awk -v i=$i '$4 == i { f = 1 } END { exit !f }' "$tmp/seen.log" || seen_missing=$((seen_missing + 1)); done
[ "$seen_missing" -eq 0 ]; check "exec: every event reached the command (missing $seen_missing)" $?
awk '{ k = $1 " " $5; if (k in last && $4 <= last[k]) bad++; last[k] = $4 } END { exit bad > 0 }' "$tmp/seen.log"
check "exec: each process saw its segment's events in increasing index order" $?
[ "$(awk -v i=$fail_at '$4 == i' "$tmp/seen.log" | wc -l)" -ge 2 ] && [ "$(awk -v i=$hang_at '$4 == i' "$tmp/seen.log" | wc -l)" -ge 2 ]
check "exec: the failed and the killed batches were delivered again" $?
[ "$(awk -v i=$fail_at '$4 == i { printf "%s ", $7 }' "$tmp/seen.log")" = "1 2 " ] &&
    [ "$(awk -v i=$hang_at '$4 == i { printf "%s ", $7 }' "$tmp/seen.log")" = "1 2 " ]
check "exec: the first delivery says \"attempt\": 1, the one after the failure (and the kill) 2" $?
awk '$2 != "px" || $3 != $5 || ($6 != "true" && $6 != "false") { bad++ } END { exit bad > 0 }' "$tmp/seen.log"
check "exec: the command sees PAWL_PROCESSOR, PAWL_SEGMENT = the line's segment, and replay" $?
[ "$(awk '{ print $1 }' "$tmp/seen.log" | sort -u | wc -l)" -ge 4 ]
check "exec: the failed and the killed commands were restarted (new processes)" $?

# Negative, malformed and missing acks each fail the batch; the token then still reaches the head.
for what in nack badack noack; do
    rm -f "$tmp/$what-done"
    echo $((head - 45)) >"$tmp/$what-at"
    proc=p$what
    "$PAWL" run --processor $proc --handler exec --segments 1 --initial-token $((head - 60)) \
        --batch-size 10 --backoff-min 200ms --exec-ack-timeout 3s --claim-poll 100ms --progress off \
        -- "$tmp/cmd.sh" >/dev/null 2>"$tmp/$what.err" &
    bg=$!
    wait_for 120 '[ -f "$tmp/$what-done" ] && [ "$(tokens $proc)" -eq "$head" ]'
    check "exec $what: the batch failed and was delivered again; the token reaches the head" $?
    stop_bg
done
grep -q 'the command reported a failure: cannot handle' "$tmp/nack.err"; check "exec nack: the command's reason is logged" $?
grep -qF '\x1b]0;pwned\x07\x0dforged' "$tmp/nack.err" &&
    [ "$(LC_ALL=C tr -d '\n' <"$tmp/nack.err" | LC_ALL=C tr -d '\040-\176\200-\377' | wc -c)" -eq 0 ]
check "exec nack: the reason's control characters (ESC, OSC, CR) are logged escaped, never raw" $?
grep -q 'malformed line from the command: "okay' "$tmp/badack.err"; check "exec badack: the malformed line is named" $?
grep -q 'no acknowledgement of the batch .* within 3000 ms' "$tmp/noack.err"; check "exec noack: the time-out is named" $?

# The command's environment: no connection secrets unless --exec-pass-secrets.
cat >"$tmp/envdump.sh" <<'EOF'
#!/usr/bin/env bash
env >"$(dirname "$0")/env.$PAWL_PROCESSOR.$$"
while IFS= read -r line; do
    [[ $line =~ ^\{\"index\":([0-9]+), ]] && idx=${BASH_REMATCH[1]}
    if [[ $line == *'"batch_end":true}' ]]; then echo "ok $idx"; fi
done
EOF
chmod +x "$tmp/envdump.sh"
for proc in pe pesecrets; do
    pass=; [ $proc = pesecrets ] && pass=--exec-pass-secrets
    # Peer authentication over the socket: the password and the DSN's password= go unused.
    PGPASSWORD=s3cret-pg PAWL_DSN="$PAWL_DSN password=s3cret-dsn" PAWL_OTHER_DSN="host=x password=s3cret-other" \
        PAWL_KEEP_ME=kept "$PAWL" run --processor $proc --handler exec --segments 1 \
        --initial-token $((head - 5)) --claim-poll 100ms --progress off --log-level info $pass \
        -- "$tmp/envdump.sh" >/dev/null 2>"$tmp/$proc.err" &
    bg=$!
    wait_for 60 '[ "$(tokens $proc)" -eq "$head" ]'
    check "exec $proc: the command acknowledged every event" $?
    stop_bg
done
env_pe=$(cat "$tmp"/env.pe.* 2>/dev/null)
env_ps=$(cat "$tmp"/env.pesecrets.* 2>/dev/null)
[ -n "$env_pe" ] && ! grep -Eq '^(PGPASSWORD|PAWL_[A-Z_]*DSN)=' <<<"$env_pe" && ! grep -q s3cret <<<"$env_pe"
check "exec: the command does not get PGPASSWORD, PAWL_DSN or another PAWL_*DSN" $?
grep -qx PAWL_KEEP_ME=kept <<<"$env_pe" && grep -qx PAWL_PROCESSOR=pe <<<"$env_pe" && grep -q '^PATH=' <<<"$env_pe"
check "exec: the rest of the environment is passed on" $?
grep -q 'PGPASSWORD.*not passed on.*--exec-pass-secrets' "$tmp/pe.err" && grep -q 'PAWL_OTHER_DSN' "$tmp/pe.err"
check "exec: the withheld variables are named once, with the flag that passes them" $?
grep -qx PGPASSWORD=s3cret-pg <<<"$env_ps" && grep -q '^PAWL_DSN=.*password=s3cret-dsn' <<<"$env_ps" &&
    grep -q '^PAWL_OTHER_DSN=' <<<"$env_ps" && ! grep -q 'not passed on' "$tmp/pesecrets.err"
check "exec --exec-pass-secrets: the command gets them" $?

"$PAWL" run --processor pz --handler exec --progress off 2>"$tmp/err" >/dev/null
[ $? -eq 2 ] && grep -q 'needs a command' "$tmp/err"; check "exec without a command: usage error" $?
"$PAWL" run --processor pz --handler count --progress off -- true 2>/dev/null >/dev/null
[ $? -eq 2 ]; check "a command for a handler other than exec: usage error" $?

echo "$fails failed"
[ "$fails" -eq 0 ]
