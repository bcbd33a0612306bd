#!/usr/bin/env bash
# The closed ABI: libpawl.so exports exactly the functions the public headers mark PAWL_API, and
# every function the public headers declare carries the mark. A new public function without
# PAWL_API, an internal function left visible, or an exported variable fails here, naming it.
set -euo pipefail
src=${PAWL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
build=$(cd "${PAWL_BIN:?run through ctest}/.." && pwd)
so=$build/libpawl.so
[ -e "$so" ] || { echo "no $so: build the pawl_shared target"; exit 1; }
command -v nm >/dev/null || { echo "nm not installed: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# Declarations at file scope in the public headers: they start in column 0 and name a pawl_
# function (typedefs, static inline helpers and preprocessor lines excluded).
decls() { grep -HnE '^[A-Za-z_][^;(#]*\bpawl_[a-z0-9_]+\(' "$src"/include/pawl/*.h |
          grep -vE '^[^:]+:[0-9]+:(typedef|static)[^a-z_]'; }
unmarked=$(decls | grep -vE '^[^:]+:[0-9]+:PAWL_API ' || true)
if [ -n "$unmarked" ]; then
    echo "public declarations without PAWL_API (mark them, or move them to a private header):"
    echo "$unmarked"
    fail=1
fi
decls | grep -E '^[^:]+:[0-9]+:PAWL_API ' | sed -E 's/^[^:]+:[0-9]+:[^(]*\b(pawl_[a-z0-9_]+)\(.*/\1/' |
    sort -u >"$tmp/api"

# Every defined dynamic symbol, whatever its kind (a variable is never part of the API). Symbols
# a sanitizer runtime adds to an instrumented build are not the library's own.
nm -D --defined-only "$so" | awk '{print $NF}' |
    grep -vE '^__(asan|ubsan|tsan|sanitizer|lsan)_' |
    sed 's/@.*//' | sort -u >"$tmp/so"

extra=$(comm -13 "$tmp/api" "$tmp/so")
missing=$(comm -23 "$tmp/api" "$tmp/so")
if [ -n "$extra" ]; then
    echo "libpawl.so exports symbols no public header declares with PAWL_API:"
    echo "$extra" | sed 's/^/  /'
    fail=1
fi
if [ -n "$missing" ]; then
    echo "declared PAWL_API in include/pawl/ but not exported by libpawl.so (not defined, or"
    echo "defined in a file that does not include the declaration):"
    echo "$missing" | sed 's/^/  /'
    fail=1
fi
# The test control and the internal modules' prefixes must never leak.
internal='^pawl_(test_control|testctl_|deque_|mpsc_|pgpool_|pkg_|futex_|trigger_new)'
if grep -qE "$internal" "$tmp/so"; then
    echo "internal symbols exported"; fail=1
fi
n=$(wc -l <"$tmp/so")
[ "$fail" = 0 ] && echo "libpawl.so exports $n symbols, all declared PAWL_API in include/pawl/"
exit $fail
