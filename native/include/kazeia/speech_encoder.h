// SpeechEncoder: the speech-tokenizer codes of a reference recording (Base in-context cloning),
// as the official Qwen3TTSTokenizer.encode computes them at 24 kHz.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kazeia/hparams.h"

namespace kazeia {

class SpeechEncoder {
  public:
    // Loads speech_encoder.gguf (ModelError when it is not one).
    SpeechEncoder(const std::string &path, int n_threads);
    ~SpeechEncoder();
    SpeechEncoder(const SpeechEncoder &) = delete;
    SpeechEncoder &operator=(const SpeechEncoder &) = delete;

    const SpeechEncoderHParams &hparams() const;

    struct Result {
        int64_t frames = 0;
        std::vector<int32_t> codes;  // [frames, valid_quantizers]
        std::vector<float> latent;   // [frames, hidden]: the encoder output the RVQ quantizes
    };
    // `n` >= 1 samples of mono audio at hparams().sample_rate -> ceil(n / frame_samples)
    // frames of codes.
    Result encode(const float *samples, int64_t n) const;

    struct Impl;

  private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace kazeia
