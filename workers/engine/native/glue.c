/* The element-wise steps between a layer's projections, each in one call: rotary position
 * embedding of q and k in place, and the SwiGLU of the MLP.
 *
 * In torch each is four or five ops and a fresh tensor or two (the rotation's halves, the
 * SiLU's output), a few microseconds of dispatch apiece: at batch-1 decode, where a row is
 * 576 to 3,072 floats, that dispatch is the whole cost, 30 layers a step.
 */
#include <math.h>
#include <stdint.h>

/* Rotate the first `heads` head vectors (d floats each) of each of `tokens` rows of x (row
 * stride `ld` floats) by cos/sin [tokens, d/2]: the halves (x1, x2) of a head become
 * (x1 cos - x2 sin, x2 cos + x1 sin), rounded as torch rounds them: both products of the
 * first rounded before they subtract, x1 sin fused onto the rounded x2 cos (torch's addcmul). */
void kvgate_rope(float *x, const float *cos_, const float *sin_, int64_t tokens, int64_t heads,
                 int64_t d, int64_t ld)
{
    int64_t half = d / 2;
#pragma omp parallel for schedule(static) if (tokens >= 64)
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos_ + t * half, *s = sin_ + t * half;
        for (int64_t h = 0; h < heads; h++) {
            float *x1 = x + t * ld + h * d, *x2 = x1 + half;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                float a = x1[i], b = x2[i];
                float ac = a * c[i], bs = b * s[i], bc = b * c[i];
                x1[i] = ac - bs;
                x2[i] = fmaf(a, s[i], bc);
            }
        }
    }
}

/* y[r] = silu(g) * u where g, u are the two halves of row r of x ([m, 2n]): y is [m, n] */
void kvgate_swiglu(const float *x, float *y, int64_t m, int64_t n)
{
#pragma omp parallel for schedule(static) if (m >= 16)
    for (int64_t r = 0; r < m; r++) {
        const float *g = x + r * 2 * n, *u = g + n;
        float *yr = y + r * n;
        for (int64_t i = 0; i < n; i++) yr[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}
