#!/usr/bin/env bash
# native_finalize.sh [ROUNDS] [SECONDS]: what one finalization run costs the server on each
# server path, side by side. Two fresh databases of the private PostgreSQL, one per path
# (`pawl init --server-path native|sql`); per round and path, `pgbench -n -M prepared -c 1 -T
# SECONDS` of three scripts, alternated:
#   run  = SELECT pawl_api.append(...); SELECT * FROM pawl.finalize();   (a run of one event)
#   app  = SELECT pawl_api.append(...);                                   (subtracted from run)
#   idle = SELECT * FROM pawl.finalize();                                 (nothing to finalize)
# Prints pgbench's latency per transaction and the backend's CPU per transaction, read from
# /proc/PID/schedstat (time on CPU from just after it connected until it exited), then the run's
# own CPU (run - app) and the idle call's, as medians over the rounds. Needs pawl_native
# installed (make native, as root).
set -uo pipefail
ROUNDS=${1:-3}
T=${2:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
PAWL=${PAWL:-$here/build/bin/pawl}
B=$("$here/tools/pawl-pg" dsn) || exit 1
w=$(mktemp -d)
trap 'rm -rf "$w"; for d in bn_$$ bs_$$; do psql "$B" -Xqc "DROP DATABASE IF EXISTS $d" >/dev/null 2>&1; done' EXIT
for d in bn_$$ bs_$$; do psql "$B" -Xqc "CREATE DATABASE $d" >/dev/null || exit 1; done
PAWL_DSN="$B dbname=bn_$$" "$PAWL" init --server-path native >/dev/null 2>&1 || { echo "native path not available"; exit 1; }
PAWL_DSN="$B dbname=bs_$$" "$PAWL" init --server-path sql >/dev/null 2>&1 || exit 1
printf "SELECT pawl_api.append('b', 'T', '\\\\x01');\nSELECT * FROM pawl.finalize();\n" >"$w/run.sql"
printf "SELECT pawl_api.append('b', 'T', '\\\\x01');\n" >"$w/app.sql"
printf "SELECT * FROM pawl.finalize();\n" >"$w/idle.sql"
one() { # DB SCRIPT: "latency_us cpu_us_per_txn txns"
    local db=$1 s=$2 pid="" c0 last t i
    pgbench -n -M prepared -c 1 -T "$T" -f "$w/$s.sql" "$B dbname=$db application_name=nf_$db" >"$w/out" 2>&1 &
    local pg=$!
    for ((i = 0; i < 200 && ${#pid} == 0; i++)); do
        pid=$(psql "$B dbname=$db" -XqAtc "SELECT pid FROM pg_stat_activity WHERE application_name = 'nf_$db'")
    done
    c0=$(cut -d' ' -f1 /proc/$pid/schedstat 2>/dev/null)
    # A backend that ended before its first reading gives no figure (left out of the medians).
    [ -n "$c0" ] || { wait $pg; echo "nan nan 0"; return; }
    last=$c0
    while t=$(cut -d' ' -f1 /proc/$pid/schedstat 2>/dev/null) && [ -n "$t" ]; do last=$t; sleep 0.05; done
    wait $pg
    awk -v c="$((last - c0))" '/latency average/ { l = $4 } /actually processed/ { n = $NF }
        END { printf "%8.1f %8.1f %7d", l * 1000, c / 1000 / n, n }' "$w/out"
}
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(psql "$B" -XqAtc "SELECT 'fsync=' || current_setting('fsync') || ' synchronous_commit=' || current_setting('synchronous_commit')")"
printf '%-5s %-7s %-5s %8s %8s %7s\n' round path script wall_us cpu_us txns | tee "$w/all"
for r in $(seq 1 "$ROUNDS"); do
    for db in bn_$$ bs_$$; do
        path=native; [ $db = bs_$$ ] && path=sql
        for s in run app idle; do
            printf '%-5s %-7s %-5s %s\n' "$r" "$path" "$s" "$(one $db $s)"
        done
    done
done | tee -a "$w/all"
med() { grep -E '^-?[0-9.]+$' | sort -n | awk '{ v[NR] = $1 } END { printf "%.1f", v[int((NR + 1) / 2)] }'; }
for path in native sql; do
    run=$(awk -v p=$path '$5 == "nan" { next } $2 == p && $3 == "run" { r[$1] = $5 }
                          $2 == p && $3 == "app" { a[$1] = $5 }
                          END { for (k in r) if (k in a) print r[k] - a[k] }' "$w/all" | med)
    idle=$(awk -v p=$path '$2 == p && $3 == "idle" { print $5 }' "$w/all" | med)
    echo "$path: a run of one event (run - app) median $run us of backend CPU; an idle call $idle us ($ROUNDS rounds)"
done
