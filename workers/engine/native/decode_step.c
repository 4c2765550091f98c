/* Batch-1 decode through every decoder layer in one call.
 *
 * A decode step of one sequence reads every weight once for a single row; the reading is
 * the cost it cannot avoid. Called op by op from Python, the same step also paid for about
 * 270 calls (four projections, two norms, the rotation, the KV write, attention, the
 * SwiGLU and two residual adds a layer), each a dispatch, a fresh tensor and an OpenMP
 * team woken: on a 2-core AMD EPYC the projections took 18.6 ms of a 24.1 ms forward pass,
 * the rest 5.5 ms. Here the layers run inside one parallel region: the projections' rows
 * are shared by the team (kvgate_rowdot_team), the one-row steps between them are done by
 * one thread while the others wait at the barrier, and attention's pieces are shared.
 *
 * Every step is the function the op-by-op path calls (team.h), in the same order, so the
 * hidden state, the logits and the KV written are the same bits either way. K and V go
 * into the pool rounded to its float16 as torch rounds (to nearest, ties to even), or as
 * they are into a float32 pool.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "team.h"

/* one decoder layer's weights: float32, row-major, contiguous */
struct kvgate_layer {
    const float *attn_norm, *qkv, *o, *mlp_norm, *gate_up, *down;
};

/* the model, and the memory a step works in */
struct kvgate_model {
    const struct kvgate_layer *layers;
    int64_t n_layers, hidden, heads, kv_heads, head_dim, intermediate;
    float eps;
    /* [positions][head_dim / 2]: a context is at most `positions` tokens */
    const float *cos, *sin;
    int64_t positions;
    /* hidden + qkv + heads * head_dim + 2 * intermediate + intermediate floats, then
     * attention's pieces for `positions` keys */
    float *scratch;
};

/* float32 to float16 bits, to nearest with ties to even (as torch's Tensor.to) */
static void narrow(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) {
        _Float16 h = (_Float16)src[i];
        memcpy(dst + i, &h, sizeof h);
    }
}

/* Run every layer for one single-token row: h [hidden] is the token's embedding and
 * becomes the last layer's output, in place. `slots` are the row's first `length` pool
 * slots (its context, the new token's last); the token is at position length - 1, and its
 * K and V are written to slot slots[length - 1] of each layer before attention reads them.
 * The pool is [pages][layers][page_size][2][kv_heads][head_dim] of float16 (half != 0) or
 * float32, `pages` of them; slot s of layer l is row l * page_size + s. Returns 0; -1
 * where the length is not 1 .. positions, -2 where a slot lies
 * outside the pool (nothing is read or written then). */
int kvgate_decode_layers(const struct kvgate_model *M, float *h, const int64_t *slots,
                         int64_t length, void *pool, int half, int64_t pages, int64_t page_size)
{
    if (length < 1 || length > M->positions) return -1;
    /* the last layer's view has the fewest rows: (pages - 1) * layers + 1 pages' worth */
    const int64_t rows = (pages * M->n_layers - (M->n_layers - 1)) * page_size;
    for (int64_t j = 0; j < length; j++)
        if (slots[j] < 0 || slots[j] >= rows) return -2;
    const int64_t H = M->heads, K = M->kv_heads, D = M->head_dim, F = M->intermediate;
    const int64_t n = M->hidden, width = (H + 2 * K) * D, row = 2 * K * D, g = H / K;
    const int64_t position = length - 1, write = slots[length - 1];
    const int64_t block = kvgate_attention_block(), pieces = (length + block - 1) / block;
    const float *c = M->cos + position * (D / 2), *s = M->sin + position * (D / 2);
    float *x = M->scratch, *qkv = x + n, *attn = qkv + width, *gu = attn + H * D;
    float *act = gu + 2 * F, *parts = act + F;
    const float scale = (float)(1.0 / sqrt((double)D)); /* as the Python side rounds it */
#pragma omp parallel
    for (int64_t l = 0; l < M->n_layers; l++) {
        const struct kvgate_layer *L = M->layers + l;
        const int64_t base = l * page_size * row; /* layer l's slot view, in elements */
#pragma omp single
        kvgate_rms_norm_row(h, L->attn_norm, x, n, M->eps);
        kvgate_rowdot_team(L->qkv, x, qkv, 1, width, n, 0);
#pragma omp single
        {
            kvgate_rope_row(qkv, c, s, H + K, D);
            int64_t at = base + write * row;
            if (half)
                narrow(qkv + H * D, (uint16_t *)pool + at, row);
            else
                memcpy((float *)pool + at, qkv + H * D, (size_t)row * sizeof(float));
        }
        const void *layer_pool = half ? (const void *)((const uint16_t *)pool + base)
                                      : (const void *)((const float *)pool + base);
        kvgate_attention_team(qkv, width, layer_pool, half, row, slots, length, &length, attn,
                              parts, 1, K, g, D, scale, pieces);
        kvgate_rowdot_team(L->o, attn, h, 1, n, H * D, 1);
#pragma omp single
        kvgate_rms_norm_row(h, L->mlp_norm, x, n, M->eps);
        kvgate_rowdot_team(L->gate_up, x, gu, 1, 2 * F, n, 0);
#pragma omp single
        kvgate_swiglu_row(gu, gu + F, act, F);
        kvgate_rowdot_team(L->down, act, h, 1, n, F, 1);
    }
    return 0;
}
