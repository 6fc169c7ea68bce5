/* The RBE's accumulators on AVX2 (picked at run time, see common/simd.h): the same values as the
 * portable loop in exec_rbe (mars_exec.c), computed with the output channels in the lanes.
 *
 * The RBE's BinConv sums bit-plane products sum_{i,j} 2^(i+j) popcount(x_i & w_j); the simulator
 * computes the integer convolution those planes encode (values unpacked first), which is the
 * same sum. Here the weights are rearranged into "pairs": int32 holding (int16 w[o][tap][2q],
 * int16 w[o][tap][2q + 1]) (0 past k_in and past k_out), laid out [group of 32 channels][tap][q]
 * [32 lanes]; the input values are int16 [pixel][k_in rounded up to even], so input pair q is one
 * int32 broadcast and vpmaddwd adds both taps to 32 output channels without horizontal sums. A
 * padded tap adds pad_value * sum_k w (precomputed). Products are at most 255 x 255 and every
 * lane sums modulo 2^32: exec_rbe sums in int64 and wraps to 32 bits, the same value. */
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

uint64_t mars_rbe_simd_bytes(const mars_cmd *c)
{
    const uint64_t taps = (uint64_t)(c->kh * c->kw), kp = ((uint64_t)c->k_in + 1) / 2 * 2;
    const uint64_t lanes = ((uint64_t)c->k_out + 31) / 32 * 32;
    return 2 * (uint64_t)(c->h_in * c->w_in) * kp       /* xs */
           + 4 * lanes * taps * (kp / 2)                /* pairs */
           + 4 * lanes * taps;                          /* pad sums */
}

ACCEL_TARGET_AVX2 int mars_rbe_acc_avx2(const mars_cmd *c, const uint8_t *x, const int16_t *w, void *buf,
                                        uint32_t *acc)
{
    const int64_t H = c->h_in, W = c->w_in, Ki = c->k_in, Ko = c->k_out;
    const uint64_t taps = (uint64_t)(c->kh * c->kw), kp = ((uint64_t)Ki + 1) / 2 * 2, nq = kp / 2;
    const uint64_t groups = ((uint64_t)Ko + 31) / 32, lanes = groups * 32;
    int16_t *xs = (int16_t *)buf;
    int32_t *wp = (int32_t *)(void *)(xs + (uint64_t)(H * W) * kp);
    uint32_t *pads = (uint32_t *)(wp + lanes * taps * nq);
    uint64_t p, k, g, f, q, o;
    for (p = 0; p < (uint64_t)(H * W); p++) {
        for (k = 0; k < (uint64_t)Ki; k++)
            xs[p * kp + k] = x[p * (uint64_t)Ki + k];
        if (kp != (uint64_t)Ki)
            xs[p * kp + (uint64_t)Ki] = 0;
    }
    for (g = 0; g < groups; g++)
        for (f = 0; f < taps; f++)
            for (q = 0; q < nq; q++)
                for (o = g * 32; o < g * 32 + 32; o++) {
                    uint32_t w0 = 0, w1 = 0;
                    if (o < (uint64_t)Ko) {
                        const int16_t *wv = w + (o * taps + f) * (uint64_t)Ki + 2 * q;
                        w0 = (uint16_t)wv[0];
                        w1 = 2 * q + 1 < (uint64_t)Ki ? (uint16_t)wv[1] : 0;
                    }
                    wp[((g * taps + f) * nq + q) * 32 + o - g * 32] = accel_as_i32(w0 | (w1 << 16));
                }
    for (f = 0; f < taps; f++)
        for (o = 0; o < lanes; o++) {
            int64_t s = 0;
            if (o < (uint64_t)Ko)
                for (k = 0; k < (uint64_t)Ki; k++)
                    s += w[(o * taps + f) * (uint64_t)Ki + k];
            pads[f * lanes + o] = (uint32_t)((uint64_t)(s * c->pad_value) & 0xffffffffu);
        }
    for (int64_t ho = 0; ho < c->h_out; ho++) {
        if (accel_should_stop())
            return 1;
        for (int64_t wo = 0; wo < c->w_out; wo++) {
            uint32_t *a = acc + (uint64_t)(ho * c->w_out + wo) * lanes;
            for (g = 0; g < groups; g++) {
                __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
                for (int ky = 0; ky < c->kh; ky++)
                    for (int kx = 0; kx < c->kw; kx++) {
                        const int64_t hi = ho * c->stride_h + ky - c->pad_t, wi = wo * c->stride_w + kx - c->pad_l;
                        f = (uint64_t)(ky * c->kw + kx);
                        if (hi < 0 || hi >= H || wi < 0 || wi >= W) {
                            const uint32_t *ps = pads + f * lanes + g * 32;
                            s0 = _mm256_add_epi32(s0, LD256(ps));
                            s1 = _mm256_add_epi32(s1, LD256(ps + 8));
                            s2 = _mm256_add_epi32(s2, LD256(ps + 16));
                            s3 = _mm256_add_epi32(s3, LD256(ps + 24));
                        } else {
                            const int16_t *xv = xs + (uint64_t)(hi * W + wi) * kp;
                            const int32_t *wr = wp + (g * taps + f) * nq * 32;
                            for (q = 0; q < nq; q++, wr += 32) {
                                const __m256i bc = _mm256_set1_epi32(pair_at(xv + 2 * q));
                                s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(bc, LD256(wr)));
                                s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(bc, LD256(wr + 8)));
                                s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(bc, LD256(wr + 16)));
                                s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(bc, LD256(wr + 24)));
                            }
                        }
                    }
                _mm256_storeu_si256((__m256i *)(void *)(a + g * 32), s0);
                _mm256_storeu_si256((__m256i *)(void *)(a + g * 32 + 8), s1);
                _mm256_storeu_si256((__m256i *)(void *)(a + g * 32 + 16), s2);
                _mm256_storeu_si256((__m256i *)(void *)(a + g * 32 + 24), s3);
            }
        }
    }
    return 0;
}
#endif
