// Speech decoder (Qwen3-TTS-Tokenizer-12Hz decoder): the one table of GGUF
// metadata keys and tensors. The Python converter reads this table through the
// bindings (wyoming_kazeia._native.decoder_arch) and the C++ loader checks a
// file against it, so both agree by construction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kazeia {

// Value of `general.architecture` in a decoder GGUF: the "kind" of the file.
inline constexpr const char *DECODER_ARCH = "kazeia-decoder";
// Bumped whenever the tensor layout or metadata meaning changes.
inline constexpr uint32_t DECODER_FORMAT_VERSION = 1;
inline constexpr const char *DECODER_KEY_FORMAT_VERSION = "kazeia.decoder.format_version";
// Matrices whose output width is a multiple of this run in the decoder's own GEMM (f32 math on
// f32 or f16 weights, in panels of this many rows); the converter stores only those as f16, so
// the activations stay f32 everywhere.
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

// How a metadata key is filled by the converter: a path into the checkpoint's
// speech_tokenizer/config.json ("decoder_config.codebook_size"), or, for the
// few constants that the official code hard-codes, a literal value.
enum class MetaType { U32, F32, U32_ARRAY };

struct MetaKey {
    const char *key;          // GGUF key
    MetaType type;
    const char *config_path;  // dotted path in speech_tokenizer/config.json, or nullptr
    double constant;          // used when config_path is nullptr
    // Where the loader stores the value (exactly one is set, matching `type`).
    uint32_t DecoderHParams::*u32 = nullptr;
    float DecoderHParams::*f32 = nullptr;
    std::vector<uint32_t> DecoderHParams::*u32_array = nullptr;
};

const std::vector<MetaKey> &decoder_meta_keys();

// How the converter turns checkpoint tensors into the stored one. The layouts
// are "channel fastest": a conv activation is [C, T] with ne0 = C.
enum class Transform {
    COPY,          // as is (vectors, norm weights)
    LINEAR,        // torch Linear [out, in] -> ggml [in, out]: same bytes
    CONV,          // torch Conv1d [out, in, k] -> ggml [k*in, out] (tap-major rows)
    TRANS_CONV,    // torch ConvTranspose1d [in, out, m*r] -> ggml [m*in, r*out]
    DEPTHWISE,     // torch depthwise Conv1d [C, 1, k] -> ggml [C, k]
    CODEBOOK,      // embedding_sum / clamp(cluster_usage, 1e-5) -> ggml [dim, size]
    EXP,           // exp(x): SnakeBeta alpha
    INV_EXP,       // 1 / (exp(x) + 1e-9): SnakeBeta beta
};

struct TensorSpec {
    std::string name;                  // GGUF tensor name
    std::vector<int64_t> ne;           // ggml shape (ne0 first)
    std::vector<std::string> sources;  // checkpoint names (speech_tokenizer/model.safetensors)
    Transform transform;
    int stride = 0;                    // TRANS_CONV: the stride r
};

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
