// Code predictor: codes 1..15 of a frame from the talker's hidden state and code 0.
#pragma once

#include <memory>
#include <vector>

#include "device_sampler.h"
#include "kazeia/generator.h"
#include "sampler.h"
#include "talker.h"

namespace kazeia {

// The code predictor's 15 passes of a frame for a graph on a GPU (the 2-row prefill, then 14
// single rows, each reading the code the one before it drew), with the draws between them
// computed on the device (DeviceSampler): the passes' constant inputs, set once, and the ops
// that add them to a graph (PredictorFrameGraph's, or a whole frame's: frame_graph.h).
class PredictorPasses {
  public:
    // Writes the K/V of its passes into `cache` (slots 0..15).
    PredictorPasses(const TalkerModel &model, KvCache &cache, ggml_backend_t backend,
                    const SamplingParams &params);
    const SamplingParams &params() const { return sampler_.params(); }
    int64_t count() const { return passes_; }

    // The passes from `rows` [talker hidden, 2] (the talker's hidden state and code 0's
    // embedding), pass p drawing with uniforms[first_uniform + p] ([1, n]; null when greedy).
    // Returns the 15 codes drawn, each I32 [1]; `logits`, when set, receives each pass's.
    std::vector<ggml_tensor *> add(ggml_context *ctx, ggml_tensor *rows, ggml_tensor *uniforms,
                                   int64_t first_uniform, std::vector<ggml_tensor *> *logits) const;

  private:
    const StackPlacement &at_;
    KvCache &cache_;
    int64_t passes_, vocab_;
    DeviceSampler sampler_;
    AttentionParams attention_;  // (no pool on a GPU)
    // Per pass: positions, cache slots and head index; the prefill's causal mask.
    GgmlContextPtr ctx_;
    BufferPtr buf_;
    std::vector<ggml_tensor *> positions_, slots_, head_ids_;
    ggml_tensor *prefill_mask_ = nullptr;
};

// The code predictor's embeddings [width, 1] of `code` (I32 [1]) of codebook `group` (1..15),
// looked up in its tables `embd` ([width, 15 x vocab], on the device).
ggml_tensor *codebook_embedding(ggml_context *ctx, ggml_tensor *embd, int64_t vocab, int64_t group,
                                ggml_tensor *code);

// Nodes enough for a graph of a frame's passes or more (a whole frame: frame_graph.h).
inline constexpr int FRAME_GRAPH_SIZE = 8192;

// Codes I32 [1] each, as one f32 row [n] (exact below 2^24) to download at once: every backend
// concatenates f32.
ggml_tensor *codes_as_floats(ggml_context *ctx, const std::vector<ggml_tensor *> &codes);

// The code predictor's whole frame as one graph, for a predictor placed on a GPU
// (PredictorPasses). A frame then costs one upload (the talker's hidden state and code 0's
// embedding, and the frame's uniform draws), one computation and one download (its codes)
// instead of a host round trip per code: each is a submission and a wait on a GPU.
class PredictorFrameGraph {
  public:
    PredictorFrameGraph(const TalkerModel &model, KvCache &cache, ggml_backend_t backend,
                        const SamplingParams &params);
    // False when the backend lacks one of its ops (nothing was allocated then).
    bool supported() const { return allocr_ != nullptr; }
    const SamplingParams &params() const { return passes_.params(); }
    // `rows` [2, talker hidden]: the talker's hidden state and code 0's embedding. Fills
    // frame[1..15]; `trace` as CodePredictor::predict.
    void predict(const float *rows, Frame &frame, Rng &rng, std::vector<float> *trace);

  private:
    ggml_backend_t backend_;
    PredictorPasses passes_;
    std::vector<uint8_t> mem_;
    GgmlContextPtr ctx_;
    ggml_cgraph *gf_ = nullptr;
    GallocrPtr allocr_;  // null: unsupported
    ggml_tensor *rows_ = nullptr, *uniforms_ = nullptr, *codes_ = nullptr;
    std::vector<ggml_tensor *> logits_;
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
    // where it can be: not forced, every op there; else 15 of the step graphs.
    void predict(const float *talker_hidden, Frame &frame, const SamplingParams &params, Rng &rng,
                 std::vector<float> *trace, const Frame *forced = nullptr);

    // Graph computations so far: 15 a frame by steps, 1 by the frame graph.
    int64_t computations() const { return computations_; }
    // Its K/V cache (slots 0..15, rewritten every frame), for a graph that computes its passes.
    KvCache &cache() { return cache_; }

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
