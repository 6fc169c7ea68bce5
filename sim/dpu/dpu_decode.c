/* DPU configuration, instruction decoding (bit layouts) and the static checks of each
 * instruction, which also fill in its duration and traffic (model: dpu_sim.h). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/mem.h"
#include "common/stats.h"
#include "dpu/dpu_internal.h"

typedef long long ll;

const char *const DPU_UNIT_NAMES[DPU_NUM_UNITS] = {"LOAD", "SAVE", "CONV", "MISC"};
static const char *const REGION_NAMES[DPU_NUM_REGIONS] = {"INPUT", "OUTPUT", "PARAM", "INSN", "SWAP"};
static const char *const KIND_NAMES[NUM_KINDS] = {"LOAD", "SAVE", "CONV", "MAXPOOL", "AVGPOOL",
                                                  "ELTADD", "UPSAMPLE", "COPY", "ELTMUL", "END"};

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
    F(pad_left, 4, 0), F(pad_right, 4, 0), F(pad_value, 8, 1), F(param_addr, 23, 0), F(leaky, 1, 0),
    F(shift, 5, 0), F(clip_lo, 8, 1), F(clip_hi, 8, 1), F(depthwise, 1, 0), F(dilation, 4, 0)};
static const dpu_field POOL_F[] = {MISC_COMMON, POOL_FIELDS};
static const dpu_field ELT_F[] = {MISC_COMMON,       F(b_mem, 2, 0),   F(b_addr, 20, 0),
                                  F(b_pix_stride, 12, 0), F(b_row_stride, 20, 0), F(shift_a, 6, 1),
                                  F(shift_b, 6, 1),  F(shift, 5, 0),   F(clip_lo, 8, 1),
                                  F(clip_hi, 8, 1)};
static const dpu_field MUL_F[] = {MISC_COMMON,       F(b_mem, 2, 0),    F(b_addr, 20, 0), F(b_pix_stride, 12, 0),
                                  F(b_row_stride, 20, 0), F(shift, 5, 0), F(clip_lo, 8, 1), F(clip_hi, 8, 1)};
static const dpu_field UP_F[] = {MISC_COMMON, F(factor_h, 4, 0), F(factor_w, 4, 0)};
static const dpu_field COPY_F[] = {MISC_COMMON};
#undef F

#define NFIELDS(a) ((int)(sizeof(a) / sizeof((a)[0])))
static const dpu_field *const LAYOUT[NUM_KINDS] = {LOAD_F, SAVE_F, CONV_F, POOL_F, POOL_F,
                                                   ELT_F,  UP_F,   COPY_F, MUL_F,  NULL};
static const int LAYOUT_N[NUM_KINDS] = {NFIELDS(LOAD_F), NFIELDS(SAVE_F), NFIELDS(CONV_F),
                                        NFIELDS(POOL_F), NFIELDS(POOL_F), NFIELDS(ELT_F),
                                        NFIELDS(UP_F),   NFIELDS(COPY_F), NFIELDS(MUL_F), 0};

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
        if (op > MISC_ELTMUL)
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

int dpu_check_config(const dpu_sim_config *c, dpu_geom *g, accel_err *err)
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
    RANGE(c->pm_bytes, "PM_BYTES", 1024, 1 << 23)
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

/* Window of a CONV / pool: sets win_rows/cols and in_rows/cols. A kernel spans (kernel - 1) *
 * dilation + 1 rows / columns (pools have no dilation field: 1). */
static int check_window(const dpu_insn *in, dpu_insn *out, accel_err *err)
{
    const uint64_t d = in->kind == K_CONV ? (uint64_t)in->dilation : 1;
    if (d < 1)
        return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field dilation = 0, a dilation is at least 1", in->index,
                          in->name);
    if (in->kernel_h < 1 || in->kernel_w < 1)
        return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field %s = 0, a kernel is at least 1x1", in->index,
                          in->name, in->kernel_h < 1 ? "kernel_h" : "kernel_w");
    if (in->stride_h < 1 || in->stride_w < 1)
        return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field %s = 0, a stride is at least 1", in->index,
                          in->name, in->stride_h < 1 ? "stride_h" : "stride_w");
    out->win_rows = ((uint64_t)in->out_h - 1) * (uint64_t)in->stride_h + ((uint64_t)in->kernel_h - 1) * d + 1;
    out->win_cols = ((uint64_t)in->out_w - 1) * (uint64_t)in->stride_w + ((uint64_t)in->kernel_w - 1) * d + 1;
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
static uint64_t valid_taps(uint64_t n_out, uint64_t stride, uint64_t kernel, uint64_t dilation, uint64_t pad,
                           uint64_t n_in)
{
    uint64_t o, k, t = 0;
    for (o = 0; o < n_out; o++)
        for (k = 0; k < kernel; k++) {
            uint64_t r = o * stride + k * dilation;
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
    steps = mul3(accel_ceil_div(oh, g->row_par), ow, accel_ceil_div(oc, g->oc_par));
    steps = mul3(steps, in->depthwise ? 1 : accel_ceil_div(ic, g->ic_par), kh * kw);
    in->dur = accel_compute_cycles(steps, 1, g->lat[DPU_UNIT_CONV]);
    in->macs = mul3(valid_taps(oh, (uint64_t)in->stride_h, kh, (uint64_t)in->dilation, (uint64_t)in->pad_top,
                               in->in_rows),
                    valid_taps(ow, (uint64_t)in->stride_w, kw, (uint64_t)in->dilation, (uint64_t)in->pad_left,
                               in->in_cols),
                    oc * wic * n);
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
    case K_ELTMUL:
        /* B is only read: a stride of 0 repeats a pixel / row (a per-channel vector) */
        if ((rc = check_clip(in, err)) != ACCEL_OK)
            return rc;
        if ((rc = check_fm(g, in, "b_mem", in->b_mem, "b_addr", in->b_addr, "b_pix_stride", in->b_pix_stride,
                           "b_row_stride", in->b_row_stride, in->b_row_stride ? oh : 1, in->b_pix_stride ? ow : 1,
                           c, err)) != ACCEL_OK)
            return rc;
        in->in_rows = oh;
        in->in_cols = ow;
        reads = 2;
        break;
    case K_UPSAMPLE:
        if (in->factor_h < 1 || in->factor_w < 1)
            return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field %s = 0, an up-sampling factor is at least 1",
                              in->index, in->name, in->factor_h < 1 ? "factor_h" : "factor_w");
        in->in_rows = accel_ceil_div(oh, (uint64_t)in->factor_h);
        in->in_cols = accel_ceil_div(ow, (uint64_t)in->factor_w);
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
    in->dur = accel_compute_cycles(mul3(accel_ceil_div(oh, g->mrow_par), ow, accel_ceil_div(c, g->mch_par)), taps,
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
                              DPU_UNIT_NAMES[b]);
        else if (b == in->unit && ((in->dpby >> b) & 1))
            return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field DPBY lists %s itself", in->index, in->name,
                              DPU_UNIT_NAMES[b]);
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

int dpu_load_insn(const dpu_geom *g, const uint8_t *insns, uint64_t k, uint64_t ddr_bytes, dpu_insn *in,
                  accel_err *err)
{
    int rc = decode(insns + INSN_BYTES * k, (uint32_t)k, in, err);
    if (rc != ACCEL_OK)
        return rc;
    return check_insn(g, in, ddr_bytes, err);
}
