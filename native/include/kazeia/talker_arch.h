// Talker (Qwen3 LM over codec tokens, with its text path) and code predictor: their format
// table in the idiom of arch.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kazeia/arch.h"

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

// The talker's metadata keys: sources in config.json and generation_config.json.
const std::vector<MetaKey<TalkerHParams>> &talker_meta_keys();

// The part as a whole (file, kind, format version, checkpoint folder, unused tensors).
const PartInfo &talker_part();

// Every tensor a talker GGUF holds, in file order. Matrices and embedding tables are
// quantizable; norms and biases stay f32. The code predictor's 15 heads are stacked into one
// tensor and its 15 embedding tables concatenated into one.
std::vector<TensorSpec> talker_tensor_specs(const TalkerHParams &hp);

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
