#!/usr/bin/env bash
# The benchmark orchestrator end to end in its smoke mode (bench/run.sh --tiny): every pawl
# benchmark runs against the test server, and each CSV it writes is well formed (the header,
# the same field count on every row, positive rates where work was done, ordered percentiles),
# the peer-format CSV and SUMMARY.md are produced, and every target line is present.
set -euo pipefail
src=${PAWL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
[ -x "${PAWL_BIN:?}/bench_e2e" ] || { echo "bench_e2e not built (benchmarks off in this build): skipped"; exit 77; }
[ -n "${PAWL_TEST_DSN:-}" ] || { echo "no PAWL_TEST_DSN: skipped"; exit 77; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
PAWL_BIN=$PAWL_BIN "$src/bench/run.sh" --tiny --dsn "$PAWL_TEST_DSN" --out "$out"

hdr="kind,log_events,cell,param1,param2,events,seconds,events_per_s,p50_ms,p99_ms,p999_ms,max_ms,extra"
for f in latency catchup growth append; do
    [ -s "$out/$f.csv" ] || { echo "missing $f.csv"; exit 1; }
    [ "$(head -1 "$out/$f.csv")" = "$hdr" ] || { echo "bad header in $f.csv"; exit 1; }
    tail -n +2 "$out/$f.csv" | awk -F, -v f="$f" '
        { n++ }
        NF != 13 { print f ": bad field count: " $0; bad = 1 }
        $1 != f && !(f == "growth" && $1 == "fill") { print f ": wrong kind: " $0; bad = 1 }
        { for (i = 6; i <= 12; i++) if ($i !~ /^-?[0-9.]+$/) { print f ": not a number: " $0; bad = 1 } }
        $6 > 0 && $8 <= 0 { print f ": work without a rate: " $0; bad = 1 }
        $9 > $10 + 1e-9 && $10 > 0 { print f ": p50 above p99: " $0; bad = 1 }
        $12 > 0 && $10 > $12 + 1e-9 { print f ": p99 above max: " $0; bad = 1 }
        END { if (n == 0) { print f ": no rows"; bad = 1 } exit bad }'
done
# Every benchmark produced the rows the report needs.
grep -q '^latency,.*,append-to-handler,10000,10,' "$out/latency.csv"
grep -q '^latency,.*,finalize-delay,10000,10,' "$out/latency.csv"
grep -q '^latency,.*,append-to-handler,100,1,' "$out/latency.csv"
[ "$(grep -c '^growth,.*,append,' "$out/growth.csv")" -eq 2 ]
[ "$(grep -c '^growth,.*,read,' "$out/growth.csv")" -eq 2 ]
[ "$(grep -c '^catchup,.*,ceiling-select,' "$out/catchup.csv")" -eq 2 ]
# 2 handlers x 2 batch sizes x 2 segment counts x 1 worker count.
[ "$(grep -cE '^catchup,[0-9]+,(noop|projection)-b' "$out/catchup.csv")" -eq 8 ]
# A no-op catch-up cell handled events.
awk -F, '$3 ~ /^noop/ && $6 > 0 { ok = 1 } END { exit !ok }' "$out/catchup.csv"
[ "$(grep -c '^pawl,append,' "$out/pawl_peerfmt.csv")" -eq 4 ]
awk -F, 'NR > 1 && NF != 11 { bad = 1 } END { exit bad }' "$out/pawl_peerfmt.csv"
grep -q '^## Targets' "$out/SUMMARY.md"
grep -q 'p99 append-to-handler' "$out/SUMMARY.md"
grep -q 'no-op processor' "$out/SUMMARY.md"
grep -q 'flat per-event cost' "$out/SUMMARY.md"
# The run leaves no database behind.
[ -z "$(psql "$PAWL_TEST_DSN" -qAtc "select datname from pg_database where datname like 'pawl_bench_run_%'")" ]
echo "ok"
