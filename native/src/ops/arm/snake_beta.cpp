// SnakeBeta's NEON path: sin^2 on 4 lanes, the tails with the scalar sin2.
#include "ops/arch.h"

#if KAZEIA_NEON
#include <arm_neon.h>

namespace kazeia::arm {

namespace {

// sin2 on 4 NEON lanes: the same reduction and polynomials as the x86 path's sin2_8.
inline float32x4_t sin2_4(float32x4_t x) {
    const uint32x4_t sign = vandq_u32(vreinterpretq_u32_f32(x), vdupq_n_u32(0x80000000u));
    const float32x4_t half = vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(vdupq_n_f32(0.5f)), sign));
    const int32x4_t ki = vcvtq_s32_f32(vfmaq_f32(half, x, vdupq_n_f32(0.636619772367581f)));
    const float32x4_t k = vcvtq_f32_s32(ki);
    float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(1.5703125f));
    r = vfmsq_f32(r, k, vdupq_n_f32(4.837512969970703125e-4f));
    r = vfmsq_f32(r, k, vdupq_n_f32(7.54978995489188216e-8f));
    const float32x4_t z = vmulq_f32(r, r);
    float32x4_t s = vfmaq_f32(vdupq_n_f32(8.3321608736e-3f), vdupq_n_f32(-1.9515295891e-4f), z);
    s = vfmaq_f32(vdupq_n_f32(-1.6666654611e-1f), s, z);
    s = vfmaq_f32(r, vmulq_f32(s, z), r);
    float32x4_t c = vfmaq_f32(vdupq_n_f32(-1.388731625493765e-3f), vdupq_n_f32(2.443315711809948e-5f), z);
    c = vfmaq_f32(vdupq_n_f32(4.166664568298827e-2f), c, z);
    c = vfmaq_f32(vfmsq_f32(vdupq_n_f32(1.0f), vdupq_n_f32(0.5f), z), vmulq_f32(c, z), z);
    const uint32x4_t odd = vceqq_s32(vandq_s32(ki, vdupq_n_s32(1)), vdupq_n_s32(1));
    const float32x4_t v = vbslq_f32(odd, c, s);
    return vmulq_f32(v, v);
}

}  // namespace

void snake_column_neon(const float *in, float *out, const float *alpha, const float *inv_beta,
                       int64_t channels) {
    int64_t c = 0;
    for (; c + 4 <= channels; c += 4) {
        const float32x4_t v = vld1q_f32(in + c);
        const float32x4_t s2 = sin2_4(vmulq_f32(vld1q_f32(alpha + c), v));
        vst1q_f32(out + c, vfmaq_f32(v, vld1q_f32(inv_beta + c), s2));
    }
    for (; c < channels; ++c) out[c] = in[c] + inv_beta[c] * sin2(alpha[c] * in[c]);
}

void sin_squared_neon(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, sin2_4(vld1q_f32(x + i)));
    for (; i < n; ++i) y[i] = sin2(x[i]);
}

}  // namespace kazeia::arm
#endif
