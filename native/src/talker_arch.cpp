#include "talker_arch.h"

namespace kazeia {

namespace {
using H = TalkerHParams;
using L = LmHParams;
using K = MetaKey<H>;

K u32(const std::string &key, const std::string &source, uint32_t H::*m) {
    return meta_u32<H>(key, source, field(m));
}
K f32(const std::string &key, const std::string &source, float H::*m) {
    return meta_f32<H>(key, source, field(m));
}
K u32_map(const std::string &key, const std::string &source, std::vector<std::string> H::*names,
          std::vector<uint32_t> H::*values) {
    K k{key, MetaType::STR_U32_MAP, source};
    k.names = field(names);
    k.u32_array = field(values);
    return k;
}
K str_map(const std::string &key, const std::string &source, std::vector<std::string> H::*names,
          std::vector<std::string> H::*values) {
    K k{key, MetaType::STR_STR_MAP, source};
    k.names = field(names);
    k.str_values = field(values);
    return k;
}

// The talker and the code predictor share every per-stack key; only the prefix differs.
void add_lm_keys(std::vector<K> &keys, const char *gguf_prefix, const char *config_prefix,
                 LmHParams H::*lm) {
    struct Field {
        const char *name, *config;
        uint32_t L::*u;
        float L::*f;
    };
    static const Field fields[] = {
        {"hidden_size", "hidden_size", &L::hidden_size, nullptr},
        {"intermediate_size", "intermediate_size", &L::intermediate_size, nullptr},
        {"num_layers", "num_hidden_layers", &L::num_layers, nullptr},
        {"num_heads", "num_attention_heads", &L::num_heads, nullptr},
        {"num_kv_heads", "num_key_value_heads", &L::num_kv_heads, nullptr},
        {"head_dim", "head_dim", &L::head_dim, nullptr},
        {"vocab_size", "vocab_size", &L::vocab_size, nullptr},
        {"rms_norm_eps", "rms_norm_eps", nullptr, &L::rms_norm_eps},
        {"rope_theta", "rope_theta", nullptr, &L::rope_theta},
    };
    for (const Field &f : fields) {
        const std::string key = std::string(gguf_prefix) + f.name;
        const std::string path = std::string(config_prefix) + f.config;
        keys.push_back(f.u ? meta_u32<H>(key, path, field(lm, f.u)) : meta_f32<H>(key, path, field(lm, f.f)));
    }
}
}  // namespace

const PartInfo &talker_part() {
    // The Base models' speaker encoder is a part of its own (speaker_encoder.gguf).
    static const PartInfo part{"talker", "talker.gguf", "kazeia-talker",
                               "kazeia.talker.format_version", 2, "", {"speaker_encoder."}};
    return part;
}

const std::vector<MetaKey<TalkerHParams>> &talker_meta_keys() {
    static const std::vector<K> keys = [] {
        std::vector<K> k;
        k.push_back(meta_str<H>("kazeia.talker.model_type", "config.json:tts_model_type",
                                field(&H::model_type)));
        k.push_back(meta_str<H>("kazeia.talker.model_size", "config.json:tts_model_size",
                                field(&H::model_size)));
        add_lm_keys(k, "kazeia.talker.", "config.json:talker_config.", &H::talker);
        add_lm_keys(k, "kazeia.predictor.", "config.json:talker_config.code_predictor_config.",
                    &H::predictor);
        const std::string tc = "config.json:talker_config.";
        const std::string g = "generation_config.json:";
        auto p = [](const std::string &prefix, const char *name) { return prefix + name; };
        k.push_back(u32("kazeia.talker.text_vocab_size", p(tc, "text_vocab_size"), &H::text_vocab_size));
        k.push_back(u32("kazeia.talker.text_hidden_size", p(tc, "text_hidden_size"), &H::text_hidden_size));
        k.push_back(u32("kazeia.talker.num_code_groups", p(tc, "num_code_groups"), &H::num_code_groups));
        k.push_back(u32("kazeia.ids.codec_pad", p(tc, "codec_pad_id"), &H::codec_pad_id));
        k.push_back(u32("kazeia.ids.codec_bos", p(tc, "codec_bos_id"), &H::codec_bos_id));
        k.push_back(u32("kazeia.ids.codec_eos", p(tc, "codec_eos_token_id"), &H::codec_eos_id));
        k.push_back(u32("kazeia.ids.codec_think", p(tc, "codec_think_id"), &H::codec_think_id));
        k.push_back(u32("kazeia.ids.codec_nothink", p(tc, "codec_nothink_id"), &H::codec_nothink_id));
        k.push_back(u32("kazeia.ids.codec_think_bos", p(tc, "codec_think_bos_id"), &H::codec_think_bos_id));
        k.push_back(u32("kazeia.ids.codec_think_eos", p(tc, "codec_think_eos_id"), &H::codec_think_eos_id));
        k.push_back(u32("kazeia.ids.tts_pad", "config.json:tts_pad_token_id", &H::tts_pad_id));
        k.push_back(u32("kazeia.ids.tts_bos", "config.json:tts_bos_token_id", &H::tts_bos_id));
        k.push_back(u32("kazeia.ids.tts_eos", "config.json:tts_eos_token_id", &H::tts_eos_id));
        k.push_back(u32("kazeia.ids.im_start", "config.json:im_start_token_id", &H::im_start_id));
        k.push_back(u32("kazeia.ids.im_end", "config.json:im_end_token_id", &H::im_end_id));
        k.push_back(u32("kazeia.ids.assistant", "config.json:assistant_token_id", &H::assistant_id));
        k.push_back(f32("kazeia.gen.temperature", p(g, "temperature"), &H::temperature));
        k.push_back(u32("kazeia.gen.top_k", p(g, "top_k"), &H::top_k));
        k.push_back(f32("kazeia.gen.top_p", p(g, "top_p"), &H::top_p));
        k.push_back(f32("kazeia.gen.repetition_penalty", p(g, "repetition_penalty"),
                        &H::repetition_penalty));
        k.push_back(f32("kazeia.gen.sub_temperature", p(g, "subtalker_temperature"),
                        &H::sub_temperature));
        k.push_back(u32("kazeia.gen.sub_top_k", p(g, "subtalker_top_k"), &H::sub_top_k));
        k.push_back(f32("kazeia.gen.sub_top_p", p(g, "subtalker_top_p"), &H::sub_top_p));
        k.push_back(u32("kazeia.gen.max_new_tokens", p(g, "max_new_tokens"), &H::max_new_tokens));
        k.push_back(u32_map("kazeia.speakers", p(tc, "spk_id"), &H::speaker_names, &H::speaker_ids));
        k.push_back(str_map("kazeia.speaker_dialects", p(tc, "spk_is_dialect"), &H::speaker_names,
                            &H::speaker_dialects));
        k.push_back(u32_map("kazeia.languages", p(tc, "codec_language_id"), &H::language_names,
                            &H::language_ids));
        return k;
    }();
    return keys;
}

namespace tlk_name {
std::string layer(const char *prefix, int il, const char *part) {
    return std::string(prefix) + ".blk." + std::to_string(il) + "." + part;
}
}  // namespace tlk_name

std::vector<TensorSpec> talker_tensor_specs(const TalkerHParams &hp) {
    std::vector<TensorSpec> t;
    // Norms and biases stay f32; matrices (torch Linear [out, in] is ggml [in, out]) and
    // embedding tables (read with get_rows) follow --type.
    auto add = [&](std::string name, std::vector<int64_t> ne, std::string source, Storage storage) {
        t.push_back(TensorSpec{std::move(name), std::move(ne), {std::move(source)}, Transform::COPY,
                               storage});
    };
    auto vec = [&](std::string name, std::vector<int64_t> ne, std::string source) {
        add(std::move(name), std::move(ne), std::move(source), Storage::F32);
    };
    auto linear = [&](const std::string &name, const std::string &source, int64_t in, int64_t out,
                      bool bias) {
        add(name + ".weight", {in, out}, source + ".weight", Storage::QUANTIZABLE);
        if (bias) vec(name + ".bias", {out}, source + ".bias");
    };
    auto stack = [&](const char *prefix, const std::string &source, const LmHParams &lm) {
        const int64_t d = lm.hidden_size, q = lm.num_heads * lm.head_dim,
                      kv = lm.num_kv_heads * lm.head_dim, ff = lm.intermediate_size;
        for (int il = 0; il < (int)lm.num_layers; ++il) {
            const std::string s = source + ".layers." + std::to_string(il) + ".";
            auto n = [&](const char *part) { return tlk_name::layer(prefix, il, part); };
            vec(n("attn_norm.weight"), {d}, s + "input_layernorm.weight");
            linear(n("attn_q"), s + "self_attn.q_proj", d, q, false);
            linear(n("attn_k"), s + "self_attn.k_proj", d, kv, false);
            linear(n("attn_v"), s + "self_attn.v_proj", d, kv, false);
            linear(n("attn_o"), s + "self_attn.o_proj", q, d, false);
            vec(n("attn_q_norm.weight"), {lm.head_dim}, s + "self_attn.q_norm.weight");
            vec(n("attn_k_norm.weight"), {lm.head_dim}, s + "self_attn.k_norm.weight");
            vec(n("ffn_norm.weight"), {d}, s + "post_attention_layernorm.weight");
            linear(n("ffn_gate"), s + "mlp.gate_proj", d, ff, false);
            linear(n("ffn_up"), s + "mlp.up_proj", d, ff, false);
            linear(n("ffn_down"), s + "mlp.down_proj", ff, d, false);
        }
    };
    const LmHParams &tk = hp.talker, &cp = hp.predictor;
    add(tlk_name::TOK_EMBD, {tk.hidden_size, tk.vocab_size}, "talker.model.codec_embedding.weight",
        Storage::QUANTIZABLE);
    add(tlk_name::TEXT_EMBD, {hp.text_hidden_size, hp.text_vocab_size},
        "talker.model.text_embedding.weight", Storage::QUANTIZABLE);
    linear(tlk_name::TEXT_FC1, "talker.text_projection.linear_fc1", hp.text_hidden_size,
           hp.text_hidden_size, true);
    linear(tlk_name::TEXT_FC2, "talker.text_projection.linear_fc2", hp.text_hidden_size,
           tk.hidden_size, true);
    stack("tlk", "talker.model", tk);
    vec(tlk_name::NORM, {tk.hidden_size}, "talker.model.norm.weight");
    add(tlk_name::HEAD, {tk.hidden_size, tk.vocab_size}, "talker.codec_head.weight",
        Storage::QUANTIZABLE);

    const std::string c = "talker.code_predictor.";
    if (hp.has_mtp_projection())
        linear(tlk_name::CP_PROJ, c + "small_to_mtp_projection", tk.hidden_size, cp.hidden_size,
               true);
    const int64_t groups = (int64_t)hp.num_code_groups - 1;
    std::vector<std::string> embds, heads;
    for (int g = 0; g < groups; ++g) {
        embds.push_back(c + "model.codec_embedding." + std::to_string(g) + ".weight");
        heads.push_back(c + "lm_head." + std::to_string(g) + ".weight");
    }
    t.push_back(TensorSpec{tlk_name::CP_EMBD, {tk.hidden_size, cp.vocab_size * groups}, embds,
                           Transform::CONCAT, Storage::QUANTIZABLE});
    stack("cp", c + "model", cp);
    vec(tlk_name::CP_NORM, {cp.hidden_size}, c + "model.norm.weight");
    t.push_back(TensorSpec{tlk_name::CP_HEADS, {cp.hidden_size, cp.vocab_size, groups}, heads,
                           Transform::STACK, Storage::QUANTIZABLE});
    return t;
}

}  // namespace kazeia
