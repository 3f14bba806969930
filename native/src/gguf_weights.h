// Loading one model part from a GGUF file: checked metadata, tensors in a backend buffer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <memory>

#include "ggml_raii.h"
#include "mapped_file.h"
#include "arch.h"
#include "kazeia/error.h"

namespace kazeia {

class GgufWeights {
  public:
    // Opens `path`, checks that it is a file of `part` (architecture and format version), and
    // reads every tensor into one buffer of `buft`. Throws ModelError naming the file.
    GgufWeights(const std::string &path, const PartInfo &part, ggml_backend_buffer_type_t buft);
    // Same checks, but the tensors stay in a read-only memory map of the file (CPU only):
    // pages are read on first use, so a huge table of which few rows are used (the talker's
    // text embedding) costs only those rows of resident memory.
    struct Mapped {};
    GgufWeights(const std::string &path, const PartInfo &part, Mapped);
    ~GgufWeights();
    GgufWeights(const GgufWeights &) = delete;
    GgufWeights &operator=(const GgufWeights &) = delete;

    const std::string &path() const { return path_; }
    // A mapped file found shorter than when it was loaded (changed on disk): its weights are
    // no longer the file's (see MappedFile).
    bool damaged() const { return map_ && map_->damaged(); }
    const gguf_context *meta() const { return gguf_.get(); }

    // The tensor called `name`; throws ModelError naming it when absent.
    ggml_tensor *tensor(const std::string &name) const;
    // Checks a tensor's shape; throws ModelError naming it on mismatch.
    void check_shape(const std::string &name, const std::vector<int64_t> &ne) const;
    // Gives the memory of a tensor back to the system once it has been copied or transformed
    // into another form and is never read again: its whole pages are released (the bytes at its
    // ends that share a page with a neighbour stay). Read into this object's CPU buffer, it then
    // reads as zeros (on Linux); in a mapped file, its pages leave this process's memory, and a
    // later read would map them from the file again. Returns the bytes released: 0 for a tensor
    // of another buffer, a buffer of a GPU backend, a tensor within a page, or where the system
    // refuses.
    size_t discard(ggml_tensor *t);
    int64_t n_tensors() const;
    std::string tensor_name(int64_t i) const;
    // The file must hold exactly these tensors with these shapes (a model part's table):
    // throws ModelError naming the first missing, mis-shaped or unexpected one.
    void expect_tensors(const std::vector<TensorSpec> &table) const;

    // Every key of a part's table into its hyper-parameters.
    template <class H> void read_meta(const std::vector<MetaKey<H>> &keys, H &hp) const;

    bool has_key(const char *key) const;
    uint32_t get_u32(const char *key) const;
    float get_f32(const char *key) const;
    std::string get_str(const char *key) const;
    std::vector<uint32_t> get_u32_array(const char *key) const;

    std::vector<std::string> get_str_array(const char *key) const;

  private:
    int64_t find_key(const char *key, gguf_type type) const;
    // Opens and validates the header; returns the file size.
    size_t open_checked(const PartInfo &part);

    std::string path_;
    GgufContextPtr gguf_;
    GgmlContextPtr ctx_;
    BufferPtr buffer_;
    std::unique_ptr<MappedFile> map_;
};

template <class H> void GgufWeights::read_meta(const std::vector<MetaKey<H>> &keys, H &hp) const {
    for (const MetaKey<H> &k : keys) {
        const std::string names = k.key + ".names", values = k.key + ".values";
        switch (k.type) {
        case MetaType::U32: k.u32(hp) = get_u32(k.key.c_str()); break;
        case MetaType::F32: k.f32(hp) = get_f32(k.key.c_str()); break;
        case MetaType::U32_ARRAY: k.u32_array(hp) = get_u32_array(k.key.c_str()); break;
        case MetaType::STR: k.str(hp) = get_str(k.key.c_str()); break;
        case MetaType::STR_U32_MAP:
            // An empty mapping (the speakers of a Base model) is stored as no keys: GGUF has
            // no empty arrays.
            if (!has_key(names.c_str()) && !has_key(values.c_str())) {
                k.names(hp).clear();
                k.u32_array(hp).clear();
                break;
            }
            k.names(hp) = get_str_array(names.c_str());
            k.u32_array(hp) = get_u32_array(values.c_str());
            break;
        case MetaType::STR_STR_MAP:
            // Stored in the order of the name list it shares (read before it).
            if (k.names(hp).empty() && !has_key(names.c_str()) && !has_key(values.c_str())) {
                k.str_values(hp).clear();
                break;
            }
            if (get_str_array(names.c_str()) != k.names(hp))
                throw ModelError(path_ + ": '" + names + "' differs from its companion list");
            k.str_values(hp) = get_str_array(values.c_str());
            break;
        }
    }
}

}  // namespace kazeia
