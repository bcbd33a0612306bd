#!/usr/bin/env bash
# run.sh — the append workload against the baseline designs, as CSV.
#
#   bench/baselines/run.sh [--quick] [--dsn DSN] [--out FILE] [-- extra bench_baselines flags]
#
#   --quick   2 s runs at 1 and 4 connections (about 20 s in all); default: 10 s runs at 1, 4
#             and 8 connections (about 2.5 minutes)
#   --dsn     the database to use (schemas bl_ascending / bl_renumber are dropped and recreated
#             there); default $PAWL_DSN, else the user's private PostgreSQL
#   --out     default bench/results/baselines.csv (a description of the run goes next to it,
#             in baselines.meta)
#
# Needs the built benchmark: $PAWL_BIN/bench_baselines, default build/bin/bench_baselines.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
die() { echo "run.sh: $*" >&2; exit 1; }
. "$here/../lib.sh"
command_line=$(bench_command_line "$root" bench/baselines/run.sh "$@")

args=()
dsn=${PAWL_DSN:-}
out=$root/bench/results/baselines.csv
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) args+=(--quick) ;;
        --dsn) [ $# -ge 2 ] || die "--dsn needs a value"; dsn=$2; shift ;;
        --out) [ $# -ge 2 ] || die "--out needs a value"; out=$2; shift ;;
        --) shift; args+=("$@"); break ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) die "unknown argument $1" ;;
    esac
    shift
done
bin=${PAWL_BIN:-$root/build/bin}/bench_baselines
[ -x "$bin" ] || die "$bin not found: build first (cmake --build build)"
if [ -z "$dsn" ]; then
    (cd "$root" && tools/pawl-pg status >/dev/null) || (cd "$root" && tools/pawl-pg start)
    dsn=$(cd "$root" && tools/pawl-pg dsn)
fi

mkdir -p "$(dirname "$out")"
start=$(date +%s)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
"$bin" --dsn "$dsn" --sql-dir "$here" --header "${args[@]}" 2>"$out.notes.tmp" | tee "$out.tmp"
cat "$out.notes.tmp" >&2
mv "$out.tmp" "$out"
meta=${out%.csv}.meta
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "command: $command_line"
    echo "elapsed_s: $(( $(date +%s) - start ))"
    echo "machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)," \
        "$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
    echo "load average (1/5/15 min) at start: $load_start, at end: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "postgresql: $(psql "$dsn" -Atqc 'show server_version' 2>/dev/null || echo unknown)"
    sed 's/^bench_baselines: /note: /' "$out.notes.tmp"
} >"$meta"
rm -f "$out.notes.tmp"
echo "run.sh: wrote $out and $meta" >&2
