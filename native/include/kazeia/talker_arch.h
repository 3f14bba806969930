// Talker (Qwen3 LM over codec tokens, with its text path) and code predictor: the one table
// of GGUF metadata keys and tensors, shared by the converter (through the bindings) and the
// C++ loader, like decoder_arch.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kazeia {

inline constexpr const char *TALKER_ARCH = "kazeia-talker";
inline constexpr uint32_t TALKER_FORMAT_VERSION = 1;
inline constexpr const char *TALKER_KEY_FORMAT_VERSION = "kazeia.talker.format_version";

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
};

enum class TalkerMetaType { U32, F32, STR_U32_MAP, STR_STR_MAP };

struct TalkerMetaKey {
    std::string key;          // GGUF key; maps are stored as key + ".names" / key + ".values"
    TalkerMetaType type;
    std::string config_path;  // "config.json:talker_config.hidden_size" or
                              // "generation_config.json:top_k"
    uint32_t TalkerHParams::*u32 = nullptr;
    float TalkerHParams::*f32 = nullptr;
    // maps (names, values)
    std::vector<std::string> TalkerHParams::*names = nullptr;
    std::vector<uint32_t> TalkerHParams::*u32_values = nullptr;
    std::vector<std::string> TalkerHParams::*str_values = nullptr;
    uint32_t LmHParams::*lm_u32 = nullptr;  // with `lm`: a field of talker or predictor
    float LmHParams::*lm_f32 = nullptr;
    LmHParams TalkerHParams::*lm = nullptr;
};

const std::vector<TalkerMetaKey> &talker_meta_keys();

// How a checkpoint tensor becomes the stored one: all are plain copies (a torch Linear
// [out, in] and an Embedding [rows, dim] already have ggml's layout); the kind decides
// whether --type may quantize it.
enum class TalkerTensorKind {
    NORM,       // vectors: always f32
    BIAS,       // always f32
    MATRIX,     // linear weights: quantizable
    EMBEDDING,  // lookup tables (read with get_rows): quantizable
};

struct TalkerTensorSpec {
    std::string name;
    std::vector<int64_t> ne;
    // Checkpoint names (model.safetensors); several are stacked along the outermost dimension
    // (the code predictor's 15 heads and 15 embeddings become one tensor each).
    std::vector<std::string> sources;
    TalkerTensorKind kind;
};

std::vector<TalkerTensorSpec> talker_tensor_specs(const TalkerHParams &hp);

namespace tlk_name {
inline const char *TOK_EMBD = "tlk.codec_embd";
inline const char *TEXT_EMBD = "tlk.text_embd";
inline const char *TEXT_FC1 = "tlk.text_proj.fc1";
inline const char *TEXT_FC2 = "tlk.text_proj.fc2";
inline const char *NORM = "tlk.norm.weight";
inline const char *HEAD = "tlk.codec_head.weight";
inline const char *CP_PROJ = "cp.in_proj";
inline const char *CP_NORM = "cp.norm.weight";
inline const char *CP_EMBD = "cp.codec_embd";  // [talker hidden, vocab * (groups - 1)]
inline const char *CP_HEADS = "cp.heads.weight";  // [cp hidden, vocab, groups - 1]
std::string layer(const char *prefix, int il, const char *part);  // {prefix}.blk.{il}.{part}
}  // namespace tlk_name

}  // namespace kazeia
