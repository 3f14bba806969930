"""Shared fixtures: the project's copy of the official reference data, converted once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wyoming_kazeia.convert import convert_decoder, convert_talker

DATA = Path(__file__).parent / "data"
REFERENCE = DATA / "reference"
REFERENCE_MODELS = ("tiny-0.6b", "tiny-1.7b")


def ref_array(model: str, name: str) -> np.ndarray:
    """An array computed by the official implementation (see tests/data/README.md)."""
    return np.load(REFERENCE / model / "ref" / f"{name}.npy")


def ref_codes(model: str, name: str) -> np.ndarray:
    """Reference decoder codes as our API takes them: time-major [T, 16]."""
    return np.ascontiguousarray(ref_array(model, name).T)


@pytest.fixture(scope="session")
def decoder_gguf(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """decoder.gguf (f32) of each reference model."""
    out = {}
    for model in REFERENCE_MODELS:
        path = tmp_path_factory.mktemp(model) / "decoder.gguf"
        out[model] = convert_decoder(REFERENCE / model / "model", path, "f32")
    return out


@pytest.fixture(scope="session")
def talker_gguf(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """talker.gguf (f32) of each reference model."""
    out = {}
    for model in REFERENCE_MODELS:
        path = tmp_path_factory.mktemp(model) / "talker.gguf"
        out[model] = convert_talker(REFERENCE / model / "model", path, "f32")
    return out
