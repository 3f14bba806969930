"""Cloned, described and instructed voices through the engine, end to end: text and a
recording in, audio out, against the official implementation's audio.

Tolerance: the engine yields int16 PCM, so audio is compared at 1e-4 + one quantization step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REFERENCE, ref_array

from wyoming_kazeia.convert import convert
from wyoming_kazeia.engine import Engine
from wyoming_kazeia.errors import InputError
from wyoming_kazeia.settings import EngineSettings

GREEDY: dict[str, Any] = dict(greedy=True, repetition_penalty=1.0, max_frames=23)  # as the refs
PCM_TOLERANCE = 1e-4 + 1 / 32768


def voice_texts(model: str) -> dict[str, str]:
    manifest = json.loads((REFERENCE / model / "ref" / "manifest.json").read_text())
    texts: dict[str, str] = manifest["_notes"]["voice_texts"]
    return texts


def audio_of(synthesis: object) -> np.ndarray:
    return np.concatenate(list(synthesis)).astype(np.float32) / 32768  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> dict[str, Engine]:
    """The Base and VoiceDesign reference models, and a tiny CustomVoice 0.6B."""
    out = {"custom-0.6b": Engine(tiny_model, EngineSettings(threads=2))}
    for model in ("tiny-base-0.6b", "tiny-design-1.7b"):
        folder = tmp_path_factory.mktemp(model)
        convert(REFERENCE / model / "model", folder, "f32")
        out[model] = Engine(folder, EngineSettings(threads=2))
    return out


def test_the_voice_texts_tokenize_as_the_official(engines: dict[str, Engine]) -> None:
    for model in ("tiny-base-0.6b", "tiny-design-1.7b"):
        tok, texts = engines[model].tokenizer, voice_texts(model)
        assert tok.prompt_ids(texts["text"]) == ref_array(model, "input_ids").tolist()
    base = voice_texts("tiny-base-0.6b")["ref_text"]
    assert engines["tiny-base-0.6b"].tokenizer.reference_ids(base) == (
        ref_array("tiny-base-0.6b", "ref_ids").tolist()
    )
    design = voice_texts("tiny-design-1.7b")["design"]
    assert engines["tiny-design-1.7b"].tokenizer.instruction_ids(design) == (
        ref_array("tiny-design-1.7b", "design_ids").tolist()
    )


@pytest.mark.parametrize(
    ("stream_chunk", "decoder_subprocess"), [(4, False), (0, False), (4, True), (0, True)]
)
def test_a_cloned_voice_speaks_the_officials_audio(
    engines: dict[str, Engine], stream_chunk: int, decoder_subprocess: bool
) -> None:
    """In context: the recording's codes and transcript; streamed or decoded in one pass, in
    process or by the kazeia-decoder child (which decodes the reference first, unplayed)."""
    name = "tiny-base-0.6b"
    engine, texts = engines[name], voice_texts(name)
    voice = engine.clone_prompt(ref_array(name, "ref_audio"), 24000, texts["ref_text"])
    assert voice.ref_codes is not None
    assert np.array_equal(voice.ref_codes, ref_array(name, "ref_codes"))
    ours = audio_of(
        engine.synthesize(
            texts["text"],
            language="english",
            voice=voice,
            stream_chunk=stream_chunk,
            decoder_subprocess=decoder_subprocess,
            **GREEDY,
        )
    )
    official = ref_array(name, "clone_icl_wav")
    # The official float cut may keep one more sample of the reference (see test_speech_encoder).
    assert 0 <= len(official) - len(ours) <= 1
    assert np.abs(ours - official[len(official) - len(ours) :]).max() < PCM_TOLERANCE


def test_an_x_vector_clone_speaks_the_officials_audio(engines: dict[str, Engine]) -> None:
    name = "tiny-base-0.6b"
    engine, texts = engines[name], voice_texts(name)
    voice = engine.clone_prompt(ref_array(name, "ref_audio"), 24000)
    assert not voice.in_context
    ours = audio_of(engine.synthesize(texts["text"], language="english", voice=voice, **GREEDY))
    official = ref_array(name, "clone_xvec_wav")
    assert len(ours) == len(official)
    assert np.abs(ours - official).max() < PCM_TOLERANCE


def test_a_recording_at_another_rate_is_resampled_as_the_official(
    engines: dict[str, Engine],
) -> None:
    name = "tiny-base-0.6b"
    voice = engines[name].clone_prompt(
        ref_array(name, "ref_audio_16k"), 16000, voice_texts(name)["ref_text"]
    )
    assert voice.speaker_embedding is not None and voice.ref_codes is not None
    assert np.abs(voice.speaker_embedding - ref_array(name, "ref16k_xvector")).max() < 1e-4
    assert np.array_equal(voice.ref_codes, ref_array(name, "ref16k_codes"))


def test_a_described_voice_speaks_the_officials_codes(engines: dict[str, Engine]) -> None:
    name = "tiny-design-1.7b"
    engine, texts = engines[name], voice_texts(name)
    voice = engine.instruction_prompt(texts["design"])
    ours = audio_of(
        engine.synthesize(
            texts["text"], language="english", voice=voice, non_streaming=True, **GREEDY
        )
    )
    stream = engine.decoder.stream()
    expected = stream.push(ref_array(name, "design_codes"))
    assert len(ours) == len(expected)
    assert np.abs(ours - expected).max() < PCM_TOLERANCE


def test_each_model_says_which_voices_it_takes(engines: dict[str, Engine]) -> None:
    base, design, custom = (
        engines["tiny-base-0.6b"],
        engines["tiny-design-1.7b"],
        engines["custom-0.6b"],
    )
    assert (base.kind, design.kind, custom.kind) == ("base", "voice_design", "custom_voice")
    audio = ref_array("tiny-base-0.6b", "ref_audio")
    with pytest.raises(InputError, match="needs a Base model"):
        custom.clone_prompt(audio, 24000)
    with pytest.raises(InputError, match="takes no instruction"):
        base.instruction_prompt("speak slowly")
    with pytest.raises(InputError, match="takes no instruction"):
        custom.instruction_prompt("speak slowly")  # the 0.6B CustomVoice
    with pytest.raises(InputError, match="no built-in speakers"):
        base.synthesize("Hello", speaker="vivian")
    with pytest.raises(InputError, match="no built-in speakers"):
        base.synthesize("Hello")


def test_a_too_short_recording_is_refused_clearly(engines: dict[str, Engine]) -> None:
    with pytest.raises(InputError, match="too short"):
        engines["tiny-base-0.6b"].clone_prompt(np.zeros(100, dtype=np.float32), 24000)
