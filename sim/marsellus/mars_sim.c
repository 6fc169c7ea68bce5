/* MARSELLUS simulator entry point: argument checks, a static pass decoding every command, then the
 * discrete-event scheduler of the five engines with semaphore tokens, statistics and Chrome trace
 * (see mars_sim.h). */
#include <math.h>
#include <stdio.h>

#include "common/stats.h"
#include "common/tokens.h"
#include "common/trace.h"
#include "marsellus/mars_internal.h"

static const char *const ENGINE_NAMES[MARS_NUM_ENGINES] = {"IODMA", "DMA_IN", "DMA_OUT", "RBE",
                                                           "CLUSTER"};

uint64_t mars_sim_config_size(void) { return sizeof(mars_config); }
uint64_t mars_sim_stats_size(void) { return sizeof(mars_stats); }

/* Every entry point taking a config calls this first (mars_internal.h): a config built without the
 * Python validation must end in ACCEL_ERR_CONFIG, never in a loop, an overflow or a division by 0.
 * rbe_cores is range-checked before the square root search, which then runs at most 4 steps. */
int mars_check_config(const mars_config *c, accel_err *e)
{
    int P = 1;
    if (c->rbe_cores < 1 || c->rbe_cores > 16)
        return accel_fail(e, ACCEL_ERR_CONFIG, "config: rbe_cores %d is not a square in 1..16", c->rbe_cores);
    while ((P + 1) * (P + 1) <= c->rbe_cores)
        P++;
    if (P * P != c->rbe_cores)
        return accel_fail(e, ACCEL_ERR_CONFIG, "config: rbe_cores %d is not a square in 1..16", c->rbe_cores);
    if (c->rbe_binconvs < 1 || c->rbe_binconvs > 8 || c->rbe_port_bits < 32 || c->rbe_port_bits > 1024 ||
        c->rbe_queue_depth < 1 || c->rbe_min_bits < 1 || c->rbe_max_bits > 8 ||
        c->rbe_min_bits > c->rbe_max_bits || c->cluster_cores < 1 || c->rbe_nq_cycles_per_group < 1)
        return accel_fail(e, ACCEL_ERR_CONFIG, "config: RBE/cluster geometry outside the supported limits");
    if (c->rbe_load_latency < 0 || c->rbe_kout_overhead < 0 || c->rbe_compute_latency < 0 ||
        c->rbe_job_setup < 0 || c->cl_kernel_overhead < 0 || c->dma_latency < 0 ||
        c->dma_row_overhead < 0 || c->l3_latency < 0)
        return accel_fail(e, ACCEL_ERR_CONFIG, "config: negative latency");
    {
        double v[] = {c->clock_mhz, c->dma_bytes_per_cycle, c->l3_bytes_per_cycle, c->cl_matmul_8b,
                      c->cl_macload_speedup, c->cl_4b_speedup, c->cl_2b_speedup, c->cl_dw_macs,
                      c->cl_fc_efficiency, c->cl_im2col_bytes, c->cl_nq_cycles_per_output,
                      c->cl_eltwise_elems, c->cl_pool_taps, c->cl_marshal_bits, c->cl_lut_cycles};
        for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
            if (!(v[i] > 0 && v[i] < 1e9))
                return accel_fail(e, ACCEL_ERR_CONFIG, "config: rate %zu is %g, must be positive", i, v[i]);
    }
    return ACCEL_OK;
}

typedef unsigned long long ull;

/* One run: the decoded commands, each engine's queue, the semaphores and the RBE job contexts. */
typedef struct {
    const mars_config *cfg;
    accel_err e;
    accel_trace tr;
    int tracing;
    const char *trace_path;
    double trace_offset_us, us_per_cycle;
    mars_stats *stats;
    mars_mems mem;
    mars_rbe_cache own_cache, *rbe_cache; /* unpacked RBE weights between jobs */
    mars_cmd *cs;
    uint64_t n, budget;
    uint64_t *queue; /* command indices grouped by engine */
    uint64_t qlen[MARS_NUM_ENGINES], qpos[MARS_NUM_ENGINES], qbase[MARS_NUM_ENGINES], free_t[MARS_NUM_ENGINES];
    accel_sem sems[MARS_NUM_SEMS];
    uint64_t rbe_end[16], rbe_jobs; /* completion of the last 16 RBE jobs (context reuse) */
} mars_run;

static int check_args(mars_run *r, const uint8_t *cmds, uint64_t n_bytes, uint8_t *l3, uint64_t l3_size, uint8_t *l2,
                      uint64_t l2_size, uint8_t *l1, uint64_t l1_size)
{
    if (!r->cfg || !r->stats || (!cmds && n_bytes))
        return accel_fail(&r->e, ACCEL_ERR_ARG, "NULL argument");
    memset(r->stats, 0, sizeof(*r->stats));
    if (mars_check_config(r->cfg, &r->e))
        return r->e.code;
    if (n_bytes % MARS_CMD_BYTES)
        return accel_fail(&r->e, ACCEL_ERR_ARG, "command stream of %llu bytes is not a multiple of %d", (ull)n_bytes,
                          MARS_CMD_BYTES);
    if ((!l3 && l3_size) || (!l2 && l2_size) || (!l1 && l1_size))
        return accel_fail(&r->e, ACCEL_ERR_ARG, "NULL memory with a non-zero size");
    r->n = n_bytes / MARS_CMD_BYTES;
    if (r->n == 0)
        return accel_fail(&r->e, ACCEL_ERR_DECODE, "empty command stream (no END)");
    r->mem.mem[MARS_MEM_L3] = l3;
    r->mem.mem[MARS_MEM_L2] = l2;
    r->mem.mem[MARS_MEM_L1] = l1;
    r->mem.size[MARS_MEM_L3] = l3_size;
    r->mem.size[MARS_MEM_L2] = l2_size;
    r->mem.size[MARS_MEM_L1] = l1_size;
    r->budget = r->cfg->max_cycles ? r->cfg->max_cycles : ACCEL_DEFAULT_MAX_CYCLES;
    if (r->budget > ACCEL_MAX_MAX_CYCLES)
        r->budget = ACCEL_MAX_MAX_CYCLES;
    r->us_per_cycle = 1.0 / r->cfg->clock_mhz;
    return ACCEL_OK;
}

/* Static pass: decode and check every command; count commands per engine and signals per
 * semaphore. */
static int scan_stream(mars_run *r, const uint8_t *cmds, uint64_t sem_cap[MARS_NUM_SEMS])
{
    for (uint64_t i = 0; i < r->n; i++) {
        mars_cmd *c = &r->cs[i];
        if ((i & 4095) == 0 && accel_should_stop())
            return accel_fail(&r->e, ACCEL_ERR_INTERRUPTED, "interrupted while checking cmd %llu", (ull)i);
        if (mars_decode(r->cfg, cmds + i * MARS_CMD_BYTES, i, &r->mem, c, &r->e))
            return r->e.code;
        if ((c->op == MARS_OP_END) != (i == r->n - 1))
            return accel_fail(&r->e, ACCEL_ERR_DECODE, i == r->n - 1 ? "cmd %llu: the stream must end with END"
                                                                     : "cmd %llu (END): END before the last command",
                              (ull)i);
        if (c->engine >= 0) {
            r->qlen[c->engine]++;
            for (int s = 0; s < MARS_NUM_SEMS; s++)
                if (c->signal >> s & 1)
                    sem_cap[s]++;
        }
    }
    return ACCEL_OK;
}

/* Sizes the semaphores and groups the command indices by engine. */
static int build_queues(mars_run *r, const uint64_t sem_cap[MARS_NUM_SEMS])
{
    uint64_t fill[MARS_NUM_ENGINES] = {0};
    for (int s = 0; s < MARS_NUM_SEMS; s++)
        if (!accel_sem_init(&r->sems[s], sem_cap[s]))
            return accel_fail(&r->e, ACCEL_ERR_NOMEM, "cannot allocate semaphore %d", s);
    for (int q = 1; q < MARS_NUM_ENGINES; q++)
        r->qbase[q] = r->qbase[q - 1] + r->qlen[q - 1];
    for (uint64_t i = 0; i < r->n; i++)
        if (r->cs[i].engine >= 0)
            r->queue[r->qbase[r->cs[i].engine] + fill[r->cs[i].engine]++] = i;
    return ACCEL_OK;
}

static int open_trace(mars_run *r, int32_t trace_append)
{
    if (!r->trace_path)
        return ACCEL_OK;
    if (accel_trace_open(&r->tr, r->trace_path, trace_append, &r->e))
        return r->e.code;
    r->tracing = 1;
    accel_trace_process_name(&r->tr, 1, "MARSELLUS CLUSTER");
    for (int q = 0; q < MARS_NUM_ENGINES; q++)
        accel_trace_thread_name(&r->tr, 1, q, ENGINE_NAMES[q]);
    return ACCEL_OK;
}

/* Index of the next command of engine q. */
static uint64_t next_cmd(const mars_run *r, int q) { return r->queue[r->qbase[q] + r->qpos[q]]; }

/* Dependency wait: the engine whose next command has a token in every semaphore it waits on and
 * starts earliest (ties go to the lower engine), with its start cycle in *start and the arrival
 * of its last token in *ready_at; -1 when none is ready. */
static int pick_ready(const mars_run *r, uint64_t *start, uint64_t *ready_at)
{
    int best = -1;
    for (int q = 0; q < MARS_NUM_ENGINES; q++) {
        const mars_cmd *c;
        uint64_t t, tok = 0;
        int ready = 1;
        if (r->qpos[q] == r->qlen[q])
            continue;
        c = &r->cs[next_cmd(r, q)];
        for (int s = 0; s < MARS_NUM_SEMS; s++)
            if (c->wait >> s & 1) {
                if (accel_sem_empty(&r->sems[s])) {
                    ready = 0;
                    break;
                }
                if (accel_sem_front(&r->sems[s]) > tok)
                    tok = accel_sem_front(&r->sems[s]);
            }
        t = tok > r->free_t[q] ? tok : r->free_t[q];
        if (ready && (best < 0 || t < *start)) {
            best = q;
            *start = t;
            *ready_at = tok;
        }
    }
    return best;
}

/* No engine is ready: a deadlock if some engine still has commands (names what each waits on). */
static int report_blocked(mars_run *r)
{
    int blocked = 0;
    char msg[512];
    size_t off = 0;
    msg[0] = '\0';
    for (int q = 0; q < MARS_NUM_ENGINES; q++) {
        if (r->qpos[q] == r->qlen[q])
            continue;
        uint64_t ci = next_cmd(r, q);
        int s = 0;
        while (s < MARS_NUM_SEMS && !((r->cs[ci].wait >> s & 1) && accel_sem_empty(&r->sems[s])))
            s++;
        blocked = 1;
        if (off < sizeof(msg))
            off += (size_t)snprintf(msg + off, sizeof(msg) - off, "%s%s at cmd %llu (%s) waits on sem %d",
                                    off ? "; " : "", ENGINE_NAMES[q], (ull)ci, mars_cmd_name(&r->cs[ci]), s);
    }
    if (blocked)
        return accel_fail(&r->e, ACCEL_ERR_PROTOCOL, "deadlock: %s", msg);
    return ACCEL_OK;
}

/* When an RBE job begins: a core writes the job registers (setup) once the job's inputs are ready
 * and a context is free (job j may be written when job j - depth has completed); it runs when the
 * engine is free and its registers are written. */
static uint64_t rbe_begin(const mars_run *r, int q, uint64_t ready_at)
{
    uint64_t depth = (uint64_t)r->cfg->rbe_queue_depth;
    uint64_t slot = r->rbe_jobs >= depth ? r->rbe_end[(r->rbe_jobs - depth) % 16] : 0;
    uint64_t prog = ready_at > slot ? ready_at : slot;
    uint64_t t = accel_sat_add(prog, (uint64_t)r->cfg->rbe_job_setup);
    return t > r->free_t[q] ? t : r->free_t[q];
}

/* Issue: takes the tokens, times the command (begin, end) and executes it. */
static int issue(mars_run *r, int q, uint64_t ci, uint64_t start, uint64_t ready_at, uint64_t *begin, uint64_t *end)
{
    const mars_cmd *c = &r->cs[ci];
    int rc = ACCEL_OK;
    for (int s = 0; s < MARS_NUM_SEMS; s++)
        if (c->wait >> s & 1)
            accel_sem_pop(&r->sems[s]);
    *begin = c->op == MARS_OP_RBE ? rbe_begin(r, q, ready_at) : start;
    *end = accel_sat_add(*begin, c->op == MARS_OP_NOP ? 0 : c->cycles);
    if (*end > r->budget)
        return accel_fail(&r->e, ACCEL_ERR_BUDGET, "cmd %llu (%s) on %s: cycle budget of %llu exceeded "
                          "(it would end at cycle %llu)", (ull)ci, mars_cmd_name(c), ENGINE_NAMES[q],
                          (ull)r->budget, (ull)*end);
    if (accel_should_stop() || (rc = mars_exec(r->cfg, c, ci, &r->mem, r->rbe_cache, &r->e)) != ACCEL_OK) {
        if (rc == ACCEL_OK || rc == ACCEL_ERR_INTERRUPTED)
            return accel_interrupted(&r->e, "cmd", ci, mars_cmd_name(c), *begin);
        return r->e.code;
    }
    return ACCEL_OK;
}

static void count_cmd(mars_stats *st, const mars_cmd *c, int q, uint64_t start, uint64_t end, uint64_t setup,
                      uint64_t free_t)
{
    st->stall[q] += start > free_t ? start - free_t : 0;
    st->busy[q] += end - start;
    st->cmds[q]++;
    if (c->op == MARS_OP_RBE) {
        for (int i = 0; i < 4; i++)
            st->rbe_phase[i] += c->phases[i];
        st->rbe_phase[MARS_RBE_SETUP] += setup;
        st->rbe_macs += c->macs;
        st->rbe_bin_ops += 2 * c->macs * (uint64_t)(c->in_bits * c->w_bits);
    } else if (c->op == MARS_OP_CLUSTER) {
        st->cluster_macs += c->macs;
        st->cluster_elems += c->elems;
    }
    st->l3_read_bytes += c->rd_bytes[MARS_MEM_L3];
    st->l2_read_bytes += c->rd_bytes[MARS_MEM_L2];
    st->l1_read_bytes += c->rd_bytes[MARS_MEM_L1];
    st->l3_write_bytes += c->wr_bytes[MARS_MEM_L3];
    st->l2_write_bytes += c->wr_bytes[MARS_MEM_L2];
    st->l1_write_bytes += c->wr_bytes[MARS_MEM_L1];
}

static void trace_cmd(mars_run *r, int q, uint64_t ci, uint64_t start, uint64_t end, uint64_t setup)
{
    const mars_cmd *c = &r->cs[ci];
    char args[256];
    if (c->op == MARS_OP_RBE)
        snprintf(args, sizeof(args), "{\"cmd\": %llu, \"setup\": %llu, \"load\": %llu, "
                 "\"compute\": %llu, \"normquant\": %llu, \"streamout\": %llu}",
                 (ull)ci, (ull)setup, (ull)c->phases[0], (ull)c->phases[1], (ull)c->phases[2], (ull)c->phases[3]);
    else
        snprintf(args, sizeof(args), "{\"cmd\": %llu, \"cycles\": %llu}", (ull)ci, (ull)(end - start));
    accel_trace_complete(&r->tr, mars_cmd_name(c), 1, q, r->trace_offset_us + (double)start * r->us_per_cycle,
                         (double)(end - start) * r->us_per_cycle, args);
}

/* Retire: signals the semaphores with the completion time, counts and traces the command. */
static void retire(mars_run *r, int q, uint64_t ci, uint64_t start, uint64_t begin, uint64_t end)
{
    const mars_cmd *c = &r->cs[ci];
    const uint64_t setup = begin - start;
    count_cmd(r->stats, c, q, start, end, setup, r->free_t[q]);
    for (int s = 0; s < MARS_NUM_SEMS; s++)
        if (c->signal >> s & 1)
            accel_sem_push(&r->sems[s], end);
    r->free_t[q] = end;
    if (c->op == MARS_OP_RBE)
        r->rbe_end[r->rbe_jobs++ % 16] = end;
    if (end > r->stats->cycles)
        r->stats->cycles = end;
    r->qpos[q]++;
    if (r->tracing && end > start)
        trace_cmd(r, q, ci, start, end, setup);
}

/* Discrete-event loop: run the ready engine whose next command starts earliest. */
static int event_loop(mars_run *r)
{
    for (;;) {
        uint64_t start = 0, ready_at = 0, begin = 0, end = 0, ci;
        int q = pick_ready(r, &start, &ready_at), rc;
        if (q < 0)
            return report_blocked(r);
        ci = next_cmd(r, q);
        if ((rc = issue(r, q, ci, start, ready_at, &begin, &end)) != ACCEL_OK)
            return rc;
        retire(r, q, ci, start, begin, end);
    }
}

int mars_sim_run(const mars_config *cfg, const uint8_t *cmds, uint64_t n_bytes, uint8_t *l3,
                 uint64_t l3_size, uint8_t *l2, uint64_t l2_size, uint8_t *l1, uint64_t l1_size,
                 mars_stats *stats, const char *trace_path, double trace_offset_us,
                 int32_t trace_append, char *err, uint64_t err_len)
{
    mars_run r;
    uint64_t sem_cap[MARS_NUM_SEMS] = {0};
    int rc;

    memset(&r, 0, sizeof(r));
    accel_err_init(&r.e, err, err_len);
    r.tr.f = NULL;
    r.cfg = cfg;
    r.stats = stats;
    r.trace_path = trace_path;
    r.trace_offset_us = trace_offset_us;
    if ((rc = check_args(&r, cmds, n_bytes, l3, l3_size, l2, l2_size, l1, l1_size)) != ACCEL_OK)
        return rc;
    r.rbe_cache = mars_rbe_cache_acquire(&r.own_cache);
    r.cs = accel_calloc(r.n, sizeof(mars_cmd));
    r.queue = accel_calloc(r.n, sizeof(uint64_t));
    if (!r.cs || !r.queue)
        rc = accel_fail(&r.e, ACCEL_ERR_NOMEM, "cannot allocate %llu commands", (ull)r.n);
    if (rc == ACCEL_OK && (rc = scan_stream(&r, cmds, sem_cap)) == ACCEL_OK &&
        (rc = build_queues(&r, sem_cap)) == ACCEL_OK && (rc = open_trace(&r, trace_append)) == ACCEL_OK)
        rc = event_loop(&r);
    if (r.tracing) {
        int trc = accel_trace_close(&r.tr, trace_path, &r.e);
        if (rc == ACCEL_OK)
            rc = trc;
    }
    for (int s = 0; s < MARS_NUM_SEMS; s++)
        accel_sem_free(&r.sems[s]);
    mars_rbe_cache_release(r.rbe_cache, &r.own_cache);
    free(r.cs);
    free(r.queue);
    return rc;
}
