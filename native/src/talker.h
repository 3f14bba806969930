// The talker as its own type: the loaded talker GGUF (talker, text path, code predictor),
// shared by all generation sessions, and TalkerRun, one session's talker stack over its own
// growing KV cache.
#pragma once

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "devices_internal.h"
#include "gguf_weights.h"
#include "kazeia/generator.h"
#include "talker_arch.h"
#include "lm_graph.h"

namespace kazeia {

// The official generation suppresses the top 1024 ids of the codec vocabulary (its control
// tokens: pad, bos, think, languages, speakers, ...) for code 0, eos excepted, and eos itself
// in the first EOS_AFTER_FRAMES frames.
inline constexpr int64_t CODEC_CONTROL_TOKENS = 1024;
inline constexpr int64_t EOS_AFTER_FRAMES = 2;

// Where one LM stack computes and the tensors its graphs read there: copies of the model's
// tensors in the device's memory, made at load. On the CPU the copies are the process's own
// memory (with huge pages where the system grants them) in place of the mapped file's pages:
// every step reads all of a stack's weights, and on the machines measured (docs/hardware.md)
// the cores read private memory faster than a file's pages. The embedding tables, of which a
// step reads a few rows, stay where they are.
struct StackPlacement {
    std::string device = "cpu";  // a resolved device id (devices.h)
    std::unique_ptr<DeviceCopies> copies;
    LmStack stack;
    ggml_tensor *in_proj_w = nullptr, *in_proj_b = nullptr, *head = nullptr, *heads = nullptr;
    // The embedding table of its input codes, where its graphs look rows up on the device (for
    // the frame graphs): the code predictor's, the talker's codec table.
    ggml_tensor *embd = nullptr;

    StackPlacement() = default;
    // `head` or `heads` as LmGraph takes them; `in_proj_*` and `embd` may be null. The file's
    // pages of what is copied go back to `source` (GgufWeights::discard). `panels`: a stack whose
    // weights each frame reads many times (the code predictor's, 15 passes): on the CPU its
    // layers' q8_0 matrices are kept as the q8_0 GEMM's panels where q8_keeps_panels says so
    // (from the cache, its products are bound by their instructions, which panels cut). A stack
    // read once a frame (the talker's) is bound by memory, where panels gain nothing.
    StackPlacement(const std::string &device, const LmStack &host, ggml_tensor *in_proj_w,
                   ggml_tensor *in_proj_b, ggml_tensor *head, ggml_tensor *heads, ggml_tensor *embd,
                   const char *what, GgufWeights &source, bool panels);
    bool on_cpu() const { return is_cpu(device); }
    // The pool its graphs run our CPU ops in: `cpu_pool` on the CPU; none on a GPU, whose
    // graphs are ggml's own ops only (see LmGraph).
    WorkerPool *graph_pool(WorkerPool *cpu_pool) const { return on_cpu() ? cpu_pool : nullptr; }
};

struct TalkerModel {
    GgufWeights weights;  // memory-mapped: untouched rows of the text table stay on disk
    TalkerHParams hp;
    std::atomic<int> n_threads;  // of the generations started next
    // The K/V cache type of the generations started next (Generator::set_kv_cache_type).
    std::atomic<ggml_type> kv_type{GGML_TYPE_F32};
    bool polite = false;
    std::shared_ptr<CoreShare> core_share;  // the generations' pools read it
    LmStack talker, predictor;
    ggml_tensor *codec_embd, *text_embd, *text_fc1_w, *text_fc1_b, *text_fc2_w, *text_fc2_b;
    ggml_tensor *head;
    ggml_tensor *cp_proj_w = nullptr, *cp_proj_b = nullptr, *cp_embd, *cp_heads;

    // Where the talker stack and the code predictor compute (resolved device ids).
    StackPlacement talker_at, predictor_at;

    TalkerModel(const std::string &path, int threads, const std::string &talker_device = "cpu",
                const std::string &predictor_device = "cpu");

    // The prompt rows before the text depend only on the voice (role tokens, language and
    // speaker codec tokens): their talker K/V are computed once per voice and reused, so a
    // synthesis prefills only its text rows. Small LRU, shared by the sessions (TalkerRun).
    struct PrefixKv {
        std::vector<int32_t> key;  // role ids + codec prefix ids
        ggml_type type = GGML_TYPE_F32;  // of the cache they were computed in (an f16 cache's
                                         // later rows attend to the rounded earlier ones)
        int64_t rows = 0;
        std::vector<std::vector<float>> k, v;  // per layer, as KvCache::read_rows
    };
    static constexpr size_t PREFIX_CACHE_SIZE = 16;
    mutable std::mutex prefix_mutex;
    mutable std::list<PrefixKv> prefix_cache;  // most recent first
    bool find_prefix(const std::vector<int32_t> &key, ggml_type type, PrefixKv &out) const;
    void store_prefix(PrefixKv entry) const;

    // Adds a frame's talker input, C(code 0) + the predictor's embeddings of codes 1..15, to
    // `out` [hidden]: how a generated frame is fed back, and a reference frame is prompted.
    void add_frame_embedding(const Frame &frame, float *out) const;

    // Text path P(x) = fc2(silu(fc1(text_embd[x]))) of each id: [ids.size(), hidden].
    std::vector<float> text_projection(const std::vector<int32_t> &ids, ggml_backend_t backend,
                                       WorkerPool *pool) const;
};

struct Prompt;

// One session's talker: the prefill of a prompt (the voice rows' K/V from the model's cache)
// and single-row steps, over a KV cache allocated for the whole run (its pages touched only as
// they are used) whose slots in use grow in blocks of `kv_block`.
class TalkerRun {
  public:
    // Room for the prompt and `steps` steps, allocated `kv_block` steps at a time.
    // `backend` computes the talker stack: the CPU with `pool`, or the device of the model's
    // talker placement (pool unused).
    TalkerRun(const TalkerModel &m, const Prompt &prompt, int64_t steps, int64_t kv_block,
              ggml_backend_t backend, WorkerPool *pool);
    // The prompt's rows; then logits() and hidden() are those of its last row.
    void prefill(const Prompt &prompt);
    // One input row at the next position.
    void step(const float *embed);
    const std::vector<float> &logits() const { return last_->logits(); }
    const std::vector<float> &hidden() const { return last_->hidden(); }

    // For a graph that computes the talker's step itself (FrameGraph): the next position,
    // the cache grown to hold it, counted as stepped.
    int64_t take_step();
    KvCache &cache() { return *cache_; }
    // Graph computations so far (the voice prefix's, the prefill, the steps).
    int64_t computations() const { return computations_; }

  private:
    void load_or_compute_voice(const Prompt &prompt);
    std::unique_ptr<LmGraph> graph(int64_t rows) const;  // of `rows` input rows, over the cache
    void grow(int64_t slots);  // more cache slots in use (in place); the step graph is spent

    const TalkerModel &m_;
    ggml_backend_t backend_;
    WorkerPool *pool_;
    int64_t kv_block_, pos_ = 0, computations_ = 0;
    std::unique_ptr<KvCache> cache_;
    std::unique_ptr<LmGraph> prefill_graph_, step_graph_;  // the step's: built at its first use
    // Graphs this run is done with (the voice prefix's, those a growing cache replaced): kept
    // until it ends, not freed, because a GPU backend's descriptor sets may still name their
    // buffers (legal in Vulkan; Debian 12's lavapipe, Mesa 22, then reads the freed buffer when
    // the next graph runs: every full run of the GPU tests with ggml's fused shaders crashed).
    std::vector<std::unique_ptr<LmGraph>> spent_;
    const LmGraph *last_ = nullptr;
};

}  // namespace kazeia
