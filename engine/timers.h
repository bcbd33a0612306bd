/*
 * timers.h — private hooks of the timers module for the runtime's combinators.
 *
 * A timer's busy count says whether the runtime still references it. Runtime-internal owners of
 * a timer (pawl_future_or_timeout) take an extra hold of their own and set the timer's _idle_fn,
 * which is called exactly when the count drops to zero — on whichever thread drops it (the
 * timers thread, a pool worker after the callback, or the owner itself).
 */
#ifndef PAWL_ENGINE_TIMERS_H
#define PAWL_ENGINE_TIMERS_H

#include "pawl/runtime.h"

#include <pthread.h>

void pawl_timer_hold_(struct pawl_timer *t);
void pawl_timer_unhold_(struct pawl_timer *t); /* may call t->_idle_fn(t), which may free t */

/*
 * A condition-variable wait whose deadline is a runtime timer, so that every timed wait in the
 * library runs on the timers (io_uring timeouts, or the timerfd fallback): the waiter sleeps on
 * the condition variable without a timeout, and an inline one-shot timer (its callback runs on
 * the timers thread and only broadcasts the condition under the mutex) wakes it at the
 * deadline. One waiter per object at a time. init: mu and cv are the caller's and outlive w.
 * wait: the caller holds mu; returns after a broadcast (by anyone) or the deadline, spurious
 * wake-ups included, like pthread_cond_timedwait; tm NULL (or shut down) falls back to a plain
 * timed wait. fini: waits until the timers no longer reference w (call it while tm is alive,
 * or after pawl_timers_free), before mu and cv are destroyed.
 */
struct pawl_timed_cond {
    struct pawl_timer t;
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
};
void pawl_timed_cond_init(struct pawl_timed_cond *w, pthread_mutex_t *mu, pthread_cond_t *cv);
void pawl_timed_cond_wait(struct pawl_timers *tm, struct pawl_timed_cond *w, int64_t delay_ns);
void pawl_timed_cond_fini(struct pawl_timed_cond *w);

#endif
