#!/usr/bin/env bash
# run.sh — the append workload against the baseline designs, as CSV.
#
#   bench/baselines/run.sh [--quick] [--dsn DSN] [--out FILE] [-- extra bench_baselines flags]
#
#   --quick   2 s runs at 1 and 4 connections (about 20 s in all); default: 10 s runs at 1, 4
#             and 8 connections (about 2.5 minutes)
#   --dsn     the database to use (schemas bl_ascending / bl_renumber are dropped and recreated
#             there); default $PAWL_DSN, else the checkout's private PostgreSQL
#   --out     default bench/results/baselines.csv
#
# Needs the built benchmark: $PAWL_BIN/bench_baselines, default build/bin/bench_baselines.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
die() { echo "run.sh: $*" >&2; exit 1; }

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
"$bin" --dsn "$dsn" --sql-dir "$here" --header "${args[@]}" | tee "$out.tmp"
mv "$out.tmp" "$out"
echo "run.sh: wrote $out" >&2
