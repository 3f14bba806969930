// ggml's q8_0 dot product on x86-64, Q8_DOT_ROWS weight rows at a time (the matrix-vector
// products of generation, ops/pool_mul_mat.cpp). Each row gets the vector operations of ggml's
// AVX2 dot product, lane for lane: exact integer sums of 4 products per lane, one fused
// multiply-add per block with the product of the two scales, then ggml's horizontal sum: the
// same bits. ggml runs one row's chain of multiply-adds at a time, and every block waits for the
// previous one's; here the rows' chains are independent, so the core computes while one waits,
// and the activations' block is loaded once for all the rows.
//
// The rows come from Q8_DOT_ROWS streams far apart (ops/pool_mul_mat.cpp; 4 neighbouring rows
// read side by side confuse the hardware prefetchers of AMD CPUs: a third of the speed). Each
// call asks for the next row of each stream (`next`) a cache line per block, faster than it
// reads its own rows, so that they are in the cache when the next call starts. The hint is T1
// (into the L2), not T0 (the L1 as well): faster on the Zen 4 measured, likely because T0's
// prefetches take the L1's few miss slots from the loads of the current rows (docs/hardware.md,
// CPUs).
#include "ops/arch.h"

#if KAZEIA_AVX2
#include <immintrin.h>

#include "ops/x86/hsum.h"

namespace kazeia::x86 {

namespace {

constexpr int R = Q8_DOT_ROWS;

KAZEIA_AVX2_FN inline __m256i load_qs(const Q8Block &b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.qs));
}

// At block b of nb: cache line b of each next row (a row of nb blocks has fewer lines).
KAZEIA_AVX2_FN inline void prefetch_line(const Q8Block *const next[R], int64_t b, int64_t nb) {
    if (b * 64 >= nb * (int64_t)sizeof(Q8Block)) return;
    for (int r = 0; r < R; ++r)
        if (next[r]) _mm_prefetch(reinterpret_cast<const char *>(next[r]) + b * 64, _MM_HINT_T1);
}

// One block of row r into its chain: acc += (d_w * d_x) * (float)lane sums, fused.
KAZEIA_AVX2_FN inline __m256 add_block(__m256 acc, __m256i sums, ggml_fp16_t dw, float dx) {
    return _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(dw) * dx), _mm256_cvtepi32_ps(sums), acc);
}

}  // namespace

KAZEIA_AVX2_FN void q8_dot_rows_avx2(const Q8Block *const w[Q8_DOT_ROWS],
                                     const Q8Block *const next[Q8_DOT_ROWS],
                                     const Q8Block *x, int64_t nb, float y[Q8_DOT_ROWS]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        prefetch_line(next, b, nb);
        const __m256i qx = load_qs(x[b]);
        const float dx = _cvtsh_ss(x[b].d);
        for (int r = 0; r < R; ++r) {
            const __m256i qw = load_qs(w[r][b]);
            // |w| times x with w's sign (no pair can saturate: q8_0 values are within +-127).
            const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
            acc[r] = add_block(acc[r], _mm256_madd_epi16(pairs, ones), w[r][b].d, dx);
        }
    }
    for (int r = 0; r < R; ++r) y[r] = hsum(acc[r]);
}

// The same lane sums from unsigned weights (+128) times signed activations: each lane starts
// at -128 * the sum of its 4 activations, which makes it exact.
KAZEIA_Q8_DOT_VNNI_FN void q8_dot_rows_vnni(const Q8Block *const w[Q8_DOT_ROWS],
                                            const Q8Block *const next[Q8_DOT_ROWS],
                                            const Q8Block *x, int64_t nb, float y[Q8_DOT_ROWS]) {
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        prefetch_line(next, b, nb);
        const __m256i qx = load_qs(x[b]);
        const __m256i offset = _mm256_sub_epi32(_mm256_setzero_si256(),
                                                _mm256_dpbusd_epi32(_mm256_setzero_si256(), flip, qx));
        const float dx = _cvtsh_ss(x[b].d);
        for (int r = 0; r < R; ++r) {
            const __m256i qw = _mm256_xor_si256(load_qs(w[r][b]), flip);
            acc[r] = add_block(acc[r], _mm256_dpbusd_epi32(offset, qw, qx), w[r][b].d, dx);
        }
    }
    for (int r = 0; r < R; ++r) y[r] = hsum(acc[r]);
}

}  // namespace kazeia::x86

#endif  // KAZEIA_AVX2
