// The q8_0 GEMM's NEON path: the panel products on the dot-product instructions (Armv8.2
// dotprod), compiled for them function by function; ops/q8_gemm.cpp runs it only where the
// CPU has them.
#include "ops/arch.h"

#if KAZEIA_NEON
#include <arm_neon.h>

namespace kazeia::arm {

namespace {

// Signed x signed dot products, 4 rows per register: lanes 0-3 and 4-7 of the panel.
template <int C>
KAZEIA_DOTPROD_FN void panel_dotprod(const Q8PanelView &p, const Q8Columns &x, int64_t j0, float *y,
                                     int64_t M) {
    float32x4_t lo[C], hi[C];
    for (int c = 0; c < C; ++c) lo[c] = hi[c] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < x.nb; ++b) {
        int32x4_t ilo[C], ihi[C];
        for (int c = 0; c < C; ++c) ilo[c] = ihi[c] = vdupq_n_s32(0);
        const auto *wq = reinterpret_cast<const int8_t *>(&p.q[b * Q8_GROUPS * Q8_GEMM_ROWS]);
        for (int64_t g = 0; g < Q8_GROUPS; ++g) {
            const int8x16_t wlo = vld1q_s8(wq + g * 32), whi = vld1q_s8(wq + g * 32 + 16);
            for (int c = 0; c < C; ++c) {
                const int8x16_t xv = vreinterpretq_s8_s32(vdupq_n_s32(x.word(j0 + c, b, g)));
                ilo[c] = vdotq_s32(ilo[c], wlo, xv);
                ihi[c] = vdotq_s32(ihi[c], whi, xv);
            }
        }
        // The scales widened (exactly).
        const uint16_t *d = &p.d[b * Q8_GEMM_ROWS];
        const float32x4_t dlo = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(d)));
        const float32x4_t dhi = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(d + 4)));
        for (int c = 0; c < C; ++c) {
            const float dx = x.d[(j0 + c) * x.nb + b];
            lo[c] = vaddq_f32(lo[c], vmulq_f32(vcvtq_f32_s32(ilo[c]), vmulq_n_f32(dlo, dx)));
            hi[c] = vaddq_f32(hi[c], vmulq_f32(vcvtq_f32_s32(ihi[c]), vmulq_n_f32(dhi, dx)));
        }
    }
    for (int c = 0; c < C; ++c) {
        vst1q_f32(y + (j0 + c) * M, lo[c]);
        vst1q_f32(y + (j0 + c) * M + 4, hi[c]);
    }
}

}  // namespace

KAZEIA_DOTPROD_FN void q8_panel_dotprod(int cols, const Q8PanelView &p, const Q8Columns &x,
                                        int64_t j0, float *y, int64_t M) {
    KAZEIA_Q8_COLUMN_CASES(panel_dotprod, p, x, j0, y, M)
}

}  // namespace kazeia::arm
#endif
