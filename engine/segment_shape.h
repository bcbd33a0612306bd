/* Temporary: the segment's shape until pawl/processor.h lands (removed at the merge). */
#ifndef PAWL_SEGMENT_SHAPE_H
#define PAWL_SEGMENT_SHAPE_H
#include <stdint.h>
struct pawl_segment {
    uint32_t id;
    uint32_t mask;
};
#endif
