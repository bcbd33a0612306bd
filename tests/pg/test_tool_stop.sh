#!/usr/bin/env bash
# test_tool_stop.sh — how `pawl run` stops, and what it says, through the real binary:
#   - a --processor (or --node-id) the token store would refuse is refused before connecting
#     (exit 2, the reason named, control characters escaped), not after (exit 3 here: the DSN
#     points at no server);
#   - the same signal twice within a second (GNU timeout signals the process, then its group)
#     is one request: the node stops cleanly (exit 130, its summary, the claim released, the
#     token at the acknowledged event), saying what it waits for while its exec command takes
#     its time to acknowledge ("waiting up to N s for segment 0's command (pid P) ...");
#   - a second signal more than a second later abandons the stop: exit 8, the segments still
#     claimed named and left to expire after --claim-timeout (its value), the command sent
#     SIGTERM; the claim is indeed still in the store;
#   - with its database gone (the primary stopped in immediate mode, on a cluster of this test's
#     own, restarted afterwards) a node stops within --stop-db-wait and 2 s of SIGTERM, exit 8,
#     naming the claims it left; no reconnect, retry or back-off lines during the stop; after the
#     restart the claims it named are still its own in the store, as it said;
#   - a batch the token store refuses is reported with the store's text ("batch rolled back
#     (permission denied: 42501: ...)"), not only the error code.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
PG=${PAWL_PG:?run through ctest}
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d /tmp/pawl-stop.XXXXXX)
chmod 755 "$tmp" # the isolated cluster's server runs as postgres when we are root
db=t_tool_stop_$$
psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db" && psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" || exit 1
bg=
iso_made=
iso() { PAWL_PG_KEY="$tmp/iso" "$PG" "$@"; } # the cluster of this test's own
cleanup() {
    [ -n "$bg" ] && kill -9 "$bg" 2>/dev/null
    for f in "$tmp"/cmd.pids; do [ -f "$f" ] && xargs -r kill -9 <"$f" 2>/dev/null; done
    [ -n "$iso_made" ] && iso remove >/dev/null 2>&1
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
export PAWL_DSN="$BASE_DSN dbname=$db"
export PAWL_LOG_LEVEL=warn

fails=0
# check NAME STATUS. A NAME with a command substitution in it changes $?: take the status first.
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
q() { psql "$PAWL_DSN" -qAtc "$1"; }
# Wait up to $1 s for the shell condition $2.
wait_for() {
    local i
    for i in $(seq 1 $(($1 * 10))); do eval "$2" && return 0; sleep 0.1; done
    return 1
}
# Wait up to $1 s for the background node to exit; its status in $rc, how long it took (ms) in
# $took_ms (from $t0_ms). A node still running then is killed (rc 137).
t0_ms=0
now_ms() { date +%s%3N; }
wait_bg() {
    local i
    for i in $(seq 1 $(($1 * 20))); do kill -0 "$bg" 2>/dev/null || break; sleep 0.05; done
    took_ms=$(($(now_ms) - t0_ms))
    kill -9 "$bg" 2>/dev/null
    wait "$bg"; rc=$?; bg=
}

"$PAWL" init >/dev/null 2>&1 || { echo "pawl init failed"; exit 1; }
"$PAWL" append --generate --count 200 --duration 0 --rate 0 --streams 20 --progress off 2>/dev/null ||
    { echo "append failed"; exit 1; }
head=$(q "SELECT pawl_api.last_index()")

# ---- bad names: refused before connecting ----------------------------------------------------
# No server at this DSN: a node that connected first would exit 3 ("cannot connect").
nodb="host=$tmp/no-such-socket-dir dbname=x"
long=$(printf 'x%.0s' $(seq 1 64))
i=0
for name in "" "a b" $'a\033[2Jb' "$long" "é" "ord/ers"; do
    i=$((i + 1))
    PAWL_DSN="$nodb" "$PAWL" run --processor "$name" --progress off >/dev/null 2>"$tmp/name$i.err"
    r=$?
    [ $r -eq 2 ] && ! grep -qi 'connect' "$tmp/name$i.err" && grep -q 'processor' "$tmp/name$i.err"
    st=$?
    check "run --processor $(printf '%q' "$name"): refused before connecting (exit $r, want 2): $(head -c 150 "$tmp/name$i.err")" $st
done
grep -q 'the processor name is empty' "$tmp/name1.err"; check "the empty name is called empty" $?
grep -q 'has a space (byte 2' "$tmp/name2.err"; check "the space is named, with its place" $?
grep -qF 'the byte \x1b (byte 2' "$tmp/name3.err" && ! grep -q $'\033' "$tmp/name3.err"
check "a control character is named escaped, never written raw" $?
PAWL_DSN="$nodb" "$PAWL" run --processor ok --node-id "node 1" --progress off >/dev/null 2>"$tmp/node.err"
r=$?
[ $r -eq 2 ] && grep -q 'node id "node 1" has a space' "$tmp/node.err"
check "run --node-id 'node 1': refused before connecting (exit $r)" $?
PAWL_DSN="$nodb" "$PAWL" run --processor ok --progress off >/dev/null 2>"$tmp/ok.err"
r=$?
[ $r -eq 3 ]; check "a good name does go on to connect (exit $r, want 3: no server)" $?

# ---- the exec command used below -------------------------------------------------------------
# Acknowledges every batch, unless $tmp/slow exists (it waits 3 s first) or $tmp/hang exists
# (it never answers). Writes its pid to cmd.pids, and to slowed / hung when it waits.
cat >"$tmp/cmd.sh" <<'EOF'
#!/usr/bin/env bash
dir=$(dirname "$0")
echo $$ >>"$dir/cmd.pids"
while IFS= read -r line; do
    [[ $line =~ ^\{\"index\":([0-9]+), ]] && idx=${BASH_REMATCH[1]}
    [[ $line == *'"batch_end":true}' ]] || continue
    if [ -f "$dir/hang" ]; then echo "$$ $idx" >"$dir/hung"; exec sleep 600; fi
    if [ -f "$dir/slow" ]; then echo "$$ $idx" >"$dir/slowed"; sleep 3; fi
    echo "ok $idx"
done
EOF
chmod +x "$tmp/cmd.sh"
token_of() { q "SELECT token FROM pawl.tokens WHERE processor = '$1' AND segment_id = 0"; }
owner_of() { q "SELECT coalesce(owner, '') FROM pawl.tokens WHERE processor = '$1' AND segment_id = 0"; }

# ---- the same signal twice within a second: one clean stop -----------------------------------
"$PAWL" run --processor pdup --segments 1 --handler exec --claim-poll 100ms --progress off \
    -- "$tmp/cmd.sh" >/dev/null 2>"$tmp/dup.err" &
bg=$!
wait_for 60 '[ "$(token_of pdup)" = "$head" ]'
check "exec node caught up to the head ($head)" $?
touch "$tmp/slow"
echo '{"stream":"late","type":"t"}' | "$PAWL" append >/dev/null 2>&1
head=$((head + 1))
wait_for 30 '[ -f "$tmp/slowed" ]'
check "the command got the new event and takes 3 s to acknowledge it" $?
read -r slow_pid slow_idx <"$tmp/slowed"
t0_ms=$(now_ms)
kill -TERM "$bg"; sleep 0.2; kill -TERM "$bg"
wait_bg 30
rm -f "$tmp/slow"
[ $rc -eq 130 ]; check "two SIGTERMs 0.2 s apart: a clean stop (exit $rc, want 130, after $took_ms ms)" $?
grep -q '^pawl: stopped: ' "$tmp/dup.err" && ! grep -q 'abandoned' "$tmp/dup.err"
check "the stop ran to its end (summary printed, nothing abandoned)" $?
[ "$(owner_of pdup)" = "" ] && [ "$(token_of pdup)" = "$head" ]
st=$?
check "the claim was released and the token stored at the acknowledged event ($(token_of pdup), want $head)" $st
grep -Eq "stopping: waiting up to [0-9.]+ s for segment 0's command \(pid $slow_pid\) to acknowledge events up to $slow_idx .*Ctrl-C again to abandon" "$tmp/dup.err"
check "while stopping it says what it waits for: segment 0's command, its pid, the event, the time left" $?

# ---- a second signal later: the stop is abandoned, and says what it left -------------------
touch "$tmp/hang"
echo '{"stream":"later","type":"t"}' | "$PAWL" append >/dev/null 2>&1
head=$((head + 1))
"$PAWL" run --processor pab --segments 1 --initial-token $((head - 1)) --handler exec \
    --exec-ack-timeout 60s --claim-timeout 7s --claim-poll 100ms --progress off \
    -- "$tmp/cmd.sh" >/dev/null 2>"$tmp/ab.err" &
bg=$!
wait_for 30 '[ -f "$tmp/hung" ]'
check "the command got the event and does not answer" $?
read -r hung_pid _ <"$tmp/hung"
node=$(owner_of pab)
t0_ms=$(now_ms)
kill -TERM "$bg"
sleep 1.5
grep -Eq "stopping: waiting up to [0-9.]+ s for segment 0's command \(pid $hung_pid\)" "$tmp/ab.err"
check "stopping: it names the command it waits for (pid $hung_pid)" $?
kill -0 "$bg" 2>/dev/null; check "still stopping 1.5 s later (the command has 60 s)" $?
t0_ms=$(now_ms)
kill -TERM "$bg"
wait_bg 10
[ $rc -eq 8 ]; check "a second SIGTERM 1.5 s later abandons the stop (exit $rc, want 8, after $took_ms ms)" $?
grep -q 'stop abandoned (a second SIGTERM' "$tmp/ab.err" &&
    grep -q 'segment still claimed by this node (0) is left to expire after --claim-timeout 7s' "$tmp/ab.err"
check "it names the claim left to expire, and --claim-timeout's value" $?
grep -Eq "sent SIGTERM to the exec command still running: $hung_pid \(segment 0\)" "$tmp/ab.err"
check "it names the command it sent SIGTERM" $?
wait_for 5 '! kill -0 $hung_pid 2>/dev/null'
check "the command is gone" $?
[ -n "$node" ] && [ "$(owner_of pab)" = "$node" ]
check "the claim is still the node's in the store, to expire" $?
rm -f "$tmp/hang"

# ---- the token store's words in "batch rolled back (...)" ------------------------------------
q "CREATE FUNCTION public.t_no_tokens() RETURNS trigger LANGUAGE plpgsql AS \$\$
   BEGIN
     IF NEW.processor = 'pdeny' AND NEW.token > OLD.token THEN
       RAISE EXCEPTION 'test: no token writes for pdeny' USING ERRCODE = '42501';
     END IF;
     RETURN NEW;
   END \$\$;
   CREATE TRIGGER t_no_tokens BEFORE UPDATE ON pawl.tokens FOR EACH ROW
     EXECUTE FUNCTION public.t_no_tokens();" >/dev/null || exit 1
"$PAWL" run --processor pdeny --segments 1 --claim-poll 100ms --backoff-min 5s --progress off \
    >/dev/null 2>"$tmp/deny.err" &
bg=$!
wait_for 30 'grep -q "batch rolled back" "$tmp/deny.err"'
kill -INT "$bg"; wait_bg 30
q "DROP TRIGGER t_no_tokens ON pawl.tokens; DROP FUNCTION public.t_no_tokens()" >/dev/null
grep -q 'segment 0: batch rolled back (permission denied: 42501: test: no token writes for pdeny)' "$tmp/deny.err"
st=$?
check "batch rolled back (...) gives the database's error and text: $(grep -m1 'rolled back' "$tmp/deny.err" | cut -c1-200)" $st

# ---- the database gone: a bounded stop --------------------------------------------------------
mkdir -p "$tmp/iso" && chmod 755 "$tmp/iso"
iso_made=1
if ! iso start >"$tmp/iso-start.log" 2>&1; then
    echo "FAIL cannot start a cluster of this test's own"; tail -5 "$tmp/iso-start.log"; exit 1
fi
idsn=$(iso dsn)
iq() { psql "$idsn" -qAtc "$1" 2>/dev/null; }
PAWL_DSN="$idsn" "$PAWL" init >/dev/null 2>&1 &&
    PAWL_DSN="$idsn" "$PAWL" append --generate --count 100 --duration 0 --rate 0 --streams 20 --progress off >/dev/null 2>&1
check "the isolated cluster is up, with 100 events" $?
PAWL_DSN="$idsn" "$PAWL" run --processor pgone --segments 4 --claim-poll 100ms --progress off \
    >/dev/null 2>"$tmp/gone.err" &
bg=$!
gone_ready() {
    [ "$(iq "SELECT count(*) FROM pawl.tokens WHERE processor = 'pgone' AND token = 100 AND owner IS NOT NULL")" = 4 ]
}
wait_for 60 gone_ready
check "the node holds its 4 segments and caught up" $?
gone_node=$(iq "SELECT DISTINCT owner FROM pawl.tokens WHERE processor = 'pgone'")
PAWL_PG_STOP_MODE=immediate iso stop >"$tmp/iso-stop.log" 2>&1
! iq "SELECT 1" >/dev/null; check "the primary is down (pg_ctl stop -m immediate)" $?
sleep 0.5
t0_ms=$(now_ms)
kill -TERM "$bg"
wait_bg 20
# The default --stop-db-wait is 3 s; the bound is that plus 2 s (noticing: one probe).
[ $rc -eq 8 ] && [ "$took_ms" -le 5500 ]
check "SIGTERM with the database gone: stopped in $took_ms ms (bound 5000 ms: --stop-db-wait 3s + 2 s), exit $rc (want 8)" $?
grep -Eq 'stop abandoned \(the database has not answered for [0-9.]+ s, --stop-db-wait 3s' "$tmp/gone.err" &&
    grep -q '4 segments still claimed by this node (0, 1, 2, 3) are left to expire after --claim-timeout 10s' "$tmp/gone.err"
check "it says the database did not answer, and which claims it left to expire" $?
grep -Eq 'stopping: the database does not answer .*Ctrl-C again to abandon' "$tmp/gone.err"
check "while stopping it says it waits for the database" $?
sed -n '/^pawl: stopping (/,$p' "$tmp/gone.err" >"$tmp/gone.stop"
! grep -Eq 'pgconn:|finalizer:| log:|retrying|extending claims failed' "$tmp/gone.stop"
st=$?
check "no reconnect, retry or back-off lines while stopping ($(grep -c . "$tmp/gone.stop") lines)" $st
iso start >"$tmp/iso-restart.log" 2>&1
wait_for 30 '[ "$(iq "SELECT 1")" = 1 ]'
check "the primary is up again" $?
[ -n "$gone_node" ] &&
    [ "$(iq "SELECT count(*) FROM pawl.tokens WHERE processor = 'pgone' AND owner = '$gone_node'")" = 4 ]
check "after the restart the 4 claims are still the stopped node's, as it said (left to expire)" $?

if [ "$fails" -ne 0 ]; then
    for f in dup ab deny gone; do echo "--- $f.err (last 15)"; tail -15 "$tmp/$f.err" | cut -c1-400; done
fi
echo "$fails failed"
[ "$fails" -eq 0 ]
