"""When an answer's first audio may go out so that a player at real time never runs dry.

A box slower than real time produces audio at a rate r < 1 (audio seconds per second). A player
that starts with B seconds of audio and then plays at 1 while the rest arrives at r never runs
dry if and only if B >= (1 - r) * T, T the whole answer's audio. The first audio is therefore
held until the audio at hand reaches that, with r measured on the answer itself as its chunks
arrive and T estimated from the characters it has to speak and the seconds of audio per
character of the service's finished syntheses.

Until an answer has made enough audio for its own rate, r is the last syntheses' rate, or the
answer's rate so far where that is lower: a box that slowed down since (other work started
beside it) would otherwise let the first audio go on a rate it no longer has, and run dry for
the rest of the answer, however long. Both count the audio after an answer's first chunk over
the time since it came. The rate so far mostly understates the steady one (the second chunk's
frames are made, then decoded; later chunks are decoded while the next ones are made), so a box
near the margin holds a chunk or two more than it needs.

Audio comes in chunks (a stream's first is one frame, the next ones a few), so the audio at hand
must also last while the next chunk is made, C / r for a chunk of C seconds, or the player runs
dry right after the first chunk even on a box faster than real time: at least that much, and at
least PAD_S, is held on every box (a fast one gathers it in a fraction of its length).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .speakable import Pause

if TYPE_CHECKING:
    from .synthesis import SynthesisMetrics

# Seconds of audio per character of text before any synthesis has finished (about 14 characters
# per second of speech in English); the first finished synthesis replaces it.
DEFAULT_SECONDS_PER_CHAR = 0.07
# How much the last finished synthesis weighs in the running figures (an exponential average).
LEARNING_WEIGHT = 0.3
# The rate is taken as this much lower than measured, and at least PAD_S more is held: the rate
# and the length are estimates, and chunks arrive with jitter (the second one later than the
# rate says: the first is decoded before the next frames are made).
MARGIN = 1.15
PAD_S = 0.3
# The rate of an answer is its own once this much audio has come after its first chunk (before
# that, the lower of the last syntheses' rate, if any, and the answer's own so far).
MEASURED_AFTER_S = 1.0
# At most this much audio is held: a longer wait would be a failure of its own (the client's
# patience, the server's memory), so a very long answer on a very slow box starts then and may
# still pause later.
MAX_HOLD_S = 120.0


@dataclass
class SpeechRates:
    """What the service's finished syntheses say: audio seconds per character of text, the
    production rate (audio seconds per wall second) of the last ones and the audio seconds of
    the last one's longest chunk. Thread-safe."""

    seconds_per_char: float = DEFAULT_SECONDS_PER_CHAR
    production_rate: float | None = None
    chunk_s: float = 0.0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._spoken = False  # a synthesis taught seconds_per_char (the default is replaced)

    def learn(
        self,
        chars: int | None,
        audio_s: float,
        wall_s: float,
        chunk_s: float = 0.0,
        first_s: float = 0.0,
    ) -> None:
        """One finished synthesis of `audio_s` seconds of audio from `chars` characters (None:
        a synthesis cut short, which tells the rate only): `first_s` of it in its first chunk,
        the rest made in the `wall_s` seconds after that chunk; its longest chunk after the
        first `chunk_s` seconds of audio (0: one piece). Its rate counts what came after the
        first chunk, as a Prebuffer measures an answer's own."""
        if audio_s - first_s <= 0 or wall_s <= 0:
            return
        with self._lock:
            self.chunk_s = chunk_s
            w = LEARNING_WEIGHT
            if chars:
                per_char = audio_s / chars
                self.seconds_per_char += (w if self._spoken else 1.0) * (
                    per_char - self.seconds_per_char
                )
                self._spoken = True
            rate = (audio_s - first_s) / wall_s
            previous = self.production_rate
            self.production_rate = rate if previous is None else previous + w * (rate - previous)

    def learn_synthesis(self, chars: int | None, m: SynthesisMetrics) -> None:
        """`learn` from a finished synthesis's metrics: the wall time after its first chunk is
        its total less the time to that chunk."""
        self.learn(chars, m.audio_s, m.total_s - m.ttfa_s, m.largest_chunk_s, m.first_chunk_s)

    def snapshot(self) -> tuple[float, float | None, float]:
        with self._lock:
            return self.seconds_per_char, self.production_rate, self.chunk_s


class Prebuffer:
    """The hold of one answer's first audio. Feed it each chunk's length in seconds as it
    arrives (`add`); `ready` says whether the audio at hand may go out now. Once released it
    stays released: later audio of the answer goes out as it comes."""

    def __init__(self, rates: SpeechRates, chars: int, pauses_s: float = 0.0) -> None:
        self._seconds_per_char, self._prior_rate, self._chunk_s = rates.snapshot()
        self.chars = chars  # the answer's text (a stream's grows as it arrives)
        self._pauses_s = pauses_s  # silences it holds besides speech (SSML breaks)
        self._first_at: float | None = None
        self._first_s = 0.0
        self._silence_s = 0.0  # pauses after the first chunk: no time to make
        self.produced_s = 0.0
        self.released = False
        self.held_s = 0.0  # how long the first audio waited (for the log and the bench)

    @classmethod
    def of_text(cls, rates: SpeechRates, sentences: Sequence[str | Pause]) -> Prebuffer:
        """The hold of an answer of these sentences and pauses."""
        chars = sum(len(s) for s in sentences if isinstance(s, str))
        pauses = sum(s.seconds for s in sentences if isinstance(s, Pause))
        return cls(rates, chars, pauses)

    def add(self, seconds: float, now: float, silence: bool = False) -> None:
        """A chunk of `seconds` came at `now`; `silence`: a pause (at hand, but made in no
        time, so not part of the rate)."""
        if self._first_at is None:
            self._first_at, self._first_s = now, seconds
        elif silence:
            self._silence_s += seconds
        else:
            self._chunk_s = max(self._chunk_s, seconds)
        self.produced_s += seconds

    def rate(self, now: float) -> float | None:
        """The answer's production rate: its own once MEASURED_AFTER_S of audio came after the
        first chunk; before that the last syntheses', or the answer's so far where lower."""
        if self._first_at is None or now <= self._first_at:
            return self._prior_rate
        after = self.produced_s - self._first_s - self._silence_s
        own = after / (now - self._first_at)
        if after >= MEASURED_AFTER_S:
            return own
        if after <= 0 or self._prior_rate is None:
            return self._prior_rate
        return min(self._prior_rate, own)

    def needed_s(self, now: float) -> float | None:
        """The audio to have at hand before the first goes out; None while the rate is unknown."""
        rate = self.rate(now)
        if rate is None:
            return None
        rate /= MARGIN
        # The audio at hand plays while the next chunk is made.
        next_chunk_s = self._chunk_s / rate
        total = max(self.chars * self._seconds_per_char + self._pauses_s, self.produced_s)
        return min(MAX_HOLD_S, max(0.0, 1.0 - rate) * total + max(PAD_S, next_chunk_s))

    def ready(self, now: float) -> bool:
        """Whether the audio at hand may go out (and everything after it)."""
        if not self.released:
            needed = self.needed_s(now)
            if self.produced_s >= MAX_HOLD_S or (needed is not None and self.produced_s >= needed):
                self.release(now)
        return self.released

    def summary(self, now: float) -> str | None:
        """What the hold did, for the log; None when it held (next to) nothing."""
        if self.held_s < 0.1:
            return None
        return (
            f"held {self.held_s:.1f} s: produced at {self.rate(now) or 0.0:.2f}x real time, "
            f"{self.produced_s:.1f} s of audio at hand"
        )

    def release(self, now: float) -> None:
        """Lets the audio go: enough is at hand, or the answer's audio is complete."""
        if not self.released:
            self.released = True
            if self._first_at is not None:
                self.held_s = now - self._first_at
