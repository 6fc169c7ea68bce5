/* Run-time dispatch of the SIMD kernels (see simd.h). */
#include "common/simd.h"

#include <stdlib.h>
#include <string.h>

int accel_use_avx2(void)
{
#if ACCEL_HAVE_AVX2
    static int cpu = -1;
    const char *env = getenv("ACCELSIM_PORTABLE");
    if (env && strcmp(env, "1") == 0)
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
