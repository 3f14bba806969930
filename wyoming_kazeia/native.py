"""The one module through which the product reaches the native extension (`_native`).

It gives the engine classes (decoder, generator, voice encoders), the decoder's facts read from
its file, the format tables the converter writes from (`formats`) and the path of the bundled
tools; test hooks stay in `_native.testing`. Bad input raises InputError or ModelError, of the
package's error family (errors.py); the engine computes with the GIL released.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import _native
from ._native import (
    DECODER_GPU_CHUNK_FRAMES,
    DECODER_MAX_CHUNK_FRAMES,
    DECODER_PRECISIONS,
    KERNEL_ISA,
    KV_CACHE_TYPES,
    PROMPT_ROLE_TOKENS,
    PROMPT_TRAILER_TOKENS,
    CoreShare,
    DecoderHParams,
    DecoderStream,
    FrameIterator,
    Generator,
    SpeakerEncoder,
    SpeechDecoder,
    SpeechEncoder,
    Voice,
    compute_devices,
    cpu_has_amx_bf16,
    decoder_bf16_isa,
    describe_placement,
    formats,
    frame_budget,
    read_decoder_hparams,
    resolve_placement,
)
from .errors import InputError, ModelError

__all__ = [
    "DECODER_GPU_CHUNK_FRAMES",
    "DECODER_MAX_CHUNK_FRAMES",
    "DECODER_PRECISIONS",
    "KERNEL_ISA",
    "KV_CACHE_TYPES",
    "PROMPT_ROLE_TOKENS",
    "PROMPT_TRAILER_TOKENS",
    "CoreShare",
    "DecoderHParams",
    "DecoderStream",
    "FrameIterator",
    "Generator",
    "Voice",
    "InputError",
    "ModelError",
    "SpeakerEncoder",
    "SpeechDecoder",
    "SpeechEncoder",
    "formats",
    "frame_budget",
    "compute_devices",
    "cpu_has_amx_bf16",
    "decoder_bf16_isa",
    "describe_placement",
    "ggml_cpu_features",
    "ggml_cpu_variant",
    "read_decoder_hparams",
    "resolve_placement",
    "to_pcm16",
    "tool_path",
]


def to_pcm16(wav: np.ndarray) -> np.ndarray:
    """float waveform in [-1, 1] -> int16 PCM (the conversion kazeia-decoder uses too)."""
    return np.rint(np.clip(wav, -1.0, 1.0) * 32767.0).astype(np.int16)


def tool_path(name: str) -> Path:
    """Path of a native tool (kazeia-decoder) installed beside the extension module."""
    return Path(_native.__file__).resolve().parent / "bin" / name


def ggml_cpu_features() -> list[str]:
    """The instruction sets ggml's CPU kernels use in this process, upper case."""
    return [f.upper() for f in _native.cpu_backend()["features"]]


def ggml_cpu_variant() -> str:
    """Which of ggml's CPU libraries runs here ("haswell", "sse42", ...; "linked": the one)."""
    return str(_native.cpu_backend()["variant"])
