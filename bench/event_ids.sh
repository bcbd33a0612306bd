#!/usr/bin/env bash
# event_ids.sh [ROUNDS] [SECONDS]: what event ids cost an append on the server, side by side in
# one database of the private PostgreSQL. Per round, for appends of 1 and of 100 events (one
# stream each, picked from 1000), `pgbench -n -M prepared -c 1 -T SECONDS` of three statements,
# alternated:
#   before = the append function of schema 14 (sql/012_append_in_order.sql, installed under
#            another name), which knows no ids;
#   none   = today's pawl.append without ids (what every append without ids runs);
#   ids    = today's pawl.append with an id per event (new ids each time: the look-up finds none,
#            the ids are stored and indexed).
# Every statement builds the same arrays (the ids too, passed only by `ids`), so the difference
# is the function's. Prints pgbench's latency and the backend's CPU per event, read from
# /proc/PID/schedstat, then medians over the rounds and the ratios none/before and ids/none.
set -uo pipefail
ROUNDS=${1:-3}
T=${2:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
PAWL=${PAWL:-$here/build/bin/pawl}
B=$("$here/tools/pawl-pg" dsn) || exit 1
db=bid_$$
w=$(mktemp -d)
trap 'rm -rf "$w"; psql "$B" -Xqc "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1' EXIT
psql "$B" -Xqc "CREATE DATABASE $db" >/dev/null || exit 1
# The server path: PAWL_NATIVE_LIB=/path/pawl_native.so uses a build where it is (the SQL path,
# then activate.sql with its path for $libdir's; a superuser login); otherwise pawl init's choice
# (native when pawl_native is installed).
if [ -n "${PAWL_NATIVE_LIB:-}" ]; then
    PAWL_DSN="$B dbname=$db" "$PAWL" init --server-path sql >/dev/null 2>&1 || { echo "pawl init failed"; exit 1; }
    sed "s#\$libdir/pawl_native#$PAWL_NATIVE_LIB#g" "$here/sql/native/activate.sql" |
        psql "$B dbname=$db" -Xq -v ON_ERROR_STOP=1 >/dev/null || exit 1
else
    PAWL_DSN="$B dbname=$db" "$PAWL" init >/dev/null 2>&1 || { echo "pawl init failed"; exit 1; }
fi
path=$(psql "$B dbname=$db" -XqAtc "SELECT CASE l.lanname WHEN 'c' THEN 'native' ELSE 'sql' END
    FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
   WHERE p.oid = 'pawl.append(text[], int8[], int4[], int4[], text[], bytea[], jsonb[], bool, text[])'::regprocedure")
awk '/CREATE OR REPLACE FUNCTION pawl.append\(/,/^\$fn\$;/' "$here/sql/012_append_in_order.sql" |
    sed 's/FUNCTION pawl\.append(/FUNCTION public.bench_append_v14(/' >"$w/v14.sql"
psql "$B dbname=$db" -Xq -v ON_ERROR_STOP=1 -f "$w/v14.sql" >/dev/null || exit 1
for n in 1 100; do
    arrays="SELECT array_fill(1, ARRAY[$n]) AS si, ARRAY(SELECT generate_series(1, $n)) AS rk,
       array_fill('T'::text, ARRAY[$n]) AS ty, array_fill('\\x0102030405060708'::bytea, ARRAY[$n]) AS pl,
       ARRAY(SELECT (:r)::int8::text || '.' || g FROM generate_series(1, $n) g) AS ids"
    printf '\\set r random(1, 1000000000000)\nSELECT a.appended, cardinality(x.ids) FROM (%s) x, public.bench_append_v14(ARRAY['"'"'b'"'"' || ((:r)::int8 %% 1000)], ARRAY[0::int8], x.si, x.rk, x.ty, x.pl, NULL, false) a;\n' "$arrays" >"$w/before$n.sql"
    for u in none ids; do
        ids=NULL; [ $u = ids ] && ids=x.ids
        printf '\\set r random(1, 1000000000000)\nSELECT a.appended, cardinality(x.ids) FROM (%s) x, pawl.append(ARRAY['"'"'b'"'"' || ((:r)::int8 %% 1000)], ARRAY[0::int8], x.si, x.rk, x.ty, x.pl, NULL, false, %s) a;\n' "$arrays" "$ids" >"$w/$u$n.sql"
    done
done
one() { # SCRIPT EVENTS: "latency_us cpu_us_per_event txns"
    local s=$1 n=$2 pid="" c0 last t i
    pgbench -n -M prepared -c 1 -T "$T" -f "$w/$s.sql" "$B dbname=$db application_name=bid_$$" >"$w/out" 2>&1 &
    local pg=$!
    for ((i = 0; i < 200 && ${#pid} == 0; i++)); do
        pid=$(psql "$B dbname=$db" -XqAtc "SELECT pid FROM pg_stat_activity WHERE application_name = 'bid_$$'")
    done
    [ -n "$pid" ] || { wait $pg; echo "0 0 0"; return; }
    c0=$(cut -d' ' -f1 /proc/$pid/schedstat 2>/dev/null)
    # A backend that ended before its first reading gives no figure (left out of the medians).
    [ -n "$c0" ] || { wait $pg; echo "nan nan 0"; return; }
    last=$c0
    while t=$(cut -d' ' -f1 /proc/$pid/schedstat 2>/dev/null) && [ -n "$t" ]; do last=$t; sleep 0.02; done
    wait $pg
    grep -q "actually processed" "$w/out" || { sed 's/^/# /' "$w/out" >&2; echo "0 0 0"; return; }
    awk -v c="$((last - c0))" -v n="$n" '/latency average/ { l = $4 } /actually processed/ { k = $NF }
        END { printf "%8.1f %8.2f %7d", l * 1000, c / 1000 / k / n, k }' "$w/out"
}
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $path server path, $(psql "$B" -XqAtc "SELECT 'fsync=' || current_setting('fsync') || ' synchronous_commit=' || current_setting('synchronous_commit')")"
printf '%-5s %-6s %-7s %8s %9s %7s\n' round events variant wall_us cpu_us_ev txns | tee "$w/all"
for r in $(seq 1 "$ROUNDS"); do
    for n in 1 100; do
        for v in before none ids; do
            printf '%-5s %-6s %-7s %s\n' "$r" "$n" "$v" "$(one "$v$n" "$n")"
        done
    done
done | tee -a "$w/all"
med() { grep -E '^-?[0-9.]+$' | sort -n | awk '{ v[NR] = $1 } END { printf "%.2f", v[int((NR + 1) / 2)] }'; }
# Ratios per round (the three cells of a round ran next to each other), then their median: a
# shared machine's drift between rounds cancels out of each round's ratio.
for n in 1 100; do
    b=$(awk -v n=$n '$2 == n && $3 == "before" { print $5 }' "$w/all" | med)
    o=$(awk -v n=$n '$2 == n && $3 == "none" { print $5 }' "$w/all" | med)
    i=$(awk -v n=$n '$2 == n && $3 == "ids" { print $5 }' "$w/all" | med)
    ob=$(awk -v n=$n '$5 == "nan" { next } $2 == n { v[$1 " " $3] = $5 }
        END { for (k in v) { split(k, a, " "); if (a[2] == "none" && v[a[1] " before"] > 0) print v[k] / v[a[1] " before"] } }' "$w/all" | med)
    io=$(awk -v n=$n '$5 == "nan" { next } $2 == n { v[$1 " " $3] = $5 }
        END { for (k in v) { split(k, a, " "); if (a[2] == "ids" && v[a[1] " none"] > 0) print v[k] / v[a[1] " none"] } }' "$w/all" | med)
    printf '%3d-event appends: backend CPU per event, medians of %d rounds: before %s us, none %s us, ids %s us; median of the rounds'"'"' ratios: none/before %s, ids/none %s\n' \
        "$n" "$ROUNDS" "$b" "$o" "$i" "$ob" "$io"
done
