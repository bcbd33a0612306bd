#!/usr/bin/env bash
# test-summary.sh — what `make test` says about skipped tests: which ones ctest skipped in each
# stage and why (at the end of the run), and whether io_uring may be skipped at all (before each
# stage's ctest run).
#
# Usage: tools/test-summary.sh [--since FILE] STAGE=DIR...
#   STAGE=DIR  a stage's name (plain, asan, tsan) and its build folder; its ctest run wrote
#              DIR/Testing/junit.xml (ctest --output-junit, which the Makefile's test recipes pass).
#   --since    results older than FILE are not this run's (an earlier stage failed, so this one
#              did not run): reported as such, never as a clean stage.
# A skipped test is one ctest did not count as passed or failed: exit 77 (SKIP_RETURN_CODE, in
# the junit file status="notrun") or disabled. Its reason is the "SKIP: ..." line the test
# printed (pawl_test_skip, the scripts' skips, uring_probe.h), else its last line of output,
# else what ctest says. Always exits 0: it reports, the stages themselves pass or fail.
#
# Usage: tools/test-summary.sh uring-env DIR
#   Prints PAWL_REQUIRE_IO_URING=1 (for `env`) when the kernel allows io_uring, so that no
#   io_uring case of the stage built in DIR may be skipped; nothing when it refuses io_uring (the
#   io_uring cases then show as skipped, with the kernel's answer) or when the caller set the
#   variable already. The probe is DIR/tests/unit_test_ioloop --probe-io-uring
#   (tests/support/uring_probe.c): io_uring_setup through liburing plus the features pawl's
#   backends need. /proc/sys/kernel/io_uring_disabled alone would miss a container's seccomp
#   profile or a security module, which refuse io_uring as well.
set -uo pipefail

if [ "${1:-}" = uring-env ]; then
    probe=${2:?usage: $0 uring-env DIR}/tests/unit_test_ioloop
    if [ -n "${PAWL_REQUIRE_IO_URING+set}" ]; then
        echo "io_uring: PAWL_REQUIRE_IO_URING=$PAWL_REQUIRE_IO_URING as set by the caller" >&2
    elif [ ! -x "$probe" ]; then
        echo "io_uring: no probe ($probe is not built): io_uring cases may be skipped" >&2
    else
        why=$("$probe" --probe-io-uring 2>&1)
        case $? in
        0)
            echo "io_uring: $why: PAWL_REQUIRE_IO_URING=1 (an io_uring case that skips fails)" >&2
            echo PAWL_REQUIRE_IO_URING=1 ;;
        77) echo "io_uring: $why: the io_uring cases will show as skipped" >&2 ;;
        *) echo "io_uring: the probe failed ($why): the io_uring cases will fail" >&2 ;;
        esac
    fi
    exit 0
fi

since=
if [ "${1:-}" = --since ]; then
    since=$2
    shift 2
fi
[ $# -gt 0 ] || { echo "usage: $0 [--since FILE] STAGE=DIR..." >&2; exit 2; }

# junit.xml -> one line per skipped test: NAME<TAB>REASON.
skipped_of() {
    awk '
    function unxml(s) {
        gsub(/&lt;/, "<", s); gsub(/&gt;/, ">", s); gsub(/&quot;/, "\"", s)
        gsub(/&apos;/, "\047", s); gsub(/&amp;/, "\\&", s)
        return s
    }
    function attr(line, key,    m) {
        if (match(line, key "=\"[^\"]*\"")) {
            m = substr(line, RSTART + length(key) + 2, RLENGTH - length(key) - 3)
            return unxml(m)
        }
        return ""
    }
    function out_line(s) {
        s = unxml(s)
        gsub(/\r/, "", s)
        if (s ~ /^[[:space:]]*$/)
            return
        if (skip_line == "" && s ~ /^SKIP: /)
            skip_line = substr(s, 7)
        last_line = s
    }
    /<testcase / {
        name = attr($0, "name"); status = attr($0, "status")
        message = ""; skip_line = ""; last_line = ""; in_out = 0
        next
    }
    /<skipped / { message = attr($0, "message") }
    /<system-out>/ {
        in_out = 1
        sub(/.*<system-out>/, "")
    }
    in_out {
        line = $0
        if (index(line, "</system-out>")) {
            sub(/<\/system-out>.*/, "", line)
            in_out = 0
        }
        out_line(line)
        next
    }
    /<\/testcase>/ {
        if (status == "notrun" || status == "disabled") {
            reason = skip_line != "" ? skip_line : last_line != "" ? last_line : message
            if (status == "disabled" && reason == "")
                reason = "disabled"
            if (length(reason) > 200)
                reason = substr(reason, 1, 197) "..."
            printf "%s\t%s\n", name, reason
        }
    }' "$1"
}

echo "== tests skipped, by stage"
total=0
for arg in "$@"; do
    stage=${arg%%=*}
    dir=${arg#*=}
    junit=$dir/Testing/junit.xml
    if [ ! -f "$junit" ] || { [ -n "$since" ] && [ ! "$junit" -nt "$since" ]; }; then
        echo "$stage ($dir): not run (no ctest results from this run)"
        continue
    fi
    ran=$(grep -c '<testcase ' "$junit")
    list=$(skipped_of "$junit")
    n=$(grep -c . <<<"$list")
    total=$((total + n))
    if [ "$n" -eq 0 ]; then
        echo "$stage ($dir): none skipped of $ran"
    else
        echo "$stage ($dir): $n skipped of $ran"
        while IFS=$'\t' read -r name reason; do
            printf '  %-40s %s\n' "$name" "${reason:-(no reason printed)}"
        done <<<"$list"
    fi
done
[ "$total" -eq 0 ] || echo "== $total skipped in all: each line says why (PAWL_REQUIRE_IO_URING=1 turns an io_uring skip into a failure)"
exit 0
