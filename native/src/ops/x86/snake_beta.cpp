// SnakeBeta's AVX2/FMA path: sin^2 on 8 lanes, the tails with the scalar sin2 compiled for FMA.
#include "ops/arch.h"

#if KAZEIA_AVX2
#include <immintrin.h>

namespace kazeia::x86 {

namespace {

// gcc does not vectorize sin2's selects ("control flow in loop"), so they are written out on 8
// lanes here: the SnakeBeta op runs on every activation of the vocoder.
KAZEIA_AVX2_FN inline __m256 sin2_8(__m256 x) {
    const __m256 sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0f));
    const __m256 half = _mm256_or_ps(_mm256_set1_ps(0.5f), sign);  // +-0.5 as x's sign
    const __m256i ki = _mm256_cvttps_epi32(_mm256_fmadd_ps(x, _mm256_set1_ps(0.636619772367581f), half));
    const __m256 k = _mm256_cvtepi32_ps(ki);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.5703125f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(4.837512969970703125e-4f), r);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(7.54978995489188216e-8f), r);
    const __m256 z = _mm256_mul_ps(r, r);
    __m256 s = _mm256_fmadd_ps(_mm256_set1_ps(-1.9515295891e-4f), z, _mm256_set1_ps(8.3321608736e-3f));
    s = _mm256_fmadd_ps(s, z, _mm256_set1_ps(-1.6666654611e-1f));
    s = _mm256_fmadd_ps(_mm256_mul_ps(s, z), r, r);
    __m256 c = _mm256_fmadd_ps(_mm256_set1_ps(2.443315711809948e-5f), z, _mm256_set1_ps(-1.388731625493765e-3f));
    c = _mm256_fmadd_ps(c, z, _mm256_set1_ps(4.166664568298827e-2f));
    c = _mm256_fmadd_ps(_mm256_mul_ps(c, z), z, _mm256_fnmadd_ps(_mm256_set1_ps(0.5f), z, _mm256_set1_ps(1.0f)));
    const __m256i odd = _mm256_cmpeq_epi32(_mm256_and_si256(ki, _mm256_set1_epi32(1)), _mm256_set1_epi32(1));
    const __m256 v = _mm256_blendv_ps(s, c, _mm256_castsi256_ps(odd));
    return _mm256_mul_ps(v, v);
}

// sin2 compiled for FMA (inlined here, its products and sums contract into FMAs): the tails
// compute what the 8-lane FMA code computes, as if the whole file were built for AVX2.
KAZEIA_AVX2_FN inline float sin2_fma(float x) { return sin2(x); }

}  // namespace

KAZEIA_AVX2_FN void snake_column_avx2(const float *in, float *out, const float *alpha,
                                      const float *inv_beta, int64_t channels) {
    int64_t c = 0;
    for (; c + 8 <= channels; c += 8) {
        const __m256 v = _mm256_loadu_ps(in + c);
        const __m256 s2 = sin2_8(_mm256_mul_ps(_mm256_loadu_ps(alpha + c), v));
        _mm256_storeu_ps(out + c, _mm256_fmadd_ps(_mm256_loadu_ps(inv_beta + c), s2, v));
    }
    for (; c < channels; ++c) out[c] = in[c] + inv_beta[c] * sin2_fma(alpha[c] * in[c]);
}

KAZEIA_AVX2_FN void sin_squared_avx2(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, sin2_8(_mm256_loadu_ps(x + i)));
    for (; i < n; ++i) y[i] = sin2_fma(x[i]);
}

}  // namespace kazeia::x86
#endif
