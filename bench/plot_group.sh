#!/usr/bin/env bash
# plot_group.sh — the plot of a bench_group CSV: for each cell, each pawl variant's events/s as
# a multiple of the better plain-INSERT baseline measured in the same round (bar: mean over
# rounds; error bar: the lowest and highest round), with the issue's target per cell as a mark.
# CSVs written before 2026-12-05 (column ratio_to_ceiling: one INSERT baseline, then called the
# ceiling) plot the same way.
#
#   bench/plot_group.sh [CSV] [PNG]     defaults: bench/results/bench_group.csv, same name .png
#
# Needs gnuplot. The "half" cell (an open loop at half the grouped rate) has no baseline ratio of
# its own meaning and is left out; its latency is in the CSV and the tables.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/lib.sh"
csv=${1:-$here/results/bench_group.csv}
png=${2:-${csv%.csv}.png}
[ -s "$csv" ] || { echo "plot_group.sh: no such CSV: $csv" >&2; exit 1; }
head -1 "$csv" | grep -Eq '^round,cell,variant,events_per_s,ratio_to_(ceiling|best_insert),' ||
    { echo "plot_group.sh: $csv is not a bench_group CSV (header differs)" >&2; exit 1; }
command -v gnuplot >/dev/null || { echo "plot_group.sh: gnuplot is not installed" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One line per cell: mean, min and max ratio of grouped, ungrouped, grouped_fin_off and async
# (0 where a cell has no such variant: async runs in one64 and ten64 only), then
# the target (the issue's table: ≥ 5x, ≥ 0.8x, ≥ 2x, ≥ 0.9x). No header line: a histogram
# counts one as a row.
awk -F, '
    NR == 1 { next }
    $2 == "half" || $3 ~ /^(ceiling|insert_|write_message)/ { next }
    {
        k = $2 SUBSEP $3
        s[k] += $5; n[k]++
        if (!(k in lo) || $5 < lo[k]) lo[k] = $5
        if (!(k in hi) || $5 > hi[k]) hi[k] = $5
        seen[$2] = 1
    }
    END {
        split("one64 one1 ten64 hundred", order, " ")
        t["one64"] = 5; t["one1"] = 0.8; t["ten64"] = 2; t["hundred"] = 0.9
        label["one64"] = "64 callers, 1-event"; label["one1"] = "1 writer, 1-event"
        label["ten64"] = "64 callers, 10-event"; label["hundred"] = "100-event, 1 stream"
        for (i = 1; i <= 4; i++) {
            c = order[i]
            if (!(c in seen)) continue
            line = label[c]
            split("grouped ungrouped grouped_fin_off async", vs, " ")
            for (j = 1; j <= 4; j++) {
                k = c SUBSEP vs[j]
                if (k in n) line = line sprintf("\t%.3f\t%.3f\t%.3f", s[k] / n[k], lo[k], hi[k])
                else line = line "\t0\t0\t0"
            }
            print line "\t" t[c]
        }
    }' "$csv" >"$tmp/g.dat"
rounds=$(awk -F, 'NR > 1 { r[$1] = 1 } END { print length(r) }' "$csv")

gnuplot <<GP
$bench_gnuplot_histogram
set style histogram errorbars gap 2 lw 1
set output "$png"
set title "pawl group append: events/s as a multiple of the better plain-INSERT baseline of the same round (bars: mean of $rounds rounds, whiskers: lowest and highest)"
set ylabel "x the better INSERT baseline"
set yrange [0:*]
set key top right
plot "$tmp/g.dat" using 2:3:4:xtic(1) title "grouped (default)", \
     "" using 5:6:7 title "ungrouped", \
     "" using 8:9:10 title "grouped, finalizer off", \
     "" using 11:12:13 title "async (one thread, as many in flight)", \
     "" using 0:14 with points pt 7 ps 1.6 lc rgb "black" title "target"
GP
echo "plot_group.sh: wrote $png"
