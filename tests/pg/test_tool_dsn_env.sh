#!/usr/bin/env bash
# test_tool_dsn_env.sh — where the tool connects without --dsn: libpq's own environment (PGHOST,
# PGPORT, PGDATABASE, PGUSER, PGPASSFILE; PGSERVICE with PGSERVICEFILE) is honoured before the
# private cluster, and `pawl config` says so, and a connection error too; without any of them, the private cluster is the
# same from every working folder (one per user, or per PAWL_PG_KEY), never one per folder.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
PG=${PAWL_PG:?run through ctest}
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
SRC=${PAWL_SOURCE_DIR:?run through ctest}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }
tmp=$(mktemp -d)
db=t_dsn_env_$$
cleanup() {
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
# One keyword of the test DSN (key=value form, unquoted values).
kw() { tr ' ' '\n' <<<"$BASE_DSN" | sed -n "s/^$1=//p" | tail -1; }
host=$(kw host) port=$(kw port) user=$(kw user) passfile=$(kw passfile)
psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" || exit 1
export PAWL_LOG_LEVEL=error PAWL_PROGRESS=off
unset PAWL_DSN PGHOST PGHOSTADDR PGPORT PGDATABASE PGUSER PGPASSWORD PGPASSFILE PGSERVICE PGSERVICEFILE
libpq_env=(PGHOST="$host" PGPORT="${port:-5432}" PGDATABASE="$db" PGUSER="$user")
[ -n "$passfile" ] && libpq_env+=(PGPASSFILE="$passfile")

# ---- libpq's variables --------------------------------------------------------------------------
env "${libpq_env[@]}" "$PAWL" init >"$tmp/out" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ]; ok=$?
check "init with PGHOST/PGDATABASE/... and no --dsn (exit $rc: $(head -c 300 "$tmp/err"))" $ok
[ "$(psql "$BASE_DSN dbname=$db" -qAtc 'SELECT count(*) > 0 FROM pawl.schema_version' 2>/dev/null)" = t ]
check "the schema went into PGDATABASE's database" $?
! grep -q 'private PostgreSQL' "$tmp/err"; check "no private cluster announced" $?
echo '{"stream":"s-1","type":"T"}' | env "${libpq_env[@]}" "$PAWL" append 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ]; check "append through libpq's environment (exit $rc)" $?
[ "$(env "${libpq_env[@]}" "$PAWL" tail --from 0 --count 1 --json 2>/dev/null | jq -r .stream)" = s-1 ]
check "tail reads it back" $?
[ "$(psql "$BASE_DSN dbname=$db" -qAtc 'SELECT count(*) FROM pawl_api.events')" = 1 ]
check "the event is in PGDATABASE's database" $?
env "${libpq_env[@]}" "$PAWL" config >"$tmp/cfg" 2>&1
grep -q '^  from: libpq environment' "$tmp/cfg" && grep -q "^database: .*dbname=$db" "$tmp/cfg"; ok=$?
check "config: the database comes from libpq's environment ($(grep -A1 '^database' "$tmp/cfg" | tr '\n' ' '))" $ok
env "${libpq_env[@]}" "$PAWL" status nosuch >/dev/null 2>&1; rc=$?
[ $rc -eq 5 ]; check "status reaches the token store through libpq's environment (exit $rc, want 5: no such processor)" $?
# A service file (PGSERVICEFILE + PGSERVICE) is libpq's environment too.
{
    echo "[pawltest]"
    echo "host=$host"
    echo "port=${port:-5432}"
    echo "dbname=$db"
    echo "user=$user"
    [ -n "$passfile" ] && echo "passfile=$passfile"
} >"$tmp/services"
[ "$(PGSERVICEFILE="$tmp/services" PGSERVICE=pawltest "$PAWL" tail --from 0 --count 1 --json 2>/dev/null | jq -r .stream)" = s-1 ]
check "PGSERVICE with PGSERVICEFILE" $?
# --dsn and PAWL_DSN still come first.
PGHOST=/nonexistent-pawl PGDATABASE=nope PAWL_DSN="$BASE_DSN dbname=$db" "$PAWL" tail --from 0 --count 1 >/dev/null 2>&1
check "PAWL_DSN wins over libpq's variables" $?
PGHOST=/nonexistent-pawl PGDATABASE=nope "$PAWL" tail --from 0 --count 1 --dsn "$BASE_DSN dbname=$db" >/dev/null 2>&1
check "--dsn wins over libpq's variables" $?
# A connection error says that libpq's variables chose the database, naming the ones set.
PGHOST=/nonexistent-pawl PGDATABASE=nope "$PAWL" status >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 3 ] && grep -q 'PGHOST, PGDATABASE from the environment chose the database' "$tmp/err"
_rc=$?; check "no database: names the PG* variables that chose it (exit $rc: $(tr '\n' ' ' <"$tmp/err" | head -c 300))" $_rc
PGHOST=/nonexistent-pawl "$PAWL" tail --from 0 --count 1 >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 3 ] && grep -q 'PGHOST from the environment chose' "$tmp/err"; check "the same for tail (exit $rc)" $?
PGHOST=/nonexistent-pawl PAWL_DSN="host=/nonexistent-pawl dbname=nope" "$PAWL" status >/dev/null 2>"$tmp/err"
! grep -q 'from the environment chose' "$tmp/err"; check "not said when PAWL_DSN chose the database" $?

# ---- the client encoding: always UTF-8 -----------------------------------------------------------
# PGCLIENTENCODING, client_encoding in the DSN and the database's default would make the server
# convert pawl's UTF-8 text: a stream appended by the tool and the same stream appended in SQL
# were two streams ("café" stored as "cafÃ©"), and text read back was not UTF-8.
psql "$BASE_DSN" -qAtc "ALTER DATABASE $db SET client_encoding = 'LATIN1'" || exit 1
psql "$BASE_DSN dbname=$db client_encoding=UTF8" -qAtc "SELECT pawl_api.append('café', 'Née', '{}')" >/dev/null
check "an SQL append to café" $?
printf '%s\n' '{"stream":"café","type":"Née","payload":{"n":"ü"}}' |
    PGCLIENTENCODING=LATIN1 "$PAWL" append --dsn "$BASE_DSN dbname=$db client_encoding=LATIN1" >/dev/null 2>&1
check "pawl append under PGCLIENTENCODING=LATIN1 and client_encoding=LATIN1" $?
[ "$(psql "$BASE_DSN dbname=$db client_encoding=UTF8" -qAtc "SELECT string_agg(stream_seq::text, ',' ORDER BY stream_seq)
      FROM pawl.events WHERE stream_id = 'café' AND type = 'Née'")" = 1,2 ]
check "one stream café, sequences 1 and 2" $?
out=$(PGCLIENTENCODING=LATIN1 "$PAWL" tail --dsn "$BASE_DSN dbname=$db" --from 0 --count 20 --json 2>/dev/null |
    jq -r 'select(.stream == "café") | .type + " " + (.payload.n // "-")' | tr '\n' ' ')
[ "$out" = "Née - Née ü " ]; check "pawl tail reads UTF-8 back ($out)" $?
psql "$BASE_DSN" -qAtc "ALTER DATABASE $db RESET client_encoding"

# ---- the private cluster: one place whatever the working folder ---------------------------------
where() { (cd "$1" && env -u PAWL_PG_KEY "$PAWL" config 2>/dev/null | sed -n 's/^  from: //p'); }
top=$(where "$SRC") sub=$(where "$SRC/tests/pg") other=$(where "$tmp")
case $top in "private cluster at "*) true ;; *) false ;; esac
check "config names the private cluster ($top)" $?
[ "$top" = "$sub" ] && [ "$top" = "$other" ]; check "the same private cluster from the top, a subfolder and elsewhere" $?
[ "$(cd "$SRC/tests/pg" && env -u PAWL_PG_KEY "$PG" dir)" = "$(cd "$SRC" && env -u PAWL_PG_KEY "$PG" dir)" ]
check "pawl-pg: the same folder from a subfolder" $?
[ "$(cd "$SRC/tests/pg" && "$PG" dir)" = "$(cd / && "$PG" dir)" ]; check "pawl-pg with PAWL_PG_KEY: the same folder from anywhere" $?
[ "$(cd "$SRC/tests/pg" && "$PG" dir)" != "$(cd / && env -u PAWL_PG_KEY "$PG" dir)" ]; check "PAWL_PG_KEY selects a cluster of its own" $?

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
