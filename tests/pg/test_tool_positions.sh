#!/usr/bin/env bash
# test_tool_positions.sh — one way to say where to start (tools/position.h), end to end through
# the real binary against the private PostgreSQL: every form of a position (start, end, an
# index, -N, a time ago, an RFC 3339 time) in `tail --from`, `run --initial-token` (new
# processors, named by their positional argument), `reset --to --execute` and `retention
# --before`; times on events whose appended_at is set by hand (as the owner), so that what each
# time means is known to the microsecond; bad values refused before connecting (exit 2, naming
# the flag and the forms); `pawl run NAME` like `pawl status NAME`.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 77; }
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_tool_positions_$$
psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db" && psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" || exit 1
bg=
cleanup() {
    [ -n "$bg" ] && kill -9 "$bg" 2>/dev/null
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
export PAWL_DSN="$BASE_DSN dbname=$db"
unset PAWL_LOG_LEVEL PAWL_PROCESSOR PAWL_INITIAL_TOKEN PAWL_SEGMENTS PAWL_HANDLER

fails=0
check() { # check NAME CONDITION-EXIT-STATUS
    if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
expect_rc() { # expect_rc NAME WANT GOT
    [ "$2" -eq "$3" ]; check "$1 (exit $3, want $2)" $?
}
sql() { psql "$PAWL_DSN" -qAtc "$1"; }
# The indexes `pawl tail ARGS` prints, space-separated.
idx() { "$PAWL" tail --json "$@" 2>"$tmp/tail.err" | jq -r .index | tr '\n' ' ' | sed 's/ $//'; }
range() { seq -s ' ' "$1" "$2"; }
expect_idx() { # expect_idx WANT ARGS...: tail ARGS prints exactly the indexes WANT
    local want=$1 got shown
    shift
    got=$(idx "$@")
    shown=${want:0:20}
    [ ${#want} -gt 20 ] && shown="$shown..."
    [ "$got" = "$want" ]; check "tail $* prints [$shown]" $?
    [ "$got" = "$want" ] || { echo "     got [$got]"; sed 's/^/     /' "$tmp/tail.err"; }
}
wait_for() { # wait up to $1 s for the shell condition $2
    local i
    for i in $(seq 1 $(($1 * 10))); do eval "$2" && return 0; sleep 0.1; done
    return 1
}
stop_bg() {
    kill -INT "$bg" 2>/dev/null
    for _ in $(seq 1 300); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$bg" 2>/dev/null
    wait "$bg"; local rc=$?; bg=; return $rc
}

"$PAWL" init >/dev/null 2>&1 || { echo "init failed"; exit 1; }
# 20 events, one append each: index i is stream e<i>.
for i in $(seq 1 20); do printf '{"stream":"e%d","type":"T","payload":{"i":%d}}\n' "$i" "$i"; done |
    "$PAWL" append --events-per-append 1 >/dev/null 2>&1
[ "$(sql "SELECT count(*) FILTER (WHERE stream_id = 'e' || global_index) FROM pawl_api.events")" = 20 ]
check "20 events, index i in stream e<i>" $?

# ---- bad values: exit 2 before connecting, naming the flag and the accepted forms -------------
bad_dsn="host=/nonexistent-pawl-dir dbname=x connect_timeout=2"
for v in junk -15x 2026-12-05T10:00:00 2026-12-05 '2026-13-01T00:00:00Z' '2026-12-05T10:00:00+1:00' \
    99999999999999999999 -99999999999999999999 '+5' ' 5' '--5' '-' '-1d0' 1e3 Start; do
    PAWL_DSN="$bad_dsn" "$PAWL" tail --from "$v" >/dev/null 2>"$tmp/err"
    rc=$?
    [ $rc -eq 2 ] && grep -q -- "--from" "$tmp/err"
    check "tail --from '$v' refused before connecting (exit $rc)" $?
done
PAWL_DSN="$bad_dsn" "$PAWL" tail --from 99999999999999999999 2>"$tmp/err"
grep -q 'index out of range' "$tmp/err"; check "an index too large is named out of range" $?
PAWL_DSN="$bad_dsn" "$PAWL" tail --from junk 2>"$tmp/err"; expect_rc "tail --from junk" 2 $?
grep -q 'start, end, an index N, -N' "$tmp/err" && grep -q 'RFC 3339' "$tmp/err" &&
    grep -q -- '-15 is an offset, -15m a time' "$tmp/err"
check "the refusal lists the forms and the -15 / -15m rule" $?
PAWL_DSN="$bad_dsn" "$PAWL" tail --from 2026-12-05T10:00:00 2>"$tmp/err"
grep -q 'needs its zone' "$tmp/err"; check "a time without a zone: the refusal says it needs one" $?
PAWL_DSN="$bad_dsn" "$PAWL" run pbad --initial-token -3x 2>"$tmp/err"; expect_rc "run --initial-token -3x" 2 $?
grep -q -- '--initial-token -3x' "$tmp/err" && grep -q 'unit' "$tmp/err"
check "run: the refusal names --initial-token and asks for a unit" $?
PAWL_INITIAL_TOKEN=soon PAWL_DSN="$bad_dsn" "$PAWL" run pbad 2>"$tmp/err"; expect_rc "PAWL_INITIAL_TOKEN=soon" 2 $?
grep -q 'PAWL_INITIAL_TOKEN (--initial-token) soon' "$tmp/err"; check "the refusal names the variable" $?
PAWL_DSN="$bad_dsn" "$PAWL" reset pbad --to 2026-12-05T25:00:00Z 2>"$tmp/err"; expect_rc "reset --to a bad time" 2 $?
grep -q -- '--to' "$tmp/err"; check "reset: the refusal names --to" $?
PAWL_DSN="$bad_dsn" "$PAWL" reset pbad 2>"$tmp/err"; expect_rc "reset without --to" 2 $?
grep -q -- '--to needs a position' "$tmp/err"; check "reset without --to says a position is needed" $?
PAWL_DSN="$bad_dsn" "$PAWL" retention --before yesterday 2>"$tmp/err"; expect_rc "retention --before yesterday" 2 $?
grep -q -- '--before' "$tmp/err"; check "retention: the refusal names --before" $?

# ---- tail --from: start, end, an index, -N ------------------------------------------------------
all=$(range 1 20)
expect_idx "$all"
expect_idx "$all" --from start
expect_idx "$all" --from 0
expect_idx "18 19 20" --from 17
expect_idx "" --from 20
expect_idx "" --from 25
expect_idx "" --from end
expect_idx "18 19 20" --from -3
expect_idx "20" --from=-1
expect_idx "" --from -0
expect_idx "$all" --from -20
expect_idx "$all" --from -1000
expect_idx "11 12" --from -10 --count 2

# ---- tail --from an RFC 3339 time: event i appended at 2026-01-01T00:00:00Z + i minutes --------
sql "UPDATE pawl.events SET appended_at = timestamptz '2026-01-01 00:00:00+00'
       + substr(stream_id, 2)::int * interval '1 minute' WHERE stream_id ~ '^e[0-9]+$'" >/dev/null
expect_idx "$(range 5 20)" --from 2026-01-01T00:05:00Z
expect_idx "$(range 6 20)" --from 2026-01-01T00:05:30Z
expect_idx "$(range 6 20)" --from 2026-01-01T00:05:00.000001Z
expect_idx "$(range 5 20)" --from 2026-01-01T00:04:59.999999Z
expect_idx "$(range 5 20)" --from 2026-01-01T01:05:00+01:00
expect_idx "$(range 5 20)" --from "2025-12-31 19:05:00-05:00"
expect_idx "$(range 5 20)" --from 2026-01-01t00:05:00.0000009z
expect_idx "$all" --from 2025-12-31T23:59:59Z
expect_idx "20" --from 2026-01-01T00:20:00Z
expect_idx "" --from 2026-01-01T00:20:00.000001Z
expect_idx "" --from 2027-01-01T00:00:00Z

# ---- tail --from a time ago, on the server's clock ----------------------------------------------
# events 1-10: 3 days ago (+ i minutes); 11-15: 90 minutes ago (+ i s); 16-18: 20 minutes ago;
# 19-20: a minute ahead (so that "-10s" does not depend on how fast this runs).
sql "UPDATE pawl.events SET appended_at = CASE
       WHEN substr(stream_id, 2)::int <= 10 THEN now() - interval '3 days' + substr(stream_id, 2)::int * interval '1 minute'
       WHEN substr(stream_id, 2)::int <= 15 THEN now() - interval '90 minutes' + substr(stream_id, 2)::int * interval '1 second'
       WHEN substr(stream_id, 2)::int <= 18 THEN now() - interval '20 minutes'
       ELSE now() + interval '1 minute' END
     WHERE stream_id ~ '^e[0-9]+$'" >/dev/null
expect_idx "$all" --from -4d
expect_idx "$(range 2 20)" --from -2d23h58m30s
expect_idx "$(range 11 20)" --from -1d
expect_idx "$(range 11 20)" --from -2h
expect_idx "$(range 16 20)" --from -1h
expect_idx "$(range 16 20)" --from -1.25h
expect_idx "19 20" --from -15m
expect_idx "19 20" --from -10s
expect_idx "19 20" --from -500ms
"$PAWL" tail --from -1h --log-level debug >/dev/null 2>"$tmp/err"
grep -q 'the position before the first event appended at or after .* is 15 (.* reads over 1 .. 20)' "$tmp/err"
check "tail --from -1h at debug: how the time resolved (position 15, the reads made)" $?

# ---- tail --from end --follow: only new events ------------------------------------------------
"$PAWL" tail --from end --follow --count 1 --json >"$tmp/follow.jsonl" 2>/dev/null &
bg=$!
sleep 1
printf '{"stream":"e21","type":"T"}\n' | "$PAWL" append >/dev/null 2>&1
wait_for 20 '! kill -0 $bg 2>/dev/null'
kill -9 "$bg" 2>/dev/null
wait "$bg"; rc=$?; bg=
expect_rc "tail --from end --follow --count 1 ends" 0 $rc
[ "$(jq -r '.index' "$tmp/follow.jsonl")" = 21 ]; check "it printed only the new event, 21" $?
# The log: 21 events; 21 appended now, 19-20 "a minute ahead".

# ---- run NAME --initial-token: new processors start where the position says ------------------
ts16=$(sql "SELECT to_char(appended_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')
            FROM pawl.events WHERE stream_id = 'e16'")
# run_new NAME TOKEN-WANTED ARGS...: a new processor (print handler, one segment) from the
# position; it prints exactly the events after TOKEN-WANTED.
run_new() {
    local name=$1 want=$2
    shift 2
    "$PAWL" run "$@" --handler print --segments 1 --claim-poll 100ms --progress off \
        >"$tmp/$name.out" 2>"$tmp/$name.err" &
    bg=$!
    wait_for 60 '[ "$(sql "SELECT min(token) FROM pawl.tokens WHERE processor = '"'$name'"'")" = 21 ]'
    check "run $*: caught up to 21" $?
    stop_bg
    grep -q "new processor $name: its segments start at token $want " "$tmp/$name.err"
    check "run $*: the new processor starts at token $want" $?
    [ "$(jq -r .index "$tmp/$name.out" | tr '\n' ' ' | sed 's/ $//')" = "$( ((want < 21)) && range $((want + 1)) 21)" ]
    check "run $*: printed the events after $want, each once" $?
}
run_new pstart 0 pstart --initial-token start
run_new pdefault 0 pdefault
run_new pend 21 pend --initial-token end
run_new pindex 7 pindex --initial-token 7
run_new poffset 17 poffset --initial-token -4
run_new pago 15 pago --initial-token -1h
run_new ptime 15 ptime --initial-token "$ts16"
run_new pflag 19 --processor pflag --initial-token -2
run_new pboth 3 pboth --processor pboth --initial-token 3
PAWL_PROCESSOR=penv run_new parg 20 parg --initial-token -1
PAWL_INITIAL_TOKEN=-2d run_new penvtok 10 penvtok
grep -q 'running processor parg as node' "$tmp/parg.err"; check "run NAME wins over PAWL_PROCESSOR" $?
[ "$(sql "SELECT count(*) FROM pawl.tokens WHERE processor = 'penv'")" = 0 ]; check "no processor named by PAWL_PROCESSOR was made" $?

"$PAWL" run pa --processor pb --progress off >/dev/null 2>"$tmp/err"; expect_rc "run NAME --processor OTHER" 2 $?
grep -q 'two processor names given (pa and --processor pb)' "$tmp/err"; check "the refusal names both" $?
"$PAWL" run pa pb --progress off >/dev/null 2>"$tmp/err"; expect_rc "run with two names" 2 $?
grep -q "unexpected argument 'pb'" "$tmp/err"; check "the second name is named" $?
"$PAWL" run --progress off >/dev/null 2>"$tmp/err"; expect_rc "run without a name" 2 $?
grep -q 'pawl run NAME' "$tmp/err"; check "the refusal shows pawl run NAME" $?
[ "$(sql "SELECT count(*) FROM pawl.tokens WHERE processor IN ('pa', 'pb')")" = 0 ]; check "refused runs created nothing" $?

# An existing processor keeps its tokens: --initial-token is not used, and says so.
"$PAWL" run pend --initial-token start --segments 1 --claim-poll 100ms --progress off >/dev/null 2>"$tmp/again.err" &
bg=$!
wait_for 30 'grep -q "running processor pend" "$tmp/again.err"'
stop_bg
grep -q 'processor pend exists (lowest token 21): --initial-token start is for a new processor and is not used' "$tmp/again.err"
check "run of an existing processor with --initial-token: not used, said so" $?
[ "$(sql "SELECT min(token) FROM pawl.tokens WHERE processor = 'pend'")" = 21 ]; check "its token stayed 21" $?

# exec: the name before "--", the command after it.
cat >"$tmp/ack.sh" <<'EOF'
#!/usr/bin/env bash
while IFS= read -r line; do
    [[ $line =~ ^\{\"index\":([0-9]+), ]] && idx=${BASH_REMATCH[1]} && echo "$idx" >>"$(dirname "$0")/exec.seen"
    if [[ $line == *'"batch_end":true}' ]]; then echo "ok $idx"; fi
done
EOF
chmod +x "$tmp/ack.sh"
"$PAWL" run pexec --handler exec --segments 1 --initial-token -3 --claim-poll 100ms --progress off \
    -- "$tmp/ack.sh" >/dev/null 2>"$tmp/pexec.err" &
bg=$!
wait_for 60 '[ "$(sql "SELECT min(token) FROM pawl.tokens WHERE processor = '"'pexec'"'")" = 21 ]'
check "run NAME --handler exec -- CMD: caught up" $?
stop_bg
[ "$(tr '\n' ' ' <"$tmp/exec.seen")" = "19 20 21 " ]; check "the exec command got the events after -3: 19 20 21" $?

# ---- reset --to --execute: every form -----------------------------------------------------------
reset_to() { # reset_to WANT VALUE: pawl reset pindex --to VALUE --execute sets every token to WANT
    "$PAWL" reset pindex --to "$2" --execute >"$tmp/reset.out" 2>"$tmp/reset.err"
    local rc=$?
    [ $rc -eq 0 ] && [ "$(sql "SELECT min(token) || ' ' || max(token) FROM pawl.tokens WHERE processor = 'pindex'")" = "$1 $1" ] &&
        grep -q "every segment at token $1\." "$tmp/reset.out"
    check "reset --to $2 --execute: token $1 (exit $rc)" $?
}
reset_to 0 start
reset_to 21 end
reset_to 5 5
reset_to 18 -3
reset_to 0 -100
reset_to 15 -1h
reset_to 15 "$ts16"
reset_to 10 -2d
reset_to 0 2000-01-01T00:00:00Z
reset_to 21 -0
"$PAWL" reset pindex --to -1h >"$tmp/reset.out" 2>&1
grep -q 'would reset pindex to token 15 (--to -1h; the first event appended at or after .* is index 16)' "$tmp/reset.out"
check "reset --to a time: the preview names the first event at or after it" $?
"$PAWL" reset pindex --to 22 >"$tmp/out" 2>"$tmp/err"; expect_rc "reset --to past the head" 4 $?
[ ! -s "$tmp/out" ] && grep -q 'past the head' "$tmp/err"; check "refused on stderr, nothing on stdout" $?

# ---- retention --before a position; then start is the log's new start --------------------------
"$PAWL" reset pindex --to end --execute >/dev/null 2>&1
"$PAWL" reset pstart --to end --execute >/dev/null 2>&1
"$PAWL" retention --before -5 >"$tmp/ret.out" 2>&1; expect_rc "retention --before -5 (preview)" 0 $?
grep -q -- '--before -5: the new start is index 17' "$tmp/ret.out"; check "-5 keeps the last 5 events: start at 17" $?
"$PAWL" retention --before 2 >"$tmp/ret.out" 2>&1; expect_rc "retention --before 2 (an index, preview)" 0 $?
grep -q 'would move the log.s start from 1 to 2' "$tmp/ret.out"; check "an index is the new start itself, as before" $?
"$PAWL" retention --before -1h --execute >"$tmp/ret.out" 2>&1; expect_rc "retention --before -1h --execute" 0 $?
[ "$(sql "SELECT pawl_api.first_index()")" = 16 ]; check "the log starts at 16: the first event of the last hour" $?
expect_idx "$(range 16 21)" --from start
expect_idx "$(range 16 21)"
expect_idx "$(range 16 21)" --from -100
expect_idx "$(range 16 21)" --from -2d
"$PAWL" tail --from 3 >/dev/null 2>"$tmp/err"; expect_rc "tail --from an index below the start" 1 $?
grep -q 'starts at index 16' "$tmp/err"; check "it names the start" $?
reset_to 15 start
"$PAWL" reset pindex --to 3 >"$tmp/out" 2>"$tmp/err"; expect_rc "reset --to below the start" 4 $?
grep -q 'before the log.s start' "$tmp/err" && grep -q -- '--to start is 15' "$tmp/err"; check "refused naming the start" $?
run_new pafter 15 pafter --initial-token start

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all checks passed"
