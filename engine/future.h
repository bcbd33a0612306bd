/*
 * future.h — private hooks of futures for the runtime's own combinators: an "inline"
 * continuation runs on the completing thread. Only runtime-internal code that is short, never
 * blocks and runs no user code may use it (it completes other futures, counts, cancels a timer).
 */
#ifndef PAWL_ENGINE_FUTURE_H
#define PAWL_ENGINE_FUTURE_H

#include "pawl/runtime.h"

/* Like pawl_future_on_complete, but cb runs on the completing thread (or on the calling thread
 * if f is already done). 0 or PAWL_ENOMEM. */
int pawl_future_on_complete_inline(struct pawl_future *f, pawl_future_cb cb, void *arg);

#endif
