/* Internal types of the DPU simulator: decoded instructions, geometry, execution kernels. */
#ifndef ACCEL_DPU_INTERNAL_H
#define ACCEL_DPU_INTERNAL_H

#include <stdint.h>

#include "common/mem.h"
#include "common/status.h"
#include "dpu/dpu_sim.h"

typedef unsigned long long ull;

#define INSN_BYTES 32

enum { OP_LOAD = 1, OP_SAVE = 2, OP_CONV = 3, OP_MISC = 4, OP_END = 15 };
enum { MISC_MAXPOOL = 0, MISC_AVGPOOL = 1, MISC_ELTADD = 2, MISC_UPSAMPLE = 3, MISC_COPY = 4, MISC_ELTMUL = 5 };
/* instruction kinds (one bit layout each) */
/* K_MAXPOOL + op for every MISC op, in MISC op order */
enum { K_LOAD, K_SAVE, K_CONV, K_MAXPOOL, K_AVGPOOL, K_ELTADD, K_UPSAMPLE, K_COPY, K_ELTMUL, K_END, NUM_KINDS };

typedef struct {
    uint32_t n_pe, n_mem;
    uint64_t mem_bytes;  /* one FM memory (circular) */
    uint64_t bank_bytes;
    uint64_t pm_bytes;   /* circular */
    uint64_t ic_par, oc_par, row_par, mch_par, mrow_par;
    uint64_t fmt_max_ch, fmt_max_f;
    uint64_t lat[DPU_NUM_UNITS];
    double bpc, clock_mhz;
    uint64_t region_base[DPU_NUM_REGIONS], region_size[DPU_NUM_REGIONS];
    uint64_t max_cycles;
} dpu_geom;

/* A decoded instruction: every field of every layout (the python names), then derived values
 * filled in by the checker for the executor and the statistics. */
typedef struct {
    int64_t opcode, dpon, dpby, op;
    int64_t to_pm, fm_mem, dst_addr, src_addr, region, ddr_offset, rows, cols, chans;
    int64_t ddr_pix_stride, ddr_row_stride, fm_pix_stride, fm_row_stride;
    int64_t pad_top, pad_bottom, pad_left, pad_right, pad_value, img_stride, fmt;
    int64_t in_mem, in_addr, in_pix_stride, in_row_stride, ic;
    int64_t out_mem, out_addr, out_pix_stride, out_row_stride, out_h, out_w, oc;
    int64_t kernel_h, kernel_w, stride_h, stride_w, param_addr, shift, mult, clip_lo, clip_hi, depthwise, dilation, leaky;
    int64_t b_mem, b_addr, b_pix_stride, b_row_stride, shift_a, shift_b, factor_h, factor_w;
    /* --- derived --- */
    uint32_t index;
    int kind, unit, noop;
    const char *name; /* event name: "LOAD FM", "CONV", "MAXPOOL", "NOP", ... */
    uint64_t in_rows, in_cols;   /* real input extent (CONV / MISC) */
    uint64_t win_rows, win_cols; /* padded window (CONV / pools) or padded block (LOAD) */
    uint64_t pix_bytes;          /* bytes of a written pixel (LOAD with the format unit) */
    uint64_t dur;
    uint64_t macs, padded_macs, ddr_rd, ddr_wr, fm_rd, fm_wr, pm_rd, pm_wr;
} dpu_insn;

typedef struct {
    dpu_geom g;
    uint8_t *fm; /* n_pe x n_mem x mem_bytes */
    uint8_t *pm;
    uint8_t *ddr;
    uint64_t ddr_bytes;
    void *scratch[6];
    uint64_t scratch_cap[6];
} dpu_state;

/* Fix-point helpers of the CONV kernels (dpu_exec.c, dpu_conv_simd.c). */
static inline int64_t dpu_asr64(int64_t x, unsigned s) { return x >= 0 ? x >> s : -(((-x) - 1) >> s) - 1; }

static inline uint8_t dpu_clip8(int64_t v, int64_t lo, int64_t hi)
{
    const int64_t c = v < lo ? lo : (v > hi ? hi : v);
    return (uint8_t)(int8_t)c;
}

/* clip(((int32)acc + bias + round) >> shift) */
static inline uint8_t dpu_requant(uint32_t acc, int32_t bias, unsigned shift, int64_t lo, int64_t hi)
{
    const int64_t rnd = shift ? ((int64_t)1 << (shift - 1)) : 0;
    return dpu_clip8(dpu_asr64((int64_t)accel_as_i32(acc) + bias + rnd, shift), lo, hi);
}

/* dpu_conv_simd.c (x86-64 with GCC / Clang): the dense CONV with the output channels in AVX2
 * lanes; Wp holds dpu_conv_pairs_len(in) int32 (built from W when `prepare`), A
 * dpu_conv_sums_len(in) int32 sums, and X two int16 past the window (read against zero weights
 * when a segment is odd). 1 when a stop was requested. */
uint64_t dpu_conv_pairs_len(const dpu_insn *in);
uint64_t dpu_conv_sums_len(const dpu_insn *in);
int dpu_conv_dense_avx2(const dpu_insn *in, const int16_t *X, const int16_t *W, const int32_t *bias, uint8_t *out,
                        int32_t *Wp, int32_t *A, int prepare);
/* the same on AVX-512 VNNI (when accel_use_vnni()) */
int dpu_conv_dense_vnni(const dpu_insn *in, const int16_t *X, const int16_t *W, const int32_t *bias, uint8_t *out,
                        int32_t *Wp, int32_t *A, int prepare);

extern const char *const DPU_UNIT_NAMES[DPU_NUM_UNITS];

/* dpu_decode.c */
int dpu_check_config(const dpu_sim_config *c, dpu_geom *g, accel_err *err);
/* Decodes and checks instruction k of the stream, filling its derived values. */
int dpu_load_insn(const dpu_geom *g, const uint8_t *insns, uint64_t k, uint64_t ddr_bytes, dpu_insn *in,
                  accel_err *err);

/* dpu_exec.c: executes a checked instruction; fails only when host memory runs out, or returns
 * ACCEL_ERR_INTERRUPTED (no message recorded) when a stop was requested. */
int dpu_exec(dpu_state *s, const dpu_insn *in, accel_err *err);
void dpu_free_scratch(dpu_state *s);

#endif
