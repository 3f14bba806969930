// The prompt room: every fact of the talker's prompt layouts (docs/model.md, "The prompt") in
// one place: CustomVoice (a built-in speaker, with an instruction on 1.7B), VoiceDesign (a
// described voice), Base (a cloned voice: x-vector only, or in context with the reference
// recording's codes and transcript).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ggml_raii.h"
#include "kazeia/generator.h"
#include "worker_pool.h"

namespace kazeia {

struct TalkerModel;

// The number of text tokens in `input_ids`; InputError unless it is an assistant prompt of
// this model's vocabulary with at least one text token.
int64_t prompt_text_tokens(const TalkerHParams &hp, const std::vector<int32_t> &input_ids);

// The talker's input rows of one generation, P(x) the text path and C(x) the codec embedding:
//   P(instruction ids)                              (when there is an instruction)
//   P(role ids)
//   P(tts_pad) + C(tag) for each codec tag           think/nothink, think_bos, [language], think_eos
//   P(tts_pad) + speaker row                         C(speaker id) | the x-vector | (none: design)
//   P(tts_bos) + C(codec_pad)
// then the text, either
//   streaming:      P(text[0]) + C(codec_bos); text[1:] and P(tts_eos) fed one per step
//   non-streaming:  P(text) + C(codec_pad), P(tts_eos) + C(codec_pad), P(tts_pad) + C(codec_bos)
// or, for an in-context clone, with T = P(ref text ++ text) ++ P(tts_eos) and
// R = C(codec_bos) ++ one row per reference frame (C(code 0) + the predictor's embeddings of
// codes 1..15):
//   streaming:      T[i] + R[i] over R's length (T padded with P(tts_pad)); the rest of T trails
//   non-streaming:  T[i] + C(codec_pad) for all of T, then R[j] + P(tts_pad)
// Every step after the trailing rows adds P(tts_pad).
struct Prompt {
    int64_t width = 0;            // talker hidden size: the length of every row
    std::vector<float> prefill;   // [rows, width]
    std::vector<float> trailing;  // text rows fed one per step: [n, width]
    std::vector<float> pad_row;   // P(tts_pad): the text row of every step after those
    // The leading prefill rows that depend only on the voice (instruction, role, codec tags,
    // speaker row, P(bos) + C(pad)), and what they depend on: their talker K/V can be computed
    // once per voice.
    int64_t voice_rows = 0;
    std::vector<int32_t> voice_key;

    int64_t rows() const { return (int64_t)prefill.size() / width; }
    // The text row added to the input of decode step `t` (0 for the step after frame 0).
    const float *step_text(int64_t t) const {
        return (t + 1) * width <= (int64_t)trailing.size() ? trailing.data() + t * width
                                                           : pad_row.data();
    }
};

// Checks `ids` (an assistant prompt, see PROMPT_ROLE_TOKENS) and the voice options against the
// model's kind (InputError saying what this model takes), and assembles the rows.
Prompt build_prompt(const TalkerModel &m, const std::vector<int32_t> &ids,
                    const GenerationOptions &o, ggml_backend_t backend, WorkerPool *pool);

}  // namespace kazeia
