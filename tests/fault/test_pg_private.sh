#!/usr/bin/env bash
# test_pg_private.sh — the private cluster (tools/pawl-pg) is private: another local user (made
# here with useradd, removed at the end) cannot connect to it over its unix socket nor over TCP
# (PAWL_PG_TCP_PORT), cannot list or enter its folder, and cannot read its password file;
# pg_hba.conf has no trust line and no replication line. A folder or symbolic link planted by
# that user at a cluster's path beforehand makes the start fail with a clear error, through
# pawl-pg and through the tool, and nothing of the planted target is changed; the refusal offers
# PAWL_PG_DIR, and a cluster there works for pawl-pg and the tool. PAWL_PG_TCP_ADDR
# takes IP addresses only: a command substitution, a space with a further `-c` setting or a
# second line is refused before anything is created or started, and runs nothing.
# Runs clusters of its own (PAWL_PG_KEY: temporary folders), removed at the end. Needs root
# (useradd, runuser); skipped (77) otherwise.
set -uo pipefail
PG=${PAWL_PG:?run through ctest}
PAWL=${PAWL_BIN:?run through ctest}/pawl
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (creates a local user)"; exit 77; }
command -v useradd >/dev/null && command -v runuser >/dev/null ||
    { echo "SKIP: useradd or runuser missing"; exit 77; }
command -v psql >/dev/null || { echo "SKIP: psql is not installed"; exit 77; }

user=pawlt$$
useradd -M -d /nonexistent -s /bin/sh "$user" || { echo "SKIP: useradd failed"; exit 77; }
key=$(mktemp -d)     # the cluster this test starts
key2=$(mktemp -d)    # a cluster path a planted folder occupies
key3=$(mktemp -d)    # a cluster path a planted symlink occupies
key4=$(mktemp -d)    # a cluster path that bad PAWL_PG_TCP_ADDR values must never create
key5=$(mktemp -d)    # PAWL_PG_DIR's parent
victim=$(mktemp -d)  # what the symlink points at: a root-owned folder with a file in it
chmod 755 "$victim"
echo precious >"$victim/initdb.log"
echo precious >"$victim/server.log"
cleanup() {
    PAWL_PG_KEY=$key "$PG" remove >/dev/null 2>&1
    PAWL_PG_KEY=$key4 "$PG" remove >/dev/null 2>&1 # only if a bad address got through
    PAWL_PG_DIR=$key5/c "$PG" remove >/dev/null 2>&1
    for k in "$key2" "$key3"; do rm -rf "$(PAWL_PG_KEY=$k "$PG" dir)"; done
    userdel "$user" 2>/dev/null
    rm -f "/tmp/pawl-injected-$$"
    rm -rf "$key" "$key2" "$key3" "$key4" "$key5" "$victim"
}
trap cleanup EXIT
as_user() { runuser -u "$user" -- "$@"; }
fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
    echo $((20000 + $$ % 20000)))
export PAWL_PG_KEY=$key
PAWL_PG_TCP_PORT=$port "$PG" start >/dev/null || { echo "FAIL cannot start the cluster"; exit 1; }
dir=$("$PG" dir)
dsn=$("$PG" dsn)
sock=$dir/sock

# ---- the configuration ------------------------------------------------------------------------
hba=$(grep -Ev '^[[:space:]]*(#|$)' "$dir/data/pg_hba.conf")
[ -n "$hba" ]; check "pg_hba.conf has rules" $?
! grep -Eqiw 'trust' <<<"$hba"; check "pg_hba.conf has no trust line" $?
! grep -Eqiw 'replication' <<<"$hba"; check "pg_hba.conf has no replication line" $?
! grep -Eqw 'ident|password|md5' <<<"$hba" && [ "$(grep -cw 'scram-sha-256' <<<"$hba")" -eq "$(($(wc -l <<<"$hba") - 1))" ] &&
    grep -Eq '^local +all +pawl +peer +map=owner$' <<<"$hba"
check "every rule is a SCRAM password check but pawl's over the socket (peer, mapped)" $?
[ "$(grep -Ev '^[[:space:]]*(#|$)' "$dir/data/pg_ident.conf" | awk '{print $1, $2, $3}' | sort | tr '\n' ,)" = "owner postgres pawl,owner root pawl," ]
check "the peer map admits root and the cluster's owner only" $?
[ "$(stat -c '%a' "$dir")" = 700 ] && [ "$(stat -c '%a' "$sock")" = 700 ] && [ "$(stat -c '%a' "$dir/passfile")" = 600 ]
check "folder and socket folder 0700, password file 0600" $?
[ "$(psql "$dsn" -Atc 'select current_user')" = pawl ]; check "the owner's DSN (passfile=) logs in" $?
[ "$(psql "host=127.0.0.1 port=$port dbname=pawl user=pawl passfile=$dir/passfile" -Atc 'select 1')" = 1 ]
check "TCP on loopback with the password works" $?
[ "$(psql "$dsn" -Atc 'show listen_addresses')" = 127.0.0.1 ]; check "TCP listens on loopback only" $?

# ---- another local user -----------------------------------------------------------------------
as_user ls "$dir" >/dev/null 2>&1; [ $? -ne 0 ]; check "the other user cannot list the folder" $?
as_user sh -c "cd '$dir'" >/dev/null 2>&1; [ $? -ne 0 ]; check "the other user cannot enter the folder" $?
as_user cat "$dir/passfile" >/dev/null 2>&1; [ $? -ne 0 ]; check "the other user cannot read the password file" $?
as_user env PGCONNECT_TIMEOUT=5 psql -w "$dsn" -Atc 'select 1' >/dev/null 2>&1; [ $? -ne 0 ]
check "the other user cannot connect over the socket (the printed DSN)" $?
as_user env PGCONNECT_TIMEOUT=5 psql -w "host=$sock dbname=postgres user=postgres" -Atc 'select 1' >/dev/null 2>&1; [ $? -ne 0 ]
check "the other user cannot connect over the socket as postgres" $?
for u in pawl postgres "$user"; do
    out=$(as_user env PGCONNECT_TIMEOUT=5 psql -w "host=127.0.0.1 port=$port dbname=pawl user=$u" \
        -Atc "COPY (select 1) TO PROGRAM 'touch /tmp/pawl-owned-$$'" 2>&1); rc=$?
    [ $rc -ne 0 ] && grep -qi 'password' <<<"$out"; check "the other user cannot connect over TCP as $u (asked for a password)" $?
done
[ ! -e /tmp/pawl-owned-$$ ]; check "no program ran for the other user" $?
rm -f /tmp/pawl-owned-$$

# ---- a folder planted at a cluster's path -----------------------------------------------------
planted=$(PAWL_PG_KEY=$key2 "$PG" dir)
as_user mkdir -m 0777 "$planted" || { echo "FAIL cannot plant a folder"; exit 1; }
PAWL_PG_KEY=$key2 "$PG" start >/dev/null 2>"$key/err"; rc=$?
[ $rc -ne 0 ] && grep -q 'refusing' "$key/err" && grep -q "$planted" "$key/err"; ok=$?
check "a planted folder: start refused with a clear error (exit $rc: $(head -1 "$key/err"))" $ok
[ "$(stat -c '%U %a' "$planted")" = "$user 777" ] && [ -z "$(ls -A "$planted")" ]
check "a planted folder: left as it was, nothing written in it" $?
env -u PAWL_DSN PAWL_PG_KEY=$key2 "$PAWL" init >/dev/null 2>"$key/err"; rc=$?
[ $rc -eq 3 ] && grep -q 'refusing' "$key/err"; check "a planted folder: the tool refuses too (exit $rc)" $?
PAWL_PG_KEY=$key2 "$PG" status >/dev/null 2>&1; [ $? -ne 0 ]; check "a planted folder is never reported running" $?
# The way out: the refusal names PAWL_PG_DIR, and a cluster there works, for pawl-pg and the tool.
PAWL_PG_KEY=$key2 "$PG" start >/dev/null 2>"$key/err"
grep -q 'set PAWL_PG_DIR' "$key/err"; check "a planted folder: the refusal offers PAWL_PG_DIR" $?
chmod 755 "$key5"
chown postgres "$key5" # the cluster's owner (root runs it as postgres) makes its folder there
PAWL_PG_DIR=$key5/c "$PG" start >/dev/null 2>"$key/err"; rc=$?
[ $rc -eq 0 ] && [ "$(stat -c '%a' "$key5/c")" = 700 ]; ok=$?
check "PAWL_PG_DIR: a cluster in the folder given (exit $rc: $(head -c 200 "$key/err"))" $ok
[ "$(psql "$(PAWL_PG_DIR=$key5/c "$PG" dsn)" -qAtc 'SELECT 1' 2>&1)" = 1 ]; check "PAWL_PG_DIR: its DSN connects" $?
env -u PAWL_DSN -u PAWL_PG_KEY PAWL_PG_DIR=$key5/c PAWL_LOG_LEVEL=error "$PAWL" init >/dev/null 2>"$key/err"; ok=$?
[ $ok -eq 0 ] && [ "$(psql "$(PAWL_PG_DIR=$key5/c "$PG" dsn)" -qAtc "SELECT to_regclass('pawl.events') IS NOT NULL")" = t ]; ok=$?
check "PAWL_PG_DIR: the tool uses it ($(head -c 200 "$key/err"))" $ok
PAWL_PG_DIR=relative/c "$PG" start >/dev/null 2>"$key/err"; rc=$?
[ $rc -ne 0 ] && grep -q 'absolute path' "$key/err"; check "PAWL_PG_DIR: a relative path refused (exit $rc)" $?
PAWL_PG_DIR="$key5/c\$(id)" "$PG" start >/dev/null 2>"$key/err"; rc=$?
[ $rc -ne 0 ] && grep -q 'only letters' "$key/err"; check "PAWL_PG_DIR: shell characters refused (exit $rc)" $?
PAWL_PG_DIR=$key5/c "$PG" remove >/dev/null 2>&1

# ---- a symlink planted at a cluster's path ----------------------------------------------------
planted=$(PAWL_PG_KEY=$key3 "$PG" dir)
as_user ln -s "$victim" "$planted" || { echo "FAIL cannot plant a symlink"; exit 1; }
PAWL_PG_KEY=$key3 "$PG" start >/dev/null 2>"$key/err"; rc=$?
[ $rc -ne 0 ] && grep -q 'symbolic link' "$key/err"; ok=$?
check "a planted symlink: start refused with a clear error (exit $rc: $(head -1 "$key/err"))" $ok
[ "$(stat -c '%U %a' "$victim")" = "root 755" ] && [ "$(cat "$victim/initdb.log" "$victim/server.log")" = "precious
precious" ] && [ "$(ls -A "$victim" | wc -l)" -eq 2 ]
check "a planted symlink: its target untouched (owner, mode, files)" $?
PAWL_PG_KEY=$key3 "$PG" remove >/dev/null 2>&1
[ -d "$victim" ] && [ -f "$victim/initdb.log" ]; check "remove never deletes through a planted symlink" $?

# ---- non-loopback TCP is refused outside a network namespace of its own ------------------------
PAWL_PG_KEY=$key2 PAWL_PG_TCP_PORT=$port PAWL_PG_TCP_ADDR=0.0.0.0 "$PG" start >/dev/null 2>"$key/err"; rc=$?
[ $rc -ne 0 ] && grep -q 'loopback' "$key/err"; check "PAWL_PG_TCP_ADDR=0.0.0.0 refused (exit $rc)" $?

# ---- PAWL_PG_TCP_ADDR reaches the server's command line through a shell: IP addresses only -----
# A fresh cluster path (key4): the refusal comes before its folder is made or a server starts.
injected=/tmp/pawl-injected-$$
fresh=$(PAWL_PG_KEY=$key4 "$PG" dir)
nl=$'\n'
for bad in "127.0.0.1\$(touch $injected)" "127.0.0.1 -c listen_addresses=*" \
    "127.0.0.1${nl}\$(touch $injected)" "127.0.0.1,*" "127.0.0.1,"; do
    PAWL_PG_KEY=$key4 PAWL_PG_TCP_PORT=$port PAWL_PG_TCP_ADDR=$bad "$PG" start >/dev/null 2>"$key/err"; rc=$?
    shown=${bad@Q}
    [ $rc -ne 0 ] && grep -q 'PAWL_PG_TCP_ADDR' "$key/err"; ok=$?
    check "PAWL_PG_TCP_ADDR=$shown refused, naming the variable (exit $rc: $(head -1 "$key/err"))" $ok
    [ ! -e "$injected" ]; check "PAWL_PG_TCP_ADDR=$shown ran nothing" $?
    [ ! -e "$fresh" ]; check "PAWL_PG_TCP_ADDR=$shown: no cluster folder made, no server started" $?
    PAWL_PG_KEY=$key4 "$PG" remove >/dev/null 2>&1
    rm -f "$injected"
done

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
