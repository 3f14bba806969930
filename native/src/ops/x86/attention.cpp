// The attention's AVX2/FMA path: the row of ops/shared.h compiled for AVX2/FMA around an
// 8-lane dot product; f16 rows widened 8 at a time (F16C).
#include "ops/arch.h"

#if KAZEIA_AVX2
#include <immintrin.h>

#include "ops/x86/hsum.h"

namespace kazeia::x86 {

namespace {

// A dot product: groups of 8, then the tail (fused multiply-adds).
KAZEIA_AVX2_FN float dot_avx2(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float sum = hsum(acc);
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

// The two queries q[0..n) and q[n..2n) against one f16 row, each over two accumulators of 8.
KAZEIA_AVX2_FN void dot_pair_f16c(const float *q, const uint16_t *k, int64_t n, float *out) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 k0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(k + i)));
        const __m256 k1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(k + i + 8)));
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), k0, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), k1, a1);
        b0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + n + i), k0, b0);
        b1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + n + i + 8), k1, b1);
    }
    out[0] = hsum(_mm256_add_ps(a0, a1));
    out[1] = hsum(_mm256_add_ps(b0, b1));
    for (; i < n; ++i) {
        const float kf = _cvtsh_ss(k[i]);
        out[0] += q[i] * kf;
        out[1] += q[n + i] * kf;
    }
}

// f16 -> f32, exact.
KAZEIA_AVX2_FN void widen_f16c(const uint16_t *in, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(in + i))));
    for (; i < n; ++i) out[i] = _cvtsh_ss(in[i]);
}

}  // namespace

KAZEIA_AVX2_FN void attention_row_avx2(const AttentionRow &a, int64_t t) {
    attention_row<dot_avx2, widen_f16c, dot_pair_f16c>(a, t);
}

}  // namespace kazeia::x86
#endif
