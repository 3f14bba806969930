"""The package carries its own renamed ggml: another ggml in the same process is no clash."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from wyoming_kazeia import _native
from wyoming_kazeia.native import tool_path

# Loads the stock ggml of libggml-python (as llama-cpp-python or another binding would) before
# or after our extension, decodes, and reports which ggml libraries the process mapped.
SCRIPT = """
import ctypes, sys
from pathlib import Path
import numpy as np

def load_other():
    import libggml
    lib = Path(libggml.__file__).parent / "lib64"
    for name in ("libggml-base.so.0", "libggml-cpu.so.0", "libggml.so.0"):
        ctypes.CDLL(str(lib / name), mode=ctypes.RTLD_GLOBAL)

if sys.argv[2] == "other-first":
    load_other()
from wyoming_kazeia.native import SpeechDecoder
if sys.argv[2] == "ours-first":
    load_other()
wav = SpeechDecoder(sys.argv[1], threads=2).decode(np.arange(32).reshape(2, 16))
np.save(sys.argv[3], wav)
maps = {Path(l.split()[-1]).name for l in open("/proc/self/maps") if "ggml" in l}
print(" ".join(sorted(maps)))
"""


@pytest.mark.parametrize("order", ["other-first", "ours-first"])
def test_second_ggml_in_process(tmp_path: Path, decoder_gguf: dict[str, Path], order: str) -> None:
    pytest.importorskip("libggml")
    out = tmp_path / "wav.npy"
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(decoder_gguf["tiny-0.6b"]), order, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    mapped = set(r.stdout.split())
    assert {"libkazeia-ggml.so", "libkazeia-ggml-base.so", "libkazeia-ggml-cpu.so"} <= mapped
    assert "libggml.so.0" in mapped  # the other one really is loaded too
    codes = np.arange(32).reshape(2, 16)
    expected = _native.SpeechDecoder(str(decoder_gguf["tiny-0.6b"]), threads=2).decode(codes)
    assert np.array_equal(np.load(out), expected)


def test_native_files_are_bundled() -> None:
    """The extension, its tool and the renamed ggml ship inside the package directory."""
    pkg = Path(_native.__file__).parent
    assert tool_path("kazeia-decoder").is_file()
    libs = sorted(p.name for p in (pkg / "lib").iterdir())
    assert libs == ["libkazeia-ggml-base.so", "libkazeia-ggml-cpu.so", "libkazeia-ggml.so"]
    # What we ship names only the renamed libraries (dynamic section: NEEDED and SONAME).
    for path in [Path(_native.__file__), tool_path("kazeia-decoder"), *(pkg / "lib").iterdir()]:
        dynamic = subprocess.run(
            ["readelf", "-d", str(path)], capture_output=True, text=True, check=True
        ).stdout
        names = re.findall(r"\((?:NEEDED|SONAME)\)\s+\S+ \S+: \[(.+?)\]", dynamic)
        ggml = [n for n in names if "ggml" in n]
        assert ggml, path.name
        assert all(n.startswith("libkazeia-ggml") for n in ggml), (path.name, ggml)
