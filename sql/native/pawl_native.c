/*
 * pawl_native.c: pawl's finalization run (pawl.finalize), the log's guards (pawl.runs_guard,
 * pawl.events_guard) and the unfiltered read (pawl_api.read) in C, inside the server.
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
 *   6. notifies pawl_log with the new last index (delivered at commit) and returns one row;
 *   7. lets its commit go without a WAL flush of its own (SET LOCAL synchronous_commit = off) and,
 *      at the commit, before the caller hears of it, waits up to pawl.run_commit_wait (1 ms) for
 *      another session's flush to cover the commit record while another client session is busy
 *      (running a statement, or in a transaction with an xid) or was within the last 200 us, and
 *      flushes it itself when none did
 *      ("durable runs" below). Not with synchronous standbys configured, nor with the setting
 *      at -1: then the run commits as the caller's setting says (on or stronger).
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
 *
 * pawl_api.read (below, before its entry point pawl_read) keeps no state across calls: it reads
 * runs_pkey and the partitions' primary keys under the calling statement's snapshot with the
 * caller's rights, and returns its rows in the caller's tuplestore.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/sysattr.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_am_d.h"
#include "catalog/pg_class_d.h"
#include "catalog/pg_proc.h"
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
#include "replication/syncrep.h"
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
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/wait_event.h"
#include "utils/xid8.h"

#include "pawl_native.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(pawl_finalize);
PG_FUNCTION_INFO_V1(pawl_runs_durable);
PG_FUNCTION_INFO_V1(pawl_runs_guard);
PG_FUNCTION_INFO_V1(pawl_events_guard);
PG_FUNCTION_INFO_V1(pawl_read);

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
    TransactionId xmin; /* the transaction that wrote it (pawln_runs_durable) */
    uint64 scan_xmax;
    uint64 *open; /* prev.open_xids, non-NULL elements, as read */
    int nopen;
} prev_run;

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

void pawln_schema_error(const char *what)
{
    ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                    errmsg("pawl_native: unexpected pawl schema: %s", what),
                    errhint("pawl_native implements pawl schema 14; run "
                            "sql/native/deactivate.sql to use the SQL functions.")));
}

/* The attribute of rel named name, of type typid; an error when there is none. */
AttrNumber pawln_column_if(Relation rel, const char *name, Oid typid)
{
    TupleDesc td = RelationGetDescr(rel);
    int i;

    for (i = 0; i < td->natts; i++) {
        Form_pg_attribute att = TupleDescAttr(td, i);

        if (att->attisdropped || strcmp(NameStr(att->attname), name) != 0)
            continue;
        if (att->atttypid != typid)
            pawln_schema_error(psprintf("column %s of %s has type %s", name,
                                        RelationGetRelationName(rel),
                                        format_type_be(att->atttypid)));
        return att->attnum;
    }
    return InvalidAttrNumber;
}

AttrNumber pawln_column_of(Relation rel, const char *name, Oid typid)
{
    AttrNumber a = pawln_column_if(rel, name, typid);

    if (a == InvalidAttrNumber)
        pawln_schema_error(psprintf("%s has no column %s", RelationGetRelationName(rel), name));
    return a;
}

/* Open pawl.<name> with lockmode, checking what a statement reading it would check: the current
 * user's right (need), and no row-level security applying to it (those reads are not planned
 * here, so a policy could not be applied: refuse rather than bypass it). */
Relation pawln_open_table(const char *name, LOCKMODE lockmode, AclMode need)
{
    Relation rel = table_openrv(makeRangeVar("pawl", (char *)name, -1), lockmode);
    AclResult acl;

    acl = pg_class_aclcheck(RelationGetRelid(rel), GetUserId(), need);
    if (acl != ACLCHECK_OK)
        aclcheck_error(acl, OBJECT_TABLE, RelationGetRelationName(rel));
    if (rel->rd_rel->relrowsecurity &&
        check_enable_rls(RelationGetRelid(rel), InvalidOid, false) == RLS_ENABLED)
        pawln_schema_error(psprintf("row-level security applies to pawl.%s", name));
    return rel;
}

/* The primary key index of rel, checked to be a btree whose leading key columns are cols. */
Relation pawln_open_pkey(Relation rel, const AttrNumber *cols, int ncols)
{
    Oid pk = RelationGetPrimaryKeyIndex(rel);
    Relation irel;
    int i;

    if (!OidIsValid(pk))
        pawln_schema_error(psprintf("%s has no primary key", RelationGetRelationName(rel)));
    irel = index_open(pk, AccessShareLock);
    if (irel->rd_rel->relam != BTREE_AM_OID || !irel->rd_index->indisvalid ||
        irel->rd_index->indnkeyatts < ncols)
        pawln_schema_error(
            psprintf("the primary key of %s is not a valid btree", RelationGetRelationName(rel)));
    for (i = 0; i < ncols; i++)
        if (irel->rd_index->indkey.values[i] != cols[i] || irel->rd_indoption[i] != 0)
            pawln_schema_error(psprintf("the primary key of %s is not on the expected columns",
                                        RelationGetRelationName(rel)));
    return irel;
}

/* The highest run visible under snap. With want_horizon, also its scan_xmax and open_xids
 * (copied out of the tuple). */
static void read_prev_run(Relation runs, Snapshot snap, bool want_horizon, prev_run *p)
{
    AttrNumber a_last = pawln_column_of(runs, "last_index", INT8OID);
    AttrNumber a_xmax = want_horizon ? pawln_column_of(runs, "scan_xmax", XID8OID) : 0;
    AttrNumber a_open = want_horizon ? pawln_column_of(runs, "open_xids", XID8ARRAYOID) : 0;
    Relation irel = pawln_open_pkey(runs, &a_last, 1);
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
        d = slot_getsysattr(slot, MinTransactionIdAttributeNumber, &isnull);
        p->xmin = isnull ? InvalidTransactionId : DatumGetTransactionId(d);
        last_index_hint = p->last_index;
        if (want_horizon) {
            d = slot_getattr(slot, a_xmax, &isnull);
            if (isnull)
                pawln_schema_error("a run has no scan_xmax");
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
                    pawln_schema_error("runs.open_xids is not an xid8 array");
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
part_range *pawln_event_partitions(Relation events, AttrNumber a_xid, int *nparts)
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
        pawln_schema_error("pawl.events is not a table");

    key = RelationGetPartitionKey(events);
    pd = RelationGetPartitionDesc(events, true);
    bi = pd->boundinfo;
    parts = palloc(sizeof(part_range) * (pd->nparts > 0 ? pd->nparts : 1));
    for (i = 0; i < pd->nparts; i++) {
        if (!pd->is_leaf[i])
            pawln_schema_error("a partition of pawl.events is itself partitioned");
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
    AttrNumber a_xid = pawln_column_of(rel, "xid", XID8OID);
    AttrNumber a_k = pawln_column_of(rel, "k", INT4OID);
    AttrNumber a_n = pawln_column_of(rel, "n", INT4OID);
    AttrNumber a_ticket = pawln_column_of(rel, "ticket", INT8OID);
    AttrNumber cols[2];
    Relation irel;
    TupleTableSlot *slot;
    ScanKeyData keys[3];
    IndexScanDesc scan;
    int i;

    cols[0] = a_xid;
    cols[1] = a_k;
    irel = pawln_open_pkey(rel, cols, 2);
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
        att[i] = pawln_column_of(runs, run_cols[i], run_types[i]);
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

/* ---- durable runs ----------------------------------------------------------------------------
 *
 * A lone writer's appends each end in a run, and a run that commits durably is a second WAL
 * flush per event (on a VM, 150-250 us of CPU for the flushing backend and a wait for the
 * writer's next flush behind it). So a run commits without a flush of its own, and the
 * invariant "nothing a run assigned leaves the server before the run is durable" is kept by
 * those who let it leave:
 *
 *  - the finalizing session: at its commit (XACT_EVENT_COMMIT, after the run became visible and
 *    before its locks, its notifications and the answer to its client go) it waits up to
 *    pawl.run_commit_wait for the commit record to be flushed by someone else (the writer's next
 *    commit, usually within an append), then flushes it itself. It waits only while another
 *    client session is busy (running a statement, or in a transaction with an xid) or was within
 *    the last RUN_COMMIT_IDLE_US: with every other session waiting for its client, as at a low
 *    append rate, nobody is about to flush, and it flushes after that grace, not after the whole
 *    wait. The run's result,
 *    the pawl_log notification and the gate all go after the flush;
 *  - every reader of what runs assigned (pawl_api.read, read_stream, read_filtered here, and
 *    through pawl_api.runs_durable() the SQL ones activate.sql wraps: last_index, the events view):
 *    before returning, the commit of the newest run its snapshot sees is flushed
 *    (TransactionIdGetCommitLSN of the run's xmin, past the flush pointer: XLogFlush to it).
 *    WAL is one sequence and runs commit in index order, so older runs are durable with it.
 *
 * A crash then loses only a run nobody outside the server saw (its appends are finalized again,
 * perhaps in another order), since whoever saw it flushed it first. A standby receives only
 * flushed WAL. With synchronous standbys configured, runs commit as before: a failover must not
 * lose a run a reader of the old primary saw, and only the synchronous commit waits for them.
 */
static int run_commit_wait_us = 1000;
static bool run_flush_pending = false;
static bool run_callback_registered = false;

void _PG_init(void);

void _PG_init(void)
{
    DefineCustomIntVariable(
        "pawl.run_commit_wait",
        "How long a finalization run's commit waits for another session's WAL flush to cover it "
        "before flushing it itself, in microseconds.",
        "-1: each run commits with its own flush, as synchronous_commit says.", &run_commit_wait_us,
        1000, -1, 5000000, PGC_USERSET, 0, NULL, NULL, NULL);
}

/* Whether another client session is on its way to a commit that may flush: it runs a
 * transaction that has an xid, or it is doing something rather than waiting for its client's
 * next command (a lone writer's next append, before its first insert takes an xid); and it is
 * not waiting for a heavyweight lock (another finalizer waiting for the gate this run holds, or
 * an outbox append's commit waiting for the notification queue's lock, which the run holds
 * until its commit ends: either would only make the run wait its whole bound for nothing). Client
 * sessions only (the first MaxConnections PGPROCs: not autovacuum, background workers, WAL
 * senders or the auxiliary processes). Read without a lock (each field read whole): a hint that
 * decides only whether waiting for someone else's flush can pay off. */
static bool other_session_busy(void)
{
    int i;
    int n = Min(MaxConnections, (int)ProcGlobal->allProcCount);
    uint32 w;

    for (i = 0; i < n; i++) {
        PGPROC *p = &ProcGlobal->allProcs[i];

        /* A slot in use: its latch has an owner (a backend that exited disowned it; its pid
         * and wait event stay behind). */
        if (p == MyProc || *(volatile int *)&p->procLatch.owner_pid == 0)
            continue;
        w = *(volatile uint32 *)&p->wait_event_info;
        /* Waiting for a heavyweight lock, perhaps one this run holds until its commit ends (an
         * outbox append's commit queues for the notification queue's lock behind the run's
         * NOTIFY): not on its way to a flush, even with an xid. */
        if ((w & 0xFF000000) == PG_WAIT_LOCK)
            continue;
        if (TransactionIdIsValid(*(volatile const TransactionId *)&p->xid) ||
            w != WAIT_EVENT_CLIENT_READ)
            return true;
    }
    return false;
}

/* How long a run's commit goes on waiting with no other session busy: a lone writer's next
 * append reaches its backend within about this long after the previous one's answer. */
#define RUN_COMMIT_IDLE_US 200

/* The wait event a run's commit sleeps under while another session is busy: class Extension,
 * with an id of pawl's own, by which an appending session's commit finds it (wake_runs). */
#define RUN_COMMIT_WAIT_EVENT (PG_WAIT_EXTENSION | 0x5057U)

static bool wake_runs_pending = false;
static bool wake_runs_registered = false;

/* At an appending transaction's commit (after its commit record was flushed, when its
 * synchronous_commit flushes): set the latch of every client session whose run commit is
 * waiting for a flush. Read without a lock, as other_session_busy: a latch set for nothing only
 * makes that session look at the flush pointer again, and a session missed is still bounded by
 * its wait's 1 ms steps. */
static void wake_runs(XactEvent event, void *arg)
{
    int i;
    int n;

    (void)arg;
    if (!wake_runs_pending)
        return;
    if (event != XACT_EVENT_COMMIT && event != XACT_EVENT_PARALLEL_COMMIT &&
        event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_ABORT &&
        event != XACT_EVENT_PREPARE)
        return;
    wake_runs_pending = false;
    if (event != XACT_EVENT_COMMIT && event != XACT_EVENT_PARALLEL_COMMIT)
        return;
    n = Min(MaxConnections, (int)ProcGlobal->allProcCount);
    for (i = 0; i < n; i++) {
        PGPROC *p = &ProcGlobal->allProcs[i];

        if (p != MyProc && *(volatile uint32 *)&p->wait_event_info == RUN_COMMIT_WAIT_EVENT)
            SetLatch(&p->procLatch);
    }
}

void pawln_wake_runs_at_commit(void)
{
    if (!wake_runs_registered) {
        RegisterXactCallback(wake_runs, NULL);
        wake_runs_registered = true;
    }
    wake_runs_pending = true;
}

/* lsn flushed: at once when wait_us is 0, else after waiting up to wait_us for another
 * session's flush to cover it, for as long as another session is busy, or was within the last
 * RUN_COMMIT_IDLE_US (with none, nobody else is about to flush: waiting longer would only add
 * latency). */
void pawln_flush_to(XLogRecPtr lsn, int wait_us)
{
    TimestampTz until;

    if (XLogRecPtrIsInvalid(lsn) || RecoveryInProgress() || GetFlushRecPtr(NULL) >= lsn)
        return;
    if (wait_us > 0) {
        TimestampTz now = GetCurrentTimestamp();
        TimestampTz idle_until = now + Min(wait_us, RUN_COMMIT_IDLE_US);

        until = now + wait_us; /* TimestampTz counts microseconds */
        for (;;) {
            /* Reset before looking: a latch set after the look ends the wait below at once. */
            ResetLatch(MyLatch);
            if (GetFlushRecPtr(NULL) >= lsn)
                return;
            now = GetCurrentTimestamp();
            if (now >= until)
                break;
            if (other_session_busy()) {
                /* Someone is on the way to a commit: sleep on the latch, which a pawl append's
                 * commit sets (wake_runs), in steps of a millisecond (the latch's resolution)
                 * for other sessions' flushes, which set nothing. */
                idle_until = now + RUN_COMMIT_IDLE_US;
                (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 1L,
                                RUN_COMMIT_WAIT_EVENT);
            } else if (now >= idle_until) {
                break;
            } else {
                pg_usleep(50); /* nobody busy yet: a lone writer's next append is on its way */
            }
        }
    }
    XLogFlush(lsn);
}

void pawln_runs_durable(Snapshot snap)
{
    Relation runs;
    prev_run newest;

    /* A standby has only what its primary flushed; with nothing unflushed, nothing to do. */
    if (RecoveryInProgress() || GetFlushRecPtr(NULL) >= GetXLogInsertRecPtr())
        return;
    runs = table_openrv(makeRangeVar("pawl", "runs", -1), AccessShareLock);
    read_prev_run(runs, snap, false, &newest);
    table_close(runs, NoLock);
    /* A frozen run is old and durable; this transaction's own run is made durable at its
     * commit. The commit LSN of an asynchronous commit is kept per group of transactions in
     * the commit log (the highest of the group: flushing to it is enough); a synchronous one,
     * or one whose page was written out since, has none and is durable already. */
    if (newest.found && TransactionIdIsNormal(newest.xmin) &&
        !TransactionIdIsCurrentTransactionId(newest.xmin))
        pawln_flush_to(TransactionIdGetCommitLSN(newest.xmin), 0);
}

/* The finalizing session's commit: the run's commit record flushed before anything else goes. */
static void run_commit_callback(XactEvent event, void *arg)
{
    (void)arg;
    if (!run_flush_pending)
        return;
    switch (event) {
    case XACT_EVENT_COMMIT:
        run_flush_pending = false;
        pawln_flush_to(XactLastCommitEnd, run_commit_wait_us);
        break;
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PARALLEL_ABORT:
    case XACT_EVENT_PREPARE: /* a PREPARE is flushed; COMMIT PREPARED goes as its session says */
        run_flush_pending = false;
        break;
    default:
        break;
    }
}

/* After a run that wrote rows: its commit without a flush of its own, made durable at commit by
 * run_commit_callback. SET LOCAL: it outlives this function's own settings (search_path) and
 * ends with the transaction. */
static void defer_run_flush(void)
{
    Oid nsp;

    if (run_commit_wait_us < 0 || (SyncRepStandbyNames != NULL && SyncRepStandbyNames[0] != '\0'))
        return;
    /* Only where the SQL that returns indexes flushes too: a database activated by an older
     * pawl_native has no pawl_api.runs_durable() (pawl switches it again when it opens it). */
    nsp = get_namespace_oid("pawl_api", true);
    if (!OidIsValid(nsp) || !OidIsValid(GetSysCacheOid3(
                                PROCNAMEARGSNSP, Anum_pg_proc_oid, CStringGetDatum("runs_durable"),
                                PointerGetDatum(buildoidvector(NULL, 0)), ObjectIdGetDatum(nsp))))
        return;
    if (!run_callback_registered) {
        RegisterXactCallback(run_commit_callback, NULL);
        run_callback_registered = true;
    }
    (void)set_config_option("synchronous_commit", "off", PGC_USERSET, PGC_S_SESSION,
                            GUC_ACTION_LOCAL, true, 0, false);
    run_flush_pending = true;
}

/*
 * pawl_api.runs_durable() RETURNS bool: the newest run the calling statement sees made durable;
 * true. For SQL that returns what runs assigned (activate.sql's last_index and events view).
 */
Datum pawl_runs_durable(PG_FUNCTION_ARGS)
{
    (void)fcinfo;
    pawln_runs_durable(ActiveSnapshotSet() ? GetActiveSnapshot() : GetTransactionSnapshot());
    PG_RETURN_BOOL(true);
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
    /* (Not when an earlier run of this transaction lowered it: its commit is made durable.) */
    if (synchronous_commit <= SYNCHRONOUS_COMMIT_LOCAL_FLUSH && !run_flush_pending)
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
        pawln_schema_error("pawl.finalizer_gate is not a table");
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
        runs = pawln_open_table("runs", AccessShareLock, ACL_SELECT);
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

    runs = pawln_open_table("runs", AccessShareLock, ACL_SELECT);
    events = pawln_open_table("events", AccessShareLock, ACL_SELECT);

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

    parts = pawln_event_partitions(events, pawln_column_of(events, "xid", XID8OID), &nparts);
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

/* The readers subscript a run's arrays from 1 and unnest them side by side: each is empty or
 * one-dimensional from subscript 1, without NULL elements (a NULL array is left to the NOT NULL
 * constraints). Shapes first, then NULL elements, each in column order (sql/017). */
static void check_run_arrays(Relation rel, HeapTuple row, TupleDesc td)
{
    ArrayType *arr[4];
    const char *bad = NULL;
    bool fnull;
    bool lnull;
    int64 first;
    int64 last;
    int i;

    for (i = 0; i < 4; i++)
        arr[i] = array_field(row, td, pawln_column_of(rel, run_cols[3 + i], run_types[3 + i]));
    for (i = 0; i < 4 && bad == NULL; i++)
        if (arr[i] != NULL &&
            (ARR_NDIM(arr[i]) > 1 || (ARR_NDIM(arr[i]) == 1 && ARR_LBOUND(arr[i])[0] != 1)))
            bad = run_cols[3 + i];
    for (i = 0; i < 4 && bad == NULL; i++)
        if (arr[i] != NULL && array_contains_nulls(arr[i]))
            bad = run_cols[3 + i];
    if (bad == NULL)
        return;
    first =
        DatumGetInt64(heap_getattr(row, pawln_column_of(rel, "first_index", INT8OID), td, &fnull));
    last =
        DatumGetInt64(heap_getattr(row, pawln_column_of(rel, "last_index", INT8OID), td, &lnull));
    ereport(ERROR, (errcode(ERRCODE_INTEGRITY_CONSTRAINT_VIOLATION),
                    errmsg("pawl.runs: run %s .. %s: %s must be a one-dimensional array from "
                           "subscript 1 without NULL elements",
                           int8_or_null(fnull, first), int8_or_null(lnull, last), bad)));
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
    check_run_arrays(trig->tg_relation, row, td);

    /* SELECT r.last_index FROM pawl.runs r ORDER BY r.last_index DESC LIMIT 1, as a new
     * statement of a volatile function sees it. */
    runs = pawln_open_table("runs", AccessShareLock, ACL_SELECT);
    CommandCounterIncrement();
    PushActiveSnapshot(GetTransactionSnapshot());
    UpdateActiveSnapshotCommandId();
    read_prev_run(runs, GetActiveSnapshot(), false, &prev);
    PopActiveSnapshot();
    table_close(runs, NoLock);

    first = DatumGetInt64(
        heap_getattr(row, pawln_column_of(trig->tg_relation, "first_index", INT8OID), td, &fnull));
    last = DatumGetInt64(
        heap_getattr(row, pawln_column_of(trig->tg_relation, "last_index", INT8OID), td, &lnull));
    xids = array_field(row, td, pawln_column_of(trig->tg_relation, "xids", XID8ARRAYOID));
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
    bases = array_field(row, td, pawln_column_of(trig->tg_relation, "bases", INT8ARRAYOID));
    ns = array_field(row, td, pawln_column_of(trig->tg_relation, "ns", INT4ARRAYOID));
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
        if (out[0] > 0)
            defer_run_flush();
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

/*
 * pawl_api.read(after_index int8, max_events int4 DEFAULT 1000)
 *   RETURNS TABLE (global_index int8, stream_id text, stream_seq int8, type text, payload bytea,
 *                  metadata jsonb, appended_at timestamptz, event_id text)
 *
 * The unfiltered read of sql/015_event_ids.sql without a statement: its checks, in its order,
 * with its SQLSTATEs and messages; then the runs covering (after_index, hi] from runs_pkey (those
 * with last_index > after_index, up to the first whose last_index >= hi), each run's appends
 * (xids, bases, ns) that fall in the window, sorted by index, and each append's events by one
 * btree scan of its partition's primary key (xid = X AND k in the window); then the low-watermark
 * again (a drop that committed while the read ran: PW020 naming it). Everything is read under
 * the calling statement's snapshot, as the STABLE SQL function reads; events are only found
 * through runs, so only finalized events are returned, and their indexes are base + k.
 *
 * Rights are the caller's, as for the SQL function (not SECURITY DEFINER): USAGE on the schemas,
 * EXECUTE on pawl_api.first_index (whose SECURITY DEFINER read of pawl.log_start is done with
 * its owner's rights, as calling it would), SELECT on pawl.runs and pawl.events (or on the
 * columns the SQL query reads); a table that row-level security applies to is refused, since
 * no policy could be applied here. Nothing is looked up through search_path.
 *
 * Materialize mode: a set-returning function in FROM is copied into a tuplestore by the executor
 * in either mode, so the rows go straight into one (see pawln_rows_begin for its memory).
 */

/* One append in the window: its events k in [klo, khi], with indexes base + k. */
typedef struct read_entry {
    uint64 xid;
    int64 base;
    int32 klo;
    int32 khi;
} read_entry;

typedef struct read_entries {
    read_entry *v;
    int n;
    int cap;
} read_entries;

/* The event columns a read returns, in result order after global_index. */
#define READ_COLS 8
static const char *const read_cols[READ_COLS - 1] = {
    "stream_id", "stream_seq", "type", "payload", "metadata", "appended_at", "event_id"};
static const Oid read_types[READ_COLS] = {INT8OID,  TEXTOID,  INT8OID,        TEXTOID,
                                          BYTEAOID, JSONBOID, TIMESTAMPTZOID, TEXTOID};

/*
 * A partition of pawl.events, opened (with its primary key and a scan) when first needed. The
 * scan is a cursor over the primary key's tuples, (xid, k) ascending: the appends of a read
 * usually lie in xid order, so one scan walks through them, fetching from the heap only the
 * tuples of the appends read and stepping over the index tuples of others (without a heap
 * fetch); it is positioned again (a btree descent) only when the next append lies behind it or
 * far ahead.
 */
typedef struct read_part {
    Oid relid;
    uint64 lo; /* xids [lo, hi] */
    uint64 hi;
    Relation rel;
    Relation irel;
    IndexScanDesc scan;
    TupleTableSlot *slot;
    AttrNumber att[READ_COLS - 1];
    ScanKeyData row[2]; /* the members of the scan's row comparison (it points at them) */
    bool positioned;    /* the scan has been positioned, at (sx, sk) */
    uint64 sx;
    int32 sk;
    bool exhausted; /* and has no tuple left */
    bool have;      /* it is on a tuple not yet passed: (cx, ck) */
    uint64 cx;
    int32 ck;
    bool passed; /* a tuple was passed since positioning: the last one, (px, pk) */
    uint64 px;
    int32 pk;
} read_part;

/* Index tuples stepped over before the scan is positioned again instead. */
#define READ_MAX_STEPS 32

typedef struct read_parts {
    read_part *v; /* non-default partitions, by lo */
    int n;
    read_part *dflt; /* the default partition, or NULL */
} read_parts;

#define ERRCODE_PAWL_BELOW_WATERMARK MAKE_SQLSTATE('P', 'W', '0', '2', '0')

void pawln_below_watermark(int64 w, int64 after)
{
    ereport(ERROR, (errcode(ERRCODE_PAWL_BELOW_WATERMARK),
                    errmsg("pawl: the log starts at index " INT64_FORMAT
                           " (retention dropped the events below it); cannot read after "
                           "index " INT64_FORMAT,
                           w, after),
                    errdetail("low_watermark=" INT64_FORMAT " after_index=" INT64_FORMAT, w, after),
                    errhint("read from index " INT64_FORMAT " on (after " INT64_FORMAT
                            "), or reload the archive",
                            w, w - 1)));
}

/*
 * pawl_api.first_index() as the SQL read calls it: USAGE on pawl_api and EXECUTE on the function
 * are the caller's; the function is SECURITY DEFINER and reads pg_sequence_last_value of
 * pawl.log_start, so that read is made as its owner (as fmgr_security_definer switches: the
 * transaction's or subtransaction's abort restores the user on error). False when the sequence
 * has no value (the SQL comparison with NULL then fails nothing).
 */
static bool read_watermark(int64 *w)
{
    Oid api = LookupExplicitNamespace("pawl_api", false);
    oidvector *noargs = buildoidvector(NULL, 0);
    HeapTuple tup;
    Oid fn;
    Oid owner;
    Oid seq;
    AclResult acl;
    Oid save_user;
    int save_sec;
    Datum last;
    bool isnull;

    tup = SearchSysCache3(PROCNAMEARGSNSP, CStringGetDatum("first_index"), PointerGetDatum(noargs),
                          ObjectIdGetDatum(api));
    if (!HeapTupleIsValid(tup))
        ereport(ERROR, (errcode(ERRCODE_UNDEFINED_FUNCTION),
                        errmsg("function pawl_api.first_index() does not exist")));
    fn = ((Form_pg_proc)GETSTRUCT(tup))->oid;
    owner = ((Form_pg_proc)GETSTRUCT(tup))->proowner;
    ReleaseSysCache(tup);
    acl = pg_proc_aclcheck(fn, GetUserId(), ACL_EXECUTE);
    if (acl != ACLCHECK_OK)
        aclcheck_error(acl, OBJECT_FUNCTION, "first_index");

    seq = get_relname_relid("log_start", get_namespace_oid("pawl", false));
    if (!OidIsValid(seq))
        ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE),
                        errmsg("relation \"pawl.log_start\" does not exist")));
    GetUserIdAndSecContext(&save_user, &save_sec);
    SetUserIdAndSecContext(owner, save_sec | SECURITY_LOCAL_USERID_CHANGE);
    {
        LOCAL_FCINFO(sfc, 1);

        InitFunctionCallInfoData(*sfc, NULL, 1, InvalidOid, NULL, NULL);
        sfc->args[0].value = ObjectIdGetDatum(seq);
        sfc->args[0].isnull = false;
        last = pg_sequence_last_value(sfc);
        isnull = sfc->isnull;
    }
    SetUserIdAndSecContext(save_user, save_sec);
    if (isnull)
        return false;
    *w = DatumGetInt64(last);
    return true;
}

/* The check the executor makes before the SQL query reads rel: SELECT on the table, or on each
 * of the columns the query reads. */
static void check_select(Relation rel, const char *const *cols, int ncols)
{
    Oid relid = RelationGetRelid(rel);
    Oid user = GetUserId();
    int i;

    if (pg_class_aclcheck(relid, user, ACL_SELECT) != ACLCHECK_OK) {
        for (i = 0; i < ncols; i++) {
            AttrNumber att = get_attnum(relid, cols[i]);

            if (att == InvalidAttrNumber ||
                pg_attribute_aclcheck(relid, att, user, ACL_SELECT) != ACLCHECK_OK)
                aclcheck_error(ACLCHECK_NO_PRIV, OBJECT_TABLE, RelationGetRelationName(rel));
        }
    }
    if (rel->rd_rel->relrowsecurity && check_enable_rls(relid, InvalidOid, false) == RLS_ENABLED)
        pawln_schema_error(
            psprintf("row-level security applies to pawl.%s", RelationGetRelationName(rel)));
}

static void add_entry(read_entries *es, uint64 xid, int64 base, int32 klo, int32 khi)
{
    read_entry *e;

    if (es->n == es->cap) {
        if (es->cap >= (int)(MaxAllocSize / sizeof(read_entry) / 2))
            ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                            errmsg("pawl_api.read: too many appends in one read")));
        es->cap = es->cap ? es->cap * 2 : 64;
        es->v = es->v ? repalloc(es->v, sizeof(read_entry) * es->cap)
                      : palloc(sizeof(read_entry) * es->cap);
    }
    e = &es->v[es->n++];
    e->xid = xid;
    e->base = base;
    e->klo = klo;
    e->khi = khi;
}

/* An array of a run row, read in place when it has no NULLs (fixed-width elements, as unnest
 * reads them in storage order), else deconstructed. A NULL array has no elements (unnest); one
 * of several dimensions has all of its elements, flattened (unnest), and multi set (a single
 * subscript of it is NULL, which pawln_rarr_sub answers). copy: read a copy rather than in
 * place (an array stored inline lies in the slot's buffer, gone when the slot moves on). */
void pawln_rarr_init(pawln_rarr *ra, Datum v, bool isnull, Oid elemtype, int16 width, bool byval,
                     char align, const char *col, bool copy)
{
    ArrayType *a;

    memset(ra, 0, sizeof(*ra));
    ra->width = width;
    ra->lb = 1;
    if (isnull)
        return;
    a = copy ? DatumGetArrayTypePCopy(v) : DatumGetArrayTypeP(v);
    if (ARR_ELEMTYPE(a) != elemtype)
        pawln_schema_error(
            psprintf("runs.%s has elements of type %s", col, format_type_be(ARR_ELEMTYPE(a))));
    ra->multi = ARR_NDIM(a) > 1;
    if (ARR_NDIM(a) >= 1)
        ra->lb = ARR_LBOUND(a)[0];
    if (!ARR_HASNULL(a)) {
        ra->n = ArrayGetNItems(ARR_NDIM(a), ARR_DIMS(a));
        /* No NULLs: the data follow the header and the dimensions, aligned. */
        ra->raw = (const char *)a + ARR_OVERHEAD_NONULLS(ARR_NDIM(a));
    } else
        deconstruct_array(a, elemtype, width, byval, align, &ra->d, &ra->nulls, &ra->n);
}

/* Element i, 0-based in storage order, as an int64 (int4 and int8 elements; xid8 as its uint64
 * bits); false for NULL or past either end (unnest pads the shorter arrays with NULLs). */
bool pawln_rarr_at(const pawln_rarr *ra, int64 i, int64 *out)
{
    if (i < 0 || i >= ra->n)
        return false;
    if (ra->raw != NULL) {
        if (ra->width == 8) {
            int64 v;

            memcpy(&v, ra->raw + (size_t)i * 8, 8);
            *out = v;
        } else {
            int32 v;

            memcpy(&v, ra->raw + (size_t)i * 4, 4);
            *out = v;
        }
        return true;
    }
    if (ra->nulls[i])
        return false;
    *out = ra->width == 8 ? DatumGetInt64(ra->d[i]) : DatumGetInt32(ra->d[i]);
    return true;
}

/* The appends of one run row that have events in (lo, hi]: the SQL version's
 * a.base <= hi AND a.base + a.n > lo, and k in [greatest(0, lo + 1 - base), least(hi - base,
 * n - 1)], with its int8 arithmetic (an overflow is its error). */
static void run_entries(TupleTableSlot *slot, AttrNumber a_xids, AttrNumber a_bases,
                        AttrNumber a_ns, int64 lo, int64 hi, read_entries *es)
{
    pawln_rarr xids;
    pawln_rarr bases;
    pawln_rarr ns;
    bool isnull;
    Datum d;
    int len;
    int i;

    d = slot_getattr(slot, a_xids, &isnull);
    pawln_rarr_init(&xids, d, isnull, XID8OID, XID8_LEN, XID8_BYVAL, XID8_ALIGN, "xids", false);
    d = slot_getattr(slot, a_bases, &isnull);
    pawln_rarr_init(&bases, d, isnull, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
                    "bases", false);
    d = slot_getattr(slot, a_ns, &isnull);
    pawln_rarr_init(&ns, d, isnull, INT4OID, sizeof(int32), true, TYPALIGN_INT, "ns", false);
    len = Max(xids.n, Max(bases.n, ns.n));
    for (i = 0; i < len; i++) {
        int64 x;
        int64 base;
        int64 n;
        int64 end;
        int64 klo;
        int64 khi;

        if (!pawln_rarr_at(&bases, i, &base) || base > hi)
            continue;
        if (!pawln_rarr_at(&ns, i, &n))
            continue;
        check_add(base, n, &end);
        if (end <= lo)
            continue;
        if (!pawln_rarr_at(&xids, i, &x))
            continue;
        /* greatest(0, lo + 1 - base), least(hi - base, n - 1) */
        check_add(lo, 1, &klo);
        if (pg_sub_s64_overflow(klo, base, &klo) || pg_sub_s64_overflow(hi, base, &khi))
            ereport(ERROR,
                    (errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE), errmsg("bigint out of range")));
        klo = Max(klo, 0);
        khi = Min(khi, n - 1);
        if (klo > khi)
            continue;
        /* n is an int4, so both bounds lie in [0, PG_INT32_MAX) here. */
        add_entry(es, (uint64)x, base, (int32)klo, (int32)khi);
    }
}

static int cmp_entry(const void *a, const void *b)
{
    const read_entry *x = (const read_entry *)a;
    const read_entry *y = (const read_entry *)b;
    int64 xs = x->base + x->klo;
    int64 ys = y->base + y->klo;

    return xs < ys ? -1 : (xs > ys ? 1 : 0);
}

static int cmp_part(const void *a, const void *b)
{
    const read_part *x = (const read_part *)a;
    const read_part *y = (const read_part *)b;

    return x->lo < y->lo ? -1 : (x->lo > y->lo ? 1 : 0);
}

/* The partitions of pawl.events with their xid ranges (the table itself when it is not
 * partitioned), sorted by range; the default partition, if any, apart. Ranges that overlap
 * (a partitioning that is not pawl's, by range of xid) are refused. */
static void read_partitions(Relation events, read_parts *ps)
{
    part_range *r;
    int dflt = -1;
    int n;
    int i;

    memset(ps, 0, sizeof(*ps));
    r = pawln_event_partitions(events, pawln_column_of(events, "xid", XID8OID), &n);
    if (events->rd_rel->relkind == RELKIND_PARTITIONED_TABLE) {
        PartitionBoundInfo bi = RelationGetPartitionDesc(events, true)->boundinfo;

        if (bi != NULL)
            dflt = bi->default_index;
    }
    ps->v = palloc0(sizeof(read_part) * (n > 0 ? n : 1));
    for (i = 0; i < n; i++) {
        read_part *p;

        if (r[i].lo > r[i].hi)
            continue; /* an empty range holds nothing */
        if (i == dflt) {
            ps->dflt = palloc0(sizeof(read_part));
            p = ps->dflt;
        } else
            p = &ps->v[ps->n++];
        p->relid = r[i].relid;
        p->lo = r[i].lo;
        p->hi = r[i].hi;
    }
    if (ps->n > 1)
        qsort(ps->v, ps->n, sizeof(read_part), cmp_part);
    for (i = 1; i < ps->n; i++)
        if (ps->v[i].lo <= ps->v[i - 1].hi)
            pawln_schema_error("pawl.events is not partitioned by range of xid");
}

/* The partition that holds xid x, or NULL (ranges are disjoint; the default takes the rest). */
static read_part *read_part_of(read_parts *ps, uint64 x)
{
    int l = 0;
    int h = ps->n - 1;

    while (l <= h) {
        int m = l + (h - l) / 2;
        read_part *p = &ps->v[m];

        if (x < p->lo)
            h = m - 1;
        else if (x > p->hi)
            l = m + 1;
        else
            return p;
    }
    return ps->dflt;
}

static void read_part_open(read_part *p, Snapshot snap)
{
    AttrNumber cols[2];
    int i;

    p->rel = table_open(p->relid, AccessShareLock);
    cols[0] = pawln_column_of(p->rel, "xid", XID8OID);
    cols[1] = pawln_column_of(p->rel, "k", INT4OID);
    for (i = 0; i < READ_COLS - 1; i++)
        p->att[i] = pawln_column_of(p->rel, read_cols[i], read_types[i + 1]);
    p->irel = pawln_open_pkey(p->rel, cols, 2);
    p->slot = table_slot_create(p->rel, NULL);
    p->scan = index_beginscan(p->rel, p->irel, snap, 1, 0);
    /* The index tuples are read (their keys decide what is fetched), as an index-only scan does. */
    p->scan->xs_want_itup = true;
    p->positioned = false;
}

static void read_part_close(read_part *p)
{
    if (p->rel == NULL)
        return;
    index_endscan(p->scan);
    ExecDropSingleTupleTableSlot(p->slot);
    index_close(p->irel, NoLock);
    table_close(p->rel, NoLock);
    p->rel = NULL;
}

static int key_cmp(uint64 x1, int32 k1, uint64 x2, int32 k2)
{
    if (x1 != x2)
        return x1 < x2 ? -1 : 1;
    return k1 < k2 ? -1 : (k1 > k2 ? 1 : 0);
}

/* Position the scan at the first index tuple with (xid, k) >= (x, k): a row comparison, as for
 * WHERE (xid, k) >= (x, k); its members compare with the opclasses' order procedures. */
static void read_part_seek(read_part *p, uint64 x, int32 k)
{
    ScanKeyData key;

    /* The header is copied into the scan; the members stay where it points, in *p. */
    ScanKeyEntryInitialize(&p->row[0], SK_ROW_MEMBER, 1, BTGreaterEqualStrategyNumber, XID8OID,
                           InvalidOid, F_XID8CMP,
                           FullTransactionIdGetDatum(FullTransactionIdFromU64(x)));
    ScanKeyEntryInitialize(&p->row[1], SK_ROW_MEMBER | SK_ROW_END, 2, BTGreaterEqualStrategyNumber,
                           INT4OID, InvalidOid, F_BTINT4CMP, Int32GetDatum(k));
    ScanKeyEntryInitialize(&key, SK_ROW_HEADER, 1, BTGreaterEqualStrategyNumber, InvalidOid,
                           InvalidOid, InvalidOid, PointerGetDatum(p->row));
    index_rescan(p->scan, &key, 1, NULL, 0);
    p->positioned = true;
    p->sx = x;
    p->sk = k;
    p->exhausted = false;
    p->have = false;
    p->passed = false;
}

/* The tuple the scan is on, stepping to the next one when the current one was passed; false
 * at the end of the index. */
static bool read_part_peek(read_part *p)
{
    IndexTuple itup;
    TupleDesc itd;
    bool xnull;
    bool knull;
    Datum x;
    Datum k;

    if (p->have)
        return true;
    if (p->exhausted || index_getnext_tid(p->scan, ForwardScanDirection) == NULL) {
        p->exhausted = true;
        return false;
    }
    itup = p->scan->xs_itup;
    itd = p->scan->xs_itupdesc;
    if (itup == NULL)
        pawln_schema_error("the primary key of a partition of pawl.events returns no index tuples");
    x = index_getattr(itup, 1, itd, &xnull);
    k = index_getattr(itup, 2, itd, &knull);
    if (xnull || knull)
        ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
                        errmsg("pawl_api.read: a NULL key in the primary key of %s",
                               RelationGetRelationName(p->rel))));
    p->cx = U64FromFullTransactionId(DatumGetFullTransactionId(x));
    p->ck = DatumGetInt32(k);
    p->have = true;
    return true;
}

static void read_part_pass(read_part *p)
{
    p->have = false;
    p->passed = true;
    p->px = p->cx;
    p->pk = p->ck;
}

/* The events of one entry, in k order, into the result. */
static void read_entry_events(read_part *p, const read_entry *e, Tuplestorestate *ts, TupleDesc td)
{
    Datum values[READ_COLS];
    bool nulls[READ_COLS];
    int steps = 0;
    int i;

    /* The scan covers the keys from where it was positioned on, less those it has passed: one
     * that started after the entry's first event or has passed it (appends out of xid order)
     * is positioned again. */
    if (!p->positioned || key_cmp(p->sx, p->sk, e->xid, e->klo) > 0 ||
        (p->passed && key_cmp(p->px, p->pk, e->xid, e->klo) >= 0))
        read_part_seek(p, e->xid, e->klo);
    while (read_part_peek(p)) {
        CHECK_FOR_INTERRUPTS();
        if (key_cmp(p->cx, p->ck, e->xid, e->klo) < 0) {
            /* Another append's tuple (or an earlier event of this one): step over it, or, when
             * the entry lies far ahead, descend to it. */
            read_part_pass(p);
            if (++steps > READ_MAX_STEPS) {
                read_part_seek(p, e->xid, e->klo);
                steps = 0;
            }
            continue;
        }
        if (p->cx != e->xid || p->ck > e->khi)
            break; /* past this entry: the tuple stays for the next one */
        read_part_pass(p);
        /* The version visible to the snapshot, if any (a rolled-back insert leaves none). */
        if (!index_fetch_heap(p->scan, p->slot))
            continue;
        values[0] = Int64GetDatum(e->base + p->pk); /* within [base + klo, base + khi] */
        nulls[0] = false;
        for (i = 1; i < READ_COLS; i++)
            values[i] = slot_getattr(p->slot, p->att[i - 1], &nulls[i]);
        tuplestore_putvalues(ts, td, values, nulls);
    }
}

/*
 * Where the rows go. The executor copies a set-returning function's rows into a tuplestore and
 * frees it with the query; a tuplestore in the query's memory grows block by block (a 1000-row
 * read, about 200 kB) and gives the blocks back to malloc at the end, which on glibc grows and
 * trims the heap on every read: a fifth of the read's server time, measured. So the rows live
 * in a context of this backend's that keeps its first block (READ_ROWS_KEEP) across reads: the
 * tuplestore frees its rows when the executor ends it, and what a read abandoned on an error
 * is freed when the transaction ends (no function scan outlives its transaction: a holdable
 * cursor's rows are copied out, and its executor ended, before the commit's callbacks).
 */
#define READ_ROWS_KEEP (256 * 1024)
static MemoryContext read_rows_cxt = NULL;

static void read_rows_reset(XactEvent event, void *arg)
{
    (void)arg;
    if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT || event == XACT_EVENT_PREPARE ||
        event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_PARALLEL_ABORT)
        MemoryContextReset(read_rows_cxt);
}

/* InitMaterializedSRF's checks and set-up, with the tuplestore in read_rows_cxt; the result's
 * descriptor is a copy of desc, or without one the function's declared result type. */
void pawln_rows_begin(FunctionCallInfo fcinfo, TupleDesc desc)
{
    ReturnSetInfo *rsi = (ReturnSetInfo *)fcinfo->resultinfo;
    MemoryContext old;
    TupleDesc td;

    if (rsi == NULL || !IsA(rsi, ReturnSetInfo))
        ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                        errmsg("set-valued function called in context that cannot accept a set")));
    if (!(rsi->allowedModes & SFRM_Materialize))
        ereport(ERROR,
                (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                 errmsg("materialize mode required, but it is not allowed in this context")));
    if (read_rows_cxt == NULL) {
        read_rows_cxt =
            AllocSetContextCreate(TopMemoryContext, "pawl_api.read rows", READ_ROWS_KEEP,
                                  READ_ROWS_KEEP, ALLOCSET_DEFAULT_MAXSIZE);
        RegisterXactCallback(read_rows_reset, NULL);
    }
    /* The descriptor lives with the query, as the executor expects. */
    old = MemoryContextSwitchTo(rsi->econtext->ecxt_per_query_memory);
    if (desc != NULL)
        td = CreateTupleDescCopy(desc);
    else if (get_call_result_type(fcinfo, NULL, &td) != TYPEFUNC_COMPOSITE)
        elog(ERROR, "return type must be a row type");
    MemoryContextSwitchTo(read_rows_cxt);
    rsi->setResult =
        tuplestore_begin_heap((rsi->allowedModes & SFRM_Materialize_Random) != 0, false, work_mem);
    rsi->returnMode = SFRM_Materialize;
    rsi->setDesc = td;
    MemoryContextSwitchTo(old);
}

/* The declaration and the result row the caller expects. */
static void check_read_call(FunctionCallInfo fcinfo)
{
    ReturnSetInfo *rsi = (ReturnSetInfo *)fcinfo->resultinfo;
    int i;

    if (PG_NARGS() != 2 || !fcinfo->flinfo->fn_retset ||
        (fcinfo->flinfo->fn_expr != NULL && (get_fn_expr_argtype(fcinfo->flinfo, 0) != INT8OID ||
                                             get_fn_expr_argtype(fcinfo->flinfo, 1) != INT4OID)))
        ereport(ERROR, (errcode(ERRCODE_INVALID_FUNCTION_DEFINITION),
                        errmsg("pawl_read must be declared as pawl_api.read(int8, int4) RETURNS "
                               "TABLE (global_index int8, stream_id text, stream_seq int8, type "
                               "text, payload bytea, metadata jsonb, appended_at timestamptz, "
                               "event_id text)")));
    if (rsi != NULL && IsA(rsi, ReturnSetInfo) && rsi->expectedDesc != NULL) {
        bool ok = rsi->expectedDesc->natts == READ_COLS;

        for (i = 0; ok && i < READ_COLS; i++)
            ok = TupleDescAttr(rsi->expectedDesc, i)->atttypid == read_types[i];
        if (!ok)
            ereport(ERROR, (errcode(ERRCODE_DATATYPE_MISMATCH),
                            errmsg("pawl_api.read returns (global_index int8, stream_id text, "
                                   "stream_seq int8, type text, payload bytea, metadata jsonb, "
                                   "appended_at timestamptz, event_id text)")));
    }
}

Datum pawl_read(PG_FUNCTION_ARGS)
{
    static const char *const runs_read[] = {"last_index", "xids", "bases", "ns"};
    static const char *const events_read[] = {"xid",        "k",           "stream_id",
                                              "stream_seq", "type",        "payload",
                                              "metadata",   "appended_at", "event_id"};
    ReturnSetInfo *rsi;
    int64 after;
    int32 max_events;
    int64 w;
    int64 lo;
    int64 hi;
    Snapshot snap;
    Relation runs;
    Relation events;
    Relation irel;
    AttrNumber a_last;
    AttrNumber a_xids;
    AttrNumber a_bases;
    AttrNumber a_ns;
    TupleTableSlot *slot;
    IndexScanDesc scan;
    ScanKeyData key;
    read_entries es;
    read_parts ps;
    bool unsorted = false;
    int i;

    check_read_call(fcinfo);
    if (PG_ARGISNULL(0) || PG_GETARG_INT64(0) < 0)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("pawl_api.read: after_index must be >= 0")));
    if (PG_ARGISNULL(1) || PG_GETARG_INT32(1) < 1 || PG_GETARG_INT32(1) > 100000)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("pawl_api.read: max_events must be in 1..100000")));
    after = PG_GETARG_INT64(0);
    max_events = PG_GETARG_INT32(1);
    if (read_watermark(&w) && after < w - 1)
        pawln_below_watermark(w, after);

    rsi = (ReturnSetInfo *)fcinfo->resultinfo;
    lo = after;
    hi = after + Min((int64)max_events, PG_INT64_MAX - after); /* the last index wanted */
    snap = GetActiveSnapshot();

    /* The runs covering (lo, hi]: last_index > lo, up to the first with last_index >= hi. */
    runs = table_openrv(makeRangeVar("pawl", "runs", -1), AccessShareLock);
    check_select(runs, runs_read, lengthof(runs_read));
    events = table_openrv(makeRangeVar("pawl", "events", -1), AccessShareLock);
    check_select(events, events_read, lengthof(events_read));
    a_last = pawln_column_of(runs, "last_index", INT8OID);
    a_xids = pawln_column_of(runs, "xids", XID8ARRAYOID);
    a_bases = pawln_column_of(runs, "bases", INT8ARRAYOID);
    a_ns = pawln_column_of(runs, "ns", INT4ARRAYOID);
    irel = pawln_open_pkey(runs, &a_last, 1);
    slot = table_slot_create(runs, NULL);
    scan = index_beginscan(runs, irel, snap, 1, 0);
    ScanKeyInit(&key, 1, BTGreaterStrategyNumber, F_INT8GT, Int64GetDatum(lo));
    index_rescan(scan, &key, 1, NULL, 0);
    memset(&es, 0, sizeof(es));
    while (index_getnext_slot(scan, ForwardScanDirection, slot)) {
        bool isnull;
        int64 last = DatumGetInt64(slot_getattr(slot, a_last, &isnull));

        CHECK_FOR_INTERRUPTS();
        if (isnull || last <= lo)
            continue;
        run_entries(slot, a_xids, a_bases, a_ns, lo, hi, &es);
        if (last >= hi)
            break;
    }
    index_endscan(scan);
    ExecDropSingleTupleTableSlot(slot);
    index_close(irel, NoLock);
    table_close(runs, NoLock);

    /* In index order (ORDER BY 1). The ledger's appends never overlap: if they did, no order
     * of appends would be the order of the rows. */
    for (i = 1; i < es.n && !unsorted; i++)
        if (cmp_entry(&es.v[i - 1], &es.v[i]) > 0)
            unsorted = true;
    if (unsorted)
        qsort(es.v, es.n, sizeof(read_entry), cmp_entry);
    for (i = 1; i < es.n; i++)
        if (es.v[i - 1].base + es.v[i - 1].khi >= es.v[i].base + es.v[i].klo)
            ereport(ERROR,
                    (errcode(ERRCODE_DATA_CORRUPTED),
                     errmsg("pawl_api.read: the runs give index " INT64_FORMAT " to two appends",
                            es.v[i].base + es.v[i].klo)));

    pawln_rows_begin(fcinfo, NULL);
    if (es.n > 0) {
        pawln_runs_durable(snap); /* what it returns leaves the server durable */
        read_partitions(events, &ps);
        for (i = 0; i < es.n; i++) {
            read_part *p = read_part_of(&ps, es.v[i].xid);

            if (p == NULL)
                continue; /* no partition holds it (dropped): no rows, as in SQL */
            if (p->rel == NULL)
                read_part_open(p, snap);
            read_entry_events(p, &es.v[i], rsi->setResult, rsi->setDesc);
        }
        for (i = 0; i < ps.n; i++)
            read_part_close(&ps.v[i]);
        if (ps.dflt != NULL)
            read_part_close(ps.dflt);
    }
    table_close(events, NoLock);

    /* A drop that committed after the look above and before the scans took their locks: the
     * rows it dropped are missing from the result. Its watermark is visible now. */
    if (read_watermark(&w) && after < w - 1) {
        tuplestore_end(rsi->setResult);
        rsi->setResult = NULL;
        pawln_below_watermark(w, after);
    }
    return (Datum)0;
}
