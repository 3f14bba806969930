"""Voices beyond the built-in speakers against the official implementation's outputs: Base
cloning (x-vector only and in context), CustomVoice 1.7B with an instruction, VoiceDesign.

The reference sets (tests/.data/reference/tiny-base-*, tiny-design-1.7b, and the instruct arrays
of tiny-1.7b) come from `script/make-reference`. Here the engine takes the official speaker
embedding and reference codes as its inputs, so these tests pin down the prompt layouts and the
generation; the encoders that compute those inputs have their own tests.

Tolerances as in test_generator_parity.py: embeddings 1e-5, logits and hidden states 1e-4 max
abs; greedy codes exactly (the official margins are in each set's manifest.json _summary).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import CLONE_MODELS, DESIGN_MODELS, ref_array

from wyoming_kazeia._native import testing
from wyoming_kazeia.native import Generator, InputError, Voice

FRAMES = 23  # the references' max_new_tokens=24: 24 talker calls, 23 frames

# mode: (in context, language, non_streaming, recording: "" = ref_audio, "16k" = ref_audio_16k)
CLONE_MODES = {
    "clone_icl": (True, "english", False, ""),
    "clone_icl_nonstream": (True, "english", True, ""),
    "clone_icl_auto": (True, "auto", False, ""),
    "clone_icl_long": (True, "english", False, "16k"),
    "clone_xvec": (False, "english", False, ""),
    "clone_xvec_nonstream": (False, "english", True, ""),
}


def clone_voice(model: str, in_context: bool, recording: str) -> Voice:
    """The official clone prompt of a reference set as the engine's Voice."""
    prefix = f"ref{recording}"
    xvector = ref_array(model, f"{prefix}_xvector")
    if not in_context:
        return Voice(speaker_embedding=xvector)
    return Voice(
        speaker_embedding=xvector,
        ref_ids=ref_array(model, "ref_ids"),
        ref_codes=ref_array(model, f"{prefix}_codes"),
    )


def assert_trace_matches(t: dict[str, Any], model: str, mode: str) -> None:
    def close(what: str, tol: float) -> None:
        expected = ref_array(model, f"{mode}_{what}")
        assert t[what].shape == expected.shape, what
        assert np.abs(t[what] - expected).max() < tol, what

    close("prefill_embeds", 1e-5)
    close("step_embeds", 1e-5)
    close("talker_logits", 1e-4)
    close("talker_hidden", 1e-4)
    assert np.array_equal(t["codes"], ref_array(model, f"{mode}_codes"))


@pytest.fixture(scope="module", params=CLONE_MODELS)
def base(request: pytest.FixtureRequest, talker_gguf: dict[str, Path]) -> tuple[str, Generator]:
    return request.param, Generator(str(talker_gguf[request.param]), threads=2)


@pytest.mark.parametrize("mode", list(CLONE_MODES))
def test_a_cloned_voice_generates_the_official_codes(
    base: tuple[str, Generator], mode: str
) -> None:
    name, gen = base
    in_context, language, non_streaming, recording = CLONE_MODES[mode]
    voice = clone_voice(name, in_context, recording)
    ids = ref_array(name, "input_ids")
    t = testing.trace(
        gen, ids, voice=voice, language=language, non_streaming=non_streaming, max_frames=FRAMES
    )
    assert_trace_matches(t, name, mode)


def test_a_cloned_voice_reuses_its_prompt_exactly(base: tuple[str, Generator]) -> None:
    """The voice's rows (its transcript's included) are computed once, then reused: later
    syntheses give the same codes, also with another text after the same voice."""
    name, gen = base
    voice = clone_voice(name, True, "")
    ids = ref_array(name, "input_ids")
    for non_streaming in (False, True):
        mode = "clone_icl_nonstream" if non_streaming else "clone_icl"
        for _ in range(2):
            t = testing.trace(gen, ids, voice=voice, language="english",
                              non_streaming=non_streaming, max_frames=FRAMES)  # fmt: skip
            assert np.array_equal(t["codes"], ref_array(name, f"{mode}_codes"))
    # A transcript longer than the reference's frames: every prompt row but the last is the
    # voice's.
    long_text = np.concatenate(
        [ref_array(name, "ref_ids")[:3], np.full(40, 1879), ref_array(name, "ref_ids")[-2:]]
    )
    wordy = Voice(speaker_embedding=ref_array(name, "ref_xvector"), ref_ids=long_text,
                  ref_codes=ref_array(name, "ref_codes")[:4])  # fmt: skip
    first = gen.generate(ids, voice=wordy, greedy=True, max_frames=5)
    assert np.array_equal(gen.generate(ids, voice=wordy, greedy=True, max_frames=5), first)


def test_the_public_api_clones_greedily_like_the_official(base: tuple[str, Generator]) -> None:
    name, gen = base
    voice = clone_voice(name, True, "")
    codes = gen.generate(
        ref_array(name, "input_ids"),
        voice=voice,
        language="english",
        greedy=True,
        repetition_penalty=1.0,
        max_frames=FRAMES,
    )
    assert np.array_equal(codes, ref_array(name, "clone_icl_codes"))


def test_the_instruction_of_a_custom_voice_follows_the_official(
    talker_gguf: dict[str, Path],
) -> None:
    gen = Generator(str(talker_gguf["tiny-1.7b"]), threads=2)
    voice = Voice(instruct_ids=ref_array("tiny-1.7b", "instruct_ids"))
    t = testing.trace(
        gen,
        ref_array("tiny-1.7b", "input_ids"),
        "vivian",
        voice=voice,
        language="english",
        non_streaming=True,
        max_frames=FRAMES,
    )
    assert_trace_matches(t, "tiny-1.7b", "instruct")


@pytest.mark.parametrize("mode", ["design", "design_stream"])
def test_a_designed_voice_follows_the_official(talker_gguf: dict[str, Path], mode: str) -> None:
    (name,) = DESIGN_MODELS
    gen = Generator(str(talker_gguf[name]), threads=2)
    t = testing.trace(
        gen,
        ref_array(name, "input_ids"),
        voice=Voice(instruct_ids=ref_array(name, "design_ids")),
        language="english",
        non_streaming=mode == "design",
        max_frames=FRAMES,
    )
    assert_trace_matches(t, name, mode)


# --------------------------------------------------------------------------- wrong voices


def test_each_kind_refuses_the_voices_it_cannot_speak(talker_gguf: dict[str, Path]) -> None:
    ids = ref_array("tiny-base-0.6b", "input_ids")
    xvector = ref_array("tiny-base-0.6b", "ref_xvector")
    instruct = Voice(instruct_ids=ref_array("tiny-1.7b", "instruct_ids"))
    base = Generator(str(talker_gguf["tiny-base-0.6b"]), threads=1)
    custom = Generator(str(talker_gguf["tiny-0.6b"]), threads=1)
    design = Generator(str(talker_gguf["tiny-design-1.7b"]), threads=1)
    cases = [
        (base, "vivian", None, "no built-in speakers"),
        (base, "", None, "needs the speaker embedding"),
        (base, "", Voice(speaker_embedding=xvector[:-1]), "this model takes 16"),
        (
            base,
            "",
            Voice(speaker_embedding=xvector, ref_ids=ref_array("tiny-base-0.6b", "ref_ids")),
            "both the reference transcript",
        ),
        (base, "", instruct, "Base model takes no instruction"),
        (custom, "vivian", Voice(speaker_embedding=xvector), "needs a Base model"),
        (custom, "vivian", instruct, "0.6B CustomVoice model takes no instruction"),
        (design, "vivian", None, "VoiceDesign model has no speakers"),
    ]
    for gen, speaker, voice, message in cases:
        with pytest.raises(InputError, match=message):
            gen.generate(ids, speaker, voice=voice, max_frames=2)
    bad_codes = ref_array("tiny-base-0.6b", "ref_codes").copy()
    bad_codes[3, 5] = 2048
    voice = Voice(
        speaker_embedding=xvector,
        ref_ids=ref_array("tiny-base-0.6b", "ref_ids"),
        ref_codes=bad_codes,
    )
    with pytest.raises(InputError, match=r"frame 3, codebook 5"):
        base.generate(ids, voice=voice, max_frames=2)
