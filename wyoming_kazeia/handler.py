"""The Wyoming event handler, one per connection.

`run` keeps reading events while each text is spoken, in order, by the connection's speaking
task; the events, their answers and the error rules are in KazeiaEventHandler's docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from .answers import Answer, AudioStream, Silence
from .connections import Connections
from .errors import (
    KazeiaError,
    NotReadyError,
    ProtocolError,
    ServiceBusyError,
    SlowClientError,
    SsmlError,
    VoiceError,
    quoted,
)
from .events import MAX_DATA_BYTES, parse_event, read_event
from .pacing import Prebuffer
from .sentences import StreamSentences, sentences_in_turns, ssml_sentences
from .service import TtsService
from .speakable import Pause

_LOGGER = logging.getLogger(__name__)

WIDTH, CHANNELS = 2, 1
# How often a connection whose input ended is probed (an empty audio-chunk) while its audio
# flows: a client gone entirely is found within two probes.
PROBE_S = 0.05

# An `error` event's text at most (it quotes at most QUOTE_CHARS of the request; the rest is
# ours, e.g. the list of valid voices).
MAX_ERROR_CHARS = 4096


@dataclass
class _Utterance:
    text: str
    voice: SynthesizeVoice | None
    answer: Answer | None  # its place in the service's queue (None: refused on arrival)
    one_shot: bool = False  # a `synthesize` request (not a sentence of a stream)
    refusal: Exception | None = None  # why it was refused on arrival, said in turn
    ssml: bool = False  # the text is an SSML document


@dataclass
class _StreamEnd:
    """The end of a stream in the speaking queue: synthesize-stopped, its place released."""

    answer: Answer | None


@dataclass
class _Hold:
    """An answer's first audio held back (pacing.Prebuffer), with the events that came after
    it in order: a one-shot text's, or a whole stream's across its sentences."""

    answer: Answer | None
    prebuffer: Prebuffer
    events: list[Event] = field(default_factory=list)
    opened: bool = False  # its first audio-start went out (at once: a gone client is found)
    logged: bool = False  # its wait is in the log


# The `error` code of each refusal; any other failure is "synthesis-failed".
_ERROR_CODES: dict[type[Exception], str] = {
    VoiceError: "voice-not-found",
    ServiceBusyError: "server-busy",
    NotReadyError: "model-loading",
    SlowClientError: "client-too-slow",
    SsmlError: "bad-request",
}


class KazeiaEventHandler(AsyncEventHandler):
    """One connection.

    Reading and speaking are separate: `run` keeps reading events (so `describe` is answered and
    `synthesize-chunk` text keeps arriving while audio is produced), and each text to speak goes,
    in order, to the connection's speaking task, which streams the audio as the engine yields it.

        describe                      -> info (while the model loads: no installed program yet)
        ping                          -> pong
        synthesize                    -> audio-start, audio-chunk*, audio-stop
        synthesize-start              opens a stream (its voice is checked at once)
        synthesize-chunk*             split into sentences; each one is spoken as soon as it is
                                      complete: audio-start, audio-chunk*, audio-stop per sentence
        synthesize (inside a stream)  ignored: it repeats the streamed text
        synthesize-stop               the rest of the text, then synthesize-stopped
        synthesize-start (inside one) ends the open stream as synthesize-stop would (its text is
                                      spoken), then opens the new one

    Text is made speakable on its way to the sentence splitter (`speakable`: Markdown, HTML,
    links and emoji as a person would read them; the speakable_text setting turns it off). A text
    whose `text_format` is "ssml" is an SSML document: spoken without its tags, a `<break>` a pause
    of its length; an SSML stream is spoken at its synthesize-stop, once the document is whole.

    A one-shot `synthesize` that fails (unknown voice or speaker, server busy, model still loading,
    a synthesis that fails before or during its audio) gets an `error` and then the connection is
    closed, without `audio-stop`: Home Assistant's client ignores `error` events and reads until
    `audio-stop` or the end of the connection, so the end of the connection is what tells it the
    request failed (partial audio is discarded rather than played as if complete). Inside a
    `synthesize-start/stop` stream an error is answered and the stream goes on to
    `synthesize-stopped`. Malformed input (a header that is not a JSON object, oversized header,
    data or payload, an event missing its fields) gets an `error` (`bad-request`) and that
    connection is closed, and so does text that is not valid Unicode (a lone surrogate). A client
    that disconnects cancels its whole answer: the sentence being spoken stops within a frame
    and the queued ones are dropped. Errors and log lines quote at most QUOTE_CHARS of what a
    client sent; long texts are split into sentences a slice at a time, with other connections'
    turns between.
    """

    def __init__(
        self,
        info: Callable[[], Awaitable[Info]],
        service: TtsService,
        samples_per_chunk: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        finish_on_eof: bool = False,
        connections: Connections | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        super().__init__(reader, writer)
        self.info = info
        self.service = service
        self.bytes_per_chunk = samples_per_chunk * WIDTH * CHANNELS
        # stdio: the input ends after the last request, and its answers must still go out.
        self.finish_on_eof = finish_on_eof
        self._to_speak: asyncio.Queue[Any] = asyncio.Queue()
        self._speaking: asyncio.Task[None] | None = None
        self._stream: StreamSentences | None = None
        self._stream_ssml: io.StringIO | None = None  # an SSML stream's text so far
        self._stream_voice: SynthesizeVoice | None = None
        self._stream_ok = False
        self._stream_answer: Answer | None = None
        self._audio_open = False  # between an audio-start and its audio-stop
        self._hold: _Hold | None = None  # the current answer's held first audio
        self._begun: Answer | None = None  # the answer whose audio began last
        self._stream_chars: dict[Answer | None, int] = {}  # a stream's text so far, by answer
        self.peer = str(writer.get_extra_info("peername") or "local")
        self._connections = connections
        # A connection that sends nothing (not even the rest of an event) while nothing is
        # being spoken for it, or reads nothing of what is written to it, is closed after this
        # many seconds.
        self._idle_timeout = idle_timeout

    async def write_event(self, event: Event) -> None:
        """Writes an event; a client that reads nothing of it for the idle timeout is gone
        (ConnectionError, its connection aborted): one that stopped reading, or a host that
        vanished without a word, keeps no place in the queue."""
        try:
            await asyncio.wait_for(super().write_event(event), self._idle_timeout)
        except asyncio.TimeoutError:
            _LOGGER.info(
                "client %s read nothing for %.0f s: closing its connection",
                self.peer,
                self._idle_timeout or 0,
            )
            self.writer.transport.abort()
            raise ConnectionError("the client stopped reading") from None

    @property
    def busy(self) -> bool:
        """Audio is being produced or written for this connection."""
        return self._speaking is not None and not self._speaking.done()

    async def run(self) -> None:
        if self._connections is not None and not self._connections.enter(self):
            _LOGGER.warning("refused a connection from %s (server-busy): too many", self.peer)
            await self._error("too many connections: try again later", "server-busy")
            self.writer.close()
            return
        try:
            while True:
                try:
                    timeout = None if self.busy else self._idle_timeout
                    event = await asyncio.wait_for(read_event(self.reader), timeout)
                except asyncio.TimeoutError:
                    _LOGGER.info("closing the idle connection from %s", self.peer)
                    break
                except ProtocolError as err:
                    _LOGGER.warning("closing connection from %s (bad-request): %s", self.peer, err)
                    await self._error(str(err), "bad-request")
                    break
                if event is None:
                    if self._speaking is not None and not self._speaking.done():
                        # The client closed its side after its requests: they are finished
                        # (stdio's input simply ends; a socket may also be gone entirely, and
                        # its transport closed already on a failed write).
                        self._to_speak.put_nowait(None)
                        if self.finish_on_eof:
                            await self._speaking
                        else:
                            await self._finish_speaking()
                    elif self._speaking is not None and _left_mid_answer(self._speaking):
                        # Gone before its end was read: a write of its answer failed first.
                        _LOGGER.info("client %s left: its synthesis is cancelled", self.peer)
                    break
                if self._connections is not None:
                    self._connections.touch(self)
                if not await self.handle_event(event):
                    break
                # One event at a time: a client that sends thousands at once must not keep
                # the loop from every other connection.
                await asyncio.sleep(0)
        except ConnectionError:
            pass
        finally:
            if self._connections is not None:
                self._connections.leave(self)
            await self.disconnect()
            self.writer.close()

    async def disconnect(self) -> None:
        """Cancels what this connection still has queued or running (its synthesis stops
        within one frame). A speaking task that ended on a lost connection ends quietly."""
        if self._speaking is not None:
            if not self._speaking.done() and not self._to_speak.empty():
                _LOGGER.info("client %s left: what it asked is cancelled", self.peer)
            self._speaking.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await self._speaking
        # Requests it had queued give their places back.
        while not self._to_speak.empty():
            item = self._to_speak.get_nowait()
            if isinstance(item, (_Utterance, _StreamEnd)) and item.answer is not None:
                item.answer.close()
        if self._stream_answer is not None:
            self._stream_answer.close()

    async def _finish_speaking(self) -> None:
        """A socket that ended its input may be half-closed (the client still reads) or gone;
        only a write tells. While audio flows, an empty audio-chunk every PROBE_S finds a
        gone client within about 0.1 s, and its synthesis is cancelled; a half-closed one
        gets all of its audio."""
        assert self._speaking is not None
        speaking = self._speaking
        while not speaking.done() and not self.writer.is_closing():
            await asyncio.wait({speaking}, timeout=PROBE_S)
            if self._audio_open and not speaking.done():
                try:
                    await self._audio_chunk(b"")
                except ConnectionError:
                    break  # gone: disconnect() cancels what it was given
        if not speaking.done() or _left_mid_answer(speaking):
            _LOGGER.info("client %s left: its synthesis is cancelled", self.peer)

    async def handle_event(self, event: Event) -> bool:
        try:
            return await self._handle(event)
        except ProtocolError as err:
            _LOGGER.warning("closing connection from %s (bad-request): %s", self.peer, err)
            await self._error(str(err), "bad-request")
            return False

    async def _handle(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            await self.write_event((await self.info()).event())
        elif Ping.is_type(event.type):
            await self.write_event(Pong(text=Ping.from_event(event).text).event())
        elif SynthesizeStart.is_type(event.type):
            start = parse_event(SynthesizeStart, event)
            if self._stream is not None:  # the open stream ends first, its text spoken
                _LOGGER.warning(
                    "synthesize-start from %s inside an open stream: the open one ends first",
                    self.peer,
                )
                await self._end_stream()
            self._stream, self._stream_voice = StreamSentences(self._speakable()), start.voice
            self._stream_ssml = io.StringIO() if _is_ssml(event) else None
            # Check the voice and take the stream's place now: one error for the stream, not
            # one per sentence.
            self._stream_answer = await self._admit_stream(start.voice)
            self._stream_ok = self._stream_answer is not None
        elif SynthesizeChunk.is_type(event.type):
            chunk = parse_event(SynthesizeChunk, event)
            if self._stream is None:
                raise ProtocolError("synthesize-chunk outside a synthesize-start/stop stream")
            if self._stream_ssml is not None:  # a document: spoken once it is whole
                self._stream_ssml.write(chunk.text)
                if self._stream_ssml.tell() > MAX_DATA_BYTES:  # characters written so far
                    raise ProtocolError(f"an SSML stream longer than {MAX_DATA_BYTES} characters")
                return True
            for sentence in await sentences_in_turns(self._stream, chunk.text):
                self._speak(sentence, self._stream_voice)
        elif Synthesize.is_type(event.type):
            request = parse_event(Synthesize, event)
            # Inside a stream it repeats the streamed text: ignored. Its voice is checked where
            # it is spoken (an unknown one: an `error`, in turn with earlier requests).
            if self._stream is None:
                # Its place in the queue is taken now, whatever this connection has queued
                # before it; a refusal is said in turn with the earlier requests.
                try:
                    answer, refusal = self.service.admit(self.peer), None
                except (ServiceBusyError, NotReadyError) as err:
                    answer, refusal = None, err
                ssml = _is_ssml(event)
                self._queue(_Utterance(request.text, request.voice, answer, True, refusal, ssml))
        elif SynthesizeStop.is_type(event.type):
            if self._stream is None:
                raise ProtocolError("synthesize-stop without synthesize-start")
            await self._end_stream()
        else:
            _LOGGER.debug("ignoring event %s", quoted(event.type))
        return True

    async def _end_stream(self) -> None:
        """The open stream's last text is spoken, then it ends (synthesize-stopped)."""
        assert self._stream is not None
        if self._stream_ssml is not None:
            if self._stream_ok:
                text = self._stream_ssml.getvalue()
                self._queue(_Utterance(text, self._stream_voice, self._stream_answer, ssml=True))
        else:
            for sentence in self._stream.finish():  # at most MAX_SENTENCE_CHARS held
                self._speak(sentence, self._stream_voice)
        self._stream, self._stream_ssml = None, None
        self._queue(_StreamEnd(self._stream_answer))
        self._stream_answer = None

    async def _admit_stream(self, voice: SynthesizeVoice | None) -> Answer | None:
        """The stream's place in the queue, or None (and an `error`) when it is refused."""
        try:
            await self.service.refresh_voices()
            self.service.resolve_voice(*_voice_parts(voice))
            return self.service.admit(self.peer)
        except (VoiceError, NotReadyError, ServiceBusyError) as err:
            await self._refuse(err, "stream")
            return None

    def _speakable(self) -> bool:
        """Whether text is made speakable (the setting, as it is now)."""
        return self.service.settings.speakable_text

    def _speak(self, text: str, voice: SynthesizeVoice | None) -> None:
        """Queues a sentence of a stream; empty sentences and a refused stream say nothing."""
        if self._stream_ok and text.strip():
            answer = self._stream_answer
            self._stream_chars[answer] = self._stream_chars.get(answer, 0) + len(text)
            if self._hold is not None and self._hold.answer is answer:
                self._hold.prebuffer.chars = self._stream_chars[answer]
            self._queue(_Utterance(text, voice, answer))

    def _queue(self, item: Any) -> None:
        self._to_speak.put_nowait(item)
        if self._speaking is None:
            self._speaking = asyncio.create_task(self._speak_all(), name="kazeia speaking")

    async def _speak_all(self) -> None:
        """The connection's speaking task: texts in arrival order, one at a time."""
        while True:
            item = await self._to_speak.get()
            if item is None:  # end of input (stdio)
                return
            if isinstance(item, _StreamEnd):
                if item.answer is not None:
                    item.answer.close()
                self._stream_chars.pop(item.answer, None)
                if self._hold is not None and self._hold.answer is item.answer:
                    await self._release(self._hold)  # the stream's audio is complete
                await self.write_event(SynthesizeStopped().event())
                continue
            try:
                ok = await self._say(item)
            finally:
                if item.one_shot and item.answer is not None:
                    item.answer.close()
            if not ok and item.one_shot:
                # The end of the connection is the end Home Assistant's client sees.
                self.writer.close()
                return

    async def _say(self, utterance: _Utterance) -> bool:
        """One audio-start/stop pair. A long text is spoken sentence by sentence (the model is
        trained on sentences; the first one's audio comes sooner), in order, in one stream.
        False when it failed (an `error` was sent)."""
        started = False
        pending = b""
        mode = "one-shot" if utterance.one_shot else "stream"
        name, speaker, language = _voice_parts(utterance.voice)
        _LOGGER.debug("%s text from %s: %s", mode, self.peer, quoted(utterance.text))
        audio: AudioStream | None = None
        try:
            if utterance.refusal is not None:
                raise utterance.refusal
            await self.service.refresh_voices()
            chosen = self.service.resolve_voice(name, speaker, language)
            # The sentences follow each other on the engine with no other request in between.
            # A stream's sentences are speakable already.
            sentences: list[str | Pause]
            if utterance.ssml:
                sentences = await ssml_sentences(utterance.text)
            else:
                speakable = utterance.one_shot and self._speakable()
                stream = StreamSentences(speakable)
                sentences = list(await sentences_in_turns(stream, utterance.text, end=True))
            audio = self.service.queue(sentences, chosen, utterance.answer)
            hold = self._hold_for(utterance, sentences)
            start = AudioStart(self.service.sample_rate, WIDTH, CHANNELS).event()
            if hold is not None and not hold.opened:
                hold.opened = True
                await self.write_event(start)
            else:
                await self._send(start, hold)
            started = self._audio_open = True
            self._begun = utterance.answer
            bytes_per_second = self.service.sample_rate * WIDTH * CHANNELS
            async for pcm in audio:
                pending += pcm
                # Whole events of samples_per_chunk; the rest waits for more audio.
                cut = len(pending) - len(pending) % self.bytes_per_chunk
                for at in range(0, cut, self.bytes_per_chunk):
                    await self._send(
                        self._audio_event(pending[at : at + self.bytes_per_chunk]), hold
                    )
                pending = pending[cut:]
                if hold is not None and not hold.prebuffer.released:
                    now = time.monotonic()
                    hold.prebuffer.add(len(pcm) / bytes_per_second, now, isinstance(pcm, Silence))
                    if hold.prebuffer.ready(now):
                        await self._release(hold)
            if pending:
                await self._send(self._audio_event(pending), hold)
            self._audio_open = False
            await self._send(AudioStop().event(), hold)
            # The text's audio is complete. A stream's hold spans its sentences while the next
            # one is queued; with none yet (the text comes slower than speech), the audio at
            # hand goes out rather than wait for text.
            if hold is not None and (
                utterance.one_shot or utterance.ssml or self._to_speak.empty()
            ):
                await self._release(hold)
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as err:  # noqa: BLE001 - one request failed
            self._audio_open = False
            if self._hold is not None:  # what went before the failure, then the error
                await self._release(self._hold)
            if not isinstance(err, KazeiaError):  # a failure nobody foresaw: its traceback
                _LOGGER.exception("synthesis failed")
            what = (
                f"voice {quoted(name) if name else 'default'}, speaker "
                f"{quoted(speaker) if speaker else '-'}, language "
                f"{quoted(language) if language else '-'}, {len(utterance.text)} characters"
            )
            if utterance.one_shot:  # the connection closes after the error: no audio-stop
                await self._refuse(err, mode, what)
                return False
            # The error first: a client that stops reading at audio-stop has seen it, and does
            # not take a partial answer for a complete one. Then the begun audio is closed so
            # that its WAV stays valid; the stream goes on.
            await self._refuse(err, mode, what)
            if started:
                await self.write_event(AudioStop().event())
            return False
        finally:
            if audio is not None:  # what a failure or a gone client left unspoken
                audio.cancel()
        _LOGGER.info(
            "%s request from %s: voice %s (%s), language %s, %d characters: spoken",
            mode,
            self.peer,
            quoted(name) if name else self.service.default_voice,
            chosen.stored or chosen.speaker,
            chosen.language,
            len(utterance.text),
        )
        return True

    async def _refuse(self, err: Exception, mode: str, what: str = "") -> None:
        """The `error` of a refused or failed request, logged at WARNING with its code (and
        `what` was asked: voice, speaker, language, characters)."""
        code = _ERROR_CODES.get(type(err), "synthesis-failed")
        asked = f" ({what})" if what else ""
        _LOGGER.warning("%s request from %s%s refused (%s): %s", mode, self.peer, asked, code, err)
        await self._error(str(err), code)

    def _hold_for(self, utterance: _Utterance, sentences: list[str | Pause]) -> _Hold | None:
        """The hold of the answer this text belongs to (the prebuffer setting, as it is now):
        a new one for a one-shot text or an SSML document, the stream's own for a sentence of
        a stream (made at its first sentence); None once the stream's audio flows."""
        hold = self._hold
        stream = not (utterance.one_shot or utterance.ssml)
        if stream and hold is not None and hold.answer is utterance.answer:
            return None if hold.prebuffer.released else hold
        if not self.service.settings.prebuffer:
            return None
        if not stream:
            prebuffer = Prebuffer.of_text(self.service.rates, sentences)
        elif utterance.answer is self._begun:  # its audio flows already: no pause now
            return None
        else:
            prebuffer = Prebuffer(self.service.rates, self._stream_chars.get(utterance.answer, 0))
        self._hold = _Hold(utterance.answer, prebuffer)
        return self._hold

    async def _send(self, event: Event, hold: _Hold | None) -> None:
        """Writes an event, or keeps it behind its answer's held first audio."""
        if hold is None or hold.prebuffer.released:
            await self.write_event(event)
        else:
            hold.events.append(event)

    async def _release(self, hold: _Hold) -> None:
        """The held audio goes out, and from now on the answer's audio as it comes."""
        hold.prebuffer.release(time.monotonic())  # (ready() may have released it already)
        if not hold.logged:
            hold.logged = True
            if summary := hold.prebuffer.summary(time.monotonic()):
                _LOGGER.info("first audio for %s %s", self.peer, summary)
        events, hold.events = hold.events, []
        for event in events:
            await self.write_event(event)

    def _audio_event(self, data: bytes) -> Event:
        return AudioChunk(self.service.sample_rate, WIDTH, CHANNELS, data).event()

    async def _audio_chunk(self, data: bytes) -> None:
        await self.write_event(self._audio_event(data))

    async def _error(self, text: str, code: str) -> None:
        if len(text) > MAX_ERROR_CHARS:
            text = text[:MAX_ERROR_CHARS] + "..."
        with contextlib.suppress(ConnectionError):
            await self.write_event(Error(text=text, code=code).event())


def _left_mid_answer(speaking: asyncio.Task[None]) -> bool:
    """Whether the task that speaks a connection's answers ended because its client was gone (a
    write failed): its synthesis is cancelled."""
    return (
        speaking.done()
        and not speaking.cancelled()
        and isinstance(speaking.exception(), ConnectionError)
    )


def _is_ssml(event: Event) -> bool:
    """Whether a request's text is SSML (Wyoming's `text_format`: "text", the default, or
    "ssml"); ProtocolError for another format."""
    text_format = event.data.get("text_format")
    if text_format in (None, "text"):
        return False
    if text_format == "ssml":
        return True
    raise ProtocolError(f"unknown text_format {quoted(text_format)}: use text or ssml")


def _voice_parts(voice: SynthesizeVoice | None) -> tuple[str | None, str | None, str | None]:
    if voice is None:
        return None, None, None
    return voice.name, voice.speaker, voice.language
