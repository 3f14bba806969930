// The cores an engine's generator and speech decoder share while a stream is decoded beside its
// generation.
//
// Both stages would use every core. The generator's weight products are bound by memory
// bandwidth: on some CPUs one of its threads takes far less than twice the time of two. The
// decoder's products are bound by multiply-adds: its time follows the cores it gets. So while a
// decoder push computes on the CPU with at least as many threads as there are cores, the
// generator computes on its generating thread alone (its other threads sleep), and each op of
// the push that starts while the generator computes a stack on the CPU runs on cores - 1 threads
// (at least one): each stage then has cores of its own, so neither waits for a thread the other
// took. After the push the generator uses all its threads again. An op with no generation
// computing beside it runs on every thread of the push: in a stream, the answer's first push
// (which the generator waits for) and its last.
//
// Not while other processes keep cores busy: the engine's share of the cores then follows its
// number of busy threads, and a generator alone would give cores away. So each push during which
// the generator computed measures the CPU time the whole process got (its stages' threads then
// at least fill the cores): below OTHERS_BUSY_BELOW of the cores others are taken to be busy,
// and both stages keep all their threads until a push gets OTHERS_GONE_FROM again.
//
// The engine gives one CoreShare to its generator and its decoder.
#pragma once

#include <atomic>
#include <cstdint>

namespace kazeia {

class DecoderPush;
class GeneratorComputing;
class WorkerPool;

class CoreShare {
  public:
    static constexpr double OTHERS_BUSY_BELOW = 0.8;
    static constexpr double OTHERS_GONE_FROM = 0.9;

    // `cores`: how many cores the two stages share; 0: the CPUs this process may run on
    // (InputError when negative).
    explicit CoreShare(int cores = 0);
    CoreShare(const CoreShare &) = delete;
    CoreShare &operator=(const CoreShare &) = delete;

    int cores() const { return cores_; }
    // Whether a generation computes on the CPU now (its talker or code predictor).
    bool generator_computing() const {
        return generators_computing_.load(std::memory_order_relaxed) > 0;
    }
    // Whether the generator computes on its own thread alone now.
    bool generator_alone() const;
    // How many threads an op of a decoder push of `threads` threads computes on now: cores - 1
    // (at least one, at most `threads`) while a generation computes alone beside the push,
    // else all of them.
    int decoder_threads_now(int threads) const;
    // The process's CPU time during the last push measured (one the generator computed beside),
    // over that push's wall time times the cores; -1 before the first.
    double last_push_cpu_share() const {
        return last_push_cpu_share_.load(std::memory_order_relaxed);
    }

  private:
    // The marks (src/core_share_marks.h): the pushes, measured, and the generations computing.
    friend class DecoderPush;
    friend class GeneratorComputing;
    friend class WorkerPool;  // counts the generator's jobs

    int cores_;
    std::atomic<int> decoder_threads_{0};       // of the decoder pushes computing now
    std::atomic<int> generators_computing_{0};  // generations computing on the CPU now
    std::atomic<uint64_t> generator_jobs_{0};   // the generator pool's jobs of several tasks
    std::atomic<double> last_push_cpu_share_{-1.0};
    std::atomic<bool> others_busy_{false};
};

}  // namespace kazeia
