// common.mjs — helpers shared by the peer drivers: connection strings, clocks, percentiles and
// the CSV row every workload prints.
//
// Times are taken from process.hrtime (CLOCK_MONOTONIC, one clock for every thread of the
// process), so a time stamped by an appender on the main thread and one stamped by a consumer in
// a worker thread can be subtracted.

import { readFileSync } from 'node:fs';

export const CSV_HEADER = 'system,workload,writers,events_per_append,events,seconds,' +
    'events_per_s,p50_ms,p99_ms,p999_ms,max_ms';

// Milliseconds on the monotonic clock, as a double (sub-microsecond resolution).
export function nowMs() {
    return Number(process.hrtime.bigint()) / 1e6;
}

export function sleep(ms) {
    return new Promise((resolve) => setTimeout(resolve, ms));
}

// Parse a libpq connection string (keyword=value form or a postgres:// URL) into the parts the
// drivers need. Only the keywords a benchmark uses are kept; others are ignored. A passfile
// (libpq's password file, as the private cluster's DSN names one) supplies the password when the
// string carries none, as libpq would.
export function parseDsn(dsn) {
    const out = { host: undefined, port: 5432, user: undefined, password: undefined,
        database: undefined, passfile: undefined };
    if (/^postgres(ql)?:\/\//.test(dsn)) {
        const u = new URL(dsn);
        out.host = u.searchParams.get('host') ?? (u.hostname || undefined);
        out.port = Number(u.port || u.searchParams.get('port') || 5432);
        out.user = decodeURIComponent(u.username) || u.searchParams.get('user') || undefined;
        out.password = decodeURIComponent(u.password) || u.searchParams.get('password') || undefined;
        out.database = decodeURIComponent(u.pathname.replace(/^\//, '')) || undefined;
        out.passfile = u.searchParams.get('passfile') || undefined;
    } else {
        // keyword=value pairs; values may be single-quoted with backslash escapes.
        const re = /\s*([A-Za-z_]+)\s*=\s*('((?:[^'\\]|\\.)*)'|\S+)/g;
        let m;
        while ((m = re.exec(dsn)) !== null) {
            const key = m[1];
            const val = m[3] !== undefined ? m[3].replace(/\\(.)/g, '$1') : m[2];
            if (key === 'host') out.host = val;
            else if (key === 'port') out.port = Number(val);
            else if (key === 'user') out.user = val;
            else if (key === 'password') out.password = val;
            else if (key === 'dbname') out.database = val;
            else if (key === 'passfile') out.passfile = val;
        }
    }
    if (out.password === undefined && out.passfile) out.password = fromPassfile(out);
    return out;
}

// The password libpq would take from a password file (host:port:database:user:password lines,
// `*` matching anything, `\` escaping; a socket directory matches as `localhost`).
function fromPassfile(p) {
    let text;
    try {
        text = readFileSync(p.passfile, 'utf8');
    } catch {
        return undefined;
    }
    const host = !p.host || p.host.startsWith('/') ? 'localhost' : p.host;
    const want = [host, String(p.port), p.database ?? p.user ?? '', p.user ?? ''];
    for (const line of text.split('\n')) {
        if (line === '' || line.startsWith('#')) continue;
        const fields = [];
        let cur = '';
        for (let i = 0; i < line.length; i++) {
            if (line[i] === '\\' && i + 1 < line.length) cur += line[++i];
            else if (line[i] === ':' && fields.length < 4) { fields.push(cur); cur = ''; }
            else cur += line[i];
        }
        fields.push(cur);
        if (fields.length === 5 && want.every((w, i) => fields[i] === '*' || fields[i] === w)) {
            return fields[4];
        }
    }
    return undefined;
}

// A pg client configuration for database `database` on the server that `dsn` names.
export function pgConfig(dsn, database, extra = {}) {
    const p = parseDsn(dsn);
    return { host: p.host, port: p.port, user: p.user, password: p.password, database, ...extra };
}

// The same as a postgresql:// URL (for libraries that only take a connection string). A unix
// socket directory travels in the `host` query parameter, which node-postgres understands.
export function pgUrl(dsn, database) {
    const p = parseDsn(dsn);
    const pass = p.password ? ':' + encodeURIComponent(p.password) : '';
    const auth = p.user ? encodeURIComponent(p.user) + pass + '@' : '';
    const db = encodeURIComponent(database);
    if (p.host && p.host.startsWith('/')) {
        return `postgresql://${auth}localhost:${p.port}/${db}?host=${encodeURIComponent(p.host)}`;
    }
    return `postgresql://${auth}${p.host ?? 'localhost'}:${p.port}/${db}`;
}

// Percentile (nearest rank) of a sorted Float64Array.
export function percentile(sorted, q) {
    if (sorted.length === 0) return NaN;
    const rank = Math.ceil(q * sorted.length);
    return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))];
}

function fmt(x, digits) {
    return Number.isFinite(x) ? x.toFixed(digits) : '';
}

// One CSV row. `latencies` (milliseconds, any order) may be null when the workload has none.
export function csvRow({ system, workload, writers, eventsPerAppend, events, seconds, latencies }) {
    let p50 = NaN, p99 = NaN, p999 = NaN, max = NaN;
    if (latencies && latencies.length > 0) {
        const s = Float64Array.from(latencies).sort();
        p50 = percentile(s, 0.5);
        p99 = percentile(s, 0.99);
        p999 = percentile(s, 0.999);
        max = s[s.length - 1];
    }
    const rate = seconds > 0 ? events / seconds : NaN;
    return [system, workload, writers, eventsPerAppend, events, fmt(seconds, 3), fmt(rate, 1),
        fmt(p50, 3), fmt(p99, 3), fmt(p999, 3), fmt(max, 3)].join(',');
}

// A payload of about 100 bytes of JSON, the same for every peer.
const PAD = 'x'.repeat(60);
export function payload(writer, seq) {
    return { writer, seq, pad: PAD };
}
