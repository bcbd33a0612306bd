#!/usr/bin/env bash
# backlog.sh [APPENDS] [ROUNDS]: one finalization run over a large backlog, on each server path.
# Per round and path (native, sql): a fresh database of the private PostgreSQL (`pawl init
# --server-path`), APPENDS (default 100000) committed one-event appends with no finalizer
# running (pgbench, 2 clients, each append its own transaction, to 1000 streams), then one
# `SELECT * FROM pawl.finalize()` timed by the server (clock_timestamp() around it, in the same
# session) and checked: it must report every append and the last index APPENDS, and a second
# call must find nothing. Prints each run's time and the median per path.
set -uo pipefail
N=${1:-100000}
ROUNDS=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
PAWL=${PAWL:-$here/build/bin/pawl}
B=$("$here/tools/pawl-pg" dsn) || exit 1
w=$(mktemp -d)
db=bbl_$$
trap 'rm -rf "$w"; psql "$B" -Xqc "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1' EXIT
printf "\\\\set s random(1, 1000)\nSELECT pawl_api.append('b-' || :s, 'T', '\\\\x0102030405060708');\n" >"$w/app.sql"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(psql "$B" -XqAtc "SELECT version()" | cut -d' ' -f1-2), $(psql "$B" -XqAtc "SELECT 'fsync=' || current_setting('fsync') || ' synchronous_commit=' || current_setting('synchronous_commit')")"
echo "# $N pending one-event appends, then one pawl.finalize(); the run's time as the server measured it"
printf '%-5s %-7s %8s %8s %10s\n' round path appends events run_ms | tee "$w/all"
fail=0
for r in $(seq 1 "$ROUNDS"); do
    for path in native sql; do
        psql "$B" -Xqc "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1
        psql "$B" -Xqc "CREATE DATABASE $db" >/dev/null || exit 1
        if ! PAWL_DSN="$B dbname=$db" "$PAWL" init --server-path $path >/dev/null 2>&1; then
            echo "# $path: pawl init --server-path $path failed (native needs pawl_native: make native)"
            continue
        fi
        PGOPTIONS='-c synchronous_commit=off' pgbench -n -M prepared -c 2 -j 2 -t $((N / 2)) \
            -f "$w/app.sql" "$B dbname=$db" >"$w/load" 2>&1 || { cat "$w/load"; exit 1; }
        pending=$(psql "$B dbname=$db" -XqAtc "SELECT count(*) FROM pawl.events")
        out=$(psql "$B dbname=$db" -XqAt -F ' ' <<'SQL'
CREATE TEMP TABLE t AS SELECT clock_timestamp() AS t0;
SELECT f.appends, f.events, f.last_index,
       round(extract(epoch FROM clock_timestamp() - (SELECT t0 FROM t)) * 1000, 1)
  FROM pawl.finalize() f;
SQL
)
        read -r appends events last ms <<<"$out"
        again=$(psql "$B dbname=$db" -XqAtc "SELECT appends FROM pawl.finalize()")
        if [ "$pending" != "$N" ] || [ "$appends" != "$N" ] || [ "$last" != "$N" ] || [ "$again" != 0 ]; then
            echo "# $path: WRONG: $pending pending, the run took $appends appends up to index $last, the next $again"
            fail=1
        fi
        printf '%-5s %-7s %8s %8s %10s\n' "$r" "$path" "$appends" "$events" "$ms" | tee -a "$w/all"
    done
done
med() { sort -n | awk '{ v[NR] = $1 } END { if (NR) printf "%.1f", v[int((NR + 1) / 2)]; else printf "-" }'; }
for path in native sql; do
    echo "$path: one run over $N pending appends: median $(awk -v p=$path 'NR > 1 && $2 == p { print $5 }' "$w/all" | med) ms ($ROUNDS rounds)"
done
exit $fail
