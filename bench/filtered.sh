#!/usr/bin/env bash
# filtered.sh [EVENTS] [ROUNDS]: what filtered and stream reads (schema 16) cost and save, side
# by side on the private PostgreSQL. Writes bench/results/filtered.txt.
#
#   catch-up   a log of EVENTS (default 5,000,000) in 100 categories ("c0".."c99", 1,000 streams
#              each, 10 event types), 100 events per append. Per round, alternated: the events
#              of one category (1%) read to the end through the library's filtered read
#              (`pawl tail --category`, a process of its own), and through a processor (`pawl
#              run --category`, count handler, from its 4 segments' claims until their tokens
#              reach the head); the whole log through a processor without a filter; and the same
#              1% as a plain indexed SELECT fetched by psql (a process of its own).
#   stream     one stream's 100 events (streams of category "hot" hold 200 each): pgbench of
#              SELECT * FROM pawl_api.read_stream(s, 0, 100) against a SELECT of the same columns
#              but the global index ... WHERE stream_id = s ORDER BY stream_seq LIMIT 100 (the
#              (stream_id, stream_seq) index), same connection count, both sending their rows;
#              and each under count(*);
#              on the native path also the SQL version (sql/native/deactivate.sql's text, as
#              bench_sql.read_stream) in the same rounds.
#   append     pgbench of pawl.append (1 and 100 events) in a database with the category index
#              and in one without it: the backend's CPU per event, alternated.
# Ratios are of medians over ROUNDS (default 3); the machine is shared, so read the ranges too.
# PARTS (default "catchup stream append") picks the parts (the file says which ran). The server
# functions are those `pawl init` chooses (native where the server has this pawl's pawl_native);
# PAWL_NATIVE_LIB=/path/pawl_native.so uses that build where it is (the SQL path, then
# sql/native/activate.sql with its path for $libdir's; a superuser login). The file names the path.
set -uo pipefail
EVENTS=${1:-5000000}
ROUNDS=${2:-3}
T=${T:-5}
PARTS=${PARTS:-catchup stream append}
part() { [[ " $PARTS " == *" $1 "* ]]; }
here=$(cd "$(dirname "$0")/.." && pwd)
PAWL=${PAWL:-$here/build/bin/pawl}
B=$("$here/tools/pawl-pg" dsn) || exit 1
db=bfl_$$
dbx=bflx_$$
w=$(mktemp -d)
out=${OUT:-$here/bench/results/filtered.txt}
trap 'rm -rf "$w"; psql "$B" -Xqc "DROP DATABASE IF EXISTS $db" -c "DROP DATABASE IF EXISTS $dbx" >/dev/null 2>&1' EXIT
D="$B dbname=$db"
for d in $db $dbx; do
    psql "$B" -Xqc "CREATE DATABASE $d" >/dev/null || exit 1
    if [ -n "${PAWL_NATIVE_LIB:-}" ]; then
        PAWL_DSN="$B dbname=$d" "$PAWL" init -q --server-path sql >/dev/null 2>&1 ||
            { echo "pawl init failed"; exit 1; }
        sed "s#\$libdir/pawl_native#$PAWL_NATIVE_LIB#g" "$here/sql/native/activate.sql" |
            psql "$B dbname=$d" -Xq -v ON_ERROR_STOP=1 >/dev/null || exit 1
    else
        PAWL_DSN="$B dbname=$d" "$PAWL" init -q >/dev/null 2>&1 || { echo "pawl init failed"; exit 1; }
    fi
done
# The server path the reads take: the language of pawl_api.read_filtered.
path=$(psql "$B dbname=$db" -XqAtc "SELECT CASE l.lanname WHEN 'c' THEN 'native' ELSE 'SQL' END
    FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
    WHERE p.oid = 'pawl_api.read_filtered(int8, int4, text[], text[], text[])'::regprocedure")
if [ "$path" = native ]; then
    # The SQL stream read beside the C one, for the stream part.
    { echo "CREATE SCHEMA bench_sql;"
      awk '/^CREATE OR REPLACE FUNCTION pawl_api.read_stream\(/ { on = 1 } on { print } on && /^\$fn\$;/ { exit }' \
          "$here/sql/native/deactivate.sql" | sed '1s/pawl_api\.read_stream(/bench_sql.read_stream(/'
    } | psql "$B dbname=$db" -Xq -v ON_ERROR_STOP=1 >/dev/null || exit 1
fi
psql "$B dbname=$dbx" -Xqc "DROP INDEX pawl.events_category_idx" ||
    exit 1

# ---- the log: a procedure appends and finalizes, one transaction per append -----------------
psql "$D" -Xq -v ON_ERROR_STOP=1 <<'SQL' || exit 1
CREATE PROCEDURE public.bench_fill(appends int, per int, hot boolean)
LANGUAGE plpgsql AS $$
DECLARE
    s text[];
    t text[];
BEGIN
    FOR a IN 1 .. appends LOOP
        IF hot THEN
            s := ARRAY(SELECT 'hot-' || (a % 100) FROM generate_series(1, per));
        ELSE
            s := ARRAY(SELECT 'c' || (random() * 99)::int || '-' || (random() * 999)::int
                         FROM generate_series(1, per));
        END IF;
        t := ARRAY(SELECT 'T' || (random() * 9)::int FROM generate_series(1, per));
        PERFORM pawl_api.append_batch(s, t, array_fill('\x7b2261223a317d'::bytea, ARRAY[per]));
        COMMIT;
        IF a % 20 = 0 OR a = appends THEN
            PERFORM pawl.finalize(2000);
            COMMIT;
        END IF;
    END LOOP;
END
$$;
SQL
start=$(date +%s)
part catchup || EVENTS=100
psql "$D" -Xq -c "SET synchronous_commit = on" -c "CALL public.bench_fill($((EVENTS / 100)), 100, false)" ||
    exit 1
psql "$D" -Xq -c "CALL public.bench_fill(200, 100, true)" || exit 1
psql "$D" -Xq -c "VACUUM ANALYZE pawl.events" -c "VACUUM ANALYZE pawl.runs" >/dev/null
head=$(psql "$D" -XqAtc "SELECT pawl_api.last_index()")
fill_s=$(($(date +%s) - start))

now() { date +%s.%N; }
# Seconds from the moment processor NAME's node has claimed its 4 segments until their tokens
# all reach the head (polled every 20 ms): the catch-up, without the node's start-up.
run_until_head() {
    local name=$1
    shift
    local t0 t1
    PAWL_DSN="$D" "$PAWL" run "$name" -q --handler count --progress off --segments 4 --claim-poll 100ms "$@" >/dev/null 2>&1 &
    local pid=$!
    while [ "$(psql "$D" -XqAtc "SELECT count(owner) FROM pawl.tokens WHERE processor = '$name'")" != 4 ]; do
        kill -0 $pid 2>/dev/null || { echo "nan"; return; }
        sleep 0.02
    done
    t0=$(now)
    while :; do
        m=$(psql "$D" -XqAtc "SELECT coalesce(min(token), -1) FROM pawl.tokens WHERE processor = '$name'")
        [ "$m" = "$head" ] && break
        kill -0 $pid 2>/dev/null || { echo "nan"; return; }
        sleep 0.02
    done
    t1=$(now)
    kill -INT $pid
    wait $pid
    PAWL_DSN="$D" "$PAWL" delete "$name" --execute -q >/dev/null 2>&1
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'
}
timed() { # CMD...: seconds
    local t0 t1
    t0=$(now)
    "$@" >/dev/null 2>&1
    t1=$(now)
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'
}

{
    echo "# PARTS=\"$PARTS\" T=$T bench/filtered.sh $EVENTS $ROUNDS, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
    echo "# server functions: $path${PAWL_NATIVE_LIB:+ (PAWL_NATIVE_LIB, pawl_native built from this tree)}"
    echo "# log: $head events (fill and finalize $fill_s s); category c7 holds $(psql "$D" -XqAtc "SELECT count(*) FROM pawl.events e WHERE pawl.category(e.stream_id) = 'c7'")"
    printf '%-6s %-22s %10s\n' round cell seconds
} | tee "$w/head"
: >"$w/catchup"
part catchup && for r in $(seq 1 "$ROUNDS"); do
    c=$((r % 90 + 3)) # a different category each round: no round reads what the last one cached
    printf '%-6s %-22s %10s\n' "$r" tail_filtered "$(timed env PAWL_DSN="$D" "$PAWL" tail -q --category c$c)"
    printf '%-6s %-22s %10s\n' "$r" select_plain "$(timed psql "$D" -XqAt -o /dev/null -c "SELECT e.* FROM pawl.events e WHERE pawl.category(e.stream_id) = 'c$c' ORDER BY e.xid, e.k")"
    # The server's part alone: the same SELECT counted in the server, and the filtered reads a
    # processor makes (1000 events per call, from each position row) paged in the server.
    printf '%-6s %-22s %10s\n' "$r" select_server "$(timed psql "$D" -XqAt -o /dev/null -c "SELECT count(*) FROM (SELECT e.* FROM pawl.events e WHERE pawl.category(e.stream_id) = 'c$((c + 1))' ORDER BY e.xid, e.k) x")"
    printf '%-6s %-22s %10s\n' "$r" read_server "$(timed psql "$D" -XqAt -o /dev/null -c "DO \$\$DECLARE pos int8 := 0; np int8; head int8 := pawl_api.last_index(); BEGIN LOOP SELECT max(global_index) FILTER (WHERE stream_id IS NULL) INTO np FROM pawl_api.read_filtered(pos, 1000, ARRAY['c$((c + 2))']); EXIT WHEN np >= head; pos := np; END LOOP; END\$\$")"
    printf '%-6s %-22s %10s\n' "$r" processor_filtered "$(run_until_head pf$r --category c$c)"
    printf '%-6s %-22s %10s\n' "$r" processor_all "$(run_until_head pa$r)"
done | tee "$w/catchup"

# ---- stream reads ----------------------------------------------------------------------------
# Each read sends its 100 rows to the client, as a reader of the stream gets them; the counted
# pair (count(*) around each) sends one row, and lets the SELECT be an index-only scan that never
# reads the events themselves: what the server alone spends, reported beside the target.
sq() { printf '\\set s random(0, 99)\n%s\n' "$1" >"$w/$2.sql"; }
sq "SELECT * FROM pawl_api.read_stream('hot-' || :s, 0, 100);" rs
sq "SELECT e.stream_id, e.stream_seq, e.type, e.payload, e.metadata, e.appended_at, e.event_id FROM pawl.events e WHERE e.stream_id = 'hot-' || :s ORDER BY e.stream_seq LIMIT 100;" sel
sq "SELECT * FROM bench_sql.read_stream('hot-' || :s, 0, 100);" rs_sql
sq "SELECT count(*) FROM pawl_api.read_stream('hot-' || :s, 0, 100);" rsc
sq "SELECT count(*) FROM (SELECT * FROM pawl.events e WHERE e.stream_id = 'hot-' || :s ORDER BY e.stream_seq LIMIT 100) x;" selc
streams="rs sel rsc selc"
[ "$path" = native ] && streams="rs sel rs_sql rsc selc"
: >"$w/stream"
part stream && for r in $(seq 1 "$ROUNDS"); do
    for v in $streams; do
        l=$(pgbench -n -M prepared -c 1 -T "$T" -f "$w/$v.sql" "$D" 2>/dev/null | awk '/latency average/ { print $4 }')
        printf '%-6s %-22s %10s\n' "$r" "stream_$v" "$l"
    done
done | tee "$w/stream"

# ---- append cost with and without the filters' indexes --------------------------------------
for n in 1 100; do
    printf '\\set r random(1, 1000000000)\nSELECT a.appended FROM pawl.append(ARRAY['"'"'c'"'"' || (:r %% 100) || '"'"'-'"'"' || (:r %% 1000)], ARRAY[0::int8], array_fill(1, ARRAY[%s]), ARRAY(SELECT generate_series(1, %s)), array_fill('"'"'T1'"'"'::text, ARRAY[%s]), array_fill('"'"'\\x0102030405060708'"'"'::bytea, ARRAY[%s]), NULL, false, NULL) a;\n' $n $n $n $n >"$w/ap$n.sql"
done
cpu_per_event() { # DB N: backend CPU µs per event over T seconds of pgbench
    local d=$1 n=$2 pid="" c0 last t i
    pgbench -n -M prepared -c 1 -T "$T" -f "$w/ap$n.sql" "$B dbname=$d application_name=bfl_$$" >"$w/pg" 2>&1 &
    local pg=$!
    for ((i = 0; i < 200 && ${#pid} == 0; i++)); do
        pid=$(psql "$B dbname=$d" -XqAtc "SELECT pid FROM pg_stat_activity WHERE application_name = 'bfl_$$'")
    done
    c0=$(cut -d' ' -f1 /proc/$pid/schedstat 2>/dev/null)
    # A backend that ended before its first reading gives no figure (nan: left out below).
    [ -n "$c0" ] || { wait $pg; printf nan; return; }
    last=$c0
    while t=$(cut -d' ' -f1 /proc/$pid/schedstat 2>/dev/null) && [ -n "$t" ]; do last=$t; sleep 0.02; done
    wait $pg
    awk -v c="$((last - c0))" -v n="$n" '/actually processed/ { k = $NF }
        END { if (k > 0) printf "%.2f", c / 1000 / k / n; else printf "nan" }' "$w/pg"
}
: >"$w/append"
part append && for r in $(seq 1 "$ROUNDS"); do
    for n in 1 100; do
        printf '%-6s %-22s %10s\n' "$r" "append${n}_with" "$(cpu_per_event $db $n)"
        printf '%-6s %-22s %10s\n' "$r" "append${n}_without" "$(cpu_per_event $dbx $n)"
    done
done | tee "$w/append"

med() { awk -v k="$1" '$2 == k && $3 != "nan" { print $3 }' "$2" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
{
    echo
    echo "# medians (seconds; stream: ms per read; append: backend CPU µs per event)"
    for k in tail_filtered select_plain select_server read_server processor_filtered processor_all stream_rs stream_sel stream_rs_sql stream_rsc stream_selc append1_with append1_without append100_with append100_without; do
        [ "$k" = stream_rs_sql ] && [ "$path" != native ] && continue
        f=$w/catchup
        case $k in stream_*) f=$w/stream ;; append*) f=$w/append ;; esac
        printf '%-22s %10s\n' "$k" "$(med $k "$f")"
    done
    pf=$(med processor_filtered "$w/catchup")
    echo
    echo "processor catch-up, unfiltered / filtered (1%):   $(ratio "$(med processor_all "$w/catchup")" "$pf")x  (target >= 20)"
    echo "plain indexed SELECT / filtered processor:        $(ratio "$(med select_plain "$w/catchup")" "$pf")  (target >= 0.8)"
    echo "plain indexed SELECT / filtered tail:             $(ratio "$(med select_plain "$w/catchup")" "$(med tail_filtered "$w/catchup")")"
    echo "in the server: SELECT counted / filtered reads:   $(ratio "$(med select_server "$w/catchup")" "$(med read_server "$w/catchup")")"
    echo "stream read / SELECT on (stream_id, stream_seq), 100 rows to the client:  $(ratio "$(med stream_rs "$w/stream")" "$(med stream_sel "$w/stream")")  (target <= 1.2)"
    [ "$path" = native ] &&
        echo "SQL stream read / SELECT (same rounds):           $(ratio "$(med stream_rs_sql "$w/stream")" "$(med stream_sel "$w/stream")")"
    echo "stream read / SELECT, each counted in the server (index-only SELECT):  $(ratio "$(med stream_rsc "$w/stream")" "$(med stream_selc "$w/stream")")"
    for n in 1 100; do
        # The ratio per round (the two databases ran next to each other), then its median.
        rr=$(awk -v a="append${n}_with" -v b="append${n}_without" '$3 == "nan" { next }
                $2 == a { x[$1] = $3 } $2 == b { y[$1] = $3 }
                END { for (r in x) if ((r in y) && y[r] > 0) print "r", "q", x[r] / y[r] }' "$w/append" |
            med q /dev/stdin)
        printf 'append CPU with / without the filter indexes, %3s event(s): %s (medians), %.2f (median of the rounds'"'"' ratios)  (target <= 1.05)\n' \
            "$n" "$(ratio "$(med append${n}_with "$w/append")" "$(med append${n}_without "$w/append")")" "${rr:-0}"
    done
} | tee "$w/summary"
if [ -z "${NO_SAVE:-}" ]; then
    cat "$w/head" "$w/catchup" "$w/stream" "$w/append" "$w/summary" >"$out"
    echo "written: $out"
fi
