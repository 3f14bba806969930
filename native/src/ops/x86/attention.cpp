// The attention's AVX2/FMA path: the row of ops/shared.h compiled for AVX2/FMA around an
// 8-lane dot product.
#include "ops/arch.h"

#if KAZEIA_AVX2
#include <immintrin.h>

namespace kazeia::x86 {

namespace {

// A dot product: groups of 8, then the tail (fused multiply-adds).
KAZEIA_AVX2_FN float dot_avx2(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    const __m128 half = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 quad = _mm_add_ps(half, _mm_movehl_ps(half, half));
    float sum = _mm_cvtss_f32(_mm_add_ss(quad, _mm_movehdup_ps(quad)));
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

}  // namespace

KAZEIA_AVX2_FN void attention_row_avx2(const AttentionRow &a, int64_t t) {
    attention_row<dot_avx2>(a, t);
}

}  // namespace kazeia::x86
#endif
