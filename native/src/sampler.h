// Token selection exactly as the official logits processors (transformers), seeded.
#pragma once

#include <cstdint>
#include <vector>

namespace kazeia {

// xoshiro256** seeded through splitmix64: small, fast, and the same stream on every platform.
class Rng {
  public:
    explicit Rng(uint64_t seed);
    uint64_t next();
    double uniform();  // [0, 1) with 53 random bits

  private:
    uint64_t s_[4];
};

struct SamplingParams {
    bool greedy = false;
    float temperature = 1.0f;
    int top_k = 0;       // 0: off
    float top_p = 1.0f;  // 1: off
};

// In-place processors, in the order the official generation applies them.
// Repetition penalty over the unique tokens of `history`: x < 0 ? x * p : x / p.
void apply_repetition_penalty(float *logits, int64_t n, const std::vector<int32_t> &history,
                              float penalty);
// -inf for every id in [begin, end) but `keep`.
void suppress_range(float *logits, int64_t n, int64_t begin, int64_t end, int64_t keep);

// Greedy: argmax (first maximum). Otherwise temperature -> top-k (ties with the k-th value
// kept) -> top-p (smallest set whose mass exceeds p, at least one token) -> softmax -> draw.
int32_t select_token(const float *logits, int64_t n, const SamplingParams &params, Rng &rng,
                     std::vector<float> &scratch);

}  // namespace kazeia
