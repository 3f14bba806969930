// The speech encoder of the Base models (docs/model.md, "Model kinds"): a Mimi encoder. SEANet
// causal convolutions (time-major [T, C], ggml's im2col convolution with Encodec's padding
// rule), a causal transformer without a window (what transformers 4.57.3 runs), the
// downsampling conv with replicate padding, then the split residual vector quantizer in double
// precision here. Runs once per voice; every weight is f32.
#include "kazeia/speech_encoder.h"

#include <cmath>
#include <limits>

#include "cpu_backend.h"
#include "ggml_raii.h"
#include "gguf_weights.h"
#include "kazeia/error.h"
#include "speech_encoder_arch.h"
#include "worker_pool.h"

namespace kazeia {

struct SpeechEncoder::Impl {
    GgufWeights weights;
    SpeechEncoderHParams hp;
    int n_threads;
    int64_t downsample_stride = 0;
    std::vector<SeanetLayer> layers;

    Impl(const std::string &path, int threads)
        : weights(path, speech_encoder_part(), GgufWeights::Mapped{}), n_threads(threads) {
        weights.read_meta(speech_encoder_meta_keys(), hp);
        auto fail = [&](const std::string &what) {
            throw ModelError(path + ": invalid speech-encoder hyper-parameters: " + what);
        };
        if (hp.upsampling_ratios.empty() || !hp.compress || !hp.num_filters || !hp.hidden_size)
            fail("sizes");
        if (!hp.num_heads || !hp.num_kv_heads || hp.num_heads % hp.num_kv_heads || !hp.head_dim)
            fail("attention heads");
        if (hp.codebook_dim != hp.vq_dim) fail("codebook width != quantizer width");
        if (!hp.num_semantic_quantizers || hp.valid_quantizers > hp.num_quantizers ||
            hp.valid_quantizers <= hp.num_semantic_quantizers)
            fail("quantizer counts");
        if (!(hp.frame_rate > 0.0f)) fail("frame rate");
        const double seanet_rate = hp.sample_rate / (double)hp.seanet_stride();
        downsample_stride = (int64_t)std::lround(seanet_rate / hp.frame_rate);
        if (downsample_stride < 1 || hp.seanet_stride() * downsample_stride != hp.frame_samples)
            fail("frame rate and strides disagree");
        weights.expect_tensors(speech_encoder_tensor_specs(hp));
        layers = seanet_layers(hp);
    }

    ggml_tensor *w(const std::string &name) const { return weights.tensor(name); }

    // Mimi's causal conv: x [T, in] -> [ceil(T / stride), out]. Left padding (k-1)*d + 1 -
    // stride, right padding what completes the last window (Encodec's rule), zeros or the edge
    // values (replicate).
    ggml_tensor *conv(ggml_context *ctx, ggml_tensor *x, ggml_tensor *kernel, ggml_tensor *bias,
                      int64_t stride, int64_t dilation, bool replicate) const {
        const int64_t k = kernel->ne[0], T = x->ne[0], out_ch = kernel->ne[2];
        const int64_t keff = (k - 1) * dilation + 1, total = keff - stride;
        const int64_t n_frames =
            (int64_t)std::ceil((double)(T - keff + total) / (double)stride + 1.0) - 1;
        const int64_t extra = n_frames * stride + keff - total - T;
        if (replicate) {
            auto edge = [&](int64_t at, int64_t n) {
                ggml_tensor *col = ggml_cont(ctx, ggml_view_2d(ctx, x, 1, x->ne[1], x->nb[1], at * x->nb[0]));
                return ggml_repeat(ctx, col, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, x->ne[1]));
            };
            // Both edges from the unpadded input.
            ggml_tensor *left = total > 0 ? edge(0, total) : nullptr;
            ggml_tensor *right = extra > 0 ? edge(T - 1, extra) : nullptr;
            if (left) x = ggml_concat(ctx, left, x, 0);
            if (right) x = ggml_concat(ctx, x, right, 0);
        } else if (total > 0 || extra > 0) {
            x = ggml_pad_ext(ctx, x, (int)total, (int)extra, 0, 0, 0, 0, 0, 0);
        }
        ggml_tensor *cols = ggml_im2col(ctx, kernel, x, (int)stride, 0, 0, 0, (int)dilation, 0,
                                        false, GGML_TYPE_F32);
        ggml_tensor *y = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, cols, cols->ne[0], cols->ne[1]),
                                      ggml_reshape_2d(ctx, kernel, k * kernel->ne[1], out_ch));
        if (bias) y = ggml_add(ctx, y, ggml_reshape_2d(ctx, bias, 1, out_ch));
        return y;
    }

    ggml_tensor *seanet(ggml_context *ctx, ggml_tensor *x) const {
        for (const SeanetLayer &l : layers) {
            if (l.kind == SeanetLayer::ELU) {
                x = ggml_elu(ctx, x);
            } else if (l.kind == SeanetLayer::CONV) {
                const std::string n = senc_name::seanet(l.index, "conv");
                x = conv(ctx, x, w(n + ".weight"), w(n + ".bias"), l.stride, 1, false);
            } else {  // residual: ELU, conv k (dilated), ELU, conv 1x1, plus the input
                const std::string n1 = senc_name::seanet(l.index, "res1"),
                                  n2 = senc_name::seanet(l.index, "res2");
                ggml_tensor *h = conv(ctx, ggml_elu(ctx, x), w(n1 + ".weight"), w(n1 + ".bias"), 1,
                                      l.dilation, false);
                h = conv(ctx, ggml_elu(ctx, h), w(n2 + ".weight"), w(n2 + ".bias"), 1, 1, false);
                x = ggml_add(ctx, x, h);
            }
        }
        return x;
    }

    // x [hidden, T] -> [hidden, T]
    ggml_tensor *transformer(ggml_context *ctx, ggml_tensor *x, ggml_tensor *positions,
                             ggml_tensor *mask) const {
        const int64_t T = x->ne[1], hd = hp.head_dim, nh = hp.num_heads, nkv = hp.num_kv_heads;
        auto norm = [&](ggml_tensor *t, int il, const char *what) {
            const std::string n = std::string(what);
            return ggml_add(ctx,
                            ggml_mul(ctx, ggml_norm(ctx, t, hp.norm_eps), w(senc_name::layer(il, n + ".weight"))),
                            w(senc_name::layer(il, n + ".bias")));
        };
        for (int il = 0; il < (int)hp.num_layers; ++il) {
            ggml_tensor *a = norm(x, il, "attn_norm");
            auto rope = [&](const char *what, int64_t heads) {
                ggml_tensor *t = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, w(senc_name::layer(il, what)), a), hd, heads, T);
                return ggml_rope_ext(ctx, t, positions, nullptr, (int)hd, GGML_ROPE_TYPE_NEOX, 0,
                                     hp.rope_theta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
            };
            ggml_tensor *Q = ggml_permute(ctx, rope("attn_q.weight", nh), 0, 2, 1, 3);
            ggml_tensor *K = ggml_permute(ctx, rope("attn_k.weight", nkv), 0, 2, 1, 3);
            ggml_tensor *v = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, w(senc_name::layer(il, "attn_v.weight")), a), hd, nkv, T);
            ggml_tensor *kq = ggml_soft_max_ext(ctx, ggml_mul_mat(ctx, K, Q), mask,
                                                1.0f / std::sqrt((float)hd), 0.0f);
            ggml_tensor *V = ggml_cont(ctx, ggml_permute(ctx, v, 1, 2, 0, 3));
            ggml_tensor *o = ggml_mul_mat(ctx, V, kq);  // [hd, T, heads]
            o = ggml_reshape_2d(ctx, ggml_cont(ctx, ggml_permute(ctx, o, 0, 2, 1, 3)), hd * nh, T);
            o = ggml_mul_mat(ctx, w(senc_name::layer(il, "attn_o.weight")), o);
            x = ggml_add(ctx, x, ggml_mul(ctx, o, w(senc_name::layer(il, "attn_scale"))));
            ggml_tensor *f = norm(x, il, "ffn_norm");
            f = ggml_gelu_erf(ctx, ggml_mul_mat(ctx, w(senc_name::layer(il, "ffn_up.weight")), f));
            f = ggml_mul_mat(ctx, w(senc_name::layer(il, "ffn_down.weight")), f);
            x = ggml_add(ctx, x, ggml_mul(ctx, f, w(senc_name::layer(il, "ffn_scale"))));
        }
        return x;
    }

    Result encode(const float *samples, int64_t n) const {
        if (n < 1) throw InputError("the recording is empty");
        // SEANet length: each strided conv gives ceil(T / stride).
        int64_t T = n;
        for (const SeanetLayer &l : layers)
            if (l.kind == SeanetLayer::CONV) T = (T + l.stride - 1) / l.stride;

        const size_t nodes = 4096;
        std::vector<uint8_t> mem(ggml_tensor_overhead() * nodes + ggml_graph_overhead_custom(nodes, false));
        ggml_init_params params = {mem.size(), mem.data(), true};
        GgmlContextPtr ctx(ggml_init(params));
        ggml_context *c = ctx.get();
        ggml_tensor *audio = ggml_new_tensor_2d(c, GGML_TYPE_F32, n, 1);
        ggml_tensor *positions = ggml_new_tensor_1d(c, GGML_TYPE_I32, T);
        ggml_tensor *mask = ggml_new_tensor_2d(c, GGML_TYPE_F32, T, T);
        for (ggml_tensor *t : {audio, positions, mask}) ggml_set_input(t);

        ggml_tensor *x = seanet(c, audio);  // [T, hidden]
        x = ggml_cont(c, ggml_transpose(c, transformer(c, ggml_cont(c, ggml_transpose(c, x)), positions, mask)));
        x = conv(c, x, w(senc_name::DOWNSAMPLE), nullptr, downsample_stride, 1, true);  // [T', hidden]
        ggml_tensor *latent = ggml_cont(c, ggml_transpose(c, x));                        // [hidden, T']
        ggml_tensor *semantic = ggml_mul_mat(c, w(senc_name::SEMANTIC_PROJ), latent);    // [vq, T']
        ggml_tensor *acoustic = ggml_mul_mat(c, w(senc_name::ACOUSTIC_PROJ), latent);
        ggml_cgraph *gf = ggml_new_graph_custom(c, nodes, false);
        for (ggml_tensor *t : {latent, semantic, acoustic}) {
            ggml_set_output(t);
            ggml_build_forward_expand(gf, t);
        }

        OneShotGraph graph(gf, n_threads, "speech encoder");
        ggml_backend_tensor_set(audio, samples, 0, n * sizeof(float));
        std::vector<int32_t> pos(T);
        std::vector<float> causal(T * T);
        for (int64_t i = 0; i < T; ++i) {
            pos[i] = (int32_t)i;
            for (int64_t j = 0; j < T; ++j)
                causal[i * T + j] = j <= i ? 0.0f : -std::numeric_limits<float>::infinity();
        }
        ggml_backend_tensor_set(positions, pos.data(), 0, pos.size() * sizeof(int32_t));
        ggml_backend_tensor_set(mask, causal.data(), 0, causal.size() * sizeof(float));
        graph.compute();
        if (weights.damaged())
            throw ModelError(weights.path() + " changed on disk while in use: reload the model");

        const int64_t steps = latent->ne[1], d = hp.hidden_size;
        Result r;
        r.frames = std::min<int64_t>(steps, (n + hp.frame_samples - 1) / hp.frame_samples);
        std::vector<float> lat(d * steps), sem(hp.vq_dim * steps), ac(hp.vq_dim * steps);
        ggml_backend_tensor_get(latent, lat.data(), 0, lat.size() * sizeof(float));
        ggml_backend_tensor_get(semantic, sem.data(), 0, sem.size() * sizeof(float));
        ggml_backend_tensor_get(acoustic, ac.data(), 0, ac.size() * sizeof(float));
        r.latent.assign(lat.begin(), lat.begin() + r.frames * d);  // [frames, hidden]
        r.codes.resize(r.frames * hp.valid_quantizers);
        quantize(sem, ac, r);
        return r;
    }

    // The split RVQ: the semantic stages quantize the semantic projection, the acoustic stages
    // the acoustic one; each stage takes the nearest codeword (Euclidean) of the residual and
    // subtracts it. Distances in double precision.
    void quantize(const std::vector<float> &sem, const std::vector<float> &ac, Result &r) const {
        const int64_t dim = hp.codebook_dim, size = hp.codebook_size, nq = hp.valid_quantizers;
        std::vector<std::vector<float>> books(nq);
        std::vector<std::vector<double>> norms(nq);
        for (int64_t q = 0; q < nq; ++q) {
            const ggml_tensor *t = w(senc_name::codebook((int)q));
            books[q].resize(dim * size);
            ggml_backend_tensor_get(t, books[q].data(), 0, books[q].size() * sizeof(float));
            norms[q].assign(size, 0.0);
            for (int64_t c = 0; c < size; ++c)
                for (int64_t i = 0; i < dim; ++i)
                    norms[q][c] += (double)books[q][c * dim + i] * books[q][c * dim + i];
        }
        WorkerPool pool(n_threads);
        pool.run(r.frames, [&](int64_t t) {
            std::vector<double> residual(dim);
            for (int64_t q = 0; q < nq; ++q) {
                if (q == 0 || q == (int64_t)hp.num_semantic_quantizers) {
                    const std::vector<float> &src = q == 0 ? sem : ac;
                    for (int64_t i = 0; i < dim; ++i) residual[i] = src[t * dim + i];
                }
                const float *book = books[q].data();
                int64_t best = 0;
                double best_d = std::numeric_limits<double>::infinity();
                for (int64_t c = 0; c < size; ++c) {
                    double dot = 0.0;
                    for (int64_t i = 0; i < dim; ++i) dot += residual[i] * book[c * dim + i];
                    const double dist = norms[q][c] - 2.0 * dot;  // |x|^2 is the same for all c
                    if (dist < best_d) best_d = dist, best = c;
                }
                r.codes[t * nq + q] = (int32_t)best;
                for (int64_t i = 0; i < dim; ++i) residual[i] -= book[best * dim + i];
            }
        });
    }
};

SpeechEncoder::SpeechEncoder(const std::string &path, int n_threads) {
    if (n_threads < 1 || n_threads > 512) throw InputError("threads must be in 1..512");
    impl_ = std::make_unique<Impl>(path, n_threads);
}
SpeechEncoder::~SpeechEncoder() = default;
const SpeechEncoderHParams &SpeechEncoder::hparams() const { return impl_->hp; }
SpeechEncoder::Result SpeechEncoder::encode(const float *samples, int64_t n) const {
    return impl_->encode(samples, n);
}

}  // namespace kazeia
