/* The RBE's unpacked weights, kept between jobs and between runs (mars_sim_run).
 *
 * A layer's weights are loaded into L1 once and read by every job of its tiles; unpacking their
 * bit planes for every job was a third of the simulator's time. An entry is the signed weights
 * (and, for the AVX2 kernel, their pair layout) of a job geometry together with a copy of the
 * packed bytes they came from; a job reuses it only when its geometry is the same and its L1
 * weight bytes equal the copy byte for byte, so a DMA or an output that overwrote them is seen.
 * The weights are a function of those bytes and that geometry alone: a hit gives what unpacking
 * again would. The entries are host state, not state of the modelled hardware (no cycle or
 * counter depends on them).
 *
 * One process-wide cache is lent to one run at a time, so the runs of a network's layers, one
 * inference after another, find their weights unpacked; a run that finds it lent (another thread
 * simulating) uses a cache of its own for its duration. Its size is bounded: at most
 * MARS_RBE_CACHE_ENTRIES entries and MARS_RBE_CACHE_BYTES of weights (one larger job's
 * excepted), and the largest scratch buffer a job needed. */
#include <string.h>

#include "marsellus/mars_bitplane.h"
#include "marsellus/mars_internal.h"

static uint64_t packed_bytes(const mars_cmd *c)
{
    const uint64_t n_ki = ((uint64_t)c->k_in + 31) / 32;
    return (uint64_t)c->k_out * n_ki * (uint64_t)c->w_bits * (uint64_t)(c->kh * c->kw) * 4;
}

static void entry_free(mars_rbe_cache *cache, mars_rbe_wts *t)
{
    cache->bytes -= t->bytes;
    free(t->packed);
    free(t->w);
    free(t->pairs);
    free(t->wsum);
    memset(t, 0, sizeof(*t));
}

void mars_rbe_cache_free(mars_rbe_cache *cache)
{
    for (int i = 0; i < MARS_RBE_CACHE_ENTRIES; i++)
        entry_free(cache, &cache->e[i]);
    free(cache->scratch);
    memset(cache, 0, sizeof(*cache));
}

static mars_rbe_cache shared;
static int shared_lent;

mars_rbe_cache *mars_rbe_cache_acquire(mars_rbe_cache *own)
{
#if defined(__GNUC__)
    if (__atomic_exchange_n(&shared_lent, 1, __ATOMIC_ACQUIRE) == 0)
        return &shared;
#endif
    return own;
}

void mars_rbe_cache_release(mars_rbe_cache *cache, mars_rbe_cache *own)
{
    if (cache == own) {
        mars_rbe_cache_free(own);
        return;
    }
#if defined(__GNUC__)
    __atomic_store_n(&shared_lent, 0, __ATOMIC_RELEASE);
#endif
}

void *mars_rbe_scratch(mars_rbe_cache *cache, uint64_t bytes)
{
    if (bytes > cache->scratch_bytes) {
        void *p = accel_calloc(bytes, 1);
        if (!p)
            return NULL;
        free(cache->scratch);
        cache->scratch = p;
        cache->scratch_bytes = bytes;
    }
    return cache->scratch;
}

/* Unpacks the job's weights into w (Kout, taps, Kin) as signed values; 1 when a stop was
 * requested. Layout: 3x3 (Kout, Kin/32, W, 9, 32), 1x1 (Kout, Kin/32, W, 32); stored
 * offset-binary unless w_unsigned. */
static int unpack_weights(const mars_cmd *c, const uint8_t *l1, int16_t *w)
{
    const int64_t Ki = c->k_in, Ko = c->k_out;
    const int taps = c->kh * c->kw;
    const uint64_t n_ki = (uint64_t)(Ki + 31) / 32;
    const int64_t off = c->w_unsigned ? 0 : ((int64_t)1 << (c->w_bits - 1));
    for (int64_t o = 0; o < Ko; o++) {
        if (accel_should_stop())
            return 1;
        for (uint64_t t = 0; t < n_ki; t++) {
            const int64_t kt = Ki - (int64_t)t * 32 < 32 ? Ki - (int64_t)t * 32 : 32;
            for (int f = 0; f < taps; f++) {
                const uint64_t word_i = ((uint64_t)o * n_ki + t) * (uint64_t)c->w_bits * (uint64_t)taps + (uint64_t)f;
                uint8_t v[32];
                mars_planes_to_values(l1 + c->w + 4 * word_i, 4 * (uint64_t)taps, c->w_bits, v);
                for (int64_t j = 0; j < kt; j++)
                    w[(o * taps + f) * Ki + (int64_t)t * 32 + j] = (int16_t)(v[j] - off);
            }
        }
    }
    return 0;
}

/* The AVX2 kernel's weights (see mars_rbe_simd.c): pairs, int32 holding (int16 w[o][tap][2q],
 * int16 w[o][tap][2q + 1]) (0 past k_in and past k_out), laid out [group of 32 channels][tap][q]
 * [32 lanes]; wsum[tap][lane] = sum_k w[o][tap][k] modulo 2^32 (what a padded tap adds per unit
 * of the pad value). */
static int build_pairs(const mars_cmd *c, mars_rbe_wts *t)
{
    const uint64_t Ki = (uint64_t)c->k_in, Ko = (uint64_t)c->k_out, taps = (uint64_t)(c->kh * c->kw);
    const uint64_t nq = (Ki + 1) / 2, lanes = (Ko + 31) / 32 * 32;
    uint64_t g, f, q, o, k;
    t->pairs = accel_calloc(lanes * taps * nq, sizeof(int32_t));
    t->wsum = accel_calloc(lanes * taps, sizeof(uint32_t));
    if (!t->pairs || !t->wsum)
        return ACCEL_ERR_NOMEM;
    t->bytes += 4 * lanes * taps * (nq + 1);
    for (g = 0; g < lanes / 32; g++)
        for (f = 0; f < taps; f++)
            for (q = 0; q < nq; q++)
                for (o = g * 32; o < g * 32 + 32 && o < Ko; o++) {
                    const int16_t *wv = t->w + (o * taps + f) * Ki + 2 * q;
                    const uint32_t w0 = (uint16_t)wv[0], w1 = 2 * q + 1 < Ki ? (uint16_t)wv[1] : 0;
                    t->pairs[((g * taps + f) * nq + q) * 32 + o - g * 32] = accel_as_i32(w0 | (w1 << 16));
                }
    for (f = 0; f < taps; f++)
        for (o = 0; o < Ko; o++) {
            uint32_t s = 0;
            for (k = 0; k < Ki; k++)
                s += (uint32_t)(int32_t)t->w[(o * taps + f) * Ki + k];
            t->wsum[f * lanes + o] = s;
        }
    return ACCEL_OK;
}

static int same_job(const mars_rbe_wts *t, const mars_cmd *c, const uint8_t *packed, uint64_t n)
{
    return t->w && t->k_in == c->k_in && t->k_out == c->k_out && t->w_bits == c->w_bits &&
           t->taps == c->kh * c->kw && t->w_unsigned == c->w_unsigned && t->packed_bytes == n &&
           memcmp(t->packed, packed, (size_t)n) == 0;
}

int mars_rbe_weights(mars_rbe_cache *cache, const mars_cmd *c, const uint8_t *l1, int pairs,
                     const mars_rbe_wts **out)
{
    const uint64_t n = packed_bytes(c);
    const uint8_t *packed = l1 + c->w;
    mars_rbe_wts *t = NULL;
    int i;
    for (i = 0; i < MARS_RBE_CACHE_ENTRIES && !t; i++)
        if (same_job(&cache->e[i], c, packed, n))
            t = &cache->e[i];
    if (!t) {
        const uint64_t need = n + 2 * (uint64_t)(c->k_out * c->kh * c->kw) * (uint64_t)c->k_in;
        t = &cache->e[cache->next];
        cache->next = (cache->next + 1) % MARS_RBE_CACHE_ENTRIES;
        entry_free(cache, t);
        for (i = 0; i < MARS_RBE_CACHE_ENTRIES && cache->bytes + need > MARS_RBE_CACHE_BYTES; i++)
            entry_free(cache, &cache->e[i]);
        t->packed = accel_calloc(n, 1);
        t->w = accel_calloc((uint64_t)(c->k_out * c->kh * c->kw) * (uint64_t)c->k_in, sizeof(int16_t));
        if (!t->packed || !t->w) {
            entry_free(cache, t);
            return ACCEL_ERR_NOMEM;
        }
        if (unpack_weights(c, l1, t->w)) {
            entry_free(cache, t);
            return ACCEL_ERR_INTERRUPTED;
        }
        memcpy(t->packed, packed, (size_t)n);
        t->packed_bytes = n;
        t->k_in = c->k_in;
        t->k_out = c->k_out;
        t->w_bits = c->w_bits;
        t->taps = c->kh * c->kw;
        t->w_unsigned = c->w_unsigned;
        t->bytes = need;
        cache->bytes += need;
    }
    if (pairs && !t->pairs) {
        const uint64_t before = t->bytes;
        if (build_pairs(c, t) != ACCEL_OK) {
            entry_free(cache, t);
            return ACCEL_ERR_NOMEM;
        }
        cache->bytes += t->bytes - before;
    }
    *out = t;
    return ACCEL_OK;
}
