/*
 * serial.c — serial executors: an MPSC queue of tasks plus a count, drained by one pool task.
 *
 * Invariant: _count is at least the number of tasks queued and not yet run (a submitter counts
 * its task before pushing it). The submitter that moves it from 0 to 1 schedules the drain
 * task on the pool; the drain runs queued tasks, then subtracts
 * what it ran, and only if tasks remain does it reschedule itself. So at most one drain is ever
 * scheduled or running (mutual exclusion without a lock), tasks run in queue order (the order
 * of the producers' exchanges on the queue head), and an executor costs nothing while idle.
 *
 * The drain yields after PAWL_SERIAL_BATCH tasks by re-queueing itself at the back of the pool's
 * shared FIFO, so a busy executor cannot monopolise a worker. If it meets an item still being
 * linked by a producer (see mpsc.h), it spins briefly and then yields the same way rather than
 * wait for a possibly preempted producer.
 *
 * After the drain's final decrement it never touches the executor again: the owner may then
 * pawl_serial_fini and free it.
 *
 * Threads: submit from anywhere; init/fini by the owner while nothing is queued.
 */
#include "serial.h"

#include "common.h"
#include "mpsc.h"
#include "pool.h"

#include <string.h>

static void drain(struct pawl_task *task, int status);

int pawl_serial_init(struct pawl_serial *s, struct pawl_pool *pool)
{
    if (s == NULL || pool == NULL)
        return PAWL_EINVAL;
    memset(s, 0, sizeof(*s));
    pawl__mpsc_init(&s->_q);
    s->_pool = pool;
    s->_drain.fn = drain;
    return 0;
}

void pawl_serial_fini(struct pawl_serial *s)
{
    if (s == NULL)
        return;
    /* Acquire: pairs with the drain's final release decrement. */
    uint64_t left = atomic_load_explicit(PAWL_ATOMIC_OF(&s->_count), memory_order_acquire);
    if (left != 0)
        PAWL_ERROR("serial", "pawl_serial_fini with %llu tasks still queued",
                   (unsigned long long)left);
    PAWL_ASSERT(left == 0 && "pawl_serial_fini while tasks are queued or running");
    s->_pool = NULL;
}

int pawl_serial_submit(struct pawl_serial *s, struct pawl_task *t)
{
    if (PAWL_UNLIKELY(s == NULL || t == NULL || t->fn == NULL))
        return PAWL_EINVAL;
    /* Count before pushing: the drain may pop t the moment it is linked, and it must never
     * subtract a task that was not counted yet (the count would dip to 0 with a drain still
     * scheduled, and the next submitter would schedule a second one). Acq_rel: the acquire
     * side orders us after a drain's final decrement, so a 0 means no drain is scheduled. */
    uint64_t old = atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&s->_count), 1, memory_order_acq_rel);
    pawl__mpsc_push_mp(&s->_q, &t->_next);
    if (old == 0)
        return pawl_pool_submit(s->_pool, &s->_drain);
    return 0;
}

bool pawl_serial_idle(const struct pawl_serial *s)
{
    /* Acquire: pairs with the drain's final release decrement, after which it never touches s. */
    return atomic_load_explicit(PAWL_ATOMIC_OF(&s->_count), memory_order_acquire) == 0;
}

uint64_t pawl_serial_ran(const struct pawl_serial *s)
{
    /* Relaxed: statistics. */
    return atomic_load_explicit(PAWL_ATOMIC_OF(&s->_ran), memory_order_relaxed);
}

static void drain(struct pawl_task *task, int status)
{
    struct pawl_serial *s = PAWL_CONTAINER_OF(task, struct pawl_serial, _drain);
    struct pawl_pool *pool = s->_pool;
    uint64_t ran = 0;
    int spins = 0;
    /* Cancelled drains (pool shutdown) cancel every queued task; running ones take a batch. */
    while (status != 0 || ran < PAWL_SERIAL_BATCH) {
        void **link = pawl__mpsc_pop_sc(&s->_q);
        if (link == NULL)
            break; /* a counted task not pushed yet makes left > 0: we come back for it */
        if (link == PAWL_MPSC_BUSY) {
            if (++spins < 128) {
                pawl_cpu_relax();
                continue;
            }
            break; /* a preempted producer: yield below and come back */
        }
        spins = 0;
        struct pawl_task *t = PAWL_CONTAINER_OF(link, struct pawl_task, _next);
        /* Relaxed: statistics; single writer (the one running drain). */
        atomic_store_explicit(PAWL_ATOMIC_OF(&s->_ran), s->_ran + 1, memory_order_relaxed);
        ran++;
        t->fn(t, status);
    }
    /* Acq_rel: release publishes our consumer-side queue state to the next drain (which may
     * run on another worker); acquire pairs with submitters' increments. */
    uint64_t left =
        (atomic_fetch_sub_explicit(PAWL_ATOMIC_OF(&s->_count), ran, memory_order_acq_rel) - ran);
    PAWL_ASSERT(left < UINT64_MAX / 2); /* never more run than were counted in */
    if (left > 0)
        pawl__pool_yield(pool, &s->_drain);
}
