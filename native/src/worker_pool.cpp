#include "worker_pool.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "env_switch.h"

// The spin-wait hint of each CPU: it lets the sibling hardware thread run and saves power.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KAZEIA_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define KAZEIA_CPU_RELAX() __asm__ __volatile__("yield")
#else
#define KAZEIA_CPU_RELAX() std::this_thread::yield()
#endif

namespace kazeia {

namespace {
// How long an idle worker keeps polling for the next job before it sleeps: graph nodes come
// every few microseconds while a model runs, syntheses seconds apart.
constexpr auto SPIN_BEFORE_SLEEP = std::chrono::microseconds(500);
constexpr auto POLITE_PAUSE = std::chrono::microseconds(30);  // then yield (polite pools)

#if defined(__linux__)
// The kernel's struct sched_attr (include/uapi/linux/sched/types.h), its second version: glibc
// has a wrapper only since 2.41.
struct SchedAttr {
    uint32_t size;
    uint32_t sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime;  // a SCHED_OTHER/SCHED_BATCH thread's slice, in ns (0: the default)
    uint64_t sched_deadline;
    uint64_t sched_period;
    uint32_t sched_util_min;
    uint32_t sched_util_max;
};
static_assert(sizeof(SchedAttr) == 56, "SCHED_ATTR_SIZE_VER1");
constexpr uint64_t SCHED_FLAG_RESET_ON_FORK_BIT = 0x01;
#endif

// Whether a pool's threads ask for short time slices: unless KAZEIA_SHORT_SLICES=off.
bool short_slices_wanted() { return !env_is("KAZEIA_SHORT_SLICES", "off"); }
}  // namespace

uint64_t thread_time_slice_ns() {
#if defined(__linux__) && defined(SYS_sched_getattr)
    SchedAttr attr{};
    if (syscall(SYS_sched_getattr, 0, &attr, sizeof attr, 0) == 0) return attr.sched_runtime;
#endif
    return 0;
}

bool set_thread_time_slice(uint64_t ns) {
#if defined(__linux__) && defined(SYS_sched_getattr) && defined(SYS_sched_setattr)
    SchedAttr attr{};
    if (syscall(SYS_sched_getattr, 0, &attr, sizeof attr, 0) != 0) return false;
    if (attr.sched_policy != SCHED_OTHER && attr.sched_policy != SCHED_BATCH)
        return false;  // a real-time or idle thread keeps what it was given
    // The same policy, nice value and reset-on-fork flag as before (the utilization clamps are
    // left alone without their flags): only the slice changes.
    attr.size = sizeof attr;
    attr.sched_flags &= SCHED_FLAG_RESET_ON_FORK_BIT;
    attr.sched_runtime = ns;
    return syscall(SYS_sched_setattr, 0, &attr, 0) == 0;
#else
    (void)ns;
    return false;
#endif
}

struct WorkerPool::Job {
    const std::function<void(int64_t)> *task;
    int64_t n_tasks;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::atomic<int64_t> seats{0};  // how many more workers may join it
};

WorkerPool::WorkerPool(int n_threads, bool polite, CoreShare *share, PoolStage stage)
    : short_slices_(short_slices_wanted()), polite_(polite), share_(share), stage_(stage) {
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
        job.done.fetch_add(1, std::memory_order_release);
    }
}

void WorkerPool::worker_loop() {
    if (short_slices_) set_thread_time_slice(SHORT_TIME_SLICE_NS);
    uint64_t seen = 0;
    bool seated = true;  // whether the last job had a seat for this worker
    for (;;) {
        const auto start = std::chrono::steady_clock::now();
        const auto spin_until = start + (seated ? SPIN_BEFORE_SLEEP : std::chrono::microseconds(0));
        const auto pause_until = start + POLITE_PAUSE;
        for (int i = 0; generation_.load(std::memory_order_acquire) == seen; ++i) {
            KAZEIA_CPU_RELAX();
            if ((i & 63) != 0) continue;
            const auto now = std::chrono::steady_clock::now();
            if (now > spin_until) break;
            // A polite pool gives its core to the other stage's threads while it waits.
            if (polite_ && now > pause_until) std::this_thread::yield();
        }
        std::shared_ptr<Job> job;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            if (!stop_ && generation_.load() == seen) {
                ++sleepers_;
                wake_.wait(lock, [&] { return stop_ || generation_.load() != seen; });
                --sleepers_;
            }
            if (stop_) return;
            seen = generation_.load();
            job = job_;
        }
        // A worker that wakes after the job finished still finds it here (it is kept until
        // the next run), with every task taken. One that finds no seat left sleeps until the
        // next job instead of polling: the jobs that leave it out come one after another.
        seated = !job || job->seats.fetch_sub(1, std::memory_order_relaxed) > 0;
        if (job && seated) work(*job);
    }
}

void WorkerPool::run(int64_t n_tasks, const std::function<void(int64_t)> &task) {
    if (n_tasks <= 0) return;
    if (workers_.empty() || n_tasks == 1) {
        for (int64_t i = 0; i < n_tasks; ++i) task(i);
        return;
    }
    if (short_slices_ && last_caller_ != std::this_thread::get_id()) {
        set_thread_time_slice(SHORT_TIME_SLICE_NS);
        last_caller_ = std::this_thread::get_id();
    }
    int64_t helpers = (int64_t)workers_.size();
    if (share_ && stage_ == PoolStage::Generator) {
        share_->generator_jobs_.fetch_add(1, std::memory_order_relaxed);
        // The decoder's push takes the other cores: no job for the workers, which soon sleep.
        if (share_->generator_alone()) helpers = 0;
    } else if (share_) {
        helpers = share_->decoder_threads_now(n_threads()) - 1;
    }
    if (helpers == 0) {
        for (int64_t i = 0; i < n_tasks; ++i) task(i);
        return;
    }
    auto job = std::make_shared<Job>();
    job->task = &task;
    job->n_tasks = n_tasks;
    job->seats = helpers;
    bool wake;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        job_ = job;
        generation_.fetch_add(1, std::memory_order_release);
        wake = sleepers_ > 0;
    }
    if (wake && helpers < (int64_t)workers_.size())
        for (int64_t i = 0; i < helpers; ++i) wake_.notify_one();
    else if (wake)
        wake_.notify_all();
    // The caller works too: if every worker is asleep or preempted it does all the tasks
    // itself, and it only ever waits for tasks another thread has already started.
    work(*job);
    for (int i = 0; job->done.load(std::memory_order_acquire) != n_tasks; ++i) {
        if (i < 4096) KAZEIA_CPU_RELAX();
        else std::this_thread::yield();
    }
}

}  // namespace kazeia
