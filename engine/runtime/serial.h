/*
 * serial.h — private helpers of serial executors (none needed by other modules today; the
 * public API is in pawl/runtime.h). Kept so the module is a file pair like every other.
 */
#ifndef PAWL_ENGINE_SERIAL_H
#define PAWL_ENGINE_SERIAL_H

#include "pawl/runtime.h"

/* Tasks a drain runs before yielding its worker to other work. */
#define PAWL_SERIAL_BATCH 64

#endif
