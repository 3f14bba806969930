// The decoder's windowed attention and its concatenation along time, as single custom ops.
#include "ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "ops/isa.h"

namespace kazeia {


namespace {

void concat_time_kernel(ggml_tensor *dst, int ith, int /*nth*/, void * /*userdata*/) {
    if (ith != 0) return;
    const ggml_tensor *a = dst->src[0], *b = dst->src[1];
    std::memcpy(dst->data, a->data, ggml_nbytes(a));
    std::memcpy(static_cast<char *>(dst->data) + ggml_nbytes(a), b->data, ggml_nbytes(b));
}

#if KAZEIA_AVX2
// A dot product: groups of 8, then the tail (fused multiply-adds).
KAZEIA_AVX2_FN float dot_avx2(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    const __m128 half = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 quad = _mm_add_ps(half, _mm_movehl_ps(half, half));
    float sum = _mm_cvtss_f32(_mm_add_ss(quad, _mm_movehdup_ps(quad)));
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}
#endif

inline float dot(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    float sum = 0.0f;
#if KAZEIA_AVX2
    if (use_avx2()) return dot_avx2(a, b, n);
#elif KAZEIA_NEON
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (; i + 4 <= n; i += 4) acc = vfmaq_f32(acc, vld1q_f32(a + i), vld1q_f32(b + i));
    sum = vaddvq_f32(acc);
#endif
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

// What one (query, head) task of the attention op reads and writes.
struct AttentionRow {
    const float *qd, *kd, *vd, *md;
    float *od;
    int64_t hd, nh, n_kv, kv_dim, group;
    float scale;
};

// A head's key or value rows lie one cache row apart (all heads of a position are together),
// e.g. 4 KB for the talker: every row starts a new page, where the hardware prefetchers stop,
// so the rows a few positions ahead are asked for here (else a long synthesis's talker waits
// on its cache far longer than its bytes take to read).
constexpr int64_t ATTENTION_PREFETCH = 16;  // positions ahead
// Asks for the `n` floats of `rows`' row c + ATTENTION_PREFETCH (rows `stride` apart), if any.
inline void prefetch_ahead(const float *rows, int64_t c, int64_t n_rows, int64_t stride, int64_t n) {
    if (c + ATTENTION_PREFETCH >= n_rows) return;
    const float *row = rows + (c + ATTENTION_PREFETCH) * stride;
    for (int64_t d = 0; d < n; d += 16) __builtin_prefetch(row + d);  // 64-byte lines
}

// One (query, key/value head): scores, softmax, then the weighted sum of the value rows, for
// the `group` query heads that share that key/value head together, so that each key and value
// row is read once for all of them (a long synthesis's talker attention is bound by reading its
// cache). Each head's sums run in the same order as one head alone would. Always inlined, so
// that attention_row_avx2 compiles it for AVX2/FMA.
__attribute__((always_inline)) inline void attention_row(const AttentionRow &a, int64_t t) {
    const int64_t n_groups = a.nh / a.group, i = t / n_groups, g = t % n_groups;
    const float *row_mask = a.md + i * a.n_kv;
    thread_local std::vector<float> scores, max_score, total;  // scores: [group][n_kv]
    scores.resize(a.group * a.n_kv);
    max_score.assign(a.group, -INFINITY);
    total.assign(a.group, 0.0f);
    const float *q0 = a.qd + (i * a.nh + g * a.group) * a.hd;
    for (int64_t c = 0; c < a.n_kv; ++c) {
        const float *kv = a.kd + c * a.kv_dim + g * a.hd;
        prefetch_ahead(a.kd + g * a.hd, c, a.n_kv, a.kv_dim, a.hd);
        for (int64_t h = 0; h < a.group; ++h) {
            const float s = row_mask[c] == -INFINITY
                                ? -INFINITY
                                : dot(q0 + h * a.hd, kv, a.hd) * a.scale + row_mask[c];
            scores[h * a.n_kv + c] = s;
            max_score[h] = std::max(max_score[h], s);
        }
    }
    float *o0 = a.od + (i * a.nh + g * a.group) * a.hd;
    std::fill(o0, o0 + a.group * a.hd, 0.0f);
    for (int64_t c = 0; c < a.n_kv; ++c) {
        const float *vv = a.vd + c * a.kv_dim + g * a.hd;
        prefetch_ahead(a.vd + g * a.hd, c, a.n_kv, a.kv_dim, a.hd);
        for (int64_t h = 0; h < a.group; ++h) {
            const float s = scores[h * a.n_kv + c];
            if (s == -INFINITY) continue;
            const float w = std::exp(s - max_score[h]);
            total[h] += w;
            float *o = o0 + h * a.hd;
            for (int64_t d = 0; d < a.hd; ++d) o[d] += w * vv[d];
        }
    }
    for (int64_t h = 0; h < a.group; ++h) {
        const float inv = 1.0f / total[h];
        for (int64_t d = 0; d < a.hd; ++d) o0[h * a.hd + d] *= inv;
    }
}

#if KAZEIA_AVX2
KAZEIA_AVX2_FN void attention_row_avx2(const AttentionRow &a, int64_t t) { attention_row(a, t); }
#endif

void window_attention_kernel(ggml_tensor *dst, int ith, int nth, void *userdata) {
    const auto *p = static_cast<const AttentionParams *>(userdata);
    const ggml_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2], *mask = dst->src[3];
    const int64_t nh = q->ne[1], n = q->ne[2];
    const AttentionRow row{static_cast<const float *>(q->data), static_cast<const float *>(k->data),
                           static_cast<const float *>(v->data),
                           static_cast<const float *>(mask->data), static_cast<float *>(dst->data),
                           q->ne[0], nh, k->ne[1], k->ne[0], nh / p->n_kv_heads, p->scale};
#if KAZEIA_AVX2
    if (use_avx2()) {
        run_tasks(p->pool, ith, nth, n * p->n_kv_heads, [&](int64_t t) { attention_row_avx2(row, t); });
        return;
    }
#endif
    run_tasks(p->pool, ith, nth, n * p->n_kv_heads, [&](int64_t t) { attention_row(row, t); });
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
    GGML_ASSERT(q->type == GGML_TYPE_F32 && k->type == GGML_TYPE_F32 && v->type == GGML_TYPE_F32);
    GGML_ASSERT(ggml_is_contiguous(q) && ggml_is_contiguous(k) && ggml_is_contiguous(v));
    GGML_ASSERT(params->n_kv_heads >= 1 && nh % params->n_kv_heads == 0);
    GGML_ASSERT(k->ne[0] == hd * params->n_kv_heads && ggml_are_same_shape(k, v));
    GGML_ASSERT(mask->type == GGML_TYPE_F32 && ggml_is_contiguous(mask));
    GGML_ASSERT(mask->ne[0] == n_kv && mask->ne[1] == n);
    ggml_tensor *args[4] = {q, k, v, mask};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, hd * nh, n, 1, 1, args, 4, window_attention_kernel,
                          GGML_N_TASKS_MAX, const_cast<AttentionParams *>(params));
}
}  // namespace kazeia
