"""The talker's K/V cache type (kv_cache_type): an f16 cache's error against f32 beside that of
q8_0 weights, which type `auto` takes, and what a change reaches (the next generation, its own
voice prefixes).

The errors are measured on the mid-size random checkpoint of tests/test_quantization.py (widths
256, 2 layers, 4 query heads over 2 key/value heads: the talker's pairs), teacher-forced: every
run is fed the codes of the exact run (f32 weights, f32 cache), so that each step's logits are
compared on the same inputs all along an answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kazeia_dev.bench.quality import mean_kl

from wyoming_kazeia._native import testing
from wyoming_kazeia.engine import Engine
from wyoming_kazeia.native import Generator
from wyoming_kazeia.settings import EngineSettings

FRAMES = 150
IDS = np.array([151644, 77091, 198, 9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198])
CODES = slice(0, 2048)  # the control tokens after the codes are never sampled


def forced_trace(generator: Generator, cache: str, codes: np.ndarray | None) -> dict[str, Any]:
    generator.kv_cache_type = cache
    return testing.trace(generator, IDS, "vivian", "english", False, FRAMES, forced_codes=codes)


def test_an_f16_cache_moves_the_logits_far_less_than_q8_0_weights(
    mid_talkers: dict[str, Path],
) -> None:
    """Over a 150-frame answer, the f16 cache moves the next-code distributions less than 1e-4
    times as far as q8_0 weights do (mean KL against the exact run), so that a cache rounded to
    bf16's 8 significant bits instead of f16's 11, about 60 times f16's KL, fails; their argmax
    stays the same; with q8_0 weights (what `auto` pairs it with) it adds nothing measurable to
    the weights' error."""
    exact_weights = Generator(str(mid_talkers["f32"]), threads=2)
    q8_weights = Generator(str(mid_talkers["q8_0"]), threads=2)
    exact = forced_trace(exact_weights, "f32", None)
    codes = exact["codes"]
    assert codes.shape == (FRAMES, 16)
    runs = {
        "f16 cache": forced_trace(exact_weights, "f16", codes),
        "q8_0 weights": forced_trace(q8_weights, "f32", codes),
        "q8_0 weights, f16 cache": forced_trace(q8_weights, "f16", codes),
    }
    ref = exact["talker_logits"][:, CODES]
    kl, top1 = {}, {}
    for name, run in runs.items():
        logits = run["talker_logits"][:, CODES]
        assert logits.shape == ref.shape
        kl[name] = mean_kl(ref, logits)
        top1[name] = float((ref.argmax(-1) == logits.argmax(-1)).mean())
    print(f"\nmean KL against the exact run: {kl}; argmax agreement: {top1}")  # pytest -s
    assert 0 < kl["f16 cache"] < kl["q8_0 weights"] / 1e4, kl
    assert top1["f16 cache"] >= 0.98, top1
    assert kl["q8_0 weights, f16 cache"] < 1.2 * kl["q8_0 weights"], kl


def test_auto_takes_f16_with_quantized_weights_only(mid_talkers: dict[str, Path]) -> None:
    exact_weights = Generator(str(mid_talkers["f32"]), threads=2)
    q8_weights = Generator(str(mid_talkers["q8_0"]), threads=2)
    assert exact_weights.kv_cache_type == q8_weights.kv_cache_type == "f32"  # as loaded
    exact_weights.kv_cache_type = q8_weights.kv_cache_type = "auto"
    assert exact_weights.kv_cache_type == "f32" and q8_weights.kv_cache_type == "f16"
    with pytest.raises(ValueError, match=r"unknown K/V cache type 'bf16' \(auto\|f32\|f16\)"):
        q8_weights.kv_cache_type = "bf16"
    assert q8_weights.kv_cache_type == "f16"


def computations(generator: Generator, cache: str) -> int:
    """The graph computations of a 3-frame generation with `cache`: one more where the voice
    rows' K/V are computed than where they are loaded."""
    generator.kv_cache_type = cache
    frames = generator.frames(IDS, "vivian", "english", greedy=True, max_frames=3)
    assert len(list(frames)) == 3
    return int(frames.stats["computations"])


def test_a_changed_cache_type_reaches_the_next_generation_with_its_own_voice_prefix(
    mid_talkers: dict[str, Path],
) -> None:
    """The voice rows' K/V, kept per voice, are kept per cache type too: the first f16
    generation after f32 ones computes its own (the rows after the first attend to the rounded
    ones), as a fresh generator does, and each type's are loaded after that."""
    generator = Generator(str(mid_talkers["f32"]), threads=2)
    computed = computations(generator, "f32")
    loaded = computations(generator, "f32")
    assert computed == loaded + 1
    assert computations(generator, "f16") == computed
    assert [computations(generator, c) for c in ("f16", "f32", "f16")] == [loaded] * 3

    first = forced_trace(generator, "f32", None)
    half = forced_trace(generator, "f16", None)
    fresh = Generator(str(mid_talkers["f32"]), threads=2)
    fresh_half = forced_trace(fresh, "f16", None)
    for key in ("talker_logits", "cp_logits", "codes"):
        assert np.array_equal(half[key], fresh_half[key]), key
    assert not np.array_equal(first["talker_logits"], half["talker_logits"])


def test_the_engine_applies_the_setting_live(tiny_model: Path) -> None:
    """`auto` on the f32 tiny model keeps the exact cache; a setting applied between syntheses
    reaches the loaded generator, which is not loaded again."""
    engine = Engine(tiny_model, EngineSettings(max_frames=4, seed=1))
    generator = engine.generator
    assert engine.settings.kv_cache_type == "auto" and generator.kv_cache_type == "f32"
    engine.apply_settings(engine.settings.replace(kv_cache_type="f16"))
    assert engine.generator is generator and generator.kv_cache_type == "f16"
    assert len(np.concatenate(list(engine.synthesize("Hello.", "vivian")))) > 0
