/* Decoding, checking and timing of MARSELLUS commands (layout: python/tvm_marsellus/codegen.py). */
#include <math.h>
#include <stdio.h>

#include "common/stats.h"
#include "marsellus/mars_internal.h"

static const char *const MEM_NAMES[3] = {"L3", "L2", "L1"};
static const char *const CL_NAMES[MARS_CL_NUM] = {"?", "CL.CONV", "CL.DWCONV", "CL.FC", "CL.ADD",
                                                  "CL.MAXPOOL", "CL.AVGPOOL", "CL.HWC2RBE",
                                                  "CL.RBE2HWC", "CL.LUT", "CL.MUL"};

const char *mars_cmd_name(const mars_cmd *c)
{
    switch (c->op) {
    case MARS_OP_DMA: return "DMA";
    case MARS_OP_RBE: return "RBE";
    case MARS_OP_NOP: return "NOP";
    case MARS_OP_END: return "END";
    case MARS_OP_CLUSTER: return (c->kernel > 0 && c->kernel < MARS_CL_NUM) ? CL_NAMES[c->kernel] : "CL";
    default: return "?";
    }
}

static uint32_t wd(const uint8_t *p, int i) { return accel_ld_u32le(p + 4 * i); }
static uint32_t fld(uint32_t w, unsigned lo, unsigned width) { return (uint32_t)accel_bits(w, lo, width); }

#define FAIL(code, ...) return accel_fail(e, code, __VA_ARGS__)
#define CMDF "cmd %llu (%s): "
#define CMDA (unsigned long long)idx, mars_cmd_name(c)

static uint64_t ceil_rate(double work, double rate)
{
    double v = ceil(work / rate);
    return v < 1.8e19 ? (uint64_t)v : UINT64_MAX;
}

/* Bytes of a bit-packed tensor of n elements of bits each. */
static uint64_t packed_bytes(uint64_t n, int bits) { return accel_ceil_div(accel_sat_mul(n, (uint64_t)bits), 8); }

static int check_range(accel_err *e, uint64_t idx, const mars_cmd *c, const char *what, int mem,
                       uint64_t addr, uint64_t bytes, const mars_mems *m)
{
    if (!accel_range_ok(addr, bytes, m->size[mem]))
        FAIL(ACCEL_ERR_BOUNDS, CMDF "%s [0x%llx, 0x%llx) exceeds %s size %llu", CMDA, what,
             (unsigned long long)addr, (unsigned long long)accel_sat_add(addr, bytes), MEM_NAMES[mem],
             (unsigned long long)m->size[mem]);
    return ACCEL_OK;
}

static int reserved_zero(accel_err *e, uint64_t idx, const mars_cmd *c, const uint8_t *p, int from)
{
    for (int i = from; i < 16; i++)
        if (wd(p, i))
            FAIL(ACCEL_ERR_DECODE, CMDF "reserved word %d is 0x%08x, must be 0", CMDA, i, wd(p, i));
    return ACCEL_OK;
}

/* --- DMA --------------------------------------------------------------------------------------- */
static int decode_dma(const mars_config *cfg, const uint8_t *p, uint64_t idx, const mars_mems *m,
                      mars_cmd *c, accel_err *e)
{
    uint32_t w2 = wd(p, 2);
    uint64_t last_s, last_d, bytes;
    double bpc;
    uint64_t lat;
    if (w2 >> 4)
        FAIL(ACCEL_ERR_DECODE, CMDF "reserved bits of word 2 set (0x%08x)", CMDA, w2);
    c->src_mem = (int)fld(w2, 0, 2);
    c->dst_mem = (int)fld(w2, 2, 2);
    if (c->src_mem > 2 || c->dst_mem > 2)
        FAIL(ACCEL_ERR_DECODE, CMDF "field %s_mem: %d is not a memory (0 L3, 1 L2, 2 L1)", CMDA,
             c->src_mem > 2 ? "src" : "dst", c->src_mem > 2 ? c->src_mem : c->dst_mem);
    if (c->src_mem == MARS_MEM_L2 && c->dst_mem == MARS_MEM_L1)
        c->engine = MARS_ENG_DMA_IN;
    else if (c->src_mem == MARS_MEM_L1 && c->dst_mem == MARS_MEM_L2)
        c->engine = MARS_ENG_DMA_OUT;
    else if ((c->src_mem == MARS_MEM_L3 && c->dst_mem == MARS_MEM_L2) ||
             (c->src_mem == MARS_MEM_L2 && c->dst_mem == MARS_MEM_L3))
        c->engine = MARS_ENG_IODMA;
    else
        FAIL(ACCEL_ERR_DECODE, CMDF "fields src_mem/dst_mem: %s -> %s is not a DMA path "
             "(L3<->L2, L2->L1, L1->L2)", CMDA, MEM_NAMES[c->src_mem], MEM_NAMES[c->dst_mem]);
    c->src = wd(p, 3);
    c->dst = wd(p, 4);
    c->len = wd(p, 5);
    c->rows = wd(p, 6);
    c->planes = wd(p, 7);
    c->src_s1 = wd(p, 8);
    c->src_s2 = wd(p, 9);
    c->dst_s1 = wd(p, 10);
    c->dst_s2 = wd(p, 11);
    if (reserved_zero(e, idx, c, p, 12))
        return e->code;
    bytes = accel_sat_mul(accel_sat_mul(c->len, c->rows), c->planes);
    if (bytes == 0) {
        c->cycles = 1;
        return ACCEL_OK;
    }
    last_s = accel_sat_add(accel_sat_mul(c->planes - 1, c->src_s2), accel_sat_mul(c->rows - 1, c->src_s1));
    last_d = accel_sat_add(accel_sat_mul(c->planes - 1, c->dst_s2), accel_sat_mul(c->rows - 1, c->dst_s1));
    if (check_range(e, idx, c, "source", c->src_mem, c->src, accel_sat_add(last_s, c->len), m) ||
        check_range(e, idx, c, "destination", c->dst_mem, c->dst, accel_sat_add(last_d, c->len), m))
        return e->code;
    if (c->rows > 1 && c->dst_s1 < c->len)
        FAIL(ACCEL_ERR_DECODE, CMDF "field dst_row_stride: %llu is smaller than len %llu (rows would "
             "overlap)", CMDA, (unsigned long long)c->dst_s1, (unsigned long long)c->len);
    if (c->planes > 1 && c->dst_s2 < accel_sat_add(accel_sat_mul(c->rows - 1, c->dst_s1), c->len))
        FAIL(ACCEL_ERR_DECODE, CMDF "field dst_plane_stride: %llu is smaller than a plane (planes "
             "would overlap)", CMDA, (unsigned long long)c->dst_s2);
    if (c->engine == MARS_ENG_IODMA) {
        bpc = cfg->l3_bytes_per_cycle;
        lat = (uint64_t)cfg->l3_latency;
    } else {
        bpc = cfg->dma_bytes_per_cycle;
        lat = (uint64_t)cfg->dma_latency;
    }
    c->cycles = accel_sat_add(accel_dma_cycles(bytes, bpc, lat),
                              accel_sat_mul(accel_sat_mul(c->rows, c->planes) - 1,
                                            (uint64_t)cfg->dma_row_overhead));
    c->rd_bytes[c->src_mem] = bytes;
    c->wr_bytes[c->dst_mem] = bytes;
    return ACCEL_OK;
}

/* --- RBE --------------------------------------------------------------------------------------- */
/* Cycle model of one job (no setup), see hw_config.py. */
static void rbe_timing(const mars_config *cfg, mars_cmd *c)
{
    uint64_t P = 1;
    while ((P + 1) * (P + 1) <= (uint64_t)cfg->rbe_cores)
        P++;
    uint64_t k = c->mode1x1 ? 1 : 3, s = (uint64_t)c->stride_h;
    uint64_t r = (P - 1) * s + k;
    uint64_t port_words = (uint64_t)cfg->rbe_port_bits / 32;
    uint64_t n_patch = accel_sat_mul(accel_ceil_div((uint64_t)c->h_out, P), accel_ceil_div((uint64_t)c->w_out, P));
    uint64_t n_ki = accel_ceil_div((uint64_t)c->k_in, 32);
    uint64_t groups = accel_ceil_div((uint64_t)c->in_bits, (uint64_t)cfg->rbe_binconvs);
    uint64_t load = 0, compute = 0, nq = 0, so = 0;
    uint64_t cw = (uint64_t)c->w_bits;
    for (uint64_t g = 0; g < groups; g++) {
        uint64_t ib = (uint64_t)c->in_bits - g * (uint64_t)cfg->rbe_binconvs;
        if (ib > (uint64_t)cfg->rbe_binconvs)
            ib = (uint64_t)cfg->rbe_binconvs;
        load += (uint64_t)cfg->rbe_load_latency + accel_ceil_div(r * ib * r, port_words);
    }
    for (uint64_t t = 0; t * 32 < (uint64_t)c->k_out; t++) {
        uint64_t kt = (uint64_t)c->k_out - t * 32;
        if (kt > 32)
            kt = 32;
        /* 3x3: W serialized bit-planes per output channel plus the Accum switch cycle;
         * 1x1: all W bits in one cycle over the Blocks, accumulation pipelined */
        uint64_t per_k = c->mode1x1 ? 1 : cw + (uint64_t)cfg->rbe_kout_overhead;
        compute += groups * (kt * per_k + (uint64_t)cfg->rbe_compute_latency);
        nq += accel_ceil_div(kt, 4) * (uint64_t)cfg->rbe_nq_cycles_per_group;
        so += P * P * (uint64_t)c->out_bits;
    }
    /* LOAD repeats for every Kout tile and Kin tile; COMPUTE for every Kin tile. */
    load = accel_sat_mul(accel_sat_mul(load, n_ki), accel_ceil_div((uint64_t)c->k_out, 32));
    compute = accel_sat_mul(compute, n_ki);
    c->phases[MARS_RBE_LOAD] = accel_sat_mul(load, n_patch);
    c->phases[MARS_RBE_COMPUTE] = accel_sat_mul(compute, n_patch);
    c->phases[MARS_RBE_NORMQUANT] = accel_sat_mul(nq, n_patch);
    c->phases[MARS_RBE_STREAMOUT] = accel_sat_mul(so, n_patch);
    c->cycles = 0;
    for (int i = 0; i < 4; i++)
        c->cycles = accel_sat_add(c->cycles, c->phases[i]);
}

static int decode_rbe_fields(const mars_config *cfg, const uint8_t *p, uint64_t idx, mars_cmd *c,
                             accel_err *e)
{
    uint32_t w6 = wd(p, 6), w7 = wd(p, 7), w8 = wd(p, 8), w9 = wd(p, 9), w10 = wd(p, 10);
    c->engine = MARS_ENG_RBE;
    c->x = wd(p, 2);
    c->w = wd(p, 3);
    c->nq = wd(p, 4);
    c->y = wd(p, 5);
    c->h_in = (int64_t)fld(w6, 0, 16) + 1;
    c->w_in = (int64_t)fld(w6, 16, 16) + 1;
    c->h_out = (int64_t)fld(w7, 0, 16) + 1;
    c->w_out = (int64_t)fld(w7, 16, 16) + 1;
    c->k_out = (int64_t)fld(w8, 0, 16) + 1;
    c->k_in = (int64_t)fld(w8, 16, 16) + 1;
    c->in_bits = (int)fld(w9, 0, 8) + 1;
    c->w_bits = (int)fld(w9, 8, 8) + 1;
    c->out_bits = (int)fld(w9, 16, 8) + 1;
    c->mode1x1 = (int)fld(w9, 24, 1);
    c->stride_h = c->stride_w = (int)fld(w9, 25, 1) + 1;
    c->relu = (int)fld(w9, 26, 1);
    c->out_signed = (int)fld(w9, 27, 1);
    c->w_unsigned = (int)fld(w9, 28, 1);
    c->kh = c->kw = c->mode1x1 ? 1 : 3;
    if (w9 >> 29)
        FAIL(ACCEL_ERR_DECODE, CMDF "reserved bits [31:29] of QA_QW_QAO set (0x%08x)", CMDA, w9);
    c->shift = (int)fld(w10, 0, 5);
    if (fld(w10, 5, 3))
        FAIL(ACCEL_ERR_DECODE, CMDF "reserved bits [7:5] of SHIFT_PAD set (0x%08x)", CMDA, w10);
    c->pad_value = (int)fld(w10, 8, 8);
    c->pad_t = (int)fld(w10, 16, 4);
    c->pad_b = (int)fld(w10, 20, 4);
    c->pad_l = (int)fld(w10, 24, 4);
    c->pad_r = (int)fld(w10, 28, 4);
    c->x_ps = wd(p, 11);
    c->x_rs = wd(p, 12);
    c->y_ps = wd(p, 13);
    c->y_rs = wd(p, 14);
    if (wd(p, 15))
        FAIL(ACCEL_ERR_DECODE, CMDF "reserved word 15 is 0x%08x, must be 0", CMDA, wd(p, 15));
    {
        const char *names[3] = {"qa (input bits)", "qw (weight bits)", "qao (output bits)"};
        int vals[3] = {c->in_bits, c->w_bits, c->out_bits};
        for (int i = 0; i < 3; i++)
            if (vals[i] < cfg->rbe_min_bits || vals[i] > cfg->rbe_max_bits)
                FAIL(ACCEL_ERR_DECODE, CMDF "field %s: %d is outside %d..%d", CMDA, names[i], vals[i],
                     cfg->rbe_min_bits, cfg->rbe_max_bits);
    }
    if (c->pad_value >= (1 << c->in_bits))
        FAIL(ACCEL_ERR_DECODE, CMDF "field pad_value: %d does not fit %d unsigned input bits", CMDA,
             c->pad_value, c->in_bits);
    if (c->pad_t >= c->kh + c->stride_h || c->pad_b >= c->kh + c->stride_h ||
        c->pad_l >= c->kw + c->stride_w || c->pad_r >= c->kw + c->stride_w)
        FAIL(ACCEL_ERR_DECODE, CMDF "field pad: %d,%d,%d,%d exceeds the %s window", CMDA, c->pad_t,
             c->pad_b, c->pad_l, c->pad_r, c->mode1x1 ? "1x1" : "3x3");
    if ((c->h_out - 1) * c->stride_h + c->kh > c->h_in + c->pad_t + c->pad_b ||
        (c->w_out - 1) * c->stride_w + c->kw > c->w_in + c->pad_l + c->pad_r)
        FAIL(ACCEL_ERR_DECODE, CMDF "fields img_size_out: %lldx%lld outputs need a larger input than "
             "%lldx%lld plus padding %d,%d,%d,%d", CMDA, (long long)c->h_out, (long long)c->w_out,
             (long long)c->h_in, (long long)c->w_in, c->pad_t, c->pad_b, c->pad_l, c->pad_r);
    return ACCEL_OK;
}

static int tensor_footprint(accel_err *e, uint64_t idx, const mars_cmd *c, const char *name,
                            uint64_t addr, int64_t h, int64_t w, uint64_t pix, uint64_t *ps,
                            uint64_t *rs, uint64_t *end)
{
    if (addr % 4 || *ps % 4 || *rs % 4)
        FAIL(ACCEL_ERR_DECODE, CMDF "%s pointer/strides 0x%llx/%llu/%llu must be multiples of 4", CMDA,
             name, (unsigned long long)addr, (unsigned long long)*ps, (unsigned long long)*rs);
    if (*ps == 0)
        *ps = pix;
    if (*rs == 0)
        *rs = accel_sat_mul((uint64_t)w, *ps);
    if (w > 1 && *ps < pix)
        FAIL(ACCEL_ERR_DECODE, CMDF "field %s_pix_stride: %llu is smaller than a pixel (%llu bytes)",
             CMDA, name, (unsigned long long)*ps, (unsigned long long)pix);
    if (h > 1 && *rs < accel_sat_add(accel_sat_mul((uint64_t)(w - 1), *ps), pix))
        FAIL(ACCEL_ERR_DECODE, CMDF "field %s_row_stride: %llu is smaller than a row", CMDA, name,
             (unsigned long long)*rs);
    *end = accel_sat_add(accel_sat_add(accel_sat_mul((uint64_t)(h - 1), *rs),
                                       accel_sat_mul((uint64_t)(w - 1), *ps)), pix);
    return ACCEL_OK;
}

static int decode_rbe(const mars_config *cfg, const uint8_t *p, uint64_t idx, const mars_mems *m,
                      mars_cmd *c, accel_err *e)
{
    uint64_t n_ki, n_ko, xpix, ypix, xend, yend, wbytes, nqbytes;
    if (decode_rbe_fields(cfg, p, idx, c, e))
        return e->code;
    n_ki = accel_ceil_div((uint64_t)c->k_in, 32);
    n_ko = accel_ceil_div((uint64_t)c->k_out, 32);
    xpix = n_ki * (uint64_t)c->in_bits * 4;
    ypix = n_ko * (uint64_t)c->out_bits * 4;
    if (tensor_footprint(e, idx, c, "x", c->x, c->h_in, c->w_in, xpix, &c->x_ps, &c->x_rs, &xend) ||
        tensor_footprint(e, idx, c, "y", c->y, c->h_out, c->w_out, ypix, &c->y_ps, &c->y_rs, &yend))
        return e->code;
    if (c->w % 4)
        FAIL(ACCEL_ERR_DECODE, CMDF "field w_ptr: 0x%llx is not a multiple of 4", CMDA,
             (unsigned long long)c->w);
    wbytes = (uint64_t)c->k_out * n_ki * (uint64_t)c->w_bits * (c->mode1x1 ? 1 : 9) * 4;
    nqbytes = 6 * (uint64_t)c->k_out;
    if (check_range(e, idx, c, "input (x_ptr)", MARS_MEM_L1, c->x, xend, m) ||
        check_range(e, idx, c, "weights (w_ptr)", MARS_MEM_L1, c->w, wbytes, m) ||
        check_range(e, idx, c, "normquant (nq_ptr)", MARS_MEM_L1, c->nq, nqbytes, m) ||
        check_range(e, idx, c, "output (y_ptr)", MARS_MEM_L1, c->y, yend, m))
        return e->code;
    rbe_timing(cfg, c);
    c->macs = (uint64_t)c->h_out * (uint64_t)c->w_out * (uint64_t)c->k_out * (uint64_t)c->k_in *
              (uint64_t)(c->kh * c->kw);
    c->elems = (uint64_t)c->h_out * (uint64_t)c->w_out * (uint64_t)c->k_out;
    c->rd_bytes[MARS_MEM_L1] = accel_sat_add(accel_sat_add(
        accel_sat_mul((uint64_t)(c->h_in * c->w_in), xpix), wbytes), nqbytes);
    c->wr_bytes[MARS_MEM_L1] = accel_sat_mul(c->elems / (uint64_t)c->k_out, ypix);
    return ACCEL_OK;
}

int mars_sim_rbe_job_cycles(const mars_config *cfg, const uint8_t *cmd64, uint64_t *phases,
                            char *err, uint64_t err_len)
{
    accel_err e;
    mars_cmd c;
    accel_err_init(&e, err, err_len);
    if (!cfg || !cmd64 || !phases)
        return accel_fail(&e, ACCEL_ERR_ARG, "NULL argument");
    if (mars_check_config(cfg, &e))
        return e.code;
    memset(&c, 0, sizeof(c));
    c.op = MARS_OP_RBE;
    if (decode_rbe_fields(cfg, cmd64, 0, &c, &e))
        return e.code;
    rbe_timing(cfg, &c);
    for (int i = 0; i < 4; i++)
        phases[i] = c.phases[i];
    return ACCEL_OK;
}

/* --- CLUSTER ----------------------------------------------------------------------------------- */
static double matmul_rate(const mars_config *cfg, int bits)
{
    double gain;
    if (bits >= 8)
        return cfg->cl_matmul_8b * (cfg->cl_mac_load ? cfg->cl_macload_speedup : 1.0);
    gain = bits >= 4 ? cfg->cl_4b_speedup : cfg->cl_2b_speedup;
    return cfg->cl_matmul_8b * (cfg->cl_mac_load ? gain : gain / cfg->cl_macload_speedup);
}

static int sub_byte_bits(int b) { return b == 2 || b == 4 || b == 8; }

/* The fields of a CLUSTER command (words 2..14; 15 must be zero). */
static int cl_fields(const uint8_t *p, uint64_t idx, mars_cmd *c, accel_err *e)
{
    uint32_t w2 = wd(p, 2), w7 = wd(p, 7), w8 = wd(p, 8), w9 = wd(p, 9), w10 = wd(p, 10);
    uint32_t w14 = wd(p, 14);
    int k = (int)fld(w2, 0, 8);
    c->engine = MARS_ENG_CLUSTER;
    c->kernel = k;
    if (k < 1 || k >= MARS_CL_NUM)
        FAIL(ACCEL_ERR_DECODE, CMDF "field kernel: %d is not a cluster kernel (1..%d)", CMDA, k,
             MARS_CL_NUM - 1);
    c->relu = (int)fld(w2, 8, 1);
    c->out_signed = (int)fld(w2, 9, 1);
    c->in_signed = (int)fld(w2, 10, 1);
    c->b_signed = (int)fld(w2, 11, 1);
    c->in_bits = (int)fld(w2, 12, 4);
    c->w_bits = (int)fld(w2, 16, 4);
    c->out_bits = (int)fld(w2, 20, 4);
    c->shift = (int)fld(w2, 24, 5);
    c->psum_in = (int)fld(w2, 29, 1);
    c->psum_out = (int)fld(w2, 30, 1);
    if (w2 >> 31)
        FAIL(ACCEL_ERR_DECODE, CMDF "reserved bit 31 of word 2 set (0x%08x)", CMDA, w2);
    c->x = wd(p, 3);
    c->y = wd(p, 4);
    c->w = wd(p, 5);
    c->nq = wd(p, 6);
    c->kappa_a = fld(wd(p, 6), 0, 16);
    c->kappa_b = fld(wd(p, 6), 16, 16);
    c->h_in = fld(w7, 0, 16);
    c->w_in = fld(w7, 16, 16);
    c->k_in = fld(w8, 0, 16);
    c->k_out = fld(w8, 16, 16);
    c->h_out = fld(w9, 0, 16);
    c->w_out = fld(w9, 16, 16);
    /* 8-bit window fields: low nibble in word 10, high nibble at the same place in word 14 */
    c->kh = (int)(fld(w10, 0, 4) | fld(w14, 0, 4) << 4);
    c->kw = (int)(fld(w10, 4, 4) | fld(w14, 4, 4) << 4);
    c->stride_h = (int)(fld(w10, 8, 4) | fld(w14, 8, 4) << 4);
    c->stride_w = (int)(fld(w10, 12, 4) | fld(w14, 12, 4) << 4);
    c->pad_t = (int)(fld(w10, 16, 4) | fld(w14, 16, 4) << 4);
    c->pad_b = (int)(fld(w10, 20, 4) | fld(w14, 20, 4) << 4);
    c->pad_l = (int)(fld(w10, 24, 4) | fld(w14, 24, 4) << 4);
    c->pad_r = (int)(fld(w10, 28, 4) | fld(w14, 28, 4) << 4);
    if (wd(p, 11) >> 8)
        FAIL(ACCEL_ERR_DECODE, CMDF "reserved bits [31:8] of word 11 set (0x%08x)", CMDA, wd(p, 11));
    c->pad_value = (int)fld(wd(p, 11), 0, 8);
    c->lambda = accel_as_i32(wd(p, 12));
    c->psum = wd(p, 13);
    return reserved_zero(e, idx, c, p, 15);
}

static int is_conv_kernel(int k) { return k == MARS_CL_CONV || k == MARS_CL_DWCONV || k == MARS_CL_FC; }

/* Partial sums, sizes and precisions a CLUSTER kernel accepts. */
static int cl_check_operands(uint64_t idx, const mars_cmd *c, accel_err *e)
{
    int k = c->kernel;
    if ((c->psum_in || c->psum_out) && k != MARS_CL_CONV && k != MARS_CL_FC)
        FAIL(ACCEL_ERR_DECODE, CMDF "fields psum_in/psum_out: only CONV and FC accumulate partial sums",
             CMDA);
    if (!c->psum_in && !c->psum_out && c->psum)
        FAIL(ACCEL_ERR_DECODE, CMDF "field psum_addr: 0x%llx set without psum_in/psum_out", CMDA,
             (unsigned long long)c->psum);
    if (c->h_in < 1 || c->w_in < 1 || c->k_in < 1 || c->h_out < 1 || c->w_out < 1 || c->k_out < 1)
        FAIL(ACCEL_ERR_DECODE, CMDF "fields H/W/C: in %lldx%lldx%lld, out %lldx%lldx%lld must all be "
             ">= 1", CMDA, (long long)c->h_in, (long long)c->w_in, (long long)c->k_in,
             (long long)c->h_out, (long long)c->w_out, (long long)c->k_out);
    if (k == MARS_CL_HWC_TO_RBE || k == MARS_CL_RBE_TO_HWC) {
        int hwc_bits = k == MARS_CL_HWC_TO_RBE ? c->in_bits : c->out_bits;
        int pl_bits = k == MARS_CL_HWC_TO_RBE ? c->out_bits : c->in_bits;
        if (!sub_byte_bits(hwc_bits) || pl_bits < 1 || pl_bits > 8)
            FAIL(ACCEL_ERR_DECODE, CMDF "fields in_bits/out_bits: %d/%d (HWC side 2, 4 or 8; bit-plane "
                 "side 1..8)", CMDA, c->in_bits, c->out_bits);
    } else if (!sub_byte_bits(c->in_bits) || !sub_byte_bits(c->out_bits) ||
               (is_conv_kernel(k) && !sub_byte_bits(c->w_bits)))
        FAIL(ACCEL_ERR_DECODE, CMDF "fields in_bits/w_bits/out_bits: %d/%d/%d (XpulpNN: 2, 4 or 8)",
             CMDA, c->in_bits, c->w_bits, c->out_bits);
    if (!is_conv_kernel(k) && c->w_bits)
        FAIL(ACCEL_ERR_DECODE, CMDF "field w_bits: %d, must be 0 for this kernel", CMDA, c->w_bits);
    return ACCEL_OK;
}

/* Window (kernel, stride, padding) and output shape of a CLUSTER kernel. */
static int cl_check_window(uint64_t idx, const mars_cmd *c, accel_err *e)
{
    int k = c->kernel;
    if (k == MARS_CL_CONV || k == MARS_CL_DWCONV || k == MARS_CL_MAXPOOL || k == MARS_CL_AVGPOOL) {
        if (c->kh < 1 || c->kw < 1 || c->stride_h < 1 || c->stride_w < 1)
            FAIL(ACCEL_ERR_DECODE, CMDF "fields kernel/stride: %dx%d / %dx%d must be >= 1", CMDA, c->kh,
                 c->kw, c->stride_h, c->stride_w);
        if ((c->h_out - 1) * c->stride_h + c->kh > c->h_in + c->pad_t + c->pad_b ||
            (c->w_out - 1) * c->stride_w + c->kw > c->w_in + c->pad_l + c->pad_r)
            FAIL(ACCEL_ERR_DECODE, CMDF "fields out size: %lldx%lld outputs need a larger input than "
                 "%lldx%lld plus padding", CMDA, (long long)c->h_out, (long long)c->w_out,
                 (long long)c->h_in, (long long)c->w_in);
        if (k != MARS_CL_CONV && c->k_in != c->k_out)
            FAIL(ACCEL_ERR_DECODE, CMDF "fields c_in/c_out: %lld/%lld must be equal", CMDA,
                 (long long)c->k_in, (long long)c->k_out);
    } else {
        if (c->kh != 1 || c->kw != 1 || c->stride_h != 1 || c->stride_w != 1 || c->pad_t || c->pad_b ||
            c->pad_l || c->pad_r)
            FAIL(ACCEL_ERR_DECODE, CMDF "fields kernel/stride/pad: must be 1x1 / 1x1 / 0 for this kernel",
                 CMDA);
        if (k == MARS_CL_FC) {
            if (c->h_in != 1 || c->w_in != 1 || c->h_out != 1 || c->w_out != 1)
                FAIL(ACCEL_ERR_DECODE, CMDF "fields H/W: a fully connected layer has H = W = 1", CMDA);
        } else if (c->h_in != c->h_out || c->w_in != c->w_out || c->k_in != c->k_out)
            FAIL(ACCEL_ERR_DECODE, CMDF "fields out size: %lldx%lldx%lld must equal the input %lldx%lldx%lld",
                 CMDA, (long long)c->h_out, (long long)c->w_out, (long long)c->k_out,
                 (long long)c->h_in, (long long)c->w_in, (long long)c->k_in);
    }
    if (k != MARS_CL_ADD && k != MARS_CL_MUL && c->b_signed)
        FAIL(ACCEL_ERR_DECODE, CMDF "field b_signed: set on a kernel without a B input", CMDA);
    return ACCEL_OK;
}

/* L1 footprint of the input and output tensors; *in_b is the input's size in bytes. */
static int cl_footprint(uint64_t idx, mars_cmd *c, const mars_mems *m, uint64_t *in_b, accel_err *e)
{
    uint64_t n_in = (uint64_t)c->h_in * (uint64_t)c->w_in * (uint64_t)c->k_in;
    uint64_t n_out = (uint64_t)c->h_out * (uint64_t)c->w_out * (uint64_t)c->k_out;
    uint64_t out_b;
    if (c->kernel == MARS_CL_HWC_TO_RBE) {
        *in_b = packed_bytes(n_in, c->in_bits);
        out_b = (uint64_t)c->h_in * (uint64_t)c->w_in * accel_ceil_div((uint64_t)c->k_in, 32) * (uint64_t)c->out_bits * 4;
    } else if (c->kernel == MARS_CL_RBE_TO_HWC) {
        *in_b = (uint64_t)c->h_in * (uint64_t)c->w_in * accel_ceil_div((uint64_t)c->k_in, 32) * (uint64_t)c->in_bits * 4;
        out_b = packed_bytes(n_out, c->out_bits);
    } else {
        *in_b = packed_bytes(n_in, c->in_bits);
        out_b = packed_bytes(n_out, c->out_bits);
    }
    if (check_range(e, idx, c, "input", MARS_MEM_L1, c->x, *in_b, m) ||
        check_range(e, idx, c, "output", MARS_MEM_L1, c->y, out_b, m))
        return e->code;
    c->rd_bytes[MARS_MEM_L1] = *in_b;
    c->wr_bytes[MARS_MEM_L1] = out_b;
    c->elems = n_out;
    return ACCEL_OK;
}

/* Outputs along one dimension whose window reads at least one input (not padding only). */
static uint64_t window_outputs(int64_t n_in, int64_t n_out, int k, int s, int pad_before)
{
    uint64_t n = 0;
    for (int64_t o = 0; o < n_out; o++) {
        int64_t first = o * s - pad_before;
        if (first < n_in && first + k > 0)
            n++;
    }
    return n;
}

/* CONV / DWCONV / FC: weights, normquant and partial-sum footprints and the cycles of the work.
 * The MatMul and im2col cover the outputs whose window reads the input; an output whose window
 * lies in the padding only is NormQuant of the padding taps (a constant per channel, which the
 * cores compute once) and costs its NormQuant and store only. */
static int cl_conv_work(const mars_config *cfg, uint64_t idx, mars_cmd *c, const mars_mems *m, uint64_t *work,
                        accel_err *e)
{
    const int k = c->kernel;
    const uint64_t n_out = c->elems;
    uint64_t n_pix;
    uint64_t taps = (uint64_t)(c->kh * c->kw);
    uint64_t nw = k == MARS_CL_DWCONV ? (uint64_t)c->k_out * taps
                                      : (uint64_t)c->k_out * taps * (uint64_t)c->k_in;
    uint64_t wb = packed_bytes(nw, c->w_bits);
    int prec = c->in_bits > c->w_bits ? c->in_bits : c->w_bits;
    if (check_range(e, idx, c, "weights", MARS_MEM_L1, c->w, wb, m) ||
        (!c->psum_out &&
         check_range(e, idx, c, "normquant", MARS_MEM_L1, c->nq, 6 * (uint64_t)c->k_out, m)))
        return e->code;
    c->rd_bytes[MARS_MEM_L1] += wb + (c->psum_out ? 0 : 6 * (uint64_t)c->k_out);
    n_pix = k == MARS_CL_FC ? n_out / (uint64_t)c->k_out
                            : window_outputs(c->h_in, c->h_out, c->kh, c->stride_h, c->pad_t) *
                                  window_outputs(c->w_in, c->w_out, c->kw, c->stride_w, c->pad_l);
    c->macs = n_pix * (uint64_t)c->k_out * taps * (k == MARS_CL_DWCONV ? 1 : (uint64_t)c->k_in);
    if (c->psum_in || c->psum_out) {
        uint64_t pb = accel_sat_mul(n_out, 4);
        if (c->psum % 4)
            FAIL(ACCEL_ERR_DECODE, CMDF "field psum_addr: 0x%llx is not a multiple of 4", CMDA,
                 (unsigned long long)c->psum);
        if (check_range(e, idx, c, "partial sums (psum_addr)", MARS_MEM_L1, c->psum, pb, m))
            return e->code;
        if (c->psum_in)
            c->rd_bytes[MARS_MEM_L1] += pb;
        if (c->psum_out)
            c->wr_bytes[MARS_MEM_L1] = pb;
        /* one 32-bit load and / or store per output and core */
        *work = ceil_rate((double)n_out * (c->psum_in + c->psum_out), (double)cfg->cluster_cores);
    }
    if (k == MARS_CL_DWCONV)
        *work = ceil_rate((double)c->macs, cfg->cl_dw_macs);
    else if (k == MARS_CL_FC)
        *work = accel_sat_add(*work, ceil_rate((double)c->macs, matmul_rate(cfg, prec) * cfg->cl_fc_efficiency));
    else {
        *work = accel_sat_add(*work, ceil_rate((double)c->macs, matmul_rate(cfg, prec)));
        if (taps > 1 || c->stride_h > 1 || c->stride_w > 1)
            *work = accel_sat_add(*work, ceil_rate((double)n_pix * (double)taps *
                                                       (double)c->k_in * c->in_bits / 8.0,
                                                   cfg->cl_im2col_bytes));
    }
    return ACCEL_OK;
}

static int decode_cluster(const mars_config *cfg, const uint8_t *p, uint64_t idx, const mars_mems *m,
                          mars_cmd *c, accel_err *e)
{
    uint64_t n_out, outs_nq = 0, work = 0, in_b = 0;
    int k;
    if (cl_fields(p, idx, c, e) || cl_check_operands(idx, c, e) || cl_check_window(idx, c, e) ||
        cl_footprint(idx, c, m, &in_b, e))
        return e->code;
    k = c->kernel;
    n_out = c->elems;
    switch (k) {
    case MARS_CL_CONV:
    case MARS_CL_DWCONV:
    case MARS_CL_FC:
        if (cl_conv_work(cfg, idx, c, m, &work, e))
            return e->code;
        outs_nq = c->psum_out ? 0 : n_out;
        break;
    case MARS_CL_ADD:
        if (check_range(e, idx, c, "input B", MARS_MEM_L1, c->w, in_b, m))
            return e->code;
        c->rd_bytes[MARS_MEM_L1] += in_b;
        work = ceil_rate((double)n_out, cfg->cl_eltwise_elems);
        break;
    case MARS_CL_MUL:
        /* B: one 8-bit value per channel (the squeeze-excitation gate) at w; kappa_b: its zero
           point (16-bit two's complement); pad_value: A's zero point */
        if (c->in_bits != 8)
            FAIL(ACCEL_ERR_DECODE, CMDF "field in_bits: %d (MUL reads 8-bit operands)", CMDA, c->in_bits);
        if (check_range(e, idx, c, "input B", MARS_MEM_L1, c->w, (uint64_t)c->k_in, m))
            return e->code;
        c->rd_bytes[MARS_MEM_L1] += (uint64_t)c->k_in;
        work = ceil_rate((double)n_out, cfg->cl_eltwise_elems);
        break;
    case MARS_CL_LUT: {
        /* lambda = the table's channel stride: 0 (one row for every channel) or 256 */
        uint64_t rows = c->lambda ? (uint64_t)c->k_in : 1;
        if (c->in_bits != 8 || c->out_bits != 8 || (c->lambda != 0 && c->lambda != 256) || c->relu ||
            c->shift || c->nq || c->pad_value)
            FAIL(ACCEL_ERR_DECODE, CMDF "fields in_bits/out_bits/lambda: %d/%d/%d (LUT: 8-bit bytes, "
                 "channel stride 0 or 256; relu, shift, word 6 and pad_value 0)", CMDA, c->in_bits,
                 c->out_bits, (int)c->lambda);
        if (check_range(e, idx, c, "table", MARS_MEM_L1, c->w, rows * 256, m))
            return e->code;
        c->rd_bytes[MARS_MEM_L1] += n_out;
        work = ceil_rate((double)n_out * cfg->cl_lut_cycles, (double)cfg->cluster_cores);
        break;
    }
    case MARS_CL_MAXPOOL:
    case MARS_CL_AVGPOOL:
        work = ceil_rate((double)n_out * c->kh * c->kw, cfg->cl_pool_taps);
        break;
    default: /* marshaling */
        work = ceil_rate((double)n_out * (k == MARS_CL_HWC_TO_RBE ? c->out_bits : c->in_bits),
                         cfg->cl_marshal_bits);
        break;
    }
    if (outs_nq)
        work = accel_sat_add(work, ceil_rate((double)outs_nq * cfg->cl_nq_cycles_per_output,
                                             (double)cfg->cluster_cores));
    c->cycles = accel_sat_add(work, (uint64_t)cfg->cl_kernel_overhead);
    if (!c->cycles)
        c->cycles = 1;
    return ACCEL_OK;
}

int mars_decode(const mars_config *cfg, const uint8_t *p, uint64_t idx, const mars_mems *m,
                mars_cmd *c, accel_err *e)
{
    uint32_t w0 = wd(p, 0), w1 = wd(p, 1);
    memset(c, 0, sizeof(*c));
    c->op = (int)fld(w0, 0, 8);
    c->wait = fld(w1, 0, 16);
    c->signal = fld(w1, 16, 16);
    if (w0 >> 8)
        FAIL(ACCEL_ERR_DECODE, "cmd %llu: reserved bits [31:8] of word 0 set (0x%08x)",
             (unsigned long long)idx, w0);
    switch (c->op) {
    case MARS_OP_DMA: return decode_dma(cfg, p, idx, m, c, e);
    case MARS_OP_RBE: return decode_rbe(cfg, p, idx, m, c, e);
    case MARS_OP_CLUSTER: return decode_cluster(cfg, p, idx, m, c, e);
    case MARS_OP_NOP:
        c->engine = (int)fld(wd(p, 2), 0, 8);
        if (c->engine >= MARS_NUM_ENGINES)
            FAIL(ACCEL_ERR_DECODE, CMDF "field engine: %d is not an engine (0..%d)", CMDA, c->engine,
                 MARS_NUM_ENGINES - 1);
        if (wd(p, 2) >> 8)
            FAIL(ACCEL_ERR_DECODE, CMDF "reserved bits of word 2 set (0x%08x)", CMDA, wd(p, 2));
        return reserved_zero(e, idx, c, p, 3);
    case MARS_OP_END:
        c->engine = -1;
        if (w1)
            FAIL(ACCEL_ERR_DECODE, CMDF "END carries wait/signal masks 0x%08x", CMDA, w1);
        return reserved_zero(e, idx, c, p, 2);
    default:
        FAIL(ACCEL_ERR_DECODE, "cmd %llu: unknown opcode %d", (unsigned long long)idx, c->op);
    }
}
