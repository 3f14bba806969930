#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_set>

namespace kazeia {

namespace {
uint64_t splitmix64(uint64_t &x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
}  // namespace

Rng::Rng(uint64_t seed) {
    for (uint64_t &s : s_) s = splitmix64(seed);
}

uint64_t Rng::next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
}

double Rng::uniform() { return (double)(next() >> 11) * 0x1.0p-53; }

void apply_repetition_penalty(float *logits, int64_t n, const std::vector<int32_t> &history,
                              float penalty) {
    if (penalty == 1.0f) return;
    std::unordered_set<int32_t> seen;
    for (int32_t id : history) {
        if (id < 0 || id >= n || !seen.insert(id).second) continue;
        float &x = logits[id];
        x = x < 0.0f ? x * penalty : x / penalty;
    }
}

void suppress_range(float *logits, int64_t n, int64_t begin, int64_t end, int64_t keep) {
    for (int64_t i = std::max<int64_t>(0, begin); i < std::min(n, end); ++i)
        if (i != keep) logits[i] = NEG_INF;
}

int32_t select_token(const float *logits, int64_t n, const SamplingParams &p, Rng &rng,
                     std::vector<float> &scratch) {
    if (p.greedy) return (int32_t)(std::max_element(logits, logits + n) - logits);
    scratch.assign(logits, logits + n);
    float *x = scratch.data();
    for (int64_t i = 0; i < n; ++i) x[i] /= p.temperature;
    if (p.top_k > 0 && p.top_k < n) {
        // Remove scores below the k-th largest (ties with it stay, as torch.topk's threshold).
        std::vector<float> sorted(x, x + n);
        std::nth_element(sorted.begin(), sorted.begin() + (p.top_k - 1), sorted.end(),
                         std::greater<float>());
        const float kth = sorted[p.top_k - 1];
        for (int64_t i = 0; i < n; ++i)
            if (x[i] < kth) x[i] = NEG_INF;
    }
    const float max = *std::max_element(x, x + n);
    std::vector<double> prob(n);
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) total += prob[i] = x[i] == NEG_INF ? 0.0 : std::exp((double)(x[i] - max));
    for (double &q : prob) q /= total;
    if (p.top_p < 1.0f) {
        // Ascending order; drop the low tail whose cumulative mass is <= 1 - top_p, keeping
        // at least the most probable token.
        std::vector<int64_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t a, int64_t b) { return x[a] < x[b]; });
        double cum = 0.0;
        for (int64_t r = 0; r + 1 < n; ++r) {
            cum += prob[order[r]];
            if (cum <= 1.0 - p.top_p) prob[order[r]] = 0.0;
            else break;
        }
        total = std::accumulate(prob.begin(), prob.end(), 0.0);
        for (double &q : prob) q /= total;
    }
    const double u = rng.uniform();
    double cum = 0.0;
    int64_t last = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (prob[i] <= 0.0) continue;
        last = i;
        cum += prob[i];
        if (u < cum) return (int32_t)i;
    }
    return (int32_t)last;
}

}  // namespace kazeia
