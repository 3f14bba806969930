// A small pool of compute threads owned by one engine object.
//
// ggml's CPU threadpool synchronizes every graph node with a spinning barrier: on a box where
// other processes compete for the cores, a descheduled thread stalls every node. The decoder
// therefore runs its ggml graph on one thread and parallelizes its heavy custom ops here
// instead: tasks are taken from a shared counter (a late or preempted thread just takes
// fewer), and idle threads poll only briefly before sleeping on a condition variable.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kazeia {

class WorkerPool {
  public:
    // n_threads >= 1 compute threads in total: the caller of run() plus n_threads - 1 workers.
    // `polite`: idle workers yield the core after a short poll instead of keeping it, for pools
    // that share the cores with another busy pool (the engine's generator and decoder).
    explicit WorkerPool(int n_threads, bool polite = false);
    ~WorkerPool();
    WorkerPool(const WorkerPool &) = delete;
    WorkerPool &operator=(const WorkerPool &) = delete;

    int n_threads() const { return (int)workers_.size() + 1; }

    // Calls task(i) for every i in [0, n_tasks) across the pool; returns when all are done.
    // Not reentrant: one run() at a time per pool.
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
    bool polite_ = false;
    bool stop_ = false;
};

}  // namespace kazeia
