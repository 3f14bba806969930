"""Public Python API of the native engine.

    from wyoming_kazeia.native import SpeechDecoder

    decoder = SpeechDecoder("model/decoder.gguf", threads=2)
    wav = decoder.decode(codes)          # codes: int [T, 16] -> float32 [T * 1920] at 24 kHz
    stream = decoder.stream()
    part = stream.push(codes[:4])        # exactly the next 4 * 1920 samples
    stream.reset()                       # back to the start of a new utterance

    from wyoming_kazeia.native import Generator

    gen = Generator("model/talker.gguf", threads=2)
    codes = gen.generate(input_ids, "vivian", "english", seed=7, max_frames=400)  # int32 [T, 16]
    for frame in gen.frames(input_ids, "vivian"):  # each frame's 16 codes as soon as they exist
        ...

input_ids is the tokenized assistant prompt
'<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n'. Unset sampling values
come from the model's generation_config.json; `greedy=True` takes the argmax (tests).

Bad input raises ValueError (shape, dtype, code range) or ModelError (a missing, corrupt,
truncated or wrong-kind GGUF file); the engine computes with the GIL released.
"""

from __future__ import annotations

import numpy as np

from ._native import DecoderStream, FrameIterator, Generator, ModelError, SpeechDecoder

__all__ = [
    "DecoderStream",
    "FrameIterator",
    "Generator",
    "ModelError",
    "SpeechDecoder",
    "to_pcm16",
]


def to_pcm16(wav: np.ndarray) -> np.ndarray:
    """float waveform in [-1, 1] -> int16 PCM (the conversion kazeia-decoder uses too)."""
    return np.rint(np.clip(wav, -1.0, 1.0) * 32767.0).astype(np.int16)
