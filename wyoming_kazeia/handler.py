"""The Wyoming event handler, one per connection.

`run` keeps reading events while each text is spoken, in order, by the connection's speaking
task; the events, their answers and the error rules are in KazeiaEventHandler's docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
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
from .sentences import StreamSentences, sentences_in_turns, ssml_sentences
from .service import Answer, AudioStream, TtsService
from .speakable import Pause

_LOGGER = logging.getLogger(__name__)

# Limits of one incoming event. A TTS request carries text only; these bound what a broken or
# hostile client can make the server buffer. The header limit is the stream reader's.
MAX_HEADER_BYTES = 64 * 1024
MAX_DATA_BYTES = 1024 * 1024
MAX_PAYLOAD_BYTES = 1024 * 1024

WIDTH, CHANNELS = 2, 1
# How long the connection bound waits for the idlest connection it closed to leave.
CLOSE_WAIT_S = 5.0
# How often a connection whose input ended is probed (an empty audio-chunk) while its audio
# flows: a client gone entirely is found within two probes.
PROBE_S = 0.05

# An `error` event's text at most (it quotes at most QUOTE_CHARS of the request; the rest is
# ours, e.g. the list of valid voices).
MAX_ERROR_CHARS = 4096


async def read_event(reader: asyncio.StreamReader) -> Event | None:
    """The next event, None at the end of the stream; ProtocolError for malformed input."""
    try:
        line = await reader.readline()
    except ValueError:  # asyncio's LimitOverrunError, as readline raises it
        raise ProtocolError(f"event header longer than {MAX_HEADER_BYTES} bytes") from None
    except ConnectionError:
        return None
    if not line.endswith(b"\n"):  # end of stream, possibly inside a header
        return None
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than JSON allows
        raise ProtocolError("malformed event header: not JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise ProtocolError("malformed event header: not a JSON object with a 'type'")
    data = header.get("data") or {}
    if not isinstance(data, dict):
        raise ProtocolError("malformed event: 'data' is not an object")
    _check_unicode(header)
    data_length = _length(header, "data_length", MAX_DATA_BYTES)
    payload_length = _length(header, "payload_length", MAX_PAYLOAD_BYTES)
    try:
        if data_length:
            try:
                extra = json.loads(await reader.readexactly(data_length))
            except (ValueError, RecursionError):
                raise ProtocolError("malformed event data: not JSON") from None
            if not isinstance(extra, dict):
                raise ProtocolError("malformed event data: not a JSON object")
            _check_unicode(extra)
            data.update(extra)
        payload = await reader.readexactly(payload_length) if payload_length else None
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return Event(type=header["type"], data=data, payload=payload)


def _length(header: dict[str, Any], key: str, limit: int) -> int:
    value = header.get(key) or 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError(f"malformed event header: bad {key} {quoted(value)}")
    if value > limit:
        raise ProtocolError(f"event {key} {quoted(value)} exceeds the limit of {limit} bytes")
    return value


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


# The `error` code of each refusal; any other failure is "synthesis-failed".
_ERROR_CODES: dict[type[Exception], str] = {
    VoiceError: "voice-not-found",
    ServiceBusyError: "server-busy",
    NotReadyError: "model-loading",
    SlowClientError: "client-too-slow",
    SsmlError: "bad-request",
}


class Connections:
    """The open connections of a server, bounded: at the bound, a new connection takes the
    place of the one idle the longest (a client holding connections open cannot lock others
    out); when every connection is busy speaking, it is refused with `server-busy`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[KazeiaEventHandler, float] = {}  # -> when it was last active
        self._left = asyncio.Event()  # set when a connection leaves

    async def room(self) -> None:
        """Returns when one more connection may be accepted: at the bound, once the idlest
        has been closed (its file released), or a connection has left; when every one is busy
        speaking, one more is let in to be refused."""
        while len(self._open) >= self.limit:
            idle = [h for h in self._open if not h.busy]
            if not idle:
                return  # accepted to be told server-busy
            oldest = min(idle, key=self._open.__getitem__)
            _LOGGER.info("connection limit (%d): closing the idlest, %s", self.limit, oldest.peer)
            self._left.clear()
            oldest.writer.close()
            # Its handler leaves once its reader sees the close; if it does not (a transport
            # that never finishes closing), the loop looks again rather than wait forever.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._left.wait(), CLOSE_WAIT_S)

    def enter(self, handler: KazeiaEventHandler) -> bool:
        """Counts `handler` in (again: no change); False when the bound leaves no room."""
        if handler in self._open:
            return True
        if len(self._open) >= self.limit:
            return False
        self._open[handler] = time.monotonic()
        return True

    def touch(self, handler: KazeiaEventHandler) -> None:
        if handler in self._open:
            self._open[handler] = time.monotonic()

    def leave(self, handler: KazeiaEventHandler) -> None:
        if self._open.pop(handler, None) is not None:
            self._left.set()


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
                    if self.writer.is_closing():  # closed by us (server stop, connection bound)
                        break
                    if self._speaking is not None and not self._speaking.done():
                        # The client closed its side after its requests: they are finished
                        # (stdio's input simply ends; a socket may also be gone entirely).
                        self._to_speak.put_nowait(None)
                        if self.finish_on_eof:
                            await self._speaking
                        else:
                            await self._finish_speaking()
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
        gone = not speaking.done() or (
            not speaking.cancelled() and isinstance(speaking.exception(), ConnectionError)
        )
        if gone:
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
            start = _parse(SynthesizeStart, event)
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
            chunk = _parse(SynthesizeChunk, event)
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
            request = _parse(Synthesize, event)
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
            self._queue(_Utterance(text, voice, self._stream_answer))

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
            await self.write_event(AudioStart(self.service.sample_rate, WIDTH, CHANNELS).event())
            started = self._audio_open = True
            async for pcm in audio:
                pending += pcm
                # Whole events of samples_per_chunk; the rest waits for more audio.
                cut = len(pending) - len(pending) % self.bytes_per_chunk
                for at in range(0, cut, self.bytes_per_chunk):
                    await self._audio_chunk(pending[at : at + self.bytes_per_chunk])
                pending = pending[cut:]
            if pending:
                await self._audio_chunk(pending)
            self._audio_open = False
            await self.write_event(AudioStop().event())
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as err:  # noqa: BLE001 - one request failed
            self._audio_open = False
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

    async def _audio_chunk(self, data: bytes) -> None:
        await self.write_event(AudioChunk(self.service.sample_rate, WIDTH, CHANNELS, data).event())

    async def _error(self, text: str, code: str) -> None:
        if len(text) > MAX_ERROR_CHARS:
            text = text[:MAX_ERROR_CHARS] + "..."
        with contextlib.suppress(ConnectionError):
            await self.write_event(Error(text=text, code=code).event())


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


def _check_fields(event: Event) -> None:
    """ProtocolError unless a request's fields have their JSON types: wyoming's parsers take
    whatever they are given, and a number or a list where a string belongs would fail later,
    in the engine, or be taken silently."""
    data = event.data
    if event.type in ("synthesize", "synthesize-chunk") and not isinstance(data.get("text"), str):
        raise ProtocolError(f"malformed {event.type} event: 'text' must be a string")
    voice = data.get("voice")
    if voice is None:
        return
    if not isinstance(voice, dict):
        raise ProtocolError(f"malformed {event.type} event: 'voice' must be an object")
    for key in ("name", "speaker", "language"):
        if voice.get(key) is not None and not isinstance(voice[key], str):
            raise ProtocolError(f"malformed {event.type} event: voice '{key}' must be a string")


def _check_unicode(value: Any) -> None:
    """ProtocolError for a JSON value holding text that is not valid Unicode: JSON's \\uD800
    escapes decode to lone surrogates, which no encoder or tokenizer takes (nor wyoming's
    writer, for an echo)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as err:
                raise ProtocolError(
                    f"malformed event: text that is not valid Unicode (a lone surrogate in "
                    f"{quoted(item[max(0, err.start - 20) : err.start + 20])})"
                ) from None


def _parse(kind: Any, event: Event) -> Any:
    _check_fields(event)
    try:
        return kind.from_event(event)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ProtocolError(f"malformed {event.type} event: {quoted(err)}") from None
