#!/usr/bin/env node
// bench.mjs — one peer workload, one CSV row on stdout (progress on stderr).
//
//   node bench.mjs --dsn DSN --system emmett|message-db --workload append|catchup|live
//                  [--writers N] [--batch E] [--seconds S] [--events N] [--rate R] [--tuned]
//                  [--header]
//
// Workloads (each starts from an empty store):
//   append   N writers (one connection each) append E events per call to their own streams
//            (100 streams per writer, taken in turn) for S seconds. Latency = one append call.
//   catchup  pre-fill N events (8 writers, 100-event appends, not timed), then read them from
//            the start with the peer's own consumer and a no-op handler; stops after N events
//            or S seconds, whichever comes first. No latency columns.
//   live     the peer's consumer runs in a worker thread; the main thread appends one event at
//            a time at R events/s for S seconds (open loop, up to N appends in flight on N
//            connections). Latency = handler call time - the append's commit acknowledgement,
//            both on the process's monotonic clock.
//
// The DSN names the server (its dbname is ignored): each peer has its own database there,
// created by setup.sh.

import { Worker } from 'node:worker_threads';
import { fileURLToPath } from 'node:url';
import { CSV_HEADER, csvRow, nowMs, payload, sleep } from './common.mjs';
import { Emmett } from './emmett.mjs';
import { MessageDb } from './messagedb.mjs';

function parseArgs(argv) {
    const a = { writers: 1, batch: 1, seconds: 5, events: 10000, rate: 1000, tuned: false,
        header: false, workload: 'append', system: null, dsn: process.env.PAWL_DSN };
    for (let i = 0; i < argv.length; i++) {
        const k = argv[i];
        const v = () => {
            if (i + 1 >= argv.length) throw new Error(`${k} needs a value`);
            return argv[++i];
        };
        switch (k) {
        case '--dsn': a.dsn = v(); break;
        case '--system': a.system = v(); break;
        case '--workload': a.workload = v(); break;
        case '--writers': a.writers = Number(v()); break;
        case '--batch': a.batch = Number(v()); break;
        case '--seconds': a.seconds = Number(v()); break;
        case '--events': a.events = Number(v()); break;
        case '--rate': a.rate = Number(v()); break;
        case '--tuned': a.tuned = true; break;
        case '--header': a.header = true; break;
        case '-h': case '--help': a.help = true; return a;
        default: throw new Error(`unknown argument ${k}`);
        }
    }
    if (!a.dsn) throw new Error('no DSN: pass --dsn or set PAWL_DSN');
    if (!['emmett', 'message-db'].includes(a.system)) throw new Error('--system emmett|message-db');
    for (const k of ['writers', 'batch', 'seconds', 'events', 'rate']) {
        if (!(a[k] > 0)) throw new Error(`--${k} must be positive`);
    }
    return a;
}

export function makePeer(system, dsn) {
    return system === 'emmett' ? new Emmett(dsn) : new MessageDb(dsn);
}

function log(...args) {
    console.error(`[${new Date().toISOString()}]`, ...args);
}

function eventsFor(writer, seq, n) {
    const out = new Array(n);
    for (let i = 0; i < n; i++) out[i] = { type: 'BenchEvent', data: payload(writer, seq + i) };
    return out;
}

// Append as fast as the peer allows: `writers` loops, each awaiting its own appends.
async function appendWorkload(peer, a) {
    await peer.open(a.writers);
    await peer.reset();
    // One untimed append per writer opens its connection.
    await Promise.all(Array.from({ length: a.writers }, (_, w) =>
        peer.append(peer.streamName(w, 'warm'), eventsFor(w, 0, 1))));
    const latencies = [];
    let events = 0;
    const start = nowMs();
    const deadline = start + a.seconds * 1000;
    await Promise.all(Array.from({ length: a.writers }, async (_, w) => {
        let seq = 0;
        for (let n = 0; nowMs() < deadline; n++) {
            const t0 = nowMs();
            await peer.append(peer.streamName(w, n % 100), eventsFor(w, seq, a.batch));
            latencies.push(nowMs() - t0);
            seq += a.batch;
            events += a.batch;
        }
    }));
    const seconds = (nowMs() - start) / 1000;
    await peer.close();
    return { events, seconds, latencies };
}

async function prefill(peer, total) {
    const writers = 8, batch = 100;
    let next = 0;
    const t0 = nowMs();
    await Promise.all(Array.from({ length: writers }, async (_, w) => {
        for (let n = 0; ; n++) {
            const seq = next;
            if (seq >= total) break;
            const count = Math.min(batch, total - seq);
            next += count;
            await peer.append(peer.streamName(w, n % 100), eventsFor(w, seq, count));
        }
    }));
    log(`prefilled ${total} events in ${((nowMs() - t0) / 1000).toFixed(1)} s`);
}

// A note that belongs next to the figures (run.sh copies these lines into the .meta file).
function note(system, msg) {
    console.error(`NOTE: ${system}: ${msg}`);
}

async function catchupWorkload(peer, a) {
    await peer.open(8);
    await peer.reset();
    await prefill(peer, a.events);
    let handled = 0;
    let last = 0;
    const start = nowMs();
    const consumer = peer.consume({
        tuned: a.tuned,
        onEvent: () => {
            handled++;
            last = nowMs();
        },
    });
    // Done when every event was handled, when the time is up, or when the consumer has made no
    // progress for 3 s (it has read everything it is going to: a consumer that skips events
    // never reaches the total).
    const deadline = start + a.seconds * 1000;
    let stalled = false;
    for (;;) {
        await Promise.race([sleep(10), consumer.done]);
        const now = nowMs();
        if (handled >= a.events || now >= deadline) break;
        if (now - Math.max(last, start) > 3000) { stalled = true; break; }
    }
    const count = handled;
    const end = handled >= a.events || stalled ? last : nowMs();
    await consumer.stop();
    await peer.close();
    if (stalled) {
        note(a.system, `catch-up: the consumer stopped after ${count} of ${a.events} events ` +
            `(it skipped ${a.events - count})`);
    }
    return { events: count, seconds: (end - start) / 1000, latencies: null };
}

async function liveWorkload(peer, a, system) {
    const total = Math.round(a.rate * a.seconds);
    const ackBuf = new Float64Array(total);
    const handledSab = new SharedArrayBuffer(8 * total);
    const countSab = new SharedArrayBuffer(4);
    const handledAt = new Float64Array(handledSab);
    const count = new Int32Array(countSab);

    await peer.open(a.writers);
    await peer.reset();
    const worker = new Worker(fileURLToPath(new URL('./consumer_worker.mjs', import.meta.url)), {
        workerData: { system, dsn: a.dsn, tuned: a.tuned, handledSab, countSab },
    });
    const workerExit = new Promise((resolve, reject) => {
        worker.on('error', reject);
        worker.on('exit', resolve);
    });
    await new Promise((resolve, reject) => {
        worker.once('message', (m) => (m === 'started' ? resolve() : reject(new Error(m))));
        worker.once('error', reject);
    });
    // Let the consumer settle into its steady polling before the first append.
    await sleep(1000);

    // Open loop: event k is due at start + k / rate; whoever is free among `writers` slots
    // sends it. A slot appends to its own streams, so appends never conflict.
    const free = Array.from({ length: a.writers }, (_, i) => i);
    let wake = null;
    const inflight = new Set();
    const start = nowMs();
    let lagMax = 0;
    for (let k = 0; k < total; k++) {
        const due = start + (k * 1000) / a.rate;
        let now = nowMs();
        if (due > now + 1) {
            await sleep(due - now);
        }
        while (free.length === 0) {
            await new Promise((resolve) => { wake = resolve; });
        }
        now = nowMs();
        lagMax = Math.max(lagMax, now - due);
        const slot = free.pop();
        const p = peer.append(peer.streamName(slot, k % 100),
            [{ type: 'BenchEvent', data: payload(slot, k) }]).then(() => {
            ackBuf[k] = nowMs();
            inflight.delete(p);
            free.push(slot);
            if (wake) { const w = wake; wake = null; w(); }
        });
        inflight.add(p);
    }
    await Promise.all(inflight);
    const appendSeconds = (nowMs() - start) / 1000;
    if (lagMax > 100) {
        note(a.system, `live@${a.rate}: appends fell behind the schedule by up to ` +
            `${lagMax.toFixed(0)} ms`);
    }

    // Wait for the consumer to handle everything (its poll back-off may be up to a second),
    // but not for events it skipped: stop once it has made no progress for 3 s.
    const hardLimit = nowMs() + 15000;
    let seen = -1, since = nowMs();
    for (;;) {
        const c = Atomics.load(count, 0);
        const now = nowMs();
        if (c >= total || now >= hardLimit) break;
        if (c !== seen) { seen = c; since = now; } else if (now - since > 3000) break;
        await sleep(20);
    }
    const handled = Atomics.load(count, 0);
    worker.postMessage('stop');
    await workerExit;
    await peer.close();

    const latencies = [];
    for (let k = 0; k < total; k++) {
        if (handledAt[k] > 0 && ackBuf[k] > 0) {
            // The handler may run a hair before the client reads the commit's reply.
            latencies.push(Math.max(0, handledAt[k] - ackBuf[k]));
        }
    }
    if (handled < total) {
        // An event missing below one the handler did see was skipped, not late: the consumer
        // had already moved past it.
        let maxSeen = -1;
        for (let k = 0; k < total; k++) if (handledAt[k] > 0) maxSeen = k;
        let skipped = 0;
        for (let k = 0; k < maxSeen; k++) if (!(handledAt[k] > 0)) skipped++;
        note(a.system, `live@${a.rate}: only ${handled} of ${total} events reached the handler ` +
            `(${skipped} skipped: appended before events it did handle)`);
    }
    return { events: total, seconds: appendSeconds, latencies };
}

async function main() {
    const a = parseArgs(process.argv.slice(2));
    if (a.help) {
        // The usage is the comment at the top of this file.
        const { readFileSync } = await import('node:fs');
        const text = readFileSync(fileURLToPath(import.meta.url), 'utf8').split('\n');
        const usage = text.slice(1).filter((l) => l.startsWith('//')).map((l) => l.slice(3));
        console.log(usage.join('\n'));
        return;
    }
    const peer = makePeer(a.system, a.dsn);
    let r;
    if (a.workload === 'append') r = await appendWorkload(peer, a);
    else if (a.workload === 'catchup') r = await catchupWorkload(peer, a);
    else if (a.workload === 'live') r = await liveWorkload(peer, a, a.system);
    else throw new Error(`unknown workload ${a.workload}`);
    const workload = a.workload + (a.tuned ? '-tuned' : '') +
        (a.workload === 'live' ? `@${a.rate}` : '');
    const writers = a.workload === 'catchup' ? 1 : a.writers;
    const epa = a.workload === 'append' ? a.batch : a.workload === 'live' ? 1 : 100;
    if (a.header) console.log(CSV_HEADER);
    console.log(csvRow({ system: a.system, workload, writers, eventsPerAppend: epa,
        events: r.events, seconds: r.seconds, latencies: r.latencies }));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
    main().then(() => process.exit(0), (e) => {
        console.error(`bench.mjs: ${e.stack || e}`);
        process.exit(1);
    });
}
