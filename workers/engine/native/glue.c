/* The element-wise steps between a layer's projections, each in one call: rotary position
 * embedding of q and k in place, and the SwiGLU of the MLP.
 *
 * In torch each is four or five ops and a fresh tensor or two (the rotation's halves, the
 * SiLU's output), a few microseconds of dispatch apiece: at batch-1 decode, where a row is
 * 576 to 3,072 floats, that dispatch is the whole cost, 30 layers a step.
 */
#include <math.h>
#include <stdint.h>

#include "exp.h"
#include "team.h"

/* Rotate the first `heads` head vectors (d floats each) of each of `tokens` rows of x (row
 * stride `ld` floats) by cos/sin [tokens, d/2]: the halves (x1, x2) of a head become
 * (x1 cos - x2 sin, x2 cos + x1 sin), rounded as torch rounds them: both products of the
 * first rounded before they subtract, x1 sin fused onto the rounded x2 cos (torch's addcmul). */
void kvgate_rope_row(float *x, const float *c, const float *s, int64_t heads, int64_t d)
{
    int64_t half = d / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *x1 = x + h * d, *x2 = x1 + half;
#pragma omp simd
        for (int64_t i = 0; i < half; i++) {
            float a = x1[i], b = x2[i];
            float ac = a * c[i], bs = b * s[i], bc = b * c[i];
            x1[i] = ac - bs;
            x2[i] = fmaf(a, s[i], bc);
        }
    }
}

void kvgate_rope(float *x, const float *cos_, const float *sin_, int64_t tokens, int64_t heads,
                 int64_t d, int64_t ld)
{
    int64_t half = d / 2;
#pragma omp parallel for schedule(static) if (tokens >= 64)
    for (int64_t t = 0; t < tokens; t++)
        kvgate_rope_row(x + t * ld, cos_ + t * half, sin_ + t * half, heads, d);
}

/* silu(g) = g / (1 + e^-g) is taken from e = e^-|g|, which cannot overflow: g / (1 + e)
 * where g >= 0, g e / (1 + e) where g < 0. */
void kvgate_swiglu_row(const float *g, const float *u, float *y, int64_t n)
{
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
        __m512 gi = _mm512_loadu_ps(g + i);
        __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(gi)));
        __mmask16 negative = _mm512_cmp_ps_mask(gi, _mm512_setzero_ps(), _CMP_LT_OQ);
        __m512 top = _mm512_mask_mul_ps(gi, negative, gi, e);
        __m512 silu = _mm512_div_ps(top, _mm512_add_ps(one, e));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(silu, _mm512_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) {
        float gi = g[i], e = exp_nonpositive(-fabsf(gi));
        float silu = gi >= 0.0f ? gi / (1.0f + e) : gi * e / (1.0f + e);
        y[i] = silu * u[i];
    }
}

/* y[r] = silu(g) * u where g, u are the two halves of row r of x ([m, 2n]): y is [m, n] */
void kvgate_swiglu(const float *x, float *y, int64_t m, int64_t n)
{
#pragma omp parallel for schedule(static) if (m >= 16)
    for (int64_t r = 0; r < m; r++) kvgate_swiglu_row(x + r * 2 * n, x + r * 2 * n + n, y + r * n, n);
}
