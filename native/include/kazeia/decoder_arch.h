// Speech decoder (Qwen3-TTS-Tokenizer-12Hz decoder): its format table in the idiom of arch.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kazeia/arch.h"

namespace kazeia {

// Matrices whose output width is a multiple of this run in the decoder's own GEMM (f32 math on
// f32 or f16 weights, in panels of this many rows): only those are stored as f16 when the
// model is quantized (Storage::F16_WHEN_QUANTIZED), so the activations stay f32 everywhere.
inline constexpr int64_t DECODER_CONV_PANEL = 16;

struct DecoderHParams {
    uint32_t codebook_size = 0;            // entries per RVQ codebook (2048)
    uint32_t codebook_dim = 0;             // RVQ output dim (512); codebook vectors are half of it
    uint32_t num_quantizers = 0;           // codes per frame (16)
    uint32_t num_semantic_quantizers = 0;  // first group (1)
    uint32_t latent_dim = 0;               // pre_conv / transformer in-out / upsampler width (1024)
    uint32_t hidden_size = 0;              // transformer width (512)
    uint32_t num_layers = 0;               // transformer layers (8)
    uint32_t num_heads = 0;
    uint32_t num_kv_heads = 0;
    uint32_t head_dim = 0;
    uint32_t intermediate_size = 0;        // transformer SwiGLU width
    uint32_t sliding_window = 0;           // attention window in frames, including the query (72)
    uint32_t decoder_dim = 0;              // vocoder input channels (1536)
    uint32_t sample_rate = 0;              // output rate (24000)
    uint32_t hop_length = 0;               // samples per frame (1920)
    float rope_theta = 0.0f;
    float rms_norm_eps = 0.0f;
    float layer_norm_eps = 0.0f;           // ConvNeXt LayerNorm (a constant of the official code)
    std::vector<uint32_t> upsample_rates;    // vocoder blocks (8, 5, 4, 3)
    std::vector<uint32_t> upsampling_ratios; // transposed-conv + ConvNeXt stages (2, 2)

    uint32_t codebook_vec_dim() const { return codebook_dim / 2; }
};

// The decoder's metadata keys: sources in speech_tokenizer/config.json, or constants that the
// official code hard-codes.
const std::vector<MetaKey<DecoderHParams>> &decoder_meta_keys();

// The part as a whole (file, kind, format version, checkpoint folder, unused tensors).
const PartInfo &decoder_part();

// Every tensor a decoder GGUF holds, in file order, for the given hparams.
std::vector<TensorSpec> decoder_tensor_specs(const DecoderHParams &hp);

// Name helpers shared by the spec table and the graph builder.
namespace dec_name {
std::string codebook(int q);
inline const char *RVQ_FIRST_OUT = "dec.rvq_first.out.weight";
inline const char *RVQ_REST_OUT = "dec.rvq_rest.out.weight";
inline const char *PRE_CONV = "dec.pre_conv";
inline const char *IN_PROJ = "dec.tfm.in_proj";
inline const char *OUT_PROJ = "dec.tfm.out_proj";
inline const char *TFM_NORM = "dec.tfm.norm.weight";
std::string layer(int il, const char *part);        // dec.tfm.blk.{il}.{part}
std::string upsample(int i, const char *part);      // dec.up.{i}.{part}
std::string vocoder(const std::string &part);       // dec.voc.{part}
}  // namespace dec_name

}  // namespace kazeia
