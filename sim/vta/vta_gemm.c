/* VTA GEMM execution: micro-op loops over (iter_out, iter_in, uop) with shape-specialised
 * kernels. Two functional paths give the same ACC contents:
 *
 * - portable C: acc[b][o] += sum_k inp[b][k] * wgt[o][k] on the WGT SRAM as stored;
 * - AVX2 (picked at run time, see common/simd.h): vpmaddwd on a copy of the WGT SRAM kept in
 *   "pair" layout, [entry][k/2][o] int32 holding (int16 w[o][k], int16 w[o][k+1]), refreshed by
 *   every LOAD / padding write of WGT (vta_wgt_sync). One input pair broadcast against one pair
 *   row gives block_out partial sums at once, so no horizontal reduction is needed.
 *
 * Both sum in exact int32 (block_in <= 64, |product| <= 2^14) and add into ACC modulo 2^32, in the
 * same (iter_out, iter_in, uop) order; the cycle model (vta_exec.c) does not depend on the path. */
#include <string.h>

#include "common/mem.h"
#include "common/simd.h"
#include "vta/vta_internal.h"

#if ACCEL_HAVE_AVX2
#include <immintrin.h>
#endif

#if defined(__GNUC__)
#define VTA_INLINE static inline __attribute__((always_inline))
#else
#define VTA_INLINE static inline
#endif

typedef struct {
    uint32_t *acc;
    const int8_t *inp, *wgt;
    const int32_t *pairs;
    const uint32_t *ud, *us, *uw;
    uint64_t nu, iter_out, iter_in;
    uint64_t dfo, dfi, sfo, sfi, wfo, wfi; /* pre-multiplied by entry sizes */
} gemm_args;

/* ------------------------------------------------------------------------------------------ */
/* WGT pair layout                                                                            */

static int pairs_supported(const vta_geom *g)
{
    return g->block_in % 8 == 0 && g->block_in <= 64 && g->block_out % 8 == 0;
}

int vta_gemm_init(vta_state *s)
{
    s->pairs = NULL;
    if (!accel_use_avx2() || !pairs_supported(&s->g))
        return ACCEL_OK;
    /* one int32 per two int8 weights: twice the bytes of the WGT SRAM */
    s->pairs = (int32_t *)accel_calloc(s->g.wgt_depth, (uint64_t)s->g.wgt_entry * 2);
    return s->pairs ? ACCEL_OK : ACCEL_ERR_NOMEM;
}

void vta_wgt_sync(vta_state *s, uint64_t first, uint64_t n)
{
    const uint32_t bin = s->g.block_in, bout = s->g.block_out, half = bin / 2;
    uint64_t e;
    if (!s->pairs)
        return;
    for (e = first; e < first + n; e++) {
        const int8_t *w = s->wgt + e * s->g.wgt_entry;
        int32_t *p = s->pairs + e * (uint64_t)half * bout;
        uint32_t q, o;
        for (q = 0; q < half; q++)
            for (o = 0; o < bout; o++) {
                const uint32_t lo = (uint16_t)(int16_t)w[o * bin + 2 * q];
                const uint32_t hi = (uint16_t)(int16_t)w[o * bin + 2 * q + 1];
                p[q * bout + o] = accel_as_i32(lo | (hi << 16));
            }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Portable kernel                                                                            */

/* acc[b][o] += sum_k inp[b][k] * wgt[o][k] for one uop iteration. Inlined with constant shapes by
 * the specialisations below so the loops are unrolled and vectorised. */
VTA_INLINE void gemm_uop(uint32_t *restrict acc, const int8_t *restrict x, const int8_t *restrict w,
                         const int batch, const int bin, const int bout, const int oc_outer)
{
    int b, oc, k;
    if (oc_outer) { /* better for SSE2 code when batch > 1 */
        for (oc = 0; oc < bout; oc++)
            for (b = 0; b < batch; b++) {
                int32_t sum = 0;
                for (k = 0; k < bin; k++)
                    sum += (int16_t)x[b * bin + k] * (int16_t)w[oc * bin + k];
                acc[b * bout + oc] += (uint32_t)sum;
            }
        return;
    }
    for (b = 0; b < batch; b++)
        for (oc = 0; oc < bout; oc++) {
            int32_t sum = 0;
            for (k = 0; k < bin; k++)
                sum += (int16_t)x[b * bin + k] * (int16_t)w[oc * bin + k];
            acc[b * bout + oc] += (uint32_t)sum;
        }
}

/* Returns 1 when a stop was requested (polled every ACCEL_STOP_POLL micro-ops and at least once
 * per (outer, inner) iteration). */
VTA_INLINE int gemm_loops(const gemm_args *a, const int batch, const int bin, const int bout)
{
    uint32_t *const accb = a->acc;
    const int8_t *const inpb = a->inp, *const wgtb = a->wgt;
    const uint32_t *const ud = a->ud, *const us = a->us, *const uw = a->uw;
    const size_t nu = (size_t)a->nu;
    uint64_t o, i;
    size_t u, u0, u1;
    for (o = 0; o < a->iter_out; o++) {
        for (i = 0; i < a->iter_in; i++) {
            uint32_t *const acc = accb + (size_t)(o * a->dfo + i * a->dfi);
            const int8_t *const inp = inpb + (size_t)(o * a->sfo + i * a->sfi);
            const int8_t *const wgt = wgtb + (size_t)(o * a->wfo + i * a->wfi);
            for (u0 = 0; u0 < nu; u0 = u1) {
                u1 = nu - u0 > ACCEL_STOP_POLL ? u0 + ACCEL_STOP_POLL : nu;
                if (accel_should_stop())
                    return 1;
                for (u = u0; u < u1; u++)
                    gemm_uop(acc + ud[u], inp + us[u], wgt + uw[u], batch, bin, bout, batch > 1);
            }
        }
    }
    return 0;
}

/* Shape specialisations of both paths. */
#define VTA_GEMM_SPECS(X) X(1, 16, 16) X(1, 8, 8) X(8, 8, 8) X(1, 32, 32) X(2, 16, 16)

#define VTA_GEMM_DEF(B, I, O) \
    static int gemm_##B##_##I##_##O(const gemm_args *a) { return gemm_loops(a, B, I, O); }
VTA_GEMM_SPECS(VTA_GEMM_DEF)

static int gemm_portable(const gemm_args *a, int batch, int bin, int bout)
{
#define VTA_GEMM_CASE(B, I, O) \
    if (batch == B && bin == I && bout == O) \
        return gemm_##B##_##I##_##O(a);
    VTA_GEMM_SPECS(VTA_GEMM_CASE)
#undef VTA_GEMM_CASE
    return gemm_loops(a, batch, bin, bout);
}

/* ------------------------------------------------------------------------------------------ */
/* AVX2 kernel on the pair layout                                                              */

#if ACCEL_HAVE_AVX2
/* acc[b][o] += sum_k x[b][k] * w[o][k] for one uop iteration; wp: the entry in pair layout. */
ACCEL_TARGET_AVX2 VTA_INLINE void gemm_uop_avx2(uint32_t *restrict acc, const int8_t *restrict x,
                                                const int32_t *restrict wp, const int batch, const int bin,
                                                const int bout)
{
    __m256i bc[32]; /* input pair q broadcast to all eight int32 lanes */
    int b, q, oc;
    for (b = 0; b < batch; b++) {
        const int8_t *xb = x + b * bin;
        for (q = 0; q < bin / 2; q += 4) {
            /* eight int8 -> eight int16 = four pairs in the low lane */
            const __m256i xw = _mm256_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)(xb + 2 * q)));
            bc[q] = _mm256_permutevar8x32_epi32(xw, _mm256_set1_epi32(0));
            bc[q + 1] = _mm256_permutevar8x32_epi32(xw, _mm256_set1_epi32(1));
            bc[q + 2] = _mm256_permutevar8x32_epi32(xw, _mm256_set1_epi32(2));
            bc[q + 3] = _mm256_permutevar8x32_epi32(xw, _mm256_set1_epi32(3));
        }
        for (oc = 0; oc < bout; oc += 8) {
            __m256i sum = _mm256_setzero_si256();
            __m256i *dst = (__m256i *)(void *)(acc + b * bout + oc);
            for (q = 0; q < bin / 2; q++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(const void *)(wp + q * bout + oc));
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(bc[q], w));
            }
            _mm256_storeu_si256(dst, _mm256_add_epi32(_mm256_loadu_si256(dst), sum));
        }
    }
}

ACCEL_TARGET_AVX2 VTA_INLINE int gemm_loops_avx2(const gemm_args *a, const int batch, const int bin,
                                                 const int bout)
{
    uint32_t *const accb = a->acc;
    const int8_t *const inpb = a->inp;
    const uint32_t *const ud = a->ud, *const us = a->us, *const uw = a->uw;
    const size_t nu = (size_t)a->nu;
    uint64_t o, i;
    size_t u, u0, u1;
    for (o = 0; o < a->iter_out; o++) {
        for (i = 0; i < a->iter_in; i++) {
            uint32_t *const acc = accb + (size_t)(o * a->dfo + i * a->dfi);
            const int8_t *const inp = inpb + (size_t)(o * a->sfo + i * a->sfi);
            /* a pair entry holds half as many int32 as the WGT entry has bytes */
            const int32_t *const wp = a->pairs + (size_t)(o * a->wfo + i * a->wfi) / 2;
            for (u0 = 0; u0 < nu; u0 = u1) {
                u1 = nu - u0 > ACCEL_STOP_POLL ? u0 + ACCEL_STOP_POLL : nu;
                if (accel_should_stop())
                    return 1;
                for (u = u0; u < u1; u++)
                    gemm_uop_avx2(acc + ud[u], inp + us[u], wp + uw[u] / 2, batch, bin, bout);
            }
        }
    }
    return 0;
}

#define VTA_GEMM_DEF_AVX2(B, I, O) \
    ACCEL_TARGET_AVX2 static int gemm_avx2_##B##_##I##_##O(const gemm_args *a) \
    { \
        return gemm_loops_avx2(a, B, I, O); \
    }
VTA_GEMM_SPECS(VTA_GEMM_DEF_AVX2)

ACCEL_TARGET_AVX2 static int gemm_avx2(const gemm_args *a, int batch, int bin, int bout)
{
#define VTA_GEMM_CASE(B, I, O) \
    if (batch == B && bin == I && bout == O) \
        return gemm_avx2_##B##_##I##_##O(a);
    VTA_GEMM_SPECS(VTA_GEMM_CASE)
#undef VTA_GEMM_CASE
    return gemm_loops_avx2(a, batch, bin, bout);
}
#endif

/* ------------------------------------------------------------------------------------------ */

int vta_exec_gemm(vta_state *s, const vta_insn *in)
{
    const vta_geom *g = &s->g;
    uint64_t o, i, u, nu = in->uop_end > in->uop_bgn ? in->uop_end - in->uop_bgn : 0;
    gemm_args a;
    if (nu == 0 || in->iter_out == 0 || in->iter_in == 0)
        return 0;
    if (in->reset) {
        const size_t bytes = (size_t)g->acc_lanes * 4;
        for (o = 0; o < in->iter_out; o++)
            for (i = 0; i < in->iter_in; i++) {
                const uint64_t d0 = (o * in->dfo + i * in->dfi) * g->acc_lanes;
                if (accel_should_stop())
                    return 1;
                for (u = 0; u < nu; u++)
                    memset(s->acc + s->ud[u] + d0, 0, bytes);
            }
        return 0;
    }
    a.acc = s->acc;
    a.inp = s->inp;
    a.wgt = s->wgt;
    a.pairs = s->pairs;
    a.ud = s->ud;
    a.us = s->us;
    a.uw = s->uw;
    a.nu = nu;
    a.iter_out = in->iter_out;
    a.iter_in = in->iter_in;
    a.dfo = in->dfo * g->acc_lanes;
    a.dfi = in->dfi * g->acc_lanes;
    a.sfo = in->sfo * g->inp_entry;
    a.sfi = in->sfi * g->inp_entry;
    a.wfo = in->wfo * g->wgt_entry;
    a.wfi = in->wfi * g->wgt_entry;
#if ACCEL_HAVE_AVX2
    if (s->pairs)
        return gemm_avx2(&a, (int)g->batch, (int)g->block_in, (int)g->block_out);
#endif
    return gemm_portable(&a, (int)g->batch, (int)g->block_in, (int)g->block_out);
}
