#!/usr/bin/env bash
# test_native_append.sh — the native pawl.append (sql/native/append.c, pawl_append) keeps the
# contract of the PL/pgSQL one (sql/015_event_ids.sql). Two databases get the same calls, one on
# the native path (D_N) and one that never leaves the SQL path (D_S); every answer (the returned
# rows but txid, the errors' SQLSTATE and message, notifications) and the log they leave
# (pawl.events but xid and appended_at) must be the same:
#   (a) the switch: pawl.append is the C function, SECURITY DEFINER, search_path pinned, with the
#       owner and the EXECUTE grants the SQL one had; pawl.append_sql exists only on the native
#       path; switching back restores exactly the definition of D_S (prosrc, proconfig, proacl,
#       owner, pg_get_functiondef), twice over;
#   (b) a sequence of appends (one and several streams, expected numbers right and wrong, NULL
#       metadata elements, ids, notify, toasted payloads and metadata, 1000 events, 200 streams)
#       and of malformed calls (NULL and empty arrays, other lengths, shapes and lower bounds,
#       NULL elements, bad expected numbers, ranks and slots, bad or repeated ids, constraint
#       violations, a head at the int8 limit), and a CHECK constraint, a default and an index
#       changed under a session that has appended (what the C function keeps planned follows
#       them);
#   (c) the calls the C function hands to pawl.append_sql: several appends in one transaction or
#       statement, ids already in the log, other triggers on pawl.events (row, statement, on a
#       partition, disabled), rotations (heads across partitions) and retention (stream floors);
#   (d) REPEATABLE READ and SERIALIZABLE callers, two sessions racing for a stream or an id, the
#       events guard after a rotation committed behind a REPEATABLE READ snapshot;
#   (e) rights: EXECUTE alone appends (definer), no EXECUTE is refused, a hostile search_path
#       (a schema and pg_temp with events, append_sql, operators) changes nothing;
#   (f) malformed declarations of pawl_append and canceled appends: errors, never a crash of the
#       backend (the postmaster's and the checkpointer's start times are unchanged: a crash
#       reinitializes the server without changing pg_postmaster_start_time(); the session answers);
#   (g) the library: `pawl append --wait` on D_N, read back by `pawl tail --json`.
# Builds and installs the extension from a copy of sql/native and switches with `pawl init`, as
# test_native_read.sh does; skips (77) when pg_config, the server headers or write access to the
# server's library folder are missing. PAWL_NATIVE_LIB=/path/pawl_native.so instead uses that
# library as it is (nothing installed: activate.sql is run with its path in place of
# $libdir/pawl_native). KEEP_TMP=1 keeps the work folder.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
SRC=${PAWL_SOURCE_DIR:?run through ctest}
PG_CONFIG=${PG_CONFIG:-pg_config}
LIB=${PAWL_NATIVE_LIB:-}
for c in psql make cc; do
    command -v "$c" >/dev/null || { echo "SKIP: $c is not installed"; exit 77; }
done
if [ -z "$LIB" ]; then
    command -v "$PG_CONFIG" >/dev/null ||
        { echo "SKIP: pg_config not found (apt-get install postgresql-server-dev-15)"; exit 77; }
    [ -f "$("$PG_CONFIG" --includedir-server)/postgres.h" ] ||
        { echo "SKIP: PostgreSQL server headers missing (apt-get install postgresql-server-dev-15)"; exit 77; }
    libdir=$("$PG_CONFIG" --pkglibdir)
    [ -w "$libdir" ] || { echo "SKIP: cannot install into $libdir (needs root)"; exit 77; }
fi
srv=$(psql "$BASE_DSN" -XqAtc "SELECT current_setting('server_version_num')::int / 10000") ||
    { echo "FAIL cannot reach the test server"; exit 1; }
if [ -z "$LIB" ]; then
    cfg=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
    [ "$srv" = "$cfg" ] ||
        { echo "SKIP: the server is PostgreSQL $srv, pg_config describes $cfg"; exit 77; }
fi

tmp=$(mktemp -d)
chmod 755 "$tmp"
[ -n "${KEEP_TMP:-}" ] && echo "work folder: $tmp"
dbn=t_napp_$$
dbs=t_napp_s_$$
rx=t_napp_x_$$  # EXECUTE on pawl.append, no table rights
rn=t_napp_n_$$  # no EXECUTE
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    for d in $dbn $dbs; do
        psql "$BASE_DSN" -XqAtc "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1
    done
    for r in $rx $rn; do psql "$BASE_DSN" -XqAtc "DROP ROLE IF EXISTS $r" >/dev/null 2>&1; done
    [ -n "${KEEP_TMP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT
D_N="$BASE_DSN dbname=$dbn"
D_S="$BASE_DSN dbname=$dbs"
export PAWL_LOG_LEVEL=warn PAWL_PROGRESS=off
SIG="(text[], int8[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[])"

fails=0
checks=0
check() {
    checks=$((checks + 1))
    if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
# expect NAME WANT GOT
expect() {
    checks=$((checks + 1))
    if [ "$2" = "$3" ]; then echo "ok   $1"; else
        echo "FAIL $1"; echo "  want: $2" | head -8; echo "  got:  $3" | head -8; fails=$((fails + 1)); fi
}
qn() { psql "$D_N" -XqAt -v ON_ERROR_STOP=1 -c "$1"; }
qs() { psql "$D_S" -XqAt -v ON_ERROR_STOP=1 -c "$1"; }
# run DSN FILE: the file's answers, errors terse and inline (stderr after stdout, in order: psql
# runs with -e off and each error line is mapped by the statement counter), xids and pids out.
run() {
    psql "$1" -XqAt -v VERBOSITY=terse -v SHOW_CONTEXT=never -f "$2" 2>&1 |
        sed -E 's/^psql:[^:]*:[0-9]+: //; s/PID [0-9]+/PID x/; s/\(transaction [0-9]+\)/(transaction x)/' |
        sed -E 's/ at character [0-9]+$//'
}
# both NAME FILE: D_N and D_S answer FILE alike; D_N's answers are in $tmp/NAME.n afterwards.
both() {
    run "$D_N" "$2" >"$tmp/$1.n"
    run "$D_S" "$2" >"$tmp/$1.s"
    checks=$((checks + 1))
    if cmp -s "$tmp/$1.n" "$tmp/$1.s"; then
        echo "ok   $1: the same answers ($(wc -l <"$tmp/$1.n") lines)"
    else
        echo "FAIL $1: native (<) and SQL (>) differ"
        diff "$tmp/$1.n" "$tmp/$1.s" | head -20 | sed 's/^/  /'
        fails=$((fails + 1))
    fi
}
# ap STREAMS EXPECTED SI RANK TYPES PAYLOADS METAS NOTIFY IDS: the call's text.
ap() { echo "pawl.append($1, $2, $3, $4, $5, $6, $7, $8, $9)"; }
S1="ARRAY['e1']" E1="ARRAY[0]::int8[]" I1="ARRAY[1]" R1="ARRAY[1]" T1="ARRAY['t']"
P1="ARRAY['\\x01']::bytea[]" M0=NULL N0=false D0=NULL
# The server's start, and its checkpointer's: a backend's crash leaves pg_postmaster_start_time()
# as it was (the postmaster reinitializes without restarting) but restarts the checkpointer.
pm_start() {
    psql "$BASE_DSN" -XqAtc "SELECT pg_postmaster_start_time() || ' ' || (SELECT backend_start
        FROM pg_stat_activity WHERE backend_type = 'checkpointer')"
}
start=$(pm_start)
start0=$start

# --- Build and install (or the library given) ------------------------------------------------
if [ -z "$LIB" ]; then
    cp -r "$SRC/sql/native" "$tmp/native"
    rm -f "$tmp/native"/*.o "$tmp/native"/*.so
    if ! make -C "$tmp/native" PG_CONFIG="$PG_CONFIG" >"$tmp/build.log" 2>&1; then
        cat "$tmp/build.log"; echo "FAIL the extension builds (-Wall -Wextra -Werror)"; exit 1
    fi
    if ! make -C "$tmp/native" PG_CONFIG="$PG_CONFIG" install >"$tmp/install.log" 2>&1; then
        cat "$tmp/install.log"; echo "FAIL the extension installs"; exit 1
    fi
    check "the extension builds with -Wall -Wextra -Werror and installs into $libdir" 0
    LIBREF='$libdir/pawl_native'
else
    [ -r "$LIB" ] || { echo "FAIL PAWL_NATIVE_LIB=$LIB is not readable"; exit 1; }
    LIBREF=$LIB
    sed "s#\\\$libdir/pawl_native#$LIB#g" "$SRC/sql/native/activate.sql" >"$tmp/activate.sql"
    echo "note: PAWL_NATIVE_LIB=$LIB: nothing installed, activate.sql run by hand"
fi
# to_native DSN / to_sql DSN: the switches, as pawl init makes them.
to_native() {
    if [ -z "$LIB" ]; then
        PAWL_DSN="$1" "$PAWL" init --server-path native >"$tmp/init.out" 2>&1 &&
            grep -q 'server functions: native' "$tmp/init.out"
    else
        psql "$1" -XqAt -v ON_ERROR_STOP=1 -1 -f "$tmp/activate.sql" >"$tmp/init.out" 2>&1
    fi
}
to_sql() {
    PAWL_DSN="$1" "$PAWL" init --server-path sql >"$tmp/init.out" 2>&1 &&
        grep -q 'server functions: SQL' "$tmp/init.out"
}

# --- (a) The switch --------------------------------------------------------------------------
for d in $dbn $dbs; do
    psql "$BASE_DSN" -XqAtc "DROP DATABASE IF EXISTS $d" >/dev/null &&
        psql "$BASE_DSN" -XqAtc "CREATE DATABASE $d" >/dev/null || exit 1
done
for r in $rx $rn; do
    psql "$BASE_DSN" -XqAtc "DROP ROLE IF EXISTS $r; CREATE ROLE $r LOGIN PASSWORD 'napp'" >/dev/null
done
for d in "$D_N" "$D_S"; do
    PAWL_DSN="$d" "$PAWL" init --server-path sql >"$tmp/init.out" 2>&1 ||
        { cat "$tmp/init.out"; echo "FAIL pawl init --server-path sql"; exit 1; }
    psql "$d" -XqAt -v ON_ERROR_STOP=1 -c "GRANT USAGE ON SCHEMA pawl TO $rx, $rn;
        GRANT EXECUTE ON FUNCTION pawl.append$SIG TO $rx" >/dev/null || exit 1
done
fdef() { # fdef NAME: language, definer, settings, owner, grants, body and whole definition
    echo "SELECT l.lanname, p.prosecdef, p.proconfig, p.proowner::regrole, p.proacl, p.proretset,
                 p.provolatile, md5(p.prosrc), md5(regexp_replace(pg_get_functiondef(p.oid),
                 'pawl\\.$1\\(', 'pawl.append('))
            FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
           WHERE p.oid = to_regprocedure('pawl.$1$SIG')"
}
ref=$(qs "$(fdef append)")
IFS='|' read -r _ _ _ owner acl _ <<<"$ref"
expect "the SQL path's pawl.append: PL/pgSQL, SECURITY DEFINER (owner $owner)" "plpgsql|t" \
    "$(cut -d'|' -f1-2 <<<"$ref")"
grep -q "$rx=X/" <<<"$acl"; check "... grants $acl" $?
nat_def="c|t|{\"search_path=pg_catalog, pg_temp\"}|$owner|$acl|t|v"
for round in 1 2; do
    to_native "$D_N"; _rc=$?; check "round $round: the switch to native ($(tail -1 "$tmp/init.out"))" $_rc
    expect "round $round: pawl.append is C, SECURITY DEFINER, search_path pinned, owner and grants kept" \
        "$nat_def" "$(qn "$(fdef append)" | cut -d'|' -f1-7)"
    expect "round $round: pawl.append_sql is the SQL function as it was (body, settings, owner, grants)" \
        "$ref" "$(qn "$(fdef append_sql)")"
    expect "round $round: $rx may execute pawl.append, $rn may not" "t|f" \
        "$(qn "SELECT has_function_privilege('$rx', 'pawl.append$SIG', 'EXECUTE'),
                      has_function_privilege('$rn', 'pawl.append$SIG', 'EXECUTE')")"
    to_sql "$D_N"; _rc=$?; check "round $round: the switch back to SQL ($(tail -1 "$tmp/init.out"))" $_rc
    expect "round $round: back on SQL, pawl.append is exactly the never-switched one" "$ref" \
        "$(qn "$(fdef append)")"
    expect "round $round: ... and pawl.append_sql is gone" "t" \
        "$(qn "SELECT to_regprocedure('pawl.append_sql$SIG') IS NULL")"
done
to_native "$D_N"; check "native again" $?
expect "the SQL path never has pawl.append_sql" "" \
    "$(qs "SELECT to_regprocedure('pawl.append_sql$SIG')")"
# pawl reads the path from the catalog (store/schema.c, active_path): every function activate.sql
# declares must be C, or the tool reports the database as partly native.
expect "every pawl function activate.sql declares is C (pawl.append_group too)" "0" \
    "$(qn "SELECT count(*) FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
            WHERE p.oid IN (to_regprocedure('pawl.finalize(int4)'), to_regprocedure('pawl.runs_guard()'),
                            to_regprocedure('pawl.events_guard()'), to_regprocedure('pawl_api.read(int8, int4)'),
                            to_regprocedure('pawl.append$SIG'),
                            to_regprocedure('pawl.append_group(text[], int8[], int4[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[])'))
              AND l.lanname <> 'c'")"

# Helpers in both databases: t.try runs a call and returns its rows or its error as text.
cat >"$tmp/helpers.sql" <<'EOF'
CREATE SCHEMA t;
GRANT USAGE ON SCHEMA t TO PUBLIC;
CREATE FUNCTION t.try(c text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r text; st text; msg text;
BEGIN
    EXECUTE 'SELECT coalesce(string_agg(format(''%s|%s|%s|%s|%s|%s'', appended, txid ~ ''^[0-9]+$'','
            ' heads, status, seqs, msg), E''\n''), ''no row'') FROM ' || c INTO r;
    RETURN r;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    RETURN format('ERROR %s|%s', st, msg);
END $$;
GRANT EXECUTE ON FUNCTION t.try(text) TO PUBLIC;
-- The log without xids: per row its call's order (dense rank of xid), k, n, whether it has a
-- ticket, and every column written.
CREATE VIEW t.log AS
SELECT dense_rank() OVER (ORDER BY e.xid) AS a, e.k, e.n, e.ticket, e.stream_id, e.stream_seq,
       e.type, md5(e.payload) AS payload, octet_length(e.payload) AS len,
       pg_column_size(e.payload) AS stored, pg_column_compression(e.payload) AS comp,
       md5(e.metadata::text) AS meta, e.metadata IS NULL AS meta_null, e.event_id,
       e.tableoid::regclass AS part
  FROM pawl.events e;
-- Per transaction (xid): its rows are k = 0 .. n - 1 with n the k = 0 row's (a later append of
-- the transaction numbers its rows on and sets that n; each row keeps the n of its own append,
-- k < n <= the total), a ticket on k = 0 only, one appended_at; the transactions breaking that.
CREATE VIEW t.bad_appends AS
SELECT e.xid FROM pawl.events e GROUP BY e.xid
HAVING count(*) <> max(e.n) FILTER (WHERE e.k = 0) OR min(e.k) <> 0 OR max(e.k) <> count(*) - 1
    OR count(DISTINCT e.k) <> count(*) OR NOT bool_and(e.k < e.n) OR max(e.n) > count(*)
    OR NOT bool_and((e.ticket IS NOT NULL) = (e.k = 0)) OR count(DISTINCT e.appended_at) <> 1;
EOF
for d in "$D_N" "$D_S"; do
    psql "$d" -XqAt -v ON_ERROR_STOP=1 -f "$tmp/helpers.sql" >/dev/null || { echo "FAIL helpers"; exit 1; }
done

# --- (b) Equivalence: a sequence of appends --------------------------------------------------
big1="(SELECT decode(string_agg(md5(i::text), ''), 'hex') FROM generate_series(1, 150000) i)"
big2="repeat('ab', 600000)::bytea"
bigm="(SELECT jsonb_object_agg('k' || i, md5(i::text)) FROM generate_series(1, 30000) i)"
cat >"$tmp/seq.sql" <<EOF
LISTEN pawl_pending;
SELECT 'c1', appended, txid = pg_current_xact_id()::text, heads, status, seqs, msg
  FROM $(ap "ARRAY['s1']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['Placed']" "ARRAY['\\x0102']::bytea[]" NULL false NULL);
SELECT 'c2', appended, txid = pg_current_xact_id()::text, heads, status, seqs, msg
  FROM $(ap "ARRAY['s1']" "ARRAY[2]::int8[]" "ARRAY[1,1,1]" "ARRAY[1,2,3]" "ARRAY['A','B','C']" "ARRAY['\\x01','\\x','\\x00ff00']::bytea[]" "ARRAY['{\"a\":1}', NULL, '{}']::jsonb[]" true NULL);
SELECT 'c3', appended, txid = pg_current_xact_id()::text, heads, status, seqs, msg
  FROM $(ap "ARRAY['s2','s3','s1']" "ARRAY[0,1,5]::int8[]" "ARRAY[1,2,1,3,2]" "ARRAY[1,1,2,1,2]" "ARRAY['a','b','c','d','e']" "ARRAY['\\x01','\\x02','\\x03','\\x04','\\x05']::bytea[]" NULL true "ARRAY['i1','i2','i3','i4','i5']");
SELECT 'c4 wrong', appended, txid = pg_current_xact_id()::text, heads, status, seqs, msg
  FROM $(ap "ARRAY['s1']" "ARRAY[3]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['x']" "ARRAY['\\x01']::bytea[]" NULL true NULL);
SELECT 'c5 one wrong', appended, txid = pg_current_xact_id()::text, heads, status, seqs, msg
  FROM $(ap "ARRAY['s2','s4']" "ARRAY[3,2]::int8[]" "ARRAY[1,2]" "ARRAY[1,1]" "ARRAY['x','y']" "ARRAY['\\x01','\\x02']::bytea[]" NULL true "ARRAY['w1','w2']");
SELECT 'c6', appended, txid = pg_current_xact_id()::text, heads, status, seqs, msg
  FROM $(ap "ARRAY['s4']" "ARRAY[1]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['x']" "ARRAY['\\x01']::bytea[]" "ARRAY[NULL]::jsonb[]" false NULL);
SELECT 'c7 toasted', appended, txid = pg_current_xact_id()::text, heads, status, seqs, msg
  FROM $(ap "ARRAY['s6']" "ARRAY[0]::int8[]" "ARRAY[1,1,1]" "ARRAY[1,2,3]" "ARRAY['big','big','small']" "ARRAY[$big1, $big2, '\\x']::bytea[]" "ARRAY[$bigm, NULL, '{\"z\":null}']::jsonb[]" true "ARRAY['big-1','big-2','big-3']");
SELECT 'c8 int8 max expected', appended, txid = pg_current_xact_id()::text, heads, status, seqs, msg
  FROM $(ap "ARRAY['s1']" "ARRAY[9223372036854775807]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['x']" "ARRAY['\\x01']::bytea[]" NULL true NULL);
SELECT 'c9 notify NULL', appended, txid = pg_current_xact_id()::text, heads, status, seqs, msg
  FROM $(ap "ARRAY['s7']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['x']" "ARRAY['\\x01']::bytea[]" NULL NULL NULL);
SELECT 'c10 bytes', appended, txid = pg_current_xact_id()::text, heads, status, seqs, msg
  FROM $(ap "ARRAY[U&'\\00E9', U&'e\\0301', 'E']" "ARRAY[0,0,0]::int8[]" "ARRAY[1,2,3,1]" "ARRAY[1,1,1,2]" "ARRAY['t','t','t','t']" "ARRAY['\\x00','\\x00','\\x00','\\x00']::bytea[]" "ARRAY['{}','{}','{}','{}']::jsonb[]" false NULL);
SELECT 'c11 8 args', appended, txid = pg_current_xact_id()::text, heads
  FROM pawl.append(ARRAY['s8'], ARRAY[0]::int8[], ARRAY[1], ARRAY[1], ARRAY['t'], ARRAY['\\x01']::bytea[], NULL);
SELECT 'c12 retry', appended, txid IS NULL, heads, status, seqs, msg
  FROM $(ap "ARRAY['s2','s3','s1']" "ARRAY[0,1,5]::int8[]" "ARRAY[1,2,1,3,2]" "ARRAY[1,1,2,1,2]" "ARRAY['a','b','c','d','e']" "ARRAY['\\x01','\\x02','\\x03','\\x04','\\x05']::bytea[]" NULL true "ARRAY['i1','i2','i3','i4','i5']");
SELECT 'c13 retry, versions ignored', appended, txid IS NULL, heads, status, seqs, msg
  FROM $(ap "ARRAY['s6']" "ARRAY[77]::int8[]" "ARRAY[1,1,1]" "ARRAY[1,2,3]" "ARRAY['big','big','small']" "ARRAY[$big1, $big2, '\\x']::bytea[]" NULL true "ARRAY['big-1','big-2','big-3']");
SELECT 'c14 id for another event', appended, txid IS NULL, heads, status, seqs, msg
  FROM $(ap "ARRAY['s9']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x09']::bytea[]" NULL true "ARRAY['i1']");
SELECT 'c15 id half known', appended, txid IS NULL, heads, status, seqs, msg
  FROM $(ap "ARRAY['s2']" "ARRAY[0]::int8[]" "ARRAY[1,1]" "ARRAY[1,2]" "ARRAY['a','z']" "ARRAY['\\x01','\\x02']::bytea[]" NULL true "ARRAY['i1','new-1']");
SELECT 'c16 1000 events', appended, txid = pg_current_xact_id()::text, heads, status, seqs, msg
  FROM pawl.append(ARRAY['s10'], ARRAY[0]::int8[], array_fill(1, ARRAY[1000]), ARRAY(SELECT generate_series(1, 1000)),
                   ARRAY(SELECT 'T' || i FROM generate_series(1, 1000) i), ARRAY(SELECT int4send(i) FROM generate_series(1, 1000) i),
                   ARRAY(SELECT CASE WHEN i % 3 = 0 THEN NULL ELSE jsonb_build_object('i', i) END FROM generate_series(1, 1000) i),
                   true, ARRAY(SELECT 'id-' || i FROM generate_series(1, 1000) i));
SELECT 'c17 200 streams', appended, txid = pg_current_xact_id()::text, cardinality(heads), status, seqs, msg
  FROM pawl.append(ARRAY(SELECT 'm-' || i FROM generate_series(1, 200) i), array_fill(0::int8, ARRAY[200]),
                   ARRAY(SELECT (i % 200) + 1 FROM generate_series(0, 399) i), ARRAY(SELECT i / 200 + 1 FROM generate_series(0, 399) i),
                   array_fill('t'::text, ARRAY[400]), array_fill('\\x01'::bytea, ARRAY[400]), NULL, false, NULL);
SELECT 'c18 limits', appended, txid = pg_current_xact_id()::text, heads, status, seqs, msg
  FROM $(ap "ARRAY[repeat('s', 255)]" "ARRAY[1]::int8[]" "ARRAY[1,1]" "ARRAY[1,2]" "ARRAY[repeat('t', 255), 'u']" "ARRAY['\\x01','\\x02']::bytea[]" NULL false "ARRAY[repeat('i', 128), 'a b/c:d']");
SELECT 'c19 right after wrong', appended, txid = pg_current_xact_id()::text, heads, status, seqs, msg
  FROM $(ap "ARRAY['s1','s4']" "ARRAY[6,2]::int8[]" "ARRAY[1,2,1]" "ARRAY[1,1,2]" "ARRAY['x','y','z']" "ARRAY['\\x01','\\x02','\\x03']::bytea[]" "ARRAY['{\"n\":[1,2]}', NULL, NULL]::jsonb[]" true NULL);
SELECT 'c20 slot without events', appended, txid = pg_current_xact_id()::text, heads, status, seqs, msg
  FROM $(ap "ARRAY['s11','s12']" "ARRAY[0,0]::int8[]" "ARRAY[1,1]" "ARRAY[1,2]" "ARRAY['x','y']" "ARRAY['\\x01','\\x02']::bytea[]" NULL false NULL);
SELECT 'c21 the version of a slot without events', appended, txid = pg_current_xact_id()::text, heads, status, seqs, msg
  FROM $(ap "ARRAY['s11','s12']" "ARRAY[3,5]::int8[]" "ARRAY[1,1]" "ARRAY[1,2]" "ARRAY['x','y']" "ARRAY['\\x01','\\x02']::bytea[]" NULL false NULL);
SELECT 'log', * FROM t.log ORDER BY a, k;
SELECT 'bad appends', count(*) FROM t.bad_appends;
SELECT 'ticket', last_value FROM pawl.append_ticket;
EOF
both "b: a sequence of appends" "$tmp/seq.sql"
n=$(grep -c '^log|' "$tmp/b: a sequence of appends.n")
expect "b: ... wrote the events expected (1 + 3 + 5 + 1 + 3 + 1 + 4 + 1 + 1000 + 400 + 2 + 3 + 2)" 1426 "$n"
expect "b: ... and notified after the appends with notify true that wrote events" 5 \
    "$(grep -c 'Asynchronous notification "pawl_pending"' "$tmp/b: a sequence of appends.n")"
expect "b: ... every append's rows k = 0 .. n - 1, a ticket on k = 0 only, one appended_at" \
    "bad appends|0" "$(grep '^bad appends' "$tmp/b: a sequence of appends.n")"
expect "b: the toasted payloads are stored compressed or not as on SQL" "2" \
    "$(grep -c '^log|.*|s6|[12]|big|.*|\(pglz\|lz4\||\)' "$tmp/b: a sequence of appends.n")"

# Malformed calls: the same error (SQLSTATE and message), or the same row.
errs=(
    "$(ap NULL "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" NULL "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" NULL "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" NULL "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" NULL "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" NULL "$M0" "$N0" "$D0")"
    "$(ap NULL NULL NULL NULL NULL NULL NULL NULL NULL)"
    "$(ap "'{}'::text[]" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "'{}'::text[]" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "'{}'::text[]" "'{}'::int8[]" "'{}'::int4[]" "'{}'::int4[]" "'{}'::text[]" "'{}'::bytea[]" "'{}'::jsonb[]" "$N0" "'{}'::text[]")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "'{}'::jsonb[]" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "'{}'::text[]")"
    "$(ap "$S1" "ARRAY[0,0]::int8[]" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "ARRAY[1,1]" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "ARRAY[1,2]" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "ARRAY['t','u']" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "ARRAY['\\x01','\\x02']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "ARRAY['{}','{}']::jsonb[]" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "ARRAY['a','b']")"
    "$(ap "ARRAY['e1','e2']" "ARRAY[0,0]::int8[]" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY[['e1']]" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "ARRAY[[0]]::int8[]" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "ARRAY[[1]]" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "ARRAY[[1]]" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "ARRAY[['t']]" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "ARRAY[['\\x01']]::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "ARRAY[['{}']]::jsonb[]" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "ARRAY[['x']]")"
    "$(ap "ARRAY[['e1','e2']]" "ARRAY[[0,0]]::int8[]" "ARRAY[[1,2]]" "ARRAY[[1,1]]" "ARRAY[['t','t']]" "ARRAY[['\\x01','\\x01']]::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "'[0:0]={e1}'::text[]" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "'[0:0]={0}'::int8[]" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "'[0:0]={1}'::int4[]" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "'[0:0]={1}'::int4[]" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "'[0:0]={t}'::text[]" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "'[0:0]={\\\\x01}'::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "'[0:0]={\"{}\"}'::jsonb[]" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "'[0:0]={x0}'::text[]")"
    "$(ap "'[2:2]={e1}'::text[]" "'[2:2]={0}'::int8[]" "'[2:2]={1}'::int4[]" "'[2:2]={1}'::int4[]" "'[2:2]={t}'::text[]" "'[2:2]={\\\\x01}'::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY[NULL]::text[]" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY['e1',NULL]" "ARRAY[0,0]::int8[]" "ARRAY[1,2]" "ARRAY[1,1]" "ARRAY['t','t']" "ARRAY['\\x01','\\x01']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "ARRAY[NULL]::int8[]" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "ARRAY[NULL]::int4[]" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "ARRAY[NULL]::int4[]" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "ARRAY[1,NULL]" "ARRAY[1,2]" "ARRAY['t','t']" "ARRAY['\\x01','\\x01']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY['e1','e2']" "ARRAY[0,0]::int8[]" "ARRAY[1,2]" "ARRAY[1,NULL]" "ARRAY['t','t']" "ARRAY['\\x01','\\x01']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "ARRAY[NULL]::text[]" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "ARRAY[1,1]" "ARRAY[1,2]" "ARRAY['t',NULL]" "ARRAY['\\x01','\\x01']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "ARRAY[NULL]::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "ARRAY[1,1]" "ARRAY[1,2]" "ARRAY['t','t']" "ARRAY['\\x01',NULL]::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "ARRAY[NULL]::text[]")"
    "$(ap "$S1" "$E1" "ARRAY[1,1]" "ARRAY[1,2]" "ARRAY['t','t']" "ARRAY['\\x01','\\x01']::bytea[]" "$M0" "$N0" "ARRAY['n1',NULL]")"
    "$(ap "$S1" "ARRAY[-1]::int8[]" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY['e1','e2']" "ARRAY[0,-9223372036854775808]::int8[]" "ARRAY[1,2]" "ARRAY[1,1]" "ARRAY['t','t']" "ARRAY['\\x01','\\x01']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "ARRAY[2]" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "ARRAY[0]" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "ARRAY[2]" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "ARRAY[1,1]" "ARRAY[2,1]" "ARRAY['t','t']" "ARRAY['\\x01','\\x01']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "ARRAY[1,1]" "ARRAY[1,1]" "ARRAY['t','t']" "ARRAY['\\x01','\\x01']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "ARRAY[1,1,1]" "ARRAY[1,3,2]" "ARRAY['t','t','t']" "ARRAY['\\x01','\\x01','\\x01']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY['e1','e2']" "ARRAY[0,0]::int8[]" "ARRAY[1,2,1]" "ARRAY[1,1,1]" "ARRAY['t','t','t']" "ARRAY['\\x01','\\x01','\\x01']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY['e1','e2']" "ARRAY[0,0]::int8[]" "ARRAY[1,3]" "ARRAY[1,1]" "ARRAY['t','t']" "ARRAY['\\x01','\\x01']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY['e1','e2']" "ARRAY[0,0]::int8[]" "ARRAY[0,1]" "ARRAY[1,1]" "ARRAY['t','t']" "ARRAY['\\x01','\\x01']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY['e1','e2']" "ARRAY[0,0]::int8[]" "ARRAY[2,1]" "ARRAY[1,1]" "ARRAY['t','t']" "ARRAY['\\x01','\\x01']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY['e1','e2']" "ARRAY[0,0]::int8[]" "ARRAY[1,-1]" "ARRAY[1,1]" "ARRAY['t','t']" "ARRAY['\\x01','\\x01']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "ARRAY[repeat('x', 129)]")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "ARRAY[repeat(U&'\\00E9', 65)]")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "ARRAY['']")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "ARRAY[E'a\\x01b']")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "ARRAY[E'a\\x7f']")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "ARRAY[E'\\t']")"
    "$(ap "$S1" "$E1" "ARRAY[1,1]" "ARRAY[1,2]" "ARRAY['t','t']" "ARRAY['\\x01','\\x01']::bytea[]" "$M0" "$N0" "ARRAY['ok',E'b\\nc']")"
    "$(ap "$S1" "$E1" "ARRAY[1,1]" "ARRAY[1,2]" "ARRAY['t','t']" "ARRAY['\\x01','\\x02']::bytea[]" "$M0" "$N0" "ARRAY['d','d']")"
    "$(ap "ARRAY['e1','e2']" "ARRAY[0,0]::int8[]" "ARRAY[1,2]" "ARRAY[1,1]" "ARRAY['t','t']" "ARRAY['\\x01','\\x01']::bytea[]" "$M0" "$N0" "ARRAY['dd','dd']")"
    "$(ap "ARRAY[repeat('s', 256)]" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY['']" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "ARRAY[repeat('t', 256)]" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "ARRAY['']" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "ARRAY['[1]']::jsonb[]" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "ARRAY['\"s\"']::jsonb[]" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "$I1" "$R1" "$T1" "$P1" "ARRAY['null']::jsonb[]" "$N0" "$D0")"
    "$(ap "$S1" "$E1" "ARRAY[1,1]" "ARRAY[1,2]" "ARRAY['t','t']" "ARRAY['\\x01','\\x01']::bytea[]" "ARRAY['{}','7']::jsonb[]" "$N0" "$D0")"
    "$(ap "ARRAY['dup','dup']" "ARRAY[0,0]::int8[]" "ARRAY[1,2]" "ARRAY[1,1]" "ARRAY['t','t']" "ARRAY['\\x01','\\x01']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY['big']" "$E1" "ARRAY[1,1]" "ARRAY[1,2]" "ARRAY['t','t']" "ARRAY['\\x01','\\x01']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY['big']" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY['big','e1']" "ARRAY[0,0]::int8[]" "ARRAY[2,1,2]" "ARRAY[1,1,2]" "ARRAY['t','t','t']" "ARRAY['\\x01','\\x01','\\x01']::bytea[]" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY['big']" "ARRAY[9223372036854775807]::int8[]" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY['big']" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
    "$(ap "ARRAY['big']" "ARRAY[5]::int8[]" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")"
)
{
    echo "INSERT INTO pawl.stream_floors (stream_id, last_seq) VALUES ('big', 9223372036854775806);"
    i=0
    for c in "${errs[@]}"; do
        i=$((i + 1))
        printf "SELECT 'e%d', t.try(\$c\$%s\$c\$);\n" "$i" "$c"
    done
    echo "SELECT 'log', * FROM t.log WHERE stream_id IN ('e1', 'e2', 'big', 'dup') ORDER BY a, k;"
} >"$tmp/errs.sql"
both "b: ${#errs[@]} malformed calls" "$tmp/errs.sql"
f="$tmp/b: ${#errs[@]} malformed calls.n"
expect "b: ... the SQL function's own errors among them" \
    "e1|ERROR 22023|pawl.append: array lengths do not match (1 events, 0 streams)
e21|ERROR 22023|pawl.append: arrays must be one-dimensional, starting at index 1
e52|ERROR 22023|pawl.append: expected sequence numbers must be >= 0 (0 = any)
e54|ERROR 22023|pawl.append: the only event must be rank 1 of stream 1" \
    "$(grep -E '^e(1|21|52|54)\|' "$f")"
expect "b: ... a head at the int8 limit: one event fits, then bigint out of range" \
    "e83|ERROR 22003|bigint out of range
e84|1|t|{9223372036854775806}|||
e85|ERROR 22003|bigint out of range
e86|0|t|{9223372036854775807}|||
e87|ERROR 22003|bigint out of range
e88|0|t|{9223372036854775807}|||" \
    "$(grep -E '^e8[3-8]\|' "$f")"

# A definition changed under a session that has appended: the CHECK constraints and defaults
# the C function keeps planned per backend follow it (a new constraint refuses, a new default
# fills, and the old ones come back), in one session on each database.
cat >"$tmp/defs.sql" <<EOF
SELECT 'd1', t.try(\$c\$$(ap "ARRAY['df']" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")\$c\$);
ALTER TABLE pawl.events ADD CONSTRAINT t_no_forbidden CHECK (type <> 'forbidden');
ALTER TABLE pawl.events ALTER COLUMN appended_at SET DEFAULT '2001-02-03 04:05:06+00';
SELECT 'd2', t.try(\$c\$$(ap "ARRAY['df']" "$E1" "$I1" "$R1" "ARRAY['forbidden']" "$P1" "$M0" "$N0" "$D0")\$c\$);
SELECT 'd3', t.try(\$c\$$(ap "ARRAY['df']" "$E1" "$I1" "$R1" "$T1" "$P1" "$M0" "$N0" "$D0")\$c\$);
ALTER TABLE pawl.events DROP CONSTRAINT t_no_forbidden;
ALTER TABLE pawl.events ALTER COLUMN appended_at SET DEFAULT now();
SELECT 'd4', t.try(\$c\$$(ap "ARRAY['df']" "$E1" "$I1" "$R1" "ARRAY['forbidden']" "$P1" "$M0" "$N0" "$D0")\$c\$);
SELECT 'log', stream_seq, type, appended_at = '2001-02-03 04:05:06+00' FROM pawl.events
 WHERE stream_id = 'df' ORDER BY stream_seq;
EOF
both "b: definitions changed under a session" "$tmp/defs.sql"
expect "b: ... the new constraint refused, the new default filled, then both were gone" \
    "d1|1|t|{0}|||
d2|ERROR 23514|new row for relation \"$(qn "SELECT relname FROM pawl.event_parts WHERE hi IS NULL")\" violates check constraint \"t_no_forbidden\"
d3|1|t|{1}|||
d4|1|t|{2}|||
log|1|t|f
log|2|t|t
log|3|forbidden|f" \
    "$(cat "$tmp/b: definitions changed under a session.n")"

# An index created and dropped under a session that has appended: the indexes' planned
# expressions and predicates the C function keeps per backend follow it (a new unique partial
# expression index refuses a duplicate where its predicate holds, and nothing once dropped).
cat >"$tmp/idx.sql" <<EOF
SELECT 'i1', t.try(\$c\$$(ap "ARRAY['ix']" "$E1" "$I1" "$R1" "ARRAY['A']" "$P1" "$M0" "$N0" "$D0")\$c\$);
DO \$d\$ BEGIN EXECUTE format('CREATE UNIQUE INDEX t_ix ON pawl.%I (lower(type)) WHERE stream_id = %L',
    (SELECT relname FROM pawl.event_parts WHERE hi IS NULL), 'ix'); END \$d\$;
SELECT 'i2', t.try(\$c\$$(ap "ARRAY['ix']" "$E1" "$I1" "$R1" "ARRAY['a']" "$P1" "$M0" "$N0" "$D0")\$c\$);
SELECT 'i3', t.try(\$c\$$(ap "ARRAY['ix2']" "$E1" "$I1" "$R1" "ARRAY['a']" "$P1" "$M0" "$N0" "$D0")\$c\$);
DROP INDEX pawl.t_ix;
SELECT 'i4', t.try(\$c\$$(ap "ARRAY['ix']" "$E1" "$I1" "$R1" "ARRAY['a']" "$P1" "$M0" "$N0" "$D0")\$c\$);
EOF
both "b: an index created under a session" "$tmp/idx.sql"
expect "b: ... the new index refused a duplicate where its predicate held, then was gone" \
    "i1|1|t|{0}|||
i2|ERROR 23505|duplicate key value violates unique constraint \"t_ix\"
i3|1|t|{0}|||
i4|1|t|{1}|||" \
    "$(cat "$tmp/b: an index created under a session.n")"

# --- (c) The calls the C function hands to pawl.append_sql -----------------------------------
cat >"$tmp/tx.sql" <<EOF
BEGIN;
SELECT 'x1', appended, heads FROM $(ap "ARRAY['tx1']" "ARRAY[0]::int8[]" "ARRAY[1,1]" "ARRAY[1,2]" "ARRAY['a','b']" "ARRAY['\\x01','\\x02']::bytea[]" NULL true "ARRAY['tx-1','tx-2']");
SELECT 'x2', appended, heads FROM $(ap "ARRAY['tx1','tx2']" "ARRAY[3,0]::int8[]" "ARRAY[2,1,2]" "ARRAY[1,1,2]" "ARRAY['c','d','e']" "ARRAY['\\x03','\\x04','\\x05']::bytea[]" NULL true "ARRAY['tx-3','tx-4','tx-5']");
SELECT 'x3 wrong', appended, heads FROM $(ap "ARRAY['tx2']" "ARRAY[1]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['f']" "ARRAY['\\x06']::bytea[]" NULL true NULL);
SELECT 'x4 retry in the transaction', appended, heads, status, seqs FROM $(ap "ARRAY['tx1']" "ARRAY[0]::int8[]" "ARRAY[1,1]" "ARRAY[1,2]" "ARRAY['a','b']" "ARRAY['\\x01','\\x02']::bytea[]" NULL true "ARRAY['tx-1','tx-2']");
SELECT 'x5', appended, heads FROM $(ap "ARRAY['tx3']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['g']" "ARRAY['\\x07']::bytea[]" "ARRAY['{\"g\":1}']::jsonb[]" false NULL);
COMMIT;
SELECT 'tx', a, k, n, ticket, stream_id, stream_seq, type, event_id FROM t.log WHERE stream_id LIKE 'tx%' ORDER BY a, k;
SELECT 'ticket', last_value FROM pawl.append_ticket;
BEGIN;
SELECT 'y1 wrong first', appended, heads FROM $(ap "ARRAY['ty']" "ARRAY[4]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL);
SELECT 'y2', appended, heads FROM $(ap "ARRAY['ty']" "ARRAY[1]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL);
SAVEPOINT s;
SELECT 'y3 rolled back', appended, heads FROM $(ap "ARRAY['ty']" "ARRAY[2]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['b']" "ARRAY['\\x02']::bytea[]" NULL false NULL);
ROLLBACK TO s;
SELECT 'y4', appended, heads FROM $(ap "ARRAY['ty']" "ARRAY[2]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['c']" "ARRAY['\\x03']::bytea[]" NULL false NULL);
COMMIT;
BEGIN;
SAVEPOINT s;
SELECT 'z1 rolled back', appended, heads FROM $(ap "ARRAY['tz']" "ARRAY[1]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL);
ROLLBACK TO s;
SELECT 'z2 first after it', appended, heads FROM $(ap "ARRAY['tz']" "ARRAY[1]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['b']" "ARRAY['\\x02']::bytea[]" NULL false NULL);
COMMIT;
SELECT 'w two in one statement', a.appended, a.heads, b.appended, b.heads
  FROM $(ap "ARRAY['tw']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL) a,
       $(ap "ARRAY['tw','tw2']" "ARRAY[0,0]::int8[]" "ARRAY[1,2]" "ARRAY[1,1]" "ARRAY['b','c']" "ARRAY['\\x02','\\x03']::bytea[]" NULL false NULL) b;
DO \$\$
BEGIN
    PERFORM $(ap "ARRAY['tv']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL);
    PERFORM $(ap "ARRAY['tv']" "ARRAY[2]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['b']" "ARRAY['\\x02']::bytea[]" NULL false NULL);
END \$\$;
SELECT 'tyzwv', a, k, n, ticket, stream_id, stream_seq, type FROM t.log WHERE stream_id ~ '^t[yzwv]' ORDER BY a, k;
SELECT 'bad appends', count(*) FROM t.bad_appends;
EOF
both "c: several appends in one transaction or statement" "$tmp/tx.sql"
expect "c: ... the later appends' k continue, the k = 0 row has the total n (6) and the one ticket" \
    "0|6|t 1|2|f 2|5|f 3|5|f 4|5|f 5|6|f" \
    "$(grep '^tx|' "$tmp/c: several appends in one transaction or statement.n" | awk -F'|' '{printf "%s%s|%s|%s", (NR > 1 ? " " : ""), $3, $4, ($5 != "" ? "t" : "f")}')"

# Other triggers on pawl.events: row and statement, before and after, on the parent or on a
# partition, disabled; the C function must give the same rows and fire the same triggers.
part=$(qn "SELECT relname FROM pawl.event_parts WHERE hi IS NULL")
one() { # one LABEL STREAM: a one-event append of STREAM with expected 0
    echo "SELECT '$1', appended, heads FROM $(ap "ARRAY['$2']" "ARRAY[0]::int8[]" "ARRAY[1,1]" "ARRAY[1,2]" "ARRAY['a','b']" "ARRAY['\\x01','\\x02']::bytea[]" NULL false NULL);"
}
cat >"$tmp/trig.sql" <<EOF
CREATE TABLE t.fired (i serial, what text);
CREATE FUNCTION t.note() RETURNS trigger LANGUAGE plpgsql AS \$\$
BEGIN
    INSERT INTO t.fired (what) VALUES (concat_ws(' ', TG_NAME, TG_WHEN, TG_LEVEL, TG_TABLE_NAME,
        CASE WHEN TG_LEVEL = 'ROW' THEN NEW.stream_id || '#' || NEW.stream_seq || ' k' || NEW.k END));
    IF TG_LEVEL = 'ROW' AND TG_WHEN = 'BEFORE' THEN
        NEW.metadata := jsonb_build_object('by', TG_NAME);
        RETURN NEW;
    END IF;
    RETURN NULL;
END \$\$;
CREATE TRIGGER zz_bs BEFORE INSERT ON pawl.events FOR EACH STATEMENT EXECUTE FUNCTION t.note();
$(one "g1 second BEFORE statement trigger" g1)
ALTER TABLE pawl.events DISABLE TRIGGER zz_bs;
$(one "g2 disabled" g2)
ALTER TABLE pawl.events ENABLE TRIGGER zz_bs;
CREATE TRIGGER zz_ar AFTER INSERT ON pawl.events FOR EACH ROW EXECUTE FUNCTION t.note();
$(one "g3 AFTER row trigger" g3)
DROP TRIGGER zz_ar ON pawl.events;
CREATE TRIGGER zz_br BEFORE INSERT ON pawl.events FOR EACH ROW EXECUTE FUNCTION t.note();
$(one "g4 BEFORE row trigger changing the row" g4)
DROP TRIGGER zz_br ON pawl.events;
CREATE TRIGGER zz_as AFTER INSERT ON pawl.events FOR EACH STATEMENT EXECUTE FUNCTION t.note();
$(one "g5 AFTER statement trigger" g5)
DROP TRIGGER zz_as ON pawl.events;
CREATE TRIGGER zz_at AFTER INSERT ON pawl.events REFERENCING NEW TABLE AS nt FOR EACH STATEMENT EXECUTE FUNCTION t.note();
$(one "g6 AFTER statement trigger with a transition table" g6)
DROP TRIGGER zz_at ON pawl.events;
CREATE TRIGGER zz_pr AFTER INSERT ON pawl.$part FOR EACH ROW EXECUTE FUNCTION t.note();
$(one "g7 AFTER row trigger on the partition" g7)
DROP TRIGGER zz_pr ON pawl.$part;
CREATE TRIGGER zz_ps BEFORE INSERT ON pawl.$part FOR EACH STATEMENT EXECUTE FUNCTION t.note();
$(one "g8 BEFORE statement trigger on the partition" g8)
DROP TRIGGER zz_ps ON pawl.$part;
SET session_replication_role = replica;
$(one "g9 replica role" g9)
RESET session_replication_role;
DROP TRIGGER zz_bs ON pawl.events;
$(one "g10 none again" g10)
SELECT 'fired', i, what FROM t.fired ORDER BY i;
SELECT 'g', a, k, n, ticket IS NOT NULL, stream_id, stream_seq, meta_null, part FROM t.log WHERE stream_id ~ '^g[0-9]' ORDER BY a, k;
SELECT 'meta', stream_id, stream_seq, metadata FROM pawl.events WHERE stream_id = 'g4' ORDER BY stream_seq;
EOF
both "c: other triggers on pawl.events" "$tmp/trig.sql"
expect "c: ... the second BEFORE statement trigger fired once per append but when disabled or replica" \
    "7" "$(grep -c '^fired|.*zz_bs BEFORE STATEMENT events' "$tmp/c: other triggers on pawl.events.n")"
expect "c: ... the AFTER row trigger fired per row" "fired|3|zz_ar AFTER ROW $part g3#1 k0
fired|4|zz_ar AFTER ROW $part g3#2 k1" \
    "$(grep '^fired|.*zz_ar' "$tmp/c: other triggers on pawl.events.n")"

# Rotations: the heads across partitions; a stream whose events are all in an old partition
# continues its numbering; an id in an old partition is found.
rotate() { # rotate DSN: close the newest partition (retried while an old transaction runs)
    local r i
    for i in $(seq 1 100); do
        r=$(PGOPTIONS='-c lock_timeout=10s' psql "$1" -XqAt -c "SELECT pawl.rotate()")
        [ -n "$r" ] && { echo "$r"; return 0; }
        sleep 0.1
    done
    return 1
}
rot_a="$(one "r1 old" r-old)
$(one "r1 both" r-both)
SELECT 'r1 id', appended FROM $(ap "ARRAY['r-id']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false "ARRAY['rid-old']");"
rot_b="$(one "r2 both" r-both)
$(one "r2 new" r-new)"
# Which partition holds an earlier row is left out: a rotation moves the rows of transactions
# running at its horizon, the oldest transaction of the whole server, which other sessions on
# a shared server move (where the new rows go is checked below).
rot_c="SELECT 'r3', appended, heads FROM $(ap "ARRAY['r-old','r-both','r-new','r-none']" "ARRAY[3,5,3,1]::int8[]" "ARRAY[1,2,3,4,1]" "ARRAY[1,1,1,1,2]" "ARRAY['a','b','c','d','e']" "ARRAY['\\x01','\\x02','\\x03','\\x04','\\x05']::bytea[]" NULL false NULL);
SELECT 'r4 wrong', appended, heads FROM $(ap "ARRAY['r-old','r-both']" "ARRAY[3,5]::int8[]" "ARRAY[1,2]" "ARRAY[1,1]" "ARRAY['a','b']" "ARRAY['\\x01','\\x02']::bytea[]" NULL false NULL);
SELECT 'r5 retry of an id in the oldest partition', appended, heads, status, seqs FROM $(ap "ARRAY['r-id']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false "ARRAY['rid-old']");
SELECT 'r6 that id for another event', appended, heads, status, msg FROM $(ap "ARRAY['r-id2']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false "ARRAY['rid-old']");
SELECT 'r7 retry in a new transaction', appended, status, seqs FROM $(ap "ARRAY['r-old','r-both','r-new','r-none']" "ARRAY[3,5,3,1]::int8[]" "ARRAY[1,2,3,4,1]" "ARRAY[1,1,1,1,2]" "ARRAY['a','b','c','d','e']" "ARRAY['\\x01','\\x02','\\x03','\\x04','\\x05']::bytea[]" NULL false NULL);
SELECT 'r', stream_id, stream_seq, k, n FROM t.log WHERE stream_id LIKE 'r-%' ORDER BY stream_id, stream_seq;
SELECT 'parts', count(*) FROM pawl.event_parts;
SELECT 'bad appends', count(*) FROM t.bad_appends;"
for d in N S; do
    dsn=D_$d
    psql "${!dsn}" -XqAt -f - <<<"$rot_a" >"$tmp/rot_a.$d" 2>&1
    rotate "${!dsn}" >"$tmp/rot1.$d" || echo "no rotation" >"$tmp/rot1.$d"
    psql "${!dsn}" -XqAt -f - <<<"$rot_b" >"$tmp/rot_b.$d" 2>&1
    rotate "${!dsn}" >"$tmp/rot2.$d" || echo "no rotation" >"$tmp/rot2.$d"
done
expect "c: two rotations on both databases" "$(cat "$tmp/rot1.S" "$tmp/rot2.S" "$tmp/rot_a.S" "$tmp/rot_b.S")" \
    "$(cat "$tmp/rot1.N" "$tmp/rot2.N" "$tmp/rot_a.N" "$tmp/rot_b.N")"
echo "$rot_c" >"$tmp/rot_c.sql"
both "c: appends across three partitions" "$tmp/rot_c.sql"
expect "c: ... the heads across partitions (r-old 2, r-both 4, r-new 2, r-none 0)" \
    "r3|5|{2,4,2,0}" "$(grep '^r3|' "$tmp/c: appends across three partitions.n")"
expect "c: ... written into the newest partition" "$(qn "SELECT relname FROM pawl.event_parts WHERE hi IS NULL")" \
    "$(qn "SELECT DISTINCT part FROM t.log WHERE stream_id = 'r-none'")"

# Retention: the closed partitions dropped, their streams continue from pawl.stream_floors.
# Which streams have a floor depends on which rows the rotations moved (see above), so each
# stream's head (its highest row or its floor) is compared, not the floors.
cat >"$tmp/ret.sql" <<EOF
SELECT 'finalize', count(*) FROM pawl.finalize();
SELECT 'dropped', relname FROM pawl.retention_drop(pawl_api.last_index() + 1, true) ORDER BY 2;
SELECT 'head', s, greatest((SELECT max(stream_seq) FROM pawl.events WHERE stream_id = s), (SELECT last_seq FROM pawl.stream_floors WHERE stream_id = s)) FROM unnest(ARRAY['r-both', 'r-id', 'r-new', 'r-old', 's1', 'g1', 's10']) s ORDER BY 2;
SELECT 'q1', appended, heads FROM $(ap "ARRAY['r-old','s1','s10','g1']" "ARRAY[0,0,0,3]::int8[]" "ARRAY[1,2,3,4]" "ARRAY[1,1,1,1]" "ARRAY['a','b','c','d']" "ARRAY['\\x01','\\x02','\\x03','\\x04']::bytea[]" NULL false "ARRAY['i1','i2','id-1','q-4']");
SELECT 'q2 wrong under the floor', appended, heads FROM $(ap "ARRAY['r-both']" "ARRAY[1]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL);
SELECT 'q3 floor and rows', appended, heads FROM $(ap "ARRAY['r-both']" "ARRAY[6]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL);
SELECT 'q', stream_id, stream_seq, k, event_id FROM t.log WHERE stream_id IN ('r-old', 's1', 's10', 'g1') AND a = (SELECT max(a) FROM t.log WHERE stream_id = 'g1') ORDER BY k;
SELECT 'bad appends', count(*) FROM t.bad_appends;
EOF
both "c: appends after retention dropped partitions" "$tmp/ret.sql"
f="$tmp/c: appends after retention dropped partitions.n"
grep -q '^dropped|' "$f"; check "c: ... retention dropped a partition" $?
expect "c: ... streams continue from their floors; ids of dropped events are free again" \
    "q1|4|{4,7,1000,2}" "$(grep '^q1|' "$f")"

# --- (d) Isolation and concurrency -----------------------------------------------------------
cat >"$tmp/rr.sql" <<EOF
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT 'snap', count(*) > 0 FROM pawl.events;
\! psql "\$DSN" -XqAt -c "SELECT appended FROM $(ap "ARRAY['rr']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\\\x01']::bytea[]" NULL false NULL)" >/dev/null
SELECT 'rr1 wrong under the snapshot', appended, heads FROM $(ap "ARRAY['rr']" "ARRAY[2]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL);
SELECT 'rr2 other stream', appended, heads FROM $(ap "ARRAY['rr2']" "ARRAY[1]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL);
SELECT 'rr3 then the stream', appended, heads FROM $(ap "ARRAY['rr']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL);
ROLLBACK;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT 'ser1', appended, heads FROM $(ap "ARRAY['ser']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false "ARRAY['ser-1']");
SELECT 'ser2', appended, heads FROM $(ap "ARRAY['ser']" "ARRAY[2]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x02']::bytea[]" NULL false NULL);
COMMIT;
SELECT 'ser', stream_id, stream_seq, k, n FROM t.log WHERE stream_id IN ('ser', 'rr', 'rr2') ORDER BY 2, 3;
EOF
for d in N S; do dsn=D_$d; sed "s#\\\$DSN#${!dsn}#" "$tmp/rr.sql" >"$tmp/rr.$d.sql"; done
run "$D_N" "$tmp/rr.N.sql" >"$tmp/rr.n"; run "$D_S" "$tmp/rr.S.sql" >"$tmp/rr.s"
expect "d: REPEATABLE READ and SERIALIZABLE callers: the same answers" "$(cat "$tmp/rr.s")" "$(cat "$tmp/rr.n")"
expect "d: ... REPEATABLE READ: heads under the snapshot, a committed conflict is 23505" \
    "rr1 wrong under the snapshot|0|{0}" "$(grep '^rr1' "$tmp/rr.n")"
grep -q 'duplicate key value violates unique constraint' "$tmp/rr.n"; check "d: ... (the conflict)" $?

# Write skew: each transaction reads the other's stream version and appends to its own; one of
# them must fail to serialize (SIREAD locks from the heads' look-ups).
skew() { # skew DSN: the two outcomes
    psql "$1" -XqAt -v VERBOSITY=terse -c "BEGIN ISOLATION LEVEL SERIALIZABLE" \
        -c "SELECT pawl_api.stream_version('wy')" \
        -c "SELECT appended FROM $(ap "ARRAY['wx']" "ARRAY[1]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL)" \
        -c "SELECT pg_sleep(1)" -c "COMMIT" >"$tmp/skew1" 2>&1 &
    local p=$!
    sleep 0.3
    psql "$1" -XqAt -v VERBOSITY=terse -c "BEGIN ISOLATION LEVEL SERIALIZABLE" \
        -c "SELECT pawl_api.stream_version('wx')" \
        -c "SELECT appended FROM $(ap "ARRAY['wy']" "ARRAY[1]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL)" \
        -c "COMMIT" 2>&1 | sed -E 's/^psql:[^:]*:[0-9]+: //; s/^ERROR: +//'
    wait $p
    sed -E 's/^psql:[^:]*:[0-9]+: //; s/^ERROR: +//' "$tmp/skew1"
    psql "$1" -XqAt -c "SELECT string_agg(stream_id, ',' ORDER BY stream_id) FROM pawl.events WHERE stream_id IN ('wx', 'wy')"
}
sk_n=$(skew "$D_N"); sk_s=$(skew "$D_S")
expect "d: SERIALIZABLE write skew through two appends: the same outcome" "$sk_s" "$sk_n"
grep -q 'could not serialize' <<<"$sk_n"
_rc=$?; check "d: ... one of them fails to serialize ($(tr '\n' ' ' <<<"$sk_n" | head -c 160))" $_rc

# Two sessions racing: the first holds its append open, the second appends the same stream
# (expected 0, then the right number) or the same id: it waits, then fails on the partition's
# unique index, named as on SQL; when the first rolls back, the second goes through.
race() { # race DSN END CALL2: prints what the second session got
    psql "$1" -XqAt -c "BEGIN" \
        -c "SELECT appended FROM $(ap "ARRAY['race']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false "ARRAY['race-id']")" \
        -c "SELECT pg_sleep(1.2)" -c "$2" >/dev/null 2>&1 &
    local p=$!
    sleep 0.4
    psql "$1" -XqAt -v VERBOSITY=terse -c "SELECT 'second', appended, heads, status, seqs FROM $3" 2>&1 |
        sed -E 's/^psql:[^:]*:[0-9]+: //'
    wait $p
    psql "$1" -XqAt -c "DELETE FROM pawl.events WHERE stream_id IN ('race', 'race2')" >/dev/null
}
rs1=$(ap "ARRAY['race']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['b']" "ARRAY['\\x02']::bytea[]" NULL false NULL)
rs2=$(ap "ARRAY['race']" "ARRAY[1]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['b']" "ARRAY['\\x02']::bytea[]" NULL false NULL)
rs3=$(ap "ARRAY['race2']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['b']" "ARRAY['\\x02']::bytea[]" NULL false "ARRAY['race-id']")
rs4=$(ap "ARRAY['race']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false "ARRAY['race-id']")
for end in COMMIT ROLLBACK; do
    for c in rs1 rs2 rs3 rs4; do
        a=$(race "$D_N" $end "${!c}"); b=$(race "$D_S" $end "${!c}")
        expect "d: racing $c, the first session's $end: the same answer ($(head -c 100 <<<"$a"))" "$b" "$a"
    done
done
expect "d: ... the same stream at expected 0, committed: 23505 on the partition's stream key" \
    "ERROR:  duplicate key value violates unique constraint \"$(qn "SELECT relname FROM pawl.event_parts WHERE hi IS NULL")_stream_key\"" \
    "$(race "$D_N" COMMIT "$rs1")"

# The events guard: a rotation committed after a REPEATABLE READ snapshot: 40001, as on SQL.
guard() { # guard DSN
    psql "$1" -XqAt -v VERBOSITY=terse -v SHOW_CONTEXT=never 2>&1 <<EOF | sed -E 's/^psql:[^:]*:[0-9]+: //; s/\(transaction [0-9]+\)/(transaction x)/'
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT 'snap', pg_current_snapshot() IS NOT NULL;
\! for i in \$(seq 1 100); do r=\$(PGOPTIONS='-c lock_timeout=10s' psql "$1" -XqAt -c "SELECT pawl.rotate()"); [ -n "\$r" ] && break; sleep 0.1; done
SELECT 'guarded', appended FROM $(ap "ARRAY['gd']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL);
ROLLBACK;
SELECT 'after', appended FROM $(ap "ARRAY['gd']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL);
EOF
}
g_n=$(guard "$D_N"); g_s=$(guard "$D_S")
expect "d: a rotation after a REPEATABLE READ snapshot: the same answers" "$g_s" "$g_n"
expect "d: ... 40001 from the guard, then an append in a new transaction goes through" "snap|t
ERROR:  pawl: the event log was rotated or truncated (transaction x) after this transaction's snapshot was taken; retry the transaction
after|1" "$g_n"

# --- (e) Rights ------------------------------------------------------------------------------
cat >"$tmp/rights.sql" <<EOF
SELECT 'x1', appended, heads FROM $(ap "ARRAY['rights']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" "ARRAY['{\"who\":1}']::jsonb[]" true "ARRAY['rights-1']");
SELECT 'x2 fallback', appended, heads FROM $(ap "ARRAY['rights']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x02']::bytea[]" NULL NULL NULL);
SELECT 'x3 retry', appended, status, seqs FROM $(ap "ARRAY['rights']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL true "ARRAY['rights-1']");
SELECT 'x4 error', t.try(\$c\$$(ap "ARRAY['rights']" "ARRAY[-1]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL true NULL)\$c\$);
SELECT 'x5 no table rights', count(*) FROM pawl.events;
EOF
for d in N S; do
    dsn=D_$d
    PGPASSWORD=napp run "${!dsn} user=$rx password=napp" "$tmp/rights.sql" >"$tmp/rights_x.$d"
    PGPASSWORD=napp run "${!dsn} user=$rn password=napp" "$tmp/rights.sql" >"$tmp/rights_n.$d"
done
expect "e: a caller with EXECUTE only: the same answers" "$(cat "$tmp/rights_x.S")" "$(cat "$tmp/rights_x.N")"
expect "e: ... it appends (the definer's rights), not reading pawl.events itself" "x1|1|{0}
x2 fallback|1|{1}
x3 retry|1|already|{1}
x4 error|ERROR 22023|pawl.append: expected sequence numbers must be >= 0 (0 = any)
ERROR:  permission denied for table events" "$(cat "$tmp/rights_x.N")"
expect "e: a caller without EXECUTE: the same answers" "$(cat "$tmp/rights_n.S")" "$(cat "$tmp/rights_n.N")"
expect "e: ... refused" "4" "$(grep -c 'permission denied for function append' "$tmp/rights_n.N")"

# A hostile search_path: a schema of the caller's first, and pg_temp, with events, append_sql,
# nextval, an = operator for text and one for int8.
for d in "$D_N" "$D_S"; do
    psql "$d" -XqAt -v ON_ERROR_STOP=1 -c "CREATE SCHEMA h AUTHORIZATION $rx" >/dev/null
done
cat >"$tmp/hostile.sql" <<EOF
CREATE TABLE h.events (xid xid8, k int4, stream_id text, stream_seq int8, event_id text);
CREATE TABLE h.stream_floors (stream_id text, last_seq int8);
INSERT INTO h.stream_floors VALUES ('hostile', 1000);
CREATE FUNCTION h.append_sql(streams text[], expected int8[], si int4[], rank int4[], types text[], payloads bytea[], metas jsonb[], notify boolean, ids text[])
RETURNS TABLE (appended int4, txid text, heads int8[], status text, seqs int8[], msg text) LANGUAGE sql AS \$\$ SELECT 42, 'h', ARRAY[42::int8], 'h', NULL::int8[], 'hostile' \$\$;
CREATE FUNCTION h.nextval(regclass) RETURNS int8 LANGUAGE sql AS 'SELECT -1::int8';
CREATE FUNCTION h.texteq(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR h.= (LEFTARG = text, RIGHTARG = text, FUNCTION = h.texteq);
CREATE FUNCTION h.int8eq(int8, int8) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR h.<> (LEFTARG = int8, RIGHTARG = int8, FUNCTION = h.int8eq);
CREATE FUNCTION h.cardinality(anyarray) RETURNS int4 LANGUAGE sql AS 'SELECT 1';
CREATE TEMP TABLE events (xid xid8, k int4, stream_id text, stream_seq int8, event_id text);
CREATE FUNCTION pg_temp.append_sql(streams text[], expected int8[], si int4[], rank int4[], types text[], payloads bytea[], metas jsonb[], notify boolean, ids text[])
RETURNS TABLE (appended int4, txid text, heads int8[], status text, seqs int8[], msg text) LANGUAGE sql AS \$\$ SELECT 43, 'h', ARRAY[43::int8], 'h', NULL::int8[], 'hostile' \$\$;
SET search_path = h, pg_temp, public, pawl, pg_catalog;
SELECT 'h1', appended, heads, status FROM $(ap "ARRAY['hostile']" "ARRAY[0]::int8[]" "ARRAY[1,1]" "ARRAY[1,2]" "ARRAY['a','b']" "ARRAY['\\x01','\\x02']::bytea[]" NULL false "ARRAY['h-1','h-2']");
SELECT 'h2 fallback', appended, heads, status FROM $(ap "ARRAY['hostile']" "ARRAY[3]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL NULL NULL);
SELECT 'h3 wrong', appended, heads, status FROM $(ap "ARRAY['hostile']" "ARRAY[3]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL);
SELECT 'h4 retry', appended, heads, status, seqs FROM $(ap "ARRAY['hostile']" "ARRAY[0]::int8[]" "ARRAY[1,1]" "ARRAY[1,2]" "ARRAY['a','b']" "ARRAY['\\x01','\\x02']::bytea[]" NULL false "ARRAY['h-1','h-2']");
SELECT 'h5 error', t.try(\$c\$$(ap "ARRAY['hostile']" "ARRAY[0]::int8[]" "ARRAY[1,1]" "ARRAY[2,1]" "ARRAY['a','b']" "ARRAY['\\x01','\\x02']::bytea[]" NULL false NULL)\$c\$);
SELECT 'h6 untouched', (SELECT count(*) FROM h.events), (SELECT count(*) FROM pg_temp.events);
EOF
for d in N S; do
    dsn=D_$d
    PGPASSWORD=napp run "${!dsn} user=$rx password=napp" "$tmp/hostile.sql" >"$tmp/hostile.$d"
done
expect "e: a hostile search_path: the same answers" "$(cat "$tmp/hostile.S")" "$(cat "$tmp/hostile.N")"
expect "e: ... and it changes nothing" "h1|2|{0}|
h2 fallback|1|{2}|
h3 wrong|0|{3}|
h4 retry|2||already|{1,2}
h5 error|ERROR 22023|pawl.append: every stream's events must have ranks 1..count, in order
h6 untouched|0|0" "$(cat "$tmp/hostile.N")"
expect "e: ... the rows in pawl.events" "hostile|1|0|2|h-1
hostile|2|1|2|h-2
hostile|3|0|1|" "$(qn "SELECT stream_id, stream_seq, k, n, event_id FROM pawl.events WHERE stream_id = 'hostile' ORDER BY 2")"

# --- (f) Never a crash -----------------------------------------------------------------------
RT="RETURNS TABLE (appended int4, txid text, heads int8[], status text, seqs int8[], msg text)"
decls=(
    "b1(text[], int8[], int4[], int4[], text[], bytea[], jsonb[], boolean) $RT"
    "b2(text[]) $RT"
    "b3() $RT"
    "b4(int4, int8[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[]) $RT"
    "b5(text[], int8[], int4[], int4[], int4, bytea[], jsonb[], boolean, text[]) $RT"
    "b6(text, text, text, text, text, text, text, text, text) $RT"
    "b7(text[], int8[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[]) RETURNS int4"
    "b8(text[], int8[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[]) RETURNS SETOF record"
    "b9(text[], int8[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[]) RETURNS TABLE (a int4)"
    "b10(int8[], int8[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[]) $RT"
    "b11(text[], int8[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[], int4) $RT"
    "b12(text[], int4[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[]) $RT"
    "b13(text[], int8[], int4[], int4[], text[], bytea[], jsonb[], int4, text[]) $RT"
    "b14(text[], int8[], int8[], int8[], text[], bytea[], jsonb[], boolean, text[]) $RT"
)
calls=(
    "SELECT * FROM t.b1(ARRAY['bad'], ARRAY[0]::int8[], ARRAY[1], ARRAY[1], ARRAY['t'], ARRAY['\\x01']::bytea[], NULL, false)"
    "SELECT * FROM t.b2(ARRAY['bad'])"
    "SELECT * FROM t.b3()"
    "SELECT * FROM t.b4(1, ARRAY[0]::int8[], ARRAY[1], ARRAY[1], ARRAY['t'], ARRAY['\\x01']::bytea[], NULL, false, NULL)"
    "SELECT * FROM t.b5(ARRAY['bad'], ARRAY[0]::int8[], ARRAY[1], ARRAY[1], 7, ARRAY['\\x01']::bytea[], NULL, false, NULL)"
    "SELECT * FROM t.b6('bad', '0', '1', '1', 'eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee', 'x', NULL, 'f', NULL)"
    "SELECT t.b7(ARRAY['bad'], ARRAY[0]::int8[], ARRAY[1], ARRAY[1], ARRAY['t'], ARRAY['\\x01']::bytea[], NULL, false, NULL)"
    "SELECT * FROM t.b8(ARRAY['bad'], ARRAY[0]::int8[], ARRAY[1], ARRAY[1], ARRAY['t'], ARRAY['\\x01']::bytea[], NULL, false, NULL) AS x(a int8, b int8)"
    "SELECT * FROM t.b9(ARRAY['bad'], ARRAY[0]::int8[], ARRAY[1], ARRAY[1], ARRAY['t'], ARRAY['\\x01']::bytea[], NULL, false, NULL)"
    "SELECT * FROM t.b10(ARRAY[5], ARRAY[0]::int8[], ARRAY[1], ARRAY[1], ARRAY['t'], ARRAY['\\x01']::bytea[], NULL, false, NULL)"
    "SELECT * FROM t.b11(ARRAY['bad'], ARRAY[0]::int8[], ARRAY[1], ARRAY[1], ARRAY['t'], ARRAY['\\x01']::bytea[], NULL, false, NULL, 3)"
    "SELECT * FROM t.b12(ARRAY['bad'], ARRAY[0], ARRAY[1], ARRAY[1], ARRAY['t'], ARRAY['\\x01']::bytea[], NULL, false, NULL)"
    "SELECT * FROM t.b13(ARRAY['bad'], ARRAY[0]::int8[], ARRAY[1], ARRAY[1], ARRAY['t'], ARRAY['\\x01']::bytea[], NULL, 1, NULL)"
    "SELECT * FROM t.b14(ARRAY['bad'], ARRAY[0]::int8[], ARRAY[1], ARRAY[1], ARRAY['t'], ARRAY['\\x01']::bytea[], NULL, false, NULL)"
)
for i in "${!decls[@]}"; do
    qn "CREATE FUNCTION t.${decls[$i]} LANGUAGE c AS '$LIBREF', 'pawl_append'" >/dev/null ||
        echo "  (declaration ${decls[$i]%%(*} refused)"
done
for i in "${!calls[@]}"; do
    out=$(psql "$D_N" -XqAt -v VERBOSITY=terse -c "${calls[$i]}" -c "SELECT 'alive'" 2>&1)
    now=$(pm_start 2>/dev/null)
    if [ "$now" != "$start" ] || ! grep -q '^alive$' <<<"$out"; then
        expect "f: ${decls[$i]%%(*}: an error, the backend lives (${calls[$i]:0:60}...)" "alive" \
            "$(tr '\n' ' ' <<<"$out" | head -c 300)"
        # A crash restarts the cluster: wait for it before going on.
        for _ in $(seq 1 60); do pm_start >/dev/null 2>&1 && break; sleep 0.5; done
        start=$(pm_start)
    else
        expect "f: ${decls[$i]%%(*}: an error or a row, the backend lives ($(head -1 <<<"$out" | head -c 90))" \
            alive "$(tail -1 <<<"$out")"
    fi
done
expect "f: none of the malformed declarations wrote an event" "0" \
    "$(qn "SELECT count(*) FROM pawl.events WHERE stream_id = 'bad'")"

# Cancellations: an append waiting for the table lock (a rotation's), and one waiting for
# another transaction's row on the stream key; the session answers and nothing is written.
cancel() { # cancel DSN HOLD: the second session's answers
    psql "$1" -XqAt -c "BEGIN" -c "$2" -c "SELECT pg_sleep(1.5)" -c "ROLLBACK" >/dev/null 2>&1 &
    local p=$!
    sleep 0.4
    psql "$1" -XqAt -v VERBOSITY=terse -c "SET statement_timeout = '300ms'" \
        -c "SELECT appended FROM $(ap "ARRAY['cx']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL)" \
        -c "SET lock_timeout = '200ms'" -c "RESET statement_timeout" \
        -c "SELECT appended FROM $(ap "ARRAY['cx']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['a']" "ARRAY['\\x01']::bytea[]" NULL false NULL)" \
        -c "SELECT 'alive'" 2>&1 | sed -E 's/^psql:[^:]*:[0-9]+: //; s/ at character [0-9]+$//'
    wait $p
    psql "$1" -XqAt -c "SELECT 'written', count(*) FROM pawl.events WHERE stream_id = 'cx'"
}
for hold in "LOCK TABLE pawl.events IN ACCESS EXCLUSIVE MODE" \
    "SELECT appended FROM $(ap "ARRAY['cx']" "ARRAY[0]::int8[]" "ARRAY[1]" "ARRAY[1]" "ARRAY['z']" "ARRAY['\\x09']::bytea[]" NULL false NULL)"; do
    a=$(cancel "$D_N" "$hold"); b=$(cancel "$D_S" "$hold")
    expect "f: canceled while waiting (${hold:0:40}): the same answers" "$b" "$a"
done
expect "f: ... statement_timeout cancels the native append, lock_timeout too, the session answers" \
    "ERROR:  canceling statement due to statement timeout
ERROR:  canceling statement due to lock timeout
alive
written|0" "$(cancel "$D_N" "LOCK TABLE pawl.events IN ACCESS EXCLUSIVE MODE")"
expect "f: the postmaster never restarted (no backend crashed)" "$start0" "$(pm_start)"

# --- (g) The library -------------------------------------------------------------------------
cat >"$tmp/events.jsonl" <<'EOF'
{"stream":"lib-1","type":"Placed","payload":{"x":1},"metadata":{"m":1},"id":"lib/1"}
{"stream":"lib-1","type":"Paid","payload":"text payload","id":"lib/2"}
{"stream":"lib-2","type":"Placed","payload":[1,2,3],"seq":1}
{"stream":"lib-1","type":"Shipped","payload":{"big":"0123456789abcdef0123456789abcdef"},"seq":3}
{"stream":"lib-3","type":"Only","payload":null}
EOF
for d in N S; do
    dsn=D_$d
    PAWL_DSN="${!dsn}" "$PAWL" append --wait --events-per-append 2 <"$tmp/events.jsonl" >"$tmp/lib.$d" 2>&1
    echo "exit $?" >>"$tmp/lib.$d"
done
expect "g: pawl append --wait on both: the same events and positions" \
    "$(sed -E 's/index [0-9]+/index I/' "$tmp/lib.S")" "$(sed -E 's/index [0-9]+/index I/' "$tmp/lib.N")"
expect "g: ... all five appended and finalized" "5" "$(grep -c '  index [0-9]' "$tmp/lib.N")"
PAWL_DSN="$D_N" "$PAWL" tail --json --stream-prefix lib- >"$tmp/tail.N" 2>&1
expect "g: pawl tail reads them back, in order, with their ids" \
    "lib-1 1 Placed lib/1
lib-1 2 Paid lib/2
lib-2 1 Placed
lib-1 3 Shipped
lib-3 1 Only" \
    "$(jq -r '[.stream, .seq, .type, .id // empty] | map(tostring) | join(" ")' "$tmp/tail.N" 2>&1)"
printf '%s\n' '{"stream":"lib-1","type":"Late","payload":{},"seq":2}' |
    PAWL_DSN="$D_N" "$PAWL" append >"$tmp/conflict" 2>&1
rc=$?
expect "g: a conflict through the tool: exit 7" 7 "$rc"
expect "g: ... the log's append rows are whole" "0" "$(qn "SELECT count(*) FROM t.bad_appends")"
expect "g: the postmaster never restarted" "$start0" "$(pm_start)"

echo "$checks checks, $fails failure(s)"
[ "$fails" -eq 0 ]
