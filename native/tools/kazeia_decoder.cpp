// kazeia-decoder: decode a file of codes into a WAV file.
//
//   kazeia-decoder <decoder.gguf> <codes.bin> <T> <out.wav> [--float] [--threads N]
//
// codes.bin holds T frames of int32 little-endian codes, time-major [T][num_quantizers].
// The WAV (24 kHz mono, 16-bit PCM or 32-bit float) is written to a temporary file beside
// out.wav and renamed into place, so a reader never sees a partial file.
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <unistd.h>

#include "kazeia/error.h"
#include "kazeia/speech_decoder.h"

namespace {

[[noreturn]] void fail(const std::string &msg) {
    std::fprintf(stderr, "kazeia-decoder: %s\n", msg.c_str());
    std::exit(1);
}

void usage() {
    std::fprintf(stderr,
                 "usage: kazeia-decoder <decoder.gguf> <codes.bin> <T> <out.wav> [--float] "
                 "[--threads N]\n");
    std::exit(2);
}

long parse_long(const char *s, const char *what, long lo, long hi) {
    char *end = nullptr;
    errno = 0;
    const long v = std::strtol(s, &end, 10);
    if (errno || !end || *end || end == s || v < lo || v > hi)
        fail(std::string("invalid ") + what + " '" + s + "' (expected an integer in " +
             std::to_string(lo) + ".." + std::to_string(hi) + ")");
    return v;
}

std::vector<int32_t> read_codes(const std::string &path, long n_frames, int n_q) {
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) fail("cannot open " + path + ": " + std::strerror(errno));
    std::fseek(f, 0, SEEK_END);
    const long size = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    const long expected = n_frames * n_q * 4L;
    if (size != expected) {
        std::fclose(f);
        fail(path + " has " + std::to_string(size) + " bytes, expected " +
             std::to_string(expected) + " for " + std::to_string(n_frames) + " frames of " +
             std::to_string(n_q) + " int32 codes");
    }
    std::vector<int32_t> codes(n_frames * n_q);
    const size_t got = std::fread(codes.data(), 4, codes.size(), f);
    std::fclose(f);
    if (got != codes.size()) fail("cannot read " + path);
    return codes;  // little-endian host assumed (x86-64, aarch64)
}

void put_u32(std::vector<uint8_t> &b, uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back((v >> (8 * i)) & 0xff);
}
void put_u16(std::vector<uint8_t> &b, uint16_t v) {
    b.push_back(v & 0xff);
    b.push_back(v >> 8);
}

std::vector<uint8_t> wav_bytes(const std::vector<float> &pcm, uint32_t rate, bool as_float) {
    const uint16_t bits = as_float ? 32 : 16, fmt = as_float ? 3 : 1;
    const uint32_t data_bytes = (uint32_t)(pcm.size() * (bits / 8));
    std::vector<uint8_t> b;
    b.reserve(44 + data_bytes);
    b.insert(b.end(), {'R', 'I', 'F', 'F'});
    put_u32(b, 36 + data_bytes);
    b.insert(b.end(), {'W', 'A', 'V', 'E', 'f', 'm', 't', ' '});
    put_u32(b, 16);
    put_u16(b, fmt);
    put_u16(b, 1);
    put_u32(b, rate);
    put_u32(b, rate * bits / 8);
    put_u16(b, bits / 8);
    put_u16(b, bits);
    b.insert(b.end(), {'d', 'a', 't', 'a'});
    put_u32(b, data_bytes);
    for (float x : pcm) {
        if (as_float) {
            uint32_t u;
            std::memcpy(&u, &x, 4);
            put_u32(b, u);
        } else {
            // Same conversion as the Python side: clip, scale by 32767, round to nearest.
            const float c = x < -1.0f ? -1.0f : (x > 1.0f ? 1.0f : x);
            put_u16(b, (uint16_t)(int16_t)std::lrint(c * 32767.0f));
        }
    }
    return b;
}

void write_atomically(const std::string &path, const std::vector<uint8_t> &bytes) {
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    FILE *f = std::fopen(tmp.c_str(), "wb");
    if (!f) fail("cannot write " + tmp + ": " + std::strerror(errno));
    const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
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

}  // namespace

int main(int argc, char **argv) {
    std::vector<std::string> pos;
    bool as_float = false;
    long threads = 2;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--float") as_float = true;
        else if (a == "--threads" && i + 1 < argc) threads = parse_long(argv[++i], "--threads", 1, 512);
        else if (a == "-h" || a == "--help") usage();
        else if (a.size() > 1 && a[0] == '-' && a[1] == '-') fail("unknown option " + a);
        else pos.push_back(a);
    }
    if (pos.size() != 4) usage();
    try {
        const long n_frames = parse_long(pos[2].c_str(), "frame count T", 1, 10'000'000);
        kazeia::SpeechDecoder decoder(pos[0], (int)threads);
        const auto &hp = decoder.hparams();
        const auto codes = read_codes(pos[1], n_frames, (int)hp.num_quantizers);
        const std::vector<float> pcm = decoder.decode(codes.data(), n_frames);
        write_atomically(pos[3], wav_bytes(pcm, hp.sample_rate, as_float));
    } catch (const std::exception &e) {
        fail(e.what());
    }
    return 0;
}
