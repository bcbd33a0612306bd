#!/usr/bin/env bash
# test_log_security.sh — only pawl's functions write the log, and nobody outside pawl's roles
# can stall finalization (schema 6, sql/roles/least_privilege.sql):
#   - logins in pawl_appender and pawl_processor cannot INSERT, UPDATE or DELETE pawl.events or
#     pawl.runs; the append function stamps the caller's own transaction id (no way to choose
#     another), and the processor cannot call it;
#   - a login with no grants cannot take the finalizer's lock (LOCK TABLE pawl.finalizer_gate is
#     refused; the old advisory key is held, and finalization goes on);
#   - a pawl role that calls pawl.finalize in a transaction it keeps open is named by
#     pawl_api.finalizer_holder(); an exiting `pawl append` meanwhile leaves within its deadline
#     with a message naming the holder, without spinning (its transaction rate stays low);
#   - an exiting `pawl append` with no other finalizer anywhere leaves nothing unfinalized;
#   - (schema 14) a run never covers its caller's own transaction: "append, finalize, append,
#     commit" through pawl_api leaves no index twice, and `pawl tail` reads the whole log;
#   - (schema 14) the gates live in pawl_locks, which no login can name: a pawl_reader's
#     parse-time lock (FOR UPDATE with a slow IMMUTABLE function of its own) is refused at once
#     and finalization goes on; a session left idle in a transaction holding the finalizer's gate
#     is ended within 5 s; any login's advisory key on a processor's name does not keep
#     `tokens_init` (a processor's start) waiting;
#   - (schema 14) one set of event limits on every append path: pawl.append and
#     pawl.append_group refuse stream ids and types outside 1..255 bytes and non-object
#     metadata, as the C library does; pawl_api.append takes 255-byte ids;
#   - a pawl_reader login reads the SQL face and is refused append, finalize, token and
#     dead-letter functions.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
SRC=${PAWL_SOURCE_DIR:?run through ctest}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_log_sec_$$
app=ls_app_$$ proc=ls_proc_$$ other=ls_other_$$ rd=ls_rd_$$
bgs=()
cleanup() {
    for p in "${bgs[@]}"; do kill -9 "$p" 2>/dev/null; done
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    for r in $app $proc $other $rd; do psql "$BASE_DSN" -qAtc "DROP ROLE IF EXISTS $r" >/dev/null 2>&1; done
    rm -rf "$tmp"
}
trap cleanup EXIT
psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" || exit 1
OWNER="$BASE_DSN dbname=$db"
export PAWL_PROGRESS=off

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
q() { psql "$OWNER" -qAtc "$1"; }
as() { local who=$1; shift; psql "$OWNER user=$who" -qAt -v ON_ERROR_STOP=1 -c "$1" 2>&1 || true; }
denied() { grep >/dev/null 'permission denied' <<<"$(as "$1" "$2")"; check "$3" $?; }
xacts() { q "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '$db'"; }
unfinalized() {
    q "SELECT (SELECT count(*) FROM pawl.events) - (SELECT count(*) FROM pawl_api.events)
          + (SELECT count(*) FROM pawl.events e WHERE e.k = 0 AND NOT EXISTS
               (SELECT 1 FROM pawl.runs r WHERE e.xid = ANY (r.xids)))"
}

PAWL_DSN="$OWNER" PAWL_LOG_LEVEL=error "$PAWL" init >/dev/null 2>&1; check "init" $?
psql "$OWNER" -q -v ON_ERROR_STOP=1 -f "$SRC/sql/roles/least_privilege.sql" >/dev/null 2>&1
check "role setup" $?
# The private cluster authenticates every role but its owner by password (SCRAM).
export PGPASSWORD=pawl-test-secret
psql "$BASE_DSN" -qAt -v ON_ERROR_STOP=1 -c "CREATE ROLE $app LOGIN PASSWORD '$PGPASSWORD' IN ROLE pawl_appender" \
    -c "CREATE ROLE $proc LOGIN PASSWORD '$PGPASSWORD' IN ROLE pawl_processor" \
    -c "CREATE ROLE $rd LOGIN PASSWORD '$PGPASSWORD' IN ROLE pawl_reader" \
    -c "CREATE ROLE $other LOGIN PASSWORD '$PGPASSWORD'" >/dev/null
check "login roles" $?

# ---- no direct writes ---------------------------------------------------------------------------
ins_ev="INSERT INTO pawl.events (xid, stream_seq, k, n, stream_id, type, payload) VALUES (pg_current_xact_id(), 1, 0, 1, 'forged', 'T', '')"
ins_run="INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids, bases, ns, open_xids) VALUES (1, 1, '0', '{1}', '{1}', '{1}', '{}')"
for who in $app $proc; do
    denied $who "$ins_ev" "$who: INSERT events denied"
    denied $who "UPDATE pawl.events SET type = 'x'" "$who: UPDATE events denied"
    denied $who "DELETE FROM pawl.events" "$who: DELETE events denied"
    denied $who "$ins_run" "$who: INSERT runs denied"
    denied $who "UPDATE pawl.runs SET last_index = 7" "$who: UPDATE runs denied"
    denied $who "DELETE FROM pawl.runs" "$who: DELETE runs denied"
done
call="SELECT appended FROM pawl.append(ARRAY['s1'], ARRAY[0::int8], ARRAY[1], ARRAY[1], ARRAY['T'], ARRAY['p'::bytea], NULL, false)"
denied $proc "$call" "processor: the append function denied"
denied $proc "SELECT pawl_api.append('s1', 'T', 'p')" "processor: pawl_api.append denied"
# The append function stamps the caller's own transaction, whatever the caller's search_path
# or temporary objects say.
out=$(psql "$OWNER user=$app" -qAt -v ON_ERROR_STOP=1 <<EOF 2>&1
CREATE FUNCTION pg_temp.pg_current_xact_id() RETURNS xid8 LANGUAGE sql AS \$\$ SELECT '3'::xid8 \$\$;
SET search_path = pg_temp, public;
BEGIN;
SELECT txid FROM pawl.append(ARRAY['s1'], ARRAY[0::int8], ARRAY[1], ARRAY[1], ARRAY['T'], ARRAY['p'::bytea], NULL, false);
SELECT pg_catalog.pg_current_xact_id();
SELECT count(*) FROM pawl.events WHERE xid = pg_catalog.pg_current_xact_id() AND k = 0 AND n = 1 AND ticket IS NOT NULL;
COMMIT;
EOF
)
set -- $out
[ $# -eq 3 ] && [ "$1" = "$2" ] && [ "$3" = 1 ]; check "appender: the row carries its own xid, k, n and ticket ($out)" $?
grep -x >/dev/null 2 <<<"$(as $app "SELECT pawl_api.append('s1', 'T', 'p')")"; check "appender: pawl_api.append gives sequence 2" $?
grep -q 'ranks 1..count' <<<"$(as $app "SELECT * FROM pawl.append(ARRAY['s9'], ARRAY[0::int8], ARRAY[1, 1], ARRAY[1, 3], ARRAY['T', 'T'], ARRAY['p', 'q']::bytea[], NULL, false)")"
check "appender: a forged rank (a gap) is refused" $?
# Ranks out of event order would give a stream's second event the lower index (schema 10).
grep -q 'ranks 1..count, in order' <<<"$(as $app "SELECT * FROM pawl.append(ARRAY['s9'], ARRAY[0::int8], ARRAY[1, 1], ARRAY[2, 1], ARRAY['T', 'T'], ARRAY['p', 'q']::bytea[], NULL, false)")"
check "appender: ranks out of event order are refused" $?
# Arrays are read by subscript (schema 12): an expected version at index 2 must not be ignored.
grep -q 'one-dimensional, starting at index 1' <<<"$(as $app "SELECT * FROM pawl.append(ARRAY['s1'], '[2:2]={7}'::int8[], ARRAY[1], ARRAY[1], ARRAY['T'], ARRAY['p']::bytea[], NULL, false)")"
check "appender: an expected version not at index 1 is refused" $?
grep -q 'one-dimensional, starting at index 1' <<<"$(as $app "SELECT * FROM pawl.append('{{s1}}'::text[], ARRAY[0::int8], ARRAY[1], ARRAY[1], ARRAY['T'], ARRAY['p']::bytea[], NULL, false)")"
check "appender: a two-dimensional stream array is refused" $?
# The group statement: the appender may call it, with the same checks; the processor may not.
group="SELECT appended FROM pawl.append_group(ARRAY['g1', 'g2', 'g1'], ARRAY[0, 5, 0]::int8[], ARRAY[1, 2, 3], ARRAY[1, 2, 3], ARRAY[1, 1, 1], ARRAY['T', 'T', 'T'], ARRAY['a', 'b', 'c']::bytea[], NULL, false)"
[ "$(as $app "$group" | tr '\n' ' ')" = "1 0 1 " ]; check "appender: a group appends, its conflict fails alone" $?
[ "$(q "SELECT string_agg(stream_seq::text || convert_from(payload, 'UTF8'), ',' ORDER BY k) FROM pawl.events WHERE stream_id = 'g1'")" = "1a,2c" ]
check "appender: the group's appends to one stream keep their order" $?
denied $proc "$group" "processor: the group append function denied"
grep -q 'ranks 1..count, in order' <<<"$(as $app "SELECT * FROM pawl.append_group(ARRAY['g3'], ARRAY[0::int8], ARRAY[1], ARRAY[1, 1], ARRAY[2, 1], ARRAY['T', 'T'], ARRAY['p', 'q']::bytea[], NULL, false)")"
check "appender: a group's ranks out of event order are refused" $?
grep -q 'follow the previous append' <<<"$(as $app "SELECT * FROM pawl.append_group(ARRAY['g4', 'g5'], ARRAY[0, 0]::int8[], ARRAY[1, 2], ARRAY[2, 1], ARRAY[1, 1], ARRAY['T', 'T'], ARRAY['p', 'q']::bytea[], NULL, false)")"
check "appender: a group's events out of append order are refused" $?
# The group statement reads its arrays by subscript too (schema 13): g1 is at version 2, so an
# expected version 7 at index 2 must be refused, not ignored and appended.
grep -q 'one-dimensional, starting at index 1' <<<"$(as $app "SELECT * FROM pawl.append_group(ARRAY['g1'], '[2:2]={7}'::int8[], ARRAY[1], ARRAY[1], ARRAY[1], ARRAY['T'], ARRAY['x']::bytea[], NULL, false)")"
check "appender: a group's expected version not at index 1 is refused" $?
grep -q 'one-dimensional, starting at index 1' <<<"$(as $app "SELECT * FROM pawl.append_group(ARRAY['g1'], '{{7}}'::int8[], ARRAY[1], ARRAY[1], ARRAY[1], ARRAY['T'], ARRAY['x']::bytea[], NULL, false)")"
check "appender: a group's two-dimensional expected versions are refused" $?
grep -q 'one-dimensional, starting at index 1' <<<"$(as $app "SELECT * FROM pawl.append_group('[0:0]={g1}'::text[], ARRAY[0::int8], ARRAY[1], ARRAY[1], ARRAY[1], ARRAY['T'], ARRAY['x']::bytea[], NULL, false)")"
check "appender: a group's stream array from index 0 is refused" $?
[ "$(q "SELECT count(*) FROM pawl.events WHERE stream_id = 'g1'")" = 2 ]
check "appender: nothing of the refused groups was written" $?
# One set of limits for every path (schema 14): the table refuses what the C library refuses.
long=$(printf 's%.0s' $(seq 1 256))
grep -q 'events_stream_id_check' <<<"$(as $app "SELECT * FROM pawl.append(ARRAY['$long'], ARRAY[0::int8], ARRAY[1], ARRAY[1], ARRAY['T'], ARRAY['p']::bytea[], NULL, false)")"
check "appender: a 256-byte stream id through pawl.append is refused" $?
grep -q 'events_stream_id_check' <<<"$(as $app "SELECT * FROM pawl.append(ARRAY[''], ARRAY[0::int8], ARRAY[1], ARRAY[1], ARRAY['T'], ARRAY['p']::bytea[], NULL, false)")"
check "appender: an empty stream id through pawl.append is refused" $?
grep -q 'events_type_check' <<<"$(as $app "SELECT * FROM pawl.append(ARRAY['lim'], ARRAY[0::int8], ARRAY[1], ARRAY[1], ARRAY[repeat('t', 1000000)], ARRAY['p']::bytea[], NULL, false)")"
check "appender: a 1 MB type through pawl.append is refused" $?
grep -q 'events_metadata_check' <<<"$(as $app "SELECT * FROM pawl.append_group(ARRAY['lim'], ARRAY[0::int8], ARRAY[1], ARRAY[1], ARRAY[1], ARRAY['T'], ARRAY['p']::bytea[], ARRAY['[1]'::jsonb], false)")"
check "appender: non-object metadata through pawl.append_group is refused" $?
[ "$(q "SELECT count(*) FROM pawl.events WHERE stream_id = 'lim' OR octet_length(stream_id) > 255")" = 0 ]
check "appender: nothing of the refused appends was written" $?
ok255=$(printf 'k%.0s' $(seq 1 255))
[ "$(as $app "SELECT pawl_api.append('$ok255', 'T', 'p')")" = 1 ]
check "appender: a 255-byte stream id through pawl_api.append is taken (the C library's limit)" $?
as $app "SELECT * FROM pawl.finalize()" >/dev/null
[ "$(unfinalized)" = 0 ]; check "appender: finalize orders them" $?

# ---- outsiders cannot take the finalizer's lock ----------------------------------------------------
denied $other "BEGIN; LOCK TABLE pawl_locks.finalizer IN EXCLUSIVE MODE; COMMIT" "other: LOCK TABLE the gate denied"
denied $app "BEGIN; LOCK TABLE pawl_locks.finalizer IN EXCLUSIVE MODE; COMMIT" "appender: LOCK TABLE the gate denied"
denied $app "BEGIN; LOCK TABLE pawl_locks.finalizer IN ACCESS SHARE MODE; COMMIT" "appender: not even ACCESS SHARE on the gate"
[ "$(q "SELECT to_regclass('pawl.finalizer_gate') IS NULL")" = t ]; check "the old gate is gone" $?

# ---- a reader cannot hold the gate with a parse-time lock (schema 14) ------------------------------
hold="CREATE FUNCTION pg_temp.hold() RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT pg_sleep(6) IS NOT NULL';"
t0=$(date +%s.%N)
out=$(as $rd "$hold SELECT 1 FROM pawl_locks.finalizer WHERE pg_temp.hold() FOR UPDATE")
t1=$(date +%s.%N)
secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
grep -q 'permission denied for schema pawl_locks' <<<"$out"; check "reader: FOR UPDATE on the gate refused" $?
awk -v s="$secs" 'BEGIN { exit !(s < 3) }'; check "reader: refused before any lock was held ($secs s)" $?
psql "$OWNER user=$rd" -qAt -c "$hold SELECT 1 FROM pawl_locks.tokens_init WHERE pg_temp.hold() FOR UPDATE" >/dev/null 2>&1 &
bgs+=($!)
as $app "SELECT pawl_api.append('gate-probe', 'T', 'p')" >/dev/null
[ "$(as $app "SELECT appends FROM pawl.finalize()")" -ge 1 ] 2>/dev/null
check "appender: finalize runs while a reader tries the gates" $?

# ---- a pawl_reader reads the SQL face and nothing more ---------------------------------------------
[ "$(as $rd "SELECT count(*) > 0 FROM pawl_api.read(0, 10)")" = t ]; check "reader: pawl_api.read" $?
[ "$(as $rd "SELECT count(*) > 0 FROM pawl_api.events")" = t ]; check "reader: pawl_api.events" $?
denied $rd "SELECT pawl_api.append('s1', 'T', 'p')" "reader: pawl_api.append denied"
denied $rd "$call" "reader: pawl.append denied"
denied $rd "SELECT * FROM pawl.finalize()" "reader: pawl.finalize denied"
denied $rd "SELECT pawl.tokens_init('rdp', 1, 0)" "reader: tokens_init denied"
denied $rd "SELECT * FROM pawl.tokens_list('rdp')" "reader: tokens_list denied"
denied $rd "SELECT * FROM pawl.dead_letters_list('rdp')" "reader: dead_letters_list denied"
denied $rd "SELECT * FROM pawl.tokens" "reader: the token table denied"

# ---- a run never covers its caller's own transaction (schema 14) -----------------------------------
psql "$OWNER user=$app" -qAt -v ON_ERROR_STOP=1 >"$tmp/own" 2>&1 <<EOF
BEGIN;
SELECT pawl_api.append('ph', 'T', 'first');
\! psql "$OWNER user=$app" -qAtc "SELECT pawl_api.append('other', 'T', 'o1')" >/dev/null
SELECT appends FROM pawl.finalize();
SELECT pawl_api.append('ph', 'T', 'second');
COMMIT;
EOF
check "appender: append, finalize, append, commit in one transaction" $?
as $app "SELECT * FROM pawl.finalize()" >/dev/null
[ "$(q "SELECT count(*) - count(DISTINCT global_index) FROM pawl_api.events")" = 0 ]
check "no index holds two events" $?
[ "$(unfinalized)" = 0 ]; check "both of ph's events are final" $?
[ "$(q "SELECT string_agg(convert_from(payload, 'UTF8'), ',' ORDER BY global_index) FROM pawl_api.events WHERE stream_id = 'ph'")" = first,second ]
check "ph's events in order" $?
n=$(q "SELECT count(*) FROM pawl_api.events")
got=$(PAWL_DSN="$OWNER user=$rd" PAWL_LOG_LEVEL=error timeout 20 "$PAWL" tail --from 0 --count "$n" --json 2>"$tmp/tail_err" | wc -l)
[ "$got" = "$n" ]; ok=$?; check "pawl tail reads all $n events ($got; $(head -c 200 "$tmp/tail_err"))" $ok

# ---- a session idle in a transaction that holds the gate is ended ----------------------------------
(echo "BEGIN;"; echo "SELECT appends FROM pawl.finalize();"; sleep 15) |
    psql "$OWNER user=$app application_name=idle-holder" -qAt >/dev/null 2>&1 &
bgs+=($!)
for _ in $(seq 1 50); do [ -n "$(q "SELECT pid FROM pawl_api.finalizer_holder()")" ] && break; sleep 0.1; done
[ "$(q "SELECT application_name FROM pawl_api.finalizer_holder()")" = idle-holder ]
check "the idle holder is named" $?
gone=1
for _ in $(seq 1 80); do [ -z "$(q "SELECT pid FROM pawl_api.finalizer_holder()")" ] && { gone=0; break; }; sleep 0.1; done
check "the idle holder is ended within 8 s" $gone
[ "$(as $app "SELECT appends FROM pawl.finalize()")" -ge 0 ] 2>/dev/null; check "finalize runs again" $?

# ---- an advisory key on a processor's name does not block its start --------------------------------
psql "$OWNER user=$other" -qAtc "SELECT pg_advisory_lock(hashtextextended('pawl.tokens:ADV', 0)), pg_sleep(8)" >/dev/null 2>&1 &
bgs+=($!)
sleep 0.5
q "SELECT pawl.grant_processor('ADV', '$proc')" >/dev/null
t0=$(date +%s.%N)
out=$(psql "$OWNER user=$proc" -qAt -v ON_ERROR_STOP=1 -c "SET statement_timeout = '4s'" -c "SELECT pawl.tokens_init('ADV', 4, 0)" 2>&1)
t1=$(date +%s.%N)
secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
[ "$out" = 4 ]; check "processor: tokens_init while another login holds the old key ($out, $secs s)" $?
psql "$OWNER user=$other" -qAtc "SELECT pg_advisory_lock(1885435756, 1), pg_sleep(4)" >/dev/null 2>&1 &
bgs+=($!)
sleep 0.5
before=$(q "SELECT count(*) FROM pawl_api.events")
printf '%s\n' '{"stream":"x-1","type":"T"}' '{"stream":"x-2","type":"T"}' |
    PAWL_DSN="$OWNER user=$app" PAWL_LOG_LEVEL=error timeout 10 "$PAWL" append >/dev/null 2>&1
check "appender: pawl append while an outsider holds the old advisory key" $?
[ "$(q "SELECT count(*) FROM pawl_api.events")" -eq $((before + 2)) ]; check "its events are finalized" $?
[ "$(unfinalized)" = 0 ]; check "nothing left unfinalized" $?

# ---- a pawl role holding the lock is named; an exiting appender does not spin ----------------------
psql "$OWNER user=$app application_name=gate-holder" -qAt -c "BEGIN" -c "SELECT appends FROM pawl.finalize()" \
    -c "SELECT pg_sleep(12)" -c "COMMIT" >/dev/null 2>&1 &
holder=$!
bgs+=($holder)
for _ in $(seq 1 50); do [ -n "$(q "SELECT pid FROM pawl_api.finalizer_holder()")" ] && break; sleep 0.1; done
[ "$(q "SELECT application_name FROM pawl_api.finalizer_holder()")" = gate-holder ]
check "finalizer_holder() names the holding session" $?
x0=$(xacts); t0=$(date +%s.%N)
printf '%s\n' '{"stream":"h-1","type":"T"}' '{"stream":"h-2","type":"T"}' |
    PAWL_DSN="$OWNER user=$app" PAWL_LOG_LEVEL=warn timeout 30 "$PAWL" append >/dev/null 2>"$tmp/err"
rc=$?
t1=$(date +%s.%N); x1=$(xacts)
secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
check "pawl append exits (rc $rc) while the lock is held" $rc
awk -v s="$secs" 'BEGIN { exit !(s < 9) }'; check "within its deadline ($secs s)" $?
grep -q 'gate-holder' "$tmp/err"; check "its message names the holder" $?
rate=$(awk -v d="$((x1 - x0))" -v s="$secs" 'BEGIN { printf "%d", d / s }')
[ "$rate" -lt 300 ]; check "no spin: $rate transactions/s while waiting" $?
wait $holder
as $app "SELECT * FROM pawl.finalize()" >/dev/null
[ "$(unfinalized)" = 0 ]; check "finalized once the holder is gone" $?

# ---- an exiting appender leaves nothing unfinalized ------------------------------------------------
PAWL_DSN="$OWNER user=$app" PAWL_LOG_LEVEL=error "$PAWL" append --generate --count 300 --duration 0 \
    --rate 0 --streams 7 >/dev/null 2>&1
check "pawl append --generate 300" $?
[ "$(unfinalized)" = 0 ]; check "after it exits, every committed append is finalized" $?
[ "$(q "SELECT pawl_api.last_index() = (SELECT count(*) FROM pawl.events)")" = t ]
check "last_index covers every event" $?

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
