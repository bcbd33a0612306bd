#!/usr/bin/env bash
# test_install.sh — `make install` works for embedders: install the build into a temporary
# prefix, build examples/embed against it with nothing but `pkg-config --cflags --libs pawl`,
# and run it.
set -euo pipefail
src=${PAWL_SOURCE_DIR:?run through ctest}
build=$(cd "${PAWL_BIN:?run through ctest}/.." && pwd)
command -v pkg-config >/dev/null || { echo "SKIP: no pkg-config"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 \
    || { cat "$tmp/install.log"; exit 1; }
pc=$(find "$tmp/prefix" -name pawl.pc | head -1)
[ -n "$pc" ] || { echo "pawl.pc was not installed"; exit 1; }
test -f "$tmp/prefix/include/pawl.h"
test -x "$tmp/prefix/bin/pawl"

export PKG_CONFIG_PATH=$(dirname "$pc")
# The installed .pc resolves to the temporary prefix (it is relocatable).
case "$(pkg-config --cflags pawl)" in
    *"$tmp/prefix"*) ;;
    *) echo "pkg-config --cflags pawl does not point into the install prefix: $(pkg-config --cflags pawl)"; exit 1 ;;
esac
# A sanitizer build installs an instrumented library: build the example the same way.
san=$(sed -n 's/^PAWL_SANITIZE:STRING=//p' "$build/CMakeCache.txt")
extra=""
[ -n "$san" ] && extra="-fsanitize=$san -fno-omit-frame-pointer"
make -s -C "$src/examples/embed" O="$tmp" CC="${CC:-cc}" CFLAGS="-O1 -g $extra" LDFLAGS="$extra"
libdir=$(pkg-config --variable=libdir pawl)
out=$(LD_LIBRARY_PATH="$libdir" "$tmp/embed")
echo "$out"
grep -q '^embed: ok$' <<<"$out"
grep -q '^event 3 order-2 Placed$' <<<"$out"
grep -q '^\[embed INFO\] embed: configured' <<<"$out"
# The installed tool runs too.
"$tmp/prefix/bin/pawl" --version
