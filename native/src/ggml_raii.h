// RAII owners for ggml objects: every engine object frees what it allocates.
#pragma once

#include <memory>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "gguf.h"

namespace kazeia {

struct GgmlContextFree { void operator()(ggml_context *c) const { ggml_free(c); } };
struct GgufContextFree { void operator()(gguf_context *c) const { gguf_free(c); } };
struct BackendFree { void operator()(ggml_backend_t b) const { ggml_backend_free(b); } };
struct BufferFree { void operator()(ggml_backend_buffer_t b) const { ggml_backend_buffer_free(b); } };
struct GallocrFree { void operator()(ggml_gallocr_t a) const { ggml_gallocr_free(a); } };

using GgmlContextPtr = std::unique_ptr<ggml_context, GgmlContextFree>;
using GgufContextPtr = std::unique_ptr<gguf_context, GgufContextFree>;
using BackendPtr = std::unique_ptr<ggml_backend, BackendFree>;
using BufferPtr = std::unique_ptr<ggml_backend_buffer, BufferFree>;
using GallocrPtr = std::unique_ptr<ggml_gallocr, GallocrFree>;

}  // namespace kazeia
