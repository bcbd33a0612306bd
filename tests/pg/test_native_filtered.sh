#!/usr/bin/env bash
# test_native_filtered.sh — the native stream and filtered reads (sql/native/read_filtered.c,
# pawl_read_stream and pawl_read_filtered) keep the contract of the PL/pgSQL ones
# (sql/016_filtered_reads.sql, sql/017_finalize_fixes.sql). A database on the native path keeps
# the SQL versions beside the C ones under other names (t.read_filtered_sql, t.read_stream_sql:
# the text of sql/native/deactivate.sql), so that both read the same log under the same snapshot
# and must give the same rows in the same order (the position row included) or the same error
# (SQLSTATE, message, detail, hint); a second database that never leaves the SQL path is the
# reference for definitions and rights:
#   (a) the switch: both are C, SECURITY DEFINER, STABLE, with the owner and grants the SQL ones
#       had; switching back restores exactly the definitions of the SQL database, twice over;
#   (b) a log of appends from concurrent writers (categories and streams with and without '-',
#       an empty category, 1- to 60-event appends, rolled-back appends, toasted payloads, runs of
#       several rows, transactions held open across finalization runs so that later runs order
#       them late, two rotations, a stretch of mostly rolled-back appends (dead index entries),
#       an unfinalized tail): edge and malformed arguments; random
#       filtered reads (categories, prefixes shorter than, equal to and longer than a category,
#       types, and their combinations, empty and missing ones); every filter read to the head in
#       small pages returns each matching event once, in index order; random stream reads;
#   (c) retention: reads around the low-watermark, PW020 before and after a read (a drop that
#       commits while the read waits for its lock), stream floors;
#   (d) snapshots and contexts: REPEATABLE READ, an exported older snapshot in a backend that has
#       read newer runs, the caller's own finalization rolled back, cursors, LATERAL, prepared;
#   (e) rights: a login with EXECUTE alone reads (definer), one without is refused with the SQL
#       database's error, a hostile search_path (a schema of the caller's and pg_temp with
#       look-alike tables, functions and operators) changes nothing;
#   (f) malformed declarations, odd ledgers (NULL elements, other lengths, shapes and bounds,
#       an xid listed twice), cancellation: errors or answers, never a crash of the backend.
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
dbn=t_nflt_$$
dbs=t_nflt_s_$$
rx=t_nflt_x_$$ # EXECUTE on the reads, no table rights
rn=t_nflt_n_$$ # no EXECUTE
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
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
F_SIG="(int8, int4, text[], text[], text[])"
S_SIG="(text, int8, int4)"

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
# The server's start, and its checkpointer's: a backend's crash leaves pg_postmaster_start_time()
# as it was (the postmaster reinitializes without restarting) but restarts the checkpointer.
pm_start() {
    psql "$BASE_DSN" -XqAtc "SELECT pg_postmaster_start_time() || ' ' || (SELECT backend_start
        FROM pg_stat_activity WHERE backend_type = 'checkpointer')"
}
start=$(pm_start)

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
    psql "$BASE_DSN" -XqAtc "DROP ROLE IF EXISTS $r; CREATE ROLE $r LOGIN PASSWORD 'nflt'" >/dev/null
done
for d in "$D_N" "$D_S"; do
    PAWL_DSN="$d" "$PAWL" init --server-path sql >"$tmp/init.out" 2>&1 ||
        { cat "$tmp/init.out"; echo "FAIL pawl init --server-path sql"; exit 1; }
    psql "$d" -XqAt -v ON_ERROR_STOP=1 -c "
        REVOKE ALL ON FUNCTION pawl_api.read_filtered$F_SIG, pawl_api.read_stream$S_SIG FROM PUBLIC;
        GRANT USAGE ON SCHEMA pawl_api TO $rx, $rn;
        GRANT EXECUTE ON FUNCTION pawl_api.read_filtered$F_SIG, pawl_api.read_stream$S_SIG TO $rx" \
        >/dev/null || exit 1
done
fdef() { # fdef NAME SIG: language, definer, settings, owner, grants, set, volatility, definition
    echo "SELECT l.lanname, p.prosecdef, p.proconfig, p.proowner::regrole, p.proacl, p.proretset,
                 p.provolatile, md5(pg_get_functiondef(p.oid))
            FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
           WHERE p.oid = to_regprocedure('pawl_api.$1$2')"
}
ref_f=$(qs "$(fdef read_filtered "$F_SIG")")
ref_s=$(qs "$(fdef read_stream "$S_SIG")")
IFS='|' read -r _ _ _ owner acl _ <<<"$ref_f"
expect "the SQL path's read_filtered and read_stream: PL/pgSQL, SECURITY DEFINER, STABLE" \
    "plpgsql|t
plpgsql|t" "$(printf '%s\n%s' "$(cut -d'|' -f1-2 <<<"$ref_f")" "$(cut -d'|' -f1-2 <<<"$ref_s")")"
grep -q "$rx=X/" <<<"$acl"; check "... grants $acl" $?
for round in 1 2; do
    to_native "$D_N"; _rc=$?; check "round $round: the switch to native ($(tail -1 "$tmp/init.out"))" $_rc
    expect "round $round: read_filtered is C, SECURITY DEFINER, no SET clause, STABLE, owner and grants kept" \
        "c|t||$owner|$acl|t|s" "$(qn "$(fdef read_filtered "$F_SIG")" | cut -d'|' -f1-7)"
    expect "round $round: read_stream likewise" \
        "c|t||$owner|$acl|t|s" "$(qn "$(fdef read_stream "$S_SIG")" | cut -d'|' -f1-7)"
    to_sql "$D_N"; _rc=$?; check "round $round: the switch back to SQL ($(tail -1 "$tmp/init.out"))" $_rc
    expect "round $round: back on SQL, read_filtered is exactly the never-switched one" "$ref_f" \
        "$(qn "$(fdef read_filtered "$F_SIG")")"
    expect "round $round: ... and read_stream" "$ref_s" "$(qn "$(fdef read_stream "$S_SIG")")"
done
to_native "$D_N"; check "native again" $?
expect "every pawl function activate.sql declares is C (the reads too)" "0" \
    "$(qn "SELECT count(*) FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
            WHERE p.oid IN (to_regprocedure('pawl.finalize(int4)'), to_regprocedure('pawl.runs_guard()'),
                            to_regprocedure('pawl.events_guard()'), to_regprocedure('pawl_api.read(int8, int4)'),
                            to_regprocedure('pawl_api.read_filtered$F_SIG'),
                            to_regprocedure('pawl_api.read_stream$S_SIG'),
                            to_regprocedure('pawl.append(text[], int8[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[])'),
                            to_regprocedure('pawl.append_group(text[], int8[], int4[], int4[], int4[], text[], bytea[], jsonb[], boolean, text[])'))
              AND l.lanname <> 'c'")"

# The SQL versions beside the C ones, and runners that return rows or the error as text.
for f in read_filtered read_stream; do
    awk "/^CREATE OR REPLACE FUNCTION pawl_api.$f\\(/ { on = 1 } on { print } on && /^\\\$fn\\\$;/ { exit }" \
        "$SRC/sql/native/deactivate.sql" | sed "1s/pawl_api\\.$f(/t.${f}_sql(/" >"$tmp/${f}_sql.sql"
    grep -q "^\$fn\\$;" "$tmp/${f}_sql.sql"; check "the SQL $f is in deactivate.sql" $?
done
cat >"$tmp/helpers.sql" <<'EOF'
CREATE SCHEMA t;
GRANT USAGE ON SCHEMA t TO PUBLIC;
\i :rf_sql
\i :rs_sql
-- Rows or the error, as text: 'count\nrow\nrow...' or 'ERROR state|message|detail|hint'.
CREATE FUNCTION t.outf(fn text, a int8, m int4, c text[], p text[], ty text[]) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE r text; st text; msg text; det text; hnt text;
BEGIN
    EXECUTE format('SELECT count(*) || E''\n'' || coalesce(string_agg(x::text, E''\n'' '
                   'ORDER BY x.ordinality), '''') FROM %s($1, $2, $3, $4, $5) WITH ORDINALITY AS x',
                   fn) INTO r USING a, m, c, p, ty;
    RETURN r;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL,
                            hnt = PG_EXCEPTION_HINT;
    RETURN format('ERROR %s|%s|%s|%s', st, msg, det, hnt);
END $$;
CREATE FUNCTION t.outs(fn text, s text, a int8, m int4) RETURNS text LANGUAGE plpgsql AS $$
DECLARE r text; st text; msg text; det text; hnt text;
BEGIN
    EXECUTE format('SELECT count(*) || E''\n'' || coalesce(string_agg(x::text, E''\n'' '
                   'ORDER BY x.ordinality), '''') FROM %s($1, $2, $3) WITH ORDINALITY AS x', fn)
       INTO r USING s, a, m;
    RETURN r;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL,
                            hnt = PG_EXCEPTION_HINT;
    RETURN format('ERROR %s|%s|%s|%s', st, msg, det, hnt);
END $$;
-- Both versions on the same call: NULL when they agree, else both answers.
CREATE FUNCTION t.df(a int8, m int4, c text[], p text[], ty text[]) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    x text := t.outf('pawl_api.read_filtered', a, m, c, p, ty);
    y text := t.outf('t.read_filtered_sql', a, m, c, p, ty);
BEGIN
    IF x IS NOT DISTINCT FROM y THEN RETURN NULL; END IF;
    RETURN format('read_filtered(%s, %s, %s, %s, %s): native %s ... / SQL %s ...', a, m, c, p, ty,
                  left(x, 400), left(y, 400));
END $$;
CREATE FUNCTION t.ds(s text, a int8, m int4) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    x text := t.outs('pawl_api.read_stream', s, a, m);
    y text := t.outs('t.read_stream_sql', s, a, m);
BEGIN
    IF x IS NOT DISTINCT FROM y THEN RETURN NULL; END IF;
    RETURN format('read_stream(%s, %s, %s): native %s ... / SQL %s ...', s, a, m, left(x, 400),
                  left(y, 400));
END $$;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA t TO PUBLIC;
-- The filters of the random reads.
CREATE TABLE t.filters (id serial, c text[], p text[], ty text[]);
GRANT SELECT ON t.filters TO PUBLIC;
INSERT INTO t.filters (c, p, ty) VALUES
    ('{c}', NULL, NULL), ('{c,d}', NULL, NULL), ('{x}', NULL, NULL), ('{zz}', NULL, NULL),
    ('{cat}', NULL, NULL), ('{ca,cat,d}', NULL, NULL), ('{bulk}', NULL, NULL),
    ('{late}', NULL, NULL), ('{c}', '{}', '{}'),
    (NULL, '{c}', NULL), (NULL, '{ca}', NULL), (NULL, '{cat}', NULL), (NULL, '{c-1}', NULL),
    (NULL, '{c-1-}', NULL), (NULL, '{cat-1,d-2}', NULL), (NULL, '{-x}', NULL), (NULL, '{-}', NULL),
    (NULL, '{zz}', NULL), (NULL, '{c-}', NULL), (NULL, '{b}', NULL), (NULL, '{c-1,c}', NULL),
    (NULL, NULL, '{T1}'), (NULL, NULL, '{T1,T2}'), (NULL, NULL, '{T9}'), (NULL, NULL, '{L}'),
    ('{}', NULL, '{T0}'),
    ('{c}', NULL, '{T1}'), ('{x,zz}', '{cat-1}', NULL), ('{d}', '{c-1}', '{T2,T3}'),
    (NULL, '{ca}', '{T0}'), ('{bulk}', '{x}', '{B,T1}'), ('{late}', '{c-}', '{L,T0}'),
    ('{dead}', NULL, NULL), (NULL, '{c-dead}', '{D}');
-- One writer: appends of 1 to 12 events (or 60, category bulk), finalized now and then in runs of
-- at most 1 to 4 appends per row.
CREATE PROCEDURE t.fill(seed int, appends int, fin_every int, bulk boolean) LANGUAGE plpgsql AS $$
DECLARE
    n int; s text[]; ty text[]; pl bytea[]; md jsonb[]; ids text[]; with_ids boolean;
    cats text[] := ARRAY['c', 'ca', 'cat', 'd', 'x', 'cb', ''];  -- '': streams '-N'
BEGIN
    PERFORM setseed(seed / 1000.0);
    FOR i IN 1..appends LOOP
        IF bulk THEN
            n := 60;
            s := ARRAY(SELECT 'bulk-' || (j % 7) FROM generate_series(1, n) j);
            ty := array_fill('B'::text, ARRAY[n]);
        ELSE
            n := 1 + floor(random() * 12)::int;
            s := ARRAY(SELECT CASE WHEN random() < 0.15 THEN cats[1 + floor(random() * 6)::int]
                                   WHEN random() < 0.1 THEN cats[1 + floor(random() * 7)::int]
                                        || '-' || floor(random() * 5)::int || '-' || seed
                                   ELSE cats[1 + floor(random() * 7)::int] || '-'
                                        || floor(random() * 12)::int END
                         FROM generate_series(1, n));
            ty := ARRAY(SELECT 'T' || floor(random() * 4)::int FROM generate_series(1, n));
        END IF;
        with_ids := random() < 0.3;
        SELECT array_agg(CASE WHEN random() < 0.02
                              THEN convert_to(repeat(md5(i::text || j), 300), 'UTF8')
                              ELSE convert_to('{"i": ' || i || ', "j": ' || j || '}', 'UTF8') END),
               array_agg(CASE WHEN random() < 0.5 THEN NULL
                              ELSE jsonb_build_object('i', i, 'j', j) END),
               array_agg(CASE WHEN with_ids THEN format('id-%s-%s-%s', seed, i, j) END)
          INTO pl, md, ids
          FROM generate_series(1, n) j;
        BEGIN
            PERFORM pawl_api.append_batch(s, ty, pl, md, NULL, CASE WHEN with_ids THEN ids END);
        EXCEPTION WHEN deadlock_detected OR unique_violation OR serialization_failure THEN
            NULL; -- the other writer took a stream first: this append is not made
        END;
        IF random() < 0.05 THEN ROLLBACK; ELSE COMMIT; END IF;
        IF i % fin_every = 0 THEN
            PERFORM pawl.finalize(1 + (i / fin_every) % 4);
            COMMIT;
        END IF;
    END LOOP;
END $$;
-- Mostly rolled-back appends (their rows are dead to every snapshot once the writers are gone).
CREATE PROCEDURE t.dead(appends int) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..appends LOOP
        PERFORM pawl_api.append_batch(ARRAY['dead-' || i % 5, 'c-dead', 'x-' || i % 3],
                                      ARRAY['D', 'D', 'T1'], ARRAY['\x01', '\x02', '\x03']::bytea[]);
        IF i % 6 = 0 THEN COMMIT; ELSE ROLLBACK; END IF;
        IF i % 20 = 0 THEN
            PERFORM pawl.finalize(2);
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
-- Every event matching a filter, from the log itself (pawl_api.events, finalized events with
-- their indexes), as the contract defines a match.
CREATE FUNCTION t.expected(a int8, c text[], p text[], ty text[]) RETURNS SETOF int8
LANGUAGE sql STABLE AS $$
    SELECT e.global_index FROM pawl_api.events e
     WHERE e.global_index > a
       AND (coalesce(cardinality(c), 0) + coalesce(cardinality(p), 0) = 0
            OR pawl.category(e.stream_id) = ANY (c)
            OR EXISTS (SELECT 1 FROM unnest(p) v WHERE left(e.stream_id, length(v)) = v))
       AND (coalesce(cardinality(ty), 0) = 0 OR e.type = ANY (ty))
     ORDER BY 1
$$;
-- A filter read to the head in pages of m by fn: the indexes returned, in order; fails when a
-- page's position goes backwards or a row lies at or below the position passed.
CREATE FUNCTION t.paged(fn text, a int8, m int4, c text[], p text[], ty text[]) RETURNS int8[]
LANGUAGE plpgsql AS $$
DECLARE
    got int8[] := '{}'; pos int8 := a; r record; np int8; head int8 := pawl_api.last_index();
    rounds int := 0;
BEGIN
    LOOP
        np := NULL;
        FOR r IN EXECUTE format('SELECT global_index, stream_id FROM %s($1, $2, $3, $4, $5)', fn)
                 USING pos, m, c, p, ty LOOP
            IF r.stream_id IS NULL THEN
                np := r.global_index;
            ELSE
                IF r.global_index <= pos THEN
                    RAISE EXCEPTION 'row % at or below the position %', r.global_index, pos;
                END IF;
                got := got || r.global_index;
            END IF;
        END LOOP;
        IF np IS NULL OR np < pos THEN
            RAISE EXCEPTION 'position % after %', np, pos;
        END IF;
        EXIT WHEN np >= head;
        IF np = pos THEN
            RAISE EXCEPTION 'no progress at %', pos;
        END IF;
        pos := np;
        rounds := rounds + 1;
    END LOOP;
    RETURN got;
END $$;
EOF
psql "$D_N" -XqAt -v ON_ERROR_STOP=1 -v rf_sql="$tmp/read_filtered_sql.sql" \
    -v rs_sql="$tmp/read_stream_sql.sql" -f "$tmp/helpers.sql" >/dev/null
check "helpers" $?

# --- (b) A log, and the same answers ---------------------------------------------------------
# late SECONDS: transactions held open across other appends and runs (finalized late).
late() {
    psql "$D_N" -XqAt -v ON_ERROR_STOP=1 >/dev/null 2>&1 <<EOF
BEGIN;
SELECT pawl_api.append_batch(ARRAY['late-1', 'c-late', 'late-2'], ARRAY['L', 'L', 'T0'],
                             ARRAY['\\x01', '\\x02', '\\x03']::bytea[]);
SELECT pg_sleep($1);
COMMIT;
EOF
}
fill() { # fill APPENDS [bulk]: two writers and late transactions at once, then all finalized
    local b=false p1 p2 p3 r=0
    [ "${2:-}" = bulk ] && b=true
    psql "$D_N" -XqAt -v ON_ERROR_STOP=1 -c "CALL t.fill($((RANDOM % 900 + 1)), $1, 7, $b)" >/dev/null &
    p1=$!
    psql "$D_N" -XqAt -v ON_ERROR_STOP=1 -c "CALL t.fill($((RANDOM % 900 + 1)), $1, 5, false)" >/dev/null &
    p2=$!
    (late 1.5; late 0.7; late 1.2) &
    p3=$!
    wait $p1 || r=1
    wait $p2 || r=1
    wait $p3
    psql "$D_N" -XqAt -v ON_ERROR_STOP=1 -c "CALL t.finalize_all()" >/dev/null || r=1
    return $r
}
fill 200; check "fill, phase 1" $?
qn "SELECT pawl.rotate()" >/dev/null; check "rotate 1" $?
w1=$(($(qn "SELECT pawl_api.last_index()") + 1))
fill 40 bulk; check "fill, phase 2 (a stretch of 60-event appends)" $?
qn "SELECT pawl.rotate()" >/dev/null; check "rotate 2" $?
w2=$(($(qn "SELECT pawl_api.last_index()") + 1))
fill 200; check "fill, phase 3" $?
qn "CALL t.dead(600)" >/dev/null; check "a stretch of mostly rolled-back appends" $?
fill 30; check "fill, phase 4" $?
# An unfinalized tail: appended and committed, never finalized.
qn "SELECT pawl_api.append_batch(ARRAY['c-1', 'tail-1', 'c-1'], ARRAY['T1', 'T1', 'T1'], ARRAY['\\x01', '\\x02', '\\x03']::bytea[])" >/dev/null
last=$(qn "SELECT pawl_api.last_index()")
nev=$(qn "SELECT count(*) FROM pawl.events")
nparts=$(qn "SELECT count(*) FROM pg_inherits WHERE inhparent = 'pawl.events'::regclass")
nlate=$(qn "SELECT count(*) FROM pawl.runs r, unnest(r.xids) x
             WHERE x < (SELECT max(r2.scan_xmax) FROM pawl.runs r2 WHERE r2.last_index < r.first_index)")
nbig=$(qn "SELECT count(*) FROM pawl.events WHERE octet_length(payload) > 4000")
[ "$last" -gt 5000 ] && [ "$nev" -gt "$last" ] && [ "$nparts" -ge 3 ] && [ "$nlate" -gt 0 ]
check "a log of $last finalized events ($nev rows), $nparts partitions, $nlate appends ordered late, $nbig toasted payloads" $?

# Edge and malformed arguments: the same rows or the same error, in the same order of checks.
big="(SELECT array_agg('k' || i) FROM generate_series(1, 1001) i)"
cases="SELECT a, m, c, p, ty FROM (VALUES
    (NULL::int8, 10, '{c}'::text[], NULL::text[], NULL::text[]), (-1, 10, '{c}', NULL, NULL),
    (-9223372036854775808, 10, '{c}', NULL, NULL), (0, NULL, '{c}', NULL, NULL),
    (0, 0, '{c}', NULL, NULL), (0, -1, '{c}', NULL, NULL), (0, 100001, '{c}', NULL, NULL),
    (0, 100000, '{c}', NULL, NULL), (0, 1, '{c}', NULL, NULL), (NULL, NULL, NULL, NULL, NULL),
    (0, 10, NULL, NULL, NULL), (0, 10, '{}', '{}', '{}'), (0, 10, '{NULL}', NULL, NULL),
    (0, 10, '{\"\"}', NULL, NULL), (0, 10, '{c,NULL}', NULL, NULL), (0, 10, '{c-1}', NULL, NULL),
    (0, 10, '{c,c-1,d-2}', NULL, NULL), (0, 10, '{{c},{d}}', NULL, NULL),
    (0, 10, '[0:1]={c,d}', NULL, NULL), (0, 10, $big, NULL, NULL),
    (0, 10, NULL, '{NULL}', NULL), (0, 10, NULL, '{\"\"}', NULL), (0, 10, NULL, '{{c}}', NULL),
    (0, 10, NULL, $big, NULL), (0, 10, NULL, NULL, '{NULL}'), (0, 10, NULL, NULL, '{\"\"}'),
    (0, 10, NULL, NULL, '{{T1}}'), (0, 10, NULL, NULL, $big),
    (0, 10, '{NULL}', '{{c}}', '{\"\"}'), (0, 10, '{c-1}', '{NULL}', NULL),
    (0, 10, '{c}', $big, '{NULL}'), (-1, 0, '{NULL}', NULL, NULL), (0, 0, NULL, NULL, NULL),
    (9223372036854775807, 1, '{c}', NULL, NULL), (9223372036854775806, 100000, '{c}', NULL, NULL),
    ($last, 10, '{c}', NULL, NULL), ($last - 1, 10, NULL, NULL, '{T1}'),
    ($last + 5, 10, NULL, '{c}', NULL), (0, 10, '{c}', '{c-1}', '{T1}'),
    (0, 2147483647, '{c}', NULL, NULL), (0, -2147483648, '{c}', NULL, NULL)) v(a, m, c, p, ty)"
expect "edge and malformed filtered reads: the same rows or errors" "" \
    "$(qn "SELECT t.df(a, m, c, p, ty) FROM ($cases) x WHERE t.df(a, m, c, p, ty) IS NOT NULL LIMIT 3")"
expect "the error texts" \
    "ERROR 22023|pawl_api.read_filtered: after_index must be >= 0||
ERROR 22023|pawl_api.read_filtered: max_events must be in 1..100000||
ERROR 22023|pawl_api.read_filtered: no filter (give categories, stream_prefixes or types; pawl_api.read reads the whole log)||
ERROR 22023|pawl_api.read_filtered: categories may not contain NULL or empty strings||
ERROR 22023|pawl_api.read_filtered: category \"c-1\" contains '-' (a category is a stream id up to its first '-'; use stream_prefixes for longer prefixes)||
ERROR 22023|pawl_api.read_filtered: stream_prefixes must be a one-dimensional array of at most 1000 elements||" \
    "$(qn "SELECT t.outf('pawl_api.read_filtered', -1, 10, '{c}', NULL, NULL)
           UNION ALL SELECT t.outf('pawl_api.read_filtered', 0, 0, '{c}', NULL, NULL)
           UNION ALL SELECT t.outf('pawl_api.read_filtered', 0, 10, '{}', NULL, '{}')
           UNION ALL SELECT t.outf('pawl_api.read_filtered', 0, 10, '{c,NULL}', NULL, NULL)
           UNION ALL SELECT t.outf('pawl_api.read_filtered', 0, 10, '{c,c-1,d-2}', NULL, NULL)
           UNION ALL SELECT t.outf('pawl_api.read_filtered', 0, 10, '{c}', '{{c}}', NULL)")"

rnd="SELECT (random() * ($last + 20))::int8 - 2 AS a,
            (ARRAY[1, 2, 3, 7, 10, 100, 1000, 100000])[1 + floor(random() * 8)::int] AS m,
            f.c, f.p, f.ty
       FROM generate_series(1, 1500) g
       JOIN t.filters f ON f.id = 1 + (g * 7919 + floor(random() * 1000)::int) % (SELECT count(*) FROM t.filters)"
expect "1500 random filtered reads: the same rows, position rows and errors" "" \
    "$(qn "SELECT setseed(0.42); SELECT t.df(a, m, c, p, ty) FROM ($rnd) x WHERE t.df(a, m, c, p, ty) IS NOT NULL LIMIT 3" | tail -n +2)"
expect "every filter read to the head in pages of 7 (native): each matching event once, in index order" "" \
    "$(qn "SELECT format('%s: %s %s %s', f.id, f.c, f.p, f.ty) FROM t.filters f
            WHERE coalesce(cardinality(f.c), 0) + coalesce(cardinality(f.p), 0) + coalesce(cardinality(f.ty), 0) > 0
              AND t.paged('pawl_api.read_filtered', 0, 7, f.c, f.p, f.ty)
                  IS DISTINCT FROM ARRAY(SELECT t.expected(0, f.c, f.p, f.ty)) LIMIT 3")"
expect "... and in pages of 1 from the middle, for a few" "" \
    "$(qn "SELECT f.id FROM t.filters f WHERE f.id IN (3, 8, 13, 16, 28, 33, 34)
              AND t.paged('pawl_api.read_filtered', $last / 2, 1, f.c, f.p, f.ty)
                  IS DISTINCT FROM ARRAY(SELECT t.expected($last / 2, f.c, f.p, f.ty)) LIMIT 3")"
expect "the unfinalized tail is not read" "0" \
    "$(qn "SELECT count(*) FROM pawl_api.read_filtered(0, 100000, NULL, '{tail}') WHERE stream_id IS NOT NULL")"
expect "the position row: the head, once everything was looked at" "$last" \
    "$(qn "SELECT global_index FROM pawl_api.read_filtered(0, 100000, '{zz}') WHERE stream_id IS NULL")"

streams="SELECT s FROM (SELECT DISTINCT stream_id s FROM pawl.events
                        UNION ALL VALUES ('nope'), ('c'), ('C-1'), ('c-1 ')) v"
expect "every stream read whole: the same rows" "" \
    "$(qn "SELECT t.ds(s, 0, 100000) FROM ($streams) x WHERE t.ds(s, 0, 100000) IS NOT NULL LIMIT 3")"
srnd="SELECT (SELECT stream_id FROM pawl.events OFFSET floor(random() * $nev)::int LIMIT 1) AS s,
             floor(random() * 40)::int8 - 1 AS a, (ARRAY[1, 2, 3, 10, 1000])[1 + floor(random() * 5)::int] AS m
        FROM generate_series(1, 1000)"
expect "1000 random stream reads: the same rows" "" \
    "$(qn "SELECT setseed(0.17); SELECT t.ds(s, a, m) FROM ($srnd) x WHERE t.ds(s, a, m) IS NOT NULL LIMIT 3" | tail -n +2)"
expect "edge and malformed stream reads: the same rows or errors" "" \
    "$(qn "SELECT t.ds(s, a, m) FROM (VALUES (NULL::text, 0::int8, 10), ('', 0, 10), ('c-1', -1, 10),
            ('c-1', NULL, 10), ('c-1', 0, 0), ('c-1', 0, 100001), ('c-1', 0, NULL), ('c-1', 0, 100000),
            (NULL, NULL, NULL), ('', -1, 0), ('c-1', 9223372036854775807, 1), ('tail-1', 0, 10),
            (repeat('x', 5000), 0, 10), ('late-1', 0, 10)) v(s, a, m)
            WHERE t.ds(s, a, m) IS NOT NULL LIMIT 3")"
expect "stream reads stop at the first unfinalized event" "$(qn "SELECT count(*) FROM pawl_api.events WHERE stream_id = 'c-1'")" \
    "$(qn "SELECT count(*) FROM pawl_api.read_stream('c-1', 0, 100000)")"
expect "stream read error texts" \
    "ERROR 22023|pawl_api.read_stream: stream_id must not be NULL or empty||
ERROR 22023|pawl_api.read_stream: after_seq must be >= 0||
ERROR 22023|pawl_api.read_stream: max_events must be in 1..100000||" \
    "$(qn "SELECT t.outs('pawl_api.read_stream', '', 0, 1) UNION ALL SELECT t.outs('pawl_api.read_stream', 'c', -1, 1)
           UNION ALL SELECT t.outs('pawl_api.read_stream', 'c', 0, 0)")"

# --- (c) Retention ---------------------------------------------------------------------------
qn "CALL t.finalize_all()" >/dev/null
dropped=$(qn "SELECT count(*) FROM pawl.retention_drop($w1, true)")
expect "retention drops the first partition (low-watermark $w1)" 1 "$dropped"
nfl=$(qn "SELECT count(*) FROM pawl.stream_floors")
[ "$nfl" -gt 10 ]; check "... and sets $nfl stream floors" $?
last=$(qn "SELECT pawl_api.last_index()")
expect "filtered reads around the low-watermark: the same rows or errors" "" \
    "$(qn "SELECT t.df(a, m, f.c, f.p, f.ty) FROM generate_series($w1 - 4, $w1 + 2) a, (VALUES (1), (5), (1000)) v(m),
            t.filters f WHERE f.id IN (1, 10, 13, 22, 27) AND t.df(a, m, f.c, f.p, f.ty) IS NOT NULL LIMIT 3")"
pw020() { # pw020 W AFTER: the PW020 answer of t.outf
    echo "ERROR PW020|pawl: the log starts at index $1 (retention dropped the events below it); cannot read after index $2|low_watermark=$1 after_index=$2|read from index $1 on (after $(($1 - 1))), or reload the archive"
}
expect "below it: PW020, message, detail and hint" "$(pw020 "$w1" 3)" \
    "$(qn "SELECT t.outf('pawl_api.read_filtered', 3, 10, '{c}', NULL, NULL)")"
expect "random filtered reads after retention" "" \
    "$(qn "SELECT setseed(0.3); SELECT t.df(a, m, c, p, ty) FROM ($rnd) x WHERE t.df(a, m, c, p, ty) IS NOT NULL LIMIT 3" | tail -n +2)"
fl=$(qn "SELECT stream_id || ' ' || last_seq FROM pawl.stream_floors ORDER BY last_seq DESC, stream_id LIMIT 1")
read -r fs fq <<<"$fl"
expect "a stream read below its floor: PW020 with the stream's message" \
    "ERROR PW020|pawl: stream \"$fs\" starts at sequence number $((fq + 1)) (retention dropped the events below it); cannot read after $((fq - 1))|stream_floor=$fq after_seq=$((fq - 1))|read the stream after $fq, or reload the archive" \
    "$(qn "SELECT t.outs('pawl_api.read_stream', '$fs', $fq - 1, 10)")"
expect "stream reads after retention (floors, every stream, around each floor): the same" "" \
    "$(qn "SELECT t.ds(s, a, m) FROM ($streams) x, LATERAL (SELECT coalesce((SELECT last_seq FROM pawl.stream_floors f WHERE f.stream_id = x.s), 0) fl) y,
            LATERAL (VALUES (0::int8), (greatest(y.fl - 1, 0)), (y.fl), (y.fl + 1)) z(a), (VALUES (1), (1000)) v(m)
            WHERE t.ds(s, a, m) IS NOT NULL LIMIT 3")"
expect "a floor for a stream name of other bytes is not taken ('C-1', 'c-1 ')" "" \
    "$(qn "SELECT t.ds(s, 0, 10) FROM (VALUES ('C-1'), ('c-1 '), ('$fs ')) v(s) WHERE t.ds(s, 0, 10) IS NOT NULL")"

# A drop that commits while a read waits for its lock: the re-check after the read.
recheck() { # recheck FN AFTER W: a read after AFTER blocked by a drop to W; prints what it got
    psql "$D_N" -XqAt -c "BEGIN" -c "LOCK TABLE pawl.events IN ACCESS EXCLUSIVE MODE" \
        -c "SELECT pg_sleep(1.5)" -c "SELECT count(*) FROM pawl.retention_drop($3, true)" -c "COMMIT" \
        >/dev/null 2>&1 &
    local holder=$!
    sleep 0.5
    psql "$D_N" -XqAt -c "SELECT t.outf('$1', $2, 10, '{c}', NULL, NULL)"
    wait $holder
}
expect "SQL: a drop during the read is caught after the read" "$(pw020 "$w2" $((w1 - 1)))" \
    "$(recheck t.read_filtered_sql $((w1 - 1)) "$w2")"
w3=$((w2 + 5))
expect "native: a drop during the read is caught after the read" "$(pw020 "$w3" $((w2 - 1)))" \
    "$(recheck pawl_api.read_filtered $((w2 - 1)) "$w3")"
expect "and a read that starts after it fails before reading" "$(pw020 "$w3" $((w2 - 1)))" \
    "$(qn "SELECT t.outf('pawl_api.read_filtered', $w2 - 1, 10, '{c}', NULL, NULL)")"

# --- (d) Snapshots and contexts --------------------------------------------------------------
qn "CALL t.finalize_all()" >/dev/null
t0=$(qn "SELECT pawl_api.last_index()")
out=$(psql "$D_N" -XqAt -v ON_ERROR_STOP=1 <<EOF
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) FROM pawl_api.read_filtered($t0, 100, '{rr}') WHERE stream_id IS NOT NULL;
\! psql "$D_N" -XqAt -c "SELECT pawl_api.append_batch(ARRAY['rr-1'], ARRAY['t'], ARRAY['\\\\x01']::bytea[])" -c "SELECT appends FROM pawl.finalize()" >/dev/null
SELECT count(*), max(global_index) FROM pawl_api.read_filtered($t0, 100, '{rr}');
SELECT count(*) FROM pawl_api.read_stream('rr-1', 0, 100);
SELECT t.df($t0 - 5, 100, '{rr}', NULL, NULL) IS NULL, t.ds('rr-1', 0, 10) IS NULL;
COMMIT;
SELECT count(*), max(global_index) FROM pawl_api.read_filtered($t0, 100, '{rr}');
SELECT count(*) FROM pawl_api.read_stream('rr-1', 0, 100);
EOF
)
expect "REPEATABLE READ: the transaction's snapshot, on both" "0
1|$t0
0
t|t
2|$((t0 + 1))
1" "$out"

# A backend that has read a stream with its newest run keeps its final indexes; under an older
# snapshot (exported before the run committed) that run is not visible, and the read stops.
qn "SELECT pawl_api.append_batch(ARRAY['snap-1', 'snap-1'], ARRAY['t', 't'], ARRAY['\\x01', '\\x02']::bytea[])" >/dev/null
qn "SELECT appends FROM pawl.finalize()" >/dev/null
qn "SELECT pawl_api.append_batch(ARRAY['snap-1'], ARRAY['t'], ARRAY['\\x03']::bytea[])" >/dev/null
mkfifo "$tmp/exp_in"
psql "$D_N" -XqAt <"$tmp/exp_in" >"$tmp/exp_out" 2>&1 &
pids+=($!)
exec 7>"$tmp/exp_in"
echo "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT pg_export_snapshot();" >&7
for _ in $(seq 1 50); do [ -s "$tmp/exp_out" ] && break; sleep 0.1; done
snapid=$(grep -v '^BEGIN' "$tmp/exp_out" | head -1)
qn "SELECT appends FROM pawl.finalize()" >/dev/null
out=$(psql "$D_N" -XqAt -v ON_ERROR_STOP=1 <<EOF
SELECT count(*) FROM pawl_api.read_stream('snap-1', 0, 10);
BEGIN ISOLATION LEVEL REPEATABLE READ;
SET TRANSACTION SNAPSHOT '$snapid';
SELECT count(*) FROM pawl_api.read_stream('snap-1', 0, 10);
SELECT t.ds('snap-1', 0, 10) IS NULL;
COMMIT;
SELECT count(*) FROM pawl_api.read_stream('snap-1', 0, 10);
EOF
)
echo "COMMIT;" >&7
exec 7>&-
expect "a backend's final indexes are not used under an older snapshot ($snapid)" "3
2
t
3" "$out"

qn "SELECT pawl_api.append_batch(ARRAY['own-1', 'own-1'], ARRAY['t', 't'], ARRAY['\\x01', '\\x02']::bytea[])" >/dev/null
out=$(psql "$D_N" -XqAt -v ON_ERROR_STOP=1 <<EOF
SELECT count(*) FROM pawl_api.read_stream('own-1', 0, 10);
BEGIN;
SELECT appends FROM pawl.finalize();
SELECT count(*) FROM pawl_api.read_stream('own-1', 0, 10);
SELECT count(*) FROM pawl_api.read_filtered($w3, 100000, '{own}') WHERE stream_id IS NOT NULL;
SELECT t.ds('own-1', 0, 10) IS NULL, t.df($w3, 100000, '{own}', NULL, NULL) IS NULL;
ROLLBACK;
SELECT count(*) FROM pawl_api.read_stream('own-1', 0, 10);
SELECT count(*) FROM pawl_api.read_filtered($w3, 100000, '{own}') WHERE stream_id IS NOT NULL;
SELECT t.ds('own-1', 0, 10) IS NULL;
EOF
)
expect "the caller's own run, rolled back: its final indexes are not kept" "0
1
2
2
t|t
0
0
t" "$out"
qn "CALL t.finalize_all()" >/dev/null
out=$(psql "$D_N" -XqAt -v ON_ERROR_STOP=1 <<EOF
BEGIN;
DECLARE c CURSOR FOR SELECT global_index FROM pawl_api.read_filtered($w3, 50, '{c}');
FETCH 2 FROM c;
FETCH ABSOLUTE 50 FROM c;
COMMIT;
SELECT count(*) FROM (SELECT pawl_api.read_filtered($w3, 10, '{c}')) x;
SELECT count(*) FROM (SELECT pawl_api.read_stream('own-1', 0, 10)) x;
SELECT sum(n) FROM (SELECT (SELECT count(*) FROM pawl_api.read_filtered(a, 3, '{c}')) n FROM generate_series($w3, $w3 + 9) a) x;
SELECT count(*) FROM (VALUES ('own-1'), ('snap-1'), ('nope')) v(s), LATERAL pawl_api.read_stream(v.s, 0, 2) r;
PREPARE p(int8, int4) AS SELECT count(*) FROM pawl_api.read_filtered(\$1, \$2, '{c}') WHERE stream_id IS NOT NULL;
EXECUTE p($w3, 7); EXECUTE p($w3, 8); EXECUTE p($w3, 9); EXECUTE p($w3, 10); EXECUTE p($w3, 11); EXECUTE p($w3, 12);
EOF
)
expect "cursor, target list, subquery, LATERAL, prepared" \
    "$(qn "SELECT string_agg(global_index::text, E'\n') FROM (SELECT global_index FROM pawl_api.read_filtered($w3, 50, '{c}') LIMIT 2) x")
$(qn "SELECT global_index FROM pawl_api.read_filtered($w3, 50, '{c}') OFFSET 49 LIMIT 1")
11
2
40
4
7
8
9
10
11
12" "$out"

# --- (e) Rights ------------------------------------------------------------------------------
rq() { # rq DSN ROLE SQL: as ROLE, errors inline
    PGPASSWORD=nflt psql "$1 user=$2 password=nflt" -XqAt -c "$3" 2>&1 | sed 's/^ERROR: *//; s/^psql:[^:]*: //'
}
expect "a login without EXECUTE: the SQL database's error (read_filtered)" \
    "$(rq "$D_S" "$rn" "SELECT count(*) FROM pawl_api.read_filtered(0, 10, '{c}')")" \
    "$(rq "$D_N" "$rn" "SELECT count(*) FROM pawl_api.read_filtered(0, 10, '{c}')")"
expect "... (read_stream)" \
    "$(rq "$D_S" "$rn" "SELECT count(*) FROM pawl_api.read_stream('c-1', 0, 10)")" \
    "$(rq "$D_N" "$rn" "SELECT count(*) FROM pawl_api.read_stream('c-1', 0, 10)")"
grep -q "permission denied for function read_filtered" <<<"$(rq "$D_N" "$rn" "SELECT count(*) FROM pawl_api.read_filtered(0, 10, '{c}')")"
check "... which is a refusal" $?
expect "a login with EXECUTE alone (no table rights) reads, as the owner, the same rows" "" \
    "$(rq "$D_N" "$rx" "SELECT t.df(a, 100, f.c, f.p, f.ty) FROM t.filters f, (VALUES ($w3), ($w3 + 777)) v(a) WHERE t.df(a, 100, f.c, f.p, f.ty) IS NOT NULL LIMIT 2")"
expect "... and the same streams" "" \
    "$(rq "$D_N" "$rx" "SELECT t.ds(s, 0, 50) FROM (VALUES ('c-1'), ('own-1'), ('late-1'), ('bulk-3'), ('$fs')) v(s) WHERE t.ds(s, 0, 50) IS NOT NULL")"
expect "... which it cannot read itself" "permission denied for schema pawl" \
    "$(rq "$D_N" "$rx" "SELECT count(*) FROM pawl.events" | head -1)"
# A hostile search_path: look-alike relations, functions and operators where a name could resolve.
cat >"$tmp/hostile.sql" <<'EOF'
SET client_min_messages = warning;
CREATE SCHEMA IF NOT EXISTS h;
CREATE TABLE IF NOT EXISTS h.events (xid xid8, k int4, stream_id text, stream_seq int8, type text);
CREATE TABLE IF NOT EXISTS h.runs (last_index int8, scan_xmax xid8, xids xid8[], bases int8[], ns int4[]);
CREATE TABLE IF NOT EXISTS h.stream_floors (stream_id text, last_seq int8);
INSERT INTO h.stream_floors VALUES ('c-1', 1000000);
CREATE OR REPLACE FUNCTION h.split_part(text, text, int) RETURNS text LANGUAGE sql AS $$ SELECT 'h' $$;
CREATE OR REPLACE FUNCTION h.category(text) RETURNS text LANGUAGE sql AS $$ SELECT 'h' $$;
CREATE OR REPLACE FUNCTION h.texteq_h(text, text) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$;
DROP OPERATOR IF EXISTS h.= (text, text);
CREATE OPERATOR h.= (LEFTARG = text, RIGHTARG = text, FUNCTION = h.texteq_h);
CREATE OR REPLACE FUNCTION h.pg_sequence_last_value(regclass) RETURNS int8 LANGUAGE sql AS $$ SELECT 999999999::int8 $$;
CREATE TEMP TABLE runs (last_index int8);
CREATE TEMP TABLE events (xid xid8);
CREATE TEMP TABLE stream_floors (stream_id text, last_seq int8);
SET search_path = h, pg_temp, pg_catalog, public, pawl, pawl_api;
EOF
psql "$D_N" -XqAt -c "GRANT CREATE ON DATABASE $dbn TO $rx" >/dev/null
{
    cat "$tmp/hostile.sql"
    echo "SELECT md5(string_agg(coalesce(t.outf('pawl_api.read_filtered', a, 100, f.c, f.p, f.ty), '-'), '|' ORDER BY f.id, a)) FROM t.filters f, (VALUES ($w3), ($w3 + 500)) v(a);"
    echo "SELECT md5(string_agg(coalesce(t.outs('pawl_api.read_stream', s, 0, 50), '-'), '|' ORDER BY s)) FROM (VALUES ('c-1'), ('own-1'), ('$fs')) v(s);"
} >"$tmp/hostile_q.sql"
plain=$(PGPASSWORD=nflt psql "$D_N user=$rx password=nflt" -XqAt -f - 2>&1 <<EOF
SELECT md5(string_agg(coalesce(t.outf('pawl_api.read_filtered', a, 100, f.c, f.p, f.ty), '-'), '|' ORDER BY f.id, a)) FROM t.filters f, (VALUES ($w3), ($w3 + 500)) v(a);
SELECT md5(string_agg(coalesce(t.outs('pawl_api.read_stream', s, 0, 50), '-'), '|' ORDER BY s)) FROM (VALUES ('c-1'), ('own-1'), ('$fs')) v(s);
EOF
)
hostile=$(PGPASSWORD=nflt psql "$D_N user=$rx password=nflt" -XqAt -f "$tmp/hostile_q.sql" 2>&1)
expect "a hostile search_path (a schema of the caller's and pg_temp first): the same answers" "$plain" "$hostile"
hostile_su=$(psql "$D_N" -XqAt -f "$tmp/hostile_q.sql" 2>&1)
expect "... for a superuser caller too" "$plain" "$hostile_su"

# --- (f) Never a crash -----------------------------------------------------------------------
bad=$(psql "$D_N" -XqAt 2>&1 <<EOF
CREATE FUNCTION t.b1(int4, int4, text[], text[], text[]) RETURNS TABLE (global_index int8, stream_id text, stream_seq int8, type text, payload bytea, metadata jsonb, appended_at timestamptz, event_id text) LANGUAGE c AS '$LIBREF', 'pawl_read_filtered';
CREATE FUNCTION t.b2(int8, int4, text[], text[], text[]) RETURNS int8 LANGUAGE c AS '$LIBREF', 'pawl_read_filtered';
CREATE FUNCTION t.b3(int8, int4, text[], text[], text[]) RETURNS TABLE (a int8, b text) LANGUAGE c AS '$LIBREF', 'pawl_read_filtered';
CREATE FUNCTION t.b4(int8) RETURNS SETOF record LANGUAGE c AS '$LIBREF', 'pawl_read_filtered';
CREATE FUNCTION t.b5(int8, int4, int4[], text[], text[]) RETURNS SETOF record LANGUAGE c AS '$LIBREF', 'pawl_read_filtered';
CREATE FUNCTION t.b6(text, text, text) RETURNS SETOF pawl_api.events LANGUAGE c AS '$LIBREF', 'pawl_read_stream';
CREATE FUNCTION t.b7(text, int8, int4) RETURNS int8 LANGUAGE c AS '$LIBREF', 'pawl_read_stream';
CREATE FUNCTION t.b8(text) RETURNS SETOF record LANGUAGE c STRICT AS '$LIBREF', 'pawl_read_stream';
CREATE FUNCTION t.b9(text, int8, int4) RETURNS TABLE (a int8, b text) LANGUAGE c AS '$LIBREF', 'pawl_read_stream';
SELECT * FROM t.b1(1, 1, '{c}', NULL, NULL);
SELECT t.b2(1, 1, '{c}', NULL, NULL);
SELECT * FROM t.b3(1, 1, '{c}', NULL, NULL);
SELECT * FROM t.b4(1) AS x(a int8);
SELECT * FROM t.b5(1, 1, '{1}', NULL, NULL) AS x(global_index int8, stream_id text, stream_seq int8, type text, payload bytea, metadata jsonb, appended_at timestamptz, event_id text);
SELECT * FROM t.b6('c-1', 'x', 'y');
SELECT t.b7('c-1', 0, 1);
SELECT * FROM t.b8('c-1') AS x(a int8);
SELECT * FROM t.b9('c-1', 0, 1);
SELECT 'alive';
EOF
)
[ "$(grep -c '^ERROR' <<<"$bad")" -ge 9 ] && [ "$(tail -1 <<<"$bad")" = alive ]
_rc=$?; check "malformed declarations are errors ($(grep -c '^ERROR' <<<"$bad") errors), the session lives" $_rc

# Odd ledgers, behind the guard's back: a run appended past the last one, ordering two
# committed appends no run has ordered yet, then removed. The answers must be an answer or an
# error; where each transaction is listed once and no index overflows, the SQL's.
qn "CALL t.finalize_all()" >/dev/null
last_now=$(qn "SELECT pawl_api.last_index()")
qn "SELECT pawl_api.append_batch(ARRAY['c-odd', 'c-odd', 'c-odd'], ARRAY['T1', 'T1', 'T2'], ARRAY['\\x01', '\\x02', '\\x03']::bytea[])" >/dev/null
qn "SELECT pawl_api.append_batch(ARRAY['c-odd2', 'x-odd'], ARRAY['T1', 'T1'], ARRAY['\\x01', '\\x02']::bytea[])" >/dev/null
x1=$(qn "SELECT xid FROM pawl.events WHERE stream_id = 'c-odd' AND k = 0")
x2=$(qn "SELECT xid FROM pawl.events WHERE stream_id = 'c-odd2' AND k = 0")
odd() { # odd NAME same|any XIDS BASES NS: one run row after the last, read by both versions
    local f=$((last_now + 1)) d
    qn "ALTER TABLE pawl.runs DISABLE TRIGGER runs_guard;
        INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids, bases, ns, open_xids)
        VALUES ($f + 4, $f, '$((x2 + 1000))', $3, $4, $5, '{}')" >/dev/null
    d=$(qn "SELECT * FROM (SELECT t.df(a, m, f.c, f.p, f.ty) FROM generate_series($f - 3, $f + 6) a,
                    (VALUES (1), (2), (50)) v(m), t.filters f
              WHERE f.id IN (1, 10, 22, 28) AND t.df(a, m, f.c, f.p, f.ty) IS NOT NULL LIMIT 1) x
            UNION ALL SELECT * FROM (SELECT t.ds(s, a, 1000) FROM (VALUES ('c-odd'), ('c-odd2'), ('x-odd')) v(s),
                    (VALUES (0), (1)) w(a) WHERE t.ds(s, a, 1000) IS NOT NULL LIMIT 1) y" 2>&1)
    if [ "$2" = same ]; then
        expect "$1: the same answers" "" "$d"
    else
        [ "$(qn "SELECT 'alive'")" = alive ]; check "$1: answers or errors, the backend lives" $?
    fi
    qn "DELETE FROM pawl.runs WHERE last_index > $last_now; ALTER TABLE pawl.runs ENABLE TRIGGER runs_guard" >/dev/null
}
b1=$((last_now + 1))
odd "a well-formed run (the reference)" same "ARRAY['$x1', '$x2']::xid8[]" "ARRAY[$b1, $((b1 + 3))]::int8[]" "ARRAY[3, 2]"
odd "NULL elements" same "ARRAY['$x1', NULL, '$x2']::xid8[]" "ARRAY[$b1, $((b1 + 3)), NULL]::int8[]" "ARRAY[3, 2, NULL]"
odd "a NULL count" same "ARRAY['$x1', '$x2']::xid8[]" "ARRAY[$b1, $((b1 + 3))]::int8[]" "ARRAY[NULL, 2]"
odd "a NULL base" same "ARRAY['$x1', '$x2']::xid8[]" "ARRAY[NULL, $((b1 + 3))]::int8[]" "ARRAY[3, 2]"
odd "arrays of different lengths" same "ARRAY['$x1', '$x2']::xid8[]" "ARRAY[$b1]::int8[]" "ARRAY[3, 2, 1]"
odd "lower bounds other than 1" same "'[0:1]={$x1,$x2}'::xid8[]" "'[2:3]={$b1,$((b1 + 3))}'::int8[]" "'[0:1]={3,2}'::int4[]"
odd "two-dimensional xids" same "ARRAY[['$x1'], ['$x2']]::xid8[]" "ARRAY[$b1, $((b1 + 3))]::int8[]" "ARRAY[3, 2]"
odd "two-dimensional bases" same "ARRAY['$x1', '$x2']::xid8[]" "ARRAY[[$b1], [$((b1 + 3))]]::int8[]" "ARRAY[3, 2]"
odd "counts beyond the append's events" same "ARRAY['$x1', '$x2']::xid8[]" "ARRAY[$b1, $((b1 + 4))]::int8[]" "ARRAY[4, 1]"
odd "an xid no partition holds" same "ARRAY['3', '$x1']::xid8[]" "ARRAY[$b1, $((b1 + 1))]::int8[]" "ARRAY[1, 3]"
odd "a base near the int8 limit" any "ARRAY['$x1']::xid8[]" "ARRAY[9223372036854775806]::int8[]" "ARRAY[5]"
odd "an xid listed twice in a run" any "ARRAY['$x1', '$x2', '$x1']::xid8[]" "ARRAY[$b1, $((b1 + 1)), $((b1 + 3))]::int8[]" "ARRAY[1, 2, 2]"
odd "appends out of index order" any "ARRAY['$x2', '$x1']::xid8[]" "ARRAY[$((b1 + 3)), $b1]::int8[]" "ARRAY[2, 3]"
qn "CALL t.finalize_all()" >/dev/null
expect "the odd ledgers gone, their appends finalized: the same answers" "" \
    "$(qn "SELECT t.ds(s, 0, 10) FROM (VALUES ('c-odd'), ('c-odd2'), ('x-odd')) v(s) WHERE t.ds(s, 0, 10) IS NOT NULL
           UNION ALL SELECT t.df($last_now - 3, 10, f.c, f.p, f.ty) FROM t.filters f WHERE t.df($last_now - 3, 10, f.c, f.p, f.ty) IS NOT NULL")"

out=$(psql "$D_N" -XqAt 2>&1 <<EOF
SET statement_timeout = '2ms';
SELECT count(*) FROM pawl_api.read_filtered($w3, 100000, NULL, NULL, '{T1}'), pg_sleep(0.01);
SELECT count(*) FROM pawl_api.read_filtered($w3, 100000, NULL, '{c}') a, pawl_api.read_filtered($w3, 100000, NULL, '{c}') b;
SELECT count(*) FROM pawl_api.read_stream('own-1', 0, 100000) a, pawl_api.read_filtered($w3, 100000, '{x}') b;
RESET statement_timeout;
SELECT 'alive';
EOF
)
[ "$(tail -1 <<<"$out")" = alive ] && grep -q 'canceling statement due to statement timeout' <<<"$out"
check "reads canceled mid-way: the session lives" $?
expect "no backend crashed (the postmaster's and the checkpointer's start times are unchanged)" "$start" "$(pm_start)"

echo "$checks checks, $fails failure(s)"
[ "$fails" -eq 0 ]
