// The attention's NEON path: the row of ops/shared.h around a 4-lane dot product, f16 rows
// widened 4 at a time.
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

// 4 or 1 f16 values as f32, exact (FCVTL: every AArch64 CPU has it).
float32x4_t widen4(const uint16_t *in) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(in))); }
float widen1(uint16_t in) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(in))), 0); }

// The two queries q[0..n) and q[n..2n) against one f16 row, each over two accumulators of 4.
void dot_pair_neon(const float *q, const uint16_t *k, int64_t n, float *out) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, b0 = a0, b1 = a0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float32x4_t k0 = widen4(k + i), k1 = widen4(k + i + 4);
        a0 = vfmaq_f32(a0, vld1q_f32(q + i), k0);
        a1 = vfmaq_f32(a1, vld1q_f32(q + i + 4), k1);
        b0 = vfmaq_f32(b0, vld1q_f32(q + n + i), k0);
        b1 = vfmaq_f32(b1, vld1q_f32(q + n + i + 4), k1);
    }
    out[0] = vaddvq_f32(vaddq_f32(a0, a1));
    out[1] = vaddvq_f32(vaddq_f32(b0, b1));
    for (; i < n; ++i) {
        const float kf = widen1(k[i]);
        out[0] += q[i] * kf;
        out[1] += q[n + i] * kf;
    }
}

// f16 -> f32, exact.
void widen_neon(const uint16_t *in, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(out + i, widen4(in + i));
    for (; i < n; ++i) out[i] = widen1(in[i]);
}

}  // namespace

void attention_row_neon(const AttentionRow &a, int64_t t) { attention_row<dot_neon, widen_neon, dot_pair_neon>(a, t); }

}  // namespace kazeia::arm
#endif
