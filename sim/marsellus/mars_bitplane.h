/* The RBE's bit-plane layouts in portable C, shared by the executors (mars_exec.c) and the RBE
 * weight cache (mars_rbe_cache.c): a group of 32 channels is stored as `bits` 32-bit words, word
 * b holding bit b of the 32 values (channel j at bit j). The AVX2 versions are in
 * mars_rbe_simd.c. */
#ifndef ACCEL_MARS_BITPLANE_H
#define ACCEL_MARS_BITPLANE_H

#include <stdint.h>

#include "common/mem.h"

/* The eight bits of x spread to the low bit of eight bytes (bit k -> byte k): the multiply places
 * bit k (k < 7) at bit 8k without overlapping terms, bit 7 is moved on its own. */
static inline uint64_t mars_spread8(uint32_t x)
{
    return (((uint64_t)(x & 0x7fu) * UINT64_C(0x0002040810204081)) & UINT64_C(0x0101010101010101)) |
           ((uint64_t)(x & 0x80u) << 49);
}

/* The low bits of eight bytes gathered into one byte (byte k -> bit k), mars_spread8's inverse:
 * the multiply sums byte k's bit into bit 56 + k with no carries (exact for all 256 patterns). */
static inline uint32_t mars_gather8(uint64_t x)
{
    return (uint32_t)((x * UINT64_C(0x0102040810204080)) >> 56);
}

/* v[j] = sum_b bit j of plane b << b for the 32 lanes of `bits` 32-bit planes stride bytes apart. */
static inline void mars_planes_to_values(const uint8_t *base, uint64_t stride, int bits, uint8_t v[32])
{
    uint64_t q[4] = {0, 0, 0, 0};
    for (int b = 0; b < bits; b++) {
        const uint32_t word = accel_ld_u32le(base + (uint64_t)b * stride);
        for (int i = 0; i < 4; i++)
            q[i] |= mars_spread8(word >> (8 * i)) << b;
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 8; j++)
            v[8 * i + j] = (uint8_t)(q[i] >> (8 * j));
}

#endif
