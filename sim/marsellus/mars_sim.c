/* MARSELLUS simulator: argument checks, decoding, discrete-event scheduling of the five engines
 * with semaphore tokens, statistics and Chrome trace (see mars_sim.h). */
#include <math.h>
#include <stdio.h>

#include "common/stats.h"
#include "common/trace.h"
#include "marsellus/mars_internal.h"

static const char *const ENGINE_NAMES[MARS_NUM_ENGINES] = {"IODMA", "DMA_IN", "DMA_OUT", "RBE",
                                                           "CLUSTER"};

uint64_t mars_sim_config_size(void) { return sizeof(mars_config); }
uint64_t mars_sim_stats_size(void) { return sizeof(mars_stats); }

/* A semaphore: binary min-heap of token times. */
typedef struct {
    uint64_t *t;
    uint64_t n, cap;
} sem_heap;

static void heap_push(sem_heap *h, uint64_t v)
{
    uint64_t i = h->n++;
    h->t[i] = v;
    while (i > 0) {
        uint64_t p = (i - 1) / 2;
        if (h->t[p] <= h->t[i])
            break;
        uint64_t tmp = h->t[p];
        h->t[p] = h->t[i];
        h->t[i] = tmp;
        i = p;
    }
}

static uint64_t heap_pop(sem_heap *h)
{
    uint64_t top = h->t[0], i = 0;
    h->t[0] = h->t[--h->n];
    for (;;) {
        uint64_t l = 2 * i + 1, r = l + 1, s = i;
        if (l < h->n && h->t[l] < h->t[s])
            s = l;
        if (r < h->n && h->t[r] < h->t[s])
            s = r;
        if (s == i)
            break;
        uint64_t tmp = h->t[s];
        h->t[s] = h->t[i];
        h->t[i] = tmp;
        i = s;
    }
    return top;
}

static int check_config(const mars_config *c, accel_err *e)
{
    int P = 1;
    while ((P + 1) * (P + 1) <= c->rbe_cores)
        P++;
    if (c->rbe_cores < 1 || c->rbe_cores > 16 || P * P != c->rbe_cores)
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
                      c->cl_eltwise_elems, c->cl_pool_taps, c->cl_marshal_bits};
        for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
            if (!(v[i] > 0 && v[i] < 1e9))
                return accel_fail(e, ACCEL_ERR_CONFIG, "config: rate %zu is %g, must be positive", i, v[i]);
    }
    return ACCEL_OK;
}

int mars_sim_run(const mars_config *cfg, const uint8_t *cmds, uint64_t n_bytes, uint8_t *l3,
                 uint64_t l3_size, uint8_t *l2, uint64_t l2_size, uint8_t *l1, uint64_t l1_size,
                 mars_stats *stats, const char *trace_path, double trace_offset_us,
                 int32_t trace_append, char *err, uint64_t err_len)
{
    accel_err e;
    accel_trace tr;
    mars_mems mem;
    mars_cmd *cs = NULL;
    uint64_t n, *queue = NULL, qlen[MARS_NUM_ENGINES] = {0}, qpos[MARS_NUM_ENGINES] = {0};
    uint64_t qbase[MARS_NUM_ENGINES] = {0}, free_t[MARS_NUM_ENGINES] = {0};
    uint64_t sem_cap[MARS_NUM_SEMS] = {0}, budget;
    sem_heap sems[MARS_NUM_SEMS];
    int rc = ACCEL_OK, tracing = 0;
    uint64_t rbe_end[16] = {0}, rbe_jobs = 0, best_ready = 0;
    double us_per_cycle;

    accel_err_init(&e, err, err_len);
    memset(sems, 0, sizeof(sems));
    tr.f = NULL;
    if (!cfg || !stats || (!cmds && n_bytes))
        return accel_fail(&e, ACCEL_ERR_ARG, "NULL argument");
    memset(stats, 0, sizeof(*stats));
    if (check_config(cfg, &e))
        return e.code;
    if (n_bytes % MARS_CMD_BYTES)
        return accel_fail(&e, ACCEL_ERR_ARG, "command stream of %llu bytes is not a multiple of %d",
                          (unsigned long long)n_bytes, MARS_CMD_BYTES);
    if ((!l3 && l3_size) || (!l2 && l2_size) || (!l1 && l1_size))
        return accel_fail(&e, ACCEL_ERR_ARG, "NULL memory with a non-zero size");
    n = n_bytes / MARS_CMD_BYTES;
    if (n == 0)
        return accel_fail(&e, ACCEL_ERR_DECODE, "empty command stream (no END)");
    mem.mem[MARS_MEM_L3] = l3;
    mem.mem[MARS_MEM_L2] = l2;
    mem.mem[MARS_MEM_L1] = l1;
    mem.size[MARS_MEM_L3] = l3_size;
    mem.size[MARS_MEM_L2] = l2_size;
    mem.size[MARS_MEM_L1] = l1_size;
    budget = cfg->max_cycles ? cfg->max_cycles : ACCEL_DEFAULT_MAX_CYCLES;
    if (budget > ACCEL_MAX_MAX_CYCLES)
        budget = ACCEL_MAX_MAX_CYCLES;
    us_per_cycle = 1.0 / cfg->clock_mhz;

    cs = accel_calloc(n, sizeof(mars_cmd));
    queue = accel_calloc(n, sizeof(uint64_t));
    if (!cs || !queue) {
        rc = accel_fail(&e, ACCEL_ERR_NOMEM, "cannot allocate %llu commands", (unsigned long long)n);
        goto out;
    }
    for (uint64_t i = 0; i < n; i++) {
        if ((i & 4095) == 0 && accel_should_stop()) {
            rc = accel_fail(&e, ACCEL_ERR_INTERRUPTED, "interrupted while checking cmd %llu", (unsigned long long)i);
            goto out;
        }
        if (mars_decode(cfg, cmds + i * MARS_CMD_BYTES, i, &mem, &cs[i], &e)) {
            rc = e.code;
            goto out;
        }
        if ((cs[i].op == MARS_OP_END) != (i == n - 1)) {
            rc = accel_fail(&e, ACCEL_ERR_DECODE, i == n - 1 ? "cmd %llu: the stream must end with END"
                                                             : "cmd %llu (END): END before the last command",
                            (unsigned long long)i);
            goto out;
        }
        if (cs[i].engine >= 0) {
            qlen[cs[i].engine]++;
            for (int s = 0; s < MARS_NUM_SEMS; s++)
                if (cs[i].signal >> s & 1)
                    sem_cap[s]++;
        }
    }
    for (int s = 0; s < MARS_NUM_SEMS; s++) {
        sems[s].t = accel_calloc(sem_cap[s] ? sem_cap[s] : 1, sizeof(uint64_t));
        sems[s].cap = sem_cap[s];
        if (!sems[s].t) {
            rc = accel_fail(&e, ACCEL_ERR_NOMEM, "cannot allocate semaphore %d", s);
            goto out;
        }
    }
    for (int q = 1; q < MARS_NUM_ENGINES; q++)
        qbase[q] = qbase[q - 1] + qlen[q - 1];
    {
        uint64_t fill[MARS_NUM_ENGINES] = {0};
        for (uint64_t i = 0; i < n; i++)
            if (cs[i].engine >= 0)
                queue[qbase[cs[i].engine] + fill[cs[i].engine]++] = i;
    }
    if (trace_path) {
        if (accel_trace_open(&tr, trace_path, trace_append, &e)) {
            rc = e.code;
            goto out;
        }
        tracing = 1;
        accel_trace_process_name(&tr, 1, "MARSELLUS CLUSTER");
        for (int q = 0; q < MARS_NUM_ENGINES; q++)
            accel_trace_thread_name(&tr, 1, q, ENGINE_NAMES[q]);
    }

    for (;;) {
        int best = -1;
        uint64_t best_start = 0;
        for (int q = 0; q < MARS_NUM_ENGINES; q++) {
            const mars_cmd *c;
            uint64_t start, tok = 0;
            int ready = 1;
            if (qpos[q] == qlen[q])
                continue;
            c = &cs[queue[qbase[q] + qpos[q]]];
            for (int s = 0; s < MARS_NUM_SEMS; s++)
                if (c->wait >> s & 1) {
                    if (!sems[s].n) {
                        ready = 0;
                        break;
                    }
                    if (sems[s].t[0] > tok)
                        tok = sems[s].t[0];
                }
            start = tok > free_t[q] ? tok : free_t[q];
            if (ready && (best < 0 || start < best_start)) {
                best = q;
                best_start = start;
                best_ready = tok;
            }
        }
        if (best < 0) {
            int blocked = 0;
            char msg[512];
            size_t off = 0;
            msg[0] = '\0';
            for (int q = 0; q < MARS_NUM_ENGINES; q++) {
                if (qpos[q] == qlen[q])
                    continue;
                uint64_t ci = queue[qbase[q] + qpos[q]];
                int s = 0;
                while (s < MARS_NUM_SEMS && !((cs[ci].wait >> s & 1) && !sems[s].n))
                    s++;
                blocked = 1;
                if (off < sizeof(msg))
                    off += (size_t)snprintf(msg + off, sizeof(msg) - off, "%s%s at cmd %llu (%s) waits on sem %d",
                                            off ? "; " : "", ENGINE_NAMES[q], (unsigned long long)ci,
                                            mars_cmd_name(&cs[ci]), s);
            }
            if (blocked)
                rc = accel_fail(&e, ACCEL_ERR_PROTOCOL, "deadlock: %s", msg);
            break;
        }
        {
            uint64_t ci = queue[qbase[best] + qpos[best]];
            const mars_cmd *c = &cs[ci];
            uint64_t start = best_start, begin, end, dur, setup = 0;
            for (int s = 0; s < MARS_NUM_SEMS; s++)
                if (c->wait >> s & 1)
                    heap_pop(&sems[s]);
            begin = start;
            if (c->op == MARS_OP_RBE) {
                /* a core writes the job registers (setup) once the job's inputs are ready and a
                 * context is free: job j may be written when job j - depth has completed; it
                 * runs when the engine is free and its registers are written */
                uint64_t depth = (uint64_t)cfg->rbe_queue_depth;
                uint64_t slot = rbe_jobs >= depth ? rbe_end[(rbe_jobs - depth) % 16] : 0;
                uint64_t prog = best_ready > slot ? best_ready : slot;
                uint64_t t = accel_sat_add(prog, (uint64_t)cfg->rbe_job_setup);
                begin = t > free_t[best] ? t : free_t[best];
                setup = begin - start;
            }
            dur = (c->op == MARS_OP_NOP) ? 0 : c->cycles;
            end = accel_sat_add(begin, dur);
            if (end > budget) {
                rc = accel_fail(&e, ACCEL_ERR_BUDGET, "cmd %llu (%s) on %s: cycle budget of %llu exceeded "
                                "(it would end at cycle %llu)", (unsigned long long)ci, mars_cmd_name(c),
                                ENGINE_NAMES[best], (unsigned long long)budget, (unsigned long long)end);
                break;
            }
            if (accel_should_stop() || (rc = mars_exec(cfg, c, ci, &mem, &e)) != ACCEL_OK) {
                if (rc == ACCEL_OK || rc == ACCEL_ERR_INTERRUPTED)
                    rc = accel_interrupted(&e, "cmd", ci, mars_cmd_name(c), begin);
                else
                    rc = e.code;
                break;
            }
            stats->stall[best] += start > free_t[best] ? start - free_t[best] : 0;
            stats->busy[best] += end - start;
            stats->cmds[best]++;
            if (c->op == MARS_OP_RBE) {
                for (int i = 0; i < 4; i++)
                    stats->rbe_phase[i] += c->phases[i];
                stats->rbe_phase[MARS_RBE_SETUP] += setup;
                stats->rbe_macs += c->macs;
                stats->rbe_bin_ops += 2 * c->macs * (uint64_t)(c->in_bits * c->w_bits);
            } else if (c->op == MARS_OP_CLUSTER) {
                stats->cluster_macs += c->macs;
                stats->cluster_elems += c->elems;
            }
            stats->l3_read_bytes += c->rd_bytes[MARS_MEM_L3];
            stats->l2_read_bytes += c->rd_bytes[MARS_MEM_L2];
            stats->l1_read_bytes += c->rd_bytes[MARS_MEM_L1];
            stats->l3_write_bytes += c->wr_bytes[MARS_MEM_L3];
            stats->l2_write_bytes += c->wr_bytes[MARS_MEM_L2];
            stats->l1_write_bytes += c->wr_bytes[MARS_MEM_L1];
            for (int s = 0; s < MARS_NUM_SEMS; s++)
                if (c->signal >> s & 1)
                    heap_push(&sems[s], end);
            free_t[best] = end;
            if (c->op == MARS_OP_RBE)
                rbe_end[rbe_jobs++ % 16] = end;
            if (end > stats->cycles)
                stats->cycles = end;
            qpos[best]++;
            if (tracing && end > start) {
                char args[256];
                if (c->op == MARS_OP_RBE)
                    snprintf(args, sizeof(args), "{\"cmd\": %llu, \"setup\": %llu, \"load\": %llu, "
                             "\"compute\": %llu, \"normquant\": %llu, \"streamout\": %llu}",
                             (unsigned long long)ci, (unsigned long long)setup,
                             (unsigned long long)c->phases[0], (unsigned long long)c->phases[1],
                             (unsigned long long)c->phases[2], (unsigned long long)c->phases[3]);
                else
                    snprintf(args, sizeof(args), "{\"cmd\": %llu, \"cycles\": %llu}", (unsigned long long)ci,
                             (unsigned long long)(end - start));
                accel_trace_complete(&tr, mars_cmd_name(c), 1, best, trace_offset_us + (double)start * us_per_cycle,
                                     (double)(end - start) * us_per_cycle, args);
            }
        }
    }
out:
    if (tracing) {
        int trc = accel_trace_close(&tr, trace_path, &e);
        if (rc == ACCEL_OK)
            rc = trc;
    }
    for (int s = 0; s < MARS_NUM_SEMS; s++)
        free(sems[s].t);
    free(cs);
    free(queue);
    return rc;
}
