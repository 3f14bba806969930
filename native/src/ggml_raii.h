// RAII owners for ggml objects: every engine object frees what it allocates.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

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

// A compute allocator for `gf` on `backend`, its memory allocated; std::runtime_error
// `out_of_memory` when it cannot be.
inline GallocrPtr allocate_graph(ggml_backend_t backend, ggml_cgraph *gf, const std::string &out_of_memory) {
    GallocrPtr allocr(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend)));
    if (!ggml_gallocr_alloc_graph(allocr.get(), gf)) throw std::runtime_error(out_of_memory);
    return allocr;
}

}  // namespace kazeia
