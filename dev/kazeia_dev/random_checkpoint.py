"""Write a random-weight Qwen3-TTS 12 Hz checkpoint in the official Hugging Face layout.

Real weights cannot be downloaded on our machines, so the loading code, the converter and the
native engine are tested on checkpoints made here: every file, key, tensor name, shape and dtype
is the official one, only the numbers are random (drawn at meaningful scales so that nothing is
silent, saturated or trivially symmetric).

    script/random-checkpoint OUT_DIR --size tiny|tiny-1.7b|0.6b|1.7b \
        [--variant custom_voice|base|voice_design] [--seed N]

Sizes:
  ``tiny`` (alias ``tiny-0.6b``)  the layout of the tiny reference checkpoints (talker hidden 16 ==
                                  code-predictor hidden 16: identity ``small_to_mtp_projection``)
  ``tiny-1.7b``                   talker hidden 32 != code-predictor hidden 16 (Linear projection)
  ``0.6b`` / ``1.7b``             the real full-size hyper-parameters (talker tensors in bf16)

Written files: ``config.json``, ``generation_config.json``, ``model.safetensors``, ``vocab.json``,
``merges.txt``, ``tokenizer_config.json`` and ``speech_tokenizer/{config.json, model.safetensors,
preprocessor_config.json}``. Tensors are generated and written one at a time, in row chunks, so
even the 1.7B checkpoint (about 4 GB) is produced in bounded memory. Each tensor has its own random
stream derived from (seed, tensor name): the output is a pure function of size, variant and seed.

Where the full-size values come from (the published config.json files are not stored in this
repository and cannot be downloaded here):
  * talker / code predictor / speaker encoder ``enc_dim`` / token ids: docs/model.md ("Sizes")
    and the tiny reference config.json (ids), cross-checked with several public re-implementations
    that quote the published Qwen3-TTS-12Hz-{0.6B,1.7B}-{CustomVoice,Base} config.json (28 layers,
    16/8 heads, head_dim 128, hidden 1024/2048, SwiGLU 3072/6144, text_hidden 2048, max positions
    32768 (talker) / 65536 (code predictor), rope_theta 1e6, M-RoPE [24, 20, 20] interleaved,
    position_id_per_seconds 13, speaker encoder enc_dim 1024 (0.6B) / 2048 (1.7B)).
  * speech tokenizer decoder: docs/model.md ("The speech decoder") and the official code defaults,
    cross-checked with public copies of Qwen3-TTS-Tokenizer-12Hz's config.json (codebook_dim 512,
    latent 1024, hidden 512, 8 layers, 16x64 heads, SwiGLU 1024, window 72, decoder_dim 1536,
    semantic_codebook_size 4096, vector_quantization_hidden_dimension 512).
  * speech tokenizer encoder (Mimi): the same public copies (hidden 512, 64 filters, ratios
    [8, 6, 5, 4], 8 layers, 8x64 heads, MLP 2048, 32 quantizers of 2048 x 256, window 250); they
    agree with the transformers ``MimiConfig`` defaults of kyutai/mimi.
  * ECAPA speaker encoder channels / kernels (Base only): the official code defaults
    (``Qwen3TTSSpeakerEncoderConfig``), which the published config.json does not override.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import re
import struct
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

SIZES: tuple[str, ...] = ("tiny", "tiny-0.6b", "tiny-1.7b", "0.6b", "1.7b")
VARIANTS: tuple[str, ...] = ("custom_voice", "base", "voice_design")
DEFAULT_SEED = 0

MODEL_FILE = "model.safetensors"
SPEECH_TOKENIZER_FILE = "speech_tokenizer/model.safetensors"

_TRANSFORMERS_VERSION = "4.57.3"
_CHUNK_ELEMS = 1 << 22  # elements generated per chunk (16 MiB of float32)
_PROGRESS_MIN_BYTES = 64 << 20  # files smaller than this are written without progress lines

# ---------------------------------------------------------------------------------------------
# Token ids (authoritative: the tiny reference config.json == the published ones)
# ---------------------------------------------------------------------------------------------

IM_START_ID = 151644
IM_END_ID = 151645
TTS_PAD_ID = 151671
TTS_BOS_ID = 151672
TTS_EOS_ID = 151673
ASSISTANT_ID = 77091

CODEC_LANGUAGE_ID: dict[str, int] = {
    "chinese": 2055,
    "english": 2050,
    "german": 2053,
    "italian": 2070,
    "portuguese": 2071,
    "spanish": 2054,
    "japanese": 2058,
    "korean": 2064,
    "french": 2061,
    "russian": 2069,
    "beijing_dialect": 2074,
    "sichuan_dialect": 2062,
}
SPEAKER_ID: dict[str, int] = {
    "serena": 3066,
    "vivian": 3065,
    "uncle_fu": 3010,
    "ryan": 3061,
    "aiden": 2861,
    "ono_anna": 2873,
    "sohee": 2864,
    "eric": 2875,
    "dylan": 2878,
}
SPEAKER_IS_DIALECT: dict[str, str | bool] = {
    "serena": False,
    "vivian": False,
    "uncle_fu": False,
    "ryan": False,
    "aiden": False,
    "ono_anna": False,
    "sohee": False,
    "eric": "sichuan_dialect",
    "dylan": "beijing_dialect",
}

# The added tokens of the Qwen2/Qwen3 tokenizer as extended for Qwen3-Omni / Qwen3-TTS, from
# <|endoftext|> = 151643 on. ``False`` marks the ones Qwen lists with "special": false.
ADDED_TOKENS_START = 151643
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),  # 151671 == tts_pad_token_id
    ("<tts_text_bos>", True),  # 151672 == tts_bos_token_id
    ("<tts_text_eod>", True),  # 151673 == tts_eos_token_id
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)

# Byte-level tokens whose real Qwen2 ids are known (each checked against several public
# tokenizations, e.g. "<|im_start|>user\n" -> [151644, 872, 198], "Hello world" -> [9707, 1879],
# "Hello\nworld" -> [9707, 198, 14615]). They are given these ids here so that prompts look like
# real ones; every other token gets an arbitrary id.
KNOWN_TOKEN_IDS: dict[str, int] = {
    "assistant": ASSISTANT_ID,
    "system": 8948,
    "user": 872,
    "Hello": 9707,
    "\u0120world": 1879,  # " world"
    "world": 14615,
}

# ---------------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------------


def _canonical_size(size: str) -> str:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {', '.join(SIZES)}")
    return "tiny-0.6b" if size == "tiny" else size


def _talker_config(
    *,
    hidden: int,
    intermediate: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    text_hidden: int,
    mrope_section: list[int],
    code_predictor: dict[str, Any],
    variant: str,
) -> dict[str, Any]:
    custom = variant == "custom_voice"
    return {
        "vocab_size": 3072,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
        "rope_scaling": {
            "interleaved": True,
            "mrope_section": mrope_section,
            "rope_type": "default",
            "type": "default",
        },
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "num_code_groups": 16,
        "text_vocab_size": 151936,
        "text_hidden_size": text_hidden,
        "codec_bos_id": 2149,
        "codec_eos_token_id": 2150,
        "codec_pad_id": 2148,
        "codec_think_id": 2154,
        "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157,
        # Only CustomVoice has the dialect speakers, hence the dialect language entries.
        "codec_language_id": {
            name: code
            for name, code in CODEC_LANGUAGE_ID.items()
            if custom or not name.endswith("_dialect")
        },
        # Base (voice clone) and VoiceDesign checkpoints carry no preset speakers; the official
        # code still reads spk_id.keys(), so it is an empty mapping rather than absent.
        "spk_id": dict(SPEAKER_ID) if custom else {},
        "spk_is_dialect": dict(SPEAKER_IS_DIALECT) if custom else {},
        "position_id_per_seconds": 13,
        "initializer_range": 0.02,
        "code_predictor_config": code_predictor,
    }


def _code_predictor_config(
    *, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, head_dim: int
) -> dict[str, Any]:
    return {
        "vocab_size": 2048,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 65536,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "attention_bias": False,
        "use_sliding_window": False,
        "num_code_groups": 16,
        "initializer_range": 0.02,
        "layer_types": ["full_attention"] * layers,
    }


def model_config(size: str, variant: str = "custom_voice") -> dict[str, Any]:
    """The top-level config.json for ``size`` and ``variant``."""
    size = _canonical_size(size)
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    tiny = size.startswith("tiny")
    if tiny:
        # The tiny reference checkpoints: only the widths are small.
        hidden = 16 if size == "tiny-0.6b" else 32
        code_predictor = _code_predictor_config(
            hidden=16, intermediate=32, layers=2, heads=4, kv_heads=2, head_dim=8
        )
        talker = _talker_config(
            hidden=hidden,
            intermediate=64,
            layers=3,
            heads=4,
            kv_heads=2,
            head_dim=16,
            text_hidden=8,
            mrope_section=[3, 3, 2],
            code_predictor=code_predictor,
            variant=variant,
        )
        if variant == "base":
            # A small ECAPA-TDNN (the default one is 23M parameters); enc_dim must equal the talker
            # hidden size because the speaker embedding is fed as a codec-embedding row.
            speaker_encoder: dict[str, Any] = {
                "mel_dim": 128,
                "enc_dim": hidden,
                "enc_channels": [32, 32, 32, 32, 96],
                "enc_kernel_sizes": [5, 3, 3, 3, 1],
                "enc_dilations": [1, 2, 3, 4, 1],
                "enc_attention_channels": 16,
                "enc_res2net_scale": 8,
                "enc_se_channels": 16,
                "sample_rate": 24000,
            }
        else:
            speaker_encoder = {"enc_dim": 1024, "sample_rate": 24000}  # as in the tiny reference
    else:
        hidden = 1024 if size == "0.6b" else 2048
        code_predictor = _code_predictor_config(
            hidden=1024, intermediate=3072, layers=5, heads=16, kv_heads=8, head_dim=128
        )
        talker = _talker_config(
            hidden=hidden,
            intermediate=3072 if size == "0.6b" else 6144,
            layers=28,
            heads=16,
            kv_heads=8,
            head_dim=128,
            text_hidden=2048,
            mrope_section=[24, 20, 20],
            code_predictor=code_predictor,
            variant=variant,
        )
        speaker_encoder = {"enc_dim": hidden, "sample_rate": 24000}
    config: dict[str, Any] = {
        "model_type": "qwen3_tts",
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": "0b6" if size in ("tiny-0.6b", "0.6b") else "1b7",
        "tts_model_type": variant,
        "im_start_token_id": IM_START_ID,
        "im_end_token_id": IM_END_ID,
        "tts_pad_token_id": TTS_PAD_ID,
        "tts_bos_token_id": TTS_BOS_ID,
        "tts_eos_token_id": TTS_EOS_ID,
        "assistant_token_id": ASSISTANT_ID,
        "talker_config": talker,
        "speaker_encoder_config": speaker_encoder,
        "torch_dtype": "float32" if tiny else "bfloat16",
        "transformers_version": _TRANSFORMERS_VERSION,
    }
    if variant == "voice_design":
        del config["speaker_encoder_config"]  # the published VoiceDesign config has none
    return config


def speech_tokenizer_config(size: str) -> dict[str, Any]:
    """speech_tokenizer/config.json (the same Qwen3-TTS-Tokenizer-12Hz for 0.6B and 1.7B)."""
    tiny = _canonical_size(size).startswith("tiny")
    encoder: dict[str, Any] = {
        "audio_channels": 1,
        "sampling_rate": 24000,
        "frame_rate": 12.5,
        "hidden_size": 16 if tiny else 512,
        "num_filters": 4 if tiny else 64,
        "num_residual_layers": 1,
        "upsampling_ratios": [8, 6, 5, 4],
        "kernel_size": 7,
        "last_kernel_size": 3,
        "residual_kernel_size": 3,
        "dilation_growth_rate": 2,
        "use_causal_conv": True,
        "pad_mode": "constant",
        "compress": 2,
        "trim_right_ratio": 1.0,
        "codebook_size": 2048,
        "codebook_dim": 8 if tiny else 256,
        "num_quantizers": 16 if tiny else 32,
        "use_conv_shortcut": False,
        "vector_quantization_hidden_dimension": 8 if tiny else 256,
        "num_semantic_quantizers": 1,
        "upsample_groups": 16 if tiny else 512,
        "num_hidden_layers": 1 if tiny else 8,
        "intermediate_size": 32 if tiny else 2048,
        "num_attention_heads": 2 if tiny else 8,
        "num_key_value_heads": 2 if tiny else 8,
        "head_dim": 8 if tiny else 64,
        "max_position_embeddings": 8000,
        "sliding_window": 250,
        "rope_theta": 10000.0,
        "layer_scale_initial_scale": 0.01,
        "norm_eps": 1e-05,
        "hidden_act": "gelu",
        "attention_bias": False,
    }
    decoder: dict[str, Any] = {
        "codebook_size": 2048,
        "codebook_dim": 16 if tiny else 512,
        "hidden_size": 32 if tiny else 512,
        "head_dim": 16 if tiny else 64,
        "latent_dim": 32 if tiny else 1024,
        "max_position_embeddings": 8000,
        "rope_theta": 10000,
        "num_attention_heads": 2 if tiny else 16,
        "num_key_value_heads": 2 if tiny else 16,
        "attention_bias": False,
        "sliding_window": 72,
        "intermediate_size": 64 if tiny else 1024,
        "hidden_act": "silu",
        "layer_scale_initial_scale": 0.01,
        "rms_norm_eps": 1e-05,
        "num_hidden_layers": 8,
        "num_quantizers": 16,
        "num_semantic_quantizers": 1,
        "semantic_codebook_size": 4096,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "decoder_dim": 64 if tiny else 1536,
        "attention_dropout": 0.0,
    }
    if not tiny:
        # Present in the published file, unused by the official code (the decoder's quantizer
        # width is codebook_dim // 2).
        decoder["vector_quantization_hidden_dimension"] = 512
    return {
        "model_type": "qwen3_tts_tokenizer_12hz",
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "encoder_config": encoder,
        "decoder_config": decoder,
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
        "torch_dtype": "float32",
        "transformers_version": _TRANSFORMERS_VERSION,
    }


def generation_config() -> dict[str, Any]:
    """generation_config.json (sampling defaults: docs/model.md, "Sampling")."""
    return {
        "do_sample": True,
        "repetition_penalty": 1.05,
        "temperature": 0.9,
        "top_p": 1.0,
        "top_k": 50,
        "subtalker_dosample": True,
        "subtalker_temperature": 0.9,
        "subtalker_top_p": 1.0,
        "subtalker_top_k": 50,
        "max_new_tokens": 8192,
    }


def preprocessor_config() -> dict[str, Any]:
    """speech_tokenizer/preprocessor_config.json."""
    return {
        "feature_extractor_type": "EncodecFeatureExtractor",
        "feature_size": 1,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": True,
        "sampling_rate": 24000,
    }


# ---------------------------------------------------------------------------------------------
# Tensor specifications
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Init:
    """How a tensor's values are drawn.

    kind: ``normal`` (mean ``a``, std ``b``), ``uniform`` (``a``..``b``), ``const`` (``a``) or
    ``codebook`` (rows ~ N(0, ``b``) scaled by the ``ref`` usage tensor, so that
    embedding_sum / cluster_usage has standard deviation ``b``).
    """

    kind: str
    a: float = 0.0
    b: float = 0.0
    ref: TensorSpec | None = None


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype: "F32" or "BF16"
    init: Init

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.numel * _DTYPE_BYTES[self.dtype]


_DTYPE_BYTES = {"F32": 4, "BF16": 2}

# Scales. Linear and conv weights are N(0, gain / sqrt(fan_in)); embeddings N(0, 1).
_BIAS_STD = 0.05
_NORM_STD = 0.1  # norm weights are 1 + N(0, 0.1)
_SNAKE_STD = 0.1  # SnakeBeta log-alpha / log-beta
_LAYER_SCALE = (0.01, 0.1)
_CONVNEXT_GAMMA = (0.05, 0.15)
_USAGE = (0.5, 2.0)
# The vocoder's residual units add to their input, so the signal grows block after block; a
# smaller gain on each unit's last conv keeps the growth moderate, and the last conv is scaled so
# that random codes decode to an RMS of roughly 0.1..0.2 (clamp at +-1): see the tests.
_RESIDUAL_OUT_GAIN = 0.5
_FINAL_CONV_GAIN = 0.025
_FINAL_BIAS_STD = 0.005  # the waveform's DC offset


class _Specs:
    """Collects TensorSpecs with the initialisation conventions above."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.items: list[TensorSpec] = []

    def add(self, name: str, shape: Sequence[int], init: Init) -> TensorSpec:
        spec = TensorSpec(name, tuple(int(d) for d in shape), self.dtype, init)
        self.items.append(spec)
        return spec

    def normal(self, name: str, shape: Sequence[int], std: float, mean: float = 0.0) -> None:
        self.add(name, shape, Init("normal", mean, std))

    def linear(self, prefix: str, out_f: int, in_f: int, bias: bool, gain: float = 1.0) -> None:
        self.normal(f"{prefix}.weight", (out_f, in_f), gain / np.sqrt(in_f))
        if bias:
            self.normal(f"{prefix}.bias", (out_f,), _BIAS_STD)

    def conv(
        self,
        prefix: str,
        out_ch: int,
        in_ch: int,
        k: int,
        bias: bool = True,
        groups: int = 1,
        gain: float = 1.0,
        bias_std: float = _BIAS_STD,
    ) -> None:
        fan_in = in_ch // groups * k
        self.normal(f"{prefix}.weight", (out_ch, in_ch // groups, k), gain / np.sqrt(fan_in))
        if bias:
            self.normal(f"{prefix}.bias", (out_ch,), bias_std)

    def trans_conv(self, prefix: str, in_ch: int, out_ch: int, k: int, stride: int) -> None:
        # ConvTranspose1d weight is [in, out, k]; each output sample sums k / stride taps.
        self.normal(f"{prefix}.weight", (in_ch, out_ch, k), 1.0 / np.sqrt(in_ch * k / stride))
        self.normal(f"{prefix}.bias", (out_ch,), _BIAS_STD)

    def embedding(self, name: str, rows: int, dim: int) -> None:
        self.normal(name, (rows, dim), 1.0)

    def norm(self, name: str, dim: int) -> None:
        self.normal(name, (dim,), _NORM_STD, mean=1.0)

    def layer_norm(self, prefix: str, dim: int) -> None:
        self.norm(f"{prefix}.weight", dim)
        self.normal(f"{prefix}.bias", (dim,), _BIAS_STD)

    def uniform(self, name: str, shape: Sequence[int], lo: float, hi: float) -> None:
        self.add(name, shape, Init("uniform", lo, hi))

    def snake(self, prefix: str, dim: int) -> None:
        self.normal(f"{prefix}.alpha", (dim,), _SNAKE_STD)
        self.normal(f"{prefix}.beta", (dim,), _SNAKE_STD)

    def attention(self, prefix: str, hidden: int, cfg: dict[str, Any]) -> None:
        """q/k/v/o projections of a grouped-query attention block (no biases)."""
        heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.linear(f"{prefix}.q_proj", heads * hd, hidden, bias=False)
        self.linear(f"{prefix}.k_proj", kv * hd, hidden, bias=False)
        self.linear(f"{prefix}.v_proj", kv * hd, hidden, bias=False)
        self.linear(f"{prefix}.o_proj", hidden, heads * hd, bias=False)

    def codebook(
        self, usage_name: str, sum_name: str, size: int, dim: int, std: float = 1.0
    ) -> None:
        usage = self.add(usage_name, (size,), Init("uniform", *_USAGE))
        self.add(sum_name, (size, dim), Init("codebook", 0.0, std, usage))


def _qwen3_layer(s: _Specs, p: str, hidden: int, cfg: dict[str, Any], qk_norm: bool) -> None:
    hd, inter = cfg["head_dim"], cfg["intermediate_size"]
    s.norm(f"{p}.input_layernorm.weight", hidden)
    s.attention(f"{p}.self_attn", hidden, cfg)
    if qk_norm:
        s.norm(f"{p}.self_attn.q_norm.weight", hd)
        s.norm(f"{p}.self_attn.k_norm.weight", hd)
    s.norm(f"{p}.post_attention_layernorm.weight", hidden)
    s.linear(f"{p}.mlp.gate_proj", inter, hidden, bias=False)
    s.linear(f"{p}.mlp.up_proj", inter, hidden, bias=False)
    s.linear(f"{p}.mlp.down_proj", hidden, inter, bias=False)


def _speaker_encoder_specs(s: _Specs, cfg: dict[str, Any]) -> None:
    """ECAPA-TDNN of the Base models (``Qwen3TTSSpeakerEncoder``); missing keys take the official
    ``Qwen3TTSSpeakerEncoderConfig`` defaults."""
    mel = cfg.get("mel_dim", 128)
    enc_dim = cfg.get("enc_dim", 1024)
    ch = cfg.get("enc_channels", [512, 512, 512, 512, 1536])
    ks = cfg.get("enc_kernel_sizes", [5, 3, 3, 3, 1])
    att = cfg.get("enc_attention_channels", 128)
    scale = cfg.get("enc_res2net_scale", 8)
    se = cfg.get("enc_se_channels", 128)
    p = "speaker_encoder"
    s.conv(f"{p}.blocks.0.conv", ch[0], mel, ks[0])
    for i in range(1, len(ch) - 1):
        b = f"{p}.blocks.{i}"
        s.conv(f"{b}.tdnn1.conv", ch[i], ch[i - 1], 1)
        for j in range(scale - 1):
            s.conv(f"{b}.res2net_block.blocks.{j}.conv", ch[i] // scale, ch[i] // scale, ks[i])
        s.conv(f"{b}.tdnn2.conv", ch[i], ch[i], 1)
        s.conv(f"{b}.se_block.conv1", se, ch[i], 1)
        s.conv(f"{b}.se_block.conv2", ch[i], se, 1)
    s.conv(f"{p}.mfa.conv", ch[-1], ch[-1], ks[-1])
    s.conv(f"{p}.asp.tdnn.conv", att, ch[-1] * 3, 1)
    s.conv(f"{p}.asp.conv", ch[-1], att, 1)
    s.conv(f"{p}.fc", enc_dim, ch[-1] * 2, 1)


def model_tensor_specs(config: dict[str, Any], dtype: str) -> list[TensorSpec]:
    """The tensors of model.safetensors for a top-level ``config`` (talker, code predictor, text
    path, and the speaker encoder of Base models), sorted by name."""
    s = _Specs(dtype)
    t = config["talker_config"]
    cp = t["code_predictor_config"]
    hidden, cp_hidden = t["hidden_size"], cp["hidden_size"]
    text_hidden = t["text_hidden_size"]
    groups = t["num_code_groups"]

    s.embedding("talker.model.text_embedding.weight", t["text_vocab_size"], text_hidden)
    s.linear("talker.text_projection.linear_fc1", text_hidden, text_hidden, bias=True)
    s.linear("talker.text_projection.linear_fc2", hidden, text_hidden, bias=True)
    s.embedding("talker.model.codec_embedding.weight", t["vocab_size"], hidden)
    for i in range(t["num_hidden_layers"]):
        _qwen3_layer(s, f"talker.model.layers.{i}", hidden, t, qk_norm=True)
    s.norm("talker.model.norm.weight", hidden)
    s.linear("talker.codec_head", t["vocab_size"], hidden, bias=False)

    c = "talker.code_predictor"
    for g in range(groups - 1):
        s.embedding(f"{c}.model.codec_embedding.{g}.weight", cp["vocab_size"], hidden)
        s.linear(f"{c}.lm_head.{g}", cp["vocab_size"], cp_hidden, bias=False)
    for i in range(cp["num_hidden_layers"]):
        _qwen3_layer(s, f"{c}.model.layers.{i}", cp_hidden, cp, qk_norm=True)
    s.norm(f"{c}.model.norm.weight", cp_hidden)
    if cp_hidden != hidden:
        s.linear(f"{c}.small_to_mtp_projection", cp_hidden, hidden, bias=True)

    if config.get("tts_model_type") == "base":
        _speaker_encoder_specs(s, config.get("speaker_encoder_config") or {})
    return sorted(s.items, key=lambda spec: spec.name)


def _decoder_specs(s: _Specs, dc: dict[str, Any]) -> None:
    """``Qwen3TTSTokenizerV2Decoder`` (code -> waveform)."""
    cb_dim = dc["codebook_dim"]
    q_dim = cb_dim // 2
    latent, hidden, dim = dc["latent_dim"], dc["hidden_size"], dc["decoder_dim"]
    n_q, n_sem = dc["num_quantizers"], dc.get("num_semantic_quantizers", 1)
    p = "decoder"
    for name, count in (("rvq_first", n_sem), ("rvq_rest", n_q - n_sem)):
        q = f"{p}.quantizer.{name}"
        s.conv(f"{q}.input_proj", q_dim, cb_dim, 1, bias=False)
        s.conv(f"{q}.output_proj", cb_dim, q_dim, 1, bias=False)
        for i in range(count):
            cb = f"{q}.vq.layers.{i}._codebook"
            # Later residual codebooks carry less energy, as in a trained RVQ.
            std = 1.0 if name == "rvq_first" else 0.8**i
            s.codebook(
                f"{cb}.cluster_usage", f"{cb}.embedding_sum", dc["codebook_size"], q_dim, std
            )
    s.conv(f"{p}.pre_conv.conv", latent, cb_dim, 3)

    t = f"{p}.pre_transformer"
    s.linear(f"{t}.input_proj", hidden, latent, bias=True)
    for i in range(dc["num_hidden_layers"]):
        layer = f"{t}.layers.{i}"
        s.norm(f"{layer}.input_layernorm.weight", hidden)
        s.attention(f"{layer}.self_attn", hidden, dc)
        s.uniform(f"{layer}.self_attn_layer_scale.scale", (hidden,), *_LAYER_SCALE)
        s.norm(f"{layer}.post_attention_layernorm.weight", hidden)
        s.linear(f"{layer}.mlp.gate_proj", dc["intermediate_size"], hidden, bias=False)
        s.linear(f"{layer}.mlp.up_proj", dc["intermediate_size"], hidden, bias=False)
        s.linear(f"{layer}.mlp.down_proj", hidden, dc["intermediate_size"], bias=False)
        s.uniform(f"{layer}.mlp_layer_scale.scale", (hidden,), *_LAYER_SCALE)
    s.norm(f"{t}.norm.weight", hidden)
    s.linear(f"{t}.output_proj", latent, hidden, bias=True)

    for i, factor in enumerate(dc["upsampling_ratios"]):
        u = f"{p}.upsample.{i}"
        s.trans_conv(f"{u}.0.conv", latent, latent, factor, factor)
        s.conv(f"{u}.1.dwconv.conv", latent, latent, 7, groups=latent)
        s.layer_norm(f"{u}.1.norm", latent)
        s.linear(f"{u}.1.pwconv1", 4 * latent, latent, bias=True)
        s.linear(f"{u}.1.pwconv2", latent, 4 * latent, bias=True)
        s.uniform(f"{u}.1.gamma", (latent,), *_CONVNEXT_GAMMA)

    d = f"{p}.decoder"
    s.conv(f"{d}.0.conv", dim, latent, 7)
    rates = dc["upsample_rates"]
    for b, rate in enumerate(rates):
        in_dim, out_dim = dim // 2**b, dim // 2 ** (b + 1)
        block = f"{d}.{b + 1}.block"
        s.snake(f"{block}.0", in_dim)
        s.trans_conv(f"{block}.1.conv", in_dim, out_dim, 2 * rate, rate)
        for j in range(3):  # residual units, dilation 1, 3, 9
            unit = f"{block}.{j + 2}"
            s.snake(f"{unit}.act1", out_dim)
            s.conv(f"{unit}.conv1.conv", out_dim, out_dim, 7)
            s.snake(f"{unit}.act2", out_dim)
            s.conv(f"{unit}.conv2.conv", out_dim, out_dim, 1, gain=_RESIDUAL_OUT_GAIN)
    out_dim = dim // 2 ** len(rates)
    s.snake(f"{d}.{len(rates) + 1}", out_dim)
    s.conv(
        f"{d}.{len(rates) + 2}.conv", 1, out_dim, 7, gain=_FINAL_CONV_GAIN, bias_std=_FINAL_BIAS_STD
    )


def _encoder_specs(s: _Specs, ec: dict[str, Any]) -> None:
    """The Mimi encoder half (``Qwen3TTSTokenizerV2Encoder``, a transformers ``MimiModel`` whose
    decoder parts are dropped)."""
    p = "encoder"
    filters, hidden = ec["num_filters"], ec["hidden_size"]
    e = f"{p}.encoder.layers"
    idx = 0
    s.conv(f"{e}.{idx}.conv", filters, ec["audio_channels"], ec["kernel_size"])
    idx += 1
    scaling = 1
    for ratio in reversed(ec["upsampling_ratios"]):
        current = scaling * filters
        for _ in range(ec["num_residual_layers"]):
            inner = current // ec["compress"]
            s.conv(f"{e}.{idx}.block.1.conv", inner, current, ec["residual_kernel_size"])
            s.conv(f"{e}.{idx}.block.3.conv", current, inner, 1)
            idx += 1
        idx += 1  # ELU
        s.conv(f"{e}.{idx}.conv", current * 2, current, ratio * 2)
        idx += 1
        scaling *= 2
    idx += 1  # ELU
    s.conv(f"{e}.{idx}.conv", hidden, scaling * filters, ec["last_kernel_size"])

    t = f"{p}.encoder_transformer.layers"
    for i in range(ec["num_hidden_layers"]):
        layer = f"{t}.{i}"
        s.layer_norm(f"{layer}.input_layernorm", hidden)
        s.attention(f"{layer}.self_attn", hidden, ec)
        s.uniform(f"{layer}.self_attn_layer_scale.scale", (hidden,), *_LAYER_SCALE)
        s.layer_norm(f"{layer}.post_attention_layernorm", hidden)
        s.linear(f"{layer}.mlp.fc1", ec["intermediate_size"], hidden, bias=False)
        s.linear(f"{layer}.mlp.fc2", hidden, ec["intermediate_size"], bias=False)
        s.uniform(f"{layer}.mlp_layer_scale.scale", (hidden,), *_LAYER_SCALE)

    encodec_frame_rate = ec["sampling_rate"] / int(np.prod(ec["upsampling_ratios"]))
    stride = int(round(encodec_frame_rate / ec["frame_rate"]))
    s.conv(f"{p}.downsample.conv", hidden, hidden, 2 * stride, bias=False)

    vq_dim = ec["vector_quantization_hidden_dimension"]
    n_sem = ec["num_semantic_quantizers"]
    for name, count in (
        ("semantic_residual_vector_quantizer", n_sem),
        ("acoustic_residual_vector_quantizer", ec["num_quantizers"] - n_sem),
    ):
        q = f"{p}.quantizer.{name}"
        s.conv(f"{q}.input_proj", vq_dim, hidden, 1, bias=False)
        s.conv(f"{q}.output_proj", hidden, vq_dim, 1, bias=False)
        for i in range(count):
            cb = f"{q}.layers.{i}.codebook"
            s.add(f"{cb}.initialized", (1,), Init("const", 1.0))
            s.codebook(
                f"{cb}.cluster_usage", f"{cb}.embed_sum", ec["codebook_size"], ec["codebook_dim"]
            )


def speech_tokenizer_tensor_specs(config: dict[str, Any]) -> list[TensorSpec]:
    """The tensors of speech_tokenizer/model.safetensors (f32), sorted by name."""
    s = _Specs("F32")
    _decoder_specs(s, config["decoder_config"])
    _encoder_specs(s, config["encoder_config"])
    return sorted(s.items, key=lambda spec: spec.name)


def tensor_specs(size: str, variant: str = "custom_voice") -> dict[str, list[TensorSpec]]:
    """Every tensor of the checkpoint, without generating any data: relative file -> specs."""
    tiny = _canonical_size(size).startswith("tiny")
    return {
        MODEL_FILE: model_tensor_specs(model_config(size, variant), "F32" if tiny else "BF16"),
        SPEECH_TOKENIZER_FILE: speech_tokenizer_tensor_specs(speech_tokenizer_config(size)),
    }


# ---------------------------------------------------------------------------------------------
# Random data
# ---------------------------------------------------------------------------------------------


def _rng(seed: int, name: str) -> np.random.Generator:
    words = struct.unpack("<4I", hashlib.sha256(name.encode()).digest()[:16])
    return np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32, *words]))


def tensor_chunks(spec: TensorSpec, seed: int) -> Iterator[np.ndarray]:
    """The float32 values of ``spec`` as consecutive C-order chunks of whole rows."""
    rng = _rng(seed, spec.name)
    init = spec.init
    rows = spec.shape[0] if spec.shape else 1
    row_elems = spec.numel // max(rows, 1)
    step = max(1, _CHUNK_ELEMS // max(row_elems, 1))
    usage: np.ndarray | None = None
    if init.kind == "codebook":
        if init.ref is None:
            raise ValueError(f"{spec.name}: codebook init needs its usage tensor")
        usage = np.concatenate(list(tensor_chunks(init.ref, seed)))
    for start in range(0, rows, step):
        n = min(step, rows - start)
        count = n * row_elems
        if init.kind == "normal":
            x = rng.standard_normal(count, dtype=np.float32)
            x *= np.float32(init.b)
            x += np.float32(init.a)
        elif init.kind == "uniform":
            x = rng.random(count, dtype=np.float32)
            x *= np.float32(init.b - init.a)
            x += np.float32(init.a)
        elif init.kind == "const":
            x = np.full(count, init.a, dtype=np.float32)
        elif init.kind == "codebook":
            assert usage is not None
            x = rng.standard_normal(count, dtype=np.float32).reshape(n, row_elems)
            x *= np.float32(init.b) * usage[start : start + n, None]
            x = x.reshape(-1)
        else:
            raise ValueError(f"{spec.name}: unknown init {init.kind!r}")
        yield x


def tensor_values(spec: TensorSpec, seed: int) -> np.ndarray:
    """The whole tensor as float32 (before any bf16 rounding); for small tensors and tests."""
    return np.concatenate(list(tensor_chunks(spec, seed))).reshape(spec.shape)


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest, ties to even) and return the raw uint16 bit patterns."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """Widen raw bfloat16 bit patterns (uint16) to float32."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---------------------------------------------------------------------------------------------
# safetensors writer (streaming: header first, then each tensor chunk by chunk)
# ---------------------------------------------------------------------------------------------


def safetensors_header(specs: Sequence[TensorSpec]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for spec in specs:
        header[spec.name] = {
            "dtype": spec.dtype,
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # align the data section to 8 bytes
    return struct.pack("<Q", len(raw)) + raw


def _encode_chunk(chunk: np.ndarray, dtype: str) -> bytes:
    if dtype == "BF16":
        return float32_to_bf16_bits(chunk).tobytes()
    if dtype == "F32":
        return chunk.astype("<f4", copy=False).tobytes()
    raise ValueError(f"unsupported dtype {dtype}")


def write_safetensors(
    path: Path, specs: Sequence[TensorSpec], seed: int, label: str | None = None
) -> int:
    """Write ``specs`` with random data to ``path`` (tensor by tensor, chunk by chunk); returns
    the file size. Files of 64 MiB and more log their progress every 10 %."""
    path.parent.mkdir(parents=True, exist_ok=True)
    label = label or path.name
    header = safetensors_header(specs)
    total = sum(spec.nbytes for spec in specs)
    verbose = total >= _PROGRESS_MIN_BYTES
    start = time.monotonic()
    done = 0
    next_report = 0.1
    tmp = path.with_name(path.name + ".partial")
    with tmp.open("wb") as f:
        f.write(header)
        for spec in specs:
            for chunk in tensor_chunks(spec, seed):
                data = _encode_chunk(chunk, spec.dtype)
                f.write(data)
                done += len(data)
                if verbose and done >= next_report * total:
                    logger.info(
                        "%s: %3.0f%% (%.2f of %.2f GB, %.1f s)",
                        label,
                        100.0 * done / total,
                        done / 1e9,
                        total / 1e9,
                        time.monotonic() - start,
                    )
                    while next_report * total <= done:
                        next_report += 0.1
        size = f.tell()
    if size != len(header) + total:
        raise RuntimeError(f"{path}: wrote {size} bytes, expected {len(header) + total}")
    tmp.replace(path)
    return size


# ---------------------------------------------------------------------------------------------
# Tokenizer: a small byte-level BPE with the real special-token ids
# ---------------------------------------------------------------------------------------------

# Original text, only used to learn a few hundred merges.
_BPE_CORPUS = """
Hello world! This is a small voice assistant that runs in the house. It can read the weather,
turn on the lights in the kitchen and the living room, and tell you the time. Good morning, the
temperature outside is twelve degrees and it will rain in the afternoon. The front door is
locked, the garage door is closed and the heating is set to twenty one degrees. Would you like
me to play some music? Your timer for the pasta is done. The washing machine has finished.
Tomorrow there will be sun in the morning and wind in the evening, with a high of eighteen
degrees. I have added milk, bread, eggs and coffee to the shopping list. There is a meeting at
three o'clock, and your sister called while you were out. It's time to water the plants. The
battery of the sensor in the bedroom is low. Please say that again, I did not understand. The
system is ready and the user can ask the assistant anything: the answer is spoken as soon as
the first words are known, so the voice starts while the rest of the sentence is still being
generated. Streaming speech sounds natural when the pauses, the rhythm and the melody of the
voice follow the meaning of the text. We're testing the speech synthesis of this model with
random weights, so what you hear is only noise, but the shapes, the names and the numbers of
every part are the same as in the real model. Thank you, have a nice evening and good night.
The quick brown fox jumps over the lazy dog. Where is my phone? Call mom. Set an alarm for
seven thirty. What's on my calendar today? How long will it take to drive to work? Turn the
volume down. Open the blinds in the office. Is the window in the bathroom open? Start the
vacuum cleaner. Remind me to take out the trash tonight. Which song is playing right now?
"""

_PRETOKENIZE = re.compile(r"'(?:s|t|re|ve|m|ll|d)| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+")
_N_MERGES = 400


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / Qwen2 byte-level alphabet: byte value -> printable character."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def _byte_level(text: str) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in text.encode())


def _bpe_apply(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    parts = list(word)
    while len(parts) > 1:
        pairs = [
            (ranks.get((a, b), -1), i)
            for i, (a, b) in enumerate(zip(parts, parts[1:], strict=False))
        ]
        candidates = [(r, i) for r, i in pairs if r >= 0]
        if not candidates:
            break
        _, i = min(candidates)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    return parts


def _train_merges(text: str, n_merges: int) -> list[tuple[str, str]]:
    words = Counter(_byte_level(w) for w in _PRETOKENIZE.findall(text))
    splits = {w: list(w) for w in words}
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for w, count in words.items():
            parts = splits[w]
            for pair in zip(parts, parts[1:], strict=False):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        a, b = best[0]
        merges.append((a, b))
        for parts in splits.values():
            i = 0
            while i < len(parts) - 1:
                if parts[i] == a and parts[i + 1] == b:
                    parts[i : i + 2] = [a + b]
                i += 1
    return merges


def build_tokenizer() -> tuple[dict[str, int], list[tuple[str, str]], dict[str, Any]]:
    """vocab.json, merges.txt and tokenizer_config.json contents.

    The vocabulary is dense like the real one (ids 0..151642, the added tokens from 151643), so
    that every loader gives the special tokens their real ids: the 256 byte tokens sit at their
    real Qwen2 ids (GPT-2 byte order, "\\n" -> 198, " " -> 220), the tokens of
    ``KNOWN_TOKEN_IDS`` at their real ids, the learned merges at arbitrary free ids, and the
    remaining ids hold unreachable filler tokens.
    """
    merges = _train_merges(_BPE_CORPUS, _N_MERGES)
    ranks = {pair: i for i, pair in enumerate(merges)}
    # Chain merges that turn each known word into one token: its pieces under the learned merges
    # are merged left to right by new merges ranked after all others, so nothing else changes.
    for word in KNOWN_TOKEN_IDS:
        parts = _bpe_apply(word, ranks)
        while len(parts) > 1:
            pair = (parts[0], parts[1])
            if pair not in ranks:
                ranks[pair] = len(merges)
                merges.append(pair)
            parts[0:2] = [parts[0] + parts[1]]

    vocab: dict[str, int] = {}
    for i, ch in enumerate(bytes_to_unicode().values()):
        vocab[ch] = i
    vocab.update(KNOWN_TOKEN_IDS)
    reserved = set(vocab.values())
    next_id = 256
    for a, b in merges:
        token = a + b
        if token in vocab:
            continue
        while next_id in reserved:
            next_id += 1
        vocab[token] = next_id
        reserved.add(next_id)
    for i in range(ADDED_TOKENS_START):
        if i not in reserved:
            vocab[f"<|kazeia_unused_{i}|>"] = i
    assert len(vocab) == ADDED_TOKENS_START and max(vocab.values()) == ADDED_TOKENS_START - 1

    added = {
        str(ADDED_TOKENS_START + i): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for i, (content, special) in enumerate(ADDED_TOKENS)
    }
    tokenizer_config: dict[str, Any] = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [content for content, special in ADDED_TOKENS[1:] if special],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    return vocab, merges, tokenizer_config


def write_tokenizer(out_dir: Path) -> None:
    vocab, merges, tokenizer_config = build_tokenizer()
    _write_json(out_dir / "vocab.json", vocab, indent=None)
    with (out_dir / "merges.txt").open("w", encoding="utf-8", newline="\n") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config)


# ---------------------------------------------------------------------------------------------
# Checkpoint
# ---------------------------------------------------------------------------------------------


def _write_json(path: Path, data: Any, indent: int | None = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=indent, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")


def write_checkpoint(
    out_dir: Path | str, size: str, variant: str = "custom_voice", seed: int = DEFAULT_SEED
) -> Path:
    """Write a complete random checkpoint to ``out_dir`` and return it."""
    if seed < 0:
        raise ValueError("seed must be >= 0")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = model_config(size, variant)
    st_config = speech_tokenizer_config(size)
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", generation_config())
    _write_json(out / "speech_tokenizer" / "config.json", st_config)
    _write_json(out / "speech_tokenizer" / "preprocessor_config.json", preprocessor_config())
    write_tokenizer(out)
    for rel, specs in tensor_specs(size, variant).items():
        start = time.monotonic()
        nbytes = write_safetensors(out / rel, specs, seed, label=rel)
        logger.info(
            "wrote %s: %d tensors, %.1f MB in %.1f s",
            rel,
            len(specs),
            nbytes / 1e6,
            time.monotonic() - start,
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="script/random-checkpoint",
        description="Write a random-weight Qwen3-TTS 12 Hz checkpoint (official HF layout).",
    )
    parser.add_argument("out_dir", type=Path, help="output folder (created if missing)")
    parser.add_argument("--size", default="tiny", choices=SIZES, help="default tiny")
    parser.add_argument("--variant", default="custom_voice", choices=VARIANTS)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="non-negative integer")
    parser.add_argument("-q", "--quiet", action="store_true", help="only log warnings")
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error("--seed must be >= 0")
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    start = time.monotonic()
    out = write_checkpoint(args.out_dir, args.size, args.variant, args.seed)
    logger.info(
        "checkpoint %s (%s, %s, seed %d) ready in %.1f s",
        out,
        args.size,
        args.variant,
        args.seed,
        time.monotonic() - start,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
