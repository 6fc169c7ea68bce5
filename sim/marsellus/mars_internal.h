/* Internal declarations of the MARSELLUS simulator (decoded commands, executors). */
#ifndef ACCEL_MARS_INTERNAL_H
#define ACCEL_MARS_INTERNAL_H

#include <stdint.h>

#include "common/mem.h"
#include "common/status.h"
#include "marsellus/mars_sim.h"

/* One decoded, checked command. Geometry fields hold real values (not "value - 1"). */
typedef struct {
    int op, engine;
    uint32_t wait, signal;
    /* DMA */
    int src_mem, dst_mem;
    uint64_t src, dst, len, rows, planes, src_s1, src_s2, dst_s1, dst_s2;
    /* RBE and CLUSTER share the geometry names */
    uint64_t x, w, nq, y;                   /* L1 addresses (CLUSTER ADD: w = B) */
    int64_t h_in, w_in, h_out, w_out, k_in, k_out;
    int in_bits, w_bits, out_bits, shift;
    int mode1x1, stride_h, stride_w, kh, kw, relu, out_signed, in_signed, b_signed, w_unsigned;
    int pad_t, pad_b, pad_l, pad_r, pad_value;
    uint64_t x_ps, x_rs, y_ps, y_rs;        /* RBE pixel / row strides in bytes */
    int kernel;                             /* CLUSTER kernel id */
    uint32_t kappa_a, kappa_b;              /* CLUSTER ADD / AVGPOOL */
    int32_t lambda;
    int psum_in, psum_out;                  /* CLUSTER CONV / FC: 32-bit partial sums (Kin tiling) */
    uint64_t psum;                          /* L1 address of the (H_out, W_out, C_out) int32 sums */
    /* timing, computed at decode time */
    uint64_t cycles;                        /* duration without the RBE setup */
    uint64_t phases[4];                     /* RBE LOAD, COMPUTE, NORMQUANT, STREAMOUT */
    uint64_t macs, elems;
    uint64_t rd_bytes[3], wr_bytes[3];      /* per memory level (L3, L2, L1) */
} mars_cmd;

typedef struct {
    uint8_t *mem[3];
    uint64_t size[3];
} mars_mems;

/* The unpacked weights of an RBE job geometry (mars_rbe_cache.c), with the packed bytes they were
 * unpacked from. */
typedef struct {
    int64_t k_in, k_out;
    int w_bits, taps, w_unsigned;
    uint64_t bytes;          /* host bytes held by the entry */
    uint8_t *packed;         /* copy of the job's packed L1 weight bytes */
    uint64_t packed_bytes;
    int16_t *w;              /* signed weights [k_out][tap][k_in] */
    int32_t *pairs;          /* AVX2 kernel's pair layout, NULL until a job needs it */
    uint32_t *wsum;          /* [tap][k_out rounded up to 32] sum_k w, modulo 2^32 */
} mars_rbe_wts;

/* a network's weight groups fit (ResNet-20: 42, about 2 MB); the bytes held are bounded too */
#define MARS_RBE_CACHE_ENTRIES 128
#define MARS_RBE_CACHE_BYTES (UINT64_C(32) << 20)

/* Host state kept between RBE jobs: recently unpacked weights and a scratch buffer. */
typedef struct {
    mars_rbe_wts e[MARS_RBE_CACHE_ENTRIES];
    unsigned next;
    uint64_t bytes;          /* host bytes held by the entries */
    void *scratch;
    uint64_t scratch_bytes;
} mars_rbe_cache;

/* ACCEL_OK, or ACCEL_ERR_CONFIG naming the first field outside the supported limits. */
int mars_check_config(const mars_config *c, accel_err *e);

int mars_decode(const mars_config *cfg, const uint8_t *p, uint64_t index, const mars_mems *m,
                mars_cmd *c, accel_err *e);
/* Fails only when host memory runs out, or returns ACCEL_ERR_INTERRUPTED (no message recorded)
 * when a stop was requested. */
int mars_exec(const mars_config *cfg, const mars_cmd *c, uint64_t index, mars_mems *m,
              mars_rbe_cache *cache, accel_err *e);
const char *mars_cmd_name(const mars_cmd *c);

/* The weights of RBE job c read from l1 (with the pair layout when pairs): a cached entry when
 * the job's geometry and packed bytes match one, else unpacked now. ACCEL_OK, ACCEL_ERR_NOMEM
 * or ACCEL_ERR_INTERRUPTED (no message recorded). The entry stays valid until the next call. */
int mars_rbe_weights(mars_rbe_cache *cache, const mars_cmd *c, const uint8_t *l1, int pairs,
                     const mars_rbe_wts **out);
/* A buffer of at least bytes (contents undefined), owned by the cache; NULL without memory. */
void *mars_rbe_scratch(mars_rbe_cache *cache, uint64_t bytes);
void mars_rbe_cache_free(mars_rbe_cache *cache);
/* The cache a run uses: the process-wide one when no other run holds it, else own (zeroed);
 * handed back with mars_rbe_cache_release(cache, own) at the end of the run. */
mars_rbe_cache *mars_rbe_cache_acquire(mars_rbe_cache *own);
void mars_rbe_cache_release(mars_rbe_cache *cache, mars_rbe_cache *own);

/* mars_rbe_simd.c (x86-64 with GCC / Clang), AVX2: the whole RBE job c (input unpacking, the
 * 32-bit accumulators, NormQuant, output packing) with the weights t, in a scratch buffer of
 * mars_rbe_simd_bytes; the same L1 contents as the portable path of exec_rbe. 1 when a stop was
 * requested. */
uint64_t mars_rbe_simd_bytes(const mars_cmd *c);
int mars_rbe_job_avx2(const mars_cmd *c, uint8_t *l1, const mars_rbe_wts *t, void *scratch);

#endif
