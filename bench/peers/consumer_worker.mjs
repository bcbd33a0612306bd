// consumer_worker.mjs — runs one peer's consumer in a worker thread for the live workload, so
// that the appenders on the main thread and the consumer do not share an event loop.
//
// workerData: { system, dsn, tuned, handledSab, countSab }. The handler stamps the monotonic
// time at which event `seq` reached it into handledSab[seq] (Float64) and counts events in
// countSab[0] (Int32). Posts 'started' once the consumer runs; stops on the message 'stop'.

import { parentPort, workerData } from 'node:worker_threads';
import { nowMs } from './common.mjs';
import { Emmett } from './emmett.mjs';
import { MessageDb } from './messagedb.mjs';

const { system, dsn, tuned, handledSab, countSab } = workerData;
const handledAt = new Float64Array(handledSab);
const count = new Int32Array(countSab);

const peer = system === 'emmett' ? new Emmett(dsn) : new MessageDb(dsn);
try {
    await peer.open(1);
    const consumer = peer.consume({
        tuned,
        onEvent: (data) => {
            const t = nowMs();
            if (data.seq >= 0 && data.seq < handledAt.length && handledAt[data.seq] === 0) {
                handledAt[data.seq] = t;
                // Publishes the stamp above before the main thread reads the count.
                Atomics.add(count, 0, 1);
            }
        },
    });
    parentPort.postMessage('started');
    parentPort.on('message', async (m) => {
        if (m !== 'stop') return;
        await consumer.stop();
        await peer.close();
        process.exit(0);
    });
    await consumer.done;
} catch (e) {
    parentPort.postMessage(`consumer failed: ${e.stack || e}`);
    process.exit(1);
}
