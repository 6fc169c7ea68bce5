/* MARSELLUS CLUSTER functional + timed simulator (plain C99, loaded with ctypes by
 * tvm_marsellus/simulator.py).
 *
 * Hardware (MARSELLUS paper, Sec. II): L3 (HyperRAM, through the SoC I/O DMA), L2 (SoC memory),
 * L1 (128 KiB TCDM). Five engines run concurrently, each executing its own commands in program
 * order:
 *   IODMA   L3 <-> L2                      (SoC I/O DMA)
 *   DMA_IN  L2 -> L1                       (CLUSTER DMA read channel, 64 bit/cycle)
 *   DMA_OUT L1 -> L2                       (CLUSTER DMA write channel, 64 bit/cycle)
 *   RBE     3x3 / 1x1 convolution jobs on L1 bit-plane tensors (2-deep job queue)
 *   CLUSTER kernels of the 16 XpulpNN cores on L1 HWC tensors
 * The command format (64-byte commands), the integer semantics of every command, the layouts and
 * the synchronisation are documented once, in the module docstring of
 * python/tvm_marsellus/codegen.py; this simulator implements that text.
 *
 * Synchronisation: 16 counting semaphores (event counters). A command waits until every
 * semaphore of its wait mask holds a token, takes one token of each when it starts, and at its
 * completion adds one token to every semaphore of its signal mask. Tokens carry the completion
 * time of the command that produced them; a command takes the earliest token of each semaphore.
 * NOP commands (0 cycles, on any engine) pre-load credits (e.g. "buffer free" tokens for double
 * buffering).
 *
 * Cycle model (per command, see the hw_config module docstring for the RBE formula):
 *   DMA      latency + ceil(bytes / bytes_per_cycle) + (rows - 1) * row_overhead
 *            (L3 transfers use l3_latency and l3_bytes_per_cycle)
 *   RBE      setup + LOAD / COMPUTE / NORMQUANT / STREAMOUT phases. The setup (a core writes
 *            the job registers) starts when the job's tokens are there and one of the
 *            rbe_queue_depth contexts is free (job j - depth has completed); the job runs when
 *            the engine is free and its setup is done, so with 2 contexts the setup of a queued
 *            job overlaps the running one. Only the setup not hidden counts as busy/rbe_setup.
 *   CLUSTER  overhead + work / rate, rates from the config:
 *            CONV  ceil(MACs / matmul_rate(max(in, w bits))) + im2col bytes / im2col rate
 *                  (only for kernels > 1x1 or stride > 1) + outputs * nq_cycles / cores;
 *                  MACs and im2col cover the outputs whose window reads the input (an output
 *                  whose window is padding only costs its NormQuant alone; also DW)
 *            FC    like CONV with matmul_rate * fc_efficiency
 *            CONV / FC with partial sums (Kin tiling): + outputs * (psum_in + psum_out) / cores
 *                  (one 32-bit load / store per output); no NormQuant term when psum_out
 *            DW    ceil(MACs / dw_rate) + outputs * nq_cycles / cores
 *            ADD, MUL  elements / eltwise rate; MAXPOOL/AVGPOOL taps / pool rate;
 *            HWC<->RBE marshaling  element bits / marshal rate
 *            LUT   ceil(elements * lut_cycles / cores): per element and core a load of the
 *                  input byte, an indexed load of the table entry in L1, a store, and one
 *                  cycle for the channel row / load-use stall (default 4)
 *   NOP 0 cycles, END 0 cycles.
 * Execution is discrete-event: among the engines whose next command has all its tokens, the one
 * that can start earliest runs (ties in engine order); its memory effects are applied at that
 * point, so results follow the timed order. Two commands touching the same bytes without
 * synchronisation form a race the simulator does not detect. Total cycles = last completion.
 *
 * Checks: the whole stream is decoded and checked before anything runs (unknown opcode or
 * kernel, reserved bits, every field against its range and every footprint against the memory
 * it names). A deadlock (no engine can progress) or the cycle budget (max_cycles, 0 = 2^34) ends
 * the run with a one-line message naming the command, engine, field and value.
 * accelsim_request_stop() (common/status.h), from any thread, ends the run within milliseconds,
 * also inside a long instruction, with ACCEL_ERR_INTERRUPTED
 * ("interrupted at cmd 17 (RBE), cycle 123456").
 */
#ifndef ACCEL_MARS_SIM_H
#define ACCEL_MARS_SIM_H

#include <stdint.h>

#include "common/status.h"

enum { MARS_ENG_IODMA = 0, MARS_ENG_DMA_IN = 1, MARS_ENG_DMA_OUT = 2, MARS_ENG_RBE = 3,
       MARS_ENG_CLUSTER = 4, MARS_NUM_ENGINES = 5 };
enum { MARS_MEM_L3 = 0, MARS_MEM_L2 = 1, MARS_MEM_L1 = 2 };
enum { MARS_OP_DMA = 1, MARS_OP_RBE = 2, MARS_OP_CLUSTER = 3, MARS_OP_NOP = 4, MARS_OP_END = 15 };
enum { MARS_CL_CONV = 1, MARS_CL_DWCONV = 2, MARS_CL_FC = 3, MARS_CL_ADD = 4, MARS_CL_MAXPOOL = 5,
       MARS_CL_AVGPOOL = 6, MARS_CL_HWC_TO_RBE = 7, MARS_CL_RBE_TO_HWC = 8, MARS_CL_LUT = 9,
       MARS_CL_MUL = 10, MARS_CL_NUM = 11 };
enum { MARS_RBE_LOAD = 0, MARS_RBE_COMPUTE = 1, MARS_RBE_NORMQUANT = 2, MARS_RBE_STREAMOUT = 3,
       MARS_RBE_SETUP = 4, MARS_RBE_NUM_PHASES = 5 };

#define MARS_CMD_BYTES 64
#define MARS_NUM_SEMS 16

typedef struct {
    int32_t rbe_cores, rbe_blocks, rbe_binconvs, rbe_port_bits, rbe_queue_depth;
    int32_t rbe_min_bits, rbe_max_bits;
    int32_t rbe_load_latency, rbe_kout_overhead, rbe_compute_latency, rbe_nq_cycles_per_group;
    int32_t rbe_job_setup;
    int32_t cluster_cores, cl_mac_load, cl_kernel_overhead;
    int32_t dma_latency, dma_row_overhead, l3_latency;
    double clock_mhz, dma_bytes_per_cycle, l3_bytes_per_cycle;
    double cl_matmul_8b, cl_macload_speedup, cl_4b_speedup, cl_2b_speedup, cl_dw_macs;
    double cl_fc_efficiency, cl_im2col_bytes, cl_nq_cycles_per_output, cl_eltwise_elems;
    double cl_pool_taps, cl_marshal_bits, cl_lut_cycles;
    uint64_t max_cycles; /* 0 = ACCEL_DEFAULT_MAX_CYCLES */
} mars_config;

typedef struct {
    uint64_t cycles;
    uint64_t busy[MARS_NUM_ENGINES];  /* cycles each engine spent executing commands */
    uint64_t stall[MARS_NUM_ENGINES]; /* idle cycles before a command, waiting for its tokens */
    uint64_t cmds[MARS_NUM_ENGINES];
    uint64_t rbe_phase[MARS_RBE_NUM_PHASES];
    uint64_t rbe_macs, rbe_bin_ops, cluster_macs, cluster_elems;
    uint64_t l3_read_bytes, l3_write_bytes, l2_read_bytes, l2_write_bytes;
    uint64_t l1_read_bytes, l1_write_bytes;
} mars_stats;

uint64_t mars_sim_config_size(void);
uint64_t mars_sim_stats_size(void);

/* Runs n_bytes of commands (a multiple of 64). l3/l2/l1 are the memories (read and written in
 * place; l3 may be NULL with size 0). Returns an accel_status; on failure err holds one line. */
int mars_sim_run(const mars_config *cfg, const uint8_t *cmds, uint64_t n_bytes, uint8_t *l3,
                 uint64_t l3_size, uint8_t *l2, uint64_t l2_size, uint8_t *l1, uint64_t l1_size,
                 mars_stats *stats, const char *trace_path, double trace_offset_us,
                 int32_t trace_append, char *err, uint64_t err_len);

/* Cycles of the RBE phases of one job described by its 14 register words (no setup), written
 * into phases[4] (LOAD, COMPUTE, NORMQUANT, STREAMOUT). For the benchmark and tests. */
int mars_sim_rbe_job_cycles(const mars_config *cfg, const uint8_t *cmd64, uint64_t *phases,
                            char *err, uint64_t err_len);

#endif
