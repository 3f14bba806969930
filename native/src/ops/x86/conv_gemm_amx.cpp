// The conv GEMM's bf16 products on AMX tiles (DecoderPrecision::BF16 on CPUs with AMX-BF16):
// up to 2 x 2 tiles of 16 input columns times 16 output channels, each accumulated over all of K
// in a tile register.
#include "ops/arch.h"

#if KAZEIA_AVX2
#include <immintrin.h>

namespace kazeia::x86 {

namespace {

// The LDTILECFG operand: palette 1, then per tile its bytes per row and its rows.
struct TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t bytes_per_row[16] = {};
    uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "the LDTILECFG operand is 64 bytes");

// Tiles 0-3 accumulate (column tile i, channel group j) at 2i + j, tiles 4-5 hold the input
// columns (A), tiles 6-7 the weights (B). Every tile is 16 rows of 64 bytes.
template <int NA, int NG>
KAZEIA_AMX_FN void tiles(const uint16_t *a, int64_t in, int64_t tap_offset, const uint16_t *b,
                         int64_t group_stride, int64_t k_tiles,
                         float c[AMX_MAX_TILES][AMX_MAX_TILES][AMX_TILE][AMX_TILE]) {
    static_assert(AMX_TILE == 16 && AMX_K == 32 && AMX_MAX_TILES == 2, "one tile layout");
    _tile_zero(0);
    if constexpr (NG == 2) _tile_zero(1);
    if constexpr (NA == 2) _tile_zero(2);
    if constexpr (NA == 2 && NG == 2) _tile_zero(3);
    const int64_t a_row_bytes = in * (int64_t)sizeof(uint16_t);
    int64_t tap = 0, c0 = 0;
    for (int64_t kt = 0; kt < k_tiles; ++kt) {
        const uint16_t *ak = a + tap * tap_offset + c0;
        const uint16_t *bk = b + kt * AMX_TILE * AMX_K;
        _tile_loadd(6, bk, 64);
        if constexpr (NG == 2) _tile_loadd(7, bk + group_stride, 64);
        _tile_loadd(4, ak, a_row_bytes);
        _tile_dpbf16ps(0, 4, 6);
        if constexpr (NG == 2) _tile_dpbf16ps(1, 4, 7);
        if constexpr (NA == 2) {
            _tile_loadd(5, ak + AMX_TILE * in, a_row_bytes);
            _tile_dpbf16ps(2, 5, 6);
            if constexpr (NG == 2) _tile_dpbf16ps(3, 5, 7);
        }
        // K runs tap by tap; a tile of K never straddles two taps (in % AMX_K == 0).
        c0 += AMX_K;
        if (c0 == in) c0 = 0, ++tap;
    }
    _tile_stored(0, c[0][0], 64);
    if constexpr (NG == 2) _tile_stored(1, c[0][1], 64);
    if constexpr (NA == 2) _tile_stored(2, c[1][0], 64);
    if constexpr (NA == 2 && NG == 2) _tile_stored(3, c[1][1], 64);
}

}  // namespace

KAZEIA_AMX_FN void amx_tiles_begin() {
    TileConfig config;
    for (int t = 0; t < 8; ++t) {
        config.rows[t] = AMX_TILE;
        config.bytes_per_row[t] = 64;
    }
    // Not GCC's _tile_loadconfig: its asm names only the first 8 bytes of the operand, so the
    // compiler may drop the stores of the rest; this operand is the whole configuration.
    __asm__ volatile("ldtilecfg %0" : : "m"(config));
}

KAZEIA_AMX_FN void amx_tiles_end() { _tile_release(); }

KAZEIA_AMX_FN void amx_bf16_tiles(int64_t na, int64_t ng, const uint16_t *a, int64_t in,
                                  int64_t tap_offset, const uint16_t *b, int64_t group_stride,
                                  int64_t k_tiles,
                                  float c[AMX_MAX_TILES][AMX_MAX_TILES][AMX_TILE][AMX_TILE]) {
    if (na == 1 && ng == 1) tiles<1, 1>(a, in, tap_offset, b, group_stride, k_tiles, c);
    else if (na == 1) tiles<1, 2>(a, in, tap_offset, b, group_stride, k_tiles, c);
    else if (ng == 1) tiles<2, 1>(a, in, tap_offset, b, group_stride, k_tiles, c);
    else tiles<2, 2>(a, in, tap_offset, b, group_stride, k_tiles, c);
}

}  // namespace kazeia::x86
#endif
