#include "speech_encoder_arch.h"

#include <algorithm>

namespace kazeia {

namespace {
using H = SpeechEncoderHParams;
using K = MetaKey<H>;
const std::string CONFIG = "speech_tokenizer/config.json:";
const std::string ENC = CONFIG + "encoder_config.";

K u32(const char *key, const std::string &source, uint32_t H::*m) { return meta_u32<H>(key, source, field(m)); }
K f32(const char *key, const std::string &source, float H::*m) { return meta_f32<H>(key, source, field(m)); }
}  // namespace

const PartInfo &speech_encoder_part() {
    static const PartInfo part{
        "speech_encoder", "speech_encoder.gguf", "kazeia-speech-encoder",
        "kazeia.speech_encoder.format_version", 1, "speech_tokenizer",
        // The decoder part reads decoder.*; the encoder keeps only the first
        // encoder_valid_num_quantizers codes, so the later acoustic stages (and every stage's
        // decoding side) are never run.
        {"decoder.", "encoder.quantizer.acoustic_residual_vector_quantizer.layers.",
         "encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codebook.initialized",
         "encoder.quantizer.semantic_residual_vector_quantizer.output_proj.",
         "encoder.quantizer.acoustic_residual_vector_quantizer.output_proj."},
        "base"};
    return part;
}

const std::vector<MetaKey<SpeechEncoderHParams>> &speech_encoder_meta_keys() {
    static const std::vector<K> keys = [] {
        std::vector<K> k = {
            u32("kazeia.speech_encoder.sample_rate", CONFIG + "input_sample_rate", &H::sample_rate),
            u32("kazeia.speech_encoder.frame_samples", CONFIG + "encode_downsample_rate", &H::frame_samples),
            u32("kazeia.speech_encoder.valid_quantizers", CONFIG + "encoder_valid_num_quantizers",
                &H::valid_quantizers),
            u32("kazeia.speech_encoder.num_filters", ENC + "num_filters", &H::num_filters),
            u32("kazeia.speech_encoder.kernel_size", ENC + "kernel_size", &H::kernel_size),
            u32("kazeia.speech_encoder.last_kernel_size", ENC + "last_kernel_size", &H::last_kernel_size),
            u32("kazeia.speech_encoder.residual_kernel_size", ENC + "residual_kernel_size",
                &H::residual_kernel_size),
            u32("kazeia.speech_encoder.num_residual_layers", ENC + "num_residual_layers",
                &H::num_residual_layers),
            u32("kazeia.speech_encoder.dilation_growth_rate", ENC + "dilation_growth_rate",
                &H::dilation_growth_rate),
            u32("kazeia.speech_encoder.compress", ENC + "compress", &H::compress),
            u32("kazeia.speech_encoder.hidden_size", ENC + "hidden_size", &H::hidden_size),
            u32("kazeia.speech_encoder.num_layers", ENC + "num_hidden_layers", &H::num_layers),
            u32("kazeia.speech_encoder.num_heads", ENC + "num_attention_heads", &H::num_heads),
            u32("kazeia.speech_encoder.num_kv_heads", ENC + "num_key_value_heads", &H::num_kv_heads),
            u32("kazeia.speech_encoder.head_dim", ENC + "head_dim", &H::head_dim),
            u32("kazeia.speech_encoder.intermediate_size", ENC + "intermediate_size",
                &H::intermediate_size),
            f32("kazeia.speech_encoder.rope_theta", ENC + "rope_theta", &H::rope_theta),
            f32("kazeia.speech_encoder.norm_eps", ENC + "norm_eps", &H::norm_eps),
            f32("kazeia.speech_encoder.frame_rate", ENC + "frame_rate", &H::frame_rate),
            u32("kazeia.speech_encoder.codebook_size", ENC + "codebook_size", &H::codebook_size),
            u32("kazeia.speech_encoder.codebook_dim", ENC + "codebook_dim", &H::codebook_dim),
            u32("kazeia.speech_encoder.vq_dim", ENC + "vector_quantization_hidden_dimension", &H::vq_dim),
            u32("kazeia.speech_encoder.num_quantizers", ENC + "num_quantizers", &H::num_quantizers),
            u32("kazeia.speech_encoder.num_semantic_quantizers", ENC + "num_semantic_quantizers",
                &H::num_semantic_quantizers),
        };
        K ratios{"kazeia.speech_encoder.upsampling_ratios", MetaType::U32_ARRAY, ENC + "upsampling_ratios"};
        ratios.u32_array = field(&H::upsampling_ratios);
        k.push_back(ratios);
        return k;
    }();
    return keys;
}

namespace senc_name {
std::string seanet(int layer, const std::string &what) {
    return "senc.seanet." + std::to_string(layer) + "." + what;
}
std::string layer(int il, const std::string &what) {
    return "senc.tfm.blk." + std::to_string(il) + "." + what;
}
std::string codebook(int q) { return "senc.codebook." + std::to_string(q); }
}  // namespace senc_name

std::vector<SeanetLayer> seanet_layers(const SpeechEncoderHParams &hp) {
    std::vector<SeanetLayer> out;
    int index = 0;
    out.push_back({SeanetLayer::CONV, index++, 1, hp.num_filters, hp.kernel_size, 1, 1});
    int64_t scale = 1;
    std::vector<uint32_t> ratios(hp.upsampling_ratios.rbegin(), hp.upsampling_ratios.rend());
    for (uint32_t r : ratios) {
        const int64_t c = scale * hp.num_filters;
        int64_t dilation = 1;
        for (uint32_t j = 0; j < hp.num_residual_layers; ++j, dilation *= hp.dilation_growth_rate)
            out.push_back({SeanetLayer::RESIDUAL, index++, c, c, hp.residual_kernel_size, 1, dilation});
        out.push_back({SeanetLayer::ELU, index++});
        out.push_back({SeanetLayer::CONV, index++, c, 2 * c, 2 * (int64_t)r, r, 1});
        scale *= 2;
    }
    out.push_back({SeanetLayer::ELU, index++});
    out.push_back({SeanetLayer::CONV, index++, scale * hp.num_filters, hp.hidden_size,
                   hp.last_kernel_size, 1, 1});
    return out;
}

std::vector<TensorSpec> speech_encoder_tensor_specs(const SpeechEncoderHParams &hp) {
    std::vector<TensorSpec> t;
    auto add = [&](std::string name, std::vector<int64_t> ne, std::vector<std::string> sources,
                   Transform tr) {
        for (auto &s : sources) s = "encoder." + s;
        t.push_back({std::move(name), std::move(ne), std::move(sources), tr, Storage::F32});
    };
    // A conv: torch [out, in, k] is ggml [k, in, out] (ggml's im2col convolution), bias [out].
    auto conv = [&](const std::string &name, const std::string &source, int64_t k, int64_t in,
                    int64_t out, bool bias) {
        add(name + ".weight", {k, in, out}, {source + ".weight"}, Transform::COPY);
        if (bias) add(name + ".bias", {out}, {source + ".bias"}, Transform::COPY);
    };
    if (!hp.compress || hp.upsampling_ratios.empty()) return t;  // the loader reports them
    for (const SeanetLayer &l : seanet_layers(hp)) {
        const std::string s = "encoder.layers." + std::to_string(l.index);
        if (l.kind == SeanetLayer::CONV) {
            conv(senc_name::seanet(l.index, "conv"), s + ".conv", l.kernel, l.in, l.out, true);
        } else if (l.kind == SeanetLayer::RESIDUAL) {
            const int64_t inner = l.in / hp.compress;
            conv(senc_name::seanet(l.index, "res1"), s + ".block.1.conv", l.kernel, l.in, inner, true);
            conv(senc_name::seanet(l.index, "res2"), s + ".block.3.conv", 1, inner, l.out, true);
        }
    }
    const int64_t d = hp.hidden_size, q_dim = hp.num_heads * hp.head_dim,
                  kv_dim = hp.num_kv_heads * hp.head_dim;
    for (int il = 0; il < (int)hp.num_layers; ++il) {
        const std::string l = "encoder_transformer.layers." + std::to_string(il) + ".";
        auto vec = [&](const char *what, const std::string &source, int64_t n) {
            add(senc_name::layer(il, what), {n}, {l + source}, Transform::COPY);
        };
        auto linear = [&](const char *what, const std::string &source, int64_t in, int64_t out) {
            add(senc_name::layer(il, what), {in, out}, {l + source}, Transform::COPY);
        };
        vec("attn_norm.weight", "input_layernorm.weight", d);
        vec("attn_norm.bias", "input_layernorm.bias", d);
        linear("attn_q.weight", "self_attn.q_proj.weight", d, q_dim);
        linear("attn_k.weight", "self_attn.k_proj.weight", d, kv_dim);
        linear("attn_v.weight", "self_attn.v_proj.weight", d, kv_dim);
        linear("attn_o.weight", "self_attn.o_proj.weight", q_dim, d);
        vec("attn_scale", "self_attn_layer_scale.scale", d);
        vec("ffn_norm.weight", "post_attention_layernorm.weight", d);
        vec("ffn_norm.bias", "post_attention_layernorm.bias", d);
        linear("ffn_up.weight", "mlp.fc1.weight", d, hp.intermediate_size);
        linear("ffn_down.weight", "mlp.fc2.weight", hp.intermediate_size, d);
        vec("ffn_scale", "mlp_layer_scale.scale", d);
    }
    const int64_t stride =
        hp.frame_rate > 0 ? (int64_t)(hp.sample_rate / (double)hp.seanet_stride() / hp.frame_rate + 0.5) : 1;
    add(senc_name::DOWNSAMPLE, {2 * stride, d, d}, {"downsample.conv.weight"}, Transform::COPY);
    const std::string sem = "quantizer.semantic_residual_vector_quantizer.",
                      ac = "quantizer.acoustic_residual_vector_quantizer.";
    add(senc_name::SEMANTIC_PROJ, {d, hp.vq_dim}, {sem + "input_proj.weight"}, Transform::CONV);
    add(senc_name::ACOUSTIC_PROJ, {d, hp.vq_dim}, {ac + "input_proj.weight"}, Transform::CONV);
    const int n_sem = (int)hp.num_semantic_quantizers;
    for (int q = 0; q < (int)std::min(hp.valid_quantizers, hp.num_quantizers); ++q) {
        const std::string cb = (q < n_sem ? sem : ac) + "layers." +
                               std::to_string(q < n_sem ? q : q - n_sem) + ".codebook.";
        add(senc_name::codebook(q), {hp.codebook_dim, hp.codebook_size},
            {cb + "embed_sum", cb + "cluster_usage"}, Transform::CODEBOOK);
    }
    return t;
}

}  // namespace kazeia
