#include "mapped_file.h"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kazeia/error.h"

namespace kazeia {

namespace {

// The guarded mappings. A SIGBUS handler is process-wide by nature, so this registry is the
// one piece of process-global state of the engine: a fixed table of atomics that the handler
// reads without locks (registration itself is serialized by a mutex).
struct Slot {
    std::atomic<char *> begin{nullptr};
    std::atomic<size_t> size{0};
    std::atomic<std::atomic<bool> *> damaged{nullptr};
};
constexpr int MAX_MAPPINGS = 64;
Slot g_slots[MAX_MAPPINGS];
std::mutex g_register;
struct sigaction g_previous;
bool g_installed = false;

void on_sigbus(int sig, siginfo_t *info, void *context) {
    char *fault = static_cast<char *>(info->si_addr);
    for (Slot &slot : g_slots) {
        char *begin = slot.begin.load(std::memory_order_acquire);
        const size_t size = slot.size.load(std::memory_order_acquire);
        if (!begin || fault < begin || fault >= begin + size) continue;
        // Zero pages over the rest of the mapping from the faulting page on: the read is
        // retried and completes. mmap is a plain system call, safe in a signal handler.
        const long page = sysconf(_SC_PAGESIZE);
        char *from = begin + ((fault - begin) / page) * page;
        const size_t length = begin + size - from;
        if (mmap(from, length, PROT_READ, MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS, -1, 0) !=
            MAP_FAILED) {
            if (std::atomic<bool> *flag = slot.damaged.load(std::memory_order_acquire))
                flag->store(true, std::memory_order_release);
            return;
        }
        break;
    }
    // Not ours (or the remap failed): what would have happened without us.
    if (g_previous.sa_flags & SA_SIGINFO) {
        if (g_previous.sa_sigaction) return g_previous.sa_sigaction(sig, info, context);
    } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
        return g_previous.sa_handler(sig);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

void guard(char *begin, size_t size, std::atomic<bool> *damaged) {
    std::lock_guard<std::mutex> lock(g_register);
    if (!g_installed) {
        struct sigaction action {};
        action.sa_sigaction = on_sigbus;
        action.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&action.sa_mask);
        sigaction(SIGBUS, &action, &g_previous);
        g_installed = true;
    }
    for (Slot &slot : g_slots) {
        if (slot.begin.load() != nullptr) continue;
        slot.size.store(size, std::memory_order_release);
        slot.damaged.store(damaged, std::memory_order_release);
        slot.begin.store(begin, std::memory_order_release);
        return;
    }
    // A full table leaves the mapping unguarded: it still works, as any mapping does.
}

void unguard(char *begin) {
    std::lock_guard<std::mutex> lock(g_register);
    for (Slot &slot : g_slots) {
        if (slot.begin.load() != begin) continue;
        slot.begin.store(nullptr, std::memory_order_release);
        slot.damaged.store(nullptr, std::memory_order_release);
        slot.size.store(0, std::memory_order_release);
    }
}

}  // namespace

MappedFile::MappedFile(const std::string &path, size_t size) : size_(size) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw ModelError("cannot open " + path + ": " + std::strerror(errno));
    void *map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_errno = errno;
    ::close(fd);
    if (map == MAP_FAILED) throw ModelError("cannot map " + path + ": " + std::strerror(map_errno));
    addr_ = map;
    guard(data(), size_, &damaged_);
}

MappedFile::~MappedFile() {
    unguard(data());
    ::munmap(addr_, size_);
}

}  // namespace kazeia
