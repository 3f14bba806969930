// ggml's CPU backend as a table of functions. A ggml built with one CPU library (the PyPI
// wheel: AVX2 on x86-64) is linked; a ggml built with GGML_BACKEND_DL and
// GGML_CPU_ALL_VARIANTS ships one CPU library per instruction-set level (x64/sse42 up to
// AVX-512): the best one this CPU runs is loaded at first use (its ggml_backend_score), so one
// build runs on every x86-64 CPU with the fastest kernels it can. Everything CPU-specific the
// engine calls goes through this table.
#pragma once

#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml_raii.h"

namespace kazeia {

struct CpuBackend {
    std::string variant;                // "haswell", "sse42", ...; "linked" for a single library
    std::vector<std::string> features;  // the instruction sets its kernels use ("AVX2", ...)
    ggml_backend_t (*init)() = nullptr;
    void (*set_n_threads)(ggml_backend_t, int) = nullptr;
    const ggml_type_traits_cpu *(*type_traits)(ggml_type) = nullptr;
    ggml_status (*graph_compute_with_ctx)(ggml_context *, ggml_cgraph *, int) = nullptr;
};

// The CPU backend of this process (loaded once; std::runtime_error when no variant runs here).
const CpuBackend &cpu_backend();

#if defined(KAZEIA_GGML_CPU_VARIANTS)
// The folder of our ggml libraries (the CPU variants and GPU backends are loaded from there).
std::string ggml_library_dir();
#endif

// A new CPU backend computing on one thread (the engine's graphs hand their heavy work to
// their own worker pools).
ggml_backend_t new_cpu_backend();

// A graph computed once on a CPU backend of its own with ggml's `n_threads` (the voice
// encoders, which run once per voice): allocated at construction (std::runtime_error naming
// `what` when out of memory); set its inputs, then compute().
class OneShotGraph {
  public:
    OneShotGraph(ggml_cgraph *graph, int n_threads, const char *what);
    void compute();

  private:
    ggml_cgraph *graph_;
    const char *what_;
    BackendPtr backend_;
    GallocrPtr allocr_;
};

}  // namespace kazeia
