#!/usr/bin/env bash
# test_readme_reference.sh — the command, flag and exit-code reference in docs/reference.md is the
# output of `pawl help --markdown`, so it cannot drift from the flag table (regenerate it with
# `build/bin/pawl help --markdown > docs/reference.md`). The README links to that file instead of
# carrying a copy of its own.
set -euo pipefail
src=${PAWL_SOURCE_DIR:?run through ctest}
ref=$src/docs/reference.md
[ -f "$ref" ] || { echo "docs/reference.md is missing: generate it with pawl help --markdown"; exit 1; }
want=$(mktemp)
trap 'rm -f "$want"' EXIT
"${PAWL_BIN:?}/pawl" help --markdown >"$want"
if ! diff -u "$want" "$ref"; then
    echo "docs/reference.md is stale: regenerate it with build/bin/pawl help --markdown > docs/reference.md"
    exit 1
fi
