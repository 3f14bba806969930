// The prompt room: every fact of the talker's prompt layout (DESIGN.md section 2) in one place.
// The Base (voice-cloning) and VoiceDesign layouts of later model kinds are added here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ggml_raii.h"
#include "kazeia/generator.h"
#include "worker_pool.h"

namespace kazeia {

struct TalkerModel;

// The codec tokens of the prompt before the text: think/nothink, think_bos, [language],
// think_eos, speaker. InputError names the valid speakers or languages.
std::vector<int32_t> codec_prefix(const TalkerHParams &hp, const std::string &speaker,
                                  const std::string &language);

// The talker's input rows of one generation, P(x) the text path and C(x) the codec embedding:
// P(role ids); P(tts_pad) + C(codec prefix); P(tts_bos) + C(codec_pad); then the text: its
// first token + C(codec_bos) with the rest fed one per step (streaming text), or all of it
// + C(codec_pad), P(tts_eos) + C(codec_pad), P(tts_pad) + C(codec_bos) (non-streaming).
struct Prompt {
    int64_t width = 0;            // talker hidden size: the length of every row
    std::vector<float> prefill;   // [rows, width]
    std::vector<float> trailing;  // streaming text rows, one per step: [n, width]
    std::vector<float> pad_row;   // P(tts_pad): the text row of every step after those
    // The leading prefill rows that depend only on the voice (role, codec prefix, P(bos) +
    // C(pad)), and what they depend on: their talker K/V can be computed once per voice.
    int64_t voice_rows = 0;
    std::vector<int32_t> voice_key;

    int64_t rows() const { return (int64_t)prefill.size() / width; }
    // The text row added to the input of decode step `t` (0 for the step after frame 0).
    const float *step_text(int64_t t) const {
        return (t + 1) * width <= (int64_t)trailing.size() ? trailing.data() + t * width
                                                           : pad_row.data();
    }
};

// Checks `ids` (an assistant prompt, see PROMPT_ROLE_TOKENS) and assembles its rows.
Prompt build_prompt(const TalkerModel &m, const std::vector<int32_t> &ids,
                    const GenerationOptions &o, ggml_backend_t backend, WorkerPool *pool);

}  // namespace kazeia
