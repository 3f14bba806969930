// The conv GEMM's x86-64 micro-kernels: one packed panel on AVX2/FMA (f16 weights widened by
// F16C, bf16 ones by a shift), up to four panels at once on AVX-512F with every lane's
// multiply-adds in the AVX2 order; the rounding of inputs to bf16 on AVX2.
#include "ops/arch.h"

#if KAZEIA_AVX2
#include <immintrin.h>

#include <cmath>

namespace kazeia::x86 {

namespace {

KAZEIA_AVX2_FN inline __m256 load8(const float *p) { return _mm256_loadu_ps(p); }
KAZEIA_AVX2_FN inline __m256 load8(const ggml_fp16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
}
// A bf16 value is the high half of its float's bits.
KAZEIA_AVX2_FN inline __m256 load8(const ggml_bf16_t *p) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// acc[j][r] = sum_k A[k][r] * B_j[k] for a 16-row panel and COLS <= CONV_NR columns. Narrow
// tiles (an input's last columns, and every tile of a streamed frame: 1-4 columns before the
// vocoder) get their own instance instead of paying CONV_NR columns of arithmetic for one. COLS
// is a constant, so the loops unroll and the accumulators stay in registers.
template <typename T, int COLS>
KAZEIA_AVX2_FN inline void micro_kernel(const T *a, const float *const b[CONV_NR], int64_t kc,
                                        float acc[CONV_NR][CONV_PANEL]) {
    __m256 c[COLS][2];
    KAZEIA_UNROLL_COLUMNS
    for (int j = 0; j < COLS; ++j) c[j][0] = c[j][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; ++k, a += CONV_PANEL) {
        _mm_prefetch(reinterpret_cast<const char *>(a + CONV_PREFETCH_K * CONV_PANEL), _MM_HINT_T0);
        const __m256 a0 = load8(a), a1 = load8(a + 8);
        KAZEIA_UNROLL_COLUMNS
        for (int j = 0; j < COLS; ++j) {
            const __m256 v = _mm256_broadcast_ss(b[j] + k);
            c[j][0] = _mm256_fmadd_ps(a0, v, c[j][0]);
            c[j][1] = _mm256_fmadd_ps(a1, v, c[j][1]);
        }
    }
    KAZEIA_UNROLL_COLUMNS
    for (int j = 0; j < COLS; ++j) {
        _mm256_storeu_ps(acc[j], c[j][0]);
        _mm256_storeu_ps(acc[j] + 8, c[j][1]);
    }
}

template <typename T>
KAZEIA_AVX2_FN inline void tile_kernel(int64_t cols, const T *a, const float *const b[CONV_NR],
                                       int64_t kc, float acc[CONV_NR][CONV_PANEL]) {
    KAZEIA_TILE_CASES(micro_kernel, a, b, kc, acc)
}

KAZEIA_AVX512_FN inline __m512 load16(const float *p) { return _mm512_loadu_ps(p); }
KAZEIA_AVX512_FN inline __m512 load16(const ggml_fp16_t *p) {
    // The zero-masked form of _mm512_cvtph_ps (same values), whose GCC 12 header reads an
    // uninitialized register (-Wmaybe-uninitialized).
    return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
}
KAZEIA_AVX512_FN inline __m512 load16(const ggml_bf16_t *p) {
    // Zero-masked forms again, for the same GCC 12 warning.
    const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
    const __m512i wide = _mm512_maskz_cvtepu16_epi32(0xFFFF, half);
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, wide, 16));
}

// The AVX-512 kernel for P panels at once (panel q at a + q * panel_stride), one 16-lane
// register per panel column: every lane is the same chain of fused multiply-adds over k as in
// micro_kernel (the same bits), with half the instructions per multiply-add, which CPUs with
// 512-bit FMA units run at up to twice the rate. Four panels of six columns keep 24
// accumulators in registers: ten loads for every 24 multiply-adds. A struct, so that
// KAZEIA_TILE_CASES can name the kernel of P panels as Panels<P>::micro_kernel.
template <int P>
struct Panels {
    // Accumulators, weights and the broadcast column value all in the 32 zmm registers.
    static_assert(P * CONV_NR + P + 1 <= 32, "the micro-tile must fit the zmm registers");

    template <typename T, int COLS>
    KAZEIA_AVX512_FN static void micro_kernel(const T *a, int64_t panel_stride,
                                              const float *const b[CONV_NR], int64_t kc,
                                              float acc[CONV_MAX_PANELS][CONV_NR][CONV_PANEL]) {
        static_assert(CONV_PANEL == 16, "one 16-lane register per panel column");
        __m512 c[COLS][P];
        KAZEIA_UNROLL_COLUMNS
        for (int j = 0; j < COLS; ++j)
            KAZEIA_UNROLL_COLUMNS
            for (int q = 0; q < P; ++q) c[j][q] = _mm512_setzero_ps();
        for (int64_t k = 0; k < kc; ++k, a += CONV_PANEL) {
            __m512 w[P];
            KAZEIA_UNROLL_COLUMNS
            for (int q = 0; q < P; ++q) {
                const T *panel = a + q * panel_stride;
                _mm_prefetch(reinterpret_cast<const char *>(panel + CONV_PREFETCH_K * CONV_PANEL),
                             _MM_HINT_T0);
                w[q] = load16(panel);
            }
            KAZEIA_UNROLL_COLUMNS
            for (int j = 0; j < COLS; ++j) {
                const __m512 v = _mm512_set1_ps(b[j][k]);
                KAZEIA_UNROLL_COLUMNS
                for (int q = 0; q < P; ++q) c[j][q] = _mm512_fmadd_ps(w[q], v, c[j][q]);
            }
        }
        KAZEIA_UNROLL_COLUMNS
        for (int j = 0; j < COLS; ++j)
            KAZEIA_UNROLL_COLUMNS
            for (int q = 0; q < P; ++q) _mm512_storeu_ps(acc[q][j], c[j][q]);
    }
};

// The kernel of P panels for a tile of `cols` columns.
template <typename T, int P>
KAZEIA_AVX512_FN inline void fixed_panels_kernel(int64_t cols, const T *a, int64_t panel_stride,
                                                 const float *const b[CONV_NR], int64_t kc,
                                                 float acc[CONV_MAX_PANELS][CONV_NR][CONV_PANEL]) {
    KAZEIA_TILE_CASES(Panels<P>::template micro_kernel, a, panel_stride, b, kc, acc)
}

template <typename T>
KAZEIA_AVX512_FN inline void panels_kernel(int64_t np, int64_t cols, const T *a,
                                           int64_t panel_stride, const float *const b[CONV_NR],
                                           int64_t kc,
                                           float acc[CONV_MAX_PANELS][CONV_NR][CONV_PANEL]) {
    static_assert(CONV_MAX_PANELS == 4, "one case per panel count");
    switch (np) {
        case 1: return fixed_panels_kernel<T, 1>(cols, a, panel_stride, b, kc, acc);
        case 2: return fixed_panels_kernel<T, 2>(cols, a, panel_stride, b, kc, acc);
        case 3: return fixed_panels_kernel<T, 3>(cols, a, panel_stride, b, kc, acc);
        case 4: return fixed_panels_kernel<T, 4>(cols, a, panel_stride, b, kc, acc);
        default: GGML_ABORT("conv GEMM: %d panels asked of a kernel that takes 1 to %d", (int)np,
                            (int)CONV_MAX_PANELS);
    }
}

// 8 floats rounded to bf16 as ggml's portable conversion rounds them (to nearest, ties to
// even; a NaN keeps its high half, made quiet), each in the low half of its 32-bit lane.
KAZEIA_AVX2_FN inline __m256i bf16_bits8(const float *p) {
    const __m256i b = _mm256_castps_si256(_mm256_loadu_ps(p));
    const __m256i high = _mm256_srli_epi32(b, 16);
    const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                          _mm256_and_si256(high, _mm256_set1_epi32(1)));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(b, bias), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    return _mm256_blendv_epi8(rounded, _mm256_or_si256(high, _mm256_set1_epi32(0x40)), nan);
}

}  // namespace

KAZEIA_AVX2_FN void tile_kernel_avx2(int64_t cols, const float *a, const float *const b[CONV_NR],
                                     int64_t kc, float acc[CONV_NR][CONV_PANEL]) {
    tile_kernel(cols, a, b, kc, acc);
}
KAZEIA_AVX2_FN void tile_kernel_avx2(int64_t cols, const ggml_fp16_t *a,
                                     const float *const b[CONV_NR], int64_t kc,
                                     float acc[CONV_NR][CONV_PANEL]) {
    tile_kernel(cols, a, b, kc, acc);
}

KAZEIA_AVX2_FN void tile_kernel_avx2(int64_t cols, const ggml_bf16_t *a,
                                     const float *const b[CONV_NR], int64_t kc,
                                     float acc[CONV_NR][CONV_PANEL]) {
    tile_kernel(cols, a, b, kc, acc);
}

KAZEIA_AVX512_FN void panels_kernel_avx512(int64_t np, int64_t cols, const float *a,
                                           int64_t panel_stride, const float *const b[CONV_NR],
                                           int64_t kc,
                                           float acc[CONV_MAX_PANELS][CONV_NR][CONV_PANEL]) {
    panels_kernel(np, cols, a, panel_stride, b, kc, acc);
}
KAZEIA_AVX512_FN void panels_kernel_avx512(int64_t np, int64_t cols, const ggml_fp16_t *a,
                                           int64_t panel_stride, const float *const b[CONV_NR],
                                           int64_t kc,
                                           float acc[CONV_MAX_PANELS][CONV_NR][CONV_PANEL]) {
    panels_kernel(np, cols, a, panel_stride, b, kc, acc);
}

KAZEIA_AVX512_FN void panels_kernel_avx512(int64_t np, int64_t cols, const ggml_bf16_t *a,
                                           int64_t panel_stride, const float *const b[CONV_NR],
                                           int64_t kc,
                                           float acc[CONV_MAX_PANELS][CONV_NR][CONV_PANEL]) {
    panels_kernel(np, cols, a, panel_stride, b, kc, acc);
}

KAZEIA_AVX2_FN void to_bf16_avx2(const float *x, ggml_bf16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        // packus interleaves the two inputs' 128-bit halves; the permute puts them in order.
        const __m256i packed = _mm256_packus_epi32(bf16_bits8(x + i), bf16_bits8(x + i + 8));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(y + i),
                            _mm256_permute4x64_epi64(packed, 0xd8));
    }
    if (i < n) ggml_fp32_to_bf16_row_ref(x + i, y + i, n - i);
}

// Winograd's sums of rows from element k on, 8 lanes at a time, then one by one: every element
// the same chain of one product and fused multiply-adds as on 16 lanes.
KAZEIA_AVX2_FN inline void combine_tail(const WinogradRow &w, const float *const *xs, float *yr,
                                        int64_t k, int64_t len) {
    for (; k + 8 <= len; k += 8) {
        __m256 acc = _mm256_mul_ps(_mm256_set1_ps(w.c[0]), _mm256_loadu_ps(xs[0] + k));
        for (int64_t t = 1; t < w.n; ++t)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(w.c[t]), _mm256_loadu_ps(xs[t] + k), acc);
        _mm256_storeu_ps(yr + k, acc);
    }
    for (; k < len; ++k) {
        float acc = w.c[0] * xs[0][k];
        for (int64_t t = 1; t < w.n; ++t) acc = std::fma(w.c[t], xs[t][k], acc);
        yr[k] = acc;
    }
}

KAZEIA_AVX2_FN void combine_rows_avx2(const WinogradRow *rows, int64_t n_rows, const float *x,
                                      int64_t x_stride, float *y, int64_t y_stride, int64_t len) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const float *xs[WINOGRAD_MAX_N];
        for (int64_t t = 0; t < rows[r].n; ++t) xs[t] = x + rows[r].idx[t] * x_stride;
        combine_tail(rows[r], xs, y + r * y_stride, 0, len);
    }
}

KAZEIA_AVX512_FN void combine_rows_avx512(const WinogradRow *rows, int64_t n_rows, const float *x,
                                          int64_t x_stride, float *y, int64_t y_stride,
                                          int64_t len) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const WinogradRow &w = rows[r];
        const float *xs[WINOGRAD_MAX_N];
        for (int64_t t = 0; t < w.n; ++t) xs[t] = x + w.idx[t] * x_stride;
        float *yr = y + r * y_stride;
        int64_t k = 0;
        for (; k + 16 <= len; k += 16) {
            __m512 acc = _mm512_mul_ps(_mm512_set1_ps(w.c[0]), _mm512_loadu_ps(xs[0] + k));
            for (int64_t t = 1; t < w.n; ++t)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(w.c[t]), _mm512_loadu_ps(xs[t] + k), acc);
            _mm512_storeu_ps(yr + k, acc);
        }
        combine_tail(w, xs, yr, k, len);
    }
}

}  // namespace kazeia::x86
#endif
