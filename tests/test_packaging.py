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

# ggml's CPU library: the linked one, or one of a variant build's (libkazeia-ggml-cpu-<level>.so)
CPU_LIBRARY = re.compile(r"libkazeia-ggml-cpu(-[a-z0-9_]+)?\.so")
GPU_LIBRARIES = ("libkazeia-ggml-vulkan.so", "libkazeia-ggml-cuda.so")
# The test hooks' submodule docstring (native/bindings/module.cpp).
TESTING_DOC = b"Test hooks and bench probes"

# Loads the stock ggml of libggml-python (as llama-cpp-python or another binding would) before
# or after our extension, decodes, and reports which ggml libraries the process mapped.
SCRIPT = """
import ctypes, sys
from pathlib import Path
import numpy as np

def load_other():
    import libggml
    root = Path(libggml.__file__).parent
    lib = next(d for d in (root / "lib64", root / "lib") if (d / "libggml.so.0").exists())
    # A variant build (GGML_BACKEND_DL) has no libggml-cpu.so.0: its CPU libraries are plugins.
    for name in ("libggml-base.so.0", "libggml-cpu.so.0", "libggml.so.0"):
        if (lib / name).exists():
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
    assert "libkazeia-ggml-base.so" in mapped
    assert any(CPU_LIBRARY.fullmatch(name) for name in mapped)
    assert "libggml.so.0" in mapped  # the other one really is loaded too
    codes = np.arange(32).reshape(2, 16)
    expected = _native.SpeechDecoder(str(decoder_gguf["tiny-0.6b"]), threads=2).decode(codes)
    assert np.array_equal(np.load(out), expected)


def test_native_files_are_bundled() -> None:
    """The extension, its tool and the renamed ggml ship inside the package directory."""
    pkg = Path(_native.__file__).parent
    tools = [tool_path("kazeia-decoder"), tool_path("kazeia-generate")]
    assert all(tool.is_file() for tool in tools)
    libs = sorted(p.name for p in (pkg / "lib").iterdir())
    cpu = [name for name in libs if CPU_LIBRARY.fullmatch(name)]
    # A GPU build (script/setup --backend vulkan|cuda) adds its backend's module.
    gpu = [name for name in libs if name in GPU_LIBRARIES]
    assert cpu and sorted({"libkazeia-ggml-base.so", "libkazeia-ggml.so", *cpu, *gpu}) == libs
    # One CPU library, or a variant build's set (one per x86-64 level, from x64 up).
    assert cpu == ["libkazeia-ggml-cpu.so"] or "libkazeia-ggml-cpu-x64.so" in cpu
    # What we ship names only the renamed libraries (dynamic section: NEEDED and SONAME).
    for path in [Path(_native.__file__), *tools, *(pkg / "lib").iterdir()]:
        dynamic = subprocess.run(
            ["readelf", "-d", str(path)], capture_output=True, text=True, check=True
        ).stdout
        names = re.findall(r"\((?:NEEDED|SONAME)\)\s+\S+ \S+: \[(.+?)\]", dynamic)
        ggml = [n for n in names if "ggml" in n]
        assert ggml, path.name
        assert all(n.startswith("libkazeia-ggml") for n in ggml), (path.name, ggml)


def _imported_modules(source: str) -> set[str]:
    """Top-level names of every module a Python source imports (absolute imports)."""
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_built_wheel_holds_only_the_product(tmp_path: Path) -> None:
    """The wheel (what pip and the Docker image install) is the product alone: the package
    with its native files, no developer tooling, nothing that imports torch or kazeia_dev, no
    test hooks in the extension."""
    import os
    import zipfile

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(tmp_path), str(repo)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = tmp_path.glob("wyoming_kazeia-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        sources = {n: zf.read(n).decode() for n in names if n.endswith(".py")}
        (extension,) = [n for n in names if re.fullmatch(r"wyoming_kazeia/_native\..*\.so", n)]
        shipped = zf.read(extension)
    assert {n.split("/")[0] for n in names} == {
        "wyoming_kazeia",
        wheel.name.split("-py3")[0].split("-cp")[0] + ".dist-info",
    }
    assert not [n for n in names if "/dev/" in n or "kazeia_dev" in n or "bench" in n]
    assert "wyoming_kazeia/native.py" in sources and "wyoming_kazeia/__main__.py" in sources
    # The web page (--http-uri) ships as package data.
    assert {f"wyoming_kazeia/web/{n}" for n in ("index.html", "app.js", "style.css")} <= set(names)
    for name, source in sources.items():
        imported = _imported_modules(source)
        assert not imported & {"torch", "kazeia_dev", "transformers", "safetensors"}, name
    # The test hooks (_native.testing) are in the development build the tests run on, not in
    # the wheel: their docstrings are in one extension and not in the other.
    hooks = [TESTING_DOC, b"Memory read bandwidth in GB/s"]
    developed = Path(_native.__file__).read_bytes()
    assert hasattr(_native, "testing") and all(doc in developed for doc in hooks)
    assert not [doc for doc in hooks if doc in shipped]
