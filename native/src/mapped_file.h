// A model file memory-mapped read-only, guarded against the file changing under it.
//
// A mapped file that is truncated in place while it is mapped (what `cp new.gguf talker.gguf`
// does) makes the next read of a page past the new end raise SIGBUS, which kills the process.
// A guarded mapping instead has that range replaced by zero pages, so the read completes (with
// zeros) and the computation finishes; `damaged()` then says the weights are no longer the
// file's, and the engine refuses to go on with them (ModelError) until the model is reloaded.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>

namespace kazeia {

class MappedFile {
  public:
    // Maps the first `size` bytes of `path` (ModelError when it cannot).
    MappedFile(const std::string &path, size_t size);
    ~MappedFile();
    MappedFile(const MappedFile &) = delete;
    MappedFile &operator=(const MappedFile &) = delete;

    char *data() const { return static_cast<char *>(addr_); }
    size_t size() const { return size_; }
    // True once a read found the file shorter than when it was mapped.
    bool damaged() const { return damaged_.load(std::memory_order_acquire); }

  private:
    void *addr_ = nullptr;
    size_t size_ = 0;
    std::atomic<bool> damaged_{false};
};

}  // namespace kazeia
