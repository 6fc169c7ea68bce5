/* VTA instruction decoding and the checks that need no machine state: configuration limits,
 * field values, module routing and the token queues each instruction pops and pushes. */
#include <math.h>
#include <string.h>

#include "common/mem.h"
#include "common/stats.h"
#include "vta/vta_internal.h"

static const char *const MEM_NAMES[6] = {"UOP", "WGT", "INP", "ACC", "OUT", "ACC8"};

int vta_check_config(const vta_sim_config *c, vta_geom *g, accel_err *err)
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

static const char *const LOAD_NAMES[8] = {"LOAD UOP", "LOAD WGT", "LOAD INP", "LOAD ACC",
                                          "LOAD OUT", "LOAD ACC8", "LOAD ?6", "LOAD ?7"};
static const char *const STORE_NAMES[8] = {"STORE UOP", "STORE WGT", "STORE INP", "STORE ACC",
                                           "STORE", "STORE ACC8", "STORE ?6", "STORE ?7"};
static const char *const ALU_INSN_NAMES[8] = {"ALU MIN", "ALU MAX", "ALU ADD", "ALU SHR",
                                              "ALU MUL", "ALU ?5", "ALU ?6", "ALU ?7"};
static const char *const OP_NAMES[8] = {"LOAD", "STORE", "GEMM", "FINISH", "ALU", "?5", "?6", "?7"};

void vta_decode(const vta_geom *g, const uint8_t *p, uint32_t index, vta_insn *in)
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

int vta_check_static(const vta_insn *in, accel_err *err)
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

unsigned vta_route(const vta_insn *in)
{
    if (in->opcode == OP_STORE)
        return VTA_MOD_STORE;
    if (in->opcode == OP_LOAD && (in->mem_type == MEM_INP || in->mem_type == MEM_WGT))
        return VTA_MOD_LOAD;
    return VTA_MOD_COMPUTE;
}

int vta_pops_of(const vta_insn *in, int q[2])
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

int vta_pushes_of(const vta_insn *in, int q[2])
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
