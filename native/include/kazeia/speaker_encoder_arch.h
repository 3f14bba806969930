// Speaker encoder of the Base models (an ECAPA-TDNN over log-mel features: the x-vector of a
// reference recording): its format table in the idiom of arch.h. See docs/model.md, "Model
// kinds".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kazeia/arch.h"

namespace kazeia {

struct SpeakerEncoderHParams {
    // Mel features (constants of the official extract_speaker_embedding)
    uint32_t sample_rate = 0;  // 24000
    uint32_t n_fft = 0;        // 1024
    uint32_t hop = 0;          // 256
    uint32_t window = 0;       // 1024 (periodic Hann)
    float fmin = 0.0f, fmax = 0.0f;  // 0 .. 12000 Hz (Slaney mel scale and area norm)
    // ECAPA-TDNN (config.json speaker_encoder_config, the config class's defaults when absent)
    uint32_t mel_dim = 0;                  // 128
    uint32_t enc_dim = 0;                  // the x-vector width (= talker hidden)
    std::vector<uint32_t> channels;        // [512, 512, 512, 512, 1536]
    std::vector<uint32_t> kernel_sizes;    // [5, 3, 3, 3, 1]
    std::vector<uint32_t> dilations;       // [1, 2, 3, 4, 1]
    uint32_t attention_channels = 0;       // 128
    uint32_t res2net_scale = 0;            // 8
    uint32_t se_channels = 0;              // 128

    // SE-Res2Net blocks between the first TDNN and the aggregation (3)
    int n_blocks() const { return (int)channels.size() - 2; }
};

const std::vector<MetaKey<SpeakerEncoderHParams>> &speaker_encoder_meta_keys();

// The part as a whole: Base checkpoints only, weights in model.safetensors.
const PartInfo &speaker_encoder_part();

// Every tensor a speaker-encoder GGUF holds, in file order (all f32: one x-vector per voice,
// computed once, must match the official one to 1e-4).
std::vector<TensorSpec> speaker_encoder_tensor_specs(const SpeakerEncoderHParams &hp);

namespace spk_name {
// A conv layer's weight [k, in, out] (torch [out, in, k]) and bias [out]: spk.{what}.weight/.bias
std::string conv(const std::string &what);
std::string block(int b, const std::string &what);  // spk.blk.{b}.{what}
}  // namespace spk_name

}  // namespace kazeia
