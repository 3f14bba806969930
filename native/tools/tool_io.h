// What the command-line tools share: one-line failures, checked numbers, binary files read
// whole and written atomically.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

namespace kazeia::tool {

// The program name, set by main, for the one-line messages.
inline const char *&program() {
    static const char *name = "kazeia";
    return name;
}

[[noreturn]] inline void fail(const std::string &msg) {
    std::fprintf(stderr, "%s: %s\n", program(), msg.c_str());
    std::exit(1);
}

inline long parse_long(const char *s, const char *what, long lo, long hi) {
    char *end = nullptr;
    errno = 0;
    const long v = std::strtol(s, &end, 10);
    if (errno || !end || *end || end == s || v < lo || v > hi)
        fail(std::string("invalid ") + what + " '" + s + "' (expected an integer in " +
             std::to_string(lo) + ".." + std::to_string(hi) + ")");
    return v;
}

inline double parse_double(const char *s, const char *what) {
    char *end = nullptr;
    errno = 0;
    const double v = std::strtod(s, &end);
    if (errno || !end || *end || end == s) fail(std::string("invalid ") + what + " '" + s + "'");
    return v;
}

// `count` little-endian int32 values, the whole of file `path` (little-endian hosts: x86-64,
// aarch64); fails naming the file when its size differs.
inline std::vector<int32_t> read_int32s(const std::string &path, long count, const std::string &what) {
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) fail("cannot open " + path + ": " + std::strerror(errno));
    std::fseek(f, 0, SEEK_END);
    const long size = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    if (size != count * 4L) {
        std::fclose(f);
        fail(path + " has " + std::to_string(size) + " bytes, expected " +
             std::to_string(count * 4L) + " for " + what);
    }
    std::vector<int32_t> values(count);
    const size_t got = std::fread(values.data(), 4, values.size(), f);
    std::fclose(f);
    if (got != values.size()) fail("cannot read " + path);
    return values;
}

// Written to a temporary file beside `path`, then renamed: a reader never sees a partial file.
inline void write_atomically(const std::string &path, const void *data, size_t size) {
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    FILE *f = std::fopen(tmp.c_str(), "wb");
    if (!f) fail("cannot write " + tmp + ": " + std::strerror(errno));
    const bool ok = size == 0 || std::fwrite(data, 1, size, f) == size;
    if (std::fclose(f) != 0 || !ok) {
        std::remove(tmp.c_str());
        fail("cannot write " + tmp + ": " + std::strerror(errno));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string err = std::strerror(errno);
        std::remove(tmp.c_str());
        fail("cannot rename " + tmp + " to " + path + ": " + err);
    }
}

}  // namespace kazeia::tool
