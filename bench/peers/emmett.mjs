// emmett.mjs — the Emmett peer (npm @event-driven-io/emmett-postgresql): its PostgreSQL event
// store in a database of its own, used through its public API only.
//
// What the driver does, and which of Emmett's documented defaults it keeps:
// - Appends are eventStore.appendToStream(stream, events): one call, one transaction, however
//   many events. The schema is created by the store itself on first use (its default
//   auto-migration).
// - The consumer is eventStore.consumer() with one reactor (processor id "peerbench") whose
//   eachMessage is the handler. Defaults: the puller reads 100 messages per batch
//   (DefaultPostgreSQLEventStoreProcessorBatchSize) and sleeps 50 ms
//   (DefaultPostgreSQLEventStoreProcessorPullingFrequencyInMs) after every batch, even a full
//   one; after a batch that was not full the sleep doubles, from 100 ms up to 1 s. Each batch is
//   one transaction that stores the processor's checkpoint after every message. Readers only
//   see messages whose transaction id is below the oldest running transaction
//   (pg_snapshot_xmin), which is how Emmett avoids skipping late commits.
// - `tuned` (reported as its own rows) sets batchSize 1000 and pullingFrequencyInMs 1, to show
//   what the store does when its consumer does not sleep.

import { getPostgreSQLEventStore } from '@event-driven-io/emmett-postgresql';
import pg from 'pg';
import { pgConfig, pgUrl } from './common.mjs';

export const DATABASE = 'pawl_peer_emmett';

export const DEFAULTS = Object.freeze({ batchSize: 100, pullingFrequencyInMs: 50 });
export const TUNED = Object.freeze({ batchSize: 1000, pullingFrequencyInMs: 1 });

export class Emmett {
    constructor(dsn) {
        this.dsn = dsn;
        this.name = 'emmett';
        this.url = pgUrl(dsn, DATABASE);
        this.store = null;
    }

    async open(connections) {
        // node-postgres pools hold 10 connections by default; the store's pool is created from
        // the connection string, so the benchmark never runs more writers than that.
        if (connections > 10) throw new Error('emmett driver: at most 10 concurrent writers');
        this.store = getPostgreSQLEventStore(this.url);
        // First use creates or migrates the schema.
        await this.store.streamExists('peerbench-probe');
    }

    async reset() {
        await this.store.schema.dangerous.truncate({ resetSequences: true });
        const admin = new pg.Client(pgConfig(this.dsn, DATABASE));
        await admin.connect();
        try {
            // Processor checkpoints and locks live in tables that truncate() may not cover in
            // every version; clear whichever exist.
            const r = await admin.query(
                "SELECT string_agg(quote_ident(tablename), ', ') AS t FROM pg_tables " +
                "WHERE schemaname = 'public' " +
                "AND tablename IN ('emt_processors', 'emt_subscriptions')");
            if (r.rows[0].t) await admin.query(`TRUNCATE ${r.rows[0].t}`);
        } finally {
            await admin.end();
        }
    }

    streamName(writer, n) {
        return `bench-w${writer}s${n}`;
    }

    async append(stream, events) {
        await this.store.appendToStream(stream, events);
    }

    // Run the store's consumer with one reactor from the beginning until stop() is called;
    // onEvent(data) is the handler, called once per message.
    consume({ onEvent, tuned = false }) {
        const consumer = this.store.consumer({ pulling: tuned ? TUNED : undefined });
        consumer.reactor({
            processorId: 'peerbench',
            startFrom: 'BEGINNING',
            eachMessage: async (message) => {
                onEvent(message.data);
            },
        });
        const done = consumer.start();
        return {
            stop: async () => {
                await consumer.stop();
                await done;
            },
            done,
        };
    }

    async close() {
        if (this.store) await this.store.close();
        this.store = null;
    }
}
