#!/usr/bin/env bash
# test_readme_tour.sh — the README's five-minute tour, run as written, where the README says to
# run it: from the checkout, after `make demo`. The first sh block after "## A five-minute tour"
# is taken from README.md and its commands run, in order and as written, in one shell (so its
# `export PATH=...` holds for the lines after it), in a folder laid out like the checkout
# (build/bin is this build's). The database is what a new user has: no --dsn, PAWL_DSN or PG*
# variable, a private PostgreSQL of the test's own (PAWL_PG_DIR, removed at the end) that
# `make demo` started and filled in its own database (the demo is run here the way the
# Makefile runs it, briefly). A command that runs until interrupted (`--follow`, `pawl run`)
# gets a few seconds and then Ctrl-C, and must stop cleanly (exit 130). Each command must
# succeed, print no warning or error line, and none of the start-up detail that belongs at
# debug; and what the tour promises is checked: the appended events (and only they: not the
# demo's) come back from `tail`, the processor handles them and `status` shows it, the previews
# change nothing. So a tour that drifts from the tool, or a first hour that gets noisy, fails.
set -uo pipefail
PAWL_BIN=${PAWL_BIN:?run through ctest}
README=${PAWL_SOURCE_DIR:?run through ctest}/README.md
MAKEFILE=$PAWL_SOURCE_DIR/Makefile
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
# The test's own private PostgreSQL: a folder in /tmp itself (as root the cluster's owner,
# postgres, creates it; the socket path must stay short).
export PAWL_PG_DIR=/tmp/pawl-tour-$$
PG=$PAWL_BIN/pawl-pg
cleanup() {
    "$PG" remove >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
# What a new user's shell has: no connection or pawl setting in the environment.
unset PAWL_PG_KEY PAWL_DSN PGHOST PGHOSTADDR PGPORT PGDATABASE PGUSER PGPASSWORD PGPASSFILE \
    PGSERVICE PGSERVICEFILE PGOPTIONS
for v in $(compgen -e | grep '^PAWL_'); do
    case $v in PAWL_BIN | PAWL_SOURCE_DIR | PAWL_PG_DIR | PAWL_TEST_DSN | PAWL_PG) ;; *) unset "$v" ;; esac
done

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }

# `make demo`: pg-start, then the demo in its own database (DEMO_DB), as the Makefile does.
demo_db=$(sed -n 's/^DEMO_DB ?= *//p' "$MAKEFILE")
[ -n "$demo_db" ] && grep -qF 'PAWL_DSN="$$($(PG) dsn) dbname=$(DEMO_DB)" $(BUILD)/bin/pawl demo' "$MAKEFILE"
check "make demo runs pawl demo in a database of its own ($demo_db)" $?
"$PG" start >"$tmp/pg.log" 2>&1 || { cat "$tmp/pg.log"; echo "FAIL the private PostgreSQL did not start"; exit 1; }
"$PG" psql -qc "CREATE DATABASE $demo_db" >/dev/null &&
    PAWL_DSN="$("$PG" dsn) dbname=$demo_db" "$PAWL_BIN/pawl" demo --duration 1s --rate 500 \
        >"$tmp/demo.out" 2>"$tmp/demo.err"
check "a short make demo" $?

# The tour's block: from the first ```sh after the heading to the closing ```.
awk '/^## A five-minute tour/ {t = 1; next}
     t && /^```sh/ {b = 1; next}
     b && /^```/ {exit}
     b {print}' "$README" >"$tmp/tour.sh"
[ -s "$tmp/tour.sh" ]; check "README has a tour block" $?

# Commands: continuation lines joined; comment-only and blank lines left out (each command
# keeps its own trailing comment: it runs exactly as written).
sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$tmp/tour.sh" | grep -Ev '^[[:space:]]*(#|$)' >"$tmp/cmds"
n=$(wc -l <"$tmp/cmds")
[ "$n" -ge 9 ]; check "the tour has its commands ($n)" $?

# The checkout, as far as the tour uses it: build/bin (this build's tool and pawl-pg).
mkdir -p "$tmp/work/build"
ln -s "$PAWL_BIN" "$tmp/work/build/bin"
cd "$tmp/work" || exit 1
i=0
while IFS= read -r cmd; do
    i=$((i + 1))
    if [[ $cmd == *--follow* || $cmd == *"pawl run "* ]]; then
        # Runs until interrupted: a few seconds, then Ctrl-C; a clean stop exits 130. exec, so
        # that the signal reaches pawl itself (a background subshell ignores SIGINT).
        (eval "exec $cmd" >"$tmp/out.$i" 2>"$tmp/err.$i") &
        pid=$!
        sleep 4
        kill -INT $pid
        for _ in $(seq 1 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
        kill -9 $pid 2>/dev/null
        wait $pid
        rc=$?
        [ $rc -eq 130 ]; check "[$i] $cmd (Ctrl-C after 4 s: exit $rc, want 130)" $?
    else
        eval "$cmd" >"$tmp/out.$i" 2>"$tmp/err.$i" # in this shell: an export holds for the rest
        rc=$?
        [ $rc -eq 0 ]; check "[$i] $cmd (exit $rc)" $?
    fi
    [ $rc -eq 0 ] || [ $rc -eq 130 ] || sed 's/^/     /' "$tmp/err.$i"
    echo "$i $cmd" >>"$tmp/index"
done <"$tmp/cmds"
cd / || exit 1

[ "$(command -v pawl)" = "$tmp/work/build/bin/pawl" ]
check "the tour put build/bin/pawl on the PATH of its shell" $?

# Stderr of every command: no warning or error line (text: "TIME warn  module: ..." or
# "pawl: warning: ..."; JSON: "level":"warn"), and none of the start-up detail that is debug.
warned=$(cat "$tmp"/err.* 2>/dev/null | grep -E '^[0-9T:.-]+Z (warn|error) |^pawl: (warning|error)|"level":"(warn|error)"')
[ -z "$warned" ]; check "no warning or error line" $?
[ -z "$warned" ] || sed 's/^/     /' <<<"$warned"
noise=$(cat "$tmp"/err.* 2>/dev/null |
    grep -E 'timer backend|I/O loop backend|applied migration|server functions|auto mode|private PostgreSQL')
[ -z "$noise" ]; check "no start-up detail at info (I/O backends, migrations, auto mode, the database)" $?
[ -z "$noise" ] || sed 's/^/     /' <<<"$noise"

out_of() { # the output of the first command matching $1
    local k
    k=$(grep -F -- "$1" "$tmp/index" | head -1 | cut -d' ' -f1)
    cat "$tmp/out.${k:-0}" 2>/dev/null
}

grep >/dev/null 'order-17#2' <<<"$(out_of "| pawl append")"; check "append echoes order-17#2" $?
tail_out=$(out_of "pawl tail --from 0")
[ "$(grep -c . <<<"$tail_out")" -eq 2 ] && [ "$(grep -c 'order-17' <<<"$tail_out")" -eq 2 ]
check "tail --from 0 prints the tour's two events and nothing else (not the demo's)" $?
grep >/dev/null 'OrderPaid' <<<"$(out_of "pawl run")"; check "the print handler printed the events" $?
# status: the TOKEN column (found by its header) of every segment row is 2, the index of the
# last of the two events (not just any "2" on the page: HEAD 2, segment 2, ...).
tokens=$(out_of "pawl status orders" | awk '
    $1 == "SEGMENT" { for (c = 1; c <= NF; c++) if ($c == "TOKEN") col = c; next }
    col && $1 ~ /^[0-9]+$/ { print $col }')
nseg=$(grep -c . <<<"$tokens")
[ "$nseg" -gt 0 ] && ! grep -qvx 2 <<<"$tokens"
_rc=$?; check "status shows the processor's token 2 on each of its $nseg segments (seen: $(sort -u <<<"$tokens" | tr '\n' ' '))" $_rc
dsn=$("$PG" dsn)
[ "$(psql "$dsn" -qAtc "SELECT min(token) FROM pawl.tokens WHERE processor = 'orders'")" = 2 ]
check "the reset preview changed no token" $?
[ ! -e "$tmp/work/old.jsonl" ]; check "the retention preview wrote no archive" $?
[ "$(psql "$dsn" -qAtc "SELECT count(*) FROM pawl_api.events")" -eq 2 ]
check "the retention preview dropped nothing" $?
[ "$(psql "$dsn dbname=$demo_db" -qAtc "SELECT count(*) > 0 FROM pawl_api.events")" = t ]
check "the demo's events are in $demo_db" $?

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
