/* Functional semantics of MARSELLUS commands (see python/tvm_marsellus/codegen.py). Every
 * address was checked by mars_decode; executors only compute.
 *
 * A stop request (accelsim_request_stop) is polled once per output pixel (RBE, CLUSTER), input
 * row (unpacking) and ACCEL_STOP_POLL DMA rows; the executors then return ACCEL_ERR_INTERRUPTED without a
 * message (mars_sim_run words it with the cycle). */
#include "common/simd.h"
#include "marsellus/mars_bitplane.h"
#include "marsellus/mars_internal.h"

/* floor(v / 2^s) for any int64 v, s in 0..31, without implementation-defined shifts. */
static int64_t floor_shift(int64_t v, int s)
{
    if (v >= 0)
        return v >> s;
    return -(int64_t)(((uint64_t)(-(v + 1)) >> s)) - 1;
}

/* Wrap an int64 to int32 two's complement (the 32-bit accumulators). */
static int64_t wrap32(int64_t v)
{
    uint32_t u = (uint32_t)((uint64_t)v & 0xffffffffu);
    return (int64_t)accel_as_i32(u);
}

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* NormQuant shared by the RBE and the cluster kernels:
 * y = sat(((acc * kappa) + lambda) >> shift) in int64, floor shift; then ReLU / saturation. */
static int64_t normquant(int64_t acc, uint32_t kappa, int32_t lambda, int shift, int bits,
                         int is_signed, int relu)
{
    int64_t y = floor_shift(acc * (int64_t)kappa + (int64_t)lambda, shift);
    int64_t lo = is_signed ? -((int64_t)1 << (bits - 1)) : 0;
    int64_t hi = is_signed ? ((int64_t)1 << (bits - 1)) - 1 : ((int64_t)1 << bits) - 1;
    if (relu && lo < 0)
        lo = 0;
    return clamp64(y, lo, hi);
}

static void nq_record(const uint8_t *l1, uint64_t nq, int64_t ch, uint32_t *kappa, int32_t *lambda)
{
    const uint8_t *r = l1 + nq + 6 * (uint64_t)ch;
    *kappa = (uint32_t)r[0] | ((uint32_t)r[1] << 8);
    *lambda = accel_as_i32(accel_ld_u32le(r + 2));
}

/* Element i of a bit-packed tensor (element i at bits [i*bits, (i+1)*bits), little-endian). */
static int32_t get_elem(const uint8_t *base, uint64_t i, int bits, int is_signed)
{
    uint64_t bit = i * (uint64_t)bits;
    uint32_t v = ((uint32_t)base[bit >> 3] >> (bit & 7)) & ((1u << bits) - 1);
    if (is_signed && (v >> (bits - 1)))
        return (int32_t)v - (1 << bits);
    return (int32_t)v;
}

static void set_elem(uint8_t *base, uint64_t i, int bits, int64_t value)
{
    uint64_t bit = i * (uint64_t)bits;
    uint32_t mask = ((1u << bits) - 1) << (bit & 7);
    uint32_t v = ((uint32_t)((uint64_t)value & ((1u << bits) - 1))) << (bit & 7);
    base[bit >> 3] = (uint8_t)((base[bit >> 3] & ~mask) | v);
}

static int32_t *unpack_tensor(const uint8_t *base, uint64_t n, int bits, int is_signed)
{
    int32_t *out = accel_calloc(n, sizeof(int32_t));
    if (!out)
        return NULL;
    if (bits == 8) {
        for (uint64_t i = 0; i < n; i++)
            out[i] = is_signed ? (int32_t)(int8_t)base[i] : (int32_t)base[i];
    } else {
        for (uint64_t i = 0; i < n; i++)
            out[i] = get_elem(base, i, bits, is_signed);
    }
    return out;
}

/* --- bit-plane layout helpers (mars_bitplane.h) ------------------------------------------- */
/* Value of channel k of the pixel at byte offset pix (layout (K/32, bits, 32)), unsigned. */
static void unpack_pixel(const uint8_t *pix, int64_t k_count, int bits, uint8_t *out)
{
    for (int64_t t = 0; t * 32 < k_count; t++) {
        int64_t kt = k_count - t * 32 < 32 ? k_count - t * 32 : 32;
        uint8_t v[32];
        mars_planes_to_values(pix + 4 * (uint64_t)t * (uint64_t)bits, 4, bits, v);
        for (int64_t j = 0; j < kt; j++)
            out[t * 32 + j] = v[j];
    }
}

static void pack_pixel(uint8_t *pix, int64_t k_count, int bits, const int64_t *vals)
{
    for (int64_t t = 0; t * 32 < k_count; t++) {
        int64_t kt = k_count - t * 32 < 32 ? k_count - t * 32 : 32;
        uint64_t q[4] = {0, 0, 0, 0};
        for (int64_t j = 0; j < kt; j++)
            q[j / 8] |= ((uint64_t)vals[t * 32 + j] & 0xffu) << (8 * (j % 8));
        for (int b = 0; b < bits; b++) {
            uint32_t word = 0;
            for (int i = 0; i < 4; i++)
                word |= mars_gather8((q[i] >> b) & UINT64_C(0x0101010101010101)) << (8 * i);
            accel_st_u32le(pix + 4 * ((uint64_t)t * (uint64_t)bits + (uint64_t)b), word);
        }
    }
}

/* --- RBE ------------------------------------------------------------------------------------- */
/* One RBE job: the weights from the run's cache (mars_rbe_cache.c), then the AVX2 job
 * (mars_rbe_simd.c) or this portable loop; both read all inputs before writing any output. */
static int exec_rbe(const mars_cmd *c, uint64_t idx, mars_mems *m, mars_rbe_cache *cache, accel_err *e)
{
    uint8_t *l1 = m->mem[MARS_MEM_L1];
    int64_t H = c->h_in, W = c->w_in, Ki = c->k_in, Ko = c->k_out;
    int taps = c->kh * c->kw;
    const int simd = accel_use_avx2();
    const mars_rbe_wts *wt = NULL;
    const int16_t *w;
    uint8_t *x = NULL;
    int64_t *y = NULL;
    int rc = mars_rbe_weights(cache, c, l1, simd, &wt);
    if (rc == ACCEL_ERR_NOMEM)
        goto nomem;
    if (rc != ACCEL_OK)
        return rc;
#if ACCEL_HAVE_AVX2
    if (simd) {
        void *scratch = mars_rbe_scratch(cache, mars_rbe_simd_bytes(c));
        if (!scratch)
            goto nomem;
        return mars_rbe_job_avx2(c, l1, wt, scratch) ? ACCEL_ERR_INTERRUPTED : ACCEL_OK;
    }
#endif
    w = wt->w;
    x = accel_calloc((uint64_t)(H * W * Ki), 1);
    y = accel_calloc((uint64_t)(c->h_out * c->w_out * Ko), sizeof(int64_t));
    if (!x || !y)
        goto nomem;
    for (int64_t h = 0; h < H; h++) {
        if (accel_should_stop())
            goto stopped;
        for (int64_t ww = 0; ww < W; ww++)
            unpack_pixel(l1 + c->x + (uint64_t)h * c->x_rs + (uint64_t)ww * c->x_ps, Ki, c->in_bits,
                         x + (h * W + ww) * Ki);
    }
    for (int64_t ho = 0; ho < c->h_out; ho++)
        for (int64_t wo = 0; wo < c->w_out; wo++) {
            if (accel_should_stop())
                goto stopped;
            for (int64_t o = 0; o < Ko; o++) {
                int64_t acc = 0;
                for (int ky = 0; ky < c->kh; ky++)
                    for (int kx = 0; kx < c->kw; kx++) {
                        int64_t hi = ho * c->stride_h + ky - c->pad_t, wi = wo * c->stride_w + kx - c->pad_l;
                        const int16_t *wv = w + (o * taps + ky * c->kw + kx) * Ki;
                        int64_t s = 0;
                        if (hi < 0 || hi >= H || wi < 0 || wi >= W) {
                            for (int64_t k = 0; k < Ki; k++)
                                s += (int64_t)wv[k];
                            s *= c->pad_value;
                        } else {
                            const uint8_t *xv = x + (hi * W + wi) * Ki;
                            for (int64_t k = 0; k < Ki; k++)
                                s += (int64_t)xv[k] * wv[k];
                        }
                        acc += s;
                    }
                {
                    uint32_t kappa;
                    int32_t lambda;
                    nq_record(l1, c->nq, o, &kappa, &lambda);
                    y[(ho * c->w_out + wo) * Ko + o] =
                        normquant(wrap32(acc), kappa, lambda, c->shift, c->out_bits, c->out_signed, c->relu);
                }
            }
        }
    for (int64_t ho = 0; ho < c->h_out; ho++)
        for (int64_t wo = 0; wo < c->w_out; wo++)
            pack_pixel(l1 + c->y + (uint64_t)ho * c->y_rs + (uint64_t)wo * c->y_ps, Ko, c->out_bits,
                       y + (ho * c->w_out + wo) * Ko);
    goto done;
nomem:
    rc = accel_fail(e, ACCEL_ERR_NOMEM, "cmd %llu (RBE): out of host memory", (unsigned long long)idx);
    goto done;
stopped:
    rc = ACCEL_ERR_INTERRUPTED;
done:
    free(x);
    free(y);
    return rc;
}

/* --- CLUSTER --------------------------------------------------------------------------------- */
/* The kernels below fill `out` (one int64 per output element) and return ACCEL_OK,
 * ACCEL_ERR_NOMEM (no message recorded yet) or ACCEL_ERR_INTERRUPTED. */

/* RBE2HWC: bit-plane pixels of the input back to (sign-extended) values. */
static int cl_rbe_to_hwc(const mars_cmd *c, const uint8_t *l1, int64_t *out)
{
    const int64_t Ci = c->k_in, n_pix = c->h_in * c->w_in;
    uint64_t pix = (uint64_t)(Ci + 31) / 32 * (uint64_t)c->in_bits * 4;
    uint8_t *v = accel_calloc((uint64_t)Ci, 1);
    if (!v)
        return ACCEL_ERR_NOMEM;
    for (int64_t p = 0; p < n_pix; p++) {
        if (accel_should_stop()) {
            free(v);
            return ACCEL_ERR_INTERRUPTED;
        }
        unpack_pixel(l1 + c->x + (uint64_t)p * pix, Ci, c->in_bits, v);
        for (int64_t ch = 0; ch < Ci; ch++) {
            int64_t val = v[ch];
            if (c->in_signed && (val >> (c->in_bits - 1)))
                val -= (int64_t)1 << c->in_bits;
            out[p * Ci + ch] = val;
        }
    }
    free(v);
    return ACCEL_OK;
}

/* HWC2RBE: the input values (a) written as bit-plane pixels of out_bits planes. */
static int cl_hwc_to_rbe(const mars_cmd *c, uint8_t *l1, const int32_t *a)
{
    const int64_t Ci = c->k_in, n_pix = c->h_in * c->w_in;
    uint64_t pix = (uint64_t)(Ci + 31) / 32 * (uint64_t)c->out_bits * 4;
    int64_t *v = accel_calloc((uint64_t)Ci, sizeof(int64_t));
    if (!v)
        return ACCEL_ERR_NOMEM;
    for (int64_t p = 0; p < n_pix; p++) {
        if (accel_should_stop()) {
            free(v);
            return ACCEL_ERR_INTERRUPTED;
        }
        for (int64_t ch = 0; ch < Ci; ch++)
            v[ch] = (int64_t)((uint64_t)(int64_t)a[p * Ci + ch] & ((1u << c->out_bits) - 1));
        pack_pixel(l1 + c->y + (uint64_t)p * pix, Ci, c->out_bits, v);
    }
    free(v);
    return ACCEL_OK;
}

/* Accumulator of output channel o at (ho, wo) of a DWCONV over the input a and the weights wt
 * (pad: value of padded input pixels). */
static int64_t conv_acc(const mars_cmd *c, const int32_t *a, const int32_t *wt, int pad, int64_t ho, int64_t wo,
                        int64_t o, int64_t acc)
{
    const int64_t Hi = c->h_in, Wi = c->w_in, Ci = c->k_in, taps = (int64_t)c->kh * c->kw;
    for (int ky = 0; ky < c->kh; ky++)
        for (int kx = 0; kx < c->kw; kx++) {
            int64_t hi = ho * c->stride_h + ky - c->pad_t, wi = wo * c->stride_w + kx - c->pad_l;
            int inside = hi >= 0 && hi < Hi && wi >= 0 && wi < Wi;
            int64_t xv = inside ? a[(hi * Wi + wi) * Ci + o] : pad;
            acc += xv * wt[o * taps + ky * c->kw + kx];
        }
    return acc;
}

/* Output of channel o from its accumulator acc: the 32-bit partial sum, or its NormQuant. */
static int64_t cl_conv_out(const mars_cmd *c, const uint8_t *l1, int64_t o, int64_t acc)
{
    uint32_t kappa;
    int32_t lambda;
    if (c->psum_out)
        return wrap32(acc);
    nq_record(l1, c->nq, o, &kappa, &lambda);
    return normquant(wrap32(acc), kappa, lambda, c->shift, c->out_bits, c->out_signed, c->relu);
}

/* CONV / FC accumulators of every output channel of a pixel at once, over the weights
 * transposed to [tap][c_in][c_out] (wT) so the innermost loop runs over contiguous channels.
 * Sums are modulo 2^32 (uint32): only their 32-bit wrap is used, which is the same value as
 * conv_acc's int64 sum wrapped. */
static void cl_conv_pixel(const mars_cmd *c, const uint8_t *l1, const int32_t *a, int pad, const uint32_t *wT,
                          int64_t ho, int64_t wo, uint32_t *acc)
{
    const int64_t Hi = c->h_in, Wi = c->w_in, Ci = c->k_in, Co = c->k_out;
    const uint64_t base = (uint64_t)((ho * c->w_out + wo) * Co);
    for (int64_t o = 0; o < Co; o++)
        acc[o] = c->psum_in ? accel_ld_u32le(l1 + c->psum + 4 * (base + (uint64_t)o)) : 0;
    for (int ky = 0; ky < c->kh; ky++)
        for (int kx = 0; kx < c->kw; kx++) {
            const int64_t hi = ho * c->stride_h + ky - c->pad_t, wi = wo * c->stride_w + kx - c->pad_l;
            const int inside = hi >= 0 && hi < Hi && wi >= 0 && wi < Wi;
            const int32_t *xv = inside ? a + (hi * Wi + wi) * Ci : NULL;
            const uint32_t *row = wT + (uint64_t)((ky * c->kw + kx) * Ci * Co);
            for (int64_t ch = 0; ch < Ci; ch++, row += Co) {
                const uint32_t x = (uint32_t)(inside ? xv[ch] : pad);
                for (int64_t o = 0; o < Co; o++)
                    acc[o] += x * row[o];
            }
        }
}

/* CONV / DWCONV / FC: 32-bit sums (partial sums in and / or out) or normquant'ed outputs. */
static int cl_conv(const mars_cmd *c, const uint8_t *l1, const int32_t *a, int pad, int64_t *out)
{
    const int64_t Ho = c->h_out, Wo = c->w_out, Co = c->k_out, Ci = c->k_in, taps = (int64_t)c->kh * c->kw;
    const int dw = c->kernel == MARS_CL_DWCONV;
    uint64_t nw = (uint64_t)(dw ? Co * taps : Co * taps * Ci);
    int32_t *wt = unpack_tensor(l1 + c->w, nw, c->w_bits, 1);
    uint32_t *wT = dw ? NULL : accel_calloc(nw, sizeof(uint32_t)), *acc = accel_calloc((uint64_t)Co, sizeof(uint32_t));
    int rc = ACCEL_OK;
    if (!wt || (!dw && !wT) || !acc) {
        rc = ACCEL_ERR_NOMEM;
        goto done;
    }
    for (int64_t o = 0; !dw && o < Co; o++)
        for (int64_t f = 0; f < taps; f++)
            for (int64_t ch = 0; ch < Ci; ch++)
                wT[(f * Ci + ch) * Co + o] = (uint32_t)wt[(o * taps + f) * Ci + ch];
    for (int64_t ho = 0; ho < Ho; ho++)
        for (int64_t wo = 0; wo < Wo; wo++) {
            if (accel_should_stop()) {
                rc = ACCEL_ERR_INTERRUPTED;
                goto done;
            }
            if (!dw)
                cl_conv_pixel(c, l1, a, pad, wT, ho, wo, acc);
            for (int64_t o = 0; o < Co; o++) {
                uint64_t oi = (uint64_t)((ho * Wo + wo) * Co + o);
                int64_t sum;
                if (dw)
                    sum = conv_acc(c, a, wt, pad, ho, wo, o,
                                   c->psum_in ? (int64_t)accel_as_i32(accel_ld_u32le(l1 + c->psum + 4 * oi)) : 0);
                else
                    sum = accel_as_i32(acc[o]);
                out[oi] = cl_conv_out(c, l1, o, sum);
            }
        }
done:
    free(wt);
    free(wT);
    free(acc);
    return rc;
}

/* ADD: kappa_a * A + kappa_b * B, normquant'ed. */
static int cl_add(const mars_cmd *c, const uint8_t *l1, const int32_t *a, uint64_t n_in, uint64_t n_out, int64_t *out)
{
    int32_t *b = unpack_tensor(l1 + c->w, n_in, c->in_bits, c->b_signed);
    if (!b)
        return ACCEL_ERR_NOMEM;
    for (uint64_t i = 0; i < n_out; i++) {
        if ((i & 0xffff) == 0 && accel_should_stop()) {
            free(b);
            return ACCEL_ERR_INTERRUPTED;
        }
        out[i] = normquant((int64_t)a[i] * c->kappa_a + (int64_t)b[i] * c->kappa_b, 1, c->lambda, c->shift,
                           c->out_bits, c->out_signed, c->relu);
    }
    free(b);
    return ACCEL_OK;
}

/* LUT: each output byte is the table entry its input byte indexes, in the row of its channel
   (HWC: the channel is the innermost index) when the channel stride (lambda) is 256. */
static int cl_lut(const mars_cmd *c, uint8_t *l1)
{
    const uint64_t n = (uint64_t)(c->h_in * c->w_in), k = (uint64_t)c->k_in, stride = (uint64_t)c->lambda;
    for (uint64_t p = 0; p < n; p++) {
        if ((p & 0xfff) == 0 && accel_should_stop())
            return ACCEL_ERR_INTERRUPTED;
        for (uint64_t ch = 0; ch < k; ch++)
            l1[c->y + p * k + ch] = l1[c->w + ch * stride + l1[c->x + p * k + ch]];
    }
    return ACCEL_OK;
}

/* MUL: (A - pad_value) * (B[channel] - kappa_b as int16), normquant'ed with kappa_a. */
static int cl_mul(const mars_cmd *c, const uint8_t *l1, const int32_t *a, int pad, uint64_t n_out, int64_t *out)
{
    const uint64_t k = (uint64_t)c->k_in;
    const int64_t zb = (int16_t)(uint16_t)c->kappa_b;
    int32_t *b = unpack_tensor(l1 + c->w, k, 8, c->b_signed);
    if (!b)
        return ACCEL_ERR_NOMEM;
    for (uint64_t i = 0; i < n_out; i++) {
        if ((i & 0xffff) == 0 && accel_should_stop()) {
            free(b);
            return ACCEL_ERR_INTERRUPTED;
        }
        out[i] = normquant(((int64_t)a[i] - pad) * ((int64_t)b[i % k] - zb), c->kappa_a, c->lambda, c->shift,
                           c->out_bits, c->out_signed, c->relu);
    }
    free(b);
    return ACCEL_OK;
}

/* MAXPOOL / AVGPOOL. */
static int cl_pool(const mars_cmd *c, const int32_t *a, int pad, int64_t *out)
{
    const int64_t Hi = c->h_in, Wi = c->w_in, Ci = c->k_in, Ho = c->h_out, Wo = c->w_out, Co = c->k_out;
    const int max = c->kernel == MARS_CL_MAXPOOL;
    for (int64_t ho = 0; ho < Ho; ho++)
        for (int64_t wo = 0; wo < Wo; wo++) {
            if (accel_should_stop())
                return ACCEL_ERR_INTERRUPTED;
            for (int64_t ch = 0; ch < Co; ch++) {
                int64_t acc = max ? INT64_MIN : 0;
                for (int ky = 0; ky < c->kh; ky++)
                    for (int kx = 0; kx < c->kw; kx++) {
                        int64_t hi = ho * c->stride_h + ky - c->pad_t, wi = wo * c->stride_w + kx - c->pad_l;
                        int64_t v = (hi >= 0 && hi < Hi && wi >= 0 && wi < Wi) ? a[(hi * Wi + wi) * Ci + ch] : pad;
                        if (max)
                            acc = v > acc ? v : acc;
                        else
                            acc += v;
                    }
                out[(ho * Wo + wo) * Co + ch] =
                    max ? normquant(acc, 1, 0, 0, c->out_bits, c->out_signed, c->relu)
                        : normquant(acc, c->kappa_a, c->lambda, c->shift, c->out_bits, c->out_signed, c->relu);
            }
        }
    return ACCEL_OK;
}

/* Writes the outputs at y (out_bits each), or the 32-bit partial sums at psum_addr. */
static void cl_store(const mars_cmd *c, uint8_t *l1, const int64_t *out, uint64_t n_out, int psum)
{
    if (psum) { /* partial sums stay 32-bit for the next input-channel chunk */
        for (uint64_t i = 0; i < n_out; i++)
            accel_st_u32le(l1 + c->psum + 4 * i, (uint32_t)((uint64_t)out[i] & 0xffffffffu));
        return;
    }
    for (uint64_t i = 0; i < n_out; i++) {
        if (c->out_bits == 8)
            l1[c->y + i] = (uint8_t)((uint64_t)out[i] & 0xffu);
        else
            set_elem(l1 + c->y, i, c->out_bits, out[i]);
    }
}

/* The kernels that read the input as values: everything but RBE2HWC. */
static int cl_on_values(const mars_cmd *c, uint8_t *l1, uint64_t n_in, uint64_t n_out, int64_t *out)
{
    int pad = c->in_signed ? (int)(int8_t)(uint8_t)c->pad_value : c->pad_value;
    int k = c->kernel, rc;
    int32_t *a = unpack_tensor(l1 + c->x, n_in, c->in_bits, c->in_signed);
    if (!a)
        return ACCEL_ERR_NOMEM;
    if (k == MARS_CL_HWC_TO_RBE) {
        rc = cl_hwc_to_rbe(c, l1, a);
        free(a);
        return rc;
    }
    if (k == MARS_CL_CONV || k == MARS_CL_DWCONV || k == MARS_CL_FC)
        rc = cl_conv(c, l1, a, pad, out);
    else if (k == MARS_CL_ADD)
        rc = cl_add(c, l1, a, n_in, n_out, out);
    else if (k == MARS_CL_MUL)
        rc = cl_mul(c, l1, a, pad, n_out, out);
    else
        rc = cl_pool(c, a, pad, out);
    if (rc == ACCEL_OK)
        cl_store(c, l1, out, n_out, c->psum_out);
    free(a);
    return rc;
}

static int exec_cluster(const mars_cmd *c, uint64_t idx, mars_mems *m, accel_err *e)
{
    uint8_t *l1 = m->mem[MARS_MEM_L1];
    uint64_t n_in = (uint64_t)(c->h_in * c->w_in * c->k_in), n_out = (uint64_t)(c->h_out * c->w_out * c->k_out);
    int64_t *out = accel_calloc(n_out, sizeof(int64_t));
    int rc = ACCEL_ERR_NOMEM;
    if (out && c->kernel == MARS_CL_LUT) {
        rc = cl_lut(c, l1);
    } else if (out && c->kernel == MARS_CL_RBE_TO_HWC) {
        rc = cl_rbe_to_hwc(c, l1, out);
        if (rc == ACCEL_OK)
            cl_store(c, l1, out, n_out, 0);
    } else if (out) {
        rc = cl_on_values(c, l1, n_in, n_out, out);
    }
    free(out);
    if (rc == ACCEL_ERR_NOMEM)
        return accel_fail(e, ACCEL_ERR_NOMEM, "cmd %llu (%s): out of host memory", (unsigned long long)idx,
                          mars_cmd_name(c));
    return rc;
}

/* --- DMA ------------------------------------------------------------------------------------- */
/* Rows copied in order, each as memmove would (so overlapping rows give what they always gave);
 * rows of 2 or 4 bytes (bit-plane words of 16 or 32 channels, ~100,000 rows per ResNet-20
 * inference) without a library call. */
static int exec_dma(const mars_cmd *c, mars_mems *m)
{
    const uint8_t *src = m->mem[c->src_mem];
    uint8_t *dst = m->mem[c->dst_mem];
    const uint64_t len = c->len;
    if (!len || !c->rows || !c->planes)
        return ACCEL_OK;
    for (uint64_t p = 0; p < c->planes; p++) {
        uint8_t *dp = dst + c->dst + p * c->dst_s2;
        const uint8_t *sp = src + c->src + p * c->src_s2;
        for (uint64_t r = 0; r < c->rows; r++) {
            uint8_t *d = dp + r * c->dst_s1;
            const uint8_t *s = sp + r * c->src_s1;
            if (r % ACCEL_STOP_POLL == 0 && accel_should_stop())
                return ACCEL_ERR_INTERRUPTED;
            if (len == 2) { /* fixed-size copies compile to one load and one store */
                uint16_t v;
                memcpy(&v, s, 2);
                memcpy(d, &v, 2);
            } else if (len == 4) {
                uint32_t v;
                memcpy(&v, s, 4);
                memcpy(d, &v, 4);
            } else {
                memmove(d, s, (size_t)len);
            }
        }
    }
    return ACCEL_OK;
}

int mars_exec(const mars_config *cfg, const mars_cmd *c, uint64_t idx, mars_mems *m, mars_rbe_cache *cache,
              accel_err *e)
{
    (void)cfg;
    switch (c->op) {
    case MARS_OP_DMA: return exec_dma(c, m);
    case MARS_OP_RBE: return exec_rbe(c, idx, m, cache, e);
    case MARS_OP_CLUSTER: return exec_cluster(c, idx, m, e);
    default: return ACCEL_OK;
    }
}
