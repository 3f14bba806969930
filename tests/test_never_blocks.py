"""Nothing a client sends and nothing found on disk blocks the server: files that are not
regular (a FIFO where a model or voice file belongs), megabyte texts and names, text that is
not Unicode, streams opened twice. Over real sockets with the real wyoming client, on a tiny
random model."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_server import ServerThread, exchange, free_port, read_until
from test_server_cli import wait_until_ready
from wyoming.client import AsyncClient
from wyoming.event import Event, async_read_event
from wyoming.info import Describe
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

from wyoming_kazeia.engine import Engine
from wyoming_kazeia.service import TtsService
from wyoming_kazeia.settings import EngineSettings
from wyoming_kazeia.voices.library import StoredVoice, VoiceLibrary

FRAMES = 8
HOP = 1920
DESCRIBE_S = 0.1  # what describe may take at most, whatever else the server does
# Answered, not blocked: well inside the voice library's deadline (2 s). These servers share
# the test's interpreter, whose other threads (a full test run's) delay them by tens of ms.
ANSWERED_S = 1.0
MEGABYTE = 1 << 20


@pytest.fixture
def model_copy(tiny_model: Path, tmp_path: Path) -> Path:
    """A model folder of the test's own, whose files it may replace."""
    return Path(shutil.copytree(tiny_model, tmp_path / "model"))


def serving(engine: Engine, library: VoiceLibrary | None = None) -> ServerThread:
    engine.apply_settings(EngineSettings(max_frames=FRAMES, seed=3))
    service = TtsService(engine, max_queue=8, library=library)
    return ServerThread(service, f"tcp://127.0.0.1:{free_port()}")


@pytest.fixture
def server(tiny_model: Path) -> Iterator[ServerThread]:
    running = serving(Engine(tiny_model))
    yield running
    running.stop()


async def describe_s(uri: str) -> float:
    start = time.monotonic()
    events = await exchange(uri, Describe().event(), until="info")
    assert events and events[-1].type == "info"
    return time.monotonic() - start


async def say(uri: str, text: str = "Hello there.", timeout: float = 10) -> list[Event]:
    async with AsyncClient.from_uri(uri) as client:
        await client.write_event(Synthesize(text).event())
        return await read_until(client, "audio-stop", timeout)


def audio_samples(events: list[Event]) -> int:
    return sum(len(e.payload or b"") // 2 for e in events if e.type == "audio-chunk")


def test_a_model_file_replaced_by_a_fifo_fails_its_request_fast_and_blocks_nothing(
    model_copy: Path,
) -> None:
    """decoder.gguf replaced by a FIFO: the request gets an `error` within 5 s (the engine
    never waits on the FIFO), describe keeps answering, and once the file is back the next
    request is served; the server stops at once."""
    server = serving(Engine(model_copy))
    saved = model_copy.parent / "decoder.gguf"
    shutil.copy(model_copy / "decoder.gguf", saved)
    (model_copy / "decoder.gguf").unlink()
    os.mkfifo(model_copy / "decoder.gguf")

    async def go() -> None:
        start = time.monotonic()
        events = await say(server.uri, timeout=5)
        assert time.monotonic() - start < 5
        errors = [e for e in events if e.type == "error"]
        assert errors and "is not a regular file" in errors[0].data["text"], events
        assert await describe_s(server.uri) < ANSWERED_S
        (model_copy / "decoder.gguf").unlink()
        shutil.copy(saved, model_copy / "decoder.gguf")
        assert audio_samples(await say(server.uri)) == FRAMES * HOP

    try:
        asyncio.run(go())
    finally:
        start = time.monotonic()
        server.stop()
    assert time.monotonic() - start < 2


def test_a_fifo_in_the_voice_library_is_reported_and_blocks_nothing(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "data" / "voices" / "stuck"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "voice.json")
    server = serving(Engine(tiny_model), library=VoiceLibrary(tmp_path / "data"))

    async def go() -> None:
        for _ in range(3):  # answered, well inside the library's deadline (never blocked)
            assert await describe_s(server.uri) < ANSWERED_S
        assert audio_samples(await say(server.uri)) == FRAMES * HOP

    try:
        with caplog.at_level(logging.WARNING, logger="wyoming_kazeia.service"):
            asyncio.run(go())
    finally:
        server.stop()
    assert "voice 'stuck'" in caplog.text and "is not a regular file (a FIFO)" in caplog.text


def test_a_megabyte_text_never_delays_describe(tiny_model: Path) -> None:
    """A one-shot text of 1 MB (58,000 sentences) from one client: another client's describe,
    asked every 20 ms from before it is sent until its first audio and beyond, takes less
    than 100 ms each time. The server is a process of its own, as in use: the test's clients
    do not share its interpreter."""
    text = "Short words here. " * ((MEGABYTE - 4096) // 18)  # inside the 1 MiB event bound
    uri = f"tcp://127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "wyoming_kazeia", "--uri", uri, "--model", str(tiny_model)]
    proc = subprocess.Popen([*cmd, "--max-frames", str(FRAMES)], stderr=subprocess.PIPE, text=True)
    speaking_from = asyncio.Event()

    async def speak() -> None:
        async with AsyncClient.from_uri(uri) as client:
            await client.write_event(Synthesize(text).event())
            while (event := await asyncio.wait_for(client.read_event(), 30)) is not None:
                if event.type == "audio-chunk":
                    speaking_from.set()
                    await asyncio.sleep(0.5)  # describe while it speaks too
                    return

    async def go() -> list[float]:
        latencies = [await describe_s(uri)]
        # Its own thread and loop: the 1 MB write must not hold up the describing client.
        speaking = asyncio.create_task(asyncio.to_thread(asyncio.run, speak()))
        while not speaking.done():
            latencies.append(await describe_s(uri))
            await asyncio.sleep(0.02)
        await speaking
        assert speaking_from.is_set()
        return latencies

    try:
        wait_until_ready(proc, uri)
        latencies = asyncio.run(go())
    finally:
        proc.kill()
        proc.communicate()
    assert len(latencies) >= 10 and max(latencies) < DESCRIBE_S, latencies


def test_errors_and_log_lines_quote_a_bounded_part_of_what_a_client_sent(
    server: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    """Megabyte names, speakers, languages and event types: each `error` and each log line
    stays short (it quotes at most ~200 characters of the request)."""
    huge = "x" * (MEGABYTE - 100)
    requests = [
        Synthesize("Hi.", voice=SynthesizeVoice(name=huge)).event(),
        Synthesize("Hi.", voice=SynthesizeVoice(name="vivian", speaker=huge)).event(),
        Synthesize("Hi.", voice=SynthesizeVoice(language=huge)).event(),
        Event(type="synthesize", data={"text": "Hi.", "voice": {"name": 7, "x": huge}}),
        Event(type="synthesize-chunk", data={"text": huge}),  # outside a stream
    ]

    async def go() -> list[str]:
        texts = []
        for request in requests:
            events = await exchange(server.uri, request)
            texts += [e.data["text"] for e in events if e.type == "error"]
        # A length of 4000 digits: quoted, not echoed whole
        port = int(server.uri.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b'{"type": "synthesize", "data_length": ' + b"9" * 4000 + b"}\n")
        while (event := await asyncio.wait_for(async_read_event(reader), 10)) is not None:
            texts += [event.data["text"]] if event.type == "error" else []
        writer.close()
        # An unknown event type is ignored (and logged at DEBUG)
        await exchange(server.uri, Event(type=huge[: 60 * 1024]), Describe().event(), until="info")
        return texts

    with caplog.at_level(logging.DEBUG):
        texts = asyncio.run(go())
    assert len(texts) == 6 and all(len(t) < 5000 for t in texts), [len(t) for t in texts]
    assert all(text.count("x") <= 250 and text.count("9") <= 250 for text in texts)
    assert max(len(r.getMessage()) for r in caplog.records) < 5000


def test_text_that_is_not_unicode_is_one_bad_request_before_any_audio(
    server: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    """A lone surrogate ("\\ud800" in the JSON), in a one-shot text, a streamed chunk, a voice
    name or a ping: `bad-request` and nothing else, no traceback in the log."""
    bad = "Hello \ud800 there."
    cases: list[list[dict[str, object]]] = [
        [{"type": "synthesize", "data": {"text": bad}}],
        [{"type": "synthesize-start"}, {"type": "synthesize-chunk", "data": {"text": bad}}],
        [{"type": "synthesize", "data": {"text": "Hello.", "voice": {"name": bad}}}],
        [{"type": "ping", "data": {"text": bad}}],  # echoed by the pong: never written
    ]

    async def send(events: list[dict[str, object]]) -> list[Event]:
        """The events as JSON lines that escape the surrogate (the wyoming client cannot
        encode it), read back with the wyoming client's reader."""
        port = int(server.uri.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"".join(json.dumps(e).encode() + b"\n" for e in events))
        received: list[Event] = []
        while (event := await asyncio.wait_for(async_read_event(reader), 10)) is not None:
            received.append(event)
        writer.close()
        return received

    async def go() -> list[list[Event]]:
        return [await send(events) for events in cases]

    with caplog.at_level(logging.DEBUG):
        answers = asyncio.run(go())
    for events in answers:
        assert [e.type for e in events] == ["error"], events
        assert events[0].data["code"] == "bad-request"
        assert "not valid Unicode" in events[0].data["text"]
    assert "Traceback" not in caplog.text and not any(r.exc_info for r in caplog.records)
    assert audio_samples(asyncio.run(say(server.uri))) == FRAMES * HOP  # still serving


def test_a_second_synthesize_start_ends_the_open_stream_with_its_text_spoken(
    server: ServerThread,
) -> None:
    """synthesize-start inside an open stream: the open stream's text (no sentence end yet) is
    spoken and that stream ends, then the new one is spoken."""

    async def go() -> list[Event]:
        async with AsyncClient.from_uri(server.uri) as client:
            for event in (
                SynthesizeStart().event(),
                SynthesizeChunk("The first stream, unfinished").event(),
                SynthesizeStart().event(),
                SynthesizeChunk("The second one.").event(),
                SynthesizeStop().event(),
            ):
                await client.write_event(event)
            received: list[Event] = []
            while len([e for e in received if e.type == "synthesize-stopped"]) < 2:
                event = await asyncio.wait_for(client.read_event(), 30)
                assert event is not None
                received.append(event)
            return received

    events = asyncio.run(go())
    kinds = [e.type for e in events if e.type != "audio-chunk"]
    assert kinds == ["audio-start", "audio-stop", "synthesize-stopped"] * 2, kinds
    first = events[: [e.type for e in events].index("synthesize-stopped") + 1]
    assert audio_samples(first) == FRAMES * HOP  # the first stream's text was spoken


def test_the_voice_library_is_read_off_the_event_loop(tiny_model: Path, tmp_path: Path) -> None:
    """describe while the library is read: the reading thread is not the event loop's."""
    threads: list[str] = []

    class Watched(VoiceLibrary):
        def scan(self) -> tuple[list[StoredVoice], list[str]]:
            threads.append(threading.current_thread().name)
            return super().scan()

    (tmp_path / "data" / "voices").mkdir(parents=True)
    server = serving(Engine(tiny_model), library=Watched(tmp_path / "data"))
    try:
        (tmp_path / "data" / "voices" / "new").mkdir()  # the library changed: read again
        assert asyncio.run(describe_s(server.uri)) < ANSWERED_S
    finally:
        server.stop()
    assert threads and all(name != server._thread.name for name in threads), threads
