"""One synthesis in flight: a generator thread and a decoder thread joined by queues, and the
iterator of PCM chunks the caller reads (Synthesis). Engine.synthesize starts one."""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import EngineError
from .native import DECODER_GPU_CHUNK_FRAMES, frame_budget, to_pcm16

if TYPE_CHECKING:
    from .decoder_process import DecoderProcess
    from .engine import Engine, VoicePrompt
    from .settings import EngineSettings

_LOGGER = logging.getLogger(__name__)

# The one-pass decode (stream_chunk 0) runs as short pushes through the exact streaming decoder
# (the samples of one decode) while the frames come, so that a cancel is seen between pushes;
# as many frames as a decoder graph on a GPU holds, so that no graph computes padding.
ONE_PASS_PUSH_FRAMES = DECODER_GPU_CHUNK_FRAMES
# Bounds of the waits between a synthesis's threads: each wait looks at the cancel flag at
# least every POLL_S, and a cancelled synthesis's threads (which stop within a frame) are
# waited for at most JOIN_S before the failure is logged.
POLL_S = 0.1
JOIN_S = 30.0
# At interpreter exit, running syntheses are cancelled and waited for this long at most.
EXIT_JOIN_S = 1.0


@dataclass
class SynthesisMetrics:
    ttfa_s: float = 0.0  # time to first audio chunk
    total_s: float = 0.0
    audio_s: float = 0.0
    rtf: float = 0.0  # total_s / audio_s
    n_frames: int = 0
    n_chunks: int = 0
    talker_s: float = 0.0
    predictor_s: float = 0.0
    # Frames computed whole as one graph where both stacks share a GPU (in neither of the two)
    frame_graph_s: float = 0.0
    # The code predictor's graph computations: 15 a frame, 1 where its frame is one graph (GPU)
    predictor_computations: int = 0
    # All the generation's graph computations (each a wait on a GPU): 16 a frame on the CPU, 1
    # for a frame computed whole
    computations: int = 0
    decoder_s: float = 0.0
    # Seconds of audio of the first chunk, and of the longest after it (a stream chunk: the
    # prebuffer's step)
    first_chunk_s: float = 0.0
    largest_chunk_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_DONE = object()

# Pipelines whose threads may still run: cancelled and joined at interpreter exit, before the
# native objects they use are torn down.
_LIVE: weakref.WeakSet[Pipeline] = weakref.WeakSet()


@atexit.register
def _stop_live_pipelines() -> None:
    pipelines = list(_LIVE)
    for pipeline in pipelines:
        pipeline.cancel()
    for pipeline in pipelines:
        pipeline.close(EXIT_JOIN_S)


class Pipeline:
    """The state the two threads of a synthesis share: a generator thread (talker + code
    predictor) hands each frame's 16 codes to a decoder thread, which decodes the first frame
    alone and then every `stream_chunk` frames with the exact stateful streaming decoder; the
    consumer's iterator takes finished chunks from a queue."""

    def __init__(
        self,
        engine: Engine,
        ids: list[int] | None,
        speaker: str,
        language: str,
        settings: EngineSettings,
        voice: VoicePrompt | None = None,
        non_streaming: bool = False,
        greedy: bool = False,
    ) -> None:
        self.metrics = SynthesisMetrics()
        self.codes: list[np.ndarray] = []  # the generated frames, in order
        self._engine = engine
        self._settings = settings
        self._cancel = threading.Event()
        self._first_chunk = threading.Event()
        self._frames: queue.Queue[Any] = queue.Queue()
        self._chunks: queue.Queue[Any] = queue.Queue()
        self._start = time.monotonic()
        self._closed = False
        self._threads: list[threading.Thread] = []
        # An in-context clone continues its reference: the decoder starts from its codes, as the
        # official code decodes reference and new codes together and cuts the reference part.
        self._context = voice.ref_codes if voice is not None and voice.in_context else None
        if ids is None:  # nothing to say
            self._chunks.put(_DONE)
            self._closed = True
            return
        max_frames = settings.max_frames or frame_budget(
            engine.generator.text_tokens(np.asarray(ids))
        )
        it = engine.generator.frames(
            np.asarray(ids),
            speaker,
            language,
            seed=settings.seed,
            temperature=settings.temperature,
            top_k=settings.top_k,
            top_p=settings.top_p,
            repetition_penalty=settings.repetition_penalty,
            max_frames=max_frames,
            non_streaming=non_streaming,
            greedy=greedy,
            voice=voice.native() if voice is not None else None,
        )
        self._threads = [
            threading.Thread(
                target=self._generate, args=(it,), name="kazeia-generate", daemon=True
            ),
            threading.Thread(target=self._decode, name="kazeia-decode", daemon=True),
        ]
        _LIVE.add(self)
        for t in self._threads:
            t.start()

    # -- threads ---------------------------------------------------------------------------

    def _generate(self, it: Any) -> None:
        streaming = self._settings.stream_chunk > 0
        try:
            for frame in it:
                if self._cancel.is_set():
                    break
                self._frames.put(frame)
                # First audio first: while the first chunk is decoded, generating the next
                # frames would take half the cores from it (2 cores, both stages parallel).
                while (
                    streaming and not self._first_chunk.wait(POLL_S) and not self._cancel.is_set()
                ):
                    pass
        except Exception as err:  # noqa: BLE001 - forwarded to the consumer
            self._frames.put(err)
        finally:
            stats = it.stats
            it.close()
            self.metrics.talker_s = stats["talker_ms"] / 1000.0
            self.metrics.predictor_s = stats["predictor_ms"] / 1000.0
            self.metrics.frame_graph_s = stats["frame_graph_ms"] / 1000.0
            self.metrics.predictor_computations = stats["predictor_computations"]
            self.metrics.computations = stats["computations"]
            self._frames.put(_DONE)

    def _decode(self) -> None:
        k = self._settings.stream_chunk
        # stream_chunk 0 (one piece of audio at the end) decodes while the frames come too,
        # ONE_PASS_PUSH_FRAMES at a time, and emits the pieces once at the end: the same samples
        # as one decode of all frames (the streaming decoder is exact), with the decoder beside
        # the generator instead of after it, so it takes no longer than a stream.
        process: DecoderProcess | None = None
        pending: list[np.ndarray] = []
        pieces: list[np.ndarray] = []  # stream_chunk 0: decoded, not yet emitted

        def push(frames: list[np.ndarray]) -> None:
            wav = self._timed(stream.push, np.stack(frames))
            if k:
                self._emit(wav)
            elif wav is not None:
                pieces.append(wav)

        try:
            # The subprocess placement's decoder is a child started now, with the synthesis:
            # its model load and its pushes overlap the generation, as the in-process one's.
            if self._settings.decoder_subprocess:
                process = self._engine.decoder_process(self._cancel)
                if self._context is not None:  # the reference's audio is not played
                    self._timed(process.push, self._context)
                stream: Any = process
            else:
                stream = self._primed_stream()
            while True:
                try:
                    item = self._frames.get(timeout=POLL_S)
                except queue.Empty:
                    if self._cancel.is_set():
                        break
                    continue
                if isinstance(item, Exception):
                    raise item
                if item is _DONE or self._cancel.is_set():
                    break
                pending.append(item)
                self.codes.append(item)
                self.metrics.n_frames += 1
                # The first chunk is a single frame (first audio as soon as possible), then
                # chunks of k frames (fewer pushes: each push reads all decoder weights).
                size = (1 if self.metrics.n_chunks == 0 else k) if k else ONE_PASS_PUSH_FRAMES
                if len(pending) >= size:
                    push(pending)
                    pending = []
            if self._cancel.is_set():
                return
            if pending:
                push(pending)
            if process is not None:
                process.finish()
            if pieces:
                self._emit(np.concatenate(pieces))
        except Exception as err:  # noqa: BLE001 - forwarded to the consumer
            self._chunks.put(err)
        finally:
            if process is not None:
                process.close()
            self._first_chunk.set()  # never leave the generator waiting
            self._chunks.put(_DONE)

    def _primed_stream(self) -> Any:
        """A decoder stream, with the reference codes of an in-context clone behind it."""
        stream = self._engine.decoder.stream()
        if self._context is not None:
            self._engine.continue_after(stream, self._context)
        return stream

    def _timed(self, fn: Any, codes: np.ndarray) -> np.ndarray | None:
        t0 = time.monotonic()
        wav = fn(codes)
        self.metrics.decoder_s += time.monotonic() - t0
        return None if wav is None else np.asarray(wav)

    def _emit(self, wav: np.ndarray | None) -> None:
        if wav is None:  # cancelled
            return
        seconds = len(wav) / self._engine.sample_rate
        if self.metrics.n_chunks == 0:
            self.metrics.ttfa_s = time.monotonic() - self._start
            self.metrics.first_chunk_s = seconds
        else:
            self.metrics.largest_chunk_s = max(self.metrics.largest_chunk_s, seconds)
        self.metrics.n_chunks += 1
        self._chunks.put(to_pcm16(wav))
        self._first_chunk.set()

    # -- consumer side ----------------------------------------------------------------------

    def next_chunk(self) -> np.ndarray:
        while True:
            if self._cancel.is_set():  # cancelled: chunks still queued are dropped
                raise StopIteration
            try:
                item = self._chunks.get(timeout=POLL_S)
                break
            except queue.Empty:
                continue
        if item is _DONE:
            self._finish()
            raise StopIteration
        if isinstance(item, Exception):
            self.close()
            if isinstance(item, EngineError | ValueError):
                raise item
            raise EngineError(f"synthesis failed: {item}") from item
        self.metrics.audio_s += len(item) / self._engine.sample_rate
        return item

    def _finish(self, timeout: float = JOIN_S) -> None:
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            _LOGGER.error("a synthesis did not stop within %.0f s of its end", timeout)
        m = self.metrics
        m.total_s = time.monotonic() - self._start
        m.rtf = m.total_s / m.audio_s if m.audio_s else 0.0
        if self._cancel.is_set():
            _LOGGER.info("synthesis cancelled after %d frames, %.2f s", m.n_frames, m.total_s)
            return
        _LOGGER.info(
            "synthesis: %d frames, %.2f s audio in %.2f s (RTF %.2f), first audio %.3f s, "
            "%d chunks, talker %.2f s, predictor %.2f s, whole frames %.2f s, decoder %.2f s",
            m.n_frames,
            m.audio_s,
            m.total_s,
            m.rtf,
            m.ttfa_s,
            m.n_chunks,
            m.talker_s,
            m.predictor_s,
            m.frame_graph_s,
            m.decoder_s,
        )

    def cancel(self) -> None:
        """Asks both threads to stop (within one frame); does not wait."""
        self._cancel.set()
        self._first_chunk.set()
        self._frames.put(_DONE)  # wakes the decoder thread

    def close(self, timeout: float = JOIN_S) -> None:
        """Cancels, joins the threads (waiting at most `timeout`) and logs the cancelled
        synthesis (unless it had ended)."""
        if self._closed:
            return
        self.cancel()
        self._finish(timeout)


class Synthesis:
    """Iterator of int16 PCM chunks; `metrics` is complete once it is exhausted. Closing it (or
    leaving its `with` block) stops the synthesis within one frame and waits for its threads;
    `cancel` only asks them to stop. No finalizer does either: a Synthesis dropped unclosed runs
    to its end."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline

    @property
    def metrics(self) -> SynthesisMetrics:
        return self._pipeline.metrics

    @property
    def codes(self) -> np.ndarray:
        """The frames generated so far: int32 [T, 16], what the decoder consumes."""
        frames = self._pipeline.codes
        return np.stack(frames).astype(np.int32) if frames else np.zeros((0, 16), np.int32)

    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        return self._pipeline.next_chunk()

    def cancel(self) -> None:
        """Asks the synthesis to stop within one frame, without waiting (any thread)."""
        self._pipeline.cancel()

    def close(self) -> None:
        """Cancels the synthesis and waits until its threads have ended."""
        self._pipeline.close()

    def __enter__(self) -> Synthesis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
