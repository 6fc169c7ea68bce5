/* Bounds-checked memory helpers: overflow-safe range checks, checked allocation, little-endian
 * loads/stores that do not depend on host endianness or alignment. */
#ifndef ACCEL_COMMON_MEM_H
#define ACCEL_COMMON_MEM_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* True when [base, base + len) lies inside [0, size), without overflow. */
static inline int accel_range_ok(uint64_t base, uint64_t len, uint64_t size)
{
    return base <= size && len <= size - base;
}

/* a * b, or UINT64_MAX when the product does not fit. */
static inline uint64_t accel_sat_mul(uint64_t a, uint64_t b)
{
    if (a != 0 && b > UINT64_MAX / a)
        return UINT64_MAX;
    return a * b;
}

static inline uint64_t accel_sat_add(uint64_t a, uint64_t b)
{
    return (b > UINT64_MAX - a) ? UINT64_MAX : a + b;
}

/* ceil(a / b). Division by zero cannot crash: it saturates to UINT64_MAX like the other helpers
 * here (an "infinite" count that fails the callers' range and cycle-budget checks). */
static inline uint64_t accel_ceil_div(uint64_t a, uint64_t b)
{
    return b ? a / b + (a % b != 0) : UINT64_MAX;
}

/* calloc(n, size) that returns NULL instead of overflowing; also NULL for more than SIZE_MAX. */
static inline void *accel_calloc(uint64_t n, uint64_t size)
{
    uint64_t total = accel_sat_mul(n, size);
    if (total == UINT64_MAX || total > (uint64_t)SIZE_MAX)
        return NULL;
    if (total == 0)
        total = 1;
    return calloc((size_t)total, 1);
}

static inline uint32_t accel_ld_u32le(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint64_t accel_ld_u64le(const uint8_t *p)
{
    return (uint64_t)accel_ld_u32le(p) | ((uint64_t)accel_ld_u32le(p + 4) << 32);
}

static inline void accel_st_u32le(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* Bits [lo, lo + width) of w, width in 1..63. */
static inline uint64_t accel_bits(uint64_t w, unsigned lo, unsigned width)
{
    return (w >> lo) & ((UINT64_C(1) << width) - 1);
}

/* Two's-complement reinterpretation without implementation-defined conversions. */
static inline int32_t accel_as_i32(uint32_t u)
{
    return u <= (uint32_t)INT32_MAX ? (int32_t)u : (int32_t)(u - UINT32_C(2147483648)) - INT32_MAX - 1;
}

#endif
