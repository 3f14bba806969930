// Pipeline: prompt assembly, the frame loop (talker step -> code predictor), sampling.
#include "kazeia/generator.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <random>

#include "code_predictor.h"
#include "kazeia/error.h"
#include "sampler.h"
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

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The codec tokens of the prompt (before the text): think/nothink, think_bos, [language],
// think_eos, speaker.
std::vector<int32_t> codec_prefix(const TalkerHParams &hp, const GenerationOptions &o) {
    const std::string language = lower(o.language), speaker = lower(o.speaker);
    const int64_t si = index_of(hp.speaker_names, speaker);
    if (si < 0)
        throw InputError("unknown speaker '" + o.speaker + "'; valid speakers: " + join(hp.speaker_names));
    int64_t language_id = -1;
    if (language != "auto") {
        const int64_t li = index_of(hp.language_names, language);
        if (li < 0)
            throw InputError("unknown language '" + o.language + "'; valid languages: auto, " +
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

void check_ids(const TalkerHParams &hp, const std::vector<int32_t> &ids) {
    const size_t n = ids.size();
    if (n < 9)
        throw InputError("input_ids must be the assistant prompt '<|im_start|>assistant\\n{text}"
                         "<|im_end|>\\n<|im_start|>assistant\\n' with at least one text token (got " +
                         std::to_string(n) + " ids)");
    for (size_t i = 0; i < n; ++i)
        if (ids[i] < 0 || (uint32_t)ids[i] >= hp.text_vocab_size)
            throw InputError("input id " + std::to_string(ids[i]) + " at " + std::to_string(i) +
                             " is outside 0.." + std::to_string(hp.text_vocab_size - 1));
    if ((uint32_t)ids[0] != hp.im_start_id || (uint32_t)ids[1] != hp.assistant_id ||
        (uint32_t)ids[n - 5] != hp.im_end_id || (uint32_t)ids[n - 3] != hp.im_start_id ||
        (uint32_t)ids[n - 2] != hp.assistant_id)
        throw InputError("input_ids must be the assistant prompt '<|im_start|>assistant\\n{text}"
                         "<|im_end|>\\n<|im_start|>assistant\\n' (role tokens not found)");
}

}  // namespace

struct GenerationSession::State {
    const Generator::Model &m;
    GenerationOptions opt;
    GenerationTrace *trace;
    WorkerPool pool;  // the weight matmuls; the graphs themselves run on this thread
    BackendPtr backend;
    std::vector<int32_t> ids;
    Rng rng;
    SamplingParams talker_params, cp_params;
    float repetition_penalty = 1.0f;
    std::vector<float> prefill;   // [L, d]
    std::vector<float> trailing;  // streaming text rows fed one per step: [n, d]
    std::vector<float> pad_row;   // P(tts_pad)
    std::unique_ptr<KvCache> cache;
    std::unique_ptr<LmGraph> prefill_graph, step_graph;
    std::vector<int32_t> prefix_key;  // role ids + codec prefix: what the voice rows depend on
    int64_t prefix_rows = 0;          // prompt rows that depend only on the voice
    std::unique_ptr<CodePredictor> predictor;
    const std::vector<float> *logits = nullptr, *hidden = nullptr;
    std::vector<int32_t> history;  // sampled codes 0
    std::optional<Frame> pending_step;  // a frame whose talker step has not run yet
    std::vector<float> scratch, step_embed;
    int64_t n_frames = 0, n_ctx = 0, prompt_len = 0;
    bool started = false, done = false;
    double talker_ms = 0.0, predictor_ms = 0.0, graph_setup_ms = 0.0;

    State(const Generator::Model &model, const std::vector<int32_t> &input_ids,
          const GenerationOptions &o, GenerationTrace *t)
        : m(model), opt(o), trace(t), pool(model.n_threads, model.polite), ids(input_ids),
          rng(o.seed ? *o.seed : ((uint64_t)std::random_device{}() << 32 | std::random_device{}())) {
        const TalkerHParams &hp = m.hp;
        check_ids(hp, ids);
        if (o.max_frames < 1) throw InputError("max_frames must be >= 1");
        if (o.kv_block < 1) throw InputError("kv_block must be >= 1");
        const std::vector<int32_t> codec = codec_prefix(hp, o);
        talker_params = SamplingParams{o.greedy, o.temperature.value_or(hp.temperature),
                                       o.top_k.value_or((int)hp.top_k), o.top_p.value_or(hp.top_p)};
        cp_params = SamplingParams{o.greedy, o.temperature.value_or(hp.sub_temperature),
                                   o.top_k.value_or((int)hp.sub_top_k), o.top_p.value_or(hp.sub_top_p)};
        repetition_penalty = o.repetition_penalty.value_or(hp.repetition_penalty);
        for (const SamplingParams *p : {&talker_params, &cp_params}) {
            if (!(p->temperature > 0.0f)) throw InputError("temperature must be > 0");
            if (p->top_k < 0) throw InputError("top_k must be >= 0");
            if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) throw InputError("top_p must be in (0, 1]");
        }
        if (!(repetition_penalty > 0.0f)) throw InputError("repetition_penalty must be > 0");

        backend.reset(ggml_backend_cpu_init());
        if (!backend) throw std::runtime_error("cannot initialize the ggml CPU backend");
        ggml_backend_cpu_set_n_threads(backend.get(), 1);

        assemble_prompt(codec);
        const auto t0 = std::chrono::steady_clock::now();
        prompt_len = (int64_t)(prefill.size() / hp.talker.hidden_size);
        prefix_rows = 3 + (int64_t)codec.size() + 1;  // role, codec prefix, P(bos) + C(pad)
        prefix_key.assign(ids.begin(), ids.begin() + 3);
        prefix_key.insert(prefix_key.end(), codec.begin(), codec.end());
        // One slot per prompt row and per step (the traced run also steps after the last frame),
        // allocated in growing blocks: a large max_frames costs nothing until it is used, and
        // attention never runs over more empty slots than one block.
        n_ctx = prompt_len + std::min<int64_t>(o.max_frames, o.kv_block) + 1;
        cache = std::make_unique<KvCache>(hp.talker, n_ctx, backend.get());
        prefill_graph = std::make_unique<LmGraph>(m.talker, *cache, prompt_len - prefix_rows,
                                                  hp.talker.hidden_size,
                                                  nullptr, nullptr, m.head, nullptr, backend.get(), &pool);
        step_graph = std::make_unique<LmGraph>(m.talker, *cache, 1, hp.talker.hidden_size, nullptr,
                                               nullptr, m.head, nullptr, backend.get(), &pool);
        predictor = std::make_unique<CodePredictor>(m, backend.get(), &pool);
        graph_setup_ms = ms_since(t0);
        if (trace) {
            trace->hidden = hp.talker.hidden_size;
            trace->prefill_embeds = prefill;
        }
    }

    // Prompt rows (DESIGN.md section 2): P(role), P(pad) + C(codec prefix), P(bos) + C(pad), then
    // the text: its first token with C(bos) (streaming) or all of it (non-streaming).
    void assemble_prompt(const std::vector<int32_t> &codec) {
        const TalkerHParams &hp = m.hp;
        const int64_t d = hp.talker.hidden_size;
        const int32_t pad = (int32_t)hp.tts_pad_id, bos = (int32_t)hp.tts_bos_id,
                      eos = (int32_t)hp.tts_eos_id;
        // One text-projection pass over every text row the generation will use.
        std::vector<int32_t> text(ids.begin(), ids.begin() + 3);   // role
        std::vector<int32_t> body(ids.begin() + 3, ids.end() - 5); // the text itself
        text.insert(text.end(), body.begin(), body.end());
        text.insert(text.end(), {pad, bos, eos});
        const std::vector<float> proj = m.text_projection(text, backend.get(), &pool);
        auto row = [&](size_t i) { return proj.data() + i * d; };
        const size_t i_body = 3, i_pad = 3 + body.size(), i_bos = i_pad + 1, i_eos = i_pad + 2;
        pad_row.assign(row(i_pad), row(i_pad) + d);

        auto push = [&](const float *text_row, int64_t codec_id) {
            const size_t at = prefill.size();
            prefill.insert(prefill.end(), text_row, text_row + d);
            if (codec_id >= 0) add_embedding_row(m.codec_embd, codec_id, prefill.data() + at);
        };
        for (size_t i = 0; i < 3; ++i) push(row(i), -1);
        for (int32_t c : codec) push(row(i_pad), c);
        push(row(i_bos), hp.codec_pad_id);
        if (opt.non_streaming) {
            for (size_t i = 0; i < body.size(); ++i) push(row(i_body + i), hp.codec_pad_id);
            push(row(i_eos), hp.codec_pad_id);
            push(row(i_pad), hp.codec_bos_id);
        } else {
            push(row(i_body), hp.codec_bos_id);
            for (size_t i = 1; i < body.size(); ++i)
                trailing.insert(trailing.end(), row(i_body + i), row(i_body + i) + d);
            trailing.insert(trailing.end(), row(i_eos), row(i_eos) + d);
        }
    }

    // K/V of the voice rows: from the generator's cache, or computed now and stored there.
    void load_or_compute_prefix() {
        const LmHParams &tk = m.hp.talker;
        const size_t kv = (size_t)tk.num_kv_heads * tk.head_dim, bytes = kv * prefix_rows * sizeof(float);
        Generator::Model::PrefixKv entry;
        if (m.find_prefix(prefix_key, entry) && entry.rows == prefix_rows) {
            for (size_t il = 0; il < cache->k.size(); ++il) {
                ggml_backend_tensor_set(cache->k[il], entry.k[il].data(), 0, bytes);
                ggml_backend_tensor_set(cache->v[il], entry.v[il].data(), 0, bytes);
            }
            return;
        }
        LmGraph prefix(m.talker, *cache, prefix_rows, tk.hidden_size, nullptr, nullptr, m.head,
                       nullptr, backend.get(), &pool);
        prefix.eval(prefill.data(), 0);
        entry.key = prefix_key;
        entry.rows = prefix_rows;
        entry.k.resize(cache->k.size());
        entry.v.resize(cache->v.size());
        for (size_t il = 0; il < cache->k.size(); ++il) {
            entry.k[il].resize(kv * prefix_rows);
            entry.v[il].resize(kv * prefix_rows);
            ggml_backend_tensor_get(cache->k[il], entry.k[il].data(), 0, bytes);
            ggml_backend_tensor_get(cache->v[il], entry.v[il].data(), 0, bytes);
        }
        m.store_prefix(std::move(entry));
    }

    // Feeds the last frame back: C(c0) + sum of the predictor's embeddings of c1..c15 + text.
    void talker_step() {
        const TalkerHParams &hp = m.hp;
        const int64_t d = hp.talker.hidden_size;
        const Frame frame = *pending_step;
        pending_step.reset();
        {
            const auto t0 = std::chrono::steady_clock::now();
            step_embed.assign(d, 0.0f);
            add_embedding_row(m.codec_embd, frame[0], step_embed.data());
            for (int g = 1; g < (int)hp.num_code_groups; ++g)
                add_embedding_row(m.cp_embd, (int64_t)(g - 1) * hp.predictor.vocab_size + frame[g],
                                  step_embed.data());
            const int64_t t = n_frames - 1;  // text row of this step
            const float *text = (t + 1) * d <= (int64_t)trailing.size() ? trailing.data() + t * d
                                                                         : pad_row.data();
            for (int64_t i = 0; i < d; ++i) step_embed[i] += text[i];
            if (trace) trace->step_embeds.insert(trace->step_embeds.end(), step_embed.begin(), step_embed.end());
            const int64_t pos = prompt_len + n_frames - 1;
            if (pos >= cache->n_ctx) grow_cache(pos + 1 + opt.kv_block);
            step_graph->eval(step_embed.data(), pos);
            logits = &step_graph->logits();
            hidden = &step_graph->hidden();
            talker_ms += ms_since(t0);
            record_talker_call();
        }
    }

    // A larger talker cache with the old slots copied, and the step graph rebuilt over it.
    void grow_cache(int64_t slots) {
        const LmHParams &tk = m.hp.talker;
        auto bigger = std::make_unique<KvCache>(tk, slots, backend.get());
        const size_t bytes = (size_t)tk.num_kv_heads * tk.head_dim * cache->n_ctx * sizeof(float);
        std::vector<uint8_t> tmp(bytes);
        for (size_t il = 0; il < cache->k.size(); ++il) {
            ggml_backend_tensor_get(cache->k[il], tmp.data(), 0, bytes);
            ggml_backend_tensor_set(bigger->k[il], tmp.data(), 0, bytes);
            ggml_backend_tensor_get(cache->v[il], tmp.data(), 0, bytes);
            ggml_backend_tensor_set(bigger->v[il], tmp.data(), 0, bytes);
        }
        step_graph.reset();
        prefill_graph.reset();  // done with; it points at the old cache
        cache = std::move(bigger);
        step_graph = std::make_unique<LmGraph>(m.talker, *cache, 1, tk.hidden_size, nullptr, nullptr,
                                               m.head, nullptr, backend.get(), &pool);
    }

    void record_talker_call() {
        if (!trace) return;
        trace->talker_logits.insert(trace->talker_logits.end(), logits->begin(), logits->end());
        trace->talker_hidden.insert(trace->talker_hidden.end(), hidden->begin(), hidden->end());
    }

    std::optional<Frame> next() {
        if (done) return std::nullopt;
        const TalkerHParams &hp = m.hp;
        const int64_t d = hp.talker.hidden_size, vocab = hp.talker.vocab_size;
        if (!started) {
            const auto t0 = std::chrono::steady_clock::now();
            load_or_compute_prefix();
            prefill_graph->eval(prefill.data() + prefix_rows * d, prefix_rows);
            logits = &prefill_graph->logits();
            hidden = &prefill_graph->hidden();
            talker_ms += ms_since(t0);
            record_talker_call();
            started = true;
        }
        if (n_frames >= opt.max_frames) {
            done = true;
            return std::nullopt;
        }
        if (pending_step) talker_step();
        // Code 0: repetition penalty over earlier codes 0 -> suppress the control tokens (the
        // top 1024 ids) except eos -> no eos before 2 frames -> temperature/top-k/top-p.
        scratch.assign(logits->begin(), logits->end());
        apply_repetition_penalty(scratch.data(), vocab, history, repetition_penalty);
        suppress_range(scratch.data(), vocab, vocab - 1024, vocab, hp.codec_eos_id);
        if (n_frames < 2) scratch[hp.codec_eos_id] = -INFINITY;
        std::vector<float> tmp;
        Frame frame{};
        frame[0] = select_token(scratch.data(), vocab, talker_params, rng, tmp);
        history.push_back(frame[0]);
        if ((uint32_t)frame[0] == hp.codec_eos_id) {
            done = true;
            return std::nullopt;
        }
        auto t0 = std::chrono::steady_clock::now();
        predictor->predict(hidden->data(), frame, cp_params, rng, trace ? &trace->cp_logits : nullptr);
        predictor_ms += ms_since(t0);
        ++n_frames;

        // The talker step that feeds this frame back runs at the next call, so the frame
        // reaches its consumer (the decoder) one talker step sooner. The last allowed frame
        // needs no step, except when tracing every talker call.
        pending_step = frame;
        if (trace && n_frames == opt.max_frames) talker_step();
        return frame;
    }
};

Generator::Generator(const std::string &talker_gguf, int n_threads, bool polite) {
    if (n_threads < 1 || n_threads > 512) throw InputError("threads must be in 1..512");
    model_ = std::make_unique<Model>(talker_gguf, n_threads);
    model_->polite = polite;
}

Generator::~Generator() = default;

const TalkerHParams &Generator::hparams() const { return model_->hp; }
int Generator::n_threads() const { return model_->n_threads; }

std::unique_ptr<GenerationSession> Generator::start(const std::vector<int32_t> &input_ids,
                                                    const GenerationOptions &options,
                                                    GenerationTrace *trace) const {
    return std::unique_ptr<GenerationSession>(new GenerationSession(
        std::make_unique<GenerationSession::State>(*model_, input_ids, options, trace)));
}

GenerationSession::GenerationSession(std::unique_ptr<State> state) : state_(std::move(state)) {}
GenerationSession::~GenerationSession() = default;
std::optional<Frame> GenerationSession::next() { return state_->next(); }
int64_t GenerationSession::frames() const { return state_->n_frames; }
double GenerationSession::talker_ms() const { return state_->talker_ms; }
double GenerationSession::predictor_ms() const { return state_->predictor_ms; }
double GenerationSession::graph_setup_ms() const { return state_->graph_setup_ms; }

}  // namespace kazeia
