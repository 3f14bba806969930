// kazeia-decoder: decode codes into audio, from a file or streamed through a pipe.
//
//   kazeia-decoder <decoder.gguf> <codes.bin> <T> <out.wav> [--float] [--threads N] [--chunk K]
//                  [--precision f32|bf16]
//   kazeia-decoder <decoder.gguf> --pipe [--threads N] [--precision f32|bf16]
//
// File mode: codes.bin holds T frames of int32 little-endian codes, time-major
// [T][num_quantizers]; --chunk K decodes with the exact streaming decoder, K frames per push (the
// same samples); --precision bf16 multiplies in bf16 (kazeia::DecoderPrecision). The WAV
// (24 kHz mono, 16-bit PCM or 32-bit float) is written to a temporary file beside out.wav and
// renamed into place, so a reader never sees a partial file.
//
// Pipe mode (the engine's subprocess placement, which starts the tool with the synthesis and
// streams): one exact streaming decoder; each message on stdin is a push, a uint32 frame count n
// then n frames of int32 codes (little-endian); its answer on stdout is the push's n * hop_length
// float32 samples. The end of stdin between messages ends the tool (exit 0); anything else that
// goes wrong is one line on stderr and exit 1.
#include <algorithm>
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
#ifdef __linux__
#include <csignal>
#include <sys/prctl.h>
#endif

#include "kazeia/error.h"
#include "kazeia/speech_decoder.h"
#include "tool_io.h"

namespace {

using kazeia::tool::fail;
using kazeia::tool::parse_long;

void usage() {
    std::fprintf(stderr,
                 "usage: kazeia-decoder <decoder.gguf> <codes.bin> <T> <out.wav> [--float] "
                 "[--threads N] [--chunk K] [--precision f32|bf16]\n"
                 "       kazeia-decoder <decoder.gguf> --pipe [--threads N] "
                 "[--precision f32|bf16]\n");
    std::exit(2);
}

// Reads exactly `size` bytes from stdin: false at the end of stdin before the first byte, a
// failure at an end after it (a message cut short).
bool read_exactly(void *data, size_t size, const char *what) {
    size_t got = 0;
    while (got < size) {
        const ssize_t n = read(STDIN_FILENO, static_cast<uint8_t *>(data) + got, size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail(std::string("cannot read stdin: ") + std::strerror(errno));
        if (n == 0) {
            if (got == 0) return false;
            fail(std::string("stdin ended inside ") + what);
        }
        got += (size_t)n;
    }
    return true;
}

void write_all(const void *data, size_t size) {
    size_t done = 0;
    while (done < size) {
        const ssize_t n = write(STDOUT_FILENO, static_cast<const uint8_t *>(data) + done, size - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail(std::string("cannot write stdout: ") + std::strerror(errno));
        done += (size_t)n;
    }
}

// The pipe mode's loop: a push per message until stdin ends (see the top of the file).
void serve_pipe(kazeia::SpeechDecoder &decoder) {
    const auto &hp = decoder.hparams();
    auto stream = decoder.stream();
    constexpr uint32_t max_frames = 1u << 20;
    std::vector<int32_t> codes;
    for (;;) {
        uint32_t n = 0;  // little-endian hosts (x86-64, aarch64), as the file mode
        if (!read_exactly(&n, sizeof n, "a frame count")) return;
        if (n == 0 || n > max_frames)
            fail("a push of " + std::to_string(n) + " frames (expected 1.." +
                 std::to_string(max_frames) + ")");
        codes.resize((size_t)n * hp.num_quantizers);
        read_exactly(codes.data(), codes.size() * sizeof(int32_t), "a push's codes");
        const std::vector<float> pcm = stream->push(codes.data(), n);
        write_all(pcm.data(), pcm.size() * sizeof(float));
    }
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

}  // namespace

int main(int argc, char **argv) {
    kazeia::tool::program() = "kazeia-decoder";
    std::vector<std::string> pos;
    bool as_float = false, pipe = false;
    long threads = 2, chunk = 0;
    std::string precision = "f32";
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--float") as_float = true;
        else if (a == "--pipe") pipe = true;
        else if (a == "--threads" && i + 1 < argc) threads = parse_long(argv[++i], "--threads", 1, 512);
        else if (a == "--chunk" && i + 1 < argc) chunk = parse_long(argv[++i], "--chunk", 1, 1 << 20);
        else if (a == "--precision" && i + 1 < argc) precision = argv[++i];
        else if (a == "-h" || a == "--help") usage();
        else if (a.size() > 1 && a[0] == '-' && a[1] == '-') fail("unknown option " + a);
        else pos.push_back(a);
    }
    if (pos.size() != (pipe ? 1u : 4u)) usage();
    try {
        if (pipe) {
#ifdef __linux__
            // The engine that started us may die without closing our stdin (SIGKILL, a
            // crash): the tool dies with it instead of finishing a push for no one. (A parent
            // gone before this line is caught by the ppid check; the end of stdin catches it
            // too, between pushes.)
            const pid_t parent = getppid();
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) return 0;
#endif
            kazeia::SpeechDecoder decoder(pos[0], (int)threads, false, "cpu",
                                          kazeia::decoder_precision(precision));
            serve_pipe(decoder);
            return 0;
        }
        const long n_frames = parse_long(pos[2].c_str(), "frame count T", 1, 10'000'000);
        kazeia::SpeechDecoder decoder(pos[0], (int)threads, false, "cpu",
                                      kazeia::decoder_precision(precision));
        const auto &hp = decoder.hparams();
        const auto codes = kazeia::tool::read_int32s(
            pos[1], n_frames * hp.num_quantizers,
            std::to_string(n_frames) + " frames of " + std::to_string(hp.num_quantizers) +
                " int32 codes");
        std::vector<float> pcm;
        if (chunk == 0) {
            pcm = decoder.decode(codes.data(), n_frames);
        } else {
            auto stream = decoder.stream();
            for (long at = 0; at < n_frames; at += chunk) {
                const long n = std::min(chunk, n_frames - at);
                const auto part = stream->push(codes.data() + at * hp.num_quantizers, n);
                pcm.insert(pcm.end(), part.begin(), part.end());
            }
        }
        const std::vector<uint8_t> wav = wav_bytes(pcm, hp.sample_rate, as_float);
        kazeia::tool::write_atomically(pos[3], wav.data(), wav.size());
    } catch (const std::exception &e) {
        fail(e.what());
    }
    return 0;
}
