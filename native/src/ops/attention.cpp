// The attention op (the decoder's windowed attention, the talker's over its f32 or f16 cache)
// and the decoder's concatenation along time, as single custom ops: the portable dot products
// and f16 widening, and the ggml ops; the vector paths are in ops/x86/ and ops/arm/, the
// attention's row (shared by all) in ops/shared.h.
#include "ops.h"

#include <cstdint>
#include <cstring>

#include "ops/arch.h"
#include "ops/isa.h"
#include "ops/shared.h"

namespace kazeia {

namespace {

void concat_time_kernel(ggml_tensor *dst, int ith, int /*nth*/, void * /*userdata*/) {
    if (ith != 0) return;
    const ggml_tensor *a = dst->src[0], *b = dst->src[1];
    std::memcpy(dst->data, a->data, ggml_nbytes(a));
    std::memcpy(static_cast<char *>(dst->data) + ggml_nbytes(a), b->data, ggml_nbytes(b));
}

// f16 -> f32, exact, inline: ggml's conversion is a call per value, and a CPU without F16C
// widens every key and value of a long answer at each step.
float half_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f;
    uint32_t mantissa = h & 0x3ff, bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000 | mantissa << 13;  // inf, nan
    } else if (exponent != 0) {
        bits = sign | (exponent + 112) << 23 | mantissa << 13;
    } else if (mantissa == 0) {
        bits = sign;
    } else {  // a subnormal half is a normal float
        uint32_t shift = 0;
        while (!(mantissa & 0x400)) mantissa <<= 1, ++shift;
        bits = sign | (113 - shift) << 23 | (mantissa & 0x3ff) << 13;
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

void widen(const uint16_t *in, float *out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = half_to_float(in[i]);
}

// The two queries q[0..n) and q[n..2n) against one f16 row, each summed in order.
void dot_pair(const float *q, const uint16_t *k, int64_t n, float *out) {
    out[0] = out[1] = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        const float kf = half_to_float(k[i]);
        out[0] += q[i] * kf;
        out[1] += q[n + i] * kf;
    }
}

// A dot product, summed in order.
float dot(const float *a, const float *b, int64_t n) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

void window_attention_kernel(ggml_tensor *dst, int ith, int nth, void *userdata) {
    const auto *p = static_cast<const AttentionParams *>(userdata);
    const ggml_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2], *mask = dst->src[3];
    const int64_t nh = q->ne[1], n = q->ne[2];
    const int64_t esize = (int64_t)ggml_type_size(k->type);
    const int64_t row_stride = k->nb[1] / esize, head_stride = k->nb[2] / esize;
    const AttentionRow row{static_cast<const float *>(q->data), k->data, v->data,
                           static_cast<const float *>(mask->data), static_cast<float *>(dst->data),
                           q->ne[0], nh, k->ne[1], row_stride, head_stride, nh / p->n_kv_heads,
                           p->scale, esize};
    const int64_t n_tasks = n * p->n_kv_heads;
#if KAZEIA_AVX2
    if (use_avx2())
        return run_tasks(p->pool, ith, nth, n_tasks, [&](int64_t t) { x86::attention_row_avx2(row, t); });
#elif KAZEIA_NEON
    return run_tasks(p->pool, ith, nth, n_tasks, [&](int64_t t) { arm::attention_row_neon(row, t); });
#endif
    run_tasks(p->pool, ith, nth, n_tasks, [&](int64_t t) { attention_row<dot, widen, dot_pair>(row, t); });
}

}  // namespace

ggml_tensor *concat_time(ggml_context *ctx, ggml_tensor *a, ggml_tensor *b) {
    GGML_ASSERT(a->type == GGML_TYPE_F32 && b->type == GGML_TYPE_F32);
    GGML_ASSERT(ggml_is_contiguous(a) && ggml_is_contiguous(b) && a->ne[0] == b->ne[0]);
    GGML_ASSERT(a->ne[2] == 1 && b->ne[2] == 1 && a->ne[3] == 1 && b->ne[3] == 1);
    ggml_tensor *args[2] = {a, b};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, a->ne[0], a->ne[1] + b->ne[1], 1, 1, args, 2,
                          concat_time_kernel, 1, nullptr);
}

ggml_tensor *window_attention(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k, ggml_tensor *v,
                              ggml_tensor *mask, const AttentionParams *params) {
    const int64_t hd = q->ne[0], nh = q->ne[1], n = q->ne[2], n_kv = k->ne[1];
    GGML_ASSERT(q->type == GGML_TYPE_F32 && (k->type == GGML_TYPE_F32 || k->type == GGML_TYPE_F16));
    GGML_ASSERT(v->type == k->type);
    GGML_ASSERT(ggml_is_contiguous(q) && ggml_is_contiguous_rows(k) && ggml_is_contiguous_rows(v));
    GGML_ASSERT(params->n_kv_heads >= 1 && nh % params->n_kv_heads == 0);
    GGML_ASSERT(k->ne[0] == hd && k->ne[2] == params->n_kv_heads && k->ne[3] == 1);
    GGML_ASSERT(ggml_are_same_shape(k, v) && k->nb[1] == v->nb[1] && k->nb[2] == v->nb[2]);
    GGML_ASSERT(mask->type == GGML_TYPE_F32 && ggml_is_contiguous(mask));
    GGML_ASSERT(mask->ne[0] == n_kv && mask->ne[1] == n);
    ggml_tensor *args[4] = {q, k, v, mask};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, hd * nh, n, 1, 1, args, 4, window_attention_kernel,
                          GGML_N_TASKS_MAX, const_cast<AttentionParams *>(params));
}

ggml_tensor *kv_heads(ggml_context *ctx, ggml_tensor *rows, int64_t hd) {
    GGML_ASSERT(rows->ne[0] % hd == 0 && rows->ne[2] == 1 && rows->ne[3] == 1);
    return ggml_view_3d(ctx, rows, hd, rows->ne[1], rows->ne[0] / hd, rows->nb[1],
                        hd * ggml_element_size(rows), 0);
}
}  // namespace kazeia
