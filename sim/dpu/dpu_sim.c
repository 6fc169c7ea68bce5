/* DPU simulator entry points: argument checks, a static pass over the stream, then the
 * discrete-event scheduler of the four units and their DPON/DPBY token FIFOs, with per-range
 * statistics. The model is documented in dpu_sim.h and in python/tvm_dpu/codegen.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/stats.h"
#include "common/tokens.h"
#include "common/trace.h"
#include "dpu/dpu_internal.h"

uint64_t dpu_sim_config_size(void) { return sizeof(dpu_sim_config); }
uint64_t dpu_sim_stats_size(void) { return sizeof(dpu_sim_stats); }

/* Instruction ranges (layers) of dpu_sim_run_ranges and what the run learns about each. */
typedef struct {
    const uint64_t *end; /* range r holds the instructions before end[r] */
    uint64_t n;
    dpu_sim_stats *stats;
    uint64_t *done, *cs, *ce, *conv_end; /* last completion; first CONV/MISC start, last end; last CONV end */
} dpu_ranges;

/* One run: the machine, the instruction queues of the units and the FIFOs between them. */
typedef struct {
    dpu_state s;
    accel_err err;
    accel_trace trace;
    const char *trace_path;
    double trace_offset_us;
    dpu_sim_stats *stats;
    dpu_ranges rg;
    accel_fifo fifo[DPU_NUM_UNITS][DPU_NUM_UNITS]; /* fifo[a][b]: tokens from unit a to unit b */
    const uint8_t *insns;
    uint64_t n;
    uint32_t *order; /* instruction indices grouped by unit */
    uint64_t start_of[DPU_NUM_UNITS], count[DPU_NUM_UNITS], pc[DPU_NUM_UNITS], free_at[DPU_NUM_UNITS];
    uint64_t end_max, cstart, cend; /* cstart / cend: first CONV/MISC start, last end */
    dpu_insn cur[DPU_NUM_UNITS];    /* next instruction of each unit */
} dpu_run;

static void mask_text(int64_t mask, char *buf, size_t len)
{
    size_t n = 0;
    int b;
    buf[0] = '\0';
    for (b = 0; b < DPU_NUM_UNITS; b++)
        if ((mask >> b) & 1) {
            int w = snprintf(buf + n, len - n, "%s%s", n ? "|" : "", DPU_UNIT_NAMES[b]);
            if (w > 0 && (size_t)w < len - n)
                n += (size_t)w;
        }
    if (!n)
        snprintf(buf, len, "-");
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

static int run_impl(dpu_run *r, const dpu_sim_config *cfg, uint64_t insn_bytes, int32_t trace_append);

/* Sets up a run (everything that needs no check); stats and range_stats are zeroed. */
static void init_run(dpu_run *r, const uint8_t *insns, uint8_t *ddr, uint64_t ddr_bytes, dpu_sim_stats *stats,
                     const uint64_t *range_end, uint64_t n_ranges, dpu_sim_stats *range_stats, const char *trace_path,
                     double trace_offset_us, char *errbuf, uint64_t err_len)
{
    memset(r, 0, sizeof(*r));
    accel_err_init(&r->err, errbuf, err_len);
    r->trace.f = NULL;
    memset(stats, 0, sizeof(*stats));
    if (n_ranges)
        memset(range_stats, 0, (size_t)n_ranges * sizeof(*range_stats));
    r->stats = stats;
    r->rg.end = range_end;
    r->rg.n = n_ranges;
    r->rg.stats = range_stats;
    r->insns = insns;
    r->s.ddr = ddr;
    r->s.ddr_bytes = ddr_bytes;
    r->trace_path = trace_path;
    r->trace_offset_us = trace_offset_us;
    r->cstart = UINT64_MAX;
}

int dpu_sim_run(const dpu_sim_config *cfg, const uint8_t *insns, uint64_t insn_bytes, uint8_t *ddr, uint64_t ddr_bytes,
                dpu_sim_stats *stats, const char *trace_path, double trace_offset_us, int32_t trace_append,
                char *errbuf, uint64_t err_len)
{
    dpu_run r;
    dpu_sim_stats local_stats;
    init_run(&r, insns, ddr, ddr_bytes, stats ? stats : &local_stats, NULL, 0, NULL, trace_path, trace_offset_us,
             errbuf, err_len);
    return run_impl(&r, cfg, insn_bytes, trace_append);
}

static int check_ranges(const uint64_t *range_end, uint64_t n_ranges, const dpu_sim_stats *range_stats, uint64_t n,
                        accel_err *err)
{
    uint64_t r;
    if (n_ranges == 0 || !range_end || !range_stats)
        return accel_fail(err, ACCEL_ERR_ARG, "no instruction ranges given (n_ranges = %llu)", (ull)n_ranges);
    if (n_ranges > n)
        return accel_fail(err, ACCEL_ERR_ARG, "%llu instruction ranges for a stream of %llu instructions",
                          (ull)n_ranges, (ull)n);
    for (r = 0; r < n_ranges; r++)
        if (range_end[r] == 0 || range_end[r] > n || (r > 0 && range_end[r] <= range_end[r - 1]))
            return accel_fail(err, ACCEL_ERR_ARG,
                              "instruction range %llu ends at %llu: range ends must increase strictly within 1..%llu",
                              (ull)r, (ull)range_end[r], (ull)n);
    if (range_end[n_ranges - 1] + 1 < n)
        return accel_fail(err, ACCEL_ERR_ARG,
                          "the instruction ranges end at %llu but the stream has %llu instructions (END excepted)",
                          (ull)range_end[n_ranges - 1], (ull)(n - 1));
    return ACCEL_OK;
}

int dpu_sim_run_ranges(const dpu_sim_config *cfg, const uint8_t *insns, uint64_t insn_bytes, uint8_t *ddr,
                       uint64_t ddr_bytes, dpu_sim_stats *stats, const uint64_t *range_end, uint64_t n_ranges,
                       dpu_sim_stats *range_stats, const char *trace_path, double trace_offset_us,
                       int32_t trace_append, char *errbuf, uint64_t err_len)
{
    dpu_run r;
    dpu_sim_stats local_stats;
    accel_err err;
    int rc;
    accel_err_init(&err, errbuf, err_len);
    if ((rc = check_ranges(range_end, n_ranges, range_stats, insn_bytes / INSN_BYTES, &err)) != ACCEL_OK)
        return rc;
    init_run(&r, insns, ddr, ddr_bytes, stats ? stats : &local_stats, range_end, n_ranges, range_stats, trace_path,
             trace_offset_us, errbuf, err_len);
    return run_impl(&r, cfg, insn_bytes, trace_append);
}

static int check_args(dpu_run *r, const dpu_sim_config *cfg, uint64_t insn_bytes)
{
    accel_err *err = &r->err;
    if (!cfg)
        return accel_fail(err, ACCEL_ERR_ARG, "no config given");
    if (insn_bytes % INSN_BYTES != 0)
        return accel_fail(err, ACCEL_ERR_ARG, "instruction stream of %llu bytes is not a multiple of %d",
                          (ull)insn_bytes, INSN_BYTES);
    if ((insn_bytes && !r->insns) || (r->s.ddr_bytes && !r->s.ddr))
        return accel_fail(err, ACCEL_ERR_ARG, "NULL instruction or DDR buffer");
    if (!isfinite(r->trace_offset_us))
        return accel_fail(err, ACCEL_ERR_ARG, "trace offset is not finite");
    r->n = insn_bytes / INSN_BYTES;
    if (r->n > UINT32_MAX)
        return accel_fail(err, ACCEL_ERR_ARG, "instruction stream of %llu instructions is too long", (ull)r->n);
    return dpu_check_config(cfg, &r->s.g, err);
}

/* Static pass: decode and check every instruction; count instructions per unit and pushes per FIFO. */
static int scan_stream(dpu_run *r, uint64_t pushes[DPU_NUM_UNITS][DPU_NUM_UNITS])
{
    uint64_t k;
    int end_seen = 0, b, rc;
    for (k = 0; k < r->n; k++) {
        dpu_insn in;
        if ((k & 4095) == 0 && accel_should_stop())
            return accel_fail(&r->err, ACCEL_ERR_INTERRUPTED, "interrupted while checking insn %llu", (ull)k);
        if ((rc = dpu_load_insn(&r->s.g, r->insns, k, r->s.ddr_bytes, &in, &r->err)) != ACCEL_OK)
            return rc;
        if (in.kind == K_END) {
            end_seen = 1;
            if (k + 1 != r->n)
                return accel_fail(&r->err, ACCEL_ERR_PROTOCOL,
                                  "insn %llu (END): END must be the last instruction, %llu more follow", (ull)k,
                                  (ull)(r->n - k - 1));
            continue;
        }
        r->count[in.unit]++;
        for (b = 0; b < DPU_NUM_UNITS; b++)
            if ((in.dpby >> b) & 1)
                pushes[in.unit][b]++;
    }
    if (!end_seen)
        return accel_fail(&r->err, ACCEL_ERR_PROTOCOL, "no END instruction at the end of the stream of %llu instructions",
                          (ull)r->n);
    return ACCEL_OK;
}

static int alloc_state(dpu_run *r, uint64_t pushes[DPU_NUM_UNITS][DPU_NUM_UNITS])
{
    dpu_ranges *rg = &r->rg;
    uint64_t k;
    int a, b;
    for (a = 0; a < DPU_NUM_UNITS; a++)
        for (b = 0; b < DPU_NUM_UNITS; b++)
            if (!accel_fifo_init(&r->fifo[a][b], pushes[a][b]))
                return accel_fail(&r->err, ACCEL_ERR_NOMEM, "out of host memory for the token FIFOs");
    if (rg->n) {
        rg->done = (uint64_t *)accel_calloc(rg->n, sizeof(uint64_t));
        rg->cs = (uint64_t *)accel_calloc(rg->n, sizeof(uint64_t));
        rg->ce = (uint64_t *)accel_calloc(rg->n, sizeof(uint64_t));
        rg->conv_end = (uint64_t *)accel_calloc(rg->n, sizeof(uint64_t));
        if (!rg->done || !rg->cs || !rg->ce || !rg->conv_end)
            return accel_fail(&r->err, ACCEL_ERR_NOMEM, "out of host memory for the instruction ranges");
        for (k = 0; k < rg->n; k++)
            rg->cs[k] = UINT64_MAX;
    }
    r->order = (uint32_t *)accel_calloc(r->n, sizeof(uint32_t));
    r->s.fm = (uint8_t *)accel_calloc((uint64_t)r->s.g.n_pe * r->s.g.n_mem, r->s.g.mem_bytes);
    r->s.pm = (uint8_t *)accel_calloc(r->s.g.pm_bytes, 1);
    if (!r->order || !r->s.fm || !r->s.pm)
        return accel_fail(&r->err, ACCEL_ERR_NOMEM, "out of host memory for the simulator state");
    return ACCEL_OK;
}

/* Groups the instruction indices by unit (each unit runs its own in stream order; END excluded). */
static void build_order(dpu_run *r)
{
    uint64_t fill[DPU_NUM_UNITS], k;
    int u;
    r->start_of[0] = 0;
    for (u = 1; u < DPU_NUM_UNITS; u++)
        r->start_of[u] = r->start_of[u - 1] + r->count[u - 1];
    memcpy(fill, r->start_of, sizeof(fill));
    for (k = 0; k + 1 < r->n; k++) {
        const uint8_t op = r->insns[INSN_BYTES * k] & 15;
        int unit = op == OP_LOAD ? DPU_UNIT_LOAD : op == OP_SAVE ? DPU_UNIT_SAVE : op == OP_CONV ? DPU_UNIT_CONV
                                                                                                : DPU_UNIT_MISC;
        r->order[fill[unit]++] = (uint32_t)k;
    }
}

static int open_trace(dpu_run *r, int32_t trace_append)
{
    int u, rc;
    if (!r->trace_path)
        return ACCEL_OK;
    if ((rc = accel_trace_open(&r->trace, r->trace_path, trace_append != 0, &r->err)) != ACCEL_OK)
        return rc;
    accel_trace_process_name(&r->trace, 0, "DPU");
    for (u = 0; u < DPU_NUM_UNITS; u++)
        accel_trace_thread_name(&r->trace, 0, u, DPU_UNIT_NAMES[u]);
    return ACCEL_OK;
}

/* Fetch: decodes and checks the next instruction of unit u into cur[u] (if it has one left). */
static int fetch(dpu_run *r, int u)
{
    if (r->pc[u] >= r->count[u])
        return ACCEL_OK;
    return dpu_load_insn(&r->s.g, r->insns, r->order[r->start_of[u] + r->pc[u]], r->s.ddr_bytes, &r->cur[u],
                         &r->err);
}

/* Dependency wait: the unit whose next instruction has a token in every DPON FIFO and starts
 * earliest (ties go to the lower unit), with its start cycle in *start; -1 when none is ready. */
static int pick_ready(const dpu_run *r, uint64_t *start)
{
    int best = -1, u, a;
    for (u = 0; u < DPU_NUM_UNITS; u++) {
        uint64_t t;
        int ready = 1;
        if (r->pc[u] >= r->count[u])
            continue;
        t = r->free_at[u];
        for (a = 0; a < DPU_NUM_UNITS; a++) {
            const accel_fifo *f = &r->fifo[a][u];
            if (!((r->cur[u].dpon >> a) & 1))
                continue;
            if (accel_fifo_empty(f)) {
                ready = 0;
                break;
            }
            if (accel_fifo_front(f) > t)
                t = accel_fifo_front(f);
        }
        if (ready && (best < 0 || t < *start)) {
            best = u;
            *start = t;
        }
    }
    return best;
}

static int all_done(const dpu_run *r)
{
    int u;
    for (u = 0; u < DPU_NUM_UNITS; u++)
        if (r->pc[u] < r->count[u])
            return 0;
    return 1;
}

/* "LOAD->CONV and MISC->CONV": the empty FIFOs unit u waits on. */
static void waits_text(const dpu_run *r, int u, char *waits, size_t size)
{
    size_t wl = 0;
    int a;
    waits[0] = '\0';
    for (a = 0; a < DPU_NUM_UNITS; a++)
        if (((r->cur[u].dpon >> a) & 1) && accel_fifo_empty(&r->fifo[a][u])) {
            int k2 = snprintf(waits + wl, size - wl, "%s%s->%s", wl ? " and " : "", DPU_UNIT_NAMES[a], DPU_UNIT_NAMES[u]);
            if (k2 > 0 && (size_t)k2 < size - wl)
                wl += (size_t)k2;
        }
}

/* No unit is ready and some are not done: names each unit's state and the FIFOs it waits on. */
static int report_deadlock(const dpu_run *r, accel_err *err)
{
    char msg[768];
    size_t len = 0;
    int u;
    msg[0] = '\0';
    for (u = 0; u < DPU_NUM_UNITS; u++) {
        int w;
        if (r->pc[u] >= r->count[u]) {
            w = snprintf(msg + len, sizeof(msg) - len, "%s%s done", len ? "; " : "", DPU_UNIT_NAMES[u]);
        } else {
            char waits[96];
            waits_text(r, u, waits, sizeof(waits));
            w = snprintf(msg + len, sizeof(msg) - len, "%s%s blocked at insn %u (%s) waiting on FIFO %s",
                         len ? "; " : "", DPU_UNIT_NAMES[u], r->cur[u].index, r->cur[u].name, waits);
        }
        if (w > 0)
            len += (size_t)w;
        if (len >= sizeof(msg))
            len = sizeof(msg) - 1;
    }
    return accel_fail(err, ACCEL_ERR_PROTOCOL, "deadlock: %s", msg);
}

/* Issue: checks the cycle budget and executes cur[u] starting at `start`. */
static int issue(dpu_run *r, int u, uint64_t start)
{
    const dpu_insn *in = &r->cur[u];
    int rc = ACCEL_OK;
    if (in->dur > r->s.g.max_cycles - start)
        return accel_fail(&r->err, ACCEL_ERR_BUDGET,
                          "insn %u (%s): cycle budget of %llu cycles exceeded (starts at cycle %llu, takes %llu "
                          "cycles); raise max_cycles if the program is legitimate",
                          in->index, in->name, (ull)r->s.g.max_cycles, (ull)start, (ull)in->dur);
    if (accel_should_stop() || (!in->noop && (rc = dpu_exec(&r->s, in, &r->err)) != ACCEL_OK)) {
        if (rc == ACCEL_OK || rc == ACCEL_ERR_INTERRUPTED)
            rc = accel_interrupted(&r->err, "insn", in->index, in->noop ? "NOP" : in->name, start);
        return rc;
    }
    return ACCEL_OK;
}

/* Takes the DPON tokens and pushes the DPBY tokens of cur[u]; returns the producer whose token
 * made the instruction wait last (-1: none). */
static int pass_tokens(dpu_run *r, int u, uint64_t start, uint64_t end)
{
    const dpu_insn *in = &r->cur[u];
    int a, b, last_src = -1;
    for (a = 0; a < DPU_NUM_UNITS; a++)
        if ((in->dpon >> a) & 1) {
            accel_fifo *f = &r->fifo[a][u];
            if (accel_fifo_front(f) == start && start > r->free_at[u])
                last_src = a;
            accel_fifo_pop(f);
        }
    for (b = 0; b < DPU_NUM_UNITS; b++)
        if ((in->dpby >> b) & 1) {
            accel_fifo_push(&r->fifo[u][b], end);
            r->stats->tokens++;
        }
    return last_src;
}

/* The statistics of the range holding cur[u]. */
static void count_range(dpu_run *r, int u, uint64_t start, uint64_t end, int last_src)
{
    const dpu_insn *in = &r->cur[u];
    dpu_ranges *rg = &r->rg;
    uint64_t k = range_of(rg->end, rg->n, in->index);
    int b;
    if ((u == DPU_UNIT_CONV || u == DPU_UNIT_MISC) && !in->noop) {
        if (start < rg->cs[k])
            rg->cs[k] = start;
        if (end > rg->ce[k])
            rg->ce[k] = end;
        if (u == DPU_UNIT_CONV && end > rg->conv_end[k])
            rg->conv_end[k] = end;
    }
    count_insn(&rg->stats[k], in, u, start, r->free_at[u], last_src);
    for (b = 0; b < DPU_NUM_UNITS; b++)
        if ((in->dpby >> b) & 1)
            rg->stats[k].tokens++;
    if (end > rg->done[k])
        rg->done[k] = end;
}

static void trace_insn(dpu_run *r, int u, uint64_t start)
{
    const dpu_insn *in = &r->cur[u];
    char args[192], on[32], by[32];
    mask_text(in->dpon, on, sizeof(on));
    mask_text(in->dpby, by, sizeof(by));
    if (in->kind == K_CONV && !in->noop)
        snprintf(args, sizeof(args), "{\"insn\": %u, \"cycles\": %llu, \"dpon\": \"%s\", \"dpby\": \"%s\", "
                 "\"macs\": %llu}", in->index, (ull)in->dur, on, by, (ull)in->macs);
    else
        snprintf(args, sizeof(args), "{\"insn\": %u, \"cycles\": %llu, \"dpon\": \"%s\", \"dpby\": \"%s\"}",
                 in->index, (ull)in->dur, on, by);
    accel_trace_complete(&r->trace, in->noop ? "NOP" : in->name, 0, u,
                         r->trace_offset_us + (double)start / r->s.g.clock_mhz, (double)in->dur / r->s.g.clock_mhz,
                         args);
}

/* Retire: passes the tokens, counts cur[u] in the run's and its range's statistics, traces it. */
static void retire(dpu_run *r, int u, uint64_t start)
{
    const dpu_insn *in = &r->cur[u];
    const uint64_t end = start + in->dur;
    int last_src = pass_tokens(r, u, start, end);
    count_insn(r->stats, in, u, start, r->free_at[u], last_src);
    if ((u == DPU_UNIT_CONV || u == DPU_UNIT_MISC) && !in->noop) {
        if (start < r->cstart)
            r->cstart = start;
        if (end > r->cend)
            r->cend = end;
    }
    if (r->rg.n)
        count_range(r, u, start, end, last_src);
    r->free_at[u] = end;
    if (end > r->end_max)
        r->end_max = end;
    r->stats->cycles = r->end_max;
    if (r->trace.f)
        trace_insn(r, u, start);
    r->pc[u]++;
}

/* Discrete-event loop: run the ready unit whose next instruction starts earliest. */
static int event_loop(dpu_run *r)
{
    int u, rc;
    for (u = 0; u < DPU_NUM_UNITS; u++)
        if ((rc = fetch(r, u)) != ACCEL_OK)
            return rc;
    for (;;) {
        uint64_t start = 0;
        u = pick_ready(r, &start);
        if (u < 0)
            return all_done(r) ? ACCEL_OK : report_deadlock(r, &r->err);
        if ((rc = issue(r, u, start)) != ACCEL_OK)
            return rc;
        retire(r, u, start);
        if ((rc = fetch(r, u)) != ACCEL_OK)
            return rc;
    }
}

/* Every unit drained; the FIFOs must be empty too. */
static int check_drained(dpu_run *r)
{
    char msg[768];
    size_t len = 0;
    int a, b;
    msg[0] = '\0';
    for (a = 0; a < DPU_NUM_UNITS; a++)
        for (b = 0; b < DPU_NUM_UNITS; b++) {
            uint64_t left = accel_fifo_left(&r->fifo[a][b]);
            if (left) {
                int w = snprintf(msg + len, sizeof(msg) - len, "%s%llu token%s left in FIFO %s->%s", len ? ", " : "",
                                 (ull)left, left == 1 ? "" : "s", DPU_UNIT_NAMES[a], DPU_UNIT_NAMES[b]);
                if (w > 0)
                    len += (size_t)w;
                if (len >= sizeof(msg))
                    len = sizeof(msg) - 1;
            }
        }
    if (len)
        return accel_fail(&r->err, ACCEL_ERR_PROTOCOL,
                          "unbalanced dependencies: %s (every DPBY push needs a DPON pop of the other unit)", msg);
    return ACCEL_OK;
}

/* A range's cycles: from the completion of everything before it to the completion of its own last
 * instruction (marginal cycles: a range overlapping its predecessor's tail is charged only what it adds).
 * Boundary b[r] between ranges r-1 and r: when range r's first CONV / MISC starts, but not before
 * b[r-1] nor before the last CONV of the earlier ranges ends; b[0] = 0, b[n] = the run's cycles.
 * A range is charged [b[r], b[r+1]): the LOADs it issued during its predecessor's tail are hidden
 * there, and its CONVs (in order on one unit) lie inside its window. */
static void range_cycles(dpu_run *r)
{
    const dpu_ranges *rg = &r->rg;
    const uint64_t cycles = r->stats->cycles;
    uint64_t b = 0, conv_end = 0, k;
    for (k = 0; k < rg->n; k++) {
        dpu_sim_stats *st = &rg->stats[k];
        uint64_t next = cycles;
        if (rg->conv_end[k] > conv_end)
            conv_end = rg->conv_end[k];
        if (k + 1 < rg->n) {
            next = rg->cs[k + 1] == UINT64_MAX ? b : rg->cs[k + 1];
            if (next < b)
                next = b;
            if (next < conv_end)
                next = conv_end;
            if (next > cycles)
                next = cycles;
        }
        st->cycles = next - b;
        if (rg->cs[k] == UINT64_MAX) {
            st->head_cycles = next - b;
        } else {
            st->head_cycles = rg->cs[k] > b ? (rg->cs[k] < next ? rg->cs[k] : next) - b : 0;
            st->tail_cycles = rg->ce[k] < next ? next - (rg->ce[k] > b ? rg->ce[k] : b) : 0;
        }
        b = next;
    }
}

/* Closes the trace (its write error is the result of an otherwise successful run) and frees. */
static int finish(dpu_run *r, int rc)
{
    int a, b;
    if (r->trace.f) {
        int trc = accel_trace_close(&r->trace, r->trace_path, &r->err);
        if (rc == ACCEL_OK)
            rc = trc;
    }
    free(r->order);
    free(r->rg.done);
    free(r->rg.cs);
    free(r->rg.ce);
    free(r->rg.conv_end);
    free(r->s.fm);
    free(r->s.pm);
    dpu_free_scratch(&r->s);
    for (a = 0; a < DPU_NUM_UNITS; a++)
        for (b = 0; b < DPU_NUM_UNITS; b++)
            accel_fifo_free(&r->fifo[a][b]);
    return rc;
}

static int run_impl(dpu_run *r, const dpu_sim_config *cfg, uint64_t insn_bytes, int32_t trace_append)
{
    uint64_t pushes[DPU_NUM_UNITS][DPU_NUM_UNITS];
    int rc;
    memset(pushes, 0, sizeof(pushes));
    if ((rc = check_args(r, cfg, insn_bytes)) != ACCEL_OK || (rc = scan_stream(r, pushes)) != ACCEL_OK)
        return rc;
    if ((rc = alloc_state(r, pushes)) != ACCEL_OK)
        return finish(r, rc);
    build_order(r);
    if ((rc = open_trace(r, trace_append)) != ACCEL_OK || (rc = event_loop(r)) != ACCEL_OK)
        return finish(r, rc);
    rc = check_drained(r);
    if (r->rg.n)
        range_cycles(r);
    r->stats->head_cycles = r->cstart == UINT64_MAX ? r->stats->cycles : r->cstart;
    r->stats->tail_cycles = r->cstart == UINT64_MAX ? 0 : r->stats->cycles - r->cend;
    return finish(r, rc);
}
