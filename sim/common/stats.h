/* Helpers for cycle accounting shared by the timed simulators. */
#ifndef ACCEL_COMMON_STATS_H
#define ACCEL_COMMON_STATS_H

#include <math.h>
#include <stdint.h>

#include "common/mem.h"

/* Default cycle budget when the caller passes 0: about 52 s of device time at 333 MHz. */
#define ACCEL_DEFAULT_MAX_CYCLES (UINT64_C(1) << 34)
/* Largest budget accepted; larger requests are clamped so double<->uint64 conversions stay exact
 * enough and never overflow. */
#define ACCEL_MAX_MAX_CYCLES (UINT64_C(1) << 62)

/* Cycles of a DMA transfer: latency + ceil(bytes / bytes_per_cycle), at least 1. Saturates at
 * UINT64_MAX (callers compare against the budget). bytes_per_cycle must be > 0. */
static inline uint64_t accel_dma_cycles(uint64_t bytes, double bytes_per_cycle, uint64_t latency)
{
    double c = ceil((double)bytes / bytes_per_cycle);
    uint64_t t;
    if (!(c < 1.8e19))
        return UINT64_MAX;
    t = accel_sat_add(latency, (uint64_t)c);
    return t ? t : 1;
}

/* Cycles of a compute instruction: iterations * cycles_per_iter + latency, at least 1. */
static inline uint64_t accel_compute_cycles(uint64_t iters, uint64_t cycles_per_iter, uint64_t latency)
{
    uint64_t t = accel_sat_add(accel_sat_mul(iters, cycles_per_iter), latency);
    return t ? t : 1;
}

#endif
