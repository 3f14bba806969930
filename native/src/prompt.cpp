// The prompt room: id checks, the codec prefix of a voice, and the assembly of the prompt rows.
#include "prompt.h"

#include <algorithm>
#include <cctype>

#include "kazeia/error.h"
#include "lm_graph.h"
#include "talker_model.h"

namespace kazeia {

namespace {

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

std::string join(const std::vector<std::string> &v) {
    std::string out;
    for (const std::string &s : v) out += (out.empty() ? "" : ", ") + s;
    return out;
}

int64_t index_of(const std::vector<std::string> &names, const std::string &name) {
    const auto it = std::find(names.begin(), names.end(), name);
    return it == names.end() ? -1 : it - names.begin();
}

const char *PROMPT_TEXT = "the assistant prompt '<|im_start|>assistant\\n{text}<|im_end|>\\n"
                          "<|im_start|>assistant\\n'";

}  // namespace

int64_t prompt_text_tokens(const TalkerHParams &hp, const std::vector<int32_t> &ids) {
    const int64_t n = (int64_t)ids.size(), frame = PROMPT_ROLE_TOKENS + PROMPT_TRAILER_TOKENS;
    if (n < frame + 1)
        throw InputError(std::string("input_ids must be ") + PROMPT_TEXT +
                         " with at least one text token (got " + std::to_string(n) + " ids)");
    for (int64_t i = 0; i < n; ++i)
        if (ids[i] < 0 || (uint32_t)ids[i] >= hp.text_vocab_size)
            throw InputError("input id " + std::to_string(ids[i]) + " at " + std::to_string(i) +
                             " is outside 0.." + std::to_string(hp.text_vocab_size - 1));
    // <|im_start|> assistant \n {text} <|im_end|> \n <|im_start|> assistant \n
    const int64_t end = n - PROMPT_TRAILER_TOKENS;
    if ((uint32_t)ids[0] != hp.im_start_id || (uint32_t)ids[1] != hp.assistant_id ||
        (uint32_t)ids[end] != hp.im_end_id || (uint32_t)ids[end + 2] != hp.im_start_id ||
        (uint32_t)ids[end + 3] != hp.assistant_id)
        throw InputError(std::string("input_ids must be ") + PROMPT_TEXT + " (role tokens not found)");
    return n - frame;
}

std::vector<int32_t> codec_prefix(const TalkerHParams &hp, const std::string &speaker_name,
                                  const std::string &language_name) {
    const std::string language = lower(language_name), speaker = lower(speaker_name);
    const int64_t si = index_of(hp.speaker_names, speaker);
    if (si < 0)
        throw InputError("unknown speaker '" + speaker_name + "'; valid speakers: " +
                         join(hp.speaker_names));
    int64_t language_id = -1;
    if (language != "auto") {
        const int64_t li = index_of(hp.language_names, language);
        if (li < 0)
            throw InputError("unknown language '" + language_name + "'; valid languages: auto, " +
                             join(hp.language_names));
        language_id = hp.language_ids[li];
    }
    // Dialect speakers speak their dialect when the language is Chinese or automatic.
    const std::string &dialect = hp.speaker_dialects[si];
    if (!dialect.empty() && (language == "auto" || language == "chinese")) {
        const int64_t di = index_of(hp.language_names, dialect);
        if (di >= 0) language_id = hp.language_ids[di];
    }
    std::vector<int32_t> codec;
    if (language_id < 0) {
        codec = {(int32_t)hp.codec_nothink_id, (int32_t)hp.codec_think_bos_id,
                 (int32_t)hp.codec_think_eos_id};
    } else {
        codec = {(int32_t)hp.codec_think_id, (int32_t)hp.codec_think_bos_id, (int32_t)language_id,
                 (int32_t)hp.codec_think_eos_id};
    }
    codec.push_back((int32_t)hp.speaker_ids[si]);
    return codec;
}

Prompt build_prompt(const TalkerModel &m, const std::vector<int32_t> &ids,
                    const GenerationOptions &o, ggml_backend_t backend, WorkerPool *pool) {
    const TalkerHParams &hp = m.hp;
    const int64_t n_text = prompt_text_tokens(hp, ids);
    const std::vector<int32_t> codec = codec_prefix(hp, o.speaker, o.language);
    const int64_t d = hp.talker.hidden_size;
    const int32_t pad = (int32_t)hp.tts_pad_id, bos = (int32_t)hp.tts_bos_id,
                  eos = (int32_t)hp.tts_eos_id;
    const auto role_end = ids.begin() + PROMPT_ROLE_TOKENS;

    // One text-projection pass over every text row the generation will use:
    // role, the text itself, pad, bos, eos.
    std::vector<int32_t> text(ids.begin(), role_end);
    text.insert(text.end(), role_end, role_end + n_text);
    text.insert(text.end(), {pad, bos, eos});
    const std::vector<float> proj = m.text_projection(text, backend, pool);
    auto row = [&](int64_t i) { return proj.data() + i * d; };
    const int64_t i_body = PROMPT_ROLE_TOKENS, i_pad = i_body + n_text, i_bos = i_pad + 1,
                  i_eos = i_pad + 2;

    Prompt p;
    p.width = d;
    p.pad_row.assign(row(i_pad), row(i_pad) + d);
    auto push = [&](const float *text_row, int64_t codec_id) {
        const size_t at = p.prefill.size();
        p.prefill.insert(p.prefill.end(), text_row, text_row + d);
        if (codec_id >= 0) add_embedding_row(m.codec_embd, codec_id, p.prefill.data() + at);
    };
    for (int64_t i = 0; i < PROMPT_ROLE_TOKENS; ++i) push(row(i), -1);
    for (int32_t c : codec) push(row(i_pad), c);
    push(row(i_bos), hp.codec_pad_id);
    p.voice_rows = p.rows();
    p.voice_key.assign(ids.begin(), role_end);
    p.voice_key.insert(p.voice_key.end(), codec.begin(), codec.end());
    if (o.non_streaming) {
        for (int64_t i = 0; i < n_text; ++i) push(row(i_body + i), hp.codec_pad_id);
        push(row(i_eos), hp.codec_pad_id);
        push(row(i_pad), hp.codec_bos_id);
    } else {
        push(row(i_body), hp.codec_bos_id);
        for (int64_t i = 1; i < n_text; ++i)
            p.trailing.insert(p.trailing.end(), row(i_body + i), row(i_body + i) + d);
        p.trailing.insert(p.trailing.end(), row(i_eos), row(i_eos) + d);
    }
    return p;
}

}  // namespace kazeia
