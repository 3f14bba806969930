// The hyper-parameters of each model part, as its GGUF file holds them (each part's format
// table in src/*_arch.cpp names the key and checkpoint source of every field). The loaders fill
// them; the public classes hand them out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kazeia {

// One Qwen3 decoder stack (talker or code predictor).
struct LmHParams {
    uint32_t hidden_size = 0;
    uint32_t intermediate_size = 0;
    uint32_t num_layers = 0;
    uint32_t num_heads = 0;
    uint32_t num_kv_heads = 0;
    uint32_t head_dim = 0;
    uint32_t vocab_size = 0;  // codec vocabulary of its head(s)
    float rms_norm_eps = 0.0f;
    float rope_theta = 0.0f;
};

struct TalkerHParams {
    // The checkpoint's kind (config.json tts_model_type): "custom_voice" (built-in speakers,
    // instructions on 1.7B), "base" (voices cloned from a recording) or "voice_design" (a
    // voice described in words); and its size tag (tts_model_size: "0b6", "1b7").
    std::string model_type, model_size;
    LmHParams talker, predictor;
    uint32_t text_vocab_size = 0;
    uint32_t text_hidden_size = 0;
    uint32_t num_code_groups = 0;  // codes per frame (16)
    // special ids (config.json)
    uint32_t codec_pad_id = 0, codec_bos_id = 0, codec_eos_id = 0, codec_think_id = 0,
             codec_nothink_id = 0, codec_think_bos_id = 0, codec_think_eos_id = 0;
    uint32_t tts_pad_id = 0, tts_bos_id = 0, tts_eos_id = 0;
    uint32_t im_start_id = 0, im_end_id = 0, assistant_id = 0;
    // generation defaults (generation_config.json)
    float temperature = 0.0f, top_p = 0.0f, repetition_penalty = 0.0f;
    uint32_t top_k = 0;
    float sub_temperature = 0.0f, sub_top_p = 0.0f;
    uint32_t sub_top_k = 0;
    uint32_t max_new_tokens = 0;
    // tables: speaker -> codec row, language -> codec id, speaker -> dialect language ("" none)
    std::vector<std::string> speaker_names;
    std::vector<uint32_t> speaker_ids;
    std::vector<std::string> speaker_dialects;
    std::vector<std::string> language_names;
    std::vector<uint32_t> language_ids;

    bool has_mtp_projection() const { return talker.hidden_size != predictor.hidden_size; }
    bool is_base() const { return model_type == "base"; }
    bool is_voice_design() const { return model_type == "voice_design"; }
    // Whether the prompt takes a style instruction: VoiceDesign (its voice description) and
    // CustomVoice 1.7B; the official code drops the instruction of the 0.6B CustomVoice.
    bool follows_instructions() const {
        return is_voice_design() || (model_type == "custom_voice" && model_size != "0b6");
    }
};

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

}  // namespace kazeia
