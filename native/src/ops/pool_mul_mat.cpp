// Matrix products of any ggml weight type on a WorkerPool (ggml's dot kernels, q8_gemm).
#include "ops.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cpu_backend.h"
#include "env_switch.h"
#include "ops/arch.h"
#include "ggml-cpu.h"
#include "q8_gemm.h"

namespace kazeia {


namespace {

constexpr int64_t MUL_MAT_MIN_TASK_ROWS = 64;
constexpr int64_t MUL_MAT_TASKS_PER_THREAD = 2;

constexpr WeightReads PREFETCHED_STREAMS{4, true, "4 prefetched streams"};
constexpr WeightReads ONE_STREAM{1, false, "one stream"};

// What a tensor kept as panels points to from ggml_tensor::extra.
constexpr char Q8_PANELS_TAG[] = "kazeia q8_0 panels";

void pool_mul_mat_kernel(ggml_tensor *dst, int ith, int /*nth*/, void *userdata) {
    if (ith != 0) return;
    auto *pool = static_cast<WorkerPool *>(userdata);
    const ggml_tensor *w = dst->src[0], *x = dst->src[1], *ids = dst->src[2];
    const int64_t K = w->ne[0], M = w->ne[1], n = x->ne[1];
    const char *wd = static_cast<const char *>(w->data);
    if (ids) wd += (size_t)*static_cast<const int32_t *>(ids->data) * w->nb[2];
    const ggml_type_traits_cpu *traits = cpu_backend().type_traits(w->type);
    const ggml_type dot_type = traits->vec_dot_type;

    // Activations in the weight's dot type (q8_0 for q8_0, q8_K for q4_k, ...), once.
    thread_local std::vector<uint8_t> converted;
    const size_t row_size = ggml_row_size(dot_type, K);
    const char *xd;
    if (dot_type == GGML_TYPE_F32 && x->nb[1] == K * sizeof(float)) {
        xd = static_cast<const char *>(x->data);
    } else {
        converted.resize(row_size * n);
        const ggml_from_float_t from_float = cpu_backend().type_traits(dot_type)->from_float;
        for (int64_t j = 0; j < n; ++j) {
            const float *col = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + j * x->nb[1]);
            if (dot_type == GGML_TYPE_F32) std::memcpy(converted.data() + j * row_size, col, K * sizeof(float));
            else from_float(col, converted.data() + j * row_size, K);
        }
        xd = reinterpret_cast<const char *>(converted.data());
    }
    if (has_q8_panels(w)) {
        GGML_ASSERT(!ids);
        return q8_gemm_packed(wd, M, K, xd, n, static_cast<float *>(dst->data), pool);
    }
    mul_mat_converted(wd, w->nb[1], w->type, M, K, xd, row_size, n, static_cast<float *>(dst->data),
                      pool, w->type == GGML_TYPE_Q8_0 && q8_gemm_pays(n));
}

using Q8DotRows = void (*)(const Q8Block *const[Q8_DOT_ROWS], const Q8Block *const[Q8_DOT_ROWS],
                           const Q8Block *, int64_t, float[Q8_DOT_ROWS]);

// This CPU's path of the q8_0 dot product over Q8_DOT_ROWS rows (nullptr: ggml's, row by row;
// q8_dot_isa).
Q8DotRows q8_dot_rows() {
    static const Q8DotRows path = []() -> Q8DotRows {
#if KAZEIA_AVX2
        if (!use_avx2()) return nullptr;
        return avx512_vnni_on_cpu() ? x86::q8_dot_rows_vnni : x86::q8_dot_rows_avx2;
#else
        return nullptr;
#endif
    }();
    return path;
}

}  // namespace

const char *q8_dot_isa() {
#if KAZEIA_AVX2
    if (q8_dot_rows() == x86::q8_dot_rows_vnni) return "AVX-512 VNNI";
    if (q8_dot_rows() == x86::q8_dot_rows_avx2) return "AVX2";
#endif
    return "ggml";
}

const WeightReads &weight_reads() {
    static const WeightReads reads = [] {
        if (env_is("KAZEIA_WEIGHT_READS", "streams")) return PREFETCHED_STREAMS;
        if (env_is("KAZEIA_WEIGHT_READS", "sequential")) return ONE_STREAM;
        return amd_cpu() ? ONE_STREAM : PREFETCHED_STREAMS;
    }();
    return reads;
}

void mul_mat_converted(const char *w, size_t w_row, ggml_type type, int64_t M, int64_t K,
                       const char *x, size_t x_row, int64_t n, float *y, WorkerPool *pool, bool gemm) {
    int64_t m_first = 0;  // rows below it are done
    if (gemm) {
        GGML_ASSERT(type == GGML_TYPE_Q8_0);
        q8_gemm(w, (int64_t)w_row, M, K, x, n, y, pool);
        m_first = M - M % Q8_GEMM_ROWS;
    }
    const int64_t rows = M - m_first;
    if (rows == 0) return;
    const ggml_type_traits_cpu *traits = cpu_backend().type_traits(type);
    // Row m of every column by ggml's dot product.
    auto dot_row = [&](int64_t m) {
        for (int64_t j = 0; j < n; ++j)
            traits->vec_dot((int)K, y + j * M + m, 0, w + m * w_row, 0, x + j * x_row, 0, 1);
    };
    const Q8DotRows dot_rows = type == GGML_TYPE_Q8_0 ? q8_dot_rows() : nullptr;
    // Few long tasks: each reads its rows as one or a few long sequential streams, which the
    // hardware prefetchers serve far better than many short ones (every task starts its streams
    // cold). Two tasks per thread still let a preempted thread's share be taken over.
    const int64_t n_tasks = std::max<int64_t>(
        1, std::min<int64_t>((rows + MUL_MAT_MIN_TASK_ROWS - 1) / MUL_MAT_MIN_TASK_ROWS,
                             MUL_MAT_TASKS_PER_THREAD * pool->n_threads()));
    const int64_t rows_per_task = (rows + n_tasks - 1) / n_tasks;
    if (dot_rows) {
        // q8_0: Q8_DOT_ROWS streams a task, a row of each per call, each stream's next row
        // fetched meanwhile; where a stream has run out, the others' rows one by one.
        pool->run(n_tasks, [&](int64_t t) {
            const int64_t m0 = m_first + t * rows_per_task, m1 = std::min(M, m0 + rows_per_task);
            const int64_t per_stream = (m1 - m0 + Q8_DOT_ROWS - 1) / Q8_DOT_ROWS;
            for (int64_t i = 0; i < per_stream; ++i) {
                const Q8Block *rows_at[Q8_DOT_ROWS], *next[Q8_DOT_ROWS];
                int count = 0;
                for (int s = 0; s < Q8_DOT_ROWS; ++s) {
                    const int64_t m = m0 + s * per_stream + i;
                    if (m >= m1) break;
                    rows_at[s] = reinterpret_cast<const Q8Block *>(w + m * w_row);
                    next[s] = i + 1 < per_stream && m + 1 < m1
                                  ? reinterpret_cast<const Q8Block *>(w + (m + 1) * w_row)
                                  : nullptr;
                    ++count;
                }
                if (count < Q8_DOT_ROWS) {
                    for (int s = 0; s < count; ++s) dot_row(m0 + s * per_stream + i);
                    continue;
                }
                for (int64_t j = 0; j < n; ++j) {
                    float out[Q8_DOT_ROWS];
                    dot_rows(rows_at, next, reinterpret_cast<const Q8Block *>(x + j * x_row),
                             K / Q8_QK, out);
                    for (int s = 0; s < Q8_DOT_ROWS; ++s) y[j * M + m0 + s * per_stream + i] = out[s];
                }
            }
        });
        return;
    }
    // Other types: the streams of weight_reads, row by row.
    const WeightReads &reads = weight_reads();
    pool->run(n_tasks, [&](int64_t t) {
        const int64_t m0 = m_first + t * rows_per_task, m1 = std::min(M, m0 + rows_per_task);
        const int64_t per_stream = (m1 - m0 + reads.streams - 1) / reads.streams;
        for (int64_t i = 0; i < per_stream; ++i)
            for (int64_t m = m0 + i; m < m1; m += per_stream) {
                if (reads.prefetch && i + 1 < per_stream && m + 1 < m1) {
                    const char *next = w + (m + 1) * w_row;
                    for (size_t b = 0; b < w_row; b += 64) __builtin_prefetch(next + b);
                }
                dot_row(m);
            }
    });
}

bool fits_q8_panels(const ggml_tensor *w) {
    return w->type == GGML_TYPE_Q8_0 && ggml_is_contiguous(w) && w->ne[2] == 1 && w->ne[3] == 1 &&
           w->ne[1] % Q8_GEMM_ROWS == 0;
}

void store_q8_panels(ggml_tensor *w, const void *rows) {
    GGML_ASSERT(fits_q8_panels(w) && w->data);
    q8_pack_matrix(rows, w->ne[1], w->ne[0], w->data);
    w->extra = const_cast<char *>(Q8_PANELS_TAG);
}

bool has_q8_panels(const ggml_tensor *w) { return w->extra == Q8_PANELS_TAG; }

ggml_tensor *pool_mul_mat(ggml_context *ctx, ggml_tensor *w, ggml_tensor *x, WorkerPool *pool,
                          ggml_tensor *ids) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && x->ne[0] == w->ne[0] && x->nb[0] == sizeof(float));
    GGML_ASSERT(ggml_is_contiguous(w) && x->ne[2] == 1 && x->ne[3] == 1);
    GGML_ASSERT(ids ? (ids->type == GGML_TYPE_I32 && w->ne[3] == 1) : w->ne[2] == 1);
    ggml_tensor *args[3] = {w, x, ids};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, args, ids ? 3 : 2,
                          pool_mul_mat_kernel, 1, pool);
}

}  // namespace kazeia
