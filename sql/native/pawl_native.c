/*
 * pawl_native.c: pawl's finalization run (pawl.finalize) and the runs ledger's guard
 * (pawl.runs_guard) in C, inside the server.
 *
 * Design. The contract is the PL/pgSQL one of sql/014_own_xid.sql (see sql/001_log.sql for the
 * horizon, sql/006_log_guarantees.sql for tickets, chunks and the guard), done without a statement
 * per step. One pawl.finalize call:
 *
 *   1. checks its argument and the caller's transaction (READ COMMITTED, durable commit) with the
 *      same SQLSTATEs, messages and hints as the SQL version;
 *   2. takes the finalizer's gate, an EXCLUSIVE lock on pawl_locks.finalizer (pawl.finalizer_gate
 *      before schema 14), as LOCK TABLE ... NOWAIT does (same privilege check), held to the end of
 *      the transaction; when another session holds it, returns (-1, -1, current last index) and
 *      writes nothing; when it gets it, caps the caller's idle_in_transaction_session_timeout at
 *      5 s for the transaction (SET LOCAL);
 *   3. takes one new snapshot S after the gate (the previous run's rows are visible under it) and
 *      reads the previous run, the highest pawl.runs row, backwards from runs_pkey;
 *   4. finds the candidates with btree scans of each partition's primary key (xid, k), k = 0 only:
 *      the range [prev.scan_xmax, S.xmax), and one probe per xid of prev.open_xids below
 *      prev.scan_xmax that had completed at S; a partition whose xid range holds neither is not
 *      opened. It keeps the rows visible under S whose transaction had completed at S (below
 *      S.xmax, not in S.xip), except the caller's own top-level xid: its own snapshot leaves it
 *      out of S.xip, yet the transaction may still append;
 *   5. orders them by (ticket NULLS FIRST, xid), gives the bases, and inserts the run rows (at
 *      most max_appends appends each, contiguous, one command each) at the executor level, as
 *      logical replication applies rows: the row and statement triggers (runs_guard), the
 *      constraints, the column defaults and both unique indexes apply as for INSERT; a runs table
 *      with rules or transition tables goes through a saved SPI plan instead. The horizon written
 *      is S.xmax and S.xip, plus the caller's own xid when it is below S.xmax;
 *   6. notifies pawl_log with the new last index (delivered at commit) and returns one row.
 *
 * Nothing depends on planner statistics: the reads are index scans chosen here, and nothing is
 * planned (but the SPI fallback's INSERT ... VALUES). Every relation is named with its schema and
 * found without the caller's search_path. pawl.finalize is declared SECURITY DEFINER
 * (sql/native/activate.sql): its reads and its insert run with the schema owner's rights, checked
 * as the SQL statements would check them (and refused where row-level security would apply).
 * Errors are ereports; cleanup is the (sub)transaction abort's. Working memory is the caller's
 * per-call context; the result row lives in the SRF's multi-call context; the only state kept
 * across calls, per backend, is the saved SPI plan, the blessed result row type (both in
 * TopMemoryContext) and a hint of where the last run lies. Any backend may call either function
 * at any time; the gate serializes runs.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_am_d.h"
#include "catalog/pg_class_d.h"
#include "catalog/pg_type_d.h"
#include "commands/async.h"
#include "commands/trigger.h"
#include "common/int.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/qunique.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "rewrite/rewriteHandler.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/partcache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/xid8.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(pawl_finalize);
PG_FUNCTION_INFO_V1(pawl_runs_guard);
PG_FUNCTION_INFO_V1(pawl_events_guard);

/* xid8's storage (pg_type: typlen 8, typbyval FLOAT8PASSBYVAL, typalign 'd'). */
#define XID8_LEN 8
#define XID8_BYVAL FLOAT8PASSBYVAL
#define XID8_ALIGN TYPALIGN_DOUBLE

/* The appends a run may order: one k = 0 row of a transaction that had completed at S. */
typedef struct cand {
    uint64 xid;
    int64 ticket;
    bool has_ticket;
    int32 n;
} cand;

/* The previous run: the horizon this run starts from. */
typedef struct prev_run {
    bool found;
    int64 last_index;
    uint64 scan_xmax;
    uint64 *open; /* prev.open_xids, non-NULL elements, as read */
    int nopen;
} prev_run;

/* One partition of pawl.events and the xids it may hold, [lo, hi] inclusive. */
typedef struct part_range {
    Oid relid;
    uint64 lo;
    uint64 hi;
} part_range;

/* What the scans look for and what they found. */
typedef struct scan_state {
    Snapshot snap;
    uint64 from;       /* prev.scan_xmax: the range probe covers [from, sxmax) */
    uint64 sxmax;      /* S.xmax: nothing at or above it had completed at S */
    const uint64 *xip; /* S.xip, sorted, without duplicates */
    int nxip;
    uint64 own;           /* the caller's top-level xid, 0 when it has none */
    const uint64 *probes; /* open xids worth a probe: below from, completed at S, not own */
    int nprobes;
    cand *cands;
    int ncands;
    int capcands;
} scan_state;

static SPIPlanPtr runs_insert_plan = NULL;
/* The highest last_index this backend has read: where the backward scan of runs_pkey starts, so
 * that it reads the runs above it rather than the whole rightmost leaf page. Only a hint: a
 * run can be rolled back, so when no run lies at or above it the scan starts at the end. */
static int64 last_index_hint = PG_INT64_MIN;
static TupleDesc result_desc = NULL;

static int cmp_u64(const void *a, const void *b)
{
    uint64 x = *(const uint64 *)a;
    uint64 y = *(const uint64 *)b;

    return x < y ? -1 : (x > y ? 1 : 0);
}

/* The run's order: ticket (NULL first), then xid. */
static int cmp_cand(const void *a, const void *b)
{
    const cand *x = (const cand *)a;
    const cand *y = (const cand *)b;

    if (x->has_ticket != y->has_ticket)
        return x->has_ticket ? 1 : -1;
    if (x->has_ticket && x->ticket != y->ticket)
        return x->ticket < y->ticket ? -1 : 1;
    return cmp_u64(&x->xid, &y->xid);
}

/* A 32-bit xid from a snapshot taken before next_fxid was read, as a full xid
 * (xid8funcs.c's widen_snapshot_xid). */
static uint64 widen_xid(TransactionId xid, FullTransactionId next_fxid)
{
    TransactionId next_xid = XidFromFullTransactionId(next_fxid);
    uint32 epoch = EpochFromFullTransactionId(next_fxid);

    if (!TransactionIdIsNormal(xid))
        return U64FromFullTransactionId(FullTransactionIdFromEpochAndXid(0, xid));
    if (xid > next_xid)
        epoch--;
    return U64FromFullTransactionId(FullTransactionIdFromEpochAndXid(epoch, xid));
}

static bool completed_at_snapshot(const scan_state *st, uint64 xid)
{
    if (xid >= st->sxmax)
        return false;
    return bsearch(&xid, st->xip, st->nxip, sizeof(uint64), cmp_u64) == NULL;
}

static void schema_error(const char *what) pg_attribute_noreturn();

static void schema_error(const char *what)
{
    ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                    errmsg("pawl_native: unexpected pawl schema: %s", what),
                    errhint("pawl_native implements pawl schema 14; run "
                            "sql/native/deactivate.sql to use the SQL functions.")));
}

/* The attribute of rel named name, of type typid; an error when there is none. */
static AttrNumber column_of(Relation rel, const char *name, Oid typid)
{
    TupleDesc td = RelationGetDescr(rel);
    int i;

    for (i = 0; i < td->natts; i++) {
        Form_pg_attribute att = TupleDescAttr(td, i);

        if (att->attisdropped || strcmp(NameStr(att->attname), name) != 0)
            continue;
        if (att->atttypid != typid)
            schema_error(psprintf("column %s of %s has type %s", name, RelationGetRelationName(rel),
                                  format_type_be(att->atttypid)));
        return att->attnum;
    }
    schema_error(psprintf("%s has no column %s", RelationGetRelationName(rel), name));
}

/* Open pawl.<name> with lockmode, checking what a statement reading it would check: the current
 * user's right (need), and no row-level security applying to it (those reads are not planned
 * here, so a policy could not be applied: refuse rather than bypass it). */
static Relation open_pawl_table(const char *name, LOCKMODE lockmode, AclMode need)
{
    Relation rel = table_openrv(makeRangeVar("pawl", (char *)name, -1), lockmode);
    AclResult acl;

    acl = pg_class_aclcheck(RelationGetRelid(rel), GetUserId(), need);
    if (acl != ACLCHECK_OK)
        aclcheck_error(acl, OBJECT_TABLE, RelationGetRelationName(rel));
    if (rel->rd_rel->relrowsecurity &&
        check_enable_rls(RelationGetRelid(rel), InvalidOid, false) == RLS_ENABLED)
        schema_error(psprintf("row-level security applies to pawl.%s", name));
    return rel;
}

/* The primary key index of rel, checked to be a btree whose leading key columns are cols. */
static Relation open_pkey(Relation rel, const AttrNumber *cols, int ncols)
{
    Oid pk = RelationGetPrimaryKeyIndex(rel);
    Relation irel;
    int i;

    if (!OidIsValid(pk))
        schema_error(psprintf("%s has no primary key", RelationGetRelationName(rel)));
    irel = index_open(pk, AccessShareLock);
    if (irel->rd_rel->relam != BTREE_AM_OID || !irel->rd_index->indisvalid ||
        irel->rd_index->indnkeyatts < ncols)
        schema_error(
            psprintf("the primary key of %s is not a valid btree", RelationGetRelationName(rel)));
    for (i = 0; i < ncols; i++)
        if (irel->rd_index->indkey.values[i] != cols[i] || irel->rd_indoption[i] != 0)
            schema_error(psprintf("the primary key of %s is not on the expected columns",
                                  RelationGetRelationName(rel)));
    return irel;
}

/* The highest run visible under snap. With want_horizon, also its scan_xmax and open_xids
 * (copied out of the tuple). */
static void read_prev_run(Relation runs, Snapshot snap, bool want_horizon, prev_run *p)
{
    AttrNumber a_last = column_of(runs, "last_index", INT8OID);
    AttrNumber a_xmax = want_horizon ? column_of(runs, "scan_xmax", XID8OID) : 0;
    AttrNumber a_open = want_horizon ? column_of(runs, "open_xids", XID8ARRAYOID) : 0;
    Relation irel = open_pkey(runs, &a_last, 1);
    TupleTableSlot *slot = table_slot_create(runs, NULL);
    IndexScanDesc scan = index_beginscan(runs, irel, snap, 1, 0);
    ScanKeyData key;
    bool isnull;
    bool found;

    memset(p, 0, sizeof(*p));
    ScanKeyInit(&key, 1, BTGreaterEqualStrategyNumber, F_INT8GE, Int64GetDatum(last_index_hint));
    index_rescan(scan, &key, 1, NULL, 0);
    found = index_getnext_slot(scan, BackwardScanDirection, slot);
    if (!found && last_index_hint != PG_INT64_MIN) {
        ScanKeyInit(&key, 1, BTGreaterEqualStrategyNumber, F_INT8GE, Int64GetDatum(PG_INT64_MIN));
        index_rescan(scan, &key, 1, NULL, 0);
        found = index_getnext_slot(scan, BackwardScanDirection, slot);
    }
    if (found) {
        Datum d;

        p->found = true;
        p->last_index = DatumGetInt64(slot_getattr(slot, a_last, &isnull));
        last_index_hint = p->last_index;
        if (want_horizon) {
            d = slot_getattr(slot, a_xmax, &isnull);
            if (isnull)
                schema_error("a run has no scan_xmax");
            p->scan_xmax = U64FromFullTransactionId(DatumGetFullTransactionId(d));
            d = slot_getattr(slot, a_open, &isnull);
            if (!isnull) {
                /* Detoasted into this context (a copy): valid after the slot is dropped. */
                ArrayType *arr = DatumGetArrayTypePCopy(d);
                Datum *elems;
                bool *nulls;
                int n;
                int i;

                if (ARR_ELEMTYPE(arr) != XID8OID)
                    schema_error("runs.open_xids is not an xid8 array");
                deconstruct_array(arr, XID8OID, XID8_LEN, XID8_BYVAL, XID8_ALIGN, &elems, &nulls,
                                  &n);
                p->open = palloc(sizeof(uint64) * (n > 0 ? n : 1));
                for (i = 0; i < n; i++)
                    if (!nulls[i])
                        p->open[p->nopen++] =
                            U64FromFullTransactionId(DatumGetFullTransactionId(elems[i]));
            }
        }
    }
    index_endscan(scan);
    ExecDropSingleTupleTableSlot(slot);
    index_close(irel, NoLock);
}

/* The leaf partitions of pawl.events (or the table itself when it is not partitioned), each
 * with the xid range it can hold. Copied out of the relcache so that invalidations processed
 * while the partitions are opened cannot pull it away. */
static part_range *event_partitions(Relation events, AttrNumber a_xid, int *nparts)
{
    part_range *parts;
    PartitionKey key;
    PartitionDesc pd;
    PartitionBoundInfo bi;
    bool ranged;
    int i;

    if (events->rd_rel->relkind == RELKIND_RELATION) {
        parts = palloc(sizeof(part_range));
        parts[0].relid = RelationGetRelid(events);
        parts[0].lo = 0;
        parts[0].hi = PG_UINT64_MAX;
        *nparts = 1;
        return parts;
    }
    if (events->rd_rel->relkind != RELKIND_PARTITIONED_TABLE)
        schema_error("pawl.events is not a table");

    key = RelationGetPartitionKey(events);
    pd = RelationGetPartitionDesc(events, true);
    bi = pd->boundinfo;
    parts = palloc(sizeof(part_range) * (pd->nparts > 0 ? pd->nparts : 1));
    for (i = 0; i < pd->nparts; i++) {
        if (!pd->is_leaf[i])
            schema_error("a partition of pawl.events is itself partitioned");
        parts[i].relid = pd->oids[i];
        parts[i].lo = 0;
        parts[i].hi = PG_UINT64_MAX;
    }
    *nparts = pd->nparts;

    /* Bounds are used only when they order xids as uint64 does (xid8's btree order). */
    ranged = bi != NULL && key->strategy == PARTITION_STRATEGY_RANGE && key->partnatts == 1 &&
             key->partattrs[0] == a_xid && key->parttypid[0] == XID8OID &&
             key->partsupfunc[0].fn_oid == F_XID8CMP && bi->strategy == PARTITION_STRATEGY_RANGE &&
             bi->kind != NULL && bi->nindexes == bi->ndatums + 1;
    if (!ranged)
        return parts;
    /* indexes[i] is the partition whose (exclusive) upper bound is datums[i]; its lower bound
     * is datums[i - 1]. The default partition, if any, keeps the whole range. */
    for (i = 0; i < bi->ndatums; i++) {
        int p = bi->indexes[i];
        part_range *r;

        if (p < 0 || p >= pd->nparts || p == bi->default_index)
            continue;
        r = &parts[p];
        if (i > 0 && bi->kind[i - 1][0] == PARTITION_RANGE_DATUM_VALUE)
            r->lo = U64FromFullTransactionId(DatumGetFullTransactionId(bi->datums[i - 1][0]));
        if (bi->kind[i][0] == PARTITION_RANGE_DATUM_VALUE) {
            uint64 ub = U64FromFullTransactionId(DatumGetFullTransactionId(bi->datums[i][0]));

            if (ub == 0) {
                /* Empty: no xid lies below 0. */
                r->lo = 1;
                r->hi = 0;
            } else
                r->hi = ub - 1;
        }
    }
    return parts;
}

static void add_candidate(scan_state *st, uint64 xid, int32 n, bool has_ticket, int64 ticket)
{
    cand *c;

    if (st->ncands == st->capcands) {
        if (st->capcands >= (int)(MaxAllocSize / sizeof(cand) / 2))
            ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                            errmsg("pawl.finalize: too many appends to finalize in one run")));
        st->capcands = st->capcands ? st->capcands * 2 : 64;
        st->cands = st->cands ? repalloc(st->cands, sizeof(cand) * st->capcands)
                              : palloc(sizeof(cand) * st->capcands);
    }
    c = &st->cands[st->ncands++];
    c->xid = xid;
    c->n = n;
    c->has_ticket = has_ticket;
    c->ticket = ticket;
}

/* Collect the rows the positioned scan returns: k = 0 rows of transactions completed at S,
 * other than the caller's. */
static void drain(scan_state *st, IndexScanDesc scan, TupleTableSlot *slot, AttrNumber a_xid,
                  AttrNumber a_k, AttrNumber a_n, AttrNumber a_ticket)
{
    while (index_getnext_slot(scan, ForwardScanDirection, slot)) {
        bool isnull;
        bool tnull;
        uint64 xid;
        Datum n;
        Datum ticket;

        CHECK_FOR_INTERRUPTS();
        xid =
            U64FromFullTransactionId(DatumGetFullTransactionId(slot_getattr(slot, a_xid, &isnull)));
        if (isnull || DatumGetInt32(slot_getattr(slot, a_k, &isnull)) != 0 || isnull)
            continue;
        if (xid == st->own || !completed_at_snapshot(st, xid))
            continue;
        n = slot_getattr(slot, a_n, &isnull);
        if (isnull || DatumGetInt32(n) < 1)
            ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
                            errmsg("pawl.finalize: the append of transaction " UINT64_FORMAT
                                   " has no valid event count",
                                   xid)));
        ticket = slot_getattr(slot, a_ticket, &tnull);
        add_candidate(st, xid, DatumGetInt32(n), !tnull, tnull ? 0 : DatumGetInt64(ticket));
    }
}

/* Scan one partition: the range probe when do_range, and the probes in [lo, hi]. */
static void scan_partition(scan_state *st, const part_range *part, bool do_range)
{
    Relation rel = table_open(part->relid, AccessShareLock);
    AttrNumber a_xid = column_of(rel, "xid", XID8OID);
    AttrNumber a_k = column_of(rel, "k", INT4OID);
    AttrNumber a_n = column_of(rel, "n", INT4OID);
    AttrNumber a_ticket = column_of(rel, "ticket", INT8OID);
    AttrNumber cols[2];
    Relation irel;
    TupleTableSlot *slot;
    ScanKeyData keys[3];
    IndexScanDesc scan;
    int i;

    cols[0] = a_xid;
    cols[1] = a_k;
    irel = open_pkey(rel, cols, 2);
    slot = table_slot_create(rel, NULL);

    if (do_range) {
        /* xid >= from AND xid < S.xmax AND k = 0, in index column order. */
        ScanKeyInit(&keys[0], 1, BTGreaterEqualStrategyNumber, F_XID8GE,
                    FullTransactionIdGetDatum(FullTransactionIdFromU64(st->from)));
        ScanKeyInit(&keys[1], 1, BTLessStrategyNumber, F_XID8LT,
                    FullTransactionIdGetDatum(FullTransactionIdFromU64(st->sxmax)));
        ScanKeyInit(&keys[2], 2, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(0));
        scan = index_beginscan(rel, irel, st->snap, 3, 0);
        index_rescan(scan, keys, 3, NULL, 0);
        drain(st, scan, slot, a_xid, a_k, a_n, a_ticket);
        index_endscan(scan);
    }

    scan = NULL;
    for (i = 0; i < st->nprobes; i++) {
        uint64 x = st->probes[i];

        if (x < part->lo || x > part->hi)
            continue;
        if (scan == NULL)
            scan = index_beginscan(rel, irel, st->snap, 2, 0);
        ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_XID8EQ,
                    FullTransactionIdGetDatum(FullTransactionIdFromU64(x)));
        ScanKeyInit(&keys[1], 2, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(0));
        index_rescan(scan, keys, 2, NULL, 0);
        drain(st, scan, slot, a_xid, a_k, a_n, a_ticket);
    }
    if (scan != NULL)
        index_endscan(scan);

    ExecDropSingleTupleTableSlot(slot);
    index_close(irel, NoLock);
    table_close(rel, NoLock);
}

static bool partition_needed(const scan_state *st, const part_range *part, bool *do_range)
{
    int i;

    *do_range = st->from < st->sxmax && part->lo <= st->sxmax - 1 && part->hi >= st->from;
    if (*do_range)
        return true;
    for (i = 0; i < st->nprobes; i++)
        if (st->probes[i] >= part->lo && st->probes[i] <= part->hi)
            return true;
    return false;
}

static void check_add(int64 a, int64 b, int64 *r)
{
    if (pg_add_s64_overflow(a, b, r))
        ereport(ERROR,
                (errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE), errmsg("bigint out of range")));
}

static ArrayType *xid8_array(const uint64 *v, int n)
{
    Datum *d = palloc(sizeof(Datum) * (n > 0 ? n : 1));
    int i;

    for (i = 0; i < n; i++)
        d[i] = FullTransactionIdGetDatum(FullTransactionIdFromU64(v[i]));
    return construct_array(d, n, XID8OID, XID8_LEN, XID8_BYVAL, XID8_ALIGN);
}

/* One run row's values, in the order of the columns below. */
#define RUN_COLS 7
static const char *const run_cols[RUN_COLS] = {"last_index", "first_index", "scan_xmax", "xids",
                                               "bases",      "ns",          "open_xids"};
static const Oid run_types[RUN_COLS] = {INT8OID,      INT8OID,      XID8OID,     XID8ARRAYOID,
                                        INT8ARRAYOID, INT4ARRAYOID, XID8ARRAYOID};

/* The values of chunk [lo, hi] (0-based, inclusive); open_d is shared by every chunk. */
static void chunk_values(const cand *c, const int64 *bases, int64 lo, int64 hi, uint64 nx,
                         Datum open_d, Datum *values)
{
    int len = (int)(hi - lo + 1);
    Datum *dx = palloc(sizeof(Datum) * len);
    Datum *db = palloc(sizeof(Datum) * len);
    Datum *dn = palloc(sizeof(Datum) * len);
    int64 last;
    int i;

    for (i = 0; i < len; i++) {
        dx[i] = FullTransactionIdGetDatum(FullTransactionIdFromU64(c[lo + i].xid));
        db[i] = Int64GetDatum(bases[lo + i]);
        dn[i] = Int32GetDatum(c[lo + i].n);
    }
    check_add(bases[hi], (int64)c[hi].n - 1, &last);
    values[0] = Int64GetDatum(last);
    values[1] = Int64GetDatum(bases[lo]);
    values[2] = FullTransactionIdGetDatum(FullTransactionIdFromU64(nx));
    values[3] =
        PointerGetDatum(construct_array(dx, len, XID8OID, XID8_LEN, XID8_BYVAL, XID8_ALIGN));
    values[4] = PointerGetDatum(
        construct_array(db, len, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
    values[5] =
        PointerGetDatum(construct_array(dn, len, INT4OID, sizeof(int32), true, TYPALIGN_INT));
    values[6] = open_d;
}

/* Can the run rows go in without a statement? The executor-level insert below covers a plain
 * table with row and statement triggers, constraints, defaults and indexes; rules and
 * transition tables need the full executor (the SPI path). */
static bool direct_insert_ok(Relation runs)
{
    TriggerDesc *trig = runs->trigdesc;

    return runs->rd_rel->relkind == RELKIND_RELATION && !runs->rd_rel->relhasrules &&
           (trig == NULL || !trig->trig_insert_new_table);
}

/* Insert the run rows as logical replication's apply does (execReplication.c): the runs_guard
 * trigger (and any other row or statement trigger), NOT NULL and CHECK constraints, column
 * defaults and both unique indexes apply as for an INSERT statement, without planning or
 * starting one. Each row is its own command, as each INSERT of the SQL version is: the
 * trigger of a row sees the rows before it. */
static void insert_runs_direct(Relation runs, const cand *c, const int64 *bases, int cnt,
                               int32 max_appends, uint64 nx, const uint64 *np, int nnp)
{
    TupleDesc td = RelationGetDescr(runs);
    AttrNumber att[RUN_COLS];
    EState *estate;
    RangeTblEntry *rte;
    ResultRelInfo *rri;
    TupleTableSlot *slot;
    Datum *defvals;
    bool *defnulls;
    Datum values[RUN_COLS];
    Datum open_d;
    AclResult acl;
    int64 lo;
    int i;

    for (i = 0; i < RUN_COLS; i++)
        att[i] = column_of(runs, run_cols[i], run_types[i]);
    /* What ExecutorStart checks for an INSERT: a writable transaction, the right to insert. */
    PreventCommandIfReadOnly("INSERT");
    acl = pg_class_aclcheck(RelationGetRelid(runs), GetUserId(), ACL_INSERT);
    if (acl != ACLCHECK_OK)
        aclcheck_error(acl, OBJECT_TABLE, RelationGetRelationName(runs));
    LockRelationOid(RelationGetRelid(runs), RowExclusiveLock);

    estate = CreateExecutorState();
    rte = makeNode(RangeTblEntry);
    rte->rtekind = RTE_RELATION;
    rte->relid = RelationGetRelid(runs);
    rte->relkind = RELKIND_RELATION;
    rte->rellockmode = RowExclusiveLock;
    ExecInitRangeTable(estate, list_make1(rte));
    rri = makeNode(ResultRelInfo);
    InitResultRelInfo(rri, runs, 1, NULL, 0);
    estate->es_opened_result_relations = lappend(estate->es_opened_result_relations, rri);
    ExecOpenIndices(rri, false);
    slot = ExecInitExtraTupleSlot(estate, td, &TTSOpsVirtual);

    /* Every other column gets its default (finalized_at: now()), evaluated once. */
    defvals = palloc0(sizeof(Datum) * td->natts);
    defnulls = palloc(sizeof(bool) * td->natts);
    for (i = 0; i < td->natts; i++) {
        Form_pg_attribute a = TupleDescAttr(td, i);
        Node *def;

        defnulls[i] = true;
        if (a->attisdropped || !a->atthasdef || a->attgenerated)
            continue;
        def = build_column_default(runs, i + 1);
        if (def != NULL) {
            ExprState *es = ExecPrepareExpr((Expr *)def, estate);
            Datum v = ExecEvalExprSwitchContext(es, GetPerTupleExprContext(estate), &defnulls[i]);

            defvals[i] = defnulls[i] ? (Datum)0 : datumCopy(v, a->attbyval, a->attlen);
        }
    }

    open_d = PointerGetDatum(xid8_array(np, nnp));
    AfterTriggerBeginQuery();
    ExecBSInsertTriggers(estate, rri);
    for (lo = 0; lo < cnt; lo += max_appends) {
        int64 hi = Min((int64)cnt - 1, lo + (int64)max_appends - 1);

        MemoryContext old;

        CommandCounterIncrement();
        estate->es_output_cid = GetCurrentCommandId(true);
        PushActiveSnapshot(GetTransactionSnapshot());
        /* The chunk's arrays live until the row is stored: a backlog of many chunks does not
         * accumulate them. */
        old = MemoryContextSwitchTo(GetPerTupleMemoryContext(estate));
        chunk_values(c, bases, lo, hi, nx, open_d, values);
        MemoryContextSwitchTo(old);
        ExecClearTuple(slot);
        memcpy(slot->tts_values, defvals, sizeof(Datum) * td->natts);
        memcpy(slot->tts_isnull, defnulls, sizeof(bool) * td->natts);
        for (i = 0; i < RUN_COLS; i++) {
            slot->tts_values[att[i] - 1] = values[i];
            slot->tts_isnull[att[i] - 1] = false;
        }
        ExecStoreVirtualTuple(slot);
        ExecSimpleRelationInsert(rri, estate, slot);
        PopActiveSnapshot();
        ResetPerTupleExprContext(estate);
    }
    ExecASInsertTriggers(estate, rri, NULL);
    AfterTriggerEndQuery(estate);
    ExecCloseIndices(rri);
    ExecResetTupleTable(estate->es_tupleTable, false);
    FreeExecutorState(estate);
}

/* Insert the run rows, chunks of at most max_appends appends, through the saved plan. */
static void insert_runs(const cand *c, const int64 *bases, int cnt, int32 max_appends, uint64 nx,
                        const uint64 *np, int nnp)
{
    Datum values[RUN_COLS];
    Datum open_d;
    MemoryContext chunk_cxt;
    int64 lo;

    if (SPI_connect() != SPI_OK_CONNECT)
        elog(ERROR, "pawl.finalize: SPI_connect failed");
    if (runs_insert_plan == NULL) {
        SPIPlanPtr plan = SPI_prepare_cursor(
            "INSERT INTO pawl.runs (last_index, first_index, scan_xmax, xids, bases, ns, "
            "open_xids) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            RUN_COLS, (Oid *)run_types, CURSOR_OPT_GENERIC_PLAN);

        if (plan == NULL)
            elog(ERROR, "pawl.finalize: SPI_prepare failed: %s",
                 SPI_result_code_string(SPI_result));
        if (SPI_keepplan(plan) != 0)
            elog(ERROR, "pawl.finalize: SPI_keepplan failed");
        runs_insert_plan = plan;
    }
    open_d = PointerGetDatum(xid8_array(np, nnp));
    chunk_cxt =
        AllocSetContextCreate(CurrentMemoryContext, "pawl.finalize chunk", ALLOCSET_DEFAULT_SIZES);
    for (lo = 0; lo < cnt; lo += max_appends) {
        int64 hi = Min((int64)cnt - 1, lo + (int64)max_appends - 1);
        MemoryContext old = MemoryContextSwitchTo(chunk_cxt);
        int rc;

        chunk_values(c, bases, lo, hi, nx, open_d, values);
        MemoryContextSwitchTo(old);
        rc = SPI_execute_plan(runs_insert_plan, values, NULL, false, 0);
        if (rc != SPI_OK_INSERT || SPI_processed != 1)
            elog(ERROR, "pawl.finalize: inserting a run returned %s (" UINT64_FORMAT " rows)",
                 SPI_result_code_string(rc), SPI_processed);
        MemoryContextReset(chunk_cxt);
    }
    SPI_finish();
}

/* The checks the SQL version makes before taking its lock, in its order. */
static void check_call(FunctionCallInfo fcinfo, int32 *max_appends)
{
    ReturnSetInfo *rsi = (ReturnSetInfo *)fcinfo->resultinfo;
    int i;

    /* Only a superuser can declare a C function; a wrong declaration still fails cleanly. */
    if (PG_NARGS() != 1 || !fcinfo->flinfo->fn_retset ||
        (fcinfo->flinfo->fn_expr != NULL && get_fn_expr_argtype(fcinfo->flinfo, 0) != INT4OID))
        ereport(ERROR, (errcode(ERRCODE_INVALID_FUNCTION_DEFINITION),
                        errmsg("pawl_finalize must be declared as pawl.finalize(int4) RETURNS "
                               "TABLE (appends int8, events int8, last_index int8)")));
    if (rsi != NULL && IsA(rsi, ReturnSetInfo) && rsi->expectedDesc != NULL) {
        bool ok = rsi->expectedDesc->natts == 3;

        for (i = 0; ok && i < 3; i++)
            ok = TupleDescAttr(rsi->expectedDesc, i)->atttypid == INT8OID;
        if (!ok)
            ereport(ERROR, (errcode(ERRCODE_DATATYPE_MISMATCH),
                            errmsg("pawl.finalize returns (appends int8, events int8, "
                                   "last_index int8)")));
    }

    if (PG_ARGISNULL(0) || PG_GETARG_INT32(0) < 1)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("pawl.finalize: max_appends must be at least 1")));
    *max_appends = PG_GETARG_INT32(0);

    if (XactIsoLevel != XACT_READ_COMMITTED) {
        /* upper(current_setting('transaction_isolation')), as the SQL version reports it. */
        const char *level = XactIsoLevel == XACT_READ_UNCOMMITTED  ? "READ UNCOMMITTED"
                            : XactIsoLevel == XACT_REPEATABLE_READ ? "REPEATABLE READ"
                                                                   : "SERIALIZABLE";

        ereport(ERROR, (errcode(ERRCODE_INVALID_TRANSACTION_STATE),
                        errmsg("pawl.finalize must run at READ COMMITTED, not %s", level),
                        errhint("SET default_transaction_isolation = 'read committed' for the "
                                "session that finalizes")));
    }
    if (synchronous_commit <= SYNCHRONOUS_COMMIT_LOCAL_FLUSH)
        ereport(ERROR, (errcode(ERRCODE_INVALID_TRANSACTION_STATE),
                        errmsg("pawl.finalize must run with synchronous_commit on or stronger, "
                               "not %s",
                               synchronous_commit == SYNCHRONOUS_COMMIT_OFF ? "off" : "local"),
                        errhint("SET synchronous_commit = on in the session that finalizes (and "
                                "keep it so until its COMMIT)")));
}

/* LOCK TABLE's privilege check for EXCLUSIVE mode, made before the lock is tried. */
static void gate_acl(const RangeVar *rv, Oid relid, Oid oldrelid, void *arg)
{
    AclResult acl;
    char kind;

    (void)oldrelid;
    (void)arg;
    if (!OidIsValid(relid))
        return;
    kind = get_rel_relkind(relid);
    if (kind != RELKIND_RELATION && kind != RELKIND_PARTITIONED_TABLE)
        schema_error("pawl.finalizer_gate is not a table");
    acl = pg_class_aclcheck(relid, GetUserId(), ACL_UPDATE | ACL_DELETE | ACL_TRUNCATE);
    if (acl != ACLCHECK_OK)
        aclcheck_error(acl, OBJECT_TABLE, rv->relname);
}

/* The finalizer's gate: pawl_locks.finalizer (schema 14, a schema no other login can use), or
 * pawl.finalizer_gate in a database that predates it. */
static RangeVar *gate_rangevar(void)
{
    Oid nsp = get_namespace_oid("pawl_locks", true);

    if (OidIsValid(nsp) && OidIsValid(get_relname_relid("finalizer", nsp)))
        return makeRangeVar("pawl_locks", "finalizer", -1);
    return makeRangeVar("pawl", "finalizer_gate", -1);
}

/* The run itself; out = (appends, events, last_index), last_null when there is no run row. */
static void finalize_run(int32 max_appends, int64 out[3], bool *last_null)
{
    Relation runs;
    Relation events;
    Snapshot snap;
    prev_run prev;
    scan_state st;
    part_range *parts;
    int nparts;
    FullTransactionId next_fxid;
    FullTransactionId own;
    uint64 *xip;
    uint64 *probes;
    uint64 *np;
    int nnp;
    int64 *bases;
    int64 first;
    int64 total;
    int64 last;
    int i;
    char payload[32];

    /* LOCK TABLE's checks: not during recovery, then privileges, then the lock itself. */
    PreventCommandDuringRecovery("LOCK TABLE");
    if (!OidIsValid(RangeVarGetRelidExtended(gate_rangevar(), ExclusiveLock, RVR_SKIP_LOCKED,
                                             gate_acl, NULL))) {
        /* Busy: another session runs. Report the highest index under a new snapshot. */
        runs = open_pawl_table("runs", AccessShareLock, ACL_SELECT);
        snap = RegisterSnapshot(GetTransactionSnapshot());
        read_prev_run(runs, snap, false, &prev);
        UnregisterSnapshot(snap);
        table_close(runs, NoLock);
        out[0] = -1;
        out[1] = -1;
        out[2] = prev.last_index;
        *last_null = !prev.found;
        return;
    }

    /* A caller that keeps its transaction open and idle keeps the gate: the server ends such a
     * session after 5 s (a shorter setting of its own stays). SET LOCAL: it outlives this
     * function's own settings and ends with the transaction, as set_config(..., true) does. */
    if (IdleInTransactionSessionTimeout == 0 || IdleInTransactionSessionTimeout > 5000)
        (void)set_config_option("idle_in_transaction_session_timeout", "5s", PGC_USERSET,
                                PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);

    runs = open_pawl_table("runs", AccessShareLock, ACL_SELECT);
    events = open_pawl_table("events", AccessShareLock, ACL_SELECT);

    /* The snapshot is taken after the lock: the previous run's rows are visible under it (and
     * this transaction's own earlier writes, as a new statement would see them). */
    CommandCounterIncrement();
    snap = RegisterSnapshot(GetTransactionSnapshot());
    next_fxid = ReadNextFullTransactionId();
    own = GetTopFullTransactionIdIfAny();

    read_prev_run(runs, snap, true, &prev);
    if (!prev.found) {
        /* No origin row: the SQL version finds nothing to do and returns a NULL index. */
        UnregisterSnapshot(snap);
        table_close(events, NoLock);
        table_close(runs, NoLock);
        out[0] = 0;
        out[1] = 0;
        out[2] = 0;
        *last_null = true;
        return;
    }

    memset(&st, 0, sizeof(st));
    st.snap = snap;
    st.from = prev.scan_xmax;
    st.sxmax = widen_xid(snap->xmax, next_fxid);
    xip = palloc(sizeof(uint64) * (snap->xcnt + 1));
    for (i = 0; i < (int)snap->xcnt; i++)
        xip[i] = widen_xid(snap->xip[i], next_fxid);
    qsort(xip, snap->xcnt, sizeof(uint64), cmp_u64);
    st.nxip = (int)qunique(xip, snap->xcnt, sizeof(uint64), cmp_u64);
    st.xip = xip;
    st.own = FullTransactionIdIsValid(own) ? U64FromFullTransactionId(own) : 0;

    /* Only open xids that can qualify are probed: below the old horizon (the range probe
     * covers the rest), completed at S, and not the caller's. */
    probes = palloc(sizeof(uint64) * (prev.nopen + 1));
    st.nprobes = 0;
    for (i = 0; i < prev.nopen; i++) {
        uint64 x = prev.open[i];

        if (x < st.from && x != st.own && completed_at_snapshot(&st, x))
            probes[st.nprobes++] = x;
    }
    qsort(probes, st.nprobes, sizeof(uint64), cmp_u64);
    st.nprobes = (int)qunique(probes, st.nprobes, sizeof(uint64), cmp_u64);
    st.probes = probes;

    parts = event_partitions(events, column_of(events, "xid", XID8OID), &nparts);
    for (i = 0; i < nparts; i++) {
        bool do_range;

        if (partition_needed(&st, &parts[i], &do_range))
            scan_partition(&st, &parts[i], do_range);
    }
    UnregisterSnapshot(snap);
    table_close(events, NoLock);

    if (st.ncands == 0) {
        /* Nothing written: the previous horizon stays valid. */
        table_close(runs, NoLock);
        out[0] = 0;
        out[1] = 0;
        out[2] = prev.last_index;
        *last_null = false;
        return;
    }

    qsort(st.cands, st.ncands, sizeof(cand), cmp_cand);
    check_add(prev.last_index, 1, &first);
    bases = palloc(sizeof(int64) * st.ncands);
    total = 0;
    for (i = 0; i < st.ncands; i++) {
        check_add(first, total, &bases[i]);
        check_add(total, st.cands[i].n, &total);
    }
    check_add(first, total - 1, &last);

    /* The horizon: S.xmax, and S.xip plus the caller's own xid when it lies below S.xmax (the
     * next run, in another transaction, must look at it again). */
    np = palloc(sizeof(uint64) * (st.nxip + 1));
    memcpy(np, st.xip, sizeof(uint64) * st.nxip);
    nnp = st.nxip;
    if (st.own != 0 && st.own < st.sxmax) {
        np[nnp++] = st.own;
        qsort(np, nnp, sizeof(uint64), cmp_u64);
        nnp = (int)qunique(np, nnp, sizeof(uint64), cmp_u64);
    }

    if (direct_insert_ok(runs))
        insert_runs_direct(runs, st.cands, bases, st.ncands, max_appends, st.sxmax, np, nnp);
    else
        insert_runs(st.cands, bases, st.ncands, max_appends, st.sxmax, np, nnp);
    table_close(runs, NoLock);

    snprintf(payload, sizeof(payload), INT64_FORMAT, last);
    Async_Notify("pawl_log", payload);

    out[0] = st.ncands;
    out[1] = total;
    out[2] = last;
    *last_null = false;
}

/*
 * pawl.runs_guard(), the BEFORE INSERT OR UPDATE OR DELETE row trigger of pawl.runs, in C: the
 * checks of sql/006_log_guarantees.sql's PL/pgSQL body, in its order and with its SQL
 * three-valued logic (a comparison with NULL is not a failure; the NOT NULL constraints, checked
 * after this trigger, refuse such rows), its messages and SQLSTATE. Like the PL/pgSQL body, it
 * reads the highest run as a new statement would: after a command counter increment, under a
 * new snapshot (the transaction's at REPEATABLE READ and above), with the inserting user's rights.
 */
typedef enum tri { TRI_FALSE, TRI_TRUE, TRI_NULL } tri;

static tri tri_or(tri a, tri b)
{
    if (a == TRI_TRUE || b == TRI_TRUE)
        return TRI_TRUE;
    return (a == TRI_NULL || b == TRI_NULL) ? TRI_NULL : TRI_FALSE;
}

static tri tri_ne(bool anull, int64 a, bool bnull, int64 b)
{
    return (anull || bnull) ? TRI_NULL : (a != b ? TRI_TRUE : TRI_FALSE);
}

/* arr[i] for an int8 or int4 array, as SQL subscripting gives it (NULL outside the array or
 * when the array is not one-dimensional). */
static bool array_elem(ArrayType *arr, int32 i, int64 *out)
{
    int lb;
    int n;
    bool isnull;
    Datum d;

    if (arr == NULL || ARR_NDIM(arr) != 1)
        return false;
    lb = ARR_LBOUND(arr)[0];
    n = ARR_DIMS(arr)[0];
    if (i < lb || (int64)i >= (int64)lb + n)
        return false;
    if (ARR_ELEMTYPE(arr) == INT8OID) {
        d = array_get_element(PointerGetDatum(arr), 1, &i, -1, sizeof(int64), FLOAT8PASSBYVAL,
                              TYPALIGN_DOUBLE, &isnull);
        *out = isnull ? 0 : DatumGetInt64(d);
    } else {
        d = array_get_element(PointerGetDatum(arr), 1, &i, -1, sizeof(int32), true, TYPALIGN_INT,
                              &isnull);
        *out = isnull ? 0 : DatumGetInt32(d);
    }
    return !isnull;
}

static ArrayType *array_field(HeapTuple tup, TupleDesc td, AttrNumber att)
{
    bool isnull;
    Datum d = heap_getattr(tup, att, td, &isnull);

    return isnull ? NULL : DatumGetArrayTypeP(d);
}

static char *int8_or_null(bool isnull, int64 v)
{
    return isnull ? pstrdup("<NULL>") : psprintf(INT64_FORMAT, v);
}

/*
 * pawl.events_guard, the statement trigger before every insert into pawl.events
 * (sql/009_retention.sql): pawl.log_guard's last value is the transaction id of the last
 * rotation or drop of the log; an insert whose snapshot does not see that transaction as
 * completed could write below what the rotation moved or the drop dropped, so it is refused
 * with serialization_failure (the appender retries). The same reads as the PL/pgSQL version
 * (pg_sequence_last_value, pg_visible_in_snapshot over pg_current_snapshot, i.e. the inserting
 * statement's snapshot), without its interpreter's set-up per statement.
 */
Datum pawl_events_guard(PG_FUNCTION_ARGS)
{
    Oid seq;
    Datum last;
    int64 g;

    if (!CALLED_AS_TRIGGER(fcinfo))
        ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                        errmsg("pawl.events_guard: not called by a trigger")));
    seq = get_relname_relid("log_guard", get_namespace_oid("pawl", false));
    if (!OidIsValid(seq))
        ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE),
                        errmsg("pawl.events_guard: the sequence pawl.log_guard does not exist")));
    {
        LOCAL_FCINFO(sfc, 1);

        InitFunctionCallInfoData(*sfc, NULL, 1, InvalidOid, NULL, NULL);
        sfc->args[0].value = ObjectIdGetDatum(seq);
        sfc->args[0].isnull = false;
        last = pg_sequence_last_value(sfc);
        if (sfc->isnull)
            return PointerGetDatum(NULL);
    }
    g = DatumGetInt64(last);
    if (g > 1) {
        Datum snap;
        bool visible;

        {
            LOCAL_FCINFO(cfc, 0);

            InitFunctionCallInfoData(*cfc, NULL, 0, InvalidOid, NULL, NULL);
            snap = pg_current_snapshot(cfc);
        }
        visible = DatumGetBool(DirectFunctionCall2(
            pg_visible_in_snapshot, FullTransactionIdGetDatum(FullTransactionIdFromU64((uint64)g)),
            snap));
        if (!visible)
            ereport(
                ERROR,
                (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                 errmsg("pawl: the event log was rotated or truncated (transaction " INT64_FORMAT
                        ") after this transaction's snapshot was taken; retry the "
                        "transaction",
                        g)));
    }
    return PointerGetDatum(NULL);
}

Datum pawl_runs_guard(PG_FUNCTION_ARGS)
{
    TriggerData *trig;
    TupleDesc td;
    HeapTuple row;
    Relation runs;
    prev_run prev;
    ArrayType *xids;
    ArrayType *bases;
    ArrayType *ns;
    bool fnull;
    bool lnull;
    int64 first;
    int64 last;
    bool cnull;
    int64 c;
    int64 b1;
    int64 bc;
    int64 nc;
    bool b1ok;
    bool bcok;
    bool ncok;
    tri bad;

    if (!CALLED_AS_TRIGGER(fcinfo))
        ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                        errmsg("pawl.runs_guard: not called as a trigger")));
    trig = (TriggerData *)fcinfo->context;
    if (!TRIGGER_FIRED_BY_INSERT(trig->tg_event))
        ereport(ERROR, (errcode(ERRCODE_INTEGRITY_CONSTRAINT_VIOLATION),
                        errmsg("pawl.runs: rows are never updated or deleted")));
    if (!TRIGGER_FIRED_FOR_ROW(trig->tg_event) || !TRIGGER_FIRED_BEFORE(trig->tg_event))
        ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                        errmsg("pawl.runs_guard must be fired BEFORE ... FOR EACH ROW")));
    row = trig->tg_trigtuple;
    td = RelationGetDescr(trig->tg_relation);

    /* SELECT r.last_index FROM pawl.runs r ORDER BY r.last_index DESC LIMIT 1, as a new
     * statement of a volatile function sees it. */
    runs = open_pawl_table("runs", AccessShareLock, ACL_SELECT);
    CommandCounterIncrement();
    PushActiveSnapshot(GetTransactionSnapshot());
    UpdateActiveSnapshotCommandId();
    read_prev_run(runs, GetActiveSnapshot(), false, &prev);
    PopActiveSnapshot();
    table_close(runs, NoLock);

    first = DatumGetInt64(
        heap_getattr(row, column_of(trig->tg_relation, "first_index", INT8OID), td, &fnull));
    last = DatumGetInt64(
        heap_getattr(row, column_of(trig->tg_relation, "last_index", INT8OID), td, &lnull));
    xids = array_field(row, td, column_of(trig->tg_relation, "xids", XID8ARRAYOID));
    /* c := cardinality(NEW.xids) */
    cnull = xids == NULL;
    c = cnull ? 0 : ArrayGetNItems(ARR_NDIM(xids), ARR_DIMS(xids));

    if (!prev.found) {
        if (tri_or(tri_or(tri_ne(fnull, first, false, 0), tri_ne(lnull, last, false, 0)),
                   tri_ne(cnull, c, false, 0)) == TRI_TRUE)
            ereport(ERROR,
                    (errcode(ERRCODE_INTEGRITY_CONSTRAINT_VIOLATION),
                     errmsg("pawl.runs: the first row must be the origin (0, 0, no appends)")));
        return PointerGetDatum(row);
    }
    {
        int64 next;

        check_add(prev.last_index, 1, &next);
        if (tri_ne(fnull, first, false, next) == TRI_TRUE)
            ereport(ERROR, (errcode(ERRCODE_INTEGRITY_CONSTRAINT_VIOLATION),
                            errmsg("pawl.runs: a run must start at " INT64_FORMAT
                                   " (the last index + 1), not at " INT64_FORMAT,
                                   next, first)));
    }

    /* c < 1 OR cardinality(bases) <> c OR cardinality(ns) <> c OR bases[1] <> first_index
     * OR ns[c] < 1 OR last_index <> bases[c] + ns[c] - 1, left to right up to the first true. */
    bases = array_field(row, td, column_of(trig->tg_relation, "bases", INT8ARRAYOID));
    ns = array_field(row, td, column_of(trig->tg_relation, "ns", INT4ARRAYOID));
    bad = cnull ? TRI_NULL : (c < 1 ? TRI_TRUE : TRI_FALSE);
    if (bad != TRI_TRUE)
        bad = tri_or(bad, tri_ne(bases == NULL,
                                 bases ? ArrayGetNItems(ARR_NDIM(bases), ARR_DIMS(bases)) : 0,
                                 cnull, c));
    if (bad != TRI_TRUE)
        bad = tri_or(
            bad, tri_ne(ns == NULL, ns ? ArrayGetNItems(ARR_NDIM(ns), ARR_DIMS(ns)) : 0, cnull, c));
    b1ok = array_elem(bases, 1, &b1);
    if (bad != TRI_TRUE)
        bad = tri_or(bad, tri_ne(!b1ok, b1, fnull, first));
    /* c is an int4 in the PL/pgSQL body; cardinality() of a run row cannot exceed that. */
    ncok = !cnull && c <= PG_INT32_MAX && array_elem(ns, (int32)c, &nc);
    if (bad != TRI_TRUE)
        bad = tri_or(bad, !ncok ? TRI_NULL : (nc < 1 ? TRI_TRUE : TRI_FALSE));
    bcok = !cnull && c <= PG_INT32_MAX && array_elem(bases, (int32)c, &bc);
    if (bad != TRI_TRUE) {
        int64 end = 0;

        if (bcok && ncok) {
            check_add(bc, nc, &end);
            check_add(end, -1, &end);
        }
        bad = tri_or(bad, tri_ne(lnull, last, !(bcok && ncok), end));
    }
    if (bad == TRI_TRUE)
        ereport(ERROR, (errcode(ERRCODE_INTEGRITY_CONSTRAINT_VIOLATION),
                        errmsg("pawl.runs: run %s .. %s is not a contiguous list of appends",
                               int8_or_null(fnull, first), int8_or_null(lnull, last))));
    return PointerGetDatum(row);
}

/* The row type (appends int8, events int8, last_index int8), blessed once per backend. */
static TupleDesc get_result_desc(void)
{
    if (result_desc == NULL) {
        MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
        TupleDesc td = CreateTemplateTupleDesc(3);

        TupleDescInitEntry(td, 1, "appends", INT8OID, -1, 0);
        TupleDescInitEntry(td, 2, "events", INT8OID, -1, 0);
        TupleDescInitEntry(td, 3, "last_index", INT8OID, -1, 0);
        result_desc = BlessTupleDesc(td);
        MemoryContextSwitchTo(old);
    }
    return result_desc;
}

/*
 * pawl.finalize(max_appends int4 DEFAULT 2000)
 *   RETURNS TABLE (appends int8, events int8, last_index int8)
 * One row; value-per-call, all the work in the first call.
 */
Datum pawl_finalize(PG_FUNCTION_ARGS)
{
    FuncCallContext *funcctx;

    if (SRF_IS_FIRSTCALL()) {
        int32 max_appends;
        int64 out[3];
        bool last_null;
        Datum values[3];
        bool nulls[3] = {false, false, false};
        MemoryContext old;

        check_call(fcinfo, &max_appends);
        funcctx = SRF_FIRSTCALL_INIT();
        finalize_run(max_appends, out, &last_null);
        values[0] = Int64GetDatum(out[0]);
        values[1] = Int64GetDatum(out[1]);
        values[2] = Int64GetDatum(out[2]);
        nulls[2] = last_null;
        old = MemoryContextSwitchTo(funcctx->multi_call_memory_ctx);
        funcctx->user_fctx = heap_form_tuple(get_result_desc(), values, nulls);
        MemoryContextSwitchTo(old);
    }
    funcctx = SRF_PERCALL_SETUP();
    if (funcctx->call_cntr == 0)
        SRF_RETURN_NEXT(funcctx, HeapTupleGetDatum((HeapTuple)funcctx->user_fctx));
    SRF_RETURN_DONE(funcctx);
}
