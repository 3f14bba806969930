// kazeia-decoder: decode a file of codes into a WAV file.
//
//   kazeia-decoder <decoder.gguf> <codes.bin> <T> <out.wav> [--float] [--threads N] [--chunk K]
//
// --chunk K decodes with the exact streaming decoder, K frames per push (the same samples).
// codes.bin holds T frames of int32 little-endian codes, time-major [T][num_quantizers].
// The WAV (24 kHz mono, 16-bit PCM or 32-bit float) is written to a temporary file beside
// out.wav and renamed into place, so a reader never sees a partial file.
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

#include "kazeia/error.h"
#include "kazeia/speech_decoder.h"
#include "tool_io.h"

namespace {

using kazeia::tool::fail;
using kazeia::tool::parse_long;

void usage() {
    std::fprintf(stderr,
                 "usage: kazeia-decoder <decoder.gguf> <codes.bin> <T> <out.wav> [--float] "
                 "[--threads N] [--chunk K]\n");
    std::exit(2);
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
    bool as_float = false;
    long threads = 2, chunk = 0;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--float") as_float = true;
        else if (a == "--threads" && i + 1 < argc) threads = parse_long(argv[++i], "--threads", 1, 512);
        else if (a == "--chunk" && i + 1 < argc) chunk = parse_long(argv[++i], "--chunk", 1, 1 << 20);
        else if (a == "-h" || a == "--help") usage();
        else if (a.size() > 1 && a[0] == '-' && a[1] == '-') fail("unknown option " + a);
        else pos.push_back(a);
    }
    if (pos.size() != 4) usage();
    try {
        const long n_frames = parse_long(pos[2].c_str(), "frame count T", 1, 10'000'000);
        kazeia::SpeechDecoder decoder(pos[0], (int)threads);
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
