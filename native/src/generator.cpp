// Generation: the frame loop (talker step -> code 0 -> code predictor) and its sampling. The
// prompt is assembled in prompt.cpp, the talker steps in talker.cpp (TalkerRun).
#include "kazeia/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>

#include "code_predictor.h"
#include "core_share_marks.h"
#include "cpu_backend.h"
#include "devices_internal.h"
#include "frame_graph.h"
#include "generation_probes.h"
#include "ops.h"
#include "kazeia/devices.h"
#include "kazeia/error.h"
#include "prompt.h"
#include "sampler.h"
#include "talker.h"

namespace kazeia {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The sampling of one generation: the options, else the model's generation_config.json.
struct Sampling {
    SamplingParams talker, predictor;
    float repetition_penalty = 1.0f;

    Sampling(const TalkerHParams &hp, const GenerationOptions &o)
        : talker{o.greedy, o.temperature.value_or(hp.temperature), o.top_k.value_or((int)hp.top_k),
                 o.top_p.value_or(hp.top_p)},
          predictor{o.greedy, o.temperature.value_or(hp.sub_temperature),
                    o.top_k.value_or((int)hp.sub_top_k), o.top_p.value_or(hp.sub_top_p)},
          repetition_penalty(o.repetition_penalty.value_or(hp.repetition_penalty)) {
        for (const SamplingParams *p : {&talker, &predictor}) {
            if (!(p->temperature > 0.0f)) throw InputError("temperature must be > 0");
            if (p->top_k < 0) throw InputError("top_k must be >= 0");
            if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) throw InputError("top_p must be in (0, 1]");
        }
        if (!(repetition_penalty > 0.0f)) throw InputError("repetition_penalty must be > 0");
    }
};

}  // namespace

// One generation: the frame loop (talker step -> code 0 -> code predictor) and its sampling.
struct GenerationSession::State {
    const TalkerModel &m;
    GenerationOptions opt;
    GenerationProbes probes;
    GenerationTrace *trace;
    WorkerPool pool;  // the weight matmuls; the graphs themselves run on this thread
    BackendPtr backend;  // the CPU: the prompt, and the stacks placed on the CPU
    // A backend on each GPU a stack is placed on (one for both when they share it).
    std::map<std::string, BackendPtr> backend_by_gpu;
    Rng rng;
    Sampling sampling;
    Prompt prompt;
    std::unique_ptr<TalkerRun> talker;
    std::unique_ptr<CodePredictor> predictor;
    // Whole frames on the GPU both stacks share, where it can (whole_frames()).
    std::unique_ptr<FrameGraph> frame_graph;
    bool frame_graph_tried = false;
    int64_t frame_graph_computations = 0;
    std::vector<int32_t> history;       // sampled codes 0
    std::optional<Frame> pending_step;  // a frame whose talker step has not run yet
    std::vector<float> scratch, step_embed;
    int64_t n_frames = 0;
    bool started = false, done = false;
    double talker_ms = 0.0, predictor_ms = 0.0, frame_graph_ms = 0.0, graph_setup_ms = 0.0;

    State(const TalkerModel &model, const std::vector<int32_t> &ids, const GenerationOptions &o,
          const GenerationProbes &p)
        : m(model), opt(o), probes(p), trace(p.trace),
          pool(model.n_threads, model.polite, model.core_share.get(), PoolStage::Generator),
          rng(o.seed ? *o.seed : ((uint64_t)std::random_device{}() << 32 | std::random_device{}())),
          sampling(model.hp, o) {
        if (o.max_frames < 1) throw InputError("max_frames must be >= 1");
        if (p.kv_block < 1) throw InputError("kv_block must be >= 1");
        for (size_t i = 0; i < p.forced.size(); ++i)
            for (size_t g = 0; g < p.forced[i].size(); ++g) {
                const int64_t limit = g ? model.hp.predictor.vocab_size : model.hp.talker.vocab_size;
                if (p.forced[i][g] < 0 || p.forced[i][g] >= limit)
                    throw InputError("forced code " + std::to_string(p.forced[i][g]) + " at frame " +
                                     std::to_string(i) + ", codebook " + std::to_string(g) +
                                     " is outside 0.." + std::to_string(limit - 1));
            }
        backend.reset(new_cpu_backend());
        prompt = build_prompt(m, ids, o, backend.get(), &pool);
        const auto t0 = std::chrono::steady_clock::now();
        talker = std::make_unique<TalkerRun>(m, prompt, o.max_frames, p.kv_block,
                                             backend_for(m.talker_at), &pool);
        predictor = std::make_unique<CodePredictor>(m, backend_for(m.predictor_at), &pool);
        graph_setup_ms = ms_since(t0);
        if (trace) {
            trace->hidden = prompt.width;
            trace->prefill_embeds = prompt.prefill;
        }
    }

    // Where a stack's graphs compute: the CPU backend, or the backend on its GPU.
    ggml_backend_t backend_for(const StackPlacement &at) {
        if (at.on_cpu()) return backend.get();
        BackendPtr &gpu = backend_by_gpu[at.device];
        if (!gpu) gpu.reset(new_gpu_backend(at.device));
        return gpu.get();
    }

    // The talker's input row that feeds the pending frame back: C(c0) + the predictor's
    // embeddings of c1..c15 + the text row of its step.
    const float *pending_step_input() {
        const int64_t d = m.hp.talker.hidden_size;
        step_embed.assign(d, 0.0f);
        m.add_frame_embedding(*pending_step, step_embed.data());
        pending_step.reset();
        const float *text = prompt.step_text(n_frames - 1);
        for (int64_t i = 0; i < d; ++i) step_embed[i] += text[i];
        return step_embed.data();
    }

    // Marks the generation computing while a stack computes on the CPU: a decoder push beside
    // it then leaves the generator a core (kazeia/core_share.h).
    GeneratorComputing computing_on(const StackPlacement &at) const {
        return GeneratorComputing(at.on_cpu() ? m.core_share.get() : nullptr);
    }

    void talker_step() {
        const auto t0 = std::chrono::steady_clock::now();
        pending_step_input();
        if (trace) trace->step_embeds.insert(trace->step_embeds.end(), step_embed.begin(), step_embed.end());
        const GeneratorComputing computing = computing_on(m.talker_at);
        talker->step(step_embed.data());
        talker_ms += ms_since(t0);
        record_talker_call();
    }

    // Whether the frames from now on are computed whole on the GPU both stacks share
    // (FrameGraph): unless teacher forcing or a trace needs the logits on the host. Built at
    // the first frame after the prefill, and handed the pending frame's input row and the
    // codes 0 so far.
    bool whole_frames() {
        if (frame_graph_tried) return frame_graph != nullptr;
        frame_graph_tried = true;
        if (!probes.whole_frames || trace || !probes.forced.empty() || m.talker_at.on_cpu() ||
            m.talker_at.device != m.predictor_at.device)
            return false;
        const auto t0 = std::chrono::steady_clock::now();
        auto graph = std::make_unique<FrameGraph>(m, talker->cache(), predictor->cache(),
                                                  backend_for(m.talker_at), sampling.talker,
                                                  sampling.predictor, sampling.repetition_penalty);
        if (graph->supported()) {
            frame_graph = std::move(graph);
            frame_graph->start(pending_step_input(), history);
        }
        graph_setup_ms += ms_since(t0);
        return frame_graph != nullptr;
    }

    // The next frame in one computation of the frame graph (the pending frame's input row is
    // on the device already).
    Frame whole_frame() {
        const auto t0 = std::chrono::steady_clock::now();
        pending_step.reset();
        const int64_t pos = talker->take_step();
        const Frame frame = frame_graph->compute(pos, prompt.step_text(n_frames),
                                                 n_frames >= EOS_AFTER_FRAMES, rng);
        ++frame_graph_computations;
        frame_graph_ms += ms_since(t0);
        return frame;
    }

    void record_talker_call() {
        if (!trace) return;
        const std::vector<float> &logits = talker->logits(), &hidden = talker->hidden();
        trace->talker_logits.insert(trace->talker_logits.end(), logits.begin(), logits.end());
        trace->talker_hidden.insert(trace->talker_hidden.end(), hidden.begin(), hidden.end());
    }

    // The weights are the file's no longer (it changed on disk while mapped): stop here.
    void check_weights() const {
        if (m.weights.damaged())
            throw ModelError(m.weights.path() +
                             " changed on disk while in use: the model must be reloaded");
    }

    std::optional<Frame> next() {
        if (done) return std::nullopt;
        check_weights();
        const TalkerHParams &hp = m.hp;
        const int64_t vocab = hp.talker.vocab_size;
        if (!started) {
            const auto t0 = std::chrono::steady_clock::now();
            const GeneratorComputing computing = computing_on(m.talker_at);
            talker->prefill(prompt);
            talker_ms += ms_since(t0);
            record_talker_call();
            started = true;
        }
        const bool forcing = !probes.forced.empty();
        const int64_t last = forcing ? std::min<int64_t>(opt.max_frames, probes.forced.size()) : opt.max_frames;
        if (n_frames >= last) {
            done = true;
            return std::nullopt;
        }
        Frame frame{};
        const Frame *forced = forcing ? &probes.forced[n_frames] : nullptr;
        const bool whole = pending_step && whole_frames();
        if (whole) {
            frame = whole_frame();
        } else {
            if (pending_step) talker_step();
            // Code 0: repetition penalty over earlier codes 0 -> suppress the control tokens
            // except eos -> no eos in the first frames -> temperature/top-k/top-p.
            const std::vector<float> &logits = talker->logits();
            scratch.assign(logits.begin(), logits.end());
            apply_repetition_penalty(scratch.data(), vocab, history, sampling.repetition_penalty);
            suppress_range(scratch.data(), vocab, vocab - CODEC_CONTROL_TOKENS, vocab, hp.codec_eos_id);
            if (n_frames < EOS_AFTER_FRAMES) scratch[hp.codec_eos_id] = -INFINITY;
            std::vector<float> tmp;
            frame[0] = forced ? (*forced)[0] : select_token(scratch.data(), vocab, sampling.talker, rng, tmp);
        }
        history.push_back(frame[0]);
        if ((uint32_t)frame[0] == hp.codec_eos_id) {
            done = true;
            return std::nullopt;
        }
        if (!whole) {
            const auto t0 = std::chrono::steady_clock::now();
            const GeneratorComputing computing = computing_on(m.predictor_at);
            predictor->predict(talker->hidden().data(), frame, sampling.predictor, rng,
                               trace ? &trace->cp_logits : nullptr, forced);
            predictor_ms += ms_since(t0);
        }
        check_weights();  // the frame was computed from what the file had become
        ++n_frames;

        // The talker step that feeds this frame back runs at the next call, so the frame
        // reaches its consumer (the decoder) one talker step sooner. The last allowed frame
        // needs no step, except when tracing every talker call.
        pending_step = frame;
        if (trace && n_frames == last) talker_step();
        return frame;
    }
};

namespace {
void check_threads(int n_threads) {
    if (n_threads < 1 || n_threads > 512) throw InputError("threads must be in 1..512");
}
}  // namespace

Generator::Generator(const std::string &talker_gguf, int n_threads, bool polite,
                     const std::string &talker_device, const std::string &predictor_device,
                     std::shared_ptr<CoreShare> core_share) {
    check_threads(n_threads);
    model_ = std::make_unique<TalkerModel>(talker_gguf, n_threads, resolve_placement(talker_device),
                                           resolve_placement(predictor_device));
    model_->polite = polite;
    model_->core_share = std::move(core_share);
}

Generator::~Generator() = default;

const TalkerHParams &Generator::hparams() const { return model_->hp; }
int Generator::n_threads() const { return model_->n_threads; }
void Generator::set_threads(int n_threads) {
    check_threads(n_threads);
    model_->n_threads = n_threads;
}
std::string Generator::kv_cache_type() const {
    return ggml_type_name(model_->kv_type.load());  // "f32" or "f16"
}
void Generator::set_kv_cache_type(const std::string &type) {
    const auto &[automatic, f32, f16] = KV_CACHE_TYPES;
    if (type == automatic)
        model_->kv_type = ggml_is_quantized(model_->talker.layers.front().q->type) ? GGML_TYPE_F16
                                                                                   : GGML_TYPE_F32;
    else if (type == f32 || type == f16)
        model_->kv_type = type == f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
    else
        throw InputError("unknown K/V cache type '" + type + "' (auto|f32|f16)");
}
const std::string &Generator::talker_device() const { return model_->talker_at.device; }
const std::string &Generator::predictor_device() const { return model_->predictor_at.device; }
const std::shared_ptr<CoreShare> &Generator::core_share() const { return model_->core_share; }
bool Generator::damaged() const { return model_->weights.damaged(); }
int64_t Generator::text_tokens(const std::vector<int32_t> &input_ids) const {
    return prompt_text_tokens(model_->hp, input_ids);
}

std::unique_ptr<GenerationSession> Generator::start(const std::vector<int32_t> &input_ids,
                                                    const GenerationOptions &options) const {
    return start_probed(*this, input_ids, options, GenerationProbes{});
}

std::unique_ptr<GenerationSession> start_probed(const Generator &generator,
                                                const std::vector<int32_t> &input_ids,
                                                const GenerationOptions &options,
                                                const GenerationProbes &probes) {
    if (probes.trace) {
        const TalkerModel &m = *generator.model_;
        auto panels = [](const LmStack &stack) {
            int64_t n = 0;
            for (const ggml_tensor *t : stack_matrices(stack)) n += has_q8_panels(t);
            return n;
        };
        auto joined = [](const LmStack &stack) {
            int64_t n = 0;
            for (const LmLayer &L : stack.layers) n += (L.qkv != nullptr) + (L.gate_up != nullptr);
            return n;
        };
        probes.trace->talker_panels = panels(m.talker_at.stack);
        probes.trace->predictor_panels = panels(m.predictor_at.stack);
        probes.trace->talker_joined = joined(m.talker_at.stack);
        probes.trace->predictor_joined = joined(m.predictor_at.stack);
    }
    return std::unique_ptr<GenerationSession>(new GenerationSession(
        std::make_unique<GenerationSession::State>(*generator.model_, input_ids, options, probes)));
}

GenerationSession::GenerationSession(std::unique_ptr<State> state) : state_(std::move(state)) {}
GenerationSession::~GenerationSession() = default;
std::optional<Frame> GenerationSession::next() { return state_->next(); }
GenerationStats GenerationSession::stats() const {
    const State &s = *state_;
    const int64_t whole = s.frame_graph_computations;
    return {s.n_frames, s.talker_ms, s.predictor_ms, s.frame_graph_ms, s.graph_setup_ms,
            s.predictor->computations() + whole,
            s.talker->computations() + s.predictor->computations() + whole};
}

}  // namespace kazeia
