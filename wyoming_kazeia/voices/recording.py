"""Reference recordings of cloned voices: read, checked, and brought to the encoders' rate.

A recording is read with soundfile (WAV, FLAC, OGG), its channels averaged as the official
code does (librosa.load mono), and resampled to 24 kHz with soxr's high quality, the resampler
librosa uses by default. What a clone needs of it is checked here, so that a bad file is
refused with a clear message before anything is stored.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from ..errors import InputError
from ..files import check_regular

RATE = 24000  # the rate of the Base models' encoders (speaker and speech encoder)
MIN_SECONDS = 1.0
# A longer recording makes the prompt of every in-context synthesis longer (12.5 frames per
# second of reference) and its encoding heavier; 3-6 s of clear speech clone well.
MAX_SECONDS = 20.0
# Beyond this, an in-context voice's first audio is noticeably later than a built-in
# speaker's: its talker reads every reference frame first (measured on a 2-core Zen 5 box,
# 0.6B q8_0: 0.12 s at 3 s, 0.19 s at 6 s, 0.24 s at 7 s, 0.35 s at 10 s, 0.79 s at 20 s;
# README).
PROMPT_SECONDS = 6.0
SILENCE_RMS = 1e-4  # -80 dBFS: nothing to learn a voice from


@dataclass(frozen=True)
class Recording:
    samples: np.ndarray  # float32 mono at RATE
    source_rate: int
    sha256: str  # of the samples as stored (24 kHz float32)

    @property
    def seconds(self) -> float:
        return len(self.samples) / RATE


def resample(samples: np.ndarray, rate: int, target: int = RATE) -> np.ndarray:
    """Mono float samples at `rate` -> float32 at `target` (soxr HQ: librosa's default)."""
    import soxr

    audio = np.ascontiguousarray(samples, dtype=np.float32)
    if rate == target:
        return audio
    return np.asarray(soxr.resample(audio, rate, target, quality="HQ"), dtype=np.float32)


def check(samples: np.ndarray, rate: int, where: str) -> Recording:
    """A Recording of mono `samples` at `rate`; InputError saying what is wrong with it."""
    if samples.size == 0:
        raise InputError(f"{where} is empty")
    check_length(len(samples) / rate, where)
    if not np.all(np.isfinite(samples)):
        raise InputError(f"{where} holds invalid samples (NaN or infinite)")
    if float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) < SILENCE_RMS:
        raise InputError(f"{where} is silent")
    audio = resample(samples, rate)
    return Recording(audio, rate, hashlib.sha256(audio.tobytes()).hexdigest())


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


def load(path: Path) -> Recording:
    """The recording in file `path` (any rate and channel count). Its length is read from its
    header first: a recording far too long is refused without being read."""
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
