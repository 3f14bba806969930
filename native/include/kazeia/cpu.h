// Which of ggml's CPU kernels this process runs (start banners, benches), and whether this CPU
// can run the build at all.
#pragma once

#include <string>
#include <vector>

namespace kazeia {

// "haswell", "sse42", ... when ggml ships one CPU library per instruction-set level and the
// best for this CPU was loaded; "linked" for a ggml with a single CPU library.
std::string cpu_variant();
// The instruction sets ggml's CPU kernels use here ("avx2", "f16c", "neon", ...).
std::vector<std::string> cpu_features();
// What this CPU lacks of the floor the build needs, by name ("SSE4.2", ...; empty: none). On
// x86-64 the floor is x86-64-v2 (SSSE3, SSE4.1, SSE4.2, POPCNT): numpy's baseline; this check is
// itself baseline code (CPUID), so it can answer on any CPU. AArch64 has NEON by definition.
std::vector<std::string> missing_cpu_features();

}  // namespace kazeia
