// Batched products of q8_0 weights with q8_0 activations: the prefill of a prompt (a voice's
// reference frames, a sentence's text rows), where ggml's q8_0 dot product, called once per
// (row, column), is bound by its per-block arithmetic.
//
// The kernel repacks 8 weight rows at a time so that one 32-bit lane holds one row (4 bytes of
// it), and multiplies them with 4 broadcast bytes of a column: one integer dot instruction then
// serves 8 rows, and the per-block float work (int -> float, scale) is shared by the 8 rows.
// Paths: AVX-512 VNNI (VL, ymm), AVX2, NEON dot product, portable; chosen at run time
// (ops/q8_gemm.cpp, the vector paths in ops/x86/ and ops/arm/). Every path gives the same bits:
// integer sums are exact and the float steps are the same operations in the same order (no
// fused multiply-add: its files are built with -ffp-contract=off), so a prefill computes the
// same on every CPU.
#pragma once

#include <cstdint>

#include "worker_pool.h"

namespace kazeia {

// The rows of one 8-row panel of the output (the kernel's height).
inline constexpr int64_t Q8_GEMM_ROWS = 8;

// Whether q8_gemm is the faster way for n columns on this CPU (it has a vector path and n is
// large enough to repay the repacking); otherwise ggml's dot product per (row, column).
bool q8_gemm_pays(int64_t n);

// y[j * M + m] = W[m] . X[j] for m < M - M % Q8_GEMM_ROWS (the caller finishes the other rows):
// W is M rows of K / 32 q8_0 blocks (ggml's block_q8_0: an fp16 scale and 32 int8), one row
// every w_row_bytes; X is n rows of K / 32 q8_0 blocks, contiguous (what ggml's CPU backend
// makes of f32 activations for a q8_0 dot product). Runs on `pool`.
void q8_gemm(const void *w, int64_t w_row_bytes, int64_t M, int64_t K, const void *x, int64_t n,
             float *y, WorkerPool *pool);

// Whether a stack of q8_0 weight matrices (`bytes` in all) that every frame reads many times is
// worth keeping as panels (q8_pack_matrix): where q8_gemm has a vector path and the CPU's
// last-level cache can hold them. Its kernels then serve a decoding step's single column too,
// with far fewer instructions per weight than a dot product per row, which is what bounds the
// products while the weights come from the cache; read from memory, rows read as several
// prefetched streams are no slower. KAZEIA_Q8_PANELS=on or =off forces the choice (where a
// vector path exists; benches and tests compare them).
bool q8_keeps_panels(int64_t bytes);

// The bytes of the L3 cache the first CPU uses, as the kernel reports it (sysfs), else as glibc
// does; 0 where neither says.
int64_t last_level_cache_bytes();

// The bytes of a matrix of M rows of K / 32 q8_0 blocks (M % Q8_GEMM_ROWS == 0), contiguous,
// written to `out` as its panels, each in the bytes its rows took (the panel's words, then its
// scales): for q8_gemm_packed, on this CPU's path.
void q8_pack_matrix(const void *w, int64_t M, int64_t K, void *out);

// y[j * M + m] = W[m] . X[j] for all M rows of a matrix q8_pack_matrix wrote, X as for q8_gemm:
// the same bits as q8_gemm. Runs on `pool`.
void q8_gemm_packed(const void *panels, int64_t M, int64_t K, const void *x, int64_t n, float *y,
                    WorkerPool *pool);

// The path q8_gemm takes on this CPU ("AVX-512 VNNI", "AVX2", "NEON dot product", "portable").
// KAZEIA_KERNELS=portable forces the portable loops, =avx2 the AVX2 path (tests compare them).
const char *q8_gemm_isa();

}  // namespace kazeia
