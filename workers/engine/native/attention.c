/* Decode attention read from the paged KV pool in place: each single-token row attends over
 * its own context's slots, the pool's float16 (or float32) K and V widened as they are read.
 *
 * torch's way gathers every row's context out of the pool (index_select), widens the copy
 * to float32 and hands that to SDPA: three passes over the context a layer, two of them
 * writing, so that batch-1 decode at a 4k-token context took 117 ms a token on a 2-core
 * EPYC where it took 24 at 64 tokens. Here each key and value is read once, from where it
 * lies. The work is cut into (row, KV head, block of keys) pieces so that even one row
 * keeps every core busy; each piece keeps its own running maximum, sum and weighted
 * values, and the pieces of a (row, head) are merged by their maxima at the end, which is
 * exactly the softmax over all the keys, to float rounding.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "exp.h"
#include "team.h"
#if defined(__AVX512F__) || defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* keys per piece: a piece's scores (BLOCK x heads floats) stay in L1 or L2 */
#define BLOCK 256
/* the widest head, and the most query heads, the kernel takes */
#define MAX_D 256
#define MAX_HEADS 64
/* slots asked for ahead of the one being read */
#define AHEAD 8

/* a . b over d floats. The horizontal sum is a tree of shuffles where the build has
 * AVX-512 or AVX2: left to the compiler, each dot product ended in 16 dependent scalar
 * additions, most of this kernel's time. */
static inline float dot(const float *a, const float *b, int64_t d)
{
    int64_t i = 0;
    float sum = 0.0f;
#if defined(__AVX512F__)
    if (d >= 16) {
        __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(b));
        for (i = 16; i + 16 <= d; i += 16)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
        sum = _mm512_reduce_add_ps(acc);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    if (d >= 8) {
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b));
        for (i = 8; i + 8 <= d; i += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
        __m128 half = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        half = _mm_add_ps(half, _mm_movehl_ps(half, half));
        sum = _mm_cvtss_f32(_mm_add_ss(half, _mm_movehdup_ps(half)));
    }
#endif
    for (; i < d; i++) sum += a[i] * b[i];
    return sum;
}

/* the n values of pool element `at` onwards, as float32, into dst. GCC 12 does not vectorise
 * a _Float16 conversion without AVX512-FP16 (it converts one value at a time: that made
 * this kernel slower than torch's gather), so the F16C/AVX-512 conversions are asked for
 * by name where the build has them. */
static inline void widen(const void *pool, int half, int64_t at, int64_t n, float *dst)
{
    if (!half) {
        memcpy(dst, (const float *)pool + at, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *src = (const uint16_t *)pool + at;
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++) {
        _Float16 h;
        memcpy(&h, src + i, sizeof h);
        dst[i] = (float)h;
    }
}

/* ask for the `n` elements of pool element `at` onwards to be brought into the cache */
static inline void prefetch(const void *pool, int half, int64_t at, int64_t n)
{
    const char *p = (const char *)pool + at * (half ? 2 : 4);
    for (int64_t off = 0; off < n * (half ? 2 : 4); off += 64) __builtin_prefetch(p + off);
}

/* e^(s[j] - mx) for j < n in place; returns their sum */
static inline float weights(float *s, int64_t n, float mx)
{
    float sum = 0.0f;
    int64_t j = 0;
#if defined(__AVX512F__)
    __m512 total = _mm512_setzero_ps(), m = _mm512_set1_ps(mx);
    for (; j + 16 <= n; j += 16) {
        __m512 p = exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));
        _mm512_storeu_ps(s + j, p);
        total = _mm512_add_ps(total, p);
    }
    sum = _mm512_reduce_add_ps(total);
#endif
    for (; j < n; j++) {
        s[j] = exp_nonpositive(s[j] - mx);
        sum += s[j];
    }
    return sum;
}

#if defined(__AVX512F__)
/* acc[kh g + h][:] = sum over j < n of s[kh g + h][j] V_j for the g query heads of KV head
 * kh, with G = g and DV = d / 16 known when compiled, so that the G x DV accumulators stay
 * in registers: summed in memory, each key's weighting was a load and a store of every
 * accumulator, a third of this kernel's time. */
static inline __attribute__((always_inline)) void weigh_values(
    float (*s)[BLOCK], const void *pool, int half, const int64_t *slots, int64_t n,
    int64_t stride, int64_t kv_heads, int G, int DV, float *acc)
{
    int64_t d = 16 * DV, width = kv_heads * d;
    for (int64_t kh = 0; kh < kv_heads; kh++) {
        __m512 a[4][8];
        for (int h = 0; h < G; h++)
            for (int c = 0; c < DV; c++) a[h][c] = _mm512_setzero_ps();
        for (int64_t j = 0; j < n; j++) {
            int64_t at = slots[j] * stride + width + kh * d;
            if (j + AHEAD < n) prefetch(pool, half, slots[j + AHEAD] * stride + width + kh * d, d);
            __m512 v[8];
            for (int c = 0; c < DV; c++)
                v[c] = half ? _mm512_cvtph_ps(_mm256_loadu_si256(
                                  (const __m256i *)((const uint16_t *)pool + at + 16 * c)))
                            : _mm512_loadu_ps((const float *)pool + at + 16 * c);
            for (int h = 0; h < G; h++) {
                __m512 p = _mm512_set1_ps(s[kh * G + h][j]);
                for (int c = 0; c < DV; c++) a[h][c] = _mm512_fmadd_ps(p, v[c], a[h][c]);
            }
        }
        for (int h = 0; h < G; h++)
            for (int c = 0; c < DV; c++)
                _mm512_storeu_ps(acc + ((kh * G + h) * d) + 16 * c, a[h][c]);
    }
}
#endif

/* weigh_values for the shapes it is compiled for (1-4 query heads a KV head, heads of 64,
 * or of 128 with 1-2); returns 0 where the caller must do it */
static int weigh_values_in_registers(float (*s)[BLOCK], const void *pool, int half,
                                     const int64_t *slots, int64_t n, int64_t stride,
                                     int64_t kv_heads, int64_t g, int64_t d, float *acc)
{
#if defined(__AVX512F__)
#define CASE(G, DV)                                                                            \
    if (g == G && d == 16 * DV) {                                                              \
        weigh_values(s, pool, half, slots, n, stride, kv_heads, G, DV, acc);                   \
        return 1;                                                                              \
    }
    CASE(1, 4) CASE(2, 4) CASE(3, 4) CASE(4, 4) CASE(1, 8) CASE(2, 8)
#undef CASE
#endif
    (void)s, (void)pool, (void)half, (void)slots, (void)n, (void)stride, (void)kv_heads;
    (void)g, (void)d, (void)acc;
    return 0;
}

/* One piece: the query heads q[heads][d] (already scaled; head h reads KV head h / g) over
 * keys [j0, j1) of a row whose slots are `slots`; writes each head's maximum, sum and
 * unnormalised output to m[heads], l[heads], acc[heads][d]. A slot's K (kv_heads * d
 * elements, then its V) is read whole and in order, the next slots' asked for ahead: the
 * slots of a page follow each other, pages lie anywhere in the pool. */
static void piece(const float *q, const void *pool, int half, const int64_t *slots, int64_t j0,
                  int64_t j1, int64_t stride, int64_t kv_heads, int64_t g, int64_t d, float *m,
                  float *l, float *acc)
{
    float s[MAX_HEADS][BLOCK];
    float kv[MAX_HEADS * MAX_D];
    int64_t n = j1 - j0, heads = kv_heads * g, width = kv_heads * d;
    for (int64_t j = 0; j < n; j++) {
        if (j + AHEAD < n) prefetch(pool, half, slots[j0 + j + AHEAD] * stride, width);
        widen(pool, half, slots[j0 + j] * stride, width, kv);
        for (int64_t h = 0; h < heads; h++) {
            s[h][j] = dot(q + h * d, kv + h / g * d, d);
        }
    }
    for (int64_t h = 0; h < heads; h++) {
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < n; j++) mx = s[h][j] > mx ? s[h][j] : mx;
        m[h] = mx;
        l[h] = weights(s[h], n, mx);
    }
    if (weigh_values_in_registers(s, pool, half, slots + j0, n, stride, kv_heads, g, d, acc))
        return;
    memset(acc, 0, (size_t)(heads * d) * sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        if (j + AHEAD < n) prefetch(pool, half, slots[j0 + j + AHEAD] * stride + width, width);
        widen(pool, half, slots[j0 + j] * stride + width, width, kv);
        for (int64_t h = 0; h < heads; h++) {
            const float *vh = kv + h / g * d;
            float p = s[h][j], *a = acc + h * d;
#pragma omp simd
            for (int64_t i = 0; i < d; i++) a[i] += p * vh[i];
        }
    }
}

/* the pieces of one row, `per` floats apart from `first`, merged by their maxima into
 * out[heads][d] */
static void merge(const float *first, int64_t pieces, int64_t per, int64_t heads, int64_t d,
                  float *out)
{
    for (int64_t h = 0; h < heads; h++) {
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t c = 0; c < pieces; c++) {
            float mc = first[c * per + h];
            mx = mc > mx ? mc : mx;
        }
        float *o = out + h * d;
        memset(o, 0, (size_t)d * sizeof(float));
        for (int64_t c = 0; c < pieces; c++) {
            const float *pc = first + c * per;
            if (pc[heads + h] == 0.0f) continue; /* a piece past the row's end */
            float w = expf(pc[h] - mx);
            const float *a = pc + 2 * heads + h * d;
            sum += w * pc[heads + h];
#pragma omp simd
            for (int64_t i = 0; i < d; i++) o[i] += w * a[i];
        }
        float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t i = 0; i < d; i++) o[i] *= inv;
    }
}

int kvgate_attention_takes(int64_t kv_heads, int64_t g, int64_t d)
{
    return d >= 1 && d <= MAX_D && g >= 1 && kv_heads >= 1 && kv_heads * g <= MAX_HEADS;
}

void kvgate_attention_team(const float *q, int64_t ld_q, const void *pool, int half,
                           int64_t stride, const int64_t *slots, int64_t ld_slots,
                           const int64_t *lens, float *out, float *scratch, int64_t rows,
                           int64_t kv_heads, int64_t g, int64_t d, float scale, int64_t pieces)
{
    int64_t heads = kv_heads * g, tasks = rows * pieces, per = heads * (d + 2);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t b = t / pieces, c = t % pieces;
        float *m = scratch + t * per, *l = m + heads, *acc = l + heads;
        int64_t j0 = c * BLOCK, j1 = j0 + BLOCK < lens[b] ? j0 + BLOCK : lens[b];
        if (j0 >= j1) {
            for (int64_t h = 0; h < heads; h++) m[h] = -INFINITY, l[h] = 0.0f;
            continue;
        }
        float qs[MAX_HEADS * MAX_D];
        const float *qb = q + b * ld_q;
        for (int64_t i = 0; i < heads * d; i++) qs[i] = qb[i] * scale;
        piece(qs, pool, half, slots + b * ld_slots, j0, j1, stride, kv_heads, g, d, m, l, acc);
    }
#pragma omp for schedule(static)
    for (int64_t b = 0; b < rows; b++)
        merge(scratch + b * pieces * per, pieces, per, heads, d, out + b * heads * d);
}

/* out[b][h d ..] = softmax(q . K^T * scale) V for row b's query head h over the first
 * lens[b] slots of slots[b] (rows `ld_slots` apart), with KV head h / g of each slot. The
 * pool holds float16 (half != 0) or float32 elements; slot s starts at element s * stride,
 * its K is [kv_heads][d] and its V the kv_heads * d elements after. q rows are ld_q floats
 * apart; out is [rows][kv_heads * g * d]. scratch holds rows * pieces * kv_heads * g *
 * (d + 2) floats, pieces = ceil(max(lens) / kvgate_attention_block()). Returns 0, or -1
 * for what the kernel does not take (d > 256, more than 64 query heads, a row of no keys). */
int kvgate_decode_attention(const float *q, int64_t ld_q, const void *pool, int half,
                            int64_t stride, const int64_t *slots, int64_t ld_slots,
                            const int64_t *lens, float *out, float *scratch, int64_t rows,
                            int64_t kv_heads, int64_t g, int64_t d, float scale)
{
    if (!kvgate_attention_takes(kv_heads, g, d)) return -1;
    int64_t longest = 0;
    for (int64_t b = 0; b < rows; b++) {
        if (lens[b] < 1 || lens[b] > ld_slots) return -1;
        longest = lens[b] > longest ? lens[b] : longest;
    }
    int64_t pieces = (longest + BLOCK - 1) / BLOCK;
#pragma omp parallel if (rows * pieces > 1)
    kvgate_attention_team(q, ld_q, pool, half, stride, slots, ld_slots, lens, out, scratch,
                          rows, kv_heads, g, d, scale, pieces);
    return 0;
}

/* keys per piece, for the caller's scratch size */
int64_t kvgate_attention_block(void) { return BLOCK; }
