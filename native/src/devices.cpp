#include "kazeia/devices.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "cpu_backend.h"
#include "env_switch.h"
#include "devices_internal.h"
#include "kazeia/error.h"

#if defined(KAZEIA_GGML_CPU_VARIANTS)
#include <dlfcn.h>
#include <unistd.h>
#endif

namespace kazeia {

namespace {

struct GpuEntry {
    std::string id;
    ggml_backend_dev_t dev;
};

struct GpuRegistry {
    std::vector<std::string> backends;  // "cuda", "vulkan"
    std::vector<GpuEntry> devices;
    // Backends this build has that cannot load here, each with the loader's reason.
    std::vector<std::string> unloadable;
};

// The GPU backends a GGML_BACKEND_DL build may ship beside its CPU variants (renamed like
// them, see native/cmake/bundle_ggml.cmake), in the order "auto" prefers them.
const char *const GPU_BACKENDS[] = {"cuda", "vulkan"};

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return (char)std::tolower(c); });
    return s;
}

// ggml's Vulkan shaders, on a device with fp16 arithmetic, stage every matrix product's operands
// in f16 (even f32 x f32): the decoder's samples and the talker's logits then land orders of
// magnitude further from the reference than in f32. Their f32 shaders are chosen here, before
// the backend first opens a device (it reads the variable then); KAZEIA_VULKAN_F16=1 keeps
// ggml's f16 shaders: faster on a real GPU, as far from the reference as said. A
// GGML_VK_DISABLE_F16 set by the user is left alone.
void choose_vulkan_precision() {
    if (env_is("KAZEIA_VULKAN_F16", "1")) return;
    setenv("GGML_VK_DISABLE_F16", "1", /*overwrite=*/0);
}

GpuRegistry load_gpu_backends() {
    GpuRegistry r;
    choose_vulkan_precision();
#if defined(KAZEIA_GGML_CPU_VARIANTS)
    const std::string dir = ggml_library_dir();
    for (const char *name : GPU_BACKENDS) {
        const std::string path = dir + "/libkazeia-ggml-" + name + ".so";
        if (access(path.c_str(), F_OK) != 0) continue;  // not in this build
        // Present but unloadable where its runtime is missing (no libvulkan.so.1, no CUDA
        // runtime or driver): then it offers no device, as on a box without a GPU, and the
        // reason is kept for the error that lists the devices.
        void *probe = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!probe) {
            const char *why = dlerror();
            r.unloadable.push_back(std::string(name) + " (" + (why ? why : "cannot load") + ")");
            continue;
        }
        dlclose(probe);
        ggml_backend_load(path.c_str());
    }
#endif
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
        ggml_backend_reg_t reg = ggml_backend_reg_get(i);
        const std::string name = lower(ggml_backend_reg_name(reg));
        if (std::find(std::begin(GPU_BACKENDS), std::end(GPU_BACKENDS), name) == std::end(GPU_BACKENDS))
            continue;
        r.backends.push_back(name);
        size_t index = 0;
        for (size_t d = 0; d < ggml_backend_reg_dev_count(reg); ++d) {
            ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, d);
            const enum ggml_backend_dev_type type = ggml_backend_dev_type(dev);
            if (type != GGML_BACKEND_DEVICE_TYPE_GPU && type != GGML_BACKEND_DEVICE_TYPE_IGPU) continue;
            r.devices.push_back(GpuEntry{name + ":" + std::to_string(index++), dev});
        }
    }
    return r;
}

const GpuRegistry &gpu_registry() {
    // Process-wide by nature: ggml's backend registry is. Loaded at the first question about
    // devices, so a service placed wholly on the CPU never loads a GPU library.
    static const GpuRegistry registry = load_gpu_backends();
    return registry;
}

std::string gigabytes(size_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GB", (double)bytes / 1e9);
    return buf;
}

// "cpu", or "vulkan:0 (its description, 8.6 GB)".
std::string label(const ComputeDevice &d) {
    return is_cpu(d.id) ? d.id : d.id + " (" + d.description + ", " + gigabytes(d.memory_total) + ")";
}

std::string device_list() {
    std::string s;
    for (const ComputeDevice &d : compute_devices()) s += (s.empty() ? "" : ", ") + label(d);
    const GpuRegistry &r = gpu_registry();
    for (const std::string &u : r.unloadable) s += "; not loadable here: " + u;
    if (r.backends.empty() && r.unloadable.empty())
        s += "; this ggml has no GPU backend (script/setup --backend vulkan|cuda builds one)";
    return s;
}

InputError no_device(const std::string &name) {
    return InputError("no compute device '" + name + "': devices here: " + device_list());
}

}  // namespace

std::vector<ComputeDevice> compute_devices() {
    std::vector<ComputeDevice> out{ComputeDevice{"cpu", "CPU", 0, 0}};
    for (const GpuEntry &e : gpu_registry().devices) {
        ComputeDevice d{e.id, ggml_backend_dev_description(e.dev), 0, 0};
        ggml_backend_dev_memory(e.dev, &d.memory_free, &d.memory_total);
        out.push_back(d);
    }
    return out;
}

std::vector<std::string> gpu_backends() { return gpu_registry().backends; }

std::string resolve_placement(const std::string &placement) {
    const std::string p = lower(placement);
    if (p == "cpu") return p;
    const std::vector<GpuEntry> &devices = gpu_registry().devices;
    if (p == "auto") {
        for (const char *backend : GPU_BACKENDS)
            for (const GpuEntry &e : devices)
                if (e.id.rfind(std::string(backend) + ":", 0) == 0) return e.id;
        return "cpu";
    }
    const std::string id = p.find(':') == std::string::npos ? p + ":0" : p;
    for (const GpuEntry &e : devices)
        if (e.id == id) return id;
    const bool known = std::any_of(std::begin(GPU_BACKENDS), std::end(GPU_BACKENDS), [&](const char *b) {
        return id.rfind(std::string(b) + ":", 0) == 0;
    });
    if (known) throw no_device(placement);
    throw InputError("unknown compute device '" + placement +
                     "' (cpu, vulkan[:N], cuda[:N] or auto): devices here: " + device_list());
}

std::string describe_placement(const std::string &device_id) {
    if (is_cpu(device_id)) return device_id;  // without loading the GPU backends
    for (const ComputeDevice &d : compute_devices())
        if (d.id == device_id) return label(d);
    return device_id;
}

ggml_backend_dev_t gpu_device(const std::string &device_id) {
    for (const GpuEntry &e : gpu_registry().devices)
        if (e.id == device_id) return e.dev;
    throw no_device(device_id);
}

ggml_backend_t new_gpu_backend(const std::string &device_id) {
    ggml_backend_t b = ggml_backend_dev_init(gpu_device(device_id), nullptr);
    if (!b) throw std::runtime_error("cannot start a backend on " + device_id);
    return b;
}

bool computes_all(ggml_backend_t backend, ggml_cgraph *gf) {
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i)
        if (!ggml_backend_supports_op(backend, ggml_graph_node(gf, i))) return false;
    return true;
}

}  // namespace kazeia
