#!/usr/bin/env bash
# report.sh — plots (gnuplot, PNG) and SUMMARY.md from the CSVs of one bench/run.sh run.
#
#   bench/report.sh [DIR]     default bench/results
#
# Reads DIR/{latency,catchup,growth,append,baselines,peers}.csv and DIR/run.meta (any may be
# missing: its tables are then left out and said so). Writes DIR/pawl_peerfmt.csv (pawl's rows
# in the peers' format), DIR/{latency,catchup,growth}.png, the peer/baseline plots (through
# bench/peers/plot.sh, pawl included as one more system) and DIR/SUMMARY.md.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/lib.sh"
out=${1:-$here/results}
[ -d "$out" ] || { echo "report.sh: $out is not a directory" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
meta() { sed -n "s/^$1: //p" "$out/run.meta" 2>/dev/null | head -1; }
has() { [ -s "$out/$1.csv" ] && [ "$(wc -l <"$out/$1.csv")" -gt 1 ]; }

# ---- what the run's files say about its shapes ---------------------------------------------
# Nothing below states a shape (connections, segments, workers, batch) the run's CSVs do not
# hold: each is read from the rows that measured it, and left out when an older CSV lacks it.
#
# The catch-up cell that stands for pawl next to the peers: the default processor shape
# (no-op handler, batch 100, 16 segments, 2 workers) when the run measured it, else the fastest
# no-op batch-100 cell it did measure. Prints "segments,workers,batch" or nothing.
cu_cell() {
    has catchup || return 0
    awk -F, 'NR > 1 && $3 ~ /^noop-b[0-9]+$/ { b = $3; sub(/^noop-b/, "", b)
            if (b == 100 && $4 == 16 && $5 == 2) def = $4 "," $5 "," b
            if (b == 100 && $8 > best) { best = $8; bc = $4 "," $5 "," b } }
        END { if (def != "") print def; else if (bc != "") print bc }' "$out/catchup.csv"
}
cu_shape=$(cu_cell)
# The latency cells' appender connections, from the rows' notes ("N appender connections",
# written by bench_e2e since 2026-12-05); empty for an older latency.csv.
lat_conns=
if has latency; then
    lat_conns=$(awk -F, 'NR > 1 && $3 == "append-to-handler" && match($13, /[0-9]+ appender connections/) {
        x = substr($13, RSTART, RLENGTH); sub(/ .*/, "", x); print x; exit }' "$out/latency.csv")
fi

# ---- pawl's rows in the peers' format ------------------------------------------------------
# system,workload,writers,events_per_append,events,seconds,events_per_s,p50_ms,p99_ms,p999_ms,max_ms
# catchup: writers = 1 (one processor, as each peer's one consumer), events_per_append = the
# cell's handler batch; live: writers = the latency cells' appender connections (empty when the
# CSV does not say).
{
    echo "system,workload,writers,events_per_append,events,seconds,events_per_s,p50_ms,p99_ms,p999_ms,max_ms"
    if has append; then
        awk -F, 'NR > 1 { printf "pawl,append,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", $4, $5, $6, $7, $8, $9, $10, $11, $12 }' "$out/append.csv"
    fi
    if [ -n "$cu_shape" ]; then
        awk -F, -v shape="$cu_shape" 'BEGIN { split(shape, s, ",") }
            NR > 1 && $3 == "noop-b" s[3] && $4 == s[1] && $5 == s[2] { printf "pawl,catchup,1,%s,%s,%s,%s,0,0,0,0\n", s[3], $6, $7, $8; exit }' "$out/catchup.csv"
    fi
    if has latency; then
        awk -F, -v w="$lat_conns" 'NR > 1 && $3 == "append-to-handler" && $5 == 1 { printf "pawl,live@%s,%s,1,%s,%s,%s,%s,%s,%s,%s\n", $4, w, $6, $7, $8, $9, $10, $11, $12 }' "$out/latency.csv"
    fi
} >"$out/pawl_peerfmt.csv"

# ---- plots ---------------------------------------------------------------------------------
common=$bench_gnuplot_histogram
if command -v gnuplot >/dev/null; then
    if has latency; then
        awk -F, 'BEGIN { print "cell\tp50\tp99\tp999\tmax" }
            NR > 1 && $3 == "append-to-handler" { printf "%s ev/s, %s-event appends\t%s\t%s\t%s\t%s\n", $4, $5, $9, $10, $11, $12 }' \
            "$out/latency.csv" >"$tmp/lat.dat"
        gnuplot <<GP
$common
set output "$out/latency.png"
set title "pawl end to end: append commit to handler call (ms, log scale)"
set logscale y
set ylabel "ms"
plot for [i=2:5] "$tmp/lat.dat" using i:xtic(1) title columnheader(i)
GP
    fi
    if has catchup; then
        awk -F, 'NR > 1 && $3 ~ /^(noop|projection)/ { printf "%s s%s w%s\t%s\n", $3, $4, $5, $8 }' \
            "$out/catchup.csv" >"$tmp/cu.dat"
        ceil=$(awk -F, 'NR > 1 && $3 == "ceiling-select" { s += $8; n++ } END { printf "%.0f", n ? s / n : 0 }' "$out/catchup.csv")
        gnuplot <<GP
$common
set output "$out/catchup.png"
set title "pawl catch-up (events/s; handler-batch size, segments, workers); line: plain SELECT ceiling ($ceil ev/s)"
set ylabel "events/s"
set key off
set yrange [0:*]
plot "$tmp/cu.dat" using 2:xtic(1) title "events/s", $ceil with lines lw 2 title "ceiling"
GP
    fi
    if has growth; then
        awk -F, 'NR > 1 && $3 == "append" { a[$2] = $8 } NR > 1 && $3 == "read" { r[$2] = $8 }
                 NR > 1 && $3 == "finalize-delay" { d[$2] = $10 }
            END { for (k in a) printf "%f\t%s\t%s\t%s\n", k / 1e6, a[k], r[k], d[k] }' \
            "$out/growth.csv" | sort -n >"$tmp/gr.dat"
        gnuplot <<GP
set terminal pngcairo noenhanced size 1100,560 font ",10"
set datafile separator "\t"
set output "$out/growth.png"
set title "pawl as the log grows"
set xlabel "log size (million events)"
set ylabel "events/s"
set y2label "finalize delay p99 (ms)"
set ytics nomirror
set y2tics
set logscale y
set grid
set key top right
plot "$tmp/gr.dat" using 1:2 with linespoints lw 2 title "append events/s", \
     "$tmp/gr.dat" using 1:3 with linespoints lw 2 title "read events/s (pawl_read)", \
     "$tmp/gr.dat" using 1:4 axes x1y2 with linespoints lw 2 title "finalize delay p99 (ms)"
GP
    fi
    if has bench_group; then
        "$here/plot_group.sh" "$out/bench_group.csv" "$out/bench_group.png" >/dev/null ||
            echo "report.sh: the group-append plot failed" >&2
    fi
    plots=()
    for f in peers baselines pawl_peerfmt; do has $f && plots+=("$out/$f.csv"); done
    if [ ${#plots[@]} -gt 0 ] && [ -x "$here/peers/plot.sh" ]; then
        "$here/peers/plot.sh" --out "$out" "${plots[@]}" 2>/dev/null || echo "report.sh: peer plots failed" >&2
    fi
else
    echo "report.sh: gnuplot not installed: no plots" >&2
fi

# ---- SUMMARY.md ----------------------------------------------------------------------------
S=$out/SUMMARY.md
{
echo "# pawl benchmarks — one run"
echo
echo "Produced by \`$(meta command)\` (then \`bench/report.sh\`), $(meta date), in $(meta elapsed_s) s; $(meta mode)."
echo
echo "| machine | |"
echo "| --- | --- |"
echo "| CPUs | $(meta cpus) × $(meta cpu_model) |"
echo "| memory | $(meta memory) |"
echo "| kernel | $(meta kernel) |"
echo "| PostgreSQL | $(meta postgresql) (same server for pawl, baselines and peers; fsync on) |"
echo "| settings | $(meta postgresql_settings) |"
echo "| load average (1/5/15 min) | before: $(meta load_start); after: $(meta load_end) |"
echo
# The 1-minute load average before and after, against the CPU count: was anything else running?
busy=$(awk -v c="$(meta cpus)" -v a="$(meta load_start)" -v b="$(meta load_end)" \
    'BEGIN { split(a, x, " "); split(b, y, " "); print (x[1] > c || y[1] > c) ? 1 : 0 }')
if [ "$busy" = 1 ]; then
    echo "The load average exceeded the CPU count: other work shared the machine during this run,"
    echo "so every figure here is lower, and noisier, than on an idle machine."
else
    echo "The load average stayed below the CPU count (the benchmark's own load): nothing else of"
    echo "note ran. The machine is a shared VM, so repeats still scatter by about ±20%."
fi
echo "Compare rows of one table (they ran minutes apart), not this run with another."
echo

# 1. latency
echo "## End-to-end latency (append commit → handler call)"
echo
if has latency; then
    echo "Open-loop appender (${lat_conns:+$lat_conns connections, }finalizer on) and a running processor (16 segments,"
    echo "default threads and batch size) reading through a second store that wakes on the log's"
    echo "notifications. \`finalize\` is the delay from the commit acknowledgement to the end of the"
    echo "finalization run that covered it (appender's store statistics; p999 not kept there)."
    echo
    echo "| offered ev/s | events/append | achieved ev/s | events measured | p50 ms | p99 ms | p999 ms | max ms | finalize p50 | finalize p99 | finalize max | notes |"
    echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    awk -F, 'NR > 1 && $3 == "finalize-delay" { fp50[$4 "/" $5] = $9; fp99[$4 "/" $5] = $10; fmax[$4 "/" $5] = $12 }
             NR > 1 && $3 == "append-to-handler" { k = $4 "/" $5; key[++n] = k; row[k] = $0 }
        END { for (i = 1; i <= n; i++) { k = key[i]; split(row[k], f, ",")
                ach = f[13]; sub(/^achieved /, "", ach); sub(/ ev\/s.*/, "", ach)
                note = f[13]; sub(/^achieved [0-9]+ ev\/s; /, "", note); sub(/; [0-9]+ appender connections/, "", note)
                printf "| %s | %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s |\n",
                    f[4], f[5], ach, f[6], f[9], f[10], f[11], f[12], fp50[k], fp99[k], fmax[k], note } }' \
        "$out/latency.csv"
    echo
    echo "![latency](latency.png)"
else
    echo "_Not run._"
fi
echo

# 2. catch-up
echo "## Processing throughput (catch-up from token 0)"
echo
if has catchup; then
    awk -F, 'NR > 1 && $3 == "ceiling-select" { s += $8; n++ } NR > 1 { log_n = $2 }
        NR > 1 && $3 == "pawl-read" { rd = $8 }
        END { printf "Log of %d events. Ceiling: a plain `SELECT ... ORDER BY <primary key> LIMIT 1000` keyset\n", log_n
              printf "loop on one connection over the same table, before and after the cells: mean **%.0f ev/s**.\n", s / n
              printf "The C reader (`pawl_read`, 1000 per call, which maps appends to final indexes through the\n"
              printf "runs table): %.0f ev/s (%.2f of the ceiling). Each cell is a fresh processor (new name,\n", rd, rd / (s / n)
              printf "token 0) run for a fixed time over the log; handler `noop` does nothing, `projection` queues\n"
              printf "one `INSERT` per event into the batch transaction (exactly-once projection row).\n\n" }' "$out/catchup.csv"
    echo "| handler | batch | segments | workers | events | seconds | events/s | vs ceiling |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    awk -F, 'NR == FNR { if (FNR > 1 && $3 == "ceiling-select") { s += $8; n++ } next }
        FNR > 1 && $3 ~ /^(noop|projection)/ { h = $3; b = h; sub(/-b[0-9]+$/, "", h); sub(/^.*-b/, "", b)
            printf "| %s | %s | %s | %s | %s | %.1f | %.0f | %.2f |\n", h, b, $4, $5, $6, $7, $8, $8 / (s / n) }' \
        "$out/catchup.csv" "$out/catchup.csv"
    echo
    echo "![catch-up](catchup.png)"
else
    echo "_Not run._"
fi
echo

# 3. growth
echo "## Cost as the log grows"
echo
if has growth; then
    # The append cells' shape and the fill's, as the rows' notes give them.
    gshape=$(awk -F, 'NR > 1 && $3 == "append" { x = $13; sub(/; table .*/, "", x); print x; exit }' "$out/growth.csv")
    fshape=$(awk -F, 'NR > 1 && $3 == "fill" { x = $13; sub(/^server-side loop; /, "", x); print x; exit }' "$out/growth.csv")
    echo "At each size: appends for a fixed time (${gshape:-closed loop}, finalizer on), then"
    echo "\`pawl_read\` (1000 per call) sequentially from the middle of the log. The log is grown between"
    echo "sizes by a server-side loop writing the same rows appends write (one transaction per"
    echo "100-event append, then \`pawl.finalize\`${fshape:+; $fshape}), because the API's rate on this"
    echo "machine would spend most of the time budget filling."
    echo
    echo "| log events | table size | append ev/s | append µs/event | append p99 ms | finalize p50 ms | finalize p99 ms | read ev/s | read µs/event |"
    echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    awk -F, 'NR > 1 && $3 == "append" { n = $2; a[n] = $8; ap99[n] = $10; x = $13; sub(/.*table /, "", x); tb[n] = x; keys[n] = 1 }
             NR > 1 && $3 == "finalize-delay" { d50[$2] = $9; d99[$2] = $10 }
             NR > 1 && $3 == "read" { r[$2] = $8 }
        END { for (k in keys) printf "%s\t| %d | %s | %.0f | %.1f | %.1f | %.2f | %.2f | %.0f | %.2f |\n",
                k, k, tb[k], a[k], 1e6 / a[k], ap99[k], d50[k], d99[k], r[k], r[k] ? 1e6 / r[k] : 0 }' \
        "$out/growth.csv" | sort -n | cut -f2-
    echo
    awk -F, 'NR > 1 && $3 == "fill" { e += $6; s += $7 } END { if (s > 0) printf "Fill (server-side loop, untimed for the table above): %d events at %.0f ev/s.\n\n", e, e / s }' "$out/growth.csv"
    # Least-squares slope of µs/event against millions of events, as % of the first size's cost.
    awk -F, 'NR > 1 && ($3 == "append" || $3 == "read") && $8 > 0 { x = $2 / 1e6; y = 1e6 / $8; k = $3
            n[k]++; sx[k] += x; sy[k] += y; sxx[k] += x * x; sxy[k] += x * y
            if (!(k in x0) || x < x0[k]) { x0[k] = x; y0[k] = y } if (x > x1[k]) { x1[k] = x; y1[k] = y } }
        END { for (k in n) { if (n[k] < 2) continue
                m = (n[k] * sxy[k] - sx[k] * sy[k]) / (n[k] * sxx[k] - sx[k] * sx[k])
                printf "- %s: slope %+.4f µs/event per million events (%+.1f%% of the %.1fM-event cost per million; %.2f → %.2f µs/event from %.1fM to %.1fM)\n",
                    k, m, 100 * m / y0[k], x0[k], y0[k], y1[k], x0[k], x1[k] } }' "$out/growth.csv" | sort
    echo
    echo "![growth](growth.png)"
else
    echo "_Not run._"
fi
echo

# 4. peers and baselines
echo "## Append: pawl, the baseline designs and the peers"
echo
allp=$tmp/peers_all.csv
: >"$allp"
for f in pawl_peerfmt baselines peers; do has $f && tail -n +2 "$out/$f.csv" >>"$allp"; done
if [ -s "$allp" ]; then
    echo "Writers each on their own connection, blocking appends of 1 or 100 events, as fast as the"
    echo "store allows (pawl: \`pawl_append\`, finalizer on; peers: their Node.js drivers with"
    echo "documented defaults; baselines: one libpq connection per writer). Ratio = pawl ÷ row."
    echo
    echo "| system | writers | events/append | events/s | p50 ms | p99 ms | pawl ÷ this |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    awk -F, '$2 == "append" { k = $3 "x" $4; if ($1 == "pawl") pw[k] = $7; row[++n] = $0 }
        END { for (i = 1; i <= n; i++) { split(row[i], f, ","); k = f[3] "x" f[4]
                r = (k in pw && f[7] > 0) ? sprintf("%.2f", pw[k] / f[7]) : "–"
                printf "%s\t%s\t%s\t| %s | %s | %s | %.0f | %.2f | %.2f | %s |\n", f[4], f[3], (f[1] == "pawl" ? 0 : 1), f[1], f[3], f[4], f[7], f[8], f[9], r } }' \
        "$allp" | sort -t$'\t' -k1,1n -k2,2n -k3,3n | cut -f4-
    echo
    fd=$(awk -F, '$2 == "finalize-delay" { printf "%s×%s: p50 %.1f, p99 %.1f ms; ", $3, $4, $8, $9 }' "$allp")
    [ -n "$fd" ] && echo "Per-event renumbering baseline, finalize delay: ${fd%; }." && echo
    echo "![append](peers_append.png)"
    echo
    echo "## Catch-up and live latency: pawl and the peers"
    echo
    echo "| system | workload | events | events/s | p50 ms | p99 ms | p999 ms | max ms | pawl ÷ this (rate; for live: this p99 ÷ pawl p99) |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    awk -F, '$2 ~ /^(catchup|live)/ { if ($1 == "pawl") { if ($2 ~ /^catchup/) pc = $7; else pl[$2] = $9 } row[++n] = $0 }
        END { for (i = 1; i <= n; i++) { split(row[i], f, ",")
                if (f[2] ~ /^catchup/) r = (pc && f[7] > 0) ? sprintf("%.2f", pc / f[7]) : "–"
                else r = ((f[2] in pl) && pl[f[2]] > 0) ? sprintf("%.1f", f[9] / pl[f[2]]) : "–"
                printf "%s\t%s\t| %s | %s | %s | %.0f | %.1f | %.1f | %.1f | %.1f | %s |\n", f[2], (f[1] == "pawl" ? 0 : 1), f[1], f[2], f[5], f[7], f[8], f[9], f[10], f[11], r } }' \
        "$allp" | sort -t$'\t' -k1,1 -k2,2n | cut -f3-
    echo
    if [ -n "$cu_shape" ]; then
        IFS=, read -r cs cw cb <<<"$cu_shape"
        dflt="the default processor shape"
        [ "$cs,$cw,$cb" = "16,2,100" ] || dflt="the fastest no-op batch-$cb cell of this run (the default shape, 16 segments and 2 workers, was not measured)"
        echo "pawl's catch-up row is $dflt: $cs segments, batch $cb, $cw workers, over the"
        echo "log of the catch-up table above; the peers catch up over their own pre-filled logs (see peers.meta)."
    fi
    if [ -n "$lat_conns" ]; then
        echo "Live: pawl's rows are 1-event appends at the same offered rates as the peers', from $lat_conns"
        echo "appender connections (the peers' writer counts are in their rows)."
    else
        echo "Live: pawl's rows are 1-event appends at the same offered rates as the peers' (the"
        echo "appender connections are not recorded in this run's latency.csv: writers left empty)."
    fi
    echo
    if grep -q '^note: ' "$out/peers.meta" 2>/dev/null; then
        echo "Peer notes (from peers.meta):"; echo; sed -n 's/^note: /- /p' "$out/peers.meta"; echo
    fi
    echo "![catch-up](peers_catchup.png) ![live](peers_live.png)"
else
    echo "_Not run._"
fi
echo

# 5. targets
echo "## Targets"
echo
if has latency; then
    awk -F, 'NR > 1 && $3 == "append-to-handler" && $4 == 10000 && $5 == 10 {
        ach = $13; sub(/^achieved /, "", ach); sub(/ ev\/s.*/, "", ach)
        printf "- **p99 append-to-handler ≤ 10 ms at 10k events/s**: %s — p99 %.1f ms (p50 %.1f, achieved %s ev/s).\n",
            ($10 <= 10 ? "met" : "**missed**"), $10, $9, ach }' "$out/latency.csv"
fi
if has catchup; then
    awk -F, 'NR > 1 && $3 == "ceiling-select" { s += $8; n++ }
        NR > 1 && $3 ~ /^noop/ { if ($8 > best) { best = $8; bc = $3 " s" $4 " w" $5 } if ($3 == "noop-b100" && $4 == 16 && $5 == 2) def = $8 }
        END { c = s / n
              printf "- **no-op processor ≥ ½ the plain SELECT ceiling**: %s — best cell %.0f ev/s (%s) = %.2f of %.0f ev/s",
                  (best >= c / 2 ? "met" : "**missed**"), best, bc, best / c, c
              if (def) printf "; default shape (16 segments, batch 100, 2 workers) %.2f", def / c
              printf ".\n" }' "$out/catchup.csv"
fi
if has growth; then
    awk -F, 'NR > 1 && $3 == "append" { if (!n || $2 < x0) { x0 = $2; a0 = $8 } if ($2 > x1) { x1 = $2; a1 = $8 } n++ }
        END { if (n >= 2) printf "- **flat per-event cost as the log grows**: append %.0f → %.0f ev/s from %.1fM to %.1fM events (%+.0f%%); see the slopes above.\n",
                a0, a1, x0 / 1e6, x1 / 1e6, 100 * (a1 / a0 - 1) }' "$out/growth.csv"
fi
echo
echo "Reasons for misses are in the README's benchmark section (written from this run)."
} >"$S"
echo "report.sh: wrote $S" >&2
