# node.sh — sourced by the benchmark scripts: puts a Node.js of at least version 20 on PATH (the
# peers' pinned packages need it), or returns 1 with the reason on stderr.
#
#   1. `node` on PATH at version >= 20: used as it is.
#   2. No node at all, as root with apt-get: Debian's nodejs and npm are installed (Debian 12
#      ships Node.js 18, so step 3 usually follows).
#   3. An older node with npm: the official Node.js 20 binary that the npm registry publishes as
#      the package node-linux-<arch> (pinned below) is installed into bench/peers/.node (never
#      committed) and put first on PATH.
pawl_node_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/.node
pawl_node_version=20.20.2

pawl_node_major() { node --version 2>/dev/null | sed -n 's/^v\([0-9]*\)\..*/\1/p'; }

pawl_node_ensure() {
    local arch
    case "$(uname -m)" in
        x86_64) arch=x64 ;;
        aarch64) arch=arm64 ;;
        *) arch= ;;
    esac
    if [ -n "$arch" ] && [ -x "$pawl_node_dir/node_modules/node-linux-$arch/bin/node" ]; then
        PATH="$pawl_node_dir/node_modules/node-linux-$arch/bin:$PATH"
        export PATH
    fi
    if [ "$(pawl_node_major)" != "" ] && [ "$(pawl_node_major)" -ge 20 ]; then
        return 0
    fi
    if ! command -v node >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "node.sh: installing Debian's nodejs and npm" >&2
        { apt-get install -y -q nodejs npm >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q nodejs npm >/dev/null 2>&1; }; } ||
            { echo "node.sh: apt-get install nodejs npm failed" >&2; return 1; }
    fi
    if [ "$(pawl_node_major)" != "" ] && [ "$(pawl_node_major)" -ge 20 ]; then
        return 0
    fi
    if [ -z "$arch" ] || ! command -v npm >/dev/null; then
        echo "node.sh: Node.js >= 20 is needed (found: $(node --version 2>/dev/null || echo none)), and npm to fetch it" >&2
        return 1
    fi
    echo "node.sh: Node.js $(node --version 2>/dev/null || echo '(none)') is too old; fetching node-linux-$arch@$pawl_node_version from the npm registry" >&2
    mkdir -p "$pawl_node_dir"
    npm install --prefix "$pawl_node_dir" --no-save --no-audit --no-fund --loglevel=error \
        "node-linux-$arch@$pawl_node_version" >&2 || { echo "node.sh: npm install failed" >&2; return 1; }
    PATH="$pawl_node_dir/node_modules/node-linux-$arch/bin:$PATH"
    export PATH
    [ "$(pawl_node_major)" -ge 20 ] 2>/dev/null || { echo "node.sh: the fetched node does not run" >&2; return 1; }
}

pawl_node_ensure
