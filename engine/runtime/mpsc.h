/*
 * mpsc.h — an intrusive, unbounded, lock-free multi-producer single-consumer queue (Dmitry
 * Vyukov's design): push is one atomic exchange plus one release store, wait-free for producers
 * (and so is pushing a pre-linked chain of nodes: the same two operations for the whole chain);
 * pop is for one consumer at a time and never blocks, but may find the queue momentarily
 * inconsistent while a producer sits between its exchange and its link store (then it reports
 * "busy": the item will be visible within a few instructions of that producer).
 *
 * A node is the address of a `void *` link field inside the caller's object (pawl_task._next,
 * pawl_timer._cmd_next); the queue stores link addresses only, so objects of any type can be
 * queued without type punning. The caller owns the nodes; a node may be queued on at most one
 * queue at a time. The queue struct lives in the public header (pawl_mpsc_) because serial
 * executors embed it; it must not be moved once initialised (the stub's address is in it).
 *
 * Threads, in the names (ConcurrencyKit style): the _mp functions (pawl__mpsc_push_mp,
 * pawl__mpsc_push_chain_mp) from any number of producers at once; pawl__mpsc_pop_sc from the one
 * consumer (or whoever holds the consumer role through an external try-lock).
 *
 * There is deliberately no emptiness test for other threads: the producers' end can be the stub
 * while nodes are still queued (see mpsc.c), so callers that must know whether work is waiting
 * (to decide whether to sleep) keep their own count, incremented before the push.
 */
#ifndef PAWL_ENGINE_MPSC_H
#define PAWL_ENGINE_MPSC_H

#include "pawl/runtime.h"

#include <stdbool.h>

#define PAWL_MPSC_BUSY ((void **)1) /* pop: an item is being linked; retry shortly */

void pawl__mpsc_init(struct pawl_mpsc_ *q);

/* Append node (the address of its link field). Any thread. */
void pawl__mpsc_push_mp(struct pawl_mpsc_ *q, void **node);

/*
 * Append the chain first .. last in one step: the caller has already linked it (each node's link
 * field holds the next node, stored with a relaxed atomic store, before this call); last's link
 * is overwritten. The consumer sees the nodes in chain order, and no other producer's node
 * between them. first == last is a single push. Any thread.
 */
void pawl__mpsc_push_chain_mp(struct pawl_mpsc_ *q, void **first, void **last);

/* Take the oldest node: its link address, NULL when empty, or PAWL_MPSC_BUSY. Consumer only. */
void **pawl__mpsc_pop_sc(struct pawl_mpsc_ *q);

#define PAWL_CONTAINER_OF(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#endif
