/* Run-time choice of the host's SIMD kernels. The shipped build targets the compiler's baseline
 * (no -march flag); kernels for wider instruction sets are compiled per function with
 * ACCEL_TARGET_AVX2 and picked at run time when the host supports them. ACCELSIM_PORTABLE=1 in
 * the environment forces the portable C kernels (the tests compare both paths). */
#ifndef ACCEL_SIMD_H
#define ACCEL_SIMD_H

#if defined(__GNUC__) && defined(__x86_64__) && !defined(ACCEL_NO_SIMD)
#define ACCEL_HAVE_AVX2 1
#define ACCEL_TARGET_AVX2 __attribute__((target("avx2")))
#else
#define ACCEL_HAVE_AVX2 0
#endif

/* 1 when the AVX2 kernels may run: compiled in, supported by this CPU, not disabled by
 * ACCELSIM_PORTABLE=1 (read on every call, so a test can switch between runs). */
int accel_use_avx2(void);

#endif
