/*
 * pawl.h — the whole embeddable API of pawl: a forward-only event log and pooled streaming
 * processors on PostgreSQL. Include this header only; the pieces under pawl/ are split by topic
 * for reading, not for separate use.
 */
#ifndef PAWL_H
#define PAWL_H

#include "pawl/checkpoint.h"
#include "pawl/common.h"
#include "pawl/config.h"
#include "pawl/event.h"
#include "pawl/log.h"
#include "pawl/metrics.h"
#include "pawl/processor.h"
#include "pawl/runtime.h"

#endif
