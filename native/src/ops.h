// Custom CPU operators the decoder needs and ggml lacks in fused, vectorized form.
#pragma once

#include "ggml.h"
#include "decoder_arch.h"
#include "kazeia/speech_decoder.h"
#include "worker_pool.h"

namespace kazeia {

// SnakeBeta: y = x + inv_beta * sin(alpha * x)^2, with per-channel alpha = exp(a) and
// inv_beta = 1 / (exp(b) + 1e-9) precomputed by the converter. x is [C, T] (channel fastest).
// With a pool, the op runs its work there (call it from a one-thread ggml graph).
ggml_tensor *snake_beta(ggml_context *ctx, ggml_tensor *x, ggml_tensor *alpha,
                        ggml_tensor *inv_beta, WorkerPool *pool);

// y[i] = sin(x[i])^2 as the kernel computes it: 8 lanes at a time, the last n % 8 one by one
// (exposed for tests of both paths of the approximation).
void sin_squared(const float *x, float *y, int64_t n);

}  // namespace kazeia

namespace kazeia {

// Rows per panel of a packed weight matrix (the GEMM micro-kernel's height).
inline constexpr int64_t CONV_PANEL = DECODER_CONV_PANEL;

// True when a conv/linear weight [K, M] can use conv_gemm (f32 or f16, M a multiple of
// CONV_PANEL).
bool conv_gemm_supported(const ggml_tensor *w);

// Rewrites a weight [K, M] (row m = K contiguous floats) of a `taps`-tap conv in place into
// the layout conv_gemm streams: panels of CONV_PANEL rows interleaved along K, same size and
// type, so no extra memory (f16 weights are widened to f32 in the kernel's registers). With
// DecoderPrecision::BF16 the weight becomes bf16 (type GGML_TYPE_BF16, in AMX's tile layout
// where the products run on AMX or AVX-512 BF16), and conv_gemm multiplies it by its inputs
// rounded to bf16, summing in f32.
void pack_conv_weight(ggml_tensor *w, int64_t taps, DecoderPrecision precision);

// n floats rounded to bf16 as DecoderPrecision::BF16 rounds the decoder's weights and inputs:
// to nearest, ties to even, NaNs quiet (the bits of ggml's portable conversion on every path).
void to_bf16(const float *x, ggml_bf16_t *y, int64_t n);

// A causal 1-D conv (or linear layer, k = 1) as one GEMM reading its input in place:
//   y[:, t] = bias + residual[:, t] + sum_{j<k} W_j x_full[:, t + j * dilation]
// x_full is [in, L + (k-1)*dilation] (left context included), w the packed [k*in, out],
// bias [out] or null, residual [out, L] or null. Returns y [out, L]. The im2col matrix is
// never materialized, dilated convs included.
struct ConvGemmParams {
    int64_t taps = 1;
    int64_t dilation = 1;
    WorkerPool *pool = nullptr;  // where the op runs its tasks; null: split by ggml's threads
    int64_t period = 0;          // conv_winograd: output columns per frame
};
ggml_tensor *conv_gemm(ggml_context *ctx, ggml_tensor *x_full, ggml_tensor *w, ggml_tensor *bias,
                       ggml_tensor *residual, const ConvGemmParams *params);

// The same conv in Winograd's form F(2, taps): each pair of outputs a dilation apart costs
// taps + 1 products per input channel instead of 2 * taps, in f32, at the price of rounding in
// two small transforms (errors a few times conv_gemm's; a 7-tap conv then does 0.57x its
// multiply-adds). Tiles are laid out within each frame of `period` output columns, so the
// output of a push does not depend on how its frames were split into pushes. u is the weight
// [in, out, taps + 1] that pack_winograd_weight writes from the unpacked weight of conv_gemm.
bool winograd_fits(int64_t taps, int64_t dilation, int64_t period);
void pack_winograd_weight(const ggml_tensor *w, int64_t taps, ggml_tensor *u);
ggml_tensor *conv_winograd(ggml_context *ctx, ggml_tensor *x_full, ggml_tensor *u,
                           ggml_tensor *bias, ggml_tensor *residual,
                           const ConvGemmParams *params);

}  // namespace kazeia

namespace kazeia {

// y = W x for a weight of any ggml type (f32, f16, q8_0, q4_k, ...) and f32 activations
// x [K, n] -> y [M, n], computed by `pool` with ggml's own dot-product kernels (activations
// converted once to the weight's dot type); q8_0 weights on x86-64 with AVX2 by ours (q8_dot_isa),
// which give ggml's bits faster. With `ids` (I32 [1]), W is [K, M, n_mat] and the
// matrix ids[0] is used: the code predictor picks its head per sub-step in one static graph.
ggml_tensor *pool_mul_mat(ggml_context *ctx, ggml_tensor *w, ggml_tensor *x, WorkerPool *pool,
                          ggml_tensor *ids = nullptr);

// A q8_0 weight matrix kept as the q8_0 GEMM's panels (q8_pack_matrix), which pool_mul_mat
// multiplies with q8_gemm_packed: the CPU's copy of the code predictor's layer matrices
// (DeviceCopies) where q8_keeps_panels says so and the rows are whole panels (fits_q8_panels).
// Such a tensor carries a tag in ggml_tensor::extra (the field ggml leaves to a backend's own
// layout of a tensor's data), and only pool_mul_mat may read it.
bool fits_q8_panels(const ggml_tensor *w);
// Writes the q8_0 rows `rows` of w's shape into w's data (host memory) as panels and tags w.
void store_q8_panels(ggml_tensor *w, const void *rows);
bool has_q8_panels(const ggml_tensor *w);

// The q8_0 dot product of a decoding step on this CPU: "AVX-512 VNNI" or "AVX2" (ours, 4 rows
// at a time from 4 streams, each row with the bits of ggml's AVX2 dot product), or "ggml" (its
// dot product row by row, read as weight_reads says: aarch64, x86-64 without AVX2).
// KAZEIA_KERNELS=avx2 forces the AVX2 path, =portable ggml's.
const char *q8_dot_isa();

// How a weight product's task of a type other than q8_0 (unless q8_dot_isa() is "ggml") reads
// its weight rows from memory: a product of a matrix with one
// column is bound by how fast a core brings the matrix in, and CPU families differ in what their
// prefetchers serve best: measured on Intel, one sequential stream keeps too few misses in
// flight and several streams whose next rows are prefetched by hand are faster; measured on
// AMD, the cores' own prefetchers follow one stream at the bandwidth and lose from several.
struct WeightReads {
    int64_t streams;    // sequential streams a task reads in turn, a row of each
    bool prefetch;      // ask for each stream's next row while computing the current one
    const char *name;   // "4 prefetched streams", "one stream" (start banner, benches)
};
// This CPU's way: one stream on AMD (and Hygon), 4 prefetched streams elsewhere.
// KAZEIA_WEIGHT_READS=streams or =sequential forces one (benches compare them; any other value
// is ignored, as KAZEIA_KERNELS's are). Chosen once per process.
const WeightReads &weight_reads();

// What pool_mul_mat computes once its activations are in the weight's dot type: y [n, M] from W
// (M rows of w_row bytes, of `type`) and x (n rows of x_row bytes), on `pool`. `gemm` (q8_0
// only): q8_gemm for the rows of whole 8-row panels; ggml's dot product per (row, column) for
// every other row. pool_mul_mat sets it when q8_gemm pays; tests compare both choices.
void mul_mat_converted(const char *w, size_t w_row, ggml_type type, int64_t M, int64_t K,
                       const char *x, size_t x_row, int64_t n, float *y, WorkerPool *pool, bool gemm);

}  // namespace kazeia

namespace kazeia {

// [a | b] along time: a [C, A] and b [C, B], contiguous f32 -> [C, A + B]. Two memcpys where
// ggml_concat goes element by element; the decoder copies its KV caches and conv histories so
// on every push.
ggml_tensor *concat_time(ggml_context *ctx, ggml_tensor *a, ggml_tensor *b);

// Softmax attention of n queries over n_kv keys, with grouped heads (query head h reads kv
// head h / (nh / nkv)): q [hd, nh, n] (contiguous), k and v [hd, n_kv, nkv], both f32 or both
// f16 (a talker cache of that type), with rows of hd values (any views with the same strides:
// a head-major cache's or kv_heads' view of interleaved rows), mask [n_kv, n] added to the
// scaled scores (0 or -inf; every query sees at least one key) -> [hd * nh, n]. One op instead
// of ggml's permute/cont/mul_mat/soft_max chain, whose copies of the transposed V cache cost
// more than the attention itself on a streamed frame.
struct AttentionParams {
    int64_t n_kv_heads = 1;
    float scale = 1.0f;
    WorkerPool *pool = nullptr;  // as in ConvGemmParams
};
ggml_tensor *window_attention(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k, ggml_tensor *v,
                              ggml_tensor *mask, const AttentionParams *params);
// Rows of all heads side by side, [hd * nkv, n], viewed per head as [hd, n, nkv] (no copy).
ggml_tensor *kv_heads(ggml_context *ctx, ggml_tensor *rows, int64_t hd);

}  // namespace kazeia

namespace kazeia {

// A matrix product in f32 on any backend: ggml's GPU backends may otherwise compute it in f16
// (CUDA's cuBLAS path for f16 or quantized weights); see also choose_vulkan_precision.
ggml_tensor *mul_mat_f32(ggml_context *ctx, ggml_tensor *a, ggml_tensor *b);

// The same operators in ggml's own ops, for a model part placed on a backend other than our
// CPU one (a GPU): what window_attention and snake_beta compute, with the same arguments (the
// attention's k and v any [hd, n_kv, nkv] views, e.g. of a cache).
ggml_tensor *attention_in_ggml_ops(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k, ggml_tensor *v,
                                   ggml_tensor *mask, int64_t n_kv_heads, float scale);
ggml_tensor *snake_beta_in_ggml_ops(ggml_context *ctx, ggml_tensor *x, ggml_tensor *alpha,
                                    ggml_tensor *inv_beta);

// The decoder's sliding-window attention in ggml's own ops, with every query's keys laid out
// alike: query i (of n) reads its own `window` key columns i .. i + window - 1 of k and v
// ([hd * nkv, window - 1 + n]), so a frame's scores sit at the same places, and are summed in
// the same order, whatever column of whichever push it is in. That makes a GPU's streamed
// decode bit-equal to its one-pass decode (attention_in_ggml_ops puts a query's keys at its
// own offset in a row of all keys: other soft_max reduction orders per column). The mask is
// [window, nh / nkv, 1, n]: 0 or -inf per query and window place.
ggml_tensor *window_attention_in_ggml_ops(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k,
                                          ggml_tensor *v, ggml_tensor *mask, int64_t n_kv_heads,
                                          float scale);

// A view of the contiguous f32 tensor `full` with the extents ne and the byte strides
// nb[1..3], which may overlap (numpy's as_strided): e.g. the im2col matrix of a conv is such a
// view of its left-padded input. ggml's own view functions size a view as the product of its
// extents and so reject overlapping ones; this one must still lie inside `full`.
ggml_tensor *strided_view(ggml_context *ctx, ggml_tensor *full, const int64_t (&ne)[4],
                          const size_t (&nb)[4]);

}  // namespace kazeia
