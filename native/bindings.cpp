// pybind11 bindings: wyoming_kazeia._native. The public Python API is wyoming_kazeia.native.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "kazeia/decoder_arch.h"
#include "kazeia/error.h"
#include "kazeia/speech_decoder.h"
#include "src/ops.h"

namespace py = pybind11;
using namespace kazeia;

namespace {

// Validates an integer array [T, n_q] and returns it as contiguous int32 codes.
std::vector<int32_t> codes_from_array(const py::array &arr, const DecoderHParams &hp) {
    const char kind = arr.dtype().kind();
    if (kind != 'i' && kind != 'u')
        throw InputError("codes must be an integer array, got dtype " +
                         std::string(py::str(arr.dtype())));
    if (arr.ndim() != 2 || arr.shape(1) != (py::ssize_t)hp.num_quantizers)
        throw InputError("codes must have shape [T, " + std::to_string(hp.num_quantizers) +
                         "], got " + std::string(py::str(arr.attr("shape"))));
    if (arr.shape(0) < 1) throw InputError("codes must hold at least one frame");
    auto wide = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
    if (!wide) throw InputError("codes cannot be read as integers");
    const int64_t *src = wide.data();
    std::vector<int32_t> out(wide.size());
    for (size_t i = 0; i < out.size(); ++i) {
        if (src[i] < 0 || src[i] >= (int64_t)hp.codebook_size)
            throw InputError("code " + std::to_string(src[i]) + " at frame " +
                             std::to_string(i / hp.num_quantizers) + ", codebook " +
                             std::to_string(i % hp.num_quantizers) + " is outside 0.." +
                             std::to_string(hp.codebook_size - 1));
        out[i] = (int32_t)src[i];
    }
    return out;
}

py::array_t<float> to_numpy(std::vector<float> &&v) {
    auto *owner = new std::vector<float>(std::move(v));
    py::capsule free_when_done(owner, [](void *p) { delete static_cast<std::vector<float> *>(p); });
    return py::array_t<float>({(py::ssize_t)owner->size()}, {sizeof(float)}, owner->data(),
                              free_when_done);
}

const char *transform_name(Transform t) {
    switch (t) {
    case Transform::COPY: return "copy";
    case Transform::LINEAR: return "linear";
    case Transform::CONV: return "conv";
    case Transform::TRANS_CONV: return "trans_conv";
    case Transform::DEPTHWISE: return "depthwise";
    case Transform::CODEBOOK: return "codebook";
    case Transform::EXP: return "exp";
    case Transform::INV_EXP: return "inv_exp";
    }
    return "?";
}

const char *meta_type_name(MetaType t) {
    switch (t) {
    case MetaType::U32: return "u32";
    case MetaType::F32: return "f32";
    case MetaType::U32_ARRAY: return "u32_array";
    }
    return "?";
}

// hparams <-> dict through the metadata key table, so the converter and the loader share it.
py::dict hparams_to_dict(const DecoderHParams &hp) {
    py::dict d;
    for (const MetaKey &k : decoder_meta_keys()) {
        if (k.type == MetaType::U32) d[k.key] = hp.*(k.u32);
        else if (k.type == MetaType::F32) d[k.key] = hp.*(k.f32);
        else d[k.key] = hp.*(k.u32_array);
    }
    return d;
}

DecoderHParams hparams_from_dict(const py::dict &d) {
    DecoderHParams hp;
    for (const MetaKey &k : decoder_meta_keys()) {
        if (!d.contains(k.key)) throw InputError(std::string("missing hyper-parameter ") + k.key);
        py::handle v = d[k.key];
        if (k.type == MetaType::U32) hp.*(k.u32) = v.cast<uint32_t>();
        else if (k.type == MetaType::F32) hp.*(k.f32) = v.cast<float>();
        else hp.*(k.u32_array) = v.cast<std::vector<uint32_t>>();
    }
    return hp;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = "Kazeia TTS native engine (ggml)";
    py::register_exception<ModelError>(m, "ModelError", PyExc_RuntimeError);

    py::class_<DecoderStream>(m, "DecoderStream")
        .def(
            "push",
            [](DecoderStream &s, const py::array &codes) {
                std::vector<int32_t> c = codes_from_array(codes, s.hparams());
                std::vector<float> wav;
                {
                    py::gil_scoped_release release;
                    wav = s.push(c.data(), (int64_t)(c.size() / s.hparams().num_quantizers));
                }
                return to_numpy(std::move(wav));
            },
            py::arg("codes"))
        .def("reset", &DecoderStream::reset, py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("frames_pushed", &DecoderStream::frames_pushed);

    py::class_<SpeechDecoder>(m, "SpeechDecoder")
        .def(py::init<const std::string &, int>(), py::arg("path"), py::arg("threads") = 2,
             py::call_guard<py::gil_scoped_release>())
        .def(
            "decode",
            [](const SpeechDecoder &dec, const py::array &codes) {
                std::vector<int32_t> c = codes_from_array(codes, dec.hparams());
                std::vector<float> wav;
                {
                    py::gil_scoped_release release;
                    wav = dec.decode(c.data(), (int64_t)(c.size() / dec.hparams().num_quantizers));
                }
                return to_numpy(std::move(wav));
            },
            py::arg("codes"))
        .def("stream", &SpeechDecoder::stream, py::keep_alive<0, 1>(),
             py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("hparams",
                               [](const SpeechDecoder &d) { return hparams_to_dict(d.hparams()); })
        .def_property_readonly("threads", &SpeechDecoder::n_threads)
        .def_property_readonly("sample_rate",
                               [](const SpeechDecoder &d) { return d.hparams().sample_rate; })
        .def_property_readonly("hop_length",
                               [](const SpeechDecoder &d) { return d.hparams().hop_length; })
        .def_property_readonly("num_quantizers",
                               [](const SpeechDecoder &d) { return d.hparams().num_quantizers; })
        .def_property_readonly("codebook_size",
                               [](const SpeechDecoder &d) { return d.hparams().codebook_size; });

    m.def(
        "decoder_arch",
        []() {
            py::dict d;
            d["arch"] = DECODER_ARCH;
            d["format_version"] = DECODER_FORMAT_VERSION;
            d["format_version_key"] = DECODER_KEY_FORMAT_VERSION;
            py::list keys;
            for (const MetaKey &k : decoder_meta_keys()) {
                py::dict e;
                e["key"] = k.key;
                e["type"] = meta_type_name(k.type);
                e["config_path"] = k.config_path ? py::object(py::str(k.config_path)) : py::none();
                e["constant"] = k.constant;
                keys.append(e);
            }
            d["meta_keys"] = keys;
            return d;
        },
        "The decoder GGUF kind, format version and metadata key table.");
    m.def(
        "decoder_tensor_specs",
        [](const py::dict &hparams) {
            py::list out;
            for (const TensorSpec &s : decoder_tensor_specs(hparams_from_dict(hparams))) {
                py::dict e;
                e["name"] = s.name;
                e["ne"] = s.ne;
                e["sources"] = s.sources;
                e["transform"] = transform_name(s.transform);
                e["stride"] = s.stride;
                out.append(e);
            }
            return out;
        },
        py::arg("hparams"), "Every tensor of a decoder GGUF for these hyper-parameters.");
    m.def("sin_squared", &sin_squared, py::arg("x"), "The vectorized sin^2 of the SnakeBeta kernel.");
}
