/* DPU functional + timed simulator (plain C99, loaded with ctypes by tvm_dpu/simulator.py).
 *
 * Hardware (DPUV3INT8 compiler paper, section III; DNNVM): DDR split into five regions by
 * base/size registers (INPUT, OUTPUT, PARAM, INSN, SWAP); one parameter memory (PM) shared by all
 * PEs; num_pe processing engines working SIMD, one image each, each with a feature-map memory (FM)
 * of fm_memories circular memories of fm_banks x fm_bank_bytes bytes; four units running
 * concurrently: LOAD (DDR -> FM/PM), SAVE (FM -> DDR), CONV, MISC. The instruction set (256-bit
 * words), the exact integer semantics of every instruction and the address rules (FM/PM circular,
 * DDR bounded by regions) are documented once, in the module docstring of
 * python/tvm_dpu/codegen.py; this simulator implements that text.
 *
 * Dependencies: one token FIFO per ordered pair of unit types (A -> B, A != B), unbounded. An
 * instruction of unit B with A in its DPON pops a token from FIFO(A -> B) before it starts (it
 * waits while the FIFO is empty); an instruction of unit A with B in its DPBY pushes a token into
 * FIFO(A -> B) when it completes. Each unit runs its own instructions in program order. Tokens
 * carry the completion time of the pushing instruction.
 *
 * Cycle model: an instruction starts at max(free time of its unit, time carried by every token it
 * pops) and lasts (at least 1 cycle):
 *   LOAD  load_latency + ceil(DDR bytes read / ddr_bytes_per_cycle); DDR bytes are the image
 *         bytes (padding and the format unit are free) times num_pe for FM loads, once for PM
 *   SAVE  save_latency + ceil(num_pe x rows x cols x chans / ddr_bytes_per_cycle)
 *   CONV  conv_latency + ceil(out_h / conv_row_par) x out_w x ceil(oc / conv_oc_par) x
 *         ceil(ic / conv_ic_par) x kernel_h x kernel_w   (depthwise: no ic factor)
 *   MISC  misc_latency + ceil(out_h / misc_row_par) x out_w x ceil(chans / misc_ch_par)
 *         (x kernel_h x kernel_w for MAXPOOL / AVGPOOL)
 *   No-Op (empty size) 1.
 * Execution is discrete-event: among the units whose next instruction has its tokens, the one that
 * starts earliest runs (ties: LOAD, SAVE, CONV, MISC); its effects are applied at that point, so
 * start times never decrease and functional results follow the timed order. A program that
 * relies on unsynchronised overlap of two instructions touching the same bytes is racy; the
 * simulator does not detect races. Total cycles = completion of the last instruction. Stall of a
 * unit = time between its previous completion and the start of its next instruction; it is also
 * attributed to the FIFO whose token arrived last (stall_on[unit][producer]).
 *
 * Checks: the whole stream is decoded and checked before anything runs (unknown opcode or MISC
 * op, set reserved bits, a unit in its own DPON/DPBY, END not last / missing / with dependencies,
 * and every field, address and footprint against the config, the DDR regions and the DDR buffer).
 * A protocol error (deadlock, unbalanced FIFOs at the end) or the cycle budget (max_cycles, 0 =
 * 2^34) stops a run with a one-line message naming the instruction, unit, field and value. The
 * work of a run is bounded by its budget: at most max_cycles x peak MACs per cycle.
 * accelsim_request_stop() (common/status.h), from any thread, ends the run within milliseconds,
 * also inside a long instruction, with ACCEL_ERR_INTERRUPTED
 * ("interrupted at insn 17 (CONV), cycle 123456").
 */
#ifndef ACCEL_DPU_SIM_H
#define ACCEL_DPU_SIM_H

#include <stdint.h>

#include "common/status.h"

enum { DPU_UNIT_LOAD = 0, DPU_UNIT_SAVE = 1, DPU_UNIT_CONV = 2, DPU_UNIT_MISC = 3, DPU_NUM_UNITS = 4 };
enum { DPU_REGION_INPUT = 0, DPU_REGION_OUTPUT = 1, DPU_REGION_PARAM = 2, DPU_REGION_INSN = 3,
       DPU_REGION_SWAP = 4, DPU_NUM_REGIONS = 5 };

typedef struct {
    int32_t num_pe, fm_memories, fm_banks, fm_bank_bytes, pm_bytes;
    int32_t conv_ic_par, conv_oc_par, conv_row_par, misc_ch_par, misc_row_par;
    int32_t format_max_channels, format_max_factor;
    int32_t load_latency_cycles, save_latency_cycles, conv_latency_cycles, misc_latency_cycles;
    double clock_mhz, ddr_bytes_per_cycle;
    uint64_t region_base[DPU_NUM_REGIONS], region_size[DPU_NUM_REGIONS]; /* byte offsets in DDR */
    uint64_t max_cycles; /* 0 = default budget; values above 2^62 are clamped */
} dpu_sim_config;

typedef struct {
    uint64_t cycles;
    uint64_t busy[DPU_NUM_UNITS], stall[DPU_NUM_UNITS], insns[DPU_NUM_UNITS]; /* by DPU_UNIT_* */
    uint64_t stall_on[DPU_NUM_UNITS][DPU_NUM_UNITS]; /* [waiting unit][producer unit] */
    uint64_t macs;        /* useful MACs (taps on real input, padding excluded), all PEs */
    uint64_t padded_macs; /* MACs of the full windows incl. padding taps, all PEs */
    uint64_t ddr_read_bytes, ddr_write_bytes;
    uint64_t fm_read_bytes, fm_write_bytes; /* all PEs */
    uint64_t pm_read_bytes, pm_write_bytes;
    uint64_t tokens; /* tokens pushed (= popped in a successful run) */
    /* head: cycles before the first CONV / MISC instruction starts (the whole run without one); tail:
     * cycles after the last one ends. Of a range: measured within its own marginal cycles. */
    uint64_t head_cycles, tail_cycles;
} dpu_sim_stats;

/* sizeof checks for the ctypes binding. */
uint64_t dpu_sim_config_size(void);
uint64_t dpu_sim_stats_size(void);

/* Runs an instruction stream (insn_bytes / 32 instructions) against DDR (modified in place).
 * FM and PM start zeroed. stats may be NULL; it is filled even on failure (counts up to the
 * error).
 *
 * Trace: when trace_path is not NULL, one Chrome-trace "X" event per executed instruction is
 * written (pid 0 "DPU", tid = unit with thread_name metadata "LOAD"/"SAVE"/"CONV"/"MISC", name =
 * kind: "LOAD FM", "LOAD PM", "SAVE", "CONV", "CONV DW", "MAXPOOL", "AVGPOOL", "ELTADD", "ELTMUL",
 * "UPSAMPLE", "COPY" or "NOP"; ts/dur in microseconds at clock_mhz, shifted by trace_offset_us;
 * args {"insn", "cycles", "dpon", "dpby"} and "macs" for CONV). trace_append = 0 overwrites the
 * file; 1 continues a trace written by a previous run. Events of instructions executed before an
 * error are still written.
 *
 * Returns ACCEL_OK (0) or an accel_status with the message in err (err_len bytes incl. NUL). */
int dpu_sim_run(const dpu_sim_config *cfg, const uint8_t *insns, uint64_t insn_bytes, uint8_t *ddr,
                uint64_t ddr_bytes, dpu_sim_stats *stats, const char *trace_path, double trace_offset_us,
                int32_t trace_append, char *err, uint64_t err_len);

/* dpu_sim_run for a stream made of consecutive instruction ranges (one per layer / fused group of a
 * function compiled into one stream): range r holds the instructions [range_end[r-1], range_end[r]) (from 0
 * for r = 0); range_end must increase strictly, each in 1..n, and the last must cover every instruction but
 * the final END. range_stats (n_ranges entries) receives the counters of each range's instructions and its
 * cycles: the run is cut at boundaries b[r] = when range r's first CONV / MISC instruction starts, but not
 * before b[r-1] nor before the last CONV of the earlier ranges ends (b[0] = 0, b[n_ranges] = the run's
 * cycles), and range r gets b[r+1] - b[r]. So the ranges' cycles sum to the total, a range's CONV work
 * lies inside its own window, and the LOADs a range issues during its predecessor's tail are hidden
 * there. head_cycles / tail_cycles of a range are measured inside its window. stats receives the totals. */
int dpu_sim_run_ranges(const dpu_sim_config *cfg, const uint8_t *insns, uint64_t insn_bytes, uint8_t *ddr,
                       uint64_t ddr_bytes, dpu_sim_stats *stats, const uint64_t *range_end, uint64_t n_ranges,
                       dpu_sim_stats *range_stats, const char *trace_path, double trace_offset_us,
                       int32_t trace_append, char *err, uint64_t err_len);

/* Decodes one 32-byte instruction into its field values in layout order (header first: opcode,
 * DPON, DPBY, then the fields of its kind, signed fields sign-extended); *n_fields receives the
 * count (at most max_fields are written). For tests that the C and Python layouts agree.
 * Returns ACCEL_ERR_DECODE for an unknown opcode / MISC op or set reserved bits. */
int dpu_sim_decode_fields(const uint8_t *insn, int64_t *out, uint64_t max_fields, uint64_t *n_fields,
                          char *err, uint64_t err_len);

#endif
