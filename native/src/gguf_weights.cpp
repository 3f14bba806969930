#include "gguf_weights.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kazeia/error.h"

namespace kazeia {

namespace {
struct FileClose { void operator()(FILE *f) const { std::fclose(f); } };
using FilePtr = std::unique_ptr<FILE, FileClose>;

std::string shape_str(const int64_t *ne, int n) {
    std::ostringstream s;
    s << "[";
    for (int i = 0; i < n; ++i) s << (i ? ", " : "") << ne[i];
    s << "]";
    return s.str();
}
}  // namespace

size_t GgufWeights::open_checked(const PartInfo &part) {
    const std::string &path = path_;
    // Opening a FIFO (or a device) would block until someone writes to it, with no deadline:
    // only a regular file is opened.
    struct stat st = {};
    if (::stat(path.c_str(), &st) != 0)
        throw ModelError("cannot open " + path + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw ModelError(path + " is not a regular file");
    FilePtr file(std::fopen(path.c_str(), "rb"));
    if (!file) throw ModelError("cannot open " + path + ": " + std::strerror(errno));
    char magic[4] = {};
    if (std::fread(magic, 1, 4, file.get()) != 4 || std::memcmp(magic, "GGUF", 4) != 0)
        throw ModelError(path + " is not a GGUF file (bad magic)");
    std::fseek(file.get(), 0, SEEK_END);
    const long file_size = std::ftell(file.get());

    ggml_context *ctx = nullptr;
    gguf_init_params params = {/*no_alloc =*/true, /*ctx =*/&ctx};
    gguf_.reset(gguf_init_from_file(path.c_str(), params));
    if (!gguf_) throw ModelError(path + " is a corrupt or truncated GGUF file (header unreadable)");
    ctx_.reset(ctx);

    const std::string arch = get_str("general.architecture");
    if (arch != part.arch)
        throw ModelError(path + " is a '" + arch + "' GGUF, expected '" + part.arch + "'");
    const uint32_t version = get_u32(part.format_version_key);
    if (version != part.format_version)
        throw ModelError(path + " has format version " + std::to_string(version) +
                         ", this build reads version " + std::to_string(part.format_version) +
                         ": re-run the converter");

    // Every tensor's bytes must lie inside the file before anything is read.
    const size_t data_offset = gguf_get_data_offset(gguf_.get());
    for (int64_t i = 0; i < gguf_get_n_tensors(gguf_.get()); ++i) {
        const char *name = gguf_get_tensor_name(gguf_.get(), i);
        ggml_tensor *t = ggml_get_tensor(ctx_.get(), name);
        const size_t end = data_offset + gguf_get_tensor_offset(gguf_.get(), i) + ggml_nbytes(t);
        if (end > (size_t)file_size)
            throw ModelError(path + " is truncated: tensor '" + name + "' ends at byte " +
                             std::to_string(end) + " of " + std::to_string(file_size));
    }
    return (size_t)file_size;
}

GgufWeights::GgufWeights(const std::string &path, const PartInfo &part, Mapped) : path_(path) {
    const size_t size = open_checked(part);
    map_ = std::make_unique<MappedFile>(path, size);
    const size_t data_offset = gguf_get_data_offset(gguf_.get());
    buffer_.reset(ggml_backend_cpu_buffer_from_ptr(map_->data() + data_offset, size - data_offset));
    for (int64_t i = 0; i < gguf_get_n_tensors(gguf_.get()); ++i) {
        ggml_tensor *t = ggml_get_tensor(ctx_.get(), gguf_get_tensor_name(gguf_.get(), i));
        char *addr = map_->data() + data_offset + gguf_get_tensor_offset(gguf_.get(), i);
        if (ggml_backend_tensor_alloc(buffer_.get(), t, addr) != GGML_STATUS_SUCCESS)
            throw ModelError(path + ": cannot place tensor '" + std::string(t->name) + "'");
    }
}

GgufWeights::~GgufWeights() {
    buffer_.reset();
    map_.reset();
}

GgufWeights::GgufWeights(const std::string &path, const PartInfo &part,
                         ggml_backend_buffer_type_t buft)
    : path_(path) {
    open_checked(part);
    FilePtr file(std::fopen(path.c_str(), "rb"));
    if (!file) throw ModelError("cannot open " + path + ": " + std::strerror(errno));
    const size_t data_offset = gguf_get_data_offset(gguf_.get());

    buffer_.reset(ggml_backend_alloc_ctx_tensors_from_buft(ctx_.get(), buft));
    if (!buffer_) throw ModelError("out of memory allocating the weights of " + path);
    ggml_backend_buffer_set_usage(buffer_.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);

    const bool host = ggml_backend_buffer_is_host(buffer_.get());
    std::vector<uint8_t> staging;
    for (int64_t i = 0; i < gguf_get_n_tensors(gguf_.get()); ++i) {
        const char *name = gguf_get_tensor_name(gguf_.get(), i);
        ggml_tensor *t = ggml_get_tensor(ctx_.get(), name);
        const size_t n = ggml_nbytes(t);
        if (std::fseek(file.get(), (long)(data_offset + gguf_get_tensor_offset(gguf_.get(), i)),
                       SEEK_SET) != 0)
            throw ModelError(path + ": cannot seek to tensor '" + name + "'");
        void *dst = t->data;
        if (!host) {
            staging.resize(n);
            dst = staging.data();
        }
        if (std::fread(dst, 1, n, file.get()) != n)
            throw ModelError(path + " is truncated: cannot read tensor '" + name + "'");
        if (!host) ggml_backend_tensor_set(t, staging.data(), 0, n);
    }
}

ggml_tensor *GgufWeights::tensor(const std::string &name) const {
    ggml_tensor *t = ggml_get_tensor(ctx_.get(), name.c_str());
    if (!t) throw ModelError(path_ + " has no tensor '" + name + "'");
    return t;
}

void GgufWeights::check_shape(const std::string &name, const std::vector<int64_t> &ne) const {
    const ggml_tensor *t = tensor(name);
    bool ok = ggml_n_dims(t) <= (int)ne.size();
    for (int i = 0; ok && i < GGML_MAX_DIMS; ++i)
        ok = t->ne[i] == (i < (int)ne.size() ? ne[i] : 1);
    if (!ok)
        throw ModelError(path_ + ": tensor '" + name + "' has shape " +
                         shape_str(t->ne, ggml_n_dims(t)) + ", expected " +
                         shape_str(ne.data(), (int)ne.size()));
}

void GgufWeights::expect_tensors(const std::vector<TensorSpec> &table) const {
    for (const TensorSpec &spec : table) check_shape(spec.name, spec.ne);
    for (int64_t i = 0; i < n_tensors(); ++i) {
        const std::string name = tensor_name(i);
        if (std::none_of(table.begin(), table.end(), [&](const TensorSpec &s) { return s.name == name; }))
            throw ModelError(path_ + " has an unexpected tensor '" + name + "'");
    }
}

size_t GgufWeights::discard(ggml_tensor *t) {
    // A mapped file's pages are clean copies of the file, never written: dropped, they are read
    // from it again if ever touched. Of the private memory, only ggml's CPU buffer is known to be
    // plain memory (posix_memalign): other host buffers (a GPU backend's pinned memory) are left
    // alone.
    if (t->buffer != buffer_.get() ||
        (!map_ && ggml_backend_buffer_get_type(buffer_.get()) != ggml_backend_cpu_buffer_type()))
        return 0;
#if defined(__linux__) && defined(MADV_DONTNEED)
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const auto start = reinterpret_cast<uintptr_t>(t->data);
    const uintptr_t first = (start + page - 1) & ~(page - 1);
    const uintptr_t last = (start + ggml_nbytes(t)) & ~(page - 1);
    if (last <= first) return 0;
    void *pages = reinterpret_cast<void *>(first);
#if defined(MADV_NOHUGEPAGE)
    // Where huge pages are the default, the kernel would later merge a released range of private
    // memory back into a huge page with its neighbours (filled with zeros): kept apart, it stays
    // released. (A file's pages come back only from the file.) Advice only.
    if (!map_) madvise(pages, last - first, MADV_NOHUGEPAGE);
#endif
    return madvise(pages, last - first, MADV_DONTNEED) == 0 ? last - first : 0;
#else
    return 0;
#endif
}

int64_t GgufWeights::n_tensors() const { return gguf_get_n_tensors(gguf_.get()); }

std::string GgufWeights::tensor_name(int64_t i) const {
    return gguf_get_tensor_name(gguf_.get(), i);
}

int64_t GgufWeights::find_key(const char *key, gguf_type type) const {
    const int64_t id = gguf_find_key(gguf_.get(), key);
    if (id < 0) throw ModelError(path_ + " lacks metadata key '" + std::string(key) + "'");
    if (gguf_get_kv_type(gguf_.get(), id) != type)
        throw ModelError(path_ + ": metadata key '" + std::string(key) + "' has type " +
                         gguf_type_name(gguf_get_kv_type(gguf_.get(), id)) + ", expected " +
                         gguf_type_name(type));
    return id;
}

bool GgufWeights::has_key(const char *key) const { return gguf_find_key(gguf_.get(), key) >= 0; }

uint32_t GgufWeights::get_u32(const char *key) const {
    return gguf_get_val_u32(gguf_.get(), find_key(key, GGUF_TYPE_UINT32));
}

float GgufWeights::get_f32(const char *key) const {
    return gguf_get_val_f32(gguf_.get(), find_key(key, GGUF_TYPE_FLOAT32));
}

std::string GgufWeights::get_str(const char *key) const {
    return gguf_get_val_str(gguf_.get(), find_key(key, GGUF_TYPE_STRING));
}

std::vector<uint32_t> GgufWeights::get_u32_array(const char *key) const {
    const int64_t id = find_key(key, GGUF_TYPE_ARRAY);
    if (gguf_get_arr_type(gguf_.get(), id) != GGUF_TYPE_UINT32)
        throw ModelError(path_ + ": metadata key '" + std::string(key) +
                         "' is not an array of uint32");
    const size_t n = gguf_get_arr_n(gguf_.get(), id);
    const auto *data = static_cast<const uint32_t *>(gguf_get_arr_data(gguf_.get(), id));
    return std::vector<uint32_t>(data, data + n);
}

std::vector<std::string> GgufWeights::get_str_array(const char *key) const {
    const int64_t id = find_key(key, GGUF_TYPE_ARRAY);
    if (gguf_get_arr_type(gguf_.get(), id) != GGUF_TYPE_STRING)
        throw ModelError(path_ + ": metadata key '" + std::string(key) +
                         "' is not an array of strings");
    std::vector<std::string> out;
    for (size_t i = 0; i < gguf_get_arr_n(gguf_.get(), id); ++i)
        out.push_back(gguf_get_arr_str(gguf_.get(), id, i));
    return out;
}

}  // namespace kazeia
