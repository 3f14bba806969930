// Code predictor: codes 1..15 of a frame from the talker's hidden state and code 0.
#pragma once

#include <memory>
#include <vector>

#include "kazeia/generator.h"
#include "sampler.h"
#include "talker_model.h"

namespace kazeia {

// The code predictor's whole frame as one graph, for a predictor placed on a GPU: its 15 passes
// (the 2-row prefill, then 14 single rows, each reading the code the one before it drew) with
// the sampling between them computed on the device. A frame then costs one upload (the talker's
// hidden state and code 0's embedding, and the frame's uniform draws), one computation and one
// download (its codes) instead of a host round trip per code: each is a submission and a wait
// on a GPU. It samples as select_token does, from the same draws of the same Rng, in f32:
// greedy (the first maximum), temperature, top-k (exactly k kept, where select_token keeps ties
// with the k-th value too), not top-p (the step graphs do that).
class PredictorFrameGraph {
  public:
    // Writes the K/V of its passes into `cache` (slots 0..15).
    PredictorFrameGraph(const TalkerModel &model, KvCache &cache, ggml_backend_t backend,
                        const SamplingParams &params);
    // False when the backend lacks one of its ops (nothing was allocated then).
    bool supported() const { return supported_; }
    const SamplingParams &params() const { return params_; }
    // `rows` [2, talker hidden]: the talker's hidden state and code 0's embedding. Fills
    // frame[1..15]; `trace` as CodePredictor::predict.
    void predict(const float *rows, Frame &frame, Rng &rng, std::vector<float> *trace);

  private:
    int64_t candidates() const;  // the codes a draw is among: top_k, or all
    ggml_tensor *sample(ggml_tensor *logits, int pass);

    ggml_backend_t backend_;
    SamplingParams params_;
    int64_t passes_, vocab_;
    // Per pass: positions, cache slots and head index; the prefill's causal mask; for sampling
    // among n candidates, the last index, a descending ramp (the first true as an argmax) and a
    // lower triangle of ones [n, n] (prefix sums as a product). Set once, in their own buffer.
    GgmlContextPtr const_ctx_;
    BufferPtr const_buf_;
    std::vector<ggml_tensor *> positions_, slots_, head_ids_;
    ggml_tensor *prefill_mask_ = nullptr, *last_index_ = nullptr, *ramp_ = nullptr,
                *triangle_ = nullptr;
    std::vector<uint8_t> mem_;
    GgmlContextPtr ctx_;
    ggml_cgraph *gf_ = nullptr;
    GallocrPtr allocr_;
    AttentionParams attention_;
    ggml_tensor *rows_ = nullptr, *uniforms_ = nullptr, *codes_ = nullptr;
    std::vector<ggml_tensor *> logits_;
    bool supported_ = false;
};

class CodePredictor {
  public:
    // Builds and allocates its two graphs once: the 2-token prefill and the 1-token step that
    // serves all 14 later sub-steps (position, cache slot, mask and head are inputs).
    // `backend` as for TalkerRun: the CPU with `pool`, or the predictor placement's device.
    CodePredictor(const TalkerModel &model, ggml_backend_t backend, WorkerPool *pool);

    // Fills frame[1..15]; frame[0] holds code 0. `trace`, when set, receives the raw logits of
    // the 15 heads [15, vocab].
    // `forced` (teacher forcing): codes 1..15 are taken from it instead of sampled.
    // On a GPU the frame is one computation of a PredictorFrameGraph (built at the first frame)
    // where it can be: not forced, top_p 1, every op there; else 15 of the step graphs.
    void predict(const float *talker_hidden, Frame &frame, const SamplingParams &params, Rng &rng,
                 std::vector<float> *trace, const Frame *forced = nullptr);

    // Graph computations so far: 15 a frame by steps, 1 by the frame graph.
    int64_t computations() const { return computations_; }

  private:
    const TalkerModel &m_;
    ggml_backend_t backend_;
    KvCache cache_;
    LmGraph prefill_, step_;
    std::unique_ptr<PredictorFrameGraph> frame_graph_;
    bool frame_graph_tried_ = false;
    std::vector<float> embeds_, scratch_;
    int64_t computations_ = 0;
};

}  // namespace kazeia
