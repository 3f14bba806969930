// Speech decoder (Qwen3-TTS-Tokenizer-12Hz decoder): its format table in the idiom of arch.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "arch.h"
#include "kazeia/hparams.h"

namespace kazeia {

// Matrices whose output width is a multiple of this run in the decoder's own GEMM (f32 math on
// f32 or f16 weights, in panels of this many rows): only those are stored as f16 when the
// model is quantized (Storage::F16_WHEN_QUANTIZED), so the activations stay f32 everywhere.
inline constexpr int64_t DECODER_CONV_PANEL = 16;

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
