#include "worker_pool.h"

#include <atomic>

namespace kazeia {

struct WorkerPool::Job {
    const std::function<void(int64_t)> *task;
    int64_t n_tasks;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::mutex mutex;
    std::condition_variable finished;
};

WorkerPool::WorkerPool(int n_threads) {
    for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

WorkerPool::~WorkerPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    for (std::thread &t : workers_) t.join();
}

void WorkerPool::work(Job &job) {
    for (;;) {
        const int64_t i = job.next.fetch_add(1);
        // A thread that joins late finds every task taken and never touches `task`, which
        // may already be gone: the job's counters outlive it through the shared_ptr.
        if (i >= job.n_tasks) return;
        (*job.task)(i);
        if (job.done.fetch_add(1) + 1 == job.n_tasks) {
            std::lock_guard<std::mutex> lock(job.mutex);
            job.finished.notify_all();
        }
    }
}

void WorkerPool::worker_loop() {
    uint64_t seen = 0;
    for (;;) {
        std::shared_ptr<Job> job;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            job = job_;
        }
        // A worker that wakes after the job finished still finds it here (it is kept until
        // the next run), with every task taken.
        if (job) work(*job);
    }
}

void WorkerPool::run(int64_t n_tasks, const std::function<void(int64_t)> &task) {
    if (n_tasks <= 0) return;
    if (workers_.empty() || n_tasks == 1) {
        for (int64_t i = 0; i < n_tasks; ++i) task(i);
        return;
    }
    auto job = std::make_shared<Job>();
    job->task = &task;
    job->n_tasks = n_tasks;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        job_ = job;
        ++generation_;
    }
    wake_.notify_all();
    work(*job);
    if (job->done.load() != n_tasks) {
        std::unique_lock<std::mutex> lock(job->mutex);
        job->finished.wait(lock, [&] { return job->done.load() == n_tasks; });
    }
}

}  // namespace kazeia
