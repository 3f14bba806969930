// Where a model part computes: "cpu" (our CPU engine: ggml's CPU kernels and our own) or a GPU
// that ggml's Vulkan or CUDA backend sees ("vulkan:0", "cuda:1", ...). GPU backends exist only
// in a ggml built with them (script/ggml-wheel --backend vulkan|cuda); the default build has
// none, and a box without a GPU driver simply lists none. A part on a GPU computes in f32, as
// on the CPU: the first question about devices has ggml's Vulkan backend use its f32 shaders
// (KAZEIA_VULKAN_F16=1 keeps its f16 ones), before the backend opens a device.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kazeia {

struct ComputeDevice {
    std::string id;           // "cpu", "vulkan:0", "cuda:0": what a placement names
    std::string description;  // the driver's name of the device
    size_t memory_total = 0;  // bytes (0 for the CPU: the system's memory)
    size_t memory_free = 0;
};

// Every device this build and this box offer: the CPU first, then each GPU in ggml's order.
std::vector<ComputeDevice> compute_devices();

// The GPU backends this build of ggml has ("vulkan", "cuda"), whether or not a device is there.
std::vector<std::string> gpu_backends();

// The device a placement names: "cpu", "vulkan", "cuda" (their first device), "vulkan:N",
// "cuda:N", or "auto" (the first CUDA device, else the first Vulkan GPU, else the CPU).
// InputError for anything else or a device that is not here, in one line that lists the
// devices there are.
std::string resolve_placement(const std::string &placement);

// "cpu" or "vulkan:0 (NVIDIA ..., 24.0 GB)": for start banners.
std::string describe_placement(const std::string &device_id);

}  // namespace kazeia
