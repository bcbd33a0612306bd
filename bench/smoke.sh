#!/usr/bin/env bash
# smoke.sh — every benchmark program once, at its smallest size, so that a benchmark that no
# longer runs (a refused setting, a changed schema, a crash) fails `make test` instead of the
# next person's long run. The figures are not looked at beyond "the program exited 0 and wrote
# its output": at these sizes they mean nothing. bench_e2e's commands (fill, latency, catchup,
# growth, append) run here too, each at a tiny size, on top of tests/pg/test_bench_quick.sh,
# which runs them through bench/run.sh --tiny and checks the report.
#
#   bench/smoke.sh [--dsn DSN]      default $PAWL_TEST_DSN, else $PAWL_DSN
#
# Needs $PAWL_BIN (the built programs). Each program that talks to PostgreSQL gets its own
# scratch database (created and dropped here). About 35 s on an idle 2-core machine.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=${PAWL_BIN:?PAWL_BIN: the directory of the built benchmarks}
dsn=${PAWL_TEST_DSN:-${PAWL_DSN:-}}
while [ $# -gt 0 ]; do
    case "$1" in
        --dsn) dsn=$2; shift ;;
        *) echo "smoke.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
[ -x "$bin/bench_e2e" ] || { echo "smoke.sh: benchmarks not built in $bin: skipped"; exit 77; }
[ -n "$dsn" ] || { echo "smoke.sh: no PAWL_TEST_DSN: skipped"; exit 77; }

tmp=$(mktemp -d)
prefix=pawl_smoke_$$_
# Drops every database this run made (fresh_db runs in a command substitution, a subshell, so
# they are found by their prefix, not kept in a list).
cleanup() {
    local d
    for d in $(psql "$dsn" -qAtc "SELECT datname FROM pg_database WHERE datname LIKE '${prefix}%'" 2>/dev/null); do
        psql "$dsn" -qAtc "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1 || true
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
fresh_db() { # NAME: a new empty database; prints its DSN
    local d=$prefix$1
    psql "$dsn" -qAtc "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1 || true
    psql "$dsn" -qAtc "CREATE DATABASE $d" >/dev/null
    printf '%s dbname=%s\n' "$dsn" "$d"
}
failed=()
run() { # NAME CMD...: run one program, keep its output, report its time
    local name=$1 t0=$SECONDS rc=0
    shift
    "$@" >"$tmp/$name.out" 2>&1 || rc=$?
    if [ $rc -ne 0 ]; then
        echo "FAIL $name (exit $rc): $*"
        tail -20 "$tmp/$name.out" | sed 's/^/    /'
        failed+=("$name")
    else
        echo "ok   $name ($((SECONDS - t0)) s)"
    fi
}
rows() { [ -s "$1" ] && [ "$(wc -l <"$1")" -ge "${2:-2}" ]; } # FILE [MIN_LINES]

# bench_e2e: every command, on one database (fill before growth and catchup, as run.sh). The
# fill's 10 000 events on 2 connections are 50 appends each: enough to reach the fill loop's own
# finalizations (every 50 appends), which run.sh --tiny's fills do not.
e=$(fresh_db e2e)
run e2e_fill "$bin/bench_e2e" fill --dsn "$e" --to 10000 --conns 2 --csv "$tmp/growth.csv"
run e2e_growth "$bin/bench_e2e" growth --dsn "$e" --seconds 0.3 --csv "$tmp/growth.csv"
run e2e_catchup "$bin/bench_e2e" catchup --dsn "$e" --seconds 0.3 --segments 1 --workers 1 \
    --batches 100 --csv "$tmp/catchup.csv"
run e2e_latency "$bin/bench_e2e" latency --dsn "$e" --seconds 0.5 --rates 1000 --per-append 10 \
    --warmup 0.2 --split --csv "$tmp/latency.csv"
run e2e_append "$bin/bench_e2e" append --dsn "$e" --seconds 0.3 --workers 1 --rates 1 \
    --csv "$tmp/append.csv"
rows "$tmp/growth.csv" 5 || { echo "FAIL e2e: growth.csv lacks the fill and growth rows"; failed+=(e2e_rows); }
grep -q '^fill,' "$tmp/growth.csv" 2>/dev/null || { echo "FAIL e2e: no fill row"; failed+=(e2e_fill_row); }
grep -q '^catchup,[0-9]*,noop-b100,' "$tmp/catchup.csv" 2>/dev/null || { echo "FAIL e2e: no catch-up cell"; failed+=(e2e_cu_row); }

# bench_append: the 4-connection cells and the rate-limited cell, one round of 1 s each.
a=$(fresh_db append)
run append "$bin/bench_append" --dsn "$a" --quick --rounds 1 --seconds 1 --rate 2000 \
    --csv "$tmp/append_cells.csv"
rows "$tmp/append_cells.csv" || { echo "FAIL append: no CSV rows"; failed+=(append_rows); }

# bench_baselines: both designs, one writer, 1-event appends.
b=$(fresh_db baselines)
run baselines "$bin/bench_baselines" --dsn "$b" --sql-dir "$here/baselines" --header \
    --design ascending,renumber --conns 1 --batch 1 --seconds 0.3 --drain-s 2

# bench_group: one cell (one writer), one round, 1 s.
g=$(fresh_db group)
run group "$bin/bench_group" --dsn "$g" --seconds 1 --rounds 1 --cells one1 --csv "$tmp/group.csv"

# bench_checkpoint: in memory, then on PostgreSQL, a few thousand events, one round.
c=$(fresh_db checkpoint)
run checkpoint_mem "$bin/bench_checkpoint" 2000 1 "$tmp/checkpoint_mem.csv"
run checkpoint_pg "$bin/bench_checkpoint" 2000 1 "$tmp/checkpoint_pg.csv" "$c"

# bench_dead_letters, bench_slow_segment: a small log, one repeat.
d=$(fresh_db dead_letters)
run dead_letters "$bin/bench_dead_letters" --dsn "$d" --events 2000 --streams 20 --repeat 1
run slow_segment "$bin/bench_slow_segment" --mem --events 2000 --repeat 1 --sleep-us 50

# bench_ioloop: each backend for 1 s, one round.
i=$(fresh_db ioloop)
run ioloop "$bin/bench_ioloop" "$i" --seconds 1 --rounds 1 --inflight 8

# The micro-benchmarks (Google Benchmark shim), if built: every benchmark once, briefly.
for m in bench_runtime bench_reconcile; do
    [ -x "$bin/$m" ] || { echo "skip $m (not built: no Google Benchmark)"; continue; }
    run "$m" "$bin/$m" --benchmark_min_time=0.01
done

cleanup
trap - EXIT
[ -z "$(psql "$dsn" -qAtc "SELECT datname FROM pg_database WHERE datname LIKE '${prefix}%'")" ] ||
    { echo "FAIL: databases ${prefix}* left behind"; failed+=(cleanup); }
if [ ${#failed[@]} -gt 0 ]; then
    echo "smoke.sh: ${#failed[@]} failed: ${failed[*]}"
    exit 1
fi
echo "smoke.sh: every benchmark ran"
