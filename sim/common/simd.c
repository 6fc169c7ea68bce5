/* Run-time dispatch of the SIMD kernels (see simd.h). */
#include "common/simd.h"

#include <stdlib.h>
#include <string.h>

#if ACCEL_HAVE_AVX2
/* The level ACCELSIM_SIMD caps the kernels to: 0 "c", 1 "avx2", 2 otherwise (the best the CPU
 * has). */
static int env_cap(void)
{
    const char *env = getenv("ACCELSIM_SIMD");
    if (env && strcmp(env, "c") == 0)
        return 0;
    if (env && strcmp(env, "avx2") == 0)
        return 1;
    return 2;
}
#endif

int accel_use_avx2(void)
{
#if ACCEL_HAVE_AVX2
    static int cpu = -1;
    if (env_cap() < 1)
        return 0;
    if (cpu < 0) {
        __builtin_cpu_init();
        cpu = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return cpu;
#else
    return 0;
#endif
}

int accel_use_vnni(void)
{
#if ACCEL_HAVE_VNNI
    static int cpu = -1;
    if (env_cap() < 2 || !accel_use_avx2())
        return 0;
    if (cpu < 0)
        cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vnni");
    return cpu;
#else
    return 0;
#endif
}
