#!/usr/bin/env bash
# native_append_instr.sh [SMALL] [LARGE]: what an append costs the server in instructions, on the
# native path, against an INSERT of the same rows: counts that do not move with the machine's load
# (the CPU-time figures of bench/native_append.sh scatter on a shared machine). A throw-away
# cluster (initdb in a temporary folder, removed at the end) gets pawl's schema on the native path
# and bench_insert.events, made LIKE the newest partition of pawl.events (its columns,
# constraints, defaults and every index), both filled with the same 20,000 rows. Then a
# single-user backend (`postgres --single`) runs, under callgrind, SMALL and LARGE prepared
# executions of each statement, each in its own transaction:
#   a1   = pawl.append of one event on a new stream       i1   = the INSERT of that row
#   a100 = pawl.append of 100 events on 100 new streams   i100 = the INSERT of those rows
#          (of one category: one run, which the INSERT writes as the append does, schema 18)
#   a1id, a100id = a1 and a100 with an event id on every event (new ids: stored and indexed)
#   a1nc, a100nc = a1 and a100 once the category index (pawl.events_category_idx) is dropped;
#                  they run last, after every other script
# SCRIPTS="a100 a100id" picks scripts; CGOUT=DIR keeps each run's callgrind output there
# (callgrind.SCRIPT.s and .l: callgrind_annotate the difference to see where it goes).
# and the instructions per statement are (count at LARGE - count at SMALL) / (LARGE - SMALL), so
# the backend's start and the first executions' planning drop out. fsync off: the commit's
# flush is a system call, outside the counts anyway. Needs valgrind, the PostgreSQL 15 server
# binaries, and pawl_native installed (make native, as root) or PAWL_NATIVE_LIB=/path/to/.so.
# Run as root (the server runs as the postgres user) or as a user that can run initdb.
set -uo pipefail
SMALL=${1:-200}
LARGE=${2:-1200}
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/bench/lib.sh"
PAWL=${PAWL:-$here/build/bin/pawl}
pgbin=${PGBIN:-/usr/lib/postgresql/15/bin}
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)"; exit 1; }
[ -x "$pgbin/postgres" ] || { echo "no PostgreSQL server binaries in $pgbin (PGBIN=...)"; exit 1; }
w=$(mktemp -d)
chmod 755 "$w"
as=()
[ "$(id -u)" = 0 ] && { chown postgres "$w"; as=(runuser -u postgres --); }
stop() { "${as[@]}" "$pgbin/pg_ctl" -D "$w/data" -m "${1:-immediate}" stop >/dev/null 2>&1; }
trap 'stop; rm -rf "$w"' EXIT
"${as[@]}" "$pgbin/initdb" -D "$w/data" -A trust -U postgres >/dev/null || exit 1
"${as[@]}" "$pgbin/pg_ctl" -D "$w/data" -o "-k $w -c listen_addresses='' -c fsync=off" -l "$w/log" -w start >/dev/null || exit 1
dsn="host=$w user=postgres dbname=postgres"
if [ -n "${PAWL_NATIVE_LIB:-}" ]; then
    PAWL_DSN="$dsn" "$PAWL" init --server-path sql >/dev/null || exit 1
    sed "s#\$libdir/pawl_native#$PAWL_NATIVE_LIB#g" "$here/sql/native/activate.sql" |
        psql "$dsn" -Xq -v ON_ERROR_STOP=1 >/dev/null || exit 1
else
    PAWL_DSN="$dsn" "$PAWL" init --server-path native >/dev/null || { echo "native path not available"; exit 1; }
fi
bench_insert_twin "$dsn" || exit 1
psql "$dsn" -Xq -v ON_ERROR_STOP=1 >/dev/null <<'SQL' || exit 1
SELECT count(*) FROM pawl.append(ARRAY(SELECT 'fill-' || g FROM generate_series(1, 20000) g),
    array_fill(0::int8, ARRAY[20000]), ARRAY(SELECT generate_series(1, 20000)),
    array_fill(1, ARRAY[20000]), array_fill('Deposited'::text, ARRAY[20000]),
    array_fill('\x7b7d'::bytea, ARRAY[20000]), NULL, false, NULL);
INSERT INTO bench_insert.events SELECT * FROM pawl.events;
CHECKPOINT;
SQL
stop fast # a clean shutdown: the first single-user backend must not replay WAL
gen() { # SCRIPT COUNT TAG
    case $1 in
    a1 | a1nc) echo "PREPARE p(text) AS SELECT * FROM pawl.append(ARRAY[\$1], '{0}', '{1}', '{1}', '{Deposited}', '{\"\\\\x7b7d\"}', NULL, false, NULL)" ;;
    a1id) echo "PREPARE p(text) AS SELECT * FROM pawl.append(ARRAY[\$1], '{0}', '{1}', '{1}', '{Deposited}', '{\"\\\\x7b7d\"}', NULL, false, ARRAY[\$1 || 'id'])" ;;
    i1) echo "PREPARE p(text) AS INSERT INTO bench_insert.events (xid, stream_seq, k, n, stream_id, type, payload, ticket) VALUES (pg_current_xact_id(), nextval('bench_insert.seq'), 0, 1, \$1, 'Deposited', '\\x7b7d', 1)" ;;
    a100 | a100nc) echo "PREPARE p(text) AS SELECT * FROM pawl.append(ARRAY(SELECT \$1 || g FROM generate_series(1, 100) g), array_fill(0::int8, ARRAY[100]), ARRAY(SELECT generate_series(1, 100)), array_fill(1, ARRAY[100]), array_fill('Deposited'::text, ARRAY[100]), array_fill('\\x7b7d'::bytea, ARRAY[100]), NULL, false, NULL)" ;;
    a100id) echo "PREPARE p(text) AS SELECT * FROM pawl.append(ARRAY(SELECT \$1 || g FROM generate_series(1, 100) g), array_fill(0::int8, ARRAY[100]), ARRAY(SELECT generate_series(1, 100)), array_fill(1, ARRAY[100]), array_fill('Deposited'::text, ARRAY[100]), array_fill('\\x7b7d'::bytea, ARRAY[100]), NULL, false, ARRAY(SELECT \$1 || g || 'id' FROM generate_series(1, 100) g))" ;;
    i100) echo "PREPARE p(text) AS INSERT INTO bench_insert.events (xid, stream_seq, k, n, stream_id, type, payload, ticket, cat_run) SELECT pg_current_xact_id(), nextval('bench_insert.seq'), g - 1, 100, \$1 || g, 'Deposited', '\\x7b7d', CASE WHEN g = 1 THEN 1 END, CASE WHEN g = 1 THEN 100 ELSE 0 END FROM generate_series(1, 100) g" ;;
    esac
    for i in $(seq 1 "$2"); do echo "EXECUTE p('$1-$3-$i-')"; done
}
count() { # SCRIPT COUNT TAG: instructions of a single-user backend running it
    gen "$@" >"$w/$1.$3.sql"
    "${as[@]}" valgrind --tool=callgrind --callgrind-out-file="$w/cg.out" "$pgbin/postgres" --single \
        -D "$w/data" -c fsync=off postgres <"$w/$1.$3.sql" >"$w/$1.$3.log" 2>&1
    grep -qi "error" "$w/$1.$3.log" && { grep -i -m3 "error" "$w/$1.$3.log" >&2; echo nan; return; }
    [ -n "${CGOUT:-}" ] && cp "$w/cg.out" "$CGOUT/callgrind.$1.$3"
    grep -o "Collected : [0-9]*" "$w/$1.$3.log" | awk '{ print $3 }'
}
echo "# bench/native_append_instr.sh $SMALL $LARGE: $(date -u '+%Y-%m-%d %H:%M UTC'), PostgreSQL $("$pgbin/postgres" --version | awk '{ print $3 }'), callgrind instructions"
printf '%-6s %14s %14s %14s %12s\n' script "at_$SMALL" "at_$LARGE" per_statement per_event
declare -A per
dropped=0
for s in ${SCRIPTS:-a1 i1 a100 i100 a1id a100id a1nc a100nc}; do
    if [ "$dropped" = 0 ] && [[ $s == *nc ]]; then
        echo "DROP INDEX pawl.events_category_idx" |
            "${as[@]}" "$pgbin/postgres" --single -D "$w/data" -c fsync=off postgres >"$w/drop.log" 2>&1
        grep -qi "error" "$w/drop.log" && { grep -i -m3 "error" "$w/drop.log" >&2; exit 1; }
        dropped=1
    fi
    lo=$(count $s "$SMALL" s)
    hi=$(count $s "$LARGE" l)
    per[$s]=$(awk -v a="$lo" -v b="$hi" -v n=$((LARGE - SMALL)) 'BEGIN { printf "%.0f", (b - a) / n }')
    ev=${s#?}
    ev=${ev%id}
    ev=${ev%nc}
    printf '%-6s %14s %14s %14s %12.0f\n' "$s" "$lo" "$hi" "${per[$s]}" "$(awk -v p="${per[$s]}" -v e="$ev" 'BEGIN { print p / e }')"
done
r() { [ -n "${per[$1]:-}" ] && [ -n "${per[$2]:-}" ] && awk -v a="${per[$1]}" -v b="${per[$2]}" -v t="$3" 'BEGIN { printf "%s: %.3f\n", t, a / b }'; }
r a1 i1 "1-event append / INSERT"
r a100 i100 "100-event append / INSERT"
r a1id a1 "1-event append with an id / without"
r a100id a100 "100-event append with ids / without"
r a1 a1nc "1-event append with the category index / without"
r a100 a100nc "100-event append with the category index / without"
