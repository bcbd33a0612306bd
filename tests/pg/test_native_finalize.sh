#!/usr/bin/env bash
# test_native_finalize.sh — the native pawl.finalize and pawl.runs_guard (sql/native, a PGXS
# extension in C) keep the SQL versions' contract. Builds and installs the extension from a copy
# of sql/native (nothing is written to the source tree), makes two databases with `pawl init`,
# points the functions at C in one (sql/native/activate.sql) and at PL/pgSQL in the other
# (sql/native/deactivate.sql), then, on both:
#   (c) every error (bad max_appends, isolation level, synchronous_commit, read-only transaction,
#       no EXECUTE right) has the same SQLSTATE, message and hint; odd calls (several in one
#       statement, a cursor, a prepared statement, a rolled-back subtransaction, a role with only
#       EXECUTE, a rule on pawl.runs, an empty ledger) give the same results; runs_guard refuses
#       (or lets through) the same hand-made rows with the same errors;
#   (d) a busy gate returns (-1, -1, last index), and the holder's idle time is bounded;
#   (b) a transaction that appends, finalizes, and appends again is never covered by its own run:
#       no index twice, both of its events finalized by the next run;
#   (e) a seeded interleaving of three sessions and an autocommit one (appends, savepoints,
#       rollbacks, finalizations inside and outside transactions, partition rotations) gives the
#       same results call by call and the same log on both paths;
#   (a) concurrent pgbench appenders committing in random order (savepoints, rollbacks, runs
#       inside their own transactions, a rotation) and two finalizers end with every committed
#       event finalized exactly once, indexes 1..N contiguous, per-stream order = stream_seq order.
# Skips (77) when pg_config, the server headers or write access to the server's library folder
# are missing. KEEP_TMP=1 keeps the work folder (outputs of both paths) for inspection.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
SRC=${PAWL_SOURCE_DIR:?run through ctest}
PG_CONFIG=${PG_CONFIG:-pg_config}
for c in psql pgbench make cc; do
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
dbn=t_native_n_$$
dbs=t_native_s_$$
role=t_native_r_$$
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    for d in $dbn $dbs; do
        psql "$BASE_DSN" -XqAtc "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1
    done
    psql "$BASE_DSN" -XqAtc "DROP ROLE IF EXISTS $role" >/dev/null 2>&1
    [ -n "${KEEP_TMP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT
DSN_N="$BASE_DSN dbname=$dbn"
DSN_S="$BASE_DSN dbname=$dbs"
export PAWL_LOG_LEVEL=warn

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
# same NAME FILE_A FILE_B: identical files, else FAIL with the difference.
same() {
    if cmp -s "$2" "$3"; then echo "ok   $1"; else
        echo "FAIL $1"; diff "$2" "$3" | head -20; fails=$((fails + 1)); fi
}

# --- Build and install -----------------------------------------------------------------------
cp -r "$SRC/sql/native" "$tmp/native"
rm -f "$tmp/native"/*.o "$tmp/native"/*.so
if ! make -C "$tmp/native" PG_CONFIG="$PG_CONFIG" >"$tmp/build.log" 2>&1; then
    cat "$tmp/build.log"; echo "FAIL the extension builds (-Wall -Wextra -Werror)"; exit 1
fi
check "the extension builds with -Wall -Wextra -Werror" 0
if ! make -C "$tmp/native" PG_CONFIG="$PG_CONFIG" install >"$tmp/install.log" 2>&1; then
    cat "$tmp/install.log"; echo "FAIL the extension installs"; exit 1
fi
check "the extension installs into $libdir" 0

# --- Two databases: native and SQL -----------------------------------------------------------
for d in $dbn $dbs; do
    psql "$BASE_DSN" -XqAtc "DROP DATABASE IF EXISTS $d" 2>/dev/null && psql "$BASE_DSN" -XqAtc "CREATE DATABASE $d" ||
        exit 1
    PAWL_DSN="$BASE_DSN dbname=$d" "$PAWL" init >"$tmp/init.$d" 2>&1 ||
        { cat "$tmp/init.$d"; echo "FAIL pawl init"; exit 1; }
done
fdef="SELECT p.proowner::regrole, p.proacl, p.prosecdef, p.proconfig
        FROM pg_proc p WHERE p.oid = 'pawl.finalize(int4)'::regprocedure"
psql "$DSN_N" -XqAtc "GRANT EXECUTE ON FUNCTION pawl.finalize(int4) TO pg_monitor"
before=$(psql "$DSN_N" -XqAtc "$fdef")
psql "$DSN_N" -XqAt -v ON_ERROR_STOP=1 -f "$SRC/sql/native/activate.sql" >/dev/null
check "activate.sql" $?
psql "$DSN_S" -XqAt -v ON_ERROR_STOP=1 -f "$SRC/sql/native/deactivate.sql" >/dev/null
check "deactivate.sql" $?
lang() { psql "$1" -XqAtc "SELECT string_agg(l.lanname, ',' ORDER BY p.proname)
                             FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                            WHERE p.oid IN ('pawl.finalize(int4)'::regprocedure,
                                            'pawl.runs_guard()'::regprocedure)"; }
[ "$(lang "$DSN_N")" = c,c ] && [ "$(lang "$DSN_S")" = plpgsql,plpgsql ]
check "one database finalizes (and guards runs) in C, the other in PL/pgSQL" $?
after=$(psql "$DSN_N" -XqAtc "$fdef")
[ "${after%%|t|*}" = "${before%%|t|*}" ] && [[ "$after" == *"pg_monitor=X/"*'|t|{"search_path=pg_catalog, pg_temp"}' ]]
check "activation keeps owner and grants, SECURITY DEFINER, pinned search_path ($after)" $?
psql "$DSN_N" -XqAtc "REVOKE EXECUTE ON FUNCTION pawl.finalize(int4) FROM pg_monitor"

# --- Sessions: psql reading from a FIFO, one statement batch at a time ----------------------
declare -A sfd spid
s_open() { # s_open ID DSN
    rm -f "$tmp/s$1.in" "$tmp/s$1.out"
    mkfifo "$tmp/s$1.in"
    # Without the other sessions' FIFOs: a reader holding one open would keep it from closing.
    (
        for fd in "${sfd[@]}"; do exec {fd}>&-; done
        exec psql "$2" -XqAt <"$tmp/s$1.in" >"$tmp/s$1.out" 2>&1
    ) &
    spid[$1]=$!
    pids+=($!)
    local fd
    exec {fd}>"$tmp/s$1.in"
    sfd[$1]=$fd
}
s_close() { # s_close ID
    local fd=${sfd[$1]}
    exec {fd}>&-
    unset "sfd[$1]"
    wait "${spid[$1]}" 2>/dev/null
}
s_run() { # s_run ID SQL: run SQL in session ID, wait for it, print its output (a line per row)
    local id=$1 n0 i
    # The marker is the output's line count: it grows with every call (by the marker itself at
    # least), so it is unique in that output even when s_run runs in a subshell.
    n0=$(wc -l <"$tmp/s$id.out")
    printf '%s\n\\echo @@%d\n' "$2" "$n0" >&"${sfd[$id]}"
    for ((i = 0; i < 6000; i++)); do
        grep -qx "@@$n0" "$tmp/s$id.out" && break
        sleep 0.005
    done
    tail -n +$((n0 + 1)) "$tmp/s$id.out" | sed "/^@@$n0\$/,\$d"
}

# check_log DSN NAME: the log's invariants.
check_log() {
    local r
    r=$(psql "$1" -XqAt <<'EOF'
WITH v AS MATERIALIZED (SELECT * FROM pawl_api.events),
     s AS (SELECT
        (SELECT count(*) FROM pawl.events) AS stored,
        (SELECT count(*) FROM v) AS mapped,
        (SELECT count(DISTINCT global_index) FROM v) AS distinct_idx,
        (SELECT coalesce(min(global_index), 1) FROM v) AS lo,
        (SELECT coalesce(max(global_index), 0) FROM v) AS hi,
        (SELECT count(DISTINCT (stream_id, stream_seq)) FROM v) AS distinct_seq,
        (SELECT r.last_index FROM pawl.runs r ORDER BY r.last_index DESC LIMIT 1) AS last,
        (SELECT count(*) FROM (SELECT global_index, lag(global_index) OVER
                                      (PARTITION BY stream_id ORDER BY stream_seq) AS p
                                 FROM v) w WHERE w.p > w.global_index) AS inversions,
        (SELECT count(*) FROM pawl.runs r CROSS JOIN LATERAL unnest(r.xids, r.ns) AS a(x, n)
           JOIN pawl.events e ON e.xid = a.x AND e.k = 0 WHERE e.n <> a.n) AS miscounted,
        (SELECT count(*) FROM (SELECT x FROM pawl.runs r, unnest(r.xids) AS x
                                GROUP BY x HAVING count(*) > 1) d) AS twice,
        (SELECT count(*) FROM pawl.events e WHERE e.k = 0 AND e.xid NOT IN
                (SELECT unnest(r.xids) FROM pawl.runs r)) AS unfinalized)
SELECT format('stored=%s mapped=%s distinct=%s range=%s..%s streamseq=%s last=%s inversions=%s '
              'miscounted=%s twice=%s unfinalized=%s', stored, mapped, distinct_idx, lo, hi,
              distinct_seq, last, inversions, miscounted, twice, unfinalized),
       stored = mapped AND mapped = distinct_idx AND lo = 1 AND hi = mapped AND last = hi
       AND distinct_seq = stored AND inversions = 0 AND miscounted = 0 AND twice = 0
       AND unfinalized = 0
  FROM s;
EOF
)
    [[ "$r" == *"|t" ]]
    check "$2: ${r%|*}" $?
}

# --- (c) errors and odd calls: same results on both paths ------------------------------------
psql "$BASE_DSN" -XqAtc "DROP ROLE IF EXISTS $role; CREATE ROLE $role NOLOGIN" >/dev/null 2>&1
cat >"$tmp/calls.sql" <<'EOF'
CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; msg text; hint text; r text;
BEGIN
    EXECUTE q INTO r;
    RETURN 'ok ' || coalesce(r, 'NULL');
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, hint = PG_EXCEPTION_HINT;
    RETURN st || ' | ' || msg || ' | ' || hint;
END $$;
-- Runs a statement and undoes it (a subtransaction), reporting its result or its error.
CREATE FUNCTION pg_temp.try_undo(q text, setup text DEFAULT NULL) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; msg text; r text;
BEGIN
    IF setup IS NOT NULL THEN EXECUTE setup; END IF;
    EXECUTE q INTO r;
    RAISE EXCEPTION USING ERRCODE = 'PWTST', MESSAGE = coalesce(r, 'NULL');
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    IF st = 'PWTST' THEN RETURN 'ok (undone) ' || msg; END IF;
    RETURN st || ' | ' || msg;
END $$;
GRANT USAGE ON SCHEMA pawl TO :"role";
SELECT 'null', pg_temp.try('SELECT row(f.*)::text FROM pawl.finalize(NULL) f');
SELECT 'zero', pg_temp.try('SELECT row(f.*)::text FROM pawl.finalize(0) f');
SELECT 'negative', pg_temp.try('SELECT row(f.*)::text FROM pawl.finalize(-2147483648) f');
SELECT 'empty', pg_temp.try('SELECT row(f.*)::text FROM pawl.finalize() f');
SELECT pawl_api.append('c1', 'T', '\x01');
BEGIN ISOLATION LEVEL READ UNCOMMITTED;
SELECT 'read uncommitted', pg_temp.try('SELECT row(f.*)::text FROM pawl.finalize() f');
ROLLBACK;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT 'repeatable read', pg_temp.try('SELECT row(f.*)::text FROM pawl.finalize() f');
ROLLBACK;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT 'serializable', pg_temp.try('SELECT row(f.*)::text FROM pawl.finalize() f');
ROLLBACK;
SET synchronous_commit = off;
SELECT 'sync off', pg_temp.try('SELECT row(f.*)::text FROM pawl.finalize() f');
SET synchronous_commit = local;
SELECT 'sync local', pg_temp.try('SELECT row(f.*)::text FROM pawl.finalize() f');
SET synchronous_commit = remote_write;
BEGIN;
SELECT 'sync remote_write', pg_temp.try('SELECT row(f.*)::text FROM pawl.finalize() f');
ROLLBACK;
RESET synchronous_commit;
BEGIN READ ONLY;
SELECT 'read only', pg_temp.try('SELECT row(f.*)::text FROM pawl.finalize() f');
ROLLBACK;
SET ROLE :"role";
SELECT 'no execute right', pg_temp.try('SELECT row(f.*)::text FROM pawl.finalize() f');
RESET ROLE;
GRANT EXECUTE ON FUNCTION pawl.finalize(int4) TO :"role";
SET ROLE :"role";
SELECT 'execute only', * FROM pawl.finalize();
SELECT 'execute only, reads', pg_temp.try('SELECT count(*)::text FROM pawl.runs');
RESET ROLE;
SELECT pawl_api.append('c1', 'T', '\x02');
SELECT pawl_api.append('c2', 'T', '\x03');
SELECT 'three in one statement', pawl.finalize(1) FROM generate_series(1, 3);
SELECT pawl_api.append('c1', 'T', '\x04');
DO $$ BEGIN PERFORM pawl.finalize(); RAISE EXCEPTION 'undo'; EXCEPTION WHEN raise_exception THEN NULL; END $$;
SELECT 'after an undone run', * FROM pawl.finalize();
SELECT pawl_api.append('c1', 'T', '\x05');
BEGIN;
DECLARE c CURSOR FOR SELECT * FROM pawl.finalize(5);
FETCH c;
COMMIT;
SELECT pawl_api.append('c1', 'T', '\x06');
PREPARE fin(int4) AS SELECT * FROM pawl.finalize($1);
EXECUTE fin(2147483646);
EXECUTE fin(1);
SELECT 'column', (pawl.finalize()).last_index;
SELECT 'where false', count(*) FROM pawl.finalize() WHERE false;
SET search_path = pg_temp;
SELECT 'search_path', * FROM pawl.finalize();
RESET search_path;
-- A rule on pawl.runs: the native run inserts through the executor's full path (SPI).
CREATE RULE t_native_rule AS ON INSERT TO pawl.runs DO ALSO NOTIFY t_native;
SELECT pawl_api.append('c3', 'T', '\x08');
SELECT pawl_api.append('c3', 'T', '\x09');
SELECT 'through a rule', * FROM pawl.finalize(1);
DROP RULE t_native_rule ON pawl.runs;
-- runs_guard: rows no correct run produces are refused, even from the owner.
CREATE TEMP VIEW nx AS SELECT max(last_index) + 1 AS n FROM pawl.runs;
-- One run row for try_undo: last_index, first_index and bases as SQL expressions over n (the
-- next index), xids and ns as array literals.
CREATE FUNCTION pg_temp.ins(l text, f text, x text, b text, c text) RETURNS text LANGUAGE sql AS $$
    SELECT format('INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids, bases, ns, '
                  'open_xids) SELECT %s, %s, ''0'', %L, %s, %L, ''{}'' FROM nx '
                  'RETURNING last_index::text', l, f, x, b, c) $$;
SELECT 'guard ok', pg_temp.try_undo(pg_temp.ins('n + 1', 'n', '{3,4}', 'ARRAY[n, n + 1]', '{1,1}'));
SELECT 'guard two rows', pg_temp.try_undo('WITH v AS (INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids, bases, ns, open_xids) SELECT n + k, n + k, ''0'', ''{3}'', ARRAY[n + k], ''{1}'', ''{}'' FROM nx, generate_series(0, 1) k RETURNING 1) SELECT count(*)::text FROM v');
SELECT 'guard gap', pg_temp.try_undo(pg_temp.ins('n + 1', 'n + 1', '{3}', 'ARRAY[n + 1]', '{1}'));
SELECT 'guard overlap', pg_temp.try_undo(pg_temp.ins('n - 1', 'n - 1', '{3}', 'ARRAY[n - 1]', '{1}'));
SELECT 'guard no appends', pg_temp.try_undo(pg_temp.ins('n', 'n', '{}', 'ARRAY[]::int8[]', '{}'));
SELECT 'guard short bases', pg_temp.try_undo(pg_temp.ins('n + 1', 'n', '{3,4}', 'ARRAY[n]', '{1,1}'));
SELECT 'guard short ns', pg_temp.try_undo(pg_temp.ins('n + 1', 'n', '{3,4}', 'ARRAY[n, n + 1]', '{1}'));
SELECT 'guard first base', pg_temp.try_undo(pg_temp.ins('n', 'n', '{3}', 'ARRAY[n + 5]', '{1}'));
SELECT 'guard zero count', pg_temp.try_undo(pg_temp.ins('n - 1', 'n', '{3}', 'ARRAY[n]', '{0}'));
SELECT 'guard last', pg_temp.try_undo(pg_temp.ins('n + 7', 'n', '{3}', 'ARRAY[n]', '{2}'));
SELECT 'guard overflow', pg_temp.try_undo(pg_temp.ins('n + 1', 'n', '{3,4}', 'ARRAY[n, 9223372036854775807]', '{1,5}'));
SELECT 'guard null xids', pg_temp.try_undo(pg_temp.ins('n', 'n', NULL, 'ARRAY[n]', '{1}'));
SELECT 'guard null first', pg_temp.try_undo(pg_temp.ins('n', 'NULL', '{3}', 'ARRAY[n]', '{1}'));
SELECT 'guard null base', pg_temp.try_undo(pg_temp.ins('n', 'n', '{3}', 'ARRAY[NULL]::int8[]', '{1}'));
SELECT 'guard 2-D bases', pg_temp.try_undo(pg_temp.ins('n', 'n', '{3}', 'ARRAY[ARRAY[n]]', '{1}'));
SELECT 'guard bases from 0', pg_temp.try_undo(pg_temp.ins('n', 'n', '{3}', $$('[0:0]={' || n || '}')::int8[]$$, '{1}'));
SELECT 'guard update', pg_temp.try_undo('UPDATE pawl.runs SET finalized_at = now() WHERE last_index = 0 RETURNING last_index::text');
SELECT 'guard delete', pg_temp.try_undo('DELETE FROM pawl.runs WHERE last_index = 0 RETURNING last_index::text');
SELECT 'guard origin', pg_temp.try_undo('INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids, bases, ns, open_xids) VALUES (0, 0, ''0'', ''{}'', ''{}'', ''{}'', ''{}'') RETURNING last_index::text', 'TRUNCATE pawl.runs');
SELECT 'guard bad origin', pg_temp.try_undo('INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids, bases, ns, open_xids) VALUES (1, 1, ''0'', ''{}'', ''{}'', ''{}'', ''{}'') RETURNING last_index::text', 'TRUNCATE pawl.runs');
SELECT 'guard origin with appends', pg_temp.try_undo('INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids, bases, ns, open_xids) VALUES (0, 0, ''0'', ''{5}'', ''{0}'', ''{1}'', ''{}'') RETURNING last_index::text', 'TRUNCATE pawl.runs');
SELECT 'guard null origin', pg_temp.try_undo('INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids, bases, ns, open_xids) VALUES (0, NULL, ''0'', ''{}'', ''{}'', ''{}'', ''{}'') RETURNING last_index::text', 'TRUNCATE pawl.runs');
SELECT 'no runs', pg_temp.try_undo('SELECT row(f.*)::text FROM pawl.finalize() f', 'TRUNCATE pawl.runs');
SELECT 'after the guard', * FROM pawl.finalize();
EOF
for d in n s; do
    dsn=DSN_${d^^}
    psql "${!dsn}" -XqAt -v role="$role" -f "$tmp/calls.sql" >"$tmp/calls.$d" 2>&1
done
same "errors and odd calls: same SQLSTATE, message, hint and results on both paths" \
    "$tmp/calls.s" "$tmp/calls.n"
grep -q '^zero|22023 | pawl.finalize: max_appends must be at least 1 | $' "$tmp/calls.n" &&
    grep -q '^repeatable read|25000 | pawl.finalize must run at READ COMMITTED, not REPEATABLE READ | SET default_transaction_isolation' "$tmp/calls.n" &&
    grep -q '^sync local|25000 | pawl.finalize must run with synchronous_commit on or stronger, not local | SET synchronous_commit = on' "$tmp/calls.n" &&
    grep -q '^read only|25006 ' "$tmp/calls.n" && grep -q '^no execute right|42501 ' "$tmp/calls.n" &&
    grep -q '^execute only|1|1|1$' "$tmp/calls.n" && grep -q '^execute only, reads|42501 ' "$tmp/calls.n" &&
    grep -q '^through a rule|2|2|' "$tmp/calls.n" && grep -q '^guard ok|ok (undone)' "$tmp/calls.n" &&
    grep -q '^guard two rows|ok (undone) 2$' "$tmp/calls.n" &&
    grep -q '^guard gap|23000 | pawl.runs: a run must start at' "$tmp/calls.n" &&
    grep -q '^guard last|23000 | pawl.runs: run .* is not a contiguous list of appends$' "$tmp/calls.n" &&
    grep -q '^guard update|23000 | pawl.runs: rows are never updated or deleted$' "$tmp/calls.n"
_rc=$?; check "the expected errors and results (native: $(tr '\n' ';' <"$tmp/calls.n" | cut -c1-120)...)" $_rc
# The SQL version's chunk arithmetic overflows int4 at max_appends = 2147483647 ("integer out of
# range" whenever it has something to finalize); the native one takes every int4 >= 1.
psql "$DSN_N" -XqAtc "SELECT pawl_api.append('c1', 'T', '\x07')" >/dev/null
[ "$(psql "$DSN_N" -XqAtc "SELECT appends, events FROM pawl.finalize(2147483647)")" = "1|1" ]
check "native: max_appends = 2147483647 finalizes" $?
psql "$DSN_S" -XqAtc "SELECT pawl_api.append('c1', 'T', '\x07')" -c "SELECT pawl.finalize(2147483646)" >/dev/null
check_log "$DSN_N" "after the odd calls, native"

# --- (d) a busy gate, and the holder's idle time ---------------------------------------------
last=$(psql "$DSN_N" -XqAtc "SELECT max(last_index) FROM pawl.runs")
for d in n s; do
    dsn=DSN_${d^^}
    s_open 1 "${!dsn}"
    s_open 2 "${!dsn}"
    {
        s_run 1 "SELECT pawl_api.append('d1', 'T', '\x01');"
        s_run 1 "SET idle_in_transaction_session_timeout = '1h'; BEGIN; SELECT * FROM pawl.finalize();"
        s_run 2 "SELECT 'busy', * FROM pawl.finalize();"
        s_run 1 "SHOW idle_in_transaction_session_timeout; COMMIT; SHOW idle_in_transaction_session_timeout;"
        s_run 1 "SET idle_in_transaction_session_timeout = '2s'; BEGIN; SELECT * FROM pawl.finalize();"
        s_run 1 "SHOW idle_in_transaction_session_timeout; COMMIT;"
        s_run 2 "SELECT 'free', * FROM pawl.finalize();"
    } >"$tmp/busy.$d"
    s_close 1
    s_close 2
done
same "busy gate: same results on both paths" "$tmp/busy.s" "$tmp/busy.n"
grep -qx "busy|-1|-1|$last" "$tmp/busy.n" && grep -qx "5s" "$tmp/busy.n" && grep -qx "1h" "$tmp/busy.n" &&
    grep -qx "2s" "$tmp/busy.n" && grep -qx "free|0|0|$((last + 1))" "$tmp/busy.n"
check "busy gate returns (-1, -1, $last); the holder's idle timeout is at most 5 s, for its transaction" $?
last=$((last + 1))

# --- (b) a run never covers its caller's own transaction -------------------------------------
for d in n s; do
    dsn=DSN_${d^^}
    s_open 1 "${!dsn}"
    s_open 2 "${!dsn}"
    {
        s_run 1 "BEGIN; SELECT pawl_api.append('ph', 'T', '\x01');"
        s_run 2 "SELECT pawl_api.append('other', 'T', '\x01');"
        s_run 1 "SELECT 'inside', * FROM pawl.finalize();"
        s_run 1 "SELECT pawl_api.append('ph', 'T', '\x02'); COMMIT;"
        s_run 2 "SELECT 'after', * FROM pawl.finalize();"
    } >"$tmp/own.$d"
    s_close 1
    s_close 2
    psql "${!dsn}" -XqAtc "SELECT stream_id, stream_seq, global_index FROM pawl_api.events
                           WHERE stream_id IN ('ph', 'other') ORDER BY 3" >>"$tmp/own.$d"
done
same "own transaction: same results on both paths" "$tmp/own.s" "$tmp/own.n"
grep -qx "inside|1|1|$((last + 1))" "$tmp/own.n" && grep -qx "after|1|2|$((last + 3))" "$tmp/own.n" &&
    grep -qx "ph|1|$((last + 2))" "$tmp/own.n" && grep -qx "ph|2|$((last + 3))" "$tmp/own.n" &&
    grep -qx "other|1|$((last + 1))" "$tmp/own.n"
check "own transaction: its run finalizes only the other append; the next run both of its events" $?
check_log "$DSN_N" "after the own-transaction case, native"
check_log "$DSN_S" "after the own-transaction case, SQL"

# --- (e) the same seeded interleaving on both paths ------------------------------------------
cat >"$tmp/gen.awk" <<'EOF'
# One line per step: the session (0 = autocommit, 1..3 = transactions) and its statements.
function app(s, st) { return sprintf("SELECT 'A', pawl_api.append('%s', 'T', '\\x%02x');", s, st % 256) }
function batch(s, st) {
    return sprintf("SELECT 'B', stream_seq FROM pawl_api.append_batch(ARRAY['s%da', 's%db', 's%da'], " \
                   "ARRAY['T', 'U', 'V'], ARRAY['\\x%02x'::bytea, '\\x00', '\\x01']);", s, s, s, st % 256)
}
BEGIN {
    srand(seed)
    for (st = 1; st <= steps; st++) {
        if (st % 90 == 0) {
            # Rotate the partitions (it waits for every open appender: end them first).
            for (s = 1; s <= 3; s++) if (intx[s]) { printf "%d\tCOMMIT;\n", s; intx[s] = 0 }
            printf "0\tSELECT 'R' FROM pawl.rotate();\n"
            continue
        }
        r = rand()
        if (r < 0.12) { printf "0\tSELECT 'F', * FROM pawl.finalize(%d);\n", 1 + int(rand() * 4); continue }
        if (r < 0.18) { printf "0\t%s\n", app("m" (1 + int(rand() * 2)), st); continue }
        if (r < 0.21) {
            busy = 0
            for (s = 1; s <= 3; s++) if (intx[s]) busy = 1
            if (!busy) { printf "0\tSELECT 'R' FROM pawl.rotate();\n"; continue }
        }
        s = 1 + int(rand() * 3)
        sn = "s" s (rand() < 0.5 ? "a" : "b")
        if (!intx[s]) { printf "%d\tBEGIN; %s\n", s, app(sn, st); intx[s] = 1; fin[s] = 0; continue }
        r2 = rand()
        if (fin[s]) {
            # It holds the gate: end soon (its idle time is bounded), often appending first.
            if (r2 < 0.2) printf "%d\tROLLBACK;\n", s
            else if (r2 < 0.7) printf "%d\t%s COMMIT;\n", s, app(sn, st)
            else printf "%d\tCOMMIT;\n", s
            intx[s] = 0
            continue
        }
        if (r2 < 0.25) printf "%d\t%s\n", s, app(sn, st)
        else if (r2 < 0.35) printf "%d\tSAVEPOINT p; %s ROLLBACK TO SAVEPOINT p;\n", s, app(sn, st)
        else if (r2 < 0.45) printf "%d\tSAVEPOINT p; %s RELEASE SAVEPOINT p;\n", s, batch(s, st)
        else if (r2 < 0.6) { printf "%d\tSELECT 'F', * FROM pawl.finalize(%d);\n", s, 1 + int(rand() * 3); fin[s] = 1 }
        else if (r2 < 0.9) { printf "%d\tCOMMIT;\n", s; intx[s] = 0 }
        else { printf "%d\tROLLBACK;\n", s; intx[s] = 0 }
    }
    for (s = 1; s <= 3; s++) if (intx[s]) printf "%d\tCOMMIT;\n", s
    printf "0\tSELECT 'F', * FROM pawl.finalize(3);\n0\tSELECT 'F', * FROM pawl.finalize();\n"
}
EOF
awk -v seed=4242 -v steps=260 -f "$tmp/gen.awk" >"$tmp/ops"

for d in n s; do
    dsn=DSN_${d^^}
    for i in 0 1 2 3; do s_open $i "${!dsn}"; done
    step=0
    while IFS=$'\t' read -r sid sql; do
        step=$((step + 1))
        printf '%d %d %s\n' "$step" "$sid" "$(s_run "$sid" "$sql" | tr '\n' ' ')"
    done <"$tmp/ops" >"$tmp/inter.$d"
    for i in 0 1 2 3; do s_close $i; done
    psql "${!dsn}" -XqAtc "SELECT global_index, stream_id, stream_seq, type, encode(payload, 'hex')
                           FROM pawl_api.events ORDER BY 1" >"$tmp/events.$d"
    psql "${!dsn}" -XqAtc "SELECT first_index, last_index, bases, ns, cardinality(xids)
                           FROM pawl.runs ORDER BY 1" >"$tmp/runs.$d"
done
! grep "ERROR\|FATAL" "$tmp/inter.n" "$tmp/inter.s"
_rc=$?; check "interleaving: no statement failed ($(grep -c . "$tmp/ops") steps, $(grep -c "'F'" "$tmp/ops") runs, $(grep -c "'R'" "$tmp/ops") rotations)" $_rc
same "interleaving: every call returns the same on both paths" "$tmp/inter.s" "$tmp/inter.n"
same "interleaving: the same log (indexes, streams, sequences, payloads)" "$tmp/events.s" "$tmp/events.n"
same "interleaving: the same runs (bounds, bases, counts)" "$tmp/runs.s" "$tmp/runs.n"
parts=$(psql "$DSN_N" -XqAtc "SELECT count(*) FROM pawl.event_parts")
[ "$parts" -ge 2 ]
check "interleaving: pawl.events has $parts partitions" $?
check_log "$DSN_N" "interleaving, native"
check_log "$DSN_S" "interleaving, SQL"

# --- (a) concurrent appenders, committing in random order, and two finalizers ----------------
cat >"$tmp/app.sql" <<'EOF'
\set s random(1, 16)
\set r random(1, 100)
\set d random(0, 2000)
BEGIN;
SELECT pawl_api.append('c' || :s, 'T', '\x01');
\if :r <= 12
SAVEPOINT a;
SELECT pawl_api.append('c' || :s, 'T', '\x02');
ROLLBACK TO SAVEPOINT a;
\elif :r <= 24
SAVEPOINT a;
SELECT count(*) FROM pawl_api.append_batch(ARRAY['c' || :s, 'd' || :s], ARRAY['T', 'T'], ARRAY['\x03'::bytea, '\x04']);
RELEASE SAVEPOINT a;
\elif :r <= 34
SELECT * FROM pawl.finalize(3);
SELECT pawl_api.append('c' || :s, 'T', '\x05');
\endif
\sleep :d us
\if :r > 92
ROLLBACK;
\else
COMMIT;
\endif
EOF
cat >"$tmp/fin.sql" <<'EOF'
\set m random(1, 4)
SELECT * FROM pawl.finalize(:m);
\sleep 1 ms
EOF
for d in n s; do
    dsn=DSN_${d^^}
    pgbench -n -f "$tmp/app.sql" -c 4 -j 2 -T 8 --max-tries=20 "${!dsn}" >"$tmp/app.$d" 2>&1 &
    ap=$!
    pids+=($ap)
    pgbench -n -f "$tmp/fin.sql" -c 2 -T 8 "${!dsn}" >"$tmp/fin.$d" 2>&1 &
    fp=$!
    pids+=($fp)
    sleep 4
    psql "${!dsn}" -XqAtc "SET lock_timeout = '5s'; SELECT pawl.rotate() IS NOT NULL" >"$tmp/rot.$d" 2>&1
    wait $ap
    arc=$?
    wait $fp
    frc=$?
    [ $arc -eq 0 ] && [ $frc -eq 0 ]
    _rc=$?; check "concurrent ($d): pgbench appenders and finalizers ran ($(grep -E '^number of (transactions actually processed|failed)' "$tmp/app.$d" | tr '\n' ' '))" $_rc
    [ $arc -eq 0 ] || tail -5 "$tmp/app.$d"
    [ $frc -eq 0 ] || tail -5 "$tmp/fin.$d"
    psql "${!dsn}" -XqAtc "SELECT * FROM pawl.finalize()" >/dev/null
    [ "$(psql "${!dsn}" -XqAtc "SELECT appends FROM pawl.finalize()")" = 0 ]
    check "concurrent ($d): a last run finds nothing left" $?
    check_log "${!dsn}" "concurrent ($d)"
done

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
