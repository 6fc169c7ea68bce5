/* Run-time choice of the host's SIMD kernels. The shipped build targets the compiler's baseline
 * (no -march flag); kernels for wider instruction sets are compiled per function with
 * ACCEL_TARGET_AVX2 / ACCEL_TARGET_VNNI and picked at run time when the host supports them.
 * ACCELSIM_SIMD=c (or avx2) in the environment caps the choice at the portable C kernels (or at
 * AVX2); the tests compare every level. */
#ifndef ACCEL_SIMD_H
#define ACCEL_SIMD_H

#if defined(__GNUC__) && defined(__x86_64__) && !defined(ACCEL_NO_SIMD)
#define ACCEL_HAVE_AVX2 1
#define ACCEL_TARGET_AVX2 __attribute__((target("avx2")))
#else
#define ACCEL_HAVE_AVX2 0
#endif

/* AVX-512 VNNI (vpdpwssd); GCC >= 8 and Clang >= 6 know the target names */
#if ACCEL_HAVE_AVX2 && (defined(__clang__) ? __clang_major__ >= 6 : __GNUC__ >= 8)
#define ACCEL_HAVE_VNNI 1
#define ACCEL_TARGET_VNNI __attribute__((target("avx2,avx512f,avx512bw,avx512vnni")))
#else
#define ACCEL_HAVE_VNNI 0
#endif

/* 1 when the AVX2 kernels may run: compiled in, supported by this CPU, not capped by
 * ACCELSIM_SIMD (read on every call, so a test can switch between runs). */
int accel_use_avx2(void);
/* 1 when the AVX-512 VNNI kernels may run (as accel_use_avx2, and the CPU has AVX-512 F, BW and
 * VNNI). */
int accel_use_vnni(void);

#endif
