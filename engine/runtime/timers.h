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

void pawl__timer_hold(struct pawl_timer *t);
void pawl__timer_unhold(struct pawl_timer *t); /* may call t->_idle_fn(t), which may free t */

/*
 * A condition-variable wait whose deadline is a runtime timer, so that every timed wait in the
 * library runs on the timers (io_uring timeouts, or the timerfd fallback): the caller sleeps on
 * cv without a timeout, and an inline one-shot timer (its callback runs on the timers thread and
 * only broadcasts cv under mu) wakes it after delay_ns. The caller holds mu; returns after a
 * broadcast (by anyone) or the deadline, spurious wake-ups included, like
 * pthread_cond_timedwait. Any number of threads may wait on one cv at once. tm NULL (or shut
 * down) falls back to pthread_cond_timedwait on clock (cv's clock). Once it has returned, the
 * timers never touch mu or cv again (a deadline that fell due meanwhile is waited out), so the
 * caller may destroy them at once; tm must outlive every wait on it.
 */
void pawl__timed_wait(struct pawl_timers *tm, pthread_mutex_t *mu, pthread_cond_t *cv,
                      clockid_t clock, int64_t delay_ns);

#endif
