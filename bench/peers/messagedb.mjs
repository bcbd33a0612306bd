// messagedb.mjs — the message-db peer (npm @eventide/message-db): its SQL functions, installed by
// setup.sh into a database of their own, driven through node-postgres.
//
// What the driver does, and which of message-db's documented defaults it keeps:
// - Writes call message_store.write_message(id, stream_name, type, data). A multi-event append
//   is one statement calling write_message once per event in order, in one transaction (the
//   Eventide writer also writes a batch in one transaction, but with one round trip per message;
//   one statement is the cheaper way to use the same function). write_message takes a
//   transaction-scoped advisory lock per *category*: every writer of a category is serialized
//   until its commit, which is how message-db keeps category order equal to commit order.
// - The consumer mirrors the Eventide consumer's defaults: get_category_messages with batch
//   size 1000, a poll interval of 100 ms (an empty read waits out the rest of the 100 ms cycle),
//   and the consumer's position written to its position stream every 100 messages.
// - The client connects as the `message_store` role that the install script creates (LOGIN; on
//   a server that checks passwords, setup.sh gives it the DSN's password), with the
//   message_store schema on its search path, as Eventide's clients do. On a server where that
//   role cannot log in, PEERS_MESSAGEDB_USER names another one.

import pg from 'pg';
import { randomUUID } from 'node:crypto';
import { parseDsn, pgConfig, nowMs, sleep } from './common.mjs';

export const DATABASE = 'pawl_peer_messagedb';
export const CATEGORY = 'bench';

export const DEFAULTS = Object.freeze({
    batchSize: 1000,
    pollIntervalMs: 100,
    positionUpdateInterval: 100,
});

const WRITE1 = 'SELECT message_store.write_message($1, $2, $3, $4)';
const WRITEN =
    'SELECT message_store.write_message(u.id, $2, u.type, u.data) ' +
    'FROM unnest($1::varchar[], $3::varchar[], $4::jsonb[]) AS u(id, type, data)';
const GET = 'SELECT global_position, data FROM message_store.get_category_messages($1, $2, $3)';

export class MessageDb {
    constructor(dsn) {
        this.dsn = dsn;
        this.name = 'message-db';
        this.pool = null;
    }

    clientConfig() {
        const user = process.env.PEERS_MESSAGEDB_USER || 'message_store';
        return pgConfig(this.dsn, DATABASE, {
            user,
            // setup.sh gives message_store the DSN's password on a server that checks them.
            password: parseDsn(this.dsn).password,
            options: '-c search_path=message_store,public',
        });
    }

    async open(connections) {
        this.pool = new pg.Pool({ ...this.clientConfig(), max: connections });
        const r = await this.pool.query('SELECT message_store.message_store_version() AS v');
        this.version = r.rows[0].v;
    }

    // Empty the store (as the administrative user: the message_store role may only insert).
    async reset() {
        const admin = new pg.Client(pgConfig(this.dsn, DATABASE));
        await admin.connect();
        try {
            await admin.query('TRUNCATE message_store.messages RESTART IDENTITY');
        } finally {
            await admin.end();
        }
    }

    streamName(writer, n) {
        return `${CATEGORY}-w${writer}s${n}`;
    }

    async append(stream, events) {
        if (events.length === 1) {
            await this.pool.query(WRITE1, [randomUUID(), stream, events[0].type, events[0].data]);
            return;
        }
        const ids = events.map(() => randomUUID());
        const types = events.map((e) => e.type);
        const datas = events.map((e) => JSON.stringify(e.data));
        await this.pool.query(WRITEN, [ids, stream, types, datas]);
    }

    // Run an Eventide-style consumer of the category from the start until stop() is called;
    // onEvent(data) is the handler, called once per message in global order.
    consume({ onEvent, tuned = false }) {
        const opts = tuned ? { ...DEFAULTS, pollIntervalMs: 1 } : DEFAULTS;
        const client = new pg.Client(this.clientConfig());
        const positionStream = `${CATEGORY}:position-peerbench`;
        let running = true;
        let sinceUpdate = 0;
        const done = (async () => {
            await client.connect();
            let position = 1;
            try {
                while (running) {
                    const cycleStart = nowMs();
                    const r = await client.query(GET, [CATEGORY, position, opts.batchSize]);
                    if (r.rows.length === 0) {
                        const left = opts.pollIntervalMs - (nowMs() - cycleStart);
                        if (left > 0) await sleep(left);
                        continue;
                    }
                    for (let i = 0; i < r.rows.length; i++) {
                        const row = r.rows[i];
                        onEvent(JSON.parse(row.data));
                        position = Number(row.global_position) + 1;
                        if (++sinceUpdate >= opts.positionUpdateInterval) {
                            sinceUpdate = 0;
                            await client.query(WRITE1, [randomUUID(), positionStream, 'Recorded',
                                { position: Number(row.global_position) }]);
                        }
                    }
                }
            } finally {
                await client.end();
            }
        })();
        return {
            stop: async () => {
                running = false;
                await done;
            },
            done,
        };
    }

    async close() {
        if (this.pool) await this.pool.end();
        this.pool = null;
    }
}
