// The instruction-set plumbing of the custom kernels (src/ops/): which vector paths this build
// has, the run-time choice among them, and how an op splits its work.
#pragma once

#include <cstdint>

#include "env_switch.h"
#include "worker_pool.h"

// One vector path per instruction set, in ops/x86/ and ops/arm/ (declared in ops/arch.h). On
// x86-64 the AVX2/FMA/F16C, AVX-512 and AMX paths are compiled for those instructions function
// by function (KAZEIA_AVX2_FN, KAZEIA_AVX512_FN, KAZEIA_AMX_FN) and run only where the CPU has
// them (use_avx2, use_avx512, use_amx, checked once): everything else stays baseline x86-64,
// so a CPU without AVX2 never meets an instruction it lacks and runs the portable loops. Never
// file by file (-mavx2): an inline function of a header compiled there may be the copy the
// linker keeps for every caller. On aarch64 the NEON paths (every AArch64 CPU has NEON, with fp16 conversion) are chosen when
// compiling.
#if defined(__x86_64__)
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <cpuid.h>

#include <cstdlib>
#include <cstring>
#define KAZEIA_AVX2 1
#define KAZEIA_AVX2_FN __attribute__((target("avx2,fma,f16c")))
#define KAZEIA_AVX512_FN __attribute__((target("avx512f,avx2,fma,f16c")))
// The decoder GEMM's bf16 products on AMX tiles (ops/x86/conv_gemm_amx.cpp), chosen at run
// time as the others are (use_amx).
#define KAZEIA_AMX_FN __attribute__((target("amx-tile,amx-bf16,avx512f,avx2,fma,f16c")))
// The same products on AVX-512 BF16's pair dot products (ops/x86/conv_gemm_bf16.cpp), chosen
// at run time too (use_avx512_bf16).
#define KAZEIA_AVX512_BF16_FN __attribute__((target("avx512bf16,avx512f,avx2,fma,f16c")))
// The q8_0 GEMM's paths (AVX2, AVX-512 VNNI), chosen at run time by ops/q8_gemm.cpp. No FMA
// among their instructions: their float steps stay separate multiplies and adds.
#define KAZEIA_Q8_AVX2_FN __attribute__((target("avx2,f16c")))
#define KAZEIA_Q8_VNNI_FN __attribute__((target("avx2,f16c,avx512f,avx512vl,avx512vnni")))
// The q8_0 dot product's VNNI path (ggml's bits: with its fused multiply-adds).
#define KAZEIA_Q8_DOT_VNNI_FN __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define KAZEIA_NEON 1
// The q8_0 GEMM's dot-product path: not every AArch64 CPU has the instructions, so it is
// compiled function by function for them and chosen at run time (ops/q8_gemm.cpp).
#define KAZEIA_DOTPROD_FN __attribute__((target("arch=armv8.2-a+dotprod")))
#endif

namespace kazeia {

#if KAZEIA_AVX2
// Whether this CPU runs the AVX2 paths; KAZEIA_KERNELS=portable forces the portable loops
// (tests compare the two).
inline bool use_avx2() {
    static const bool yes = [] {
        if (env_is("KAZEIA_KERNELS", "portable")) return false;
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    }();
    return yes;
}

// Whether the decoder's GEMM runs up to CONV_MAX_PANELS panels at a time in AVX-512 registers
// (the same bits as the AVX2 path: see panels_kernel_avx512); KAZEIA_KERNELS=avx2 forces the
// AVX2 path.
inline bool use_avx512() {
    static const bool yes = [] {
        if (env_is("KAZEIA_KERNELS", "portable") || env_is("KAZEIA_KERNELS", "avx2")) return false;
        return use_avx2() && __builtin_cpu_supports("avx512f");
    }();
    return yes;
}

// Whether the q8_0 kernels (the GEMM and the dot product over rows) take their AVX-512 VNNI
// paths: the CPU has AVX-512 VNNI and VL, unless KAZEIA_KERNELS is set to avx2 or portable.
// Each caller checks first the AVX2 instructions its own path needs besides.
inline bool avx512_vnni_on_cpu() {
    static const bool yes = [] {
        if (env_is("KAZEIA_KERNELS", "portable") || env_is("KAZEIA_KERNELS", "avx2")) return false;
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
    }();
    return yes;
}

// Whether this CPU has the AMX-BF16 tiles the decoder's bf16 products would run on, unless
// KAZEIA_KERNELS is set to avx512bf16, avx512, avx2 or portable; asks nothing of the system
// (use_amx does).
inline bool amx_on_cpu() {
    static const bool yes = [] {
        if (env_is("KAZEIA_KERNELS", "portable") || env_is("KAZEIA_KERNELS", "avx2") ||
            env_is("KAZEIA_KERNELS", "avx512") || env_is("KAZEIA_KERNELS", "avx512bf16"))
            return false;
        return use_avx512() && __builtin_cpu_supports("amx-bf16") &&
               __builtin_cpu_supports("amx-tile");
    }();
    return yes;
}

// Whether this CPU is AMD's, or Hygon's (AMD's Zen cores), by the vendor string of CPUID leaf 0
// (EBX, EDX, ECX): where the two vendors' cores differ in what is fastest, as measured.
inline bool amd_cpu() {
    static const bool yes = [] {
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        char vendor[13] = {};
        if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
        std::memcpy(vendor, &ebx, 4);
        std::memcpy(vendor + 4, &edx, 4);
        std::memcpy(vendor + 8, &ecx, 4);
        return std::strcmp(vendor, "AuthenticAMD") == 0 ||
               std::strcmp(vendor, "HygonGenuine") == 0;
    }();
    return yes;
}

// Whether the decoder's bf16 products (DecoderPrecision::BF16) that AMX does not take run on
// AVX-512 BF16's pair dot products: an AMD CPU with AVX512_BF16, unless KAZEIA_KERNELS is set
// to avx512, avx2 or portable. Intel's CPUs without AMX keep the path that widens bf16 to f32:
// with AMX set aside, an Intel Xeon ran it faster than an earlier version of this path
// (docs/hardware.md). KAZEIA_KERNELS=avx512bf16 takes this path on any CPU with the
// instructions, setting AMX aside (tests and benches compare).
inline bool use_avx512_bf16() {
    static const bool yes = [] {
        if (env_is("KAZEIA_KERNELS", "avx512") || !use_avx512() ||
            !__builtin_cpu_supports("avx512bf16"))
            return false;
        return amd_cpu() || env_is("KAZEIA_KERNELS", "avx512bf16");
    }();
    return yes;
}

// Whether the decoder's bf16 products (DecoderPrecision::BF16) run on AMX tiles: the CPU has
// AMX-BF16 and Linux lets this process use the tile registers. A process asks once, before its
// first tile instruction (without the permission that instruction is a SIGILL), and only when
// it first packs bf16 weights or names their path: an f32 process never asks (a process that
// has the permission needs larger signal stacks). Elsewhere, and with KAZEIA_KERNELS set to
// avx512bf16, avx512, avx2 or portable, AVX-512 BF16 (use_avx512_bf16), the vector or the
// portable loops multiply the same bf16 values.
inline bool use_amx() {
    static const bool yes = [] {
        if (!amx_on_cpu()) return false;
#if defined(__linux__)
        constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
        return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
        return false;  // how another system grants the tiles is not known here
#endif
    }();
    return yes;
}
#else
// No run-time choice elsewhere: the NEON paths on aarch64, the portable loops on the rest.
constexpr bool use_avx2() { return false; }
constexpr bool use_avx512() { return false; }
constexpr bool avx512_vnni_on_cpu() { return false; }
constexpr bool amx_on_cpu() { return false; }
constexpr bool use_avx512_bf16() { return false; }
constexpr bool amd_cpu() { return false; }  // x86-64's vendors only
constexpr bool use_amx() { return false; }
#endif

// Runs task(0..n_tasks) for a custom op: on `pool` when the op has one (called from a
// one-thread ggml graph: its thread 0 hands the tasks to the pool), else split by ggml's
// own threads.
template <typename Task>
void run_tasks(WorkerPool *pool, int ith, int nth, int64_t n_tasks, const Task &task) {
    if (pool) {
        if (ith == 0) pool->run(n_tasks, task);
        return;
    }
    for (int64_t t = ith; t < n_tasks; t += nth) task(t);
}

}  // namespace kazeia
