#include "code_predictor.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace kazeia {

namespace {
constexpr int FRAME_GRAPH_SIZE = 8192;  // 15 passes of the stack, and their sampling

bool same(const SamplingParams &a, const SamplingParams &b) {
    return a.greedy == b.greedy && a.temperature == b.temperature && a.top_k == b.top_k &&
           a.top_p == b.top_p;
}
}  // namespace

PredictorFrameGraph::PredictorFrameGraph(const TalkerModel &model, KvCache &cache,
                                         ggml_backend_t backend, const SamplingParams &params)
    : backend_(backend),
      params_(params),
      passes_(model.hp.num_code_groups - 1),
      vocab_(model.hp.predictor.vocab_size) {
    const StackPlacement &at = model.predictor_at;
    const LmHParams &hp = at.stack.hp;
    const int64_t in_dim = model.hp.talker.hidden_size;

    // Pass p writes slots 0, 1 (p = 0) or p + 1 and attends over slots 0 .. p + 1.
    auto pass_rows = [](int64_t p) { return p == 0 ? 2 : 1; };
    const_ctx_.reset(ggml_init({ggml_tensor_overhead() * (3 * passes_ + 4), nullptr, true}));
    ggml_context *cctx = const_ctx_.get();
    for (int64_t p = 0; p < passes_; ++p) {
        positions_.push_back(ggml_new_tensor_1d(cctx, GGML_TYPE_I32, pass_rows(p)));
        slots_.push_back(ggml_new_tensor_1d(cctx, GGML_TYPE_I64, pass_rows(p)));
        head_ids_.push_back(ggml_new_tensor_1d(cctx, GGML_TYPE_I32, 1));
    }
    prefill_mask_ = ggml_new_tensor_2d(cctx, GGML_TYPE_F32, 2, 2);
    const int64_t n = candidates();
    if (!params_.greedy) {
        last_index_ = ggml_new_tensor_1d(cctx, GGML_TYPE_I32, 1);
        ramp_ = ggml_new_tensor_1d(cctx, GGML_TYPE_F32, n);
        triangle_ = ggml_new_tensor_2d(cctx, GGML_TYPE_F32, n, n);
    }
    const_buf_.reset(ggml_backend_alloc_ctx_tensors(cctx, backend));
    if (!const_buf_) throw std::runtime_error("out of device memory for the code predictor's frame graph");
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
    if (!params_.greedy) {
        const int32_t last = (int32_t)(n - 1);
        ggml_backend_tensor_set(last_index_, &last, 0, sizeof(last));
        std::vector<float> values(n);
        for (int64_t i = 0; i < n; ++i) values[i] = (float)(n - i);
        ggml_backend_tensor_set(ramp_, values.data(), 0, ggml_nbytes(ramp_));
        values.assign(n * n, 0.0f);  // row m: ones at columns 0..m
        for (int64_t m = 0; m < n; ++m) std::fill_n(values.begin() + m * n, m + 1, 1.0f);
        ggml_backend_tensor_set(triangle_, values.data(), 0, ggml_nbytes(triangle_));
    }

    mem_.resize(ggml_tensor_overhead() * FRAME_GRAPH_SIZE +
                ggml_graph_overhead_custom(FRAME_GRAPH_SIZE, false));
    ctx_.reset(ggml_init({mem_.size(), mem_.data(), true}));
    ggml_context *ctx = ctx_.get();
    gf_ = ggml_new_graph_custom(ctx, FRAME_GRAPH_SIZE, false);
    rows_ = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, in_dim, 2);
    ggml_set_input(rows_);
    if (!params_.greedy) {
        uniforms_ = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, passes_);
        ggml_set_input(uniforms_);
    }
    attention_ = AttentionParams{hp.num_kv_heads, 1.0f / std::sqrt((float)hp.head_dim), nullptr};
    std::vector<ggml_tensor *> k_cache = cache.k, v_cache = cache.v;
    ggml_tensor *x = rows_, *code = nullptr;
    for (int64_t p = 0; p < passes_; ++p) {
        if (p > 0) {  // embedding table p - 1 of the code pass p - 1 drew
            ggml_tensor *table = ggml_view_2d(ctx, at.embd, in_dim, vocab_, at.embd->nb[1],
                                              (p - 1) * vocab_ * at.embd->nb[1]);
            x = ggml_get_rows(ctx, table, code);
        }
        ggml_tensor *h = stack_input(ctx, x, at.in_proj_w, at.in_proj_b, nullptr);
        const StackPass pass{positions_[p], slots_[p], p == 0 ? prefill_mask_ : nullptr, p + 2};
        h = stack_forward(ctx, at.stack, h, pass, k_cache, v_cache, &attention_, nullptr);
        ggml_tensor *logits = head_logits(ctx, at.heads, h, head_ids_[p], nullptr);
        ggml_set_output(logits);
        ggml_build_forward_expand(gf_, logits);
        logits_.push_back(logits);
        code = sample(logits, (int)p);
        // Codes come back as floats (exact below 2^24): one download, and every backend
        // concatenates f32.
        ggml_tensor *as_float = ggml_cast(ctx, code, GGML_TYPE_F32);
        codes_ = codes_ ? ggml_concat(ctx, codes_, as_float, 0) : as_float;
    }
    ggml_set_output(codes_);
    ggml_build_forward_expand(gf_, codes_);

    for (int i = 0; i < ggml_graph_n_nodes(gf_); ++i)
        if (!ggml_backend_supports_op(backend_, ggml_graph_node(gf_, i))) return;
    allocr_.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_)));
    if (!ggml_gallocr_alloc_graph(allocr_.get(), gf_))
        throw std::runtime_error("out of memory allocating the code predictor's frame graph");
    supported_ = true;
}

int64_t PredictorFrameGraph::candidates() const {
    return params_.top_k > 0 && params_.top_k < vocab_ ? params_.top_k : vocab_;
}

// The code drawn from logits [vocab, 1] as an I32 [1], the way select_token draws it: by the
// inverse CDF in code order (the first code whose prefix sum of probabilities exceeds u times
// their total) over the top-k codes sorted by code, or over all.
ggml_tensor *PredictorFrameGraph::sample(ggml_tensor *logits, int pass) {
    ggml_context *ctx = ctx_.get();
    if (params_.greedy) return ggml_argmax(ctx, logits);
    const int64_t n = candidates();
    ggml_tensor *x = ggml_scale(ctx, logits, 1.0f / params_.temperature);
    ggml_tensor *codes = nullptr;  // I32 [n]: the candidates, by code; null: all
    if (n < vocab_) {
        ggml_tensor *top = ggml_top_k(ctx, x, (int)n);  // in no particular order
        ggml_tensor *order = ggml_argsort(ctx, ggml_cast(ctx, top, GGML_TYPE_F32), GGML_SORT_ORDER_ASC);
        codes = ggml_reshape_1d(ctx, ggml_get_rows(ctx, ggml_reshape_2d(ctx, top, 1, n), order), n);
        x = ggml_reshape_2d(ctx, ggml_get_rows(ctx, ggml_reshape_2d(ctx, x, 1, vocab_), codes), n, 1);
    }
    ggml_tensor *cum = mul_mat_f32(ctx, triangle_, ggml_soft_max(ctx, x));  // [n, 1] prefix sums
    ggml_tensor *total = ggml_get_rows(ctx, ggml_reshape_2d(ctx, cum, 1, n), last_index_);
    ggml_tensor *u = ggml_get_rows(ctx, uniforms_, head_ids_[pass]);  // draw `pass`, [1, 1]
    ggml_tensor *past = ggml_step(ctx, ggml_sub(ctx, cum, ggml_mul(ctx, total, u)));
    ggml_tensor *drawn = ggml_argmax(ctx, ggml_mul(ctx, past, ramp_));  // the first: ramp descends
    if (!codes) return drawn;
    return ggml_reshape_1d(ctx, ggml_get_rows(ctx, ggml_reshape_2d(ctx, codes, 1, n), drawn), 1);
}

void PredictorFrameGraph::predict(const float *rows, Frame &frame, Rng &rng, std::vector<float> *trace) {
    ggml_backend_tensor_set(rows_, rows, 0, ggml_nbytes(rows_));
    if (uniforms_) {
        std::vector<float> draws(passes_);
        for (float &u : draws) u = (float)rng.uniform();
        ggml_backend_tensor_set(uniforms_, draws.data(), 0, ggml_nbytes(uniforms_));
    }
    if (ggml_backend_graph_compute(backend_, gf_) != GGML_STATUS_SUCCESS)
        throw std::runtime_error("code predictor graph computation failed");
    std::vector<float> codes(passes_);
    ggml_backend_tensor_get(codes_, codes.data(), 0, ggml_nbytes(codes_));
    for (int64_t p = 0; p < passes_; ++p) frame[p + 1] = (int32_t)codes[p];
    if (trace) {
        for (ggml_tensor *logits : logits_) {
            const size_t at = trace->size();
            trace->resize(at + vocab_);
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
    if (!forced && params.top_p >= 1.0f && !m_.predictor_at.on_cpu()) {
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
