#!/usr/bin/env bash
# check-style.sh — the checked-in .clang-format and .clang-tidy, applied to the C sources.
#   tools/check-style.sh format [--fix]  list the files clang-format would change (--fix: do it)
#   tools/check-style.sh tidy [BUILD [JOBS]]  clang-tidy over engine/, store/ and tools/ (and
#                                        the headers they include) with BUILD's
#                                        compile_commands.json (default: build), JOBS files at
#                                        once (default: 2)
#   tools/check-style.sh tidy-fast [BUILD [JOBS]]  the same without the static analyzer
#                                        (clang-analyzer-*), which is 95% of the cost: what
#                                        `make test` runs
# Each mode prints one line per finding and a summary, and exits 1 when there is any. tidy also
# exits 1 when a clang-tidy run fails (a crash, a compiler error, a file or a compile command it
# cannot process), printing its messages: a run that ends early has checked nothing, which must
# not read as "0 findings". CLANG_TIDY names another binary (default: clang-tidy).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-format}
case "$mode" in
format)
    command -v clang-format >/dev/null || { echo "clang-format not installed"; exit 2; }
    fix=${2:-}
    bad=0
    total=0
    while IFS= read -r f; do
        total=$((total + 1))
        if ! clang-format --style=file "$f" | cmp -s - "$f"; then
            bad=$((bad + 1))
            lines=$(clang-format --style=file "$f" | diff "$f" - | grep -c '^[<>]' || true)
            echo "$f: $lines lines differ"
            [ "$fix" = --fix ] && clang-format -i --style=file "$f"
        fi
    done < <(git ls-files '*.c' '*.h' '*.cc')
    echo "clang-format: $bad of $total files deviate"
    [ "$bad" = 0 ] || [ "$fix" = --fix ]
    ;;
tidy | tidy-fast)
    tidy=${CLANG_TIDY:-clang-tidy}
    command -v "$tidy" >/dev/null || { echo "$tidy not installed"; exit 2; }
    build=${2:-build}
    jobs=${3:-2}
    extra=()
    [ "$mode" = tidy-fast ] && extra=(--checks=-clang-analyzer-*)
    [ -f "$build/compile_commands.json" ] ||
        { echo "no $build/compile_commands.json: configure first"; exit 2; }
    out=$(mktemp)
    raw=$(mktemp)
    errs=$(mktemp)
    trap 'rm -f "$out" "$raw" "$errs"' EXIT
    # One file per process: the files differ in cost by 100x, so batches would leave a core idle.
    # xargs exits non-zero when any run did (123), one exited 255 (124) or died of a signal
    # (125): with WarningsAsErrors empty, findings alone leave clang-tidy's status at 0.
    status=0
    git ls-files 'engine/*.c' 'store/*.c' 'tools/*.c' |
        xargs -P "$jobs" -n 1 "$tidy" -p "$build" --quiet "${extra[@]}" >"$raw" 2>"$errs" ||
        status=$?
    grep -E '^[^ ]+:[0-9]+:[0-9]+: (warning|error):' "$raw" | sort -u >"$out" || true
    cat "$out"
    n=$(wc -l <"$out")
    files=$(cut -d: -f1 "$out" | sort -u | wc -l)
    echo "clang-tidy: $n findings in $files files"
    if [ "$status" != 0 ]; then
        # Its progress lines ("N warnings generated.") are noise; the rest says what failed.
        grep -vE '^[0-9]+ warnings? (and [0-9]+ errors? )?generated\.$|^Suppressed [0-9]+ warnings|^Use -header-filter|^Use -system-headers' \
            "$errs" | tail -40 || true
        echo "clang-tidy: FAILED: a run exited with an error or a signal (xargs status $status)"
        exit 1
    fi
    [ "$n" = 0 ]
    ;;
*)
    echo "usage: $0 format [--fix] | tidy [BUILD [JOBS]] | tidy-fast [BUILD [JOBS]]" >&2
    exit 2
    ;;
esac
