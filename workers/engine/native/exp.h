/* e^x for x <= 0, shared by the kernels that need an exponential in a vectorised loop.
 *
 * libm's expf is a call per element: the SwiGLU with expf took 118 us for 32 rows of 1,536
 * on a 2-core AMD EPYC, where torch's vectorised silu took 32. Here x = n ln 2 + r with
 * |r| <= ln 2 / 2 (ln 2 in two parts, the first exact in a product with n), e^r by its
 * Taylor series to r^7, and 2^n set in the exponent bits; about a float ulp (relative error
 * 1.0e-7 from 0 down to -87), and 0 below -87. GCC 12 does not vectorise the scalar form
 * (its bit cast), so where the build has AVX-512 the same steps are written sixteen lanes
 * at a time, 2^n applied by vscalefps.
 */
#ifndef KVGATE_EXP_H
#define KVGATE_EXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

static inline float exp_nonpositive(float x)
{
    float y = x < -87.0f ? -87.0f : x;
    float n = floorf(y * 1.44269504088896341f + 0.5f);
    float r = (y - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.98412698e-4f;
    p = p * r + 1.38888889e-3f;
    p = p * r + 8.33333333e-3f;
    p = p * r + 4.16666667e-2f;
    p = p * r + 1.66666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits;
    memcpy(&bits, &p, sizeof bits);
    bits += (int32_t)n << 23;
    memcpy(&p, &bits, sizeof p);
    return x < -87.0f ? 0.0f : p;
}

#if defined(__AVX512F__)
static inline __m512 exp_nonpositive16(__m512 x)
{
    __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(
        _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.98412698e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.38888889e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.33333333e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.16666667e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.66666667e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}
#endif

#endif
