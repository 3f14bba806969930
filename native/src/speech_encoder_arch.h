// Speech encoder of the Base models (the encoding half of Qwen3-TTS-Tokenizer-12Hz, a Mimi
// encoder: 24 kHz audio -> 16 codes per 80 ms frame, the reference codes of in-context
// cloning): its format table in the idiom of arch.h. See docs/model.md, "Model kinds".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "arch.h"
#include "kazeia/hparams.h"

namespace kazeia {

const std::vector<MetaKey<SpeechEncoderHParams>> &speech_encoder_meta_keys();

// The part as a whole: Base checkpoints only, weights in speech_tokenizer/.
const PartInfo &speech_encoder_part();

// Every tensor a speech-encoder GGUF holds, in file order (all f32: exact codes).
std::vector<TensorSpec> speech_encoder_tensor_specs(const SpeechEncoderHParams &hp);

namespace senc_name {
std::string seanet(int layer, const std::string &what);  // senc.seanet.{layer}.{what}
std::string layer(int il, const std::string &what);      // senc.tfm.blk.{il}.{what}
std::string codebook(int q);                             // senc.codebook.{q}
inline const char *DOWNSAMPLE = "senc.downsample.weight";
inline const char *SEMANTIC_PROJ = "senc.rvq_semantic.in_proj.weight";
inline const char *ACOUSTIC_PROJ = "senc.rvq_acoustic.in_proj.weight";
}  // namespace senc_name

// The SEANet layers in checkpoint order (encoder.encoder.layers.{index}): what each is.
struct SeanetLayer {
    enum Kind { CONV, RESIDUAL, ELU } kind;
    int index;
    int64_t in = 0, out = 0, kernel = 0, stride = 1;  // CONV
    int64_t dilation = 1;                             // RESIDUAL: of its first conv
};
std::vector<SeanetLayer> seanet_layers(const SpeechEncoderHParams &hp);

}  // namespace kazeia
