"""Shared fixtures: the project's copy of the official reference data, converted once, and a tiny
random model for the service tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from kazeia_dev.random_checkpoint import main as random_checkpoint

from wyoming_kazeia.convert import convert, convert_part

DATA = Path(__file__).parent / "data"
REFERENCE = DATA / "reference"
REFERENCE_MODELS = ("tiny-0.6b", "tiny-1.7b")  # CustomVoice
CLONE_MODELS = ("tiny-base-0.6b", "tiny-base-1.7b")  # Base
DESIGN_MODELS = ("tiny-design-1.7b",)  # VoiceDesign


def ref_array(model: str, name: str) -> np.ndarray:
    """An array computed by the official implementation (see tests/data/README.md)."""
    return np.load(REFERENCE / model / "ref" / f"{name}.npy")


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


@pytest.fixture
def crashing_command(tmp_path: Path) -> list[str]:
    """A command that dies by SIGKILL at once: stands in for a crashing kazeia-decoder."""
    crash = tmp_path / "crash.sh"
    crash.write_text("#!/bin/sh\nkill -9 $$\n")
    crash.chmod(0o755)
    return [str(crash)]
