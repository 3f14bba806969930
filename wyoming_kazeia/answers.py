"""A request's place in the service's queue (Answer), the sentences it queues for the engine
(Queued, each with its Job: the audio queue between the engine thread and the event loop, with
the bound on unread audio), and the audio stream a protocol layer reads (AudioStream)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import SlowClientError
from .speakable import Pause
from .voices import Choice

if TYPE_CHECKING:
    from .service import TtsService
    from .synthesis import Synthesis

# The end of a job's audio, in its queue.
END = object()


class Silence(bytes):
    """PCM of a pause (SSML's <break>): audio that takes no time to make, which the prebuffer
    does not count in an answer's production rate."""


class Answer:
    """A request's place in the queue, from its arrival to its end: one one-shot text or one
    stream, however many sentences. Close it when the request ends or its client leaves: what
    it still has queued is dropped and its running sentence is cancelled."""

    def __init__(self, service: TtsService, peer: str = "") -> None:
        self._service = service
        self.peer = peer  # who asked, for the log
        self.started = False  # the engine has begun one of its sentences
        self.closed = False
        # Audio of its sentences produced and not yet taken by the client, bounded by the
        # service's max_unsent_bytes: one bound per request, however many sentences.
        self.unsent = 0
        self.lock = threading.Lock()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._service._release(self)


class Job:
    """The sentences of one text, spoken one after the other into one audio stream; the engine
    thread runs them, the event loop consumes their audio."""

    def __init__(self, loop: asyncio.AbstractEventLoop, answer: Answer, max_unsent: int) -> None:
        self.loop = loop
        self.audio: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.synthesis: Synthesis | None = None
        self.lock = threading.Lock()  # orders cancel() against the synthesis being set
        self.answer = answer
        self.max_unsent = max_unsent

    def call(self, fn: Callable[..., None], *args: Any) -> None:
        """Runs fn on the event loop (the audio queue and the service's status live there);
        nothing once the loop is closed (no one is left to listen)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(fn, *args)

    def put(self, item: Any) -> None:
        self.call(self.audio.put_nowait, item)

    def put_audio(self, pcm: bytes) -> bool:
        """Hands audio to the client's side; False (and the synthesis cancelled) when the
        client has left more than max_unsent bytes unread."""
        with self.answer.lock:
            self.answer.unsent += len(pcm)
            unsent = self.answer.unsent
        if unsent > self.max_unsent:
            self.cancelled.set()
            self.put(
                SlowClientError(
                    f"the client left {unsent >> 20} MB of audio unread: its synthesis is cancelled"
                )
            )
            return False
        self.put(pcm)
        return True

    def taken(self, n: int) -> None:
        with self.answer.lock:
            self.answer.unsent -= n

    def attach(self, synthesis: Synthesis) -> None:
        """Engine thread: the synthesis the job runs (cancelled at once if the job was)."""
        with self.lock:
            self.synthesis = synthesis
        if self.cancelled.is_set():
            synthesis.cancel()

    def cancel(self) -> None:
        """Any thread: the synthesis stops within one frame (or never starts)."""
        self.cancelled.set()
        with self.lock:
            synthesis = self.synthesis
        if synthesis is not None:  # outside the lock: the lock guards only the reference
            synthesis.cancel()


@dataclass
class Queued:
    """A text's sentences waiting for the engine."""

    job: Job
    sentences: list[str | Pause]
    choice: Choice
    answer: Answer
    own: bool  # the answer was made for this sentence alone (closed when it ends)


class AudioStream:
    """int16 PCM bytes of one synthesis, as the engine yields them. Closing it early cancels
    the synthesis: the engine thread stops it within one frame and joins its threads before it
    takes the next request. A stream that is dropped unclosed runs to its end (its answer's
    close cancels it)."""

    def __init__(self, job: Job) -> None:
        self._job = job

    def __aiter__(self) -> AudioStream:
        return self

    async def __anext__(self) -> bytes:
        item = await self._job.audio.get()
        if item is END:
            self._job.audio.put_nowait(END)  # stays ended
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._job.audio.put_nowait(END)
            raise item
        self._job.taken(len(item))
        return item if isinstance(item, Silence) else bytes(item)

    async def aclose(self) -> None:
        self._job.cancel()

    def cancel(self) -> None:
        self._job.cancel()
