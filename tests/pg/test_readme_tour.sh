#!/usr/bin/env bash
# test_readme_tour.sh — the README's five-minute tour, run as written: the first sh block after
# "## A five-minute tour" is taken from README.md and every command in it runs, in order,
# against a fresh database of the private PostgreSQL. A command that runs until interrupted
# (`--follow`, `pawl run`) gets a few seconds and then Ctrl-C, and must stop cleanly (exit 130).
# Each command must succeed, and what the tour promises is checked: the appended events come
# back from `tail`, the processor handles them and `status` shows it, the previews change
# nothing. So a tour that drifts from the tool fails here.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
README=${PAWL_SOURCE_DIR:?run through ctest}/README.md
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_tour_$$
psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db" && psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" || exit 1
cleanup() {
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
export PAWL_DSN="$BASE_DSN dbname=$db"
export PAWL_LOG_LEVEL=warn

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }

# The tour's block: from the first ```sh after the heading to the closing ```.
awk '/^## A five-minute tour/ {t = 1; next}
     t && /^```sh/ {b = 1; next}
     b && /^```/ {exit}
     b {print}' "$README" >"$tmp/tour.sh"
[ -s "$tmp/tour.sh" ]; check "README has a tour block" $?

# Commands: join continuation lines, drop comments and blank lines.
sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$tmp/tour.sh" | sed -E 's/[[:space:]]+#[^'"'"'"]*$//' |
    grep -Ev '^[[:space:]]*(#|$)' >"$tmp/cmds"
n=$(wc -l <"$tmp/cmds")
[ "$n" -ge 8 ]; check "the tour has its commands ($n)" $?

# `pawl` in the tour is the built tool; the commands run in a scratch folder (the archive file).
mkdir "$tmp/work"
i=0
while IFS= read -r cmd; do
    i=$((i + 1))
    line=${cmd//pawl /\"\$PAWL\" }
    if [[ $cmd == *--follow* || $cmd == *"pawl run "* ]]; then
        # Runs until interrupted: a few seconds, then Ctrl-C; a clean stop exits 130.
        read -ra args <<<"${cmd#pawl }"
        (cd "$tmp/work" && exec "$PAWL" "${args[@]}" >"$tmp/out.$i" 2>"$tmp/err.$i") &
        pid=$!
        sleep 4
        kill -INT $pid
        for _ in $(seq 1 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
        kill -9 $pid 2>/dev/null
        wait $pid
        rc=$?
        [ $rc -eq 130 ]; check "[$i] $cmd (Ctrl-C after 4 s: exit $rc, want 130)" $?
    else
        (cd "$tmp/work" && eval "$line" >"$tmp/out.$i" 2>"$tmp/err.$i")
        rc=$?
        [ $rc -eq 0 ]; check "[$i] $cmd (exit $rc)" $?
    fi
    [ $rc -eq 0 ] || [ $rc -eq 130 ] || sed 's/^/     /' "$tmp/err.$i"
    echo "$i $cmd" >>"$tmp/index"
done <"$tmp/cmds"

out_of() { # the output of the first command matching $1
    local k
    k=$(grep -F -- "$1" "$tmp/index" | head -1 | cut -d' ' -f1)
    cat "$tmp/out.${k:-0}" 2>/dev/null
}

grep >/dev/null 'order-17#2' <<<"$(out_of "| pawl append")"; check "append echoes order-17#2" $?
[ "$(out_of "pawl tail --from 0" | grep -c 'order-17')" -eq 2 ]
check "tail --from 0 prints the two events" $?
grep >/dev/null 'OrderPaid' <<<"$(out_of "pawl run")"; check "the print handler printed the events" $?
# status: the TOKEN column (found by its header) of every segment row is 2, the index of the
# last of the two events (not just any "2" on the page: HEAD 2, segment 2, ...).
tokens=$(out_of "pawl status orders" | awk '
    $1 == "SEGMENT" { for (c = 1; c <= NF; c++) if ($c == "TOKEN") col = c; next }
    col && $1 ~ /^[0-9]+$/ { print $col }')
nseg=$(grep -c . <<<"$tokens")
[ "$nseg" -gt 0 ] && ! grep -qvx 2 <<<"$tokens"
check "status shows the processor's token 2 on each of its $nseg segments (seen: $(sort -u <<<"$tokens" | tr '\n' ' '))" $?
[ "$(psql "$PAWL_DSN" -qAtc "SELECT min(token) FROM pawl.tokens WHERE processor = 'orders'")" = 2 ]
check "the reset preview changed no token" $?
[ ! -e "$tmp/work/old.jsonl" ]; check "the retention preview wrote no archive" $?
[ "$(psql "$PAWL_DSN" -qAtc "SELECT count(*) FROM pawl_api.events")" -eq 2 ]
check "the retention preview dropped nothing" $?

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
