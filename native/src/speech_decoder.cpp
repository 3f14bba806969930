#include "kazeia/speech_decoder.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>

#include "cpu_backend.h"
#include "decoder_arch.h"
#include "core_share_marks.h"
#include "devices_internal.h"
#include "ggml_raii.h"
#include "gguf_weights.h"
#include "kazeia/devices.h"
#include "kazeia/error.h"
#include "ops.h"
#include "speech_decoder_model.h"

namespace kazeia {

namespace {

constexpr int GRAPH_SIZE = 4096;

struct PushGraph;
}  // namespace

// Per-stream state: the left context of every causal layer, kept in one backend buffer, plus
// the stream's own backend, threads, compute allocator and graphs.
struct DecoderStream::State {
    const SpeechDecoder::Model &m;
    std::mutex mutex;
    WorkerPool pool;  // runs the heavy custom ops; the ggml graph itself runs on one thread
    BackendPtr backend;
    GallocrPtr allocr;
    GgmlContextPtr state_ctx;
    BufferPtr state_buf;
    std::vector<uint8_t> graph_mem;  // the graph of a push on the CPU (one at a time)
    // On a GPU, the graph of a push of v real frames (v = 1 .. DECODER_GPU_CHUNK_FRAMES; the
    // shape is always the same, see push_chunk), built at its first use and kept, each in its
    // own memory.
    std::vector<std::unique_ptr<PushGraph>> gpu_graphs;
    std::unique_ptr<PushGraph> cpu_graph;  // the last push's on the CPU (in graph_mem)
    int64_t n_past = 0;

    ggml_tensor *pre_conv;
    std::vector<ggml_tensor *> k_cache, v_cache;
    std::vector<ggml_tensor *> up_dw;
    ggml_tensor *conv_in;
    std::vector<ggml_tensor *> blk_up;
    std::vector<std::array<ggml_tensor *, 3>> res_conv1;
    ggml_tensor *conv_out;

    explicit State(const SpeechDecoder::Model &model);  // (after PushGraph's definition)

    void create_state() {
        const DecoderHParams &hp = m.hp;
        const size_t n_tensors = 4 + 2 * hp.num_layers + hp.upsampling_ratios.size() +
                                 4 * hp.upsample_rates.size();
        ggml_init_params params = {ggml_tensor_overhead() * n_tensors, nullptr, true};
        state_ctx.reset(ggml_init(params));
        ggml_context *ctx = state_ctx.get();
        auto make = [&](int64_t channels, int64_t columns) {
            return ggml_new_tensor_2d(ctx, GGML_TYPE_F32, channels, columns);
        };
        pre_conv = make(hp.codebook_dim, m.pre_conv.k - 1);
        const int64_t kv_dim = (int64_t)hp.num_kv_heads * hp.head_dim;
        for (uint32_t il = 0; il < hp.num_layers; ++il) {
            k_cache.push_back(make(kv_dim, hp.sliding_window - 1));
            v_cache.push_back(make(kv_dim, hp.sliding_window - 1));
        }
        for (size_t i = 0; i < hp.upsampling_ratios.size(); ++i)
            up_dw.push_back(make(hp.latent_dim, DWCONV_KERNEL - 1));
        conv_in = make(hp.latent_dim, m.conv_in.k - 1);
        for (const VocoderBlock &b : m.blocks) {
            blk_up.push_back(make(b.up.in, 1));
            std::array<ggml_tensor *, 3> res{};
            for (int u = 0; u < 3; ++u)
                res[u] = make(b.res[u].conv1.in, (b.res[u].conv1.k - 1) * b.res[u].dilation);
            res_conv1.push_back(res);
        }
        conv_out = make(m.conv_out.in, m.conv_out.k - 1);
        state_buf.reset(ggml_backend_alloc_ctx_tensors(ctx, backend.get()));
        if (!state_buf) throw std::runtime_error("out of memory allocating the decoder stream state");
        reset();
    }

    void reset() {
        ggml_backend_buffer_clear(state_buf.get(), 0);
        n_past = 0;
    }

    // Every state tensor, in the context's order (the layout of save()).
    std::vector<ggml_tensor *> state_tensors() const {
        std::vector<ggml_tensor *> out;
        for (ggml_tensor *t = ggml_get_first_tensor(state_ctx.get()); t;
             t = ggml_get_next_tensor(state_ctx.get(), t))
            out.push_back(t);
        return out;
    }

    size_t state_bytes() const {
        size_t n = 0;
        for (ggml_tensor *t : state_tensors()) n += ggml_nbytes(t);
        return n;
    }
};

namespace {

// Builds the graph of one push. Activations are [channels, time] (channel fastest), so a
// shift in time is a plain offset and a conv's im2col is a view of the padded input.
class GraphBuilder {
  public:
    GraphBuilder(DecoderStream::State &s, ggml_context *ctx, ggml_cgraph *gf)
        : s_(s), m_(s.m), gpu_(!is_cpu(s.m.device)), ctx_(ctx), gf_(gf) {}

    // I32 [n] each: the codes of one quantizer (a tensor each, not views of one: a GPU backend
    // may take an index vector only at the start of its own allocation).
    std::vector<ggml_tensor *> codes;
    ggml_tensor *positions = nullptr;  // I32 [n]
    // F32: on the CPU [window - 1 + n, n], each query's row over all keys; on a GPU
    // [window, heads per kv head, 1, n], each query's row over its own window (see
    // window_attention_in_ggml_ops).
    ggml_tensor *kq_mask = nullptr;

    // The graph of n frames of which the first `valid` are pushed (the rest pad the push to a
    // fixed shape, see push_chunk): only the valid frames' tails are kept as the next state.
    ggml_tensor *build(int64_t n, int64_t valid) {
        const DecoderHParams &hp = m_.hp;
        n_ = n;
        valid_ = valid;
        for (uint32_t q = 0; q < hp.num_quantizers; ++q) {
            codes.push_back(ggml_new_tensor_1d(ctx_, GGML_TYPE_I32, n));
            ggml_set_input(codes.back());
        }
        positions = ggml_new_tensor_1d(ctx_, GGML_TYPE_I32, n);
        ggml_set_input(positions);
        kq_mask = gpu_ ? ggml_new_tensor_4d(ctx_, GGML_TYPE_F32, hp.sliding_window,
                                            hp.num_heads / hp.num_kv_heads, 1, n)
                       : ggml_new_tensor_2d(ctx_, GGML_TYPE_F32, hp.sliding_window - 1 + n, n);
        ggml_set_input(kq_mask);

        ggml_tensor *x = quantizer();
        x = causal_conv(x, s_.pre_conv, m_.pre_conv, 1);
        x = transformer(x, n);
        for (size_t i = 0; i < m_.upsample.size(); ++i) x = upsample(x, m_.upsample[i], s_.up_dw[i]);
        x = causal_conv(x, s_.conv_in, m_.conv_in, 1);
        for (size_t b = 0; b < m_.blocks.size(); ++b) x = vocoder_block(x, m_.blocks[b], b);
        x = snake(x, m_.snake_out);
        x = causal_conv(x, s_.conv_out, m_.conv_out, 1);
        x = ggml_clamp(ctx_, x, -1.0f, 1.0f);
        ggml_set_output(x);
        ggml_build_forward_expand(gf_, x);
        return x;
    }

  private:
    ggml_tensor *quantizer() {
        const DecoderHParams &hp = m_.hp;
        ggml_tensor *semantic = nullptr, *acoustic = nullptr;
        for (uint32_t q = 0; q < hp.num_quantizers; ++q) {
            ggml_tensor *e = ggml_get_rows(ctx_, m_.codebooks[q], codes[q]);  // [vdim, n]
            ggml_tensor *&sum = q < hp.num_semantic_quantizers ? semantic : acoustic;
            sum = sum ? ggml_add(ctx_, sum, e) : e;
        }
        return ggml_add(ctx_, causal_conv(semantic, nullptr, m_.rvq_first_out, 1),
                        causal_conv(acoustic, nullptr, m_.rvq_rest_out, 1));
    }

    // [in, L] -> [out, L]. `state` holds the last (k-1)*dilation input columns of the stream;
    // it is read as left padding and overwritten with the new tail.
    ggml_tensor *causal_conv(ggml_tensor *x, ggml_tensor *state, const Conv &c, int dilation,
                             ggml_tensor *residual = nullptr) {
        const int64_t len = x->ne[1];
        ggml_tensor *full = x;
        if (state) full = with_history(x, state);
        // Winograd's tiles lie within frames: a push holds n_ whole frames of len / n_ columns
        // (the model chose the form for this period: see add_f32_weights).
        if (c.winograd) {
            params_.push_back(ConvGemmParams{c.k, dilation, &s_.pool, len / n_});
            return conv_winograd(ctx_, full, c.winograd, c.b, residual, &params_.back());
        }
        if (c.packed) {
            params_.push_back(ConvGemmParams{c.k, dilation, &s_.pool});
            return conv_gemm(ctx_, full, c.w, c.b, residual, &params_.back());
        }
        ggml_tensor *cols;
        if (c.k == 1) {
            cols = full;
        } else if (dilation == 1) {
            cols = strided_view(ctx_, full, {c.k * c.in, len, 1, 1},
                                {sizeof(float), full->nb[1], full->nb[1] * len, full->nb[1] * len});
            // ggml's Vulkan backend copies a strided operand to f16 before its product: made
            // dense (in f32) here instead.
            if (gpu_) cols = ggml_cont(ctx_, cols);
        } else {
            ggml_tensor *taps = strided_view(ctx_, full, {c.in, c.k, len, 1},
                                             {sizeof(float), dilation * full->nb[1], full->nb[1], full->nb[1] * len});
            cols = ggml_reshape_2d(ctx_, ggml_cont(ctx_, taps), c.k * c.in, len);
        }
        ggml_tensor *y = mul_mat_f32(ctx_, c.w, cols);
        if (c.b) y = ggml_add(ctx_, y, c.b);
        return residual ? ggml_add(ctx_, y, residual) : y;
    }

    // Our CPU ops, or ggml's own for a GPU (which computes every op of the graph).
    ggml_tensor *snake(ggml_tensor *x, const Snake &sn) {
        return gpu_ ? snake_beta_in_ggml_ops(ctx_, x, sn.alpha, sn.inv_beta)
                    : snake_beta(ctx_, x, sn.alpha, sn.inv_beta, &s_.pool);
    }

    // concat(state, x) along time, and the graph copies the last columns of its valid part
    // back into state (x's columns are n_ frames at this layer's rate, the first valid_ real).
    ggml_tensor *with_history(ggml_tensor *x, ggml_tensor *state) {
        ggml_tensor *full = gpu_ ? ggml_concat(ctx_, state, x, 1) : concat_time(ctx_, state, x);
        const int64_t keep = state->ne[1], valid = x->ne[1] / n_ * valid_;
        ggml_tensor *tail =
            ggml_view_2d(ctx_, full, full->ne[0], keep, full->nb[1], valid * full->nb[1]);
        ggml_build_forward_expand(gf_, ggml_cpy(ctx_, tail, state));
        return full;
    }

    // Transposed conv with kernel m*r and stride r, right-trimmed: a conv of m taps producing
    // r*out channels per input column, which is exactly the [out, r*L] output in memory.
    ggml_tensor *trans_conv(ggml_tensor *x, ggml_tensor *state, const Conv &c, int64_t r) {
        ggml_tensor *y = causal_conv(x, state, Conv{c.w, nullptr, c.k, c.in, c.out * r, c.packed}, 1);
        y = ggml_reshape_2d(ctx_, y, c.out, r * x->ne[1]);
        return ggml_add(ctx_, y, c.b);
    }

    ggml_tensor *rms_norm(ggml_tensor *x, ggml_tensor *w) {
        return ggml_mul(ctx_, ggml_rms_norm(ctx_, x, m_.hp.rms_norm_eps), w);
    }

    ggml_tensor *transformer(ggml_tensor *x, int64_t n) {
        const DecoderHParams &hp = m_.hp;
        const int64_t hd = hp.head_dim, nh = hp.num_heads, nkv = hp.num_kv_heads;
        const float scale = 1.0f / std::sqrt((float)hd);
        auto linear = [&](ggml_tensor *t, const Conv &c) { return causal_conv(t, nullptr, c, 1); };
        ggml_tensor *h = linear(x, m_.in_proj);
        for (size_t il = 0; il < m_.layers.size(); ++il) {
            const TfmLayer &L = m_.layers[il];
            ggml_tensor *a = rms_norm(h, L.attn_norm);
            auto rope = [&](ggml_tensor *t, int64_t heads) {
                t = ggml_reshape_3d(ctx_, t, hd, heads, n);
                return ggml_rope_ext(ctx_, t, positions, nullptr, (int)hd, GGML_ROPE_TYPE_NEOX, 0,
                                     hp.rope_theta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
            };
            ggml_tensor *q = rope(linear(a, L.q), nh);
            ggml_tensor *k = rope(linear(a, L.k), nkv);
            ggml_tensor *v = linear(a, L.v);
            ggml_tensor *k_all = with_history(ggml_reshape_2d(ctx_, k, hd * nkv, n), s_.k_cache[il]);
            ggml_tensor *v_all = with_history(v, s_.v_cache[il]);

            ggml_tensor *o;
            if (gpu_) {
                o = window_attention_in_ggml_ops(ctx_, q, k_all, v_all, kq_mask, nkv, scale);
            } else {
                attention_.push_back(AttentionParams{nkv, scale, &s_.pool});
                o = window_attention(ctx_, q, kv_heads(ctx_, k_all, hd), kv_heads(ctx_, v_all, hd),
                                     kq_mask, &attention_.back());
            }
            o = linear(o, L.o);
            h = ggml_add(ctx_, h, ggml_mul(ctx_, o, L.attn_scale));

            ggml_tensor *f = rms_norm(h, L.ffn_norm);
            f = ggml_mul(ctx_, ggml_silu(ctx_, linear(f, L.gate)), linear(f, L.up));
            f = linear(f, L.down);
            h = ggml_add(ctx_, h, ggml_mul(ctx_, f, L.ffn_scale));
        }
        h = rms_norm(h, m_.tfm_norm);
        return linear(h, m_.out_proj);
    }

    // Transposed conv then a ConvNeXt block (causal depthwise conv, LayerNorm, MLP, gamma).
    ggml_tensor *upsample(ggml_tensor *x, const Upsample &u, ggml_tensor *dw_state) {
        x = trans_conv(x, nullptr, u.trans, u.r);
        const int64_t len = x->ne[1], ch = x->ne[0];
        ggml_tensor *full = with_history(x, dw_state);
        ggml_tensor *y = nullptr;
        for (int j = 0; j < DWCONV_KERNEL; ++j) {
            ggml_tensor *tap = ggml_view_2d(ctx_, full, ch, len, full->nb[1], j * full->nb[1]);
            ggml_tensor *w = ggml_view_1d(ctx_, u.dw_w, ch, j * u.dw_w->nb[1]);
            ggml_tensor *p = ggml_mul(ctx_, tap, w);
            y = y ? ggml_add(ctx_, y, p) : p;
        }
        y = ggml_add(ctx_, y, u.dw_b);
        y = ggml_add(ctx_, ggml_mul(ctx_, ggml_norm(ctx_, y, m_.hp.layer_norm_eps), u.norm_w),
                     u.norm_b);
        y = ggml_gelu_erf(ctx_, causal_conv(y, nullptr, u.pw1, 1));
        y = causal_conv(y, nullptr, u.pw2, 1);
        return ggml_add(ctx_, x, ggml_mul(ctx_, y, u.gamma));
    }

    ggml_tensor *vocoder_block(ggml_tensor *x, const VocoderBlock &b, size_t ib) {
        x = snake(x, b.snake);
        x = trans_conv(x, s_.blk_up[ib], b.up, b.r);
        for (int u = 0; u < 3; ++u) {
            const ResUnit &ru = b.res[u];
            ggml_tensor *y = snake(x, ru.snake1);
            y = causal_conv(y, s_.res_conv1[ib][u], ru.conv1, ru.dilation);
            y = snake(y, ru.snake2);
            x = causal_conv(y, nullptr, ru.conv2, 1, x);
        }
        return x;
    }

    DecoderStream::State &s_;
    const SpeechDecoder::Model &m_;
    const bool gpu_;
    int64_t n_ = 0, valid_ = 0;
    std::deque<ConvGemmParams> params_;  // referenced by the graph's conv nodes
    std::deque<AttentionParams> attention_;  // and by its attention nodes
    ggml_context *ctx_;
    ggml_cgraph *gf_;
};

void check_codes(const DecoderHParams &hp, const int32_t *codes, int64_t n_frames) {
    if (n_frames < 1) throw InputError("codes must hold at least one frame");
    if (!codes) throw InputError("codes is null");
    const int64_t n = n_frames * hp.num_quantizers;
    for (int64_t i = 0; i < n; ++i) {
        if (codes[i] < 0 || codes[i] >= (int32_t)hp.codebook_size)
            throw InputError("code " + std::to_string(codes[i]) + " at frame " +
                             std::to_string(i / hp.num_quantizers) + ", codebook " +
                             std::to_string(i % hp.num_quantizers) + " is outside 0.." +
                             std::to_string(hp.codebook_size - 1));
    }
}

// The graph of a push of n frames, the first `valid` real: in its own memory when it is kept
// (`own_memory`), else in the stream's graph memory (one at a time).
struct PushGraph {
    std::vector<uint8_t> own_mem;
    GgmlContextPtr ctx;
    ggml_cgraph *gf;
    GraphBuilder builder;
    ggml_tensor *wav;

    PushGraph(DecoderStream::State &s, int64_t n, int64_t valid, bool own_memory = false)
        : own_mem(own_memory ? s.graph_mem.size() : 0),
          ctx(ggml_init({s.graph_mem.size(), own_memory ? own_mem.data() : s.graph_mem.data(), true})),
          gf(ggml_new_graph_custom(ctx.get(), GRAPH_SIZE, false)),
          builder(s, ctx.get(), gf),
          wav(builder.build(n, valid)) {}
};

// The frames one graph evaluates: at most DECODER_MAX_CHUNK_FRAMES on the CPU, exactly
// DECODER_GPU_CHUNK_FRAMES on a GPU.
int64_t chunk_frames(const SpeechDecoder::Model &m) {
    return is_cpu(m.device) ? DECODER_MAX_CHUNK_FRAMES : DECODER_GPU_CHUNK_FRAMES;
}

// Evaluates one chunk of at most chunk_frames() frames, appending to `out`.
//
// On a GPU every chunk is computed as DECODER_GPU_CHUNK_FRAMES frames, the pushed ones then
// padding (code 0, dropped from the output and the state): its backend picks kernels (matrix-
// vector or tiled, split-k) and so summation orders by an operand's shape, so a frame would
// come out otherwise in a push of 1 than in one of 4. With one shape every frame is computed
// alike (each output column of a product depends only on its own column; the attention reads
// each query's own window), and a streamed decode is bit-equal to the one-pass decode. On the
// CPU our kernels compute each column alike at any width: no padding.
void push_chunk(DecoderStream::State &s, const int32_t *codes, int64_t valid,
                std::vector<float> &out) {
    const DecoderHParams &hp = s.m.hp;
    const bool gpu = !is_cpu(s.m.device);
    const int64_t n = gpu ? DECODER_GPU_CHUNK_FRAMES : valid;
    // On a GPU the stream's kept graph for this many real frames; on the CPU a new one.
    std::unique_ptr<PushGraph> &kept = gpu ? s.gpu_graphs[valid] : s.cpu_graph;
    if (!gpu || !kept) {
        kept.reset();  // first: the CPU's shares the stream's graph memory with its successor
        kept = std::make_unique<PushGraph>(s, n, valid, gpu);
    }
    PushGraph &graph = *kept;
    GraphBuilder &builder = graph.builder;
    if (!ggml_gallocr_alloc_graph(s.allocr.get(), graph.gf))
        throw std::runtime_error("out of memory allocating the decoder graph");

    const int64_t nq = hp.num_quantizers;
    std::vector<int32_t> by_quantizer(n * nq, 0);
    for (int64_t t = 0; t < valid; ++t)
        for (int64_t q = 0; q < nq; ++q) by_quantizer[q * n + t] = codes[t * nq + q];
    for (int64_t q = 0; q < nq; ++q)
        ggml_backend_tensor_set(builder.codes[q], by_quantizer.data() + q * n, 0, n * 4);

    std::vector<int32_t> pos(n);
    for (int64_t i = 0; i < n; ++i) pos[i] = (int32_t)(s.n_past + i);
    ggml_backend_tensor_set(builder.positions, pos.data(), 0, pos.size() * 4);

    // Query i is frame n_past + i and sees the `window` frames ending at itself that exist.
    const int64_t hist = hp.sliding_window - 1;
    std::vector<float> mask(ggml_nelements(builder.kq_mask));
    if (gpu) {
        // Place w of a query's own window holds frame n_past + i - hist + w.
        const int64_t window = hist + 1, rows = hp.num_heads / hp.num_kv_heads;
        for (int64_t i = 0; i < n; ++i)
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t w = 0; w < window; ++w)
                    mask[(i * rows + r) * window + w] = w >= hist - (s.n_past + i) ? 0.0f : -INFINITY;
    } else {
        // Key column c holds frame n_past - hist + c.
        const int64_t n_kv = hist + n;
        for (int64_t i = 0; i < n; ++i)
            for (int64_t c = 0; c < n_kv; ++c) {
                const bool visible = c >= i && c <= hist + i && c >= hist - s.n_past;
                mask[i * n_kv + c] = visible ? 0.0f : -INFINITY;
            }
    }
    ggml_backend_tensor_set(builder.kq_mask, mask.data(), 0, mask.size() * 4);

    if (ggml_backend_graph_compute(s.backend.get(), graph.gf) != GGML_STATUS_SUCCESS)
        throw std::runtime_error("decoder graph computation failed");
    const size_t old = out.size(), samples = valid * hp.hop_length;
    out.resize(old + samples);
    ggml_backend_tensor_get(graph.wav, out.data() + old, 0, samples * sizeof(float));
    s.n_past += valid;
}

}  // namespace

DecoderStream::State::State(const SpeechDecoder::Model &model)
    : m(model), pool(model.n_threads, model.polite,
                     is_cpu(model.device) ? model.core_share.get() : nullptr, PoolStage::Decoder) {
    backend.reset(is_cpu(model.device) ? new_cpu_backend() : new_gpu_backend(model.device));
    allocr.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend.get())));
    graph_mem.resize(ggml_tensor_overhead() * GRAPH_SIZE * 2 +
                     ggml_graph_overhead_custom(GRAPH_SIZE, false));
    if (!is_cpu(model.device)) gpu_graphs.resize(DECODER_GPU_CHUNK_FRAMES + 1);
    create_state();
}

SpeechDecoder::SpeechDecoder(const std::string &path, int n_threads, bool polite,
                             const std::string &device, DecoderPrecision precision,
                             std::shared_ptr<CoreShare> core_share) {
    if (n_threads < 1 || n_threads > 512) throw InputError("threads must be in 1..512");
    model_ = std::make_unique<Model>(path, n_threads, resolve_placement(device), precision);
    model_->polite = polite;
    model_->core_share = std::move(core_share);
}

DecoderPrecision SpeechDecoder::precision() const { return model_->precision; }

DecoderPrecision decoder_precision(const std::string &name) {
    for (DecoderPrecision p : {DecoderPrecision::F32, DecoderPrecision::BF16})
        if (name == DECODER_PRECISIONS[(int)p]) return p;
    throw InputError("unknown decoder precision '" + name + "' (f32|bf16)");
}

bool SpeechDecoder::polite() const { return model_->polite; }
const std::string &SpeechDecoder::device() const { return model_->device; }
const std::shared_ptr<CoreShare> &SpeechDecoder::core_share() const { return model_->core_share; }

SpeechDecoder::~SpeechDecoder() = default;

const DecoderHParams &SpeechDecoder::hparams() const { return model_->hp; }
int SpeechDecoder::n_threads() const { return model_->n_threads; }

std::unique_ptr<DecoderStream> SpeechDecoder::stream() const {
    return std::unique_ptr<DecoderStream>(new DecoderStream(*model_));
}

std::vector<float> SpeechDecoder::decode(const int32_t *codes, int64_t n_frames) const {
    return stream()->push(codes, n_frames);
}

DecoderStream::DecoderStream(const SpeechDecoder::Model &model)
    : state_(std::make_unique<State>(model)) {
    // On a GPU every push has one graph shape (see push_chunk): its memory is reserved here,
    // once, so no push frees a device buffer that the backend's descriptor sets still name
    // (legal in Vulkan, but Debian 12's lavapipe, Mesa 22, then reads the freed buffer: heap
    // corruption with pushes of 1 then 4 frames, found with valgrind) and no push pays for an
    // allocation. On the CPU the memory grows with the pushes as they come.
    if (!is_cpu(model.device)) {
        const int64_t full = DECODER_GPU_CHUNK_FRAMES;
        State &s = *state_;
        s.gpu_graphs[full] = std::make_unique<PushGraph>(s, full, full, true);
        if (!ggml_gallocr_reserve(s.allocr.get(), s.gpu_graphs[full]->gf))
            throw std::runtime_error("out of memory allocating the decoder graph");
    }
}

DecoderStream::~DecoderStream() = default;

std::vector<float> DecoderStream::push(const int32_t *codes, int64_t n_frames) {
    const DecoderHParams &hp = state_->m.hp;
    check_codes(hp, codes, n_frames);
    std::lock_guard<std::mutex> lock(state_->mutex);
    const SpeechDecoder::Model &m = state_->m;
    const DecoderPush computing(is_cpu(m.device) ? m.core_share.get() : nullptr, m.n_threads);
    std::vector<float> out;
    out.reserve(n_frames * hp.hop_length);
    const int64_t chunk = chunk_frames(m);
    for (int64_t done = 0; done < n_frames; done += chunk) {
        const int64_t n = std::min(chunk, n_frames - done);
        push_chunk(*state_, codes + done * hp.num_quantizers, n, out);
    }
    return out;
}

void DecoderStream::reset() {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->reset();
}

// The position, then every state tensor's bytes in the context's order; through the backend,
// as the state may live in a GPU's memory.
std::vector<uint8_t> DecoderStream::save() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    std::vector<uint8_t> out(sizeof(int64_t) + state_->state_bytes());
    std::memcpy(out.data(), &state_->n_past, sizeof(int64_t));
    size_t at = sizeof(int64_t);
    for (ggml_tensor *t : state_->state_tensors()) {
        ggml_backend_tensor_get(t, out.data() + at, 0, ggml_nbytes(t));
        at += ggml_nbytes(t);
    }
    return out;
}

void DecoderStream::restore(const std::vector<uint8_t> &saved) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    const size_t size = state_->state_bytes();
    int64_t n_past = -1;
    if (saved.size() == sizeof(int64_t) + size) std::memcpy(&n_past, saved.data(), sizeof(int64_t));
    if (n_past < 0)
        throw InputError("not a saved state of a stream of this decoder (" +
                         std::to_string(saved.size()) + " bytes, expected " +
                         std::to_string(sizeof(int64_t) + size) + ")");
    size_t at = sizeof(int64_t);
    for (ggml_tensor *t : state_->state_tensors()) {
        ggml_backend_tensor_set(t, saved.data() + at, 0, ggml_nbytes(t));
        at += ggml_nbytes(t);
    }
    state_->n_past = n_past;
}

int64_t DecoderStream::frames_pushed() const { return state_->n_past; }

const DecoderHParams &DecoderStream::hparams() const { return state_->m.hp; }

DecoderHParams read_decoder_hparams(const std::string &path) {
    return read_checked_decoder_hparams(GgufWeights(path, decoder_part(), GgufWeights::Mapped{}));
}

}  // namespace kazeia
