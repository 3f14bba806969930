// The conv GEMM's bf16 products on AVX-512 BF16 (DecoderPrecision::BF16 where use_avx512_bf16
// takes it: AMD's CPUs with AVX512_BF16): the weights in AMX's B-tile layout, one 64-byte row
// of a tile (16 channels, a pair of K values each) per register, times a column's pair of
// inputs broadcast: each VDPBF16PS adds both products of the pair to the column's 16 channels.
// Twice the multiply-adds of an FMA per instruction, and the bf16 weights are read as they
// are, without widening.
#include "ops/arch.h"

#if KAZEIA_AVX2
#include <immintrin.h>

#include <cstring>

namespace kazeia::x86 {

namespace {

// Columns a pass holds: COLS x NG accumulators, NG weight rows and a broadcast in the 32 zmm
// registers.
constexpr int PASS_COLUMNS = 8;

// Columns col0..col0 + COLS of the call, through all of K, times NG channel groups. Every
// output is the one chain of pair products in K order, whatever the columns around it.
template <int COLS, int NG>
KAZEIA_AVX512_BF16_FN void pass(const uint16_t *a, int64_t in, int64_t tap_offset,
                                const uint16_t *b, int64_t group_stride, int64_t k_tiles,
                                int64_t col0,
                                float c[AMX_MAX_TILES][AMX_MAX_TILES][AMX_TILE][AMX_TILE]) {
    static_assert(AMX_TILE == 16 && AMX_K == 32, "one tile row of 16 channels per register");
    static_assert(COLS * NG + NG + 1 <= 32, "the pass must fit the zmm registers");
    __m512 acc[COLS][NG];
    for (int r = 0; r < COLS; ++r)
        for (int j = 0; j < NG; ++j) acc[r][j] = _mm512_setzero_ps();
    int64_t tap = 0, c0 = 0;
    for (int64_t kt = 0; kt < k_tiles; ++kt) {
        const uint16_t *ak = a + col0 * in + tap * tap_offset + c0;
        const uint16_t *bk = b + kt * AMX_TILE * AMX_K;
        for (int64_t pair = 0; pair < AMX_K / 2; ++pair) {
            __m512bh w[NG];
            for (int j = 0; j < NG; ++j)
                w[j] = (__m512bh)_mm512_loadu_si512(bk + j * group_stride + pair * 2 * AMX_TILE);
            for (int r = 0; r < COLS; ++r) {
                uint32_t x;  // the column's two inputs of this pair
                std::memcpy(&x, ak + r * in + 2 * pair, sizeof(x));
                const __m512bh xs = (__m512bh)_mm512_set1_epi32((int)x);
                for (int j = 0; j < NG; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], w[j], xs);
            }
        }
        // K runs tap by tap; a tile of K never straddles two taps (in % AMX_K == 0).
        c0 += AMX_K;
        if (c0 == in) c0 = 0, ++tap;
    }
    for (int r = 0; r < COLS; ++r) {
        const int64_t col = col0 + r;
        for (int j = 0; j < NG; ++j)
            _mm512_storeu_ps(c[col / AMX_TILE][j][col % AMX_TILE], acc[r][j]);
    }
}

template <int NG>
KAZEIA_AVX512_BF16_FN void passes(int64_t cols, const uint16_t *a, int64_t in, int64_t tap_offset,
                                  const uint16_t *b, int64_t group_stride, int64_t k_tiles,
                                  float c[AMX_MAX_TILES][AMX_MAX_TILES][AMX_TILE][AMX_TILE]) {
    int64_t col0 = 0;
    for (; col0 + PASS_COLUMNS <= cols; col0 += PASS_COLUMNS)
        pass<PASS_COLUMNS, NG>(a, in, tap_offset, b, group_stride, k_tiles, col0, c);
    static_assert(PASS_COLUMNS == 8, "one case per column count below a pass's");
    switch (cols - col0) {
        case 0: return;
        case 1: return pass<1, NG>(a, in, tap_offset, b, group_stride, k_tiles, col0, c);
        case 2: return pass<2, NG>(a, in, tap_offset, b, group_stride, k_tiles, col0, c);
        case 3: return pass<3, NG>(a, in, tap_offset, b, group_stride, k_tiles, col0, c);
        case 4: return pass<4, NG>(a, in, tap_offset, b, group_stride, k_tiles, col0, c);
        case 5: return pass<5, NG>(a, in, tap_offset, b, group_stride, k_tiles, col0, c);
        case 6: return pass<6, NG>(a, in, tap_offset, b, group_stride, k_tiles, col0, c);
        default: return pass<7, NG>(a, in, tap_offset, b, group_stride, k_tiles, col0, c);
    }
}

}  // namespace

KAZEIA_AVX512_BF16_FN void avx512_bf16_pairs(
    int64_t cols, int64_t ng, const uint16_t *a, int64_t in, int64_t tap_offset, const uint16_t *b,
    int64_t group_stride, int64_t k_tiles,
    float c[AMX_MAX_TILES][AMX_MAX_TILES][AMX_TILE][AMX_TILE]) {
    static_assert(AMX_MAX_TILES == 2, "one or two channel groups");
    if (ng == 1) passes<1>(cols, a, in, tap_offset, b, group_stride, k_tiles, c);
    else passes<2>(cols, a, in, tap_offset, b, group_stride, k_tiles, c);
}

}  // namespace kazeia::x86
#endif
