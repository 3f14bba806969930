// Qwen3 decoder stacks (talker and code predictor) as ggml graphs over a fixed-size KV cache.
//
// A graph is built once for a given token count and cache size, allocated once, and then
// evaluated many times: positions, cache slots and the attention mask are inputs, so the code
// predictor's 14 single-token steps per frame reuse one graph without rebuilding anything.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <unordered_map>
#include <vector>

#include "ggml_raii.h"
#include "talker_arch.h"
#include "ops.h"
#include "worker_pool.h"

namespace kazeia {

class GgufWeights;

struct LmLayer {
    ggml_tensor *attn_norm, *q, *k, *v, *o, *q_norm, *k_norm, *ffn_norm, *gate, *up, *down;
    // q, k and v as one matrix, and gate and up, where their copies lie back to back in the CPU's
    // memory (DeviceCopies::joined; null elsewhere): one product each in the pool instead of
    // three and two, and as many fewer times the threads wait for each other.
    ggml_tensor *qkv = nullptr, *gate_up = nullptr;
};

// Every tensor of a layer, for code that treats them all alike (stack_tensors, DeviceCopies).
// DeviceCopies copies them in this order: q, k, v and gate, up next to each other is what lets
// them be joined (LmLayer::qkv, gate_up).
inline constexpr ggml_tensor *LmLayer::*LM_LAYER_TENSORS[] = {
    &LmLayer::attn_norm, &LmLayer::q,      &LmLayer::k,        &LmLayer::v,
    &LmLayer::o,         &LmLayer::q_norm, &LmLayer::k_norm,   &LmLayer::ffn_norm,
    &LmLayer::gate,      &LmLayer::up,     &LmLayer::down};
// Its matrices (the others are norms' vectors).
inline constexpr ggml_tensor *LmLayer::*LM_LAYER_MATRICES[] = {
    &LmLayer::q, &LmLayer::k, &LmLayer::v, &LmLayer::o, &LmLayer::gate, &LmLayer::up, &LmLayer::down};

struct LmStack {
    LmHParams hp;
    std::vector<LmLayer> layers;
    ggml_tensor *norm = nullptr;
};

// Every weight tensor of a stack (its layers and final norm).
std::vector<ggml_tensor *> stack_tensors(const LmStack &stack);
// The matrices of a stack's layers (what pool_mul_mat multiplies on the CPU).
std::vector<ggml_tensor *> stack_matrices(const LmStack &stack);

// Copies of tensors in one buffer of a device's memory, made once at load: the weights of a
// stack placed on a GPU, or on the CPU in the process's own memory (StackPlacement says why).
class DeviceCopies {
  public:
    // ModelError naming `what` when the device's memory cannot hold them. With
    // `source`, the file's pages of each tensor are given back once it is copied
    // (GgufWeights::discard), so that the two never add up in memory. In the CPU's memory, those
    // of `as_panels` that fit are kept as q8_0 panels (store_q8_panels).
    DeviceCopies(const std::vector<ggml_tensor *> &tensors, ggml_backend_buffer_type_t buft,
                 const char *what, GgufWeights *source = nullptr,
                 const std::vector<ggml_tensor *> &as_panels = {});
    // The copy of `host` (null for null); std::logic_error when it was not copied.
    ggml_tensor *operator[](const ggml_tensor *host) const;
    // The stack with every tensor replaced by its copy.
    LmStack stack(const LmStack &host) const;
    // One matrix named `part` (as in "blk.N.<part>.weight") over copies of one type and row
    // length that lie back to back in this buffer, each a whole number of the q8_0 GEMM's row
    // blocks (so that every row is computed by the same kernel, joined or apart: the GEMM leaves
    // a matrix's last rows to the dot product) and all kept the same way (rows or panels); null
    // where they do not.
    ggml_tensor *joined(std::initializer_list<ggml_tensor *> copies, const char *part);

  private:
    GgmlContextPtr ctx_;
    BufferPtr buffer_;
    std::unordered_map<const ggml_tensor *, ggml_tensor *> copies_;
};

// K and V of every layer: [head_dim, capacity, n_kv_heads] each, f32 or f16 (a talker's K/V
// cache type), in one backend buffer.
// Head-major: each head's rows follow each other, so that the attention of one head reads one
// sequential stream (rows of all heads side by side put each head's next row a page away,
// where the hardware prefetchers stop: a long synthesis's attention then waited on memory far
// longer than its bytes take to read).
struct KvCache {
    GgmlContextPtr ctx;
    BufferPtr buffer;
    std::vector<ggml_tensor *> k, v;  // per layer [head_dim, capacity, n_kv_heads]
    int64_t n_ctx = 0;     // the slots in use: attention runs over these
    int64_t capacity = 0;  // the slots allocated: their pages are touched only once in use

    // `capacity` (default n_ctx) slots, the first n_ctx in use.
    KvCache(const LmHParams &hp, int64_t n_ctx, ggml_backend_t backend, int64_t capacity = 0,
            ggml_type type = GGML_TYPE_F32);
    ggml_type type() const { return k.front()->type; }
    // More slots in use (at most the capacity), cleared: a cache grows in place, never copied.
    void extend(int64_t n_ctx);
    // The first `rows` slots of `layer` (K, then V), [n_kv_heads][rows][head_dim] floats each:
    // copied out, or back in (an f16 cache's values widened, and rounded back: unchanged).
    void read_rows(size_t layer, int64_t rows, std::vector<float> &k_out, std::vector<float> &v_out) const;
    void write_rows(size_t layer, int64_t rows, const std::vector<float> &k_in,
                    const std::vector<float> &v_in);

  private:
    void clear(int64_t from, int64_t to);
};

// The per-pass inputs of a stack's forward pass: positions [n] (I32), the cache slots its rows
// are written to [n] (I64), the attention mask [n_ctx, n] over the first n_ctx slots (null, on
// a GPU only: every one visible).
struct StackPass {
    ggml_tensor *positions, *slots, *mask;
    int64_t n_ctx;
};

// Embeddings x [in_dim, n] at the stack's width: through `in_proj_w` and `in_proj_b` when
// set (the code predictor's projection from the talker's width), else x itself.
ggml_tensor *stack_input(ggml_context *ctx, ggml_tensor *x, ggml_tensor *in_proj_w,
                         ggml_tensor *in_proj_b, WorkerPool *pool);

// x [hidden, n] through every layer of `stack`; returns the last row, normed [hidden, 1]. The
// rows' K/V are written into k_cache[il] / v_cache[il] at the pass's slots, which then name the
// written caches: a later pass given them reads after this pass's writes (ggml orders a graph
// by its tensors' sources). `attention` must outlive the graph; `pool` as for LmGraph.
ggml_tensor *stack_forward(ggml_context *ctx, const LmStack &stack, ggml_tensor *x,
                           const StackPass &pass, std::vector<ggml_tensor *> &k_cache,
                           std::vector<ggml_tensor *> &v_cache, const AttentionParams *attention,
                           WorkerPool *pool);

// Logits [vocab, 1] of hidden [hidden, 1] through head head_id (I32 [1]) of heads [hidden,
// vocab, n_heads].
ggml_tensor *head_logits(ggml_context *ctx, ggml_tensor *heads, ggml_tensor *hidden,
                         ggml_tensor *head_id, WorkerPool *pool);

// A built and allocated graph of one stack: n tokens in, last position out.
class LmGraph {
  public:
    // in_dim: width of the input embeddings; `in_proj` (w [in_dim, hidden] and bias) maps
    // them to the stack's width when set. With `heads` ([hidden, vocab, n]) the output
    // head is chosen per evaluation (set_head); else `head` ([hidden, vocab]) is used.
    // With a pool (the CPU placement), the weight matmuls and the attention are our own ops run
    // in `pool`, the rest of the graph on the backend's one thread. Without one (a GPU
    // placement), the graph is ggml's own ops only, all computed by `backend`; the weights
    // must then be in its memory (DeviceCopies).
    LmGraph(const LmStack &stack, KvCache &cache, int64_t n_tokens, int64_t in_dim,
            ggml_tensor *in_proj_w, ggml_tensor *in_proj_b, ggml_tensor *head,
            ggml_tensor *heads, ggml_backend_t backend, WorkerPool *pool);

    // Feeds embeddings [n_tokens, in_dim] at positions [pos0, pos0 + n) (cache slots = positions)
    // and evaluates. After it, logits() and hidden() hold the last position's outputs.
    void eval(const float *embeds, int64_t pos0, int32_t head_index = 0);
    const std::vector<float> &logits() const { return logits_; }
    const std::vector<float> &hidden() const { return hidden_; }

  private:
    ggml_backend_t backend_;
    int64_t n_tokens_, n_ctx_, in_dim_;
    std::vector<uint8_t> mem_;
    GgmlContextPtr ctx_;
    ggml_cgraph *gf_ = nullptr;
    GallocrPtr allocr_;
    AttentionParams attention_;  // the attention op's parameters (its pool), for the graph's life
    ggml_tensor *embeds_, *positions_, *slots_, *mask_, *head_id_ = nullptr;
    ggml_tensor *out_hidden_, *out_logits_;
    std::vector<float> logits_, hidden_, mask_data_;
};

// Rows `ids` of an embedding table (any ggml type) as f32, appended to `out`.
void embedding_rows(const ggml_tensor *table, const std::vector<int32_t> &ids, std::vector<float> &out);
// out[i] += row(table, id)[i]
void add_embedding_row(const ggml_tensor *table, int64_t id, float *out);

}  // namespace kazeia
