// SpeakerEncoder: the x-vector of a reference recording (Base models), as the official
// extract_speaker_embedding computes it: log-mel features, then the ECAPA-TDNN.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kazeia/hparams.h"

namespace kazeia {

class SpeakerEncoder {
  public:
    // Loads speaker_encoder.gguf (ModelError when it is not one).
    SpeakerEncoder(const std::string &path, int n_threads);
    ~SpeakerEncoder();
    SpeakerEncoder(const SpeakerEncoder &) = delete;
    SpeakerEncoder &operator=(const SpeakerEncoder &) = delete;

    const SpeakerEncoderHParams &hparams() const;
    // The shortest recording it takes, in samples at hparams().sample_rate (a few frames of
    // features: every layer's reflect padding needs them).
    int64_t min_samples() const;
    // Log-mel features of `n` samples of mono audio at hparams().sample_rate: [frames, mel_dim]
    // (frames = 1 + (n + n_fft - 2 hop - n_fft) / hop, the official framing). InputError when
    // the recording is shorter than min_samples().
    std::vector<float> mel(const float *samples, int64_t n) const;
    // The x-vector [enc_dim] of those features (frames rows of mel_dim).
    std::vector<float> embed_mel(const std::vector<float> &mel, int64_t frames) const;
    // mel() then embed_mel().
    std::vector<float> embed(const float *samples, int64_t n) const;

    struct Impl;

  private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace kazeia
