// The engine's side of devices.h: a resolved device id to a ggml device and a backend on it.
#pragma once

#include <string>

#include "ggml-backend.h"

namespace kazeia {

// True for "cpu", the engine's own CPU path.
inline bool is_cpu(const std::string &device_id) { return device_id == "cpu"; }

// The ggml device of a resolved GPU id ("vulkan:0"); InputError when there is none.
ggml_backend_dev_t gpu_device(const std::string &device_id);

// A new backend on a resolved GPU id (the caller owns it); std::runtime_error when the driver
// refuses.
ggml_backend_t new_gpu_backend(const std::string &device_id);

// Whether `backend` computes every op of `gf`.
bool computes_all(ggml_backend_t backend, ggml_cgraph *gf);

}  // namespace kazeia
