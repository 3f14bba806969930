"""The Wyoming server over real sockets, driven by the real wyoming client, on a tiny random model.

The server runs in a thread with its own event loop (as `python -m wyoming_kazeia` runs it), so a
test can also look at the service it serves. Audio is checked against the engine itself: the
seed is fixed, so a voice's audio over the protocol must equal the engine's for that text.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kazeia_dev.bench.server import parse_wyoming_bench
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncClient
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.ping import Ping
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

from wyoming_kazeia.engine import Engine
from wyoming_kazeia.errors import SlowClientError
from wyoming_kazeia.health_check import is_loading
from wyoming_kazeia.sentences import MAX_SENTENCE_CHARS, StreamSentences, split_sentences
from wyoming_kazeia.server import build_info, serve
from wyoming_kazeia.service import TtsService
from wyoming_kazeia.settings import EngineSettings
from wyoming_kazeia.voices import DEFAULT_SPEAKER

FRAMES = 12  # frames per synthesis: random weights never say eos
HOP = 1920
SAMPLES_PER_CHUNK = 1000  # not a divisor of a frame: chunks are re-cut by the server


class ServerThread:
    """A running server: its URI, its service; stop() ends it."""

    def __init__(self, service: TtsService, uri: str) -> None:
        self.service = service
        self.uri = uri
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._task: asyncio.Task[None] | None = None

        async def main() -> None:
            started = asyncio.Event()
            self._task = asyncio.create_task(serve(service, uri, SAMPLES_PER_CHUNK, None, started))
            await started.wait()
            ready.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(main(),))
        self._thread.start()
        assert ready.wait(30), "server did not start"

    def stop(self) -> None:
        assert self._task is not None
        self.loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(30)
        self.service.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Engine:
    return Engine(tiny_model, EngineSettings(max_frames=FRAMES, seed=11))


@pytest.fixture
def server(engine: Engine) -> Iterator[ServerThread]:
    engine.apply_settings(EngineSettings(max_frames=FRAMES, seed=11))
    running = ServerThread(TtsService(engine, max_queue=8), f"tcp://127.0.0.1:{free_port()}")
    yield running
    running.stop()


def engine_pcm(engine: Engine, text: str, speaker: str, language: str = "auto") -> np.ndarray:
    chunks = list(engine.synthesize(text, speaker, language))
    return np.concatenate(chunks) if chunks else np.zeros(0, np.int16)


async def exchange(uri: str, *events: Event, until: str = "audio-stop") -> list[Event]:
    """Sends events, then reads until an event of type `until` (or an error, or the end)."""
    async with AsyncClient.from_uri(uri) as client:
        for event in events:
            await client.write_event(event)
        return await read_until(client, until)


async def read_until(client: AsyncClient, until: str, timeout: float = 60) -> list[Event]:
    received: list[Event] = []
    while True:
        event = await asyncio.wait_for(client.read_event(), timeout)
        if event is None:
            return received
        received.append(event)
        if event.type in (until, "error"):
            return received


def audio_of(events: list[Event]) -> np.ndarray:
    chunks = [AudioChunk.from_event(e).audio for e in events if AudioChunk.is_type(e.type)]
    return np.frombuffer(b"".join(chunks), np.int16)


def check_format(events: list[Event]) -> None:
    """Every audio event: 24 kHz, 16-bit, mono; chunks at most SAMPLES_PER_CHUNK samples."""
    for e in events:
        if e.type in ("audio-start", "audio-chunk"):
            assert (e.data["rate"], e.data["width"], e.data["channels"]) == (24000, 2, 1)
        if e.type == "audio-chunk":
            assert 0 < len(e.payload or b"") <= SAMPLES_PER_CHUNK * 2


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- describe ---------------------------------------------------------------------------------


def test_describe_lists_every_speaker_in_every_language(server: ServerThread) -> None:
    events = run(exchange(server.uri, Describe().event(), until="info"))
    info = Info.from_event(events[-1])
    (program,) = info.tts
    assert program.supports_synthesize_streaming and program.installed and program.version
    assert program.attribution.name and program.attribution.url
    voices = {v.name: v for v in program.voices}
    speakers = server.service.engine.speakers
    assert len(speakers) == 9 and len(voices) == 9 * 11  # auto + 10 languages per speaker
    for speaker in speakers:
        assert len(voices[speaker].languages) == 10  # the auto voice, offered for every language
        assert voices[f"{speaker}-fr"].languages == ["fr"]
        assert str(voices[f"{speaker}-fr"].description).endswith("(French)")
    assert {lang for v in voices.values() for lang in v.languages} == {
        "zh", "en", "de", "it", "pt", "es", "ja", "ko", "fr", "ru"
    }  # fmt: skip


def test_no_two_advertised_voices_share_a_label_in_a_language() -> None:
    """Home Assistant lists a language's voices by label: a library voice in its own language
    is listed once (`grandma`, not also `grandma-en`), yet `grandma-en` still speaks."""
    from wyoming_kazeia.voices import VoiceCatalog
    from wyoming_kazeia.voices.library import StoredVoice

    stored = [StoredVoice("grandma", "clone", "english"), StoredVoice("opa", "clone")]
    catalog = VoiceCatalog(["vivian"], ["chinese", "english", "french"], stored)
    for code in ("zh", "en", "fr"):
        labels = [v.description for v in catalog.voices if code in v.codes]
        assert len(labels) == len(set(labels)), (code, labels)
    names = [v.name for v in catalog.voices]
    assert "grandma" in names and "grandma-fr" in names and "grandma-en" not in names
    assert "opa" in names and "opa-en" in names  # no language of its own: auto and each
    assert catalog.choose("grandma-en") == catalog.choose("grandma")


# -- one-shot ---------------------------------------------------------------------------------


def test_synthesize_streams_the_engines_audio(server: ServerThread, engine: Engine) -> None:
    text = "Hello there, this is a test."
    events = run(exchange(server.uri, Synthesize(text).event()))
    types = [e.type for e in events]
    assert types[0] == "audio-start" and types[-1] == "audio-stop"
    assert set(types[1:-1]) == {"audio-chunk"} and len(types) > 3
    check_format(events)
    audio = audio_of(events)
    assert len(audio) == FRAMES * HOP
    # The default voice is vivian (the model has her) in automatic language.
    assert np.array_equal(audio, engine_pcm(engine, text, DEFAULT_SPEAKER))


def test_voice_carries_speaker_and_language(server: ServerThread, engine: Engine) -> None:
    text = "Bonjour tout le monde."
    french = audio_of(
        run(exchange(server.uri, Synthesize(text, SynthesizeVoice("ryan-fr")).event()))
    )
    assert np.array_equal(french, engine_pcm(engine, text, "ryan", "french"))
    assert not np.array_equal(french, engine_pcm(engine, text, "ryan", "auto"))
    # A speaker field (Home Assistant's speaker option) picks the speaker, the voice the language.
    voice = SynthesizeVoice("ryan-fr", speaker="sohee")
    sohee = audio_of(run(exchange(server.uri, Synthesize(text, voice).event())))
    assert np.array_equal(sohee, engine_pcm(engine, text, "sohee", "french"))
    # A language alone (other Wyoming clients): the default speaker in that language.
    by_language = SynthesizeVoice(language="fr-FR")
    default = audio_of(run(exchange(server.uri, Synthesize(text, by_language).event())))
    assert np.array_equal(default, engine_pcm(engine, text, DEFAULT_SPEAKER, "french"))


def test_first_audio_arrives_long_before_the_end(server: ServerThread) -> None:
    server.service.update_settings(max_frames=300)

    async def go() -> tuple[float, float, int]:
        async with AsyncClient.from_uri(server.uri) as client:
            t0 = time.monotonic()
            await client.write_event(Synthesize("A long sentence to speak.").event())
            events = []
            first = 0.0
            while True:
                event = await client.read_event()
                assert event is not None
                events.append(event)
                if event.type == "audio-chunk" and not first:
                    first = time.monotonic() - t0
                if event.type == "audio-stop":
                    return first, time.monotonic() - t0, len(audio_of(events))

    first, total, samples = run(go())
    assert samples == 300 * HOP
    assert first < total / 5, (first, total)


def test_empty_text_is_start_and_stop(server: ServerThread) -> None:
    events = run(exchange(server.uri, Synthesize("  ").event()))
    assert [e.type for e in events] == ["audio-start", "audio-stop"]


def test_long_text_is_spoken_completely_in_order(server: ServerThread, engine: Engine) -> None:
    server.service.update_settings(max_frames=1)
    engine.apply_settings(server.service.settings)
    sentences = [f"Sentence number {i} of a long text about the weather." for i in range(400)]
    text = " ".join(sentences)
    assert len(text.encode()) > 20_000
    events = run(exchange(server.uri, Synthesize(text).event()))
    assert [e.type for e in events].count("audio-start") == 1
    audio = audio_of(events)
    # Every sentence, in order: the concatenation of the engine's audio for each one.
    expected = np.concatenate([engine_pcm(engine, s, DEFAULT_SPEAKER) for s in sentences])
    assert len(audio) == 400 * HOP
    assert np.array_equal(audio, expected)


def test_sentences_are_split_and_bounded() -> None:
    assert split_sentences("Hello world. How are you? ") == ["Hello world.", "How are you?"]
    assert split_sentences("   ") == []
    words = " ".join(f"word{i}" for i in range(300))  # no punctuation, ~2.3 KB
    pieces = split_sentences(words)
    assert len(pieces) > 4 and all(0 < len(p) <= MAX_SENTENCE_CHARS for p in pieces)
    assert " ".join(pieces) == words  # cut at spaces: nothing lost, nothing reordered
    assert "".join(split_sentences("x" * 1000)) == "x" * 1000


# -- streaming text ---------------------------------------------------------------------------


def test_streaming_text_speaks_each_sentence_as_it_completes(
    server: ServerThread, engine: Engine
) -> None:
    voice = SynthesizeVoice("vivian-en")

    async def go() -> list[Event]:
        async with AsyncClient.from_uri(server.uri) as client:
            await client.write_event(SynthesizeStart(voice=voice).event())
            await client.write_event(SynthesizeChunk("Hello world. How ar").event())
            # The first sentence is spoken while the rest of the text has not been sent yet.
            first = await read_until(client, "audio-stop")
            for piece in ("e you today? I am", " fine, thanks"):
                await client.write_event(SynthesizeChunk(piece).event())
            # The full text, as Home Assistant sends it inside a stream: ignored.
            await client.write_event(Synthesize("Hello world. How are you today?").event())
            await client.write_event(SynthesizeStop().event())
            return first + await read_until(client, "synthesize-stopped")

    events = run(go())
    types = [e.type for e in events]
    assert types[-1] == "synthesize-stopped" and "error" not in types
    assert types.count("audio-start") == types.count("audio-stop") == 3
    check_format(events)
    # Per sentence, the engine's audio for that sentence.
    starts = [i for i, t in enumerate(types) if t == "audio-start"]
    stops = [i for i, t in enumerate(types) if t == "audio-stop"]
    sentences = ["Hello world.", "How are you today?", "I am fine, thanks"]
    for a, b, sentence in zip(starts, stops, sentences, strict=True):
        audio = audio_of(events[a:b])
        assert np.array_equal(audio, engine_pcm(engine, sentence, "vivian", "english"))


def test_an_unpunctuated_stream_gets_early_audio(server: ServerThread) -> None:
    """An answer without sentence ends (a markdown list, say) is spoken in pieces of at most
    MAX_SENTENCE_CHARS as its text arrives, not all at the end."""
    words = " ".join(f"item{i}" for i in range(200))  # ~1.3k characters, no punctuation

    async def go() -> list[Event]:
        async with AsyncClient.from_uri(server.uri) as client:
            await client.write_event(SynthesizeStart().event())
            for at in range(0, len(words), 50):
                await client.write_event(SynthesizeChunk(words[at : at + 50]).event())
            # Audio while the stream is still open.
            early = await read_until(client, "audio-start", timeout=30)
            await client.write_event(SynthesizeStop().event())
            return early + await read_until(client, "synthesize-stopped")

    events = run(go())
    types = [e.type for e in events]
    assert "audio-start" in types and types[-1] == "synthesize-stopped"
    assert types.count("audio-start") == types.count("audio-stop") >= 3


def test_stream_sentences_are_linear_and_bounded() -> None:
    """2000 unpunctuated chunks of 500 characters: split in well under a second, every piece
    at most MAX_SENTENCE_CHARS, no text lost."""
    stream = StreamSentences()
    chunk = ("word " * 100).strip() + " "
    start = time.monotonic()
    pieces = [s for _ in range(2000) for s in stream.add(chunk)] + stream.finish()
    assert time.monotonic() - start < 2.0
    assert max(len(p) for p in pieces) <= MAX_SENTENCE_CHARS
    assert " ".join(pieces).split() == (chunk * 2000).split()


# -- never block, never lose ------------------------------------------------------------------


def test_describe_stays_fast_while_a_client_floods_a_stream(server: ServerThread) -> None:
    """One client streams 1 MB of unpunctuated text in 2000 chunks; another client's describe
    is answered in under 50 ms typically (the median) and under 100 ms all along but for one
    answer at most, which must still come within 250 ms: here the synthesis's threads and the
    flood's and the bystander's loops share 2 cores and the GIL with the server, so an answer
    now and then waits its turn for a core."""
    chunk = SynthesizeChunk(("word " * 100).strip() + " ").event()

    async def flood() -> None:
        async with AsyncClient.from_uri(server.uri) as client:
            await client.write_event(SynthesizeStart().event())
            for _ in range(2000):
                await client.write_event(chunk)
            await asyncio.sleep(0.5)

    async def go() -> list[float]:
        # The flood has an event loop of its own: its writes must not delay the bystander's
        # reads on the client side, which would be measured as the server's latency.
        flooding = asyncio.create_task(asyncio.to_thread(asyncio.run, flood()))
        latencies: list[float] = []
        while not flooding.done():
            async with AsyncClient.from_uri(server.uri) as bystander:
                start = time.monotonic()
                await bystander.write_event(Describe().event())
                await read_until(bystander, "info")
                latencies.append(time.monotonic() - start)
            await asyncio.sleep(0.02)
        await flooding
        return latencies

    latencies = run(go())
    assert len(latencies) >= 5, latencies
    assert statistics.median(latencies) < 0.05, latencies
    assert sum(t > 0.1 for t in latencies) <= 1 and max(latencies) < 0.25, latencies


def test_describe_answers_fast_during_a_synthesis(server: ServerThread) -> None:
    server.service.update_settings(max_frames=1000)

    async def go() -> list[float]:
        async with AsyncClient.from_uri(server.uri) as speaking:
            await speaking.write_event(Synthesize("Keep the engine busy.").event())
            first = await speaking.read_event()
            assert first is not None and AudioStart.is_type(first.type)
            await speaking.read_event()  # audio flows: the engine is synthesizing
            latencies = []
            for _ in range(5):
                t0 = time.monotonic()
                events = await exchange(server.uri, Describe().event(), until="info")
                assert events[-1].type == "info"
                latencies.append(time.monotonic() - t0)
            assert server.service.status.state == "synthesizing"
            return latencies

    latencies = run(go())
    assert sorted(latencies)[2] < 0.1, latencies


def test_concurrent_clients_each_get_their_own_audio(server: ServerThread, engine: Engine) -> None:
    requests = [
        ("First client speaking.", "vivian"),
        ("Second client here.", "ryan-en"),
        ("Third one.", "sohee-ko"),
        ("And the fourth client.", "eric-zh"),
    ]

    async def go() -> list[list[Event]]:
        return await asyncio.gather(
            *(exchange(server.uri, Synthesize(t, SynthesizeVoice(v)).event()) for t, v in requests)
        )

    results = run(go())
    catalog = server.service.voices
    for (text, voice), events in zip(requests, results, strict=True):
        assert [e.type for e in events][-1] == "audio-stop"
        speaker, language = catalog.resolve(voice)
        assert np.array_equal(audio_of(events), engine_pcm(engine, text, speaker, language))


def test_pipelined_requests_count_against_the_queue(engine: Engine) -> None:
    """30 requests pipelined on one connection with --max-queue 1: two are admitted (one
    running, one waiting), the third is refused in turn and the connection ends there."""
    engine.apply_settings(EngineSettings(max_frames=FRAMES, seed=11))
    running = ServerThread(TtsService(engine, max_queue=1), f"tcp://127.0.0.1:{free_port()}")
    try:
        request = json.dumps({"type": "synthesize", "data": {"text": "Hello."}}).encode() + b"\n"
        headers, closed = run(raw_exchange(running.uri, request * 30))
    finally:
        running.stop()
    types = [h["type"] for h in headers]
    assert types.count("audio-stop") == 2 and types[-1] == "error" and closed
    assert headers[-1]["data"]["code"] == "server-busy"
    assert running.service.status.served == 2


def test_an_answer_is_never_split_by_other_requests(server: ServerThread) -> None:
    """Once a three-sentence answer has started, four other clients' requests wait until it
    has ended: its sentences follow each other on the engine."""
    server.service.update_settings(max_frames=60)

    async def other(ends: dict[str, float], name: str) -> None:
        async with AsyncClient.from_uri(server.uri) as client:
            await client.write_event(Synthesize(f"I am {name}.").event())
            await read_until(client, "audio-chunk")
            ends[name] = time.monotonic()
            await read_until(client, "audio-stop")

    async def go() -> tuple[float, float, dict[str, float]]:
        firsts: dict[str, float] = {}
        async with AsyncClient.from_uri(server.uri) as client:
            await client.write_event(Synthesize("One is first. Two is next. Three ends.").event())
            await read_until(client, "audio-chunk")
            answer_start = time.monotonic()
            others = [asyncio.create_task(other(firsts, f"client {i}")) for i in range(4)]
            await read_until(client, "audio-stop")
            answer_end = time.monotonic()
        await asyncio.gather(*others)
        return answer_start, answer_end, firsts

    answer_start, answer_end, firsts = run(go())
    # One event loop reads every socket, and which of two ready sockets it wakes first is
    # arbitrary, so a next request's first audio may be seen a few ms before the answer's end.
    # A request run between the answer's sentences would come at least a whole sentence (a
    # third of the answer) earlier: half a sentence is the line between the two.
    line = answer_end - (answer_end - answer_start) / 6
    assert len(firsts) == 4 and all(t > line for t in firsts.values())


def test_an_answers_sentences_are_never_refused(engine: Engine) -> None:
    """With --max-queue 1 and the queue full, a started answer's later sentences are still
    spoken (a request is admitted once, not per sentence)."""
    engine.apply_settings(EngineSettings(max_frames=60, seed=11))
    running = ServerThread(TtsService(engine, max_queue=1), f"tcp://127.0.0.1:{free_port()}")
    try:

        async def go() -> tuple[list[Event], list[Event], HaResult]:
            async with AsyncClient.from_uri(running.uri) as client:
                await client.write_event(Synthesize("One is first. Two is next. Three.").event())
                first = await read_until(client, "audio-chunk")
                async with AsyncClient.from_uri(running.uri) as waiting:
                    await waiting.write_event(Synthesize("I wait my turn.").event())
                    await asyncio.sleep(0.05)
                    refused_one = await home_assistant_tts(running.uri, "No room for me.")
                    answer = first + await read_until(client, "audio-stop")
                    return answer, await read_until(waiting, "audio-stop"), refused_one

        answer, waited, refused_one = run(go())
        assert answer[-1].type == "audio-stop" and "error" not in [e.type for e in answer]
        assert len(audio_of(answer)) == 3 * 60 * HOP
        assert waited[-1].type == "audio-stop"
        refused(refused_one, "server-busy")
    finally:
        running.stop()


def test_unread_audio_is_bounded(engine: Engine) -> None:
    """A client that reads nothing: its synthesis is cancelled once it has left
    max_unsent_bytes unread, and it is told why when it reads."""
    engine.apply_settings(EngineSettings(max_frames=400, seed=11))
    service = TtsService(engine, max_unsent_bytes=100_000)  # ~2 s of audio

    async def go() -> tuple[int, BaseException | None]:
        audio = service.queue_text("Nobody reads this long answer.")
        deadline = time.monotonic() + 30
        while service.status.state != "idle" or service.status.queue_depth:
            assert time.monotonic() < deadline, "the synthesis was not cancelled"
            await asyncio.sleep(0.05)
        received = 0
        try:
            async for pcm in audio:
                received += len(pcm)
        except SlowClientError as err:
            return received, err
        return received, None

    try:
        received, err = run(go())
    finally:
        service.shutdown()
    assert err is not None and "unread" in str(err)
    assert 0 < received <= 100_000  # what it was given before the bound; the rest never made
    assert service.status.served == 0


def test_disconnect_cancels_the_synthesis(server: ServerThread) -> None:
    server.service.update_settings(max_frames=2000)  # ~6 s if it kept running

    async def go() -> None:
        client = AsyncClient.from_uri(server.uri)
        await client.connect()
        await client.write_event(Synthesize("Nobody will listen to the end.").event())
        await read_until(client, "audio-chunk")
        await client.disconnect()

    served = server.service.status.served
    run(go())
    left = time.monotonic()
    while server.service.status.state != "idle" and time.monotonic() < left + 2:
        time.sleep(0.01)
    assert server.service.status.state == "idle"
    # Cancelled within about 0.1 s of the disconnect (two liveness probes, then one frame).
    assert time.monotonic() - left < 0.3
    assert server.service.status.served == served  # cancelled, not completed
    assert not [t for t in threading.enumerate() if t.name.startswith("kazeia-gen")]
    # The engine is free at once for the next request.
    server.service.update_settings(max_frames=FRAMES)
    events = run(exchange(server.uri, Synthesize("Next.").event()))
    assert len(audio_of(events)) == FRAMES * HOP


# -- errors -----------------------------------------------------------------------------------


@dataclass
class HaResult:
    """What Home Assistant's Wyoming TTS client made of a request."""

    wav: bytes | None  # None: the request failed ("Connection lost")
    events: list[Event]  # every event it read, error events included (it ignores them)
    seconds: float  # from writing `synthesize` to the end of its loop
    after_error: float | None  # from the `error` event to the end of its loop


async def home_assistant_tts(
    uri: str, text: str, voice: str | None = None, speaker: str | None = None
) -> HaResult:
    """Home Assistant's own loop (homeassistant/components/wyoming/tts.py,
    async_get_tts_audio): write `synthesize`, then read until audio-stop (a WAV of the chunks)
    or the end of the connection (a failed request); `error` events are read and ignored, and
    there is no timeout of its own. The 60 s bound is the test's, so that a hang fails."""
    events: list[Event] = []
    error_at: float | None = None
    start = time.monotonic()
    async with AsyncClient.from_uri(uri) as client:
        synthesize_voice = SynthesizeVoice(name=voice, speaker=speaker) if voice else None
        await client.write_event(Synthesize(text=text, voice=synthesize_voice).event())
        with io.BytesIO() as wav_io:
            wav_writer: wave.Wave_write | None = None
            while True:
                event = await asyncio.wait_for(client.read_event(), 60)
                end = time.monotonic()
                if event is None:  # "Connection lost": HA returns (None, None)
                    if wav_writer is not None:  # (HA leaves it to the garbage collector)
                        wav_writer.close()
                    after = None if error_at is None else end - error_at
                    return HaResult(None, events, end - start, after)
                events.append(event)
                if event.type == "error":
                    error_at = end
                if AudioStop.is_type(event.type):
                    break
                if AudioChunk.is_type(event.type):
                    chunk = AudioChunk.from_event(event)
                    if wav_writer is None:
                        wav_writer = wave.open(wav_io, "wb")  # noqa: SIM115 - as HA writes it
                        wav_writer.setframerate(chunk.rate)
                        wav_writer.setsampwidth(chunk.width)
                        wav_writer.setnchannels(chunk.channels)
                    wav_writer.writeframes(chunk.audio)
            if wav_writer is not None:
                wav_writer.close()
            end = time.monotonic()
            after = None if error_at is None else end - error_at
            return HaResult(wav_io.getvalue(), events, end - start, after)


def refused(result: HaResult, code: str) -> None:
    """A refusal as Home Assistant sees it: a failed request, at once."""
    assert result.wav is None, "Home Assistant would take this as success"
    assert [e.type for e in result.events] == ["error"]
    assert result.events[0].data["code"] == code
    assert result.seconds < 1.0, result.seconds


def test_home_assistant_sees_an_unknown_voice_or_speaker_fail_at_once(
    server: ServerThread,
) -> None:
    result = run(home_assistant_tts(server.uri, "Hi.", "nobody"))
    refused(result, "voice-not-found")
    text = result.events[0].data["text"]
    assert "vivian-fr" in text and "nobody" in text
    result = run(home_assistant_tts(server.uri, "Hi.", "vivian", speaker="x"))
    refused(result, "voice-not-found")
    assert "ryan" in result.events[0].data["text"]
    # The server goes on: the next request (a new connection, as Home Assistant makes) is served.
    good = run(home_assistant_tts(server.uri, "Hi."))
    assert good.wav is not None and good.events[-1].type == "audio-stop"


def test_home_assistant_sees_a_busy_server_refuse_at_once(engine: Engine) -> None:
    engine.apply_settings(EngineSettings(max_frames=300, seed=11))
    running = ServerThread(TtsService(engine, max_queue=0), f"tcp://127.0.0.1:{free_port()}")
    try:

        async def go() -> tuple[list[Event], HaResult]:
            async with AsyncClient.from_uri(running.uri) as first:
                await first.write_event(Synthesize("The engine is busy with me.").event())
                started = await read_until(first, "audio-chunk")
                busy = await home_assistant_tts(running.uri, "Me too?")
                return started + await read_until(first, "audio-stop"), busy

        served, busy = run(go())
        assert served[-1].type == "audio-stop" and len(audio_of(served)) == 300 * HOP
        refused(busy, "server-busy")
    finally:
        running.stop()


def test_home_assistant_sees_a_loading_service_refuse_at_once() -> None:
    """Before its model is loaded the server answers describe with an installed program (so
    that Home Assistant makes its entity) holding the default voice in every language, says
    it is loading, and refuses a synthesis."""
    running = ServerThread(TtsService(max_queue=8), f"tcp://127.0.0.1:{free_port()}")
    try:
        running.service.set_loading("downloading Qwen/x: 35%")
        result = run(home_assistant_tts(running.uri, "Hi."))
        refused(result, "model-loading")
        assert "35%" in result.events[0].data["text"]
        info = run(exchange(running.uri, Describe().event(), until="info"))
        program = Info.from_event(info[-1]).tts[0]
        assert program.installed and [v.name for v in program.voices] == ["vivian"]
        assert program.voices[0].installed and "en" in program.voices[0].languages
        assert "loading: downloading Qwen/x: 35%" in (program.description or "")
        assert is_loading(program)
    finally:
        running.stop()


def test_the_announcement_goes_out_once_a_discovering_client_can_describe_the_service() -> None:
    """Home Assistant describes a service the moment it is announced, once: the zeroconf
    announcement is made when the socket accepts connections, and then, model or not, describe
    gives an installed program with a voice (what HA's discovery needs to offer the service)."""
    service = TtsService(max_queue=8)
    service.set_loading("downloading Qwen/x: 1%")
    uri = f"tcp://127.0.0.1:{free_port()}"
    seen: list[Info] = []

    async def announce(port: int) -> None:  # in place of the mDNS announcement
        assert uri.endswith(f":{port}")
        events = await exchange(uri, Describe().event(), until="info")
        seen.append(Info.from_event(events[-1]))

    async def main() -> None:
        listening = asyncio.Event()
        task = asyncio.create_task(serve(service, uri, SAMPLES_PER_CHUNK, announce, listening))
        await asyncio.wait_for(listening.wait(), 30)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        run(main())
    finally:
        service.shutdown()
    (info,) = seen
    (program,) = info.tts
    assert program.installed and program.voices and program.voices[0].installed
    assert is_loading(program)


def test_a_failed_announcement_is_a_warning_and_the_service_serves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No multicast route (a container without one, say): the service is added by hand."""
    service = TtsService(max_queue=8)
    service.set_loading("downloading Qwen/x: 1%")
    uri = f"tcp://127.0.0.1:{free_port()}"

    async def announce(port: int) -> None:
        raise OSError(101, "Network is unreachable")

    async def main() -> Info:
        listening = asyncio.Event()
        task = asyncio.create_task(serve(service, uri, SAMPLES_PER_CHUNK, announce, listening))
        await asyncio.wait_for(listening.wait(), 30)
        events = await exchange(uri, Describe().event(), until="info")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return Info.from_event(events[-1])

    try:
        info = run(main())
    finally:
        service.shutdown()
    assert info.tts[0].installed
    assert "the announcement failed (" in caplog.text and "add the service by hand" in caplog.text


def test_a_configured_voice_of_one_language_is_listed_in_it_while_loading() -> None:
    service = TtsService(default_voice="Ryan-FR", max_queue=8)
    try:
        (voice,) = build_info(service).tts[0].voices
    finally:
        service.shutdown()
    assert voice.name == "ryan-fr" and voice.languages == ["fr"]


@pytest.fixture
def decoder_that_dies_on_its_second_run(tmp_path: Path, engine: Engine) -> list[str]:
    """kazeia-decoder, except that its second run dies by SIGKILL (a crash midway through a
    two-sentence answer)."""
    script = tmp_path / "second-run-dies.sh"
    mark = tmp_path / "ran-once"
    real = " ".join(engine.decoder_command)
    script.write_text(
        f'#!/bin/sh\nif [ -e "{mark}" ]; then kill -9 $$; fi\ntouch "{mark}"\nexec {real} "$@"\n'
    )
    script.chmod(0o755)
    return [str(script)]


@pytest.mark.parametrize("when", ["before its audio", "midway"])
def test_home_assistant_sees_a_failed_synthesis_fail(
    server: ServerThread,
    engine: Engine,
    crashing_command: list[str],
    decoder_that_dies_on_its_second_run: list[str],
    when: str,
) -> None:
    """A synthesis that fails ends the request with an error and the end of the connection,
    never with audio-stop: Home Assistant reports a failure instead of playing part of it."""
    command = engine.decoder_command
    engine.decoder_command = (
        crashing_command if when == "before its audio" else decoder_that_dies_on_its_second_run
    )
    server.service.update_settings(decoder_subprocess=True)
    try:
        result = run(home_assistant_tts(server.uri, "The decoder dies. Right here."))
    finally:
        engine.decoder_command = command
        server.service.update_settings(decoder_subprocess=False)
    assert result.wav is None
    types = [e.type for e in result.events]
    assert types[-1] == "error" and "audio-stop" not in types
    assert result.events[-1].data["code"] == "synthesis-failed"
    assert "decoder subprocess failed" in result.events[-1].data["text"]
    assert (len(audio_of(result.events)) > 0) == (when == "midway")
    assert result.after_error is not None and result.after_error < 1.0
    # The server goes on.
    recovered = run(home_assistant_tts(server.uri, "It works again."))
    assert recovered.wav is not None and len(audio_of(recovered.events)) == FRAMES * HOP


@pytest.fixture
def hung_decoder(tmp_path: Path) -> tuple[list[str], Path]:
    """A kazeia-decoder that never finishes: it writes its pid to a file, then sleeps."""
    script = tmp_path / "hung.sh"
    pid_file = tmp_path / "hung.pid"
    script.write_text(f'#!/bin/sh\necho $$ > "{pid_file}"\nexec sleep 1000\n')
    script.chmod(0o755)
    return [str(script)], pid_file


def wait_for_pid(pid_file: Path) -> int:
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "the decoder subprocess never started"
        time.sleep(0.01)
    return int(pid_file.read_text())


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_hung_decoder_subprocess_dies_with_its_client(
    server: ServerThread, engine: Engine, hung_decoder: tuple[list[str], Path]
) -> None:
    """The client leaves during the subprocess decode: the subprocess is killed at once and
    the next client is served without waiting for it."""
    command, pid_file = hung_decoder
    original = engine.decoder_command
    engine.decoder_command = command
    server.service.update_settings(decoder_subprocess=True)
    try:

        async def leave() -> None:
            client = AsyncClient.from_uri(server.uri)
            await client.connect()
            await client.write_event(Synthesize("The decoder hangs.").event())
            pid = await asyncio.to_thread(wait_for_pid, pid_file)
            left = time.monotonic()
            await client.disconnect()
            while not gone(pid):
                assert time.monotonic() - left < 1.0, "the hung decoder was not killed"
                await asyncio.sleep(0.01)

        run(leave())
        server.service.update_settings(decoder_subprocess=False)
        start = time.monotonic()
        result = run(home_assistant_tts(server.uri, "Next, please."))
        assert result.wav is not None and time.monotonic() - start < 5
    finally:
        engine.decoder_command = original
        server.service.update_settings(decoder_subprocess=False)


def test_a_hung_decoder_subprocess_is_killed_at_its_deadline(
    server: ServerThread, engine: Engine, hung_decoder: tuple[list[str], Path]
) -> None:
    command, pid_file = hung_decoder
    original = engine.decoder_command, engine.subprocess_base_s, engine.subprocess_per_frame_s
    engine.decoder_command, engine.subprocess_base_s, engine.subprocess_per_frame_s = (
        command,
        0.5,
        0.0,
    )
    server.service.update_settings(decoder_subprocess=True)
    try:
        result = run(home_assistant_tts(server.uri, "The decoder hangs."))
    finally:
        engine.decoder_command, engine.subprocess_base_s, engine.subprocess_per_frame_s = original
        server.service.update_settings(decoder_subprocess=False)
    assert result.wav is None and result.events[-1].data["code"] == "synthesis-failed"
    assert "no result within" in result.events[-1].data["text"]
    assert gone(int(pid_file.read_text()))


def test_stopping_the_server_kills_a_hung_decoder_at_once(
    engine: Engine, hung_decoder: tuple[list[str], Path]
) -> None:
    """What SIGTERM does (the serving task cancelled, the service shut down) ends a synthesis
    waiting on a hung decoder subprocess in well under 2 s."""
    command, pid_file = hung_decoder
    original = engine.decoder_command
    engine.decoder_command = command
    engine.apply_settings(EngineSettings(max_frames=FRAMES, seed=11, decoder_subprocess=True))
    running = ServerThread(TtsService(engine), f"tcp://127.0.0.1:{free_port()}")
    try:

        async def request() -> None:
            async with AsyncClient.from_uri(running.uri) as client:
                await client.write_event(Synthesize("The decoder hangs.").event())
                with contextlib.suppress(ConnectionError):
                    await read_until(client, "audio-stop", timeout=30)

        task = threading.Thread(target=run, args=(request(),), daemon=True)
        task.start()
        pid = wait_for_pid(pid_file)
        start = time.monotonic()
        running.stop()
        assert time.monotonic() - start < 2.0
        assert gone(pid)
    finally:
        engine.decoder_command = original
        engine.apply_settings(EngineSettings(max_frames=FRAMES, seed=11))


def test_a_half_closed_client_gets_its_whole_answer(server: ServerThread, engine: Engine) -> None:
    """A client that closes its side after `synthesize` still reads: it gets all of its audio
    (empty audio-chunks may come between, as liveness probes)."""

    async def go() -> list[dict[str, Any]]:
        host, port = server.uri.removeprefix("tcp://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(json.dumps({"type": "synthesize", "data": {"text": "Hi."}}).encode() + b"\n")
        await writer.drain()
        writer.write_eof()
        headers: list[dict[str, Any]] = []
        samples = 0
        while line := await asyncio.wait_for(reader.readline(), 30):
            header = json.loads(line)
            if header.get("data_length"):
                await reader.readexactly(header["data_length"])
            if header.get("payload_length"):
                samples += len(await reader.readexactly(header["payload_length"])) // 2
            headers.append(header)
            if header["type"] == "audio-stop":
                header["samples"] = samples
                break
        writer.close()
        return headers

    headers = run(go())
    assert headers[0]["type"] == "audio-start" and headers[-1]["type"] == "audio-stop"
    assert headers[-1]["samples"] == FRAMES * HOP


def test_a_streams_failed_sentence_says_so_before_its_audio_stop(
    server: ServerThread, engine: Engine, crashing_command: list[str]
) -> None:
    """Inside a stream, the error of a failed sentence comes before the audio-stop that closes
    its begun audio: a client that stops reading at audio-stop has seen it."""
    command = engine.decoder_command
    engine.decoder_command = crashing_command
    server.service.update_settings(decoder_subprocess=True)
    try:

        async def go() -> list[Event]:
            async with AsyncClient.from_uri(server.uri) as client:
                await client.write_event(SynthesizeStart().event())
                await client.write_event(SynthesizeChunk("This one fails. ").event())
                await client.write_event(SynthesizeStop().event())
                events: list[Event] = []
                while (event := await asyncio.wait_for(client.read_event(), 30)) is not None:
                    events.append(event)
                    if event.type == "synthesize-stopped":
                        break
                return events

        events = run(go())
    finally:
        engine.decoder_command = command
        server.service.update_settings(decoder_subprocess=False)
    types = [e.type for e in events]
    assert types[:1] == ["audio-start"] and types[-1] == "synthesize-stopped"
    assert types.index("error") < types.index("audio-stop")


# -- speakable text and SSML ------------------------------------------------------------------

LLM_ANSWER = "## Lights\n\n- **Kitchen**: on 💡\n- [Hall](http://ha.local/hall): *off*"
LLM_SPOKEN = ["Lights.", "Kitchen: on.", "Hall: off."]


def sentences_pcm(engine: Engine, sentences: list[str]) -> np.ndarray:
    return np.concatenate([engine_pcm(engine, s, DEFAULT_SPEAKER) for s in sentences])


def test_a_markdown_answer_is_spoken_as_its_plain_text(
    server: ServerThread, engine: Engine
) -> None:
    events = run(exchange(server.uri, Synthesize(LLM_ANSWER).event()))
    assert [e.type for e in events][-1] == "audio-stop"
    assert np.array_equal(audio_of(events), sentences_pcm(engine, LLM_SPOKEN))


def test_a_streamed_markdown_answer_is_spoken_as_its_plain_text(
    server: ServerThread, engine: Engine
) -> None:
    pieces = [LLM_ANSWER[at : at + 3] for at in range(0, len(LLM_ANSWER), 3)]  # markup split

    async def go() -> list[Event]:
        async with AsyncClient.from_uri(server.uri) as client:
            await client.write_event(SynthesizeStart().event())
            for piece in pieces:
                await client.write_event(SynthesizeChunk(piece).event())
            await client.write_event(SynthesizeStop().event())
            return await read_until(client, "synthesize-stopped")

    events = run(go())
    types = [e.type for e in events]
    assert "error" not in types and types.count("audio-start") == len(LLM_SPOKEN)
    starts = [i for i, t in enumerate(types) if t == "audio-start"]
    stops = [i for i, t in enumerate(types) if t == "audio-stop"]
    for a, b, sentence in zip(starts, stops, LLM_SPOKEN, strict=True):
        assert np.array_equal(audio_of(events[a:b]), engine_pcm(engine, sentence, DEFAULT_SPEAKER))


def test_with_speakable_text_off_the_text_is_spoken_as_sent(
    server: ServerThread, engine: Engine
) -> None:
    server.service.update_settings(speakable_text=False)
    try:
        events = run(exchange(server.uri, Synthesize("**Kitchen** on").event()))
        # sentence-stream itself drops asterisks around words: the rest stays as sent.
        kitchen = engine_pcm(engine, "Kitchen on", DEFAULT_SPEAKER)
        assert np.array_equal(audio_of(events), kitchen)
        events = run(exchange(server.uri, Synthesize("Hi 💡 [x](http://a.b)").event()))
        sent = engine_pcm(engine, "Hi 💡 [x](http://a.b)", DEFAULT_SPEAKER)
        assert np.array_equal(audio_of(events), sent)
    finally:
        server.service.update_settings(speakable_text=True)


def ssml(text: str) -> Event:
    event = Synthesize(text).event()
    event.data["text_format"] = "ssml"
    return event


def test_ssml_is_spoken_without_tags_and_a_break_is_silence(
    server: ServerThread, engine: Engine
) -> None:
    document = '<speak>Kitchen <emphasis>on</emphasis>.<break time="250ms"/>Hall off.</speak>'
    events = run(exchange(server.uri, ssml(document)))
    assert [e.type for e in events][-1] == "audio-stop"
    pause = np.zeros(24000 // 4, np.int16)
    expected = [engine_pcm(engine, "Kitchen on.", DEFAULT_SPEAKER), pause]
    expected.append(engine_pcm(engine, "Hall off.", DEFAULT_SPEAKER))
    assert np.array_equal(audio_of(events), np.concatenate(expected))


def test_streamed_ssml_is_spoken_at_its_stop(server: ServerThread, engine: Engine) -> None:
    async def go(document: list[str]) -> list[Event]:
        async with AsyncClient.from_uri(server.uri) as client:
            start = SynthesizeStart().event()
            start.data["text_format"] = "ssml"
            await client.write_event(start)
            for piece in document:
                await client.write_event(SynthesizeChunk(piece).event())
            await client.write_event(SynthesizeStop().event())
            events = await read_until(client, "synthesize-stopped")
            if events[-1].type == "error":  # the stream goes on to its end
                events += await read_until(client, "synthesize-stopped")
            return events

    events = run(go(["<speak>Kitchen", " <emphasis>on</emph", "asis>.</speak>"]))
    assert events[-1].type == "synthesize-stopped" and "error" not in [e.type for e in events]
    assert np.array_equal(audio_of(events), engine_pcm(engine, "Kitchen on.", DEFAULT_SPEAKER))
    # Malformed: one bad-request, and the stream still ends as streams end.
    events = run(go(["<speak>Kitchen <break>", "</speak>"]))
    types = [e.type for e in events]
    assert types == ["error", "synthesize-stopped"]
    assert events[0].data["code"] == "bad-request" and "malformed SSML" in events[0].data["text"]


def test_malformed_ssml_is_one_bad_request(server: ServerThread) -> None:
    for document in ("<speak>unclosed", '<speak>a<break time="soon"/></speak>'):
        events = run(exchange(server.uri, ssml(document)))
        assert [e.type for e in events] == ["error"]  # and the connection closed
        assert events[0].data["code"] == "bad-request"
    event = Synthesize("x").event()
    event.data["text_format"] = "html"
    events = run(exchange(server.uri, event))
    assert [e.type for e in events] == ["error"] and "unknown text_format" in events[0].data["text"]


def test_ping_is_answered_with_pong(server: ServerThread) -> None:
    events = run(exchange(server.uri, Ping(text="are you there").event(), until="pong"))
    assert [e.type for e in events] == ["pong"] and events[0].data["text"] == "are you there"


async def raw_exchange(uri: str, data: bytes) -> tuple[list[dict[str, Any]], bool]:
    """Writes raw bytes; returns the event headers received and whether the server closed."""
    host, port = uri.removeprefix("tcp://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    await writer.drain()
    headers: list[dict[str, Any]] = []
    try:
        while True:
            line = await asyncio.wait_for(reader.readline(), 5)
            if not line:
                return headers, True
            header = json.loads(line)
            if header.get("data_length"):
                header["data"] = json.loads(await reader.readexactly(header["data_length"]))
            if header.get("payload_length"):
                await reader.readexactly(header["payload_length"])
            headers.append(header)
    except TimeoutError:
        return headers, False
    finally:
        writer.close()


@pytest.mark.parametrize(
    "data",
    [
        b"this is not json\n",
        b'["a list"]\n',
        b'{"type": "synthesize", "data": {"voice": 3}}\n',
        b'{"type": "synthesize", "data_length": 5}\nabcde',
        b'{"type": "x", "payload_length": 999999999}\n',
        b'{"type": "x", "data_length": 999999999}\n',
        b'{"type": "' + b"x" * 100_000 + b'"}\n',
        b'{"type": "synthesize-chunk", "data": {"text": "no stream"}}\n',
        b'{"type": "synthesize", "data": {"text": 123}}\n',
        b'{"type": "synthesize", "data": {"text": "Hi.", "voice": {"name": 5}}}\n',
        b'{"type": "synthesize", "data": {"text": "Hi.", "voice": "vivian"}}\n',
        b'{"type": "synthesize", "data": {"text": "Hi.", "voice": {"speaker": ["x"]}}}\n',
        b'{"type": "synthesize", "data_length": true}\n',
        b'{"type": "synthesize", "data": {"text": ' + b"[" * 30000 + b"]" * 30000 + b"}}\n",
    ],
    ids=[
        "not-json",
        "not-object",
        "bad-field",
        "bad-data",
        "payload",
        "data",
        "header",
        "order",
        "text-a-number",
        "voice-name-a-number",
        "voice-a-string",
        "speaker-a-list",
        "length-a-bool",
        "deep-nesting",
    ],
)
def test_malformed_input_is_an_error_and_closes_only_that_connection(
    server: ServerThread, data: bytes
) -> None:
    async def go() -> tuple[list[dict[str, Any]], bool, list[Event]]:
        async with AsyncClient.from_uri(server.uri) as bystander:
            headers, closed = await raw_exchange(server.uri, data)
            await bystander.write_event(Describe().event())
            return headers, closed, await read_until(bystander, "info")

    headers, closed, other = run(go())
    assert [h["type"] for h in headers] == ["error"] and closed
    assert headers[0]["data"]["code"] == "bad-request"
    assert other[-1].type == "info"


def test_wyoming_bench_measures_both_modes(server: ServerThread) -> None:
    """The client script/bench server relies on, against this server; its report parses."""
    host_port = server.uri.removeprefix("tcp://")
    bench = Path(sys.executable).with_name("wyoming-bench")
    args = ["tts", host_port, "--rounds", "1", "--warmup", "0", "--texts", "Hello there."]
    out = subprocess.run([str(bench), *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    modes = parse_wyoming_bench(out.stdout)
    assert set(modes) == {"non_streaming", "streaming"}
    for m in modes.values():
        assert (m["ok"], m["fail"]) == (1, 0)
        assert m["audio_s"] == pytest.approx(FRAMES * HOP / 24000, abs=0.01)
        assert 0 < m["ttfa_ms"] <= m["total_ms"] and m["rtf"] > 0


def test_unix_socket(engine: Engine, tmp_path: Path) -> None:
    engine.apply_settings(EngineSettings(max_frames=FRAMES, seed=11))
    running = ServerThread(TtsService(engine), f"unix://{tmp_path / 'tts.sock'}")
    try:
        events = run(exchange(running.uri, Synthesize("Over a unix socket.").event()))
        assert len(audio_of(events)) == FRAMES * HOP
    finally:
        running.stop()
