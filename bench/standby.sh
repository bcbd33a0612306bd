#!/usr/bin/env bash
# standby.sh — reading from a streaming standby against reading from the primary, in one run,
# on the private cluster and its standby (tools/pawl-pg standby start; made if missing and
# removed afterwards if this run made it):
#
#   catch-up   per count K (1, 2, 4) and per source (primary, standby), the two sources of a
#              count next to each other (their order swapped every round), --rounds times: K
#              processors (K distinct new processors, 8 segments, --handler count, batch 1000)
#              start at token 0 and read the first --events events (the same fixed stretch of
#              the log in every cell), while one appender appends on the primary as fast as it
#              can (4 connections, 10-event appends). Reported per cell: the processors'
#              aggregate catch-up rate (K x --events / the time until every segment of every
#              one of them reached index --events) and the appender's rate meanwhile (finalized
#              events / the same time); per K: the median and the range of the rounds' ratios
#              standby / primary. (Until 2026-12-05 the cells ran all primary, then all standby,
#              each over the whole log so far, which grew between them: the ratio tracked the
#              log's size.)
#   latency    bench_e2e latency at --rate events/s: append commit -> handler call, reading from
#              the primary, from the standby with LISTEN wake-ups on the primary, and from the
#              standby polling it (--read-wake poll).
#
#   bench/standby.sh [--events N] [--rounds R] [--rate R] [--seconds S] [--csv FILE]
#
# Rows go to FILE (default bench/results/standby.csv): kind,source,count,events,seconds,
# events_per_s,append_events_per_s,round (catch-up) and bench_e2e's latency rows (latency.csv format)
# to FILE with .csv replaced by _latency.csv.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
bin=${PAWL_BIN:-$root/build/bin}
PG=$root/tools/pawl-pg
events=100000
rate=10000
seconds=10
rounds=3
csv=$root/bench/results/standby.csv
while [ $# -gt 0 ]; do
    case "$1" in
        --events) events=$2; shift ;;
        --rounds) rounds=$2; shift ;;
        --rate) rate=$2; shift ;;
        --seconds) seconds=$2; shift ;;
        --csv) csv=$2; shift ;;
        *) echo "usage: bench/standby.sh [--events N] [--rounds R] [--rate R] [--seconds S] [--csv FILE]" >&2; exit 2 ;;
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
# Each run writes its files afresh (they are this run's, not a history: that is git's).
echo "kind,source,count,events,seconds,events_per_s,append_events_per_s,round" >"$csv"
rm -f "${csv%.csv}_latency.csv"
ratios=$(mktemp)
trap 'cleanup; rm -f "$ratios"' EXIT

cell=0
for r in $(seq 1 "$rounds"); do
    for k in 1 2 4; do
        order="primary standby"
        [ $((r % 2)) = 0 ] && order="standby primary"
        declare -A rate_of=()
        for src in $order; do
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
                name=c$$-$cell-$i
                names+=("'$name'")
                "$bin/pawl" run "$name" --handler count --segments 8 --batch-size 1000 \
                    --progress off "${extra[@]}" >/dev/null 2>"/tmp/standby-bench-$name.err" &
                pids+=($!)
            done
            list=$(IFS=,; echo "${names[*]}")
            for i in $(seq 1 3000); do
                n=$(q "SELECT count(*) FROM pawl.tokens WHERE processor IN ($list) AND token >= $events")
                [ "$n" -ge $((8 * k)) ] && break
                sleep 0.1
            done
            t1=$(now)
            head1=$(q "SELECT pawl_api.last_index()")
            for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
            wait 2>/dev/null || true
            pids=()
            fb=$(cat /tmp/standby-bench-c$$-$cell-*.err | grep -c "reading from the primary until" || true)
            rm -f /tmp/standby-bench-c$$-$cell-*.err
            line=$(awk -v s=$src -v k=$k -v e=$events -v h0=$head0 -v h1=$head1 -v a=$t0 -v b=$t1 -v r=$r 'BEGIN {
                d = b - a; printf "catchup,%s,%d,%d,%.2f,%.0f,%.0f,%d", s, k, k * e, d, k * e / d, (h1 - h0) / d, r }')
            echo "$line" >>"$csv"
            echo "$line (fallback episodes: $fb)" >&2
            rate_of[$src]=$(cut -d, -f6 <<<"$line")
        done
        awk -v k=$k -v p="${rate_of[primary]}" -v s="${rate_of[standby]}" 'BEGIN { if (p > 0) printf "%d %.3f\n", k, s / p }' >>"$ratios"
    done
done
for k in 1 2 4; do
    awk -v k=$k '$1 == k { print $2 }' "$ratios" | sort -n | awk -v k=$k -v r="$rounds" '{ v[NR] = $1 }
        END { if (NR) printf "catch-up, %d processor(s): standby / primary %.2f (median of %d rounds; range %.2f-%.2f)\n", k, NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, NR, v[1], v[NR] }' >&2
done

lat=${csv%.csv}_latency.csv
for mode in primary listen poll; do
    args=()
    [ $mode != primary ] && args=(--read-dsn "$S" --read-wake "$mode")
    "$bin/bench_e2e" latency --dsn "$P" --csv "$lat" --rates "$rate" --seconds "$seconds" "${args[@]}"
done
tail -6 "$lat" >&2
