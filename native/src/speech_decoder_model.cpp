// Loading the speech decoder's weights: the checked hyper-parameters, one struct per layer, and
// the convolutions' weights packed for conv_gemm on the CPU.
#include "speech_decoder_model.h"

#include <algorithm>
#include <string>
#include <vector>

#include "decoder_arch.h"
#include "devices_internal.h"
#include "kazeia/devices.h"
#include "kazeia/error.h"
#include "ops.h"

namespace kazeia {

DecoderHParams read_checked_decoder_hparams(const GgufWeights &weights) {
    DecoderHParams hp;
    weights.read_meta(decoder_meta_keys(), hp);
    const std::string &path = weights.path();
    auto fail = [&](const std::string &what) {
        throw ModelError(path + ": invalid decoder hyper-parameters: " + what);
    };
    if (hp.num_quantizers < 2 || hp.num_quantizers > 64) fail("num_quantizers");
    if (hp.num_semantic_quantizers < 1 || hp.num_semantic_quantizers >= hp.num_quantizers)
        fail("num_semantic_quantizers");
    if (hp.codebook_size == 0 || hp.codebook_dim < 2 || hp.codebook_dim % 2) fail("codebook");
    if (hp.num_heads == 0 || hp.num_kv_heads == 0 || hp.num_heads % hp.num_kv_heads)
        fail("attention heads");
    if (hp.sliding_window < 2) fail("sliding_window");
    if (hp.upsample_rates.empty() || hp.upsampling_ratios.empty()) fail("upsampling");
    uint64_t hop = 1;
    for (uint32_t r : hp.upsample_rates) hop *= r;
    for (uint32_t r : hp.upsampling_ratios) hop *= r;
    if (hop != hp.hop_length) fail("hop_length is not the product of the upsampling rates");
    if (hp.decoder_dim % (1u << hp.upsample_rates.size())) fail("decoder_dim");
    weights.expect_tensors(decoder_tensor_specs(hp));
    return hp;
}

SpeechDecoder::Model::Model(const std::string &path, int threads, const std::string &device_id,
                            DecoderPrecision precision_)
    : device(device_id),
      weights(path, decoder_part(),
              is_cpu(device) ? ggml_backend_cpu_buffer_type()
                             : ggml_backend_dev_buffer_type(gpu_device(device))),
      n_threads(threads),
      precision(is_cpu(device) ? precision_ : DecoderPrecision::F32) {
    hp = read_checked_decoder_hparams(weights);
    bind_tensors();
    if (is_cpu(device)) pack_weights();  // on a GPU the convs are ggml's matrix products
}

// The convolutions and the ConvNeXt MLPs hold nearly all of the decoder's FLOPs: their
// weights are packed once for conv_gemm. Weights it cannot take (quantized, odd widths)
// stay with ggml.
void SpeechDecoder::Model::pack_weights() {
    if (precision == DecoderPrecision::F32) add_f32_weights();
    auto pack = [this](Conv &c) {
        if (conv_gemm_supported(c.w)) {
            pack_conv_weight(c.w, c.k, precision);
            c.packed = true;
        }
    };
    pack(rvq_first_out);
    pack(rvq_rest_out);
    pack(pre_conv);
    pack(in_proj);
    pack(out_proj);
    for (TfmLayer &l : layers)
        for (Conv *c : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) pack(*c);
    pack(conv_in);
    pack(conv_out);
    for (Upsample &u : upsample) {
        pack(u.trans);
        pack(u.pw1);
        pack(u.pw2);
    }
    for (VocoderBlock &b : blocks) {
        pack(b.up);
        for (ResUnit &r : b.res) {
            if (!r.conv1.winograd) pack(r.conv1);  // else never read: see add_f32_weights
            pack(r.conv2);
        }
    }
}

// Columns a frame at the vocoder's input (element 0) and after each block's upsampling.
std::vector<int64_t> SpeechDecoder::Model::vocoder_columns() const {
    std::vector<int64_t> columns{1};
    for (uint32_t r : hp.upsampling_ratios) columns[0] *= r;
    for (const VocoderBlock &b : blocks) columns.push_back(columns.back() * b.r);
    return columns;
}

// The f32 decoder's weights in forms of its own, written from the weights as the file holds
// them before pack_weights rewrites those; the file's weights of those convs are not read
// again, and their memory goes back.
//
// The residual units' dilated 7-tap convs hold most of the vocoder's multiply-adds; in
// Winograd's form they take 8 products per pair of outputs instead of 14: taken for each conv
// whose tiles fit its frames (every push holds whole frames: the graph then always takes this
// form).
//
// Where a conv's input has at least WIDE_MIN_COLUMNS columns a frame, a streamed push uses each
// of its weights in that many multiply-adds per frame or more: the kernels are bound by those,
// not by reading the weights, so its f16 weights are widened to f32 once (exactly: every f16
// value is a float) instead of at every use. The others stay f16: a push reads them from memory
// at half the bytes.
void SpeechDecoder::Model::add_f32_weights() {
    std::vector<Conv *> winograd, widened;
    const std::vector<int64_t> columns = vocoder_columns();
    for (size_t b = 0; b < blocks.size(); ++b) {
        VocoderBlock &blk = blocks[b];
        for (ResUnit &r : blk.res)
            if (conv_gemm_supported(r.conv1.w) &&
                winograd_fits(r.conv1.k, r.dilation, columns[b + 1]))
                winograd.push_back(&r.conv1);
        if (columns[b] >= WIDE_MIN_COLUMNS) widened.push_back(&blk.up);
        if (columns[b + 1] >= WIDE_MIN_COLUMNS)
            for (ResUnit &r : blk.res) widened.push_back(&r.conv2);
    }
    widened.erase(std::remove_if(widened.begin(), widened.end(),
                                 [](const Conv *c) {
                                     return c->w->type != GGML_TYPE_F16 ||
                                            !conv_gemm_supported(c->w);
                                 }),
                  widened.end());
    if (winograd.empty() && widened.empty()) return;
    const size_t n_tensors = winograd.size() + widened.size();
    f32_ctx.reset(ggml_init({n_tensors * ggml_tensor_overhead(), nullptr, true}));
    for (Conv *c : winograd)
        c->winograd = ggml_new_tensor_3d(f32_ctx.get(), GGML_TYPE_F32, c->in, c->out, c->k + 1);
    std::vector<ggml_tensor *> wide;
    for (const Conv *c : widened)
        wide.push_back(ggml_new_tensor_2d(f32_ctx.get(), GGML_TYPE_F32, c->w->ne[0], c->w->ne[1]));
    f32_buffer.reset(
        ggml_backend_alloc_ctx_tensors_from_buft(f32_ctx.get(), ggml_backend_cpu_buffer_type()));
    if (!f32_buffer) throw ModelError("out of memory for the f32 weights of " + weights.path());
    for (Conv *c : winograd) {
        pack_winograd_weight(c->w, c->k, c->winograd);
        weights.discard(c->w);
    }
    for (size_t i = 0; i < widened.size(); ++i) {
        ggml_fp16_to_fp32_row(static_cast<const ggml_fp16_t *>(widened[i]->w->data),
                              static_cast<float *>(wide[i]->data), ggml_nelements(wide[i]));
        weights.discard(widened[i]->w);
        widened[i]->w = wide[i];
    }
}

void SpeechDecoder::Model::bind_tensors() {
    auto t = [&](const std::string &name) { return weights.tensor(name); };
    auto conv = [&](const std::string &name, int64_t in) {
        Conv c;
        c.w = t(name + ".weight");
        c.b = t(name + ".bias");
        c.in = in;
        c.k = c.w->ne[0] / in;
        c.out = c.w->ne[1];
        return c;
    };
    auto snake = [&](const std::string &name) {
        return Snake{t(name + ".alpha"), t(name + ".inv_beta")};
    };
    for (uint32_t q = 0; q < hp.num_quantizers; ++q)
        codebooks.push_back(t(dec_name::codebook((int)q)));
    auto projection = [&](const char *name) {
        ggml_tensor *w = t(name);
        return Conv{w, nullptr, 1, w->ne[0], w->ne[1]};
    };
    rvq_first_out = projection(dec_name::RVQ_FIRST_OUT);
    rvq_rest_out = projection(dec_name::RVQ_REST_OUT);
    pre_conv = conv(dec_name::PRE_CONV, hp.codebook_dim);
    in_proj = conv(dec_name::IN_PROJ, hp.latent_dim);
    for (int il = 0; il < (int)hp.num_layers; ++il) {
        auto l = [&](const char *part) { return t(dec_name::layer(il, part)); };
        auto lin = [&](const char *part) {
            ggml_tensor *w = l(part);
            return Conv{w, nullptr, 1, w->ne[0], w->ne[1]};
        };
        layers.push_back(TfmLayer{l("attn_norm.weight"), l("attn_scale"), l("ffn_norm.weight"),
                                  l("ffn_scale"), lin("attn_q.weight"), lin("attn_k.weight"),
                                  lin("attn_v.weight"), lin("attn_o.weight"),
                                  lin("ffn_gate.weight"), lin("ffn_up.weight"),
                                  lin("ffn_down.weight")});
    }
    tfm_norm = t(dec_name::TFM_NORM);
    out_proj = conv(dec_name::OUT_PROJ, hp.hidden_size);
    for (int i = 0; i < (int)hp.upsampling_ratios.size(); ++i) {
        auto u = [&](const char *part) { return t(dec_name::upsample(i, part)); };
        Upsample up;
        up.r = hp.upsampling_ratios[i];
        up.trans = Conv{u("trans.weight"), u("trans.bias"), 1, hp.latent_dim, hp.latent_dim};
        up.dw_w = u("dwconv.weight");
        up.dw_b = u("dwconv.bias");
        up.norm_w = u("norm.weight");
        up.norm_b = u("norm.bias");
        up.pw1 = conv(dec_name::upsample(i, "pwconv1"), hp.latent_dim);
        up.pw2 = conv(dec_name::upsample(i, "pwconv2"), 4 * (int64_t)hp.latent_dim);
        up.gamma = u("gamma");
        upsample.push_back(up);
    }
    conv_in = conv(dec_name::vocoder("conv_in"), hp.latent_dim);
    int64_t ch = hp.decoder_dim;
    for (int b = 0; b < (int)hp.upsample_rates.size(); ++b) {
        const std::string n = "blk." + std::to_string(b) + ".";
        VocoderBlock blk;
        blk.r = hp.upsample_rates[b];
        blk.snake = snake(dec_name::vocoder(n + "snake"));
        blk.up = Conv{t(dec_name::vocoder(n + "up.weight")), t(dec_name::vocoder(n + "up.bias")),
                      2, ch, ch / 2};
        for (int u = 0; u < 3; ++u) {
            const std::string nu = n + "res." + std::to_string(u) + ".";
            ResUnit &ru = blk.res[u];
            ru.snake1 = snake(dec_name::vocoder(nu + "snake1"));
            ru.conv1 = conv(dec_name::vocoder(nu + "conv1"), ch / 2);
            ru.dilation = RES_DILATIONS[u];
            ru.snake2 = snake(dec_name::vocoder(nu + "snake2"));
            ru.conv2 = conv(dec_name::vocoder(nu + "conv2"), ch / 2);
        }
        blocks.push_back(blk);
        ch /= 2;
    }
    snake_out = snake(dec_name::vocoder("snake_out"));
    conv_out = conv(dec_name::vocoder("conv_out"), ch);
}

}  // namespace kazeia
