// The horizontal sum of 8 floats that the x86 vector paths share (the q8_0 dot product's must
// be ggml's, for its bits, and the attention's dot products take the same one).
#pragma once

#include "ops/isa.h"

#if KAZEIA_AVX2
#include <immintrin.h>

namespace kazeia::x86 {

// ggml's order: the high half onto the low, then the upper pair onto the lower, then the second
// lane onto the first.
KAZEIA_AVX2_FN inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

}  // namespace kazeia::x86
#endif
