// The converter's audience (wyoming_kazeia._native.formats): every model part's format table
// (arch.h) and ggml's quantization. wyoming_kazeia.convert writes files from these tables,
// the loaders check files against them.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <functional>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "src/decoder_arch.h"
#include "kazeia/error.h"
#include "src/speaker_encoder_arch.h"
#include "src/speech_encoder_arch.h"
#include "src/talker_arch.h"

#include "ggml.h"

namespace kazeia::bindings {

namespace {

const char *name_of(MetaType t) {
    switch (t) {
    case MetaType::U32: return "u32";
    case MetaType::F32: return "f32";
    case MetaType::U32_ARRAY: return "u32_array";
    case MetaType::STR: return "str";
    case MetaType::STR_U32_MAP: return "str_u32_map";
    case MetaType::STR_STR_MAP: return "str_str_map";
    }
    return "?";
}

const char *name_of(Transform t) {
    switch (t) {
    case Transform::COPY: return "copy";
    case Transform::CONV: return "conv";
    case Transform::TRANS_CONV: return "trans_conv";
    case Transform::DEPTHWISE: return "depthwise";
    case Transform::CODEBOOK: return "codebook";
    case Transform::EXP: return "exp";
    case Transform::INV_EXP: return "inv_exp";
    case Transform::STACK: return "stack";
    case Transform::CONCAT: return "concat";
    }
    return "?";
}

const char *name_of(Storage s) {
    switch (s) {
    case Storage::F32: return "f32";
    case Storage::F16_WHEN_QUANTIZED: return "f16_when_quantized";
    case Storage::QUANTIZABLE: return "quantizable";
    }
    return "?";
}

// The hyper-parameters that shape a part's tensors, from {GGUF key: value}; the maps (speaker
// and language tables) and texts shape nothing and are skipped.
template <class H> H meta_from_dict(const std::vector<MetaKey<H>> &keys, const py::dict &d) {
    H hp;
    for (const MetaKey<H> &k : keys) {
        if (k.type == MetaType::STR_U32_MAP || k.type == MetaType::STR_STR_MAP ||
            k.type == MetaType::STR)
            continue;
        if (!d.contains(k.key.c_str())) throw InputError("missing hyper-parameter " + k.key);
        py::handle v = d[k.key.c_str()];
        if (k.type == MetaType::U32) k.u32(hp) = v.cast<uint32_t>();
        else if (k.type == MetaType::F32) k.f32(hp) = v.cast<float>();
        else k.u32_array(hp) = v.cast<std::vector<uint32_t>>();
    }
    return hp;
}

// One part of the format: its description, its key table and its tensor table from
// hyper-parameters (functions: no Python object may outlive the interpreter in a static).
struct Part {
    const PartInfo &info;
    std::function<py::list()> meta_keys;
    std::function<std::vector<TensorSpec>(const py::dict &)> tensor_specs;
};

template <class H> py::list meta_key_list(const std::vector<MetaKey<H>> &keys) {
    py::list out;
    for (const MetaKey<H> &k : keys) {
        py::dict e;
        e["key"] = k.key;
        e["type"] = name_of(k.type);
        e["source"] = k.source.empty() ? py::object(py::none()) : py::object(py::str(k.source));
        e["constant"] = k.constant;
        e["fallback"] = k.fallback.empty() ? py::object(py::none()) : py::cast(k.fallback);
        out.append(e);
    }
    return out;
}

const std::vector<Part> &all_parts() {
    static const std::vector<Part> parts = {
        {decoder_part(), [] { return meta_key_list(decoder_meta_keys()); },
         [](const py::dict &d) { return decoder_tensor_specs(meta_from_dict(decoder_meta_keys(), d)); }},
        {talker_part(), [] { return meta_key_list(talker_meta_keys()); },
         [](const py::dict &d) { return talker_tensor_specs(meta_from_dict(talker_meta_keys(), d)); }},
        {speaker_encoder_part(), [] { return meta_key_list(speaker_encoder_meta_keys()); },
         [](const py::dict &d) {
             return speaker_encoder_tensor_specs(meta_from_dict(speaker_encoder_meta_keys(), d));
         }},
        {speech_encoder_part(), [] { return meta_key_list(speech_encoder_meta_keys()); },
         [](const py::dict &d) {
             return speech_encoder_tensor_specs(meta_from_dict(speech_encoder_meta_keys(), d));
         }},
    };
    return parts;
}

const Part &part_named(const std::string &name) {
    for (const Part &p : all_parts())
        if (name == p.info.name) return p;
    throw InputError("unknown model part '" + name + "'");
}

}  // namespace

void def_formats(py::module_ &m) {
    m.def(
        "parts",
        []() {
            py::list out;
            for (const Part &p : all_parts()) {
                py::dict d;
                d["name"] = p.info.name;
                d["file"] = p.info.file;
                d["arch"] = p.info.arch;
                d["format_version_key"] = p.info.format_version_key;
                d["format_version"] = p.info.format_version;
                d["weights_dir"] = p.info.weights_dir;
                d["unused_sources"] = p.info.unused_sources;
                d["model_type"] = p.info.model_type;
                d["meta_keys"] = p.meta_keys();
                out.append(d);
            }
            return out;
        },
        "Every model part of the format, in conversion order: file, kind (general.architecture), "
        "format version, checkpoint folder of its weights, the checkpoint tensors it leaves out, "
        "and its metadata keys (key, type, source 'FILE:dotted.path' or None, constant).");
    m.def(
        "tensor_specs",
        [](const std::string &part, const py::dict &hparams) {
            py::list out;
            for (const TensorSpec &s : part_named(part).tensor_specs(hparams)) {
                py::dict e;
                e["name"] = s.name;
                e["ne"] = s.ne;
                e["sources"] = s.sources;
                e["transform"] = name_of(s.transform);
                e["storage"] = name_of(s.storage);
                e["stride"] = s.stride;
                out.append(e);
            }
            return out;
        },
        py::arg("part"), py::arg("hparams"),
        "Every tensor of a part's GGUF for these hyper-parameters ({GGUF key: value}), in file "
        "order: name, ggml shape, checkpoint sources, transform, storage rule, stride.");
    m.def(
        "quantize",
        [](const py::array_t<float, py::array::c_style | py::array::forcecast> &data,
           const std::string &type) {
            // The converter's weight types by their --type names (gguf's own names in lower case).
            static const std::pair<const char *, ggml_type> types[] = {
                {"f16", GGML_TYPE_F16},   {"q8_0", GGML_TYPE_Q8_0}, {"q6_k", GGML_TYPE_Q6_K},
                {"q5_k", GGML_TYPE_Q5_K}, {"q4_k", GGML_TYPE_Q4_K},
            };
            const auto *found = std::find_if(std::begin(types), std::end(types),
                                             [&](const auto &e) { return type == e.first; });
            if (found == std::end(types)) {
                std::string known;
                for (const auto &e : types) known += std::string(known.empty() ? "" : ", ") + e.first;
                throw InputError("quantize: type must be one of " + known + ", got " + type);
            }
            const ggml_type t = found->second;
            if (data.ndim() < 1) throw InputError("quantize: need at least one dimension");
            const int64_t row = data.shape(data.ndim() - 1);
            if (row == 0) throw InputError("quantize: rows of 0 values");
            const int64_t rows = data.size() / row;
            if (row % ggml_blck_size(t))
                throw InputError("quantize: rows of " + std::to_string(row) + " values, " + type +
                                 " needs a multiple of " + std::to_string(ggml_blck_size(t)));
            std::string buf(ggml_row_size(t, row) * rows, '\0');
            {
                py::gil_scoped_release release;
                ggml_quantize_chunk(t, data.data(), buf.data(), 0, rows, row, nullptr);
            }
            return py::bytes(buf);
        },
        py::arg("data"), py::arg("type"), "ggml quantization of f32 rows (last dimension).");

}

}  // namespace kazeia::bindings
