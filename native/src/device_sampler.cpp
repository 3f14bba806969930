#include "device_sampler.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "ops.h"

namespace kazeia {

DeviceSampler::DeviceSampler(ggml_backend_t backend, const SamplingParams &params, int64_t vocab)
    : params_(params), vocab_(vocab) {
    if (params_.greedy) return;
    const int64_t n = candidates();
    ctx_.reset(ggml_init({ggml_tensor_overhead() * 4, nullptr, true}));
    last_index_ = ggml_new_tensor_1d(ctx_.get(), GGML_TYPE_I32, 1);
    ramp_ = ggml_new_tensor_1d(ctx_.get(), GGML_TYPE_F32, n);
    triangle_ = ggml_new_tensor_2d(ctx_.get(), GGML_TYPE_F32, n, n);
    if (params_.top_p < 1.0f) last_one_ = ggml_new_tensor_2d(ctx_.get(), GGML_TYPE_F32, n, 1);
    buf_.reset(ggml_backend_alloc_ctx_tensors(ctx_.get(), backend));
    if (!buf_) throw std::runtime_error("out of device memory for a sampler");
    const int32_t last = (int32_t)(n - 1);
    ggml_backend_tensor_set(last_index_, &last, 0, sizeof(last));
    std::vector<float> values(n);
    for (int64_t i = 0; i < n; ++i) values[i] = (float)(n - i);
    ggml_backend_tensor_set(ramp_, values.data(), 0, ggml_nbytes(ramp_));
    values.assign(n * n, 0.0f);  // row m: ones at columns 0..m
    for (int64_t m = 0; m < n; ++m) std::fill_n(values.begin() + m * n, m + 1, 1.0f);
    ggml_backend_tensor_set(triangle_, values.data(), 0, ggml_nbytes(triangle_));
    if (last_one_) {
        values.assign(n, 0.0f);
        values[n - 1] = 1.0f;
        ggml_backend_tensor_set(last_one_, values.data(), 0, ggml_nbytes(last_one_));
    }
}

int64_t DeviceSampler::candidates() const {
    return params_.top_k > 0 && params_.top_k < vocab_ ? params_.top_k : vocab_;
}

// By the inverse CDF in token order (the first token whose prefix sum of probabilities exceeds
// u times their total) over the top-k tokens sorted by id, or over all.
ggml_tensor *DeviceSampler::draw(ggml_context *ctx, ggml_tensor *logits, ggml_tensor *uniform) const {
    if (params_.greedy) return ggml_argmax(ctx, logits);
    const int64_t n = candidates();
    ggml_tensor *x = ggml_scale(ctx, logits, 1.0f / params_.temperature);
    ggml_tensor *ids = nullptr;  // I32 [n]: the candidates, by id; null: all
    if (n < vocab_) {
        ggml_tensor *top = ggml_top_k(ctx, x, (int)n);  // in no particular order
        ggml_tensor *order = ggml_argsort(ctx, ggml_cast(ctx, top, GGML_TYPE_F32), GGML_SORT_ORDER_ASC);
        ids = ggml_reshape_1d(ctx, ggml_get_rows(ctx, ggml_reshape_2d(ctx, top, 1, n), order), n);
        x = ggml_reshape_2d(ctx, ggml_get_rows(ctx, ggml_reshape_2d(ctx, x, 1, vocab_), ids), n, 1);
    }
    ggml_tensor *probs = ggml_soft_max(ctx, x);
    if (last_one_) probs = ggml_mul(ctx, probs, nucleus(ctx, x, probs));
    ggml_tensor *cum = mul_mat_f32(ctx, triangle_, probs);  // [n, 1] prefix sums
    ggml_tensor *total = ggml_get_rows(ctx, ggml_reshape_2d(ctx, cum, 1, n), last_index_);
    ggml_tensor *past = ggml_step(ctx, ggml_sub(ctx, cum, ggml_mul(ctx, total, uniform)));
    ggml_tensor *drawn = ggml_argmax(ctx, ggml_mul(ctx, past, ramp_));  // the first: ramp descends
    if (!ids) return drawn;
    return ggml_reshape_1d(ctx, ggml_get_rows(ctx, ggml_reshape_2d(ctx, ids, 1, n), drawn), 1);
}

// As select_token: in ascending order of x, the candidates whose cumulative probability is at
// most 1 - top_p are dropped, the last (the most probable) never; the mask back in token order
// through the inverse of the sorting permutation (its own argsort).
ggml_tensor *DeviceSampler::nucleus(ggml_context *ctx, ggml_tensor *x, ggml_tensor *probs) const {
    const int64_t n = x->ne[0];
    ggml_tensor *order = ggml_reshape_1d(ctx, ggml_argsort(ctx, x, GGML_SORT_ORDER_ASC), n);
    ggml_tensor *sorted = ggml_get_rows(ctx, ggml_reshape_2d(ctx, probs, 1, n), order);  // [1, n]
    ggml_tensor *cum = mul_mat_f32(ctx, triangle_, ggml_reshape_2d(ctx, sorted, n, 1));
    ggml_tensor *keep = ggml_step(ctx, ggml_scale_bias(ctx, cum, 1.0f, -(1.0f - params_.top_p)));
    keep = ggml_clamp(ctx, ggml_add(ctx, keep, last_one_), 0.0f, 1.0f);
    ggml_tensor *inverse = ggml_argsort(ctx, ggml_cast(ctx, order, GGML_TYPE_F32), GGML_SORT_ORDER_ASC);
    keep = ggml_get_rows(ctx, ggml_reshape_2d(ctx, keep, 1, n), ggml_reshape_1d(ctx, inverse, n));
    return ggml_reshape_2d(ctx, keep, n, 1);
}

// x * a / b with a = p where seen and x < 0, b = p where seen and x > 0, else exactly 1: each
// a product or sum of 0s, 1s and p, so exact, as are x * 1 and x / 1.
ggml_tensor *penalize_repeats(ggml_context *ctx, ggml_tensor *logits, ggml_tensor *seen, float penalty) {
    if (penalty == 1.0f) return logits;
    auto factor = [&](ggml_tensor *where) {  // p where `where` is 1, else 1
        return ggml_add(ctx, ggml_scale(ctx, where, penalty), ggml_scale_bias(ctx, where, -1.0f, 1.0f));
    };
    ggml_tensor *below = ggml_mul(ctx, seen, ggml_step(ctx, ggml_neg(ctx, logits)));
    ggml_tensor *above = ggml_mul(ctx, seen, ggml_step(ctx, logits));
    return ggml_div(ctx, ggml_mul(ctx, logits, factor(below)), factor(above));
}

}  // namespace kazeia
