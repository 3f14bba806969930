#include "q8_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ggml.h"

// One vector path per instruction set, compiled function by function for it and run only
// where the CPU has it (the file itself stays baseline), as in ops/.
#if defined(__x86_64__)
#include <immintrin.h>
#define KAZEIA_Q8_X86 1
#define KAZEIA_AVX2_FN __attribute__((target("avx2,f16c")))
#define KAZEIA_VNNI_FN __attribute__((target("avx2,f16c,avx512f,avx512vl,avx512vnni")))
#elif defined(__aarch64__)
#include <arm_neon.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>
#define KAZEIA_Q8_ARM 1
#define KAZEIA_DOTPROD_FN __attribute__((target("arch=armv8.2-a+dotprod")))
#endif

namespace kazeia {

namespace {

// ggml's block_q8_0 (ggml-common.h is not installed): 32 weights and their fp16 scale.
constexpr int64_t QK = 32;
struct BlockQ8 {
    ggml_fp16_t d;
    int8_t qs[QK];
};
static_assert(sizeof(BlockQ8) == 34, "block_q8_0 is an fp16 scale and 32 int8");

constexpr int64_t R = Q8_GEMM_ROWS;
constexpr int64_t GROUPS = QK / 4;  // 4-byte groups per block: one integer dot each
constexpr int MAX_COLS = 8;          // columns a micro-kernel holds in registers

enum class Path { portable, avx2, vnni, dotprod };

Path detect_path() {
    const char *forced = std::getenv("KAZEIA_KERNELS");
    if (forced && std::strcmp(forced, "portable") == 0) return Path::portable;
#if KAZEIA_Q8_X86
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("f16c")) return Path::portable;
    if (forced && std::strcmp(forced, "avx2") == 0) return Path::avx2;
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl")) return Path::vnni;
    return Path::avx2;
#elif KAZEIA_Q8_ARM
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) ? Path::dotprod : Path::portable;
#else
    return Path::portable;
#endif
}

Path path() {
    static const Path p = detect_path();
    return p;
}

// The activations, unpacked once per product: int8 values [n][K], scales [n][K/32] and, for the
// VNNI path (unsigned x signed products), -128 * the sum of each block.
struct Columns {
    int64_t K = 0, nb = 0;
    std::vector<int8_t> q;
    std::vector<float> d;
    std::vector<int32_t> offset;
    int32_t word(int64_t j, int64_t b, int64_t g) const {
        int32_t v;
        std::memcpy(&v, &q[j * K + b * QK + g * 4], 4);
        return v;
    }
};

// 8 weight rows repacked: word (b, g, r) holds bytes 4g..4g+3 of row r's block b, so that one
// 32-bit lane is one row; `flip` adds 128 to every byte (the VNNI path's unsigned operand).
struct Panel {
    std::vector<uint32_t> q;  // [nb][GROUPS][R]
    std::vector<float> d;     // [nb][R]

    void pack(const char *w, int64_t w_row_bytes, int64_t nb, bool flip);
    void pack_portable(const char *w, int64_t w_row_bytes, int64_t nb, bool flip) {
        const uint32_t mask = flip ? 0x80808080u : 0u;
        for (int64_t r = 0; r < R; ++r) {
            const auto *row = reinterpret_cast<const BlockQ8 *>(w + r * w_row_bytes);
            for (int64_t b = 0; b < nb; ++b) {
                d[b * R + r] = ggml_fp16_to_fp32(row[b].d);
                for (int64_t g = 0; g < GROUPS; ++g) {
                    uint32_t v;
                    std::memcpy(&v, row[b].qs + g * 4, 4);
                    q[(b * GROUPS + g) * R + r] = v ^ mask;
                }
            }
        }
    }
};

#if KAZEIA_Q8_X86
// The same repacking as one 8 x 8 transpose of 32-bit words per block.
KAZEIA_AVX2_FN void pack_avx2(Panel &p, const char *w, int64_t w_row_bytes, int64_t nb, bool flip) {
    const __m256i mask = _mm256_set1_epi32(flip ? (int)0x80808080u : 0);
    const BlockQ8 *rows[R];
    for (int64_t r = 0; r < R; ++r) rows[r] = reinterpret_cast<const BlockQ8 *>(w + r * w_row_bytes);
    auto *out = reinterpret_cast<__m256i *>(p.q.data());
    for (int64_t b = 0; b < nb; ++b) {
        __m256i v[R];
        for (int64_t r = 0; r < R; ++r)
            v[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(rows[r][b].qs));
        __m256i t[R], u[R];
        for (int64_t i = 0; i < R; i += 2) {
            t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
            t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
        }
        for (int64_t i = 0; i < R; i += 4) {
            u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
            u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
            u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
            u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
        }
        // u[g] (g < 4) holds group g of rows 0-3 in its low half and group g + 4 in its high
        // half; u[g + 4] the same for rows 4-7.
        for (int64_t g = 0; g < 4; ++g) {
            _mm256_storeu_si256(out + b * GROUPS + g,
                                _mm256_xor_si256(_mm256_permute2x128_si256(u[g], u[g + 4], 0x20), mask));
            _mm256_storeu_si256(out + b * GROUPS + g + 4,
                                _mm256_xor_si256(_mm256_permute2x128_si256(u[g], u[g + 4], 0x31), mask));
        }
        alignas(16) uint16_t scales[R];
        for (int64_t r = 0; r < R; ++r) std::memcpy(&scales[r], &rows[r][b].d, 2);
        _mm256_storeu_ps(&p.d[b * R], _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i *>(scales))));
    }
}
#endif

void Panel::pack(const char *w, int64_t w_row_bytes, int64_t nb, bool flip) {
    q.resize(nb * GROUPS * R);
    d.resize(nb * R);
#if KAZEIA_Q8_X86
    if (path() == Path::avx2 || path() == Path::vnni) return pack_avx2(*this, w, w_row_bytes, nb, flip);
#endif
    pack_portable(w, w_row_bytes, nb, flip);
}

// out[r] = sum_b (float)isum(r, b) * (d_w(r, b) * d_x(j, b)), summed in block order: the
// reference every vector path reproduces bit for bit.
void panel_portable(const Panel &p, const Columns &x, int64_t j0, int cols, float *y, int64_t M) {
    for (int c = 0; c < cols; ++c) {
        const int64_t j = j0 + c;
        float acc[R] = {};
        for (int64_t b = 0; b < x.nb; ++b) {
            int32_t isum[R] = {};
            const int8_t *xq = &x.q[j * x.K + b * QK];
            for (int64_t g = 0; g < GROUPS; ++g) {
                for (int64_t r = 0; r < R; ++r) {
                    int8_t w[4];
                    std::memcpy(w, &p.q[(b * GROUPS + g) * R + r], 4);
                    for (int i = 0; i < 4; ++i) isum[r] += (int32_t)w[i] * xq[g * 4 + i];
                }
            }
            const float dx = x.d[j * x.nb + b];
            for (int64_t r = 0; r < R; ++r) acc[r] += (float)isum[r] * (p.d[b * R + r] * dx);
        }
        std::memcpy(y + j * M, acc, sizeof(acc));
    }
}

#if KAZEIA_Q8_X86
// Unsigned weights (+128) times signed activations, 4 bytes per lane per instruction; the
// accumulator starts at -128 * the block's activation sum, which makes the sum exact.
template <int C>
KAZEIA_VNNI_FN void panel_vnni(const Panel &p, const Columns &x, int64_t j0, float *y, int64_t M) {
    __m256 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < x.nb; ++b) {
        __m256i isum[C];
        for (int c = 0; c < C; ++c) isum[c] = _mm256_set1_epi32(x.offset[(j0 + c) * x.nb + b]);
        const auto *wq = reinterpret_cast<const __m256i *>(&p.q[b * GROUPS * R]);
        for (int64_t g = 0; g < GROUPS; ++g) {
            const __m256i w = _mm256_loadu_si256(wq + g);
            for (int c = 0; c < C; ++c)
                isum[c] = _mm256_dpbusd_epi32(isum[c], w, _mm256_set1_epi32(x.word(j0 + c, b, g)));
        }
        const __m256 dw = _mm256_loadu_ps(&p.d[b * R]);
        for (int c = 0; c < C; ++c) {
            const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(x.d[(j0 + c) * x.nb + b]));
            acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(_mm256_cvtepi32_ps(isum[c]), s));
        }
    }
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(y + (j0 + c) * M, acc[c]);
}

// Signed x signed through maddubs: |x| times w with x's sign (no pair can saturate: q8_0 values
// are within +-127), pairs widened to 32 bits by a multiply-add with ones.
template <int C>
KAZEIA_AVX2_FN void panel_avx2(const Panel &p, const Columns &x, int64_t j0, float *y, int64_t M) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < x.nb; ++b) {
        __m256i isum[C];
        for (int c = 0; c < C; ++c) isum[c] = _mm256_setzero_si256();
        const auto *wq = reinterpret_cast<const __m256i *>(&p.q[b * GROUPS * R]);
        for (int64_t g = 0; g < GROUPS; ++g) {
            const __m256i w = _mm256_loadu_si256(wq + g);
            for (int c = 0; c < C; ++c) {
                const __m256i xv = _mm256_set1_epi32(x.word(j0 + c, b, g));
                const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(xv), _mm256_sign_epi8(w, xv));
                isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(pairs, ones));
            }
        }
        const __m256 dw = _mm256_loadu_ps(&p.d[b * R]);
        for (int c = 0; c < C; ++c) {
            const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(x.d[(j0 + c) * x.nb + b]));
            acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(_mm256_cvtepi32_ps(isum[c]), s));
        }
    }
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(y + (j0 + c) * M, acc[c]);
}
#endif

#if KAZEIA_Q8_ARM
// Signed x signed dot products, 4 rows per register: lanes 0-3 and 4-7 of the panel.
template <int C>
KAZEIA_DOTPROD_FN void panel_dotprod(const Panel &p, const Columns &x, int64_t j0, float *y,
                                     int64_t M) {
    float32x4_t lo[C], hi[C];
    for (int c = 0; c < C; ++c) lo[c] = hi[c] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < x.nb; ++b) {
        int32x4_t ilo[C], ihi[C];
        for (int c = 0; c < C; ++c) ilo[c] = ihi[c] = vdupq_n_s32(0);
        const auto *wq = reinterpret_cast<const int8_t *>(&p.q[b * GROUPS * R]);
        for (int64_t g = 0; g < GROUPS; ++g) {
            const int8x16_t wlo = vld1q_s8(wq + g * 32), whi = vld1q_s8(wq + g * 32 + 16);
            for (int c = 0; c < C; ++c) {
                const int8x16_t xv = vreinterpretq_s8_s32(vdupq_n_s32(x.word(j0 + c, b, g)));
                ilo[c] = vdotq_s32(ilo[c], wlo, xv);
                ihi[c] = vdotq_s32(ihi[c], whi, xv);
            }
        }
        const float32x4_t dlo = vld1q_f32(&p.d[b * R]), dhi = vld1q_f32(&p.d[b * R + 4]);
        for (int c = 0; c < C; ++c) {
            const float dx = x.d[(j0 + c) * x.nb + b];
            lo[c] = vaddq_f32(lo[c], vmulq_f32(vcvtq_f32_s32(ilo[c]), vmulq_n_f32(dlo, dx)));
            hi[c] = vaddq_f32(hi[c], vmulq_f32(vcvtq_f32_s32(ihi[c]), vmulq_n_f32(dhi, dx)));
        }
    }
    for (int c = 0; c < C; ++c) {
        vst1q_f32(y + (j0 + c) * M, lo[c]);
        vst1q_f32(y + (j0 + c) * M + 4, hi[c]);
    }
}
#endif

// A vector path's micro-kernels, by column count - 1 (1..MAX_COLS columns of one panel).
using PanelKernel = void (*)(const Panel &, const Columns &, int64_t, float *, int64_t);
#define KAZEIA_BY_COLS(kernel) \
    {kernel<1>, kernel<2>, kernel<3>, kernel<4>, kernel<5>, kernel<6>, kernel<7>, kernel<8>}
#if KAZEIA_Q8_X86
constexpr PanelKernel VNNI_KERNELS[MAX_COLS] = KAZEIA_BY_COLS(panel_vnni);
constexpr PanelKernel AVX2_KERNELS[MAX_COLS] = KAZEIA_BY_COLS(panel_avx2);
#endif
#if KAZEIA_Q8_ARM
constexpr PanelKernel DOTPROD_KERNELS[MAX_COLS] = KAZEIA_BY_COLS(panel_dotprod);
#endif
#undef KAZEIA_BY_COLS

// All n columns of one panel, MAX_COLS at a time, on this CPU's path.
void panel_columns(Path path, const Panel &p, const Columns &x, int64_t n, float *y, int64_t M) {
    const PanelKernel *kernels = nullptr;  // the portable loop takes any column count
#if KAZEIA_Q8_X86
    if (path == Path::vnni) kernels = VNNI_KERNELS;
    if (path == Path::avx2) kernels = AVX2_KERNELS;
#endif
#if KAZEIA_Q8_ARM
    if (path == Path::dotprod) kernels = DOTPROD_KERNELS;
#endif
    for (int64_t j0 = 0; j0 < n; j0 += MAX_COLS) {
        const int cols = (int)std::min<int64_t>(MAX_COLS, n - j0);
        if (kernels) kernels[cols - 1](p, x, j0, y, M);
        else panel_portable(p, x, j0, cols, y, M);
    }
}

void unpack_columns(const void *x, int64_t n, int64_t K, Columns &cols) {
    cols.K = K;
    cols.nb = K / QK;
    cols.q.resize(n * K);
    cols.d.resize(n * cols.nb);
    cols.offset.resize(n * cols.nb);
    const auto *blocks = static_cast<const BlockQ8 *>(x);
    for (int64_t i = 0; i < n * cols.nb; ++i) {
        std::memcpy(&cols.q[i * QK], blocks[i].qs, QK);
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

}  // namespace

bool q8_gemm_pays(int64_t n) { return path() != Path::portable && n >= MIN_COLUMNS; }

void q8_gemm(const void *w, int64_t w_row_bytes, int64_t M, int64_t K, const void *x, int64_t n,
             float *y, WorkerPool *pool) {
    GGML_ASSERT(K % QK == 0 && n >= 1);
    const Path p = path();
    Columns cols;
    unpack_columns(x, n, K, cols);
    const int64_t n_panels = M / R;
    if (n_panels == 0) return;
    const int64_t n_tasks = std::min<int64_t>(n_panels, TASKS_PER_THREAD * pool->n_threads());
    const int64_t per_task = (n_panels + n_tasks - 1) / n_tasks;
    const auto *wd = static_cast<const char *>(w);
    pool->run(n_tasks, [&](int64_t t) {
        thread_local Panel panel_buffer;
        thread_local std::vector<float> out_buffer;
        Panel &panel = panel_buffer;
        std::vector<float> &out = out_buffer;
        out.resize(n * R);
        const int64_t end = std::min(n_panels, (t + 1) * per_task);
        for (int64_t i = t * per_task; i < end; ++i) {
            panel.pack(wd + i * R * w_row_bytes, w_row_bytes, cols.nb, p == Path::vnni);
            // The next panel's rows (one contiguous range) come from memory while this one
            // computes: its rows are too short (~1-3 KB) for the hardware prefetchers to start.
            if (i + 1 < end) {
                const char *next = wd + (i + 1) * R * w_row_bytes;
                for (int64_t at = 0; at < R * w_row_bytes; at += 64) __builtin_prefetch(next + at, 0, 2);
            }
            // Panel results land as [n][R], then go to their rows of y.
            panel_columns(p, panel, cols, n, out.data(), R);
            for (int64_t j = 0; j < n; ++j)
                std::memcpy(y + j * M + i * R, &out[j * R], R * sizeof(float));
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
