#!/usr/bin/env bash
# test_install.sh — `make install` works for embedders: install the build into a temporary
# prefix (tests/support/install_prefix.sh), build examples/embed against it with nothing but
# `pkg-config --cflags --libs pawl`, and run embed without LD_LIBRARY_PATH; link it again with
# libpawl's archive and `pkg-config --static --libs pawl`, and run that. (The README's program,
# examples/embed/app.c, is built and run against PostgreSQL by test_embed_example.sh.)
set -euo pipefail
src=${PAWL_SOURCE_DIR:?run through ctest}
build=$(cd "${PAWL_BIN:?run through ctest}/.." && pwd)
command -v pkg-config >/dev/null || { echo "SKIP: no pkg-config"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# shellcheck source=../support/install_prefix.sh
. "$src/tests/support/install_prefix.sh"
install_prefix "$build" "$tmp/prefix" || exit 1
test -f "$tmp/prefix/include/pawl.h"
test -x "$tmp/prefix/bin/pawl"

# The installed .pc resolves to the temporary prefix (it is relocatable).
case "$(pkg-config --cflags pawl)" in
    *"$tmp/prefix"*) ;;
    *) echo "pkg-config --cflags pawl does not point into the install prefix: $(pkg-config --cflags pawl)"; exit 1 ;;
esac
# A sanitizer build installs an instrumented library: build the example the same way.
extra=$san_flags
make -s -C "$src/examples/embed" O="$tmp" CC="${CC:-cc}" CFLAGS="-O1 -g $extra" LDFLAGS="$extra"
libdir=$(pkg-config --variable=libdir pawl)
# It runs as built: the .pc gave it a run path to the non-system libdir (no LD_LIBRARY_PATH).
run_embed() {
    local out
    out=$(env -u LD_LIBRARY_PATH "$1")
    echo "$out"
    grep -q '^embed: ok$' <<<"$out" && grep -q '^event 3 order-2 Placed$' <<<"$out" &&
        grep -q '^\[embed INFO\] embed: configured' <<<"$out"
}
run_embed "$tmp/embed" || { echo "the embed example does not run without LD_LIBRARY_PATH"; exit 1; }
grep >/dev/null 'NEEDED.*libpawl\.so' <<<"$(readelf -d "$tmp/embed")" || { echo "embed is not linked to libpawl.so"; exit 1; }

# `pkg-config --static --libs pawl` names only libraries the linker finds (Debian's libpq.pc
# lists -lpgcommon -lpgport, which it does not ship, so libpq is named directly).
for l in $(pkg-config --static --libs-only-l pawl); do
    [ "$l" = -lpawl ] && continue
    printf 'int main(void){return 0;}\n' | ${CC:-cc} -x c - -o "$tmp/probe" $extra \
        $(pkg-config --static --libs-only-L pawl) "$l" 2>/dev/null ||
        { echo "pkg-config --static --libs pawl names $l, which does not link"; exit 1; }
done
# libpawl linked statically (the archive) with the system libraries shared: the program needs
# no libpawl.so. A fully static program (-static) is not possible on Debian: it ships no static
# archives for libpq's own dependencies (libpgcommon, libpgport, GSSAPI, LDAP).
${CC:-cc} -std=c11 -O1 $extra $(pkg-config --cflags pawl) -o "$tmp/embed-static" \
    "$src/examples/embed/embed.c" -Wl,-Bstatic -lpawl -Wl,-Bdynamic -Wl,--as-needed \
    $(pkg-config --static --libs pawl) $extra
grep >/dev/null 'NEEDED.*libpawl' <<<"$(readelf -d "$tmp/embed-static")" &&
    { echo "the static link still needs libpawl.so"; exit 1; }
run_embed "$tmp/embed-static" || { echo "the statically linked embed example does not run"; exit 1; }
# The installed tool runs too.
"$tmp/prefix/bin/pawl" --version
