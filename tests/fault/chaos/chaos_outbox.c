/*
 * chaos_outbox.c — the outbox appender of the chaos run (tests/fault/chaos/chaos.sh).
 *
 * Usage: chaos_outbox DSN ID ACKFILE DOUBTFILE
 *
 * Appends until SIGTERM/SIGINT the way a service with a transactional outbox does: on its own
 * libpq connection, each transaction first writes its business rows (one chaos_outbox row per
 * event id, so the transaction has an xid long before its append), sometimes rolls back a
 * savepoint, sometimes stays open for a while, then appends 1..5 events through pawl_append_in
 * to the shared streams the library appenders write too ("sh-0".."sh-7", racing them), sometimes
 * appends a second time in the same transaction, and commits. A third of the transactions run at
 * REPEATABLE READ. Event ids, metadata and payloads follow chaos_append.c, so the checker finds
 * every acknowledged event; it also checks that the business rows and the events committed
 * together (the outbox promise).
 *
 * Outcomes: an append conflict or a serialization failure rolls the transaction back and runs it
 * again with the same ids; a connection lost before COMMIT was sent did not commit (the same ids
 * again after reconnecting); a connection lost while COMMIT was in flight leaves the ids in
 * doubt (DOUBTFILE; never retried). Ids go to ACKFILE only after COMMIT succeeded.
 */
#include "pawl.h"

#include <fcntl.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_EVENTS 10

static volatile sig_atomic_t stop;
static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

enum outcome { COMMITTED, RETRY, DOUBT };

static int write_ids(int fd, char ids[][48], size_t n)
{
    char buf[MAX_EVENTS * 49];
    size_t len = 0;
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s\n", ids[i]);
    return write(fd, buf, len) == (ssize_t)len ? 0 : -1;
}

/* Run one statement; 0 on success, -1 on a statement error, -2 when the connection is gone. */
static int exec(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    int ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
    PQclear(r);
    if (ok)
        return 0;
    return PQstatus(c) == CONNECTION_OK ? -1 : -2;
}

static PGconn *connect_db(const char *dsn, int id)
{
    for (;;) {
        PGconn *c = PQconnectdb(dsn);
        if (PQstatus(c) == CONNECTION_OK) {
            exec(c, "SET application_name = 'chaos_outbox'");
            return c;
        }
        if (stop) {
            PQfinish(c);
            return NULL;
        }
        fprintf(stderr, "chaos_outbox %d: connect: %s", id, PQerrorMessage(c));
        PQfinish(c);
        sleep(1);
    }
}

/* One outbox transaction of events ev[0..n), appended in two statements when split > 0. */
static enum outcome run_tx(PGconn *c, const struct pawl_event *ev, size_t n, size_t split,
                           char ids[][48], int rr, int id)
{
    char sql[128];
    int rc = exec(c, rr ? "BEGIN ISOLATION LEVEL REPEATABLE READ" : "BEGIN");
    for (size_t i = 0; rc == 0 && i < n; i++) {
        snprintf(sql, sizeof sql, "INSERT INTO chaos_outbox (id) VALUES ('%.48s')", ids[i]);
        rc = exec(c, sql);
    }
    if (rc == 0 && rand() % 3 == 0) {
        rc = exec(c, "SAVEPOINT s");
        if (rc == 0)
            rc = exec(c, "INSERT INTO chaos_outbox (id) VALUES ('rolled-back')");
        if (rc == 0)
            rc = exec(c, "ROLLBACK TO SAVEPOINT s");
    }
    if (rc == 0 && rand() % 4 == 0)
        usleep((useconds_t)(rand() % 30000)); /* a business transaction that takes its time */
    struct pawl_append_result res = {0};
    if (rc == 0) {
        size_t first = split ? split : n;
        int a = pawl_append_in(c, ev, first, &res);
        if (a == 0 && first < n)
            a = pawl_append_in(c, ev + first, n - first, &res);
        if (a != 0) {
            if (a != PAWL_ECONFLICT && a != PAWL_ESQL && a != PAWL_ECONN)
                fprintf(stderr, "chaos_outbox %d: append: %s: %s\n", id, pawl_strerror(a),
                        res.message);
            rc = PQstatus(c) == CONNECTION_OK ? -1 : -2;
        }
    }
    if (rc == -2)
        return RETRY; /* the connection died before COMMIT was sent: nothing committed */
    if (rc != 0) {
        exec(c, "ROLLBACK");
        return RETRY;
    }
    PGresult *r = PQexec(c, "COMMIT");
    ExecStatusType st = PQresultStatus(r);
    PQclear(r);
    if (st == PGRES_COMMAND_OK)
        return COMMITTED;
    /* A failed COMMIT on a live connection rolled back; on a dead one it may have committed. */
    return PQstatus(c) == CONNECTION_OK ? RETRY : DOUBT;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: chaos_outbox DSN ID ACKFILE DOUBTFILE\n");
        return 2;
    }
    const char *dsn = argv[1];
    int id = atoi(argv[2]);
    int ack = open(argv[3], O_WRONLY | O_CREAT | O_APPEND, 0644);
    int doubt = open(argv[4], O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (ack < 0 || doubt < 0) {
        perror("open");
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    srand((unsigned)(time(NULL) ^ (getpid() << 8)));

    PGconn *c = connect_db(dsn, id);
    struct pawl_event ev[MAX_EVENTS];
    char streams[MAX_EVENTS][32], meta[MAX_EVENTS][80], vals[MAX_EVENTS][8], ids[MAX_EVENTS][48];
    unsigned long long seq = 0, acked = 0, retries = 0, doubts = 0;
    while (c != NULL && !stop) {
        size_t n = 1 + (size_t)(rand() % 5);
        size_t split = 0;
        if (rand() % 3 == 0) {
            n += 1 + (size_t)(rand() % 4); /* a second append in the same transaction */
            split = 1 + (size_t)(rand() % (n - 1));
        }
        int stream = rand() % 8;
        for (size_t i = 0; i < n; i++) {
            if (i == split && split > 0 && rand() % 2)
                stream = rand() % 8; /* the second append goes to another stream, or the same */
            snprintf(streams[i], sizeof streams[i], "sh-%d", stream);
            snprintf(ids[i], sizeof ids[i], "%d.%d.%llu", id, (int)getpid(), seq++);
            snprintf(meta[i], sizeof meta[i], "{\"u\":\"%s\"}", ids[i]);
            snprintf(vals[i], sizeof vals[i], "%d", 1 + rand() % 1000);
            memset(&ev[i], 0, sizeof ev[i]);
            ev[i].stream_id = streams[i];
            ev[i].type = "Outbox";
            ev[i].payload = vals[i];
            ev[i].payload_len = strlen(vals[i]);
            ev[i].metadata = meta[i];
        }
        int rr = rand() % 3 == 0;
        for (;;) {
            enum outcome o = run_tx(c, ev, n, split, ids, rr, id);
            if (o == COMMITTED) {
                if (write_ids(ack, ids, n) != 0)
                    perror("ack write");
                acked += n;
            } else if (o == DOUBT) {
                write_ids(doubt, ids, n);
                doubts += n;
            } else {
                retries++;
                if (PQstatus(c) != CONNECTION_OK) {
                    PQfinish(c);
                    c = connect_db(dsn, id);
                    if (c == NULL)
                        break;
                }
                if (stop)
                    break; /* not committed: nothing to record */
                usleep((useconds_t)(rand() % 20000));
                continue; /* the same ids again */
            }
            if (o == DOUBT) {
                PQfinish(c);
                c = connect_db(dsn, id);
            }
            break;
        }
        usleep((useconds_t)(rand() % 4000));
    }
    PQfinish(c);
    fprintf(stderr,
            "chaos_outbox %d: %llu events acknowledged, %llu in doubt, %llu transactions retried\n",
            id, acked, doubts, retries);
    return 0;
}
