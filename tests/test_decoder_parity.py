"""The native speech decoder against the official implementation's outputs.

Tolerance: max abs error 1e-4 on the waveform (fp32 noise between different op shapes is
~1e-5; a missing piece of streaming state shows as 1e-2 or more, see the naive-chunks check).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import REFERENCE_MODELS, ref_array, ref_codes

from wyoming_kazeia.native import SpeechDecoder

TOL = 1e-4


@pytest.fixture(scope="module", params=REFERENCE_MODELS)
def model(
    request: pytest.FixtureRequest, decoder_gguf: dict[str, Path]
) -> tuple[str, SpeechDecoder]:
    return request.param, SpeechDecoder(str(decoder_gguf[request.param]), threads=2)


@pytest.mark.parametrize(
    ("codes", "wav"),
    [("dec_codes", "dec_wav_full"), ("dec_codes_long", "dec_wav_long_full")],
)
def test_full_decode_matches_official(
    model: tuple[str, SpeechDecoder], codes: str, wav: str
) -> None:
    name, dec = model
    c = ref_codes(name, codes)
    out = dec.decode(c)
    expected = ref_array(name, wav).reshape(-1)
    assert out.dtype == np.float32
    assert out.shape == (len(c) * 1920,)
    assert np.abs(out - expected).max() < TOL


def test_prefix_decode_matches_official(model: tuple[str, SpeechDecoder]) -> None:
    name, dec = model
    out = dec.decode(ref_codes(name, "dec_codes")[:40])
    assert np.abs(out - ref_array(name, "dec_wav_prefix40").reshape(-1)).max() < TOL


@pytest.mark.parametrize("chunk", [1, 2, 5, 7, 40])
def test_streaming_equals_full_decode(model: tuple[str, SpeechDecoder], chunk: int) -> None:
    name, dec = model
    codes = ref_codes(name, "dec_codes_long")
    full = dec.decode(codes)
    stream = dec.stream()
    parts = []
    for i in range(0, len(codes), chunk):
        part = stream.push(codes[i : i + chunk])
        assert part.shape == (len(codes[i : i + chunk]) * 1920,)
        parts.append(part)
    streamed = np.concatenate(parts)
    assert stream.frames_pushed == len(codes)
    assert np.abs(streamed - full).max() < TOL
    assert np.abs(streamed - ref_array(name, "dec_wav_long_full").reshape(-1)).max() < TOL


def test_tolerance_catches_stateless_chunking(model: tuple[str, SpeechDecoder]) -> None:
    """Decoding chunks without history (what most peers do) is far outside the tolerance."""
    name, _dec = model
    naive = ref_array(name, "dec_wav_naive_chunks_K10").reshape(-1)
    assert np.abs(naive - ref_array(name, "dec_wav_full").reshape(-1)).max() > 100 * TOL


def test_reset_restarts_the_stream(model: tuple[str, SpeechDecoder]) -> None:
    name, dec = model
    codes = ref_codes(name, "dec_codes")[:30]
    stream = dec.stream()
    first = np.concatenate([stream.push(codes[i : i + 3]) for i in range(0, 30, 3)])
    stream.reset()
    assert stream.frames_pushed == 0
    second = np.concatenate([stream.push(codes[i : i + 4]) for i in range(0, 30, 4)])
    assert np.abs(first - second).max() < TOL
    assert np.abs(second - ref_array(name, "dec_wav_full").reshape(-1)[: 30 * 1920]).max() < TOL


def test_long_stream_is_exact_and_bounded(decoder_gguf: dict[str, Path]) -> None:
    """Far past the 72-frame window and the 580-frame receptive field: a stream fed in odd
    chunks equals the full decode, and its state does not grow with the stream."""
    dec = SpeechDecoder(str(decoder_gguf["tiny-0.6b"]), threads=2)
    rng = np.random.default_rng(7)
    codes = rng.integers(0, 2048, size=(700, 16))
    full = dec.decode(codes)
    stream = dec.stream()
    parts, i, step = [], 0, 1
    while i < len(codes):
        parts.append(stream.push(codes[i : i + step]))
        i += step
        step = step % 13 + 3  # 1, 4, 7, 10, 13, 3, 6, ...
    assert np.abs(np.concatenate(parts) - full).max() < TOL
    # History beyond the receptive field (frame t depends on codes [t-580, t]) is forgotten:
    # after 100 unrelated frames, frames 590..599 come out as in a fresh decode. Attention
    # uses relative positions (RoPE), so the shifted absolute positions do not matter.
    late = dec.stream()
    late.push(rng.integers(0, 2048, size=(100, 16)))
    tail = late.push(codes[:600])[-10 * 1920 :]
    assert np.abs(tail - full[590 * 1920 : 600 * 1920]).max() < TOL


def test_oversubscribed_threads_are_exact(decoder_gguf: dict[str, Path]) -> None:
    """More compute threads than cores: workers wake late and take few or no tasks; every
    push still completes with the same samples (tasks are claimed from a shared counter)."""
    codes = ref_codes("tiny-0.6b", "dec_codes")[:48]
    expected = SpeechDecoder(str(decoder_gguf["tiny-0.6b"]), threads=1).decode(codes)
    dec = SpeechDecoder(str(decoder_gguf["tiny-0.6b"]), threads=8)
    for _ in range(3):
        stream = dec.stream()
        out = np.concatenate([stream.push(codes[i : i + 1]) for i in range(len(codes))])
        assert np.abs(out - expected).max() < TOL
