// The prompt room: id checks, the voice of each model kind, and the assembly of the prompt rows.
#include "prompt.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "kazeia/error.h"
#include "lm_graph.h"
#include "talker.h"

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

void check_vocab(const TalkerHParams &hp, const std::vector<int32_t> &ids, const char *what) {
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] < 0 || (uint32_t)ids[i] >= hp.text_vocab_size)
            throw InputError(std::string(what) + " id " + std::to_string(ids[i]) + " at " +
                             std::to_string(i) + " is outside 0.." +
                             std::to_string(hp.text_vocab_size - 1));
}

// A chat turn '<|im_start|>{role}\n{text}<|im_end|>\n' with at least one text token: the
// number of its text tokens (between the 3 role ids and the 2 closing ids).
int64_t chat_turn_text(const TalkerHParams &hp, const std::vector<int32_t> &ids, const char *what,
                       const char *layout) {
    check_vocab(hp, ids, what);
    const int64_t n = (int64_t)ids.size();
    if (n < 6 || (uint32_t)ids[0] != hp.im_start_id || (uint32_t)ids[n - 2] != hp.im_end_id)
        throw InputError(std::string(what) + " must be the tokenized " + layout +
                         " with at least one text token");
    return n - 5;
}

// Which prompt a generation builds (see prompt.h).
enum class Layout { BUILT_IN_SPEAKER, DESIGN, CLONE_X_VECTOR, CLONE_IN_CONTEXT };

// The layout that the model's kind and the options ask for; InputError when they do not fit.
Layout check_voice(const TalkerHParams &hp, const GenerationOptions &o) {
    const VoiceOptions &v = o.voice;
    const bool clone = !v.speaker_embedding.empty() || !v.ref_ids.empty() || !v.ref_codes.empty();
    if (!v.instruct_ids.empty()) {
        if (!hp.follows_instructions())
            throw InputError(
                hp.is_base() ? std::string("a Base model takes no instruction: it speaks like its "
                                           "reference recording")
                             : "the 0.6B CustomVoice model takes no instruction (the official "
                               "code ignores it): instructions need a 1.7B CustomVoice or a "
                               "VoiceDesign model");
        chat_turn_text(hp, v.instruct_ids, "instruct_ids",
                       "instruction '<|im_start|>user\\n{instruction}<|im_end|>\\n'");
    }
    if (hp.model_type == "custom_voice") {
        if (clone)
            throw InputError("a CustomVoice model speaks with its built-in speakers (" +
                             join(hp.speaker_names) + "): cloning a voice needs a Base model");
        return Layout::BUILT_IN_SPEAKER;
    }
    if (hp.is_voice_design()) {
        if (!o.speaker.empty() || clone)
            throw InputError("a VoiceDesign model has no speakers and clones no voice: describe "
                             "the voice in the instruction");
        return Layout::DESIGN;
    }
    if (!hp.is_base())
        throw ModelError("unknown model kind '" + hp.model_type + "' (config.json tts_model_type)");
    if (!o.speaker.empty())
        throw InputError("a Base model has no built-in speakers: it clones the voice of a "
                         "reference recording (speaker embedding)");
    if (v.speaker_embedding.empty())
        throw InputError("a Base model needs the speaker embedding (x-vector) of a reference "
                         "recording");
    if (v.speaker_embedding.size() != hp.talker.hidden_size)
        throw InputError("the speaker embedding has " + std::to_string(v.speaker_embedding.size()) +
                         " values; this model takes " + std::to_string(hp.talker.hidden_size));
    if (v.ref_ids.empty() != v.ref_codes.empty())
        throw InputError("in-context cloning needs both the reference transcript (ref_ids) and "
                         "the reference codes (ref_codes); give neither for x-vector-only cloning");
    if (v.ref_ids.empty()) return Layout::CLONE_X_VECTOR;
    chat_turn_text(hp, v.ref_ids, "ref_ids",
                   "reference transcript '<|im_start|>assistant\\n{text}<|im_end|>\\n'");
    for (size_t t = 0; t < v.ref_codes.size(); ++t)
        for (size_t g = 0; g < v.ref_codes[t].size(); ++g)
            if (v.ref_codes[t][g] < 0 || (uint32_t)v.ref_codes[t][g] >= hp.predictor.vocab_size)
                throw InputError("reference code " + std::to_string(v.ref_codes[t][g]) +
                                 " (frame " + std::to_string(t) + ", codebook " +
                                 std::to_string(g) + ") is outside 0.." +
                                 std::to_string(hp.predictor.vocab_size - 1));
    return Layout::CLONE_IN_CONTEXT;
}

// The codec tags before the speaker row: think/nothink, think_bos, [language], think_eos. A
// built-in dialect speaker speaks its dialect when the language is Chinese or automatic.
std::vector<int32_t> codec_tags(const TalkerHParams &hp, const std::string &language_name,
                                const std::string &dialect) {
    const std::string language = lower(language_name);
    int64_t language_id = -1;
    if (language != "auto") {
        const int64_t li = index_of(hp.language_names, language);
        if (li < 0)
            throw InputError("unknown language '" + language_name + "'; valid languages: auto, " +
                             join(hp.language_names));
        language_id = hp.language_ids[li];
    }
    if (!dialect.empty() && (language == "auto" || language == "chinese")) {
        const int64_t di = index_of(hp.language_names, dialect);
        if (di >= 0) language_id = hp.language_ids[di];
    }
    if (language_id < 0)
        return {(int32_t)hp.codec_nothink_id, (int32_t)hp.codec_think_bos_id,
                (int32_t)hp.codec_think_eos_id};
    return {(int32_t)hp.codec_think_id, (int32_t)hp.codec_think_bos_id, (int32_t)language_id,
            (int32_t)hp.codec_think_eos_id};
}

// The built-in speaker's index; InputError naming the valid ones.
int64_t speaker_index(const TalkerHParams &hp, const std::string &speaker_name) {
    const int64_t si = index_of(hp.speaker_names, lower(speaker_name));
    if (si < 0)
        throw InputError("unknown speaker '" + speaker_name + "'; valid speakers: " +
                         join(hp.speaker_names));
    return si;
}

}  // namespace

int64_t prompt_text_tokens(const TalkerHParams &hp, const std::vector<int32_t> &ids) {
    const int64_t n = (int64_t)ids.size(), frame = PROMPT_ROLE_TOKENS + PROMPT_TRAILER_TOKENS;
    if (n < frame + 1)
        throw InputError(std::string("input_ids must be ") + PROMPT_TEXT +
                         " with at least one text token (got " + std::to_string(n) + " ids)");
    check_vocab(hp, ids, "input");
    // <|im_start|> assistant \n {text} <|im_end|> \n <|im_start|> assistant \n
    const int64_t end = n - PROMPT_TRAILER_TOKENS;
    if ((uint32_t)ids[0] != hp.im_start_id || (uint32_t)ids[1] != hp.assistant_id ||
        (uint32_t)ids[end] != hp.im_end_id || (uint32_t)ids[end + 2] != hp.im_start_id ||
        (uint32_t)ids[end + 3] != hp.assistant_id)
        throw InputError(std::string("input_ids must be ") + PROMPT_TEXT + " (role tokens not found)");
    return n - frame;
}

Prompt build_prompt(const TalkerModel &m, const std::vector<int32_t> &ids,
                    const GenerationOptions &o, ggml_backend_t backend, WorkerPool *pool) {
    const TalkerHParams &hp = m.hp;
    const VoiceOptions &v = o.voice;
    const int64_t n_text = prompt_text_tokens(hp, ids);
    const Layout layout = check_voice(hp, o);
    int64_t speaker = -1;
    if (layout == Layout::BUILT_IN_SPEAKER) speaker = speaker_index(hp, o.speaker);
    const std::vector<int32_t> tags =
        codec_tags(hp, o.language, speaker >= 0 ? hp.speaker_dialects[speaker] : "");
    const int64_t d = hp.talker.hidden_size;
    const int32_t pad = (int32_t)hp.tts_pad_id, bos = (int32_t)hp.tts_bos_id,
                  eos = (int32_t)hp.tts_eos_id;
    const auto role_end = ids.begin() + PROMPT_ROLE_TOKENS;
    // The reference transcript's text tokens (in-context clones).
    const auto ref_begin = v.ref_ids.begin() + std::min<size_t>(v.ref_ids.size(), PROMPT_ROLE_TOKENS);
    const auto ref_end = v.ref_ids.end() - std::min<size_t>(v.ref_ids.size(), 2);

    // One text-projection pass over every text row the generation uses: the instruction, role,
    // the text itself, pad, bos, eos, the reference transcript.
    std::vector<int32_t> text(v.instruct_ids);
    const int64_t i_role = (int64_t)text.size();
    text.insert(text.end(), ids.begin(), role_end + n_text);
    const int64_t i_body = i_role + PROMPT_ROLE_TOKENS, i_pad = i_body + n_text, i_bos = i_pad + 1,
                  i_eos = i_pad + 2, i_ref = i_pad + 3;
    text.insert(text.end(), {pad, bos, eos});
    text.insert(text.end(), ref_begin, ref_end);
    const std::vector<float> proj = m.text_projection(text, backend, pool);
    auto row = [&](int64_t i) { return proj.data() + i * d; };

    Prompt p;
    p.width = d;
    p.pad_row.assign(row(i_pad), row(i_pad) + d);
    // Appends text row + codec row (codec id < 0: none; `extra`: a row added as is).
    auto push = [&](const float *text_row, int64_t codec_id, const float *extra = nullptr) {
        const size_t at = p.prefill.size();
        p.prefill.insert(p.prefill.end(), text_row, text_row + d);
        float *out = p.prefill.data() + at;
        if (codec_id >= 0) add_embedding_row(m.codec_embd, codec_id, out);
        if (extra)
            for (int64_t i = 0; i < d; ++i) out[i] += extra[i];
    };
    for (int64_t i = 0; i < i_body; ++i) push(row(i), -1);  // instruction and role
    for (int32_t c : tags) push(row(i_pad), c);
    if (speaker >= 0) push(row(i_pad), hp.speaker_ids[speaker]);
    if (!v.speaker_embedding.empty()) push(row(i_pad), -1, v.speaker_embedding.data());
    push(row(i_bos), hp.codec_pad_id);

    // The voice rows' key: layout, instruction, role, tags, speaker (id or x-vector bits).
    p.voice_rows = p.rows();
    p.voice_key = {(int32_t)layout, (int32_t)v.instruct_ids.size()};
    p.voice_key.insert(p.voice_key.end(), text.begin(), text.begin() + i_body);
    p.voice_key.insert(p.voice_key.end(), tags.begin(), tags.end());
    if (speaker >= 0) p.voice_key.push_back((int32_t)hp.speaker_ids[speaker]);
    for (float x : v.speaker_embedding) {
        int32_t bits;
        std::memcpy(&bits, &x, sizeof bits);
        p.voice_key.push_back(bits);
    }

    auto trail = [&](const float *r) { p.trailing.insert(p.trailing.end(), r, r + d); };
    if (layout != Layout::CLONE_IN_CONTEXT) {
        if (o.non_streaming) {
            for (int64_t i = 0; i < n_text; ++i) push(row(i_body + i), hp.codec_pad_id);
            push(row(i_eos), hp.codec_pad_id);
            push(row(i_pad), hp.codec_bos_id);
        } else {
            push(row(i_body), hp.codec_bos_id);
            for (int64_t i = 1; i < n_text; ++i) trail(row(i_body + i));
            trail(row(i_eos));
        }
        return p;
    }

    // In context: T = the reference transcript, the text, eos; R = bos, the reference frames.
    std::vector<const float *> t_rows;
    for (int64_t i = 0; i < (int64_t)(ref_end - ref_begin); ++i) t_rows.push_back(row(i_ref + i));
    for (int64_t i = 0; i < n_text; ++i) t_rows.push_back(row(i_body + i));
    t_rows.push_back(row(i_eos));
    const int64_t n_t = (int64_t)t_rows.size(), n_r = 1 + (int64_t)v.ref_codes.size();
    std::vector<float> frame(d);
    auto push_reference = [&](int64_t j, const float *text_row) {
        if (j == 0) return push(text_row, hp.codec_bos_id);
        std::fill(frame.begin(), frame.end(), 0.0f);
        m.add_frame_embedding(v.ref_codes[j - 1], frame.data());
        push(text_row, -1, frame.data());
    };
    if (o.non_streaming) {
        for (const float *t : t_rows) push(t, hp.codec_pad_id);
        for (int64_t j = 0; j < n_r; ++j) push_reference(j, row(i_pad));
    } else {
        for (int64_t j = 0; j < n_r; ++j) push_reference(j, j < n_t ? t_rows[j] : row(i_pad));
        for (int64_t i = n_r; i < n_t; ++i) trail(t_rows[i]);
    }
    // The rows of the reference transcript come before the text in both modes (with the
    // reference frames beside them when streaming): they belong to the voice, and their K/V
    // are computed once too. The key then holds the mode, the transcript and the codes.
    // (At least the last row is prefilled per synthesis: its logits start the generation.)
    const int64_t n_ref_text = std::min<int64_t>(ref_end - ref_begin, o.non_streaming ? n_t : n_r);
    p.voice_rows = std::min(p.voice_rows + n_ref_text, p.rows() - 1);
    p.voice_key.push_back(o.non_streaming ? 1 : 0);
    p.voice_key.insert(p.voice_key.end(), v.ref_ids.begin(), v.ref_ids.end());
    for (const Frame &f : v.ref_codes) p.voice_key.insert(p.voice_key.end(), f.begin(), f.end());
    return p;
}

}  // namespace kazeia
