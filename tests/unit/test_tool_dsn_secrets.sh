#!/usr/bin/env bash
# test_tool_dsn_secrets.sh — no password given in a DSN ever shows in the tool's output (stdout
# and stderr), whatever goes wrong: a malformed URI or key=value string (libpq's parse errors
# quote the string), a DSN over the 4096-byte limit with the password at its start, a server
# that cannot be reached; both forms, through --dsn and PAWL_DSN, and in `pawl config`. A
# password in --dsn (argv, visible in ps) is warned about once, naming the alternatives.
# Needs no server: every DSN here points nowhere.
set -uo pipefail
PAWL=${PAWL_BIN:?run through ctest}/pawl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
SECRET=Zq9SecretPw
fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }

long="password=$SECRET host=/nonexistent-pawl dbname=$(head -c 4200 /dev/zero | tr '\0' x)"
dsns=(
    "postgresql://alice:$SECRET@[::1/db"                      # libpq quotes the whole URI
    "postgresql://alice:${SECRET}%ZZ@host/db"                  # bad percent-encoding in the password
    "postgresql://alice:$SECRET@host/db?host=%zz"
    "postgresql://alice@host/db?password=$SECRET&x"
    "password=$SECRET host"                                    # key=value, malformed
    "password='$SECRET host=x"                                 # unterminated quote
    "$long"                                                    # over 4096 bytes
    "host=/nonexistent-pawl dbname=x user=u password=$SECRET connect_timeout=2"   # unreachable
    "postgresql://u:$SECRET@/x?host=/nonexistent-pawl&connect_timeout=2"
)
i=0
for d in "${dsns[@]}"; do
    i=$((i + 1))
    "$PAWL" tail --count 1 --open-timeout 2s --dsn "$d" >"$tmp/out.$i" 2>&1; rc=$?
    [ $rc -ne 0 ]; check "case $i: refused or unreachable (exit $rc)" $?
    ! grep -q "$SECRET" "$tmp/out.$i"; check "case $i, --dsn: no password in the output" $?
    PAWL_DSN="$d" "$PAWL" tail --count 1 --open-timeout 2s >"$tmp/env.$i" 2>&1
    ! grep -q "$SECRET" "$tmp/env.$i"; check "case $i, PAWL_DSN: no password in the output" $?
    PAWL_DSN="$d" "$PAWL" config >"$tmp/cfg.$i" 2>&1
    ! grep -q "$SECRET" "$tmp/cfg.$i"; check "case $i, config: no password in the output" $?
done
for i in 1 2 3 4 5 6 8 9; do
    [ "$(grep -c 'password in --dsn' "$tmp/out.$i")" -eq 1 ] &&
        grep >/dev/null 'PGPASSWORD' <<<"$(grep 'password in --dsn' "$tmp/out.$i")" &&
        grep >/dev/null 'PGPASSFILE' <<<"$(grep 'password in --dsn' "$tmp/out.$i")" &&
        grep >/dev/null 'passfile=' <<<"$(grep 'password in --dsn' "$tmp/out.$i")"
    check "case $i: one warning about the password in argv, naming PGPASSWORD, PGPASSFILE, passfile=" $?
    ! grep -q 'password in --dsn' "$tmp/env.$i"; check "case $i: no argv warning for PAWL_DSN" $?
done
"$PAWL" tail --count 1 --open-timeout 2s --dsn "host=/nonexistent-pawl dbname=x connect_timeout=2" >"$tmp/nopw" 2>&1
! grep -q 'password in --dsn' "$tmp/nopw"; check "no warning for a DSN without a password" $?
"$PAWL" config --dsn "postgresql://alice:$SECRET@db.example/x" >"$tmp/cfg" 2>&1
! grep -q "$SECRET" "$tmp/cfg" && grep -q '^database: .*password=\*\*\*' "$tmp/cfg" && grep -q 'from: --dsn' "$tmp/cfg"
check "config shows the DSN used, redacted, and that it came from --dsn" $?

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
