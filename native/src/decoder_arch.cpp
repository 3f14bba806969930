#include "decoder_arch.h"

namespace kazeia {

namespace {
using H = DecoderHParams;
using K = MetaKey<H>;
const std::string CONFIG = "speech_tokenizer/config.json:";
const std::string DEC = CONFIG + "decoder_config.";

K u32(const char *key, const std::string &source, uint32_t H::*m) { return meta_u32<H>(key, source, field(m)); }
K f32(const char *key, const std::string &source, float H::*m) { return meta_f32<H>(key, source, field(m)); }
K u32_array(const char *key, const std::string &source, std::vector<uint32_t> H::*m) {
    K k{key, MetaType::U32_ARRAY, source};
    k.u32_array = field(m);
    return k;
}
K constant(K k, double value) {
    k.constant = value;
    return k;
}
}  // namespace

const PartInfo &decoder_part() {
    static const PartInfo part{
        "decoder", "decoder.gguf", "kazeia-decoder", "kazeia.decoder.format_version", 1,
        "speech_tokenizer",
        // Encoding (audio -> codes) only: text-to-speech never runs these.
        {"encoder.", "decoder.quantizer.rvq_first.input_proj.weight",
         "decoder.quantizer.rvq_rest.input_proj.weight"}};
    return part;
}

const std::vector<MetaKey<DecoderHParams>> &decoder_meta_keys() {
    static const std::vector<K> keys = {
        u32("kazeia.decoder.codebook_size", DEC + "codebook_size", &H::codebook_size),
        u32("kazeia.decoder.codebook_dim", DEC + "codebook_dim", &H::codebook_dim),
        u32("kazeia.decoder.num_quantizers", DEC + "num_quantizers", &H::num_quantizers),
        // The official decoder builds its split RVQ with n_q_semantic=1 whatever the config says.
        constant(u32("kazeia.decoder.num_semantic_quantizers", "", &H::num_semantic_quantizers), 1),
        u32("kazeia.decoder.latent_dim", DEC + "latent_dim", &H::latent_dim),
        u32("kazeia.decoder.hidden_size", DEC + "hidden_size", &H::hidden_size),
        u32("kazeia.decoder.num_layers", DEC + "num_hidden_layers", &H::num_layers),
        u32("kazeia.decoder.num_heads", DEC + "num_attention_heads", &H::num_heads),
        u32("kazeia.decoder.num_kv_heads", DEC + "num_key_value_heads", &H::num_kv_heads),
        u32("kazeia.decoder.head_dim", DEC + "head_dim", &H::head_dim),
        u32("kazeia.decoder.intermediate_size", DEC + "intermediate_size", &H::intermediate_size),
        u32("kazeia.decoder.sliding_window", DEC + "sliding_window", &H::sliding_window),
        u32("kazeia.decoder.decoder_dim", DEC + "decoder_dim", &H::decoder_dim),
        u32("kazeia.decoder.sample_rate", CONFIG + "output_sample_rate", &H::sample_rate),
        u32("kazeia.decoder.hop_length", CONFIG + "decode_upsample_rate", &H::hop_length),
        f32("kazeia.decoder.rope_theta", DEC + "rope_theta", &H::rope_theta),
        f32("kazeia.decoder.rms_norm_eps", DEC + "rms_norm_eps", &H::rms_norm_eps),
        // nn.LayerNorm(dim, eps=1e-6) in the official ConvNeXt block: not in the config.
        constant(f32("kazeia.decoder.layer_norm_eps", "", &H::layer_norm_eps), 1e-6),
        u32_array("kazeia.decoder.upsample_rates", DEC + "upsample_rates", &H::upsample_rates),
        u32_array("kazeia.decoder.upsampling_ratios", DEC + "upsampling_ratios", &H::upsampling_ratios),
    };
    return keys;
}

namespace dec_name {
std::string codebook(int q) { return "dec.rvq.codebook." + std::to_string(q); }
std::string layer(int il, const char *part) {
    return "dec.tfm.blk." + std::to_string(il) + "." + part;
}
std::string upsample(int i, const char *part) {
    return "dec.up." + std::to_string(i) + "." + part;
}
std::string vocoder(const std::string &part) { return "dec.voc." + part; }
}  // namespace dec_name

std::vector<TensorSpec> decoder_tensor_specs(const DecoderHParams &hp) {
    std::vector<TensorSpec> t;
    const std::string src = "decoder.";
    auto add = [&](std::string name, std::vector<int64_t> ne, std::vector<std::string> sources,
                   Transform tr, int stride = 0) {
        for (auto &s : sources) s = src + s;
        // Matrices that run in the decoder's own GEMM (whole panels of output rows) are f16
        // when the model is quantized; everything else stays f32.
        const bool gemm = (tr == Transform::COPY || tr == Transform::CONV ||
                           tr == Transform::TRANS_CONV) &&
                          ne.size() == 2 && ne[1] % DECODER_CONV_PANEL == 0;
        t.push_back(TensorSpec{std::move(name), std::move(ne), std::move(sources), tr,
                               gemm ? Storage::F16_WHEN_QUANTIZED : Storage::F32, stride});
    };
    // A conv (or linear) with its bias: weight [k*in, out], bias [out].
    auto conv = [&](const std::string &name, const std::string &source, int64_t k, int64_t in,
                    int64_t out) {
        add(name + ".weight", {k * in, out}, {source + ".weight"}, Transform::CONV);
        add(name + ".bias", {out}, {source + ".bias"}, Transform::COPY);
    };
    auto linear = [&](const std::string &name, const std::string &source, int64_t in, int64_t out,
                      bool bias) {
        add(name + ".weight", {in, out}, {source + ".weight"}, Transform::COPY);  // torch Linear
        if (bias) add(name + ".bias", {out}, {source + ".bias"}, Transform::COPY);
    };
    auto vec = [&](const std::string &name, const std::string &source, int64_t n) {
        add(name, {n}, {source}, Transform::COPY);
    };
    auto snake = [&](const std::string &name, const std::string &source, int64_t c) {
        add(name + ".alpha", {c}, {source + ".alpha"}, Transform::EXP);
        add(name + ".inv_beta", {c}, {source + ".beta"}, Transform::INV_EXP);
    };

    const int64_t vdim = hp.codebook_vec_dim();
    const int64_t n_sem = hp.num_semantic_quantizers;
    for (int64_t q = 0; q < (int64_t)hp.num_quantizers; ++q) {
        const std::string group = q < n_sem ? "quantizer.rvq_first" : "quantizer.rvq_rest";
        const std::string cb =
            group + ".vq.layers." + std::to_string(q < n_sem ? q : q - n_sem) + "._codebook.";
        add(dec_name::codebook((int)q), {vdim, hp.codebook_size},
            {cb + "embedding_sum", cb + "cluster_usage"}, Transform::CODEBOOK);
    }
    add(dec_name::RVQ_FIRST_OUT, {vdim, hp.codebook_dim}, {"quantizer.rvq_first.output_proj.weight"},
        Transform::CONV);
    add(dec_name::RVQ_REST_OUT, {vdim, hp.codebook_dim}, {"quantizer.rvq_rest.output_proj.weight"},
        Transform::CONV);
    conv(dec_name::PRE_CONV, "pre_conv.conv", 3, hp.codebook_dim, hp.latent_dim);

    const int64_t d = hp.hidden_size, q_dim = hp.num_heads * hp.head_dim,
                  kv_dim = hp.num_kv_heads * hp.head_dim, ff = hp.intermediate_size;
    linear(dec_name::IN_PROJ, "pre_transformer.input_proj", hp.latent_dim, d, true);
    for (int il = 0; il < (int)hp.num_layers; ++il) {
        const std::string l = "pre_transformer.layers." + std::to_string(il) + ".";
        vec(dec_name::layer(il, "attn_norm.weight"), l + "input_layernorm.weight", d);
        linear(dec_name::layer(il, "attn_q"), l + "self_attn.q_proj", d, q_dim, false);
        linear(dec_name::layer(il, "attn_k"), l + "self_attn.k_proj", d, kv_dim, false);
        linear(dec_name::layer(il, "attn_v"), l + "self_attn.v_proj", d, kv_dim, false);
        linear(dec_name::layer(il, "attn_o"), l + "self_attn.o_proj", q_dim, d, false);
        vec(dec_name::layer(il, "attn_scale"), l + "self_attn_layer_scale.scale", d);
        vec(dec_name::layer(il, "ffn_norm.weight"), l + "post_attention_layernorm.weight", d);
        linear(dec_name::layer(il, "ffn_gate"), l + "mlp.gate_proj", d, ff, false);
        linear(dec_name::layer(il, "ffn_up"), l + "mlp.up_proj", d, ff, false);
        linear(dec_name::layer(il, "ffn_down"), l + "mlp.down_proj", ff, d, false);
        vec(dec_name::layer(il, "ffn_scale"), l + "mlp_layer_scale.scale", d);
    }
    vec(dec_name::TFM_NORM, "pre_transformer.norm.weight", d);
    linear(dec_name::OUT_PROJ, "pre_transformer.output_proj", d, hp.latent_dim, true);

    const int64_t lat = hp.latent_dim;
    for (int i = 0; i < (int)hp.upsampling_ratios.size(); ++i) {
        const int64_t r = hp.upsampling_ratios[i];
        const std::string u = "upsample." + std::to_string(i) + ".";
        // ConvTranspose1d(k=r, s=r): one tap, r output columns per input column.
        add(dec_name::upsample(i, "trans.weight"), {lat, r * lat}, {u + "0.conv.weight"},
            Transform::TRANS_CONV, (int)r);
        vec(dec_name::upsample(i, "trans.bias"), u + "0.conv.bias", lat);
        add(dec_name::upsample(i, "dwconv.weight"), {lat, 7}, {u + "1.dwconv.conv.weight"},
            Transform::DEPTHWISE);
        vec(dec_name::upsample(i, "dwconv.bias"), u + "1.dwconv.conv.bias", lat);
        vec(dec_name::upsample(i, "norm.weight"), u + "1.norm.weight", lat);
        vec(dec_name::upsample(i, "norm.bias"), u + "1.norm.bias", lat);
        linear(dec_name::upsample(i, "pwconv1"), u + "1.pwconv1", lat, 4 * lat, true);
        linear(dec_name::upsample(i, "pwconv2"), u + "1.pwconv2", 4 * lat, lat, true);
        vec(dec_name::upsample(i, "gamma"), u + "1.gamma", lat);
    }

    conv(dec_name::vocoder("conv_in"), "decoder.0.conv", 7, lat, hp.decoder_dim);
    int64_t ch = hp.decoder_dim;
    for (int b = 0; b < (int)hp.upsample_rates.size(); ++b) {
        const int64_t r = hp.upsample_rates[b], out = ch / 2;
        const std::string s = "decoder." + std::to_string(b + 1) + ".block.";
        const std::string n = "blk." + std::to_string(b) + ".";
        snake(dec_name::vocoder(n + "snake"), s + "0", ch);
        // ConvTranspose1d(k=2r, s=r), right-trimmed: two taps (previous and current column).
        add(dec_name::vocoder(n + "up.weight"), {2 * ch, r * out}, {s + "1.conv.weight"},
            Transform::TRANS_CONV, (int)r);
        vec(dec_name::vocoder(n + "up.bias"), s + "1.conv.bias", out);
        for (int u = 0; u < 3; ++u) {
            const std::string su = s + std::to_string(2 + u) + ".";
            const std::string nu = n + "res." + std::to_string(u) + ".";
            snake(dec_name::vocoder(nu + "snake1"), su + "act1", out);
            conv(dec_name::vocoder(nu + "conv1"), su + "conv1.conv", 7, out, out);
            snake(dec_name::vocoder(nu + "snake2"), su + "act2", out);
            conv(dec_name::vocoder(nu + "conv2"), su + "conv2.conv", 1, out, out);
        }
        ch = out;
    }
    const std::string last = std::to_string(hp.upsample_rates.size() + 1);
    const std::string last_conv = std::to_string(hp.upsample_rates.size() + 2);
    snake(dec_name::vocoder("snake_out"), "decoder." + last, ch);
    conv(dec_name::vocoder("conv_out"), "decoder." + last_conv + ".conv", 7, ch, 1);
    return t;
}

}  // namespace kazeia
