// Speech encoder of the Base models (the encoding half of Qwen3-TTS-Tokenizer-12Hz, a Mimi
// encoder: 24 kHz audio -> 16 codes per 80 ms frame, the reference codes of in-context
// cloning): its format table in the idiom of arch.h. See docs/model.md, "Model kinds".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kazeia/arch.h"

namespace kazeia {

struct SpeechEncoderHParams {
    uint32_t sample_rate = 0;        // 24000
    uint32_t frame_samples = 0;      // samples per output frame (1920: 12.5 Hz)
    uint32_t valid_quantizers = 0;   // codes kept per frame (16)
    // SEANet (convolutions)
    uint32_t num_filters = 0;        // 64
    uint32_t kernel_size = 0;        // first conv (7)
    uint32_t last_kernel_size = 0;   // last conv (3)
    uint32_t residual_kernel_size = 0;  // 3
    uint32_t num_residual_layers = 0;   // 1
    uint32_t dilation_growth_rate = 0;  // 2
    uint32_t compress = 0;              // residual blocks' hidden width divisor (2)
    std::vector<uint32_t> upsampling_ratios;  // [8, 6, 5, 4]: applied reversed when encoding
    // transformer (pre-LayerNorm, RoPE, causal, GELU MLP, LayerScale)
    uint32_t hidden_size = 0;        // 512
    uint32_t num_layers = 0;         // 8
    uint32_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
    uint32_t intermediate_size = 0;  // 2048
    float rope_theta = 0.0f;
    float norm_eps = 0.0f;
    float frame_rate = 0.0f;         // 12.5: the downsampling conv halves the 25 Hz SEANet rate
    // split residual vector quantizer
    uint32_t codebook_size = 0;      // 2048
    uint32_t codebook_dim = 0;       // 256
    uint32_t vq_dim = 0;             // projection width of each RVQ (256)
    uint32_t num_quantizers = 0;     // in the checkpoint (32); the first valid_quantizers are used
    uint32_t num_semantic_quantizers = 0;  // 1

    // Samples per SEANet output step (960) and the downsampling stride (2).
    uint32_t seanet_stride() const {
        uint32_t s = 1;
        for (uint32_t r : upsampling_ratios) s *= r;
        return s;
    }
};

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
