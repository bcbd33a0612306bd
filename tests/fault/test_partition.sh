#!/usr/bin/env bash
# test_partition.sh — a network partition between one processor node and PostgreSQL.
#
# Three network namespaces created here: one for PostgreSQL (a cluster of this test's own,
# listening on TCP on two addresses), and one per processor node, each joined to the database's
# namespace by a veth pair; every address lives inside these namespaces. Two `sql` nodes of the
# chaos helper (an exactly-once projection written in the batch transaction; claim timeout 3 s)
# share the processor's 4 segments while an appender keeps appending over the unix socket. Then
# node A's link goes down for 12 s (4x the claim timeout) and comes back. Checked:
#   - while A is cut off, node B takes A's segments (all 4 owned by B) and keeps them moving;
#   - after the link returns, A commits no stale work: the projection equals the log exactly
#     (a stale batch would count its events twice), and no audited token write moved a token
#     backwards;
#   - A recovers (it may claim segments again through the normal rebalancing);
#   - every acknowledged append is in the log once.
# Skips (exit 77) where network namespaces cannot be created (not root, no CAP_NET_ADMIN,
# a seccomp profile refusing unshare).
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BIN=${CHAOS_BIN:-$PAWL_BIN/../tests}
PG=${PAWL_PG:?run through ctest}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }
command -v ip >/dev/null || { echo "SKIP: ip (iproute2) is not installed"; exit 77; }
[ -x "$BIN/chaos_proc" ] || { echo "chaos helpers not built in $BIN"; exit 1; }

tag=$$
NSDB=pawl_db_$tag NSA=pawl_a_$tag NSB=pawl_b_$tag
if ! ip netns add "$NSDB" 2>/tmp/pawl-netns-$tag.err; then
    echo "SKIP: cannot create network namespaces here ($(cat /tmp/pawl-netns-$tag.err)); needs root with CAP_NET_ADMIN"
    rm -f /tmp/pawl-netns-$tag.err
    exit 77
fi
rm -f /tmp/pawl-netns-$tag.err
work=$(mktemp -d /tmp/pawl-partition.XXXXXX)
chmod 755 "$work"
export PAWL_PG_KEY=$work
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    "$PG" remove >/dev/null 2>&1
    for ns in "$NSA" "$NSB" "$NSDB"; do ip netns del "$ns" 2>/dev/null; done
    if [ "${keep:-0}" = 1 ]; then echo "logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }

# ---- the network: db <-> a (10.201.1.0/24), db <-> b (10.201.2.0/24) -------------------------
ip netns add "$NSA" && ip netns add "$NSB" || { echo "cannot create namespaces"; exit 1; }
net() {
    ip link add "da$tag" netns "$NSDB" type veth peer name "va$tag" netns "$NSA" &&
    ip link add "db$tag" netns "$NSDB" type veth peer name "vb$tag" netns "$NSB" &&
    ip -n "$NSDB" addr add 10.201.1.1/24 dev "da$tag" && ip -n "$NSA" addr add 10.201.1.2/24 dev "va$tag" &&
    ip -n "$NSDB" addr add 10.201.2.1/24 dev "db$tag" && ip -n "$NSB" addr add 10.201.2.2/24 dev "vb$tag" &&
    for ns in "$NSDB" "$NSA" "$NSB"; do ip -n "$ns" link set lo up || return 1; done &&
    ip -n "$NSDB" link set "da$tag" up && ip -n "$NSDB" link set "db$tag" up &&
    ip -n "$NSA" link set "va$tag" up && ip -n "$NSB" link set "vb$tag" up
}
net || { echo "SKIP: cannot create veth pairs in network namespaces"; exit 77; }

# ---- PostgreSQL in the database namespace, TCP on both links, unix socket for the test -------
"$PG" start >/dev/null || { echo "cannot start PostgreSQL"; exit 1; }
# The nodes' addresses, with a password check like every other login (no trust lines). The file
# belongs to the cluster's owner: append as that owner.
if [ "$(id -u)" = 0 ]; then owner=(runuser -u postgres --); else owner=(); fi
echo "host all all 10.201.0.0/16 scram-sha-256" | "${owner[@]}" tee -a "$("$PG" dir)/data/pg_hba.conf" >/dev/null
"$PG" stop >/dev/null
ip netns exec "$NSDB" env PAWL_PG_TCP_PORT=5432 PAWL_PG_TCP_ADDR=10.201.1.1,10.201.2.1 "$PG" start >/dev/null ||
    { echo "cannot start PostgreSQL in the namespace"; exit 1; }
DSN=$("$PG" dsn)
PASSFILE=${DSN##*passfile=}
TCP_A="host=10.201.1.1 port=5432 dbname=pawl user=pawl passfile=$PASSFILE connect_timeout=3"
TCP_B="host=10.201.2.1 port=5432 dbname=pawl user=pawl passfile=$PASSFILE connect_timeout=3"
ip netns exec "$NSA" psql "$TCP_A" -qAtc 'SELECT 1' >/dev/null 2>&1; check "node A's namespace reaches PostgreSQL over TCP" $?
ip netns exec "$NSB" psql "$TCP_B" -qAtc 'SELECT 1' >/dev/null 2>&1; check "node B's namespace reaches PostgreSQL over TCP" $?
psql "$TCP_A" -qAtc 'SELECT 1' >/dev/null 2>&1; [ $? -ne 0 ]; check "the host itself has no route to those addresses" $?

sql() { psql "$DSN" -qAt -v ON_ERROR_STOP=1 -c "$1"; }
PAWL_DSN="$DSN" PAWL_LOG_LEVEL=error "$PAWL" init >/dev/null 2>&1 || { echo "pawl init failed"; exit 1; }
sql "CREATE TABLE chaos_proj (stream text PRIMARY KEY, n int8 NOT NULL, total int8 NOT NULL);
     CREATE TABLE audit (at timestamptz NOT NULL DEFAULT clock_timestamp(), segment_id int8,
         old_owner text, new_owner text, old_token int8, new_token int8);
     -- Token writes run in pawl's functions, whose search_path is pg_catalog only: the trigger
     -- keeps the search_path it was created with.
     CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS \$\$
     BEGIN
         INSERT INTO audit (segment_id, old_owner, new_owner, old_token, new_token)
         VALUES (NEW.segment_id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.owner END, NEW.owner,
                 CASE WHEN TG_OP = 'UPDATE' THEN OLD.token END, NEW.token);
         RETURN NEW;
     END \$\$;
     CREATE TRIGGER audit AFTER INSERT OR UPDATE ON pawl.tokens FOR EACH ROW EXECUTE FUNCTION audit();" || exit 1

owned_by() { sql "SELECT count(*) FROM pawl.tokens WHERE processor = 'chaos_sql' AND owner LIKE '$1/%'"; }
wait_until() { # seconds, condition command
    local i
    for i in $(seq 1 $(($1 * 5))); do eval "$2" && return 0; sleep 0.2; done
    return 1
}

"$BIN/chaos_append" "$DSN" 1 "$work/ack-1" "$work/doubt-1" 2>"$work/app.log" &
app=$!; pids+=($app)
ip netns exec "$NSA" "$BIN/chaos_proc" "$TCP_A" sql "$work" node-a 2>"$work/a.log" &
pa=$!; pids+=($pa)
ip netns exec "$NSB" "$BIN/chaos_proc" "$TCP_B" sql "$work" node-b 2>"$work/b.log" &
pb=$!; pids+=($pb)
wait_until 60 '[ "$(owned_by node-a)" -ge 1 ] && [ "$(owned_by node-b)" -ge 1 ]'
rc=$? # before the message's own command substitutions, which would set $?
check "both nodes hold segments (A: $(owned_by node-a), B: $(owned_by node-b))" $rc
sleep 2

# ---- the partition ----------------------------------------------------------------------------
ip -n "$NSA" link set "va$tag" down
cut_at=$(sql "SELECT now()")
t0=$(date +%s.%N)
wait_until 30 '[ "$(owned_by node-b)" -eq 4 ]'; rc=$?
took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
check "while A is cut off, B takes all 4 segments (after ${took}s; claim timeout 3s)" $rc
before=$(sql "SELECT min(token) FROM pawl.tokens WHERE processor = 'chaos_sql'")
sleep 12
after=$(sql "SELECT min(token) FROM pawl.tokens WHERE processor = 'chaos_sql'")
[ "$after" -gt "$before" ]; check "B keeps every segment moving during the partition (min token $before -> $after)" $?
during=$(sql "SELECT count(*) FROM audit WHERE new_owner LIKE 'node-a/%' AND at > '$cut_at'::timestamptz")
[ "$during" -eq 0 ]; check "nothing was written as A while it was cut off ($during token writes)" $?
[ "$during" -eq 0 ] || sql "SELECT * FROM audit WHERE new_owner LIKE 'node-a/%' AND at > '$cut_at'::timestamptz LIMIT 5"
ip -n "$NSA" link set "va$tag" up
restored_at=$(sql "SELECT now()")

# ---- after the partition ------------------------------------------------------------------------
wait_until 60 'ip netns exec "$NSA" psql "$TCP_A" -qAtc "SELECT 1" >/dev/null 2>&1'
check "A's namespace reaches PostgreSQL again" $?
sleep 10
kill -0 "$pa" 2>/dev/null; check "A survived the partition" $?
kill -TERM "$app"; wait "$app"
for i in $(seq 1 50); do sql "SELECT * FROM pawl.finalize(100000)" >/dev/null; sleep 0.1; done
wait_until 90 '[ "$(sql "SELECT count(*) FROM pawl.tokens WHERE processor = '"'chaos_sql'"' AND token < pawl_api.last_index()")" -eq 0 ]'
check "the nodes catch up with the head" $?
kill -TERM "$pa" "$pb"
for p in $pa $pb; do
    for _ in $(seq 1 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null
done
pids=()

bad=$(sql "SELECT count(*) FROM (SELECT stream_id AS stream, count(*) AS n,
             sum(convert_from(payload, 'UTF8')::int8) AS total FROM pawl_api.events GROUP BY 1) l
           FULL JOIN chaos_proj p USING (stream)
           WHERE l.n IS DISTINCT FROM p.n OR l.total IS DISTINCT FROM p.total")
total=$(sql "SELECT count(*) FROM pawl_api.events")
check "the projection equals the log ($total events; $bad streams differ): A committed no stale work" "$bad"
[ "$(sql "SELECT count(*) FROM audit WHERE new_token < old_token")" -eq 0 ]; check "no token write went backwards" $?
missing=$(psql "$DSN" -qAt -v ON_ERROR_STOP=1 -c "CREATE TEMP TABLE acks (id text)" -c "\\copy acks FROM '$work/ack-1'" \
    -c "SELECT count(*) FROM acks a WHERE NOT EXISTS (SELECT 1 FROM pawl_api.events e WHERE e.metadata->>'u' = a.id)")
[ "$missing" = 0 ]; rc=$?
check "every acknowledged append is in the log ($(wc -l <"$work/ack-1") acknowledged)" $rc
dups=$(sql "SELECT count(*) FROM (SELECT metadata->>'u' FROM pawl_api.events GROUP BY 1 HAVING count(*) > 1) d")
[ "$dups" = 0 ]; check "no event twice" $?
grep -Eq 'claim taken over|[1-9][0-9]* claims lost' "$work/a.log"
check "A found out on reconnect that its claims were taken over (and rolled its batch back)" $?
echo "node A: $(tail -n 1 "$work/a.log")"
echo "node B: $(tail -n 1 "$work/b.log")"
echo "A's token writes after the link returned: $(sql "SELECT count(*) FROM audit WHERE new_owner LIKE 'node-a/%' AND at > '$restored_at'::timestamptz")"

echo "$fails failure(s)"
if [ "$fails" -ne 0 ]; then keep=1; tail -n 20 "$work"/*.log; fi
[ "$fails" -eq 0 ]
