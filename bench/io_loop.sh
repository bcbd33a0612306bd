#!/usr/bin/env bash
# io_loop.sh — the store's I/O loop on io_uring and on the epoll fallback, under the same append
# load: `pawl bench` (one cell, a fixed rate both backends sustain) run under `perf stat` once per
# backend, alternating ROUNDS times so machine drift hits both alike. Prints per run the events
# appended, CPU (task-clock) per event, append latency p50/p99, and system calls per appended
# event: all of them, and the waiting ones (io_uring_enter, epoll_wait, futex) on their own.
#
# Usage: bench/io_loop.sh [RATE [SECONDS [ROUNDS]]]   (defaults 500 events/s, 10 s, 2 rounds)
# Needs perf with the syscalls tracepoints (root or perf_event_paranoid <= 1 for tracepoints).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pawl=${PAWL_BIN:-$root/build/bin}/pawl
rate=${1:-500}
secs=${2:-10}
rounds=${3:-2}
ev='task-clock,raw_syscalls:sys_enter,syscalls:sys_enter_io_uring_enter,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex'
printf '%-9s %8s %10s %10s %10s %10s %10s %10s\n' backend events cpu_us/ev p50 p99 sys/ev \
    wait/ev futex/ev
for ((r = 0; r < rounds; r++)); do
    for b in io_uring epoll; do
        out=$(perf stat -x, -e "$ev" -- "$pawl" bench --rate "$rate" --events-per-append 1 \
            --appenders 4 --duration "${secs}s" --io-backend "$b" --log-level warn 2>&1)
        row=$(grep -E '^1 +4 ' <<<"$out" | head -1)
        eps=$(awk '{print $3}' <<<"$row")
        p50=$(awk '{print $4}' <<<"$row")
        p99=$(awk '{print $5}' <<<"$row")
        get() { awk -F, -v k="$1" '$3 == k {print $1}' <<<"$out"; }
        cpu_ms=$(get task-clock)
        sys=$(get raw_syscalls:sys_enter)
        ue=$(get syscalls:sys_enter_io_uring_enter)
        ew=$(get syscalls:sys_enter_epoll_wait)
        fx=$(get syscalls:sys_enter_futex)
        # events/s is the rate of the measured window; the process ran for about secs seconds.
        n=$(awk -v e="$eps" -v s="$secs" 'BEGIN {printf "%d", e * s}')
        awk -v b="$b" -v n="$n" -v c="$cpu_ms" -v p50="$p50" -v p99="$p99" -v sys="$sys" \
            -v ue="$ue" -v ew="$ew" -v fx="$fx" 'BEGIN {
            printf "%-9s %8d %10.1f %10s %10s %10.2f %10.2f %10.2f\n", b, n, c * 1000 / n, p50,
                   p99, sys / n, (ue + ew) / n, fx / n }'
    done
done
