#include "ops.h"

#include <algorithm>
#include <cstdint>

namespace kazeia {

namespace {

// sin^2 through a Cody-Waite reduction by pi/2 and Cephes' single-precision polynomials on
// [-pi/4, pi/4]. Branch-free so that the compiler vectorizes the channel loop; libm's sinf,
// which ggml_sin calls per element, costs ~10x more and the vocoder evaluates ~35 M per
// second of audio. Accurate to a few ulp for |x| < 1e5 (sign is irrelevant once squared).
inline float sin2(float x) {
    const float k = static_cast<float>(static_cast<int32_t>(x * 0.636619772367581f +
                                                            (x >= 0.0f ? 0.5f : -0.5f)));
    const float r = ((x - k * 1.5703125f) - k * 4.837512969970703125e-4f) -
                    k * 7.54978995489188216e-8f;
    const float z = r * r;
    const float s = ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * z * r + r;
    const float c =
        ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f) * z * z -
        0.5f * z + 1.0f;
    const bool odd = (static_cast<int32_t>(k) & 1) != 0;
    const float v = odd ? c : s;
    return v * v;
}

void snake_kernel(ggml_tensor *dst, const ggml_tensor *x, const ggml_tensor *alpha,
                  const ggml_tensor *inv_beta, int ith, int nth, void * /*userdata*/) {
    const int64_t channels = x->ne[0];
    const int64_t columns = ggml_nrows(x);
    const int64_t per_thread = (columns + nth - 1) / nth;
    const int64_t begin = std::min<int64_t>(columns, per_thread * ith);
    const int64_t end = std::min<int64_t>(columns, begin + per_thread);
    const auto *a = static_cast<const float *>(alpha->data);
    const auto *ib = static_cast<const float *>(inv_beta->data);
    for (int64_t t = begin; t < end; ++t) {
        const auto *in = reinterpret_cast<const float *>(static_cast<const char *>(x->data) +
                                                         t * x->nb[1]);
        auto *out = reinterpret_cast<float *>(static_cast<char *>(dst->data) + t * dst->nb[1]);
        for (int64_t c = 0; c < channels; ++c) out[c] = in[c] + ib[c] * sin2(a[c] * in[c]);
    }
}

}  // namespace

float sin_squared(float x) { return sin2(x); }

ggml_tensor *snake_beta(ggml_context *ctx, ggml_tensor *x, ggml_tensor *alpha,
                        ggml_tensor *inv_beta) {
    GGML_ASSERT(x->type == GGML_TYPE_F32 && ggml_is_contiguous(x));
    GGML_ASSERT(alpha->ne[0] == x->ne[0] && inv_beta->ne[0] == x->ne[0]);
    return ggml_map_custom3(ctx, x, alpha, inv_beta, snake_kernel, GGML_N_TASKS_MAX, nullptr);
}

}  // namespace kazeia
