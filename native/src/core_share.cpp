#include "kazeia/core_share.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#include "core_share_marks.h"
#include "kazeia/error.h"

namespace kazeia {

namespace {
// The CPUs this process may run on.
int usable_cpus() {
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
    return std::max(1, (int)std::thread::hardware_concurrency());
}
}  // namespace

CoreShare::CoreShare(int cores) : cores_(cores > 0 ? cores : usable_cpus()) {
    if (cores < 0) throw InputError("cores must be >= 0 (0: the CPUs this process may run on)");
}

bool CoreShare::generator_alone() const {
    const int threads = decoder_threads_.load(std::memory_order_relaxed);
    return threads >= cores_ && !others_busy_.load(std::memory_order_relaxed);
}

int CoreShare::decoder_threads_now(int threads) const {
    if (!generator_computing() || !generator_alone()) return threads;
    return std::min(threads, std::max(1, cores_ - 1));
}

DecoderPush::DecoderPush(CoreShare *share, int threads)
    : share_(share), threads_(threads),
      generator_jobs_(share ? share->generator_jobs_.load(std::memory_order_relaxed) : 0),
      start_(std::chrono::steady_clock::now()), cpu_start_(std::clock()) {
    if (share_) share_->decoder_threads_.fetch_add(threads_, std::memory_order_relaxed);
}

DecoderPush::~DecoderPush() {
    if (!share_) return;
    share_->decoder_threads_.fetch_sub(threads_, std::memory_order_relaxed);
    // Only while the generator computes do the stages' threads fill the cores (outnumber them,
    // or match them where the push leaves the generator a core): a push beside an idle
    // generator (the first of an answer, while it waits) tells nothing.
    if (share_->generator_jobs_.load(std::memory_order_relaxed) == generator_jobs_) return;
    const std::clock_t cpu_end = std::clock();
    const std::chrono::duration<double> wall = std::chrono::steady_clock::now() - start_;
    if (cpu_start_ == (std::clock_t)-1 || cpu_end == (std::clock_t)-1 || !(wall.count() > 0.0))
        return;
    const double cpu_s = (double)(cpu_end - cpu_start_) / CLOCKS_PER_SEC;
    const double got = cpu_s / (wall.count() * share_->cores_);
    share_->last_push_cpu_share_.store(got, std::memory_order_relaxed);
    if (got < CoreShare::OTHERS_BUSY_BELOW)
        share_->others_busy_.store(true, std::memory_order_relaxed);
    else if (got >= CoreShare::OTHERS_GONE_FROM)
        share_->others_busy_.store(false, std::memory_order_relaxed);
}

}  // namespace kazeia
