// The loaded talker GGUF (talker, text path, code predictor), shared by all sessions.
#pragma once

#include <string>
#include <vector>

#include "gguf_weights.h"
#include "kazeia/generator.h"
#include "lm_graph.h"

namespace kazeia {

struct Generator::Model {
    GgufWeights weights;  // memory-mapped: untouched rows of the text table stay on disk
    TalkerHParams hp;
    int n_threads;
    LmStack talker, predictor;
    ggml_tensor *codec_embd, *text_embd, *text_fc1_w, *text_fc1_b, *text_fc2_w, *text_fc2_b;
    ggml_tensor *head;
    ggml_tensor *cp_proj_w = nullptr, *cp_proj_b = nullptr, *cp_embd, *cp_heads;

    Model(const std::string &path, int threads);

    // Text path P(x) = fc2(silu(fc1(text_embd[x]))) of each id: [ids.size(), hidden].
    std::vector<float> text_projection(const std::vector<int32_t> &ids, ggml_backend_t backend,
                                       WorkerPool *pool) const;
};

}  // namespace kazeia
