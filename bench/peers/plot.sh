#!/usr/bin/env bash
# plot.sh — PNG plots (gnuplot) of the peer and baseline CSVs.
#
#   bench/peers/plot.sh [--out DIR] CSV...     default: bench/results/peers.csv and
#                                              bench/results/baselines.csv, whichever exist
#
# Writes into DIR (default bench/results):
#   peers_append.png      append events/s by writers x events per append, one bar per system
#   peers_catchup.png     catch-up events/s per system (and tuned consumer)
#   peers_live.png        live append-to-handler latency p50 / p99 / max per system and rate
#   baselines_finalize.png  the renumbering baseline's finalize delay p50 / p99 per configuration
# A plot whose rows are absent from the inputs is skipped. Every CSV has the common header
# system,workload,writers,events_per_append,events,seconds,events_per_s,p50_ms,p99_ms,p999_ms,max_ms
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/../lib.sh"
outdir=$root/bench/results
files=()
while [ $# -gt 0 ]; do
    case "$1" in
        --out) outdir=$2; shift ;;
        *) files+=("$1") ;;
    esac
    shift
done
if [ ${#files[@]} -eq 0 ]; then
    for f in "$root/bench/results/peers.csv" "$root/bench/results/baselines.csv"; do
        [ -f "$f" ] && files+=("$f")
    done
fi
[ ${#files[@]} -gt 0 ] || { echo "plot.sh: no CSV to plot" >&2; exit 1; }
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot is not installed" >&2; exit 1; }
mkdir -p "$outdir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# All rows, header dropped.
for f in "${files[@]}"; do [ -f "$f" ] || { echo "plot.sh: $f not found" >&2; exit 1; }; done
for f in "${files[@]}"; do tail -n +2 "$f"; done | grep -v '^$' >"$tmp/all.csv" || true

common="$bench_gnuplot_histogram
set datafile missing \"-\""

# 1. Append throughput: a matrix of configuration x system.
awk -F, '$2 == "append" { k = $3 "x" $4; v[k, $1] = $7; if (!(k in seen)) { seen[k] = 1; ks[++nk] = k }
                          if (!($1 in ss)) { ss[$1] = 1; sys[++ns] = $1 } }
    END { if (!nk) exit
          printf "config"; for (j = 1; j <= ns; j++) printf "\t%s", sys[j]; printf "\n"
          for (i = 1; i <= nk; i++) { split(ks[i], p, "x")
              printf "%s writer%s x %s ev", p[1], (p[1] == 1 ? "" : "s"), p[2]
              for (j = 1; j <= ns; j++) printf "\t%s", ((ks[i], sys[j]) in v ? v[ks[i], sys[j]] : "-")
              printf "\n" } }' "$tmp/all.csv" >"$tmp/append.dat"
if [ -s "$tmp/append.dat" ]; then
    n=$(head -1 "$tmp/append.dat" | awk -F'\t' '{print NF}')
    gnuplot <<GP
$common
set output "$outdir/peers_append.png"
set title "Append throughput (events/s, log scale; writers x events per append)"
set logscale y
set ylabel "events/s"
plot for [i=2:$n] "$tmp/append.dat" using i:xtic(1) title columnheader(i)
GP
fi

# 2. Catch-up throughput.
awk -F, '$2 ~ /^catchup/ { printf "%s %s\t%s\n", $1, $2, $7 }' "$tmp/all.csv" >"$tmp/catchup.dat"
if [ -s "$tmp/catchup.dat" ]; then
    gnuplot <<GP
$common
set output "$outdir/peers_catchup.png"
set title "Catch-up from the start of a pre-filled log (events/s, log scale)"
set logscale y
set ylabel "events/s"
set key off
plot "$tmp/catchup.dat" using 2:xtic(1) title "events/s"
GP
fi

# 3. Live latency.
awk -F, 'BEGIN { print "run\tp50\tp99\tmax" }
    $2 ~ /^live/ { w = $2; sub(/^live@/, "", w); printf "%s, %s ev/s offered\t%s\t%s\t%s\n", $1, w, $8, $9, $11 }' \
    "$tmp/all.csv" >"$tmp/live.dat"
if [ "$(wc -l <"$tmp/live.dat")" -gt 1 ]; then
    gnuplot <<GP
$common
set output "$outdir/peers_live.png"
set title "Live: append commit to handler call (ms, log scale)"
set logscale y
set ylabel "ms"
plot for [i=2:4] "$tmp/live.dat" using i:xtic(1) title columnheader(i)
GP
fi

# 4. The renumbering baseline's finalize delay.
awk -F, 'BEGIN { print "config\tp50\tp99" }
    $2 == "finalize-delay" { printf "%s x %s\t%s\t%s\n", $3, $4, $8, $9 }' "$tmp/all.csv" >"$tmp/fin.dat"
if [ "$(wc -l <"$tmp/fin.dat")" -gt 1 ]; then
    gnuplot <<GP
$common
set output "$outdir/baselines_finalize.png"
set title "Per-event renumbering baseline: append commit to finalization (ms, log scale; connections x events per append)"
set logscale y
set ylabel "ms"
plot for [i=2:3] "$tmp/fin.dat" using i:xtic(1) title columnheader(i)
GP
fi
ls "$outdir"/*.png 2>/dev/null | sed 's/^/plot.sh: /' >&2
