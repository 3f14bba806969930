// What a kernel family's portable loops (ops/*.cpp) and its vector paths (ops/x86/, ops/arm/)
// both use, written once: SnakeBeta's scalar sin^2, the conv GEMM's tile shape, the attention's
// row, the q8_0 GEMM's operands. Each is inlined where it is used, so a vector path compiles it
// for its own instructions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ops.h"
#include "q8_gemm.h"

namespace kazeia {

// sin^2 through a Cody-Waite reduction by pi/2 and Cephes' single-precision polynomials on
// [-pi/4, pi/4]; libm's sinf, which ggml_sin calls per element, costs far more, and the
// vocoder evaluates tens of millions per second of audio. Accurate to a few ulp for |x| < 1e5
// (sign is irrelevant once squared). The vector paths compute the same on 8 (x86) or 4 (NEON)
// lanes and finish their tails with this one.
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

// The conv GEMM's micro-tile: CONV_PANEL output rows (one packed weight panel) times up to
// CONV_NR output columns.
inline constexpr int64_t CONV_NR = 6;
// Panels the AVX-512 kernel takes at once.
inline constexpr int64_t CONV_MAX_PANELS = 4;
// The bf16 path's AMX tiles (ops/x86/conv_gemm_amx.cpp): 16 input columns times 16 output
// channels per accumulator tile, K in steps of 32 (16 pairs of bf16), up to 2 x 2 accumulators
// per call.
inline constexpr int64_t AMX_TILE = 16;
inline constexpr int64_t AMX_K = 32;
inline constexpr int AMX_MAX_TILES = 2;
// Weights are prefetched this many K steps ahead: streamed frames read each weight once, and
// the hardware prefetchers alone fall short of the memory bandwidth there (full decodes, which
// reuse each weight, neither gain nor lose).
inline constexpr int64_t CONV_PREFETCH_K = 16;

// Put before each loop over a micro-kernel's columns. GCC splits an array of accumulators into
// registers only when every loop that indexes it is unrolled first (a constant index
// everywhere): otherwise it keeps the array in memory and stores every accumulator at each step
// of K, which makes the kernel bound by stores instead of multiply-adds.
#define KAZEIA_UNROLL_COLUMNS _Pragma("GCC unroll 8")

// One instance per tile width (COLS is a constant: the loops unroll), called with the arguments
// that follow the kernel's name; `cols` and the weight type `T` are the caller's.
#define KAZEIA_TILE_CASES(kernel, ...)                         \
    static_assert(CONV_NR == 6, "one case per tile width");    \
    switch (cols) {                                            \
        case 1: return kernel<T, 1>(__VA_ARGS__);              \
        case 2: return kernel<T, 2>(__VA_ARGS__);              \
        case 3: return kernel<T, 3>(__VA_ARGS__);              \
        case 4: return kernel<T, 4>(__VA_ARGS__);              \
        case 5: return kernel<T, 5>(__VA_ARGS__);              \
        default: return kernel<T, 6>(__VA_ARGS__);             \
    }

// Winograd's transforms (conv_winograd, ops/conv_gemm.cpp) as sums of rows: output row r is
// sum_t c[t] * x[idx[t]] over the row's nonzero coefficients, the first product and then the
// others added in order (multiply-adds fused on the vector paths).
inline constexpr int64_t WINOGRAD_MAX_N = 8;
struct WinogradRow {
    int64_t n = 0;
    int64_t idx[WINOGRAD_MAX_N] = {};
    float c[WINOGRAD_MAX_N] = {};
};

// What one (query, head) task of the attention op reads and writes: a key or value row of
// head g at position c starts at g * head_stride + c * row_stride values of kv_bytes each: f32
// (4), or f16 (2: a talker cache of that type).
struct AttentionRow {
    const float *qd;
    const void *kd, *vd;
    const float *md;
    float *od;
    int64_t hd, nh, n_kv, row_stride, head_stride, group;
    float scale;
    int64_t kv_bytes = 4;
};

// A head's key or value rows may lie far apart (where a row holds all heads of a position,
// as the decoder's do, a wide row puts each next one on a new page, where the hardware
// prefetchers stop), so the rows a few positions ahead are asked for here.
inline constexpr int64_t ATTENTION_PREFETCH = 16;  // positions ahead
// Asks for the `bytes` of `row`.
inline void prefetch_row(const void *row, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(static_cast<const char *>(row) + b);
}

// Positions the weighted sum of the value rows takes at a time: their rows stay in the L1
// cache while each block of ATTENTION_BLOCK output floats sums over them in registers.
inline constexpr int64_t ATTENTION_TILE = 32;
inline constexpr int64_t ATTENTION_BLOCK = 32;

// For each of the G heads g: out[g][0..n) += w[g][c] * rows[c][0..n) for the positions c in
// [0, count) whose weight is not -inf (a masked position's), in the order of c, as a plain loop
// over the positions adds them; out[g] is out + g * out_stride, w[g] is w + g * w_stride. The
// heads share each row as it is loaded. N = ATTENTION_BLOCK: a full block, its accumulators in
// registers (every loop over them unrolled, see KAZEIA_UNROLL_COLUMNS); N = 0: a block's last
// n < ATTENTION_BLOCK outputs.
template <int64_t N, int64_t G>
__attribute__((always_inline)) inline void add_weighted_rows(float *out, int64_t out_stride, int64_t n,
                                                             const float *w, int64_t w_stride,
                                                             const float *rows, int64_t stride,
                                                             int64_t count) {
    static_assert(N == 0 || N == ATTENTION_BLOCK, "a full block or a tail");
    float acc[G][ATTENTION_BLOCK] = {};
#pragma GCC unroll 4
    for (int64_t g = 0; g < G; ++g)
#pragma GCC unroll 32
        for (int64_t j = 0; j < (N ? N : n); ++j) acc[g][j] = out[g * out_stride + j];
    for (int64_t c = 0; c < count; ++c) {
        const float *row = rows + c * stride;
#pragma GCC unroll 4
        for (int64_t g = 0; g < G; ++g) {
            const float wc = w[g * w_stride + c];
            if (wc == -INFINITY) continue;
#pragma GCC unroll 32
            for (int64_t j = 0; j < (N ? N : n); ++j) acc[g][j] += wc * row[j];
        }
    }
#pragma GCC unroll 4
    for (int64_t g = 0; g < G; ++g)
#pragma GCC unroll 32
        for (int64_t j = 0; j < (N ? N : n); ++j) out[g * out_stride + j] = acc[g][j];
}

// add_weighted_rows over every block of a head's hd outputs, for G heads hd apart.
template <int64_t G>
__attribute__((always_inline)) inline void add_weighted_heads(float *o, int64_t hd, const float *w,
                                                              int64_t w_stride, const float *rows,
                                                              int64_t stride, int64_t count) {
    int64_t d = 0;
    for (; d + ATTENTION_BLOCK <= hd; d += ATTENTION_BLOCK)
        add_weighted_rows<ATTENTION_BLOCK, G>(o + d, hd, ATTENTION_BLOCK, w, w_stride, rows + d,
                                              stride, count);
    if (d < hd) add_weighted_rows<0, G>(o + d, hd, hd - d, w, w_stride, rows + d, stride, count);
}

// The weighted sums of one tile of value rows for every head of a group: two heads at a time
// (a talker's group), then any left one by one.
__attribute__((always_inline)) inline void add_weighted_tile(float *o0, int64_t hd, int64_t group,
                                                             const float *w, int64_t w_stride,
                                                             const float *rows, int64_t stride,
                                                             int64_t count) {
    int64_t h = 0;
    for (; h + 2 <= group; h += 2)
        add_weighted_heads<2>(o0 + h * hd, hd, w + h * w_stride, w_stride, rows, stride, count);
    for (; h < group; ++h)
        add_weighted_heads<1>(o0 + h * hd, hd, w + h * w_stride, w_stride, rows, stride, count);
}

// Where attention_row reads a head's key or value rows: f32 rows in place, or f16 rows widened
// to f32 (by `widen`, n values) into a buffer of the task's, a few rows at a time.
template <void (*widen)(const uint16_t *, float *, int64_t)>
struct AttentionRows {
    const char *base;  // the head's row of the first position read
    int64_t stride;    // values from a row to the next
    int64_t hd, value_bytes;
    float *buffer;  // ATTENTION_TILE rows of hd floats (f16 only)

    bool f16() const { return value_bytes == 2; }
    int64_t row_bytes() const { return hd * value_bytes; }
    const void *raw(int64_t c) const { return base + c * stride * value_bytes; }
    // Row c as f32.
    const float *row(int64_t c) const {
        if (!f16()) return static_cast<const float *>(raw(c));
        widen(static_cast<const uint16_t *>(raw(c)), buffer, hd);
        return buffer;
    }
    // Rows c0 .. c1 - 1 (at most ATTENTION_TILE) as f32, rows `*step` floats apart.
    const float *rows(int64_t c0, int64_t c1, int64_t *step) const {
        if (!f16()) {
            *step = stride;
            return static_cast<const float *>(raw(c0));
        }
        for (int64_t c = c0; c < c1; ++c)
            widen(static_cast<const uint16_t *>(raw(c)), buffer + (c - c0) * hd, hd);
        *step = hd;
        return buffer;
    }
};

// One (query, key/value head): scores (each a `dot` of the query and key rows), softmax, then
// the weighted sum of the value rows, for the `group` query heads that share that key/value
// head together, so that each key and value row is read from memory once for all of them (a
// long synthesis's talker attention is bound by reading its cache). Only the positions from the
// first to the last that the mask lets through are read (a talker's cache grows by blocks whose
// slots ahead are masked). Each output float is summed in the same order as a plain loop over
// the positions would (tiles of positions, blocks of outputs held in registers in between).
// An f16 cache's values are widened to f32 exactly (`widen`) and every sum is in f32; where two
// query heads share a key/value head (the talker's), `dot_pair_f16(q, k, hd, scores)` scores
// both against an f16 key row in one pass over it, widened in registers. Always inlined, so
// that a vector path's caller compiles it for its instructions (the weighted sums'
// multiply-adds included).
template <float (*dot)(const float *, const float *, int64_t),
          void (*widen)(const uint16_t *, float *, int64_t),
          void (*dot_pair_f16)(const float *, const uint16_t *, int64_t, float *)>
__attribute__((always_inline)) inline void attention_row(const AttentionRow &a, int64_t t) {
    const int64_t n_groups = a.nh / a.group, i = t / n_groups, g = t % n_groups;
    const float *mask = a.md + i * a.n_kv;
    int64_t c0 = 0, c1 = a.n_kv;
    while (c0 < c1 && mask[c0] == -INFINITY) ++c0;
    while (c1 > c0 && mask[c1 - 1] == -INFINITY) --c1;
    // From here on the positions c0 .. c1 - 1 are 0 .. n - 1.
    const int64_t n = c1 - c0;
    mask += c0;
    thread_local std::vector<float> weights_of_thread, rows_of_thread;
    weights_of_thread.resize(a.group * (n + 2));
    const bool f16 = a.kv_bytes == 2;
    if (f16) rows_of_thread.resize(ATTENTION_TILE * a.hd);
    const int64_t first = (g * a.head_stride + c0 * a.row_stride) * a.kv_bytes;
    const AttentionRows<widen> k_rows{static_cast<const char *>(a.kd) + first, a.row_stride, a.hd,
                                      a.kv_bytes, rows_of_thread.data()};
    const AttentionRows<widen> v_rows{static_cast<const char *>(a.vd) + first, a.row_stride, a.hd,
                                      a.kv_bytes, rows_of_thread.data()};
    float *const weights = weights_of_thread.data();  // [group][n]: the scores, then their exps
    float *const max_score = weights + a.group * n, *const total = max_score + a.group;
    std::fill(max_score, max_score + a.group, -INFINITY);
    const float *q0 = a.qd + (i * a.nh + g * a.group) * a.hd;
    const bool paired = f16 && a.group == 2;
    for (int64_t c = 0; c < n; ++c) {
        if (c + ATTENTION_PREFETCH < n) prefetch_row(k_rows.raw(c + ATTENTION_PREFETCH), k_rows.row_bytes());
        if (mask[c] == -INFINITY) {
            for (int64_t h = 0; h < a.group; ++h) weights[h * n + c] = -INFINITY;
            continue;
        }
        float pair[2] = {};
        const float *kv = nullptr;
        if (paired)
            dot_pair_f16(q0, static_cast<const uint16_t *>(k_rows.raw(c)), a.hd, pair);
        else
            kv = k_rows.row(c);
        for (int64_t h = 0; h < a.group; ++h) {
            const float s = (paired ? pair[h] : dot(q0 + h * a.hd, kv, a.hd)) * a.scale + mask[c];
            weights[h * n + c] = s;
            max_score[h] = std::max(max_score[h], s);
        }
    }
    for (int64_t h = 0; h < a.group; ++h) {
        float *w = weights + h * n, sum = 0.0f;
        const float max_h = max_score[h];
        for (int64_t c = 0; c < n; ++c) {
            if (w[c] == -INFINITY) continue;
            w[c] = std::exp(w[c] - max_h);
            sum += w[c];
        }
        total[h] = sum;
    }
    float *o0 = a.od + (i * a.nh + g * a.group) * a.hd;
    std::fill(o0, o0 + a.group * a.hd, 0.0f);
    for (int64_t c = 0; c < std::min(n, ATTENTION_TILE); ++c)  // the first tile's
        prefetch_row(v_rows.raw(c), v_rows.row_bytes());
    for (int64_t tile = 0; tile < n; tile += ATTENTION_TILE) {
        const int64_t end = std::min(tile + ATTENTION_TILE, n);
        for (int64_t c = end; c < std::min(end + ATTENTION_TILE, n); ++c)  // the next tile's
            prefetch_row(v_rows.raw(c), v_rows.row_bytes());
        int64_t step;
        const float *rows = v_rows.rows(tile, end, &step);
        add_weighted_tile(o0, a.hd, a.group, weights + tile, n, rows, step, end - tile);
    }
    for (int64_t h = 0; h < a.group; ++h) {
        const float inv = 1.0f / total[h];
        for (int64_t d = 0; d < a.hd; ++d) o0[h * a.hd + d] *= inv;
    }
}

// The q8_0 GEMM (ops/q8_gemm.cpp): ggml's block_q8_0 (ggml-common.h is not installed), 32
// weights and their fp16 scale.
inline constexpr int64_t Q8_QK = 32;
struct Q8Block {
    ggml_fp16_t d;
    int8_t qs[Q8_QK];
};
static_assert(sizeof(Q8Block) == 34, "block_q8_0 is an fp16 scale and 32 int8");

inline constexpr int64_t Q8_GROUPS = Q8_QK / 4;  // 4-byte groups per block: one integer dot each
inline constexpr int Q8_MAX_COLS = 8;             // columns a micro-kernel holds in registers
inline constexpr int Q8_DOT_ROWS = 4;             // rows of one call of the q8_0 dot product

// The activations, unpacked once per product: int8 values [n][K], scales [n][K/32] and, for the
// VNNI path (unsigned x signed products), -128 * the sum of each block.
struct Q8Columns {
    int64_t K = 0, nb = 0;
    std::vector<int8_t> q;
    std::vector<float> d;
    std::vector<int32_t> offset;
    int32_t word(int64_t j, int64_t b, int64_t g) const {
        int32_t v;
        std::memcpy(&v, &q[j * K + b * Q8_QK + g * 4], 4);
        return v;
    }
};

// Q8_GEMM_ROWS weight rows repacked: word (b, g, r) holds bytes 4g..4g+3 of row r's block b, so
// that one 32-bit lane is one row; packed with `flip`, every byte has 128 added (the VNNI path's
// unsigned operand). The rows' fp16 scales follow as [b][r]. A panel is repacked for one product
// (Q8Panel), or a whole matrix is kept so in the bytes its rows took (q8_pack_matrix); the
// kernels read either through a view.
struct Q8PanelView {
    const uint32_t *q;     // [nb][Q8_GROUPS][Q8_GEMM_ROWS]
    const ggml_fp16_t *d;  // [nb][Q8_GEMM_ROWS]: the rows' scales, as the blocks hold them
    const char *next = nullptr;  // the panel read next, if any: the x86 kernels prefetch it
};
struct Q8Panel {
    std::vector<uint32_t> q;
    std::vector<ggml_fp16_t> d;
    Q8PanelView view() const { return {q.data(), d.data()}; }
};

// One instance per column count (C is a constant: the loops unroll), called with the arguments
// that follow the kernel's name; `cols` (1..Q8_MAX_COLS) is the caller's.
#define KAZEIA_Q8_COLUMN_CASES(kernel, ...)                       \
    static_assert(Q8_MAX_COLS == 8, "one case per column count"); \
    switch (cols) {                                               \
        case 1: return kernel<1>(__VA_ARGS__);                    \
        case 2: return kernel<2>(__VA_ARGS__);                    \
        case 3: return kernel<3>(__VA_ARGS__);                    \
        case 4: return kernel<4>(__VA_ARGS__);                    \
        case 5: return kernel<5>(__VA_ARGS__);                    \
        case 6: return kernel<6>(__VA_ARGS__);                    \
        case 7: return kernel<7>(__VA_ARGS__);                    \
        default: return kernel<8>(__VA_ARGS__);                   \
    }

}  // namespace kazeia
