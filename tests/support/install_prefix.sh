# install_prefix.sh — sourced by the tests that build against an installed pawl, as a user
# would (tests/pg/test_install.sh, tests/pg/test_embed_example.sh):
#   install_prefix BUILD PREFIX
# runs `cmake --install BUILD --prefix PREFIX` (what `make install PREFIX=...` does), checks that
# pawl.pc landed where the README says, PREFIX/lib/pkgconfig, and exports PKG_CONFIG_PATH there.
# It sets san_flags to the build's sanitizer flags (empty for a plain build): a sanitizer build
# installs an instrumented library, and programs linked with it need the same flags.
install_prefix() {
    local build=$1 prefix=$2 log
    log=$(mktemp)
    if ! cmake --install "$build" --prefix "$prefix" >"$log" 2>&1; then
        cat "$log"
        rm -f "$log"
        echo "cmake --install $build --prefix $prefix failed"
        return 1
    fi
    rm -f "$log"
    if [ ! -f "$prefix/lib/pkgconfig/pawl.pc" ]; then
        echo "pawl.pc is not in PREFIX/lib/pkgconfig (the README's PKG_CONFIG_PATH):" \
            "$(find "$prefix" -name pawl.pc)"
        return 1
    fi
    export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
    local san
    san=$(sed -n 's/^PAWL_SANITIZE:STRING=//p' "$build/CMakeCache.txt")
    san_flags=""
    [ -z "$san" ] || san_flags="-fsanitize=$san -fno-omit-frame-pointer"
}
