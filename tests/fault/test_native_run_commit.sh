#!/usr/bin/env bash
# test_native_run_commit.sh — durable runs on the native path (sql/native/pawl_native.c): a run
# commits without a WAL flush of its own and is flushed at its commit, within
# pawl.run_commit_wait, before its session hears of it; whatever returns what runs assigned
# flushes the newest run it sees first. Shown by crashes at the worst moment: the WAL writer is
# stopped (SIGSTOP), with the background writer and the checkpointer, so that nothing but a
# flush someone asks for makes WAL durable, a session
# finalizes with a long pawl.run_commit_wait while another session holds a writing transaction
# open (its run visible, its commit not yet flushed), and then every process of the cluster is
# killed (SIGKILL: a power cut, as far as WAL goes):
#   - nobody read the run: it is gone after crash recovery, its caller never got its result,
#     and the next run finalizes the same appends (the run's commit was not flushed by itself);
#   - a reader saw the run through pawl_api.read, read_stream, read_filtered, last_index or the
#     pawl_api.events view: the run survives with the indexes that reader saw;
#   - pawl.run_commit_wait = -1: the run commits with its own flush and survives unread;
#   - nobody else in a writing transaction: the run flushes at once, whatever the wait allows.
# And, without a crash: a run waiting for a busy writer sleeps on its latch and answers as soon
# as the writer commits (woken at once by a pawl append's commit, within 1 ms by any other).
# An attempt whose finalizing session got its answer before the kill (its wait ran out: a very
# slow machine), or, where the run should be gone, whose run survived (some flush reached it
# first), proves nothing either way and is made again, up to 4 times per case. Each
# attempt starts with a CHECKPOINT, so that the background writer has no dirty page to write
# in the window (writing a page flushes WAL up to its changes, which could flush the run).
#
# It runs its own PostgreSQL cluster (pawl-pg keyed by a temporary folder), removed at the end.
# Uses the installed pawl_native (make test installs it), or the library PAWL_NATIVE_LIB names.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
SRC=${PAWL_SOURCE_DIR:?run through ctest}
PG=$SRC/tools/pawl-pg
PG_CONFIG=${PG_CONFIG:-pg_config}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }
if [ -z "${PAWL_NATIVE_LIB:-}" ]; then
    command -v "$PG_CONFIG" >/dev/null &&
        [ -f "$("$PG_CONFIG" --pkglibdir)/pawl_native.so" ] ||
        { echo "SKIP: pawl_native is not installed (make native, as root)"; exit 77; }
fi

tmp=$(mktemp -d)
export PAWL_PG_KEY=$tmp/key
mkdir -p "$PAWL_PG_KEY"
bgs=()
cleanup() {
    for p in "${bgs[@]}"; do kill -9 "$p" 2>/dev/null; done
    [ -n "${pm:-}" ] && kill -CONT $(pgrep -P "$pm" 2>/dev/null) 2>/dev/null
    "$PG" remove >/dev/null 2>&1 || "$PG" stop >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
"$PG" start >/dev/null 2>&1 || { echo "FAIL cannot start a private PostgreSQL"; exit 1; }
DSN=$("$PG" dsn)
data=$("$PG" dir)/data
export PAWL_DSN=$DSN PAWL_LOG_LEVEL=error PAWL_PROGRESS=off
q() { psql "$DSN" -XqAt -v ON_ERROR_STOP=1 "$@"; }
# No autovacuum (its commits flush WAL); the WAL writer waits 10 s and is stopped around each
# crash, so only the flushes the test is about happen.
q -c "ALTER SYSTEM SET autovacuum = off" -c "ALTER SYSTEM SET wal_writer_delay = '10s'" \
    -c "ALTER SYSTEM SET wal_writer_flush_after = '64MB'" -c "SELECT pg_reload_conf()" >/dev/null ||
    exit 1
"$PAWL" init --server-path sql >/dev/null || { echo "FAIL pawl init"; exit 1; }
if [ -n "${PAWL_NATIVE_LIB:-}" ]; then
    sed "s|\$libdir/pawl_native|$PAWL_NATIVE_LIB|g" "$SRC/sql/native/activate.sql" >"$tmp/activate.sql"
else
    cp "$SRC/sql/native/activate.sql" "$tmp/activate.sql"
fi
q -f "$tmp/activate.sql" >/dev/null || { echo "FAIL activate.sql"; exit 1; }
[ "$(q -c "SELECT count(*) FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
            WHERE l.lanname = 'c' AND p.oid IN ('pawl.finalize(int4)'::regprocedure,
                                                'pawl_api.runs_durable()'::regprocedure)")" = 2 ] ||
    { echo "FAIL the native finalize and pawl_api.runs_durable are not active"; exit 1; }

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }

postmaster() { head -n 1 "$data/postmaster.pid"; }
flushers() { # the pids of the processes that write WAL or pages on their own: the WAL
    # writer, the background writer (a page written out flushes WAL up to its changes first,
    # and so, within the WAL page, a commit just after them) and the checkpointer
    local p
    for p in $(pgrep -P "$(postmaster)"); do
        grep -Eq 'walwriter|background writer|checkpointer' "/proc/$p/cmdline" 2>/dev/null &&
            echo "$p"
    done
}
crash() { # every process of the cluster killed at once, then started again (crash recovery)
    local pm
    pm=$(postmaster)
    kill -9 "$pm" $(pgrep -P "$pm") 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$pm" 2>/dev/null || break; sleep 0.05; done
    "$PG" start >/dev/null 2>&1 || { echo "FAIL PostgreSQL does not start after the crash"; exit 1; }
}
n_app=0
append3() { # three appends, each committed (and flushed) on its own
    local i
    for i in 1 2 3; do
        n_app=$((n_app + 1))
        q -c "SELECT pawl_api.append('s-$((n_app % 2))', 'T', '\\x0$i'::bytea)" >/dev/null || exit 1
    done
}
runs() { q -c "SELECT count(*) || ':' || coalesce(max(last_index), 0) FROM pawl.runs"; }

# attempt WAIT_US READER: appends, then a finalization in the background with
# pawl.run_commit_wait = WAIT_US; once its run is visible (read from pawl.runs, which flushes
# nothing), READER (a psql command, or "" for none) reads; then the crash. Sets: before (runs
# before), seen (the reader's output), answered (1 when the finalizing session got its row before
# the crash), after (runs after recovery).
attempt() {
    local wait_us=$1 reader=$2 fin_pid ww
    # Dirty pages written now, not by the background writer in the window (a page written out
    # flushes WAL up to its own changes first, and would make the run durable by chance).
    q -c "CHECKPOINT" >/dev/null
    append3
    before=$(runs)
    # Another session in a writing transaction (an xid, nothing written), open until the crash:
    # a finalizing session waits for someone else's flush only while one runs.
    psql "$DSN" -XqAt -c "BEGIN" -c "SELECT pg_current_xact_id()" -c "SELECT pg_sleep(60)" \
        >/dev/null 2>&1 &
    bgs+=("$!")
    for _ in $(seq 1 200); do
        [ "$(q -c "SELECT count(*) FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()")" -ge 1 ] && break
        sleep 0.02
    done
    ww=$(flushers)
    [ -n "$ww" ] && kill -STOP $ww
    : >"$tmp/fin.out"
    psql "$DSN" -XqAt -c "SET pawl.run_commit_wait = $wait_us" \
        -c "SELECT 't0=' || extract(epoch FROM clock_timestamp())" \
        -c "SELECT appends || ':' || last_index FROM pawl.finalize(1000)" \
        -c "SELECT 't1=' || extract(epoch FROM clock_timestamp())" >"$tmp/fin.out" 2>&1 &
    fin_pid=$!
    bgs+=("$fin_pid")
    # One session waits (up to 10 s) for the run to be visible and then reads: no process
    # start-up in the window.
    seen=$(q -c "DO \$\$ BEGIN
                   FOR i IN 1 .. 2000 LOOP
                       EXIT WHEN (SELECT count(*) FROM pawl.runs) > ${before%%:*};
                       PERFORM pg_sleep(0.005);
                   END LOOP; END \$\$" ${reader:+-c "$reader"} 2>&1)
    crash
    wait "$fin_pid" 2>/dev/null
    # Its row can only have come before the crash (after its commit was flushed).
    answered=0 waited=
    grep -Eq '^[0-9]+:[0-9]+$' "$tmp/fin.out" && answered=1
    [ $answered = 1 ] && waited=$(awk -F= '/^t0=/ { a = $2 } /^t1=/ { b = $2 }
                                         END { printf "%d", (b - a) * 1e6 }' "$tmp/fin.out")
    after=$(runs)
}

# case NAME WAIT_US READER EXPECT: EXPECT "gone" (the run is lost, the next run remakes it) or
# "kept" (the run survives, and READER reads the same again).
case_() {
    local name=$1 wait_us=$2 reader=$3 expect=$4 try ok
    for try in 1 2 3 4; do
        attempt "$wait_us" "$reader"
        # A session whose wait ran out flushed its run itself: that attempt proves nothing about
        # the readers (kept) nor about the deferral (gone); one that got its row sooner saw the
        # reader's flush (kept) or some other flush (gone: inconclusive too). With -1 the
        # session's own flush is the point.
        if [ "$wait_us" != -1 ] && [ $answered = 1 ] &&
            { [ "$expect" = gone ] || [ "$waited" -ge $((wait_us * 9 / 10)) ]; }; then
            echo "     ($name: attempt $try inconclusive: the finalizing session got its answer before the crash, after ${waited} us)"
            q -c "SELECT * FROM pawl.finalize(1000)" >/dev/null
            continue
        fi
        if [ "$expect" = gone ] && [ "$after" != "$before" ]; then
            # The run survived: some flush reached its commit before the kill, and a survivor
            # cannot tell whose (under load, a session that flushed can be killed before it
            # answers). Only a run that is gone proves the commit did not flush itself.
            echo "     ($name: attempt $try inconclusive: the run survived the crash (runs $before, then $after))"
            continue
        fi
        if [ "$expect" = gone ]; then
            [ "$(q -c "SELECT appends FROM pawl.finalize(1000)")" -ge 3 ] &&
                [ "$(runs)" != "$before" ]
            check "$name: the unread run is gone after the crash, its caller never had its row, the next run remakes it (runs $before, after the crash $after)" $?
        else
            ok=0
            [ "$after" != "$before" ] || ok=1
            if [ -n "$reader" ]; then
                again=$(q -c "$reader" 2>&1)
                [ -n "$seen" ] && [ "$again" = "$seen" ] || ok=1
            fi
            check "$name: the run survives the crash${reader:+ with what the reader saw} (runs $before, then $after${waited:+; the finalizing session answered after $waited us})" $ok
            [ $ok = 0 ] || { echo "     seen:  $(head -c 300 <<<"$seen")"; echo "     again: $(head -c 300 <<<"${again:-}")"; }
        fi
        return
    done
    check "$name: a conclusive attempt (the finalizing session kept waiting until the crash)" 1
}

W=3000000 # 3 s (pawl.run_commit_wait allows up to 5 s)
case_ "nobody reads" $W "" gone
case_ "pawl_api.read" $W "SELECT global_index || '/' || stream_id || '/' || stream_seq FROM pawl_api.read(0, 1000)" kept
case_ "pawl_api.events" $W "SELECT global_index || '/' || stream_id FROM pawl_api.events ORDER BY 1" kept
case_ "pawl_api.last_index" $W "SELECT pawl_api.last_index()" kept
case_ "pawl_api.read_stream" $W "SELECT global_index || '/' || stream_seq FROM pawl_api.read_stream('s-1', 0, 1000)" kept
case_ "pawl_api.read_filtered" $W "SELECT coalesce(global_index::text, '-') || '/' || coalesce(stream_id, '') FROM pawl_api.read_filtered(0, 1000, ARRAY['s'])" kept
case_ "pawl.run_commit_wait = -1 (a commit with its own flush)" -1 "" kept

# With nobody else in a writing transaction, nobody is about to flush: a run flushes its commit
# at once, whatever the wait allows (3 s here; the default 1 ms below), answers and survives an
# immediate crash.
append3
before=$(runs)
t0=$(date +%s%N)
res=$(q -c "SET pawl.run_commit_wait = $W" -c "SELECT appends FROM pawl.finalize(1000)")
t1=$(date +%s%N)
crash
[ "$res" -ge 3 ] && [ $(((t1 - t0) / 1000000)) -lt 1000 ] && [ "$(runs)" != "$before" ]
rc=$? # (before the message's $(runs) sets $?)
check "nobody else writing: a run allowed a 3 s wait answers at once ($(((t1 - t0) / 1000000)) ms) and survives a crash right after (runs $before, then $(runs))" $rc
append3
before=$(runs)
res=$(q -c "SELECT appends FROM pawl.finalize(1000)")
crash
[ "$res" -ge 3 ] && [ "$(runs)" != "$before" ] && [ "$(runs)" = "$(q -c "SELECT count(*) || ':' || max(last_index) FROM pawl.runs")" ]
rc=$?
check "the default wait: the run answers and survives a crash right after (runs $before, then $(runs))" $rc

# A run whose commit waits for a busy writer sleeps on its latch (wait event type Extension;
# the 50 us sleep loop it replaced showed no wait at all) and answers as soon as the writer
# commits: at once when that commit is a pawl append's (it sets the latches of waiting runs), and
# within the wait's 1 ms steps for any other commit. Flushers stopped, so that the writer's
# commit is the only flush; the run is allowed 4 s. No crash here.
q -c "CREATE TABLE IF NOT EXISTS rw_plain (x int)" >/dev/null
latch_case() { # latch_case NAME WRITER-SQL-BEFORE-COMMIT
    local ww w="" t_commit t1 ms total fin_pid wr_pid
    q -c "CHECKPOINT" >/dev/null
    append3
    ww=$(flushers)
    [ -n "$ww" ] && kill -STOP $ww
    psql "$DSN" -XqAt -c "BEGIN" -c "SELECT pg_current_xact_id() IS NOT NULL" \
        -c "SELECT pg_sleep(1.5)" -c "$2" -c "COMMIT" \
        -c "SELECT 'c=' || extract(epoch FROM clock_timestamp())" >"$tmp/wr.out" 2>&1 &
    wr_pid=$!
    bgs+=("$wr_pid")
    for _ in $(seq 1 200); do
        [ "$(q -c "SELECT count(*) FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()")" -ge 1 ] && break
        sleep 0.02
    done
    psql "$DSN" -XqAt -c "SET application_name = 'runwait'" -c "SET pawl.run_commit_wait = 4000000" \
        -c "SELECT 't0=' || extract(epoch FROM clock_timestamp())" \
        -c "SELECT appends FROM pawl.finalize(1000)" \
        -c "SELECT 't1=' || extract(epoch FROM clock_timestamp())" >"$tmp/rw.out" 2>&1 &
    fin_pid=$!
    bgs+=("$fin_pid")
    sleep 0.5 # the writer commits at about 1.5 s
    w=$(q -c "SELECT coalesce(wait_event_type, 'none') FROM pg_stat_activity
              WHERE application_name = 'runwait' AND state = 'active'")
    wait "$wr_pid" "$fin_pid"
    [ -n "$ww" ] && kill -CONT $ww
    t_commit=$(sed -n 's/^c=//p' "$tmp/wr.out")
    t1=$(sed -n 's/^t1=//p' "$tmp/rw.out")
    ms=$(awk -v a="$t_commit" -v b="$t1" 'BEGIN { if (a == "" || b == "") print 99999; else printf "%d", (b - a) * 1000 }')
    total=$(awk -F= '/^t0=/ { a = $2 } /^t1=/ { b = $2 } END { printf "%d", (b - a) * 1000 }' "$tmp/rw.out")
    [ "$w" = Extension ] && [ "$ms" -lt 500 ] && [ "$total" -lt 3000 ] &&
        grep -qx '[1-9][0-9]*' "$tmp/rw.out"
    check "$1: the run's commit sleeps on its latch (wait event type '${w:-not waiting}') and answers ${ms} ms after the writer's commit (${total} ms in all, of 4000 allowed)" $?
}
latch_case "a pawl append's commit wakes a waiting run" \
    "SELECT count(*) FROM pawl.append(ARRAY['w'], '{0}', '{1}', '{1}', '{T}', '{\"\\\\x01\"}', NULL, false, NULL)"
latch_case "another session's commit ends a run's wait" "INSERT INTO rw_plain VALUES (1)"
# An outbox append (pawl_api.append: its commit notifies pawl_pending) queues at its commit for
# the notification queue's lock, which the waiting run holds until its own commit ends: the run
# must not count that session as on its way to a flush, or both wait out the run's whole bound.
latch_case "an outbox append's commit, queued behind the run's NOTIFY, does not hold the run" \
    "SELECT pawl_api.append('w', 'T', '\\x01')"

# Out-of-range settings are refused by the server, naming the setting.
err=$(q -c "SELECT pawl_api.runs_durable()" -c "SET pawl.run_commit_wait = 5000001" 2>&1)
[[ $err == *'pawl.run_commit_wait'* ]]
_rc=$?; check "pawl.run_commit_wait above 5 s is refused ($(tail -n 1 <<<"$err"))" $_rc

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all checks passed"
