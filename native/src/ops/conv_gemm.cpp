// The speech decoder's causal convolutions and linear layers as one GEMM over packed weights:
// the tiling, the portable micro-kernel and the ggml op; the vector micro-kernels are in
// ops/x86/ and ops/arm/.
#include "ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <type_traits>
#include <vector>

#include "ops/arch.h"
#include "ops/isa.h"
#include "ops/shared.h"

namespace kazeia {

namespace {

constexpr int64_t NC = 96;   // columns per cache block (B block ~ NC * KC floats in L2)
constexpr int64_t KC_MAX = 256;
constexpr int64_t PANEL_OUTER_MAX_INPUT = 512 * 1024;  // bytes of a column block's input

// Largest divisor of `in` that is <= KC_MAX: a K block then never straddles two taps, so
// it is one contiguous run of each input column.
int64_t k_block(int64_t in) {
    for (int64_t kc = std::min(in, KC_MAX); kc > 1; --kc)
        if (in % kc == 0 && (kc >= 32 || kc == in)) return kc;
    return in <= KC_MAX ? in : 1;
}

// Weights are f32 or f16 (half the bytes to stream: a streamed frame reads every weight once),
// or bf16 (DecoderPrecision::BF16).
inline float to_f32(float v) { return v; }
inline float to_f32(ggml_fp16_t v) { return ggml_fp16_to_fp32(v); }
inline float to_f32(ggml_bf16_t v) { return ggml_bf16_to_fp32(v); }

// The bf16 products run on AMX where the CPU has it, else on AVX-512 BF16 where
// use_avx512_bf16 takes it, when the input width is whole K tiles (every conv of the full-size
// decoders); their weights are then packed in AMX's tile layout (pack_bf16), which both read,
// the others' in bf16 panels for the vector or portable loops.
bool pairs_layout(int64_t in) { return (use_amx() || use_avx512_bf16()) && in % AMX_K == 0; }

// acc[j][r] = sum_k A[k][r] * B_j[k] for a 16-row panel and COLS <= CONV_NR columns: the
// loops a CPU without a vector path runs.
template <typename T, int COLS>
inline void micro_kernel(const T *a, const float *const b[CONV_NR], int64_t kc,
                         float acc[CONV_NR][CONV_PANEL]) {
    for (int j = 0; j < COLS; ++j)
        for (int64_t r = 0; r < CONV_PANEL; ++r) acc[j][r] = 0.0f;
    for (int64_t k = 0; k < kc; ++k, a += CONV_PANEL)
        for (int j = 0; j < COLS; ++j)
            for (int64_t r = 0; r < CONV_PANEL; ++r) acc[j][r] += to_f32(a[r]) * b[j][k];
}

// One panel for a tile of `cols` columns.
template <typename T>
inline void tile_kernel(int64_t cols, const T *a, const float *const b[CONV_NR], int64_t kc,
                        float acc[CONV_NR][CONV_PANEL]) {
#if KAZEIA_AVX2
    if (use_avx2()) return x86::tile_kernel_avx2(cols, a, b, kc, acc);
#elif KAZEIA_NEON
    return arm::tile_kernel_neon(cols, a, b, kc, acc);
#endif
    KAZEIA_TILE_CASES(micro_kernel, a, b, kc, acc)
}

// `np` <= CONV_MAX_PANELS panels from a (`panel_stride` apart) for one column tile
// (conv_gemm_run asks for several where the CPU has AVX-512): the AVX-512 kernel, else one panel
// after the other.
template <typename T>
inline void panels_kernel(int64_t np, int64_t cols, const T *a, int64_t panel_stride,
                          const float *const b[CONV_NR], int64_t kc,
                          float acc[CONV_MAX_PANELS][CONV_NR][CONV_PANEL]) {
#if KAZEIA_AVX2
    if (use_avx512()) return x86::panels_kernel_avx512(np, cols, a, panel_stride, b, kc, acc);
#endif
    for (int64_t q = 0; q < np; ++q) tile_kernel(cols, a + q * panel_stride, b, kc, acc[q]);
}

// A panel column's first K block: y = s + bias + residual, an absent term adding 0.0f (s alone
// would keep a -0.0f that the sum turns into +0.0f). One branch-free loop per case, which the
// compiler vectorizes; a branch per element keeps the loop scalar.
inline void store_first(float *__restrict y, const float *__restrict s, const float *__restrict b,
                        const float *__restrict r) {
    constexpr float zero = 0.0f;
    if (b && r) {
        for (int64_t i = 0; i < CONV_PANEL; ++i) y[i] = s[i] + b[i] + r[i];
    } else if (b) {
        for (int64_t i = 0; i < CONV_PANEL; ++i) y[i] = s[i] + b[i] + zero;
    } else if (r) {
        for (int64_t i = 0; i < CONV_PANEL; ++i) y[i] = s[i] + zero + r[i];
    } else {
        for (int64_t i = 0; i < CONV_PANEL; ++i) y[i] = s[i] + zero + zero;
    }
}

// The next K blocks of a panel column: y += s.
inline void add_panel(float *__restrict y, const float *__restrict s) {
    for (int64_t i = 0; i < CONV_PANEL; ++i) y[i] += s[i];
}

// A conv_gemm node's operands: x [in, len + context], the packed weight, y [out, len], bias
// and residual or null.
struct ConvOperands {
    explicit ConvOperands(ggml_tensor *dst)
        : x(dst->src[0]), w(dst->src[1]), in(x->ne[0]), out(dst->ne[0]), len(dst->ne[1]),
          xd(static_cast<const float *>(x->data)),
          bd(dst->src[2] ? static_cast<const float *>(dst->src[2]->data) : nullptr),
          rd(dst->src[3] ? static_cast<const float *>(dst->src[3]->data) : nullptr),
          yd(static_cast<float *>(dst->data)) {}
    const ggml_tensor *x, *w;
    int64_t in, out, len;
    const float *xd, *bd, *rd;
    float *yd;
};

// A task is one block of NC output columns times a range of `units` (panels of output
// channels, or pairs of them): how many tasks share a block. Short inputs (a streamed frame is
// 1-4 columns before the vocoder) have one column block: their output channels are split
// instead, so that every thread streams a share of the weights.
int64_t channel_split(int64_t n_blocks, int64_t units, const ConvGemmParams *p, int nth) {
    const int64_t want = (int64_t)(p->pool ? 4 * p->pool->n_threads() : 4 * nth);
    return std::max<int64_t>(1, std::min<int64_t>(units, (want + n_blocks - 1) / n_blocks));
}

// Where a pool splits a block among several tasks, what they all read of the input (rounded
// to bf16, or Winograd's transforms) is prepared once by the whole pool: `rows` rows, a share
// of them per thread by fill(r0, n, buffer), into `buffer` resized to `size`. Returns its data.
template <typename T, typename Fill>
T *prepare_on_pool(WorkerPool &pool, std::vector<T> &buffer, size_t size, int64_t rows,
                   const Fill &fill) {
    const int64_t per = std::max<int64_t>(1, (rows + pool.n_threads() - 1) / pool.n_threads());
    buffer.resize(size);
    T *data = buffer.data();
    pool.run((rows + per - 1) / per,
             [&](int64_t t) { fill(t * per, std::min(per, rows - t * per), data); });
    return data;
}

template <typename T>
void conv_gemm_run(ggml_tensor *dst, int ith, int nth, const ConvGemmParams *p) {
    const ConvOperands o(dst);
    const int64_t in = o.in, out = o.out, len = o.len, K = o.w->ne[0], kc = k_block(in);
    const size_t tap_stride = (size_t)(p->dilation * in);
    const float *xd = o.xd, *bd = o.bd, *rd = o.rd;
    const auto *wd = static_cast<const T *>(o.w->data);
    float *yd = o.yd;

    const int64_t n_blocks = (len + NC - 1) / NC, n_panels = out / CONV_PANEL;
    const int64_t m_split = channel_split(n_blocks, n_panels, p, nth);
    // With AVX-512 the kernel takes CONV_MAX_PANELS panels at a time (a task's last ones may be
    // fewer).
    const int64_t step = use_avx512() ? CONV_MAX_PANELS : 1;
    const int64_t panels_per = (n_panels + m_split - 1) / m_split;
    // When a column block's whole input fits in L2 (a streamed frame: 1-32 columns), each task
    // walks its panels (as many at a time as the kernel takes) through all of K: sequential
    // streams of weights, which the prefetchers follow (unlike K-block-outer order, whose short
    // runs per panel stop them). Otherwise K-block-outer keeps the input block in cache.
    const bool panel_outer =
        K * std::min(len, NC) * (int64_t)sizeof(float) <= PANEL_OUTER_MAX_INPUT;
    const int64_t context = (p->taps - 1) * p->dilation;  // input columns before the first
    auto block = [&](int64_t task) {
        const int64_t ib = task / m_split, ms = task % m_split;
        const int64_t nb = ib * NC, nb_end = std::min(len, nb + NC);
        const int64_t m_begin = ms * panels_per * CONV_PANEL;
        const int64_t m_end = std::min(out, m_begin + panels_per * CONV_PANEL);
        // The block's input columns, from output column nb: bf16 weights multiply inputs
        // rounded to bf16 as well, as AMX does (rounded by each task that reads them).
        const float *xb = xd + nb * in;
        if constexpr (std::is_same_v<T, ggml_bf16_t>) {
            thread_local std::vector<ggml_bf16_t> bf16;
            thread_local std::vector<float> rounded;
            const int64_t n = (nb_end - nb + context) * in;
            bf16.resize(n);
            rounded.resize(n);
            to_bf16(xb, bf16.data(), n);
            ggml_bf16_to_fp32_row(bf16.data(), rounded.data(), n);
            xb = rounded.data();
        }
        float acc[CONV_MAX_PANELS][CONV_NR][CONV_PANEL];
        // One K block of `np` (1 to CONV_MAX_PANELS) output panels from m0 for every column tile
        // of the block.
        auto panel_step = [&](int64_t m0, int64_t np, int64_t k0) {
            const int64_t tap = k0 / in, c0 = k0 % in;
            const bool first = k0 == 0;
            const T *a = wd + m0 * K + k0 * CONV_PANEL;
            for (int64_t n = nb; n < nb_end; n += CONV_NR) {
                const float *b[CONV_NR];
                for (int64_t j = 0; j < CONV_NR; ++j) {
                    const int64_t col = std::min(n + j, nb_end - 1);
                    b[j] = xb + (col - nb) * in + tap * tap_stride + c0;
                }
                const int64_t ncols = std::min(CONV_NR, nb_end - n);
                panels_kernel(np, ncols, a, CONV_PANEL * K, b, kc, acc);
                for (int64_t q = 0; q < np; ++q) {
                    const int64_t m = m0 + q * CONV_PANEL;
                    for (int64_t j = 0; j < ncols; ++j) {
                        float *y = yd + (n + j) * out + m;
                        if (first) store_first(y, acc[q][j], bd ? bd + m : nullptr,
                                               rd ? rd + (n + j) * out + m : nullptr);
                        else add_panel(y, acc[q][j]);
                    }
                }
            }
        };
        const int64_t rows_per_step = step * CONV_PANEL;
        auto panels_at = [&](int64_t m0) {
            return std::min(rows_per_step, m_end - m0) / CONV_PANEL;
        };
        if (panel_outer) {
            for (int64_t m0 = m_begin; m0 < m_end; m0 += rows_per_step)
                for (int64_t k0 = 0; k0 < K; k0 += kc) panel_step(m0, panels_at(m0), k0);
        } else {
            for (int64_t k0 = 0; k0 < K; k0 += kc)
                for (int64_t m0 = m_begin; m0 < m_end; m0 += rows_per_step)
                    panel_step(m0, panels_at(m0), k0);
        }
    };
    const int64_t n_tasks = n_blocks * m_split;
    run_tasks(p->pool, ith, nth, n_tasks, block);
}

// The bf16 products on AMX or AVX-512 BF16: a task is one block of NC output columns times a
// range of output channel groups (pairs of AMX_TILE channels), split as conv_gemm_run splits its
// panels. The block's input columns are rounded to bf16 by the task, or, where a block is split
// among several tasks (short inputs: a streamed frame's layers) and a pool runs them, once by
// the whole pool before the products: at a few hundred products per input value, converting it
// once per task would cost more than the products themselves. Each call of the kernel then
// takes up to 32 columns (two A tiles) by 2 groups through all of K, so that every output is one
// chain of products in K order, whatever the number of columns around it: a streamed frame gets
// the bits of a full decode.
void conv_gemm_pairs_run(ggml_tensor *dst, int ith, int nth, const ConvGemmParams *p) {
#if KAZEIA_AVX2
    const ConvOperands o(dst);
    const int64_t in = o.in, out = o.out, len = o.len, x_cols = o.x->ne[1];
    const int64_t k_tiles = o.w->ne[0] / AMX_K, group_stride = k_tiles * AMX_TILE * AMX_K;
    const int64_t context = (p->taps - 1) * p->dilation;
    const float *xd = o.xd, *bd = o.bd, *rd = o.rd;
    const auto *wd = static_cast<const uint16_t *>(o.w->data);
    float *yd = o.yd;

    static_assert(AMX_TILE == CONV_PANEL, "conv_gemm's weights are whole tiles of channels");
    static_assert(NC % (AMX_MAX_TILES * AMX_TILE) == 0, "a column block is whole kernel calls");
    const int64_t n_blocks = (len + NC - 1) / NC, n_groups = out / AMX_TILE;
    const int64_t n_pairs = (n_groups + 1) / 2;
    const int64_t m_split = channel_split(n_blocks, n_pairs, p, nth);
    const int64_t groups_per = 2 * ((n_pairs + m_split - 1) / m_split);
    // The input rows the kernel reads for `cols` output columns: whole A tiles, plus the taps'
    // context.
    auto tile_rows = [&](int64_t cols) {
        return (cols + AMX_TILE - 1) / AMX_TILE * AMX_TILE + context;
    };
    // Rows of the input in bf16 from row r0 (r0 + n <= tile_rows of the output); rows past the
    // input are zeros (they only feed outputs that are not stored).
    auto convert = [&](int64_t r0, int64_t n, ggml_bf16_t *a) {
        const int64_t have = std::max<int64_t>(0, std::min(n, x_cols - r0)) * in;
        to_bf16(xd + r0 * in, a, have);
        std::fill(a + have, a + n * in, ggml_bf16_t{0});
    };
    // Where a pool splits blocks: the input, converted once by the thread that runs the op (a
    // worker reaches it through the pointer: its own thread_local would be another vector).
    const bool shared = p->pool && m_split > 1;
    thread_local std::vector<ggml_bf16_t> whole;
    const ggml_bf16_t *converted = nullptr;
    auto block = [&](int64_t task) {
        const int64_t ib = task / m_split, ms = task % m_split;
        const int64_t nb = ib * NC, cols = std::min(len, nb + NC) - nb;
        const int64_t g_begin = ms * groups_per, g_end = std::min(n_groups, g_begin + groups_per);
        const ggml_bf16_t *a;
        thread_local std::vector<ggml_bf16_t> own;
        if (converted) {
            a = converted + nb * in;
        } else {
            const int64_t rows = tile_rows(cols);
            own.resize(rows * in);
            convert(nb, rows, own.data());
            a = own.data();
        }
        float c[AMX_MAX_TILES][AMX_MAX_TILES][AMX_TILE][AMX_TILE];
        const bool amx = use_amx();
        if (amx) x86::amx_tiles_begin();
        for (int64_t n0 = 0; n0 < cols; n0 += AMX_MAX_TILES * AMX_TILE) {
            const int64_t na =
                std::min<int64_t>(AMX_MAX_TILES, (cols - n0 + AMX_TILE - 1) / AMX_TILE);
            for (int64_t g = g_begin; g < g_end; g += AMX_MAX_TILES) {
                const int64_t ng = std::min<int64_t>(AMX_MAX_TILES, g_end - g);
                const uint16_t *an = &a[n0 * in].bits, *bg = wd + g * group_stride;
                if (amx)
                    x86::amx_bf16_tiles(na, ng, an, in, p->dilation * in, bg, group_stride,
                                        k_tiles, c);
                else  // only the columns stored below
                    x86::avx512_bf16_pairs(std::min<int64_t>(na * AMX_TILE, cols - n0), ng, an,
                                           in, p->dilation * in, bg, group_stride, k_tiles, c);
                for (int64_t i = 0; i < na; ++i)
                    for (int64_t r = 0; r < AMX_TILE && n0 + i * AMX_TILE + r < cols; ++r) {
                        const int64_t col = nb + n0 + i * AMX_TILE + r;
                        for (int64_t j = 0; j < ng; ++j) {
                            const int64_t m = (g + j) * AMX_TILE;
                            store_first(yd + col * out + m, c[i][j][r], bd ? bd + m : nullptr,
                                        rd ? rd + col * out + m : nullptr);
                        }
                    }
            }
        }
        if (amx) x86::amx_tiles_end();
    };
    if (shared) {
        if (ith != 0) return;
        const int64_t rows = tile_rows(len);
        converted = prepare_on_pool(*p->pool, whole, rows * in, rows,
                                    [&](int64_t r0, int64_t n, ggml_bf16_t *all) {
                                        convert(r0, n, all + r0 * in);
                                    });
    }
    run_tasks(p->pool, ith, nth, n_blocks * m_split, block);
#else
    (void)dst, (void)ith, (void)nth, (void)p;
    GGML_ABORT("conv GEMM: weights in AMX's layout in a build without x86 kernels");
#endif
}

void conv_gemm_kernel(ggml_tensor *dst, int ith, int nth, void *userdata) {
    const auto *p = static_cast<const ConvGemmParams *>(userdata);
    const ggml_type type = dst->src[1]->type;
    if (type == GGML_TYPE_BF16 && pairs_layout(dst->src[0]->ne[0]))
        conv_gemm_pairs_run(dst, ith, nth, p);
    else if (type == GGML_TYPE_BF16) conv_gemm_run<ggml_bf16_t>(dst, ith, nth, p);
    else if (type == GGML_TYPE_F16) conv_gemm_run<ggml_fp16_t>(dst, ith, nth, p);
    else conv_gemm_run<float>(dst, ith, nth, p);
}

// Winograd's F(2, k): two outputs of a k-tap conv, y(t) and y(t + d) (d the dilation), from
// the k + 1 inputs they read, as k + 1 products of transformed taps by transformed inputs
// instead of 2k products: per output channel and tile, y = AT (U .* (BT x)), with U = G w the
// taps transformed once when the weights are packed. The matrices come from evaluating and
// interpolating polynomials at 0, +-1, +-2, +-1/2 and infinity (Toom-Cook), computed here in
// double.
constexpr double WINOGRAD_POINTS[] = {0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5};
static_assert(std::size(WINOGRAD_POINTS) + 1 == WINOGRAD_MAX_N, "the point at infinity last");

struct WinogradMatrices {
    int64_t n = 0;                                     // taps + 1 values per tile
    WinogradRow at[2];                                 // the two outputs from the products
    WinogradRow bt[WINOGRAD_MAX_N];                    // transformed inputs from the inputs
    double g[WINOGRAD_MAX_N][WINOGRAD_MAX_N - 1] = {}; // transformed taps from the taps
};

// A dense row of a transform as its nonzero coefficients.
WinogradRow sparse_row(const double *row, int64_t n) {
    WinogradRow r;
    for (int64_t i = 0; i < n; ++i)
        if (row[i] != 0.0) {
            r.idx[r.n] = i;
            r.c[r.n++] = (float)row[i];
        }
    GGML_ASSERT(r.n > 0);
    return r;
}

// y[r * y_stride + k] = sum_t rows[r].c[t] * x[rows[r].idx[t] * x_stride + k], for r < n_rows
// and k < len: Winograd's transforms of a tile's inputs (rows of channels) and outputs (rows of
// a panel group's products).
void combine_rows(const WinogradRow *rows, int64_t n_rows, const float *x, int64_t x_stride,
                  float *y, int64_t y_stride, int64_t len) {
#if KAZEIA_AVX2
    if (use_avx512()) return x86::combine_rows_avx512(rows, n_rows, x, x_stride, y, y_stride, len);
    if (use_avx2()) return x86::combine_rows_avx2(rows, n_rows, x, x_stride, y, y_stride, len);
#elif KAZEIA_NEON
    return arm::combine_rows_neon(rows, n_rows, x, x_stride, y, y_stride, len);
#endif
    for (int64_t r = 0; r < n_rows; ++r) {
        const WinogradRow &w = rows[r];
        float *yr = y + r * y_stride;
        const float *x0 = x + w.idx[0] * x_stride;
        for (int64_t k = 0; k < len; ++k) yr[k] = w.c[0] * x0[k];
        for (int64_t t = 1; t < w.n; ++t) {
            const float *xt = x + w.idx[t] * x_stride;
            for (int64_t k = 0; k < len; ++k) yr[k] += w.c[t] * xt[k];
        }
    }
}

WinogradMatrices winograd_matrices(int64_t taps) {
    WinogradMatrices w;
    const int64_t n = w.n = taps + 1;
    // Row j of a Vandermonde matrix of `cols` columns: the powers of point j, or, for the point
    // at infinity (the last row), the leading coefficient.
    auto power = [&](int64_t j, int64_t col, int64_t cols) {
        if (j == n - 1) return col == cols - 1 ? 1.0 : 0.0;
        double v = 1.0;
        for (int64_t i = 0; i < col; ++i) v *= WINOGRAD_POINTS[j];
        return v;
    };
    double at[2][WINOGRAD_MAX_N] = {};
    for (int64_t j = 0; j < n; ++j) {
        for (int64_t i = 0; i < 2; ++i) at[i][j] = power(j, i, 2);
        for (int64_t k = 0; k < taps; ++k) w.g[j][k] = power(j, k, taps);
    }
    for (int64_t i = 0; i < 2; ++i) w.at[i] = sparse_row(at[i], n);
    // bt = the transposed inverse of the n x n Vandermonde matrix (Gauss-Jordan, pivoting).
    double a[WINOGRAD_MAX_N][2 * WINOGRAD_MAX_N] = {};
    for (int64_t j = 0; j < n; ++j) {
        for (int64_t c = 0; c < n; ++c) a[j][c] = power(j, c, n);
        a[j][n + j] = 1.0;
    }
    for (int64_t c = 0; c < n; ++c) {
        int64_t pivot = c;
        for (int64_t r = c + 1; r < n; ++r)
            if (std::fabs(a[r][c]) > std::fabs(a[pivot][c])) pivot = r;
        std::swap(a[c], a[pivot]);
        const double inv = 1.0 / a[c][c];
        for (int64_t k = 0; k < 2 * n; ++k) a[c][k] *= inv;
        for (int64_t r = 0; r < n; ++r) {
            if (r == c || a[r][c] == 0.0) continue;
            const double f = a[r][c];
            for (int64_t k = 0; k < 2 * n; ++k) a[r][k] -= f * a[c][k];
        }
    }
    for (int64_t j = 0; j < n; ++j) {
        double row[WINOGRAD_MAX_N];
        for (int64_t i = 0; i < n; ++i) row[i] = a[i][n + j];
        w.bt[j] = sparse_row(row, n);
    }
    return w;
}

// The tiles of one frame's `period` output columns (a streamed push holds whole frames, so a
// tile never depends on how frames were pushed: a stream gets the bits of a full decode). Tile
// i computes columns first and first + dilation of the frame; every tile stores its second
// output, and its first where no other tile stores that column: columns whose block of
// `dilation` columns is odd are second outputs of the block before; those of an even block
// are first outputs where the frame holds their partner, else second outputs of a tile that
// starts a dilation earlier.
struct WinogradTile {
    int64_t first;
    bool keeps_first;  // stores its first output too
};

std::vector<WinogradTile> winograd_tiles(int64_t period, int64_t dilation) {
    std::vector<WinogradTile> tiles;
    for (int64_t q = 0; q < period; ++q) {
        if ((q / dilation) % 2) continue;
        if (q + dilation < period) tiles.push_back({q, true});
        else tiles.push_back({q - dilation, false});
    }
    return tiles;
}

// A task is one block of NC tiles times a range of output panels, split as conv_gemm_run
// splits its columns. It transforms its tiles' inputs, then for each group of panels computes
// the n products of every tile (n GEMMs of K = in through the f32 kernels) and the outputs.
void conv_winograd_run(ggml_tensor *dst, int ith, int nth, const ConvGemmParams *p) {
    const ConvOperands o(dst);
    const int64_t in = o.in, out = o.out, len = o.len, d = p->dilation, kc = k_block(in);
    const WinogradMatrices wm = winograd_matrices(p->taps);
    const int64_t n = wm.n;
    const std::vector<WinogradTile> frame = winograd_tiles(p->period, d);
    const int64_t per_frame = (int64_t)frame.size(), n_tiles = len / p->period * per_frame;
    const auto *ud = static_cast<const float *>(o.w->data);

    const int64_t n_blocks = (n_tiles + NC - 1) / NC, n_panels = out / CONV_PANEL;
    const int64_t m_split = channel_split(n_blocks, n_panels, p, nth);
    const int64_t step = use_avx512() ? CONV_MAX_PANELS : 1, rows_per_step = step * CONV_PANEL;
    const int64_t panels_per = (n_panels + m_split - 1) / m_split;
    auto tile = [&](int64_t t) {
        const WinogradTile &f = frame[t % per_frame];
        return WinogradTile{t / per_frame * p->period + f.first, f.keeps_first};
    };
    // The transformed inputs of nt tiles from tile t0: input xi of tile t0 + j at
    // v[(xi * v_tiles + j) * in], its channels in a row.
    auto transform = [&](int64_t t0, int64_t nt, float *v, int64_t v_tiles) {
        for (int64_t j = 0; j < nt; ++j)
            combine_rows(wm.bt, n, o.xd + tile(t0 + j).first * in, d * in, v + j * in,
                         v_tiles * in, in);
    };
    // Where a pool splits blocks (short inputs: a streamed push), all tiles are transformed
    // once by the whole pool before the products (a worker reaches them through the pointer:
    // its own thread_local would be another vector); otherwise each task transforms its own.
    const bool shared = p->pool && m_split > 1;
    thread_local std::vector<float> whole;
    const float *transformed = nullptr;
    auto block = [&](int64_t task) {
        const int64_t ib = task / m_split, ms = task % m_split;
        const int64_t t0 = ib * NC, nt = std::min(n_tiles, t0 + NC) - t0;
        const int64_t m_begin = ms * panels_per * CONV_PANEL;
        const int64_t m_end = std::min(out, m_begin + panels_per * CONV_PANEL);
        // prod[xi][j][r]: product xi of tile j, row r of the panel group.
        thread_local std::vector<float> own, prod;
        prod.resize(n * nt * rows_per_step);
        const float *v;
        int64_t v_tiles;
        if (transformed) {
            v = transformed + t0 * in;
            v_tiles = n_tiles;
        } else {
            own.resize(n * nt * in);
            transform(t0, nt, own.data(), nt);
            v = own.data();
            v_tiles = nt;
        }
        float acc[CONV_MAX_PANELS][CONV_NR][CONV_PANEL];
        for (int64_t m0 = m_begin; m0 < m_end; m0 += rows_per_step) {
            const int64_t np = std::min(rows_per_step, m_end - m0) / CONV_PANEL;
            for (int64_t xi = 0; xi < n; ++xi) {
                const float *u = ud + xi * in * out + m0 * in;
                float *pxi = prod.data() + xi * nt * rows_per_step;
                for (int64_t k0 = 0; k0 < in; k0 += kc)
                    for (int64_t j0 = 0; j0 < nt; j0 += CONV_NR) {
                        const float *b[CONV_NR];
                        for (int64_t j = 0; j < CONV_NR; ++j)
                            b[j] = v + (xi * v_tiles + std::min(j0 + j, nt - 1)) * in + k0;
                        const int64_t ncols = std::min(CONV_NR, nt - j0);
                        panels_kernel(np, ncols, u + k0 * CONV_PANEL, CONV_PANEL * in, b, kc, acc);
                        for (int64_t j = 0; j < ncols; ++j)
                            for (int64_t q = 0; q < np; ++q) {
                                float *pj = pxi + (j0 + j) * rows_per_step + q * CONV_PANEL;
                                if (k0 == 0) std::memcpy(pj, acc[q][j], sizeof(acc[q][j]));
                                else add_panel(pj, acc[q][j]);
                            }
                    }
            }
            for (int64_t j = 0; j < nt; ++j) {
                const WinogradTile t = tile(t0 + j);
                float s[2][CONV_MAX_PANELS * CONV_PANEL];
                combine_rows(wm.at, 2, prod.data() + j * rows_per_step, nt * rows_per_step, s[0],
                             CONV_MAX_PANELS * CONV_PANEL, np * CONV_PANEL);
                for (int64_t i = t.keeps_first ? 0 : 1; i < 2; ++i) {
                    const int64_t col = t.first + i * d;
                    for (int64_t q = 0; q < np; ++q) {
                        const int64_t m = m0 + q * CONV_PANEL;
                        store_first(o.yd + col * out + m, s[i] + q * CONV_PANEL,
                                    o.bd ? o.bd + m : nullptr,
                                    o.rd ? o.rd + col * out + m : nullptr);
                    }
                }
            }
        }
    };
    if (shared) {
        if (ith != 0) return;
        transformed = prepare_on_pool(*p->pool, whole, n * n_tiles * in, n_tiles,
                                      [&](int64_t t0, int64_t nt, float *all) {
                                          transform(t0, nt, all + t0 * in, n_tiles);
                                      });
    }
    run_tasks(p->pool, ith, nth, n_blocks * m_split, block);
}

void conv_winograd_kernel(ggml_tensor *dst, int ith, int nth, void *userdata) {
    conv_winograd_run(dst, ith, nth, static_cast<const ConvGemmParams *>(userdata));
}

// Rows [row, row + n_rows) of a weight as the file holds it (f16 or f32: conv_gemm_supported)
// in f32: its own memory for f32, else widened into `buf`. Rows at a time, not a value at a
// time: ggml's one-value conversion is a call into another library for every value.
const float *weight_rows(const ggml_tensor *w, int64_t row, int64_t n_rows,
                         std::vector<float> &buf) {
    const int64_t K = w->ne[0];
    if (w->type == GGML_TYPE_F32) return static_cast<const float *>(w->data) + row * K;
    buf.resize(n_rows * K);
    ggml_fp16_to_fp32_row(static_cast<const ggml_fp16_t *>(w->data) + row * K, buf.data(),
                          n_rows * K);
    return buf.data();
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

// The weight rewritten in place as bf16 (half of f32's bytes, as many as f16's): in panels as
// pack_panels lays them out, or in AMX's B tiles: for each group of AMX_TILE output channels,
// its K tiles one after the other, each AMX_K / 2 rows of 64 bytes that hold, for each channel,
// two consecutive values of K. A group at a time, through a buffer of one group's values: the
// packed group lies at or before its source rows (bf16 is no wider than f16 or f32), which are
// read before it is written, so the file's largest weight needs no copy of itself.
void pack_bf16(ggml_tensor *w, bool amx) {
    static_assert(AMX_TILE == CONV_PANEL, "a group of channels is one panel");
    const int64_t K = w->ne[0], M = w->ne[1];
    std::vector<float> rows_f32;
    std::vector<float> ordered(CONV_PANEL * K);  // one group's values in their packed order
    auto *packed = static_cast<ggml_bf16_t *>(w->data);
    for (int64_t m0 = 0; m0 < M; m0 += CONV_PANEL) {
        const float *rows = weight_rows(w, m0, CONV_PANEL, rows_f32);  // the group's channels
        float *o = ordered.data();
        if (amx) {
            for (int64_t k0 = 0; k0 < K; k0 += 2)  // a tile's rows, one after the other
                for (int64_t r = 0; r < AMX_TILE; ++r) {
                    *o++ = rows[r * K + k0];
                    *o++ = rows[r * K + k0 + 1];
                }
        } else {
            for (int64_t k = 0; k < K; ++k)
                for (int64_t r = 0; r < CONV_PANEL; ++r) *o++ = rows[r * K + k];
        }
        to_bf16(ordered.data(), packed + m0 * K, CONV_PANEL * K);
    }
    w->type = GGML_TYPE_BF16;
    w->nb[0] = sizeof(ggml_bf16_t);
    for (int d = 1; d < GGML_MAX_DIMS; ++d) w->nb[d] = w->nb[d - 1] * w->ne[d - 1];
}

}  // namespace

void to_bf16(const float *x, ggml_bf16_t *y, int64_t n) {
#if KAZEIA_AVX2
    if (use_avx2()) return x86::to_bf16_avx2(x, y, n);
#elif KAZEIA_NEON
    return arm::to_bf16_neon(x, y, n);
#endif
    ggml_fp32_to_bf16_row_ref(x, y, n);
}

bool conv_gemm_supported(const ggml_tensor *w) {
    return (w->type == GGML_TYPE_F32 || w->type == GGML_TYPE_F16) && ggml_is_contiguous(w) &&
           w->ne[1] % CONV_PANEL == 0 && w->ne[1] >= CONV_PANEL;
}

void pack_conv_weight(ggml_tensor *w, int64_t taps, DecoderPrecision precision) {
    GGML_ASSERT(conv_gemm_supported(w) && taps >= 1 && w->ne[0] % taps == 0);
    if (precision == DecoderPrecision::BF16) pack_bf16(w, pairs_layout(w->ne[0] / taps));
    else if (w->type == GGML_TYPE_F16) pack_panels<ggml_fp16_t>(w);
    else pack_panels<float>(w);
}

bool winograd_fits(int64_t taps, int64_t dilation, int64_t period) {
    return taps >= 2 && taps + 1 <= WINOGRAD_MAX_N && dilation >= 1 && period >= 2 * dilation;
}

void pack_winograd_weight(const ggml_tensor *w, int64_t taps, ggml_tensor *u) {
    GGML_ASSERT(conv_gemm_supported(w) && taps >= 2 && taps + 1 <= WINOGRAD_MAX_N &&
                w->ne[0] % taps == 0);
    const int64_t in = w->ne[0] / taps, out = w->ne[1], n = taps + 1;
    GGML_ASSERT(u->type == GGML_TYPE_F32 && ggml_is_contiguous(u) && u->ne[0] == in &&
                u->ne[1] == out && u->ne[2] == n);
    const WinogradMatrices wm = winograd_matrices(taps);
    auto *ud = static_cast<float *>(u->data);
    std::vector<float> row_f32;
    for (int64_t m = 0; m < out; ++m) {
        const float *row = weight_rows(w, m, 1, row_f32);
        for (int64_t c = 0; c < in; ++c) {
            double g[WINOGRAD_MAX_N - 1];  // the taps of (m, c)
            for (int64_t k = 0; k < taps; ++k) g[k] = row[k * in + c];
            for (int64_t xi = 0; xi < n; ++xi) {
                double s = 0.0;
                for (int64_t k = 0; k < taps; ++k) s += wm.g[xi][k] * g[k];
                // U_xi [in, out] in panels, as pack_panels lays out a weight of K = in.
                ud[xi * in * out + (m / CONV_PANEL) * CONV_PANEL * in + c * CONV_PANEL +
                   m % CONV_PANEL] = (float)s;
            }
        }
    }
}

namespace {

// The node of either conv op: y [out, len] from x_full, its weight (conv_gemm's or
// conv_winograd's), bias and residual, computed by `kernel`.
ggml_tensor *conv_node(ggml_context *ctx, ggml_tensor *x_full, ggml_tensor *w, ggml_tensor *bias,
                       ggml_tensor *residual, int64_t out, int64_t len, ggml_custom_op_t kernel,
                       const ConvGemmParams *params) {
    GGML_ASSERT(!bias || bias->ne[0] == out);
    GGML_ASSERT(!residual || (residual->ne[0] == out && residual->ne[1] == len &&
                              ggml_is_contiguous(residual)));
    ggml_tensor *args[4] = {x_full, w, bias, residual};
    // ggml_custom_4d takes a dense argument list: keep null slots last.
    const int n_args = residual ? 4 : (bias ? 3 : 2);
    GGML_ASSERT(!residual || bias);
    return ggml_custom_4d(ctx, GGML_TYPE_F32, out, len, 1, 1, args, n_args, kernel,
                          GGML_N_TASKS_MAX, const_cast<ConvGemmParams *>(params));
}

}  // namespace

ggml_tensor *conv_winograd(ggml_context *ctx, ggml_tensor *x_full, ggml_tensor *u,
                           ggml_tensor *bias, ggml_tensor *residual,
                           const ConvGemmParams *params) {
    GGML_ASSERT(x_full->type == GGML_TYPE_F32 && ggml_is_contiguous(x_full));
    GGML_ASSERT(u->type == GGML_TYPE_F32 && u->ne[2] == params->taps + 1);
    const int64_t in = x_full->ne[0], out = u->ne[1];
    GGML_ASSERT(u->ne[0] == in && out % CONV_PANEL == 0);
    const int64_t len = x_full->ne[1] - (params->taps - 1) * params->dilation;
    GGML_ASSERT(winograd_fits(params->taps, params->dilation, params->period) &&
                len >= params->period && len % params->period == 0);
    return conv_node(ctx, x_full, u, bias, residual, out, len, conv_winograd_kernel, params);
}

ggml_tensor *conv_gemm(ggml_context *ctx, ggml_tensor *x_full, ggml_tensor *w, ggml_tensor *bias,
                       ggml_tensor *residual, const ConvGemmParams *params) {
    GGML_ASSERT(x_full->type == GGML_TYPE_F32 && ggml_is_contiguous(x_full));
    const int64_t in = x_full->ne[0], out = w->ne[1];
    GGML_ASSERT(w->ne[0] == params->taps * in && out % CONV_PANEL == 0);
    const int64_t len = x_full->ne[1] - (params->taps - 1) * params->dilation;
    GGML_ASSERT(len >= 1);
    return conv_node(ctx, x_full, w, bias, residual, out, len, conv_gemm_kernel, params);
}

}  // namespace kazeia
