"""The service's audio (int16 PCM, mono) in the formats an HTTP client asks for, encoded while
it streams: every piece of PCM in gives the bytes a client can already play.

    pcm    the samples as they are (16-bit little-endian, mono): OpenAI's `pcm`
    wav    a WAV header of unknown length (0xFFFFFFFF, as streamed WAV is written), then PCM
    mp3    MPEG layer III at a constant bitrate, by libsndfile (LAME), without an Info frame
    opus   Ogg Opus, by libsndfile
    flac   FLAC, by libsndfile (its total length left unknown, as the format allows)

libsndfile writes through a file object that hands each write on at once. At the end it seeks
back to complete a header (an MP3 Info frame, FLAC's checksum); those bytes are already sent,
so the stream keeps the header it began with, which the formats allow (MP3's Info frame, blank
until then, is left out: a constant bitrate needs none for a decoder to find the length).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import soundfile as sf

WIDTH = 2  # bytes per sample


class StreamEncoder(Protocol):
    def encode(self, pcm: bytes) -> bytes: ...
    def finish(self) -> bytes: ...


class RawPcm:
    def encode(self, pcm: bytes) -> bytes:
        return pcm

    def finish(self) -> bytes:
        return b""


class StreamedWav:
    """A WAV header that says "length unknown", then the samples as they come."""

    def __init__(self, rate: int) -> None:
        self._header: bytes | None = wav_header(rate)

    def encode(self, pcm: bytes) -> bytes:
        header, self._header = self._header or b"", None
        return header + pcm

    def finish(self) -> bytes:
        return self.encode(b"")  # an answer with no audio is still a WAV


def wav_header(rate: int, data_bytes: int = 0xFFFFFFFF) -> bytes:
    """A 44-byte PCM WAV header, mono 16-bit; the default sizes say "unknown length"."""
    riff = 0xFFFFFFFF if data_bytes == 0xFFFFFFFF else 36 + data_bytes
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * WIDTH, WIDTH, 8 * WIDTH)
        + b"data"
        + struct.pack("<I", data_bytes)
    )


class _Sink:
    """A write-only file for libsndfile: what it writes past the bytes already taken is kept
    until `take()`; a write over bytes already taken (a header completed at the end) is
    dropped."""

    def __init__(self) -> None:
        self._taken = 0  # bytes handed on so far
        self._pending = bytearray()
        self._pos = 0

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        end = self._taken + len(self._pending)
        self._pos = {0: offset, 1: self._pos + offset, 2: end + offset}[whence]
        return self._pos

    def read(self, size: int = -1) -> bytes:
        return b""

    def write(self, data: bytes) -> int:
        data = bytes(data)
        written, at = len(data), self._pos
        if at < self._taken:  # already sent: the stream keeps what it had
            skip = min(len(data), self._taken - at)
            data, at = data[skip:], at + skip
        start = at - self._taken
        if start > len(self._pending):  # a seek past the end: a gap of zeros
            self._pending.extend(bytes(start - len(self._pending)))
        self._pending[start : start + len(data)] = data
        self._pos = at + len(data)
        return written

    def take(self) -> bytes:
        out = bytes(self._pending)
        self._taken += len(out)
        self._pending.clear()
        return out


class LibsndfileStream:
    """A format libsndfile encodes, written as the samples come."""

    def __init__(self, rate: int, fmt: str, subtype: str, **options: Any) -> None:
        self._sink = _Sink()
        self._file = sf.SoundFile(self._sink, "w", rate, 1, subtype, format=fmt, **options)

    def encode(self, pcm: bytes) -> bytes:
        if pcm:
            self._file.write(np.frombuffer(pcm, "<i2"))
        return self._sink.take()

    def finish(self) -> bytes:
        self._file.close()
        return self._sink.take()


class Mp3Stream(LibsndfileStream):
    """MP3 without its Info frame: libsndfile begins with a blank one and fills it in at the
    end, when it is already sent; a blank frame in its place breaks the decoding of the frames
    after it (their bit reservoir), so it is left out: a constant bitrate needs no Info."""

    def __init__(self, rate: int) -> None:
        # libsndfile takes the bitrate mode with a compression level (0.5: 80 kbit/s at 24 kHz)
        options = {"bitrate_mode": "CONSTANT", "compression_level": 0.5}
        super().__init__(rate, "MP3", "MPEG_LAYER_III", **options)
        self._head: bytes | None = b""  # the stream's start until its first frame is judged

    def encode(self, pcm: bytes) -> bytes:
        return self._cut(super().encode(pcm))

    def finish(self) -> bytes:
        out = self._cut(super().finish())
        head, self._head = self._head or b"", None
        return out + head

    def _cut(self, data: bytes) -> bytes:
        if self._head is None:
            return data
        head = self._head + data
        after = head.find(b"\xff", 4)  # the next frame's sync, past the first frame's header
        if after < 0:
            self._head = head
            return b""
        self._head = None
        blank = head[:4].startswith(b"\xff") and not head[4:after].strip(b"\x00")
        return head[after:] if blank else head


# name -> (Content-Type, libsndfile format, subtype, options)
_LIBSNDFILE: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "opus": ("audio/ogg; codecs=opus", "OGG", "OPUS", {}),
    "flac": ("audio/flac", "FLAC", "PCM_16", {}),
}
# OpenAI's formats that no encoder here writes.
UNSUPPORTED = ("aac",)


def _encodable(fmt: str, subtype: str) -> bool:
    return fmt in sf.available_formats() and subtype in sf.available_subtypes(fmt)


def formats() -> dict[str, tuple[str, Callable[[int], StreamEncoder]]]:
    """The formats this installation streams: name -> (Content-Type, encoder of a rate)."""
    out: dict[str, tuple[str, Callable[[int], StreamEncoder]]] = {
        "pcm": ("audio/pcm", lambda rate: RawPcm()),
        "wav": ("audio/wav", StreamedWav),
    }
    if _encodable("MP3", "MPEG_LAYER_III"):
        out["mp3"] = ("audio/mpeg", Mp3Stream)
    for name, (content_type, fmt, subtype, options) in _LIBSNDFILE.items():
        if _encodable(fmt, subtype):
            out[name] = (content_type, _libsndfile_factory(fmt, subtype, options))
    return out


def _libsndfile_factory(
    fmt: str, subtype: str, options: dict[str, Any]
) -> Callable[[int], StreamEncoder]:
    return lambda rate: LibsndfileStream(rate, fmt, subtype, **options)
