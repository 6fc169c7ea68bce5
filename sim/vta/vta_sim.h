/* VTA functional + timed simulator (plain C99, loaded with ctypes by tvm_vta_cp/simulator.py).
 *
 * Functional semantics follow the public VTA simulator (see /work/shared/reference): three
 * modules (load, compute, store) each run their instruction queue in order and synchronise with
 * four token queues; GEMM/ALU run two affine loops over a micro-op range; STORE narrows ACC
 * entries to int8 by truncation. The bit layout of instructions and micro-ops is the one of
 * python/tvm_vta_cp/codegen.py, with field widths derived from the buffer depths of the config.
 *
 * Cycle model (our addition): every instruction has a duration
 *   LOAD/STORE  DRAM_LATENCY + ceil(bytes / DRAM_BYTES_PER_CYCLE)  (bytes without padding;
 *               x_size == 0 is a token-only no-op of 1 cycle)
 *   GEMM        iter_out * iter_in * (uop_end - uop_bgn) * GEMM_CYCLES_PER_UOP + PIPELINE_LATENCY
 *   ALU         the same with ALU_CYCLES_PER_UOP
 *   FINISH      1
 * (every duration is at least 1). An instruction starts at max(free time of its module,
 * completion time carried by every token it pops); tokens carry the completion time of the
 * pushing instruction. Instructions are executed in start-time order (discrete-event: among the
 * modules whose next instruction has its tokens, the one that starts earliest runs; ties go to
 * load, then compute, then store), so functional results follow the timing order. Start times
 * are non-decreasing over the run. Total cycles = completion of the last instruction.
 *
 * ALU SHR: the amount is the full signed operand: amount >= 0 shifts right arithmetically by
 * min(amount, 31); amount < 0 shifts left (int32 wrap) by min(-amount, 31).
 *
 * Safety: every index and range taken from the stream is checked before use (LOAD/STORE SRAM
 * blocks incl. padding and DRAM byte ranges once per instruction; GEMM/ALU index extremes once
 * per instruction, from the largest micro-op field of the range). A run stops at the first
 * violation with a status code and a one-line message naming the instruction, module, field and
 * value. The cycle budget (max_cycles, 0 = default 2^34) bounds the work of a run: an
 * instruction that would end after it is not executed. accelsim_request_stop()
 * (common/status.h), from any thread, ends the run within milliseconds, also inside a long
 * instruction, with ACCEL_ERR_INTERRUPTED ("interrupted at insn 17 (GEMM), cycle 123456").
 */
#ifndef ACCEL_VTA_SIM_H
#define ACCEL_VTA_SIM_H

#include <stdint.h>

#include "common/status.h"

typedef struct {
    int32_t log_batch, log_block_in, log_block_out;
    int32_t log_uop_buff_size, log_inp_buff_size, log_wgt_buff_size, log_acc_buff_size;
    double dram_bytes_per_cycle, clock_mhz;
    int32_t dram_latency_cycles, gemm_cycles_per_uop, alu_cycles_per_uop, pipeline_latency_cycles;
    uint64_t max_cycles; /* 0 = default budget; values above 2^62 are clamped */
} vta_sim_config;

enum { VTA_MOD_LOAD = 0, VTA_MOD_COMPUTE = 1, VTA_MOD_STORE = 2 };

typedef struct {
    uint64_t cycles;
    uint64_t busy[3], stall[3], insns[3]; /* indexed by VTA_MOD_* */
    uint64_t gemm_uop_iters, gemm_reset_iters, alu_uop_iters;
    uint64_t inp_load_bytes, wgt_load_bytes, acc_load_bytes, uop_load_bytes, out_store_bytes;
} vta_sim_stats;

/* sizeof checks for the ctypes binding. */
uint64_t vta_sim_config_size(void);
uint64_t vta_sim_stats_size(void);

/* Runs an instruction stream (insn_bytes / 16 instructions, little-endian words) against DRAM
 * (modified in place). stats may be NULL; it is filled even on failure (counts up to the error).
 *
 * Trace: when trace_path is not NULL, one Chrome-trace "X" event per executed instruction is
 * written (pid 0, tid = module with thread_name metadata "load"/"compute"/"store", ts/dur in
 * microseconds at clock_mhz, shifted by trace_offset_us, args {"insn", "cycles"}). trace_append
 * = 0 overwrites the file; 1 continues a trace file written by a previous run (created if missing),
 * so per-layer runs can be laid out one after another by passing the summed duration as offset.
 * Events of instructions executed before an error are still written.
 *
 * Returns ACCEL_OK (0) or an accel_status with the message in err (err_len bytes incl. NUL). */
int vta_sim_run(const vta_sim_config *cfg, const uint8_t *insns, uint64_t insn_bytes, uint8_t *dram,
                uint64_t dram_bytes, vta_sim_stats *stats, const char *trace_path,
                double trace_offset_us, int32_t trace_append, char *err, uint64_t err_len);

#endif
