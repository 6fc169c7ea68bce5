/* DPU dense CONV on AVX2 (picked at run time, see common/simd.h): the same results as
 * conv_dense in dpu_exec.c, computed with the output channels in the vector lanes.
 *
 * The weights are first rearranged into "pairs": int32 holding (int16 w[oc][2q],
 * int16 w[oc][2q + 1]) of a kernel-row segment (0 for the missing half of an odd segment and for
 * the lanes past oc), laid out [group of 32 channels][ky][segment][q][32 lanes]. The input row
 * segment is int16 in X, so input pair q is one int32 load broadcast to all lanes; vpmaddwd against a pair row adds both taps to eight
 * output channels at once, with no horizontal sums. The loops run weight-stationary: a chunk of
 * pair rows for 32 channels is applied to every output pixel (sums kept in A) before the next, so
 * the weights stay in L1 whatever the layer's size. Every lane sums in int32 modulo 2^32 and the
 * reference adds its exact int32 dot products into a uint32 accumulator: the same value. */
#include <string.h>

#include "common/simd.h"
#include "dpu/dpu_internal.h"

#if ACCEL_HAVE_AVX2
#include <immintrin.h>

uint64_t dpu_conv_sums_len(const dpu_insn *in)
{
    return (uint64_t)in->out_h * (uint64_t)in->out_w * (((uint64_t)in->oc + 7) / 8 * 8);
}

uint64_t dpu_conv_pairs_len(const dpu_insn *in)
{
    const uint64_t ic = (uint64_t)in->ic, kw = (uint64_t)in->kernel_w, kh = (uint64_t)in->kernel_h;
    const uint64_t nseg = in->dilation == 1 ? 1 : kw, seg = in->dilation == 1 ? kw * ic : ic;
    const uint64_t groups = ((uint64_t)in->oc + 31) / 32;
    return groups * kh * nseg * ((seg + 1) / 2) * 32;
}

/* The pair rows [q0, q1) of one segment (input row segment xs of each output pixel, pair rows wr)
 * added to the sums A of `nb` (1..4) blocks of eight channels of every output pixel. */
#define DPU_CHUNK(NB) \
    do { \
        for (y = 0; y < oh; y++) \
            for (x = 0; x < ow; x++) { \
                const int16_t *xs = X + (y * sh * Ww + x * sw) * ic + seg_off; \
                __m256i *a = (__m256i *)(void *)(A + (y * ow + x) * ocp + ob * 8); \
                __m256i s0 = _mm256_loadu_si256(a), s1 = s0, s2 = s0, s3 = s0; \
                const int32_t *wr = wseg + q0 * 32; \
                if (NB > 1) \
                    s1 = _mm256_loadu_si256(a + 1); \
                if (NB > 2) \
                    s2 = _mm256_loadu_si256(a + 2); \
                if (NB > 3) \
                    s3 = _mm256_loadu_si256(a + 3); \
                for (q = q0; q < q1; q++, wr += 32) { \
                    int32_t pair; \
                    __m256i bc; \
                    memcpy(&pair, xs + 2 * q, 4); \
                    bc = _mm256_set1_epi32(pair); \
                    s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(bc, _mm256_loadu_si256((const __m256i *)(const void *)wr))); \
                    if (NB > 1) \
                        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(bc, _mm256_loadu_si256((const __m256i *)(const void *)(wr + 8)))); \
                    if (NB > 2) \
                        s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(bc, _mm256_loadu_si256((const __m256i *)(const void *)(wr + 16)))); \
                    if (NB > 3) \
                        s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(bc, _mm256_loadu_si256((const __m256i *)(const void *)(wr + 24)))); \
                } \
                _mm256_storeu_si256(a, s0); \
                if (NB > 1) \
                    _mm256_storeu_si256(a + 1, s1); \
                if (NB > 2) \
                    _mm256_storeu_si256(a + 2, s2); \
                if (NB > 3) \
                    _mm256_storeu_si256(a + 3, s3); \
            } \
    } while (0)

/* Pair rows per chunk: 32 rows x 32 channels x 4 bytes = 4 KiB of contiguous weights stay in L1
 * while every output pixel passes over them. */
#define DPU_PAIR_CHUNK 32

ACCEL_TARGET_AVX2 int dpu_conv_dense_avx2(const dpu_insn *in, const int16_t *X, const int16_t *W,
                                          const int32_t *bias, uint8_t *out, int32_t *Wp, int32_t *A, int prepare)
{
    const uint64_t ic = (uint64_t)in->ic, oc = (uint64_t)in->oc, oh = (uint64_t)in->out_h, ow = (uint64_t)in->out_w;
    const uint64_t kh = (uint64_t)in->kernel_h, kw = (uint64_t)in->kernel_w, d = (uint64_t)in->dilation;
    const uint64_t sh = (uint64_t)in->stride_h, sw = (uint64_t)in->stride_w, Ww = in->win_cols;
    const uint64_t K = kw * ic, xrow = Ww * ic, wstride = kh * K;
    const uint64_t nseg = d == 1 ? 1 : kw, seg = d == 1 ? K : ic, xstep = d * ic;
    const uint64_t nq = (seg + 1) / 2, nblk = (oc + 7) / 8, ocp = nblk * 8;
    const unsigned shift = (unsigned)in->shift;
    const int64_t lo = in->clip_lo, hi = in->clip_hi;
    uint64_t y, x, o, ky, j, q, q0, q1, ob, p;
    /* weights in pair layout, [group of 32 channels][ky][segment][q][32] */
    for (ob = 0; ob < (prepare ? nblk : 0); ob += 4)
        for (ky = 0; ky < kh; ky++)
            for (j = 0; j < nseg; j++)
                for (q = 0; q < nq; q++) {
                    int32_t *row = Wp + (((ob / 4 * kh + ky) * nseg + j) * nq + q) * 32;
                    for (o = ob * 8; o < ob * 8 + 32; o++) {
                        uint32_t w0 = 0, w1 = 0;
                        if (o < oc) {
                            const int16_t *w = W + o * wstride + ky * K + j * seg + 2 * q;
                            w0 = (uint16_t)w[0];
                            w1 = 2 * q + 1 < seg ? (uint16_t)w[1] : 0;
                        }
                        row[o - ob * 8] = accel_as_i32(w0 | (w1 << 16));
                    }
                }
    memset(A, 0, (size_t)(oh * ow * ocp) * sizeof(int32_t));
    for (ob = 0; ob < nblk; ob += 4)
        for (ky = 0; ky < kh; ky++)
            for (j = 0; j < nseg; j++) {
                const uint64_t seg_off = ky * d * xrow + j * xstep;
                const int32_t *wseg = Wp + ((ob / 4 * kh + ky) * nseg + j) * nq * 32;
                if (accel_should_stop())
                    return 1;
                for (q0 = 0; q0 < nq; q0 = q1) {
                    q1 = nq - q0 > DPU_PAIR_CHUNK ? q0 + DPU_PAIR_CHUNK : nq;
                    if (nblk - ob >= 4)
                        DPU_CHUNK(4);
                    else if (nblk - ob == 3)
                        DPU_CHUNK(3);
                    else if (nblk - ob == 2)
                        DPU_CHUNK(2);
                    else
                        DPU_CHUNK(1);
                }
            }
    for (p = 0; p < oh * ow; p++)
        for (o = 0; o < oc; o++)
            out[p * oc + o] = dpu_requant((uint32_t)A[p * ocp + o], bias[o], shift, lo, hi);
    return 0;
}
#endif
