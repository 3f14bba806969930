// The same operators in ggml's own ops, for model parts placed on a GPU backend.
#include "ops.h"

#include <cstdint>

namespace kazeia {


ggml_tensor *mul_mat_f32(ggml_context *ctx, ggml_tensor *a, ggml_tensor *b) {
    GGML_ASSERT(!has_q8_panels(a));  // ggml would read its panels as rows
    ggml_tensor *y = ggml_mul_mat(ctx, a, b);
    ggml_mul_mat_set_prec(y, GGML_PREC_F32);
    return y;
}

ggml_tensor *attention_in_ggml_ops(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k, ggml_tensor *v,
                                   ggml_tensor *mask, int64_t n_kv_heads, float scale) {
    const int64_t hd = q->ne[0], nh = q->ne[1], n = q->ne[2];
    GGML_ASSERT(k->ne[0] == hd && k->ne[2] == n_kv_heads && ggml_are_same_shape(k, v));
    // Dense f32 operands: ggml's Vulkan backend copies a strided one to f16 before the product,
    // and an f16 cache's would have the query and weights rounded to f16 too (its products
    // take the type of their first operand), where the CPU op widens only the cache's values.
    auto dense_f32 = [&](ggml_tensor *t) {
        return t->type == GGML_TYPE_F32 ? ggml_cont(ctx, t) : ggml_cast(ctx, t, GGML_TYPE_F32);
    };
    ggml_tensor *kh = dense_f32(k);                                      // [hd, n_kv, nkv]
    ggml_tensor *qh = ggml_cont(ctx, ggml_permute(ctx, q, 0, 2, 1, 3));  // [hd, n, nh]
    // [n_kv, n, nh]; query head h reads kv head h / (nh / nkv), as ggml_mul_mat broadcasts.
    ggml_tensor *w = ggml_soft_max_ext(ctx, mul_mat_f32(ctx, kh, qh), mask, scale, 0.0f);
    ggml_tensor *vt = dense_f32(ggml_permute(ctx, v, 1, 0, 2, 3));  // [n_kv, hd, nkv]
    ggml_tensor *o = ggml_permute(ctx, mul_mat_f32(ctx, vt, w), 0, 2, 1, 3);  // [hd, nh, n]
    return ggml_reshape_2d(ctx, ggml_cont(ctx, o), hd * nh, n);
}

ggml_tensor *strided_view(ggml_context *ctx, ggml_tensor *full, const int64_t (&ne)[4],
                          const size_t (&nb)[4]) {
    GGML_ASSERT(ggml_is_contiguous(full) && full->type == GGML_TYPE_F32);
    ggml_tensor *v = ggml_view_1d(ctx, full, 1, 0);
    for (int d = 0; d < 4; ++d) v->ne[d] = ne[d];
    for (int d = 1; d < 4; ++d) v->nb[d] = nb[d];
    GGML_ASSERT(ggml_nbytes(v) <= ggml_nbytes(full));
    return v;
}

ggml_tensor *window_attention_in_ggml_ops(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k,
                                          ggml_tensor *v, ggml_tensor *mask, int64_t n_kv_heads,
                                          float scale) {
    const int64_t hd = q->ne[0], nh = q->ne[1], n = q->ne[2], nkv = n_kv_heads;
    const int64_t window = k->ne[1] - n + 1;
    // [hd, window, nkv, n]: query i's keys (or values) per kv head, overlapping views made
    // dense (ggml's Vulkan backend copies a strided operand to f16 before its product).
    auto windows = [&](ggml_tensor *t) {
        const size_t row = t->nb[1];
        return ggml_cont(ctx, strided_view(ctx, t, {hd, window, nkv, n},
                                           {sizeof(float), row, hd * sizeof(float), row}));
    };
    // Query head h = g + (nh / nkv) * j reads kv head j, as the CPU kernel and HF's repeat_kv.
    ggml_tensor *qg = ggml_reshape_4d(ctx, q, hd, nh / nkv, nkv, n);
    ggml_tensor *w = ggml_soft_max_ext(ctx, mul_mat_f32(ctx, windows(k), qg), mask, scale, 0.0f);
    ggml_tensor *vt = ggml_cont(ctx, ggml_permute(ctx, windows(v), 1, 0, 2, 3));  // [window, hd, ..]
    return ggml_reshape_2d(ctx, mul_mat_f32(ctx, vt, w), hd * nh, n);  // [hd, nh / nkv, nkv, n]
}

ggml_tensor *snake_beta_in_ggml_ops(ggml_context *ctx, ggml_tensor *x, ggml_tensor *alpha,
                                    ggml_tensor *inv_beta) {
    // sin^2 has period pi: reduced to [-pi/2, pi/2] first, as the CPU kernel does, because a
    // GPU's sin is accurate only near zero (Vulkan leaves it unspecified beyond [-pi, pi]; the
    // decoder's arguments reach the hundreds).
    constexpr float PI = 3.14159265358979f;
    ggml_tensor *t = ggml_mul(ctx, x, alpha);
    ggml_tensor *turns = ggml_round(ctx, ggml_scale(ctx, t, 1.0f / PI));
    ggml_tensor *r = ggml_sub(ctx, t, ggml_scale(ctx, turns, PI));
    ggml_tensor *s = ggml_sqr(ctx, ggml_sin(ctx, r));
    return ggml_add(ctx, x, ggml_mul(ctx, s, inv_beta));
}

}  // namespace kazeia

