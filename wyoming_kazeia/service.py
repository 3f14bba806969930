"""The TTS service between the protocol layers (Wyoming, MQTT) and the engine.

The engine synthesizes one text at a time (it uses every core it is given) in a thread of its own,
so the event loop always answers; requests wait in a bounded queue that refuses a new one at once
when full (the client gets an `error`, never a hang).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .answers import END, Answer, AudioStream, Job, Queued, Silence
from .daemon_thread import in_daemon_thread
from .engine import Engine, VoicePrompt, resolve_placements
from .errors import (
    NotReadyError,
    ServiceBusyError,
    VoiceError,
)
from .model_voices import LibraryLook, ModelVoices, VoiceModel
from .native import Generator
from .pacing import SpeechRates
from .settings import EngineSettings
from .speakable import Pause
from .synthesis import SynthesisMetrics
from .voices import Choice, VoiceCatalog
from .voices.library import StoredVoice, VoiceLibrary

_LOGGER = logging.getLogger(__name__)


@dataclass
class ServiceStatus:
    state: str = "idle"  # "idle" or "synthesizing"
    queue_depth: int = 0  # requests waiting for the engine, not counting the running one
    served: int = 0  # syntheses completed
    last: SynthesisMetrics = field(default_factory=SynthesisMetrics)


# How long a request or `describe` waits for a look at the voice library (a worker thread reads
# it) before going on with the voices known so far.
LIBRARY_DEADLINE_S = 2.0
# Bounds of the engine thread's waits: it looks at the stop flag at least this often.
POLL_S = 0.5


class TtsService:
    """Queues texts for the engine and streams their audio back (call on the event loop).

        service = TtsService(engine, default_voice="vivian", max_queue=8)
        async with contextlib.aclosing(service.queue_text("Hello.", voice="vivian-en")) as audio:
            async for pcm in audio:  # int16 PCM bytes, 24 kHz mono, as the engine yields them
                ...

    The voices are the model's built-in speakers and the library voices the model (or the voice
    model) speaks. A service may start without its engine (`TtsService(max_queue=8)`): the server
    answers `describe` at once on a first start while the model is downloaded, converted and
    loaded (`set_loading` says how far along), then `attach` makes it ready; until then a
    synthesis is refused with NotReadyError. Settings and the default voice may change while it
    runs (the MQTT bridge does it); they apply from the next synthesis on.
    """

    def __init__(
        self,
        engine: Engine | None = None,
        default_voice: str | None = None,
        max_queue: int = 8,
        model_name: str = "",
        max_unsent_bytes: int = 8 << 20,
        library: VoiceLibrary | None = None,
        voice_model: VoiceModel | None = None,
    ) -> None:
        self.max_queue = max_queue
        self.max_unsent_bytes = max_unsent_bytes
        self.status = ServiceStatus()
        # Seconds of audio per character and production rate, of the finished syntheses: what
        # the protocols' prebuffer holds an answer's first audio by (pacing.Prebuffer).
        self.rates = SpeechRates()
        self.loading = "starting"  # what a service without its engine is doing
        self.model_name = model_name  # e.g. "Qwen3-TTS 0.6B CustomVoice, q8_0"
        self.revision = 0  # bumped whenever what `describe` answers changes
        self._engine: Engine | None = None
        self.voices = VoiceCatalog([], [])
        self._default_voice = default_voice or ""  # as configured until a model decides
        self.library = library
        self.voice_model = voice_model
        self._library_state: tuple[tuple[str, int, int], ...] | None = None
        self._library_look: asyncio.Future[LibraryLook | None] | None = None  # under way
        self._library_late = False  # a look outlasted LIBRARY_DEADLINE_S (logged once)
        self._stored: dict[str, StoredVoice] = {}  # the library voices the model speaks
        # name -> (voice, the generator it was made for, prompt); the engine thread's only. Weak:
        # a generator replaced by a reload is let go (it holds its copies of the weights).
        self._prompts: dict[str, tuple[StoredVoice, weakref.ref[Generator], VoicePrompt]] = {}
        self._reported: set[str] = set()  # unusable library voices already logged
        self._settings = EngineSettings()
        self._answers: set[Answer] = set()  # admitted and not ended
        self._listeners: list[Callable[[], None]] = []
        # The engine thread's work, in arrival order; it picks the next sentence of the answer
        # it just spoke first, then those of answers it has begun, then the oldest (_pick).
        self._jobs: deque[Queued] = deque()
        self._running: Queued | None = None
        self._last: Answer | None = None
        self._work = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._engine_loop, name="kazeia-engine", daemon=True)
        self._thread.start()
        if engine is not None:
            self.attach(engine, default_voice, model_name)

    # -- the model -------------------------------------------------------------------------

    def attach(
        self,
        engine: Engine,
        default_voice: str | None = None,
        model_name: str = "",
        library: LibraryLook | None = None,
    ) -> None:
        """Makes the service ready with `engine` (VoiceError for an unknown default voice).
        `library`: the voice library as `look_at_library` read it (off the event loop); else
        it is read now."""
        voices = self._catalog(engine, library or self.look_at_library(None))
        self._default_voice = (
            voices.get(default_voice or voices.default).name if voices.voices else ""
        )
        self.voices, self._settings, self._engine = voices, engine.settings, engine
        self.model_name = model_name or self.model_name
        self.loading = ""
        self.revision += 1
        self._notify()

    def look_at_library(self, known: Any) -> LibraryLook | None:
        """Reads the voice library (blocking file work: a worker thread's), unless its
        signature is still `known`: then None."""
        if self.library is None:
            return None
        signature = self.library.signature()
        if signature == known:
            return None
        found, problems = self.library.scan()
        return LibraryLook(signature, found, problems)

    def _catalog(self, engine: Engine, library: LibraryLook | None) -> VoiceCatalog:
        """The engine's voices: its speakers and the library voices it speaks, or the voice
        model speaks."""
        stored: list[StoredVoice] = []
        if library is not None:
            self._library_state = library.signature
            found = library.found
            for problem in library.problems:
                if problem not in self._reported:
                    self._reported.add(problem)
                    _LOGGER.warning("%s: skipped", problem)
            models = [ModelVoices.of_engine(engine)]
            if self.voice_model is not None:
                models.append(self.voice_model.voices)
            stored = [v for v in found if any(m.speaks(v) for m in models)]
        self._stored = {v.name: v for v in stored}
        return VoiceCatalog(engine.speakers, engine.languages, stored)

    async def refresh_voices(self) -> bool:
        """Takes up voices added to or removed from the library since the last look (call on
        the event loop; the library is read in a worker thread, at most LIBRARY_DEADLINE_S is
        waited for it, and a stuck look leaves the voices as they were); True when the voices
        changed. The server calls it on `describe`, before each request and every few seconds."""
        if self._engine is None or self.library is None:
            return False
        if self._library_look is None:  # one look at a time, whoever asks
            state = self._library_state
            look = asyncio.ensure_future(in_daemon_thread(lambda: self.look_at_library(state)))
            self._library_look = look
            look.add_done_callback(self._looked)
        # A look already late (a stuck disk) is not waited for again by every request.
        deadline = 0.0 if self._library_late else LIBRARY_DEADLINE_S
        try:
            library = await asyncio.wait_for(asyncio.shield(self._library_look), deadline)
        except asyncio.TimeoutError:
            if not self._library_late:
                self._library_late = True
                _LOGGER.warning(
                    "the voice library (%s) did not answer within %.0f s: serving the voices "
                    "known so far",
                    self.library.root,
                    LIBRARY_DEADLINE_S,
                )
            return False
        except OSError as err:
            _LOGGER.warning("cannot read the voice library: %s", err)
            return False
        self._library_late = False
        if library is None or library.signature == self._library_state:
            return False  # unchanged, or already taken up by another waiter
        before = set(self._stored)
        self.voices = self._catalog(self._engine, library)
        added, removed = set(self._stored) - before, before - set(self._stored)
        if added or removed:
            _LOGGER.info(
                "voices: added %s, removed %s",
                ", ".join(sorted(added)) or "none",
                ", ".join(sorted(removed)) or "none",
            )
        if self._default_voice not in {v.name for v in self.voices.voices}:
            self._default_voice = self.voices.default
        self.revision += 1
        self._notify()
        return True

    def _looked(self, look: asyncio.Future[LibraryLook | None]) -> None:
        if self._library_look is look:
            self._library_look = None
        if not look.cancelled():
            look.exception()  # retrieved: the waiters log it

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
        """Validated (SettingsError otherwise, also for a device that is not here); applies
        from the next synthesis on."""
        settings = self._settings.replace(**changes)
        resolve_placements(settings)
        self._settings = settings
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
        """`callback()` is called on the event loop whenever the status (state, queue depth,
        last metrics) or the settings change."""
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
    ) -> Choice:
        """The voice of a request; VoiceError names the valid choices (NotReadyError before
        the model is loaded). The voices are those of the last `refresh_voices`."""
        if not self.ready:
            raise NotReadyError(f"the model is not ready yet: {self.loading}")
        return self.voices.choose(name, speaker, language, default=self._default_voice)

    def admit(self, peer: str = "") -> Answer:
        """A place in the queue for a request (a one-shot text or a stream, however many
        sentences) arriving now from `peer` (call on the event loop): ServiceBusyError when
        max_queue requests already wait behind the running one, whatever connection they came
        on; NotReadyError before the model is loaded. The sentences of an admitted request are
        never refused."""
        if not self.ready:
            raise NotReadyError(f"the model is not ready yet: {self.loading}")
        if len(self._answers) > self.max_queue:
            waiting = len(self._answers) - 1
            raise ServiceBusyError(
                f"server busy: {waiting} requests are already waiting; try again later"
            )
        answer = Answer(self, peer)
        self._answers.add(answer)
        return answer

    def _release(self, answer: Answer) -> None:
        """The answer ended or its client left (event loop): its queued sentences are dropped
        and its running one is cancelled."""
        self._answers.discard(answer)
        dropped = self._cancel(lambda q: q.answer is answer)
        if dropped:
            _LOGGER.debug("answer for %s closed: %d texts dropped", answer.peer, dropped)
            self._update(queue_depth=len(self._jobs))

    def _cancel(self, match: Callable[[Queued], bool]) -> int:
        """Drops the queued texts that `match` and cancels the running one if it does (any
        thread); how many were dropped."""
        with self._work:
            dropped = [q for q in self._jobs if match(q)]
            if dropped:
                self._jobs = deque(q for q in self._jobs if not match(q))
            running = self._running if self._running is not None and match(self._running) else None
        for queued in dropped:
            queued.job.cancel()
            queued.job.put(END)
        if running is not None:
            running.job.cancel()
        return len(dropped)

    def queue_text(
        self,
        text: str,
        voice: str | None = None,
        speaker: str | None = None,
        language: str | None = None,
        answer: Answer | None = None,
    ) -> AudioStream:
        """Queues a text to speak (a sentence of `answer`, or a request of its own) and returns
        its audio stream. Raises VoiceError, NotReadyError or (without `answer`) ServiceBusyError
        at once, before anything is queued; the stream raises EngineError if the synthesis
        fails. Call on the event loop."""

        return self.queue([text], self.resolve_voice(voice, speaker, language), answer)

    def queue(
        self, sentences: list[str | Pause], chosen: Choice, answer: Answer | None = None
    ) -> AudioStream:
        """Queues sentences (of one text) to be spoken one after the other, with nothing in
        between but the pauses among them (SSML's <break>), into one audio stream; the voice
        is already resolved (`resolve_voice`)."""
        loop = asyncio.get_running_loop()
        sentences = [s for s in sentences if isinstance(s, Pause) or s.strip()]
        if not sentences:  # nothing to say: an empty stream, the engine is not involved
            job = Job(loop, answer or Answer(self), self.max_unsent_bytes)
            job.audio.put_nowait(END)
            return AudioStream(job)
        own = answer is None
        if answer is None:
            answer = self.admit()
        job = Job(loop, answer, self.max_unsent_bytes)
        with self._work:
            self._jobs.append(Queued(job, sentences, chosen, answer, own))
            self._work.notify()
            depth = len(self._jobs)
        self._update(queue_depth=depth)
        return AudioStream(job)

    def _pick(self) -> Queued:
        """The next text: of the answer just spoken, else of an answer already begun (an
        answer is never split by other requests), else the oldest. Holds self._work."""
        for rule in (lambda q: q.answer is self._last, lambda q: q.answer.started):
            for i, queued in enumerate(self._jobs):
                if rule(queued):
                    del self._jobs[i]
                    return queued
        return self._jobs.popleft()

    def _engine_loop(self) -> None:
        """The engine thread: one synthesis at a time."""
        while True:
            with self._work:
                self._running = None
                while not (self._jobs or self._stopping):
                    self._work.wait(POLL_S)
                if self._stopping:
                    return
                queued = self._running = self._pick()
                self._last = queued.answer
                queued.answer.started = True
            self._run(queued)

    def _run(self, queued: Queued) -> None:
        """Engine thread: a text's sentences, start to end (an answer of its own closes at the
        end)."""
        job = queued.job
        own = queued.answer if queued.own else None
        job.call(self._started)
        try:
            for text in queued.sentences:
                if job.cancelled.is_set():  # the client left (while it waited, or meanwhile)
                    break
                if isinstance(text, Pause):
                    samples = round(text.seconds * self.sample_rate)
                    if not job.put_audio(Silence(2 * samples)):  # int16 silence
                        break
                    continue
                self._speak(queued, text)
        except Exception as err:  # noqa: BLE001 - delivered to the requester
            _LOGGER.warning("synthesis failed: %s", err)
            job.put(err)
        finally:
            job.put(END)
            job.call(self._ended, own)

    def _speak(self, queued: Queued, text: str) -> None:
        """Engine thread: one sentence; its start and end are logged (at DEBUG) with the peer
        it is for: the service's record of what it synthesized for whom."""
        job, choice = queued.job, queued.choice
        peer = queued.answer.peer or "a local caller"
        _LOGGER.debug("synthesis for %s started: %d characters", peer, len(text))
        engine = self._engine_for(choice.stored)
        engine.refresh()  # model files changed on disk: loaded again first
        if self._settings is not engine.settings:
            engine.apply_settings(self._settings)
        voice = self._prompt(choice.stored, engine) if choice.stored else None
        if choice.instruct:  # a request's own style for a built-in speaker
            voice = engine.instruction_prompt(choice.instruct, speaker=choice.speaker)
        synthesis = engine.synthesize(text, choice.speaker or None, choice.language, voice=voice)
        job.attach(synthesis)
        try:
            for pcm in synthesis:
                if job.cancelled.is_set() or not job.put_audio(pcm.tobytes()):
                    break
        finally:
            synthesis.close()
        cancelled = job.cancelled.is_set()
        _LOGGER.debug("synthesis for %s %s", peer, "cancelled" if cancelled else "ended complete")
        if not cancelled:
            self.rates.learn_synthesis(len(text), synthesis.metrics)
            job.call(self._finished, synthesis.metrics)

    def _engine_for(self, stored: str | None) -> Engine:
        """Engine thread: the engine that speaks a voice (the voice model is loaded on the
        first request for one of its voices)."""
        voice = self._stored.get(stored) if stored else None
        vm = self.voice_model
        if voice is None or vm is None or ModelVoices.of_engine(self.engine).speaks(voice):
            return self.engine
        if vm.engine is None:
            _LOGGER.info("voice %r: loading the voice model %s (first use)", voice.name, vm.name)
            vm.engine = vm.load()
            if self.library is not None:  # its voices' prompts and shared state, once
                spoken = [v for v in self._stored.values() if vm.voices.speaks(v)]
                for name, prompt in self.library.prepare(spoken, vm.engine).items():
                    made_for = weakref.ref(vm.engine.generator)
                    self._prompts[name] = (self._stored[name], made_for, prompt)
        return vm.engine

    def _library_prompt(self, voice: StoredVoice, engine: Engine) -> VoicePrompt:
        if self.library is None:
            raise VoiceError(f"voice {voice.name!r}: no voice library")
        return self.library.prompt(voice, engine)

    def _prompt(self, name: str, engine: Engine) -> VoicePrompt:
        """Engine thread: the prompt of library voice `name` for `engine`'s model, read from its
        file (computed and stored there on its first use by this model), then kept here."""
        voice = self._stored.get(name)
        if voice is None:
            raise VoiceError(f"voice {name!r} was removed")
        known = self._prompts.get(name)
        if known is None or known[0] != voice or known[1]() is not engine.generator:
            made_for = weakref.ref(engine.generator)
            known = (voice, made_for, self._library_prompt(voice, engine))
            self._prompts[name] = known
        return known[2]

    def _started(self) -> None:
        self._update(state="synthesizing", queue_depth=len(self._jobs))

    def _ended(self, own: Answer | None) -> None:
        if own is not None:
            own.close()
        self._update(state="idle")

    def _finished(self, metrics: SynthesisMetrics) -> None:
        self._update(served=self.status.served + 1, last=metrics)

    def _update(self, **changes: Any) -> None:
        for key, value in changes.items():
            setattr(self.status, key, value)
        self._notify()

    def stop(self) -> None:
        """Drops waiting requests and cancels the running one, without waiting (any thread);
        the service takes no more work."""
        with self._work:
            self._stopping = True
            self._work.notify()
        self._cancel(lambda q: True)

    def shutdown(self, timeout: float = 10.0) -> bool:
        """`stop`, then waits at most `timeout` seconds for the engine thread to end; False
        when it is still busy then (e.g. reading a model from a stuck disk)."""
        self.stop()
        self._thread.join(timeout)
        if self._thread.is_alive():
            _LOGGER.warning("the engine did not stop within %.1f s", timeout)
            return False
        return True
