/*
 * chaos_append.c — one appender of the chaos run (tests/fault/chaos/chaos.sh).
 *
 * Usage: chaos_append DSN ID ACKFILE DOUBTFILE [ids]
 *
 * Appends until SIGTERM/SIGINT, synchronously, a mix of single events (a third of the appends)
 * and batches of 2..20, to shared streams ("sh-0".."sh-7", which every appender writes) and to
 * private ones ("p<ID>-0".."p<ID>-3"). Every event carries a unique id in its metadata
 * ({"u":"<ID>.<pid>.<n>"}) and a value 1..1000 as its payload (decimal text), so the checker can
 * find each acknowledged event and compare per-stream sums.
 *
 * What it records is the promise being tested: the ids of an append are written to ACKFILE
 * (one write(2) per append, before the next append starts) only after pawl_append returned 0.
 * PAWL_ECONN means "did not commit", so the same events (same ids) are retried, and a duplicate
 * in the log would expose a broken promise; PAWL_EINDOUBT means "may have committed", so the ids
 * go to DOUBTFILE and are not retried (the checker allows them at most once). A SIGKILL between
 * a commit and the write to ACKFILE only leaves an event in the log that nobody acknowledged,
 * which the checks allow.
 *
 * With "ids" every event also carries its unique id as its event id (pawl_event.id), and every
 * append that fails in any way (in doubt included) is appended again, the same events with the
 * same ids, until it succeeds: the store itself repeats lost appends (append_retry_ms) and this
 * loop repeats whatever it still reports. Nothing goes to DOUBTFILE then, except the ids of an
 * append still unfinished when the run stops; the checker's "unique" check is the proof that the
 * ids made every repetition safe.
 */
#include "pawl.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_BATCH 20

static volatile sig_atomic_t stop;
static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static int write_ids(int fd, char ids[][48], size_t n)
{
    char buf[MAX_BATCH * 49];
    size_t len = 0;
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s\n", ids[i]);
    return write(fd, buf, len) == (ssize_t)len ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc != 5 && !(argc == 6 && strcmp(argv[5], "ids") == 0)) {
        fprintf(stderr, "usage: chaos_append DSN ID ACKFILE DOUBTFILE [ids]\n");
        return 2;
    }
    int with_ids = argc == 6;
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

    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.connections = 1;
    o.open_timeout_ms = 60000; /* PostgreSQL may be restarting */
    o.queue_timeout_ms = 60000;
    o.reconnect_max_ms = 1000;
    if (with_ids)
        o.append_retry_ms = 20000;
    struct pawl_store *s = NULL;
    char err[512];
    int rc;
    while ((rc = pawl_store_new(&s, dsn, &o, err, sizeof err)) != 0) {
        if (stop)
            return 0;
        fprintf(stderr, "chaos_append %d: open: %s; retrying\n", id, err);
        sleep(1);
    }

    struct pawl_event ev[MAX_BATCH];
    char streams[MAX_BATCH][32], meta[MAX_BATCH][80], vals[MAX_BATCH][8], ids[MAX_BATCH][48];
    unsigned long long n = 0, acked = 0, retries = 0, doubts = 0, failed = 0, already = 0;
    while (!stop) {
        size_t k = rand() % 3 == 0 ? 1 : 2 + (size_t)(rand() % (MAX_BATCH - 1));
        int shared = rand() % 2;
        int stream = rand() % (shared ? 8 : 4);
        for (size_t i = 0; i < k; i++) {
            /* A batch mostly stays on one stream, sometimes spreads over several. */
            if (rand() % 4 == 0) {
                shared = rand() % 2;
                stream = rand() % (shared ? 8 : 4);
            }
            if (shared)
                snprintf(streams[i], sizeof streams[i], "sh-%d", stream);
            else
                snprintf(streams[i], sizeof streams[i], "p%d-%d", id, stream);
            snprintf(ids[i], sizeof ids[i], "%d.%d.%llu", id, (int)getpid(), n++);
            snprintf(meta[i], sizeof meta[i], "{\"u\":\"%s\"}", ids[i]);
            snprintf(vals[i], sizeof vals[i], "%d", 1 + rand() % 1000);
            memset(&ev[i], 0, sizeof ev[i]);
            ev[i].stream_id = streams[i];
            ev[i].type = k == 1 ? "Single" : "Batched";
            ev[i].payload = vals[i];
            ev[i].payload_len = strlen(vals[i]);
            ev[i].metadata = meta[i];
            ev[i].id = with_ids ? ids[i] : NULL;
        }
        int retried = 0;
        for (;;) {
            struct pawl_append_result r;
            rc = pawl_append(s, ev, k, &r);
            if (rc == 0) {
                if (retried)
                    fprintf(stderr, "chaos_append %d: retry %s: ids %s..%s\n", id,
                            r.already ? "found them already appended" : "committed", ids[0],
                            ids[k - 1]);
                already += r.already ? k : 0;
                if (write_ids(ack, ids, k) != 0)
                    perror("ack write");
                acked += k;
            } else if (rc == PAWL_ECONN && !stop) {
                retries++;
                fprintf(stderr, "chaos_append %d: not committed (%s), retrying ids %s..%s\n", id,
                        r.message, ids[0], ids[k - 1]);
                usleep(50000);
                retried = 1;
                continue; /* did not commit: the same events again */
            } else if (with_ids && !stop) {
                retries++;
                fprintf(stderr, "chaos_append %d: %s (%s), appending ids %s..%s again\n", id,
                        pawl_strerror(rc), r.message, ids[0], ids[k - 1]);
                usleep(50000);
                retried = 1;
                continue; /* the ids make it safe, whatever the outcome was */
            } else if (rc == PAWL_EINDOUBT || with_ids) {
                fprintf(stderr, "chaos_append %d: in doubt (%s): ids %s..%s\n", id, r.message,
                        ids[0], ids[k - 1]);
                write_ids(doubt, ids, k);
                doubts += k;
            } else {
                failed++;
                if (failed < 20 || failed % 100 == 0)
                    fprintf(stderr, "chaos_append %d: append: %s: %s\n", id, pawl_strerror(rc),
                            r.message);
                usleep(50000);
            }
            break;
        }
        /* A little pacing so that seven processes share two cores with the server. */
        usleep((useconds_t)(rand() % 4000));
    }
    struct pawl_store_stats st;
    pawl_store_stats(s, &st, 0);
    pawl_store_free(s);
    fprintf(stderr,
            "chaos_append %d: %llu events acknowledged (%llu of them found already appended), "
            "%llu in doubt, %llu retries, %llu failures; the store sent %lld appends again after "
            "a lost connection\n",
            id, acked, already, doubts, retries, failed, (long long)st.append_lost_retries);
    return 0;
}
