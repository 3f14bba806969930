// Shared by the binding files: the three audiences' registration functions and the numpy
// helpers they have in common.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kazeia/generator.h"
#include "src/arch.h"

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

// The generation helpers the product's Generator (engine.cpp) and the test hooks share.
// The int32 ids of a 1-D integer array (or sequence); InputError naming `what` otherwise.
std::vector<int32_t> ids_from(const py::array &arr, const char *what = "input_ids");
GenerationOptions options_from(const std::string &speaker, const VoiceOptions *voice,
                               const std::string &language, bool non_streaming, bool greedy,
                               std::optional<uint64_t> seed, std::optional<float> temperature,
                               std::optional<int> top_k, std::optional<float> top_p,
                               std::optional<float> repetition_penalty, int max_frames);
// Frames as an int32 array [T, 16].
py::array_t<int32_t> frames_to_numpy(const std::vector<Frame> &frames);

// Python iterator over the frames of one generation; the native work runs without the GIL.
class FrameIterator {
  public:
    explicit FrameIterator(std::unique_ptr<GenerationSession> s);
    py::array_t<int32_t> next();
    void close();
    py::dict stats() const;

  private:
    std::unique_ptr<GenerationSession> session_;
    GenerationStats stats_;  // once the session is done
};

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
