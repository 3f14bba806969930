"""kazeia-decoder: same audio as the Python API, clear failures, atomic output."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import ref_codes

from wyoming_kazeia.native import SpeechDecoder, to_pcm16

# The console script pip installed beside the interpreter running the tests.
CLI = str(Path(sys.executable).parent / "kazeia-decoder")


def run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def codes_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    codes = ref_codes("tiny-0.6b", "dec_codes")[:50]
    path = tmp_path_factory.mktemp("codes") / "codes.bin"
    codes.astype("<i4").tofile(path)
    return path, codes


def test_cli_matches_api(
    tmp_path: Path, decoder_gguf: dict[str, Path], codes_file: tuple[Path, np.ndarray]
) -> None:
    path, codes = codes_file
    expected = SpeechDecoder(str(decoder_gguf["tiny-0.6b"]), threads=2).decode(codes)
    out = tmp_path / "out.wav"
    r = run(decoder_gguf["tiny-0.6b"], path, len(codes), out)
    assert r.returncode == 0, r.stderr
    pcm, rate = sf.read(out, dtype="int16")
    info = sf.info(out)
    assert (rate, info.channels, info.subtype) == (24000, 1, "PCM_16")
    assert np.array_equal(pcm, to_pcm16(expected))

    out_f = tmp_path / "out_f.wav"
    r = run(decoder_gguf["tiny-0.6b"], path, len(codes), out_f, "--float")
    assert r.returncode == 0, r.stderr
    wav, rate = sf.read(out_f, dtype="float32")
    assert sf.info(out_f).subtype == "FLOAT"
    assert np.array_equal(wav, expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.wav", "out_f.wav"]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("frames_mismatch", "has 3200 bytes, expected 3264 for 51 frames"),
        ("frames_zero", "invalid frame count T '0'"),
        ("frames_text", "invalid frame count T 'ten'"),
        ("missing_codes", "cannot open .*nothing.bin"),
        ("missing_model", "cannot open .*nothing.gguf"),
        ("bad_code", "code 4096 at frame 1, codebook 3 is outside 0..2047"),
        ("corrupt_model", "not a GGUF file"),
        ("unknown_option", "unknown option --fast"),
    ],
)
def test_cli_bad_input(
    tmp_path: Path,
    decoder_gguf: dict[str, Path],
    codes_file: tuple[Path, np.ndarray],
    case: str,
    message: str,
) -> None:
    path, codes = codes_file
    model: Path = decoder_gguf["tiny-0.6b"]
    n: object = len(codes)
    extra: list[str] = []
    if case == "frames_mismatch":
        n = len(codes) + 1
    elif case == "frames_zero":
        n = 0
    elif case == "frames_text":
        n = "ten"
    elif case == "missing_codes":
        path = tmp_path / "nothing.bin"
    elif case == "missing_model":
        model = tmp_path / "nothing.gguf"
    elif case == "bad_code":
        bad = codes.copy()
        bad[1, 3] = 4096
        path = tmp_path / "bad.bin"
        bad.astype("<i4").tofile(path)
    elif case == "corrupt_model":
        model = tmp_path / "corrupt.gguf"
        model.write_bytes(b"\0" * 1000)
    elif case == "unknown_option":
        extra = ["--fast"]
    out = tmp_path / "out.wav"
    r = run(model, path, n, out, *extra)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("kazeia-decoder: ")
    assert re.search(message, lines[0]), lines[0]
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []


def test_cli_usage() -> None:
    r = run()
    assert r.returncode == 2
    assert "usage: kazeia-decoder" in r.stderr


def pipe_message(codes: np.ndarray) -> bytes:
    """One push of the pipe mode: a uint32 frame count, then the frames' int32 codes."""
    return np.uint32(len(codes)).astype("<u4").tobytes() + codes.astype("<i4").tobytes()


def test_pipe_mode_answers_each_push_as_the_streaming_api(
    decoder_gguf: dict[str, Path], codes_file: tuple[Path, np.ndarray]
) -> None:
    """Pushes of 1, 4 and 45 frames give what the same pushes of the API's stream give, and
    the end of stdin ends the tool well."""
    _, codes = codes_file
    model = str(decoder_gguf["tiny-0.6b"])
    stream = SpeechDecoder(model, threads=2).stream()
    parts = [codes[:1], codes[1:5], codes[5:]]
    expected = np.concatenate([stream.push(p) for p in parts])
    r = subprocess.run(
        [CLI, model, "--pipe", "--threads", "2"],
        input=b"".join(pipe_message(p) for p in parts),
        capture_output=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert np.array_equal(np.frombuffer(r.stdout, dtype="<f4"), expected)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("zero_frames", "a push of 0 frames"),
        ("cut_codes", "stdin ended inside a push's codes"),
        ("cut_count", "stdin ended inside a frame count"),
        ("bad_code", "code 4096 at frame 0, codebook 3 is outside 0..2047"),
    ],
)
def test_pipe_mode_bad_input_is_one_line_and_exit_1(
    decoder_gguf: dict[str, Path], codes_file: tuple[Path, np.ndarray], case: str, message: str
) -> None:
    """A bad message after a good push: the good push's samples came, then one line."""
    _, codes = codes_file
    good = pipe_message(codes[:2])
    if case == "zero_frames":
        bad = pipe_message(codes[:0])
    elif case == "cut_codes":
        bad = pipe_message(codes[:3])[:-5]
    elif case == "cut_count":
        bad = b"\x03\x00"
    else:
        wrong = codes[:2].copy()
        wrong[0, 3] = 4096
        bad = pipe_message(wrong)
    r = subprocess.run(
        [CLI, str(decoder_gguf["tiny-0.6b"]), "--pipe"],
        input=good + bad,
        capture_output=True,
        timeout=300,
    )
    assert r.returncode == 1
    assert len(r.stdout) == 2 * 1920 * 4
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kazeia-decoder: "), r.stderr
    assert re.search(message, lines[0]), lines[0]
