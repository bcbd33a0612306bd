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
 * An inline one-shot timer for the runtime's own layers above core (the store's delayed append
 * retries and group linger): its callback runs on the timers thread itself, so it works on a
 * timers object without a pool, and pawl__timer_start_ns takes its delay in nanoseconds
 * (pawl_timer_start's milliseconds are too coarse for a linger of microseconds). The callback
 * must be short and must not block: every other timer of the object waits for it. It may start
 * its timer again. pawl__timer_start_ns returns what pawl_timer_start does (PAWL_EBUSY while the
 * timer is armed, PAWL_ESHUTDOWN once the timers object is stopping); pawl_timer_cancel cancels.
 * The timers thread still holds the timer for an instant after the callback returns: its memory
 * may be reused or freed only once pawl_timer_busy() says 0 (or after pawl_timers_free).
 */
void pawl__timer_init_inline(struct pawl_timer *t, pawl_timer_fn cb, void *arg);
int pawl__timer_start_ns(struct pawl_timers *tm, struct pawl_timer *t, int64_t delay_ns);

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
