/* DPU simulator: config, decoding, static checks and the discrete-event scheduler. The model is
 * documented in dpu_sim.h and in the module docstring of python/tvm_dpu/codegen.py. */
#include "dpu/dpu_sim.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/stats.h"
#include "common/trace.h"
#include "dpu/dpu_internal.h"

typedef unsigned long long ull;
typedef long long ll;

#define INSN_BYTES 32

static const char *const UNIT_NAMES[DPU_NUM_UNITS] = {"LOAD", "SAVE", "CONV", "MISC"};
static const char *const REGION_NAMES[DPU_NUM_REGIONS] = {"INPUT", "OUTPUT", "PARAM", "INSN", "SWAP"};
static const char *const KIND_NAMES[NUM_KINDS] = {"LOAD", "SAVE", "CONV", "MAXPOOL", "AVGPOOL",
                                                  "ELTADD", "UPSAMPLE", "COPY", "END"};

/* ------------------------------------------------------------------------------------------ */
/* Bit layouts (must match LAYOUTS in python/tvm_dpu/codegen.py)                              */

typedef struct {
    const char *name;
    uint8_t width, is_signed;
    uint16_t off; /* offsetof(dpu_insn, field) */
} dpu_field;

#define F(n, w, s) {#n, w, s, (uint16_t)offsetof(dpu_insn, n)}
#define FM_IN F(in_mem, 2, 0), F(in_addr, 20, 0), F(in_pix_stride, 12, 0), F(in_row_stride, 20, 0)
#define FM_OUT F(out_mem, 2, 0), F(out_addr, 20, 0), F(out_pix_stride, 12, 0), F(out_row_stride, 20, 0)
#define MISC_COMMON F(op, 4, 0), FM_IN, FM_OUT, F(out_h, 12, 0), F(out_w, 12, 0), F(chans, 12, 0)
#define POOL_FIELDS                                                                                        \
    F(kernel_h, 4, 0), F(kernel_w, 4, 0), F(stride_h, 3, 0), F(stride_w, 3, 0), F(pad_top, 4, 0),          \
        F(pad_bottom, 4, 0), F(pad_left, 4, 0), F(pad_right, 4, 0), F(pad_value, 8, 1), F(shift, 5, 0),    \
        F(mult, 16, 0), F(clip_lo, 8, 1), F(clip_hi, 8, 1)

static const dpu_field HEADER[] = {F(opcode, 4, 0), F(dpon, 4, 0), F(dpby, 4, 0)};
static const dpu_field LOAD_F[] = {
    F(to_pm, 1, 0), F(fm_mem, 2, 0), F(dst_addr, 24, 0), F(region, 3, 0), F(ddr_offset, 32, 0),
    F(rows, 12, 0), F(cols, 12, 0), F(chans, 12, 0), F(ddr_pix_stride, 16, 0), F(ddr_row_stride, 24, 0),
    F(fm_pix_stride, 12, 0), F(fm_row_stride, 20, 0), F(pad_top, 4, 0), F(pad_bottom, 4, 0),
    F(pad_left, 4, 0), F(pad_right, 4, 0), F(pad_value, 8, 1), F(img_stride, 32, 0), F(fmt, 4, 0)};
static const dpu_field SAVE_F[] = {
    F(fm_mem, 2, 0), F(src_addr, 20, 0), F(region, 3, 0), F(ddr_offset, 32, 0), F(rows, 12, 0),
    F(cols, 12, 0), F(chans, 12, 0), F(fm_pix_stride, 12, 0), F(fm_row_stride, 20, 0),
    F(ddr_pix_stride, 16, 0), F(ddr_row_stride, 24, 0), F(img_stride, 32, 0)};
static const dpu_field CONV_F[] = {
    FM_IN, F(ic, 12, 0), FM_OUT, F(out_h, 12, 0), F(out_w, 12, 0), F(oc, 12, 0), F(kernel_h, 4, 0),
    F(kernel_w, 4, 0), F(stride_h, 3, 0), F(stride_w, 3, 0), F(pad_top, 4, 0), F(pad_bottom, 4, 0),
    F(pad_left, 4, 0), F(pad_right, 4, 0), F(pad_value, 8, 1), F(param_addr, 24, 0), F(shift, 5, 0),
    F(clip_lo, 8, 1), F(clip_hi, 8, 1), F(depthwise, 1, 0)};
static const dpu_field POOL_F[] = {MISC_COMMON, POOL_FIELDS};
static const dpu_field ELT_F[] = {MISC_COMMON,       F(b_mem, 2, 0),   F(b_addr, 20, 0),
                                  F(b_pix_stride, 12, 0), F(b_row_stride, 20, 0), F(shift_a, 6, 1),
                                  F(shift_b, 6, 1),  F(shift, 5, 0),   F(clip_lo, 8, 1),
                                  F(clip_hi, 8, 1)};
static const dpu_field UP_F[] = {MISC_COMMON, F(factor_h, 4, 0), F(factor_w, 4, 0)};
static const dpu_field COPY_F[] = {MISC_COMMON};
#undef F

#define NFIELDS(a) ((int)(sizeof(a) / sizeof((a)[0])))
static const dpu_field *const LAYOUT[NUM_KINDS] = {LOAD_F, SAVE_F, CONV_F, POOL_F, POOL_F,
                                                   ELT_F,  UP_F,   COPY_F, NULL};
static const int LAYOUT_N[NUM_KINDS] = {NFIELDS(LOAD_F), NFIELDS(SAVE_F), NFIELDS(CONV_F),
                                        NFIELDS(POOL_F), NFIELDS(POOL_F), NFIELDS(ELT_F),
                                        NFIELDS(UP_F),   NFIELDS(COPY_F), 0};

/* Bits [lo, lo + width) of a 256-bit little-endian word, width in 1..63. */
static uint64_t get_bits(const uint64_t w[4], unsigned lo, unsigned width)
{
    unsigned i = lo >> 6, sh = lo & 63;
    uint64_t v = w[i] >> sh;
    if (sh + width > 64 && i < 3)
        v |= w[i + 1] << (64 - sh);
    return v & ((UINT64_C(1) << width) - 1);
}

static int64_t *field_ptr(dpu_insn *in, const dpu_field *f) { return (int64_t *)((char *)in + f->off); }

static int64_t read_field(const uint64_t w[4], unsigned lo, const dpu_field *f)
{
    uint64_t v = get_bits(w, lo, f->width);
    if (f->is_signed && (v >> (f->width - 1)))
        return (int64_t)v - ((int64_t)1 << f->width);
    return (int64_t)v;
}

/* Decodes the fields of one instruction (no semantic checks beyond opcode / op / reserved bits). */
static int decode(const uint8_t *p, uint32_t index, dpu_insn *in, accel_err *err)
{
    uint64_t w[4];
    unsigned lo = 0;
    int k, kind, n;
    memset(in, 0, sizeof(*in));
    for (k = 0; k < 4; k++)
        w[k] = accel_ld_u64le(p + 8 * k);
    in->index = index;
    for (k = 0; k < 3; k++) {
        *field_ptr(in, &HEADER[k]) = read_field(w, lo, &HEADER[k]);
        lo += HEADER[k].width;
    }
    switch (in->opcode) {
    case OP_LOAD: kind = K_LOAD; break;
    case OP_SAVE: kind = K_SAVE; break;
    case OP_CONV: kind = K_CONV; break;
    case OP_END: kind = K_END; break;
    case OP_MISC: {
        uint64_t op = get_bits(w, 12, 4);
        if (op > MISC_COPY)
            return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (MISC): unknown MISC op %llu", index, (ull)op);
        kind = K_MAXPOOL + (int)op;
        break;
    }
    default:
        return accel_fail(err, ACCEL_ERR_DECODE, "insn %u: unknown opcode %lld", index, (ll)in->opcode);
    }
    in->kind = kind;
    n = LAYOUT_N[kind];
    for (k = 0; k < n; k++) {
        *field_ptr(in, &LAYOUT[kind][k]) = read_field(w, lo, &LAYOUT[kind][k]);
        lo += LAYOUT[kind][k].width;
    }
    /* reserved bits [lo, 256) must be zero */
    {
        unsigned b;
        for (b = lo; b < 256; b += 32) {
            unsigned width = 256 - b < 32 ? 256 - b : 32;
            if (get_bits(w, b, width) != 0)
                return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): reserved bits [%u, 256) are not zero", index,
                                  KIND_NAMES[kind], lo);
        }
    }
    switch (kind) {
    case K_LOAD: in->unit = DPU_UNIT_LOAD; break;
    case K_SAVE: in->unit = DPU_UNIT_SAVE; break;
    case K_CONV: in->unit = DPU_UNIT_CONV; break;
    case K_END: in->unit = -1; break;
    default: in->unit = DPU_UNIT_MISC; break;
    }
    in->name = KIND_NAMES[kind];
    return ACCEL_OK;
}

int dpu_sim_decode_fields(const uint8_t *insn, int64_t *out, uint64_t max_fields, uint64_t *n_fields, char *errbuf,
                          uint64_t err_len)
{
    accel_err err;
    dpu_insn in;
    int rc, k, n;
    uint64_t j = 0;
    accel_err_init(&err, errbuf, err_len);
    if (!insn || (max_fields && !out))
        return accel_fail(&err, ACCEL_ERR_ARG, "NULL instruction or output buffer");
    if ((rc = decode(insn, 0, &in, &err)) != ACCEL_OK)
        return rc;
    for (k = 0; k < 3; k++, j++)
        if (j < max_fields)
            out[j] = *field_ptr(&in, &HEADER[k]);
    n = LAYOUT_N[in.kind];
    for (k = 0; k < n; k++, j++)
        if (j < max_fields)
            out[j] = *field_ptr(&in, &LAYOUT[in.kind][k]);
    if (n_fields)
        *n_fields = j;
    return ACCEL_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Configuration                                                                              */

static int is_pow2(uint64_t v) { return v && !(v & (v - 1)); }

static int check_config(const dpu_sim_config *c, dpu_geom *g, accel_err *err)
{
#define RANGE(field, name, lo, hi)                                                                              \
    if ((ll)(field) < (ll)(lo) || (ll)(field) > (ll)(hi))                                                       \
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field %s: %lld is outside %lld..%lld", name, (ll)(field), \
                          (ll)(lo), (ll)(hi));
    int r;
    RANGE(c->num_pe, "NUM_PE", 1, 16)
    RANGE(c->fm_memories, "FM_MEMORIES", 1, 4)
    RANGE(c->fm_banks, "FM_BANKS", 1, 64)
    RANGE(c->fm_bank_bytes, "FM_BANK_BYTES", 64, 1 << 20)
    if (!is_pow2((uint64_t)c->fm_banks))
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field FM_BANKS: %d is not a power of two", c->fm_banks);
    if (!is_pow2((uint64_t)c->fm_bank_bytes))
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field FM_BANK_BYTES: %d is not a power of two",
                          c->fm_bank_bytes);
    if ((uint64_t)c->fm_banks * (uint64_t)c->fm_bank_bytes > (UINT64_C(1) << 20))
        return accel_fail(err, ACCEL_ERR_CONFIG,
                          "config: field FM_BANK_BYTES: FM_BANKS x FM_BANK_BYTES exceeds the 20-bit FM address field");
    RANGE(c->pm_bytes, "PM_BYTES", 1024, 1 << 24)
    RANGE(c->conv_ic_par, "CONV_IC_PAR", 1, 256)
    RANGE(c->conv_oc_par, "CONV_OC_PAR", 1, 256)
    RANGE(c->conv_row_par, "CONV_ROW_PAR", 1, c->fm_banks)
    RANGE(c->misc_ch_par, "MISC_CH_PAR", 1, 256)
    RANGE(c->misc_row_par, "MISC_ROW_PAR", 1, c->fm_banks)
    RANGE(c->format_max_channels, "FORMAT_MAX_CHANNELS", 0, 64)
    RANGE(c->format_max_factor, "FORMAT_MAX_FACTOR", 0, 15)
    RANGE(c->load_latency_cycles, "LOAD_LATENCY_CYCLES", 0, 1 << 20)
    RANGE(c->save_latency_cycles, "SAVE_LATENCY_CYCLES", 0, 1 << 20)
    RANGE(c->conv_latency_cycles, "CONV_LATENCY_CYCLES", 0, 1 << 20)
    RANGE(c->misc_latency_cycles, "MISC_LATENCY_CYCLES", 0, 1 << 20)
#undef RANGE
    if (!(isfinite(c->clock_mhz) && c->clock_mhz > 0 && c->clock_mhz < 1e5))
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field CLOCK_MHZ: must be positive");
    if (!(isfinite(c->ddr_bytes_per_cycle) && c->ddr_bytes_per_cycle > 0 && c->ddr_bytes_per_cycle <= 65536))
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field DDR_BYTES_PER_CYCLE: must be in (0, 65536]");
    for (r = 0; r < DPU_NUM_REGIONS; r++) {
        if (c->region_size[r] > (UINT64_C(1) << 32))
            return accel_fail(err, ACCEL_ERR_CONFIG, "config: DDR region %s: size %llu exceeds 2^32", REGION_NAMES[r],
                              (ull)c->region_size[r]);
        if (c->region_base[r] > (UINT64_C(1) << 62))
            return accel_fail(err, ACCEL_ERR_CONFIG, "config: DDR region %s: base %llu is too large", REGION_NAMES[r],
                              (ull)c->region_base[r]);
        g->region_base[r] = c->region_base[r];
        g->region_size[r] = c->region_size[r];
    }
    g->n_pe = (uint32_t)c->num_pe;
    g->n_mem = (uint32_t)c->fm_memories;
    g->bank_bytes = (uint64_t)c->fm_bank_bytes;
    g->mem_bytes = (uint64_t)c->fm_banks * g->bank_bytes;
    g->pm_bytes = (uint64_t)c->pm_bytes;
    g->ic_par = (uint64_t)c->conv_ic_par;
    g->oc_par = (uint64_t)c->conv_oc_par;
    g->row_par = (uint64_t)c->conv_row_par;
    g->mch_par = (uint64_t)c->misc_ch_par;
    g->mrow_par = (uint64_t)c->misc_row_par;
    g->fmt_max_ch = (uint64_t)c->format_max_channels;
    g->fmt_max_f = (uint64_t)c->format_max_factor;
    g->lat[DPU_UNIT_LOAD] = (uint64_t)c->load_latency_cycles;
    g->lat[DPU_UNIT_SAVE] = (uint64_t)c->save_latency_cycles;
    g->lat[DPU_UNIT_CONV] = (uint64_t)c->conv_latency_cycles;
    g->lat[DPU_UNIT_MISC] = (uint64_t)c->misc_latency_cycles;
    g->bpc = c->ddr_bytes_per_cycle;
    g->clock_mhz = c->clock_mhz;
    g->max_cycles = c->max_cycles == 0 ? ACCEL_DEFAULT_MAX_CYCLES : c->max_cycles;
    if (g->max_cycles > ACCEL_MAX_MAX_CYCLES)
        g->max_cycles = ACCEL_MAX_MAX_CYCLES;
    return ACCEL_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Static checks of one instruction; fills the derived values                                 */

static uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

static uint64_t mul3(uint64_t a, uint64_t b, uint64_t c) { return accel_sat_mul(accel_sat_mul(a, b), c); }

/* An FM tensor of rows x cols pixels of pix_bytes bytes; names the fields it came from. */
static int check_fm(const dpu_geom *g, const dpu_insn *in, const char *mem_f, int64_t mem, const char *addr_f,
                    int64_t addr, const char *pix_f, int64_t pix, const char *row_f, int64_t row, uint64_t rows,
                    uint64_t cols, uint64_t pix_bytes, accel_err *err)
{
    uint64_t ext;
    if ((uint64_t)mem >= g->n_mem)
        return accel_fail(err, ACCEL_ERR_BOUNDS, "insn %u (%s): field %s = %lld names a missing FM memory (the FM has %u)",
                          in->index, in->name, mem_f, (ll)mem, g->n_mem);
    if ((uint64_t)addr >= g->mem_bytes)
        return accel_fail(err, ACCEL_ERR_BOUNDS, "insn %u (%s): field %s = 0x%llx exceeds the FM memory size 0x%llx",
                          in->index, in->name, addr_f, (ull)addr, (ull)g->mem_bytes);
    if (cols > 1 && (uint64_t)pix < pix_bytes)
        return accel_fail(err, ACCEL_ERR_BOUNDS,
                          "insn %u (%s): field %s = %lld is smaller than a pixel of %llu bytes (pixels would overlap)",
                          in->index, in->name, pix_f, (ll)pix, (ull)pix_bytes);
    ext = (cols - 1) * (uint64_t)pix + pix_bytes;
    if (rows > 1 && (uint64_t)row < ext)
        return accel_fail(err, ACCEL_ERR_BOUNDS,
                          "insn %u (%s): field %s = %lld is smaller than a row of %llu bytes (rows would overlap)",
                          in->index, in->name, row_f, (ll)row, (ull)ext);
    ext += (rows - 1) * (uint64_t)row;
    if (ext > g->mem_bytes)
        return accel_fail(err, ACCEL_ERR_BOUNDS,
                          "insn %u (%s): %s tensor of %llux%llu pixels spans %llu bytes, more than the FM memory of %llu "
                          "bytes (fields %s, %s)",
                          in->index, in->name, addr_f, (ull)rows, (ull)cols, (ull)ext, (ull)g->mem_bytes, pix_f, row_f);
    return ACCEL_OK;
}

/* A strided DDR block for n_img images, img_stride apart, in region `region`. */
static int check_ddr_range(const dpu_geom *g, const dpu_insn *in, uint64_t ddr_bytes, int write, uint64_t n_img,
                           accel_err *err)
{
    const uint64_t r = (uint64_t)in->region;
    uint64_t ext, last, end;
    if (r >= DPU_NUM_REGIONS)
        return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field region = %llu is not a DDR region (0..4)",
                          in->index, in->name, (ull)r);
    if (write && r != DPU_REGION_OUTPUT && r != DPU_REGION_SWAP)
        return accel_fail(err, ACCEL_ERR_BOUNDS,
                          "insn %u (%s): field region = %s: a SAVE may only write regions OUTPUT and SWAP", in->index,
                          in->name, REGION_NAMES[r]);
    ext = ((uint64_t)in->rows - 1) * (uint64_t)in->ddr_row_stride + ((uint64_t)in->cols - 1) * (uint64_t)in->ddr_pix_stride +
          (uint64_t)in->chans;
    last = accel_sat_add((uint64_t)in->ddr_offset, accel_sat_mul(n_img - 1, (uint64_t)in->img_stride));
    end = accel_sat_add(last, ext);
    if (end > g->region_size[r])
        return accel_fail(err, ACCEL_ERR_BOUNDS,
                          "insn %u (%s): DDR range [0x%llx, 0x%llx) (field ddr_offset 0x%llx, img_stride 0x%llx x %llu "
                          "images, block of %llu bytes) exceeds region %s of %llu bytes",
                          in->index, in->name, (ull)in->ddr_offset, (ull)end, (ull)in->ddr_offset, (ull)in->img_stride,
                          (ull)n_img, (ull)ext, REGION_NAMES[r], (ull)g->region_size[r]);
    if (accel_sat_add(g->region_base[r], end) > ddr_bytes)
        return accel_fail(err, ACCEL_ERR_BOUNDS,
                          "insn %u (%s): DDR range [0x%llx, 0x%llx) of region %s (base 0x%llx) exceeds the DDR buffer of "
                          "%llu bytes",
                          in->index, in->name, (ull)(g->region_base[r] + (uint64_t)in->ddr_offset),
                          (ull)accel_sat_add(g->region_base[r], end), REGION_NAMES[r], (ull)g->region_base[r],
                          (ull)ddr_bytes);
    return ACCEL_OK;
}

static int must_be_zero(const dpu_insn *in, const char *field, int64_t v, const char *why, accel_err *err)
{
    if (v != 0)
        return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field %s = %lld must be 0 %s", in->index, in->name, field,
                          (ll)v, why);
    return ACCEL_OK;
}

/* Window of a CONV / pool: sets win_rows/cols and in_rows/cols. */
static int check_window(const dpu_insn *in, dpu_insn *out, accel_err *err)
{
    if (in->kernel_h < 1 || in->kernel_w < 1)
        return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field %s = 0, a kernel is at least 1x1", in->index,
                          in->name, in->kernel_h < 1 ? "kernel_h" : "kernel_w");
    if (in->stride_h < 1 || in->stride_w < 1)
        return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field %s = 0, a stride is at least 1", in->index,
                          in->name, in->stride_h < 1 ? "stride_h" : "stride_w");
    out->win_rows = ((uint64_t)in->out_h - 1) * (uint64_t)in->stride_h + (uint64_t)in->kernel_h;
    out->win_cols = ((uint64_t)in->out_w - 1) * (uint64_t)in->stride_w + (uint64_t)in->kernel_w;
    if ((uint64_t)(in->pad_top + in->pad_bottom) >= out->win_rows)
        return accel_fail(err, ACCEL_ERR_DECODE,
                          "insn %u (%s): fields pad_top + pad_bottom = %lld leave no input row in the window of %llu rows",
                          in->index, in->name, (ll)(in->pad_top + in->pad_bottom), (ull)out->win_rows);
    if ((uint64_t)(in->pad_left + in->pad_right) >= out->win_cols)
        return accel_fail(err, ACCEL_ERR_DECODE,
                          "insn %u (%s): fields pad_left + pad_right = %lld leave no input column in the window of %llu "
                          "columns",
                          in->index, in->name, (ll)(in->pad_left + in->pad_right), (ull)out->win_cols);
    out->in_rows = out->win_rows - (uint64_t)(in->pad_top + in->pad_bottom);
    out->in_cols = out->win_cols - (uint64_t)(in->pad_left + in->pad_right);
    return ACCEL_OK;
}

static int check_clip(const dpu_insn *in, accel_err *err)
{
    if (in->clip_lo > in->clip_hi)
        return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field clip_lo = %lld is greater than clip_hi = %lld",
                          in->index, in->name, (ll)in->clip_lo, (ll)in->clip_hi);
    return ACCEL_OK;
}

/* Taps of a window that fall on real input along one axis, summed over the outputs. */
static uint64_t valid_taps(uint64_t n_out, uint64_t stride, uint64_t kernel, uint64_t pad, uint64_t n_in)
{
    uint64_t o, k, t = 0;
    for (o = 0; o < n_out; o++)
        for (k = 0; k < kernel; k++) {
            uint64_t r = o * stride + k;
            t += (r >= pad && r - pad < n_in);
        }
    return t;
}

static int check_load(const dpu_geom *g, dpu_insn *in, uint64_t ddr_bytes, accel_err *err)
{
    const uint64_t rows = (uint64_t)in->rows, cols = (uint64_t)in->cols, chans = (uint64_t)in->chans;
    uint64_t bytes = rows * cols * chans;
    int rc;
    if (in->to_pm) {
        const char *why = "for a LOAD to PM";
        in->name = "LOAD PM";
        if (in->noop)
            return ACCEL_OK;
        if ((rc = must_be_zero(in, "fm_mem", in->fm_mem, why, err)) || (rc = must_be_zero(in, "fm_pix_stride", in->fm_pix_stride, why, err)) ||
            (rc = must_be_zero(in, "fm_row_stride", in->fm_row_stride, why, err)) ||
            (rc = must_be_zero(in, "pad_top", in->pad_top, why, err)) ||
            (rc = must_be_zero(in, "pad_bottom", in->pad_bottom, why, err)) ||
            (rc = must_be_zero(in, "pad_left", in->pad_left, why, err)) ||
            (rc = must_be_zero(in, "pad_right", in->pad_right, why, err)) ||
            (rc = must_be_zero(in, "pad_value", in->pad_value, why, err)) ||
            (rc = must_be_zero(in, "img_stride", in->img_stride, why, err)) || (rc = must_be_zero(in, "fmt", in->fmt, why, err)))
            return rc;
        if ((uint64_t)in->dst_addr >= g->pm_bytes)
            return accel_fail(err, ACCEL_ERR_BOUNDS, "insn %u (%s): field dst_addr = 0x%llx exceeds the PM size 0x%llx",
                              in->index, in->name, (ull)in->dst_addr, (ull)g->pm_bytes);
        if (bytes > g->pm_bytes)
            return accel_fail(err, ACCEL_ERR_BOUNDS,
                              "insn %u (%s): fields rows x cols x chans = %llu bytes exceed the PM of %llu bytes", in->index,
                              in->name, (ull)bytes, (ull)g->pm_bytes);
        if ((rc = check_ddr_range(g, in, ddr_bytes, 0, 1, err)) != ACCEL_OK)
            return rc;
        in->ddr_rd = bytes;
        in->pm_wr = bytes;
    } else {
        const uint64_t f = in->fmt ? (uint64_t)in->fmt : 1;
        in->name = "LOAD FM";
        if (in->noop)
            return ACCEL_OK;
        if (in->fmt) {
            if (g->fmt_max_f == 0 || g->fmt_max_ch == 0)
                return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field fmt = %lld but the config has no format unit",
                                  in->index, in->name, (ll)in->fmt);
            if ((uint64_t)in->fmt > g->fmt_max_f)
                return accel_fail(err, ACCEL_ERR_DECODE,
                                  "insn %u (%s): field fmt = %lld exceeds FORMAT_MAX_FACTOR = %llu", in->index, in->name,
                                  (ll)in->fmt, (ull)g->fmt_max_f);
            if (chans > g->fmt_max_ch)
                return accel_fail(err, ACCEL_ERR_DECODE,
                                  "insn %u (%s): field chans = %llu: the format unit takes at most %llu channels "
                                  "(FORMAT_MAX_CHANNELS)",
                                  in->index, in->name, (ull)chans, (ull)g->fmt_max_ch);
        }
        in->win_rows = rows + (uint64_t)(in->pad_top + in->pad_bottom);
        in->win_cols = cols + (uint64_t)(in->pad_left + in->pad_right);
        in->pix_bytes = f * chans;
        if ((rc = check_fm(g, in, "fm_mem", in->fm_mem, "dst_addr", in->dst_addr, "fm_pix_stride", in->fm_pix_stride,
                           "fm_row_stride", in->fm_row_stride, in->win_rows, in->win_cols, in->pix_bytes, err)) != ACCEL_OK)
            return rc;
        if ((rc = check_ddr_range(g, in, ddr_bytes, 0, g->n_pe, err)) != ACCEL_OK)
            return rc;
        in->ddr_rd = bytes * g->n_pe;
        in->fm_wr = in->win_rows * in->win_cols * in->pix_bytes * g->n_pe;
    }
    in->dur = accel_dma_cycles(in->ddr_rd, g->bpc, g->lat[DPU_UNIT_LOAD]);
    return ACCEL_OK;
}

static int check_save(const dpu_geom *g, dpu_insn *in, uint64_t ddr_bytes, accel_err *err)
{
    const uint64_t bytes = (uint64_t)(in->rows * in->cols * in->chans);
    int rc;
    if (in->noop)
        return ACCEL_OK;
    if ((rc = check_fm(g, in, "fm_mem", in->fm_mem, "src_addr", in->src_addr, "fm_pix_stride", in->fm_pix_stride,
                       "fm_row_stride", in->fm_row_stride, (uint64_t)in->rows, (uint64_t)in->cols, (uint64_t)in->chans,
                       err)) != ACCEL_OK)
        return rc;
    if ((rc = check_ddr_range(g, in, ddr_bytes, 1, g->n_pe, err)) != ACCEL_OK)
        return rc;
    in->ddr_wr = bytes * g->n_pe;
    in->fm_rd = bytes * g->n_pe;
    in->dur = accel_dma_cycles(in->ddr_wr, g->bpc, g->lat[DPU_UNIT_SAVE]);
    return ACCEL_OK;
}

static int check_conv(const dpu_geom *g, dpu_insn *in, accel_err *err)
{
    const uint64_t oh = (uint64_t)in->out_h, ow = (uint64_t)in->out_w, oc = (uint64_t)in->oc, ic = (uint64_t)in->ic;
    const uint64_t kh = (uint64_t)in->kernel_h, kw = (uint64_t)in->kernel_w, n = g->n_pe;
    uint64_t wic, params, steps;
    int rc;
    if (in->depthwise)
        in->name = "CONV DW";
    if (in->noop)
        return ACCEL_OK;
    if ((rc = check_window(in, in, err)) != ACCEL_OK || (rc = check_clip(in, err)) != ACCEL_OK)
        return rc;
    if (in->depthwise && ic != oc)
        return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field ic = %llu must equal oc = %llu for a depthwise CONV",
                          in->index, in->name, (ull)ic, (ull)oc);
    if ((rc = check_fm(g, in, "in_mem", in->in_mem, "in_addr", in->in_addr, "in_pix_stride", in->in_pix_stride,
                       "in_row_stride", in->in_row_stride, in->in_rows, in->in_cols, ic, err)) != ACCEL_OK)
        return rc;
    if ((rc = check_fm(g, in, "out_mem", in->out_mem, "out_addr", in->out_addr, "out_pix_stride", in->out_pix_stride,
                       "out_row_stride", in->out_row_stride, oh, ow, oc, err)) != ACCEL_OK)
        return rc;
    wic = in->depthwise ? 1 : ic;
    params = oc * kh * kw * wic + 4 * oc;
    if ((uint64_t)in->param_addr >= g->pm_bytes)
        return accel_fail(err, ACCEL_ERR_BOUNDS, "insn %u (%s): field param_addr = 0x%llx exceeds the PM size 0x%llx",
                          in->index, in->name, (ull)in->param_addr, (ull)g->pm_bytes);
    if (params > g->pm_bytes)
        return accel_fail(err, ACCEL_ERR_BOUNDS,
                          "insn %u (%s): parameters of %llu bytes (weights + int32 bias) at field param_addr exceed the PM "
                          "of %llu bytes",
                          in->index, in->name, (ull)params, (ull)g->pm_bytes);
    steps = mul3(ceil_div(oh, g->row_par), ow, ceil_div(oc, g->oc_par));
    steps = mul3(steps, in->depthwise ? 1 : ceil_div(ic, g->ic_par), kh * kw);
    in->dur = accel_compute_cycles(steps, 1, g->lat[DPU_UNIT_CONV]);
    in->macs = mul3(valid_taps(oh, (uint64_t)in->stride_h, kh, (uint64_t)in->pad_top, in->in_rows),
                    valid_taps(ow, (uint64_t)in->stride_w, kw, (uint64_t)in->pad_left, in->in_cols), oc * wic * n);
    in->padded_macs = mul3(oh * ow, kh * kw, oc * wic * n);
    in->fm_rd = in->in_rows * in->in_cols * ic * n;
    in->fm_wr = oh * ow * oc * n;
    in->pm_rd = params;
    return ACCEL_OK;
}

static int check_misc(const dpu_geom *g, dpu_insn *in, accel_err *err)
{
    const uint64_t oh = (uint64_t)in->out_h, ow = (uint64_t)in->out_w, c = (uint64_t)in->chans, n = g->n_pe;
    uint64_t taps = 1, reads = 1;
    int rc;
    if (in->noop)
        return ACCEL_OK;
    switch (in->kind) {
    case K_MAXPOOL:
    case K_AVGPOOL:
        if ((rc = check_window(in, in, err)) != ACCEL_OK || (rc = check_clip(in, err)) != ACCEL_OK)
            return rc;
        taps = (uint64_t)(in->kernel_h * in->kernel_w);
        break;
    case K_ELTADD:
        if ((rc = check_clip(in, err)) != ACCEL_OK)
            return rc;
        if ((rc = check_fm(g, in, "b_mem", in->b_mem, "b_addr", in->b_addr, "b_pix_stride", in->b_pix_stride,
                           "b_row_stride", in->b_row_stride, oh, ow, c, err)) != ACCEL_OK)
            return rc;
        in->in_rows = oh;
        in->in_cols = ow;
        reads = 2;
        break;
    case K_UPSAMPLE:
        if (in->factor_h < 1 || in->factor_w < 1)
            return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field %s = 0, an up-sampling factor is at least 1",
                              in->index, in->name, in->factor_h < 1 ? "factor_h" : "factor_w");
        in->in_rows = ceil_div(oh, (uint64_t)in->factor_h);
        in->in_cols = ceil_div(ow, (uint64_t)in->factor_w);
        break;
    default: /* COPY */
        in->in_rows = oh;
        in->in_cols = ow;
        break;
    }
    if ((rc = check_fm(g, in, "in_mem", in->in_mem, "in_addr", in->in_addr, "in_pix_stride", in->in_pix_stride,
                       "in_row_stride", in->in_row_stride, in->in_rows, in->in_cols, c, err)) != ACCEL_OK)
        return rc;
    if ((rc = check_fm(g, in, "out_mem", in->out_mem, "out_addr", in->out_addr, "out_pix_stride", in->out_pix_stride,
                       "out_row_stride", in->out_row_stride, oh, ow, c, err)) != ACCEL_OK)
        return rc;
    in->dur = accel_compute_cycles(mul3(ceil_div(oh, g->mrow_par), ow, ceil_div(c, g->mch_par)), taps,
                                   g->lat[DPU_UNIT_MISC]);
    in->fm_rd = in->in_rows * in->in_cols * c * n * reads;
    in->fm_wr = oh * ow * c * n;
    return ACCEL_OK;
}

/* Every check that depends on the instruction alone (plus config, regions and DDR size). */
static int check_insn(const dpu_geom *g, dpu_insn *in, uint64_t ddr_bytes, accel_err *err)
{
    int b;
    if (in->kind == K_END) {
        if (in->dpon || in->dpby)
            return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (END): fields DPON/DPBY must be empty", in->index);
        return ACCEL_OK;
    }
    for (b = 0; b < DPU_NUM_UNITS; b++)
        if (b == in->unit && ((in->dpon >> b) & 1))
            return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field DPON lists %s itself", in->index, in->name,
                              UNIT_NAMES[b]);
        else if (b == in->unit && ((in->dpby >> b) & 1))
            return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field DPBY lists %s itself", in->index, in->name,
                              UNIT_NAMES[b]);
    in->dur = 1;
    switch (in->kind) {
    case K_LOAD:
        in->noop = in->rows == 0 || in->cols == 0 || in->chans == 0;
        return check_load(g, in, ddr_bytes, err);
    case K_SAVE:
        in->noop = in->rows == 0 || in->cols == 0 || in->chans == 0;
        return check_save(g, in, ddr_bytes, err);
    case K_CONV:
        in->noop = in->out_h == 0 || in->out_w == 0 || in->oc == 0 || in->ic == 0;
        return check_conv(g, in, err);
    default:
        in->noop = in->out_h == 0 || in->out_w == 0 || in->chans == 0;
        return check_misc(g, in, err);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Scheduler                                                                                  */

typedef struct {
    uint64_t *t; /* completion times carried by the tokens */
    uint64_t head, tail, cap;
} token_fifo;

uint64_t dpu_sim_config_size(void) { return sizeof(dpu_sim_config); }
uint64_t dpu_sim_stats_size(void) { return sizeof(dpu_sim_stats); }

static void mask_text(int64_t mask, char *buf, size_t len)
{
    size_t n = 0;
    int b;
    buf[0] = '\0';
    for (b = 0; b < DPU_NUM_UNITS; b++)
        if ((mask >> b) & 1) {
            int w = snprintf(buf + n, len - n, "%s%s", n ? "|" : "", UNIT_NAMES[b]);
            if (w > 0 && (size_t)w < len - n)
                n += (size_t)w;
        }
    if (!n)
        snprintf(buf, len, "-");
}

/* Decodes and checks instruction k (used by the static pass and again by the run loop). */
static int load_insn(const dpu_geom *g, const uint8_t *insns, uint64_t k, uint64_t ddr_bytes, dpu_insn *in,
                     accel_err *err)
{
    int rc = decode(insns + INSN_BYTES * k, (uint32_t)k, in, err);
    if (rc != ACCEL_OK)
        return rc;
    return check_insn(g, in, ddr_bytes, err);
}

/* Adds the counters of one executed instruction (starting at `start` after its unit was free at `free_at`) to
 * `st`; `last_src` is the producer whose token arrived last (-1: none). */
static void count_insn(dpu_sim_stats *st, const dpu_insn *in, int u, uint64_t start, uint64_t free_at, int last_src)
{
    st->busy[u] += in->dur;
    st->stall[u] += start - free_at;
    if (last_src >= 0)
        st->stall_on[u][last_src] += start - free_at;
    st->insns[u]++;
    st->macs += in->macs;
    st->padded_macs += in->padded_macs;
    st->ddr_read_bytes += in->ddr_rd;
    st->ddr_write_bytes += in->ddr_wr;
    st->fm_read_bytes += in->fm_rd;
    st->fm_write_bytes += in->fm_wr;
    st->pm_read_bytes += in->pm_rd;
    st->pm_write_bytes += in->pm_wr;
}

/* Index of the range holding instruction k: the first r with range_end[r] > k (the last range otherwise). */
static uint64_t range_of(const uint64_t *range_end, uint64_t n_ranges, uint64_t k)
{
    uint64_t lo = 0, hi = n_ranges - 1;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (range_end[mid] > k)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static int run_impl(const dpu_sim_config *cfg, const uint8_t *insns, uint64_t insn_bytes, uint8_t *ddr,
                    uint64_t ddr_bytes, dpu_sim_stats *stats, const uint64_t *range_end, uint64_t n_ranges,
                    dpu_sim_stats *range_stats, const char *trace_path, double trace_offset_us,
                    int32_t trace_append, char *errbuf, uint64_t err_len);

int dpu_sim_run(const dpu_sim_config *cfg, const uint8_t *insns, uint64_t insn_bytes, uint8_t *ddr, uint64_t ddr_bytes,
                dpu_sim_stats *stats, const char *trace_path, double trace_offset_us, int32_t trace_append,
                char *errbuf, uint64_t err_len)
{
    return run_impl(cfg, insns, insn_bytes, ddr, ddr_bytes, stats, NULL, 0, NULL, trace_path, trace_offset_us,
                    trace_append, errbuf, err_len);
}

int dpu_sim_run_ranges(const dpu_sim_config *cfg, const uint8_t *insns, uint64_t insn_bytes, uint8_t *ddr,
                       uint64_t ddr_bytes, dpu_sim_stats *stats, const uint64_t *range_end, uint64_t n_ranges,
                       dpu_sim_stats *range_stats, const char *trace_path, double trace_offset_us,
                       int32_t trace_append, char *errbuf, uint64_t err_len)
{
    accel_err err;
    uint64_t r, n = insn_bytes / INSN_BYTES;
    accel_err_init(&err, errbuf, err_len);
    if (n_ranges == 0 || !range_end || !range_stats)
        return accel_fail(&err, ACCEL_ERR_ARG, "no instruction ranges given (n_ranges = %llu)", (ull)n_ranges);
    if (n_ranges > n)
        return accel_fail(&err, ACCEL_ERR_ARG, "%llu instruction ranges for a stream of %llu instructions",
                          (ull)n_ranges, (ull)n);
    for (r = 0; r < n_ranges; r++)
        if (range_end[r] == 0 || range_end[r] > n || (r > 0 && range_end[r] <= range_end[r - 1]))
            return accel_fail(&err, ACCEL_ERR_ARG,
                              "instruction range %llu ends at %llu: range ends must increase strictly within 1..%llu",
                              (ull)r, (ull)range_end[r], (ull)n);
    if (range_end[n_ranges - 1] + 1 < n)
        return accel_fail(&err, ACCEL_ERR_ARG,
                          "the instruction ranges end at %llu but the stream has %llu instructions (END excepted)",
                          (ull)range_end[n_ranges - 1], (ull)(n - 1));
    return run_impl(cfg, insns, insn_bytes, ddr, ddr_bytes, stats, range_end, n_ranges, range_stats, trace_path,
                    trace_offset_us, trace_append, errbuf, err_len);
}

static int run_impl(const dpu_sim_config *cfg, const uint8_t *insns, uint64_t insn_bytes, uint8_t *ddr,
                    uint64_t ddr_bytes, dpu_sim_stats *stats, const uint64_t *range_end, uint64_t n_ranges,
                    dpu_sim_stats *range_stats, const char *trace_path, double trace_offset_us,
                    int32_t trace_append, char *errbuf, uint64_t err_len)
{
    uint64_t *range_done = NULL, *range_cs = NULL, *range_ce = NULL, *range_conv_end = NULL;
    uint64_t cstart = UINT64_MAX, cend = 0;
    accel_err err;
    dpu_state s;
    dpu_sim_stats local_stats;
    accel_trace trace;
    token_fifo fifo[DPU_NUM_UNITS][DPU_NUM_UNITS];
    uint32_t *order = NULL;
    uint64_t start_of[DPU_NUM_UNITS], count[DPU_NUM_UNITS] = {0, 0, 0, 0}, pc[DPU_NUM_UNITS] = {0, 0, 0, 0};
    uint64_t free_at[DPU_NUM_UNITS] = {0, 0, 0, 0};
    uint64_t n, k, end_max = 0;
    dpu_insn cur[DPU_NUM_UNITS];
    int a, b, u, rc = ACCEL_OK;

    accel_err_init(&err, errbuf, err_len);
    memset(&s, 0, sizeof(s));
    memset(fifo, 0, sizeof(fifo));
    trace.f = NULL;
    if (!stats)
        stats = &local_stats;
    memset(stats, 0, sizeof(*stats));
    if (n_ranges)
        memset(range_stats, 0, (size_t)n_ranges * sizeof(*range_stats));

    if (!cfg)
        return accel_fail(&err, ACCEL_ERR_ARG, "no config given");
    if (insn_bytes % INSN_BYTES != 0)
        return accel_fail(&err, ACCEL_ERR_ARG, "instruction stream of %llu bytes is not a multiple of %d",
                          (ull)insn_bytes, INSN_BYTES);
    if ((insn_bytes && !insns) || (ddr_bytes && !ddr))
        return accel_fail(&err, ACCEL_ERR_ARG, "NULL instruction or DDR buffer");
    if (!isfinite(trace_offset_us))
        return accel_fail(&err, ACCEL_ERR_ARG, "trace offset is not finite");
    n = insn_bytes / INSN_BYTES;
    if (n > UINT32_MAX)
        return accel_fail(&err, ACCEL_ERR_ARG, "instruction stream of %llu instructions is too long", (ull)n);
    if ((rc = check_config(cfg, &s.g, &err)) != ACCEL_OK)
        return rc;
    s.ddr = ddr;
    s.ddr_bytes = ddr_bytes;

    /* Static pass: decode and check every instruction; count instructions per unit and pushes per FIFO. */
    {
        uint64_t pushes[DPU_NUM_UNITS][DPU_NUM_UNITS];
        int end_seen = 0;
        memset(pushes, 0, sizeof(pushes));
        for (k = 0; k < n; k++) {
            dpu_insn in;
            if ((k & 4095) == 0 && accel_should_stop())
                return accel_fail(&err, ACCEL_ERR_INTERRUPTED, "interrupted while checking insn %llu", (ull)k);
            if ((rc = load_insn(&s.g, insns, k, ddr_bytes, &in, &err)) != ACCEL_OK)
                return rc;
            if (in.kind == K_END) {
                end_seen = 1;
                if (k + 1 != n)
                    return accel_fail(&err, ACCEL_ERR_PROTOCOL,
                                      "insn %llu (END): END must be the last instruction, %llu more follow", (ull)k,
                                      (ull)(n - k - 1));
                continue;
            }
            count[in.unit]++;
            for (b = 0; b < DPU_NUM_UNITS; b++)
                if ((in.dpby >> b) & 1)
                    pushes[in.unit][b]++;
        }
        if (!end_seen)
            return accel_fail(&err, ACCEL_ERR_PROTOCOL, "no END instruction at the end of the stream of %llu instructions",
                              (ull)n);
        for (a = 0; a < DPU_NUM_UNITS; a++)
            for (b = 0; b < DPU_NUM_UNITS; b++) {
                fifo[a][b].cap = pushes[a][b];
                fifo[a][b].t = (uint64_t *)accel_calloc(pushes[a][b], sizeof(uint64_t));
                if (!fifo[a][b].t) {
                    rc = accel_fail(&err, ACCEL_ERR_NOMEM, "out of host memory for the token FIFOs");
                    goto done;
                }
            }
    }

    if (n_ranges) {
        range_done = (uint64_t *)accel_calloc(n_ranges, sizeof(uint64_t));
        range_cs = (uint64_t *)accel_calloc(n_ranges, sizeof(uint64_t));
        range_ce = (uint64_t *)accel_calloc(n_ranges, sizeof(uint64_t));
        range_conv_end = (uint64_t *)accel_calloc(n_ranges, sizeof(uint64_t));
        if (!range_done || !range_cs || !range_ce || !range_conv_end) {
            rc = accel_fail(&err, ACCEL_ERR_NOMEM, "out of host memory for the instruction ranges");
            goto done;
        }
        for (k = 0; k < n_ranges; k++)
            range_cs[k] = UINT64_MAX;
    }
    order = (uint32_t *)accel_calloc(n, sizeof(uint32_t));
    s.fm = (uint8_t *)accel_calloc((uint64_t)s.g.n_pe * s.g.n_mem, s.g.mem_bytes);
    s.pm = (uint8_t *)accel_calloc(s.g.pm_bytes, 1);
    if (!order || !s.fm || !s.pm) {
        rc = accel_fail(&err, ACCEL_ERR_NOMEM, "out of host memory for the simulator state");
        goto done;
    }
    start_of[0] = 0;
    for (u = 1; u < DPU_NUM_UNITS; u++)
        start_of[u] = start_of[u - 1] + count[u - 1];
    {
        uint64_t fill[DPU_NUM_UNITS];
        memcpy(fill, start_of, sizeof(fill));
        for (k = 0; k + 1 < n; k++) {
            const uint8_t op = insns[INSN_BYTES * k] & 15;
            int unit = op == OP_LOAD ? DPU_UNIT_LOAD : op == OP_SAVE ? DPU_UNIT_SAVE : op == OP_CONV ? DPU_UNIT_CONV
                                                                                                    : DPU_UNIT_MISC;
            order[fill[unit]++] = (uint32_t)k;
        }
    }

    if (trace_path) {
        if ((rc = accel_trace_open(&trace, trace_path, trace_append != 0, &err)) != ACCEL_OK)
            goto done;
        accel_trace_process_name(&trace, 0, "DPU");
        for (u = 0; u < DPU_NUM_UNITS; u++)
            accel_trace_thread_name(&trace, 0, u, UNIT_NAMES[u]);
    }

    for (u = 0; u < DPU_NUM_UNITS; u++)
        if (count[u] > 0 && (rc = load_insn(&s.g, insns, order[start_of[u]], ddr_bytes, &cur[u], &err)) != ACCEL_OK)
            goto done;

    /* Discrete-event loop: run the ready unit whose next instruction starts earliest. */
    for (;;) {
        int best = -1, last_src = -1;
        uint64_t best_start = 0, end;
        for (u = 0; u < DPU_NUM_UNITS; u++) {
            uint64_t t;
            int ready = 1;
            if (pc[u] >= count[u])
                continue;
            t = free_at[u];
            for (a = 0; a < DPU_NUM_UNITS; a++) {
                token_fifo *f = &fifo[a][u];
                if (!((cur[u].dpon >> a) & 1))
                    continue;
                if (f->head == f->tail) {
                    ready = 0;
                    break;
                }
                if (f->t[f->head] > t)
                    t = f->t[f->head];
            }
            if (ready && (best < 0 || t < best_start)) {
                best = u;
                best_start = t;
            }
        }
        if (best < 0) {
            int all_done = 1;
            for (u = 0; u < DPU_NUM_UNITS; u++)
                if (pc[u] < count[u])
                    all_done = 0;
            if (all_done)
                break;
            {
                char msg[768];
                size_t len = 0;
                msg[0] = '\0';
                for (u = 0; u < DPU_NUM_UNITS; u++) {
                    int w;
                    if (pc[u] >= count[u]) {
                        w = snprintf(msg + len, sizeof(msg) - len, "%s%s done", len ? "; " : "", UNIT_NAMES[u]);
                    } else {
                        char waits[96];
                        size_t wl = 0;
                        waits[0] = '\0';
                        for (a = 0; a < DPU_NUM_UNITS; a++)
                            if (((cur[u].dpon >> a) & 1) && fifo[a][u].head == fifo[a][u].tail) {
                                int k2 = snprintf(waits + wl, sizeof(waits) - wl, "%s%s->%s", wl ? " and " : "",
                                                  UNIT_NAMES[a], UNIT_NAMES[u]);
                                if (k2 > 0 && (size_t)k2 < sizeof(waits) - wl)
                                    wl += (size_t)k2;
                            }
                        w = snprintf(msg + len, sizeof(msg) - len, "%s%s blocked at insn %u (%s) waiting on FIFO %s",
                                     len ? "; " : "", UNIT_NAMES[u], cur[u].index, cur[u].name, waits);
                    }
                    if (w > 0)
                        len += (size_t)w;
                    if (len >= sizeof(msg))
                        len = sizeof(msg) - 1;
                }
                rc = accel_fail(&err, ACCEL_ERR_PROTOCOL, "deadlock: %s", msg);
            }
            goto done;
        }

        u = best;
        {
            dpu_insn *in = &cur[u];
            if (in->dur > s.g.max_cycles - best_start) {
                rc = accel_fail(&err, ACCEL_ERR_BUDGET,
                                "insn %u (%s): cycle budget of %llu cycles exceeded (starts at cycle %llu, takes %llu "
                                "cycles); raise max_cycles if the program is legitimate",
                                in->index, in->name, (ull)s.g.max_cycles, (ull)best_start, (ull)in->dur);
                goto done;
            }
            if (accel_should_stop() || (!in->noop && (rc = dpu_exec(&s, in, &err)) != ACCEL_OK)) {
                if (rc == ACCEL_OK || rc == ACCEL_ERR_INTERRUPTED)
                    rc = accel_interrupted(&err, "insn", in->index, in->noop ? "NOP" : in->name, best_start);
                goto done;
            }
            end = best_start + in->dur;
            for (a = 0; a < DPU_NUM_UNITS; a++)
                if ((in->dpon >> a) & 1) {
                    token_fifo *f = &fifo[a][u];
                    if (f->t[f->head] == best_start && best_start > free_at[u])
                        last_src = a;
                    f->head++;
                }
            for (b = 0; b < DPU_NUM_UNITS; b++)
                if ((in->dpby >> b) & 1) {
                    token_fifo *f = &fifo[u][b];
                    f->t[f->tail++] = end; /* cannot overflow: cap = pushes counted in the static pass */
                    stats->tokens++;
                }
            count_insn(stats, in, u, best_start, free_at[u], last_src);
            if ((u == DPU_UNIT_CONV || u == DPU_UNIT_MISC) && !in->noop) {
                if (best_start < cstart)
                    cstart = best_start;
                if (end > cend)
                    cend = end;
            }
            if (n_ranges) {
                uint64_t r = range_of(range_end, n_ranges, in->index);
                if ((u == DPU_UNIT_CONV || u == DPU_UNIT_MISC) && !in->noop) {
                    if (best_start < range_cs[r])
                        range_cs[r] = best_start;
                    if (end > range_ce[r])
                        range_ce[r] = end;
                    if (u == DPU_UNIT_CONV && end > range_conv_end[r])
                        range_conv_end[r] = end;
                }
                count_insn(&range_stats[r], in, u, best_start, free_at[u], last_src);
                for (b = 0; b < DPU_NUM_UNITS; b++)
                    if ((in->dpby >> b) & 1)
                        range_stats[r].tokens++;
                if (end > range_done[r])
                    range_done[r] = end;
            }
            free_at[u] = end;
            if (end > end_max)
                end_max = end;
            stats->cycles = end_max;
            if (trace.f) {
                char args[192], on[32], by[32];
                mask_text(in->dpon, on, sizeof(on));
                mask_text(in->dpby, by, sizeof(by));
                if (in->kind == K_CONV && !in->noop)
                    snprintf(args, sizeof(args), "{\"insn\": %u, \"cycles\": %llu, \"dpon\": \"%s\", \"dpby\": \"%s\", "
                             "\"macs\": %llu}", in->index, (ull)in->dur, on, by, (ull)in->macs);
                else
                    snprintf(args, sizeof(args), "{\"insn\": %u, \"cycles\": %llu, \"dpon\": \"%s\", \"dpby\": \"%s\"}",
                             in->index, (ull)in->dur, on, by);
                accel_trace_complete(&trace, in->noop ? "NOP" : in->name, 0, u,
                                     trace_offset_us + (double)best_start / s.g.clock_mhz,
                                     (double)in->dur / s.g.clock_mhz, args);
            }
        }
        pc[u]++;
        if (pc[u] < count[u] &&
            (rc = load_insn(&s.g, insns, order[start_of[u] + pc[u]], ddr_bytes, &cur[u], &err)) != ACCEL_OK)
            goto done;
    }

    /* Every unit drained; the FIFOs must be empty too. */
    {
        char msg[768];
        size_t len = 0;
        msg[0] = '\0';
        for (a = 0; a < DPU_NUM_UNITS; a++)
            for (b = 0; b < DPU_NUM_UNITS; b++) {
                uint64_t left = fifo[a][b].tail - fifo[a][b].head;
                if (left) {
                    int w = snprintf(msg + len, sizeof(msg) - len, "%s%llu token%s left in FIFO %s->%s", len ? ", " : "",
                                     (ull)left, left == 1 ? "" : "s", UNIT_NAMES[a], UNIT_NAMES[b]);
                    if (w > 0)
                        len += (size_t)w;
                    if (len >= sizeof(msg))
                        len = sizeof(msg) - 1;
                }
            }
        if (len)
            rc = accel_fail(&err, ACCEL_ERR_PROTOCOL,
                            "unbalanced dependencies: %s (every DPBY push needs a DPON pop of the other unit)", msg);
        else
            rc = ACCEL_OK;
    }
    /* A range's cycles: from the completion of everything before it to the completion of its own last
     * instruction (marginal cycles: a range overlapping its predecessor's tail is charged only what it adds). */
    if (n_ranges) {
        /* Boundary b[r] between ranges r-1 and r: when range r's first CONV / MISC starts, but not before
         * b[r-1] nor before the last CONV of the earlier ranges ends; b[0] = 0, b[n] = the run's cycles.
         * A range is charged [b[r], b[r+1]): the LOADs it issued during its predecessor's tail are hidden
         * there, and its CONVs (in order on one unit) lie inside its window. */
        uint64_t b = 0, conv_end = 0;
        for (k = 0; k < n_ranges; k++) {
            uint64_t next = stats->cycles;
            if (range_conv_end[k] > conv_end)
                conv_end = range_conv_end[k];
            if (k + 1 < n_ranges) {
                next = range_cs[k + 1] == UINT64_MAX ? b : range_cs[k + 1];
                if (next < b)
                    next = b;
                if (next < conv_end)
                    next = conv_end;
                if (next > stats->cycles)
                    next = stats->cycles;
            }
            range_stats[k].cycles = next - b;
            if (range_cs[k] == UINT64_MAX) {
                range_stats[k].head_cycles = next - b;
            } else {
                range_stats[k].head_cycles = range_cs[k] > b ? (range_cs[k] < next ? range_cs[k] : next) - b : 0;
                range_stats[k].tail_cycles = range_ce[k] < next ? next - (range_ce[k] > b ? range_ce[k] : b) : 0;
            }
            b = next;
        }
    }
    stats->head_cycles = cstart == UINT64_MAX ? stats->cycles : cstart;
    stats->tail_cycles = cstart == UINT64_MAX ? 0 : stats->cycles - cend;

done:
    if (trace.f) {
        int trc = accel_trace_close(&trace, trace_path, &err);
        if (rc == ACCEL_OK)
            rc = trc;
    }
    free(order);
    free(range_done);
    free(range_cs);
    free(range_ce);
    free(range_conv_end);
    free(s.fm);
    free(s.pm);
    dpu_free_scratch(&s);
    for (a = 0; a < DPU_NUM_UNITS; a++)
        for (b = 0; b < DPU_NUM_UNITS; b++)
            free(fifo[a][b].t);
    return rc;
}
