// Test hooks and bench probes (wyoming_kazeia._native.testing): single kernels and the
// sampler run on given inputs, so that tests can hold them against numpy; generations with the
// probes of src/generation_probes.h (a trace of every intermediate, teacher forcing, the cache's
// growth step, frames apart on a GPU); the read bandwidth and FMA peak probes of the benches.
// Nothing of the product calls these, and the wheel users get is built without them
// (KAZEIA_TESTING).
#include <sched.h>
#include <sys/resource.h>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "kazeia/core_share.h"
#include "kazeia/error.h"
#include "kazeia/speech_decoder.h"
#include "src/cpu_backend.h"
#include "src/core_share_marks.h"
#include "src/generation_probes.h"
#include "src/ggml_raii.h"
#include "src/lm_graph.h"
#include "src/ops.h"
#include "src/ops/isa.h"
#include "src/q8_gemm.h"
#include "src/sampler.h"
#include "src/worker_pool.h"

#include "ggml.h"

#if KAZEIA_AVX2
#include <immintrin.h>
#elif KAZEIA_NEON
#include <arm_neon.h>
#endif

namespace kazeia::bindings {

namespace {

py::array_t<float> floats(const std::vector<float> &v, std::vector<py::ssize_t> shape) {
    py::array_t<float> out(shape);
    std::copy(v.begin(), v.end(), out.mutable_data());
    return out;
}

// Teacher-forced frames from an integer array [T, groups] (ranges are checked by the engine).
std::vector<Frame> forced_frames(const py::array &arr, int64_t groups) {
    if (arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u')
        throw InputError("forced_codes must be an integer array");
    if (arr.ndim() != 2 || arr.shape(1) != (py::ssize_t)groups || arr.shape(0) < 1 ||
        groups != (int64_t)Frame().size())
        throw InputError("forced_codes must have shape [T >= 1, " + std::to_string(groups) + "]");
    auto wide = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
    std::vector<Frame> out(arr.shape(0));
    for (size_t i = 0; i < out.size(); ++i)
        for (int64_t g = 0; g < groups; ++g) {
            const int64_t v = wide.data()[i * groups + g];
            out[i][g] = (int32_t)std::clamp<int64_t>(v, -1, INT32_MAX);  // -1: out of range
        }
    return out;
}


using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// Runs an attention op once on a 2-thread pool (for tests against numpy): window_attention, or
// with in_ggml_ops what a GPU runs. cache_capacity 0: k and v rows of all heads side by side, as
// the decoder holds them; more: copied into a head-major cache of that many slots, as the
// talker's, whose slots past n_kv hold NaN (read, they would poison the output).
py::array_t<float> run_window_attention(const FloatArray &q, const FloatArray &k,
                                        const FloatArray &v, const FloatArray &mask,
                                        int64_t n_kv_heads, float scale, int64_t cache_capacity,
                                        bool in_ggml_ops, const std::string &cache_type) {
    const ggml_type type = cache_type == "f16" ? GGML_TYPE_F16 : GGML_TYPE_F32;
    if ((cache_type != "f32" && cache_type != "f16") || (type == GGML_TYPE_F16 && cache_capacity == 0))
        throw InputError("window_attention: cache_type is f32, or f16 with a cache_capacity");
    if (q.ndim() != 3 || k.ndim() != 2 || v.ndim() != 2 || mask.ndim() != 2)
        throw InputError("q must be [n, heads, head_dim]; k, v [n_kv, kv_dim]; mask [n, n_kv]");
    const int64_t n = q.shape(0), nh = q.shape(1), hd = q.shape(2), n_kv = k.shape(0);
    if (n_kv_heads < 1 || nh % n_kv_heads || k.shape(1) != hd * n_kv_heads ||
        v.shape(0) != n_kv || v.shape(1) != k.shape(1) || mask.shape(0) != n ||
        mask.shape(1) != n_kv || (cache_capacity != 0 && cache_capacity < n_kv))
        throw InputError("window_attention: inconsistent shapes");
    // The inputs (k and v side by side, or in caches of cache_capacity slots), then at most what
    // the ggml ops make: dense copies of q, k and v, the scores and their softmax, the output and
    // its dense copy.
    const int64_t kv_slots = cache_capacity ? cache_capacity : n_kv;
    const size_t bytes = (2 * q.size() + 2 * (kv_slots + n_kv) * k.shape(1) + mask.size() * (1 + 2 * nh) +
                          2 * n * nh * hd) * sizeof(float);
    ggml_init_params params = {bytes + 64 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr,
                               false};
    GgmlContextPtr ctx(ggml_init(params));
    auto tensor = [&](const FloatArray &a, int64_t ne0, int64_t ne1, int64_t ne2) {
        ggml_tensor *t = ggml_new_tensor_3d(ctx.get(), GGML_TYPE_F32, ne0, ne1, ne2);
        std::memcpy(t->data, a.data(), ggml_nbytes(t));
        return t;
    };
    auto heads = [&](const FloatArray &rows) {  // -> [hd, n_kv, nkv] views
        if (cache_capacity == 0) return kv_heads(ctx.get(), tensor(rows, rows.shape(1), n_kv, 1), hd);
        ggml_tensor *cache = ggml_new_tensor_3d(ctx.get(), type, hd, cache_capacity, n_kv_heads);
        std::vector<float> c(ggml_nelements(cache), std::numeric_limits<float>::quiet_NaN());
        for (int64_t g = 0; g < n_kv_heads; ++g)
            for (int64_t t = 0; t < n_kv; ++t)
                std::memcpy(c.data() + (g * cache_capacity + t) * hd, rows.data() + (t * n_kv_heads + g) * hd,
                            hd * sizeof(float));
        if (type == GGML_TYPE_F32)
            std::memcpy(cache->data, c.data(), ggml_nbytes(cache));
        else
            ggml_fp32_to_fp16_row(c.data(), static_cast<ggml_fp16_t *>(cache->data), c.size());
        return ggml_view_3d(ctx.get(), cache, hd, n_kv, n_kv_heads, cache->nb[1], cache->nb[2], 0);
    };
    WorkerPool pool(2);
    const AttentionParams p{n_kv_heads, scale, &pool};
    ggml_tensor *qt = tensor(q, hd, nh, n), *kt = heads(k), *vt = heads(v), *mt = tensor(mask, n_kv, n, 1);
    ggml_tensor *out = in_ggml_ops ? attention_in_ggml_ops(ctx.get(), qt, kt, vt, mt, n_kv_heads, scale)
                                   : window_attention(ctx.get(), qt, kt, vt, mt, &p);
    ggml_cgraph *gf = ggml_new_graph(ctx.get());
    ggml_build_forward_expand(gf, out);
    if (cpu_backend().graph_compute_with_ctx(ctx.get(), gf, 1) != GGML_STATUS_SUCCESS)
        throw std::runtime_error("window_attention: graph computation failed");
    py::array_t<float> result({n, nh * hd});
    std::memcpy(result.mutable_data(), out->data, ggml_nbytes(out));
    return result;
}


// Passes of the bandwidth and compute probes. They report the best pass: other work on the box
// (a neighbour, a vCPU the host gives to another guest meanwhile) can only slow a pass down: a
// median of a few short passes reports half the peak of 2 threads if one vCPU is away for most.
// Work that holds a core through every pass still lowers the best: the benches check the FMA
// peak against one thread's. The read probe also hands its passes out (read_bandwidth_passes):
// where a bench sets it beside runs of seconds on a box whose bandwidth moves from one moment
// to the next, the best pass can catch a moment those runs do not get on average, so the
// benches print a median pass beside the best, never instead of it.
constexpr int PROBE_PASSES = 9;

// Memory read bandwidth in GB/s of each of PROBE_PASSES passes: `threads` threads sum a
// `megabytes` buffer, each task's share as `streams` sequential streams read in turn, 64 bytes
// of each.
std::vector<double> read_passes(const std::vector<uint64_t> &data, WorkerPool &pool, int64_t streams) {
    constexpr int64_t line_words = 8;
    const int64_t n_words = (int64_t)data.size();
    const int64_t n_tasks = 4 * pool.n_threads(), per_task = (n_words + n_tasks - 1) / n_tasks;
    std::vector<uint64_t> sums(n_tasks);
    std::vector<double> gbs;
    for (int pass = 0; pass < PROBE_PASSES; ++pass) {
        const auto start = std::chrono::steady_clock::now();
        pool.run(n_tasks, [&](int64_t t) {
            const int64_t begin = t * per_task, end = std::min(n_words, begin + per_task);
            const int64_t per_stream = std::max<int64_t>(0, end - begin) / streams / line_words * line_words;
            uint64_t sum[line_words] = {};  // independent chains: the loop vectorizes
            for (int64_t i = 0; i < per_stream; i += line_words)
                for (int64_t s = 0; s < streams; ++s) {
                    const uint64_t *line = data.data() + begin + s * per_stream + i;
                    for (int64_t w = 0; w < line_words; ++w) sum[w] += line[w];
                }
            uint64_t total = 0;
            for (uint64_t v : sum) total += v;
            for (int64_t i = begin + streams * per_stream; i < end; ++i) total += data[i];
            sums[t] = total;
        });
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        gbs.push_back(8.0 * n_words / s / 1e9);
    }
    uint64_t total = 0;
    for (uint64_t v : sums) total += v;
    if (total != (uint64_t)n_words) throw std::runtime_error("read_bandwidth: wrong sum");
    return gbs;
}

// The memory read bandwidth the benches set beside the weight bytes a frame must read: the
// passes of the two ways the weight products read their rows (one stream, then 4 streams a task:
// one stream is bound by the misses a core keeps in flight on some CPUs); the benches take the
// way that gave the best pass, standing in for whichever way this CPU's products take. Plain
// loads, no prefetch hints: a floor the products approach, which the hinted streams have come a
// few percent under.
std::vector<std::vector<double>> read_bandwidth_passes(int64_t megabytes, int threads) {
    if (megabytes < 1 || threads < 1 || threads > 512)
        throw InputError("read_bandwidth: megabytes >= 1 and threads in 1..512");
    const std::vector<uint64_t> data(megabytes * (1 << 20) / 8, 1);
    WorkerPool pool(threads);
    return {read_passes(data, pool, 1), read_passes(data, pool, 4)};
}

// The best pass of read_bandwidth_passes.
double read_bandwidth(int64_t megabytes, int threads) {
    double best = 0.0;
    for (const std::vector<double> &passes : read_bandwidth_passes(megabytes, threads))
        best = std::max(best, *std::max_element(passes.begin(), passes.end()));
    return best;
}

// The FP32 multiply-add peak of the vector unit the decoder's GEMM runs on here: independent
// chains of multiply-adds, enough of them to cover the latency of every FMA pipe, held in registers
// (the inner loops unrolled: kept in memory, they would time the store-to-load latency
// instead). Each returns its chains' sum, and takes the factors from its caller, so that the
// compiler can neither drop a chain nor find its value.
struct FmaPath {
    const char *name;
    int64_t flop_per_iteration;  // 2 per multiply-add, of every chain and lane
    float (*chains)(int64_t iterations, float a, float b);
};

// The decoder's portable GEMM is scalar, so is this loop: the empty asm keeps each chain in a
// register of its own, where the compiler would pack the chains into SSE vectors.
constexpr int SCALAR_CHAINS = 12;
float fma_scalar(int64_t iterations, float a, float b) {
    float c[SCALAR_CHAINS];
    for (float &v : c) v = 1.0f;
    for (int64_t n = 0; n < iterations; ++n)
#pragma GCC unroll 16
        for (float &v : c) {
            v = v * a + b;  // a dependent multiply (a * b alone would be hoisted out)
#if defined(__x86_64__)
            asm("" : "+x"(v));
#elif defined(__aarch64__)
            asm("" : "+w"(v));
#endif
        }
    float total = 0.0f;
    for (float v : c) total += v;
    return total;
}

#if KAZEIA_AVX2
constexpr int AVX512_CHAINS = 16, AVX2_CHAINS = 12;  // of 32 and 16 vector registers
KAZEIA_AVX512_FN float fma_avx512(int64_t iterations, float a_, float b_) {
    const __m512 a = _mm512_set1_ps(a_), b = _mm512_set1_ps(b_);
    __m512 c[AVX512_CHAINS];
    for (__m512 &v : c) v = _mm512_set1_ps(1.0f);
    for (int64_t n = 0; n < iterations; ++n)
#pragma GCC unroll 16
        for (__m512 &v : c) v = _mm512_fmadd_ps(a, b, v);
    float total = 0.0f;
    for (__m512 v : c) total += _mm512_reduce_add_ps(v);
    return total;
}

KAZEIA_AVX2_FN float fma_avx2(int64_t iterations, float a_, float b_) {
    const __m256 a = _mm256_set1_ps(a_), b = _mm256_set1_ps(b_);
    __m256 c[AVX2_CHAINS];
    for (__m256 &v : c) v = _mm256_set1_ps(1.0f);
    for (int64_t n = 0; n < iterations; ++n)
#pragma GCC unroll 16
        for (__m256 &v : c) v = _mm256_fmadd_ps(a, b, v);
    alignas(32) float lanes[8];
    float total = 0.0f;
    for (__m256 v : c) {
        _mm256_store_ps(lanes, v);
        for (float x : lanes) total += x;
    }
    return total;
}
#elif KAZEIA_NEON
constexpr int NEON_CHAINS = 16;  // of 32 vector registers: cores with 4 FMA pipes too
float fma_neon(int64_t iterations, float a_, float b_) {
    const float32x4_t a = vdupq_n_f32(a_), b = vdupq_n_f32(b_);
    float32x4_t c[NEON_CHAINS];
    for (float32x4_t &v : c) v = vdupq_n_f32(1.0f);
    for (int64_t n = 0; n < iterations; ++n)
#pragma GCC unroll 16
        for (float32x4_t &v : c) v = vfmaq_f32(v, a, b);
    float total = 0.0f;
    for (float32x4_t v : c) total += vaddvq_f32(v);
    return total;
}
#endif

// The widest path the decoder's GEMM takes on this CPU (KAZEIA_KERNELS narrows both alike).
FmaPath fma_path() {
#if KAZEIA_AVX2
    if (use_avx512()) return {"AVX-512F", 2 * 16 * AVX512_CHAINS, fma_avx512};
    if (use_avx2()) return {"AVX2 FMA", 2 * 8 * AVX2_CHAINS, fma_avx2};
#elif KAZEIA_NEON
    return {"NEON", 2 * 4 * NEON_CHAINS, fma_neon};
#endif
    return {"portable loop", 2 * SCALAR_CHAINS, fma_scalar};
}

// GFLOP/s of `threads` threads each running fma_path() (FMA_PEAK_ISA names it), the best of
// PROBE_PASSES: the ceiling the benches hold the decoder's FLOP per second against.
double fma_peak(int threads) {
    if (threads < 1 || threads > 512) throw InputError("fma_peak: threads in 1..512");
    constexpr int64_t iterations = 4'000'000;
    volatile float factor = 0.999f, term = 1e-3f;  // unknown to the compiler
    const float a = factor, b = term;
    const FmaPath path = fma_path();
    // Many small tasks, so that a thread woken late does not leave another with two halves.
    constexpr int64_t tasks_per_thread = 8;
    WorkerPool pool(threads);
    std::vector<float> sums(threads * tasks_per_thread);
    std::vector<double> gflops;
    for (int pass = 0; pass < PROBE_PASSES; ++pass) {
        const auto start = std::chrono::steady_clock::now();
        pool.run((int64_t)sums.size(),
                 [&](int64_t t) { sums[t] = path.chains(iterations / tasks_per_thread, a, b); });
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        gflops.push_back((double)path.flop_per_iteration * iterations * threads / s / 1e9);
    }
    for (float v : sums)
        if (!std::isfinite(v)) throw std::runtime_error("fma_peak: the chains diverged");
    return *std::max_element(gflops.begin(), gflops.end());
}

// A q8_0 product y = W x^T as the engine computes it: W [M, K] quantized to q8_0 by ggml, x
// [n, K] converted to q8_0 as ggml's CPU backend does for a dot product, then pool_mul_mat's
// mul_mat_converted with the GEMM or with ggml's dot product only, or (panels) W kept as the
// GEMM's panels (q8_pack_matrix, outside the timing) and q8_gemm_packed. Returns y [n, M], the
// dequantized W and x (what the integer sums see) and the median seconds of `repeats` runs.
// The decoder's conv GEMM alone: w [out, taps * in] (row m: tap 0's in values, then tap 1's,
// ...), x [len + (taps - 1) * dilation, in] (left context first), packed and computed as the
// decoder does.
py::array_t<float> run_conv_gemm(const FloatArray &w, const FloatArray &x, int64_t taps,
                                 int64_t dilation, const std::string &precision, int threads,
                                 int64_t period) {
    if (w.ndim() != 2 || x.ndim() != 2 || taps < 1 || dilation < 1 || threads < 1 ||
        w.shape(1) != taps * x.shape(1) || w.shape(0) % CONV_PANEL ||
        x.shape(0) <= (taps - 1) * dilation)
        throw InputError("conv_gemm: w [out, taps * in] with out a multiple of 16, x [cols, in] "
                         "with cols > (taps - 1) * dilation, threads >= 1");
    const int64_t out = w.shape(0), K = w.shape(1), in = x.shape(1), cols = x.shape(0);
    const int64_t len = cols - (taps - 1) * dilation;
    const DecoderPrecision products = decoder_precision(precision);
    if (period && (!winograd_fits(taps, dilation, period) || len % period))
        throw InputError("conv_gemm: a period that Winograd's tiles do not fit");
    if (period && products != DecoderPrecision::F32)
        throw InputError("conv_gemm: Winograd's form (a period) is f32 only");
    const size_t bytes =
        (w.size() + x.size() + out * len + (period ? in * out * (taps + 1) : 0)) * sizeof(float);
    ggml_init_params params = {bytes + 8 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr,
                               false};
    GgmlContextPtr ctx(ggml_init(params));
    ggml_tensor *wt = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, K, out);
    ggml_tensor *xt = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, in, cols);
    std::memcpy(wt->data, w.data(), ggml_nbytes(wt));
    std::memcpy(xt->data, x.data(), ggml_nbytes(xt));
    WorkerPool pool(threads);
    const ConvGemmParams p{taps, dilation, &pool, period};
    ggml_tensor *y;
    if (period) {
        ggml_tensor *u = ggml_new_tensor_3d(ctx.get(), GGML_TYPE_F32, in, out, taps + 1);
        pack_winograd_weight(wt, taps, u);
        y = conv_winograd(ctx.get(), xt, u, nullptr, nullptr, &p);
    } else {
        pack_conv_weight(wt, taps, products);
        y = conv_gemm(ctx.get(), xt, wt, nullptr, nullptr, &p);
    }
    ggml_cgraph *gf = ggml_new_graph(ctx.get());
    ggml_build_forward_expand(gf, y);
    if (cpu_backend().graph_compute_with_ctx(ctx.get(), gf, 1) != GGML_STATUS_SUCCESS)
        throw std::runtime_error("conv_gemm: graph computation failed");
    py::array_t<float> result({len, out});
    std::memcpy(result.mutable_data(), y->data, ggml_nbytes(y));
    return result;
}

// DeviceCopies::joined on CPU copies of small matrices, in this order in one buffer: a, b, c
// (q8_0, 256 columns; 16, 8 and 24 rows), d (f32, 8 rows), e (q8_0, 12 rows), f (q8_0, 8 rows),
// g (q8_0, 128 columns, 8 rows); `a_as_panels` keeps a as q8_0 panels. For each named group of
// copies: the rows of the joined matrix, 0 where joined() refused.
std::vector<std::pair<std::string, int64_t>> joined_rows(bool a_as_panels) {
    struct Part {
        const char *name;
        ggml_type type;
        int64_t cols, rows;
    };
    const Part parts[] = {{"a", GGML_TYPE_Q8_0, 256, 16}, {"b", GGML_TYPE_Q8_0, 256, 8},
                          {"c", GGML_TYPE_Q8_0, 256, 24}, {"d", GGML_TYPE_F32, 256, 8},
                          {"e", GGML_TYPE_Q8_0, 256, 12}, {"f", GGML_TYPE_Q8_0, 256, 8},
                          {"g", GGML_TYPE_Q8_0, 128, 8}};
    ggml_init_params params = {1 << 20, nullptr, false};
    GgmlContextPtr ctx(ggml_init(params));
    std::vector<ggml_tensor *> host;
    for (const Part &p : parts) {
        ggml_tensor *t = ggml_new_tensor_2d(ctx.get(), p.type, p.cols, p.rows);
        ggml_set_name(t, (std::string("blk.0.") + p.name + ".weight").c_str());
        std::memset(t->data, 0, ggml_nbytes(t));  // zero scales and values: valid blocks
        host.push_back(t);
    }
    std::vector<ggml_tensor *> panels;
    if (a_as_panels) panels.push_back(host[0]);
    DeviceCopies copies(host, ggml_backend_cpu_buffer_type(), "test", nullptr, panels);
    auto at = [&](char name) { return copies[host[name - 'a']]; };
    std::vector<std::pair<std::string, int64_t>> out;
    for (const char *group : {"bc", "abc", "cb", "ac", "cd", "ef", "fg", "ab"}) {
        ggml_tensor *j = nullptr;
        if (std::strlen(group) == 2) j = copies.joined({at(group[0]), at(group[1])}, "joined");
        else j = copies.joined({at(group[0]), at(group[1]), at(group[2])}, "joined");
        out.emplace_back(group, j ? j->ne[1] : 0);
    }
    return out;
}

// What the kernel says of the calling thread: its time slice (ns), nice value and policy.
std::vector<int64_t> thread_scheduling() {
    return {(int64_t)thread_time_slice_ns(), (int64_t)getpriority(PRIO_PROCESS, 0),
            (int64_t)sched_getscheduler(0)};
}

// Keeps the calling thread's core busy for `how_long`: a task that computes for that time.
void busy_for(std::chrono::microseconds how_long) {
    const auto done = std::chrono::steady_clock::now() + how_long;
    while (std::chrono::steady_clock::now() < done) {
    }
}

// Runs 16 tasks of ~1 ms at a time on `pool` until a worker (a thread other than the caller)
// took one or `give_up` passed; calls on_worker() on each worker the first time it takes one.
template <class OnWorker>
void run_until_a_worker_takes(WorkerPool &pool, std::chrono::milliseconds give_up,
                              OnWorker on_worker) {
    const std::thread::id caller = std::this_thread::get_id();
    std::mutex mutex;
    std::vector<std::thread::id> seen;
    const auto until = std::chrono::steady_clock::now() + give_up;
    do {
        pool.run(16, [&](int64_t) {
            busy_for(std::chrono::milliseconds(1));
            const std::thread::id me = std::this_thread::get_id();
            std::lock_guard<std::mutex> lock(mutex);
            if (me == caller || std::find(seen.begin(), seen.end(), me) != seen.end()) return;
            seen.push_back(me);
            on_worker();
        });
    } while (seen.empty() && std::chrono::steady_clock::now() < until);
}

// thread_scheduling() of the threads that ran a polite pool's tasks, until a worker took one
// (for at most 2 s).
py::dict pool_thread_scheduling(int threads) {
    std::vector<std::vector<int64_t>> workers;
    std::vector<int64_t> of_caller;
    {
        py::gil_scoped_release released;
        WorkerPool pool(threads, /*polite=*/true);
        run_until_a_worker_takes(pool, std::chrono::seconds(2),
                                 [&] { workers.push_back(thread_scheduling()); });
        of_caller = thread_scheduling();
    }
    py::dict out;
    out["caller"] = of_caller;
    out["workers"] = workers;
    return out;
}

// A generator beside a real decoder push: see its docstring below.
using CodesArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
py::dict generator_beside_push(DecoderStream &stream, const CodesArray &codes,
                               const std::shared_ptr<CoreShare> &share, int threads) {
    if (codes.ndim() != 2) throw InputError("generator_beside_push: codes [T, Q]");
    if (!share) throw InputError("generator_beside_push: a CoreShare");
    const std::vector<int32_t> c(codes.data(), codes.data() + codes.size());
    const int64_t n_frames = codes.shape(0);
    int64_t runs = 0, alone = 0;
    std::exception_ptr failed;
    {
        py::gil_scoped_release released;
        std::atomic<bool> pushed{false};
        WorkerPool pool(threads, /*polite=*/true, share.get(), PoolStage::Generator);
        std::thread pusher([&] {
            try {
                stream.push(c.data(), n_frames);
            } catch (...) {
                failed = std::current_exception();
            }
            pushed = true;
        });
        struct Joined {  // on every path out of this block
            std::thread &t;
            ~Joined() { t.join(); }
        } joined{pusher};
        while (!pushed) {
            alone += share->generator_alone();
            ++runs;
            pool.run(8, [](int64_t) { busy_for(std::chrono::microseconds(200)); });
        }
    }
    if (failed) std::rethrow_exception(failed);
    py::dict out;
    out["runs"] = runs;
    out["alone"] = alone;
    return out;
}

// How many of a generator's polite pool's threads ran tasks while a decoder push of
// `decoder_threads` threads (0: none) was marked in `share`: the caller, plus each worker that
// took a task within `seconds`.
int pool_threads_beside_decoder(int threads, const std::shared_ptr<CoreShare> &share,
                                int decoder_threads, double seconds) {
    py::gil_scoped_release released;
    const DecoderPush push(decoder_threads > 0 ? share.get() : nullptr, decoder_threads);
    WorkerPool pool(threads, /*polite=*/true, share.get(), PoolStage::Generator);
    int workers = 0;
    run_until_a_worker_takes(pool, std::chrono::milliseconds((int64_t)(seconds * 1000)),
                             [&] { ++workers; });
    return 1 + workers;
}

// The most threads that took tasks of one job of a decoder's polite pool of `threads`
// threads, running jobs of 16 tasks of ~1 ms for `seconds`, while a push of as many threads is
// marked in `share` and, with `generator_computing`, a generation computing.
int decoder_pool_threads(int threads, const std::shared_ptr<CoreShare> &share,
                         bool generator_computing, double seconds) {
    if (!share) throw InputError("decoder_pool_threads: a CoreShare");
    py::gil_scoped_release released;
    const DecoderPush push(share.get(), threads);
    const GeneratorComputing computing(generator_computing ? share.get() : nullptr);
    WorkerPool pool(threads, /*polite=*/true, share.get(), PoolStage::Decoder);
    size_t most = 0;
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds((int64_t)(seconds * 1000));
    do {
        std::mutex mutex;
        std::vector<std::thread::id> seen;
        pool.run(16, [&](int64_t) {
            busy_for(std::chrono::milliseconds(1));
            const std::thread::id me = std::this_thread::get_id();
            std::lock_guard<std::mutex> lock(mutex);
            if (std::find(seen.begin(), seen.end(), me) == seen.end()) seen.push_back(me);
        });
        most = std::max(most, seen.size());
    } while (std::chrono::steady_clock::now() < until);
    return (int)most;
}

// The CPU seconds of this thread and of the whole process during a push of codes [T, Q]
// through `stream` on this thread, with a generation marked computing in `share` or not.
py::dict push_cpu_seconds(DecoderStream &stream, const CodesArray &codes,
                          const std::shared_ptr<CoreShare> &share, bool generator_computing) {
    if (codes.ndim() != 2) throw InputError("push_cpu_seconds: codes [T, Q]");
    const std::vector<int32_t> c(codes.data(), codes.data() + codes.size());
    auto cpu_s = [](clockid_t clock) {
        timespec ts{};
        clock_gettime(clock, &ts);
        return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    };
    double thread_s = 0.0, process_s = 0.0;
    {
        py::gil_scoped_release released;
        const GeneratorComputing computing(generator_computing ? share.get() : nullptr);
        const double thread0 = cpu_s(CLOCK_THREAD_CPUTIME_ID), process0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID);
        stream.push(c.data(), codes.shape(0));
        thread_s = cpu_s(CLOCK_THREAD_CPUTIME_ID) - thread0;
        process_s = cpu_s(CLOCK_PROCESS_CPUTIME_ID) - process0;
    }
    py::dict out;
    out["thread_s"] = thread_s;
    out["process_s"] = process_s;
    return out;
}

py::dict run_q8_matmul(const FloatArray &w, const FloatArray &x, bool gemm, int threads,
                       int repeats, bool panels) {
    if (w.ndim() != 2 || x.ndim() != 2 || w.shape(1) != x.shape(1) || w.shape(1) % 32)
        throw InputError("q8_matmul: w [M, K] and x [n, K] with K a multiple of 32");
    if (panels && w.shape(0) % Q8_GEMM_ROWS)
        throw InputError("q8_matmul: panels need M a multiple of 8");
    if (threads < 1 || repeats < 1) throw InputError("q8_matmul: threads and repeats >= 1");
    const int64_t M = w.shape(0), K = w.shape(1), n = x.shape(0);
    const BackendPtr backend(new_cpu_backend());  // initializes ggml's CPU tables (fp16)
    const size_t row = ggml_row_size(GGML_TYPE_Q8_0, K);
    std::vector<uint8_t> wq(row * M), xq(row * n);
    ggml_quantize_chunk(GGML_TYPE_Q8_0, w.data(), wq.data(), 0, M, K, nullptr);
    const ggml_type_traits_cpu *traits = cpu_backend().type_traits(GGML_TYPE_Q8_0);
    for (int64_t j = 0; j < n; ++j) traits->from_float(x.data() + j * K, xq.data() + j * row, K);
    py::array_t<float> y({n, M}), w_deq({M, K}), x_deq({n, K});
    const ggml_to_float_t to_float = ggml_get_type_traits(GGML_TYPE_Q8_0)->to_float;
    to_float(wq.data(), w_deq.mutable_data(), M * K);
    to_float(xq.data(), x_deq.mutable_data(), n * K);
    std::vector<uint8_t> packed;
    if (panels) {
        packed.resize(wq.size());
        q8_pack_matrix(wq.data(), M, K, packed.data());
    }
    WorkerPool pool(threads);
    std::vector<double> seconds;
    for (int rep = 0; rep < repeats; ++rep) {
        const auto start = std::chrono::steady_clock::now();
        if (panels)
            q8_gemm_packed(packed.data(), M, K, xq.data(), n, y.mutable_data(), &pool);
        else
            mul_mat_converted(reinterpret_cast<const char *>(wq.data()), row, GGML_TYPE_Q8_0, M, K,
                              reinterpret_cast<const char *>(xq.data()), row, n, y.mutable_data(),
                              &pool, gemm);
        seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(seconds.begin(), seconds.end());
    py::dict out;
    out["y"] = y;
    out["w"] = w_deq;
    out["x"] = x_deq;
    out["seconds"] = seconds[seconds.size() / 2];
    return out;
}

}  // namespace

void def_testing(py::module_ &m) {
    m.def(
        "sin_squared",
        [](py::array_t<float, py::array::c_style | py::array::forcecast> x) {
            py::array_t<float> y(x.size());
            sin_squared(x.data(), y.mutable_data(), x.size());
            return y;
        },
        py::arg("x"), "sin(x)^2 as the SnakeBeta kernel computes it (1-D float32 array).");
    m.def("read_bandwidth", &read_bandwidth, py::arg("megabytes") = 256, py::arg("threads") = 2,
          "Memory read bandwidth in GB/s: the best of one and 4 streams a task (the best of "
          "several passes over a buffer of that size each).");
    m.def("read_bandwidth_passes", &read_bandwidth_passes, py::arg("megabytes") = 256,
          py::arg("threads") = 2,
          "read_bandwidth's passes in GB/s: [one stream a task, 4 streams a task], several "
          "passes each.");
    m.def("fma_peak", &fma_peak, py::arg("threads") = 2,
          "FP32 multiply-add peak in GFLOP/s of that many threads on the widest vector path "
          "the decoder's GEMM uses here (the best of several passes).");
    m.attr("FMA_PEAK_ISA") = fma_path().name;
    m.def("q8_matmul", &run_q8_matmul, py::arg("w"), py::arg("x"), py::arg("gemm") = true,
          py::arg("threads") = 2, py::arg("repeats") = 1, py::arg("panels") = false,
          "A q8_0 product as the engine computes it (q8_gemm, or gemm=False: ggml's dot product "
          "per row and column; panels=True: W kept as the GEMM's panels, as the code predictor's "
          "matrices are): dict(y [n, M], w and x dequantized, seconds: median of repeats).");
    m.attr("Q8_GEMM_ISA") = q8_gemm_isa();
    m.def("last_level_cache_bytes", &last_level_cache_bytes,
          "The L3 cache size the q8_0 panels' choice reads (sysfs, else glibc; 0: unknown).");
    m.def("joined_rows", &joined_rows, py::arg("a_as_panels"),
          "DeviceCopies::joined on CPU copies of small matrices a..g (see testing.cpp): "
          "[(group, rows of the joined matrix or 0 where refused)].");
    m.def("pool_thread_scheduling", &pool_thread_scheduling, py::arg("threads"),
          "Runs tasks of ~1 ms on a polite pool of that many threads until a worker took one: "
          "dict(caller: [time slice ns, nice, policy] of the calling thread after, workers: the "
          "same of each other thread that ran a task).");
    m.def("generator_beside_push", &generator_beside_push, py::arg("stream"), py::arg("codes"),
          py::arg("share"), py::arg("threads") = 3,
          "Pushes codes [T, Q] through `stream` on another thread while this one runs a "
          "generator's polite pool of `threads` threads with `share`, 8 tasks of ~0.2 ms at a "
          "time: dict(runs, alone: the runs started while share.generator_alone).");
    m.def("pool_threads_beside_decoder", &pool_threads_beside_decoder, py::arg("threads"),
          py::arg("share"), py::arg("decoder_threads"), py::arg("seconds") = 1.0,
          "Runs tasks of ~1 ms on a generator's polite pool of that many threads, with `share`, "
          "while a decoder push of decoder_threads (0: none) computes: how many threads took "
          "tasks (the caller included) before a worker took one or `seconds` passed.");
    m.def("decoder_pool_threads", &decoder_pool_threads, py::arg("threads"), py::arg("share"),
          py::arg("generator_computing"), py::arg("seconds") = 0.5,
          "Runs jobs of 16 tasks of ~1 ms on a decoder's polite pool of that many threads, with "
          "`share`, for `seconds`, while a push of as many threads and (generator_computing) a "
          "generation computing are marked there: the most threads that took tasks of one job.");
    m.def("push_cpu_seconds", &push_cpu_seconds, py::arg("stream"), py::arg("codes"),
          py::arg("share"), py::arg("generator_computing"),
          "Pushes codes [T, Q] through `stream` on this thread, with a generation marked "
          "computing in `share` or not: dict(thread_s, process_s), the CPU seconds of this "
          "thread and of the whole process during the push.");
    m.def("set_thread_time_slice", &set_thread_time_slice, py::arg("ns"),
          "Sets the calling thread's time slice as a pool's threads do (0: the kernel's default); "
          "whether the call was accepted.");
    m.def("thread_time_slice_ns", &thread_time_slice_ns,
          "The calling thread's time slice in ns as the kernel reports it (0: none).");
    m.attr("SHORT_TIME_SLICE_NS") = SHORT_TIME_SLICE_NS;
    m.attr("KV_BLOCK") = DEFAULT_KV_BLOCK;
    m.def("conv_gemm", &run_conv_gemm, py::arg("w"), py::arg("x"), py::arg("taps") = 1,
          py::arg("dilation") = 1, py::arg("precision") = "f32", py::arg("threads") = 2,
          py::arg("period") = 0,
          "The decoder's conv GEMM: w [out, taps * in], x [len + (taps - 1) * dilation, in] -> "
          "y [len, out], y[t] = sum_j W_j x[t + j * dilation], in `precision` (f32 or bf16); "
          "with a period (output columns per frame), in Winograd's form (f32).");
    m.def(
        "to_bf16",
        [](py::array_t<float, py::array::c_style | py::array::forcecast> x) {
            py::array_t<uint16_t> y(x.size());
            to_bf16(x.data(), reinterpret_cast<ggml_bf16_t *>(y.mutable_data()), x.size());
            return y;
        },
        py::arg("x"), "The bits of x (1-D float32 array) rounded to bf16 as the decoder rounds.");
    m.def("window_attention", &run_window_attention, py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("mask"), py::arg("n_kv_heads"), py::arg("scale"), py::arg("cache_capacity") = 0,
          py::arg("in_ggml_ops") = false, py::arg("cache_type") = "f32",
          "The attention op: q [n, heads, head_dim], k and v [n_kv, kv_heads * head_dim], mask "
          "[n, n_kv] (0 or -inf) -> [n, heads * head_dim]; cache_capacity > 0: k and v read "
          "from a head-major cache of that many slots, of cache_type (f32 or f16: rounded); "
          "in_ggml_ops: ggml's ops instead.");

    m.def(
        "select_token",
        [](const py::array_t<float, py::array::c_style | py::array::forcecast> &logits,
           const std::vector<int32_t> &history, float repetition_penalty, int64_t suppress_begin,
           int64_t suppress_end, int64_t keep, bool greedy, float temperature, int top_k,
           float top_p, uint64_t seed, int n) {
            std::vector<int32_t> picks;
            Rng rng(seed);
            std::vector<float> x, scratch;
            for (int i = 0; i < n; ++i) {
                x.assign(logits.data(), logits.data() + logits.size());
                apply_repetition_penalty(x.data(), (int64_t)x.size(), history, repetition_penalty);
                suppress_range(x.data(), (int64_t)x.size(), suppress_begin, suppress_end, keep);
                picks.push_back(select_token(x.data(), (int64_t)x.size(),
                                             SamplingParams{greedy, temperature, top_k, top_p}, rng, scratch));
            }
            return picks;
        },
        py::arg("logits"), py::arg("history"), py::arg("repetition_penalty"),
        py::arg("suppress_begin"), py::arg("suppress_end"), py::arg("keep"), py::arg("greedy"),
        py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("seed"), py::arg("n"),
        "The talker's token processors and sampler on given logits, n draws (tests).");
    m.def(
        "frames",
        [](const Generator &g, const py::array &input_ids, const std::string &speaker,
           const std::string &language, bool non_streaming, bool greedy,
           std::optional<uint64_t> seed, std::optional<float> temperature, std::optional<int> top_k,
           std::optional<float> top_p, std::optional<float> repetition_penalty, int max_frames,
           const VoiceOptions *voice, int kv_block, bool whole_frames) {
            auto ids = ids_from(input_ids);
            auto o = options_from(speaker, voice, language, non_streaming, greedy, seed,
                                  temperature, top_k, top_p, repetition_penalty, max_frames);
            GenerationProbes probes;
            probes.kv_block = kv_block;
            probes.whole_frames = whole_frames;
            std::unique_ptr<GenerationSession> s;
            {
                py::gil_scoped_release release;
                s = start_probed(g, ids, o, probes);
            }
            return FrameIterator(std::move(s));
        },
        py::keep_alive<0, 1>(), py::arg("generator"), py::arg("input_ids"),
        py::arg("speaker") = "", py::arg("language") = "auto", py::arg("non_streaming") = false,
        py::arg("greedy") = false, py::arg("seed") = py::none(),
        py::arg("temperature") = py::none(), py::arg("top_k") = py::none(),
        py::arg("top_p") = py::none(), py::arg("repetition_penalty") = py::none(),
        py::arg("max_frames") = 2048, py::arg("voice") = nullptr, py::arg("kv_block") = DEFAULT_KV_BLOCK,
        py::arg("whole_frames") = true,
        "Generator.frames with the probes: kv_block, the talker cache's growth step; "
        "whole_frames=False, no frame computed whole on a GPU.");
    m.def(
        "trace",
        [](const Generator &g, const py::array &input_ids, const std::string &speaker,
           const std::string &language, bool non_streaming, int max_frames, int kv_block,
           const VoiceOptions *voice, const std::optional<py::array> &forced_codes) {
            auto ids = ids_from(input_ids);
            auto o = options_from(speaker, voice, language, non_streaming, true, 0, std::nullopt,
                                  std::nullopt, std::nullopt, 1.0f, max_frames);
            GenerationTrace trace;
            GenerationProbes probes;
            probes.kv_block = kv_block;
            probes.trace = &trace;
            if (forced_codes) probes.forced = forced_frames(*forced_codes, g.hparams().num_code_groups);
            std::vector<Frame> frames;
            {
                py::gil_scoped_release release;
                auto s = start_probed(g, ids, o, probes);
                while (auto f = s->next()) frames.push_back(*f);
            }
            const py::ssize_t d = trace.hidden, vocab = g.hparams().talker.vocab_size,
                              cpv = g.hparams().predictor.vocab_size;
            const py::ssize_t heads = g.hparams().num_code_groups - 1;  // predictor heads
            auto rows = [](const std::vector<float> &v, py::ssize_t width) {
                return floats(v, {(py::ssize_t)v.size() / width, width});
            };
            py::dict out;
            out["codes"] = frames_to_numpy(frames);
            out["prefill_embeds"] = rows(trace.prefill_embeds, d);
            out["step_embeds"] = rows(trace.step_embeds, d);
            out["talker_logits"] = rows(trace.talker_logits, vocab);
            out["talker_hidden"] = rows(trace.talker_hidden, d);
            out["cp_logits"] = floats(trace.cp_logits, {(py::ssize_t)trace.cp_logits.size() / (heads * cpv), heads, cpv});
            out["talker_panels"] = trace.talker_panels;
            out["predictor_panels"] = trace.predictor_panels;
            out["talker_joined"] = trace.talker_joined;
            out["predictor_joined"] = trace.predictor_joined;
            return out;
        },
        py::arg("generator"), py::arg("input_ids"), py::arg("speaker") = "",
        py::arg("language") = "auto", py::arg("non_streaming") = false,
        py::arg("max_frames") = 2048, py::arg("kv_block") = DEFAULT_KV_BLOCK, py::arg("voice") = nullptr,
        py::arg("forced_codes") = py::none(),
        "Greedy generation (repetition penalty 1) recording every intermediate the official "
        "reference pins down. kv_block: talker cache growth step. forced_codes (int [T, 16]): "
        "teacher forcing, frame i is row i whatever the argmax (the logits are those of the "
        "forced history; quality measurements); at most T frames. talker_panels, "
        "predictor_panels: the layer matrices of each stack kept as the q8_0 GEMM's panels; "
        "talker_joined, predictor_joined: how many of each stack's layer matrices are joined "
        "matrices (q, k and v as one; gate and up as one).");
}

}  // namespace kazeia::bindings
