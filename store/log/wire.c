/*
 * wire.c — an append's parameters on the wire, the lowest room of the event store: the append
 * statement's text, the checks every event passes before anything reaches the server
 * (pawl__log_validate), the binary arrays the statement takes (pawl__log_encode) and its result
 * row read back into struct append_enc (pawl__log_enc_result_row, pawl__log_enc_seqs). Pure
 * functions of their arguments: no lock, no store, any thread; an append_enc belongs to whoever
 * holds its append (the caller, then the pool's I/O thread: see append_op.c).
 */
#include "log_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * The append statement: pawl.append (sql/006_log_guarantees.sql), the one append path of every
 * client. The client groups the events by stream: $1 the distinct streams (the first event's
 * stream first), $2 each stream's expected first sequence number (0 = ANY), and per event $3 its
 * stream (1-based into $1), $4 its rank among that stream's events in this append (1-based), $5
 * type, $6 payload, $7 metadata; $8 whether to NOTIFY pawl_pending at commit. It returns the
 * number of events written (n, or 0 when a stream is not at its expected version), the
 * transaction's xid and each stream's last sequence number before the append. A stream
 * expected to be new whose number 1 a concurrent append takes gets the unique index's 23505,
 * reported as the same conflict. Grouping on the client spares the server a window sort and a
 * hash aggregate per append, and sends each stream id once. $9 is every event's id, or NULL
 * (sql/015_event_ids.sql): the row's status then says 'already' (a retry of a committed
 * append: seqs holds the numbers its events got) or 'id' (msg: which id, and why).
 */
const char pawl__log_append_sql[] =
    "SELECT appended, txid, heads, status, seqs, msg FROM pawl.append($1::text[], $2::int8[],"
    " $3::int4[], $4::int4[], $5::text[], $6::bytea[], $7::jsonb[], $8::bool, $9::text[])";

/* Its parameters' types, as every connection that runs it prepares them. */
const Oid pawl__log_append_types[9] = {OID_TEXT_ARRAY,  OID_INT8_ARRAY, OID_INT4_ARRAY,
                                       OID_INT4_ARRAY,  OID_TEXT_ARRAY, OID_BYTEA_ARRAY,
                                       OID_JSONB_ARRAY, OID_BOOL,       OID_TEXT_ARRAY};

static int utf8_valid(const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x80) {
            if (c == 0)
                return 0;
            i++;
            continue;
        }
        size_t len;
        unsigned min;
        if ((c & 0xE0) == 0xC0) {
            len = 2;
            min = 0x80;
            c &= 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            min = 0x800;
            c &= 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            min = 0x10000;
            c &= 0x07;
        } else {
            return 0;
        }
        if (i + len > n)
            return 0;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80)
                return 0;
            c = (c << 6) | (p[i + k] & 0x3F);
        }
        if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

/*
 * Metadata must be one JSON object, checked with jansson before anything reaches the server
 * (so that the asynchronous path refuses it at the call, and the error names the event and the
 * place). Integers are read as doubles so that no integer is refused for its size; a number
 * beyond a double's range is refused, which PostgreSQL's jsonb would have stored (RFC 8259
 * warns such numbers do not interoperate). The server's jsonb input still judges the text it
 * stores: its refusal (22P02, 22P05) comes back as PAWL_EINVAL too.
 */
static int json_object_check(const char *s, size_t n, char *why, size_t wlen)
{
    json_error_t jerr;
    json_t *v = json_loadb(s, n, JSON_DECODE_INT_AS_REAL, &jerr);
    if (v == NULL) {
        snprintf(why, wlen, "%s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
        return 0;
    }
    int ok = json_is_object(v);
    if (!ok)
        snprintf(why, wlen, "a JSON %s, not an object",
                 json_is_array(v)    ? "array"
                 : json_is_string(v) ? "string"
                                     : "value");
    json_decref(v);
    return ok;
}

static int cmp_id(const void *a, const void *b, void *arg)
{
    const struct pawl_event *ev = arg;
    return strcmp(ev[*(const uint32_t *)a].id, ev[*(const uint32_t *)b].id);
}

/* An event id: 1..PAWL_EVENT_ID_MAX bytes of UTF-8, no control characters (the table's check). */
static int id_valid(const char *id)
{
    size_t l = strlen(id);
    if (l == 0 || l > PAWL_EVENT_ID_MAX || !utf8_valid((const unsigned char *)id, l))
        return 0;
    for (size_t i = 0; i < l; i++)
        if ((unsigned char)id[i] < 0x20 || id[i] == 0x7f)
            return 0;
    return 1;
}

static int cmp_stream_pos(const void *a, const void *b, void *arg)
{
    const struct pawl_event *ev = arg;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    int c = strcmp(ev[x].stream_id, ev[y].stream_id);
    if (c)
        return c;
    return x < y ? -1 : x > y;
}

/*
 * Check events before anything reaches the server. Writes the reason into msg. Returns 0,
 * PAWL_EINVAL or PAWL_ETOOBIG; *any is set when some stream uses PAWL_SEQ_ANY. On success ix
 * (room for n) holds the event positions sorted by stream, then by position: what
 * pawl__log_encode() groups the streams by.
 */
int pawl__log_validate(const struct pawl_store_opts *o, const struct pawl_event *ev, size_t n,
                       int *any, uint32_t *ix, char *msg, size_t mlen)
{
    *any = 0;
    if (ev == NULL || n == 0) {
        snprintf(msg, mlen, "an append needs at least one event");
        return PAWL_EINVAL;
    }
    if (n > o->max_append_events) {
        snprintf(msg, mlen, "%zu events in one append, more than max_append_events (%zu)", n,
                 o->max_append_events);
        return PAWL_ETOOBIG;
    }
    for (size_t i = 0; i < n; i++) {
        const struct pawl_event *e = &ev[i];
        if (e->stream_id == NULL || e->type == NULL) {
            snprintf(msg, mlen, "event %zu: stream_id and type are required", i);
            return PAWL_EINVAL;
        }
        size_t ls = strlen(e->stream_id), lt = strlen(e->type);
        size_t lm = e->metadata ? strlen(e->metadata) : 0;
        if (ls == 0 || ls > PAWL_STREAM_ID_MAX) {
            snprintf(msg, mlen, "event %zu: stream_id must have 1..%d bytes (has %zu)", i,
                     PAWL_STREAM_ID_MAX, ls);
            return PAWL_EINVAL;
        }
        if (lt == 0 || lt > PAWL_EVENT_TYPE_MAX) {
            snprintf(msg, mlen, "event %zu: type must have 1..%d bytes (has %zu)", i,
                     PAWL_EVENT_TYPE_MAX, lt);
            return PAWL_EINVAL;
        }
        if (e->payload == NULL && e->payload_len > 0) {
            snprintf(msg, mlen, "event %zu: payload is NULL with payload_len %zu", i,
                     e->payload_len);
            return PAWL_EINVAL;
        }
        if (e->payload_len > o->max_event_bytes ||
            ls + lt + lm + e->payload_len > o->max_event_bytes) {
            snprintf(msg, mlen, "event %zu: %zu bytes, more than max_event_bytes (%zu)", i,
                     ls + lt + lm + e->payload_len, o->max_event_bytes);
            return PAWL_ETOOBIG;
        }
        if (!utf8_valid((const unsigned char *)e->stream_id, ls) ||
            !utf8_valid((const unsigned char *)e->type, lt)) {
            snprintf(msg, mlen, "event %zu: stream_id or type is not valid UTF-8", i);
            return PAWL_EINVAL;
        }
        char why[200];
        if (e->metadata && !json_object_check(e->metadata, lm, why, sizeof why)) {
            snprintf(msg, mlen, "event %zu: metadata is not a JSON object: %.150s", i, why);
            return PAWL_EINVAL;
        }
        if (e->stream_seq < 0) {
            snprintf(msg, mlen, "event %zu: stream_seq %lld is negative", i,
                     (long long)e->stream_seq);
            return PAWL_EINVAL;
        }
        if (e->stream_seq == PAWL_SEQ_ANY)
            *any = 1;
        if ((e->id != NULL) != (ev[0].id != NULL)) {
            snprintf(msg, mlen, "event %zu: every event of an append carries an id, or none does",
                     i);
            return PAWL_EINVAL;
        }
        if (e->id != NULL && !id_valid(e->id)) {
            char shown[PAWL_PRINTABLE_SIZE(64)];
            snprintf(msg, mlen,
                     "event %zu: id \"%s\" must have 1..%d bytes of UTF-8 and no control "
                     "characters",
                     i, pawl_printable_str(e->id, shown, sizeof shown), PAWL_EVENT_ID_MAX);
            return PAWL_EINVAL;
        }
    }
    if (ev[0].id != NULL && n > 1) {
        /* Distinct ids: sorted by id, neighbours differ. */
        for (size_t i = 0; i < n; i++)
            ix[i] = (uint32_t)i;
        qsort_r(ix, n, sizeof *ix, cmp_id, (void *)ev);
        for (size_t i = 1; i < n; i++)
            if (strcmp(ev[ix[i - 1]].id, ev[ix[i]].id) == 0) {
                char shown[PAWL_PRINTABLE_SIZE(64)];
                snprintf(msg, mlen, "events %u and %u: id \"%s\" appears twice in one append",
                         PAWL_MIN(ix[i - 1], ix[i]), PAWL_MAX(ix[i - 1], ix[i]),
                         pawl_printable_str(ev[ix[i]].id, shown, sizeof shown));
                return PAWL_EINVAL;
            }
    }
    for (size_t i = 0; i < n; i++)
        ix[i] = (uint32_t)i;
    if (n == 1)
        return 0;
    /* Per stream: all ANY or all explicit and consecutive, in batch order. */
    qsort_r(ix, n, sizeof *ix, cmp_stream_pos, (void *)ev);
    for (size_t i = 1; i < n; i++) {
        const struct pawl_event *a = &ev[ix[i - 1]], *b = &ev[ix[i]];
        if (strcmp(a->stream_id, b->stream_id) != 0)
            continue;
        int bad = (a->stream_seq == 0) != (b->stream_seq == 0) ||
                  (a->stream_seq != 0 && b->stream_seq != a->stream_seq + 1);
        if (bad) {
            snprintf(msg, mlen,
                     "stream \"%.64s\": events %u and %u must both be ANY or consecutive "
                     "sequence numbers (%lld, %lld)",
                     a->stream_id, ix[i - 1], ix[i], (long long)a->stream_seq,
                     (long long)b->stream_seq);
            return PAWL_EINVAL;
        }
    }
    return 0;
}

/*
 * Encode an append's parameters (see pawl__log_append_sql) as binary arrays. ix is
 * pawl__log_validate()'s order: positions sorted by stream, then position, so each stream's events
 * are a run in it.
 */
/*
 * The streams of an append: the runs of equal stream ids in ix (pawl__log_validate()'s order).
 * Returns how many; *first_run is where the run of event 0's stream starts, and *sz_s grows by
 * the bytes their elements take in $1.
 */
static size_t enc_stream_runs(const struct pawl_event *ev, size_t n, const uint32_t *ix,
                              size_t *first_run, size_t *sz_s)
{
    size_t m = 0;
    for (size_t j = 0; j < n; j++) {
        if (j > 0 && strcmp(ev[ix[j]].stream_id, ev[ix[j - 1]].stream_id) == 0)
            continue;
        if (strcmp(ev[ix[j]].stream_id, ev[0].stream_id) == 0)
            *first_run = j;
        m++;
        *sz_s += 4 + strlen(ev[ix[j]].stream_id);
    }
    return m;
}

/*
 * Write each stream's element of $1 (*p on) and $2 (*q on), the run of event 0's stream first,
 * and every event's stream number and rank into $3's and $4's bodies (si_body, rk_body: one
 * 8-byte element per event, at the event's position). Sets en->first_count.
 */
static void enc_streams(struct append_enc *en, const struct pawl_event *ev, size_t n,
                        const uint32_t *ix, size_t first_run, char **pp, char **qq, char *si_body,
                        char *rk_body)
{
    char *p = *pp, *q = *qq;
    uint32_t stream_no = 0;
    for (int pass = 0; pass < 2; pass++) {
        /* Pass 0 writes the run of event 0's stream, pass 1 every other run. */
        for (size_t j = 0; j < n;) {
            size_t e = j + 1;
            while (e < n && strcmp(ev[ix[e]].stream_id, ev[ix[j]].stream_id) == 0)
                e++;
            if ((j == first_run) == (pass == 0)) {
                if (pass == 0)
                    en->first_count = e - j;
                stream_no++;
                size_t l = strlen(ev[ix[j]].stream_id);
                p = put32(p, (uint32_t)l);
                memcpy(p, ev[ix[j]].stream_id, l);
                p += l;
                q = put32(q, 8);
                q = put64(q, (uint64_t)ev[ix[j]].stream_seq);
                for (size_t r = j; r < e; r++) {
                    put64(si_body + (size_t)ix[r] * 8, ((uint64_t)4 << 32) | stream_no);
                    put64(rk_body + (size_t)ix[r] * 8, ((uint64_t)4 << 32) | (r - j + 1));
                }
            }
            j = e;
        }
    }
    *pp = p;
    *qq = q;
}

int pawl__log_encode(struct append_enc *en, const struct pawl_event *ev, size_t n,
                     const uint32_t *ix)
{
    /* Streams: m runs in ix; the run holding event 0 goes first (the in-doubt check reads the
     * first event's stream as ($1)[1]). */
    size_t first_run = 0, sz_s = 20;
    size_t m = enc_stream_runs(ev, n, ix, &first_run, &sz_s);
    size_t sz_q = 20 + m * 12, sz_si = 20 + n * 8, sz_r = 20 + n * 8;
    size_t sz_t = 20, sz_p = 20, sz_m = 20, sz_id = 0;
    int mnull = 0;
    en->has_ids = ev[0].id != NULL; /* pawl__log_validate(): all or none */
    if (en->has_ids)
        sz_id = 20;
    for (size_t i = 0; i < n; i++) {
        if (en->has_ids)
            sz_id += 4 + strlen(ev[i].id);
        sz_t += 4 + strlen(ev[i].type);
        sz_p += 4 + ev[i].payload_len;
        if (ev[i].metadata)
            sz_m += 5 + strlen(ev[i].metadata);
        else {
            sz_m += 4;
            mnull = 1;
        }
    }
    size_t total = sz_s + sz_q + sz_si + sz_r + sz_t + sz_p + sz_m + sz_id;
    if (total > INT32_MAX)
        return PAWL_ETOOBIG;
    if (en->cap < total) {
        char *nb = pawl_malloc(total);
        if (nb == NULL)
            return PAWL_ENOMEM;
        pawl_free(en->buf);
        en->buf = nb;
        en->cap = total;
    }
    char *p = en->buf;
    char *start[7];

    /* $1 streams and $2 their expected first numbers; $3/$4 filled per run. */
    start[0] = p;
    char *q = p + sz_s;    /* $2 */
    char *si = q + sz_q;   /* $3 */
    char *rk = si + sz_si; /* $4 */
    start[1] = q;
    start[2] = si;
    start[3] = rk;
    p = array_header(p, 0, OID_TEXT, m);
    q = array_header(q, 0, OID_INT8, m);
    char *si_body = array_header(si, 0, OID_INT4, n);
    char *rk_body = array_header(rk, 0, OID_INT4, n);
    en->si_off = (size_t)(si_body - en->buf);
    en->rk_off = (size_t)(rk_body - en->buf);
    en->seqs_ok = 0;
    enc_streams(en, ev, n, ix, first_run, &p, &q, si_body, rk_body);
    char *s_end = p;
    p = rk_body + n * 8;
    start[4] = p;
    p = array_header(p, 0, OID_TEXT, n);
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(ev[i].type);
        p = put32(p, (uint32_t)l);
        memcpy(p, ev[i].type, l);
        p += l;
    }
    start[5] = p;
    p = array_header(p, 0, OID_BYTEA, n);
    for (size_t i = 0; i < n; i++) {
        p = put32(p, (uint32_t)ev[i].payload_len);
        if (ev[i].payload_len)
            memcpy(p, ev[i].payload, ev[i].payload_len);
        p += ev[i].payload_len;
    }
    start[6] = p;
    p = array_header(p, mnull, OID_JSONB, n);
    for (size_t i = 0; i < n; i++) {
        if (ev[i].metadata == NULL) {
            p = put32(p, (uint32_t)-1);
            continue;
        }
        size_t l = strlen(ev[i].metadata);
        p = put32(p, (uint32_t)(l + 1));
        *p++ = 1; /* jsonb binary format version */
        memcpy(p, ev[i].metadata, l);
        p += l;
    }
    const char *end[7] = {s_end, q, si_body + n * 8, rk_body + n * 8, start[5], start[6], p};
    for (int i = 0; i < 7; i++) {
        en->values[i] = start[i];
        en->lengths[i] = (int)(end[i] - start[i]);
        en->formats[i] = 1;
    }
    en->values[7] = &en->notify;
    en->lengths[7] = 1;
    en->formats[7] = 1;
    /* $9 the ids, or NULL. */
    en->values[8] = NULL;
    en->lengths[8] = 0;
    en->formats[8] = 1;
    if (en->has_ids) {
        char *ids = p;
        p = array_header(p, 0, OID_TEXT, n);
        for (size_t i = 0; i < n; i++) {
            size_t l = strlen(ev[i].id);
            p = put32(p, (uint32_t)l);
            memcpy(p, ev[i].id, l);
            p += l;
        }
        en->values[8] = ids;
        en->lengths[8] = (int)(p - ids);
    }
    put32(en->n_be, (uint32_t)n);
    en->values[9] = en->n_be;
    en->lengths[9] = 4;
    en->formats[9] = 1;
    en->n = n;
    return 0;
}

/*
 * Every event's sequence number from the heads the server returned (text "{h1,...,hm}", each
 * stream's last number before the append, in $1's order): event i got heads[its stream] + its
 * rank, both read back from the encoded $3/$4 (each element: 4-byte length, 4-byte value).
 * Leaves seqs_ok 0 when memory or the text does not allow it.
 */
static void enc_all_seqs(struct append_enc *en, const char *h)
{
    size_t n = en->n;
    if (en->seqs_cap < 2 * n) {
        int64_t *ns = pawl_malloc(2 * n * sizeof *ns);
        if (ns == NULL)
            return;
        pawl_free(en->seqs);
        en->seqs = ns;
        en->seqs_cap = 2 * n;
    }
    int64_t *heads = en->seqs + n; /* at most n streams */
    size_t m = 0;
    const char *p = h + 1;
    while (*p != '}' && *p != '\0' && m < n) {
        char *end;
        heads[m++] = strtoll(p, &end, 10);
        if (end == p)
            return;
        p = *end == ',' ? end + 1 : end;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t sno = get32(en->buf + en->si_off + i * 8 + 4);
        uint32_t rank = get32(en->buf + en->rk_off + i * 8 + 4);
        if (sno == 0 || sno > m)
            return;
        en->seqs[i] = heads[sno - 1] + (int64_t)rank;
    }
    en->seqs_ok = 1;
}

/*
 * A retried append's numbers, every event's in event order (text "{s1,s2,...}"), into seqs; head1
 * from the first. Leaves seqs_ok 0 when memory or the text does not allow it.
 */
static void enc_already_seqs(struct append_enc *en, const char *t)
{
    size_t n = en->n;
    if (en->seqs_cap < 2 * n) {
        int64_t *ns = pawl_malloc(2 * n * sizeof *ns);
        if (ns == NULL)
            return;
        pawl_free(en->seqs);
        en->seqs = ns;
        en->seqs_cap = 2 * n;
    }
    const char *p = t + (*t == '{');
    for (size_t i = 0; i < n; i++) {
        char *end;
        en->seqs[i] = strtoll(p, &end, 10);
        if (end == p || en->seqs[i] < 1)
            return;
        p = *end == ',' ? end + 1 : end;
    }
    en->head1 = en->seqs[0] - 1;
    en->seqs_ok = 1;
}

/* pawl.append's row (text format), or row `row` of pawl.append_group's: appended, txid, heads
 * ("{h1,h2,...}"), status, seqs, msg. */
void pawl__log_enc_result_row(struct append_enc *en, const PGresult *res, int row)
{
    if (PQgetisnull(res, row, 0))
        return;
    en->status = ID_NONE;
    if (PQnfields(res) >= 6 && !PQgetisnull(res, row, 3)) {
        const char *st = PQgetvalue(res, row, 3);
        en->status = strcmp(st, "already") == 0 ? ID_ALREADY
                     : strcmp(st, "again") == 0 ? ID_AGAIN
                                                : ID_USED;
        if (en->status == ID_USED)
            snprintf(en->id_msg, sizeof en->id_msg, "%s",
                     PQgetisnull(res, row, 5) ? st : PQgetvalue(res, row, 5));
        if (en->status == ID_ALREADY && !PQgetisnull(res, row, 4))
            enc_already_seqs(en, PQgetvalue(res, row, 4));
        en->rows = en->status == ID_ALREADY ? (int64_t)en->n : 0;
        return;
    }
    en->rows = strtoll(PQgetvalue(res, row, 0), NULL, 10);
    if (!PQgetisnull(res, row, 1))
        snprintf(en->xid, sizeof en->xid, "%s", PQgetvalue(res, row, 1));
    if (!PQgetisnull(res, row, 2)) {
        const char *h = PQgetvalue(res, row, 2);
        if (*h == '{')
            en->head1 = strtoll(h + 1, NULL, 10);
        if (en->rows == (int64_t)en->n)
            enc_all_seqs(en, h);
    }
}

/* The stream sequence numbers of events[0]'s stream that a successful append was given. */
void pawl__log_enc_seqs(const struct append_enc *en, struct pawl_append_result *res)
{
    if (en->head1 >= 0) {
        res->first_seq = en->head1 + 1;
        res->last_seq = en->head1 + (int64_t)en->first_count;
    }
    res->seqs = en->seqs_ok ? en->seqs : NULL;
    res->already = en->status == ID_ALREADY;
    if (res->already && en->seqs_ok) {
        /* The numbers the retried events got then: events[0]'s stream's highest. */
        res->last_seq = res->first_seq;
        for (size_t i = 0; i < en->n; i++)
            if (get32(en->buf + en->si_off + i * 8 + 4) == 1 && en->seqs[i] > res->last_seq)
                res->last_seq = en->seqs[i];
    }
}
