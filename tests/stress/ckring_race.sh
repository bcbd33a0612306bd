#!/usr/bin/env bash
# ThreadSanitizer still sees the pool's producer rings, which are ck_ring behind
# engine/runtime/ckring.h: the wrapped hand-off (ckring_race) must run clean, and the same
# hand-off with the annotations left out (ckring_race_planted, a bare ck_ring as TSan sees it)
# must be reported as a data race in the consumer's read of an item. Registered only in TSan
# builds (tests/CMakeLists.txt): elsewhere there is no detector to check.
set -uo pipefail
bin=${CKRING_BIN:?run through ctest}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail=0

# halt_on_error: the first report ends the run; exitcode: what a report makes the program return.
export TSAN_OPTIONS="halt_on_error=1:exitcode=66:report_signal_unsafe=0"

rc=0
"$bin/ckring_race" >"$out" 2>&1 || rc=$?
if [ $rc -ne 0 ] || grep -q "WARNING: ThreadSanitizer" "$out"; then
    echo "FAIL: the annotated hand-off (ckring_race) exited $rc or was reported:"
    sed 's/^/    /' "$out" | head -60
    fail=1
else
    echo "ok: the annotated hand-off runs clean ($(tail -1 "$out"))"
fi

rc=0
"$bin/ckring_race_planted" >"$out" 2>&1 || rc=$?
if [ $rc -ne 66 ] || ! grep -q "WARNING: ThreadSanitizer: data race" "$out"; then
    echo "FAIL: the planted race (ckring_race_planted) was not reported (exit $rc, expected 66):"
    sed 's/^/    /' "$out" | head -60
    fail=1
elif ! sed -n '/WARNING: ThreadSanitizer: data race/,/^SUMMARY/p' "$out" | grep -q "consume"; then
    echo "FAIL: TSan reported a race, but not in the consumer's hand-off:"
    sed 's/^/    /' "$out" | head -60
    fail=1
else
    echo "ok: the planted race is reported:"
    grep -m1 "^SUMMARY: ThreadSanitizer" "$out" | sed 's/^/    /'
fi
exit $fail
