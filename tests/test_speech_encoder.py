"""The Base models' speech encoder (speech-tokenizer codes of a reference recording) against
the official Qwen3TTSTokenizer.encode, and the audio of an in-context clone against the
official generate_voice_clone.

Tolerances: the encoder output before quantization 1e-5 max abs (measured ~5e-7); codes
exactly (the official nearest-codeword margins of these recordings are >= 0.03).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import CLONE_MODELS, ref_array

from wyoming_kazeia.native import InputError, ModelError, SpeechDecoder, SpeechEncoder

# recording -> the prefix of its reference arrays. The 16 kHz recording reaches the encoder
# resampled to 24 kHz (librosa in the reference; the resampler has its own test).
RECORDINGS = {"ref_audio": "ref", "ref16k_resampled": "ref16k", "ref_audio_odd": "refodd"}


@pytest.fixture(scope="module", params=CLONE_MODELS)
def encoder(
    request: pytest.FixtureRequest, speech_encoder_gguf: dict[str, Path]
) -> tuple[str, SpeechEncoder]:
    return request.param, SpeechEncoder(str(speech_encoder_gguf[request.param]), threads=2)


@pytest.mark.parametrize("recording", list(RECORDINGS))
def test_reference_codes_are_the_officials(
    encoder: tuple[str, SpeechEncoder], recording: str
) -> None:
    name, enc = encoder
    audio = ref_array(name, recording)
    codes, latent = enc.encode(audio)
    prefix = RECORDINGS[recording]
    expected = ref_array(name, f"{prefix}_codes")
    assert codes.shape == expected.shape == (-(-len(audio) // 1920), 16)
    if prefix != "ref16k":  # (its latent is not recorded)
        assert np.abs(latent - ref_array(name, f"{prefix}_latent")).max() < 1e-5
    assert np.array_equal(codes, expected)


def test_an_empty_recording_is_refused(encoder: tuple[str, SpeechEncoder]) -> None:
    _, enc = encoder
    assert (enc.sample_rate, enc.frame_samples) == (24000, 1920)
    with pytest.raises(InputError, match="empty"):
        enc.encode(np.zeros(0, dtype=np.float32))
    codes, _ = enc.encode(np.zeros(1, dtype=np.float32))
    assert codes.shape == (1, 16)


def test_another_part_is_not_taken_for_a_speech_encoder(
    speaker_encoder_gguf: dict[str, Path],
) -> None:
    with pytest.raises(ModelError, match="expected 'kazeia-speech-encoder'"):
        SpeechEncoder(str(speaker_encoder_gguf["tiny-base-0.6b"]))


@pytest.mark.parametrize("name", CLONE_MODELS)
def test_the_audio_of_an_in_context_clone_is_the_officials(
    name: str, decoder_gguf: dict[str, Path]
) -> None:
    """The official wrapper decodes reference ++ generated codes in one pass and cuts
    int(ref / total * samples) from the front; a decoder primed with the reference codes gives
    the same samples after the reference's ref * 1920 (the float cut may keep one more)."""
    ref, new = ref_array(name, "ref_codes"), ref_array(name, "clone_icl_codes")
    stream = SpeechDecoder(str(decoder_gguf[name]), threads=2).stream()
    stream.push(ref)
    ours = stream.push(new)
    official = ref_array(name, "clone_icl_wav")
    total = len(ref) + len(new)
    shift = len(ref) * 1920 - int(len(ref) / total * total * 1920)
    assert shift in (0, 1)
    assert len(official) == len(ours) + shift
    assert np.abs(official[shift:] - ours).max() < 1e-4


def test_a_saved_decoder_state_continues_exactly(decoder_gguf: dict[str, Path]) -> None:
    """What a cloned voice's syntheses share: the decoder after the reference codes."""
    name = CLONE_MODELS[0]
    decoder = SpeechDecoder(str(decoder_gguf[name]), threads=2)
    ref, new = ref_array(name, "ref_codes"), ref_array(name, "clone_icl_codes")
    primed = decoder.stream()
    primed.push(ref)
    state = primed.save()
    expected = primed.push(new)
    again = decoder.stream()
    again.restore(state)
    assert again.frames_pushed == len(ref)
    assert np.array_equal(again.push(new), expected)
    with pytest.raises(InputError, match="not a saved state"):
        again.restore(state[:-1])
