// What the custom kernels run on this CPU (the start banner, the benches).
#include "ops.h"

#include <string>

#include "ops/isa.h"
#include "q8_gemm.h"

namespace kazeia {

const char *kernel_isa() {
#if KAZEIA_AVX2
    const char *decoder = use_avx512() ? "AVX2 FMA F16C, decoder GEMM AVX-512"
                          : use_avx2()   ? "AVX2 FMA F16C"
                                         : "portable (x86-64 baseline)";
#elif KAZEIA_NEON
    const char *decoder = "NEON (fp16 conversion)";
#else
    const char *decoder = "portable";
#endif
    static const std::string isa = std::string(decoder) + ", q8_0 prefill " + q8_gemm_isa() +
                                   ", q8_0 steps " + q8_dot_isa() + ", other rows read as " +
                                   weight_reads().name;
    return isa.c_str();
}

bool cpu_has_amx_bf16() { return amx_on_cpu(); }

const char *decoder_bf16_isa() {
    if (use_amx()) return "AMX";
    if (use_avx512_bf16()) return "AVX-512 BF16";
    if (use_avx512()) return "AVX-512";
    if (use_avx2()) return "AVX2";
#if KAZEIA_NEON
    return "NEON";
#else
    return "portable";
#endif
}

}  // namespace kazeia
