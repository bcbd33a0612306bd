/*
 * chaos_check.c — the final checks of the chaos run (tests/fault/chaos/chaos.sh), run once every
 * appender has stopped and the processors have caught up and stopped.
 *
 * Usage: chaos_check DSN WORKDIR
 *
 * Reads the appenders' records (WORKDIR/ack-*, WORKDIR/doubt-*), finalizes whatever is left,
 * and checks, printing one line per check and the figures behind it:
 *   acked        every acknowledged append's events are in the log, exactly once
 *   unique       no event id appears twice in the log (in-doubt appends included)
 *   event_ids    appender 4's events carry their id as event id, it has events in the log,
 *                and none of its appends was left in doubt (it repeats them: the ids make
 *                that safe, "unique" proves it)
 *   finalized    every committed event row has a final index (none left behind)
 *   contiguous   the final indexes are exactly 1..N
 *   stream-order per stream, index order equals sequence order and sequences are 1, 2, 3, ...
 *   projection   chaos_proj (written in the batch transactions) equals the log: per stream
 *                count and sum of values, and the processor's tokens are at the head
 *   snapshot     each chaos_snap segment's durable snapshot covers its stored token and equals
 *                the fold of the segment's events up to the snapshot's position (exactly once)
 *   sink         every event of each chaos_async segment up to its stored token was delivered
 *                to the sink file (at least once)
 *   tokens       no token write recorded by the audit trigger moved a token backwards
 *   outbox       the outbox appender's business rows and its events committed together
 * Exit 0 when all pass.
 */
#include "pawl.h"
#include "projection.h"

#include <dirent.h>
#include <libpq-fe.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static PGconn *db;
static int failures;

static void report(const char *name, int ok, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void report(const char *name, int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("check %-12s %s  ", name, ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    failures += !ok;
}

static PGresult *q(const char *sql)
{
    PGresult *r = PQexec(db, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
        fprintf(stderr, "chaos_check: %s\n  %s", sql, PQerrorMessage(db));
        exit(1);
    }
    return r;
}

static long long q1(const char *sql)
{
    PGresult *r = q(sql);
    long long v = PQgetisnull(r, 0, 0) ? 0 : atoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    return v;
}

/* COPY every line of the files WORKDIR/PREFIX* into table (id text). Returns lines copied. */
static long long load_ids(const char *dir, const char *prefix, const char *table)
{
    char sql[256];
    snprintf(sql, sizeof sql, "COPY %s (id) FROM STDIN", table);
    PGresult *r = PQexec(db, sql);
    if (PQresultStatus(r) != PGRES_COPY_IN) {
        fprintf(stderr, "chaos_check: %s", PQerrorMessage(db));
        exit(1);
    }
    PQclear(r);
    long long n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        char path[4096], line[256];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        while (f && fgets(line, sizeof line, f)) {
            if (strchr(line, '\n') == NULL)
                continue; /* a torn last line of a killed process never happens (one write) */
            PQputCopyData(db, line, (int)strlen(line));
            n++;
        }
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
    PQputCopyEnd(db, NULL);
    r = PQgetResult(db);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        fprintf(stderr, "chaos_check: copy: %s", PQerrorMessage(db));
        exit(1);
    }
    PQclear(r);
    while ((r = PQgetResult(db)) != NULL)
        PQclear(r);
    return n;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: chaos_check DSN WORKDIR\n");
        return 2;
    }
    const char *dir = argv[2];
    db = PQconnectdb(argv[1]);
    if (PQstatus(db) != CONNECTION_OK) {
        fprintf(stderr, "chaos_check: %s", PQerrorMessage(db));
        return 1;
    }
    PQclear(q("SET client_min_messages = warning"));

    /* Finalize what the killed appenders left behind. */
    for (int i = 0; i < 100; i++) {
        long long a = q1("SELECT appends FROM pawl.finalize(100000)");
        if (a == 0)
            break;
    }

    PQclear(q("CREATE TEMP TABLE acks (id text); CREATE TEMP TABLE doubts (id text)"));
    long long nack = load_ids(dir, "ack-", "acks");
    long long ndoubt = load_ids(dir, "doubt-", "doubts");
    PQclear(q("CREATE TEMP TABLE logids AS SELECT metadata->>'u' AS id, global_index "
              "FROM pawl_api.events; CREATE INDEX ON logids (id); ANALYZE logids, acks"));
    long long head = q1("SELECT coalesce(max(global_index), 0) FROM pawl_api.events");
    long long nlog = q1("SELECT count(*) FROM pawl_api.events");

    long long missing = q1("SELECT count(*) FROM acks a WHERE NOT EXISTS "
                           "(SELECT 1 FROM logids l WHERE l.id = a.id)");
    long long dup_acks = q1("SELECT count(*) - count(DISTINCT id) FROM acks");
    if (missing > 0) {
        PGresult *m = q("SELECT id FROM acks a WHERE NOT EXISTS (SELECT 1 FROM logids l "
                        "WHERE l.id = a.id) ORDER BY id LIMIT 40");
        printf("missing acknowledged ids:");
        for (int i = 0; i < PQntuples(m); i++)
            printf(" %s", PQgetvalue(m, i, 0));
        printf("\n");
        PQclear(m);
    }
    report("acked", missing == 0 && dup_acks == 0 && nack > 0,
           "%lld acknowledged events, %lld missing from the log, %lld acknowledged twice", nack,
           missing, dup_acks);
    long long dups = q1("SELECT count(*) FROM (SELECT id FROM logids GROUP BY id "
                        "HAVING count(*) > 1) d");
    long long doubt_in = q1("SELECT count(*) FROM doubts d WHERE EXISTS "
                            "(SELECT 1 FROM logids l WHERE l.id = d.id)");
    long long unacked = nlog - nack;
    report("unique", dups == 0,
           "%lld events in the log, %lld ids twice; %lld in doubt (%lld of them committed); "
           "%lld committed but never acknowledged (killed before recording, or in doubt)",
           nlog, dups, ndoubt, doubt_in, unacked);
    long long with_id = q1("SELECT count(*) FROM pawl_api.events WHERE event_id IS NOT NULL");
    long long id_bad = q1("SELECT count(*) FROM pawl_api.events WHERE (event_id IS NOT NULL "
                          "OR metadata->>'u' LIKE '4.%') AND event_id IS DISTINCT FROM "
                          "metadata->>'u'");
    long long id_doubt = q1("SELECT count(*) FROM doubts WHERE id LIKE '4.%'");
    long long id_acked = q1("SELECT count(*) FROM acks WHERE id LIKE '4.%'");
    report("event_ids", with_id > 0 && id_acked > 0 && id_bad == 0,
           "%lld events with event ids (%lld acknowledged), %lld whose event id is not their "
           "own, %lld left unfinished at the stop",
           with_id, id_acked, id_bad, id_doubt);
    long long rows = q1("SELECT count(*) FROM pawl.events");
    report("finalized", rows == nlog, "%lld committed event rows, %lld with a final index", rows,
           nlog);
    long long mn = q1("SELECT coalesce(min(global_index), 1) FROM pawl_api.events");
    report("contiguous", mn == 1 && head == nlog, "indexes %lld..%lld for %lld events", mn, head,
           nlog);
    long long bad_order =
        q1("SELECT count(*) FROM (SELECT stream_seq - coalesce(lag(stream_seq) OVER w, 0) AS d "
           "FROM pawl_api.events WINDOW w AS (PARTITION BY stream_id ORDER BY global_index)) x "
           "WHERE d <> 1");
    long long nstreams = q1("SELECT count(DISTINCT stream_id) FROM pawl_api.events");
    report("stream-order", bad_order == 0, "%lld streams, %lld events out of sequence order",
           nstreams, bad_order);

    /* The outbox appender's business rows and its events committed together, or neither. */
    long long ob_events = q1("SELECT count(*) FROM pawl_api.events WHERE type = 'Outbox'");
    long long ob_rows = q1("SELECT count(*) FROM chaos_outbox");
    long long ob_orphan_events =
        q1("SELECT count(*) FROM pawl_api.events e WHERE e.type = 'Outbox' AND NOT EXISTS "
           "(SELECT 1 FROM chaos_outbox o WHERE o.id = e.metadata->>'u')");
    long long ob_orphan_rows = q1("SELECT count(*) FROM chaos_outbox o WHERE NOT EXISTS "
                                  "(SELECT 1 FROM logids l WHERE l.id = o.id)");
    report("outbox", ob_events > 0 && ob_orphan_events == 0 && ob_orphan_rows == 0,
           "%lld outbox events, %lld business rows; %lld events without their row, %lld rows "
           "without their event (a rolled-back savepoint's row among them)",
           ob_events, ob_rows, ob_orphan_events, ob_orphan_rows);

    long long proj_bad =
        q1("SELECT count(*) FROM (SELECT stream_id AS stream, count(*) AS n, "
           "sum(convert_from(payload, 'UTF8')::int8) AS total FROM pawl_api.events "
           "GROUP BY stream_id) l FULL JOIN chaos_proj p USING (stream) "
           "WHERE l.n IS DISTINCT FROM p.n OR l.total IS DISTINCT FROM p.total");
    long long sql_behind = q1("SELECT count(*) FROM pawl.tokens WHERE processor = 'chaos_sql' "
                              "AND token <> (SELECT coalesce(max(global_index), 0) "
                              "FROM pawl_api.events)");
    long long proj_n = q1("SELECT coalesce(sum(n), 0) FROM chaos_proj");
    report("projection", proj_bad == 0 && sql_behind == 0,
           "%lld streams differ from the log, %lld events projected, %lld segments not at the "
           "head",
           proj_bad, proj_n, sql_behind);

    /* Every event's stream hash, by index, for the segment checks. */
    PGresult *r = q("SELECT global_index, stream_id FROM pawl_api.events ORDER BY 1");
    size_t n = (size_t)PQntuples(r);
    uint32_t *hash = calloc(n + 1, sizeof *hash);
    for (size_t i = 0; i < n; i++)
        hash[i + 1] = pawl_stream_hash(PQgetvalue(r, (int)i, 1));
    PQclear(r);

    /* snapshot: durable state covers the stored token and is exactly the fold of the log. */
    r = q("SELECT segment_id, mask, token FROM pawl.tokens WHERE processor = 'chaos_snap' "
          "ORDER BY segment_id");
    int snap_ok = PQntuples(r) > 0;
    char detail[1024] = "";
    size_t dl = 0;
    char snapdir[4096];
    snprintf(snapdir, sizeof snapdir, "%s/snap", dir);
    for (int i = 0; i < PQntuples(r); i++) {
        struct pawl_segment seg = {(uint32_t)atoll(PQgetvalue(r, i, 0)),
                                   (uint32_t)atoll(PQgetvalue(r, i, 1))};
        long long token = atoll(PQgetvalue(r, i, 2));
        struct ex_proj_state st = {0}, want = {0};
        int rc = ex_projection_load(snapdir, seg, &st);
        if (rc != 0 && token > 0) {
            snap_ok = 0;
            dl +=
                (size_t)snprintf(detail + dl, sizeof detail - dl, " seg %u: no snapshot;", seg.id);
            continue;
        }
        for (long long k = 1; k <= st.pos && k <= (long long)n; k++)
            if ((hash[k] & seg.mask) == seg.id)
                ex_proj_apply(&want, k);
        want.pos = st.pos;
        int ok = st.pos >= token && st.pos <= head && st.count == want.count &&
                 st.sum == want.sum && st.hash == want.hash;
        snap_ok &= ok;
        dl += (size_t)snprintf(detail + dl, sizeof detail - dl,
                               " seg %u: token %lld, snapshot at %lld with %lld events%s;", seg.id,
                               token, (long long)st.pos, (long long)st.count,
                               ok ? "" : " (MISMATCH)");
    }
    PQclear(r);
    report("snapshot", snap_ok, "%s", detail);

    /* sink: every event up to each stored token was delivered. */
    char sinkpath[4096];
    snprintf(sinkpath, sizeof sinkpath, "%s/sink", dir);
    unsigned char *seen = calloc(n + 1, 1);
    long long lines = 0;
    FILE *f = fopen(sinkpath, "r");
    unsigned sid;
    long long idx;
    while (f && fscanf(f, "%u %lld", &sid, &idx) == 2) {
        lines++;
        if (idx >= 1 && idx <= (long long)n)
            seen[idx] = 1;
    }
    if (f)
        fclose(f);
    r = q("SELECT segment_id, mask, token FROM pawl.tokens WHERE processor = 'chaos_async' "
          "ORDER BY segment_id");
    int sink_ok = PQntuples(r) > 0;
    long long undelivered = 0, covered = 0;
    for (int i = 0; i < PQntuples(r); i++) {
        uint32_t id = (uint32_t)atoll(PQgetvalue(r, i, 0));
        uint32_t mask = (uint32_t)atoll(PQgetvalue(r, i, 1));
        long long token = atoll(PQgetvalue(r, i, 2));
        for (long long k = 1; k <= token && k <= (long long)n; k++)
            if ((hash[k] & mask) == id) {
                covered++;
                if (!seen[k])
                    undelivered++;
            }
    }
    PQclear(r);
    report("sink", sink_ok && undelivered == 0,
           "%lld deliveries in the sink, %lld events at or below the stored tokens, %lld of "
           "them never delivered",
           lines, covered, undelivered);

    long long writes = q1("SELECT count(*) FROM chaos_token_audit");
    long long back = q1("SELECT count(*) FROM chaos_token_audit WHERE new_token < old_token");
    long long over = q1("SELECT count(*) FROM pawl.tokens WHERE token > (SELECT "
                        "coalesce(max(global_index), 0) FROM pawl_api.events)");
    report("tokens", writes > 0 && back == 0 && over == 0,
           "%lld token writes audited, %lld moved a token backwards, %lld tokens beyond the "
           "head",
           writes, back, over);
    free(hash);
    free(seen);
    PQfinish(db);
    printf("chaos_check: %d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
