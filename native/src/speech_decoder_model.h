// The speech decoder's layers as its GGUF holds them (SpeechDecoder::Model): the loaded
// weights, bound to one struct per layer kind, and packed for conv_gemm on the CPU. The graph of
// a push (speech_decoder.cpp) reads them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gguf_weights.h"
#include "ggml_raii.h"
#include "kazeia/speech_decoder.h"

#include "ggml.h"

namespace kazeia {

// Residual units of each vocoder block: kernel 7 with these dilations (official code constants).
inline constexpr int RES_KERNEL = 7;
inline constexpr int RES_DILATIONS[3] = {1, 3, 9};
inline constexpr int DWCONV_KERNEL = 7;
// Input columns a frame from which a conv's f16 weights are held in f32 (see
// add_f32_weights).
inline constexpr int64_t WIDE_MIN_COLUMNS = 32;

struct Conv {
    // [k * in, out]; its data discarded where winograd is set, an f32 copy of the file's f16
    // where the model widens it (add_f32_weights)
    ggml_tensor *w = nullptr;
    ggml_tensor *b = nullptr;  // [out] or null
    int64_t k = 1, in = 0, out = 0;
    bool packed = false;       // w rewritten for conv_gemm (see ops.h)
    ggml_tensor *winograd = nullptr;  // the taps in conv_winograd's form (ops.h), or null
};

struct Snake {
    ggml_tensor *alpha = nullptr, *inv_beta = nullptr;
};

struct TfmLayer {
    ggml_tensor *attn_norm, *attn_scale, *ffn_norm, *ffn_scale;
    Conv q, k, v, o, gate, up, down;  // linear layers (1-tap convs without bias)
};

struct Upsample {
    Conv trans;  // one-tap transposed conv: w [in, r * out]
    int64_t r = 1;
    ggml_tensor *dw_w, *dw_b, *norm_w, *norm_b, *gamma;
    Conv pw1, pw2;  // pointwise MLP (linear layers: 1-tap convs)
};

struct ResUnit {
    Snake snake1;
    Conv conv1;
    int dilation = 1;
    Snake snake2;
    Conv conv2;
};

struct VocoderBlock {
    Snake snake;
    Conv up;  // two-tap transposed conv: w [2 * in, r * out]
    int64_t r = 1;
    ResUnit res[3];
};

// The hyper-parameters of a decoder file, checked, and its tensor table against them.
DecoderHParams read_checked_decoder_hparams(const GgufWeights &weights);

struct SpeechDecoder::Model {
    std::string device;  // "cpu" or a GPU (devices.h): where the weights live and streams compute
    GgufWeights weights;
    DecoderHParams hp;
    int n_threads;
    bool polite = false;
    std::shared_ptr<CoreShare> core_share;  // marked by the CPU streams' pushes
    Conv rvq_first_out, rvq_rest_out;  // 1-tap convs without bias
    std::vector<ggml_tensor *> codebooks;
    Conv pre_conv, in_proj, out_proj;
    ggml_tensor *tfm_norm;
    std::vector<TfmLayer> layers;
    std::vector<Upsample> upsample;
    Conv conv_in, conv_out;
    std::vector<VocoderBlock> blocks;
    Snake snake_out;

    DecoderPrecision precision;  // of the packed weights (F32 on a GPU, which has none)
    // The residual units' first convs in Winograd's form and the compute-bound convs' f16
    // weights widened (add_f32_weights): extra memory for fewer operations.
    GgmlContextPtr f32_ctx;
    BufferPtr f32_buffer;

    Model(const std::string &path, int threads, const std::string &device_id,
          DecoderPrecision precision);

  private:
    void pack_weights();
    void add_f32_weights();
    std::vector<int64_t> vocoder_columns() const;
    void bind_tensors();
};

}  // namespace kazeia
