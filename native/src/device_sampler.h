// Token selection computed on a device, inside a graph: what sampler.h does on the host, for
// the graphs that draw their codes without handing logits to the host (a GPU's frame graphs).
#pragma once

#include <cstdint>

#include "ggml_raii.h"
#include "sampler.h"

namespace kazeia {

// Draws a token as select_token does, from the same uniform, in f32: greedy (the first
// maximum), temperature, top-k (exactly k kept, where select_token keeps ties with the k-th
// value too), top-p (ties in probability ordered as the device's sort orders them, where
// select_token keeps them in token order) and the inverse CDF in token order. Its constants
// live in their own buffer on `backend`, set once; draw() adds the ops to a graph.
class DeviceSampler {
  public:
    DeviceSampler(ggml_backend_t backend, const SamplingParams &params, int64_t vocab);
    const SamplingParams &params() const { return params_; }

    // The token drawn from logits [vocab, 1] as an I32 [1]; `uniform` [1, 1] is the draw in
    // [0, 1) (unused, and may be null, when greedy).
    ggml_tensor *draw(ggml_context *ctx, ggml_tensor *logits, ggml_tensor *uniform) const;

  private:
    int64_t candidates() const;  // the tokens a draw is among: top_k, or all
    // 1 for the candidates top-p keeps, 0 for the others [n, 1], from their scaled logits x
    // and probabilities [n, 1].
    ggml_tensor *nucleus(ggml_context *ctx, ggml_tensor *x, ggml_tensor *probs) const;

    SamplingParams params_;
    int64_t vocab_;
    // For n candidates: the last index, a descending ramp (the first true as an argmax), a
    // lower triangle of ones [n, n] (prefix sums as a product) and, for top-p, a 1 at the last
    // index [n] (the most probable is always kept).
    GgmlContextPtr ctx_;
    BufferPtr buf_;
    ggml_tensor *last_index_ = nullptr, *ramp_ = nullptr, *triangle_ = nullptr, *last_one_ = nullptr;
};

// apply_repetition_penalty on a device: logits [vocab, 1] with every token whose `seen` [vocab]
// is 1 (0 for the others) penalized, x * p below 0 and x / p above, exactly as the host (a
// factor of exactly 1 elsewhere).
ggml_tensor *penalize_repeats(ggml_context *ctx, ggml_tensor *logits, ggml_tensor *seen, float penalty);

}  // namespace kazeia
