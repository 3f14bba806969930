#include "frame_graph.h"

#include <cmath>
#include <stdexcept>

#include "ops.h"

namespace kazeia {

// One build of the frame's graph, for a number of talker cache slots in use.
struct FrameGraph::Graph {
    int64_t n_ctx = 0;
    std::vector<uint8_t> mem;
    GgmlContextPtr ctx;
    ggml_cgraph *gf = nullptr;
    GallocrPtr allocr;
    // Inputs: the step's position, slot and mask [n_ctx, 1]; the next text row; the frame's
    // uniforms [1, 16] (null when both draws are greedy); which bias column (I32 [1]).
    ggml_tensor *position = nullptr, *slot = nullptr, *mask = nullptr, *text = nullptr,
                *uniforms = nullptr, *bias_column = nullptr;
    ggml_tensor *codes = nullptr;  // output: the 16 codes as floats
};

FrameGraph::FrameGraph(const TalkerModel &model, KvCache &talker_cache, KvCache &predictor_cache,
                       ggml_backend_t backend, const SamplingParams &talker,
                       const SamplingParams &predictor, float repetition_penalty)
    : m_(model),
      talker_cache_(talker_cache),
      backend_(backend),
      penalty_(repetition_penalty),
      vocab_(model.hp.talker.vocab_size),
      width_(model.hp.talker.hidden_size),
      code0_(backend, talker, vocab_),
      passes_(model, predictor_cache, backend, predictor),
      attention_{model.hp.talker.num_kv_heads, 1.0f / std::sqrt((float)model.hp.talker.head_dim), nullptr} {
    ctx_.reset(ggml_init({ggml_tensor_overhead() * 4, nullptr, true}));
    biases_ = ggml_new_tensor_2d(ctx_.get(), GGML_TYPE_F32, vocab_, 2);
    one_ = ggml_new_tensor_2d(ctx_.get(), GGML_TYPE_F32, 1, 1);
    seen_ = ggml_new_tensor_2d(ctx_.get(), GGML_TYPE_F32, 1, vocab_);
    input_ = ggml_new_tensor_2d(ctx_.get(), GGML_TYPE_F32, width_, 1);
    buf_.reset(ggml_backend_alloc_ctx_tensors(ctx_.get(), backend));
    if (!buf_) throw std::runtime_error("out of device memory for the frame graph");
    std::vector<float> biases(2 * vocab_, 0.0f);
    for (float *column : {biases.data(), biases.data() + vocab_})
        suppress_range(column, vocab_, vocab_ - CODEC_CONTROL_TOKENS, vocab_, model.hp.codec_eos_id);
    biases[model.hp.codec_eos_id] = -INFINITY;
    ggml_backend_tensor_set(biases_, biases.data(), 0, ggml_nbytes(biases_));
    const float one = 1.0f;
    ggml_backend_tensor_set(one_, &one, 0, sizeof(one));

    std::unique_ptr<Graph> graph = build();
    if (computes_all(backend_, graph->gf)) graphs_.push_back(allocate(std::move(graph)));
}

FrameGraph::~FrameGraph() = default;

std::unique_ptr<FrameGraph::Graph> FrameGraph::build() {
    const StackPlacement &talker = m_.talker_at, &predictor = m_.predictor_at;
    auto g = std::make_unique<Graph>();
    g->n_ctx = talker_cache_.n_ctx;
    g->mem.resize(ggml_tensor_overhead() * FRAME_GRAPH_SIZE +
                  ggml_graph_overhead_custom(FRAME_GRAPH_SIZE, false));
    g->ctx.reset(ggml_init({g->mem.size(), g->mem.data(), true}));
    ggml_context *ctx = g->ctx.get();
    g->gf = ggml_new_graph_custom(ctx, FRAME_GRAPH_SIZE, false);
    g->position = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1);
    g->slot = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, 1);
    g->mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, g->n_ctx, 1);
    g->text = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, width_, 1);
    g->bias_column = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1);
    for (ggml_tensor *t : {g->position, g->slot, g->mask, g->text, g->bias_column}) ggml_set_input(t);
    const int64_t groups = m_.hp.num_code_groups;
    if (!code0_.params().greedy || !passes_.params().greedy) {
        g->uniforms = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, groups);
        ggml_set_input(g->uniforms);
    }

    // The talker's step, and code 0 from its logits: penalty, biases, draw (uniform 0).
    std::vector<ggml_tensor *> k_cache = talker_cache_.k, v_cache = talker_cache_.v;
    const StackPass step{g->position, g->slot, g->mask, g->n_ctx};
    ggml_tensor *hidden = stack_forward(ctx, talker.stack, input_, step, k_cache, v_cache, &attention_, nullptr);
    ggml_tensor *logits = mul_mat_f32(ctx, talker.head, hidden);
    logits = penalize_repeats(ctx, logits, ggml_reshape_2d(ctx, seen_, vocab_, 1), penalty_);
    logits = ggml_add(ctx, logits, ggml_get_rows(ctx, biases_, g->bias_column));
    ggml_tensor *u0 = g->uniforms ? ggml_view_2d(ctx, g->uniforms, 1, 1, g->uniforms->nb[1], 0) : nullptr;
    ggml_tensor *code0 = code0_.draw(ctx, logits, u0);
    ggml_build_forward_expand(g->gf, ggml_set_rows(ctx, seen_, one_, code0));

    // Codes 1..15 from the talker's hidden state and code 0's embedding (uniforms 1..15).
    ggml_tensor *code0_row = ggml_get_rows(ctx, talker.embd, code0);
    std::vector<ggml_tensor *> codes =
        passes_.add(ctx, ggml_concat(ctx, hidden, code0_row, 1), g->uniforms, 1, nullptr);

    // The next step's input: C(code 0) + the embeddings of codes 1..15 + the text row, summed in
    // the host's order (so to the same bits), kept in input_ for the next frame.
    const int64_t cp_vocab = m_.hp.predictor.vocab_size;
    ggml_tensor *next = code0_row;
    for (int64_t c = 0; c < (int64_t)codes.size(); ++c)
        next = ggml_add(ctx, next, codebook_embedding(ctx, predictor.embd, cp_vocab, c + 1, codes[c]));
    ggml_build_forward_expand(g->gf, ggml_cpy(ctx, ggml_add(ctx, next, g->text), input_));

    codes.insert(codes.begin(), code0);
    g->codes = codes_as_floats(ctx, codes);
    ggml_set_output(g->codes);
    ggml_build_forward_expand(g->gf, g->codes);
    return g;
}

std::unique_ptr<FrameGraph::Graph> FrameGraph::allocate(std::unique_ptr<Graph> graph) const {
    graph->allocr = allocate_graph(backend_, graph->gf, "out of memory allocating the frame graph");
    return graph;
}

void FrameGraph::start(const float *input, const std::vector<int32_t> &history) {
    ggml_backend_tensor_set(input_, input, 0, ggml_nbytes(input_));
    std::vector<float> seen(vocab_, 0.0f);
    for (int32_t code : history)
        if (code >= 0 && code < vocab_) seen[code] = 1.0f;
    ggml_backend_tensor_set(seen_, seen.data(), 0, ggml_nbytes(seen_));
}

Frame FrameGraph::compute(int64_t pos, const float *text, bool eos_allowed, Rng &rng) {
    if (graphs_.back()->n_ctx != talker_cache_.n_ctx) graphs_.push_back(allocate(build()));
    const Graph &g = *graphs_.back();
    if (pos >= g.n_ctx) throw std::logic_error("frame graph: the talker cache does not hold the step");
    const int32_t position = (int32_t)pos, column = eos_allowed ? 1 : 0;
    const int64_t slot = pos;
    ggml_backend_tensor_set(g.position, &position, 0, sizeof(position));
    ggml_backend_tensor_set(g.slot, &slot, 0, sizeof(slot));
    ggml_backend_tensor_set(g.bias_column, &column, 0, sizeof(column));
    mask_.assign(g.n_ctx, -INFINITY);  // the step sees slots 0 .. pos
    std::fill_n(mask_.begin(), pos + 1, 0.0f);
    ggml_backend_tensor_set(g.mask, mask_.data(), 0, ggml_nbytes(g.mask));
    ggml_backend_tensor_set(g.text, text, 0, ggml_nbytes(g.text));
    if (g.uniforms) {
        // As the host draws them: one for code 0 unless greedy, then the predictor's 15.
        uniforms_.assign(ggml_nelements(g.uniforms), 0.0f);
        if (!code0_.params().greedy) uniforms_[0] = (float)rng.uniform();
        if (!passes_.params().greedy)
            for (size_t i = 1; i < uniforms_.size(); ++i) uniforms_[i] = (float)rng.uniform();
        ggml_backend_tensor_set(g.uniforms, uniforms_.data(), 0, ggml_nbytes(g.uniforms));
    }
    if (ggml_backend_graph_compute(backend_, g.gf) != GGML_STATUS_SUCCESS)
        throw std::runtime_error("frame graph computation failed");
    codes_.resize(ggml_nelements(g.codes));
    ggml_backend_tensor_get(g.codes, codes_.data(), 0, ggml_nbytes(g.codes));
    Frame frame{};
    for (size_t i = 0; i < frame.size(); ++i) frame[i] = (int32_t)codes_[i];
    return frame;
}

}  // namespace kazeia
