/*
 * dead_letters.h — private interface of dead_letters.c: the bookkeeping of the dead-letter
 * policy (pawl/processor.h) that the work packages (package.c) consult. Never installed.
 *
 * dead_letters.c sits below package.c: it knows the package's fields (processor_int.h) but calls
 * nothing in package.c or the files above it (the list in processor_int.h). The package's step
 * decides when to park, retry or roll back; these functions keep the tables that say what is
 * parked.
 *
 * Threads: every pawl__dl_ function taking a package runs on that package's step (its worker,
 * one step at a time), which owns k->parked and the batch counters; the processor's table of
 * failed events' attempts (p->att) is shared by all packages and taken under p->mu here.
 */
#ifndef PAWL_ENGINE_DEAD_LETTERS_H
#define PAWL_ENGINE_DEAD_LETTERS_H

#include "processor_int.h"

/* Forget every parked stream of k (the array itself stays for reuse; pawl_free(k->parked) at
 * the end). */
void pawl__dl_clear(struct pkg *k);

/* Replace k's parked streams with rows[0..n) (the token store's dl_segment answer). 0 or
 * PAWL_ENOMEM (the table then holds the rows before the one that failed). */
int pawl__dl_load(struct pkg *k, const struct pawl_dead_stream *rows, size_t n);

/* Stream's retry committed its un-park of n letters: it flows again. */
void pawl__dl_unparked(struct pkg *k, const char *stream, size_t n);

/* The batch committed through end: its letters count, and failed events it covered are done. */
void pawl__dl_batch_committed(struct pkg *k, int64_t end);

/* The open batch rolled back: forget the parked streams it added (their letters went with it;
 * the batch handled again parks them again, with their attempts). */
void pawl__dl_batch_rolled_back(struct pkg *k);

/* A handler failed on e with rc (the batch is rolled back): count the attempt (k->lasterr says
 * why). Returns PKG_RERUN when e is to be parked now (handle the batch again at once), else rc. */
int pawl__dl_failed(struct pkg *k, const struct pawl_event *e, int rc);

/* Before handing e to the handlers: park it into txn if its stream is parked (from its first
 * letter on) or if it failed past the policy. Returns 1 (parked), 0 (handle it), or an error. */
int pawl__dl_maybe_park(struct pkg *k, struct pawl_txn *txn, const struct pawl_event *e);

#endif
