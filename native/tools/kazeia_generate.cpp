// kazeia-generate: the codes of a tokenized prompt, with the talker and code predictor.
//
//   kazeia-generate <talker.gguf> <ids.bin> <N> <out_codes.bin> [--speaker NAME]
//       [--language L] [--non-streaming] [--greedy] [--seed S] [--temperature T] [--top-k K]
//       [--top-p P] [--repetition-penalty R] [--max-frames F] [--threads N]
//       [--kv-cache-type auto|f32|f16]
//
// ids.bin holds the N int32 little-endian ids of the tokenized assistant prompt
// '<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n' (what Generator takes as
// input_ids). out_codes.bin gets T frames of 16 int32 codes, time-major (what kazeia-decoder
// reads), written atomically; T is printed. With kazeia-decoder: the whole engine without
// Python. Unset sampling values come from the model's generation_config.json; the frame cap
// defaults to the engine's budget for the text's length, the K/V cache type to the service's
// (auto).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "kazeia/generator.h"
#include "tool_io.h"

namespace {

using kazeia::tool::fail;
using kazeia::tool::parse_double;
using kazeia::tool::parse_long;

void usage() {
    std::fprintf(stderr,
                 "usage: kazeia-generate <talker.gguf> <ids.bin> <N> <out_codes.bin> "
                 "[--speaker NAME] [--language L] [--non-streaming] [--greedy] [--seed S] "
                 "[--temperature T] [--top-k K] [--top-p P] [--repetition-penalty R] "
                 "[--max-frames F] [--threads N] [--kv-cache-type auto|f32|f16]\n");
    std::exit(2);
}

// The default speaker, as the service chooses it: vivian when the model has her, else the
// first in alphabetical order.
std::string default_speaker(const kazeia::TalkerHParams &hp) {
    const auto &names = hp.speaker_names;
    if (std::find(names.begin(), names.end(), "vivian") != names.end()) return "vivian";
    if (names.empty()) fail("the model has no speakers");
    return names.front();
}

}  // namespace

int main(int argc, char **argv) {
    kazeia::tool::program() = "kazeia-generate";
    std::vector<std::string> pos;
    kazeia::GenerationOptions o;
    std::string speaker, kv_cache_type = kazeia::KV_CACHE_TYPES[0];  // auto
    long threads = 2, max_frames = 0;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> const char * {
            if (i + 1 >= argc) fail(a + " needs a value");
            return argv[++i];
        };
        if (a == "--speaker") speaker = value();
        else if (a == "--language") o.language = value();
        else if (a == "--non-streaming") o.non_streaming = true;
        else if (a == "--greedy") o.greedy = true;
        else if (a == "--seed") o.seed = (uint64_t)parse_long(value(), "--seed", 0, 0x7fffffffL);
        else if (a == "--temperature") o.temperature = (float)parse_double(value(), "--temperature");
        else if (a == "--top-k") o.top_k = (int)parse_long(value(), "--top-k", 0, 1 << 20);
        else if (a == "--top-p") o.top_p = (float)parse_double(value(), "--top-p");
        else if (a == "--repetition-penalty")
            o.repetition_penalty = (float)parse_double(value(), "--repetition-penalty");
        else if (a == "--max-frames") max_frames = parse_long(value(), "--max-frames", 1, 1 << 20);
        else if (a == "--threads") threads = parse_long(value(), "--threads", 1, 512);
        else if (a == "--kv-cache-type") kv_cache_type = value();
        else if (a == "-h" || a == "--help") usage();
        else if (a.size() > 1 && a[0] == '-' && a[1] == '-') fail("unknown option " + a);
        else pos.push_back(a);
    }
    if (pos.size() != 4) usage();
    try {
        const long n_ids = parse_long(pos[2].c_str(), "id count N", 1, 1 << 24);
        const std::vector<int32_t> ids =
            kazeia::tool::read_int32s(pos[1], n_ids, std::to_string(n_ids) + " int32 ids");
        kazeia::Generator generator(pos[0], (int)threads);
        generator.set_kv_cache_type(kv_cache_type);
        o.speaker = speaker.empty() ? default_speaker(generator.hparams()) : speaker;
        o.max_frames = (int)(max_frames ? max_frames : kazeia::frame_budget(generator.text_tokens(ids)));
        std::vector<int32_t> codes;
        auto session = generator.start(ids, o);
        while (auto frame = session->next()) codes.insert(codes.end(), frame->begin(), frame->end());
        kazeia::tool::write_atomically(pos[3], codes.data(), codes.size() * sizeof(int32_t));
        std::printf("%ld\n", (long)session->stats().frames);
    } catch (const std::exception &e) {
        fail(e.what());
    }
    return 0;
}
