"""Bad input to the decoder: a clear Python exception, never a crash."""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from wyoming_kazeia.native import ModelError, SpeechDecoder


@pytest.fixture(scope="module")
def dec(decoder_gguf: dict[str, Path]) -> SpeechDecoder:
    return SpeechDecoder(str(decoder_gguf["tiny-0.6b"]), threads=1)


@pytest.mark.parametrize(
    ("codes", "message"),
    [
        (np.zeros((3, 15), dtype=np.int32), r"shape \[T, 16\]"),
        (np.zeros((3, 17), dtype=np.int64), r"shape \[T, 16\]"),
        (np.zeros((48,), dtype=np.int32), r"shape \[T, 16\]"),
        (np.zeros((2, 3, 16), dtype=np.int32), r"shape \[T, 16\]"),
        (np.zeros((0, 16), dtype=np.int32), "at least one frame"),
        (np.zeros((2, 16), dtype=np.float32), "integer array"),
        (np.full((2, 16), 2048), "code 2048 at frame 0, codebook 0 is outside 0..2047"),
        (np.full((2, 16), -1), "code -1 .* outside 0..2047"),
        (np.full((2, 16), 2**40 + 5), "outside 0..2047"),
    ],
)
def test_bad_codes_raise_value_error(dec: SpeechDecoder, codes: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dec.decode(codes)
    stream = dec.stream()
    with pytest.raises(ValueError, match=message):
        stream.push(codes)
    assert stream.frames_pushed == 0
    # The decoder is still usable afterwards.
    assert dec.decode(np.zeros((1, 16), dtype=np.int32)).shape == (1920,)


def test_code_range_reports_position(dec: SpeechDecoder) -> None:
    codes = np.zeros((4, 16), dtype=np.int16)
    codes[2, 5] = 3000
    with pytest.raises(ValueError, match="frame 2, codebook 5"):
        dec.decode(codes)


def test_bad_threads() -> None:
    with pytest.raises(ValueError, match="threads"):
        SpeechDecoder("whatever.gguf", threads=0)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="cannot open .*nope.gguf"):
        SpeechDecoder(str(tmp_path / "nope.gguf"))


def test_not_a_gguf(tmp_path: Path) -> None:
    path = tmp_path / "random.gguf"
    path.write_bytes(np.random.default_rng(1).bytes(4096))
    with pytest.raises(ModelError, match="not a GGUF file"):
        SpeechDecoder(str(path))


def test_corrupt_header(tmp_path: Path, decoder_gguf: dict[str, Path]) -> None:
    data = bytearray(decoder_gguf["tiny-0.6b"].read_bytes())
    data[8:24] = b"\xff" * 16  # tensor and key-value counts
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="corrupt or truncated"):
        SpeechDecoder(str(path))


@pytest.mark.parametrize("keep", [0.999, 0.5, 0.01, 100 / 1e9])
def test_truncated_file(tmp_path: Path, decoder_gguf: dict[str, Path], keep: float) -> None:
    data = decoder_gguf["tiny-0.6b"].read_bytes()
    path = tmp_path / "truncated.gguf"
    path.write_bytes(data[: max(8, int(len(data) * keep))])
    with pytest.raises(ModelError, match="truncated|corrupt"):
        SpeechDecoder(str(path))


def _rewrite(
    src: Path,
    dst: Path,
    arch: str | None = None,
    drop_tensor: str | None = None,
    drop_key: str | None = None,
) -> None:
    """Copies a GGUF, changing its kind or dropping one tensor or metadata key."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, arch or "kazeia-decoder")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", drop_key):
            continue
        value = field.contents()
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, vtype, sub)
    for t in reader.tensors:
        if t.name == drop_tensor:
            continue
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_wrong_kind(tmp_path: Path, decoder_gguf: dict[str, Path]) -> None:
    path = tmp_path / "llama.gguf"
    _rewrite(decoder_gguf["tiny-0.6b"], path, arch="llama")
    with pytest.raises(ModelError, match="'llama' GGUF, expected 'kazeia-decoder'"):
        SpeechDecoder(str(path))


def test_rewrite_roundtrip_loads(tmp_path: Path, decoder_gguf: dict[str, Path]) -> None:
    """The rewriting helper itself keeps a file valid (so the failures below are real)."""
    path = tmp_path / "same.gguf"
    _rewrite(decoder_gguf["tiny-0.6b"], path)
    a = SpeechDecoder(str(path), threads=1).decode(np.ones((2, 16), dtype=np.int32))
    b = SpeechDecoder(str(decoder_gguf["tiny-0.6b"]), threads=1).decode(np.ones((2, 16), np.int32))
    assert np.array_equal(a, b)


def test_missing_tensor(tmp_path: Path, decoder_gguf: dict[str, Path]) -> None:
    path = tmp_path / "missing.gguf"
    _rewrite(decoder_gguf["tiny-0.6b"], path, drop_tensor="dec.voc.blk.2.res.1.conv1.weight")
    with pytest.raises(ModelError, match="no tensor 'dec.voc.blk.2.res.1.conv1.weight'"):
        SpeechDecoder(str(path))


def test_missing_metadata(tmp_path: Path, decoder_gguf: dict[str, Path]) -> None:
    path = tmp_path / "nokey.gguf"
    _rewrite(decoder_gguf["tiny-0.6b"], path, drop_key="kazeia.decoder.sliding_window")
    with pytest.raises(ModelError, match="lacks metadata key 'kazeia.decoder.sliding_window'"):
        SpeechDecoder(str(path))


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError):
        SpeechDecoder(str(tmp_path))


def test_file_replaced_after_load_keeps_working(
    tmp_path: Path, decoder_gguf: dict[str, Path]
) -> None:
    path = tmp_path / "decoder.gguf"
    shutil.copy(decoder_gguf["tiny-0.6b"], path)
    dec = SpeechDecoder(str(path), threads=1)
    path.write_bytes(b"gone")
    assert dec.decode(np.zeros((1, 16), dtype=np.int32)).shape == (1920,)
