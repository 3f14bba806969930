// Generator: text token ids -> audio codes [T, 16], frame by frame (talker + code predictor).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kazeia/core_share.h"
#include "kazeia/hparams.h"

namespace kazeia {

using Frame = std::array<int32_t, 16>;

// The layout of input_ids, the tokenized assistant prompt
// '<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n': PROMPT_ROLE_TOKENS ids
// before the text (<|im_start|> assistant \n), PROMPT_TRAILER_TOKENS after it
// (<|im_end|> \n <|im_start|> assistant \n).
inline constexpr int64_t PROMPT_ROLE_TOKENS = 3;
inline constexpr int64_t PROMPT_TRAILER_TOKENS = 5;

// The frames a generation of `text_tokens` text tokens may take before it is cut: random
// weights and broken prompts never say eos. Speech runs at ~3-6 text tokens per second, i.e.
// 2-4 frames per token; this leaves room for slow speech.
inline int64_t frame_budget(int64_t text_tokens) { return 40 + 12 * text_tokens; }

// What makes a voice beyond a built-in speaker (prompt.h has each layout). Token ids are
// tokenized chat turns:
//   instruct_ids  '<|im_start|>user\n{instruction}<|im_end|>\n': a speaking style (CustomVoice
//                 1.7B) or the description of a voice (VoiceDesign); empty: none
//   speaker_embedding  Base: the x-vector of a reference recording [talker hidden]
//   ref_ids, ref_codes Base, in-context cloning: '<|im_start|>assistant\n{transcript}<|im_end|>\n'
//                 of the reference recording and its speech-tokenizer codes (both or neither)
struct VoiceOptions {
    std::vector<int32_t> instruct_ids;
    std::vector<float> speaker_embedding;
    std::vector<int32_t> ref_ids;
    std::vector<Frame> ref_codes;
};

struct GenerationOptions {
    std::string speaker;             // a built-in speaker of the model (CustomVoice only)
    VoiceOptions voice;
    std::string language = "auto";   // a language name of the model, or "auto"
    bool non_streaming = false;      // whole text in the prefill instead of one token per frame
    bool greedy = false;             // argmax of the processed logits
    std::optional<uint64_t> seed;    // unset: drawn from std::random_device
    // Unset values come from the model's generation_config.json.
    std::optional<float> temperature, top_p, repetition_penalty;
    std::optional<int> top_k;
    int max_frames = 0;  // > 0
};

// The talker's K/V cache types: f32, the official model's arithmetic; f16 (values rounded to
// 11 significant bits: half the memory, and half the bytes each step of a long answer reads);
// auto: f16 where the talker's weights are quantized (rounded far more than that), else f32.
inline constexpr const char *KV_CACHE_TYPES[] = {"auto", "f32", "f16"};

class GenerationSession;
struct TalkerModel;        // the loaded talker GGUF (src/talker.h)
struct GenerationProbes;   // the tests' and benches' options (src/generation_probes.h)

class Generator {
  public:
    // `polite`: see WorkerPool (set when another engine stage computes at the same time).
    // `talker_device` and `predictor_device`: where each stack computes, a placement of
    // devices.h ("cpu", "vulkan:0", "auto", ...; InputError listing the devices when absent).
    // `core_share`: the one the engine's decoder has (core_share.h), or none.
    Generator(const std::string &talker_gguf, int n_threads, bool polite = false,
              const std::string &talker_device = "cpu", const std::string &predictor_device = "cpu",
              std::shared_ptr<CoreShare> core_share = nullptr);
    ~Generator();
    Generator(const Generator &) = delete;
    Generator &operator=(const Generator &) = delete;

    const TalkerHParams &hparams() const;
    int n_threads() const;
    // The thread count of the generations started after it (InputError outside 1..512); those
    // running keep theirs. Each generation builds its own pool, so a changed setting needs no
    // second load of the weights.
    void set_threads(int n_threads);
    // The talker's K/V cache type of the generations started after it: one of KV_CACHE_TYPES
    // (InputError for another); those running keep theirs. f32 at load; read back resolved
    // ("f32" or "f16").
    std::string kv_cache_type() const;
    void set_kv_cache_type(const std::string &type);
    // The resolved devices of the two stacks ("cpu", "vulkan:0", ...).
    const std::string &talker_device() const;
    const std::string &predictor_device() const;
    const std::shared_ptr<CoreShare> &core_share() const;
    // Its talker file changed on disk while mapped: every generation fails (ModelError)
    // until the model is loaded again.
    bool damaged() const;
    // The number of text tokens in `input_ids`; InputError unless it is an assistant prompt
    // of this model's vocabulary with at least one text token.
    int64_t text_tokens(const std::vector<int32_t> &input_ids) const;

    // Starts a generation; validates ids, speaker and language (InputError listing the valid
    // ones). The generator must outlive the session. Sessions of one generator may run
    // concurrently on different threads.
    std::unique_ptr<GenerationSession> start(const std::vector<int32_t> &input_ids,
                                             const GenerationOptions &options) const;

  private:
    friend std::unique_ptr<GenerationSession> start_probed(const Generator &generator,
                                                           const std::vector<int32_t> &input_ids,
                                                           const GenerationOptions &options,
                                                           const GenerationProbes &probes);
    std::unique_ptr<TalkerModel> model_;
};

// What a session has done so far.
struct GenerationStats {
    int64_t frames = 0;
    // Milliseconds spent in the talker (prefill included) and the code predictor, and in
    // frames computed whole as one graph on a GPU (talker step, code 0 and the code predictor
    // together, where both stacks share the GPU: src/frame_graph.h), counted in neither.
    double talker_ms = 0.0, predictor_ms = 0.0, frame_graph_ms = 0.0;
    // Milliseconds spent building and allocating the session's graphs and caches (once per
    // session: the code predictor's 14 per-frame sub-steps reuse one graph).
    double graph_setup_ms = 0.0;
    // The graph computations that computed the code predictor: 15 a frame by single steps, 1
    // a frame where its whole frame is one graph on a GPU (src/code_predictor.h), or a part of
    // a whole frame's.
    int64_t predictor_computations = 0;
    // Every graph computation of the session (the voice prefix's, the prefill, the talker's
    // steps, the code predictor's), each a submission the host waits for on a GPU: 16 a frame
    // on the CPU, 2 with the code predictor's frame as one graph, 1 for a whole frame.
    int64_t computations = 0;
};

class GenerationSession {
  public:
    ~GenerationSession();
    // The next frame's 16 codes, or nothing once eos or max_frames is reached.
    std::optional<Frame> next();
    GenerationStats stats() const;

    struct State;

  private:
    friend std::unique_ptr<GenerationSession> start_probed(const Generator &generator,
                                                           const std::vector<int32_t> &input_ids,
                                                           const GenerationOptions &options,
                                                           const GenerationProbes &probes);
    explicit GenerationSession(std::unique_ptr<State> state);
    std::unique_ptr<State> state_;
};

}  // namespace kazeia
