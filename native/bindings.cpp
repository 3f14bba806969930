// pybind11 bindings: wyoming_kazeia._native. The public Python API is wyoming_kazeia.native.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kazeia/decoder_arch.h"
#include "kazeia/error.h"
#include "kazeia/generator.h"
#include "kazeia/speech_decoder.h"
#include "kazeia/talker_arch.h"
#include "src/ggml_raii.h"
#include "src/ops.h"
#include "src/sampler.h"
#include "src/worker_pool.h"

#include "ggml.h"

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

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// Runs the decoder's attention op once on a 2-thread pool (for tests against numpy).
py::array_t<float> run_window_attention(const FloatArray &q, const FloatArray &k,
                                        const FloatArray &v, const FloatArray &mask,
                                        int64_t n_kv_heads, float scale) {
    if (q.ndim() != 3 || k.ndim() != 2 || v.ndim() != 2 || mask.ndim() != 2)
        throw InputError("q must be [n, heads, head_dim]; k, v [n_kv, kv_dim]; mask [n, n_kv]");
    const int64_t n = q.shape(0), nh = q.shape(1), hd = q.shape(2), n_kv = k.shape(0);
    if (n_kv_heads < 1 || nh % n_kv_heads || k.shape(1) != hd * n_kv_heads ||
        v.shape(0) != n_kv || v.shape(1) != k.shape(1) || mask.shape(0) != n ||
        mask.shape(1) != n_kv)
        throw InputError("window_attention: inconsistent shapes");
    const size_t bytes = (q.size() + k.size() + v.size() + mask.size() + n * nh * hd) * 4;
    ggml_init_params params = {bytes + 16 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr,
                               false};
    GgmlContextPtr ctx(ggml_init(params));
    auto tensor = [&](const FloatArray &a, int64_t ne0, int64_t ne1, int64_t ne2) {
        ggml_tensor *t = ggml_new_tensor_3d(ctx.get(), GGML_TYPE_F32, ne0, ne1, ne2);
        std::memcpy(t->data, a.data(), ggml_nbytes(t));
        return t;
    };
    WorkerPool pool(2);
    const AttentionParams p{n_kv_heads, scale, &pool};
    ggml_tensor *out = window_attention(ctx.get(), tensor(q, hd, nh, n), tensor(k, k.shape(1), n_kv, 1),
                                        tensor(v, v.shape(1), n_kv, 1), tensor(mask, n_kv, n, 1), &p);
    ggml_cgraph *gf = ggml_new_graph(ctx.get());
    ggml_build_forward_expand(gf, out);
    if (ggml_graph_compute_with_ctx(ctx.get(), gf, 1) != GGML_STATUS_SUCCESS)
        throw std::runtime_error("window_attention: graph computation failed");
    py::array_t<float> result({n, nh * hd});
    std::memcpy(result.mutable_data(), out->data, ggml_nbytes(out));
    return result;
}

// Memory read bandwidth in GB/s: `threads` threads sum a `megabytes` buffer (median of 5
// passes). The decoder bench sets it beside the weight bytes a streamed frame must read.
double read_bandwidth(int64_t megabytes, int threads) {
    if (megabytes < 1 || threads < 1 || threads > 512)
        throw InputError("read_bandwidth: megabytes >= 1 and threads in 1..512");
    const int64_t n_words = megabytes * (1 << 20) / 8;
    std::vector<uint64_t> data(n_words, 1);
    WorkerPool pool(threads);
    const int64_t n_tasks = 4 * threads, per_task = (n_words + n_tasks - 1) / n_tasks;
    std::vector<uint64_t> sums(n_tasks);
    std::vector<double> gbs;
    for (int pass = 0; pass < 5; ++pass) {
        const auto start = std::chrono::steady_clock::now();
        pool.run(n_tasks, [&](int64_t t) {
            uint64_t a = 0, b = 0, c = 0, d = 0;  // independent chains: the loop vectorizes
            const int64_t end = std::min(n_words, (t + 1) * per_task);
            int64_t i = t * per_task;
            for (; i + 4 <= end; i += 4) {
                a += data[i];
                b += data[i + 1];
                c += data[i + 2];
                d += data[i + 3];
            }
            for (; i < end; ++i) a += data[i];
            sums[t] = a + b + c + d;
        });
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        gbs.push_back(8.0 * n_words / s / 1e9);
    }
    uint64_t total = 0;
    for (uint64_t v : sums) total += v;
    if (total != (uint64_t)n_words) throw std::runtime_error("read_bandwidth: wrong sum");
    std::sort(gbs.begin(), gbs.end());
    return gbs[gbs.size() / 2];
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

const char *talker_kind_name(TalkerTensorKind k) {
    switch (k) {
    case TalkerTensorKind::NORM: return "norm";
    case TalkerTensorKind::BIAS: return "bias";
    case TalkerTensorKind::MATRIX: return "matrix";
    case TalkerTensorKind::EMBEDDING: return "embedding";
    }
    return "?";
}

const char *talker_meta_type_name(TalkerMetaType t) {
    switch (t) {
    case TalkerMetaType::U32: return "u32";
    case TalkerMetaType::F32: return "f32";
    case TalkerMetaType::STR_U32_MAP: return "str_u32_map";
    case TalkerMetaType::STR_STR_MAP: return "str_str_map";
    }
    return "?";
}

// hparams <-> dict through the talker key table (maps as {name: value} dicts).
py::dict talker_hparams_to_dict(const TalkerHParams &hp) {
    py::dict d;
    for (const TalkerMetaKey &k : talker_meta_keys()) {
        switch (k.type) {
        case TalkerMetaType::U32: d[k.key.c_str()] = k.lm ? (hp.*(k.lm)).*(k.lm_u32) : hp.*(k.u32); break;
        case TalkerMetaType::F32: d[k.key.c_str()] = k.lm ? (hp.*(k.lm)).*(k.lm_f32) : hp.*(k.f32); break;
        case TalkerMetaType::STR_U32_MAP: {
            py::dict m;
            for (size_t i = 0; i < (hp.*(k.names)).size(); ++i) m[py::str((hp.*(k.names))[i])] = (hp.*(k.u32_values))[i];
            d[k.key.c_str()] = m;
            break;
        }
        case TalkerMetaType::STR_STR_MAP: {
            py::dict m;
            for (size_t i = 0; i < (hp.*(k.names)).size(); ++i) m[py::str((hp.*(k.names))[i])] = (hp.*(k.str_values))[i];
            d[k.key.c_str()] = m;
            break;
        }
        }
    }
    return d;
}

TalkerHParams talker_hparams_from_dict(const py::dict &d) {
    TalkerHParams hp;
    for (const TalkerMetaKey &k : talker_meta_keys()) {
        const bool table = k.type == TalkerMetaType::STR_U32_MAP || k.type == TalkerMetaType::STR_STR_MAP;
        if (table) continue;  // tables do not shape tensors
        if (!d.contains(k.key.c_str())) throw InputError("missing hyper-parameter " + k.key);
        py::handle v = d[k.key.c_str()];
        switch (k.type) {
        case TalkerMetaType::U32: (k.lm ? (hp.*(k.lm)).*(k.lm_u32) : hp.*(k.u32)) = v.cast<uint32_t>(); break;
        case TalkerMetaType::F32: (k.lm ? (hp.*(k.lm)).*(k.lm_f32) : hp.*(k.f32)) = v.cast<float>(); break;
        case TalkerMetaType::STR_U32_MAP:
        case TalkerMetaType::STR_STR_MAP: break;  // tables do not shape tensors
        }
    }
    return hp;
}

// The int32 ids of a 1-D integer array (or sequence).
std::vector<int32_t> ids_from(const py::array &arr) {
    const char kind = arr.dtype().kind();
    if ((kind != 'i' && kind != 'u') || arr.ndim() != 1)
        throw InputError("input_ids must be a 1-D sequence of integers");
    auto wide = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
    std::vector<int32_t> out(wide.size());
    for (size_t i = 0; i < out.size(); ++i) {
        const int64_t v = wide.data()[i];
        if (v < 0 || v > INT32_MAX) throw InputError("input id " + std::to_string(v) + " is out of range");
        out[i] = (int32_t)v;
    }
    return out;
}

GenerationOptions options_from(const std::string &speaker, const std::string &language,
                               bool non_streaming, bool greedy, std::optional<uint64_t> seed,
                               std::optional<float> temperature, std::optional<int> top_k,
                               std::optional<float> top_p, std::optional<float> repetition_penalty,
                               int max_frames) {
    GenerationOptions o;
    o.speaker = speaker;
    o.language = language;
    o.non_streaming = non_streaming;
    o.greedy = greedy;
    o.seed = seed;
    o.temperature = temperature;
    o.top_k = top_k;
    o.top_p = top_p;
    o.repetition_penalty = repetition_penalty;
    o.max_frames = max_frames;
    return o;
}

py::array_t<int32_t> frames_to_numpy(const std::vector<Frame> &frames) {
    py::array_t<int32_t> out({(py::ssize_t)frames.size(), (py::ssize_t)16});
    auto r = out.mutable_unchecked<2>();
    for (size_t t = 0; t < frames.size(); ++t)
        for (int g = 0; g < 16; ++g) r(t, g) = frames[t][g];
    return out;
}

py::array_t<float> floats(const std::vector<float> &v, std::vector<py::ssize_t> shape) {
    py::array_t<float> out(shape);
    std::copy(v.begin(), v.end(), out.mutable_data());
    return out;
}

// Python iterator over the frames of one generation; the native work runs without the GIL.
class FrameIterator {
  public:
    FrameIterator(std::unique_ptr<GenerationSession> s) : session_(std::move(s)) {}
    py::array_t<int32_t> next() {
        if (!session_) throw py::stop_iteration();
        std::optional<Frame> f;
        {
            py::gil_scoped_release release;
            f = session_->next();
        }
        if (!f) {
            stats_ = {session_->frames(), session_->talker_ms(), session_->predictor_ms(),
                      session_->graph_setup_ms()};
            session_.reset();  // frees the KV caches and threads now
            throw py::stop_iteration();
        }
        py::array_t<int32_t> out(16);
        std::copy(f->begin(), f->end(), out.mutable_data());
        return out;
    }
    void close() { session_.reset(); }
    py::dict stats() const {
        py::dict d;
        if (session_) {
            d["frames"] = session_->frames();
            d["talker_ms"] = session_->talker_ms();
            d["predictor_ms"] = session_->predictor_ms();
            d["graph_setup_ms"] = session_->graph_setup_ms();
        } else {
            d["frames"] = std::get<0>(stats_);
            d["talker_ms"] = std::get<1>(stats_);
            d["predictor_ms"] = std::get<2>(stats_);
            d["graph_setup_ms"] = std::get<3>(stats_);
        }
        return d;
    }

  private:
    std::unique_ptr<GenerationSession> session_;
    std::tuple<int64_t, double, double, double> stats_{0, 0.0, 0.0, 0.0};
};

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
        .def(py::init<const std::string &, int, bool>(), py::arg("path"), py::arg("threads") = 2,
             py::arg("polite") = false, py::call_guard<py::gil_scoped_release>())
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
            d["conv_panel"] = DECODER_CONV_PANEL;
            d["max_chunk_frames"] = DECODER_MAX_CHUNK_FRAMES;
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
    m.def(
        "sin_squared",
        [](py::array_t<float, py::array::c_style | py::array::forcecast> x) {
            py::array_t<float> y(x.size());
            sin_squared(x.data(), y.mutable_data(), x.size());
            return y;
        },
        py::arg("x"), "sin(x)^2 as the SnakeBeta kernel computes it (1-D float32 array).");
    m.def("read_bandwidth", &read_bandwidth, py::arg("megabytes") = 256, py::arg("threads") = 2,
          "Memory read bandwidth in GB/s (median of 5 passes over a buffer of that size).");
    m.def("window_attention", &run_window_attention, py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("mask"), py::arg("n_kv_heads"), py::arg("scale"),
          "The decoder's attention op: q [n, heads, head_dim], k and v [n_kv, kv_heads * "
          "head_dim], mask [n, n_kv] (0 or -inf) -> [n, heads * head_dim].");

    py::class_<FrameIterator>(m, "FrameIterator")
        .def("__iter__", [](FrameIterator &it) -> FrameIterator & { return it; })
        .def("__next__", &FrameIterator::next)
        .def("close", &FrameIterator::close)
        .def_property_readonly("stats", &FrameIterator::stats);

    py::class_<Generator>(m, "Generator")
        .def(py::init<const std::string &, int, bool>(), py::arg("path"), py::arg("threads") = 2,
             py::arg("polite") = false, py::call_guard<py::gil_scoped_release>())
        .def(
            "frames",
            [](const Generator &g, const py::array &input_ids, const std::string &speaker,
               const std::string &language, bool non_streaming, bool greedy,
               std::optional<uint64_t> seed, std::optional<float> temperature,
               std::optional<int> top_k, std::optional<float> top_p,
               std::optional<float> repetition_penalty, int max_frames) {
                auto ids = ids_from(input_ids);
                auto o = options_from(speaker, language, non_streaming, greedy, seed, temperature,
                                      top_k, top_p, repetition_penalty, max_frames);
                std::unique_ptr<GenerationSession> s;
                {
                    py::gil_scoped_release release;
                    s = g.start(ids, o);
                }
                return FrameIterator(std::move(s));
            },
            py::keep_alive<0, 1>(), py::arg("input_ids"), py::arg("speaker"),
            py::arg("language") = "auto", py::arg("non_streaming") = false,
            py::arg("greedy") = false, py::arg("seed") = py::none(),
            py::arg("temperature") = py::none(), py::arg("top_k") = py::none(),
            py::arg("top_p") = py::none(), py::arg("repetition_penalty") = py::none(),
            py::arg("max_frames") = 2048)
        .def(
            "generate",
            [](const Generator &g, const py::array &input_ids, const std::string &speaker,
               const std::string &language, bool non_streaming, bool greedy,
               std::optional<uint64_t> seed, std::optional<float> temperature,
               std::optional<int> top_k, std::optional<float> top_p,
               std::optional<float> repetition_penalty, int max_frames) {
                auto ids = ids_from(input_ids);
                auto o = options_from(speaker, language, non_streaming, greedy, seed, temperature,
                                      top_k, top_p, repetition_penalty, max_frames);
                std::vector<Frame> frames;
                {
                    py::gil_scoped_release release;
                    auto s = g.start(ids, o);
                    while (auto f = s->next()) frames.push_back(*f);
                }
                return frames_to_numpy(frames);
            },
            py::arg("input_ids"), py::arg("speaker"), py::arg("language") = "auto",
            py::arg("non_streaming") = false, py::arg("greedy") = false,
            py::arg("seed") = py::none(), py::arg("temperature") = py::none(),
            py::arg("top_k") = py::none(), py::arg("top_p") = py::none(),
            py::arg("repetition_penalty") = py::none(), py::arg("max_frames") = 2048,
            "All frames at once: int32 [T, 16] (T < max_frames when eos came first).")
        .def(
            "trace",
            [](const Generator &g, const py::array &input_ids, const std::string &speaker,
               const std::string &language, bool non_streaming, int max_frames, int kv_block) {
                auto ids = ids_from(input_ids);
                auto o = options_from(speaker, language, non_streaming, true, 0, std::nullopt,
                                      std::nullopt, std::nullopt, 1.0f, max_frames);
                o.kv_block = kv_block;
                GenerationTrace trace;
                std::vector<Frame> frames;
                {
                    py::gil_scoped_release release;
                    auto s = g.start(ids, o, &trace);
                    while (auto f = s->next()) frames.push_back(*f);
                }
                const py::ssize_t d = trace.hidden, vocab = g.hparams().talker.vocab_size,
                                  cpv = g.hparams().predictor.vocab_size;
                py::dict out;
                out["codes"] = frames_to_numpy(frames);
                out["prefill_embeds"] = floats(trace.prefill_embeds, {(py::ssize_t)trace.prefill_embeds.size() / d, d});
                out["step_embeds"] = floats(trace.step_embeds, {(py::ssize_t)trace.step_embeds.size() / d, d});
                out["talker_logits"] = floats(trace.talker_logits, {(py::ssize_t)trace.talker_logits.size() / vocab, vocab});
                out["talker_hidden"] = floats(trace.talker_hidden, {(py::ssize_t)trace.talker_hidden.size() / d, d});
                out["cp_logits"] = floats(trace.cp_logits, {(py::ssize_t)trace.cp_logits.size() / (15 * cpv), 15, cpv});
                return out;
            },
            py::arg("input_ids"), py::arg("speaker"), py::arg("language") = "auto",
            py::arg("non_streaming") = false, py::arg("max_frames") = 2048,
            py::arg("kv_block") = 256,
            "Greedy generation (repetition penalty 1) recording every intermediate the official "
            "reference pins down. kv_block: talker cache growth step (tests).")
        .def_property_readonly("hparams", [](const Generator &g) { return talker_hparams_to_dict(g.hparams()); })
        .def_property_readonly("threads", &Generator::n_threads)
        .def_property_readonly("speakers", [](const Generator &g) { return g.hparams().speaker_names; })
        .def_property_readonly("languages", [](const Generator &g) { return g.hparams().language_names; });

    m.def(
        "talker_arch",
        []() {
            py::dict d;
            d["arch"] = TALKER_ARCH;
            d["format_version"] = TALKER_FORMAT_VERSION;
            d["format_version_key"] = TALKER_KEY_FORMAT_VERSION;
            py::list keys;
            for (const TalkerMetaKey &k : talker_meta_keys()) {
                py::dict e;
                e["key"] = k.key;
                e["type"] = talker_meta_type_name(k.type);
                e["config_path"] = k.config_path;
                keys.append(e);
            }
            d["meta_keys"] = keys;
            return d;
        },
        "The talker GGUF kind, format version and metadata key table.");
    m.def(
        "talker_tensor_specs",
        [](const py::dict &hparams) {
            py::list out;
            for (const TalkerTensorSpec &s : talker_tensor_specs(talker_hparams_from_dict(hparams))) {
                py::dict e;
                e["name"] = s.name;
                e["ne"] = s.ne;
                e["sources"] = s.sources;
                e["kind"] = talker_kind_name(s.kind);
                out.append(e);
            }
            return out;
        },
        py::arg("hparams"), "Every tensor of a talker GGUF for these hyper-parameters.");

    m.def(
        "quantize",
        [](const py::array_t<float, py::array::c_style | py::array::forcecast> &data,
           const std::string &type) {
            ggml_type t;
            if (type == "q8_0") t = GGML_TYPE_Q8_0;
            else if (type == "q4_k") t = GGML_TYPE_Q4_K;
            else if (type == "f16") t = GGML_TYPE_F16;
            else throw InputError("quantize: type must be q8_0, q4_k or f16");
            if (data.ndim() < 1) throw InputError("quantize: need at least one dimension");
            const int64_t row = data.shape(data.ndim() - 1), rows = data.size() / std::max<int64_t>(row, 1);
            if (row % ggml_blck_size(t)) throw InputError("quantize: row length not a multiple of the block size");
            py::bytes out;
            std::string buf(ggml_row_size(t, row) * rows, '\0');
            {
                py::gil_scoped_release release;
                ggml_quantize_chunk(t, data.data(), buf.data(), 0, rows, row, nullptr);
            }
            return py::bytes(buf);
        },
        py::arg("data"), py::arg("type"), "ggml quantization of f32 rows (last dimension).");
    m.def(
        "quant_block_size", [](const std::string &type) -> int64_t {
            if (type == "q8_0") return ggml_blck_size(GGML_TYPE_Q8_0);
            if (type == "q4_k") return ggml_blck_size(GGML_TYPE_Q4_K);
            return 1;
        },
        py::arg("type"));

    m.def(
        "select_token",
        [](const py::array_t<float, py::array::c_style | py::array::forcecast> &logits,
           const std::vector<int32_t> &history, float repetition_penalty, int64_t suppress_begin,
           int64_t suppress_end, int64_t keep, bool greedy, float temperature, int top_k,
           float top_p, uint64_t seed, int n) {
            std::vector<int32_t> picks;
            Rng rng(seed);
            std::vector<float> x, scratch;
            for (int i = 0; i < n; ++i) {
                x.assign(logits.data(), logits.data() + logits.size());
                apply_repetition_penalty(x.data(), (int64_t)x.size(), history, repetition_penalty);
                suppress_range(x.data(), (int64_t)x.size(), suppress_begin, suppress_end, keep);
                picks.push_back(select_token(x.data(), (int64_t)x.size(),
                                             SamplingParams{greedy, temperature, top_k, top_p}, rng, scratch));
            }
            return picks;
        },
        py::arg("logits"), py::arg("history"), py::arg("repetition_penalty"),
        py::arg("suppress_begin"), py::arg("suppress_end"), py::arg("keep"), py::arg("greedy"),
        py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("seed"), py::arg("n"),
        "The talker's token processors and sampler on given logits, n draws (tests).");
}
