// Speech decoder: RVQ codes [T, 16] -> 24 kHz waveform, in one call or as an exact stream.
//
// Every layer of the decoder is causal, so a stream that keeps each layer's left context
// (conv inputs, the attention window's keys and values) computes exactly the samples of a
// single full pass. The full decode is such a stream, fed in bounded chunks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kazeia/core_share.h"
#include "kazeia/hparams.h"

namespace kazeia {

class DecoderStream;

// How the decoder's convolutions and linear layers multiply on the CPU. F32: in f32 (f16
// weights widened), the official model's arithmetic. BF16: weights and inputs rounded to bf16,
// products summed in f32: on AMX tiles where the CPU has AMX-BF16 (several times the f32 rate),
// with AVX512_BF16's pair dot products on AMD CPUs that have them, elsewhere on the vector units
// (the same values; sums in another order, so outputs differ from AMX's within rounding).
// Streams stay exact either way. A GPU decoder ignores it.
enum class DecoderPrecision { F32, BF16 };
// Their names, in the enum's order ("f32", "bf16"), and a name's value (InputError listing them
// otherwise).
inline constexpr const char *DECODER_PRECISIONS[] = {"f32", "bf16"};
DecoderPrecision decoder_precision(const std::string &name);

class SpeechDecoder {
  public:
    // Loads `decoder.gguf`. `n_threads` compute threads are owned by each stream.
    // `polite`: see WorkerPool (set when another engine stage computes at the same time).
    // `device`: where its weights live and its streams compute, a placement of devices.h
    // ("cpu", "vulkan:0", "auto", ...; InputError listing the devices when absent).
    // `core_share`: the one the engine's generator has (core_share.h), or none; a CPU
    // stream's pushes mark themselves in it.
    SpeechDecoder(const std::string &path, int n_threads, bool polite = false,
                  const std::string &device = "cpu",
                  DecoderPrecision precision = DecoderPrecision::F32,
                  std::shared_ptr<CoreShare> core_share = nullptr);
    ~SpeechDecoder();
    SpeechDecoder(const SpeechDecoder &) = delete;
    SpeechDecoder &operator=(const SpeechDecoder &) = delete;

    const DecoderHParams &hparams() const;
    int n_threads() const;
    bool polite() const;
    const std::string &device() const;  // the resolved device ("cpu", "vulkan:0", ...)
    const std::shared_ptr<CoreShare> &core_share() const;
    DecoderPrecision precision() const;

    // codes: time-major [n_frames][num_quantizers]; returns n_frames * hop_length samples.
    std::vector<float> decode(const int32_t *codes, int64_t n_frames) const;

    // A new stream at position 0. The decoder must outlive it.
    std::unique_ptr<DecoderStream> stream() const;

    struct Model;  // weights and hparams (private to the implementation)

  private:
    std::unique_ptr<Model> model_;
};

class DecoderStream {
  public:
    ~DecoderStream();
    DecoderStream(const DecoderStream &) = delete;
    DecoderStream &operator=(const DecoderStream &) = delete;

    // Feeds the next n_frames (>= 1) frames; returns exactly their n_frames * hop_length
    // samples. Thread-safe (calls on one stream are serialized).
    std::vector<float> push(const int32_t *codes, int64_t n_frames);
    // Back to position 0 with empty history.
    void reset();
    // The stream's whole state (every layer's left context and the position): a stream that
    // restores it continues exactly from that point, e.g. after a cloned voice's reference
    // codes, which then need not be decoded again.
    std::vector<uint8_t> save() const;
    // A state saved from a stream of the same decoder (InputError otherwise).
    void restore(const std::vector<uint8_t> &state);
    int64_t frames_pushed() const;
    const DecoderHParams &hparams() const;

    struct State;

  private:
    friend class SpeechDecoder;
    explicit DecoderStream(const SpeechDecoder::Model &model);
    std::unique_ptr<State> state_;
};

// The hyper-parameters of a decoder GGUF (sample rate, hop, codebooks, ...), checked as a load
// checks the file (header, metadata, tensor table, size) without reading the weights: for a
// process that needs the decoder's facts but does not decode.
DecoderHParams read_decoder_hparams(const std::string &path);

// The instruction sets the engine's own kernels (SnakeBeta, conv_gemm, the windowed attention;
// then the q8_0 prefill GEMM's path) run here, e.g. "AVX2 FMA F16C, q8_0 prefill AVX-512 VNNI"
// (start banners).
const char *kernel_isa();

// Where DecoderPrecision::BF16's products run on this CPU: "AMX", "AVX-512 BF16", else the
// vector or portable loops (start banners).
const char *decoder_bf16_isa();

// Whether this CPU has the AMX-BF16 tiles DecoderPrecision::BF16's products would run on,
// without asking the system for them as decoder_bf16_isa() does (an f32 process never asks).
bool cpu_has_amx_bf16();

// Largest number of frames one graph evaluates; longer pushes are split (memory bound).
inline constexpr int64_t DECODER_MAX_CHUNK_FRAMES = 16;
// On a GPU every graph evaluates exactly this many frames, a longer push split and a shorter
// one padded (see push_chunk). The service's pushes are this many frames (its default stream
// chunk and its one-pass decode's pushes: wyoming_kazeia/settings.py and engine.py read it
// through the Python module), and a GPU's time goes to a graph's dispatches more than to its
// width, so a wider graph would only compute padding.
inline constexpr int64_t DECODER_GPU_CHUNK_FRAMES = 4;

}  // namespace kazeia
