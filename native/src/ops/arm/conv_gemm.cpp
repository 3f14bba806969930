// The conv GEMM's NEON micro-kernel: one packed panel as four 4-lane vectors per column (f16
// and bf16 weights widened on load), and the rounding of inputs to bf16 (as ggml's portable
// conversion rounds).
#include "ops/arch.h"

#if KAZEIA_NEON
#include <arm_neon.h>

#include <cmath>

namespace kazeia::arm {

namespace {

inline float32x4_t load4(const float *p) { return vld1q_f32(p); }
inline float32x4_t load4(const ggml_fp16_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t *>(p))));
}
inline float32x4_t load4(const ggml_bf16_t *p) {
    const uint32x4_t wide = vmovl_u16(vld1_u16(reinterpret_cast<const uint16_t *>(p)));
    return vreinterpretq_f32_u32(vshlq_n_u32(wide, 16));
}

// acc[j][r] = sum_k A[k][r] * B_j[k] for a 16-row panel and COLS <= CONV_NR columns, one
// instance per tile width as on x86 (x86/conv_gemm.cpp).
template <typename T, int COLS>
inline void micro_kernel(const T *a, const float *const b[CONV_NR], int64_t kc,
                         float acc[CONV_NR][CONV_PANEL]) {
    static_assert(CONV_PANEL == 16, "four NEON vectors per panel column");
    float32x4_t c[COLS][4];
    KAZEIA_UNROLL_COLUMNS
    for (int j = 0; j < COLS; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = vdupq_n_f32(0.0f);
    for (int64_t k = 0; k < kc; ++k, a += CONV_PANEL) {
        __builtin_prefetch(a + CONV_PREFETCH_K * CONV_PANEL);
        const float32x4_t a0 = load4(a), a1 = load4(a + 4), a2 = load4(a + 8), a3 = load4(a + 12);
        KAZEIA_UNROLL_COLUMNS
        for (int j = 0; j < COLS; ++j) {
            const float32x4_t v = vdupq_n_f32(b[j][k]);
            c[j][0] = vfmaq_f32(c[j][0], a0, v);
            c[j][1] = vfmaq_f32(c[j][1], a1, v);
            c[j][2] = vfmaq_f32(c[j][2], a2, v);
            c[j][3] = vfmaq_f32(c[j][3], a3, v);
        }
    }
    KAZEIA_UNROLL_COLUMNS
    for (int j = 0; j < COLS; ++j) {
        vst1q_f32(acc[j], c[j][0]);
        vst1q_f32(acc[j] + 4, c[j][1]);
        vst1q_f32(acc[j] + 8, c[j][2]);
        vst1q_f32(acc[j] + 12, c[j][3]);
    }
}

template <typename T>
inline void tile_kernel(int64_t cols, const T *a, const float *const b[CONV_NR], int64_t kc,
                        float acc[CONV_NR][CONV_PANEL]) {
    KAZEIA_TILE_CASES(micro_kernel, a, b, kc, acc)
}

}  // namespace

void tile_kernel_neon(int64_t cols, const float *a, const float *const b[CONV_NR], int64_t kc,
                      float acc[CONV_NR][CONV_PANEL]) {
    tile_kernel(cols, a, b, kc, acc);
}
void tile_kernel_neon(int64_t cols, const ggml_fp16_t *a, const float *const b[CONV_NR],
                      int64_t kc, float acc[CONV_NR][CONV_PANEL]) {
    tile_kernel(cols, a, b, kc, acc);
}
void tile_kernel_neon(int64_t cols, const ggml_bf16_t *a, const float *const b[CONV_NR],
                      int64_t kc, float acc[CONV_NR][CONV_PANEL]) {
    tile_kernel(cols, a, b, kc, acc);
}

void to_bf16_neon(const float *x, ggml_bf16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const uint32x4_t b = vreinterpretq_u32_f32(vld1q_f32(x + i));
        const uint32x4_t high = vshrq_n_u32(b, 16);
        const uint32x4_t bias = vaddq_u32(vdupq_n_u32(0x7fff), vandq_u32(high, vdupq_n_u32(1)));
        const uint32x4_t rounded = vshrq_n_u32(vaddq_u32(b, bias), 16);
        const uint32x4_t nan =
            vcgtq_u32(vandq_u32(b, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
        const uint32x4_t bits = vbslq_u32(nan, vorrq_u32(high, vdupq_n_u32(0x40)), rounded);
        vst1_u16(reinterpret_cast<uint16_t *>(y + i), vmovn_u32(bits));
    }
    if (i < n) ggml_fp32_to_bf16_row_ref(x + i, y + i, n - i);
}

void combine_rows_neon(const WinogradRow *rows, int64_t n_rows, const float *x, int64_t x_stride,
                       float *y, int64_t y_stride, int64_t len) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const WinogradRow &w = rows[r];
        const float *xs[WINOGRAD_MAX_N];
        for (int64_t t = 0; t < w.n; ++t) xs[t] = x + w.idx[t] * x_stride;
        float *yr = y + r * y_stride;
        int64_t k = 0;
        for (; k + 4 <= len; k += 4) {
            float32x4_t acc = vmulq_n_f32(vld1q_f32(xs[0] + k), w.c[0]);
            for (int64_t t = 1; t < w.n; ++t)
                acc = vfmaq_n_f32(acc, vld1q_f32(xs[t] + k), w.c[t]);
            vst1q_f32(yr + k, acc);
        }
        for (; k < len; ++k) {
            float acc = w.c[0] * xs[0][k];
            for (int64_t t = 1; t < w.n; ++t) acc = std::fma(w.c[t], xs[t][k], acc);
            yr[k] = acc;
        }
    }
}

}  // namespace kazeia::arm
#endif
