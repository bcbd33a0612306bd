/*
 * read_filtered.c: the stream read (pawl_api.read_stream) and the filtered read
 * (pawl_api.read_filtered) in C (pawl_native 1.4), with the contracts of sql/016_filtered_reads.sql
 * and sql/017_finalize_fixes.sql: the same arguments and checks in the same order, the same rows
 * (read_filtered's trailing position row included), the same errors (SQLSTATE, message, detail,
 * hint), and the same guarantees (the retention watermark checked before and after a filtered
 * read, the stream floors, a stream read that ends at its first event without a run, no index at
 * or below the position passed).
 *
 * Design. An event's final index is not in its row: it is its append's base, in the run that
 * ordered its transaction, plus its place k in the append. The SQL readers find that run once
 * per event (a probe of runs_scan_xmax_idx and a search of the run's arrays, 10-40 us). Here:
 *
 *  - read_filtered walks the SQL's windows of runs (the same first run rf, end wend and horizon
 *    xhi, the same previous call P, the same growth of the span and the same limits). In each it
 *    collects the candidates from the same index ranges: per category, each partition's category
 *    index over [P.scan_xmax, xhi) (their xids read from the index tuples: nothing is fetched
 *    yet), and P's open xids below P.scan_xmax; an entry that heads a category run (schema
 *    18, sql/018_category_runs.sql) brings the rest of its run through the primary key when it
 *    is fetched (walk_run). It then reads the window's runs once, forward
 *    through runs_pkey, keeping the base and count of the candidates' transactions only, and
 *    fetches the events whose index falls in the window; their top max_events - got by index
 *    are returned in index order. A filter of types alone (no category index applies) walks the
 *    window's appends in index order instead, as pawl_api.read does, fetching each append's
 *    events through the primary key and keeping those of the types asked for.
 *  - read_stream merges the stream's rows from each partition's (stream_id, stream_seq) key in
 *    sequence order and finds each transaction's run through runs_scan_xmax_idx once (a stream's
 *    events share few transactions, and the run rows read are kept for the call); it stops at
 *    the first event without a run, since a stream's finalized events are a prefix of it.
 *
 * The run found for a transaction is the SQL's (the first by (scan_xmax, last_index) with
 * scan_xmax above the xid that lists it, with k below its count) wherever each transaction is
 * listed in one run, as the finalizer writes them; a ledger that lists one twice is not a log.
 * Memory is per call (the candidates of one window, the runs read), freed with the call; the
 * rows go into the caller's tuplestore (pawln_rows_begin). Per backend, two things are kept
 * across calls: the indexes found (per partition and kind, dropped on the relation's
 * invalidation, checked again on use), and the final indexes read_stream has found (see
 * xcache: final indexes never change; an entry is used only under snapshots that see its run).
 *
 * Rights: both are declared SECURITY DEFINER (sql/native/activate.sql), as the SQL versions are,
 * so a reader needs EXECUTE only; every relation is named with its schema and opened with the
 * checks a statement reading it would make for the current (definer) user, and nothing is looked
 * up through the caller's search_path (so none is pinned). Reads are under the calling
 * statement's snapshot. Any backend may call them at any time.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/sysattr.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am_d.h"
#include "catalog/pg_class_d.h"
#include "catalog/pg_collation_d.h"
#include "catalog/pg_operator_d.h"
#include "catalog/pg_opfamily_d.h"
#include "catalog/pg_type_d.h"
#include "commands/defrem.h"
#include "commands/sequence.h"
#include "common/int.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/primnodes.h"
#include "partitioning/partdesc.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"
#include "utils/xid8.h"

#include "pawl_native.h"

PG_FUNCTION_INFO_V1(pawl_read_stream);
PG_FUNCTION_INFO_V1(pawl_read_filtered);

#define XID8_LEN 8
#define XID8_BYVAL FLOAT8PASSBYVAL
#define XID8_ALIGN TYPALIGN_DOUBLE

#define ERRCODE_PAWL_BELOW_WATERMARK MAKE_SQLSTATE('P', 'W', '0', '2', '0')

/* The SQL versions' limits. */
#define MAX_EVENTS 100000
#define FILTER_MAX_ELEMS 1000
#define LOOK_LIMIT INT64CONST(4194304)
#define SPAN_MAX INT64CONST(1048576)

/* The result row: global_index, then the event columns. */
#define READ_COLS 8
static const char *const ev_cols[READ_COLS - 1] = {"stream_id", "stream_seq",  "type",    "payload",
                                                   "metadata",  "appended_at", "event_id"};
static const Oid res_types[READ_COLS] = {INT8OID,  TEXTOID,  INT8OID,        TEXTOID,
                                         BYTEAOID, JSONBOID, TIMESTAMPTZOID, TEXTOID};
#define EV_STREAM 0 /* index into ev_cols / att[] */
#define EV_SEQ 1
#define EV_TYPE 2

/* ---- bytes ------------------------------------------------------------------------------- */

/* A text value's bytes (detoasted into the current context when it must be). */
typedef struct bstr {
    const char *p;
    int len;
} bstr;

static bstr text_bytes(Datum d)
{
    struct varlena *v = pg_detoast_datum_packed((struct varlena *)DatumGetPointer(d));
    bstr b;

    b.p = VARDATA_ANY(v);
    b.len = VARSIZE_ANY_EXHDR(v);
    return b;
}

/* The order of the "C" collation: bytes, then length. */
static int bstr_cmp(const bstr *a, const bstr *b)
{
    int c = memcmp(a->p, b->p, Min(a->len, b->len));

    if (c != 0)
        return c;
    return a->len < b->len ? -1 : (a->len > b->len ? 1 : 0);
}

static int bstr_qcmp(const void *a, const void *b)
{
    return bstr_cmp((const bstr *)a, (const bstr *)b);
}

static bool bstr_starts(const bstr *s, const bstr *prefix)
{
    return s->len >= prefix->len && memcmp(s->p, prefix->p, prefix->len) == 0;
}

/* The category of a stream id: up to its first '-' (pawl.category). */
static bstr category_of(const bstr *s)
{
    const char *dash = memchr(s->p, '-', s->len);
    bstr c;

    c.p = s->p;
    c.len = dash != NULL ? (int)(dash - s->p) : s->len;
    return c;
}

/* Sort and drop repeats; returns the new count. */
static int bstr_unique(bstr *v, int n)
{
    int i;
    int j = 0;

    if (n > 1)
        qsort(v, n, sizeof(bstr), bstr_qcmp);
    for (i = 0; i < n; i++)
        if (j == 0 || bstr_cmp(&v[j - 1], &v[i]) != 0)
            v[j++] = v[i];
    return j;
}

static int bstr_find(const bstr *v, int n, const bstr *x)
{
    int l = 0;
    int h = n - 1;

    while (l <= h) {
        int m = l + (h - l) / 2;
        int c = bstr_cmp(&v[m], x);

        if (c == 0)
            return m;
        if (c < 0)
            l = m + 1;
        else
            h = m - 1;
    }
    return -1;
}

static Datum bstr_datum(const bstr *b)
{
    return PointerGetDatum(cstring_to_text_with_len(b->p, b->len));
}

static void int8_overflow(void) pg_attribute_noreturn();

static void int8_overflow(void)
{
    ereport(ERROR, (errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE), errmsg("bigint out of range")));
}

static int cmp_u64(const void *a, const void *b)
{
    uint64 x = *(const uint64 *)a;
    uint64 y = *(const uint64 *)b;

    return x < y ? -1 : (x > y ? 1 : 0);
}

static Datum xid8_datum(uint64 x)
{
    return FullTransactionIdGetDatum(FullTransactionIdFromU64(x));
}

/* ---- the declarations ---------------------------------------------------------------------- */

/* The declaration the caller made: argument types and a result of the read's row. */
static void check_declaration(FunctionCallInfo fcinfo, const char *fn, const Oid *argtypes,
                              int nargs, const char *decl)
{
    ReturnSetInfo *rsi = (ReturnSetInfo *)fcinfo->resultinfo;
    bool ok = PG_NARGS() == nargs && fcinfo->flinfo->fn_retset;
    int i;

    for (i = 0; ok && fcinfo->flinfo->fn_expr != NULL && i < nargs; i++)
        ok = get_fn_expr_argtype(fcinfo->flinfo, i) == argtypes[i];
    if (!ok)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_FUNCTION_DEFINITION),
                 errmsg("%s must be declared as %s RETURNS TABLE (global_index int8, stream_id "
                        "text, stream_seq int8, type text, payload bytea, metadata jsonb, "
                        "appended_at timestamptz, event_id text)",
                        fn, decl)));
    if (rsi != NULL && IsA(rsi, ReturnSetInfo) && rsi->expectedDesc != NULL) {
        ok = rsi->expectedDesc->natts == READ_COLS;
        for (i = 0; ok && i < READ_COLS; i++)
            ok = TupleDescAttr(rsi->expectedDesc, i)->atttypid == res_types[i];
        if (!ok)
            ereport(ERROR, (errcode(ERRCODE_DATATYPE_MISMATCH),
                            errmsg("%s returns (global_index int8, stream_id text, stream_seq "
                                   "int8, type text, payload bytea, metadata jsonb, appended_at "
                                   "timestamptz, event_id text)",
                                   decl)));
    }
}

/* The result row the executor expects, when it says (check_declaration checked it): reading
 * the function's declared result type instead costs a catalog walk per call. */
static TupleDesc expected_desc(FunctionCallInfo fcinfo)
{
    ReturnSetInfo *rsi = (ReturnSetInfo *)fcinfo->resultinfo;

    return rsi != NULL && IsA(rsi, ReturnSetInfo) ? rsi->expectedDesc : NULL;
}

/* ---- indexes ------------------------------------------------------------------------------- */

typedef enum ikind {
    IK_STREAM,    /* a partition's (stream_id, stream_seq) */
    IK_CATEGORY,  /* a partition's (pawl.category(stream_id), xid) */
    IK_SCAN_XMAX, /* pawl.runs (scan_xmax, last_index) */
} ikind;

/* The btree operator family of xid8 (the default one), found once. */
static Oid xid8_family(void)
{
    static Oid fam = InvalidOid;

    if (!OidIsValid(fam)) {
        Oid opc = GetDefaultOpClass(XID8OID, BTREE_AM_OID);

        if (OidIsValid(opc))
            fam = get_opclass_family(opc);
    }
    return fam;
}

static bool collation_is_c(Oid coll)
{
    return coll == C_COLLATION_OID || coll == POSIX_COLLATION_OID;
}

/* e without the relabellings (of collation) around it. */
static Node *unlabel(Node *e)
{
    while (e != NULL && IsA(e, RelabelType))
        e = (Node *)((RelabelType *)e)->arg;
    return e;
}

/* Whether e is stream_id's category: pawl.category(stream_id) as the index holds it, either
 * the call or its body split_part(stream_id, '-', 1) (the relcache inlines the SQL function). */
static bool category_expr(Node *e, AttrNumber a_stream)
{
    FuncExpr *f;
    Node *a;
    Var *v;

    e = unlabel(e);
    if (e == NULL || !IsA(e, FuncExpr))
        return false;
    f = (FuncExpr *)e;
    a = list_length(f->args) >= 1 ? unlabel((Node *)linitial(f->args)) : NULL;
    if (a == NULL || !IsA(a, Var))
        return false;
    v = (Var *)a;
    if (v->varattno != a_stream || v->vartype != TEXTOID)
        return false;
    if (f->funcid == F_SPLIT_PART) {
        Const *d;
        Const *n;

        if (list_length(f->args) != 3 || !IsA(lsecond(f->args), Const) ||
            !IsA(lthird(f->args), Const))
            return false;
        d = (Const *)lsecond(f->args);
        n = (Const *)lthird(f->args);
        if (d->constisnull || n->constisnull || d->consttype != TEXTOID ||
            n->consttype != INT4OID || DatumGetInt32(n->constvalue) != 1)
            return false;
        {
            bstr b = text_bytes(d->constvalue);

            return b.len == 1 && b.p[0] == '-';
        }
    }
    if (list_length(f->args) != 1)
        return false;
    {
        char *nsp = get_namespace_name(get_func_namespace(f->funcid));
        char *name = get_func_name(f->funcid);

        return nsp != NULL && name != NULL && strcmp(nsp, "pawl") == 0 &&
               strcmp(name, "category") == 0;
    }
}

/* rel's column cat_run (int4), or 0 when it has none (a schema before 18). */
static AttrNumber run_column(Relation rel)
{
    return pawln_column_if(rel, "cat_run", INT4OID);
}

/* Whether pred (an index predicate, implicitly ANDed) is exactly cat_run IS DISTINCT FROM 0 on
 * rel: the category index of schema 18, which holds heads of runs and lone rows only. */
static bool runs_predicate(Relation rel, List *pred)
{
    DistinctExpr *d;
    Node *v;
    Node *c;
    AttrNumber a = run_column(rel);

    if (a == InvalidAttrNumber || list_length(pred) != 1 || !IsA(linitial(pred), DistinctExpr))
        return false;
    d = (DistinctExpr *)linitial(pred);
    if (d->opno != Int4EqualOperator || list_length(d->args) != 2)
        return false;
    v = (Node *)linitial(d->args);
    c = (Node *)lsecond(d->args);
    return IsA(v, Var) && ((Var *)v)->varattno == a && ((Var *)v)->vartype == INT4OID &&
           IsA(c, Const) && !((Const *)c)->constisnull && ((Const *)c)->consttype == INT4OID &&
           DatumGetInt32(((Const *)c)->constvalue) == 0;
}

/* Whether irel is rel's index of the kind asked for, on atts (for the category index, atts[0]
 * is stream_id and atts[1] xid): a valid btree, ascending, the key columns and operator
 * families the scans here use, text keys in the "C" order, and no predicate, except the
 * category index's of schema 18 (runs_predicate: its readers then walk the runs). */
static bool index_fits(Relation rel, Relation irel, ikind kind, const AttrNumber *atts)
{
    Form_pg_index ix = irel->rd_index;
    Oid fam1 = kind == IK_SCAN_XMAX ? xid8_family() : TEXT_BTREE_FAM_OID;
    Oid fam2 = kind == IK_STREAM     ? INTEGER_BTREE_FAM_OID
               : kind == IK_CATEGORY ? xid8_family()
                                     : INTEGER_BTREE_FAM_OID;
    List *exprs;

    if (ix->indrelid != RelationGetRelid(rel) || irel->rd_rel->relam != BTREE_AM_OID ||
        !ix->indisvalid || !ix->indisready || ix->indnkeyatts != 2 || irel->rd_indoption[0] != 0 ||
        irel->rd_indoption[1] != 0 || irel->rd_opfamily[0] != fam1 ||
        irel->rd_opfamily[1] != fam2 || !OidIsValid(fam1) || !OidIsValid(fam2))
        return false;
    if (RelationGetIndexPredicate(irel) != NIL &&
        (kind != IK_CATEGORY || !runs_predicate(rel, RelationGetIndexPredicate(irel))))
        return false;
    if (kind != IK_SCAN_XMAX && !collation_is_c(irel->rd_indcollation[0]))
        return false;
    if (kind != IK_CATEGORY)
        return ix->indkey.values[0] == atts[0] && ix->indkey.values[1] == atts[1] &&
               RelationGetIndexExpressions(irel) == NIL &&
               irel->rd_opcintype[0] == (kind == IK_STREAM ? TEXTOID : XID8OID);
    if (ix->indkey.values[0] != 0 || ix->indkey.values[1] != atts[1] ||
        irel->rd_opcintype[0] != TEXTOID || irel->rd_opcintype[1] != XID8OID)
        return false;
    exprs = RelationGetIndexExpressions(irel);
    return list_length(exprs) == 1 && category_expr((Node *)linitial(exprs), atts[0]);
}

/* The indexes found, per relation and kind, so that a call opens the one it needs rather than
 * every index of every partition; dropped for a relation whose relcache entry is invalidated
 * (creating or dropping an index invalidates its table's) and checked again on use. */
#define INDEX_CACHE 64
typedef struct index_hit {
    Oid relid;
    ikind kind;
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

/* rel's index of kind (index_fits), opened; a schema error naming what when there is none. */
static Relation find_index(Relation rel, ikind kind, const AttrNumber *atts, const char *what)
{
    List *oids;
    ListCell *lc;
    int i;

    if (!index_cache_hooked) {
        CacheRegisterRelcacheCallback(index_cache_inval, (Datum)0);
        index_cache_hooked = true;
    }
    for (i = 0; i < index_cached; i++)
        if (index_cache[i].relid == RelationGetRelid(rel) && index_cache[i].kind == kind) {
            Relation irel = index_open(index_cache[i].index, AccessShareLock);

            if (index_fits(rel, irel, kind, atts))
                return irel;
            index_close(irel, AccessShareLock);
            index_cache[i] = index_cache[--index_cached];
            break;
        }
    oids = RelationGetIndexList(rel);
    foreach (lc, oids) {
        Relation irel = index_open(lfirst_oid(lc), AccessShareLock);

        if (index_fits(rel, irel, kind, atts)) {
            if (index_cached == INDEX_CACHE)
                index_cached--; /* the last found makes room */
            index_cache[index_cached].relid = RelationGetRelid(rel);
            index_cache[index_cached].kind = kind;
            index_cache[index_cached++].index = RelationGetRelid(irel);
            return irel;
        }
        index_close(irel, AccessShareLock);
    }
    pawln_schema_error(psprintf("%s has no %s", RelationGetRelationName(rel), what));
}

/* ---- scan keys ----------------------------------------------------------------------------- */

static void key_text(ScanKey k, AttrNumber att, StrategyNumber st, RegProcedure proc, Oid coll,
                     Datum v)
{
    ScanKeyEntryInitialize(k, 0, att, st, InvalidOid, coll, proc, v);
}

/* xid in [lo, hi] on attribute att (two keys). */
static void keys_xid_range(ScanKey k, AttrNumber att, uint64 lo, uint64 hi)
{
    ScanKeyInit(&k[0], att, BTGreaterEqualStrategyNumber, F_XID8GE, xid8_datum(lo));
    ScanKeyInit(&k[1], att, BTLessEqualStrategyNumber, F_XID8LE, xid8_datum(hi));
}

/* ---- the runs ------------------------------------------------------------------------------ */

/* The element at subscript p of a run row's array (array[p] in SQL): NULL (false) for a NULL
 * array, past its bounds, or one of several dimensions. */
static bool rarr_sub(const pawln_rarr *ra, int64 p, int64 *out)
{
    return !ra->multi && pawln_rarr_at(ra, p - ra->lb, out);
}

/* A run row read: its scalar columns, and its arrays when decoded. */
typedef struct run_row {
    int64 last_index;
    int64 first_index;
    uint64 scan_xmax;
    pawln_rarr xids;
    pawln_rarr bases;
    pawln_rarr ns;
} run_row;

typedef struct runs_rel {
    Relation rel;
    Relation pkey;
    AttrNumber a_last;
    AttrNumber a_first;
    AttrNumber a_xmax;
    AttrNumber a_xids;
    AttrNumber a_bases;
    AttrNumber a_ns;
    AttrNumber a_open;
    TupleTableSlot *slot;
} runs_rel;

static void runs_open(runs_rel *rr, bool with_pkey)
{
    rr->rel = pawln_open_table("runs", AccessShareLock, ACL_SELECT);
    rr->a_last = pawln_column_of(rr->rel, "last_index", INT8OID);
    rr->a_first = pawln_column_of(rr->rel, "first_index", INT8OID);
    rr->a_xmax = pawln_column_of(rr->rel, "scan_xmax", XID8OID);
    rr->a_xids = pawln_column_of(rr->rel, "xids", XID8ARRAYOID);
    rr->a_bases = pawln_column_of(rr->rel, "bases", INT8ARRAYOID);
    rr->a_ns = pawln_column_of(rr->rel, "ns", INT4ARRAYOID);
    rr->a_open = pawln_column_of(rr->rel, "open_xids", XID8ARRAYOID);
    rr->pkey = with_pkey ? pawln_open_pkey(rr->rel, &rr->a_last, 1) : NULL;
    rr->slot = table_slot_create(rr->rel, NULL);
}

static void runs_close(runs_rel *rr)
{
    ExecDropSingleTupleTableSlot(rr->slot);
    if (rr->pkey != NULL)
        index_close(rr->pkey, NoLock);
    table_close(rr->rel, NoLock);
}

/* The scalar columns of the run in rr->slot (NOT NULL in the schema: a NULL is corruption). */
static void run_scalars(runs_rel *rr, run_row *r)
{
    bool n1;
    bool n2;
    bool n3;
    Datum last = slot_getattr(rr->slot, rr->a_last, &n1);
    Datum first = slot_getattr(rr->slot, rr->a_first, &n2);
    Datum xmax = slot_getattr(rr->slot, rr->a_xmax, &n3);

    if (n1 || n2 || n3)
        ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
                        errmsg("pawl: a run row has a NULL index or scan_xmax")));
    memset(r, 0, sizeof(*r));
    r->last_index = DatumGetInt64(last);
    r->first_index = DatumGetInt64(first);
    r->scan_xmax = U64FromFullTransactionId(DatumGetFullTransactionId(xmax));
}

/* Its arrays: valid while the slot keeps the row, or with copy, in the current context. */
static void run_arrays(runs_rel *rr, run_row *r, bool copy)
{
    bool isnull;
    Datum d;

    d = slot_getattr(rr->slot, rr->a_xids, &isnull);
    pawln_rarr_init(&r->xids, d, isnull, XID8OID, XID8_LEN, XID8_BYVAL, XID8_ALIGN, "xids", copy);
    d = slot_getattr(rr->slot, rr->a_bases, &isnull);
    pawln_rarr_init(&r->bases, d, isnull, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
                    "bases", copy);
    d = slot_getattr(rr->slot, rr->a_ns, &isnull);
    pawln_rarr_init(&r->ns, d, isnull, INT4OID, sizeof(int32), true, TYPALIGN_INT, "ns", copy);
}

/* What a run says of transaction x at its first position in xids (array_position): false when
 * it does not list x. *has_n: ns[p] is not NULL (the SQL's k < ns[p] is then decidable);
 * *has_base likewise for bases[p]. */
static bool run_lists(const run_row *r, uint64 x, int64 *base, bool *has_base, int32 *n,
                      bool *has_n)
{
    int i;

    if (r->xids.multi)
        ereport(ERROR,
                (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                 errmsg("searching for elements in multidimensional arrays is not supported")));
    for (i = 0; i < r->xids.n; i++) {
        int64 v;
        int64 p;
        int64 nn;

        if (!pawln_rarr_at(&r->xids, i, &v) || (uint64)v != x)
            continue;
        p = (int64)r->xids.lb + i;
        *has_base = rarr_sub(&r->bases, p, base);
        *has_n = rarr_sub(&r->ns, p, &nn);
        *n = *has_n ? (int32)nn : 0;
        return true;
    }
    return false;
}

/* The highest run visible under snap: its last index (false when there is none). */
static bool runs_head(runs_rel *rr, Snapshot snap, int64 *head)
{
    IndexScanDesc scan = index_beginscan(rr->rel, rr->pkey, snap, 0, 0);
    bool found;

    index_rescan(scan, NULL, 0, NULL, 0);
    found = index_getnext_slot(scan, BackwardScanDirection, rr->slot);
    if (found) {
        bool isnull;

        *head = DatumGetInt64(slot_getattr(rr->slot, rr->a_last, &isnull));
        if (isnull)
            found = false;
    }
    index_endscan(scan);
    return found;
}

/* pg_sequence_last_value('pawl.log_start') as the current user: false when it has no value. */
static bool log_start(int64 *w)
{
    Oid seq = get_relname_relid("log_start", get_namespace_oid("pawl", false));
    LOCAL_FCINFO(sfc, 1);
    Datum last;

    if (!OidIsValid(seq))
        ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE),
                        errmsg("relation \"pawl.log_start\" does not exist")));
    InitFunctionCallInfoData(*sfc, NULL, 1, InvalidOid, NULL, NULL);
    sfc->args[0].value = ObjectIdGetDatum(seq);
    sfc->args[0].isnull = false;
    last = pg_sequence_last_value(sfc);
    if (sfc->isnull)
        return false;
    *w = DatumGetInt64(last);
    return true;
}

/* pawl.refuse_below_watermark(after). */
static void refuse_below_watermark(int64 after)
{
    int64 w;

    if (log_start(&w) && after < w - 1)
        pawln_below_watermark(w, after);
}

/* ---- the partitions of pawl.events --------------------------------------------------------- */

typedef struct epart {
    MemoryContext cxt; /* the call's: what is opened lives as long as the call */
    Oid relid;
    uint64 lo; /* xids [lo, hi] */
    uint64 hi;
    Relation rel; /* NULL until opened */
    AttrNumber a_xid;
    AttrNumber a_k;
    AttrNumber att[READ_COLS - 1];
    AttrNumber maxatt; /* the highest of them */
    TupleTableSlot *slot;
    struct IndexFetchTableData *fetch; /* fetches by tid (read_filtered) */
    Relation ix;                       /* the category index, or the stream key */
    AttrNumber a_run;                  /* cat_run when ix holds runs (schema 18), else 0 */
    IndexScanDesc scan;
    ScanKeyData keys[3];
    Relation pk; /* the primary key (xid, k), when used */
    IndexScanDesc pkscan;
    ScanKeyData pkkeys[3];
    /* read_stream's merge: the scan's current row */
    bool have;
    bool done;
    int64 seq;
} epart;

typedef struct eparts {
    Relation events;
    epart *v;
    int n;
    Snapshot snap;
} eparts;

static void parts_init(eparts *ps, Snapshot snap)
{
    part_range *r;
    int i;

    ps->snap = snap;
    ps->events = pawln_open_table("events", AccessShareLock, ACL_SELECT);
    r = pawln_event_partitions(ps->events, pawln_column_of(ps->events, "xid", XID8OID), &ps->n);
    ps->v = palloc0(sizeof(epart) * (ps->n > 0 ? ps->n : 1));
    for (i = 0; i < ps->n; i++) {
        ps->v[i].cxt = CurrentMemoryContext;
        ps->v[i].relid = r[i].relid;
        ps->v[i].lo = r[i].lo;
        ps->v[i].hi = r[i].hi;
    }
}

static void part_open(epart *p)
{
    MemoryContext old = MemoryContextSwitchTo(p->cxt);
    int i;

    p->rel = table_open(p->relid, AccessShareLock);
    p->a_xid = pawln_column_of(p->rel, "xid", XID8OID);
    p->a_k = pawln_column_of(p->rel, "k", INT4OID);
    p->maxatt = Max(p->a_xid, p->a_k);
    for (i = 0; i < READ_COLS - 1; i++) {
        p->att[i] = pawln_column_of(p->rel, ev_cols[i], res_types[i + 1]);
        p->maxatt = Max(p->maxatt, p->att[i]);
    }
    p->slot = table_slot_create(p->rel, NULL);
    MemoryContextSwitchTo(old);
}

static void parts_close(eparts *ps)
{
    int i;

    for (i = 0; i < ps->n; i++) {
        epart *p = &ps->v[i];

        if (p->rel == NULL)
            continue;
        if (p->scan != NULL)
            index_endscan(p->scan);
        if (p->ix != NULL)
            index_close(p->ix, NoLock);
        if (p->pkscan != NULL)
            index_endscan(p->pkscan);
        if (p->pk != NULL)
            index_close(p->pk, NoLock);
        if (p->fetch != NULL)
            table_index_fetch_end(p->fetch);
        ExecDropSingleTupleTableSlot(p->slot);
        table_close(p->rel, NoLock);
        p->rel = NULL;
    }
    table_close(ps->events, NoLock);
}

/* The category index of p, with a scan of three keys (category, xid >=, xid <=) and, with
 * itup, the index tuples read. */
static void part_category(epart *p, Snapshot snap)
{
    AttrNumber atts[2];
    MemoryContext old;

    if (p->rel == NULL)
        part_open(p);
    if (p->ix != NULL)
        return;
    old = MemoryContextSwitchTo(p->cxt);
    atts[0] = p->att[EV_STREAM];
    atts[1] = p->a_xid;
    p->ix = find_index(p->rel, IK_CATEGORY, atts, "index on (pawl.category(stream_id), xid)");
    p->a_run = RelationGetIndexPredicate(p->ix) != NIL ? run_column(p->rel) : InvalidAttrNumber;
    p->scan = index_beginscan(p->rel, p->ix, snap, 3, 0);
    p->scan->xs_want_itup = true;
    MemoryContextSwitchTo(old);
}

/* The primary key (xid, k) of p, with a scan of three keys. */
static void part_pkey(epart *p, Snapshot snap)
{
    AttrNumber cols[2];
    MemoryContext old;

    if (p->rel == NULL)
        part_open(p);
    if (p->pk != NULL)
        return;
    old = MemoryContextSwitchTo(p->cxt);
    cols[0] = p->a_xid;
    cols[1] = p->a_k;
    p->pk = pawln_open_pkey(p->rel, cols, 2);
    if (p->pk->rd_opfamily[0] != xid8_family() || p->pk->rd_opfamily[1] != INTEGER_BTREE_FAM_OID)
        pawln_schema_error(psprintf("the primary key of %s is not on (xid, k) in their btree order",
                                    RelationGetRelationName(p->rel)));
    p->pkscan = index_beginscan(p->rel, p->pk, snap, 3, 0);
    p->pkscan->xs_want_itup = true;
    MemoryContextSwitchTo(old);
}

/* index_rescan and index_getnext_tid of a scan kept for the call, in the call's context: the
 * access method allocates some of its state when first needed, in the current context (btree's
 * buffer for index tuples at a rescan, its list of dead items at a step), and a window's context
 * is reset while the scan lives on. */
static void part_rescan(const epart *p, IndexScanDesc scan, ScanKey keys, int nkeys)
{
    MemoryContext old = MemoryContextSwitchTo(p->cxt);

    index_rescan(scan, keys, nkeys, NULL, 0);
    MemoryContextSwitchTo(old);
}

static bool part_next(const epart *p, IndexScanDesc scan)
{
    MemoryContext old = MemoryContextSwitchTo(p->cxt);
    bool found = index_getnext_tid(scan, ForwardScanDirection) != NULL;

    MemoryContextSwitchTo(old);
    return found;
}

/* The xid and, when there, k of the index tuple the scan is on. */
static uint64 itup_xid(IndexScanDesc scan, int att, Relation rel)
{
    bool isnull;
    Datum d;

    if (scan->xs_itup == NULL)
        pawln_schema_error(
            psprintf("an index of %s returns no index tuples", RelationGetRelationName(rel)));
    d = index_getattr(scan->xs_itup, att, scan->xs_itupdesc, &isnull);
    if (isnull)
        ereport(ERROR,
                (errcode(ERRCODE_DATA_CORRUPTED),
                 errmsg("pawl: a NULL xid in an index of %s", RelationGetRelationName(rel))));
    return U64FromFullTransactionId(DatumGetFullTransactionId(d));
}

static int32 itup_k(IndexScanDesc scan, Relation rel)
{
    bool isnull;
    Datum d = index_getattr(scan->xs_itup, 2, scan->xs_itupdesc, &isnull);

    if (isnull)
        ereport(ERROR,
                (errcode(ERRCODE_DATA_CORRUPTED),
                 errmsg("pawl: a NULL k in the primary key of %s", RelationGetRelationName(rel))));
    return DatumGetInt32(d);
}

/* Put the event in p->slot into the result with final index idx. */
static void emit_slot(Tuplestorestate *ts, TupleDesc td, epart *p, bool idx_null, int64 idx)
{
    Datum values[READ_COLS];
    bool nulls[READ_COLS];
    int i;

    /* One deforming pass up to the last column read (not one per column). */
    slot_getsomeattrs(p->slot, p->maxatt);
    values[0] = Int64GetDatum(idx);
    nulls[0] = idx_null;
    for (i = 1; i < READ_COLS; i++) {
        values[i] = p->slot->tts_values[p->att[i - 1] - 1];
        nulls[i] = p->slot->tts_isnull[p->att[i - 1] - 1];
    }
    tuplestore_putvalues(ts, td, values, nulls);
}

/* ======================================================================================== */
/* pawl_api.read_stream(stream text, after_seq int8, max_events int4)                         */
/* ======================================================================================== */

/* The runs read by one stream read (kept for the call: a stream's events share runs). */
#define STREAM_RUN_CACHE 8

typedef struct stream_runs {
    runs_rel rr;
    Relation xidx; /* runs_scan_xmax_idx */
    IndexScanDesc scan;
    Snapshot snap;
    run_row cache[STREAM_RUN_CACHE];
    int ncache;
    int next; /* the slot the next run read takes */
    /* the last transaction looked up */
    bool have_last;
    uint64 last_x;
    bool last_found;
    int64 last_base;
    bool last_base_ok;
    int32 last_n;
    uint64 snap_xmin; /* the snapshot's xmin as a full xid, once needed (0: not yet) */
} stream_runs;

/* The run row in rr.slot, its arrays decoded (from the call's cache when read before). */
static const run_row *stream_run(stream_runs *sr)
{
    run_row r;
    int i;

    run_scalars(&sr->rr, &r);
    for (i = 0; i < sr->ncache; i++)
        if (sr->cache[i].last_index == r.last_index)
            return &sr->cache[i];
    run_arrays(&sr->rr, &r, true); /* kept for the call, after the slot has moved on */
    i = sr->next;
    sr->next = (sr->next + 1) % STREAM_RUN_CACHE;
    if (sr->ncache < STREAM_RUN_CACHE)
        sr->ncache++;
    sr->cache[i] = r;
    return &sr->cache[i];
}

/*
 * The final indexes this backend has found, per transaction: final indexes never change, and a
 * stream is read again and again. An entry comes from a run row inserted by a transaction that
 * had committed (the row was visible and not the caller's own); it is used under a snapshot
 * whose xmin is above that transaction (so the row is visible to it too). Direct-mapped by xid;
 * dropped whole on an invalidation of pawl.runs (a TRUNCATE or DROP: runs are never updated or
 * deleted, runs_guard refuses it).
 */
#define XCACHE_SIZE 4096
typedef struct xcache_ent {
    uint64 xid;
    uint64 made; /* the run row's inserting transaction (full xid; 0: frozen) */
    int64 base;
    int32 n;
    bool used;
    bool has_base;
} xcache_ent;
static xcache_ent *xcache = NULL;
static Oid xcache_rel = InvalidOid;

static void xcache_inval(Datum arg, Oid relid)
{
    if (xcache != NULL && (!OidIsValid(relid) || relid == xcache_rel))
        memset(xcache, 0, sizeof(xcache_ent) * XCACHE_SIZE);
}

static inline xcache_ent *xcache_slot(uint64 x)
{
    return &xcache[(x * UINT64CONST(0x9E3779B97F4A7C15)) >> 52];
}

/* A 32-bit xid no newer than next_fxid, as a full xid (xid8funcs.c's widen_snapshot_xid). */
static uint64 widen_xid(TransactionId xid, FullTransactionId next_fxid)
{
    TransactionId next_xid = XidFromFullTransactionId(next_fxid);
    uint32 epoch = EpochFromFullTransactionId(next_fxid);

    if (!TransactionIdIsNormal(xid))
        return 0;
    if (xid > next_xid)
        epoch--;
    return U64FromFullTransactionId(FullTransactionIdFromEpochAndXid(epoch, xid));
}

/* Keep what the run in sr->rr.slot says of x, if its row is another transaction's. */
static void xcache_put(stream_runs *sr, uint64 x)
{
    bool isnull;
    TransactionId xmin;
    xcache_ent *e;

    if (xcache == NULL) {
        xcache = MemoryContextAllocZero(TopMemoryContext, sizeof(xcache_ent) * XCACHE_SIZE);
        CacheRegisterRelcacheCallback(xcache_inval, (Datum)0);
    }
    if (xcache_rel != RelationGetRelid(sr->rr.rel)) {
        memset(xcache, 0, sizeof(xcache_ent) * XCACHE_SIZE);
        xcache_rel = RelationGetRelid(sr->rr.rel);
    }
    xmin = DatumGetTransactionId(
        slot_getsysattr(sr->rr.slot, MinTransactionIdAttributeNumber, &isnull));
    if (isnull || TransactionIdIsCurrentTransactionId(xmin))
        return;
    e = xcache_slot(x);
    e->used = true;
    e->xid = x;
    e->made = widen_xid(xmin, ReadNextFullTransactionId());
    e->base = sr->last_base;
    e->has_base = sr->last_base_ok;
    e->n = sr->last_n;
}

/* Whether the cache answers for (x, k) under sr->snap. */
static bool xcache_get(stream_runs *sr, uint64 x, int32 k)
{
    xcache_ent *e;

    if (xcache == NULL || xcache_rel != RelationGetRelid(sr->rr.rel))
        return false;
    e = xcache_slot(x);
    if (!e->used || e->xid != x || k >= e->n)
        return false;
    if (sr->snap_xmin == 0)
        sr->snap_xmin = widen_xid(sr->snap->xmin, ReadNextFullTransactionId());
    if (e->made >= sr->snap_xmin)
        return false;
    sr->have_last = true;
    sr->last_x = x;
    sr->last_found = true;
    sr->last_base = e->base;
    sr->last_base_ok = e->has_base;
    sr->last_n = e->n;
    return true;
}

/*
 * The final index of event (x, k): the first run by (scan_xmax, last_index) with scan_xmax > x
 * that lists x with k < ns[p] (the SQL's lateral look-up), through runs_scan_xmax_idx. False
 * when none does (not finalized under this snapshot). *idx_null: bases[p] is NULL.
 */
static bool stream_index(stream_runs *sr, uint64 x, int32 k, int64 *idx, bool *idx_null)
{
    ScanKeyData key;
    bool found = false;

    if (sr->have_last && sr->last_x == x && (!sr->last_found || k < sr->last_n)) {
        found = sr->last_found;
    } else if (xcache_get(sr, x, k)) {
        found = true;
    } else {
        if (sr->scan == NULL) {
            AttrNumber atts[2];

            atts[0] = sr->rr.a_xmax;
            atts[1] = sr->rr.a_last;
            sr->xidx =
                find_index(sr->rr.rel, IK_SCAN_XMAX, atts, "index on (scan_xmax, last_index)");
            sr->scan = index_beginscan(sr->rr.rel, sr->xidx, sr->snap, 1, 0);
        }
        ScanKeyInit(&key, 1, BTGreaterStrategyNumber, F_XID8GT, xid8_datum(x));
        index_rescan(sr->scan, &key, 1, NULL, 0);
        while (index_getnext_slot(sr->scan, ForwardScanDirection, sr->rr.slot)) {
            const run_row *r;
            int64 base = 0;
            bool has_base = false;
            int32 n = 0;
            bool has_n = false;

            CHECK_FOR_INTERRUPTS();
            r = stream_run(sr);
            if (!run_lists(r, x, &base, &has_base, &n, &has_n) || !has_n || k >= n)
                continue;
            found = true;
            sr->last_base = base;
            sr->last_base_ok = has_base;
            sr->last_n = n;
            xcache_put(sr, x);
            break;
        }
        sr->have_last = true;
        sr->last_x = x;
        sr->last_found = found;
    }
    if (!found)
        return false;
    *idx_null = !sr->last_base_ok;
    if (sr->last_base_ok && pg_add_s64_overflow(sr->last_base, k, idx))
        int8_overflow();
    return true;
}

/* The next visible row of p's scan (stream_id = s, stream_seq > after), in sequence order. */
static void stream_part_next(epart *p)
{
    bool isnull;

    p->have = false;
    if (p->done)
        return;
    if (!index_getnext_slot(p->scan, ForwardScanDirection, p->slot)) {
        p->done = true;
        return;
    }
    p->seq = DatumGetInt64(slot_getattr(p->slot, p->att[EV_SEQ], &isnull));
    if (isnull)
        ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
                        errmsg("pawl: a NULL stream_seq in %s", RelationGetRelationName(p->rel))));
    p->have = true;
}

static void stream_floor_check(const bstr *s, Datum sd, int64 after)
{
    Relation floors = pawln_open_table("stream_floors", AccessShareLock, ACL_SELECT);
    AttrNumber a_stream = pawln_column_of(floors, "stream_id", TEXTOID);
    AttrNumber a_last = pawln_column_of(floors, "last_seq", INT8OID);
    Relation pk = pawln_open_pkey(floors, &a_stream, 1);
    TupleTableSlot *slot;
    IndexScanDesc scan;
    ScanKeyData key;
    bool found;
    bool isnull = true;
    int64 fl = 0;

    if (pk->rd_index->indnkeyatts != 1 || !collation_is_c(pk->rd_indcollation[0]) ||
        pk->rd_opfamily[0] != TEXT_BTREE_FAM_OID)
        pawln_schema_error("the primary key of stream_floors is not on stream_id in \"C\" order");
    slot = table_slot_create(floors, NULL);
    scan = index_beginscan(floors, pk, GetActiveSnapshot(), 1, 0);
    key_text(&key, 1, BTEqualStrategyNumber, F_TEXTEQ, pk->rd_indcollation[0], sd);
    index_rescan(scan, &key, 1, NULL, 0);
    found = index_getnext_slot(scan, ForwardScanDirection, slot);
    if (found)
        fl = DatumGetInt64(slot_getattr(slot, a_last, &isnull));
    index_endscan(scan);
    ExecDropSingleTupleTableSlot(slot);
    index_close(pk, NoLock);
    table_close(floors, NoLock);
    if (found && !isnull && after < fl) {
        int64 first;

        if (pg_add_s64_overflow(fl, 1, &first))
            int8_overflow();
        ereport(ERROR,
                (errcode(ERRCODE_PAWL_BELOW_WATERMARK),
                 errmsg("pawl: stream \"%s\" starts at sequence number " INT64_FORMAT
                        " (retention dropped the events below it); cannot read after " INT64_FORMAT,
                        pnstrdup(s->p, s->len), first, after),
                 errdetail("stream_floor=" INT64_FORMAT " after_seq=" INT64_FORMAT, fl, after),
                 errhint("read the stream after " INT64_FORMAT ", or reload the archive", fl)));
    }
}

Datum pawl_read_stream(PG_FUNCTION_ARGS)
{
    static const Oid argtypes[3] = {TEXTOID, INT8OID, INT4OID};
    ReturnSetInfo *rsi;
    Datum sd;
    bstr s;
    int64 after;
    int32 max_events;
    Snapshot snap;
    eparts ps;
    stream_runs sr;
    int got = 0;
    int i;

    check_declaration(fcinfo, "pawl_read_stream", argtypes, 3,
                      "pawl_api.read_stream(text, int8, int4)");
    if (!PG_ARGISNULL(0)) {
        sd = PointerGetDatum(PG_GETARG_TEXT_PP(0));
        s = text_bytes(sd);
    } else {
        sd = (Datum)0;
        s.p = NULL;
        s.len = 0;
    }
    if (PG_ARGISNULL(0) || s.len == 0)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("pawl_api.read_stream: stream_id must not be NULL or empty")));
    if (PG_ARGISNULL(1) || PG_GETARG_INT64(1) < 0)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("pawl_api.read_stream: after_seq must be >= 0")));
    if (PG_ARGISNULL(2) || PG_GETARG_INT32(2) < 1 || PG_GETARG_INT32(2) > MAX_EVENTS)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("pawl_api.read_stream: max_events must be in 1..100000")));
    after = PG_GETARG_INT64(1);
    max_events = PG_GETARG_INT32(2);
    stream_floor_check(&s, sd, after);

    snap = GetActiveSnapshot();
    rsi = (ReturnSetInfo *)fcinfo->resultinfo;
    memset(&sr, 0, sizeof(sr));
    sr.snap = snap;
    runs_open(&sr.rr, false);
    parts_init(&ps, snap);
    pawln_rows_begin(fcinfo, expected_desc(fcinfo));

    /* Each partition's rows of the stream after after_seq, merged in sequence order. */
    for (i = 0; i < ps.n; i++) {
        epart *p = &ps.v[i];
        AttrNumber atts[2];

        if (p->lo > p->hi)
            continue; /* an empty range holds nothing */
        part_open(p);
        atts[0] = p->att[EV_STREAM];
        atts[1] = p->att[EV_SEQ];
        p->ix = find_index(p->rel, IK_STREAM, atts, "index on (stream_id, stream_seq)");
        /* stream_seq > 0 holds for every row (events_seq_check): that key only when it
         * selects, since the scan checks each key of each tuple it reads. */
        p->scan = index_beginscan(p->rel, p->ix, snap, after > 0 ? 2 : 1, 0);
        key_text(&p->keys[0], 1, BTEqualStrategyNumber, F_TEXTEQ, p->ix->rd_indcollation[0], sd);
        ScanKeyInit(&p->keys[1], 2, BTGreaterStrategyNumber, F_INT8GT, Int64GetDatum(after));
        index_rescan(p->scan, p->keys, after > 0 ? 2 : 1, NULL, 0);
        stream_part_next(p);
    }
    while (got < max_events) {
        epart *best = NULL;
        uint64 x;
        int32 k;
        int64 idx = 0;
        bool idx_null = false;

        CHECK_FOR_INTERRUPTS();
        for (i = 0; i < ps.n; i++)
            if (ps.v[i].have && (best == NULL || ps.v[i].seq < best->seq))
                best = &ps.v[i];
        if (best == NULL)
            break;
        slot_getsomeattrs(best->slot, best->maxatt);
        x = U64FromFullTransactionId(
            DatumGetFullTransactionId(best->slot->tts_values[best->a_xid - 1]));
        k = DatumGetInt32(best->slot->tts_values[best->a_k - 1]);
        /* The stream's finalized events are a prefix of it: the first without a run ends it. */
        if (!stream_index(&sr, x, k, &idx, &idx_null))
            break;
        emit_slot(rsi->setResult, rsi->setDesc, best, idx_null, idx);
        got++;
        stream_part_next(best);
    }
    parts_close(&ps);
    if (sr.scan != NULL) {
        index_endscan(sr.scan);
        index_close(sr.xidx, NoLock);
    }
    runs_close(&sr.rr);
    if (got > 0)
        pawln_runs_durable(snap); /* what it returns leaves the server durable */
    return (Datum)0;
}

/* ======================================================================================== */
/* pawl_api.read_filtered(after_index, max_events, categories, stream_prefixes, types)        */
/* ======================================================================================== */

#define FN_FILTERED "pawl_api.read_filtered"

/* A text[] argument as pawl.filter_check sees it: NULL (also for an empty array) or its
 * elements, checked. */
static bstr *filter_arg(FunctionCallInfo fcinfo, int argno, const char *what, bool categories,
                        int *n)
{
    ArrayType *a;
    Datum *elems;
    bool *nulls;
    bstr *v;
    int cnt;
    int i;

    *n = 0;
    if (PG_ARGISNULL(argno))
        return NULL;
    a = PG_GETARG_ARRAYTYPE_P(argno);
    if (ARR_ELEMTYPE(a) != TEXTOID)
        ereport(ERROR, (errcode(ERRCODE_DATATYPE_MISMATCH),
                        errmsg("%s: %s must be a text array", FN_FILTERED, what)));
    cnt = ArrayGetNItems(ARR_NDIM(a), ARR_DIMS(a));
    if (cnt == 0)
        return NULL; /* an empty list is a list not given */
    if (ARR_NDIM(a) > 1 || cnt > FILTER_MAX_ELEMS)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s: %s must be a one-dimensional array of at most 1000 elements",
                               FN_FILTERED, what)));
    deconstruct_array(a, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &cnt);
    v = palloc(sizeof(bstr) * cnt);
    for (i = 0; i < cnt; i++) {
        if (nulls[i])
            break;
        v[i] = text_bytes(elems[i]);
        if (v[i].len == 0)
            break;
    }
    if (i < cnt)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("%s: %s may not contain NULL or empty strings", FN_FILTERED, what)));
    if (categories)
        for (i = 0; i < cnt; i++)
            if (memchr(v[i].p, '-', v[i].len) != NULL)
                ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                                errmsg("%s: category \"%s\" contains '-' (a category is a stream "
                                       "id up to its first '-'; use stream_prefixes for longer "
                                       "prefixes)",
                                       FN_FILTERED, pnstrdup(v[i].p, v[i].len))));
    *n = cnt;
    return v;
}

/* A category to range-scan, and what its events must still pass. */
typedef struct fcat {
    bstr name;
    Datum datum; /* name as text */
    bool all;    /* every event of the category passes (named, or under a short prefix) */
    bstr *longs; /* else: the prefixes (with '-') of this category one of which must match */
    int nlongs;
} fcat;

/* The filter of one call. */
typedef struct filter {
    bool by_category; /* cats is not NULL in the SQL */
    fcat *cats;       /* sorted by name */
    int ncats;
    bstr *types; /* sorted, or NULL: any type */
    int ntypes;
} filter;

/* The categories of visible-or-not index entries beginning with prefix v (no '-' in it), from
 * every partition's category index: a superset of the SQL's (visible rows only), which changes
 * nothing but the work (a category without visible rows yields no candidates). */
static void discover(eparts *ps, const bstr *v, bstr **out, int *nout, int *cap)
{
    int i;

    for (i = 0; i < ps->n; i++) {
        epart *p = &ps->v[i];
        IndexScanDesc scan;
        ScanKeyData key;
        Datum from = bstr_datum(v);
        StrategyNumber st = BTGreaterEqualStrategyNumber;
        RegProcedure proc = F_TEXT_GE;

        if (p->lo > p->hi)
            continue;
        part_category(p, ps->snap);
        scan = index_beginscan(p->rel, p->ix, ps->snap, 1, 0);
        scan->xs_want_itup = true;
        for (;;) {
            bool isnull;
            Datum d;
            bstr c;

            CHECK_FOR_INTERRUPTS();
            key_text(&key, 1, st, proc, p->ix->rd_indcollation[0], from);
            index_rescan(scan, &key, 1, NULL, 0);
            if (index_getnext_tid(scan, ForwardScanDirection) == NULL)
                break;
            if (scan->xs_itup == NULL)
                pawln_schema_error("the category index returns no index tuples");
            d = index_getattr(scan->xs_itup, 1, scan->xs_itupdesc, &isnull);
            if (isnull)
                break;
            c = text_bytes(d);
            if (!bstr_starts(&c, v))
                break;
            c.p = pnstrdup(c.p, c.len);
            if (*nout == *cap) {
                *cap *= 2;
                *out = repalloc_huge(*out, sizeof(bstr) * *cap);
            }
            (*out)[(*nout)++] = c;
            from = bstr_datum(&c);
            st = BTGreaterStrategyNumber;
            proc = F_TEXT_GT;
        }
        index_endscan(scan);
    }
}

/* What to range-scan (the SQL's cats) and what each category's events must pass. */
static void filter_build(filter *f, eparts *ps, const bstr *cats_in, int ncats_in,
                         const bstr *pre_in, int npre_in)
{
    bstr *names;
    int n = 0;
    int cap = 16 + ncats_in + npre_in;
    bstr *pre;
    int npre = npre_in;
    int i;
    int j;

    f->by_category = cats_in != NULL || pre_in != NULL;
    f->cats = NULL;
    f->ncats = 0;
    if (!f->by_category)
        return;
    names = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(bstr) * cap);
    for (i = 0; i < ncats_in; i++)
        names[n++] = cats_in[i];
    pre = palloc(sizeof(bstr) * (npre > 0 ? npre : 1));
    memcpy(pre, pre_in, sizeof(bstr) * npre);
    npre = bstr_unique(pre, npre);
    for (i = 0; i < npre; i++) {
        if (memchr(pre[i].p, '-', pre[i].len) == NULL) {
            discover(ps, &pre[i], &names, &n, &cap);
            continue;
        }
        if (n == cap) {
            cap *= 2;
            names = repalloc_huge(names, sizeof(bstr) * cap);
        }
        names[n++] = category_of(&pre[i]);
    }
    n = bstr_unique(names, n);
    f->cats = palloc0(sizeof(fcat) * (n > 0 ? n : 1));
    f->ncats = n;
    for (i = 0; i < n; i++) {
        fcat *c = &f->cats[i];

        c->name = names[i];
        c->datum = bstr_datum(&names[i]);
        for (j = 0; j < ncats_in && !c->all; j++)
            c->all = bstr_cmp(&cats_in[j], &c->name) == 0;
        for (j = 0; j < npre && !c->all; j++) {
            bool is_long = memchr(pre[j].p, '-', pre[j].len) != NULL;

            if (!is_long)
                c->all = bstr_starts(&c->name, &pre[j]);
            else {
                bstr pc = category_of(&pre[j]);

                if (bstr_cmp(&pc, &c->name) == 0) {
                    if (c->longs == NULL)
                        c->longs = palloc(sizeof(bstr) * npre);
                    c->longs[c->nlongs++] = pre[j];
                }
            }
        }
    }
}

/* Whether a row of category c (an index into f->cats, or -1: find it from the stream id)
 * passes the category and prefix part of the filter. */
static bool pass_category(const filter *f, int c, const bstr *stream)
{
    const fcat *fc;
    int i;

    if (!f->by_category)
        return true;
    if (c < 0) {
        /* Its category must be one scanned: named, a long prefix's, or under a short one. */
        bstr cat = category_of(stream);
        int l = 0;
        int h = f->ncats - 1;

        while (l <= h && c < 0) {
            int m = l + (h - l) / 2;
            int r = bstr_cmp(&f->cats[m].name, &cat);

            if (r == 0)
                c = m;
            else if (r < 0)
                l = m + 1;
            else
                h = m - 1;
        }
        if (c < 0)
            return false;
    }
    fc = &f->cats[c];
    if (fc->all)
        return true;
    for (i = 0; i < fc->nlongs; i++)
        if (bstr_starts(stream, &fc->longs[i]))
            return true;
    return false;
}

static bool pass_type(const filter *f, const bstr *type)
{
    return f->types == NULL || bstr_find(f->types, f->ntypes, type) >= 0;
}

/* ---- one window ---------------------------------------------------------------------------- */

/*
 * Working memory this backend keeps across windows and calls. A window's candidates, the hash of
 * their transactions and its matches are arrays that grow to the largest window seen (each kept
 * up to SCRATCH_KEEP bytes; a larger one is given back after the call), and the window's other
 * allocations (the rows kept, the runs decoded) go to a context whose first megabyte stays.
 * Memory given back to malloc at every window was a quarter of a filtered read's server time
 * (the heap trimmed and faulted in again, large blocks unmapped with a TLB shootdown each).
 */
#define SCRATCH_KEEP (8 * 1024 * 1024)
#define WINDOW_KEEP (1024 * 1024)

typedef struct scratch {
    void *p;
    Size size;
} scratch;

static scratch sc_cand;
static scratch sc_hash;
static scratch sc_match;
static MemoryContext window_cxt = NULL;

/* s with room for need bytes; with keep, what it held stays. */
static void *scratch_get(scratch *s, Size need, bool keep)
{
    Size size;

    if (s->size >= need)
        return s->p;
    size = Max(need, 2 * s->size);
    if (s->p != NULL && keep)
        s->p = repalloc_huge(s->p, size);
    else {
        if (s->p != NULL)
            pfree(s->p);
        s->p = NULL;
        s->size = 0;
        s->p = MemoryContextAllocHuge(TopMemoryContext, size);
    }
    s->size = size;
    return s->p;
}

static void scratch_trim(scratch *s)
{
    if (s->size > SCRATCH_KEEP) {
        pfree(s->p);
        s->p = NULL;
        s->size = 0;
    }
}

/* The windows' context, empty (its first block kept). */
static MemoryContext window_memory(void)
{
    if (window_cxt == NULL)
        window_cxt = AllocSetContextCreate(TopMemoryContext, "pawl_api.read_filtered window",
                                           WINDOW_KEEP, WINDOW_KEEP, ALLOCSET_DEFAULT_MAXSIZE);
    else
        MemoryContextReset(window_cxt);
    return window_cxt;
}

/* A candidate of a category-filtered window: an index entry of a category whose xid is in
 * [xlo, xhi), to be fetched once its transaction's run is known. */
typedef struct cand {
    uint64 xid;
    ItemPointerData tid;
    int16 part;
    int32 cat;
} cand;

/* What a window's runs say of a candidate transaction. */
typedef struct xmap {
    uint64 xid;
    bool used;
    bool seen; /* in the run seen_li (its first position counts) */
    int64 seen_li;
    bool found;
    bool has_base;
    int32 n;
    int64 base;
    uint64 sx; /* the listing run's (scan_xmax, last_index): the first one wins */
    int64 li;
} xmap;

typedef struct xhash {
    xmap *v;
    uint64 mask;
    int64 count;
} xhash;

static inline uint64 xhash_slot(uint64 x, uint64 mask)
{
    return (x * UINT64CONST(0x9E3779B97F4A7C15)) >> 17 & mask;
}

static void xhash_init(xhash *h, int64 n)
{
    uint64 cap = 16;

    while (cap < (uint64)n * 2)
        cap <<= 1;
    h->v = scratch_get(&sc_hash, sizeof(xmap) * cap, false);
    memset(h->v, 0, sizeof(xmap) * cap);
    h->mask = cap - 1;
    h->count = 0;
}

static xmap *xhash_get(const xhash *h, uint64 x)
{
    uint64 i = xhash_slot(x, h->mask);

    for (;;) {
        xmap *e = &h->v[i];

        if (!e->used)
            return NULL;
        if (e->xid == x)
            return e;
        i = (i + 1) & h->mask;
    }
}

/* Add x (the table was sized for every key added). */
static void xhash_add(xhash *h, uint64 x)
{
    uint64 i = xhash_slot(x, h->mask);

    for (;;) {
        xmap *e = &h->v[i];

        if (!e->used) {
            e->used = true;
            e->xid = x;
            h->count++;
            return;
        }
        if (e->xid == x)
            return;
        i = (i + 1) & h->mask;
    }
}

/* A match kept for the result: its index and the row (a copy). */
typedef struct match {
    int64 idx;
    HeapTuple tup;
    int16 part;
} match;

/* The window's best need matches by index: all of them while fewer, then a max-heap. */
typedef struct topn {
    MemoryContext cxt; /* the window's: the matches and their rows */
    match *v;
    int n;
    int need;
} topn;

static void topn_sift(topn *t, int i)
{
    for (;;) {
        int l = 2 * i + 1;
        int r = l + 1;
        int m = i;
        match tmp;

        if (l < t->n && t->v[l].idx > t->v[m].idx)
            m = l;
        if (r < t->n && t->v[r].idx > t->v[m].idx)
            m = r;
        if (m == i)
            return;
        tmp = t->v[i];
        t->v[i] = t->v[m];
        t->v[m] = tmp;
        i = m;
    }
}

/* Whether a match at idx would be kept (checked before the row is copied). */
static bool topn_wants(const topn *t, int64 idx)
{
    return t->n < t->need || idx < t->v[0].idx;
}

static void topn_add(topn *t, int64 idx, TupleTableSlot *slot, int16 part)
{
    MemoryContext old = MemoryContextSwitchTo(t->cxt);
    int i;

    if (t->n < t->need) {
        if (t->v == NULL || (t->n >= 1024 && (t->n & (t->n - 1)) == 0))
            t->v = scratch_get(&sc_match, sizeof(match) * Min(t->need, Max(1024, 2 * t->n)), true);
        t->v[t->n].idx = idx;
        t->v[t->n].tup = ExecCopySlotHeapTuple(slot);
        t->v[t->n].part = part;
        t->n++;
        if (t->n == t->need) /* from now on a max-heap by index */
            for (i = t->n / 2 - 1; i >= 0; i--)
                topn_sift(t, i);
    } else {
        heap_freetuple(t->v[0].tup);
        t->v[0].idx = idx;
        t->v[0].tup = ExecCopySlotHeapTuple(slot);
        t->v[0].part = part;
        topn_sift(t, 0);
    }
    MemoryContextSwitchTo(old);
}

static int cmp_match(const void *a, const void *b)
{
    const match *x = (const match *)a;
    const match *y = (const match *)b;

    return x->idx < y->idx ? -1 : (x->idx > y->idx ? 1 : 0);
}

/* The state of one call. */
typedef struct fcall {
    Snapshot snap;
    runs_rel rr;
    eparts ps;
    filter f;
    int64 lo; /* everything matching up to here was returned */
    int64 head;
    int32 max_events;
    int32 got;
    Tuplestorestate *ts;
    TupleDesc td;
    MemoryContext wcxt; /* one window's memory */
} fcall;

/* A window: its runs (lo, wend], horizon [xlo, xhi), late xids (P's open xids). */
typedef struct window {
    int64 wend;
    uint64 xlo;
    uint64 xhi;
    uint64 *late;
    int nlate;
} window;

/* The window after fr->lo for span: rf, (wend, xhi) and P, as the SQL's three look-ups. */
static void window_bounds(fcall *fr, int64 span, window *w)
{
    IndexScanDesc scan = index_beginscan(fr->rr.rel, fr->rr.pkey, fr->snap, 1, 0);
    ScanKeyData key;
    run_row rf;
    run_row r;
    int64 target;
    bool found;

    /* rf: the first run with last_index > lo; (wend, xhi): the first with last_index >=
     * least(lo + span, head) (both exist: lo < head). */
    if (pg_add_s64_overflow(fr->lo, span, &target))
        int8_overflow();
    target = Min(target, fr->head);
    ScanKeyInit(&key, 1, BTGreaterStrategyNumber, F_INT8GT, Int64GetDatum(fr->lo));
    index_rescan(scan, &key, 1, NULL, 0);
    if (!index_getnext_slot(scan, ForwardScanDirection, fr->rr.slot))
        ereport(ERROR,
                (errcode(ERRCODE_DATA_CORRUPTED),
                 errmsg("pawl: no run after index " INT64_FORMAT " below the head " INT64_FORMAT,
                        fr->lo, fr->head)));
    run_scalars(&fr->rr, &rf);
    r = rf;
    while (r.last_index < target) {
        CHECK_FOR_INTERRUPTS();
        if (!index_getnext_slot(scan, ForwardScanDirection, fr->rr.slot))
            ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
                            errmsg("pawl: no run reaches index " INT64_FORMAT, target)));
        run_scalars(&fr->rr, &r);
    }
    w->wend = r.last_index;
    w->xhi = r.scan_xmax;

    /* P: the last run with last_index < rf.first_index and scan_xmax < rf.scan_xmax. */
    ScanKeyInit(&key, 1, BTLessStrategyNumber, F_INT8LT, Int64GetDatum(rf.first_index));
    index_rescan(scan, &key, 1, NULL, 0);
    found = false;
    while (index_getnext_slot(scan, BackwardScanDirection, fr->rr.slot)) {
        CHECK_FOR_INTERRUPTS();
        run_scalars(&fr->rr, &r);
        if (r.scan_xmax < rf.scan_xmax) {
            found = true;
            break;
        }
    }
    w->late = NULL;
    w->nlate = 0;
    if (!found)
        w->xlo = 0;
    else {
        bool isnull;
        Datum d = slot_getattr(fr->rr.slot, fr->rr.a_open, &isnull);

        w->xlo = r.scan_xmax;
        if (!isnull) {
            ArrayType *a = DatumGetArrayTypeP(d);
            Datum *elems;
            bool *nulls;
            int n;
            int i;

            if (ARR_ELEMTYPE(a) != XID8OID)
                pawln_schema_error("runs.open_xids is not an xid8 array");
            deconstruct_array(a, XID8OID, XID8_LEN, XID8_BYVAL, XID8_ALIGN, &elems, &nulls, &n);
            w->late = palloc(sizeof(uint64) * (n > 0 ? n : 1));
            for (i = 0; i < n; i++) {
                uint64 x;

                if (nulls[i])
                    continue;
                x = U64FromFullTransactionId(DatumGetFullTransactionId(elems[i]));
                if (x < w->xlo) /* e.xid = ANY (late) AND e.xid < xlo */
                    w->late[w->nlate++] = x;
            }
            if (w->nlate > 1) {
                int j = 0;

                qsort(w->late, w->nlate, sizeof(uint64), cmp_u64);
                for (i = 0; i < w->nlate; i++)
                    if (j == 0 || w->late[j - 1] != w->late[i])
                        w->late[j++] = w->late[i];
                w->nlate = j;
            }
        }
    }
    index_endscan(scan);
}

/* Whether x is a candidate transaction of the window: in [xlo, xhi), or late below xlo. */
static bool window_xid(const window *w, uint64 x)
{
    if (x >= w->xlo)
        return x < w->xhi;
    return w->nlate > 0 && bsearch(&x, w->late, w->nlate, sizeof(uint64), cmp_u64) != NULL;
}

/* The window's runs, (lo, wend], in index order; each decoded, then handed to fn. */
typedef void (*run_fn)(fcall *fr, const window *w, const run_row *r, void *arg);

static void window_runs(fcall *fr, const window *w, run_fn fn, void *arg)
{
    IndexScanDesc scan = index_beginscan(fr->rr.rel, fr->rr.pkey, fr->snap, 2, 0);
    ScanKeyData keys[2];
    MemoryContext rcxt = AllocSetContextCreate(CurrentMemoryContext, "pawl_api.read_filtered run",
                                               ALLOCSET_DEFAULT_SIZES);

    ScanKeyInit(&keys[0], 1, BTGreaterStrategyNumber, F_INT8GT, Int64GetDatum(fr->lo));
    ScanKeyInit(&keys[1], 1, BTLessEqualStrategyNumber, F_INT8LE, Int64GetDatum(w->wend));
    index_rescan(scan, keys, 2, NULL, 0);
    while (index_getnext_slot(scan, ForwardScanDirection, fr->rr.slot)) {
        MemoryContext old;
        run_row r;

        CHECK_FOR_INTERRUPTS();
        old = MemoryContextSwitchTo(rcxt);
        run_scalars(&fr->rr, &r);
        run_arrays(&fr->rr, &r, false);
        fn(fr, w, &r, arg);
        MemoryContextSwitchTo(old);
        MemoryContextReset(rcxt);
    }
    index_endscan(scan);
    MemoryContextDelete(rcxt);
}

/* Pass over a run for the candidates' transactions: for each, the first listing by (scan_xmax,
 * last_index) with scan_xmax above the xid; in a run, only its first position (array_position);
 * a listing whose count is NULL does not count (the SQL's k < ns[p] goes on to the next run). */
static void map_run(fcall *fr, const window *w, const run_row *r, void *arg)
{
    xhash *h = (xhash *)arg;
    int i;

    (void)fr;
    (void)w;
    if (r->xids.multi)
        ereport(ERROR,
                (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                 errmsg("searching for elements in multidimensional arrays is not supported")));
    for (i = 0; i < r->xids.n; i++) {
        int64 v;
        xmap *e;
        int64 p;
        int64 base = 0;
        int64 nn = 0;

        if (!pawln_rarr_at(&r->xids, i, &v) || (e = xhash_get(h, (uint64)v)) == NULL)
            continue;
        if (e->seen && e->seen_li == r->last_index)
            continue;
        e->seen = true;
        e->seen_li = r->last_index;
        if ((uint64)v >= r->scan_xmax)
            continue;
        if (e->found && (e->sx < r->scan_xmax || (e->sx == r->scan_xmax && e->li < r->last_index)))
            continue; /* an earlier listing stands */
        p = (int64)r->xids.lb + i;
        if (!rarr_sub(&r->ns, p, &nn))
            continue;
        e->found = true;
        e->has_base = rarr_sub(&r->bases, p, &base);
        e->base = base;
        e->n = (int32)nn;
        e->sx = r->scan_xmax;
        e->li = r->last_index;
    }
}

/* The final index of (e's transaction, k) if it lies in the window: (lo, wend]. */
static bool in_window(const fcall *fr, const window *w, const xmap *e, int32 k, int64 *idx)
{
    if (e == NULL || !e->found || k >= e->n || !e->has_base)
        return false;
    if (pg_add_s64_overflow(e->base, k, idx))
        int8_overflow();
    return *idx > fr->lo && *idx <= w->wend;
}

/* A fetched candidate row in p->slot: the SQL's outer conditions, then the top-N. */
static void consider(fcall *fr, const window *w, topn *t, epart *p, int16 pi, const xhash *h,
                     uint64 x, int32 cat)
{
    bool isnull;
    int32 k = DatumGetInt32(slot_getattr(p->slot, p->a_k, &isnull));
    int64 idx;
    bstr stream;
    bstr type;

    if (isnull || !in_window(fr, w, xhash_get(h, x), k, &idx) || !topn_wants(t, idx))
        return;
    stream = text_bytes(slot_getattr(p->slot, p->att[EV_STREAM], &isnull));
    if (!pass_category(&fr->f, cat, &stream))
        return;
    type = text_bytes(slot_getattr(p->slot, p->att[EV_TYPE], &isnull));
    if (!pass_type(&fr->f, &type))
        return;
    topn_add(t, idx, p->slot, pi);
}

/* Fetch candidate (p, tid) under the snapshot: false when no version is visible. */
static bool fetch_tid(fcall *fr, epart *p, ItemPointer tid)
{
    bool call_again = false;
    bool all_dead = false;

    if (p->fetch == NULL) {
        MemoryContext old = MemoryContextSwitchTo(p->cxt);

        p->fetch = table_index_fetch_begin(p->rel);
        MemoryContextSwitchTo(old);
    }
    return table_index_fetch_tuple(p->fetch, tid, fr->snap, p->slot, &call_again, &all_dead);
}

/* Whether partition p may hold xids in [lo, hi]. */
static bool part_overlaps(const epart *p, uint64 lo, uint64 hi)
{
    return p->lo <= p->hi && p->lo <= hi && p->hi >= lo;
}

/* p's primary-key scan positioned on transaction x's rows from k_lo on, in k order. */
static void pkey_rows(epart *p, Snapshot snap, uint64 x, int32 k_lo)
{
    part_pkey(p, snap);
    keys_xid_range(&p->pkkeys[0], 1, x, x);
    ScanKeyInit(&p->pkkeys[2], 2, BTGreaterEqualStrategyNumber, F_INT4GE, Int32GetDatum(k_lo));
    part_rescan(p, p->pkscan, p->pkkeys, 3);
}

/*
 * After a category index entry's row (in p->slot, of transaction x): when the index holds runs
 * and the row heads one (cat_run m > 1), the run's other rows, k + 1 .. k + m - 1, through the
 * primary key. A row counts only as a follower (cat_run 0), and its category is checked from its
 * stream id, not taken from the head's, so a run never brings a row its own entry brings too.
 */
static void walk_run(fcall *fr, const window *w, topn *t, epart *p, int16 pi, const xhash *h,
                     uint64 x)
{
    bool isnull;
    Datum d;
    int32 k;
    int64 last;

    if (p->a_run == InvalidAttrNumber)
        return;
    d = slot_getattr(p->slot, p->a_run, &isnull);
    if (isnull || DatumGetInt32(d) <= 1)
        return;
    last = (int64)DatumGetInt32(d) - 1;
    d = slot_getattr(p->slot, p->a_k, &isnull);
    if (isnull || DatumGetInt32(d) == PG_INT32_MAX)
        return;
    k = DatumGetInt32(d);
    last += k;
    pkey_rows(p, fr->snap, x, k + 1);
    while (part_next(p, p->pkscan)) {
        int32 kk = itup_k(p->pkscan, p->rel);
        int64 idx;

        CHECK_FOR_INTERRUPTS();
        if (kk > last)
            break;
        if (!in_window(fr, w, xhash_get(h, x), kk, &idx) || !topn_wants(t, idx))
            continue;
        if (!index_fetch_heap(p->pkscan, p->slot))
            continue;
        d = slot_getattr(p->slot, p->a_run, &isnull);
        if (!isnull && DatumGetInt32(d) == 0)
            consider(fr, w, t, p, pi, h, x, -1);
    }
}

/* A window of a category filter (see the file's comment). */
static void window_by_category(fcall *fr, const window *w, topn *t)
{
    cand *cs = NULL;
    int64 ncs = 0;
    int64 capcs = 0;
    xhash h;
    int64 i;
    int c;
    int pi;

    /* The candidates: each category's index entries with xid in [xlo, xhi), per partition. */
    if (w->xlo < w->xhi)
        for (c = 0; c < fr->f.ncats; c++)
            for (pi = 0; pi < fr->ps.n; pi++) {
                epart *p = &fr->ps.v[pi];

                if (!part_overlaps(p, w->xlo, w->xhi - 1))
                    continue;
                part_category(p, fr->snap);
                key_text(&p->keys[0], 1, BTEqualStrategyNumber, F_TEXTEQ, p->ix->rd_indcollation[0],
                         fr->f.cats[c].datum);
                keys_xid_range(&p->keys[1], 2, w->xlo, w->xhi - 1);
                part_rescan(p, p->scan, p->keys, 3);
                while (part_next(p, p->scan)) {
                    CHECK_FOR_INTERRUPTS();
                    if (ncs == capcs) {
                        capcs = capcs ? capcs * 2 : 1024;
                        cs = scratch_get(&sc_cand, sizeof(cand) * capcs, true);
                        capcs = sc_cand.size / sizeof(cand);
                    }
                    cs[ncs].xid = itup_xid(p->scan, 2, p->rel);
                    cs[ncs].tid = p->scan->xs_heaptid;
                    cs[ncs].part = (int16)pi;
                    cs[ncs].cat = c;
                    ncs++;
                }
            }
    if (ncs == 0 && w->nlate == 0)
        return;

    /* Their transactions' bases and counts, from the window's runs. */
    xhash_init(&h, ncs + w->nlate);
    for (i = 0; i < ncs; i++)
        xhash_add(&h, cs[i].xid);
    for (i = 0; i < w->nlate; i++)
        xhash_add(&h, w->late[i]);
    window_runs(fr, w, map_run, &h);

    for (i = 0; i < ncs; i++) {
        epart *p = &fr->ps.v[cs[i].part];
        xmap *e = xhash_get(&h, cs[i].xid);

        CHECK_FOR_INTERRUPTS();
        if (e == NULL || !e->found || !e->has_base)
            continue;
        if (fetch_tid(fr, p, &cs[i].tid)) {
            consider(fr, w, t, p, cs[i].part, &h, cs[i].xid, cs[i].cat);
            walk_run(fr, w, t, p, cs[i].part, &h, cs[i].xid);
        }
    }

    /* The late transactions ordered in the window: each one's events, through the category
     * index when fewer probes than its events, else through the primary key. */
    for (i = 0; i < w->nlate; i++) {
        uint64 x = w->late[i];
        xmap *e = xhash_get(&h, x);

        if (e == NULL || !e->found || !e->has_base)
            continue;
        for (pi = 0; pi < fr->ps.n; pi++) {
            epart *p = &fr->ps.v[pi];

            if (!part_overlaps(p, x, x))
                continue;
            if (fr->f.ncats < e->n) {
                part_category(p, fr->snap);
                for (c = 0; c < fr->f.ncats; c++) {
                    key_text(&p->keys[0], 1, BTEqualStrategyNumber, F_TEXTEQ,
                             p->ix->rd_indcollation[0], fr->f.cats[c].datum);
                    keys_xid_range(&p->keys[1], 2, x, x);
                    part_rescan(p, p->scan, p->keys, 3);
                    while (part_next(p, p->scan)) {
                        CHECK_FOR_INTERRUPTS();
                        if (index_fetch_heap(p->scan, p->slot)) {
                            consider(fr, w, t, p, (int16)pi, &h, x, c);
                            walk_run(fr, w, t, p, (int16)pi, &h, x);
                        }
                    }
                }
            } else {
                pkey_rows(p, fr->snap, x,
                          PG_INT32_MIN); /* every k (the SQL does not bound it below) */
                while (part_next(p, p->pkscan)) {
                    int64 idx;

                    CHECK_FOR_INTERRUPTS();
                    if (!in_window(fr, w, e, itup_k(p->pkscan, p->rel), &idx) ||
                        !topn_wants(t, idx))
                        continue;
                    if (index_fetch_heap(p->pkscan, p->slot))
                        consider(fr, w, t, p, (int16)pi, &h, x, -1);
                }
            }
        }
    }
}

/* A window of a filter of types alone: its appends in index order (as pawl_api.read reads
 * them), each append's events in the window through the primary key, those of the types asked
 * for returned until the call has max_events. */
typedef struct tentry {
    uint64 xid;
    int pos; /* in the run's xids */
    int64 base;
    int32 klo;
    int32 khi;
} tentry;

typedef struct types_state {
    topn *t;
    int64 last; /* the highest index passed (appends must not overlap) */
} types_state;

static int cmp_tentry(const void *a, const void *b)
{
    const tentry *x = (const tentry *)a;
    const tentry *y = (const tentry *)b;
    int64 xs = x->base + x->klo;
    int64 ys = y->base + y->klo;

    return xs < ys ? -1 : (xs > ys ? 1 : 0);
}

static int cmp_tentry_xid(const void *a, const void *b)
{
    const tentry *x = (const tentry *)a;
    const tentry *y = (const tentry *)b;

    if (x->xid != y->xid)
        return x->xid < y->xid ? -1 : 1;
    return x->pos < y->pos ? -1 : (x->pos > y->pos ? 1 : 0);
}

static void types_run(fcall *fr, const window *w, const run_row *r, void *arg)
{
    types_state *st = (types_state *)arg;
    tentry *es;
    int nes = 0;
    int i;

    if (st->t->n >= st->t->need)
        return;
    if (r->xids.multi)
        ereport(ERROR,
                (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                 errmsg("searching for elements in multidimensional arrays is not supported")));
    es = palloc(sizeof(tentry) * (r->xids.n > 0 ? r->xids.n : 1));
    for (i = 0; i < r->xids.n; i++) {
        int64 v;
        int64 p;
        int64 base;
        int64 nn;
        int64 klo;
        int64 khi;

        if (!pawln_rarr_at(&r->xids, i, &v) || !window_xid(w, (uint64)v) ||
            (uint64)v >= r->scan_xmax)
            continue;
        p = (int64)r->xids.lb + i;
        if (!rarr_sub(&r->ns, p, &nn) || !rarr_sub(&r->bases, p, &base))
            continue;
        /* k in [lo + 1 - base, wend - base] and k < n */
        if (pg_sub_s64_overflow(fr->lo + 1, base, &klo) || pg_sub_s64_overflow(w->wend, base, &khi))
            int8_overflow();
        khi = Min(khi, nn - 1);
        klo = Max(klo, 0); /* events_k_check: 0 <= k < n */
        if (klo > khi)
            continue;
        es[nes].xid = (uint64)v;
        es[nes].pos = i;
        es[nes].base = base;
        es[nes].klo = (int32)klo;
        es[nes].khi = (int32)khi;
        nes++;
    }
    if (nes > 1) {
        int j = 0;

        /* array_position: only an xid's first position in a run counts. */
        qsort(es, nes, sizeof(tentry), cmp_tentry_xid);
        for (i = 0; i < nes; i++)
            if (j == 0 || es[j - 1].xid != es[i].xid)
                es[j++] = es[i];
        nes = j;
        qsort(es, nes, sizeof(tentry), cmp_tentry);
    }
    for (i = 0; i < nes && st->t->n < st->t->need; i++) {
        const tentry *e = &es[i];
        int pi;

        if (e->base + e->klo <= st->last)
            ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
                            errmsg("pawl_api.read_filtered: the runs give index " INT64_FORMAT
                                   " to two appends",
                                   e->base + e->klo)));
        st->last = e->base + e->khi;
        for (pi = 0; pi < fr->ps.n && st->t->n < st->t->need; pi++) {
            epart *p = &fr->ps.v[pi];

            if (!part_overlaps(p, e->xid, e->xid))
                continue;
            part_pkey(p, fr->snap);
            keys_xid_range(&p->pkkeys[0], 1, e->xid, e->xid);
            ScanKeyInit(&p->pkkeys[2], 2, BTGreaterEqualStrategyNumber, F_INT4GE,
                        Int32GetDatum(e->klo));
            part_rescan(p, p->pkscan, p->pkkeys, 3);
            while (st->t->n < st->t->need && part_next(p, p->pkscan)) {
                int32 k = itup_k(p->pkscan, p->rel);
                bool isnull;
                bstr type;

                CHECK_FOR_INTERRUPTS();
                if (k > e->khi)
                    break;
                if (!index_fetch_heap(p->pkscan, p->slot))
                    continue;
                type = text_bytes(slot_getattr(p->slot, p->att[EV_TYPE], &isnull));
                if (pass_type(&fr->f, &type))
                    topn_add(st->t, e->base + k, p->slot, (int16)pi);
            }
        }
    }
}

/* Put a window's matches into the result, in index order (the SQL's ORDER BY idx LIMIT). */
static void emit_matches(fcall *fr, topn *t)
{
    Datum values[READ_COLS];
    bool nulls[READ_COLS];
    int i;
    int j;

    if (t->n > 1)
        qsort(t->v, t->n, sizeof(match), cmp_match);
    for (i = 0; i < t->n; i++) {
        epart *p = &fr->ps.v[t->v[i].part];
        TupleDesc ptd = RelationGetDescr(p->rel);
        Datum *pv = palloc(sizeof(Datum) * ptd->natts);
        bool *pn = palloc(sizeof(bool) * ptd->natts);

        /* One deforming pass (heap_getattr per column walks the row again for each). */
        heap_deform_tuple(t->v[i].tup, ptd, pv, pn);
        values[0] = Int64GetDatum(t->v[i].idx);
        nulls[0] = false;
        for (j = 1; j < READ_COLS; j++) {
            values[j] = pv[p->att[j - 1] - 1];
            nulls[j] = pn[p->att[j - 1] - 1];
        }
        tuplestore_putvalues(fr->ts, fr->td, values, nulls);
        pfree(pv);
        pfree(pn);
    }
}

Datum pawl_read_filtered(PG_FUNCTION_ARGS)
{
    static const Oid argtypes[5] = {INT8OID, INT4OID, TEXTARRAYOID, TEXTARRAYOID, TEXTARRAYOID};
    ReturnSetInfo *rsi;
    fcall fr;
    int64 after;
    bstr *cats_in;
    bstr *pre_in;
    int ncats_in;
    int npre_in;
    int64 span;
    int64 looked = 0;
    bool has_head;

    check_declaration(fcinfo, "pawl_read_filtered", argtypes, 5,
                      "pawl_api.read_filtered(int8, int4, text[], text[], text[])");
    if (PG_ARGISNULL(0) || PG_GETARG_INT64(0) < 0)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("pawl_api.read_filtered: after_index must be >= 0")));
    if (PG_ARGISNULL(1) || PG_GETARG_INT32(1) < 1 || PG_GETARG_INT32(1) > MAX_EVENTS)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("pawl_api.read_filtered: max_events must be in 1..100000")));
    after = PG_GETARG_INT64(0);
    memset(&fr, 0, sizeof(fr));
    fr.max_events = PG_GETARG_INT32(1);
    cats_in = filter_arg(fcinfo, 2, "categories", true, &ncats_in);
    pre_in = filter_arg(fcinfo, 3, "stream_prefixes", false, &npre_in);
    fr.f.types = filter_arg(fcinfo, 4, "types", false, &fr.f.ntypes);
    if (cats_in == NULL && pre_in == NULL && fr.f.types == NULL)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("pawl_api.read_filtered: no filter (give categories, "
                               "stream_prefixes or types; pawl_api.read reads the whole log)")));
    if (fr.f.types != NULL)
        fr.f.ntypes = bstr_unique(fr.f.types, fr.f.ntypes);
    refuse_below_watermark(after);

    fr.snap = GetActiveSnapshot();
    runs_open(&fr.rr, true);
    parts_init(&fr.ps, fr.snap);
    filter_build(&fr.f, &fr.ps, cats_in, ncats_in, pre_in, npre_in);
    has_head = runs_head(&fr.rr, fr.snap, &fr.head);

    pawln_rows_begin(fcinfo, expected_desc(fcinfo));
    rsi = (ReturnSetInfo *)fcinfo->resultinfo;
    fr.ts = rsi->setResult;
    fr.td = rsi->setDesc;
    fr.wcxt = window_memory();
    fr.lo = after;
    span = Max(4 * (int64)fr.max_events, 4096);
    /* Windows of runs, growing while they find little, until max_events are found, the head is
     * reached, or 4 million indexes were looked at (the position row lets the caller go on). */
    while (has_head && fr.got < fr.max_events && fr.lo < fr.head && looked < LOOK_LIMIT) {
        MemoryContext old = MemoryContextSwitchTo(fr.wcxt);
        window w;
        topn t;

        CHECK_FOR_INTERRUPTS();
        window_bounds(&fr, span, &w);
        memset(&t, 0, sizeof(t));
        t.cxt = fr.wcxt;
        t.need = fr.max_events - fr.got;
        if (fr.f.by_category)
            window_by_category(&fr, &w, &t);
        else {
            types_state st;

            st.t = &t;
            st.last = PG_INT64_MIN;
            window_runs(&fr, &w, types_run, &st);
        }
        emit_matches(&fr, &t);
        fr.got += t.n;
        if (fr.got == fr.max_events)
            w.wend = t.v[t.n - 1].idx; /* the rest of the window is for the next read */
        looked += w.wend - fr.lo;
        fr.lo = w.wend;
        if (fr.got < fr.max_events / 2)
            span = Min(span * 2, SPAN_MAX);
        MemoryContextSwitchTo(old);
        MemoryContextReset(fr.wcxt);
    }
    parts_close(&fr.ps);
    runs_close(&fr.rr);
    MemoryContextReset(fr.wcxt);
    scratch_trim(&sc_cand);
    scratch_trim(&sc_hash);
    scratch_trim(&sc_match);

    /* A drop that committed after the look above: as in pawl_api.read. */
    {
        int64 w;

        if (log_start(&w) && after < w - 1) {
            tuplestore_end(rsi->setResult);
            rsi->setResult = NULL;
            pawln_below_watermark(w, after);
        }
    }
    /* The position row. */
    {
        Datum values[READ_COLS];
        bool nulls[READ_COLS];
        int i;

        for (i = 0; i < READ_COLS; i++) {
            values[i] = (Datum)0;
            nulls[i] = true;
        }
        values[0] = Int64GetDatum(fr.lo);
        nulls[0] = false;
        tuplestore_putvalues(fr.ts, fr.td, values, nulls);
    }
    pawln_runs_durable(fr.snap); /* the rows and the position leave the server durable */
    return (Datum)0;
}
