// Shared by the binding files: the three audiences' registration functions and the numpy
// helpers they have in common.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "kazeia/arch.h"

namespace kazeia::bindings {

namespace py = pybind11;

// Product classes (SpeechDecoder, Generator, ...): the module itself.
void def_engine(py::module_ &m);
// Product classes that make voices from recordings (SpeakerEncoder): the module itself.
void def_voices(py::module_ &m);
// The converter's format tables and quantization: _native.formats.
void def_formats(py::module_ &m);
// Test hooks and bench probes (single kernels, the sampler on given logits): _native.testing.
void def_testing(py::module_ &m);

// A float vector handed to numpy without a copy (the array owns it).
inline py::array_t<float> to_numpy(std::vector<float> &&v) {
    auto *owner = new std::vector<float>(std::move(v));
    py::capsule free_when_done(owner, [](void *p) { delete static_cast<std::vector<float> *>(p); });
    return py::array_t<float>({(py::ssize_t)owner->size()}, {sizeof(float)}, owner->data(),
                              free_when_done);
}

// A part's hyper-parameters as {GGUF key: value}; maps as {name: value} dicts.
template <class H> py::dict meta_to_dict(const std::vector<MetaKey<H>> &keys, H hp) {
    py::dict d;
    for (const MetaKey<H> &k : keys) {
        const char *key = k.key.c_str();
        switch (k.type) {
        case MetaType::U32: d[key] = k.u32(hp); break;
        case MetaType::F32: d[key] = k.f32(hp); break;
        case MetaType::U32_ARRAY: d[key] = k.u32_array(hp); break;
        case MetaType::STR: d[key] = k.str(hp); break;
        case MetaType::STR_U32_MAP:
        case MetaType::STR_STR_MAP: {
            py::dict m;
            const std::vector<std::string> &names = k.names(hp);
            for (size_t i = 0; i < names.size(); ++i) {
                if (k.type == MetaType::STR_U32_MAP) m[py::str(names[i])] = k.u32_array(hp)[i];
                else m[py::str(names[i])] = k.str_values(hp)[i];
            }
            d[key] = m;
            break;
        }
        }
    }
    return d;
}

}  // namespace kazeia::bindings
