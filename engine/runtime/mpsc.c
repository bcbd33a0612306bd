/*
 * mpsc.c — Vyukov's intrusive MPSC queue on C11 atomics over plain fields (PAWL_ATOMIC_OF, so
 * the public structs that embed a queue stay usable from C++).
 *
 * Invariant: q->_head is the last node pushed (or the stub); following link fields from q->_tail
 * reaches q->_head, except for one missing link per producer that has exchanged _head but not
 * yet stored its predecessor's link. A chain (pawl__mpsc_push_chain_mp) is linked inside before its
 * exchange, so it behaves as one node with a longer body: still one missing link at most. The stub
 * is re-pushed by the consumer whenever it would otherwise have to take the last real node, so a
 * node is only handed out once its successor exists and the consumer never touches a node after
 * returning it.
 *
 * _head == &_stub does not mean "empty": when the consumer re-pushes the stub behind the last
 * node it sees, a producer may have exchanged _head just before it (its node not linked yet);
 * the stub then lands behind that node, _head is the stub, and two nodes are still queued.
 */
#include "mpsc.h"

#include "common.h"

#include <stddef.h>

void pawl__mpsc_init(struct pawl_mpsc_ *q)
{
    q->_stub = NULL;
    q->_head = &q->_stub;
    q->_tail = &q->_stub;
}

void pawl__mpsc_push_chain_mp(struct pawl_mpsc_ *q, void **first, void **last)
{
    PAWL_ASSERT(q != NULL && first != NULL && last != NULL);
    /* Relaxed: the release exchange below publishes this store together with the chain. */
    atomic_store_explicit(PAWL_ATOMIC_OF(last), NULL, memory_order_relaxed);
    /* Acq_rel: release publishes the chain (its nodes' contents and inner links) to the
     * consumer; acquire orders the link store below after any earlier producer's
     * initialisation of prev. */
    void **prev = atomic_exchange_explicit(PAWL_ATOMIC_OF(&q->_head), last, memory_order_acq_rel);
    /* Release: the consumer that loads this link (acquire) sees everything we wrote before it:
     * the nodes' contents and the chain's inner links, so its acquire loads of those links
     * find them set. */
    atomic_store_explicit(PAWL_ATOMIC_OF(prev), (void *)first, memory_order_release);
}

void pawl__mpsc_push_mp(struct pawl_mpsc_ *q, void **node)
{
    pawl__mpsc_push_chain_mp(q, node, node);
}

void **pawl__mpsc_pop_sc(struct pawl_mpsc_ *q)
{
    void **tail = q->_tail;
    PAWL_ASSERT(tail != NULL && "pawl__mpsc_pop_sc on a queue that was never initialised");
    /* Acquire: pairs with the producer's release link store; the next node's contents follow. */
    void **next = atomic_load_explicit(PAWL_ATOMIC_OF(tail), memory_order_acquire);
    if (tail == &q->_stub) {
        if (next == NULL) {
            /* Acquire: a producer may have exchanged _head without linking the stub yet. */
            return atomic_load_explicit(PAWL_ATOMIC_OF(&q->_head), memory_order_acquire) == tail
                       ? NULL
                       : PAWL_MPSC_BUSY;
        }
        q->_tail = next;
        tail = next;
        /* Acquire: as above, for the node after the first real one. */
        next = atomic_load_explicit(PAWL_ATOMIC_OF(tail), memory_order_acquire);
    }
    if (next != NULL) {
        q->_tail = next;
        return tail;
    }
    /* Acquire: see whether tail is really the last node or a producer is mid-push. */
    void **head = atomic_load_explicit(PAWL_ATOMIC_OF(&q->_head), memory_order_acquire);
    if (tail != head)
        return PAWL_MPSC_BUSY;
    pawl__mpsc_push_mp(q, &q->_stub);
    /* Acquire: tail's link is now the stub, or a producer that got in between. */
    next = atomic_load_explicit(PAWL_ATOMIC_OF(tail), memory_order_acquire);
    if (next != NULL) {
        q->_tail = next;
        return tail;
    }
    return PAWL_MPSC_BUSY;
}
