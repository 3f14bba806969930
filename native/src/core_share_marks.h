// What an engine's stages mark in its CoreShare (kazeia/core_share.h): the decoder's pushes and
// the generations computing.
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

// Marks a generation as computing on the CPU for its lifetime: the generator holds one around
// each piece of work of a stack placed on the CPU (the prefill, a talker step, a frame's code
// predictor). `share` null: marks nothing.
class GeneratorComputing {
  public:
    explicit GeneratorComputing(CoreShare *share) : share_(share) {
        if (share_) share_->generators_computing_.fetch_add(1, std::memory_order_relaxed);
    }
    ~GeneratorComputing() {
        if (share_) share_->generators_computing_.fetch_sub(1, std::memory_order_relaxed);
    }
    GeneratorComputing(const GeneratorComputing &) = delete;
    GeneratorComputing &operator=(const GeneratorComputing &) = delete;

  private:
    CoreShare *share_;
};

}  // namespace kazeia
