#include "cpu_backend.h"

#include "kazeia/cpu.h"

#include <cstdlib>
#include <stdexcept>

#if defined(KAZEIA_GGML_CPU_VARIANTS)
#include <dirent.h>
#include <dlfcn.h>

#include <cstring>
#endif

namespace kazeia {

namespace {

#if defined(KAZEIA_GGML_CPU_VARIANTS)

// The instruction sets a variant library reports (it exports ggml_cpu_has_<name>).
const char *const FEATURES[] = {"sse3", "ssse3", "avx",  "avx2", "fma",  "f16c",
                                "avx_vnni", "avx512", "avx512_vnni", "amx_int8", "neon", "sve"};

// The variant with the best score on this CPU, or the one KAZEIA_GGML_CPU names (what an
// older CPU would load: a bench of an AVX2-only box on a newer one) where this CPU runs it.
CpuBackend load_best() {
    const std::string dir = ggml_library_dir(), prefix = "libkazeia-ggml-cpu-", suffix = ".so";
    const char *wanted = std::getenv("KAZEIA_GGML_CPU");
    const std::string only = wanted ? wanted : "";
    void *best = nullptr;
    int best_score = 0;
    std::string best_variant, names, named_problem = "is not one of them";
    if (DIR *d = opendir(dir.c_str())) {
        while (dirent *e = readdir(d)) {
            const std::string name = e->d_name;
            if (name.rfind(prefix, 0) != 0 || name.size() <= prefix.size() + suffix.size() ||
                name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
                continue;
            const std::string variant = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
            names += (names.empty() ? "" : " ") + variant;
            if (!only.empty() && variant != only) continue;
            void *h = dlopen((dir + "/" + name).c_str(), RTLD_NOW | RTLD_LOCAL);
            if (!h) {
                const char *why = dlerror();
                named_problem = std::string("cannot be loaded (") + (why ? why : "unknown error") + ")";
                continue;
            }
            auto score = reinterpret_cast<int (*)()>(dlsym(h, "ggml_backend_score"));
            const int s = score ? score() : 0;  // 0: this CPU lacks what the variant needs
            named_problem = "needs instructions this CPU lacks";  // unless it is best below
            if (s > best_score) {
                if (best) dlclose(best);
                best = h, best_score = s;
                best_variant = variant;
            } else {
                dlclose(h);
            }
        }
        closedir(d);
    }
    if (!best && !only.empty())
        throw std::runtime_error("KAZEIA_GGML_CPU=" + only + ": ggml's CPU variants in " + dir +
                                 " are " + names + "; " + only + " " + named_problem);
    if (!best) throw std::runtime_error("no ggml CPU variant in " + dir + " runs on this CPU");
    CpuBackend b;
    b.variant = best_variant;
    auto sym = [&](const char *name) {
        void *p = dlsym(best, name);
        if (!p) throw std::runtime_error(std::string("the ggml CPU variant lacks ") + name);
        return p;
    };
    b.init = reinterpret_cast<ggml_backend_t (*)()>(sym("ggml_backend_cpu_init"));
    b.set_n_threads = reinterpret_cast<void (*)(ggml_backend_t, int)>(sym("ggml_backend_cpu_set_n_threads"));
    b.type_traits = reinterpret_cast<const ggml_type_traits_cpu *(*)(ggml_type)>(sym("ggml_get_type_traits_cpu"));
    b.graph_compute_with_ctx = reinterpret_cast<ggml_status (*)(ggml_context *, ggml_cgraph *, int)>(
        sym("ggml_graph_compute_with_ctx"));
    for (const char *f : FEATURES) {
        const std::string name = std::string("ggml_cpu_has_") + f;
        auto has = reinterpret_cast<int (*)()>(dlsym(best, name.c_str()));
        if (has && has()) b.features.push_back(f);
    }
    return b;  // the library stays loaded for the life of the process
}

#else

// The instruction sets the linked CPU library reports.
struct FeatureProbe {
    const char *name;
    int (*has)();
};
const FeatureProbe LINKED_PROBES[] = {
    {"sse3", ggml_cpu_has_sse3},       {"ssse3", ggml_cpu_has_ssse3},
    {"avx", ggml_cpu_has_avx},         {"avx2", ggml_cpu_has_avx2},
    {"fma", ggml_cpu_has_fma},         {"f16c", ggml_cpu_has_f16c},
    {"avx_vnni", ggml_cpu_has_avx_vnni}, {"avx512", ggml_cpu_has_avx512},
    {"avx512_vnni", ggml_cpu_has_avx512_vnni}, {"amx_int8", ggml_cpu_has_amx_int8},
    {"neon", ggml_cpu_has_neon},       {"sve", ggml_cpu_has_sve},
};

CpuBackend load_best() {
    if (std::getenv("KAZEIA_GGML_CPU"))
        throw std::runtime_error("KAZEIA_GGML_CPU is set, but this build links one ggml CPU "
                                 "library (no variants to choose from): unset it");
    CpuBackend b;
    b.variant = "linked";
    b.init = &ggml_backend_cpu_init;
    b.set_n_threads = &ggml_backend_cpu_set_n_threads;
    b.type_traits = &ggml_get_type_traits_cpu;
    b.graph_compute_with_ctx = &ggml_graph_compute_with_ctx;
    for (const FeatureProbe &p : LINKED_PROBES)
        if (p.has()) b.features.push_back(p.name);
    return b;
}

#endif

}  // namespace

#if defined(KAZEIA_GGML_CPU_VARIANTS)
// The CPU variant libraries sit beside our ggml-base (renamed libkazeia-ggml-base.so; found by
// that soname, not by a ggml symbol, which another ggml in the process may have interposed).
std::string ggml_library_dir() {
    void *base = dlopen("libkazeia-ggml-base.so", RTLD_NOW | RTLD_NOLOAD);
    char origin[4096] = {0};
    const bool found = base && dlinfo(base, RTLD_DI_ORIGIN, origin) == 0;
    if (base) dlclose(base);  // only drops the reference RTLD_NOLOAD took
    if (!found) throw std::runtime_error("cannot locate the ggml libraries");
    return origin;
}
#endif

const CpuBackend &cpu_backend() {
    // Process-wide by nature: ggml's CPU library is loaded into the process once.
    static const CpuBackend backend = load_best();
    return backend;
}

std::string cpu_variant() { return cpu_backend().variant; }
std::vector<std::string> cpu_features() { return cpu_backend().features; }

std::vector<std::string> missing_cpu_features() {
    std::vector<std::string> missing;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("ssse3")) missing.push_back("SSSE3");
    if (!__builtin_cpu_supports("sse4.1")) missing.push_back("SSE4.1");
    if (!__builtin_cpu_supports("sse4.2")) missing.push_back("SSE4.2");
    if (!__builtin_cpu_supports("popcnt")) missing.push_back("POPCNT");
#endif
    return missing;
}

ggml_backend_t new_cpu_backend() {
    const CpuBackend &cpu = cpu_backend();
    ggml_backend_t b = cpu.init();
    if (!b) throw std::runtime_error("cannot initialize the ggml CPU backend");
    cpu.set_n_threads(b, 1);
    return b;
}

OneShotGraph::OneShotGraph(ggml_cgraph *graph, int n_threads, const char *what)
    : graph_(graph), what_(what), backend_(new_cpu_backend()) {
    cpu_backend().set_n_threads(backend_.get(), n_threads);
    allocr_ = allocate_graph(backend_.get(), graph_, std::string("out of memory in the ") + what_);
}

void OneShotGraph::compute() {
    if (ggml_backend_graph_compute(backend_.get(), graph_) != GGML_STATUS_SUCCESS)
        throw std::runtime_error(std::string(what_) + " failed");
}

}  // namespace kazeia
