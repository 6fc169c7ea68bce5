/* VTA functional + timed simulator; see vta_sim.h for the model. */
#include "vta/vta_sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/stats.h"
#include "common/trace.h"

#if defined(__GNUC__)
#define VTA_INLINE static inline __attribute__((always_inline))
#else
#define VTA_INLINE static inline
#endif

typedef unsigned long long ull;

enum { OP_LOAD = 0, OP_STORE = 1, OP_GEMM = 2, OP_FINISH = 3, OP_ALU = 4 };
enum { MEM_UOP = 0, MEM_WGT = 1, MEM_INP = 2, MEM_ACC = 3, MEM_OUT = 4, MEM_ACC8 = 5 };
enum { ALU_MIN = 0, ALU_MAX = 1, ALU_ADD = 2, ALU_SHR = 3, ALU_MUL = 4 };
enum { Q_L2G = 0, Q_G2L = 1, Q_G2S = 2, Q_S2G = 3, NUM_Q = 4 };

#define LOOP_ITER_BITS 14
#define IMM_BITS 16

static const char *const Q_NAMES[NUM_Q] = {"L2G", "G2L", "G2S", "S2G"};
static const char *const MOD_NAMES[3] = {"load", "compute", "store"};
static const char *const MEM_NAMES[6] = {"UOP", "WGT", "INP", "ACC", "OUT", "ACC8"};

/* ------------------------------------------------------------------------------------------ */
/* Configuration                                                                              */

typedef struct {
    uint32_t batch, block_in, block_out;
    unsigned U, A, I, W; /* log2 of the UOP, ACC, INP, WGT depths (ISA field widths) */
    uint64_t uop_depth, inp_depth, wgt_depth, acc_depth;
    uint32_t inp_entry; /* bytes of an INP entry (batch x block_in int8) */
    uint32_t wgt_entry; /* bytes of a WGT entry (block_out x block_in int8) */
    uint32_t acc_lanes; /* int32 lanes of an ACC entry (batch x block_out) */
    uint32_t out_entry; /* bytes of an OUT / ACC_8BIT DRAM entry (batch x block_out int8) */
    double bytes_per_cycle, clock_mhz;
    uint64_t dram_latency, gemm_cpu, alu_cpu, pipe_latency, max_cycles;
} vta_geom;

static int check_config(const vta_sim_config *c, vta_geom *g, accel_err *err)
{
    const char *names[4] = {"LOG_UOP_BUFF_SIZE", "LOG_INP_BUFF_SIZE", "LOG_WGT_BUFF_SIZE",
                            "LOG_ACC_BUFF_SIZE"};
    int64_t logs[4];
    int64_t lb = c->log_batch, li = c->log_block_in, lo = c->log_block_out;
    int k;
    if (lb < 0 || lb > 6)
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field LOG_BATCH: %lld is outside 0..6", (long long)lb);
    if (li < 0 || li > 6)
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field LOG_BLOCK_IN: %lld is outside 0..6", (long long)li);
    if (lo < 0 || lo > 6)
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field LOG_BLOCK_OUT: %lld is outside 0..6", (long long)lo);
    if (li != lo)
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field LOG_BLOCK_OUT: must equal LOG_BLOCK_IN");
    g->batch = 1u << lb;
    g->block_in = 1u << li;
    g->block_out = 1u << lo;
    if (g->block_in * g->block_out > 4096 || g->batch * g->block_out * 4 > 4096)
        return accel_fail(err, ACCEL_ERR_CONFIG,
                          "config: field LOG_BLOCK_IN: a WGT or ACC entry would exceed the 4 KiB DMA page");
    logs[0] = (int64_t)c->log_uop_buff_size - 2;
    logs[1] = (int64_t)c->log_inp_buff_size - lb - li;
    logs[2] = (int64_t)c->log_wgt_buff_size - lo - li;
    logs[3] = (int64_t)c->log_acc_buff_size - lb - lo - 2;
    for (k = 0; k < 4; k++) {
        if (logs[k] < 4)
            return accel_fail(err, ACCEL_ERR_CONFIG,
                              "config: field %s: buffer holds fewer than 16 entries", names[k]);
        if (logs[k] > 16)
            return accel_fail(err, ACCEL_ERR_CONFIG,
                              "config: field %s: buffer depth exceeds the 16-bit sram_base field", names[k]);
    }
    g->U = (unsigned)logs[0];
    g->I = (unsigned)logs[1];
    g->W = (unsigned)logs[2];
    g->A = (unsigned)logs[3];
    if (8 + 2 * g->U + 1 + 2 * LOOP_ITER_BITS > 64)
        return accel_fail(err, ACCEL_ERR_CONFIG,
                          "config: field LOG_UOP_BUFF_SIZE: uop_bgn/uop_end/iter fields would not fit in 64 bits");
    if (g->A + g->I + g->W > 32)
        return accel_fail(err, ACCEL_ERR_CONFIG,
                          "config: field LOG_*_BUFF_SIZE: a micro-op (acc+inp+wgt index bits) would exceed 32 bits");
    if (2 * (g->A + g->I + g->W) > 64)
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field LOG_*_BUFF_SIZE: GEMM factor fields would exceed 64 bits");
    if (2 * (g->A + g->I) + 20 > 64)
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field LOG_*_BUFF_SIZE: ALU factor fields would exceed 64 bits");
    if (!(isfinite(c->clock_mhz) && c->clock_mhz > 0))
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field CLOCK_MHZ: must be positive");
    if (!(isfinite(c->dram_bytes_per_cycle) && c->dram_bytes_per_cycle > 0))
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field DRAM_BYTES_PER_CYCLE: must be positive");
    if (c->dram_latency_cycles < 0)
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field DRAM_LATENCY_CYCLES: must be >= 0");
    if (c->pipeline_latency_cycles < 0)
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field PIPELINE_LATENCY_CYCLES: must be >= 0");
    if (c->gemm_cycles_per_uop < 1)
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field GEMM_CYCLES_PER_UOP: must be >= 1");
    if (c->alu_cycles_per_uop < 1)
        return accel_fail(err, ACCEL_ERR_CONFIG, "config: field ALU_CYCLES_PER_UOP: must be >= 1");
    g->uop_depth = UINT64_C(1) << g->U;
    g->inp_depth = UINT64_C(1) << g->I;
    g->wgt_depth = UINT64_C(1) << g->W;
    g->acc_depth = UINT64_C(1) << g->A;
    g->inp_entry = g->batch * g->block_in;
    g->wgt_entry = g->block_out * g->block_in;
    g->acc_lanes = g->batch * g->block_out;
    g->out_entry = g->batch * g->block_out;
    g->bytes_per_cycle = c->dram_bytes_per_cycle;
    g->clock_mhz = c->clock_mhz;
    g->dram_latency = (uint64_t)c->dram_latency_cycles;
    g->gemm_cpu = (uint64_t)c->gemm_cycles_per_uop;
    g->alu_cpu = (uint64_t)c->alu_cycles_per_uop;
    g->pipe_latency = (uint64_t)c->pipeline_latency_cycles;
    g->max_cycles = c->max_cycles == 0 ? ACCEL_DEFAULT_MAX_CYCLES : c->max_cycles;
    if (g->max_cycles > ACCEL_MAX_MAX_CYCLES)
        g->max_cycles = ACCEL_MAX_MAX_CYCLES;
    return ACCEL_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Decoding                                                                                   */

typedef struct {
    uint32_t index;
    unsigned opcode, module;
    unsigned pop_prev, pop_next, push_prev, push_next;
    /* LOAD / STORE */
    unsigned mem_type;
    uint64_t sram_base, dram_base, y_size, x_size, x_stride, y_pad0, y_pad1, x_pad0, x_pad1;
    /* GEMM / ALU */
    unsigned reset, alu_op, use_imm;
    int32_t imm;
    uint64_t uop_bgn, uop_end, iter_out, iter_in, dfo, dfi, sfo, sfi, wfo, wfi;
    const char *name; /* "LOAD INP", "GEMM", "ALU MUL", "STORE", ... (static string) */
} vta_insn;

static const char *const LOAD_NAMES[8] = {"LOAD UOP", "LOAD WGT", "LOAD INP", "LOAD ACC",
                                          "LOAD OUT", "LOAD ACC8", "LOAD ?6", "LOAD ?7"};
static const char *const STORE_NAMES[8] = {"STORE UOP", "STORE WGT", "STORE INP", "STORE ACC",
                                           "STORE", "STORE ACC8", "STORE ?6", "STORE ?7"};
static const char *const ALU_INSN_NAMES[8] = {"ALU MIN", "ALU MAX", "ALU ADD", "ALU SHR",
                                              "ALU MUL", "ALU ?5", "ALU ?6", "ALU ?7"};
static const char *const OP_NAMES[8] = {"LOAD", "STORE", "GEMM", "FINISH", "ALU", "?5", "?6", "?7"};

static void decode(const vta_geom *g, const uint8_t *p, uint32_t index, vta_insn *in)
{
    uint64_t w0 = accel_ld_u64le(p), w1 = accel_ld_u64le(p + 8);
    unsigned U = g->U, A = g->A, I = g->I, W = g->W, lo;
    memset(in, 0, sizeof(*in));
    in->index = index;
    in->opcode = (unsigned)accel_bits(w0, 0, 3);
    in->pop_prev = (unsigned)accel_bits(w0, 3, 1);
    in->pop_next = (unsigned)accel_bits(w0, 4, 1);
    in->push_prev = (unsigned)accel_bits(w0, 5, 1);
    in->push_next = (unsigned)accel_bits(w0, 6, 1);
    switch (in->opcode) {
    case OP_LOAD:
    case OP_STORE:
        in->mem_type = (unsigned)accel_bits(w0, 7, 3);
        in->sram_base = accel_bits(w0, 10, 16);
        in->dram_base = accel_bits(w0, 26, 32);
        in->y_size = accel_bits(w1, 0, 16);
        in->x_size = accel_bits(w1, 16, 16);
        in->x_stride = accel_bits(w1, 32, 16);
        in->y_pad0 = accel_bits(w1, 48, 4);
        in->y_pad1 = accel_bits(w1, 52, 4);
        in->x_pad0 = accel_bits(w1, 56, 4);
        in->x_pad1 = accel_bits(w1, 60, 4);
        in->name = (in->opcode == OP_LOAD ? LOAD_NAMES : STORE_NAMES)[in->mem_type];
        break;
    case OP_GEMM:
    case OP_ALU:
        in->reset = (unsigned)accel_bits(w0, 7, 1);
        in->uop_bgn = accel_bits(w0, 8, U);
        in->uop_end = accel_bits(w0, 8 + U, U + 1);
        in->iter_out = accel_bits(w0, 9 + 2 * U, LOOP_ITER_BITS);
        in->iter_in = accel_bits(w0, 9 + 2 * U + LOOP_ITER_BITS, LOOP_ITER_BITS);
        in->dfo = accel_bits(w1, 0, A);
        in->dfi = accel_bits(w1, A, A);
        in->sfo = accel_bits(w1, 2 * A, I);
        in->sfi = accel_bits(w1, 2 * A + I, I);
        lo = 2 * A + 2 * I;
        if (in->opcode == OP_GEMM) {
            in->wfo = accel_bits(w1, lo, W);
            in->wfi = accel_bits(w1, lo + W, W);
            in->name = "GEMM";
        } else {
            uint32_t imm = (uint32_t)accel_bits(w1, lo + 4, IMM_BITS);
            in->alu_op = (unsigned)accel_bits(w1, lo, 3);
            in->use_imm = (unsigned)accel_bits(w1, lo + 3, 1);
            in->imm = imm >= 0x8000u ? (int32_t)imm - 0x10000 : (int32_t)imm;
            in->name = ALU_INSN_NAMES[in->alu_op];
        }
        break;
    default:
        in->name = OP_NAMES[in->opcode];
        break;
    }
}

/* Routing and every check that depends on the instruction alone (not on SRAM contents). */
static int check_static(const vta_insn *in, accel_err *err)
{
    unsigned i = in->index;
    switch (in->opcode) {
    case OP_LOAD:
        if (in->mem_type > MEM_ACC8)
            return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): unknown memory_type %u", i, in->name,
                              in->mem_type);
        if (in->mem_type == MEM_OUT)
            return accel_fail(err, ACCEL_ERR_DECODE,
                              "insn %u (%s): memory_type 4 (OUT) cannot be loaded", i, in->name);
        break;
    case OP_STORE:
        if (in->mem_type != MEM_OUT)
            return accel_fail(err, ACCEL_ERR_DECODE,
                              "insn %u (%s): memory_type %u (%s) cannot be stored, STORE takes OUT (4)", i,
                              in->name, in->mem_type, in->mem_type < 6 ? MEM_NAMES[in->mem_type] : "unknown");
        if (in->y_pad0 || in->y_pad1 || in->x_pad0 || in->x_pad1) {
            const char *f = in->y_pad0 ? "y_pad_0" : in->y_pad1 ? "y_pad_1" : in->x_pad0 ? "x_pad_0" : "x_pad_1";
            uint64_t v = in->y_pad0 ? in->y_pad0 : in->y_pad1 ? in->y_pad1 : in->x_pad0 ? in->x_pad0 : in->x_pad1;
            return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field %s = %llu, STORE takes no padding", i,
                              in->name, f, (ull)v);
        }
        break;
    case OP_GEMM:
        break;
    case OP_ALU:
        if (in->alu_op > ALU_MUL)
            return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): unknown alu_opcode %u", i, in->name,
                              in->alu_op);
        break;
    case OP_FINISH:
        if (in->pop_prev || in->pop_next)
            return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (FINISH): field %s is set, FINISH must not pop", i,
                              in->pop_prev ? "pop_prev" : "pop_next");
        break;
    default:
        return accel_fail(err, ACCEL_ERR_DECODE, "insn %u: unknown opcode %u", i, in->opcode);
    }
    if (in->module == VTA_MOD_LOAD && (in->pop_prev || in->push_prev))
        return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field %s is set, the load module has no previous module",
                          i, in->name, in->pop_prev ? "pop_prev" : "push_prev");
    if (in->module == VTA_MOD_STORE && (in->pop_next || in->push_next))
        return accel_fail(err, ACCEL_ERR_DECODE, "insn %u (%s): field %s is set, the store module has no next module",
                          i, in->name, in->pop_next ? "pop_next" : "push_next");
    return ACCEL_OK;
}

static unsigned route(const vta_insn *in)
{
    if (in->opcode == OP_STORE)
        return VTA_MOD_STORE;
    if (in->opcode == OP_LOAD && (in->mem_type == MEM_INP || in->mem_type == MEM_WGT))
        return VTA_MOD_LOAD;
    return VTA_MOD_COMPUTE;
}

/* Token queues popped / pushed by an instruction of its module; returns the count (<= 2). */
static int pops_of(const vta_insn *in, int q[2])
{
    int n = 0;
    switch (in->module) {
    case VTA_MOD_LOAD:
        if (in->pop_next) q[n++] = Q_G2L;
        break;
    case VTA_MOD_COMPUTE:
        if (in->pop_prev) q[n++] = Q_L2G;
        if (in->pop_next) q[n++] = Q_S2G;
        break;
    default:
        if (in->pop_prev) q[n++] = Q_G2S;
        break;
    }
    return n;
}

static int pushes_of(const vta_insn *in, int q[2])
{
    int n = 0;
    switch (in->module) {
    case VTA_MOD_LOAD:
        if (in->push_next) q[n++] = Q_L2G;
        break;
    case VTA_MOD_COMPUTE:
        if (in->push_prev) q[n++] = Q_G2L;
        if (in->push_next) q[n++] = Q_G2S;
        break;
    default:
        if (in->push_prev) q[n++] = Q_S2G;
        break;
    }
    return n;
}

/* ------------------------------------------------------------------------------------------ */
/* Machine state                                                                              */

typedef struct {
    vta_geom g;
    uint32_t *uop;  /* uop_depth words */
    int8_t *inp;    /* inp_depth x inp_entry */
    int8_t *wgt;    /* wgt_depth x wgt_entry, [out][in] */
    uint32_t *acc;  /* acc_depth x acc_lanes, int32 two's complement */
    uint32_t *ud, *us, *uw; /* scratch: uop fields of the current instruction, pre-multiplied */
    uint8_t *dram;
    uint64_t dram_bytes;
    vta_sim_stats *st;
    accel_err *err;
} vta_state;

/* ------------------------------------------------------------------------------------------ */
/* LOAD / STORE                                                                               */

static uint64_t dram_entry_bytes(const vta_geom *g, unsigned mem_type)
{
    switch (mem_type) {
    case MEM_UOP: return 4;
    case MEM_WGT: return g->wgt_entry;
    case MEM_INP: return g->inp_entry;
    case MEM_ACC: return (uint64_t)g->acc_lanes * 4;
    default: return g->out_entry; /* OUT, ACC_8BIT */
    }
}

/* DRAM byte range of a 2-D transfer; checks it against the DRAM size. */
static int check_dram(vta_state *s, const vta_insn *in, uint64_t ebytes, uint64_t *bytes_moved)
{
    uint64_t first, end;
    *bytes_moved = in->y_size * in->x_size * ebytes;
    if (in->y_size == 0)
        return ACCEL_OK;
    first = in->dram_base * ebytes;
    end = (in->dram_base + (in->y_size - 1) * in->x_stride + in->x_size) * ebytes;
    if (end > s->dram_bytes)
        return accel_fail(s->err, ACCEL_ERR_BOUNDS,
                          "insn %u (%s): DRAM range [%llu, %llu) exceeds DRAM size %llu (dram_base %llu, "
                          "y_size %llu, x_size %llu, x_stride %llu, entry %llu bytes)",
                          in->index, in->name, (ull)first, (ull)end, (ull)s->dram_bytes, (ull)in->dram_base,
                          (ull)in->y_size, (ull)in->x_size, (ull)in->x_stride, (ull)ebytes);
    return ACCEL_OK;
}

static int check_load(vta_state *s, const vta_insn *in, uint64_t *bytes_moved)
{
    const vta_geom *g = &s->g;
    uint64_t depth, rows, cols, extent;
    const char *buf;
    *bytes_moved = 0;
    if (in->x_size == 0)
        return ACCEL_OK;
    switch (in->mem_type) {
    case MEM_UOP: depth = g->uop_depth; buf = "UOP"; break;
    case MEM_WGT: depth = g->wgt_depth; buf = "WGT"; break;
    case MEM_INP: depth = g->inp_depth; buf = "INP"; break;
    default: depth = g->acc_depth; buf = "ACC"; break;
    }
    rows = in->y_pad0 + in->y_size + in->y_pad1;
    cols = in->x_pad0 + in->x_size + in->x_pad1;
    extent = rows * cols;
    if (!accel_range_ok(in->sram_base, extent, depth))
        return accel_fail(s->err, ACCEL_ERR_BOUNDS,
                          "insn %u (%s): SRAM block [%llu, %llu) exceeds %s depth %llu (sram_base %llu + "
                          "%llu rows x %llu entries incl. padding)",
                          in->index, in->name, (ull)in->sram_base, (ull)(in->sram_base + extent), buf,
                          (ull)depth, (ull)in->sram_base, (ull)rows, (ull)cols);
    return check_dram(s, in, dram_entry_bytes(g, in->mem_type), bytes_moved);
}

/* Copies n entries of DRAM into SRAM entry index dst of the LOAD's memory type. */
static void load_entries(vta_state *s, unsigned mem_type, uint64_t dst, const uint8_t *src, uint64_t n)
{
    const vta_geom *g = &s->g;
    uint64_t k, lanes = g->acc_lanes;
    switch (mem_type) {
    case MEM_UOP:
        for (k = 0; k < n; k++)
            s->uop[dst + k] = accel_ld_u32le(src + 4 * k);
        break;
    case MEM_WGT:
        memcpy(s->wgt + dst * g->wgt_entry, src, (size_t)(n * g->wgt_entry));
        break;
    case MEM_INP:
        memcpy(s->inp + dst * g->inp_entry, src, (size_t)(n * g->inp_entry));
        break;
    case MEM_ACC: {
        uint32_t *a = s->acc + dst * lanes;
        for (k = 0; k < n * lanes; k++)
            a[k] = accel_ld_u32le(src + 4 * k);
        break;
    }
    default: { /* ACC_8BIT: sign-extend */
        uint32_t *a = s->acc + dst * lanes;
        for (k = 0; k < n * lanes; k++)
            a[k] = src[k] >= 0x80u ? (uint32_t)src[k] | 0xFFFFFF00u : (uint32_t)src[k];
        break;
    }
    }
}

static void zero_entries(vta_state *s, unsigned mem_type, uint64_t dst, uint64_t n)
{
    const vta_geom *g = &s->g;
    if (n == 0)
        return;
    switch (mem_type) {
    case MEM_UOP: memset(s->uop + dst, 0, (size_t)(n * 4)); break;
    case MEM_WGT: memset(s->wgt + dst * g->wgt_entry, 0, (size_t)(n * g->wgt_entry)); break;
    case MEM_INP: memset(s->inp + dst * g->inp_entry, 0, (size_t)(n * g->inp_entry)); break;
    default: memset(s->acc + dst * g->acc_lanes, 0, (size_t)(n * g->acc_lanes * 4)); break;
    }
}

/* Executes a LOAD already validated by check_load; returns 1 when a stop was requested. */
static int exec_load(vta_state *s, const vta_insn *in)
{
    uint64_t ebytes = dram_entry_bytes(&s->g, in->mem_type);
    uint64_t cols = in->x_pad0 + in->x_size + in->x_pad1, r, dst = in->sram_base;
    if (in->x_size == 0)
        return 0;
    zero_entries(s, in->mem_type, dst, in->y_pad0 * cols);
    dst += in->y_pad0 * cols;
    for (r = 0; r < in->y_size; r++) {
        const uint8_t *src = s->dram + (in->dram_base + r * in->x_stride) * ebytes;
        if (accel_should_stop())
            return 1;
        zero_entries(s, in->mem_type, dst, in->x_pad0);
        load_entries(s, in->mem_type, dst + in->x_pad0, src, in->x_size);
        zero_entries(s, in->mem_type, dst + in->x_pad0 + in->x_size, in->x_pad1);
        dst += cols;
    }
    zero_entries(s, in->mem_type, dst, in->y_pad1 * cols);
    return 0;
}

static int check_store(vta_state *s, const vta_insn *in, uint64_t *bytes_moved)
{
    uint64_t extent = in->y_size * in->x_size;
    *bytes_moved = 0;
    if (in->x_size == 0)
        return ACCEL_OK;
    if (!accel_range_ok(in->sram_base, extent, s->g.acc_depth))
        return accel_fail(s->err, ACCEL_ERR_BOUNDS,
                          "insn %u (%s): SRAM range [%llu, %llu) exceeds OUT/ACC depth %llu (sram_base %llu + "
                          "y_size %llu x x_size %llu)",
                          in->index, in->name, (ull)in->sram_base, (ull)(in->sram_base + extent),
                          (ull)s->g.acc_depth, (ull)in->sram_base, (ull)in->y_size, (ull)in->x_size);
    return check_dram(s, in, s->g.out_entry, bytes_moved);
}

/* Returns 1 when a stop was requested. */
static int exec_store(vta_state *s, const vta_insn *in)
{
    const uint64_t lanes = s->g.acc_lanes, e = s->g.out_entry;
    uint64_t r, k;
    if (in->x_size == 0)
        return 0;
    for (r = 0; r < in->y_size; r++) {
        const uint32_t *src = s->acc + (in->sram_base + r * in->x_size) * lanes;
        uint8_t *dst = s->dram + (in->dram_base + r * in->x_stride) * e;
        if (accel_should_stop())
            return 1;
        for (k = 0; k < in->x_size * lanes; k++)
            dst[k] = (uint8_t)(src[k] & 0xFFu);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* GEMM / ALU                                                                                 */

static uint64_t n_uops(const vta_insn *in)
{
    return in->uop_end > in->uop_bgn ? in->uop_end - in->uop_bgn : 0;
}

static int check_index(vta_state *s, const vta_insn *in, const char *what, const char *buf, uint64_t depth,
                       uint64_t uop, uint64_t idx, uint64_t fo, uint64_t fi)
{
    uint64_t v = idx + (in->iter_out - 1) * fo + (in->iter_in - 1) * fi;
    if (v < depth)
        return ACCEL_OK;
    return accel_fail(s->err, ACCEL_ERR_BOUNDS,
                      "insn %u (%s): %s index %llu exceeds %s depth %llu (uop %llu %s_idx %llu + "
                      "%s_factor_out %llu x %llu + %s_factor_in %llu x %llu)",
                      in->index, in->name, what, (ull)v, buf, (ull)depth, (ull)uop, what, (ull)idx, what,
                      (ull)fo, (ull)(in->iter_out - 1), what, (ull)fi, (ull)(in->iter_in - 1));
}

/* Checks the uop range and the extreme dst/src/wgt indices of a GEMM or ALU, and decodes the uop
 * fields into the scratch arrays pre-multiplied by the entry sizes. */
static int check_compute(vta_state *s, const vta_insn *in)
{
    const vta_geom *g = &s->g;
    const int gemm = in->opcode == OP_GEMM;
    const int need_src = !in->reset && !(in->opcode == OP_ALU && in->use_imm);
    const int need_wgt = gemm && !in->reset;
    uint64_t nu = n_uops(in), u, amax[3] = {0, 0, 0}, umax[3] = {0, 0, 0};
    uint32_t src_mul = gemm ? g->inp_entry : g->acc_lanes;
    int rc;
    if (in->uop_end > g->uop_depth)
        return accel_fail(s->err, ACCEL_ERR_BOUNDS, "insn %u (%s): uop_end %llu exceeds UOP depth %llu", in->index,
                          in->name, (ull)in->uop_end, (ull)g->uop_depth);
    if (nu == 0 || in->iter_out == 0 || in->iter_in == 0)
        return ACCEL_OK;
    for (u = 0; u < nu; u++) {
        uint32_t w = s->uop[in->uop_bgn + u];
        uint32_t d = (uint32_t)accel_bits(w, 0, g->A);
        uint32_t sr = (uint32_t)accel_bits(w, g->A, g->I);
        uint32_t wg = (uint32_t)accel_bits(w, g->A + g->I, g->W);
        if (d >= amax[0]) { amax[0] = d; umax[0] = in->uop_bgn + u; }
        if (sr >= amax[1]) { amax[1] = sr; umax[1] = in->uop_bgn + u; }
        if (wg >= amax[2]) { amax[2] = wg; umax[2] = in->uop_bgn + u; }
        s->ud[u] = d * g->acc_lanes;
        s->us[u] = sr * src_mul;
        s->uw[u] = wg * g->wgt_entry;
    }
    rc = check_index(s, in, "dst", "ACC", g->acc_depth, umax[0], amax[0], in->dfo, in->dfi);
    if (rc == ACCEL_OK && need_src)
        rc = check_index(s, in, "src", gemm ? "INP" : "ACC", gemm ? g->inp_depth : g->acc_depth, umax[1], amax[1],
                         in->sfo, in->sfi);
    if (rc == ACCEL_OK && need_wgt)
        rc = check_index(s, in, "wgt", "WGT", g->wgt_depth, umax[2], amax[2], in->wfo, in->wfi);
    return rc;
}

typedef struct {
    uint32_t *acc;
    const int8_t *inp, *wgt;
    const uint32_t *ud, *us, *uw;
    uint64_t nu, iter_out, iter_in;
    uint64_t dfo, dfi, sfo, sfi, wfo, wfi; /* pre-multiplied by entry sizes */
} gemm_args;

/* acc[b][o] += sum_k inp[b][k] * wgt[o][k] for one uop iteration. The dot product cannot
 * overflow int32 (block_in <= 64, |product| <= 2^14); accumulation into ACC wraps in uint32.
 * Inlined with constant shapes by the specialisations below so the loops are unrolled and
 * vectorised. */
VTA_INLINE void gemm_uop(uint32_t *restrict acc, const int8_t *restrict x, const int8_t *restrict w,
                         const int batch, const int bin, const int bout, const int oc_outer)
{
    int b, oc, k;
    if (oc_outer) { /* better for SSE2 code when batch > 1 */
        for (oc = 0; oc < bout; oc++)
            for (b = 0; b < batch; b++) {
                int32_t sum = 0;
                for (k = 0; k < bin; k++)
                    sum += (int16_t)x[b * bin + k] * (int16_t)w[oc * bin + k];
                acc[b * bout + oc] += (uint32_t)sum;
            }
        return;
    }
    for (b = 0; b < batch; b++)
        for (oc = 0; oc < bout; oc++) {
            int32_t sum = 0;
            for (k = 0; k < bin; k++)
                sum += (int16_t)x[b * bin + k] * (int16_t)w[oc * bin + k];
            acc[b * bout + oc] += (uint32_t)sum;
        }
}

/* Returns 1 when a stop was requested (polled every ACCEL_STOP_POLL micro-ops and at least once
 * per (outer, inner) iteration). */
VTA_INLINE int gemm_loops(const gemm_args *a, const int batch, const int bin, const int bout,
                          const int oc_outer)
{
    uint32_t *const accb = a->acc;
    const int8_t *const inpb = a->inp, *const wgtb = a->wgt;
    const uint32_t *const ud = a->ud, *const us = a->us, *const uw = a->uw;
    const size_t nu = (size_t)a->nu;
    uint64_t o, i;
    size_t u, u0, u1;
    for (o = 0; o < a->iter_out; o++) {
        for (i = 0; i < a->iter_in; i++) {
            uint32_t *const acc = accb + (size_t)(o * a->dfo + i * a->dfi);
            const int8_t *const inp = inpb + (size_t)(o * a->sfo + i * a->sfi);
            const int8_t *const wgt = wgtb + (size_t)(o * a->wfo + i * a->wfi);
            for (u0 = 0; u0 < nu; u0 = u1) {
                u1 = nu - u0 > ACCEL_STOP_POLL ? u0 + ACCEL_STOP_POLL : nu;
                if (accel_should_stop())
                    return 1;
                for (u = u0; u < u1; u++)
                    gemm_uop(acc + ud[u], inp + us[u], wgt + uw[u], batch, bin, bout, oc_outer);
            }
        }
    }
    return 0;
}

/* Shape specialisations; on x86 with GCC/Clang each also gets an AVX2 clone picked at run time
 * (no -march flag needed at build time, the baseline build stays SSE2). */
#define VTA_GEMM_SPECS(X) X(1, 16, 16) X(1, 8, 8) X(8, 8, 8) X(1, 32, 32) X(2, 16, 16)

#define VTA_GEMM_DEF(B, I, O) \
    static int gemm_##B##_##I##_##O(const gemm_args *a) { return gemm_loops(a, B, I, O, B > 1); }
VTA_GEMM_SPECS(VTA_GEMM_DEF)

static int gemm_generic(const gemm_args *a, int batch, int bin, int bout)
{
    return gemm_loops(a, batch, bin, bout, 0);
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(VTA_SIM_NO_AVX2)
#define VTA_HAVE_AVX2_CLONES 1
#define VTA_GEMM_DEF_AVX2(B, I, O) \
    __attribute__((target("avx2"))) static int gemm_avx2_##B##_##I##_##O(const gemm_args *a) \
    { \
        return gemm_loops(a, B, I, O, 0); \
    }
VTA_GEMM_SPECS(VTA_GEMM_DEF_AVX2)

static int cpu_has_avx2(void)
{
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return cached;
}
#endif

static int gemm_dispatch(const gemm_args *a, int batch, int bin, int bout)
{
#if VTA_HAVE_AVX2_CLONES
    const int avx2 = cpu_has_avx2();
#define VTA_GEMM_CASE(B, I, O) \
    if (batch == B && bin == I && bout == O) \
        return avx2 ? gemm_avx2_##B##_##I##_##O(a) : gemm_##B##_##I##_##O(a);
#else
#define VTA_GEMM_CASE(B, I, O) \
    if (batch == B && bin == I && bout == O) \
        return gemm_##B##_##I##_##O(a);
#endif
    VTA_GEMM_SPECS(VTA_GEMM_CASE)
#undef VTA_GEMM_CASE
    return gemm_generic(a, batch, bin, bout);
}

/* Returns 1 when a stop was requested. */
static int exec_gemm(vta_state *s, const vta_insn *in)
{
    const vta_geom *g = &s->g;
    uint64_t o, i, u, nu = n_uops(in);
    if (nu == 0 || in->iter_out == 0 || in->iter_in == 0)
        return 0;
    if (in->reset) {
        const size_t bytes = (size_t)g->acc_lanes * 4;
        for (o = 0; o < in->iter_out; o++)
            for (i = 0; i < in->iter_in; i++) {
                const uint64_t d0 = (o * in->dfo + i * in->dfi) * g->acc_lanes;
                if (accel_should_stop())
                    return 1;
                for (u = 0; u < nu; u++)
                    memset(s->acc + s->ud[u] + d0, 0, bytes);
            }
        return 0;
    }
    {
        gemm_args a;
        a.acc = s->acc;
        a.inp = s->inp;
        a.wgt = s->wgt;
        a.ud = s->ud;
        a.us = s->us;
        a.uw = s->uw;
        a.nu = nu;
        a.iter_out = in->iter_out;
        a.iter_in = in->iter_in;
        a.dfo = in->dfo * g->acc_lanes;
        a.dfi = in->dfi * g->acc_lanes;
        a.sfo = in->sfo * g->inp_entry;
        a.sfi = in->sfi * g->inp_entry;
        a.wfo = in->wfo * g->wgt_entry;
        a.wfi = in->wfi * g->wgt_entry;
        return gemm_dispatch(&a, (int)g->batch, (int)g->block_in, (int)g->block_out);
    }
}

static inline uint32_t alu_shr(uint32_t v, int32_t amount)
{
    if (amount >= 0) {
        const int32_t x = accel_as_i32(v);
        const int sh = amount > 31 ? 31 : (int)amount;
        return x >= 0 ? (uint32_t)(x >> sh) : ~(uint32_t)((~x) >> sh);
    }
    return v << (amount < -31 ? 31 : (int)-amount);
}

/* d[l] = op(d[l], src ? src[l] : imm). d and src may be the same entry. */
static void alu_entry(unsigned op, uint32_t *d, const uint32_t *src, uint32_t imm, uint32_t lanes)
{
    uint32_t l;
    switch (op) {
    case ALU_MIN:
        for (l = 0; l < lanes; l++) {
            const uint32_t b = src ? src[l] : imm;
            d[l] = accel_as_i32(b) < accel_as_i32(d[l]) ? b : d[l];
        }
        break;
    case ALU_MAX:
        for (l = 0; l < lanes; l++) {
            const uint32_t b = src ? src[l] : imm;
            d[l] = accel_as_i32(b) > accel_as_i32(d[l]) ? b : d[l];
        }
        break;
    case ALU_ADD:
        for (l = 0; l < lanes; l++)
            d[l] += src ? src[l] : imm;
        break;
    case ALU_SHR:
        for (l = 0; l < lanes; l++)
            d[l] = alu_shr(d[l], accel_as_i32(src ? src[l] : imm));
        break;
    default: /* ALU_MUL */
        for (l = 0; l < lanes; l++)
            d[l] *= src ? src[l] : imm;
        break;
    }
}

/* Returns 1 when a stop was requested. */
static int exec_alu(vta_state *s, const vta_insn *in)
{
    const uint32_t lanes = s->g.acc_lanes;
    const uint32_t imm = (uint32_t)in->imm; /* sign-extended 16-bit immediate, as int32 bits */
    uint64_t o, i, u, nu = n_uops(in);
    if (nu == 0 || in->iter_out == 0 || in->iter_in == 0)
        return 0;
    for (o = 0; o < in->iter_out; o++)
        for (i = 0; i < in->iter_in; i++) {
            const uint64_t d0 = (o * in->dfo + i * in->dfi) * lanes;
            const uint64_t s0 = (o * in->sfo + i * in->sfi) * lanes;
            if (accel_should_stop())
                return 1;
            for (u = 0; u < nu; u++) {
                uint32_t *d = s->acc + s->ud[u] + d0;
                if (in->reset)
                    memset(d, 0, (size_t)lanes * 4);
                else
                    alu_entry(in->alu_op, d, in->use_imm ? NULL : s->acc + s->us[u] + s0, imm, lanes);
            }
        }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Scheduler                                                                                  */

typedef struct {
    uint64_t *t; /* completion times carried by the tokens */
    uint64_t head, tail, cap;
} token_queue;

uint64_t vta_sim_config_size(void) { return sizeof(vta_sim_config); }
uint64_t vta_sim_stats_size(void) { return sizeof(vta_sim_stats); }

/* Validates, costs and executes one instruction at `start`; returns its duration in *dur. */
static int execute(vta_state *s, const vta_insn *in, uint64_t start, uint64_t *dur)
{
    const vta_geom *g = &s->g;
    vta_sim_stats *st = s->st;
    uint64_t bytes = 0, iters = 0, d;
    int rc = ACCEL_OK;
    switch (in->opcode) {
    case OP_LOAD:
        rc = check_load(s, in, &bytes);
        d = in->x_size == 0 ? 1 : accel_dma_cycles(bytes, g->bytes_per_cycle, g->dram_latency);
        break;
    case OP_STORE:
        rc = check_store(s, in, &bytes);
        d = in->x_size == 0 ? 1 : accel_dma_cycles(bytes, g->bytes_per_cycle, g->dram_latency);
        break;
    case OP_GEMM:
    case OP_ALU:
        rc = check_compute(s, in);
        iters = in->iter_out * in->iter_in * n_uops(in);
        d = accel_compute_cycles(iters, in->opcode == OP_GEMM ? g->gemm_cpu : g->alu_cpu, g->pipe_latency);
        break;
    default:
        d = 1;
        break;
    }
    if (rc != ACCEL_OK)
        return rc;
    if (d > g->max_cycles - start)
        return accel_fail(s->err, ACCEL_ERR_BUDGET,
                          "insn %u (%s): cycle budget of %llu cycles exceeded (starts at cycle %llu, takes %llu "
                          "cycles); raise max_cycles if the program is legitimate",
                          in->index, in->name, (ull)g->max_cycles, (ull)start, (ull)d);
    *dur = d;
    if (accel_should_stop())
        return accel_interrupted(s->err, "insn", in->index, in->name, start);
    switch (in->opcode) {
    case OP_LOAD:
        if (exec_load(s, in))
            return accel_interrupted(s->err, "insn", in->index, in->name, start);
        switch (in->mem_type) {
        case MEM_UOP: st->uop_load_bytes += bytes; break;
        case MEM_WGT: st->wgt_load_bytes += bytes; break;
        case MEM_INP: st->inp_load_bytes += bytes; break;
        default: st->acc_load_bytes += bytes; break;
        }
        break;
    case OP_STORE:
        if (exec_store(s, in))
            return accel_interrupted(s->err, "insn", in->index, in->name, start);
        st->out_store_bytes += bytes;
        break;
    case OP_GEMM:
        if (exec_gemm(s, in))
            return accel_interrupted(s->err, "insn", in->index, in->name, start);
        if (in->reset)
            st->gemm_reset_iters += iters;
        else
            st->gemm_uop_iters += iters;
        break;
    case OP_ALU:
        if (exec_alu(s, in))
            return accel_interrupted(s->err, "insn", in->index, in->name, start);
        st->alu_uop_iters += iters;
        break;
    default:
        break;
    }
    return ACCEL_OK;
}

int vta_sim_run(const vta_sim_config *cfg, const uint8_t *insns, uint64_t insn_bytes, uint8_t *dram,
                uint64_t dram_bytes, vta_sim_stats *stats, const char *trace_path, double trace_offset_us,
                int32_t trace_append, char *errbuf, uint64_t err_len)
{
    accel_err err;
    vta_state s;
    vta_sim_stats local_stats;
    accel_trace trace;
    token_queue tq[NUM_Q];
    uint32_t *order = NULL;       /* instruction indices grouped by module */
    uint64_t start_of[3], count[3] = {0, 0, 0}, pc[3] = {0, 0, 0}, free_at[3] = {0, 0, 0};
    uint64_t n, k, finish_at = UINT64_MAX, end_max = 0;
    vta_insn cur[3];
    int q, m, rc;

    accel_err_init(&err, errbuf, err_len);
    memset(&s, 0, sizeof(s));
    memset(tq, 0, sizeof(tq));
    trace.f = NULL;
    if (!stats)
        stats = &local_stats;
    memset(stats, 0, sizeof(*stats));
    s.st = stats;
    s.err = &err;
    s.dram = dram;
    s.dram_bytes = dram_bytes;

    if (!cfg)
        return accel_fail(&err, ACCEL_ERR_ARG, "no config given");
    if (insn_bytes % 16 != 0)
        return accel_fail(&err, ACCEL_ERR_ARG, "instruction stream of %llu bytes is not a multiple of 16",
                          (ull)insn_bytes);
    if ((insn_bytes && !insns) || (dram_bytes && !dram))
        return accel_fail(&err, ACCEL_ERR_ARG, "NULL instruction or DRAM buffer");
    if (!isfinite(trace_offset_us))
        return accel_fail(&err, ACCEL_ERR_ARG, "trace offset is not finite");
    n = insn_bytes / 16;
    if (n > UINT32_MAX)
        return accel_fail(&err, ACCEL_ERR_ARG, "instruction stream of %llu instructions is too long", (ull)n);
    if ((rc = check_config(cfg, &s.g, &err)) != ACCEL_OK)
        return rc;

    /* Static pass: decode, route, check fields; count instructions and pushes per queue. */
    {
        uint64_t pushes[NUM_Q] = {0, 0, 0, 0};
        for (k = 0; k < n; k++) {
            vta_insn in;
            int qs[2], np, j;
            if ((k & 4095) == 0 && accel_should_stop())
                return accel_fail(&err, ACCEL_ERR_INTERRUPTED, "interrupted while checking insn %llu", (ull)k);
            decode(&s.g, insns + 16 * k, (uint32_t)k, &in);
            in.module = route(&in);
            if (finish_at != UINT64_MAX)
                return accel_fail(&err, ACCEL_ERR_PROTOCOL, "insn %llu (%s): instruction after FINISH (insn %llu)",
                                  (ull)k, in.name, (ull)finish_at);
            if ((rc = check_static(&in, &err)) != ACCEL_OK)
                return rc;
            if (in.opcode == OP_FINISH)
                finish_at = k;
            count[in.module]++;
            np = pushes_of(&in, qs);
            for (j = 0; j < np; j++)
                pushes[qs[j]]++;
        }
        if (finish_at == UINT64_MAX)
            return accel_fail(&err, ACCEL_ERR_PROTOCOL, "no FINISH instruction in the stream of %llu instructions",
                              (ull)n);
        for (q = 0; q < NUM_Q; q++) {
            tq[q].cap = pushes[q];
            tq[q].t = (uint64_t *)accel_calloc(pushes[q], sizeof(uint64_t));
        }
    }

    order = (uint32_t *)accel_calloc(n, sizeof(uint32_t));
    s.uop = (uint32_t *)accel_calloc(s.g.uop_depth, 4);
    s.inp = (int8_t *)accel_calloc(s.g.inp_depth, s.g.inp_entry);
    s.wgt = (int8_t *)accel_calloc(s.g.wgt_depth, s.g.wgt_entry);
    s.acc = (uint32_t *)accel_calloc(s.g.acc_depth, (uint64_t)s.g.acc_lanes * 4);
    s.ud = (uint32_t *)accel_calloc(s.g.uop_depth, 4);
    s.us = (uint32_t *)accel_calloc(s.g.uop_depth, 4);
    s.uw = (uint32_t *)accel_calloc(s.g.uop_depth, 4);
    if (!order || !s.uop || !s.inp || !s.wgt || !s.acc || !s.ud || !s.us || !s.uw || !tq[0].t || !tq[1].t ||
        !tq[2].t || !tq[3].t) {
        rc = accel_fail(&err, ACCEL_ERR_NOMEM, "out of host memory for the simulator state");
        goto done;
    }
    start_of[0] = 0;
    start_of[1] = count[0];
    start_of[2] = count[0] + count[1];
    {
        uint64_t fill[3] = {start_of[0], start_of[1], start_of[2]};
        for (k = 0; k < n; k++) {
            vta_insn in;
            if ((k & 4095) == 0 && accel_should_stop()) {
                rc = accel_fail(&err, ACCEL_ERR_INTERRUPTED, "interrupted while checking insn %llu", (ull)k);
                goto done;
            }
            decode(&s.g, insns + 16 * k, (uint32_t)k, &in);
            order[fill[route(&in)]++] = (uint32_t)k;
        }
    }

    if (trace_path) {
        if ((rc = accel_trace_open(&trace, trace_path, trace_append != 0, &err)) != ACCEL_OK)
            goto done;
        accel_trace_process_name(&trace, 0, "VTA");
        for (m = 0; m < 3; m++)
            accel_trace_thread_name(&trace, 0, m, MOD_NAMES[m]);
    }

    for (m = 0; m < 3; m++)
        if (count[m] > 0) {
            decode(&s.g, insns + 16 * (uint64_t)order[start_of[m]], order[start_of[m]], &cur[m]);
            cur[m].module = (unsigned)m;
        }

    /* Discrete-event loop: run the ready module whose next instruction starts earliest. */
    for (;;) {
        int best = -1, qs[2], np, j;
        uint64_t best_start = 0, dur = 0, end;
        for (m = 0; m < 3; m++) {
            uint64_t t;
            int ready = 1;
            if (pc[m] >= count[m])
                continue;
            t = free_at[m];
            np = pops_of(&cur[m], qs);
            for (j = 0; j < np; j++) {
                token_queue *tk = &tq[qs[j]];
                if (tk->head == tk->tail) {
                    ready = 0;
                    break;
                }
                if (tk->t[tk->head] > t)
                    t = tk->t[tk->head];
            }
            if (ready && (best < 0 || t < best_start)) {
                best = m;
                best_start = t;
            }
        }
        if (best < 0) {
            int all_done = 1;
            for (m = 0; m < 3; m++)
                if (pc[m] < count[m])
                    all_done = 0;
            if (all_done)
                break;
            {
                char msg[512];
                size_t len = 0;
                msg[0] = '\0';
                for (m = 0; m < 3; m++) {
                    int w;
                    if (pc[m] >= count[m]) {
                        w = snprintf(msg + len, sizeof(msg) - len, "%s%s done", len ? "; " : "", MOD_NAMES[m]);
                    } else {
                        const char *wait = "?";
                        np = pops_of(&cur[m], qs);
                        for (j = 0; j < np; j++)
                            if (tq[qs[j]].head == tq[qs[j]].tail) {
                                wait = Q_NAMES[qs[j]];
                                break;
                            }
                        w = snprintf(msg + len, sizeof(msg) - len, "%s%s blocked at insn %u (%s) waiting on %s",
                                     len ? "; " : "", MOD_NAMES[m], cur[m].index, cur[m].name, wait);
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

        m = best;
        if ((rc = execute(&s, &cur[m], best_start, &dur)) != ACCEL_OK)
            goto done;
        end = best_start + dur;
        np = pops_of(&cur[m], qs);
        for (j = 0; j < np; j++)
            tq[qs[j]].head++;
        np = pushes_of(&cur[m], qs);
        for (j = 0; j < np; j++) {
            token_queue *tk = &tq[qs[j]];
            tk->t[tk->tail++] = end; /* cannot overflow: cap = pushes counted in the static pass */
        }
        stats->busy[m] += dur;
        stats->stall[m] += best_start - free_at[m];
        stats->insns[m]++;
        free_at[m] = end;
        if (end > end_max)
            end_max = end;
        stats->cycles = end_max;
        if (trace.f) {
            char args[96];
            snprintf(args, sizeof(args), "{\"insn\": %u, \"cycles\": %llu}", cur[m].index, (ull)dur);
            accel_trace_complete(&trace, cur[m].name, 0, m, trace_offset_us + (double)best_start / s.g.clock_mhz,
                                 (double)dur / s.g.clock_mhz, args);
        }
        pc[m]++;
        if (pc[m] < count[m]) {
            uint32_t idx = order[start_of[m] + pc[m]];
            decode(&s.g, insns + 16 * (uint64_t)idx, idx, &cur[m]);
            cur[m].module = (unsigned)m;
        }
    }

    /* Every module drained; the token queues must be empty too. */
    {
        char msg[256];
        size_t len = 0;
        msg[0] = '\0';
        for (q = 0; q < NUM_Q; q++) {
            uint64_t left = tq[q].tail - tq[q].head;
            if (left) {
                int w = snprintf(msg + len, sizeof(msg) - len, "%s%llu left in %s", len ? ", " : "", (ull)left,
                                 Q_NAMES[q]);
                if (w > 0)
                    len += (size_t)w;
                if (len >= sizeof(msg))
                    len = sizeof(msg) - 1;
            }
        }
        if (len)
            rc = accel_fail(&err, ACCEL_ERR_PROTOCOL, "unbalanced tokens: %s", msg);
        else
            rc = ACCEL_OK;
    }

done:
    if (trace.f) {
        int trc = accel_trace_close(&trace, trace_path, &err);
        if (rc == ACCEL_OK)
            rc = trc;
    }
    free(order);
    free(s.uop);
    free(s.inp);
    free(s.wgt);
    free(s.acc);
    free(s.ud);
    free(s.us);
    free(s.uw);
    for (q = 0; q < NUM_Q; q++)
        free(tq[q].t);
    return rc;
}
