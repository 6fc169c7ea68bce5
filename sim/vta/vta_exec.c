/* VTA instruction execution: LOAD / STORE (2-D DMA with padding), GEMM (vta_gemm.c) and ALU, each validated against the SRAM depths and DRAM size and
 * costed by the cycle model of vta_sim.h before it runs. */
#include <string.h>

#include "common/mem.h"
#include "common/stats.h"
#include "vta/vta_internal.h"

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
    if (in->mem_type == MEM_WGT)
        vta_wgt_sync(s, in->sram_base, (in->y_pad0 + in->y_size + in->y_pad1) * cols);
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

/* Validates an instruction against the machine state and returns its duration in *dur and the
 * bytes moved / micro-op iterations it counts in the statistics. */
static int check_and_cost(vta_state *s, const vta_insn *in, uint64_t *dur, uint64_t *bytes, uint64_t *iters)
{
    const vta_geom *g = &s->g;
    int rc = ACCEL_OK;
    switch (in->opcode) {
    case OP_LOAD:
        rc = check_load(s, in, bytes);
        *dur = in->x_size == 0 ? 1 : accel_dma_cycles(*bytes, g->bytes_per_cycle, g->dram_latency);
        break;
    case OP_STORE:
        rc = check_store(s, in, bytes);
        *dur = in->x_size == 0 ? 1 : accel_dma_cycles(*bytes, g->bytes_per_cycle, g->dram_latency);
        break;
    case OP_GEMM:
    case OP_ALU:
        rc = check_compute(s, in);
        *iters = in->iter_out * in->iter_in * n_uops(in);
        *dur = accel_compute_cycles(*iters, in->opcode == OP_GEMM ? g->gemm_cpu : g->alu_cpu, g->pipe_latency);
        break;
    default:
        *dur = 1;
        break;
    }
    return rc;
}

/* Runs a checked instruction and adds its bytes / iterations to the statistics; returns 1 when a
 * stop was requested. */
static int run_and_count(vta_state *s, const vta_insn *in, uint64_t bytes, uint64_t iters)
{
    vta_sim_stats *st = s->st;
    switch (in->opcode) {
    case OP_LOAD:
        if (exec_load(s, in))
            return 1;
        switch (in->mem_type) {
        case MEM_UOP: st->uop_load_bytes += bytes; break;
        case MEM_WGT: st->wgt_load_bytes += bytes; break;
        case MEM_INP: st->inp_load_bytes += bytes; break;
        default: st->acc_load_bytes += bytes; break;
        }
        return 0;
    case OP_STORE:
        if (exec_store(s, in))
            return 1;
        st->out_store_bytes += bytes;
        return 0;
    case OP_GEMM:
        if (vta_exec_gemm(s, in))
            return 1;
        if (in->reset)
            st->gemm_reset_iters += iters;
        else
            st->gemm_uop_iters += iters;
        return 0;
    case OP_ALU:
        if (exec_alu(s, in))
            return 1;
        st->alu_uop_iters += iters;
        return 0;
    default:
        return 0;
    }
}

int vta_execute(vta_state *s, const vta_insn *in, uint64_t start, uint64_t *dur)
{
    const vta_geom *g = &s->g;
    uint64_t bytes = 0, iters = 0, d = 0;
    int rc = check_and_cost(s, in, &d, &bytes, &iters);
    if (rc != ACCEL_OK)
        return rc;
    if (d > g->max_cycles - start)
        return accel_fail(s->err, ACCEL_ERR_BUDGET,
                          "insn %u (%s): cycle budget of %llu cycles exceeded (starts at cycle %llu, takes %llu "
                          "cycles); raise max_cycles if the program is legitimate",
                          in->index, in->name, (ull)g->max_cycles, (ull)start, (ull)d);
    *dur = d;
    if (accel_should_stop() || run_and_count(s, in, bytes, iters))
        return accel_interrupted(s->err, "insn", in->index, in->name, start);
    return ACCEL_OK;
}
