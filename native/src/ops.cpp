#include "ops.h"
#include "cpu_backend.h"
#include "kazeia/speech_decoder.h"

#include <algorithm>
#include <cstdint>
#include <string>

// One vector path per instruction set. On x86-64 the AVX2/FMA/F16C paths are compiled for
// those instructions function by function (KAZEIA_AVX2_FN) and run only where the CPU has them
// (use_avx2, checked once): the rest of this file stays baseline x86-64, so a CPU without AVX2
// never meets an instruction it lacks and runs the portable loops. On aarch64 the NEON paths
// (every AArch64 CPU has NEON, with fp16 conversion) are chosen when compiling. The portable
// loops also finish every vector loop's tail.
#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdlib>
#include <cstring>
#define KAZEIA_AVX2 1
#define KAZEIA_AVX2_FN __attribute__((target("avx2,fma,f16c")))
#define KAZEIA_AVX512_FN __attribute__((target("avx512f,avx2,fma,f16c")))
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define KAZEIA_NEON 1
#endif

namespace kazeia {

namespace {

#if KAZEIA_AVX2
// Whether this CPU runs the AVX2 paths; KAZEIA_KERNELS=portable forces the portable loops
// (tests compare the two).
bool use_avx2() {
    static const bool yes = [] {
        const char *forced = std::getenv("KAZEIA_KERNELS");
        if (forced && std::strcmp(forced, "portable") == 0) return false;
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    }();
    return yes;
}

// Whether the decoder's GEMM runs two panels at a time in AVX-512 registers (the same bits as
// the AVX2 path: see pair_kernel_avx512); KAZEIA_KERNELS=avx2 forces the AVX2 path.
bool use_avx512() {
    static const bool yes = [] {
        const char *forced = std::getenv("KAZEIA_KERNELS");
        if (forced && (std::strcmp(forced, "portable") == 0 || std::strcmp(forced, "avx2") == 0))
            return false;
        return use_avx2() && __builtin_cpu_supports("avx512f");
    }();
    return yes;
}
#endif

// Runs task(0..n_tasks) for a custom op: on `pool` when the op has one (called from a
// one-thread ggml graph: its thread 0 hands the tasks to the pool), else split by ggml's
// own threads.
template <typename Task>
void run_tasks(WorkerPool *pool, int ith, int nth, int64_t n_tasks, const Task &task) {
    if (pool) {
        if (ith == 0) pool->run(n_tasks, task);
        return;
    }
    for (int64_t t = ith; t < n_tasks; t += nth) task(t);
}

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

#include <cstring>
#include <vector>

namespace kazeia {

namespace {

constexpr int64_t NR = 6;    // output columns per micro-tile
constexpr int64_t NC = 96;   // columns per cache block (B block ~ NC * KC floats in L2)
constexpr int64_t KC_MAX = 256;
// Weights are prefetched this many K steps ahead: streamed frames read each weight once, and
// the hardware prefetchers alone fall short of the memory bandwidth there (full decodes, which
// reuse each weight, neither gain nor lose).
constexpr int64_t PREFETCH_K = 16;
constexpr int64_t PANEL_OUTER_MAX_INPUT = 512 * 1024;  // bytes of a column block's input

// Largest divisor of `in` that is <= KC_MAX: a K block then never straddles two taps, so
// it is one contiguous run of each input column.
int64_t k_block(int64_t in) {
    for (int64_t kc = std::min(in, KC_MAX); kc > 1; --kc)
        if (in % kc == 0 && (kc >= 32 || kc == in)) return kc;
    return in <= KC_MAX ? in : 1;
}

// Weights are f32 or f16 (half the bytes to stream: a streamed frame reads every weight once).
inline float to_f32(float v) { return v; }
inline float to_f32(ggml_fp16_t v) { return ggml_fp16_to_fp32(v); }

#if KAZEIA_AVX2
KAZEIA_AVX2_FN inline __m256 load8(const float *p) { return _mm256_loadu_ps(p); }
KAZEIA_AVX2_FN inline __m256 load8(const ggml_fp16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
}
#endif
#if KAZEIA_NEON
inline float32x4_t load4(const float *p) { return vld1q_f32(p); }
inline float32x4_t load4(const ggml_fp16_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t *>(p))));
}
#endif

// acc[j][r] = sum_k A[k][r] * B_j[k] for a 16-row panel and COLS <= NR columns. Narrow tiles
// (an input's last columns, and every tile of a streamed frame: 1-4 columns before the
// vocoder) get their own instance instead of paying NR columns of arithmetic for one. COLS is a
// constant, so the loops unroll and the accumulators stay in registers.
#if KAZEIA_AVX2
template <typename T, int COLS>
KAZEIA_AVX2_FN inline void micro_kernel_avx2(const T *a, const float *const b[NR], int64_t kc,
                                             float acc[NR][CONV_PANEL]) {
    __m256 c[COLS][2];
    for (int j = 0; j < COLS; ++j) c[j][0] = c[j][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; ++k, a += CONV_PANEL) {
        _mm_prefetch(reinterpret_cast<const char *>(a + PREFETCH_K * CONV_PANEL), _MM_HINT_T0);
        const __m256 a0 = load8(a), a1 = load8(a + 8);
        for (int j = 0; j < COLS; ++j) {
            const __m256 v = _mm256_broadcast_ss(b[j] + k);
            c[j][0] = _mm256_fmadd_ps(a0, v, c[j][0]);
            c[j][1] = _mm256_fmadd_ps(a1, v, c[j][1]);
        }
    }
    for (int j = 0; j < COLS; ++j) {
        _mm256_storeu_ps(acc[j], c[j][0]);
        _mm256_storeu_ps(acc[j] + 8, c[j][1]);
    }
}
#endif

#if KAZEIA_AVX2
KAZEIA_AVX512_FN inline __m512 load16(const float *p) { return _mm512_loadu_ps(p); }
KAZEIA_AVX512_FN inline __m512 load16(const ggml_fp16_t *p) {
    // The zero-masked form of _mm512_cvtph_ps (same values), whose GCC 12 header reads an
    // uninitialized register (-Wmaybe-uninitialized).
    return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
}

// The AVX-512 kernel for two panels at once (a and a2), one 16-lane register per panel column:
// every lane is the same chain of fused multiply-adds over k as in micro_kernel_avx2 (the same
// bits), with half the instructions per multiply-add, which CPUs with 512-bit FMA units
// (Zen 5, Intel server cores) run at up to twice the rate.
template <typename T, int COLS>
KAZEIA_AVX512_FN inline void pair_kernel_avx512(const T *a, const T *a2, const float *const b[NR],
                                                int64_t kc, float acc[2][NR][CONV_PANEL]) {
    static_assert(CONV_PANEL == 16, "one 16-lane register per panel column");
    __m512 c[COLS][2];
    for (int j = 0; j < COLS; ++j) c[j][0] = c[j][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; ++k, a += CONV_PANEL, a2 += CONV_PANEL) {
        _mm_prefetch(reinterpret_cast<const char *>(a + PREFETCH_K * CONV_PANEL), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char *>(a2 + PREFETCH_K * CONV_PANEL), _MM_HINT_T0);
        const __m512 w0 = load16(a), w1 = load16(a2);
        for (int j = 0; j < COLS; ++j) {
            const __m512 v = _mm512_set1_ps(b[j][k]);
            c[j][0] = _mm512_fmadd_ps(w0, v, c[j][0]);
            c[j][1] = _mm512_fmadd_ps(w1, v, c[j][1]);
        }
    }
    for (int j = 0; j < COLS; ++j) {
        _mm512_storeu_ps(acc[0][j], c[j][0]);
        _mm512_storeu_ps(acc[1][j], c[j][1]);
    }
}
#endif

template <typename T, int COLS>
inline void micro_kernel(const T *a, const float *const b[NR], int64_t kc,
                         float acc[NR][CONV_PANEL]) {
#if KAZEIA_NEON
    static_assert(CONV_PANEL == 16, "four NEON vectors per panel column");
    float32x4_t c[COLS][4];
    for (int j = 0; j < COLS; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = vdupq_n_f32(0.0f);
    for (int64_t k = 0; k < kc; ++k, a += CONV_PANEL) {
        __builtin_prefetch(a + PREFETCH_K * CONV_PANEL);
        const float32x4_t a0 = load4(a), a1 = load4(a + 4), a2 = load4(a + 8), a3 = load4(a + 12);
        for (int j = 0; j < COLS; ++j) {
            const float32x4_t v = vdupq_n_f32(b[j][k]);
            c[j][0] = vfmaq_f32(c[j][0], a0, v);
            c[j][1] = vfmaq_f32(c[j][1], a1, v);
            c[j][2] = vfmaq_f32(c[j][2], a2, v);
            c[j][3] = vfmaq_f32(c[j][3], a3, v);
        }
    }
    for (int j = 0; j < COLS; ++j)
        for (int q = 0; q < 4; ++q) vst1q_f32(acc[j] + 4 * q, c[j][q]);
#else
    for (int j = 0; j < COLS; ++j)
        for (int64_t r = 0; r < CONV_PANEL; ++r) acc[j][r] = 0.0f;
    for (int64_t k = 0; k < kc; ++k, a += CONV_PANEL)
        for (int j = 0; j < COLS; ++j)
            for (int64_t r = 0; r < CONV_PANEL; ++r) acc[j][r] += to_f32(a[r]) * b[j][k];
#endif
}

// One instance per tile width (COLS is a constant: the loops unroll), called with the arguments
// that follow the kernel's name.
#define KAZEIA_TILE_CASES(kernel, ...)                        \
    static_assert(NR == 6, "one case per tile width");       \
    switch (cols) {                                           \
        case 1: return kernel<T, 1>(__VA_ARGS__);             \
        case 2: return kernel<T, 2>(__VA_ARGS__);             \
        case 3: return kernel<T, 3>(__VA_ARGS__);             \
        case 4: return kernel<T, 4>(__VA_ARGS__);             \
        case 5: return kernel<T, 5>(__VA_ARGS__);             \
        default: return kernel<T, 6>(__VA_ARGS__);            \
    }

#if KAZEIA_AVX2
template <typename T>
KAZEIA_AVX2_FN void tile_kernel_avx2(int64_t cols, const T *a, const float *const b[NR],
                                     int64_t kc, float acc[NR][CONV_PANEL]) {
    KAZEIA_TILE_CASES(micro_kernel_avx2, a, b, kc, acc)
}
#endif

template <typename T>
inline void tile_kernel(int64_t cols, const T *a, const float *const b[NR], int64_t kc,
                        float acc[NR][CONV_PANEL]) {
#if KAZEIA_AVX2
    if (use_avx2()) return tile_kernel_avx2<T>(cols, a, b, kc, acc);
#endif
    KAZEIA_TILE_CASES(micro_kernel, a, b, kc, acc)
}

// Two panels (a, a2) for one column tile: the AVX-512 kernel where the CPU has it (the caller
// asks only then: use_avx512), else one panel after the other.
template <typename T>
inline void pair_kernel(int64_t cols, const T *a, const T *a2, const float *const b[NR],
                        int64_t kc, float acc[2][NR][CONV_PANEL]) {
#if KAZEIA_AVX2
    KAZEIA_TILE_CASES(pair_kernel_avx512, a, a2, b, kc, acc)
#else
    tile_kernel(cols, a, b, kc, acc[0]);
    tile_kernel(cols, a2, b, kc, acc[1]);
#endif
}

template <typename T>
void conv_gemm_run(ggml_tensor *dst, int ith, int nth, const ConvGemmParams *p) {
    const ggml_tensor *x = dst->src[0], *w = dst->src[1], *bias = dst->src[2], *res = dst->src[3];
    const int64_t in = x->ne[0], out = dst->ne[0], len = dst->ne[1];
    const int64_t K = w->ne[0], kc = k_block(in);
    const size_t tap_stride = (size_t)(p->dilation * in);
    const auto *xd = static_cast<const float *>(x->data);
    const auto *wd = static_cast<const T *>(w->data);
    const float *bd = bias ? static_cast<const float *>(bias->data) : nullptr;
    const float *rd = res ? static_cast<const float *>(res->data) : nullptr;
    auto *yd = static_cast<float *>(dst->data);

    // A task is one block of NC output columns times a range of output panels. Short inputs
    // (a streamed frame is 1-4 columns before the vocoder) have one column block: their output
    // channels are split instead, so that every thread streams a share of the weights.
    const int64_t n_blocks = (len + NC - 1) / NC, n_panels = out / CONV_PANEL;
    const int64_t want = (int64_t)(p->pool ? 4 * p->pool->n_threads() : 4 * nth);
    const int64_t m_split = std::max<int64_t>(1, std::min<int64_t>(n_panels, (want + n_blocks - 1) / n_blocks));
    // With AVX-512 the kernel takes two panels at a time (a task's odd last one goes alone).
#if KAZEIA_AVX2
    const int64_t step = use_avx512() ? 2 : 1;
#else
    const int64_t step = 1;
#endif
    const int64_t panels_per = (n_panels + m_split - 1) / m_split;
    // When a column block's whole input fits in L2 (a streamed frame: 1-32 columns), each task
    // walks its panels one at a time through all of K: one sequential stream of weights per
    // task, which the prefetchers follow (unlike K-block-outer order, whose short runs per
    // panel stop them). Otherwise K-block-outer keeps the input block in cache.
    const bool panel_outer = K * std::min(len, NC) * (int64_t)sizeof(float) <= PANEL_OUTER_MAX_INPUT;
    auto block = [&](int64_t task) {
        const int64_t ib = task / m_split, ms = task % m_split;
        const int64_t nb = ib * NC, nb_end = std::min(len, nb + NC);
        const int64_t m_begin = ms * panels_per * CONV_PANEL;
        const int64_t m_end = std::min(out, m_begin + panels_per * CONV_PANEL);
        float acc[2][NR][CONV_PANEL];
        // One K block of `np` (1 or 2) output panels from m0 for every column tile of the block.
        auto panel_step = [&](int64_t m0, int64_t np, int64_t k0) {
            const int64_t tap = k0 / in, c0 = k0 % in;
            const bool first = k0 == 0;
            const T *a = wd + m0 * K + k0 * CONV_PANEL;
            for (int64_t n = nb; n < nb_end; n += NR) {
                const float *b[NR];
                for (int64_t j = 0; j < NR; ++j) {
                    const int64_t col = std::min(n + j, nb_end - 1);
                    b[j] = xd + col * in + tap * tap_stride + c0;
                }
                const int64_t ncols = std::min(NR, nb_end - n);
                if (np == 2) pair_kernel(ncols, a, a + CONV_PANEL * K, b, kc, acc);
                else tile_kernel(ncols, a, b, kc, acc[0]);
                for (int64_t q = 0; q < np; ++q) {
                    const int64_t m = m0 + q * CONV_PANEL;
                    for (int64_t j = 0; j < ncols; ++j) {
                        float *y = yd + (n + j) * out + m;
                        const float *s = acc[q][j];
                        if (first) {
                            const float *r = rd ? rd + (n + j) * out + m : nullptr;
                            for (int64_t i = 0; i < CONV_PANEL; ++i)
                                y[i] = s[i] + (bd ? bd[m + i] : 0.0f) + (r ? r[i] : 0.0f);
                        } else {
                            for (int64_t i = 0; i < CONV_PANEL; ++i) y[i] += s[i];
                        }
                    }
                }
            }
        };
        const int64_t stride = step * CONV_PANEL;
        auto panels_at = [&](int64_t m0) { return std::min(stride, m_end - m0) / CONV_PANEL; };
        if (panel_outer) {
            for (int64_t m0 = m_begin; m0 < m_end; m0 += stride)
                for (int64_t k0 = 0; k0 < K; k0 += kc) panel_step(m0, panels_at(m0), k0);
        } else {
            for (int64_t k0 = 0; k0 < K; k0 += kc)
                for (int64_t m0 = m_begin; m0 < m_end; m0 += stride)
                    panel_step(m0, panels_at(m0), k0);
        }
    };
    const int64_t n_tasks = n_blocks * m_split;
    run_tasks(p->pool, ith, nth, n_tasks, block);
}

void conv_gemm_kernel(ggml_tensor *dst, int ith, int nth, void *userdata) {
    const auto *p = static_cast<const ConvGemmParams *>(userdata);
    if (dst->src[1]->type == GGML_TYPE_F16) conv_gemm_run<ggml_fp16_t>(dst, ith, nth, p);
    else conv_gemm_run<float>(dst, ith, nth, p);
}

template <typename T>
void pack_panels(ggml_tensor *w) {
    const int64_t K = w->ne[0], M = w->ne[1];
    auto *data = static_cast<T *>(w->data);
    std::vector<T> panel(K * CONV_PANEL);
    for (int64_t m0 = 0; m0 < M; m0 += CONV_PANEL) {
        T *rows = data + m0 * K;  // CONV_PANEL rows of K values
        for (int64_t k = 0; k < K; ++k)
            for (int64_t r = 0; r < CONV_PANEL; ++r) panel[k * CONV_PANEL + r] = rows[r * K + k];
        std::memcpy(rows, panel.data(), panel.size() * sizeof(T));
    }
}

}  // namespace

bool conv_gemm_supported(const ggml_tensor *w) {
    return (w->type == GGML_TYPE_F32 || w->type == GGML_TYPE_F16) && ggml_is_contiguous(w) &&
           w->ne[1] % CONV_PANEL == 0 && w->ne[1] >= CONV_PANEL;
}

void pack_conv_weight(ggml_tensor *w) {
    GGML_ASSERT(conv_gemm_supported(w));
    if (w->type == GGML_TYPE_F16) pack_panels<ggml_fp16_t>(w);
    else pack_panels<float>(w);
}

ggml_tensor *conv_gemm(ggml_context *ctx, ggml_tensor *x_full, ggml_tensor *w, ggml_tensor *bias,
                       ggml_tensor *residual, const ConvGemmParams *params) {
    GGML_ASSERT(x_full->type == GGML_TYPE_F32 && ggml_is_contiguous(x_full));
    const int64_t in = x_full->ne[0], out = w->ne[1];
    GGML_ASSERT(w->ne[0] == params->taps * in && out % CONV_PANEL == 0);
    const int64_t len = x_full->ne[1] - (params->taps - 1) * params->dilation;
    GGML_ASSERT(len >= 1);
    GGML_ASSERT(!bias || bias->ne[0] == out);
    GGML_ASSERT(!residual || (residual->ne[0] == out && residual->ne[1] == len &&
                              ggml_is_contiguous(residual)));
    ggml_tensor *args[4] = {x_full, w, bias, residual};
    // ggml_custom_4d takes a dense argument list: keep null slots last.
    const int n_args = residual ? 4 : (bias ? 3 : 2);
    GGML_ASSERT(!residual || bias);
    return ggml_custom_4d(ctx, GGML_TYPE_F32, out, len, 1, 1, args, n_args, conv_gemm_kernel,
                          GGML_N_TASKS_MAX, const_cast<ConvGemmParams *>(params));
}

}  // namespace kazeia

#include "ggml-cpu.h"
#include "q8_gemm.h"

namespace kazeia {

namespace {

constexpr int64_t MUL_MAT_MIN_TASK_ROWS = 64;
constexpr int64_t MUL_MAT_TASKS_PER_THREAD = 4;

void pool_mul_mat_kernel(ggml_tensor *dst, int ith, int /*nth*/, void *userdata) {
    if (ith != 0) return;
    auto *pool = static_cast<WorkerPool *>(userdata);
    const ggml_tensor *w = dst->src[0], *x = dst->src[1], *ids = dst->src[2];
    const int64_t K = w->ne[0], M = w->ne[1], n = x->ne[1];
    const char *wd = static_cast<const char *>(w->data);
    if (ids) wd += (size_t)*static_cast<const int32_t *>(ids->data) * w->nb[2];
    const ggml_type_traits_cpu *traits = cpu_backend().type_traits(w->type);
    const ggml_type dot_type = traits->vec_dot_type;

    // Activations in the weight's dot type (q8_0 for q8_0, q8_K for q4_k, ...), once.
    thread_local std::vector<uint8_t> converted;
    const size_t row_size = ggml_row_size(dot_type, K);
    const char *xd;
    if (dot_type == GGML_TYPE_F32 && x->nb[1] == K * sizeof(float)) {
        xd = static_cast<const char *>(x->data);
    } else {
        converted.resize(row_size * n);
        const ggml_from_float_t from_float = cpu_backend().type_traits(dot_type)->from_float;
        for (int64_t j = 0; j < n; ++j) {
            const float *col = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + j * x->nb[1]);
            if (dot_type == GGML_TYPE_F32) std::memcpy(converted.data() + j * row_size, col, K * sizeof(float));
            else from_float(col, converted.data() + j * row_size, K);
        }
        xd = reinterpret_cast<const char *>(converted.data());
    }
    mul_mat_converted(wd, w->nb[1], w->type, M, K, xd, row_size, n, static_cast<float *>(dst->data),
                      pool, w->type == GGML_TYPE_Q8_0 && q8_gemm_pays(n));
}

}  // namespace

void mul_mat_converted(const char *w, size_t w_row, ggml_type type, int64_t M, int64_t K,
                       const char *x, size_t x_row, int64_t n, float *y, WorkerPool *pool, bool gemm) {
    int64_t m_first = 0;  // rows below it are done
    if (gemm) {
        GGML_ASSERT(type == GGML_TYPE_Q8_0);
        q8_gemm(w, (int64_t)w_row, M, K, x, n, y, pool);
        m_first = M - M % Q8_GEMM_ROWS;
    }
    const int64_t rows = M - m_first;
    if (rows == 0) return;
    const ggml_type_traits_cpu *traits = cpu_backend().type_traits(type);
    // Few long tasks: each is one sequential stream through its rows, which the hardware
    // prefetchers serve far better than many short interleaved ones. A few per thread still
    // let a preempted thread's share be taken over.
    const int64_t n_tasks = std::max<int64_t>(
        1, std::min<int64_t>((rows + MUL_MAT_MIN_TASK_ROWS - 1) / MUL_MAT_MIN_TASK_ROWS,
                             MUL_MAT_TASKS_PER_THREAD * pool->n_threads()));
    const int64_t rows_per_task = (rows + n_tasks - 1) / n_tasks;
    pool->run(n_tasks, [&](int64_t t) {
        const int64_t m0 = m_first + t * rows_per_task, m1 = std::min(M, m0 + rows_per_task);
        for (int64_t m = m0; m < m1; ++m)
            for (int64_t j = 0; j < n; ++j)
                traits->vec_dot((int)K, y + j * M + m, 0, w + m * w_row, 0, x + j * x_row, 0, 1);
    });
}

ggml_tensor *pool_mul_mat(ggml_context *ctx, ggml_tensor *w, ggml_tensor *x, WorkerPool *pool,
                          ggml_tensor *ids) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->ne[0] == w->ne[0] && x->nb[0] == sizeof(float));
    GGML_ASSERT(ggml_is_contiguous(w) && x->ne[2] == 1 && x->ne[3] == 1);
    GGML_ASSERT(ids ? (ids->type == GGML_TYPE_I32 && w->ne[3] == 1) : w->ne[2] == 1);
    ggml_tensor *args[3] = {w, x, ids};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, args, ids ? 3 : 2,
                          pool_mul_mat_kernel, 1, pool);
}

}  // namespace kazeia

#include <cmath>

namespace kazeia {

namespace {

void concat_time_kernel(ggml_tensor *dst, int ith, int /*nth*/, void * /*userdata*/) {
    if (ith != 0) return;
    const ggml_tensor *a = dst->src[0], *b = dst->src[1];
    std::memcpy(dst->data, a->data, ggml_nbytes(a));
    std::memcpy(static_cast<char *>(dst->data) + ggml_nbytes(a), b->data, ggml_nbytes(b));
}

#if KAZEIA_AVX2
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
#endif

inline float dot(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    float sum = 0.0f;
#if KAZEIA_AVX2
    if (use_avx2()) return dot_avx2(a, b, n);
#elif KAZEIA_NEON
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (; i + 4 <= n; i += 4) acc = vfmaq_f32(acc, vld1q_f32(a + i), vld1q_f32(b + i));
    sum = vaddvq_f32(acc);
#endif
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

// What one (query, head) task of the attention op reads and writes.
struct AttentionRow {
    const float *qd, *kd, *vd, *md;
    float *od;
    int64_t hd, nh, n_kv, kv_dim, group;
    float scale;
};

// A head's key or value rows lie one cache row apart (all heads of a position are together),
// e.g. 4 KB for the talker: every row starts a new page, where the hardware prefetchers stop,
// so the rows a few positions ahead are asked for here (else a long synthesis's talker waits
// on its cache far longer than its bytes take to read).
constexpr int64_t ATTENTION_PREFETCH = 16;  // positions ahead
// Asks for the `n` floats of `rows`' row c + ATTENTION_PREFETCH (rows `stride` apart), if any.
inline void prefetch_ahead(const float *rows, int64_t c, int64_t n_rows, int64_t stride, int64_t n) {
    if (c + ATTENTION_PREFETCH >= n_rows) return;
    const float *row = rows + (c + ATTENTION_PREFETCH) * stride;
    for (int64_t d = 0; d < n; d += 16) __builtin_prefetch(row + d);  // 64-byte lines
}

// One (query, key/value head): scores, softmax, then the weighted sum of the value rows, for
// the `group` query heads that share that key/value head together, so that each key and value
// row is read once for all of them (a long synthesis's talker attention is bound by reading its
// cache). Each head's sums run in the same order as one head alone would. Always inlined, so
// that attention_row_avx2 compiles it for AVX2/FMA.
__attribute__((always_inline)) inline void attention_row(const AttentionRow &a, int64_t t) {
    const int64_t n_groups = a.nh / a.group, i = t / n_groups, g = t % n_groups;
    const float *row_mask = a.md + i * a.n_kv;
    thread_local std::vector<float> scores, max_score, total;  // scores: [group][n_kv]
    scores.resize(a.group * a.n_kv);
    max_score.assign(a.group, -INFINITY);
    total.assign(a.group, 0.0f);
    const float *q0 = a.qd + (i * a.nh + g * a.group) * a.hd;
    for (int64_t c = 0; c < a.n_kv; ++c) {
        const float *kv = a.kd + c * a.kv_dim + g * a.hd;
        prefetch_ahead(a.kd + g * a.hd, c, a.n_kv, a.kv_dim, a.hd);
        for (int64_t h = 0; h < a.group; ++h) {
            const float s = row_mask[c] == -INFINITY
                                ? -INFINITY
                                : dot(q0 + h * a.hd, kv, a.hd) * a.scale + row_mask[c];
            scores[h * a.n_kv + c] = s;
            max_score[h] = std::max(max_score[h], s);
        }
    }
    float *o0 = a.od + (i * a.nh + g * a.group) * a.hd;
    std::fill(o0, o0 + a.group * a.hd, 0.0f);
    for (int64_t c = 0; c < a.n_kv; ++c) {
        const float *vv = a.vd + c * a.kv_dim + g * a.hd;
        prefetch_ahead(a.vd + g * a.hd, c, a.n_kv, a.kv_dim, a.hd);
        for (int64_t h = 0; h < a.group; ++h) {
            const float s = scores[h * a.n_kv + c];
            if (s == -INFINITY) continue;
            const float w = std::exp(s - max_score[h]);
            total[h] += w;
            float *o = o0 + h * a.hd;
            for (int64_t d = 0; d < a.hd; ++d) o[d] += w * vv[d];
        }
    }
    for (int64_t h = 0; h < a.group; ++h) {
        const float inv = 1.0f / total[h];
        for (int64_t d = 0; d < a.hd; ++d) o0[h * a.hd + d] *= inv;
    }
}

#if KAZEIA_AVX2
KAZEIA_AVX2_FN void attention_row_avx2(const AttentionRow &a, int64_t t) { attention_row(a, t); }
#endif

void window_attention_kernel(ggml_tensor *dst, int ith, int nth, void *userdata) {
    const auto *p = static_cast<const AttentionParams *>(userdata);
    const ggml_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2], *mask = dst->src[3];
    const int64_t nh = q->ne[1], n = q->ne[2];
    const AttentionRow row{static_cast<const float *>(q->data), static_cast<const float *>(k->data),
                           static_cast<const float *>(v->data),
                           static_cast<const float *>(mask->data), static_cast<float *>(dst->data),
                           q->ne[0], nh, k->ne[1], k->ne[0], nh / p->n_kv_heads, p->scale};
#if KAZEIA_AVX2
    if (use_avx2()) {
        run_tasks(p->pool, ith, nth, n * p->n_kv_heads, [&](int64_t t) { attention_row_avx2(row, t); });
        return;
    }
#endif
    run_tasks(p->pool, ith, nth, n * p->n_kv_heads, [&](int64_t t) { attention_row(row, t); });
}

}  // namespace

ggml_tensor *concat_time(ggml_context *ctx, ggml_tensor *a, ggml_tensor *b) {
    GGML_ASSERT(a->type == GGML_TYPE_F32 && b->type == GGML_TYPE_F32);
    GGML_ASSERT(ggml_is_contiguous(a) && ggml_is_contiguous(b) && a->ne[0] == b->ne[0]);
    GGML_ASSERT(a->ne[2] == 1 && b->ne[2] == 1 && a->ne[3] == 1 && b->ne[3] == 1);
    ggml_tensor *args[2] = {a, b};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, a->ne[0], a->ne[1] + b->ne[1], 1, 1, args, 2,
                          concat_time_kernel, 1, nullptr);
}

ggml_tensor *window_attention(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k, ggml_tensor *v,
                              ggml_tensor *mask, const AttentionParams *params) {
    const int64_t hd = q->ne[0], nh = q->ne[1], n = q->ne[2], n_kv = k->ne[1];
    GGML_ASSERT(q->type == GGML_TYPE_F32 && k->type == GGML_TYPE_F32 && v->type == GGML_TYPE_F32);
    GGML_ASSERT(ggml_is_contiguous(q) && ggml_is_contiguous(k) && ggml_is_contiguous(v));
    GGML_ASSERT(params->n_kv_heads >= 1 && nh % params->n_kv_heads == 0);
    GGML_ASSERT(k->ne[0] == hd * params->n_kv_heads && ggml_are_same_shape(k, v));
    GGML_ASSERT(mask->type == GGML_TYPE_F32 && ggml_is_contiguous(mask));
    GGML_ASSERT(mask->ne[0] == n_kv && mask->ne[1] == n);
    ggml_tensor *args[4] = {q, k, v, mask};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, hd * nh, n, 1, 1, args, 4, window_attention_kernel,
                          GGML_N_TASKS_MAX, const_cast<AttentionParams *>(params));
}

const char *kernel_isa() {
#if KAZEIA_AVX2
    const char *decoder = use_avx512() ? "AVX2 FMA F16C, decoder GEMM AVX-512"
                          : use_avx2()   ? "AVX2 FMA F16C"
                                         : "portable (x86-64 baseline)";
#elif KAZEIA_NEON
    const char *decoder = "NEON (fp16 conversion)";
#else
    const char *decoder = "portable";
#endif
    static const std::string isa = std::string(decoder) + ", q8_0 prefill " + q8_gemm_isa();
    return isa.c_str();
}

}  // namespace kazeia

namespace kazeia {

ggml_tensor *mul_mat_f32(ggml_context *ctx, ggml_tensor *a, ggml_tensor *b) {
    ggml_tensor *y = ggml_mul_mat(ctx, a, b);
    ggml_mul_mat_set_prec(y, GGML_PREC_F32);
    return y;
}

ggml_tensor *attention_in_ggml_ops(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k, ggml_tensor *v,
                                   ggml_tensor *mask, int64_t n_kv_heads, float scale) {
    const int64_t hd = q->ne[0], nh = q->ne[1], n = q->ne[2], nkv = n_kv_heads, n_kv = k->ne[1];
    auto heads = [&](ggml_tensor *t) {  // [hd * nkv, n_kv] -> [hd, nkv, n_kv]
        return ggml_view_3d(ctx, t, hd, nkv, n_kv, hd * ggml_element_size(t), t->nb[1], 0);
    };
    // Dense operands: ggml's Vulkan backend copies a strided one to f16 before the product.
    ggml_tensor *kh = ggml_cont(ctx, ggml_permute(ctx, heads(k), 0, 2, 1, 3));  // [hd, n_kv, nkv]
    ggml_tensor *qh = ggml_cont(ctx, ggml_permute(ctx, q, 0, 2, 1, 3));         // [hd, n, nh]
    // [n_kv, n, nh]; query head h reads kv head h / (nh / nkv), as ggml_mul_mat broadcasts.
    ggml_tensor *w = ggml_soft_max_ext(ctx, mul_mat_f32(ctx, kh, qh), mask, scale, 0.0f);
    ggml_tensor *vt = ggml_cont(ctx, ggml_permute(ctx, heads(v), 1, 2, 0, 3));  // [n_kv, hd, nkv]
    ggml_tensor *o = ggml_permute(ctx, mul_mat_f32(ctx, vt, w), 0, 2, 1, 3);  // [hd, nh, n]
    return ggml_reshape_2d(ctx, ggml_cont(ctx, o), hd * nh, n);
}

ggml_tensor *strided_view(ggml_context *ctx, ggml_tensor *full, const int64_t (&ne)[4],
                          const size_t (&nb)[4]) {
    GGML_ASSERT(ggml_is_contiguous(full) && full->type == GGML_TYPE_F32);
    ggml_tensor *v = ggml_view_1d(ctx, full, 1, 0);
    for (int d = 0; d < 4; ++d) v->ne[d] = ne[d];
    for (int d = 1; d < 4; ++d) v->nb[d] = nb[d];
    GGML_ASSERT(ggml_nbytes(v) <= ggml_nbytes(full));
    return v;
}

ggml_tensor *window_attention_in_ggml_ops(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k,
                                          ggml_tensor *v, ggml_tensor *mask, int64_t n_kv_heads,
                                          float scale) {
    const int64_t hd = q->ne[0], nh = q->ne[1], n = q->ne[2], nkv = n_kv_heads;
    const int64_t window = k->ne[1] - n + 1;
    // [hd, window, nkv, n]: query i's keys (or values) per kv head, overlapping views made
    // dense (ggml's Vulkan backend copies a strided operand to f16 before its product).
    auto windows = [&](ggml_tensor *t) {
        const size_t row = t->nb[1];
        return ggml_cont(ctx, strided_view(ctx, t, {hd, window, nkv, n},
                                           {sizeof(float), row, hd * sizeof(float), row}));
    };
    // Query head h = g + (nh / nkv) * j reads kv head j, as the CPU kernel and HF's repeat_kv.
    ggml_tensor *qg = ggml_reshape_4d(ctx, q, hd, nh / nkv, nkv, n);
    ggml_tensor *w = ggml_soft_max_ext(ctx, mul_mat_f32(ctx, windows(k), qg), mask, scale, 0.0f);
    ggml_tensor *vt = ggml_cont(ctx, ggml_permute(ctx, windows(v), 1, 0, 2, 3));  // [window, hd, ..]
    return ggml_reshape_2d(ctx, mul_mat_f32(ctx, vt, w), hd * nh, n);  // [hd, nh / nkv, nkv, n]
}

ggml_tensor *snake_beta_in_ggml_ops(ggml_context *ctx, ggml_tensor *x, ggml_tensor *alpha,
                                    ggml_tensor *inv_beta) {
    // sin^2 has period pi: reduced to [-pi/2, pi/2] first, as the CPU kernel does, because a
    // GPU's sin is accurate only near zero (Vulkan leaves it unspecified beyond [-pi, pi]; the
    // decoder's arguments reach the hundreds).
    constexpr float PI = 3.14159265358979f;
    ggml_tensor *t = ggml_mul(ctx, x, alpha);
    ggml_tensor *turns = ggml_round(ctx, ggml_scale(ctx, t, 1.0f / PI));
    ggml_tensor *r = ggml_sub(ctx, t, ggml_scale(ctx, turns, PI));
    ggml_tensor *s = ggml_sqr(ctx, ggml_sin(ctx, r));
    return ggml_add(ctx, x, ggml_mul(ctx, s, inv_beta));
}

}  // namespace kazeia
