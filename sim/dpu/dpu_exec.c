/* DPU simulator: execution of checked instructions (LOAD, SAVE, CONV, MISC) on FM, PM and DDR.
 *
 * Every FM/PM access goes through circ_* helpers (address modulo the memory size, lengths at most
 * the memory size - guaranteed by the checker); DDR ranges were checked against the region and
 * the buffer. Compute instructions first gather their inputs into dense scratch buffers, then
 * compute, then scatter the result, so an instruction reads everything before it writes.
 *
 * A stop request (accelsim_request_stop) is polled once per output row of CONV and pools (a
 * check per pixel made the CONV loops 13 % slower; the SIMD CONV once per chunk of weights), per
 * PE of the other MISC kinds and per row of LOAD / SAVE; the executors then return
 * ACCEL_ERR_INTERRUPTED without a message (dpu_sim_run words it with the cycle). */
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/simd.h"
#include "dpu/dpu_internal.h"

#if defined(__GNUC__)
#define DPU_RESTRICT __restrict__
#else
#define DPU_RESTRICT
#endif

enum { S_X = 0, S_W = 1, S_BIAS = 2, S_TMP = 3, S_B = 4, S_OUT = 5 };

static void *scratch(dpu_state *s, int slot, uint64_t bytes)
{
    if (bytes == 0)
        bytes = 1;
    if (bytes > s->scratch_cap[slot]) {
        void *p;
        if (bytes > (uint64_t)SIZE_MAX)
            return NULL;
        p = realloc(s->scratch[slot], (size_t)bytes);
        if (!p)
            return NULL;
        s->scratch[slot] = p;
        s->scratch_cap[slot] = bytes;
    }
    return s->scratch[slot];
}

void dpu_free_scratch(dpu_state *s)
{
    int i;
    for (i = 0; i < 6; i++) {
        free(s->scratch[i]);
        s->scratch[i] = NULL;
        s->scratch_cap[i] = 0;
    }
}

static uint8_t *fm_of(dpu_state *s, uint32_t pe, int64_t mem)
{
    return s->fm + ((uint64_t)pe * s->g.n_mem + (uint64_t)mem) * s->g.mem_bytes;
}

/* ------------------------------------------------------------------------------------------ */
/* Circular memories                                                                          */

static void circ_rd(const uint8_t *mem, uint64_t M, uint64_t addr, uint8_t *dst, uint64_t len)
{
    const uint64_t a = addr % M;
    if (a + len <= M) {
        memcpy(dst, mem + a, (size_t)len);
    } else {
        const uint64_t n1 = M - a;
        memcpy(dst, mem + a, (size_t)n1);
        memcpy(dst + n1, mem, (size_t)(len - n1));
    }
}

static void circ_wr(uint8_t *mem, uint64_t M, uint64_t addr, const uint8_t *src, uint64_t len)
{
    const uint64_t a = addr % M;
    if (a + len <= M) {
        memcpy(mem + a, src, (size_t)len);
    } else {
        const uint64_t n1 = M - a;
        memcpy(mem + a, src, (size_t)n1);
        memcpy(mem, src + n1, (size_t)(len - n1));
    }
}

/* int8 bytes -> int16 */
static void widen(const uint8_t *DPU_RESTRICT src, int16_t *DPU_RESTRICT dst, uint64_t n)
{
    uint64_t i;
    const int8_t *p = (const int8_t *)src;
    for (i = 0; i < n; i++)
        dst[i] = p[i];
}

static void circ_rd16(const uint8_t *mem, uint64_t M, uint64_t addr, int16_t *dst, uint64_t len)
{
    const uint64_t a = addr % M;
    const uint64_t n1 = a + len <= M ? len : M - a;
    widen(mem + a, dst, n1);
    widen(mem, dst + n1, len - n1);
}

/* dense[rows][cols][pb] <- FM tensor (and back) */
static void fm_gather(const uint8_t *mem, uint64_t M, uint64_t addr, uint64_t ps, uint64_t rs, uint64_t rows,
                      uint64_t cols, uint64_t pb, uint8_t *dst)
{
    uint64_t r, w;
    for (r = 0; r < rows; r++) {
        if (ps == pb || cols == 1)
            circ_rd(mem, M, addr + r * rs, dst + r * cols * pb, cols * pb);
        else
            for (w = 0; w < cols; w++)
                circ_rd(mem, M, addr + r * rs + w * ps, dst + (r * cols + w) * pb, pb);
    }
}

static void fm_scatter(uint8_t *mem, uint64_t M, uint64_t addr, uint64_t ps, uint64_t rs, uint64_t rows,
                       uint64_t cols, uint64_t pb, const uint8_t *src)
{
    uint64_t r, w;
    for (r = 0; r < rows; r++) {
        if (ps == pb || cols == 1)
            circ_wr(mem, M, addr + r * rs, src + r * cols * pb, cols * pb);
        else
            for (w = 0; w < cols; w++)
                circ_wr(mem, M, addr + r * rs + w * ps, src + (r * cols + w) * pb, pb);
    }
}

/* Padded window X[win_rows][win_cols][c] (int16) of a CONV / pool: pad_value outside the input. */
static void gather_window16(const uint8_t *mem, uint64_t M, const dpu_insn *in, uint64_t c, int16_t *X)
{
    const uint64_t Hw = in->win_rows, Ww = in->win_cols, pt = (uint64_t)in->pad_top, pl = (uint64_t)in->pad_left;
    const uint64_t ps = (uint64_t)in->in_pix_stride, rs = (uint64_t)in->in_row_stride, addr = (uint64_t)in->in_addr;
    uint64_t r, w, i;
    if (in->in_rows != Hw || in->in_cols != Ww) {
        const int16_t pv = (int16_t)in->pad_value;
        const uint64_t total = Hw * Ww * c;
        for (i = 0; i < total; i++)
            X[i] = pv;
    }
    for (r = 0; r < in->in_rows; r++) {
        int16_t *d = X + ((r + pt) * Ww + pl) * c;
        if (ps == c || in->in_cols == 1)
            circ_rd16(mem, M, addr + r * rs, d, in->in_cols * c);
        else
            for (w = 0; w < in->in_cols; w++)
                circ_rd16(mem, M, addr + r * rs + w * ps, d + w * c, c);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Fix-point helpers                                                                          */

/* ------------------------------------------------------------------------------------------ */
/* CONV                                                                                       */

/* Dot products of one input row segment with four weight rows. Each partial sum is bounded by
 * n x 2^14 <= 15 x 4095 x 2^14 < 2^31, so int32 never overflows here. */
static void dot4(const int16_t *DPU_RESTRICT x, const int16_t *DPU_RESTRICT w0, const int16_t *DPU_RESTRICT w1,
                 const int16_t *DPU_RESTRICT w2, const int16_t *DPU_RESTRICT w3, uint64_t n, uint32_t acc[4])
{
    int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    uint64_t i;
    for (i = 0; i < n; i++) {
        const int32_t xv = x[i];
        s0 += xv * w0[i];
        s1 += xv * w1[i];
        s2 += xv * w2[i];
        s3 += xv * w3[i];
    }
    acc[0] += (uint32_t)s0;
    acc[1] += (uint32_t)s1;
    acc[2] += (uint32_t)s2;
    acc[3] += (uint32_t)s3;
}

static uint32_t dot1(const int16_t *DPU_RESTRICT x, const int16_t *DPU_RESTRICT w, uint64_t n)
{
    int32_t s = 0;
    uint64_t i;
    for (i = 0; i < n; i++)
        s += (int32_t)x[i] * w[i];
    return (uint32_t)s;
}

/* out[oh][ow][oc] from X[Hw][Ww][ic] and W[oc][kh][kw * ic]; the taps of a kernel row are d * ic
 * apart in X (contiguous when d = 1: one dot product of kw * ic); 1 when a stop was requested. */
static int conv_dense(const dpu_insn *in, const int16_t *X, const int16_t *W, const int32_t *bias, uint8_t *out)
{
    const uint64_t ic = (uint64_t)in->ic, oc = (uint64_t)in->oc, oh = (uint64_t)in->out_h, ow = (uint64_t)in->out_w;
    const uint64_t kh = (uint64_t)in->kernel_h, kw = (uint64_t)in->kernel_w, d = (uint64_t)in->dilation;
    const uint64_t sh = (uint64_t)in->stride_h, sw = (uint64_t)in->stride_w, Ww = in->win_cols;
    const uint64_t K = kw * ic, xrow = Ww * ic, wstride = kh * K;
    /* segments per kernel row: one of kw * ic (dense) or kw of ic (dilated) */
    const uint64_t nseg = d == 1 ? 1 : kw, seg = d == 1 ? K : ic, xstep = d * ic;
    const unsigned shift = (unsigned)in->shift;
    const int64_t lo = in->clip_lo, hi = in->clip_hi;
    uint64_t y, x, o, ky, j;
    for (y = 0; y < oh; y++) {
        if (accel_should_stop())
            return 1;
        for (x = 0; x < ow; x++) {
            const int16_t *xb = X + (y * sh * Ww + x * sw) * ic;
            uint8_t *o8 = out + (y * ow + x) * oc;
            for (o = 0; o + 4 <= oc; o += 4) {
                uint32_t acc[4] = {0, 0, 0, 0};
                const int16_t *w0 = W + o * wstride;
                for (ky = 0; ky < kh; ky++)
                    for (j = 0; j < nseg; j++) {
                        const uint64_t wo = ky * K + j * seg;
                        dot4(xb + ky * d * xrow + j * xstep, w0 + wo, w0 + wstride + wo, w0 + 2 * wstride + wo,
                             w0 + 3 * wstride + wo, seg, acc);
                    }
                o8[o] = dpu_requant(acc[0], bias[o], shift, lo, hi);
                o8[o + 1] = dpu_requant(acc[1], bias[o + 1], shift, lo, hi);
                o8[o + 2] = dpu_requant(acc[2], bias[o + 2], shift, lo, hi);
                o8[o + 3] = dpu_requant(acc[3], bias[o + 3], shift, lo, hi);
            }
            for (; o < oc; o++) {
                uint32_t acc = 0;
                for (ky = 0; ky < kh; ky++)
                    for (j = 0; j < nseg; j++)
                        acc += dot1(xb + ky * d * xrow + j * xstep, W + o * wstride + ky * K + j * seg, seg);
                o8[o] = dpu_requant(acc, bias[o], shift, lo, hi);
            }
        }
    }
    return 0;
}

/* Depthwise: out[oh][ow][c] from X[Hw][Ww][c] and Wd[kh * kw][c]; |acc| <= 225 x 2^14. 1 when a
 * stop was requested. */
static int conv_depthwise(const dpu_insn *in, const int16_t *X, const int16_t *Wd, const int32_t *bias, int32_t *acc,
                           uint8_t *out)
{
    const uint64_t c = (uint64_t)in->oc, oh = (uint64_t)in->out_h, ow = (uint64_t)in->out_w;
    const uint64_t kh = (uint64_t)in->kernel_h, kw = (uint64_t)in->kernel_w, d = (uint64_t)in->dilation;
    const uint64_t sh = (uint64_t)in->stride_h, sw = (uint64_t)in->stride_w, Ww = in->win_cols;
    const unsigned shift = (unsigned)in->shift;
    uint64_t y, x, ky, kx, ch;
    for (y = 0; y < oh; y++) {
        if (accel_should_stop())
            return 1;
        for (x = 0; x < ow; x++) {
            uint8_t *o8 = out + (y * ow + x) * c;
            memset(acc, 0, (size_t)c * sizeof(int32_t));
            for (ky = 0; ky < kh; ky++)
                for (kx = 0; kx < kw; kx++) {
                    const int16_t *DPU_RESTRICT xp = X + ((y * sh + ky * d) * Ww + x * sw + kx * d) * c;
                    const int16_t *DPU_RESTRICT wp = Wd + (ky * kw + kx) * c;
                    int32_t *DPU_RESTRICT a = acc;
                    for (ch = 0; ch < c; ch++)
                        a[ch] += (int32_t)xp[ch] * wp[ch];
                }
            for (ch = 0; ch < c; ch++)
                o8[ch] = dpu_requant((uint32_t)acc[ch], bias[ch], shift, in->clip_lo, in->clip_hi);
        }
    }
    return 0;
}

/* The nonlinear module's LeakyReLU on the CONV's int8 result c (slope 26/256, as the
 * DPUCZDX8G's): c >= 0 ? c : (26 * c + 128) >> 8 (rounded half up), then clip_lo..clip_hi. */
static void leaky_relu(uint8_t *out, uint64_t n, int64_t lo, int64_t hi)
{
    uint64_t i;
    for (i = 0; i < n; i++) {
        const int64_t c = (int8_t)out[i];
        out[i] = dpu_clip8(c >= 0 ? c : dpu_asr64(26 * c + 128, 8), lo, hi);
    }
}

/* The dense CONV of one PE: on AVX2 (dpu_conv_simd.c) when Wp is set, the pair-layout weights
 * built on the first PE (the PEs share the weights). 1 when a stop was requested. */
static int conv_dense_pe(const dpu_insn *in, const int16_t *X, const int16_t *W, const int32_t *bias, uint8_t *out,
                         int32_t *Wp, uint64_t pe)
{
#if ACCEL_HAVE_VNNI
    if (Wp && accel_use_vnni())
        return dpu_conv_dense_vnni(in, X, W, bias, out, Wp, Wp + dpu_conv_pairs_len(in), pe == 0);
#endif
#if ACCEL_HAVE_AVX2
    if (Wp)
        return dpu_conv_dense_avx2(in, X, W, bias, out, Wp, Wp + dpu_conv_pairs_len(in), pe == 0);
#else
    (void)Wp, (void)pe;
#endif
    return conv_dense(in, X, W, bias, out);
}

static int exec_conv(dpu_state *s, const dpu_insn *insn, accel_err *err)
{
    /* with LeakyReLU the CONV's own result is clipped to int8, the module clips its output */
    dpu_insn cv = *insn;
    const dpu_insn *in = &cv;
    if (insn->leaky) {
        cv.clip_lo = -128;
        cv.clip_hi = 127;
    }
    const dpu_geom *g = &s->g;
    const uint64_t ic = (uint64_t)in->ic, oc = (uint64_t)in->oc, oh = (uint64_t)in->out_h, ow = (uint64_t)in->out_w;
    const uint64_t kk = (uint64_t)(in->kernel_h * in->kernel_w);
    const uint64_t nw = oc * kk * (in->depthwise ? 1 : ic);
    const uint64_t nx = in->win_rows * in->win_cols * ic;
    int32_t *Wp = NULL;
    int16_t *X = (int16_t *)scratch(s, S_X, (nx + 2) * sizeof(int16_t)); /* 2 slack: see dpu_conv_simd.c */
    int16_t *W = (int16_t *)scratch(s, S_W, nw * sizeof(int16_t));
    int32_t *bias = (int32_t *)scratch(s, S_BIAS, oc * sizeof(int32_t));
    uint8_t *out = (uint8_t *)scratch(s, S_OUT, oh * ow * oc);
    void *tmp = scratch(s, S_TMP, (in->depthwise ? nw * sizeof(int16_t) : 0) + oc * sizeof(int32_t) + 4 * oc);
    uint64_t o, p;
    if (!X || !W || !bias || !out || !tmp)
        return accel_fail(err, ACCEL_ERR_NOMEM, "insn %u (%s): out of host memory for the conv buffers", in->index,
                          in->name);
    /* parameters: weights then int32 little-endian biases, contiguous in the circular PM */
    {
        uint8_t *bb = (uint8_t *)tmp;
        circ_rd(s->pm, g->pm_bytes, (uint64_t)in->param_addr + nw, bb, 4 * oc);
        for (o = 0; o < oc; o++)
            bias[o] = accel_as_i32(accel_ld_u32le(bb + 4 * o));
    }
    if (in->depthwise) {
        /* PM holds W[oc][kk]; the kernel wants Wd[kk][oc] */
        int16_t *raw = (int16_t *)((uint8_t *)tmp + 4 * oc + oc * sizeof(int32_t));
        int32_t *acc = (int32_t *)((uint8_t *)tmp + 4 * oc);
        uint64_t k;
        circ_rd16(s->pm, g->pm_bytes, (uint64_t)in->param_addr, raw, nw);
        for (o = 0; o < oc; o++)
            for (k = 0; k < kk; k++)
                W[k * oc + o] = raw[o * kk + k];
        for (p = 0; p < g->n_pe; p++) {
            uint8_t *mem_in = fm_of(s, (uint32_t)p, in->in_mem), *mem_out = fm_of(s, (uint32_t)p, in->out_mem);
            gather_window16(mem_in, g->mem_bytes, in, ic, X);
            if (conv_depthwise(in, X, W, bias, acc, out))
                return ACCEL_ERR_INTERRUPTED;
            if (insn->leaky)
                leaky_relu(out, oh * ow * oc, insn->clip_lo, insn->clip_hi);
            fm_scatter(mem_out, g->mem_bytes, (uint64_t)in->out_addr, (uint64_t)in->out_pix_stride,
                       (uint64_t)in->out_row_stride, oh, ow, oc, out);
        }
        return ACCEL_OK;
    }
    circ_rd16(s->pm, g->pm_bytes, (uint64_t)in->param_addr, W, nw);
    X[nx] = X[nx + 1] = 0;
#if ACCEL_HAVE_AVX2
    if (!in->depthwise && accel_use_avx2()) {
        Wp = (int32_t *)scratch(s, S_B, (dpu_conv_pairs_len(in) + dpu_conv_sums_len(in)) * sizeof(int32_t));
        if (!Wp)
            return accel_fail(err, ACCEL_ERR_NOMEM, "insn %u (%s): out of host memory for the conv buffers",
                              in->index, in->name);
    }
#endif
    for (p = 0; p < g->n_pe; p++) {
        uint8_t *mem_in = fm_of(s, (uint32_t)p, in->in_mem), *mem_out = fm_of(s, (uint32_t)p, in->out_mem);
        gather_window16(mem_in, g->mem_bytes, in, ic, X);
        if (conv_dense_pe(in, X, W, bias, out, Wp, p))
            return ACCEL_ERR_INTERRUPTED;
        if (insn->leaky)
            leaky_relu(out, oh * ow * oc, insn->clip_lo, insn->clip_hi);
        fm_scatter(mem_out, g->mem_bytes, (uint64_t)in->out_addr, (uint64_t)in->out_pix_stride,
                   (uint64_t)in->out_row_stride, oh, ow, oc, out);
    }
    return ACCEL_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* MISC                                                                                       */

/* 1 when a stop was requested */
static int pool(const dpu_insn *in, const int16_t *X, int32_t *acc, uint8_t *out)
{
    const uint64_t c = (uint64_t)in->chans, oh = (uint64_t)in->out_h, ow = (uint64_t)in->out_w;
    const uint64_t kh = (uint64_t)in->kernel_h, kw = (uint64_t)in->kernel_w;
    const uint64_t sh = (uint64_t)in->stride_h, sw = (uint64_t)in->stride_w, Ww = in->win_cols;
    const int is_max = in->kind == K_MAXPOOL;
    const unsigned shift = (unsigned)in->shift;
    const int64_t rnd = shift ? ((int64_t)1 << (shift - 1)) : 0, mult = in->mult;
    uint64_t y, x, ky, kx, ch;
    for (y = 0; y < oh; y++) {
        if (accel_should_stop())
            return 1;
        for (x = 0; x < ow; x++) {
            uint8_t *o8 = out + (y * ow + x) * c;
            const int16_t *first = X + (y * sh * Ww + x * sw) * c;
            for (ch = 0; ch < c; ch++)
                acc[ch] = is_max ? first[ch] : 0;
            for (ky = 0; ky < kh; ky++)
                for (kx = 0; kx < kw; kx++) {
                    const int16_t *DPU_RESTRICT xp = X + ((y * sh + ky) * Ww + x * sw + kx) * c;
                    int32_t *DPU_RESTRICT a = acc;
                    if (is_max) {
                        for (ch = 0; ch < c; ch++)
                            a[ch] = xp[ch] > a[ch] ? xp[ch] : a[ch];
                    } else {
                        for (ch = 0; ch < c; ch++)
                            a[ch] += xp[ch];
                    }
                }
            if (is_max)
                for (ch = 0; ch < c; ch++)
                    o8[ch] = dpu_clip8(acc[ch], in->clip_lo, in->clip_hi);
            else
                for (ch = 0; ch < c; ch++)
                    o8[ch] = dpu_clip8(dpu_asr64((int64_t)acc[ch] * mult + rnd, shift), in->clip_lo, in->clip_hi);
        }
    }
    return 0;
}

static inline int64_t align_shift(int64_t v, int64_t s)
{
    return s >= 0 ? v * ((int64_t)1 << s) : dpu_asr64(v, (unsigned)-s);
}

static int exec_misc(dpu_state *s, const dpu_insn *in, accel_err *err)
{
    const dpu_geom *g = &s->g;
    const uint64_t c = (uint64_t)in->chans, oh = (uint64_t)in->out_h, ow = (uint64_t)in->out_w, M = g->mem_bytes;
    const uint64_t n_out = oh * ow * c;
    uint8_t *out = (uint8_t *)scratch(s, S_OUT, n_out);
    uint64_t p, i;
    if (!out)
        return accel_fail(err, ACCEL_ERR_NOMEM, "insn %u (%s): out of host memory", in->index, in->name);
    for (p = 0; p < g->n_pe; p++) {
        uint8_t *mem_in = fm_of(s, (uint32_t)p, in->in_mem), *mem_out = fm_of(s, (uint32_t)p, in->out_mem);
        if (accel_should_stop())
            return ACCEL_ERR_INTERRUPTED;
        switch (in->kind) {
        case K_MAXPOOL:
        case K_AVGPOOL: {
            int16_t *X = (int16_t *)scratch(s, S_X, in->win_rows * in->win_cols * c * sizeof(int16_t));
            int32_t *acc = (int32_t *)scratch(s, S_TMP, c * sizeof(int32_t));
            if (!X || !acc)
                return accel_fail(err, ACCEL_ERR_NOMEM, "insn %u (%s): out of host memory", in->index, in->name);
            gather_window16(mem_in, M, in, c, X);
            if (pool(in, X, acc, out))
                return ACCEL_ERR_INTERRUPTED;
            break;
        }
        case K_ELTADD:
        case K_ELTMUL: { /* two operands gathered alike; the sum aligns them, the product is exact */
            uint8_t *A = (uint8_t *)scratch(s, S_X, n_out), *B = (uint8_t *)scratch(s, S_B, n_out);
            const unsigned shift = (unsigned)in->shift;
            const int64_t rnd = shift ? ((int64_t)1 << (shift - 1)) : 0;
            if (!A || !B)
                return accel_fail(err, ACCEL_ERR_NOMEM, "insn %u (%s): out of host memory", in->index, in->name);
            fm_gather(mem_in, M, (uint64_t)in->in_addr, (uint64_t)in->in_pix_stride, (uint64_t)in->in_row_stride, oh, ow,
                      c, A);
            fm_gather(fm_of(s, (uint32_t)p, in->b_mem), M, (uint64_t)in->b_addr, (uint64_t)in->b_pix_stride,
                      (uint64_t)in->b_row_stride, oh, ow, c, B);
            for (i = 0; i < n_out; i++) {
                const int64_t t = in->kind == K_ELTMUL
                                      ? (int64_t)(int8_t)A[i] * (int8_t)B[i]
                                      : align_shift((int8_t)A[i], in->shift_a) + align_shift((int8_t)B[i], in->shift_b);
                out[i] = dpu_clip8(dpu_asr64(t + rnd, shift), in->clip_lo, in->clip_hi);
            }
            break;
        }
        case K_UPSAMPLE: {
            const uint64_t ih = in->in_rows, iw = in->in_cols, fh = (uint64_t)in->factor_h, fw = (uint64_t)in->factor_w;
            uint8_t *A = (uint8_t *)scratch(s, S_X, ih * iw * c);
            uint64_t y, x;
            if (!A)
                return accel_fail(err, ACCEL_ERR_NOMEM, "insn %u (%s): out of host memory", in->index, in->name);
            fm_gather(mem_in, M, (uint64_t)in->in_addr, (uint64_t)in->in_pix_stride, (uint64_t)in->in_row_stride, ih, iw,
                      c, A);
            for (y = 0; y < oh; y++)
                for (x = 0; x < ow; x++)
                    memcpy(out + (y * ow + x) * c, A + ((y / fh) * iw + x / fw) * c, (size_t)c);
            break;
        }
        default: /* COPY */
            fm_gather(mem_in, M, (uint64_t)in->in_addr, (uint64_t)in->in_pix_stride, (uint64_t)in->in_row_stride, oh, ow,
                      c, out);
            break;
        }
        fm_scatter(mem_out, M, (uint64_t)in->out_addr, (uint64_t)in->out_pix_stride, (uint64_t)in->out_row_stride, oh,
                   ow, c, out);
    }
    return ACCEL_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* LOAD / SAVE                                                                                */

static int exec_load(dpu_state *s, const dpu_insn *in, accel_err *err)
{
    const dpu_geom *g = &s->g;
    const uint64_t rows = (uint64_t)in->rows, cols = (uint64_t)in->cols, C = (uint64_t)in->chans;
    const uint64_t dpix = (uint64_t)in->ddr_pix_stride, drow = (uint64_t)in->ddr_row_stride;
    const uint8_t *base = s->ddr + g->region_base[in->region] + (uint64_t)in->ddr_offset;
    uint64_t p, r, w;
    if (in->to_pm) {
        const uint64_t dst = (uint64_t)in->dst_addr;
        for (r = 0; r < rows; r++) {
            if (accel_should_stop())
                return ACCEL_ERR_INTERRUPTED;
            if (dpix == C || cols == 1)
                circ_wr(s->pm, g->pm_bytes, dst + r * cols * C, base + r * drow, cols * C);
            else
                for (w = 0; w < cols; w++)
                    circ_wr(s->pm, g->pm_bytes, dst + (r * cols + w) * C, base + r * drow + w * dpix, C);
        }
        return ACCEL_OK;
    }
    {
        const uint64_t F = in->fmt ? (uint64_t)in->fmt : 1, R2 = in->win_rows, C2 = in->win_cols;
        const uint64_t pt = (uint64_t)in->pad_top, pl = (uint64_t)in->pad_left, pr = (uint64_t)in->pad_right;
        const uint64_t fpix = (uint64_t)in->fm_pix_stride, frow = (uint64_t)in->fm_row_stride, M = g->mem_bytes;
        const int pad = (int)(uint8_t)(int8_t)in->pad_value;
        uint8_t *row = (uint8_t *)scratch(s, S_X, (C2 + F) * C);
        if (!row)
            return accel_fail(err, ACCEL_ERR_NOMEM, "insn %u (%s): out of host memory", in->index, in->name);
        for (p = 0; p < g->n_pe; p++) {
            uint8_t *mem = fm_of(s, (uint32_t)p, in->fm_mem);
            const uint8_t *src = base + p * (uint64_t)in->img_stride;
            for (r = 0; r < R2; r++) {
                const uint64_t a = (uint64_t)in->dst_addr + r * frow;
                if (accel_should_stop())
                    return ACCEL_ERR_INTERRUPTED;
                if (r < pt || r - pt >= rows) {
                    memset(row, pad, (size_t)((C2 + F) * C));
                } else {
                    const uint8_t *srow = src + (r - pt) * drow;
                    memset(row, pad, (size_t)(pl * C));
                    memset(row + (pl + cols) * C, pad, (size_t)((pr + F) * C));
                    if (dpix == C || cols == 1)
                        memcpy(row + pl * C, srow, (size_t)(cols * C));
                    else
                        for (w = 0; w < cols; w++)
                            memcpy(row + (pl + w) * C, srow + w * dpix, (size_t)C);
                }
                if (F == 1 && (fpix == C || C2 == 1))
                    circ_wr(mem, M, a, row, C2 * C);
                else
                    for (w = 0; w < C2; w++)
                        circ_wr(mem, M, a + w * fpix, row + w * C, F * C);
            }
        }
    }
    return ACCEL_OK;
}

static int exec_save(dpu_state *s, const dpu_insn *in, accel_err *err)
{
    const dpu_geom *g = &s->g;
    const uint64_t rows = (uint64_t)in->rows, cols = (uint64_t)in->cols, C = (uint64_t)in->chans;
    const uint64_t dpix = (uint64_t)in->ddr_pix_stride, drow = (uint64_t)in->ddr_row_stride;
    uint8_t *row = (uint8_t *)scratch(s, S_X, cols * C);
    uint64_t p, r, w;
    if (!row)
        return accel_fail(err, ACCEL_ERR_NOMEM, "insn %u (%s): out of host memory", in->index, in->name);
    for (p = 0; p < g->n_pe; p++) {
        const uint8_t *mem = fm_of(s, (uint32_t)p, in->fm_mem);
        uint8_t *dst = s->ddr + g->region_base[in->region] + (uint64_t)in->ddr_offset + p * (uint64_t)in->img_stride;
        for (r = 0; r < rows; r++) {
            if (accel_should_stop())
                return ACCEL_ERR_INTERRUPTED;
            fm_gather(mem, g->mem_bytes, (uint64_t)in->src_addr + r * (uint64_t)in->fm_row_stride,
                      (uint64_t)in->fm_pix_stride, 0, 1, cols, C, row);
            if (dpix == C || cols == 1)
                memcpy(dst + r * drow, row, (size_t)(cols * C));
            else
                for (w = 0; w < cols; w++)
                    memcpy(dst + r * drow + w * dpix, row + w * C, (size_t)C);
        }
    }
    return ACCEL_OK;
}

int dpu_exec(dpu_state *s, const dpu_insn *in, accel_err *err)
{
    switch (in->kind) {
    case K_LOAD: return exec_load(s, in, err);
    case K_SAVE: return exec_save(s, in, err);
    case K_CONV: return exec_conv(s, in, err);
    default: return exec_misc(s, in, err);
    }
}
