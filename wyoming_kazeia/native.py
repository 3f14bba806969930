"""Public Python API of the native engine.

    from wyoming_kazeia.native import SpeechDecoder

    decoder = SpeechDecoder("model/decoder.gguf", threads=2)
    wav = decoder.decode(codes)          # codes: int [T, 16] -> float32 [T * 1920] at 24 kHz
    stream = decoder.stream()
    part = stream.push(codes[:4])        # exactly the next 4 * 1920 samples
    stream.reset()                       # back to the start of a new utterance

    from wyoming_kazeia.native import Generator

    gen = Generator("model/talker.gguf", threads=2)  # talker_device="vulkan:0": on a GPU
    codes = gen.generate(input_ids, "vivian", "english", seed=7, max_frames=400)  # int32 [T, 16]
    for frame in gen.frames(input_ids, "vivian"):  # each frame's 16 codes as soon as they exist
        ...

input_ids is the tokenized assistant prompt
'<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n'. Unset sampling values
come from the model's generation_config.json; `greedy=True` takes the argmax (tests).

Bad input raises InputError, a ValueError (shape, dtype, code range), or ModelError (a missing,
corrupt, truncated or wrong-kind GGUF file), both of the package's error family
(wyoming_kazeia.errors); the engine computes with the GIL released.

This is the one module through which the product reaches the native extension: the engine
classes, the decoder's facts read from its file, the format tables the converter writes from
(`formats`), and the path of the bundled tools. Test hooks live in `_native.testing` and are
not part of it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import _native
from ._native import (
    DECODER_MAX_CHUNK_FRAMES,
    KERNEL_ISA,
    PROMPT_ROLE_TOKENS,
    PROMPT_TRAILER_TOKENS,
    DecoderHParams,
    DecoderStream,
    FrameIterator,
    Generator,
    SpeakerEncoder,
    SpeechDecoder,
    SpeechEncoder,
    Voice,
    compute_devices,
    describe_placement,
    formats,
    frame_budget,
    read_decoder_hparams,
    resolve_placement,
)
from .errors import InputError, ModelError

__all__ = [
    "DECODER_MAX_CHUNK_FRAMES",
    "KERNEL_ISA",
    "PROMPT_ROLE_TOKENS",
    "PROMPT_TRAILER_TOKENS",
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
