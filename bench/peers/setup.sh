#!/usr/bin/env bash
# setup.sh — install the peer event stores for the side-by-side benchmarks (idempotent).
#
#   bench/peers/setup.sh [DSN]        DSN: the PostgreSQL server to use (its dbname is ignored);
#                                     default $PAWL_DSN, else the user's private PostgreSQL
#   options (environment): PEERS_RESET=1 drops and recreates the peers' databases;
#                          PEERS_OFFLINE=1 never runs npm (uses what node_modules holds).
#
# 1. npm ci: the exact versions pinned in package.json / package-lock.json, into
#    bench/peers/node_modules (never committed).
# 2. message-db: its own install script (from the npm package) creates the message_store role,
#    the database pawl_peer_messagedb, its schema, functions, indexes, views and grants.
# 3. Emmett: an empty database pawl_peer_emmett; the store creates its schema on first use.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
die() { echo "setup.sh: $*" >&2; exit 1; }

dsn=${1:-${PAWL_DSN:-}}
if [ -z "$dsn" ]; then
    dsn=$(cd "$root" && tools/pawl-pg dsn)
    (cd "$root" && tools/pawl-pg status >/dev/null) || (cd "$root" && tools/pawl-pg start)
fi

. "$here/node.sh" || die "Node.js >= 20 is required"
command -v npm >/dev/null || die "npm is required"
command -v psql >/dev/null || die "psql is required (postgresql-client)"

# 1. Packages. npm ci runs again only when the lock file changed since the last install.
lock_sum=$(sha256sum "$here/package-lock.json" | cut -c1-64)
if [ "$(cat "$here/node_modules/.pawl-lock-sum" 2>/dev/null)" != "$lock_sum" ]; then
    if [ "${PEERS_OFFLINE:-0}" = 1 ]; then
        [ -d "$here/node_modules/@eventide/message-db" ] || die "packages not installed (offline)"
        echo "setup.sh: offline: keeping the installed packages" >&2
    else
        (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
    fi
    [ "${PEERS_OFFLINE:-0}" = 1 ] || echo "$lock_sum" >"$here/node_modules/.pawl-lock-sum"
fi

# libpq environment for psql and message-db's scripts: the same server, whatever the DSN form.
eval "$(node --input-type=module -e "
import { parseDsn } from '$here/common.mjs';
const p = parseDsn(process.argv[1]);
const q = (s) => \"'\" + String(s).replace(/'/g, \"'\\\\''\") + \"'\";
if (p.host) console.log('export PGHOST=' + q(p.host));
console.log('export PGPORT=' + q(p.port));
if (p.user) console.log('export PGUSER=' + q(p.user));
if (p.passfile) console.log('export PGPASSFILE=' + q(p.passfile));
else if (p.password) console.log('export PGPASSWORD=' + q(p.password));
if (p.password) console.log('peer_pw=' + q(p.password));
" "$dsn")"
unset PGDATABASE
export PGOPTIONS='-c client_min_messages=warning'

exists() { [ "$(psql -d postgres -Atqc "select 1 from pg_database where datname = '$1'")" = 1 ]; }

if [ "${PEERS_RESET:-0}" = 1 ]; then
    for db in pawl_peer_messagedb pawl_peer_emmett; do
        psql -d postgres -qc "drop database if exists $db with (force)"
    done
fi

# 2. message-db, with the package's own installer (it creates the database itself).
mdb="$here/node_modules/@eventide/message-db/database"
[ -x "$mdb/install.sh" ] || chmod +x "$mdb"/*.sh
if ! exists pawl_peer_messagedb ||
   [ "$(psql -d pawl_peer_messagedb -Atqc "select to_regproc('message_store.write_message') is not null")" != t ]; then
    psql -d postgres -qc "drop database if exists pawl_peer_messagedb"
    (cd "$mdb" && DATABASE_NAME=pawl_peer_messagedb bash ./install.sh >/dev/null)
fi
# On a server that checks passwords (the private cluster: SCRAM only), the message_store role
# logs in with the administrative user's password (messagedb.mjs passes the DSN's password).
if [ -n "${peer_pw:-}" ]; then
    psql -d postgres -q -v ON_ERROR_STOP=1 -v pw="$peer_pw" <<<"ALTER ROLE message_store PASSWORD :'pw'" >/dev/null
fi
echo "message-db $(psql -d pawl_peer_messagedb -Atqc 'select message_store.message_store_version()') in pawl_peer_messagedb"

# 3. Emmett's database (schema on first use).
exists pawl_peer_emmett || psql -d postgres -qc "create database pawl_peer_emmett"
echo "emmett $(node -p "require('$here/node_modules/@event-driven-io/emmett-postgresql/package.json').version") in pawl_peer_emmett"
