#!/usr/bin/env bash
# standby.sh — reading from a streaming standby against reading from the primary, in one run,
# on the private cluster and its standby (tools/pawl-pg standby start; made if missing and
# removed afterwards if this run made it):
#
#   catch-up   per source (primary, standby) and per count K (1, 2, 4): K processors (K distinct
#              processors, each reading the whole log, 8 segments, --handler count, batch 1000)
#              start at token 0 over a log of --events events, while one appender appends on the
#              primary as fast as it can (4 connections, 10-event appends). Reported: the
#              processors' aggregate catch-up rate (K x the log's size at the start / the time
#              until every segment of every one of them reached it) and the appender's rate
#              meanwhile (finalized events / the same time).
#   latency    bench_e2e latency at --rate events/s: append commit -> handler call, reading from
#              the primary, from the standby with LISTEN wake-ups on the primary, and from the
#              standby polling it (--read-wake poll).
#
#   bench/standby.sh [--events N] [--rate R] [--seconds S] [--csv FILE]
#
# Rows go to FILE (default bench/results/standby.csv): kind,source,count,events,seconds,
# events_per_s,append_events_per_s (catch-up) and bench_e2e's latency rows (latency.csv format)
# to FILE with .csv replaced by _latency.csv.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
bin=${PAWL_BIN:-$root/build/bin}
PG=$root/tools/pawl-pg
events=100000
rate=10000
seconds=10
csv=$root/bench/results/standby.csv
while [ $# -gt 0 ]; do
    case "$1" in
        --events) events=$2; shift ;;
        --rate) rate=$2; shift ;;
        --seconds) seconds=$2; shift ;;
        --csv) csv=$2; shift ;;
        *) echo "usage: bench/standby.sh [--events N] [--rate R] [--seconds S] [--csv FILE]" >&2; exit 2 ;;
    esac
    shift
done
export PAWL_PG_KEY=${PAWL_PG_KEY:-$root}
"$PG" start
made=0
if ! "$PG" standby status >/dev/null 2>&1; then made=1; "$PG" standby start; fi
db=pawl_bench_standby
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    psql "$("$PG" dsn)" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
    if [ $made = 1 ]; then "$PG" standby remove; fi
}
trap cleanup EXIT
psql "$("$PG" dsn)" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
psql "$("$PG" dsn)" -qAtc "CREATE DATABASE $db" >/dev/null
P="$("$PG" dsn) dbname=$db"
S="$("$PG" standby dsn) dbname=$db"
export PAWL_DSN=$P PAWL_LOG_LEVEL=warn
q() { psql "$P" -qAtX -c "$1"; }
qs() { psql "$S" -qAtX -c "$1"; }
now() { date +%s.%N; }
"$bin/pawl" init >/dev/null
echo "filling the log with $events events" >&2
"$bin/pawl" append --generate --count "$events" --rate 0 --appenders 4 --events-per-append 100 \
    --streams 1000 --progress off >/dev/null 2>&1
for i in $(seq 1 600); do
    [ "$(qs "SELECT pawl_api.last_index()" 2>/dev/null || echo 0)" -ge "$events" ] && break
    sleep 0.1
done
[ -f "$csv" ] || echo "kind,source,count,events,seconds,events_per_s,append_events_per_s" >"$csv"

cell=0
for src in primary standby; do
    for k in 1 2 4; do
        cell=$((cell + 1))
        q "CHECKPOINT" >/dev/null
        "$bin/pawl" append --generate --rate 0 --duration 10m --appenders 4 --events-per-append 10 \
            --streams 1000 --progress off >/dev/null 2>&1 &
        app=$!
        pids=("$app")
        sleep 1
        head0=$(q "SELECT pawl_api.last_index()")
        t0=$(now)
        extra=()
        [ $src = standby ] && extra=(--read-dsn "$S" --read-max-lag 10s)
        names=()
        for i in $(seq 1 "$k"); do
            name=c$cell-$i
            names+=("'$name'")
            "$bin/pawl" run --processor "$name" --handler count --segments 8 --batch-size 1000 \
                --progress off "${extra[@]}" >/dev/null 2>"/tmp/standby-bench-$name.err" &
            pids+=($!)
        done
        list=$(IFS=,; echo "${names[*]}")
        for i in $(seq 1 3000); do
            n=$(q "SELECT count(*) FROM pawl.tokens WHERE processor IN ($list) AND token >= $head0")
            [ "$n" -ge $((8 * k)) ] && break
            sleep 0.1
        done
        t1=$(now)
        head1=$(q "SELECT pawl_api.last_index()")
        for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
        wait 2>/dev/null || true
        pids=()
        fb=$(cat /tmp/standby-bench-c$cell-*.err | grep -c "reading from the primary until" || true)
        rm -f /tmp/standby-bench-c$cell-*.err
        line=$(awk -v s=$src -v k=$k -v h0=$head0 -v h1=$head1 -v a=$t0 -v b=$t1 'BEGIN {
            d = b - a; printf "catchup,%s,%d,%d,%.2f,%.0f,%.0f", s, k, k * h0, d, k * h0 / d, (h1 - h0) / d }')
        echo "$line" >>"$csv"
        echo "$line (fallback episodes: $fb)" >&2
    done
done

lat=${csv%.csv}_latency.csv
for mode in primary listen poll; do
    args=()
    [ $mode != primary ] && args=(--read-dsn "$S" --read-wake "$mode")
    "$bin/bench_e2e" latency --dsn "$P" --csv "$lat" --rates "$rate" --seconds "$seconds" "${args[@]}"
done
tail -6 "$lat" >&2
