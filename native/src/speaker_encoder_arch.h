// Speaker encoder of the Base models (an ECAPA-TDNN over log-mel features: the x-vector of a
// reference recording): its format table in the idiom of arch.h. See docs/model.md, "Model
// kinds".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "arch.h"
#include "kazeia/hparams.h"

namespace kazeia {

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
