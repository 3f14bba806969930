// The product classes of wyoming_kazeia._native: SpeechDecoder, DecoderStream, Generator,
// FrameIterator. The public Python API over them is wyoming_kazeia.native.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "kazeia/core_share.h"
#include "kazeia/cpu.h"
#include "kazeia/devices.h"
#include "kazeia/error.h"
#include "kazeia/generator.h"
#include "kazeia/speech_decoder.h"
#include "src/decoder_arch.h"
#include "src/talker_arch.h"

namespace kazeia::bindings {

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

}  // namespace

// The int32 ids of a 1-D integer array (or sequence).
std::vector<int32_t> ids_from(const py::array &arr, const char *what) {
    const char kind = arr.dtype().kind();
    if ((kind != 'i' && kind != 'u') || arr.ndim() != 1)
        throw InputError(std::string(what) + " must be a 1-D sequence of integers");
    auto wide = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
    std::vector<int32_t> out(wide.size());
    for (size_t i = 0; i < out.size(); ++i) {
        const int64_t v = wide.data()[i];
        if (v < 0 || v > INT32_MAX) throw InputError("input id " + std::to_string(v) + " is out of range");
        out[i] = (int32_t)v;
    }
    return out;
}

// A Voice from Python arrays (None: absent); the prompt checks them against the model.
VoiceOptions voice_from(const py::object &instruct_ids, const py::object &speaker_embedding,
                        const py::object &ref_ids, const py::object &ref_codes) {
    VoiceOptions v;
    if (!instruct_ids.is_none()) v.instruct_ids = ids_from(instruct_ids.cast<py::array>(), "instruct_ids");
    if (!ref_ids.is_none()) v.ref_ids = ids_from(ref_ids.cast<py::array>(), "ref_ids");
    if (!speaker_embedding.is_none()) {
        auto e = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(speaker_embedding);
        if (!e || e.ndim() != 1) throw InputError("speaker_embedding must be a 1-D float array");
        v.speaker_embedding.assign(e.data(), e.data() + e.size());
    }
    if (!ref_codes.is_none()) {
        auto c = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(ref_codes);
        constexpr py::ssize_t groups = std::tuple_size_v<Frame>;
        if (!c || c.ndim() != 2 || c.shape(1) != groups || c.shape(0) < 1)
            throw InputError("ref_codes must be an integer array [frames >= 1, 16]");
        for (py::ssize_t t = 0; t < c.shape(0); ++t) {
            Frame f{};
            for (py::ssize_t g = 0; g < groups; ++g) {
                const int64_t x = c.at(t, g);
                f[g] = (x < INT32_MIN || x > INT32_MAX) ? -1 : (int32_t)x;
            }
            v.ref_codes.push_back(f);
        }
    }
    return v;
}

GenerationOptions options_from(const std::string &speaker, const VoiceOptions *voice,
                               const std::string &language, bool non_streaming, bool greedy,
                               std::optional<uint64_t> seed, std::optional<float> temperature,
                               std::optional<int> top_k, std::optional<float> top_p,
                               std::optional<float> repetition_penalty, int max_frames) {
    GenerationOptions o;
    o.speaker = speaker;
    if (voice) o.voice = *voice;
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
    constexpr py::ssize_t codes = std::tuple_size_v<Frame>;  // per frame (the model's groups)
    py::array_t<int32_t> out({(py::ssize_t)frames.size(), codes});
    auto r = out.mutable_unchecked<2>();
    for (size_t t = 0; t < frames.size(); ++t)
        for (py::ssize_t g = 0; g < codes; ++g) r(t, g) = frames[t][g];
    return out;
}

FrameIterator::FrameIterator(std::unique_ptr<GenerationSession> s) : session_(std::move(s)) {}

py::array_t<int32_t> FrameIterator::next() {
    if (!session_) throw py::stop_iteration();
    std::optional<Frame> f;
    {
        py::gil_scoped_release release;
        f = session_->next();
    }
    if (!f) {
        stats_ = session_->stats();
        session_.reset();  // frees the KV caches and threads now
        throw py::stop_iteration();
    }
    py::array_t<int32_t> out((py::ssize_t)f->size());
    std::copy(f->begin(), f->end(), out.mutable_data());
    return out;
}

void FrameIterator::close() { session_.reset(); }

py::dict FrameIterator::stats() const {
    const GenerationStats s = session_ ? session_->stats() : stats_;
    py::dict d;
    d["frames"] = s.frames;
    d["talker_ms"] = s.talker_ms;
    d["predictor_ms"] = s.predictor_ms;
    d["graph_setup_ms"] = s.graph_setup_ms;
    d["frame_graph_ms"] = s.frame_graph_ms;
    d["predictor_computations"] = s.predictor_computations;
    d["computations"] = s.computations;
    return d;
}

void def_engine(py::module_ &m) {

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
        .def(
            "save",
            [](const DecoderStream &s) {
                std::vector<uint8_t> state = s.save();
                return py::bytes(reinterpret_cast<const char *>(state.data()), state.size());
            },
            "The stream's whole state (bytes): restore() continues exactly from here.")
        .def(
            "restore",
            [](DecoderStream &s, const py::bytes &state) {
                const std::string raw = state;
                s.restore(std::vector<uint8_t>(raw.begin(), raw.end()));
            },
            py::arg("state"), "Continue from a state saved from a stream of this decoder.")
        .def_property_readonly("frames_pushed", &DecoderStream::frames_pushed);

    py::class_<CoreShare, std::shared_ptr<CoreShare>>(
        m, "CoreShare",
        "The cores an engine's generator and in-process decoder share: give the same one to "
        "both (kazeia/core_share.h). cores 0: the CPUs this process may run on.")
        .def(py::init<int>(), py::arg("cores") = 0)
        .def_property_readonly("cores", &CoreShare::cores)
        .def_property_readonly("generator_computing", &CoreShare::generator_computing)
        .def_property_readonly("generator_alone", &CoreShare::generator_alone)
        .def_property_readonly("last_push_cpu_share", &CoreShare::last_push_cpu_share)
        .def_readonly_static("OTHERS_BUSY_BELOW", &CoreShare::OTHERS_BUSY_BELOW)
        .def_readonly_static("OTHERS_GONE_FROM", &CoreShare::OTHERS_GONE_FROM);

    py::class_<SpeechDecoder>(m, "SpeechDecoder")
        .def(py::init([](const std::string &path, int threads, bool polite,
                         const std::string &device, const std::string &precision,
                         std::shared_ptr<CoreShare> core_share) {
                 const DecoderPrecision p = decoder_precision(precision);
                 py::gil_scoped_release release;
                 return std::make_unique<SpeechDecoder>(path, threads, polite, device, p,
                                                        std::move(core_share));
             }),
             py::arg("path"), py::arg("threads") = 2, py::arg("polite") = false,
             py::arg("device") = "cpu", py::arg("precision") = "f32",
             py::arg("core_share") = nullptr)
        .def_property_readonly("device", &SpeechDecoder::device)
        .def_property_readonly("core_share", &SpeechDecoder::core_share)
        .def_property_readonly("precision",
                               [](const SpeechDecoder &d) {
                                   return DECODER_PRECISIONS[(int)d.precision()];
                               })
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
        .def_property_readonly(
            "hparams", [](const SpeechDecoder &d) { return meta_to_dict(decoder_meta_keys(), d.hparams()); })
        .def_property_readonly("threads", &SpeechDecoder::n_threads)
        .def_property_readonly("sample_rate",
                               [](const SpeechDecoder &d) { return d.hparams().sample_rate; })
        .def_property_readonly("hop_length",
                               [](const SpeechDecoder &d) { return d.hparams().hop_length; })
        .def_property_readonly("num_quantizers",
                               [](const SpeechDecoder &d) { return d.hparams().num_quantizers; })
        .def_property_readonly("codebook_size",
                               [](const SpeechDecoder &d) { return d.hparams().codebook_size; });
    py::class_<DecoderHParams>(m, "DecoderHParams")
        .def_readonly("sample_rate", &DecoderHParams::sample_rate)
        .def_readonly("hop_length", &DecoderHParams::hop_length)
        .def_readonly("num_quantizers", &DecoderHParams::num_quantizers)
        .def_readonly("codebook_size", &DecoderHParams::codebook_size)
        .def_property_readonly(
            "as_dict", [](const DecoderHParams &hp) { return meta_to_dict(decoder_meta_keys(), hp); });
    m.def("read_decoder_hparams", &read_decoder_hparams, py::arg("path"),
          py::call_guard<py::gil_scoped_release>(),
          "The facts of a decoder GGUF (sample rate, hop, codebooks), checked as a load checks the "
          "file, without reading its weights (ModelError otherwise).");
    m.attr("DECODER_MAX_CHUNK_FRAMES") = DECODER_MAX_CHUNK_FRAMES;
    // The width of every decoder graph on a GPU, and so the service's push size (settings.py,
    // engine.py take it from here).
    m.attr("DECODER_GPU_CHUNK_FRAMES") = DECODER_GPU_CHUNK_FRAMES;
    m.attr("KERNEL_ISA") = kernel_isa();
    // The values of SpeechDecoder's `precision` (DecoderPrecision's order).
    m.attr("DECODER_PRECISIONS") = py::make_tuple(DECODER_PRECISIONS[0], DECODER_PRECISIONS[1]);
    py::tuple kv_cache_types(std::size(KV_CACHE_TYPES));
    for (size_t i = 0; i < std::size(KV_CACHE_TYPES); ++i) kv_cache_types[i] = KV_CACHE_TYPES[i];
    m.attr("KV_CACHE_TYPES") = kv_cache_types;
    m.def("decoder_bf16_isa", &decoder_bf16_isa,
          "Where precision='bf16' multiplies on this CPU: AMX (the process then asks Linux for the "
          "tile registers, as a bf16 decoder does), AVX-512 BF16, AVX-512, AVX2, NEON or "
          "portable.");
    m.def("cpu_has_amx_bf16", &cpu_has_amx_bf16,
          "Whether this CPU has the AMX-BF16 tiles precision='bf16' would run on, without asking "
          "Linux for them (decoder_bf16_isa does).");
    m.def(
        "cpu_backend",
        []() {
            py::dict d;
            d["variant"] = cpu_variant();
            d["features"] = cpu_features();
            return d;
        },
        "Which of ggml's CPU kernels run here: {variant, features}.");
    m.def(
        "compute_devices",
        []() {
            py::list out;
            for (const ComputeDevice &d : compute_devices()) {
                py::dict e;
                e["id"] = d.id;
                e["description"] = d.description;
                e["memory_total"] = d.memory_total;
                e["memory_free"] = d.memory_free;
                out.append(e);
            }
            return out;
        },
        "The devices a model part can be placed on: [{id, description, memory_total, "
        "memory_free}], the CPU first (loads this build's GPU backends at the first call).");
    m.def("gpu_backends", &gpu_backends, "The GPU backends this build of ggml has: 'vulkan', 'cuda'.");
    m.def("resolve_placement", &resolve_placement, py::arg("placement"),
          "The device id a placement names ('cpu', 'vulkan[:N]', 'cuda[:N]', 'auto'); ValueError "
          "listing the devices when it is not here.");
    m.def("describe_placement", &describe_placement, py::arg("device_id"),
          "'cpu' or 'vulkan:0 (device name, memory)' for a resolved device id.");
    m.def("missing_cpu_features", &missing_cpu_features,
          "What this CPU lacks of the floor the build needs (x86-64-v2); empty when it runs.");
    m.attr("PROMPT_ROLE_TOKENS") = PROMPT_ROLE_TOKENS;
    m.attr("PROMPT_TRAILER_TOKENS") = PROMPT_TRAILER_TOKENS;
    m.def("frame_budget", &frame_budget, py::arg("text_tokens"),
          "The frames a generation of that many text tokens may take before it is cut.");

    py::class_<FrameIterator>(m, "FrameIterator")
        .def("__iter__", [](FrameIterator &it) -> FrameIterator & { return it; })
        .def("__next__", &FrameIterator::next)
        .def("close", &FrameIterator::close)
        .def_property_readonly("stats", &FrameIterator::stats);

    py::class_<VoiceOptions>(m, "Voice",
                             "What makes a voice beyond a built-in speaker: instruct_ids (a "
                             "tokenized '<|im_start|>user\\n{instruction}<|im_end|>\\n'), "
                             "speaker_embedding (Base: an x-vector), ref_ids and ref_codes (Base "
                             "in context: the reference transcript as '<|im_start|>assistant\\n"
                             "{text}<|im_end|>\\n' and its codes [T, 16]).")
        .def(py::init(&voice_from), py::arg("instruct_ids") = py::none(),
             py::arg("speaker_embedding") = py::none(), py::arg("ref_ids") = py::none(),
             py::arg("ref_codes") = py::none())
        .def_property_readonly("in_context", [](const VoiceOptions &v) { return !v.ref_codes.empty(); })
        .def_property_readonly("reference_frames", [](const VoiceOptions &v) { return v.ref_codes.size(); });

    py::class_<Generator>(m, "Generator")
        .def(py::init<const std::string &, int, bool, const std::string &, const std::string &,
                      std::shared_ptr<CoreShare>>(),
             py::arg("path"), py::arg("threads") = 2, py::arg("polite") = false,
             py::arg("talker_device") = "cpu", py::arg("predictor_device") = "cpu",
             py::arg("core_share") = nullptr, py::call_guard<py::gil_scoped_release>())
        .def(
            "frames",
            [](const Generator &g, const py::array &input_ids, const std::string &speaker,
               const std::string &language, bool non_streaming, bool greedy,
               std::optional<uint64_t> seed, std::optional<float> temperature,
               std::optional<int> top_k, std::optional<float> top_p,
               std::optional<float> repetition_penalty, int max_frames, const VoiceOptions *voice) {
                auto ids = ids_from(input_ids);
                auto o = options_from(speaker, voice, language, non_streaming, greedy, seed,
                                      temperature, top_k, top_p, repetition_penalty, max_frames);
                std::unique_ptr<GenerationSession> s;
                {
                    py::gil_scoped_release release;
                    s = g.start(ids, o);
                }
                return FrameIterator(std::move(s));
            },
            py::keep_alive<0, 1>(), py::arg("input_ids"), py::arg("speaker") = "",
            py::arg("language") = "auto", py::arg("non_streaming") = false,
            py::arg("greedy") = false, py::arg("seed") = py::none(),
            py::arg("temperature") = py::none(), py::arg("top_k") = py::none(),
            py::arg("top_p") = py::none(), py::arg("repetition_penalty") = py::none(),
            py::arg("max_frames") = 2048, py::arg("voice") = nullptr,
            "The frames one by one (stats: the session's figures).")
        .def(
            "generate",
            [](const Generator &g, const py::array &input_ids, const std::string &speaker,
               const std::string &language, bool non_streaming, bool greedy,
               std::optional<uint64_t> seed, std::optional<float> temperature,
               std::optional<int> top_k, std::optional<float> top_p,
               std::optional<float> repetition_penalty, int max_frames, const VoiceOptions *voice) {
                auto ids = ids_from(input_ids);
                auto o = options_from(speaker, voice, language, non_streaming, greedy, seed,
                                      temperature, top_k, top_p, repetition_penalty, max_frames);
                std::vector<Frame> frames;
                {
                    py::gil_scoped_release release;
                    auto s = g.start(ids, o);
                    while (auto f = s->next()) frames.push_back(*f);
                }
                return frames_to_numpy(frames);
            },
            py::arg("input_ids"), py::arg("speaker") = "", py::arg("language") = "auto",
            py::arg("non_streaming") = false, py::arg("greedy") = false,
            py::arg("seed") = py::none(), py::arg("temperature") = py::none(),
            py::arg("top_k") = py::none(), py::arg("top_p") = py::none(),
            py::arg("repetition_penalty") = py::none(), py::arg("max_frames") = 2048,
            py::arg("voice") = nullptr,
            "All frames at once: int32 [T, 16] (T < max_frames when eos came first).")
        .def(
            "text_tokens",
            [](const Generator &g, const py::array &input_ids) { return g.text_tokens(ids_from(input_ids)); },
            py::arg("input_ids"),
            "The number of text tokens of a tokenized assistant prompt (ValueError unless it is one).")
        .def_property_readonly("hparams", [](const Generator &g) { return meta_to_dict(talker_meta_keys(), g.hparams()); })
        .def_property("threads", &Generator::n_threads, &Generator::set_threads,
                      "Threads of the generations started next (ValueError outside 1..512).")
        .def_property("kv_cache_type", &Generator::kv_cache_type, &Generator::set_kv_cache_type,
                      "The talker's K/V cache type of the generations started next: one of "
                      "KV_CACHE_TYPES (ValueError for another), read back resolved (f32 or f16).")
        .def_property_readonly("talker_device", &Generator::talker_device)
        .def_property_readonly("predictor_device", &Generator::predictor_device)
        .def_property_readonly("core_share", &Generator::core_share)
        .def_property_readonly("damaged", &Generator::damaged,
                               "Its talker file changed on disk while in use: reload it.")
        .def_property_readonly("speakers", [](const Generator &g) { return g.hparams().speaker_names; })
        .def_property_readonly("languages", [](const Generator &g) { return g.hparams().language_names; });

}

}  // namespace kazeia::bindings
