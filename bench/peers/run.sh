#!/usr/bin/env bash
# run.sh — every peer workload against one PostgreSQL, as CSV.
#
#   bench/peers/run.sh [--quick] [--dsn DSN] [--out FILE]
#
#   --quick   short runs (about 30 s in all); default: the full run (a few minutes)
#   --dsn     the server (its dbname is ignored); default $PAWL_DSN, else the user's private
#             PostgreSQL (started if it is not running)
#   --out     the CSV file; default bench/results/peers.csv. A description of the run (date,
#             machine, versions, command) goes next to it as <FILE without .csv>.meta.
#
# Runs setup.sh first (idempotent). Progress goes to stderr; rows are also echoed as they come.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
die() { echo "run.sh: $*" >&2; exit 1; }
. "$here/node.sh" || die "Node.js >= 20 is required"
. "$here/../lib.sh"
command_line=$(bench_command_line "$root" bench/peers/run.sh "$@")

quick=0
dsn=${PAWL_DSN:-}
out=$root/bench/results/peers.csv
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --dsn) [ $# -ge 2 ] || die "--dsn needs a value"; dsn=$2; shift ;;
        --out) [ $# -ge 2 ] || die "--out needs a value"; out=$2; shift ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) die "unknown argument $1" ;;
    esac
    shift
done
if [ -z "$dsn" ]; then
    (cd "$root" && tools/pawl-pg status >/dev/null) || (cd "$root" && tools/pawl-pg start)
    dsn=$(cd "$root" && tools/pawl-pg dsn)
fi

"$here/setup.sh" "$dsn" >&2

if [ $quick = 1 ]; then
    append_s=1; catchup_n=5000; catchup_s=2; live_rates="200"; live_s=2; live_w=4; tuned=0
else
    append_s=8; catchup_n=100000; catchup_s=20; live_rates="100 1000"; live_s=10; live_w=8; tuned=1
fi

mkdir -p "$(dirname "$out")"
tmp=$out.tmp
echo "system,workload,writers,events_per_append,events,seconds,events_per_s,p50_ms,p99_ms,p999_ms,max_ms" >"$tmp"

notes=$out.notes.tmp
: >"$notes"
row() {
    echo "run.sh: $*" >&2
    local line
    local rc=0
    line=$(node "$here/bench.mjs" --dsn "$dsn" "$@" 2>"$notes.row") || rc=$?
    cat "$notes.row" >&2
    cat "$notes.row" >>"$notes"
    [ $rc = 0 ] || die "workload failed: $*"
    echo "$line" | tee -a "$tmp"
}

start=$(date +%s)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
# The peers run back to back for each workload, so that the rows being compared saw the same
# machine (other work on a shared machine drifts over minutes).
systems="message-db emmett"
for writers in 1 8; do
    for batch in 1 100; do
        for system in $systems; do
            row --system $system --workload append --writers $writers --batch $batch \
                --seconds $append_s
        done
    done
done
for system in $systems; do
    row --system $system --workload catchup --events $catchup_n --seconds $catchup_s
done
# message-db's consumer only sleeps after an empty read, so a tuned catch-up would measure the
# same thing again; Emmett's sleeps after every batch.
if [ $tuned = 1 ]; then
    row --system emmett --workload catchup --events $catchup_n --seconds $catchup_s --tuned
fi
for rate in $live_rates; do
    for system in $systems; do
        row --system $system --workload live --rate "$rate" --seconds $live_s --writers $live_w
    done
done
mv "$tmp" "$out"

meta=${out%.csv}.meta
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "command: $command_line"
    echo "elapsed_s: $(( $(date +%s) - start ))"
    echo "machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)," \
        "$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
    echo "kernel: $(uname -r)"
    echo "load average (1/5/15 min) at start: $load_start, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "postgresql: $(psql "$dsn" -Atqc 'show server_version' 2>/dev/null || echo unknown)"
    echo "node: $(node --version)"
    echo "emmett-postgresql: $(node -p "require('$here/node_modules/@event-driven-io/emmett-postgresql/package.json').version")"
    echo "message-db (npm): $(node -p "require('$here/node_modules/@eventide/message-db/package.json').version")," \
        "schema $(cat "$here/node_modules/@eventide/message-db/database/VERSION.txt")"
    echo "pg (node-postgres): $(node -p "require('$here/node_modules/pg/package.json').version")"
    grep '^NOTE: ' "$notes" | sed 's/^NOTE: /note: /' || true
} >"$meta"
rm -f "$notes" "$notes.row"
echo "run.sh: wrote $out and $meta in $(( $(date +%s) - start )) s" >&2
