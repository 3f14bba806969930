// The q8_0 GEMM (q8_gemm.h): the path choice, the activations' unpacking, the portable panel
// repacking and products, and the entry points; the vector paths are in ops/x86/ and ops/arm/.
// All three files are built with -ffp-contract=off: the paths give the same bits only if no
// multiply-add is fused.
#include "q8_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#if defined(__linux__)
#include <unistd.h>
#endif

#include "env_switch.h"
#include "ggml.h"
#include "ops/arch.h"
#include "ops/isa.h"
#include "ops/shared.h"

#if KAZEIA_NEON
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace kazeia {

namespace {

constexpr int64_t R = Q8_GEMM_ROWS;

enum class Path { portable, avx2, vnni, dotprod };

// This CPU's path (q8_gemm_isa), checked once: on x86-64 by CPUID, on aarch64 by the kernel's
// HWCAP bits (the dot-product instructions are optional there).
Path detect_path() {
    if (env_is("KAZEIA_KERNELS", "portable")) return Path::portable;
#if KAZEIA_AVX2
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("f16c")) return Path::portable;
    return avx512_vnni_on_cpu() ? Path::vnni : Path::avx2;
#elif KAZEIA_NEON
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) ? Path::dotprod : Path::portable;
#else
    return Path::portable;
#endif
}

Path path() {
    static const Path p = detect_path();
    return p;
}

// Repacks the R weight rows at w (w_row_bytes apart, nb blocks each) into a panel's words q
// [nb][Q8_GROUPS][R] and scales d [nb][R] (Q8Panel's layout); `flip` for the VNNI path.
void pack([[maybe_unused]] Path path, uint32_t *q, ggml_fp16_t *d, const char *w,
          int64_t w_row_bytes, int64_t nb, bool flip) {
#if KAZEIA_AVX2
    if (path == Path::avx2 || path == Path::vnni)
        return x86::q8_pack_avx2(q, d, w, w_row_bytes, nb, flip);
#endif
    const uint32_t mask = flip ? 0x80808080u : 0u;
    for (int64_t r = 0; r < R; ++r) {
        const auto *row = reinterpret_cast<const Q8Block *>(w + r * w_row_bytes);
        for (int64_t b = 0; b < nb; ++b) {
            d[b * R + r] = row[b].d;
            for (int64_t g = 0; g < Q8_GROUPS; ++g) {
                uint32_t v;
                std::memcpy(&v, row[b].qs + g * 4, 4);
                q[(b * Q8_GROUPS + g) * R + r] = v ^ mask;
            }
        }
    }
}

// out[r] = sum_b (float)isum(r, b) * (d_w(r, b) * d_x(j, b)), summed in block order: the
// reference every vector path reproduces bit for bit.
void panel_portable(const Q8PanelView &p, const Q8Columns &x, int64_t j0, int cols, float *y,
                    int64_t M) {
    for (int c = 0; c < cols; ++c) {
        const int64_t j = j0 + c;
        float acc[R] = {};
        for (int64_t b = 0; b < x.nb; ++b) {
            int32_t isum[R] = {};
            const int8_t *xq = &x.q[j * x.K + b * Q8_QK];
            for (int64_t g = 0; g < Q8_GROUPS; ++g) {
                for (int64_t r = 0; r < R; ++r) {
                    int8_t w[4];
                    std::memcpy(w, &p.q[(b * Q8_GROUPS + g) * R + r], 4);
                    for (int i = 0; i < 4; ++i) isum[r] += (int32_t)w[i] * xq[g * 4 + i];
                }
            }
            const float dx = x.d[j * x.nb + b];
            for (int64_t r = 0; r < R; ++r)
                acc[r] += (float)isum[r] * (ggml_fp16_to_fp32(p.d[b * R + r]) * dx);
        }
        std::memcpy(y + j * M, acc, sizeof(acc));
    }
}

// `cols` <= Q8_MAX_COLS columns of one panel from column j0, on this CPU's path.
void panel_block(Path path, int cols, const Q8PanelView &p, const Q8Columns &x, int64_t j0,
                 float *y, int64_t M) {
#if KAZEIA_AVX2
    if (path == Path::vnni) return x86::q8_panel_vnni(cols, p, x, j0, y, M);
    if (path == Path::avx2) return x86::q8_panel_avx2(cols, p, x, j0, y, M);
#elif KAZEIA_NEON
    if (path == Path::dotprod) return arm::q8_panel_dotprod(cols, p, x, j0, y, M);
#endif
    panel_portable(p, x, j0, cols, y, M);
}

// All n columns of one panel, Q8_MAX_COLS at a time.
void panel_columns(Path path, const Q8PanelView &p, const Q8Columns &x, int64_t n, float *y,
                   int64_t M) {
    for (int64_t j0 = 0; j0 < n; j0 += Q8_MAX_COLS)
        panel_block(path, (int)std::min<int64_t>(Q8_MAX_COLS, n - j0), p, x, j0, y, M);
}

void unpack_columns(const void *x, int64_t n, int64_t K, Q8Columns &cols) {
    cols.K = K;
    cols.nb = K / Q8_QK;
    cols.q.resize(n * K);
    cols.d.resize(n * cols.nb);
    cols.offset.resize(n * cols.nb);
    const auto *blocks = static_cast<const Q8Block *>(x);
    for (int64_t i = 0; i < n * cols.nb; ++i) {
        std::memcpy(&cols.q[i * Q8_QK], blocks[i].qs, Q8_QK);
        cols.d[i] = ggml_fp16_to_fp32(blocks[i].d);
        int32_t sum = 0;
        for (int8_t v : blocks[i].qs) sum += v;
        cols.offset[i] = -128 * sum;
    }
}

// Below this many columns the repacking costs more than the dot products it speeds up (on
// the talker's matrices).
constexpr int64_t MIN_COLUMNS = 8;
constexpr int64_t TASKS_PER_THREAD = 4;
constexpr int64_t PACKED_TASKS_PER_THREAD = 2;

// A packed matrix's panel of nb blocks: the bytes of its R rows, its words first, then its
// scales.
constexpr int64_t panel_bytes(int64_t nb) { return R * nb * (int64_t)sizeof(Q8Block); }
constexpr int64_t scales_at(int64_t nb) { return nb * Q8_GROUPS * R * (int64_t)sizeof(uint32_t); }

}  // namespace

// The bytes of the L3 cache the first CPU uses, as the kernel reports it (sysfs: one cache
// instance, the one its CPUs share), else as glibc does (from CPUID), once; 0 where neither
// says. sysfs first: glibc 2.36 reads AMD's L3 from CPUID leaf 0x80000006, which on a 2-vCPU
// EPYC guest gave 320 MB, where leaf 0x8000001D (the kernel's) gives the 32 MB its vCPUs share.
int64_t last_level_cache_bytes() {
    static const int64_t bytes = [] {
#if defined(__linux__)
        std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index3/size");
        int64_t value = 0;
        char unit = 0;
        if (in >> value) {
            in >> unit;
            return value * (unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : 1);
        }
#if defined(_SC_LEVEL3_CACHE_SIZE)
        const long size = sysconf(_SC_LEVEL3_CACHE_SIZE);
        if (size > 0) return (int64_t)size;
#endif
#endif
        return (int64_t)0;
    }();
    return bytes;
}

bool q8_gemm_pays(int64_t n) { return path() != Path::portable && n >= MIN_COLUMNS; }

void q8_gemm(const void *w, int64_t w_row_bytes, int64_t M, int64_t K, const void *x, int64_t n,
             float *y, WorkerPool *pool) {
    GGML_ASSERT(K % Q8_QK == 0 && n >= 1);
    const Path p = path();
    Q8Columns cols;
    unpack_columns(x, n, K, cols);
    const int64_t n_panels = M / R;
    if (n_panels == 0) return;
    const int64_t n_tasks = std::min<int64_t>(n_panels, TASKS_PER_THREAD * pool->n_threads());
    const int64_t per_task = (n_panels + n_tasks - 1) / n_tasks;
    const auto *wd = static_cast<const char *>(w);
    pool->run(n_tasks, [&](int64_t t) {
        thread_local Q8Panel panel_buffer;
        thread_local std::vector<float> out_buffer;
        Q8Panel &panel = panel_buffer;
        std::vector<float> &out = out_buffer;
        out.resize(n * R);
        const int64_t end = std::min(n_panels, (t + 1) * per_task);
        for (int64_t i = t * per_task; i < end; ++i) {
            panel.q.resize(cols.nb * Q8_GROUPS * R);
            panel.d.resize(cols.nb * R);
            pack(p, panel.q.data(), panel.d.data(), wd + i * R * w_row_bytes, w_row_bytes, cols.nb,
                 p == Path::vnni);
            // The next panel's rows (one contiguous range) come from memory while this one
            // computes: its rows are too short (~1-3 KB) for the hardware prefetchers to start.
            if (i + 1 < end) {
                const char *next = wd + (i + 1) * R * w_row_bytes;
                for (int64_t at = 0; at < R * w_row_bytes; at += 64) __builtin_prefetch(next + at, 0, 2);
            }
            // Panel results land as [n][R], then go to their rows of y.
            panel_columns(p, panel.view(), cols, n, out.data(), R);
            for (int64_t j = 0; j < n; ++j)
                std::memcpy(y + j * M + i * R, &out[j * R], R * sizeof(float));
        }
    });
}

bool q8_keeps_panels(int64_t bytes) {
    if (path() == Path::portable) return false;
    if (env_is("KAZEIA_Q8_PANELS", "on")) return true;
    if (env_is("KAZEIA_Q8_PANELS", "off")) return false;
    return bytes <= last_level_cache_bytes();
}

// Panel by panel, each written where its rows were read: `w` and `out` must not overlap.
void q8_pack_matrix(const void *w, int64_t M, int64_t K, void *out) {
    GGML_ASSERT(K % Q8_QK == 0 && M % R == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0);
    const Path p = path();
    const int64_t nb = K / Q8_QK, bytes = panel_bytes(nb);
    for (int64_t i = 0; i < M / R; ++i) {
        char *at = static_cast<char *>(out) + i * bytes;
        pack(p, reinterpret_cast<uint32_t *>(at), reinterpret_cast<ggml_fp16_t *>(at + scales_at(nb)),
             static_cast<const char *>(w) + i * bytes, bytes / R, nb, p == Path::vnni);
    }
}

void q8_gemm_packed(const void *panels, int64_t M, int64_t K, const void *x, int64_t n, float *y,
                    WorkerPool *pool) {
    GGML_ASSERT(K % Q8_QK == 0 && M % R == 0 && M > 0 && n >= 1);
    const Path p = path();
    // The caller's, read by the pool's threads while the caller waits in pool->run.
    thread_local Q8Columns cols_of_thread;
    Q8Columns &cols = cols_of_thread;
    unpack_columns(x, n, K, cols);
    const int64_t nb = cols.nb, n_panels = M / R, bytes = panel_bytes(nb);
    // Few long tasks, each a contiguous run of panels: one sequential stream, whose next panel
    // the x86 kernels ask for ahead (two a thread, so that a preempted thread's share is taken
    // over).
    const int64_t n_tasks =
        std::min<int64_t>(n_panels, PACKED_TASKS_PER_THREAD * pool->n_threads());
    const int64_t per_task = (n_panels + n_tasks - 1) / n_tasks;
    const auto *base = static_cast<const char *>(panels);
    pool->run(n_tasks, [&](int64_t t) {
        const int64_t end = std::min(n_panels, (t + 1) * per_task);
        for (int64_t i = t * per_task; i < end; ++i) {
            const char *at = base + i * bytes;
            const Q8PanelView view{reinterpret_cast<const uint32_t *>(at),
                                   reinterpret_cast<const ggml_fp16_t *>(at + scales_at(nb)),
                                   i + 1 < end ? at + bytes : nullptr};
            panel_columns(p, view, cols, n, y + i * R, M);
        }
    });
}

const char *q8_gemm_isa() {
    switch (path()) {
        case Path::vnni: return "AVX-512 VNNI";
        case Path::avx2: return "AVX2";
        case Path::dotprod: return "NEON dot product";
        default: return "portable";
    }
}

}  // namespace kazeia
