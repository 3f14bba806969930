// Token selection computed on a device, inside a graph: what sampler.h does on the host, for
// the graphs that draw their codes without handing logits to the host (a GPU's frame graphs).
#pragma once

#include <cstdint>

#include "ggml_raii.h"
#include "sampler.h"

namespace kazeia {

// Draws a token as select_token does, from the same uniform, in f32: greedy (the first
// maximum), temperature, top-k (exactly k kept, where select_token keeps ties with the k-th
// value too) and the inverse CDF in token order; not top-p (the host draws that). Its
// constants live in their own buffer on `backend`, set once; draw() adds the ops to a graph.
class DeviceSampler {
  public:
    DeviceSampler(ggml_backend_t backend, const SamplingParams &params, int64_t vocab);
    // Whether a device can draw with these parameters (no top-p).
    static bool draws(const SamplingParams &params) { return params.top_p >= 1.0f; }
    const SamplingParams &params() const { return params_; }

    // The token drawn from logits [vocab, 1] as an I32 [1]; `uniform` [1, 1] is the draw in
    // [0, 1) (unused, and may be null, when greedy).
    ggml_tensor *draw(ggml_context *ctx, ggml_tensor *logits, ggml_tensor *uniform) const;

  private:
    int64_t candidates() const;  // the tokens a draw is among: top_k, or all

    SamplingParams params_;
    int64_t vocab_;
    // For n candidates: the last index, a descending ramp (the first true as an argmax) and a
    // lower triangle of ones [n, n] (prefix sums as a product).
    GgmlContextPtr ctx_;
    BufferPtr buf_;
    ggml_tensor *last_index_ = nullptr, *ramp_ = nullptr, *triangle_ = nullptr;
};

// apply_repetition_penalty on a device: logits [vocab, 1] with every token whose `seen` [vocab]
// is 1 (0 for the others) penalized, x * p below 0 and x / p above, exactly as the host (a
// factor of exactly 1 elsewhere).
ggml_tensor *penalize_repeats(ggml_context *ctx, ggml_tensor *logits, ggml_tensor *seen, float penalty);

}  // namespace kazeia
