// The speaker encoder of the Base models (docs/model.md, "Model kinds"): log-mel features here
// in double precision (a radix-2 FFT and the Slaney mel filterbank of librosa), then the
// ECAPA-TDNN as one ggml graph in time-major layout [T, C] (ggml's reflect padding, im2col
// convolution and softmax all work along ne0 = time). Runs once per voice; every weight is f32.
#include "kazeia/speaker_encoder.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <complex>

#include "cpu_backend.h"
#include "ggml_raii.h"
#include "gguf_weights.h"
#include "kazeia/error.h"
#include "speaker_encoder_arch.h"

namespace kazeia {

namespace {

// Slaney's mel scale (librosa's default, htk=False): linear below 1 kHz, logarithmic above.
constexpr double MEL_F_SP = 200.0 / 3.0, MEL_MIN_LOG_HZ = 1000.0;
const double MEL_MIN_LOG_MEL = MEL_MIN_LOG_HZ / MEL_F_SP, MEL_LOGSTEP = std::log(6.4) / 27.0;

double hz_to_mel(double f) {
    return f >= MEL_MIN_LOG_HZ ? MEL_MIN_LOG_MEL + std::log(f / MEL_MIN_LOG_HZ) / MEL_LOGSTEP
                               : f / MEL_F_SP;
}
double mel_to_hz(double m) {
    return m >= MEL_MIN_LOG_MEL ? MEL_MIN_LOG_HZ * std::exp(MEL_LOGSTEP * (m - MEL_MIN_LOG_MEL))
                                : MEL_F_SP * m;
}

// librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax) with Slaney area normalisation, rounded
// to float32 as librosa returns it: [n_mels][n_fft / 2 + 1].
std::vector<float> mel_filterbank(const SpeakerEncoderHParams &hp) {
    const int64_t bins = hp.n_fft / 2 + 1, n_mels = hp.mel_dim;
    std::vector<double> mel_f(n_mels + 2);
    const double lo = hz_to_mel(hp.fmin), hi = hz_to_mel(hp.fmax);
    for (int64_t i = 0; i < n_mels + 2; ++i)
        mel_f[i] = mel_to_hz(lo + (hi - lo) * (double)i / (double)(n_mels + 1));
    std::vector<float> fb(n_mels * bins);
    for (int64_t m = 0; m < n_mels; ++m) {
        const double enorm = 2.0 / (mel_f[m + 2] - mel_f[m]);
        for (int64_t k = 0; k < bins; ++k) {
            const double f = (double)k * hp.sample_rate / (double)hp.n_fft;
            const double lower = (f - mel_f[m]) / (mel_f[m + 1] - mel_f[m]);
            const double upper = (mel_f[m + 2] - f) / (mel_f[m + 2] - mel_f[m + 1]);
            const float w = (float)std::max(0.0, std::min(lower, upper));
            fb[m * bins + k] = (float)(w * enorm);
        }
    }
    return fb;
}

// In-place radix-2 FFT of a power-of-two length.
void fft(std::vector<std::complex<double>> &a) {
    const size_t n = a.size();
    for (size_t i = 1, j = 0; i < n; ++i) {
        size_t bit = n >> 1;
        for (; j & bit; bit >>= 1) j ^= bit;
        j ^= bit;
        if (i < j) std::swap(a[i], a[j]);
    }
    for (size_t len = 2; len <= n; len <<= 1) {
        const double angle = -2.0 * M_PI / (double)len;
        for (size_t i = 0; i < n; i += len)
            for (size_t k = 0; k < len / 2; ++k) {
                const std::complex<double> w(std::cos(angle * k), std::sin(angle * k));
                const std::complex<double> u = a[i + k], v = a[i + k + len / 2] * w;
                a[i + k] = u + v;
                a[i + k + len / 2] = u - v;
            }
    }
}

}  // namespace

struct SpeakerEncoder::Impl {
    GgufWeights weights;
    SpeakerEncoderHParams hp;
    int n_threads;
    std::vector<float> filterbank;
    int max_pad = 0;  // the widest reflect padding of a conv (frames)

    Impl(const std::string &path, int threads)
        : weights(path, speaker_encoder_part(), GgufWeights::Mapped{}), n_threads(threads) {
        weights.read_meta(speaker_encoder_meta_keys(), hp);
        auto fail = [&](const std::string &what) {
            throw ModelError(path + ": invalid speaker-encoder hyper-parameters: " + what);
        };
        const size_t n = hp.channels.size();
        if (n < 3 || hp.kernel_sizes.size() != n || hp.dilations.size() != n) fail("layer lists");
        if (!hp.res2net_scale || !hp.mel_dim || !hp.enc_dim || !hp.attention_channels ||
            !hp.se_channels)
            fail("sizes");
        for (size_t i = 1; i + 1 < n; ++i)
            if (hp.channels[i] % hp.res2net_scale) fail("channels not divisible by res2net_scale");
        if (hp.channels.back() != (n - 2) * hp.channels[n - 2]) fail("aggregation width");
        for (size_t i = 0; i < n; ++i) {
            if (hp.kernel_sizes[i] % 2 == 0) fail("even kernel");
            max_pad = std::max(max_pad, (int)(hp.dilations[i] * (hp.kernel_sizes[i] - 1) / 2));
        }
        if (hp.n_fft < 2 || (hp.n_fft & (hp.n_fft - 1)) || !hp.hop || hp.window != hp.n_fft ||
            hp.n_fft < 2 * hp.hop || !(hp.fmax > hp.fmin) || 2 * hp.fmax > hp.sample_rate)
            fail("mel features");
        weights.expect_tensors(speaker_encoder_tensor_specs(hp));
        filterbank = mel_filterbank(hp);
    }

    int64_t frames_of(int64_t n) const {
        const int64_t pad = (hp.n_fft - hp.hop) / 2;
        return n + 2 * pad < hp.n_fft ? 0 : 1 + (n + 2 * pad - hp.n_fft) / hp.hop;
    }

    std::vector<float> mel(const float *x, int64_t n) const {
        const int64_t pad = (hp.n_fft - hp.hop) / 2, nfft = hp.n_fft, bins = nfft / 2 + 1;
        const int64_t frames = frames_of(n);
        if (n <= pad || frames <= max_pad)
            throw InputError("the recording is too short for a speaker embedding (" +
                             std::to_string(n) + " samples; at least " +
                             std::to_string(min_samples()) + ")");
        auto sample = [&](int64_t i) {  // reflect padding (torch 'reflect': edge not repeated)
            int64_t j = i - pad;
            if (j < 0) j = -j;
            if (j >= n) j = 2 * (n - 1) - j;
            return (double)x[j];
        };
        std::vector<double> window(nfft);
        for (int64_t i = 0; i < nfft; ++i)
            window[i] = 0.5 - 0.5 * std::cos(2.0 * M_PI * (double)i / (double)nfft);  // periodic
        std::vector<float> out(frames * hp.mel_dim);
        std::vector<std::complex<double>> buf(nfft);
        std::vector<double> mag(bins);
        for (int64_t t = 0; t < frames; ++t) {
            for (int64_t i = 0; i < nfft; ++i) buf[i] = sample(t * hp.hop + i) * window[i];
            fft(buf);
            for (int64_t k = 0; k < bins; ++k) mag[k] = std::sqrt(std::norm(buf[k]) + 1e-9);
            for (int64_t m = 0; m < hp.mel_dim; ++m) {
                double s = 0.0;
                const float *w = filterbank.data() + m * bins;
                for (int64_t k = 0; k < bins; ++k) s += (double)w[k] * mag[k];
                out[t * hp.mel_dim + m] = (float)std::log(std::max(s, 1e-5));
            }
        }
        return out;
    }

    int64_t min_samples() const {
        // frames_of(n) > max_pad, and n > the framing's reflect padding
        const int64_t pad = (hp.n_fft - hp.hop) / 2;
        return std::max<int64_t>(pad + 1, (int64_t)max_pad * hp.hop + hp.n_fft - 2 * pad);
    }

    ggml_tensor *w(const std::string &name) const { return weights.tensor(name); }

    // A 'same' conv with reflect padding: x [T, in] -> [T, out] (+ bias, + ReLU when asked).
    ggml_tensor *conv(ggml_context *ctx, ggml_tensor *x, const std::string &name, int dilation,
                      bool relu) const {
        ggml_tensor *kernel = w(name + ".weight"), *bias = w(name + ".bias");
        const int64_t k = kernel->ne[0], out_ch = kernel->ne[2];
        const int pad = dilation * (int)(k - 1) / 2;
        if (pad > 0) x = ggml_pad_reflect_1d(ctx, x, pad, pad);
        ggml_tensor *cols = ggml_im2col(ctx, kernel, x, 1, 0, 0, 0, dilation, 0, false, GGML_TYPE_F32);
        ggml_tensor *y = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, cols, cols->ne[0], cols->ne[1]),
                                      ggml_reshape_2d(ctx, kernel, k * kernel->ne[1], out_ch));
        y = ggml_add(ctx, y, ggml_reshape_2d(ctx, bias, 1, out_ch));
        return relu ? ggml_relu(ctx, y) : y;
    }

    // Channels [from, from + n) of x [T, C].
    static ggml_tensor *channels(ggml_context *ctx, ggml_tensor *x, int64_t from, int64_t n) {
        return ggml_view_2d(ctx, x, x->ne[0], n, x->nb[1], from * x->nb[1]);
    }

    // sqrt(max(v, 1e-12)): the official statistics pooling's std.
    static ggml_tensor *safe_sqrt(ggml_context *ctx, ggml_tensor *v) {
        return ggml_sqrt(ctx, ggml_clamp(ctx, v, 1e-12f, FLT_MAX));
    }

    ggml_tensor *se_res2net(ggml_context *ctx, ggml_tensor *x, int b) const {
        const int64_t c = hp.channels[b], part = c / hp.res2net_scale;
        const int d = (int)hp.dilations[b];
        ggml_tensor *h = conv(ctx, x, spk_name::block(b, "tdnn1"), 1, true);
        ggml_tensor *joined = channels(ctx, h, 0, part), *prev = nullptr;
        for (int j = 1; j < (int)hp.res2net_scale; ++j) {
            ggml_tensor *in = ggml_cont(ctx, channels(ctx, h, j * part, part));
            if (prev) in = ggml_add(ctx, in, prev);
            prev = conv(ctx, in, spk_name::block(b, "res2net." + std::to_string(j - 1)), d, true);
            joined = ggml_concat(ctx, joined, prev, 1);
        }
        h = conv(ctx, joined, spk_name::block(b, "tdnn2"), 1, true);
        // Squeeze-excitation: the time mean weighs the channels.
        ggml_tensor *s = conv(ctx, ggml_mean(ctx, h), spk_name::block(b, "se1"), 1, true);
        s = ggml_sigmoid(ctx, conv(ctx, s, spk_name::block(b, "se2"), 1, false));
        return ggml_add(ctx, ggml_mul(ctx, h, s), x);
    }

    ggml_tensor *build(ggml_context *ctx, ggml_tensor *mel) const {
        ggml_tensor *x = conv(ctx, mel, spk_name::block(0, "tdnn"), (int)hp.dilations[0], true);
        ggml_tensor *mfa_in = nullptr;
        for (int b = 1; b <= hp.n_blocks(); ++b) {
            x = se_res2net(ctx, x, b);
            mfa_in = mfa_in ? ggml_concat(ctx, mfa_in, x, 1) : x;
        }
        x = conv(ctx, mfa_in, spk_name::conv("mfa"), (int)hp.dilations.back(), true);

        // Attentive statistics pooling: global mean and std as context, attention over time,
        // then the attention-weighted mean and std.
        ggml_tensor *mean = ggml_mean(ctx, x);
        ggml_tensor *std = safe_sqrt(ctx, ggml_mean(ctx, ggml_sqr(ctx, ggml_sub(ctx, x, mean))));
        ggml_tensor *context = ggml_concat(
            ctx, ggml_concat(ctx, x, ggml_repeat(ctx, mean, x), 1), ggml_repeat(ctx, std, x), 1);
        ggml_tensor *att = ggml_tanh(ctx, conv(ctx, context, spk_name::conv("asp.tdnn"), 1, true));
        att = ggml_soft_max(ctx, conv(ctx, att, spk_name::conv("asp.conv"), 1, false));
        ggml_tensor *wmean = ggml_sum_rows(ctx, ggml_mul(ctx, att, x));
        ggml_tensor *wstd = safe_sqrt(
            ctx, ggml_sum_rows(ctx, ggml_mul(ctx, att, ggml_sqr(ctx, ggml_sub(ctx, x, wmean)))));
        return conv(ctx, ggml_concat(ctx, wmean, wstd, 1), spk_name::conv("fc"), 1, false);
    }

    std::vector<float> embed_mel(const std::vector<float> &mel, int64_t frames) const {
        if (frames <= max_pad || (int64_t)mel.size() != frames * hp.mel_dim)
            throw InputError("mel features must be [frames > " + std::to_string(max_pad) + ", " +
                             std::to_string(hp.mel_dim) + "]");
        const size_t nodes = 4096;
        std::vector<uint8_t> mem(ggml_tensor_overhead() * nodes + ggml_graph_overhead_custom(nodes, false));
        ggml_init_params params = {mem.size(), mem.data(), true};
        GgmlContextPtr ctx(ggml_init(params));
        ggml_tensor *in = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, frames, hp.mel_dim);
        ggml_set_input(in);
        ggml_tensor *out = build(ctx.get(), in);
        ggml_set_output(out);
        ggml_cgraph *gf = ggml_new_graph_custom(ctx.get(), nodes, false);
        ggml_build_forward_expand(gf, out);

        OneShotGraph graph(gf, n_threads, "speaker encoder");
        // Features arrive frame-major [frames][mel]; the graph is time-major [mel][frames].
        std::vector<float> tm(mel.size());
        for (int64_t t = 0; t < frames; ++t)
            for (int64_t m = 0; m < hp.mel_dim; ++m) tm[m * frames + t] = mel[t * hp.mel_dim + m];
        ggml_backend_tensor_set(in, tm.data(), 0, tm.size() * sizeof(float));
        graph.compute();
        if (weights.damaged())
            throw ModelError(weights.path() + " changed on disk while in use: reload the model");
        std::vector<float> result(hp.enc_dim);
        ggml_backend_tensor_get(out, result.data(), 0, result.size() * sizeof(float));
        return result;
    }
};

SpeakerEncoder::SpeakerEncoder(const std::string &path, int n_threads) {
    if (n_threads < 1 || n_threads > 512) throw InputError("threads must be in 1..512");
    impl_ = std::make_unique<Impl>(path, n_threads);
}
SpeakerEncoder::~SpeakerEncoder() = default;
const SpeakerEncoderHParams &SpeakerEncoder::hparams() const { return impl_->hp; }
int64_t SpeakerEncoder::min_samples() const { return impl_->min_samples(); }
std::vector<float> SpeakerEncoder::mel(const float *samples, int64_t n) const {
    return impl_->mel(samples, n);
}
std::vector<float> SpeakerEncoder::embed_mel(const std::vector<float> &mel, int64_t frames) const {
    return impl_->embed_mel(mel, frames);
}
std::vector<float> SpeakerEncoder::embed(const float *samples, int64_t n) const {
    const std::vector<float> m = impl_->mel(samples, n);
    return impl_->embed_mel(m, (int64_t)m.size() / impl_->hp.mel_dim);
}

}  // namespace kazeia
