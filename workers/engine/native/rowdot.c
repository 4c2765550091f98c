/* y = x @ w.T for a few rows x [m, k] and a row-major float32 weight w [n, k].
 *
 * Decode with a handful of sequences streams every weight once per step for a few rows,
 * so its speed is the speed of reading the weights. Each thread of the calling thread's
 * OpenMP team takes one contiguous run of weight rows and reads it front to back (one
 * sequential stream per core, which the hardware prefetcher follows best), multiplying
 * each weight row with every x row while it is in L1.
 *
 * Built on first use by workers/engine/native/__init__.py with -march=native; linked
 * against libgomp.so.1, which in a process that has loaded torch is torch's own, so these
 * loops run on the same threads as torch's kernels.
 */
#include <stdint.h>

#include "team.h"

#if defined(__AVX512F__)
#include <immintrin.h>

/* out[j] = dot(w, x + j * ldx) for j < 4 (rows >= 4) or j < rows */
static void dots(const float *w, const float *x, int64_t ldx, int rows, int64_t k, float *out)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
    for (int64_t i = 0; i < k; i += 16) {
        __mmask16 m = k - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - i)) - 1);
        __m512 wv = _mm512_maskz_loadu_ps(m, w + i);
        a0 = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x0 + i), a0);
        if (rows > 1) a1 = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x1 + i), a1);
        if (rows > 2) a2 = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x2 + i), a2);
        if (rows > 3) a3 = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x3 + i), a3);
    }
    out[0] = _mm512_reduce_add_ps(a0);
    if (rows > 1) out[1] = _mm512_reduce_add_ps(a1);
    if (rows > 2) out[2] = _mm512_reduce_add_ps(a2);
    if (rows > 3) out[3] = _mm512_reduce_add_ps(a3);
}

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static void dots(const float *w, const float *x, int64_t ldx, int rows, int64_t k, float *out)
{
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    int n = rows < 4 ? rows : 4;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 wv = _mm256_loadu_ps(w + i);
        for (int j = 0; j < n; j++)
            a[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + j * ldx + i), a[j]);
    }
    for (int j = 0; j < n; j++) {
        float s = hsum(a[j]);
        for (int64_t t = i; t < k; t++) s += w[t] * x[j * ldx + t];
        out[j] = s;
    }
}

#else

static void dots(const float *w, const float *x, int64_t ldx, int rows, int64_t k, float *out)
{
    int n = rows < 4 ? rows : 4;
    for (int j = 0; j < n; j++) {
        float s = 0.0f;
        for (int64_t t = 0; t < k; t++) s += w[t] * x[j * ldx + t];
        out[j] = s;
    }
}

#endif

/* y[j * n + r] (+)= sum_t w[r * k + t] * x[j * k + t] for j < m, r < n (x and y
 * contiguous), the rows of w shared by the team */
void kvgate_rowdot_team(const float *w, const float *x, float *y, int64_t m, int64_t n,
                        int64_t k, int accumulate)
{
#pragma omp for schedule(static)
    for (int64_t r = 0; r < n; r++) {
        const float *wr = w + r * k;
        for (int64_t j = 0; j < m; j += 4) {
            float out[4];
            int rows = (int)(m - j < 4 ? m - j : 4);
            dots(wr, x + j * k, k, rows, k, out);
            for (int t = 0; t < rows; t++) {
                float *at = y + (j + t) * n + r;
                *at = accumulate ? *at + out[t] : out[t];
            }
        }
    }
}

/* y = x @ w.T (see kvgate_rowdot_team) on a team of its own */
void kvgate_rowdot(const float *w, const float *x, float *y, int64_t m, int64_t n, int64_t k)
{
#pragma omp parallel
    kvgate_rowdot_team(w, x, y, m, n, k, 0);
}

/* which of the kernels above this build compiled (for logs and reports) */
const char *kvgate_rowdot_isa(void)
{
#if defined(__AVX512F__)
    return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
    return "avx2";
#else
    return "scalar";
#endif
}
