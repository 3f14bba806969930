#include "code_predictor.h"

#include <algorithm>

namespace kazeia {

CodePredictor::CodePredictor(const TalkerModel &model, ggml_backend_t backend,
                             WorkerPool *pool)
    : m_(model),
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
}

}  // namespace kazeia
