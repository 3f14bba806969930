"""The aarch64 build (NEON kernels) against the official reference, under user-mode emulation.

script/cross-arm64 cross-builds the C++ tools with Debian's g++-aarch64-linux-gnu against the
aarch64 wheel of libggml-python; script/arm64 runs them with qemu. Tolerances: the decoder
waveform within 1e-4 of the official single forward (fp32; the NEON and x86 sums differ in
order only), streaming pushes equal to the full decode exactly, greedy codes identical.
Skipped, with the reason, where the cross toolchain or qemu is missing (CI installs both).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import REFERENCE_MODELS, mid_checkpoint, ref_array, ref_codes, snr_db

from wyoming_kazeia.convert import convert_part
from wyoming_kazeia.native import SpeechDecoder

ROOT = Path(__file__).resolve().parents[1]
MODES = {
    # mode: speaker, language, extra flags
    "stream": ("vivian", "english", []),
    "nonstream": ("vivian", "english", ["--non-streaming"]),
    "auto_dialect": ("dylan", "auto", []),
}

pytestmark = pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-g++") is None
    or (shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")) is None,
    reason="needs g++-aarch64-linux-gnu and qemu (script/cross-arm64 installs them as root)",
)


@pytest.fixture(scope="module")
def arm64() -> None:
    """The aarch64 tools, built (or brought up to date) once per test session."""
    built = subprocess.run(
        [str(ROOT / "script" / "cross-arm64")], capture_output=True, text=True, timeout=1200
    )
    assert built.returncode == 0, built.stderr[-3000:]


def run(*args: object) -> subprocess.CompletedProcess[str]:
    cmd = [str(ROOT / "script" / "arm64"), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def decode(decoder: Path, codes: np.ndarray, out: Path, *flags: object) -> np.ndarray:
    codes_path = out.with_suffix(".bin")
    np.ascontiguousarray(codes, dtype="<i4").tofile(codes_path)
    r = run("kazeia-decoder", decoder, codes_path, len(codes), out, "--float", *flags)
    assert r.returncode == 0, r.stderr
    wav, rate = sf.read(out, dtype="float32")
    assert rate == 24000
    return np.asarray(wav)


@pytest.mark.parametrize("model", REFERENCE_MODELS)
def test_decoder_matches_the_official_and_streams_exactly(
    arm64: None, decoder_gguf: dict[str, Path], tmp_path: Path, model: str
) -> None:
    codes = ref_codes(model, "dec_codes")[:40]
    full = decode(decoder_gguf[model], codes, tmp_path / "full.wav")
    assert np.abs(full - ref_array(model, "dec_wav_prefix40").ravel()).max() < 1e-4
    for k in (1, 4):
        streamed = decode(decoder_gguf[model], codes, tmp_path / f"k{k}.wav", "--chunk", k)
        assert np.array_equal(streamed, full), k


def test_bf16_decoder_stays_within_the_bf16_error_and_streams_exactly(
    arm64: None, decoder_gguf: dict[str, Path], tmp_path: Path
) -> None:
    """decoder_precision bf16 on NEON: as far from f32 as the x86 paths and as close to them as
    they are to each other (tests/test_decoder_precision.py: above 20 dB below the signal
    both), and pushes equal to the full decode exactly."""
    codes = ref_codes("tiny-0.6b", "dec_codes")[:40]
    model = decoder_gguf["tiny-0.6b"]
    full = decode(model, codes, tmp_path / "full.wav", "--precision", "bf16")
    f32 = SpeechDecoder(str(model), threads=2).decode(codes)
    x86 = SpeechDecoder(str(model), threads=2, precision="bf16").decode(codes)
    assert 20 < snr_db(f32, full) < 60
    assert snr_db(x86, full) > 20
    streamed = decode(model, codes, tmp_path / "k3.wav", "--chunk", 3, "--precision", "bf16")
    assert np.array_equal(streamed, full)


@pytest.mark.parametrize("model", REFERENCE_MODELS)
@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_codes_equal_the_official_ones(
    arm64: None, talker_gguf: dict[str, Path], tmp_path: Path, model: str, mode: str
) -> None:
    speaker, language, flags = MODES[mode]
    ids = ref_array(model, "input_ids").astype("<i4")
    ids_path, out = tmp_path / "ids.bin", tmp_path / "codes.bin"
    ids.tofile(ids_path)
    r = run(
        "kazeia-generate", talker_gguf[model], ids_path, len(ids), out,
        "--speaker", speaker, "--language", language,
        "--greedy", "--repetition-penalty", "1", "--max-frames", 23, *flags,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    codes = np.fromfile(out, dtype="<i4").reshape(-1, 16)
    assert np.array_equal(codes, ref_array(model, f"{mode}_codes"))


@pytest.mark.parametrize("kv_cache_type", ["f32", "f16"])
def test_the_quantized_prefill_gives_the_x86_codes(
    arm64: None, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, kv_cache_type: str
) -> None:
    """A q8_0 talker wide enough for its quant blocks: the prompt's prefill runs the q8_0 GEMM
    (here its NEON dot-product path: qemu's CPU has it), whose every path gives the same bits,
    and so do the code predictor's steps where its matrices are kept as the GEMM's panels (the
    same last-level cache reported to both builds), so the greedy codes equal those of the
    native x86-64 build. With an f16 K/V cache (the NEON
    widening and paired scores against F16C's) the first frame's: what the prompt's rows give
    through the rounded cache; the same values summed in other orders, later frames of random
    weights reach near-ties whose argmax the order decides (measured: codes 2-15 of frame 4)."""
    base = tmp_path_factory.getbasetemp() / "mid-arm64"
    talker = base / "talker-q8_0.gguf"
    if not talker.exists():
        convert_part("talker", mid_checkpoint(base / "ckpt"), talker, "q8_0")
    rng = np.random.default_rng(5)
    text = rng.integers(1000, 100000, size=20)
    ids = np.array([151644, 77091, 198, *text, 151645, 198, 151644, 77091, 198], dtype="<i4")
    ids_path = tmp_path / "ids.bin"
    ids.tofile(ids_path)
    args = [talker, ids_path, len(ids)]
    flags = ["--speaker", "vivian", "--language", "english", "--greedy", "--max-frames", 12]
    flags += ["--kv-cache-type", kv_cache_type]
    native_out, arm_out = tmp_path / "x86.bin", tmp_path / "arm64.bin"
    native_cli = str(Path(sys.executable).parent / "kazeia-generate")
    x86 = subprocess.run(
        [native_cli, *map(str, [*args, native_out, *flags])],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert x86.returncode == 0, x86.stderr
    r = run("kazeia-generate", *args, arm_out, *flags)
    assert r.returncode == 0, r.stderr
    codes = np.fromfile(arm_out, dtype="<i4").reshape(-1, 16)
    assert len(codes) == 12
    compared = 12 if kv_cache_type == "f32" else 1
    x86_codes = np.fromfile(native_out, dtype="<i4").reshape(-1, 16)
    assert np.array_equal(codes[:compared], x86_codes[:compared])
