// A small pool of compute threads owned by one engine object.
//
// ggml's CPU threadpool synchronizes every graph node with a spinning barrier: on a box where
// other processes compete for the cores, a descheduled thread stalls every node. The decoder
// therefore runs its ggml graph on one thread and parallelizes its heavy custom ops here
// instead: tasks are taken from a shared counter (a late or preempted thread just takes
// fewer), and idle threads poll only briefly before sleeping on a condition variable.
//
// Every thread of a pool, the callers of run() included, asks the kernel for its shortest
// time slice. On Linux's EEVDF scheduler a thread that yields moves its virtual deadline later
// by its own slice: with the default slice (1.4 ms on 2 CPUs) it fell behind a busy process
// beside the engine, which then ran its turn while our caller did the pool's work alone; with
// 0.1 ms it mostly stays ahead, so a yield hands the core to another thread of ours or to no
// one, and a thread of ours that wakes preempts the busy process sooner. How much of the cores
// each thread gets is unchanged (it follows the weights: the nice values); other processes may
// wait a little longer for a core while the engine works.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kazeia/core_share.h"

namespace kazeia {

// The time slice a pool's threads ask for: the shortest the kernel grants (it clamps slices to
// 0.1..100 ms). KAZEIA_SHORT_SLICES=off leaves the threads' slices as they are (for benches).
inline constexpr uint64_t SHORT_TIME_SLICE_NS = 100000;

// Sets the calling thread's time slice to `ns` (0: the kernel's default): the sched_runtime of
// a SCHED_OTHER or SCHED_BATCH thread, which Linux's EEVDF scheduler reads since 6.12 (older
// kernels accept and ignore it), keeping its policy and nice value; a real-time or idle thread
// is left as it is. The thread keeps it, and the threads and processes it starts inherit it.
// Whether the call was accepted.
bool set_thread_time_slice(uint64_t ns);

// The calling thread's time slice in ns as the kernel reports it (0 where it reports none).
uint64_t thread_time_slice_ns();

// Which of an engine's stages a pool computes for, as its CoreShare sees it.
enum class PoolStage { Generator, Decoder };

class WorkerPool {
  public:
    // n_threads >= 1 compute threads in total: the caller of run() plus n_threads - 1 workers.
    // `polite`: idle workers yield the core after a short poll instead of keeping it, for pools
    // that share the cores with another busy pool (the engine's generator and decoder).
    explicit WorkerPool(int n_threads, bool polite = false)
        : WorkerPool(n_threads, polite, nullptr, PoolStage::Generator) {}
    // `share` (it must outlive the pool; null: none): a generator's pool counts its jobs of
    // several tasks there, and while it says the generator computes alone, computes every task
    // on its caller; a decoder's pool computes each job on as many of its threads as it says
    // (decoder_threads_now).
    WorkerPool(int n_threads, bool polite, CoreShare *share, PoolStage stage);
    ~WorkerPool();
    WorkerPool(const WorkerPool &) = delete;
    WorkerPool &operator=(const WorkerPool &) = delete;

    int n_threads() const { return (int)workers_.size() + 1; }

    // Calls task(i) for every i in [0, n_tasks) across the pool; returns when all are done.
    // Not reentrant: one run() at a time per pool. Gives a caller other than the last one short
    // time slices (kept after run() returns).
    void run(int64_t n_tasks, const std::function<void(int64_t)> &task);

  private:
    struct Job;
    void worker_loop();
    static void work(Job &job);

    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::shared_ptr<Job> job_;             // current job, guarded by mutex_
    std::atomic<uint64_t> generation_{0};  // bumped (under mutex_) for each job
    int sleepers_ = 0;                     // workers waiting on wake_, guarded by mutex_
    std::thread::id last_caller_;          // the last thread that run() gave short slices
    bool short_slices_ = true;             // whether the pool's threads ask for them
    bool polite_ = false;
    CoreShare *share_ = nullptr;
    PoolStage stage_ = PoolStage::Generator;
    bool stop_ = false;
};

}  // namespace kazeia
