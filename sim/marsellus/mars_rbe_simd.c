/* An RBE job on AVX2 (picked at run time, see common/simd.h): the same L1 contents as the portable
 * path of exec_rbe (mars_exec.c), computed with the output channels in the lanes.
 *
 * The RBE's BinConv sums bit-plane products sum_{i,j} 2^(i+j) popcount(x_i & w_j); the simulator
 * computes the integer convolution those planes encode (values unpacked first), which is the
 * same sum.
 * - Input: each 32-channel group of `bits` plane words becomes 32 bytes (broadcast the word,
 *   byte shuffle so byte j holds the word's byte j / 8, AND with bit j % 8, compare, add 2^b),
 *   widened to int16 [pixel][k_in rounded up to even].
 * - Accumulators: the weights' pair layout (mars_rbe_cache.c), so input pair q is one int32
 *   broadcast and vpmaddwd adds both taps to 32 output channels without horizontal sums. A
 *   padded tap adds pad_value * sum_k w. Products are at most 255 x 255 and every lane sums
 *   modulo 2^32: exec_rbe sums in int64 and wraps to 32 bits, the same value.
 * - NormQuant in doubles, exact: |acc * kappa| < 2^31 * 2^16 and |lambda| <= 2^31, so
 *   acc * kappa + lambda is an integer below 2^48 (doubles hold integers up to 2^53 exactly),
 *   times 2^-shift is exact (a power of two, no underflow) and floor() of it is the floor shift
 *   of the portable path; clamping and conversion to int32 are exact too.
 * - Output: bit b of the 32 bytes of a group shifted to each byte's top bit and gathered with
 *   vpmovmskb, one plane word per instruction. */
#include <string.h>

#include "common/simd.h"
#include "marsellus/mars_internal.h"

#if ACCEL_HAVE_AVX2
#include <immintrin.h>

#define LD256(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))

static inline int32_t pair_at(const int16_t *x)
{
    int32_t pair;
    memcpy(&pair, x, 4);
    return pair;
}

/* Scratch layout: kappa and lambda as doubles [lanes], accumulators [pixel][lanes], input
 * values int16 [pixel][k_in rounded up to even] and 32 more. */
uint64_t mars_rbe_simd_bytes(const mars_cmd *c)
{
    const uint64_t kp = ((uint64_t)c->k_in + 1) / 2 * 2, lanes = ((uint64_t)c->k_out + 31) / 32 * 32;
    return 2 * 8 * lanes + 4 * (uint64_t)(c->h_out * c->w_out) * lanes + 2 * ((uint64_t)(c->h_in * c->w_in) * kp + 32);
}

/* The 32 values of `bits` plane words stride bytes apart, one per byte. */
ACCEL_TARGET_AVX2 static inline __m256i planes_to_bytes(const uint8_t *p, uint64_t stride, int bits)
{
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)UINT64_C(0x8040201008040201));
    __m256i v = _mm256_setzero_si256();
    for (int b = 0; b < bits; b++) {
        const __m256i word = _mm256_shuffle_epi8(_mm256_set1_epi32(accel_as_i32(accel_ld_u32le(p + (uint64_t)b * stride))), sel);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(word, bit), bit);
        v = _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi8((char)(1 << b))));
    }
    return v;
}

/* Input values of every pixel, int16 [pixel][kp]; 1 when a stop was requested. */
ACCEL_TARGET_AVX2 static int unpack_input(const mars_cmd *c, const uint8_t *l1, int16_t *xs)
{
    const uint64_t Ki = (uint64_t)c->k_in, kp = (Ki + 1) / 2 * 2, bits = (uint64_t)c->in_bits;
    for (int64_t h = 0; h < c->h_in; h++) {
        if (accel_should_stop())
            return 1;
        for (int64_t w = 0; w < c->w_in; w++) {
            const uint8_t *pix = l1 + c->x + (uint64_t)h * c->x_rs + (uint64_t)w * c->x_ps;
            int16_t *out = xs + (uint64_t)(h * c->w_in + w) * kp;
            for (uint64_t t = 0; t * 32 < Ki; t++) {
                const __m256i v = planes_to_bytes(pix + 4 * t * bits, 4, (int)bits);
                /* a partial last group spills into the next pixel's values, written next, or
                 * into the slack at the end of the buffer */
                _mm256_storeu_si256((__m256i *)(void *)(out + t * 32), _mm256_cvtepu8_epi16(_mm256_castsi256_si128(v)));
                _mm256_storeu_si256((__m256i *)(void *)(out + t * 32 + 16),
                                    _mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1)));
            }
            if (kp != Ki)
                out[Ki] = 0;
        }
    }
    return 0;
}

/* The accumulators of the 32 channels of group g at output (ho, wo) into a, of which only the
 * first nv vectors of 8 hold channels below k_out (the others are stored as 0): a constant nv
 * (the call sites) drops the dead vectors, half the work of a 16-channel layer. */
ACCEL_TARGET_AVX2 static inline __attribute__((always_inline)) void group_sums(
    const mars_cmd *c, const int16_t *xs, const mars_rbe_wts *t, int64_t ho, int64_t wo, uint64_t g, const int nv,
    uint32_t *a)
{
    const int64_t H = c->h_in, W = c->w_in;
    const uint64_t taps = (uint64_t)(c->kh * c->kw), kp = ((uint64_t)c->k_in + 1) / 2 * 2, nq = kp / 2;
    const uint64_t lanes = ((uint64_t)c->k_out + 31) / 32 * 32;
    const __m256i padv = _mm256_set1_epi32(c->pad_value);
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (int ky = 0; ky < c->kh; ky++)
        for (int kx = 0; kx < c->kw; kx++) {
            const int64_t hi = ho * c->stride_h + ky - c->pad_t, wi = wo * c->stride_w + kx - c->pad_l;
            const uint64_t f = (uint64_t)(ky * c->kw + kx);
            if (hi < 0 || hi >= H || wi < 0 || wi >= W) {
                const uint32_t *ws = t->wsum + f * lanes + g * 32;
                s0 = _mm256_add_epi32(s0, _mm256_mullo_epi32(padv, LD256(ws)));
                if (nv > 1)
                    s1 = _mm256_add_epi32(s1, _mm256_mullo_epi32(padv, LD256(ws + 8)));
                if (nv > 2)
                    s2 = _mm256_add_epi32(s2, _mm256_mullo_epi32(padv, LD256(ws + 16)));
                if (nv > 3)
                    s3 = _mm256_add_epi32(s3, _mm256_mullo_epi32(padv, LD256(ws + 24)));
            } else {
                const int16_t *xv = xs + (uint64_t)(hi * W + wi) * kp;
                const int32_t *wr = t->pairs + (g * taps + f) * nq * 32;
                for (uint64_t q = 0; q < nq; q++, wr += 32) {
                    const __m256i bc = _mm256_set1_epi32(pair_at(xv + 2 * q));
                    s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(bc, LD256(wr)));
                    if (nv > 1)
                        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(bc, LD256(wr + 8)));
                    if (nv > 2)
                        s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(bc, LD256(wr + 16)));
                    if (nv > 3)
                        s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(bc, LD256(wr + 24)));
                }
            }
        }
    _mm256_storeu_si256((__m256i *)(void *)a, s0);
    _mm256_storeu_si256((__m256i *)(void *)(a + 8), s1);
    _mm256_storeu_si256((__m256i *)(void *)(a + 16), s2);
    _mm256_storeu_si256((__m256i *)(void *)(a + 24), s3);
}

/* group_sums of two horizontally adjacent outputs (wo, wo + 1) whose taps all lie inside the
 * input: each weight load serves both pixels. */
ACCEL_TARGET_AVX2 static inline __attribute__((always_inline)) void group_sums2(
    const mars_cmd *c, const int16_t *xs, const mars_rbe_wts *t, int64_t ho, int64_t wo, uint64_t g, const int nv,
    uint32_t *a, uint32_t *b)
{
    const int64_t W = c->w_in;
    const uint64_t taps = (uint64_t)(c->kh * c->kw), kp = ((uint64_t)c->k_in + 1) / 2 * 2, nq = kp / 2;
    const uint64_t step = (uint64_t)c->stride_w * kp;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0, u0 = s0, u1 = s0, u2 = s0, u3 = s0;
    for (int ky = 0; ky < c->kh; ky++)
        for (int kx = 0; kx < c->kw; kx++) {
            const int64_t hi = ho * c->stride_h + ky - c->pad_t, wi = wo * c->stride_w + kx - c->pad_l;
            const uint64_t f = (uint64_t)(ky * c->kw + kx);
            const int16_t *x0 = xs + (uint64_t)(hi * W + wi) * kp, *x1 = x0 + step;
            const int32_t *wr = t->pairs + (g * taps + f) * nq * 32;
            for (uint64_t q = 0; q < nq; q++, wr += 32) {
                const __m256i p0 = _mm256_set1_epi32(pair_at(x0 + 2 * q)), p1 = _mm256_set1_epi32(pair_at(x1 + 2 * q));
                __m256i w = LD256(wr);
                s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(p0, w));
                u0 = _mm256_add_epi32(u0, _mm256_madd_epi16(p1, w));
                if (nv > 1) {
                    w = LD256(wr + 8);
                    s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p0, w));
                    u1 = _mm256_add_epi32(u1, _mm256_madd_epi16(p1, w));
                }
                if (nv > 2) {
                    w = LD256(wr + 16);
                    s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(p0, w));
                    u2 = _mm256_add_epi32(u2, _mm256_madd_epi16(p1, w));
                }
                if (nv > 3) {
                    w = LD256(wr + 24);
                    s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(p0, w));
                    u3 = _mm256_add_epi32(u3, _mm256_madd_epi16(p1, w));
                }
            }
        }
    _mm256_storeu_si256((__m256i *)(void *)a, s0);
    _mm256_storeu_si256((__m256i *)(void *)(a + 8), s1);
    _mm256_storeu_si256((__m256i *)(void *)(a + 16), s2);
    _mm256_storeu_si256((__m256i *)(void *)(a + 24), s3);
    _mm256_storeu_si256((__m256i *)(void *)b, u0);
    _mm256_storeu_si256((__m256i *)(void *)(b + 8), u1);
    _mm256_storeu_si256((__m256i *)(void *)(b + 16), u2);
    _mm256_storeu_si256((__m256i *)(void *)(b + 24), u3);
}

/* The 32-bit accumulators [pixel][lanes]; 1 when a stop was requested. Two adjacent outputs
 * whose windows lie inside the input go through group_sums2, the others one at a time. */
ACCEL_TARGET_AVX2 static int accumulate(const mars_cmd *c, const int16_t *xs, const mars_rbe_wts *t, uint32_t *acc)
{
    const uint64_t groups = ((uint64_t)c->k_out + 31) / 32, lanes = groups * 32;
    for (int64_t ho = 0; ho < c->h_out; ho++) {
        const int64_t top = ho * c->stride_h - c->pad_t;
        const int rows_inside = top >= 0 && top + c->kh <= c->h_in;
        if (accel_should_stop())
            return 1;
        for (int64_t wo = 0; wo < c->w_out;) {
            const int64_t left = wo * c->stride_w - c->pad_l;
            const int two = rows_inside && wo + 1 < c->w_out && left >= 0 && left + c->stride_w + c->kw <= c->w_in;
            uint32_t *a = acc + (uint64_t)(ho * c->w_out + wo) * lanes;
            for (uint64_t g = 0; g < groups; g++) {
                const uint64_t live = (uint64_t)c->k_out - g * 32 < 32 ? (uint64_t)c->k_out - g * 32 : 32;
                uint32_t *ag = a + g * 32, *bg = a + lanes + g * 32;
                switch ((live + 7) / 8 + (two ? 4 : 0)) {
                case 1: group_sums(c, xs, t, ho, wo, g, 1, ag); break;
                case 2: group_sums(c, xs, t, ho, wo, g, 2, ag); break;
                case 3: group_sums(c, xs, t, ho, wo, g, 3, ag); break;
                case 4: group_sums(c, xs, t, ho, wo, g, 4, ag); break;
                case 5: group_sums2(c, xs, t, ho, wo, g, 1, ag, bg); break;
                case 6: group_sums2(c, xs, t, ho, wo, g, 2, ag, bg); break;
                case 7: group_sums2(c, xs, t, ho, wo, g, 3, ag, bg); break;
                default: group_sums2(c, xs, t, ho, wo, g, 4, ag, bg); break;
                }
            }
            wo += two ? 2 : 1;
        }
    }
    return 0;
}

/* NormQuant of 8 accumulators (see the file comment), as int16 in 0..255 (the low byte). */
ACCEL_TARGET_AVX2 static inline __m128i normquant8(const uint32_t *a, const double *kappa, const double *lambda,
                                                   __m256d scale, __m256d lo, __m256d hi)
{
    const __m256i a8 = LD256(a);
    __m256d d0 = _mm256_cvtepi32_pd(_mm256_castsi256_si128(a8)), d1 = _mm256_cvtepi32_pd(_mm256_extracti128_si256(a8, 1));
    d0 = _mm256_add_pd(_mm256_mul_pd(d0, _mm256_loadu_pd(kappa)), _mm256_loadu_pd(lambda));
    d1 = _mm256_add_pd(_mm256_mul_pd(d1, _mm256_loadu_pd(kappa + 4)), _mm256_loadu_pd(lambda + 4));
    d0 = _mm256_min_pd(_mm256_max_pd(_mm256_floor_pd(_mm256_mul_pd(d0, scale)), lo), hi);
    d1 = _mm256_min_pd(_mm256_max_pd(_mm256_floor_pd(_mm256_mul_pd(d1, scale)), lo), hi);
    return _mm_and_si128(_mm_packs_epi32(_mm256_cvtpd_epi32(d0), _mm256_cvtpd_epi32(d1)), _mm_set1_epi16(0xff));
}

/* NormQuant of every accumulator and the outputs written as bit-plane pixels. */
ACCEL_TARGET_AVX2 static void store_outputs(const mars_cmd *c, uint8_t *l1, const uint32_t *acc, double *kappa,
                                            double *lambda)
{
    const uint64_t groups = ((uint64_t)c->k_out + 31) / 32, lanes = groups * 32, bits = (uint64_t)c->out_bits;
    double lo = c->out_signed ? -(double)((int64_t)1 << (c->out_bits - 1)) : 0.0;
    const double hi = c->out_signed ? (double)(((int64_t)1 << (c->out_bits - 1)) - 1) : (double)(((int64_t)1 << c->out_bits) - 1);
    const __m256d vlo = _mm256_set1_pd(c->relu && lo < 0 ? 0.0 : lo), vhi = _mm256_set1_pd(hi);
    const __m256d scale = _mm256_set1_pd(1.0 / (double)((int64_t)1 << c->shift));
    for (uint64_t o = 0; o < lanes; o++) {
        const uint8_t *r = l1 + c->nq + 6 * o;
        kappa[o] = o < (uint64_t)c->k_out ? (double)((uint32_t)r[0] | ((uint32_t)r[1] << 8)) : 0.0;
        lambda[o] = o < (uint64_t)c->k_out ? (double)accel_as_i32(accel_ld_u32le(r + 2)) : 0.0;
    }
    for (int64_t ho = 0; ho < c->h_out; ho++)
        for (int64_t wo = 0; wo < c->w_out; wo++) {
            const uint32_t *a = acc + (uint64_t)(ho * c->w_out + wo) * lanes;
            uint8_t *pix = l1 + c->y + (uint64_t)ho * c->y_rs + (uint64_t)wo * c->y_ps;
            for (uint64_t g = 0; g < groups; g++) {
                const uint64_t o = g * 32;
                const __m128i b0 = _mm_packus_epi16(normquant8(a + o, kappa + o, lambda + o, scale, vlo, vhi),
                                                    normquant8(a + o + 8, kappa + o + 8, lambda + o + 8, scale, vlo, vhi));
                const __m128i b1 = _mm_packus_epi16(normquant8(a + o + 16, kappa + o + 16, lambda + o + 16, scale, vlo, vhi),
                                                    normquant8(a + o + 24, kappa + o + 24, lambda + o + 24, scale, vlo, vhi));
                const __m256i y = _mm256_inserti128_si256(_mm256_castsi128_si256(b0), b1, 1);
                for (uint64_t b = 0; b < bits; b++) {
                    const __m256i top = _mm256_sll_epi16(y, _mm_cvtsi32_si128((int)(7 - b)));
                    accel_st_u32le(pix + 4 * (g * bits + b), (uint32_t)_mm256_movemask_epi8(top));
                }
            }
        }
}

ACCEL_TARGET_AVX2 int mars_rbe_job_avx2(const mars_cmd *c, uint8_t *l1, const mars_rbe_wts *t, void *scratch)
{
    const uint64_t lanes = ((uint64_t)c->k_out + 31) / 32 * 32;
    double *kappa = (double *)scratch, *lambda = kappa + lanes;
    uint32_t *acc = (uint32_t *)(void *)(lambda + lanes);
    int16_t *xs = (int16_t *)(void *)(acc + (uint64_t)(c->h_out * c->w_out) * lanes);
    if (unpack_input(c, l1, xs) || accumulate(c, xs, t, acc))
        return 1;
    store_outputs(c, l1, acc, kappa, lambda);
    return 0;
}
#endif
