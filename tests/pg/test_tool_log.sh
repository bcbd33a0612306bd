#!/usr/bin/env bash
# test_tool_log.sh — the `pawl` tool end to end through its real binary against the private
# PostgreSQL: flags from each source and refusals (exit 2), generated help, init twice, append
# from stdin (valid, invalid line, conflict), tail (read, JSON, follow; control characters in
# ids, types and payloads escaped in text), the metrics endpoint scraped over loopback and
# parsed, the embedded default, password redaction, and a short demo.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 77; }
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
db=t_tool_log_$$
psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db" && psql "$BASE_DSN" -qAtc "CREATE DATABASE $db" || exit 1
cleanup() {
    [ -n "${bg:-}" ] && kill "$bg" 2>/dev/null
    psql "$BASE_DSN" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
export PAWL_DSN="$BASE_DSN dbname=$db"
unset PAWL_LOG_LEVEL PAWL_RATE PAWL_APPENDERS

fails=0
check() { # check NAME CONDITION-EXIT-STATUS
    if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
expect_rc() { # expect_rc NAME WANT GOT
    [ "$2" -eq "$3" ]; check "$1 (exit $3, want $2)" $?
}

# ---- flags, sources, help -------------------------------------------------------------------
"$PAWL" append --appenders 0 </dev/null 2>"$tmp/err"; expect_rc "flag out of range refused" 2 $?
grep -q -- '--appenders' "$tmp/err" && grep -q '"0"' "$tmp/err" && grep -q '\[1, 256\]' "$tmp/err"
check "message names flag, value and range" $?
PAWL_RATE=fast "$PAWL" config 2>"$tmp/err"; expect_rc "bad environment value refused" 2 $?
grep -q 'PAWL_RATE' "$tmp/err" && grep -q '"fast"' "$tmp/err"; check "message names the variable" $?
"$PAWL" demo --duration 1x 2>"$tmp/err"; expect_rc "wrong type refused" 2 $?
"$PAWL" status --rate 5 2>/dev/null; expect_rc "flag of another command refused" 2 $?
"$PAWL" nosuch 2>/dev/null; expect_rc "unknown command" 2 $?
"$PAWL" tail --bogus 2>/dev/null; expect_rc "unknown flag" 2 $?

PAWL_RATE=5 PAWL_APPENDERS=7 "$PAWL" config --appenders 3 --json >"$tmp/cfg.json"
expect_rc "config --json" 0 $?
[ "$(jq -r '.rate.source + " " + .rate.value' "$tmp/cfg.json")" = "env 5" ] &&
[ "$(jq -r '.appenders.source + " " + .appenders.value' "$tmp/cfg.json")" = "flag 3" ] &&
[ "$(jq -r '.duration.source + " " + .duration.value' "$tmp/cfg.json")" = "default 20s" ]
check "config: flag > env > default, with sources" $?
[ "$(jq -r '.rate.env' "$tmp/cfg.json")" = PAWL_RATE ] && [ "$(jq -r '.execute.env' "$tmp/cfg.json")" = null ] &&
    [ "$(jq '[to_entries[] | select(.value | type == "object" and has("env") and .env == null)] | length' "$tmp/cfg.json")" -gt 5 ]
check "config --json: settings name their variable, actions (command line only) have none" $?
"$PAWL" config >"$tmp/cfg.txt"; grep -Eq '^--rate +2000 +default$' "$tmp/cfg.txt"; check "config table" $?

"$PAWL" help >"$tmp/help"; expect_rc "pawl help" 0 $?
grep -q 'append' "$tmp/help" && grep -q -- '--log-level' "$tmp/help"; check "help lists commands and common flags" $?
"$PAWL" append --help >"$tmp/help"; expect_rc "pawl append --help" 0 $?
grep -q 'EXIT STATUS' "$tmp/help" && grep -q -- '--events-per-append' "$tmp/help" &&
    grep -q 'PAWL_EVENTS_PER_APPEND' "$tmp/help"; check "command help: flags, env names, exit codes" $?
"$PAWL" help --markdown >"$tmp/md"; grep -q '^| `--rate` | `PAWL_RATE` |' "$tmp/md"; check "markdown flag table" $?

# ---- schema -----------------------------------------------------------------------------------
"$PAWL" tail 2>"$tmp/err"; expect_rc "tail before init: no schema" 5 $?
grep -q 'pawl init' "$tmp/err"; check "hint to run pawl init" $?
"$PAWL" init >"$tmp/out"; expect_rc "init" 0 $?
"$PAWL" init >"$tmp/out"; expect_rc "init again" 0 $?
grep -q 'up to date' "$tmp/out"; check "second init changes nothing" $?

# ---- append from stdin, tail -------------------------------------------------------------------
cat >"$tmp/events.jsonl" <<'JSON'
{"stream": "order-1", "type": "Placed", "payload": {"total": 12}, "metadata": {"by": "test"}}
{"stream": "order-2", "type": "Placed", "payload": "plain text"}

{"stream": "order-1", "type": "Paid", "payload": {"amount": 12}, "seq": 2}
{"stream": "order-1", "type": "Shipped"}
{"stream": "order-3", "type": "Placed"}
JSON
"$PAWL" append <"$tmp/events.jsonl" 2>"$tmp/err"; expect_rc "append 5 events from stdin" 0 $?
"$PAWL" tail --json >"$tmp/tail.jsonl"; expect_rc "tail --json" 0 $?
[ "$(wc -l <"$tmp/tail.jsonl")" -eq 5 ] &&
[ "$(jq -s 'map(.index) == [1,2,3,4,5]' "$tmp/tail.jsonl")" = true ] &&
[ "$(jq -s '[.[] | select(.stream == "order-1") | .seq] == [1,2,3]' "$tmp/tail.jsonl")" = true ] &&
[ "$(jq -r 'select(.index == 1) | .payload.total' "$tmp/tail.jsonl")" = 12 ] &&
[ "$(jq -r 'select(.index == 1) | .metadata.by' "$tmp/tail.jsonl")" = test ] &&
[ "$(jq -r 'select(.index == 2) | .payload' "$tmp/tail.jsonl")" = "plain text" ]
check "tail returns the events in order with streams, seqs, payloads" $?
"$PAWL" tail --from 3 --count 1 >"$tmp/t.txt"; grep -Eq '^4 .* order-1#3 +Shipped' "$tmp/t.txt"; check "tail --from --count, text form" $?

printf '{"stream":"x","type":"T"}\n{"stream":"x","type":"T"}\n{"stream":"x" "type":"T"}\n{"stream":"x","type":"T"}\n' |
    "$PAWL" append --events-per-append 10 2>"$tmp/err"; expect_rc "invalid line" 6 $?
grep -q 'line 3: not valid JSON' "$tmp/err"; check "the message names the line" $?
[ "$("$PAWL" tail --from 5 --json | wc -l)" -eq 2 ]; check "lines before the bad one were appended, none after" $?
echo '{"stream":"x","type":"T","seq":1}' | "$PAWL" append 2>"$tmp/err"; expect_rc "stream conflict" 7 $?
grep -qi 'conflict' "$tmp/err"; check "conflict reported" $?

# tail | append copies a log (index and appended_at are ignored on input)
"$PAWL" tail --json --count 2 | "$PAWL" append 2>/dev/null; expect_rc "tail --json | append: a conflict" 7 $?
"$PAWL" tail --json --count 2 | jq -c '.stream = "copy-" + .stream | del(.seq)' | "$PAWL" append 2>/dev/null
expect_rc "tail --json | append into other streams" 0 $?

# follow: a background tail waits for two new events
"$PAWL" tail --follow --from end --count 2 --json >"$tmp/follow.jsonl" 2>/dev/null &
bg=$!
sleep 1
printf '{"stream":"f","type":"A"}\n{"stream":"f","type":"B"}\n' | "$PAWL" append 2>/dev/null
for _ in $(seq 1 100); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
kill "$bg" 2>/dev/null # still waiting after 10 s: a failure, not a hang
wait "$bg"; rc=$?; bg=
expect_rc "tail --follow --count 2 ends" 0 $rc
[ "$(jq -r .type "$tmp/follow.jsonl" | tr '\n' ' ')" = "A B " ]; check "followed the new events" $?

# The finalizer on the log connections' loop (the default) and on a thread of its own: either
# way `append --wait` sees its events finalized, in order.
for place in "" --finalizer-own-thread; do
    printf '{"stream":"fp","type":"A"}\n{"stream":"fp","type":"B"}\n' |
        "$PAWL" append --wait --events-per-append 1 $place >"$tmp/fp.out" 2>"$tmp/fp.err"
    expect_rc "append --wait ${place:-(finalizer on the log loop)}" 0 $?
    i1=$(sed -n '1s/.*  index \([0-9][0-9]*\)$/\1/p' "$tmp/fp.out")
    i2=$(sed -n '2s/.*  index \([0-9][0-9]*\)$/\1/p' "$tmp/fp.out")
    [ -n "$i1" ] && [ -n "$i2" ] && [ "$i2" -gt "$i1" ]
    check "both lines finalized, in order ${place:-(finalizer on the log loop)}: $i1 $i2" $?
done
"$PAWL" config --finalizer-own-thread 2>/dev/null | grep -q 'finalizer.own.thread.*\(1\|true\|yes\|on\)'
check "config shows --finalizer-own-thread" $?

# Terminal injection: a stream id, type and payload with ESC, OSC (window title), CSI, CR, LF,
# NUL, DEL and a C1 control come out of `pawl tail` (text) escaped: no control byte but the
# newline ending the record, and one line per event.
printf '%s\n' '{"stream":"s\u001b]0;pwned\u0007\r\u001b[2Kx","type":"T\u001b[31m\r","payload":"\u001b]0;title\u0007 ok\rFAKE\n99 line\u0000\u009b\u007f\\end"}' |
    "$PAWL" append --wait >"$tmp/evil.out" 2>/dev/null; expect_rc "append an event with control characters" 0 $?
evil=$(sed -n 's/.*  index \([0-9][0-9]*\)$/\1/p' "$tmp/evil.out")
"$PAWL" tail --from $((evil - 1)) --count 1 >"$tmp/evil.txt"; expect_rc "tail it" 0 $?
[ "$(wc -l <"$tmp/evil.txt")" -eq 1 ] && [ "$(LC_ALL=C tr -d '\n' <"$tmp/evil.txt" | LC_ALL=C tr -d '\040-\176\200-\377' | wc -c)" -eq 0 ]
check "tail text: one line, no raw control byte (0x00-0x1f but the newline, 0x7f)" $?
grep -qF "$evil "' ' "$tmp/evil.txt" && grep -qF 's\x1b]0;pwned\x07\x0d\x1b[2Kx#1  T\x1b[31m\x0d  \x1b]0;title\x07 ok\x0dFAKE\x0a99 line\x00\u009b\x7f\\end' "$tmp/evil.txt"
check "tail text: stream id, type and payload escaped as pawl append shows them (\\xNN, \\u00NN, \\\\)" $?
grep -qF 's\x1b]0;pwned\x07\x0d\x1b[2Kx#1' "$tmp/evil.out"; check "append --wait shows the same escaped stream id" $?

# ---- metrics over loopback ------------------------------------------------------------------
port=$((20000 + RANDOM % 20000))
"$PAWL" append --generate --duration 4s --rate 300 --metrics-port $port --progress plain \
    --progress-interval 1s >/dev/null 2>"$tmp/gen.err" &
bg=$!
scrape() {
    exec 3<>"/dev/tcp/127.0.0.1/$port" || return 1
    printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
    cat <&3 >"$tmp/metrics.http"
    exec 3<&-
}
ok=1
for _ in $(seq 1 30); do sleep 0.3; scrape 2>/dev/null && grep -q 'pawl_appends_total [1-9]' "$tmp/metrics.http" && { ok=0; break; }; done
check "metrics endpoint answers with appends counted" $ok
grep >/dev/null '200 OK' <<<"$(head -1 "$tmp/metrics.http")" && grep -qi '^content-type: text/plain; version=0.0.4' "$tmp/metrics.http"
check "HTTP 200, Prometheus content type" $?
# Parse: every sample line is `name{labels} number`; histogram buckets are cumulative and end
# at +Inf == _count.
sed '1,/^\r$/d' "$tmp/metrics.http" >"$tmp/metrics.txt"
awk '
    /^#/ { next }
    /^$/ { next }
    {
        if (NF != 2 || $2 !~ /^-?[0-9.e+-]+$/) { print "bad line: " $0; bad = 1 }
        if ($1 ~ /_bucket\{le="/) {
            name = $1; sub(/_bucket.*/, "", name)
            if (name != cur) { cur = name; prev = 0 }
            if ($2 + 0 < prev) { print "not cumulative: " $0; bad = 1 }
            prev = $2 + 0
            if ($1 ~ /le="\+Inf"/) inf[name] = $2
        }
        if ($1 ~ /_count$/) { n = $1; sub(/_count$/, "", n); cnt[n] = $2 }
    }
    END {
        for (h in inf) if (inf[h] != cnt[h]) { print "+Inf != count for " h; bad = 1 }
        if (!("pawl_append_latency_seconds" in inf)) { print "no append latency histogram"; bad = 1 }
        exit bad
    }' "$tmp/metrics.txt"
check "Prometheus text parses; histograms consistent" $?
awk '$1 == "pawl_append_latency_seconds_count" && $2 > 0 { f = 1 } END { exit !f }' "$tmp/metrics.txt"
check "append latency recorded" $?
grep -q '^pawl_store_append_retries_total [0-9][0-9]*$' "$tmp/metrics.txt"
check "append re-runs exported" $?
for _ in $(seq 1 200); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
kill "$bg" 2>/dev/null
wait "$bg"; rc=$?; bg=
expect_rc "append --generate" 0 $rc
grep -q '^\[[0-9]*s\] .*events/s' "$tmp/gen.err"; check "plain progress lines when not a terminal" $?

# ---- the embedded default and password redaction ------------------------------------------------
( cd "${PAWL_SOURCE_DIR:-.}" && env -u PAWL_DSN "$PAWL" init >/dev/null 2>"$tmp/err" ); expect_rc "init on the embedded default" 0 $?
! grep -q 'private PostgreSQL' "$tmp/err"; check "embedded default, running already: not announced" $?
( cd "${PAWL_SOURCE_DIR:-.}" && env -u PAWL_DSN "$PAWL" init --log-level debug >/dev/null 2>"$tmp/err" )
[ "$(grep -c 'no --dsn or PAWL_DSN: the private PostgreSQL at' "$tmp/err")" -eq 1 ]
check "embedded default named once at debug" $?
"$PAWL" tail --dsn "host=/nonexistent-dir dbname=x user=u password=s3cretpw connect_timeout=2" \
    --open-timeout 2s 2>"$tmp/err"; rc=$?
[ $rc -eq 3 ]; check "unreachable database: exit 3 (got $rc)" $?
! grep -q 's3cretpw' "$tmp/err"; check "password never printed" $?
"$PAWL" config --dsn "host=/x password=s3cretpw" >"$tmp/cfg.txt"; ! grep -q 's3cretpw' "$tmp/cfg.txt"
check "config hides the password" $?

# ---- logging: level and JSON format; no password in log lines ----------------------------------
"$PAWL" tail --count 1 --log-level debug --log-format json \
    --dsn "$PAWL_DSN password=s3cretpw" >/dev/null 2>"$tmp/log.jsonl"
grep -q '^{' "$tmp/log.jsonl" && grep '^{' "$tmp/log.jsonl" | jq -e -s 'length > 0 and all(.[]; .ts and .level and .module and .msg)' >/dev/null &&
    grep -q '"level":"debug"' "$tmp/log.jsonl" && ! grep -q s3cretpw "$tmp/log.jsonl"
check "--log-format json: JSON lines at --log-level debug, password redacted" $?
PAWL_LOG_LEVEL=error "$PAWL" tail --count 1 --log-format json --dsn "$PAWL_DSN" >/dev/null 2>"$tmp/log2"
! grep -q '"level":"debug"' "$tmp/log2"; check "PAWL_LOG_LEVEL=error silences debug lines" $?

# ---- demo ---------------------------------------------------------------------------------
"$PAWL" demo --duration 2s --rate 200 --progress plain --progress-interval 500ms >"$tmp/demo.out" 2>"$tmp/demo.err"
expect_rc "demo" 0 $?
grep -q 'pawl demo summary' "$tmp/demo.out" && grep -q 'end-to-end lag' "$tmp/demo.out" &&
    grep -q 'finalize delay p50' "$tmp/demo.err"; check "demo prints progress and a summary" $?

# ---- bench (one short cell) ------------------------------------------------------------------
"$PAWL" bench --duration 1s --events-per-append 10 --appenders 1 --csv "$tmp/bench.csv" \
    --progress off >"$tmp/bench.out" 2>/dev/null
expect_rc "bench" 0 $?
[ "$(wc -l <"$tmp/bench.csv")" -eq 2 ] && grep >/dev/null '^events_per_append,appenders,' <<<"$(head -1 "$tmp/bench.csv")" &&
    awk -F, 'NR == 2 && $1 == 10 && $2 == 1 && $5 > 0 { ok = 1 } END { exit !ok }' "$tmp/bench.csv"
check "bench writes one CSV row per cell" $?

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
