// The product classes that make a voice from a recording (Base models): SpeakerEncoder (and
// the speech encoder to come). Registered in wyoming_kazeia._native itself, beside engine.cpp.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common.h"
#include "kazeia/error.h"
#include "kazeia/speaker_encoder.h"
#include "kazeia/speech_encoder.h"
#include "src/speaker_encoder_arch.h"
#include "src/speech_encoder_arch.h"

namespace kazeia::bindings {

namespace {

// A 1-D float32 view of mono audio (InputError otherwise).
py::array_t<float, py::array::c_style | py::array::forcecast> samples_from(const py::array &a) {
    auto s = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
    if (!s || s.ndim() != 1) throw InputError("audio must be a 1-D array of mono samples");
    return s;
}

}  // namespace

void def_voices(py::module_ &m) {
    py::class_<SpeakerEncoder>(m, "SpeakerEncoder",
                               "The x-vector of a recording (speaker_encoder.gguf of a Base model)")
        .def(py::init<const std::string &, int>(), py::arg("path"), py::arg("threads") = 2,
             py::call_guard<py::gil_scoped_release>())
        .def(
            "mel",
            [](const SpeakerEncoder &e, const py::array &audio) {
                auto s = samples_from(audio);
                std::vector<float> mel;
                {
                    py::gil_scoped_release release;
                    mel = e.mel(s.data(), s.size());
                }
                const py::ssize_t dim = e.hparams().mel_dim, frames = (py::ssize_t)mel.size() / dim;
                return to_numpy(std::move(mel)).reshape({frames, dim});
            },
            py::arg("audio"),
            "Log-mel features [frames, mel_dim] of mono audio at the model's sample rate.")
        .def(
            "embed",
            [](const SpeakerEncoder &e, const py::array &audio) {
                auto s = samples_from(audio);
                std::vector<float> x;
                {
                    py::gil_scoped_release release;
                    x = e.embed(s.data(), s.size());
                }
                return to_numpy(std::move(x));
            },
            py::arg("audio"), "The x-vector (float32 [enc_dim]) of mono audio at the model's rate.")
        .def(
            "embed_mel",
            [](const SpeakerEncoder &e, const py::array &mel) {
                auto f = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(mel);
                if (!f || f.ndim() != 2 || f.shape(1) != (py::ssize_t)e.hparams().mel_dim)
                    throw InputError("mel must be a float array [frames, " +
                                     std::to_string(e.hparams().mel_dim) + "]");
                std::vector<float> v(f.data(), f.data() + f.size()), x;
                {
                    py::gil_scoped_release release;
                    x = e.embed_mel(v, (int64_t)f.shape(0));
                }
                return to_numpy(std::move(x));
            },
            py::arg("mel"), "The x-vector of given log-mel features [frames, mel_dim].")
        .def_property_readonly("sample_rate", [](const SpeakerEncoder &e) { return e.hparams().sample_rate; })
        .def_property_readonly("min_samples", &SpeakerEncoder::min_samples)
        .def_property_readonly("hparams", [](const SpeakerEncoder &e) {
            return meta_to_dict(speaker_encoder_meta_keys(), e.hparams());
        });

    py::class_<SpeechEncoder>(m, "SpeechEncoder",
                              "Speech-tokenizer codes of a recording (speech_encoder.gguf of a Base model)")
        .def(py::init<const std::string &, int>(), py::arg("path"), py::arg("threads") = 2,
             py::call_guard<py::gil_scoped_release>())
        .def(
            "encode",
            [](const SpeechEncoder &e, const py::array &audio) {
                auto s = samples_from(audio);
                SpeechEncoder::Result r;
                {
                    py::gil_scoped_release release;
                    r = e.encode(s.data(), s.size());
                }
                const py::ssize_t nq = e.hparams().valid_quantizers, d = e.hparams().hidden_size;
                py::array_t<int32_t> codes({(py::ssize_t)r.frames, nq});
                std::copy(r.codes.begin(), r.codes.end(), codes.mutable_data());
                return py::make_tuple(codes, to_numpy(std::move(r.latent)).reshape({(py::ssize_t)r.frames, d}));
            },
            py::arg("audio"),
            "(codes int32 [frames, 16], latent float32 [frames, hidden]) of mono audio at the "
            "model's sample rate: frames = ceil(samples / frame_samples).")
        .def_property_readonly("sample_rate", [](const SpeechEncoder &e) { return e.hparams().sample_rate; })
        .def_property_readonly("frame_samples", [](const SpeechEncoder &e) { return e.hparams().frame_samples; })
        .def_property_readonly("hparams", [](const SpeechEncoder &e) {
            return meta_to_dict(speech_encoder_meta_keys(), e.hparams());
        });
}

}  // namespace kazeia::bindings
