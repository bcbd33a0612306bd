#!/usr/bin/env bash
# The layers' arrows (docs/design.md, "Layout"): each layer compiles with an include path that
# holds only the public headers, its own folder and the layers below it, so a private header
# of a higher layer, or of a sibling, cannot be included. This test takes each layer's real
# compile command from the build's compile_commands.json and compiles one-line probes with it:
# the headers a layer may use must compile, the ones it must not see must fail as "not found".
# It also refuses include lines that reach around the include path ("../x.h", "engine/x.h").
set -euo pipefail
src=${PAWL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
build=$(cd "${PAWL_BIN:?run through ctest}/.." && pwd)
db=$build/compile_commands.json
[ -f "$db" ] || { echo "no $db: configure with CMAKE_EXPORT_COMPILE_COMMANDS"; exit 1; }
command -v jq >/dev/null || { echo "jq not installed: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# The compiler and the include/define/standard flags of the first source in a layer's folder.
flags_of() { # DIR (relative to the source tree, no trailing slash)
    local cmd
    cmd=$(jq -r --arg d "$src/$1/" '[.[] | select(.file | startswith($d))
          | select(.file | ltrimstr($d) | contains("/") | not)][0].command // empty' "$db")
    [ -n "$cmd" ] || { echo "no compile command for $1/*.c in $db" >&2; return 1; }
    # shellcheck disable=SC2086
    set -- $cmd
    local out=("$1")
    shift
    while [ $# -gt 0 ]; do
        case "$1" in
        -I?* | -D?* | -std=*) out+=("$1") ;;
        -I | -isystem | -D) out+=("$1" "$2"); shift ;;
        esac
        shift
    done
    printf '%s\n' "${out[@]}"
}

declare -A flags # LAYER-DIR -> its compile flags, one per line
probe() { # LAYER-DIR ok|no HEADER
    local dir=$1 want=$2 hdr=$3 rc=0
    [ -n "${flags[$dir]:-}" ] || flags[$dir]=$(flags_of "$dir")
    mapfile -t cc <<<"${flags[$dir]}"
    printf '#include "%s"\n' "$hdr" >"$tmp/probe.c"
    "${cc[@]}" -fsyntax-only "$tmp/probe.c" >"$tmp/out" 2>&1 || rc=$?
    if [ "$want" = ok ] && [ $rc -ne 0 ]; then
        echo "FAIL: $dir/ cannot include $hdr, which it may use:"
        sed 's/^/    /' "$tmp/out"
        fail=1
    elif [ "$want" = no ] && ! grep -qiE "$hdr.*(no such file|not found)" "$tmp/out"; then
        echo "FAIL: $dir/ can include $hdr across a forbidden arrow (rc $rc)"
        sed 's/^/    /' "$tmp/out"
        fail=1
    else
        echo "ok: $dir/ $([ "$want" = ok ] && echo sees || echo "does not see") $hdr"
    fi
}

# core: the public headers only.
probe engine/core ok common.h
for h in pool.h timers.h segment.h processor_int.h pgconn.h libpq-fe.h; do probe engine/core no $h; done
# runtime: core.
for h in common.h metrics.h pool.h; do probe engine/runtime ok $h; done
for h in processor_int.h segment.h trigger.h pgconn.h log_int.h libpq-fe.h; do
    probe engine/runtime no $h
done
# processor: runtime and core; nothing of PostgreSQL.
for h in common.h pool.h timers.h processor_int.h; do probe engine/processor ok $h; done
for h in pgconn.h log_int.h schema.h libpq-fe.h; do probe engine/processor no $h; done
# store: runtime and core and libpq; not the processor's internals.
for h in common.h timers.h ioloop.h pgconn.h libpq-fe.h; do probe store ok $h; done
for h in processor_int.h segment.h reconcile.h trigger.h; do probe store no $h; done

# Include lines that name a path bypass the include path: only "pawl/..." and <...> may.
around=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]*/' "$src/engine" "$src/store" |
         grep -vE '#[[:space:]]*include[[:space:]]*"pawl/' || true)
if [ -n "$around" ]; then
    echo "FAIL: include lines that reach around the layers' include path:"
    echo "$around"
    fail=1
fi
exit $fail
