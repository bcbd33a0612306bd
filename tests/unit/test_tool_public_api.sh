#!/usr/bin/env bash
# test_tool_public_api.sh — the `pawl` tool is a client of the public API. Install the build into
# a temporary prefix (tests/support/install_prefix.sh), copy tools/*.c and tools/*.h into a
# directory of their own (so that no relative path leads back into the source tree), and compile
# and link them with nothing of pawl's but PREFIX/include and PREFIX/lib/libpawl.so (plus libpq,
# jansson, libmicrohttpd and jemalloc through pkg-config). A tool file that includes a private
# header (engine/*/*.h, store/*.h) does not compile; one that calls an internal function (hidden
# in libpawl.so) does not link. The program built so must then be the tool: it runs on the
# installed libpawl.so and prints the same man page as the build's own pawl.
set -euo pipefail
src=${PAWL_SOURCE_DIR:?run through ctest}
build=$(cd "${PAWL_BIN:?run through ctest}/.." && pwd)
command -v pkg-config >/dev/null || { echo "SKIP: no pkg-config"; exit 77; }
deps=(libpq jansson libmicrohttpd jemalloc)
pkg-config --exists "${deps[@]}" || { echo "SKIP: pkg-config does not know all of: ${deps[*]}"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The build links no private include path into the tool (pawl_*_headers carry them).
if grep -nE 'pawl_[a-z]+_headers' "$src/tools/CMakeLists.txt"; then
    echo "tools/CMakeLists.txt gives the tool a private include path (above)"
    exit 1
fi

# shellcheck source=../support/install_prefix.sh
. "$src/tests/support/install_prefix.sh"
install_prefix "$build" "$tmp/prefix" || exit 1
prefix=$tmp/prefix
# shellcheck disable=SC2154 # san_flags: set by install_prefix (the build's sanitizer flags, or "")
san=${san_flags?}
test -f "$prefix/lib/libpawl.so" || { echo "no libpawl.so in $prefix/lib"; exit 1; }

mkdir "$tmp/tool"
cp "$src"/tools/*.c "$src"/tools/*.h "$tmp/tool/"
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
# The library's own flags for C (C11 with GNU extensions' declarations, as CMake compiles the
# tool); an implicit declaration is an error, so a call into the library that no public header
# declares fails here rather than at link time only.
# shellcheck disable=SC2086,SC2046 # word splitting of the flag lists is wanted
if ! ${CC:-cc} -std=c11 -D_GNU_SOURCE -DPAWL_VERSION="\"$version\"" -O1 -g0 $san \
    -Wall -Wextra -Wno-unused-parameter -Werror=implicit-function-declaration \
    -I"$prefix/include" $(pkg-config --cflags "${deps[@]}") \
    -o "$tmp/pawl" "$tmp"/tool/*.c \
    -L"$prefix/lib" -Wl,-rpath,"$prefix/lib" -lpawl $(pkg-config --libs "${deps[@]}") -lpthread -lm \
    $san >"$tmp/cc.log" 2>&1; then
    grep -E 'error|undefined reference' "$tmp/cc.log" | head -40
    echo "the tool does not build against the installed headers and libpawl.so alone"
    exit 1
fi

# It is linked to the installed shared library, not to an archive.
readelf -d "$tmp/pawl" | grep -q 'NEEDED.*libpawl\.so' ||
    { echo "the tool built here is not linked to libpawl.so"; exit 1; }
lib=$(env -u LD_LIBRARY_PATH ldd "$tmp/pawl" | awk '/libpawl\.so/ {print $3}')
case "$lib" in
    "$prefix"/lib/*) ;;
    *) echo "the tool built here loads libpawl.so from '$lib', not from $prefix/lib"; exit 1 ;;
esac

# And it is the tool: same version line, same man page (generated from its command and flag
# tables) as the build's own.
env -u LD_LIBRARY_PATH "$tmp/pawl" --version
[ "$("$tmp/pawl" --version)" = "$("$build/bin/pawl" --version)" ] ||
    { echo "--version differs from the build's pawl"; exit 1; }
"$tmp/pawl" man >"$tmp/man.client"
"$build/bin/pawl" man >"$tmp/man.build"
cmp -s "$tmp/man.client" "$tmp/man.build" ||
    { diff "$tmp/man.build" "$tmp/man.client" | head -20; echo "pawl man differs"; exit 1; }
echo "the tool builds and runs against $prefix (public headers, libpawl.so) alone"
