#include "code_predictor.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace kazeia {

namespace {
bool same(const SamplingParams &a, const SamplingParams &b) {
    return a.greedy == b.greedy && a.temperature == b.temperature && a.top_k == b.top_k &&
           a.top_p == b.top_p;
}
}  // namespace

PredictorPasses::PredictorPasses(const TalkerModel &model, KvCache &cache, ggml_backend_t backend,
                                 const SamplingParams &params)
    : at_(model.predictor_at),
      cache_(cache),
      passes_(model.hp.num_code_groups - 1),
      vocab_(model.hp.predictor.vocab_size),
      sampler_(backend, params, vocab_),
      attention_{at_.stack.hp.num_kv_heads, 1.0f / std::sqrt((float)at_.stack.hp.head_dim), nullptr} {
    // Pass p writes slots 0, 1 (p = 0) or p + 1 and attends over slots 0 .. p + 1.
    auto pass_rows = [](int64_t p) { return p == 0 ? 2 : 1; };
    ctx_.reset(ggml_init({ggml_tensor_overhead() * (3 * passes_ + 1), nullptr, true}));
    for (int64_t p = 0; p < passes_; ++p) {
        positions_.push_back(ggml_new_tensor_1d(ctx_.get(), GGML_TYPE_I32, pass_rows(p)));
        slots_.push_back(ggml_new_tensor_1d(ctx_.get(), GGML_TYPE_I64, pass_rows(p)));
        head_ids_.push_back(ggml_new_tensor_1d(ctx_.get(), GGML_TYPE_I32, 1));
    }
    prefill_mask_ = ggml_new_tensor_2d(ctx_.get(), GGML_TYPE_F32, 2, 2);
    buf_.reset(ggml_backend_alloc_ctx_tensors(ctx_.get(), backend));
    if (!buf_) throw std::runtime_error("out of device memory for the code predictor's frame graph");
    for (int64_t p = 0; p < passes_; ++p) {
        const std::vector<int32_t> pos = p == 0 ? std::vector<int32_t>{0, 1} : std::vector<int32_t>{(int32_t)p + 1};
        const std::vector<int64_t> slot(pos.begin(), pos.end());
        const int32_t head = (int32_t)p;
        ggml_backend_tensor_set(positions_[p], pos.data(), 0, ggml_nbytes(positions_[p]));
        ggml_backend_tensor_set(slots_[p], slot.data(), 0, ggml_nbytes(slots_[p]));
        ggml_backend_tensor_set(head_ids_[p], &head, 0, sizeof(head));
    }
    const float causal[4] = {0.0f, -INFINITY, 0.0f, 0.0f};
    ggml_backend_tensor_set(prefill_mask_, causal, 0, sizeof(causal));
}

std::vector<ggml_tensor *> PredictorPasses::add(ggml_context *ctx, ggml_tensor *rows,
                                                ggml_tensor *uniforms, int64_t first_uniform,
                                                std::vector<ggml_tensor *> *logits) const {
    std::vector<ggml_tensor *> k_cache = cache_.k, v_cache = cache_.v, codes;
    ggml_tensor *x = rows;
    for (int64_t p = 0; p < passes_; ++p) {
        if (p > 0) x = codebook_embedding(ctx, at_.embd, vocab_, p, codes.back());  // code p
        ggml_tensor *h = stack_input(ctx, x, at_.in_proj_w, at_.in_proj_b, nullptr);
        const StackPass pass{positions_[p], slots_[p], p == 0 ? prefill_mask_ : nullptr, p + 2};
        h = stack_forward(ctx, at_.stack, h, pass, k_cache, v_cache, &attention_, nullptr);
        ggml_tensor *pass_logits = head_logits(ctx, at_.heads, h, head_ids_[p], nullptr);
        if (logits) logits->push_back(pass_logits);
        ggml_tensor *u = uniforms ? ggml_view_2d(ctx, uniforms, 1, 1, uniforms->nb[1],
                                                 (first_uniform + p) * uniforms->nb[1])
                                  : nullptr;
        codes.push_back(sampler_.draw(ctx, pass_logits, u));
    }
    return codes;
}

ggml_tensor *codebook_embedding(ggml_context *ctx, ggml_tensor *embd, int64_t vocab, int64_t group,
                                ggml_tensor *code) {
    ggml_tensor *table = ggml_view_2d(ctx, embd, embd->ne[0], vocab, embd->nb[1],
                                      (group - 1) * vocab * embd->nb[1]);
    return ggml_get_rows(ctx, table, code);
}

ggml_tensor *codes_as_floats(ggml_context *ctx, const std::vector<ggml_tensor *> &codes) {
    ggml_tensor *out = nullptr;
    for (ggml_tensor *code : codes) {
        ggml_tensor *as_float = ggml_cast(ctx, code, GGML_TYPE_F32);
        out = out ? ggml_concat(ctx, out, as_float, 0) : as_float;
    }
    return out;
}

PredictorFrameGraph::PredictorFrameGraph(const TalkerModel &model, KvCache &cache,
                                         ggml_backend_t backend, const SamplingParams &params)
    : backend_(backend), passes_(model, cache, backend, params) {
    mem_.resize(ggml_tensor_overhead() * FRAME_GRAPH_SIZE +
                ggml_graph_overhead_custom(FRAME_GRAPH_SIZE, false));
    ctx_.reset(ggml_init({mem_.size(), mem_.data(), true}));
    ggml_context *ctx = ctx_.get();
    gf_ = ggml_new_graph_custom(ctx, FRAME_GRAPH_SIZE, false);
    rows_ = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, model.hp.talker.hidden_size, 2);
    ggml_set_input(rows_);
    if (!params.greedy) {
        uniforms_ = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, passes_.count());
        ggml_set_input(uniforms_);
    }
    codes_ = codes_as_floats(ctx, passes_.add(ctx, rows_, uniforms_, 0, &logits_));
    for (ggml_tensor *logits : logits_) {
        ggml_set_output(logits);
        ggml_build_forward_expand(gf_, logits);
    }
    ggml_set_output(codes_);
    ggml_build_forward_expand(gf_, codes_);
    if (computes_all(backend_, gf_))
        allocr_ = allocate_graph(backend_, gf_, "out of memory allocating the code predictor's frame graph");
}

void PredictorFrameGraph::predict(const float *rows, Frame &frame, Rng &rng, std::vector<float> *trace) {
    const int64_t passes = passes_.count();
    ggml_backend_tensor_set(rows_, rows, 0, ggml_nbytes(rows_));
    if (uniforms_) {
        std::vector<float> draws(passes);
        for (float &u : draws) u = (float)rng.uniform();
        ggml_backend_tensor_set(uniforms_, draws.data(), 0, ggml_nbytes(uniforms_));
    }
    if (ggml_backend_graph_compute(backend_, gf_) != GGML_STATUS_SUCCESS)
        throw std::runtime_error("code predictor graph computation failed");
    std::vector<float> codes(passes);
    ggml_backend_tensor_get(codes_, codes.data(), 0, ggml_nbytes(codes_));
    for (int64_t p = 0; p < passes; ++p) frame[p + 1] = (int32_t)codes[p];
    if (trace) {
        for (ggml_tensor *logits : logits_) {
            const size_t at = trace->size();
            trace->resize(at + ggml_nelements(logits));
            ggml_backend_tensor_get(logits, trace->data() + at, 0, ggml_nbytes(logits));
        }
    }
}

CodePredictor::CodePredictor(const TalkerModel &model, ggml_backend_t backend,
                             WorkerPool *pool)
    : m_(model),
      backend_(backend),
      cache_(model.hp.predictor, model.hp.num_code_groups, backend),
      prefill_(model.predictor_at.stack, cache_, 2, model.hp.talker.hidden_size,
               model.predictor_at.in_proj_w, model.predictor_at.in_proj_b, nullptr,
               model.predictor_at.heads, backend, model.predictor_at.graph_pool(pool)),
      step_(model.predictor_at.stack, cache_, 1, model.hp.talker.hidden_size,
            model.predictor_at.in_proj_w, model.predictor_at.in_proj_b, nullptr,
            model.predictor_at.heads, backend, model.predictor_at.graph_pool(pool)) {}

void CodePredictor::predict(const float *talker_hidden, Frame &frame, const SamplingParams &params,
                            Rng &rng, std::vector<float> *trace, const Frame *forced) {
    const int64_t d = m_.hp.talker.hidden_size, vocab = m_.hp.predictor.vocab_size;
    const int groups = (int)m_.hp.num_code_groups;
    // Prefill: [talker hidden, codec_embedding(c0)] at positions 0 and 1 -> head 0 -> c1.
    embeds_.assign(talker_hidden, talker_hidden + d);
    embeds_.resize(2 * d, 0.0f);
    add_embedding_row(m_.codec_embd, frame[0], embeds_.data() + d);
    if (!forced && !m_.predictor_at.on_cpu()) {
        if (!frame_graph_tried_) {
            frame_graph_tried_ = true;
            auto graph = std::make_unique<PredictorFrameGraph>(m_, cache_, backend_, params);
            if (graph->supported()) frame_graph_ = std::move(graph);
        }
        if (frame_graph_ && same(frame_graph_->params(), params)) {
            frame_graph_->predict(embeds_.data(), frame, rng, trace);
            ++computations_;
            return;
        }
    }
    prefill_.eval(embeds_.data(), 0, 0);
    const std::vector<float> *logits = &prefill_.logits();
    for (int g = 1; g < groups; ++g) {
        if (g > 1) {
            // Step g: embedding g-2 of c_{g-1} at position g -> head g-1 -> c_g.
            embeds_.assign(d, 0.0f);
            add_embedding_row(m_.cp_embd, (int64_t)(g - 2) * vocab + frame[g - 1], embeds_.data());
            step_.eval(embeds_.data(), g, g - 1);
            logits = &step_.logits();
        }
        if (trace) trace->insert(trace->end(), logits->begin(), logits->end());
        frame[g] = forced ? (*forced)[g] : select_token(logits->data(), vocab, params, rng, scratch_);
    }
    computations_ += groups - 1;
}

}  // namespace kazeia
