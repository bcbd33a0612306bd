#!/usr/bin/env bash
# The peer benchmarks' shared helpers (bench/peers/common.mjs): DSN parsing in both libpq forms,
# the URL handed to libraries that only take one, percentiles and the CSV row. Needs node only
# (no packages); skipped without it.
set -euo pipefail
src=${PAWL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
command -v node >/dev/null || { echo "node not installed: skipped"; exit 77; }

node --input-type=module - "$src/bench/peers/common.mjs" <<'JS'
import assert from 'node:assert/strict';
const m = await import(process.argv[2]);

let p = m.parseDsn('host=/tmp/x/sock port=5433 dbname=pawl user=pawl');
assert.deepEqual([p.host, p.port, p.database, p.user, p.password], ['/tmp/x/sock', 5433, 'pawl', 'pawl', undefined]);
p = m.parseDsn("host='/tmp/with space' password='it\\'s' dbname=d");
assert.equal(p.host, '/tmp/with space');
assert.equal(p.password, "it's");
p = m.parseDsn('postgresql://u:p%40ss@db.example:6432/ev?sslmode=disable');
assert.deepEqual([p.host, p.port, p.user, p.password, p.database], ['db.example', 6432, 'u', 'p@ss', 'ev']);
p = m.parseDsn('postgresql://u@localhost/ev?host=%2Frun%2Fpg');
assert.equal(p.host, '/run/pg');

// A socket directory travels in the query string, and the database is replaced.
const url = m.pgUrl('host=/tmp/s port=5432 dbname=pawl user=pawl', 'peer_db');
assert.equal(url, 'postgresql://pawl@localhost:5432/peer_db?host=%2Ftmp%2Fs');
p = m.parseDsn(url);
assert.deepEqual([p.host, p.database, p.user], ['/tmp/s', 'peer_db', 'pawl']);
assert.equal(m.pgUrl('host=db port=5 user=u password=p:w dbname=x', 'y'), 'postgresql://u:p%3Aw@db:5/y');

const c = m.pgConfig('host=/tmp/s dbname=pawl user=pawl', 'other', { user: 'role' });
assert.deepEqual([c.host, c.database, c.user], ['/tmp/s', 'other', 'role']);

// Nearest-rank percentiles.
const s = Float64Array.from({ length: 1000 }, (_, i) => i + 1);
assert.equal(m.percentile(s, 0.5), 500);
assert.equal(m.percentile(s, 0.99), 990);
assert.equal(m.percentile(s, 0.999), 999);
assert.equal(m.percentile(Float64Array.of(7), 0.99), 7);
assert.ok(Number.isNaN(m.percentile(new Float64Array(0), 0.5)));

// CSV: the header's columns, empty latency columns when there are none.
const cols = m.CSV_HEADER.split(',');
assert.equal(cols.length, 11);
const row = m.csvRow({ system: 's', workload: 'w', writers: 2, eventsPerAppend: 1, events: 100,
    seconds: 2, latencies: [3, 1, 2] }).split(',');
assert.equal(row.length, cols.length);
assert.deepEqual(row, ['s', 'w', '2', '1', '100', '2.000', '50.0', '2.000', '3.000', '3.000', '3.000']);
const none = m.csvRow({ system: 's', workload: 'w', writers: 1, eventsPerAppend: 1, events: 5,
    seconds: 1, latencies: null }).split(',');
assert.deepEqual(none.slice(7), ['', '', '', '']);

// Payloads are about 100 bytes of JSON and carry the sequence number the live workload needs.
const pl = m.payload(3, 42);
assert.equal(pl.seq, 42);
assert.ok(Math.abs(JSON.stringify(pl).length - 100) <= 10);
console.log('ok');
JS
