/* Internal declarations of the VTA simulator: configuration geometry, decoded instructions,
 * machine state, and the decode / execute steps used by the scheduler in vta_sim.c. */
#ifndef ACCEL_VTA_INTERNAL_H
#define ACCEL_VTA_INTERNAL_H

#include <stdint.h>

#include "common/status.h"
#include "vta/vta_sim.h"

typedef unsigned long long ull;

enum { OP_LOAD = 0, OP_STORE = 1, OP_GEMM = 2, OP_FINISH = 3, OP_ALU = 4 };
enum { MEM_UOP = 0, MEM_WGT = 1, MEM_INP = 2, MEM_ACC = 3, MEM_OUT = 4, MEM_ACC8 = 5 };
enum { ALU_MIN = 0, ALU_MAX = 1, ALU_ADD = 2, ALU_SHR = 3, ALU_MUL = 4 };
/* token queues: load->compute, compute->load, compute->store, store->compute */
enum { Q_L2G = 0, Q_G2L = 1, Q_G2S = 2, Q_S2G = 3, NUM_Q = 4 };

#define LOOP_ITER_BITS 14
#define IMM_BITS 16

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

typedef struct {
    vta_geom g;
    uint32_t *uop;  /* uop_depth words */
    int8_t *inp;    /* inp_depth x inp_entry */
    int8_t *wgt;    /* wgt_depth x wgt_entry, [out][in] */
    int32_t *pairs; /* WGT again in the AVX2 kernel's pair layout (vta_gemm.c), or NULL */
    uint32_t *acc;  /* acc_depth x acc_lanes, int32 two's complement */
    uint32_t *ud, *us, *uw; /* scratch: uop fields of the current instruction, pre-multiplied */
    uint8_t *dram;
    uint64_t dram_bytes;
    vta_sim_stats *st;
    accel_err *err;
} vta_state;

/* vta_decode.c */
int vta_check_config(const vta_sim_config *c, vta_geom *g, accel_err *err);
void vta_decode(const vta_geom *g, const uint8_t *p, uint32_t index, vta_insn *in);
/* Routing and every check that depends on the instruction alone (not on SRAM contents). */
int vta_check_static(const vta_insn *in, accel_err *err);
/* Module (VTA_MOD_*) whose queue runs the instruction. */
unsigned vta_route(const vta_insn *in);
/* Token queues popped / pushed by an instruction of its module; returns the count (<= 2). */
int vta_pops_of(const vta_insn *in, int q[2]);
int vta_pushes_of(const vta_insn *in, int q[2]);

/* vta_exec.c: validates, costs and executes one instruction starting at cycle `start`; returns
 * its duration in *dur. Fails on a bounds error, an exceeded cycle budget or a stop request. */
int vta_execute(vta_state *s, const vta_insn *in, uint64_t start, uint64_t *dur);

/* vta_gemm.c: the GEMM functional core. vta_gemm_init allocates s->pairs when the AVX2 kernel
 * runs (ACCEL_OK or ACCEL_ERR_NOMEM); vta_wgt_sync refreshes entries [first, first + n) of it after
 * a write to WGT; vta_exec_gemm runs a checked GEMM and returns 1 when a stop was requested. */
int vta_gemm_init(vta_state *s);
void vta_wgt_sync(vta_state *s, uint64_t first, uint64_t n);
int vta_exec_gemm(vta_state *s, const vta_insn *in);

#endif
