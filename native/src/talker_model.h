// The loaded talker GGUF (talker, text path, code predictor), shared by all sessions.
#pragma once

#include <list>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gguf_weights.h"
#include "kazeia/generator.h"
#include "lm_graph.h"

namespace kazeia {

struct Generator::Model {
    GgufWeights weights;  // memory-mapped: untouched rows of the text table stay on disk
    TalkerHParams hp;
    int n_threads;
    bool polite = false;
    LmStack talker, predictor;
    ggml_tensor *codec_embd, *text_embd, *text_fc1_w, *text_fc1_b, *text_fc2_w, *text_fc2_b;
    ggml_tensor *head;
    ggml_tensor *cp_proj_w = nullptr, *cp_proj_b = nullptr, *cp_embd, *cp_heads;

    Model(const std::string &path, int threads);

    // The prompt rows before the text depend only on the voice (role tokens, language and
    // speaker codec tokens): their talker K/V are computed once per voice and reused, so a
    // synthesis prefills only its text rows. Small LRU, shared by the sessions.
    struct PrefixKv {
        std::vector<int32_t> key;  // role ids + codec prefix ids
        int64_t rows = 0;
        std::vector<std::vector<float>> k, v;  // per layer [rows][kv_dim]
    };
    static constexpr size_t PREFIX_CACHE_SIZE = 16;
    mutable std::mutex prefix_mutex;
    mutable std::list<PrefixKv> prefix_cache;  // most recent first
    bool find_prefix(const std::vector<int32_t> &key, PrefixKv &out) const;
    void store_prefix(PrefixKv entry) const;

    // Text path P(x) = fc2(silu(fc1(text_embd[x]))) of each id: [ids.size(), hidden].
    std::vector<float> text_projection(const std::vector<int32_t> &ids, ggml_backend_t backend,
                                       WorkerPool *pool) const;
};

}  // namespace kazeia
