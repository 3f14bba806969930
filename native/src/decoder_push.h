// A decoder push as its engine's CoreShare sees it (kazeia/core_share.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>

#include "kazeia/core_share.h"

namespace kazeia {

// Marks a decoder push of `threads` threads as computing for its lifetime, and measures the
// process's share of the cores during it when the generator computed beside it (`share` null:
// marks nothing).
class DecoderPush {
  public:
    DecoderPush(CoreShare *share, int threads);
    ~DecoderPush();
    DecoderPush(const DecoderPush &) = delete;
    DecoderPush &operator=(const DecoderPush &) = delete;

  private:
    CoreShare *share_;
    int threads_;
    uint64_t generator_jobs_;  // the share's count at the start
    std::chrono::steady_clock::time_point start_;
    std::clock_t cpu_start_;  // the process's CPU time
};

}  // namespace kazeia
