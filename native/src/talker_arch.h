// Talker (Qwen3 LM over codec tokens, with its text path) and code predictor: their format
// table in the idiom of arch.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "arch.h"
#include "kazeia/hparams.h"

namespace kazeia {

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
