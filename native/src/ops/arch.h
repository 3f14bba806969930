// The kernels' vector paths, one source per family and instruction set, as ggml keeps its own:
// ops/x86/ (AVX2/FMA/F16C and AVX-512, compiled on x86-64 only) and ops/arm/ (NEON, on aarch64
// only). Each family's source in ops/ calls them from one dispatch point per entry and keeps
// the portable loops. Every entry compiled for instructions of its own (all x86 ones, the arm
// dot-product one) carries them in its declaration as in its definition (with GCC, differing
// target attributes would declare two versions of a function).
#pragma once

#include <cstdint>

#include "ggml.h"
#include "ops/isa.h"
#include "ops/shared.h"

namespace kazeia {

#if KAZEIA_AVX2
namespace x86 {

// SnakeBeta (x86/snake_beta.cpp): one column of `channels` values; sin_squared's values.
KAZEIA_AVX2_FN void snake_column_avx2(const float *in, float *out, const float *alpha,
                                      const float *inv_beta, int64_t channels);
KAZEIA_AVX2_FN void sin_squared_avx2(const float *x, float *y, int64_t n);

// The conv GEMM (x86/conv_gemm.cpp): acc[j][r] = sum_k A[k][r] * B_j[k] for one packed panel A
// (f32, f16 or bf16) and `cols` <= CONV_NR columns B_j; the AVX-512 one for `np` <= CONV_MAX_PANELS
// panels at once (panel q at a + q * panel_stride), each lane the same chain of multiply-adds as
// the AVX2 one (the same bits).
KAZEIA_AVX2_FN void tile_kernel_avx2(int64_t cols, const float *a, const float *const b[CONV_NR],
                                     int64_t kc, float acc[CONV_NR][CONV_PANEL]);
KAZEIA_AVX2_FN void tile_kernel_avx2(int64_t cols, const ggml_fp16_t *a,
                                     const float *const b[CONV_NR], int64_t kc,
                                     float acc[CONV_NR][CONV_PANEL]);
KAZEIA_AVX512_FN void panels_kernel_avx512(int64_t np, int64_t cols, const float *a,
                                           int64_t panel_stride, const float *const b[CONV_NR],
                                           int64_t kc,
                                           float acc[CONV_MAX_PANELS][CONV_NR][CONV_PANEL]);
KAZEIA_AVX512_FN void panels_kernel_avx512(int64_t np, int64_t cols, const ggml_fp16_t *a,
                                           int64_t panel_stride, const float *const b[CONV_NR],
                                           int64_t kc,
                                           float acc[CONV_MAX_PANELS][CONV_NR][CONV_PANEL]);
KAZEIA_AVX2_FN void tile_kernel_avx2(int64_t cols, const ggml_bf16_t *a,
                                     const float *const b[CONV_NR], int64_t kc,
                                     float acc[CONV_NR][CONV_PANEL]);
KAZEIA_AVX512_FN void panels_kernel_avx512(int64_t np, int64_t cols, const ggml_bf16_t *a,
                                           int64_t panel_stride, const float *const b[CONV_NR],
                                           int64_t kc,
                                           float acc[CONV_MAX_PANELS][CONV_NR][CONV_PANEL]);
// n floats rounded to bf16 with the bits of ggml's portable conversion (to nearest, ties to
// even; NaNs quiet).
KAZEIA_AVX2_FN void to_bf16_avx2(const float *x, ggml_bf16_t *y, int64_t n);
// Winograd's transforms (x86/conv_gemm.cpp): y[r * y_stride + k] = the sum of row r's products
// with x[idx * x_stride + k], for r < n_rows and k < len; each element the same chain of
// multiply-adds on both paths (the same bits).
KAZEIA_AVX2_FN void combine_rows_avx2(const WinogradRow *rows, int64_t n_rows, const float *x,
                                      int64_t x_stride, float *y, int64_t y_stride, int64_t len);
KAZEIA_AVX512_FN void combine_rows_avx512(const WinogradRow *rows, int64_t n_rows, const float *x,
                                          int64_t x_stride, float *y, int64_t y_stride,
                                          int64_t len);
// The bf16 products on AMX (x86/conv_gemm_amx.cpp): c[i][j] = the 16 x 16 sums over k_tiles
// tiles of K of input columns 16i.. (row r of `a`, `in` bf16 values per row, a K tile of tap t
// at t * tap_offset values further) times the weights of channel group j (B tiles of AMX_K
// values by AMX_TILE channels in pairs along K, one after the other, group j at
// j * group_stride), for na, ng in 1..AMX_MAX_TILES; between amx_tiles_begin (the tile
// configuration) and amx_tiles_end (the tiles released) on the same thread.
KAZEIA_AMX_FN void amx_tiles_begin();
KAZEIA_AMX_FN void amx_tiles_end();
KAZEIA_AMX_FN void amx_bf16_tiles(int64_t na, int64_t ng, const uint16_t *a, int64_t in,
                                  int64_t tap_offset, const uint16_t *b, int64_t group_stride,
                                  int64_t k_tiles,
                                  float c[AMX_MAX_TILES][AMX_MAX_TILES][AMX_TILE][AMX_TILE]);
// The same sums on AVX-512 BF16 (x86/conv_gemm_bf16.cpp) for the first `cols` columns
// (1..AMX_MAX_TILES * AMX_TILE; the others' sums are left as they were), from the same layouts.
KAZEIA_AVX512_BF16_FN void avx512_bf16_pairs(
    int64_t cols, int64_t ng, const uint16_t *a, int64_t in, int64_t tap_offset, const uint16_t *b,
    int64_t group_stride, int64_t k_tiles,
    float c[AMX_MAX_TILES][AMX_MAX_TILES][AMX_TILE][AMX_TILE]);

// The attention (x86/attention.cpp): attention_row compiled for AVX2/FMA.
KAZEIA_AVX2_FN void attention_row_avx2(const AttentionRow &a, int64_t t);

// The q8_0 GEMM (x86/q8_gemm.cpp): the repacking of Q8_GEMM_ROWS weight rows (w_row_bytes
// apart, nb blocks each) into a panel's words `q` and scales `d`, for both paths;
// y[(j0 + c) * M + r] for the panel's rows r and `cols` <= Q8_MAX_COLS columns j0 + c, by AVX2
// (signed products) or AVX-512 VNNI (the panel packed with flip: unsigned weights).
KAZEIA_Q8_AVX2_FN void q8_pack_avx2(uint32_t *q, ggml_fp16_t *d, const char *w,
                                    int64_t w_row_bytes, int64_t nb, bool flip);
KAZEIA_Q8_AVX2_FN void q8_panel_avx2(int cols, const Q8PanelView &p, const Q8Columns &x, int64_t j0,
                                     float *y, int64_t M);
KAZEIA_Q8_VNNI_FN void q8_panel_vnni(int cols, const Q8PanelView &p, const Q8Columns &x, int64_t j0,
                                     float *y, int64_t M);

// ggml's q8_0 dot product (x86/q8_dot.cpp): y[r] = w[r] . x over nb blocks for Q8_DOT_ROWS rows
// w[r] and one column x, each row with the bits of ggml's AVX2 dot product, while the rows
// next[r] (nullptr: none) are fetched into the cache; by AVX2 (signed products) or AVX-512 VNNI
// (ymm; unsigned weights).
KAZEIA_AVX2_FN void q8_dot_rows_avx2(const Q8Block *const w[Q8_DOT_ROWS],
                                     const Q8Block *const next[Q8_DOT_ROWS], const Q8Block *x,
                                     int64_t nb, float y[Q8_DOT_ROWS]);
KAZEIA_Q8_DOT_VNNI_FN void q8_dot_rows_vnni(const Q8Block *const w[Q8_DOT_ROWS],
                                            const Q8Block *const next[Q8_DOT_ROWS],
                                            const Q8Block *x, int64_t nb, float y[Q8_DOT_ROWS]);

}  // namespace x86
#elif KAZEIA_NEON
namespace arm {

// The same entries on NEON (arm/*.cpp).
void snake_column_neon(const float *in, float *out, const float *alpha, const float *inv_beta,
                       int64_t channels);
void sin_squared_neon(const float *x, float *y, int64_t n);
void tile_kernel_neon(int64_t cols, const float *a, const float *const b[CONV_NR], int64_t kc,
                      float acc[CONV_NR][CONV_PANEL]);
void tile_kernel_neon(int64_t cols, const ggml_fp16_t *a, const float *const b[CONV_NR],
                      int64_t kc, float acc[CONV_NR][CONV_PANEL]);
void tile_kernel_neon(int64_t cols, const ggml_bf16_t *a, const float *const b[CONV_NR],
                      int64_t kc, float acc[CONV_NR][CONV_PANEL]);
void to_bf16_neon(const float *x, ggml_bf16_t *y, int64_t n);
void combine_rows_neon(const WinogradRow *rows, int64_t n_rows, const float *x, int64_t x_stride,
                       float *y, int64_t y_stride, int64_t len);
void attention_row_neon(const AttentionRow &a, int64_t t);
// The q8_0 GEMM's panel products on the dot-product instructions, where the CPU has them.
KAZEIA_DOTPROD_FN void q8_panel_dotprod(int cols, const Q8PanelView &p, const Q8Columns &x,
                                        int64_t j0, float *y, int64_t M);

}  // namespace arm
#endif

}  // namespace kazeia
