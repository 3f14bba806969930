// Which of ggml's CPU kernels this process runs (start banners, benches).
#pragma once

#include <string>
#include <vector>

namespace kazeia {

// "haswell", "sse42", ... when ggml ships one CPU library per instruction-set level and the
// best for this CPU was loaded; "linked" for a ggml with a single CPU library.
std::string cpu_variant();
// The instruction sets ggml's CPU kernels use here ("avx2", "f16c", "neon", ...).
std::vector<std::string> cpu_features();

}  // namespace kazeia
