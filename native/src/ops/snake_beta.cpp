// SnakeBeta, the speech decoder's activation: y = x + inv_beta * sin(alpha * x)^2.
#include "ops.h"

#include <algorithm>
#include <cstdint>

#include "ops/isa.h"

namespace kazeia {

namespace {


// sin^2 through a Cody-Waite reduction by pi/2 and Cephes' single-precision polynomials on
// [-pi/4, pi/4]; libm's sinf, which ggml_sin calls per element, costs far more, and the
// vocoder evaluates tens of millions per second of audio. Accurate to a few ulp for |x| < 1e5
// (sign is irrelevant once squared). sin2_8 below is the same computation on 8 lanes.
__attribute__((always_inline)) inline float sin2(float x) {
    const float k = static_cast<float>(static_cast<int32_t>(x * 0.636619772367581f +
                                                            (x >= 0.0f ? 0.5f : -0.5f)));
    const float r = ((x - k * 1.5703125f) - k * 4.837512969970703125e-4f) -
                    k * 7.54978995489188216e-8f;
    const float z = r * r;
    const float s = ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * z * r + r;
    const float c =
        ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f) * z * z -
        0.5f * z + 1.0f;
    const bool odd = (static_cast<int32_t>(k) & 1) != 0;
    const float v = odd ? c : s;
    return v * v;
}

#if KAZEIA_AVX2
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
#elif KAZEIA_NEON
// sin2 on 4 NEON lanes: the same reduction and polynomials as sin2_8.
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
#endif

#if KAZEIA_AVX2
// sin2 compiled for FMA (inlined here, its products and sums contract into FMAs): the tails
// of the AVX2 paths compute what the 8-lane FMA code computes, as if the whole file were
// built for AVX2.
KAZEIA_AVX2_FN inline float sin2_fma(float x) { return sin2(x); }

// One column, all of its channels: groups of 8, then the tail.
KAZEIA_AVX2_FN void snake_avx2(const float *in, float *out, const float *a, const float *ib,
                               int64_t channels) {
    int64_t c = 0;
    for (; c + 8 <= channels; c += 8) {
        const __m256 v = _mm256_loadu_ps(in + c);
        const __m256 s2 = sin2_8(_mm256_mul_ps(_mm256_loadu_ps(a + c), v));
        _mm256_storeu_ps(out + c, _mm256_fmadd_ps(_mm256_loadu_ps(ib + c), s2, v));
    }
    for (; c < channels; ++c) out[c] = in[c] + ib[c] * sin2_fma(a[c] * in[c]);
}
#endif

// Columns [begin, end) of y = x + inv_beta * sin(alpha * x)^2.
void snake_columns(ggml_tensor *dst, const ggml_tensor *x, const float *a, const float *ib,
                   int64_t begin, int64_t end) {
    const int64_t channels = x->ne[0];
#if KAZEIA_AVX2
    const bool avx2 = use_avx2();
#endif
    for (int64_t t = begin; t < end; ++t) {
        const auto *in = reinterpret_cast<const float *>(static_cast<const char *>(x->data) +
                                                         t * x->nb[1]);
        auto *out = reinterpret_cast<float *>(static_cast<char *>(dst->data) + t * dst->nb[1]);
        int64_t c = 0;
#if KAZEIA_AVX2
        if (avx2) {
            snake_avx2(in, out, a, ib, channels);
            continue;
        }
#elif KAZEIA_NEON
        for (; c + 4 <= channels; c += 4) {
            const float32x4_t v = vld1q_f32(in + c);
            const float32x4_t s2 = sin2_4(vmulq_f32(vld1q_f32(a + c), v));
            vst1q_f32(out + c, vfmaq_f32(v, vld1q_f32(ib + c), s2));
        }
#endif
        for (; c < channels; ++c) out[c] = in[c] + ib[c] * sin2(a[c] * in[c]);
    }
}

constexpr int64_t SNAKE_TASK_FLOATS = 32 * 1024;  // ~128 KB of activations per task

void snake_kernel(ggml_tensor *dst, const ggml_tensor *x, const ggml_tensor *alpha,
                  const ggml_tensor *inv_beta, int ith, int nth, void *userdata) {
    const int64_t columns = ggml_nrows(x);
    const auto *a = static_cast<const float *>(alpha->data);
    const auto *ib = static_cast<const float *>(inv_beta->data);
    const int64_t per_task = std::max<int64_t>(1, SNAKE_TASK_FLOATS / x->ne[0]);
    const int64_t n_tasks = (columns + per_task - 1) / per_task;
    auto task = [&](int64_t i) {
        snake_columns(dst, x, a, ib, i * per_task, std::min(columns, (i + 1) * per_task));
    };
    run_tasks(static_cast<WorkerPool *>(userdata), ith, nth, n_tasks, task);
}

}  // namespace

#if KAZEIA_AVX2
namespace {
KAZEIA_AVX2_FN void sin_squared_avx2(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, sin2_8(_mm256_loadu_ps(x + i)));
    for (; i < n; ++i) y[i] = sin2_fma(x[i]);
}
}  // namespace
#endif

void sin_squared(const float *x, float *y, int64_t n) {
    int64_t i = 0;
#if KAZEIA_AVX2
    if (use_avx2()) return sin_squared_avx2(x, y, n);
#elif KAZEIA_NEON
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, sin2_4(vld1q_f32(x + i)));
#endif
    for (; i < n; ++i) y[i] = sin2(x[i]);
}

ggml_tensor *snake_beta(ggml_context *ctx, ggml_tensor *x, ggml_tensor *alpha,
                        ggml_tensor *inv_beta, WorkerPool *pool) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && ggml_is_contiguous(x));
    GGML_ASSERT(alpha->ne[0] == x->ne[0] && inv_beta->ne[0] == x->ne[0]);
    return ggml_map_custom3(ctx, x, alpha, inv_beta, snake_kernel, GGML_N_TASKS_MAX, pool);
}

}  // namespace kazeia
