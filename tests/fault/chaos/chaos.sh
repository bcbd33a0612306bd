#!/usr/bin/env bash
# chaos.sh — the chaos run: appenders and processors under SIGKILL, terminated backends and
# PostgreSQL restarts, then checks that nothing was lost, duplicated or moved backwards.
#
# Usage: chaos.sh [SECONDS]   (default $CHAOS_SECONDS, else 120). Needs PAWL_BIN (the tool),
# CHAOS_BIN (chaos_append, chaos_proc, chaos_check) and PAWL_PG (the private-PostgreSQL script);
# CTest and `make soak` set them.
#
# It runs its own PostgreSQL cluster (pawl-pg keyed by a temporary directory), because it
# restarts the server: other tests sharing the checkout's cluster must not see that. Processes:
#   4 appenders  chaos_append: synchronous appends, a third single events, the rest batches of
#                2..20, on shared and private streams; each records the ids it got an
#                acknowledgement for (and those left in doubt). The fourth gives its events
#                event ids and appends every failed or in-doubt append again until it succeeds.
#   1 outbox     chaos_outbox: appends inside its own transactions after business writes
#                (rolled-back savepoints, pauses, two appends in one transaction, a third at
#                REPEATABLE READ) to the shared streams, racing the appenders; records likewise.
#   3 processors chaos_proc sql (an exactly-once projection written in the batch transaction),
#                snapshot (the in-memory projection example, a checkpointing unit) and async (the
#                asynchronous sink example, a checkpointing unit).
# The driver, every 0.3..2 s, does one of: SIGKILL an appender and restart it, SIGKILL a
# processor and restart it, pg_terminate_backend 1..3 random backends. At 35% of the run it
# restarts PostgreSQL with a fast shutdown, at 70% with an immediate one (crash recovery). A
# restart counts only when `pawl-pg restart` succeeded and the server then answers as a new
# postmaster (pg_postmaster_start_time changed); the run lasts until both were tried, and a
# missing one fails it. At the end the appenders stop, the processors catch up and stop, and
# chaos_check verifies (see chaos_check.c): acknowledged appends exactly once, unique ids, every
# committed row finalized, contiguous indexes, per-stream order, projection = log, the examples'
# durable state covers their tokens, no token write went backwards (an audit trigger records
# every one).
# The whole script is one brace group, so bash parses all of it before running any: editing
# the file during a long soak cannot change what the running one does.
{
set -uo pipefail
SECONDS_WANTED=${1:-${CHAOS_SECONDS:-120}}
PAWL=${PAWL_BIN:?set PAWL_BIN}/pawl
BIN=${CHAOS_BIN:?set CHAOS_BIN}
PG=${PAWL_PG:?set PAWL_PG}
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

# The run's folder (its logs, the acknowledged ids, the examples' durable state; its path also
# keys the cluster) goes beside the chaos programs, in the build tree. The loop below says if it
# vanishes in mid-run (see cleanup: that was this script's own copy).
work=$(mktemp -d "$BIN/chaos.XXXXXX") || { echo "chaos: cannot make a folder in $BIN"; exit 1; }
chmod 755 "$work"
export PAWL_PG_KEY=$work
declare -A pid_of role_of
stopping=0
# Only the driver itself cleans up. A restarted helper is a forked copy of this shell until it
# execs, and meanwhile holds these traps: a SIGTERM from the stop below landing in that window
# ran the copy's `exit 130` and then this cleanup, which killed every helper, removed the
# cluster and deleted the run's folder in mid-run (two CI failures, in /tmp and here).
cleanup() {
    [ "$BASHPID" = "$$" ] || return 0
    stopping=1
    for p in "${!role_of[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    if [ "${keep:-0}" = 1 ]; then
        "$PG" stop >/dev/null 2>&1
        echo "chaos: logs kept in $work; its stopped cluster in $("$PG" dir) (start it with PAWL_PG_KEY=$work $PG start)"
    else
        "$PG" remove >/dev/null 2>&1
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'if [ "$BASHPID" = "$$" ]; then exit 130; else exit 143; fi' INT TERM

"$PG" start >/dev/null || { echo "chaos: cannot start PostgreSQL"; exit 1; }
DSN=$("$PG" dsn)
export PAWL_DSN="$DSN" PAWL_LOG_LEVEL=error PAWL_PROGRESS=off
sql() { psql "$DSN" -qAt -v ON_ERROR_STOP=1 -c "$1"; }
"$PAWL" init >/dev/null 2>&1 || { echo "chaos: pawl init failed"; exit 1; }
sql "CREATE TABLE chaos_outbox (id text PRIMARY KEY);
     CREATE TABLE chaos_proj (stream text PRIMARY KEY, n int8 NOT NULL, total int8 NOT NULL);
     CREATE TABLE chaos_token_audit (at timestamptz NOT NULL DEFAULT clock_timestamp(),
         op text, processor text, segment_id int8, old_token int8, new_token int8);
     -- Token writes run in pawl's functions, whose search_path is pg_catalog only: the trigger
     -- keeps the search_path it was created with.
     CREATE FUNCTION chaos_audit() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS \$\$
     BEGIN
         IF TG_OP = 'DELETE' THEN
             INSERT INTO chaos_token_audit (op, processor, segment_id, old_token)
             VALUES (TG_OP, OLD.processor, OLD.segment_id, OLD.token);
             RETURN OLD;
         END IF;
         INSERT INTO chaos_token_audit (op, processor, segment_id, old_token, new_token)
         VALUES (TG_OP, NEW.processor, NEW.segment_id,
                 CASE WHEN TG_OP = 'UPDATE' THEN OLD.token END, NEW.token);
         RETURN NEW;
     END \$\$;
     CREATE TRIGGER chaos_audit AFTER INSERT OR UPDATE OR DELETE ON pawl.tokens
         FOR EACH ROW EXECUTE FUNCTION chaos_audit();" || exit 1

start_appender() { # id (appender 4 carries event ids and repeats every failed append)
    local ids=()
    [ "$1" = 4 ] && ids=(ids)
    "$BIN/chaos_append" "$DSN" "$1" "$work/ack-$1" "$work/doubt-$1" "${ids[@]}" 2>>"$work/app-$1.log" &
    pid_of[app$1]=$!; role_of[$!]=app$1
}
start_outbox() { # id
    "$BIN/chaos_outbox" "$DSN" "$1" "$work/ack-ob$1" "$work/doubt-ob$1" 2>>"$work/ob-$1.log" &
    pid_of[ob$1]=$!; role_of[$!]=ob$1
}
start_proc() { # mode
    "$BIN/chaos_proc" "$DSN" "$1" "$work" 2>>"$work/proc-$1.log" &
    pid_of[$1]=$!; role_of[$!]=$1
}
kill_role() { # role: SIGKILL and reap
    local p=${pid_of[$1]}
    kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null
    unset "role_of[$p]"
}
restart_role() {
    case $1 in app*) start_appender "${1#app}" ;; ob*) start_outbox "${1#ob}" ;; *) start_proc "$1" ;; esac
}
appenders=(app1 app2 app3 app4 ob5)
procs=(sql snapshot async)
for i in 1 2 3 4; do start_appender $i; done
start_outbox 5
for m in "${procs[@]}"; do start_proc "$m"; done

n_kill_app=0 n_kill_proc=0 n_term=0 n_term_calls=0 n_pg_fast=0 n_pg_immediate=0 unexpected=0
tried_fast=0 tried_immediate=0
# pg_restart MODE: restart PostgreSQL with that shutdown mode; succeeds only when the restart
# command did and the server then answers as a new postmaster (its start time changed).
pg_restart() {
    local before after rc
    before=$(sql "SELECT pg_postmaster_start_time()" 2>/dev/null)
    PAWL_PG_STOP_MODE=$1 "$PG" restart >"$work/pg-restart-$1.log" 2>&1; rc=$?
    if [ $rc -ne 0 ]; then
        echo "chaos: PostgreSQL restart ($1 shutdown) FAILED: pawl-pg restart exited $rc"
        sed 's/^/chaos:   /' "$work/pg-restart-$1.log" | tail -n 5
        return 1
    fi
    after=$(sql "SELECT pg_postmaster_start_time()" 2>/dev/null)
    if [ -z "$after" ]; then
        echo "chaos: PostgreSQL restart ($1 shutdown) FAILED: the server does not answer"
        return 1
    fi
    if [ "$after" = "$before" ]; then
        echo "chaos: PostgreSQL restart ($1 shutdown) FAILED: the same postmaster still runs (started $after)"
        return 1
    fi
}
t0=$(date +%s)
end=$((t0 + SECONDS_WANTED))
fast_at=$((t0 + SECONDS_WANTED * 35 / 100))
imm_at=$((t0 + SECONDS_WANTED * 70 / 100))
next_report=$((t0 + 30))
echo "chaos: running for ${SECONDS_WANTED}s (PostgreSQL restarts at +$((fast_at - t0))s fast, +$((imm_at - t0))s immediate)"
# Until the end, and at least until both restarts were tried (a very short run).
while [ "$(date +%s)" -lt "$end" ] || [ $tried_fast -eq 0 ] || [ $tried_immediate -eq 0 ]; do
    sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 0.3 + (r % 170) / 100 }')"
    now=$(date +%s)
    if [ ! -d "$work" ] && [ -z "${vanished:-}" ]; then
        vanished=$now
        echo "chaos: +$((now - t0))s the run's folder $work vanished (removed from outside the run); what is left:"
        ls -la "$(dirname "$work")" /tmp 2>&1 | sed 's/^/chaos:   /' | head -n 40
        unexpected=$((unexpected + 1))
    fi
    # A helper that died on its own is a failure of the run (a crash, an abort, a gave-up exit).
    for r in "${appenders[@]}" "${procs[@]}"; do
        p=${pid_of[$r]}
        if ! kill -0 "$p" 2>/dev/null; then
            wait "$p" 2>/dev/null; rc=$?
            echo "chaos: $r (pid $p) exited on its own with status $rc"
            unexpected=$((unexpected + 1)); unset "role_of[$p]"; restart_role "$r"
        fi
    done
    if [ $tried_fast -eq 0 ] && [ "$now" -ge "$fast_at" ]; then
        tried_fast=1
        pg_restart fast && n_pg_fast=1 &&
            echo "chaos: +$((now - t0))s PostgreSQL restarted (fast shutdown)"
        continue
    fi
    if [ $tried_immediate -eq 0 ] && [ "$now" -ge "$imm_at" ]; then
        tried_immediate=1
        pg_restart immediate && n_pg_immediate=1 &&
            echo "chaos: +$((now - t0))s PostgreSQL restarted (immediate shutdown: crash recovery)"
        continue
    fi
    case $((RANDOM % 10)) in
    0 | 1 | 2)
        r=${appenders[$((RANDOM % ${#appenders[@]}))]}; kill_role "$r"; restart_role "$r"
        n_kill_app=$((n_kill_app + 1)) ;;
    3 | 4 | 5)
        r=${procs[$((RANDOM % 3))]}; kill_role "$r"
        [ $((RANDOM % 2)) -eq 0 ] && sleep 0.$((RANDOM % 10))
        restart_role "$r"; n_kill_proc=$((n_kill_proc + 1)) ;;
    *)
        k=$(psql "$DSN" -qAt -c "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
              ORDER BY random() LIMIT 1 + $((RANDOM % 3))) t" 2>/dev/null)
        n_term=$((n_term + ${k:-0})); n_term_calls=$((n_term_calls + 1)) ;;
    esac
    if [ "$now" -ge "$next_report" ]; then
        echo "chaos: +$((now - t0))s events $(sql 'SELECT pawl_api.last_index()' 2>/dev/null || echo '?'), kills $n_kill_app appender / $n_kill_proc processor, backends terminated $n_term"
        next_report=$((now + 30))
    fi
done

echo "chaos: stopping the appenders; letting the processors catch up"
for r in "${appenders[@]}"; do kill -TERM "${pid_of[$r]}" 2>/dev/null; done
for r in "${appenders[@]}"; do
    p=${pid_of[$r]}
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; unset "role_of[$p]"
done
for r in "${procs[@]}"; do
    kill -0 "${pid_of[$r]}" 2>/dev/null || { unexpected=$((unexpected + 1)); echo "chaos: $r had died"; restart_role "$r"; }
done
sql "SELECT * FROM pawl.finalize(100000)" >/dev/null
caught=1
for _ in $(seq 1 600); do
    sql "SELECT * FROM pawl.finalize(100000)" >/dev/null 2>&1
    behind=$(sql "SELECT count(*) FROM pawl.tokens t WHERE t.processor = 'chaos_sql' AND t.token < pawl_api.last_index()" 2>/dev/null)
    segs=$(sql "SELECT count(*) FROM pawl.tokens WHERE processor = 'chaos_sql'" 2>/dev/null)
    if [ "${behind:-1}" = 0 ] && [ "${segs:-0}" -gt 0 ]; then caught=0; break; fi
    sleep 0.2
done
[ $caught -eq 0 ] || echo "chaos: the sql processor did not catch up within 120 s"
sleep 1
for r in "${procs[@]}"; do kill -TERM "${pid_of[$r]}" 2>/dev/null; done
for r in "${procs[@]}"; do
    p=${pid_of[$r]}
    for _ in $(seq 1 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then echo "chaos: $r did not stop within 30 s"; unexpected=$((unexpected + 1)); fi
    kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; unset "role_of[$p]"
done

echo "chaos: faults injected over ${SECONDS_WANTED}s: $n_kill_app appender SIGKILLs, $n_kill_proc processor SIGKILLs, $n_term backends terminated ($n_term_calls rounds), PostgreSQL restarts: $n_pg_fast fast + $n_pg_immediate immediate; unexpected exits: $unexpected"
"$BIN/chaos_check" "$DSN" "$work"; rc=$?
tail -q -n 1 "$work"/app-*.log "$work"/ob-*.log "$work"/proc-*.log 2>/dev/null | sed 's/^/chaos: /'
restarts_missing=$((2 - n_pg_fast - n_pg_immediate))
[ $restarts_missing -eq 0 ] || echo "chaos: $restarts_missing of the 2 PostgreSQL restarts did not happen"
if [ $rc -ne 0 ] || [ $unexpected -ne 0 ] || [ $caught -ne 0 ] || [ $restarts_missing -ne 0 ]; then
    keep=1
    echo "chaos: FAILED"
    for f in "$work"/*.log; do echo "---- $f"; tail -n 15 "$f"; done
    exit 1
fi
echo "chaos: all checks passed"
exit 0
}
