"""The TTS service between the protocol layers (Wyoming, MQTT) and the engine.

    service = TtsService(engine, default_voice="vivian", max_queue=8)
    async with contextlib.aclosing(service.synthesize("Hello.", voice="vivian-en")) as audio:
        async for pcm in audio:      # int16 PCM bytes, 24 kHz mono, as the engine yields them
            ...

Policy: the engine synthesizes one text at a time (it uses every core it is given) in its own
thread, so the event loop always answers. Requests wait in a FIFO queue in front of it; when
`max_queue` requests are already waiting, a new one is refused at once with `ServiceBusyError`
(the client gets an `error`, never a hang). Leaving the async iterator early (a client that
disconnects) cancels that synthesis within one frame; the engine thread waits until its threads
have ended before it starts the next one, so nothing keeps running for a gone client.

Settings and the default voice can change while the service runs (the MQTT bridge does it);
they apply from the next synthesis on. Listeners are called on the event loop whenever the
status (state, queue depth, last metrics) or the settings change.

A service may start without its engine (`TtsService(max_queue=8)`): the server answers
`describe` at once on a first start while the model is downloaded, converted and loaded
(`set_loading` says how far along), then `attach` makes it ready. Until then a synthesis is
refused with `NotReadyError`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .engine import Engine, Synthesis, SynthesisMetrics
from .errors import NotReadyError, ServiceBusyError
from .settings import EngineSettings
from .voices import VoiceCatalog

_LOGGER = logging.getLogger(__name__)


@dataclass
class ServiceStatus:
    state: str = "idle"  # "idle" or "synthesizing"
    queue_depth: int = 0  # requests waiting for the engine, not counting the running one
    served: int = 0  # syntheses completed
    last: SynthesisMetrics = field(default_factory=SynthesisMetrics)


_END = object()


class _Job:
    """One synthesis request; the engine thread runs it, the event loop consumes its audio."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.audio: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.synthesis: Synthesis | None = None
        self.lock = threading.Lock()  # orders cancel() against the synthesis being set

    def call(self, fn: Callable[..., None], *args: Any) -> None:
        """Runs fn on the event loop (the audio queue and the service's status live there)."""
        self.loop.call_soon_threadsafe(fn, *args)

    def put(self, item: Any) -> None:
        self.call(self.audio.put_nowait, item)

    def cancel(self) -> None:
        self.cancelled.set()
        with self.lock:
            if self.synthesis is not None:
                self.synthesis.cancel()


class AudioStream:
    """int16 PCM bytes of one synthesis, as the engine yields them. Closing it early (or
    dropping it) cancels the synthesis: the engine thread stops it within one frame and joins
    its threads before it takes the next request."""

    def __init__(self, job: _Job) -> None:
        self._job = job

    def __aiter__(self) -> AudioStream:
        return self

    async def __anext__(self) -> bytes:
        item = await self._job.audio.get()
        if item is _END:
            self._job.audio.put_nowait(_END)  # stays ended
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._job.audio.put_nowait(_END)
            raise item
        return bytes(item)

    async def aclose(self) -> None:
        self._job.cancel()

    def __del__(self) -> None:
        self._job.cancel()


class TtsService:
    def __init__(
        self,
        engine: Engine | None = None,
        default_voice: str | None = None,
        max_queue: int = 8,
        model_name: str = "",
    ) -> None:
        self.max_queue = max_queue
        self.status = ServiceStatus()
        self.loading = "starting"  # what a service without its engine is doing
        self.model_name = model_name  # e.g. "Qwen3-TTS 0.6B CustomVoice, q8_0"
        self.revision = 0  # bumped whenever what `describe` answers changes
        self._engine: Engine | None = None
        self.voices = VoiceCatalog([], [])
        self._default_voice = ""
        self._settings = EngineSettings()
        self._waiting = 0  # queued, not started
        self._running = 0  # 0 or 1
        self._listeners: list[Callable[[], None]] = []
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kazeia-engine")
        if engine is not None:
            self.attach(engine, default_voice, model_name)

    # -- the model -------------------------------------------------------------------------

    def attach(
        self, engine: Engine, default_voice: str | None = None, model_name: str = ""
    ) -> None:
        """Makes the service ready with `engine` (VoiceError for an unknown default voice)."""
        voices = VoiceCatalog(engine.speakers, engine.languages)
        self._default_voice = voices.get(default_voice or voices.default).name
        self.voices, self._settings, self._engine = voices, engine.settings, engine
        self.model_name = model_name or self.model_name
        self.loading = ""
        self.revision += 1
        self._notify()

    def set_loading(self, text: str) -> None:
        """What the first start is doing ("downloading ... 35%"), for `describe` and logs."""
        self.loading = text
        self.revision += 1

    @property
    def ready(self) -> bool:
        return self._engine is not None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise NotReadyError(f"the model is not ready yet: {self.loading}")
        return self._engine

    @property
    def sample_rate(self) -> int:
        """Hz of the 16-bit mono PCM the service yields (the model's decoder says)."""
        return self.engine.sample_rate

    def model_default(self, setting: str) -> Any:
        """The model's own value of a sampling setting (what an unset one means)."""
        return self.engine.generation_defaults[setting]

    # -- settings --------------------------------------------------------------------------

    @property
    def settings(self) -> EngineSettings:
        return self._settings

    def update_settings(self, **changes: Any) -> EngineSettings:
        """Validated (SettingsError otherwise); applies from the next synthesis on."""
        self._settings = self._settings.replace(**changes)
        _LOGGER.info("settings changed: %s", changes)
        self._notify()
        return self._settings

    @property
    def default_voice(self) -> str:
        return self._default_voice

    def set_default_voice(self, name: str) -> None:
        """Validated (VoiceError naming the valid voices otherwise)."""
        self._default_voice = self.voices.get(name).name
        _LOGGER.info("default voice: %s", self._default_voice)
        self._notify()

    def add_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def _notify(self) -> None:
        for callback in self._listeners:
            try:
                callback()
            except Exception:  # a listener must never break a synthesis
                _LOGGER.exception("status listener failed")

    # -- synthesis -------------------------------------------------------------------------

    def resolve_voice(
        self, name: str | None, speaker: str | None = None, language: str | None = None
    ) -> tuple[str, str]:
        """(speaker, language) of a request; VoiceError names the valid choices (NotReadyError
        before the model is loaded)."""
        if not self.ready:
            raise NotReadyError(f"the model is not ready yet: {self.loading}")
        return self.voices.resolve(name, speaker, language, default=self._default_voice)

    def synthesize(
        self,
        text: str,
        voice: str | None = None,
        speaker: str | None = None,
        language: str | None = None,
    ) -> AudioStream:
        """Queues a synthesis and returns its audio stream. Raises VoiceError or
        ServiceBusyError at once, before anything is queued; the stream raises EngineError if
        the synthesis fails. Call on the event loop."""
        chosen = self.resolve_voice(voice, speaker, language)
        job = _Job(asyncio.get_running_loop())
        if not text.strip():  # nothing to say: an empty stream, the engine is not involved
            job.audio.put_nowait(_END)
            return AudioStream(job)
        # Busy when max_queue requests already wait behind a running (or starting) one.
        if self._waiting + self._running > self.max_queue:
            raise ServiceBusyError(
                f"server busy: {self._waiting} requests are already waiting; try again later"
            )
        self._waiting += 1
        self._update(queue_depth=self._waiting)
        self._executor.submit(self._run, job, text, *chosen)
        return AudioStream(job)

    def _run(self, job: _Job, text: str, speaker: str, language: str) -> None:
        """Engine thread: one synthesis, start to end."""
        job.call(self._started)
        try:
            if job.cancelled.is_set():  # the client left while it waited
                return
            if self._settings is not self.engine.settings:
                self.engine.apply_settings(self._settings)
            with job.lock:
                job.synthesis = self.engine.synthesize(text, speaker, language)
            synthesis = job.synthesis
            try:
                for pcm in synthesis:
                    if job.cancelled.is_set():
                        break
                    job.put(pcm.tobytes())
            finally:
                synthesis.close()
            if not job.cancelled.is_set():
                job.call(self._finished, synthesis.metrics)
        except Exception as err:  # noqa: BLE001 - delivered to the requester
            _LOGGER.warning("synthesis failed: %s", err)
            job.put(err)
        finally:
            job.put(_END)
            job.call(self._ended)

    def _started(self) -> None:
        self._waiting -= 1
        self._running = 1
        self._update(state="synthesizing", queue_depth=self._waiting)

    def _ended(self) -> None:
        self._running = 0
        self._update(state="idle")

    def _finished(self, metrics: SynthesisMetrics) -> None:
        self._update(served=self.status.served + 1, last=metrics)

    def _update(self, **changes: Any) -> None:
        for key, value in changes.items():
            setattr(self.status, key, value)
        self._notify()

    def shutdown(self) -> None:
        """Drops waiting requests and waits for the running one to end."""
        self._executor.shutdown(wait=True, cancel_futures=True)
