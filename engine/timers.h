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

void pawl_timer_hold_(struct pawl_timer *t);
void pawl_timer_unhold_(struct pawl_timer *t); /* may call t->_idle_fn(t), which may free t */

#endif
