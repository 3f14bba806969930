// A whole frame of generation as one graph, for a talker and a code predictor placed on the
// same GPU: the host hands the device a frame's few inputs and gets its 16 codes back, and
// neither logits nor hidden states nor the next step's input cross in between.
#pragma once

#include <memory>
#include <vector>

#include "code_predictor.h"
#include "device_sampler.h"
#include "talker.h"

namespace kazeia {

// One frame, computed on the device in one graph: the talker's step (reading the input row the
// frame before left on the device), code 0 drawn there as the host draws it (the repetition
// penalty over the codes 0 drawn so far, the control tokens but eos suppressed, eos only from
// the third frame), the code predictor's passes (PredictorPasses), then the next step's input
// row (the frame's code embeddings and the next text row, as TalkerModel::add_frame_embedding
// sums them) and the codes 0 seen, both kept on the device. Per frame the host uploads the
// step's position and mask, the next text row and the frame's 16 uniform draws, and downloads
// the 16 codes: one computation, one wait. The graph depends on the talker cache's slots in
// use: it is built again when the cache grows.
class FrameGraph {
  public:
    FrameGraph(const TalkerModel &model, KvCache &talker_cache, KvCache &predictor_cache,
               ggml_backend_t backend, const SamplingParams &talker, const SamplingParams &predictor,
               float repetition_penalty);
    ~FrameGraph();
    // False when the backend lacks one of its ops (nothing was allocated then).
    bool supported() const { return !graphs_.empty(); }

    // Hands over from the host: the input row [talker hidden] of the next talker step and the
    // codes 0 drawn so far.
    void start(const float *input, const std::vector<int32_t> &history);
    // The next frame: the talker step at cache slot `pos` (the cache holds it), `text` the text
    // row [talker hidden] of the step after it, eos allowed or not. Draws its uniforms from rng
    // in the host's order (code 0, then codes 1..15).
    Frame compute(int64_t pos, const float *text, bool eos_allowed, Rng &rng);

  private:
    struct Graph;
    std::unique_ptr<Graph> build();  // for the talker cache's slots in use now
    std::unique_ptr<Graph> allocate(std::unique_ptr<Graph> graph) const;  // its memory

    const TalkerModel &m_;
    KvCache &talker_cache_;
    ggml_backend_t backend_;
    float penalty_;
    int64_t vocab_, width_;
    DeviceSampler code0_;
    PredictorPasses passes_;
    AttentionParams attention_;  // the talker's (no pool on a GPU)
    // Constants and state, in their own buffer: the logit biases [vocab, 2] (column 0: eos
    // suppressed too), a 1 (what marks a code seen), the codes 0 seen [1, vocab] (0 or 1), the
    // next step's input row [width, 1].
    GgmlContextPtr ctx_;
    BufferPtr buf_;
    ggml_tensor *biases_ = nullptr, *one_ = nullptr, *seen_ = nullptr, *input_ = nullptr;
    // The graph for the cache's slots in use now (last), and those it replaced: kept for the
    // run (see TalkerRun::spent_). None: unsupported.
    std::vector<std::unique_ptr<Graph>> graphs_;
    std::vector<float> mask_, uniforms_, codes_;
};

}  // namespace kazeia
