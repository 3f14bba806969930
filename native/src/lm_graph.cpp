#include "lm_graph.h"

#include "gguf_weights.h"
#include "kazeia/error.h"
#include "ops.h"
#include "q8_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace kazeia {

namespace {
constexpr int GRAPH_SIZE = 2048;

void row_to_float(const ggml_tensor *table, int64_t id, float *out) {
    const char *src = static_cast<const char *>(table->data) + id * table->nb[1];
    if (table->type == GGML_TYPE_F32) {
        std::copy_n(reinterpret_cast<const float *>(src), table->ne[0], out);
    } else {
        ggml_get_type_traits(table->type)->to_float(src, out, table->ne[0]);
    }
}

#if defined(__linux__)
// Advice only: where it is refused, the memory works the same.
void advise_pages(ggml_backend_buffer_t buffer, int advice) {
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const auto base = reinterpret_cast<uintptr_t>(ggml_backend_buffer_get_base(buffer));
    const uintptr_t begin = (base + page - 1) & ~(page - 1);
    const uintptr_t end = (base + ggml_backend_buffer_get_size(buffer)) & ~(page - 1);
    if (end > begin) madvise(reinterpret_cast<void *>(begin), end - begin, advice);
}
#endif

// A head-major cache touches each head's strip of a layer from its start, so transparent huge
// pages (where the system makes them the default) would make nearly all of it resident at the
// first step: a cache in host memory keeps small pages, and its pages are touched as it fills.
void keep_small_pages([[maybe_unused]] ggml_backend_buffer_t buffer) {
#if defined(__linux__) && defined(MADV_NOHUGEPAGE)
    advise_pages(buffer, MADV_NOHUGEPAGE);
#endif
}

// Weights that every step reads in full: huge pages where the system grants them on request
// (fewer address translations on every pass over them).
void prefer_huge_pages([[maybe_unused]] ggml_backend_buffer_t buffer) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    advise_pages(buffer, MADV_HUGEPAGE);
#endif
}

// A product with a weight matrix: our kernel in the pool on the CPU, ggml's own (in f32) on a GPU.
ggml_tensor *weight_product(ggml_context *ctx, ggml_tensor *w, ggml_tensor *x, WorkerPool *pool) {
    return pool ? pool_mul_mat(ctx, w, x, pool) : mul_mat_f32(ctx, w, x);
}
}  // namespace

void embedding_rows(const ggml_tensor *table, const std::vector<int32_t> &ids, std::vector<float> &out) {
    const size_t base = out.size();
    out.resize(base + ids.size() * table->ne[0]);
    for (size_t i = 0; i < ids.size(); ++i) row_to_float(table, ids[i], out.data() + base + i * table->ne[0]);
}

void add_embedding_row(const ggml_tensor *table, int64_t id, float *out) {
    std::vector<float> row(table->ne[0]);
    row_to_float(table, id, row.data());
    for (int64_t i = 0; i < table->ne[0]; ++i) out[i] += row[i];
}

std::vector<ggml_tensor *> stack_tensors(const LmStack &stack) {
    std::vector<ggml_tensor *> out{stack.norm};
    for (const LmLayer &L : stack.layers)
        for (ggml_tensor *LmLayer::*t : LM_LAYER_TENSORS) out.push_back(L.*t);
    return out;
}

std::vector<ggml_tensor *> stack_matrices(const LmStack &stack) {
    std::vector<ggml_tensor *> out;
    for (const LmLayer &L : stack.layers)
        for (ggml_tensor *LmLayer::*t : LM_LAYER_MATRICES) out.push_back(L.*t);
    return out;
}

DeviceCopies::DeviceCopies(const std::vector<ggml_tensor *> &tensors, ggml_backend_buffer_type_t buft,
                           const char *what, GgufWeights *source,
                           const std::vector<ggml_tensor *> &as_panels) {
    // Room for a copy of each tensor and for the joined matrices (at most one per two copies).
    ggml_init_params params = {ggml_tensor_overhead() * (2 * tensors.size() + 1), nullptr, true};
    ctx_.reset(ggml_init(params));
    // In the order given (the stacks' own), not the map's: the layout and the order in which
    // the file's pages go back are the same at every load.
    std::vector<std::pair<ggml_tensor *, ggml_tensor *>> order;
    for (ggml_tensor *t : tensors) {
        if (!t || copies_.count(t)) continue;
        ggml_tensor *copy = ggml_dup_tensor(ctx_.get(), t);
        ggml_set_name(copy, t->name);
        copies_[t] = copy;
        order.emplace_back(t, copy);
    }
    const bool cpu = buft == ggml_backend_cpu_buffer_type();
    buffer_.reset(ggml_backend_alloc_ctx_tensors_from_buft(ctx_.get(), buft));
    if (!buffer_)
        throw ModelError(std::string(cpu ? "out of memory" : "out of device memory") + " for the " + what +
                         " weights");
    ggml_backend_buffer_set_usage(buffer_.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    // Before the first write, which is when the pages are chosen.
    if (cpu) prefer_huge_pages(buffer_.get());
    for (const auto &[host, copy] : order) {
        const bool panels = cpu && fits_q8_panels(copy) &&
                            std::find(as_panels.begin(), as_panels.end(), host) != as_panels.end();
        if (panels)
            store_q8_panels(copy, host->data);
        else
            ggml_backend_tensor_set(copy, host->data, 0, ggml_nbytes(host));
        if (source) source->discard(host);
    }
}

ggml_tensor *DeviceCopies::operator[](const ggml_tensor *host) const {
    if (!host) return nullptr;
    auto it = copies_.find(host);
    if (it == copies_.end()) throw std::logic_error(std::string("no device copy of ") + host->name);
    return it->second;
}

LmStack DeviceCopies::stack(const LmStack &host) const {
    LmStack s;
    s.hp = host.hp;
    s.norm = (*this)[host.norm];
    for (const LmLayer &L : host.layers) {
        LmLayer copy;
        for (ggml_tensor *LmLayer::*t : LM_LAYER_TENSORS) copy.*t = (*this)[L.*t];
        s.layers.push_back(copy);
    }
    return s;
}

ggml_tensor *DeviceCopies::joined(std::initializer_list<ggml_tensor *> copies, const char *part) {
    GGML_ASSERT(copies.size() > 0);
    ggml_tensor *first = *copies.begin();
    const char *next = static_cast<const char *>(first->data);
    int64_t rows = 0;
    for (const ggml_tensor *t : copies) {
        if (t->buffer != buffer_.get() || t->data != next || t->type != first->type ||
            t->ne[0] != first->ne[0] || !ggml_is_contiguous(t) || ggml_nrows(t) != t->ne[1] ||
            t->ne[1] % Q8_GEMM_ROWS != 0 || t->extra != first->extra)
            return nullptr;
        rows += t->ne[1];
        next += ggml_nbytes(t);
    }
    ggml_tensor *matrix = ggml_new_tensor_2d(ctx_.get(), first->type, first->ne[0], rows);
    // The first copy's name with its part replaced: "blk.N.attn_q.weight" -> "blk.N.attn_qkv.weight".
    std::string name = first->name;
    const size_t end = name.rfind(".weight"), start = name.rfind('.', end - 1);
    name = end == std::string::npos || start == std::string::npos
               ? part
               : name.substr(0, start + 1) + part + name.substr(end);
    ggml_set_name(matrix, name.c_str());
    // The same bytes: a second tensor over them, not a copy.
    if (ggml_backend_tensor_alloc(buffer_.get(), matrix, first->data) != GGML_STATUS_SUCCESS)
        throw std::logic_error("a joined matrix outside its copies' buffer");
    matrix->extra = first->extra;
    return matrix;
}

KvCache::KvCache(const LmHParams &hp, int64_t n_ctx_, ggml_backend_t backend, int64_t capacity_,
                 ggml_type type)
    : n_ctx(n_ctx_), capacity(std::max(n_ctx_, capacity_)) {
    if (type != GGML_TYPE_F32 && type != GGML_TYPE_F16) throw std::logic_error("a KV cache is f32 or f16");
    ggml_init_params params = {ggml_tensor_overhead() * 2 * hp.num_layers + 64, nullptr, true};
    ctx.reset(ggml_init(params));
    for (uint32_t il = 0; il < hp.num_layers; ++il) {
        for (std::vector<ggml_tensor *> *part : {&k, &v})
            part->push_back(ggml_new_tensor_3d(ctx.get(), type, hp.head_dim, capacity, hp.num_kv_heads));
    }
    buffer.reset(ggml_backend_alloc_ctx_tensors(ctx.get(), backend));
    if (!buffer) throw std::runtime_error("out of memory allocating a KV cache");
    if (ggml_backend_buffer_is_host(buffer.get())) {
        keep_small_pages(buffer.get());
        clear(0, n_ctx);
    } else {
        // A device's memset is one synchronous call per strip: all of it at once instead.
        ggml_backend_buffer_clear(buffer.get(), 0);
    }
}

void KvCache::extend(int64_t slots) {
    slots = std::min(slots, capacity);
    if (slots > n_ctx) clear(n_ctx, slots);
    n_ctx = std::max(n_ctx, slots);
}

// Masked slots are multiplied by zero weights: keep them finite (a device's cache was cleared
// whole when it was made).
void KvCache::clear(int64_t from, int64_t to) {
    if (!ggml_backend_buffer_is_host(buffer.get())) return;
    for (const std::vector<ggml_tensor *> *part : {&k, &v})
        for (ggml_tensor *t : *part)
            for (int64_t h = 0; h < t->ne[2]; ++h)
                ggml_backend_tensor_memset(t, 0, h * t->nb[2] + from * t->nb[1], (to - from) * t->nb[1]);
}

void KvCache::read_rows(size_t layer, int64_t rows, std::vector<float> &k_out,
                        std::vector<float> &v_out) const {
    std::vector<ggml_fp16_t> halves;
    for (auto [t, out] : {std::pair{k[layer], &k_out}, std::pair{v[layer], &v_out}}) {
        const size_t head = rows * t->nb[1], values = rows * t->ne[0] * t->ne[2];
        out->resize(values);
        if (t->type == GGML_TYPE_F32) {
            ggml_backend_tensor_get_2d(t, out->data(), 0, head, t->ne[2], t->nb[2], head);
            continue;
        }
        halves.resize(values);
        ggml_backend_tensor_get_2d(t, halves.data(), 0, head, t->ne[2], t->nb[2], head);
        ggml_fp16_to_fp32_row(halves.data(), out->data(), values);
    }
}

void KvCache::write_rows(size_t layer, int64_t rows, const std::vector<float> &k_in,
                         const std::vector<float> &v_in) {
    const size_t values = rows * k[layer]->ne[0] * k[layer]->ne[2];
    if (k_in.size() != values || v_in.size() != values) throw std::logic_error("KV rows of another shape");
    std::vector<ggml_fp16_t> halves;
    for (auto [t, in] : {std::pair{k[layer], &k_in}, std::pair{v[layer], &v_in}}) {
        const size_t head = rows * t->nb[1];
        const void *data = in->data();
        if (t->type == GGML_TYPE_F16) {
            halves.resize(values);
            ggml_fp32_to_fp16_row(in->data(), halves.data(), values);
            data = halves.data();
        }
        ggml_backend_tensor_set_2d(t, data, 0, head, t->ne[2], t->nb[2], head);
    }
}

ggml_tensor *stack_input(ggml_context *ctx, ggml_tensor *x, ggml_tensor *in_proj_w,
                         ggml_tensor *in_proj_b, WorkerPool *pool) {
    return in_proj_w ? ggml_add(ctx, weight_product(ctx, in_proj_w, x, pool), in_proj_b) : x;
}

ggml_tensor *stack_forward(ggml_context *ctx, const LmStack &stack, ggml_tensor *x,
                          const StackPass &pass, std::vector<ggml_tensor *> &k_cache,
                          std::vector<ggml_tensor *> &v_cache, const AttentionParams *attention,
                          WorkerPool *pool) {
    const LmHParams &hp = stack.hp;
    const int64_t n = x->ne[1], hd = hp.head_dim, nh = hp.num_heads, nkv = hp.num_kv_heads;
    auto mm = [&](ggml_tensor *w, ggml_tensor *t) { return weight_product(ctx, w, t, pool); };
    auto norm = [&](ggml_tensor *t, ggml_tensor *w) {
        return ggml_mul(ctx, ggml_rms_norm(ctx, t, hp.rms_norm_eps), w);
    };
    for (size_t il = 0; il < stack.layers.size(); ++il) {
        const LmLayer &L = stack.layers[il];
        ggml_tensor *a = norm(x, L.attn_norm);
        // q, k, v as [hd, heads, n]: views of one product where the three are joined.
        ggml_tensor *q, *k, *v;
        if (pool && L.qkv) {
            GGML_ASSERT(L.qkv->ne[1] == (nh + 2 * nkv) * hd);
            ggml_tensor *qkv = mm(L.qkv, a);
            auto heads_at = [&](int64_t first, int64_t count) {
                return ggml_view_3d(ctx, qkv, hd, count, n, hd * qkv->nb[0], qkv->nb[1],
                                    first * hd * qkv->nb[0]);
            };
            q = heads_at(0, nh), k = heads_at(nh, nkv), v = heads_at(nh + nkv, nkv);
        } else {
            q = ggml_reshape_3d(ctx, mm(L.q, a), hd, nh, n);
            k = ggml_reshape_3d(ctx, mm(L.k, a), hd, nkv, n);
            v = ggml_reshape_3d(ctx, mm(L.v, a), hd, nkv, n);
        }
        // Qwen3: per-head RMSNorm of q and k before RoPE (NeoX rotate-half: the config's
        // M-RoPE has three equal position rows for TTS, which is exactly this).
        auto qk = [&](ggml_tensor *t, ggml_tensor *nw) {
            return ggml_rope_ext(ctx, norm(t, nw), pass.positions, nullptr, (int)hd, GGML_ROPE_TYPE_NEOX,
                                 0, hp.rope_theta, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
        };
        q = qk(q, L.q_norm);
        k = qk(k, L.k_norm);
        // [hd, nkv, n] -> the cache's [hd, n, nkv], each row to its slot.
        auto store = [&](ggml_tensor *cache, ggml_tensor *rows) {
            return ggml_set_rows(ctx, cache, ggml_permute(ctx, rows, 0, 2, 1, 3), pass.slots);
        };
        k_cache[il] = store(k_cache[il], k);
        v_cache[il] = store(v_cache[il], v);
        // The slots in use, and one op for the attention over them (in the pool: no copy of
        // the transposed V cache per step, which grew with the length of a synthesis).
        auto in_use = [&](ggml_tensor *all) {
            return ggml_view_3d(ctx, all, hd, pass.n_ctx, nkv, all->nb[1], all->nb[2], 0);
        };
        ggml_tensor *k_all = in_use(k_cache[il]), *v_all = in_use(v_cache[il]);
        ggml_tensor *o = pool ? window_attention(ctx, q, k_all, v_all, pass.mask, attention)
                              : attention_in_ggml_ops(ctx, q, k_all, v_all, pass.mask, nkv, attention->scale);
        x = ggml_add(ctx, x, mm(L.o, o));

        ggml_tensor *f = norm(x, L.ffn_norm);
        if (pool && L.gate_up) {
            const int64_t ffn = L.gate->ne[1];
            GGML_ASSERT(L.gate_up->ne[1] == 2 * ffn);
            ggml_tensor *gu = mm(L.gate_up, f);
            auto half = [&](int64_t first) {
                return ggml_view_2d(ctx, gu, ffn, n, gu->nb[1], first * gu->nb[0]);
            };
            f = ggml_mul(ctx, ggml_silu(ctx, half(0)), half(ffn));
        } else {
            f = ggml_mul(ctx, ggml_silu(ctx, mm(L.gate, f)), mm(L.up, f));
        }
        x = ggml_add(ctx, x, mm(L.down, f));
    }
    ggml_tensor *last = ggml_view_2d(ctx, x, x->ne[0], 1, x->nb[1], (n - 1) * x->nb[1]);
    return norm(ggml_cont(ctx, last), stack.norm);
}

ggml_tensor *head_logits(ggml_context *ctx, ggml_tensor *heads, ggml_tensor *hidden,
                         ggml_tensor *head_id, WorkerPool *pool) {
    if (pool) return pool_mul_mat(ctx, heads, hidden, pool, head_id);
    ggml_tensor *h = ggml_reshape_3d(ctx, hidden, hidden->ne[0], 1, 1);
    ggml_tensor *logits = ggml_mul_mat_id(ctx, heads, h, ggml_reshape_2d(ctx, head_id, 1, 1));
    return ggml_reshape_2d(ctx, logits, heads->ne[1], 1);
}

LmGraph::LmGraph(const LmStack &stack, KvCache &cache, int64_t n_tokens, int64_t in_dim,
                 ggml_tensor *in_proj_w, ggml_tensor *in_proj_b, ggml_tensor *head,
                 ggml_tensor *heads, ggml_backend_t backend, WorkerPool *pool)
    : backend_(backend), n_tokens_(n_tokens), n_ctx_(cache.n_ctx), in_dim_(in_dim) {
    const LmHParams &hp = stack.hp;
    mem_.resize(ggml_tensor_overhead() * GRAPH_SIZE + ggml_graph_overhead_custom(GRAPH_SIZE, false));
    ggml_init_params params = {mem_.size(), mem_.data(), true};
    ctx_.reset(ggml_init(params));
    ggml_context *ctx = ctx_.get();
    gf_ = ggml_new_graph_custom(ctx, GRAPH_SIZE, false);

    const int64_t n = n_tokens;
    embeds_ = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, in_dim, n);
    positions_ = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
    slots_ = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n);
    mask_ = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_ctx_, n);
    for (ggml_tensor *t : {embeds_, positions_, slots_, mask_}) ggml_set_input(t);

    ggml_tensor *x = stack_input(ctx, embeds_, in_proj_w, in_proj_b, pool);
    attention_ = AttentionParams{hp.num_kv_heads, 1.0f / std::sqrt((float)hp.head_dim), pool};
    std::vector<ggml_tensor *> k_cache = cache.k, v_cache = cache.v;
    out_hidden_ = stack_forward(ctx, stack, x, StackPass{positions_, slots_, mask_, n_ctx_}, k_cache,
                                v_cache, &attention_, pool);
    if (heads) {
        head_id_ = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1);
        ggml_set_input(head_id_);
        out_logits_ = head_logits(ctx, heads, out_hidden_, head_id_, pool);
    } else {
        out_logits_ = weight_product(ctx, head, out_hidden_, pool);
    }
    ggml_set_output(out_hidden_);
    ggml_set_output(out_logits_);
    ggml_build_forward_expand(gf_, out_hidden_);
    ggml_build_forward_expand(gf_, out_logits_);

    allocr_ = allocate_graph(backend, gf_, "out of memory allocating a talker graph");
    logits_.resize(ggml_nelements(out_logits_));
    hidden_.resize(ggml_nelements(out_hidden_));
    mask_data_.resize(n_ctx_ * n);
}

void LmGraph::eval(const float *embeds, int64_t pos0, int32_t head_index) {
    const int64_t n = n_tokens_;
    if (pos0 + n > n_ctx_) throw std::runtime_error("KV cache is full");
    ggml_backend_tensor_set(embeds_, embeds, 0, n * in_dim_ * sizeof(float));
    std::vector<int32_t> pos(n);
    std::vector<int64_t> slots(n);
    for (int64_t i = 0; i < n; ++i) pos[i] = (int32_t)(pos0 + i), slots[i] = pos0 + i;
    ggml_backend_tensor_set(positions_, pos.data(), 0, n * sizeof(int32_t));
    ggml_backend_tensor_set(slots_, slots.data(), 0, n * sizeof(int64_t));
    // Causal: token i sees cache slots 0 .. pos0 + i.
    for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < n_ctx_; ++c)
            mask_data_[i * n_ctx_ + c] = c <= pos0 + i ? 0.0f : -INFINITY;
    ggml_backend_tensor_set(mask_, mask_data_.data(), 0, mask_data_.size() * sizeof(float));
    if (head_id_) ggml_backend_tensor_set(head_id_, &head_index, 0, sizeof(int32_t));
    if (ggml_backend_graph_compute(backend_, gf_) != GGML_STATUS_SUCCESS)
        throw std::runtime_error("talker graph computation failed");
    ggml_backend_tensor_get(out_logits_, logits_.data(), 0, logits_.size() * sizeof(float));
    ggml_backend_tensor_get(out_hidden_, hidden_.data(), 0, hidden_.size() * sizeof(float));
}

}  // namespace kazeia
