// The q8_0 GEMM's x86-64 paths: the panel repacking as 8 x 8 transposes of 32-bit words, the
// panel products on AVX2 (signed products through maddubs) and on AVX-512 VNNI (VL, ymm).
#include "ops/arch.h"

#if KAZEIA_AVX2
#include <immintrin.h>

namespace kazeia::x86 {

namespace {

constexpr int64_t R = Q8_GEMM_ROWS;

// The panel's R scales of block b, widened (exactly).
KAZEIA_Q8_AVX2_FN inline __m256 scales(const Q8PanelView &p, int64_t b) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(&p.d[b * R])));
}

// At block b of the panel's nb, the b-th nb-th of the next panel's bytes (p.next) into the L2,
// so that the whole next panel is asked for while this one computes. A task's panels are one
// sequential stream, yet read from memory without this an AMD CPU's prefetchers fell far behind
// the products (why is not known); T1, not T0, as for the rows' streams (q8_dot.cpp).
KAZEIA_Q8_AVX2_FN inline void prefetch_next(const Q8PanelView &p, int64_t b) {
    if (!p.next) return;
    constexpr int64_t block_bytes = R * (int64_t)sizeof(Q8Block);  // a block's words and scales
    for (int64_t at = (b * block_bytes) & ~int64_t{63}; at < (b + 1) * block_bytes; at += 64)
        _mm_prefetch(p.next + at, _MM_HINT_T1);
}

// Unsigned weights (+128) times signed activations, 4 bytes per lane per instruction; the
// accumulator starts at -128 * the block's activation sum, which makes the sum exact.
template <int C>
KAZEIA_Q8_VNNI_FN void panel_vnni(const Q8PanelView &p, const Q8Columns &x, int64_t j0, float *y,
                                  int64_t M) {
    __m256 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < x.nb; ++b) {
        prefetch_next(p, b);
        __m256i isum[C];
        for (int c = 0; c < C; ++c) isum[c] = _mm256_set1_epi32(x.offset[(j0 + c) * x.nb + b]);
        const auto *wq = reinterpret_cast<const __m256i *>(&p.q[b * Q8_GROUPS * R]);
        for (int64_t g = 0; g < Q8_GROUPS; ++g) {
            const __m256i w = _mm256_loadu_si256(wq + g);
            for (int c = 0; c < C; ++c)
                isum[c] = _mm256_dpbusd_epi32(isum[c], w, _mm256_set1_epi32(x.word(j0 + c, b, g)));
        }
        const __m256 dw = scales(p, b);
        for (int c = 0; c < C; ++c) {
            const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(x.d[(j0 + c) * x.nb + b]));
            acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(_mm256_cvtepi32_ps(isum[c]), s));
        }
    }
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(y + (j0 + c) * M, acc[c]);
}

// Signed x signed through maddubs: |x| times w with x's sign (no pair can saturate: q8_0 values
// are within +-127), pairs widened to 32 bits by a multiply-add with ones.
template <int C>
KAZEIA_Q8_AVX2_FN void panel_avx2(const Q8PanelView &p, const Q8Columns &x, int64_t j0, float *y,
                                  int64_t M) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < x.nb; ++b) {
        prefetch_next(p, b);
        __m256i isum[C];
        for (int c = 0; c < C; ++c) isum[c] = _mm256_setzero_si256();
        const auto *wq = reinterpret_cast<const __m256i *>(&p.q[b * Q8_GROUPS * R]);
        for (int64_t g = 0; g < Q8_GROUPS; ++g) {
            const __m256i w = _mm256_loadu_si256(wq + g);
            for (int c = 0; c < C; ++c) {
                const __m256i xv = _mm256_set1_epi32(x.word(j0 + c, b, g));
                const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(xv), _mm256_sign_epi8(w, xv));
                isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(pairs, ones));
            }
        }
        const __m256 dw = scales(p, b);
        for (int c = 0; c < C; ++c) {
            const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(x.d[(j0 + c) * x.nb + b]));
            acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(_mm256_cvtepi32_ps(isum[c]), s));
        }
    }
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(y + (j0 + c) * M, acc[c]);
}

}  // namespace

KAZEIA_Q8_AVX2_FN void q8_pack_avx2(uint32_t *q, ggml_fp16_t *d, const char *w,
                                    int64_t w_row_bytes, int64_t nb, bool flip) {
    const __m256i mask = _mm256_set1_epi32(flip ? (int)0x80808080u : 0);
    const Q8Block *rows[R];
    for (int64_t r = 0; r < R; ++r) rows[r] = reinterpret_cast<const Q8Block *>(w + r * w_row_bytes);
    auto *out = reinterpret_cast<__m256i *>(q);
    for (int64_t b = 0; b < nb; ++b) {
        __m256i v[R];
        for (int64_t r = 0; r < R; ++r)
            v[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(rows[r][b].qs));
        __m256i t[R], u[R];
        for (int64_t i = 0; i < R; i += 2) {
            t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
            t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
        }
        for (int64_t i = 0; i < R; i += 4) {
            u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
            u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
            u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
            u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
        }
        // u[g] (g < 4) holds group g of rows 0-3 in its low half and group g + 4 in its high
        // half; u[g + 4] the same for rows 4-7.
        for (int64_t g = 0; g < 4; ++g) {
            _mm256_storeu_si256(out + b * Q8_GROUPS + g,
                                _mm256_xor_si256(_mm256_permute2x128_si256(u[g], u[g + 4], 0x20), mask));
            _mm256_storeu_si256(out + b * Q8_GROUPS + g + 4,
                                _mm256_xor_si256(_mm256_permute2x128_si256(u[g], u[g + 4], 0x31), mask));
        }
        for (int64_t r = 0; r < R; ++r) d[b * R + r] = rows[r][b].d;
    }
}

KAZEIA_Q8_AVX2_FN void q8_panel_avx2(int cols, const Q8PanelView &p, const Q8Columns &x, int64_t j0,
                                     float *y, int64_t M) {
    KAZEIA_Q8_COLUMN_CASES(panel_avx2, p, x, j0, y, M)
}

KAZEIA_Q8_VNNI_FN void q8_panel_vnni(int cols, const Q8PanelView &p, const Q8Columns &x, int64_t j0,
                                     float *y, int64_t M) {
    KAZEIA_Q8_COLUMN_CASES(panel_vnni, p, x, j0, y, M)
}

}  // namespace kazeia::x86
#endif
