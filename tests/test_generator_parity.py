"""The native talker and code predictor against the official implementation's outputs.

Tolerances: embeddings 1e-5 and logits/hidden states 1e-4 max abs (fp32 noise is ~1e-6); the
smallest top-1/top-2 logit gaps of the references are 1.6e-3 (talker) and 1.5e-4 (code
predictor), so greedy codes must then match exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REFERENCE_MODELS, ref_array

from wyoming_kazeia._native import testing
from wyoming_kazeia.native import Generator

MODES = {
    # mode: speaker, language, non_streaming
    "stream": ("vivian", "english", False),
    "nonstream": ("vivian", "english", True),
    "auto_dialect": ("dylan", "auto", False),
}
FRAMES = 23  # the reference's max_new_tokens=24: 24 talker calls, 23 frames


@pytest.fixture(scope="module", params=REFERENCE_MODELS)
def model(request: pytest.FixtureRequest, talker_gguf: dict[str, Path]) -> tuple[str, Generator]:
    return request.param, Generator(str(talker_gguf[request.param]), threads=2)


@pytest.mark.parametrize("mode", list(MODES))
def test_trace_matches_official(model: tuple[str, Generator], mode: str) -> None:
    name, gen = model
    speaker, language, non_streaming = MODES[mode]
    ids = ref_array(name, "input_ids")
    t = testing.trace(gen, ids, speaker, language, non_streaming, FRAMES)

    def close(ours: np.ndarray, ref: str, tol: float) -> None:
        expected = ref_array(name, f"{mode}_{ref}")
        assert ours.shape == expected.shape, ref
        assert np.abs(ours - expected).max() < tol, ref

    close(t["prefill_embeds"], "prefill_embeds", 1e-5)
    close(t["step_embeds"], "step_embeds", 1e-5)
    close(t["talker_logits"], "talker_logits", 1e-4)
    close(t["talker_hidden"], "talker_hidden", 1e-4)
    assert np.array_equal(t["codes"], ref_array(name, f"{mode}_codes"))
    if mode == "stream":
        cp = ref_array(name, "stream_cp_logits_first6")
        assert np.abs(t["cp_logits"][: len(cp)] - cp).max() < 1e-4


@pytest.mark.parametrize("mode", list(MODES))
def test_generate_greedy_codes(model: tuple[str, Generator], mode: str) -> None:
    """The public API reproduces the official greedy codes (penalty 1.0 as the reference)."""
    name, gen = model
    speaker, language, non_streaming = MODES[mode]
    ids = ref_array(name, "input_ids")
    args = (ids, speaker, language, non_streaming)
    greedy: dict[str, Any] = {"greedy": True, "repetition_penalty": 1.0, "max_frames": FRAMES}
    codes = gen.generate(*args, **greedy)
    assert codes.dtype == np.int32
    assert np.array_equal(codes, ref_array(name, f"{mode}_codes"))
    assert np.array_equal(np.stack(list(gen.frames(*args, **greedy))), codes)


def test_prefill_layout_differs_by_mode(model: tuple[str, Generator]) -> None:
    """Sanity of the test data: the three modes really are different prompts."""
    name, _gen = model
    shapes = {m: ref_array(name, f"{m}_prefill_embeds").shape[0] for m in MODES}
    ids = ref_array(name, "input_ids")
    assert shapes["nonstream"] == shapes["stream"] + len(ids) - 9 + 2
    assert not np.allclose(
        ref_array(name, "stream_prefill_embeds"), ref_array(name, "auto_dialect_prefill_embeds")
    )
