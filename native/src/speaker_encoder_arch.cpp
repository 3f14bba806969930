#include "speaker_encoder_arch.h"

namespace kazeia {

namespace {
using H = SpeakerEncoderHParams;
using K = MetaKey<H>;
const std::string SPK = "config.json:speaker_encoder_config.";

K u32(const char *key, const std::string &source, uint32_t H::*m, std::vector<double> fallback = {}) {
    K k = meta_u32<H>(key, source, field(m));
    k.fallback = std::move(fallback);
    return k;
}
K u32_array(const char *key, const std::string &source, std::vector<uint32_t> H::*m,
            std::vector<double> fallback) {
    K k{key, MetaType::U32_ARRAY, source};
    k.u32_array = field(m);
    k.fallback = std::move(fallback);
    return k;
}
K constant_u32(const char *key, uint32_t H::*m, double value) {
    K k = meta_u32<H>(key, "", field(m));
    k.constant = value;
    return k;
}
K constant_f32(const char *key, float H::*m, double value) {
    K k = meta_f32<H>(key, "", field(m));
    k.constant = value;
    return k;
}
}  // namespace

const PartInfo &speaker_encoder_part() {
    static const PartInfo part{"speaker_encoder", "speaker_encoder.gguf", "kazeia-speaker-encoder",
                               "kazeia.speaker_encoder.format_version", 1, "",
                               // The talker part reads the rest of model.safetensors.
                               {"talker."}, "base"};
    return part;
}

const std::vector<MetaKey<SpeakerEncoderHParams>> &speaker_encoder_meta_keys() {
    // The fallbacks are Qwen3TTSSpeakerEncoderConfig's defaults: the published config.json
    // gives only enc_dim and sample_rate.
    static const std::vector<K> keys = {
        u32("kazeia.speaker_encoder.sample_rate", SPK + "sample_rate", &H::sample_rate, {24000}),
        constant_u32("kazeia.speaker_encoder.n_fft", &H::n_fft, 1024),
        constant_u32("kazeia.speaker_encoder.hop", &H::hop, 256),
        constant_u32("kazeia.speaker_encoder.window", &H::window, 1024),
        constant_f32("kazeia.speaker_encoder.fmin", &H::fmin, 0),
        constant_f32("kazeia.speaker_encoder.fmax", &H::fmax, 12000),
        u32("kazeia.speaker_encoder.mel_dim", SPK + "mel_dim", &H::mel_dim, {128}),
        u32("kazeia.speaker_encoder.enc_dim", SPK + "enc_dim", &H::enc_dim),
        u32_array("kazeia.speaker_encoder.channels", SPK + "enc_channels", &H::channels,
                  {512, 512, 512, 512, 1536}),
        u32_array("kazeia.speaker_encoder.kernel_sizes", SPK + "enc_kernel_sizes",
                  &H::kernel_sizes, {5, 3, 3, 3, 1}),
        u32_array("kazeia.speaker_encoder.dilations", SPK + "enc_dilations", &H::dilations,
                  {1, 2, 3, 4, 1}),
        u32("kazeia.speaker_encoder.attention_channels", SPK + "enc_attention_channels",
            &H::attention_channels, {128}),
        u32("kazeia.speaker_encoder.res2net_scale", SPK + "enc_res2net_scale", &H::res2net_scale, {8}),
        u32("kazeia.speaker_encoder.se_channels", SPK + "enc_se_channels", &H::se_channels, {128}),
    };
    return keys;
}

namespace spk_name {
std::string conv(const std::string &what) { return "spk." + what; }
std::string block(int b, const std::string &what) {
    return "spk.blk." + std::to_string(b) + "." + what;
}
}  // namespace spk_name

std::vector<TensorSpec> speaker_encoder_tensor_specs(const SpeakerEncoderHParams &hp) {
    std::vector<TensorSpec> t;
    // A conv layer: torch weight [out, in, k] is ggml [k, in, out] as is (the layout ggml's
    // im2col convolution takes), bias [out].
    auto conv = [&](const std::string &name, const std::string &source, int64_t k, int64_t in,
                    int64_t out) {
        t.push_back({name + ".weight", {k, in, out}, {"speaker_encoder." + source + ".weight"},
                     Transform::COPY, Storage::F32});
        t.push_back({name + ".bias", {out}, {"speaker_encoder." + source + ".bias"},
                     Transform::COPY, Storage::F32});
    };
    const std::vector<uint32_t> &ch = hp.channels, &ks = hp.kernel_sizes;
    if (ch.size() < 3 || ks.size() != ch.size() || hp.dilations.size() != ch.size() ||
        !hp.res2net_scale)
        return t;  // the loader reports the inconsistent hyper-parameters
    conv(spk_name::block(0, "tdnn"), "blocks.0.conv", ks[0], hp.mel_dim, ch[0]);
    for (int b = 1; b <= hp.n_blocks(); ++b) {
        const std::string s = "blocks." + std::to_string(b) + ".";
        const int64_t c = ch[b], part = c / hp.res2net_scale;
        conv(spk_name::block(b, "tdnn1"), s + "tdnn1.conv", 1, ch[b - 1], c);
        for (int j = 0; j + 1 < (int)hp.res2net_scale; ++j)
            conv(spk_name::block(b, "res2net." + std::to_string(j)),
                 s + "res2net_block.blocks." + std::to_string(j) + ".conv", ks[b], part, part);
        conv(spk_name::block(b, "tdnn2"), s + "tdnn2.conv", 1, c, c);
        conv(spk_name::block(b, "se1"), s + "se_block.conv1", 1, c, hp.se_channels);
        conv(spk_name::block(b, "se2"), s + "se_block.conv2", 1, hp.se_channels, c);
    }
    const int64_t last = ch.back();
    conv(spk_name::conv("mfa"), "mfa.conv", ks.back(), last, last);
    conv(spk_name::conv("asp.tdnn"), "asp.tdnn.conv", 1, 3 * last, hp.attention_channels);
    conv(spk_name::conv("asp.conv"), "asp.conv", 1, hp.attention_channels, last);
    conv(spk_name::conv("fc"), "fc", 1, 2 * last, hp.enc_dim);
    return t;
}

}  // namespace kazeia
