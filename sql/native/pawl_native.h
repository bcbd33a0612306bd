/*
 * pawl_native.h: what the files of pawl_native share. pawl_native.c holds the finalization run,
 * the guards and the read; append.c the append; read_filtered.c the stream and filtered reads.
 * The helpers here find pawl's relations and columns without the caller's search_path and refuse
 * a schema they were not written for. Their names carry the pawln_ prefix: the module's global
 * symbols share the server's namespace.
 */
#ifndef PAWL_NATIVE_H
#define PAWL_NATIVE_H

#include "postgres.h"

#include "access/xlogdefs.h"
#include "fmgr.h"
#include "storage/lockdefs.h"
#include "utils/acl.h"
#include "utils/relcache.h"
#include "utils/snapshot.h"

/* One partition of pawl.events and the xids it may hold, [lo, hi] inclusive. */
typedef struct part_range {
    Oid relid;
    uint64 lo;
    uint64 hi;
} part_range;

/* One int4, int8 or xid8 array of a pawl.runs row (pawl_native.c says how it is read). */
typedef struct pawln_rarr {
    int n;           /* elements, every dimension's */
    int lb;          /* the first dimension's lower bound */
    bool multi;      /* more than one dimension */
    int width;       /* 4 or 8 bytes */
    const char *raw; /* n elements in place (no NULLs), or NULL: then d and nulls */
    Datum *d;
    bool *nulls;
} pawln_rarr;

void pawln_rarr_init(pawln_rarr *ra, Datum v, bool isnull, Oid elemtype, int16 width, bool byval,
                     char align, const char *col, bool copy);
bool pawln_rarr_at(const pawln_rarr *ra, int64 i, int64 *out);

/* An error (55000) naming what in the pawl schema is not as this module expects. */
void pawln_schema_error(const char *what) pg_attribute_noreturn();

/* The attribute of rel named name, of type typid; pawln_schema_error when there is none. */
AttrNumber pawln_column_of(Relation rel, const char *name, Oid typid);
/* The same, or 0 when rel has no such column (a column a later schema added). */
AttrNumber pawln_column_if(Relation rel, const char *name, Oid typid);

/* pawl.<name> opened with lockmode, after the checks a statement reading it would make: the
 * current user's right need, and no row-level security applying. */
Relation pawln_open_table(const char *name, LOCKMODE lockmode, AclMode need);

/* The primary key index of rel, checked to be a btree whose leading key columns are cols. */
Relation pawln_open_pkey(Relation rel, const AttrNumber *cols, int ncols);

/* The leaf partitions of pawl.events with the xid range each can hold (copied). */
part_range *pawln_event_partitions(Relation events, AttrNumber a_xid, int *nparts);

/* The refusal of a read after index after below the low-watermark w (PW020, the SQL readers'
 * message, detail and hint). */
void pawln_below_watermark(int64 w, int64 after) pg_attribute_noreturn();

/* A read's result: the checks InitMaterializedSRF makes, then the caller's tuplestore
 * (rsinfo->setResult, setDesc) in a context of this backend's that keeps its first block across
 * reads and is reset when the transaction ends. setDesc is a copy of desc (the caller checked it
 * is the read's row), or without one the function's declared result type. */
void pawln_rows_begin(FunctionCallInfo fcinfo, TupleDesc desc);

/* Durable runs (pawl_native.c). A finalization run may commit without flushing its WAL (see
 * pawl.run_commit_wait); whatever returns what runs assigned flushes first. pawln_flush_to:
 * WAL flushed up to lsn, after waiting up to wait_us for another session to flush it.
 * pawln_runs_durable: the newest run visible under snap durable (its commit flushed). */
void pawln_flush_to(XLogRecPtr lsn, int wait_us);
void pawln_runs_durable(Snapshot snap);
/* An append wrote rows: at its transaction's commit (after the commit's own flush), wake the
 * run commits waiting for a flush (pawln_flush_to), so that they need not poll for it. */
void pawln_wake_runs_at_commit(void);

#endif
