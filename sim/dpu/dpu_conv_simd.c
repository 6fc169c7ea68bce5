/* DPU dense CONV on the host's SIMD units (picked at run time, see common/simd.h): the same
 * results as conv_dense in dpu_exec.c, computed with the output channels in the vector lanes.
 *
 * The weights are first rearranged into "pairs": int32 holding (int16 w[oc][2q],
 * int16 w[oc][2q + 1]) of a kernel-row segment (0 for the missing half of an odd segment and for
 * the lanes past oc), laid out [group of 32 channels][ky][segment][q][32 lanes]. The input row
 * segment is int16 in X, so input pair q is one int32 load broadcast to all lanes; vpmaddwd
 * (AVX2, then vpaddd) or vpdpwssd (AVX-512 VNNI) against a pair row adds both taps to the group's
 * 32 channels at once, with no horizontal sums. The loops run weight-stationary: a chunk of pair
 * rows is applied to every output pixel (sums kept in A, 32 lanes per group) before the next, so
 * the weights stay in L1 whatever the layer's size. Every lane sums in int32 modulo 2^32 and the
 * reference adds its exact int32 dot products into a uint32 accumulator: the same value. */
#include <string.h>

#include "common/simd.h"
#include "dpu/dpu_internal.h"

#if ACCEL_HAVE_AVX2
#include <immintrin.h>

/* Pair rows per chunk: 32 rows x 32 channels x 4 bytes = 4 KiB of contiguous weights stay in L1
 * while every output pixel passes over them. */
#define DPU_PAIR_CHUNK 32

typedef struct {
    uint64_t ic, oc, oh, ow, kh, kw, d, sh, sw, Ww, K, xrow, wstride, nseg, seg, xstep, nq, groups, lanes;
} conv_geom;

static conv_geom geom_of(const dpu_insn *in)
{
    conv_geom c;
    c.ic = (uint64_t)in->ic, c.oc = (uint64_t)in->oc, c.oh = (uint64_t)in->out_h, c.ow = (uint64_t)in->out_w;
    c.kh = (uint64_t)in->kernel_h, c.kw = (uint64_t)in->kernel_w, c.d = (uint64_t)in->dilation;
    c.sh = (uint64_t)in->stride_h, c.sw = (uint64_t)in->stride_w, c.Ww = in->win_cols;
    c.K = c.kw * c.ic, c.xrow = c.Ww * c.ic, c.wstride = c.kh * c.K;
    /* segments per kernel row: one of kw * ic (dense) or kw of ic (dilated) */
    c.nseg = c.d == 1 ? 1 : c.kw, c.seg = c.d == 1 ? c.K : c.ic, c.xstep = c.d * c.ic;
    c.nq = (c.seg + 1) / 2, c.groups = (c.oc + 31) / 32, c.lanes = c.groups * 32;
    return c;
}

uint64_t dpu_conv_sums_len(const dpu_insn *in)
{
    const conv_geom c = geom_of(in);
    return c.oh * c.ow * c.lanes;
}

uint64_t dpu_conv_pairs_len(const dpu_insn *in)
{
    const conv_geom c = geom_of(in);
    return c.groups * c.kh * c.nseg * c.nq * 32;
}

static void build_pairs(const conv_geom *c, const int16_t *W, int32_t *Wp)
{
    uint64_t g, ky, j, q, o;
    for (g = 0; g < c->groups; g++)
        for (ky = 0; ky < c->kh; ky++)
            for (j = 0; j < c->nseg; j++)
                for (q = 0; q < c->nq; q++) {
                    int32_t *row = Wp + (((g * c->kh + ky) * c->nseg + j) * c->nq + q) * 32;
                    for (o = g * 32; o < g * 32 + 32; o++) {
                        uint32_t w0 = 0, w1 = 0;
                        if (o < c->oc) {
                            const int16_t *w = W + o * c->wstride + ky * c->K + j * c->seg + 2 * q;
                            w0 = (uint16_t)w[0];
                            w1 = 2 * q + 1 < c->seg ? (uint16_t)w[1] : 0;
                        }
                        row[o - g * 32] = accel_as_i32(w0 | (w1 << 16));
                    }
                }
}

static void requant_all(const dpu_insn *in, const conv_geom *c, const int32_t *A, const int32_t *bias, uint8_t *out)
{
    const unsigned shift = (unsigned)in->shift;
    uint64_t p, o;
    for (p = 0; p < c->oh * c->ow; p++)
        for (o = 0; o < c->oc; o++)
            out[p * c->oc + o] = dpu_requant((uint32_t)A[p * c->lanes + o], bias[o], shift, in->clip_lo, in->clip_hi);
}

/* Output pixels per kernel call: the weights loaded for a pair row serve all of them, and their
 * sums are independent dependency chains. */
#define DPU_PIX_BLOCK 4

/* The loop nest shared by the kernels (a stop request is polled once per chunk of pair rows,
 * which passes over every output pixel); CHUNK(xs, a, n, wr, q0, q1) adds pair rows [q0, q1) (at wr)
 * times the input pairs at xs[i] to the 32 sums at a[i] of n (1..DPU_PIX_BLOCK) output pixels. */
#define DPU_CONV_LOOPS(CHUNK) \
    do { \
        const uint64_t npix = c.oh * c.ow; \
        const int16_t *xs[DPU_PIX_BLOCK]; \
        int32_t *as[DPU_PIX_BLOCK]; \
        uint64_t g, ky, j, q0, q1, p, i, n; \
        if (prepare) \
            build_pairs(&c, W, Wp); \
        memset(A, 0, (size_t)(npix * c.lanes) * sizeof(int32_t)); \
        for (g = 0; g < c.groups; g++) \
            for (ky = 0; ky < c.kh; ky++) \
                for (j = 0; j < c.nseg; j++) { \
                    const uint64_t seg_off = ky * c.d * c.xrow + j * c.xstep; \
                    const int32_t *wseg = Wp + ((g * c.kh + ky) * c.nseg + j) * c.nq * 32; \
                    for (q0 = 0; q0 < c.nq; q0 = q1) { \
                        q1 = c.nq - q0 > DPU_PAIR_CHUNK ? q0 + DPU_PAIR_CHUNK : c.nq; \
                        if (accel_should_stop()) \
                            return 1; \
                        for (p = 0; p < npix; p += n) { \
                            n = npix - p < DPU_PIX_BLOCK ? npix - p : DPU_PIX_BLOCK; \
                            for (i = 0; i < n; i++) { \
                                const uint64_t y = (p + i) / c.ow, x = (p + i) % c.ow; \
                                xs[i] = X + (y * c.sh * c.Ww + x * c.sw) * c.ic + seg_off; \
                                as[i] = A + (p + i) * c.lanes + g * 32; \
                            } \
                            CHUNK(xs, as, n, wseg + q0 * 32, q0, q1); \
                        } \
                    } \
                } \
        requant_all(in, &c, A, bias, out); \
        return 0; \
    } while (0)

#define LD256(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))

static inline int32_t pair_at(const int16_t *x)
{
    int32_t pair;
    memcpy(&pair, x, 4);
    return pair;
}

ACCEL_TARGET_AVX2 static inline void chunk_avx2(const int16_t *const *xs, int32_t *const *as, uint64_t n,
                                                const int32_t *wr, uint64_t q0, uint64_t q1)
{
    uint64_t i, q;
    for (i = 0; i < n; i++) {
        const int16_t *x = xs[i];
        int32_t *a = as[i];
        const int32_t *w = wr;
        __m256i s0 = LD256(a), s1 = LD256(a + 8), s2 = LD256(a + 16), s3 = LD256(a + 24);
        for (q = q0; q < q1; q++, w += 32) {
            const __m256i bc = _mm256_set1_epi32(pair_at(x + 2 * q));
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(bc, LD256(w)));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(bc, LD256(w + 8)));
            s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(bc, LD256(w + 16)));
            s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(bc, LD256(w + 24)));
        }
        _mm256_storeu_si256((__m256i *)(void *)a, s0);
        _mm256_storeu_si256((__m256i *)(void *)(a + 8), s1);
        _mm256_storeu_si256((__m256i *)(void *)(a + 16), s2);
        _mm256_storeu_si256((__m256i *)(void *)(a + 24), s3);
    }
}

ACCEL_TARGET_AVX2 int dpu_conv_dense_avx2(const dpu_insn *in, const int16_t *X, const int16_t *W,
                                          const int32_t *bias, uint8_t *out, int32_t *Wp, int32_t *A, int prepare)
{
    const conv_geom c = geom_of(in);
    DPU_CONV_LOOPS(chunk_avx2);
}

#if ACCEL_HAVE_VNNI
#define LD512(p) _mm512_loadu_si512((const void *)(p))

/* Four pixels: eight independent vpdpwssd chains (its latency is five cycles) sharing each
 * weight load; fewer pixels: one at a time. */
ACCEL_TARGET_VNNI static inline void chunk_vnni(const int16_t *const *xs, int32_t *const *as, uint64_t n,
                                                const int32_t *wr, uint64_t q0, uint64_t q1)
{
    uint64_t i, q;
    if (n == 4) {
        __m512i a0 = LD512(as[0]), b0 = LD512(as[0] + 16), a1 = LD512(as[1]), b1 = LD512(as[1] + 16);
        __m512i a2 = LD512(as[2]), b2 = LD512(as[2] + 16), a3 = LD512(as[3]), b3 = LD512(as[3] + 16);
        for (q = q0; q < q1; q++, wr += 32) {
            const __m512i w0 = LD512(wr), w1 = LD512(wr + 16);
            __m512i bc = _mm512_set1_epi32(pair_at(xs[0] + 2 * q));
            a0 = _mm512_dpwssd_epi32(a0, bc, w0);
            b0 = _mm512_dpwssd_epi32(b0, bc, w1);
            bc = _mm512_set1_epi32(pair_at(xs[1] + 2 * q));
            a1 = _mm512_dpwssd_epi32(a1, bc, w0);
            b1 = _mm512_dpwssd_epi32(b1, bc, w1);
            bc = _mm512_set1_epi32(pair_at(xs[2] + 2 * q));
            a2 = _mm512_dpwssd_epi32(a2, bc, w0);
            b2 = _mm512_dpwssd_epi32(b2, bc, w1);
            bc = _mm512_set1_epi32(pair_at(xs[3] + 2 * q));
            a3 = _mm512_dpwssd_epi32(a3, bc, w0);
            b3 = _mm512_dpwssd_epi32(b3, bc, w1);
        }
        _mm512_storeu_si512((void *)as[0], a0);
        _mm512_storeu_si512((void *)(as[0] + 16), b0);
        _mm512_storeu_si512((void *)as[1], a1);
        _mm512_storeu_si512((void *)(as[1] + 16), b1);
        _mm512_storeu_si512((void *)as[2], a2);
        _mm512_storeu_si512((void *)(as[2] + 16), b2);
        _mm512_storeu_si512((void *)as[3], a3);
        _mm512_storeu_si512((void *)(as[3] + 16), b3);
        return;
    }
    for (i = 0; i < n; i++) {
        const int32_t *w = wr;
        __m512i a0 = LD512(as[i]), b0 = LD512(as[i] + 16);
        for (q = q0; q < q1; q++, w += 32) {
            const __m512i bc = _mm512_set1_epi32(pair_at(xs[i] + 2 * q));
            a0 = _mm512_dpwssd_epi32(a0, bc, LD512(w));
            b0 = _mm512_dpwssd_epi32(b0, bc, LD512(w + 16));
        }
        _mm512_storeu_si512((void *)as[i], a0);
        _mm512_storeu_si512((void *)(as[i] + 16), b0);
    }
}

ACCEL_TARGET_VNNI int dpu_conv_dense_vnni(const dpu_insn *in, const int16_t *X, const int16_t *W,
                                          const int32_t *bias, uint8_t *out, int32_t *Wp, int32_t *A, int prepare)
{
    const conv_geom c = geom_of(in);
    DPU_CONV_LOOPS(chunk_vnni);
}
#endif
#endif
