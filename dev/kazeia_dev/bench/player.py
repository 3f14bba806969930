"""A player at real time fed a synthesis's chunks: how often it runs dry, as the chunks come and
let out through the service's prebuffer (``wyoming_kazeia.pacing.Prebuffer``, the one hold).

The engine bench's streaming rows report these figures; the player is the one the prebuffer's
tests simulate: it starts with the first audio it gets and plays at real time, and a chunk let
out after the player needed it is an underrun (the player waits for it, then goes on).
"""

from __future__ import annotations

from collections.abc import Sequence

from wyoming_kazeia.pacing import Prebuffer, SpeechRates

Chunk = tuple[float, float]  # (seconds since the request it came or went out at, audio seconds)

# A chunk needed this long before it came is an audible gap (below: the clock's jitter).
GAP_S = 0.005


def underruns(chunks: Sequence[Chunk]) -> tuple[int, float]:
    """A player at real time that starts with the first chunk: how often it ran dry, and for
    how long in all (seconds of silence)."""
    if not chunks:
        return 0, 0.0
    start, played, count, silent = chunks[0][0], 0.0, 0, 0.0
    for at, seconds in chunks:
        late = at - (start + played)
        if late > GAP_S:
            count, silent, start = count + 1, silent + late, start + late
        played += seconds
    return count, silent


def least_hold(chunks: Sequence[Chunk]) -> float:
    """The shortest hold of the first audio after which a player at real time never runs dry,
    knowing all the arrivals: released, as the service releases it, as a chunk arrives (with
    the chunks at hand then), the later chunks as they come. The floor a hold could reach."""
    if not chunks:
        return 0.0

    def dry(release_at: float) -> bool:
        return underruns([(max(at, release_at), seconds) for at, seconds in chunks])[0] > 0

    # A later release leaves no chunk later than an earlier one does, so the first arrival
    # whose release keeps the player from running dry is found by halving (releasing at the
    # last arrival always does: the arrivals are in order, everything is then at hand).
    low, high = 0, len(chunks) - 1
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if dry(chunks[mid][0]) else (low, mid)
    return chunks[low][0] - chunks[0][0]


def let_out(chunks: Sequence[Chunk], hold: Prebuffer) -> list[Chunk]:
    """The chunks as the hold lets them out, fed to it as they come (as the service's handler
    does): each with the time it went out. The last chunk's arrival completes the answer."""
    out: list[Chunk] = []
    waiting: list[float] = []
    for at, seconds in chunks:
        hold.add(seconds, at)
        waiting.append(seconds)
        if hold.ready(at):
            out += [(at, s) for s in waiting]
            waiting = []
    if chunks:
        end = chunks[-1][0]
        hold.release(end)
        out += [(end, s) for s in waiting]
    return out


def learn(rates: SpeechRates, chunks: Sequence[Chunk], chars: int | None) -> None:
    """What the service learns from a finished synthesis (``chars`` None: the warm-up, which
    teaches the rate only), from its chunks' arrivals: the service takes the synthesis's end
    where this takes its last chunk's arrival."""
    if chunks:
        rates.learn(
            chars,
            sum(seconds for _, seconds in chunks),
            chunks[-1][0] - chunks[0][0],
            max((seconds for _, seconds in chunks[1:]), default=0.0),
            chunks[0][1],
        )


def warm_rates(warm_up: Sequence[Chunk]) -> SpeechRates:
    """The rates a service has after its warm-up synthesis (these chunks)."""
    rates = SpeechRates()
    learn(rates, warm_up, None)
    return rates


def player_figures(chunks: Sequence[Chunk], rates: SpeechRates, chars: int) -> dict[str, float]:
    """One synthesis of ``chars`` characters played at real time: its underruns and seconds of
    silence as it comes, and through a Prebuffer with ``rates`` (as the service has learned
    them before it): its underruns, silence and hold (the first audio's added delay), beside
    the least hold that would have done (``least_hold``)."""
    hold = Prebuffer(rates, chars)
    count, silent = underruns(chunks)
    held_count, held_silent = underruns(let_out(chunks, hold))
    return {
        "underruns": count,
        "silence_s": silent,
        "prebuffer_underruns": held_count,
        "prebuffer_silence_s": held_silent,
        "prebuffer_held_s": hold.held_s,
        "least_hold_s": least_hold(chunks),
    }
