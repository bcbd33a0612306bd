#!/usr/bin/env bash
# run.sh — every benchmark users choose a system by, in one run on one PostgreSQL: pawl's end
# to end latency, processing throughput against the table's read ceiling, cost as the log
# grows, pawl's append in the peers' workload shape, the two baseline designs and the two peers.
#
#   bench/run.sh [--quick | --tiny] [--long] [--no-peers] [--no-baselines] [--dsn DSN] [--out DIR]
#
#   (default)  the full run: logs of 1M and 5M events, 10 s latency cells, 6 s catch-up cells;
#              about 15 minutes on a 2-core machine
#   --quick    the same benchmarks at small sizes and short cells (about 2 minutes)
#   --tiny     a smoke run for tests (seconds; no peers, no baselines unless asked for)
#   --long     also grow the log to 20M events and measure there (adds ~6 minutes of fill)
#   --dsn      the server to use (its dbname is replaced: the run creates and drops database
#              pawl_bench_run); default $PAWL_DSN, else the user's private PostgreSQL
#   --out      where CSVs, plots and SUMMARY.md go; default bench/results
#
# Needs the built programs in $PAWL_BIN (default build/bin): bench_e2e, bench_baselines. The
# peers' set-up (bench/peers/setup.sh) installs their pinned npm packages on first use.
# Output: latency.csv, catchup.csv, growth.csv, append.csv (pawl's rows), pawl_peerfmt.csv
# (pawl's rows in the peers' format), baselines.csv, peers.csv, one PNG per benchmark, run.meta
# and SUMMARY.md (every table, the ratios and the targets).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
die() { echo "run.sh: $*" >&2; exit 1; }
. "$here/lib.sh"
command_line=$(bench_command_line "$root" bench/run.sh "$@")

mode=full
long=0
peers=1
baselines=1
dsn=${PAWL_DSN:-}
out=$root/bench/results
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) mode=quick ;;
        --tiny) mode=tiny; peers=0; baselines=0 ;;
        --long) long=1 ;;
        --no-peers) peers=0 ;;
        --no-baselines) baselines=0 ;;
        --peers) peers=1 ;;
        --baselines) baselines=1 ;;
        --dsn) [ $# -ge 2 ] || die "--dsn needs a value"; dsn=$2; shift ;;
        --out) [ $# -ge 2 ] || die "--out needs a value"; out=$2; shift ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) die "unknown argument $1" ;;
    esac
    shift
done
bin=${PAWL_BIN:-$root/build/bin}
[ -x "$bin/bench_e2e" ] || die "$bin/bench_e2e not found: build first (cmake --build build)"
if [ -z "$dsn" ]; then
    (cd "$root" && tools/pawl-pg status >/dev/null 2>&1) || (cd "$root" && tools/pawl-pg start)
    dsn=$(cd "$root" && tools/pawl-pg dsn)
fi
command -v psql >/dev/null || die "psql not found (postgresql-client-15)"
mkdir -p "$out"

case $mode in
    full)  lat_s=10; rates=1000,10000,50000; live_rates=100,1000; warm=1.5; sizes="1000000 5000000"; grow_s=5; cu_s=5; cu_segs=1,4,16; cu_workers=1,2
           app_s=8; live_s=10; fill_conns=2 ;;
    quick) lat_s=1.5; rates=1000,10000,50000; live_rates=200; warm=1; sizes="100000 300000"; grow_s=1.5; cu_s=1.5; cu_segs=1,16; cu_workers=2
           app_s=1; live_s=2; fill_conns=2 ;;
    tiny)  lat_s=0.5; rates=10000; live_rates=100; warm=0.3; sizes="2000 5000"; grow_s=0.3; cu_s=0.3; cu_segs=1,4; cu_workers=1
           app_s=0.3; live_s=0.5; fill_conns=1 ;;
esac
if [ $long = 1 ]; then sizes="$sizes 20000000"; fi

db=pawl_bench_run_$$
bdsn="$dsn dbname=$db"
psql "$dsn" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
psql "$dsn" -qAtc "CREATE DATABASE $db" >/dev/null
trap 'psql "$dsn" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true' EXIT

start=$(date +%s)
date_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for f in latency catchup growth append; do rm -f "$out/$f.csv"; done
step() { echo "run.sh: [$(( $(date +%s) - start )) s] $*" >&2; }
e2e() { "$bin/bench_e2e" "$@" --dsn "$bdsn"; }

# 1. End-to-end latency on a fresh log: the issue's rates (10-event appends), then the peers'
#    live workload shape (1-event appends at the rates bench/peers/run.sh offers the peers).
step "latency"
e2e latency --csv "$out/latency.csv" --seconds $lat_s --rates $rates --per-append 10 --warmup $warm
e2e latency --csv "$out/latency.csv" --seconds $live_s --rates $live_rates --per-append 1 \
    --warmup $warm

# 2. Append in the peers' shape: 1 and 8 blocking writers, 1- and 100-event appends.
step "append (peers' workload shape)"
e2e append --csv "$out/append.csv" --seconds $app_s --workers 1,8 --rates 1,100

# 3. Cost as the log grows, and catch-up over the largest log of the standard sizes.
cu_at=$(echo $sizes | tr ' ' '\n' | awk '$1 <= 5000000' | tail -1)
for n in $sizes; do
    step "fill to $n events"
    e2e fill --csv "$out/growth.csv" --to "$n" --conns $fill_conns
    step "growth at $n events"
    e2e growth --csv "$out/growth.csv" --seconds $grow_s
    if [ "$n" = "$cu_at" ]; then
        step "catch-up over $n events"
        e2e catchup --csv "$out/catchup.csv" --seconds $cu_s --segments $cu_segs \
            --workers $cu_workers --batches 100,1000
    fi
done
psql "$dsn" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true

# 4. The baseline designs and the peers, on the same server in the same run.
qflag=
if [ $mode != full ]; then qflag=--quick; fi
if [ $baselines = 1 ]; then
    step "baselines"
    PAWL_BIN=$bin "$root/bench/baselines/run.sh" $qflag --dsn "$dsn" --out "$out/baselines.csv" >/dev/null
fi
if [ $peers = 1 ] && ! . "$root/bench/peers/node.sh"; then
    echo "run.sh: no Node.js >= 20 (see above): the peers are skipped" >&2
    peers=0
    peers_note="skipped: no Node.js >= 20"
fi
if [ $peers = 1 ]; then
    step "peers"
    "$root/bench/peers/run.sh" $qflag --dsn "$dsn" --out "$out/peers.csv" >/dev/null
fi

load_end=$(cut -d' ' -f1-3 /proc/loadavg)
elapsed=$(( $(date +%s) - start ))
{
    echo "date: $date_utc"
    echo "command: $command_line"
    echo "mode: $mode (log sizes: $sizes)"
    echo "elapsed_s: $elapsed"
    echo "cpus: $(nproc)"
    echo "cpu_model: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
    echo "memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
    echo "kernel: $(uname -sr)"
    echo "postgresql: $(psql "$dsn" -Atqc 'show server_version' 2>/dev/null || echo unknown)"
    echo "postgresql_settings: $(psql "$dsn" -Atqc "select string_agg(name || '=' || setting || coalesce(unit, ''), ', ' order by name) from pg_settings where name in ('shared_buffers','synchronous_commit','fsync','max_wal_size','wal_level')" 2>/dev/null)"
    echo "load_start: $load_start"
    echo "load_end: $load_end"
    [ -z "${peers_note:-}" ] || echo "peers: $peers_note"
} >"$out/run.meta"

step "plots and SUMMARY.md"
"$here/report.sh" "$out"
step "done in $(( $(date +%s) - start )) s: $out/SUMMARY.md"
