/* VTA simulator entry point: argument checks, a static pass over the stream, then the
 * discrete-event scheduler of the three modules and their token queues (model: vta_sim.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/stats.h"
#include "common/tokens.h"
#include "common/trace.h"
#include "vta/vta_internal.h"

static const char *const Q_NAMES[NUM_Q] = {"L2G", "G2L", "G2S", "S2G"};
static const char *const MOD_NAMES[3] = {"load", "compute", "store"};

uint64_t vta_sim_config_size(void) { return sizeof(vta_sim_config); }
uint64_t vta_sim_stats_size(void) { return sizeof(vta_sim_stats); }

/* One run: the machine, the instruction queues of the modules and their token queues. */
typedef struct {
    vta_state s;
    accel_err err;
    accel_trace trace;
    const char *trace_path;
    double trace_offset_us;
    accel_fifo tq[NUM_Q];
    const uint8_t *insns;
    uint64_t n;
    uint32_t *order; /* instruction indices grouped by module */
    uint64_t start_of[3], count[3], pc[3], free_at[3], end_max;
    vta_insn cur[3]; /* next instruction of each module */
} vta_run;

static int check_args(vta_run *r, const vta_sim_config *cfg, uint64_t insn_bytes, const uint8_t *dram)
{
    accel_err *err = &r->err;
    if (!cfg)
        return accel_fail(err, ACCEL_ERR_ARG, "no config given");
    if (insn_bytes % 16 != 0)
        return accel_fail(err, ACCEL_ERR_ARG, "instruction stream of %llu bytes is not a multiple of 16",
                          (ull)insn_bytes);
    if ((insn_bytes && !r->insns) || (r->s.dram_bytes && !dram))
        return accel_fail(err, ACCEL_ERR_ARG, "NULL instruction or DRAM buffer");
    if (!isfinite(r->trace_offset_us))
        return accel_fail(err, ACCEL_ERR_ARG, "trace offset is not finite");
    r->n = insn_bytes / 16;
    if (r->n > UINT32_MAX)
        return accel_fail(err, ACCEL_ERR_ARG, "instruction stream of %llu instructions is too long", (ull)r->n);
    return vta_check_config(cfg, &r->s.g, err);
}

static int interrupted_checking(vta_run *r, uint64_t k)
{
    return accel_fail(&r->err, ACCEL_ERR_INTERRUPTED, "interrupted while checking insn %llu", (ull)k);
}

/* Static pass: decode, route, check fields; count instructions per module and pushes per queue,
 * which size the token queues. */
static int scan_stream(vta_run *r, uint64_t pushes[NUM_Q])
{
    uint64_t k, finish_at = UINT64_MAX;
    int rc;
    for (k = 0; k < r->n; k++) {
        vta_insn in;
        int qs[2], np, j;
        if ((k & 4095) == 0 && accel_should_stop())
            return interrupted_checking(r, k);
        vta_decode(&r->s.g, r->insns + 16 * k, (uint32_t)k, &in);
        in.module = vta_route(&in);
        if (finish_at != UINT64_MAX)
            return accel_fail(&r->err, ACCEL_ERR_PROTOCOL, "insn %llu (%s): instruction after FINISH (insn %llu)",
                              (ull)k, in.name, (ull)finish_at);
        if ((rc = vta_check_static(&in, &r->err)) != ACCEL_OK)
            return rc;
        if (in.opcode == OP_FINISH)
            finish_at = k;
        r->count[in.module]++;
        np = vta_pushes_of(&in, qs);
        for (j = 0; j < np; j++)
            pushes[qs[j]]++;
    }
    if (finish_at == UINT64_MAX)
        return accel_fail(&r->err, ACCEL_ERR_PROTOCOL, "no FINISH instruction in the stream of %llu instructions",
                          (ull)r->n);
    return ACCEL_OK;
}

static int alloc_state(vta_run *r, const uint64_t pushes[NUM_Q])
{
    vta_state *s = &r->s;
    int q, ok = 1;
    for (q = 0; q < NUM_Q; q++)
        ok &= accel_fifo_init(&r->tq[q], pushes[q]);
    r->order = (uint32_t *)accel_calloc(r->n, sizeof(uint32_t));
    s->uop = (uint32_t *)accel_calloc(s->g.uop_depth, 4);
    s->inp = (int8_t *)accel_calloc(s->g.inp_depth, s->g.inp_entry);
    s->wgt = (int8_t *)accel_calloc(s->g.wgt_depth, s->g.wgt_entry);
    s->acc = (uint32_t *)accel_calloc(s->g.acc_depth, (uint64_t)s->g.acc_lanes * 4);
    s->ud = (uint32_t *)accel_calloc(s->g.uop_depth, 4);
    s->us = (uint32_t *)accel_calloc(s->g.uop_depth, 4);
    s->uw = (uint32_t *)accel_calloc(s->g.uop_depth, 4);
    if (!ok || !r->order || !s->uop || !s->inp || !s->wgt || !s->acc || !s->ud || !s->us || !s->uw ||
        vta_gemm_init(s) != ACCEL_OK)
        return accel_fail(&r->err, ACCEL_ERR_NOMEM, "out of host memory for the simulator state");
    return ACCEL_OK;
}

/* Groups the instruction indices by module (each module runs its own in stream order). */
static int build_order(vta_run *r)
{
    uint64_t fill[3], k;
    r->start_of[0] = 0;
    r->start_of[1] = r->count[0];
    r->start_of[2] = r->count[0] + r->count[1];
    memcpy(fill, r->start_of, sizeof(fill));
    for (k = 0; k < r->n; k++) {
        vta_insn in;
        if ((k & 4095) == 0 && accel_should_stop())
            return interrupted_checking(r, k);
        vta_decode(&r->s.g, r->insns + 16 * k, (uint32_t)k, &in);
        r->order[fill[vta_route(&in)]++] = (uint32_t)k;
    }
    return ACCEL_OK;
}

static int open_trace(vta_run *r, int32_t trace_append)
{
    int m, rc;
    if (!r->trace_path)
        return ACCEL_OK;
    if ((rc = accel_trace_open(&r->trace, r->trace_path, trace_append != 0, &r->err)) != ACCEL_OK)
        return rc;
    accel_trace_process_name(&r->trace, 0, "VTA");
    for (m = 0; m < 3; m++)
        accel_trace_thread_name(&r->trace, 0, m, MOD_NAMES[m]);
    return ACCEL_OK;
}

/* Fetch: decodes the next instruction of module m into cur[m] (if it has one left). */
static void fetch(vta_run *r, int m)
{
    uint32_t idx;
    if (r->pc[m] >= r->count[m])
        return;
    idx = r->order[r->start_of[m] + r->pc[m]];
    vta_decode(&r->s.g, r->insns + 16 * (uint64_t)idx, idx, &r->cur[m]);
    r->cur[m].module = (unsigned)m;
}

/* Dependency wait: the module whose next instruction has all its tokens and starts earliest
 * (ties go to the lower module), with its start cycle in *start; -1 when none is ready. */
static int pick_ready(const vta_run *r, uint64_t *start)
{
    int best = -1, m, qs[2], np, j;
    for (m = 0; m < 3; m++) {
        uint64_t t;
        int ready = 1;
        if (r->pc[m] >= r->count[m])
            continue;
        t = r->free_at[m];
        np = vta_pops_of(&r->cur[m], qs);
        for (j = 0; j < np; j++) {
            const accel_fifo *tk = &r->tq[qs[j]];
            if (accel_fifo_empty(tk)) {
                ready = 0;
                break;
            }
            if (accel_fifo_front(tk) > t)
                t = accel_fifo_front(tk);
        }
        if (ready && (best < 0 || t < *start)) {
            best = m;
            *start = t;
        }
    }
    return best;
}

static int all_done(const vta_run *r)
{
    int m;
    for (m = 0; m < 3; m++)
        if (r->pc[m] < r->count[m])
            return 0;
    return 1;
}

/* No module is ready and some are not done: names each module's state and the queue it waits on. */
static int report_deadlock(vta_run *r)
{
    char msg[512];
    size_t len = 0;
    int m, qs[2], np, j;
    msg[0] = '\0';
    for (m = 0; m < 3; m++) {
        int w;
        if (r->pc[m] >= r->count[m]) {
            w = snprintf(msg + len, sizeof(msg) - len, "%s%s done", len ? "; " : "", MOD_NAMES[m]);
        } else {
            const char *wait = "?";
            np = vta_pops_of(&r->cur[m], qs);
            for (j = 0; j < np; j++)
                if (accel_fifo_empty(&r->tq[qs[j]])) {
                    wait = Q_NAMES[qs[j]];
                    break;
                }
            w = snprintf(msg + len, sizeof(msg) - len, "%s%s blocked at insn %u (%s) waiting on %s", len ? "; " : "",
                         MOD_NAMES[m], r->cur[m].index, r->cur[m].name, wait);
        }
        if (w > 0)
            len += (size_t)w;
        if (len >= sizeof(msg))
            len = sizeof(msg) - 1;
    }
    return accel_fail(&r->err, ACCEL_ERR_PROTOCOL, "deadlock: %s", msg);
}

/* Retire: takes the popped tokens, pushes tokens carrying the completion time, counts the
 * instruction and writes its trace event. */
static void retire(vta_run *r, int m, uint64_t start, uint64_t dur)
{
    const vta_insn *in = &r->cur[m];
    vta_sim_stats *stats = r->s.st;
    const uint64_t end = start + dur;
    int qs[2], np, j;
    np = vta_pops_of(in, qs);
    for (j = 0; j < np; j++)
        accel_fifo_pop(&r->tq[qs[j]]);
    np = vta_pushes_of(in, qs);
    for (j = 0; j < np; j++)
        accel_fifo_push(&r->tq[qs[j]], end);
    stats->busy[m] += dur;
    stats->stall[m] += start - r->free_at[m];
    stats->insns[m]++;
    r->free_at[m] = end;
    if (end > r->end_max)
        r->end_max = end;
    stats->cycles = r->end_max;
    if (r->trace.f) {
        char args[96];
        snprintf(args, sizeof(args), "{\"insn\": %u, \"cycles\": %llu}", in->index, (ull)dur);
        accel_trace_complete(&r->trace, in->name, 0, m, r->trace_offset_us + (double)start / r->s.g.clock_mhz,
                             (double)dur / r->s.g.clock_mhz, args);
    }
    r->pc[m]++;
}

/* Discrete-event loop: run the ready module whose next instruction starts earliest. */
static int event_loop(vta_run *r)
{
    int m, rc;
    for (m = 0; m < 3; m++)
        fetch(r, m);
    for (;;) {
        uint64_t start = 0, dur = 0;
        m = pick_ready(r, &start);
        if (m < 0)
            return all_done(r) ? ACCEL_OK : report_deadlock(r);
        if ((rc = vta_execute(&r->s, &r->cur[m], start, &dur)) != ACCEL_OK)
            return rc;
        retire(r, m, start, dur);
        fetch(r, m);
    }
}

/* Every module drained; the token queues must be empty too. */
static int check_drained(vta_run *r)
{
    char msg[256];
    size_t len = 0;
    int q;
    msg[0] = '\0';
    for (q = 0; q < NUM_Q; q++) {
        uint64_t left = accel_fifo_left(&r->tq[q]);
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
        return accel_fail(&r->err, ACCEL_ERR_PROTOCOL, "unbalanced tokens: %s", msg);
    return ACCEL_OK;
}

/* Closes the trace (its write error is the result of an otherwise successful run) and frees. */
static int finish(vta_run *r, int rc)
{
    vta_state *s = &r->s;
    int q;
    if (r->trace.f) {
        int trc = accel_trace_close(&r->trace, r->trace_path, &r->err);
        if (rc == ACCEL_OK)
            rc = trc;
    }
    free(r->order);
    free(s->uop);
    free(s->inp);
    free(s->wgt);
    free(s->pairs);
    free(s->acc);
    free(s->ud);
    free(s->us);
    free(s->uw);
    for (q = 0; q < NUM_Q; q++)
        accel_fifo_free(&r->tq[q]);
    return rc;
}

int vta_sim_run(const vta_sim_config *cfg, const uint8_t *insns, uint64_t insn_bytes, uint8_t *dram,
                uint64_t dram_bytes, vta_sim_stats *stats, const char *trace_path, double trace_offset_us,
                int32_t trace_append, char *errbuf, uint64_t err_len)
{
    vta_run r;
    vta_sim_stats local_stats;
    uint64_t pushes[NUM_Q] = {0, 0, 0, 0};
    int rc;

    memset(&r, 0, sizeof(r));
    accel_err_init(&r.err, errbuf, err_len);
    r.trace.f = NULL;
    if (!stats)
        stats = &local_stats;
    memset(stats, 0, sizeof(*stats));
    r.s.st = stats;
    r.s.err = &r.err;
    r.s.dram = dram;
    r.s.dram_bytes = dram_bytes;
    r.insns = insns;
    r.trace_path = trace_path;
    r.trace_offset_us = trace_offset_us;

    if ((rc = check_args(&r, cfg, insn_bytes, dram)) != ACCEL_OK || (rc = scan_stream(&r, pushes)) != ACCEL_OK)
        return rc;
    if ((rc = alloc_state(&r, pushes)) == ACCEL_OK && (rc = build_order(&r)) == ACCEL_OK &&
        (rc = open_trace(&r, trace_append)) == ACCEL_OK && (rc = event_loop(&r)) == ACCEL_OK)
        rc = check_drained(&r);
    return finish(&r, rc);
}
