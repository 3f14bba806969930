// SnakeBeta, the speech decoder's activation: y = x + inv_beta * sin(alpha * x)^2. The portable
// loops and the ggml op; the vector paths are in ops/x86/ and ops/arm/.
#include "ops.h"

#include <algorithm>
#include <cstdint>

#include "ops/arch.h"
#include "ops/isa.h"
#include "ops/shared.h"

namespace kazeia {

namespace {

// One column, all of its channels.
void snake_column(const float *in, float *out, const float *a, const float *ib, int64_t channels) {
#if KAZEIA_AVX2
    if (use_avx2()) return x86::snake_column_avx2(in, out, a, ib, channels);
#elif KAZEIA_NEON
    return arm::snake_column_neon(in, out, a, ib, channels);
#endif
    for (int64_t c = 0; c < channels; ++c) out[c] = in[c] + ib[c] * sin2(a[c] * in[c]);
}

// Columns [begin, end) of y = x + inv_beta * sin(alpha * x)^2.
void snake_columns(ggml_tensor *dst, const ggml_tensor *x, const float *a, const float *ib,
                   int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
        const auto *in = reinterpret_cast<const float *>(static_cast<const char *>(x->data) +
                                                         t * x->nb[1]);
        auto *out = reinterpret_cast<float *>(static_cast<char *>(dst->data) + t * dst->nb[1]);
        snake_column(in, out, a, ib, x->ne[0]);
    }
}

constexpr int64_t SNAKE_TASK_FLOATS = 32 * 1024;  // ~128 KB of activations per task

void snake_kernel(ggml_tensor *dst, const ggml_tensor *x, const ggml_tensor *alpha,
                  const ggml_tensor *inv_beta, int ith, int nth, void *userdata) {
    const int64_t columns = ggml_nrows(x);
    const auto *a = static_cast<const float *>(alpha->data);
    const auto *ib = static_cast<const float *>(inv_beta->data);
    const int64_t per_task = std::max<int64_t>(1, SNAKE_TASK_FLOATS / x->ne[0]);
    const int64_t n_tasks = (columns + per_task - 1) / per_task;
    auto task = [&](int64_t i) {
        snake_columns(dst, x, a, ib, i * per_task, std::min(columns, (i + 1) * per_task));
    };
    run_tasks(static_cast<WorkerPool *>(userdata), ith, nth, n_tasks, task);
}

}  // namespace

void sin_squared(const float *x, float *y, int64_t n) {
#if KAZEIA_AVX2
    if (use_avx2()) return x86::sin_squared_avx2(x, y, n);
#elif KAZEIA_NEON
    return arm::sin_squared_neon(x, y, n);
#endif
    for (int64_t i = 0; i < n; ++i) y[i] = sin2(x[i]);
}

ggml_tensor *snake_beta(ggml_context *ctx, ggml_tensor *x, ggml_tensor *alpha,
                        ggml_tensor *inv_beta, WorkerPool *pool) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && ggml_is_contiguous(x));
    GGML_ASSERT(alpha->ne[0] == x->ne[0] && inv_beta->ne[0] == x->ne[0]);
    return ggml_map_custom3(ctx, x, alpha, inv_beta, snake_kernel, GGML_N_TASKS_MAX, pool);
}

}  // namespace kazeia
