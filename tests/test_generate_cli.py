"""kazeia-generate: the official greedy codes from the command line, clear failures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REFERENCE_MODELS, ref_array

from wyoming_kazeia.native import Generator, frame_budget

# The console script pip installed beside the interpreter running the tests.
CLI = str(Path(sys.executable).parent / "kazeia-generate")
FRAMES = 23  # the reference's 24 talker calls give 23 frames
MODES = {
    # mode: speaker, language, extra flags
    "stream": ("vivian", "english", []),
    "nonstream": ("vivian", "english", ["--non-streaming"]),
    "auto_dialect": ("dylan", "auto", []),
}


def run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=300)


def ids_file(tmp_path: Path, model: str) -> tuple[Path, int]:
    ids = ref_array(model, "input_ids").astype("<i4")
    path = tmp_path / "ids.bin"
    ids.tofile(path)
    return path, len(ids)


@pytest.mark.parametrize("model", REFERENCE_MODELS)
@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_codes_equal_the_official_ones(
    tmp_path: Path, talker_gguf: dict[str, Path], model: str, mode: str
) -> None:
    speaker, language, flags = MODES[mode]
    ids, n = ids_file(tmp_path, model)
    out = tmp_path / "codes.bin"
    r = run(
        talker_gguf[model], ids, n, out, "--speaker", speaker, "--language", language,
        "--greedy", "--repetition-penalty", "1", "--max-frames", FRAMES, *flags,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(FRAMES)
    codes = np.fromfile(out, dtype="<i4").reshape(-1, 16)
    assert np.array_equal(codes, ref_array(model, f"{mode}_codes"))


def test_sampling_follows_the_seed_and_the_default_budget(
    tmp_path: Path, talker_gguf: dict[str, Path]
) -> None:
    """Without --max-frames the engine's budget for the text applies (random weights never say
    eos); the same seed gives the Python API's codes."""
    ids, n = ids_file(tmp_path, "tiny-0.6b")
    out = tmp_path / "codes.bin"
    r = run(talker_gguf["tiny-0.6b"], ids, n, out, "--seed", "7", "--threads", "1")
    assert r.returncode == 0, r.stderr
    codes = np.fromfile(out, dtype="<i4").reshape(-1, 16)
    gen = Generator(str(talker_gguf["tiny-0.6b"]), threads=2)
    input_ids = ref_array("tiny-0.6b", "input_ids")
    budget = frame_budget(gen.text_tokens(input_ids))
    assert len(codes) == int(r.stdout) <= budget
    expected = gen.generate(input_ids, "vivian", "auto", seed=7, max_frames=budget)
    assert np.array_equal(codes, expected)


def test_the_kv_cache_type_reaches_the_generator(
    tmp_path: Path, mid_talkers: dict[str, Path]
) -> None:
    """A q8_0 talker: the default (auto) gives the Python API's codes with an f16 cache,
    --kv-cache-type f32 those with an f32 cache, and the two differ (random weights: sampling
    draws other codes from slightly moved distributions)."""
    ids = np.array([151644, 77091, 198, 9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198])
    path = tmp_path / "ids.bin"
    ids.astype("<i4").tofile(path)
    gen = Generator(str(mid_talkers["q8_0"]), threads=2)
    codes = {}
    for flags, cache in (([], "f16"), (["--kv-cache-type", "f32"], "f32")):
        out = tmp_path / f"codes-{cache}.bin"
        r = run(mid_talkers["q8_0"], path, len(ids), out, "--seed", "7", "--max-frames", 20, *flags)
        assert r.returncode == 0, r.stderr
        codes[cache] = np.fromfile(out, dtype="<i4").reshape(-1, 16)
        gen.kv_cache_type = cache
        expected = gen.generate(ids, "vivian", "auto", seed=7, max_frames=20)
        assert np.array_equal(codes[cache], expected), cache
    assert not np.array_equal(codes["f16"], codes["f32"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ids", 5], "has 100 bytes, expected 20 for 5 int32 ids"),
        (["ids", 25, "--speaker", "nobody"], "unknown speaker 'nobody'"),
        (["ids", 25, "--language", "klingon"], "unknown language 'klingon'"),
        (["ids", 25, "--top-p", "1.5"], "top_p must be in (0, 1]"),
        (["ids", 25, "--max-frames", "0"], "invalid --max-frames '0'"),
        (["ids", 25, "--bogus"], "unknown option --bogus"),
        (["ids", 25, "--kv-cache-type", "q8_0"], "unknown K/V cache type 'q8_0' (auto|f32|f16)"),
        (["bad-ids", 25], "assistant prompt"),
    ],
)
def test_bad_input_is_one_line(
    tmp_path: Path, talker_gguf: dict[str, Path], args: list[object], message: str
) -> None:
    ids = tmp_path / "ids"
    ref_array("tiny-0.6b", "input_ids")[:25].astype("<i4").tofile(ids)
    (tmp_path / "bad-ids").write_bytes(np.arange(25, dtype="<i4").tobytes())
    name, *rest = args
    out = tmp_path / "codes.bin"
    r = run(talker_gguf["tiny-0.6b"], tmp_path / str(name), rest[0], out, *rest[1:])
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kazeia-generate: ") and message in lines[0]
    assert not out.exists()
