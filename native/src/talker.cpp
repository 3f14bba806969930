// Talker: loading the talker GGUF, its text path, and one session's talker run (prefill with
// the per-voice K/V cache, steps, cache growth). The LM stack itself is lm_graph.cpp.
#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "devices_internal.h"
#include "env_switch.h"
#include "kazeia/error.h"
#include "ops.h"
#include "prompt.h"
#include "q8_gemm.h"
#include "talker.h"

namespace kazeia {

namespace {
void check(const GgufWeights &w, const TalkerHParams &hp) {
    auto fail = [&](const std::string &what) {
        throw ModelError(w.path() + ": invalid talker hyper-parameters: " + what);
    };
    for (const LmHParams *lm : {&hp.talker, &hp.predictor}) {
        if (!lm->num_heads || !lm->num_kv_heads || lm->num_heads % lm->num_kv_heads || !lm->head_dim)
            fail("attention heads");
        if (!lm->hidden_size || !lm->num_layers || !lm->vocab_size) fail("sizes");
    }
    if (hp.num_code_groups != 16) fail("num_code_groups must be 16");
    if (hp.model_type != "custom_voice" && !hp.is_base() && !hp.is_voice_design())
        fail("unknown model kind '" + hp.model_type + "'");
    if (hp.model_type == "custom_voice" && hp.speaker_names.empty())
        fail("a CustomVoice model without speakers");
    if (hp.speaker_ids.size() != hp.speaker_names.size() ||
        hp.speaker_dialects.size() != hp.speaker_names.size() ||
        hp.language_ids.size() != hp.language_names.size())
        fail("speaker or language tables");
    for (uint32_t id : hp.speaker_ids)
        if (id >= hp.talker.vocab_size) fail("speaker id outside the codec vocabulary");
    for (uint32_t id : hp.language_ids)
        if (id >= hp.talker.vocab_size) fail("language id outside the codec vocabulary");
    for (uint32_t id : {hp.codec_pad_id, hp.codec_bos_id, hp.codec_eos_id, hp.codec_think_id,
                        hp.codec_nothink_id, hp.codec_think_bos_id, hp.codec_think_eos_id})
        if (id >= hp.talker.vocab_size) fail("codec special id outside the vocabulary");
    for (uint32_t id : {hp.tts_pad_id, hp.tts_bos_id, hp.tts_eos_id, hp.im_start_id, hp.im_end_id,
                        hp.assistant_id})
        if (id >= hp.text_vocab_size) fail("text special id outside the text vocabulary");
}

// Whether a stack on the CPU joins its layers' products (DeviceCopies::joined);
// KAZEIA_JOINED=off keeps them apart, for benches and tests.
bool joins_products() { return !env_is("KAZEIA_JOINED", "off"); }

LmStack bind_stack(const GgufWeights &w, const char *prefix, const LmHParams &hp, const char *norm) {
    LmStack s;
    s.hp = hp;
    for (int il = 0; il < (int)hp.num_layers; ++il) {
        auto t = [&](const char *part) { return w.tensor(tlk_name::layer(prefix, il, part)); };
        s.layers.push_back(LmLayer{t("attn_norm.weight"), t("attn_q.weight"), t("attn_k.weight"),
                                   t("attn_v.weight"), t("attn_o.weight"), t("attn_q_norm.weight"),
                                   t("attn_k_norm.weight"), t("ffn_norm.weight"), t("ffn_gate.weight"),
                                   t("ffn_up.weight"), t("ffn_down.weight")});
    }
    s.norm = w.tensor(norm);
    return s;
}
}  // namespace

StackPlacement::StackPlacement(const std::string &device_id, const LmStack &host, ggml_tensor *in_w,
                               ggml_tensor *in_b, ggml_tensor *head_, ggml_tensor *heads_,
                               ggml_tensor *embd_, const char *what, GgufWeights &source,
                               bool panels)
    : device(device_id), embd(embd_) {
    std::vector<ggml_tensor *> tensors = stack_tensors(host);
    tensors.insert(tensors.end(), {in_w, in_b, head_, heads_});  // (DeviceCopies skips nulls)
    if (!on_cpu()) tensors.push_back(embd_);  // the CPU reads its few rows where they are
    const ggml_backend_buffer_type_t buft =
        on_cpu() ? ggml_backend_cpu_buffer_type() : ggml_backend_dev_buffer_type(gpu_device(device));
    std::vector<ggml_tensor *> as_panels;
    if (panels && on_cpu()) {
        const std::vector<ggml_tensor *> matrices = stack_matrices(host);
        int64_t bytes = 0;
        for (const ggml_tensor *t : matrices) bytes += (int64_t)ggml_nbytes(t);
        if (q8_keeps_panels(bytes)) as_panels = matrices;
    }
    copies = std::make_unique<DeviceCopies>(tensors, buft, what, &source, as_panels);
    stack = copies->stack(host);
    if (on_cpu() && joins_products())
        for (LmLayer &L : stack.layers) {
            L.qkv = copies->joined({L.q, L.k, L.v}, "attn_qkv");
            L.gate_up = copies->joined({L.gate, L.up}, "ffn_gate_up");
        }
    in_proj_w = (*copies)[in_w], in_proj_b = (*copies)[in_b], head = (*copies)[head_], heads = (*copies)[heads_];
    if (!on_cpu()) embd = (*copies)[embd_];
}

TalkerModel::TalkerModel(const std::string &path, int threads, const std::string &talker_device,
                         const std::string &predictor_device)
    : weights(path, talker_part(), GgufWeights::Mapped{}), n_threads(threads) {
    weights.read_meta(talker_meta_keys(), hp);
    check(weights, hp);
    weights.expect_tensors(talker_tensor_specs(hp));
    talker = bind_stack(weights, "tlk", hp.talker, tlk_name::NORM);
    predictor = bind_stack(weights, "cp", hp.predictor, tlk_name::CP_NORM);
    codec_embd = weights.tensor(tlk_name::TOK_EMBD);
    text_embd = weights.tensor(tlk_name::TEXT_EMBD);
    text_fc1_w = weights.tensor(std::string(tlk_name::TEXT_FC1) + ".weight");
    text_fc1_b = weights.tensor(std::string(tlk_name::TEXT_FC1) + ".bias");
    text_fc2_w = weights.tensor(std::string(tlk_name::TEXT_FC2) + ".weight");
    text_fc2_b = weights.tensor(std::string(tlk_name::TEXT_FC2) + ".bias");
    head = weights.tensor(tlk_name::HEAD);
    if (hp.has_mtp_projection()) {
        cp_proj_w = weights.tensor(std::string(tlk_name::CP_PROJ) + ".weight");
        cp_proj_b = weights.tensor(std::string(tlk_name::CP_PROJ) + ".bias");
    }
    cp_embd = weights.tensor(tlk_name::CP_EMBD);
    cp_heads = weights.tensor(tlk_name::CP_HEADS);
    talker_at = StackPlacement(talker_device, talker, nullptr, nullptr, head, nullptr, codec_embd,
                               "talker", weights, /*panels=*/false);
    predictor_at = StackPlacement(predictor_device, predictor, cp_proj_w, cp_proj_b, nullptr, cp_heads,
                                  cp_embd, "code predictor", weights, /*panels=*/true);
}

bool TalkerModel::find_prefix(const std::vector<int32_t> &key, ggml_type type, PrefixKv &out) const {
    std::lock_guard<std::mutex> lock(prefix_mutex);
    for (auto it = prefix_cache.begin(); it != prefix_cache.end(); ++it) {
        if (it->key != key || it->type != type) continue;
        prefix_cache.splice(prefix_cache.begin(), prefix_cache, it);
        out = prefix_cache.front();
        return true;
    }
    return false;
}

void TalkerModel::store_prefix(PrefixKv entry) const {
    std::lock_guard<std::mutex> lock(prefix_mutex);
    for (const PrefixKv &e : prefix_cache)
        if (e.key == entry.key && e.type == entry.type) return;
    prefix_cache.push_front(std::move(entry));
    if (prefix_cache.size() > PREFIX_CACHE_SIZE) prefix_cache.pop_back();
}

void TalkerModel::add_frame_embedding(const Frame &frame, float *out) const {
    add_embedding_row(codec_embd, frame[0], out);
    for (int g = 1; g < (int)hp.num_code_groups; ++g)
        add_embedding_row(cp_embd, (int64_t)(g - 1) * hp.predictor.vocab_size + frame[g], out);
}

std::vector<float> TalkerModel::text_projection(const std::vector<int32_t> &ids,
                                                     ggml_backend_t backend,
                                                     WorkerPool *pool) const {
    const int64_t n = (int64_t)ids.size();
    std::vector<uint8_t> mem(ggml_tensor_overhead() * 32 + ggml_graph_overhead());
    ggml_init_params params = {mem.size(), mem.data(), true};
    GgmlContextPtr ctx(ggml_init(params));
    ggml_cgraph *gf = ggml_new_graph(ctx.get());
    ggml_tensor *in = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I32, n);
    ggml_set_input(in);
    ggml_tensor *x = ggml_get_rows(ctx.get(), text_embd, in);
    x = ggml_silu(ctx.get(), ggml_add(ctx.get(), pool_mul_mat(ctx.get(), text_fc1_w, x, pool), text_fc1_b));
    x = ggml_add(ctx.get(), pool_mul_mat(ctx.get(), text_fc2_w, x, pool), text_fc2_b);
    ggml_set_output(x);
    ggml_build_forward_expand(gf, x);
    GallocrPtr allocr = allocate_graph(backend, gf, "out of memory in the text projection");
    ggml_backend_tensor_set(in, ids.data(), 0, n * sizeof(int32_t));
    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS)
        throw std::runtime_error("text projection failed");
    std::vector<float> out(ggml_nelements(x));
    ggml_backend_tensor_get(x, out.data(), 0, out.size() * sizeof(float));
    return out;
}

TalkerRun::TalkerRun(const TalkerModel &m, const Prompt &prompt, int64_t steps, int64_t kv_block,
                     ggml_backend_t backend, WorkerPool *pool)
    : m_(m), backend_(backend), pool_(m.talker_at.graph_pool(pool)), kv_block_(kv_block) {
    const LmHParams &tk = m.hp.talker;
    // One slot per prompt row and per step, allocated in growing blocks: a large step budget
    // costs nothing until it is used, and attention never runs over more empty slots than one
    // block.
    cache_ = std::make_unique<KvCache>(tk, prompt.rows() + std::min(steps, kv_block) + 1, backend,
                                       prompt.rows() + steps + 1, m.kv_type.load());
    prefill_graph_ = graph(prompt.rows() - prompt.voice_rows);
}

std::unique_ptr<LmGraph> TalkerRun::graph(int64_t rows) const {
    return std::make_unique<LmGraph>(m_.talker_at.stack, *cache_, rows, m_.hp.talker.hidden_size,
                                     nullptr, nullptr, m_.talker_at.head, nullptr, backend_, pool_);
}

void TalkerRun::prefill(const Prompt &prompt) {
    load_or_compute_voice(prompt);
    prefill_graph_->eval(prompt.prefill.data() + prompt.voice_rows * prompt.width, prompt.voice_rows);
    ++computations_;
    last_ = prefill_graph_.get();
    pos_ = prompt.rows();
}

int64_t TalkerRun::take_step() {
    if (pos_ >= cache_->n_ctx) grow(pos_ + 1 + kv_block_);
    return pos_++;
}

void TalkerRun::step(const float *embed) {
    const int64_t pos = take_step();
    if (!step_graph_) step_graph_ = graph(1);
    step_graph_->eval(embed, pos);
    ++computations_;
    last_ = step_graph_.get();
}

// K/V of the voice rows: from the model's cache, or computed now and stored there.
void TalkerRun::load_or_compute_voice(const Prompt &prompt) {
    const int64_t rows = prompt.voice_rows;
    TalkerModel::PrefixKv entry;
    if (m_.find_prefix(prompt.voice_key, cache_->type(), entry) && entry.rows == rows) {
        for (size_t il = 0; il < cache_->k.size(); ++il)
            cache_->write_rows(il, rows, entry.k[il], entry.v[il]);
        return;
    }
    std::unique_ptr<LmGraph> voice = graph(rows);
    voice->eval(prompt.prefill.data(), 0);
    ++computations_;
    spent_.push_back(std::move(voice));
    entry.key = prompt.voice_key;
    entry.type = cache_->type();
    entry.rows = rows;
    entry.k.resize(cache_->k.size());
    entry.v.resize(cache_->v.size());
    for (size_t il = 0; il < cache_->k.size(); ++il) cache_->read_rows(il, rows, entry.k[il], entry.v[il]);
    m_.store_prefix(std::move(entry));
}

void TalkerRun::grow(int64_t slots) {
    if (pos_ >= cache_->capacity)
        throw std::runtime_error("talker KV cache capacity exceeded");  // steps bound the run
    cache_->extend(slots);  // (at most its capacity)
    for (std::unique_ptr<LmGraph> *graph : {&step_graph_, &prefill_graph_})
        if (*graph) spent_.push_back(std::move(*graph));
}

}  // namespace kazeia
