"""The prebuffer: an answer's first audio held just long enough that a player at real time never
runs dry, whatever the production rate (pacing.Prebuffer, the handler's hold)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import pytest
from kazeia_dev.bench.player import Chunk, let_out, underruns
from test_server import ServerThread, free_port
from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncClient
from wyoming.tts import Synthesize, SynthesizeVoice

from wyoming_kazeia.engine import Engine
from wyoming_kazeia.pacing import MARGIN, MAX_HOLD_S, PAD_S, Prebuffer, SpeechRates
from wyoming_kazeia.service import TtsService
from wyoming_kazeia.settings import EngineSettings
from wyoming_kazeia.synthesis import SynthesisMetrics

CHUNK_S = 0.32  # a stream chunk: 4 frames of 80 ms
FIRST_S = 0.08  # the first chunk is one frame


def produce(
    rate: float, total_s: float, first_after: float = 0.5, chunk_s: float = CHUNK_S
) -> list[Chunk]:
    """(arrival time, seconds of audio) of each chunk of an answer produced at `rate` seconds
    of audio per second, its first chunk `first_after` seconds after the request."""
    chunks = [(first_after, FIRST_S)]
    made = FIRST_S
    while made < total_s - 1e-9:
        size = min(chunk_s, total_s - made)
        made += size
        chunks.append((first_after + (made - FIRST_S) / rate, size))
    return chunks


def play(chunks: list[Chunk], rates: SpeechRates, chars: int) -> tuple[int, float]:
    """The chunks let out through a Prebuffer as the handler does, played at real time: the
    underruns and the hold."""
    hold = Prebuffer(rates, chars)
    count, _ = underruns(let_out(chunks, hold))
    return count, hold.held_s


@pytest.mark.parametrize("rate", [0.3, 0.5, 0.7, 0.9, 0.99, 1.2, 2.0, 3.0])
def test_a_player_never_runs_dry_whatever_the_production_rate(rate: float) -> None:
    total_s, chars = 30.0, 400
    rates = SpeechRates()
    rates.learn(chars, total_s, total_s / rate, CHUNK_S)  # an earlier answer of the same kind
    underruns, held = play(produce(rate, total_s), rates, chars)
    assert underruns == 0
    # Held about as long as the arithmetic asks (with its margin), not more: the audio that
    # lasts while the rest is made, and while the next chunk is, produced at r, plus a chunk.
    r = rate / MARGIN
    next_chunk_s = CHUNK_S / r
    needed = max(0.0, 1 - r) * total_s + max(PAD_S, next_chunk_s)
    assert held <= needed / rate + CHUNK_S / rate


@pytest.mark.parametrize("total_s", [3.3, 30.0])
def test_a_box_that_slowed_down_since_the_last_answers_holds_by_this_ones_rate(
    total_s: float,
) -> None:
    """The last answers came at 1.3x real time, this one at 0.85x (other work started beside
    it): let out on the last answers' rate, its first audio would go with its second chunk and
    the player run dry all along; the answer's own rate so far, lower, holds it."""
    prior, rate, chars = 1.3, 0.85, round(total_s / 0.07)
    rates = SpeechRates()
    rates.learn(chars, total_s, total_s / prior, CHUNK_S)
    chunks = produce(rate, total_s)
    count, held = play(chunks, rates, chars)
    assert count == 0
    r = rate / MARGIN  # held about as long as this answer's rate asks, not more
    assert held <= ((1 - r) * total_s + CHUNK_S / r) / rate + CHUNK_S / rate


def test_an_answer_that_starts_faster_than_the_last_ones_holds_by_theirs() -> None:
    """The last answers came at 0.7x real time; this one's second chunk comes as fast as 1.5x
    would bring it. One chunk tells little: the hold takes the lower rate, the last answers'."""
    total_s, chars = 10.0, 140
    rates = SpeechRates()
    rates.learn(chars, total_s, total_s / 0.7, CHUNK_S)
    hold = Prebuffer(rates, chars)
    hold.add(FIRST_S, 1.0)
    hold.add(CHUNK_S, 1.0 + CHUNK_S / 1.5)
    now = 1.0 + CHUNK_S / 1.5
    assert hold.rate(now) == pytest.approx(0.7)
    assert not hold.ready(now)


@pytest.mark.parametrize("rate", [0.5, 0.8])
def test_without_a_hold_a_slow_answer_runs_dry(rate: float) -> None:
    """The same answers let out as they come stall: what the hold prevents."""
    count, silent = underruns(produce(rate, 30.0))
    assert count > 10 and silent > (1 - rate) * 30.0 * 0.9


@pytest.mark.parametrize("rate", [1.2, 2.0, 3.0])
def test_without_a_hold_a_fast_stream_runs_dry_after_its_first_chunk(rate: float) -> None:
    """Faster than real time, but its one-frame first chunk ends before the next chunk of four
    is made: one gap at the start, which the hold prevents."""
    count, silent = underruns(produce(rate, 30.0))
    assert count == 1 and silent == pytest.approx(CHUNK_S / rate - FIRST_S)


def test_long_chunks_are_held_until_the_audio_at_hand_outlasts_the_next() -> None:
    """A short answer in 16-frame chunks (1.28 s) at 0.7x real time: the (1 - r) T it needs is
    at hand with its second chunk, but the third takes 1.8 s to make."""
    rate, total_s, chunk_s = 0.7, 2.5, 1.28
    chunks = produce(rate, total_s, chunk_s=chunk_s)
    assert underruns(chunks)[0] == 2
    rates = SpeechRates()
    rates.learn(40, total_s, total_s / rate, chunk_s)
    hold = Prebuffer(rates, 40)
    assert underruns(let_out(chunks, hold))[0] == 0


def test_a_pause_is_at_hand_but_not_part_of_the_rate() -> None:
    """An SSML break early in an answer is audio at once (silence takes no time to make): it
    counts as audio at hand, not as production speed, or the hold would end far too soon."""
    rate, speech_before, pause, speech_after = 0.5, 1.2, 10.0, 18.0
    speech = speech_before + speech_after
    rates = SpeechRates()
    rates.learn(100, speech, speech / rate)  # an answer of this text's length, at this rate
    hold = Prebuffer(rates, 100, pauses_s=pause)
    chunks = [(at, seconds, False) for at, seconds in produce(rate, speech_before)]
    t = chunks[-1][0]
    chunks.append((t, pause, True))  # the break: all of it at once
    chunks += [(t + at - 0.5, seconds, False) for at, seconds in produce(rate, speech_after)[1:]]
    out: list[Chunk] = []
    waiting: list[float] = []
    for at, seconds, silence in chunks:
        hold.add(seconds, at, silence)
        waiting.append(seconds)
        if hold.ready(at):
            out += [(at, s) for s in waiting]
            waiting = []
    hold.release(chunks[-1][0])
    out += [(chunks[-1][0], s) for s in waiting]
    assert hold.rate(chunks[-1][0]) == pytest.approx(rate, rel=0.1)
    assert underruns(out)[0] == 0


def test_nothing_waits_where_the_first_chunk_lasts_while_the_next_is_made() -> None:
    rates = SpeechRates()
    rates.learn(100, 8.0, 4.0, CHUNK_S)  # twice real time: a chunk in 160 ms
    hold = Prebuffer(rates, 100)
    hold.add(CHUNK_S, 1.0)  # a stream whose first chunk is a whole one
    assert hold.ready(1.0) and hold.held_s == 0.0


def test_a_fast_box_holds_its_first_chunk_until_the_next_has_come() -> None:
    rates = SpeechRates()
    rates.learn(100, 8.0, 4.0, CHUNK_S)  # twice real time: a chunk in 160 ms
    hold = Prebuffer(rates, 100)
    hold.add(FIRST_S, 1.0)
    assert not hold.ready(1.0)
    hold.add(CHUNK_S, 1.16)
    assert hold.ready(1.16) and hold.held_s == pytest.approx(0.16)


def test_a_very_fast_box_holds_a_fraction_of_a_chunk() -> None:
    """At 8 times real time (a GPU) the first frame waits for the next chunk: 40 ms."""
    rates = SpeechRates()
    rates.learn(100, 8.0, 1.0, CHUNK_S)
    underruns_, held = play(produce(8.0, 10.0), rates, 100)
    assert underruns_ == 0 and held == pytest.approx(CHUNK_S / 8.0)


def test_a_first_answer_waits_for_its_own_rate() -> None:
    """With no synthesis behind it, the rate is the answer's own, once a second of its audio
    has come after its first chunk; a fast one then goes out at once."""
    hold = Prebuffer(SpeechRates(), 100)
    t = 0.0
    hold.add(FIRST_S, t)
    assert not hold.ready(t) and hold.rate(t) is None
    while hold.produced_s - FIRST_S < 1.0:
        t += 0.1
        hold.add(CHUNK_S, t)
    assert hold.rate(t) == pytest.approx((hold.produced_s - FIRST_S) / t)
    assert hold.ready(t)


def test_a_very_long_answer_is_held_at_most_max_hold() -> None:
    rates = SpeechRates()
    rates.learn(100, 10.0, 100.0)  # a tenth of real time
    hold = Prebuffer(rates, 100_000)  # hours of text
    t, released = 0.0, False
    while not released:
        t += 1.0
        hold.add(0.1, t)
        released = hold.ready(t)
    assert MAX_HOLD_S <= hold.produced_s < MAX_HOLD_S + 0.1 + 1e-6  # at the chunk that reaches it


def test_rates_follow_the_finished_syntheses() -> None:
    rates = SpeechRates()
    assert rates.production_rate is None
    rates.learn(200, 20.0, 40.0, CHUNK_S)  # the first replaces the defaults
    assert rates.snapshot() == (pytest.approx(0.1), pytest.approx(0.5), CHUNK_S)
    rates.learn(None, 10.0, 10.0, 0.16)  # a cut synthesis (the warm-up): its rate and chunk
    spc, rate, chunk_s = rates.snapshot()
    assert spc == pytest.approx(0.1) and rate is not None and 0.5 < rate < 1.0 and chunk_s == 0.16
    rates.learn(0, 0.0, 0.0)  # nothing spoken: nothing learned
    assert rates.snapshot() == (spc, rate, chunk_s)


def test_the_learned_rate_counts_what_came_after_the_first_chunk() -> None:
    """As an answer's own rate does: 3.2 s of audio, 0.08 s of it in the first chunk, the rest
    in 3.12 s after it is real time, not 3.2 / 3.12; its characters count all of it."""
    rates = SpeechRates()
    rates.learn(40, 3.2, 3.12, CHUNK_S, 0.08)
    assert rates.snapshot() == (pytest.approx(0.08), pytest.approx(1.0), CHUNK_S)


def test_a_finished_synthesis_teaches_its_rate_after_its_first_chunk() -> None:
    """The service's metrics of the same synthesis: its first chunk 0.2 s after the request,
    the whole in 3.32 s, so 3.12 s after that chunk."""
    metrics = SynthesisMetrics(
        ttfa_s=0.2, total_s=3.32, audio_s=3.2, first_chunk_s=0.08, largest_chunk_s=CHUNK_S
    )
    rates = SpeechRates()
    rates.learn_synthesis(40, metrics)
    assert rates.snapshot() == (pytest.approx(0.08), pytest.approx(1.0), CHUNK_S)


# -- through the real server, on a box slower than real time ---------------------------------
#
# The full-size 0.6B in f32 (random weights) with one generator thread and one decoder thread
# produces audio slower than real time on the 2-core machines we size for, quiet or not (its
# code predictor alone, reading f32 weights on one thread, is slower): a real slow producer.
# Random weights seldom say eos, so an answer is max_frames long (see the seed below).
ANSWER_FRAMES = 375  # 30 s of audio
SEED = 7
TEXTS = (
    "The kitchen lights are on, the front door is locked, and the garage is closed for the "
    "night, so everything looks quiet and safe around the house right now.",
    "Tomorrow starts cloudy with a light breeze from the west, then the sun comes out around "
    "noon and the evening stays mild, a good day for a walk in the park.",
)


@pytest.fixture(scope="module")
def slow_server() -> Iterator[ServerThread]:
    from kazeia_dev.bench.common import default_cache_dir, ensure_model

    model = ensure_model(default_cache_dir(), "0.6b", "f32")
    # Seed SEED: neither text draws an eos before ANSWER_FRAMES.
    settings = EngineSettings(threads=1, decoder_threads=1, seed=SEED, max_frames=ANSWER_FRAMES)
    running = ServerThread(TtsService(Engine(model, settings)), f"tcp://127.0.0.1:{free_port()}")
    yield running
    running.stop()


async def timed_answer(
    uri: str, text: str, wait_s: float = 300.0
) -> tuple[float, list[tuple[float, float]]]:
    """A one-shot request read as a player reads it: the time from the request to the first
    audio, and each audio chunk's arrival (seconds after the request) and length in seconds.
    `wait_s`: the longest wait for any one event."""
    chunks: list[tuple[float, float]] = []
    async with AsyncClient.from_uri(uri) as client:
        t0 = time.monotonic()
        await client.write_event(Synthesize(text, voice=SynthesizeVoice("vivian")).event())
        while (event := await asyncio.wait_for(client.read_event(), wait_s)) is not None:
            assert event.type != "error", event.data
            if AudioChunk.is_type(event.type):
                chunk = AudioChunk.from_event(event)
                seconds = len(chunk.audio) / (chunk.rate * chunk.width * chunk.channels)
                chunks.append((time.monotonic() - t0, seconds))
            elif AudioStop.is_type(event.type):
                break
    return chunks[0][0], chunks


def test_a_slow_box_plays_a_30_s_answer_without_an_underrun(
    slow_server: ServerThread,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = slow_server.service
    # Audio as it comes: the box is slower than real time, and a player stalls.
    service.update_settings(prebuffer=False)
    first_off, off = asyncio.run(timed_answer(slow_server.uri, TEXTS[0]))
    audio_s = sum(s for _, s in off)
    assert audio_s == pytest.approx(ANSWER_FRAMES * 0.08, abs=0.01)
    rate = audio_s / (off[-1][0] - first_off)
    gaps_off, silent_off = underruns(off)
    assert rate < 1.0 and gaps_off > 0, f"this box is not slower than real time ({rate:.2f})"
    # Held: what the service learned from that answer, and this answer's own rate. Its first
    # audio may come as late as the end of its production, which on a slow box takes about
    # as long as the first answer did: the wait for an event is sized from that.
    service.update_settings(prebuffer=True)
    wait_s = max(300.0, 1.5 * off[-1][0] + 60.0)
    with caplog.at_level(logging.INFO, logger="wyoming_kazeia.handler"):
        first_on, on = asyncio.run(timed_answer(slow_server.uri, TEXTS[1], wait_s))
    assert "first audio for" in caplog.text and "real time" in caplog.text  # the wait is logged
    assert sum(s for _, s in on) == pytest.approx(audio_s, abs=0.01)
    gaps_on, silent_on = underruns(on)
    # This answer's own production rate: its last chunk goes out as it is made, and its first
    # was made about when the first answer's was.
    rate_on = audio_s / (on[-1][0] - first_off)
    with capsys.disabled():
        print(
            f"\n  prebuffer: production at {rate:.2f}x / {rate_on:.2f}x real time; as it comes: "
            f"first audio {first_off:.2f} s, {gaps_off} underruns ({silent_off:.1f} s silent); "
            f"held: first audio {first_on:.2f} s (+{first_on - first_off:.1f} s), {gaps_on} "
            "underruns"
        )
    assert gaps_on == 0
    # Just enough: about the (1 - r) T of audio the arithmetic asks, the time to make it at r
    # (10 % for a rate that changes along the answer, 2 s for the chunks' steps).
    r = rate_on / MARGIN
    needed_s = (1 - r) * audio_s + max(PAD_S, CHUNK_S / r)
    assert first_on - first_off < 1.1 * needed_s / rate_on + 2.0
