"""Shared fixtures: the project's copy of the official reference data, converted once, and a tiny
random model for the service tests."""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from kazeia_dev.random_checkpoint import main as random_checkpoint
from safetensors.numpy import save_file

from wyoming_kazeia.convert import convert, convert_part, part_metadata, part_tensor_specs

# ggml's Vulkan backend skips CPU-type devices unless they are listed: list device 0, so that
# where ggml was built with Vulkan, CI's lavapipe (Mesa's Vulkan driver on the CPU) is a device
# for tests/test_gpu_backends.py. Set before anything asks ggml for its devices.
os.environ.setdefault("GGML_VK_VISIBLE_DEVICES", "0")

# A hidden folder: the add-on store takes any config.json outside one for an add-on.
DATA = Path(__file__).parent / ".data"
REFERENCE = DATA / "reference"
REFERENCE_MODELS = ("tiny-0.6b", "tiny-1.7b")  # CustomVoice
CLONE_MODELS = ("tiny-base-0.6b", "tiny-base-1.7b")  # Base
DESIGN_MODELS = ("tiny-design-1.7b",)  # VoiceDesign


@functools.cache
def cpu_flags() -> frozenset[str]:
    """/proc/cpuinfo's words: the CPU's flags (x86's "flags", ARM's "Features"), and vendor_id's
    value among them."""
    return frozenset(Path("/proc/cpuinfo").read_text().split())


def amd_cpu() -> bool:
    """Whether this is an x86-64 CPU of AMD's or Hygon's (AMD's Zen cores), as ops/isa.h's
    amd_cpu reads it, where the engine takes some paths by vendor."""
    return platform.machine() == "x86_64" and bool({"AuthenticAMD", "HygonGenuine"} & cpu_flags())


def ref_array(model: str, name: str) -> np.ndarray:
    """An array computed by the official implementation (see tests/.data/README.md)."""
    return np.load(REFERENCE / model / "ref" / f"{name}.npy")


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    """How far below `reference`'s energy the difference of `other` lies, in dB."""
    return float(10 * np.log10(np.sum(reference**2) / np.sum((other - reference) ** 2)))


def ref_codes(model: str, name: str) -> np.ndarray:
    """Reference decoder codes as our API takes them: time-major [T, 16]."""
    return np.ascontiguousarray(ref_array(model, name).T)


def _convert_each(
    factory: pytest.TempPathFactory, part: str, models: tuple[str, ...] = REFERENCE_MODELS
) -> dict[str, Path]:
    """The GGUF of `part` (f32) of each reference model, converted once per test session."""
    return {
        model: convert_part(
            part, REFERENCE / model / "model", factory.mktemp(model) / f"{part}.gguf", "f32"
        )
        for model in models
    }


@pytest.fixture(scope="session")
def decoder_gguf(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """decoder.gguf (f32) of each CustomVoice and Base reference model."""
    return _convert_each(tmp_path_factory, "decoder", REFERENCE_MODELS + CLONE_MODELS)


@pytest.fixture(scope="session")
def talker_gguf(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """talker.gguf (f32) of each reference model, of every kind."""
    return _convert_each(
        tmp_path_factory, "talker", REFERENCE_MODELS + CLONE_MODELS + DESIGN_MODELS
    )


@pytest.fixture(scope="session")
def speaker_encoder_gguf(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """speaker_encoder.gguf of each Base reference model."""
    return _convert_each(tmp_path_factory, "speaker_encoder", CLONE_MODELS)


@pytest.fixture(scope="session")
def speech_encoder_gguf(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """speech_encoder.gguf of each Base reference model."""
    return _convert_each(tmp_path_factory, "speech_encoder", CLONE_MODELS)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A converted (f32) tiny random checkpoint in the real layout: the model of the service
    tests (server, MQTT)."""
    root = tmp_path_factory.mktemp("tiny")
    assert random_checkpoint([str(root / "ckpt"), "--size", "tiny", "--seed", "3", "-q"]) == 0
    convert(root / "ckpt", root / "model", "f32")
    return root / "model"


@pytest.fixture(scope="session")
def tiny_base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Base reference model (tiny-base-0.6b), converted (f32): it clones voices."""
    model = tmp_path_factory.mktemp("tiny-base")
    convert(REFERENCE / CLONE_MODELS[0] / "model", model, "f32")
    return model


@pytest.fixture(scope="session")
def mid_talkers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The talker of mid_checkpoint in f32 and in q8_0 (the default weight type)."""
    base = tmp_path_factory.getbasetemp() / "mid"
    if not (base / "ckpt").exists():
        mid_checkpoint(base / "ckpt")
    paths = {}
    for qtype in ("f32", "q8_0"):
        paths[qtype] = base / f"talker-{qtype}.gguf"
        if not paths[qtype].exists():
            convert_part("talker", base / "ckpt", paths[qtype], qtype)
    return paths


@pytest.fixture(scope="session")
def reference_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference kit's recording of the Base model's voice (1.2 s, 16-bit WAV), as a
    user would give it to be cloned."""
    path = tmp_path_factory.mktemp("recording") / "grandma.wav"
    sf.write(path, ref_array(CLONE_MODELS[0], "ref_audio"), 24000, subtype="PCM_16")
    return path


@pytest.fixture
def crashing_command(tmp_path: Path) -> list[str]:
    """A command that dies by SIGKILL at once: stands in for a crashing kazeia-decoder."""
    crash = tmp_path / "crash.sh"
    crash.write_text("#!/bin/sh\nkill -9 $$\n")
    crash.chmod(0o755)
    return [str(crash)]


WIDTH = 256


def mid_checkpoint(out: Path) -> Path:
    """A random talker checkpoint whose rows fit every quant block (the tiny references' rows
    of 16 values fall back to f16): widths 256, 2 layers, the real vocabularies."""
    out.mkdir(parents=True)
    config = json.loads((REFERENCE / "tiny-0.6b" / "model" / "config.json").read_text())
    tc = config["talker_config"]
    # Talker and code predictor alike: rows wide enough for every quant block.
    stack: dict[str, Any] = {
        "hidden_size": WIDTH,
        "intermediate_size": 2 * WIDTH,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
    }
    tc.update(stack, text_hidden_size=WIDTH)
    tc["code_predictor_config"].update(stack)
    (out / "config.json").write_text(json.dumps(config))
    shutil.copy(REFERENCE / "tiny-0.6b" / "model" / "generation_config.json", out)
    rng = np.random.default_rng(0)
    tensors: dict[str, np.ndarray] = {}
    for spec in part_tensor_specs("talker", part_metadata("talker", out)):
        shape = tuple(reversed(spec["ne"]))
        n = len(spec["sources"])
        part = shape[1:] if spec["transform"] == "stack" else (shape[0] // n, *shape[1:])
        for source in spec["sources"]:
            if "norm" in source:
                data = 1.0 + 0.1 * rng.standard_normal(part)
            elif source.endswith(".bias"):
                data = 0.1 * rng.standard_normal(part)
            elif "embedding" in source:
                data = rng.standard_normal(part)
            else:  # unit-scale activations; heads a little peakier than that
                gain = 3.0 if "head" in source else 1.0
                data = gain * rng.standard_normal(part) / np.sqrt(part[-1])
            tensors[source] = data.astype(np.float32)
    save_file(tensors, str(out / "model.safetensors"))
    return out


# Run in a fresh process with KAZEIA_KERNELS set (e.g. portable: the loops a CPU without AVX2
# runs): argv = out.npz, decoder, codes.npy, threads, precision.
FRESH_DECODE = """
import sys
import numpy as np
from wyoming_kazeia import native
from wyoming_kazeia._native import testing
rng = np.random.default_rng(0)
xs = np.concatenate([rng.uniform(-4, 4, 2000), rng.uniform(-200, 200, 2000)]).astype(np.float32)
codes = np.load(sys.argv[3])
decoder = native.SpeechDecoder(sys.argv[2], threads=int(sys.argv[4]), precision=sys.argv[5])
stream = decoder.stream()
np.savez(
    sys.argv[1],
    isa=np.array(native.KERNEL_ISA),
    bf16_isa=np.array(native.decoder_bf16_isa()),
    xs=xs,
    sin2=testing.sin_squared(xs),
    full=decoder.decode(codes),
    streamed=np.concatenate([stream.push(codes[i : i + 4]) for i in range(0, len(codes), 4)]),
)
"""


def run_fresh(script: str, out: Path, args: list[str], env_vars: dict[str, str]) -> Any:
    """Runs `script` (python -c) in a fresh process with argv [out, *args] and `env_vars` set
    (those given as "" unset, and KAZEIA_KERNELS unless they set it): the arrays it saved to
    `out`."""
    env = {k: v for k, v in os.environ.items() if k != "KAZEIA_KERNELS"}
    env.update({k: v for k, v in env_vars.items() if v})
    for k in [k for k, v in env_vars.items() if not v]:
        env.pop(k, None)
    r = subprocess.run(
        [sys.executable, "-c", script, str(out), *args], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return np.load(out)


def decode_with_kernels(
    forced: str,
    model: Path,
    codes: np.ndarray,
    tmp_path: Path,
    threads: int = 2,
    precision: str = "f32",
) -> Any:
    """FRESH_DECODE's outputs in a fresh process whose kernels KAZEIA_KERNELS forces (""
    leaves the CPU's own choice)."""
    np.save(tmp_path / "codes.npy", codes)
    out = tmp_path / f"{forced or 'cpu'}-{precision}-{threads}.npz"
    args = [str(model), str(tmp_path / "codes.npy"), str(threads), precision]
    return run_fresh(FRESH_DECODE, out, args, {"KAZEIA_KERNELS": forced})
