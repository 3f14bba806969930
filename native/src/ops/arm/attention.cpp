// The attention's NEON path: the row of ops/shared.h around a 4-lane dot product.
#include "ops/arch.h"

#if KAZEIA_NEON
#include <arm_neon.h>

namespace kazeia::arm {

namespace {

// A dot product: groups of 4 (fused multiply-adds), then the tail.
float dot_neon(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (; i + 4 <= n; i += 4) acc = vfmaq_f32(acc, vld1q_f32(a + i), vld1q_f32(b + i));
    float sum = vaddvq_f32(acc);
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

}  // namespace

void attention_row_neon(const AttentionRow &a, int64_t t) { attention_row<dot_neon>(a, t); }

}  // namespace kazeia::arm
#endif
