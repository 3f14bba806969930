"""Reference recordings of cloned voices: read, checked, and brought to the encoders' rate.

What a clone needs of a recording is checked here, so that a bad file is refused with a clear
message before anything is stored.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from ..errors import InputError
from ..files import check_regular

# The rate a recording is brought to where no model is at hand (`voices add` without --model):
# that of the Base models' encoders, whose GGUF says theirs (Engine.encoder_rate), so that the
# engine's own resampling to the loaded encoder's rate (Engine.clone_prompt) changes nothing.
RATE = 24000
MIN_SECONDS = 1.0
# A longer recording makes the prompt of every in-context synthesis longer (12.5 frames per
# second of reference) and its encoding heavier; 3-6 s of clear speech clone well.
MAX_SECONDS = 20.0
# Beyond this, an in-context voice's first audio is noticeably later than a built-in
# speaker's: its talker reads every reference frame first (docs/voices.md, "First audio of a
# cloned voice", has the figures).
PROMPT_SECONDS = 6.0
SILENCE_RMS = 1e-4  # -80 dBFS: nothing to learn a voice from


@dataclass(frozen=True)
class Recording:
    samples: np.ndarray  # float32 mono at `rate`
    rate: int
    source_rate: int
    sha256: str  # of the samples as stored (float32 at `rate`)

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Mono float samples at `rate` -> float32 at `target`, with soxr's high quality: the
    resampler librosa uses by default, as the official code does."""
    import soxr

    audio = np.ascontiguousarray(samples, dtype=np.float32)
    if rate == target:
        return audio
    return np.asarray(soxr.resample(audio, rate, target, quality="HQ"), dtype=np.float32)


def check(samples: np.ndarray, rate: int, where: str, target: int = RATE) -> Recording:
    """A Recording of mono `samples` at `rate`, brought to `target` Hz (the encoders' rate);
    InputError saying what is wrong with it."""
    if samples.size == 0:
        raise InputError(f"{where} is empty")
    check_length(len(samples) / rate, where)
    if not np.all(np.isfinite(samples)):
        raise InputError(f"{where} holds invalid samples (NaN or infinite)")
    if float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) < SILENCE_RMS:
        raise InputError(f"{where} is silent")
    audio = resample(samples, rate, target)
    return Recording(audio, target, rate, hashlib.sha256(audio.tobytes()).hexdigest())


def check_length(seconds: float, where: str) -> None:
    """InputError unless a recording of `seconds` can make a voice."""
    if seconds < MIN_SECONDS:
        raise InputError(
            f"{where} is {seconds:.2f} s long: a voice needs at least {MIN_SECONDS:.0f} s "
            "(3-6 s of clear speech clone well)"
        )
    if seconds > MAX_SECONDS:
        raise InputError(
            f"{where} is {seconds:.1f} s long: at most {MAX_SECONDS:.0f} s (3-6 s of clear "
            "speech clone well; cut it, e.g. `sox in.wav out.wav trim 0 6`)"
        )


def load(path: Path, target: int = RATE) -> Recording:
    """The recording in file `path` (WAV, FLAC or OGG, any rate and channel count) at `target`
    Hz, its channels averaged as the official code does (librosa.load mono). Its length is read
    from its header first: a recording far too long is refused without being read."""
    try:
        info = sf.info(str(check_regular(path)))
        if info.samplerate > 0 and info.frames > 0:  # (an empty one: said below)
            check_length(info.frames / info.samplerate, str(path))
        # The header may understate: never more than a voice can take is read.
        limit = int(MAX_SECONDS * info.samplerate) + 1
        data, rate = sf.read(str(path), frames=limit, dtype="float32", always_2d=True)
    except (OSError, RuntimeError, sf.LibsndfileError) as err:
        raise InputError(f"cannot read {path} as audio (WAV, FLAC or OGG): {err}") from err
    return check(data.mean(axis=1), int(rate), str(path))
