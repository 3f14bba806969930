// Loading one model part from a GGUF file: checked metadata, tensors in a backend buffer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ggml_raii.h"

namespace kazeia {

class GgufWeights {
  public:
    // Opens `path`, checks that `general.architecture` is `expected_arch`, and reads every
    // tensor into one buffer of `buft`. Throws ModelError with a message naming the file.
    GgufWeights(const std::string &path, const char *expected_arch,
                ggml_backend_buffer_type_t buft);
    // Same checks, but the tensors stay in a read-only memory map of the file (CPU only):
    // pages are read on first use, so a huge table of which few rows are used (the talker's
    // text embedding) costs only those rows of resident memory.
    struct Mapped {};
    GgufWeights(const std::string &path, const char *expected_arch, Mapped);
    ~GgufWeights();
    GgufWeights(const GgufWeights &) = delete;
    GgufWeights &operator=(const GgufWeights &) = delete;

    const std::string &path() const { return path_; }
    const gguf_context *meta() const { return gguf_.get(); }

    // The tensor called `name`; throws ModelError naming it when absent.
    ggml_tensor *tensor(const std::string &name) const;
    // Checks a tensor's shape; throws ModelError naming it on mismatch.
    void check_shape(const std::string &name, const std::vector<int64_t> &ne) const;
    int64_t n_tensors() const;
    std::string tensor_name(int64_t i) const;
    // The file must hold exactly these tensors with these shapes (a model part's table):
    // throws ModelError naming the first missing, mis-shaped or unexpected one.
    void expect_tensors(const std::vector<std::pair<std::string, std::vector<int64_t>>> &table) const;
    // `key` must equal `version` (a format written by this build's converter).
    void expect_version(const char *key, uint32_t version) const;

    uint32_t get_u32(const char *key) const;
    float get_f32(const char *key) const;
    std::string get_str(const char *key) const;
    std::vector<uint32_t> get_u32_array(const char *key) const;

    std::vector<std::string> get_str_array(const char *key) const;

  private:
    int64_t find_key(const char *key, gguf_type type) const;
    // Opens and validates the header; returns the file size.
    size_t open_checked(const char *expected_arch);

    std::string path_;
    GgufContextPtr gguf_;
    GgmlContextPtr ctx_;
    BufferPtr buffer_;
    void *map_ = nullptr;
    size_t map_size_ = 0;
};

}  // namespace kazeia
