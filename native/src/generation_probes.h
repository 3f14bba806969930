// The tests' and benches' options of a generation, apart from the product's GenerationOptions:
// a trace of everything the reference outputs pin down, teacher forcing, the cache's growth
// step, and frames computed apart on a GPU. Only the test hooks (bindings/testing.cpp) use them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kazeia/generator.h"

namespace kazeia {

// Everything the reference outputs pin down, recorded when asked.
struct GenerationTrace {
    int64_t hidden = 0;
    std::vector<float> prefill_embeds;  // [L, hidden]
    std::vector<float> step_embeds;     // [steps, hidden]
    std::vector<float> talker_logits;   // [calls, vocab] raw codec_head logits
    std::vector<float> talker_hidden;   // [calls, hidden] final-norm hidden at the last position
    std::vector<float> cp_logits;       // [frames, groups - 1, cp vocab] raw
    // The layer matrices of each stack kept as the q8_0 GEMM's panels (has_q8_panels).
    int64_t talker_panels = 0, predictor_panels = 0;
    // The joined matrices of each stack's layers (LmLayer::qkv and gate_up that are set).
    int64_t talker_joined = 0, predictor_joined = 0;
};

// The talker's KV cache slots added at a time unless a probe says otherwise.
inline constexpr int DEFAULT_KV_BLOCK = 256;

struct GenerationProbes {
    // Talker KV cache slots added at a time (the cache grows with the generation).
    int kv_block = DEFAULT_KV_BLOCK;
    // Frames computed whole, in one graph, where both stacks share a GPU (src/frame_graph.h);
    // false: its talker step and code 0 apart from its code predictor.
    bool whole_frames = true;
    // Teacher forcing (quality measurements): frame i is forced[i], whatever the sampler picks
    // (logits are computed and traced as usual); generation ends after forced.size() frames.
    std::vector<Frame> forced;
    GenerationTrace *trace = nullptr;  // recorded when set
};

// Generator::start with probes.
std::unique_ptr<GenerationSession> start_probed(const Generator &generator,
                                                const std::vector<int32_t> &input_ids,
                                                const GenerationOptions &options,
                                                const GenerationProbes &probes);

}  // namespace kazeia
