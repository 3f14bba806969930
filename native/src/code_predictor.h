// Code predictor: codes 1..15 of a frame from the talker's hidden state and code 0.
#pragma once

#include <vector>

#include "kazeia/generator.h"
#include "sampler.h"
#include "talker_model.h"

namespace kazeia {

class CodePredictor {
  public:
    // Builds and allocates its two graphs once: the 2-token prefill and the 1-token step that
    // serves all 14 later sub-steps (position, cache slot, mask and head are inputs).
    // `backend` as for TalkerRun: the CPU with `pool`, or the predictor placement's device.
    CodePredictor(const TalkerModel &model, ggml_backend_t backend, WorkerPool *pool);

    // Fills frame[1..15]; frame[0] holds code 0. `trace`, when set, receives the raw logits of
    // the 15 heads [15, vocab].
    // `forced` (teacher forcing): codes 1..15 are taken from it instead of sampled.
    void predict(const float *talker_hidden, Frame &frame, const SamplingParams &params, Rng &rng,
                 std::vector<float> *trace, const Frame *forced = nullptr);

  private:
    const TalkerModel &m_;
    KvCache cache_;
    LmGraph prefill_, step_;
    std::vector<float> embeds_, scratch_;
};

}  // namespace kazeia
