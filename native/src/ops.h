// Custom CPU operators the decoder needs and ggml lacks in fused, vectorized form.
#pragma once

#include "ggml.h"

namespace kazeia {

// SnakeBeta: y = x + inv_beta * sin(alpha * x)^2, with per-channel alpha = exp(a) and
// inv_beta = 1 / (exp(b) + 1e-9) precomputed by the converter. x is [C, T] (channel fastest).
ggml_tensor *snake_beta(ggml_context *ctx, ggml_tensor *x, ggml_tensor *alpha,
                        ggml_tensor *inv_beta);

// sin(x)^2 as the kernel computes it (exposed for tests of the approximation).
float sin_squared(float x);

}  // namespace kazeia
