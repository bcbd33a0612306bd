#!/usr/bin/env bash
# test_tool_completion_man.sh — bash completion and the man page are generated from the command
# and flag tables (`pawl completion bash`, `pawl man`) and installed by `make install`
# (cmake --install) into PREFIX: the completion script completes commands, flags of the command
# being typed, and enum values; the man page renders and lists every flag.
set -uo pipefail
build=$(cd "${PAWL_BIN:?run through ctest}/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; exit 1; }
comp=$tmp/prefix/share/bash-completion/completions/pawl
man=$tmp/prefix/share/man/man1/pawl.1
[ -f "$comp" ]; check "completion installed into PREFIX/share/bash-completion/completions" $?
[ -f "$man" ]; check "man page installed into PREFIX/share/man/man1" $?
cmp -s "$comp" <("$PAWL_BIN/pawl" completion bash); check "installed completion is what pawl completion bash prints" $?
cmp -s "$man" <("$PAWL_BIN/pawl" man); check "installed man page is what pawl man prints" $?

# Complete as bash would, with the installed script.
complete_words() { # words of the line...; prints the candidates for the last word
    bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _pawl; printf "%s\n" "${COMPREPLY[@]}"' _ "$comp" "$@"
}
[ "$(complete_words pawl sta)" = status ]; check "completes a command" $?
grep -x >/dev/null -- --execute <<<"$(complete_words pawl reset --exe)"; check "completes a flag of the command" $?
! grep >/dev/null -- --execute <<<"$(complete_words pawl status --exe)"; check "does not offer a flag the command does not take" $?
[ "$(complete_words pawl --log-format js)" = json ] || [ "$(complete_words pawl status --log-format js)" = json ]
check "completes an enum value" $?
grep -x >/dev/null status <<<"$(complete_words pawl --dsn x st)"; check "completes the command after a global flag" $?

if command -v groff >/dev/null; then
    groff -man -Tutf8 "$man" 2>"$tmp/man.err" | sed "s/.\x08//g" >"$tmp/man.txt"
    check "man page renders" $?
    for f in dsn execute max-event-bytes log-format wait; do
        grep -q -- "--$f" "$tmp/man.txt" || { echo "man page lacks --$f"; fails=$((fails + 1)); }
    done
    grep -q 'EXIT STATUS' "$tmp/man.txt" && grep -q '130' "$tmp/man.txt"; check "man page has the exit codes" $?
else
    grep -q '^\.TH PAWL 1' "$man"; check "man page has a title (groff not installed: not rendered)" $?
fi
"$PAWL_BIN/pawl" completion zsh >/dev/null 2>&1; [ $? -eq 2 ]; check "an unknown shell is a usage error" $?
[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
