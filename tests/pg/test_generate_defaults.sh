#!/usr/bin/env bash
# test_generate_defaults.sh — `pawl append --generate` at its defaults (4 appenders, 2000
# events/s, 10 events per append, 1000 streams) does not contend with itself: its appends in
# flight together use distinct streams, so none waits for another's stream lock, and no
# "waits for a lock held by another transaction" warning appears. With random streams two
# connections' transactions met on a stream about once per ten appends: on a loaded machine a
# wait then outlasted --append-lock-timeout (100 ms) and warned. The second run makes any such
# wait visible: with --append-lock-timeout 1ms every lock wait longer than a millisecond warns,
# which random streams did within a second.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_generate_$$
psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db" && psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" || exit 1
cleanup() {
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
export PAWL_DSN="$BASE_DSN dbname=$db"
# The defaults: no load or log setting from the environment.
for v in $(compgen -e | grep '^PAWL_'); do
    case $v in PAWL_BIN | PAWL_SOURCE_DIR | PAWL_TEST_DSN | PAWL_PG | PAWL_PG_KEY | PAWL_DSN) ;; *) unset "$v" ;; esac
done

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }

"$PAWL" init >/dev/null 2>"$tmp/init.err"; check "init" $?

warnings() { grep -E '^[0-9T:.-]+Z (warn|error) |^pawl: (warning|error)' "$1"; }

# At the defaults (a shorter run: the default is 20 s).
"$PAWL" append --generate --duration 4s --progress off >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ]; check "append --generate at its defaults (exit $rc)" $?
grep -q 'appended [0-9]* events .* 0 failed appends' "$tmp/err"; _rc=$?; check "summary: $(grep appended "$tmp/err")" $_rc
[ -z "$(warnings "$tmp/err")" ]; check "no warning at the defaults" $?
warnings "$tmp/err" | sed 's/^/     /'

# Any lock wait of more than a millisecond would warn here.
"$PAWL" append --generate --duration 3s --progress off --append-lock-timeout 1ms >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ]; check "append --generate with --append-lock-timeout 1ms (exit $rc)" $?
! grep -q 'waits for a lock held by another transaction' "$tmp/err"
check "its appends never wait for each other's stream locks" $?
warnings "$tmp/err" | head -3 | sed 's/^/     /'

# The generator spreads its events over --streams streams in turn: all 1000 are used, evenly.
read -r nstreams spread <<<"$(psql "$PAWL_DSN" -qAtF' ' -c \
    "SELECT count(*), max(n) - min(n) FROM (SELECT stream_id, count(*) AS n FROM pawl_api.events
     GROUP BY stream_id) s")"
[ "$nstreams" = 1000 ] && [ "$spread" -le 2 ]
check "events spread over the 1000 default streams evenly (streams $nstreams, spread $spread)" $?

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
