// The one idiom of every model part's format table (decoder_arch.h, talker_arch.h, and the
// parts to come): which GGUF metadata keys a part holds and where each value comes from in a
// Hugging Face checkpoint, and which tensors it holds, how each is made from checkpoint
// tensors and how it may be stored. The C++ loader checks a file against its part's table; the
// Python converter writes the file from the same table (through wyoming_kazeia._native.formats),
// so both agree by construction.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace kazeia {

enum class MetaType {
    U32,
    F32,
    U32_ARRAY,
    STR,          // a text value (e.g. the checkpoint kind)
    STR_U32_MAP,  // a {name: id} mapping, stored as key.names (sorted) and key.values
    STR_STR_MAP,  // a {name: text} mapping over the names of the STR_U32_MAP before it
};

// One metadata key of a part whose hyper-parameters are the struct H.
template <class H> struct MetaKey {
    MetaKey(std::string key_, MetaType type_, std::string source_)
        : key(std::move(key_)), type(type_), source(std::move(source_)) {}

    std::string key;  // GGUF key
    MetaType type;
    // "FILE:dotted.path" inside the checkpoint folder, e.g.
    // "config.json:talker_config.hidden_size"; empty for a constant of the official code.
    std::string source;
    double constant = 0.0;  // the value when `source` is empty
    // The value when `source` is absent from the checkpoint (the official config class's
    // default, which published config.json files leave out); empty: the key is required.
    std::vector<double> fallback;
    // Where the loader stores the value: the accessors matching `type` are set.
    std::function<uint32_t &(H &)> u32;
    std::function<float &(H &)> f32;
    std::function<std::vector<uint32_t> &(H &)> u32_array;      // U32_ARRAY, STR_U32_MAP values
    std::function<std::string &(H &)> str;                      // STR
    std::function<std::vector<std::string> &(H &)> names;       // maps: the names
    std::function<std::vector<std::string> &(H &)> str_values;  // STR_STR_MAP values
};

// Builders of table rows from member pointers (a field of H, or a field of a member of H).
template <class H, class T> std::function<T &(H &)> field(T H::*m) {
    return [m](H &h) -> T & { return h.*m; };
}
template <class H, class S, class T> std::function<T &(H &)> field(S H::*outer, T S::*inner) {
    return [outer, inner](H &h) -> T & { return (h.*outer).*inner; };
}
template <class H>
MetaKey<H> meta_u32(std::string key, std::string source, std::function<uint32_t &(H &)> f) {
    MetaKey<H> k{std::move(key), MetaType::U32, std::move(source)};
    k.u32 = std::move(f);
    return k;
}
template <class H>
MetaKey<H> meta_f32(std::string key, std::string source, std::function<float &(H &)> f) {
    MetaKey<H> k{std::move(key), MetaType::F32, std::move(source)};
    k.f32 = std::move(f);
    return k;
}

template <class H>
MetaKey<H> meta_str(std::string key, std::string source, std::function<std::string &(H &)> f) {
    MetaKey<H> k{std::move(key), MetaType::STR, std::move(source)};
    k.str = std::move(f);
    return k;
}

// How the converter makes a stored tensor from its checkpoint tensors. Layouts are "channel
// fastest": ggml shape ne = reversed numpy shape.
enum class Transform {
    COPY,        // as is (vectors, norms, embedding tables, torch Linear [out, in] = ggml [in, out])
    CONV,        // torch Conv1d [out, in, k] -> ggml [k*in, out] (tap-major rows)
    TRANS_CONV,  // torch ConvTranspose1d [in, out, m*r] -> ggml [m*in, r*out]
    DEPTHWISE,   // torch depthwise Conv1d [C, 1, k] -> ggml [C, k]
    CODEBOOK,    // embedding_sum / clamp(cluster_usage, 1e-5) -> ggml [dim, size]
    EXP,         // exp(x): SnakeBeta alpha
    INV_EXP,     // 1 / (exp(x) + 1e-9): SnakeBeta beta
    STACK,       // several sources stacked along a new outermost dimension
    CONCAT,      // several sources concatenated along their outermost dimension (rows)
};

// How the converter may store a tensor for a requested weight type (--type).
enum class Storage {
    F32,                 // always f32 (norms, biases, vectors, codebooks)
    F16_WHEN_QUANTIZED,  // f32 for --type f32, else f16: matrices that our own GEMM widens to
                         // f32 math (the compute-bound decoder: activations stay f32)
    QUANTIZABLE,         // the --type itself; a row that does not fit its block size falls back
                         // to the next type that fits (q6_k, q5_k, q4_k -> q8_0 -> f16)
};

struct TensorSpec {
    std::string name;                  // GGUF tensor name
    std::vector<int64_t> ne;           // ggml shape (ne0 first)
    std::vector<std::string> sources;  // checkpoint tensor names, in the part's weights file
    Transform transform = Transform::COPY;
    Storage storage = Storage::F32;
    int stride = 0;  // TRANS_CONV: the stride r
};

// What a part is, as a whole: the file it is, where its weights come from, and what the
// converter may leave out of the checkpoint.
struct PartInfo {
    const char *name;                // "decoder"
    const char *file;                // "decoder.gguf" in a converted model folder
    const char *arch;                // value of general.architecture: the kind of the file
    const char *format_version_key;  // bumped when the tensor layout or a key's meaning changes
    uint32_t format_version;
    const char *weights_dir;  // checkpoint subfolder of the safetensors ("" the top folder)
    // Checkpoint tensors the part does not use (name prefixes), e.g. the audio encoder.
    std::vector<std::string> unused_sources;
    // Only checkpoints of this kind (config.json tts_model_type) have the part; "" every kind.
    const char *model_type = "";
};

}  // namespace kazeia
