#!/usr/bin/env bash
# test_token_isolation.sh — processors are isolated from each other (sql/007_token_isolation.sql).
# Two logins in pawl_processor, each granted its own processor (pawl.grant_processor). Logged in
# as A: every way of touching B's rows is refused (direct UPDATE / INSERT / DELETE on the token
# tables, every token function, the tool's reset / split / merge / status), and B's rows and
# nodes are byte for byte what they were. Claims and node times dated in the future are refused
# by a CHECK, even for the owner. A's own processor works: `pawl run` as A handles the events
# appended, then status, reset and split as A succeed. Dead letters (schema 8) follow the same
# grants: B parks only in a segment it holds, and A can neither read nor change B's letters.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
SRC=${PAWL_SOURCE_DIR:?run through ctest}
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 77; }
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_tok_iso_$$
ra=ti_a_$$ rb=ti_b_$$
bg=
cleanup() {
    [ -n "$bg" ] && kill -9 "$bg" 2>/dev/null
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    for r in $ra $rb; do psql "$BASE_DSN" -qAtc "DROP ROLE IF EXISTS $r" >/dev/null 2>&1; done
    rm -rf "$tmp"
}
trap cleanup EXIT
psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" || exit 1
OWNER="$BASE_DSN dbname=$db"
export PAWL_LOG_LEVEL=error PAWL_PROGRESS=off

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
q() { psql "$OWNER" -qAtc "$1"; }
qe() { psql "$OWNER" -qAtc "$1" 2>&1 || true; } # as q, with the error text, for grep
# Run SQL as a role; prints the outcome (errors included) and always succeeds, for grep.
as() { local who=$1; shift; psql "$OWNER user=$who" -qAt -v ON_ERROR_STOP=1 -c "$1" 2>&1 || true; }
# A statement run as A must be refused with a permission error.
refused() {
    local what=$1 sql=$2 out
    out=$(as $ra "$sql")
    grep >/dev/null <<<"$out" 'permission denied\|may not use processor\|must be\|violates check'
    local rc=$? # taken before the message: its command substitution would set $?
    check "A: $what refused ($(head -n 1 <<<"$out" | cut -c1-90))" $rc
}
# B's rows and nodes, as text: any change shows.
snap() { q "SELECT coalesce(string_agg(t::text, ';' ORDER BY segment_id), '') FROM pawl.tokens t WHERE processor = 'pb'"
         q "SELECT coalesce(string_agg(n::text, ';' ORDER BY node), '') FROM pawl.processor_nodes n WHERE processor = 'pb'"; }

PAWL_DSN="$OWNER" "$PAWL" init >/dev/null 2>&1; check "init as the owner" $?
psql "$OWNER" -q -v ON_ERROR_STOP=1 -f "$SRC/sql/roles/least_privilege.sql" >/dev/null 2>&1
check "role setup applies" $?
# The private cluster authenticates every role but its owner by password (SCRAM).
export PGPASSWORD=pawl-test-secret
psql "$BASE_DSN" -qAt -v ON_ERROR_STOP=1 -c "CREATE ROLE $ra LOGIN PASSWORD '$PGPASSWORD' IN ROLE pawl_processor" \
    -c "CREATE ROLE $rb LOGIN PASSWORD '$PGPASSWORD' IN ROLE pawl_processor" >/dev/null
check "two processor logins" $?
q "SELECT pawl.grant_processor('pa', '$ra'), pawl.grant_processor('pb', '$rb')" >/dev/null
check "pa granted to A, pb to B" $?
grep >/dev/null 'permission denied' <<<"$(as $ra "SELECT pawl.grant_processor('pb', '$ra')")"
check "A cannot grant itself pb" $?
grep >/dev/null 'permission denied' <<<"$(as $ra "INSERT INTO pawl.processor_grants (processor, role) VALUES ('pb', '$ra')")"
check "A cannot insert a grant" $?
grep >/dev/null 'does not exist' <<<"$(qe "SELECT pawl.grant_processor('pa', 'no_such_role_$$')")"
check "a grant to a missing role is refused" $?

# B's state: 4 segments at 50, segment 1 claimed by B's node, B's node registered.
as $rb "SELECT pawl.tokens_init('pb', 4, 50)" >/dev/null
as $rb "SELECT * FROM pawl.tokens_claim('pb', 1, 'b-node/1', 10000, 0::int2)" >/dev/null
as $rb "SELECT * FROM pawl.tokens_extend('pb', 'b-node/1', '{1}')" >/dev/null
[ "$(q "SELECT count(*) FROM pawl.tokens WHERE processor = 'pb' AND token = 50")" -eq 4 ] &&
    [ "$(q "SELECT owner FROM pawl.tokens WHERE processor = 'pb' AND segment_id = 1")" = b-node/1 ]
check "B initialised and claimed its own processor" $?
before=$(snap)

# ---- A against B: direct table access ---------------------------------------------------------
refused "UPDATE of B's tokens to 0" "UPDATE pawl.tokens SET token = 0 WHERE processor = 'pb'"
refused "setting B's owner a century ahead" "UPDATE pawl.tokens SET owner = 'a', claimed_at = now() + interval '100 years' WHERE processor = 'pb'"
refused "INSERT of a token row for B" "INSERT INTO pawl.tokens (processor, segment_id, mask, token, high_water) VALUES ('pb', 9, 15, 0, 0)"
refused "DELETE of B's tokens" "DELETE FROM pawl.tokens WHERE processor = 'pb'"
refused "a fake node for B" "INSERT INTO pawl.processor_nodes VALUES ('pb', 'fake', now())"
refused "DELETE of B's nodes" "DELETE FROM pawl.processor_nodes WHERE processor = 'pb'"
refused "reading B's tokens" "SELECT count(*) FROM pawl.tokens"
refused "reading B's nodes" "SELECT count(*) FROM pawl.processor_nodes"
# ---- A against B: every token function --------------------------------------------------------
refused "tokens_list(pb)" "SELECT * FROM pawl.tokens_list('pb')"
refused "tokens_claim(pb) with timeout 0" "SELECT * FROM pawl.tokens_claim('pb', 1, 'a', 0, 0::int2)"
refused "tokens_claim(pb) as B's node" "SELECT * FROM pawl.tokens_claim('pb', 0, 'b-node/1', 10000, 0::int2)"
refused "store_token(pb) as B's node" "SELECT pawl.store_token('pb', 1, 'b-node/1', 0)"
refused "store_token(pb) forwards" "SELECT pawl.store_token('pb', 1, 'b-node/1', 1000000)"
refused "tokens_extend(pb) registering a fake node" "SELECT * FROM pawl.tokens_extend('pb', 'fake', '{}')"
refused "tokens_extend(pb) as B's node" "SELECT * FROM pawl.tokens_extend('pb', 'b-node/1', '{1}')"
refused "nodes_live(pb)" "SELECT * FROM pawl.nodes_live('pb', 'x', 10000)"
refused "nodes_leave(pb) of B's node" "SELECT pawl.nodes_leave('pb', 'b-node/1')"
refused "tokens_release(pb) of B's claim" "SELECT pawl.tokens_release('pb', 1, 'b-node/1')"
refused "tokens_reset(pb)" "SELECT pawl.tokens_reset('pb', 0)"
refused "tokens_split(pb)" "SELECT pawl.tokens_split('pb', 0, NULL)"
refused "tokens_merge(pb)" "SELECT pawl.tokens_merge('pb', 0, NULL)"
refused "tokens_init of a processor not granted" "SELECT pawl.tokens_init('pc', 4, 0)"
refused "tokens_authorize called directly" "SELECT pawl.tokens_authorize('pb')"
refused "revoke_processor of B's grant" "SELECT pawl.revoke_processor('pb', '$rb')"
# ---- dead letters (sql/008_dead_letters.sql): the same grants, and the node's claim ------------
park="'b-node/1', 'orders-1', 77, 5, 1, 'T', '\\x00'::bytea, NULL, 0, 1, NULL, 'e', 'e', 0)"
out=$(as $rb "SELECT pawl.dead_letters_park('pb', 1, $park")
[ "$out" = 1 ]; check "B parks a letter in the segment it holds ($out)" $?
grep >/dev/null 'no longer claimed' <<<"$(as $rb "SELECT pawl.dead_letters_park('pb', 0, $park")"
check "B cannot park in a segment it does not hold" $?
[ "$(as $rb "SELECT count(*) FROM pawl.dead_letters_list('pb')")" = 1 ]
check "B lists its own dead letters" $?
dl_before=$(q "SELECT string_agg(d::text, ';') FROM pawl.dead_letters d")
refused "reading B's dead letters" "SELECT count(*) FROM pawl.dead_letters"
refused "deleting B's dead letters" "DELETE FROM pawl.dead_letters"
refused "dead_letters_park(pb) as B's node" "SELECT pawl.dead_letters_park('pb', 1, $park"
refused "dead_letters_list(pb)" "SELECT * FROM pawl.dead_letters_list('pb')"
refused "dead_letters_show(pb)" "SELECT * FROM pawl.dead_letters_show('pb', NULL)"
refused "dead_letters_segment(pb)" "SELECT * FROM pawl.dead_letters_segment('pb', 1, 3)"
refused "dead_letters_stats(pb)" "SELECT * FROM pawl.dead_letters_stats('pb')"
refused "dead_letters_retry(pb)" "SELECT pawl.dead_letters_retry('pb', 'orders-1')"
refused "dead_letters_drop(pb)" "SELECT pawl.dead_letters_drop('pb', 'orders-1', NULL)"
refused "dead_letters_unpark(pb) as B's node" "SELECT pawl.dead_letters_unpark('pb', 1, 'b-node/1', 'orders-1', 100)"
refused "dead_letters_retry_failed(pb)" "SELECT pawl.dead_letters_retry_failed('pb', 1, 'b-node/1', 'orders-1', 77, 'x')"
refused "dead_letters_check_claim called directly" "SELECT pawl.dead_letters_check_claim('pb', 1, 'b-node/1')"
[ "$(q "SELECT string_agg(d::text, ';') FROM pawl.dead_letters d")" = "$dl_before" ]
check "B's dead letters are untouched" $?
refused "posing as B (SET ROLE)" "SET ROLE $rb"
refused "posing as B (SET SESSION AUTHORIZATION)" "SET SESSION AUTHORIZATION $rb"
# ---- A against B: the tool --------------------------------------------------------------------
export PAWL_DSN="$OWNER user=$ra"
"$PAWL" reset pb --to start --execute >"$tmp/out" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q 'may not use processor pb' "$tmp/out"; check "A: pawl reset pb refused (exit $rc)" $?
"$PAWL" split pb --segment 0 --execute >"$tmp/out" 2>&1; rc=$?
[ $rc -ne 0 ]; check "A: pawl split pb refused (exit $rc)" $?
"$PAWL" merge pb --segment 0 --execute >"$tmp/out" 2>&1; rc=$?
[ $rc -ne 0 ]; check "A: pawl merge pb refused (exit $rc)" $?
"$PAWL" status pb >"$tmp/out" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q 'may not use processor pb' "$tmp/out"; check "A: pawl status pb refused (exit $rc)" $?
timeout -s KILL 20 "$PAWL" run --processor pb --handler count >"$tmp/out" 2>&1; rc=$?
[ $rc -ne 0 ]; check "A: pawl run --processor pb refused (exit $rc)" $?
[ "$(q "SELECT count(*) FROM pawl.tokens WHERE processor = 'pc'")" -eq 0 ]; check "nothing created for pc" $?
[ "$(snap)" = "$before" ]; check "B's tokens, claims and nodes are untouched" $?
grep >/dev/null 'may not use processor pa' <<<"$(as $rb "SELECT pawl.store_token('pa', 0, 'x', 5)")"
check "B is refused A's processor the same way" $?

# ---- the server's clock only: claims and node times in the future are refused ------------------
qe "UPDATE pawl.tokens SET owner = 'x', claimed_at = now() + interval '100 years' WHERE processor = 'pb' AND segment_id = 2" |
    grep -q 'tokens_claimed_at_check'; check "even the owner cannot date a claim a century ahead" $?
qe "INSERT INTO pawl.processor_nodes VALUES ('pb', 'future', now() + interval '1 hour')" |
    grep -q 'processor_nodes_seen_at_check'; check "nor a node's liveness an hour ahead" $?
[ "$(snap)" = "$before" ]; check "B's rows still untouched" $?

# ---- A's own processor works as A -------------------------------------------------------------
PAWL_DSN="$OWNER" "$PAWL" append --generate --count 300 --duration 0 --rate 0 --streams 30 >/dev/null 2>&1
check "300 events appended (as the owner)" $?
"$PAWL" run --processor pa --handler print --segments 4 --claim-poll 100ms >"$tmp/run.out" 2>"$tmp/run.err" &
bg=$!
ok=1
for _ in $(seq 1 150); do
    [ "$(q "SELECT count(*) FROM pawl.tokens WHERE processor = 'pa' AND token = 300 AND owner IS NOT NULL")" = 4 ] && { ok=0; break; }
    sleep 0.2
done
check "A: pawl run --processor pa claims its 4 segments and handles all 300 events" $ok
"$PAWL" status pa --json >"$tmp/st.json" 2>"$tmp/err"; check "A: pawl status pa while running" $?
jq -e 'all(.segments[]; .owner | test("/[0-9a-f]{12}$"))' "$tmp/st.json" >/dev/null
check "status shows the node's instance id (<node id>/<nonce>)" $?
kill -INT "$bg"; for _ in $(seq 1 100); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
wait "$bg"; rc=$?; bg=; [ $rc -eq 130 ]; check "A: pawl run stops cleanly (exit $rc)" $?
grep -qi 'permission denied\|42501\|may not use' "$tmp/run.err"; [ $? -ne 0 ]; check "A: no permission errors while running" $?
[ "$(jq -r .index "$tmp/run.out" | sort -un | wc -l)" -eq 300 ] && [ "$(wc -l <"$tmp/run.out")" -eq 300 ]
check "A: the print handler printed each of the 300 events once" $?
"$PAWL" reset pa --to start --execute >/dev/null 2>&1; check "A: pawl reset pa --execute" $?
[ "$(q "SELECT max(token) FROM pawl.tokens WHERE processor = 'pa'")" -eq 0 ]; check "A: pa reset to 0" $?
"$PAWL" split pa --segment 1 --execute >/dev/null 2>&1; check "A: pawl split pa --execute" $?
[ "$(q "SELECT count(*) FROM pawl.tokens WHERE processor = 'pa'")" -eq 5 ]; check "A: pa has 5 segments" $?
[ "$(snap)" = "$before" ]; check "B's rows untouched after A's run" $?

# ---- revoking takes effect at once ------------------------------------------------------------
q "SELECT pawl.revoke_processor('pa', '$ra')" >/dev/null
grep >/dev/null 'may not use processor pa' <<<"$(as $ra "SELECT * FROM pawl.tokens_list('pa')")"
check "A loses pa once revoked" $?

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
