"""Clients that leave before their answer ends, over real sockets, with Home Assistant's own
client (`wyoming.client.AsyncTcpClient`): the server never wedges, the gone client's answer is
cancelled whole (from the service's own record of what it synthesized for whom), and the next
client is served at once. Each trial runs on a fresh server (its own service, engine thread and
listening socket; the loaded model is shared)."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_server import SAMPLES_PER_CHUNK, ServerThread, free_port
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize

from wyoming_kazeia.engine import Engine
from wyoming_kazeia.service import TtsService
from wyoming_kazeia.settings import EngineSettings

FRAMES = 60  # per sentence: ~112 audio-chunk events of SAMPLES_PER_CHUNK samples
SENTENCE = "This sentence is one of a long answer that nobody will hear to the end."
# The gone client's last synthesis has ended (cancelled) within this many seconds of its
# leaving: the server sees the leave at its next write, and a synthesis stops within a frame.
CANCELLED_WITHIN_S = 1.0
# The next client's first audio comes within this many seconds of its request.
SERVED_WITHIN_S = 1.0

LEAVE_AFTER = (1, 5, 20, 100)  # audio-chunk events read before leaving
SENTENCES = (1, 5, 30)
# How a client leaves: Home Assistant's client leaving its `async with` (its socket closed
# with audio unread), a reset (SO_LINGER 0), or a client that shuts its side first (FIN), reads
# no further and then closes.
HOW = ("async-with", "reset", "fin")
TRIALS = [(n, s, how) for how in HOW for s in SENTENCES for n in LEAVE_AFTER]  # 36


class Record(logging.Handler):
    """The service's record of its syntheses: (when, peer, what) per start and end."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[tuple[float, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("synthesis for "):
            peer, _, what = message[len("synthesis for ") :].partition(") ")
            self.events.append((time.monotonic(), peer + ")", what))


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Engine:
    return Engine(tiny_model, EngineSettings(max_frames=FRAMES, seed=5))


@pytest.fixture
def record() -> Iterator[Record]:
    logger = logging.getLogger("wyoming_kazeia.service")
    handler, level = Record(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@dataclass
class Left:
    peer: str  # as the server names it
    at: float  # time.monotonic() when the client was gone
    chunks: int  # audio-chunk events it had read


async def leave_mid_answer(port: int, sentences: int, after: int, how: str) -> Left:
    """Home Assistant's client asks for an answer of `sentences` sentences, reads `after`
    audio-chunk events and leaves as `how` says."""
    client = AsyncTcpClient("127.0.0.1", port)
    await client.connect()
    assert client._writer is not None
    sock: socket.socket = client._writer.get_extra_info("socket")
    peer = str(sock.getsockname())
    await client.write_event(Synthesize(" ".join([SENTENCE] * sentences)).event())
    chunks = 0
    while chunks < after:
        event = await asyncio.wait_for(client.read_event(), 10)
        if event is None or event.type == "audio-stop":
            break
        chunks += event.type == "audio-chunk"
    if how == "reset":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    elif how == "fin":
        sock.shutdown(socket.SHUT_WR)
        await asyncio.sleep(0.05)  # the server reads the end of its input, keeps writing
    await client.disconnect()  # what leaving `async with AsyncTcpClient(...)` does
    return Left(peer, time.monotonic(), chunks)


async def next_client(port: int) -> tuple[float, int]:
    """Seconds to the first audio of "Hello there." and its audio-chunk count."""
    async with AsyncTcpClient("127.0.0.1", port) as client:
        start = time.monotonic()
        await client.write_event(Synthesize("Hello there.").event())
        first, chunks = 0.0, 0
        while True:
            event = await asyncio.wait_for(client.read_event(), 10)
            assert event is not None, "the next client's connection was closed"
            assert event.type != "error", event.data
            if event.type == "audio-chunk":
                first = first or time.monotonic() - start
                chunks += 1
            if event.type == "audio-stop":
                return first, chunks


@pytest.mark.parametrize(("after", "sentences", "how"), TRIALS)
def test_a_client_that_leaves_mid_answer_cancels_it_whole_and_wedges_nothing(
    engine: Engine, record: Record, after: int, sentences: int, how: str
) -> None:
    engine.apply_settings(EngineSettings(max_frames=FRAMES, seed=5))
    port = free_port()
    server = ServerThread(TtsService(engine, max_queue=8), f"tcp://127.0.0.1:{port}")
    try:
        left = asyncio.run(leave_mid_answer(port, sentences, after, how))
        first_audio, chunks = asyncio.run(next_client(port))
        assert first_audio < SERVED_WITHIN_S, f"the next client waited {first_audio:.2f} s"
        assert chunks == -(-FRAMES * 1920 // SAMPLES_PER_CHUNK)
    finally:
        server.stop()
    gone = [(at, what) for at, peer, what in record.events if peer == left.peer]
    started = [at for at, what in gone if what.startswith("started")]
    ended = [at for at, what in gone if not what.startswith("started")]
    assert started and len(ended) == len(started), gone
    # Nothing of the gone client's answer started after it left; what ran was cancelled at
    # once (a client that read its whole answer before leaving has nothing to cancel).
    assert all(at <= left.at + CANCELLED_WITHIN_S for at in started), (left, gone)
    assert max(ended) <= left.at + CANCELLED_WITHIN_S, (left, gone)
    spoken_whole = sum(what == "ended complete" for _, what in gone)
    assert spoken_whole <= sentences
    if spoken_whole < sentences:  # it left mid-answer: the rest was dropped, not synthesized
        assert len(started) <= spoken_whole + 1, gone
