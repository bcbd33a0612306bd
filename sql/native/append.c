/*
 * append.c: pawl.append in C (pawl_native 1.3).
 *
 * The contract is the PL/pgSQL pawl.append of sql/015_event_ids.sql: the same signature, row,
 * errors and rights. The C function does the common append without a statement; every other
 * call runs that PL/pgSQL function, kept under the name pawl.append_sql by
 * sql/native/activate.sql, so each rule and each message is written once. The common append
 * is: well-formed arrays (one-dimensional from 1, of matching lengths, no NULL but in metadata,
 * expected numbers >= 0, each stream's events ranked 1..count in order), no earlier append in
 * the calling transaction (the SQL function numbers k after it and stamps its first row), no
 * event id already in the log (the SQL function says which rule such an id meets), and a
 * partitioned pawl.events whose only triggers are statement triggers before INSERT on the
 * parent (events_guard) and whose partitions have the indexes the look-ups below need. The
 * steps follow the SQL function's, in its order:
 *
 *   1. one new snapshot S, after a command counter increment (as PL/pgSQL takes one per
 *      statement of a VOLATILE function): every look-up below and the guard run under it;
 *   2. each stream's head: the highest stream_seq visible under S (a backward btree scan of each
 *      partition's (stream_id, stream_seq) key), or the stream's floor in pawl.stream_floors
 *      when higher;
 *   3. with ids, a probe of each partition's unique (event_id) index: any id visible under S
 *      sends the call to the SQL function;
 *   4. a head that is not the expected one - 1: no insert; the row says so (appended 0, heads);
 *   5. otherwise the xid, then the ticket (nextval of pawl.append_ticket, with its privilege
 *      check), both after S (the ticket proof of sql/006_log_guarantees.sql), and the rows, in
 *      event order, into the partition that holds the xid, as logical replication applies rows
 *      (execReplication.c): the parent's statement triggers (events_guard, under S), the
 *      partition's NOT NULL, CHECK and partition constraints and all its indexes apply as for
 *      the INSERT the SQL function runs, with the parent's column defaults; with schema 18,
 *      each row's cat_run too (category_runs: consecutive rows of one category share one entry
 *      of the category index, sql/018_category_runs.sql), where the SQL function writes NULL;
 *   6. NOTIFY pawl_pending when asked and something was written.
 *
 * SECURITY DEFINER with search_path pinned (activate.sql), as the SQL function: the look-ups and
 * the insert run with the schema owner's rights, checked as the statements would check them.
 * Nothing is looked up through the caller's search_path. A malformed call is never an error of
 * this file: it takes the SQL function's path, which raises the SQL function's error. The state
 * kept across calls, per backend: the SQL path's saved plan, the blessed result row type, the
 * indexes the look-ups use (index_cache), the planned CHECK constraints and defaults
 * (expr_cache) and the planned index expressions and predicates (ixplan_cache), each checked
 * against the catalog's current state where it is used; a dropped entry's memory lasts until
 * the transaction ends (retire).
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relation.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_am_d.h"
#include "catalog/pg_class_d.h"
#include "catalog/pg_type_d.h"
#include "commands/async.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "optimizer/optimizer.h"
#include "rewrite/rewriteHandler.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "tcop/utility.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/xid8.h"

#include "pawl_native.h"

PG_FUNCTION_INFO_V1(pawl_append);
PG_FUNCTION_INFO_V1(pawl_append_group);

#define APPEND_NARGS 9
#define APPEND_COLS 6

/* The event columns the append writes, in the order of ev_cols. */
enum {
    EV_XID,
    EV_SEQ,
    EV_K,
    EV_N,
    EV_STREAM,
    EV_TYPE,
    EV_PAYLOAD,
    EV_META,
    EV_TICKET,
    EV_ID,
    EV_COLS
};
static const char *const ev_cols[EV_COLS] = {"xid",       "stream_seq", "k",       "n",
                                             "stream_id", "type",       "payload", "metadata",
                                             "ticket",    "event_id"};
static const Oid ev_types[EV_COLS] = {XID8OID, INT8OID,  INT4OID,  INT4OID, TEXTOID,
                                      TEXTOID, BYTEAOID, JSONBOID, INT8OID, TEXTOID};

/* The arguments of a common call, deconstructed: a group of na appends (pawl.append: one). */
typedef struct append_args {
    bool group;      /* pawl.append_group */
    int n;           /* events */
    int m;           /* stream slots */
    int na;          /* appends */
    Datum *streams;  /* [m] */
    int64 *expected; /* [m] */
    int32 *sa;       /* [m], the slot's append, 1-based */
    int32 *si;       /* [n], the event's slot, 1-based */
    int32 *rank;     /* [n], its rank in its slot: 1, 2, ... in event order */
    Datum *types;    /* [n] */
    Datum *payloads; /* [n] */
    Datum *metas;    /* [n], or NULL: no metadata */
    bool *mnulls;    /* [n], with metas */
    Datum *ids;      /* [n], or NULL: no ids */
    bool *idnulls;   /* [n], with ids: the events of appends without ids */
    bool notify;
} append_args;

/* What the appends of a call get. */
typedef struct append_plan {
    int nd;     /* distinct streams */
    int32 *sd;  /* [m], the slot's distinct stream, 0-based */
    int64 *cur; /* [nd], its head as the appends are taken in order */
    int64 *hd;  /* [m], the slot's head before its append */
    int32 *w;   /* [na], events written (0: a head was not the expected one) */
    int32 *kd;  /* [na], its event with ordinal o (1-based) gets k = kd + o */
    int32 *s0;  /* [na], its first and last slot, 0-based */
    int32 *s1;
    int32 total; /* events written */
} append_plan;

/* A partition of pawl.events, opened for the look-ups. */
typedef struct apart {
    part_range r;
    Relation rel;
    Relation skey; /* unique btree on (stream_id, stream_seq) */
    Relation ikey; /* unique btree on (event_id), when the call has ids */
    AttrNumber a_seq;
} apart;

/* pawl.append_group's argument types; pawl.append's are these without the third (sa). */
static const Oid group_argtypes[APPEND_NARGS + 1] = {
    TEXTARRAYOID, INT8ARRAYOID,  INT4ARRAYOID,  INT4ARRAYOID, INT4ARRAYOID,
    TEXTARRAYOID, BYTEAARRAYOID, JSONBARRAYOID, BOOLOID,      TEXTARRAYOID};

static SPIPlanPtr portable_plan[2] = {NULL, NULL};
static TupleDesc append_desc = NULL;

/* The row type (appended int4, txid text, heads int8[], status text, seqs int8[], msg text),
 * blessed once per backend. */
static TupleDesc append_result_desc(void)
{
    if (append_desc == NULL) {
        MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
        TupleDesc td = CreateTemplateTupleDesc(APPEND_COLS);

        TupleDescInitEntry(td, 1, "appended", INT4OID, -1, 0);
        TupleDescInitEntry(td, 2, "txid", TEXTOID, -1, 0);
        TupleDescInitEntry(td, 3, "heads", INT8ARRAYOID, -1, 0);
        TupleDescInitEntry(td, 4, "status", TEXTOID, -1, 0);
        TupleDescInitEntry(td, 5, "seqs", INT8ARRAYOID, -1, 0);
        TupleDescInitEntry(td, 6, "msg", TEXTOID, -1, 0);
        append_desc = BlessTupleDesc(td);
        MemoryContextSwitchTo(old);
    }
    return append_desc;
}

/* Argument argno as a one-dimensional array from 1 of elemtype, with want elements (any number
 * >= 1 when want < 0) and no NULL element unless nulls is given; false when it is not so. */
static bool arg_array(FunctionCallInfo fcinfo, int argno, Oid elemtype, int16 len, bool byval,
                      char align, int want, Datum **elems, bool **nulls, int *count)
{
    ArrayType *arr;
    bool *nl;
    int cnt;
    int i;

    if (PG_ARGISNULL(argno))
        return false;
    arr = PG_GETARG_ARRAYTYPE_P(argno);
    if (ARR_NDIM(arr) != 1 || ARR_LBOUND(arr)[0] != 1 || ARR_ELEMTYPE(arr) != elemtype ||
        ARR_DIMS(arr)[0] < 1 || (want >= 0 && ARR_DIMS(arr)[0] != want))
        return false;
    deconstruct_array(arr, elemtype, len, byval, align, elems, &nl, &cnt);
    if (nulls != NULL)
        *nulls = nl;
    else
        for (i = 0; i < cnt; i++)
            if (nl[i])
                return false;
    if (count != NULL)
        *count = cnt;
    return true;
}

/* An int4 array argument with want elements, none NULL, into *out. */
static bool int4_arg(FunctionCallInfo fcinfo, int argno, int want, int32 **out)
{
    Datum *d;
    int i;

    if (!arg_array(fcinfo, argno, INT4OID, 4, true, TYPALIGN_INT, want, &d, NULL, NULL))
        return false;
    *out = palloc(sizeof(int32) * want);
    for (i = 0; i < want; i++)
        (*out)[i] = DatumGetInt32(d[i]);
    return true;
}

/* The slots' appends (sa: 1, then each the previous or one more) and the events' slots and
 * ranks (each slot's events ranked 1, 2, ... in event order; each append's events after the
 * previous append's; in a group, every slot has an event). */
static bool common_shape(append_args *a)
{
    int *next = palloc0(sizeof(int) * (a->m + 1));
    int prev = 1;
    int i;

    for (i = 0; i < a->m; i++)
        if (i == 0 ? a->sa[0] != 1 : (a->sa[i] != a->sa[i - 1] && a->sa[i] != a->sa[i - 1] + 1))
            return false;
    a->na = a->sa[a->m - 1];
    for (i = 0; i < a->n; i++) {
        int s = a->si[i];

        if (s < 1 || s > a->m || a->rank[i] != ++next[s] || a->sa[s - 1] < prev)
            return false;
        prev = a->sa[s - 1];
    }
    if (a->group)
        for (i = 1; i <= a->m; i++)
            if (next[i] == 0)
                return false;
    return true;
}

/* Two text datums, bytewise (the "C" collation of stream ids and event ids). */
static int text_cmp(Datum x, Datum y)
{
    text *tx = DatumGetTextPP(x);
    text *ty = DatumGetTextPP(y);
    int lx = VARSIZE_ANY_EXHDR(tx);
    int ly = VARSIZE_ANY_EXHDR(ty);
    int c = memcmp(VARDATA_ANY(tx), VARDATA_ANY(ty), Min(lx, ly));

    return c != 0 ? c : (lx > ly) - (lx < ly);
}

/* Whether stream ids x and y have the same category (pawl.category: up to the first '-'). */
static bool same_category(Datum x, Datum y)
{
    text *tx = DatumGetTextPP(x);
    text *ty = DatumGetTextPP(y);
    const char *px = VARDATA_ANY(tx);
    const char *py = VARDATA_ANY(ty);
    const char *dx = memchr(px, '-', VARSIZE_ANY_EXHDR(tx));
    const char *dy = memchr(py, '-', VARSIZE_ANY_EXHDR(ty));
    size_t lx = dx != NULL ? (size_t)(dx - px) : VARSIZE_ANY_EXHDR(tx);
    size_t ly = dy != NULL ? (size_t)(dy - py) : VARSIZE_ANY_EXHDR(ty);

    return lx == ly && memcmp(px, py, lx) == 0;
}

static int datum_text_cmp(const void *x, const void *y)
{
    return text_cmp(*(const Datum *)x, *(const Datum *)y);
}

/* Ids of a common call: each append's events all carry one or none does, no id twice. */
static bool common_ids(const append_args *a)
{
    Datum *v = palloc(sizeof(Datum) * a->n);
    int *has = palloc0(sizeof(int) * (a->na + 1));
    int *cnt = palloc0(sizeof(int) * (a->na + 1));
    int nv = 0;
    int i;

    for (i = 0; i < a->n; i++) {
        int ap = a->sa[a->si[i] - 1];

        cnt[ap]++;
        if (!a->idnulls[i]) {
            has[ap]++;
            v[nv++] = a->ids[i];
        }
    }
    for (i = 1; i <= a->na; i++)
        if (has[i] != 0 && has[i] != cnt[i])
            return false;
    qsort(v, nv, sizeof(Datum), datum_text_cmp);
    for (i = 1; i < nv; i++)
        if (text_cmp(v[i - 1], v[i]) == 0)
            return false;
    return true;
}

/* The arguments of a common call; false sends the call to the SQL function. pawl.append:
 * (streams, expected, si, rank, types, payloads, metas, notify, ids); pawl.append_group the same
 * with sa after expected. */
static bool common_args(FunctionCallInfo fcinfo, bool group, append_args *a)
{
    int o = group ? 1 : 0; /* the arguments after sa move by one */
    Datum *d;
    int i;

    memset(a, 0, sizeof(*a));
    a->group = group;
    if (PG_NARGS() != APPEND_NARGS + o || PG_ARGISNULL(7 + o))
        return false;
    if (!arg_array(fcinfo, 4 + o, TEXTOID, -1, false, TYPALIGN_INT, -1, &a->types, NULL, &a->n) ||
        !arg_array(fcinfo, 0, TEXTOID, -1, false, TYPALIGN_INT, -1, &a->streams, NULL, &a->m) ||
        a->m > a->n ||
        !arg_array(fcinfo, 1, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, a->m, &d, NULL, NULL))
        return false;
    a->expected = palloc(sizeof(int64) * a->m);
    for (i = 0; i < a->m; i++) {
        a->expected[i] = DatumGetInt64(d[i]);
        if (a->expected[i] < 0)
            return false;
    }
    if (group) {
        if (!int4_arg(fcinfo, 2, a->m, &a->sa))
            return false;
    } else {
        a->sa = palloc(sizeof(int32) * a->m);
        for (i = 0; i < a->m; i++)
            a->sa[i] = 1;
    }
    if (!int4_arg(fcinfo, 2 + o, a->n, &a->si) || !int4_arg(fcinfo, 3 + o, a->n, &a->rank) ||
        !common_shape(a))
        return false;
    if (!arg_array(fcinfo, 5 + o, BYTEAOID, -1, false, TYPALIGN_INT, a->n, &a->payloads, NULL,
                   NULL))
        return false;
    if (!PG_ARGISNULL(6 + o) && !arg_array(fcinfo, 6 + o, JSONBOID, -1, false, TYPALIGN_INT, a->n,
                                           &a->metas, &a->mnulls, NULL))
        return false;
    if (!PG_ARGISNULL(8 + o)) {
        /* pawl.append: no NULL id; a group: the events of appends without ids have NULL. */
        if (!arg_array(fcinfo, 8 + o, TEXTOID, -1, false, TYPALIGN_INT, a->n, &a->ids, &a->idnulls,
                       NULL))
            return false;
        for (i = 0; i < a->n && !group; i++)
            if (a->idnulls[i])
                return false;
        if (!common_ids(a))
            return false;
    }
    a->notify = PG_GETARG_BOOL(7 + o);
    return true;
}

/* Whether irel is a unique btree of rel on exactly (a1) or (a1, a2), ascending, without
 * expressions; a predicate only when it is "a1 IS NOT NULL" and pred_ok. */
static bool index_fits(Relation rel, Relation irel, AttrNumber a1, AttrNumber a2, bool pred_ok)
{
    Form_pg_index ix = irel->rd_index;
    int natts = a2 != 0 ? 2 : 1;
    List *pred;
    NullTest *nt;

    if (ix->indrelid != RelationGetRelid(rel) || irel->rd_rel->relam != BTREE_AM_OID ||
        !ix->indisunique || !ix->indisvalid || ix->indnkeyatts != natts ||
        ix->indkey.values[0] != a1 || (natts == 2 && ix->indkey.values[1] != a2) ||
        irel->rd_indoption[0] != 0 || (natts == 2 && irel->rd_indoption[1] != 0) ||
        RelationGetIndexExpressions(irel) != NIL)
        return false;
    pred = RelationGetIndexPredicate(irel);
    if (pred == NIL)
        return true;
    nt =
        list_length(pred) == 1 && IsA(linitial(pred), NullTest) ? (NullTest *)linitial(pred) : NULL;
    return pred_ok && nt != NULL && nt->nulltesttype == IS_NOT_NULL && !nt->argisrow &&
           IsA(nt->arg, Var) && ((Var *)nt->arg)->varattno == a1;
}

/* The indexes found, per partition and kind (stream key, event id), so that a call opens the
 * two it needs rather than every index of every partition. Dropped for a relation whose
 * relcache entry is invalidated (an index created or dropped invalidates its table's), and
 * checked again when used. */
#define INDEX_CACHE 32
typedef struct index_hit {
    Oid relid;
    bool ids;
    Oid index;
} index_hit;
static index_hit index_cache[INDEX_CACHE];
static int index_cached = 0;
static bool index_cache_hooked = false;

static void index_cache_inval(Datum arg, Oid relid)
{
    int i;
    int j = 0;

    for (i = 0; i < index_cached; i++)
        if (OidIsValid(relid) && index_cache[i].relid != relid && index_cache[i].index != relid)
            index_cache[j++] = index_cache[i];
    index_cached = j;
}

/* The unique index of rel on (a1) or (a1, a2) as index_fits says (ids: the event id's, else the
 * stream key's); NULL when rel has none. */
static Relation unique_index(Relation rel, AttrNumber a1, AttrNumber a2, bool ids)
{
    List *oids;
    ListCell *lc;
    int i;

    if (!index_cache_hooked) {
        CacheRegisterRelcacheCallback(index_cache_inval, (Datum)0);
        index_cache_hooked = true;
    }
    for (i = 0; i < index_cached; i++)
        if (index_cache[i].relid == RelationGetRelid(rel) && index_cache[i].ids == ids) {
            Relation irel = index_open(index_cache[i].index, AccessShareLock);

            if (index_fits(rel, irel, a1, a2, ids))
                return irel;
            index_close(irel, AccessShareLock);
            index_cache[i] = index_cache[--index_cached];
            break;
        }
    oids = RelationGetIndexList(rel);
    foreach (lc, oids) {
        Relation irel = index_open(lfirst_oid(lc), AccessShareLock);

        if (index_fits(rel, irel, a1, a2, ids)) {
            if (index_cached == INDEX_CACHE)
                index_cached--; /* the last found makes room */
            index_cache[index_cached].relid = RelationGetRelid(rel);
            index_cache[index_cached].ids = ids;
            index_cache[index_cached++].index = RelationGetRelid(irel);
            return irel;
        }
        index_close(irel, AccessShareLock);
    }
    return NULL;
}

/* An equality key on the first column of irel (text, in the index's collation). */
static void text_key(ScanKey key, Relation irel, Datum v)
{
    ScanKeyEntryInitialize(key, 0, 1, BTEqualStrategyNumber, InvalidOid, irel->rd_indcollation[0],
                           F_TEXTEQ, v);
}

/* An index scan kept open for several look-ups of one key each (index_rescan between them, as
 * a plan's inner index scan is rescanned). */
typedef struct prober {
    IndexScanDesc scan;
    TupleTableSlot *slot;
} prober;

static void prober_open(prober *pr, Relation rel, Relation irel, Snapshot snap, int nkeys)
{
    pr->slot = table_slot_create(rel, NULL);
    pr->scan = index_beginscan(rel, irel, snap, nkeys, 0);
}

static void prober_close(prober *pr)
{
    index_endscan(pr->scan);
    ExecDropSingleTupleTableSlot(pr->slot);
}

/* Whether a row is found by keys; with a_out, its column a_out of the first row of the backward
 * scan (the highest) in *out. */
static bool probe(prober *pr, ScanKey keys, int nkeys, AttrNumber a_out, int64 *out)
{
    bool found;

    index_rescan(pr->scan, keys, nkeys, NULL, 0);
    found = index_getnext_slot(pr->scan, a_out != 0 ? BackwardScanDirection : ForwardScanDirection,
                               pr->slot);
    if (found && a_out != 0) {
        bool isnull;
        Datum d = slot_getattr(pr->slot, a_out, &isnull);

        *out = isnull ? 0 : DatumGetInt64(d);
    }
    return found;
}

/* The one partition whose range holds x, or -1 (none, or more than one: a default partition). */
static int part_of(const apart *ps, int np, uint64 x)
{
    int found = -1;
    int i;

    for (i = 0; i < np; i++)
        if (ps[i].r.lo <= x && x <= ps[i].r.hi) {
            if (found >= 0)
                return -1;
            found = i;
        }
    return found;
}

/* Whether the calling transaction has appended before (its k = 0 row visible under snap); true
 * also when that cannot be told here. */
static bool appended_before(apart *ps, int np, Snapshot snap)
{
    FullTransactionId own = GetTopFullTransactionIdIfAny();
    AttrNumber cols[2];
    ScanKeyData keys[2];
    Relation pk;
    prober pr;
    bool found;
    int p;

    if (!FullTransactionIdIsValid(own))
        return false;
    p = part_of(ps, np, U64FromFullTransactionId(own));
    if (p < 0)
        return true;
    cols[0] = pawln_column_of(ps[p].rel, "xid", XID8OID);
    cols[1] = pawln_column_of(ps[p].rel, "k", INT4OID);
    pk = pawln_open_pkey(ps[p].rel, cols, 2);
    ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_XID8EQ, FullTransactionIdGetDatum(own));
    ScanKeyInit(&keys[1], 2, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(0));
    prober_open(&pr, ps[p].rel, pk, snap, 2);
    found = probe(&pr, keys, 2, 0, NULL);
    prober_close(&pr);
    index_close(pk, NoLock);
    return found;
}

static int slot_stream_cmp(const void *x, const void *y, void *arg)
{
    const Datum *streams = (const Datum *)arg;
    int32 sx = *(const int32 *)x;
    int32 sy = *(const int32 *)y;
    int c = text_cmp(streams[sx], streams[sy]);

    return c != 0 ? c : (sx > sy) - (sx < sy);
}

/* The slots' distinct streams (p->sd, p->nd), by their bytes, as the SQL function's dense_rank
 * over stream ids in the "C" collation. */
static void distinct_streams(const append_args *a, append_plan *p)
{
    int32 *order = palloc(sizeof(int32) * a->m);
    int i;

    p->sd = palloc(sizeof(int32) * a->m);
    for (i = 0; i < a->m; i++)
        order[i] = i;
    qsort_arg(order, a->m, sizeof(int32), slot_stream_cmp, a->streams);
    p->nd = 0;
    for (i = 0; i < a->m; i++) {
        if (i > 0 && text_cmp(a->streams[order[i - 1]], a->streams[order[i]]) != 0)
            p->nd++;
        p->sd[order[i]] = p->nd;
    }
    p->nd++;
}

/* Each distinct stream's head under snap (p->cur): its highest stream_seq in any partition, or
 * its floor in pawl.stream_floors when that is higher. */
static void read_heads(const append_args *a, append_plan *p, apart *ps, int np, Snapshot snap)
{
    Relation floors = pawln_open_table("stream_floors", AccessShareLock, ACL_SELECT);
    AttrNumber a_fsid = pawln_column_of(floors, "stream_id", TEXTOID);
    AttrNumber a_last = pawln_column_of(floors, "last_seq", INT8OID);
    Relation fkey = pawln_open_pkey(floors, &a_fsid, 1);
    prober *prs = palloc(sizeof(prober) * (np + 1)); /* each partition's, then the floors' */
    bool *done = palloc0(sizeof(bool) * p->nd);
    bool floored;
    ScanKeyData key;
    int i;
    int k;

    for (k = 0; k < np; k++)
        prober_open(&prs[k], ps[k].rel, ps[k].skey, snap, 1);
    /* No block, no row under any snapshot (a committed row lies in a block that exists): the
     * common case, until retention first drops a partition. */
    floored = RelationGetNumberOfBlocks(floors) > 0;
    if (floored)
        prober_open(&prs[np], floors, fkey, snap, 1);
    p->cur = palloc0(sizeof(int64) * p->nd);
    for (i = 0; i < a->m; i++) {
        int d = p->sd[i];
        int64 v;

        if (done[d])
            continue;
        done[d] = true;
        for (k = 0; k < np; k++) {
            text_key(&key, ps[k].skey, a->streams[i]);
            if (probe(&prs[k], &key, 1, ps[k].a_seq, &v) && v > p->cur[d])
                p->cur[d] = v;
        }
        if (!floored)
            continue;
        text_key(&key, fkey, a->streams[i]);
        if (probe(&prs[np], &key, 1, a_last, &v) && v > p->cur[d])
            p->cur[d] = v;
    }
    for (k = 0; k < np + (floored ? 1 : 0); k++)
        prober_close(&prs[k]);
    index_close(fkey, NoLock);
    table_close(floors, NoLock);
}

/* The appends in order, as the SQL function takes them: each checks its expected numbers
 * against the heads the appends before it left, and moves them on when it is written. False
 * when a head would pass int8's range (the SQL function's error). */
static bool plan_appends(const append_args *a, append_plan *p)
{
    int32 *cnt = palloc0(sizeof(int32) * a->m); /* per slot: its events */
    int32 o1 = 1; /* the ordinal of the current append's first event */
    int ap;
    int i;
    int j = 0;

    for (i = 0; i < a->n; i++)
        cnt[a->si[i] - 1]++;
    p->hd = palloc0(sizeof(int64) * a->m);
    p->w = palloc0(sizeof(int32) * a->na);
    p->kd = palloc0(sizeof(int32) * a->na);
    p->s0 = palloc0(sizeof(int32) * a->na);
    p->s1 = palloc0(sizeof(int32) * a->na);
    p->total = 0;
    for (ap = 0; ap < a->na; ap++) {
        int e = j;
        int32 ne = 0;
        bool ok = true;

        while (e + 1 < a->m && a->sa[e + 1] == ap + 1)
            e++;
        p->s0[ap] = j;
        p->s1[ap] = e;
        for (i = j; i <= e; i++) {
            p->hd[i] = p->cur[p->sd[i]];
            ne += cnt[i];
            if (a->expected[i] > 0 && p->hd[i] != a->expected[i] - 1)
                ok = false;
        }
        if (ok) {
            for (i = j; i <= e; i++) {
                if (p->cur[p->sd[i]] > PG_INT64_MAX - cnt[i])
                    return false;
                p->cur[p->sd[i]] += cnt[i];
            }
            p->w[ap] = ne;
            p->kd[ap] = p->total - o1;
            p->total += ne;
        }
        o1 += ne;
        j = e + 1;
    }
    return true;
}

/* Whether any of the call's ids is in the log under snap. */
static bool ids_found(const append_args *a, apart *ps, int np, Snapshot snap)
{
    prober *prs = palloc(sizeof(prober) * (np > 0 ? np : 1));
    ScanKeyData key;
    bool found = false;
    int i;
    int k;

    for (k = 0; k < np; k++)
        prober_open(&prs[k], ps[k].rel, ps[k].ikey, snap, 1);
    for (i = 0; i < a->n && !found; i++)
        for (k = 0; k < np && !a->idnulls[i] && !found; k++) {
            text_key(&key, ps[k].ikey, a->ids[i]);
            found = probe(&prs[k], &key, 1, 0, NULL);
        }
    for (k = 0; k < np; k++)
        prober_close(&prs[k]);
    return found;
}

/*
 * A dropped cache entry's memory is retired, not freed, until the transaction ends: the running
 * statement's compiled expressions (ExecInitExpr keeps pointers into the planned tree, to
 * by-reference constants for one) may still use it. An entry is dropped by an invalidation,
 * which a lock taken in the middle of a statement can deliver, or to make room.
 */
static MemoryContext retired = NULL;

static void retired_free(XactEvent event, void *arg)
{
    (void)arg;
    if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
        event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_PARALLEL_ABORT ||
        event == XACT_EVENT_PREPARE)
        MemoryContextReset(retired); /* deletes the retired contexts, its children */
}

/* Made before the first cache entry, so that dropping one never allocates. */
static void retired_init(void)
{
    if (retired != NULL)
        return;
    retired =
        AllocSetContextCreate(TopMemoryContext, "pawl_native retired plans", ALLOCSET_SMALL_SIZES);
    RegisterXactCallback(retired_free, NULL);
}

static void retire(MemoryContext cxt)
{
    MemoryContextSetParent(cxt, retired);
}

/* Planned expressions by their stored text (a CHECK constraint's ccbin, a default's adbin with
 * the column's type), kept per backend, so that a call neither parses nor plans what the table's
 * definition holds: a statement does both once per execution (ExecRelCheck, the planner's
 * defaults), which was an eighth of a one-event append's server time. The text is the key, read
 * from the relcache entry at each use, so a changed constraint or default is a different entry;
 * what planning depends on besides (the functions' and types' definitions) clears the whole cache
 * when it changes. Entries live in their own memory context; the oldest is dropped when full. */
#define EXPR_CACHE 32
typedef struct expr_hit {
    char *text;
    Oid typid;
    Expr *planned;
    MemoryContext cxt;
} expr_hit;
static expr_hit expr_cache[EXPR_CACHE];
static int expr_cached = 0;
static bool expr_cache_hooked = false;

static void expr_cache_clear(Datum arg, int cacheid, uint32 hashvalue)
{
    int i;

    for (i = 0; i < expr_cached; i++)
        retire(expr_cache[i].cxt);
    expr_cached = 0;
}

/* The planned expression of text (typid: the column's type for a default, InvalidOid for a
 * check). On a miss a default's tree is built from rel's column attnum, a check's parsed from
 * text. */
static Expr *cached_expr(const char *text, Oid typid, Relation rel, AttrNumber attnum)
{
    MemoryContext cxt;
    MemoryContext old;
    Node *tree;
    int i;

    if (!expr_cache_hooked) {
        retired_init();
        CacheRegisterSyscacheCallback(PROCOID, expr_cache_clear, (Datum)0);
        CacheRegisterSyscacheCallback(TYPEOID, expr_cache_clear, (Datum)0);
        expr_cache_hooked = true;
    }
    for (i = 0; i < expr_cached; i++)
        if (expr_cache[i].typid == typid && strcmp(expr_cache[i].text, text) == 0)
            return expr_cache[i].planned;
    cxt = AllocSetContextCreate(CacheMemoryContext, "pawl_native expression", ALLOCSET_SMALL_SIZES);
    old = MemoryContextSwitchTo(cxt);
    PG_TRY();
    {
        tree = OidIsValid(typid) ? build_column_default(rel, attnum) : stringToNode(text);
        tree = (Node *)expression_planner((Expr *)tree);
    }
    PG_CATCH();
    {
        MemoryContextSwitchTo(old);
        MemoryContextDelete(cxt);
        PG_RE_THROW();
    }
    PG_END_TRY();
    if (expr_cached == EXPR_CACHE) {
        retire(expr_cache[0].cxt);
        memmove(expr_cache, expr_cache + 1, sizeof(expr_hit) * (EXPR_CACHE - 1));
        expr_cached--;
    }
    expr_cache[expr_cached].text = pstrdup(text);
    expr_cache[expr_cached].typid = typid;
    expr_cache[expr_cached].planned = (Expr *)tree;
    expr_cache[expr_cached].cxt = cxt;
    MemoryContextSwitchTo(old);
    return expr_cache[expr_cached++].planned;
}

/*
 * The indexes' planned expressions and predicates, per index and backend: ExecOpenIndices builds
 * each index's IndexInfo afresh for every statement (copying the expressions and the predicate
 * out of the relcache), and the first row inserted plans both again (expression_planner) before
 * compiling them. For a 1-event append that set-up cost more than the insert into a partial or
 * expression index (the category index: about 9k instructions against 6.7k for the btree
 * insert). Here an IndexInfo is made from the index's pg_index row as BuildIndexInfo makes it,
 * with the expressions and predicate planned once per backend, and only compiled per statement.
 * An index's expressions and predicate never change (a new definition is a new index); their
 * planning depends on functions and types, whose invalidation clears the cache, as does any
 * relcache invalidation of the index (dropped entries are retired, as the expressions' are).
 */
#define IXPLAN_CACHE 32
typedef struct ixplan_hit {
    Oid index;
    List *exprs; /* planned, or NIL */
    List *pred;  /* planned, implicit AND, or NIL */
    MemoryContext cxt;
} ixplan_hit;
static ixplan_hit ixplan_cache[IXPLAN_CACHE];
static int ixplan_cached = 0;
static bool ixplan_hooked = false;

static void ixplan_drop(int i)
{
    retire(ixplan_cache[i].cxt);
    ixplan_cache[i] = ixplan_cache[--ixplan_cached];
}

static void ixplan_syscache_inval(Datum arg, int cacheid, uint32 hashvalue)
{
    while (ixplan_cached > 0)
        ixplan_drop(ixplan_cached - 1);
}

static void ixplan_relcache_inval(Datum arg, Oid relid)
{
    int i;

    for (i = ixplan_cached - 1; i >= 0; i--)
        if (!OidIsValid(relid) || ixplan_cache[i].index == relid)
            ixplan_drop(i);
}

static const ixplan_hit *ixplan_get(Relation irel)
{
    MemoryContext cxt;
    MemoryContext old;
    List *exprs;
    List *pred;
    int i;

    if (!ixplan_hooked) {
        retired_init();
        CacheRegisterSyscacheCallback(PROCOID, ixplan_syscache_inval, (Datum)0);
        CacheRegisterSyscacheCallback(TYPEOID, ixplan_syscache_inval, (Datum)0);
        CacheRegisterRelcacheCallback(ixplan_relcache_inval, (Datum)0);
        ixplan_hooked = true;
    }
    for (i = 0; i < ixplan_cached; i++)
        if (ixplan_cache[i].index == RelationGetRelid(irel))
            return &ixplan_cache[i];
    cxt = AllocSetContextCreate(CacheMemoryContext, "pawl_native index plan", ALLOCSET_SMALL_SIZES);
    old = MemoryContextSwitchTo(cxt);
    PG_TRY();
    {
        exprs = RelationGetIndexExpressions(irel);
        pred = RelationGetIndexPredicate(irel);
        if (exprs != NIL)
            exprs = (List *)expression_planner((Expr *)exprs);
        if (pred != NIL)
            pred = (List *)expression_planner((Expr *)pred);
    }
    PG_CATCH();
    {
        MemoryContextSwitchTo(old);
        MemoryContextDelete(cxt);
        PG_RE_THROW();
    }
    PG_END_TRY();
    MemoryContextSwitchTo(old);
    if (ixplan_cached == IXPLAN_CACHE)
        ixplan_drop(0);
    ixplan_cache[ixplan_cached].index = RelationGetRelid(irel);
    ixplan_cache[ixplan_cached].exprs = exprs;
    ixplan_cache[ixplan_cached].pred = pred;
    ixplan_cache[ixplan_cached].cxt = cxt;
    return &ixplan_cache[ixplan_cached++];
}

/* irel's IndexInfo for inserts of this statement (estate), as BuildIndexInfo would make it, with
 * its expressions and predicate compiled from the planned ones kept (an index of an exclusion
 * constraint, which pawl.events does not have, is built by BuildIndexInfo). */
static IndexInfo *index_info(Relation irel, EState *estate)
{
    Form_pg_index ix = irel->rd_index;
    const ixplan_hit *h;
    IndexInfo *ii;
    MemoryContext old;
    ListCell *lc;
    int i;

    if (ix->indisexclusion || ix->indnatts < 1 || ix->indnatts > INDEX_MAX_KEYS)
        return BuildIndexInfo(irel);
    h = ixplan_get(irel);
    ii = makeIndexInfo(ix->indnatts, ix->indnkeyatts, irel->rd_rel->relam, h->exprs, h->pred,
                       ix->indisunique, ix->indnullsnotdistinct, ix->indisready, false);
    for (i = 0; i < ix->indnatts; i++)
        ii->ii_IndexAttrNumbers[i] = ix->indkey.values[i];
    ii->ii_OpclassOptions = RelationGetIndexRawAttOptions(irel);
    old = MemoryContextSwitchTo(estate->es_query_cxt);
    foreach (lc, h->exprs)
        ii->ii_ExpressionsState = lappend(ii->ii_ExpressionsState, ExecInitExpr(lfirst(lc), NULL));
    if (h->pred != NIL)
        ii->ii_PredicateState = ExecInitQual(h->pred, NULL);
    MemoryContextSwitchTo(old);
    return ii;
}

/* ExecOpenIndices(rri, false) with index_info in place of BuildIndexInfo. */
static void open_indices(ResultRelInfo *rri, EState *estate)
{
    Relation rel = rri->ri_RelationDesc;
    List *oids;
    ListCell *lc;
    int i = 0;

    rri->ri_NumIndices = 0;
    if (!RelationGetForm(rel)->relhasindex)
        return;
    oids = RelationGetIndexList(rel);
    if (oids == NIL)
        return;
    rri->ri_IndexRelationDescs = palloc(sizeof(Relation) * list_length(oids));
    rri->ri_IndexRelationInfo = palloc(sizeof(IndexInfo *) * list_length(oids));
    foreach (lc, oids) {
        Relation irel = index_open(lfirst_oid(lc), RowExclusiveLock);

        rri->ri_IndexRelationDescs[i] = irel;
        rri->ri_IndexRelationInfo[i] = index_info(irel, estate);
        rri->ri_NumIndices = ++i;
    }
    list_free(oids);
}

/* The stored text of the default of rel's column attnum; NULL when it has none. */
static const char *default_text(Relation rel, AttrNumber attnum)
{
    TupleConstr *constr = RelationGetDescr(rel)->constr;
    int i;

    for (i = 0; constr != NULL && i < constr->num_defval; i++)
        if (constr->defval[i].adnum == attnum)
            return constr->defval[i].adbin;
    return NULL;
}

/* The leaf's CHECK constraints, ready for ExecConstraints (which would otherwise parse and plan
 * them for this ResultRelInfo): ri_ConstraintExprs in the order of the relcache's array. */
static void leaf_checks(ResultRelInfo *rri, EState *estate)
{
    TupleConstr *constr = RelationGetDescr(rri->ri_RelationDesc)->constr;
    MemoryContext old;
    int i;

    if (constr == NULL || constr->num_check == 0)
        return;
    old = MemoryContextSwitchTo(estate->es_query_cxt);
    rri->ri_ConstraintExprs = palloc(sizeof(ExprState *) * constr->num_check);
    for (i = 0; i < constr->num_check; i++)
        rri->ri_ConstraintExprs[i] =
            ExecInitExpr(cached_expr(constr->check[i].ccbin, InvalidOid, NULL, 0), NULL);
    MemoryContextSwitchTo(old);
}

/* The parent's column defaults for the columns the append does not write, by the leaf's
 * attribute number (values, isnull: natts of the leaf), evaluated once. */
static void leaf_defaults(Relation events, Relation leaf, EState *estate, Datum *values,
                          bool *isnull)
{
    TupleDesc ptd = RelationGetDescr(events);
    MemoryContext old = MemoryContextSwitchTo(estate->es_query_cxt);
    int i;
    int c;

    for (i = 0; i < RelationGetDescr(leaf)->natts; i++)
        isnull[i] = true;
    for (i = 0; i < ptd->natts; i++) {
        Form_pg_attribute att = TupleDescAttr(ptd, i);
        const char *text;
        Expr *def;
        AttrNumber la;
        bool null;
        Datum v;

        if (att->attisdropped || !att->atthasdef || att->attgenerated)
            continue;
        for (c = 0; c < EV_COLS; c++)
            if (strcmp(NameStr(att->attname), ev_cols[c]) == 0)
                break;
        if (c < EV_COLS)
            continue;
        /* An identity column's default is not stored text: built and planned each time. */
        text = att->attidentity ? NULL : default_text(events, i + 1);
        if (text != NULL)
            def = cached_expr(text, att->atttypid, events, i + 1);
        else if ((def = (Expr *)build_column_default(events, i + 1)) != NULL)
            def = expression_planner(def);
        if (def == NULL)
            continue;
        la = pawln_column_of(leaf, NameStr(att->attname), att->atttypid);
        v = ExecEvalExprSwitchContext(ExecInitExpr(def, NULL), GetPerTupleExprContext(estate),
                                      &null);
        isnull[la - 1] = null;
        values[la - 1] = null ? (Datum)0 : datumCopy(v, att->attbyval, att->attlen);
    }
    MemoryContextSwitchTo(old);
}

/*
 * The category runs of the written rows (sql/018_category_runs.sql), by event ordinal: a row
 * heads a run (its length, >= 1) unless it follows, with the next k, a row of the same category
 * written by this call (then 0, and its head's length counts it). Unwritten events get -1.
 */
static int32 *category_runs(const append_args *a, const append_plan *p)
{
    int32 *run = palloc(sizeof(int32) * a->n);
    int head = -1;
    int32 prev_k = 0;
    Datum prev_stream = (Datum)0;
    int o;

    for (o = 0; o < a->n; o++) {
        int s = a->si[o] - 1;
        int ap = a->sa[s] - 1;
        int32 k = p->kd[ap] + o + 1;

        if (p->w[ap] == 0) {
            run[o] = -1;
            continue;
        }
        if (head >= 0 && k == prev_k + 1 && run[head] < PG_INT32_MAX &&
            same_category(prev_stream, a->streams[s])) {
            run[head]++;
            run[o] = 0;
        } else {
            head = o;
            run[o] = 1;
        }
        prev_k = k;
        prev_stream = a->streams[s];
    }
    return run;
}

/* The written appends' rows, in event order, into leaf (a partition of events), as one INSERT
 * command into events would put them there. */
static void insert_events(Relation events, Relation leaf, const append_args *a,
                          const append_plan *p, FullTransactionId xid, int64 ticket, Snapshot snap)
{
    TupleDesc ltd = RelationGetDescr(leaf);
    AttrNumber att[EV_COLS];
    AttrNumber a_run;
    int32 *run = NULL;
    EState *estate;
    RangeTblEntry *rte;
    ResultRelInfo *root;
    ResultRelInfo *rri;
    TupleTableSlot *slot;
    Datum *defvals;
    bool *defnulls;
    int i;
    int o;

    for (i = 0; i < EV_COLS; i++)
        att[i] = pawln_column_of(leaf, ev_cols[i], ev_types[i]);
    a_run = pawln_column_if(leaf, "cat_run", INT4OID);
    if (a_run != 0)
        run = category_runs(a, p);
    estate = CreateExecutorState();
    rte = makeNode(RangeTblEntry);
    rte->rtekind = RTE_RELATION;
    rte->relid = RelationGetRelid(events);
    rte->relkind = events->rd_rel->relkind;
    rte->rellockmode = RowExclusiveLock;
    ExecInitRangeTable(estate, list_make1(rte));
    root = makeNode(ResultRelInfo);
    InitResultRelInfo(root, events, 1, NULL, 0);
    rri = makeNode(ResultRelInfo);
    InitResultRelInfo(rri, leaf, 0, root, 0);
    estate->es_opened_result_relations = list_make2(root, rri);
    estate->es_snapshot = snap;
    estate->es_output_cid = GetCurrentCommandId(true);
    open_indices(rri, estate);
    leaf_checks(rri, estate);
    slot = ExecInitExtraTupleSlot(estate, ltd, &TTSOpsVirtual);
    defvals = palloc(sizeof(Datum) * ltd->natts);
    defnulls = palloc(sizeof(bool) * ltd->natts);
    leaf_defaults(events, leaf, estate, defvals, defnulls);

    AfterTriggerBeginQuery();
    ExecBSInsertTriggers(estate, root);
    for (o = 0; o < a->n; o++) {
        int s = a->si[o] - 1;
        int ap = a->sa[s] - 1;
        int32 k = p->kd[ap] + o + 1;
        Datum *v = slot->tts_values;
        bool *nl = slot->tts_isnull;

        if (p->w[ap] == 0)
            continue;
        ExecClearTuple(slot);
        memcpy(v, defvals, sizeof(Datum) * ltd->natts);
        memcpy(nl, defnulls, sizeof(bool) * ltd->natts);
        for (i = 0; i < EV_COLS; i++)
            nl[att[i] - 1] = false;
        v[att[EV_XID] - 1] = FullTransactionIdGetDatum(xid);
        v[att[EV_SEQ] - 1] = Int64GetDatum(p->hd[s] + a->rank[o]);
        v[att[EV_K] - 1] = Int32GetDatum(k);
        v[att[EV_N] - 1] = Int32GetDatum(p->total);
        v[att[EV_STREAM] - 1] = a->streams[s];
        v[att[EV_TYPE] - 1] = a->types[o];
        v[att[EV_PAYLOAD] - 1] = a->payloads[o];
        if (a->metas != NULL && !a->mnulls[o])
            v[att[EV_META] - 1] = a->metas[o];
        else
            nl[att[EV_META] - 1] = true;
        if (k == 0)
            v[att[EV_TICKET] - 1] = Int64GetDatum(ticket);
        else
            nl[att[EV_TICKET] - 1] = true;
        if (a->ids != NULL && !a->idnulls[o])
            v[att[EV_ID] - 1] = a->ids[o];
        else
            nl[att[EV_ID] - 1] = true;
        if (run != NULL && run[o] != 1) { /* a row alone stays NULL: no bytes for it */
            v[a_run - 1] = Int32GetDatum(run[o]);
            nl[a_run - 1] = false;
        }
        ExecStoreVirtualTuple(slot);
        ExecSimpleRelationInsert(rri, estate, slot);
        ResetPerTupleExprContext(estate);
    }
    ExecASInsertTriggers(estate, root, NULL);
    AfterTriggerEndQuery(estate);
    ExecCloseIndices(rri);
    ExecResetTupleTable(estate->es_tupleTable, false);
    FreeExecutorState(estate);
}

/* Close what open_parts opened (the locks stay to the end of the transaction, as a statement's). */
static void close_parts(apart *ps, int np)
{
    int p;

    for (p = 0; p < np; p++) {
        if (ps[p].ikey != NULL)
            index_close(ps[p].ikey, NoLock);
        if (ps[p].skey != NULL)
            index_close(ps[p].skey, NoLock);
        if (ps[p].rel != NULL)
            table_close(ps[p].rel, NoLock);
    }
}

/* Open every partition of events with the indexes the look-ups need; false (all closed again)
 * when one lacks them or is not a plain table. */
static bool open_parts(Relation events, bool with_ids, apart **out, int *np)
{
    AttrNumber a_xid = pawln_column_of(events, "xid", XID8OID);
    part_range *r = pawln_event_partitions(events, a_xid, np);
    apart *ps = palloc0(sizeof(apart) * (*np > 0 ? *np : 1));
    int p;

    *out = ps;
    for (p = 0; p < *np; p++) {
        AttrNumber a_sid;
        AttrNumber a_eid;

        ps[p].r = r[p];
        ps[p].rel = table_open(r[p].relid, AccessShareLock);
        if (ps[p].rel->rd_rel->relkind != RELKIND_RELATION)
            break;
        a_sid = pawln_column_of(ps[p].rel, "stream_id", TEXTOID);
        ps[p].a_seq = pawln_column_of(ps[p].rel, "stream_seq", INT8OID);
        ps[p].skey = unique_index(ps[p].rel, a_sid, ps[p].a_seq, false);
        if (ps[p].skey == NULL)
            break;
        if (with_ids) {
            a_eid = pawln_column_of(ps[p].rel, "event_id", TEXTOID);
            ps[p].ikey = unique_index(ps[p].rel, a_eid, 0, true);
            if (ps[p].ikey == NULL)
                break;
        }
    }
    if (p < *np) {
        close_parts(ps, p + 1);
        return false;
    }
    return true;
}

/* Whether inserting into events (the parent) may skip the executor: no rules, and no trigger
 * on INSERT but statement triggers before it; and into leaf: a plain table without rules or
 * triggers. */
static bool direct_ok(Relation rel, bool leaf)
{
    TriggerDesc *td = rel->trigdesc;

    if (rel->rd_rel->relhasrules)
        return false;
    if (leaf)
        return rel->rd_rel->relkind == RELKIND_RELATION && td == NULL;
    return rel->rd_rel->relkind == RELKIND_PARTITIONED_TABLE &&
           (td == NULL || !(td->trig_insert_before_row || td->trig_insert_after_row ||
                            td->trig_insert_instead_row || td->trig_insert_after_statement ||
                            td->trig_insert_new_table));
}

/* The rows of a common call, one per append: events written (0: a head was not the expected
 * one), the xid, the heads of its slots before it; no id status. */
static HeapTuple *result_rows(const append_args *a, const append_plan *p, FullTransactionId xid,
                              MemoryContext into)
{
    MemoryContext old = MemoryContextSwitchTo(into);
    HeapTuple *rows = palloc(sizeof(HeapTuple) * a->na);
    Datum txid = CStringGetTextDatum(psprintf(UINT64_FORMAT, U64FromFullTransactionId(xid)));
    Datum *hd = palloc(sizeof(Datum) * a->m);
    int ap;
    int i;

    for (i = 0; i < a->m; i++)
        hd[i] = Int64GetDatum(p->hd[i]);
    for (ap = 0; ap < a->na; ap++) {
        Datum values[APPEND_COLS];
        bool nulls[APPEND_COLS] = {false, false, false, true, true, true};

        values[0] = Int32GetDatum(p->w[ap]);
        values[1] = txid;
        values[2] = PointerGetDatum(construct_array(hd + p->s0[ap], p->s1[ap] - p->s0[ap] + 1,
                                                    INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
        values[3] = values[4] = values[5] = (Datum)0;
        rows[ap] = heap_form_tuple(append_result_desc(), values, nulls);
    }
    MemoryContextSwitchTo(old);
    return rows;
}

/* The common call (see the top of the file): its rows in *rows (allocated in into); false when
 * the call is not one, with nothing written (the xid may have been assigned, as the SQL
 * function assigns it). */
static bool append_common(const append_args *a, MemoryContext into, HeapTuple **rows)
{
    Relation events = pawln_open_table("events", RowExclusiveLock, ACL_INSERT);
    AclResult acl = pg_class_aclcheck(RelationGetRelid(events), GetUserId(), ACL_SELECT);
    apart *ps = NULL;
    int np = 0;
    append_plan p;
    Snapshot snap;
    FullTransactionId xid;
    Oid ticket_seq;
    int64 ticket;
    bool ok = false;
    int leaf;

    if (acl != ACLCHECK_OK)
        aclcheck_error(acl, OBJECT_TABLE, RelationGetRelationName(events));
    if (!direct_ok(events, false) || !open_parts(events, a->ids != NULL, &ps, &np)) {
        table_close(events, NoLock);
        return false;
    }
    CommandCounterIncrement();
    PushActiveSnapshot(GetTransactionSnapshot());
    snap = GetActiveSnapshot();
    if (appended_before(ps, np, snap) || (a->ids != NULL && ids_found(a, ps, np, snap)))
        goto out;
    distinct_streams(a, &p);
    read_heads(a, &p, ps, np, snap);
    if (!plan_appends(a, &p))
        goto out;
    /* The xid, then the ticket: both after the heads' snapshot. */
    xid = GetTopFullTransactionId();
    if (p.total > 0) {
        leaf = part_of(ps, np, U64FromFullTransactionId(xid));
        if (leaf < 0 || !direct_ok(ps[leaf].rel, true))
            goto out;
        LockRelationOid(RelationGetRelid(ps[leaf].rel), RowExclusiveLock);
        ticket_seq = get_relname_relid("append_ticket", get_namespace_oid("pawl", false));
        if (!OidIsValid(ticket_seq))
            pawln_schema_error("pawl.append_ticket is missing");
        ticket = nextval_internal(ticket_seq, true);
        PreventCommandIfReadOnly("INSERT");
        insert_events(events, ps[leaf].rel, a, &p, xid, ticket, snap);
        pawln_wake_runs_at_commit();
        if (a->notify)
            Async_Notify("pawl_pending", "");
    }
    *rows = result_rows(a, &p, xid, into);
    ok = true;
out:
    PopActiveSnapshot();
    close_parts(ps, np);
    table_close(events, NoLock);
    return ok;
}

/* Any other call: the SQL function (pawl.append_sql or pawl.append_group_sql), with the same
 * arguments, under the owner's rights (this function's); its rows are copied out into into. */
static HeapTuple *append_portable(FunctionCallInfo fcinfo, bool group, MemoryContext into,
                                  int *nrows)
{
    int nargs = APPEND_NARGS + (group ? 1 : 0);
    Datum args[APPEND_NARGS + 1];
    char argnulls[APPEND_NARGS + 1];
    Oid argtypes[APPEND_NARGS + 1];
    HeapTuple *rows;
    MemoryContext old;
    uint64 r;
    int rc;
    int i;

    for (i = 0; i < nargs; i++) {
        args[i] = PG_ARGISNULL(i) ? (Datum)0 : PG_GETARG_DATUM(i);
        argnulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
        argtypes[i] = group_argtypes[!group && i >= 2 ? i + 1 : i];
    }
    if (SPI_connect() != SPI_OK_CONNECT)
        elog(ERROR, "pawl.append: SPI_connect failed");
    if (portable_plan[group] == NULL) {
        SPIPlanPtr plan = SPI_prepare(
            group ? "SELECT appended, txid, heads, status, seqs, msg FROM pawl.append_group_sql("
                    "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
                  : "SELECT appended, txid, heads, status, seqs, msg FROM pawl.append_sql($1, "
                    "$2, $3, $4, $5, $6, $7, $8, $9)",
            nargs, argtypes);

        if (plan == NULL)
            elog(ERROR, "pawl.append: SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
        if (SPI_keepplan(plan) != 0)
            elog(ERROR, "pawl.append: SPI_keepplan failed");
        portable_plan[group] = plan;
    }
    rc = SPI_execute_plan(portable_plan[group], args, argnulls, false, 0);
    if (rc != SPI_OK_SELECT || SPI_tuptable->tupdesc->natts != APPEND_COLS ||
        SPI_processed > (uint64)INT_MAX)
        elog(ERROR, "pawl.append: the SQL function returned %s", SPI_result_code_string(rc));
    old = MemoryContextSwitchTo(into);
    rows = palloc(sizeof(HeapTuple) * (SPI_processed > 0 ? SPI_processed : 1));
    for (r = 0; r < SPI_processed; r++) {
        Datum values[APPEND_COLS];
        bool nulls[APPEND_COLS];

        for (i = 0; i < APPEND_COLS; i++)
            values[i] =
                SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, i + 1, &nulls[i]);
        rows[r] = heap_form_tuple(append_result_desc(), values, nulls);
    }
    *nrows = (int)SPI_processed;
    MemoryContextSwitchTo(old);
    SPI_finish();
    return rows;
}

/* The rows a call returns, one per value-per-call call. */
typedef struct append_rows {
    HeapTuple *rows;
    int n;
} append_rows;

/* The declaration the entry points were written for: the arguments are read by position and
 * type, and the SQL path is called with them. Checked once per function and backend (a
 * function's argument and result types never change under its oid). */
static void check_declaration(FunctionCallInfo fcinfo, bool group)
{
    static Oid checked[2] = {InvalidOid, InvalidOid};
    Oid fn = fcinfo->flinfo->fn_oid;
    int nargs = APPEND_NARGS + (group ? 1 : 0);
    TupleDesc rd = append_result_desc();
    TupleDesc td = NULL;
    Oid *argtypes = NULL;
    int n = -1;
    bool ok;
    int i;

    if (OidIsValid(fn) && checked[group] == fn)
        return;
    ok = OidIsValid(fn) && fcinfo->flinfo->fn_retset && PG_NARGS() == nargs;
    if (ok) {
        get_func_signature(fn, &argtypes, &n);
        ok = n == nargs;
        /* pawl.append has no sa: its types are the group's without the third. */
        for (i = 0; ok && i < nargs; i++)
            ok = argtypes[i] == group_argtypes[!group && i >= 2 ? i + 1 : i];
    }
    if (ok)
        ok = get_func_result_type(fn, NULL, &td) == TYPEFUNC_COMPOSITE && td != NULL &&
             td->natts == APPEND_COLS;
    for (i = 0; ok && i < APPEND_COLS; i++)
        ok = TupleDescAttr(td, i)->atttypid == TupleDescAttr(rd, i)->atttypid;
    if (!ok)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_FUNCTION_DEFINITION),
                 errmsg("%s must be declared as %s RETURNS TABLE (appended int4, txid text, "
                        "heads int8[], status text, seqs int8[], msg text)",
                        group ? "pawl_append_group" : "pawl_append",
                        group ? "pawl.append_group(text[], int8[], int4[], int4[], int4[], "
                                "text[], bytea[], jsonb[], boolean, text[])"
                              : "pawl.append(text[], int8[], int4[], int4[], text[], bytea[], "
                                "jsonb[], boolean, text[])")));
    checked[group] = fn;
}

static Datum append_entry(FunctionCallInfo fcinfo, bool group)
{
    FuncCallContext *funcctx;
    append_rows *out;

    if (SRF_IS_FIRSTCALL()) {
        append_args a;

        check_declaration(fcinfo, group);
        funcctx = SRF_FIRSTCALL_INIT();
        out = MemoryContextAllocZero(funcctx->multi_call_memory_ctx, sizeof(append_rows));
        if (common_args(fcinfo, group, &a) &&
            append_common(&a, funcctx->multi_call_memory_ctx, &out->rows))
            out->n = a.na;
        else
            out->rows = append_portable(fcinfo, group, funcctx->multi_call_memory_ctx, &out->n);
        funcctx->user_fctx = out;
    }
    funcctx = SRF_PERCALL_SETUP();
    out = (append_rows *)funcctx->user_fctx;
    if (funcctx->call_cntr < (uint64)out->n) {
        /* Taken before SRF_RETURN_NEXT, which counts the call before it evaluates its result. */
        Datum row = HeapTupleGetDatum(out->rows[funcctx->call_cntr]);

        SRF_RETURN_NEXT(funcctx, row);
    }
    SRF_RETURN_DONE(funcctx);
}

/*
 * pawl.append(streams text[], expected int8[], si int4[], rank int4[], types text[],
 *             payloads bytea[], metas jsonb[], notify boolean, ids text[])
 *   RETURNS TABLE (appended int4, txid text, heads int8[], status text, seqs int8[], msg text)
 * One row; value-per-call, all the work in the first call.
 */
Datum pawl_append(PG_FUNCTION_ARGS)
{
    return append_entry(fcinfo, false);
}

/*
 * pawl.append_group(streams text[], expected int8[], sa int4[], si int4[], rank int4[],
 *                   types text[], payloads bytea[], metas jsonb[], notify boolean, ids text[])
 *   RETURNS TABLE (appended int4, txid text, heads int8[], status text, seqs int8[], msg text)
 * One row per append, in order; value-per-call, all the work in the first call.
 */
Datum pawl_append_group(PG_FUNCTION_ARGS)
{
    return append_entry(fcinfo, true);
}
