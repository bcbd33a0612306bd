#!/usr/bin/env bash
# native_append.sh [ROUNDS] [SECONDS]: what an append costs the server on each server path,
# against a plain INSERT of the same rows, side by side. Two fresh databases of the private
# PostgreSQL, one per path (`pawl init --server-path native|sql`); in the native one, the table
# bench_insert.events, made LIKE the newest partition of pawl.events (its columns, constraints,
# defaults and every index: primary key, stream key, event id, category), for the baseline. Per
# round, `pgbench -n -M prepared -c 1 -T SECONDS` of four scripts on each of three targets,
# alternated:
#   a1   = one event on a random stream of 100,000        (pawl.append, as the library calls it)
#   a100 = 100 events on 100 random streams, one each     (the same)
#   i1, i100 = the same rows by INSERT INTO bench_insert.events (xid from pg_current_xact_id(),
#          sequence numbers from a sequence: the row shape and indexes, none of the checks), with
#          the category run the native append writes (schema 18: the 100 rows of one category
#          are one run, one entry of the category index); the SQL path writes every row alone,
#          so its ratio also counts the 99 index entries it does not save
# Prints each cell's backend CPU per transaction, read from /proc/PID/schedstat, and at the end
# the medians per event and the ratios native/INSERT and sql/INSERT (targets: native <= 1.2 at 1
# and at 100 events). The finalizer does not run: this is the append's own cost. Needs
# pawl_native installed (make native, as root), or PAWL_NATIVE_LIB=/path/pawl_native.so (a build
# used where it is, through activate.sql; a superuser login).
set -uo pipefail
ROUNDS=${1:-3}
T=${2:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/bench/lib.sh"
PAWL=${PAWL:-$here/build/bin/pawl}
B=$("$here/tools/pawl-pg" dsn) || exit 1
w=$(mktemp -d)
trap 'rm -rf "$w"; for d in an_$$ as_$$; do psql "$B" -Xqc "DROP DATABASE IF EXISTS $d" >/dev/null 2>&1; done' EXIT
for d in an_$$ as_$$; do psql "$B" -Xqc "CREATE DATABASE $d" >/dev/null || exit 1; done
if [ -n "${PAWL_NATIVE_LIB:-}" ]; then
    # A build not installed: the SQL path, then activate.sql with its path for $libdir's.
    PAWL_DSN="$B dbname=an_$$" "$PAWL" init --server-path sql >/dev/null 2>&1 || exit 1
    sed "s#\$libdir/pawl_native#$PAWL_NATIVE_LIB#g" "$here/sql/native/activate.sql" |
        psql "$B dbname=an_$$" -Xq -v ON_ERROR_STOP=1 >/dev/null || exit 1
else
    PAWL_DSN="$B dbname=an_$$" "$PAWL" init --server-path native >/dev/null 2>&1 ||
        { echo "native path not available"; exit 1; }
fi
PAWL_DSN="$B dbname=as_$$" "$PAWL" init --server-path sql >/dev/null 2>&1 || exit 1
bench_insert_twin "$B dbname=an_$$" || exit 1
cat >"$w/a1.sql" <<'EOF'
\set s random(1, 100000)
SELECT * FROM pawl.append(ARRAY['acct-' || :s], '{0}', '{1}', '{1}', '{Deposited}', '{"\\x7b7d"}', NULL, false, NULL);
EOF
cat >"$w/a100.sql" <<'EOF'
\set s random(1, 100000)
SELECT * FROM pawl.append(ARRAY(SELECT 'acct-' || (:s + 1000 * i) FROM generate_series(1, 100) i), array_fill(0::int8, ARRAY[100]), ARRAY(SELECT generate_series(1, 100)), array_fill(1, ARRAY[100]), array_fill('Deposited'::text, ARRAY[100]), array_fill('\x7b7d'::bytea, ARRAY[100]), NULL, false, NULL);
EOF
cat >"$w/i1.sql" <<'EOF'
\set s random(1, 100000)
INSERT INTO bench_insert.events (xid, stream_seq, k, n, stream_id, type, payload, ticket) VALUES (pg_current_xact_id(), nextval('bench_insert.seq'), 0, 1, 'acct-' || :s, 'Deposited', '\x7b7d', 1);
EOF
cat >"$w/i100.sql" <<'EOF'
\set s random(1, 100000)
INSERT INTO bench_insert.events (xid, stream_seq, k, n, stream_id, type, payload, ticket, cat_run) SELECT pg_current_xact_id(), nextval('bench_insert.seq'), i - 1, 100, 'acct-' || (:s + 1000 * i), 'Deposited', '\x7b7d', CASE WHEN i = 1 THEN 1 END, CASE WHEN i = 1 THEN 100 ELSE 0 END FROM generate_series(1, 100) i;
EOF
one() { # DB SCRIPT: "wall_us cpu_us_per_txn txns"
    local db=$1 s=$2 pid="" c0 last t i
    pgbench -n -M prepared -c 1 -T "$T" -f "$w/$s.sql" "$B dbname=$db application_name=na_$db" >"$w/out" 2>&1 &
    local pg=$!
    for ((i = 0; i < 200 && ${#pid} == 0; i++)); do
        pid=$(psql "$B dbname=$db" -XqAtc "SELECT pid FROM pg_stat_activity WHERE application_name = 'na_$db'")
    done
    c0=$(cut -d' ' -f1 /proc/$pid/schedstat 2>/dev/null)
    [ -n "$c0" ] || { wait $pg; echo "nan nan 0"; return; }
    last=$c0
    while t=$(cut -d' ' -f1 /proc/$pid/schedstat 2>/dev/null) && [ -n "$t" ]; do last=$t; sleep 0.05; done
    wait $pg
    awk -v c="$((last - c0))" '/latency average/ { l = $4 } /actually processed/ { n = $NF }
        END { if (n > 0) printf "%8.1f %8.1f %7d", l * 1000, c / 1000 / n, n; else printf "nan nan 0" }' "$w/out"
}
echo "# bench/native_append.sh $ROUNDS $T: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(psql "$B" -XqAtc "SELECT 'fsync=' || current_setting('fsync') || ' synchronous_commit=' || current_setting('synchronous_commit')")"
printf '%-5s %-7s %-5s %8s %8s %7s\n' round path script wall_us cpu_us txns | tee "$w/all"
for r in $(seq 1 "$ROUNDS"); do
    for s in 1 100; do
        printf '%-5s %-7s %-5s %s\n' "$r" native "a$s" "$(one an_$$ a$s)"
        printf '%-5s %-7s %-5s %s\n' "$r" sql "a$s" "$(one as_$$ a$s)"
        printf '%-5s %-7s %-5s %s\n' "$r" insert "i$s" "$(one an_$$ i$s)"
    done
done | tee -a "$w/all"
med() { grep -E '^-?[0-9.]+$' | sort -n | awk '{ v[NR] = $1 } END { printf "%.2f", v[int((NR + 1) / 2)] }'; }
for s in 1 100; do
    ins=$(awk -v s="i$s" -v e=$s '$3 == s && $5 != "nan" { print $5 / e }' "$w/all" | med)
    for path in native sql; do
        v=$(awk -v p=$path -v s="a$s" -v e=$s '$2 == p && $3 == s && $5 != "nan" { print $5 / e }' "$w/all" | med)
        # The ratio per round (same round's INSERT), then its median: rounds share the noise.
        r=$(awk -v p=$path -v a="a$s" -v i="i$s" '$5 == "nan" { next } $2 == p && $3 == a { x[$1] = $5 }
                $2 == "insert" && $3 == i { y[$1] = $5 } END { for (k in x) if (k in y) print x[k] / y[k] }' "$w/all" | med)
        echo "$s-event appends, $path: $v us of backend CPU per event (INSERT $ins); $path/INSERT per round, median $r ($ROUNDS rounds)"
    done
done
