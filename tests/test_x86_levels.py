"""One x86-64 build on older CPUs: under qemu's Westmere model (SSE4.2, no AVX) and Sandy
Bridge model (AVX, no AVX2/FMA/F16C) the engine loads ggml's sse42 / sandybridge CPU library
and our portable kernels, and matches the official reference and the native run: greedy codes
identical, the decoder within 1e-4 of the official forward and of the native (AVX2) run (fp32;
only the order of sums differs: measured 2.4e-5 and 1.8e-5 against this box's Zen 5 run).

Below x86-64-v2 (qemu64: no SSSE3/SSE4/POPCNT, numpy's floor) every command exits with one line
naming what the CPU lacks. OPENBLAS_CORETYPE is removed from the emulated runs' environment: a
value naming a newer core (this box sets Haswell) makes numpy's OpenBLAS run AVX kernels on the
emulated CPU, which is not what that CPU would do.

Needs the variant build of ggml (script/ggml-wheel; script/setup installs it on x86-64)
and qemu-x86_64; skipped, with the reason, without them.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ref_array, ref_codes

from wyoming_kazeia import native

QEMU = shutil.which("qemu-x86_64-static") or shutil.which("qemu-x86_64") or "qemu-x86_64"

pytestmark = [
    pytest.mark.skipif(platform.machine() != "x86_64", reason="an x86-64 test"),
    pytest.mark.skipif(shutil.which(QEMU) is None, reason="needs qemu-x86_64 (qemu-user-static)"),
    pytest.mark.skipif(
        native.ggml_cpu_variant() == "linked",
        reason="ggml has one CPU library (AVX2): script/ggml-wheel builds the variants",
    ),
]

# The environment of an emulated run: OpenBLAS detects the emulated CPU itself.
EMULATED_ENV = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}

SCRIPT = """
import sys
import numpy as np
from wyoming_kazeia import native
talker, decoder, ids, dec_codes, out = sys.argv[1:]
gen = native.Generator(talker, threads=2)
codes = gen.generate(np.load(ids), "vivian", "english", greedy=True, repetition_penalty=1.0,
                     max_frames=23)
wav = native.SpeechDecoder(decoder, threads=2).decode(np.load(dec_codes))
np.savez(out, codes=codes, wav=wav, variant=native.ggml_cpu_variant(), isa=native.KERNEL_ISA)
"""


@pytest.mark.parametrize(
    ("cpu", "variant"), [("Westmere", "sse42"), ("SandyBridge", "sandybridge")]
)
def test_a_cpu_without_avx2_runs_its_ggml_library_and_matches_the_reference(
    talker_gguf: dict[str, Path],
    decoder_gguf: dict[str, Path],
    tmp_path: Path,
    cpu: str,
    variant: str,
) -> None:
    model = "tiny-0.6b"
    ids, dec_codes, out = tmp_path / "ids.npy", tmp_path / "codes.npy", tmp_path / "out.npz"
    np.save(ids, ref_array(model, "input_ids"))
    np.save(dec_codes, ref_codes(model, "dec_codes")[:40])
    r = subprocess.run(
        [QEMU, "-cpu", cpu, sys.executable, "-c", SCRIPT,
         talker_gguf[model], decoder_gguf[model], ids, dec_codes, out],
        env=EMULATED_ENV,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    got = np.load(out)
    assert str(got["variant"]) == variant
    assert str(got["isa"]).startswith("portable")
    assert np.array_equal(got["codes"], ref_array(model, "stream_codes"))
    assert np.abs(got["wav"] - ref_array(model, "dec_wav_prefix40").ravel()).max() < 1e-4
    native_wav = native.SpeechDecoder(str(decoder_gguf[model]), threads=2).decode(
        np.load(dec_codes)
    )
    assert np.abs(got["wav"] - native_wav).max() < 1e-4


@pytest.mark.parametrize("command", ["wyoming_kazeia", "wyoming_kazeia.synth"])
def test_a_cpu_below_x86_64_v2_gets_one_line_naming_what_it_lacks(command: str) -> None:
    r = subprocess.run(
        [QEMU, "-cpu", "qemu64", sys.executable, "-m", command, "--help"],
        env=EMULATED_ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 1 and r.stdout == ""
    lines = [line for line in r.stderr.splitlines() if not line.startswith("qemu")]
    assert len(lines) == 1 and "SSE4.2" in lines[0] and "POPCNT" in lines[0], r.stderr
