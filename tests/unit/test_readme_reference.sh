#!/usr/bin/env bash
# test_readme_reference.sh — docs/reference.md, the command, flag and exit-code reference is the output of
# `pawl help --markdown`, so it cannot drift from the flag table: the text between the markers
# <!-- BEGIN pawl help --markdown --> and <!-- END pawl help --markdown --> must equal it.
# Skipped (77) while that file has no such section.
set -euo pipefail
src=${PAWL_SOURCE_DIR:?run through ctest}
readme=$src/docs/reference.md
begin='<!-- BEGIN pawl help --markdown -->'
end='<!-- END pawl help --markdown -->'
grep -qF -- "$begin" "$readme" 2>/dev/null || { echo "SKIP: docs/reference.md has no generated reference"; exit 77; }
want=$(mktemp)
trap 'rm -f "$want"' EXIT
"${PAWL_BIN:?}/pawl" help --markdown >"$want"
if ! diff -u "$want" <(sed -n "/^$begin\$/,/^$end\$/p" "$readme" | sed '1d;$d'); then
    echo "docs/reference.md is stale: regenerate it with build/bin/pawl help --markdown"
    exit 1
fi
