#!/usr/bin/env bash
# test_native_read.sh — the native pawl_api.read (sql/native, pawl_read) keeps the SQL version's
# contract. Builds and installs the extension from a copy of sql/native (nothing is written to
# the source tree), makes a database with `pawl init` (native path), and keeps the SQL version
# beside the C one under another name (t.read_sql, the text of sql/native/deactivate.sql), so
# that both read the same log under the same snapshot:
#   (a) the switch: pawl_api.read is the C function (no SET clauses, not SECURITY DEFINER), the
#       grants survive activate.sql and deactivate.sql, and deactivate.sql restores exactly the
#       definition of a database that never left the SQL path;
#   (b) a log of multi-event appends from two concurrent writers (rolled-back appends, runs of
#       several rows, toasted payloads, NULL metadata and ids, two rotations, an unfinalized
#       tail): the same rows in the same order, or the same error (SQLSTATE, message, detail,
#       hint), for edge and random (after_index, max_events), bad arguments included; the rows
#       are after_index + 1 .. after_index + count;
#   (c) retention: reads below the low-watermark fail with PW020 alike; a drop that commits while
#       a read waits for its lock is caught by the re-check after the query, on both;
#   (d) snapshots and contexts: REPEATABLE READ, the caller's own finalization, cursors,
#       the target list, LATERAL;
#   (e) rights: a reader with SELECT on pawl.events and pawl.runs (or on the columns read) and
#       EXECUTE reads; without SELECT, EXECUTE on first_index or USAGE, the same errors;
#   (f) malformed declarations and calls, odd ledgers (NULL elements, arrays of different
#       lengths or shapes, an int8 overflow, overlapping appends), cancellation: errors, never a
#       crash of the backend (the postmaster's start time is unchanged and the session answers).
# Skips (77) when pg_config, the server headers or write access to the server's library folder
# are missing. KEEP_TMP=1 keeps the work folder.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
SRC=${PAWL_SOURCE_DIR:?run through ctest}
PG_CONFIG=${PG_CONFIG:-pg_config}
for c in psql make cc; do
    command -v "$c" >/dev/null || { echo "SKIP: $c is not installed"; exit 77; }
done
command -v "$PG_CONFIG" >/dev/null ||
    { echo "SKIP: pg_config not found (apt-get install postgresql-server-dev-15)"; exit 77; }
[ -f "$("$PG_CONFIG" --includedir-server)/postgres.h" ] ||
    { echo "SKIP: PostgreSQL server headers missing (apt-get install postgresql-server-dev-15)"; exit 77; }
libdir=$("$PG_CONFIG" --pkglibdir)
[ -w "$libdir" ] || { echo "SKIP: cannot install into $libdir (needs root)"; exit 77; }
srv=$(psql "$BASE_DSN" -XqAtc "SELECT current_setting('server_version_num')::int / 10000") ||
    { echo "FAIL cannot reach the test server"; exit 1; }
cfg=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
[ "$srv" = "$cfg" ] ||
    { echo "SKIP: the server is PostgreSQL $srv, pg_config describes $cfg"; exit 77; }

tmp=$(mktemp -d)
db=t_nread_$$
dbs=t_nread_s_$$
role=t_nread_r_$$
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    for d in $db $dbs; do
        psql "$BASE_DSN" -XqAtc "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1
    done
    psql "$BASE_DSN" -XqAtc "DROP ROLE IF EXISTS $role" >/dev/null 2>&1
    [ -n "${KEEP_TMP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT
DSN="$BASE_DSN dbname=$db"
DSN_S="$BASE_DSN dbname=$dbs"
export PAWL_LOG_LEVEL=warn PAWL_PROGRESS=off

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
q() { psql "$DSN" -XqAt -v ON_ERROR_STOP=1 -c "$1"; }
# expect NAME WANT GOT
expect() {
    if [ "$2" = "$3" ]; then echo "ok   $1"; else
        echo "FAIL $1"; echo "  want: $2" | head -5; echo "  got:  $3" | head -5; fails=$((fails + 1)); fi
}

# --- Build and install -----------------------------------------------------------------------
cp -r "$SRC/sql/native" "$tmp/native"
rm -f "$tmp/native"/*.o "$tmp/native"/*.so
if ! make -C "$tmp/native" PG_CONFIG="$PG_CONFIG" >"$tmp/build.log" 2>&1; then
    cat "$tmp/build.log"; echo "FAIL the extension builds (-Wall -Wextra -Werror)"; exit 1
fi
if ! make -C "$tmp/native" PG_CONFIG="$PG_CONFIG" install >"$tmp/install.log" 2>&1; then
    cat "$tmp/install.log"; echo "FAIL the extension installs"; exit 1
fi
check "the extension builds with -Wall -Wextra -Werror and installs into $libdir" 0

# --- (a) The switch --------------------------------------------------------------------------
for d in $db $dbs; do
    psql "$BASE_DSN" -XqAtc "DROP DATABASE IF EXISTS $d" && psql "$BASE_DSN" -XqAtc "CREATE DATABASE $d" ||
        exit 1
done
PAWL_DSN="$DSN" "$PAWL" init >"$tmp/init" 2>&1 || { cat "$tmp/init"; echo "FAIL pawl init"; exit 1; }
grep -q 'server functions: native' "$tmp/init"; check "pawl init takes the native path" $?
PGOPTIONS="-c pawl.server_path=sql" PAWL_DSN="$DSN_S" "$PAWL" init >/dev/null 2>&1 ||
    { echo "FAIL pawl init (SQL path)"; exit 1; }
fdef="SELECT l.lanname, p.prosecdef, p.proconfig, p.provolatile, p.proretset, p.proacl
        FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
       WHERE p.oid = 'pawl_api.read(int8, int4)'::regprocedure"
expect "pawl_api.read is the C function, STABLE, not SECURITY DEFINER, no SET clauses" \
    "c|f||s|t|" "$(q "$fdef")"
psql "$BASE_DSN" -XqAtc "CREATE ROLE $role LOGIN PASSWORD 'nread'" >/dev/null
q "REVOKE ALL ON FUNCTION pawl_api.read(int8, int4) FROM PUBLIC;
   GRANT EXECUTE ON FUNCTION pawl_api.read(int8, int4) TO $role" >/dev/null
acl=$(q "SELECT proacl FROM pg_proc WHERE oid = 'pawl_api.read(int8, int4)'::regprocedure")
psql "$DSN" -XqAt -v ON_ERROR_STOP=1 -f "$SRC/sql/native/deactivate.sql" >/dev/null
check "deactivate.sql" $?
expect "deactivate.sql keeps the grants ($acl)" "$acl" \
    "$(q "SELECT proacl FROM pg_proc WHERE oid = 'pawl_api.read(int8, int4)'::regprocedure")"
def() { psql "$1" -XqAtc "SELECT md5(pg_get_functiondef('pawl_api.read(int8, int4)'::regprocedure))"; }
expect "deactivate.sql restores the migrations' pawl_api.read exactly" "$(def "$DSN_S")" "$(def "$DSN")"
PAWL_DSN="$DSN" "$PAWL" status >"$tmp/status" 2>&1
PAWL_DSN="$DSN" "$PAWL" init >"$tmp/init2" 2>&1
grep -q 'server functions: native' "$tmp/init2"
check "pawl init switches a database whose read is SQL (the rest native) to native" $?
expect "native again: the C function, grants kept" "c|f||s|t|$acl" "$(q "$fdef")"
q "GRANT EXECUTE ON FUNCTION pawl_api.read(int8, int4) TO PUBLIC" >/dev/null

# The SQL version beside the C one, and a runner that returns rows or the error as text.
awk '/^CREATE OR REPLACE FUNCTION pawl_api.read\(/ { on = 1 } on { print } on && /^\$fn\$;/ { exit }' \
    "$SRC/sql/native/deactivate.sql" | sed '1s/pawl_api\.read(/t.read_sql(/' >"$tmp/read_sql.sql"
grep -q 'RETURN QUERY' "$tmp/read_sql.sql"; check "the SQL version is in deactivate.sql" $?
cat >"$tmp/helpers.sql" <<'EOF'
CREATE SCHEMA t;
GRANT USAGE ON SCHEMA t TO PUBLIC;
\i :read_sql
CREATE FUNCTION t.out(fn text, a int8, m int4) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r text; st text; msg text; det text; hnt text;
BEGIN
    EXECUTE format('SELECT count(*) || E''\n'' || coalesce(string_agg(x::text, E''\n'' ORDER BY x.ordinality), '''')'
                   ' FROM %s($1, $2) WITH ORDINALITY AS x', fn) INTO r USING a, m;
    RETURN r;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL,
                            hnt = PG_EXCEPTION_HINT;
    RETURN format('ERROR %s|%s|%s|%s', st, msg, det, hnt);
END $$;
-- Both versions on (a, m): NULL when they agree, else both answers.
CREATE FUNCTION t.diff(a int8, m int4) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    x text := t.out('pawl_api.read', a, m);
    y text := t.out('t.read_sql', a, m);
BEGIN
    IF x IS NOT DISTINCT FROM y THEN RETURN NULL; END IF;
    RETURN format('read(%s, %s): native %s ... / SQL %s ...', a, m, left(x, 300), left(y, 300));
END $$;
-- Native rows are after + 1 .. after + count, count = least(m, last - after).
CREATE FUNCTION t.contiguous(a int8, m int4) RETURNS boolean LANGUAGE sql AS $$
    SELECT count(*) = greatest(0, least(m, pawl_api.last_index() - a))
           AND coalesce(bool_and(r.global_index = a + o), true)
      FROM pawl_api.read(a, m) WITH ORDINALITY AS r(global_index, s, q, ty, p, md, at, id, o)
$$;
CREATE PROCEDURE t.fill(seed int, appends int, fin_every int) LANGUAGE plpgsql AS $$
DECLARE
    n int; s text[]; ty text[]; pl bytea[]; md jsonb[]; ids text[]; with_ids boolean;
BEGIN
    PERFORM setseed(seed / 1000.0);
    FOR i IN 1..appends LOOP
        n := 1 + floor(random() * 7)::int;
        with_ids := random() < 0.3;
        SELECT array_agg('s' || seed || '-' || floor(random() * 13)::int),
               array_agg('t' || j % 3),
               array_agg(CASE WHEN random() < 0.02
                              THEN convert_to(repeat(md5(i::text || j), 300), 'UTF8')
                              ELSE convert_to('{"i": ' || i || ', "j": ' || j || '}', 'UTF8') END),
               array_agg(CASE WHEN random() < 0.5 THEN NULL
                              ELSE jsonb_build_object('i', i, 'j', j) END),
               array_agg(CASE WHEN with_ids THEN format('id-%s-%s-%s', seed, i, j) END)
          INTO s, ty, pl, md, ids
          FROM generate_series(1, n) j;
        PERFORM pawl_api.append_batch(s, ty, pl, md, NULL, CASE WHEN with_ids THEN ids END);
        IF random() < 0.05 THEN ROLLBACK; ELSE COMMIT; END IF;
        IF i % fin_every = 0 THEN
            PERFORM pawl.finalize(1 + (i / fin_every) % 4);
            COMMIT;
        END IF;
    END LOOP;
END $$;
CREATE PROCEDURE t.finalize_all() LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        EXIT WHEN (SELECT f.appends FROM pawl.finalize(3) f) = 0;
        COMMIT;
    END LOOP;
END $$;
EOF
psql "$DSN" -XqAt -v ON_ERROR_STOP=1 -v read_sql="$tmp/read_sql.sql" -f "$tmp/helpers.sql" >/dev/null
check "helpers" $?

# --- (b) A log, and the same answers ---------------------------------------------------------
fill() { # fill APPENDS: two writers at once, then everything finalized
    psql "$DSN" -XqAt -v ON_ERROR_STOP=1 -c "CALL t.fill($((RANDOM % 900 + 1)), $1, 7)" >/dev/null &
    local p1=$!
    psql "$DSN" -XqAt -v ON_ERROR_STOP=1 -c "CALL t.fill($((RANDOM % 900 + 1)), $1, 5)" >/dev/null
    local r2=$?
    wait $p1; local r1=$?
    psql "$DSN" -XqAt -v ON_ERROR_STOP=1 -c "CALL t.finalize_all()" >/dev/null
    [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && [ $? -eq 0 ]
}
fill 150; check "fill, phase 1" $?
q "SELECT pawl.rotate()" >/dev/null; check "rotate 1" $?
w1=$(( $(q "SELECT pawl_api.last_index()") + 1 ))
fill 150; check "fill, phase 2" $?
q "SELECT pawl.rotate()" >/dev/null; check "rotate 2" $?
w2=$(( $(q "SELECT pawl_api.last_index()") + 1 ))
fill 150; check "fill, phase 3" $?
# An unfinalized tail: appended and committed, never finalized.
q "SELECT pawl_api.append_batch(ARRAY['tail', 'tail'], ARRAY['t', 't'], ARRAY['\\x01', '\\x02']::bytea[])" >/dev/null
last=$(q "SELECT pawl_api.last_index()")
nev=$(q "SELECT count(*) FROM pawl.events")
nruns=$(q "SELECT count(*) FROM pawl.runs")
nparts=$(q "SELECT count(*) FROM pg_inherits WHERE inhparent = 'pawl.events'::regclass")
nbig=$(q "SELECT count(*) FROM pawl.events WHERE octet_length(payload) > 4000")
[ "$last" -gt 1500 ] && [ "$nev" -gt "$last" ] && [ "$nruns" -gt 100 ] && [ "$nparts" -ge 3 ]
check "a log of $last finalized events ($nev rows), $nruns run rows, $nparts partitions, $nbig toasted payloads" $?

cases="SELECT a, m FROM (VALUES (0::int8, 1), (0, 1000), (0, 100000), (1, 1), ($last - 1, 1),
        ($last - 1, 5), ($last, 1), ($last, 100000), ($last + 7, 3), (9223372036854775807, 1),
        (9223372036854775806, 100000), (-1, 10), (-9223372036854775808, 10), (NULL, 10), (0, 0),
        (0, -1), (0, 100001), (0, NULL), (NULL, NULL), (5, 2147483647), (5, -2147483648)) v(a, m)"
expect "edge cases: the same rows or errors" "" "$(q "SELECT t.diff(a, m) FROM ($cases) c WHERE t.diff(a, m) IS NOT NULL LIMIT 3")"
rnd="SELECT (random() * ($last + 20))::int8 - 2 AS a,
            (ARRAY[1, 2, 3, 7, 10, 100, 1000, 2000, 100000])[1 + floor(random() * 9)::int] AS m
       FROM generate_series(1, 1500)"
expect "1500 random reads: the same rows in the same order" "" \
    "$(q "SELECT setseed(0.42); SELECT t.diff(a, m) FROM ($rnd) c WHERE t.diff(a, m) IS NOT NULL LIMIT 3" | tail -n +2)"
expect "native reads are after_index + 1 .. after_index + count" "0" \
    "$(q "SELECT setseed(0.7); SELECT count(*) FILTER (WHERE NOT t.contiguous(a, m)) FROM ($rnd) c WHERE a >= 0" | tail -1)"
expect "the unfinalized tail is not read" "0" \
    "$(q "SELECT count(*) FROM pawl_api.read($last - 3, 100) WHERE stream_id = 'tail'")"
expect "every finalized event once, toasted payloads whole" \
    "$(q "SELECT count(*), md5(string_agg(md5(e.payload), '' ORDER BY r.global_index)) FROM pawl_api.events r JOIN pawl.events e ON e.event_id IS NOT DISTINCT FROM r.event_id AND e.stream_id = r.stream_id AND e.stream_seq = r.stream_seq")" \
    "$(q "SELECT count(*), md5(string_agg(md5(r.payload), '' ORDER BY r.global_index)) FROM pawl_api.read(0, 100000) r")"
expect "the error texts" \
    "ERROR 22023|pawl_api.read: after_index must be >= 0||
ERROR 22023|pawl_api.read: max_events must be in 1..100000||" \
    "$(q "SELECT t.out('pawl_api.read', -1, 1) UNION ALL SELECT t.out('pawl_api.read', 0, 0)")"

# --- (c) Retention ---------------------------------------------------------------------------
# Which partitions lie wholly below w1, worked out from the events view and each row's table
# rather than from the runs as the drop does. Usually just the first: a transaction that another
# test holds open in the shared cluster across a rotate moves that partition's bound below it,
# so the second can hold only phase 1's tail and lie below w1 too.
below=$(q "SELECT count(*) FROM pawl.event_parts p WHERE p.hi IS NOT NULL AND NOT EXISTS (
             SELECT 1 FROM pawl.events e JOIN pawl_api.events v USING (stream_id, stream_seq)
              WHERE e.tableoid = format('pawl.%I', p.relname)::regclass AND v.global_index >= $w1)")
dropped=$(q "SELECT count(*) FROM pawl.retention_drop($w1)")
expect "retention drops the closed partitions wholly below the low-watermark $w1 ($below)" "$below" "$dropped"
[ "${below:-0}" -ge 1 ]; check "the first partition lies below the low-watermark $w1" $?
expect "reads around the low-watermark: the same rows or errors" "" \
    "$(q "SELECT t.diff(a, m) FROM (SELECT a, m FROM generate_series(0, $w1 + 2) a, (VALUES (1), (3), (1000)) v(m)) c WHERE t.diff(a, m) IS NOT NULL LIMIT 3")"
expect "below it: PW020, message, detail and hint" \
    "ERROR PW020|pawl: the log starts at index $w1 (retention dropped the events below it); cannot read after index 3|low_watermark=$w1 after_index=3|read from index $w1 on (after $((w1 - 1))), or reload the archive" \
    "$(q "SELECT t.out('pawl_api.read', 3, 10)")"
expect "random reads after retention" "" \
    "$(q "SELECT setseed(0.3); SELECT t.diff(a, m) FROM ($rnd) c WHERE t.diff(a, m) IS NOT NULL LIMIT 3" | tail -n +2)"

# A drop that commits while a read waits for its lock: the re-check after the query.
recheck() { # recheck FN AFTER W: a read after AFTER blocked by a drop to W; prints what it got
    psql "$DSN" -XqAt -c "BEGIN" -c "LOCK TABLE pawl.events IN ACCESS EXCLUSIVE MODE" \
        -c "SELECT pg_sleep(1.5)" -c "SELECT count(*) FROM pawl.retention_drop($3)" -c "COMMIT" \
        >/dev/null 2>&1 &
    local holder=$!
    sleep 0.5
    psql "$DSN" -XqAt -c "SELECT t.out('$1', $2, 10)"
    wait $holder
}
pw020() { # pw020 W AFTER: the PW020 answer of t.out
    echo "ERROR PW020|pawl: the log starts at index $1 (retention dropped the events below it); cannot read after index $2|low_watermark=$1 after_index=$2|read from index $1 on (after $(($1 - 1))), or reload the archive"
}
expect "SQL: a drop during the read is caught after the query" "$(pw020 "$w2" $((w1 - 1)))" \
    "$(recheck t.read_sql $((w1 - 1)) "$w2")"
w3=$((w2 + 5))
expect "native: a drop during the read is caught after the query" "$(pw020 "$w3" $((w2 - 1)))" \
    "$(recheck pawl_api.read $((w2 - 1)) "$w3")"
expect "and a read that starts after it fails before reading" "$(pw020 "$w3" $((w2 - 1)))" \
    "$(q "SELECT t.out('pawl_api.read', $w2 - 1, 10)")"

# --- (d) Snapshots and contexts --------------------------------------------------------------
psql "$DSN" -XqAt -v ON_ERROR_STOP=1 -c "CALL t.finalize_all()" >/dev/null
t0=$(q "SELECT pawl_api.last_index()")
out=$(psql "$DSN" -XqAt -v ON_ERROR_STOP=1 <<EOF
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*), max(global_index) FROM pawl_api.read($t0 - 5, 100);
\! psql "$DSN" -XqAt -c "SELECT pawl_api.append_batch(ARRAY['rr'], ARRAY['t'], ARRAY['\\\\x01']::bytea[])" -c "SELECT appends FROM pawl.finalize()" >/dev/null
SELECT count(*), max(global_index) FROM pawl_api.read($t0 - 5, 100);
SELECT t.diff($t0 - 5, 100) IS NULL;
COMMIT;
SELECT count(*), max(global_index) FROM pawl_api.read($t0 - 5, 100);
EOF
)
expect "REPEATABLE READ: the transaction's snapshot, on both" "5|$t0
5|$t0
t
6|$((t0 + 1))" "$out"
out=$(psql "$DSN" -XqAt -v ON_ERROR_STOP=1 <<EOF
BEGIN;
SELECT count(*) FROM pawl_api.append_batch(ARRAY['own', 'own'], ARRAY['t', 't'], ARRAY['\\x01', '\\x02']::bytea[]);
SELECT appends, events FROM pawl.finalize();
SELECT t.diff($t0 - 1, 100) IS NULL;
SELECT count(*) FROM pawl_api.read($t0 - 1, 100) WHERE stream_id = 'own';
COMMIT;
SELECT count(*) FROM pawl_api.read($t0 - 1, 100) WHERE stream_id = 'own';
SELECT appends, events FROM pawl.finalize();
SELECT count(*) FROM pawl_api.read($t0 - 1, 100) WHERE stream_id = 'own';
EOF
)
expect "the caller's own transaction: never its own run, the same as SQL" "2
0|0
t
0
0
1|2
2" "$out"
out=$(psql "$DSN" -XqAt -v ON_ERROR_STOP=1 <<EOF
BEGIN;
DECLARE c CURSOR FOR SELECT global_index FROM pawl_api.read($w3, 50);
FETCH 2 FROM c;
FETCH ABSOLUTE 50 FROM c;
COMMIT;
SELECT count(*) FROM (SELECT pawl_api.read($w3, 10)) x;
SELECT sum(n) FROM (SELECT (SELECT count(*) FROM pawl_api.read(a, 3)) n FROM generate_series($w3, $w3 + 9) a) x;
SELECT count(*) FROM generate_series($w3, $w3 + 9) a, LATERAL pawl_api.read(a, 3) r;
PREPARE p(int8, int4) AS SELECT count(*) FROM pawl_api.read(\$1, \$2);
EXECUTE p($w3, 7); EXECUTE p($w3, 8); EXECUTE p($w3, 9); EXECUTE p($w3, 10); EXECUTE p($w3, 11); EXECUTE p($w3, 12);
EOF
)
expect "cursor, target list, subquery, LATERAL, prepared" "$((w3 + 1))
$((w3 + 2))
$((w3 + 50))
10
30
30
7
8
9
10
11
12" "$out"

out=$(psql "$DSN" -XqAt -v ON_ERROR_STOP=1 <<EOF
CREATE TABLE t.res (n int8, s int8);
CREATE PROCEDURE t.loop_commit(a int8) LANGUAGE plpgsql AS \$\$
DECLARE
    r record; n int8 := 0; s int8 := 0;
BEGIN
    FOR r IN SELECT global_index FROM pawl_api.read(a, 100) LOOP
        n := n + 1; s := s + r.global_index;
        IF n % 10 = 0 THEN COMMIT; END IF;
    END LOOP;
    INSERT INTO t.res VALUES (n, s);
END \$\$;
CALL t.loop_commit($w3);
SELECT n, s FROM t.res;
BEGIN;
DECLARE h CURSOR WITH HOLD FOR SELECT global_index FROM pawl_api.read($w3, 50);
FETCH 2 FROM h;
COMMIT;
SELECT count(*) FROM pawl_api.read($w3, 1000);
FETCH 3 FROM h;
CLOSE h;
EOF
)
expect "a procedure committing inside a loop over a read; a holdable cursor across commits" "100|$((100 * w3 + 5050))
$((w3 + 1))
$((w3 + 2))
1000
$((w3 + 3))
$((w3 + 4))
$((w3 + 5))" "$out"
# The rows' memory (pawl_native's read_rows_begin): a backend keeps one block across reads and
# transactions, whatever their size.
out=$(psql "$DSN" -XqAt <<EOF 2>&1
SELECT count(*) FROM pawl_api.read($w3, 1000);
SELECT total_bytes <= 300000 FROM pg_backend_memory_contexts WHERE name = 'pawl_api.read rows';
SELECT count(*) > 1000 FROM pawl_api.read($w3, 100000);
SELECT total_bytes <= 300000 FROM pg_backend_memory_contexts WHERE name = 'pawl_api.read rows';
BEGIN;
SELECT count(*) > 1000 FROM pawl_api.read($w3, 100000);
SAVEPOINT a;
SELECT count(*) FROM pawl_api.read(0, 10);
ROLLBACK TO a;
SELECT count(*) > 1000 FROM pawl_api.read($w3, 100000);
COMMIT;
SELECT total_bytes <= 300000 FROM pg_backend_memory_contexts WHERE name = 'pawl_api.read rows';
EOF
)
expect "the rows' memory goes back to one block after each transaction" "1000
t
t
t
t
t
t" "$(grep -v 'ERROR\|^DETAIL\|^HINT' <<<"$out")"

# --- (e) Rights ------------------------------------------------------------------------------
RDSN="$DSN user=$role password=nread"
rq() { PGPASSWORD=nread psql "$RDSN" -XqAt -c "$1" 2>&1 | sed 's/^ERROR: *//; s/^psql:[^:]*: //'; }
cmp_role() { # cmp_role NAME: the reader's answers from both versions agree
    local a b
    a=$(rq "SELECT t.out('pawl_api.read', $w3, 20)")
    b=$(rq "SELECT t.out('t.read_sql', $w3, 20)")
    expect "$1 ($(head -c 60 <<<"$a" | tr '\n' ' '))" "$b" "$a"
}
q "GRANT USAGE ON SCHEMA pawl, pawl_api TO $role; GRANT EXECUTE ON FUNCTION t.out(text, int8, int4) TO $role" >/dev/null
cmp_role "a reader without SELECT on pawl.runs: the same error"
q "GRANT SELECT ON pawl.runs TO $role" >/dev/null
cmp_role "a reader without SELECT on pawl.events: the same error"
q "GRANT SELECT (xid, k, stream_id, stream_seq, type, payload, metadata, appended_at, event_id) ON pawl.events TO $role" >/dev/null
cmp_role "a reader with SELECT on the columns read: the same rows"
[ "$(rq "SELECT count(*) FROM pawl_api.read($w3, 20)")" = 20 ]; check "... 20 of them" $?
q "REVOKE SELECT (event_id) ON pawl.events FROM $role" >/dev/null
cmp_role "a reader without SELECT on one of them: the same error"
q "GRANT SELECT ON pawl.events TO $role" >/dev/null
cmp_role "a reader with SELECT on both tables: the same rows"
q "REVOKE EXECUTE ON FUNCTION pawl_api.first_index() FROM PUBLIC" >/dev/null
cmp_role "a reader without EXECUTE on pawl_api.first_index: the same error"
q "GRANT EXECUTE ON FUNCTION pawl_api.first_index() TO PUBLIC; REVOKE USAGE ON SCHEMA pawl FROM $role" >/dev/null
cmp_role "a reader without USAGE on schema pawl: the same error"
q "GRANT USAGE ON SCHEMA pawl TO $role" >/dev/null
expect "the reader cannot read pawl.log_start itself (the read uses the definer's right)" \
    "permission denied for sequence log_start" \
    "$(rq "SELECT pg_sequence_last_value('pawl.log_start'::regclass)")"
q "ALTER TABLE pawl.events ENABLE ROW LEVEL SECURITY; CREATE POLICY p ON pawl.events USING (true)" >/dev/null
grep -q "row-level security applies to pawl.events" <<<"$(rq "SELECT count(*) FROM pawl_api.read($w3, 20)")"
check "row-level security on pawl.events: refused, never bypassed" $?
q "DROP POLICY p ON pawl.events; ALTER TABLE pawl.events DISABLE ROW LEVEL SECURITY" >/dev/null

# --- (f) Never a crash -----------------------------------------------------------------------
# A backend's crash reinitializes the server without changing pg_postmaster_start_time(), but
# restarts the checkpointer: both are compared.
pm_start() { q "SELECT pg_postmaster_start_time() || ' ' || (SELECT backend_start FROM pg_stat_activity WHERE backend_type = 'checkpointer')"; }
start=$(pm_start)
bad=$(psql "$DSN" -XqAt 2>&1 <<'EOF'
CREATE FUNCTION t.b1(int4, int4) RETURNS TABLE (global_index int8, stream_id text, stream_seq int8, type text, payload bytea, metadata jsonb, appended_at timestamptz, event_id text) LANGUAGE c AS '$libdir/pawl_native', 'pawl_read';
CREATE FUNCTION t.b2(int8, int4) RETURNS int8 LANGUAGE c AS '$libdir/pawl_native', 'pawl_read';
CREATE FUNCTION t.b3(int8, int4) RETURNS TABLE (a int8, b text) LANGUAGE c AS '$libdir/pawl_native', 'pawl_read';
CREATE FUNCTION t.b4(int8) RETURNS SETOF record LANGUAGE c AS '$libdir/pawl_native', 'pawl_read';
CREATE FUNCTION t.b5(int8, int4) RETURNS SETOF record LANGUAGE c STRICT AS '$libdir/pawl_native', 'pawl_read';
CREATE FUNCTION t.b6(int8, int4, text) RETURNS SETOF pawl_api.events LANGUAGE c AS '$libdir/pawl_native', 'pawl_read';
SELECT * FROM t.b1(1, 1);
SELECT t.b2(1, 1);
SELECT * FROM t.b3(1, 1);
SELECT * FROM t.b4(1);
SELECT * FROM t.b5(1, 1);
SELECT * FROM t.b5(1, 1) AS x(a int8, b int8, c int8, d int8, e int8, f int8, g int8, h int8);
SELECT count(*) FROM t.b5(1, 1) AS x(global_index int8, stream_id text, stream_seq int8, type text, payload bytea, metadata jsonb, appended_at timestamptz, event_id text);
SELECT * FROM t.b6(1, 1, 'x');
SELECT 'alive';
EOF
)
[ "$(grep -c '^ERROR' <<<"$bad")" -ge 7 ] && [ "$(tail -1 <<<"$bad")" = alive ]
_rc=$?; check "malformed declarations are errors ($(grep -c '^ERROR' <<<"$bad") errors), the session lives" $_rc

# Odd ledgers, behind the guard's back: runs appended past the last one, then removed.
odd() { # odd NAME XIDS BASES NS: one run row after the last, read by both versions
    local f=$((last_now + 1))
    q "ALTER TABLE pawl.runs DISABLE TRIGGER runs_guard;
       INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids, bases, ns, open_xids)
       VALUES ($f + 5, $f, '1', $2, $3, $4, '{}')" >/dev/null
    local d
    d=$(q "SELECT t.diff(a, m) FROM generate_series($f - 3, $f + 6) a, (VALUES (1), (4), (50)) v(m) WHERE t.diff(a, m) IS NOT NULL LIMIT 1")
    expect "$1: the same answers" "" "$d"
    q "DELETE FROM pawl.runs WHERE last_index > $last_now; ALTER TABLE pawl.runs ENABLE TRIGGER runs_guard" >/dev/null
}
last_now=$(q "SELECT pawl_api.last_index()")
x1=$(q "SELECT xid FROM pawl.events WHERE n = 3 AND k = 0 ORDER BY xid DESC LIMIT 1")
x2=$(q "SELECT xid FROM pawl.events WHERE n >= 2 AND k = 0 AND xid <> '$x1' ORDER BY xid DESC LIMIT 1")
odd "NULL elements" "ARRAY['$x1', NULL, '$x2']::xid8[]" "ARRAY[$((last_now + 1)), $((last_now + 4)), NULL]::int8[]" "ARRAY[3, 2, NULL]"
odd "arrays of different lengths" "ARRAY['$x1', '$x2']::xid8[]" "ARRAY[$((last_now + 1))]::int8[]" "ARRAY[3, 2, 1]"
odd "two-dimensional arrays" "ARRAY[['$x1'], ['$x2']]::xid8[]" "ARRAY[[$((last_now + 1))], [$((last_now + 4))]]::int8[]" "ARRAY[[3], [2]]"
odd "a base near the int8 limit" "ARRAY['$x1']::xid8[]" "ARRAY[9223372036854775806]::int8[]" "ARRAY[5]"
odd "counts beyond the append's events" "ARRAY['$x1', '$x2']::xid8[]" "ARRAY[$((last_now + 1)), $((last_now + 5))]::int8[]" "ARRAY[4, 1]"
odd "an append without rows before one of a lower xid" "ARRAY['$(($(q "SELECT max(xid)::text::int8 FROM pawl.events") + 1000))', '$x1', '$x2']::xid8[]" "ARRAY[$((last_now + 1)), $((last_now + 2)), $((last_now + 5))]::int8[]" "ARRAY[1, 3, 1]"
odd "appends out of xid order" "ARRAY['$x1', '$x2', '$x1']::xid8[]" "ARRAY[$((last_now + 1)), $((last_now + 2)), $((last_now + 4))]::int8[]" "ARRAY[1, 2, 2]"
odd "an xid no partition holds" "ARRAY['3']::xid8[]" "ARRAY[$((last_now + 1))]::int8[]" "ARRAY[3]"
q "ALTER TABLE pawl.runs DISABLE TRIGGER runs_guard;
   INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids, bases, ns, open_xids)
   VALUES ($last_now + 3, $last_now + 1, '1', ARRAY['$x1', '$x2']::xid8[], ARRAY[$last_now + 1, $last_now + 2]::int8[], ARRAY[3, 2], '{}')" >/dev/null
expect "overlapping appends: an error (data corrupted), not rows in some order" "ERROR XX001" \
    "$(q "SELECT t.out('pawl_api.read', $last_now, 10)" | cut -c1-11)"
q "DELETE FROM pawl.runs WHERE last_index > $last_now; ALTER TABLE pawl.runs ENABLE TRIGGER runs_guard" >/dev/null

out=$(psql "$DSN" -XqAt 2>&1 <<EOF
SET statement_timeout = '2ms';
SELECT count(*) FROM pawl_api.read(0, 100000), pg_sleep(0.01);
SELECT count(*) FROM pawl_api.read(0, 100000) a, pawl_api.read(0, 100000) b;
RESET statement_timeout;
SELECT 'alive';
EOF
)
[ "$(tail -1 <<<"$out")" = alive ] && grep -q 'canceling statement due to statement timeout' <<<"$out"
check "a read canceled mid-way: the session lives" $?
psql "$DSN" -XqAt -c "SELECT count(*) FROM pawl_api.read(0, 100000) a, pawl_api.read(0, 100000) b" >/dev/null 2>&1 &
rp=$!
sleep 0.3
q "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE datname = '$db' AND query LIKE 'SELECT count(*) FROM pawl_api.read(0, 100000) a%'" >/dev/null
wait $rp
expect "no backend crashed (the postmaster's and the checkpointer's start times are unchanged)" "$start" "$(pm_start)"

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
