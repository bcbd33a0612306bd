#!/usr/bin/env bash
# test_finalize_fixes.sh — the fixes of sql/017_finalize_fixes.sql, on the SQL path (a database
# made with `pawl init --server-path sql`) and, where the server has pawl_native and the test's
# login is a superuser, on the native path too:
#   - pawl.finalize(2147483647) finalizes like any call whose max_appends covers every append
#     (one run row for all of them); the SQL version used to fail with "integer out of range";
#   - the SQL pawl.runs_guard refuses run rows whose xids, bases, ns or open_xids hold a NULL
#     element, start at a subscript other than 1 or have more than one dimension, inserted by
#     the table's owner as the next run (where only those arrays are wrong), while well-formed
#     rows still go through and the other checks are unchanged (the native guard's answers to
#     the same rows are printed, not checked: pg_test_native_finalize compares the two);
#   - pawl_api.read and pawl_api.read_filtered still refuse a read below the retention
#     watermark with SQLSTATE PW020 and the same message, detail and hint, both before reading
#     and when a drop commits while the read waits for its locks.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
BASE_DSN=${PAWL_TEST_DSN:?run through ctest}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

tmp=$(mktemp -d)
dbs=t_ffix_s_$$
dbn=t_ffix_n_$$
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    for d in $dbs $dbn; do
        psql "$BASE_DSN" -XqAtc "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
export PAWL_LOG_LEVEL=warn PAWL_PROGRESS=off

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
# is NAME GOT WANT: equal strings, else FAIL showing both.
is() {
    if [ "$2" = "$3" ]; then echo "ok   $1"; else
        echo "FAIL $1"; echo "     got:  $2"; echo "     want: $3"; fails=$((fails + 1)); fi
}

# The paths to check: sql always; native where this server and login can have it.
paths=(sql)
native=$(psql "$BASE_DSN" -XqAtc "SELECT (SELECT count(*) FROM pg_available_extensions
                                           WHERE name = 'pawl_native') = 1
                                   AND (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)")
if [ "$native" = t ]; then paths+=(native); else
    echo "note the native path is not available here (no pawl_native, or not a superuser): SQL only"
fi

# pg_temp helpers for one session: try runs a query and returns its first value, or its error as
# SQLSTATE | message | detail | hint; try_undo runs it and undoes it (a subtransaction).
helpers=$(cat <<'EOF'
CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; msg text; det text; hint text; r text;
BEGIN
    EXECUTE q INTO r;
    RETURN 'ok ' || coalesce(r, 'NULL');
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL,
                            hint = PG_EXCEPTION_HINT;
    RETURN st || ' | ' || msg || ' | ' || det || ' | ' || hint;
END $$;
CREATE FUNCTION pg_temp.try_undo(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; msg text; r text;
BEGIN
    EXECUTE q INTO r;
    RAISE EXCEPTION USING ERRCODE = 'PWTST', MESSAGE = coalesce(r, 'NULL');
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    IF st = 'PWTST' THEN RETURN 'ok (undone) ' || msg; END IF;
    RETURN st || ' | ' || msg;
END $$;
EOF
)

pw020() { # pw020 W AFTER: the refusal, as try prints it
    echo "PW020 | pawl: the log starts at index $1 (retention dropped the events below it); cannot read after index $2 | low_watermark=$1 after_index=$2 | read from index $1 on (after $(($1 - 1))), or reload the archive"
}

for path in "${paths[@]}"; do
    db=$dbs
    [ "$path" = native ] && db=$dbn
    DSN="$BASE_DSN dbname=$db"
    q() { psql "$DSN" -XqAt -v ON_ERROR_STOP=1 -c "$helpers" -c "$1" 2>&1; }
    psql "$BASE_DSN" -XqAtc "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null 2>&1 ||
        { echo "FAIL cannot create $db"; exit 1; }
    if ! PAWL_DSN="$DSN" "$PAWL" init --server-path "$path" >"$tmp/init.$path" 2>&1; then
        # A pawl_native of another version than this pawl's, say.
        if [ "$path" = native ] && grep -q "native server path is not available" "$tmp/init.$path"; then
            echo "note $(grep -o "native server path is not available.*" "$tmp/init.$path"): SQL only"
            continue
        fi
        cat "$tmp/init.$path"; echo "FAIL pawl init --server-path $path"; exit 1
    fi
    langs=$(q "SELECT string_agg(p.proname || '=' || l.lanname, ',' ORDER BY p.proname)
                 FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                WHERE p.oid IN ('pawl.finalize(int4)'::regprocedure,
                                'pawl.runs_guard()'::regprocedure,
                                'pawl_api.read(int8, int4)'::regprocedure)")
    want=finalize=plpgsql,read=plpgsql,runs_guard=plpgsql
    [ "$path" = native ] && want=finalize=c,read=c,runs_guard=c
    is "$path: the server functions are on the $path path" "$langs" "$want"
    is "$path: the schema is at the library's version" \
        "$(q "SELECT max(version) FROM pawl.schema_version")" \
        "$(find "${PAWL_SOURCE_DIR:-$(dirname "$0")/../..}/sql" -maxdepth 1 -name '[0-9][0-9][0-9]_*.sql' |
            sed -E 's|.*/0*([0-9]+)_[^/]*$|\1|' | sort -n | tail -1)"

    # --- pawl.finalize(2147483647) ------------------------------------------------------------
    for i in 1 2 3; do q "SELECT pawl_api.append('f-$i', 'T', '\\x0$i')" >/dev/null; done
    is "$path: finalize(2147483647) finalizes the three appends" \
        "$(q "SELECT pg_temp.try('SELECT row(f.*)::text FROM pawl.finalize(2147483647) f')")" \
        "ok (3,3,3)"
    is "$path: ... in one run row, indexes 1..3" \
        "$(q "SELECT string_agg(format('%s..%s:%s', r.first_index, r.last_index,
                                       cardinality(r.xids)), ' ' ORDER BY r.last_index)
                FROM pawl.runs r WHERE r.last_index > 0")" "1..3:3"
    for i in 4 5 6; do q "SELECT pawl_api.append('f-$i', 'T', '\\x0$i')" >/dev/null; done
    is "$path: finalize(2147483646) too" \
        "$(q "SELECT pg_temp.try('SELECT row(f.*)::text FROM pawl.finalize(2147483646) f')")" \
        "ok (3,3,6)"
    is "$path: nothing left: (0, 0, last index)" \
        "$(q "SELECT pg_temp.try('SELECT row(f.*)::text FROM pawl.finalize(2147483647) f')")" \
        "ok (0,0,6)"
    for i in 7 8 9; do q "SELECT pawl_api.append('f-$i', 'T', '\\x0$i')" >/dev/null; done
    is "$path: a small max_appends still splits the run" \
        "$(q "SELECT row(f.*)::text FROM pawl.finalize(2) f" && q "SELECT count(*) FROM pawl.runs")" \
        "$(printf '(3,3,9)\n5')"
    is "$path: the log reads 1..9 in order, each event once" \
        "$(q "SELECT string_agg(global_index || '=' || stream_id, ' ' ORDER BY global_index)
                FROM pawl_api.read(0, 100)")" \
        "1=f-1 2=f-2 3=f-3 4=f-4 5=f-5 6=f-6 7=f-7 8=f-8 9=f-9"
    is "$path: max_appends 0 is still refused" \
        "$(q "SELECT pg_temp.try('SELECT row(f.*)::text FROM pawl.finalize(0) f')")" \
        "22023 | pawl.finalize: max_appends must be at least 1 |  | "

    # --- pawl.runs_guard -----------------------------------------------------------------------
    # Each row is the next run (first = last = n, one append of one event) with one array
    # replaced; inserted by the owner and undone.
    guard_sql="CREATE TEMP VIEW nx AS SELECT max(last_index) + 1 AS n FROM pawl.runs;
CREATE FUNCTION pg_temp.ins(x text, b text, c text, o text) RETURNS text LANGUAGE sql AS \$\$
    SELECT pg_temp.try_undo(format('INSERT INTO pawl.runs (last_index, first_index, scan_xmax, '
        'xids, bases, ns, open_xids) SELECT n, n, ''0'', %s, %s, %s, %s FROM nx '
        'RETURNING last_index::text', x, b, c, o)) \$\$;
SELECT 'well formed', pg_temp.ins('''{3}''', 'ARRAY[n]', '''{1}''', '''{5,7}''');
SELECT 'no open xids', pg_temp.ins('''{3}''', 'ARRAY[n]', '''{1}''', '''{}''');
SELECT 'bases {NULL}', pg_temp.ins('''{3}''', '''{NULL}''::int8[]', '''{1}''', '''{}''');
SELECT 'bases from 0', pg_temp.ins('''{3}''', \$q\$('[0:0]={' || n || '}')::int8[]\$q\$, '''{1}''', '''{}''');
SELECT 'bases from 1 to 2', pg_temp.ins('''{3,4}''', \$q\$('[1:2]={' || n || ',' || n || '}')::int8[]\$q\$, '''{1,0}''', '''{}''');
SELECT 'bases 2-D', pg_temp.ins('''{3}''', 'ARRAY[ARRAY[n]]', '''{1}''', '''{}''');
SELECT 'xids {NULL}', pg_temp.ins('''{NULL}''::xid8[]', 'ARRAY[n]', '''{1}''', '''{}''');
SELECT 'xids from 2', pg_temp.ins('''[2:2]={3}''::xid8[]', 'ARRAY[n]', '''{1}''', '''{}''');
SELECT 'xids 2-D', pg_temp.ins('''{{3}}''::xid8[]', 'ARRAY[n]', '''{1}''', '''{}''');
SELECT 'ns {NULL}', pg_temp.ins('''{3}''', 'ARRAY[n]', '''{NULL}''::int4[]', '''{}''');
SELECT 'ns from 0', pg_temp.ins('''{3}''', 'ARRAY[n]', '''[0:0]={1}''::int4[]', '''{}''');
SELECT 'ns 2-D', pg_temp.ins('''{3}''', 'ARRAY[n]', '''{{1}}''::int4[]', '''{}''');
SELECT 'open_xids with NULL', pg_temp.ins('''{3}''', 'ARRAY[n]', '''{1}''', '''{5,NULL}''::xid8[]');
SELECT 'open_xids from 0', pg_temp.ins('''{3}''', 'ARRAY[n]', '''{1}''', '''[0:1]={5,6}''::xid8[]');
SELECT 'open_xids 2-D', pg_temp.ins('''{3}''', 'ARRAY[n]', '''{1}''', '''{{5},{6}}''::xid8[]');
SELECT 'null array', pg_temp.ins('''{3}''', 'NULL', '''{1}''', '''{}''');
SELECT 'gap', pg_temp.try_undo('INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids, bases, ns, open_xids) SELECT n + 1, n + 1, ''0'', ''{3}'', ARRAY[n + 1], ''{1}'', ''{}'' FROM nx RETURNING 1');
SELECT 'not contiguous', pg_temp.ins('''{3}''', 'ARRAY[n]', '''{2}''', '''{}''');"
    printf '%s\n%s\n' "$helpers" "$guard_sql" |
        psql "$DSN" -XqAt -F ': ' -v ON_ERROR_STOP=1 >"$tmp/guard.$path" 2>&1
    if [ "$path" = sql ]; then
        n=10
        bad() { echo "$1: 23000 | pawl.runs: run $n .. $n: $2 must be a one-dimensional array from subscript 1 without NULL elements"; }
        want=$(
            echo "well formed: ok (undone) $n"
            echo "no open xids: ok (undone) $n"
            bad "bases {NULL}" bases
            bad "bases from 0" bases
            echo "bases from 1 to 2: 23000 | pawl.runs: run $n .. $n is not a contiguous list of appends"
            bad "bases 2-D" bases
            bad "xids {NULL}" xids
            bad "xids from 2" xids
            bad "xids 2-D" xids
            bad "ns {NULL}" ns
            bad "ns from 0" ns
            bad "ns 2-D" ns
            bad "open_xids with NULL" open_xids
            bad "open_xids from 0" open_xids
            bad "open_xids 2-D" open_xids
            echo "null array: 23502 | null value in column \"bases\" of relation \"runs\" violates not-null constraint"
            echo "gap: 23000 | pawl.runs: a run must start at $n (the last index + 1), not at $((n + 1))"
            echo "not contiguous: 23000 | pawl.runs: run $n .. $n is not a contiguous list of appends"
        )
        is "sql: runs_guard refuses malformed arrays (NULL elements, other first subscripts, 2-D) and nothing else" \
            "$(cat "$tmp/guard.$path")" "$want"
    else
        echo "note native: pawl.runs_guard (C) answers: $(tr '\n' ';' <"$tmp/guard.$path")"
    fi
    is "$path: the guard's attempts left the runs as they were" \
        "$(q "SELECT count(*) || ' ' || max(last_index) FROM pawl.runs")" "5 9"

    # --- PW020: reads below the retention watermark ------------------------------------------
    q "SELECT count(*) FROM pawl.retention_drop(4, true)" >/dev/null
    check "$path: the log starts at 4" $?
    for call in "pawl_api.read(%s, 10)" "pawl_api.read_filtered(%s, 10, types => '{T}')" \
        "pawl_api.read_filtered(%s, 10, categories => '{f}')"; do
        # shellcheck disable=SC2059
        for after in 0 2; do
            is "$path: $(printf "$call" "$after") is refused naming the watermark" \
                "$(q "SELECT pg_temp.try(\$q\$SELECT count(*)::text FROM $(printf "$call" "$after")\$q\$)")" \
                "$(pw020 4 "$after")"
        done
        # shellcheck disable=SC2059
        is "$path: $(printf "$call" 3) reads from 4 on" \
            "$(q "SELECT pg_temp.try(\$q\$SELECT min(global_index) || '..' || max(global_index) FROM $(printf "$call" 3) WHERE stream_id IS NOT NULL\$q\$)")" \
            "ok 4..9"
    done
    # A drop that commits while the read waits for its locks: the read passed the first check
    # (it reads after the start - 1) and fails after reading, naming the new start. The drop's
    # session holds pawl.events until the read waits for it.
    w=4
    for fn in "pawl_api.read(%s, 10)" "pawl_api.read_filtered(%s, 10, types => '{T}')"; do
        after=$((w - 1))
        w=$((w + 2))
        # shellcheck disable=SC2059
        call=$(printf "$fn" "$after")
        rm -f "$tmp/locked"
        psql "$DSN" -XqAt -v ON_ERROR_STOP=1 >"$tmp/drop.out" 2>&1 <<EOF &
SET statement_timeout = '60s';
BEGIN;
LOCK TABLE pawl.events IN ACCESS EXCLUSIVE MODE;
\! touch $tmp/locked
DO \$\$ BEGIN
    WHILE NOT EXISTS (SELECT 1 FROM pg_locks l
                       WHERE l.relation = 'pawl.events'::regclass AND NOT l.granted) LOOP
        PERFORM pg_sleep(0.02);
    END LOOP;
END \$\$;
SELECT count(*) FROM pawl.retention_drop($w, true);
COMMIT;
EOF
        dpid=$!
        pids+=("$dpid")
        for _ in $(seq 1 500); do [ -f "$tmp/locked" ] && break; sleep 0.02; done
        got=$(q "SET statement_timeout = '60s'; SELECT pg_temp.try(\$q\$SELECT count(*)::text FROM $call\$q\$)")
        wait $dpid
        drc=$?
        is "$path: $call, with a drop to $w committing meanwhile, is refused naming it (drop rc $drc)" \
            "$got" "$(pw020 $w $after)"
    done
done

echo "$fails failures"
[ $fails -eq 0 ]
