#!/usr/bin/env bash
# test_embed_example.sh — the README's Embedding section, as a user follows it: the program in
# its C block is examples/embed/app.c, line for line; it builds with the README's line after
# `make install PREFIX=...` (PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig and pkg-config, nothing
# else) and runs, without LD_LIBRARY_PATH, against a fresh database of the private PostgreSQL
# named the README's way (`tools/pawl-pg dsn`): it opens a store (creating the schema), appends
# one event, follows the log until the event comes back, and exits 0. The library is quiet in
# it: the program never sets a log level, so nothing at info reaches its stderr.
set -uo pipefail
src=${PAWL_SOURCE_DIR:?run through ctest}
build=$(cd "${PAWL_BIN:?run through ctest}/.." && pwd)
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v pkg-config >/dev/null || { echo "SKIP: no pkg-config"; exit 77; }
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_embed_$$
cleanup() {
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }

# The README's C block (the first ```c after "## Embedding") is the example's source.
awk '/^## Embedding/ {t = 1; next}
     t && /^```c/ {b = 1; next}
     b && /^```/ {exit}
     b {print}' "$src/README.md" >"$tmp/readme.c"
[ -s "$tmp/readme.c" ] && diff -u "$src/examples/embed/app.c" "$tmp/readme.c"
check "the README's Embedding program is examples/embed/app.c" $?
grep -q 'PKG_CONFIG_PATH=\$PREFIX/lib/pkgconfig' "$src/README.md" &&
    grep -q 'tools/pawl-pg dsn' "$src/README.md"
check "the README says where pawl.pc and the DSN come from" $?

# `make install PREFIX=$tmp/prefix`, then the README's build line.
# shellcheck source=../support/install_prefix.sh
. "$src/tests/support/install_prefix.sh"
install_prefix "$build" "$tmp/prefix"; check "make install PREFIX=... puts pawl.pc in PREFIX/lib/pkgconfig" $?
(cd "$src/examples/embed" &&
    ${CC:-cc} -std=c11 -Wall -Wextra -Werror $san_flags app.c -o "$tmp/app" \
        $(pkg-config --cflags --libs pawl)) 2>&1
check "cc app.c \$(pkg-config --cflags --libs pawl) builds it" $?
# The examples' Makefile builds it the same way.
make -s -C "$src/examples/embed" O="$tmp" CC="${CC:-cc}" CFLAGS="-O1 -g $san_flags" \
    LDFLAGS="$san_flags" "$tmp/app" -B >/dev/null 2>&1
check "examples/embed/Makefile builds it" $?

# A fresh database of the private PostgreSQL, named the way the README does.
dsn="$("${PAWL_PG:?run through ctest}" dsn) dbname=$db"
psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" >/dev/null || exit 1
env -u LD_LIBRARY_PATH -u PAWL_LOG_LEVEL timeout 60 "$tmp/app" "$dsn" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ]; check "./app \"\$(tools/pawl-pg dsn)\" exits 0 (exit $rc)" $?
grep -qx 'order-17#1 is event 1' "$tmp/out"; _rc=$?; check "it read its event back: $(cat "$tmp/out")" $_rc
[ ! -s "$tmp/err" ]; check "the library said nothing on stderr (default level warn)" $?
[ -s "$tmp/err" ] && sed 's/^/     /' "$tmp/err"
[ "$(psql "$dsn" -qAtc "SELECT count(*) FROM pawl_api.events WHERE stream_id = 'order-17'")" = 1 ]
check "the event is in the log once" $?

# Run again: a second event on the same stream, read back after the first.
env -u LD_LIBRARY_PATH timeout 60 "$tmp/app" "$dsn" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] && grep -qx 'order-17#2 is event 2' "$tmp/out"
_rc=$?; check "a second run appends order-17#2 and reads it back: $(cat "$tmp/out") (exit $rc)" $_rc

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
